// The optimizer policies beyond AdamW and SGD through the trainer
// (include/tessera/optim/lion.hpp, adafactor.hpp): on a dp x tp x pp mesh
// of thread ranks each computes the single-rank trajectory
// (tests/train/pp_suite.hpp: the loss, the gradient norm and every gradient
// of every step, the parameters after the last, float64 1e-10 relative) on
// the layouts it supports (Lion: all; Adafactor: dp under ZeRO stage 0,
// pp, and ZeRO 1-3 at dp 1; the ZeRO stages that split a tensor refused;
// under tp what holds is tested on its own); a run resumed from a
// checkpoint (folder and single file) continues bit for bit; a run trains
// (the loss falls); the planner counts the optimizer's state as it is
// allocated.
#include <catch2/catch.hpp>

#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/plan/state.hpp>

#include "pp_suite.hpp"
#include "trainer_suite.hpp"

namespace test_train_optimizers {

using namespace tessera;
using comm::local_communicator;
using comm::local_world;
using parallel::schedule_kind;
namespace fs = std::filesystem;

namespace {

using pp_suite::mesh;
using pp_suite::test_options;

// The mesh `l` under sharding S and optimizer O against one rank's run of
// O (pp_suite: five steps, float64).
template <class O, class S>
void check_mesh(const pp_suite::layout& l, double tol) {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("optimizers", 0)};
  data::token_file f(corpus.path);
  const pp_suite::reference ref =
      pp_suite::single_rank<P, O>(f, 5, l.micro_batches * l.dp, l.layers, l.tied);
  INFO(O::name << " " << l.name() << " " << S::name);
  REQUIRE_NOTHROW(local_world::run(
      l.dp * l.tp * l.pp,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        pp_suite::check_mesh<P, S, O>(world, ref, f, l, tol);
      },
      test_options()));
}

// A small run's settings (trainer_suite's tiny model and corpus).
train::train_config small_config(std::int64_t steps) {
  train::train_config c = trainer_suite::config(1);
  c.steps = steps;
  c.global_batch = 4;
  c.micro_batch = 2;
  c.eval_windows = 8;
  return c;
}

}  // namespace

// Lion is element-wise, so every layout that gives the single-rank
// gradients gives its update: the sign of c = beta1 m + (1 - beta1) g
// can differ only where c is within rounding of 0, which none of these
// elements reaches (a flip would move an element by 2 lr = 6e-3, far
// outside the tolerance).
TEST_CASE("lion: dp 2 under zero<0..3> equals one rank's trajectory (float64)",
          "[train][optim][lion]") {
  check_mesh<optim::lion, parallel::zero<0>>(mesh(2, 1, 1), 1e-10);
  check_mesh<optim::lion, parallel::zero<1>>(mesh(2, 1, 1), 1e-10);
  check_mesh<optim::lion, parallel::zero<2>>(mesh(2, 1, 1), 1e-10);
  check_mesh<optim::lion, parallel::zero<3>>(mesh(2, 1, 1), 1e-10);
}

TEST_CASE("lion: pp 2, tp 2 and dp x tp x pp equal one rank's trajectory (float64)",
          "[train][optim][lion][pp][tp]") {
  check_mesh<optim::lion, parallel::zero<0>>(mesh(1, 1, 2), 1e-10);
  check_mesh<optim::lion, parallel::zero<0>>(mesh(1, 1, 2, schedule_kind::zero_bubble_h1), 1e-10);
  check_mesh<optim::lion, parallel::zero<0>>(mesh(1, 2, 1), 1e-10);
  check_mesh<optim::lion, parallel::zero<1>>(mesh(2, 2, 2), 1e-10);
}

