#pragma once
/// \file nn/transformer_block.hpp
/// One pre-norm Llama block as a module, forward and backward side by side
/// (Touvron et al. 2023):
///
///   xn1 = rmsnorm(x);  q,k,v = xn1 Wq^T, xn1 Wk^T, xn1 Wv^T;  rope(q, k)
///   a = causal_attention(q, k, v);  x' = x + a Wo^T
///   xn2 = rmsnorm(x');  h = silu(xn2 Wg^T) * (xn2 Wu^T);  y = x' + h Wd^T
///
/// Gradient contract (llm.c): parameter gradients accumulate (+=), the
/// residual-stream gradient is written (=). forward() saves exactly what
/// backward() needs in a `block_record`; backward() frees it as it goes.
/// Under activation checkpointing (nn/checkpointing.hpp) the record keeps
/// only the block input and backward recomputes the rest first.
///
/// One implementation for every backend and every layer family: the
/// element-wise kernels are called through the context (argument-dependent
/// lookup picks the host or the CUDA overload), the GEMMs through the
/// `Layers` family's linear layers (nn/linear.hpp). The block reads its
/// parameters from one pointer to the first element of its segment of the
/// flat buffer (nn/segment_hooks.hpp), so the caller decides where they
/// live: inside the flat buffer, or a gathered copy under ZeRO-3.

#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/core/placement.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/rmsnorm.hpp"
#include "tessera/kernels/rope.hpp"
#include "tessera/kernels/swiglu.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/context_parallel.hpp"
#include "tessera/nn/fp8_linear.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/param_layout.hpp"
#include "tessera/precision/policy.hpp"

namespace tessera::nn {

/// What one block's forward saves for its backward (N = B*T token rows).
/// A checkpointed block keeps x_in only; the rest is empty until backward
/// recomputes it.
template <precision::policy P, class Backend>
struct block_record {
  using Param = typename P::param_type;
  using Acc = typename P::accum_type;
  tensor<Param, Backend> x_in;   ///< (rows, H) block input (residual stream; rows = N, N/tp sequence-parallel)
  tensor<Acc, Backend> rstd1;    ///< (rows)
  tensor<Param, Backend> xn1;    ///< (rows, H)
  tensor<Param, Backend> q;      ///< (N, nh*hd) after RoPE (this rank's heads under tp)
  tensor<Param, Backend> k, v;   ///< (N, nkv*hd), k after RoPE
  tensor<Param, Backend> att;    ///< (N, nh*hd) attention output
  tensor<Acc, Backend> lse;      ///< (B, nh, T)
  tensor<Param, Backend> x_mid;  ///< (rows, H) after the attention residual
  tensor<Acc, Backend> rstd2;    ///< (rows)
  tensor<Param, Backend> xn2;    ///< (rows, H)
  tensor<Param, Backend> gate;   ///< (N, F) (F/tp under tp)
  tensor<Param, Backend> up;     ///< (N, F)
  tensor<Param, Backend> h;      ///< (N, F) silu(gate) * up
  // Between a split backward's B and W (zero-bubble schedules) the record
  // keeps xn1, att, xn2 and h, the weight GEMMs' inputs, and these output
  // gradients; every other tensor is freed by B.
  using ActGrad = typename P::act_grad_type;
  tensor<ActGrad, Backend> d_down;  ///< (N, H) gradient of the down projection's output
  tensor<ActGrad, Backend> d_gate, d_up;  ///< (N, F) of gate's and up's outputs
  tensor<ActGrad, Backend> d_o;     ///< (N, H) of the attention output projection's output
  tensor<ActGrad, Backend> d_q;     ///< (N, Hq) of q's output (before RoPE's backward: after it)
  tensor<ActGrad, Backend> d_k, d_v;  ///< (N, KV) of k's (after RoPE's backward) and v's outputs
  /// Between B and W.
  bool weights_pending() const { return !d_down.empty(); }
};

/// Sizes of one block call (a micro-batch of B sequences of T tokens).
/// With `sequence_parallel` (a tensor-parallel family only) the residual
/// stream, the norms and their records hold N/tp token rows: this rank's
/// consecutive rows [r N/tp, (r+1) N/tp) of the (B T) rows.
struct block_shape {
  std::int64_t B = 0, T = 0;
  bool sequence_parallel = false;
  /// (B, T) int32 in the context's memory, or null: the first position of
  /// each token's document when documents are packed into the rows (RoPE
  /// rotates by the position in the document, attention stays inside it:
  /// kernels::attention_mask); null: one document per row.
  const std::int32_t* doc_start = nullptr;
  /// The T tokens are this rank's of sequences split over the blocks' cp
  /// group (transformer_block::set_context_parallel; head-tail,
  /// core/cp_shard.hpp): attention runs over the group, RoPE rotates by the
  /// global positions, and doc_start holds global positions. False: whole
  /// sequences (and always for generation).
  bool context_parallel = false;
  std::int64_t N() const { return B * T; }
};

/// Scratch gradients one backward pass reuses across its blocks.
template <precision::policy P, class Backend>
struct block_workspace {
  using ActGrad = typename P::act_grad_type;
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  tensor<ActGrad, Backend> dxn;             ///< (N, H)
  tensor<ActGrad, Backend> datt, dq;        ///< (N, Hq): nh*hd of this rank's heads
  tensor<ActGrad, Backend> dk, dv;          ///< (N, KV)
  tensor<ActGrad, Backend> dh, dgate, dup;  ///< (N, F)
  // Sequence parallelism only (empty otherwise):
  tensor<ActGrad, Backend> dy;       ///< (N, H) the residual gradient gathered over tp
  tensor<ActGrad, Backend> dx_rows;  ///< (N/tp, H) a norm input gradient, reduce-scattered
  tensor<Param, Backend> xg;         ///< (N, H) a norm output gathered again (and the recompute's)
  tensor<Grad, Backend> dgain;       ///< (H) this rank's part of a norm gain's gradient
  /// Replicated key/value heads only: (KV, H) this rank's part of wk's or
  /// wv's gradient before the replicas sum it.
  tensor<Grad, Backend> dw;
};

/// The forward's (N, H) scratch, reused across the blocks: the
/// row-parallel outputs' partial sums, and under sequence parallelism the
/// norm output gathered over tp.
template <precision::policy P, class Backend>
struct block_scratch {
  tensor<typename P::param_type, Backend> proj;      ///< (N, H)
  tensor<typename P::param_type, Backend> gathered;  ///< (N, H), sequence parallelism only
};

/// The bytes one block allocates for N token rows, by part, for element
/// sizes given at run time (the planner's view of the module; the module's
/// own counts, record_bytes_per_token() and friends, are these with the
/// sizes of its policy).
struct block_bytes {
  std::int64_t H = 0, KV = 0, F = 0, nh = 0;
  std::int64_t param = 4, act_grad = 4, accum = 4;  ///< bytes per element
  /// q and attention-output features: nh*hd of this rank's heads (H on one
  /// rank; KV, F and nh are this rank's too under tensor parallelism).
  std::int64_t Hq = 0;
  /// The divisor of the token rows of the residual stream and the norms:
  /// tp under sequence parallelism, else 1.
  std::int64_t rows_div = 1;
  std::int64_t grad = 4;       ///< bytes per parameter-gradient element
  std::int64_t kv_scratch = 0;  ///< KV H under replicated key/value heads, else 0

