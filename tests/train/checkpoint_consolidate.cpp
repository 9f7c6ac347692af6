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

#include "pp_suite.hpp"

namespace test_train_checkpoint_consolidate {

using namespace tessera;
namespace fs = std::filesystem;
using comm::local_communicator;
using P = precision::bf16_mixed;

namespace {

constexpr std::int64_t G = 8, steps = 4, saved_at = 2, layers = 4;

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

struct mesh_run {
  pp_suite::layout l;
  int zero = 0;
};
mesh_run mesh(int dp, int tp, int zero) {
  mesh_run m;
  m.l.dp = dp;
  m.l.tp = tp;
  m.l.micro_batches = G / dp;
  m.l.layers = layers;
  m.zero = zero;
  return m;
}

// World rank 0's loss and gradient norm of each step trained.
struct trajectory {
  std::vector<double> loss, norm;
};

// On every rank of `m`: a trainer; loads `from` (if set) and saves to
// `resaved` at once (if set); trains until `until`; saves to `to` (if set).
template <class S>
trajectory run_mesh(const mesh_run& m, const data::token_file& f, const fs::path& from,
                    const fs::path& resaved, std::int64_t until, const fs::path& to) {
  trajectory out;
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  comm::local_world::run(
      m.l.dp * m.l.tp,
      [&](local_communicator& world) {
        using layers_t = nn::tensor_parallel_layers<local_communicator>;
        auto g = comm::make_groups(world, comm::device_mesh(m.l.dp, m.l.tp, 1));
        train::trainer<P, host, optim::adamw, S, local_communicator, layers_t> tr(
            pp_suite::model(layers), pp_suite::config(m.l, steps), f,
            parallel::layout{g.dp, layers_t{&g.tp}, g.pp});
        if (!from.empty()) tr.load_checkpoint(from);
        if (!resaved.empty()) tr.save_checkpoint(resaved);
        while (tr.step() < until) {
          const auto s = tr.train_step();
          if (world.rank() == 0) {
            out.loss.push_back(s.loss);
            out.norm.push_back(s.grad_norm);
          }
        }
        if (!to.empty()) tr.save_checkpoint(to);
      },
      o);
  return out;
}
trajectory run_any(const mesh_run& m, const data::token_file& f, const fs::path& from,
                   const fs::path& resaved, std::int64_t until, const fs::path& to) {
  return m.zero == 3 ? run_mesh<parallel::zero<3>>(m, f, from, resaved, until, to)
                     : run_mesh<parallel::zero<0>>(m, f, from, resaved, until, to);
}

// Every role of every tensor of checkpoints `a` and `b`, read whole, is
// the same bytes; the step and optimizer step count are the same.
void require_same_state(const fs::path& a, const fs::path& b) {
  train::checkpoint_reader ra(a), rb(b);
  REQUIRE(ra.index().tensors.size() == rb.index().tensors.size());
  CHECK(ra.index().run.at("step") == rb.index().run.at("step"));
  CHECK(ra.index().run.at("optimizer_steps") == rb.index().run.at("optimizer_steps"));
  int compared = 0;
  for (const auto& [name, t] : ra.index().tensors) {
    REQUIRE(rb.index().tensors.count(name) == 1);
    CHECK(rb.index().tensors.at(name).shape == t.shape);
    CHECK(rb.index().tensors.at(name).roles == t.roles);
    const train::index_box box{std::vector<std::int64_t>(t.shape.size(), 0), t.shape};
    for (const auto& [role, dtype] : t.roles) {
      INFO(role << " of " << name);
      const std::size_t bytes =
          static_cast<std::size_t>(box.numel()) * train::dtype_bytes_of(dtype);
      std::vector<char> x(bytes), y(bytes);
      ra.read(name, role, box, 0, box.numel(), x.data());
      rb.read(name, role, box, 0, box.numel(), y.data());
      CHECK(std::memcmp(x.data(), y.data(), bytes) == 0);
      ++compared;
    }
  }
  // param, master, exp_avg, exp_avg_sq of every tensor.
  CHECK(compared == 4 * static_cast<int>(ra.index().tensors.size()));
}

}  // namespace

TEST_CASE("a consolidated checkpoint loads as the original at any layout", "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_consolidate", 0)};
  data::token_file f(corpus.path);
  for (const mesh_run& src : {mesh(2, 1, 3), mesh(1, 2, 0)}) {
    INFO("saved at " << src.l.name() << " zero<" << src.zero << ">");
    temp_dir orig("orig"), cons("cons");
    (void)run_any(src, f, {}, {}, saved_at, orig.path);
    train::consolidate_checkpoint(orig.path, cons.path);
    {
      train::checkpoint_reader rd(cons.path);
      CHECK(rd.index().files.size() == 1);
      CHECK(rd.index().pieces.size() == 4 * rd.index().tensors.size());  // each whole
    }
    require_same_state(orig.path, cons.path);
    for (const mesh_run& dst : {mesh(1, 1, 0), src}) {
      INFO("loaded at " << dst.l.name() << " zero<" << dst.zero << ">");
      temp_dir ra("resaved_orig"), rb("resaved_cons");
      const trajectory a = run_any(dst, f, orig.path, ra.path, steps, {});
      const trajectory b = run_any(dst, f, cons.path, rb.path, steps, {});
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
  (void)run_any(mesh(1, 1, 0), f, {}, {}, 1, orig.path);
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
