// A layout-free checkpoint of a trainer's state moves between layouts
// (include/tessera/train/checkpoint_shards.hpp with checkpoint_io.hpp):
// thread ranks of trainer<bf16_mixed, host, adamw, zero<k>> on (dp, tp)
// meshes write their shares of the parameters, master weights and AdamW
// moments (every element once), rank 0 writes the metadata last, and
// another mesh loads them.
// Oracles: the parameters a mesh saves before any step equal the
// single-rank trainer's initialisation, tensor by tensor, and the master
// weights those parameters widened; after two steps on mesh A, the state
// saved by mesh B after loading A's checkpoint, and by mesh A again after
// loading B's, equals A's, every element of every role bit for bit.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/train/checkpoint_shards.hpp>

#include "trainer_suite.hpp"

namespace test_train_checkpoint_shards {

using namespace tessera;
namespace fs = std::filesystem;
using comm::local_communicator;
using P = precision::bf16_mixed;

namespace {

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() /
           ("tessera_ckpt_shards_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct mesh_spec {
  int dp, tp, zero;
  std::string describe() const {
    return "dp " + std::to_string(dp) + " tp " + std::to_string(tp) + " zero<" +
           std::to_string(zero) + ">";
  }
};

// On every rank of `m`: a trainer; `steps` train steps; if `from` is not
// empty, its checkpoint loaded first; its checkpoint saved to `to`.
template <class S>
void run_mesh(const mesh_spec& m, const fs::path& corpus, const fs::path& from, const fs::path& to,
              int steps) {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  comm::local_world::run(
      m.dp * m.tp,
      [&](local_communicator& world) {
        using layers = nn::tensor_parallel_layers<local_communicator>;
        const comm::device_mesh mesh(m.dp, m.tp, 1);
        auto g = comm::make_groups(world, mesh);
        data::token_file f(corpus);
        train::train_config cfg = trainer_suite::config(m.dp);
        cfg.tp = m.tp;
        cfg.global_batch = 8;
        train::trainer<P, host, optim::adamw, S, local_communicator, layers> tr(
            trainer_suite::model(), cfg, f, parallel::layout{g.dp, layers{&g.tp}});
        if (!from.empty()) {
          train::checkpoint_reader rd(from);
          for (int c = 0; c < tr.chunks(); ++c)
            train::load_state(rd, tr.engine(c), tr.tp_rank(),
                              rd.index().run.at("optimizer_steps").get<std::int64_t>());
        }
        for (int s = 0; s < steps; ++s) (void)tr.train_step();
        train::rank_file rf;
        std::map<std::string, train::stored_tensor> tensors;
        for (int c = 0; c < tr.chunks(); ++c)
          train::add_state_pieces(rf, tensors, tr.engine(c), tr.tp_rank());
        train::write_rank_part(to, world.rank(), rf, tensors);
        world.barrier();
        if (world.rank() == 0)
          (void)train::merge_rank_parts(to, world.size(),
                                        {{"optimizer_steps", tr.optimizer().steps_taken()}});
        world.barrier();
      },
      o);
}
void run_any(const mesh_spec& m, const fs::path& corpus, const fs::path& from, const fs::path& to,
             int steps) {
  INFO(m.describe());
  switch (m.zero) {
    case 0:
      return run_mesh<parallel::zero<0>>(m, corpus, from, to, steps);
    case 1:
      return run_mesh<parallel::zero<1>>(m, corpus, from, to, steps);
    case 2:
      return run_mesh<parallel::zero<2>>(m, corpus, from, to, steps);
    default:
      return run_mesh<parallel::zero<3>>(m, corpus, from, to, steps);
  }
}

// Every role of every tensor, whole, as bytes.
std::map<std::string, std::vector<char>> contents(const fs::path& dir) {
  train::checkpoint_reader rd(dir);
  std::map<std::string, std::vector<char>> out;
  for (const auto& [name, t] : rd.index().tensors)
    for (const auto& [role, dtype] : t.roles) {
      train::index_box box{std::vector<std::int64_t>(t.shape.size(), 0), t.shape};
      std::vector<char> bytes(static_cast<std::size_t>(box.numel()) * train::dtype_bytes_of(dtype));
      rd.read(name, role, box, 0, box.numel(), bytes.data());
      out[name + " " + role] = std::move(bytes);
    }
  return out;
}

}  // namespace

TEST_CASE("a checkpoint saved before any step holds the single-rank initialisation",
          "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_init", 0)};
  data::token_file f(corpus.path);
  train::train_config cfg = trainer_suite::config(1);
  cfg.global_batch = 8;
  train::trainer<P> one(trainer_suite::model(), cfg, f);
  for (const mesh_spec& m : {mesh_spec{2, 2, 3}, mesh_spec{1, 2, 1}, mesh_spec{4, 1, 2}}) {
    INFO(m.describe());
    temp_dir d("init");
    run_any(m, corpus.path, {}, d.path, 0);
    const auto got = contents(d.path);
    std::size_t tensors = 0;
    for (const auto& e : one.model().layout().entries()) {
      const auto& param = got.at(e.name + " param");
      const auto& master = got.at(e.name + " master");
      REQUIRE(param.size() == static_cast<std::size_t>(e.numel) * sizeof(bf16));
      CHECK(std::memcmp(param.data(), one.model().params() + e.offset, param.size()) == 0);
      std::vector<float> widened(static_cast<std::size_t>(e.numel));
      for (std::int64_t j = 0; j < e.numel; ++j)
        widened[static_cast<std::size_t>(j)] =
            static_cast<float>(one.model().params()[e.offset + j]);
      CHECK(std::memcmp(master.data(), widened.data(), master.size()) == 0);
      ++tensors;
    }
    // param, master, exp_avg, exp_avg_sq of every tensor, nothing else.
    CHECK(got.size() == 4 * tensors);
  }
}

TEST_CASE("a checkpoint moves between (dp, tp, zero) layouts and back bit for bit",
          "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_move", 0)};
  const mesh_spec a{2, 1, 1};
  temp_dir da("a");
  run_any(a, corpus.path, {}, da.path, 2);
  const auto saved = contents(da.path);
  for (const mesh_spec& b : {mesh_spec{1, 2, 0}, mesh_spec{4, 1, 3}, mesh_spec{2, 2, 2},
                             mesh_spec{1, 1, 0}, mesh_spec{1, 4, 0}}) {
    INFO("A " << a.describe() << ", B " << b.describe());
    temp_dir db("b"), da2("a2");
    run_any(b, corpus.path, da.path, db.path, 0);
    CHECK(contents(db.path) == saved);
    run_any(a, corpus.path, db.path, da2.path, 0);
    CHECK(contents(da2.path) == saved);
    CHECK(train::checkpoint_reader(da2.path).index().run.at("optimizer_steps") == 2);
  }
}

}  // namespace test_train_checkpoint_shards