  static block_bytes of(const llama_config& c, std::int64_t param, std::int64_t act_grad,
                        std::int64_t accum) {
    return {c.dim, c.kv_dim(), c.ffn_dim, c.n_heads, param, act_grad, accum, c.dim};
  }
  /// Token rows of the residual stream: N, or N/tp under sequence parallelism.
  std::int64_t rows(std::int64_t N) const { return N / rows_div; }
  /// x_in (rows, H).
  std::int64_t input(std::int64_t N) const { return rows(N) * H * param; }
  /// The attention part of the record: rstd1 (rows), xn1 (rows, H), q, att
  /// (N, Hq), k, v (N, KV), lse (B, nh, T).
  std::int64_t attention_part(std::int64_t N) const {
    return rows(N) * (param * H + accum) + N * (param * (2 * Hq + 2 * KV) + accum * nh);
  }
  /// The MLP part: x_mid, xn2 (rows, H), rstd2 (rows), gate, up, h (N, F);
  /// backward frees it before the attention backward.
  std::int64_t mlp_part(std::int64_t N) const {
    return rows(N) * (param * 2 * H + accum) + N * param * 3 * F;
  }
  /// What a split backward's B leaves for W: xn1, xn2 (rows, H), att
  /// (N, Hq), h (N, F) and the output gradients d_down, d_o (N, H), d_q
  /// (N, Hq), d_k, d_v (N, KV), d_gate, d_up (N, F).
  std::int64_t weight_pending(std::int64_t N) const {
    return rows(N) * 2 * H * param + N * (Hq + F) * param +
           N * act_grad * (2 * H + Hq + 2 * KV + 2 * F);
  }
  /// The whole record: input + attention part + MLP part.
  std::int64_t record(std::int64_t N) const {
    return input(N) + attention_part(N) + mlp_part(N);
  }
  /// The backward workspace: dxn (N, H), datt, dq (N, Hq), dk, dv (N, KV),
  /// dh, dgate, dup (N, F) of the activation-gradient type; under sequence
  /// parallelism dy (N, H) and dx_rows (rows, H) of it, xg (N, H) params and
  /// dgain (H) gradients; with replicated key/value heads dw (KV H) gradients.
  std::int64_t workspace(std::int64_t N) const {
    std::int64_t b = N * act_grad * (H + 2 * Hq + 2 * KV + 3 * F) + kv_scratch * grad;
    if (rows_div > 1) b += (N + rows(N)) * H * act_grad + N * H * param + H * grad;
    return b;
  }
};

/// A transformer block of a Llama: its layout in its segment, its layers,
/// and forward/backward over a context `Ctx` (kernels::host_context or
/// kernels::cuda_context). Under tensor parallelism (`Layers` =
/// tensor_parallel_layers, a layout of one tp rank) the block holds its
/// rank's heads and SwiGLU columns: q, k, v, gate and up are column-
/// parallel, the attention output and down projections row-parallel, and
/// the four partial sums of a block (the two row-parallel outputs forward,
/// the input gradients of q/k/v and of gate/up backward) are reduced over
/// the tp group (Megatron-LM, figure 3's f and g). On one rank
/// (`dense_layers`) the same code reduces nothing.
///
/// Sequence parallelism (block_shape::sequence_parallel; Korthikanti et
/// al. 2022, figure 5): the residual stream and the norms hold this rank's
/// token rows; each norm output is all-gathered before its column-parallel
/// layers and each row-parallel output reduce-scattered, and backward
/// gathers the residual gradient before the row-parallel layers, gathers
/// each norm output again for the weight gradients (the record keeps only
/// this rank's rows), reduce-scatters the norms' input gradients and sums
/// the gains' gradients over the group.
///
/// Key/value heads replicated over tp/nkv ranks (tp > nkv): each replica's
/// wk and wv gradient is its query heads' part, summed over exactly the
/// replicas (Layers::all_reduce_kv_replicas) before it is accumulated.
///
/// Under an FP8 policy (precision::fp8_linear<P>) the seven linear layers
/// run as FP8 GEMMs (nn/fp8_linear.hpp) with the scales of the block's
/// seven fp8_linear_state (block_linear_names order), which the model owns;
/// under every other policy no FP8 code is compiled in.
template <precision::policy P, class Ctx, class Layers = dense_layers>
class transformer_block {
 public:
  using Backend = typename Ctx::backend_type;
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  using ActGrad = typename P::act_grad_type;
  using Acc = typename P::accum_type;
  using Rope = typename P::rope_type;
  using record = block_record<P, Backend>;
  using workspace = block_workspace<P, Backend>;
  using scratch = block_scratch<P, Backend>;

