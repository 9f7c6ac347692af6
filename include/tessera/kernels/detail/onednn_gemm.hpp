#pragma once
/// \file kernels/detail/onednn_gemm.hpp
/// bf16 x bf16 host GEMMs through oneDNN's matmul primitive, where the CPU
/// has native bf16 dot products (AVX-512 BF16's vdpbf16ps, or AMX); and
/// the small float GEMMs with an untransposed A through oneDNN's sgemm
/// (onednn_sgemm, below), where it was measured faster than OpenBLAS.
///
/// Why: OpenBLAS (Debian's 0.3.21) has no bf16 GEMM, so without this a
/// bf16 GEMM converts both operands to float and runs sgemm. oneDNN (the
/// library PyTorch's CPU bf16 matmuls run on) multiplies the bf16 operands
/// directly at twice the fp32 FMA rate and reads half the bytes: on two
/// Zen 5 cores, M 2048, N 384, K 128 ran at 605 GFLOP/s against 180 for
/// convert + sgemm (benchmarks/RESULTS.md).
///
/// Numerics: every product of two bf16 values is exact in float; oneDNN
/// sums them in float (vdpbf16ps adds the two products of a pair in turn,
/// with round-to-nearest-even and denormals flushed to zero), and a bf16 C
/// is rounded once at the store, as on the convert + sgemm path. The order
/// of the float additions is oneDNN's blocking, not OpenBLAS's, so results
/// differ from that path in the last bits; for a fixed thread count a call
/// is deterministic (brgemm, no atomics).
///
/// Built in when CMake finds oneDNN (`TESSERA_HAS_ONEDNN`, Debian's
/// libdnnl-dev); `onednn_bf16_gemm` returns false and does nothing when it
/// is not, when this CPU has no native bf16 kernel (oneDNN would emulate),
/// for alpha != 1, and for K = 0, so the caller falls back to convert +
/// sgemm. Primitives are cached per calling thread by shape, leading
/// dimensions, transposes, beta and OpenMP thread count (oneDNN blocks for
/// the thread count at creation); their scratchpad is a per-thread
/// grow-only buffer, so a steady-state step allocates nothing.

#include <atomic>
#include <cstdint>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/detail/gemm_args.hpp"

// nvcc's front end cannot parse oneDNN's C++ header (an internal error in
// EDG), and CUDA translation units run no host bf16 GEMM: they see the
// fallback, with internal linkage so that it never meets the g++
// translation units' definitions of the same functions.
#if defined(TESSERA_HAS_ONEDNN) && !defined(__CUDACC__)
#define TESSERA_ONEDNN_GEMM 1
#define TESSERA_ONEDNN_LINKAGE inline
#else
#define TESSERA_ONEDNN_GEMM 0
#if defined(TESSERA_HAS_ONEDNN)
#define TESSERA_ONEDNN_LINKAGE static inline
#else
#define TESSERA_ONEDNN_LINKAGE inline
#endif
#endif

#if TESSERA_ONEDNN_GEMM
#include <omp.h>

#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <type_traits>
#endif

namespace tessera::kernels::detail {

#if TESSERA_ONEDNN_GEMM

/// One cached matmul: the primitive (empty when oneDNN has no native bf16
/// kernel for the key), its operands' memory objects (the data handles are
/// set per call) and its scratchpad size.
struct onednn_matmul {
  dnnl::matmul prim;
  dnnl::memory a, b, c, scratch;
  std::size_t scratch_bytes = 0;
  bool native = false;
};

/// The calling thread's engine, stream, primitive cache and scratchpad.
struct onednn_state {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  using key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::int64_t, int, int, float, int, int>;
  std::map<key, onednn_matmul> cache;
  std::unique_ptr<unsigned char[]> scratch;
  std::size_t scratch_capacity = 0;

