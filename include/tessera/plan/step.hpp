#pragma once
/// \file plan/step.hpp
/// Per-step costs of a data-parallel training step (DESIGN.md, principle 5):
/// model FLOPs (nn::flops_per_token, and seeds/003-004's 6ND), MFU from a
/// step time and a peak, and the bytes one rank sends per optimizer step for
/// ZeRO stages 0..3 with the ring algorithm (comm/communicator.hpp).
///
/// Communication per optimizer step, Psi = flat gradient elements, N = dp,
/// k = micro-batches per rank per step (gradient accumulation), two
/// accountings (plan/state.hpp, `accounting`):
///
/// engine (default for a llama_config): what parallel::data_parallel sends
/// (parallel/zero.hpp; train::trainer runs it), over the buckets of
/// engine_buckets() (each padded to N equal chunks, P_k elements; P_head the
/// head segment's), reduced once per optimizer step whatever k is (no_sync
/// on the first k-1 micro-batches):
///
///   zero 0    all_reduce each bucket                 sum_k 2(N-1)/N P_k, reduction dtype
///   zero 1,2  reduce_scatter each bucket once        sum_k (N-1)/N P_k, reduction dtype
///             all_gather the updated shard once      sum_k (N-1)/N P_k, parameter dtype
///   zero 3    reduce_scatter each segment once       (N-1)/N Psi_pad, reduction dtype
///             all_gather each segment before forward, every micro-batch:
///                                                    k (N-1)/N Psi_pad, parameter dtype
///             and again before backward, except the head (its forward and
///             backward are one fused pass): k (N-1)/N (Psi_pad - P_head)
///   every     three 1-element 8-byte all_reduces (scored tokens, gradient
///             norm, loss) of the trainer
///   zero 1..3 with comm_options::factored_sums (optim::adafactor): two
///             float64 all_gathers of the sums of the tensors the chunks
///             split, rows + cols + 1 a matrix (1 a vector), then 1 each
///
/// With parameter dtype == reduction dtype and k = 1, zero 1 and 2 send what
/// zero 0 sends and zero 3 1.5 times it less the head's second gather
/// (within 1% for 7B, 2% for the `small` preset).
///
/// ideal (the bare element-count overload; ZeRO paper, Rajbhandari et al.
/// 2020, section 7), one flat buffer padded to a multiple of N, as a
/// textbook ZeRO with sharded gradient buffers must run it:
///
///   zero 0  all_reduce(gradients)                  2(N-1)/N Psi, reduction dtype
///   zero 1  reduce_scatter(gradients) once         (N-1)/N Psi, reduction dtype
///           all_gather(updated parameters) once    (N-1)/N Psi, parameter dtype
///   zero 2  as zero 1, but the reduce_scatter runs every micro-batch (the
///           gradient is a shard: it cannot accumulate unreduced), k times
///   zero 3  all_gather(parameters) for forward and again for backward, and
///           reduce_scatter(gradients), every micro-batch: 3(N-1)/N Psi per
///           micro-batch when the dtypes match
///
/// With parameter dtype == reduction dtype and k = 1, ideal zero 1 and 2
/// equal zero 0's 2(N-1)/N Psi bytes and zero 3 is 1.5 times it (seeds/004,
/// section 5).

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/context_parallel.hpp"
#include "tessera/nn/flops.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/plan/memory.hpp"

