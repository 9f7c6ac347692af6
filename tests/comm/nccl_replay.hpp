#pragma once
// nccl_replay: holds the ranks' records of tests/comm/nccl_recording.hpp
// together, the NCCL sequence of a host run against what the host
// communicators executed and against what NCCL needs to run it.
//
// check(logs):
//  1. per operation: the host executed exactly the operation (kind, count,
//     dtype, reduction or root, peer and tag, in order; a group as its
//     sends and receives), and its NCCL calls are those the host record
//     implies (the table of nccl_calls.hpp restated here on the host's
//     terms: counts, datatypes, reductions, peers, roots, in place where
//     NCCL's call is), with balanced ncclGroupStart/ncclGroupEnd and no
//     collective inside a group;
//  2. per rank and communicator: nothing ran around the recorder, and the
//     bytes the host transport counted as it moved them (local_communicator
//     counts what its channels carry) equal the ring formulas of
//     communicator.hpp over the NCCL calls' counts, per operation kind;
//  3. over all ranks, what NCCL needs not to deadlock or corrupt: on each
//     group every member issues the same collectives in the same order;
//     the k-th send from a to b on a group meets b's k-th receive from a
//     (NCCL matches in issue order) with the same count, datatype and tag
//     (so NCCL pairs the messages the host paired by tag); and a replay
//     with one stream per rank (each rank's launches in issue order, a
//     collective completing when every member has reached it, a send when
//     its receive is posted in the peer's current launch and vice versa)
//     completes. On a GPU the data-parallel group runs on a second stream
//     ordered by events (parallel/stream_order.hpp), which only allows
//     more orders: issue order on one stream per rank remains one of
//     them, so its completing shows that a schedule exists.

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/comm/nccl_calls.hpp>

#include "nccl_recording.hpp"