TEST_CASE("lion: a run resumed from a checkpoint continues bit for bit", "[train][optim][lion]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("lion_resume", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(6);
  c.lr = 1e-3;
  c.lion = {0.9, 0.99, 0.5};
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_lion_resume_" + std::to_string(::getpid()));
  const fs::path bin = dir.string() + ".bin";
  struct cleanup {
    fs::path a, b;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(a, ec);
      fs::remove(b, ec);
    }
  } clean{dir, bin};
  using P = precision::bf16_mixed;  // master weights and the momentum both checkpointed
  std::vector<double> full;
  {
    train::trainer<P, host, optim::lion> t(trainer_suite::model(), c, f);
    for (int s = 0; s < 6; ++s) {
      full.push_back(t.train_step().loss);
      if (s == 2) {
        t.save_checkpoint(dir);
        t.save_checkpoint(bin);
      }
    }
    CHECK(t.metadata()["optimizer"] == "lion");
    CHECK(t.metadata()["lion"]["weight_decay"] == 0.5);
  }
  for (const fs::path& from : {dir, bin}) {
    INFO("resumed from " << from);
    train::trainer<P, host, optim::lion> r(trainer_suite::model(), c, f);
    r.load_checkpoint(from);
    REQUIRE(r.step() == 3);
    CHECK(r.optimizer().steps_taken() == 3);
    for (int s = 3; s < 6; ++s) CHECK(r.train_step().loss == full[static_cast<std::size_t>(s)]);
  }
  // The folder names the momentum as lion-pytorch does.
  {
    train::checkpoint_reader rd(dir);
    const auto& t = rd.index().tensors.at("blocks.0.attn.wq");
    CHECK(t.roles.count("exp_avg") == 1);
    CHECK(t.roles.count("master") == 1);
    CHECK(t.roles.size() == 3);
  }
  // Another optimizer's checkpoint is refused naming both.
  train::trainer<P> adamw_run(trainer_suite::model(), c, f);
  CHECK_THROWS_WITH(adamw_run.load_checkpoint(dir), Catch::Contains("optimizer") &&
                                                        Catch::Contains("lion") &&
                                                        Catch::Contains("adamw"));
}

TEST_CASE("lion: a small run trains, its loss falling as AdamW's does", "[train][optim][lion]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("lion_trains", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(30);
  c.lr = 3e-3;
  c.lion = {0.9, 0.99, 0.1};
  train::trainer<precision::fp32, host, optim::lion> t(trainer_suite::model(), c, f);
  const double before = t.evaluate();
  double first = 0, last = 0;
  while (t.step() < c.steps) {
    const auto m = t.train_step();
    if (m.step == 1) first = m.loss;
    last = m.loss;
  }
  UNSCOPED_INFO("lion: loss " << first << " -> " << last << ", validation " << before << " -> "
                              << t.evaluate());
  // From ~ln(256) = 5.5 nats: the repeated-words corpus is easy.
  CHECK(last < first - 1.0);
  CHECK(t.evaluate() < before - 1.0);
  CHECK(t.optimizer().steps_taken() == c.steps);
}

TEST_CASE("lion: the planner counts the state the optimizer allocates", "[train][optim][lion]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("lion_plan", 0)};
  data::token_file f(corpus.path);
  const auto mc = trainer_suite::model();
  using P = precision::bf16_mixed;
  const auto d = plan::dtype_sizes::of<P>();
  // One rank: the whole flat buffer, 4 bytes of momentum and 4 of master
  // weights a parameter (bf16 weights: 2 + 4 + 4 + 4 with the gradient).
  {
    train::trainer<P, host, optim::lion> t(mc, small_config(1), f);
    const auto st = plan::plan_state(mc, d, plan::optimizer_spec::lion(), {});
    CHECK(st.optimizer == static_cast<std::uint64_t>(t.model().flat_size()) * 4);
    CHECK(st.master + st.optimizer + st.segment_table == t.optimizer().state_bytes());
  }
  // dp 2 under zero<1>: each rank's shard.
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& w) {
        omp_set_num_threads(1);
        train::train_config c = small_config(1);
        c.dp = 2;
        c.micro_batch = 1;
        train::trainer<P, host, optim::lion, parallel::zero<1>, local_communicator> t(
            mc, c, f, parallel::layout{w});
        plan::sharding sh;
        sh.zero = 1;
        sh.dp = 2;
        sh.rank = w.rank();
        const auto st = plan::plan_state(mc, d, plan::optimizer_spec::lion(), sh);
        zero_suite::check(
            st.master + st.optimizer + st.segment_table == t.optimizer().state_bytes(), "rank ",
            w.rank(), ": planned ", st.master + st.optimizer, " + segments, allocated ",
            t.optimizer().state_bytes());
      },
      test_options()));
  CHECK(plan::optimizer_spec::from_name("lion").moments == 1);
}

