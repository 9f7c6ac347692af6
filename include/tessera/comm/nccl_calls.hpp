#pragma once
/// \file comm/nccl_calls.hpp
/// What nccl_communicator (comm/nccl.hpp) asks of NCCL for each
/// communicator operation, as data: `nccl_translate` turns one operation
/// into its list of NCCL calls (`nccl_call`: the function, NCCL's count,
/// the datatype, the reduction, the peer or root, the buffers), and
/// nccl_communicator issues exactly that list, call by call
/// (detail::nccl_issue in comm/nccl.hpp). Written once and host-compilable
/// (no CUDA or NCCL header), so a host test can produce the NCCL sequence
/// of a real training step without a GPU and hold it against what the
/// host communicators executed (tests/comm/nccl_recording.hpp).
///
///   operation (T: the dtype dt)         NCCL calls
///   all_reduce(buf, n, op)              ncclAllReduce(buf, buf, count n, dt, op)
///   reduce_scatter(send, recv, c, op)   ncclReduceScatter(send, recv, recvcount c, dt, op)
///   all_gather(send, recv, c)           ncclAllGather(send, recv, sendcount c, dt)
///   broadcast(buf, n, root)             ncclBroadcast(buf, buf, count n, dt, root)
///   send(buf, n, peer)                  ncclSend(buf, count n, dt, peer)
///   recv(buf, n, peer)                  ncclRecv(buf, count n, dt, peer)
///   sendrecv(s, dst, r, src, n)         ncclGroupStart; ncclSend(s, n, dt, dst);
///                                       ncclRecv(r, n, dt, src); ncclGroupEnd
///   group_p2p(ops)                      ncclGroupStart; an ncclSend or ncclRecv per
///                                       operation, in order; ncclGroupEnd
///   barrier()                           ncclAllReduce(word, word, count 1, ncclInt32, ncclSum)
///
/// An operation that moves no element (n, c or every group operation's n
/// 0; an empty group) is no call at all: nothing is enqueued, on every rank
/// alike (the ranks of a collective share n, and a receive shares its
/// send's). Counts are NCCL's: ReduceScatter's is the per-rank chunk it
/// receives (its send buffer holds N of them), AllGather's the chunk each
/// rank sends, which are the host communicators' counts of the same
/// operations too (communicator.hpp). split is ncclCommSplit, which makes a
/// communicator rather than moving data: not in these lists.
///
/// Source: NCCL User Guide (docs.nvidia.com/deeplearning/nccl),
/// "Collective operations", "Point-to-point communication", "Group calls",
/// and the API page of each call named above.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"

