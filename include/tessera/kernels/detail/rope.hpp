#pragma once
/// \file detail/rope.hpp
/// Per-pair rotary position embedding arithmetic (Llama "rotate half"
/// convention), shared by the host loop and the CUDA kernel. For a head
/// vector x of size hd, pair i (0 <= i < hd/2) is (x[i], x[i + hd/2]) and is
/// rotated by angle pos * theta^(-2i/hd):
///   forward   y1 = x1 cos - x2 sin,   y2 = x2 cos + x1 sin
///   backward  the transpose: dx1 = dy1 cos + dy2 sin,  dx2 = dy2 cos - dy1 sin
/// Source: Su et al., "RoFormer", 2021, eq. 34; the half-split pairing of
/// Hugging Face's LlamaRotaryEmbedding / rotate_half.

#include <cmath>
#include <cstdint>

#include "tessera/core/config.hpp"

namespace tessera::kernels::detail {

/// The unscaled RoPE inverse frequency of pair i of a head of hd dims,
/// theta^(-2i/hd), in double (host; the tables are built on the host). The
/// one definition that rope_table and nn's scaled frequencies
/// (nn/rope_scaling.hpp) both start from.
inline double rope_inv_freq(std::int64_t i, std::int64_t hd, double theta) {
  return std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
}

/// Position RoPE rotates token bt (= b T + t) of a (B, T) batch by: t, or
/// with packed documents its position in its document, t - doc_start[bt]
/// (doc_start (B, T) int32: the first position of each token's document,
/// kernels::attention_mask).
TESSERA_HOST_DEVICE inline std::int64_t rope_position(const std::int32_t* doc_start,
                                                      std::int64_t bt, std::int64_t T) {
  const std::int64_t t = bt % T;
  return doc_start == nullptr ? t : t - static_cast<std::int64_t>(doc_start[bt]);
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
