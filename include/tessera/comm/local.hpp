#pragma once
/// \file local.hpp
/// `local_communicator`: ranks are threads of one process (DESIGN.md, "Key
/// types"). `local_world::run(N, fn)` runs fn on N threads, one rank each,
/// which is how a test runs four ranks in one line:
///
///     tessera::comm::local_world::run(4, [](tessera::comm::local_communicator& c) {
///       std::vector<float> g(1001, float(c.rank()));
///       c.all_reduce(g.data(), g.size(), tessera::comm::reduce_op::sum);
///     });
///
/// The collectives are the real ring algorithm (seeds/004, "ring all-reduce")
/// over per-pair FIFO channels: all_reduce is a reduce-scatter then an
/// all-gather over N chunks (`ring_chunk`), so the bytes counted are the bytes
/// really moved and the reduction order is fixed: chunk c is accumulated as
/// ((x[c+1] + x[c+2]) + ...) + x[c] (ranks mod N, each addition `received +
/// own`), the same on every rank and every run, bit for bit. reduce_scatter
/// uses the same order, so its chunk r equals all_reduce's chunk r bit for bit.
///
/// Failure: each wait for a message fails with comm_error after `timeout`
/// without progress, or at once when the peer's thread has exited or failed
/// or the peer broke this communicator with an error of its own. Messages
/// carry (sequence number, operation, count, dtype) and a receiver that gets
/// another collective's message throws at once: ranks that issue different
/// collectives fail instead of exchanging wrong data. Nothing hangs.
///
/// Threading: a local_communicator is used by one thread (its rank's) at a
/// time. Asynchronous operations run, in issue order, on one helper thread
/// per communicator; a blocking operation issued while asynchronous ones are
/// pending runs after them.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/communicator_base.hpp"
#include "tessera/comm/detail/collective_log.hpp"

namespace tessera::comm {

namespace detail {

/// What travels on a channel: a header the receiver checks, and the payload.
struct local_msg {
  bool collective = true;
  int tag = 0;
  std::uint64_t seq = 0;
  op_kind op = op_kind::barrier;
  dtype dt = dtype::none;
  std::uint64_t count = 0;
  std::vector<std::byte> payload;
};

enum class thread_state : std::uint8_t { alive, exited, failed };

/// A receive posted before its message arrived; the sender completes it.
struct local_posted {
  int tag = 0;
  dtype dt = dtype::none;
  std::size_t n = 0, elem = 0;
  void* buf = nullptr;
  bool done = false;
  std::string err;  // set instead of copying when the message does not match
};

/// State shared by a world and every sub-world split from it (one mutex).
struct local_fabric {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<thread_state> state;  // per world rank
  std::vector<std::string> why;     // per world rank: the error that ended it
};

/// One group of ranks (a world or a split of one).
struct local_group {
  std::shared_ptr<local_fabric> fab;
  std::vector<int> members;  // world rank of each group rank
  int n = 0;
  std::vector<std::deque<local_msg>> box;  // box[src * n + dst], FIFO
  struct progress {
    std::uint64_t entered = 0;  // collectives started (= last seq + 1)
    std::string last;           // description of the last one started
    std::string broken;         // first error this rank hit on this group
  };
  std::vector<progress> prog;
  std::vector<std::deque<std::shared_ptr<local_posted>>> posted;  // [src * n + dst]
  struct pending_split {
    std::shared_ptr<local_group> group;
    int remaining = 0;
  };
  std::map<std::pair<std::uint64_t, std::int64_t>, pending_split> splits;

