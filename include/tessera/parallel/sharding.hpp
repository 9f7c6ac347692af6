#pragma once
/// \file parallel/sharding.hpp
/// Sharding strategies as compile-time policies: `zero<0>` (plain data
/// parallel), `zero<1>` (optimizer state and master weights sharded),
/// `zero<2>` (+ gradients reduce-scattered into shards), `zero<3>` (+
/// parameters sharded, each block all-gathered before its forward and again
/// before its backward, freed after use, the next one prefetched).
///
/// Source: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
/// Trillion Parameter Models" (SC 2020), sections 5 and 7 (P_os, P_os+g,
/// P_os+g+p and their communication volume: 2Psi, 2Psi, 3Psi per step
/// against data parallelism's 2Psi); seeds/004, "Sharding: ZeRO and FSDP".
///
/// Also: the type gradient reductions travel and add in (`reduce_type_t`).

#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "tessera/precision/policy.hpp"

namespace tessera::parallel {

/// How a strategy reduces a bucket of gradients over dp.
enum class bucket_collective : std::uint8_t {
  all_reduce,      ///< every rank keeps the whole reduced bucket
  reduce_scatter,  ///< every rank keeps its chunk of it
};
/// Where a strategy keeps the gradients: a persistent bucket-padded buffer
/// the model accumulates into and that is reduced in place, or a persistent
/// reduced-gradient shard beside transient bucket buffers
/// (parallel/grad_reducer.hpp).
enum class grad_home : std::uint8_t { bucket_buffer, shard };
/// Where a strategy keeps the parameters: the model's flat buffer, or a
/// shard gathered per segment before each use (parallel/param_gatherer.hpp).
enum class param_home : std::uint8_t { model, shard };

/// ZeRO stage `Stage` (0..3) as a policy: which collective reduces a
/// bucket, where the gradients and the parameters live and what the
/// optimizer's state covers. parallel::data_parallel composes its parts
/// from these (a gradient_reducer, the optimizer over the owned elements,
/// a param_gatherer for zero<3>), as CUTLASS composes a kernel from its
/// collectives. Stage 0 is plain data parallelism: every rank holds
/// everything and gradients are all-reduced.
template <int Stage>
struct zero {
  static_assert(Stage >= 0 && Stage <= 3,
                "tessera::parallel::zero<Stage>: Stage must be 0 (data parallel), 1 (optimizer "
                "state), 2 (+ gradients) or 3 (+ parameters)");
  /// The ZeRO stage.
  static constexpr int stage = Stage;
  /// Master weights and optimizer state live only for this rank's shard.
  static constexpr bool shards_optimizer_state = Stage >= 1;
  /// Reduced gradients live only for this rank's shard (reduce-scatter
  /// instead of all-reduce; the per-bucket send buffers are transient).
  static constexpr bool shards_gradients = Stage >= 2;
  /// Parameters live only for this rank's shard; a block is all-gathered
  /// before each use.
  static constexpr bool shards_parameters = Stage >= 3;
  /// The composition of the stage (the flags above, as parts).
  static constexpr bucket_collective collective =
      Stage == 0 ? bucket_collective::all_reduce : bucket_collective::reduce_scatter;
  static constexpr grad_home gradients = Stage >= 2 ? grad_home::shard : grad_home::bucket_buffer;
  static constexpr param_home parameters = Stage >= 3 ? param_home::shard : param_home::model;
  /// "zero0" .. "zero3", for logs and checkpoints.
  static constexpr const char* name = Stage == 0   ? "zero0"
                                      : Stage == 1 ? "zero1"
                                      : Stage == 2 ? "zero2"
                                                   : "zero3";
};

/// A sharding strategy names its stage and what it shards; each stage
/// shards everything the previous one does (ZeRO's P_os < P_os+g < P_os+g+p).
template <class S>
concept sharding_strategy = requires {
  { S::stage } -> std::convertible_to<int>;
  { S::name } -> std::convertible_to<std::string_view>;
  { S::shards_optimizer_state } -> std::convertible_to<bool>;
  { S::shards_gradients } -> std::convertible_to<bool>;
  { S::shards_parameters } -> std::convertible_to<bool>;
  { S::collective } -> std::convertible_to<bucket_collective>;
  { S::gradients } -> std::convertible_to<grad_home>;
  { S::parameters } -> std::convertible_to<param_home>;
}
&&(!S::shards_gradients || S::shards_optimizer_state) &&
    (!S::shards_parameters || S::shards_gradients);

/// Names the first missing part of a would-be strategy in words; use as
/// `static_assert(check_sharding_strategy<S>())`.
template <class S>
consteval bool check_sharding_strategy() {
  static_assert(
      requires {
        S::stage;
        S::name;
      },
      "not a tessera sharding strategy: needs static constexpr int stage and const "
      "char* name (use tessera::parallel::zero<0..3>)");
  static_assert(
      requires {
        S::shards_optimizer_state;
        S::shards_gradients;
        S::shards_parameters;
      },
      "not a tessera sharding strategy: needs static constexpr bool shards_optimizer_state, "
      "shards_gradients and shards_parameters");
  static_assert(
      requires {
        S::collective;
        S::gradients;
        S::parameters;
      },
      "not a tessera sharding strategy: needs its parts, static constexpr bucket_collective "
      "collective, grad_home gradients and param_home parameters");
  static_assert(sharding_strategy<S>,
                "not a tessera sharding strategy: sharding gradients needs the optimizer state "
                "sharded, and sharding parameters needs the gradients sharded");
  return true;
}

static_assert(sharding_strategy<zero<0>> && sharding_strategy<zero<1>> &&
              sharding_strategy<zero<2>> && sharding_strategy<zero<3>>);

namespace detail {
template <class P>
struct reduce_type_of {
  using G = typename P::grad_type;
  using type = std::conditional_t<(sizeof(G) > 4), G, float>;
};
template <class P>
requires requires {
  typename P::reduce_type;
}
struct reduce_type_of<P> {
  using type = typename P::reduce_type;
};
}  // namespace detail

/// The type gradient reductions travel and add in, for precision policy P:
/// `P::reduce_type` when the policy declares one (the configuration point),
/// otherwise float32 for gradients of 32 bits or fewer (a bf16 gradient is
/// reduced in float32, never in bf16) and the gradient type itself when it is
/// wider (float64 runs stay float64 end to end). Must be a comm_element.
template <precision::policy P>
using reduce_type_t = typename detail::reduce_type_of<P>::type;

}  // namespace tessera::parallel
