// Tests include/tessera/comm/any_communicator.hpp: the shared multi-rank
// bodies (collective_suite.hpp) over an any_communicator holding a
// local_communicator (world sizes 1..4), which must give the held
// communicator's bits, byte counts and errors, and the split groups of a
// mesh with context parallelism held as any_communicator too. (The MPI
// suite runs it over mpi_communicator: tests/mpi/collectives.cpp.)
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include <tessera/comm/any_communicator.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/comm/self.hpp>
#include <tessera/kernels/context.hpp>

#include "collective_suite.hpp"

namespace test_comm_any_communicator {

using tessera::comm::local_communicator;
using tessera::comm::local_world;
using self = tessera::comm::self_communicator<tessera::kernels::host_context>;
using any = tessera::comm::any_communicator<local_communicator, self>;

static_assert(tessera::comm::communicator<any>);
static_assert(tessera::comm::host_communicator<any>);

static tessera::comm::comm_options test_options() {
  tessera::comm::comm_options o;
  o.timeout = std::chrono::seconds(20);
  return o;
}

// Runs body(any&) on each rank of worlds of 1..4 threads, over a copy of
// the world (its split with one color).
template <class Body>
static void for_world_sizes(Body body) {
  for (int N = 1; N <= 4; ++N) {
    INFO("world size " << N);
    REQUIRE_NOTHROW(local_world::run(
        N,
        [&](local_communicator& w) {
          any a(w.split(0, w.rank()));
          comm_suite::check(a.holds<local_communicator>() && a.size() == N && a.rank() == w.rank(),
                            "rank ", w.rank(), ": any_communicator does not hold its world");
          body(a);
        },
        test_options()));
  }
}

TEST_CASE("any_communicator: all_reduce matches the serial ring-order reference bit for bit",
          "[comm]") {
  for_world_sizes([](any& c) { comm_suite::all_reduce_matches_reference(c, true); });
}
TEST_CASE("any_communicator: reduce_scatter, all_gather, broadcast, send/recv", "[comm]") {
  for_world_sizes([](any& c) {
    comm_suite::reduce_scatter_matches_reference(c, true);
    comm_suite::all_gather_matches_reference(c);
    comm_suite::broadcast_matches_reference(c);
    comm_suite::send_recv_ring(c);
  });
}
TEST_CASE("any_communicator: asynchronous forms and the held communicator's errors", "[comm]") {
  for_world_sizes([](any& c) { comm_suite::async_forms(c, true); });
  for_world_sizes([](any& c) { comm_suite::debug_hash_names_divergence(c); });
}
TEST_CASE("any_communicator: byte counts are the held communicator's", "[comm]") {
  REQUIRE_NOTHROW(local_world::run(
      4,
      [](local_communicator& w) {
        any a(w.split(0, w.rank()));
        a.reset_stats();
        std::vector<double> v(10, 1.0);
        a.all_reduce(v.data(), v.size(), tessera::comm::reduce_op::sum);
        // ring all-reduce: 2n - chunk(r) - chunk(r+1) elements, chunks of 10
        // over 4 ranks 3 3 2 2 (communicator.hpp)
        const int r = a.rank();
        const std::size_t chunk[4] = {3, 3, 2, 2};
        const std::uint64_t want = (20 - chunk[r] - chunk[(r + 1) % 4]) * sizeof(double);
        comm_suite::check(a.bytes_sent() == want, "rank ", r, ": ", a.bytes_sent(), " bytes, want ",
                          want);
        comm_suite::check(v[0] == 4.0, "rank ", r, ": sum ", v[0]);
      },
      test_options()));
}
TEST_CASE("any_communicator: a one-rank alternative", "[comm]") {
  const tessera::kernels::host_context ctx;
  any a(self{ctx});
  CHECK(a.holds<self>());
  CHECK(a.size() == 1);
  double v = 2.5;
  a.all_reduce(&v, 1, tessera::comm::reduce_op::sum);
  CHECK(v == 2.5);
  any s = a.split(0, 0);
  CHECK(s.size() == 1);
}
TEST_CASE("any_communicator: the groups of a (dp, cp, tp, pp) mesh", "[comm]") {
  REQUIRE_NOTHROW(local_world::run(
      8,
      [](local_communicator& w) {
        any a(w.split(0, w.rank()));
        comm_suite::mesh_groups_reduce(a, 2, 2, 1, 2);
      },
      test_options()));
}

}  // namespace test_comm_any_communicator
