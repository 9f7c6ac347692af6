#pragma once
/// \file parallel/pipeline_schedule.hpp
/// Pipeline schedules as types (DESIGN.md, "Seams: schedule and executor"):
/// `gpipe`, `one_f_one_b`, `interleaved_one_f_one_b` and `zero_bubble_h1`,
/// each with a static `actions(stage, shape)` returning the list of actions
/// (parallel/schedule.hpp) one rank of a K-stage pipeline runs for one
/// optimizer step of M micro-batches, with V model chunks (virtual stages)
/// per rank, and its `kind`. A schedule type is a template parameter of the
/// trainer (train::trainer's `Schedule`); `any_schedule` holds a choice made
/// at run time and gives the same lists (make_schedule). The lists are
/// data: parallel/pipeline_sim.hpp times them, the executor runs them.
///
/// Layout: chunk c of rank k is virtual stage v = c K + k of the K V
/// virtual stages; the next virtual stage of (k, c) is rank k + 1 chunk c,
/// or, for k = K - 1, rank 0 chunk c + 1 (Megatron-Core's interleaved
/// layout). Communication contract of every list, for every (m, c), where
/// "next to" means with only message actions between (or, in interleaved's
/// per-step groups with V > 1, also the step's other compute):
/// - recv_forward (m, c) precedes forward (m, c), next to it, unless v == 0;
/// - send_forward (m, c) follows forward (m, c), next to it, unless
///   v == K V - 1;
/// - recv_backward (m, c) precedes the backward (or backward_input) of
///   (m, c), next to it, unless v == K V - 1;
/// - send_backward (m, c) follows the backward (or backward_input) of
///   (m, c), next to it, unless v == 0.
/// No list of this file deadlocks, neither with non-blocking (buffered)
/// sends and blocking receives (the host communicators) nor under NCCL's
/// rendezvous, where each run of adjacent messages is one group that
/// waits for its peers (schedule.hpp's message_groups; tests/parallel/
/// pipeline_schedule.cpp simulates both for every K <= 8, M <= 3K, V <= 3).
/// Every list ends with
/// reduce_gradients, clip, optimizer_step, as no_pipeline does.
///
/// Gradient order: every schedule runs a chunk's backwards (or W's) in
/// micro-batch order m = 0, 1, ..., so parameter gradients accumulate in
/// the order of the one-rank run (no_pipeline with in_flight = 1).

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/parallel/schedule.hpp"

