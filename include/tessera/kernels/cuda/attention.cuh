#pragma once
/// \file kernels/cuda/attention.cuh
/// Causal flash attention kernels with grouped-query heads (declared and
/// documented in kernels/cuda/attention.hpp; launch configurations, tile
/// shapes and fragment layouts in kernels/cuda/attention_launch.hpp).
///
/// Design (FlashAttention-2, Dao 2023):
/// - Every kernel runs 8 warps; a warp owns a 16-row slice of the block's
///   query (or key) tile and computes on 16-bit tensor cores with
///   `mma.sync.m16n8k16` (float32 accumulators in registers; its bf16 form
///   for bf16 storage, its f16 form for fp16, the storage type being
///   `Ops::storage`), loading its
///   operands from shared memory with `ldmatrix` (`.trans` for the operands
///   stored k-major). Global -> shared copies are 16-byte `cp.async`, with the
///   next tile's copy in flight while the current one is computed (double
///   buffers). Rows past S are zero-filled by the copy and never stored.
/// - Forward: per key tile, S = Q K^T (Q's fragments stay in registers), the
///   online softmax in float32 (kernels::detail::online_softmax_rescale and
///   attention_prob, the host's functions), P rounded to the storage type and reused
///   in registers as the A operand of O += P V (the C fragments of two
///   adjacent n-tiles are the A fragment of one k-step). Key tiles wholly above
///   a warp's diagonal are skipped; the mask is applied only on tiles that
///   cross it. out and lse are written at the end.
/// - Backward: D = rowsum(dO * O) (float32, scratch); dK, dV per key tile (a
///   block walks every query tile of every query head of its GQA group, in a
///   fixed order, accumulating in registers); dQ per query tile. P and dS are
///   recomputed in both passes from lse; no atomics.
///
/// The block bodies (attention_*_block) are C++ templates over `Ops`, the
/// warp-level primitives: attention_device_ops (PTX, below, nvcc only) on the
/// GPU; the host test tests/kernels/cuda_attention_launch.cpp runs the same
/// bodies under a warp emulator. So this header compiles with a plain C++
/// compiler too: everything that needs nvcc is under `__CUDACC__`, with the
/// launchers of attention.hpp at the end (header-only under nvcc, or
/// compiled once into tessera::cuda_kernels by cuda/kernels_attention.cu:
/// kernels/cuda/linkage.hpp).
///
/// Blocks of context-parallel (ring) attention (kernels::attention_span):
/// the forward, dK/dV and dQ bodies are templates over attention_form too.
/// `causal` is single-rank attention (queries and keys the same S rows, 16-bit
/// outputs), the code and registers it always had; `block` takes the queries
/// at global q0.., the Sk keys at k0.., masks keys past Sk (a tile wholly in
/// the past has no causal mask left to hide them), skips key tiles after a
/// query tile's last query, and writes float32 outputs (the forward's
/// partial out, dK, dV, and dQ written or accumulated) so that a ring merges
/// and sums them unrounded. attention_merge_out/_lse (attention_merge.cuh,
/// block.hpp bodies) combine the partial outputs by log-sum-exp.
///
/// Gradient contract (llm.c): no parameters; dq, dk, dv are written (`=`);
/// a ring block may accumulate dq (`+=`, kernels::attention_dq).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/attention_launch.hpp"
#include "tessera/kernels/cuda/attention_merge.cuh"
#include "tessera/kernels/detail/attention.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include "tessera/core/cuda.hpp"
#include "tessera/kernels/cuda/attention.hpp"
#define TESSERA_ATTENTION_FN __device__ __forceinline__
#define TESSERA_ATTENTION_UNROLL _Pragma("unroll")
#define TESSERA_ATTENTION_NO_UNROLL _Pragma("unroll 1")
#else
#define TESSERA_ATTENTION_FN inline
#define TESSERA_ATTENTION_UNROLL
#define TESSERA_ATTENTION_NO_UNROLL
#endif

namespace tessera::kernels::cuda::detail {

/// Which code a flash attention body compiles to: `causal`, single-rank
/// attention (q0 = k0 = 0, Sk = S, 16-bit outputs: what the kernels always
/// were, with the same registers), or `block`, one block of ring attention
/// (the offsets and Sk of the params, float32 outputs). A template
/// parameter, so the plain kernel carries none of the block's arithmetic.
enum class attention_form { causal, block };

/// Arguments of the forward kernel (the 16-bit storage type as raw bits).
struct attention_forward_params {
  std::uint16_t* out;             // (B, S, nh, hd)
  float* lse;                     // (B, nh, S)
  const std::uint16_t* q;         // (B, S, nh, hd)
  const std::uint16_t* k;         // (B, S, nkv, hd); (B, Sk, nkv, hd) for a block
  const std::uint16_t* v;         // (B, S, nkv, hd); (B, Sk, nkv, hd) for a block
  const std::int32_t* doc_start;  // (B, S) or null: kernels::attention_mask
  std::int64_t S;
  int nh;
  int nkv;
  float scale;  // 1 / sqrt(hd)
};

/// Arguments of the backward kernels (the 16-bit storage type as raw bits).
struct attention_backward_params {
  std::uint16_t* dq;          // (B, S, nh, hd)
  std::uint16_t* dk;          // (B, S, nkv, hd)
  std::uint16_t* dv;          // (B, S, nkv, hd)
  const std::uint16_t* dout;  // (B, S, nh, hd)
  const std::uint16_t* q;
  const std::uint16_t* k;         // (B, S, nkv, hd); (B, Sk, nkv, hd) for a block
  const std::uint16_t* v;         // (B, S, nkv, hd); (B, Sk, nkv, hd) for a block
  const std::uint16_t* out;       // (B, S, nh, hd); the final (merged) one for a block
  const float* lse;               // (B, nh, S); likewise
  float* d;                       // (B, nh, S): rowsum(dout * out), the scratch
  const std::int32_t* doc_start;  // (B, S) or null: kernels::attention_mask
  std::int64_t rows;              // B S nh
  std::int64_t S;
  int nh;
  int nkv;
  float scale;
};

/// Where a ring block's queries and keys sit (kernels::attention_span, Sk
/// resolved).
struct attention_block_span {
  std::int64_t Sk;  // key/value rows
  std::int64_t q0;  // global position of query row 0
  std::int64_t k0;  // global position of key row 0
};

/// Arguments of the forward kernel's block form: the causal form's (`out`
/// null) and the span, with a float32 output. Its own type, so the causal
/// kernels' parameters stay what they were (ptxas allocates registers
/// differently for a larger parameter block: 245 -> 255 at hd 128 on sm_80
/// in the dK/dV kernel, for fields it never reads).
struct attention_forward_block_params : attention_forward_params {
  float* out_f32;  // (B, S, nh, hd) float32: the block's partial output
  attention_block_span span;
};

/// Arguments of the backward kernels' block form: the causal form's (dq,
/// dk, dv null), the span, and float32 outputs.
struct attention_backward_block_params : attention_backward_params {
  float* dq_f32;  // (B, S, nh, hd) float32, written or (dq_accumulate) added to
  float* dk_f32;  // (B, Sk, nkv, hd) float32, written
  float* dv_f32;  // (B, Sk, nkv, hd) float32, written
  attention_block_span span;
  int dq_accumulate;  // 1: kernels::attention_dq::accumulate
};

/// The parameters of a form's kernels: the causal struct, or the block's.
template <attention_form Form>
using attention_forward_params_t =
    std::conditional_t<Form == attention_form::block, attention_forward_block_params,
                       attention_forward_params>;
template <attention_form Form>
using attention_backward_params_t =
    std::conditional_t<Form == attention_form::block, attention_backward_block_params,
                       attention_backward_params>;

/// The key rows of a call, the offset delta (query row t sees key rows
/// s <= t + delta) and the global position of key row 0 (kpos): S, 0, 0 for
/// the causal form's parameters, constants after inlining.
struct attention_geometry {
  std::int64_t Sk;
  std::int64_t delta;
  std::int64_t kpos;
};
TESSERA_HOST_DEVICE inline attention_geometry attention_geometry_of(
    const attention_forward_params& p) {
  return {p.S, 0, 0};
}
TESSERA_HOST_DEVICE inline attention_geometry attention_geometry_of(
    const attention_backward_params& p) {
  return {p.S, 0, 0};
}
TESSERA_HOST_DEVICE inline attention_geometry attention_geometry_of(
    const attention_forward_block_params& p) {
  return {p.span.Sk, p.span.q0 - p.span.k0, p.span.k0};
}
TESSERA_HOST_DEVICE inline attention_geometry attention_geometry_of(
    const attention_backward_block_params& p) {
  return {p.span.Sk, p.span.q0 - p.span.k0, p.span.k0};
}

/// flash_attention_forward's checks (attention_check_args; 16-byte aligned
/// 16-bit tensors, 4-byte aligned lse) and its kernel arguments, over the
/// tensors' raw 16-bit (bf16 or fp16) bits: out, q (B, S, nh, hd), k, v (B, S, nkv, hd),
/// lse (B, nh, S) float32, doc_start (B, S) int32 or null (the document
/// mask, kernels::attention_mask; 4-byte aligned). The entry point packs its
/// arguments here, and the emulated test of the block bodies through the
/// same function. Throws config_error naming the argument and the limit.
inline attention_forward_params attention_forward_args(
    std::uint16_t* out, float* lse, const std::uint16_t* q, const std::uint16_t* k,
    const std::uint16_t* v, std::int64_t B, std::int64_t S, std::int64_t nh, std::int64_t nkv,
    std::int64_t hd, const std::int32_t* doc_start = nullptr) {
  constexpr const char* fn = "flash_attention_forward";
  attention_check_args(fn, B, S, nh, nkv, hd);
  for (const auto& [name, ptr] :
       {std::pair<const char*, const void*>{"d_out", out}, {"d_q", q}, {"d_k", k}, {"d_v", v}})
    attention_check_aligned(fn, name, ptr, 16);
  attention_check_aligned(fn, "d_lse", lse, sizeof(float));
  if (doc_start != nullptr)  // null: no document mask
    attention_check_aligned(fn, "d_doc_start", doc_start, sizeof(std::int32_t));
  attention_forward_params p{};
  p.out = out;
  p.lse = lse;
  p.q = q;
  p.k = k;
  p.v = v;
  p.doc_start = doc_start;
  p.S = S;
  p.nh = static_cast<int>(nh);
  p.nkv = static_cast<int>(nkv);
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  return p;
}

/// The arguments of one block of ring attention's forward (the block form):
/// as attention_forward_args, with `span` (kernels::attention_span:
/// attention_check_span) and a float32 `out` (B, S, nh, hd), 4-byte
/// aligned, for attention_merge; k, v are (B, Sk, nkv, hd). Throws
/// config_error naming the argument and the limit.
inline attention_forward_block_params attention_forward_block_args(
    float* out, float* lse, const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
    std::int64_t B, std::int64_t S, std::int64_t nh, std::int64_t nkv, std::int64_t hd,
    const std::int32_t* doc_start, kernels::attention_span span) {
  constexpr const char* fn = "flash_attention_forward (block)";
  const std::int64_t Sk = attention_check_span(fn, S, span);
  attention_check_args(fn, B, S, nh, nkv, hd);
  for (const auto& [name, ptr] :
       {std::pair<const char*, const void*>{"d_q", q}, {"d_k", k}, {"d_v", v}})
    attention_check_aligned(fn, name, ptr, 16);
  attention_check_aligned(fn, "d_out", out, sizeof(float));
  attention_check_aligned(fn, "d_lse", lse, sizeof(float));
  if (doc_start != nullptr)
    attention_check_aligned(fn, "d_doc_start", doc_start, sizeof(std::int32_t));
  attention_forward_block_params p{};
  p.out = nullptr;
  p.out_f32 = out;
  p.lse = lse;
  p.q = q;
  p.k = k;
  p.v = v;
  p.doc_start = doc_start;
  p.S = S;
  p.span = {Sk, span.q0, span.k0};
  p.nh = static_cast<int>(nh);
  p.nkv = static_cast<int>(nkv);
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  return p;
}

/// flash_attention_backward's checks (as the forward's, the 4-byte aligned
/// scratch of attention_backward_d_config(...).scratch_bytes at least) and
/// its kernel arguments, over raw 16-bit bits: dq, dout, out, q (B, S, nh,
/// hd), dk, dv, k, v (B, S, nkv, hd), lse (B, nh, S) float32, scratch
/// B nh S floats, doc_start as the forward's; shared with the emulated test
/// as the forward's. Throws config_error naming the argument and the limit.
inline attention_backward_params attention_backward_args(
    std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv, const std::uint16_t* dout,
    const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
    const std::uint16_t* out, const float* lse, std::int64_t B, std::int64_t S, std::int64_t nh,
    std::int64_t nkv, std::int64_t hd, void* scratch, std::size_t scratch_bytes,
    const std::int32_t* doc_start = nullptr) {
  constexpr const char* fn = "flash_attention_backward";
  attention_check_args(fn, B, S, nh, nkv, hd);
  for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"d_dq", dq},
                                  {"d_dk", dk},
                                  {"d_dv", dv},
                                  {"d_dout", dout},
                                  {"d_q", q},
                                  {"d_k", k},
                                  {"d_v", v},
                                  {"d_out", out}})
    attention_check_aligned(fn, name, ptr, 16);
  attention_check_aligned(fn, "d_lse", lse, sizeof(float));
  attention_check_aligned(fn, "d_scratch", scratch, sizeof(float));
  if (doc_start != nullptr)  // null: no document mask
    attention_check_aligned(fn, "d_doc_start", doc_start, sizeof(std::int32_t));
  const launch_config cd = attention_backward_d_config(B, S, nh, nkv, hd);
  TESSERA_THROW_IF(scratch_bytes < cd.scratch_bytes, config_error, fn,
                   ": scratch_bytes=", scratch_bytes, " is below the ", cd.scratch_bytes,
                   " bytes needed (flash_attention_backward_scratch_bytes: B*nh*S floats for D)");
  attention_backward_params p{};
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.dout = dout;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.lse = lse;
  p.d = static_cast<float*>(scratch);
  p.doc_start = doc_start;
  p.rows = B * S * nh;
  p.S = S;
  p.nh = static_cast<int>(nh);
  p.nkv = static_cast<int>(nkv);
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  return p;
}

