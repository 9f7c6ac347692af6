#pragma once
/// \file kernels/cuda/gemm.cuh
/// GEMMs on the GPU through cuBLASLt, row-major, and the three linear-layer
/// products. Host code only (no kernels of ours): any C++ compiler may
/// include it with the CUDA headers; link tessera::cuda (cudart, cublasLt).
///
/// What each matmul computes (the row-major to column-major mapping, the
/// layouts, transposes and types) is decided by kernels/cuda/gemm_plan.hpp,
/// as plain values a host test interprets with a reference GEMM; this file
/// turns those values into cuBLASLt descriptors one for one and calls
/// cuBLASLt.
///
/// Precision: 16-bit (bf16 or fp16) or float operands, float32 accumulation
/// (CUBLAS_COMPUTE_32F, float alpha and beta), output of the operands'
/// 16-bit type (rounded once) or float32. Float operands compute in full
/// float32 (no TF32).
///
/// Gradient contract (llm.c): linear_backward_weight accumulates (beta = 1);
/// linear_backward_input writes (beta = 0) unless `accumulate`.

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <type_traits>

#include "tessera/core/cuda.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/gemm_plan.hpp"
#include "tessera/kernels/detail/gemm_args.hpp"

namespace tessera::kernels::cuda {

namespace detail {

/// The cudaDataType_t of an lt_dtype.
inline cudaDataType_t cuda_data_type_of(lt_dtype t) {
  switch (t) {
    case lt_dtype::bf16:
      return CUDA_R_16BF;
    case lt_dtype::f16:
      return CUDA_R_16F;
    case lt_dtype::e4m3:
      return CUDA_R_8F_E4M3;
    case lt_dtype::e5m2:
      return CUDA_R_8F_E5M2;
    case lt_dtype::f32:
      break;
  }
  return CUDA_R_32F;
}

/// Largest power of two <= 16 dividing the address (cuBLASLt's alignment preference).
inline std::uint32_t pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t r = 16;
  while (r > 1 && a % r) r /= 2;
  return r;
}

}  // namespace detail

/// A cuBLASLt handle, a device workspace, and a cache of matmul plans (the
/// descriptors and the heuristic's algorithm per shape, types, transposes
/// and pointer alignments), created once and reused by every GEMM.
/// Not thread-safe, and its workspace serves one stream at a time: give each
/// stream that runs GEMMs concurrently its own context.
class cublaslt_context {
 public:
  /// Creates the handle on the current device and takes `workspace_bytes`
  /// (default 32 MiB, NVIDIA's recommendation for Hopper) from `mr` (the
  /// current device's caching allocator by default, so it is counted).
  /// Throws cuda_error if cuBLASLt or the allocation fails.
  explicit cublaslt_context(std::size_t workspace_bytes = std::size_t(32) << 20,
                            memory_resource& mr = ::tessera::cuda::default_resource())
      : mr_(&mr), workspace_bytes_(workspace_bytes) {
    TESSERA_CUBLAS_CHECK(cublasLtCreate(&handle_));
    if (workspace_bytes_) {
      try {
        workspace_ = mr_->allocate(workspace_bytes_, 256);
      } catch (...) {
        cublasLtDestroy(handle_);
        throw;
      }
    }
  }
  cublaslt_context(const cublaslt_context&) = delete;
  cublaslt_context& operator=(const cublaslt_context&) = delete;
  ~cublaslt_context() {
    plans_.clear();
    if (workspace_) mr_->deallocate(workspace_, workspace_bytes_);
    if (handle_) cublasLtDestroy(handle_);
  }

  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  std::size_t workspace_bytes() const { return workspace_bytes_; }
  /// Number of distinct GEMM plans built so far (one heuristic query each).
  std::size_t cached_plans() const { return plans_.size(); }

