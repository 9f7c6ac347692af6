#pragma once
/// \file parallel/stream_order.hpp
/// How a data-parallel engine orders its collectives against its kernels,
/// written once for every communicator.
///
/// On the host a kernel has finished when its call returns, and a host
/// communicator's operation when its handle's wait() returns: program order
/// is the order. A device communicator that runs on a stream of its own
/// (nccl_communicator, its own stream beside the context's, so that a
/// bucket's reduction overlaps the rest of the backward and a ZeRO-3
/// prefetch the previous block) is ordered by CUDA events on both sides:
///
///   issue    context_follow(comm, ctx), held by the engine: every operation the
///            communicator issues waits for the kernels queued on the
///            context's stream before it (its inputs are written, and a
///            block the caching allocator handed out again is no longer
///            read by them);
///   consume  order_before(request, ctx) before the first kernel that reads
///            the operation's output, and before its buffers are freed (the
///            caching allocator reuses a block on the context's stream at
///            once): the context's stream waits for the operation's event,
///            and the host goes on. A host request is waited for instead.
///
/// The host still waits for every request later (its wait() reports a
/// failure or the timeout, naming the operation), where the engine says.
/// tests/parallel/stream_order.cpp runs the engine over two simulated
/// streams per rank and shows that results change when either event is
/// dropped. Source: the CUDA Programming Guide, "Streams" and "Events";
/// PyTorch's ProcessGroupNCCL (a collective's stream waits for the current
/// stream; Work::wait makes the current stream wait for it).

#include <concepts>
#include <cstddef>
#include <utility>

#include "tessera/core/error.hpp"

namespace tessera::parallel {

namespace detail {
// The type of a context's stream (std::nullptr_t for a host context).
template <class Ctx>
struct stream_of {
  using type = std::nullptr_t;
};
template <class Ctx>
requires requires(const Ctx& x) {
  x.stream();
}
struct stream_of<Ctx> {
  using type = decltype(std::declval<const Ctx&>().stream());
};
}  // namespace detail

/// For its lifetime, makes `comm` issue every operation after the work
/// queued on `ctx`'s stream at that moment (comm.follow(ctx.stream()); a
/// communicator without streams is left alone), and restores the
/// communicator's previous setting when destroyed: the engine that owns it
/// borrows the communicator, whose later users may compute elsewhere.
/// Several owners may follow the same stream (a pipeline rank's model
/// chunks). Throws config_error when `comm` already follows another stream:
/// one communicator cannot order itself after two contexts (the later
/// would silently take the ordering from the earlier). Precondition: the
/// stream outlives the object.
template <class C, class Ctx>
class context_follow {
 public:
  context_follow(C& comm, const Ctx& ctx) : comm_(&comm) {
    if constexpr (follows_streams) {
      prev_ = comm.followed_stream();
      TESSERA_THROW_IF(prev_ != stream_type{} && prev_ != ctx.stream(), config_error,
                       "data_parallel: the communicator already orders itself after another "
                       "context's stream; give each context its own communicator (split)");
      comm.follow(ctx.stream());
    }
  }
  ~context_follow() {
    if constexpr (follows_streams) comm_->follow(prev_);
  }
  context_follow(const context_follow&) = delete;
  context_follow& operator=(const context_follow&) = delete;

 private:
  static constexpr bool follows_streams = requires(C & c, const Ctx& x) {
    c.follow(x.stream());
    { c.followed_stream() } -> std::same_as<decltype(x.stream())>;
  };
  using stream_type = typename detail::stream_of<Ctx>::type;
  C* comm_;
  stream_type prev_{};
};

/// Orders the work queued on `ctx`'s stream from now on after the
/// operation of `req`: a device request makes the stream wait for its
/// event (req.order_before; the host does not block), a host request is
/// waited for (req.wait()). Throws comm_error from either.
template <class Request, class Ctx>
void order_before(Request& req, const Ctx& ctx) {
  if constexpr (requires { req.order_before(ctx.stream()); })
    req.order_before(ctx.stream());
  else
    req.wait();
}

}  // namespace tessera::parallel
