#pragma once
/// \file plan/memory.hpp
/// The memory planner (DESIGN.md, principle 5, "Every byte is accounted"):
/// per-rank bytes of weights, gradients, master weights, optimizer state,
/// the data-parallel engine's reduction buffers and shards, RoPE tables, the
/// ZeRO-3 gathered blocks, and the activations of one micro-batch, computed
/// from the same parameter layout, buckets and saved set the model and
/// engine really allocate. tests/plan/memory.cpp holds these numbers against
/// a host_memory_resource around a real model and optimizer,
/// tests/parallel/memory.cpp against every rank's resource under the
/// data-parallel trainer.
///
/// Two accountings of the model state (`accounting`):
///
/// - `engine` (the default for a llama_config): what parallel::data_parallel
///   (parallel/zero.hpp) and its trainer allocate on each rank. Buckets come
///   from parallel::bucket_plan (parallel/buckets.hpp), each padded to dp
///   equal chunks of a multiple of parallel::chunk_align elements; a shard is
///   the sum of this rank's chunks. On ZeRO-0/1 the model's gradient buffer
///   is full size and persistent (it sums the accumulation window's
///   micro-batches before the step's one reduction), with a persistent
///   padded staging buffer; ZeRO-1..3 add a reduced-gradient shard and a
///   parameter shard; ZeRO-2/3 keep no full gradient buffer between steps,
///   only each bucket's padded gradient buffer during the accumulation
///   window (a transient); ZeRO-3 keeps no full parameter buffer. tests/parallel/memory.cpp holds these
///   figures against each rank's allocator.
/// - `ideal`: the textbook formula of ZeRO (Rajbhandari et al. 2020, "ZeRO:
///   Memory Optimizations Toward Training Trillion Parameter Models",
///   section 5): stage 1 shards the optimizer state (and master weights),
///   stage 2 also the gradients, stage 3 also the weights; a shard is
///   ceil(flat / dp) elements of the whole flat buffer padded to a multiple
///   of dp; no reduction buffers. seeds/004 ("Where the memory goes",
///   training_memory_gib) is its 16 bytes per parameter special case:
///   dtype_sizes::seed004() with the bare-count plan_state().
///
/// All figures are bytes unless a name says otherwise; GiB = 2^30 bytes.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/cross_entropy.hpp"
#include "tessera/kernels/cuda/launch.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/parallel/buckets.hpp"
#include "tessera/parallel/sharding.hpp"
#include "tessera/precision/policy.hpp"

namespace tessera::plan {

/// Bytes in one GiB (2^30), the unit seeds/004 reports in.
inline constexpr double gib = 1073741824.0;

/// Bytes per element of each buffer kind: the run-time image of a precision
/// policy (precision/policy.hpp), so that a plan can be made for any policy
/// chosen on a command line.
struct dtype_sizes {
  std::string name = "fp32";  ///< for tables and logs
  std::size_t param = 4;      ///< weights and saved activations (param_type)
  std::size_t grad = 4;       ///< parameter gradients (grad_type)
  std::size_t master = 4;     ///< master weights and optimizer moments (master_type)
  std::size_t accum = 4;      ///< rstd, lse, CE logits, attention scratch (accum_type)
  bool master_copy = false;   ///< a master copy is kept: param_type != master_type
  /// Gradient reduction and its staging buffers (parallel::reduce_type_t):
  /// float32 unless the policy is float64.
  std::size_t reduce = 4;
  std::size_t act_grad = 4;   ///< activation gradients (act_grad_type)
  std::size_t rope = 4;       ///< RoPE tables (rope_type)

