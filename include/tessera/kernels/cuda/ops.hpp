#pragma once
/// \file kernels/cuda/ops.hpp
/// The kernel entry points over a cuda_context (kernels/cuda/context.hpp):
/// the same names, argument order and meaning as the host overloads of
/// kernels/*.hpp, so code written once against a context (nn/, optim/,
/// parallel/, train/) runs on the GPU when instantiated with tessera::cuda.
/// Each overload checks its types at compile time, takes its scratch from
/// the context's caching allocator on the context's stream, and launches
/// the kernels of kernels/cuda/ (declared in kernels/cuda/kernels.hpp,
/// attention.hpp, cross_entropy.hpp: compiled here from the headers under
/// nvcc, else linked from tessera::cuda_kernels; kernels/cuda/linkage.hpp).
/// Nothing synchronises the host.
///
/// Types: storage (weights, activations) is 16-bit, bf16 or fp16
/// (precision::bf16_mixed*, fp16_mixed): the flash-attention and fused
/// cross-entropy kernels are 16-bit kernels (so the fp32 and fp64 policies
/// run on the host only). Parameter gradients are float32. Activation
/// gradients are the policy's: the storage type goes to the kernels as it
/// is; float32 (precision::bf16_mixed) is rounded to the storage type in
/// scratch where it enters a GEMM or attention kernel, and their 16-bit
/// outputs are widened back, so the residual stream's gradient stays
/// float32.
///
/// Ids: the device kernels cannot report a bad id without a host sync; the
/// loader checks every id on the host. An embedding id outside [0, V) gives
/// a zero row and no gradient, which is how padding works: the ignore index
/// must therefore be negative (config_error otherwise).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/attention.hpp"
#include "tessera/kernels/cuda/context.hpp"
#include "tessera/kernels/cuda/cross_entropy.hpp"
#include "tessera/kernels/cuda/gemm.cuh"
#include "tessera/kernels/cuda/kernels.hpp"
#include "tessera/kernels/cuda/launch.hpp"
#include "tessera/kernels/detail/adafactor.hpp"
#include "tessera/kernels/detail/adamw.hpp"
#include "tessera/kernels/detail/attention.hpp"
#include "tessera/kernels/detail/lion.hpp"
#include "tessera/kernels/detail/muon.hpp"
#include "tessera/kernels/detail/rope.hpp"
#include "tessera/kernels/detail/sgd.hpp"
#include "tessera/kernels/fp8_operand.hpp"