  transformer_block() = default;
  /// Block `l` of `layout` (make_llama_layout(c), or its tp rank's), whose
  /// segment starts at flat offset `segment_begin`; `layers` reduces the
  /// partial sums (its group must outlive the block). `fp8`: under an FP8
  /// policy, the block's seven FP8 linear states (block_linear_names
  /// order; not owned, must outlive the block's calls), else unused.
  /// Throws tessera::error if a tensor of the block is missing,
  /// config_error if the layout is not a shard of `layers`' group.
  transformer_block(const llama_config& c, const param_layout& layout, int l,
                    std::int64_t segment_begin, Layers layers = {}, fp8_linear_state* fp8 = nullptr)
      : layers_(layers), fp8_(fp8), l_(l), H_(c.dim), hd_(c.head_dim()), eps_(c.norm_eps) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    auto entry = [&](const char* n) -> const param_entry& { return layout.at(b + n); };
    const param_entry& wq = entry("attn.wq");
    TESSERA_THROW_IF(wq.full[0] != wq.shp[0] * layers.size(), config_error, "block ", l,
                     ": the layout holds ", wq.shp[0], " of ", wq.full[0],
                     " query features, which is not a shard of a tp group of ", layers.size(),
                     " (build the layout with make_llama_layout(c, {tp, rank}))");
    auto at = [&](const char* n) { return entry(n).offset - segment_begin; };
    Hq_ = entry("attn.wq").shp[0];   // this rank's query features
    KV_ = entry("attn.wk").shp[0];   // this rank's key/value features
    F_ = entry("mlp.w_gate").shp[0];  // this rank's SwiGLU width
    kv_replicas_ = entry("attn.wk").replicas;
    if constexpr (Layers::tensor_parallel)
      TESSERA_THROW_IF(kv_replicas_ > 1 && layers.kv_group == nullptr, config_error, "block ", l,
                       ": its key/value heads are replicated on ", kv_replicas_,
                       " tp ranks but the layer family has no kv_group (nn::llama splits it "
                       "from the tp group)");
    nh_ = Hq_ / hd_;
    nkv_ = KV_ / hd_;
    attn_norm_ = at("attn_norm");
    mlp_norm_ = at("mlp_norm");
    wq_ = {Hq_, H_, at("attn.wq")};
    wk_ = {KV_, H_, at("attn.wk")};
    wv_ = {KV_, H_, at("attn.wv")};
    wo_ = {H_, Hq_, at("attn.wo")};
    w_gate_ = {F_, H_, at("mlp.w_gate")};
    w_up_ = {F_, H_, at("mlp.w_up")};
    w_down_ = {H_, F_, at("mlp.w_down")};
  }

  /// The block's index in the model.
  int index() const { return l_; }

  /// The attention over the cp group that calls with
  /// block_shape::context_parallel run (not owned: it must outlive them),
  /// or null for none.
  void set_context_parallel(const cp_attention_for<Ctx, Param, ActGrad>* a) { cp_ = a; }

