#pragma once
// The row helpers of context-parallel kernel tests, for the host and
// emulated tests (tests/kernels/kernel_testing.hpp) and the GPU tests
// (tests/cuda/kernels.cpp) alike: packed document starts and the rows a
// cp rank holds.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/core/cp_shard.hpp"

namespace tessera::testing {

/// doc_start (B, T) of rows cut into documents of `lengths` in turn (row b
/// starting at its b-th length, the last document cut by the row's end):
/// each token's document's first position, as data::document_starts gives.
inline std::vector<std::int32_t> packed_doc_starts(std::int64_t B, std::int64_t T,
                                                   const std::vector<std::int64_t>& lengths) {
  std::vector<std::int32_t> ds(static_cast<std::size_t>(B * T));
  const auto n = static_cast<std::int64_t>(lengths.size());
  for (std::int64_t b = 0; b < B; ++b) {
    std::int64_t start = 0, d = b;
    for (std::int64_t t = 0; t < T; ++t) {
      if (t - start == lengths[static_cast<std::size_t>(d % n)]) {
        start = t;
        ++d;
      }
      ds[static_cast<std::size_t>(b * T + t)] = static_cast<std::int32_t>(start);
    }
  }
  return ds;
}

/// The rows of whole (B, T, width) a context-parallel rank holds: local
/// (B, s.tokens(), width), local[b, l] = whole[b, s.position(l)].
template <class U>
std::vector<U> shard_rows(const std::vector<U>& whole, const tessera::cp_shard& s,
                          std::int64_t B, std::int64_t width) {
  const std::int64_t L = s.tokens();
  std::vector<U> local(static_cast<std::size_t>(B * L * width));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t l = 0; l < L; ++l)
      for (std::int64_t k = 0; k < width; ++k)
        local[static_cast<std::size_t>((b * L + l) * width + k)] =
            whole[static_cast<std::size_t>((b * s.T + s.position(l)) * width + k)];
  return local;
}

}  // namespace tessera::testing