  /// Row-major C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C on
  /// `stream`, as kernels::gemm on the host (same transposes and leading
  /// dimensions: op(A) is A stored M x K, lda >= K, or A^T stored K x M,
  /// lda >= M; likewise B; ldc >= N).
  /// - TAB (A and B) in {bf16, fp16, float}; TC is float, or TAB itself when
  ///   TAB is bf16 or fp16. Accumulation in float32; a 16-bit C is rounded
  ///   once.
  /// - beta == 0 does not read C. C must not alias A or B.
  /// - Throws config_error for M, N < 0, K < 1 (cuBLASLt has no k = 0
  ///   matmul), or a leading dimension below its rule; cuda_error naming the
  ///   call and status if cuBLASLt has no algorithm or fails.
  /// Nothing is synchronised.
  template <class TAB, class TC>
  void gemm(transpose ta, transpose tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
            const TAB* d_A, std::int64_t lda, const TAB* d_B, std::int64_t ldb, float beta, TC* d_C,
            std::int64_t ldc, cudaStream_t stream) {
    static_assert(std::is_same_v<TC, float> || (is_half_v<TC> && std::is_same_v<TC, TAB>),
                  "tessera::kernels::cuda::gemm: C must be float, or the operands' own 16-bit "
                  "type (cuBLASLt has no bf16 x bf16 -> fp16, fp16 x fp16 -> bf16 or a "
                  "float -> 16-bit matmul with a float32 compute type)");
    kernels::detail::check_gemm_args(ta, tb, M, N, K, lda, ldb, ldc);
    TESSERA_THROW_IF(K < 1, config_error, "gemm (cuda): K=", K,
                     " must be >= 1 (cuBLASLt has no k = 0 matmul)");
    if (M == 0 || N == 0) return;
    const plan& p = plan_for(
        row_major_matmul(ta, tb, M, N, K, lda, ldb, ldc, lt_dtype_of<TAB>(), lt_dtype_of<TC>()),
        d_A, d_B, d_C, {});
    // Column-major: D^T(N,M) = op(B)^T op(A)^T + beta C^T: our B is cuBLASLt's A.
    TESSERA_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, d_B, p.a_layout, d_A, p.b_layout,
                                        &beta, d_C, p.c_layout, d_C, p.c_layout, &p.algo,
                                        workspace_, workspace_bytes_, stream));
  }

  /// FP8 GEMM, row-major: C(M,N) = (*d_inv_scale_a) (*d_inv_scale_b)
  /// A(M,K) B(N,K)^T + beta C on `stream` (the linear forward's form; the
  /// only layout cuBLASLt's FP8 matmuls take: row_major_fp8_matmul).
  /// - TA, TB in {fp8_e4m3, fp8_e5m2}, not both E5M2; TC in {bf16, fp16,
  ///   float}; lda, ldb >= K; ldc >= N. The products of the FP8 values are
  ///   exact and accumulate in float32 (CUBLASLT_MATMUL_DESC_FAST_ACCUM off:
  ///   Hopper's fast accumulation keeps fewer bits), the sum is multiplied by
  ///   the two inverse scales (device floats, read when the matmul runs:
  ///   CUBLASLT_MATMUL_DESC_A_SCALE_POINTER and B_SCALE_POINTER), a 16-bit C
  ///   rounded once. This is kernels::fp8_round_trip's operands through the
  ///   float GEMM on the host, to float32 summation order.
  /// - d_amax_c: when not null, the device float receives max |C| of the
  ///   result (CUBLASLT_MATMUL_DESC_AMAX_D_POINTER), for the next cast's scale.
  /// - beta == 0 does not read C. C must not alias A or B.
  /// - Throws config_error as row_major_fp8_matmul (K, lda, ldb multiples of
  ///   16, types); cuda_error if cuBLASLt has no algorithm (an sm_80 GPU has
  ///   no FP8 tensor cores: FP8 needs sm_89 or sm_90) or fails.
  /// Nothing is synchronised. Source: the cuBLASLt documentation
  /// (cublasLtMatmul, FP8 requirements; cublasLtMatmulDescAttributes_t).
  template <class TA, class TB, class TC>
  void gemm_fp8(std::int64_t M, std::int64_t N, std::int64_t K, const TA* d_A, std::int64_t lda,
                const float* d_inv_scale_a, const TB* d_B, std::int64_t ldb,
                const float* d_inv_scale_b, float beta, TC* d_C, std::int64_t ldc,
                cudaStream_t stream, float* d_amax_c = nullptr) {
    static_assert(is_fp8_v<TA> && is_fp8_v<TB>, "gemm_fp8: A and B are fp8_e4m3 or fp8_e5m2");
    const lt_matmul lt = row_major_fp8_matmul(M, N, K, lda, ldb, ldc, lt_dtype_of<TA>(),
                                              lt_dtype_of<TB>(), lt_dtype_of<TC>());
    if (M == 0 || N == 0) return;
    // cuBLASLt's A is our B: its A scale is B's.
    const fp8_pointers ptrs{d_inv_scale_b, d_inv_scale_a, d_amax_c};
    const plan& p = plan_for(lt, d_A, d_B, d_C, ptrs);
    set_fp8_pointers(p.desc, ptrs);  // the descriptor is shared by every call of this shape
    const float alpha = 1.0f;
    TESSERA_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, d_B, p.a_layout, d_A, p.b_layout,
                                        &beta, d_C, p.c_layout, d_C, p.c_layout, &p.algo,
                                        workspace_, workspace_bytes_, stream));
  }

 private:
  // A matmul's descriptor values, its pointers' alignments (our A, B, C)
  // and whether it computes the output's amax.
  using plan_key = std::tuple<lt_matmul, std::uint32_t, std::uint32_t, std::uint32_t, bool>;
  // The device pointers of an FP8 matmul, as cuBLASLt names them (its A is our B).
  struct fp8_pointers {
    const float* a_scale = nullptr;
    const float* b_scale = nullptr;
    float* amax_d = nullptr;
  };
  struct plan {
    cublasLtMatmulDesc_t desc = nullptr;
    // cuBLASLt's A (our B), B (our A) and C = D, from lt_matmul.
    cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, c_layout = nullptr;
    cublasLtMatmulAlgo_t algo{};
    plan() = default;
    plan(const plan&) = delete;
    plan& operator=(const plan&) = delete;
    ~plan() {
      if (c_layout) cublasLtMatrixLayoutDestroy(c_layout);
      if (b_layout) cublasLtMatrixLayoutDestroy(b_layout);
      if (a_layout) cublasLtMatrixLayoutDestroy(a_layout);
      if (desc) cublasLtMatmulDescDestroy(desc);
    }
  };

  // The cached plan of `lt` at these pointers' alignments, built on first use.
  const plan& plan_for(const lt_matmul& lt, const void* d_A, const void* d_B, const void* d_C,
                       const fp8_pointers& ptrs) {
    const plan_key key{lt, detail::pointer_alignment(d_A), detail::pointer_alignment(d_B),
                       detail::pointer_alignment(d_C), ptrs.amax_d != nullptr};
    auto it = plans_.find(key);
    if (it == plans_.end()) it = plans_.emplace(key, make_plan(key, ptrs)).first;
    return *it->second;
  }

  static void set_fp8_pointers(cublasLtMatmulDesc_t desc, const fp8_pointers& ptrs) {
    auto set = [&](cublasLtMatmulDescAttributes_t a, const void* v) {
      TESSERA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, a, &v, sizeof(v)));
    };
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, ptrs.a_scale);
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, ptrs.b_scale);
    if (ptrs.amax_d) set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, ptrs.amax_d);
  }

  // The descriptors of key's matmul and the heuristic's algorithm; an FP8
  // matmul's with the first call's pointers (their presence picks the algorithm).
  std::unique_ptr<plan> make_plan(const plan_key& k, const fp8_pointers& ptrs) {
    const auto& [lt, al_a, al_b, al_c, amax] = k;
    const bool fp8 = lt.a.type == lt_dtype::e4m3 || lt.a.type == lt_dtype::e5m2;
    auto p = std::make_unique<plan>();
    TESSERA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = lt.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = lt.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    TESSERA_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    TESSERA_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (fp8) {  // full float32 accumulation (Hopper's fast accumulation keeps fewer bits)
      const std::int8_t fast_accum = 0;
      TESSERA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum)));
      set_fp8_pointers(p->desc, ptrs);
    }
    auto layout = [](cublasLtMatrixLayout_t* out, const lt_layout& l) {
      TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(out, detail::cuda_data_type_of(l.type),
                                                      static_cast<std::uint64_t>(l.rows),
                                                      static_cast<std::uint64_t>(l.cols), l.ld));
    };
    layout(&p->a_layout, lt.a);  // our B
    layout(&p->b_layout, lt.b);  // our A
    layout(&p->c_layout, lt.c);

    cublasLtMatmulPreference_t pref = nullptr;
    TESSERA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                    decltype(&cublasLtMatmulPreferenceDestroy)>
        pref_guard(pref, &cublasLtMatmulPreferenceDestroy);
    const std::size_t ws = workspace_bytes_;
    TESSERA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    TESSERA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_b, sizeof(al_b)));
    TESSERA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a, sizeof(al_a)));
    TESSERA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
    TESSERA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    TESSERA_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a_layout, p->b_layout,
                                                        p->c_layout, p->c_layout, pref, 1, &result,
                                                        &found));
    if (found == 0)
      throw cuda_error(
          ::tessera::detail::str(
              fp8 ? "fp8 gemm (cuda)" : "gemm (cuda)", ": cuBLASLt found no algorithm for M=",
              lt.n, " N=", lt.m, " K=", lt.k, " lda=", lt.b.ld, " ldb=", lt.a.ld, " ldc=", lt.c.ld,
              " A ", lt_dtype_name(lt.b.type), ", B ", lt_dtype_name(lt.a.type), ", C ",
              lt_dtype_name(lt.c.type), ", alignments ", al_a, "/", al_b, "/", al_c, " bytes",
              fp8 ? " (FP8 matmuls need an sm_89 or sm_90 GPU)" : "", amax ? ", with amax" : ""),
          static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED));
    p->algo = result.algo;
    return p;
  }

  cublasLtHandle_t handle_ = nullptr;
  memory_resource* mr_;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_;
  std::map<plan_key, std::unique_ptr<plan>> plans_;
};