namespace tessera::kernels {

namespace detail {
template <class T>
constexpr void cuda_storage_check() {
  static_assert(is_half_v<T>,
                "tessera::kernels (cuda): weights and activations are 16-bit (bf16 or fp16) on "
                "the GPU (the flash attention and fused cross-entropy kernels are 16-bit "
                "kernels): use precision::bf16_mixed, bf16_mixed_bf16_grads or fp16_mixed with "
                "tessera::cuda; fp32 and fp64 run on the host");
}
template <class G>
constexpr void cuda_grad_check() {
  static_assert(std::is_same_v<G, float> || is_half_v<G>,
                "tessera::kernels (cuda): activation gradients are float32, bf16 or fp16");
}
// `src` (n elements of G) as the storage type T: the pointer itself when G
// is T, else (G float) a rounded copy in `tmp` (scratch on the context's
// stream).
template <class T, class G>
const T* as_storage(const cuda_context& ctx, const G* src, std::int64_t n,
                    tensor<std::uint8_t, tessera::cuda>& tmp) {
  static_assert(std::is_same_v<G, T> || std::is_same_v<G, float>,
                "tessera::kernels (cuda): activation gradients are float32 or the storage type");
  if constexpr (std::is_same_v<G, T>) {
    return src;
  } else {
    tmp = ctx.scratch(static_cast<std::size_t>(n) * sizeof(T));
    T* d = reinterpret_cast<T*>(tmp.data());
    cuda::cast<T, float>(d, src, n, ctx.stream());
    return d;
  }
}
}  // namespace detail

// ---- embedding --------------------------------------------------------------------------------

/// out (N, H) = wte[tokens] (wte (V, H) bf16 or fp16); an id outside [0, V) embeds to zeros.
/// Throws config_error for a non-negative ignore_index (file comment).
template <class T>
void embedding_forward(const cuda_context& ctx, T* out, const std::int32_t* tokens, const T* wte,
                       std::int64_t N, std::int64_t V, std::int64_t H,
                       std::int32_t ignore_index = -100) {
  TESSERA_THROW_IF(ignore_index >= 0, config_error,
                   "embedding_forward (cuda): ignore_index=", ignore_index,
                   " must be negative (an out-of-range id is what embeds to zeros on the GPU)");
  cuda::embedding_forward<T>(out, tokens, wte, N, V, H, ctx.stream());
}

/// dwte (V, H) float32 += dout rows scattered by token (out-of-range ids skipped).
/// Throws config_error for a non-negative ignore_index.
template <class G, class GA>
void embedding_backward(const cuda_context& ctx, G* dwte, const GA* dout,
                        const std::int32_t* tokens, std::int64_t N, std::int64_t V, std::int64_t H,
                        std::int32_t ignore_index = -100) {
  static_assert(std::is_same_v<G, float>, "embedding_backward (cuda): dwte is float32");
  detail::cuda_grad_check<GA>();
  TESSERA_THROW_IF(ignore_index >= 0, config_error,
                   "embedding_backward (cuda): ignore_index=", ignore_index, " must be negative");
  cuda::embedding_backward<GA>(dwte, dout, tokens, N, V, H, ctx.stream());
}

/// out (N) = this rank's row of each id of the vocabulary slice [v_begin,
/// v_begin + Vl), or ignore_index (kernels::embedding_local_ids; ids are
/// not validated on the device, file comment). Throws config_error for a
/// non-negative ignore_index.
inline void embedding_local_ids(const cuda_context& ctx, std::int32_t* out, const std::int32_t* ids,
                                std::int64_t N, std::int64_t V, std::int64_t v_begin,
                                std::int64_t Vl, std::int32_t ignore_index) {
  TESSERA_THROW_IF(ignore_index >= 0, config_error,
                   "embedding_local_ids (cuda): ignore_index=", ignore_index, " must be negative");
  TESSERA_THROW_IF(V < 1, config_error, "embedding_local_ids (cuda): V=", V, " must be >= 1");
  cuda::embedding_local_ids(out, ids, N, v_begin, Vl, ignore_index, ctx.stream());
}

// ---- rmsnorm ----------------------------------------------------------------------------------

/// out (N, H) = rmsnorm(inp) * weight; rstd (N) float32 saved for the backward.
template <class T>
void rmsnorm_forward(const cuda_context& ctx, T* out, float* rstd, const T* inp, const T* weight,
                     std::int64_t N, std::int64_t H, double eps) {
  cuda::rmsnorm_forward<T>(out, rstd, inp, weight, N, H, eps, ctx.stream());
}

/// dinp (N, H) = (or += with accumulate_dinp) the input gradient; dweight (H)
/// float32 +=. Scratch: cuda::rmsnorm_backward_scratch_bytes(N, H).
template <class T, class GA, class G>
void rmsnorm_backward(const cuda_context& ctx, GA* dinp, G* dweight, const GA* dout, const T* inp,
                      const T* weight, const float* rstd, std::int64_t N, std::int64_t H,
                      bool accumulate_dinp = false) {
  static_assert(std::is_same_v<G, float>, "rmsnorm_backward (cuda): dweight is float32");
  auto s = ctx.scratch(cuda::rmsnorm_backward_scratch_bytes(N, H));
  cuda::rmsnorm_backward<T, GA>(dinp, dweight, dout, inp, weight, rstd, N, H, s.data(), s.bytes(),
                                ctx.stream(), accumulate_dinp);
}

// ---- linear layers (cuBLASLt) -----------------------------------------------------------------

/// out (M, N) = inp (M, K) weight^T (weight (N, K)), bf16 or fp16, cuBLASLt. Throws
/// cuda_error when cuBLASLt has no algorithm for the shape.
template <class T>
void linear_forward(const cuda_context& ctx, T* out, const T* inp, const T* weight, std::int64_t M,
                    std::int64_t N, std::int64_t K) {
  detail::cuda_storage_check<T>();
  cuda::linear_forward<T>(ctx.blas(), out, inp, weight, M, N, K, ctx.stream());
}

/// dinp (M, K) = (or += with accumulate) dout (M, N) weight; a float32 dout is
/// rounded to the storage type T in scratch first. Throws as linear_forward.
template <class T, class GA>
void linear_backward_input(const cuda_context& ctx, GA* dinp, const GA* dout, const T* weight,
                           std::int64_t M, std::int64_t N, std::int64_t K,
                           bool accumulate = false) {
  detail::cuda_storage_check<T>();
  detail::cuda_grad_check<GA>();
  tensor<std::uint8_t, tessera::cuda> tmp;
  const T* dy = detail::as_storage<T>(ctx, dout, M * N, tmp);
  cuda::linear_backward_input<GA>(ctx.blas(), dinp, dy, weight, M, N, K, ctx.stream(), accumulate);
}

/// dweight (N, K) float32 += dout^T (M, N) inp (M, K). Throws as linear_forward.
template <class T, class GA, class G>
void linear_backward_weight(const cuda_context& ctx, G* dweight, const GA* dout, const T* inp,
                            std::int64_t M, std::int64_t N, std::int64_t K) {
  detail::cuda_storage_check<T>();
  detail::cuda_grad_check<GA>();
  static_assert(std::is_same_v<G, float>, "linear_backward_weight (cuda): dweight is float32");
  tensor<std::uint8_t, tessera::cuda> tmp;
  const T* dy = detail::as_storage<T>(ctx, dout, M * N, tmp);
  cuda::linear_backward_weight(ctx.blas(), dweight, dy, inp, M, N, K, ctx.stream());
}

// ---- rope, swiglu, element-wise ---------------------------------------------------------------

/// Rotates x (B, T, nh, hd) in place by the float32 tables (rows, hd/2), each
/// token at its position of `positions` (kernels::rope_positions: t, its
/// position in its document, its global position on a cp rank; doc_start
/// in device memory).
template <class Storage, class R>
void rope_forward(const cuda_context& ctx, Storage* x, const R* cos, const R* sin, std::int64_t B,
                  std::int64_t T, std::int64_t nh, std::int64_t hd, rope_positions positions = {}) {
  static_assert(std::is_same_v<R, float>, "rope_forward (cuda): the tables are float32");
  cuda::rope_forward<Storage>(x, cos, sin, B, T, nh, hd, ctx.stream(), positions);
}

/// The inverse rotation of the gradient dx (B, T, nh, hd), in place, at
/// rope_forward's positions.
template <class G, class R>
void rope_backward(const cuda_context& ctx, G* dx, const R* cos, const R* sin, std::int64_t B,
                   std::int64_t T, std::int64_t nh, std::int64_t hd,
                   rope_positions positions = {}) {
  static_assert(std::is_same_v<R, float>, "rope_backward (cuda): the tables are float32");
  detail::cuda_grad_check<G>();
  cuda::rope_backward<G>(dx, cos, sin, B, T, nh, hd, ctx.stream(), positions);
}

/// out (n) = silu(gate) * up.
template <class T>
void swiglu_forward(const cuda_context& ctx, T* out, const T* gate, const T* up, std::int64_t n) {
  cuda::swiglu_forward<T>(out, gate, up, n, ctx.stream());
}

/// dgate, dup (n) = the gradients of swiglu_forward given dout (=, not +=).
template <class T, class G>
void swiglu_backward(const cuda_context& ctx, G* dgate, G* dup, const G* dout, const T* gate,
                     const T* up, std::int64_t n) {
  detail::cuda_grad_check<G>();
  cuda::swiglu_backward<T, G>(dgate, dup, dout, gate, up, n, ctx.stream());
}

/// out (n) = a + b (out may alias a).
template <class T>
void residual_add(const cuda_context& ctx, T* out, const T* a, const T* b, std::int64_t n) {
  cuda::residual_add<T>(out, a, b, n, ctx.stream());
}

/// out (n) = in converted to To (round to nearest even).
template <class To, class From>
void cast(const cuda_context& ctx, To* out, const From* in, std::int64_t n) {
  cuda::cast<To, From>(out, in, n, ctx.stream());
}

/// Flat elements [lo, hi) of a parameter buffer drawn in place (out: hi - lo
/// elements, device memory), as the host overload (kernels/weight_init.hpp);
/// `tensors` in host memory. Param float32, bf16 or fp16.
template <class Param>
void weight_init(const cuda_context& ctx, std::span<const weight_init_tensor> tensors,
                 std::int64_t lo, std::int64_t hi, Param* out) {
  static_assert(std::is_same_v<Param, float> || is_half_v<Param>,
                "weight_init (cuda): parameters are float32, bf16 or fp16 on the GPU");
  cuda::weight_init<Param>(out, tensors.data(), static_cast<std::int64_t>(tensors.size()), lo, hi,
                           ctx.stream());
}

// ---- FP8 scaled casts -------------------------------------------------------------------------

/// *amax (one float, device) = fp8_amax_max(*amax, max |x[i]|) over x (n)
/// of T in {float, bf16, fp16}: NaN kept, exact (the host's bits); n = 0
/// leaves it. Scratch: cuda::fp8_amax_scratch_bytes(n).
template <class T>
void fp8_amax_accumulate(const cuda_context& ctx, float* amax, const T* x, std::int64_t n) {
  static_assert(std::is_same_v<T, float> || is_half_v<T>,
                "fp8_amax_accumulate (cuda): x is float32, bf16 or fp16 on the GPU");
  auto s = ctx.scratch(cuda::fp8_amax_scratch_bytes(n));
  cuda::fp8_amax_accumulate<T>(amax, x, n, s.data(), s.bytes(), ctx.stream());
}

/// *scale = fp8_scale_of(*amax, fp8_max, margin, *scale), both floats on
/// the device, by one device thread (no host sync).
inline void fp8_update_scale(const cuda_context& ctx, float* scale, const float* amax,
                             float fp8_max, int margin) {
  cuda::fp8_update_scale(scale, amax, fp8_max, margin, ctx.stream());
}

/// q (n) of F8 = the scaled cast of x (n) of T in {float, bf16, fp16} by
/// *scale (device memory, not checked: kernels/cuda/kernels.hpp says what a
/// scale that is not finite > 0 gives); *inv_scale = 1 / *scale when not null.
template <class F8, class T>
void fp8_quantize(const cuda_context& ctx, F8* q, float* inv_scale, const T* x, std::int64_t n,
                  const float* scale) {
  static_assert(is_fp8_v<F8>, "fp8_quantize (cuda): F8 must be fp8_e4m3 or fp8_e5m2");
  static_assert(std::is_same_v<T, float> || is_half_v<T>,
                "fp8_quantize (cuda): x is float32, bf16 or fp16 on the GPU");
  cuda::fp8_quantize<F8, T>(q, inv_scale, x, n, scale, ctx.stream());
}

/// qt (cols, rows) of F8 = the scaled cast of x (rows, cols) transposed
/// (Transformer Engine's cast_transpose), the scale and inv_scale as fp8_quantize.
template <class F8, class T>
void fp8_quantize_transposed(const cuda_context& ctx, F8* qt, float* inv_scale, const T* x,
                             std::int64_t rows, std::int64_t cols, const float* scale) {
  static_assert(is_fp8_v<F8>, "fp8_quantize_transposed (cuda): F8 must be fp8_e4m3 or fp8_e5m2");
  static_assert(std::is_same_v<T, float> || is_half_v<T>,
                "fp8_quantize_transposed (cuda): x is float32, bf16 or fp16 on the GPU");
  cuda::fp8_quantize_transposed<F8, T>(qt, inv_scale, x, rows, cols, scale, ctx.stream());
}

/// kernels::fp8_gemm (kernels/fp8_gemm.hpp) on the GPU: row-major C(M,N) =
/// â(op(A)) b̂(op(B)) + beta C, each operand cast to FP8 with its scale into
/// scratch of the context's allocator (for the GEMM's duration), transposed
/// on the way (the cast-transpose kernel) where cuBLASLt's FP8 layout needs
/// it: op(A) as M x K and op(B) as N x K (row_major_fp8_matmul), then
/// cuBLASLt's FP8 matmul with the operands' inverse scales as its scale
/// pointers (cublaslt_context::gemm_fp8). The casts write *a.inverse and
/// *b.inverse. Equals the host's to float32 summation order.
/// TA, TB in {float, bf16, fp16}; TC in {float, bf16, fp16}.
/// Throws config_error as the host's (detail::check_fp8_gemm_args), and as
/// row_major_fp8_matmul (K a multiple of 16, ldc 16-byte aligned); cuda_error
/// where cuBLASLt has no FP8 matmul (a GPU before sm_89). M or N = 0 writes
/// the inverse scales and multiplies nothing.
template <class TC, class TA, class TB>
void fp8_gemm(const cuda_context& ctx, transpose ta, transpose tb, std::int64_t M, std::int64_t N,
              std::int64_t K, const TA* A, std::int64_t lda, const fp8_operand& a, const TB* B,
              std::int64_t ldb, const fp8_operand& b, float beta, TC* C, std::int64_t ldc) {
  static_assert((std::is_same_v<TA, float> || is_half_v<TA>) &&
                    (std::is_same_v<TB, float> || is_half_v<TB>),
                "fp8_gemm (cuda): operands are float32, bf16 or fp16 before their FP8 cast");
  static_assert(std::is_same_v<TC, float> || is_half_v<TC>,
                "fp8_gemm (cuda): C is float32, bf16 or fp16");
  kernels::detail::check_fp8_gemm_args("fp8_gemm (cuda)", ta, tb, M, N, K, lda, ldb, ldc, a,
                                       b);
  auto qa = ctx.scratch(static_cast<std::size_t>(M * K));
  auto qb = ctx.scratch(static_cast<std::size_t>(N * K));
  // x stored row-major `rows` x `cols` cast into q, transposed when `flip`
  // (q then `cols` x `rows`): the (M or N) x K layout the matmul reads.
  auto cast = [&]<class F8, class T>(F8* q, const T* x, const fp8_operand& o, bool flip,
                                     std::int64_t rows, std::int64_t cols) {
    if (flip)
      fp8_quantize_transposed<F8>(ctx, q, o.inverse, x, rows, cols, o.scale);
    else
      fp8_quantize<F8>(ctx, q, o.inverse, x, rows * cols, o.scale);
  };
  // op(A) (M x K): A stored M x K, or K x M (ta) and transposed.
  // op(B)^T (N x K): B stored N x K (tb), or K x N and transposed.
  auto run = [&]<class FA, class FB>(FA* qa8, FB* qb8) {
    cast(qa8, A, a, ta == transpose::yes, ta == transpose::yes ? K : M,
         ta == transpose::yes ? M : K);
    cast(qb8, B, b, tb == transpose::no, tb == transpose::no ? K : N, tb == transpose::no ? N : K);
    if (M == 0 || N == 0) return;  // the casts wrote the inverse scales
    ctx.blas().gemm_fp8(M, N, K, static_cast<const FA*>(qa8), K, a.inverse,
                        static_cast<const FB*>(qb8), K, b.inverse, beta, C, ldc, ctx.stream());
  };
  auto* pa = qa.data();
  auto* pb = qb.data();
  if (a.e5m2)
    run(reinterpret_cast<fp8_e5m2*>(pa), reinterpret_cast<fp8_e4m3*>(pb));
  else if (b.e5m2)
    run(reinterpret_cast<fp8_e4m3*>(pa), reinterpret_cast<fp8_e5m2*>(pb));
  else
    run(reinterpret_cast<fp8_e4m3*>(pa), reinterpret_cast<fp8_e4m3*>(pb));
}

// ---- attention (flash attention, bf16 or fp16) ---------------------------------------------

/// Throws config_error, naming the values and the limit, when the flash
/// attention kernels cannot run these heads on sequences of up to S tokens:
/// hd not 32, 64 or 128, nkv not dividing nh, S or nh over the kernels'
/// limits (cuda::attention_check_args).
inline void attention_check_shape(const cuda_context&, std::int64_t S, std::int64_t nh,
                                  std::int64_t nkv, std::int64_t hd) {
  cuda::attention_check_args("attention", 1, S, nh, nkv, hd);
}

/// The key/value rows of a ring block's `span` for S query rows after
/// checking that the flash attention block kernels take it: an offset < 0,
/// Sk < 1 other than -1, Sk over attention_max_S, or a global position at
/// or past 2^30 throws config_error naming the value
/// (cuda::attention_check_span).
inline std::int64_t attention_check_span(const cuda_context&, std::int64_t S, attention_span span) {
  return cuda::attention_check_span("attention", S, span);
}

/// Causal flash attention: out (B, S, nh, hd) and lse (B, nh, S) float32 from
/// q (B, S, nh, hd), k, v (B, Sk, nkv, hd), bf16 or fp16, under `mask`
/// (attention_mask; doc_start in device memory). With a `span` given (any
/// but the default, the whole-sequence {0, 0, S} included), or a float32
/// `out` (O = float, a ring's partial output for attention_merge), one
/// block of ring attention: the block kernels (cuda::flash_attention_forward
/// with a span; cuda::attention_runs_blocks); a 16-bit out of a block is its
/// float32 output rounded once (scratch of B S nh hd floats). Otherwise the
/// causal kernels. Throws config_error as attention_check_shape and
/// cuda::attention_check_span.
template <class T, class O = T>
void attention_forward(const cuda_context& ctx, O* out, float* lse, const T* q, const T* k,
                       const T* v, std::int64_t B, std::int64_t S, std::int64_t nh,
                       std::int64_t nkv, std::int64_t hd, attention_mask mask = {},
                       attention_span span = {}) {
  detail::cuda_storage_check<T>();
  static_assert(std::is_same_v<O, T> || std::is_same_v<O, float>,
                "attention_forward (cuda): out is the storage type or float32 (a ring block's "
                "partial output)");
  constexpr bool float_out = !std::is_same_v<O, T>;
  if constexpr (!float_out) {
    if (!cuda::attention_runs_blocks(float_out, span)) {
      cuda::flash_attention_forward(out, lse, q, k, v, B, S, nh, nkv, hd, ctx.stream(),
                                    mask.doc_start);
    } else {
      const std::int64_t n = B * S * nh * hd;
      auto f = ctx.scratch(static_cast<std::size_t>(n) * sizeof(float));
      float* of = reinterpret_cast<float*>(f.data());
      cuda::flash_attention_forward(of, lse, q, k, v, B, S, nh, nkv, hd, ctx.stream(),
                                    mask.doc_start, span);
      cuda::cast<T, float>(out, of, n, ctx.stream());
    }
  } else {
    cuda::flash_attention_forward(out, lse, q, k, v, B, S, nh, nkv, hd, ctx.stream(),
                                  mask.doc_start, span);
  }
}

/// dq, dk, dv (=, not +=) from dout and the forward's out and lse; float32
/// gradients of single-rank attention go through scratch of the storage
/// type T. Scratch: cuda::flash_attention_backward_scratch_bytes. `mask`:
/// attention_forward's. With a `span` given (any but the default, the
/// whole-sequence {0, 0, S} of a ring's diagonal block included), or
/// `dq_mode` accumulate, one block of ring attention from the final out
/// and lse (the block kernels, cuda::attention_runs_blocks: float32 dq,
/// dk, dv, so float32 G is exact and 16-bit G rounds once; dq accumulated
/// (`+=`) only into float32, else config_error). Throws as
/// attention_forward.
template <class T, class G>
void attention_backward(const cuda_context& ctx, G* dq, G* dk, G* dv, const G* dout, const T* q,
                        const T* k, const T* v, const T* out, const float* lse, std::int64_t B,
                        std::int64_t S, std::int64_t nh, std::int64_t nkv, std::int64_t hd,
                        attention_mask mask = {}, attention_span span = {},
                        attention_dq dq_mode = attention_dq::write) {
  detail::cuda_storage_check<T>();
  detail::cuda_grad_check<G>();
  auto s = ctx.scratch(cuda::flash_attention_backward_scratch_bytes(B, S, nh, nkv, hd));
  // float_out false: float32 G with the default span is single-rank
  // attention's gradient, not a block's partial (attention_runs_blocks).
  if (cuda::attention_runs_blocks(false, span, dq_mode)) {
    constexpr bool float_dq = std::is_same_v<G, float>;
    TESSERA_THROW_IF(dq_mode == attention_dq::accumulate && !float_dq, config_error,
                     "attention_backward (cuda): attention_dq::accumulate needs float32 dq, got a "
                     "16-bit G: a ring's dq would be rounded per block");
    const std::int64_t Sk = cuda::attention_check_span("attention_backward (cuda)", S, span);
    const std::int64_t nq = B * S * nh * hd, nk = B * Sk * nkv * hd;
    tensor<std::uint8_t, tessera::cuda> tdout;
    const T* dy = detail::as_storage<T>(ctx, dout, nq, tdout);
    if constexpr (std::is_same_v<G, float>) {
      cuda::flash_attention_backward(dq, dk, dv, dy, q, k, v, out, lse, B, S, nh, nkv, hd, s.data(),
                                     s.bytes(), ctx.stream(), mask.doc_start, span, dq_mode);
    } else {
      // 16-bit gradients of a block: its float32 ones rounded once.
      auto g = ctx.scratch(static_cast<std::size_t>(nq + 2 * nk) * sizeof(float));
      float* gq = reinterpret_cast<float*>(g.data());
      float *gk = gq + nq, *gv = gk + nk;
      cuda::flash_attention_backward(gq, gk, gv, dy, q, k, v, out, lse, B, S, nh, nkv, hd, s.data(),
                                     s.bytes(), ctx.stream(), mask.doc_start, span, dq_mode);
      cuda::cast<G, float>(dq, gq, nq, ctx.stream());
      cuda::cast<G, float>(dk, gk, nk, ctx.stream());
      cuda::cast<G, float>(dv, gv, nk, ctx.stream());
    }
    return;
  }
  if constexpr (std::is_same_v<G, T>) {
    cuda::flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, S, nh, nkv, hd, s.data(),
                                   s.bytes(), ctx.stream(), mask.doc_start);
  } else {
    // float32 gradients: T in and out of the kernel, widened after.
    const std::int64_t nq = B * S * nh * hd, nk = B * S * nkv * hd;
    tensor<std::uint8_t, tessera::cuda> tdout;
    const T* dy = detail::as_storage<T>(ctx, dout, nq, tdout);
    auto g = ctx.scratch(static_cast<std::size_t>(nq + 2 * nk) * sizeof(T));
    T* gq = reinterpret_cast<T*>(g.data());
    T *gk = gq + nq, *gv = gk + nk;
    cuda::flash_attention_backward(gq, gk, gv, dy, q, k, v, out, lse, B, S, nh, nkv, hd, s.data(),
                                   s.bytes(), ctx.stream(), mask.doc_start);
    cuda::cast<float, T>(dq, gq, nq, ctx.stream());
    cuda::cast<float, T>(dk, gk, nk, ctx.stream());
    cuda::cast<float, T>(dv, gv, nk, ctx.stream());
  }
}

