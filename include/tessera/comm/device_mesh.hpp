#pragma once
/// \file device_mesh.hpp
/// `device_mesh{dp, tp, pp}`: the 3-D arrangement of ranks for data, tensor
/// and pipeline parallelism, in Megatron order (tp fastest, then dp, then
/// pp; Megatron-LM `initialize_model_parallel`):
///
///     rank = pp_index * (dp * tp) + dp_index * tp + tp_index
///
/// so a tensor-parallel group is tp consecutive ranks (one node's GPUs,
/// where tp traffic is heaviest), a data-parallel group strides by tp, a
/// pipeline group strides by dp * tp. Example, (dp, tp, pp) = (2, 2, 2):
/// tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} {4,6} {5,7};
/// pp groups {0,4} {1,5} {2,6} {3,7}.
///
/// `make_groups(world, mesh)` splits a communicator into the three groups of
/// the calling rank (three collectives on `world`).

#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"

namespace tessera::comm {

/// Position of a rank in the mesh (each index in [0, degree)).
struct mesh_coord {
  int dp = 0;
  int tp = 0;
  int pp = 0;
  friend constexpr bool operator==(const mesh_coord&, const mesh_coord&) = default;
};

/// The parallel degrees and the rank <-> coordinate map (Megatron order).
class device_mesh {
 public:
  /// Degrees dp, tp, pp >= 1. Throws config_error naming a degree < 1.
  device_mesh(int dp, int tp, int pp) : dp_(dp), tp_(tp), pp_(pp) {
    TESSERA_THROW_IF(dp < 1 || tp < 1 || pp < 1, config_error, "device_mesh: dp=", dp, " tp=", tp,
                     " pp=", pp, ": every degree must be >= 1");
  }
  /// As above, and checks dp * tp * pp == world_size (config_error naming
  /// the numbers otherwise).
  device_mesh(int dp, int tp, int pp, int world_size) : device_mesh(dp, tp, pp) {
    validate(world_size);
  }

  /// Throws config_error unless dp * tp * pp == world_size, naming all four.
  void validate(int world_size) const {
    TESSERA_THROW_IF(world_size != size(), config_error, "device_mesh: dp=", dp_, " x tp=", tp_,
                     " x pp=", pp_, " = ", size(), " ranks, but the world has ", world_size,
                     "; choose degrees whose product is ", world_size);
  }

  [[nodiscard]] int dp() const { return dp_; }  ///< data-parallel degree
  [[nodiscard]] int tp() const { return tp_; }  ///< tensor-parallel degree
  [[nodiscard]] int pp() const { return pp_; }  ///< pipeline-parallel degree
  /// dp * tp * pp.
  [[nodiscard]] int size() const { return dp_ * tp_ * pp_; }

  /// Coordinates of `rank`. Throws config_error if rank is not in [0, size()).
  [[nodiscard]] mesh_coord coord(int rank) const {
    check_rank(rank);
    return {(rank / tp_) % dp_, rank % tp_, rank / (tp_ * dp_)};
  }
  /// The rank at `c` (inverse of coord).
  [[nodiscard]] int rank_of(mesh_coord c) const {
    TESSERA_THROW_IF(c.dp < 0 || c.dp >= dp_ || c.tp < 0 || c.tp >= tp_ || c.pp < 0 || c.pp >= pp_,
                     config_error, "device_mesh: coordinate (dp=", c.dp, ", tp=", c.tp,
                     ", pp=", c.pp, ") outside (", dp_, ", ", tp_, ", ", pp_, ")");
    return c.pp * dp_ * tp_ + c.dp * tp_ + c.tp;
  }

  /// Ranks of `rank`'s tensor-parallel group, by tp index.
  [[nodiscard]] std::vector<int> tp_group(int rank) const {
    auto c = coord(rank);
    std::vector<int> g;
    for (c.tp = 0; c.tp < tp_; ++c.tp) g.push_back(rank_of(c));
    return g;
  }
  /// Ranks of `rank`'s data-parallel group, by dp index.
  [[nodiscard]] std::vector<int> dp_group(int rank) const {
    auto c = coord(rank);
    std::vector<int> g;
    for (c.dp = 0; c.dp < dp_; ++c.dp) g.push_back(rank_of(c));
    return g;
  }
  /// Ranks of `rank`'s pipeline group, by stage (pp index).
  [[nodiscard]] std::vector<int> pp_group(int rank) const {
    auto c = coord(rank);
    std::vector<int> g;
    for (c.pp = 0; c.pp < pp_; ++c.pp) g.push_back(rank_of(c));
    return g;
  }

  /// split() colors: the same for exactly the members of one group (the
  /// group's smallest rank), key = the index within the group.
  [[nodiscard]] int tp_color(int rank) const { return tp_group(rank).front(); }
  [[nodiscard]] int dp_color(int rank) const { return dp_group(rank).front(); }
  [[nodiscard]] int pp_color(int rank) const { return pp_group(rank).front(); }

 private:
  void check_rank(int rank) const {
    TESSERA_THROW_IF(rank < 0 || rank >= size(), config_error, "device_mesh: rank ", rank,
                     " is not in [0, ", size(), ") for dp=", dp_, " tp=", tp_, " pp=", pp_);
  }
  int dp_, tp_, pp_;
};

/// The three sub-communicators of one rank.
template <class Comm>
struct mesh_groups {
  Comm tp;  ///< ranks of the same (dp, pp), ranked by tp index
  Comm dp;  ///< ranks of the same (tp, pp), ranked by dp index
  Comm pp;  ///< ranks of the same (dp, tp), ranked by stage
};

/// Splits `world` into the calling rank's tp, dp and pp groups: three
/// collective split() calls on `world` (every rank must call it). Throws
/// config_error if world.size() != mesh.size().
template <class Comm>
mesh_groups<Comm> make_groups(Comm& world, const device_mesh& mesh) {
  mesh.validate(world.size());
  const int r = world.rank();
  const auto c = mesh.coord(r);
  Comm tp = world.split(mesh.tp_color(r), c.tp);
  Comm dp = world.split(mesh.dp_color(r), c.dp);
  Comm pp = world.split(mesh.pp_color(r), c.pp);
  return {std::move(tp), std::move(dp), std::move(pp)};
}

}  // namespace tessera::comm
