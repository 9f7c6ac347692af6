#pragma once
/// \file parallel/layout.hpp
/// `layout<C, L>`: where one rank sits in a dp x cp x tp x pp mesh, built
/// once (comm::device_mesh order: tp fastest, then cp, then dp, then pp;
/// Megatron-LM's initialize_model_parallel): its data-parallel group, its
/// context-parallel group with the dp x cp group over which the weights
/// are replicated, its layer family (nn::dense_layers, or
/// nn::tensor_parallel_layers holding the tp group) and its pipeline group,
/// none owned. A figure summed over the mesh (the
/// scored tokens, the loss, the gradient norm, an agreement) is summed by
/// one call that names its axes, `reduce(values, n, {axis::dp, axis::pp})`,
/// instead of one collective per group at each site.
///
///   layout<C>{}                      one rank: no groups
///   layout<C>{dp}                    data parallel over `dp`
///   layout<C, L>{dp, layers}         dp x tp (layers.group is the tp group)
///   layout<C, L>{dp, layers, pp}     dp x tp x pp (pp ranked by stage)
///   layout<C, L>{groups, layers}     dp x cp x tp x pp from comm::make_groups
///
/// Reduction order: dp, then cp, then tp, then pp (the order of the
/// gradient norm's sums: the engine's chunks over dp x cp, the
/// tensor-parallel shards, the stages), so a reduction over several axes
/// gives the same bits whichever call site makes it. A group of one rank is
/// skipped.
///
/// Thread-safety: one layout per rank, used from that rank's thread.

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/device_mesh.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/nn/linear.hpp"

namespace tessera::parallel {

/// One axis of the mesh.
enum class axis : std::uint8_t {
  dp = 1,  ///< data parallel (ZeRO shards over it)
  tp = 2,  ///< tensor parallel (the layer family's group)
  pp = 4,  ///< pipeline parallel (ranked by stage)
  cp = 8,  ///< context parallel (the sequence split over ranks)
};

/// A set of mesh axes: `{axis::dp, axis::pp}`, or axes::all().
struct axes {
  std::uint8_t bits = 0;
  constexpr axes() = default;
  constexpr axes(axis a) : bits(static_cast<std::uint8_t>(a)) {}  // NOLINT: a set of one
  constexpr axes(std::initializer_list<axis> l) {
    for (axis a : l) bits |= static_cast<std::uint8_t>(a);
  }
  /// dp, cp, tp and pp: every rank of the world.
  static constexpr axes all() { return {axis::dp, axis::cp, axis::tp, axis::pp}; }
  constexpr bool has(axis a) const { return (bits & static_cast<std::uint8_t>(a)) != 0; }
};

/// This rank's groups of the mesh (file comment). `C` the communicator of
/// the dp, cp and pp groups, `L` the layer family (its tp group, a C too).
/// Holds pointers: the groups must outlive the layout and every copy of it.
template <comm::communicator C, class L = nn::dense_layers>
class layout {
 public:
  using comm_type = C;
  using layers_type = L;

  /// One rank: no dp, tp or pp group.
  layout() = default;
  /// Data parallelism over `dp` (not owned).
  explicit layout(C& dp) : dp_(&dp) {}
  /// dp x tp: `layers` holds the tp group (nn::tensor_parallel_layers;
  /// nn::dense_layers{} without one).
  layout(C& dp, L layers) : dp_(&dp), layers_(layers) {}
  /// dp x tp x pp: `pp` is this rank's pipeline group, ranked by stage.
  layout(C& dp, L layers, C& pp) : dp_(&dp), layers_(layers), pp_(&pp) {}
  /// dp x cp x tp x pp: the groups comm::make_groups split (not owned; a
  /// group of one rank is kept), `layers` holding g.tp under tensor
  /// parallelism.
  layout(comm::mesh_groups<C>& g, L layers)
      : dp_(&g.dp), layers_(layers), pp_(&g.pp), cp_(&g.cp), dp_cp_(&g.dp_cp) {}

  /// The dp group (nullptr for a layout built without one; a group of one
  /// rank from comm::make_groups is kept).
  C* dp_group() const { return dp_; }
  /// The pp group (nullptr without one; a group of one rank is kept).
  C* pp_group() const { return pp_; }
  /// The cp group (nullptr for a layout built without comm::make_groups'
  /// groups; a group of one rank is kept).
  C* cp_group() const { return cp_; }
  /// The ranks holding the same weights, dp x cp ranked by dp index * cp +
  /// cp index: the gradients' and ZeRO's group (the dp group when there is
  /// no cp group; nullptr for one rank).
  C* dp_cp_group() const { return dp_cp_ ? dp_cp_ : dp_; }
  /// The layer family (its tp group under tensor parallelism).
  const L& layers() const { return layers_; }
  L& layers() { return layers_; }

  int dp() const { return dp_ ? dp_->size() : 1; }              ///< data-parallel degree
  int dp_rank() const { return dp_ ? dp_->rank() : 0; }         ///< index in the dp group
  int cp() const { return cp_ ? cp_->size() : 1; }              ///< context-parallel degree
  int cp_rank() const { return cp_ ? cp_->rank() : 0; }         ///< index in the cp group
  int tp() const { return layers_.size(); }                     ///< tensor-parallel degree
  int tp_rank() const { return layers_.rank(); }                ///< index in the tp group
  int pp() const { return pp_ ? pp_->size() : 1; }              ///< pipeline degree K
  int stage() const { return pp_ ? pp_->rank() : 0; }           ///< this rank's stage k
  int world_size() const { return dp() * cp() * tp() * pp(); }  ///< dp x cp x tp x pp
  /// The rank in comm::device_mesh order:
  /// ((stage dp + dp_rank) cp + cp_rank) tp + tp_rank.
  int world_rank() const {
    return ((stage() * dp() + dp_rank()) * cp() + cp_rank()) * tp() + tp_rank();
  }