// Adafactor's statistics are of whole tensors, which every rank holds
// under ZeRO stage 0 (the same gradients, so the same statistics) and every
// pipeline stage for its own tensors; its sums run in the same order on
// every layout (a row's, a column's, a tensor's over its own rows), so
// only the gradients' rounding differs from one rank's.
TEST_CASE(
    "adafactor: dp 2 (zero<0>), pp 2 and ZeRO 1-3 at dp 1 equal one rank's trajectory "
    "(float64)",
    "[train][optim][adafactor][pp]") {
  check_mesh<optim::adafactor, parallel::zero<0>>(mesh(2, 1, 1), 1e-10);
  check_mesh<optim::adafactor, parallel::zero<0>>(mesh(1, 1, 2), 1e-10);
  pp_suite::layout v2 = mesh(1, 1, 2, schedule_kind::interleaved);
  v2.virtual_stages = 2;  // two chunks a rank: an optimizer each
  check_mesh<optim::adafactor, parallel::zero<0>>(v2, 1e-10);
  check_mesh<optim::adafactor, parallel::zero<0>>(mesh(2, 1, 2), 1e-10);
  check_mesh<optim::adafactor, parallel::zero<1>>(mesh(1, 1, 2), 1e-10);
  check_mesh<optim::adafactor, parallel::zero<3>>(mesh(1, 1, 1), 1e-10);
}

// Tied embeddings under a pipeline: the last stage's copy of the
// embedding gets the summed gradient, so an element-wise optimizer (Lion)
// and one with statistics of whole tensors (Adafactor: the copy's row and
// column statistics are the embedding's) keep it equal to the embedding
// and give one rank's trajectory. A checkpoint stores the statistics once,
// under the embedding's name, and the last stage's copy loads them from
// there: a resume continues bit for bit.
TEST_CASE("lion and adafactor with tied embeddings under a pipeline", "[train][optim][tied][pp]") {
  pp_suite::layout l = mesh(1, 1, 2);
  l.tied = true;
  check_mesh<optim::lion, parallel::zero<0>>(l, 1e-10);
  check_mesh<optim::adafactor, parallel::zero<0>>(l, 1e-10);
  pp_suite::layout l2 = mesh(2, 1, 2);
  l2.tied = true;
  check_mesh<optim::lion, parallel::zero<1>>(l2, 1e-10);

  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("optimizers_tied", 0)};
  data::token_file f(corpus.path);
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_adafactor_tied_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  train::train_config c = pp_suite::config(l, 4);
  c.adafactor.beta1 = 0.9;
  double full[2][4] = {}, resumed[2][4] = {};
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        auto g = comm::make_groups(world, comm::device_mesh(1, 1, 2));
        using trainer_type =
            train::trainer<P, host, optim::adafactor, parallel::zero<0>, local_communicator>;
        const int r = world.rank();
        {
          trainer_type t(pp_suite::model(l.layers, true), c, f,
                         parallel::layout{g.dp, nn::dense_layers{}, g.pp});
          for (int s = 0; s < 4; ++s) {
            full[r][s] = t.train_step().loss;
            if (s == 1) t.save_checkpoint(dir);
          }
        }
        trainer_type t(pp_suite::model(l.layers, true), c, f,
                       parallel::layout{g.dp, nn::dense_layers{}, g.pp});
        t.load_checkpoint(dir);
        for (int s = 2; s < 4; ++s) resumed[r][s] = t.train_step().loss;
      },
      test_options()));
  {
    train::checkpoint_reader rd(dir);
    CHECK(rd.index().tensors.count("embedding.exp_avg_sq_row") == 1);
    CHECK(rd.index().tensors.count("lm_head.exp_avg_sq_row") == 0);
  }
  fs::remove_all(dir);
  for (int r = 0; r < 2; ++r)
    for (int s = 2; s < 4; ++s) {
      CHECK(full[r][s] > 0);  // every stage reports the step's loss
      CHECK(resumed[r][s] == full[r][s]);
    }
}

TEST_CASE("adafactor: a ZeRO stage that splits a tensor is refused on every rank, naming it",
          "[train][optim][adafactor][errors]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("adafactor_zero", 0)};
  data::token_file f(corpus.path);
  std::string msg[2];
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& w) {
        omp_set_num_threads(1);
        train::train_config c = small_config(1);
        c.dp = 2;
        c.micro_batch = 1;
        try {
          train::trainer<precision::fp64, host, optim::adafactor, parallel::zero<1>,
                         local_communicator>
              t(trainer_suite::model(), c, f, parallel::layout{w});
        } catch (const config_error& e) {
          msg[w.rank()] = e.what();
        }
      },
      test_options()));
  for (const std::string& m : msg) {
    INFO(m);
    CHECK_THAT(m, Catch::Contains("optimizer adafactor keeps statistics of whole tensors") &&
                      Catch::Contains("zero1 over dp=2 splits '") &&
                      Catch::Contains("use ZeRO stage 0"));
  }
  CHECK(msg[0] == msg[1]);
  CHECK_THROWS_WITH(
      plan::plan_state(trainer_suite::model(), plan::dtype_sizes::of<precision::fp32>(),
                       plan::optimizer_spec::adafactor(), {2, 4}),
      Catch::Contains("ZeRO stage 2 over dp=4 would split"));
}

