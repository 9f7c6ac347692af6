// Tests include/tessera/comm/nccl.hpp on GPUs, under mpirun (one process
// per GPU; tests/cuda/nccl_main.cpp skips with exit 77 where the node has
// fewer GPUs than ranks). Run by ctest as
//   mpirun -np {1,2,4,8} test_cuda_nccl --order rand --rng-seed 20261129
//
// 1. The shared multi-rank bodies (tests/comm/collective_suite.hpp, the ones
//    local and mpi run) on `staged_nccl`, a test adapter that models the
//    host `communicator` by copying each host buffer to a fresh device
//    buffer on the communicator's stream, running the nccl_communicator
//    operation on it, and copying the results back in wait(). Results,
//    byte counts, sequence numbers in error messages and the debug hash are
//    nccl_communicator's own.
// 2. NCCL-specific bodies on device buffers: bf16 and int32, sendrecv ring
//    shifts (the shared send_recv_ring posts every receive before any send,
//    which deadlocks NCCL on one stream: nccl.hpp's file comment), ordered
//    send/recv pairs, user streams and request events, argument errors.
//
// Every communicator gets a 20 s timeout, so a failing rank makes the
// others fail instead of hanging.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include <tessera/comm/nccl.hpp>

#include "../comm/collective_suite.hpp"

int tessera_nccl_test_device();

