#pragma once
// A simulated device for host tests of stream order: two in-order streams
// (a context's kernels, a communicator's collectives), events, a memory
// resource that hands a freed block out again at once, an execution
// context whose kernels are the host kernels queued on its stream, and a
// communicator whose collectives run on its own stream and whose peers
// mirror the calling rank. No GPU, no CUDA runtime; CUDA's semantics where
// they matter:
// - operations run only when the host waits for an event or a stream (or,
//   in program order, when queued), each stream in the order it was given;
// - an event completes when the operation recorded on its stream runs; a
//   stream wait blocks its stream until the event's latest record (at the
//   time of the wait) completed;
// - a kernel or a collective reads its inputs when it runs, not when queued;
// - a freed block is handed out again at once to work on the context's
//   stream (as the caching allocator does), and its new owner's first write
//   (0xFF bytes: NaN in every float type) is queued there, so a collective
//   still using a block it has no right to reads or spoils it.
// tests/parallel/stream_order.cpp runs the data-parallel engine over it
// (tests/data/device_loader_bookkeeping.cpp simulates the loader's copy
// stream in the same way).

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/memory.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/kernels/optimizer.hpp"

namespace simulated_streams {

using namespace tessera;

/// The two streams (0 is no stream, as a null cudaStream_t is "none" to follow()).
constexpr int compute_stream = 1, comm_stream = 2;

/// When a simulated device runs what is queued.
enum class run_order {
  program,        ///< each operation when it is queued (the host backend's order)
  comm_first,     ///< only when the host waits; the communicator's stream first
  compute_first,  ///< only when the host waits; the kernels first
  random,         ///< only when the host waits; a random stream of the two that can run
};

const char* name(run_order o) {
  switch (o) {
    case run_order::program:
      return "program";
    case run_order::comm_first:
      return "comm_first";
    case run_order::compute_first:
      return "compute_first";
    case run_order::random:
      return "random";
  }
  return "?";
}

/// The events a faulty system forgets (the tests show that each matters).
struct faults {
  bool drop_follow = false;        ///< a collective does not wait for the kernels before it
  bool drop_order_before = false;  ///< the kernels after a collective do not wait for it
};

/// Two streams, events, and the order in which queued work runs.
struct device {
  struct op {
    enum class kind { work, record, wait } k = kind::work;
    int event = -1;
    std::uint64_t target = 0;  // record: its sequence number; wait: the one awaited
    std::function<void()> fn;  // work
  };
  struct event {
    std::uint64_t recorded = 0, completed = 0;
  };
  std::array<std::deque<op>, 2> streams;  // compute_stream's, comm_stream's
  std::deque<op>& queue_of(int s) { return streams[static_cast<std::size_t>(s - 1)]; }
  const std::deque<op>& queue_of(int s) const { return streams[static_cast<std::size_t>(s - 1)]; }
  std::vector<event> events;
  std::multiset<const std::byte*> unwritten;  // outputs of queued collectives, not yet run
  run_order order = run_order::program;
  std::mt19937_64 rng{1};

