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

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"

namespace tessera::parallel {

/// What one action of a step does. Under a pipeline (parallel/
/// pipeline_schedule.hpp) every action names a micro-batch m and a model
/// chunk c of this rank: chunk c of rank k of K stages is virtual stage
/// v = c K + k of the K V virtual stages (Megatron-Core's interleaved
/// layout; c = 0, v = k without virtual stages). "Previous" and "next"
/// are the ranks of virtual stages v - 1 and v + 1.
enum class action_kind : std::uint8_t {
  forward,           ///< training forward of micro-batch m (its record filled)
  backward,          ///< backward of micro-batch m (its record consumed): B and W together
  reduce_gradients,  ///< wait for every bucket's reduction (started during the backwards)
  clip,              ///< the global gradient norm and the clip coefficient
  optimizer_step,    ///< the optimizer on this rank's elements (and ZeRO's all-gather)
  backward_input,    ///< B: the input gradient of micro-batch m (its record kept for W)
  backward_weight,   ///< W: the weight gradients of micro-batch m (its record consumed)
  send_forward,      ///< send micro-batch m's output of chunk c to the next virtual stage
  recv_forward,      ///< receive micro-batch m's input of chunk c from the previous one
  send_backward,     ///< send the gradient of micro-batch m's input of chunk c to the previous
  recv_backward,     ///< receive the gradient of micro-batch m's output of chunk c from the next
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
    case action_kind::backward_input:
      return "backward_input";
    case action_kind::backward_weight:
      return "backward_weight";
    case action_kind::send_forward:
      return "send_forward";
    case action_kind::recv_forward:
      return "recv_forward";
    case action_kind::send_backward:
      return "send_backward";
    case action_kind::recv_backward:
      return "recv_backward";
  }
  return "?";
}

/// One action: its kind and, for the per-micro-batch kinds, the
/// micro-batch (0-based, the step's order) and this rank's model chunk
/// (0 without virtual stages).
struct action {
  action_kind kind = action_kind::forward;
  std::int64_t micro_batch = -1;
  int chunk = 0;
  bool operator==(const action&) const = default;
};

/// One action as it ran (the executor's timeline with tracing on,
/// parallel/executor.hpp) or as simulated (parallel/pipeline_sim.hpp):
/// its start and end in seconds (the host's steady clock, or simulated
/// time), and, run, the bytes allocated from the context's resource when
/// it ended (records, messages and the persistent buffers: between
/// actions no temporaries are live; 0 in a simulation).
struct timed_action {
  action a;
  double start = 0, end = 0;
  std::int64_t allocated = 0;
};

/// Whether an action computes: a forward, a backward, or its B or W half.
constexpr bool is_compute(action_kind k) {
  return k == action_kind::forward || k == action_kind::backward ||
         k == action_kind::backward_input || k == action_kind::backward_weight;
}

/// True for the four pipeline message kinds (send_*, recv_*).
constexpr bool is_message(action_kind k) {
  return k == action_kind::send_forward || k == action_kind::recv_forward ||
         k == action_kind::send_backward || k == action_kind::recv_backward;
}

/// A run of adjacent actions [begin, end) of a list.
struct action_range {
  std::size_t begin = 0, end = 0;
  bool operator==(const action_range&) const = default;
};

/// The message groups of a list: its maximal runs of adjacent message
/// actions, in list order. A transport whose send waits for the matching
/// receive (NCCL's rendezvous) issues each run as one group, whose
/// operations progress together (ncclGroupStart / ncclGroupEnd), so that
/// two neighbours that send to each other at the same point of 1F1B (the
/// send of an activation beside the receive of a gradient, Megatron-Core's
/// send_forward_recv_backward) do not wait on each other. The simulator's
/// rendezvous transport (parallel/pipeline_sim.hpp) checks that every
/// schedule's groups complete.
inline std::vector<action_range> message_groups(const std::vector<action>& actions) {
  std::vector<action_range> g;
  for (std::size_t i = 0; i < actions.size();) {
    if (!is_message(actions[i].kind)) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < actions.size() && is_message(actions[j].kind)) ++j;
    g.push_back({i, j});
    i = j;
  }
  return g;
}

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

/// The most micro-batches whose records a list holds at once: a record is
/// held from forward (m, c) to its backward or, split, to its
/// backward_weight (W frees what B kept). `chunk` >= 0 counts that
/// model chunk's records only; -1 counts every chunk's. Throws
/// config_error for a backward (B or W) without its forward, a W without
/// its B, a B after a full backward, or a forward of (m, c) run twice.
inline std::int64_t peak_in_flight(const std::vector<action>& actions, int chunk = -1) {
  struct held {
    std::int64_t m;
    int c;
    bool input_done;
  };
  std::vector<held> open;
  std::int64_t peak = 0;
  auto find = [&](const action& a) -> std::ptrdiff_t {
    for (std::size_t i = 0; i < open.size(); ++i)
      if (open[i].m == a.micro_batch && open[i].c == a.chunk) return static_cast<std::ptrdiff_t>(i);
    return -1;
  };
  for (const action& a : actions) {
    if (chunk >= 0 && a.chunk != chunk) continue;
    switch (a.kind) {
      case action_kind::forward:
        TESSERA_THROW_IF(find(a) >= 0, config_error, "schedule: forward of micro-batch ",
                         a.micro_batch, " (chunk ", a.chunk, ") while its record is in flight");
        open.push_back({a.micro_batch, a.chunk, false});
        peak = std::max(peak, static_cast<std::int64_t>(open.size()));
        break;
      case action_kind::backward:
      case action_kind::backward_input:
      case action_kind::backward_weight: {
        const std::ptrdiff_t i = find(a);
        TESSERA_THROW_IF(i < 0, config_error, "schedule: ", to_string(a.kind), " of micro-batch ",
                         a.micro_batch, " (chunk ", a.chunk, ") before its forward");
        held& h = open[static_cast<std::size_t>(i)];
        TESSERA_THROW_IF(a.kind == action_kind::backward_weight && !h.input_done, config_error,
                         "schedule: backward_weight of micro-batch ", a.micro_batch, " (chunk ",
                         a.chunk, ") before its backward_input");
        TESSERA_THROW_IF(a.kind != action_kind::backward_weight && h.input_done, config_error,
                         "schedule: a second ", to_string(a.kind), " of micro-batch ",
                         a.micro_batch, " (chunk ", a.chunk, ")");
        if (a.kind == action_kind::backward_input)
          h.input_done = true;
        else
          open.erase(open.begin() + i);
        break;
      }
      default:
        break;
    }
  }
  return peak;
}

}  // namespace tessera::parallel