/// The arguments of one block of ring attention's backward (the block
/// form): as attention_backward_args, with `span` (attention_check_span),
/// the final (merged) out and lse, float32 dq (B, S, nh, hd) written or,
/// with kernels::attention_dq::accumulate, added to, and float32 dk, dv
/// (B, Sk, nkv, hd) written; the float pointers 4-byte aligned. Throws
/// config_error naming the argument and the limit.
inline attention_backward_block_params attention_backward_block_args(
    float* dq, float* dk, float* dv, const std::uint16_t* dout, const std::uint16_t* q,
    const std::uint16_t* k, const std::uint16_t* v, const std::uint16_t* out, const float* lse,
    std::int64_t B, std::int64_t S, std::int64_t nh, std::int64_t nkv, std::int64_t hd,
    void* scratch, std::size_t scratch_bytes, const std::int32_t* doc_start,
    kernels::attention_span span, kernels::attention_dq dq_mode) {
  constexpr const char* fn = "flash_attention_backward (block)";
  const std::int64_t Sk = attention_check_span(fn, S, span);
  attention_check_args(fn, B, S, nh, nkv, hd);
  for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"d_dout", dout},
                                  {"d_q", q},
                                  {"d_k", k},
                                  {"d_v", v},
                                  {"d_out", out}})
    attention_check_aligned(fn, name, ptr, 16);
  for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"d_dq", dq},
                                  {"d_dk", dk},
                                  {"d_dv", dv},
                                  {"d_lse", lse},
                                  {"d_scratch", scratch}})
    attention_check_aligned(fn, name, ptr, sizeof(float));
  if (doc_start != nullptr)
    attention_check_aligned(fn, "d_doc_start", doc_start, sizeof(std::int32_t));
  const launch_config cd = attention_backward_d_config(B, S, nh, nkv, hd);
  TESSERA_THROW_IF(scratch_bytes < cd.scratch_bytes, config_error, fn,
                   ": scratch_bytes=", scratch_bytes, " is below the ", cd.scratch_bytes,
                   " bytes needed (flash_attention_backward_scratch_bytes: B*nh*S floats for D)");
  attention_backward_block_params p{};
  p.dq = p.dk = p.dv = nullptr;
  p.dq_f32 = dq;
  p.dk_f32 = dk;
  p.dv_f32 = dv;
  p.dout = dout;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.lse = lse;
  p.d = static_cast<float*>(scratch);
  p.doc_start = doc_start;
  p.rows = B * S * nh;
  p.S = S;
  p.span = {Sk, span.q0, span.k0};
  p.nh = static_cast<int>(nh);
  p.nkv = static_cast<int>(nkv);
  p.dq_accumulate = dq_mode == kernels::attention_dq::accumulate ? 1 : 0;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  return p;
}

/// 16 bytes of global memory as one access.
struct alignas(16) attention_vec16 {
  std::uint32_t w[4];
};

using mma_m16n8k16::c_coord;

/// Shared-window byte address of `member` of the shared storage `sm`, given
/// `s0`, the address of `sm`. The loops pass s0 through Ops::opaque once per
/// iteration, so tile offsets fold into the instructions' immediates.
template <class Storage, class T>
TESSERA_ATTENTION_FN std::uint32_t attention_smem_addr(std::uint32_t s0, const Storage& sm,
                                                       const T* member) {
  return s0 + static_cast<std::uint32_t>(reinterpret_cast<const char*>(member) -
                                         reinterpret_cast<const char*>(&sm));
}

/// Element offset in a swizzled (., HD) shared tile of the 16-byte chunk `c`
/// (row, chunk index) names, e.g. a lane's ldmatrix row for k-step 0.
TESSERA_ATTENTION_FN int attention_ldsm_base(mma_m16n8k16::coord c, int hd) {
  return attention_smem_offset(c.row, c.col * 8, hd);
}

/// Rows of a tile starting at `row0` that lie before S (0 to `rows`).
TESSERA_ATTENTION_FN int attention_valid_rows(std::int64_t row0, std::int64_t S, int rows) {
  const std::int64_t v = S - row0;
  return v <= 0 ? 0 : v >= rows ? rows : static_cast<int>(v);
}

/// Key tile (of k_rows keys, the first at global position kpos) that holds
/// the first key query row t < S of batch row b sees under the document mask
/// doc_start (attention_mask), at least 0; 0 without a mask. Query tiles
/// starting at t need no earlier tile (doc_start is nondecreasing).
TESSERA_ATTENTION_FN int attention_first_tile(const std::int32_t* doc_start, std::int64_t b,
                                              std::int64_t S, std::int64_t t, int k_rows,
                                              std::int64_t kpos) {
  const std::int64_t f = kernels::detail::attention_first_key(doc_start, b, S, t) - kpos;
  return f <= 0 ? 0 : static_cast<int>(f / k_rows);
}

