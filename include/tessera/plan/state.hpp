#pragma once
/// \file plan/state.hpp
/// Per-rank bytes of the model state: weights, gradients, master weights,
/// optimizer state and segment table, the data-parallel engine's reduction
/// buffers and shards, and the ZeRO-3 gathered blocks (plan/memory.hpp puts
/// them beside the activations).
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
///   window (a transient); ZeRO-3 keeps no full parameter buffer.
///   tests/parallel/memory.cpp holds these figures against each rank's
///   allocator.
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
#include <string>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/kernels/detail/adafactor.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/optim/muon.hpp"
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
  std::size_t act_grad = 4;  ///< activation gradients (act_grad_type)
  std::size_t rope = 4;      ///< RoPE tables (rope_type)
  /// The blocks' linear layers run FP8 GEMMs (precision::fp8_linear<P>):
  /// their operand copies and scales are planned in plan/fp8.hpp.
  bool fp8_linear = false;

  /// Sizes of policy `P` (exact: sizeof of each type, master_copy as
  /// optim::adamw decides it, fp8_linear as precision::fp8_linear<P>).
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
            sizeof(typename P::rope_type),
            precision::fp8_linear<P>};
  }
  /// seeds/004's "mixed precision Adam": 2-byte weights, 2-byte gradients,
  /// 12 bytes of float32 optimizer state (master weights, two moments): 16
  /// bytes per parameter. (tessera's bf16_mixed keeps float32 gradients: 18.)
  static dtype_sizes seed004() { return {"seed004", 2, 2, 4, 4, true, 4, 2, 4}; }
  /// Names accepted by from_name().
  static std::vector<std::string> names() {
    return {"fp32",       "fp64",      "bf16_mixed", "bf16_mixed_bf16_grads",
            "fp16_mixed", "fp8_mixed", "seed004"};
  }
  /// Looks up a name of names(); throws config_error listing them.
  static dtype_sizes from_name(const std::string& n) {
    if (n == "fp32") return of<precision::fp32>();
    if (n == "fp64") return of<precision::fp64>();
    if (n == "bf16_mixed") return of<precision::bf16_mixed>();
    if (n == "bf16_mixed_bf16_grads") return of<precision::bf16_mixed_bf16_grads>();
    if (n == "fp16_mixed") return of<precision::fp16_mixed>();
    // fp8_mixed stores as bf16_mixed; its FP8 operand copies and scales
    // are planned in plan/fp8.hpp (fp8_linear).
    if (n == "fp8_mixed") return of<precision::fp8_mixed>();
    if (n == "seed004") return seed004();
    throw config_error("unknown precision '" + n +
                       "' (valid: fp32, fp64, bf16_mixed, bf16_mixed_bf16_grads, fp16_mixed, "
                       "fp8_mixed, seed004)");
  }
};