/// Merges one ring block's partial attention (out_part, lse_part) into the
/// accumulator (out_acc, lse_acc), float32, as the host attention_merge
/// (cuda::flash_attention_merge). Throws config_error for a size < 1.
inline void attention_merge(const cuda_context& ctx, float* out_acc, float* lse_acc,
                            const float* out_part, const float* lse_part, std::int64_t B,
                            std::int64_t S, std::int64_t nh, std::int64_t hd) {
  cuda::flash_attention_merge(out_acc, lse_acc, out_part, lse_part, B, S, nh, hd, ctx.stream());
}

// ---- the LM head with cross-entropy -----------------------------------------------------------

/// The fused LM head in chunks of `chunk` rows: *loss_sum (double, device)
/// += the sum of -log softmax(x wlm^T)[target] over scored rows; dx (N, H)
/// = grad_scale * dloss/dx (null: forward only), dwlm (V, H) float32 +=.
/// Scratch: cuda::lm_head_cross_entropy_scratch_bytes(N, V, H, chunk).
template <class T, class GA, class G>
void lm_head_cross_entropy(const cuda_context& ctx, double* loss_sum, const T* x, const T* wlm,
                           const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           std::int64_t H, std::int32_t ignore_index, float grad_scale, GA* dx,
                           G* dwlm, std::int64_t chunk) {
  detail::cuda_storage_check<T>();
  static_assert(std::is_same_v<G, float>, "lm_head_cross_entropy (cuda): dwlm is float32");
  auto s = ctx.scratch(cuda::lm_head_cross_entropy_scratch_bytes(N, V, H, chunk));
  if constexpr (std::is_same_v<GA, T>) {
    cuda::lm_head_cross_entropy(ctx.blas(), loss_sum, x, wlm, targets, N, V, H, ignore_index,
                                grad_scale, dx, dwlm, chunk, s.data(), s.bytes(), ctx.stream());
  } else {
    detail::cuda_grad_check<GA>();
    static_assert(std::is_same_v<GA, float>,
                  "lm_head_cross_entropy (cuda): dx is float32 or the storage type");
    tensor<std::uint8_t, tessera::cuda> d16;
    T* dxb = nullptr;
    if (dx) {
      d16 = ctx.scratch(static_cast<std::size_t>(N * H) * sizeof(T));
      dxb = reinterpret_cast<T*>(d16.data());
    }
    cuda::lm_head_cross_entropy(ctx.blas(), loss_sum, x, wlm, targets, N, V, H, ignore_index,
                                grad_scale, dxb, dwlm, chunk, s.data(), s.bytes(), ctx.stream());
    if (dx) cuda::cast<float, T>(dx, dxb, N * H, ctx.stream());
  }
}

