#pragma once
/// \file collective_log.hpp
/// The debug mode shared by every communicator: a rolling hash of the
/// collectives a rank issued, a ring buffer of the last K descriptions, and
/// the check that all ranks agree (`verify_collective_hash`).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tessera/comm/communicator.hpp"

namespace tessera::comm::detail {

/// Rolling hash and history of the collectives issued on one communicator.
/// Not thread-safe: the communicator records from its issuing thread.
class collective_log {
 public:
  static constexpr std::size_t desc_chars = 112;  // 14 words
  static constexpr std::size_t entry_words = 2 + desc_chars / 8;

  void configure(bool on, std::size_t history) {
    on_ = on;
    k_ = std::max<std::size_t>(history, 1);
    ring_.assign(on ? k_ * entry_words : 0, 0);
  }
  [[nodiscard]] bool enabled() const { return on_; }

  /// Records collective `seq` (op kind, group size, count, dtype, and the
  /// reduction or root in `param`), extending the rolling FNV-1a hash.
  void record(std::uint64_t seq, op_kind k, int group, std::size_t n, dtype d,
              const std::string& param) {
    if (!on_) return;
    const std::uint64_t fields[] = {seq, static_cast<std::uint64_t>(k),
                                    static_cast<std::uint64_t>(group), n,
                                    static_cast<std::uint64_t>(d)};
    std::uint64_t h = hash_;
    auto mix = [&h](const void* p, std::size_t bytes) {
      const auto* b = static_cast<const unsigned char*>(p);
      for (std::size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
    };
    mix(fields, sizeof fields);
    mix(param.data(), param.size());
    hash_ = h;
    count_ = seq + 1;
    std::uint64_t* e = &ring_[(seq % k_) * entry_words];
    e[0] = seq;
    e[1] = h;
    char desc[desc_chars] = {};
    std::snprintf(desc, sizeof desc, "%s(n=%zu %s%s%s, group=%d)", to_string(k), n, to_string(d),
                  param.empty() ? "" : ", ", param.c_str(), group);
    std::memcpy(e + 2, desc, desc_chars);
  }

  /// The collective check: `gather(send, recv, words)` must all-gather
  /// `words` uint64 per rank over the same group. Throws comm_error naming
  /// the first collective (sequence number and each rank's description)
  /// where two ranks diverged.
  template <class Gather>
  void verify(int rank, int size, Gather&& gather) const {
    TESSERA_THROW_IF(!on_, config_error, "verify_collective_hash on rank ", rank,
                     " needs debug mode: call set_debug(true) on every rank before the first "
                     "collective");
    // Snapshot first: the gathers below are collectives and get recorded too.
    const std::uint64_t mine[2] = {count_, hash_};
    const std::vector<std::uint64_t> ring = ring_;
    const std::size_t k = k_;
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(size));
    gather(mine, all.data(), 2);
    bool same = true;
    for (int r = 1; r < size; ++r) same = same && all[2 * r] == all[0] && all[2 * r + 1] == all[1];
    if (same) return;

    std::vector<std::uint64_t> rings(ring.size() * static_cast<std::size_t>(size));
    gather(ring.data(), rings.data(), ring.size());
    auto count_of = [&](int r) { return all[2 * static_cast<std::size_t>(r)]; };
    auto entry = [&](int r, std::uint64_t s) {
      return &rings[static_cast<std::size_t>(r) * ring.size() + (s % k) * entry_words];
    };
    std::uint64_t lo = 0, hi = ~std::uint64_t{0};
    for (int r = 0; r < size; ++r) {
      const std::uint64_t c = count_of(r);
      lo = std::max(lo, c > k ? c - k : 0);
      hi = std::min(hi, c);
    }
    std::string where;
    std::uint64_t s = lo;
    for (; s < hi; ++s) {
      bool differ = false;
      for (int r = 1; r < size; ++r) differ = differ || entry(r, s)[1] != entry(0, s)[1];
      if (differ) break;
    }
    if (lo >= hi && hi > 0) {
      where = str("before the last ", k, " collectives kept (raise comm_options::history)");
    } else if (s < hi) {
      where = str(s == lo && lo > 0 ? "at or before" : "at", " collective #", s, ": ");
      std::map<std::string, std::vector<int>> by_desc;
      for (int r = 0; r < size; ++r) {
        char d[desc_chars + 1] = {};
        std::memcpy(d, entry(r, s) + 2, desc_chars);
        by_desc[d].push_back(r);
      }
      for (const auto& [d, ranks] : by_desc) {
        where += ranks.size() > 1 ? "ranks " : "rank ";
        for (std::size_t i = 0; i < ranks.size(); ++i) where += str(i ? "," : "", ranks[i]);
        where += str(": ", d, "; ");
      }
    } else {
      where = str("at collective #", s, ": ");
      for (int r = 0; r < size; ++r) {
        if (count_of(r) > s) {
          char d[desc_chars + 1] = {};
          std::memcpy(d, entry(r, s) + 2, desc_chars);
          where += str("rank ", r, ": ", d, "; ");
        } else {
          where += str("rank ", r, ": (none, it issued only ", count_of(r), " collectives); ");
        }
      }
    }
    while (!where.empty() && (where.back() == ' ' || where.back() == ';')) where.pop_back();
    throw comm_error(str("rank ", rank, " of ", size,
                         ": verify_collective_hash: ranks issued different collectives, first "
                         "divergence ",
                         where));
  }

 private:
  bool on_ = false;
  std::size_t k_ = 64;
  std::uint64_t hash_ = 0xcbf29ce484222325ULL;
  std::uint64_t count_ = 0;
  std::vector<std::uint64_t> ring_;  // k_ entries of {seq, hash after, desc[112]}
};

}  // namespace tessera::comm::detail