/// Copies a (Rows, HD) tile, row r at src + r * stride, into the swizzled
/// shared tile at shared-window address `dst` with 16-byte cp.async;
/// rows r >= valid_rows are zero-filled (and not read). Every thread of the
/// block calls it: thread tid copies chunk tid % (HD/8) of rows
/// tid / (HD/8) + i * 256 / (HD/8).
template <class Ops, int HD, int Rows>
TESSERA_ATTENTION_FN void attention_load_tile(std::uint32_t dst, const std::uint16_t* src,
                                              int valid_rows, int stride, int tid) {
  constexpr int chunks = HD / 8, rows_per_round = attention_threads / chunks;
  static_assert(Rows % rows_per_round == 0 && rows_per_round % 8 == 0,
                "whole copy rounds per thread, each keeping the row's swizzle");
  const int r0 = tid / chunks, ch = tid % chunks;
  const std::uint32_t d0 =
      dst + 2u * static_cast<std::uint32_t>(attention_smem_offset(r0, ch * 8, HD));
  const std::uint16_t* s0 = src + r0 * stride + ch * 8;
  TESSERA_ATTENTION_UNROLL
  for (int i = 0; i < Rows / rows_per_round; ++i) {
    const bool valid = r0 + i * rows_per_round < valid_rows;
    Ops::cp_async16(d0 + 2u * i * rows_per_round * HD,
                    valid ? s0 + i * rows_per_round * stride : src, valid);
  }
}

