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
///            (`fp8_linear_state::amax_*`); after the step the trainer
///            reduces the step amaxes of every linear with max over the
///            dp and tp groups and records them (fp8_linear_state::
///            record_step), so every replica keeps the same scales
///            (Transformer Engine's DelayedScaling).
///   current  every use sets the operand's scale from its own amax
///            (fp8_scale::set_current; torchao's tensorwise scaling); the
///            amax of an operand sharded over tp (a row-parallel layer's
///            x, a column-parallel layer's dy, every weight shard) is
///            reduced with max over the tp group first, so tp ranks cast
///            with the scale one rank would. backward_weight recomputes
///            the amaxes of the same tensors, so its scales are those of
///            the forward and backward_input (deterministic).
///
/// The float copies x̂, Ŵ, d̂y live in grow-only per-thread buffers
/// (fp8_workspace_bytes, fp8_release_workspace). Host backend only; a
/// GPU's FP8 GEMM is held to this reference.
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
#include "tessera/kernels/gemm.hpp"
#include "tessera/nn/linear.hpp"
#include "tessera/precision/fp8_scaling.hpp"

namespace tessera::nn {

/// The grow-only per-thread float buffers of the FP8 layers' operands, x̂
/// (slot 0), Ŵ (1) and d̂y (2): slots of the GEMM's workspace family past
/// the GEMM's own (0, 1, 2). Internal to fp8_linear.
inline constexpr int fp8_first_workspace_slot = 16;
template <int Slot>
using fp8_operand_buffer =
    kernels::detail::gemm_workspace<float, fp8_first_workspace_slot + Slot>;

/// The seven linear layers of a transformer block, in this order; their
/// names in the block's segment (nn/llama_layout.hpp: "blocks.<l>." + name).
enum class block_linear : int { wq, wk, wv, wo, w_gate, w_up, w_down };
inline constexpr int block_linears = 7;
inline constexpr std::array<const char*, block_linears> block_linear_names = {
    "attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w_gate", "mlp.w_up", "mlp.w_down"};

/// The FP8 state of one linear layer: the scales of its three operands
/// (x, W, dy) and, under delayed scaling, their amaxes over the uses of
/// the current optimizer step. Owned by the model (nn::llama), one per
/// linear of each block it runs; the layers reach it through a pointer.
/// Not thread-safe.
struct fp8_linear_state {
  precision::fp8_scale x, w, dy;  ///< the operands' scales (x, W: E4M3; dy: the recipe's)
  float amax_x = 0, amax_w = 0, amax_dy = 0;  ///< delayed: max |.| over this step's uses
  /// false during a forward that must not move the scales (evaluation): a
  /// delayed amax is not accumulated, a current scale not stored.
  bool observe = true;

  /// Scales 1 and empty histories under recipe `r`. Throws config_error as r.validate().
  explicit fp8_linear_state(const precision::fp8_recipe& r)
      : x(r, precision::fp8_forward_max(r)),
        w(r, precision::fp8_forward_max(r)),
        dy(r, precision::fp8_backward_max(r)) {}

