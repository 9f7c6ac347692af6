// Tests include/tessera/data/safetensors.hpp: what write_safetensors writes
// is the format (8-byte little-endian header length, JSON header padded to 8,
// contiguous data), it reads back bit for bit in every floating dtype, and
// every damaged file is refused naming the file and the numbers.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/numeric.hpp"
#include "tessera/data/safetensors.hpp"

namespace test_data_safetensors {

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::data;
using Catch::Contains;

namespace {

struct temp_dir {
  fs::path dir;
  temp_dir() {
    static int counter = 0;
    dir = fs::temp_directory_path() /
          ("tessera_safetensors_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~temp_dir() { fs::remove_all(dir); }
  fs::path operator/(const std::string& name) const { return dir / name; }
};

// A file of an 8-byte header length `n`, the header text and `data`.
void write_raw(const fs::path& p, std::uint64_t n, const std::string& header,
               const std::string& data = {}) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}
void write_raw(const fs::path& p, const std::string& header, const std::string& data = {}) {
  write_raw(p, header.size(), header, data);
}

}  // namespace

TEST_CASE("safetensors round trip: every floating dtype bit for bit, the header as specified",
          "[data][safetensors]") {
  temp_dir tmp;
  const std::vector<double> d = {1.0, -2.5, 3.0e-300, 0.1};
  const std::vector<float> f = {1.5f, -0.3f, 7.0f, 1e-30f, 2.0f, 65504.0f};
  std::vector<bf16> b;
  std::vector<fp16> h;
  for (float x : f) {
    b.push_back(bf16(x));
    h.push_back(fp16(x));
  }
  const std::vector<safetensors_entry> entries = {
      {"z.f64", "F64", {2, 2}, d.data(), d.size() * 8},
      {"a.f32", "F32", {3, 2}, f.data(), f.size() * 4},
      {"m.bf16", "BF16", {6}, b.data(), b.size() * 2},
      {"m.f16", "F16", {1, 6}, h.data(), h.size() * 2}};
  const fs::path p = tmp / "t.safetensors";
  write_safetensors(p, entries, {{"format", "pt"}});

  // The raw bytes: the header length, a JSON object padded to 8 with spaces.
  std::ifstream in(p, std::ios::binary);
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  CHECK(n % 8 == 0);
  std::string js(n, '\0');
  in.read(js.data(), static_cast<std::streamsize>(n));
  const auto j = nlohmann::json::parse(js);
  CHECK(j["__metadata__"]["format"] == "pt");
  CHECK(j["a.f32"]["dtype"] == "F32");
  CHECK(j["a.f32"]["shape"] == nlohmann::json::array({3, 2}));
  // The data is contiguous in the order written: z.f64 first.
  CHECK(j["z.f64"]["data_offsets"] == nlohmann::json::array({0, 32}));
  CHECK(j["a.f32"]["data_offsets"] == nlohmann::json::array({32, 56}));
  CHECK(fs::file_size(p) == 8 + n + 32 + 24 + 12 + 12);

  safetensors_file r(p);
  CHECK(r.metadata().at("format") == "pt");
  REQUIRE(r.tensors().size() == 4);
  std::vector<double> out(6);
  r.find("z.f64")->read(0, 4, out.data());
  for (int i = 0; i < 4; ++i) CHECK(out[i] == d[i]);
  r.find("a.f32")->read(1, 5, out.data());
  for (int i = 0; i < 5; ++i) CHECK(out[i] == static_cast<double>(f[i + 1]));
  r.find("m.bf16")->read(0, 6, out.data());
  for (int i = 0; i < 6; ++i) CHECK(out[i] == to<double>(b[i]));
  r.find("m.f16")->read(0, 6, out.data());
  for (int i = 0; i < 6; ++i) CHECK(out[i] == to<double>(h[i]));
  CHECK(r.find("m.f16")->numel() == 6);
  CHECK(r.find("nope") == nullptr);
  // Nothing but the file: the temporary was renamed.
  CHECK(std::distance(fs::directory_iterator(tmp.dir), fs::directory_iterator{}) == 1);
}

TEST_CASE("safetensors reads F8_E4M3 and F8_E5M2 tensors as fp8_e4m3 and fp8_e5m2",
          "[data][safetensors]") {
  // Every bit pattern of each format, one byte each, decoded exactly (NaN
  // patterns as NaN with their sign).
  temp_dir tmp;
  std::vector<std::uint8_t> all(256);
  for (int q = 0; q < 256; ++q) all[q] = static_cast<std::uint8_t>(q);
  const fs::path p = tmp / "f8.safetensors";
  write_safetensors(
      p, {{"w", "F8_E4M3", {16, 16}, all.data(), 256}, {"g", "F8_E5M2", {256}, all.data(), 256}});
  safetensors_file r(p);
  REQUIRE(r.find("w")->bytes == 256);
  std::vector<double> w(256), g(256);
  r.find("w")->read(0, 256, w.data());
  r.find("g")->read(0, 256, g.data());
  auto same = [](double got, double want) {
    return std::isnan(want) ? std::isnan(got) && std::signbit(got) == std::signbit(want)
                            : got == want;
  };
  int bad = 0;
  for (int q = 0; q < 256; ++q) {
    const auto b = static_cast<std::uint8_t>(q);
    bad += !same(w[q], to<double>(fp8_e4m3::from_bits(b)));
    bad += !same(g[q], to<double>(fp8_e5m2::from_bits(b)));
  }
  CHECK(bad == 0);
  CHECK(w[0x7e] == 448.0);
  CHECK(g[0x7b] == 57344.0);
  CHECK(g[0xfc] == -INFINITY);
}

TEST_CASE("safetensors writer refuses entries that do not match their shape", "[data][safetensors]") {
  temp_dir tmp;
  const float x[4] = {1, 2, 3, 4};
  REQUIRE_THROWS_WITH(write_safetensors(tmp / "a", {{"t", "F32", {3}, x, 16}}),
                      Contains("16 bytes") && Contains("needs 12"));
  REQUIRE_THROWS_WITH(write_safetensors(tmp / "a", {{"t", "Q4", {4}, x, 16}}),
                      Contains("unknown dtype 'Q4'"));
  REQUIRE_THROWS_WITH(write_safetensors(tmp / "a", {{"t", "F32", {-1, -1}, x, 4}}),
                      Contains("dimension -1 < 0"));
  REQUIRE_THROWS_WITH(
      write_safetensors(tmp / "a", {{"t", "F32", {std::int64_t{1} << 62, 8}, x, 16}}),
      Contains("overflows 64 bits"));
  REQUIRE_THROWS_WITH(
      write_safetensors(tmp / "a", {{"t", "F32", {4}, x, 16}, {"t", "F32", {4}, x, 16}}),
      Contains("'t' is reserved or repeated"));
  CHECK(fs::is_empty(tmp.dir));
}

TEST_CASE("safetensors reader refuses damaged files, naming the file and the numbers",
          "[data][safetensors]") {
  temp_dir tmp;
  const fs::path p = tmp / "bad.safetensors";
  auto refused = [&](const std::string& what) {
    INFO(what);
    REQUIRE_THROWS_AS(safetensors_file(p), io_error);
    REQUIRE_THROWS_WITH(safetensors_file(p), Contains(p.string()) && Contains(what));
  };
  { std::ofstream(p) << "abc"; }
  refused("truncated: 3 bytes");
  write_raw(p, 1000, "{}");
  refused("header length 1000 runs past the end of the file (10 bytes)");
  write_raw(p, 200'000'000, "{}");
  refused("exceeds the limit of 100000000 bytes");
  write_raw(p, "{not json");
  refused("is not JSON");
  write_raw(p, "[1, 2]");
  refused("the header is not a JSON object");
  write_raw(p, R"({"t": {"dtype": "F32", "shape": [2]}})");
  refused("tensor 't' needs a string dtype, a shape array and two data_offsets");
  write_raw(p, R"({"t": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}})",
            std::string(8, '\0'));
  refused("unknown dtype 'F99'");
  write_raw(p, R"({"t": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})",
            std::string(8, '\0'));
  refused("a dimension -2 that is not a non-negative integer");
  write_raw(p,
            R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
            std::string(8, '\0'));
  refused("has a shape [4294967296,4294967296] whose element count overflows int64");
  // Found by tests/fuzz/safetensors.cpp: a 0 at the end kept the unsigned count 0, but the
  // partial product 3 x 2^62 overflowed int64 in safetensors_tensor::numel().
  write_raw(p, R"({"t": {"dtype": "U8", "shape": [3, 4611686018427387904, 0], "data_offsets": [0, 0]}})");
  refused("has a shape [3,4611686018427387904,0] whose element count overflows int64");
  write_raw(p, R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})",
            std::string(8, '\0'));
  refused("data_offsets [0, 16) outside the 8 data bytes");
  write_raw(p, R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
            std::string(8, '\0'));
  refused("holds 8 bytes, but its shape [3] of F32 needs 3 x 4");
  write_raw(p,
            R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            std::string(12, '\0'));
  refused("two tensors overlap at data bytes [4, 8)");
  write_raw(p,
            R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
            std::string(12, '\0'));
  refused("data bytes [4, 8) belong to no tensor");
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
            std::string(10, '\0'));
  refused("the last 6 data bytes belong to no tensor");
  write_raw(p,
            R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
            std::string(8, '\0'));
  refused("tensor 'a' appears twice in the header");
  write_raw(p, R"({"__metadata__": {"k": 3}})");
  refused("__metadata__ value 'k' is not a string");
  // A header nested a million levels deep (a stack bomb for a recursive
  // printer) is refused while parsing.
  write_raw(p, R"({"t": {"dtype": "F32", "shape": )" + std::string(1000000, '[') +
                   std::string(1000000, ']') + "}}");
  refused("JSON nested deeper than 16 levels");
  // A directory, and a file that does not exist.
  REQUIRE_THROWS_WITH(safetensors_file(tmp.dir), Contains("not a regular file"));
  REQUIRE_THROWS_WITH(safetensors_file(tmp / "missing"), Contains("cannot open"));
  // An integer tensor opens, but is not read as weights.
  const std::int32_t iv[2] = {1, 2};
  write_safetensors(p, {{"i", "I32", {2}, iv, 8}});
  safetensors_file ok(p);
  double out[2];
  REQUIRE_THROWS_WITH(ok.find("i")->read(0, 2, out), Contains("I32 is not a floating type"));
}

}  // namespace test_data_safetensors
