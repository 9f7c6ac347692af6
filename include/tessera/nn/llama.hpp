#pragma once
/// \file nn/llama.hpp
/// A Llama decoder composed of modules (nn/embedding.hpp,
/// nn/transformer_block.hpp, nn/lm_head.hpp) over flat parameter and
/// gradient buffers, written once for every backend: `llama<P, host>` and
/// `llama<P, cuda>` are two instantiations of this class, whose kernels the
/// execution context picks (kernels/context.hpp).
///
/// Gradient contract (llm.c): parameter gradients accumulate (+=) into the
/// flat gradient buffer, so micro-batches of one optimizer step add up;
/// activation gradients are written (=). zero_grad() clears the buffer.
///
/// The forward pass is a push, the backward pass is a pop
/// (seeds/000_837c961be0ac0c27.txt): forward() fills an activation record
/// (`llama_record`) with exactly what backward() needs, and backward()
/// frees it as it consumes it, so activation memory is countable. Records
/// are the caller's (a `record_pool` holds one per micro-batch in flight),
/// so several micro-batches can run forward before their backwards, as a
/// pipeline schedule requires.
///
/// Model: embedding -> L blocks -> head (final rmsnorm + LM head fused with
/// cross-entropy, chunked over tokens). With tied embeddings
/// (llama_config::tie_word_embeddings) the LM head reads the embedding's
/// (V, H) weights and its weight gradient accumulates into the
/// embedding's, so the gradient is the sum of both uses; a pipeline's last
/// stage, which does not hold the embedding, holds a copy ("lm_head",
/// param_entry::tied) that the trainer keeps equal to it. In training, the head's forward
/// runs its backward too (the chunked LM head computes its gradient as it
/// goes, nn/lm_head.hpp), so a training forward already writes the loss,
/// the head's gradients, and the gradient the blocks' backward starts from.
///
/// Stages: a model may hold a range of the modules only (`stage_range`:
/// blocks [first, last), with or without the embedding and the head), as a
/// pipeline stage does; it then takes (without the embedding) and returns
/// (without the head) the hidden states at its boundaries, and its flat
/// buffer holds only its own segments (offsets from the stage's first
/// element of the whole model's layout).
///
/// Segments and hooks (nn/segment_hooks.hpp): the flat buffer is tiled by
/// segments -1 (embedding), 0..L-1 (blocks), L (head). The model reads
/// segment s's parameters from `segment_params(s)`, which is the segment's
/// place in the flat buffer unless a strategy points it elsewhere
/// (set_segment_params; ZeRO-3 points it at a gathered copy and builds the
/// model with `llama_options::external_params`, so no full parameter buffer
/// exists). Gradients likewise go to `segment_grads(s)` (set_segment_grads;
/// ZeRO-2/3 with `llama_options::external_grads`).
///
/// Memory: every tensor comes from the context's memory resource (on a GPU
/// the caching allocator, stream-ordered on the context's stream).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/nvtx.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/rope.hpp"
#include "tessera/kernels/weight_init.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/embedding.hpp"
#include "tessera/nn/fp8_linear.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/nn/llama_record.hpp"
#include "tessera/nn/lm_head.hpp"
#include "tessera/nn/param_layout.hpp"
#include "tessera/nn/segment_hooks.hpp"
#include "tessera/nn/transformer_block.hpp"
#include "tessera/precision/policy.hpp"

namespace tessera::detail {
// The communicator of a tensor-parallel layer family (a placeholder for dense).
template <class Layers>
struct kv_group_of {
  using type = char;
};
template <class Layers>
requires Layers::tensor_parallel struct kv_group_of<Layers> {
  using type = typename Layers::comm_type;
};
}  // namespace tessera::detail

namespace tessera::nn {

/// Llama model (or a stage of one) with precision policy `P` on backend
/// `Backend` (host or cuda), its GEMMs through the layer family `Layers`.
/// Not thread-safe; one instance per rank.
template <precision::policy P, class Backend = host, class Layers = dense_layers>
class llama {
 public:
  using precision_type = P;
  using backend_type = Backend;
  using context_type = kernels::context_t<Backend>;
  using layers_type = Layers;  ///< the layer family (nn::dense_layers, nn::tensor_parallel_layers)
  using Ctx = context_type;
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  using ActGrad = typename P::act_grad_type;
  using Acc = typename P::accum_type;
  using Rope = typename P::rope_type;
  using record = llama_record<P, Backend>;
  using block_type = transformer_block<P, Ctx, Layers>;
  using embed_type = embedding<P, Ctx, Layers>;
  using head_type = lm_head<P, Ctx, Layers>;

  /// Allocates parameters (unless opt.external_params; zero: call
  /// init_weights) and gradients (zero, unless opt.external_grads) of the
  /// stage, and the RoPE tables, from the context's resource. `ctx` is not
  /// owned and must outlive the model. Throws config_error for an invalid
  /// config, ce_chunk < 1, a bad checkpointing policy or stage range, or
  /// heads the backend's attention kernels cannot run (kernels::
  /// attention_check_shape; on a GPU the head dim must be 32, 64 or 128).
  llama(llama_config cfg, llama_options opt,
        const Ctx& ctx) requires std::same_as<Layers, dense_layers>
      : llama(std::move(cfg), opt, ctx, Layers{}) {}