  bool runnable(int s) const {
    const auto& q = queue_of(s);
    if (q.empty()) return false;
    const op& o = q.front();
    return o.k != op::kind::wait || events[static_cast<std::size_t>(o.event)].completed >= o.target;
  }
  void run_one(int s) {
    auto& q = queue_of(s);
    op o = std::move(q.front());
    q.pop_front();
    if (o.k == op::kind::work) o.fn();
    if (o.k == op::kind::record) {
      auto& e = events[static_cast<std::size_t>(o.event)];
      e.completed = std::max(e.completed, o.target);
    }
  }
  /// Runs one operation of a stream that can run (which one: the order);
  /// false when neither can.
  bool step() {
    const bool k = runnable(compute_stream), c = runnable(comm_stream);
    if (!k && !c) return false;
    int s = k ? compute_stream : comm_stream;
    if (k && c) {
      if (order == run_order::comm_first) s = comm_stream;
      if (order == run_order::random) s = rng() % 2 == 0 ? compute_stream : comm_stream;
    }
    run_one(s);
    return true;
  }
  void queue(int s, op o) {
    queue_of(s).push_back(std::move(o));
    if (order == run_order::program)
      while (step()) {
      }
  }
  void work(int s, std::function<void()> fn) { queue(s, {op::kind::work, -1, 0, std::move(fn)}); }
  int create_event() {
    events.push_back({});
    return static_cast<int>(events.size()) - 1;
  }
  void record(int s, int e) {
    const std::uint64_t n = ++events[static_cast<std::size_t>(e)].recorded;
    queue(s, {op::kind::record, e, n, {}});
  }
  void wait(int s, int e) {
    queue(s, {op::kind::wait, e, events[static_cast<std::size_t>(e)].recorded, {}});
  }
  bool done(int e) const {
    const auto& ev = events[static_cast<std::size_t>(e)];
    return ev.completed >= ev.recorded;
  }
  /// The host blocks until `e` completed (a stream left blocked: deadlock).
  void host_wait(int e) {
    while (!done(e)) REQUIRE(step());
  }
  /// The host blocks until stream `s` ran everything queued on it.
  void host_wait_stream(int s) {
    while (!queue_of(s).empty()) REQUIRE(step());
  }
};

/// Memory of the simulated device: a freed block goes to the next request
/// of its size at once, whose first write (poison) is queued on the
/// context's stream. Blocks live as long as the resource (nothing queued
/// ever reads memory returned to the system).
class device_memory final : public memory_resource {
 public:
  explicit device_memory(device& d) : dev_(&d) {}
  void* allocate(std::size_t bytes, std::size_t) override {
    bytes = std::max<std::size_t>(bytes, 1);
    auto& free = free_[bytes];
    if (!free.empty()) {
      void* p = free.back();
      free.pop_back();
      ++reused_;
      dev_->work(compute_stream, [p, bytes] { std::memset(p, 0xFF, bytes); });
      return p;
    }
    blocks_.push_back(std::make_unique<std::byte[]>(bytes));
    std::memset(blocks_.back().get(), 0xFF, bytes);
    return blocks_.back().get();
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    free_[std::max<std::size_t>(bytes, 1)].push_back(p);
  }
  memory_stats stats() const override { return {}; }
  void reset_peak() override {}
  std::string name() const override { return "simulated device"; }
  /// Requests served by a freed block.
  int reused() const { return reused_; }

 private:
  device* dev_;
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  std::map<std::size_t, std::vector<void*>> free_;
  int reused_ = 0;
};

/// The simulated device's backend tag (tensors of its memory).
struct device_backend {
  static constexpr const char* name = "simulated";
  static memory_resource& default_resource() {
    static host_memory_resource r;
    return r;
  }
  static void copy_to_host(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }
  static void copy_from_host(void* dst, const void* src, std::size_t n) {
    std::memcpy(dst, src, n);
  }
  static void synchronize() {}
};

/// An execution context on the simulated device: byte moves and kernels
/// are queued on the context's stream; a copy to or from the host waits
/// for it first (as cudaMemcpy does).
struct sim_context {
  using backend_type = device_backend;
  static constexpr bool host_accessible = false;
  device* dev;
  device_memory* mem;
  kernels::host_context host;  // what a queued kernel runs with
  /// The stream this context names (its work always goes to the device's
  /// compute_stream: another id only stands for another context's stream).
  int id = compute_stream;

