#pragma once
/// \file detail/rope.hpp
/// Per-pair rotary position embedding arithmetic (Llama "rotate half"
/// convention) and the positions it rotates by (rope_positions), shared by
/// the host loop and the CUDA kernel. For a head vector x of size hd, pair i
/// (0 <= i < hd/2) is (x[i], x[i + hd/2]) and is rotated by angle
/// pos * theta^(-2i/hd):
///   forward   y1 = x1 cos - x2 sin,   y2 = x2 cos + x1 sin
///   backward  the transpose: dx1 = dy1 cos + dy2 sin,  dx2 = dy2 cos - dy1 sin
/// Source: Su et al., "RoFormer", 2021, eq. 34; the half-split pairing of
/// Hugging Face's LlamaRotaryEmbedding / rotate_half.

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tessera/core/config.hpp"
#include "tessera/core/cp_shard.hpp"
#include "tessera/core/error.hpp"

namespace tessera::kernels {

/// Which position RoPE rotates each token of a (B, T) batch by, and so
/// which row of the (rows, hd/2) tables it reads (kernels::rope_forward,
/// cuda::rope_forward). A trivially copyable value, passed by value to the
/// host loop and the CUDA kernels alike.
///
/// Local token t of row b (0 <= t < T, the call's T) is at global position
///   g = t + head_offset  for t < split,   g = t + tail_offset  otherwise,
/// and is rotated by g, or with packed documents by g - doc_start[b T + t],
/// its position in its document.
/// - Default (and from a doc_start pointer alone): split = offsets = 0,
///   every token at t: a batch of whole sequences.
/// - `of(cp_shard)`: context parallelism, a rank's T = s.tokens() local
///   tokens in head-tail order at their global positions
///   cp_shard::position(t) (core/cp_shard.hpp).
/// - `doc_start` (B, T) int32, row-major, or null: the GLOBAL position of
///   the first token of each token's document (kernels::attention_mask's
///   array, the same values on one rank or on cp ranks). A plain pointer
///   read where the kernel runs: host memory for the host loop, device
///   memory for the CUDA kernels.
/// - Precondition: every token's position lies in [0, rows) of the tables
///   the call is given, i.e. the tables cover the whole sequence (all
///   T cp tokens on a cp rank), and doc_start[b T + t] <= g.
struct rope_positions {
  const std::int32_t* doc_start = nullptr;  ///< (B, T) int32 or null: documents' global starts
  std::int64_t split = 0;                   ///< local tokens t < split are the head chunk
  std::int64_t head_offset = 0;             ///< global position - t of a head token (t < split)
  std::int64_t tail_offset = 0;             ///< global position - t of a tail token (t >= split)

  /// Every token at t: whole sequences, no documents.
  constexpr rope_positions() = default;
  /// Every token at t, in its document of `starts` (the doc_start array,
  /// or null: none).
  /// Implicit, so that a doc_start pointer (or nullptr) can be passed
  /// where a rope_positions is taken.
  constexpr rope_positions(const std::int32_t* starts) : doc_start(starts) {}  // NOLINT: implicit

  /// The positions of shard `s`'s local tokens (s.tokens() of them a row):
  /// local t at cp_shard::position(t), so s.start(0) + t for t < s.chunk()
  /// and s.start(1) + t - s.chunk() after, in the documents of the local
  /// `doc_start` (B, s.tokens()) of global starts, or null. cp = 1 gives
  /// every token at t.
  static constexpr rope_positions of(const cp_shard& s, const std::int32_t* doc_start = nullptr) {
    rope_positions p(doc_start);
    p.split = s.chunk();
    p.head_offset = s.start(0);
    p.tail_offset = s.start(1) - s.chunk();
    return p;
  }
};
static_assert(std::is_trivially_copyable_v<rope_positions>,
              "rope_positions is a kernel argument: copied by value to the GPU");

}  // namespace tessera::kernels

namespace tessera::kernels::detail {

/// The unscaled RoPE inverse frequency of pair i of a head of hd dims,
/// theta^(-2i/hd), in double (host; the tables are built on the host). The
/// one definition that rope_table and nn's scaled frequencies
/// (nn/rope_scaling.hpp) both start from.
inline double rope_inv_freq(std::int64_t i, std::int64_t hd, double theta) {
  return std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
}

/// The position RoPE rotates token bt (= b T + t) of a (B, T) batch by:
/// rope_positions' global position of t less, with packed documents, its
/// document's start.
TESSERA_HOST_DEVICE inline std::int64_t rope_position(const rope_positions& p, std::int64_t bt,
                                                      std::int64_t T) {
  const std::int64_t t = bt % T;
  const std::int64_t g = t + (t < p.split ? p.head_offset : p.tail_offset);
  return p.doc_start == nullptr ? g : g - static_cast<std::int64_t>(p.doc_start[bt]);
}

/// Host check of a call's positions against its T tokens a row: throws
/// config_error naming the value unless 0 <= split <= T and both offsets
/// are >= 0 (a negative one would read before row 0 of the tables). That
/// the tables hold every position is the caller's precondition.
inline void check_rope_positions(const char* who, const rope_positions& p, std::int64_t T) {
  TESSERA_THROW_IF(p.split < 0 || p.split > T, config_error, who,
                   ": rope_positions split=", p.split, " is not in [0, T=", T, "]");
  TESSERA_THROW_IF(p.head_offset < 0 || p.tail_offset < 0, config_error, who,
                   ": rope_positions offsets head_offset=", p.head_offset,
                   " tail_offset=", p.tail_offset, " must be >= 0 (global positions)");
}

template <class A>
TESSERA_HOST_DEVICE inline void rope_rotate(A x1, A x2, A c, A s, A& y1, A& y2) {
  y1 = x1 * c - x2 * s;
  y2 = x2 * c + x1 * s;
}

template <class A>
TESSERA_HOST_DEVICE inline void rope_rotate_transpose(A dy1, A dy2, A c, A s, A& dx1, A& dx2) {
  dx1 = dy1 * c + dy2 * s;
  dx2 = dy2 * c - dy1 * s;
}

}  // namespace tessera::kernels::detail
