// The optimizer policies beyond AdamW and SGD through the trainer
// (include/tessera/optim/lion.hpp, adafactor.hpp): on a dp x tp x pp mesh
// of thread ranks each computes the single-rank trajectory
// (tests/train/pp_suite.hpp: the loss, the gradient norm and every gradient
// of every step, the parameters after the last, float64 1e-10 relative) on
// every layout: dp under ZeRO 0-3 (Adafactor also with buckets small enough
// that the chunks split tensors between the ranks, checked), tp 2 and 4
// (key/value heads replicated), pp, and their products; a run resumed from
// a checkpoint (folder and single file) continues bit for bit, and an
// Adafactor checkpoint resumes at another tp, dp and ZeRO stage; a run
// trains (the loss falls); the planner counts the optimizer's state as it
// is allocated.
#include <catch2/catch.hpp>

#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
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
// these layouts (a row's, a column's, a tensor's over its own rows), so
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

// Where a tensor's parts are on several ranks (tp shards, ZeRO pieces),
// each rank sums g^2 + eps1 over its rows and columns and p^2, u^2 over its
// elements, and the sums are gathered and added in rank order
// (optim/adafactor.hpp): the statistics, lr and clip divisor are the whole
// tensor's, the sums in another order than one rank's (float64 rounding,
// 1e-16 a sum), so the trajectory is one rank's to 1e-10. The default
// buckets put each tensor in one rank's chunk on this model; the split
// cases below cut them.
TEST_CASE("adafactor: dp 2 under zero<1..3>, tp 2 and 4, dp x tp x pp equal one rank (float64)",
          "[train][optim][adafactor][zero][tp]") {
  check_mesh<optim::adafactor, parallel::zero<1>>(mesh(2, 1, 1), 1e-10);
  check_mesh<optim::adafactor, parallel::zero<2>>(mesh(2, 1, 1), 1e-10);
  check_mesh<optim::adafactor, parallel::zero<3>>(mesh(2, 1, 1), 1e-10);
  check_mesh<optim::adafactor, parallel::zero<0>>(mesh(1, 2, 1), 1e-10);
  // tp 4 over nkv 2: each key/value shard on two ranks (replica 1 adds nothing).
  check_mesh<optim::adafactor, parallel::zero<0>>(mesh(1, 4, 1), 1e-10);
  check_mesh<optim::adafactor, parallel::zero<1>>(mesh(2, 1, 2), 1e-10);
  check_mesh<optim::adafactor, parallel::zero<1>>(mesh(2, 2, 1), 1e-10);
  check_mesh<optim::adafactor, parallel::zero<0>>(mesh(2, 2, 2), 1e-10);
  check_mesh<optim::adafactor, parallel::zero<1>>(mesh(2, 2, 2), 1e-10);
  check_mesh<optim::adafactor, parallel::zero<3>>(mesh(2, 2, 2), 1e-10);
}