  memory_resource& resource() const { return *mem; }
  int stream() const { return id; }
  void zero(void* p, std::size_t n) const {
    dev->work(compute_stream, [p, n] { std::memset(p, 0, n); });
  }
  void copy(void* dst, const void* src, std::size_t n) const {
    dev->work(compute_stream, [dst, src, n] { std::memmove(dst, src, n); });
  }
  void to_host(void* h, const void* d, std::size_t n) const {
    dev->host_wait_stream(compute_stream);
    std::memcpy(h, d, n);
  }
  void from_host(void* d, const void* h, std::size_t n) const {
    dev->host_wait_stream(compute_stream);
    std::memcpy(d, h, n);
  }
  void synchronize() const { dev->host_wait_stream(compute_stream); }
  void apply_threads() const {}
  /// Queues `f` on the context's stream.
  void kernel(std::function<void()> f) const { dev->work(compute_stream, std::move(f)); }
};
static_assert(kernels::execution_context<sim_context>);

// The kernels the engine and the optimizer call on a context (found by
// argument-dependent lookup on sim_context): the host kernel, queued.
template <class... A>
void cast(const sim_context& c, A... a) {
  c.kernel([&c, a...] { kernels::cast(c.host, a...); });
}
template <class... A>
void residual_add(const sim_context& c, A... a) {
  c.kernel([&c, a...] { kernels::residual_add(c.host, a...); });
}
template <class... A>
void grad_sum_squares(const sim_context& c, A... a) {
  c.kernel([&c, a...] { kernels::grad_sum_squares(c.host, a...); });
}
template <class... A>
void clip_coefficient(const sim_context& c, A... a) {
  c.kernel([&c, a...] { kernels::clip_coefficient(c.host, a...); });
}
template <class... A>
void adamw_step(const sim_context& c, A... a) {
  c.kernel([&c, a...] { kernels::adamw_step(c.host, a...); });
}

/// A request of the simulated communicator: an event recorded after its
/// collective on the communicator's stream.
class sim_request {
 public:
  sim_request() = default;
  sim_request(device* d, int event, const faults* f) : dev_(d), event_(event), f_(f) {}
  sim_request(sim_request&& o) noexcept
      : dev_(std::exchange(o.dev_, nullptr)), event_(o.event_), f_(o.f_) {}
  /// Waits for the held operation first, as nccl_request does.
  sim_request& operator=(sim_request&& o) noexcept {
    if (this != &o) {
      drain();
      dev_ = std::exchange(o.dev_, nullptr);
      event_ = o.event_;
      f_ = o.f_;
    }
    return *this;
  }
  /// A handle destroyed before completion waits for it (nccl_request's rule).
  ~sim_request() { drain(); }
  void wait() {
    if (dev_) dev_->host_wait(event_);
  }
  bool test() { return !dev_ || dev_->done(event_); }
  void order_before(int stream) const {
    if (dev_ && !f_->drop_order_before) dev_->wait(stream, event_);
  }

 private:
  void drain() noexcept {
    if (!dev_) return;
    while (!dev_->done(event_) && dev_->step()) {
    }
  }
  device* dev_ = nullptr;
  int event_ = -1;
  const faults* f_ = nullptr;
};

/// Rank `rank` of a group of `size` on the simulated device, its peers
/// mirroring it: a sum adds `size` copies of this rank's buffer, a gather
/// places this rank's chunk at every rank's place. Collectives run on the
/// communicator's stream; follow() orders each after the kernels queued
/// before it (unless the faults drop that event).
class sim_communicator {
 public:
  static constexpr comm::buffer_space buffers = comm::buffer_space::device;
  sim_communicator(device& d, int rank, int size, const faults& f)
      : dev_(&d), rank_(rank), size_(size), f_(&f) {}

  int rank() const { return rank_; }
  int size() const { return size_; }
  comm::comm_stats stats() const { return {}; }
  std::uint64_t bytes_sent() const { return 0; }
  void reset_stats() {}
  void set_timeout(std::chrono::milliseconds) {}
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(1000); }
  void set_debug(bool) {}
  void verify_collective_hash() {}
  int stream() const { return comm_stream; }
  /// Orders every later collective after the work queued on `s` at its
  /// issue (0: no ordering), as nccl_communicator::follow.
  void follow(int s) { follows_ = s; }
  int followed_stream() const { return follows_; }
  /// Collectives issued (all-reduce, reduce-scatter, all-gather).
  int issued() const { return issued_; }

