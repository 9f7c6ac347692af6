#pragma once
/// \file nn/fp8_linear.hpp
/// FP8 GEMMs for the `linear` seam (nn/linear.hpp) under an FP8 precision
/// policy (precision::fp8_linear<P>, precision::fp8_mixed), as Transformer
/// Engine, Megatron-Core and torchao run a transformer block's linear
/// layers. Each GEMM's operands are cast to FP8 with a per-tensor float32
/// scale s (q = fp8(a s), saturating), multiplied exactly and accumulated
/// in float32, and the result multiplied by the inverse scales. The host
/// reference computes exactly that as the float GEMM of the dequantised
/// operands (kernels::fp8_round_trip: â = float(fp8(a s)) / s):
///
///   forward          y  = x̂ Ŵ^T            x̂ = rt<E_fwd>(x, s_x), Ŵ = rt<E_fwd>(W, s_w)
///   backward_input   dx = d̂y Ŵ             d̂y = rt<E_bwd>(dy, s_dy)
///   backward_weight  dW += d̂y^T x̂          x re-cast from the saved input with s_x,
///                                          dy with s_dy of backward_input
///
/// E_fwd is E4M3; E_bwd is E5M2 under the `hybrid` format, E4M3 under
/// `e4m3` (precision::fp8_format). y is rounded once to the output type;
/// dx (activation-gradient type) and dW (float32) are float GEMM results.
///
/// Scales (precision::fp8_recipe):
///   delayed  every use casts with the operand's scale as it stood at the
///            start of the optimizer step, computes the operand's local
///            amax and max-accumulates it into the linear's step amax
///            (fp8_slot::step_amax); after the step the trainer
///            reduces the step amaxes of every linear with max over the
///            dp and tp groups and records them (fp8_linear_state::
///            record_step), so every replica keeps the same scales
///            (Transformer Engine's DelayedScaling).
///   current  every use sets the operand's scale from its own amax
///            (kernels::fp8_update_scale; torchao's tensorwise scaling); the
///            amax of an operand sharded over tp (a row-parallel layer's
///            x, a column-parallel layer's dy, every weight shard) is
///            reduced with max over the tp group first, so tp ranks cast
///            with the scale one rank would. backward_weight recomputes
///            the amaxes of the same tensors, so its scales are those of
///            the forward and backward_input (deterministic).
///
/// One code path for both backends: each operand's scale, inverse scale and
/// amaxes live in the context's memory (fp8_linear_state::scalars: host
/// memory on the host, device memory on the GPU), where the kernels read
/// and write them (kernels::fp8_amax_accumulate, fp8_update_scale,
/// fp8_gemm), so a GPU step never waits for the host to read a scale. The
/// host keeps what only changes between steps: the recipe and, under
/// delayed scaling, the amax histories (precision::fp8_scale); the model
/// moves the step amaxes to the host and the new scales back once a step
/// (nn::llama::fp8_scalars_to_host, fp8_scalars_from_host).
///
/// On the host the float copies x̂, Ŵ, d̂y live in grow-only per-thread
/// buffers (fp8_workspace_bytes, fp8_release_workspace); on the GPU the FP8
/// copies (transposed where cuBLASLt's FP8 layout needs it) are scratch of
/// the context's caching allocator for the GEMM's duration, and the
/// product is cuBLASLt's FP8 matmul (kernels/cuda/ops.hpp), held to the
/// host reference by the GPU tests.
/// Sources: Micikevicius et al. 2022, "FP8 Formats for Deep Learning",
/// section 4; Transformer Engine's pytorch/fp8.py and module/linear.py;
/// torchao's float8 training (Float8Linear, tensorwise scaling).

#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/fp8.hpp"
#include "tessera/kernels/fp8_gemm.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/precision/fp8_scaling.hpp"