namespace nccl_recording {

/// What check() found (problems empty: the recording is the host's
/// sequence and NCCL would run it), and each group's members.
struct report {
  std::vector<std::string> problems;
  std::map<std::uint64_t, std::vector<int>> members;  ///< group id -> world ranks by group rank
  std::size_t launches = 0;                           ///< over all ranks
  std::size_t calls = 0;                              ///< NCCL calls over all ranks
  /// The calls of world rank r on group g (GroupStart/End left out).
  std::vector<nccl_call> calls_of(const std::vector<std::shared_ptr<rank_log>>& logs, int r,
                                  std::uint64_t g) const {
    std::vector<nccl_call> out;
    for (const launch& l : logs[static_cast<std::size_t>(r)]->launches)
      if (l.group == g)
        for (const nccl_call& c : l.calls)
          if (c.fn != nccl_fn::group_start && c.fn != nccl_fn::group_end) out.push_back(c);
    return out;
  }
  /// The group (the lowest id) whose members are exactly `ranks`, by group
  /// rank; 0 if none. A split with its parent's members is another such
  /// group: take the id from the recorder (recording::id) to tell them apart.
  std::uint64_t group_of(std::vector<int> ranks) const {
    for (const auto& [id, m] : members)
      if (m == ranks) return id;
    return 0;
  }
};

namespace detail {

// The host record a launch must have produced (its operation, or a
// group's operations in order), the fields the journal fills.
inline std::vector<op_record> expected_host(const launch& l, int group_size) {
  const dtype host_dt = l.widened ? dtype::f32 : l.dt;
  auto coll = [&](op_kind k, std::size_t n, dtype dt, std::string param) {
    op_record r;
    r.k = k;
    r.collective = true;
    r.n = n;
    r.dt = dt;
    r.param = std::move(param);
    r.group = group_size;
    return r;
  };
  auto pt = [](op_kind k, std::size_t n, dtype dt, int peer, int tag) {
    op_record r;
    r.k = k;
    r.collective = false;
    r.n = n;
    r.dt = dt;
    r.peer = peer;
    r.tag = tag;
    return r;
  };
  if (l.grouped) {
    std::vector<op_record> out;
    for (const p2p_op& o : l.ops) out.push_back(pt(o.kind, o.n, o.dt, o.peer, o.tag));
    return out;
  }
  switch (l.k) {
    case op_kind::all_reduce:
    case op_kind::reduce_scatter:
      return {coll(l.k, l.n, host_dt, to_string(l.op))};
    case op_kind::all_gather:
      return {coll(l.k, l.n, host_dt, {})};
    case op_kind::broadcast:
      return {coll(l.k, l.n, host_dt, str("root ", l.peer))};
    case op_kind::barrier:
      return {coll(l.k, 0, dtype::none, {})};
    case op_kind::split:
      return {coll(l.k, 2, dtype::i64, l.param)};
    case op_kind::send:
    case op_kind::recv:
      return {pt(l.k, l.n, host_dt, l.peer, l.tag)};
  }
  return {};
}

inline bool same_record(const op_record& a, const op_record& b) {
  if (a.k != b.k || a.collective != b.collective || a.n != b.n || a.dt != b.dt) return false;
  if (a.collective) return a.param == b.param && a.group == b.group;
  return a.peer == b.peer && a.tag == b.tag;
}
inline std::string describe(const op_record& r) {
  if (r.collective)
    return str(to_string(r.k), "(n=", r.n, " ", to_string(r.dt), r.param.empty() ? "" : ", ",
               r.param, ", group of ", r.group, ")");
  return str(to_string(r.k), "(n=", r.n, " ", to_string(r.dt), ", peer ", r.peer, ", tag ", r.tag,
             ")");
}

// The NCCL calls the host record of one operation implies, stated on the
// host's terms (nccl_calls.hpp's table, written again here): the host's
// per-rank chunk is NCCL's recvcount (ReduceScatter) and sendcount
// (AllGather); a barrier is one int32 summed; an operation of no element
// (a group whose operations move none) is no call. In the host's
// datatypes (implied_calls maps a widened bf16 operation's back).
inline std::vector<nccl_call> implied_host_calls(const launch& l) {
  std::vector<nccl_call> out;
  if (l.grouped) {
    std::size_t total = 0;
    for (const op_record& r : l.host) total += r.n;
    if (total == 0) return out;
    out.push_back({nccl_fn::group_start});
    for (const op_record& r : l.host)
      out.push_back({r.k == op_kind::send ? nccl_fn::send : nccl_fn::recv, r.n, r.dt,
                     reduce_op::sum, r.peer});
    out.push_back({nccl_fn::group_end});
    return out;
  }
  for (const op_record& r : l.host) {
    const reduce_op op = r.param == "max" ? reduce_op::max : reduce_op::sum;
    switch (r.k) {
      case op_kind::all_reduce:
        if (r.n > 0) out.push_back({nccl_fn::all_reduce, r.n, r.dt, op});
        break;
      case op_kind::reduce_scatter:
        if (r.n > 0) out.push_back({nccl_fn::reduce_scatter, r.n, r.dt, op});
        break;
      case op_kind::all_gather:
        if (r.n > 0) out.push_back({nccl_fn::all_gather, r.n, r.dt});
        break;
      case op_kind::broadcast:
        if (r.n > 0)
          out.push_back({nccl_fn::broadcast, r.n, r.dt, reduce_op::sum,
                         std::stoi(r.param.substr(r.param.find(' ') + 1))});
        break;
      case op_kind::barrier:
        out.push_back({nccl_fn::all_reduce, 1, dtype::i32, reduce_op::sum});
        break;
      case op_kind::send:
      case op_kind::recv:
        if (r.n > 0)
          out.push_back({r.k == op_kind::send ? nccl_fn::send : nccl_fn::recv, r.n, r.dt,
                         reduce_op::sum, r.peer});
        break;
      case op_kind::split:
        break;  // ncclCommSplit: no data call
    }
  }
  return out;
}
// implied_host_calls in NCCL's datatypes: a widened operation is bf16.
inline std::vector<nccl_call> implied_calls(const launch& l) {
  std::vector<nccl_call> out = implied_host_calls(l);
  if (l.widened)
    for (nccl_call& c : out)
      if (c.dt == dtype::f32) c.dt = dtype::bf16;
  return out;
}

// Problems with the shape of a call list: unbalanced groups, a collective
// inside a group, a point-to-point call outside one (unless alone), the
// buffers NCCL's call takes (in place where the operation is).
inline std::string malformed(const std::vector<nccl_call>& calls) {
  int depth = 0;
  for (const nccl_call& c : calls) {
    switch (c.fn) {
      case nccl_fn::group_start:
        if (++depth > 1) return "nested ncclGroupStart";
        break;
      case nccl_fn::group_end:
        if (--depth < 0) return "ncclGroupEnd without ncclGroupStart";
        break;
      case nccl_fn::send:
      case nccl_fn::recv:
        if (depth == 0 && calls.size() > 1) return str(to_string(c.fn), " outside a group");
        if (c.fn == nccl_fn::send ? c.sendbuff == nullptr || c.recvbuff != nullptr
                                  : c.recvbuff == nullptr || c.sendbuff != nullptr)
          return str(to_string(c.fn), " with the wrong buffer");
        break;
      case nccl_fn::all_reduce:
      case nccl_fn::broadcast:
        if (depth > 0) return str(to_string(c.fn), " inside a group");
        if (c.sendbuff != c.recvbuff || c.recvbuff == nullptr)
          return str(to_string(c.fn), " not in place");
        break;
      case nccl_fn::reduce_scatter:
      case nccl_fn::all_gather:
        if (depth > 0) return str(to_string(c.fn), " inside a group");
        if (c.sendbuff == nullptr || c.recvbuff == nullptr)
          return str(to_string(c.fn), " without its buffers");
        break;
    }
  }
  return depth == 0 ? std::string{} : std::string("ncclGroupStart without ncclGroupEnd");
}

// Bytes the host communicators count for NCCL call `c` on rank r of N
// (communicator.hpp's ring formulas over NCCL's counts).
inline std::uint64_t ring_bytes(const nccl_call& c, int N, int r) {
  const std::size_t e = dtype_bytes(c.dt);
  switch (c.fn) {
    case nccl_fn::all_reduce:
      return ring_all_reduce_bytes(c.count, e, N, r);
    case nccl_fn::reduce_scatter:
    case nccl_fn::all_gather:
      return ring_scatter_gather_bytes(c.count, e, N);
    case nccl_fn::broadcast:
      return chain_broadcast_bytes(c.count, e, N, r, c.peer);
    case nccl_fn::send:
      return static_cast<std::uint64_t>(c.count * e);
    default:
      return 0;
  }
}
inline op_kind kind_of(nccl_fn f) {
  switch (f) {
    case nccl_fn::all_reduce:
      return op_kind::all_reduce;
    case nccl_fn::reduce_scatter:
      return op_kind::reduce_scatter;
    case nccl_fn::all_gather:
      return op_kind::all_gather;
    case nccl_fn::broadcast:
      return op_kind::broadcast;
    case nccl_fn::send:
      return op_kind::send;
    default:
      return op_kind::recv;
  }
}

// One operation of the replay: a collective (or split) of a launch, or
// one send or receive of it.
struct sim_op {
  bool collective = false;
  bool split = false;  // ncclCommSplit (call unused)
  std::uint64_t group = 0;
  nccl_call call;
  int peer_world = -1;    // p2p: the peer's world rank
  std::size_t index = 0;  // p2p: its number on its channel; collective: on its group
  int tag = 0;
  bool done = false;
  [[nodiscard]] bool send() const { return call.fn == nccl_fn::send; }
};
// A launch of the replay: the operations of one recorded launch.
struct sim_launch {
  std::size_t at = 0;  // index in the rank's launches
  std::vector<sim_op> ops;
};
using channel = std::tuple<std::uint64_t, int, int>;  // group, sender world rank, receiver

// check()'s steps over the logs (file comment).
class checker {
 public:
  explicit checker(const std::vector<std::shared_ptr<rank_log>>& logs)
      : logs_(logs), W_(static_cast<int>(logs.size())) {}