namespace {

using namespace tessera::comm;
using comm_suite::check;
using comm_suite::input;
using tessera::bf16;

void cu(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw comm_suite::suite_failure(std::string(what) + ": " + cudaGetErrorString(e));
}

/// Owning device buffer of `bytes` (cudaMalloc / cudaFree).
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t bytes) {
    if (bytes) cu(cudaMalloc(&p_, bytes), "cudaMalloc");
  }
  device_buffer(device_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~device_buffer() {
    if (p_) (void)cudaFree(p_);
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

/// Host vector -> new device buffer, and back.
template <class T>
device_buffer to_device(const std::vector<T>& h) {
  device_buffer d(h.size() * sizeof(T));
  if (!h.empty())
    cu(cudaMemcpy(d.as<T>(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "H2D");
  return d;
}
template <class T>
std::vector<T> to_host(const device_buffer& d, std::size_t n) {
  std::vector<T> h(n);
  if (n) cu(cudaMemcpy(h.data(), d.as<T>(), n * sizeof(T), cudaMemcpyDeviceToHost), "D2H");
  return h;
}

/// A pending staged operation: the NCCL request, the device buffer it uses,
/// and the copies back to host memory that wait() makes once it completed.
class staged_request {
 public:
  struct copy_back {
    void* h_dst;
    const void* d_src;
    std::size_t bytes;
  };
  staged_request(device_buffer buf, nccl_request r, std::vector<copy_back> copies, cudaStream_t s)
      : buf_(std::move(buf)), r_(std::move(r)), copies_(std::move(copies)), s_(s) {}
  staged_request(staged_request&&) noexcept = default;
  staged_request& operator=(staged_request&&) noexcept = default;

  void wait() {
    r_.wait();
    for (const auto& c : copies_)
      if (c.bytes)
        cu(cudaMemcpyAsync(c.h_dst, c.d_src, c.bytes, cudaMemcpyDeviceToHost, s_), "D2H");
    if (!copies_.empty()) cu(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
    copies_.clear();
  }
  bool test() { return r_.test(); }

 private:
  device_buffer buf_;  // declared first: freed after r_ has drained
  nccl_request r_;
  std::vector<copy_back> copies_;
  cudaStream_t s_ = nullptr;
};

/// Models the host `communicator` over an nccl_communicator by staging
/// every buffer through device memory (test adapter, not a library type).
class staged_nccl {
 public:
  explicit staged_nccl(nccl_communicator c) : c_(std::move(c)) {}

  int rank() const { return c_.rank(); }
  int size() const { return c_.size(); }
  comm_stats stats() const { return c_.stats(); }
  std::uint64_t bytes_sent() const { return c_.bytes_sent(); }
  void reset_stats() { c_.reset_stats(); }
  void set_timeout(std::chrono::milliseconds t) { c_.set_timeout(t); }
  std::chrono::milliseconds timeout() const { return c_.timeout(); }
  void set_debug(bool on) { c_.set_debug(on); }
  void verify_collective_hash() { c_.verify_collective_hash(); }
  nccl_communicator& device_comm() { return c_; }

  template <class T>
  void all_reduce(T* h, std::size_t n, reduce_op op) {
    iall_reduce(h, n, op).wait();
  }
  template <class T>
  staged_request iall_reduce(T* h, std::size_t n, reduce_op op) {
    auto d = stage(h, n, n);
    T* p = d.template as<T>();
    auto r = c_.iall_reduce(p, n, op);
    return {std::move(d), std::move(r), {{h, p, n * sizeof(T)}}, c_.stream()};
  }
  template <class T>
  void reduce_scatter(const T* h_send, T* h_recv, std::size_t chunk, reduce_op op) {
    ireduce_scatter(h_send, h_recv, chunk, op).wait();
  }
  template <class T>
  staged_request ireduce_scatter(const T* h_send, T* h_recv, std::size_t chunk, reduce_op op) {
    const std::size_t n = chunk * static_cast<std::size_t>(size()),
                      own = chunk * static_cast<std::size_t>(rank());
    const bool in_place = h_recv == h_send + own;
    auto d = stage(h_send, n, in_place ? n : n + chunk);
    T* d_send = d.template as<T>();
    T* d_recv = in_place ? d_send + own : d_send + n;
    auto r = c_.ireduce_scatter(d_send, d_recv, chunk, op);
    return {std::move(d), std::move(r), {{h_recv, d_recv, chunk * sizeof(T)}}, c_.stream()};
  }
  template <class T>
  void all_gather(const T* h_send, T* h_recv, std::size_t chunk) {
    iall_gather(h_send, h_recv, chunk).wait();
  }
  template <class T>
  staged_request iall_gather(const T* h_send, T* h_recv, std::size_t chunk) {
    const std::size_t n = chunk * static_cast<std::size_t>(size()),
                      own = chunk * static_cast<std::size_t>(rank());
    const bool in_place = h_send == h_recv + own;
    // Layout: [recv (n) | send (chunk)]; in place, send is recv + own.
    auto d = stage(h_recv, n, n + chunk);
    T* d_recv = d.template as<T>();
    T* d_send = in_place ? d_recv + own : d_recv + n;
    if (!in_place) copy_in(d_send, h_send, chunk);
    auto r = c_.iall_gather(static_cast<const T*>(d_send), d_recv, chunk);
    return {std::move(d), std::move(r), {{h_recv, d_recv, n * sizeof(T)}}, c_.stream()};
  }
  template <class T>
  void broadcast(T* h, std::size_t n, int root) {
    ibroadcast(h, n, root).wait();
  }
  template <class T>
  staged_request ibroadcast(T* h, std::size_t n, int root) {
    auto d = stage(h, n, n);
    T* p = d.template as<T>();
    auto r = c_.ibroadcast(p, n, root);
    return {std::move(d), std::move(r), {{h, p, n * sizeof(T)}}, c_.stream()};
  }
  template <class T>
  void send(const T* h, std::size_t n, int peer, int tag) {
    isend(h, n, peer, tag).wait();
  }
  template <class T>
  staged_request isend(const T* h, std::size_t n, int peer, int tag) {
    auto d = stage(h, n, n);
    auto r = c_.isend(static_cast<const T*>(d.template as<T>()), n, peer, tag);
    return {std::move(d), std::move(r), {}, c_.stream()};
  }
  template <class T>
  void recv(T* h, std::size_t n, int peer, int tag) {
    irecv(h, n, peer, tag).wait();
  }
  template <class T>
  staged_request irecv(T* h, std::size_t n, int peer, int tag) {
    device_buffer d(n * sizeof(T));
    T* p = d.template as<T>();
    auto r = c_.irecv(p, n, peer, tag);
    return {std::move(d), std::move(r), {{h, p, n * sizeof(T)}}, c_.stream()};
  }
  void barrier() { c_.barrier(); }
  staged_request ibarrier() { return {device_buffer{}, c_.ibarrier(), {}, c_.stream()}; }
  staged_nccl split(int color, int key) { return staged_nccl(c_.split(color, key)); }

 private:
  /// A device buffer of `cap` elements whose first n hold h[0, n), copied on
  /// the communicator's stream (ordered before the operation).
  template <class T>
  device_buffer stage(const T* h, std::size_t n, std::size_t cap) {
    device_buffer d(cap * sizeof(T));
    copy_in(d.template as<T>(), h, n);
    return d;
  }
  template <class T>
  void copy_in(T* d, const T* h, std::size_t n) {
    if (n) cu(cudaMemcpyAsync(d, h, n * sizeof(T), cudaMemcpyHostToDevice, c_.stream()), "H2D");
  }
  nccl_communicator c_;
};

static_assert(host_communicator<staged_nccl>);
static_assert(device_communicator<nccl_communicator>);

comm_options test_options() {
  comm_options o;
  o.timeout = std::chrono::seconds(20);
  return o;
}
nccl_communicator device_world(cudaStream_t stream = nullptr) {
  mpi_communicator boot(MPI_COMM_WORLD);
  return nccl_communicator(boot, tessera_nccl_test_device(), stream, test_options());
}
staged_nccl staged_world() {
  return staged_nccl(device_world());
}

// bf16 values that are small integers: every partial sum of N <= 8 of them
// is exactly representable (|sum| <= 64 < 256), so sum and max are exact
// whatever order and rounding NCCL uses.
bf16 small_bf16(std::uint64_t seed, int r, std::size_t i) {
  return bf16(static_cast<float>(input<std::int64_t>(seed, r, i) % 9));
}

}  // namespace

TEST_CASE("nccl all_reduce matches the serial reference", "[cuda][nccl]") {
  auto c = staged_world();
  REQUIRE_NOTHROW(comm_suite::all_reduce_matches_reference(c, false));
}
TEST_CASE("nccl reduce_scatter matches the reference, in place too", "[cuda][nccl]") {
  auto c = staged_world();
  REQUIRE_NOTHROW(comm_suite::reduce_scatter_matches_reference(c, false));
}
TEST_CASE("nccl all_gather matches the reference, in place too", "[cuda][nccl]") {
  auto c = staged_world();
  REQUIRE_NOTHROW(comm_suite::all_gather_matches_reference(c));
}
TEST_CASE("nccl broadcast from every root", "[cuda][nccl]") {
  auto c = staged_world();
  REQUIRE_NOTHROW(comm_suite::broadcast_matches_reference(c));
}
TEST_CASE("nccl asynchronous forms", "[cuda][nccl]") {
  auto c = staged_world();
  REQUIRE_NOTHROW(comm_suite::async_forms(c, false));
}
TEST_CASE("nccl: a rank that skips a collective makes the others time out", "[cuda][nccl]") {
  auto c = staged_world();
  REQUIRE_NOTHROW(comm_suite::skipped_collective_times_out(c, false));
}
TEST_CASE("nccl debug hash names the first divergent collective", "[cuda][nccl]") {
  auto c = staged_world();
  REQUIRE_NOTHROW(comm_suite::debug_hash_names_divergence(c));
}
TEST_CASE("nccl device_mesh groups as sub-communicators", "[cuda][nccl]") {
  auto c = staged_world();
  if (c.size() == 4) {
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, 2, 2, 1));
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, 1, 2, 2));
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, 2, 1, 1, 2));  // (dp, cp) = (2, 2)
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, 1, 2, 1, 2));  // (cp, tp) = (2, 2)
  } else {
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, c.size(), 1, 1));
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, 1, 1, c.size()));
    REQUIRE_NOTHROW(comm_suite::mesh_groups_reduce(c, 1, 1, 1, c.size()));
  }
}

