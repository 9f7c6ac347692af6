#pragma once
/// \file plan/pipeline.hpp
/// The pipeline planner: per pipeline rank, what train::trainer's pipeline
/// (parallel/pipeline_partition.hpp, pipeline_schedule.hpp, executor.hpp)
/// holds and sends in one optimizer step, before anything runs: each
/// chunk's stage range and real parameters, the model state of the rank's
/// chunks, the saved activations of one micro-batch, the peak micro-batches
/// in flight and the peak activation bytes over the rank's action list, the
/// p2p bytes it sends, and the bubble.
///
/// Layout: chunk c of pp rank k is virtual stage v = c K + k of the K V
/// virtual stages of parallel::partition_stages (the embedding on v = 0,
/// the final norm and LM head on v = K V - 1).
///
/// Memory of the activations, walked over the rank's action list
/// (parallel::make_schedule) with the byte reports of the modules
/// (nn::llama::record_bytes, nn::block_bytes):
/// - the records alone (`peak_record_bytes`): + the stage's record at
///   forward, record -> weight-pending at backward_input, 0 at backward and
///   backward_weight;
/// - what the executor holds between actions (`peak_activation_bytes`):
///   the records, plus the message buffers of parallel::executor: a
///   received input (rows, H) param_type from recv_forward to its forward
///   (the record's first input is a copy of it), a received output gradient
///   (rows, H) act_grad_type from recv_backward to its backward (or B), a
///   stage's input gradient (rows, H) act_grad_type from its backward (or B)
///   to its send_backward, and the stage output (counted in the record) only
///   until its send_forward. Sends are taken to complete when they return,
///   as comm::local_communicator's do (an MPI or NCCL send may hold its
///   buffer longer, at most to reduce_gradients). tests/plan/pipeline.cpp
///   holds this figure to the allocator of the trainer on thread ranks.
/// Neither counts the workspaces inside an action (the backward's gradients,
/// the attention scratch, the LM head's logits: plan/activations.hpp), the
/// model state, the loader or the trainer's scalars.
///
/// Model state (`weights`, `grads`, `master`, `optimizer`) is the ideal
/// accounting of plan/state.hpp per chunk: its real parameters times the
/// per-element sizes of dtype_sizes, the optimizer state (and the master
/// copy) a ceil(n / dp) shard under ZeRO-1..3, the gradients too under
/// ZeRO-2/3 and the weights too under ZeRO-3 (Rajbhandari et al. 2020,
/// section 5: P_os, P_os+g, P_os+g+p); no bucket or alignment padding.
/// Under ZeRO-2/3 the gradient buckets of the accumulation window
/// (`reduce_staging`: a pipeline reduces once per step, so every chunk
/// holds its whole gradient until then) are a transient beside it.
///
/// ZeRO-3's gathered segments (`gathered`), a transient beside the model
/// state: each chunk's data-parallel engine all-gathers a segment (a block,
/// the embedding, or the final norm and LM head) before each forward and
/// backward that reads it and frees it after (parallel/param_gatherer.hpp);
/// with prefetch it holds the segment computing and its neighbour arriving
/// (forward: s and s + 1; backward: s and s - 1; the head's fused forward
/// and backward with the last block), so at most the largest adjacent pair
/// of the chunk's segments, or its one segment (seeds/004, "Sharding: ZeRO
/// and FSDP": one or two layers materialised). Every gathered segment is
/// freed when its forward or backward returns, so a rank's chunks never
/// hold theirs at once: the rank's figure is its largest chunk's. This is
/// at most two of the rank's largest segment, and less when the largest (the
/// embedding or the head) sits beside blocks. Counted as the trainer holds
/// them, at the segments' real parameters in param_type (the engine pads
/// each to dp equal chunks of a multiple of parallel::chunk_align elements);
/// tests/plan/pipeline.cpp holds it to the trainer's engines.
///
/// The bubble is an idealised figure: parallel::simulate's event model
/// (sends take no time, no message latency, no contention, no launch or
/// memory costs) with each virtual stage's forward, B and W costing 1/3 of
/// its training FLOPs per token each (parallel::block_flops_per_token per
/// block, parallel::head_flops_per_token on the head's stage; the
/// embedding's lookup counts nothing), so it includes the idle time of an
/// unbalanced partition. A full backward costs B + W.
///
/// Under an FP8 policy (dtype_sizes::fp8_linear) each rank holds the FP8
/// state of its chunks' blocks and, once one of them has run, the FP8
/// operand copies (`fp8`, plan_fp8 over the rank's blocks: the copies are
/// per thread, shared by the rank's chunks); in peak(), not in
/// model_state().
///
/// Tensor parallelism (activation_options::tp, sharding::tp and tp_rank):
/// parameters are the tp rank's (nn::make_llama_layout(c, {tp, tp_rank}):
/// its block shards, the embedding, norms and LM head whole; with tied
/// embeddings the last stage's copy of the embedding), records the
/// rank's heads and SwiGLU columns, and under sequence parallelism the
/// residual stream, the norms and the stage boundaries hold N/tp rows.
///
/// All figures are bytes unless a name says otherwise.

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/nn/embedding.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/nn/llama_record.hpp"
#include "tessera/nn/transformer_block.hpp"
#include "tessera/parallel/pipeline_partition.hpp"
#include "tessera/parallel/pipeline_schedule.hpp"
#include "tessera/parallel/pipeline_sim.hpp"
#include "tessera/parallel/schedule.hpp"
#include "tessera/plan/activations.hpp"
#include "tessera/plan/fp8.hpp"
#include "tessera/plan/state.hpp"