  report run() {
    members();
    for (int r = 0; r < W_; ++r) per_rank(r);
    if (!rep_.problems.empty()) return rep_;  // the replay needs consistent records
    build_runs();
    pairs();
    collectives();
    if (rep_.problems.empty()) replay();
    return rep_;
  }

 private:
  template <class... A>
  void problem(A&&... a) {
    rep_.problems.push_back(str(std::forward<A>(a)...));
  }
  const rank_log& log(int r) const { return *logs_[static_cast<std::size_t>(r)]; }
  // "group {0,2,4}": a group by its members' world ranks.
  std::string name(std::uint64_t id) const {
    const auto it = rep_.members.find(id);
    if (it == rep_.members.end()) return str("group ", id, " (unknown)");
    std::string s = "group {";
    for (std::size_t i = 0; i < it->second.size(); ++i) s += str(i ? "," : "", it->second[i]);
    return s + "}";
  }
  std::string op_name(int r, const sim_launch& s) const {
    const launch& l = log(r).launches[s.at];
    return str("world rank ", r, " operation #", s.at, " (", describe(l), " on ", name(l.group),
               ")");
  }

  // Every group's members by group rank, each slot held by one world rank.
  void members() {
    for (int r = 0; r < W_; ++r) {
      if (log(r).world_rank != r) problem("log ", r, " belongs to world rank ", log(r).world_rank);
      for (const auto& [id, g] : log(r).groups) {
        auto& m = rep_.members[id];
        if (m.empty()) m.assign(static_cast<std::size_t>(g.size), -1);
        if (static_cast<int>(m.size()) != g.size || g.rank < 0 || g.rank >= g.size) {
          problem("group ", id, ": world rank ", r, " holds rank ", g.rank, " of ", g.size,
                  ", other members a group of ", m.size());
          continue;
        }
        int& slot = m[static_cast<std::size_t>(g.rank)];
        if (slot != -1 && slot != r)
          problem("group ", id, ": rank ", g.rank, " held by world ranks ", slot, " and ", r);
        slot = r;
      }
    }
    for (const auto& [id, m] : rep_.members)
      for (std::size_t i = 0; i < m.size(); ++i)
        if (m[i] < 0) problem(name(id), ": no world rank holds its rank ", i);
  }