namespace tessera::nn {

/// The seven linear layers of a transformer block, in this order; their
/// names in the block's segment (nn/llama_layout.hpp: "blocks.<l>." + name).
enum class block_linear : int { wq, wk, wv, wo, w_gate, w_up, w_down };
inline constexpr int block_linears = 7;
inline constexpr std::array<const char*, block_linears> block_linear_names = {
    "attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w_gate", "mlp.w_up", "mlp.w_down"};

/// The floats an FP8 linear keeps per operand (x, W, dy: kernels::fp8_role
/// order) in the context's memory, at fp8_linear_state::slot(role, which).
enum class fp8_slot : int {
  scale = 0,      ///< what the cast multiplies by (delayed: set by the host once a step)
  inverse = 1,    ///< 1 / the scale of the last cast (what the GEMM multiplies by)
  step_amax = 2,  ///< delayed: max |.| over this step's uses
  amax = 3,       ///< current: this use's amax (reduced over tp when sharded)
  eval_scale = 4  ///< current, not observing: the scale of this use, not kept
};
inline constexpr int fp8_slots = 5;
/// Floats per FP8 linear in the context's memory (three operands).
inline constexpr int fp8_linear_scalars = 3 * fp8_slots;

/// Bytes of FP8 operand workspace the calling thread holds on the host
/// (kernels::fp8_workspace_bytes): float copies of the largest x, W and dy.
inline std::size_t fp8_workspace_bytes() {
  return kernels::fp8_workspace_bytes();
}
/// Frees the calling thread's host FP8 operand workspace.
inline void fp8_release_workspace() {
  kernels::fp8_release_workspace();
}

/// The FP8 state of one linear layer: on the host, the recipe and the three
/// operands' precision::fp8_scale (scale and, under delayed scaling, amax
/// history); in the context's memory, fp8_linear_scalars floats the kernels
/// read and write (fp8_slot). Owned by the model (nn::llama), one per
/// linear of each block it runs, which attaches them to one buffer of its
/// context; a state not attached uses floats of its own (host memory: the
/// host backend and tests). Not thread-safe.
struct fp8_linear_state {
  precision::fp8_scale x, w, dy;  ///< the operands' scales (x, W: E4M3; dy: the recipe's)
  /// false during a forward that must not move the scales (evaluation): a
  /// delayed amax is not accumulated, a current scale not stored.
  bool observe = true;

  /// Scales 1 and empty histories under recipe `r`; its own scalars hold
  /// them. Throws config_error as r.validate().
  explicit fp8_linear_state(const precision::fp8_recipe& r)
      : x(r, precision::fp8_forward_max(r)),
        w(r, precision::fp8_forward_max(r)),
        dy(r, precision::fp8_backward_max(r)) {
    write_scalars(own_.data());
  }

  /// The recipe the three scales follow.
  const precision::fp8_recipe& recipe() const { return x.recipe(); }
  /// The operand's host scale object.
  const precision::fp8_scale& scale_of(kernels::fp8_role r) const {
    return r == kernels::fp8_role::x ? x : r == kernels::fp8_role::w ? w : dy;
  }
  /// Index of (role, which) among the fp8_linear_scalars floats.
  static constexpr int slot(kernels::fp8_role r, fp8_slot which) {
    return static_cast<int>(r) * fp8_slots + static_cast<int>(which);
  }

  /// The fp8_linear_scalars floats in the context's memory the kernels use.
  float* scalars() { return attached_ ? attached_ : own_.data(); }
  const float* scalars() const { return attached_ ? attached_ : own_.data(); }
  /// Uses `p` (fp8_linear_scalars floats of the context's memory, holding
  /// what write_scalars wrote) from now on.
  void attach(float* p) { attached_ = p; }
  /// Whether attach gave it scalars (a GPU's kernels need them: its own
  /// are host memory).
  bool attached() const { return attached_ != nullptr; }

