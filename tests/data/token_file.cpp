// Tests include/tessera/data/token_file.hpp: the on-disk format, the atomic
// writer, every rejection of the reader, and the train/validation split.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tessera/data/token_file.hpp"

namespace test_data_token_file {

namespace fs = std::filesystem;
using namespace tessera::data;
using Catch::Contains;

namespace {

// A fresh directory per test case, removed afterwards.
struct temp_dir {
  fs::path dir;
  temp_dir() {
    static int counter = 0;
    dir = fs::temp_directory_path() /
          ("tessera_token_file_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~temp_dir() { fs::remove_all(dir); }
  fs::path operator/(const std::string& name) const { return dir / name; }
};

std::vector<std::uint32_t> random_tokens(std::size_t n, std::uint32_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::uint32_t> d(0, vocab - 1);
  std::vector<std::uint32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("token file round trip, uint16 and uint32", "[data]") {
  temp_dir tmp;
  struct tcase {
    token_dtype dtype;
    std::uint64_t vocab;
  };
  for (auto [dtype, vocab] : {tcase{token_dtype::u16, 256}, tcase{token_dtype::u16, 65536},
                              tcase{token_dtype::u32, 128256}, tcase{token_dtype::u32, 1u << 31}}) {
    CAPTURE(dtype_name(dtype), vocab);
    const auto tokens = random_tokens(10007, static_cast<std::uint32_t>(vocab), 7);
    const auto path = tmp / "rt.tok";
    write_token_file(path, tokens, vocab, dtype);
    CHECK(fs::file_size(path) == 64 + tokens.size() * dtype_bytes(dtype));

    const auto f = token_file::open(path);
    REQUIRE(f.size() == tokens.size());
    CHECK(f.vocab() == vocab);
    CHECK(f.dtype() == dtype);
    for (std::size_t i = 0; i < tokens.size(); ++i) REQUIRE(f[i] == tokens[i]);

    std::vector<std::int32_t> out(100, -7);
    f.read(5000, 99, out.data());
    for (int i = 0; i < 99; ++i) REQUIRE(out[i] == static_cast<std::int32_t>(tokens[5000 + i]));
    CHECK(out[99] == -7);  // nothing written past n
    CHECK_THROWS_AS(f.read(tokens.size() - 10, 11, out.data()), tessera::config_error);
  }
}

TEST_CASE("token file header layout is the documented one", "[data]") {
  temp_dir tmp;
  const std::vector<std::uint32_t> tokens{1, 2, 0x1234};
  write_token_file(tmp / "h.tok", tokens, 65536, token_dtype::u16);
  const std::string b = read_bytes(tmp / "h.tok");
  REQUIRE(b.size() == 64 + 6);
  CHECK(b.substr(0, 8) == "TSRATOK1");
  auto u8 = [&](int i) { return static_cast<unsigned>(static_cast<unsigned char>(b[i])); };
  CHECK(u8(8) == 1);   // version
  CHECK(u8(12) == 1);  // dtype uint16
  CHECK(u8(16) == 3);  // count
  CHECK(u8(24) == 0);  // vocab 65536 = 0x10000, little-endian
  CHECK(u8(26) == 1);
  CHECK(u8(32) == 64);  // header bytes
  for (int i = 40; i < 64; ++i) CHECK(u8(i) == 0);
  CHECK(u8(68) == 0x34);  // third token, little-endian
  CHECK(u8(69) == 0x12);
}

TEST_CASE("the writer goes through a temporary and leaves none behind", "[data]") {
  temp_dir tmp;
  const auto path = tmp / "a.tok";
  write_token_file(path, random_tokens(1000, 256, 1), 256);
  write_token_file(path, random_tokens(500, 256, 2), 256);  // replaces atomically
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.dir)) names.push_back(e.path().filename());
  REQUIRE(names == std::vector<std::string>{"a.tok"});
  CHECK(token_file::open(path).size() == 500);
}

TEST_CASE("the writer validates before creating anything", "[data]") {
  temp_dir tmp;
  const auto path = tmp / "bad.tok";
  std::vector<std::uint32_t> tokens{1, 2, 300, 4};
  REQUIRE_THROWS_WITH(write_token_file(path, tokens, 256),
                      Contains("token 300") && Contains("position 2") && Contains("256"));
  REQUIRE_THROWS_AS(write_token_file(path, tokens, 256), tessera::config_error);
  REQUIRE_THROWS_WITH(write_token_file(path, tokens, 70000, token_dtype::u16),
                      Contains("70000") && Contains("uint16"));
  REQUIRE_THROWS_AS(write_token_file(path, tokens, 0), tessera::config_error);
  CHECK(fs::is_empty(tmp.dir));

  // An unwritable destination: a directory that does not exist.
  REQUIRE_THROWS_AS(
      write_token_file(tmp / "no_such_dir" / "x.tok", std::vector<std::uint32_t>{1}, 256),
      tessera::io_error);
  CHECK(fs::is_empty(tmp.dir));
}

TEST_CASE("the reader rejects a missing file", "[data]") {
  temp_dir tmp;
  REQUIRE_THROWS_AS(token_file::open(tmp / "missing.tok"), tessera::io_error);
  REQUIRE_THROWS_WITH(token_file::open(tmp / "missing.tok"),
                      Contains("missing.tok") && Contains("No such file"));
}

TEST_CASE("the reader rejects a directory", "[data]") {
  temp_dir tmp;
  REQUIRE_THROWS_WITH(token_file::open(tmp.dir), Contains("not a regular file"));
}

TEST_CASE("the reader rejects an empty file", "[data]") {
  temp_dir tmp;
  write_bytes(tmp / "empty.tok", "");
  REQUIRE_THROWS_AS(token_file::open(tmp / "empty.tok"), tessera::io_error);
  REQUIRE_THROWS_WITH(token_file::open(tmp / "empty.tok"),
                      Contains("empty") && Contains("empty.tok"));
}

TEST_CASE("the reader rejects a file shorter than the header", "[data]") {
  temp_dir tmp;
  write_bytes(tmp / "short.tok", std::string("TSRATOK1\x01\x00", 10));
  REQUIRE_THROWS_WITH(token_file::open(tmp / "short.tok"),
                      Contains("truncated: 10 bytes, header needs 64") && Contains("short.tok"));
}

TEST_CASE("the reader rejects a wrong magic", "[data]") {
  temp_dir tmp;
  write_bytes(tmp / "text.tok",
              "Hello, this is plain text and not a token file at all......"
              "........................................");
  REQUIRE_THROWS_AS(token_file::open(tmp / "text.tok"), tessera::io_error);
  REQUIRE_THROWS_WITH(token_file::open(tmp / "text.tok"),
                      Contains("not a tessera token file") && Contains("\"Hello, t\"") &&
                          Contains("TSRATOK1") && Contains("text.tok"));
}

TEST_CASE("the reader rejects an unsupported version, dtype or header size", "[data]") {
  temp_dir tmp;
  const auto path = tmp / "v.tok";
  write_token_file(path, std::vector<std::uint32_t>{1, 2, 3}, 256);
  const std::string good = read_bytes(path);
  auto patched = [&](int at, char v) {
    std::string b = good;
    b[at] = v;
    write_bytes(path, b);
  };
  patched(8, 2);
  REQUIRE_THROWS_WITH(token_file::open(path), Contains("unsupported version 2"));
  patched(12, 9);
  REQUIRE_THROWS_WITH(token_file::open(path), Contains("unsupported token dtype code 9"));
  patched(32, 32);
  REQUIRE_THROWS_WITH(token_file::open(path), Contains("unsupported header size 32"));
}

TEST_CASE("the reader rejects a truncated or padded token section", "[data]") {
  temp_dir tmp;
  const auto path = tmp / "t.tok";
  write_token_file(path, random_tokens(100, 256, 3), 256);
  const std::string good = read_bytes(path);
  write_bytes(path, good.substr(0, good.size() - 3));
  REQUIRE_THROWS_AS(token_file::open(path), tessera::io_error);
  REQUIRE_THROWS_WITH(token_file::open(path), Contains("truncated: header says 100") &&
                                                  Contains("264 bytes") &&
                                                  Contains("file holds 261"));
  write_bytes(path, good + "xx");
  REQUIRE_THROWS_WITH(token_file::open(path),
                      Contains("trailing bytes") && Contains("file holds 266"));
}

TEST_CASE("the reader rejects a token id not below the vocabulary", "[data]") {
  temp_dir tmp;
  const auto path = tmp / "ids.tok";
  auto tokens = random_tokens(1000, 256, 4);
  tokens[617] = 300;  // fits uint16, but the header will claim V = 256
  write_token_file(path, tokens, 512);
  std::string b = read_bytes(path);
  b[25] = 1;  // vocab 512 -> 256 (0x0100 little-endian: byte 24 = 0, byte 25 = 1)
  b[24] = 0;
  write_bytes(path, b);
  REQUIRE_THROWS_AS(token_file::open(path), tessera::io_error);
  REQUIRE_THROWS_WITH(token_file::open(path), Contains("token id 300") && Contains("index 617") &&
                                                  Contains("vocabulary size 256"));
}

TEST_CASE("token_file is move-only and keeps its mapping when moved", "[data]") {
  static_assert(!std::is_copy_constructible_v<token_file>);
  static_assert(std::is_nothrow_move_constructible_v<token_file>);
  temp_dir tmp;
  const auto tokens = random_tokens(64, 256, 5);
  write_token_file(tmp / "m.tok", tokens, 256);
  token_file a = token_file::open(tmp / "m.tok");
  token_file b = std::move(a);
  CHECK(a.size() == 0);
  REQUIRE(b.size() == 64);
  CHECK(b[63] == tokens[63]);
  token_file c;
  c = std::move(b);
  CHECK(c[0] == tokens[0]);
}

TEST_CASE("split holds out the end of the file", "[data]") {
  const auto s = split_tokens(1000);  // default 0.1
  CHECK(s.train == token_range{0, 900});
  CHECK(s.val == token_range{900, 1000});
  CHECK(split_tokens(1001, 0.1).val.size() == 100);  // floor(100.1)
  CHECK(split_tokens(1000, 0.0).val.size() == 0);
  CHECK(split_tokens(7, 0.5).train == token_range{0, 4});
  CHECK_THROWS_AS(split_tokens(10, 1.0), tessera::config_error);
  CHECK_THROWS_AS(split_tokens(10, -0.1), tessera::config_error);
}

namespace {

// An llm.c shard (dev/data/data_common.py's write_datafile): 256 int32 of
// header (magic, version, count), then the tokens.
std::string llmc_bytes(const std::vector<std::uint32_t>& t, int version) {
  std::string b(1024, '\0');
  const std::int32_t head[3] = {20240520, version, static_cast<std::int32_t>(t.size())};
  std::memcpy(b.data(), head, sizeof head);
  for (std::uint32_t v : t) {
    if (version == 1) {
      const auto x = static_cast<std::uint16_t>(v);
      b.append(reinterpret_cast<const char*>(&x), 2);
    } else {
      b.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  return b;
}
// A .npy file as numpy.save writes it (format 1.0, header padded to 64).
std::string npy_bytes(const std::vector<std::uint32_t>& t, const std::string& descr,
                      const std::string& shape, const std::string& order = "False") {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " +
                     shape + ", }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string b = "\x93NUMPY";
  b += '\x01';
  b += '\x00';
  const auto n = static_cast<std::uint16_t>(dict.size());
  b.append(reinterpret_cast<const char*>(&n), 2);
  b += dict;
  for (std::uint32_t v : t) {
    if (descr == "<u2") {
      const auto x = static_cast<std::uint16_t>(v);
      b.append(reinterpret_cast<const char*>(&x), 2);
    } else {
      b.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  return b;
}

}  // namespace

TEST_CASE("llm.c .bin shards and NumPy .npy arrays read as the same tokens", "[data]") {
  temp_dir tmp;
  const auto t16 = random_tokens(5000, 50257, 7);
  const auto t32 = random_tokens(3000, 128256, 8);
  struct file_case {
    std::string name, bytes;
    const std::vector<std::uint32_t>* tokens;
    token_dtype dtype;
  };
  const std::vector<file_case> cases = {
      {"gpt2.bin", llmc_bytes(t16, 1), &t16, token_dtype::u16},
      {"llama3.bin", llmc_bytes(t32, 2), &t32, token_dtype::u32},
      {"a.npy", npy_bytes(t16, "<u2", "(5000,)"), &t16, token_dtype::u16},
      {"b.npy", npy_bytes(t32, "<u4", "(3000,)"), &t32, token_dtype::u32}};
  for (const auto& c : cases) {
    INFO(c.name);
    write_bytes(tmp / c.name, c.bytes);
    const token_file f = token_file::open(tmp / c.name);
    REQUIRE(f.size() == c.tokens->size());
    CHECK(f.dtype() == c.dtype);
    // No vocabulary is recorded: the largest id + 1.
    CHECK(f.vocab() == *std::max_element(c.tokens->begin(), c.tokens->end()) + 1ull);
    std::vector<std::int32_t> got(c.tokens->size());
    f.read(0, static_cast<std::int64_t>(got.size()), got.data());
    for (std::size_t i = 0; i < got.size(); ++i)
      REQUIRE(static_cast<std::uint32_t>(got[i]) == (*c.tokens)[i]);
  }
}

TEST_CASE("damaged llm.c and NumPy token files are refused with the reason", "[data]") {
  temp_dir tmp;
  const std::vector<std::uint32_t> t = {1, 2, 3, 4};
  auto refused = [&](const std::string& bytes, const std::string& what) {
    INFO(what);
    write_bytes(tmp / "x", bytes);
    REQUIRE_THROWS_AS(token_file::open(tmp / "x"), tessera::io_error);
    REQUIRE_THROWS_WITH(token_file::open(tmp / "x"), Contains(what) && Contains("'"));
  };
  refused(llmc_bytes(t, 3), "has version 3; this reader knows 1 (uint16) and 2 (uint32)");
  refused(llmc_bytes(t, 1).substr(0, 1024 + 6), "is truncated: header says 4 uint16 tokens");
  refused(llmc_bytes(t, 1).substr(0, 100), "llm.c token file");
  refused(npy_bytes(t, "<i8", "(4,)"), "holds dtype '<i8'");
  refused(npy_bytes(t, "<u2", "(2, 2)"), "has shape (2, 2); token ids are one-dimensional");
  refused(npy_bytes(t, "<u2", "(4,)", "True"), "is in Fortran order");
  refused(npy_bytes(t, "<u2", "(5,)"), "is truncated: header says 5 uint16 tokens");
  refused(npy_bytes(t, "<u2", "(99999999999999999999999,)"), "overflows 64 bits");
  std::string bad = npy_bytes(t, "<u2", "(4,)");
  bad[8] = '\xff';
  bad[9] = '\x7f';
  refused(bad, "runs past the end of the file");
}

// Fuzz finding (tests/fuzz/corpus/token_file/npy_empty_shape_read): a .npy
// of shape (0,) maps nothing, and read(0, 0) passed its null base pointer to
// memcpy (undefined behaviour; UBSan's nonnull-attribute check in the asan
// preset).
TEST_CASE("an empty NumPy token file opens and reads zero tokens", "[data]") {
  temp_dir tmp;
  write_bytes(tmp / "empty.npy", npy_bytes({}, "<u4", "(0,)"));
  const token_file f = token_file::open(tmp / "empty.npy");
  CHECK(f.size() == 0);
  std::int32_t out = -7;
  f.read(0, 0, &out);
  CHECK(out == -7);
  CHECK_THROWS_AS(f.read(0, 1, &out), tessera::config_error);
}

}  // namespace test_data_token_file