  static onednn_state& get() {
    thread_local onednn_state s;
    return s;
  }
  unsigned char* scratchpad(std::size_t n) {
    if (scratch_capacity < n) {
      scratch.reset(new unsigned char[n]);
      scratch_capacity = n;
    }
    return scratch.get();
  }
};

/// Whether oneDNN's implementation string names a native bf16 kernel
/// ("brg:avx512_core_bf16", "brg:avx512_core_amx", ...), not an emulation.
inline bool onednn_impl_is_native_bf16(const std::string& impl) {
  return impl.find("bf16") != std::string::npos || impl.find("amx") != std::string::npos;
}

/// Builds the matmul for one key. C's type is `c_type` (f32 or bf16).
inline onednn_matmul onednn_make_matmul(onednn_state& st, transpose ta, transpose tb,
                                        std::int64_t M, std::int64_t N, std::int64_t K,
                                        std::int64_t lda, std::int64_t ldb, std::int64_t ldc,
                                        float beta, dnnl::memory::data_type c_type) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dims a_strides = ta == transpose::no ? dims{lda, 1} : dims{1, lda};
  const dims b_strides = tb == transpose::no ? dims{ldb, 1} : dims{1, ldb};
  const dnnl::memory::desc a_md({M, K}, dt::bf16, a_strides);
  const dnnl::memory::desc b_md({K, N}, dt::bf16, b_strides);
  const dnnl::memory::desc c_md({M, N}, c_type, dims{ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  onednn_matmul m;
  dnnl::matmul::primitive_desc pd;
  try {
#if DNNL_VERSION_MAJOR >= 3
    pd = dnnl::matmul::primitive_desc(st.eng, a_md, b_md, c_md, attr);
#else
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, st.eng);
#endif
  } catch (const dnnl::error&) {
    return m;  // no implementation for these strides: convert + sgemm
  }
  m.native = onednn_impl_is_native_bf16(pd.impl_info_str());
  if (!m.native) return m;
  m.prim = dnnl::matmul(pd);
  m.a = dnnl::memory(a_md, st.eng, DNNL_MEMORY_NONE);
  m.b = dnnl::memory(b_md, st.eng, DNNL_MEMORY_NONE);
  m.c = dnnl::memory(c_md, st.eng, DNNL_MEMORY_NONE);
  m.scratch_bytes = pd.scratchpad_desc().get_size();
  m.scratch = dnnl::memory(pd.scratchpad_desc(), st.eng, DNNL_MEMORY_NONE);
  return m;
}

#endif  // TESSERA_ONEDNN_GEMM

/// Whether bf16 x bf16 GEMMs may use oneDNN (default true; the
/// benchmarks turn it off to time convert + sgemm in the same run). Not
/// for use while GEMMs run on other threads.
TESSERA_ONEDNN_LINKAGE std::atomic<bool>& onednn_bf16_allowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}

/// C(M,N) = op(A)(M,K) op(B)(K,N) + beta C with bf16 A and B and a float
/// or bf16 C (row-major, leading dimensions and transposes as kernels::gemm)
/// through oneDNN. Returns false, having done nothing, when oneDNN is not
/// built in or not allowed (onednn_bf16_allowed), the CPU has no native
/// bf16 kernel, alpha != 1 or K = 0. The
/// caller has checked the arguments (check_gemm_args). A shape oneDNN has
/// no primitive for also returns false. Throws tessera::error naming the
/// oneDNN status when a primitive fails to run.
template <class TC>
TESSERA_ONEDNN_LINKAGE bool onednn_bf16_gemm(transpose ta, transpose tb, std::int64_t M, std::int64_t N, std::int64_t K,
                      float alpha, const bf16* A, std::int64_t lda, const bf16* B,
                      std::int64_t ldb, float beta, TC* C, std::int64_t ldc) {
#if TESSERA_ONEDNN_GEMM
  static_assert(std::is_same_v<TC, float> || std::is_same_v<TC, bf16>);
  if (alpha != 1.0f || K == 0 || !onednn_bf16_allowed()) return false;
  using dt = dnnl::memory::data_type;
  constexpr dt c_type = std::is_same_v<TC, float> ? dt::f32 : dt::bf16;
  onednn_state& st = onednn_state::get();
  const onednn_state::key k{M, N, K, lda, ldb, ldc, static_cast<int>(ta), static_cast<int>(tb),
                            beta, static_cast<int>(c_type), omp_get_max_threads()};
  auto it = st.cache.find(k);
  if (it == st.cache.end())
    it = st.cache.emplace(k, onednn_make_matmul(st, ta, tb, M, N, K, lda, ldb, ldc, beta, c_type))
             .first;
  onednn_matmul& m = it->second;
  if (!m.native) return false;
  m.a.set_data_handle(const_cast<bf16*>(A));
  m.b.set_data_handle(const_cast<bf16*>(B));
  m.c.set_data_handle(C);
  m.scratch.set_data_handle(st.scratchpad(m.scratch_bytes > 0 ? m.scratch_bytes : 1));
  try {
    m.prim.execute(st.strm, {{DNNL_ARG_SRC, m.a},
                             {DNNL_ARG_WEIGHTS, m.b},
                             {DNNL_ARG_DST, m.c},
                             {DNNL_ARG_SCRATCHPAD, m.scratch}});
    st.strm.wait();
  } catch (const dnnl::error& e) {
    throw error("oneDNN matmul M=" + std::to_string(M) + " N=" + std::to_string(N) +
                " K=" + std::to_string(K) + " failed: " + e.what() + " (status " +
                std::to_string(static_cast<int>(e.status)) + ")");
  }
  return true;
#else
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B;
  (void)ldb, (void)beta, (void)C, (void)ldc;
  return false;
#endif
}

/// Whether float GEMMs with an untransposed A may use oneDNN's sgemm
/// (default true; the benchmarks turn it off to time OpenBLAS alone in the
/// same run). Not for use while GEMMs run on other threads.
TESSERA_ONEDNN_LINKAGE std::atomic<bool>& onednn_sgemm_allowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}

