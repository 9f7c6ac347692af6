#pragma once
/// \file parallel/pipeline_partition.hpp
/// Stage partitioning (DESIGN.md, "a pipeline stage is a range of
/// modules"): the L blocks of a Llama split into S = K V contiguous
/// virtual stages, the embedding on the first, the final norm and the LM
/// head on the last. By default the blocks are balanced by their training
/// FLOPs per token (nn/flops.hpp's terms: a block's GEMMs and its causal
/// attention; the head's V H GEMM counts on the last stage, the embedding's
/// lookup counts nothing), minimising the largest stage; or the user lists
/// the blocks of each stage.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_record.hpp"

namespace tessera::parallel {

/// Training FLOPs per token of one block at sequence length T (6 times
/// its GEMM weights plus 6 H T of causal attention; nn::flops_per_token's
/// per-block term).
inline double block_flops_per_token(const nn::llama_config& c, std::int64_t T) {
  const double H = static_cast<double>(c.dim), F = static_cast<double>(c.ffn_dim),
               KV = static_cast<double>(c.kv_dim());
  return 6.0 * (2 * H * H + 2 * KV * H + 3 * H * F) + 6.0 * H * static_cast<double>(T);
}
/// Training FLOPs per token of the LM head (6 V H).
inline double head_flops_per_token(const nn::llama_config& c) {
  return 6.0 * static_cast<double>(c.vocab) * static_cast<double>(c.dim);
}

/// The blocks of each of `stages` virtual stages: `blocks[s]` blocks for
/// stage s if the user lists them (every entry >= 1, summing to L), else
/// contiguous ranges of at least one block each minimising the largest
/// stage's FLOPs (the head's on the last stage; of equal partitions the
/// one whose last stage holds the most blocks). Returns the S stage ranges in order, the
/// first with the embedding, the last with the head. Throws config_error
/// naming the numbers for stages < 1, more stages than blocks, or a list of
/// another length or sum.
inline std::vector<nn::stage_range> partition_stages(const nn::llama_config& c, std::int64_t T,
                                                     int stages,
                                                     std::vector<std::int64_t> blocks = {}) {
  const std::int64_t L = c.n_layers, S = stages;
  TESSERA_THROW_IF(S < 1, config_error, "pipeline: ", S, " stages; need at least 1");
  TESSERA_THROW_IF(S > L, config_error, "pipeline: more stages (", S,
                   " = pp x virtual stages) than layers (", L,
                   "): every stage needs at least one block");
  if (!blocks.empty()) {
    TESSERA_THROW_IF(static_cast<std::int64_t>(blocks.size()) != S, config_error,
                     "pipeline: ", blocks.size(), " stage sizes listed for ", S, " stages");
    std::int64_t sum = 0;
    for (std::size_t s = 0; s < blocks.size(); ++s) {
      TESSERA_THROW_IF(blocks[s] < 1, config_error, "pipeline: stage ", s, " lists ", blocks[s],
                       " blocks; every stage needs at least one");
      sum += blocks[s];
    }
    TESSERA_THROW_IF(sum != L, config_error, "pipeline: the listed stage sizes sum to ", sum,
                     " blocks, the model has ", L);
  } else {
    // best[s][l]: the smallest largest-stage cost of blocks [0, l) in s stages.
    const double b = block_flops_per_token(c, T), head = head_flops_per_token(c);
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<std::vector<double>> best(static_cast<std::size_t>(S + 1),
                                          std::vector<double>(static_cast<std::size_t>(L + 1), inf));
    std::vector<std::vector<std::int64_t>> cut(best.size(),
                                               std::vector<std::int64_t>(best[0].size(), 0));
    best[0][0] = 0;
    for (std::int64_t s = 1; s <= S; ++s)
      for (std::int64_t l = s; l <= L - (S - s); ++l)
        for (std::int64_t j = s - 1; j < l; ++j) {  // stage s holds blocks [j, l)
          const double cost = static_cast<double>(l - j) * b + (s == S ? head : 0.0);
          const double v = std::max(best[static_cast<std::size_t>(s - 1)][static_cast<std::size_t>(j)], cost);
          // Strictly better only: a tie keeps the earliest cut j.
          if (v < best[static_cast<std::size_t>(s)][static_cast<std::size_t>(l)] * (1 - 1e-12)) {
            best[static_cast<std::size_t>(s)][static_cast<std::size_t>(l)] = v;
            cut[static_cast<std::size_t>(s)][static_cast<std::size_t>(l)] = j;
          }
        }
    blocks.assign(static_cast<std::size_t>(S), 0);
    std::int64_t l = L;
    for (std::int64_t s = S; s >= 1; --s) {
      const std::int64_t j = cut[static_cast<std::size_t>(s)][static_cast<std::size_t>(l)];
      blocks[static_cast<std::size_t>(s - 1)] = l - j;
      l = j;
    }
  }
  std::vector<nn::stage_range> r;
  std::int64_t first = 0;
  for (std::int64_t s = 0; s < S; ++s) {
    const std::int64_t n = blocks[static_cast<std::size_t>(s)];
    r.push_back({first, first + n, s == 0, s == S - 1});
    first += n;
  }
  return r;
}

}  // namespace tessera::parallel