  // Checks 1 and 2 on world rank r.
  void per_rank(int r) {
    const rank_log& L = log(r);
    for (const auto& [g, s] : L.stray)
      problem("world rank ", r, ": the host executed ", s, " on ", name(g),
              " outside any recorded operation");
    std::map<std::uint64_t, comm_stats> counted, journaled;
    for (std::size_t i = 0; i < L.launches.size(); ++i) {
      const launch& l = L.launches[i];
      ++rep_.launches;
      rep_.calls += l.calls.size();
      const auto g = L.groups.find(l.group);
      if (g == L.groups.end()) {
        problem("world rank ", r, " operation #", i, ": unknown group ", l.group);
        continue;
      }
      const int N = g->second.size;
      const std::string where =
          str("world rank ", r, " operation #", i, " on ", name(l.group), ", ", describe(l));
      const std::vector<op_record> want = expected_host(l, N);
      bool same = want.size() == l.host.size();
      for (std::size_t j = 0; same && j < want.size(); ++j) same = same_record(want[j], l.host[j]);
      if (!same) {
        std::string got;
        for (const op_record& h : l.host) got += describe(h) + " ";
        problem(where, ": the host executed [", got, "]");
      }
      const std::vector<nccl_call> implied = implied_calls(l);
      bool calls_ok = implied.size() == l.calls.size();
      for (std::size_t j = 0; calls_ok && j < implied.size(); ++j)
        calls_ok = implied[j].same_call(l.calls[j]);
      if (!calls_ok) {
        std::string got, exp;
        for (const nccl_call& c : l.calls) got += describe(c) + " ";
        for (const nccl_call& c : implied) exp += describe(c) + " ";
        problem(where, ": NCCL calls [", got, "], the host's record implies [", exp, "]");
      }
      if (const std::string m = malformed(l.calls); !m.empty()) problem(where, ": ", m);
      add_bytes(counted[l.group], l, N, g->second.rank);
      for (const op_record& h : l.host) ++journaled[l.group].of(h.k).calls;
    }
    for (const auto& [id, w] : L.windows) {
      if (!w.closed) {
        problem("world rank ", r, ": ", name(id), " was still recording at the check");
        continue;
      }
      if (w.unrecorded > 0)
        problem("world rank ", r, ": ", w.unrecorded, " host operations on ", name(id),
                " after its last recorded one");
      comm_stats before = w.before, after = w.after, nc = counted[id], jc = journaled[id];
      for (op_kind k : {op_kind::all_reduce, op_kind::reduce_scatter, op_kind::all_gather,
                        op_kind::broadcast, op_kind::send, op_kind::recv, op_kind::barrier}) {
        const std::uint64_t bytes = after.of(k).bytes - before.of(k).bytes;
        const std::uint64_t calls = after.of(k).calls - before.of(k).calls;
        if (bytes != nc.of(k).bytes)
          problem("world rank ", r, " on ", name(id), ": the host moved ", bytes, " bytes of ",
                  to_string(k), ", the NCCL calls' ring formulas say ", nc.of(k).bytes);
        if (calls != jc.of(k).calls)
          problem("world rank ", r, " on ", name(id), ": the host counted ", calls, " ",
                  to_string(k), " calls, its journal holds ", jc.of(k).calls);
      }
    }
    for (const auto& [id, c] : counted)
      if (!L.windows.count(id))
        problem("world rank ", r, ": ", name(id), " recorded operations but has no counters");
  }
  // The bytes the host counts for launch l on rank gr of N, from its NCCL
  // calls: a split's all-gather of (color, key), no payload for a barrier,
  // bf16 moved as float where widened.
  static void add_bytes(comm_stats& c, const launch& l, int N, int gr) {
    if (l.k == op_kind::split) {
      c.of(op_kind::split).bytes += ring_scatter_gather_bytes(2, 8, N);
      return;
    }
    if (l.k == op_kind::barrier) return;
    for (nccl_call nc : l.calls) {
      if (nc.fn == nccl_fn::group_start || nc.fn == nccl_fn::group_end) continue;
      if (l.widened) nc.dt = dtype::f32;
      c.of(kind_of(nc.fn)).bytes += ring_bytes(nc, N, gr);
    }
  }