  local_group(std::shared_ptr<local_fabric> f, std::vector<int> m)
      : fab(std::move(f)),
        members(std::move(m)),
        n(static_cast<int>(members.size())),
        box(static_cast<std::size_t>(n) * static_cast<std::size_t>(n)),
        prog(static_cast<std::size_t>(n)),
        posted(box.size()) {}
};

/// Completion state of an asynchronous local operation.
struct local_async_state {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr err;
};

template <class T>
inline T load_elem(const std::byte* p, std::size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <class T>
inline void reduce_elems(T* out, const std::byte* in, const T* own, std::size_t n, reduce_op op) {
  if (op == reduce_op::sum) {
    for (std::size_t i = 0; i < n; ++i) out[i] = load_elem<T>(in, i) + own[i];
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const T a = load_elem<T>(in, i), b = own[i];
      out[i] = a < b ? b : a;
    }
  }
}

}  // namespace detail

/// Handle of an asynchronous `local_communicator` operation (`comm_request`).
/// wait() rethrows the operation's error; test() never blocks. Dropping a
/// handle without waiting is allowed: the operation still runs (a dropped
/// irecv still writes its buffer when the message comes). A handle must not
/// outlive its communicator.
class local_request {
 public:
  local_request() = default;
  explicit local_request(std::shared_ptr<detail::local_async_state> s) : s_(std::move(s)) {}
  local_request(std::function<void()> wait_fn, std::function<bool()> test_fn)
      : wait_fn_(std::move(wait_fn)), test_fn_(std::move(test_fn)) {}
  /// Blocks until the operation finished; throws its comm_error, if any.
  void wait() {
    if (wait_fn_) return wait_fn_();
    if (!s_) return;
    std::unique_lock lk(s_->m);
    s_->cv.wait(lk, [&] { return s_->done; });
    if (s_->err) std::rethrow_exception(s_->err);
  }
  /// True once the operation finished (successfully or not).
  [[nodiscard]] bool test() {
    if (test_fn_) return test_fn_();
    if (!s_) return true;
    std::lock_guard lk(s_->m);
    return s_->done;
  }

 private:
  std::shared_ptr<detail::local_async_state> s_;
  std::function<void()> wait_fn_;
  std::function<bool()> test_fn_;
};

class local_world;

/// One rank of a `local_world` (or of a group split from it): models
/// `communicator`. Move-only; use from one thread at a time.
class local_communicator : public communicator_base<local_communicator> {
 public:
  local_communicator(local_communicator&&) noexcept = default;
  local_communicator& operator=(local_communicator&&) noexcept = default;
  ~local_communicator() = default;

  /// This rank, in [0, size()).
  [[nodiscard]] int rank() const { return e_->rank; }
  /// Number of ranks in the group.
  [[nodiscard]] int size() const { return e_->g->n; }
  /// In-place all-reduce of buf[0, n) over the group with `op`. Sends
  /// `ring_all_reduce_bytes(n, sizeof(T), N, rank)` bytes; any n >= 0.
  /// Result identical on all ranks and runs (order in the file comment).
  /// Throws comm_error on timeout, a dead peer or mismatched collectives.
  template <comm_element T>
  local_request iall_reduce(T* buf, std::size_t n, reduce_op op) {
    auto c = issue(op_kind::all_reduce, n, dtype_of<T>(), to_string(op));
    return submit(c, [e = e_.get(), buf, n, op, c] { e->ring_all_reduce(buf, n, op, c); });
  }

  /// recv[0, chunk) = op over ranks of send[rank*chunk, (rank+1)*chunk);
  /// send holds size()*chunk elements and is not modified. recv may alias
  /// send + rank*chunk (in place); no other overlap. Sends (N-1)*chunk
  /// elements. Callers pad to equal chunks (`padded_count`).
  template <comm_element T>
  local_request ireduce_scatter(const T* send, T* recv, std::size_t chunk, reduce_op op) {
    auto c = issue(op_kind::reduce_scatter, chunk, dtype_of<T>(), to_string(op));
    return submit(c, [e = e_.get(), send, recv, chunk, op, c] {
      e->ring_reduce_scatter(send, recv, chunk, op, c);
    });
  }

  /// recv[r*chunk, (r+1)*chunk) = send of rank r, for every r; recv holds
  /// size()*chunk elements. send may be recv + rank*chunk (in place). Sends
  /// (N-1)*chunk elements.
  template <comm_element T>
  local_request iall_gather(const T* send, T* recv, std::size_t chunk) {
    auto c = issue(op_kind::all_gather, chunk, dtype_of<T>(), {});
    return submit(
        c, [e = e_.get(), send, recv, chunk, c] { e->ring_all_gather(send, recv, chunk, c); });
  }

  /// Copies root's buf[0, n) into every rank's buf (chain root -> root+1 ->
  /// ...). Sends n*sizeof(T) bytes unless this rank is last in the chain.
  /// Precondition: 0 <= root < size().
  template <comm_element T>
  local_request ibroadcast(T* buf, std::size_t n, int root) {
    check_peer(root, "broadcast root");
    auto c = issue(op_kind::broadcast, n, dtype_of<T>(), detail::str("root ", root));
    return submit(c, [e = e_.get(), buf, n, root, c] { e->chain_broadcast(buf, n, root, c); });
  }