  /// As above, on the tp group of `layers` (tensor_parallel_layers; not
  /// owned, must outlive the model): the flat buffers hold this tp rank's
  /// shards (make_llama_layout(cfg, {tp, rank})), init_weights draws each
  /// shard as its slice of the single-rank model's tensor, and the blocks
  /// reduce their partial sums over the group. When tp > nkv the model
  /// splits the group of the ranks sharing its key/value heads from the tp
  /// group (a collective: every tp rank constructs its model together). A
  /// device communicator (nccl_communicator) is set to enqueue on the
  /// context's stream (set_stream), the replica group too.
  /// With layers.sequence_parallel the training and evaluation forwards
  /// shard the norm and residual regions along the tokens (T must then be
  /// divisible by tp); generation never does. Throws config_error as
  /// check_tensor_parallel when tp does not split the heads or F.
  llama(llama_config cfg, llama_options opt, const Ctx& ctx, Layers layers)
      : cfg_(std::move(cfg)),
        opt_(opt),
        layout_(make_llama_layout(
            cfg_, {layers.size(), layers.rank()},
            opt.stage.head && !opt.stage.embedding ? tied_head::copy : tied_head::embedding)),
        ctx_(&ctx),
        layers_(layers) {
    TESSERA_THROW_IF(opt_.ce_chunk < 1, config_error, "ce_chunk=", opt_.ce_chunk, " must be >= 1");
    opt_.checkpointing.validate();
    attention_check_shape(ctx, cfg_.max_seq, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim());
    const std::int64_t L = cfg_.n_layers;
    stage_range& st = opt_.stage;
    if (st.last_block < 0) st.last_block = L;
    TESSERA_THROW_IF(st.first_block < 0 || st.first_block > st.last_block || st.last_block > L,
                     config_error, "stage blocks [", st.first_block, ", ", st.last_block,
                     ") are not a range of the model's ", L, " blocks");
    TESSERA_THROW_IF(!st.embedding && !st.head && st.first_block == st.last_block, config_error,
                     "a stage needs at least one module (blocks [", st.first_block, ", ",
                     st.last_block, "), no embedding, no head)");
    TESSERA_THROW_IF(st.embedding && st.first_block != 0, config_error,
                     "the embedding's stage must start at block 0 (first_block=", st.first_block,
                     ")");
    TESSERA_THROW_IF(st.head && st.last_block != L, config_error,
                     "the head's stage must end at the last block (last_block=", st.last_block,
                     " of ", L, ")");
    seg_begin_.push_back(0);
    for (int l = 0; l < static_cast<int>(L); ++l)
      seg_begin_.push_back(layout_.at("blocks." + std::to_string(l) + ".attn_norm").offset);
    seg_begin_.push_back(layout_.at("final_norm").offset);
    seg_begin_.push_back(layout_.total());
    lo_ = global_segment_begin(first_segment());
    hi_ = global_segment_end(last_segment());
    if constexpr (Layers::tensor_parallel) {
      static_assert((comm::buffer_space_of<typename Layers::comm_type> ==
                     comm::buffer_space::host) == Ctx::host_accessible,
                    "llama: the tp group's communicator must reduce the backend's memory (a "
                    "host communicator, local or mpi, for the host backend; "
                    "nccl_communicator for cuda)");
      // A device communicator enqueues on a stream: the tp group's
      // collectives go on the context's stream, behind the kernels that
      // produce their inputs and before those that read their outputs.
      using Comm = typename Layers::comm_type;
      if constexpr (requires(Comm & c) { c.set_stream(ctx.stream()); })
        layers.group->set_stream(ctx.stream());
      // After every check above: the split is a collective of the tp group.
      const int rep = kv_replicas(cfg_, layers.size());
      if (rep > 1) {
        kv_group_ =
            std::make_unique<Comm>(layers.group->split(layers.rank() / rep, layers.rank() % rep));
        if constexpr (requires(Comm & c) { c.set_stream(ctx.stream()); })
          kv_group_->set_stream(ctx.stream());
        layers.kv_group = kv_group_.get();
        layers_.kv_group = kv_group_.get();
      }
      sequence_parallel_ = layers.sequence_parallel && layers.size() > 1;
    }
    if constexpr (precision::fp8_linear<P>) {  // the stage's blocks' FP8 states, never moved
      opt_.fp8.validate();
      if constexpr (!Ctx::host_accessible) {  // cuBLASLt's FP8 matmuls: sm_89+, 16-byte rows
        const int device = Backend::current_device(), cc = Backend::compute_capability(device);
        TESSERA_THROW_IF(cc < 89, config_error, P::name, " on the GPU: device ", device,
                         " is sm_", cc, "; FP8 matmuls need sm_89 or later (Ada, Hopper)");
        const std::int64_t tp = layers.size(), hd = cfg_.head_dim();
        for (auto [what, n] : {std::pair<const char*, std::int64_t>{"dim", cfg_.dim},
                               {"query features / tp", cfg_.n_heads * hd / tp},
                               {"key/value features / tp", std::max(hd, cfg_.kv_dim() / tp)},
                               {"ffn_dim / tp", cfg_.ffn_dim / tp}})
          TESSERA_THROW_IF(n % 16 != 0, config_error, P::name, " on the GPU: ", what, " = ", n,
                           " must be a multiple of 16 (cuBLASLt's FP8 matmuls need 16-byte rows)");
      }
      fp8_.reserve(static_cast<std::size_t>((st.last_block - st.first_block) * block_linears));
      for (std::int64_t i = 0; i < (st.last_block - st.first_block) * block_linears; ++i)
        fp8_.emplace_back(opt_.fp8);
      // Their scalars in this context's memory, where the FP8 kernels use them.
      fp8_scalars_ = kernels::make_tensor<float>(
          ctx, static_cast<std::int64_t>(fp8_.size()) * fp8_linear_scalars);
      for (std::size_t i = 0; i < fp8_.size(); ++i)
        fp8_[i].attach(fp8_scalars_.data() + static_cast<std::ptrdiff_t>(i) * fp8_linear_scalars);
      fp8_write_scales();
    }
    for (int l = 0; l < static_cast<int>(L); ++l)
      blocks_.emplace_back(cfg_, layout_, l, global_segment_begin(l), layers, fp8_states(l));
    // Under tensor parallelism the vocabulary is split by rows (padded to a
    // multiple of tp): this rank's slice starts at the layout's shard_begin.
    const param_entry& emb = layout_.at("embedding");
    const std::int64_t v_begin = emb.shard_begin, Vl = emb.shp[0];
    if (st.embedding) {
      if constexpr (Layers::tensor_parallel)
        embed_ = embed_type(cfg_.vocab, cfg_.dim, 0, opt_.ignore_index, layers, v_begin, Vl);
      else
        embed_ = embed_type(cfg_.vocab, cfg_.dim, 0, opt_.ignore_index);
    }
    if (st.head) {
      const std::int64_t s0 = global_segment_begin(static_cast<int>(L));
      if constexpr (Layers::tensor_parallel)
        head_ = head_type(cfg_.vocab, cfg_.dim, cfg_.norm_eps, layout_.at("final_norm").offset - s0,
                          opt_.ce_chunk, opt_.ignore_index, layers, v_begin, Vl);
      else
        head_ = head_type(cfg_.vocab, cfg_.dim, cfg_.norm_eps, layout_.at("final_norm").offset - s0,
                          opt_.ce_chunk, opt_.ignore_index);
      // The LM head's weights: its own tensor (untied, or the last stage's
      // tied copy), or the embedding (tied, both on this stage), which the
      // embedding's and the head's vocabulary split alike.
      if (head_reads_embedding())
        head_weights_ = {-1, emb.offset - global_segment_begin(-1)};
      else
        head_weights_ = {static_cast<int>(L), layout_.at("lm_head").offset - s0};
    }
    if (!opt_.external_params) {
      params_ = kernels::make_tensor<Param>(ctx, flat_size());
      kernels::zero_elements(ctx, params_.data(), flat_size());
    }
    if (!opt_.external_grads) {
      grads_ = kernels::make_tensor<Grad>(ctx, flat_size());
      kernels::zero_elements(ctx, grads_.data(), flat_size());
    }
    seg_params_.assign(static_cast<std::size_t>(L + 2), nullptr);
    seg_grads_.assign(static_cast<std::size_t>(L + 2), nullptr);
    if (!opt_.external_params)
      for (int s = first_segment(); s <= last_segment(); ++s)
        set_segment_params(s, params_.data() + segment_begin(s));
    reset_segment_grads();
    const std::int64_t half = cfg_.head_dim() / 2, n = cfg_.max_seq * half;
    std::vector<Rope> cos(static_cast<std::size_t>(n)), sin(cos.size());
    // The frequencies (theta's, scaled by cfg_.rope_scaling) and the tables
    // in double on the host, rounded once to Rope; both backends read them.
    const std::vector<double> inv_freq = cfg_.rope_inv_freqs();
    kernels::rope_table(cos.data(), sin.data(), cfg_.max_seq, cfg_.head_dim(), inv_freq.data());
    rope_cos_ = kernels::make_tensor<Rope>(ctx, n);
    rope_sin_ = kernels::make_tensor<Rope>(ctx, n);
    ctx.from_host(rope_cos_.data(), cos.data(), cos.size() * sizeof(Rope));
    ctx.from_host(rope_sin_.data(), sin.data(), sin.size() * sizeof(Rope));
  }

  /// A temporary context would dangle: the model keeps a pointer to it.
  llama(llama_config, llama_options, const Ctx&&) = delete;
  llama(llama_config, llama_options, const Ctx&&, Layers) = delete;