  /// Forward: consumes `x` (rows, H), the block input, into r.x_in and
  /// leaves the block output (rows, H) in `x`; rows = N, or N/tp under
  /// sequence parallelism. `p`: the segment's first parameter; `sc` the
  /// forward's scratch (make_scratch); `cos`, `sin` the RoPE tables
  /// (max_seq, hd/2). With `recompute`, the record keeps x_in only
  /// (activation checkpointing).
  void forward(const Ctx& ctx, tensor<Param, Backend>& x, record& r, const Param* p,
               block_shape s, scratch& sc, const Rope* cos, const Rope* sin,
               bool recompute) const {
    if constexpr (Layers::tensor_parallel)
      if (s.sequence_parallel) return forward_as<true>(ctx, x, r, p, s, sc, cos, sin, recompute);
    forward_as<false>(ctx, x, r, p, s, sc, cos, sin, recompute);
  }

  /// Forward without a record (evaluation): `x` (rows, H) in, the output in `x`.
  void forward_no_record(const Ctx& ctx, tensor<Param, Backend>& x, const Param* p,
                         block_shape s, scratch& sc, const Rope* cos, const Rope* sin) const {
    record r;
    forward(ctx, x, r, p, s, sc, cos, sin, false);
  }

  /// Backward. dres: (rows, H) gradient of the block output on entry, of
  /// the block input on return (=). Parameter gradients accumulate (+=)
  /// into `g` (the segment's first gradient element, same offsets as `p`).
  /// A checkpointed record is recomputed first (`proj` (N, H) scratch); the
  /// record is empty on return.
  void backward(const Ctx& ctx, record& r, tensor<ActGrad, Backend>& dres, const Param* p, Grad* g,
                block_shape s, workspace& w, tensor<Param, Backend>& proj, const Rope* cos,
                const Rope* sin) const {
    if constexpr (Layers::tensor_parallel)
      if (s.sequence_parallel) return backward_as<true>(ctx, r, dres, p, g, s, w, proj, cos, sin);
    backward_as<false>(ctx, r, dres, p, g, s, w, proj, cos, sin);
  }

  /// B of a split backward (zero-bubble schedules; Qi et al. 2023,
  /// section 2): as backward() for `dres`, the norm gains' gradients
  /// included, but the seven weight GEMMs are left for backward_weight():
  /// the record keeps their inputs and output gradients (block_record).
  /// Collective over the tp group as backward() is.
  void backward_input(const Ctx& ctx, record& r, tensor<ActGrad, Backend>& dres, const Param* p,
                      Grad* g, block_shape s, workspace& w, tensor<Param, Backend>& proj,
                      const Rope* cos, const Rope* sin) const {
    if constexpr (Layers::tensor_parallel)
      if (s.sequence_parallel)
        return backward_as<true>(ctx, r, dres, p, g, s, w, proj, cos, sin, true);
    backward_as<false>(ctx, r, dres, p, g, s, w, proj, cos, sin, true);
  }
  /// W of a split backward: the weight gradients backward_input() left,
  /// accumulated (+=) into `g`, the same values backward() adds; the record
  /// is empty on return. Under sequence parallelism the norm outputs are
  /// gathered again (collective over the tp group, as are the replicated
  /// key/value heads' sums). Throws tessera::error if `r` has no B pending.
  void backward_weight(const Ctx& ctx, record& r, Grad* g, block_shape s, workspace& w) const {
    TESSERA_THROW_IF(!r.weights_pending(), error, "block ", l_,
                     ": backward_weight without its backward_input");
    if constexpr (Layers::tensor_parallel)
      if (s.sequence_parallel) return weight_grads_as<true>(ctx, r, g, s, w);
    weight_grads_as<false>(ctx, r, g, s, w);
  }

  /// The scratch of one backward pass over blocks of these sizes.
  workspace make_workspace(const Ctx& ctx, block_shape s) const {
    const std::int64_t N = s.N();
    workspace w;
    w.dxn = kernels::make_tensor<ActGrad>(ctx, N * H_);
    w.datt = kernels::make_tensor<ActGrad>(ctx, N * Hq_);
    w.dq = kernels::make_tensor<ActGrad>(ctx, N * Hq_);
    w.dk = kernels::make_tensor<ActGrad>(ctx, N * KV_);
    w.dv = kernels::make_tensor<ActGrad>(ctx, N * KV_);
    w.dh = kernels::make_tensor<ActGrad>(ctx, N * F_);
    w.dgate = kernels::make_tensor<ActGrad>(ctx, N * F_);
    w.dup = kernels::make_tensor<ActGrad>(ctx, N * F_);
    if (s.sequence_parallel) {
      w.dy = kernels::make_tensor<ActGrad>(ctx, N * H_);
      w.dx_rows = kernels::make_tensor<ActGrad>(ctx, rows(s) * H_);
      w.xg = kernels::make_tensor<Param>(ctx, N * H_);
      w.dgain = kernels::make_tensor<Grad>(ctx, H_);
    }
    if (kv_replicas_ > 1) w.dw = kernels::make_tensor<Grad>(ctx, KV_ * H_);
    return w;
  }
  /// The scratch of one backward_weight pass: under sequence parallelism
  /// xg (N, H), the norm outputs gathered again; with replicated key/value
  /// heads dw (KV, H); nothing else.
  workspace make_weight_workspace(const Ctx& ctx, block_shape s) const {
    workspace w;
    if (s.sequence_parallel) w.xg = kernels::make_tensor<Param>(ctx, s.N() * H_);
    if (kv_replicas_ > 1) w.dw = kernels::make_tensor<Grad>(ctx, KV_ * H_);
    return w;
  }
  /// The scratch of one forward pass over blocks of these sizes.
  scratch make_scratch(const Ctx& ctx, block_shape s) const {
    scratch sc;
    sc.proj = kernels::make_tensor<Param>(ctx, s.N() * H_);
    if (s.sequence_parallel) sc.gathered = kernels::make_tensor<Param>(ctx, s.N() * H_);
    return sc;
  }