  /// Sends buf[0, n) to `peer` with `tag`. Buffered: copies and returns at
  /// once (never waits, never times out), whatever collectives are pending.
  /// Sends n*sizeof(T) bytes. Messages between two ranks with the same tag
  /// arrive in order (MPI's non-overtaking rule).
  template <comm_element T>
  local_request isend(const T* buf, std::size_t n, int peer, int tag) {
    check_peer(peer, "send peer");
    auto c = issue_p2p(op_kind::send, n, dtype_of<T>(), peer, tag);
    e_->post(peer, c, buf, n);
    return local_request();
  }
  /// Receives n elements from `peer` with `tag` into buf. Sends nothing.
  /// Throws comm_error if the message has another count or dtype, after
  /// `timeout` without it, or at once if the peer is gone. Posted at once
  /// (not queued behind pending collectives); wait() applies the timeout
  /// from the moment it is called.
  template <comm_element T>
  local_request irecv(T* buf, std::size_t n, int peer, int tag) {
    check_peer(peer, "recv peer");
    auto c = issue_p2p(op_kind::recv, n, dtype_of<T>(), peer, tag);
    auto p = std::make_shared<detail::local_posted>();
    *p = {tag, dtype_of<T>(), n, sizeof(T), buf, false, {}};
    e_->post_recv(peer, p);
    endpoint* e = e_.get();
    return local_request([e, p, peer, c] { e->wait_posted(p, peer, c); },
                         [e, p] {
                           std::lock_guard lk(e->g->fab->mu);
                           return p->done;
                         });
  }

  /// Completes once every rank entered the barrier (dissemination,
  /// ceil(log2 N) rounds of empty messages; sends 0 bytes).
  local_request ibarrier() {
    auto c = issue(op_kind::barrier, 0, dtype::none, {});
    return submit(c, [e = e_.get(), c] { e->dissemination_barrier(c); });
  }

  /// Collective: ranks with the same `color` (>= 0) form a new communicator,
  /// ranked by (key, rank). Sends the all-gather of 2 int64 per rank.
  /// The new communicator inherits timeout and debug settings.
  local_communicator split(int color, int key) {
    TESSERA_THROW_IF(color < 0, config_error, e_->who(), ": split color ", color, " must be >= 0");
    auto c = issue(op_kind::split, 2, dtype::i64, detail::str("color ", color, ", key ", key));
    std::shared_ptr<detail::local_group> sub;
    int sub_rank = 0;
    inline_scope is_{e_.get()};
    submit(c, [&, c] { std::tie(sub, sub_rank) = e_->split(color, key, c); }).wait();
    local_communicator out(std::move(sub), sub_rank, e_->opt, false);
    return out;
  }

  /// Debug mode (set_debug(true) on every rank): a collective that
  /// all-gathers every rank's (count, hash) of the collectives issued and
  /// throws comm_error naming the first collective (sequence number and
  /// each rank's description) where ranks diverged. Throws config_error if
  /// debug mode is off.
  void verify_collective_hash() {
    e_->log.verify(rank(), size(), [this](const std::uint64_t* s, std::uint64_t* r, std::size_t w) {
      all_gather(s, r, w);
    });
  }

  /// The world ranks of this group's members, by group rank.
  [[nodiscard]] const std::vector<int>& world_ranks() const { return e_->g->members; }

 private:
  friend class local_world;

  struct endpoint : detail::rank_core {
    std::shared_ptr<detail::local_group> g;
    int rank = 0;
    bool owns_thread = false;  // the world communicator marks its thread's exit
    std::string broken;        // guarded by g->fab->mu

    // the helper thread for asynchronous operations
    std::mutex qm;
    std::condition_variable qcv;
    std::deque<std::function<void()>> queue;
    std::atomic<int> inflight{0};
    bool inline_next = false;  // the op being issued is blocking: run it here if idle
    bool stop = false;
    std::thread worker;

    ~endpoint() {
      if (worker.joinable()) {
        {
          std::lock_guard lk(qm);
          stop = true;
        }
        qcv.notify_all();
        worker.join();
      }
      if (owns_thread) {
        std::lock_guard lk(g->fab->mu);
        auto& st =
            g->fab->state[static_cast<std::size_t>(g->members[static_cast<std::size_t>(rank)])];
        if (st == detail::thread_state::alive) st = detail::thread_state::exited;
        g->fab->cv.notify_all();
      }
    }

