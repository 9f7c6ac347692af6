#pragma once
/// \file kernels/cuda/attention_launch.hpp
/// Launch configuration and warp-level index arithmetic of the flash
/// attention kernels (kernels/cuda/attention.cuh), as plain host functions
/// and TESSERA_HOST_DEVICE constexpr functions without CUDA headers, so that
/// the host test tests/kernels/cuda_attention_launch.cpp can check the grids,
/// the shared memory and the scratch bytes for the 7B shapes, and emulate the
/// tensor-core fragments, without a GPU.
///
/// Contents:
/// - `mma_m16n8k16`: which (row, column) of the A, B and C/D matrices each
///   lane's register holds for `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`
///   (and its .f16.f16 twin: the same layouts for any 16-bit operand type),
///   which element of an 8x8 matrix each lane receives from `ldmatrix`
///   (plain and `.trans`), and which tile row each lane hands `ldmatrix.x4`
///   to load an A operand or two B operands.
/// - `attention_smem_offset`: the XOR swizzle of the 16-bit (bf16 or fp16) tiles in shared memory.
/// - `attention_*_traits<HD>`: tile sizes, warps and the `shared_storage` of
///   each kernel (the kernels static_assert it within `attention_smem_bound`).
/// - `attention_*_config`: grid, block, dynamic shared memory and scratch of
///   each launch, depending on the sizes only (never on the device).
///
/// Source of the fragment layouts: PTX ISA 8.x/9.0, section 9.7.14.5.8
/// "Matrix Fragments for mma.m16n8k16 with floating point type", and 9.7.14.5.15
/// "Warp-level matrix load instruction: ldmatrix".

#include <cstddef>
#include <cstdint>

#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"
#include "tessera/kernels/cuda/launch.hpp"
#include "tessera/kernels/detail/attention.hpp"