namespace tessera::plan {

/// One collective of the step, as rank `rank` sees it.
struct collective_traffic {
  comm::op_kind op = comm::op_kind::all_reduce;  ///< the collective
  std::string what;                              ///< "gradients", "parameters (forward)", ...
  /// Elements per call: all_reduce, n; reduce_scatter / all_gather, the
  /// chunk per rank (engine: summed over the buckets of one pass).
  std::int64_t elems = 0;
  std::size_t elem_bytes = 0;  ///< bytes per element on the wire
  std::int64_t calls = 0;      ///< calls per optimizer step
  std::uint64_t bytes_sent =
      0;  ///< bytes this rank sends per optimizer step, all calls (ring formulas)
  /// Bytes this rank sends per optimizer step.
  std::uint64_t bytes() const { return bytes_sent; }
};

/// Communication options: wire dtypes and accumulation.
struct comm_options {
  std::size_t reduce_bytes = 4;    ///< gradient reduction dtype (float32 by default)
  std::size_t param_bytes = 2;     ///< parameter all-gather dtype (bf16 by default)
  std::int64_t micro_batches = 1;  ///< k, micro-batches per rank per optimizer step
  int rank =
      0;  ///< the rank whose bytes are counted (all_reduce is uneven when N does not divide n)
  /// The optimizer sums its per-tensor statistics over dp where a ZeRO
  /// chunk splits a tensor (optim::adafactor, optimizer_spec::factored):
  /// under ZeRO 1..3 over dp > 1, two float64 all-gathers a step of the
  /// split tensors' sums (rows + cols + 1 a matrix, 1 a vector; then 1
  /// each: plan::split_ranges). Engine accounting only.
  bool factored_sums = false;
};

/// Bytes one rank sends per optimizer step.
struct comm_plan {
  int zero = 0;                                 ///< ZeRO stage
  int dp = 1;                                   ///< ranks
  accounting mode = accounting::ideal;          ///< how it was counted
  std::vector<collective_traffic> collectives;  ///< in step order
  /// Sum over collectives.
  std::uint64_t bytes_per_step() const {
    std::uint64_t b = 0;
    for (const auto& c : collectives) b += c.bytes();
    return b;
  }
};

namespace detail {
inline void check_comm_args(const sharding& sh, const comm_options& o) {
  sh.validate();
  TESSERA_THROW_IF(o.micro_batches < 1, config_error, "micro_batches=", o.micro_batches,
                   " must be >= 1");
  TESSERA_THROW_IF(o.rank < 0 || o.rank >= sh.dp, config_error, "rank=", o.rank,
                   " is outside [0, dp=", sh.dp, ")");
}
}  // namespace detail

/// Communication of one optimizer step over a flat buffer of `flat_elems`
/// elements, ideal accounting (one buffer padded to a multiple of dp for the
/// sharded collectives; file comment). Throws config_error for an invalid
/// sharding, flat_elems < 1, micro_batches < 1 or a rank outside [0, dp).
inline comm_plan plan_comm(std::int64_t flat_elems, const sharding& sh,
                           const comm_options& o = {}) {
  detail::check_comm_args(sh, o);
  TESSERA_THROW_IF(flat_elems < 1, config_error, "flat_elems=", flat_elems, " must be >= 1");
  comm_plan p{sh.zero, sh.dp, accounting::ideal, {}};
  const int N = sh.dp;
  const auto n = static_cast<std::size_t>(flat_elems);
  const std::size_t chunk = comm::padded_count(n, N) / static_cast<std::size_t>(N);
  const std::int64_t k = o.micro_batches;
  auto scatter_gather = [&](comm::op_kind op, const char* what, std::size_t eb,
                            std::int64_t calls) {
    p.collectives.push_back(
        {op, what, static_cast<std::int64_t>(chunk), eb, calls,
         static_cast<std::uint64_t>(calls) * comm::ring_scatter_gather_bytes(chunk, eb, N)});
  };
  using comm::op_kind;
  switch (sh.zero) {
    case 0:
      p.collectives.push_back({op_kind::all_reduce, "gradients", flat_elems, o.reduce_bytes, 1,
                               comm::ring_all_reduce_bytes(n, o.reduce_bytes, N, o.rank)});
      break;
    case 1:
    case 2:
      scatter_gather(op_kind::reduce_scatter, "gradients", o.reduce_bytes, sh.zero == 1 ? 1 : k);
      scatter_gather(op_kind::all_gather, "parameters", o.param_bytes, 1);
      break;
    default:
      scatter_gather(op_kind::all_gather, "parameters (forward)", o.param_bytes, k);
      scatter_gather(op_kind::all_gather, "parameters (backward)", o.param_bytes, k);
      scatter_gather(op_kind::reduce_scatter, "gradients", o.reduce_bytes, k);
      break;
  }
  return p;
}

/// Communication of one optimizer step of `c` (flat buffer of
/// nn::make_llama_layout(c), alignment padding included) for rank o.rank,
/// under `mode` (file comment; default: what parallel::data_parallel
/// sends, over engine_buckets(c, sh, o.reduce_bytes)).
/// Throws config_error as the element-count overload.
inline comm_plan plan_comm(const nn::llama_config& c, const sharding& sh,
                           const comm_options& o = {}, accounting mode = accounting::engine) {
  if (mode == accounting::ideal) return plan_comm(nn::make_llama_layout(c).total(), sh, o);
  detail::check_comm_args(sh, o);
  const parallel::bucket_plan bp = engine_buckets(c, sh, o.reduce_bytes, o.rank);
  const int N = sh.dp;
  const std::int64_t k = o.micro_batches, nb = static_cast<std::int64_t>(bp.size());
  comm_plan p{sh.zero, N, accounting::engine, {}};
  std::int64_t chunks = 0, padded = 0, head_chunk = 0;
  std::uint64_t all_reduce = 0;
  for (const parallel::bucket& b : bp.buckets()) {
    chunks += b.chunk;
    padded += b.padded;
    all_reduce +=
        comm::ring_all_reduce_bytes(static_cast<std::size_t>(b.padded), o.reduce_bytes, N, o.rank);
    if (b.last_segment == static_cast<int>(c.n_layers)) head_chunk = b.chunk;
  }
  auto sg = [&](std::int64_t chunk, std::size_t eb) {  // one pass over chunks summing to `chunk`
    return comm::ring_scatter_gather_bytes(static_cast<std::size_t>(chunk), eb, N);
  };
  using comm::op_kind;
  p.collectives.push_back({op_kind::all_reduce, "scalars (tokens, norm, loss)", 1, 8, 3,
                           3 * comm::ring_all_reduce_bytes(1, 8, N, o.rank)});
  switch (sh.zero) {
    case 0:
      p.collectives.push_back(
          {op_kind::all_reduce, "gradients", padded, o.reduce_bytes, nb, all_reduce});
      break;
    case 1:
    case 2: {
      // Reduced per micro-batch (zero<2>): every micro-batch's buckets.
      const std::int64_t passes = sh.per_micro_batch ? k : 1;
      p.collectives.push_back({op_kind::reduce_scatter, "gradients", chunks, o.reduce_bytes,
                               passes * nb,
                               static_cast<std::uint64_t>(passes) * sg(chunks, o.reduce_bytes)});
      p.collectives.push_back({op_kind::all_gather, "parameters", chunks, o.param_bytes, nb,
                               sg(chunks, o.param_bytes)});
      break;
    }
    default:
      p.collectives.push_back({op_kind::all_gather, "parameters (forward)", chunks, o.param_bytes,
                               k * nb, static_cast<std::uint64_t>(k) * sg(chunks, o.param_bytes)});
      p.collectives.push_back(
          {op_kind::all_gather, "parameters (backward)", chunks - head_chunk, o.param_bytes,
           k * (nb - 1), static_cast<std::uint64_t>(k) * sg(chunks - head_chunk, o.param_bytes)});
      {
        const std::int64_t passes = sh.per_micro_batch ? k : 1;
        p.collectives.push_back({op_kind::reduce_scatter, "gradients", chunks, o.reduce_bytes,
                                 passes * nb,
                                 static_cast<std::uint64_t>(passes) * sg(chunks, o.reduce_bytes)});
      }
      break;
  }
  if (o.factored_sums && sh.zero >= 1 && N > 1) {
    std::int64_t sums = 0, tensors = 0;
    for (const nn::param_range& r :
         split_ranges(bp, nn::make_llama_layout(c, {sh.tp, sh.tp_rank}).ranges())) {
      const std::int64_t R = r.split >= 0 ? r.full_rows : r.rows,
                         C = r.split >= 0 ? r.full_cols : r.cols;
      sums += r.dims >= 2 ? R + C + 1 : 1;
      ++tensors;
    }
    if (tensors > 0) {
      p.collectives.push_back(
          {op_kind::all_gather, "optimizer sums (rows, columns, p^2)", sums, 8, 1, sg(sums, 8)});
      p.collectives.push_back(
          {op_kind::all_gather, "optimizer sums (u^2)", tensors, 8, 1, sg(tensors, 8)});
    }
  }
  return p;
}

/// Element sizes and settings the tensor-parallel traffic depends on.
struct tp_traffic {
  std::size_t act = 4;          ///< bytes per activation element the forward collectives move
  std::size_t act_grad = 4;     ///< bytes per activation-gradient element (the backward's)
  std::size_t accum = 4;        ///< bytes per element of the cross-entropy's row statistics
  std::size_t grad = 4;         ///< bytes per parameter-gradient element (norm gains, wk, wv)
  std::int64_t ce_chunk = 256;  ///< token rows per LM-head chunk
  nn::checkpoint_policy checkpointing = {};  ///< recomputed blocks reduce their forward again
  bool sequence_parallel = false;            ///< all-gathers and reduce-scatters (Korthikanti)
};

/// Bytes one tp rank sends on its tp group in one optimizer step (ring
/// traffic, comm::ring_all_reduce_bytes and ring_scatter_gather_bytes;
/// seeds/004), per micro-batch of N = B T rows (M = N H elements):
/// - without sequence parallelism, all-reduces of M elements: forward two
///   per block (after the attention output and the down projections:
///   Megatron-LM's g), one more per block activation checkpointing
///   recomputes (its attention output's; the recompute stops before the
///   down projection), one for the vocabulary-parallel embedding; backward two
///   per block (the input gradients of q/k/v and of gate/up: Megatron-LM's
///   f), one for the LM head's input gradient;
/// - with sequence parallelism, all-gathers and reduce-scatters of M/tp
///   elements per rank instead: forward per block an all-gather before q/k/v
///   and gate/up and a reduce-scatter after the attention output and down
///   projections (a recomputed block gathers both norm outputs and
///   reduce-scatters the attention output again), a reduce-scatter for the
///   embedding and an all-gather before the LM head; backward per block
///   two all-gathers of the residual gradient, two of the norm outputs
///   again (activation elements) and two reduce-scatters of the norms'
///   input gradients, a reduce-scatter of the LM head's input gradient and
///   an all-gather for the embedding's; and all-reduces of H gain
///   gradients, two per block and one for the final norm;
/// - the vocabulary-parallel cross-entropy, per chunk of c rows: the row
///   maxima (c) and the sums of exponentials with the target logits (2c);
/// and once per step the gradient norm's double. 0 when tp = 1. Throws
/// config_error for a size < 1, rank outside [0, tp), or with sequence
/// parallelism as nn::check_sequence_parallel (tp 1, or T not divisible by tp).
inline std::uint64_t plan_tp_bytes(const nn::llama_config& c, std::int64_t micro_batch,
                                   std::int64_t seq, std::int64_t micro_batches, int tp, int rank,
                                   const tp_traffic& t = {}) {
  TESSERA_THROW_IF(micro_batch < 1 || seq < 1 || micro_batches < 1 || tp < 1 || t.ce_chunk < 1,
                   config_error, "plan_tp_bytes: B=", micro_batch, " T=", seq,
                   " micro_batches=", micro_batches, " tp=", tp, " ce_chunk=", t.ce_chunk,
                   " must all be >= 1");
  TESSERA_THROW_IF(rank < 0 || rank >= tp, config_error, "plan_tp_bytes: rank ", rank,
                   " is not in [0, ", tp, ")");
  if (t.sequence_parallel) nn::check_sequence_parallel(seq, tp);
  if (tp == 1) return 0;
  const std::int64_t N = micro_batch * seq;
  const auto nh = static_cast<std::size_t>(N * c.dim);
  auto ring = [&](std::size_t n, std::size_t elem) {
    return comm::ring_all_reduce_bytes(n, elem, tp, rank);
  };
  auto sg = [&](std::size_t elem) {  // one all-gather or reduce-scatter of this rank's rows
    return comm::ring_scatter_gather_bytes(nh / static_cast<std::size_t>(tp), elem, tp);
  };
  const auto L = static_cast<std::uint64_t>(c.n_layers);
  const auto recomputed = static_cast<std::uint64_t>(t.checkpointing.recomputed_blocks(c.n_layers));
  std::uint64_t per_mb = 0;
  if (!t.sequence_parallel) {
    per_mb = (2 * L + recomputed + 1) * ring(nh, t.act) + (2 * L + 1) * ring(nh, t.act_grad);
  } else {
    const auto H = static_cast<std::size_t>(c.dim);
    per_mb = (4 * L + 3 * recomputed + 2) * sg(t.act)  // forward, with the recompute
             + 2 * L * sg(t.act)                       // norm outputs gathered again
             + (4 * L + 2) * sg(t.act_grad)            // residual gradients, norm inputs
             + (2 * L + 1) * ring(H, t.grad);          // the gains' gradients
  }
  const std::int64_t C = std::min(t.ce_chunk, N);
  for (std::int64_t r0 = 0; r0 < N; r0 += C) {
    const auto rows = static_cast<std::size_t>(std::min(C, N - r0));
    per_mb += ring(rows, t.accum) + ring(2 * rows, t.accum);
  }
  return per_mb * static_cast<std::uint64_t>(micro_batches) + ring(1, sizeof(double));
}

/// Element sizes and settings of plan_cp_bytes.
struct cp_traffic {
  std::int64_t param = 4;       ///< bytes of the storage type (q, k, v, the output)
  std::int64_t act_grad = 4;    ///< bytes of the activation-gradient type
  std::int64_t accum = 4;       ///< bytes of accum_t (lse, the ring's dk/dv accumulators)
  std::int64_t param_wire = 4;  ///< bytes a stored element travels in (4 for 16-bit on the host)
  std::int64_t grad_wire = 4;   ///< bytes a gradient element travels in
  bool documents = false;       ///< packed documents (Ulysses gathers the starts)
  nn::checkpoint_policy checkpointing = {};  ///< recomputed blocks run their attention again
};

/// Bytes one rank sends on its cp group in one optimizer step: per
/// micro-batch of B sequences of S tokens and per block, the
/// context-parallel attention's forward and backward
/// (nn::cp_attention_bytes over this rank's heads: nh/tp query heads and
/// nkv/tp key/value heads, or the one replicated when tp > nkv), and one
/// more forward per block activation checkpointing recomputes. 0 when
/// cp = 1. Throws config_error for a size < 1 and as
/// nn::check_context_parallel.
inline std::uint64_t plan_cp_bytes(const nn::llama_config& c, std::int64_t micro_batch,
                                   std::int64_t seq, std::int64_t micro_batches, int cp, int tp,
                                   nn::cp_kind kind, const cp_traffic& t = {}) {
  TESSERA_THROW_IF(micro_batch < 1 || seq < 1 || micro_batches < 1 || cp < 1 || tp < 1,
                   config_error, "plan_cp_bytes: B=", micro_batch, " T=", seq,
                   " micro_batches=", micro_batches, " cp=", cp, " tp=", tp, " must all be >= 1");
  if (cp == 1) return 0;
  nn::check_tensor_parallel(c, tp);
  const std::int64_t nh = c.n_heads / tp, nkv = std::max<std::int64_t>(1, c.n_kv_heads / tp);
  nn::check_context_parallel(kind, cp, seq, nh, nkv);
  nn::cp_attention_bytes b;
  b.kind = kind;
  b.cp = cp;
  b.B = micro_batch;
  b.S = seq;
  b.nh = nh;
  b.nkv = nkv;
  b.hd = c.head_dim();
  b.documents = t.documents;
  b.param = t.param;
  b.act_grad = t.act_grad;
  b.accum = t.accum;
  b.param_wire = t.param_wire;
  b.grad_wire = t.grad_wire;
  const auto L = static_cast<std::uint64_t>(c.n_layers);
  const auto recomputed = static_cast<std::uint64_t>(t.checkpointing.recomputed_blocks(c.n_layers));
  const auto fwd = static_cast<std::uint64_t>(b.forward_sent()),
             bwd = static_cast<std::uint64_t>(b.backward_sent());
  return static_cast<std::uint64_t>(micro_batches) * ((L + recomputed) * fwd + L * bwd);
}

/// Bytes one tp rank sends on its key/value replica group (tp > nkv: the
/// tp/nkv ranks holding the same key/value head) in one optimizer step:
/// per micro-batch and block, the all-reduces of wk's and wv's gradient
/// (hd H elements each, `grad_bytes` per element). 0 when tp <= nkv.
/// Throws config_error as nn::check_tensor_parallel, for micro_batches < 1
/// or rank outside [0, tp).
inline std::uint64_t plan_kv_replica_bytes(const nn::llama_config& c, std::int64_t micro_batches,
                                           int tp, int rank, std::size_t grad_bytes = 4) {
  nn::check_tensor_parallel(c, tp);
  TESSERA_THROW_IF(micro_batches < 1, config_error,
                   "plan_kv_replica_bytes: micro_batches=", micro_batches, " must be >= 1");
  TESSERA_THROW_IF(rank < 0 || rank >= tp, config_error, "plan_kv_replica_bytes: rank ", rank,
                   " is not in [0, ", tp, ")");
  const int rep = nn::kv_replicas(c, tp);
  if (rep == 1) return 0;
  const auto n = static_cast<std::size_t>(c.head_dim() * c.dim);
  return static_cast<std::uint64_t>(micro_batches) * static_cast<std::uint64_t>(c.n_layers) * 2 *
         comm::ring_all_reduce_bytes(n, grad_bytes, rep, rank % rep);
}

/// Model FLOPs of one optimizer step.
struct flops_plan {
  std::int64_t tokens_per_rank = 0;  ///< B T k
  std::int64_t tokens_global = 0;    ///< B T k dp
  double flops_per_token = 0;        ///< nn::flops_per_token(c, T): 6 N_matmul + 6 L H T
  double flops_per_rank = 0;         ///< flops_per_token * tokens_per_rank / tp
  double six_nd = 0;  ///< 6 N D over the global batch (seeds/003, /004; Kaplan et al. 2020)
  /// Model FLOPs utilisation of one rank: flops_per_rank / (step_seconds peak_flops),
  /// peak_flops per device (FLOP/s). 0 when either is not positive.
  double mfu(double step_seconds, double peak_flops) const {
    return step_seconds > 0 && peak_flops > 0 ? flops_per_rank / (step_seconds * peak_flops) : 0.0;
  }
  /// Seconds per step at utilisation `mfu` of `peak_flops` per device.
  double step_seconds(double peak_flops, double mfu) const {
    return flops_per_rank / (peak_flops * mfu);
  }
};

/// FLOPs of one optimizer step: B sequences of T tokens, k micro-batches,
/// dp ranks, each a tp group sharing its tokens (a rank's share of the
/// model FLOPs is 1/tp of its group's, as the trainer's MFU counts it;
/// model FLOPs: key/value projections replicated when tp > nkv count once,
/// as on one rank); under context parallelism each of a sequence's cp ranks
/// computes its T/cp tokens. N
/// in 6ND is llama_config::num_params() (embedding included, as the seeds
/// count it). Throws config_error for a size < 1.
inline flops_plan plan_flops(const nn::llama_config& c, std::int64_t micro_batch, std::int64_t seq,
                             std::int64_t micro_batches = 1, int dp = 1, int tp = 1, int cp = 1) {
  TESSERA_THROW_IF(micro_batch < 1 || seq < 1 || micro_batches < 1 || dp < 1 || tp < 1 || cp < 1,
                   config_error, "plan_flops: B=", micro_batch, " T=", seq,
                   " micro_batches=", micro_batches, " dp=", dp, " tp=", tp, " cp=", cp,
                   " must all be >= 1");
  flops_plan f;
  // a cp rank computes its T/cp tokens (each against the whole sequence's keys)
  f.tokens_per_rank = micro_batch * (seq / cp) * micro_batches;
  f.tokens_global = micro_batch * seq * micro_batches * dp;
  f.flops_per_token = nn::flops_per_token(c, seq);
  f.flops_per_rank = f.flops_per_token * static_cast<double>(f.tokens_per_rank) / tp;
  f.six_nd = 6.0 * static_cast<double>(c.num_params()) * static_cast<double>(f.tokens_global);
  return f;
}

/// The comm plan as JSON: per collective op, what, elems, bytes; and the total.
inline nlohmann::json to_json(const comm_plan& p) {
  nlohmann::json j;
  j["zero"] = p.zero;
  j["dp"] = p.dp;
  j["accounting"] = p.mode == accounting::engine ? "engine" : "ideal";
  j["collectives"] = nlohmann::json::array();
  for (const auto& c : p.collectives)
    j["collectives"].push_back({{"op", comm::to_string(c.op)},
                                {"what", c.what},
                                {"elems", c.elems},
                                {"elem_bytes", c.elem_bytes},
                                {"calls", c.calls},
                                {"bytes", c.bytes()}});
  j["bytes_per_step"] = p.bytes_per_step();
  return j;
}

/// The FLOPs plan as JSON.
inline nlohmann::json to_json(const flops_plan& f) {
  return {{"tokens_per_rank", f.tokens_per_rank},
          {"tokens_global", f.tokens_global},
          {"flops_per_token", f.flops_per_token},
          {"flops_per_rank", f.flops_per_rank},
          {"six_nd", f.six_nd}};
}

/// Fixed-width text: one line per collective, then the total.
inline std::string to_table(const comm_plan& p) {
  std::string s;
  char line[200];
  for (const auto& c : p.collectives) {
    std::snprintf(line, sizeof line, "  %-15s %-29s x%-4lld %16llu B %9.2f GiB\n",
                  comm::to_string(c.op), c.what.c_str(), static_cast<long long>(c.calls),
                  static_cast<unsigned long long>(c.bytes()), static_cast<double>(c.bytes()) / gib);
    s += line;
  }
  std::snprintf(line, sizeof line, "  %-51s %16llu B %9.2f GiB\n", "total sent per rank per step",
                static_cast<unsigned long long>(p.bytes_per_step()),
                static_cast<double>(p.bytes_per_step()) / gib);
  return s + line;
}

}  // namespace tessera::plan
