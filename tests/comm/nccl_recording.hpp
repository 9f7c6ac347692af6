#pragma once
// nccl_recording: the NCCL sequence of a real host run (the checks that it
// is what the host communicators executed and that NCCL would run it are
// tests/comm/nccl_replay.hpp's).
//
// `recording<Inner>` is a host communicator (Inner: local_communicator or
// mpi_communicator) that forwards every operation to Inner and, while its
// rank's `rank_log` records, keeps one `launch` per operation: the
// operation as the engine issued it, its NCCL calls (comm/nccl_calls.hpp's
// nccl_translate: the very list nccl_communicator issues) and the entries
// Inner's journal (comm_options::journal) gained meanwhile, which is what
// the host transport executed. It adds nccl_communicator's group_p2p, so
// the pipeline executor takes the path it takes over NCCL (each message
// group one group_p2p); on the host a group posts its operations in order
// (sends are buffered) and waits for them. Its splits record too, and give
// each group an id that its members share (the parent's id, the split's
// number on the parent, the color).
//
// Element types: the host's (comm_element), and tessera::bf16 for
// all_reduce, reduce_scatter and all_gather, which nccl_communicator moves
// natively (tensor parallelism takes that path under a 16-bit precision,
// nn/tensor_parallel.hpp's tp_moves_natively, where it widens to float
// over a host communicator): recorded as ncclBfloat16 calls and run on the
// host in float, so the sequence is NCCL's while the host record says
// float of the same counts (launch::widened).

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <tessera/comm/communicator.hpp>
#include <tessera/comm/communicator_base.hpp>
#include <tessera/comm/nccl_calls.hpp>
#include <tessera/core/numeric.hpp>

namespace nccl_recording {

using tessera::detail::str;
using namespace tessera::comm;

/// One communicator operation of one rank, as the engine issued it.
struct launch {
  std::uint64_t group = 0;       ///< the id of the communicator it was issued on
  op_kind k = op_kind::barrier;  ///< the operation (send for a group_p2p)
  bool grouped = false;          ///< a group_p2p
  std::size_t n = 0;             ///< elements (reduce_scatter, all_gather: the chunk)
  dtype dt = dtype::none;
  reduce_op op = reduce_op::sum;  ///< all_reduce, reduce_scatter
  int peer = -1;                  ///< send, recv: the peer; broadcast: the root
  int tag = 0;                    ///< send, recv
  std::string param;              ///< split: "color c, key k"
  std::vector<p2p_op> ops;        ///< group_p2p's operations, in order
  std::vector<nccl_call> calls;   ///< nccl_translate's list for it
  std::vector<op_record> host;    ///< what the host communicator's journal gained for it
  /// bf16, which the host moves as float (exactly widened): the host
  /// record says float where the NCCL calls say ncclBfloat16.
  bool widened = false;
};

/// "reduce_scatter(n=96 float, sum)", "group_p2p(send 64 float to 1 tag 2, ...)".
inline std::string describe(const launch& l) {
  if (l.grouped) {
    std::string s = "group_p2p(";
    for (std::size_t i = 0; i < l.ops.size(); ++i)
      s += str(i ? ", " : "", to_string(l.ops[i].kind), " ", l.ops[i].n, " ",
               to_string(l.ops[i].dt), l.ops[i].kind == op_kind::send ? " to " : " from ",
               l.ops[i].peer, " tag ", l.ops[i].tag);
    return s + ")";
  }
  switch (l.k) {
    case op_kind::all_reduce:
    case op_kind::reduce_scatter:
      return str(to_string(l.k), "(n=", l.n, " ", to_string(l.dt), ", ", to_string(l.op), ")");
    case op_kind::broadcast:
      return str("broadcast(n=", l.n, " ", to_string(l.dt), ", root ", l.peer, ")");
    case op_kind::send:
    case op_kind::recv:
      return str(to_string(l.k), "(n=", l.n, " ", to_string(l.dt),
                 l.k == op_kind::send ? ", to " : ", from ", l.peer, ", tag ", l.tag, ")");
    case op_kind::split:
      return str("split(", l.param, ")");
    default:
      return str(to_string(l.k), "(n=", l.n, " ", to_string(l.dt), ")");
  }
}

/// The record of one rank: its launches while recording, every
/// communicator it held (id, its rank and size there), and per
/// communicator the host counters around the recording window.
class rank_log {
 public:
  /// What a recorder lends the log (file comment).
  class member {
   public:
    virtual comm_stats counters() const = 0;     // the host communicator's counters now
    virtual std::size_t unrecorded() const = 0;  // journal entries after the last launch
    virtual void skip_journal() = 0;             // the journal so far is not the recording's

