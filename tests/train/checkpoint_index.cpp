// The layout-free checkpoint index (include/tessera/train/checkpoint_index.hpp):
// pieces written by several layouts of the same tensors (whole tensors,
// tensor-parallel row and column boxes, ZeRO flat shards cutting those boxes
// anywhere), read back for random boxes and flat ranges of other layouts,
// against the global tensors; the JSON round trip; and metadata that lies
// (a piece past its file's end, an unknown tensor, a box outside its
// tensor) refused naming the problem.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tessera/train/checkpoint_index.hpp"

namespace test_train_checkpoint_index {

using namespace tessera;
using namespace tessera::train;

namespace {

// The global tensors: a (5, 7) matrix and an (11) vector; element i = 1000 t + i.
const std::vector<std::int64_t> a_shape = {5, 7}, b_shape = {11};
double global_value(int t, std::int64_t i) {
  return 1000.0 * t + static_cast<double>(i);
}

// A checkpoint in memory: its index and its files' bytes.
struct memory_checkpoint {
  checkpoint_index index;
  std::vector<std::vector<unsigned char>> data;

  memory_checkpoint() {
    index.tensors["a"] = {a_shape, {{"param", "float64"}}};
    index.tensors["b"] = {b_shape, {{"param", "float64"}}};
  }
  // Stores elements [lo, hi) of `box` of tensor t ("a" 0, "b" 1) in file f.
  void store(int t, const index_box& box, std::int64_t lo, std::int64_t hi, int f) {
    if (static_cast<std::size_t>(f) >= data.size()) {
      data.resize(static_cast<std::size_t>(f) + 1);
      index.files.resize(data.size());
      for (std::size_t i = 0; i < data.size(); ++i)
        index.files[i].name = "rank-" + std::to_string(i);
    }
    const auto& shape = t == 0 ? a_shape : b_shape;
    auto& bytes = data[static_cast<std::size_t>(f)];
    index.pieces.push_back({t == 0 ? "a" : "b", "param", box, lo, hi, f, bytes.size()});
    for (std::int64_t e = lo; e < hi; ++e) {
      // Global row-major index of element e of the box.
      std::int64_t g = 0, rest = e;
      std::vector<std::int64_t> coord(shape.size());
      for (std::size_t d = shape.size(); d-- > 0;) {
        coord[d] = box.start[d] + rest % box.shape[d];
        rest /= box.shape[d];
      }
      for (std::size_t d = 0; d < shape.size(); ++d) g = g * shape[d] + coord[d];
      const double v = global_value(t, g);
      const auto* p = reinterpret_cast<const unsigned char*>(&v);
      bytes.insert(bytes.end(), p, p + sizeof v);
    }
    index.files[static_cast<std::size_t>(f)].bytes = bytes.size();
  }
  // Reads [lo, hi) of `box` of tensor t through plan_region.
  std::vector<double> read(int t, const index_box& box, std::int64_t lo, std::int64_t hi,
                           std::size_t* copies = nullptr) const {
    const auto plan = index.plan_region(t == 0 ? "a" : "b", "param", box, lo, hi);
    if (copies) *copies = plan.size();
    std::vector<double> out(static_cast<std::size_t>(hi - lo),
                            std::numeric_limits<double>::quiet_NaN());
    for (const region_copy& c : plan)
      std::memcpy(out.data() + c.dst, data[static_cast<std::size_t>(c.file)].data() + c.src,
                  static_cast<std::size_t>(c.n) * sizeof(double));
    return out;
  }
};

// What [lo, hi) of `box` of tensor t holds.
std::vector<double> expected(int t, const index_box& box, std::int64_t lo, std::int64_t hi) {
  memory_checkpoint m;
  m.store(t, box, lo, hi, 0);
  std::vector<double> v(static_cast<std::size_t>(hi - lo));
  std::memcpy(v.data(), m.data[0].data(), v.size() * sizeof(double));
  return v;
}

// Splits [0, n) into `parts` contiguous ranges (ZeRO's flat shards).
std::vector<std::pair<std::int64_t, std::int64_t>> flat_shards(std::int64_t n, int parts) {
  std::vector<std::pair<std::int64_t, std::int64_t>> r;
  for (int p = 0; p < parts; ++p) r.emplace_back(n * p / parts, n * (p + 1) / parts);
  return r;
}

// The checkpoints of four layouts of the same two tensors.
std::vector<memory_checkpoint> layouts() {
  std::vector<memory_checkpoint> all(4);
  // One rank: whole tensors.
  all[0].store(0, {{0, 0}, a_shape}, 0, 35, 0);
  all[0].store(1, {{0}, b_shape}, 0, 11, 0);
  // tp 2 by rows (3 + 2), each box cut into 2 ZeRO shards; b replicated, written by tp rank 0.
  int f = 0;
  for (const index_box& box : {index_box{{0, 0}, {3, 7}}, index_box{{3, 0}, {2, 7}}})
    for (const auto& [lo, hi] : flat_shards(box.numel(), 2)) all[1].store(0, box, lo, hi, f++);
  for (const auto& [lo, hi] : flat_shards(11, 2))
    all[1].store(1, {{0}, b_shape}, lo, hi, lo == 0 ? 0 : 1);
  // tp 2 by columns (4 + 3), 3 shards each; b split by ZeRO into 3.
  f = 0;
  for (const index_box& box : {index_box{{0, 0}, {5, 4}}, index_box{{0, 4}, {5, 3}}})
    for (const auto& [lo, hi] : flat_shards(box.numel(), 3)) all[2].store(0, box, lo, hi, f++);
  for (const auto& [lo, hi] : flat_shards(11, 3)) all[2].store(1, {{0}, b_shape}, lo, hi, 0);
  // Single-row boxes, shards of 4 elements (pieces end mid-row of no box).
  f = 0;
  for (std::int64_t r = 0; r < 5; ++r)
    for (std::int64_t lo = 0; lo < 7; lo += 4)
      all[3].store(0, {{r, 0}, {1, 7}}, lo, std::min<std::int64_t>(lo + 4, 7), f++ % 3);
  all[3].store(1, {{0}, b_shape}, 0, 11, 2);
  return all;
}

}  // namespace

TEST_CASE("checkpoint index: any box and flat range reads back from any layout's pieces",
          "[train][checkpoint]") {
  std::mt19937_64 rng(3);
  for (const memory_checkpoint& m : layouts()) {
    for (int trial = 0; trial < 300; ++trial) {
      const int t = static_cast<int>(rng() % 2);
      const auto& shape = t == 0 ? a_shape : b_shape;
      index_box box;
      for (const std::int64_t s : shape) {
        const std::int64_t lo = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(s));
        const std::int64_t n =
            1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(s - lo));
        box.start.push_back(lo);
        box.shape.push_back(n);
      }
      const std::int64_t n = box.numel();
      const std::int64_t lo = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n));
      const std::int64_t hi =
          lo + 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n - lo));
      INFO("tensor " << t << " box start " << box.start[0] << " shape " << box.shape[0] << " flat ["
                     << lo << ", " << hi << ")");
      CHECK(m.read(t, box, lo, hi) == expected(t, box, lo, hi));
    }
  }
}

