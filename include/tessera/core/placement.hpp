#pragma once
/// \file core/placement.hpp
/// Placement in the type (DESIGN.md, principle 7): how the values of a
/// tensor are spread over the ranks of a tensor-parallel group.
///
///   replicated<T>     every rank holds the whole tensor, the same values
///   partial_sum<T>    every rank holds a tensor of the whole shape whose
///                     sum over the group is the value (a row-parallel
///                     GEMM's output, a column-parallel layer's input
///                     gradient, before their reduction)
///   sharded<T, D>     every rank holds its slice along dimension D of a
///                     (rows, cols) tensor: D = 0 rows (tokens, under
///                     sequence parallelism), D = 1 columns (features: a
///                     column-parallel GEMM's output, by heads or by F)
///
/// Each is a non-owning view of a row-major (rows, cols) block of this
/// rank's memory: `rows` and `cols` are the local extents. Only the
/// matching collective (nn/tensor_parallel.hpp: all_reduce, reduce_scatter,
/// all_gather) turns one placement into another. A partial-sum or
/// feature-sharded tensor handed where a complete one is needed (a norm, a
/// residual add, a column-parallel layer) does not compile: its only
/// conversion fails with a message naming the collective it lacks.
///
/// A view of `const T` is made from a view of `T` implicitly, never the
/// other way.

#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"

namespace tessera {

namespace detail {
template <class>
inline constexpr bool placement_always_false = false;
}  // namespace detail

/// A tensor every rank of its group holds whole and identical.
template <class T>
struct replicated {
  T* data = nullptr;
  std::int64_t rows = 0, cols = 0;
  /// Elements of the local block (rows * cols).
  [[nodiscard]] std::int64_t numel() const { return rows * cols; }
  /// The read-only view. (A template, so that replicated<const T> declares
  /// no conversion to its own type, which nvcc warns about: #554-D.)
  template <class U>
  requires(std::is_same_v<U, const T> && !std::is_const_v<T>) operator replicated<U>() const {
    return {data, rows, cols};
  }
};

/// A tensor whose value is the sum over its group of every rank's block.
/// Converts to nothing: all_reduce (or reduce_scatter) it first.
template <class T>
struct partial_sum {
  T* data = nullptr;
  std::int64_t rows = 0, cols = 0;
  [[nodiscard]] std::int64_t numel() const { return rows * cols; }
  template <class U>
  requires(std::is_same_v<U, const T> && !std::is_const_v<T>) operator partial_sum<U>() const {
    return {data, rows, cols};
  }
  /// Poisoned: a norm, a residual add or a column-parallel layer needs the
  /// complete value.
  template <class U>
  operator replicated<U>() const {
    static_assert(detail::placement_always_false<U>,
                  "missing all_reduce: this tensor holds partial sums over the tensor-parallel "
                  "group (a row-parallel layer's output or a column-parallel layer's input "
                  "gradient); all_reduce it (reduce_scatter under sequence parallelism) before "
                  "a norm, a residual add or a column-parallel layer");
    return {};
  }
};

/// A tensor each rank of its group holds a slice of along dimension `D`
/// (0: rows, 1: columns); `rows` and `cols` are the slice's extents.
template <class T, int D>
struct sharded {
  static_assert(D == 0 || D == 1, "tessera::sharded: D is 0 (rows) or 1 (columns)");
  T* data = nullptr;
  std::int64_t rows = 0, cols = 0;
  [[nodiscard]] std::int64_t numel() const { return rows * cols; }
  template <class U>
  requires(std::is_same_v<U, const T> && !std::is_const_v<T>) operator sharded<U, D>() const {
    return {data, rows, cols};
  }
  /// Poisoned: the complete tensor is needed; all_gather it first.
  template <class U>
  operator replicated<U>() const {
    static_assert(detail::placement_always_false<U>,
                  "missing all_gather: this tensor is sharded over the tensor-parallel group; "
                  "all_gather it before a layer that needs the whole tensor");
    return {};
  }
};

/// Feature-sharded (columns): a column-parallel layer's output.
template <class T>
using feature_sharded = sharded<T, 1>;
/// Token-sharded (rows): the norm and residual regions under sequence
/// parallelism.
template <class T>
using token_sharded = sharded<T, 0>;

// ---- shards ------------------------------------------------------------------------------

/// The slice [begin, begin + count) rank `rank` of `tp` holds of `n` items
/// split evenly (`what` names them in the error). Throws config_error
/// naming n, tp and the item when tp does not divide n, or tp < 1, or rank
/// is outside [0, tp).
struct shard_range {
  std::int64_t begin = 0, count = 0;
};
inline shard_range even_shard(std::int64_t n, int tp, int rank, const char* what) {
  TESSERA_THROW_IF(tp < 1, config_error, "tensor parallelism: tp=", tp, " must be >= 1");
  TESSERA_THROW_IF(rank < 0 || rank >= tp, config_error, "tensor parallelism: rank ", rank,
                   " is not in [0, ", tp, ")");
  TESSERA_THROW_IF(n % tp != 0, config_error, "tensor parallelism: ", what, "=", n,
                   " is not divisible by tp=", tp);
  const std::int64_t c = n / tp;
  return {c * rank, c};
}

}  // namespace tessera
