#pragma once
/// \file parallel/pipeline_sim.hpp
/// A discrete-event simulator of pipeline schedules (parallel/
/// pipeline_schedule.hpp): it runs every rank's action list against given
/// per-action costs, with non-blocking sends and blocking receives, and
/// reports the step time, each rank's busy and idle time, the bubble
/// fraction, the peak number of records in flight and the timeline. It is
/// how the schedules' bubbles and deadlock freedom are tested without a
/// model; it models no memory traffic, no launch overhead and no
/// contention between a rank's compute and its messages.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/parallel/pipeline_schedule.hpp"
#include "tessera/parallel/schedule.hpp"

namespace tessera::parallel {

/// The time of each action of one rank (any unit; the tests use F = 1).
/// A full `backward` costs backward_input + backward_weight. Under V
/// virtual stages each action of a chunk costs 1/V of these: each of a
/// rank's V chunks holds 1/V of its layers. `hop` is the latency of one
/// message (send to availability at the receiver).
struct stage_costs {
  double forward = 1;          ///< F
  double backward_input = 1;   ///< B
  double backward_weight = 1;  ///< W
  double hop = 0;              ///< message latency
};

// timed_action (schedule.hpp): in a simulation a compute action runs over
// [start, end); a receive's [start, end] is its wait (the rank reaches it
// at start, the message is there at end); sends and the step's
// reductions, clip and optimizer step take no time (start == end);
// `allocated` is 0.

/// How the simulated transport delivers a message.
enum class message_transport : std::uint8_t {
  /// A send takes no time and never waits; its message is available to the
  /// receiver hop after it (the host communicators: local's queues, MPI's
  /// isend, which progress without the receiver's help).
  buffered,
  /// NCCL's point-to-point semantics: each message group (schedule.hpp's
  /// message_groups: a run of adjacent message actions) is issued as one
  /// group and the rank waits until all of it has completed; a send or a
  /// receive completes hop after both it and its peer's matching operation
  /// have been issued; the n-th send of rank a to rank b matches the n-th
  /// receive of b from a (no tags), which must be the same message.
  rendezvous,
};

/// The result of simulate. Every vector has one entry per rank.
struct simulation {
  double step_time = 0;                      ///< when the last rank finishes (the step starts at 0)
  std::vector<double> busy;                  ///< compute time of each rank
  std::vector<double> idle;                  ///< step_time - busy
  double bubble_fraction = 0;                ///< 1 - sum(busy) / (K step_time); 0 if step_time is 0
  std::vector<std::int64_t> peak_in_flight;  ///< schedule.hpp's peak_in_flight over all chunks
  std::vector<std::vector<timed_action>> timeline;  ///< each rank's actions, in list order
};

/// Simulates one step: lists[k] is rank k's action list (K = lists.size()),
/// each model chunk c of rank k being virtual stage c K + k of K
/// `virtual_stages` (pipeline_schedule.hpp's layout). Each rank runs its
/// list in order from time 0: compute actions take their cost (stage_costs,
/// divided by V); send_* takes no time and makes its message available at
/// the send's time + hop; recv_* waits until the matching send's message is
/// available (send_forward (m, c) of virtual stage v matches recv_forward
/// (m) of v + 1; send_backward of v matches recv_backward of v - 1). The
/// result is independent of the order ranks are stepped in. Under the
/// `rendezvous` transport a message group waits from when the rank reaches
/// it until all its messages completed (each action of the group gets that
/// [start, end]).
/// Throws config_error when K < 1 or V < 1; an action's chunk is outside
/// [0, V) or a message action's micro-batch is < 0; a send or receive has
/// no neighbouring virtual stage; a receive has no matching send, a send is
/// never received, or either appears twice; a backward (B or W) precedes
/// its forward (peak_in_flight's checks); or no rank can progress while
/// some are unfinished: "deadlock: rank 1 waits in recv_backward of
/// micro-batch 3 (chunk 0); ...", naming every blocked rank; under
/// `rendezvous`, also when the n-th send of one rank to another is not the
/// message of the peer's n-th receive from it, naming both.
///
/// `costs` is taken by reference on purpose (both overloads): GCC 12.2 at
/// -O3 -march=native (AVX) miscompiles the by-value copy of a stage_costs
/// into the outgoing argument area when the value is the constant
/// {1, 1, 1, 0}: the 32-byte copy becomes an OImode constant whose top
/// (zero) 64-bit word is implicit, and the x86 back end turns it into a
/// broadcast of 1.0 to all four words, so the callee saw hop = 1
/// (ix86_convert_const_wide_int_to_broadcast; later GCC checks the word
/// count). By reference there is no such copy.
inline simulation simulate(const std::vector<std::vector<action>>& lists, int virtual_stages,
                           const stage_costs& costs,
                           message_transport transport = message_transport::buffered) {
  const int K = static_cast<int>(lists.size());
  const int V = virtual_stages;
  TESSERA_THROW_IF(K < 1, config_error, "simulate: no ranks (lists is empty)");
  TESSERA_THROW_IF(V < 1, config_error, "simulate: virtual stages V=", V, " must be >= 1");
  const int KV = K * V;

  // Message slots, one per (direction, micro-batch, receiving virtual stage).
  std::int64_t M = 0;
  for (int k = 0; k < K; ++k)
    for (const action& a : lists[static_cast<std::size_t>(k)]) {
      if (!is_compute(a.kind) && !is_message(a.kind)) continue;
      TESSERA_THROW_IF(a.chunk < 0 || a.chunk >= V, config_error, "simulate: rank ", k, "'s ",
                       to_string(a.kind), " of micro-batch ", a.micro_batch, " has chunk ", a.chunk,
                       " outside [0, V=", V, ")");
      TESSERA_THROW_IF(a.micro_batch < 0, config_error, "simulate: rank ", k, "'s ",
                       to_string(a.kind), " has micro-batch ", a.micro_batch, " < 0");
      M = std::max(M, a.micro_batch + 1);
    }
  struct slot {
    int sends = 0, recvs = 0;
    int sender = -1, receiver = -1;
    bool sent = false;
    double available = 0;
    bool send_posted = false, recv_posted = false;  // rendezvous: issued (in an active group)
    double send_time = 0, recv_time = 0;
  };
  std::vector<slot> slots(static_cast<std::size_t>(2 * M * KV));
  const char* const send_name[2] = {"send_forward", "send_backward"};
  const char* const recv_name[2] = {"recv_forward", "recv_backward"};
  // The slot a message action uses, or nullptr for a compute action.
  auto slot_of = [&](int k, const action& a) -> slot* {
    const int v = a.chunk * K + k;
    int dir = 0, to = 0;
    switch (a.kind) {
      case action_kind::send_forward:
        dir = 0, to = v + 1;
        break;
      case action_kind::recv_forward:
        dir = 0, to = v;
        break;
      case action_kind::send_backward:
        dir = 1, to = v - 1;
        break;
      case action_kind::recv_backward:
        dir = 1, to = v;
        break;
      default:
        return nullptr;
    }
    const bool recv = a.kind == action_kind::recv_forward || a.kind == action_kind::recv_backward;
    TESSERA_THROW_IF(
        to < 0 || to >= KV || (recv && (dir == 0 ? v == 0 : v == KV - 1)), config_error,
        "simulate: rank ", k, "'s ", to_string(a.kind), " of micro-batch ", a.micro_batch,
        " (chunk ", a.chunk, ") is on virtual stage ", v, " of ", KV, ", which has no ",
        dir == 0 ? (recv ? "previous" : "next") : (recv ? "next" : "previous"), " virtual stage");
    return &slots[static_cast<std::size_t>((dir * M + a.micro_batch) * KV + to)];
  };
  auto describe = [&](std::size_t i) {
    const int dir = static_cast<int>(i / static_cast<std::size_t>(M * KV));
    const std::int64_t m = static_cast<std::int64_t>(i / static_cast<std::size_t>(KV)) % M;
    const int to = static_cast<int>(i % static_cast<std::size_t>(KV));
    const int from = dir == 0 ? to - 1 : to + 1;
    return ::tessera::detail::str("micro-batch ", m, " from virtual stage ", from, " (rank ",
                                  from % K, " chunk ", from / K, ") to virtual stage ", to,
                                  " (rank ", to % K, " chunk ", to / K, ")");
  };
  for (int k = 0; k < K; ++k)
    for (const action& a : lists[static_cast<std::size_t>(k)])
      if (slot* s = slot_of(k, a)) {
        if (a.kind == action_kind::send_forward || a.kind == action_kind::send_backward)
          ++s->sends, s->sender = k;
        else
          ++s->recvs, s->receiver = k;
      }
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const slot& s = slots[i];
    const int dir = static_cast<int>(i / static_cast<std::size_t>(M * KV));
    TESSERA_THROW_IF(s.recvs > 0 && s.sends == 0, config_error, "simulate: rank ", s.receiver,
                     "'s ", recv_name[dir], " of ", describe(i), " has no matching ",
                     send_name[dir], " on any rank");
    TESSERA_THROW_IF(s.sends > 0 && s.recvs == 0, config_error, "simulate: rank ", s.sender, "'s ",
                     send_name[dir], " of ", describe(i), " is never received (no ", recv_name[dir],
                     " on any rank)");
    TESSERA_THROW_IF(s.sends > 1, config_error, "simulate: ", send_name[dir], " of ", describe(i),
                     " appears ", s.sends, " times");
    TESSERA_THROW_IF(s.recvs > 1, config_error, "simulate: ", recv_name[dir], " of ", describe(i),
                     " appears ", s.recvs, " times");
  }