  // The replay's launches: every recorded launch with a call (or a split),
  // its operations numbered per group (collectives) and per channel (p2p).
  void build_runs() {
    runs_.assign(static_cast<std::size_t>(W_), {});
    std::map<std::pair<std::uint64_t, int>, std::size_t> colls;  // (group, world rank) -> count
    for (int r = 0; r < W_; ++r) {
      auto& run = runs_[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < log(r).launches.size(); ++i) {
        const launch& l = log(r).launches[i];
        const auto& m = rep_.members.at(l.group);
        sim_launch s;
        s.at = i;
        if (l.k == op_kind::split) {
          sim_op o;
          o.collective = o.split = true;
          o.group = l.group;
          o.index = colls[{l.group, r}]++;
          s.ops.push_back(o);
        }
        std::size_t p2p_seen = 0;
        for (const nccl_call& c : l.calls) {
          if (c.fn == nccl_fn::group_start || c.fn == nccl_fn::group_end) continue;
          sim_op o;
          o.group = l.group;
          o.call = c;
          if (is_collective(c.fn)) {
            o.collective = true;
            o.index = colls[{l.group, r}]++;
          } else {
            o.peer_world = m.at(static_cast<std::size_t>(c.peer));
            o.tag = l.grouped ? l.ops.at(p2p_seen).tag : l.tag;
            ++p2p_seen;
            const channel ch =
                o.send() ? channel{l.group, r, o.peer_world} : channel{l.group, o.peer_world, r};
            o.index = (o.send() ? sends_ : recvs_)[ch]++;
            if (o.send())
              send_at_[{ch, o.index}] = {r, run.size(), s.ops.size()};
            else
              recv_at_[{ch, o.index}] = {r, run.size(), s.ops.size()};
          }
          s.ops.push_back(o);
        }
        if (!s.ops.empty()) run.push_back(std::move(s));
      }
    }
  }
  const sim_op& at(const std::tuple<int, std::size_t, std::size_t>& w) const {
    const auto [r, li, oi] = w;
    return runs_[static_cast<std::size_t>(r)][li].ops[oi];
  }

  // The k-th send on each channel meets the k-th receive: as many of each,
  // the same count, datatype and tag.
  void pairs() {
    for (const auto& [ch, n] : sends_) {
      const std::size_t got = recvs_.count(ch) ? recvs_.at(ch) : 0;
      if (got != n)
        problem(name(std::get<0>(ch)), ": world rank ", std::get<1>(ch), " sends ", n,
                " messages to world rank ", std::get<2>(ch), ", which receives ", got);
    }
    for (const auto& [ch, n] : recvs_)
      if (!sends_.count(ch))
        problem(name(std::get<0>(ch)), ": world rank ", std::get<2>(ch), " receives ", n,
                " messages from world rank ", std::get<1>(ch), ", which sends none");
    for (const auto& [key, where] : send_at_) {
      const auto q = recv_at_.find(key);
      if (q == recv_at_.end()) continue;
      const sim_op& o = at(where);
      const sim_op& p = at(q->second);
      if (p.call.count != o.call.count || p.call.dt != o.call.dt || p.tag != o.tag) {
        const int r = std::get<0>(where);
        problem(op_name(r, runs_[static_cast<std::size_t>(r)][std::get<1>(where)]), ": its send #",
                o.index, " to world rank ", o.peer_world, " (", describe(o.call), ", tag ", o.tag,
                ") meets the receive ", describe(p.call), " tag ", p.tag,
                " (NCCL matches in issue order)");
      }
    }
  }

