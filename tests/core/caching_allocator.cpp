// The caching allocator's bookkeeping (include/tessera/core/caching_allocator.hpp)
// driven by a fake system allocator on the host: no GPU, no CUDA runtime.
// Addresses are fake (never dereferenced); events complete when the test says.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <random>
#include <sstream>

#include <tessera/core/caching_allocator.hpp>

namespace test_core_caching_allocator {

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

/// What the fake system saw, shared with the test through a pointer.
struct fake_state {
  std::size_t capacity = std::size_t(1) << 40;  // bytes the "device" can hold
  std::size_t in_use = 0;
  std::uintptr_t next_addr = 1u << 20;
  std::map<std::uintptr_t, std::size_t> segments;
  std::vector<bool> event_done;  // by event id
  std::vector<tessera::stream_id> event_stream;
  int waits = 0;
};

struct fake_system {
  using event_type = int;
  static constexpr std::size_t base_alignment = 256;
  std::shared_ptr<fake_state> st = std::make_shared<fake_state>();

  void* allocate(std::size_t n) {
    if (st->in_use + n > st->capacity) return nullptr;
    const std::uintptr_t a = st->next_addr;
    st->next_addr += n + 4096;  // gaps, so segments never touch
    st->segments[a] = n;
    st->in_use += n;
    return reinterpret_cast<void*>(a);
  }
  void deallocate(void* p, std::size_t n) {
    auto it = st->segments.find(reinterpret_cast<std::uintptr_t>(p));
    REQUIRE(it != st->segments.end());
    REQUIRE(it->second == n);
    st->segments.erase(it);
    st->in_use -= n;
  }
  int record_event(tessera::stream_id s) {
    st->event_done.push_back(false);
    st->event_stream.push_back(s);
    return static_cast<int>(st->event_done.size()) - 1;
  }
  bool event_done(int e) const { return st->event_done[static_cast<std::size_t>(e)]; }
  void wait_event(int e) {
    ++st->waits;
    st->event_done[static_cast<std::size_t>(e)] = true;
  }
  void destroy_event(int) {}
  std::string name() const { return "fake:0"; }
};

static_assert(tessera::system_allocator<fake_system>);
using allocator = tessera::caching_allocator<fake_system>;

std::uintptr_t addr(void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

}  // namespace

TEST_CASE("caching allocator: sizes round to 512 B, segments follow the pool rules", "[core]") {
  allocator a;
  CHECK(a.round_size(0) == 512);
  CHECK(a.round_size(1) == 512);
  CHECK(a.round_size(512) == 512);
  CHECK(a.round_size(513) == 1024);
  CHECK(a.segment_size(512) == 2 * MiB);      // small pool
  CHECK(a.segment_size(1 * MiB) == 2 * MiB);  // still small (<= 1 MiB)
  CHECK(a.segment_size(1 * MiB + 512) == 20 * MiB);
  CHECK(a.segment_size(10 * MiB - 512) == 20 * MiB);
  CHECK(a.segment_size(10 * MiB) == 10 * MiB);  // own segment, rounded to 2 MiB
  CHECK(a.segment_size(11 * MiB + 512) == 12 * MiB);
}

TEST_CASE("caching allocator: a freed block is reused on its stream without a new segment",
          "[core]") {
  allocator a;
  void* p = a.allocate_on(1000, 1);
  CHECK(a.stats().allocated == 1000);
  CHECK(a.stats().reserved == 2 * MiB);
  a.deallocate(p, 1000);
  CHECK(a.stats().allocated == 0);
  CHECK(a.stats().reserved == 2 * MiB);  // cached, not returned
  void* q = a.allocate_on(900, 1);
  CHECK(q == p);
  const auto s = a.detailed_stats();
  CHECK(s.system_allocs == 1);
  CHECK(s.active == 1024);
  CHECK(s.cached == 2 * MiB - 1024);
  a.deallocate(q, 900);
}

TEST_CASE("caching allocator: blocks split from one segment and coalesce when freed", "[core]") {
  allocator a;
  void* x = a.allocate_on(1000, 0);  // 1024
  void* y = a.allocate_on(3000, 0);  // 3072
  void* z = a.allocate_on(512, 0);   // 512
  CHECK(addr(y) == addr(x) + 1024);
  CHECK(addr(z) == addr(y) + 3072);
  CHECK(a.detailed_stats().segments == 1);
  a.deallocate(y, 3000);
  a.deallocate(x, 1000);
  // x and y merged: a 4 KiB request fits at x's address.
  void* w = a.allocate_on(4096, 0);
  CHECK(w == x);
  a.deallocate(w, 4096);
  a.deallocate(z, 512);
  // The whole segment is one free block again.
  const auto s = a.detailed_stats();
  CHECK(s.cached == 2 * MiB);
  CHECK(s.largest_free == 2 * MiB);
  CHECK(s.inactive_split == 0);
}

TEST_CASE("caching allocator: best fit takes the smallest free block that fits", "[core]") {
  allocator a;
  void* big = a.allocate_on(8 * KiB, 0);
  void* sep1 = a.allocate_on(512, 0);
  void* mid = a.allocate_on(2 * KiB, 0);
  void* sep2 = a.allocate_on(512, 0);
  a.deallocate(big, 8 * KiB);
  a.deallocate(mid, 2 * KiB);
  CHECK(a.allocate_on(2 * KiB, 0) == mid);  // not big, which also fits
  CHECK(a.allocate_on(4 * KiB, 0) == big);
  (void)sep1, (void)sep2;
}

TEST_CASE("caching allocator: large requests use 20 MiB segments or their own", "[core]") {
  allocator a;
  void* p = a.allocate_on(5 * MiB, 0);
  CHECK(a.stats().reserved == 20 * MiB);
  void* q = a.allocate_on(5 * MiB, 0);  // from the 15 MiB remainder of the same segment
  CHECK(addr(q) == addr(p) + 5 * MiB);
  CHECK(a.detailed_stats().segments == 1);
  void* r = a.allocate_on(11 * MiB + 1, 0);  // its own 12 MiB segment
  CHECK(a.stats().reserved == 32 * MiB);
  // A small request never comes from the large pool.
  void* s = a.allocate_on(100, 0);
  CHECK(a.stats().reserved == 34 * MiB);
  // Large remainders below 1 MiB are not split off: the block keeps them.
  a.deallocate(r, 11 * MiB + 1);
  void* t = a.allocate_on(11 * MiB + 600 * KiB, 0);
  CHECK(t == r);
  CHECK(a.detailed_stats().active == 5 * MiB + 5 * MiB + 12 * MiB + 512);
  for (void* v : {p, q, t, s}) a.deallocate(v, 0);
  CHECK(a.stats().allocated == 0);
}

TEST_CASE("caching allocator: allocated, reserved and their peaks", "[core]") {
  allocator a;
  void* p = a.allocate_on(3 * MiB, 0);  // 20 MiB segment
  void* q = a.allocate_on(100, 0);      // 2 MiB segment
  CHECK(a.stats().allocated == 3 * MiB + 100);
  CHECK(a.stats().peak_allocated == 3 * MiB + 100);
  a.deallocate(p, 3 * MiB);
  CHECK(a.stats().allocated == 100);
  CHECK(a.stats().peak_allocated == 3 * MiB + 100);
  CHECK(a.stats().peak_reserved == 22 * MiB);
  a.empty_cache();
  CHECK(a.stats().reserved == 2 * MiB);
  CHECK(a.stats().peak_reserved == 22 * MiB);
  a.reset_peak();
  CHECK(a.stats().peak_reserved == 2 * MiB);
  CHECK(a.stats().peak_allocated == 100);
  CHECK(a.stats().num_allocs == 2);
  a.deallocate(q, 100);
}

TEST_CASE("caching allocator: streams keep separate free blocks", "[core]") {
  allocator a;
  void* p = a.allocate_on(4096, 1);
  a.deallocate(p, 4096);
  void* q = a.allocate_on(4096, 2);  // stream 2 must not take stream 1's cached block
  CHECK(q != p);
  CHECK(a.detailed_stats().segments == 2);
  void* r = a.allocate_on(4096, 1);
  CHECK(r == p);
  a.set_stream(2);
  void* s = a.allocate(1000);  // current stream 2: from q's segment
  CHECK(addr(s) == addr(q) + 4096);
  for (void* v : {q, r, s}) a.deallocate(v, 0);
}

TEST_CASE("caching allocator: a block used on another stream waits for its event", "[core]") {
  allocator a;
  auto st = a.system().st;
  void* p = a.allocate_on(4096, 1);
  a.record_stream(p, 2);
  a.record_stream(p, 1);  // its own stream: no event needed
  a.deallocate(p, 4096);
  REQUIRE(st->event_done.size() == 1);
  CHECK(st->event_stream[0] == 2);
  CHECK(a.detailed_stats().pending == 4096);
  CHECK(a.stats().allocated == 0);
  void* q = a.allocate_on(4096, 1);  // event not done: p is not reusable
  CHECK(q != p);
  st->event_done[0] = true;
  void* r = a.allocate_on(4096, 1);
  CHECK(r == p);
  CHECK(a.detailed_stats().pending == 0);
  a.deallocate(q, 0);
  a.deallocate(r, 0);
  CHECK_THROWS_AS(a.record_stream(r, 2), tessera::error);
}

TEST_CASE("caching allocator: empty_cache returns free segments and waits on pending events",
          "[core]") {
  allocator a;
  auto st = a.system().st;
  void* live = a.allocate_on(1000, 0);
  void* p = a.allocate_on(5 * MiB, 0);
  void* q = a.allocate_on(12 * MiB, 3);
  a.record_stream(q, 4);
  a.deallocate(p, 0);
  a.deallocate(q, 0);  // pending on stream 4
  CHECK(a.stats().reserved == 2 * MiB + 20 * MiB + 12 * MiB);
  a.empty_cache();
  CHECK(st->waits == 1);
  CHECK(a.stats().reserved == 2 * MiB);  // only the segment with a live block
  CHECK(st->in_use == 2 * MiB);
  const auto s = a.detailed_stats();
  CHECK(s.system_frees == 2);
  CHECK(s.inactive_split == 2 * MiB - 1024);  // free bytes in a partly used segment
  a.deallocate(live, 0);
  a.empty_cache();
  CHECK(a.stats().reserved == 0);
  CHECK(st->in_use == 0);
}

TEST_CASE("caching allocator: a refused segment empties the cache and retries, then throws",
          "[core]") {
  allocator a;
  auto st = a.system().st;
  st->capacity = 24 * MiB;
  void* p = a.allocate_on(5 * MiB, 0);  // 20 MiB
  a.deallocate(p, 0);
  void* q = a.allocate_on(21 * MiB, 0);  // a 22 MiB segment does not fit beside the cached 20
  CHECK(a.detailed_stats().oom_retries == 1);
  CHECK(a.stats().reserved == 22 * MiB);
  try {
    (void)a.allocate_on(13 * MiB, 0);
    FAIL("expected an out-of-memory error");
  } catch (const tessera::error& e) {
    const std::string m = e.what();
    CHECK(m.find("fake:0: out of memory allocating 13631488 bytes") != std::string::npos);
    CHECK(m.find("22020096 bytes allocated") != std::string::npos);
  }
  a.deallocate(q, 0);
}

TEST_CASE("caching allocator: fragmentation figures", "[core]") {
  allocator a;
  std::vector<void*> v;
  for (int i = 0; i < 8; ++i) v.push_back(a.allocate_on(256 * KiB, 0));  // fills 2 MiB exactly
  CHECK(a.detailed_stats().segments == 1);
  for (int i = 0; i < 8; i += 2) a.deallocate(v[static_cast<std::size_t>(i)], 0);
  auto s = a.detailed_stats();
  CHECK(s.cached == 1 * MiB);
  CHECK(s.inactive_split == 1 * MiB);
  CHECK(s.largest_free == 256 * KiB);
  // 512 KiB does not fit in any hole: a new segment.
  void* big = a.allocate_on(512 * KiB, 0);
  CHECK(a.detailed_stats().segments == 2);
  for (int i = 1; i < 8; i += 2) a.deallocate(v[static_cast<std::size_t>(i)], 0);
  s = a.detailed_stats();
  CHECK(s.largest_free == 2 * MiB);  // the first segment coalesced completely
  a.deallocate(big, 0);
}

TEST_CASE("caching allocator: the event log dumps as JSON", "[core]") {
  tessera::caching_allocator_config cfg;
  cfg.log_events = true;
  cfg.max_log_events = 5;
  allocator a(fake_system{}, cfg);
  void* p = a.allocate_on(1000, 7);
  a.deallocate(p, 1000);
  a.empty_cache();
  const auto ev = a.events();
  REQUIRE(ev.size() == 4);
  CHECK(ev[0].kind == tessera::alloc_event_kind::segment_alloc);
  CHECK(ev[0].bytes == 2 * MiB);
  CHECK(ev[1].kind == tessera::alloc_event_kind::alloc);
  CHECK(ev[1].bytes == 1000);
  CHECK(ev[1].allocated == 1000);
  CHECK(ev[1].stream == 7);
  CHECK(ev[2].kind == tessera::alloc_event_kind::free);
  CHECK(ev[2].allocated == 0);
  CHECK(ev[3].kind == tessera::alloc_event_kind::segment_free);
  CHECK(ev[3].reserved == 0);
  CHECK(ev[1].t_ns <= ev[2].t_ns);
  std::ostringstream os;
  a.write_json(os);
  const std::string j = os.str();
  CHECK(j.find("\"device\": \"fake:0\"") != std::string::npos);
  CHECK(j.find("\"kind\": \"segment_alloc\"") != std::string::npos);
  CHECK(j.find("\"kind\": \"alloc\", \"addr\": ") != std::string::npos);
  CHECK(j.find("\"dropped\": 0") != std::string::npos);
  void* q = a.allocate_on(10, 0);  // segment_alloc + alloc: only one fits in the log
  a.deallocate(q, 10);
  CHECK(a.events().size() == 5);
  CHECK(a.dropped_events() == 2);
}

TEST_CASE("caching allocator: bad frees, alignment and configuration are reported", "[core]") {
  allocator a;
  int x = 0;
  a.deallocate(&x, 4);
  CHECK(a.detailed_stats().bad_frees == 1);
  CHECK_THROWS_AS(a.allocate_on(64, 0, 512), tessera::config_error);
  CHECK_NOTHROW(a.deallocate(a.allocate_on(64, 0, 256), 64));
  tessera::caching_allocator_config bad;
  bad.min_block = 500;
  CHECK_THROWS_AS(allocator(fake_system{}, bad), tessera::config_error);
}

TEST_CASE("caching allocator: random traffic on three streams keeps every invariant", "[core]") {
  allocator a;
  auto st = a.system().st;
  std::mt19937_64 rng(4);
  struct live {
    void* p;
    std::size_t n;
    tessera::stream_id s;
  };
  std::vector<live> blocks;
  std::size_t expect_allocated = 0;
  for (int it = 0; it < 4000; ++it) {
    const bool alloc = blocks.empty() || rng() % 100 < 55;
    if (alloc) {
      std::size_t n = rng() % 4 == 0 ? rng() % (30 * MiB) : rng() % (64 * KiB);
      const tessera::stream_id s = rng() % 3;
      void* p = a.allocate_on(n, s, 256);
      REQUIRE(addr(p) % 256 == 0);
      if (rng() % 10 == 0) a.record_stream(p, (s + 1) % 3);
      blocks.push_back({p, n, s});
      expect_allocated += n;
    } else {
      const std::size_t i = rng() % blocks.size();
      a.deallocate(blocks[i].p, blocks[i].n);
      expect_allocated -= blocks[i].n;
      blocks[i] = blocks.back();
      blocks.pop_back();
    }
    if (rng() % 7 == 0)
      for (std::size_t e = 0; e < st->event_done.size(); ++e) st->event_done[e] = true;
    REQUIRE(a.stats().allocated == expect_allocated);
    // Live blocks never overlap.
    if (it % 97 == 0) {
      std::vector<std::pair<std::uintptr_t, std::size_t>> r;
      for (auto& b : blocks) r.push_back({addr(b.p), a.round_size(b.n)});
      std::sort(r.begin(), r.end());
      for (std::size_t k = 1; k < r.size(); ++k)
        REQUIRE(r[k - 1].first + r[k - 1].second <= r[k].first);
      const auto s = a.detailed_stats();
      REQUIRE(s.active + s.cached + s.pending == s.base.reserved);
      REQUIRE(s.base.reserved == st->in_use);
    }
  }
  for (auto& b : blocks) a.deallocate(b.p, b.n);
  a.empty_cache();
  CHECK(a.stats().allocated == 0);
  CHECK(a.stats().reserved == 0);
  CHECK(st->in_use == 0);
  CHECK(a.stats().peak_reserved >= a.stats().peak_allocated);
}

}  // namespace test_core_caching_allocator
