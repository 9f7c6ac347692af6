#pragma once
/// \file kernels/detail/weight_init.hpp
/// The arithmetic of kernels::weight_init (kernels/weight_init.hpp), shared
/// by the host loop and the Thrust algorithm of kernels/cuda/weight_init.cuh:
/// element i of a flat parameter buffer as a function of i alone, so any
/// range, any thread and the GPU compute it without drawing what comes
/// before it.

#include <algorithm>
#include <cstdint>
#include <span>

#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/random.hpp"

namespace tessera::kernels {

/// How a tensor's elements start.
enum class weight_init_kind : std::uint8_t {
  ones,    ///< every element 1 (norm gains)
  normal,  ///< scale * N(0, 1), element k of the whole tensor from its counter stream
};

/// One tensor of a flat parameter buffer, as kernels::weight_init reads it
/// (plain data: the layers above build it, e.g. nn::llama_weight_init_tensors).
/// The tensor holds flat elements [offset, offset + numel): local element j
/// (row-major over the held shape (numel / cols, cols)) is element w of the
/// whole tensor (row-major, full_cols columns, full_numel elements):
///   shard_dim -1 (whole):   w = j
///   shard_dim  0 (rows):    w = shard_begin * cols + j
///   shard_dim  1 (columns): w = (j / cols) * full_cols + shard_begin + j % cols
/// (nn::param_entry::full_index), and w >= full_numel is a padding row: 0.
/// A normal tensor's element w is scale * normal_at(start, w).
struct weight_init_tensor {
  std::int64_t offset = 0;       ///< first element in the flat buffer
  std::int64_t numel = 0;        ///< elements held (this rank's shard)
  std::int64_t cols = 1;         ///< columns of the held shard (1 for a vector)
  std::int64_t full_cols = 1;    ///< columns of the whole tensor
  std::int64_t full_numel = 0;   ///< elements of the whole tensor
  std::int64_t shard_begin = 0;  ///< first row (shard_dim 0) or column (1) held
  int shard_dim = -1;            ///< -1 whole, 0 rows, 1 columns
  weight_init_kind kind = weight_init_kind::normal;
  std::uint64_t start = 0;  ///< the stream's counter (rng_start of the tensor's seed)
  double scale = 0;         ///< standard deviation of a normal tensor
};

namespace detail {

/// The whole tensor's element that local element j of `t` holds
/// (weight_init_tensor's table). Precondition: 0 <= j < t.numel.
TESSERA_HOST_DEVICE inline std::int64_t weight_init_full_index(const weight_init_tensor& t,
                                                               std::int64_t j) {
  if (t.shard_dim == 0) return t.shard_begin * t.cols + j;
  if (t.shard_dim == 1) return (j / t.cols) * t.full_cols + t.shard_begin + j % t.cols;
  return j;
}

/// Flat element i of a buffer whose tensor at or after i is `t`: 0 before
/// t.offset (alignment padding) and on padding rows, 1 for a ones tensor,
/// Param(scale * normal_at(start, w)) for a normal one, rounded once from
/// double. Precondition: i < t.offset + t.numel.
template <class Param>
TESSERA_HOST_DEVICE inline Param weight_init_value(const weight_init_tensor& t, std::int64_t i) {
  if (i < t.offset) return to<Param>(0.0);
  if (t.kind == weight_init_kind::ones) return to<Param>(1.0);
  const std::int64_t w = weight_init_full_index(t, i - t.offset);
  if (w >= t.full_numel) return to<Param>(0.0);
  return to<Param>(t.scale * normal_at(t.start, static_cast<std::uint64_t>(w)));
}

/// Splits flat elements [lo, hi) into consecutive segments, one per tensor
/// (the alignment padding before it and its elements) and a last one for
/// what follows the last tensor, and calls f(t, b, e) for each non-empty
/// segment [b, e): every element i of it is weight_init_value(t, i) (the
/// last segment's t starts at hi, so its elements are 0). Host code; each
/// caller chooses how to run a segment (an OpenMP loop, a Thrust call).
/// Throws config_error for lo < 0, hi < lo, or a tensor with a negative
/// size, cols < 1, shard_dim outside {-1, 0, 1}, or an offset before the
/// previous tensor's end (tensors must be sorted and disjoint).
template <class F>
void for_each_weight_init_segment(std::span<const weight_init_tensor> tensors, std::int64_t lo,
                                  std::int64_t hi, F&& f) {
  TESSERA_THROW_IF(lo < 0 || hi < lo, config_error, "weight_init: range [", lo, ", ", hi,
                   ") is not a range of a flat buffer (0 <= lo <= hi)");
  std::int64_t begin = 0;  // the current segment's first element
  for (const weight_init_tensor& t : tensors) {
    TESSERA_THROW_IF(t.numel < 0 || t.full_numel < 0 || t.cols < 1 || t.full_cols < 1 ||
                         t.shard_dim < -1 || t.shard_dim > 1,
                     config_error, "weight_init: the tensor at offset ", t.offset,
                     " has numel=", t.numel, ", full_numel=", t.full_numel, ", cols=", t.cols,
                     ", full_cols=", t.full_cols, ", shard_dim=", t.shard_dim,
                     " (sizes >= 0, columns >= 1, shard_dim -1, 0 or 1)");
    TESSERA_THROW_IF(t.offset < begin, config_error, "weight_init: the tensor at offset ", t.offset,
                     " starts before the previous one ends (", begin,
                     "): tensors must be sorted by offset and disjoint");
    const std::int64_t end = t.offset + t.numel;
    const std::int64_t b = std::max(lo, begin), e = std::min(hi, end);
    if (b < e) f(t, b, e);
    begin = end;
  }
  if (std::max(lo, begin) < hi) {
    weight_init_tensor none;
    none.offset = hi;  // every element before it is padding: 0
    f(static_cast<const weight_init_tensor&>(none), std::max(lo, begin), hi);
  }
}

}  // namespace detail
}  // namespace tessera::kernels
