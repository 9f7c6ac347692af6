#pragma once
/// \file detail/attention_host.hpp
/// The register-blocked tile products of the host attention kernels
/// (kernels/attention.hpp): scores S = Q K^T, row updates O += P V and
/// dQ += dS K, and column updates dV += P^T dO and dK += dS^T Q, over one
/// (query tile, key tile) pair under the causal mask.
///
/// Each output element is summed in the same order as a row-at-a-time loop
/// would sum it (scores over d; a row update over keys c ascending; a column
/// update over rows r ascending), with the same `acc += a * b` expression,
/// so blocking changes no bit: it only keeps `attention_block_rows` rows of
/// `attention_lanes` accumulators in registers, so that each load of the
/// shared operand feeds several multiply-adds.
///
/// Causal mask of a tile pair: row r sees the keys c <= r + diag (diag =
/// t0 - s0, the first query position minus the first key position) and
/// c < nk; the rows that see none are not passed.

#include <algorithm>
#include <cstdint>

#include "tessera/core/config.hpp"

namespace tessera::kernels::detail {

/// Columns (of a score tile) or elements (of a head row) one register block
/// holds per row.
inline constexpr std::int64_t attention_lanes = 32;
/// Rows one register block holds.
inline constexpr std::int64_t attention_block_rows = 4;

/// n rounded up to a multiple of attention_lanes: the leading dimension of
/// the transposed K and V tiles and of the score tiles, whose padding columns
/// the score kernel may write.
inline std::int64_t attention_padded(std::int64_t n) {
  return (n + attention_lanes - 1) / attention_lanes * attention_lanes;
}

/// Keys row r sees: min(nk, r + diag + 1), at least 0.
inline std::int64_t attention_row_keys(std::int64_t r, std::int64_t diag, std::int64_t nk) {
  return std::clamp<std::int64_t>(r + diag + 1, 0, nk);
}

/// s[r * lds + c] = sum_d a[r * hd + d] * bt[d * ldb + c] (d ascending) for
/// r < rows and c < attention_padded(n); columns >= n are garbage. `bt` is a
/// transposed (hd, ldb) tile, ldb and lds >= attention_padded(n).
template <class A>
void attention_tile_scores(A* s, std::int64_t lds, const A* a, const A* bt, std::int64_t ldb,
                           std::int64_t rows, std::int64_t n, std::int64_t hd) {
  constexpr std::int64_t W = attention_lanes, R = attention_block_rows;
  for (std::int64_t c0 = 0; c0 < n; c0 += W) {
    std::int64_t r = 0;
    for (; r + R <= rows; r += R) {
      A acc[R][W] = {};
      const A* ar = a + r * hd;
      for (std::int64_t d = 0; d < hd; ++d) {
        const A* b = bt + d * ldb + c0;
        const A x0 = ar[d], x1 = ar[hd + d], x2 = ar[2 * hd + d], x3 = ar[3 * hd + d];
        TESSERA_SIMD
        for (std::int64_t j = 0; j < W; ++j) {
          acc[0][j] += x0 * b[j];
          acc[1][j] += x1 * b[j];
          acc[2][j] += x2 * b[j];
          acc[3][j] += x3 * b[j];
        }
      }
      for (std::int64_t i = 0; i < R; ++i) {
        TESSERA_SIMD
        for (std::int64_t j = 0; j < W; ++j) s[(r + i) * lds + c0 + j] = acc[i][j];
      }
    }
    for (; r < rows; ++r) {
      A acc[W] = {};
      for (std::int64_t d = 0; d < hd; ++d) {
        const A* b = bt + d * ldb + c0;
        const A x = a[r * hd + d];
        TESSERA_SIMD
        for (std::int64_t j = 0; j < W; ++j) acc[j] += x * b[j];
      }
      TESSERA_SIMD
      for (std::int64_t j = 0; j < W; ++j) s[r * lds + c0 + j] = acc[j];
    }
  }
}

/// y[r * ldy + d] += sum over the keys c row r sees (c ascending) of
/// p[r * ldp + c] * x[c * hd + d], for r < rows, d < hd: O += P V, dQ += dS K.
template <class A>
void attention_tile_rows_acc(A* y, std::int64_t ldy, const A* p, std::int64_t ldp, const A* x,
                             std::int64_t rows, std::int64_t diag, std::int64_t nk,
                             std::int64_t hd) {
  constexpr std::int64_t W = attention_lanes, R = attention_block_rows;
  // One row's elements [d0, d0 + nd) over keys [c_begin, c_end).
  auto one_row = [&](std::int64_t r, std::int64_t d0, std::int64_t nd, std::int64_t c_begin,
                     std::int64_t c_end) {
    A* yr = y + r * ldy + d0;
    for (std::int64_t c = c_begin; c < c_end; ++c) {
      const A pc = p[r * ldp + c];
      const A* xc = x + c * hd + d0;
      TESSERA_SIMD
      for (std::int64_t j = 0; j < nd; ++j) yr[j] += pc * xc[j];
    }
  };
  std::int64_t d0 = 0;
  for (; d0 + W <= hd; d0 += W) {
    std::int64_t r = 0;
    for (; r + R <= rows; r += R) {
      // Keys every row of the block sees (the first row sees the fewest).
      const std::int64_t common = attention_row_keys(r, diag, nk);
      A acc[R][W];
      for (std::int64_t i = 0; i < R; ++i) {
        TESSERA_SIMD
        for (std::int64_t j = 0; j < W; ++j) acc[i][j] = y[(r + i) * ldy + d0 + j];
      }
      for (std::int64_t c = 0; c < common; ++c) {
        const A* xc = x + c * hd + d0;
        const A p0 = p[r * ldp + c], p1 = p[(r + 1) * ldp + c], p2 = p[(r + 2) * ldp + c],
                p3 = p[(r + 3) * ldp + c];
        TESSERA_SIMD
        for (std::int64_t j = 0; j < W; ++j) {
          acc[0][j] += p0 * xc[j];
          acc[1][j] += p1 * xc[j];
          acc[2][j] += p2 * xc[j];
          acc[3][j] += p3 * xc[j];
        }
      }
      for (std::int64_t i = 0; i < R; ++i) {
        TESSERA_SIMD
        for (std::int64_t j = 0; j < W; ++j) y[(r + i) * ldy + d0 + j] = acc[i][j];
        // The keys this row sees beyond the common ones, continuing in order.
        one_row(r + i, d0, W, common, attention_row_keys(r + i, diag, nk));
      }
    }
    for (; r < rows; ++r) one_row(r, d0, W, 0, attention_row_keys(r, diag, nk));
  }
  if (d0 < hd)
    for (std::int64_t r = 0; r < rows; ++r) one_row(r, d0, hd - d0, 0, attention_row_keys(r, diag, nk));
}

/// y[c * hd + d] += sum over the rows r that see key c (r ascending) of
/// p[r * ldp + c] * x[r * hd + d], for c < nk, d < hd: dV += P^T dO,
/// dK += dS^T Q.
template <class A>
void attention_tile_cols_acc(A* y, const A* p, std::int64_t ldp, const A* x, std::int64_t rows,
                             std::int64_t diag, std::int64_t nk, std::int64_t hd) {
  constexpr std::int64_t W = attention_lanes, R = attention_block_rows;
  // First row that sees key c (rows see more keys as r grows).
  auto first_row = [&](std::int64_t c) { return std::clamp<std::int64_t>(c - diag, 0, rows); };
  auto one_key = [&](std::int64_t c, std::int64_t d0, std::int64_t nd, std::int64_t r_begin,
                     std::int64_t r_end) {
    A* yc = y + c * hd + d0;
    for (std::int64_t r = r_begin; r < r_end; ++r) {
      const A pr = p[r * ldp + c];
      const A* xr = x + r * hd + d0;
      TESSERA_SIMD
      for (std::int64_t j = 0; j < nd; ++j) yc[j] += pr * xr[j];
    }
  };
  std::int64_t d0 = 0;
  for (; d0 + W <= hd; d0 += W) {
    std::int64_t c = 0;
    for (; c + R <= nk; c += R) {
      // Rows every key of the block is seen by (the last key by the fewest),
      // after each key's own earlier rows, so each sums rows in order.
      const std::int64_t common = first_row(c + R - 1);
      for (std::int64_t i = 0; i < R; ++i) one_key(c + i, d0, W, first_row(c + i), common);
      A acc[R][W];
      for (std::int64_t i = 0; i < R; ++i) {
        TESSERA_SIMD
        for (std::int64_t j = 0; j < W; ++j) acc[i][j] = y[(c + i) * hd + d0 + j];
      }
      for (std::int64_t r = common; r < rows; ++r) {
        const A* xr = x + r * hd + d0;
        const A* pr = p + r * ldp + c;
        const A p0 = pr[0], p1 = pr[1], p2 = pr[2], p3 = pr[3];
        TESSERA_SIMD
        for (std::int64_t j = 0; j < W; ++j) {
          acc[0][j] += p0 * xr[j];
          acc[1][j] += p1 * xr[j];
          acc[2][j] += p2 * xr[j];
          acc[3][j] += p3 * xr[j];
        }
      }
      for (std::int64_t i = 0; i < R; ++i) {
        TESSERA_SIMD
        for (std::int64_t j = 0; j < W; ++j) y[(c + i) * hd + d0 + j] = acc[i][j];
      }
    }
    for (; c < nk; ++c) one_key(c, d0, W, first_row(c), rows);
  }
  if (d0 < hd)
    for (std::int64_t c = 0; c < nk; ++c) one_key(c, d0, hd - d0, first_row(c), rows);
}

}  // namespace tessera::kernels::detail