/// The largest op(B) (N x K elements, the weight of a linear layer) for
/// which float GEMMs go to oneDNN: measured on two Zen 3 cores, oneDNN ran
/// M 2048 with N x K of 128 x 128 to 384 x 128 at 179-192 GFLOP/s against
/// OpenBLAS's 157-172 (its jit kernels write C in the first pass over K,
/// where OpenBLAS first scales C by beta in a pass of its own), but from
/// 512 x 512 up (and at every llama2_7b shape) 1-15% slower.
inline constexpr std::int64_t onednn_sgemm_max_weight = 1 << 17;

/// C(M,N) = alpha A(M,K) op(B)(K,N) + beta C in float through oneDNN's
/// sgemm (dnnl_sgemm, row-major) when op(B) has at most
/// onednn_sgemm_max_weight elements. Only op(A) = A: with A transposed
/// (the weight gradients, K = the tokens) OpenBLAS was faster at every
/// shape tried (127-153 GFLOP/s against 160-177 at the small preset's).
/// Returns false, having done nothing, when oneDNN is not built in or not
/// allowed, for a larger op(B), or for an empty product (M, N or K = 0).
/// Deterministic for a fixed thread count; the order of the additions is
/// oneDNN's blocking. Throws tessera::error naming the status when oneDNN
/// fails. Figures: benchmarks/RESULTS.md (host_bench's "OpenBLAS" rows).
TESSERA_ONEDNN_LINKAGE bool onednn_sgemm(transpose tb, std::int64_t M, std::int64_t N,
                                         std::int64_t K, float alpha, const float* A,
                                         std::int64_t lda, const float* B, std::int64_t ldb,
                                         float beta, float* C, std::int64_t ldc) {
#if TESSERA_ONEDNN_GEMM
  if (M == 0 || N == 0 || K == 0 || N * K > onednn_sgemm_max_weight || !onednn_sgemm_allowed())
    return false;
  const dnnl_status_t st = dnnl_sgemm('N', tb == transpose::no ? 'N' : 'T', M, N, K, alpha, A,
                                      lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success)
    throw error("oneDNN sgemm M=" + std::to_string(M) + " N=" + std::to_string(N) +
                " K=" + std::to_string(K) + " failed with status " +
                std::to_string(static_cast<int>(st)));
  return true;
#else
  (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb;
  (void)beta, (void)C, (void)ldc;
  return false;
#endif
}

/// How this build runs a float GEMM: "oneDNN sgemm (op(A) = A, N K <=
/// 131072), else OpenBLAS" or "OpenBLAS" (no oneDNN, or not allowed).
TESSERA_ONEDNN_LINKAGE std::string sgemm_engine() {
#if TESSERA_ONEDNN_GEMM
  if (onednn_sgemm_allowed())
    return "oneDNN sgemm (op(A) = A, N K <= " + std::to_string(onednn_sgemm_max_weight) +
           "), else OpenBLAS";
#endif
  return "OpenBLAS";
}

/// How this build runs a bf16 x bf16 GEMM on this CPU: "oneDNN <impl>"
/// (e.g. "oneDNN brg:avx512_core_bf16") or "convert + sgemm". Probes one
/// small matmul on the first call. A CPU without any bf16 matmul in oneDNN
/// (AVX2 only: oneDNN then has no implementation at all and throws) gets
/// "convert + sgemm".
TESSERA_ONEDNN_LINKAGE std::string bf16_gemm_engine() {
#if TESSERA_ONEDNN_GEMM
  static const std::string name = []() -> std::string {
    try {
      onednn_state& st = onednn_state::get();
      using dt = dnnl::memory::data_type;
      const dnnl::memory::desc a_md({64, 64}, dt::bf16, dnnl::memory::dims{64, 1});
      const dnnl::memory::desc c_md({64, 64}, dt::f32, dnnl::memory::dims{64, 1});
#if DNNL_VERSION_MAJOR >= 3
      dnnl::matmul::primitive_desc pd(st.eng, a_md, a_md, c_md);
#else
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, a_md, c_md), st.eng);
#endif
      const std::string impl = pd.impl_info_str();
      return onednn_impl_is_native_bf16(impl) ? "oneDNN " + impl : std::string("convert + sgemm");
    } catch (const dnnl::error&) {
      return "convert + sgemm";
    }
  }();
  return name;
#else
  return "convert + sgemm";
#endif
}

/// Whether bf16 x bf16 GEMMs run on oneDNN's native bf16 kernels here
/// (bf16_gemm_engine() is not "convert + sgemm").
TESSERA_ONEDNN_LINKAGE bool bf16_gemm_native() { return bf16_gemm_engine() != "convert + sgemm"; }

/// Bytes of oneDNN scratchpad the calling thread holds (grow-only).
TESSERA_ONEDNN_LINKAGE std::size_t onednn_workspace_bytes() {
#if TESSERA_ONEDNN_GEMM
  return onednn_state::get().scratch_capacity;
#else
  return 0;
#endif
}

}  // namespace tessera::kernels::detail
