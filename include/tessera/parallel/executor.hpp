#pragma once
/// \file parallel/executor.hpp
/// The executor: runs a schedule's list of actions (parallel/schedule.hpp)
/// for one optimizer step over a model, its data-parallel engine
/// (parallel/zero.hpp) and a record pool (nn/record_pool.hpp). One
/// executor for every schedule and backend: it only calls the model's,
/// the engine's and the context's entry points.
///
/// Per action:
///   forward m         engine.begin_micro_batch(m); record = pool.acquire(m);
///                     model.forward(feed(m), record, grad_scale, d_losses + m)
///   backward m        model.backward(pool.at(m)); pool.release(m)
///   reduce_gradients  engine.finish_gradients()
///   clip              engine.grad_norm_squared(d_sum_squares);
///                     clip_coefficient(ctx, d_clip, d_sum_squares, max_norm)
///   optimizer_step    engine.step(lr, d_clip)
/// The step starts with model.zero_grad() and engine.begin_step(number of
/// backwards). Every scalar stays in the context's memory: the executor
/// reads nothing back. (The engine's waits on its collectives do block the
/// host: a device communicator's wait returns once the collective is done.)
///
/// `feed(m)` returns micro-batch m's inputs (an nn::micro_batch in the
/// context's memory). It is called once per forward, in the list's forward
/// order, and its buffers need only live until the next call (the model
/// copies what its backward needs).
///
/// On an exception the records in flight are dropped (their memory
/// freed), the engine abandons the step (engine.abandon_step(): its
/// reductions waited for, its buffers freed) and the exception propagates;
/// the model's gradients are then those of a partial step, and the next
/// run() starts afresh.

#include <cstdint>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/kernels/optimizer.hpp"
#include "tessera/nn/record_pool.hpp"
#include "tessera/parallel/schedule.hpp"

namespace tessera::parallel {

/// What one step's actions need besides the model and the engine, in the
/// context's memory where it is a pointer.
template <class Acc, class Master>
struct step_inputs {
  Acc grad_scale = 1;              ///< 1 / scored tokens of the whole step (every rank)
  double* d_losses = nullptr;      ///< (micro-batches) loss sum of each micro-batch, written
  double lr = 0;                   ///< learning rate of the step
  double max_norm = 0;             ///< clip threshold (<= 0: off)
  double* d_sum_squares = nullptr; ///< (1) the global gradient sum of squares, written
  Master* d_clip = nullptr;        ///< (1) the clip coefficient, written
};

/// Runs action lists over `Model` and `Engine` (both not owned).
template <class Model, class Engine>
class executor {
 public:
  using record = typename Model::record;
  using P = typename Model::precision_type;
  using inputs = step_inputs<typename P::accum_type, typename P::master_type>;

  /// A pool of `capacity` records: the most micro-batches in flight the
  /// lists it runs may hold (peak_in_flight). Throws config_error if < 1.
  executor(Model& model, Engine& engine, std::int64_t capacity)
      : model_(&model), engine_(&engine), pool_(capacity) {}

  /// Runs one step's `actions` (file comment). Throws config_error if the
  /// list holds more micro-batches in flight than the pool, what the model,
  /// the engine and the feed throw.
  template <class Feed>
  void run(const std::vector<action>& actions, Feed&& feed, const inputs& in) {
    const std::int64_t peak = peak_in_flight(actions);
    TESSERA_THROW_IF(peak > pool_.capacity(), config_error, "schedule holds ", peak,
                     " micro-batches in flight, the executor's record pool ", pool_.capacity());
    std::int64_t backwards = 0;
    for (const action& a : actions) backwards += a.kind == action_kind::backward;
    try {
      model_->zero_grad();
      engine_->begin_step(backwards > 0 ? backwards : 1);
      for (const action& a : actions) run_one(a, feed, in);
    } catch (...) {
      pool_.clear();
      engine_->abandon_step();
      throw;
    }
  }

  nn::record_pool<record>& pool() { return pool_; }

 private:
  template <class Feed>
  void run_one(const action& a, Feed& feed, const inputs& in) {
    switch (a.kind) {
      case action_kind::forward: {
        engine_->begin_micro_batch(a.micro_batch);
        record& r = pool_.acquire(a.micro_batch);
        model_->forward(feed(a.micro_batch), r, in.grad_scale, in.d_losses + a.micro_batch);
        break;
      }
      case action_kind::backward:
        model_->backward(pool_.at(a.micro_batch));
        pool_.release(a.micro_batch);
        break;
      case action_kind::reduce_gradients:
        engine_->finish_gradients();
        break;
      case action_kind::clip:
        engine_->grad_norm_squared(in.d_sum_squares);
        clip_coefficient(model_->context(), in.d_clip, in.d_sum_squares, in.max_norm);
        break;
      case action_kind::optimizer_step:
        engine_->step(in.lr, in.d_clip);
        break;
    }
  }

  Model* model_;
  Engine* engine_;
  nn::record_pool<record> pool_;
};

}  // namespace tessera::parallel