  /// Reduces `n` values at `d` (the groups' buffer space: the context's
  /// memory) in place over the groups of `over`, dp, cp, tp, then pp
  /// (file comment), each with `op` (sum or max; the tp family's groups
  /// take those two). Collective over those groups. Throws config_error
  /// for another op over tp, and what the communicators throw.
  template <class T>
  void reduce(T* d, std::size_t n, axes over, comm::reduce_op op = comm::reduce_op::sum) const {
    if (over.has(axis::dp) && dp_ && dp_->size() > 1) dp_->all_reduce(d, n, op);
    if (over.has(axis::cp) && cp_ && cp_->size() > 1) cp_->all_reduce(d, n, op);
    if constexpr (L::tensor_parallel) {
      if (over.has(axis::tp) && layers_.size() > 1) {
        TESSERA_THROW_IF(op != comm::reduce_op::sum && op != comm::reduce_op::max, config_error,
                         "layout::reduce over tp: sum or max, not ", comm::to_string(op));
        layers_.all_reduce_values(d, n, op == comm::reduce_op::max);
      }
    }
    if (over.has(axis::pp) && pp_ && pp_->size() > 1) pp_->all_reduce(d, n, op);
  }
  /// The same for host values, through a buffer in `ctx`'s memory (device
  /// communicators reduce device memory). Nothing moves when no group of
  /// `over` has more than one rank.
  template <class Ctx>
  void reduce(const Ctx& ctx, std::span<double> h, axes over,
              comm::reduce_op op = comm::reduce_op::sum) const {
    if (h.empty() || ranks(over) == 1) return;
    tensor<double, typename Ctx::backend_type> d =
        kernels::make_tensor<double>(ctx, static_cast<std::int64_t>(h.size()));
    ctx.from_host(d.data(), h.data(), h.size_bytes());
    reduce(d.data(), h.size(), over, op);
    ctx.to_host(h.data(), d.data(), h.size_bytes());
  }
  /// Every rank's `rows` (host values, `width` per row) over the groups of
  /// `over`, concatenated by group rank (dp, cp, tp, then pp), through
  /// buffers in `ctx`'s memory: the same list on every rank of those
  /// groups. Ranks may hold different numbers of rows. Collective.
  template <class Ctx>
  std::vector<double> gather_rows(const Ctx& ctx, std::vector<double> rows, std::size_t width,
                                  axes over) const {
    TESSERA_THROW_IF(width == 0 || rows.size() % width != 0, config_error,
                     "gather_rows: ", rows.size(), " values are not rows of ", width);
    auto over_group = [&](auto& g) {
      if (g.size() < 2) return;
      const auto N = static_cast<std::size_t>(g.size());
      std::vector<double> counts = gather_host(ctx, g, {static_cast<double>(rows.size() / width)});
      std::size_t most = 0;
      for (double c : counts) most = std::max(most, static_cast<std::size_t>(c));
      rows.resize(most * width, 0.0);
      const std::vector<double> all = gather_host(ctx, g, rows);
      rows.clear();
      for (std::size_t r = 0; r < N; ++r)
        rows.insert(rows.end(), all.begin() + static_cast<std::ptrdiff_t>(r * most * width),
                    all.begin() + static_cast<std::ptrdiff_t>(
                                      (r * most + static_cast<std::size_t>(counts[r])) * width));
    };
    if (over.has(axis::dp) && dp_) over_group(*dp_);
    if (over.has(axis::cp) && cp_) over_group(*cp_);
    if constexpr (L::tensor_parallel)
      if (over.has(axis::tp)) over_group(*layers_.group);
    if (over.has(axis::pp) && pp_) over_group(*pp_);
    return rows;
  }
  /// The ranks a reduction over `over` spans (the product of those degrees).
  int ranks(axes over) const {
    return (over.has(axis::dp) ? dp() : 1) * (over.has(axis::cp) ? cp() : 1) *
           (over.has(axis::tp) ? tp() : 1) * (over.has(axis::pp) ? pp() : 1);
  }

 private:
  // Every rank's `mine` (the same count on each) over group `g`, by rank.
  template <class Ctx, class G>
  static std::vector<double> gather_host(const Ctx& ctx, G& g, const std::vector<double>& mine) {
    const auto n = static_cast<std::int64_t>(mine.size());
    auto send = kernels::make_tensor<double>(ctx, n);
    auto all = kernels::make_tensor<double>(ctx, n * g.size());
    ctx.from_host(send.data(), mine.data(), mine.size() * sizeof(double));
    g.all_gather(send.data(), all.data(), mine.size());
    std::vector<double> h(static_cast<std::size_t>(n * g.size()));
    ctx.to_host(h.data(), all.data(), h.size() * sizeof(double));
    return h;
  }

  C* dp_ = nullptr;
  L layers_{};
  C* pp_ = nullptr;
  C* cp_ = nullptr;
  C* dp_cp_ = nullptr;
};

}  // namespace tessera::parallel
