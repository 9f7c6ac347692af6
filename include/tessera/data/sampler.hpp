#pragma once
/// \file sampler.hpp
/// Which tokens each step trains on: random windows of T+1 tokens, a pure
/// function of (seed, step, sequence index), and the fixed validation windows.
///
/// Training windows. Sequence g of the global batch of step s starts at
/// `window_start(seed, s, g, begin, end, T)`: a counter-based hash of the tuple
/// (splitmix64 rounds, no RNG state), mapped without bias onto the valid
/// starts [begin, end - (T+1)]. Nothing depends on which process asks, how
/// many ask, or in which order, so:
///
///   * the global batch of step s is sequences g = 0 .. G-1, G = dp * A * B
///     (dp data-parallel ranks, A micro-batches of B rows per rank);
///   * rank r's local micro-batch a is global micro-batch m = r * A + a
///     (`global_micro_batch`), rows b = 0..B-1 are sequences g = m * B + b;
///   * so a 4-rank job and a 1-rank job with 4x the accumulation see exactly
///     the same G windows at every step, the ranks' subsets are disjoint, and a
///     resumed run continues with the windows it would have seen.
///
/// Windows may overlap one another and repeat across steps (sampling with
/// replacement): an "epoch" is not a notion here.
///
/// Validation windows (`val_windows`) tile the validation range with stride T,
/// so every token but the first is predicted exactly once, independent of the
/// seed: eval losses are comparable across runs and layouts.

#include <algorithm>
#include <cstdint>

#include "tessera/core/error.hpp"
#include "tessera/data/token_file.hpp"

namespace tessera::data {

/// The splitmix64 output function (Steele, Lea, Flood, "Fast splittable
/// pseudorandom number generators", OOPSLA 2014): a bijection on 64 bits with
/// full avalanche. Pure; the same on every platform.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Counter-based hash of (seed, step, g, attempt): one splitmix64 round per
/// field. For a fixed (seed, step) distinct g give distinct hashes (each round
/// is a bijection). Part of the data order of a run: changing it changes
/// every run's windows.
constexpr std::uint64_t window_hash(std::uint64_t seed, std::uint64_t step, std::uint64_t g,
                                    std::uint64_t attempt = 0) {
  constexpr std::uint64_t domain = 0x7465737365726131ULL;  // "tessera1": window starts
  std::uint64_t h = splitmix64(seed ^ domain);
  h = splitmix64(h ^ step);
  h = splitmix64(h ^ g);
  return splitmix64(h ^ attempt);
}

/// Start position of training sequence `g` of step `step`: uniform over the
/// valid starts [range_begin, range_end - (T+1)], so the window
/// [start, start + T + 1) lies inside [range_begin, range_end).
///
/// Exactly uniform: Lemire's multiply-shift with rejection ("Fast random
/// integer generation in an interval", 2019); a rejected draw (probability
/// below n_starts / 2^64) redraws with the next `attempt` counter.
///
/// \param g sequence index in the global batch of the step, 0 .. G-1 (see the
///        file comment for the mapping from rank and micro-batch).
/// \param T sequence length (tokens predicted per row); a window holds T+1.
/// \throws config_error if T < 1, or the range holds fewer than T+1 tokens
///         ("... holds N tokens, fewer than one window of T+1 = M tokens").
inline std::uint64_t window_start(std::uint64_t seed, std::uint64_t step, std::uint64_t g,
                                  std::uint64_t range_begin, std::uint64_t range_end,
                                  std::int64_t T) {
  TESSERA_THROW_IF(T < 1, config_error, "sequence length T=", T, " must be >= 1");
  const std::uint64_t window = static_cast<std::uint64_t>(T) + 1;
  const std::uint64_t n = range_end >= range_begin ? range_end - range_begin : 0;
  TESSERA_THROW_IF(range_end < range_begin || n < window, config_error,
                   "the sampled range of the corpus (tokens [", range_begin, ", ", range_end,
                   "), the training split unless given otherwise) holds ", n,
                   " tokens, fewer than one window of T+1 = ", window,
                   " tokens; use a shorter sequence length or more data");
  const std::uint64_t n_starts = n - window + 1;
  for (std::uint64_t attempt = 0;; ++attempt) {
    const std::uint64_t x = window_hash(seed, step, g, attempt);
    const unsigned __int128 m = static_cast<unsigned __int128>(x) * n_starts;
    const auto low = static_cast<std::uint64_t>(m);
    if (low < n_starts) {
      const std::uint64_t threshold = (0 - n_starts) % n_starts;  // 2^64 mod n_starts
      if (low < threshold) continue;
    }
    return range_begin + static_cast<std::uint64_t>(m >> 64);
  }
}

/// Global micro-batch index of rank `rank`'s local micro-batch `local_micro_batch`
/// when each of the dp ranks runs `accum_steps` micro-batches per step:
/// rank * accum_steps + local_micro_batch. Ranks own disjoint, contiguous
/// blocks of the global batch.
constexpr std::uint64_t global_micro_batch(std::uint64_t rank, std::uint64_t accum_steps,
                                           std::uint64_t local_micro_batch) {
  return rank * accum_steps + local_micro_batch;
}

/// Fills (B, T+1) int32 micro-batches of training windows from a token file.
/// Row b of global micro-batch m at step s is the window of sequence
/// g = m * B + b: tokens [start, start + T + 1) with
/// start = window_start(seed, s, g, range.begin, range.end, T). Inputs are
/// columns 0..T-1, targets columns 1..T. Deterministic in (seed, step, m);
/// stateless, so any micro-batch of any step can be filled in any order, from
/// any thread.
struct batch_sampler {
  const token_file* file = nullptr;  ///< not owned; must outlive the sampler
  token_range range;                 ///< windows lie inside [range.begin, range.end)
  std::int64_t B = 0;                ///< rows per micro-batch
  std::int64_t T = 0;                ///< sequence length; rows hold T+1 tokens
  std::uint64_t seed = 0;            ///< the run's data seed

