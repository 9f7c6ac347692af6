// Tests include/tessera/comm/local.hpp: the shared multi-rank bodies
// (collective_suite.hpp) on threads for world sizes 1..4, plus what only
// threads can show (a rank that dies, exact ring order, 8 ranks).
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include <tessera/comm/local.hpp>

#include "collective_suite.hpp"

namespace test_comm_local {

using tessera::comm::local_communicator;
using tessera::comm::local_world;
using tessera::comm::reduce_op;

// Every body runs with a 20 s timeout so a broken test fails instead of hanging.
static tessera::comm::comm_options test_options() {
  tessera::comm::comm_options o;
  o.timeout = std::chrono::seconds(20);
  return o;
}

template <class Body>
static void for_world_sizes(Body body) {
  for (int N = 1; N <= 4; ++N) {
    INFO("world size " << N);
    REQUIRE_NOTHROW(local_world::run(N, body, test_options()));
  }
}

static_assert(tessera::comm::communicator<local_communicator>);

TEST_CASE("local all_reduce matches the serial ring-order reference bit for bit", "[comm]") {
  for_world_sizes([](local_communicator& c) { comm_suite::all_reduce_matches_reference(c, true); });
}
TEST_CASE("local reduce_scatter matches the reference, in place too", "[comm]") {
  for_world_sizes(
      [](local_communicator& c) { comm_suite::reduce_scatter_matches_reference(c, true); });
}
TEST_CASE("local all_gather matches the reference, in place too", "[comm]") {
  for_world_sizes([](local_communicator& c) { comm_suite::all_gather_matches_reference(c); });
}
TEST_CASE("local broadcast from every root", "[comm]") {
  for_world_sizes([](local_communicator& c) { comm_suite::broadcast_matches_reference(c); });
}
TEST_CASE("local send/recv around the ring", "[comm]") {
  for_world_sizes([](local_communicator& c) { comm_suite::send_recv_ring(c); });
}
TEST_CASE("local asynchronous forms", "[comm]") {
  for_world_sizes([](local_communicator& c) { comm_suite::async_forms(c, true); });
}
TEST_CASE("local: a rank that skips a collective makes the others time out naming it", "[comm]") {
  for_world_sizes([](local_communicator& c) { comm_suite::skipped_collective_times_out(c, true); });
}
TEST_CASE("local debug hash names the first divergent collective", "[comm]") {
  for_world_sizes([](local_communicator& c) { comm_suite::debug_hash_names_divergence(c); });
}
TEST_CASE("local device_mesh groups as sub-communicators", "[comm]") {
  REQUIRE_NOTHROW(local_world::run(
      8, [](local_communicator& c) { comm_suite::mesh_groups_reduce(c, 2, 2, 2); },
      test_options()));
  REQUIRE_NOTHROW(local_world::run(
      4, [](local_communicator& c) { comm_suite::mesh_groups_reduce(c, 2, 2, 1); },
      test_options()));
  REQUIRE_NOTHROW(local_world::run(
      6, [](local_communicator& c) { comm_suite::mesh_groups_reduce(c, 1, 3, 2); },
      test_options()));
  // with context parallelism: (dp, cp, tp, pp) = (2, 2, 2, 1), (1, 2, 1, 2), (2, 3, 1, 1)
  REQUIRE_NOTHROW(local_world::run(
      8, [](local_communicator& c) { comm_suite::mesh_groups_reduce(c, 2, 2, 1, 2); },
      test_options()));
  REQUIRE_NOTHROW(local_world::run(
      4, [](local_communicator& c) { comm_suite::mesh_groups_reduce(c, 1, 1, 2, 2); },
      test_options()));
  REQUIRE_NOTHROW(local_world::run(
      6, [](local_communicator& c) { comm_suite::mesh_groups_reduce(c, 2, 1, 1, 3); },
      test_options()));
}

TEST_CASE("local: a rank that throws makes the others fail fast naming it", "[comm]") {
  using namespace std::chrono;
  const auto t0 = steady_clock::now();
  std::string msg;
  try {
    local_world::run(4, [](local_communicator& c) {
      float x = 1;
      c.all_reduce(&x, 1, reduce_op::sum);
      if (c.rank() == 2) throw std::runtime_error("rank 2 ran out of memory");
      c.all_reduce(&x, 1, reduce_op::sum);  // the others wait on rank 2
    });  // default timeout: 300 s, so only fail-fast can make this quick
  } catch (const std::exception& e) {
    msg = e.what();
  }
  CHECK(duration<double>(steady_clock::now() - t0).count() < 10.0);
  // run() rethrows the first exception: rank 2's own.
  CHECK(msg == "rank 2 ran out of memory");

  // What the others see: comm_error naming the dead rank and its error.
  std::string seen;
  std::mutex m;
  try {
    local_world::run(3, [&](local_communicator& c) {
      if (c.rank() == 0) return;  // exits without the collective
      float x = 1;
      try {
        c.all_reduce(&x, 1, reduce_op::sum);
      } catch (const tessera::comm_error& e) {
        std::lock_guard lk(m);
        if (c.rank() == 1) seen = e.what();
      }
    });
  } catch (...) {
  }
  CHECK(seen.find("rank 1 of 3: all_reduce #0") != std::string::npos);
  CHECK(seen.find("rank 0") != std::string::npos);
  CHECK(seen.find("exited") != std::string::npos);
}

TEST_CASE("local: mismatched collectives fail at once instead of mixing data", "[comm]") {
  std::string seen;
  std::mutex m;
  local_world::run(2, [&](local_communicator& c) {
    std::vector<float> x(10, 1.0f);
    try {
      if (c.rank() == 0)
        c.all_reduce(x.data(), x.size(), reduce_op::sum);
      else
        c.all_reduce(x.data(), 9, reduce_op::sum);
    } catch (const tessera::comm_error& e) {
      std::lock_guard lk(m);
      if (c.rank() == 0) seen = e.what();
    }
  });
  CHECK(seen.find("received from rank 1 a message of all_reduce #0 (n=9") != std::string::npos);
}

TEST_CASE("local: p2p messages with different tags do not mix; recv times out", "[comm]") {
  local_world::run(2, [](local_communicator& c) {
    if (c.rank() == 0) {
      const std::int64_t a = 1, b = 2;
      c.send(&a, 1, 1, 7);
      c.send(&b, 1, 1, 8);
    } else {
      std::int64_t a = 0, b = 0;
      c.recv(&b, 1, 0, 8);
      c.recv(&a, 1, 0, 7);
      comm_suite::check(a == 1 && b == 2, "tags mixed: a=", a, " b=", b);
      c.set_timeout(std::chrono::milliseconds(50));
      try {
        c.recv(&a, 1, 0, 9);
        comm_suite::check(false, "recv without a sender did not throw");
      } catch (const tessera::comm_error& e) {
        const std::string w = e.what();
        comm_suite::check(
            w.find("recv #2") != std::string::npos && w.find("tag 9") != std::string::npos,
            "recv timeout message: ", w);
      }
    }
  });
}

TEST_CASE("local: messages of one tag arrive in order while receives are posted", "[comm]") {
  // A send racing a receive being posted must neither be lost (the receive
  // waiting forever) nor overtaken by the next message: a pipeline's
  // activations of micro-batches m and m + 1 share a tag. (The send used to
  // look for a posted receive and queue the message under two separate
  // locks; a receive posted in between missed it.)
  local_world::run(2, [](local_communicator& c) {
    c.set_timeout(std::chrono::seconds(20));
    constexpr std::int64_t n = 20000;
    if (c.rank() == 0) {
      for (std::int64_t i = 0; i < n; ++i) c.send(&i, 1, 1, 3);
    } else {
      for (std::int64_t i = 0; i < n; ++i) {
        std::int64_t got = -1;
        c.recv(&got, 1, 0, 3);
        comm_suite::check(got == i, "message ", i, " arrived as ", got);
      }
    }
  });
}

TEST_CASE("local: a timeout names the rank, the operation, its sequence number and bytes",
          "[comm]") {
  std::string seen;
  local_world w(2);
  auto c0 = w.communicator(0);
  auto c1 = w.communicator(1);  // never joins: its thread is still "alive"
  c0.set_timeout(std::chrono::milliseconds(100));
  std::vector<double> x(1001);
  try {
    c0.all_reduce(x.data(), x.size(), reduce_op::max);
  } catch (const tessera::comm_error& e) {
    seen = e.what();
  }
  CHECK(seen.find("rank 0 of 2: all_reduce #0 (n=1001 double, 8008 bytes, max) timed out after "
                  "100 ms waiting for rank 1; ranks missing from it: rank 1 (entered no "
                  "collective yet)") != std::string::npos);
  INFO(seen);
  // The communicator is broken afterwards: later operations throw at once.
  CHECK_THROWS_AS(c0.barrier(), tessera::comm_error);
}

}  // namespace test_comm_local