  template <class T>
  sim_request iall_reduce(T* p, std::size_t n, comm::reduce_op op) {
    return issue(p, [p, n, op, N = size_] {
      if (op == comm::reduce_op::sum)
        for (std::size_t i = 0; i < n; ++i) p[i] = mirrored_sum(p[i], N);
    });
  }
  template <class T>
  sim_request ireduce_scatter(const T* send, T* recv, std::size_t chunk, comm::reduce_op op) {
    return issue(recv, [send, recv, chunk, op, N = size_, r = rank_] {
      std::vector<T> mine(send + static_cast<std::size_t>(r) * chunk,
                          send + static_cast<std::size_t>(r + 1) * chunk);
      for (std::size_t i = 0; i < chunk; ++i)
        recv[i] = op == comm::reduce_op::sum ? mirrored_sum(mine[i], N) : mine[i];
    });
  }
  template <class T>
  sim_request iall_gather(const T* send, T* recv, std::size_t chunk) {
    return issue(recv, [send, recv, chunk, N = size_] {
      const std::vector<T> mine(send, send + chunk);
      for (int q = 0; q < N; ++q)
        std::memcpy(recv + static_cast<std::size_t>(q) * chunk, mine.data(), chunk * sizeof(T));
    });
  }
  template <class T>
  sim_request ibroadcast(T* p, std::size_t, int) {
    return issue(p, [] {});
  }
  template <class T>
  sim_request isend(const T*, std::size_t, int, int) {
    FAIL("the data-parallel engine sends nothing point to point");
    return {};
  }
  template <class T>
  sim_request irecv(T*, std::size_t, int, int) {
    FAIL("the data-parallel engine receives nothing point to point");
    return {};
  }
  sim_request ibarrier() {
    return issue(nullptr, [] {});
  }
  template <class T>
  void all_reduce(T* p, std::size_t n, comm::reduce_op op) {
    iall_reduce(p, n, op).wait();
  }
  template <class T>
  void reduce_scatter(const T* s, T* r, std::size_t c, comm::reduce_op op) {
    ireduce_scatter(s, r, c, op).wait();
  }
  template <class T>
  void all_gather(const T* s, T* r, std::size_t c) {
    iall_gather(s, r, c).wait();
  }
  template <class T>
  void broadcast(T* p, std::size_t n, int root) {
    ibroadcast(p, n, root).wait();
  }
  template <class T>
  void send(const T* p, std::size_t n, int peer, int tag) {
    isend(p, n, peer, tag).wait();
  }
  template <class T>
  void recv(T* p, std::size_t n, int peer, int tag) {
    irecv(p, n, peer, tag).wait();
  }
  void barrier() { ibarrier().wait(); }
  sim_communicator split(int, int) { return *this; }

 private:
  template <class T>
  static T mirrored_sum(T x, int n) {
    T acc = x;
    for (int q = 1; q < n; ++q) acc = acc + x;
    return acc;
  }
  // Queues `collective`, which writes at `out`.
  sim_request issue(const void* out, std::function<void()> collective) {
    ++issued_;
    if (follows_ != 0 && follows_ != comm_stream && !f_->drop_follow) {
      const int e = dev_->create_event();
      dev_->record(follows_, e);
      dev_->wait(comm_stream, e);
    }
    const auto* o = static_cast<const std::byte*>(out);
    dev_->unwritten.insert(o);
    dev_->work(comm_stream, [d = dev_, o, c = std::move(collective)] {
      c();
      d->unwritten.erase(d->unwritten.find(o));
    });
    const int done = dev_->create_event();
    dev_->record(comm_stream, done);
    return {dev_, done, f_};
  }

  device* dev_;
  int rank_, size_;
  const faults* f_;
  int follows_ = 0;
  int issued_ = 0;
};
static_assert(comm::check_communicator<sim_communicator>());

}  // namespace simulated_streams