  const bool rendezvous = transport == message_transport::rendezvous;
  // Rendezvous: the n-th send of rank a to rank b and the n-th receive of b
  // from a carry the same message (NCCL matches in issue order, no tags).
  // Per rank: for each message action, the end of its message group.
  std::vector<std::vector<std::size_t>> group_ends(static_cast<std::size_t>(K));
  if (rendezvous) {
    std::vector<std::vector<std::size_t>> sent(static_cast<std::size_t>(K * K)),
        received(static_cast<std::size_t>(K * K));
    for (int k = 0; k < K; ++k) {
      const std::vector<action>& list = lists[static_cast<std::size_t>(k)];
      for (const action& a : list)
        if (slot* s = slot_of(k, a)) {
          const std::size_t i = static_cast<std::size_t>(s - slots.data());
          const int to = static_cast<int>(i % static_cast<std::size_t>(KV));
          const int dir = static_cast<int>(i / static_cast<std::size_t>(M * KV));
          const int from = dir == 0 ? to - 1 : to + 1;
          const bool send =
              a.kind == action_kind::send_forward || a.kind == action_kind::send_backward;
          if (send)
            sent[static_cast<std::size_t>(k * K + to % K)].push_back(i);
          else
            received[static_cast<std::size_t>((from % K) * K + k)].push_back(i);
        }
      std::vector<std::size_t>& ends = group_ends[static_cast<std::size_t>(k)];
      ends.assign(list.size(), 0);
      for (const action_range& g : message_groups(list))
        for (std::size_t j = g.begin; j < g.end; ++j) ends[j] = g.end;
    }
    for (int a = 0; a < K; ++a)
      for (int b = 0; b < K; ++b) {
        const auto& s = sent[static_cast<std::size_t>(a * K + b)];
        const auto& q = received[static_cast<std::size_t>(a * K + b)];
        for (std::size_t n = 0; n < s.size() && n < q.size(); ++n)
          TESSERA_THROW_IF(s[n] != q[n], config_error, "simulate: rank ", a, "'s send #", n,
                           " to rank ", b, " is ", describe(s[n]), ", but rank ", b, "'s receive #",
                           n, " from rank ", a, " expects ", describe(q[n]),
                           ": a transport without tags (NCCL) matches them in order");
      }
  }