  /// Host backend only: the default host context (host::default_resource()).
  explicit llama(llama_config cfg, llama_options opt = {}) requires std::same_as<Backend, host>
      : llama(std::move(cfg), opt, kernels::default_host_context()) {}

  llama(const llama&) = delete;
  llama& operator=(const llama&) = delete;

  const llama_config& config() const { return cfg_; }
  /// The whole model's layout (offsets of every tensor, also of other stages).
  const param_layout& layout() const { return layout_; }
  const llama_options& options() const { return opt_; }
  const Ctx& context() const { return *ctx_; }

  /// Context parallelism: `a` runs every block's attention over its cp
  /// group (not owned; it must outlive the model's calls), or null for
  /// none. With it, a micro-batch's T tokens are this rank's of sequences
  /// of T * cp tokens (head-tail, core/cp_shard.hpp: the loader's cut), its
  /// doc_start global positions, and RoPE rotates by the global positions;
  /// forward, backward and the evaluation forwards are then collective over
  /// the group. Generation (next_token_logits) runs on whole sequences.
  /// The host-window conveniences (forward_backward, forward_loss) take
  /// whole windows and stage this rank's tokens.
  void set_context_parallel(const cp_attention_for<Ctx, Param, ActGrad>* a) {
    cp_ = a;
    for (auto& b : blocks_) b.set_context_parallel(a);
  }
  /// The attention over the cp group, or null.
  const cp_attention_for<Ctx, Param, ActGrad>* context_parallel() const { return cp_; }
  /// Elements of this instance's flat buffers: its segments, with the
  /// layout's alignment padding (the whole layout().total() for the whole model).
  std::int64_t flat_size() const { return hi_ - lo_; }
  /// The flat element of the whole layout where this instance's buffer starts.
  std::int64_t flat_begin() const { return lo_; }
  /// Flat parameter buffer, (flat_size()) elements of param_type;
  /// nullptr with llama_options::external_params.
  Param* params() { return params_.data(); }
  const Param* params() const { return params_.data(); }
  /// Flat gradient buffer, same offsets, grad_type; nullptr with
  /// llama_options::external_grads.
  Grad* grads() { return grads_.data(); }
  const Grad* grads() const { return grads_.data(); }
  /// Real parameters this instance's layout holds (no padding): the whole
  /// model on one rank, this tp rank's shards under tensor parallelism.
  std::int64_t num_params() const { return layout_.num_params(); }
  /// RoPE tables (max_seq, hd/2) of the policy's rope_type, in the context's memory.
  const Rope* rope_cos() const { return rope_cos_.data(); }
  const Rope* rope_sin() const { return rope_sin_.data(); }
  /// The weight-decay ranges of this instance's flat buffer (offsets from flat_begin()).
  std::vector<param_range> param_ranges() const {
    std::vector<param_range> r;
    for (const auto& e : layout_.entries())
      if (e.offset >= lo_ && e.offset < hi_) {
        param_range x = e.range();
        x.begin -= lo_;
        x.end -= lo_;
        r.push_back(x);
      }
    return r;
  }

  /// Whether the LM head reads the embedding's weights and adds its
  /// gradient to the embedding's (tied embeddings on a stage holding both:
  /// the head's forward then reads and writes segment -1 too, so a strategy
  /// holding segments apart must have segment -1's parameters and gradients
  /// in place while the head runs).
  bool head_reads_embedding() const {
    return cfg_.tie_word_embeddings && opt_.stage.embedding && opt_.stage.head;
  }
  /// Whether this stage holds a copy of the tied embedding for its head
  /// (tied embeddings, the head without the embedding: the last stage of a
  /// pipeline): "lm_head" with param_entry::tied = "embedding", whose
  /// gradient must be summed with the first stage's before the update.
  bool holds_tied_copy() const {
    return cfg_.tie_word_embeddings && opt_.stage.head && !opt_.stage.embedding;
  }

  /// The elements (offsets from flat_begin()) of the tied tensor another
  /// pipeline stage holds too, whose gradient must be summed with that
  /// stage's before the norm and the update: the embedding on a stage with
  /// the embedding but not the head, its copy ("lm_head") on a stage with
  /// the head but not the embedding. Empty (begin == end) for untied
  /// embeddings and for a stage holding both.
  param_range shared_tied_range() const {
    if (!cfg_.tie_word_embeddings || opt_.stage.embedding == opt_.stage.head) return {};
    const param_entry& e = layout_.at(opt_.stage.embedding ? "embedding" : "lm_head");
    return {e.offset - lo_, e.offset - lo_ + e.numel, e.decay};
  }

  /// The tensor-parallel degree of the layer family (1: dense).
  int tp_size() const { return layers_.size(); }
  /// Whether training and evaluation shard the norm and residual regions
  /// along the tokens over the tp group (sequence parallelism).
  bool sequence_parallel() const { return sequence_parallel_; }
  /// The group of the tp ranks holding this rank's key/value heads when tp
  /// > nkv (their weight gradients are summed over it); nullptr otherwise.
  const auto* kv_replica_group() const {
    if constexpr (Layers::tensor_parallel)
      return kv_group_.get();
    else
      return static_cast<const void*>(nullptr);
  }
  /// Token rows of the residual stream for N = B T tokens: N, or N/tp under
  /// sequence parallelism (this rank's consecutive rows [r N/tp, (r+1) N/tp)).
  std::int64_t stream_rows(std::int64_t N) const {
    return sequence_parallel_ ? N / layers_.size() : N;
  }

  /// The ranges of this instance's flat buffer (offsets from flat_begin())
  /// whose squares this rank adds to the global gradient norm, so that the
  /// sum over the tp group counts every element of the model once: every
  /// tp shard (a key/value shard replicated over tp/nkv ranks on its first
  /// replica only), and the tensors every tp rank holds whole (the norm
  /// gains: the same gradient on each) on tp rank 0 only. Padding is never
  /// in a range. A tied copy (the last pipeline stage's "lm_head", its
  /// gradient the embedding's) is in none: the first stage counts it. On
  /// one rank: every tensor.
  std::vector<param_range> norm_ranges() const {
    std::vector<param_range> r;
    for (const auto& e : layout_.entries())
      if (e.offset >= lo_ && e.offset < hi_ && e.tied.empty() &&
          (e.shard_dim >= 0 ? e.replica == 0 : layers_.rank() == 0))
        r.push_back({e.offset - lo_, e.offset - lo_ + e.numel, e.decay});
    return r;
  }
  /// Sums one double in the context's memory over the tp group (nothing
  /// on one rank). Collective over the group.
  void tp_all_reduce_sum(double* d) const { layers_.all_reduce(partial_sum<double>{d, 1, 1}); }
  /// Gathers n values (the context's memory) of every tp rank into out[r n,
  /// (r + 1) n) in rank order (a whole-matrix optimizer's split momentum:
  /// optim::muon). `out` must not overlap `in`. Collective over the tp
  /// group; a copy on one rank.
  template <class T>
  void tp_all_gather(const T* in, T* out, std::int64_t n) const {
    if constexpr (Layers::tensor_parallel) {
      layers_.all_gather_values(in, out, static_cast<std::size_t>(n));
    } else {
      kernels::copy_elements(*ctx_, out, in, n);
    }
  }