/// Linear forward, no bias: out(M,N) = inp(M,K) * weight(N,K)^T (weight as
/// PyTorch's nn.Linear: out_features x in_features). T (bf16 or fp16)
/// operands, float32 accumulation, TC in {T, float}; out is written. Throws
/// as cublaslt_context::gemm. FLOPs: gemm_flops(M, N, K). Source: llm.c
/// matmul_forward.
template <class TC, class T>
void linear_forward(cublaslt_context& ctx, TC* d_out, const T* d_inp, const T* d_weight,
                    std::int64_t M, std::int64_t N, std::int64_t K, cudaStream_t stream) {
  const linear_gemm g = linear_forward_gemm(M, N, K);
  ctx.gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, d_inp, g.lda, d_weight, g.ldb, g.beta, d_out, g.ldc,
           stream);
}

/// Linear backward to the input: dinp(M,K) = dout(M,N) * weight(N,K), written
/// (or added, beta = 1, when `accumulate`). T (bf16 or fp16) operands, TC
/// in {T, float}. Throws as cublaslt_context::gemm. FLOPs: gemm_flops(M, K, N).
template <class TC, class T>
void linear_backward_input(cublaslt_context& ctx, TC* d_dinp, const T* d_dout, const T* d_weight,
                           std::int64_t M, std::int64_t N, std::int64_t K, cudaStream_t stream,
                           bool accumulate = false) {
  const linear_gemm g = linear_backward_input_gemm(M, N, K, accumulate);
  ctx.gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, d_dout, g.lda, d_weight, g.ldb, g.beta, d_dinp,
           g.ldc, stream);
}

/// Linear backward to the weight: dweight(N,K) += dout(M,N)^T * inp(M,K)
/// (parameter gradient: accumulates, beta = 1), float32 dweight, T (bf16 or
/// fp16) operands, the reduction over M in float32 inside cuBLASLt. Throws
/// as cublaslt_context::gemm. FLOPs: gemm_flops(N, K, M).
template <class T>
void linear_backward_weight(cublaslt_context& ctx, float* d_dweight, const T* d_dout,
                            const T* d_inp, std::int64_t M, std::int64_t N, std::int64_t K,
                            cudaStream_t stream) {
  const linear_gemm g = linear_backward_weight_gemm(M, N, K);
  ctx.gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, d_dout, g.lda, d_inp, g.ldb, g.beta, d_dweight,
           g.ldc, stream);
}

}  // namespace tessera::kernels::cuda
