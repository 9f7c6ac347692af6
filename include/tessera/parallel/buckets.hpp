#pragma once
/// \file parallel/buckets.hpp
/// Gradient buckets and shards over the flat buffer: pure arithmetic, no
/// communication (DESIGN.md principle 4: collectives move large contiguous
/// ranges, ZeRO partitions by offset ranges, padding when numel is not
/// divisible by the world size).
///
/// A bucket is a contiguous range [begin, end) of the flat buffer made of
/// whole segments (nn/segment_hooks.hpp). Buckets are formed in reverse
/// layout order, the order backward produces gradients: bucket 0 holds the
/// head, the last bucket the embedding. Walking segments from the head, a
/// bucket takes the next segment while it stays within `cap` elements; a
/// segment larger than the cap is a bucket by itself (buckets never split a
/// segment, so a bucket is complete when its lowest segment's backward ends).
/// `one_per_segment` makes every segment its own bucket (ZeRO-3 gathers and
/// reduces per block).
///
/// Padding and shards: bucket k of n_k elements is padded to
/// padded_k = dp * chunk_k, chunk_k = round_up(ceil(n_k / dp), chunk_align),
/// so reduce_scatter and all_gather move equal chunks, and all_reduce cuts
/// the ring at the same chunk boundaries as reduce_scatter (the local ring
/// then adds every element in the same order under all_reduce and
/// reduce_scatter: ZeRO stages agree bit for bit). Rank r owns chunk r of
/// every bucket: flat elements [begin_k + r*chunk_k, begin_k + (r+1)*chunk_k)
/// clipped to end_k (the rest is padding, always zero). Its shard-local
/// buffer concatenates its chunks in bucket order: chunk k at shard_offset_k
/// = sum_{j<k} chunk_j. The padded "staging" buffer concatenates whole padded
/// buckets: bucket k at staging_offset_k = sum_{j<k} padded_j; chunk r of
/// bucket k there is the concatenation of every rank's shard piece, so an
/// all_gather of the shard pieces rebuilds the bucket in flat order.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/nn/param_layout.hpp"

namespace tessera::parallel {

/// Default bucket size in bytes (PyTorch DDP's bucket_cap_mb = 25).
inline constexpr std::int64_t default_bucket_bytes = 25 * 1000 * 1000;

/// A chunk (one rank's piece of a bucket) is a multiple of this many
/// elements: 16-byte aligned float chunks, and 2-byte parameters travel as
/// whole 32-bit words.
inline constexpr std::int64_t chunk_align = 4;

/// One segment of the flat buffer: id (-1 embedding, 0..L-1 blocks, L head)
/// and its elements [begin, end).
struct segment_range {
  int id = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

/// One gradient bucket (see the file comment for the arithmetic).
struct bucket {
  std::int64_t begin = 0, end = 0;  ///< flat elements [begin, end)
  int first_segment = 0;            ///< lowest segment id in the bucket
  int last_segment = 0;             ///< highest segment id in the bucket
  std::int64_t chunk = 0;           ///< elements per rank
  std::int64_t padded = 0;          ///< dp * chunk >= end - begin
  std::int64_t shard_offset = 0;    ///< this chunk in the shard-local buffer
  std::int64_t staging_offset = 0;  ///< this bucket in the padded staging buffer
  /// Real (unpadded) elements of the bucket.
  std::int64_t numel() const { return end - begin; }
};

/// Buckets and this rank's shard of a flat buffer tiled by segments.
class bucket_plan {
 public:
  /// \param segments in layout order, contiguous, tiling [segments.front().begin,
  ///        segments.back().end); ids increasing by one.
  /// \param dp data-parallel degree (>= 1); \param rank this rank, in [0, dp).
  /// \param cap_elements bucket capacity in elements (>= 1).
  /// \param one_per_segment every segment its own bucket (ignores the cap).
  /// \throws config_error naming the values if dp < 1, rank is outside
  ///         [0, dp), the cap is < 1, or the segments do not tile a range.
  bucket_plan(const std::vector<segment_range>& segments, int dp, int rank,
              std::int64_t cap_elements, bool one_per_segment)
      : dp_(dp), rank_(rank) {
    TESSERA_THROW_IF(dp < 1, config_error, "dp=", dp, " must be >= 1");
    TESSERA_THROW_IF(rank < 0 || rank >= dp, config_error, "rank ", rank, " is not in [0, dp=", dp,
                     ")");
    TESSERA_THROW_IF(cap_elements < 1, config_error, "bucket capacity of ", cap_elements,
                     " elements must be >= 1");
    TESSERA_THROW_IF(segments.empty(), config_error, "bucket_plan needs at least one segment");
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const auto& s = segments[i];
      TESSERA_THROW_IF(s.end < s.begin, config_error, "segment ", s.id, " has end ", s.end,
                       " < begin ", s.begin);
      if (i > 0)
        TESSERA_THROW_IF(s.begin != segments[i - 1].end || s.id != segments[i - 1].id + 1,
                         config_error, "segment ", s.id, " [", s.begin, ", ", s.end,
                         ") does not follow segment ", segments[i - 1].id, " [",
                         segments[i - 1].begin, ", ", segments[i - 1].end, ")");
    }
    first_id_ = segments.front().id;
    segment_bucket_.assign(segments.size(), 0);
    // From the head down: take segments while the bucket stays within the cap.
    for (std::size_t i = segments.size(); i-- > 0;) {
      const auto& s = segments[i];
      const bool fits =
          !buckets_.empty() && !one_per_segment && buckets_.back().end - s.begin <= cap_elements;
      if (!fits) {
        bucket b;
        b.begin = s.begin;
        b.end = s.end;
        b.first_segment = b.last_segment = s.id;
        buckets_.push_back(b);
      } else {
        buckets_.back().begin = s.begin;
        buckets_.back().first_segment = s.id;
      }
      segment_bucket_[i] = static_cast<int>(buckets_.size()) - 1;
    }
    std::int64_t shard = 0, staging = 0;
    for (auto& b : buckets_) {
      const std::int64_t per = (b.numel() + dp - 1) / dp;
      b.chunk = (per + chunk_align - 1) / chunk_align * chunk_align;
      b.padded = b.chunk * dp;
      b.shard_offset = shard;
      b.staging_offset = staging;
      shard += b.chunk;
      staging += b.padded;
    }
    shard_size_ = shard;
    staging_size_ = staging;
  }