  /// Segments of this instance: -1 embedding, 0..L-1 blocks, L head.
  int first_segment() const {
    return opt_.stage.embedding ? -1 : static_cast<int>(opt_.stage.first_block);
  }
  int last_segment() const {
    return opt_.stage.head ? static_cast<int>(cfg_.n_layers)
                           : static_cast<int>(opt_.stage.last_block) - 1;
  }
  /// Offset of segment s's first element in this instance's flat buffer;
  /// segment s is [segment_begin(s), segment_end(s)), and the segments tile
  /// [0, flat_size()).
  std::int64_t segment_begin(int s) const { return global_segment_begin(s) - lo_; }
  std::int64_t segment_end(int s) const { return global_segment_end(s) - lo_; }
  /// Where the model reads segment s's parameters: `p` holds
  /// segment_end(s) - segment_begin(s) elements in flat-buffer order. Not
  /// owned; must stay valid and unchanged while the model reads it.
  void set_segment_params(int s, const Param* p) { seg_params_[seg(s)] = p; }
  const Param* segment_params(int s) const { return seg_params_[seg(s)]; }
  /// Where backward accumulates (+=) segment s's parameter gradients: `g`
  /// holds segment_end(s) - segment_begin(s) elements in flat-buffer order.
  /// Not owned; must stay valid while a backward pass writes it.
  void set_segment_grads(int s, Grad* g) { seg_grads_[seg(s)] = g; }
  Grad* segment_grads(int s) const { return seg_grads_[seg(s)]; }
  /// Points every segment back at its place in the flat gradient buffer
  /// (nullptr with external_grads).
  void reset_segment_grads() {
    for (int s = first_segment(); s <= last_segment(); ++s)
      set_segment_grads(s, grads_.empty() ? nullptr : grads_.data() + segment_begin(s));
  }
  /// Installs per-segment hooks (nullptr: none). Not owned.
  void set_hooks(segment_hooks* h) { hooks_ = h; }

  /// Deterministic initialisation from `seed`: matrices ~ N(0, 0.02^2), the
  /// residual output projections (wo, w_down) scaled by 1/sqrt(2L) (GPT-2,
  /// Radford et al. 2019), norm gains 1. Each tensor draws from its own
  /// stream (seed, tensor index), so the values do not depend on the layout
  /// or the stage. Each element is computed from its index where the
  /// parameters live (kernels::weight_init: an OpenMP loop on the host, a
  /// Thrust call per tensor on a GPU, with no host copy of the buffer); on
  /// the host the values are init_llama_weights_range's bit for bit, on a
  /// GPU up to the rounding of the device's log and cos
  /// (kernels/weight_init.hpp). With llama_options::weights set, the
  /// weights are read from it instead (on the host, then copied in; each
  /// shard its slice of the whole tensors) and `seed` is unused.
  /// Throws config_error with external_params (use init_weights_range).
  void init_weights(std::uint64_t seed) {
    TESSERA_THROW_IF(params_.empty(), config_error,
                     "init_weights: the model has external parameters; use init_weights_range");
    if (opt_.weights == nullptr) {
      const auto tensors = llama_weight_init_tensors(cfg_, layout_, seed);
      weight_init(*ctx_, std::span<const kernels::weight_init_tensor>(tensors), lo_, hi_,
                  params_.data());
      return;
    }
    std::vector<Param> h(static_cast<std::size_t>(flat_size()));
    const auto& es = layout_.entries();
    const auto n = static_cast<std::int64_t>(es.size());
    // One tensor per thread: each reads its own elements.
#pragma omp parallel for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < n; ++i) {
      const auto& e = es[static_cast<std::size_t>(i)];
      const std::int64_t b = std::max(lo_, e.offset), en = std::min(hi_, e.offset + e.numel);
      if (b < en) init_range(seed, b, en, h.data() + (b - lo_));
    }
    // Alignment padding between tensors stays 0 (std::vector zero-fills).
    ctx_->from_host(params_.data(), h.data(), h.size() * sizeof(Param));
  }

  /// The same values as init_weights(seed) on the host (on a GPU, whose
  /// init_weights draws with the device's log and cos, up to the last bits
  /// of a float32: kernels/weight_init.hpp), for elements [lo, hi) of this
  /// instance's flat buffer, into host memory: out[i - lo] for i in
  /// [lo, hi); alignment padding is 0. A ZeRO shard initialises itself
  /// without building the full buffer.
  /// Precondition: 0 <= lo <= hi <= flat_size(); out holds hi - lo.
  void init_weights_range(std::uint64_t seed, std::int64_t lo, std::int64_t hi, Param* out) const {
    init_range(seed, lo + lo_, hi + lo_, out);
  }

  /// Sets every gradient to zero: the flat buffer, or with external_grads
  /// every segment whose gradients are set.
  void zero_grad() {
    if (!grads_.empty()) {
      kernels::zero_elements(*ctx_, grads_.data(), flat_size());
      return;
    }
    for (int s = first_segment(); s <= last_segment(); ++s)
      if (Grad* g = segment_grads(s))
        kernels::zero_elements(*ctx_, g, segment_end(s) - segment_begin(s));
  }

  /// Training forward of one micro-batch into `r` (which must be empty).
  /// - `mb`: (B, T) input ids in the context's memory (stages with the
  ///   embedding; ids in [0, V) or ignore_index: padding, a zero row with no
  ///   gradient) or the (B, T, H) hidden states from the previous stage;
  ///   (B, T) targets (stages with the head; ignore_index: not scored).
  /// - With the head: writes `*d_loss` (one double, context memory) = the
  ///   sum of -log p over the scored targets, and accumulates the head's
  ///   gradients, each scaled by `grad_scale` (1 / the scored tokens of the
  ///   whole optimizer step, over every micro-batch and rank).
  /// - Without the head: r.output holds the (B, T, H) stage output.
  /// Under sequence parallelism hidden states and the stage output hold
  /// this rank's N/tp token rows.
  /// Throws config_error if B or T < 1, T > max_seq, (sequence parallelism)
  /// T not divisible by tp, or (host) an id is outside [0, V); a forward
  /// that throws leaves `r` empty (its tensors freed).
  void forward(const micro_batch<Param>& mb, record& r, Acc grad_scale, double* d_loss) {
    TESSERA_THROW_IF(r.filled || r.weights_pending, error,
                     "forward: the record holds a micro-batch whose backward has "
                     "not run (one record per micro-batch in flight)");
    try {
      forward_into(mb, r, grad_scale, d_loss);
    } catch (...) {
      r = record{};
      throw;
    }
  }

  /// Backward of the micro-batch in `r`, which it empties: the blocks in
  /// reverse, then the embedding. Without the head, `grad_output` (rows, H,
  /// context memory) is d(loss)/d(stage output); without the embedding,
  /// r.grad_input holds d(loss)/d(stage input) on return. Parameter gradients
  /// accumulate (+=). A backward that throws leaves `r` empty.
  void backward(record& r, const ActGrad* grad_output = nullptr) {
    TESSERA_THROW_IF(!r.filled, error, "backward: the record holds no forward (run forward first)");
    try {
      backward_from(r, grad_output, false);
    } catch (...) {
      r = record{};
      throw;
    }
  }

  /// B of a split backward (zero-bubble schedules; Qi et al. 2023): as
  /// backward(), r.grad_input included, but the blocks' weight GEMMs and
  /// the embedding's scatter are left in `r` for backward_weight(), which
  /// must follow before `r` is reused. The norm gains' gradients are
  /// accumulated here; segment hooks: before_backward here, after_backward
  /// in backward_weight (a segment's gradients are complete only then).
  /// Throws as backward().
  void backward_input(record& r, const ActGrad* grad_output = nullptr) {
    TESSERA_THROW_IF(!r.filled, error,
                     "backward_input: the record holds no forward (run forward first)");
    try {
      backward_from(r, grad_output, true);
    } catch (...) {
      r = record{};
      throw;
    }
  }