namespace tessera::comm {

/// The NCCL functions nccl_communicator calls to move data.
enum class nccl_fn : std::uint8_t {
  all_reduce,      ///< ncclAllReduce
  reduce_scatter,  ///< ncclReduceScatter
  all_gather,      ///< ncclAllGather
  broadcast,       ///< ncclBroadcast
  send,            ///< ncclSend
  recv,            ///< ncclRecv
  group_start,     ///< ncclGroupStart
  group_end,       ///< ncclGroupEnd
};

/// NCCL's name of `f` ("ncclReduceScatter").
constexpr const char* to_string(nccl_fn f) {
  switch (f) {
    case nccl_fn::all_reduce:
      return "ncclAllReduce";
    case nccl_fn::reduce_scatter:
      return "ncclReduceScatter";
    case nccl_fn::all_gather:
      return "ncclAllGather";
    case nccl_fn::broadcast:
      return "ncclBroadcast";
    case nccl_fn::send:
      return "ncclSend";
    case nccl_fn::recv:
      return "ncclRecv";
    case nccl_fn::group_start:
      return "ncclGroupStart";
    case nccl_fn::group_end:
      return "ncclGroupEnd";
  }
  return "?";
}

/// True for the collectives (every rank of the communicator calls them).
constexpr bool is_collective(nccl_fn f) {
  return f == nccl_fn::all_reduce || f == nccl_fn::reduce_scatter || f == nccl_fn::all_gather ||
         f == nccl_fn::broadcast;
}

/// NCCL's name of the datatype of `d` ("ncclFloat32"; "none" for none).
constexpr const char* nccl_type_name(dtype d) {
  switch (d) {
    case dtype::f32:
      return "ncclFloat32";
    case dtype::f64:
      return "ncclFloat64";
    case dtype::i32:
      return "ncclInt32";
    case dtype::i64:
      return "ncclInt64";
    case dtype::u64:
      return "ncclUint64";
    case dtype::bf16:
      return "ncclBfloat16";
    case dtype::f16:
      return "ncclFloat16";
    case dtype::none:
      return "none";
  }
  return "?";
}

/// One NCCL call with its arguments (the communicator and the stream are
/// the issuing nccl_communicator's).
struct nccl_call {
  nccl_fn fn = nccl_fn::group_start;
  /// NCCL's count argument: elements of the operation (AllReduce,
  /// Broadcast, Send, Recv), ReduceScatter's recvcount, AllGather's
  /// sendcount; 0 for GroupStart and GroupEnd.
  std::size_t count = 0;
  dtype dt = dtype::none;          ///< the datatype argument; none for the group calls
  reduce_op op = reduce_op::sum;   ///< the ncclRedOp_t (AllReduce, ReduceScatter only)
  int peer = -1;                   ///< Send, Recv: the peer; Broadcast: the root; else -1
  const void* sendbuff = nullptr;  ///< the send buffer (Send: the data), as given
  void* recvbuff = nullptr;        ///< the receive buffer (Recv: the data), as given

  /// The same call, buffers aside (what two ranks must agree on).
  [[nodiscard]] constexpr bool same_call(const nccl_call& o) const {
    return fn == o.fn && count == o.count && dt == o.dt && peer == o.peer &&
           (op == o.op || (fn != nccl_fn::all_reduce && fn != nccl_fn::reduce_scatter));
  }
};

/// "ncclReduceScatter(recvcount=512, ncclFloat32, ncclSum)": a call as
/// error messages name it (no buffers).
inline std::string describe(const nccl_call& c) {
  using tessera::detail::str;
  const char* op = c.op == reduce_op::sum ? "ncclSum" : "ncclMax";
  switch (c.fn) {
    case nccl_fn::all_reduce:
      return str("ncclAllReduce(count=", c.count, ", ", nccl_type_name(c.dt), ", ", op, ")");
    case nccl_fn::reduce_scatter:
      return str("ncclReduceScatter(recvcount=", c.count, ", ", nccl_type_name(c.dt), ", ", op,
                 ")");
    case nccl_fn::all_gather:
      return str("ncclAllGather(sendcount=", c.count, ", ", nccl_type_name(c.dt), ")");
    case nccl_fn::broadcast:
      return str("ncclBroadcast(count=", c.count, ", ", nccl_type_name(c.dt), ", root=", c.peer,
                 ")");
    case nccl_fn::send:
    case nccl_fn::recv:
      return str(to_string(c.fn), "(count=", c.count, ", ", nccl_type_name(c.dt), ", peer=", c.peer,
                 ")");
    case nccl_fn::group_start:
    case nccl_fn::group_end:
      return str(to_string(c.fn), "()");
  }
  return "?";
}

/// The translation of each communicator operation into its NCCL calls
/// (file comment's table). Pure functions of the arguments; the buffers
/// are passed through, never read. Preconditions (nccl_communicator checks
/// them first, naming the rank): roots and peers in [0, size()), dtype
/// not none.
struct nccl_translate {
  using calls = std::vector<nccl_call>;

