#pragma once
/// \file nn/segment_hooks.hpp
/// Segments of a model and the hooks a sharding strategy uses to act per
/// segment (DESIGN.md, "One step": gradient buckets reduced while earlier
/// layers still compute; ZeRO-3 parameters gathered per block).
///
/// A segment is a contiguous range of the flat parameter buffer that one
/// stage of the forward pass reads: the embedding (segment -1), transformer
/// block l (segment l, 0 <= l < L), and the head (segment L: final norm and
/// LM head). Segments tile the flat buffer in order -1, 0, ..., L, with the
/// layout's alignment padding counted in the segment before it.
///
/// Call order (nn::llama). forward_backward, for one micro-batch:
///
///   before_forward(-1) after_forward(-1) ... before_forward(L-1) after_forward(L-1)
///   before_forward(L)  [final norm, LM head + cross-entropy and their backward]
///   after_backward(L)
///   before_backward(L-1) after_backward(L-1) ... before_backward(-1) after_backward(-1)
///
/// A split backward (backward_input, then backward_weight: zero-bubble
/// schedules) calls before_backward_input(l) after_backward_input(l) for
/// each block in B, and after_backward(l) for each block, then before_backward(-1)
/// after_backward(-1), in W; other micro-batches' passes may run between.
///
/// The head's forward and backward are fused (the chunked LM head computes
/// its gradient as it goes), so within forward_backward the head gets
/// before_forward and after_backward only. forward_loss and next_token_logits
/// call before_forward(s), after_forward(s) for s = -1 .. L.
///
/// What a strategy may do in each (seed 004, "ZeRO and FSDP"):
///   before_*(s): make segment s's parameters readable and point the model at
///                them (llama::set_segment_params); ZeRO-3 all-gathers here.
///                Before the backward writes segment s's gradients (its
///                before_backward, or the head's before_forward when a
///                backward follows), a strategy may point the model at
///                where they accumulate (llama::set_segment_grads); ZeRO-2/3
///                allocate the bucket's gradient buffer here.
///   after_forward(s): the parameters of s are not needed until its backward
///                (ZeRO-3 frees its gathered copy).
///   after_backward_input(s): the parameters of s are not needed again for
///                this micro-batch (ZeRO-3 frees its gathered copy).
///   after_backward(s): every gradient of segment s for this micro-batch is
///                in the gradient buffer; a bucket whose segments are all
///                done may start its reduction while earlier segments still
///                compute.
/// Hooks run on the calling thread, between kernels; they must not touch
/// activation memory. An exception thrown by a hook propagates out of the
/// model call (the micro-batch's record is then left empty, its tensors freed).

namespace tessera::nn {

/// Per-segment hooks (all no-ops by default). Segment ids: -1 embedding,
/// 0..L-1 blocks, L head. Not owned by the model; must outlive its use.
struct segment_hooks {
  virtual ~segment_hooks() = default;
  /// Before segment s's parameters are read by a forward pass.
  virtual void before_forward(int s) { (void)s; }
  /// After segment s's forward pass read its parameters for the last time.
  virtual void after_forward(int s) { (void)s; }
  /// Before segment s's parameters are read by its backward pass.
  virtual void before_backward(int s) { (void)s; }
  /// Before block s's input-gradient pass (B of a split backward, which
  /// covers the blocks; the embedding's backward comes in W). By default
  /// before_backward(s).
  virtual void before_backward_input(int s) { before_backward(s); }
  /// After block s's input-gradient pass (B of a split backward): its
  /// parameters are not read again for this micro-batch; its gradients are
  /// complete only at its after_backward, in backward_weight.
  virtual void after_backward_input(int s) { (void)s; }
  /// After segment s's backward pass: its parameter gradients are complete.
  virtual void after_backward(int s) { (void)s; }
};

}  // namespace tessera::nn
