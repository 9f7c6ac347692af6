#pragma once
/// \file train/sampling.hpp
/// Sampling tokens from a model's logits, deterministic in a seed.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/random.hpp"

namespace tessera::train {

/// Draws one token from softmax(logits / temperature) over V entries with one
/// uniform draw of `r` (inverse CDF in index order, float64 arithmetic), so
/// every rank with the same rng state picks the same token. `p` is scratch of
/// V doubles. Precondition: temperature > 0.
inline std::int32_t sample_token(const float* logits, std::int64_t V, double temperature, rng& r,
                                 std::vector<double>& p) {
  p.resize(static_cast<std::size_t>(V));
  double mx = -1e300, z = 0;
  for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(logits[v]));
  for (std::int64_t v = 0; v < V; ++v) z += p[v] = std::exp((logits[v] - mx) / temperature);
  double u = r.uniform() * z, c = 0;
  for (std::int64_t v = 0; v < V; ++v) {
    c += p[v];
    if (u < c) return static_cast<std::int32_t>(v);
  }
  return static_cast<std::int32_t>(V - 1);
}

/// Samples `n` tokens after `prompt` (token ids) from the full softmax at
/// `temperature`, deterministic in `seed`: each step asks
/// `next_logits(ids, len, logits)` for the V logits (host memory) after the
/// last min(ctx, prompt length) tokens and draws with sample_token. Returns
/// the prompt followed by the n sampled tokens. Throws config_error for an
/// empty prompt, a prompt id outside [0, V), a negative n, or a temperature
/// that is not > 0.
template <class NextLogits>
std::vector<std::int32_t> generate_tokens(std::vector<std::int32_t> prompt, std::int64_t n,
                                          double temperature, std::uint64_t seed, std::int64_t V,
                                          std::int64_t ctx, NextLogits&& next_logits) {
  TESSERA_THROW_IF(prompt.empty(), config_error, "generation needs a non-empty prompt");
  TESSERA_THROW_IF(!(temperature > 0), config_error, "temperature=", temperature, " must be > 0");
  TESSERA_THROW_IF(n < 0, config_error, "tokens to generate n=", n, " must be >= 0");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    TESSERA_THROW_IF(prompt[i] < 0 || prompt[i] >= V, config_error, "prompt token ", i, " has id ",
                     prompt[i], " outside the vocabulary [0, ", V, ")");
  std::vector<float> logits(static_cast<std::size_t>(V));
  std::vector<double> p;
  rng r(seed);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t len = std::min<std::int64_t>(ctx, static_cast<std::int64_t>(prompt.size()));
    next_logits(prompt.data() + prompt.size() - len, len, logits.data());
    prompt.push_back(sample_token(logits.data(), V, temperature, r, p));
  }
  return prompt;
}

}  // namespace tessera::train