// Under tp each rank's shard of a split matrix is a matrix of its own
// (optim/adafactor.hpp). What holds after one step from the same weights
// (float64, no clipping): every rank's update is Adafactor over its own
// layout's tensors applied to its own gradients (which equal one rank's
// slices, pp_suite); so the vectors (norm gains, whole on every rank) and,
// of a row-split matrix (wq), its row statistics equal one rank's, of a
// column-split matrix (wo) its column statistics; and what does not: the
// other statistics and the split matrices' updates differ from one rank's.
TEST_CASE("adafactor under tp 2: each shard updates as a matrix of its own",
          "[train][optim][adafactor][tp]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("adafactor_tp", 0)};
  data::token_file f(corpus.path);
  pp_suite::layout one_l = mesh(1, 1, 1), tp_l = mesh(1, 2, 1);
  train::train_config c1 = pp_suite::config(one_l, 1), c2 = pp_suite::config(tp_l, 1);
  c1.grad_clip = c2.grad_clip = 0;
  c1.warmup = c2.warmup = 0;
  c1.adafactor.weight_decay = c2.adafactor.weight_decay = 0.1;
  train::trainer<P, host, optim::adafactor> one(pp_suite::model(), c1, f);
  (void)one.train_step();
  const nn::param_layout& L1 = one.model().layout();
  auto single = [&](const std::string& name) {  // one rank's tensor after the step
    const auto& e = L1.at(name);
    return std::vector<double>(one.model().params() + e.offset,
                               one.model().params() + e.offset + e.numel);
  };
  auto stats_of = [](auto& opt, const nn::param_entry& e) { return opt.statistics_of(e.offset); };
  const auto q1 = stats_of(one.optimizer(), L1.at("blocks.0.attn.wq"));
  const auto o1 = stats_of(one.optimizer(), L1.at("blocks.0.attn.wo"));
  std::vector<std::string> failures;
  std::mutex mu;
  auto fail = [&](std::string m) {
    std::lock_guard<std::mutex> lock(mu);
    failures.push_back(std::move(m));
  };
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        using layers = nn::tensor_parallel_layers<local_communicator>;
        const comm::device_mesh dm(1, 2, 1);
        auto g = comm::make_groups(world, dm);
        train::trainer<P, host, optim::adafactor, parallel::zero<0>, local_communicator, layers> tr(
            pp_suite::model(), c2, f, parallel::layout{g.dp, layers{&g.tp}, g.pp});
        auto& m = tr.model();
        const std::int64_t n = m.flat_size();
        const std::vector<double> p0(m.params(), m.params() + n);
        const double lr = c2.schedule()(0);
        (void)tr.train_step();
        // Adafactor over this rank's own layout, from its own weights and gradients.
        const kernels::host_context ctx{};
        optim::adafactor_optimizer<double, double, double, kernels::host_context> own(
            c2.adafactor, n, m.param_ranges(), ctx);
        std::vector<double> want = p0;
        own.step(want.data(), m.grads(), lr);
        const int r = world.rank();
        for (const nn::param_entry& e : m.layout().entries()) {
          double worst = 0, scale = 0, from_one = 0;
          const std::vector<double> s1 = single(e.name);
          for (std::int64_t j = 0; j < e.numel; ++j) {
            const double got = m.params()[e.offset + j],
                         w = want[static_cast<std::size_t>(e.offset + j)];
            worst = std::max(worst, std::fabs(got - w));
            scale = std::max(scale, std::fabs(w));
            if (e.full_index(j) < e.full.numel())
              from_one = std::max(from_one,
                                  std::fabs(got - s1[static_cast<std::size_t>(e.full_index(j))]));
          }
          if (!(worst <= 1e-12 * scale))
            fail(tessera::detail::str("rank ", r, " ", e.name,
                                      ": differs from Adafactor of its own shard by ", worst));
          const bool whole = e.shard_dim < 0;
          if (whole && !(from_one <= 1e-12 * scale))
            fail(tessera::detail::str("rank ", r, " ", e.name,
                                      " (whole): differs from one rank's by ", from_one));
          // (Not the embedding: every byte of the corpus is below 128, so
          // its second vocabulary shard has no gradient, and the first
          // shard's statistics are those of the whole matrix: R C / sum(R)
          // loses nothing to the other shard's zero rows.)
          if (!whole && e.name != "embedding" && !(from_one > 1e-9 * scale))
            fail(tessera::detail::str("rank ", r, " ", e.name,
                                      " (split): equals one rank's update (", from_one, ")"));
        }
        // The statistics the shard shares with the whole matrix, and those it does not.
        auto compare = [&](const std::string& name, const auto& s1, int same_along) {
          const nn::param_entry& e = m.layout().at(name);
          const auto st = tr.optimizer().statistics_of(e.offset - m.flat_begin());
          for (int a = 0; a < 2; ++a) {
            const auto& mine = st[static_cast<std::size_t>(a)];
            const auto& whole = s1[static_cast<std::size_t>(a)];
            const std::int64_t off = a == same_along ? e.shard_begin : 0;
            double worst = 0;
            for (std::int64_t j = 0; j < mine.count; ++j)
              worst = std::max(worst, std::fabs(mine.data[j] - whole.data[off + j]) /
                                          std::fabs(whole.data[off + j]));
            if (a == same_along && !(worst <= 1e-12))
              fail(tessera::detail::str("rank ", r, " ", name, " ", mine.role,
                                        " differs from one rank's by ", worst));
            if (a != same_along && !(worst > 1e-9))
              fail(tessera::detail::str("rank ", r, " ", name, " ", mine.role,
                                        " equals one rank's"));
          }
        };
        compare("blocks.0.attn.wq", q1, 0);  // row-split: whole rows
        compare("blocks.0.attn.wo", o1, 1);  // column-split: whole columns
      },
      test_options()));
  for (const auto& m : failures) UNSCOPED_INFO(m);
  CHECK(failures.empty());
}