TEST_CASE("nccl bf16 and int32 on device buffers", "[cuda][nccl]") {
  auto c = device_world();
  const int N = c.size(), r = c.rank();
  REQUIRE_NOTHROW([&] {
    for (std::size_t n : {1, 7, 1001}) {
      for (auto op : {reduce_op::sum, reduce_op::max}) {
        std::vector<bf16> h(n);
        for (std::size_t i = 0; i < n; ++i) h[i] = small_bf16(n, r, i);
        auto d = to_device(h);
        const auto before = c.stats().all_reduce.bytes;
        c.all_reduce(d.as<bf16>(), n, op);
        const auto got = to_host<bf16>(d, n);
        for (std::size_t i = 0; i < n; ++i) {
          float want = static_cast<float>(small_bf16(n, 0, i));
          for (int q = 1; q < N; ++q) {
            const float x = static_cast<float>(small_bf16(n, q, i));
            want = op == reduce_op::sum ? want + x : std::max(want, x);
          }
          check(static_cast<float>(got[i]) == want, "rank ", r, ": bf16 all_reduce(n=", n, ", ",
                to_string(op), ")[", i, "] = ", static_cast<float>(got[i]), ", want ", want);
        }
        check(c.stats().all_reduce.bytes - before == ring_all_reduce_bytes(n, 2, N, r), "rank ", r,
              ": bf16 all_reduce bytes not counted at 2 per element");
      }
    }
    // bf16 all_gather and broadcast are copies: bit for bit.
    const std::size_t chunk = 33;
    std::vector<bf16> mine(chunk);
    for (std::size_t j = 0; j < chunk; ++j)
      mine[j] = bf16::from_bits(static_cast<std::uint16_t>(input<std::int64_t>(7, r, j) & 0x7f7f));
    auto d_send = to_device(mine);
    device_buffer d_all(chunk * static_cast<std::size_t>(N) * sizeof(bf16));
    c.all_gather(static_cast<const bf16*>(d_send.as<bf16>()), d_all.as<bf16>(), chunk);
    const auto all = to_host<bf16>(d_all, chunk * static_cast<std::size_t>(N));
    for (int q = 0; q < N; ++q)
      for (std::size_t j = 0; j < chunk; ++j)
        check(all[static_cast<std::size_t>(q) * chunk + j].bits ==
                  static_cast<std::uint16_t>(input<std::int64_t>(7, q, j) & 0x7f7f),
              "rank ", r, ": bf16 all_gather block ", q, "[", j, "] wrong");
    c.broadcast(d_send.as<bf16>(), chunk, N - 1);
    const auto bc = to_host<bf16>(d_send, chunk);
    for (std::size_t j = 0; j < chunk; ++j)
      check(bc[j].bits == static_cast<std::uint16_t>(input<std::int64_t>(7, N - 1, j) & 0x7f7f),
            "rank ", r, ": bf16 broadcast [", j, "] wrong");
    // int32 reduce_scatter, exact.
    std::vector<std::int32_t> rs(chunk * static_cast<std::size_t>(N));
    for (std::size_t i = 0; i < rs.size(); ++i)
      rs[i] = static_cast<std::int32_t>(input<std::int64_t>(9, r, i));
    auto d_rs = to_device(rs);
    device_buffer d_out(chunk * sizeof(std::int32_t));
    c.reduce_scatter(static_cast<const std::int32_t*>(d_rs.as<std::int32_t>()),
                     d_out.as<std::int32_t>(), chunk, reduce_op::sum);
    const auto out = to_host<std::int32_t>(d_out, chunk);
    for (std::size_t j = 0; j < chunk; ++j) {
      std::int64_t want = 0;
      for (int q = 0; q < N; ++q)
        want += input<std::int64_t>(9, q, static_cast<std::size_t>(r) * chunk + j);
      check(out[j] == want, "rank ", r, ": int32 reduce_scatter [", j, "] = ", out[j], ", want ",
            want);
    }
  }());
}

