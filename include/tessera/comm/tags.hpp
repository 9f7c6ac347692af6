#pragma once
/// \file comm/tags.hpp
/// The point-to-point message tags of every tessera component, in one
/// place. Each component owns a range of tags, and the ranges are disjoint
/// (static_asserted below), so that two components' messages on one
/// communicator can never match each other's receives: MPI and the local
/// communicator match a receive by (peer, tag); NCCL ignores tags and
/// matches in issue order, so there the tags only name a message in errors.
///
///   range          owner                                   tags
///   [0, 7300)      the pipeline executor                   2 v: activations from virtual
///                  (parallel/executor.hpp)                 stage v; 2 v + 1: gradients
///   [7300, 7400)   context parallelism                     7301 a ring's key/value block,
///                  (nn/context_parallel.hpp)               7302 its dk/dv accumulator,
///                                                          7303 an all-to-all's piece
///   [7400, 7500)   mpi_communicator's error channel        7411 a failure notice,
///                  (comm/mpi.hpp; its own duplicate of     7412 the exit rendezvous
///                  the world)
///
/// A new component takes a new range here, and a static_assert that it is
/// disjoint from the others.

namespace tessera::comm {

/// A half-open range of message tags, [first, end).
struct tag_range {
  int first = 0;  ///< the first tag of the range
  int end = 0;    ///< one past the last

  /// Tags in the range.
  [[nodiscard]] constexpr int size() const { return end - first; }
  /// True when `tag` is in the range.
  [[nodiscard]] constexpr bool contains(int tag) const { return first <= tag && tag < end; }
  /// True when the two ranges share a tag.
  [[nodiscard]] constexpr bool overlaps(tag_range o) const {
    return first < o.end && o.first < end;
  }
};

// ---- the pipeline executor -----------------------------------------------------------------

/// The pipeline executor's tags: a message from virtual stage v (of K V)
/// carries pipeline_activation_tag(v) or pipeline_gradient_tag(v).
inline constexpr tag_range pipeline_tags{0, 7300};
/// Most virtual stages (K stages times V chunks per rank) whose two tags
/// each fit pipeline_tags: 3650. The executor refuses more.
inline constexpr int pipeline_max_virtual_stages = pipeline_tags.size() / 2;
/// Tag of the activations virtual stage v sends to v + 1 (0 <= v <
/// pipeline_max_virtual_stages).
constexpr int pipeline_activation_tag(int v) {
  return pipeline_tags.first + 2 * v;
}
/// Tag of the gradient virtual stage v sends to v - 1.
constexpr int pipeline_gradient_tag(int v) {
  return pipeline_tags.first + 2 * v + 1;
}

// ---- context parallelism -------------------------------------------------------------------

/// Context parallelism's tags (nn/detail/cp_exchange.hpp, ring_attention.hpp).
inline constexpr tag_range cp_tags{7300, 7400};
inline constexpr int cp_tag_kv = 7301;   ///< a ring's key/value block
inline constexpr int cp_tag_dkv = 7302;  ///< a ring's travelling dk/dv accumulator
inline constexpr int cp_tag_a2a = 7303;  ///< an all-to-all's pieces (Ulysses)

// ---- mpi_communicator's internals ----------------------------------------------------------

/// mpi_communicator's error channel (comm/mpi.hpp), on its own duplicate of
/// MPI_COMM_WORLD.
inline constexpr tag_range mpi_internal_tags{7400, 7500};
inline constexpr int mpi_notice_tag = 7411;      ///< a failing rank's notice to every other
inline constexpr int mpi_rendezvous_tag = 7412;  ///< "about to exit", before MPI_Finalize

// ---- disjoint ------------------------------------------------------------------------------

static_assert(pipeline_tags.first >= 0 && pipeline_tags.size() > 0 && cp_tags.size() > 0 &&
                  mpi_internal_tags.size() > 0,
              "comm/tags.hpp: every range is non-empty and tags are >= 0");
static_assert(!pipeline_tags.overlaps(cp_tags) && !pipeline_tags.overlaps(mpi_internal_tags) &&
                  !cp_tags.overlaps(mpi_internal_tags),
              "comm/tags.hpp: two components' tag ranges overlap; give each its own range");
static_assert(pipeline_tags.contains(pipeline_gradient_tag(pipeline_max_virtual_stages - 1)) &&
                  !pipeline_tags.contains(pipeline_activation_tag(pipeline_max_virtual_stages)),
              "comm/tags.hpp: pipeline_max_virtual_stages does not match pipeline_tags");
static_assert(cp_tags.contains(cp_tag_kv) && cp_tags.contains(cp_tag_dkv) &&
                  cp_tags.contains(cp_tag_a2a),
              "comm/tags.hpp: a context-parallel tag lies outside cp_tags");
static_assert(mpi_internal_tags.contains(mpi_notice_tag) &&
                  mpi_internal_tags.contains(mpi_rendezvous_tag),
              "comm/tags.hpp: an mpi_communicator tag lies outside mpi_internal_tags");

}  // namespace tessera::comm