  // ---- what the block allocates (the planner sums these) ----------------------------------

  /// The block's byte counts with its policy's element sizes (this rank's
  /// heads and SwiGLU width under tensor parallelism), for calls without
  /// sequence parallelism (set rows_div to tp for it).
  block_bytes bytes() const {
    block_bytes b{H_,
                  KV_,
                  F_,
                  nh_,
                  static_cast<std::int64_t>(sizeof(Param)),
                  static_cast<std::int64_t>(sizeof(ActGrad)),
                  static_cast<std::int64_t>(sizeof(Acc)),
                  Hq_};
    b.grad = static_cast<std::int64_t>(sizeof(Grad));
    b.kv_scratch = kv_replicas_ > 1 ? KV_ * H_ : 0;
    return b;
  }
  /// Bytes of a full record per token: (3H + 2Hq + 2KV + 3F) Param (x_in,
  /// xn1, x_mid, xn2; q, att; k, v; gate, up, h) and (2 + nh) Acc (rstd1,
  /// rstd2, lse); without sequence parallelism (with it: block_bytes with
  /// rows_div = tp, as nn::llama::record_bytes counts).
  std::int64_t record_bytes_per_token() const { return bytes().record(1); }
  /// Bytes per token a checkpointed block keeps: its input.
  std::int64_t checkpoint_bytes_per_token() const { return bytes().input(1); }
  /// How many tp ranks hold this rank's key/value heads (1: not replicated).
  int kv_replicas() const { return kv_replicas_; }

 private:
  // The residual stream's placement: whole on every rank, or this rank's
  // token rows under sequence parallelism.
  template <bool SP, class T>
  using rows_t = std::conditional_t<SP, token_sharded<T>, replicated<T>>;

  // Linear layer `i` as the policy runs it: the layer itself, or under an
  // FP8 policy the layer with FP8 GEMMs and its scales (nn/fp8_linear.hpp).
  template <class Layer>
  decltype(auto) lin(const Layer& layer, block_linear i) const {
    if constexpr (precision::fp8_linear<P>) {
      TESSERA_THROW_IF(fp8_ == nullptr, error, "block ", l_, ": the FP8 policy ", P::name,
                       " needs the block's FP8 linear states (nn::llama owns them)");
      return fp8_linear<Layer, Layers>(layer, layers_, fp8_[static_cast<int>(i)]);
    } else {
      return (layer);
    }
  }

  // Token rows of the residual stream.
  std::int64_t rows(block_shape s) const {
    return s.sequence_parallel ? s.N() / layers_.size() : s.N();
  }
  // Placed views of a record or workspace tensor.
  template <bool SP, class T>
  rows_t<SP, T> stream(tensor<T, Backend>& t, block_shape s) const {
    return {t.data(), rows(s), H_};
  }
  template <bool SP, class T>
  rows_t<SP, const T> cstream(const tensor<T, Backend>& t, block_shape s) const {
    return {t.data(), rows(s), H_};
  }
  template <class T>
  static feature_sharded<T> features(tensor<T, Backend>& t, std::int64_t N, std::int64_t cols) {
    return {t.data(), N, cols};
  }
  // The complete (N, H) input of a column-parallel layer: the norm output
  // itself, or under sequence parallelism every rank's rows gathered into
  // `buf`.
  template <bool SP, class T>
  replicated<const T> complete(rows_t<SP, const T> x, T* buf) const {
    if constexpr (SP)
      return layers_.all_gather(x, buf);
    else
      return x;
  }
  // A row-parallel output or a column-parallel input gradient reduced:
  // all_reduce in place, or under sequence parallelism reduce_scatter into
  // `rows_out` (this rank's rows).
  template <bool SP, class T>
  rows_t<SP, T> reduce(partial_sum<T> p, T* rows_out) const {
    if constexpr (SP)
      return layers_.reduce_scatter(partial_sum<const T>(p), rows_out);
    else
      return layers_.all_reduce(p);
  }
  // A norm's backward from the complete gradient of its output: the gains'
  // gradient accumulates into gw; under sequence parallelism it is this
  // rank's rows' part, summed over the group first.
  template <bool SP>
  void norm_backward(const Ctx& ctx, ActGrad* dinp, Grad* gw, rows_t<SP, const ActGrad> dout,
                     const Param* x, const Param* w, const Acc* rstd, workspace& ws) const {
    if constexpr (SP) {
      placed::rmsnorm_backward(ctx, layers_, dinp, gw, ws.dgain.data(), dout, x, w, rstd, true);
    } else {
      placed::rmsnorm_backward(ctx, dinp, gw, dout, x, w, rstd, true);
    }
  }
  // wk's or wv's gradient: accumulated directly, or with replicated
  // key/value heads computed apart, summed over the replicas, then added.
  template <class GA, class T>
  void kv_backward_weight(const Ctx& ctx, const typename Layers::column& layer, block_linear i,
                          Grad* g,
                          feature_sharded<GA> d, replicated<T> x, workspace& w) const {
    if constexpr (Layers::tensor_parallel) {
      if (kv_replicas_ > 1) {
        typename Layers::column apart = layer;
        apart.offset = 0;
        kernels::zero_elements(ctx, w.dw.data(), layer.numel());
        lin(apart, i).backward_weight(ctx, w.dw.data(), d, x);
        layers_.all_reduce_kv_replicas(
            partial_sum<Grad>{w.dw.data(), layer.out_features, layer.in_features});
        residual_add(ctx, g + layer.offset, g + layer.offset, w.dw.data(), layer.numel());
        return;
      }
    }
    lin(layer, i).backward_weight(ctx, g, d, x);
  }

