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

namespace tessera::detail {
// 16-bit tensors on a communicator that moves float and double (the
// host's): widened exactly to float, moved in float, rounded once. The
// traffic is then that of floats.
template <class Comm, class T>
inline constexpr bool tp_moves_natively = requires(Comm& c, T* d, const T* cd, std::size_t n) {
  c.all_reduce(d, n, comm::reduce_op::sum);
  c.all_gather(cd, d, n);
  c.reduce_scatter(cd, d, n, comm::reduce_op::sum);
};
template <class Comm, class T>
void tp_check_widenable() {
  static_assert(sizeof(T) == 2 && comm::buffer_space_of<Comm> == comm::buffer_space::host,
                "tensor parallelism: this communicator cannot move the tensor's element type");
}
inline std::vector<float>& tp_wide_buffer(int which, std::size_t n) {
  thread_local std::vector<float> buf[2];
  if (buf[which].size() < n) buf[which].resize(n);
  return buf[which];
}
template <class T>
void tp_widen(float* out, const T* in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = to<float>(in[i]);
}
template <class T>
void tp_narrow(T* out, const float* in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = to<T>(in[i]);
}
}  // namespace tessera::detail

namespace tessera::nn {

// ---- the collectives that change placement ------------------------------------------------

/// Sums a partial-sum tensor over `tp` in place: the view, now complete
/// and the same on every rank. Traffic: comm::ring_all_reduce_bytes of
/// numel elements (16-bit elements travel as float on host communicators).
/// Throws what the communicator throws (timeouts name the rank and the
/// operation).
template <class Comm, class T>
replicated<T> all_reduce(Comm& tp, partial_sum<T> p) {
  static_assert(!std::is_const_v<T>, "all_reduce sums in place: the view must be writable");
  if (tp.size() == 1) return {p.data, p.rows, p.cols};
  const auto n = static_cast<std::size_t>(p.numel());
  if constexpr (tessera::detail::tp_moves_natively<Comm, T>) {
    tp.all_reduce(p.data, n, comm::reduce_op::sum);
  } else {
    tessera::detail::tp_check_widenable<Comm, T>();
    std::vector<float>& w = tessera::detail::tp_wide_buffer(0, n);
    tessera::detail::tp_widen(w.data(), p.data, n);
    tp.all_reduce(w.data(), n, comm::reduce_op::sum);
    tessera::detail::tp_narrow(p.data, w.data(), n);
  }
  return {p.data, p.rows, p.cols};
}

/// Sums a partial-sum (rows, cols) tensor over `tp` and leaves this rank's
/// rows [r rows/tp, (r+1) rows/tp) in `out` (rows/tp, cols): the
/// sequence-parallel form of all_reduce (Korthikanti et al. 2022, "Reducing
/// Activation Recomputation in Large Transformer Models", section 4.2.2).
/// `out` must not overlap the input. Throws config_error naming rows and tp
/// when tp does not divide rows. Traffic: (tp-1) rows/tp cols elements.
template <class Comm, class T>
token_sharded<T> reduce_scatter(Comm& tp, std::type_identity_t<partial_sum<const T>> p, T* out) {
  const shard_range s = even_shard(p.rows, tp.size(), tp.rank(), "rows (tokens)");
  const auto chunk = static_cast<std::size_t>(s.count * p.cols);
  if constexpr (tessera::detail::tp_moves_natively<Comm, T>) {
    tp.reduce_scatter(p.data, out, chunk, comm::reduce_op::sum);
  } else {
    tessera::detail::tp_check_widenable<Comm, T>();
    const std::size_t n = chunk * static_cast<std::size_t>(tp.size());
    std::vector<float>& w = tessera::detail::tp_wide_buffer(0, n);
    std::vector<float>& o = tessera::detail::tp_wide_buffer(1, chunk);
    tessera::detail::tp_widen(w.data(), p.data, n);
    tp.reduce_scatter(w.data(), o.data(), chunk, comm::reduce_op::sum);
    tessera::detail::tp_narrow(out, o.data(), chunk);
  }
  return {out, s.count, p.cols};
}

/// Gathers every rank's rows of a token-sharded tensor into `out`
/// (tp rows, cols), in rank order: the complete tensor. `out` must not
/// overlap the input. Traffic: (tp-1) rows cols elements.
template <class Comm, class T>
replicated<T> all_gather(Comm& tp, std::type_identity_t<token_sharded<const T>> s, T* out) {
  const auto n = static_cast<std::size_t>(s.numel());
  if constexpr (tessera::detail::tp_moves_natively<Comm, T>) {
    tp.all_gather(s.data, out, n);
  } else {
    tessera::detail::tp_check_widenable<Comm, T>();
    const std::size_t all = n * static_cast<std::size_t>(tp.size());
    std::vector<float>& w = tessera::detail::tp_wide_buffer(0, n);
    std::vector<float>& o = tessera::detail::tp_wide_buffer(1, all);
    tessera::detail::tp_widen(w.data(), s.data, n);
    tp.all_gather(w.data(), o.data(), n);
    tessera::detail::tp_narrow(out, o.data(), all);
  }
  return {out, s.rows * tp.size(), s.cols};
}

// ---- the layer family ---------------------------------------------------------------------

/// The layer family of a tensor-parallel model (nn/linear.hpp's seam):
/// column- and row-parallel layers whose partial sums are reduced over the
/// tp group `group` (not owned; it must outlive the model).
///
/// With `sequence_parallel` (Korthikanti et al. 2022), the norm and
/// residual regions hold this rank's rows of the tokens: an all_gather
/// before each column-parallel layer and a reduce_scatter after each
/// row-parallel one take the place of the all_reduces (the same ring
/// bytes), the norms' activations shrink by tp, and the norm gains'
/// gradients, now partial sums over the group, are all-reduced.
template <class Comm>
struct tensor_parallel_layers {
  using column = column_parallel_linear;  ///< q, k, v, gate, up
  using row = row_parallel_linear;        ///< attention output, down
  using comm_type = Comm;
  Comm* group = nullptr;  ///< the tp group
  /// When set, each collective adds its wall time in seconds here (the
  /// communication share a benchmark reports; not owned).
  double* comm_seconds = nullptr;
  /// Shard the norm and residual regions along the tokens (training and
  /// evaluation forwards; T must be divisible by tp).
  bool sequence_parallel = false;
  /// The ranks of the tp group holding the same key/value heads when tp >
  /// nkv (tp/nkv of them), whose weight gradients are summed over exactly
  /// that group. The model splits it from `group` and sets it (nn::llama);
  /// nullptr otherwise.
  Comm* kv_group = nullptr;