namespace tessera::parallel {

/// The pipeline schedules of this file.
enum class schedule_kind : std::uint8_t {
  gpipe,           ///< all forwards, then all backwards (Huang et al. 2019, GPipe)
  one_f_one_b,     ///< PipeDream-flush / Megatron 1F1B (Narayanan et al. 2021, section 2.2.1)
  interleaved,     ///< interleaved 1F1B over V chunks per rank (Narayanan et al. 2021, 2.2.2)
  zero_bubble_h1,  ///< ZB-H1: backward split into B and W (Qi et al. 2023, section 3.1)
};

/// "gpipe", "1f1b", "interleaved", "zb1" (the names parse_schedule_kind reads).
inline const char* to_string(schedule_kind k) {
  switch (k) {
    case schedule_kind::gpipe:
      return "gpipe";
    case schedule_kind::one_f_one_b:
      return "1f1b";
    case schedule_kind::interleaved:
      return "interleaved";
    case schedule_kind::zero_bubble_h1:
      return "zb1";
  }
  return "?";
}

/// The schedule named `s` ("gpipe", "1f1b", "interleaved", "zb1"; exact,
/// case-sensitive). Throws config_error naming `s` and the choices.
inline schedule_kind parse_schedule_kind(std::string_view s) {
  for (schedule_kind k : {schedule_kind::gpipe, schedule_kind::one_f_one_b,
                          schedule_kind::interleaved, schedule_kind::zero_bubble_h1})
    if (s == to_string(k)) return k;
  throw config_error(::tessera::detail::str("unknown pipeline schedule '", s,
                                            "': choose gpipe, 1f1b, interleaved or zb1"));
}

/// The shape of a pipelined step: K = `stages` ranks (pp), M =
/// `micro_batches` micro-batches per step, V = `virtual_stages` model
/// chunks per rank (1 without interleaving).
struct pipeline_shape {
  int stages = 1;                  ///< K
  std::int64_t micro_batches = 1;  ///< M
  int virtual_stages = 1;          ///< V
};

/// Checks that `kind` can run `shape` (and, when `layers` >= 0, a model of
/// that many layers, each virtual stage holding at least one). Throws
/// config_error naming the values and the limit when K < 1, M < 1, V < 1;
/// V > 1 with a schedule other than interleaved; interleaved with K < 2 or
/// with M not a multiple of K (Megatron-Core's requirement: micro-batches
/// go through the chunks in groups of K); K V > layers.
inline void check_pipeline(schedule_kind kind, pipeline_shape shape, std::int64_t layers = -1) {
  const int K = shape.stages;
  const std::int64_t M = shape.micro_batches;
  const int V = shape.virtual_stages;
  TESSERA_THROW_IF(K < 1, config_error, "pipeline: pp=", K, " stages must be >= 1");
  TESSERA_THROW_IF(M < 1, config_error, "pipeline: micro-batch count M=", M, " must be >= 1");
  TESSERA_THROW_IF(V < 1, config_error, "pipeline: virtual stages V=", V, " must be >= 1");
  TESSERA_THROW_IF(V > 1 && kind != schedule_kind::interleaved, config_error,
                   "pipeline: virtual stages V=", V, " need the interleaved schedule, not ",
                   to_string(kind), " (use V=1 or --schedule interleaved)");
  if (kind == schedule_kind::interleaved) {
    TESSERA_THROW_IF(K < 2, config_error, "interleaved needs pp >= 2 stages, got pp=", K,
                     " (use 1f1b or no pipeline)");
    TESSERA_THROW_IF(M % K != 0, config_error, "interleaved needs the micro-batch count M=", M,
                     " to be a multiple of pp=", K);
  }
  if (layers >= 0)
    TESSERA_THROW_IF(static_cast<std::int64_t>(K) * V > layers, config_error,
                     "pipeline: more virtual stages (K V = ", K, " x ", V, " = ",
                     static_cast<std::int64_t>(K) * V, ") than layers (", layers,
                     "): each virtual stage needs at least one layer");
}

namespace detail {

/// Appends one rank's actions with the sends and receives the layout
/// implies (the contract at the top of this file).
class pipeline_list {
 public:
  pipeline_list(int stage, pipeline_shape s) : stage_(stage), K_(s.stages), V_(s.virtual_stages) {}

  void forward(std::int64_t m, int c) {
    const int v = c * K_ + stage_;
    if (v > 0) recv({action_kind::recv_forward, m, c});
    a_.push_back({action_kind::forward, m, c});
    if (v < K_ * V_ - 1) send({action_kind::send_forward, m, c});
  }
  /// `kind` is backward (B and W) or backward_input (B).
  void backward(std::int64_t m, int c, action_kind kind = action_kind::backward) {
    const int v = c * K_ + stage_;
    if (v < K_ * V_ - 1) recv({action_kind::recv_backward, m, c});
    a_.push_back({kind, m, c});
    if (v > 0) send({action_kind::send_backward, m, c});
  }
  void weight(std::int64_t m, int c) { a_.push_back({action_kind::backward_weight, m, c}); }