    [[nodiscard]] std::string who() const {
      std::string s = detail::str("rank ", rank, " of ", g->n);
      const int wr = g->members[static_cast<std::size_t>(rank)];
      if (wr != rank || g->n != static_cast<int>(g->fab->state.size()))
        s += detail::str(" (world rank ", wr, ")");
      return s;
    }
    [[nodiscard]] static std::string what(const detail::op_ctx& c) { return detail::describe(c); }
    [[nodiscard]] int mod(int x) const { return ((x % g->n) + g->n) % g->n; }

    /// Records that this rank broke the group (peers then fail fast).
    void fail(const std::string& msg) {
      std::lock_guard lk(g->fab->mu);
      auto& p = g->prog[static_cast<std::size_t>(rank)];
      if (p.broken.empty()) p.broken = msg;
      if (broken.empty()) broken = msg;
      g->fab->cv.notify_all();
    }

    template <class T>
    void post(int dst, const detail::op_ctx& c, const T* data, std::size_t count) {
      if (!c.collective) {
        // A matching posted receive takes the data directly; else the
        // message is queued under the same lock, so a receive posted
        // meanwhile (post_recv looks in the queue) cannot miss it.
        std::lock_guard lk(g->fab->mu);
        auto& pq = g->posted[static_cast<std::size_t>(rank * g->n + dst)];
        for (auto it = pq.begin(); it != pq.end(); ++it) {
          auto& p = **it;
          if (p.tag != c.tag) continue;
          if (p.n != count || p.dt != c.dt)
            p.err = detail::str("rank ", rank, " sent n=", count, " ", to_string(c.dt),
                                " with tag ", c.tag, ", expected n=", p.n, " ", to_string(p.dt));
          else if (count)
            std::memcpy(p.buf, data, count * sizeof(T));
          p.done = true;
          pq.erase(it);
          counters.add(c.k, 0, count * sizeof(T));
          g->fab->cv.notify_all();
          return;
        }
        detail::local_msg m{c.collective, c.tag, c.seq, c.k, c.dt, c.n, {}};
        m.payload.resize(count * sizeof(T));
        if (count) std::memcpy(m.payload.data(), data, count * sizeof(T));
        counters.add(c.k, 0, count * sizeof(T));
        g->box[static_cast<std::size_t>(rank * g->n + dst)].push_back(std::move(m));
        g->fab->cv.notify_all();
        return;
      }
      detail::local_msg m{c.collective, c.tag, c.seq, c.k, c.dt, c.n, {}};
      m.payload.resize(count * sizeof(T));
      if (count) std::memcpy(m.payload.data(), data, count * sizeof(T));
      counters.add(c.k, 0, count * sizeof(T));
      std::lock_guard lk(g->fab->mu);
      g->box[static_cast<std::size_t>(rank * g->n + dst)].push_back(std::move(m));
      g->fab->cv.notify_all();
    }
    void post_empty(int dst, const detail::op_ctx& c) { post<std::byte>(dst, c, nullptr, 0); }

    /// Ranks of the group not yet in collective c.seq, with what they did
    /// last (caller holds the lock).
    [[nodiscard]] std::string missing(const detail::op_ctx& c) const {
      std::string s;
      for (int q = 0; q < g->n; ++q) {
        const auto& p = g->prog[static_cast<std::size_t>(q)];
        if (q == rank || p.entered > c.seq) continue;
        s += detail::str(s.empty() ? "" : "; ", "rank ", q, " (",
                         p.entered ? "last entered " + p.last : "entered no collective yet",
                         state_of(q), ")");
      }
      return s.empty() ? std::string("none (all ranks entered it)") : s;
    }
    [[nodiscard]] std::string state_of(int q) const {
      const auto wr = static_cast<std::size_t>(g->members[static_cast<std::size_t>(q)]);
      switch (g->fab->state[wr]) {
        case detail::thread_state::exited:
          return ", its thread has exited";
        case detail::thread_state::failed:
          return ", its thread failed: " + g->fab->why[wr];
        default:
          return "";
      }
    }

