#pragma once
/// \file optim/param_range.hpp
/// Ranges of a flat parameter buffer with their weight-decay flag.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tessera::optim {

/// Elements [begin, end) of the flat parameter buffer, all of one parameter
/// tensor (or of its part inside a shard), and whether weight decay applies.
struct param_range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  bool decay = true;
  std::int64_t size() const { return end - begin; }
};

/// Intersects `ranges` with the shard [lo, hi) of the flat buffer (ZeRO
/// partitions by offset ranges, DESIGN.md principle 4). Empty pieces are dropped.
inline std::vector<param_range> clip_ranges(const std::vector<param_range>& ranges,
                                            std::int64_t lo, std::int64_t hi) {
  std::vector<param_range> out;
  for (const auto& r : ranges) {
    std::int64_t b = std::max(r.begin, lo), e = std::min(r.end, hi);
    if (b < e) out.push_back({b, e, r.decay});
  }
  return out;
}

}  // namespace tessera::optim
