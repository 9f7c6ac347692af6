// The device loader's bookkeeping (include/tessera/data/device_loader.hpp)
// driven by a simulated system on the host: no GPU, no CUDA runtime.
//
// The simulation keeps CUDA's semantics where they matter: two in-order
// streams (copy, compute) whose operations run only when the test (or a host
// wait) lets them; an event completes when the operation recorded on its
// stream runs; a stream wait blocks its stream until the event's latest
// record (at the time of the wait) completed; a copy reads its source when it
// runs, not when it is queued. "Kernels" are test operations on the compute
// stream that read the device buffers when they run and compare them with the
// tokens the source produced. So a missing wait shows up as a kernel reading
// another micro-batch's tokens, under some order of execution: the tests run
// many random orders, the adversarial ones, and show that a system which drops
// the waits is caught.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tessera/data/device_loader.hpp"
#include "tessera/data/sampler.hpp"
#include "tessera/data/token_file.hpp"

namespace test_data_device_loader_bookkeeping {

using namespace tessera;
using namespace tessera::data;
using Catch::Contains;

namespace {

enum stream_index { copy_stream = 0, compute_stream = 1 };

/// The simulated device, shared by the fake system and the test.
struct sim_state {
  struct op {
    enum class kind { copy, record, wait, kernel } k = kind::wait;
    void* dst = nullptr;
    const void* src = nullptr;
    std::size_t n = 0;
    int event = -1;
    std::uint64_t target = 0;  // record: its sequence number; wait: the one awaited
    std::function<void()> fn;  // kernel
  };
  struct event {
    std::uint64_t recorded = 0, completed = 0;
    bool alive = true;
  };
  std::array<std::deque<op>, 2> streams;
  std::vector<event> events;
  std::map<void*, std::unique_ptr<std::byte[]>> pinned, device;  // live allocations
  std::vector<std::unique_ptr<std::byte[]>> freed_device;        // kept: kernels may still read
  std::mt19937_64 rng{1};
  // Observations.
  int host_waits = 0;           // host_wait calls
  int blocking_host_waits = 0;  // ... that had to run operations first
  int copies_run = 0, kernels_run = 0;
  std::vector<std::string> trace;  // "copy", "kernel", "host_wait" in execution order
  // Sabotage: a system that forgets a wait, to show the tests would notice.
  bool drop_copy_stream_waits = false, drop_host_waits = false;
  // When a host wait must run operations, which stream goes first.
  bool random_order = true;

  bool runnable(int s) const {
    const auto& q = streams[static_cast<std::size_t>(s)];
    if (q.empty()) return false;
    const op& o = q.front();
    return o.k != op::kind::wait || events[static_cast<std::size_t>(o.event)].completed >= o.target;
  }
  void run_one(int s) {
    auto& q = streams[static_cast<std::size_t>(s)];
    op o = std::move(q.front());
    q.pop_front();
    switch (o.k) {
      case op::kind::copy:
        std::memcpy(o.dst, o.src, o.n);
        ++copies_run;
        trace.push_back("copy");
        break;
      case op::kind::record: {
        auto& e = events[static_cast<std::size_t>(o.event)];
        e.completed = std::max(e.completed, o.target);
        break;
      }
      case op::kind::wait:
        break;
      case op::kind::kernel:
        o.fn();
        ++kernels_run;
        trace.push_back("kernel");
        break;
    }
  }
  /// Runs one operation of a runnable stream (random or copy first);
  /// false when neither can run.
  bool step() {
    const bool c = runnable(copy_stream), k = runnable(compute_stream);
    if (!c && !k) return false;
    int s = c ? copy_stream : compute_stream;
    if (c && k && random_order) s = static_cast<int>(rng() % 2);
    run_one(s);
    return true;
  }
  /// Runs up to `max_ops` operations in a random order.
  void run_some(int max_ops) {
    for (int i = 0; i < max_ops && step(); ++i) {
    }
  }
  /// Runs only `s` while it can.
  void run_stream(int s) {
    while (runnable(s)) run_one(s);
  }
  /// Runs everything; a stream left blocked is a deadlock.
  void drain() {
    while (step()) {
    }
    REQUIRE(streams[0].empty());
    REQUIRE(streams[1].empty());
  }
  std::size_t pending_copies_reading(const void* p, std::size_t n) const {
    std::size_t c = 0;
    for (const auto& q : streams)
      for (const auto& o : q)
        if (o.k == op::kind::copy &&
            static_cast<const std::byte*>(o.src) < static_cast<const std::byte*>(p) + n &&
            static_cast<const std::byte*>(p) < static_cast<const std::byte*>(o.src) + o.n)
          ++c;
    return c;
  }
};

/// The loader_system over sim_state.
struct sim_system {
  using event_type = int;
  std::shared_ptr<sim_state> st = std::make_shared<sim_state>();