/// The vocabulary-parallel LM head with cross-entropy (Megatron's
/// vocab-parallel cross-entropy), as the host overload in
/// kernels/cross_entropy.hpp: this rank holds rows [v_begin, v_begin + Vl)
/// of the padded vocabulary (wlm (Vl, H) bf16 or fp16, dwlm (Vl, H) float32 +=);
/// per chunk of rows its logits (a cuBLASLt GEMM), then `reduce(bool max,
/// float* values, std::int64_t n)` (an in-place all-reduce over the tp
/// group, on the context's stream: an NCCL communicator) combines the row
/// maxima and then the sums of exponentials with the target logits; dx
/// (N, H) is written with this rank's partial sum (all-reduce it). Every
/// chunk reduces. Targets are not validated on the device (a target
/// outside [0, V) gives a NaN loss and gradient, as lm_head_cross_entropy).
/// Scratch: (chunk, Vl) float logits and 16-bit logit gradients, 3 chunk
/// floats, N doubles (and N H 16-bit values for a float32 dx). Throws config_error
/// for a size < 1, a slice outside [0, V + Vl), chunk < 1, only one of dx
/// and dwlm, or (unlike the host overload) a non-negative ignore_index,
/// as the GPU embedding.
template <class T, class GA, class G, class Reduce>
void lm_head_cross_entropy_vocab_parallel(const cuda_context& ctx, double* loss_sum, const T* x,
                                          const T* wlm, const std::int32_t* targets, std::int64_t N,
                                          std::int64_t V, std::int64_t v_begin, std::int64_t Vl,
                                          std::int64_t H, std::int32_t ignore_index,
                                          float grad_scale, GA* dx, G* dwlm, std::int64_t chunk,
                                          Reduce&& reduce) {
  detail::cuda_storage_check<T>();
  static_assert(std::is_same_v<G, float>,
                "lm_head_cross_entropy_vocab_parallel (cuda): dwlm is float32");
  detail::cuda_grad_check<GA>();
  static_assert(std::is_same_v<GA, T> || std::is_same_v<GA, float>,
                "lm_head_cross_entropy_vocab_parallel (cuda): dx is float32 or the storage type");
  TESSERA_THROW_IF(N <= 0 || H <= 0 || V <= 0 || Vl <= 0, config_error,
                   "lm_head_cross_entropy_vocab_parallel (cuda): every size must be >= 1, got N=",
                   N, " H=", H, " V=", V, " Vl=", Vl);
  TESSERA_THROW_IF(v_begin < 0 || v_begin >= V + Vl, config_error,
                   "lm_head_cross_entropy_vocab_parallel (cuda): slice [", v_begin, ", ",
                   v_begin + Vl, ") is outside the padded vocabulary of V=", V);
  TESSERA_THROW_IF(chunk <= 0, config_error,
                   "lm_head_cross_entropy_vocab_parallel (cuda): chunk=", chunk,
                   " must be >= 1 token rows");
  TESSERA_THROW_IF((dx == nullptr) != (dwlm == nullptr), config_error,
                   "lm_head_cross_entropy_vocab_parallel (cuda): pass both dx and dwlm or neither");
  TESSERA_THROW_IF(ignore_index >= 0, config_error,
                   "lm_head_cross_entropy_vocab_parallel (cuda): ignore_index=", ignore_index,
                   " must be negative");
  const cudaStream_t st = ctx.stream();
  const bool grad = dx != nullptr;
  const std::int64_t real = std::max<std::int64_t>(0, std::min(Vl, V - v_begin));
  const std::int64_t C = std::min(chunk, N);
  auto f32 = [&](std::int64_t n) { return ctx.scratch(static_cast<std::size_t>(n) * 4); };
  tensor<std::uint8_t, tessera::cuda> logits_buf = f32(C * Vl), stats_buf = f32(3 * C);
  tensor<std::uint8_t, tessera::cuda> rows_buf = ctx.scratch(static_cast<std::size_t>(N) * 8);
  tensor<std::uint8_t, tessera::cuda> dlogits_buf, dx_buf;
  if (grad) dlogits_buf = ctx.scratch(static_cast<std::size_t>(C * Vl) * sizeof(T));
  float* logits = reinterpret_cast<float*>(logits_buf.data());
  float* mx = reinterpret_cast<float*>(stats_buf.data());
  float* se = mx + C;  // se[0, c): sums of exps; se[c, 2c): target logits
  double* row_loss = reinterpret_cast<double*>(rows_buf.data());
  T* dlogits = grad ? reinterpret_cast<T*>(dlogits_buf.data()) : nullptr;
  T* dxb = nullptr;  // dx as T (the GEMM's output type)
  if constexpr (std::is_same_v<GA, T>) {
    dxb = dx;
  } else if (grad) {
    dx_buf = ctx.scratch(static_cast<std::size_t>(N * H) * sizeof(T));
    dxb = reinterpret_cast<T*>(dx_buf.data());
  }
  for (std::int64_t r0 = 0; r0 < N; r0 += C) {
    const std::int64_t c = std::min(C, N - r0);
    const T* xc = x + r0 * H;
    cuda::linear_forward<float>(ctx.blas(), logits, xc, wlm, c, Vl, H, st);
    cuda::vocab_parallel_ce_row_max(mx, logits, c, Vl, real, st);
    reduce(true, mx, c);
    cuda::vocab_parallel_ce_row_sums(se, logits, mx, targets + r0, c, V, v_begin, Vl, real,
                                     ignore_index, st);
    reduce(false, se, 2 * c);
    cuda::vocab_parallel_ce_row_grad(row_loss + r0, dlogits, logits, mx, se, targets + r0, c,
                                     v_begin, Vl, real, ignore_index, grad_scale, st);
    if (!grad) continue;
    cuda::linear_backward_input<T>(ctx.blas(), dxb + r0 * H, dlogits, wlm, c, Vl, H, st);
    cuda::linear_backward_weight(ctx.blas(), dwlm, dlogits, xc, c, Vl, H, st);
  }
  cuda::lm_head_ce_finish(loss_sum, row_loss, dxb, targets, N, H, ignore_index, st);
  if constexpr (!std::is_same_v<GA, T>)
    if (grad) cuda::cast<float, T>(dx, dxb, N * H, st);
}

