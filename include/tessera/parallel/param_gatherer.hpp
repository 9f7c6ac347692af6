#pragma once
/// \file parallel/param_gatherer.hpp
/// `param_gatherer<Model, C>`: the parameters of a ZeRO-3 rank (Rajbhandari
/// et al. 2020, P_os+g+p; FSDP's FULL_SHARD): each rank keeps only its
/// shard (its chunk of every bucket, one bucket per segment: a block, the
/// embedding or the head), and every segment is all-gathered over dp into
/// a transient buffer before its forward and again before its backward,
/// freed after use; with prefetch the next segment's gather is issued
/// before the current one computes (the forward's next; at the head, when
/// the caller says the backward runs next, the backward's first; the
/// backward's previous, when the caller says it is in the same pass), so
/// at most two gathered segments are held at once, and none between
/// passes.
///
/// Collectives: one all-gather of a bucket's chunks per use
/// ((N-1)/N P_k sizeof(Param) bytes; 2-byte parameters travel as 32-bit
/// words), on the communicator's stream when it has one (parallel/
/// stream_order.hpp): a prefetch waits for the kernels queued before it,
/// and a segment's kernels for its gather, without blocking the host; the
/// host waits for the gather when the segment is released. The shard is drawn from the model's
/// initialisation, range by range (nn::llama::init_weights_range: the same values as the whole
/// model's on the host; on a GPU the shard is drawn on the host and copied,
/// so it may differ from a device-drawn init_weights in the last bits of a
/// float32, kernels/weight_init.hpp), so no full parameter buffer ever exists.

#include <cstdint>
#include <optional>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/nvtx.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/parallel/buckets.hpp"
#include "tessera/parallel/stream_order.hpp"

namespace tessera::parallel {

namespace detail {
// Every rank's `chunk` elements of `send` into recv (rank r's at r chunk),
// asynchronously: a comm_element as itself, a two-byte type as 32-bit words.
template <class C, class T>
auto gather_chunks(C& comm, const T* send, T* recv, std::int64_t chunk) {
  if constexpr (comm::comm_element<T>) {
    return comm.iall_gather(send, recv, static_cast<std::size_t>(chunk));
  } else {
    static_assert(sizeof(T) == 2 && chunk_align % 2 == 0);
    return comm.iall_gather(reinterpret_cast<const std::int32_t*>(send),
                            reinterpret_cast<std::int32_t*>(recv),
                            static_cast<std::size_t>(chunk / 2));
  }
}
}  // namespace detail

/// A ZeRO-3 rank's parameters (file comment). Holds references to the
/// model, the communicator and the bucket plan (one bucket per segment;
/// not owned).
template <class Model, class C>
class param_gatherer {
 public:
  using P = typename Model::precision_type;
  using Backend = typename Model::backend_type;
  using Ctx = typename Model::context_type;
  using Param = typename P::param_type;

  /// Draws this rank's shard from `seed` (or the model's weight reader),
  /// chunk by chunk. Precondition: the model was built with
  /// llama_options::external_params; `plan` has one bucket per segment.
  param_gatherer(Model& model, C& comm, const bucket_plan& plan, std::uint64_t seed, bool prefetch)
      : model_(&model),
        ctx_(&model.context()),
        comm_(&comm),
        plan_(&plan),
        prefetch_(prefetch),
        shard_(kernels::make_tensor<Param>(model.context(), plan.shard_size())),
        gathered_(plan.size()) {
    kernels::zero_elements(*ctx_, shard_.data(), plan.shard_size());
    for (std::size_t k = 0; k < plan.size(); ++k) {
      const auto [lo, hi] = plan.owned(k);
      std::vector<Param> h(static_cast<std::size_t>(hi - lo));
      model.init_weights_range(seed, lo, hi, h.data());
      ctx_->from_host(shard_.data() + plan.buckets()[k].shard_offset, h.data(),
                      h.size() * sizeof(Param));
    }
  }
  param_gatherer(const param_gatherer&) = delete;
  param_gatherer& operator=(const param_gatherer&) = delete;
  /// Waits for the gathers in flight (their buffers are about to be freed;
  /// errors dropped) and unpoints the model's segments.
  ~param_gatherer() {
    for (auto& g : gathered_) try {
        if (g.req) g.req->wait();
      } catch (...) {
      }
    for (int s = model_->first_segment(); s <= model_->last_segment(); ++s)
      model_->set_segment_params(s, nullptr);
  }

  /// The shard (shard-local order, plan.shard_size() elements, the context's memory).
  Param* shard() { return shard_.data(); }
  const Param* shard() const { return shard_.data(); }