    /// Waits for the next message from `src` in c's lane (collective, or
    /// p2p with c.tag) and checks its header.
    detail::local_msg take(int src, const detail::op_ctx& c) {
      std::unique_lock lk(g->fab->mu);
      auto& q = g->box[static_cast<std::size_t>(src * g->n + rank)];
      const auto deadline = std::chrono::steady_clock::now() + c.timeout;
      for (;;) {
        for (auto it = q.begin(); it != q.end(); ++it) {
          if (it->collective != c.collective || (!c.collective && it->tag != c.tag)) continue;
          detail::local_msg m = std::move(*it);
          q.erase(it);
          if (c.collective && (m.seq != c.seq || m.op != c.k || m.count != c.n || m.dt != c.dt))
            throw comm_error(detail::str(
                who(), ": ", what(c), ": received from rank ", src, " a message of ",
                detail::describe_op(m.op, m.seq, m.count, m.dt),
                ": the ranks issued different collectives (turn on set_debug(true) and call "
                "verify_collective_hash() to find where they diverged)"));
          if (!c.collective && (m.count != c.n || m.dt != c.dt))
            throw comm_error(detail::str(who(), ": ", what(c), ": rank ", src, " sent n=", m.count,
                                         " ", to_string(m.dt), " with tag ", c.tag,
                                         ", expected n=", c.n, " ", to_string(c.dt)));
          return m;
        }
        const auto& peer = g->prog[static_cast<std::size_t>(src)];
        const auto wr = static_cast<std::size_t>(g->members[static_cast<std::size_t>(src)]);
        const auto st = g->fab->state[wr];
        std::string gone;
        if (st == detail::thread_state::exited) gone = "its thread has exited";
        if (st == detail::thread_state::failed) gone = "its thread failed: " + g->fab->why[wr];
        if (!peer.broken.empty()) gone = "it failed in this communicator: " + peer.broken;
        if (!gone.empty())
          throw comm_error(detail::str(who(), ": ", what(c), ": peer rank ", src,
                                       " will not send: ", gone.substr(0, 400),
                                       c.collective ? "; ranks missing from it: " : "",
                                       c.collective ? missing(c) : std::string()));
        if (std::chrono::steady_clock::now() >= deadline)
          throw comm_error(detail::str(
              who(), ": ", what(c), " timed out after ", c.timeout.count(), " ms waiting for rank ",
              src, c.collective ? "; ranks missing from it: " : "",
              c.collective ? missing(c) : std::string(),
              c.collective ? std::string() : detail::str("; rank ", src, state_of(src))));
        g->fab->cv.wait_until(lk, deadline);
      }
    }
    /// Completes p from a message already queued, or posts it for the sender.
    void post_recv(int src, const std::shared_ptr<detail::local_posted>& p) {
      std::lock_guard lk(g->fab->mu);
      auto& q = g->box[static_cast<std::size_t>(src * g->n + rank)];
      for (auto it = q.begin(); it != q.end(); ++it) {
        if (it->collective || it->tag != p->tag) continue;
        if (it->count != p->n || it->dt != p->dt)
          p->err = detail::str("rank ", src, " sent n=", it->count, " ", to_string(it->dt),
                               " with tag ", p->tag, ", expected n=", p->n, " ", to_string(p->dt));
        else if (p->n)
          std::memcpy(p->buf, it->payload.data(), p->n * p->elem);
        p->done = true;
        q.erase(it);
        return;
      }
      g->posted[static_cast<std::size_t>(src * g->n + rank)].push_back(p);
    }
    /// Waits for a posted receive: timeout from now, fail fast on a dead peer.
    void wait_posted(const std::shared_ptr<detail::local_posted>& p, int src,
                     const detail::op_ctx& c) {
      std::string msg;
      {
        std::unique_lock lk(g->fab->mu);
        const auto deadline = std::chrono::steady_clock::now() + c.timeout;
        for (;;) {
          if (p->done) {
            if (p->err.empty()) return;
            msg = p->err.rfind(who(), 0) == 0 ? p->err
                                              : detail::str(who(), ": ", what(c), ": ", p->err);
            break;
          }
          const auto wr = static_cast<std::size_t>(g->members[static_cast<std::size_t>(src)]);
          std::string gone;
          if (g->fab->state[wr] != detail::thread_state::alive) gone = state_of(src).substr(2);
          if (!g->prog[static_cast<std::size_t>(src)].broken.empty())
            gone =
                "it failed in this communicator: " + g->prog[static_cast<std::size_t>(src)].broken;
          if (!gone.empty())
            msg = detail::str(who(), ": ", what(c), ": peer rank ", src,
                              " will not send: ", gone.substr(0, 400));
          else if (std::chrono::steady_clock::now() >= deadline)
            msg = detail::str(who(), ": ", what(c), " timed out after ", c.timeout.count(),
                              " ms waiting for rank ", src);
          if (!msg.empty()) {
            auto& pq = g->posted[static_cast<std::size_t>(src * g->n + rank)];
            pq.erase(std::remove(pq.begin(), pq.end(), p), pq.end());
            p->done = true;
            p->err = msg;
            break;
          }
          g->fab->cv.wait_until(lk, deadline);
        }
      }
      fail(msg);
      throw comm_error(msg);
    }
    void expect_bytes(const detail::local_msg& m, std::size_t bytes_expected, int src,
                      const detail::op_ctx& c) const {
      TESSERA_THROW_IF(m.payload.size() != bytes_expected, comm_error, who(), ": ", what(c),
                       ": rank ", src, " sent ", m.payload.size(), " bytes, expected ",
                       bytes_expected);
    }