/// logits (V) float32 = wlm (V, H) x_row (H): one row, for sampling.
template <class T>
void lm_head_logits(const cuda_context& ctx, float* logits, const T* x_row, const T* wlm,
                    std::int64_t H, std::int64_t V) {
  detail::cuda_storage_check<T>();
  cuda::linear_forward<float>(ctx.blas(), logits, x_row, wlm, 1, V, H, ctx.stream());
}

// ---- the optimizer's kernels ------------------------------------------------------------------

/// *out (double, device) = (or += with accumulate) the sum of g[0, n)^2 in
/// float64, in a fixed order (not the host's: equal to float64 rounding).
template <class G>
void grad_sum_squares(const cuda_context& ctx, double* out, const G* g, std::int64_t n,
                      bool accumulate = false) {
  auto s = ctx.scratch(cuda::grad_sum_squares_scratch_bytes(n));
  cuda::grad_sum_squares<G>(out, g, n, s.data(), s.bytes(), ctx.stream(), accumulate);
}

/// *coef (float32, device) = unscaled_clip_coefficient_of(*sum_squares,
/// max_norm, inv_loss_scale), as the host's kernels::clip_coefficient.
template <class M>
void clip_coefficient(const cuda_context& ctx, M* coef, const double* sum_squares, double max_norm,
                      double inv_loss_scale = 1.0) {
  static_assert(std::is_same_v<M, float>, "clip_coefficient (cuda): the master type is float32");
  cuda::clip_coefficient<M>(coef, sum_squares, max_norm, ctx.stream(), inv_loss_scale);
}