namespace tessera::kernels::cuda {

// ---- m16n8k16 fragments ----------------------------------------------------------------------

namespace mma_m16n8k16 {

/// A (row, column) position in a matrix or tile. For the `ldsm_*` functions
/// the column is a 16-byte chunk index (8 16-bit elements), not an element.
struct coord {
  int row;
  int col;
};

/// Element `i` (0..7, two per 32-bit register, low half first) of the A
/// operand (16 x 16, row-major) held by `lane`:
/// row = groupID (+8 for a2, a3, a6, a7), col = 2 threadID_in_group + (i & 1) (+8 for i >= 4),
/// groupID = lane / 4, threadID_in_group = lane % 4.
TESSERA_HOST_DEVICE constexpr coord a_coord(int lane, int i) {
  return {(lane >> 2) + 8 * ((i >> 1) & 1), 2 * (lane & 3) + (i & 1) + 8 * (i >> 2)};
}

/// Element `i` (0..3) of the B operand (16 x 8, k x n, "col" layout) held by
/// `lane`: row (k) = 2 threadID_in_group + (i & 1) (+8 for b2, b3), col (n) = groupID.
TESSERA_HOST_DEVICE constexpr coord b_coord(int lane, int i) {
  return {2 * (lane & 3) + (i & 1) + 8 * (i >> 1), lane >> 2};
}

/// Element `i` (0..3) of the C/D accumulator (16 x 8, float) held by `lane`:
/// row = groupID (+8 for c2, c3), col = 2 threadID_in_group + (i & 1).
TESSERA_HOST_DEVICE constexpr coord c_coord(int lane, int i) {
  return {(lane >> 2) + 8 * (i >> 1), 2 * (lane & 3) + (i & 1)};
}

/// Element `half` (0: low 16 bits, 1: high) of the register `lane` receives
/// from one 8x8 matrix of `ldmatrix.m8n8.b16`, as (row, column) of the matrix
/// as stored (row r at the address lane 8 j + r gave for matrix j): row lane/4,
/// columns 2 (lane%4) + half; with `.trans`, the transpose: row 2 (lane%4) + half,
/// column lane/4.
TESSERA_HOST_DEVICE constexpr coord ldmatrix_coord(int lane, int half, bool trans) {
  return trans ? coord{2 * (lane & 3) + half, lane >> 2} : coord{lane >> 2, 2 * (lane & 3) + half};
}

/// Tile row and chunk whose address `lane` gives to `ldmatrix.x4` (not
/// transposed) to load the A operand of rows [row0, row0 + 16) and columns
/// [16 kk, 16 kk + 16) of a row-major tile (rows = M, columns = K). The four
/// matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15), in the order
/// (0-7, 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15), are a0a1, a2a3, a4a5, a6a7.
TESSERA_HOST_DEVICE constexpr coord ldsm_a(int lane, int row0, int kk) {
  return {row0 + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * kk + (lane >> 4)};
}

/// Tile row and chunk whose address `lane` gives to `ldmatrix.x4` (not
/// transposed) to load the B operands of two n-tiles, n in [n0, n0 + 16), and
/// k in [16 kk, 16 kk + 16), from a tile stored n-major (rows = N, columns =
/// K; K^T in Q K^T). Registers: {b0b1, b2b3} of n-tile n0, then of n0 + 8.
TESSERA_HOST_DEVICE constexpr coord ldsm_b(int lane, int n0, int kk) {
  return {n0 + (lane & 7) + 8 * (lane >> 4), 2 * kk + ((lane >> 3) & 1)};
}

/// Tile row and chunk whose address `lane` gives to `ldmatrix.x4.trans` to
/// load the B operands of two n-tiles, n in [16 np, 16 np + 16), and k in
/// [k0, k0 + 16), from a tile stored k-major (rows = K, columns = N; V in P V).
/// Registers: {b0b1, b2b3} of n-tile 2 np, then of 2 np + 1.
TESSERA_HOST_DEVICE constexpr coord ldsm_bt(int lane, int k0, int np) {
  return {k0 + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * np + (lane >> 4)};
}

}  // namespace mma_m16n8k16

// ---- shared-memory tiles ---------------------------------------------------------------------

/// Element offset of (row, col) in a (rows x hd) 16-bit tile in shared memory,
/// rows of hd elements, the 16-byte chunks of each row permuted by an XOR
/// with the row: chunk c of row r is stored at c ^ (r % 8) when a row has at
/// least 8 chunks (hd >= 64), at c ^ ((r / 2) % 4) when it has 4 (hd = 32).
/// The 8 rows an `ldmatrix` phase reads at one logical chunk then fall in 8
/// distinct 16-byte bank groups (no bank conflict), and so do 8 consecutive
/// 16-byte `cp.async` writes. A bijection within each row.
TESSERA_HOST_DEVICE constexpr int attention_smem_offset(int row, int col, int hd) {
  const int chunks = hd / 8;
  const int x = chunks >= 8 ? (row & 7) : ((row >> 1) & 3);
  return row * hd + (((col >> 3) ^ x) << 3) + (col & 7);
}

/// Offset of what an `ldsm_*` lane address names at k-step (or n-pair) `kk`,
/// from `base`, the offset it names at 0 in the same rows: the swizzle
/// permutes only the low 3 bits of the chunk index, by a pattern fixed by
/// the row's low bits, and chunk 2 kk + c (c in {0, 1}) XOR x equals
/// ((c XOR x) XOR 2 (kk % 4)) + 8 (kk / 4); so stepping kk is one XOR and one
/// add of constants to a per-lane base (CUTLASS's swizzled iterators do the
/// same), and no per-step address needs a register.
TESSERA_HOST_DEVICE constexpr int attention_smem_step(int base, int kk) {
  return (base ^ (16 * (kk & 3))) + 64 * (kk >> 2);
}

/// Threads of every attention kernel: 8 warps.
inline constexpr int attention_threads = 256;
inline constexpr int attention_warps = attention_threads / 32;
/// Bound the kernels' shared_storage is static_asserted against: the opt-in
/// maximum of sm_80 (163 KiB), the smaller of the two target architectures.
inline constexpr std::size_t attention_smem_bound = launch_limits::max_smem_sm80;

/// Forward (FlashAttention-2 Algorithm 1): a block owns `q_rows` = 128 query
/// rows of one (b, head), 16 per warp; it walks the key tiles of `k_rows` =
/// 64 from the diagonal down to 0, double-buffering K and V with cp.async.
template <int HD>
struct attention_forward_traits {
  static constexpr int hd = HD;
  static constexpr int q_rows = 128;
  static constexpr int k_rows = 64;
  struct alignas(128) shared_storage {
    std::uint16_t q[q_rows * HD];     // (q_rows, hd) 16-bit, swizzled; reused to stage out
    std::uint16_t k[2][k_rows * HD];  // (k_rows, hd) x 2 buffers
    std::uint16_t v[2][k_rows * HD];
  };
  static constexpr std::size_t smem_bytes = sizeof(shared_storage);
  static_assert(q_rows == 16 * attention_warps, "one 16-row mma slice of queries per warp");
};

/// Backward, dK and dV (FlashAttention-2 Algorithm 2, the loop over j): a
/// block owns `k_rows` = 128 keys of one (b, kv head), 16 per warp, and walks
/// the query tiles of `q_rows` = 64 of every query head of its group, from the
/// diagonal to the end, double-buffering Q, dO, lse and D.
template <int HD>
struct attention_backward_kv_traits {
  static constexpr int hd = HD;
  static constexpr int k_rows = 128;
  static constexpr int q_rows = 64;
  /// Queries a warp computes at once: 32 at hd 128 (its dK and dV
  /// accumulators hold 128 registers; 64 at once would spill), else 64.
  static constexpr int q_sub = HD >= 128 ? 32 : q_rows;
  struct alignas(128) shared_storage {
    std::uint16_t k[k_rows * HD];  // (k_rows, hd); reused to stage dk
    std::uint16_t v[k_rows * HD];  // reused to stage dv
    std::uint16_t q[2][q_rows * HD];
    std::uint16_t dout[2][q_rows * HD];
    float lse[2][q_rows];           // +inf past S
    float d[2][q_rows];             // 0 past S
    std::int32_t first[2][q_rows];  // first key - the block's, in [0, k_rows]
  };
  static constexpr std::size_t smem_bytes = sizeof(shared_storage);
  static_assert(k_rows == 16 * attention_warps, "one 16-row mma slice of keys per warp");
};

/// Backward, dQ: a block owns `q_rows` = 128 query rows of one (b, head), 16
/// per warp, and walks the key tiles of `k_rows` = 64 from the diagonal down
/// to 0, double-buffering K and V.
template <int HD>
struct attention_backward_q_traits {
  static constexpr int hd = HD;
  static constexpr int q_rows = 128;
  static constexpr int k_rows = 64;
  struct alignas(128) shared_storage {
    std::uint16_t q[q_rows * HD];  // reused to stage dq
    std::uint16_t dout[q_rows * HD];
    std::uint16_t k[2][k_rows * HD];
    std::uint16_t v[2][k_rows * HD];
  };
  static constexpr std::size_t smem_bytes = sizeof(shared_storage);
  static_assert(q_rows == 16 * attention_warps, "one 16-row mma slice of queries per warp");
};

/// Backward preprocessing D[b, h, t] = sum_d dout[b,t,h,d] out[b,t,h,d]: a
/// row of hd elements is read by hd/8 threads, 16 bytes each, and reduced by
/// a fixed shuffle tree.
template <int HD>
struct attention_backward_d_traits {
  static constexpr int threads_per_row = HD / 8;
  static constexpr int rows_per_block = attention_threads / threads_per_row;
};

/// True for the head dimensions the kernels are compiled for.
constexpr bool attention_supported_hd(std::int64_t hd) {
  return hd == 32 || hd == 64 || hd == 128;
}

namespace detail {

/// `f(traits<hd>{})`-style dispatch over the supported hd, as a value.
template <template <int> class Traits>
constexpr std::size_t attention_smem_of(std::int64_t hd) {
  return hd == 32    ? Traits<32>::smem_bytes
         : hd == 64  ? Traits<64>::smem_bytes
         : hd == 128 ? Traits<128>::smem_bytes
                     : 0;
}

/// Constant-expression checks of the configuration functions (short
/// messages); the launchers first call attention_check_args, whose messages
/// name every value.
constexpr void attention_config_check(std::int64_t B, std::int64_t S, std::int64_t nh,
                                      std::int64_t nkv, std::int64_t hd) {
  if (B < 1 || S < 1 || nh < 1 || nkv < 1)
    throw config_error("flash attention (cuda): need B, S, nh, nkv >= 1");
  if (nh % nkv != 0) throw config_error("flash attention (cuda): nkv must divide nh");
  if (!attention_supported_hd(hd))
    throw config_error("flash attention (cuda): hd must be 32, 64 or 128");
}

}  // namespace detail

/// Largest S the grids allow: ceil(S / 128) query or key tiles on grid y.
inline constexpr std::int64_t attention_max_S = launch_limits::max_grid_y * 128;

/// Most query heads: a tile of 128 rows spans 128 nh hd elements, addressed
/// with 32-bit offsets (131072 heads at hd 128).
inline constexpr std::int64_t attention_max_heads = (std::int64_t(1) << 31) / (128 * 128);

/// Throws config_error, naming the values and the limit, when the sizes are
/// not supported: a size < 1, nkv not dividing nh, hd not in {32, 64, 128},
/// S > attention_max_S, nh > attention_max_heads, B nh > 2^31 - 1 (grid x).
inline void attention_check_args(const char* fn, std::int64_t B, std::int64_t S, std::int64_t nh,
                                 std::int64_t nkv, std::int64_t hd) {
  TESSERA_THROW_IF(B < 1 || S < 1 || nh < 1 || nkv < 1 || hd < 1, config_error, fn,
                   ": every size must be >= 1, got B=", B, " S=", S, " nh=", nh, " nkv=", nkv,
                   " hd=", hd);
  TESSERA_THROW_IF(nh % nkv != 0, config_error, fn, ": nkv=", nkv, " does not divide nh=", nh,
                   " (grouped-query attention needs nh to be a multiple of nkv)");
  TESSERA_THROW_IF(!attention_supported_hd(hd), config_error, fn, ": hd=", hd,
                   " is not supported; the CUDA kernels are compiled for hd = 32, 64 and 128");
  TESSERA_THROW_IF(S > attention_max_S, config_error, fn, ": S=", S, " exceeds the limit ",
                   attention_max_S, " (65535 tiles of 128 rows on grid y)");
  TESSERA_THROW_IF(nh > attention_max_heads, config_error, fn, ": nh=", nh, " exceeds the limit ",
                   attention_max_heads, " (tile offsets are 32-bit: 128 nh hd < 2^31)");
  TESSERA_THROW_IF(B > launch_limits::max_grid_x / nh, config_error, fn, ": B*nh=", B, "*", nh,
                   " exceeds the grid limit ", launch_limits::max_grid_x);
}

/// The key rows of a ring block's `span` (kernels::attention_span) for S
/// query rows: span.Sk, or S for -1. Throws config_error, naming the value,
/// for an offset < 0, Sk < 1 (other than -1), Sk > attention_max_S (the dK/dV
/// grid), or a global position at or past 2^30 (positions are doc_start's
/// int32 values, and the kernels add tile offsets to their differences in
/// int).
inline std::int64_t attention_check_span(const char* fn, std::int64_t S,
                                         kernels::attention_span span) {
  TESSERA_THROW_IF(span.q0 < 0 || span.k0 < 0, config_error, fn,
                   ": attention_span offsets must be >= 0, got q0=", span.q0, " k0=", span.k0);
  TESSERA_THROW_IF(span.Sk == 0 || span.Sk < -1, config_error, fn, ": attention_span Sk=", span.Sk,
                   " must be >= 1 (key/value rows), or -1 for Sk = S");
  const std::int64_t Sk = span.Sk == -1 ? S : span.Sk;
  TESSERA_THROW_IF(Sk > attention_max_S, config_error, fn, ": attention_span Sk=", Sk,
                   " exceeds the limit ", attention_max_S, " (65535 tiles of 128 keys on grid y)");
  constexpr std::int64_t max_pos = std::int64_t(1) << 30;
  TESSERA_THROW_IF(span.q0 > max_pos - S || span.k0 > max_pos - Sk, config_error, fn,
                   ": attention_span q0=", span.q0, " k0=", span.k0, " with S=", S, " Sk=", Sk,
                   " reaches global position ", max_pos,
                   " (the kernels take positions below 2^30: int differences of int32 positions)");
  return Sk;
}

/// True when kernels::attention_forward / attention_backward on a
/// cuda_context (kernels/cuda/ops.hpp) run the block form of the flash
/// kernels (attention.cuh's attention_form::block: the span's offsets and
/// Sk, float32 outputs), false for the causal kernels (single-rank
/// attention, 16-bit outputs: the code they always had). The block form
/// whenever the caller
/// - asks for a block's float32 partial output (`float_out`: the forward's
///   O = float, which attention_merge combines unrounded),
/// - gives a span: any but the default {0, 0, -1}, the whole-sequence
///   span {0, 0, S} included. That is context parallelism's rank 0
///   diagonal block (queries and keys both at 0): its float32 dq, dk, dv
///   must not be 16-bit values widened, since the ring sums them over
///   blocks and ranks before it rounds once;
/// - or accumulates dq (kernels::attention_dq::accumulate).
/// Float32 gradients of single-rank attention (the default span, dq
/// written) stay on the causal kernels, rounded to T and widened after, as
/// the bf16_mixed trainer has always run them (plan/activations.hpp counts
/// that scratch). A plain function, so that the host tests of the dispatch
/// (tests/kernels/emulated_attention_blocks.cpp) read the same rule.
constexpr bool attention_runs_blocks(bool float_out, kernels::attention_span span,
                                     kernels::attention_dq dq_mode = kernels::attention_dq::write) {
  const bool span_given = span.q0 != 0 || span.k0 != 0 || span.Sk != -1;
  return float_out || span_given || dq_mode == kernels::attention_dq::accumulate;
}

/// Throws config_error when `p` is not aligned to `align` bytes.
inline void attention_check_aligned(const char* fn, const char* name, const void* p,
                                    std::size_t align) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  TESSERA_THROW_IF(p == nullptr || a % align != 0, config_error, fn, ": ", name, "=", p,
                   " must be a non-null device pointer aligned to ", align,
                   " bytes (16-byte cp.async rows)");
}