/// Optimizer state shape: `moments` tensors of master_type per parameter
/// (AdamW: first and second moments, Loshchilov & Hutter 2019; SGD: the
/// momentum buffer; Lion: its momentum, Chen et al. 2023; Adafactor: its
/// optional first moment), plus the master copy when
/// dtype_sizes::master_copy, plus the segment table of the optimizer
/// kernels (40 bytes per tensor, or piece of a tensor, of the flat buffer
/// the optimizer updates). `factored` (Adafactor, Shazeer & Stern 2018):
/// per tensor, not per parameter, a matrix's rows + cols statistics (the
/// whole matrix's) and a vector's one an element, its 144-byte entry of the
/// tensor table, 3 master_type scalars, one double a row, its sums area and
/// the exchange over tp and dp (adafactor_state_bytes).
/// Matches the state_bytes() of optim::adamw_optimizer, sgd_optimizer,
/// lion_optimizer and adafactor_optimizer.
struct optimizer_spec {
  std::string name = "adamw";  ///< for tables
  int moments = 2;             ///< state tensors per parameter besides the master copy
  bool factored = false;       ///< Adafactor's per-tensor statistics (above)
  /// Muon's per-tensor state (muon_state_bytes): AdamW's second moment of
  /// the tensors that are not a block's matrix, its segment table and the
  /// Newton-Schulz scratch of the largest matrix (under ZeRO over dp > 1
  /// with the largest bucket, which gathers the matrices' pieces whole).
  bool orthogonalised = false;
  /// AdamW: two moments.
  static optimizer_spec adamw() { return {"adamw", 2}; }
  /// SGD with momentum: one buffer.
  static optimizer_spec sgd() { return {"sgd", 1}; }
  /// Lion: one momentum buffer.
  static optimizer_spec lion() { return {"lion", 1}; }
  /// Adafactor: its statistics per tensor, and the first moment when kept (beta1 > 0).
  static optimizer_spec adafactor(bool first_moment = false) {
    return {"adafactor", first_moment ? 1 : 0, true};
  }
  /// Muon: one buffer (a matrix's momentum, AdamW's first moment of the
  /// rest) and its per-tensor state.
  static optimizer_spec muon() { return {"muon", 1, false, true}; }
  /// Whether the state is per tensor (planning it needs the tensors' shapes).
  bool whole_tensors() const { return factored; }
  /// Looks up "adamw", "sgd", "lion", "adafactor" (without a first
  /// moment, the default) or "muon"; throws config_error listing them.
  static optimizer_spec from_name(const std::string& n) {
    if (n == "adamw") return adamw();
    if (n == "sgd") return sgd();
    if (n == "lion") return lion();
    if (n == "adafactor") return adafactor();
    if (n == "muon") return muon();
    throw config_error("unknown optimizer '" + n + "' (valid: adamw, sgd, lion, adafactor, muon)");
  }
};

/// Adafactor's per-tensor bytes over `ranges` (whole tensors or tp shards
/// with their shapes, or a ZeRO shard's pieces of them; a tp group of `tp`
/// ranks), as optim::adafactor_optimizer allocates them: `statistics`, the
/// whole matrix's full_rows + full_cols a matrix and one an element of a
/// vector (or its piece), of `master` bytes, with the scratch: 3 master
/// scalars a range, one double a row of the kernels' row numbering (a
/// matrix piece's touched rows, a vector's rows of adafactor_vector_row),
/// the sums areas (full_rows + full_cols + 2 doubles a matrix, 2 a vector)
/// and the exchange (the larger of the tp group's, over the ranges split
/// over tp, and under ZeRO over `dp` > 1 the dp group's, over `dp_split`,
/// the tensors the buckets' chunks split: each len (1 + group) doubles, len
/// the areas' slots but one); `table`, the tensor table (144 bytes a range).
struct adafactor_bytes {
  std::uint64_t statistics = 0, table = 0;
};
inline adafactor_bytes adafactor_state_bytes(const std::vector<nn::param_range>& ranges,
                                             std::size_t master, int tp = 1,
                                             const std::vector<nn::param_range>& dp_split = {},
                                             int dp = 1) {
  std::uint64_t stats = 0, rows = 0, sums = 0;
  std::int64_t tp_len = 0, dp_len = 0;
  auto full = [](const nn::param_range& r) {
    return std::pair{r.split >= 0 ? r.full_rows : r.rows, r.split >= 0 ? r.full_cols : r.cols};
  };
  for (const nn::param_range& r : ranges) {
    const std::int64_t n = r.size();
    std::int64_t slots = 2;
    if (r.dims >= 2) {
      const auto [R, C] = full(r);
      stats += static_cast<std::uint64_t>(R + C);
      rows += static_cast<std::uint64_t>((r.first + n - 1) / r.cols - r.first / r.cols + 1);
      slots = R + C + 2;
    } else {
      const std::int64_t w = std::min(n, kernels::adafactor_vector_row);
      stats += static_cast<std::uint64_t>(n);
      rows += static_cast<std::uint64_t>((n + w - 1) / w);
    }
    sums += static_cast<std::uint64_t>(slots);
    if (r.split >= 0 && tp > 1) tp_len += slots - 1;
  }
  for (const nn::param_range& r : dp_split) {
    const auto [R, C] = full(r);
    dp_len += r.dims >= 2 ? R + C + 1 : 1;
  }
  const std::int64_t exchange =
      std::max(dp > 1 ? dp_len * (1 + dp) : 0, tp > 1 ? tp_len * (1 + tp) : 0);
  const auto tensors = static_cast<std::uint64_t>(ranges.size());
  return {(stats + 3 * tensors) * master +
              (rows + sums + static_cast<std::uint64_t>(exchange)) * sizeof(double),
          tensors * sizeof(kernels::adafactor_tensor)};
}