  /// W of a split backward: the weight gradients backward_input() left in
  /// `r`, accumulated (+=), the same values backward() adds; `r` is empty on
  /// return. Throws tessera::error if `r` has no B pending.
  void backward_weight(record& r) {
    TESSERA_THROW_IF(!r.weights_pending, error,
                     "backward_weight: the record holds no backward_input (run it first)");
    try {
      weight_grads(r);
    } catch (...) {
      r = record{};
      throw;
    }
  }

 private:
  // Elements [lo, hi) of the whole layout: drawn from the seed, or read
  // from opt_.weights when set.
  void init_range(std::uint64_t seed, std::int64_t lo, std::int64_t hi, Param* out) const {
    if (opt_.weights != nullptr)
      load_llama_weights_range(layout_, *opt_.weights, lo, hi, out);
    else
      init_llama_weights_range(cfg_, layout_, seed, lo, hi, out);
  }

  void forward_into(const micro_batch<Param>& mb, record& r, Acc grad_scale, double* d_loss) {
    check_shapes(mb);
    r.grad_input.release();  // a stage's input gradient of the record's last use
    const Ctx& ctx = *ctx_;
    const block_shape s = shape(mb, sequence_parallel_);
    const std::int64_t N = s.N();
    r.B = mb.B;
    r.T = mb.T;
    r.doc_start = mb.doc_start;
    tensor<Param, Backend> x = embed_input(mb, &r.embedding, s);
    r.blocks.resize(static_cast<std::size_t>(opt_.stage.last_block - opt_.stage.first_block));
    if (!blocks_.empty()) {
      typename block_type::scratch proj = blocks_.front().make_scratch(ctx, s);
      for (std::int64_t l = opt_.stage.first_block; l < opt_.stage.last_block; ++l) {
        nvtx_range range("forward block ", l);
        hook(&segment_hooks::before_forward, static_cast<int>(l));
        const block_type& b = blocks_[static_cast<std::size_t>(l)];
        b.forward(ctx, x, r.blocks[static_cast<std::size_t>(l - opt_.stage.first_block)],
                  block_params(static_cast<int>(l)), s, proj, rope_cos_.data(), rope_sin_.data(),
                  opt_.checkpointing.recomputes(l));
        hook(&segment_hooks::after_forward, static_cast<int>(l));
      }
    }
    if (!opt_.stage.head) {
      r.output = std::move(x);
      r.filled = true;
      return;
    }
    TESSERA_NVTX_RANGE("lm head + cross-entropy");
    const int L = static_cast<int>(cfg_.n_layers);
    hook(&segment_hooks::before_forward, L);
    head_.forward(ctx, x.data(), mb.targets, N, segment_params_checked(L), head_weights(),
                  segment_grads_checked(L), head_weight_grads(), grad_scale, d_loss, r.head,
                  s.sequence_parallel);
    x.release();
    hook(&segment_hooks::after_backward, L);
    r.filled = true;
  }

  // The backward (split: its B, the weight GEMMs and the embedding's
  // scatter left in the record for weight_grads).
  void backward_from(record& r, const ActGrad* grad_output, bool split) {
    const Ctx& ctx = *ctx_;
    const block_shape s{r.B, r.T, sequence_parallel_, r.doc_start, cp_ != nullptr};
    const std::int64_t N = s.N(), H = cfg_.dim, R = stream_rows(N);
    tensor<ActGrad, Backend> dres;
    if (opt_.stage.head) {
      dres = head_.backward(r.head);
    } else {
      TESSERA_THROW_IF(grad_output == nullptr, error,
                       "backward: a stage without the head needs the gradient of its output");
      dres = kernels::make_tensor<ActGrad>(ctx, R * H);
      kernels::copy_elements(ctx, dres.data(), grad_output, R * H);
      r.output.release();
    }
    if (opt_.stage.last_block > opt_.stage.first_block) {
      typename block_type::workspace w =
          blocks_[static_cast<std::size_t>(opt_.stage.first_block)].make_workspace(ctx, s);
      tensor<Param, Backend> proj;  // the recompute's scratch, only if a block recomputes
      for (std::int64_t l = opt_.stage.last_block - 1; l >= opt_.stage.first_block; --l) {
        auto& rec = r.blocks[static_cast<std::size_t>(l - opt_.stage.first_block)];
        if (rec.h.empty() && proj.empty()) proj = kernels::make_tensor<Param>(ctx, N * H);
        nvtx_range range(split ? "backward_input block " : "backward block ", l);
        hook(split ? &segment_hooks::before_backward_input : &segment_hooks::before_backward,
             static_cast<int>(l));
        const block_type& b = blocks_[static_cast<std::size_t>(l)];
        if (split) {
          b.backward_input(ctx, rec, dres, block_params(static_cast<int>(l)),
                           block_grads(static_cast<int>(l)), s, w, proj, rope_cos_.data(),
                           rope_sin_.data());
          hook(&segment_hooks::after_backward_input, static_cast<int>(l));
          continue;
        }
        b.backward(ctx, rec, dres, block_params(static_cast<int>(l)),
                   block_grads(static_cast<int>(l)), s, w, proj, rope_cos_.data(),
                   rope_sin_.data());
        r.blocks.pop_back();
        hook(&segment_hooks::after_backward, static_cast<int>(l));
      }
    }
    r.filled = false;
    if (split) {
      r.weights_pending = true;
      if (opt_.stage.embedding)
        r.grad_embedding = std::move(dres);
      else
        r.grad_input = std::move(dres);
      return;
    }
    if (opt_.stage.embedding) {
      TESSERA_NVTX_RANGE("embedding backward");
      hook(&segment_hooks::before_backward, -1);
      embed_.backward(ctx, r.embedding, dres.data(), segment_grads_checked(-1),
                      s.sequence_parallel);
      hook(&segment_hooks::after_backward, -1);
    } else {
      r.grad_input = std::move(dres);
    }
  }

  // W of a split backward: the blocks' weight GEMMs in reverse, then the
  // embedding's scatter; each segment's after_backward once it is complete.
  void weight_grads(record& r) {
    const Ctx& ctx = *ctx_;
    const block_shape s{r.B, r.T, sequence_parallel_, r.doc_start, cp_ != nullptr};
    if (opt_.stage.last_block > opt_.stage.first_block) {
      typename block_type::workspace w =
          blocks_[static_cast<std::size_t>(opt_.stage.first_block)].make_weight_workspace(ctx, s);
      for (std::int64_t l = opt_.stage.last_block - 1; l >= opt_.stage.first_block; --l) {
        nvtx_range range("backward_weight block ", l);
        blocks_[static_cast<std::size_t>(l)].backward_weight(
            ctx, r.blocks[static_cast<std::size_t>(l - opt_.stage.first_block)],
            block_grads(static_cast<int>(l)), s, w);
        r.blocks.pop_back();
        hook(&segment_hooks::after_backward, static_cast<int>(l));
      }
    }
    if (opt_.stage.embedding) {
      TESSERA_NVTX_RANGE("embedding backward");
      hook(&segment_hooks::before_backward, -1);
      embed_.backward(ctx, r.embedding, r.grad_embedding.data(), segment_grads_checked(-1),
                      s.sequence_parallel);
      r.grad_embedding.release();
      hook(&segment_hooks::after_backward, -1);
    }
    r.weights_pending = false;
  }