/// One AdamW step over n flat elements in `segments` (device memory), the
/// gradient multiplied by *grad_scale (device; NaN: no update). float32 state.
template <class Param, class Grad, class M>
void adamw_step(const cuda_context& ctx, Param* params, M* master, M* m, M* v, const Grad* grads,
                std::int64_t n, const optimizer_segment* segments, int num_segments,
                detail::adamw_step_params<M> step, const M* grad_scale) {
  static_assert(std::is_same_v<M, float>, "adamw_step (cuda): the master type is float32");
  cuda::adamw_step<Param, Grad>(params, master, m, v, grads, n, segments, num_segments, step,
                                grad_scale, ctx.stream());
}

/// One SGD step (momentum, Nesterov, decoupled decay) as adamw_step.
template <class Param, class Grad, class M>
void sgd_step(const cuda_context& ctx, Param* params, M* master, M* buf, const Grad* grads,
              std::int64_t n, const optimizer_segment* segments, int num_segments,
              detail::sgd_step_params<M> step, const M* grad_scale) {
  static_assert(std::is_same_v<M, float>, "sgd_step (cuda): the master type is float32");
  cuda::sgd_step<Param, Grad>(params, master, buf, grads, n, segments, num_segments, step,
                              grad_scale, ctx.stream());
}