  template <bool SP>
  void forward_as(const Ctx& ctx, tensor<Param, Backend>& x, record& r, const Param* p,
                  block_shape s, scratch& sc, const Rope* cos, const Rope* sin,
                  bool recompute) const {
    r.x_in = std::move(x);
    fill_record<SP>(ctx, r, p, s, sc.proj.data(), sc.gathered.data(), cos, sin);
    const std::int64_t N = s.N();
    const partial_sum<Param> down =
        lin(w_down_, block_linear::w_down).forward(ctx, sc.proj.data(), features(r.h, N, F_), p);
    x = kernels::make_tensor<Param>(ctx, rows(s) * H_);
    const rows_t<SP, Param> d = reduce<SP>(down, x.data());
    placed::residual_add(ctx, stream<SP>(x, s), cstream<SP>(r.x_mid, s), d);
    if (recompute) release_all_but_input(r);
  }

  // `defer`: B of a split backward (each weight GEMM's output gradient
  // kept in the record instead, its input not freed).
  template <bool SP>
  void backward_as(const Ctx& ctx, record& r, tensor<ActGrad, Backend>& dres, const Param* p,
                   Grad* g, block_shape s, workspace& w, tensor<Param, Backend>& proj,
                   const Rope* cos, const Rope* sin, bool defer = false) const {
    if (r.h.empty())  // recompute (checkpointed)
      fill_record<SP>(ctx, r, p, s, proj.data(), w.xg.data(), cos, sin);
    const std::int64_t N = s.N();
    // A weight GEMM now, or (defer) its output gradient kept for W.
    auto keep = [&](tensor<ActGrad, Backend>& dst, const ActGrad* src, std::int64_t n) {
      dst = kernels::make_tensor<ActGrad>(ctx, n);
      kernels::copy_elements(ctx, dst.data(), src, n);
    };
    // MLP: y = x_mid + h Wd^T. dy reads dres (gathered under sequence
    // parallelism), which the MLP norm's backward then adds to.
    const replicated<const ActGrad> dy = complete<SP>(cstream<SP>(dres, s), w.dy.data());
    const feature_sharded<ActGrad> dh = lin(w_down_, block_linear::w_down).backward_input(ctx, w.dh.data(), dy, p);
    if (defer)
      keep(r.d_down, dy.data, N * H_);
    else
      lin(w_down_, block_linear::w_down).backward_weight(ctx, g, dy, features(r.h, N, F_));
    swiglu_backward(ctx, w.dgate.data(), w.dup.data(), dh.data, r.gate.data(), r.up.data(),
                    N * F_);
    const feature_sharded<const ActGrad> dgate = features(w.dgate, N, F_),
                                         dup = features(w.dup, N, F_);
    lin(w_gate_, block_linear::w_gate).backward_input(ctx, w.dxn.data(), dgate, p);
    const rows_t<SP, ActGrad> dxn2 =
        reduce<SP>(lin(w_up_, block_linear::w_up).backward_input(ctx, w.dxn.data(), dup, p, true), w.dx_rows.data());
    if (defer) {
      keep(r.d_gate, dgate.data, N * F_);
      keep(r.d_up, dup.data, N * F_);
    } else {
      const replicated<const Param> xn2 = complete<SP>(cstream<SP>(r.xn2, s), w.xg.data());
      lin(w_gate_, block_linear::w_gate).backward_weight(ctx, g, dgate, xn2);
      lin(w_up_, block_linear::w_up).backward_weight(ctx, g, dup, xn2);
    }
    norm_backward<SP>(ctx, dres.data(), g + mlp_norm_, dxn2, r.x_mid.data(), p + mlp_norm_,
                      r.rstd2.data(), w);
    if (!defer) {
      r.h.release();
      r.xn2.release();
    }
    r.gate.release();
    r.up.release();
    r.x_mid.release();
    r.rstd2.release();
    // Attention: x_mid = x_in + att Wo^T
    const replicated<const ActGrad> dy2 = complete<SP>(cstream<SP>(dres, s), w.dy.data());
    const feature_sharded<ActGrad> datt = lin(wo_, block_linear::wo).backward_input(ctx, w.datt.data(), dy2, p);
    if (defer)
      keep(r.d_o, dy2.data, N * H_);
    else
      lin(wo_, block_linear::wo).backward_weight(ctx, g, dy2, features(r.att, N, Hq_));
    if (s.context_parallel)
      cp_checked().backward(ctx, w.dq.data(), w.dk.data(), w.dv.data(), datt.data, r.q.data(),
                            r.k.data(), r.v.data(), r.att.data(), r.lse.data(), s.B, whole(s), nh_,
                            nkv_, hd_, kernels::attention_mask{s.doc_start});
    else
      attention_backward(ctx, w.dq.data(), w.dk.data(), w.dv.data(), datt.data, r.q.data(),
                         r.k.data(), r.v.data(), r.att.data(), r.lse.data(), s.B, s.T, nh_, nkv_,
                         hd_, kernels::attention_mask{s.doc_start});
    rope_backward(ctx, w.dq.data(), cos, sin, s.B, s.T, nh_, hd_, positions(s));
    rope_backward(ctx, w.dk.data(), cos, sin, s.B, s.T, nkv_, hd_, positions(s));
    const feature_sharded<const ActGrad> dq = features(w.dq, N, Hq_), dk = features(w.dk, N, KV_),
                                         dv = features(w.dv, N, KV_);
    lin(wq_, block_linear::wq).backward_input(ctx, w.dxn.data(), dq, p);
    lin(wk_, block_linear::wk).backward_input(ctx, w.dxn.data(), dk, p, true);
    const rows_t<SP, ActGrad> dxn1 =
        reduce<SP>(lin(wv_, block_linear::wv).backward_input(ctx, w.dxn.data(), dv, p, true), w.dx_rows.data());
    if (defer) {
      keep(r.d_q, dq.data, N * Hq_);
      keep(r.d_k, dk.data, N * KV_);
      keep(r.d_v, dv.data, N * KV_);
    } else {
      const replicated<const Param> xn1 = complete<SP>(cstream<SP>(r.xn1, s), w.xg.data());
      lin(wq_, block_linear::wq).backward_weight(ctx, g, dq, xn1);
      kv_backward_weight(ctx, wk_, block_linear::wk, g, dk, xn1, w);
      kv_backward_weight(ctx, wv_, block_linear::wv, g, dv, xn1, w);
    }
    norm_backward<SP>(ctx, dres.data(), g + attn_norm_, dxn1, r.x_in.data(), p + attn_norm_,
                      r.rstd1.data(), w);
    if (!defer) {
      r = record{};
      return;
    }
    r.x_in.release();
    r.rstd1.release();
    r.q.release();
    r.k.release();
    r.v.release();
    r.lse.release();
  }

