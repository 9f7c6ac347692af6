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
///   issue    follow_context(comm, ctx) once: every operation the
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

namespace tessera::parallel {

/// Makes `comm` issue every later operation after the work queued on
/// `ctx`'s stream (comm.follow(ctx.stream()); nothing for a communicator
/// without streams). Throws what follow() throws.
template <class C, class Ctx>
void follow_context(C& comm, const Ctx& ctx) {
  if constexpr (requires { comm.follow(ctx.stream()); }) comm.follow(ctx.stream());
}

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
