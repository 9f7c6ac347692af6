#pragma once
/// \file gemm.hpp
/// Host GEMM through CBLAS (OpenBLAS), its mixed-precision forms, and the
/// linear-layer wrappers the model calls.
///
/// Gradient contract (llm.c): parameter gradients accumulate (`+=`:
/// `linear_backward_weight`), activation gradients are written (`=`:
/// `linear_backward_input`, unless `accumulate` is set).
///
/// Precision: double calls `cblas_dgemm`; float calls oneDNN's sgemm when
/// A is not transposed, op(B) is small (at most 2^17 elements) and the
/// build has oneDNN (faster there; detail/onednn_gemm.hpp gives the
/// figures, `detail::sgemm_engine()` the rule), else `cblas_sgemm`.
/// bf16 A and B with a float or bf16 C run on oneDNN's native bf16 matmul
/// where the build has oneDNN and the CPU bf16 dot products
/// (detail/onednn_gemm.hpp; `detail::bf16_gemm_engine()` says which).
/// Any other combination (bf16 operands, a float operand with a bf16 one, a
/// bf16 output) converts the operands exactly to the compute type (float, or
/// double when any operand is double) in a per-thread workspace, runs the
/// BLAS in the compute type, and rounds a 16-bit output once, at the store.
/// The workspace is reused across calls and grows as needed; see
/// `gemm_workspace_bytes`.
///
/// Call from serial code, never inside an OpenMP parallel region
/// (docs/kernel-contract.md): the BLAS and the conversions are parallel.

#include <cblas.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/gemm_args.hpp"
#include "tessera/kernels/detail/onednn_gemm.hpp"

namespace tessera::kernels {


/// Compute type of a GEMM over element types TA, TB, TC: double when any of
/// them is double, float otherwise.
template <class TA, class TB, class TC>
using gemm_compute_t =
    std::conditional_t<std::is_same_v<TA, double> || std::is_same_v<TB, double> ||
                           std::is_same_v<TC, double>,
                       double, float>;

namespace detail {

template <class T>
inline constexpr bool is_gemm_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || is_half_v<T>;

/// A per-thread, grow-only scratch buffer; `Slot` tells the A, B and C
/// buffers apart so one call can hold all three.
template <class T, int Slot>
struct gemm_workspace {
  static T* get(std::size_t n) {
    auto& s = state();
    if (s.capacity < n) {
      s.data.reset(new T[n]);
      s.capacity = n;
    }
    return s.data.get();
  }
  static std::size_t bytes() { return state().capacity * sizeof(T); }
  static void release() {
    auto& s = state();
    s.data.reset();
    s.capacity = 0;
  }

 private:
  struct storage {
    std::unique_ptr<T[]> data;
    std::size_t capacity = 0;
  };
  static storage& state() {
    thread_local storage s;
    return s;
  }
};

inline CBLAS_TRANSPOSE cblas_op(transpose t) {
  return t == transpose::yes ? CblasTrans : CblasNoTrans;
}

/// Copies a rows x cols row-major block with leading dimension `ld_src` into
/// `dst` (leading dimension `ld_dst`), converting each element exactly or
/// rounding once to `To`.
template <class To, class From>
void convert_block(To* dst, std::int64_t ld_dst, const From* src, std::int64_t ld_src,
                   std::int64_t rows, std::int64_t cols) {
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const From* s = src + r * ld_src;
    To* d = dst + r * ld_dst;
    for (std::int64_t c = 0; c < cols; ++c) d[c] = to<To>(s[c]);
  }
}

template <class T>
void blas_gemm(transpose ta, transpose tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha,
               const T* A, std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C,
               std::int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    // Small op(B), op(A) = A: oneDNN's sgemm where built in (detail/onednn_gemm.hpp says why).
    if (ta == transpose::no && onednn_sgemm(tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
      return;
    cblas_sgemm(CblasRowMajor, cblas_op(ta), cblas_op(tb), static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb),
                beta, C, static_cast<int>(ldc));
  } else {
    static_assert(std::is_same_v<T, double>);
    cblas_dgemm(CblasRowMajor, cblas_op(ta), cblas_op(tb), static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb),
                beta, C, static_cast<int>(ldc));
  }
}

}  // namespace detail