  /// Before segment s's forward: gathered and pointed at; the next prefetched
  /// (the forward's next segment, or at the last one, when `backward_next`
  /// says the backward runs right after it, the backward's first).
  void before_forward(int s, bool backward_next) {
    acquire(s);
    if (!prefetch_) return;
    if (s < model_->last_segment())
      issue(s + 1);
    else if (backward_next && s - 1 >= model_->first_segment())
      issue(s - 1);
  }
  /// Before segment s's backward: gathered again; the previous prefetched
  /// when `previous_next` (its backward comes next in the same pass).
  void before_backward(int s, bool previous_next) {
    acquire(s);
    if (prefetch_ && previous_next && s - 1 >= model_->first_segment()) issue(s - 1);
  }
  /// Segment s gathered and pointed at, with no prefetch: another segment's
  /// module reads it (the LM head of tied embeddings reads the embedding's
  /// segment -1 beside its own). Release it with release(s).
  void hold(int s) { acquire(s); }
  /// After segment s's forward or backward (or its B): its gathered copy freed once
  /// the context's later work is ordered after its gather (a prefetch never
  /// used included), which the host then waits for (comm_error).
  void release(int s) {
    slot& g = slot_of(s);
    if (g.req) {  // (the host's wait orders every later kernel too)
      g.req->wait();
      g.req.reset();
    }
    g.ready = false;
    if (!g.buf.empty()) --held_, held_bytes_ -= g.buf.bytes();
    g.buf.release();
    model_->set_segment_params(s, nullptr);
  }
  /// Writes every segment's gathered parameters into out[0, flat_size())
  /// (collective: each segment gathered and freed in turn).
  void full_params(Param* out) {
    for (int s = model_->first_segment(); s <= model_->last_segment(); ++s) {
      acquire(s);
      kernels::copy_elements(*ctx_, out + model_->segment_begin(s), model_->segment_params(s),
                             model_->segment_end(s) - model_->segment_begin(s));
      release(s);
    }
  }
  /// The host waits for the gathers the context's stream was ordered after
  /// (segments acquired, not yet released): before a blocking
  /// synchronisation of the context. comm_error.
  void settle_ordered() {
    for (auto& g : gathered_)
      if (g.ready && g.req) g.req->wait();
  }
  /// Starts a step: the high-water mark of gathered segments restarts.
  void begin_step() { max_held_ = held_; }
  /// Segments gathered now (0 between passes), and the most at once since begin_step().
  std::size_t held() const { return held_; }
  std::size_t max_held() const { return max_held_; }
  /// Bytes of gathered segments held at their most since construction.
  std::size_t max_held_bytes() const { return max_held_bytes_; }
  /// Bytes kept between steps (the shard).
  std::size_t persistent_bytes() const { return shard_.bytes(); }

 private:
  using request = decltype(detail::gather_chunks(
      std::declval<C&>(), static_cast<const Param*>(nullptr), static_cast<Param*>(nullptr), 0));
  struct slot {
    tensor<Param, Backend> buf;  // (padded) the segment in flat order, then padding
    std::optional<request> req;  // issued and not yet waited for by the host
    bool ready = false;          // the context's work is ordered after the gather
  };
  slot& slot_of(int s) { return gathered_[static_cast<std::size_t>(plan_->bucket_of_segment(s))]; }
  void issue(int s) {
    slot& g = slot_of(s);
    if (g.req || g.ready) return;
    const bucket& b = plan_->buckets()[static_cast<std::size_t>(plan_->bucket_of_segment(s))];
    TESSERA_NVTX_RANGE("all_gather segment ", s);
    g.buf = kernels::make_tensor<Param>(*ctx_, b.padded);
    max_held_ = std::max(max_held_, ++held_);
    held_bytes_ += g.buf.bytes();
    max_held_bytes_ = std::max(max_held_bytes_, held_bytes_);
    g.req.emplace(
        detail::gather_chunks(*comm_, shard_.data() + b.shard_offset, g.buf.data(), b.chunk));
  }
  // Segment s gathered (issued now if not prefetched) and the context's
  // later work ordered after the gather; its request stays for release().
  void acquire(int s) {
    issue(s);
    slot& g = slot_of(s);
    if (!g.ready) {
      TESSERA_NVTX_RANGE("order after all_gather segment ", s);
      order_before(*g.req, *ctx_);
      g.ready = true;
    }
    model_->set_segment_params(s, g.buf.data());
  }

  Model* model_;
  const Ctx* ctx_;
  C* comm_;
  const bucket_plan* plan_;
  bool prefetch_;
  tensor<Param, Backend> shard_;  // (shard_size) this rank's parameters
  std::vector<slot> gathered_;    // per bucket (= segment)
  std::size_t held_ = 0, max_held_ = 0;
  std::size_t held_bytes_ = 0, max_held_bytes_ = 0;
};

}  // namespace tessera::parallel