TEST_CASE("adafactor: a run resumed from a checkpoint continues bit for bit",
          "[train][optim][adafactor]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("adafactor_resume", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(6);
  c.lr = 1e-2;
  c.adafactor.beta1 = 0.9;
  c.adafactor.weight_decay = 0.1;
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_adafactor_resume_" + std::to_string(::getpid()));
  const fs::path bin = dir.string() + ".bin";
  struct cleanup {
    fs::path a, b;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(a, ec);
      fs::remove(b, ec);
    }
  } clean{dir, bin};
  using P = precision::bf16_mixed;  // master weights, first moment and statistics checkpointed
  std::vector<double> full;
  {
    train::trainer<P, host, optim::adafactor> t(trainer_suite::model(), c, f);
    for (int s = 0; s < 6; ++s) {
      full.push_back(t.train_step().loss);
      if (s == 2) {
        t.save_checkpoint(dir);
        t.save_checkpoint(bin);
      }
    }
    CHECK(t.metadata()["optimizer"] == "adafactor");
    CHECK(t.metadata()["adafactor"]["beta1"] == 0.9);
  }
  for (const fs::path& from : {dir, bin}) {
    INFO("resumed from " << from);
    train::trainer<P, host, optim::adafactor> r(trainer_suite::model(), c, f);
    r.load_checkpoint(from);
    REQUIRE(r.step() == 3);
    for (int s = 3; s < 6; ++s) CHECK(r.train_step().loss == full[static_cast<std::size_t>(s)]);
  }
  // The folder: a matrix's row and column statistics as tensors of their
  // own (one row a tp shard), a vector's as a role of the vector.
  {
    train::checkpoint_reader rd(dir);
    const auto& tensors = rd.index().tensors;
    const auto layout = nn::make_llama_layout(trainer_suite::model());
    const auto& wq = layout.at("blocks.0.attn.wq");
    CHECK(tensors.at("blocks.0.attn.wq").roles.count("exp_avg") == 1);
    CHECK(tensors.at("blocks.0.attn.wq").roles.count("exp_avg_sq") == 0);
    CHECK(tensors.at("blocks.0.attn.wq.exp_avg_sq_row").shape ==
          std::vector<std::int64_t>{1, wq.shp[0]});
    CHECK(tensors.at("blocks.0.attn.wq.exp_avg_sq_col").shape ==
          std::vector<std::int64_t>{1, wq.shp[1]});
    CHECK(tensors.at("blocks.0.attn_norm").roles.count("exp_avg_sq") == 1);
    CHECK(tensors.count("blocks.0.attn_norm.exp_avg_sq_row") == 0);
  }
  // Without the first moment the state is the statistics alone.
  c.adafactor.beta1 = 0;
  train::trainer<P, host, optim::adafactor> u(trainer_suite::model(), c, f);
  CHECK_THROWS_WITH(u.load_checkpoint(dir), Catch::Contains("beta1"));
  // At tp 2 the split matrices' statistics would be per shard: refused on
  // both ranks, naming the way on; the layout-free rest would load.
  c.adafactor.beta1 = 0.9;
  std::string msg[2];
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        using layers = nn::tensor_parallel_layers<local_communicator>;
        const comm::device_mesh dm(1, 2, 1);
        auto g = comm::make_groups(world, dm);
        train::train_config c2 = c;
        c2.tp = 2;
        train::trainer<P, host, optim::adafactor, parallel::zero<0>, local_communicator, layers> t(
            trainer_suite::model(), c2, f, parallel::layout{g.dp, layers{&g.tp}, g.pp});
        try {
          t.load_checkpoint(dir);
        } catch (const std::exception& e) {
          msg[world.rank()] = e.what();
        }
      },
      test_options()));
  for (const std::string& m : msg) {
    INFO(m);
    CHECK_THAT(m, Catch::Contains("for 1 tp shard(s) of its matrix; this run splits it into 2") &&
                      Catch::Contains("resume at the tensor-parallel degree that wrote it"));
  }
}