  /// Sizes of policy `P` (exact: sizeof of each type, master_copy as optim::adamw decides it).
  template <precision::policy P>
  static dtype_sizes of() {
    return {P::name,
            sizeof(typename P::param_type),
            sizeof(typename P::grad_type),
            sizeof(typename P::master_type),
            sizeof(typename P::accum_type),
            !std::is_same_v<typename P::param_type, typename P::master_type>,
            sizeof(parallel::reduce_type_t<P>),
            sizeof(typename P::act_grad_type),
            sizeof(typename P::rope_type)};
  }
  /// seeds/004's "mixed precision Adam": 2-byte weights, 2-byte gradients,
  /// 12 bytes of float32 optimizer state (master weights, two moments): 16
  /// bytes per parameter. (tessera's bf16_mixed keeps float32 gradients: 18.)
  static dtype_sizes seed004() { return {"seed004", 2, 2, 4, 4, true, 4, 2, 4}; }
  /// Names accepted by from_name().
  static std::vector<std::string> names() {
    return {"fp32", "fp64", "bf16_mixed", "bf16_mixed_bf16_grads", "seed004"};
  }
  /// Looks up a name of names(); throws config_error listing them.
  static dtype_sizes from_name(const std::string& n) {
    if (n == "fp32") return of<precision::fp32>();
    if (n == "fp64") return of<precision::fp64>();
    if (n == "bf16_mixed") return of<precision::bf16_mixed>();
    if (n == "bf16_mixed_bf16_grads") return of<precision::bf16_mixed_bf16_grads>();
    if (n == "seed004") return seed004();
    throw config_error("unknown precision '" + n +
                       "' (valid: fp32, fp64, bf16_mixed, bf16_mixed_bf16_grads, seed004)");
  }
};

/// Optimizer state shape: `moments` tensors of master_type per parameter
/// (AdamW: first and second moments, Loshchilov & Hutter 2019; SGD: the
/// momentum buffer), plus the master copy when dtype_sizes::master_copy,
/// plus the segment table of the optimizer kernels (24 bytes per tensor, or
/// piece of a tensor, of the flat buffer the optimizer updates). Matches
/// optim::adamw_optimizer's and optim::sgd_optimizer's state_bytes().
struct optimizer_spec {
  std::string name = "adamw";  ///< for tables
  int moments = 2;             ///< state tensors per parameter besides the master copy
  /// AdamW: two moments.
  static optimizer_spec adamw() { return {"adamw", 2}; }
  /// SGD with momentum: one buffer.
  static optimizer_spec sgd() { return {"sgd", 1}; }
  /// Looks up "adamw" or "sgd"; throws config_error listing them.
  static optimizer_spec from_name(const std::string& n) {
    if (n == "adamw") return adamw();
    if (n == "sgd") return sgd();
    throw config_error("unknown optimizer '" + n + "' (valid: adamw, sgd)");
  }
};

/// Bytes of the optimizer kernels' segment table (kernels::optimizer_segment).
inline constexpr std::uint64_t optimizer_segment_bytes = 24;

/// Which model of the data-parallel step a plan describes (file comment).
enum class accounting {
  engine,  ///< what parallel::data_parallel and data_parallel_trainer allocate and send
  ideal,   ///< the ZeRO paper's textbook formula (seeds/004's table)
};

/// Data-parallel sharding strategy: ZeRO stage 0 (plain data parallel) to 3
/// over `dp` ranks.
struct sharding {
  int zero = 0;      ///< ZeRO stage, 0..3
  int dp = 1;        ///< data-parallel degree (ranks sharing the model state), >= 1
  int prefetch = 1;  ///< ZeRO-3: gather units held beyond the one in use (prefetched)
  /// Bucket capacity in bytes of the reduce type, as
  /// parallel::data_parallel_options::bucket_bytes (default 25 MB). Engine
  /// accounting only; ZeRO-3 ignores it (one bucket per segment).
  std::int64_t bucket_bytes = parallel::default_bucket_bytes;
  /// The rank whose shard is planned (engine accounting: shards differ
  /// only in the optimizer's segment table).
  int rank = 0;
  /// Throws config_error naming the value if zero is outside 0..3, dp < 1,
  /// prefetch < 0, bucket_bytes < 1 or rank outside [0, dp).
  void validate() const {
    TESSERA_THROW_IF(rank < 0 || rank >= dp, config_error, "rank ", rank, " is not in [0, dp=", dp,
                     ")");
    TESSERA_THROW_IF(zero < 0 || zero > 3, config_error, "zero stage ", zero, " must be 0..3");
    TESSERA_THROW_IF(dp < 1, config_error, "dp=", dp, " must be >= 1");
    TESSERA_THROW_IF(prefetch < 0, config_error, "prefetch=", prefetch, " must be >= 0");
    TESSERA_THROW_IF(bucket_bytes < 1, config_error, "bucket_bytes=", bucket_bytes,
                     " must be >= 1");
  }
};

/// nn::llama's segments over make_llama_layout(c): -1 the embedding, 0..L-1
/// the blocks, L the head (final norm + LM head), each from its first tensor
/// to the next segment's first tensor (alignment padding included): the
/// boundaries nn::llama::segment_begin/segment_end compute, which
/// parallel::data_parallel hands to its bucket_plan.
inline std::vector<parallel::segment_range> llama_segments(const nn::llama_config& c) {
  const nn::param_layout layout = nn::make_llama_layout(c);
  std::vector<std::int64_t> b{0};
  for (std::int64_t l = 0; l < c.n_layers; ++l)
    b.push_back(layout.at("blocks." + std::to_string(l) + ".attn_norm").offset);
  b.push_back(layout.at("final_norm").offset);
  b.push_back(layout.total());
  std::vector<parallel::segment_range> v;
  for (std::size_t i = 0; i + 1 < b.size(); ++i)
    v.push_back({static_cast<int>(i) - 1, b[i], b[i + 1]});
  return v;
}

/// The buckets parallel::data_parallel builds for `c` on rank `rank` of
/// sh.dp: capacity max(1, bucket_bytes / reduce_bytes) elements, one bucket
/// per segment under ZeRO-3 (the same constructor call as the engine's).
/// Chunk sizes do not depend on the rank. Throws config_error for an
/// invalid sharding or rank.
inline parallel::bucket_plan engine_buckets(const nn::llama_config& c, const sharding& sh,
                                            std::size_t reduce_bytes, int rank = 0) {
  sh.validate();
  return parallel::bucket_plan(
      llama_segments(c), sh.dp, rank,
      std::max<std::int64_t>(1, sh.bucket_bytes / static_cast<std::int64_t>(reduce_bytes)),
      sh.zero >= 3);
}

/// Per-rank model state, in bytes (and element counts). Fields an
/// accounting does not have are 0 (ideal: param_shard, reduce_buffers,
/// reduce_staging, update_gather).
struct state_plan {
  accounting mode = accounting::engine;  ///< how the fields below were counted
  std::int64_t num_params = 0;           ///< real parameters
  std::int64_t flat_elems = 0;           ///< flat buffer, with the layout's alignment padding
  /// Engine: the sum of the padded buckets (bucket_plan::staging_size);
  /// ideal: flat_elems rounded up to a multiple of dp.
  std::int64_t padded_elems = 0;
  /// padded_elems / dp: one rank's ZeRO shard (engine: bucket_plan::shard_size).
  std::int64_t shard_elems = 0;
  std::int64_t buckets = 0;  ///< engine: gradient buckets (bucket_plan::size); ideal: 0
  /// Largest ZeRO-3 gather unit (a block, the embedding or the head; engine: padded).
  std::int64_t gather_unit_elems = 0;
  /// Full parameters in param_type: engine, the model's flat buffer on
  /// stages 0-2 and none on 3; ideal, replicated (padded on 1-2) or a shard on 3.
  std::uint64_t weights = 0;
  /// Engine ZeRO-1..3: this rank's parameter shard in param_type (shard_elems),
  /// the copy AdamW updates and the all-gathers send.
  std::uint64_t param_shard = 0;
  /// The model's gradient buffer in grad_type: engine, flat_elems on
  /// ZeRO-0/1 and none on 2/3 (see reduce_staging); ideal, a shard on ZeRO-2/3.
  std::uint64_t grads = 0;
  /// Engine, in the reduce type: the persistent padded staging buffer on
  /// ZeRO-0/1 (padded_elems) plus the reduced-gradient shard on ZeRO-1..3
  /// (shard_elems).
  std::uint64_t reduce_buffers = 0;
  std::uint64_t master = 0;  ///< master weights (a shard under ZeRO-1/2/3; 0 without a master copy)
  std::uint64_t optimizer = 0;    ///< optimizer moments (a shard under ZeRO-1/2/3)
  /// Engine: the optimizer kernels' segment table, 24 bytes per range of the
  /// flat buffer (or of the shard) it updates; ideal: 0.
  std::uint64_t segment_table = 0;
  std::uint64_t rope_tables = 0;  ///< RoPE cos and sin tables, (max_seq, hd/2) float32 each
  /// ZeRO-3 transient, gathered parameters in param_type. Engine: the most
  /// padded segments held at once, the one computing and, with prefetch,
  /// its neighbour (the largest adjacent pair); ideal: (1 + prefetch)
  /// gathered units plus one unit's unsharded gradient in grad_type.
  std::uint64_t gathered = 0;
  /// Engine ZeRO-2/3 transient: each bucket's gradient buffer of the
  /// accumulation window, padded, in grad_type (= the reduce type, the
  /// reduce-scatter's send buffer), allocated when the window's first
  /// backward reaches the bucket and freed when its reduce-scatter on the
  /// last micro-batch completes; all of them (padded_elems) once the first
  /// micro-batch's backward ends (with accumulation; a bound without). If
  /// grad_type and the reduce type differ: flat_elems grad_type plus
  /// padded_elems reduce type (a bound: the conversion buffers).
  std::uint64_t reduce_staging = 0;
  /// Engine ZeRO-1/2 transient: the all-gather destination of the updated
  /// shards in step() (padded_elems param_type), after the activations and
  /// the reduction buffers of the micro-batches are freed.
  std::uint64_t update_gather = 0;