namespace tessera::plan {

/// The pipeline of a plan: K = pp ranks, V = virtual_stages chunks per rank,
/// the schedule, M = micro_batches per step and dp rank, the blocks of each
/// of the K V virtual stages (empty: balanced by FLOPs,
/// parallel::partition_stages) and the micro-batch's shape and options
/// (act.micro_batch = B, act.seq = T (0: max_seq), act.model.checkpointing,
/// act.model.fp8 under an FP8 policy, act.tp, act.sequence_parallel;
/// act.micro_batches is not read: M is).
struct pipeline_options {
  int pp = 1;                                                    ///< K
  int virtual_stages = 1;                                        ///< V
  parallel::schedule_kind schedule = parallel::schedule_kind::one_f_one_b;
  std::int64_t micro_batches = 1;                                ///< M
  std::vector<std::int64_t> stage_blocks{};                      ///< K V entries, or empty
  activation_options act{};                                      ///< B, T, checkpointing, tp, sp
};

/// One model chunk of a pipeline rank (one virtual stage).
struct pipeline_chunk_plan {
  int chunk = 0;           ///< c, this rank's chunk index
  int virtual_stage = 0;   ///< v = c K + k
  nn::stage_range range;   ///< its blocks, embedding and head (parallel::partition_stages)
  std::int64_t params = 0; ///< real parameters of its segments (the tp rank's), no padding
  /// ZeRO-3: parameter bytes (param_type) of the segments its engine holds
  /// gathered at once at its most (file comment); 0 under ZeRO-0..2.
  std::uint64_t gathered = 0;
  /// Saved activations of ONE micro-batch from forward to backward: exactly
  /// nn::llama::record_bytes(B, T) of the chunk's model: each block's record
  /// (or, checkpointed, its (rows, H) input), the (B, T) int32 ids on the
  /// embedding's stage, the head's (rows, H) act_grad_type input gradient on
  /// the head's stage, else the (rows, H) param_type stage output.
  std::uint64_t saved = 0;
  /// Held by a split backward between its B and W: the blocks'
  /// nn::block_bytes::weight_pending(N), plus on the embedding's stage its
  /// (B, T) ids and the (rows, H) act_grad_type gradient of its output,
  /// which W scatters.
  std::uint64_t weight_pending = 0;
  /// Bytes of one boundary message, (rows, H) elements: the activation sent
  /// forward (param size) and the gradient sent backward (act_grad size).
  std::uint64_t act_message = 0, grad_message = 0;
  double flops_per_token = 0;           ///< training FLOPs per token (the bubble's costs)
  std::int64_t peak_in_flight = 0;      ///< parallel::peak_in_flight of the rank's list, this chunk
};

/// One pipeline rank k: its chunks and its totals per step.
struct pipeline_stage_plan {
  int stage = 0;                          ///< k in [0, K)
  std::vector<pipeline_chunk_plan> chunks;  ///< V chunks, c = 0..V-1
  std::int64_t params = 0;                ///< real parameters of its chunks
  /// params x param size: each chunk's ceil(params / dp) shard under ZeRO-3.
  std::uint64_t weights = 0;
  std::uint64_t grads = 0;                ///< params x grad size (a dp shard under ZeRO-2/3)
  std::uint64_t master = 0;               ///< master copy (a dp shard under ZeRO-1..3), 0 without
  std::uint64_t optimizer = 0;            ///< optimizer moments (a dp shard under ZeRO-1..3)
  /// ZeRO-3 transient (not in model_state()): the largest of its chunks'
  /// `gathered`, param_type bytes held only inside a forward or backward
  /// action (file comment); 0 under ZeRO-0..2.
  std::uint64_t gathered = 0;
  /// ZeRO-2/3 transient (not in model_state()): the chunks' bucket gradient
  /// buffers, held through the step's accumulation window (a pipeline
  /// reduces once per step): params in grad_type, plus params in the
  /// reduce type when the two differ (bf16 gradients reduced in float32;
  /// plan/state.hpp's reduce_staging, without its bucket padding; a bound
  /// for GPipe's last stage, whose head, fused with its forward, may finish
  /// its reduction before the blocks' buckets open); 0 under ZeRO-0/1,
  /// whose gradient is `grads`.
  std::uint64_t reduce_staging = 0;
  /// Micro-batches in flight at once over all chunks (parallel::peak_in_flight).
  std::int64_t peak_in_flight = 0;
  std::uint64_t peak_record_bytes = 0;      ///< the records' running sum at its most (file comment)
  std::uint64_t peak_activation_bytes = 0;  ///< records + message buffers at their most (file comment)
  std::uint64_t p2p_bytes = 0;            ///< bytes this rank sends per step (send_forward/backward)
  std::int64_t sends = 0;                 ///< messages it sends per step
  double busy = 0;                        ///< simulated compute time (FLOPs per token units)
  /// An FP8 policy's state and operand copies for the rank's blocks
  /// (plan_fp8; zero otherwise).
  fp8_plan fp8{};