TEST_CASE("checkpoint index: copies are merged where both sides continue", "[train][checkpoint]") {
  const auto all = layouts();
  std::size_t copies = 0;
  // The whole matrix from the whole-tensor piece: one copy.
  (void)all[0].read(0, {{0, 0}, a_shape}, 0, 35, &copies);
  CHECK(copies == 1);
  // A row box of tp 2 from the row-split layout: its two ZeRO shards.
  (void)all[1].read(0, {{3, 0}, {2, 7}}, 0, 14, &copies);
  CHECK(copies == 2);
  // Rows 1 and 2 from the column boxes: each row from both boxes, and row
  // 1 across a shard boundary in each (the left box's at its element 6,
  // the right box's at 5): 2 + 2 + 1 + 1 copies.
  (void)all[2].read(0, {{1, 0}, {2, 7}}, 0, 14, &copies);
  CHECK(copies == 6);
  CHECK(all[0].read(0, {{0, 0}, a_shape}, 5, 5).empty());
}

TEST_CASE("checkpoint index: elements no piece holds, and requests outside the tensor, are refused",
          "[train][checkpoint]") {
  memory_checkpoint m;
  m.store(0, {{0, 0}, {3, 7}}, 0, 21, 0);  // rows 3 and 4 of a were never written
  CHECK_NOTHROW(m.read(0, {{0, 0}, {3, 7}}, 0, 21));
  CHECK_THROWS_WITH(m.read(0, {{0, 0}, a_shape}, 0, 35),
                    Catch::Contains("no stored piece holds element 21 of param of 'a'"));
  CHECK_THROWS_AS(m.read(0, {{4, 0}, {2, 7}}, 0, 14), config_error);  // box past row 5
  CHECK_THROWS_AS(m.read(0, {{0, 0}, {1, 7}}, 0, 8), config_error);   // range past the box
  CHECK_THROWS_WITH(m.index.plan_region("c", "param", {{0}, {1}}, 0, 1),
                    Catch::Contains("no tensor 'c'"));
  CHECK_THROWS_WITH(m.index.plan_region("a", "exp_avg", {{0, 0}, {1, 1}}, 0, 1),
                    Catch::Contains("has no exp_avg"));
}

TEST_CASE("checkpoint index: JSON round trip, and metadata that does not add up is refused",
          "[train][checkpoint]") {
  const auto all = layouts();
  for (const memory_checkpoint& m : all) {
    const nlohmann::json j = m.index.to_json();
    const checkpoint_index back = checkpoint_index::from_json(j, "m");
    CHECK(back.to_json() == j);
  }
  const nlohmann::json good = all[1].index.to_json();
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& says) {
    nlohmann::json j = good;
    edit(j);
    CHECK_THROWS_WITH(checkpoint_index::from_json(j, "step-000004/metadata.json"),
                      Catch::Contains("step-000004/metadata.json") && Catch::Contains(says));
  };
  refused([](nlohmann::json& j) { j["pieces"][0]["offset"] = 1u << 20; }, "reaches past the end");
  refused([](nlohmann::json& j) { j["pieces"][0]["tensor"] = "z"; }, "unknown tensor 'z'");
  refused([](nlohmann::json& j) { j["pieces"][0]["start"] = {4, 0}; }, "not inside the tensor");
  refused([](nlohmann::json& j) { j["pieces"][0]["flat"] = {0, 99}; }, "flat range");
  refused([](nlohmann::json& j) { j["pieces"][0]["file"] = 9; }, "in file 9");
  refused([](nlohmann::json& j) { j["tensors"]["a"]["shape"] = {-5, 7}; }, "negative");
  refused([](nlohmann::json& j) { j["tensors"]["a"]["roles"]["param"] = "f8"; },
          "unknown element type");
  refused([](nlohmann::json& j) { j["files"][0]["name"] = "../x"; }, "not a plain name");
  refused([](nlohmann::json& j) { j["version"] = 2; }, "format version 2");
  refused([](nlohmann::json& j) { j.erase("format"); }, "not a tessera checkpoint");
  refused([](nlohmann::json& j) { j["pieces"][0].erase("role"); }, "malformed");
}

}  // namespace test_train_checkpoint_index
