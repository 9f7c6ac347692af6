// Checkpoint folders move between layouts (include/tessera/train/
// checkpoint_folder.hpp through trainer::save_checkpoint and
// load_checkpoint): the pairs of tests/train/reshard_suite.hpp on thread
// ranks (tests/mpi/checkpoint.cpp runs them on MPI processes), each saved
// at one (dp, tp, pp, schedule, ZeRO stage) mesh and loaded at another:
// the state loaded equals the state saved bit for bit, and three more
// steps equal the uninterrupted single-rank run within 1e-10. Then: a
// folder without its metadata is refused, and another global batch is
// refused naming both.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include <tessera/comm/local.hpp>

#include "reshard_suite.hpp"

namespace test_train_checkpoint_folder {

using namespace tessera;
namespace fs = std::filesystem;
using comm::local_communicator;
using reshard_suite::G;
using reshard_suite::steps;

namespace {

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() /
           ("tessera_ckpt_folder_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE(
    "a checkpoint folder saved at one layout loads bit for bit at another and continues "
    "as one rank would",
    "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_folder", 0)};
  data::token_file f(corpus.path);
  const auto ref = reshard_suite::single_rank(f);
  comm::comm_options o;
  // Up to 16 ranks on two cores, those outside a mesh at a barrier.
  o.timeout = std::chrono::seconds(150);
  // (Named pairs, not structured bindings: clang before 16 cannot capture those.)
  for (const auto& pair : reshard_suite::matrix()) {
    const reshard_suite::mesh_run &a = pair.first, &b = pair.second;
    INFO("saved at " << a.name() << ", loaded at " << b.name());
    REQUIRE_NOTHROW(comm::local_world::run(
        std::max(a.ranks(), b.ranks()),
        [&](local_communicator& world) { reshard_suite::check_pair(world, a, b, f, ref); }, o));
  }
}

TEST_CASE("bf16_mixed master weights and moments load bit for bit at another layout",
          "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_folder_bf16", 0)};
  data::token_file f(corpus.path);
  comm::comm_options o;
  o.timeout = std::chrono::seconds(150);
  for (const auto& pair : reshard_suite::master_pairs()) {
    const reshard_suite::mesh_run &a = pair.first, &b = pair.second;
    INFO("saved at " << a.name() << ", loaded at " << b.name());
    REQUIRE_NOTHROW(comm::local_world::run(
        std::max(a.ranks(), b.ranks()),
        [&](local_communicator& world) {
          reshard_suite::check_resave<precision::bf16_mixed>(world, a, b, f);
        },
        o));
  }
}

TEST_CASE("a checkpoint folder without metadata, or of another global batch, is refused",
          "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_folder_refuse", 0)};
  data::token_file f(corpus.path);
  temp_dir d("refuse");
  train::train_config cfg = pp_suite::config(reshard_suite::mesh(1, 1, 1, 0).l, steps);
  {
    train::trainer<reshard_suite::P> tr(reshard_suite::model(), cfg, f);
    (void)tr.train_step();
    tr.save_checkpoint(d.path);
  }
  cfg.global_batch = 2 * G;
  {
    train::trainer<reshard_suite::P> tr(reshard_suite::model(), cfg, f);
    CHECK_THROWS_WITH(tr.load_checkpoint(d.path),
                      Catch::Contains("global_batch=8 in the checkpoint, 16 in this run"));
  }
  fs::remove(d.path / "metadata.json");
  cfg.global_batch = G;
  train::trainer<reshard_suite::P> tr(reshard_suite::model(), cfg, f);
  CHECK_THROWS_WITH(tr.load_checkpoint(d.path), Catch::Contains("has no metadata.json"));
}

}  // namespace test_train_checkpoint_folder