  void* allocate_pinned(std::size_t n) { return alloc(st->pinned, n); }
  void deallocate_pinned(void* p, std::size_t n) noexcept {
    // A copy still queued would read freed memory.
    CHECK(st->pending_copies_reading(p, n) == 0);
    CHECK(st->pinned.erase(p) == 1);
  }
  void* allocate_device(std::size_t n) { return alloc(st->device, n); }
  void deallocate_device(void* p, std::size_t) noexcept {
    auto it = st->device.find(p);
    CHECK(it != st->device.end());
    if (it == st->device.end()) return;
    st->freed_device.push_back(std::move(it->second));  // as record_stream: reads may be queued
    st->device.erase(it);
  }
  int create_event() {
    st->events.push_back({});
    return static_cast<int>(st->events.size()) - 1;
  }
  void destroy_event(int& e) noexcept {
    CHECK(st->events[static_cast<std::size_t>(e)].alive);
    st->events[static_cast<std::size_t>(e)].alive = false;
  }
  void copy_to_device(void* d, const void* h, std::size_t n) {
    REQUIRE(st->device.count(d) == 1);
    REQUIRE(st->pinned.count(const_cast<void*>(h)) == 1);
    sim_state::op o;
    o.k = sim_state::op::kind::copy;
    o.dst = d;
    o.src = h;
    o.n = n;
    st->streams[copy_stream].push_back(std::move(o));
  }
  void record_on_copy_stream(int& e) { record(copy_stream, e); }
  void record_on_compute_stream(int& e) { record(compute_stream, e); }
  void copy_stream_wait(int& e) {
    if (!st->drop_copy_stream_waits) wait(copy_stream, e);
  }
  void compute_stream_wait(int& e) { wait(compute_stream, e); }
  void host_wait(int& e) {
    ++st->host_waits;
    st->trace.push_back("host_wait");
    if (st->drop_host_waits) return;
    const auto& ev = st->events[static_cast<std::size_t>(e)];
    if (ev.completed < ev.recorded) ++st->blocking_host_waits;
    while (ev.completed < ev.recorded) REQUIRE(st->step());  // else: deadlock
  }

 private:
  static void* alloc(std::map<void*, std::unique_ptr<std::byte[]>>& m, std::size_t n) {
    auto buf = std::make_unique<std::byte[]>(n);
    std::memset(buf.get(), 0xEE, n);  // poison
    void* p = buf.get();
    m.emplace(p, std::move(buf));
    return p;
  }
  void record(int s, int e) {
    auto& ev = st->events[static_cast<std::size_t>(e)];
    REQUIRE(ev.alive);
    sim_state::op o;
    o.k = sim_state::op::kind::record;
    o.event = e;
    o.target = ++ev.recorded;
    st->streams[static_cast<std::size_t>(s)].push_back(std::move(o));
  }
  void wait(int s, int e) {
    sim_state::op o;
    o.k = sim_state::op::kind::wait;
    o.event = e;
    o.target = st->events[static_cast<std::size_t>(e)].recorded;
    st->streams[static_cast<std::size_t>(s)].push_back(std::move(o));
  }
};
static_assert(loader_system<sim_system>);
using loader = basic_device_loader<sim_system>;

/// Token (b, t) of the window of (step, micro-batch): a hash below V, with
/// every 7th target the ignore index when `with_ignored`.
struct hashed_source {
  std::int64_t B, T, V;
  bool with_ignored = false;
  std::int32_t token(std::uint64_t step, std::uint64_t mb, std::int64_t b, std::int64_t t) const {
    if (with_ignored && t > 0 && (b * (T + 1) + t + static_cast<std::int64_t>(step)) % 7 == 0)
      return -100;
    const std::uint64_t h =
        splitmix64(splitmix64(splitmix64(step) ^ mb) ^ static_cast<std::uint64_t>(b * (T + 1) + t));
    return static_cast<std::int32_t>(h % static_cast<std::uint64_t>(V));
  }
  void operator()(std::uint64_t step, std::uint64_t mb, std::int32_t* out) const {
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t <= T; ++t) out[b * (T + 1) + t] = token(step, mb, b, t);
  }
};

/// The test's model: queues kernels on the compute stream that read a batch
/// when they run (inputs early, as the embedding; targets, as the loss;
/// inputs again at the end, as the embedding backward) and count mismatches.
struct checker {
  std::shared_ptr<sim_state> st;
  hashed_source src;
  int batches = 0;
  std::shared_ptr<int> mismatches = std::make_shared<int>(0);