    template <class T>
    void ring_all_reduce(T* buf, std::size_t n, reduce_op op, const detail::op_ctx& c) {
      const int N = g->n, r = rank;
      if (N == 1) return;
      const int right = mod(r + 1), left = mod(r - 1);
      for (int s = 0; s < N - 1; ++s) {  // reduce-scatter: rank r ends owning chunk r
        const auto out = ring_chunk(n, N, mod(r - s - 1)), in = ring_chunk(n, N, mod(r - s - 2));
        post(right, c, buf + out.offset, out.count);
        auto m = take(left, c);
        expect_bytes(m, in.count * sizeof(T), left, c);
        detail::reduce_elems(buf + in.offset, m.payload.data(), buf + in.offset, in.count, op);
      }
      for (int s = 0; s < N - 1; ++s) {  // all-gather of the finished chunks
        const auto out = ring_chunk(n, N, mod(r - s)), in = ring_chunk(n, N, mod(r - s - 1));
        post(right, c, buf + out.offset, out.count);
        auto m = take(left, c);
        expect_bytes(m, in.count * sizeof(T), left, c);
        if (in.count) std::memcpy(buf + in.offset, m.payload.data(), in.count * sizeof(T));
      }
    }

    template <class T>
    void ring_reduce_scatter(const T* send, T* recv, std::size_t chunk, reduce_op op,
                             const detail::op_ctx& c) {
      const int N = g->n, r = rank;
      if (N == 1) {
        if (send != recv && chunk) std::memmove(recv, send, chunk * sizeof(T));
        return;
      }
      const int right = mod(r + 1), left = mod(r - 1);
      std::vector<T> acc(chunk);
      for (int s = 0; s < N - 1; ++s) {
        const auto cout = static_cast<std::size_t>(mod(r - s - 1));
        const auto cin = static_cast<std::size_t>(mod(r - s - 2));
        post(right, c, s == 0 ? send + cout * chunk : acc.data(), chunk);
        auto m = take(left, c);
        expect_bytes(m, chunk * sizeof(T), left, c);
        T* out = s == N - 2 ? recv : acc.data();  // last step: cin == r
        detail::reduce_elems(out, m.payload.data(), send + cin * chunk, chunk, op);
      }
    }

    template <class T>
    void ring_all_gather(const T* send, T* recv, std::size_t chunk, const detail::op_ctx& c) {
      const int N = g->n, r = rank;
      T* mine = recv + static_cast<std::size_t>(r) * chunk;
      if (send != mine && chunk) std::memmove(mine, send, chunk * sizeof(T));
      const int right = mod(r + 1), left = mod(r - 1);
      for (int s = 0; s < N - 1; ++s) {
        const auto cout = static_cast<std::size_t>(mod(r - s));
        const auto cin = static_cast<std::size_t>(mod(r - s - 1));
        post(right, c, recv + cout * chunk, chunk);
        auto m = take(left, c);
        expect_bytes(m, chunk * sizeof(T), left, c);
        if (chunk) std::memcpy(recv + cin * chunk, m.payload.data(), chunk * sizeof(T));
      }
    }