  /// weights + grads + master + optimizer: what stays allocated between
  /// steps (ZeRO's model-state formula; the gathered segments are not in it).
  std::uint64_t model_state() const { return weights + grads + master + optimizer; }
  /// model_state() + gathered + reduce_staging + peak_activation_bytes +
  /// fp8.total(): the rank's peak as this plan counts it, each part at its
  /// most (the gathered segments live inside an action, the activation
  /// peak is taken between actions, so the two need not coincide); no
  /// workspaces inside an action.
  std::uint64_t peak() const {
    return model_state() + gathered + reduce_staging + peak_activation_bytes + fp8.total();
  }
};

/// The plan of a pipelined step.
struct pipeline_plan {
  parallel::schedule_kind schedule = parallel::schedule_kind::one_f_one_b;
  parallel::pipeline_shape shape{};   ///< K, M, V
  std::int64_t B = 1, T = 0;          ///< micro-batch shape
  std::vector<pipeline_stage_plan> stages;  ///< K ranks
  /// Simulated: 1 - sum(busy) / (K step_time) with FLOP-proportional costs
  /// (file comment: idealised, no communication cost).
  double bubble_fraction = 0;
  /// The closed form of the schedule at equal stage costs (bubble_closed_form).
  double bubble_closed_form = 0;
  double step_time = 0;  ///< simulated step, in training FLOPs per token of one micro-batch row
};

/// The textbook bubble fraction of `kind` with K ranks, M micro-batches and
/// V chunks per rank, every stage costing the same and forward : B : W =
/// 1 : 1 : 1: gpipe and 1f1b (K - 1)/(M + K - 1) (Huang et al. 2019;
/// Narayanan et al. 2021, section 2.2.1); interleaved (K - 1)/(V M + K - 1)
/// (Narayanan et al. 2021, section 2.2.2); zb1 (K - 1)/(3 M + K - 1) when
/// M >= K (Qi et al. 2023, section 3.1: (K - 1)(F + B - W) idle of
/// M (F + B + W) + (K - 1)(F + B - W)), and 1f1b's for M < K. Throws as
/// parallel::check_pipeline.
inline double bubble_closed_form(parallel::schedule_kind kind, parallel::pipeline_shape s) {
  parallel::check_pipeline(kind, s);
  const double K = s.stages, M = static_cast<double>(s.micro_batches), V = s.virtual_stages;
  switch (kind) {
    case parallel::schedule_kind::interleaved:
      return (K - 1) / (V * M + K - 1);
    case parallel::schedule_kind::zero_bubble_h1:
      if (M >= K) return (K - 1) / (3 * M + K - 1);
      [[fallthrough]];
    default:
      return (K - 1) / (M + K - 1);
  }
}

/// The forward, B and W cost of each virtual stage (index v).
struct virtual_stage_costs {
  std::vector<double> forward, backward_input, backward_weight;
};

/// Simulates `lists` (lists[k]: rank k's actions) as parallel::simulate
/// does (non-blocking sends, blocking receives, no message latency), but
/// with the costs of each virtual stage v = c K + k (not divided by V):
/// returns the step time and each rank's busy time. The lists are first
/// checked by parallel::simulate (unit costs), which throws config_error
/// on a malformed list or a deadlock; throws config_error if a cost vector
/// does not hold K V entries.
inline parallel::simulation simulate_stages(const std::vector<std::vector<parallel::action>>& lists,
                                            int virtual_stages, const virtual_stage_costs& cost) {
  using parallel::action_kind;
  const int K = static_cast<int>(lists.size()), V = virtual_stages;
  const parallel::stage_costs unit{};
  (void)parallel::simulate(lists, V, unit);  // validates; throws on deadlock
  const auto KV = static_cast<std::size_t>(K) * static_cast<std::size_t>(V);
  TESSERA_THROW_IF(cost.forward.size() != KV || cost.backward_input.size() != KV ||
                       cost.backward_weight.size() != KV,
                   config_error, "simulate_stages: costs for ", cost.forward.size(),
                   " virtual stages, the pipeline has K V = ", KV);
  std::map<std::tuple<int, std::int64_t, int>, double> sent;  // (dir, m, to) -> when
  std::vector<std::size_t> next(static_cast<std::size_t>(K), 0);
  std::vector<double> clock(static_cast<std::size_t>(K), 0.0);
  parallel::simulation r;
  r.busy.assign(static_cast<std::size_t>(K), 0.0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int k = 0; k < K; ++k) {
      const auto& list = lists[static_cast<std::size_t>(k)];
      std::size_t& i = next[static_cast<std::size_t>(k)];
      double& t = clock[static_cast<std::size_t>(k)];
      for (; i < list.size(); ++i, progressed = true) {
        const parallel::action& a = list[i];
        const int v = a.chunk * K + k;
        const auto u = static_cast<std::size_t>(v);
        double c = 0;
        switch (a.kind) {
          case action_kind::send_forward:
            sent[{0, a.micro_batch, v + 1}] = t;
            continue;
          case action_kind::send_backward:
            sent[{1, a.micro_batch, v - 1}] = t;
            continue;
          case action_kind::recv_forward:
          case action_kind::recv_backward: {
            const auto it = sent.find({a.kind == action_kind::recv_forward ? 0 : 1, a.micro_batch, v});
            if (it == sent.end()) goto blocked;
            t = std::max(t, it->second);
            continue;
          }
          case action_kind::forward:
            c = cost.forward[u];
            break;
          case action_kind::backward:
            c = cost.backward_input[u] + cost.backward_weight[u];
            break;
          case action_kind::backward_input:
            c = cost.backward_input[u];
            break;
          case action_kind::backward_weight:
            c = cost.backward_weight[u];
            break;
          default:
            continue;
        }
        t += c;
        r.busy[static_cast<std::size_t>(k)] += c;
      }
    blocked:;
    }
  }
  double sum = 0;
  for (int k = 0; k < K; ++k) {
    r.step_time = std::max(r.step_time, clock[static_cast<std::size_t>(k)]);
    sum += r.busy[static_cast<std::size_t>(k)];
  }
  for (int k = 0; k < K; ++k) r.idle.push_back(r.step_time - r.busy[static_cast<std::size_t>(k)]);
  r.bubble_fraction = r.step_time > 0 ? 1 - sum / (K * r.step_time) : 0;
  return r;
}