  /// The scalars as the host scales give them (fp8_linear_scalars floats of
  /// host memory): each operand's scale, its inverse, zero amaxes. The
  /// model copies them to its context after each change of the host scales.
  void write_scalars(float* h) const {
    for (kernels::fp8_role r :
         {kernels::fp8_role::x, kernels::fp8_role::w, kernels::fp8_role::dy}) {
      const precision::fp8_scale& s = scale_of(r);
      h[slot(r, fp8_slot::scale)] = s.scale();
      h[slot(r, fp8_slot::inverse)] = s.inverse();
      h[slot(r, fp8_slot::step_amax)] = 0.0f;
      h[slot(r, fp8_slot::amax)] = 0.0f;
      h[slot(r, fp8_slot::eval_scale)] = s.scale();
    }
  }
  /// The three step amaxes (x, W, dy) of `h` (a host copy of the scalars) into out[0..3).
  static void step_amaxes(const float* h, float* out) {
    out[0] = h[slot(kernels::fp8_role::x, fp8_slot::step_amax)];
    out[1] = h[slot(kernels::fp8_role::w, fp8_slot::step_amax)];
    out[2] = h[slot(kernels::fp8_role::dy, fp8_slot::step_amax)];
  }
  /// Under current scaling, takes the scales the kernels computed from `h`
  /// (a host copy of the scalars) into the host objects, for a checkpoint.
  /// No-op under delayed scaling (the host scales are the ones cast with).
  void read_current_scales(const float* h) {
    if (recipe().scaling != precision::fp8_scaling::current) return;
    x.assign(h[slot(kernels::fp8_role::x, fp8_slot::scale)]);
    w.assign(h[slot(kernels::fp8_role::w, fp8_slot::scale)]);
    dy.assign(h[slot(kernels::fp8_role::dy, fp8_slot::scale)]);
  }
  /// Ends a step under delayed scaling: records amax[0..3) (x, W, dy: the
  /// step amaxes reduced over every replica) into the scales' histories
  /// (fp8_scale::record). The scalars then need write_scalars. No-op under
  /// current scaling.
  void record_step(const float* amax) {
    if (recipe().scaling != precision::fp8_scaling::delayed) return;
    x.record(amax[0]);
    w.record(amax[1]);
    dy.record(amax[2]);
  }
  /// What a checkpoint keeps: {"x", "w", "dy"} each fp8_scale::state()
  /// (under current scaling after read_current_scales).
  nlohmann::json state() const { return {{"x", x.state()}, {"w", w.state()}, {"dy", dy.state()}}; }
  /// Restores what state() wrote into the host objects (the scalars then
  /// need write_scalars). Throws io_error for a malformed state
  /// (fp8_scale::restore).
  void restore(const nlohmann::json& s) {
    TESSERA_THROW_IF(!s.is_object() || !s.contains("x") || !s.contains("w") || !s.contains("dy"),
                     io_error, "FP8 linear state ", s.dump().substr(0, 80),
                     " is malformed: it needs x, w and dy");
    x.restore(s["x"]);
    w.restore(s["w"]);
    dy.restore(s["dy"]);
  }

 private:
  std::array<float, fp8_linear_scalars> own_{};
  float* attached_ = nullptr;
};

/// A linear layer of family `Layers` (column_parallel_linear or
/// row_parallel_linear) run with FP8 GEMMs (file comment): the same
/// forward, backward_input and backward_weight as `Layer`, with the same
/// placed views and gradient contract (forward writes y; backward_input
/// writes dx, or adds with `accumulate`; backward_weight adds to dW), the
/// operands cast with the scales of `state`. Holds references: build it
/// for a call (transformer_block does). Under current scaling and tensor
/// parallelism each call is collective over `layers`' tp group (one
/// all-reduce of one float per sharded operand, in the context's memory).
/// Throws config_error as the FP8 kernels do (on the GPU: the token count
/// and features must be multiples of 16, as cuBLASLt's FP8 matmul needs).
///
/// The kernels are called unqualified, found through the context's
/// namespace (argument-dependent lookup) where the call is instantiated, so
/// the cuda_context overloads (kernels/cuda/ops.hpp) need not be declared
/// before this header.
template <class Layer, class Layers>
class fp8_linear {
 public:
  fp8_linear(const Layer& layer, const Layers& layers, fp8_linear_state& state)
      : layer_(layer), layers_(layers), st_(state) {}

