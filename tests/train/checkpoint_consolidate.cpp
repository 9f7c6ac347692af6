// Consolidating a checkpoint folder (include/tessera/train/
// checkpoint_consolidate.hpp): bf16_mixed runs on thread ranks (dp 2 under
// zero<3>, and tp 2) train two steps and save; the folder is consolidated
// into one file. Every role of every tensor reads back byte for byte, and
// a run that loads the consolidated folder (on one rank, and at the layout
// that wrote it) holds the same parameters, master weights and AdamW
// moments as one that loads the original (each saves again right after
// the load, compared byte for byte) and trains the same next steps, bit
// for bit (same layout, seed and thread count: DESIGN.md's replay
// promise). Then: the coverage check names an overlap and a gap, and a
// damaged source or an existing output leaves nothing behind.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/train/checkpoint_consolidate.hpp>

#include "reshard_suite.hpp"

namespace test_train_checkpoint_consolidate {

using namespace tessera;
namespace fs = std::filesystem;
using P = precision::bf16_mixed;

namespace {

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() /
           ("tessera_ckpt_consolidate_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

using reshard_suite::mesh;
using reshard_suite::mesh_run;
using reshard_suite::saved_at;
using reshard_suite::steps;

// Every role of every tensor of checkpoints `a` and `b`, read whole, is
// the same bytes, and so is their run state (reshard_suite::state_difference);
// each tensor holds param, master, exp_avg and exp_avg_sq.
void require_same_state(const fs::path& a, const fs::path& b) {
  const std::string diff = reshard_suite::state_difference(a, b);
  INFO(diff);
  CHECK(diff.empty());
  train::checkpoint_reader ra(a);
  for (const auto& [name, t] : ra.index().tensors) CHECK(t.roles.size() == 4);
}

}  // namespace

TEST_CASE("a consolidated checkpoint loads as the original at any layout", "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_consolidate", 0)};
  data::token_file f(corpus.path);
  for (const mesh_run& src : {mesh(2, 1, 1, 3), mesh(1, 2, 1, 0)}) {
    INFO("saved at " << src.name());
    temp_dir orig("orig"), cons("cons");
    (void)reshard_suite::run_on_threads<P>(src, f, {}, {}, saved_at, orig.path);
    train::consolidate_checkpoint(orig.path, cons.path);
    {
      train::checkpoint_reader rd(cons.path);
      CHECK(rd.index().files.size() == 1);
      CHECK(rd.index().pieces.size() == 4 * rd.index().tensors.size());  // each whole
    }
    require_same_state(orig.path, cons.path);
    for (const mesh_run& dst : {mesh(1, 1, 1, 0), src}) {
      INFO("loaded at " << dst.name());
      temp_dir ra("resaved_orig"), rb("resaved_cons");
      const auto a = reshard_suite::run_on_threads<P>(dst, f, orig.path, ra.path, steps, {});
      const auto b = reshard_suite::run_on_threads<P>(dst, f, cons.path, rb.path, steps, {});
      require_same_state(ra.path, rb.path);
      REQUIRE(a.loss.size() == static_cast<std::size_t>(steps - saved_at));
      CHECK(a.loss == b.loss);  // bit for bit: the same state, layout and order
      CHECK(a.norm == b.norm);
    }
  }
}