TEST_CASE("adafactor: a small run trains", "[train][optim][adafactor]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("adafactor_trains", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(30);
  c.lr = 1e-2;
  train::trainer<precision::fp32, host, optim::adafactor> t(trainer_suite::model(), c, f);
  const double before = t.evaluate();
  double first = 0, last = 0;
  while (t.step() < c.steps) {
    const auto m = t.train_step();
    if (m.step == 1) first = m.loss;
    last = m.loss;
  }
  UNSCOPED_INFO("adafactor: loss " << first << " -> " << last << ", validation " << before << " -> "
                                   << t.evaluate());
  CHECK(last < first - 1.0);
  CHECK(t.evaluate() < before - 1.0);
}

TEST_CASE("adafactor: the planner counts the state the optimizer allocates, per tensor",
          "[train][optim][adafactor]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("adafactor_plan", 0)};
  data::token_file f(corpus.path);
  const auto mc = trainer_suite::model();
  using P = precision::bf16_mixed;
  const auto d = plan::dtype_sizes::of<P>();
  for (const double beta1 : {0.0, 0.9}) {
    INFO("beta1 " << beta1);
    train::train_config c = small_config(1);
    c.adafactor.beta1 = beta1;
    train::trainer<P, host, optim::adafactor> t(mc, c, f);
    const auto st = plan::plan_state(mc, d, plan::optimizer_spec::adafactor(beta1 > 0), {});
    CHECK(st.master + st.optimizer + st.segment_table == t.optimizer().state_bytes());
    // Far below AdamW's two moments: the statistics are O(rows + cols) a matrix.
    const auto adamw = plan::plan_state(mc, d, plan::optimizer_spec::adamw(), {});
    CHECK(st.optimizer < adamw.optimizer / (beta1 > 0 ? 1 : 2));
  }
  // Under tp 2, each rank's shards.
  REQUIRE_NOTHROW(local_world::run(
      2,
      [&](local_communicator& world) {
        omp_set_num_threads(1);
        using layers = nn::tensor_parallel_layers<local_communicator>;
        const comm::device_mesh dm(1, 2, 1);
        auto g = comm::make_groups(world, dm);
        train::train_config c = small_config(1);
        c.tp = 2;
        train::trainer<P, host, optim::adafactor, parallel::zero<0>, local_communicator, layers> t(
            mc, c, f, parallel::layout{g.dp, layers{&g.tp}, g.pp});
        plan::sharding sh;
        sh.tp = 2;
        sh.tp_rank = world.rank();
        const auto st = plan::plan_state(mc, d, plan::optimizer_spec::adafactor(), sh);
        zero_suite::check(
            st.master + st.optimizer + st.segment_table == t.optimizer().state_bytes(), "tp rank ",
            world.rank(), ": planned ", st.master + st.optimizer + st.segment_table, ", allocated ",
            t.optimizer().state_bytes());
      },
      test_options()));
}

}  // namespace test_train_optimizers