TEST_CASE("nccl sendrecv ring shifts and ordered send/recv pairs", "[cuda][nccl]") {
  auto c = device_world();
  const int N = c.size(), r = c.rank();
  REQUIRE_NOTHROW([&] {
    const std::size_t n = 13;
    const int right = (r + 1) % N, left = (r + N - 1) % N;
    std::vector<double> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = input<double>(3, r, i);
    auto d_out = to_device(h);
    device_buffer d_in(n * sizeof(double));
    const auto before = c.stats();
    c.sendrecv(static_cast<const double*>(d_out.as<double>()), right, d_in.as<double>(), left, n,
               42);
    const auto in = to_host<double>(d_in, n);
    for (std::size_t i = 0; i < n; ++i)
      check(in[i] == input<double>(3, left, i), "rank ", r, ": sendrecv from ", left, " [", i,
            "] wrong");
    const auto s = c.stats();
    check(s.send.bytes - before.send.bytes == n * sizeof(double), "rank ", r, ": sendrecv counted ",
          s.send.bytes - before.send.bytes, " bytes");
    check(s.recv.calls == before.recv.calls + 1 && s.recv.bytes == before.recv.bytes, "rank ", r,
          ": sendrecv recv counters wrong");
    // Ordered pairs: even ranks send to the next rank, which receives.
    if (N >= 2 && r < N - N % 2) {
      if (r % 2 == 0) {
        c.send(static_cast<const double*>(d_out.as<double>()), n, r + 1, 7);
      } else {
        auto req = c.irecv(d_in.as<double>(), n, r - 1, 7);
        req.wait();
        check(req.test(), "rank ", r, ": irecv not complete after wait()");
        const auto got = to_host<double>(d_in, n);
        for (std::size_t i = 0; i < n; ++i)
          check(got[i] == input<double>(3, r - 1, i), "rank ", r, ": recv [", i, "] wrong");
      }
    }
    c.barrier();
  }());
}