  /// \throws config_error if B < 1, T < 1, the range is not inside the file,
  ///         or it holds fewer than T+1 tokens (naming N and T+1).
  batch_sampler(const token_file& f, token_range r, std::int64_t B_, std::int64_t T_,
                std::uint64_t seed_)
      : file(&f), range(r), B(B_), T(T_), seed(seed_) {
    TESSERA_THROW_IF(B < 1, config_error, "micro-batch size B=", B, " must be >= 1");
    TESSERA_THROW_IF(r.begin > r.end || r.end > f.size(), config_error, "token range [", r.begin,
                     ", ", r.end, ") is not inside '", f.path().string(), "' (", f.size(),
                     " tokens)");
    window_start(seed, 0, 0, range.begin, range.end, T);  // throws for T < 1 or a short range
  }

  /// Start position of sequence `g` of the global batch of step `step`.
  std::uint64_t start(std::uint64_t step, std::uint64_t g) const {
    return window_start(seed, step, g, range.begin, range.end, T);
  }

  /// Fills `rows` windows for sequences first_g .. first_g + rows - 1 of step
  /// `step`. \param out host buffer (rows, T+1) int32, row-major.
  void fill_sequences(std::uint64_t step, std::uint64_t first_g, std::int64_t rows,
                      std::int32_t* out) const {
    for (std::int64_t b = 0; b < rows; ++b)
      file->read(start(step, first_g + static_cast<std::uint64_t>(b)), T + 1, out + b * (T + 1));
  }

  /// Fills global micro-batch `micro_batch` of step `step`: sequences
  /// micro_batch * B .. micro_batch * B + B - 1.
  /// \param out host buffer (B, T+1) int32, row-major; every element is written.
  void fill(std::uint64_t step, std::uint64_t micro_batch, std::int32_t* out) const {
    fill_sequences(step, micro_batch * static_cast<std::uint64_t>(B), B, out);
  }
};

/// The fixed validation windows of a range: window k covers
/// [begin + k*T, begin + k*T + T + 1), for k = 0 .. count()-1, so consecutive
/// windows share one token and every token after the first is a target
/// exactly once. With `max_windows` > 0 only the first `max_windows` are used
/// (a cheaper, still fixed, eval). Independent of any seed.
struct val_windows {
  const token_file* file = nullptr;  ///< not owned; must outlive this
  token_range range;                 ///< usually `file.split().val`
  std::int64_t T = 0;                ///< sequence length; windows hold T+1
  std::int64_t n_windows = 0;        ///< number of windows used

  /// \param max_windows 0 for all windows that fit, else at most this many.
  /// \throws config_error if T < 1, max_windows < 0, the range is not inside
  ///         the file, or it holds fewer than T+1 tokens.
  val_windows(const token_file& f, token_range r, std::int64_t T_, std::int64_t max_windows = 0)
      : file(&f), range(r), T(T_) {
    TESSERA_THROW_IF(T < 1, config_error, "sequence length T=", T, " must be >= 1");
    TESSERA_THROW_IF(max_windows < 0, config_error, "max_windows=", max_windows,
                     " must be >= 0 (0 = all)");
    TESSERA_THROW_IF(r.begin > r.end || r.end > f.size(), config_error, "token range [", r.begin,
                     ", ", r.end, ") is not inside '", f.path().string(), "' (", f.size(),
                     " tokens)");
    const std::uint64_t window = static_cast<std::uint64_t>(T) + 1;
    TESSERA_THROW_IF(r.size() < window, config_error, "validation corpus of ", r.size(),
                     " tokens (range [", r.begin, ", ", r.end,
                     ")) is smaller than one window of T+1 = ", window,
                     " tokens; use a shorter sequence length, a larger val_fraction or more data");
    n_windows = static_cast<std::int64_t>((r.size() - 1) / static_cast<std::uint64_t>(T));
    if (max_windows > 0) n_windows = std::min(n_windows, max_windows);
  }

  /// Number of windows.
  std::int64_t count() const { return n_windows; }
  /// Start position of window k. \pre 0 <= k < count().
  std::uint64_t start(std::int64_t k) const {
    TESSERA_EXPECTS(k >= 0 && k < n_windows, "validation window index out of range");
    return range.begin + static_cast<std::uint64_t>(k) * static_cast<std::uint64_t>(T);
  }
  /// Number of batches of B rows (the last may be partial).
  std::int64_t batches(std::int64_t B) const {
    TESSERA_THROW_IF(B < 1, config_error, "batch size B=", B, " must be >= 1");
    return (n_windows + B - 1) / B;
  }
  /// Fills batch `batch` (windows batch*B ..) into `out` and returns the number
  /// of rows written, B except possibly for the last batch; rows past it are
  /// not touched (the caller masks them out of the loss).
  /// \param out host buffer (B, T+1) int32, row-major.
  /// \throws config_error if B < 1 or batch is not in [0, batches(B)).
  std::int64_t fill(std::int64_t batch, std::int64_t B, std::int32_t* out) const {
    TESSERA_THROW_IF(batch < 0 || batch >= batches(B), config_error, "validation batch ", batch,
                     " is not in [0, ", batches(B), ") for B=", B);
    const std::int64_t first = batch * B;
    const std::int64_t rows = std::min(B, n_windows - first);
    for (std::int64_t b = 0; b < rows; ++b) file->read(start(first + b), T + 1, out + b * (T + 1));
    return rows;
  }
};

}  // namespace tessera::data