/// The tensors of `flat` every bucket of `bp` splits between the dp ranks,
/// in bucket order (what parallel::data_parallel lists in optim::state_bucket::split).
inline std::vector<nn::param_range> split_ranges(const parallel::bucket_plan& bp,
                                                 const std::vector<nn::param_range>& flat) {
  std::vector<nn::param_range> out;
  for (std::size_t k = 0; k < bp.size(); ++k)
    for (const nn::param_range& r : bp.split_ranges(k, flat)) out.push_back(r);
  return out;
}

/// Muon's per-tensor bytes over `ranges` (whole tensors or tp shards with
/// their shapes, or a ZeRO shard's pieces of them; a tp group of `tp`
/// ranks), as optim::muon_optimizer allocates them: `state`, AdamW's second
/// moment of every range that is not of a block's matrix plus the scratch
/// of the matrix needing the most (kernels::muon_scratch_elements: its
/// shard, the gathered shards under tp, W, the iteration's) and
/// `bucket_elems` (under ZeRO over dp > 1, the largest bucket holding a
/// matrix, padded), of `master` bytes; `table`, its segment table (48 bytes
/// a range).
struct muon_bytes {
  std::uint64_t state = 0, table = 0;
  /// The parts of `state` in elements: AdamW's second moment, the scratch
  /// of the largest matrix (without the bucket).
  std::uint64_t adamw_elems = 0, scratch_elems = 0;
};
inline muon_bytes muon_state_bytes(const std::vector<nn::param_range>& ranges, std::size_t master,
                                   int tp, std::int64_t bucket_elems = 0) {
  std::uint64_t v = 0;
  std::int64_t scratch = 0;
  for (const nn::param_range& r : ranges) {
    if (optim::muon_updates(r))
      scratch =
          std::max(scratch, kernels::muon_scratch_elements(optim::muon_matrix_of(r, tp), master));
    else
      v += static_cast<std::uint64_t>(r.size());
  }
  return {(v + static_cast<std::uint64_t>(scratch + bucket_elems)) * master,
          static_cast<std::uint64_t>(ranges.size()) * sizeof(kernels::muon_segment), v,
          static_cast<std::uint64_t>(scratch)};
}

/// Bytes of the optimizer kernels' segment table (kernels::optimizer_segment).
inline constexpr std::uint64_t optimizer_segment_bytes = 40;

