#pragma once
/// \file device_mesh.hpp
/// `device_mesh(mesh_degrees{.dp, .cp, .tp, .pp})`: the 4-D arrangement of
/// ranks for data, context, tensor and pipeline parallelism, in
/// Megatron-Core's order (tp fastest, then cp, then dp, then pp;
/// Megatron-LM `initialize_model_parallel`):
///
///     rank = ((pp_index * dp + dp_index) * cp + cp_index) * tp + tp_index
///
/// so a tensor-parallel group is tp consecutive ranks (one node's GPUs,
/// where tp traffic is heaviest), a context-parallel group strides by tp, a
/// data-parallel group by cp * tp, a pipeline group by dp * cp * tp.
/// Example, (dp, cp, tp, pp) = (2, 1, 2, 2), the same as without cp:
/// tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} {4,6} {5,7};
/// pp groups {0,4} {1,5} {2,6} {3,7}. With (dp, cp, tp, pp) = (2, 2, 1, 1):
/// cp groups {0,1} {2,3}; dp groups {0,2} {1,3}; the dp x cp group (the
/// ranks that hold the same weights: gradients are reduced and ZeRO shards
/// over it, as in Megatron-Core) {0,1,2,3}.
///
/// `make_groups(world, mesh)` splits a communicator into the five groups of
/// the calling rank (five collectives on `world`).

#include <string>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"

namespace tessera::comm {

/// Position of a rank in the mesh (each index in [0, degree)).
/// cp is last so that {dp, tp, pp} still reads as before (cp 0).
struct mesh_coord {
  int dp = 0;
  int tp = 0;
  int pp = 0;
  int cp = 0;
  friend constexpr bool operator==(const mesh_coord&, const mesh_coord&) = default;
};

/// The degrees of a mesh, named: `mesh_degrees{.dp = 2, .cp = 2}`; each
/// defaults to 1.
struct mesh_degrees {
  int dp = 1;  ///< data parallel
  int cp = 1;  ///< context parallel (the sequence split over ranks)
  int tp = 1;  ///< tensor parallel
  int pp = 1;  ///< pipeline parallel
};

/// The parallel degrees and the rank <-> coordinate map (Megatron-Core
/// order, file comment).
class device_mesh {
 public:
  /// Degrees dp, cp, tp, pp >= 1. Throws config_error naming a degree < 1,
  /// or a product past 2^31 - 1 ranks.
  explicit device_mesh(mesh_degrees d) : dp_(d.dp), cp_(d.cp), tp_(d.tp), pp_(d.pp) {
    TESSERA_THROW_IF(d.dp < 1 || d.cp < 1 || d.tp < 1 || d.pp < 1, config_error,
                     "device_mesh: dp=", d.dp, " cp=", d.cp, " tp=", d.tp, " pp=", d.pp,
                     ": every degree must be >= 1");
    const long long n = 1LL * d.dp * d.cp * d.tp * d.pp;
    TESSERA_THROW_IF(n > 0x7fffffffLL, config_error, "device_mesh: dp=", d.dp, " x cp=", d.cp,
                     " x tp=", d.tp, " x pp=", d.pp, " = ", n, " ranks, more than 2^31 - 1");
  }
  /// As above, and checks dp * cp * tp * pp == world_size (config_error
  /// naming the numbers otherwise).
  device_mesh(mesh_degrees d, int world_size) : device_mesh(d) { validate(world_size); }
  /// dp x tp x pp without context parallelism (cp 1).
  device_mesh(int dp, int tp, int pp) : device_mesh(mesh_degrees{.dp = dp, .tp = tp, .pp = pp}) {}
  /// Four integers would read as (dp, tp, pp, world size) to some callers
  /// and as (dp, cp, tp, pp) to others: name them with mesh_degrees.
  template <class... A>
    requires(sizeof...(A) == 4)
  device_mesh(A...) {
    static_assert(sizeof...(A) != 4,
                  "device_mesh(a, b, c, d) is ambiguous: write device_mesh(mesh_degrees{.dp = ..., "
                  ".cp = ..., .tp = ..., .pp = ...}, world_size)");
  }

  /// Throws config_error unless dp * cp * tp * pp == world_size, naming them.
  void validate(int world_size) const {
    TESSERA_THROW_IF(world_size != size(), config_error, "device_mesh: ", degrees_text(), " = ",
                     size(), " ranks, but the world has ", world_size,
                     "; choose degrees whose product is ", world_size);
  }

  [[nodiscard]] int dp() const { return dp_; }  ///< data-parallel degree
  [[nodiscard]] int cp() const { return cp_; }  ///< context-parallel degree
  [[nodiscard]] int tp() const { return tp_; }  ///< tensor-parallel degree
  [[nodiscard]] int pp() const { return pp_; }  ///< pipeline-parallel degree
  /// The degrees, named.
  [[nodiscard]] mesh_degrees degrees() const { return {dp_, cp_, tp_, pp_}; }
  /// dp * cp * tp * pp.
  [[nodiscard]] int size() const { return dp_ * cp_ * tp_ * pp_; }