  void queue_step(const device_batch& d) {
    const std::int64_t B = src.B, T = src.T;
    const std::uint64_t step = d.step, mb = d.micro_batch;
    auto check_inputs = [=, s = src, bad = mismatches] {
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < T; ++t)
          *bad += d.d_inputs[b * T + t] != s.token(step, mb, b, t);
    };
    auto check_targets = [=, s = src, bad = mismatches] {
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < T; ++t)
          *bad += d.d_targets[b * T + t] != s.token(step, mb, b, t + 1);
    };
    for (auto fn : {std::function<void()>(check_inputs), std::function<void()>(check_targets),
                    std::function<void()>(check_inputs)}) {
      sim_state::op o;
      o.k = sim_state::op::kind::kernel;
      o.fn = fn;
      st->streams[compute_stream].push_back(std::move(o));
    }
    ++batches;
  }
};

std::int64_t expected_scored(const hashed_source& s, std::uint64_t step, std::uint64_t mb) {
  std::int64_t n = 0;
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t t = 1; t <= s.T; ++t) n += s.token(step, mb, b, t) != -100;
  return n;
}

device_loader_options options(const hashed_source& s, std::int64_t A = 1, std::uint64_t first = 0) {
  return {s.B, s.T, s.V, -100, A, first};
}

}  // namespace

TEST_CASE("device loader: every micro-batch reaches the device intact, in any execution order",
          "[data][loader]") {
  const hashed_source src{3, 17, 1000, true};
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    sim_system sys;
    auto st = sys.st;
    st->rng.seed(seed);
    checker model{st, src};
    {
      // Rank 1 of a job with A = 3 micro-batches per rank: global 3, 4, 5.
      loader ld(sys, src, options(src, 3, 3));
      ld.prefetch(10, 3);
      std::uint64_t step = 10, mb = 3;
      for (int k = 0; k < 12; ++k) {
        st->run_some(static_cast<int>(st->rng() % 8));
        const device_batch d = ld.next();
        REQUIRE(d.step == step);
        REQUIRE(d.micro_batch == mb);
        REQUIRE(d.N == src.B * src.T);
        REQUIRE(d.d_targets == d.d_inputs + d.N);
        REQUIRE(d.scored == expected_scored(src, step, mb));
        st->run_some(static_cast<int>(st->rng() % 8));
        model.queue_step(d);
        std::tie(step, mb) = ld.following_micro_batch(step, mb);
      }
      CHECK(ld.copies() == 13);  // the first prefetch and one per next()
      st->drain();
    }
    CHECK(*model.mismatches == 0);
    CHECK(st->kernels_run == 36);
    CHECK(st->pinned.empty());
    CHECK(st->device.empty());
    for (const auto& e : st->events) CHECK(!e.alive);
  }
}

TEST_CASE("device loader: the order of micro-batches follows the sampler's rank layout",
          "[data][loader]") {
  const hashed_source src{1, 4, 50};
  loader ld(sim_system{}, src, options(src, 2, 4));  // rank 2 of A = 2: global 4, 5
  using P = std::pair<std::uint64_t, std::uint64_t>;
  CHECK(ld.following_micro_batch(0, 4) == P{0, 5});
  CHECK(ld.following_micro_batch(0, 5) == P{1, 4});
  CHECK(ld.following_micro_batch(7, 5) == P{8, 4});
  CHECK_THROWS_WITH(ld.prefetch(0, 3), Contains("micro-batch 3 is outside [4, 6)"));
  CHECK_THROWS_WITH(ld.prefetch(0, 6), Contains("micro-batch 6 is outside [4, 6)"));
  CHECK(ld.copies() == 0);
  CHECK_THROWS_WITH(ld.next(), Contains("nothing prefetched"));
}

