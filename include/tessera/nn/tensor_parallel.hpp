#pragma once
/// \file nn/tensor_parallel.hpp
/// Megatron-style tensor parallelism (Shoeybi et al. 2019, "Megatron-LM",
/// section 3): the collectives that change a tensor's placement
/// (core/placement.hpp) and the layer family whose column- and
/// row-parallel layers (nn/linear.hpp) a model on a tp group uses.
///
/// A column-parallel layer splits W (out, in) by output features: rank r
/// of the tp group holds rows [r out/tp, (r+1) out/tp) of W and computes
/// that slice of y = x W^T from the whole (replicated) x, with no
/// communication; its input gradient dx = dy_r W_r is a partial sum over
/// the group. A row-parallel layer splits W by input features: rank r holds
/// columns [r in/tp, (r+1) in/tp) and multiplies its slice of x (the
/// column-parallel layer's output) into a partial sum of y; its input
/// gradient needs no communication. One all_reduce after each row-parallel
/// forward and one after each column-parallel backward (the f and g
/// operators of Megatron-LM's figure 3) make a block compute what one rank
/// computes.
///
/// The layers hold only their shard: `out_features`/`in_features` are this
/// rank's extents, `offset` the shard's first element in its module's
/// segment (nn/segment_hooks.hpp), as nn::linear. With tp = 1 they are the
/// dense layer. Gradient contract (llm.c): weight gradients accumulate
/// (+=), input gradients are written (=) or added with `accumulate`.
///
/// The collectives run on any communicator (comm/communicator.hpp) whose
/// buffer space holds the views; on a one-rank group they move nothing.
/// The views' memory must not be touched by other work while they run; on
/// a GPU the tp communicator must run on the stream of the context whose
/// kernels produced and consume the views (one stream orders them, as the
/// data-parallel engine requires). `out` of reduce_scatter and all_gather
/// must not overlap their input.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>
#include <type_traits>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/placement.hpp"
#include "tessera/nn/linear.hpp"

namespace tessera::nn {

// ---- the collectives that change placement ------------------------------------------------

/// Sums a partial-sum tensor over `tp` in place: the view, now complete
/// and the same on every rank. Traffic: comm::ring_all_reduce_bytes of
/// numel elements. Throws what the communicator throws (timeouts name the
/// rank and the operation).
template <class Comm, class T>
replicated<T> all_reduce(Comm& tp, partial_sum<T> p) {
  static_assert(!std::is_const_v<T>, "all_reduce sums in place: the view must be writable");
  if (tp.size() == 1) return {p.data, p.rows, p.cols};
  const auto n = static_cast<std::size_t>(p.numel());
  if constexpr (requires(T* d) { tp.all_reduce(d, n, comm::reduce_op::sum); }) {
    tp.all_reduce(p.data, n, comm::reduce_op::sum);
  } else {
    // A 16-bit tensor on a communicator that moves float and double (the
    // host's): widened exactly to float, summed in float, rounded once.
    // The traffic is then that of n floats.
    static_assert(sizeof(T) == 2 && comm::buffer_space_of<Comm> == comm::buffer_space::host,
                  "all_reduce: this communicator cannot move the tensor's element type");
    thread_local std::vector<float> wide;
    if (wide.size() < n) wide.resize(n);
    for (std::size_t i = 0; i < n; ++i) wide[i] = to<float>(p.data[i]);
    tp.all_reduce(wide.data(), n, comm::reduce_op::sum);
    for (std::size_t i = 0; i < n; ++i) p.data[i] = to<T>(wide[i]);
  }
  return {p.data, p.rows, p.cols};
}

/// Sums a partial-sum (rows, cols) tensor over `tp` and leaves this rank's
/// rows [r rows/tp, (r+1) rows/tp) in `out` (rows/tp, cols): the
/// sequence-parallel form of all_reduce. Throws config_error when tp does
/// not divide rows. Traffic: (tp-1) rows/tp cols elements.
template <class Comm, class T>
token_sharded<T> reduce_scatter(Comm& tp, std::type_identity_t<partial_sum<const T>> p, T* out) {
  const shard_range s = even_shard(p.rows, tp.size(), tp.rank(), "rows (tokens)");
  const auto chunk = static_cast<std::size_t>(s.count * p.cols);
  tp.reduce_scatter(p.data, out, chunk, comm::reduce_op::sum);
  return {out, s.count, p.cols};
}

/// Gathers every rank's rows of a token-sharded tensor into `out`
/// (tp rows, cols), in rank order: the complete tensor. Traffic: (tp-1)
/// rows cols elements.
template <class Comm, class T>
replicated<T> all_gather(Comm& tp, std::type_identity_t<token_sharded<const T>> s, T* out) {
  tp.all_gather(s.data, out, static_cast<std::size_t>(s.numel()));
  return {out, s.rows * tp.size(), s.cols};
}

// ---- the layer family ---------------------------------------------------------------------

/// The layer family of a tensor-parallel model (nn/linear.hpp's seam):
/// column- and row-parallel layers whose partial sums are reduced over the
/// tp group `group` (not owned; it must outlive the model).
template <class Comm>
struct tensor_parallel_layers {
  using column = column_parallel_linear;  ///< q, k, v, gate, up
  using row = row_parallel_linear;        ///< attention output, down
  Comm* group = nullptr;                  ///< the tp group
  /// When set, each all_reduce adds its wall time in seconds here (the
  /// communication share a benchmark reports; not owned).
  double* comm_seconds = nullptr;

  /// Sums a partial-sum tensor over the group (nn::all_reduce).
  template <class T>
  replicated<T> all_reduce(partial_sum<T> p) const {
    if (comm_seconds == nullptr) return nn::all_reduce(checked(), p);
    const auto t0 = std::chrono::steady_clock::now();
    const replicated<T> r = nn::all_reduce(checked(), p);
    *comm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }
  /// Reduces n values (context memory) in place over the group: their
  /// maximum with `max`, else their sum.
  template <class T>
  void all_reduce_values(T* v, std::size_t n, bool max) const {
    const auto t0 = std::chrono::steady_clock::now();
    checked().all_reduce(v, n, max ? comm::reduce_op::max : comm::reduce_op::sum);
    if (comm_seconds != nullptr)
      *comm_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  static constexpr bool tensor_parallel = true;

  /// The group's size and this rank's index in it. Throws config_error
  /// when no group was given.
  [[nodiscard]] int size() const { return checked().size(); }
  [[nodiscard]] int rank() const { return checked().rank(); }

 private:
  Comm& checked() const {
    TESSERA_THROW_IF(group == nullptr, config_error,
                     "tensor_parallel_layers: no tp group (set `group` to the rank's tp "
                     "communicator, e.g. comm::make_groups(world, mesh).tp)");
    return *group;
  }
};

}  // namespace tessera::nn