  /// In-place all-reduce of buf[0, n): ncclAllReduce(buf, buf, n, dt, op).
  static calls all_reduce(void* buf, std::size_t n, dtype dt, reduce_op op) {
    if (n == 0) return {};
    return {{nccl_fn::all_reduce, n, dt, op, -1, buf, buf}};
  }
  /// recv[0, chunk) = op over ranks of send[rank chunk, (rank+1) chunk):
  /// ncclReduceScatter(send, recv, recvcount chunk, dt, op).
  static calls reduce_scatter(const void* send, void* recv, std::size_t chunk, dtype dt,
                              reduce_op op) {
    if (chunk == 0) return {};
    return {{nccl_fn::reduce_scatter, chunk, dt, op, -1, send, recv}};
  }
  /// recv[r chunk, (r+1) chunk) = send of rank r: ncclAllGather(send,
  /// recv, sendcount chunk, dt).
  static calls all_gather(const void* send, void* recv, std::size_t chunk, dtype dt) {
    if (chunk == 0) return {};
    return {{nccl_fn::all_gather, chunk, dt, reduce_op::sum, -1, send, recv}};
  }
  /// root's buf[0, n) to every rank: ncclBroadcast(buf, buf, n, dt, root).
  static calls broadcast(void* buf, std::size_t n, dtype dt, int root) {
    if (n == 0) return {};
    return {{nccl_fn::broadcast, n, dt, reduce_op::sum, root, buf, buf}};
  }
  /// buf[0, n) to `peer`: ncclSend(buf, n, dt, peer).
  static calls send(const void* buf, std::size_t n, dtype dt, int peer) {
    if (n == 0) return {};
    return {{nccl_fn::send, n, dt, reduce_op::sum, peer, buf, nullptr}};
  }
  /// n elements from `peer` into buf: ncclRecv(buf, n, dt, peer).
  static calls recv(void* buf, std::size_t n, dtype dt, int peer) {
    if (n == 0) return {};
    return {{nccl_fn::recv, n, dt, reduce_op::sum, peer, nullptr, buf}};
  }
  /// A send to `dst` and a receive from `src` as one group.
  static calls sendrecv(const void* send, int dst, void* recv, int src, std::size_t n, dtype dt) {
    if (n == 0) return {};
    return {{nccl_fn::group_start},
            {nccl_fn::send, n, dt, reduce_op::sum, dst, send, nullptr},
            {nccl_fn::recv, n, dt, reduce_op::sum, src, nullptr, recv},
            {nccl_fn::group_end}};
  }
  /// `ops` as one group, in order. Throws config_error for an operation
  /// that is neither send nor recv.
  static calls group_p2p(std::span<const p2p_op> ops) {
    std::size_t total = 0;
    for (const p2p_op& o : ops) {
      TESSERA_THROW_IF(o.kind != op_kind::send && o.kind != op_kind::recv, config_error,
                       "nccl_translate::group_p2p takes send and recv operations, not ",
                       to_string(o.kind));
      total += o.n;
    }
    if (total == 0) return {};
    calls out;
    out.reserve(ops.size() + 2);
    out.push_back({nccl_fn::group_start});
    for (const p2p_op& o : ops)
      out.push_back(
          o.kind == op_kind::send
              ? nccl_call{nccl_fn::send, o.n, o.dt, reduce_op::sum, o.peer, o.buf, nullptr}
              : nccl_call{nccl_fn::recv, o.n, o.dt, reduce_op::sum, o.peer, nullptr, o.buf});
    out.push_back({nccl_fn::group_end});
    return out;
  }
  /// barrier: an all-reduce of one int32 (the communicator's device word).
  static calls barrier(void* word) {
    return {{nccl_fn::all_reduce, 1, dtype::i32, reduce_op::sum, -1, word, word}};
  }
};

/// The name error messages give a list of calls: the single call's
/// ("ncclAllReduce"), or "ncclGroupEnd (group of 2 ncclSend, 1 ncclRecv)".
inline std::string calls_name(std::span<const nccl_call> calls) {
  if (calls.size() == 1) return to_string(calls.front().fn);
  std::size_t sends = 0, recvs = 0;
  for (const nccl_call& c : calls) {
    sends += c.fn == nccl_fn::send;
    recvs += c.fn == nccl_fn::recv;
  }
  return tessera::detail::str("ncclGroupEnd (group of ", sends, " ncclSend, ", recvs, " ncclRecv)");
}

}  // namespace tessera::comm