  /// The recipe the three scales follow.
  const precision::fp8_recipe& recipe() const { return x.recipe(); }
  /// The three step amaxes (x, W, dy) into out[0..3).
  void step_amaxes(float* out) const {
    out[0] = amax_x;
    out[1] = amax_w;
    out[2] = amax_dy;
  }
  /// Ends a step under delayed scaling: records amax[0..3) (x, W, dy: the
  /// step amaxes reduced over every replica) into the scales' histories
  /// (fp8_scale::record) and clears the step amaxes. No-op under current scaling.
  void record_step(const float* amax) {
    if (recipe().scaling != precision::fp8_scaling::delayed) return;
    x.record(amax[0]);
    w.record(amax[1]);
    dy.record(amax[2]);
    discard_step();
  }
  /// Ends a skipped step: its step amaxes are cleared, not recorded.
  void discard_step() { amax_x = amax_w = amax_dy = 0; }
  /// What a checkpoint keeps: {"x", "w", "dy"} each fp8_scale::state().
  nlohmann::json state() const { return {{"x", x.state()}, {"w", w.state()}, {"dy", dy.state()}}; }
  /// Restores what state() wrote (the step amaxes cleared). Throws io_error
  /// for a malformed state (fp8_scale::restore).
  void restore(const nlohmann::json& s) {
    TESSERA_THROW_IF(!s.is_object() || !s.contains("x") || !s.contains("w") || !s.contains("dy"),
                     io_error, "FP8 linear state ", s.dump().substr(0, 80),
                     " is malformed: it needs x, w and dy");
    x.restore(s["x"]);
    w.restore(s["w"]);
    dy.restore(s["dy"]);
    amax_x = amax_w = amax_dy = 0;
  }
};

/// Bytes of FP8 operand workspace the calling thread holds (grow-only
/// until fp8_release_workspace): float copies of the largest x, W and dy.
inline std::size_t fp8_workspace_bytes() {
  return fp8_operand_buffer<0>::bytes() + fp8_operand_buffer<1>::bytes() +
         fp8_operand_buffer<2>::bytes();
}
/// Frees the calling thread's FP8 operand workspace.
inline void fp8_release_workspace() {
  fp8_operand_buffer<0>::release();
  fp8_operand_buffer<1>::release();
  fp8_operand_buffer<2>::release();
}

/// A linear layer of family `Layers` (column_parallel_linear or
/// row_parallel_linear) run with FP8 GEMMs (file comment): the same
/// forward, backward_input and backward_weight as `Layer`, with the same
/// placed views and gradient contract (forward writes y; backward_input
/// writes dx, or adds with `accumulate`; backward_weight adds to dW), the
/// operands cast with the scales of `state`. Holds references: build it
/// for a call (transformer_block does). Under current scaling and tensor
/// parallelism each call is collective over `layers`' tp group (one
/// all-reduce of one float per sharded operand). Throws config_error as
/// the FP8 kernels do.
template <class Layer, class Layers>
class fp8_linear {
 public:
  fp8_linear(const Layer& layer, const Layers& layers, fp8_linear_state& state)
      : layer_(layer), layers_(layers), st_(state) {}

  /// y = x̂ Ŵ^T, (M, out_features) of the output type, written.
  template <class Ctx, class T, class X>
  auto forward(const Ctx& ctx, T* y, X x, const T* seg) const
      -> decltype(std::declval<const Layer&>().forward(ctx, y, x, seg)) {
    check_context<Ctx>();
    const std::int64_t M = x.rows, N = layer_.out_features, K = layer_.in_features;
    float* xh = fp8_operand_buffer<0>::get(static_cast<std::size_t>(M * K));
    float* wh = fp8_operand_buffer<1>::get(static_cast<std::size_t>(N * K));
    cast(ctx, xh, x.data, M * K, st_.x, st_.amax_x, x_sharded, false);
    cast(ctx, wh, seg + layer_.offset, N * K, st_.w, st_.amax_w, true, false);
    const kernels::linear_gemm g = kernels::linear_forward_gemm(M, N, K);
    kernels::gemm_mixed<float, float, T>(g.ta, g.tb, g.M, g.N, g.K, g.alpha, xh, g.lda, wh, g.ldb,
                                         g.beta, y, g.ldc);
    return {y, M, N};
  }
  /// dx = d̂y Ŵ, (M, in_features) of the activation-gradient type, written
  /// (or added with `accumulate`).
  template <class Ctx, class GA, class DY, class T>
  auto backward_input(const Ctx& ctx, GA* dx, DY dy, const T* seg, bool accumulate = false) const
      -> decltype(std::declval<const Layer&>().backward_input(ctx, dx, dy, seg, accumulate)) {
    check_context<Ctx>();
    const std::int64_t M = dy.rows, N = layer_.out_features, K = layer_.in_features;
    float* dyh = fp8_operand_buffer<2>::get(static_cast<std::size_t>(M * N));
    float* wh = fp8_operand_buffer<1>::get(static_cast<std::size_t>(N * K));
    cast(ctx, dyh, dy.data, M * N, st_.dy, st_.amax_dy, dy_sharded, true);
    cast(ctx, wh, seg + layer_.offset, N * K, st_.w, st_.amax_w, true, false);
    const kernels::linear_gemm g = kernels::linear_backward_input_gemm(M, N, K, accumulate);
    kernels::gemm_mixed<float, float, GA>(g.ta, g.tb, g.M, g.N, g.K, g.alpha, dyh, g.lda, wh, g.ldb,
                                          g.beta, dx, g.ldc);
    return {dx, M, K};
  }
  /// dW (out_features, in_features) += d̂y^T x̂ at `seg_grads` + offset (float32).
  template <class Ctx, class G, class DY, class X>
  auto backward_weight(const Ctx& ctx, G* seg_grads, DY dy, X x) const
      -> decltype(std::declval<const Layer&>().backward_weight(ctx, seg_grads, dy, x)) {
    check_context<Ctx>();
    const std::int64_t M = x.rows, N = layer_.out_features, K = layer_.in_features;
    float* dyh = fp8_operand_buffer<2>::get(static_cast<std::size_t>(M * N));
    float* xh = fp8_operand_buffer<0>::get(static_cast<std::size_t>(M * K));
    cast(ctx, dyh, dy.data, M * N, st_.dy, st_.amax_dy, dy_sharded, true);
    cast(ctx, xh, x.data, M * K, st_.x, st_.amax_x, x_sharded, false);
    const kernels::linear_gemm g = kernels::linear_backward_weight_gemm(M, N, K);
    kernels::gemm_mixed<float, float, G>(g.ta, g.tb, g.M, g.N, g.K, g.alpha, dyh, g.lda, xh, g.ldb,
                                         g.beta, seg_grads + layer_.offset, g.ldc);
  }