TEST_CASE("device loader: the copy of micro-batch k+1 overlaps the compute of k",
          "[data][loader]") {
  const hashed_source src{2, 8, 100};
  sim_system sys;
  auto st = sys.st;
  checker model{st, src};
  loader ld(sys, src, options(src, 4));
  ld.prefetch(0, 0);
  for (int k = 0; k < 8; ++k) {
    const device_batch d = ld.next();  // queues the copy of k+1
    model.queue_step(d);               // three kernels of batch k
    // Let the copy stream run as far as it can, and the compute stream up to
    // (not into) batch k's kernels: "the GPU is busy computing batch k".
    const std::size_t k_kernels = 3;
    for (;;) {
      st->run_stream(copy_stream);
      auto& q = st->streams[compute_stream];
      std::size_t kernels_queued = 0;
      for (const auto& o : q) kernels_queued += o.k == sim_state::op::kind::kernel;
      if (kernels_queued <= k_kernels && (q.empty() || q.front().k == sim_state::op::kind::kernel))
        break;
      REQUIRE(st->runnable(compute_stream));
      st->run_one(compute_stream);
    }
    // Batch k's kernels have not run, and the copy of k+1 is complete.
    CHECK(st->streams[compute_stream].size() == k_kernels);
    CHECK(st->streams[copy_stream].empty());
    CHECK(st->copies_run == k + 2);
    CHECK(st->kernels_run == 3 * k);
  }
  st->drain();
  CHECK(*model.mismatches == 0);
}

TEST_CASE(
    "device loader: reusing a buffer waits for its last reader; without the waits, "
    "batches are corrupted",
    "[data][loader]") {
  const hashed_source src{2, 16, 500};
  // Adversarial orders: (a) the copy stream runs eagerly and compute lags
  // (a copy that did not wait for the compute would overwrite a batch still
  // to be read); (b) nothing runs until the host waits (a pinned buffer
  // refilled before its copy ran would send the wrong tokens).
  auto run = [&](bool eager_copies, bool drop_copy_waits, bool drop_host_waits) {
    sim_system sys;
    auto st = sys.st;
    st->random_order = false;  // host waits run the copy stream first
    st->drop_copy_stream_waits = drop_copy_waits;
    st->drop_host_waits = drop_host_waits;
    checker model{st, src};
    {
      loader ld(sys, src, options(src, 2));
      ld.prefetch(0, 0);
      for (int k = 0; k < 10; ++k) {
        const device_batch d = ld.next();
        model.queue_step(d);
        if (eager_copies) st->run_stream(copy_stream);
      }
      st->drop_host_waits = false;  // the destructor's waits
      st->drain();
    }
    return *model.mismatches;
  };
  CHECK(run(true, false, false) == 0);
  CHECK(run(false, false, false) == 0);
  CHECK(run(true, true, false) > 0);   // no copy-stream wait on the release event
  CHECK(run(false, false, true) > 0);  // no host wait before refilling pinned memory
}

TEST_CASE("device loader: next() never blocks the host; prefetch waits only for an old copy",
          "[data][loader]") {
  const hashed_source src{1, 32, 300};
  sim_system sys;
  auto st = sys.st;
  checker model{st, src};
  loader ld(sys, src, options(src));
  ld.prefetch(0, 0);
  CHECK(st->host_waits == 0);  // a fresh slot: no copy to wait for
  ld.next(false);
  CHECK(st->host_waits == 0);
  ld.prefetch(1, 0);  // the other slot, never copied from
  CHECK(st->host_waits == 0);
  // Steady state, the GPU keeping up (everything runs between calls): each
  // next() waits for the copy two batches back, which is long done.
  for (int k = 0; k < 6; ++k) {
    st->drain();
    model.queue_step(ld.next());
  }
  st->drain();
  CHECK(st->host_waits == 6);
  CHECK(st->blocking_host_waits == 0);
  // A GPU that lags: nothing runs between calls. next(k) refills the pinned
  // buffer of k-1 and so waits for the copy of k-1: the first two calls find
  // copies issued before the lag (done), every later one blocks until the
  // GPU catches up (it ran ahead by two micro-batches).
  const int before = st->blocking_host_waits;
  for (int k = 0; k < 6; ++k) model.queue_step(ld.next());
  CHECK(st->blocking_host_waits - before == 4);
  st->drain();
  CHECK(*model.mismatches == 0);
}