  /// Sums a partial-sum tensor over the group (nn::all_reduce).
  template <class T>
  replicated<T> all_reduce(partial_sum<T> p) const {
    return timed([&] { return nn::all_reduce(checked(), p); });
  }
  /// Sums a partial-sum tensor over the group and keeps this rank's rows
  /// (nn::reduce_scatter).
  template <class T>
  token_sharded<T> reduce_scatter(partial_sum<const T> p, T* out) const {
    return timed([&] { return nn::reduce_scatter<Comm, T>(checked(), p, out); });
  }
  /// Gathers every rank's rows (nn::all_gather).
  template <class T>
  replicated<T> all_gather(token_sharded<const T> s, T* out) const {
    return timed([&] { return nn::all_gather<Comm, T>(checked(), s, out); });
  }
  /// Sums a partial sum over the replicas of this rank's key/value heads
  /// (kv_group). Throws config_error when the model set no kv_group.
  template <class T>
  replicated<T> all_reduce_kv_replicas(partial_sum<T> p) const {
    TESSERA_THROW_IF(kv_group == nullptr, config_error,
                     "tensor_parallel_layers: key/value heads are replicated but no kv_group "
                     "was set (the model splits it from the tp group)");
    return timed([&] { return nn::all_reduce(*kv_group, p); });
  }
  /// Reduces n values (context memory) in place over the group: their
  /// maximum with `max`, else their sum.
  template <class T>
  void all_reduce_values(T* v, std::size_t n, bool max) const {
    timed([&] {
      checked().all_reduce(v, n, max ? comm::reduce_op::max : comm::reduce_op::sum);
      return 0;
    });
  }
  /// Gathers n values (context memory) of every rank into out[r n, (r +
  /// 1) n) in rank order: a tensor no placement type describes (optim::muon's
  /// momentum shards). `out` must not overlap `in`.
  template <class T>
  void all_gather_values(const T* in, T* out, std::size_t n) const {
    timed([&] {
      checked().all_gather(in, out, n);
      return 0;
    });
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
  template <class F>
  auto timed(F&& f) const {
    if (comm_seconds == nullptr) return f();
    const auto t0 = std::chrono::steady_clock::now();
    auto r = f();
    *comm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }
};

}  // namespace tessera::nn
