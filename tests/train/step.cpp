// Tests include/tessera/train/step.hpp: the action list of a step (one stage
// runs no_pipeline, except ZB-H1's split backward), and a schedule fixed by
// type as the trainer's template parameter gives the same lists and the same
// steps, bit for bit, as the run-time choice (parallel::any_schedule) on two
// pipeline stages (threads), for every schedule.
#include <catch2/catch.hpp>

#include <mutex>
#include <string>
#include <vector>

#include "pp_suite.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/train/step.hpp"

namespace test_train_step {

using namespace tessera;
using parallel::schedule_kind;

TEST_CASE("a step's action list: no_pipeline on one stage, the schedule's on several",
          "[train][step][pipeline]") {
  for (schedule_kind k : {schedule_kind::gpipe, schedule_kind::one_f_one_b}) {
    CHECK(train::step_actions(parallel::any_schedule{k}, 0, {1, 4, 1}) == parallel::no_pipeline(4));
    CHECK(train::step_actions(parallel::any_schedule{k}, 1, {2, 4, 1}) ==
          parallel::make_schedule(k, 1, {2, 4, 1}));
  }
  // ZB-H1 keeps its B/W split on one stage.
  CHECK(train::step_actions(parallel::zero_bubble_h1{}, 0, {1, 4, 1}) ==
        parallel::zero_bubble_h1::actions(0, {1, 4, 1}));
  CHECK(train::step_actions(parallel::one_f_one_b{}, 0, {1, 4, 1}) == parallel::no_pipeline(4));
  // The types give the run-time choice's lists.
  for (int k = 0; k < 4; ++k) {
    const parallel::pipeline_shape s{4, 8, 1};
    CHECK(parallel::gpipe::actions(k, s) ==
          parallel::any_schedule{schedule_kind::gpipe}.actions(k, s));
    CHECK(parallel::one_f_one_b::actions(k, s) ==
          parallel::any_schedule{schedule_kind::one_f_one_b}.actions(k, s));
    CHECK(parallel::zero_bubble_h1::actions(k, s) ==
          parallel::any_schedule{schedule_kind::zero_bubble_h1}.actions(k, s));
    CHECK(parallel::interleaved_one_f_one_b::actions(k, {4, 8, 2}) ==
          parallel::any_schedule{schedule_kind::interleaved}.actions(k, {4, 8, 2}));
  }
}

namespace {
// Three steps of a 2-stage pipeline (threads) whose trainer takes Schedule
// as its type; the losses, norms and rank 0's action list.
// `asked` is cfg.pipeline: a schedule type wins over it (the run's
// pipeline is then the type's, l.schedule).
template <class Schedule>
std::vector<double> run(const data::token_file& f, const pp_suite::layout& l,
                        std::vector<parallel::action>* actions, schedule_kind asked) {
  std::vector<double> out;
  std::mutex mu;
  comm::local_world::run(l.pp, [&](comm::local_communicator& world) {
    auto g = comm::make_groups(world, comm::device_mesh(1, 1, l.pp));
    train::train_config cfg = pp_suite::config(l, 3);
    cfg.pipeline = asked;
    train::trainer<precision::fp64, host, optim::adamw, parallel::zero<0>, comm::local_communicator,
                   nn::dense_layers, Schedule>
        tr(pp_suite::model(l.layers), cfg, f, parallel::layout{g.dp, nn::dense_layers{}, g.pp});
    std::vector<double> mine;
    for (int s = 0; s < 3; ++s) {
      const auto m = tr.train_step();
      mine.insert(mine.end(), {m.loss, m.grad_norm});
    }
    std::lock_guard lock(mu);
    if (world.rank() == 0) {
      out = mine;
      *actions = tr.actions();
      if (tr.config().pipeline != l.schedule) out.clear();  // the type's kind is the run's
    }
  });
  return out;
}
}  // namespace

TEST_CASE(
    "a schedule type as the trainer's template parameter equals the run-time choice, bit for bit",
    "[train][step][pipeline]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("step_schedule", 0)};
  const data::token_file f(corpus.path);
  auto same = [&](auto type, schedule_kind k, int V, std::int64_t layers) {
    using S = decltype(type);
    pp_suite::layout l;
    l.pp = 2;
    l.schedule = k;
    l.virtual_stages = V;
    l.micro_batches = 4;
    l.layers = layers;
    INFO(l.name());
    std::vector<parallel::action> by_type, by_value, misled;
    const auto a = run<S>(f, l, &by_type, k);
    const auto b = run<parallel::any_schedule>(f, l, &by_value, k);
    REQUIRE(a.size() == 6);
    CHECK(a == b);  // losses and norms, bit for bit
    CHECK(by_type == by_value);
    if (V == 1) {  // the type wins over another cfg.pipeline
      const auto other =
          k == schedule_kind::gpipe ? schedule_kind::one_f_one_b : schedule_kind::gpipe;
      CHECK(run<S>(f, l, &misled, other) == a);
      CHECK(misled == by_type);
    }
  };
  same(parallel::gpipe{}, schedule_kind::gpipe, 1, 2);
  same(parallel::one_f_one_b{}, schedule_kind::one_f_one_b, 1, 2);
  same(parallel::zero_bubble_h1{}, schedule_kind::zero_bubble_h1, 1, 2);
  same(parallel::interleaved_one_f_one_b{}, schedule_kind::interleaved, 2, 4);
}

}  // namespace test_train_step