TEST_CASE("device loader: a bad token id throws on the host, naming it, and changes nothing",
          "[data][loader]") {
  const hashed_source good{2, 8, 1000};
  std::uint64_t bad_step = 2;
  std::int32_t bad_id = 1000;
  auto source = [&](std::uint64_t step, std::uint64_t mb, std::int32_t* out) {
    good(step, mb, out);
    if (step == bad_step) out[1 * 9 + 5] = bad_id;  // row 1, position 5
  };
  sim_system sys;
  auto st = sys.st;
  checker model{st, good};
  loader ld(sys, source, options(good));
  ld.prefetch(0, 0);
  model.queue_step(ld.next());  // prefetches step 1
  CHECK_THROWS_AS(ld.prefetch(2, 0), config_error);
  CHECK_THROWS_WITH(ld.prefetch(2, 0),
                    Contains("token id 1000 at row 1, position 5") &&
                        Contains("(B=2, T+1=9) window of step 2, micro-batch 0") &&
                        Contains("V=1000") && Contains("ignore index -100"));
  CHECK(ld.copies() == 2);                 // nothing queued by the failed prefetches
  const device_batch d1 = ld.next(false);  // step 1 is still the prefetched one
  CHECK(d1.step == 1);
  model.queue_step(d1);
  ld.prefetch(3, 0);
  // next() checks the following micro-batch before it hands anything out.
  bad_step = 4;
  bad_id = -7;
  CHECK_THROWS_WITH(ld.next(), Contains("token id -7 at row 1, position 5") && Contains("step 4"));
  CHECK(ld.has_prefetched());
  const device_batch d3 = ld.next(false);
  CHECK(d3.step == 3);
  model.queue_step(d3);
  st->drain();
  CHECK(*model.mismatches == 0);
  // The ignore index is valid anywhere and not scored.
  const hashed_source ignoring{2, 8, 1000, true};
  loader ld2(sim_system{}, ignoring, options(ignoring));
  ld2.prefetch(5, 0);
  const device_batch d = ld2.next(false);
  CHECK(d.scored == expected_scored(ignoring, 5, 0));
  CHECK(d.scored < d.N);
}

TEST_CASE("device loader: a second prefetch replaces the one not yet handed out",
          "[data][loader]") {
  const hashed_source src{2, 8, 100};
  sim_system sys;
  auto st = sys.st;
  st->rng.seed(7);
  checker model{st, src};
  loader ld(sys, src, options(src));
  ld.prefetch(0, 0);
  ld.prefetch(5, 0);
  device_batch d = ld.next();
  CHECK(d.step == 5);
  model.queue_step(d);
  st->run_some(3);
  ld.prefetch(9, 0);  // replaces the automatic prefetch of step 6
  d = ld.next();
  CHECK(d.step == 9);
  model.queue_step(d);
  d = ld.next();
  CHECK(d.step == 10);
  model.queue_step(d);
  CHECK(ld.copies() == 6);  // 0, 5, 6 (replaced), 9, 10, 11
  st->drain();
  CHECK(*model.mismatches == 0);
}

TEST_CASE("device loader: buffers, events and options", "[data][loader]") {
  const hashed_source src{4, 64, 32000};
  sim_system sys;
  auto st = sys.st;
  {
    loader ld(sys, src, options(src));
    CHECK(ld.N() == 256);
    CHECK(ld.buffer_bytes() == 2 * 256 * 4);
    CHECK(ld.pinned_bytes() == 2 * ld.buffer_bytes());
    CHECK(ld.device_bytes() == 2 * ld.buffer_bytes());
    CHECK(st->pinned.size() == 2);
    CHECK(st->device.size() == 2);
    CHECK(st->events.size() == 4);
    ld.prefetch(0, 0);
    ld.next();  // leaves a copy queued: the destructor must wait for it
    CHECK(st->streams[copy_stream].size() >= 2);
  }
  CHECK(st->streams[copy_stream].empty());  // the destructor's host wait ran it
  CHECK(st->pinned.empty());
  CHECK(st->device.empty());
  auto bad = [&](device_loader_options o) { return loader(sim_system{}, src, o); };
  device_loader_options o = options(src);
  o.B = 0;
  CHECK_THROWS_WITH(bad(o), Contains("B=0"));
  o = options(src);
  o.V = 0;
  CHECK_THROWS_WITH(bad(o), Contains("V=0"));
  o = options(src);
  o.micro_batches = 0;
  CHECK_THROWS_WITH(bad(o), Contains("micro_batches=0"));
  CHECK_THROWS_WITH(loader(sim_system{}, window_source{}, options(src)),
                    Contains("window source is empty"));
}