/// Which model of the data-parallel step a plan describes (file comment).
enum class accounting {
  engine,  ///< what parallel::data_parallel (and so train::trainer) allocates and sends
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
  /// Tensor parallelism: the tp degree and the tp rank planned. The model
  /// state is that rank's layout (nn::make_llama_layout(c, {tp, tp_rank}):
  /// its block shards, the norms, embedding and LM head whole), sharded
  /// over dp as above.
  int tp = 1;
  int tp_rank = 0;
  /// Engine accounting, zero<2,3>: buckets reduce-scattered every
  /// micro-batch (parallel::grad_reduction::per_micro_batch: two bucket
  /// buffers held at most) instead of once per step (every bucket's buffer
  /// held through the window).
  bool per_micro_batch = false;
  /// Micro-batches per step and rank (A): under per_micro_batch a later
  /// micro-batch's reduced chunk is received beside the shard.
  std::int64_t micro_batches = 1;
  /// Throws config_error naming the value if zero is outside 0..3, dp < 1,
  /// prefetch < 0, bucket_bytes < 1 or rank outside [0, dp).
  void validate() const {
    TESSERA_THROW_IF(rank < 0 || rank >= dp, config_error, "rank ", rank, " is not in [0, dp=", dp,
                     ")");
    TESSERA_THROW_IF(zero < 0 || zero > 3, config_error, "zero stage ", zero, " must be 0..3");
    TESSERA_THROW_IF(dp < 1, config_error, "dp=", dp, " must be >= 1");
    TESSERA_THROW_IF(tp < 1 || tp_rank < 0 || tp_rank >= tp, config_error, "tp=", tp,
                     " must be >= 1 and the tp rank ", tp_rank, " in [0, tp)");
    TESSERA_THROW_IF(prefetch < 0, config_error, "prefetch=", prefetch, " must be >= 0");
    TESSERA_THROW_IF(bucket_bytes < 1, config_error, "bucket_bytes=", bucket_bytes,
                     " must be >= 1");
    TESSERA_THROW_IF(per_micro_batch && zero < 2, config_error, "zero stage ", zero,
                     " keeps the whole gradient: per-micro-batch reduction needs zero 2 or 3");
    TESSERA_THROW_IF(micro_batches < 1, config_error, "micro_batches=", micro_batches,
                     " must be >= 1");
  }
};