/// One Adafactor step, or one phase of it, over the tensors of `tensors`
/// (device memory), as the host kernels::adafactor_step
/// (kernels/adafactor.hpp). float32 state.
template <class Param, class Grad, class M>
void adafactor_step(const cuda_context& ctx, Param* params, M* master, const Grad* grads,
                    const adafactor_tensor* tensors, const adafactor_sizes& sizes,
                    adafactor_buffers<M> buf, detail::adafactor_step_params<M> step,
                    const M* grad_scale, adafactor_phase phase = adafactor_phase::all) {
  static_assert(std::is_same_v<M, float>, "adafactor_step (cuda): the master type is float32");
  cuda::adafactor_step<Param, Grad>(params, master, grads, tensors, sizes, buf, step, grad_scale,
                                    phase, ctx.stream());
}
/// The ranks' gathered sums areas added in rank order, as the host
/// kernels::adafactor_sum_ranks.
inline void adafactor_sum_ranks(const cuda_context& ctx, double* out, const double* gathered,
                                int ranks, std::int64_t n, std::int64_t stride) {
  cuda::adafactor_sum_ranks<double>(out, gathered, ranks, n, stride, ctx.stream());
}

/// One Lion step (the momentum `m`) as adamw_step.
template <class Param, class Grad, class M>
void lion_step(const cuda_context& ctx, Param* params, M* master, M* m, const Grad* grads,
               std::int64_t n, const optimizer_segment* segments, int num_segments,
               detail::lion_step_params<M> step, const M* grad_scale) {
  static_assert(std::is_same_v<M, float>, "lion_step (cuda): the master type is float32");
  cuda::lion_step<Param, Grad>(params, master, m, grads, n, segments, num_segments, step,
                               grad_scale, ctx.stream());
}