 public:
  /// Evaluation forward of one micro-batch on a stage with the head (the
  /// whole model, or the last pipeline stage fed mb.hidden): `*d_loss` =
  /// the sum of -log p over the scored targets; no gradient touched, no
  /// record kept (each block's activations are freed after it). Throws
  /// config_error on a stage without the head.
  void forward_loss(const micro_batch<Param>& mb, double* d_loss) {
    TESSERA_THROW_IF(!opt_.stage.head, config_error,
                     "forward_loss: this pipeline stage has no head (use forward_hidden)");
    const Ctx& ctx = *ctx_;
    const block_shape s = shape(mb, sequence_parallel_);
    tensor<Param, Backend> x = forward_no_record(mb, s);
    const int L = static_cast<int>(cfg_.n_layers);
    hook(&segment_hooks::before_forward, L);
    head_.forward_loss(ctx, x.data(), mb.targets, s.N(), segment_params_checked(L), head_weights(),
                       d_loss, s.sequence_parallel);
    hook(&segment_hooks::after_forward, L);
  }

  /// Evaluation forward of a stage without the head: the (rows, H) hidden
  /// states after its last block (rows = B T, or B T / tp under sequence
  /// parallelism unless `whole_rows`; `whole_rows`, generation's, also runs
  /// whole sequences under context parallelism), from the ids (the embedding's stage)
  /// or mb.hidden; no gradient touched, no record kept. Throws
  /// config_error on a stage with the head, and as forward().
  tensor<Param, Backend> forward_hidden(const micro_batch<Param>& mb, bool whole_rows = false) {
    TESSERA_THROW_IF(opt_.stage.head, config_error,
                     "forward_hidden: this stage ends with the head (use forward_loss)");
    // whole_rows: a pipeline's generation, on whole sequences (never split)
    return forward_no_record(
        mb, shape(mb, sequence_parallel_ && !whole_rows, cp_ != nullptr && !whole_rows));
  }

  /// Next-token logits (V float32, context memory) of the last pipeline
  /// stage, from the (T, H) hidden states `mb.hidden` of one sequence (B =
  /// 1, never token-sharded) the previous stage produced. Throws
  /// config_error on a stage without the head.
  void next_token_logits_from(const micro_batch<Param>& mb, float* d_logits) {
    TESSERA_THROW_IF(!opt_.stage.head, config_error,
                     "next_token_logits_from: this pipeline stage has no head");
    const block_shape s = shape(mb, false, false);
    tensor<Param, Backend> x = forward_no_record(mb, s);
    const int L = static_cast<int>(cfg_.n_layers);
    hook(&segment_hooks::before_forward, L);
    head_.logits(*ctx_, d_logits, x.data() + (mb.T - 1) * cfg_.dim, segment_params_checked(L),
                 head_weights());
    hook(&segment_hooks::after_forward, L);
  }

  // ---- host-memory conveniences (tests, generation, any backend) -----------------------------

  /// Forward and backward of one micro-batch of windows in host memory:
  /// `h_windows` (B, T+1) int32; position (b, t) reads window[b][t] and is
  /// scored against window[b][t+1] unless that is ignore_index. Copies the
  /// inputs and targets into the context's memory, runs forward and
  /// backward, reads the loss back. Returns its sum and the scored count.
  /// `h_doc_start` (B, T) int32 in host memory, or null: packed documents
  /// (micro_batch::doc_start, e.g. from data::document_starts); throws
  /// config_error unless each row's starts lie in [0, t] and never decrease.
  loss_sum forward_backward(const std::int32_t* h_windows, std::int64_t B, std::int64_t T,
                            Acc grad_scale, const std::int32_t* h_doc_start = nullptr) {
    staged_batch b(*this, h_windows, B, T, h_doc_start);
    record r;
    forward(b.batch(), r, grad_scale, b.loss());
    backward(r);
    return b.result();
  }
  /// Forward only, windows in host memory (as forward_backward): the loss
  /// sum and the scored count; no gradient touched.
  loss_sum forward_loss(const std::int32_t* h_windows, std::int64_t B, std::int64_t T,
                        const std::int32_t* h_doc_start = nullptr) {
    staged_batch b(*this, h_windows, B, T, h_doc_start);
    forward_loss(b.batch(), b.loss());
    return b.result();
  }

  /// Next-token logits (V float32, host memory) after the sequence
  /// h_ids[0, T) (host memory, B = 1), on the model's backend. Throws
  /// config_error if T < 1, T > max_seq or (host) an id is outside [0, V).
  void next_token_logits(const std::int32_t* h_ids, std::int64_t T, float* h_logits) {
    require_whole_model("next_token_logits");
    const Ctx& ctx = *ctx_;
    tensor<std::int32_t, Backend> ids = kernels::make_tensor<std::int32_t>(ctx, T);
    ctx.from_host(ids.data(), h_ids, static_cast<std::size_t>(T) * sizeof(std::int32_t));
    micro_batch<Param> mb{ids.data(), nullptr, nullptr, 1, T};
    // one sequence of any length: never token-sharded, never split over cp
    const block_shape s = shape(mb, false, false);
    tensor<Param, Backend> x = forward_no_record(mb, s);
    const int L = static_cast<int>(cfg_.n_layers);
    hook(&segment_hooks::before_forward, L);
    tensor<float, Backend> logits = kernels::make_tensor<float>(ctx, cfg_.vocab);
    head_.logits(ctx, logits.data(), x.data() + (T - 1) * cfg_.dim, segment_params_checked(L),
                 head_weights());
    hook(&segment_hooks::after_forward, L);
    ctx.to_host(h_logits, logits.data(), static_cast<std::size_t>(cfg_.vocab) * sizeof(float));
  }

  // ---- what the modules allocate (the planner sums these) ----------------------------------

  /// Bytes a training forward of a (B, T) micro-batch leaves in its record
  /// for the backward: each block's record (or, checkpointed, its input),
  /// the embedding's ids and the head's input gradient (or the stage output).
  std::int64_t record_bytes(std::int64_t B, std::int64_t T) const {
    const std::int64_t N = B * T, R = stream_rows(N);
    std::int64_t bytes = 0;
    for (std::int64_t l = opt_.stage.first_block; l < opt_.stage.last_block; ++l) {
      block_bytes b = blocks_[static_cast<std::size_t>(l)].bytes();
      if (sequence_parallel_) b.rows_div = layers_.size();
      bytes += opt_.checkpointing.recomputes(l) ? b.input(N) : b.record(N);
    }
    if (opt_.stage.embedding) bytes += embedding_record<Backend>::bytes(N);
    bytes += opt_.stage.head ? R * head_.record_bytes_per_token()
                             : R * cfg_.dim * static_cast<std::int64_t>(sizeof(Param));
    return bytes;
  }
  /// The blocks' modules (the planner reads their byte counts).
  const std::vector<block_type>& blocks() const {
    return blocks_;
  }

  // ---- FP8 policies (precision::fp8_linear<P>; empty otherwise) ------------------------------