/// Forward: grid (B nh, ceil(S / 128)), 256 threads, dynamic shared memory
/// attention_forward_traits<hd>::smem_bytes (96 KiB at hd 128, 48 KiB at 64,
/// 24 KiB at 32). Block (x, y) takes (b, h) = (x / nh, x % nh) and query tile
/// ceil(S/128) - 1 - y: the longest (last) tiles start first.
constexpr launch_config attention_forward_config(std::int64_t B, std::int64_t S, std::int64_t nh,
                                                 std::int64_t nkv, std::int64_t hd) {
  detail::attention_config_check(B, S, nh, nkv, hd);
  launch_config c;
  c.grid_x = B * nh;
  c.grid_y = detail::ceil_div(S, attention_forward_traits<128>::q_rows);
  c.block = attention_threads;
  c.dynamic_smem = detail::attention_smem_of<attention_forward_traits>(hd);
  c.smem = c.dynamic_smem;
  return c;
}

/// Backward preprocessing (D = rowsum(dout * out), float32, into the scratch
/// buffer): one block per 256 / (hd / 8) rows of (B, S, nh); scratch_bytes is
/// B nh S floats, the scratch flash_attention_backward needs.
constexpr launch_config attention_backward_d_config(std::int64_t B, std::int64_t S, std::int64_t nh,
                                                    std::int64_t nkv, std::int64_t hd) {
  detail::attention_config_check(B, S, nh, nkv, hd);
  launch_config c;
  const std::int64_t rows_per_block = attention_threads / (hd / 8);
  c.grid_x = detail::ceil_div(B * S * nh, rows_per_block);
  c.block = attention_threads;
  c.scratch_bytes = static_cast<std::size_t>(B * nh * S) * sizeof(float);
  return c;
}