/// acc[n][.] += A B^T for a 16-row slice of A, the shared tile at `a`
/// (rows [a_row0, a_row0 + 16), HD columns), and B the shared tile at `b`
/// stored n-major (rows [0, 8 N), HD columns): e.g. Q K^T. N is even.
template <class Ops, int HD, int N>
TESSERA_ATTENTION_FN void attention_mma_abt(float (&acc)[N][4], std::uint32_t a, int a_row0,
                                            std::uint32_t b, int lane) {
  static_assert(N % 2 == 0, "n-tiles are loaded in pairs");
  const int a_base = attention_ldsm_base(mma_m16n8k16::ldsm_a(lane, a_row0, 0), HD);
  const int b_base = attention_ldsm_base(mma_m16n8k16::ldsm_b(lane, 0, 0), HD);
  TESSERA_ATTENTION_UNROLL
  for (int kk = 0; kk < HD / 16; ++kk) {
    std::uint32_t af[4];
    Ops::ldsm_x4(af, a + 2 * attention_smem_step(a_base, kk));
    TESSERA_ATTENTION_UNROLL
    for (int np = 0; np < N / 2; ++np) {
      std::uint32_t bf[4];
      Ops::ldsm_x4(bf, b + 2 * (attention_smem_step(b_base, kk) + 16 * np * HD));
      Ops::mma(acc[2 * np], af, bf[0], bf[1]);
      Ops::mma(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

/// acc[HD/8][.] += P B where P (16 x 8 N) is given by its float32 C fragments
/// `p` (rounded to Ops::storage here: the C fragments of n-tiles 2j, 2j+1 are the A
/// fragment of k-step j) and B is the shared tile at `b` (rows [0, 8 N) = k,
/// HD columns = n) read with ldmatrix.trans: e.g. P V, dS K, P^T dO.
template <class Ops, int HD, int N>
TESSERA_ATTENTION_FN void attention_mma_pb(float (&acc)[HD / 8][4], const float (&p)[N][4],
                                           std::uint32_t b, int lane) {
  const int b_base = attention_ldsm_base(mma_m16n8k16::ldsm_bt(lane, 0, 0), HD);
  TESSERA_ATTENTION_UNROLL
  for (int j = 0; j < N / 2; ++j) {
    const std::uint32_t af[4] = {
        Ops::pack(p[2 * j][0], p[2 * j][1]), Ops::pack(p[2 * j][2], p[2 * j][3]),
        Ops::pack(p[2 * j + 1][0], p[2 * j + 1][1]), Ops::pack(p[2 * j + 1][2], p[2 * j + 1][3])};
    TESSERA_ATTENTION_UNROLL
    for (int np = 0; np < HD / 16; ++np) {
      std::uint32_t bf[4];
      Ops::ldsm_x4_trans(bf, b + 2 * (attention_smem_step(b_base, np) + 16 * j * HD));
      Ops::mma(acc[2 * np], af, bf[0], bf[1]);
      Ops::mma(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

/// Sets a warp's accumulator slice to 0.
template <int N>
TESSERA_ATTENTION_FN void attention_zero(float (&acc)[N][4]) {
  TESSERA_ATTENTION_UNROLL
  for (int n = 0; n < N; ++n) {
    TESSERA_ATTENTION_UNROLL
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.f;
  }
}

/// Writes a warp's 16 x HD float accumulator, times `scale`, as Ops::storage rows
/// [0, valid_rows) of the global rows at dst (row r at dst + r * stride),
/// staged through the warp's own rows [srow0, srow0 + 16) of the shared
/// tile `stage` for 16-byte stores. Only this warp may use those shared rows
/// from the call on.
template <class Ops, int HD>
TESSERA_ATTENTION_FN void attention_store_rows(std::uint16_t* dst, int valid_rows, int stride,
                                               const float (&acc)[HD / 8][4], float scale,
                                               std::uint16_t* stage, int srow0, int lane) {
  Ops::sync_warp();  // every ldmatrix of these rows is done
  TESSERA_ATTENTION_UNROLL
  for (int n = 0; n < HD / 8; ++n) {
    TESSERA_ATTENTION_UNROLL
    for (int i = 0; i < 4; i += 2) {
      const auto c = c_coord(lane, i);
      const std::uint32_t v = Ops::pack(acc[n][i] * scale, acc[n][i + 1] * scale);
      Ops::st_shared32(stage + attention_smem_offset(srow0 + c.row, 8 * n + c.col, HD), v);
    }
  }
  Ops::sync_warp();
  constexpr int chunks = HD / 8;
  TESSERA_ATTENTION_UNROLL
  for (int i = 0; i < 16 * chunks / 32; ++i) {
    const int c = lane + 32 * i;
    const int r = c / chunks, ch = c % chunks;
    if (r < valid_rows)
      Ops::st_global16(dst + r * stride + ch * 8,
                       Ops::ld_shared16(stage + attention_smem_offset(srow0 + r, ch * 8, HD)));
  }
}

/// Writes a warp's 16 x HD float accumulator, times `scale`, as float32
/// rows [0, valid_rows) at dst (row r at dst + r * stride), each lane its
/// own fragment elements (no shared memory); with `accumulate`, added to
/// what dst holds (each element is this lane's alone in the grid: no other
/// thread reads or writes it).
template <class Ops, int HD>
TESSERA_ATTENTION_FN void attention_store_rows_f32(float* dst, int valid_rows, int stride,
                                                   const float (&acc)[HD / 8][4], float scale,
                                                   bool accumulate, int lane) {
  TESSERA_ATTENTION_UNROLL
  for (int n = 0; n < HD / 8; ++n) {
    TESSERA_ATTENTION_UNROLL
    for (int i = 0; i < 4; ++i) {
      const auto c = c_coord(lane, i);
      if (c.row >= valid_rows) continue;
      float* e = dst + c.row * stride + 8 * n + c.col;
      const float x = acc[n][i] * scale;
      Ops::st_global_f32(e, accumulate ? Ops::ld_global_acc(e) + x : x);
    }
  }
}

// ---- forward ---------------------------------------------------------------------------------

/// One block of the forward: query tile `q_tile` (rows [128 q_tile, +128))
/// of (b, h) = (bh / nh, bh % nh). `tid` in [0, 256). Form: attention_form.
template <class Ops, int HD, attention_form Form = attention_form::causal>
TESSERA_ATTENTION_FN void attention_forward_block(
    const attention_forward_params_t<Form>& p, std::int64_t bh, int q_tile,
    typename attention_forward_traits<HD>::shared_storage& sm, int tid) {
  using tr = attention_forward_traits<HD>;
  constexpr bool ring = Form == attention_form::block;
  constexpr int NS = tr::k_rows / 8;  // n-tiles of a score slice (16 x 64)
  constexpr int NO = HD / 8;          // n-tiles of the output slice (16 x HD)
  const int warp = tid / 32, lane = tid % 32;
  const std::int64_t S = p.S;
  // Key rows; query row t sees key rows s <= t + delta; key row 0 is at
  // global position kpos (compile-time S, 0, 0 in the causal form).
  const attention_geometry geo = attention_geometry_of(p);
  const std::int64_t Sk = geo.Sk, delta = geo.delta, kpos = geo.kpos;
  const std::int64_t b = bh / p.nh;
  const int h = static_cast<int>(bh % p.nh);
  const int g = static_cast<int>(kernels::detail::attention_kv_head(h, p.nh, p.nkv));
  const int qstride = p.nh * HD, kstride = p.nkv * HD;      // elements from row t to t + 1
  const std::uint16_t* qg = p.q + (b * S * p.nh + h) * HD;  // row t at qg + t * qstride
  const std::uint16_t* kg = p.k + (b * Sk * p.nkv + g) * HD;
  const std::uint16_t* vg = p.v + (b * Sk * p.nkv + g) * HD;

  const std::int64_t q0 = std::int64_t(q_tile) * tr::q_rows;
  const std::int64_t q_end = q0 + tr::q_rows < S ? q0 + tr::q_rows : S;
  // Keys the tile's last row sees (causal): s < q_end + delta, and s < Sk.
  const std::int64_t s_end = ring ? (q_end + delta < Sk ? q_end + delta : Sk) : q_end;
  const int n_kt =  // (causal: s_end = q_end >= 1)
      !ring || s_end > 0 ? static_cast<int>((s_end + tr::k_rows - 1) / tr::k_rows) : 0;
  // Key tiles kt_first .. n_kt - 1: from the one holding the block's first
  // key (its first row's; 0 without a document mask).
  const int n_it = n_kt - attention_first_tile(p.doc_start, b, S, q0, tr::k_rows, kpos);
  const std::uint32_t smem = Ops::smem_addr(&sm);

  // Loads key tile kt (K and V) into buffer buf.
  auto load_kv = [&](int kt, int buf) {
    const std::int64_t k0 = std::int64_t(kt) * tr::k_rows;
    const int valid = attention_valid_rows(k0, Sk, tr::k_rows);
    attention_load_tile<Ops, HD, tr::k_rows>(attention_smem_addr(smem, sm, sm.k[buf]),
                                             kg + k0 * kstride, valid, kstride, tid);
    attention_load_tile<Ops, HD, tr::k_rows>(attention_smem_addr(smem, sm, sm.v[buf]),
                                             vg + k0 * kstride, valid, kstride, tid);
  };
  attention_load_tile<Ops, HD, tr::q_rows>(attention_smem_addr(smem, sm, sm.q), qg + q0 * qstride,
                                           attention_valid_rows(q0, S, tr::q_rows), qstride, tid);
  if (!ring || n_it > 0) load_kv(n_kt - 1, 0);  // (causal: n_kt >= 1, so tile n_kt - 1 exists)
  Ops::cp_commit();

  const std::int64_t w0 = q0 + 16 * warp;  // the warp's first query row
  const bool live = w0 < S;
  const float neg_inf = kernels::detail::attention_neg_inf<float>();
  // First keys of the warp's first and last rows and of this lane's rows g, g + 8,
  // as key rows of this call (global position - kpos).
  const std::int64_t w_last = w0 + 15 < S ? w0 + 15 : S - 1;
  const std::int64_t wf0 =
      kernels::detail::attention_first_key(p.doc_start, b, S, w0 < S ? w0 : S - 1) - kpos;
  const std::int64_t wf1 = kernels::detail::attention_first_key(p.doc_start, b, S, w_last) - kpos;
  std::int64_t lf[2];
  TESSERA_ATTENTION_UNROLL
  for (int r = 0; r < 2; ++r) {
    const std::int64_t t = w0 + (lane >> 2) + 8 * r;
    lf[r] = kernels::detail::attention_first_key(p.doc_start, b, S, t < S ? t : S - 1) - kpos;
  }
  float o[NO][4];
  attention_zero(o);
  float m[2] = {neg_inf, neg_inf};  // running max of rows g and g + 8 (g = lane / 4)
  float l[2] = {0.f, 0.f};          // this lane's part of the running sums
  std::uint32_t qf[HD / 16][4];     // the warp's Q slice as A fragments
  const int kb_base = attention_ldsm_base(mma_m16n8k16::ldsm_b(lane, 0, 0), HD);

  for (int it = 0; it < n_it; ++it) {
    const int kt = n_kt - 1 - it, buf = it & 1;
    Ops::template cp_wait<0>();
    Ops::sync();  // tile kt has landed, and every warp is done with buffer buf ^ 1
    const std::uint32_t s0 = Ops::opaque(smem);
    if (it == 0) {
      const int a_base = attention_ldsm_base(mma_m16n8k16::ldsm_a(lane, 16 * warp, 0), HD);
      const std::uint32_t sq = attention_smem_addr(s0, sm, sm.q);
      TESSERA_ATTENTION_UNROLL
      for (int kk = 0; kk < HD / 16; ++kk)
        Ops::ldsm_x4(qf[kk], sq + 2 * attention_smem_step(a_base, kk));
    }
    if (it + 1 < n_it) {
      load_kv(kt - 1, buf ^ 1);
      Ops::cp_commit();
    }
    const std::int64_t k0 = std::int64_t(kt) * tr::k_rows;
    // Warp-uniform: every key of the tile is masked (after the rows, or
    // before their documents).
    if (!live || w0 + 15 + delta < k0 || wf0 > k0 + tr::k_rows - 1) continue;

    // S = Q K^T for the warp's 16 rows and the tile's 64 keys.
    const std::uint32_t sk = attention_smem_addr(s0, sm, sm.k[buf]);
    float s[NS][4];
    attention_zero(s);
    TESSERA_ATTENTION_UNROLL
    for (int kk = 0; kk < HD / 16; ++kk) {
      TESSERA_ATTENTION_UNROLL
      for (int np = 0; np < NS / 2; ++np) {
        std::uint32_t bf[4];
        Ops::ldsm_x4(bf, sk + 2 * (attention_smem_step(kb_base, kk) + 16 * np * HD));
        Ops::mma(s[2 * np], qf[kk], bf[0], bf[1]);
        Ops::mma(s[2 * np + 1], qf[kk], bf[2], bf[3]);
      }
    }

    // Scale, causal mask (only on a tile that crosses the diagonal),
    // document mask (only on a tile that holds a key before a row's first),
    // keys past Sk (block form: only on the last tile, zero-filled keys that
    // a tile in the queries' past would not mask otherwise), row max.
    const bool diagonal = k0 + tr::k_rows - 1 > w0 + delta;
    const bool document = k0 < wf1;
    const bool tail = ring && k0 + tr::k_rows > Sk;
    const int dk0 = static_cast<int>(k0 - w0 - delta);  // key - row = dk0 + 8 n + col - row
    const int k_valid = static_cast<int>(Sk - k0);      // (tail) keys of the tile before Sk
    float mx[2] = {neg_inf, neg_inf};
    TESSERA_ATTENTION_UNROLL
    for (int n = 0; n < NS; ++n) {
      TESSERA_ATTENTION_UNROLL
      for (int i = 0; i < 4; ++i) {
        const auto c = c_coord(lane, i);
        float x = s[n][i] * p.scale;
        if (diagonal && dk0 + 8 * n + c.col > c.row) x = neg_inf;
        if (document && k0 + 8 * n + c.col < lf[i >> 1]) x = neg_inf;
        if (tail && 8 * n + c.col >= k_valid) x = neg_inf;
        s[n][i] = x;
        mx[i >> 1] = fmaxf(mx[i >> 1], x);
      }
    }
    float alpha[2], mu[2];
    TESSERA_ATTENTION_UNROLL
    for (int r = 0; r < 2; ++r) {
      // The 4 lanes of a quad hold one row: reduce over them (FA-2 Algorithm 1, line 8).
      mx[r] = fmaxf(mx[r], Ops::shfl_xor(mx[r], 1));
      mx[r] = fmaxf(mx[r], Ops::shfl_xor(mx[r], 2));
      alpha[r] = kernels::detail::online_softmax_rescale(m[r], mx[r]);
      mu[r] = m[r] == neg_inf ? 0.f : m[r];  // a row with nothing unmasked yet: p = 0
    }
    float rs[2] = {0.f, 0.f};
    TESSERA_ATTENTION_UNROLL
    for (int n = 0; n < NS; ++n) {
      TESSERA_ATTENTION_UNROLL
      for (int i = 0; i < 4; ++i) {
        const float pr = kernels::detail::attention_prob(s[n][i], mu[i >> 1]);
        s[n][i] = pr;
        rs[i >> 1] += pr;
      }
    }
    TESSERA_ATTENTION_UNROLL
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + rs[r];
    TESSERA_ATTENTION_UNROLL
    for (int n = 0; n < NO; ++n) {
      TESSERA_ATTENTION_UNROLL
      for (int i = 0; i < 4; ++i) o[n][i] *= alpha[i >> 1];
    }
    // O += P V (P rounded to the storage type).
    attention_mma_pb<Ops, HD, NS>(o, s, attention_smem_addr(s0, sm, sm.v[buf]), lane);
  }

  if (n_it <= 0) {  // no key tile (every row before its document): Q's copy lands first
    Ops::template cp_wait<0>();
    Ops::sync();
  }
  // l = sum over the quad; out = O / l; lse = m + log(l) (FA-2 Algorithm 1, lines 12-13);
  // a row that saw no key: out 0, lse -inf.
  TESSERA_ATTENTION_UNROLL
  for (int r = 0; r < 2; ++r) {
    l[r] += Ops::shfl_xor(l[r], 1);
    l[r] += Ops::shfl_xor(l[r], 2);
  }
  if (!live) return;
  const float inv[2] = {kernels::detail::attention_inv_sum(l[0]),
                        kernels::detail::attention_inv_sum(l[1])};
  TESSERA_ATTENTION_UNROLL
  for (int n = 0; n < NO; ++n) {
    TESSERA_ATTENTION_UNROLL
    for (int i = 0; i < 4; ++i) o[n][i] *= inv[i >> 1];
  }
  const int valid = attention_valid_rows(w0, S, 16);
  if ((lane & 3) == 0) {
    float* lse = p.lse + (b * p.nh + h) * S + w0;
    TESSERA_ATTENTION_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int t = (lane >> 2) + 8 * r;
      if (t < valid) Ops::st_global_f32(lse + t, kernels::detail::attention_lse(m[r], l[r]));
    }
  }
  if constexpr (ring) {
    attention_store_rows_f32<Ops, HD>(p.out_f32 + (b * S * p.nh + h) * HD + w0 * qstride, valid,
                                      qstride, o, 1.f, false, lane);
  } else {
    // The warp's rows of sm.q were read only by this warp (Q fragments, it == 0).
    attention_store_rows<Ops, HD>(p.out + (b * S * p.nh + h) * HD + w0 * qstride, valid, qstride, o,
                                  1.f, sm.q, 16 * warp, lane);
  }
}

// ---- backward: D = rowsum(dout * out) --------------------------------------------------------

/// One block of the preprocessing: rows [block * rows_per_block, +rows_per_block)
/// of the (B, S, nh) rows, hd/8 threads a row, a fixed shuffle tree.
template <class Ops, int HD>
TESSERA_ATTENTION_FN void attention_backward_d_block(const attention_backward_params& p,
                                                     std::int64_t block, int tid) {
  using tr = attention_backward_d_traits<HD>;
  const std::int64_t row = block * tr::rows_per_block + tid / tr::threads_per_row;
  const int part = tid % tr::threads_per_row;
  using T = typename Ops::storage;
  const auto wide = [](std::uint32_t bits) {  // the 16-bit value, exact in float
    return static_cast<float>(T::from_bits(static_cast<std::uint16_t>(bits)));
  };
  float acc = 0.f;
  if (row < p.rows) {
    const attention_vec16 a = Ops::ld_global16(p.dout + row * HD + part * 8);
    const attention_vec16 o = Ops::ld_global16(p.out + row * HD + part * 8);
    TESSERA_ATTENTION_UNROLL
    for (int j = 0; j < 4; ++j) {
      acc += wide(a.w[j] & 0xffffu) * wide(o.w[j] & 0xffffu);
      acc += wide(a.w[j] >> 16) * wide(o.w[j] >> 16);
    }
  }
  TESSERA_ATTENTION_UNROLL
  for (int off = tr::threads_per_row / 2; off >= 1; off /= 2) acc += Ops::shfl_xor(acc, off);
  if (part == 0 && row < p.rows) {
    const std::int64_t h = row % p.nh, t = (row / p.nh) % p.S, b = row / (p.nh * p.S);
    Ops::st_global_f32(p.d + (b * p.nh + h) * p.S + t, acc);
  }
}

// ---- backward: dK, dV ------------------------------------------------------------------------

/// One block of the dK/dV pass: key tile `k_tile` (keys [128 k_tile, +128))
/// of (b, g) = (bg / nkv, bg % nkv); query heads g (nh/nkv) .. (g+1) (nh/nkv) - 1
/// in order, each from the query tile holding key 128 k_tile to the last.
/// Form: attention_form (block: keys of the Sk at k0, queries at q0).
template <class Ops, int HD, attention_form Form = attention_form::causal>
TESSERA_ATTENTION_FN void attention_backward_kv_block(
    const attention_backward_params_t<Form>& p, std::int64_t bg, int k_tile,
    typename attention_backward_kv_traits<HD>::shared_storage& sm, int tid) {
  using tr = attention_backward_kv_traits<HD>;
  constexpr bool ring = Form == attention_form::block;
  constexpr int NQ = tr::q_sub / 8;  // n-tiles of an S^T slice (16 keys x q_sub queries)
  constexpr int NO = HD / 8;
  const int warp = tid / 32, lane = tid % 32;
  const std::int64_t S = p.S;
  // As the forward's: key rows, query row t sees key rows s <= t + delta,
  // key row 0 at global position kpos.
  const attention_geometry geo = attention_geometry_of(p);
  const std::int64_t Sk = geo.Sk, delta = geo.delta, kpos = geo.kpos;
  const std::int64_t b = bg / p.nkv;
  const int g = static_cast<int>(bg % p.nkv);
  const int group = p.nh / p.nkv;
  const int qstride = p.nh * HD, kstride = p.nkv * HD;
  const std::int64_t k0 = std::int64_t(k_tile) * tr::k_rows;
  const int n_qt = static_cast<int>((S + tr::q_rows - 1) / tr::q_rows);  // query tiles of a head
  // The first query tile with a query that sees key k0 (t >= k0 - delta);
  // in the block form n_qt when none does (keys wholly in the queries' future).
  const std::int64_t t_first = k0 - delta > 0 ? k0 - delta : 0;
  const int iq0 = ring ? (t_first < S ? static_cast<int>(t_first / tr::q_rows) : n_qt)
                       : static_cast<int>(k0 / tr::q_rows);
  const std::uint32_t smem = Ops::smem_addr(&sm);

  // Query tile iq of head h into buffer buf: Q, dO by cp.async, lse and D by plain loads.
  auto load_q = [&](int h, int iq, int buf) {
    const std::int64_t q0 = std::int64_t(iq) * tr::q_rows;
    const std::int64_t off = (b * S * p.nh + h) * HD + q0 * qstride;
    const int valid = attention_valid_rows(q0, S, tr::q_rows);
    attention_load_tile<Ops, HD, tr::q_rows>(attention_smem_addr(smem, sm, sm.q[buf]), p.q + off,
                                             valid, qstride, tid);
    attention_load_tile<Ops, HD, tr::q_rows>(attention_smem_addr(smem, sm, sm.dout[buf]),
                                             p.dout + off, valid, qstride, tid);
    if (tid < tr::q_rows) {
      const std::int64_t row = (b * p.nh + h) * S + q0 + tid;
      sm.lse[buf][tid] = tid < valid ? Ops::ld_global_f32(p.lse + row) : INFINITY;
      sm.d[buf][tid] = tid < valid ? Ops::ld_global_f32(p.d + row) : 0.f;
      // The query's first key relative to the block's, in [0, k_rows] (k_rows:
      // none of the block's keys; also past S).
      const std::int64_t f =
          tid < valid
              ? kernels::detail::attention_first_key(p.doc_start, b, S, q0 + tid) - kpos - k0
              : tr::k_rows;
      sm.first[buf][tid] = static_cast<std::int32_t>(f < 0 ? 0 : f > tr::k_rows ? tr::k_rows : f);
    }
  };

  const int k_valid = attention_valid_rows(k0, Sk, tr::k_rows);
  const std::int64_t koff = (b * Sk * p.nkv + g) * HD + k0 * kstride;
  if constexpr (ring) {
    if (iq0 >= n_qt) {  // no query sees these keys: dK = dV = 0, nothing loaded
      if (16 * warp < k_valid) {
        float zero[NO][4];
        attention_zero(zero);
        const int valid = k_valid - 16 * warp < 16 ? k_valid - 16 * warp : 16;
        const std::int64_t off = koff + std::int64_t(16 * warp) * kstride;
        attention_store_rows_f32<Ops, HD>(p.dk_f32 + off, valid, kstride, zero, 1.f, false, lane);
        attention_store_rows_f32<Ops, HD>(p.dv_f32 + off, valid, kstride, zero, 1.f, false, lane);
      }
      return;
    }
  }
  attention_load_tile<Ops, HD, tr::k_rows>(attention_smem_addr(smem, sm, sm.k), p.k + koff, k_valid,
                                           kstride, tid);
  attention_load_tile<Ops, HD, tr::k_rows>(attention_smem_addr(smem, sm, sm.v), p.v + koff, k_valid,
                                           kstride, tid);
  // The walk: heads g group .. (g + 1) group - 1, each over query tiles iq0 .. iq_end - 1:
  // up to the last whose first row's document starts at or before the key tile's last key
  // (doc_start is nondecreasing: the later rows' documents start after it too).
  int iq_end = iq0 + 1;
  if (p.doc_start == nullptr)
    iq_end = n_qt;
  else
    while (iq_end < n_qt) {
      const std::int64_t f = kernels::detail::attention_first_key(
          p.doc_start, b, S, std::int64_t(iq_end) * tr::q_rows);  // the tile's first query's
      if (f - kpos >= k0 + k_valid) break;
      ++iq_end;
    }
  int h = g * group, iq = iq0;  // the tile being computed
  int h1 = h, iq1 = iq;         // the tile after it
  auto advance = [&](int& hh, int& ii) {
    if (++ii == iq_end) {
      ii = iq0;
      ++hh;
    }
  };
  load_q(h, iq, 0);
  Ops::cp_commit();
  advance(h1, iq1);

  const int w0 = 16 * warp;  // the warp's first key, from k0
  const bool live = w0 < k_valid;
  float dk[NO][4], dv[NO][4];
  attention_zero(dk);
  attention_zero(dv);

  for (int buf = 0; h < (g + 1) * group; buf ^= 1) {
    Ops::template cp_wait<0>();
    Ops::sync();  // tile (h, iq) has landed (lse, D stored before the barrier); buf ^ 1 is free
    const std::uint32_t s0 = Ops::opaque(smem);
    if (h1 < (g + 1) * group) {
      load_q(h1, iq1, buf ^ 1);
      Ops::cp_commit();
    }
    // Queries q0 + [0, 64) against keys k0 + w0 + [0, 16): dq0 = q0 + delta - k0 - w0
    // (query minus key, in global positions).
    const int dq0 = static_cast<int>(std::int64_t(iq) * tr::q_rows + delta - k0) - w0;
    h = h1;
    iq = iq1;
    advance(h1, iq1);
    // Every query precedes every key, or every query's document starts after them.
    if (!live || dq0 + tr::q_rows - 1 < 0 || sm.first[buf][0] > w0 + 15) continue;

    // The tile's queries in sub-tiles of tr::q_sub (fewer live registers at hd 128).
    const bool diagonal = dq0 < 15;
    // Some key of the warp precedes some query's document (sm.first is
    // nondecreasing, S past the end).
    const bool document = p.doc_start != nullptr && w0 < sm.first[buf][tr::q_rows - 1];
    TESSERA_ATTENTION_NO_UNROLL
    for (int qs0 = 0; qs0 < tr::q_rows; qs0 += tr::q_sub) {
      // Rows [qs0, qs0 + tr::q_sub) of the Q and dO tiles.
      const std::uint32_t qs = attention_smem_addr(s0, sm, sm.q[buf]) + 2 * qs0 * HD;
      const std::uint32_t dos = attention_smem_addr(s0, sm, sm.dout[buf]) + 2 * qs0 * HD;
      // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys and the sub-tile's queries.
      float st[NQ][4], dpt[NQ][4];
      attention_zero(st);
      attention_zero(dpt);
      attention_mma_abt<Ops, HD, NQ>(dpt, attention_smem_addr(s0, sm, sm.v), w0, dos, lane);
      attention_mma_abt<Ops, HD, NQ>(st, attention_smem_addr(s0, sm, sm.k), w0, qs, lane);

      // P^T = exp(scale S^T - lse) (0 above the diagonal), dS^T = P^T (dP^T - D)
      // (FA-2 Algorithm 2, lines 11 and 14).
      TESSERA_ATTENTION_UNROLL
      for (int n = 0; n < NQ; ++n) {
        TESSERA_ATTENTION_UNROLL
        for (int i = 0; i < 4; ++i) {
          const auto c = c_coord(lane, i);
          const int qi = qs0 + 8 * n + c.col;
          float pr = kernels::detail::attention_prob(st[n][i] * p.scale, sm.lse[buf][qi]);
          if (diagonal && c.row > dq0 + qi) pr = 0.f;                // key > query
          if (document && w0 + c.row < sm.first[buf][qi]) pr = 0.f;  // before its document
          dpt[n][i] = kernels::detail::attention_dscore(pr, dpt[n][i], sm.d[buf][qi]);
          st[n][i] = pr;
        }
      }
      attention_mma_pb<Ops, HD, NQ>(dv, st, dos, lane);  // dV += P^T dO
      attention_mma_pb<Ops, HD, NQ>(dk, dpt, qs, lane);  // dK += dS^T Q
    }
  }

  if (!live) return;
  const int valid = k_valid - w0 < 16 ? k_valid - w0 : 16;
  if constexpr (ring) {
    attention_store_rows_f32<Ops, HD>(p.dk_f32 + koff + w0 * kstride, valid, kstride, dk, p.scale,
                                      false, lane);
    attention_store_rows_f32<Ops, HD>(p.dv_f32 + koff + w0 * kstride, valid, kstride, dv, 1.f,
                                      false, lane);
  } else {
    // The warp's rows of sm.k and sm.v were read only by this warp.
    attention_store_rows<Ops, HD>(p.dk + koff + w0 * kstride, valid, kstride, dk, p.scale, sm.k, w0,
                                  lane);
    attention_store_rows<Ops, HD>(p.dv + koff + w0 * kstride, valid, kstride, dv, 1.f, sm.v, w0,
                                  lane);
  }
}

// ---- backward: dQ ----------------------------------------------------------------------------

/// One block of the dQ pass: query tile `q_tile` of (b, h) = (bh / nh, bh % nh),
/// key tiles from the diagonal down to 0. Form: attention_form (block: the
/// queries at q0 against the Sk keys at k0; dq float32, written or added).
template <class Ops, int HD, attention_form Form = attention_form::causal>
TESSERA_ATTENTION_FN void attention_backward_q_block(
    const attention_backward_params_t<Form>& p, std::int64_t bh, int q_tile,
    typename attention_backward_q_traits<HD>::shared_storage& sm, int tid) {
  using tr = attention_backward_q_traits<HD>;
  constexpr bool ring = Form == attention_form::block;
  constexpr int NS = tr::k_rows / 8;
  constexpr int NO = HD / 8;
  const int warp = tid / 32, lane = tid % 32;
  const std::int64_t S = p.S;
  // As the forward's: key rows, query row t sees key rows s <= t + delta,
  // key row 0 at global position kpos.
  const attention_geometry geo = attention_geometry_of(p);
  const std::int64_t Sk = geo.Sk, delta = geo.delta, kpos = geo.kpos;
  const std::int64_t b = bh / p.nh;
  const int h = static_cast<int>(bh % p.nh);
  const int g = static_cast<int>(kernels::detail::attention_kv_head(h, p.nh, p.nkv));
  const int qstride = p.nh * HD, kstride = p.nkv * HD;
  const std::int64_t q0 = std::int64_t(q_tile) * tr::q_rows;
  const std::int64_t qoff = (b * S * p.nh + h) * HD + q0 * qstride;  // row q0
  const std::uint16_t* kg = p.k + (b * Sk * p.nkv + g) * HD;         // row 0
  const std::uint16_t* vg = p.v + (b * Sk * p.nkv + g) * HD;
  const std::int64_t q_end = q0 + tr::q_rows < S ? q0 + tr::q_rows : S;
  // Keys the tile's last row sees: s < q_end + delta, and s < Sk.
  const std::int64_t s_end = ring ? (q_end + delta < Sk ? q_end + delta : Sk) : q_end;
  const int n_kt =  // (causal: s_end = q_end >= 1)
      !ring || s_end > 0 ? static_cast<int>((s_end + tr::k_rows - 1) / tr::k_rows) : 0;
  const int n_it = n_kt - attention_first_tile(p.doc_start, b, S, q0, tr::k_rows, kpos);
  const std::uint32_t smem = Ops::smem_addr(&sm);

  auto load_kv = [&](int kt, int buf) {
    const std::int64_t k0 = std::int64_t(kt) * tr::k_rows;
    const int valid = attention_valid_rows(k0, Sk, tr::k_rows);
    attention_load_tile<Ops, HD, tr::k_rows>(attention_smem_addr(smem, sm, sm.k[buf]),
                                             kg + k0 * kstride, valid, kstride, tid);
    attention_load_tile<Ops, HD, tr::k_rows>(attention_smem_addr(smem, sm, sm.v[buf]),
                                             vg + k0 * kstride, valid, kstride, tid);
  };
  const int q_valid = attention_valid_rows(q0, S, tr::q_rows);
  attention_load_tile<Ops, HD, tr::q_rows>(attention_smem_addr(smem, sm, sm.q), p.q + qoff, q_valid,
                                           qstride, tid);
  attention_load_tile<Ops, HD, tr::q_rows>(attention_smem_addr(smem, sm, sm.dout), p.dout + qoff,
                                           q_valid, qstride, tid);
  if (!ring || n_it > 0) load_kv(n_kt - 1, 0);  // (causal: n_kt >= 1)
  Ops::cp_commit();

  const int w0 = 16 * warp;  // the warp's first row, from q0
  const bool live = w0 < q_valid;
  float lse[2], dd[2];  // of rows g and g + 8; +inf and 0 past S (P = 0, dS = 0)
  std::int64_t lf[2];   // their first keys (document mask), as key rows of this call
  TESSERA_ATTENTION_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int t = w0 + (lane >> 2) + 8 * r;
    const std::int64_t row = (b * p.nh + h) * S + q0 + t;
    lse[r] = t < q_valid ? Ops::ld_global_f32(p.lse + row) : INFINITY;
    dd[r] = t < q_valid ? Ops::ld_global_f32(p.d + row) : 0.f;
    lf[r] =
        kernels::detail::attention_first_key(p.doc_start, b, S, t < q_valid ? q0 + t : q0) - kpos;
  }
  // First keys of the warp's first and last rows.
  const int w_last = w0 + 15 < q_valid ? w0 + 15 : q_valid - 1;
  const std::int64_t wf0 =
      kernels::detail::attention_first_key(p.doc_start, b, S, q0 + (live ? w0 : 0)) - kpos;
  const std::int64_t wf1 =
      kernels::detail::attention_first_key(p.doc_start, b, S, q0 + (live ? w_last : 0)) - kpos;
  float dq[NO][4];
  attention_zero(dq);

  for (int it = 0; it < n_it; ++it) {
    const int kt = n_kt - 1 - it, buf = it & 1;
    Ops::template cp_wait<0>();
    Ops::sync();
    const std::uint32_t s0 = Ops::opaque(smem);
    if (it + 1 < n_it) {
      load_kv(kt - 1, buf ^ 1);
      Ops::cp_commit();
    }
    // Keys k0 + [0, 64) against rows q0 + w0 + [0, 16): dk0 = k0 - q0 - delta - w0
    // (key minus row, in global positions).
    const std::int64_t k0 = std::int64_t(kt) * tr::k_rows;
    const int dk0 = static_cast<int>(k0 - q0 - delta) - w0;
    if (!live || dk0 > 15 || wf0 > k0 + tr::k_rows - 1) continue;

    // S = Q K^T, dP = dO V^T for the warp's 16 rows and the tile's 64 keys.
    float s[NS][4], dp[NS][4];
    attention_zero(s);
    attention_zero(dp);
    const std::uint32_t sk = attention_smem_addr(s0, sm, sm.k[buf]);
    attention_mma_abt<Ops, HD, NS>(dp, attention_smem_addr(s0, sm, sm.dout), w0,
                                   attention_smem_addr(s0, sm, sm.v[buf]), lane);
    attention_mma_abt<Ops, HD, NS>(s, attention_smem_addr(s0, sm, sm.q), w0, sk, lane);

    const bool diagonal = dk0 + tr::k_rows - 1 > 0;
    const bool document = k0 < wf1;                  // some key precedes some row's document
    const bool tail = ring && k0 + tr::k_rows > Sk;  // keys past Sk (zero-filled)
    const int k_valid = static_cast<int>(Sk - k0);
    TESSERA_ATTENTION_UNROLL
    for (int n = 0; n < NS; ++n) {
      TESSERA_ATTENTION_UNROLL
      for (int i = 0; i < 4; ++i) {
        const auto c = c_coord(lane, i);
        float pr = kernels::detail::attention_prob(s[n][i] * p.scale, lse[i >> 1]);
        if (diagonal && dk0 + 8 * n + c.col > c.row) pr = 0.f;      // key > row
        if (document && k0 + 8 * n + c.col < lf[i >> 1]) pr = 0.f;  // before its document
        if (tail && 8 * n + c.col >= k_valid) pr = 0.f;             // past Sk
        s[n][i] = kernels::detail::attention_dscore(pr, dp[n][i], dd[i >> 1]);
      }
    }
    attention_mma_pb<Ops, HD, NS>(dq, s, sk, lane);  // dQ += dS K
  }

  if (n_it <= 0) {  // no key tile: Q's and dO's copies land before sm.q stages dq
    Ops::template cp_wait<0>();
    Ops::sync();
  }
  if (!live) return;
  const int valid = q_valid - w0 < 16 ? q_valid - w0 : 16;
  if constexpr (ring) {
    attention_store_rows_f32<Ops, HD>(p.dq_f32 + qoff + w0 * qstride, valid, qstride, dq, p.scale,
                                      p.dq_accumulate != 0, lane);
  } else {
    // The warp's rows of sm.q were read only by this warp.
    attention_store_rows<Ops, HD>(p.dq + qoff + w0 * qstride, valid, qstride, dq, p.scale, sm.q, w0,
                                  lane);
  }
}

}  // namespace tessera::kernels::cuda::detail

#if defined(__CUDACC__)

namespace tessera::kernels::cuda::detail {

/// The warp-level primitives of the block bodies on the GPU (sm_80 and newer),
/// for the 16-bit storage type T (bf16 or fp16): the mma and the rounding of
/// P and of the outputs are T's; the rest is bits.
template <class T>
struct attention_device_ops {
  static_assert(is_half_v<T>, "flash attention: the storage type is bf16 or fp16");
  using storage = T;
  static __device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
  }
  /// `x`, as a value the compiler cannot see through: addresses computed
  /// from it are not hoisted out of the loop iteration that made it.
  static __device__ __forceinline__ std::uint32_t opaque(std::uint32_t x) {
    std::uint32_t r;
    asm volatile("mov.b32 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
  }
  /// ldmatrix.x4 (shared-window address `a`): lane l gives the address of
  /// row l % 8 of matrix l / 8.
  static __device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], std::uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  }
  static __device__ __forceinline__ void ldsm_x4_trans(std::uint32_t (&r)[4], std::uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  }
  /// d += a b: (16 x 16 T) (16 x 8 T) in float32.
  static __device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4],
                                             std::uint32_t b0, std::uint32_t b1) {
    if constexpr (std::is_same_v<T, bf16>)
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ float shfl_xor(float v, int mask) {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  }
  /// 16 bytes global -> shared, asynchronous; zero-filled when !valid (src not read).
  static __device__ __forceinline__ void cp_async16(std::uint32_t dst, const std::uint16_t* src,
                                                    bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
  }
  static __device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  template <int N>
  static __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
  }
  static __device__ __forceinline__ void sync() { __syncthreads(); }
  static __device__ __forceinline__ void sync_warp() { __syncwarp(); }
  /// Two floats rounded to T (nearest even), `lo` in the low half.
  static __device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
    std::uint32_t r;
    if constexpr (std::is_same_v<T, bf16>)
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    else
      asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  static __device__ __forceinline__ void st_shared32(std::uint16_t* p, std::uint32_t v) {
    *reinterpret_cast<std::uint32_t*>(p) = v;
  }
  static __device__ __forceinline__ attention_vec16 ld_shared16(const std::uint16_t* p) {
    return *reinterpret_cast<const attention_vec16*>(p);
  }
  static __device__ __forceinline__ attention_vec16 ld_global16(const std::uint16_t* p) {
    return *reinterpret_cast<const attention_vec16*>(p);
  }
  static __device__ __forceinline__ void st_global16(std::uint16_t* p, const attention_vec16& v) {
    *reinterpret_cast<attention_vec16*>(p) = v;
  }
  static __device__ __forceinline__ float ld_global_f32(const float* p) { return __ldg(p); }
  /// A float the kernel itself writes (a `+=` output): a coherent load, not __ldg.
  static __device__ __forceinline__ float ld_global_acc(const float* p) { return *p; }
  static __device__ __forceinline__ void st_global_f32(float* p, float v) { *p = v; }
};

template <class T, int HD, attention_form Form>
__global__ void __launch_bounds__(attention_threads, 1)
    attention_forward_kernel(const attention_forward_params_t<Form> p) {
  using storage = typename attention_forward_traits<HD>::shared_storage;
  static_assert(sizeof(storage) <= attention_smem_bound,
                "attention_forward_kernel: shared_storage exceeds attention_smem_bound");
  extern __shared__ __align__(128) unsigned char attention_smem[];
  attention_forward_block<attention_device_ops<T>, HD, Form>(
      p, blockIdx.x, static_cast<int>(gridDim.y - 1 - blockIdx.y),
      *reinterpret_cast<storage*>(attention_smem), static_cast<int>(threadIdx.x));
}

template <class T, int HD>
__global__ void __launch_bounds__(attention_threads)
    attention_backward_d_kernel(const attention_backward_params p) {
  attention_backward_d_block<attention_device_ops<T>, HD>(p, blockIdx.x,
                                                          static_cast<int>(threadIdx.x));
}

template <class T, int HD, attention_form Form>
__global__ void __launch_bounds__(attention_threads, 1)
    attention_backward_kv_kernel(const attention_backward_params_t<Form> p) {
  using storage = typename attention_backward_kv_traits<HD>::shared_storage;
  static_assert(sizeof(storage) <= attention_smem_bound,
                "attention_backward_kv_kernel: shared_storage exceeds attention_smem_bound");
  extern __shared__ __align__(128) unsigned char attention_smem[];
  attention_backward_kv_block<attention_device_ops<T>, HD, Form>(
      p, blockIdx.x, static_cast<int>(blockIdx.y), *reinterpret_cast<storage*>(attention_smem),
      static_cast<int>(threadIdx.x));
}

template <class T, int HD, attention_form Form>
__global__ void __launch_bounds__(attention_threads, 1)
    attention_backward_q_kernel(const attention_backward_params_t<Form> p) {
  using storage = typename attention_backward_q_traits<HD>::shared_storage;
  static_assert(sizeof(storage) <= attention_smem_bound,
                "attention_backward_q_kernel: shared_storage exceeds attention_smem_bound");
  extern __shared__ __align__(128) unsigned char attention_smem[];
  attention_backward_q_block<attention_device_ops<T>, HD, Form>(
      p, blockIdx.x, static_cast<int>(gridDim.y - 1 - blockIdx.y),
      *reinterpret_cast<storage*>(attention_smem), static_cast<int>(threadIdx.x));
}

/// Launches `kernel` with configuration `c` on `stream`, opting in to more
/// than 48 KiB of dynamic shared memory when `c` needs it.
template <class Kernel, class Params>
void attention_launch(Kernel kernel, const launch_config& c, const Params& params,
                      cudaStream_t stream) {
  if (c.dynamic_smem > launch_limits::default_smem)
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(c.dynamic_smem)));
  kernel<<<dim3(static_cast<unsigned>(c.grid_x), static_cast<unsigned>(c.grid_y), 1u),
           static_cast<unsigned>(c.block), c.dynamic_smem, stream>>>(params);
}