   protected:
    ~member() = default;
  };
  struct group_info {
    int rank = 0, size = 1;
  };
  struct window {
    comm_stats before, after;
    std::size_t unrecorded = 0;  // host operations after the last recorded one
    bool closed = false;
  };

  int world_rank = -1;
  std::vector<launch> launches;                // in issue order, every communicator
  std::map<std::uint64_t, group_info> groups;  // every communicator held
  std::map<std::uint64_t, window> windows;     // the communicators live while recording
  /// Host operations issued around the recorder: (group, the operation).
  std::vector<std::pair<std::uint64_t, std::string>> stray;

  [[nodiscard]] bool recording() const { return on_; }
  /// Starts recording (what was recorded before is dropped).
  void start() {
    launches.clear();
    windows.clear();
    stray.clear();
    on_ = true;
    for (auto& [id, m] : live_) {
      m->skip_journal();
      windows[id].before = m->counters();
    }
  }
  /// Stops recording; the counters of every live communicator are read.
  void stop() {
    for (auto& [id, m] : live_) close(id, *m);
    on_ = false;
  }

  // The recorders' bookkeeping (recording<Inner>).
  void enroll(std::uint64_t id, member* m, int rank, int size) {
    live_[id] = m;
    groups[id] = {rank, size};
    if (on_) windows[id].before = m->counters();
  }
  void moved(std::uint64_t id, member* from, member* to) {
    auto it = live_.find(id);
    if (it != live_.end() && it->second == from) it->second = to;
  }
  void retire(std::uint64_t id, member* m) {
    auto it = live_.find(id);
    if (it == live_.end() || it->second != m) return;
    if (on_) close(id, *m);
    live_.erase(it);
  }

 private:
  void close(std::uint64_t id, member& m) {
    window& w = windows[id];
    w.after = m.counters();
    w.unrecorded = m.unrecorded();
    w.closed = true;
  }
  bool on_ = false;
  std::map<std::uint64_t, member*> live_;
};

/// The id of the world every rank starts from.
inline constexpr std::uint64_t world_id = 1;
/// The id of the group of color `color` in the `index`-th split of `parent`.
inline std::uint64_t child_id(std::uint64_t parent, std::uint64_t index, int color) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::uint64_t v : {parent, index, static_cast<std::uint64_t>(color)})
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 0x100000001b3ULL;
  return h;
}

/// A host communicator that records (file comment). Move-only; splits
/// into recorders on the same rank log.
template <class Inner>
class recording : public Inner, private rank_log::member {
 public:
  /// The world of this rank, recording into `log` (its journal is turned on).
  recording(Inner&& c, std::shared_ptr<rank_log> log)
      : recording(std::move(c), std::move(log), world_id) {
    log_->world_rank = Inner::rank();
  }
  recording(recording&& o) noexcept
      : Inner(std::move(o)),
        log_(std::move(o.log_)),
        id_(o.id_),
        seen_(o.seen_),
        splits_(o.splits_) {
    if (log_) log_->moved(id_, static_cast<member*>(&o), static_cast<member*>(this));
  }
  recording& operator=(recording&&) = delete;
  ~recording() {
    if (log_) log_->retire(id_, static_cast<member*>(this));
  }

  [[nodiscard]] std::uint64_t id() const { return id_; }