  /// y = x̂ Ŵ^T, (M, out_features) of the output type, written.
  template <class Ctx, class T, class X>
  auto forward(const Ctx& ctx, T* y, X x, const T* seg) const
      -> decltype(std::declval<const Layer&>().forward(ctx, y, x, seg)) {
    const std::int64_t M = x.rows, N = layer_.out_features, K = layer_.in_features;
    const kernels::fp8_operand ox = prepare(ctx, x.data, M * K, kernels::fp8_role::x);
    const kernels::fp8_operand ow = prepare(ctx, seg + layer_.offset, N * K, kernels::fp8_role::w);
    const kernels::linear_gemm g = kernels::linear_forward_gemm(M, N, K);
    fp8_gemm(ctx, g.ta, g.tb, g.M, g.N, g.K, x.data, g.lda, ox, seg + layer_.offset, g.ldb, ow,
             g.beta, y, g.ldc);
    return {y, M, N};
  }
  /// dx = d̂y Ŵ, (M, in_features) of the activation-gradient type, written
  /// (or added with `accumulate`).
  template <class Ctx, class GA, class DY, class T>
  auto backward_input(const Ctx& ctx, GA* dx, DY dy, const T* seg, bool accumulate = false) const
      -> decltype(std::declval<const Layer&>().backward_input(ctx, dx, dy, seg, accumulate)) {
    const std::int64_t M = dy.rows, N = layer_.out_features, K = layer_.in_features;
    const kernels::fp8_operand ody = prepare(ctx, dy.data, M * N, kernels::fp8_role::dy);
    const kernels::fp8_operand ow = prepare(ctx, seg + layer_.offset, N * K, kernels::fp8_role::w);
    const kernels::linear_gemm g = kernels::linear_backward_input_gemm(M, N, K, accumulate);
    fp8_gemm(ctx, g.ta, g.tb, g.M, g.N, g.K, dy.data, g.lda, ody, seg + layer_.offset, g.ldb, ow,
             g.beta, dx, g.ldc);
    return {dx, M, K};
  }
  /// dW (out_features, in_features) += d̂y^T x̂ at `seg_grads` + offset (float32).
  template <class Ctx, class G, class DY, class X>
  auto backward_weight(const Ctx& ctx, G* seg_grads, DY dy, X x) const
      -> decltype(std::declval<const Layer&>().backward_weight(ctx, seg_grads, dy, x)) {
    const std::int64_t M = x.rows, N = layer_.out_features, K = layer_.in_features;
    const kernels::fp8_operand ody = prepare(ctx, dy.data, M * N, kernels::fp8_role::dy);
    const kernels::fp8_operand ox = prepare(ctx, x.data, M * K, kernels::fp8_role::x);
    const kernels::linear_gemm g = kernels::linear_backward_weight_gemm(M, N, K);
    fp8_gemm(ctx, g.ta, g.tb, g.M, g.N, g.K, dy.data, g.lda, ody, x.data, g.ldb, ox, g.beta,
             seg_grads + layer_.offset, g.ldc);
  }

 private:
  // Which operands a layer holds a shard of (feature-split over tp): a
  // row-parallel layer's input, a column-parallel layer's output gradient,
  // and every weight.
  static constexpr bool sharded(kernels::fp8_role r) {
    constexpr bool row = std::is_same_v<Layer, row_parallel_linear>;
    return r == kernels::fp8_role::w || (r == kernels::fp8_role::x ? row : !row);
  }

  // The scale operand `a` (n elements) is cast with, by the recipe (file
  // comment), all in the context's memory: under current scaling its amax
  // (tp-reduced when sharded) sets the stored scale, or when not observing
  // a scale of this use only; under delayed scaling the stored scale, the
  // amax max-accumulated into the step amax when observing.
  template <class Ctx, class T>
  kernels::fp8_operand prepare(const Ctx& ctx, const T* a, std::int64_t n,
                               kernels::fp8_role role) const {
    const precision::fp8_recipe& r = st_.recipe();
    if constexpr (!Ctx::host_accessible)
      TESSERA_THROW_IF(!st_.attached(), config_error,
                       "fp8_linear: an FP8 state not attached to scalars in the context's memory "
                       "(nn::llama attaches its states; a state's own scalars are host memory)");
    float* sc = st_.scalars();
    auto at = [&](fp8_slot w) { return sc + fp8_linear_state::slot(role, w); };
    kernels::fp8_operand o;
    o.e5m2 = role == kernels::fp8_role::dy && r.format == precision::fp8_format::hybrid;
    o.inverse = at(fp8_slot::inverse);
    o.role = role;
    o.scale = at(fp8_slot::scale);
    if (r.scaling == precision::fp8_scaling::current) {
      kernels::zero_elements(ctx, at(fp8_slot::amax), 1);
      fp8_amax_accumulate(ctx, at(fp8_slot::amax), a, n);
      if (sharded(role)) layers_.all_reduce_values(at(fp8_slot::amax), 1, true);
      float* s = at(fp8_slot::scale);
      if (!st_.observe) {  // this use's scale, the stored one kept
        kernels::copy_elements(ctx, at(fp8_slot::eval_scale), s, 1);
        s = at(fp8_slot::eval_scale);
      }
      fp8_update_scale(ctx, s, at(fp8_slot::amax), st_.scale_of(role).fp8_max(), r.margin);
      o.scale = s;
    } else if (st_.observe) {
      fp8_amax_accumulate(ctx, at(fp8_slot::step_amax), a, n);
    }
    return o;
  }

  const Layer& layer_;
  const Layers& layers_;
  fp8_linear_state& st_;
};

}  // namespace tessera::nn