/// The fused pass of a Muon step (the matrices' momentum, the other
/// tensors' AdamW step), as the host kernels::muon_momentum_step. float32 state.
template <class Param, class Grad, class M>
void muon_momentum_step(const cuda_context& ctx, Param* params, M* master, M* m, M* v,
                        const Grad* grads, std::int64_t n, const muon_segment* segments,
                        int num_segments, detail::muon_step_params<M> step, const M* grad_scale) {
  static_assert(std::is_same_v<M, float>, "muon_momentum_step (cuda): the master type is float32");
  cuda::muon_momentum_step<Param, Grad>(params, master, m, v, grads, n, segments, num_segments,
                                        step, grad_scale, ctx.stream());
}

/// What one matrix orthogonalises, its shard, as the host kernels::muon_nesterov.
template <class Grad, class M>
void muon_nesterov(const cuda_context& ctx, M* out, const M* m, const Grad* grads,
                   const muon_matrix& t, detail::muon_step_params<M> step, const M* grad_scale) {
  static_assert(std::is_same_v<M, float>, "muon_nesterov (cuda): the master type is float32");
  cuda::muon_nesterov<Grad>(out, m, grads, t, step, grad_scale, ctx.stream());
}

/// W from the gathered shards, as the host kernels::muon_assemble.
template <class M>
void muon_assemble(const cuda_context& ctx, M* wide, const M* gathered, const muon_matrix& t) {
  static_assert(std::is_same_v<M, float>, "muon_assemble (cuda): the master type is float32");
  cuda::muon_assemble<float>(wide, gathered, t, ctx.stream());
}

/// The quintic Newton-Schulz iteration on W (m x n, m <= n, device memory,
/// in place), as the host kernels::muon_newton_schulz: the squared norm by
/// grad_sum_squares into the scratch's double, W divided by max(norm, eps)
/// on the device (no host synchronisation), then per step three cuBLASLt
/// matmuls through the context in float32 (torch.optim.Muon runs them in
/// bfloat16) and two device copies. `scratch` holds
/// muon_ns_scratch_elements(m, n, 4) floats. Throws config_error as the host's.
template <class M>
void muon_newton_schulz(const cuda_context& ctx, M* wide, std::int64_t m, std::int64_t n,
                        M* scratch, double a, double b, double c, int steps, double eps) {
  static_assert(std::is_same_v<M, float>, "muon_newton_schulz (cuda): the master type is float32");
  TESSERA_THROW_IF(m < 0 || m > n, config_error, "muon_newton_schulz (cuda): ", m, " x ", n,
                   " must be a wide matrix (0 <= rows <= cols)");
  if (m == 0) return;
  float* other = scratch;
  float* gram = other + m * n;
  float* poly = gram + m * m;
  double* ss = muon_norm_slot(poly + m * m);
  grad_sum_squares(ctx, ss, static_cast<const float*>(wide), m * n);
  cuda::muon_normalise<float>(wide, m * n, ss, eps, ctx.stream());
  float* x = wide;
  float* y = other;
  const auto bytes = [](std::int64_t e) { return static_cast<std::size_t>(e) * sizeof(float); };
  for (int s = 0; s < steps; ++s) {
    ctx.blas().gemm<float, float>(transpose::no, transpose::yes, m, m, n, 1.0f, x, n, x, n, 0.0f,
                                  gram, m, ctx.stream());
    ctx.copy(poly, gram, bytes(m * m));
    ctx.blas().gemm<float, float>(transpose::no, transpose::no, m, m, m, static_cast<float>(c),
                                  gram, m, gram, m, static_cast<float>(b), poly, m, ctx.stream());
    ctx.copy(y, x, bytes(m * n));
    ctx.blas().gemm<float, float>(transpose::no, transpose::no, m, n, m, 1.0f, poly, m, x, n,
                                  static_cast<float>(a), y, n, ctx.stream());
    std::swap(x, y);
  }
  if (x != wide) ctx.copy(wide, x, bytes(m * n));
}

/// The update of one matrix's shard, as the host kernels::muon_apply.
template <class Param, class M>
void muon_apply(const cuda_context& ctx, Param* params, M* master, const M* wide,
                const muon_matrix& t, M decay_factor, M adjusted_lr, const M* grad_scale) {
  static_assert(std::is_same_v<M, float>, "muon_apply (cuda): the master type is float32");
  cuda::muon_apply<Param>(params, master, wide, t, decay_factor, adjusted_lr, grad_scale,
                          ctx.stream());
}

}  // namespace tessera::kernels