  /// What seeds/004's training_memory_gib counts (weights + gradients +
  /// master + optimizer under ideal), and the engine's reduction buffers and
  /// parameter shard.
  std::uint64_t model_state() const {
    return weights + param_shard + grads + reduce_buffers + master + optimizer + segment_table;
  }
  /// model_state() + RoPE tables: allocated for as long as model and
  /// optimizer live, and all that is allocated between steps.
  std::uint64_t persistent() const { return model_state() + rope_tables; }
  /// Transient model-state bytes at their most: the backward's
  /// (gathered + reduce_staging) or the step's update_gather, whichever is larger.
  std::uint64_t transient() const { return std::max(gathered + reduce_staging, update_gather); }
  /// persistent() + transient().
  std::uint64_t total() const { return persistent() + transient(); }
};

namespace detail {
// Fills the byte fields of `s` from its element counts, ideal accounting
// (shared by both ideal plan_state overloads).
inline void fill_state_bytes(state_plan& s, const dtype_sizes& d, const optimizer_spec& o,
                             const sharding& sh) {
  sh.validate();
  s.mode = accounting::ideal;
  s.padded_elems =
      static_cast<std::int64_t>(comm::padded_count(static_cast<std::size_t>(s.flat_elems), sh.dp));
  s.shard_elems = s.padded_elems / sh.dp;
  // Replicated buffers are the model's flat buffer at stage 0; at stages 1-2
  // they are the destination of an all-gather of equal chunks: padded.
  const auto replicated = static_cast<std::uint64_t>(sh.zero == 0 ? s.flat_elems : s.padded_elems);
  const auto shard = static_cast<std::uint64_t>(s.shard_elems);
  s.weights = (sh.zero >= 3 ? shard : replicated) * d.param;
  s.grads = (sh.zero >= 2 ? shard : replicated) * d.grad;
  const std::uint64_t opt_elems = sh.zero >= 1 ? shard : replicated;
  s.master = d.master_copy ? opt_elems * d.master : 0;
  s.optimizer = opt_elems * d.master * static_cast<std::uint64_t>(o.moments);
}
}  // namespace detail

/// Per-rank model state of `c` laid out by nn::make_llama_layout (alignment
/// padding included), with the RoPE tables the model allocates and the
/// transients, under `mode` (file comment; default: what the engine
/// allocates). Throws config_error for an invalid config or sharding, and
/// under engine accounting for prefetch > 1 (the engine prefetches one
/// segment or none).
inline state_plan plan_state(const nn::llama_config& c, const dtype_sizes& d,
                             const optimizer_spec& o, const sharding& sh,
                             accounting mode = accounting::engine) {
  sh.validate();
  const nn::param_layout layout = nn::make_llama_layout(c);
  const std::vector<parallel::segment_range> segs = llama_segments(c);
  state_plan s;
  s.num_params = layout.num_params();
  s.flat_elems = layout.total();
  s.rope_tables = 2 * static_cast<std::uint64_t>(c.max_seq * (c.head_dim() / 2)) * d.rope;
  if (mode == accounting::ideal) {
    detail::fill_state_bytes(s, d, o, sh);
    for (const auto& g : segs) s.gather_unit_elems = std::max(s.gather_unit_elems, g.end - g.begin);
    if (sh.zero >= 3) {
      const auto unit = static_cast<std::uint64_t>(s.gather_unit_elems);
      s.gathered = static_cast<std::uint64_t>(1 + sh.prefetch) * unit * d.param + unit * d.grad;
    }
    return s;
  }
  TESSERA_THROW_IF(sh.prefetch > 1, config_error, "prefetch=", sh.prefetch,
                   ": parallel::data_parallel prefetches one segment or none (0 or 1)");
  const parallel::bucket_plan bp = engine_buckets(c, sh, d.reduce, sh.rank);
  // One rank under ZeRO-0 reduces nothing: no staging buffer (parallel/zero.hpp).
  const bool single = sh.zero == 0 && sh.dp == 1;
  s.padded_elems = bp.staging_size();
  s.shard_elems = bp.shard_size();
  s.buckets = static_cast<std::int64_t>(bp.size());
  const auto flat = static_cast<std::uint64_t>(s.flat_elems),
             padded = static_cast<std::uint64_t>(s.padded_elems),
             shard = static_cast<std::uint64_t>(s.shard_elems);
  s.weights = sh.zero >= 3 ? 0 : flat * d.param;
  s.param_shard = sh.zero >= 1 ? shard * d.param : 0;
  s.grads = sh.zero >= 2 ? 0 : flat * d.grad;
  s.reduce_buffers =
      ((sh.zero <= 1 && !single ? padded : 0) + (sh.zero >= 1 ? shard : 0)) * d.reduce;
  const std::uint64_t opt_elems = sh.zero >= 1 ? shard : flat;
  s.master = d.master_copy ? opt_elems * d.master : 0;
  s.optimizer = opt_elems * d.master * static_cast<std::uint64_t>(o.moments);
  const auto ranges = layout.ranges();
  s.segment_table = optimizer_segment_bytes *
                    (sh.zero >= 1 ? bp.shard_ranges(ranges).size() : ranges.size());
  if (sh.zero >= 2)
    s.reduce_staging = d.grad == d.reduce ? padded * d.grad : flat * d.grad + padded * d.reduce;
  if (sh.zero == 1 || sh.zero == 2) s.update_gather = padded * d.param;
  if (sh.zero >= 3) {
    // One bucket per segment, bucket k = segment L - k (buckets run from the head down).
    std::int64_t held = 0;
    const auto& b = bp.buckets();
    for (std::size_t k = 0; k < b.size(); ++k) {
      s.gather_unit_elems = std::max(s.gather_unit_elems, b[k].padded);
      held =
          std::max(held, b[k].padded + (sh.prefetch > 0 && k + 1 < b.size() ? b[k + 1].padded : 0));
    }
    s.gathered = static_cast<std::uint64_t>(held) * d.param;
  }
  return s;
}

/// Ideal accounting over the layout: plan_state(c, d, o, sh, accounting::ideal).
inline state_plan plan_state_ideal(const nn::llama_config& c, const dtype_sizes& d,
                                   const optimizer_spec& o, const sharding& sh) {
  return plan_state(c, d, o, sh, accounting::ideal);
}

/// Per-rank model state for a bare parameter count, ideal accounting
/// (seeds/004 style: no layout, no buckets, no RoPE tables, no gathered
/// units; not what parallel::data_parallel allocates, which needs the
/// layout: use the llama_config overload). Throws config_error if
/// num_params < 1 or the sharding is invalid.
inline state_plan plan_state(std::int64_t num_params, const dtype_sizes& d, const optimizer_spec& o,
                             const sharding& sh) {
  TESSERA_THROW_IF(num_params < 1, config_error, "num_params=", num_params, " must be >= 1");
  state_plan s;
  s.num_params = s.flat_elems = num_params;
  detail::fill_state_bytes(s, d, o, sh);
  return s;
}

/// seeds/004's training_memory_gib, transcribed: per-GPU GiB of model state
/// for bf16 mixed-precision Adam (2 + 2 + 12 bytes per parameter), the
/// optimizer term divided by `gpus` from ZeRO stage 1, gradients from 2,
/// weights from 3. Throws config_error as the seed raises ValueError.
inline double seed004_training_memory_gib(double params, int gpus, int zero_stage) {
  TESSERA_THROW_IF(zero_stage < 0 || zero_stage > 3 || gpus < 1, config_error,
                   "need zero_stage in 0..3 and gpus >= 1, got ", zero_stage, ", ", gpus);
  double weights = 2.0, grads = 2.0, optimiser = 12.0;
  if (zero_stage >= 1) optimiser /= gpus;
  if (zero_stage >= 2) grads /= gpus;
  if (zero_stage >= 3) weights /= gpus;
  return params * (weights + grads + optimiser) / gib;
}

/// Which backend's kernels a plan sizes the scratch of (the model's and the
/// optimizer's tensors are the same on both: one code path).
enum class backend_kind { host, cuda };

/// Shape of one micro-batch and the options that size its workspaces.
struct activation_options {
  std::int64_t micro_batch = 1;  ///< B, sequences per micro-batch
  std::int64_t seq = 0;          ///< T, tokens per sequence (0: the config's max_seq)
  nn::llama_options model{};     ///< ce_chunk and the checkpointing policy, as given to nn::llama
  int threads = 1;               ///< host: OpenMP threads (attention scratch is per thread)
  kernels::attention_tiles tiles{};  ///< host attention tiles (kernels::host_context::tiles)
  backend_kind backend = backend_kind::host;  ///< whose kernels' scratch to count
  std::int64_t micro_batches = 1;  ///< A, micro-batches per step and rank (the step's loss scalars)
  /// cuda: the context's cuBLASLt workspace (kernels::cuda_context_options).
  std::uint64_t cublaslt_workspace = std::uint64_t(32) << 20;
};

/// Bytes train::trainer allocates from the context's resource besides the
/// model and the engine: the loader's buffers (data/device_loader.hpp: two
/// slots of 2 B T int32 inputs and targets; on the host the "pinned" and
/// "device" buffers are both in the resource, on a GPU the pinned ones are
/// page-locked host memory, outside the device allocator), the step's
/// scalars ((1 + A) doubles: the norm and each micro-batch's loss), the clip
/// coefficient (one master_type) and two doubles that carry host values
/// through a collective.
inline std::uint64_t trainer_bytes(const activation_options& o, std::int64_t T,
                                   const dtype_sizes& d) {
  const auto N = static_cast<std::uint64_t>(o.micro_batch * T);
  const std::uint64_t slot = 2 * N * sizeof(std::int32_t);
  const std::uint64_t loader = (o.backend == backend_kind::host ? 4 : 2) * slot;
  return loader + static_cast<std::uint64_t>(1 + o.micro_batches) * sizeof(double) + d.master +
         2 * sizeof(double);
}

/// Activation bytes of one micro-batch's training forward and backward
/// (nn::llama::forward then backward), and their peak over the timeline.
struct activation_plan {
  std::int64_t tokens = 0;  ///< N = B T
  /// What the training forward leaves for the backward (llama::record_bytes):
  /// every block's record (or, checkpointed, its input), the ids, the
  /// head's input gradient.
  std::uint64_t saved = 0;
  std::uint64_t forward_temporaries = 0;  ///< the (N, H) output-projection buffer of the forward
  /// The fused LM head: chunk V accum + chunk doubles (+ bf16 conversion
  /// blocks on the host; the CUDA kernel's scratch and bf16 dx on a GPU).
  std::uint64_t logits_workspace = 0;
  /// The backward's gradients: the residual stream's (N, H) and the blocks'
  /// workspace (nn::block_bytes::workspace), plus the recompute's
  /// projection buffer under checkpointing.
  std::uint64_t backward_temporaries = 0;
  std::uint64_t attention_scratch = 0;  ///< largest attention workspace (forward or backward)
  std::uint64_t peak = 0;  ///< the most bytes live at once over forward and backward
  /// Host backend only, outside the memory resource: bf16 GEMM conversion
  /// buffers (kernels::gemm_workspace_bytes after one step); not in peak.
  std::uint64_t host_gemm_workspace = 0;
  /// Korthikanti et al. 2022 (seeds/001, "Phase 1"): 34 s b h bytes per layer
  /// for a standard 16-bit transformer without recomputation, L layers. For
  /// comparison only: our block saves a different set (SwiGLU's three F-wide
  /// tensors, q/k/v after RoPE, no dropout masks, lse instead of scores).
  std::uint64_t korthikanti_34sbh = 0;
};

namespace detail {
// The scratch the kernels of one backend allocate inside a call, in bytes.
struct kernel_scratch {
  std::uint64_t attention_forward = 0, attention_backward = 0;
  std::uint64_t cross_entropy = 0;     // the fused LM head (training)
  std::uint64_t rmsnorm_backward = 0;  // per call
  std::uint64_t mlp_backward = 0;      // the largest bf16 copy of a float gradient into a GEMM (cuda)
  std::uint64_t attention_gemm = 0;    // the same for the attention's GEMMs (cuda)
};

inline kernel_scratch scratch_of(const nn::llama_config& c, const dtype_sizes& d,
                                 const activation_options& o, std::int64_t B, std::int64_t T) {
  const std::uint64_t N = static_cast<std::uint64_t>(B * T), H = static_cast<std::uint64_t>(c.dim),
                      F = static_cast<std::uint64_t>(c.ffn_dim),
                      KV = static_cast<std::uint64_t>(c.kv_dim()),
                      nh = static_cast<std::uint64_t>(c.n_heads),
                      hd = static_cast<std::uint64_t>(c.head_dim()),
                      V = static_cast<std::uint64_t>(c.vocab);
  const std::uint64_t A = d.accum, G = d.act_grad;
  kernel_scratch k;
  const auto C = static_cast<std::uint64_t>(std::min<std::int64_t>(o.model.ce_chunk, B * T));
  if (o.backend == backend_kind::host) {
    const auto thr = static_cast<std::uint64_t>(o.threads);
    const auto tq = static_cast<std::uint64_t>(std::min(o.tiles.q, T)),
               tk = static_cast<std::uint64_t>(std::min(o.tiles.k, T));
    k.attention_forward = thr * (2 * tq * hd + 2 * tk * hd + tq * tk + 2 * tq) * A;
    k.attention_backward = N * nh * A + thr * (3 * tq * hd + 5 * tk * hd + 2 * tk) * A;  // D + tiles
    k.cross_entropy = C * V * A + C * sizeof(double);
    if (d.param != A) {  // 16-bit storage: x rows and a block of wlm converted to accum_type
      const std::uint64_t Vb = std::min<std::uint64_t>(
          V, std::max<std::uint64_t>(1, static_cast<std::uint64_t>(kernels::ce_wlm_block_elems) / H));
      k.cross_entropy += C * H * A + Vb * H * A;
    }
    if (G != A) k.cross_entropy += C * H * A;  // bf16 dx: each chunk's float dx first
  } else {
    // kernels/cuda/ops.hpp: each overload's ctx.scratch(...).
    const bool wide = G != 2;  // float32 activation gradients go through bf16 copies
    k.attention_backward = N * nh * 4 + (wide ? 2 * N * (2 * H + 2 * KV) : 0);
    k.cross_entropy = kernels::cuda::lm_head_cross_entropy_scratch_bytes(
                          B * T, c.vocab, c.dim, o.model.ce_chunk) +
                      (wide ? 2 * N * H : 0);
    k.rmsnorm_backward = kernels::cuda::rmsnorm_backward_scratch_bytes(B * T, c.dim);
    k.mlp_backward = wide ? 2 * N * std::max(H, F) : 0;
    k.attention_gemm = wide ? 2 * N * H : 0;
  }
  return k;
}
}  // namespace detail

/// Activation bytes of one micro-batch, walking the model's allocation
/// timeline (nn/llama.hpp: embedding, blocks, head in forward; workspace,
/// blocks in reverse, embedding in backward) with the bytes each module
/// reports (nn::block_bytes) and the scratch of the backend's kernels.
/// Throws config_error for an invalid config or policy, B or T < 1 or
/// T > max_seq.
inline activation_plan plan_activations(const nn::llama_config& c, const dtype_sizes& d,
                                        const activation_options& o) {
  c.validate();
  o.model.checkpointing.validate();
  const std::int64_t B = o.micro_batch, T = o.seq > 0 ? o.seq : c.max_seq;
  TESSERA_THROW_IF(B < 1, config_error, "micro-batch B=", B, " must be >= 1");
  TESSERA_THROW_IF(T > c.max_seq, config_error, "sequence length T=", T,
                   " exceeds the model's max_seq=", c.max_seq);
  TESSERA_THROW_IF(o.threads < 1, config_error, "threads=", o.threads, " must be >= 1");
  const std::int64_t Ni = B * T;
  const std::uint64_t N = static_cast<std::uint64_t>(Ni), H = static_cast<std::uint64_t>(c.dim);
  const std::uint64_t P = d.param, G = d.act_grad, A = d.accum;
  const nn::block_bytes bb = nn::block_bytes::of(c, static_cast<std::int64_t>(P),
                                                 static_cast<std::int64_t>(G),
                                                 static_cast<std::int64_t>(A));
  const detail::kernel_scratch ks = detail::scratch_of(c, d, o, B, T);
  const auto u = [](std::int64_t x) { return static_cast<std::uint64_t>(x); };
  const std::uint64_t att = u(bb.attention_part(Ni)), mlp = u(bb.mlp_part(Ni)),
                      x = u(bb.input(Ni)), ws = u(bb.workspace(Ni));
  const nn::checkpoint_policy& ck = o.model.checkpointing;
  activation_plan a;
  a.tokens = Ni;
  std::uint64_t live = 0, peak = 0;
  auto at = [&](std::uint64_t extra) { peak = std::max(peak, live + extra); };
  // ---- forward: embedding (ids, x), the projection buffer, the blocks.
  live = N * sizeof(std::int32_t) + N * H * P;
  a.forward_temporaries = N * H * P;
  live += a.forward_temporaries;
  std::uint64_t held = N * sizeof(std::int32_t);  // what the record keeps from forward to backward
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    at(att + ks.attention_forward);  // the attention, its part of the record allocated
    at(att + mlp + x);               // the whole record and the block's output
    // The input moves into the record (already live); the output is new; a
    // checkpointed block frees the rest of its record.
    live += (ck.recomputes(l) ? 0 : att + mlp) + x;
    held += ck.recomputes(l) ? x : x + att + mlp;
  }
  live -= a.forward_temporaries;  // the projection buffer goes with the forward's blocks
  // ---- the head: final norm, fused LM head + cross-entropy, final norm backward.
  const std::uint64_t head_fwd = N * A + N * H * P + N * H * G;  // rstd, xn, dxn
  a.logits_workspace = ks.cross_entropy;
  at(head_fwd + ks.cross_entropy);
  at(head_fwd + N * H * G + ks.rmsnorm_backward);  // + the record's input gradient
  live += N * H * G - x;  // the head keeps its input gradient; the last output goes
  held += N * H * G;
  a.saved = held;
  // ---- backward: the residual gradient (the head's), the workspace, the blocks.
  live += ws;
  a.backward_temporaries = N * H * G + ws;
  at(0);
  bool proj = false;
  for (std::int64_t l = c.n_layers - 1; l >= 0; --l) {
    if (ck.recomputes(l)) {
      if (!proj) {  // the recompute's projection buffer, once
        live += N * H * P;
        a.backward_temporaries += N * H * P;
        proj = true;
      }
      at(att + ks.attention_forward);  // recomputing the attention
      live += att + mlp;               // the record again (its input was kept)
    }
    at(std::max(ks.mlp_backward, ks.rmsnorm_backward));  // the MLP backward
    live -= mlp;                                         // its part of the record goes
    at(std::max({ks.attention_backward, ks.attention_gemm, ks.rmsnorm_backward}));
    live -= att + x;  // the rest of the record
  }
  a.attention_scratch = std::max(ks.attention_forward, ks.attention_backward);
  a.peak = peak;
  if (o.backend == backend_kind::host && P != A) {
    // gemm_mixed converts bf16 A, B and C operands into per-slot float buffers
    const std::uint64_t act = N * std::max<std::uint64_t>(H, static_cast<std::uint64_t>(c.ffn_dim));
    a.host_gemm_workspace =
        A * (act + std::max<std::uint64_t>(static_cast<std::uint64_t>(c.ffn_dim) * H, act) + act);
  }
  a.korthikanti_34sbh = 34 * N * H * static_cast<std::uint64_t>(c.n_layers);
  return a;
}