/// nn::llama's segments over make_llama_layout(c): -1 the embedding, 0..L-1
/// the blocks, L the head (final norm + LM head), each from its first tensor
/// to the next segment's first tensor (alignment padding included): the
/// boundaries nn::llama::segment_begin/segment_end compute, which
/// parallel::data_parallel hands to its bucket_plan. `head`: the layout's
/// (nn::tied_head::copy for the last stage of a pipeline with tied
/// embeddings, whose head segment holds the embedding's copy).
inline std::vector<parallel::segment_range> llama_segments(
    const nn::llama_config& c, nn::tp_rank t = {}, nn::tied_head head = nn::tied_head::embedding) {
  const nn::param_layout layout = nn::make_llama_layout(c, t, head);
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
      llama_segments(c, {sh.tp, sh.tp_rank}), sh.dp, rank,
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
  /// Engine ZeRO-3: this rank's parameter shard in param_type (shard_elems),
  /// what the optimizer updates and the all-gathers send (ZeRO-1/2 update
  /// their owned elements of the model's buffer in place).
  std::uint64_t param_shard = 0;
  /// The model's own gradient buffer in grad_type: engine, flat_elems on
  /// one rank and where ZeRO-0/1 cannot reduce in place (bf16 gradients),
  /// else none (the padded buffer is the gradient: reduce_buffers; ZeRO-2/3:
  /// reduce_staging); ideal, replicated on ZeRO-0/1, a shard on ZeRO-2/3.
  std::uint64_t grads = 0;
  /// Engine, in the reduce type: the persistent padded gradient buffer on
  /// ZeRO-0/1 (padded_elems; none on one rank), reduced in place, or the
  /// reduced-gradient shard on ZeRO-2/3 (shard_elems).
  std::uint64_t reduce_buffers = 0;
  std::uint64_t master = 0;  ///< master weights (a shard under ZeRO-1/2/3; 0 without a master copy)
  std::uint64_t optimizer = 0;  ///< optimizer moments (a shard under ZeRO-1/2/3)
  /// Engine: the optimizer kernels' segment table, 40 bytes per range of the
  /// flat buffer (or of the shard) it updates; ideal: 0.
  std::uint64_t segment_table = 0;
  std::uint64_t rope_tables = 0;  ///< RoPE cos and sin tables, (max_seq, hd/2) float32 each
  /// ZeRO-3 transient, gathered parameters in param_type. Engine: the most
  /// padded segments held at once, the one computing and, with prefetch,
  /// its neighbour (the largest adjacent pair); ideal: (1 + prefetch)
  /// gathered units plus one unit's unsharded gradient in grad_type.
  std::uint64_t gathered = 0;
  /// Engine ZeRO-2/3 transient, the bucket gradient buffers. Reduced once
  /// per step: each bucket's buffer of the accumulation window, padded, in
  /// grad_type (= the reduce type, the reduce-scatter's send buffer),
  /// allocated when the window's first backward reaches the bucket and
  /// freed when its reduce-scatter on the last micro-batch completes; all
  /// of them (padded_elems) once the first micro-batch's backward ends (with
  /// accumulation; a bound without). If grad_type and the reduce type
  /// differ: flat_elems grad_type plus padded_elems reduce type (a bound: the
  /// conversion buffers). Reduced per micro-batch (sharding::per_micro_batch):
  /// the largest of a bucket reducing (its padded send buffer and, with
  /// accumulation, its received chunk) beside the next one filling.
  std::uint64_t reduce_staging = 0;
  /// Engine ZeRO-1/2 transient: the update's all-gather in step(), one
  /// padded bucket in param_type at a time (the largest), after the
  /// activations and the reduction buffers of the micro-batches are freed.
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
/// padding included; the tp rank's layout under sh.tp > 1), with the RoPE tables the model
/// allocates and the transients, under `mode` (file comment; default: what the engine allocates).
/// Throws config_error for an invalid config or sharding, and under engine accounting for prefetch
/// > 1 (the engine prefetches one segment or none).
inline state_plan plan_state(const nn::llama_config& c, const dtype_sizes& d,
                             const optimizer_spec& o, const sharding& sh,
                             accounting mode = accounting::engine) {
  sh.validate();
  const nn::param_layout layout = nn::make_llama_layout(c, {sh.tp, sh.tp_rank});
  const std::vector<parallel::segment_range> segs = llama_segments(c, {sh.tp, sh.tp_rank});
  state_plan s;
  s.num_params = layout.num_params();
  s.flat_elems = layout.total();
  s.rope_tables = 2 * static_cast<std::uint64_t>(c.max_seq * (c.head_dim() / 2)) * d.rope;
  if (mode == accounting::ideal) {
    detail::fill_state_bytes(s, d, o, sh);
    if (o.factored)
      s.optimizer += adafactor_state_bytes(layout.ranges(), d.master, sh.tp).statistics;
    if (o.orthogonalised) s.optimizer += muon_state_bytes(layout.ranges(), d.master, sh.tp).state;
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
  // One rank under ZeRO-0 reduces nothing: no padded buffer (parallel/zero.hpp).
  const bool single = sh.zero == 0 && sh.dp == 1;
  // ZeRO-0/1 with the gradient in the reduce type: the model accumulates
  // into the padded buffer, reduced in place (the trainer builds it with
  // external gradients: data_parallel::wants_external_grads).
  const bool in_place = sh.zero <= 1 && !single && d.grad == d.reduce;
  s.padded_elems = bp.staging_size();
  s.shard_elems = bp.shard_size();
  s.buckets = static_cast<std::int64_t>(bp.size());
  const auto flat = static_cast<std::uint64_t>(s.flat_elems),
             padded = static_cast<std::uint64_t>(s.padded_elems),
             shard = static_cast<std::uint64_t>(s.shard_elems);
  s.weights = sh.zero >= 3 ? 0 : flat * d.param;
  s.param_shard = sh.zero >= 3 ? shard * d.param : 0;
  s.grads = sh.zero >= 2 || in_place ? 0 : flat * d.grad;
  s.reduce_buffers =
      ((sh.zero <= 1 && !single ? padded : 0) + (sh.zero >= 2 ? shard : 0)) * d.reduce;
  const std::uint64_t opt_elems = sh.zero >= 1 ? shard : flat;
  s.master = d.master_copy ? opt_elems * d.master : 0;
  s.optimizer = opt_elems * d.master * static_cast<std::uint64_t>(o.moments);
  const auto ranges = layout.ranges();
  s.segment_table =
      optimizer_segment_bytes * (sh.zero >= 1 ? bp.shard_ranges(ranges).size() : ranges.size());
  if (o.factored) {
    // Under ZeRO over dp > 1: this rank's pieces, and the exchange of the
    // tensors the chunks split (optim::adafactor_optimizer::gather_pieces_over).
    const bool pieces = sh.zero >= 1 && sh.dp > 1;
    const adafactor_bytes a = pieces ? adafactor_state_bytes(bp.shard_ranges(ranges), d.master,
                                                             sh.tp, split_ranges(bp, ranges), sh.dp)
                                     : adafactor_state_bytes(ranges, d.master, sh.tp);
    s.optimizer += a.statistics;
    s.segment_table += a.table;
  }
  if (o.orthogonalised) {
    // Under ZeRO over dp > 1: this rank's pieces, and the largest bucket
    // holding a matrix, gathered whole (optim::muon_optimizer::gather_pieces_over).
    const bool pieces = sh.zero >= 1 && sh.dp > 1;
    std::int64_t bucket_elems = 0;
    if (pieces)
      for (const auto& bk : bp.buckets())
        for (const nn::param_range& r : ranges)
          if (r.hidden && r.begin >= bk.begin && r.end <= bk.end)
            bucket_elems = std::max(bucket_elems, bk.padded);
    const muon_bytes m =
        muon_state_bytes(pieces ? bp.shard_ranges(ranges) : ranges, d.master, sh.tp, bucket_elems);
    s.optimizer += m.state;
    s.segment_table += m.table;
  }
  const auto& b = bp.buckets();
  if (sh.zero >= 2 && !sh.per_micro_batch) {
    // The window: every bucket's buffer held (padded, in the reduce type;
    // with bf16 gradients a bound: the buffers and their conversions).
    s.reduce_staging = d.grad == d.reduce ? padded * d.grad : flat * d.grad + padded * d.reduce;
  } else if (sh.zero >= 2) {
    // Per micro-batch: a bucket reducing (its send buffer and, after the
    // window's first micro-batch, its received chunk) beside the next one
    // filling; earlier reductions are complete when a bucket launches
    // (grad_reducer: at most two bucket buffers at once).
    const std::uint64_t recv = sh.micro_batches > 1 ? 1 : 0;
    for (std::size_t k = 0; k < b.size(); ++k) {
      const auto padded_k = static_cast<std::uint64_t>(b[k].padded);
      const std::uint64_t next =
          k + 1 < b.size() ? static_cast<std::uint64_t>(d.grad == d.reduce ? b[k + 1].padded
                                                                           : b[k + 1].numel()) *
                                 d.grad
                           : 0;
      const std::uint64_t reducing =
          padded_k * d.reduce + recv * static_cast<std::uint64_t>(b[k].chunk) * d.reduce;
      std::uint64_t peak = reducing + next;
      if (d.grad != d.reduce)  // while the bucket converts: its gradients and its send buffer
        peak =
            std::max(peak, static_cast<std::uint64_t>(b[k].numel()) * d.grad + padded_k * d.reduce);
      s.reduce_staging = std::max(s.reduce_staging, peak);
    }
  }
  // ZeRO-1/2: the update's all-gather, one padded bucket at a time.
  if (sh.zero == 1 || sh.zero == 2)
    for (const auto& bk : b)
      s.update_gather = std::max(s.update_gather, static_cast<std::uint64_t>(bk.padded) * d.param);
  if (sh.zero >= 3) {
    // One bucket per segment, bucket k = segment L - k (buckets run from the head down).
    std::int64_t held = 0;
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
  TESSERA_THROW_IF(o.whole_tensors(), config_error, "optimizer ", o.name,
                   " keeps statistics per tensor: plan it from a llama_config, not a count");
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

}  // namespace tessera::plan
