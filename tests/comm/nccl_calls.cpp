// Tests include/tessera/comm/nccl_calls.hpp, the translation of each
// communicator operation into the NCCL calls nccl_communicator issues, on
// the host: every operation's calls against the table written out by hand
// (function, NCCL's count convention, datatype, reduction, peer or root,
// buffers, groups), and the recording communicator of
// tests/comm/nccl_recording.hpp over thread ranks: a run of every
// operation is the host's sequence and replays on NCCL's rules, and each
// fault the checker exists for (a cross-group cycle one stream would
// deadlock on, messages NCCL would pair otherwise than the host's tags, a
// ring of lone sends, ranks that reduce with different operators, an
// operation issued around the recorder) is reported, naming it.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tessera/comm/local.hpp>
#include <tessera/comm/nccl_calls.hpp>

#include "nccl_replay.hpp"

namespace test_comm_nccl_calls {

using namespace tessera::comm;
using nccl_recording::check;
using nccl_recording::rank_log;
using rec = nccl_recording::recording<local_communicator>;

namespace {

bool same(const nccl_call& a, const nccl_call& b) {
  return a.fn == b.fn && a.count == b.count && a.dt == b.dt && a.op == b.op && a.peer == b.peer &&
         a.sendbuff == b.sendbuff && a.recvbuff == b.recvbuff;
}

comm_options opts() {
  comm_options o;
  o.timeout = std::chrono::seconds(20);
  return o;
}

// Runs body(world recorder, its log) on n thread ranks and checks the logs.
template <class Body>
nccl_recording::report run_recorded(int n, Body&& body,
                                    std::vector<std::shared_ptr<rank_log>>* keep = nullptr) {
  std::vector<std::shared_ptr<rank_log>> logs;
  for (int r = 0; r < n; ++r) logs.push_back(std::make_shared<rank_log>());
  local_world::run(
      n,
      [&](local_communicator& c) {
        const int r = c.rank();
        rank_log& log = *logs[static_cast<std::size_t>(r)];
        rec w(std::move(c), logs[static_cast<std::size_t>(r)]);
        log.start();
        body(w);
        log.stop();
      },
      opts());
  if (keep) *keep = logs;
  return check(logs);
}

bool mentions(const nccl_recording::report& rep, const std::string& needle) {
  for (const auto& p : rep.problems)
    if (p.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("nccl_translate: each operation's calls, in NCCL's counts", "[comm][nccl]") {
  float a[8] = {}, b[8] = {};
  // Collectives: one call each, in place where NCCL's call is.
  auto ar = nccl_translate::all_reduce(a, 8, dtype::f32, reduce_op::max);
  REQUIRE(ar.size() == 1);
  CHECK(same(ar[0], {nccl_fn::all_reduce, 8, dtype::f32, reduce_op::max, -1, a, a}));
  // ReduceScatter's count is the chunk each rank receives (recvcount).
  auto rs = nccl_translate::reduce_scatter(a, b, 2, dtype::f64, reduce_op::sum);
  REQUIRE(rs.size() == 1);
  CHECK(same(rs[0], {nccl_fn::reduce_scatter, 2, dtype::f64, reduce_op::sum, -1, a, b}));
  // AllGather's count is the chunk each rank sends (sendcount).
  auto ag = nccl_translate::all_gather(a, b, 3, dtype::i64);
  REQUIRE(ag.size() == 1);
  CHECK(same(ag[0], {nccl_fn::all_gather, 3, dtype::i64, reduce_op::sum, -1, a, b}));
  auto bc = nccl_translate::broadcast(b, 5, dtype::bf16, 2);
  REQUIRE(bc.size() == 1);
  CHECK(same(bc[0], {nccl_fn::broadcast, 5, dtype::bf16, reduce_op::sum, 2, b, b}));
  auto s = nccl_translate::send(a, 4, dtype::i32, 3);
  auto r = nccl_translate::recv(b, 4, dtype::i32, 1);
  REQUIRE((s.size() == 1 && r.size() == 1));
  CHECK(same(s[0], {nccl_fn::send, 4, dtype::i32, reduce_op::sum, 3, a, nullptr}));
  CHECK(same(r[0], {nccl_fn::recv, 4, dtype::i32, reduce_op::sum, 1, nullptr, b}));
  // barrier: one int32 summed on the word.
  std::int32_t word = 0;
  auto br = nccl_translate::barrier(&word);
  REQUIRE(br.size() == 1);
  CHECK(same(br[0], {nccl_fn::all_reduce, 1, dtype::i32, reduce_op::sum, -1, &word, &word}));
  // sendrecv: one group, send first.
  auto sr = nccl_translate::sendrecv(a, 1, b, 3, 6, dtype::u64);
  REQUIRE(sr.size() == 4);
  CHECK(sr[0].fn == nccl_fn::group_start);
  CHECK(same(sr[1], {nccl_fn::send, 6, dtype::u64, reduce_op::sum, 1, a, nullptr}));
  CHECK(same(sr[2], {nccl_fn::recv, 6, dtype::u64, reduce_op::sum, 3, nullptr, b}));
  CHECK(sr[3].fn == nccl_fn::group_end);
  CHECK(calls_name(sr) == "ncclGroupEnd (group of 1 ncclSend, 1 ncclRecv)");
  CHECK(calls_name(rs) == "ncclReduceScatter");
  // group_p2p: the operations in their order, between one start and end.
  const std::vector<p2p_op> ops = {p2p_op::recv(b, 2, dtype::f64, 0, 7),
                                   p2p_op::send(a, 3, dtype::f32, 2, 8),
                                   p2p_op::recv(b + 2, 0, dtype::f32, 2, 9)};
  auto g = nccl_translate::group_p2p(ops);
  REQUIRE(g.size() == 5);
  CHECK(g[0].fn == nccl_fn::group_start);
  CHECK(same(g[1], {nccl_fn::recv, 2, dtype::f64, reduce_op::sum, 0, nullptr, b}));
  CHECK(same(g[2], {nccl_fn::send, 3, dtype::f32, reduce_op::sum, 2, a, nullptr}));
  CHECK(same(g[3], {nccl_fn::recv, 0, dtype::f32, reduce_op::sum, 2, nullptr, b + 2}));
  CHECK(g[4].fn == nccl_fn::group_end);
  // Nothing moves: no call at all, on every rank alike.
  CHECK(nccl_translate::all_reduce(a, 0, dtype::f32, reduce_op::sum).empty());
  CHECK(nccl_translate::reduce_scatter(a, b, 0, dtype::f32, reduce_op::sum).empty());
  CHECK(nccl_translate::all_gather(a, b, 0, dtype::f32).empty());
  CHECK(nccl_translate::broadcast(a, 0, dtype::f32, 0).empty());
  CHECK(nccl_translate::send(a, 0, dtype::f32, 0).empty());
  CHECK(nccl_translate::recv(a, 0, dtype::f32, 0).empty());
  CHECK(nccl_translate::sendrecv(a, 0, b, 0, 0, dtype::f32).empty());
  CHECK(nccl_translate::group_p2p({}).empty());
  const std::vector<p2p_op> empty_msgs = {p2p_op::send(a, 0, dtype::f32, 1, 0),
                                          p2p_op::recv(b, 0, dtype::f32, 1, 0)};
  CHECK(nccl_translate::group_p2p(empty_msgs).empty());
  // Only sends and receives group.
  const std::vector<p2p_op> bad = {{op_kind::all_reduce, a, 1, dtype::f32, 0, 0}};
  CHECK_THROWS_WITH(nccl_translate::group_p2p(bad),
                    Catch::Contains("takes send and recv operations, not all_reduce"));
  CHECK(describe(rs[0]) == "ncclReduceScatter(recvcount=2, ncclFloat64, ncclSum)");
  CHECK(describe(ag[0]) == "ncclAllGather(sendcount=3, ncclInt64)");
  CHECK(describe(bc[0]) == "ncclBroadcast(count=5, ncclBfloat16, root=2)");
}

TEST_CASE("nccl recording: every operation on thread ranks is the host's sequence",
          "[comm][nccl]") {
  // 4 ranks: the world, then two groups of two (split); every operation
  // kind, blocking and asynchronous, a ring exchange as one group_p2p.
  std::vector<std::shared_ptr<rank_log>> logs;
  const auto rep = run_recorded(
      4,
      [](rec& w) {
        const int r = w.rank(), N = w.size();
        std::vector<double> x(10, r + 1.0);
        w.all_reduce(x.data(), x.size(), reduce_op::sum);
        w.iall_reduce(x.data(), 3, reduce_op::max).wait();
        std::vector<float> send(4 * 3, float(r)), chunk(3);
        w.reduce_scatter(send.data(), chunk.data(), 3, reduce_op::sum);
        w.ireduce_scatter(send.data(), chunk.data(), 3, reduce_op::max).wait();
        std::vector<std::int64_t> all(4 * 2), mine(2, r);
        w.all_gather(mine.data(), all.data(), 2);
        w.iall_gather(mine.data(), all.data(), 2).wait();
        w.broadcast(x.data(), 7, 2);
        w.ibroadcast(x.data(), 0, 1).wait();  // no element: no NCCL call
        w.barrier();
        w.ibarrier().wait();
        // a ring shift as one group, and a pair exchange one at a time
        std::vector<double> out(5, r), in(5);
        const p2p_op ring[] = {p2p_op::send(out.data(), 5, dtype::f64, (r + 1) % N, 11),
                               p2p_op::recv(in.data(), 5, dtype::f64, (r + N - 1) % N, 11)};
        w.group_p2p(ring);
        if (r % 2 == 0) {
          w.isend(out.data(), 5, r + 1, 3).wait();
          w.recv(in.data(), 4, r + 1, 4);
        } else {
          w.recv(in.data(), 5, r - 1, 3);
          w.send(out.data(), 4, r - 1, 4);
        }
        // sub-groups: {0,1} and {2,3}
        rec half = w.split(r / 2, r % 2);
        half.all_reduce(x.data(), 6, reduce_op::sum);
        std::vector<float> pair(2 * 3);
        half.all_gather(chunk.data(), pair.data(), 3);
        w.all_reduce(x.data(), 1, reduce_op::sum);
      },
      &logs);
  for (const auto& p : rep.problems) FAIL_CHECK(p);
  CHECK(rep.problems.empty());
  // 17 operations per rank: 15 on the world (the split one of them), 2 on the half.
  CHECK(rep.launches == 4 * 17);
  const std::uint64_t world = rep.group_of({0, 1, 2, 3});
  const std::uint64_t low = rep.group_of({0, 1}), high = rep.group_of({2, 3});
  REQUIRE(world != 0);
  REQUIRE(low != 0);
  REQUIRE(high != 0);
  CHECK(low != high);
  // Rank 1's calls on the world, written out.
  const std::vector<nccl_call> want = {
      {nccl_fn::all_reduce, 10, dtype::f64, reduce_op::sum},
      {nccl_fn::all_reduce, 3, dtype::f64, reduce_op::max},
      {nccl_fn::reduce_scatter, 3, dtype::f32, reduce_op::sum},
      {nccl_fn::reduce_scatter, 3, dtype::f32, reduce_op::max},
      {nccl_fn::all_gather, 2, dtype::i64},
      {nccl_fn::all_gather, 2, dtype::i64},
      {nccl_fn::broadcast, 7, dtype::f64, reduce_op::sum, 2},
      {nccl_fn::all_reduce, 1, dtype::i32, reduce_op::sum},  // barrier
      {nccl_fn::all_reduce, 1, dtype::i32, reduce_op::sum},  // ibarrier
      {nccl_fn::send, 5, dtype::f64, reduce_op::sum, 2},
      {nccl_fn::recv, 5, dtype::f64, reduce_op::sum, 0},
      {nccl_fn::recv, 5, dtype::f64, reduce_op::sum, 0},
      {nccl_fn::send, 4, dtype::f64, reduce_op::sum, 0},
      {nccl_fn::all_reduce, 1, dtype::f64, reduce_op::sum}};
  const auto got = rep.calls_of(logs, 1, world);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("call " << i << ": " << describe(got[i]) << " vs " << describe(want[i]));
    CHECK(got[i].same_call(want[i]));
  }
  const auto sub = rep.calls_of(logs, 3, high);
  REQUIRE(sub.size() == 2);
  CHECK(sub[0].same_call({nccl_fn::all_reduce, 6, dtype::f64, reduce_op::sum}));
  CHECK(sub[1].same_call({nccl_fn::all_gather, 3, dtype::f32}));
}

TEST_CASE("nccl recording: what NCCL would not run is reported", "[comm][nccl]") {
  SECTION("a cycle of collectives over three groups on one stream") {
    // Ranks 0, 1, 2; groups {0,1}, {1,2}, {0,2}. Each rank starts its two
    // all-reduces asynchronously: the host runs each group on its own
    // helper thread and completes; one stream per rank cannot.
    const auto rep = run_recorded(3, [](rec& w) {
      const int r = w.rank();
      rec a = w.split(r == 2 ? 1 : 0, r);  // {0,1} and {2}
      rec b = w.split(r == 0 ? 1 : 0, r);  // {1,2} and {0}
      rec c = w.split(r == 1 ? 1 : 0, r);  // {0,2} and {1}
      double x[2] = {1, 2}, y[2] = {3, 4};
      // rank 0: {0,1} then {0,2}; rank 1: {1,2} then {0,1}; rank 2: {0,2} then {1,2}
      rec& first = r == 0 ? a : r == 1 ? b : c;
      rec& second = r == 0 ? c : r == 1 ? a : b;
      auto q1 = first.iall_reduce(x, 2, reduce_op::sum);
      auto q2 = second.iall_reduce(y, 2, reduce_op::sum);
      q1.wait();
      q2.wait();
    });
    CHECK(mentions(rep, "NCCL would deadlock"));
    CHECK(mentions(rep, "world rank 0 operation #3 (all_reduce(n=2 double, sum) on group {0,1})"));
  }
  SECTION("messages NCCL would pair otherwise than the host's tags") {
    const auto rep = run_recorded(2, [](rec& w) {
      double a[3] = {1, 2, 3}, b[3];
      if (w.rank() == 0) {
        w.isend(a, 3, 1, 5).wait();
        w.isend(a, 3, 1, 6).wait();
      } else {
        w.recv(b, 3, 0, 6);
        w.recv(b, 3, 0, 5);
      }
    });
    CHECK(mentions(rep,
                   "(ncclSend(count=3, ncclFloat64, peer=1), tag 5) meets the receive "
                   "ncclRecv(count=3, ncclFloat64, peer=0) tag 6"));
  }
  SECTION("a ring of lone sends, each rank sending first") {
    // The host buffers sends, so this runs; NCCL's send waits for its
    // receive, so every rank waits in its send (the executor groups them).
    const auto rep = run_recorded(3, [](rec& w) {
      const int r = w.rank(), N = w.size();
      double a[2] = {1, 2}, b[2];
      w.send(a, 2, (r + 1) % N, 0);
      w.recv(b, 2, (r + N - 1) % N, 0);
    });
    CHECK(mentions(rep, "NCCL would deadlock"));
    CHECK(mentions(rep, "world rank 2 operation #0 (send(n=2 double, to 0, tag 0)"));
  }
  SECTION("ranks that reduce with different operators") {
    const auto rep = run_recorded(2, [](rec& w) {
      double a[2] = {1, 2};
      w.all_reduce(a, 2, w.rank() == 0 ? reduce_op::sum : reduce_op::max);
    });
    CHECK(mentions(rep,
                   "its collective #0 is ncclAllReduce(count=2, ncclFloat64, ncclMax) on "
                   "world rank 1 but ncclAllReduce(count=2, ncclFloat64, ncclSum) on world "
                   "rank 0"));
  }
  SECTION("an operation issued around the recorder") {
    const auto rep = run_recorded(2, [](rec& w) {
      double a[2] = {1, 2};
      static_cast<local_communicator&>(w).all_reduce(a, 2, reduce_op::sum);  // not recorded
      w.all_reduce(a, 1, reduce_op::sum);
      static_cast<local_communicator&>(w).barrier();  // after the last recorded one
    });
    CHECK(mentions(rep,
                   "world rank 0: the host executed all_reduce (n=2 double, sum) on group "
                   "{0,1} outside any recorded operation"));
    CHECK(mentions(rep, "world rank 1: 1 host operations on group {0,1} after its last recorded"));
  }
}

}  // namespace test_comm_nccl_calls