    template <class T>
    void chain_broadcast(T* buf, std::size_t n, int root, const detail::op_ctx& c) {
      const int N = g->n, p = mod(rank - root);
      if (p > 0) {
        auto m = take(mod(rank - 1), c);
        expect_bytes(m, n * sizeof(T), mod(rank - 1), c);
        if (n) std::memcpy(buf, m.payload.data(), n * sizeof(T));
      }
      if (p < N - 1) post(mod(rank + 1), c, buf, n);
    }

    void dissemination_barrier(const detail::op_ctx& c) {
      for (int d = 1; d < g->n; d *= 2) {
        post_empty(mod(rank + d), c);
        take(mod(rank - d), c);
      }
    }

    std::pair<std::shared_ptr<detail::local_group>, int> split(int color, int key,
                                                               const detail::op_ctx& c) {
      const std::int64_t mine[2] = {color, key};
      std::vector<std::int64_t> all(2 * static_cast<std::size_t>(g->n));
      ring_all_gather(mine, all.data(), 2, c);
      std::vector<std::pair<std::int64_t, int>> sel;  // (key, rank) with my color
      for (int q = 0; q < g->n; ++q)
        if (all[2 * static_cast<std::size_t>(q)] == color)
          sel.emplace_back(all[2 * static_cast<std::size_t>(q) + 1], q);
      std::sort(sel.begin(), sel.end());
      int my_index = 0;
      std::vector<int> world;
      for (std::size_t i = 0; i < sel.size(); ++i) {
        if (sel[i].second == rank) my_index = static_cast<int>(i);
        world.push_back(g->members[static_cast<std::size_t>(sel[i].second)]);
      }
      std::lock_guard lk(g->fab->mu);
      auto& slot_ = g->splits[{c.seq, color}];
      if (!slot_.group) {
        slot_.group = std::make_shared<detail::local_group>(g->fab, world);
        slot_.remaining = static_cast<int>(world.size());
      }
      auto sub = slot_.group;
      if (--slot_.remaining == 0) g->splits.erase({c.seq, color});
      return {sub, my_index};
    }
  };

  local_communicator(std::shared_ptr<detail::local_group> g, int rank, comm_options opt,
                     bool owns_thread)
      : e_(std::make_unique<endpoint>()) {
    e_->g = std::move(g);
    e_->rank = rank;
    e_->owns_thread = owns_thread;
    e_->configure(opt);
  }

  friend class communicator_base<local_communicator>;
  detail::rank_core& core() { return *e_; }
  const detail::rank_core& core() const { return *e_; }
  std::string who() const { return e_->who(); }
  void throw_if_broken(const detail::op_ctx& c) const {
    std::string b;
    {
      std::lock_guard lk(e_->g->fab->mu);
      b = e_->broken;
    }
    TESSERA_THROW_IF(!b.empty(), comm_error, e_->who(), ": ", e_->what(c),
                     ": this communicator is broken by an earlier error: ", b.substr(0, 400));
  }
  detail::op_ctx issue(op_kind k, std::size_t n, dtype d, std::string extra) {
    // Bytes are counted as the helper thread sends them.
    detail::op_ctx c = e_->collective(k, n, d, std::move(extra), size(), 0);
    throw_if_broken(c);
    return c;
  }
  detail::op_ctx issue_p2p(op_kind k, std::size_t n, dtype d, int peer, int tag) {
    detail::op_ctx c = e_->p2p(k, n, d, peer, tag, 0);
    throw_if_broken(c);
    return c;
  }