template <class T, int HD, attention_form Form>
void attention_forward_launch(const attention_forward_params_t<Form>& p, const launch_config& c,
                              cudaStream_t stream) {
  attention_launch(attention_forward_kernel<T, HD, Form>, c, p, stream);
  TESSERA_CUDA_CHECK_LAUNCH("attention_forward_kernel");
}

template <class T, int HD, attention_form Form>
void attention_backward_launch(const attention_backward_params_t<Form>& p, const launch_config& cd,
                               const launch_config& ckv, const launch_config& cq,
                               cudaStream_t stream) {
  // D needs the causal form's fields only (the S queries).
  attention_launch(attention_backward_d_kernel<T, HD>, cd,
                   static_cast<const attention_backward_params&>(p), stream);
  TESSERA_CUDA_CHECK_LAUNCH("attention_backward_d_kernel");
  attention_launch(attention_backward_kv_kernel<T, HD, Form>, ckv, p, stream);
  TESSERA_CUDA_CHECK_LAUNCH("attention_backward_kv_kernel");
  attention_launch(attention_backward_q_kernel<T, HD, Form>, cq, p, stream);
  TESSERA_CUDA_CHECK_LAUNCH("attention_backward_q_kernel");
}

}  // namespace tessera::kernels::cuda::detail