  /// The computes appended until end_block run back to back: their
  /// receives go before the block's first compute, their sends after its
  /// last, so one message group holds a step's sends and the next step's
  /// receives (Megatron-Core's interleaved steady state, whose
  /// send_forward_backward_recv_forward_backward is one NCCL group: the
  /// form that completes under a rendezvous transport, pipeline_sim.hpp).
  void begin_block() {
    end_block();
    block_ = true;
    recv_at_ = a_.size();
  }
  void end_block() {
    a_.insert(a_.end(), held_.begin(), held_.end());
    held_.clear();
    block_ = false;
  }

  std::vector<action> finish() && {
    end_block();
    a_.push_back({action_kind::reduce_gradients, -1});
    a_.push_back({action_kind::clip, -1});
    a_.push_back({action_kind::optimizer_step, -1});
    return std::move(a_);
  }

 private:
  void recv(action a) {
    if (block_)
      a_.insert(a_.begin() + static_cast<std::ptrdiff_t>(recv_at_++), a);
    else
      a_.push_back(a);
  }
  void send(action a) {
    if (block_)
      held_.push_back(a);
    else
      a_.push_back(a);
  }

  int stage_, K_, V_;
  std::vector<action> a_;
  std::vector<action> held_;  // sends of the open block
  bool block_ = false;
  std::size_t recv_at_ = 0;  // where the open block's next receive goes
};

inline void check_pipeline_stage(schedule_kind kind, int stage, pipeline_shape s) {
  check_pipeline(kind, s);
  TESSERA_THROW_IF(stage < 0 || stage >= s.stages, config_error, to_string(kind), ": stage=", stage,
                   " must be in [0, pp=", s.stages, ")");
}

}  // namespace detail

/// GPipe (Huang et al. 2019): rank `stage` runs all M forwards (m = 0..M-1),
/// then all M backwards in the same order m = 0..M-1 (not reversed, so the
/// gradients accumulate as in the one-rank run). Holds M records at once.
/// Bubble fraction (K - 1)/(M + K - 1) (pipeline_sim.hpp). Preconditions:
/// check_pipeline(gpipe, shape), 0 <= stage < K; throws config_error
/// otherwise.
struct gpipe {
  static constexpr schedule_kind kind = schedule_kind::gpipe;
  static std::vector<action> actions(int stage, pipeline_shape shape) {
    detail::check_pipeline_stage(schedule_kind::gpipe, stage, shape);
    detail::pipeline_list l(stage, shape);
    for (std::int64_t m = 0; m < shape.micro_batches; ++m) l.forward(m, 0);
    for (std::int64_t m = 0; m < shape.micro_batches; ++m) l.backward(m, 0);
    return std::move(l).finish();
  }
};

/// 1F1B, PipeDream-flush (Narayanan et al. 2021, "Efficient Large-Scale
/// Language Model Training on GPU Clusters", section 2.2.1; Megatron-Core's
/// forward_backward_pipelining_without_interleaving): w = min(K - stage - 1,
/// M) warm-up forwards, then M - w steady steps of forward m + w and
/// backward m, then the w cool-down backwards. Backwards in order m =
/// 0..M-1. Holds at most min(K - stage, M) records (min(K, M) on stage 0);
/// same bubble as GPipe. Preconditions and throws as gpipe.
struct one_f_one_b {
  static constexpr schedule_kind kind = schedule_kind::one_f_one_b;
  static std::vector<action> actions(int stage, pipeline_shape shape) {
    detail::check_pipeline_stage(schedule_kind::one_f_one_b, stage, shape);
    const std::int64_t M = shape.micro_batches;
    const std::int64_t w = std::min<std::int64_t>(shape.stages - stage - 1, M);
    detail::pipeline_list l(stage, shape);
    for (std::int64_t m = 0; m < w; ++m) l.forward(m, 0);
    for (std::int64_t m = 0; m < M - w; ++m) {
      l.forward(m + w, 0);
      l.backward(m, 0);
    }
    for (std::int64_t m = M - w; m < M; ++m) l.backward(m, 0);
    return std::move(l).finish();
  }
};

/// Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2; Megatron-Core's
/// forward_backward_pipelining_with_interleaving): rank `stage` holds V
/// chunks, and the M V (micro-batch, chunk) pairs run as "virtual
/// micro-batches" j = 0..M V - 1: group g = j / (K V) of K micro-batches
/// goes through chunk 0, then chunk 1, ..., (forward j is micro-batch
/// g K + j % K of chunk (j % (K V)) / K; backward j the same micro-batch
/// of chunk V - 1 - (j % (K V)) / K, Megatron's get_model_chunk_id). Warm-up
/// w = min((K - stage - 1) 2 + (V - 1) K, M V) forwards, then steady steps
/// of forward j + w and backward j, then cool-down backwards. With V = 1 the
/// warm-up is 1F1B's K - stage - 1 (Megatron runs V = 1 without
/// interleaving), so the list equals one_f_one_b's. Unlike Megatron, M = K
/// is not turned into all-forwards-then-all-backwards. With V > 1 each
/// steady step's forward and backward run back to back and their messages
/// form one group with the next step's receives (Megatron-Core's
/// send_forward_backward_recv_forward_backward), the form NCCL's
/// rendezvous completes; the simulated bubble over buffered messages is
/// the same. Holds at most w + 1
/// records over its chunks. Bubble fraction (K - 1)/(V M + K - 1) with
/// each chunk costing 1/V of a rank's layers (pipeline_sim.hpp).
/// Preconditions: check_pipeline(interleaved, shape) (K >= 2, M a multiple
/// of K), 0 <= stage < K; throws config_error otherwise.
struct interleaved_one_f_one_b {
  static constexpr schedule_kind kind = schedule_kind::interleaved;
  static std::vector<action> actions(int stage, pipeline_shape shape) {
    detail::check_pipeline_stage(schedule_kind::interleaved, stage, shape);
    const int K = shape.stages;
    const int V = shape.virtual_stages;
    const std::int64_t total = shape.micro_batches * V;
    const std::int64_t group = static_cast<std::int64_t>(K) * V;
    auto micro_batch = [&](std::int64_t j) { return j / group * K + j % K; };
    auto chunk = [&](std::int64_t j, bool forward) {
      const int c = static_cast<int>(j % group / K);
      return forward ? c : V - 1 - c;
    };
    const std::int64_t warmup =
        V == 1 ? K - stage - 1 : static_cast<std::int64_t>(K - stage - 1) * 2 + (V - 1) * K;
    const std::int64_t w = std::min(warmup, total);
    detail::pipeline_list l(stage, shape);
    for (std::int64_t j = 0; j < w; ++j) l.forward(micro_batch(j), chunk(j, true));
    for (std::int64_t j = 0; j < total - w; ++j) {
      if (V > 1) l.begin_block();
      l.forward(micro_batch(j + w), chunk(j + w, true));
      l.backward(micro_batch(j), chunk(j, false));
      l.end_block();
    }
    for (std::int64_t j = total - w; j < total; ++j) l.backward(micro_batch(j), chunk(j, false));
    return std::move(l).finish();
  }
};

/// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv
/// 2401.10241, section 3.1, figure 3 top; the layout of the authors'
/// ZeroBubbleH1Pipeline): the backward split into B (backward_input, on
/// the critical path) and W (backward_weight, deferred). Rank `stage`
/// runs w = min(K - stage - 1, M) warm-up forwards (1F1B's), then `stage`
/// steps of forward, B (W held back), then steps of forward, B, W of the
/// oldest held micro-batch, then cool-down steps of B, W, then its last
/// held W's. So rank k holds k W's back to fill its cool-down bubble, and
/// at most min(K, M) micro-batches are in flight (forward done, W not
/// done) on any rank: 1F1B's peak on stage 0 (1F1B holds K - k on stage k,
/// ZB-H1 min(K, M) on every stage). B's and W's each run in micro-batch
/// order m = 0..M-1. With F = B = W each rank idles (K - 1)(F + B - W) per
/// step, a third of 1F1B's (K - 1)(F + B + W), when M >= K (pipeline_sim.hpp;
/// the test states the exact claim). Preconditions and throws as gpipe.
struct zero_bubble_h1 {
  static constexpr schedule_kind kind = schedule_kind::zero_bubble_h1;
  static std::vector<action> actions(int stage, pipeline_shape shape) {
    detail::check_pipeline_stage(schedule_kind::zero_bubble_h1, stage, shape);
    const std::int64_t M = shape.micro_batches;
    const std::int64_t w = std::min<std::int64_t>(shape.stages - stage - 1, M);
    detail::pipeline_list l(stage, shape);
    std::int64_t f = 0, b = 0, wt = 0;  // next forward, B, W
    for (; f < w; ++f) l.forward(f, 0);
    for (int i = 0; i < stage && f < M; ++i, ++f, ++b) {
      l.forward(f, 0);
      l.backward(b, 0, action_kind::backward_input);
    }
    for (; f < M; ++f, ++b, ++wt) {
      l.forward(f, 0);
      l.backward(b, 0, action_kind::backward_input);
      l.weight(wt, 0);
    }
    for (; b < M; ++b, ++wt) {
      l.backward(b, 0, action_kind::backward_input);
      l.weight(wt, 0);
    }
    for (; wt < M; ++wt) l.weight(wt, 0);
    return std::move(l).finish();
  }
};

/// The list of rank `stage` under schedule `kind`: gpipe, one_f_one_b,
/// interleaved_one_f_one_b or zero_bubble_h1 (their actions()). Throws as
/// those do.
inline std::vector<action> make_schedule(schedule_kind kind, int stage, pipeline_shape shape) {
  switch (kind) {
    case schedule_kind::gpipe:
      return gpipe::actions(stage, shape);
    case schedule_kind::one_f_one_b:
      return one_f_one_b::actions(stage, shape);
    case schedule_kind::interleaved:
      return interleaved_one_f_one_b::actions(stage, shape);
    case schedule_kind::zero_bubble_h1:
      return zero_bubble_h1::actions(stage, shape);
  }
  throw config_error("make_schedule: unknown schedule_kind");
}

/// A schedule chosen at run time (a command line's --schedule): the value
/// of `kind`, whose actions() are make_schedule's. The trainer's default
/// schedule policy; a schedule type (gpipe, one_f_one_b,
/// interleaved_one_f_one_b, zero_bubble_h1) fixes the choice at compile
/// time instead, with the same lists.
struct any_schedule {
  schedule_kind kind = schedule_kind::one_f_one_b;
  std::vector<action> actions(int stage, pipeline_shape shape) const {
    return make_schedule(kind, stage, shape);
  }
};

/// A pipeline schedule policy: `s.kind` (a schedule_kind: a static constant
/// of a schedule type, the run-time value of any_schedule) and
/// `s.actions(stage, shape)`, the action list of one rank (static in the
/// schedule types). The trainer's `Schedule` parameter.
template <class S>
concept pipeline_schedule = requires(const S& s, int stage, pipeline_shape shape) {
  { s.kind } -> std::convertible_to<schedule_kind>;
  { s.actions(stage, shape) } -> std::same_as<std::vector<action>>;
};

/// True for the schedule types whose choice is fixed at compile time (every
/// pipeline_schedule but any_schedule).
template <class S>
inline constexpr bool fixed_schedule = requires {
  { &S::kind } -> std::convertible_to<const schedule_kind*>;
};

static_assert(pipeline_schedule<gpipe> && pipeline_schedule<one_f_one_b> &&
              pipeline_schedule<interleaved_one_f_one_b> && pipeline_schedule<zero_bubble_h1> &&
              pipeline_schedule<any_schedule>);
static_assert(fixed_schedule<gpipe> && !fixed_schedule<any_schedule>);

}  // namespace tessera::parallel