/// Row-major GEMM over any mix of element types:
/// C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C.
///
/// - `TA`, `TB`, `TC` in {float, double, bf16}. Arithmetic runs in
///   `gemm_compute_t<TA,TB,TC>` (double if any is double, else float). An
///   operand of another type is converted exactly into a per-thread workspace
///   first; a bf16 C is computed in float and rounded once at the store.
/// - op(A) is A when `ta == transpose::no` (A stored M x K, `lda >= K`) and
///   A^T when `yes` (A stored K x M, `lda >= M`); likewise B (K x N,
///   `ldb >= N`, or N x K, `ldb >= K`). `ldc >= N`. All `>= 1`.
/// - `beta == 0` does not read C (it may hold NaN), as in BLAS.
/// - C must not alias A or B.
/// - Throws `config_error` for a negative size, a leading dimension below
///   the rule above, or a value beyond the BLAS's 32-bit int.
/// - Deterministic for a fixed thread count (OpenBLAS's or oneDNN's blocking).
/// Source: the BLAS xGEMM definition (Dongarra et al., 1990), row-major CBLAS.
template <class TA, class TB, class TC>
void gemm_mixed(transpose ta, transpose tb, std::int64_t M, std::int64_t N, std::int64_t K,
                gemm_compute_t<TA, TB, TC> alpha, const TA* A, std::int64_t lda, const TB* B,
                std::int64_t ldb, gemm_compute_t<TA, TB, TC> beta, TC* C, std::int64_t ldc) {
  static_assert(
      detail::is_gemm_type_v<TA> && detail::is_gemm_type_v<TB> && detail::is_gemm_type_v<TC>,
      "tessera::kernels::gemm: element types must be float, double, bf16 or fp16; convert "
      "other types first");
  using Acc = gemm_compute_t<TA, TB, TC>;
  detail::check_gemm_args(ta, tb, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if constexpr (std::is_same_v<TA, bf16> && std::is_same_v<TB, bf16> &&
                !std::is_same_v<TC, double>) {
    // native bf16 dot products where oneDNN has them (detail/onednn_gemm.hpp)
    if (detail::onednn_bf16_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  }

  // op(A)'s storage is a_rows x a_cols, op(B)'s b_rows x b_cols.
  const std::int64_t a_rows = ta == transpose::no ? M : K;
  const std::int64_t a_cols = ta == transpose::no ? K : M;
  const std::int64_t b_rows = tb == transpose::no ? K : N;
  const std::int64_t b_cols = tb == transpose::no ? N : K;

  const Acc* a = nullptr;
  std::int64_t lda_c = lda;
  if constexpr (std::is_same_v<TA, Acc>) {
    a = A;
  } else {
    lda_c = a_cols > 1 ? a_cols : 1;
    Acc* buf = detail::gemm_workspace<Acc, 0>::get(static_cast<std::size_t>(a_rows * lda_c));
    detail::convert_block(buf, lda_c, A, lda, a_rows, a_cols);
    a = buf;
  }
  const Acc* b = nullptr;
  std::int64_t ldb_c = ldb;
  if constexpr (std::is_same_v<TB, Acc>) {
    b = B;
  } else {
    ldb_c = b_cols > 1 ? b_cols : 1;
    Acc* buf = detail::gemm_workspace<Acc, 1>::get(static_cast<std::size_t>(b_rows * ldb_c));
    detail::convert_block(buf, ldb_c, B, ldb, b_rows, b_cols);
    b = buf;
  }
  if constexpr (std::is_same_v<TC, Acc>) {
    detail::blas_gemm<Acc>(ta, tb, M, N, K, alpha, a, lda_c, b, ldb_c, beta, C, ldc);
  } else {
    Acc* c = detail::gemm_workspace<Acc, 2>::get(static_cast<std::size_t>(M * N));
    if (beta != Acc(0)) detail::convert_block(c, N, C, ldc, M, N);
    detail::blas_gemm<Acc>(ta, tb, M, N, K, alpha, a, lda_c, b, ldb_c, beta, c, N);
    detail::convert_block(C, ldc, c, N, M, N);  // the one rounding of a 16-bit C
  }
}

/// Row-major GEMM, one element type: C(M,N) = alpha * op(A) * op(B) + beta * C.
/// float -> `cblas_sgemm`, double -> `cblas_dgemm`, bf16 -> float compute with
/// one rounding at the store. Shapes, leading dimensions, aliasing and throws
/// as in `gemm_mixed`.
template <class T>
void gemm(transpose ta, transpose tb, std::int64_t M, std::int64_t N, std::int64_t K,
          accum_t<T> alpha, const T* A, std::int64_t lda, const T* B, std::int64_t ldb,
          accum_t<T> beta, T* C, std::int64_t ldc) {
  gemm_mixed<T, T, T>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/// Mixed-type GEMM overload (e.g. bf16 A and B with a float C, or a float A
/// with a bf16 B, as in dinp = dout(float) * W(bf16)): forwards to
/// `gemm_mixed<TA, TB, TC>`, which documents it.
template <class TA, class TB, class TC>
requires(!(std::is_same_v<TA, TB> && std::is_same_v<TB, TC>)) void gemm(
    transpose ta, transpose tb, std::int64_t M, std::int64_t N, std::int64_t K,
    gemm_compute_t<TA, TB, TC> alpha, const TA* A, std::int64_t lda, const TB* B, std::int64_t ldb,
    gemm_compute_t<TA, TB, TC> beta, TC* C, std::int64_t ldc) {
  gemm_mixed<TA, TB, TC>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/// Bytes of GEMM conversion workspace the calling thread holds (grow-only
/// until `gemm_release_workspace`). For the memory accounting.
inline std::size_t gemm_workspace_bytes() {
  return detail::gemm_workspace<float, 0>::bytes() + detail::gemm_workspace<float, 1>::bytes() +
         detail::gemm_workspace<float, 2>::bytes() + detail::gemm_workspace<double, 0>::bytes() +
         detail::gemm_workspace<double, 1>::bytes() + detail::gemm_workspace<double, 2>::bytes();
}

/// Frees the calling thread's GEMM conversion workspace.
inline void gemm_release_workspace() {
  detail::gemm_workspace<float, 0>::release();
  detail::gemm_workspace<float, 1>::release();
  detail::gemm_workspace<float, 2>::release();
  detail::gemm_workspace<double, 0>::release();
  detail::gemm_workspace<double, 1>::release();
  detail::gemm_workspace<double, 2>::release();
}

namespace detail {
template <class T, class G>
constexpr void check_linear_types() {
  static_assert(is_gemm_type_v<T>, "tessera::kernels::linear_*: T must be float, double, bf16 or fp16");
  static_assert(std::is_same_v<G, accum_t<T>>,
                "tessera::kernels::linear_*: the parameter-gradient type G must be accum_t<T> "
                "(double for double storage, float for float, bf16 and fp16)");
}
template <class T, class GA>
constexpr void check_activation_grad_type() {
  static_assert(std::is_same_v<GA, accum_t<T>> || (is_half_v<GA> && is_half_v<T>),
                "tessera::kernels::linear_*: the activation-gradient type must be accum_t<T>, or "
                "16-bit with 16-bit storage");
}
}  // namespace detail

/// Linear layer forward, no bias: out(M,N) = inp(M,K) * weight(N,K)^T.
/// `weight` is (out_features N, in_features K), as in PyTorch's nn.Linear.
/// T in {float, double, bf16}; accumulates in accum_t<T>, a bf16 out rounded
/// once. `out` is written (=) and must not alias the inputs. Throws as `gemm`.
/// FLOPs: gemm_flops(M, N, K). Source: llm.c matmul_forward.
template <class T>
void linear_forward(const host_context& ctx, T* out, const T* inp, const T* weight, std::int64_t M,
                    std::int64_t N, std::int64_t K) {
  (void)ctx;
  detail::check_linear_types<T, accum_t<T>>();
  const linear_gemm g = linear_forward_gemm(M, N, K);
  gemm<T>(g.ta, g.tb, g.M, g.N, g.K, accum_t<T>(g.alpha), inp, g.lda, weight, g.ldb,
          accum_t<T>(g.beta), out, g.ldc);
}

/// Linear layer backward to the input: dinp(M,K) = dout(M,N) * weight(N,K),
/// or += when `accumulate` (e.g. a residual branch). T the weight's storage
/// type, GA the activation-gradient type (accum_t<T>, or a 16-bit type with 16-bit
/// storage, computed in float and rounded once). `dinp` must not alias the
/// inputs. Throws as `gemm`. FLOPs: gemm_flops(M, K, N). Source: llm.c
/// matmul_backward.
template <class T, class GA>
void linear_backward_input(const host_context& ctx, GA* dinp, const GA* dout, const T* weight,
                           std::int64_t M, std::int64_t N, std::int64_t K,
                           bool accumulate = false) {
  (void)ctx;
  detail::check_activation_grad_type<T, GA>();
  using A = accum_t<T>;
  const linear_gemm g = linear_backward_input_gemm(M, N, K, accumulate);
  gemm(g.ta, g.tb, g.M, g.N, g.K, A(g.alpha), dout, g.lda, weight, g.ldb, A(g.beta), dinp, g.ldc);
}

/// Linear layer backward to the weight: dweight(N,K) += dout(M,N)^T * inp(M,K)
/// (parameter gradient: accumulates). T the input's storage type, GA the
/// activation-gradient type of dout, G = accum_t<T> the parameter-gradient
/// type. Reduction over M runs in G inside the BLAS (deterministic for a
/// fixed thread count). Throws as `gemm`. FLOPs: gemm_flops(N, K, M).
/// Source: llm.c matmul_backward.
template <class T, class GA, class G>
void linear_backward_weight(const host_context& ctx, G* dweight, const GA* dout, const T* inp,
                            std::int64_t M, std::int64_t N, std::int64_t K) {
  (void)ctx;
  detail::check_linear_types<T, G>();
  detail::check_activation_grad_type<T, GA>();
  const linear_gemm g = linear_backward_weight_gemm(M, N, K);
  gemm(g.ta, g.tb, g.M, g.N, g.K, G(g.alpha), dout, g.lda, inp, g.ldb, G(g.beta), dweight, g.ldc);
}

}  // namespace tessera::kernels