  simulation r;
  r.busy.assign(static_cast<std::size_t>(K), 0.0);
  r.timeline.resize(static_cast<std::size_t>(K));
  for (int k = 0; k < K; ++k) {
    r.peak_in_flight.push_back(peak_in_flight(lists[static_cast<std::size_t>(k)]));
    r.timeline[static_cast<std::size_t>(k)].reserve(lists[static_cast<std::size_t>(k)].size());
  }
  auto cost = [&](action_kind kind) {
    switch (kind) {
      case action_kind::forward:
        return costs.forward / V;
      case action_kind::backward:
        return (costs.backward_input + costs.backward_weight) / V;
      case action_kind::backward_input:
        return costs.backward_input / V;
      case action_kind::backward_weight:
        return costs.backward_weight / V;
      default:
        return 0.0;
    }
  };

  std::vector<std::size_t> next(static_cast<std::size_t>(K), 0);
  std::vector<double> clock(static_cast<std::size_t>(K), 0.0);
  std::vector<double> group_start(static_cast<std::size_t>(K), -1.0);  // < 0: none issued
  for (;;) {
    bool progressed = false, finished = true;
    for (int k = 0; k < K; ++k) {
      const std::vector<action>& list = lists[static_cast<std::size_t>(k)];
      std::size_t& i = next[static_cast<std::size_t>(k)];
      double& t = clock[static_cast<std::size_t>(k)];
      for (; i < list.size(); ++i) {
        const action& a = list[i];
        timed_action ta{a, t, t};
        if (rendezvous && is_message(a.kind)) {
          const std::size_t end = group_ends[static_cast<std::size_t>(k)][i];
          double& start = group_start[static_cast<std::size_t>(k)];
          if (start < 0) {  // issue the group
            start = t;
            for (std::size_t j = i; j < end; ++j) {
              slot* s = slot_of(k, list[j]);
              const bool send = list[j].kind == action_kind::send_forward ||
                                list[j].kind == action_kind::send_backward;
              (send ? s->send_posted : s->recv_posted) = true;
              (send ? s->send_time : s->recv_time) = t;
            }
            progressed = true;
          }
          double done = start;
          bool complete = true;
          for (std::size_t j = i; j < end && complete; ++j) {
            const slot* s = slot_of(k, list[j]);
            complete = s->send_posted && s->recv_posted;
            done = std::max(done, std::max(s->send_time, s->recv_time) + costs.hop);
          }
          if (!complete) break;  // blocked until the peers issue theirs
          for (std::size_t j = i; j < end; ++j)
            r.timeline[static_cast<std::size_t>(k)].push_back({list[j], start, done});
          t = done;
          start = -1;
          i = end - 1;  // the loop's ++i moves past the group
          progressed = true;
          continue;
        }
        if (slot* s = slot_of(k, a)) {
          if (a.kind == action_kind::send_forward || a.kind == action_kind::send_backward) {
            s->sent = true;
            s->available = t + costs.hop;
          } else {
            if (!s->sent) break;  // blocked until the sender gets there
            t = std::max(t, s->available);
            ta.end = t;
          }
        } else {
          const double c = cost(a.kind);
          t += c;
          ta.end = t;
          r.busy[static_cast<std::size_t>(k)] += c;
        }
        r.timeline[static_cast<std::size_t>(k)].push_back(ta);
        progressed = true;
      }
      if (i < list.size()) finished = false;
    }
    if (finished) break;
    if (!progressed) {
      std::string waits;
      for (int k = 0; k < K; ++k) {
        const std::vector<action>& list = lists[static_cast<std::size_t>(k)];
        const std::size_t i = next[static_cast<std::size_t>(k)];
        if (i == list.size()) continue;
        const action& a = list[i];
        waits += ::tessera::detail::str(waits.empty() ? "" : "; ", "rank ", k, " waits in ",
                                        to_string(a.kind), " of micro-batch ", a.micro_batch,
                                        " (chunk ", a.chunk, ")");
      }
      throw config_error("simulate: deadlock: " + waits + "; no rank can progress");
    }
  }

  for (int k = 0; k < K; ++k)
    r.step_time = std::max(r.step_time, clock[static_cast<std::size_t>(k)]);
  double sum = 0;
  for (int k = 0; k < K; ++k) {
    r.idle.push_back(r.step_time - r.busy[static_cast<std::size_t>(k)]);
    sum += r.busy[static_cast<std::size_t>(k)];
  }
  r.bubble_fraction = r.step_time > 0 ? 1 - sum / (K * r.step_time) : 0;
  return r;
}

/// Simulates `kind` on `shape`: every rank's list from make_schedule, then
/// simulate(lists, shape.virtual_stages, costs, transport). Throws as both do.
inline simulation simulate(schedule_kind kind, pipeline_shape shape, const stage_costs& costs = {},
                           message_transport transport = message_transport::buffered) {
  check_pipeline(kind, shape);
  std::vector<std::vector<action>> lists;
  for (int k = 0; k < shape.stages; ++k) lists.push_back(make_schedule(kind, k, shape));
  return simulate(lists, shape.virtual_stages, costs, transport);
}

}  // namespace tessera::parallel