  /// The FP8 states of the stage's blocks: block_linears per block
  /// (block_linear_names order), block first_block's first.
  std::span<fp8_linear_state> fp8_linear_states() {
    return fp8_;
  }
  std::span<const fp8_linear_state> fp8_linear_states() const {
    return fp8_;
  }
  /// Block l's block_linears FP8 states, or nullptr for a block outside the
  /// stage (or a policy without FP8).
  fp8_linear_state* fp8_states(int l) {
    if (fp8_.empty() || l < opt_.stage.first_block || l >= opt_.stage.last_block) return nullptr;
    return &fp8_[static_cast<std::size_t>((l - opt_.stage.first_block) * block_linears)];
  }
  /// The FP8 states' scalars (fp8_linear_scalars per state, fp8_linear_states
  /// order) copied from the context's memory (waits for the context's
  /// queued work). Empty without FP8.
  std::vector<float> fp8_scalars_to_host() const {
    std::vector<float> h(static_cast<std::size_t>(fp8_scalars_.numel()));
    if (!h.empty()) ctx_->to_host(h.data(), fp8_scalars_.data(), h.size() * sizeof(float));
    return h;
  }
  /// Writes every FP8 state's scalars from its host scales
  /// (fp8_linear_state::write_scalars: the scales, zero amaxes) into the
  /// context's memory: after the host scales change (a recorded step, a
  /// restore) and to clear a skipped step's amaxes.
  void fp8_write_scales() {
    if (fp8_.empty()) return;
    std::vector<float> h(fp8_.size() * fp8_linear_scalars);
    for (std::size_t i = 0; i < fp8_.size(); ++i)
      fp8_[i].write_scalars(h.data() + i * fp8_linear_scalars);
    ctx_->from_host(fp8_scalars_.data(), h.data(), h.size() * sizeof(float));
  }
  /// The stage's FP8 states by global linear name ("blocks.3.attn.wq":
  /// fp8_linear_state::state(), current scaling's scales as the kernels
  /// left them), for a checkpoint's run state; an empty object without FP8.
  nlohmann::json fp8_state() const {
    nlohmann::json j = nlohmann::json::object();
    const std::vector<float> h = fp8_scalars_to_host();
    for (std::size_t i = 0; i < fp8_.size(); ++i) {
      fp8_linear_state s = fp8_[i];
      s.read_current_scales(h.data() + i * fp8_linear_scalars);
      j[fp8_name(i)] = s.state();
    }
    return j;
  }
  /// Restores the stage's FP8 states from `j` (as fp8_state() wrote, any
  /// other blocks ignored). Throws io_error naming a linear `j` lacks or
  /// whose state is malformed.
  void restore_fp8_state(const nlohmann::json& j) {
    for (std::size_t i = 0; i < fp8_.size(); ++i) {
      const std::string n = fp8_name(i);
      TESSERA_THROW_IF(!j.is_object() || !j.contains(n), io_error, "the FP8 state has no ", n);
      try {
        fp8_[i].restore(j[n]);
      } catch (const io_error& e) {
        throw io_error(::tessera::detail::str(n, ": ", e.what()));
      }
    }
    fp8_write_scales();
  }

 private:
  // The global name of FP8 state i ("blocks.<l>.attn.wq").
  std::string fp8_name(std::size_t i) const {
    const std::int64_t l = opt_.stage.first_block + static_cast<std::int64_t>(i) / block_linears;
    return "blocks." + std::to_string(l) + "." + block_linear_names[i % block_linears];
  }

