#pragma once
/// \file communicator.hpp
/// The `communicator` concept, the reduction operators, the element types a
/// collective moves, the per-operation byte counters (`comm_stats`) and the
/// ring-algorithm traffic formulas every implementation counts with.
///
/// Traffic (bytes THIS rank sends; N = group size, n elements of `sizeof(T)`
/// bytes, chunk c of the ring holds `ring_chunk(n, N, c).count` elements:
/// the first n % N chunks one element more than the rest):
///
///   all_reduce(n)          ring reduce-scatter then all-gather: rank r sends
///                          every chunk but r, then every chunk but r+1:
///                          (2n - chunk(r) - chunk(r+1)) elements,
///                          = 2(N-1)/N n when N divides n (seeds/004, "ring
///                          all-reduce").
///   reduce_scatter(chunk)  (N-1) chunk elements.
///   all_gather(chunk)      (N-1) chunk elements.
///   broadcast(n, root)     chain root -> root+1 -> ...: n elements on every
///                          rank except the last of the chain (rank root-1).
///   send(n)                n elements; recv and barrier send no payload.
///
/// Sequence numbers: every collective on a communicator gets the next
/// collective sequence number (0, 1, 2, ...; the same on every rank when the
/// ranks issue the same collectives); send and recv are numbered apart, per
/// rank. Error messages name an operation as e.g. `all_reduce #12`.
///
/// Uneven sizes: all_reduce and broadcast take any n (including n < N and n
/// not divisible by N). reduce_scatter and all_gather move equal chunks; a
/// caller with numel not divisible by N pads to `padded_count(numel, N)`
/// (ZeRO's flat buffers do, DESIGN.md principle 4).

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/core/error.hpp"

namespace tessera::comm {

/// The reduction a collective applies element-wise. `sum` adds in a fixed,
/// documented order per implementation; `max` is exact (order-free). NaN in
/// `max` propagates as `std::max(a, b)` does on the host: not guaranteed.
enum class reduce_op { sum, max };

/// The operations a communicator counts and names in its errors.
enum class op_kind : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  send,
  recv,
  barrier,
  split,
};

/// The element types a communicator moves (`comm_element`; `bf16` and `f16` only on
/// nccl_communicator, comm/nccl.hpp).
enum class dtype : std::uint8_t { f32, f64, i32, i64, u64, none, bf16, f16 };

/// `comm_element<T>`: T is one of float, double, std::int32_t, std::int64_t,
/// std::uint64_t. (bf16 is planned; it needs an fp32 accumulation policy.)
template <class T>
concept comm_element =
    std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int32_t> ||
    std::same_as<T, std::int64_t> || std::same_as<T, std::uint64_t>;

/// The `dtype` tag of a `comm_element`.
template <comm_element T>
constexpr dtype dtype_of() {
  if constexpr (std::same_as<T, float>)
    return dtype::f32;
  else if constexpr (std::same_as<T, double>)
    return dtype::f64;
  else if constexpr (std::same_as<T, std::int32_t>)
    return dtype::i32;
  else if constexpr (std::same_as<T, std::int64_t>)
    return dtype::i64;
  else
    return dtype::u64;
}

/// Name of an operation, as error messages print it ("all_reduce").
constexpr const char* to_string(op_kind k) {
  switch (k) {
    case op_kind::all_reduce:
      return "all_reduce";
    case op_kind::reduce_scatter:
      return "reduce_scatter";
    case op_kind::all_gather:
      return "all_gather";
    case op_kind::broadcast:
      return "broadcast";
    case op_kind::send:
      return "send";
    case op_kind::recv:
      return "recv";
    case op_kind::barrier:
      return "barrier";
    case op_kind::split:
      return "split";
  }
  return "?";
}

