#pragma once
// grouping_local: local_communicator with nccl_communicator's group_p2p and
// its rendezvous, so that the executor's grouped path (parallel/
// executor.hpp) runs on threads. A group posts every send and receive of
// the group at once and completes only when each of its sends has been
// received by the peer's group (the receiver acknowledges each message),
// as an NCCL send waits for its receive: a schedule whose groups do not
// pair up ends in the timeout instead of running. (Messages between two
// ranks still match by tag here, not by order as in NCCL; the simulator's
// rendezvous transport checks the order, tests/parallel/pipeline_schedule.cpp.)

#include <span>
#include <utility>
#include <vector>

#include <tessera/comm/local.hpp>

namespace grouping_test {

class grouping_local : public tessera::comm::local_communicator {
 public:
  explicit grouping_local(tessera::comm::local_communicator&& c)
      : local_communicator(std::move(c)) {}
  grouping_local split(int color, int key) {
    return grouping_local(local_communicator::split(color, key));
  }

  void group_p2p(std::span<const tessera::comm::p2p_op> ops) {
    using tessera::comm::op_kind;
    std::vector<tessera::comm::local_request> sends, recvs;
    for (const auto& o : ops)
      if (o.kind == op_kind::send) sends.push_back(typed(o, true));
    for (const auto& o : ops)
      if (o.kind == op_kind::recv) recvs.push_back(typed(o, false));
    // Each message received is acknowledged to its sender.
    std::vector<tessera::comm::local_request> acks;
    std::int32_t one = 1;
    std::size_t r = 0;
    for (const auto& o : ops)
      if (o.kind == op_kind::recv) {
        recvs[r++].wait();
        acks.push_back(isend(&one, 1, o.peer, o.tag + ack_tag));
      }
    std::int32_t got = 0;
    for (const auto& o : ops)
      if (o.kind == op_kind::send) recv(&got, 1, o.peer, o.tag + ack_tag);
    for (auto& s : sends) s.wait();
    for (auto& a : acks) a.wait();
  }

 private:
  static constexpr int ack_tag = 1 << 20;
  tessera::comm::local_request typed(const tessera::comm::p2p_op& o, bool send) {
    using tessera::comm::dtype;
    auto go = [&](auto* p) {
      return send ? isend(p, o.n, o.peer, o.tag) : irecv(p, o.n, o.peer, o.tag);
    };
    switch (o.dt) {
      case dtype::f32:
        return go(static_cast<float*>(o.buf));
      case dtype::f64:
        return go(static_cast<double*>(o.buf));
      case dtype::i32:
        return go(static_cast<std::int32_t*>(o.buf));
      case dtype::i64:
        return go(static_cast<std::int64_t*>(o.buf));
      default:
        throw tessera::config_error("grouping_local: unsupported dtype");
    }
  }
};

static_assert(tessera::comm::host_communicator<grouping_local>);

}  // namespace grouping_test