  // Every member of a group issues the same collectives in the same order
  // (splits agree as splits: each member passes its own color).
  void collectives() {
    std::map<std::uint64_t, std::vector<std::pair<int, std::vector<const sim_op*>>>> by_group;
    for (int r = 0; r < W_; ++r) {
      std::map<std::uint64_t, std::vector<const sim_op*>> mine;
      for (const sim_launch& s : runs_[static_cast<std::size_t>(r)])
        for (const sim_op& o : s.ops)
          if (o.collective) mine[o.group].push_back(&o);
      for (auto& [g, v] : mine) by_group[g].emplace_back(r, std::move(v));
    }
    auto what = [](const sim_op* o) { return o->split ? std::string("split") : describe(o->call); };
    for (const auto& [g, per] : by_group) {
      const std::size_t members = rep_.members.at(g).size();
      if (per.size() != members) {
        problem(name(g), ": ", per.size(), " of its ", members, " ranks issue collectives on it");
        continue;
      }
      const auto& [r0, first] = per.front();
      for (const auto& [r, v] : per) {
        for (std::size_t i = 0; i < std::min(v.size(), first.size()); ++i)
          if (v[i]->split != first[i]->split ||
              (!v[i]->split && !v[i]->call.same_call(first[i]->call))) {
            problem(name(g), ": its collective #", i, " is ", what(v[i]), " on world rank ", r,
                    " but ", what(first[i]), " on world rank ", r0);
            break;
          }
        if (v.size() != first.size())
          problem(name(g), ": world rank ", r, " issues ", v.size(),
                  " collectives on it, world rank ", r0, " ", first.size());
      }
    }
  }

  // One stream per rank: each rank's launches in order; a collective
  // completes once every member's current launch holds it, a send and its
  // receive once both ranks' current launches hold them; a launch ends
  // when all its operations completed. Whatever remains is a deadlock.
  void replay() {
    std::vector<std::size_t> pos(static_cast<std::size_t>(W_), 0);
    auto current = [&](int r) -> sim_launch* {
      auto& run = runs_[static_cast<std::size_t>(r)];
      const std::size_t p = pos[static_cast<std::size_t>(r)];
      return p < run.size() ? &run[p] : nullptr;
    };
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < W_; ++r) {
        sim_launch* s = current(r);
        if (!s) continue;
        for (sim_op& o : s->ops) {
          if (o.done) continue;
          std::vector<sim_op*> mates;  // the operations that complete with o
          if (o.collective) {
            for (int w : rep_.members.at(o.group)) {
              sim_op* q = nullptr;
              if (sim_launch* t = current(w))
                for (sim_op& x : t->ops)
                  if (x.collective && !x.done && x.group == o.group && x.index == o.index) q = &x;
              if (!q) {
                mates.clear();
                break;
              }
              mates.push_back(q);
            }
          } else if (sim_launch* t = current(o.peer_world)) {
            for (sim_op& x : t->ops)
              if (!x.collective && !x.done && x.send() != o.send() && x.group == o.group &&
                  x.peer_world == r && x.index == o.index) {
                mates = {&o, &x};
                break;
              }
          }
          for (sim_op* q : mates) q->done = true;
          progress = progress || !mates.empty();
        }
        if (std::all_of(s->ops.begin(), s->ops.end(), [](const sim_op& o) { return o.done; })) {
          ++pos[static_cast<std::size_t>(r)];
          progress = true;
        }
      }
    }
    std::string stuck;
    for (int r = 0; r < W_; ++r)
      if (const sim_launch* s = current(r)) stuck += (stuck.empty() ? "" : "; ") + op_name(r, *s);
    if (!stuck.empty())
      problem("NCCL would deadlock (one stream per rank, launches in issue order); blocked: ",
              stuck);
  }

  const std::vector<std::shared_ptr<rank_log>>& logs_;
  int W_;
  report rep_;
  std::vector<std::vector<sim_launch>> runs_;               // per world rank
  std::map<channel, std::size_t> sends_, recvs_;            // messages per channel
  using place = std::tuple<int, std::size_t, std::size_t>;  // world rank, launch, operation
  std::map<std::pair<channel, std::size_t>, place> send_at_, recv_at_;
};

}  // namespace detail

/// Holds the ranks' records together (file comment); `logs[r]` is world
/// rank r's log.
inline report check(const std::vector<std::shared_ptr<rank_log>>& logs) {
  return detail::checker(logs).run();
}

}  // namespace nccl_recording