/// Name of a dtype ("float", "int64").
constexpr const char* to_string(dtype d) {
  switch (d) {
    case dtype::f32:
      return "float";
    case dtype::f64:
      return "double";
    case dtype::i32:
      return "int32";
    case dtype::i64:
      return "int64";
    case dtype::u64:
      return "uint64";
    case dtype::bf16:
      return "bf16";
    case dtype::f16:
      return "fp16";
    case dtype::none:
      return "none";
  }
  return "?";
}

/// Name of a reduction ("sum", "max").
constexpr const char* to_string(reduce_op op) {
  return op == reduce_op::sum ? "sum" : "max";
}

/// Size in bytes of one element of `d` (0 for none).
constexpr std::size_t dtype_bytes(dtype d) {
  switch (d) {
    case dtype::bf16:
    case dtype::f16:
      return 2;
    case dtype::f32:
    case dtype::i32:
      return 4;
    case dtype::f64:
    case dtype::i64:
    case dtype::u64:
      return 8;
    case dtype::none:
      return 0;
  }
  return 0;
}

/// Calls and bytes sent by this rank for one kind of operation.
struct op_counter {
  std::uint64_t calls = 0;  ///< operations issued (blocking and asynchronous)
  std::uint64_t bytes = 0;  ///< payload bytes this rank sent for them
};

/// Per-operation traffic of one rank on one communicator (sub-communicators
/// count apart). `recv` counts calls only (a receive sends nothing).
struct comm_stats {
  op_counter all_reduce, reduce_scatter, all_gather, broadcast, send, recv, barrier;

  /// Sum of bytes over every operation.
  [[nodiscard]] constexpr std::uint64_t bytes_sent() const {
    return all_reduce.bytes + reduce_scatter.bytes + all_gather.bytes + broadcast.bytes +
           send.bytes + recv.bytes + barrier.bytes;
  }
  /// The counter of operation `k` (`split` is counted as a collective of the
  /// parent: its all-gather of (color, key) lands in `all_gather`).
  [[nodiscard]] constexpr op_counter& of(op_kind k) {
    switch (k) {
      case op_kind::all_reduce:
        return all_reduce;
      case op_kind::reduce_scatter:
        return reduce_scatter;
      case op_kind::broadcast:
        return broadcast;
      case op_kind::send:
        return send;
      case op_kind::recv:
        return recv;
      case op_kind::barrier:
        return barrier;
      case op_kind::all_gather:
      case op_kind::split:
        break;
    }
    return all_gather;
  }
};

/// Offset and length (in elements) of chunk `c` when n elements are cut into
/// N ring chunks: the first n % N chunks get n / N + 1 elements, the rest
/// n / N. Precondition: N >= 1, 0 <= c < N.
struct chunk_range {
  std::size_t offset = 0;
  std::size_t count = 0;
};
constexpr chunk_range ring_chunk(std::size_t n, int N, int c) {
  const std::size_t q = n / static_cast<std::size_t>(N), rem = n % static_cast<std::size_t>(N);
  const auto uc = static_cast<std::size_t>(c);
  return {uc * q + (uc < rem ? uc : rem), q + (uc < rem ? 1 : 0)};
}

/// Smallest multiple of N that is >= n (ZeRO pads flat buffers to it so that
/// reduce_scatter / all_gather chunks are equal). Precondition: N >= 1.
constexpr std::size_t padded_count(std::size_t n, int N) {
  const auto uN = static_cast<std::size_t>(N);
  return (n + uN - 1) / uN * uN;
}

/// Bytes rank r of N sends in a ring all-reduce of n elements of `elem` bytes:
/// (2n - chunk(r) - chunk(r+1)) * elem; 0 when N == 1.
constexpr std::uint64_t ring_all_reduce_bytes(std::size_t n, std::size_t elem, int N, int r) {
  if (N <= 1) return 0;
  const std::size_t own = ring_chunk(n, N, r).count, next = ring_chunk(n, N, (r + 1) % N).count;
  return static_cast<std::uint64_t>((2 * n - own - next) * elem);
}

