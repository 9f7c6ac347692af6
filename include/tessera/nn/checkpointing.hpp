#pragma once
/// \file nn/checkpointing.hpp
/// Activation checkpointing policies (Chen et al., "Training Deep Nets with
/// Sublinear Memory Cost", 2016; Korthikanti et al. 2022, seeds/001 "full
/// recomputation"): what a transformer block's forward keeps for its
/// backward. A block consults the policy when it fills its record
/// (nn/transformer_block.hpp); the same policy runs on every backend.

#include <cstdint>
#include <string>

#include "tessera/core/error.hpp"

namespace tessera::nn {

/// - `none`: every block keeps its whole activation record (q, k, v, the
///   attention output and log-sum-exp, the norms, gate, up and h).
/// - `full`: a checkpointed block keeps only its input (N, H); its backward
///   first recomputes the block's forward (without the last down
///   projection, whose output the backward does not read) into a fresh
///   record. Costs one extra forward of those blocks (HFU counts it, MFU
///   does not). The kernels are deterministic, so the recomputed record is
///   the original one bit for bit and so are the gradients.
enum class activation_checkpointing { none, full };

/// "none" or "full".
inline const char* to_string(activation_checkpointing c) {
  return c == activation_checkpointing::full ? "full" : "none";
}

/// Parses "none" or "full"; throws config_error naming the value otherwise.
inline activation_checkpointing parse_checkpointing(const std::string& s) {
  if (s == "none") return activation_checkpointing::none;
  if (s == "full") return activation_checkpointing::full;
  throw config_error("unknown activation checkpointing '" + s + "' (valid: none, full)");
}

/// Which blocks are checkpointed: with `full`, block l when l % every == 0
/// (every = 1: all of them, Megatron-Core's "uniform" method with one layer
/// per chunk; every = 2: blocks 0, 2, 4, ...). A value, not a type: the
/// block reads it at run time (STYLE.md, "values for knobs").
struct checkpoint_policy {
  activation_checkpointing mode = activation_checkpointing::none;
  std::int64_t every = 1;  ///< checkpoint every k-th block (k >= 1)

  /// Throws config_error naming the value if every < 1.
  void validate() const {
    TESSERA_THROW_IF(every < 1, config_error, "checkpointing every=", every,
                     " must be >= 1 (1: every block)");
  }
  /// Whether block `l` keeps only its input and recomputes the rest.
  bool recomputes(std::int64_t l) const {
    return mode == activation_checkpointing::full && l % every == 0;
  }
  /// Blocks of `L` that recompute.
  std::int64_t recomputed_blocks(std::int64_t L) const {
    if (mode != activation_checkpointing::full) return 0;
    return (L + every - 1) / every;
  }
};

}  // namespace tessera::nn