namespace detail {

// nn::block_bytes of one block as the tp rank's transformer_block::bytes()
// reports it (plan_activations' adjustment), with rows_div = tp under
// sequence parallelism.
inline nn::block_bytes pipeline_block_bytes(const nn::llama_config& c, const dtype_sizes& d,
                                            int tp, bool sp) {
  nn::block_bytes bb = nn::block_bytes::of(c, static_cast<std::int64_t>(d.param),
                                           static_cast<std::int64_t>(d.act_grad),
                                           static_cast<std::int64_t>(d.accum));
  const int kv_rep = nn::kv_replicas(c, tp);
  bb.Hq /= tp;
  bb.KV = kv_rep > 1 ? c.head_dim() : bb.KV / tp;
  bb.F /= tp;
  bb.nh /= tp;
  bb.grad = static_cast<std::int64_t>(d.grad);
  bb.kv_scratch = kv_rep > 1 ? bb.KV * c.dim : 0;
  if (sp) bb.rows_div = tp;
  return bb;
}

// The first and last segment of `r` (-1: the embedding, L: the final norm and head).
inline std::pair<std::int64_t, std::int64_t> stage_segments(const nn::stage_range& r,
                                                            std::int64_t L) {
  return {r.embedding ? -1 : r.first_block, r.head ? L : r.last_block - 1};
}

// Real parameters of segments first..last in `layout` (boundaries `segs`,
// llama_segments: entry i is segment i - 1).
inline std::int64_t segment_params(const nn::param_layout& layout,
                                   const std::vector<parallel::segment_range>& segs,
                                   std::int64_t first, std::int64_t last) {
  const std::int64_t lo = segs[static_cast<std::size_t>(first + 1)].begin,
                     hi = segs[static_cast<std::size_t>(last + 1)].end;
  std::int64_t n = 0;
  for (const auto& e : layout.entries())
    if (e.offset >= lo && e.offset < hi) n += e.numel;
  return n;
}

// The ranges (whole tensors, with their shapes) of the segments of `r`.
inline std::vector<nn::param_range> stage_ranges(const nn::param_layout& layout,
                                                 const std::vector<parallel::segment_range>& segs,
                                                 const nn::stage_range& r, std::int64_t L) {
  const auto [first, last] = stage_segments(r, L);
  const std::int64_t lo = segs[static_cast<std::size_t>(first + 1)].begin,
                     hi = segs[static_cast<std::size_t>(last + 1)].end;
  std::vector<nn::param_range> out;
  for (const auto& e : layout.entries())
    if (e.offset >= lo && e.offset < hi) out.push_back(e.range());
  return out;
}

// Real parameters of the segments of `r`.
inline std::int64_t stage_params(const nn::param_layout& layout,
                                 const std::vector<parallel::segment_range>& segs,
                                 const nn::stage_range& r, std::int64_t L) {
  const auto [first, last] = stage_segments(r, L);
  return segment_params(layout, segs, first, last);
}

// ZeRO-3: the most real parameters of `r`'s segments gathered at once (the
// file comment): with prefetch the largest adjacent pair, without it the
// largest segment.
inline std::int64_t gathered_params(const nn::param_layout& layout,
                                    const std::vector<parallel::segment_range>& segs,
                                    const nn::stage_range& r, std::int64_t L, bool prefetch) {
  const auto [first, last] = stage_segments(r, L);
  std::int64_t most = 0;
  for (std::int64_t s = first; s <= last; ++s)
    most = std::max(most, segment_params(layout, segs, s, prefetch && s < last ? s + 1 : s));
  return most;
}

}  // namespace detail