/// A complete per-rank memory plan: model state, the trainer's buffers and
/// one micro-batch's activations.
struct memory_plan {
  std::string model;   ///< preset name
  dtype_sizes dtypes;  ///< precision
  optimizer_spec optimizer;
  sharding strategy;
  activation_options shape;
  state_plan state;
  activation_plan activations;
  std::uint64_t trainer = 0;  ///< trainer_bytes: the loader's buffers and the step's scalars
  /// Backend buffers of the context: the cuBLASLt workspace on a GPU, 0 on the host.
  std::uint64_t context = 0;
  /// cuda: the gradient norm kernel's scratch (after the backward); 0 on the host.
  std::uint64_t norm_scratch = 0;

  /// Everything allocated between steps: the state, the trainer's and the context's buffers.
  std::uint64_t persistent() const { return state.persistent() + trainer + context; }
  /// Predicted per-rank peak: the persistent bytes plus the larger of
  /// backward's (gathered units + reduction staging + activation peak) and
  /// the step's update all-gather or norm scratch (which run after the
  /// activations are freed).
  std::uint64_t total() const {
    return persistent() + std::max({state.gathered + state.reduce_staging + activations.peak,
                                    state.update_gather, norm_scratch});
  }

  /// Rows (label, bytes) in table order: the persistent state, the transients, then the totals.
  std::vector<std::pair<std::string, std::uint64_t>> rows() const {
    return {{"weights", state.weights},
            {"parameter shard", state.param_shard},
            {"gradients", state.grads},
            {"reduction buffers", state.reduce_buffers},
            {"master weights", state.master},
            {"optimizer state", state.optimizer},
            {"optimizer segments", state.segment_table},
            {"rope tables", state.rope_tables},
            {"trainer buffers", trainer},
            {"context (cuBLASLt)", context},
            {"persistent", persistent()},
            {"zero-3 gathered", state.gathered},
            {"reduction staging", state.reduce_staging},
            {"update all-gather", state.update_gather},
            {"activations (saved)", activations.saved},
            {"logits workspace", activations.logits_workspace},
            {"activation peak", activations.peak},
            {"total", total()}};
  }
  /// Fixed-width text table: item, bytes, GiB; then the 34sbh comparison line.
  std::string to_table() const {
    std::string s;
    char line[160];
    std::snprintf(
        line, sizeof line, "%s %s, %s, zero-%d, dp=%d, B=%lld, T=%lld (per rank, %s)\n",
        model.c_str(), dtypes.name.c_str(), optimizer.name.c_str(), strategy.zero, strategy.dp,
        static_cast<long long>(shape.micro_batch),
        static_cast<long long>(activations.tokens / std::max<std::int64_t>(1, shape.micro_batch)),
        state.mode == accounting::engine ? "engine" : "ideal");
    s += line;
    for (const auto& [k, v] : rows()) {
      if (k == "persistent" || k == "zero-3 gathered" || k == "activations (saved)" || k == "total")
        s += std::string(56, '-') + "\n";
      std::snprintf(line, sizeof line, "  %-22s %18llu B %10.2f GiB\n", k.c_str(),
                    static_cast<unsigned long long>(v), static_cast<double>(v) / gib);
      s += line;
    }
    std::snprintf(line, sizeof line,
                  "  (activation peak includes backward temporaries %.2f GiB; Korthikanti 34sbh "
                  "estimate %.2f GiB)\n",
                  static_cast<double>(activations.backward_temporaries) / gib,
                  static_cast<double>(activations.korthikanti_34sbh) / gib);
    s += line;
    return s;
  }
  /// Every field, in bytes, as JSON.
  nlohmann::json to_json() const {
    nlohmann::json j;
    j["model"] = model;
    j["precision"] = dtypes.name;
    j["optimizer"] = optimizer.name;
    j["zero"] = strategy.zero;
    j["dp"] = strategy.dp;
    j["accounting"] = state.mode == accounting::engine ? "engine" : "ideal";
    j["bucket_bytes"] = strategy.bucket_bytes;
    j["micro_batch"] = shape.micro_batch;
    j["tokens"] = activations.tokens;
    j["num_params"] = state.num_params;
    j["flat_elems"] = state.flat_elems;
    j["padded_elems"] = state.padded_elems;
    j["shard_elems"] = state.shard_elems;
    j["buckets"] = state.buckets;
    j["state"] = {{"weights", state.weights},
                  {"param_shard", state.param_shard},
                  {"grads", state.grads},
                  {"reduce_buffers", state.reduce_buffers},
                  {"master", state.master},
                  {"optimizer", state.optimizer},
                  {"rope_tables", state.rope_tables},
                  {"gathered", state.gathered},
                  {"reduce_staging", state.reduce_staging},
                  {"update_gather", state.update_gather},
                  {"model_state", state.model_state()},
                  {"persistent", state.persistent()},
                  {"total", state.total()}};
    j["activations"] = {{"saved", activations.saved},
                        {"forward_temporaries", activations.forward_temporaries},
                        {"logits_workspace", activations.logits_workspace},
                        {"backward_temporaries", activations.backward_temporaries},
                        {"attention_scratch", activations.attention_scratch},
                        {"peak", activations.peak},
                        {"host_gemm_workspace", activations.host_gemm_workspace},
                        {"korthikanti_34sbh", activations.korthikanti_34sbh}};
    j["total"] = total();
    return j;
  }
};

/// Plans model state (under `mode`; default: what the engine allocates) and
/// one micro-batch's activations for `c`. Throws config_error for an
/// invalid config, sharding or micro-batch shape.
inline memory_plan plan_memory(const nn::llama_config& c, const dtype_sizes& d,
                               const optimizer_spec& o, const sharding& sh,
                               const activation_options& a, accounting mode = accounting::engine) {
  memory_plan m{c.name, d, o, sh, a, plan_state(c, d, o, sh, mode), plan_activations(c, d, a)};
  const std::int64_t T = a.seq > 0 ? a.seq : c.max_seq;
  m.trainer = trainer_bytes(a, T, d);
  if (a.backend == backend_kind::cuda) {
    m.context = a.cublaslt_workspace;
    const std::int64_t n = sh.zero >= 1 ? m.state.shard_elems : m.state.flat_elems;
    m.norm_scratch = kernels::cuda::grad_sum_squares_scratch_bytes(n);
  }
  return m;
}

}  // namespace tessera::plan
