// The files of a layout-free checkpoint (include/tessera/train/checkpoint_io.hpp):
// three ranks' data files of a tensor-parallel and ZeRO-sharded layout
// written through rank_file (host bytes and block-by-block producers), the
// metadata written last, then read back by checkpoint_reader for the boxes
// of other layouts against the global tensor; its SHA-256 verification
// naming a damaged file; a truncated file, a missing file and a folder
// without metadata refused by name; a failed write leaving no file.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "tessera/train/checkpoint_io.hpp"

namespace test_train_checkpoint_io {

using namespace tessera;
using namespace tessera::train;
namespace fs = std::filesystem;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("tessera_ckpt_io_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The global tensor w (6, 5) float: element i = i + 0.5; and g (4) bf16-sized (int16 here).
constexpr std::int64_t R = 6, C = 5;
float w_at(std::int64_t i) {
  return static_cast<float>(i) + 0.5f;
}

// Writes the checkpoint of tp 2 by rows (3 + 3) with 2 ZeRO shards per box,
// as files of 3 ranks (rank 2 holds the second box's second shard), with
// small blocks so a piece spans several.
checkpoint_index write_layout(const fs::path& dir) {
  checkpoint_index index;
  index.tensors["w"] = {{R, C}, {{"master", "float32"}}};
  index.run = {{"step", 8}};
  std::vector<float> global(R * C);
  for (std::int64_t i = 0; i < R * C; ++i) global[static_cast<std::size_t>(i)] = w_at(i);
  rank_file files[3];
  int f = 0;
  for (std::int64_t r0 : {0, 3}) {
    const index_box box{{r0, 0}, {3, C}};
    for (auto [lo, hi] : {std::pair<std::int64_t, std::int64_t>{0, 7}, {7, 15}}) {
      const float* src = global.data() + r0 * C + lo;
      stored_piece p{"w", "master", box, lo, hi, 0, 0};
      const std::size_t bytes = static_cast<std::size_t>(hi - lo) * sizeof(float);
      if (f % 2 == 0)
        files[std::min(f, 2)].add(p, src, bytes);
      else
        files[std::min(f, 2)].add(p, bytes, [src](std::size_t at, void* dst, std::size_t n) {
          std::memcpy(dst, reinterpret_cast<const char*>(src) + at, n);
        });
      ++f;
    }
  }
  for (int k = 0; k < 3; ++k) {
    auto [file, pieces] = files[k].write(dir, "rank-0000" + std::to_string(k) + ".bin", k, 8);
    CHECK(file.bytes == files[k].bytes());
    CHECK(file.sha256.size() == 64);
    index.files.push_back(file);
    index.pieces.insert(index.pieces.end(), pieces.begin(), pieces.end());
  }
  write_checkpoint_metadata(dir, index);
  return index;
}

std::vector<float> expected(const index_box& box, std::int64_t lo, std::int64_t hi) {
  std::vector<float> v;
  for (std::int64_t e = lo; e < hi; ++e) {
    const std::int64_t r = box.start[0] + e / box.shape[1], c = box.start[1] + e % box.shape[1];
    v.push_back(w_at(r * C + c));
  }
  return v;
}

}  // namespace

TEST_CASE("checkpoint files: written per rank, read back by the boxes of other layouts",
          "[train][checkpoint]") {
  temp_dir t;
  const checkpoint_index written = write_layout(t.path);
  checkpoint_reader rd(t.path);
  CHECK(rd.index().to_json() == written.to_json());
  CHECK(rd.index().run["step"] == 8);
  REQUIRE_NOTHROW(rd.verify());
  // Whole; tp 3 by rows; tp 2 by columns with 3 ZeRO shards; one element.
  for (const auto& [box, lo, hi] :
       {std::tuple<index_box, std::int64_t, std::int64_t>{{{0, 0}, {R, C}}, 0, R * C},
        {{{2, 0}, {2, C}}, 0, 2 * C},
        {{{0, 3}, {R, 2}}, 4, 9},
        {{{5, 4}, {1, 1}}, 0, 1}}) {
    std::vector<float> got(static_cast<std::size_t>(hi - lo), -1.f);
    rd.read("w", "master", box, lo, hi, got.data());
    CHECK(got == expected(box, lo, hi));
  }
}

TEST_CASE("checkpoint files: damage, truncation, a missing file or metadata are named",
          "[train][checkpoint]") {
  temp_dir t;
  (void)write_layout(t.path);
  const fs::path f1 = t.path / "rank-00001.bin";
  {  // one flipped byte: the sizes agree, the hash does not
    std::fstream io(f1, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(3);
    io.put('\x7f');
  }
  {
    checkpoint_reader rd(t.path);
    CHECK_THROWS_WITH(rd.verify(), Catch::Contains("rank-00001.bin") &&
                                       Catch::Contains("does not match its SHA-256"));
  }
  fs::resize_file(f1, 10);
  CHECK_THROWS_WITH(checkpoint_reader(t.path),
                    Catch::Contains("rank-00001.bin") && Catch::Contains("holds 10 bytes"));
  fs::remove(f1);
  CHECK_THROWS_WITH(checkpoint_reader(t.path),
                    Catch::Contains("rank-00001.bin") && Catch::Contains("is missing"));
  fs::remove(t.path / checkpoint_metadata_name);
  CHECK_THROWS_WITH(checkpoint_reader(t.path),
                    Catch::Contains("has no metadata.json") && Catch::Contains("did not complete"));
  {
    std::ofstream bad(t.path / checkpoint_metadata_name);
    bad << "{\"format\": \"tessera-checkpoint\", \"version\": 1, [";
  }
  CHECK_THROWS_WITH(checkpoint_reader(t.path), Catch::Contains("is not JSON"));
}

TEST_CASE("checkpoint files: a write that fails leaves no file behind", "[train][checkpoint]") {
  temp_dir t;
  rank_file rf;
  const float x[4] = {1, 2, 3, 4};
  rf.add({"w", "master", {{0, 0}, {1, 4}}, 0, 4, 0, 0}, x, sizeof x);
  rf.add({"w", "master", {{1, 0}, {1, 4}}, 0, 4, 0, 0}, sizeof x,
         [](std::size_t, void*, std::size_t) { throw io_error("device copy failed"); });
  CHECK_THROWS_WITH(rf.write(t.path, "rank-00000.bin", 0), Catch::Contains("device copy failed"));
  CHECK(fs::is_empty(t.path));
}

TEST_CASE("checkpoint files: a snapshot writes the bytes of its moment, not later ones",
          "[train][checkpoint]") {
  temp_dir t;
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  rank_file rf;
  rf.add({"w", "master", {{0, 0}, {1, 6}}, 0, 6, 0, 0}, x.data(), x.size() * sizeof(float));
  int produced = 0;  // a producer (a device copy) runs once, at the snapshot
  rf.add({"w", "exp_avg", {{0, 0}, {1, 6}}, 0, 6, 0, 0}, x.size() * sizeof(float),
         [&](std::size_t at, void* dst, std::size_t n) {
           ++produced;
           std::memcpy(dst, reinterpret_cast<const char*>(x.data()) + at, n);
         });
  const rank_file snap = rf.snapshot();
  CHECK(produced == 1);
  CHECK(snap.bytes() == rf.bytes());
  const std::vector<float> then = x;
  for (float& v : x) v = -v;  // the training step goes on
  (void)snap.write(t.path, "rank-00000.bin", 0);
  CHECK(produced == 1);
  std::ifstream in(t.path / "rank-00000.bin", std::ios::binary);
  std::vector<float> back(12);
  in.read(reinterpret_cast<char*>(back.data()), 12 * sizeof(float));
  REQUIRE(in.gcount() == 12 * static_cast<std::streamsize>(sizeof(float)));
  CHECK(std::vector<float>(back.begin(), back.begin() + 6) == then);
  CHECK(std::vector<float>(back.begin() + 6, back.end()) == then);
}

TEST_CASE("checkpoint files: pieces are staged through the host memory given (pinned on a GPU)",
          "[train][checkpoint]") {
  temp_dir t;
  host_memory_resource staging_mr;  // stands in for cuda::pinned_resource
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  rank_file rf;
  rf.stage_through(&staging_mr);
  std::size_t peak = 0;  // what the resource holds while the device copy runs
  rf.add({"w", "exp_avg", {{0, 0}, {1, 6}}, 0, 6, 0, 0}, x.size() * sizeof(float),
         [&](std::size_t at, void* dst, std::size_t n) {
           peak = std::max(peak, staging_mr.stats().allocated);
           std::memcpy(dst, reinterpret_cast<const char*>(x.data()) + at, n);
         });
  // A synchronous write: its block comes from the resource and goes back.
  (void)rf.write(t.path, "rank-00000.bin", 0, 16);
  CHECK(peak == 16);
  CHECK(staging_mr.stats().allocated == 0);
  {
    // A snapshot's copies too, held by the staging buffers until they go.
    rank_file::staging st;
    const rank_file snap = rf.snapshot(&st);
    CHECK(st.mr == &staging_mr);
    CHECK(staging_mr.stats().allocated == x.size() * sizeof(float));
    (void)snap.write(t.path, "rank-00001.bin", 1);
  }
  CHECK(staging_mr.stats().allocated == 0);
  std::ifstream a(t.path / "rank-00000.bin", std::ios::binary),
      b(t.path / "rank-00001.bin", std::ios::binary);
  std::vector<float> ra(6), rb(6);
  a.read(reinterpret_cast<char*>(ra.data()), 6 * sizeof(float));
  b.read(reinterpret_cast<char*>(rb.data()), 6 * sizeof(float));
  CHECK(ra == x);
  CHECK(rb == x);
}

}  // namespace test_train_checkpoint_io