/// Plans one step of train::trainer's pipeline (file comment) for model
/// `c` with sizes `d`, optimizer `o` and data parallelism `sh` (dp, zero
/// 0-3, prefetch under zero 3, tp and tp_rank; the other fields unused),
/// pipeline `p`. Returns one pipeline_stage_plan per rank k = 0..K-1. Preconditions and throws
/// (config_error naming the value): a valid config and checkpointing policy;
/// B >= 1, 1 <= T <= max_seq; parallel::check_pipeline(p.schedule, {K, M,
/// V}, L); a stage_blocks list as parallel::partition_stages takes it; a
/// valid sharding, prefetch <= 1 under zero 3 (the engine prefetches one
/// segment or none); act.tp == sh.tp, nn::check_tensor_parallel
/// and, with sequence parallelism, nn::check_sequence_parallel; under an
/// FP8 policy a valid recipe (act.model.fp8).
inline pipeline_plan plan_pipeline(const nn::llama_config& c, const dtype_sizes& d,
                                   const optimizer_spec& o, const sharding& sh,
                                   const pipeline_options& p) {
  using parallel::action_kind;
  c.validate();
  sh.validate();
  const activation_options& a = p.act;
  a.model.checkpointing.validate();
  const std::int64_t B = a.micro_batch, S = a.seq > 0 ? a.seq : c.max_seq;
  TESSERA_THROW_IF(B < 1, config_error, "micro-batch B=", B, " must be >= 1");
  TESSERA_THROW_IF(S > c.max_seq, config_error, "sequence length T=", S,
                   " exceeds the model's max_seq=", c.max_seq);
  if (a.cp > 1)
    nn::check_context_parallel(a.cp_kind, a.cp, S, c.n_heads / a.tp,
                               std::max<std::int64_t>(1, c.n_kv_heads / a.tp));
  const std::int64_t T = S / a.cp;  // a rank's tokens of each sequence (context parallelism)
  TESSERA_THROW_IF(sh.zero >= 3 && sh.prefetch > 1, config_error, "prefetch=", sh.prefetch,
                   ": parallel::data_parallel prefetches one segment or none (0 or 1)");
  TESSERA_THROW_IF(a.tp != sh.tp, config_error, "pipeline plan: activation tp=", a.tp,
                   " differs from the sharding's tp=", sh.tp);
  nn::check_tensor_parallel(c, a.tp);
  if (a.sequence_parallel) nn::check_sequence_parallel(T, a.tp);
  const int K = p.pp, V = p.virtual_stages;
  const parallel::pipeline_shape shape{K, p.micro_batches, V};
  parallel::check_pipeline(p.schedule, shape, c.n_layers);
  const std::vector<nn::stage_range> ranges =
      parallel::partition_stages(c, T, K * V, p.stage_blocks);

  const std::int64_t N = B * T, H = c.dim, L = c.n_layers;
  const std::int64_t R = a.sequence_parallel ? N / a.tp : N;  // residual (and boundary) rows
  const auto u = [](std::int64_t x) { return static_cast<std::uint64_t>(x); };
  const nn::block_bytes bb = detail::pipeline_block_bytes(c, d, a.tp, a.sequence_parallel);
  const nn::param_layout layout = nn::make_llama_layout(c, {sh.tp, sh.tp_rank});
  const auto segs = llama_segments(c, {sh.tp, sh.tp_rank});
  // Tied embeddings: the last stage (the head without the embedding) holds
  // the embedding's copy for its head, counted there too (nn::tied_head).
  const nn::param_layout copy_layout =
      nn::make_llama_layout(c, {sh.tp, sh.tp_rank}, nn::tied_head::copy);
  const auto copy_segs = llama_segments(c, {sh.tp, sh.tp_rank}, nn::tied_head::copy);
  const double fb = parallel::block_flops_per_token(c, T), fh = parallel::head_flops_per_token(c);
  const auto ceil_dp = [&](std::int64_t n) { return u((n + sh.dp - 1) / sh.dp); };

  pipeline_plan plan;
  plan.schedule = p.schedule;
  plan.shape = shape;
  plan.B = B;
  plan.T = T;
  std::vector<std::vector<parallel::action>> lists;
  virtual_stage_costs costs;
  costs.forward.resize(static_cast<std::size_t>(K * V));
  costs.backward_input = costs.backward_weight = costs.forward;
  for (int k = 0; k < K; ++k) {
    lists.push_back(parallel::make_schedule(p.schedule, k, shape));
    const auto& list = lists.back();
    pipeline_stage_plan st;
    st.stage = k;
    for (int ch = 0; ch < V; ++ch) {
      pipeline_chunk_plan cp;
      cp.chunk = ch;
      cp.virtual_stage = ch * K + k;
      cp.range = ranges[static_cast<std::size_t>(cp.virtual_stage)];
      const bool copy = cp.range.head && !cp.range.embedding;
      const nn::param_layout& lay = copy ? copy_layout : layout;
      const auto& sg = copy ? copy_segs : segs;
      cp.params = detail::stage_params(lay, sg, cp.range, L);
      if (sh.zero >= 3)
        cp.gathered = u(detail::gathered_params(lay, sg, cp.range, L, sh.prefetch > 0)) * d.param;
      std::uint64_t saved = 0, pending = 0;
      for (std::int64_t l = cp.range.first_block; l < cp.range.last_block; ++l) {
        saved += u(a.model.checkpointing.recomputes(l) ? bb.input(N) : bb.record(N));
        pending += u(bb.weight_pending(N));
      }
      if (cp.range.embedding) {
        const auto ids = u(nn::embedding_record<host>::bytes(N));
        saved += ids;
        pending += ids + u(R * H) * d.act_grad;
      }
      saved += cp.range.head ? u(R * H) * d.act_grad : u(R * H) * d.param;
      cp.saved = saved;
      cp.weight_pending = pending;
      cp.act_message = u(R * H) * d.param;
      cp.grad_message = u(R * H) * d.act_grad;
      const double blocks = static_cast<double>(cp.range.last_block - cp.range.first_block);
      cp.flops_per_token = blocks * fb + (cp.range.head ? fh : 0.0);
      cp.peak_in_flight = parallel::peak_in_flight(list, ch);
      const auto v = static_cast<std::size_t>(cp.virtual_stage);
      costs.forward[v] = costs.backward_input[v] = costs.backward_weight[v] =
          cp.flops_per_token / 3;
      st.params += cp.params;
      st.weights += (sh.zero >= 3 ? ceil_dp(cp.params) : u(cp.params)) * d.param;
      st.gathered = std::max(st.gathered, cp.gathered);
      st.grads += (sh.zero >= 2 ? ceil_dp(cp.params) : u(cp.params)) * d.grad;
      if (sh.zero >= 2)
        st.reduce_staging += u(cp.params) * (d.grad + (d.grad == d.reduce ? 0 : d.reduce));
      const std::uint64_t opt_elems = sh.zero >= 1 ? ceil_dp(cp.params) : u(cp.params);
      st.master += d.master_copy ? opt_elems * d.master : 0;
      st.optimizer += opt_elems * d.master * static_cast<std::uint64_t>(o.moments);
      // Adafactor's statistics of the chunk's tensors (whole on every dp
      // rank; under ZeRO a bound: a rank keeps those it holds a piece of)
      // and its exchange over tp (this plan has no buckets: not the dp
      // exchange of the tensors a ZeRO chunk splits, plan_state counts it).
      if (o.factored)
        st.optimizer +=
            adafactor_state_bytes(detail::stage_ranges(layout, segs, cp.range, L), d.master, sh.tp)
                .statistics;
      if (o.orthogonalised) {  // Muon's AdamW second moment and scratch of the chunk's tensors
        const muon_bytes mb =
            muon_state_bytes(detail::stage_ranges(layout, segs, cp.range, L), d.master, sh.tp);
        // Under ZeRO over dp > 1: this rank's share of the AdamW elements,
        // and a bucket gathered whole, at least the chunk's largest block
        // (buckets hold whole segments; this plan has no bucket padding).
        const bool pieces = sh.zero >= 1 && sh.dp > 1;
        std::int64_t block = 0;
        if (pieces)
          for (const auto& sgm : segs)
            if (sgm.id >= static_cast<int>(cp.range.first_block) &&
                sgm.id < static_cast<int>(cp.range.last_block))
              block = std::max(block, sgm.end - sgm.begin);
        st.optimizer +=
            ((pieces ? ceil_dp(static_cast<std::int64_t>(mb.adamw_elems)) : mb.adamw_elems) +
             mb.scratch_elems + u(block)) *
            d.master;
      }
      st.chunks.push_back(cp);
    }
    st.peak_in_flight = parallel::peak_in_flight(list);
    std::int64_t blocks = 0;
    for (const pipeline_chunk_plan& cp : st.chunks)
      blocks += cp.range.last_block - cp.range.first_block;
    st.fp8 = plan_fp8(c, d, a, {sh.tp, sh.tp_rank}, blocks);
    // The two walks of the file comment.
    std::int64_t records = 0, held = 0;
    const int last = K * V - 1;
    for (const parallel::action& x : list) {
      const pipeline_chunk_plan& cp = st.chunks[static_cast<std::size_t>(x.chunk)];
      const int v = cp.virtual_stage;
      const auto saved = static_cast<std::int64_t>(cp.saved),
                 pend = static_cast<std::int64_t>(cp.weight_pending),
                 am = static_cast<std::int64_t>(cp.act_message),
                 gm = static_cast<std::int64_t>(cp.grad_message);
      const std::int64_t out = cp.range.head ? 0 : am;  // the stage output, sent after forward
      switch (x.kind) {
        case action_kind::recv_forward:
          held += am;
          break;
        case action_kind::forward:
          records += saved;
          held += saved - (v > 0 ? am : 0);
          break;
        case action_kind::send_forward:
          held -= am;
          st.p2p_bytes += cp.act_message;
          ++st.sends;
          break;
        case action_kind::recv_backward:
          held += gm;
          break;
        case action_kind::backward:
        case action_kind::backward_input: {
          const std::int64_t keep = x.kind == action_kind::backward ? 0 : pend;
          records += keep - saved;
          held += keep - (saved - out) + (v > 0 ? gm : 0) - (v < last ? gm : 0);
          break;
        }
        case action_kind::backward_weight:
          records -= pend;
          held -= pend;
          break;
        case action_kind::send_backward:
          held -= gm;
          st.p2p_bytes += cp.grad_message;
          ++st.sends;
          break;
        default:
          break;
      }
      st.peak_record_bytes = std::max(st.peak_record_bytes, u(records));
      st.peak_activation_bytes = std::max(st.peak_activation_bytes, u(held));
    }
    TESSERA_EXPECTS(records == 0 && held == 0, "pipeline plan: a walk does not return to 0");
    plan.stages.push_back(std::move(st));
  }
  const parallel::simulation sim = simulate_stages(lists, V, costs);
  for (int k = 0; k < K; ++k) plan.stages[static_cast<std::size_t>(k)].busy = sim.busy[static_cast<std::size_t>(k)];
  plan.step_time = sim.step_time;
  plan.bubble_fraction = sim.bubble_fraction;
  plan.bubble_closed_form = bubble_closed_form(p.schedule, shape);
  return plan;
}

}  // namespace tessera::plan