TEST_CASE("device loader: over a batch_sampler, the device holds the sampler's windows",
          "[data][loader]") {
  namespace fs = std::filesystem;
  const fs::path path =
      fs::temp_directory_path() / ("tessera_loader_" + std::to_string(::getpid()) + ".tok");
  std::vector<std::uint32_t> toks(5000);
  for (std::size_t i = 0; i < toks.size(); ++i)
    toks[i] = static_cast<std::uint32_t>((i * 2654435761u) % 512);
  write_token_file(path, toks, 512);
  {
    const token_file f = token_file::open(path);
    const batch_sampler sampler(f, f.split(0.1).train, 3, 32, 1234);
    sim_system sys;
    auto st = sys.st;
    st->rng.seed(3);
    loader ld(sys, sampler, 512, /*micro_batches=*/2, /*first_micro_batch=*/2);
    ld.prefetch(0, 2);
    std::vector<std::int32_t> w(3 * 33);
    for (int k = 0; k < 6; ++k) {
      const device_batch d = ld.next();
      st->drain();  // the batch is on the "device" now
      sampler.fill(d.step, d.micro_batch, w.data());
      for (std::int64_t b = 0; b < 3; ++b)
        for (std::int64_t t = 0; t < 32; ++t) {
          REQUIRE(d.d_inputs[b * 32 + t] == w[static_cast<std::size_t>(b * 33 + t)]);
          REQUIRE(d.d_targets[b * 32 + t] == w[static_cast<std::size_t>(b * 33 + t + 1)]);
        }
      CHECK(d.scored == 3 * 32);
      CHECK(d.micro_batch == static_cast<std::uint64_t>(2 + k % 2));
      CHECK(d.step == static_cast<std::uint64_t>(k / 2));
    }
    // A model with a smaller vocabulary than the file's is caught on the host.
    loader small(sim_system{}, sampler, 100, 2, 2);
    CHECK_THROWS_WITH(small.prefetch(0, 2),
                      Contains("is not a valid id for the vocabulary size V=100"));
  }
  fs::remove(path);
}

// Context parallelism: each of cp ranks holds its head-tail tokens of the
// same windows, computed here from the chunk arithmetic alone (rank r:
// chunks r and 2 cp - 1 - r of T/(2 cp) tokens); together the ranks hold
// every position once.
TEST_CASE("device loader: under context parallelism each rank holds its head-tail tokens",
          "[data][loader]") {
  const hashed_source src{2, 24, 1000, true};
  for (int cp : {2, 3}) {
    std::vector<int> seen(static_cast<std::size_t>(src.B * src.T), 0);
    for (int r = 0; r < cp; ++r) {
      sim_system sys;
      auto st = sys.st;
      device_loader_options o = options(src);
      o.cp = cp;
      o.cp_rank = r;
      loader ld(sys, src, o);
      const std::int64_t L = src.T / cp, c = src.T / (2 * cp);
      CHECK(ld.N() == src.B * L);
      CHECK(ld.buffer_bytes() == static_cast<std::size_t>(2 * src.B * L * 4));
      ld.prefetch(5, 0);
      const device_batch d = ld.next(false);
      st->drain();
      std::int64_t scored = 0;
      for (std::int64_t b = 0; b < src.B; ++b)
        for (std::int64_t l = 0; l < L; ++l) {
          const std::int64_t p = l < c ? r * c + l : (2 * cp - 1 - r) * c + (l - c);
          REQUIRE(d.d_inputs[b * L + l] == src.token(5, 0, b, p));
          REQUIRE(d.d_targets[b * L + l] == src.token(5, 0, b, p + 1));
          scored += src.token(5, 0, b, p + 1) != -100;
          ++seen[static_cast<std::size_t>(b * src.T + p)];
        }
      CHECK(d.scored == scored);
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  }
  device_loader_options o = options(src);
  o.cp = 5;  // 2 cp = 10 does not divide T = 24
  CHECK_THROWS_WITH(loader(sim_system{}, src, o), Contains("T=24 is not divisible by 2*cp=10"));
  o.cp = 2;
  o.cp_rank = 2;
  CHECK_THROWS_WITH(loader(sim_system{}, src, o), Contains("rank 2 is not in [0, cp=2)"));
}

}  // namespace test_data_device_loader_bookkeeping