  template <comm_element T>
  auto iall_reduce(T* buf, std::size_t n, reduce_op op) {
    return record([&] { return reduction(op_kind::all_reduce, n, dtype_of<T>(), op, buf, buf); },
                  [&] { return Inner::iall_reduce(buf, n, op); });
  }
  template <comm_element T>
  void all_reduce(T* buf, std::size_t n, reduce_op op) {
    record([&] { return reduction(op_kind::all_reduce, n, dtype_of<T>(), op, buf, buf); },
           [&] { Inner::all_reduce(buf, n, op); });
  }
  template <comm_element T>
  auto ireduce_scatter(const T* send, T* recv, std::size_t chunk, reduce_op op) {
    return record(
        [&] { return reduction(op_kind::reduce_scatter, chunk, dtype_of<T>(), op, send, recv); },
        [&] { return Inner::ireduce_scatter(send, recv, chunk, op); });
  }
  template <comm_element T>
  void reduce_scatter(const T* send, T* recv, std::size_t chunk, reduce_op op) {
    record([&] { return reduction(op_kind::reduce_scatter, chunk, dtype_of<T>(), op, send, recv); },
           [&] { Inner::reduce_scatter(send, recv, chunk, op); });
  }
  template <comm_element T>
  auto iall_gather(const T* send, T* recv, std::size_t chunk) {
    return record([&] { return gather(chunk, dtype_of<T>(), send, recv); },
                  [&] { return Inner::iall_gather(send, recv, chunk); });
  }
  template <comm_element T>
  void all_gather(const T* send, T* recv, std::size_t chunk) {
    record([&] { return gather(chunk, dtype_of<T>(), send, recv); },
           [&] { Inner::all_gather(send, recv, chunk); });
  }
  // tessera::bf16, which nccl_communicator moves as ncclBfloat16 (tensor
  // parallelism's collectives under a 16-bit precision take this path
  // over it, nn/tensor_parallel.hpp's tp_moves_natively): recorded as
  // bf16, run on the host in float (exactly widened, rounded once after,
  // as nn::all_reduce does for a communicator without bf16).
  void all_reduce(tessera::bf16* buf, std::size_t n, reduce_op op) {
    record([&] { return widen(reduction(op_kind::all_reduce, n, dtype::bf16, op, buf, buf)); },
           [&] {
             std::vector<float> w = wide(buf, n);
             Inner::all_reduce(w.data(), n, op);
             narrow(buf, w);
           });
  }
  void reduce_scatter(const tessera::bf16* send, tessera::bf16* recv, std::size_t chunk,
                      reduce_op op) {
    record(
        [&] {
          return widen(reduction(op_kind::reduce_scatter, chunk, dtype::bf16, op, send, recv));
        },
        [&] {
          std::vector<float> w = wide(send, chunk * static_cast<std::size_t>(Inner::size()));
          std::vector<float> o(chunk);
          Inner::reduce_scatter(w.data(), o.data(), chunk, op);
          narrow(recv, o);
        });
  }
  void all_gather(const tessera::bf16* send, tessera::bf16* recv, std::size_t chunk) {
    record([&] { return widen(gather(chunk, dtype::bf16, send, recv)); },
           [&] {
             std::vector<float> w = wide(send, chunk);
             std::vector<float> o(chunk * static_cast<std::size_t>(Inner::size()));
             Inner::all_gather(w.data(), o.data(), chunk);
             narrow(recv, o);
           });
  }
  template <comm_element T>
  auto ibroadcast(T* buf, std::size_t n, int root) {
    return record([&] { return bcast(n, dtype_of<T>(), root, buf); },
                  [&] { return Inner::ibroadcast(buf, n, root); });
  }
  template <comm_element T>
  void broadcast(T* buf, std::size_t n, int root) {
    record([&] { return bcast(n, dtype_of<T>(), root, buf); },
           [&] { Inner::broadcast(buf, n, root); });
  }
  template <comm_element T>
  auto isend(const T* buf, std::size_t n, int peer, int tag) {
    return record([&] { return p2p(op_kind::send, n, dtype_of<T>(), peer, tag, buf); },
                  [&] { return Inner::isend(buf, n, peer, tag); });
  }
  template <comm_element T>
  void send(const T* buf, std::size_t n, int peer, int tag) {
    record([&] { return p2p(op_kind::send, n, dtype_of<T>(), peer, tag, buf); },
           [&] { Inner::send(buf, n, peer, tag); });
  }
  template <comm_element T>
  auto irecv(T* buf, std::size_t n, int peer, int tag) {
    return record([&] { return p2p(op_kind::recv, n, dtype_of<T>(), peer, tag, buf); },
                  [&] { return Inner::irecv(buf, n, peer, tag); });
  }
  template <comm_element T>
  void recv(T* buf, std::size_t n, int peer, int tag) {
    record([&] { return p2p(op_kind::recv, n, dtype_of<T>(), peer, tag, buf); },
           [&] { Inner::recv(buf, n, peer, tag); });
  }
  auto ibarrier() {
    return record([&] { return barrier_launch(); }, [&] { return Inner::ibarrier(); });
  }
  void barrier() {
    record([&] { return barrier_launch(); }, [&] { Inner::barrier(); });
  }
  /// nccl_communicator's group_p2p: `ops` as one group (the executor's
  /// grouped path). On the host each operation is posted in order (sends
  /// are buffered), then every one waited for. Throws config_error for an
  /// operation that is neither send nor recv or of a type the host does
  /// not move; what Inner's operations throw.
  void group_p2p(std::span<const p2p_op> ops) {
    record(
        [&] {
          launch l;
          l.k = op_kind::send;
          l.grouped = true;
          l.ops.assign(ops.begin(), ops.end());
          l.calls = nccl_translate::group_p2p(ops);
          return l;
        },
        [&] {
          std::vector<request> reqs;
          reqs.reserve(ops.size());
          for (const p2p_op& o : ops) reqs.push_back(post(o));
          for (request& r : reqs) r.wait();
        });
  }
  /// Inner's split, recorded; the new group records into the same log.
  recording split(int color, int key) {
    const std::uint64_t child = child_id(id_, splits_++, color);
    Inner sub = record(
        [&] {
          launch l;
          l.k = op_kind::split;
          l.n = 2;
          l.dt = dtype::i64;
          l.param = str("color ", color, ", key ", key);
          return l;
        },
        [&] { return Inner::split(color, key); });
    return recording(std::move(sub), log_, child);
  }