/// Backward dK, dV: grid (B nkv, ceil(S / 128)), 256 threads; block (x, y)
/// takes (b, g) = (x / nkv, x % nkv) and key tile y (the first key tiles see
/// the most queries and start first). Dynamic shared memory
/// attention_backward_kv_traits<hd>::smem_bytes (129.5 KiB at hd 128).
constexpr launch_config attention_backward_kv_config(std::int64_t B, std::int64_t S,
                                                     std::int64_t nh, std::int64_t nkv,
                                                     std::int64_t hd) {
  detail::attention_config_check(B, S, nh, nkv, hd);
  launch_config c;
  c.grid_x = B * nkv;
  c.grid_y = detail::ceil_div(S, attention_backward_kv_traits<128>::k_rows);
  c.block = attention_threads;
  c.dynamic_smem = detail::attention_smem_of<attention_backward_kv_traits>(hd);
  c.smem = c.dynamic_smem;
  return c;
}

/// Backward dQ: grid (B nh, ceil(S / 128)), 256 threads, query tiles in the
/// forward's order. Dynamic shared memory attention_backward_q_traits<hd>::smem_bytes
/// (128 KiB at hd 128).
constexpr launch_config attention_backward_q_config(std::int64_t B, std::int64_t S, std::int64_t nh,
                                                    std::int64_t nkv, std::int64_t hd) {
  detail::attention_config_check(B, S, nh, nkv, hd);
  launch_config c;
  c.grid_x = B * nh;
  c.grid_y = detail::ceil_div(S, attention_backward_q_traits<128>::q_rows);
  c.block = attention_threads;
  c.dynamic_smem = detail::attention_smem_of<attention_backward_q_traits>(hd);
  c.smem = c.dynamic_smem;
  return c;
}

/// Device scratch bytes of the backward: D, B nh S float32 (4 bytes per
/// query row and head: 512 KiB at B 1, S 4096, nh 32).
constexpr std::size_t attention_backward_scratch_bytes(std::int64_t B, std::int64_t S,
                                                       std::int64_t nh, std::int64_t nkv,
                                                       std::int64_t hd) {
  return attention_backward_d_config(B, S, nh, nkv, hd).scratch_bytes;
}

/// True when `c` is within the grid and block limits and its shared memory
/// within `max_smem` (launch_config::valid() holds launches to the 48 KiB
/// that needs no opt-in; the attention kernels opt in).
constexpr bool attention_launch_fits(const launch_config& c, std::size_t max_smem) {
  return c.grid_x >= 1 && c.grid_x <= launch_limits::max_grid_x && c.grid_y >= 1 &&
         c.grid_y <= launch_limits::max_grid_y && c.block >= 1 &&
         c.block <= launch_limits::max_block && c.smem <= max_smem;
}

}  // namespace tessera::kernels::cuda