  /// Data-parallel degree (ranks sharing every bucket).
  int dp() const { return dp_; }
  /// This rank, in [0, dp()).
  int rank() const { return rank_; }
  /// Buckets in reduction order (bucket 0 holds the highest segments).
  const std::vector<bucket>& buckets() const { return buckets_; }
  /// Number of buckets.
  std::size_t size() const { return buckets_.size(); }
  /// Index of the bucket holding segment `id`.
  int bucket_of_segment(int id) const {
    TESSERA_EXPECTS(id >= first_id_ && id - first_id_ < static_cast<int>(segment_bucket_.size()),
                    "segment id outside the plan");
    return segment_bucket_[static_cast<std::size_t>(id - first_id_)];
  }
  /// Elements of this rank's shard-local buffer (sum of the chunks).
  std::int64_t shard_size() const { return shard_size_; }
  /// Elements of the padded staging buffer (sum of the padded buckets).
  std::int64_t staging_size() const { return staging_size_; }

  /// Flat elements [lo, hi) that rank `r`'s chunk of bucket k holds for real
  /// (hi - lo may be less than the chunk, or 0: the rest is padding).
  std::pair<std::int64_t, std::int64_t> owned(std::size_t k, int r) const {
    const bucket& b = buckets_[k];
    const std::int64_t lo = std::min(b.end, b.begin + r * b.chunk);
    const std::int64_t hi = std::min(b.end, lo + b.chunk);
    return {lo, hi};
  }
  /// owned(k, rank()).
  std::pair<std::int64_t, std::int64_t> owned(std::size_t k) const { return owned(k, rank_); }

  /// The ranges of `flat` in bucket k whose elements lie in more than one
  /// rank's chunk (the tensors a ZeRO stage splits between the ranks), in
  /// flat order; the same on every rank.
  std::vector<nn::param_range> split_ranges(std::size_t k,
                                            const std::vector<nn::param_range>& flat) const {
    const bucket& b = buckets_[k];
    std::vector<nn::param_range> out;
    for (const nn::param_range& r : flat) {
      if (r.end <= b.begin || r.begin >= b.end) continue;
      int holders = 0;
      for (int q = 0; q < dp_; ++q) {
        const auto [lo, hi] = owned(k, q);
        holders += std::max(r.begin, lo) < std::min(r.end, hi) ? 1 : 0;
      }
      if (holders > 1) out.push_back(r);
    }
    return out;
  }

  /// The parameter ranges (flat offsets, with their decay flag) that fall in
  /// this rank's shard, in shard-local offsets: what the optimizer of the
  /// shard updates. Padding is in no range.
  std::vector<nn::param_range> shard_ranges(const std::vector<nn::param_range>& flat) const {
    std::vector<nn::param_range> out;
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      const auto [lo, hi] = owned(k);
      const std::int64_t base = buckets_[k].shard_offset - lo;
      for (nn::param_range r : nn::clip_ranges(flat, lo, hi)) {
        r.begin += base;
        r.end += base;
        out.push_back(r);
      }
    }
    return out;
  }

 private:
  int dp_, rank_;
  int first_id_ = 0;
  std::vector<bucket> buckets_;
  std::vector<int> segment_bucket_;  // per segment (id - first_id_)
  std::int64_t shard_size_ = 0, staging_size_ = 0;
};

}  // namespace tessera::parallel