 private:
  using request =
      decltype(std::declval<Inner&>().isend(static_cast<const float*>(nullptr), 0, 0, 0));

  recording(Inner&& c, std::shared_ptr<rank_log> log, std::uint64_t id)
      : Inner(std::move(c)), log_(std::move(log)), id_(id) {
    Inner::set_journal(true);
    seen_ = Inner::journal().size();
    log_->enroll(id_, static_cast<member*>(this), Inner::rank(), Inner::size());
  }

  comm_stats counters() const override { return Inner::stats(); }
  std::size_t unrecorded() const override { return Inner::journal().size() - seen_; }
  void skip_journal() override { seen_ = Inner::journal().size(); }

  static launch reduction(op_kind k, std::size_t n, dtype dt, reduce_op op, const void* send,
                          void* recv) {
    launch l;
    l.k = k;
    l.n = n;
    l.dt = dt;
    l.op = op;
    l.calls = k == op_kind::all_reduce ? nccl_translate::all_reduce(recv, n, dt, op)
                                       : nccl_translate::reduce_scatter(send, recv, n, dt, op);
    return l;
  }
  static launch gather(std::size_t chunk, dtype dt, const void* send, void* recv) {
    launch l;
    l.k = op_kind::all_gather;
    l.n = chunk;
    l.dt = dt;
    l.calls = nccl_translate::all_gather(send, recv, chunk, dt);
    return l;
  }
  static launch bcast(std::size_t n, dtype dt, int root, void* buf) {
    launch l;
    l.k = op_kind::broadcast;
    l.n = n;
    l.dt = dt;
    l.peer = root;
    l.calls = nccl_translate::broadcast(buf, n, dt, root);
    return l;
  }
  static launch p2p(op_kind k, std::size_t n, dtype dt, int peer, int tag, const void* buf) {
    launch l;
    l.k = k;
    l.n = n;
    l.dt = dt;
    l.peer = peer;
    l.tag = tag;
    l.calls = k == op_kind::send ? nccl_translate::send(buf, n, dt, peer)
                                 : nccl_translate::recv(const_cast<void*>(buf), n, dt, peer);
    return l;
  }
  static launch widen(launch l) {
    l.widened = true;
    return l;
  }
  static std::vector<float> wide(const tessera::bf16* p, std::size_t n) {
    std::vector<float> w(n);
    for (std::size_t i = 0; i < n; ++i) w[i] = tessera::to<float>(p[i]);
    return w;
  }
  static void narrow(tessera::bf16* p, const std::vector<float>& w) {
    for (std::size_t i = 0; i < w.size(); ++i) p[i] = tessera::to<tessera::bf16>(w[i]);
  }
  launch barrier_launch() {
    launch l;
    l.k = op_kind::barrier;
    l.calls = nccl_translate::barrier(&barrier_word_);
    return l;
  }