// Buckets of 2 kB put a chunk boundary inside every block's bucket, so the
// ZeRO stages split tensors (matrices and norm gains) between the dp ranks
// (checked: a piece on each rank); their sums are then added over dp (and
// over tp at tp 2). Four steps with clipping, decay and the first moment,
// one rank's losses and parameters at 1e-10 (float64). The worst relative
// loss and absolute parameter differences are reported.
template <class S>
void adafactor_split_case(int tp, std::int64_t vocab = 256) {
  using P = precision::fp64;
  nn::llama_config model = trainer_suite::model();
  model.vocab = vocab;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("adafactor_split", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(4);
  c.lr = 1e-2;
  c.adafactor.beta1 = 0.9;
  c.adafactor.weight_decay = 0.1;
  c.adafactor.scale_parameter = true;
  std::vector<double> one_loss, one_params;
  {
    train::trainer<P, host, optim::adafactor> t(model, c, f);
    for (int s = 0; s < 4; ++s) one_loss.push_back(t.train_step().loss);
    one_params.assign(t.model().params(), t.model().params() + t.model().flat_size());
  }
  const nn::param_layout one_layout = nn::make_llama_layout(model);
  const int world = 2 * tp;
  std::vector<std::string> failures(static_cast<std::size_t>(world));
  std::vector<int> pieces(static_cast<std::size_t>(world), 0);
  std::vector<double> worst_loss(static_cast<std::size_t>(world), 0),
      worst_param(static_cast<std::size_t>(world), 0);
  REQUIRE_NOTHROW(local_world::run(
      world,
      [&](local_communicator& w) {
        omp_set_num_threads(1);
        using layers = nn::tensor_parallel_layers<local_communicator>;
        auto g = comm::make_groups(w, comm::device_mesh(2, tp, 1));
        train::train_config c2 = c;
        c2.dp = 2;
        c2.tp = tp;
        c2.micro_batch = 1;
        parallel::data_parallel_options dpo;
        dpo.bucket_bytes = 2000;
        train::trainer<P, host, optim::adafactor, S, local_communicator, layers> t(
            model, c2, f, parallel::layout{g.dp, layers{&g.tp}, g.pp}, dpo);
        const auto r = static_cast<std::size_t>(w.rank());
        for (std::size_t k = 0; k < t.optimizer().tensors().size(); ++k)
          pieces[r] += t.optimizer().piece(k) ? 1 : 0;
        std::ostringstream o;
        for (int s = 0; s < 4; ++s) {
          const double l = t.train_step().loss, want = one_loss[static_cast<std::size_t>(s)];
          worst_loss[r] = std::max(worst_loss[r], std::abs(l - want) / want);
          if (!(std::abs(l - want) <= 1e-10 * want))
            o << "step " << s << ": loss " << l << " vs " << want << "; ";
        }
        auto& m = t.model();
        std::vector<double> full(static_cast<std::size_t>(m.flat_size()));
        t.engine(0).full_params(full.data());
        for (const nn::param_entry& e : m.layout().entries()) {
          const nn::param_entry& e1 = one_layout.at(e.name);
          for (std::int64_t j = 0; j < e.numel; ++j) {
            if (e.full_index(j) >= e.full.numel()) continue;  // vocabulary padding
            worst_param[r] = std::max(
                worst_param[r],
                std::abs(full[static_cast<std::size_t>(e.offset - m.flat_begin() + j)] -
                         one_params[static_cast<std::size_t>(e1.offset + e.full_index(j))]));
          }
        }
        if (!(worst_param[r] <= 1e-10)) o << "parameters differ by " << worst_param[r];
        failures[r] = o.str();
      },
      test_options()));
  for (int r = 0; r < world; ++r) {
    const auto u = static_cast<std::size_t>(r);
    INFO(S::name << " tp " << tp << " V " << vocab << " rank " << r << ": worst loss "
                 << worst_loss[u] << " (relative), parameter " << worst_param[u]);
    CHECK(pieces[u] > 0);
    CHECK(failures[u].empty());
    CHECK(worst_loss[u] <= 1e-10);
  }
}

TEST_CASE("adafactor: ZeRO 1-3 over dp 2 with tensors split between the ranks equal one rank",
          "[train][optim][adafactor][zero]") {
  adafactor_split_case<parallel::zero<1>>(1);
  adafactor_split_case<parallel::zero<2>>(1);
  adafactor_split_case<parallel::zero<3>>(1);
  adafactor_split_case<parallel::zero<1>>(2);  // pieces of tp shards: summed over dp, then tp
  // V 258 over tp 4 (65 rows a shard): the embedding's and head's last shard ends in two
  // padding rows, left out of every sum; key/value shards on two ranks each.
  adafactor_split_case<parallel::zero<3>>(4, 258);
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
  // own (the whole matrix's), a vector's as a role of the vector.
  {
    train::checkpoint_reader rd(dir);
    const auto& tensors = rd.index().tensors;
    const auto layout = nn::make_llama_layout(trainer_suite::model());
    const auto& wq = layout.at("blocks.0.attn.wq");
    CHECK(tensors.at("blocks.0.attn.wq").roles.count("exp_avg") == 1);
    CHECK(tensors.at("blocks.0.attn.wq").roles.count("exp_avg_sq") == 0);
    CHECK(tensors.at("blocks.0.attn.wq.exp_avg_sq_row").shape ==
          std::vector<std::int64_t>{wq.shp[0]});
    CHECK(tensors.at("blocks.0.attn.wq.exp_avg_sq_col").shape ==
          std::vector<std::int64_t>{wq.shp[1]});
    CHECK(tensors.at("blocks.0.attn_norm").roles.count("exp_avg_sq") == 1);
    CHECK(tensors.count("blocks.0.attn_norm.exp_avg_sq_row") == 0);
  }
  // Without the first moment the state is the statistics alone.
  c.adafactor.beta1 = 0;
  train::trainer<P, host, optim::adafactor> u(trainer_suite::model(), c, f);
  CHECK_THROWS_WITH(u.load_checkpoint(dir), Catch::Contains("beta1"));
}

// The statistics are the whole matrix's on every layout, so a checkpoint
// resumes at another tp degree, dp degree and ZeRO stage (each reader takes
// the boxes it needs, the row and column statistics whole): written by one
// rank, by dp 2 under zero<1> with tensors split between the ranks (2 kB
// buckets), and by (dp, tp) = (2, 2) under zero<3>, each resumed on the
// other layouts, the losses after the resume one rank's to 1e-10 (float64).
TEST_CASE("adafactor: a checkpoint resumes at another tp, dp and ZeRO stage",
          "[train][optim][adafactor][tp][zero]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("adafactor_reshard", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(5);
  c.lr = 1e-2;
  c.adafactor.beta1 = 0.9;
  c.adafactor.weight_decay = 0.1;
  c.adafactor.scale_parameter = true;
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_adafactor_reshard_" + std::to_string(::getpid()));
  struct cleanup {
    fs::path a;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(a, ec);
    }
  } clean{dir};
  std::vector<double> one;
  {
    train::trainer<P, host, optim::adafactor> t(trainer_suite::model(), c, f);
    for (int s = 0; s < 5; ++s) one.push_back(t.train_step().loss);
  }
  // A layout: (dp, tp), its ZeRO stage; saves after step 2 or resumes there.
  struct layout_case {
    int dp, tp, zero;
    const char* name;
  };
  const layout_case layouts[] = {{1, 1, 0, "one rank"},
                                 {1, 2, 0, "tp 2"},
                                 {2, 1, 1, "dp 2 zero<1> (split tensors)"},
                                 {2, 2, 3, "(dp, tp) = (2, 2) zero<3>"}};
  double worst = 0;
  auto run = [&](const layout_case& l, bool save) {
    std::vector<std::string> bad(static_cast<std::size_t>(l.dp * l.tp));
    std::vector<double> err(static_cast<std::size_t>(l.dp * l.tp), 0);
    auto body = [&](auto sharding, local_communicator& w) {
      using S = decltype(sharding);
      using layers = nn::tensor_parallel_layers<local_communicator>;
      omp_set_num_threads(1);
      auto g = comm::make_groups(w, comm::device_mesh(l.dp, l.tp, 1));
      train::train_config c2 = c;
      c2.dp = l.dp;
      c2.tp = l.tp;
      c2.micro_batch = l.dp == 1 ? 2 : 1;
      parallel::data_parallel_options dpo;
      dpo.bucket_bytes = 2000;
      train::trainer<P, host, optim::adafactor, S, local_communicator, layers> t(
          trainer_suite::model(), c2, f, parallel::layout{g.dp, layers{&g.tp}, g.pp}, dpo);
      const auto r = static_cast<std::size_t>(w.rank());
      std::ostringstream o;
      if (save) {
        for (int s = 0; s < 2; ++s) (void)t.train_step();
        t.save_checkpoint(dir);
      } else {
        t.load_checkpoint(dir);
        for (int s = 2; s < 5; ++s) {
          const double loss = t.train_step().loss, want = one[static_cast<std::size_t>(s)];
          err[r] = std::max(err[r], std::abs(loss - want) / want);
          if (!(std::abs(loss - want) <= 1e-10 * want))
            o << "step " << s << ": loss " << loss << " vs " << want << "; ";
        }
      }
      bad[r] = o.str();
    };
    REQUIRE_NOTHROW(local_world::run(
        l.dp * l.tp,
        [&](local_communicator& w) {
          if (l.zero == 0) body(parallel::zero<0>{}, w);
          if (l.zero == 1) body(parallel::zero<1>{}, w);
          if (l.zero == 3) body(parallel::zero<3>{}, w);
        },
        test_options()));
    for (std::size_t r = 0; r < bad.size(); ++r) {
      INFO(l.name << " rank " << r);
      CHECK(bad[r].empty());
      worst = std::max(worst, err[r]);
    }
  };
  for (const layout_case& from : {layouts[0], layouts[2], layouts[3]}) {
    fs::remove_all(dir);
    run(from, true);
    for (const layout_case& to : layouts) {
      INFO("written by " << from.name << ", resumed by " << to.name);
      run(to, false);
    }
  }
  UNSCOPED_INFO("adafactor resumed across layouts: worst relative loss difference " << worst);
  CHECK(worst <= 1e-10);
}

