// Tests include/tessera/train/checkpoint_file.hpp: a checkpoint reads back its
// metadata and payload, and a damaged one is refused with io_error naming
// the file (the fuzz target tests/fuzz/checkpoint.cpp explores the rest).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/train/checkpoint_file.hpp"

namespace test_train_checkpoint_file {

namespace fs = std::filesystem;
using namespace tessera;
using Catch::Contains;

namespace {

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() /
         ("tessera_checkpoint_" + std::to_string(::getpid()) + "_" + name);
}

std::vector<char> bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void put(const fs::path& p, const std::vector<char>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
}

}  // namespace

TEST_CASE("a checkpoint reads back its metadata and payload", "[train][checkpoint]") {
  const fs::path p = temp_file("round_trip.ckpt");
  const nlohmann::json meta = {{"step", 3}, {"name", "tiny"}};
  const std::vector<float> state = {1.0f, -2.0f, 0.5f};
  train::write_checkpoint(p, meta, sizeof(float) * state.size(),
                          [&](train::checkpoint_writer& w) { w.write(state.data(), 12); });
  nlohmann::json m;
  std::vector<char> payload;
  train::read_checkpoint(p, m, payload);
  CHECK(m == meta);
  REQUIRE(payload.size() == 12);
  CHECK(std::memcmp(payload.data(), state.data(), 12) == 0);
  fs::remove(p);
}

TEST_CASE("a payload size that wraps the length sum is refused, not allocated",
          "[train][checkpoint]") {
  // Found by tests/fuzz/checkpoint.cpp: header + metadata + a payload size
  // near 2^64 summed to the file's length, so the reader tried to allocate it.
  const fs::path p = temp_file("wrapping.ckpt");
  train::write_checkpoint(p, nlohmann::json::object(), 0, [](train::checkpoint_writer&) {});
  std::vector<char> b =
      bytes_of(p);  // 8 magic, 8 version, 8 json size, "{}", 8 payload size, 8 hash
  REQUIRE(b.size() == 42);
  b.resize(34);  // without its checksum the file is 8 bytes shorter than 40 + 2 + payload size,
  const std::uint64_t wraps = std::uint64_t{0} - 8;  // so 2^64 - 8 made the sum 34 again
  std::memcpy(b.data() + 26, &wraps, 8);
  put(p, b);
  nlohmann::json m;
  std::vector<char> payload;
  CHECK_THROWS_AS(train::read_checkpoint(p, m, payload), io_error);
  CHECK_THROWS_WITH(train::read_checkpoint(p, m, payload),
                    Contains(p.string()) && Contains("payload size") &&
                        Contains(std::to_string(wraps)) && Contains("at byte 26"));
  fs::remove(p);
}

}  // namespace test_train_checkpoint_file