  // W: the weight GEMMs of a deferred backward, from what B kept, in the
  // order backward() runs them (each weight's sum is the same either way).
  template <bool SP>
  void weight_grads_as(const Ctx& ctx, record& r, Grad* g, block_shape s, workspace& w) const {
    const std::int64_t N = s.N();
    lin(w_down_, block_linear::w_down)
        .backward_weight(ctx, g, replicated<const ActGrad>{r.d_down.data(), N, H_},
                         features(r.h, N, F_));
    const replicated<const Param> xn2 = complete<SP>(cstream<SP>(r.xn2, s), w.xg.data());
    lin(w_gate_, block_linear::w_gate)
        .backward_weight(ctx, g, feature_sharded<const ActGrad>{r.d_gate.data(), N, F_}, xn2);
    lin(w_up_, block_linear::w_up).backward_weight(ctx, g, feature_sharded<const ActGrad>{r.d_up.data(), N, F_},
                                  xn2);
    lin(wo_, block_linear::wo).backward_weight(ctx, g, replicated<const ActGrad>{r.d_o.data(), N, H_},
                                features(r.att, N, Hq_));
    const replicated<const Param> xn1 = complete<SP>(cstream<SP>(r.xn1, s), w.xg.data());
    lin(wq_, block_linear::wq).backward_weight(ctx, g, feature_sharded<const ActGrad>{r.d_q.data(), N, Hq_}, xn1);
    kv_backward_weight(ctx, wk_, block_linear::wk, g, feature_sharded<const ActGrad>{r.d_k.data(), N, KV_}, xn1,
                       w);
    kv_backward_weight(ctx, wv_, block_linear::wv, g, feature_sharded<const ActGrad>{r.d_v.data(), N, KV_}, xn1,
                       w);
    r = record{};
  }