  // The journal entries issued since the last recorded operation (none
  // unless something bypassed the recorder) go to the log's stray list.
  void note_stray() {
    const auto& j = Inner::journal();
    for (std::size_t i = seen_; i < j.size(); ++i)
      log_->stray.emplace_back(id_, str(to_string(j[i].k), " (n=", j[i].n, " ", to_string(j[i].dt),
                                        ", ", j[i].param, ")"));
    seen_ = j.size();
  }
  // Records the launch `make()` around `forward()` (Inner's operation):
  // the journal entries it adds become the launch's host record.
  template <class Make, class Forward>
  decltype(auto) record(Make&& make, Forward&& forward) {
    if (!log_ || !log_->recording()) return forward();
    note_stray();
    launch l = make();
    l.group = id_;
    log_->launches.push_back(std::move(l));
    struct collect {
      recording* self;
      std::size_t at;
      ~collect() {
        const auto& j = self->Inner::journal();
        auto& host = self->log_->launches[at].host;
        host.assign(j.begin() + static_cast<std::ptrdiff_t>(self->seen_), j.end());
        self->seen_ = j.size();
      }
    } done{this, log_->launches.size() - 1};
    return forward();
  }
  // A group operation posted on Inner.
  request post(const p2p_op& o) {
    const bool send = o.kind == op_kind::send;
    TESSERA_THROW_IF(!send && o.kind != op_kind::recv, tessera::config_error,
                     "group_p2p takes send and recv operations, not ", to_string(o.kind));
    switch (o.dt) {
      case dtype::f32:
        return post_as(o, send, static_cast<float*>(o.buf));
      case dtype::f64:
        return post_as(o, send, static_cast<double*>(o.buf));
      case dtype::i32:
        return post_as(o, send, static_cast<std::int32_t*>(o.buf));
      case dtype::i64:
        return post_as(o, send, static_cast<std::int64_t*>(o.buf));
      case dtype::u64:
        return post_as(o, send, static_cast<std::uint64_t*>(o.buf));
      default:
        break;
    }
    throw tessera::config_error(
        str("group_p2p: the host communicators do not move ", to_string(o.dt)));
  }

  template <class T>
  request post_as(const p2p_op& o, bool send, T* p) {
    return send ? Inner::isend(static_cast<const T*>(p), o.n, o.peer, o.tag)
                : Inner::irecv(p, o.n, o.peer, o.tag);
  }

  std::shared_ptr<rank_log> log_;
  std::uint64_t id_ = world_id;
  std::size_t seen_ = 0;  // journal entries accounted for (recorded or stray)
  std::uint64_t splits_ = 0;
  std::int32_t barrier_word_ = 0;  // barrier's "device word" (never read)
};

}  // namespace nccl_recording
