// Tests data::fingerprint (include/tessera/data/fingerprint.hpp): SHA-256
// over every token, checked against Python's hashlib, sensitive to one
// token anywhere, equal across the three token-file formats, and cached
// beside the file only when that is safe.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tessera/data/fingerprint.hpp"

namespace test_data_fingerprint {

namespace fs = std::filesystem;
using namespace tessera::data;

namespace {

struct temp_dir {
  fs::path dir;
  temp_dir() {
    dir = fs::temp_directory_path() / ("tessera_fingerprint_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~temp_dir() { fs::remove_all(dir); }
};

// Sets p's modification time an hour back and waits out the second in
// which its change time (now) counts as racy: a file hashed long after it
// was written.
void age(const fs::path& p) {
  fs::last_write_time(p, fs::file_time_type::clock::now() - std::chrono::hours(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
}

}  // namespace

TEST_CASE("fingerprint is SHA-256 of count, vocabulary and the ids as uint32", "[data]") {
  temp_dir t;
  // Oracles from Python: hashlib.sha256(struct.pack('<QQ', n, V) +
  // b''.join(struct.pack('<I', i) for i in ids)).hexdigest()
  write_token_file(t.dir / "a.tok", std::vector<std::uint32_t>{1, 2, 3}, 4);
  CHECK(fingerprint(token_file(t.dir / "a.tok")) ==
        "sha256:27395786250c00e166e6240740d07935de442dfac7f064b2cad7f20646f56f34");
  write_token_file(t.dir / "b.tok", std::vector<std::uint32_t>{70000, 5}, 70001, token_dtype::u32);
  CHECK(fingerprint(token_file(t.dir / "b.tok")) ==
        "sha256:faea03664eccd277b43e50863d4f2f53ec945073c68014fbd313041eb904490d");
}

TEST_CASE("fingerprint sees one token changed anywhere, and the vocabulary", "[data]") {
  temp_dir t;
  std::vector<std::uint32_t> ids(300000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::uint32_t>((i * 7919) % 251);
  write_token_file(t.dir / "a.tok", ids, 256);
  const std::string base = fingerprint(token_file(t.dir / "a.tok"));
  for (std::size_t at : {std::size_t{0}, std::size_t{100001}, std::size_t{299999}}) {
    auto changed = ids;
    changed[at] = (changed[at] + 1) % 256;
    write_token_file(t.dir / "b.tok", changed, 256);
    CHECK(fingerprint(token_file(t.dir / "b.tok")) != base);
  }
  write_token_file(t.dir / "c.tok", ids, 257);
  CHECK(fingerprint(token_file(t.dir / "c.tok")) != base);
}

TEST_CASE("the same ids in tessera's, llm.c's and NumPy's formats share a fingerprint", "[data]") {
  temp_dir t;
  const std::vector<std::uint32_t> ids{5, 0, 255, 17, 3};
  write_token_file(t.dir / "a.tok", ids, 256);
  {
    std::ofstream out(t.dir / "a.bin", std::ios::binary);
    std::vector<std::int32_t> head(256, 0);
    head[0] = 20240520, head[1] = 1, head[2] = static_cast<std::int32_t>(ids.size());
    out.write(reinterpret_cast<const char*>(head.data()), 1024);
    for (std::uint32_t v : ids) {
      const auto x = static_cast<std::uint16_t>(v);
      out.write(reinterpret_cast<const char*>(&x), 2);
    }
  }
  {
    std::ofstream out(t.dir / "a.npy", std::ios::binary);
    std::string dict = "{'descr': '<u4', 'fortran_order': False, 'shape': (5,), }";
    while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
    dict += '\n';
    const auto n = static_cast<std::uint16_t>(dict.size());
    out.write("\x93NUMPY\x01\x00", 8);
    out.write(reinterpret_cast<const char*>(&n), 2);
    out << dict;
    out.write(reinterpret_cast<const char*>(ids.data()), 4 * 5);
  }
  const std::string want = fingerprint(token_file(t.dir / "a.tok"));
  CHECK(fingerprint(token_file(t.dir / "a.bin")) == want);  // vocabulary 256 = largest id + 1
  CHECK(fingerprint(token_file(t.dir / "a.npy")) == want);
}

TEST_CASE("fingerprint is cached beside an unchanged file and refreshed when it changes", "[data]") {
  temp_dir t;
  const fs::path p = t.dir / "a.tok";
  const fs::path cache = p.string() + ".fingerprint.json";
  std::vector<std::uint32_t> ids(5000, 7);
  write_token_file(p, ids, 256);
  // Written just now: a change within the same clock tick could go unseen,
  // so nothing is cached.
  const std::string fresh = fingerprint(token_file(p));
  CHECK_FALSE(fs::exists(cache));
  age(p);
  CHECK(fingerprint(token_file(p)) == fresh);
  REQUIRE(fs::exists(cache));
  // The cache is what answers now: a planted value comes back.
  {
    std::ifstream in(cache);
    auto j = nlohmann::json::parse(in);
    j["sha256"] = "sha256:planted";
    std::ofstream(cache) << j.dump();
  }
  CHECK(fingerprint(token_file(p)) == "sha256:planted");
  // A token rewritten in place (same size): the modification time moves,
  // the cache no longer matches, the file is hashed again.
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64 + 2 * 4321);
    const std::uint16_t v = 9;
    f.write(reinterpret_cast<const char*>(&v), 2);
  }
  age(p);  // an hour back, but not the times recorded in the cache
  const std::string changed = fingerprint(token_file(p));
  CHECK(changed != fresh);
  CHECK(changed != "sha256:planted");
  ids[4321] = 9;
  write_token_file(t.dir / "b.tok", ids, 256);
  CHECK(fingerprint(token_file(t.dir / "b.tok")) == changed);
}

}  // namespace test_data_fingerprint
