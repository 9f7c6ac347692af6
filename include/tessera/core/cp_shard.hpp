#pragma once
/// \file core/cp_shard.hpp
/// Which tokens of a sequence a context-parallel rank holds, under the
/// head-tail load balancing of causal attention: the sequence of T tokens
/// is cut into 2 cp chunks of T/(2 cp) tokens and rank r holds chunks r and
/// 2 cp - 1 - r, so that every rank holds one early and one late chunk and
/// does the same causal work (Brandon et al. 2023, "Striped Attention",
/// section 3, on the imbalance; the zigzag / head-tail split of
/// Megatron-Core's context parallelism and torchtitan's). A rank's local
/// tokens are its first chunk's then its second chunk's, in order.
///
/// A value type of core so that every layer can read it: the data loader
/// (which rows of a packed sample a rank takes), RoPE (each local token's
/// global position), attention (nn/context_parallel.hpp).

#include <algorithm>
#include <cstdint>
#include <functional>

#include "tessera/core/error.hpp"

namespace tessera {

/// The token positions of rank `rank` of a context-parallel group of `cp`
/// ranks over sequences of `T` tokens (head-tail order). Build it with of(),
/// which checks T, cp and rank; the accessors' index preconditions are
/// contracts (TESSERA_EXPECTS: tessera::error in debug builds and tests,
/// unchecked under NDEBUG).
struct cp_shard {
  std::int64_t T = 0;  ///< tokens of the whole sequence
  int cp = 1;          ///< ranks of the group
  int rank = 0;        ///< this rank, in [0, cp)

  /// Rank `rank`'s shard. cp 1 is the whole sequence, any T >= 1 (every
  /// position at itself). Throws config_error naming T and cp when cp > 1
  /// and 2 cp does not divide T, or T < 1; naming cp when cp < 1, and rank
  /// and cp when rank is outside [0, cp).
  static cp_shard of(std::int64_t T, int cp, int rank) {
    TESSERA_THROW_IF(cp < 1, config_error, "context parallelism: cp=", cp, " must be >= 1");
    TESSERA_THROW_IF(rank < 0 || rank >= cp, config_error, "context parallelism: rank ", rank,
                     " is not in [0, cp=", cp, ")");
    TESSERA_THROW_IF(T < 1 || (cp > 1 && T % (2 * std::int64_t{cp}) != 0), config_error,
                     "context parallelism: T=", T, " is not divisible by 2*cp=", 2 * cp,
                     " (cp=", cp,
                     "): head-tail load balancing cuts the sequence into 2*cp equal chunks");
    return {T, cp, rank};
  }

  /// Tokens per chunk, T/(2 cp).
  [[nodiscard]] constexpr std::int64_t chunk() const { return T / (2 * std::int64_t{cp}); }
  /// Tokens this rank holds, T/cp: local token t < chunk() is in chunk
  /// index(0), the rest in chunk index(1).
  [[nodiscard]] constexpr std::int64_t tokens() const { return T / cp; }
  /// The global index of this rank's local chunk j: rank, or
  /// 2 cp - 1 - rank. Precondition: j is 0 or 1 (TESSERA_EXPECTS).
  [[nodiscard]] constexpr std::int64_t index(int j) const {
    TESSERA_EXPECTS(j == 0 || j == 1,
                    ::tessera::detail::str("cp_shard: local chunk j=", j, " is not 0 or 1"));
    return j == 0 ? rank : 2 * std::int64_t{cp} - 1 - rank;
  }
  /// Global position of the first token of local chunk j. Precondition:
  /// j is 0 or 1.
  [[nodiscard]] constexpr std::int64_t start(int j) const { return index(j) * chunk(); }
  /// Tokens of local chunk j: chunk(), for both. Precondition: j is 0 or 1.
  [[nodiscard]] constexpr std::int64_t length([[maybe_unused]] int j) const {
    TESSERA_EXPECTS(j == 0 || j == 1,
                    ::tessera::detail::str("cp_shard: local chunk j=", j, " is not 0 or 1"));
    return chunk();
  }
  /// Global position of local token t. Precondition: 0 <= t < tokens().
  [[nodiscard]] constexpr std::int64_t position(std::int64_t t) const {
    TESSERA_EXPECTS(t >= 0 && t < tokens(),
                    ::tessera::detail::str("cp_shard::position: local token t=", t,
                                           " is outside [0, tokens()=", tokens(), ")"));
    return t < chunk() ? start(0) + t : start(1) + (t - chunk());
  }
  /// The rank of the same group that holds global position p.
  /// Precondition: 0 <= p < T.
  [[nodiscard]] constexpr int owner(std::int64_t p) const {
    TESSERA_EXPECTS(p >= 0 && p < T, ::tessera::detail::str("cp_shard::owner: position p=", p,
                                                            " is outside [0, T=", T, ")"));
    const std::int64_t i = p / chunk();
    return static_cast<int>(i < cp ? i : 2 * std::int64_t{cp} - 1 - i);
  }
  /// The local index of global position p on its owner (owner(p)).
  /// Precondition: 0 <= p < T.
  [[nodiscard]] constexpr std::int64_t local_index(std::int64_t p) const {
    TESSERA_EXPECTS(p >= 0 && p < T, ::tessera::detail::str("cp_shard::local_index: position p=", p,
                                                            " is outside [0, T=", T, ")"));
    const std::int64_t i = p / chunk();
    return (i < cp ? 0 : chunk()) + p % chunk();
  }
  /// The shard of rank `r` of the same group. Precondition: 0 <= r < cp.
  [[nodiscard]] constexpr cp_shard of_rank(int r) const {
    TESSERA_EXPECTS(r >= 0 && r < cp, ::tessera::detail::str("cp_shard::of_rank: rank ", r,
                                                             " is not in [0, cp=", cp, ")"));
    return {T, cp, r};
  }
  /// Copies this rank's tokens of one row: out[l] = row[position(l)] for l
  /// in [0, tokens()). `row` holds at least T values from global position
  /// 0 (a window of T + 1 tokens read at row + 1 gives the targets); `out`
  /// tokens() values. Host memory. Preconditions (TESSERA_EXPECTS): neither
  /// pointer null, and out[0, tokens()) not overlapping row[0, T).
  template <class U>
  void take(const U* row, U* out) const {
    TESSERA_EXPECTS(row != nullptr && out != nullptr, "cp_shard::take: null row or out");
    TESSERA_EXPECTS(T < 1 || std::less<const U*>{}(out + tokens() - 1, row) ||
                        std::less<const U*>{}(row + T - 1, out),
                    ::tessera::detail::str("cp_shard::take: out (", tokens(),
                                           " values) overlaps row (", T, " values)"));
    const std::int64_t c = cp == 1 ? T : chunk();
    for (int j = 0; j < (cp == 1 ? 1 : 2); ++j) {
      const U* from = row + (cp == 1 ? 0 : start(j));
      std::copy(from, from + c, out + j * c);
    }
  }
};

}  // namespace tessera