/// Bytes one rank sends in a ring reduce-scatter or all-gather of `chunk`
/// elements per rank: (N-1) * chunk * elem.
constexpr std::uint64_t ring_scatter_gather_bytes(std::size_t chunk, std::size_t elem, int N) {
  return static_cast<std::uint64_t>(N - 1) * chunk * elem;
}

/// Bytes rank r sends in a chain broadcast of n elements from `root`: n * elem
/// unless r is the last of the chain ((root - 1) mod N) or N == 1.
constexpr std::uint64_t chain_broadcast_bytes(std::size_t n, std::size_t elem, int N, int r,
                                              int root) {
  if (N <= 1 || r == (root + N - 1) % N) return 0;
  return static_cast<std::uint64_t>(n * elem);
}

/// Per-communicator settings. Every rank should use the same values.
struct comm_options {
  /// An operation that waits this long without progress throws comm_error
  /// naming the rank, the operation, its sequence number, the element count,
  /// the bytes and the peers it waits for.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// Debug mode: record a rolling hash and the last `history` descriptions of
  /// the collectives issued, for `verify_collective_hash()`.
  bool debug = false;
  /// Number of collective descriptions kept per rank in debug mode.
  std::size_t history = 64;
  /// Journal: keep every operation issued, collective and point-to-point,
  /// in issue order (`journal()` of communicator_base; unbounded, for tests
  /// that hold one transport's sequence against another's,
  /// tests/comm/nccl_recording.hpp). Inherited by split.
  bool journal = false;
};

/// A handle to an asynchronous operation. `wait()` blocks until the
/// operation finishes and rethrows its error (comm_error on timeout or a
/// dead peer); the buffers passed to the operation must stay alive and
/// untouched until wait() returns. `test()` returns true once it finished
/// (successfully or not) without blocking; call wait() to learn which.
template <class R>
concept comm_request = std::movable<R> && requires(R& r) {
  r.wait();
  { r.test() } -> std::same_as<bool>;
};

/// One operation of a group of point-to-point operations issued together
/// (`group_p2p` of a communicator that has one, nccl_communicator's): a
/// send of `n` elements of `dt` at `buf` to `peer`, or a receive of them
/// from `peer` into `buf`. `tag` names the message in errors (NCCL matches
/// in order, not by tag). The buffer must stay alive until the group
/// completes; a send's is only read.
struct p2p_op {
  op_kind kind = op_kind::send;  ///< send or recv
  void* buf = nullptr;           ///< n elements of dt (in the communicator's buffer space)
  std::size_t n = 0;             ///< elements
  dtype dt = dtype::f32;         ///< element type
  int peer = 0;                  ///< the rank sent to or received from
  int tag = 0;                   ///< for error messages

  /// A send of p[0, n) to `peer`.
  static p2p_op send(const void* p, std::size_t n, dtype dt, int peer, int tag) {
    return {op_kind::send, const_cast<void*>(p), n, dt, peer, tag};
  }
  /// A receive of n elements from `peer` into p.
  static p2p_op recv(void* p, std::size_t n, dtype dt, int peer, int tag) {
    return {op_kind::recv, p, n, dt, peer, tag};
  }
};

/// Part of `communicator`: identity, counters, settings.
template <class C>
concept communicator_basics = requires(C& c, const C& cc, std::chrono::milliseconds ms) {
  { cc.rank() } -> std::same_as<int>;
  { cc.size() } -> std::same_as<int>;
  { cc.stats() } -> std::convertible_to<comm_stats>;
  { cc.bytes_sent() } -> std::same_as<std::uint64_t>;
  c.reset_stats();
  c.set_timeout(ms);
  { cc.timeout() } -> std::same_as<std::chrono::milliseconds>;
  c.set_debug(true);
  c.verify_collective_hash();
};