TEST_CASE("nccl runs on the caller's stream; request events order other streams", "[cuda][nccl]") {
  cudaStream_t s = nullptr, other = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
  {
    auto c = device_world(s);
    REQUIRE(c.stream() == s);
    const int N = c.size();
    const std::size_t n = 1 << 20;
    std::vector<float> ones(n, 1.0f);
    auto d = to_device(ones);
    std::vector<float> back(n, -1.0f);
    auto req = c.iall_reduce(d.as<float>(), n, reduce_op::sum);
    REQUIRE(req.event() != nullptr);
    // The copy on `other` waits for the all-reduce without the host.
    REQUIRE(cudaStreamWaitEvent(other, req.event(), 0) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(back.data(), d.as<float>(), n * sizeof(float), cudaMemcpyDeviceToHost,
                            other) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(other) == cudaSuccess);
    CHECK(req.test());
    REQUIRE_NOTHROW(req.wait());
    CHECK(back.front() == static_cast<float>(N));
    CHECK(back.back() == static_cast<float>(N));
    // Another stream for later operations.
    c.set_stream(other);
    CHECK(c.stream() == other);
    REQUIRE_NOTHROW(c.barrier());
  }
  cudaStreamDestroy(other);
  cudaStreamDestroy(s);
}

TEST_CASE(
    "nccl follow() orders a collective after the followed stream; order_before() orders "
    "the stream after it",
    "[cuda][nccl]") {
  // The followed stream ("compute") is held for 200 ms behind a host
  // function on a third stream, then writes the input: an all-reduce that
  // did not wait for it would reduce the zeros before.
  cudaStream_t compute = nullptr, gate = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&gate, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t opened = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&opened, cudaEventDisableTiming) == cudaSuccess);
  {
    auto c = device_world();  // on a stream of its own
    REQUIRE(c.stream() != compute);
    c.follow(compute);
    CHECK(c.followed_stream() == compute);
    const int N = c.size();
    const std::size_t n = 1 << 20;
    std::vector<float> zeros(n, 0.0f);
    auto d = to_device(zeros);
    // Pinned host buffers: a copy from pageable memory may block the host
    // until the stream reaches it, and the collective would then be issued
    // after its input is written whatever follow() does.
    float *ones = nullptr, *back = nullptr;
    REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&ones), n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&back), n * sizeof(float)) == cudaSuccess);
    std::fill(ones, ones + n, 1.0f);
    std::fill(back, back + n, -1.0f);
    REQUIRE(cudaLaunchHostFunc(
                gate, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); },
                nullptr) == cudaSuccess);
    REQUIRE(cudaEventRecord(opened, gate) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(compute, opened, 0) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(d.as<float>(), ones, n * sizeof(float), cudaMemcpyHostToDevice,
                            compute) == cudaSuccess);
    auto req = c.iall_reduce(d.as<float>(), n, reduce_op::sum);
    // Issued while the gate is still closed: the ordering is the GPU's.
    CHECK(cudaEventQuery(opened) == cudaErrorNotReady);
    // The copy back on `compute` waits for the all-reduce, the host does not.
    req.order_before(compute);
    REQUIRE(cudaMemcpyAsync(back, d.as<float>(), n * sizeof(float), cudaMemcpyDeviceToHost,
                            compute) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
    CHECK(req.test());
    REQUIRE_NOTHROW(req.wait());
    CHECK(back[0] == static_cast<float>(N));
    CHECK(back[n - 1] == static_cast<float>(N));
    c.follow(nullptr);
    CHECK(c.followed_stream() == nullptr);
    cudaFreeHost(back);
    cudaFreeHost(ones);
  }
  cudaEventDestroy(opened);
  cudaStreamDestroy(gate);
  cudaStreamDestroy(compute);
}

TEST_CASE("nccl argument errors name the value and the limit", "[cuda][nccl]") {
  auto c = device_world();
  float* null = nullptr;
  CHECK_THROWS_AS(c.broadcast(null, 1, c.size()), tessera::config_error);
  CHECK_THROWS_AS(c.send(static_cast<const float*>(null), 1, -1, 0), tessera::config_error);
  CHECK_THROWS_AS(c.split(-1, 0), tessera::config_error);
  CHECK_THROWS_WITH(c.verify_collective_hash(), Catch::Contains("needs debug mode"));
  mpi_communicator boot(MPI_COMM_WORLD);
  CHECK_THROWS_WITH(nccl_communicator(boot, 1 << 20), Catch::Contains("is not in [0, "));
  // The communicator still works (argument errors do not break it).
  REQUIRE_NOTHROW(c.barrier());
}