#if TESSERA_CUDA_DEFINES_ENTRIES

// The launchers of attention.hpp: argument checks (config_error before any
// launch), then the kernels above for the head dimension (32, 64 or 128).
// Inline in a header-only translation unit, defined once in
// cuda/kernels_attention.cu for tessera::cuda_kernels (kernels/cuda/linkage.hpp).

namespace tessera::kernels::cuda {

namespace detail {

template <class T>
const std::uint16_t* attention_bits(const T* p) {
  return reinterpret_cast<const std::uint16_t*>(p);
}
template <class T>
std::uint16_t* attention_bits(T* p) {
  return reinterpret_cast<std::uint16_t*>(p);
}

/// The kernels of `Form` for the head dimension hd (32, 64 or 128).
template <class T, attention_form Form>
void attention_forward_dispatch(const attention_forward_params_t<Form>& p, const launch_config& c,
                                std::int64_t hd, cudaStream_t stream) {
  switch (hd) {
    case 32:
      attention_forward_launch<T, 32, Form>(p, c, stream);
      break;
    case 64:
      attention_forward_launch<T, 64, Form>(p, c, stream);
      break;
    default:
      attention_forward_launch<T, 128, Form>(p, c, stream);
      break;
  }
}

template <class T, attention_form Form>
void attention_backward_dispatch(const attention_backward_params_t<Form>& p,
                                 const launch_config& cd, const launch_config& ckv,
                                 const launch_config& cq, std::int64_t hd, cudaStream_t stream) {
  switch (hd) {
    case 32:
      attention_backward_launch<T, 32, Form>(p, cd, ckv, cq, stream);
      break;
    case 64:
      attention_backward_launch<T, 64, Form>(p, cd, ckv, cq, stream);
      break;
    default:
      attention_backward_launch<T, 128, Form>(p, cd, ckv, cq, stream);
      break;
  }
}

/// flash_attention_forward for the storage type T (bf16 or fp16).
template <class T>
void flash_attention_forward_of(T* d_out, float* d_lse, const T* d_q, const T* d_k, const T* d_v,
                                std::int64_t B, std::int64_t S, std::int64_t nh, std::int64_t nkv,
                                std::int64_t hd, cudaStream_t stream,
                                const std::int32_t* d_doc_start) {
  const attention_forward_params p =
      attention_forward_args(attention_bits(d_out), d_lse, attention_bits(d_q), attention_bits(d_k),
                             attention_bits(d_v), B, S, nh, nkv, hd, d_doc_start);
  const launch_config c = attention_forward_config(B, S, nh, nkv, hd);
  attention_forward_dispatch<T, attention_form::causal>(p, c, hd, stream);
}

/// The block form of flash_attention_forward for T (bf16 or fp16): grid over
/// the S queries, as the causal form's.
template <class T>
void flash_attention_forward_block_of(float* d_out, float* d_lse, const T* d_q, const T* d_k,
                                      const T* d_v, std::int64_t B, std::int64_t S, std::int64_t nh,
                                      std::int64_t nkv, std::int64_t hd, cudaStream_t stream,
                                      const std::int32_t* d_doc_start,
                                      kernels::attention_span span) {
  const attention_forward_block_params p =
      attention_forward_block_args(d_out, d_lse, attention_bits(d_q), attention_bits(d_k),
                                   attention_bits(d_v), B, S, nh, nkv, hd, d_doc_start, span);
  const launch_config c = attention_forward_config(B, S, nh, nkv, hd);
  attention_forward_dispatch<T, attention_form::block>(p, c, hd, stream);
}

/// flash_attention_backward for the storage type T (bf16 or fp16).
template <class T>
void flash_attention_backward_of(T* d_dq, T* d_dk, T* d_dv, const T* d_dout, const T* d_q,
                                 const T* d_k, const T* d_v, const T* d_out, const float* d_lse,
                                 std::int64_t B, std::int64_t S, std::int64_t nh, std::int64_t nkv,
                                 std::int64_t hd, void* d_scratch, std::size_t scratch_bytes,
                                 cudaStream_t stream, const std::int32_t* d_doc_start) {
  const attention_backward_params p = attention_backward_args(
      attention_bits(d_dq), attention_bits(d_dk), attention_bits(d_dv), attention_bits(d_dout),
      attention_bits(d_q), attention_bits(d_k), attention_bits(d_v), attention_bits(d_out), d_lse,
      B, S, nh, nkv, hd, d_scratch, scratch_bytes, d_doc_start);
  const launch_config cd = attention_backward_d_config(B, S, nh, nkv, hd);
  const launch_config ckv = attention_backward_kv_config(B, S, nh, nkv, hd);
  const launch_config cq = attention_backward_q_config(B, S, nh, nkv, hd);
  attention_backward_dispatch<T, attention_form::causal>(p, cd, ckv, cq, hd, stream);
}

/// The block form of flash_attention_backward for T (bf16 or fp16): D over
/// the S queries, dK/dV over the Sk keys, dQ over the S queries.
template <class T>
void flash_attention_backward_block_of(float* d_dq, float* d_dk, float* d_dv, const T* d_dout,
                                       const T* d_q, const T* d_k, const T* d_v, const T* d_out,
                                       const float* d_lse, std::int64_t B, std::int64_t S,
                                       std::int64_t nh, std::int64_t nkv, std::int64_t hd,
                                       void* d_scratch, std::size_t scratch_bytes,
                                       cudaStream_t stream, const std::int32_t* d_doc_start,
                                       kernels::attention_span span,
                                       kernels::attention_dq dq_mode) {
  const attention_backward_block_params p = attention_backward_block_args(
      d_dq, d_dk, d_dv, attention_bits(d_dout), attention_bits(d_q), attention_bits(d_k),
      attention_bits(d_v), attention_bits(d_out), d_lse, B, S, nh, nkv, hd, d_scratch,
      scratch_bytes, d_doc_start, span, dq_mode);
  const launch_config cd = attention_backward_d_config(B, S, nh, nkv, hd);
  const launch_config ckv = attention_backward_kv_config(B, p.span.Sk, nh, nkv, hd);
  const launch_config cq = attention_backward_q_config(B, S, nh, nkv, hd);
  attention_backward_dispatch<T, attention_form::block>(p, cd, ckv, cq, hd, stream);
}

}  // namespace detail

TESSERA_CUDA_ENTRY void flash_attention_forward(bf16* d_out, float* d_lse, const bf16* d_q,
                                                const bf16* d_k, const bf16* d_v, std::int64_t B,
                                                std::int64_t S, std::int64_t nh, std::int64_t nkv,
                                                std::int64_t hd, cudaStream_t stream,
                                                const std::int32_t* d_doc_start) {
  detail::flash_attention_forward_of(d_out, d_lse, d_q, d_k, d_v, B, S, nh, nkv, hd, stream,
                                     d_doc_start);
}

TESSERA_CUDA_ENTRY void flash_attention_backward(
    bf16* d_dq, bf16* d_dk, bf16* d_dv, const bf16* d_dout, const bf16* d_q, const bf16* d_k,
    const bf16* d_v, const bf16* d_out, const float* d_lse, std::int64_t B, std::int64_t S,
    std::int64_t nh, std::int64_t nkv, std::int64_t hd, void* d_scratch, std::size_t scratch_bytes,
    cudaStream_t stream, const std::int32_t* d_doc_start) {
  detail::flash_attention_backward_of(d_dq, d_dk, d_dv, d_dout, d_q, d_k, d_v, d_out, d_lse, B, S,
                                      nh, nkv, hd, d_scratch, scratch_bytes, stream, d_doc_start);
}

TESSERA_CUDA_ENTRY void flash_attention_forward(fp16* d_out, float* d_lse, const fp16* d_q,
                                                const fp16* d_k, const fp16* d_v, std::int64_t B,
                                                std::int64_t S, std::int64_t nh, std::int64_t nkv,
                                                std::int64_t hd, cudaStream_t stream,
                                                const std::int32_t* d_doc_start) {
  detail::flash_attention_forward_of(d_out, d_lse, d_q, d_k, d_v, B, S, nh, nkv, hd, stream,
                                     d_doc_start);
}

TESSERA_CUDA_ENTRY void flash_attention_backward(
    fp16* d_dq, fp16* d_dk, fp16* d_dv, const fp16* d_dout, const fp16* d_q, const fp16* d_k,
    const fp16* d_v, const fp16* d_out, const float* d_lse, std::int64_t B, std::int64_t S,
    std::int64_t nh, std::int64_t nkv, std::int64_t hd, void* d_scratch, std::size_t scratch_bytes,
    cudaStream_t stream, const std::int32_t* d_doc_start) {
  detail::flash_attention_backward_of(d_dq, d_dk, d_dv, d_dout, d_q, d_k, d_v, d_out, d_lse, B, S,
                                      nh, nkv, hd, d_scratch, scratch_bytes, stream, d_doc_start);
}

TESSERA_CUDA_ENTRY void flash_attention_forward(float* d_out, float* d_lse, const bf16* d_q,
                                                const bf16* d_k, const bf16* d_v, std::int64_t B,
                                                std::int64_t S, std::int64_t nh, std::int64_t nkv,
                                                std::int64_t hd, cudaStream_t stream,
                                                const std::int32_t* d_doc_start,
                                                kernels::attention_span span) {
  detail::flash_attention_forward_block_of(d_out, d_lse, d_q, d_k, d_v, B, S, nh, nkv, hd, stream,
                                           d_doc_start, span);
}

TESSERA_CUDA_ENTRY void flash_attention_forward(float* d_out, float* d_lse, const fp16* d_q,
                                                const fp16* d_k, const fp16* d_v, std::int64_t B,
                                                std::int64_t S, std::int64_t nh, std::int64_t nkv,
                                                std::int64_t hd, cudaStream_t stream,
                                                const std::int32_t* d_doc_start,
                                                kernels::attention_span span) {
  detail::flash_attention_forward_block_of(d_out, d_lse, d_q, d_k, d_v, B, S, nh, nkv, hd, stream,
                                           d_doc_start, span);
}

TESSERA_CUDA_ENTRY void flash_attention_backward(
    float* d_dq, float* d_dk, float* d_dv, const bf16* d_dout, const bf16* d_q, const bf16* d_k,
    const bf16* d_v, const bf16* d_out, const float* d_lse, std::int64_t B, std::int64_t S,
    std::int64_t nh, std::int64_t nkv, std::int64_t hd, void* d_scratch, std::size_t scratch_bytes,
    cudaStream_t stream, const std::int32_t* d_doc_start, kernels::attention_span span,
    kernels::attention_dq dq_mode) {
  detail::flash_attention_backward_block_of(d_dq, d_dk, d_dv, d_dout, d_q, d_k, d_v, d_out, d_lse,
                                            B, S, nh, nkv, hd, d_scratch, scratch_bytes, stream,
                                            d_doc_start, span, dq_mode);
}

TESSERA_CUDA_ENTRY void flash_attention_backward(
    float* d_dq, float* d_dk, float* d_dv, const fp16* d_dout, const fp16* d_q, const fp16* d_k,
    const fp16* d_v, const fp16* d_out, const float* d_lse, std::int64_t B, std::int64_t S,
    std::int64_t nh, std::int64_t nkv, std::int64_t hd, void* d_scratch, std::size_t scratch_bytes,
    cudaStream_t stream, const std::int32_t* d_doc_start, kernels::attention_span span,
    kernels::attention_dq dq_mode) {
  detail::flash_attention_backward_block_of(d_dq, d_dk, d_dv, d_dout, d_q, d_k, d_v, d_out, d_lse,
                                            B, S, nh, nkv, hd, d_scratch, scratch_bytes, stream,
                                            d_doc_start, span, dq_mode);
}

TESSERA_CUDA_ENTRY void flash_attention_merge(float* d_out_acc, float* d_lse_acc,
                                              const float* d_out_part, const float* d_lse_part,
                                              std::int64_t B, std::int64_t S, std::int64_t nh,
                                              std::int64_t hd, cudaStream_t stream) {
  attention_merge_launch(device_launcher{stream}, d_out_acc, d_lse_acc, d_out_part, d_lse_part, B,
                         S, nh, hd);
}

}  // namespace tessera::kernels::cuda

#endif  // TESSERA_CUDA_DEFINES_ENTRIES

#endif  // __CUDACC__
