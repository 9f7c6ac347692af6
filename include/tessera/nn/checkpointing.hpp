#pragma once
/// \file nn/checkpointing.hpp
/// Activation checkpointing policies (Chen et al., "Training Deep Nets with
/// Sublinear Memory Cost", 2016; Korthikanti et al. 2022, seeds/001 "full
/// recomputation"): what a block's forward keeps for its backward.

#include <string>

#include "tessera/core/error.hpp"

namespace tessera::nn {

/// - `none`: every block keeps its whole activation record (q, k, v, the
///   attention output and log-sum-exp, the norms, gate, up and h), as the
///   host nn::llama does.
/// - `full`: every block keeps only its input (N, H); its backward first
///   recomputes the block's forward (without the last down projection,
///   whose output the backward does not read) into one shared record.
///   Costs one extra forward of the blocks (HFU counts it, MFU does not).
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

}  // namespace tessera::nn