  // Every record tensor but x_in, from r.x_in: the forward up to (not
  // including) the down projection. `proj` (N, H) scratch; `gathered`
  // (N, H) under sequence parallelism.
  template <bool SP>
  void fill_record(const Ctx& ctx, record& r, const Param* p, block_shape s, Param* proj,
                   Param* gathered, const Rope* cos, const Rope* sin) const {
    const std::int64_t N = s.N(), R = rows(s), H = H_, F = F_, KV = KV_, Hq = Hq_;
    r.rstd1 = kernels::make_tensor<Acc>(ctx, R);
    r.xn1 = kernels::make_tensor<Param>(ctx, R * H);
    const rows_t<SP, const Param> xn1_rows = placed::rmsnorm_forward(
        ctx, stream<SP>(r.xn1, s), r.rstd1.data(), cstream<SP>(r.x_in, s), p + attn_norm_, eps_);
    const replicated<const Param> xn1 = complete<SP>(xn1_rows, gathered);
    r.q = kernels::make_tensor<Param>(ctx, N * Hq);
    r.k = kernels::make_tensor<Param>(ctx, N * KV);
    r.v = kernels::make_tensor<Param>(ctx, N * KV);
    const feature_sharded<const Param> q = lin(wq_, block_linear::wq).forward(ctx, r.q.data(), xn1, p),
                                       k = lin(wk_, block_linear::wk).forward(ctx, r.k.data(), xn1, p),
                                       v = lin(wv_, block_linear::wv).forward(ctx, r.v.data(), xn1, p);
    rope_forward(ctx, r.q.data(), cos, sin, s.B, s.T, nh_, hd_, positions(s));
    rope_forward(ctx, r.k.data(), cos, sin, s.B, s.T, nkv_, hd_, positions(s));
    r.att = kernels::make_tensor<Param>(ctx, N * Hq);
    r.lse = kernels::make_tensor<Acc>(ctx, s.B * nh_ * s.T);
    if (s.context_parallel)
      cp_checked().forward(ctx, r.att.data(), r.lse.data(), q.data, k.data, v.data, s.B, whole(s),
                           nh_, nkv_, hd_, kernels::attention_mask{s.doc_start});
    else
      attention_forward(ctx, r.att.data(), r.lse.data(), q.data, k.data, v.data, s.B, s.T, nh_,
                        nkv_, hd_, kernels::attention_mask{s.doc_start});
    const partial_sum<Param> o_part = lin(wo_, block_linear::wo).forward(ctx, proj, features(r.att, N, Hq), p);
    r.x_mid = kernels::make_tensor<Param>(ctx, R * H);
    const rows_t<SP, Param> o = reduce<SP>(o_part, r.x_mid.data());
    placed::residual_add(ctx, stream<SP>(r.x_mid, s), cstream<SP>(r.x_in, s), o);
    r.rstd2 = kernels::make_tensor<Acc>(ctx, R);
    r.xn2 = kernels::make_tensor<Param>(ctx, R * H);
    const rows_t<SP, const Param> xn2_rows = placed::rmsnorm_forward(
        ctx, stream<SP>(r.xn2, s), r.rstd2.data(), cstream<SP>(r.x_mid, s), p + mlp_norm_, eps_);
    const replicated<const Param> xn2 = complete<SP>(xn2_rows, gathered);
    r.gate = kernels::make_tensor<Param>(ctx, N * F);
    r.up = kernels::make_tensor<Param>(ctx, N * F);
    r.h = kernels::make_tensor<Param>(ctx, N * F);
    lin(w_gate_, block_linear::w_gate).forward(ctx, r.gate.data(), xn2, p);
    lin(w_up_, block_linear::w_up).forward(ctx, r.up.data(), xn2, p);
    swiglu_forward(ctx, r.h.data(), r.gate.data(), r.up.data(), N * F);
  }
  // Under context parallelism: the attention over the cp group, the
  // whole sequence's length, and the positions RoPE rotates by (global).
  const cp_attention_for<Ctx, Param, ActGrad>& cp_checked() const {
    TESSERA_THROW_IF(cp_ == nullptr, error, "block ", l_,
                     ": a context-parallel shape but no cp attention (set_context_parallel)");
    return *cp_;
  }
  std::int64_t whole(block_shape s) const { return s.T * cp_checked().size(); }
  kernels::rope_positions positions(block_shape s) const {
    if (!s.context_parallel) return s.doc_start;
    return kernels::rope_positions::of(cp_checked().shard(whole(s)), s.doc_start);
  }
  static void release_all_but_input(record& r) {
    tensor<Param, Backend> x = std::move(r.x_in);
    r = record{};
    r.x_in = std::move(x);
  }

  Layers layers_{};
  fp8_linear_state* fp8_ = nullptr;  // FP8 policies: the seven linears' states (the model's)
  const cp_attention_for<Ctx, Param, ActGrad>* cp_ = nullptr;  // context parallelism
  int l_ = 0;
  std::int64_t H_ = 0, Hq_ = 0, F_ = 0, KV_ = 0, nh_ = 0, nkv_ = 0, hd_ = 0;
  int kv_replicas_ = 1;  // tp ranks holding this rank's key/value heads
  double eps_ = 1e-5;
  std::int64_t attn_norm_ = 0, mlp_norm_ = 0;  // norm gains, offsets in the segment
  typename Layers::column wq_, wk_, wv_, w_gate_, w_up_;
  typename Layers::row wo_, w_down_;
};

}  // namespace tessera::nn