 private:
  // Which operands a layer holds a shard of (feature-split over tp): a
  // row-parallel layer's input, a column-parallel layer's output gradient.
  static constexpr bool x_sharded = std::is_same_v<Layer, row_parallel_linear>;
  static constexpr bool dy_sharded = !x_sharded;

  template <class Ctx>
  static constexpr void check_context() {
    static_assert(std::is_same_v<Ctx, kernels::host_context>,
                  "FP8 linear layers (precision::fp8_mixed) run on the host backend, where their "
                  "GEMMs are the reference float GEMMs of the dequantised operands; the cuda "
                  "backend trains bf16_mixed, bf16_mixed_bf16_grads and fp16_mixed");
  }

  // out = the round trip of a (n elements) with its scale (file comment);
  // `e5m2_if_hybrid`: a gradient operand (E5M2 under the hybrid format).
  template <class Ctx, class T>
  void cast(const Ctx& ctx, float* out, const T* a, std::int64_t n, precision::fp8_scale& scale,
            float& step_amax, bool sharded, bool e5m2_if_hybrid) const {
    const precision::fp8_recipe& r = st_.recipe();
    const bool e5m2 = e5m2_if_hybrid && r.format == precision::fp8_format::hybrid;
    float amax = kernels::fp8_amax(ctx, a, n);
    float s = scale.scale();
    if (r.scaling == precision::fp8_scaling::current) {
      if (sharded) layers_.all_reduce_values(&amax, 1, true);
      if (st_.observe) {
        scale.set_current(amax);
        s = scale.scale();
      } else {
        const float fmax = e5m2 ? fp8_e5m2::max_finite : fp8_e4m3::max_finite;
        s = precision::fp8_scale_of(amax, fmax, r.margin, s);
      }
    } else if (st_.observe) {
      step_amax = precision::fp8_amax_max(step_amax, amax);
    }
    if (e5m2)
      kernels::fp8_round_trip<fp8_e5m2>(ctx, out, a, n, s);
    else
      kernels::fp8_round_trip<fp8_e4m3>(ctx, out, a, n, s);
  }

  const Layer& layer_;
  const Layers& layers_;
  fp8_linear_state& st_;
};

}  // namespace tessera::nn
