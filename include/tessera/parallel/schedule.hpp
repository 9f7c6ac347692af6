#pragma once
/// \file parallel/schedule.hpp
/// An optimizer step as data (DESIGN.md, "Seams: schedule and executor"):
/// a schedule is a pure function from the step's shape to the list of
/// actions one rank runs (forward micro-batch m, backward micro-batch m,
/// wait for the gradient reductions, clip, optimizer step), and one
/// executor (parallel/executor.hpp) runs any list on any backend. Schedules
/// are tested without a model.
///
/// The gradient buckets reduce while the last backward still runs
/// (parallel/zero.hpp): `reduce_gradients` is where the step waits for
/// them, not where they start.

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"

namespace tessera::parallel {

/// What one action of a step does.
enum class action_kind : std::uint8_t {
  forward,           ///< training forward of micro-batch m (its record filled)
  backward,          ///< backward of micro-batch m (its record consumed)
  reduce_gradients,  ///< wait for every bucket's reduction (started during the backwards)
  clip,              ///< the global gradient norm and the clip coefficient
  optimizer_step,    ///< the optimizer on this rank's elements (and ZeRO's all-gather)
};

/// "forward", "backward", ...
inline const char* to_string(action_kind k) {
  switch (k) {
    case action_kind::forward:
      return "forward";
    case action_kind::backward:
      return "backward";
    case action_kind::reduce_gradients:
      return "reduce_gradients";
    case action_kind::clip:
      return "clip";
    case action_kind::optimizer_step:
      return "optimizer_step";
  }
  return "?";
}

/// One action: its kind and, for forward and backward, the micro-batch
/// (0-based, this rank's order).
struct action {
  action_kind kind = action_kind::forward;
  std::int64_t micro_batch = -1;
  bool operator==(const action&) const = default;
};

/// In which order a group of in-flight micro-batches runs its backwards.
enum class backward_order : std::uint8_t {
  forward_order,  ///< as their forwards ran (the gradients of one-at-a-time, bit for bit)
  reverse,        ///< last forward first (another summation order)
};

/// The schedule of one rank without a pipeline: the step's `micro_batches`
/// micro-batches in groups of `in_flight`: the group's forwards, then its
/// backwards (in `order`), group after group; then reduce_gradients, clip,
/// optimizer_step. in_flight = 1 is forward 0, backward 0, forward 1, ...
/// (gradient accumulation one micro-batch at a time). At most `in_flight`
/// records are held at once. Throws config_error if micro_batches or
/// in_flight is < 1.
inline std::vector<action> no_pipeline(std::int64_t micro_batches, std::int64_t in_flight = 1,
                                       backward_order order = backward_order::forward_order) {
  TESSERA_THROW_IF(micro_batches < 1, config_error, "no_pipeline: micro_batches=", micro_batches,
                   " must be >= 1");
  TESSERA_THROW_IF(in_flight < 1, config_error, "no_pipeline: in_flight=", in_flight,
                   " must be >= 1");
  std::vector<action> a;
  for (std::int64_t g = 0; g < micro_batches; g += in_flight) {
    const std::int64_t e = g + in_flight < micro_batches ? g + in_flight : micro_batches;
    for (std::int64_t m = g; m < e; ++m) a.push_back({action_kind::forward, m});
    if (order == backward_order::forward_order)
      for (std::int64_t m = g; m < e; ++m) a.push_back({action_kind::backward, m});
    else
      for (std::int64_t m = e; m-- > g;) a.push_back({action_kind::backward, m});
  }
  a.push_back({action_kind::reduce_gradients, -1});
  a.push_back({action_kind::clip, -1});
  a.push_back({action_kind::optimizer_step, -1});
  return a;
}

/// The most micro-batches whose records a list holds at once (forwards
/// whose backward has not run yet). Throws config_error for a backward
/// without its forward or a forward run twice.
inline std::int64_t peak_in_flight(const std::vector<action>& actions) {
  std::vector<std::int64_t> open;
  std::int64_t peak = 0;
  for (const action& a : actions) {
    if (a.kind == action_kind::forward) {
      for (std::int64_t m : open)
        TESSERA_THROW_IF(m == a.micro_batch, config_error, "schedule: forward of micro-batch ",
                         m, " while its record is in flight");
      open.push_back(a.micro_batch);
      peak = open.size() > static_cast<std::size_t>(peak) ? static_cast<std::int64_t>(open.size())
                                                          : peak;
    } else if (a.kind == action_kind::backward) {
      bool found = false;
      for (std::size_t i = 0; i < open.size(); ++i)
        if (open[i] == a.micro_batch) {
          open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
          found = true;
          break;
        }
      TESSERA_THROW_IF(!found, config_error, "schedule: backward of micro-batch ", a.micro_batch,
                       " before its forward");
    }
  }
  return peak;
}

}  // namespace tessera::parallel