  /// Coordinates of `rank`. Throws config_error if rank is not in [0, size()).
  [[nodiscard]] mesh_coord coord(int rank) const {
    check_rank(rank);
    mesh_coord c;
    c.tp = rank % tp_;
    c.cp = (rank / tp_) % cp_;
    c.dp = (rank / (tp_ * cp_)) % dp_;
    c.pp = rank / (tp_ * cp_ * dp_);
    return c;
  }
  /// The rank at `c` (inverse of coord). Throws config_error for a
  /// coordinate outside the degrees.
  [[nodiscard]] int rank_of(mesh_coord c) const {
    TESSERA_THROW_IF(c.dp < 0 || c.dp >= dp_ || c.cp < 0 || c.cp >= cp_ || c.tp < 0 ||
                         c.tp >= tp_ || c.pp < 0 || c.pp >= pp_,
                     config_error, "device_mesh: coordinate (dp=", c.dp, ", cp=", c.cp,
                     ", tp=", c.tp, ", pp=", c.pp, ") outside (", dp_, ", ", cp_, ", ", tp_, ", ",
                     pp_, ")");
    return ((c.pp * dp_ + c.dp) * cp_ + c.cp) * tp_ + c.tp;
  }

  /// Ranks of `rank`'s tensor-parallel group, by tp index.
  [[nodiscard]] std::vector<int> tp_group(int rank) const {
    return along(rank, [](mesh_coord& c) -> int& { return c.tp; }, tp_);
  }
  /// Ranks of `rank`'s context-parallel group, by cp index.
  [[nodiscard]] std::vector<int> cp_group(int rank) const {
    return along(rank, [](mesh_coord& c) -> int& { return c.cp; }, cp_);
  }
  /// Ranks of `rank`'s data-parallel group, by dp index.
  [[nodiscard]] std::vector<int> dp_group(int rank) const {
    return along(rank, [](mesh_coord& c) -> int& { return c.dp; }, dp_);
  }
  /// Ranks of `rank`'s pipeline group, by stage (pp index).
  [[nodiscard]] std::vector<int> pp_group(int rank) const {
    return along(rank, [](mesh_coord& c) -> int& { return c.pp; }, pp_);
  }
  /// Ranks of `rank`'s dp x cp group (the ranks holding the same weights),
  /// by dp index * cp + cp index.
  [[nodiscard]] std::vector<int> dp_cp_group(int rank) const {
    auto c = coord(rank);
    std::vector<int> g;
    for (c.dp = 0; c.dp < dp_; ++c.dp)
      for (c.cp = 0; c.cp < cp_; ++c.cp) g.push_back(rank_of(c));
    return g;
  }
  /// `rank`'s index in its dp x cp group: dp index * cp + cp index.
  [[nodiscard]] int dp_cp_index(int rank) const {
    const auto c = coord(rank);
    return c.dp * cp_ + c.cp;
  }

  /// split() colors: the same for exactly the members of one group (the
  /// group's smallest rank), key = the index within the group.
  [[nodiscard]] int tp_color(int rank) const { return tp_group(rank).front(); }
  [[nodiscard]] int cp_color(int rank) const { return cp_group(rank).front(); }
  [[nodiscard]] int dp_color(int rank) const { return dp_group(rank).front(); }
  [[nodiscard]] int pp_color(int rank) const { return pp_group(rank).front(); }
  [[nodiscard]] int dp_cp_color(int rank) const { return dp_cp_group(rank).front(); }

 private:
  template <class Field>
  std::vector<int> along(int rank, Field field, int degree) const {
    auto c = coord(rank);
    std::vector<int> g;
    for (field(c) = 0; field(c) < degree; ++field(c)) g.push_back(rank_of(c));
    return g;
  }
  std::string degrees_text() const {
    return cp_ == 1 ? tessera::detail::str("dp=", dp_, " x tp=", tp_, " x pp=", pp_)
                    : tessera::detail::str("dp=", dp_, " x cp=", cp_, " x tp=", tp_, " x pp=", pp_);
  }
  void check_rank(int rank) const {
    TESSERA_THROW_IF(rank < 0 || rank >= size(), config_error, "device_mesh: rank ", rank,
                     " is not in [0, ", size(), ") for ", degrees_text());
  }
  int dp_, cp_, tp_, pp_;
};

/// The five sub-communicators of one rank.
template <class Comm>
struct mesh_groups {
  Comm tp;     ///< ranks of the same (dp, cp, pp), ranked by tp index
  Comm dp;     ///< ranks of the same (cp, tp, pp), ranked by dp index
  Comm pp;     ///< ranks of the same (dp, cp, tp), ranked by stage
  Comm cp;     ///< ranks of the same (dp, tp, pp), ranked by cp index
  Comm dp_cp;  ///< ranks of the same (tp, pp), ranked by dp index * cp + cp index
};

/// Splits `world` into the calling rank's tp, dp, pp, cp and dp x cp
/// groups: five collective split() calls on `world` (every rank must call
/// it). Throws config_error if world.size() != mesh.size().
template <class Comm>
mesh_groups<Comm> make_groups(Comm& world, const device_mesh& mesh) {
  mesh.validate(world.size());
  const int r = world.rank();
  const auto c = mesh.coord(r);
  Comm tp = world.split(mesh.tp_color(r), c.tp);
  Comm dp = world.split(mesh.dp_color(r), c.dp);
  Comm pp = world.split(mesh.pp_color(r), c.pp);
  Comm cp = world.split(mesh.cp_color(r), c.cp);
  Comm dp_cp = world.split(mesh.dp_cp_color(r), mesh.dp_cp_index(r));
  return {std::move(tp), std::move(dp), std::move(pp), std::move(cp), std::move(dp_cp)};
}

}  // namespace tessera::comm