  /// Runs fn on the helper thread after every operation issued before it.
  template <class Fn>
  local_request submit(const detail::op_ctx& c, Fn fn) {
    auto st = std::make_shared<detail::local_async_state>();
    endpoint* e = e_.get();
    auto task = [e, st, c, fn = std::move(fn)]() mutable {
      if (c.collective) {
        std::lock_guard lk(e->g->fab->mu);
        auto& p = e->g->prog[static_cast<std::size_t>(e->rank)];
        p.entered = c.seq + 1;
        p.last = e->what(c);
      }
      std::exception_ptr err;
      try {
        fn();
      } catch (const comm_error& ex) {
        e->fail(ex.what());
        err = std::current_exception();
      } catch (...) {
        err = std::current_exception();
      }
      {
        std::lock_guard lk(st->m);
        st->done = true;
        st->err = err;
      }
      st->cv.notify_all();
    };
    if (e->inline_next && e->inflight.load() == 0) {
      e->inline_next = false;
      task();
      return local_request(std::move(st));
    }
    e->inline_next = false;
    ++e->inflight;
    {
      std::lock_guard lk(e->qm);
      e->queue.emplace_back([e, task = std::move(task)]() mutable {
        task();
        --e->inflight;
      });
      if (!e->worker.joinable()) e->worker = std::thread([e] { worker_loop(e); });
    }
    e->qcv.notify_one();
    return local_request(std::move(st));
  }
  /// Marks the operation about to be issued as blocking: it runs on the
  /// calling thread when no asynchronous operation is pending.
  struct inline_scope {
    endpoint* e;
    explicit inline_scope(endpoint* ep) : e(ep) { e->inline_next = true; }
    ~inline_scope() { e->inline_next = false; }
  };
  /// communicator_base's blocking collectives hold one while they issue.
  inline_scope blocking_scope() { return inline_scope{e_.get()}; }

  static void worker_loop(endpoint* e) {
    for (;;) {
      std::function<void()> t;
      {
        std::unique_lock lk(e->qm);
        e->qcv.wait(lk, [&] { return e->stop || !e->queue.empty(); });
        if (e->queue.empty()) return;
        t = std::move(e->queue.front());
        e->queue.pop_front();
      }
      t();
    }
  }

  std::unique_ptr<endpoint> e_;
};

/// N ranks as threads of this process. Create one, hand rank r's
/// `communicator(r)` to thread r; or call `run`.
class local_world {
 public:
  /// A world of n >= 1 ranks with the given options for every rank.
  explicit local_world(int n, comm_options opt = {}) : opt_(opt) {
    TESSERA_THROW_IF(n < 1, config_error, "local_world: n=", n, " ranks, need n >= 1");
    auto fab = std::make_shared<detail::local_fabric>();
    fab->state.assign(static_cast<std::size_t>(n), detail::thread_state::alive);
    fab->why.assign(static_cast<std::size_t>(n), {});
    std::vector<int> members(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) members[static_cast<std::size_t>(r)] = r;
    g_ = std::make_shared<detail::local_group>(std::move(fab), std::move(members));
  }
  /// Number of ranks.
  [[nodiscard]] int size() const { return g_->n; }
  /// Rank r's communicator; take it once, on the thread that runs rank r.
  /// Destroying it marks rank r's thread as exited (peers waiting on it fail
  /// at once).
  local_communicator communicator(int r) {
    TESSERA_THROW_IF(r < 0 || r >= size(), config_error, "local_world: rank ", r, " is not in [0, ",
                     size(), ")");
    return local_communicator(g_, r, opt_, true);
  }
  /// Marks rank r's thread as failed with `why` (peers waiting on it throw
  /// comm_error quoting it).
  void mark_failed(int r, const std::string& why) {
    std::lock_guard lk(g_->fab->mu);
    g_->fab->state[static_cast<std::size_t>(r)] = detail::thread_state::failed;
    g_->fab->why[static_cast<std::size_t>(r)] = why.substr(0, 400);
    g_->fab->cv.notify_all();
  }

  /// Runs fn(local_communicator&) on n threads, one per rank, joins them and
  /// rethrows the first exception any rank threw (a rank's own exception is
  /// recorded before its peers can see it fail, so the root cause wins over
  /// the comm_errors it causes on other ranks, which are dropped). A rank
  /// that throws is marked failed; peers waiting on it fail at once.
  template <class Fn>
  static void run(int n, Fn&& fn, comm_options opt = {}) {
    local_world w(n, opt);
    std::mutex m;
    std::exception_ptr first;
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        // Record before marking the rank failed: a peer can only fail
        // because of this rank after that, so a root cause comes first.
        auto keep = [&] {
          std::lock_guard lk(m);
          if (!first) first = std::current_exception();
        };
        try {
          local_communicator c = w.communicator(r);
          try {
            fn(c);
          } catch (const std::exception& ex) {
            keep();
            w.mark_failed(r, ex.what());
          } catch (...) {
            keep();
            w.mark_failed(r, "unknown exception");
          }
        } catch (...) {
          keep();
        }
      });
    }
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
  }

 private:
  comm_options opt_;
  std::shared_ptr<detail::local_group> g_;
};

static_assert(check_communicator<local_communicator>());

}  // namespace tessera::comm