  // Host windows staged into the context's memory for one call.
  struct staged_batch {
    tensor<std::int32_t, Backend> tok;  // (2N): inputs, then targets
    tensor<std::int32_t, Backend> doc;  // (N): document starts, or empty
    tensor<double, Backend> d_loss;     // (1)
    const Ctx* ctx;
    std::int64_t B, T, scored = 0;
    // Under context parallelism (the model's cp attention set) the windows
    // are whole and each rank stages its tokens (cp_shard::take): T is
    // then this rank's T/cp, the document starts stay global positions,
    // and the loss is over this rank's targets.
    staged_batch(llama& m, const std::int32_t* h_windows, std::int64_t B_, std::int64_t T_,
                 const std::int32_t* h_doc_start = nullptr)
        : ctx(m.ctx_), B(B_), T(T_) {
      // (T_ itself is checked by check_shapes below, naming the model)
      const cp_shard sh = m.cp_ ? m.cp_->shard(T_) : cp_shard{T_, 1, 0};
      T = sh.tokens();
      m.check_shapes(micro_batch<Param>{nullptr, nullptr, nullptr, B, T});
      const std::int64_t N = B * T;
      std::vector<std::int32_t> h(static_cast<std::size_t>(2 * N));
      for (std::int64_t b = 0; b < B; ++b) {
        sh.take(h_windows + b * (T_ + 1), h.data() + b * T);
        sh.take(h_windows + b * (T_ + 1) + 1, h.data() + N + b * T);
      }
      scored = std::count_if(h.begin() + N, h.end(),
                             [&](std::int32_t id) { return id != m.opt_.ignore_index; });
      tok = kernels::make_tensor<std::int32_t>(*ctx, 2 * N);
      ctx->from_host(tok.data(), h.data(), h.size() * sizeof(std::int32_t));
      if (h_doc_start != nullptr) {
        // RoPE rotates t by t - doc_start[t], and the kernels find a tile's
        // keys from its first and last query: each row's starts must lie in
        // [0, t] and never decrease (data::document_starts gives such).
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t t = 0; t < T_; ++t) {
            const std::int32_t v = h_doc_start[b * T_ + t];
            const std::int32_t lo = t == 0 ? 0 : h_doc_start[b * T_ + t - 1];
            TESSERA_THROW_IF(v < lo || v > t, config_error, "document start ", v, " at row ", b,
                             " position ", t, " must lie in [", lo, ", ", t,
                             "] (a row's starts never decrease and never pass their position)");
          }
        std::vector<std::int32_t> mine(static_cast<std::size_t>(N));
        for (std::int64_t b = 0; b < B; ++b) sh.take(h_doc_start + b * T_, mine.data() + b * T);
        doc = kernels::make_tensor<std::int32_t>(*ctx, N);
        ctx->from_host(doc.data(), mine.data(), mine.size() * sizeof(std::int32_t));
      }
      d_loss = kernels::make_tensor<double>(*ctx, 1);
    }
    micro_batch<Param> batch() const {
      return {tok.data(), tok.data() + B * T, nullptr, B, T, doc.empty() ? nullptr : doc.data()};
    }
    double* loss() { return d_loss.data(); }
    loss_sum result() const {
      loss_sum r;
      ctx->to_host(&r.sum, d_loss.data(), sizeof(double));
      r.scored = scored;
      return r;
    }
  };

  std::int64_t global_segment_begin(int s) const {
    return seg_begin_[seg(s)];
  }
  std::int64_t global_segment_end(int s) const {
    return seg_begin_[seg(s) + 1];
  }
  std::size_t seg(int s) const {
    TESSERA_EXPECTS(s >= -1 && s <= static_cast<int>(cfg_.n_layers), "segment id out of range");
    return static_cast<std::size_t>(s + 1);
  }
  void hook(void (segment_hooks::*fn)(int), int s) {
    if (hooks_) (hooks_->*fn)(s);
  }
  const Param* segment_params_checked(int s) const {
    const Param* p = segment_params(s);
    TESSERA_THROW_IF(p == nullptr, error, "segment ", s, " has no parameters set");
    return p;
  }
  Grad* segment_grads_checked(int s) const {
    Grad* g = segment_grads(s);
    TESSERA_THROW_IF(g == nullptr, error, "segment ", s, " has no gradients set");
    return g;
  }
  // The LM head's (Vl, H) weights and their gradient (head_weights_).
  const Param* head_weights() const {
    return segment_params_checked(head_weights_.segment) + head_weights_.offset;
  }
  Grad* head_weight_grads() const {
    return segment_grads_checked(head_weights_.segment) + head_weights_.offset;
  }
  Grad* block_grads(int l) const {
    Grad* g = segment_grads(l);
    TESSERA_THROW_IF(g == nullptr, error, "segment ", l, " (block ", l, ") has no gradients set");
    return g;
  }
  const Param* block_params(int l) const {
    const Param* p = segment_params(l);
    TESSERA_THROW_IF(p == nullptr, error, "segment ", l, " (block ", l, ") has no parameters set");
    return p;
  }
  void require_whole_model(const char* what) const {
    TESSERA_THROW_IF(!opt_.stage.embedding || !opt_.stage.head, config_error, what,
                     " needs the whole model (this instance is a pipeline stage)");
  }
  void check_shapes(const micro_batch<Param>& mb) const {
    (void)shape(mb, sequence_parallel_);
  }
  // The blocks' shape of a micro-batch, sequence-parallel if `sp`, its
  // tokens this rank's of sequences split over the cp group if `split`
  // (training and evaluation under set_context_parallel). Throws
  // config_error for B or T < 1, T (times cp when split) > max_seq, (sp) T
  // not divisible by tp, or, for FP8 GEMMs on the GPU, B T not a multiple
  // of 16.
  block_shape shape(const micro_batch<Param>& mb, bool sp) const {
    return shape(mb, sp, cp_ != nullptr);
  }
  block_shape shape(const micro_batch<Param>& mb, bool sp, bool split) const {
    TESSERA_THROW_IF(mb.B < 1, config_error, "micro-batch B=", mb.B, " must be >= 1");
    TESSERA_THROW_IF(mb.T < 1, config_error, "sequence length T=", mb.T, " must be >= 1");
    if (split)
      TESSERA_THROW_IF(mb.T * cp_->size() > cfg_.max_seq, config_error, "sequence length T=",
                       mb.T * cp_->size(), " (", mb.T, " tokens on each of cp=", cp_->size(),
                       " ranks) exceeds the model's max_seq=", cfg_.max_seq);
    else
      TESSERA_THROW_IF(mb.T > cfg_.max_seq, config_error, "sequence length T=", mb.T,
                       " exceeds the model's max_seq=", cfg_.max_seq);
    if (sp) check_sequence_parallel(mb.T, layers_.size());
    if constexpr (precision::fp8_linear<P> && !Ctx::host_accessible)
      TESSERA_THROW_IF(mb.B * mb.T % 16 != 0, config_error, P::name, " on the GPU: ",
                       mb.B * mb.T, " tokens per micro-batch (B=", mb.B, " x T=", mb.T,
                       ") must be a multiple of 16 (cuBLASLt's FP8 matmuls need 16-byte rows)");
    return {mb.B, mb.T, sp, mb.doc_start, split};
  }

  // The stage input as (N, H) hidden states: the embedding of the ids (into
  // `rec` when training), or a copy of the previous stage's output.
  // Under sequence parallelism (s) the hidden states are this rank's rows.
  tensor<Param, Backend> embed_input(const micro_batch<Param>& mb, embedding_record<Backend>* rec,
                                     block_shape s) {
    const Ctx& ctx = *ctx_;
    const std::int64_t N = mb.B * mb.T, H = cfg_.dim,
                       R = s.sequence_parallel ? N / layers_.size() : N;
    if (!opt_.stage.embedding) {
      TESSERA_THROW_IF(mb.hidden == nullptr, error,
                       "forward: a stage without the embedding needs the hidden states");
      tensor<Param, Backend> x = kernels::make_tensor<Param>(ctx, R * H);
      kernels::copy_elements(ctx, x.data(), mb.hidden, R * H);
      return x;
    }
    TESSERA_THROW_IF(mb.inputs == nullptr, error, "forward: no input ids");
    TESSERA_NVTX_RANGE("embedding forward");
    hook(&segment_hooks::before_forward, -1);
    tensor<Param, Backend> x =
        rec ? embed_.forward(ctx, mb.inputs, N, segment_params_checked(-1), *rec,
                             s.sequence_parallel)
            : embed_.forward_no_record(ctx, mb.inputs, N, segment_params_checked(-1),
                                       s.sequence_parallel);
    hook(&segment_hooks::after_forward, -1);
    return x;
  }

  // The stage's embedding (or its input) and blocks without records
  // (evaluation: the FP8 scales are read, not moved).
  tensor<Param, Backend> forward_no_record(const micro_batch<Param>& mb, block_shape s) {
    const Ctx& ctx = *ctx_;
    struct unobserved {  // the FP8 states observe again on every exit
      std::vector<fp8_linear_state>& v;
      explicit unobserved(std::vector<fp8_linear_state>& s) : v(s) {
        for (auto& f : v) f.observe = false;
      }
      ~unobserved() {
        for (auto& f : v) f.observe = true;
      }
    } guard(fp8_);
    tensor<Param, Backend> x = embed_input(mb, nullptr, s);
    typename block_type::scratch proj;
    if (opt_.stage.last_block > opt_.stage.first_block)
      proj = blocks_[static_cast<std::size_t>(opt_.stage.first_block)].make_scratch(ctx, s);
    for (std::int64_t l = opt_.stage.first_block; l < opt_.stage.last_block; ++l) {
      hook(&segment_hooks::before_forward, static_cast<int>(l));
      blocks_[static_cast<std::size_t>(l)].forward_no_record(
          ctx, x, block_params(static_cast<int>(l)), s, proj, rope_cos_.data(), rope_sin_.data());
      hook(&segment_hooks::after_forward, static_cast<int>(l));
    }
    return x;
  }

  llama_config cfg_;
  llama_options opt_;
  param_layout layout_;
  const Ctx* ctx_;
  Layers layers_{};                      // the layer family (its tp group under tensor parallelism)
  std::vector<std::int64_t> seg_begin_;  // L+3 boundaries of the whole layout
  std::int64_t lo_ = 0, hi_ = 0;         // this instance's part of the whole layout
  tensor<Param, Backend> params_;        // (flat_size) flat parameters; empty with external_params
  tensor<Grad, Backend> grads_;          // (flat_size) flat gradients; empty with external_grads
  tensor<Rope, Backend> rope_cos_, rope_sin_;  // (max_seq, hd/2) each, in the policy's rope_type
  std::vector<const Param*> seg_params_;       // L+2: where segment s's parameters are read
  std::vector<Grad*> seg_grads_;               // L+2: where segment s's gradients accumulate
  segment_hooks* hooks_ = nullptr;
  bool sequence_parallel_ = false;  // training and evaluation shard the tokens over tp
  // tp > nkv: the ranks sharing this rank's key/value heads, split from the tp group
  std::unique_ptr<typename tessera::detail::kv_group_of<Layers>::type> kv_group_;
  embed_type embed_;
  std::vector<block_type> blocks_;  // every block of the model (only the stage's run)
  const cp_attention_for<Ctx, Param, ActGrad>* cp_ = nullptr;  // context parallelism
  head_type head_;
  // Where the LM head's weights are: segment L's "lm_head", or with tied
  // embeddings on a stage holding both, segment -1's "embedding".
  struct {
    int segment = 0;
    std::int64_t offset = 0;  // from the segment's first element
  } head_weights_;
  // FP8 policies: block_linears states per block of the stage, block
  // first_block's first (the blocks point into it: built once, never resized).
  std::vector<fp8_linear_state> fp8_;
  tensor<float, Backend> fp8_scalars_;  // their scalars, fp8_linear_scalars each (context memory)
};

}  // namespace tessera::nn