/// Part of `communicator`: the blocking operations, for element type T.
template <class C, class T>
concept communicator_blocking_ops = requires(C& c, T* p, const T* cp, std::size_t n, int peer,
                                             int tag, reduce_op op) {
  c.all_reduce(p, n, op);
  c.reduce_scatter(cp, p, n, op);
  c.all_gather(cp, p, n);
  c.broadcast(p, n, peer);
  c.send(cp, n, peer, tag);
  c.recv(p, n, peer, tag);
};

/// Part of `communicator`: the asynchronous operations, for element type T.
template <class C, class T>
concept communicator_async_ops = requires(C& c, T* p, const T* cp, std::size_t n, int peer, int tag,
                                          reduce_op op) {
  { c.iall_reduce(p, n, op) } -> comm_request;
  { c.ireduce_scatter(cp, p, n, op) } -> comm_request;
  { c.iall_gather(cp, p, n) } -> comm_request;
  { c.ibroadcast(p, n, peer) } -> comm_request;
  { c.isend(cp, n, peer, tag) } -> comm_request;
  { c.irecv(p, n, peer, tag) } -> comm_request;
};

/// A communicator: a group of `size()` ranks that run the collectives
/// all_reduce, reduce_scatter, all_gather, broadcast, barrier, point-to-point
/// send/recv, each with an asynchronous `i`-form returning a `comm_request`,
/// for float, double and int64 at least; counts the bytes it sends
/// (`comm_stats`, ring formulas above); times out with comm_error; splits
/// into sub-communicators (`split(color, key)`, a collective) of its own
/// type; and checks in debug mode that all ranks issued the same collectives
/// (`verify_collective_hash()`). Models: `local_communicator` (threads),
/// `mpi_communicator` (processes).
template <class C>
concept communicator = communicator_basics<C> && communicator_blocking_ops<C, float> &&
    communicator_blocking_ops<C, double> && communicator_blocking_ops<C, std::int64_t> &&
    communicator_async_ops<C, float> && communicator_async_ops<C, double> &&
    communicator_async_ops<C, std::int64_t> && requires(C& c, int color, int key) {
  c.barrier();
  { c.ibarrier() } -> comm_request;
  { c.split(color, key) } -> std::same_as<C>;
};

/// Names the first missing part of a would-be communicator in words; use as
/// `static_assert(check_communicator<MyComm>())` to get a readable failure.
template <class C>
consteval bool check_communicator() {
  static_assert(communicator_basics<C>,
                "not a tessera communicator: needs rank(), size(), stats(), bytes_sent(), "
                "reset_stats(), set_timeout(ms), timeout(), set_debug(bool), "
                "verify_collective_hash()");
  static_assert(communicator_blocking_ops<C, float> && communicator_blocking_ops<C, double> &&
                    communicator_blocking_ops<C, std::int64_t>,
                "not a tessera communicator: needs all_reduce, reduce_scatter, all_gather, "
                "broadcast, send, recv for float, double and std::int64_t");
  static_assert(communicator_async_ops<C, float> && communicator_async_ops<C, double> &&
                    communicator_async_ops<C, std::int64_t>,
                "not a tessera communicator: needs iall_reduce, ireduce_scatter, iall_gather, "
                "ibroadcast, isend, irecv returning a handle with wait() and test()");
  static_assert(communicator<C>,
                "not a tessera communicator: needs barrier(), ibarrier() and "
                "split(color, key) returning the same communicator type");
  return true;
}

/// Where the buffers passed to a communicator's operations live. The
/// `communicator` concept checks signatures only (`T*`), so it cannot tell a
/// host pointer from a device pointer: a communicator declares its space as
/// `static constexpr buffer_space buffers = ...;`, and one that declares
/// nothing (local_communicator, mpi_communicator) takes host buffers.
enum class buffer_space : std::uint8_t { host, device };

namespace detail {
template <class C>
consteval buffer_space buffer_space_of_impl() {
  if constexpr (requires { C::buffers; })
    return C::buffers;
  else
    return buffer_space::host;
}
}  // namespace detail