TEST_CASE("the coverage check names a tensor whose pieces overlap or leave a gap",
          "[train][checkpoint]") {
  train::checkpoint_index x;
  x.tensors["w"] = {{4, 3}, {{"param", "float32"}}};
  x.files.push_back({"rank-00000.bin", 1000, ""});
  auto piece = [](std::int64_t row0, std::int64_t rows, std::int64_t lo, std::int64_t hi) {
    return train::stored_piece{"w", "param", {{row0, 0}, {rows, 3}}, lo, hi, 0, 0};
  };
  x.pieces = {piece(0, 2, 0, 6), piece(2, 2, 0, 6)};
  CHECK_NOTHROW(train::check_piece_coverage(x));
  x.pieces = {piece(0, 2, 0, 4), piece(0, 2, 4, 6), piece(2, 2, 0, 6)};  // a ZeRO cut
  CHECK_NOTHROW(train::check_piece_coverage(x));
  x.pieces = {piece(0, 2, 0, 6), piece(1, 3, 0, 9)};
  CHECK_THROWS_WITH(train::check_piece_coverage(x),
                    Catch::Contains("element 3 of param of 'w' is stored by two pieces"));
  x.pieces = {piece(0, 2, 0, 5), piece(2, 2, 0, 6)};
  CHECK_THROWS_WITH(train::check_piece_coverage(x),
                    Catch::Contains("no stored piece holds element 5 of param of 'w'"));
  x.pieces = {piece(0, 2, 0, 6)};
  CHECK_THROWS_WITH(train::check_piece_coverage(x),
                    Catch::Contains("no stored piece holds element 6 of param of 'w'"));
  // Column boxes (a tensor-parallel row-parallel shard): [0, 2) and [2, 3).
  x.pieces = {{"w", "param", {{0, 0}, {4, 2}}, 0, 8, 0, 0},
              {"w", "param", {{0, 2}, {4, 1}}, 0, 4, 0, 0}};
  CHECK_NOTHROW(train::check_piece_coverage(x));
}

TEST_CASE("consolidating a damaged checkpoint or into an existing folder leaves nothing",
          "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_consolidate_bad", 0)};
  data::token_file f(corpus.path);
  temp_dir orig("bad_orig"), out("bad_out");
  (void)reshard_suite::run_on_threads<P>(mesh(1, 1, 1, 0), f, {}, {}, 1, orig.path);
  fs::create_directories(out.path);
  CHECK_THROWS_WITH(train::consolidate_checkpoint(orig.path, out.path),
                    Catch::Contains("exists: give a new folder"));
  fs::remove(out.path);
  {
    std::fstream file(orig.path / "rank-00000.bin",
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(100);
    const char c = static_cast<char>(file.get());
    file.seekp(100);
    file.put(static_cast<char>(c ^ 0x5a));  // one byte changed
  }
  CHECK_THROWS_WITH(train::consolidate_checkpoint(orig.path, out.path),
                    Catch::Contains("rank-00000.bin' does not match its SHA-256"));
  CHECK_FALSE(fs::exists(out.path));
  for (const auto& e : fs::directory_iterator(out.path.parent_path()))
    CHECK(e.path().filename().string().find(out.path.filename().string() + ".tmp") ==
          std::string::npos);
}

TEST_CASE("a tool's output folder that appears during the write is not replaced, even empty",
          "[train][checkpoint]") {
  temp_dir out("appeared");
  const auto fresh = train::detail::fresh_output(out.path);
  bool filled = false;
  CHECK_THROWS_WITH(
      train::detail::write_new_folder(fresh, "consolidating", "src", out.path,
                                      [&](const fs::path& tmp) {
                                        std::ofstream(tmp / "metadata.json") << "{}";
                                        fs::create_directory(out.path);  // another job
                                        filled = true;
                                      }),
      Catch::Contains("appeared while consolidating: give a new folder"));
  CHECK(filled);
  CHECK(fs::is_empty(out.path));  // the other job's folder, as it left it
  CHECK_FALSE(fs::exists(fresh.second));
  // The rename itself refuses an empty folder (rename(2) would replace it).
  temp_dir from("rename_from");
  fs::create_directories(from.path);
  std::ofstream(from.path / "metadata.json") << "{}";
  CHECK_FALSE(train::detail::rename_no_replace(from.path, out.path));
  CHECK(fs::is_empty(out.path));
  CHECK(fs::exists(from.path / "metadata.json"));
  fs::remove(out.path);
  CHECK(train::detail::rename_no_replace(from.path, out.path));
  CHECK(fs::exists(out.path / "metadata.json"));
  // The way without RENAME_NOREPLACE: a taken name (even an empty folder)
  // is refused and left as it was; a free one is claimed, then renamed onto.
  fs::rename(out.path, from.path);
  fs::create_directory(out.path);
  CHECK_FALSE(train::detail::rename_claiming_name(from.path, out.path));
  CHECK(fs::is_empty(out.path));
  fs::remove(out.path);
  CHECK(train::detail::rename_claiming_name(from.path, out.path));
  CHECK(fs::exists(out.path / "metadata.json"));
  CHECK_FALSE(fs::exists(from.path));
}

}  // namespace test_train_checkpoint_consolidate