// A checkpoint of an older tessera stored a matrix's statistics per tp
// shard, shape (S, rows) and (S, cols): written at tp 1 (S = 1) it loads
// as the whole matrix's and continues one rank's run bit for bit; S = 2 is
// refused naming the tensor and the way on. (The older layout is made by
// rewriting a new checkpoint's metadata: the same bytes, boxes of (1, n).)
TEST_CASE("adafactor: an older per-shard checkpoint loads at tp 1, and is refused at S > 1",
          "[train][optim][adafactor]") {
  using P = precision::fp64;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("adafactor_old", 0)};
  data::token_file f(corpus.path);
  train::train_config c = small_config(4);
  c.lr = 1e-2;
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_adafactor_old_" + std::to_string(::getpid()));
  struct cleanup {
    fs::path a;
    ~cleanup() {
      std::error_code ec;
      fs::remove_all(a, ec);
    }
  } clean{dir};
  std::vector<double> full;
  {
    train::trainer<P, host, optim::adafactor> t(trainer_suite::model(), c, f);
    for (int s = 0; s < 4; ++s) {
      full.push_back(t.train_step().loss);
      if (s == 1) t.save_checkpoint(dir);
    }
  }
  // The statistics' tensors and pieces as the older layout stored them, S shards.
  auto rewrite = [&](std::int64_t S) {
    const fs::path meta = dir / "metadata.json";
    std::ifstream in(meta);
    nlohmann::json j = nlohmann::json::parse(in);
    in.close();
    auto stat = [](const std::string& name) {
      return name.ends_with(".exp_avg_sq_row") || name.ends_with(".exp_avg_sq_col");
    };
    int rewritten = 0;
    for (auto& [name, t] : j.at("tensors").items())
      if (stat(name)) {
        const auto n = t.at("shape").back().get<std::int64_t>();
        t["shape"] = std::vector<std::int64_t>{S, n};
        ++rewritten;
      }
    for (auto& p : j.at("pieces"))
      if (stat(p.at("tensor").get<std::string>())) {
        const auto n = p.at("shape").back().get<std::int64_t>();
        p["start"] = std::vector<std::int64_t>{0, 0};
        p["shape"] = std::vector<std::int64_t>{1, n};
      }
    CHECK(rewritten > 0);
    std::ofstream(meta) << j.dump();
  };
  rewrite(1);
  {
    train::trainer<P, host, optim::adafactor> r(trainer_suite::model(), c, f);
    r.load_checkpoint(dir);
    for (int s = 2; s < 4; ++s) CHECK(r.train_step().loss == full[static_cast<std::size_t>(s)]);
  }
  rewrite(2);
  train::trainer<P, host, optim::adafactor> r(trainer_suite::model(), c, f);
  CHECK_THROWS_WITH(r.load_checkpoint(dir),
                    Catch::Contains("per tensor-parallel shard (2 shards") &&
                        Catch::Contains("resume it with the tessera that wrote it"));
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
  // Each rank of tp 2 (the whole matrices' statistics, the tp exchange),
  // dp 2 under zero<1> with 2 kB buckets (its pieces, the dp exchange of
  // the split tensors) and both at once, with and without the first moment.
  struct mesh_case {
    int dp, tp, zero;
    bool beta1;
  };
  for (const mesh_case mcase : {mesh_case{1, 2, 0, false}, mesh_case{2, 1, 1, false},
                                mesh_case{2, 1, 3, true}, mesh_case{2, 2, 1, true}}) {
    INFO("dp " << mcase.dp << " tp " << mcase.tp << " zero " << mcase.zero);
    std::vector<std::string> bad(static_cast<std::size_t>(mcase.dp * mcase.tp));
    std::vector<int> pieces(bad.size(), 0);
    auto body = [&](auto sharding, local_communicator& world) {
      using S = decltype(sharding);
      omp_set_num_threads(1);
      using layers = nn::tensor_parallel_layers<local_communicator>;
      auto g = comm::make_groups(world, comm::device_mesh(mcase.dp, mcase.tp, 1));
      train::train_config c = small_config(1);
      c.dp = mcase.dp;
      c.tp = mcase.tp;
      c.micro_batch = mcase.dp == 1 ? 2 : 1;
      c.adafactor.beta1 = mcase.beta1 ? 0.9 : 0.0;
      parallel::data_parallel_options dpo;
      dpo.bucket_bytes = 2000;
      train::trainer<P, host, optim::adafactor, S, local_communicator, layers> t(
          mc, c, f, parallel::layout{g.dp, layers{&g.tp}, g.pp}, dpo);
      plan::sharding sh;
      sh.zero = mcase.zero;
      sh.dp = mcase.dp;
      sh.rank = g.dp.rank();
      sh.tp = mcase.tp;
      sh.tp_rank = g.tp.rank();
      sh.bucket_bytes = 2000;
      const auto st = plan::plan_state(mc, d, plan::optimizer_spec::adafactor(mcase.beta1), sh);
      const auto r = static_cast<std::size_t>(world.rank());
      for (std::size_t k = 0; k < t.optimizer().tensors().size(); ++k)
        pieces[r] += t.optimizer().piece(k) ? 1 : 0;
      // The dp exchange in the communication plan: as many doubles as the optimizer sends.
      if (mcase.zero >= 1 && mcase.dp > 1) {
        plan::comm_options co;
        co.reduce_bytes = d.reduce;  // the buckets' capacity counts reduction elements
        co.param_bytes = d.param;
        co.rank = g.dp.rank();
        co.factored_sums = true;
        const auto cp = plan::plan_comm(mc, sh, co);
        std::int64_t planned[2] = {0, 0};
        for (const auto& x : cp.collectives)
          if (x.what.starts_with("optimizer sums"))
            planned[x.what.ends_with("(u^2)") ? 1 : 0] = x.elems;
        for (int round = 0; round < 2; ++round)
          if (planned[round] != t.optimizer().exchange_lengths(round).first)
            bad[static_cast<std::size_t>(world.rank())] +=
                tessera::detail::str(" exchange round ", round, ": planned ", planned[round],
                                     ", sent ", t.optimizer().exchange_lengths(round).first);
      }
      if (st.master + st.optimizer + st.segment_table != t.optimizer().state_bytes())
        bad[r] += tessera::detail::str("rank ", r, ": planned ",
                                       st.master + st.optimizer + st.segment_table, ", allocated ",
                                       t.optimizer().state_bytes());
    };
    REQUIRE_NOTHROW(local_world::run(
        mcase.dp * mcase.tp,
        [&](local_communicator& w) {
          if (mcase.zero == 0) body(parallel::zero<0>{}, w);
          if (mcase.zero == 1) body(parallel::zero<1>{}, w);
          if (mcase.zero == 3) body(parallel::zero<3>{}, w);
        },
        test_options()));
    for (std::size_t r = 0; r < bad.size(); ++r) {
      CHECK(bad[r].empty());
      if (mcase.dp > 1) CHECK(pieces[r] > 0);  // the exchange over dp is counted, not empty
    }
  }
}

}  // namespace test_train_optimizers