/// The buffer space of communicator type C (C::buffers, else host).
template <class C>
inline constexpr buffer_space buffer_space_of = detail::buffer_space_of_impl<C>();

// This clang-format misreads `buffer_space_of<C> ==` inside a concept.
// clang-format off
/// A communicator whose operations read and write HOST memory: code that
/// hands it std::vector data or host tensors (parallel/, the trainers)
/// should require this, not plain `communicator`.
template <class C>
concept host_communicator = communicator<C> && (buffer_space_of<C> == buffer_space::host);

/// A communicator whose operations read and write DEVICE memory, ordered on
/// a CUDA stream it exposes as `stream()` (nccl_communicator). Everything
/// else is `communicator`'s contract, with "the buffers must stay alive
/// until wait()" meaning device allocations, and a blocking operation
/// returning when the work on the stream has completed.
template <class C>
concept device_communicator = communicator<C> && (buffer_space_of<C> == buffer_space::device) &&
                              requires(const C& cc) { cc.stream(); };
// clang-format on

namespace detail {

using tessera::detail::str;

/// "all_reduce #3 (n=1001 float, 4004 bytes, sum)": the part of an error
/// message that names an operation.
inline std::string describe_op(op_kind k, std::uint64_t seq, std::size_t n, dtype d,
                               const std::string& extra = {}) {
  return str(to_string(k), " #", seq, " (n=", n, " ", to_string(d), ", ", n * dtype_bytes(d),
             " bytes", extra.empty() ? "" : ", ", extra, ")");
}

/// The operation being executed, for message headers and error messages.
struct op_ctx {
  op_kind k = op_kind::barrier;
  std::uint64_t seq = 0;  // collective sequence number, or the rank's p2p number
  std::size_t n = 0;      // elements (per rank chunk for reduce_scatter/all_gather)
  dtype dt = dtype::none;
  std::string extra;  // "sum", "root 0", "peer 3"
  std::chrono::milliseconds timeout{};
  bool collective = true;
  int tag = 0;
};

/// An op_ctx as error messages name it: "all_reduce #3 (n=1001 float, 4004
/// bytes, sum)" or "recv #0 (p2p, tag 42, n=13 double, 104 bytes, peer 1)".
inline std::string describe(const op_ctx& c) {
  if (c.collective) return describe_op(c.k, c.seq, c.n, c.dt, c.extra);
  return str(to_string(c.k), " #", c.seq, " (p2p, tag ", c.tag, ", n=", c.n, " ", to_string(c.dt),
             ", ", c.n * dtype_bytes(c.dt), " bytes, ", c.extra, ")");
}

/// What this process is doing now, for a message written from a signal
/// handler (comm/detail/launcher_note.hpp's, when the launcher stops a rank because
/// another was lost): the training step and the communicator operation a
/// wait() is blocked in. Lock-free atomics only (async-signal-safe reads);
/// one per process, shared by every communicator and thread (with ranks as
/// threads the last writer wins: a hint, never used for control).
struct activity_note {
  std::atomic<std::int64_t> step{-1};  ///< the step being computed, -1 before the first
  std::atomic<int> kind{-1};           ///< op_kind of the operation waited for, -1 if none
  std::atomic<std::uint64_t> seq{0};   ///< its sequence number
  std::atomic<std::uint64_t> n{0};     ///< its element count
  std::atomic<int> dt{0};              ///< its dtype
  std::atomic<int> rank{0}, size{1};   ///< this rank in the operation's group, and its size
};
inline activity_note& activity() {
  static activity_note a;
  return a;
}

}  // namespace detail

/// Records that this process is computing training step `step` (1-based, as
/// metrics number steps) for comm/detail/launcher_note.hpp's message. The
/// trainer calls it at the start of each step; ranks as threads overwrite
/// each other (a hint, never read for control). Lock-free; never throws.
inline void note_step(std::int64_t step) noexcept {
  detail::activity().step.store(step, std::memory_order_relaxed);
}

}  // namespace tessera::comm
