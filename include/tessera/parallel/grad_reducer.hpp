#pragma once
/// \file parallel/grad_reducer.hpp
/// `gradient_reducer<Model, S, C>`: the gradient side of a data-parallel
/// engine (parallel/zero.hpp), one rank of dp. It holds the gradients the
/// model accumulates, reduces each bucket (parallel/buckets.hpp) over dp
/// as soon as the backward has produced it, and keeps the reduced gradient
/// for the norm and the optimizer. What it does follows from the sharding
/// strategy S (parallel/sharding.hpp):
///
///   S::gradients == grad_home::bucket_buffer (zero<0>, zero<1>): a
///     persistent bucket-padded buffer of the reduce type (Megatron-Core's
///     contiguous gradient buffer): bucket k at staging_offset_k, padded to
///     dp equal chunks. When the model was built with external gradients
///     and Grad is the reduce type, the model accumulates straight into it
///     and each bucket is reduced in place there: all-reduced (zero<0>) or
///     reduce-scattered, this rank's chunk at its own position (zero<1>).
///     Otherwise (a model with its own gradient buffer, bf16 gradients) the
///     bucket is copied (converted) into it first, and zero<0>'s reduced
///     bucket copied back.
///   S::gradients == grad_home::shard (zero<2>, zero<3>): no persistent
///     gradient buffer; each bucket's buffer exists while it is filled and
///     reduced, and is reduce-scattered into the persistent reduced-gradient
///     shard (the reduce type, this rank's chunks) under one of two policies
///     (grad_reduction): per_step, the window's micro-batches accumulate in
///     the bucket buffers (all of them open at once after the first
///     backward: FSDP's no_sync) and each bucket is reduce-scattered once,
///     on the last; or per_micro_batch, each micro-batch's bucket is
///     reduce-scattered as it completes and added into the shard
///     (DeepSpeed's and FSDP's default), at most two bucket buffers held at
///     once (the one filling and the one reducing).
///
/// One rank under zero<0> (`local`) reduces nothing: the model's own flat
/// gradient buffer is the reduced gradient.
///
/// Determinism: the local communicator adds every element of a padded
/// bucket in the same ring order under all_reduce and reduce_scatter, and
/// the in-place and copied paths move the same values, so the stages agree
/// bit for bit when their buckets do (the per_micro_batch policy adds the
/// micro-batches' reduced sums instead of reducing their sum: another
/// order).
///
/// Streams (parallel/stream_order.hpp): a device communicator runs on a
/// stream of its own that follows the context's, so a bucket's reduction
/// waits for the kernels that wrote it and overlaps the backward after it.
/// A completed reduction orders the context's stream after it before its
/// output is read (the per-micro-batch add into the shard) or its buffers
/// freed, without blocking the host; finish() then waits on the host for
/// every reduction of the step, where a failure or timeout is reported.
///
/// Memory (bytes of the reduce type R, grad type G, padded P, shard S):
/// persistent P R on zero<0,1> (none for one rank) and S R on zero<2,3>;
/// transient on zero<2,3>: per_step all P G of the window, per_micro_batch
/// the two largest adjacent buckets and, from the window's second
/// micro-batch on, the reduced chunk of the one reducing (plan/state.hpp
/// counts the same).

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/nvtx.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/parallel/buckets.hpp"
#include "tessera/parallel/sharding.hpp"
#include "tessera/parallel/stream_order.hpp"

namespace tessera::parallel {

/// When a data-parallel engine reduces a bucket of gradients over dp.
enum class grad_reduction : std::uint8_t {
  /// Once per optimizer step: the window's micro-batches accumulate locally
  /// (no_sync) and each bucket is reduced after the last one's backward
  /// (fewer bytes sent; under zero<2,3> every bucket buffer is held during
  /// the window).
  per_step,
  /// zero<2,3>: after every micro-batch's backward, each bucket reduce-
  /// scattered into the float32 shard as it completes (the bytes of per_step
  /// times the micro-batches; two bucket buffers held at most).
  per_micro_batch,
};

/// "step", "micro-batch" (the names parse_grad_reduction reads).
inline const char* to_string(grad_reduction r) {
  return r == grad_reduction::per_step ? "step" : "micro-batch";
}
/// The reduction named `s` ("step", "micro-batch"). Throws config_error naming it.
inline grad_reduction parse_grad_reduction(std::string_view s) {
  if (s == "step") return grad_reduction::per_step;
  if (s == "micro-batch") return grad_reduction::per_micro_batch;
  throw config_error(
      ::tessera::detail::str("unknown gradient reduction '", s, "': choose step or micro-batch"));
}

/// One bucket reduction, as issued: which bucket, in which micro-batch of the
/// step, and after which segment's backward (the overlap: a bucket issued
/// after segment s > -1 overlaps the backward of segments below s).
struct reduction_event {
  int bucket = 0;
  std::int64_t micro_batch = 0;
  int after_segment = 0;
};

/// The gradient side of one rank's engine (file comment). Holds references
/// to the model, the communicator and the bucket plan (not owned).
template <class Model, class S, class C>
class gradient_reducer {
 public:
  using P = typename Model::precision_type;
  using Backend = typename Model::backend_type;
  using Ctx = typename Model::context_type;
  using Grad = typename P::grad_type;
  using Reduce = reduce_type_t<P>;

  /// Allocates what the strategy keeps (zero: the padded buffer, the
  /// shard) and points the model's segments at the padded buffer when it
  /// accumulates there (the model built with external gradients, Grad the
  /// reduce type). `local`: one rank under zero<0>, nothing to reduce.
  /// Throws config_error for per_micro_batch under zero<0,1> (they keep the
  /// whole gradient and reduce it once per step).
  gradient_reducer(Model& model, C& comm, const bucket_plan& plan, grad_reduction policy,
                   bool local)
      : model_(&model),
        ctx_(&model.context()),
        comm_(&comm),
        plan_(&plan),
        policy_(policy),
        local_(local),
        in_place_(S::gradients == grad_home::bucket_buffer && !local && model.grads() == nullptr) {
    TESSERA_THROW_IF(policy == grad_reduction::per_micro_batch && S::gradients != grad_home::shard,
                     config_error, S::name,
                     " keeps the whole gradient and reduces it once per step: per-micro-batch "
                     "reduction needs a sharded gradient (zero 2 or 3)");
    TESSERA_THROW_IF(
        local && model.grads() == nullptr, config_error,
        "data_parallel: one rank under zero0 reduces nothing and needs the model's own "
        "gradient buffer (external_grads = false)");
    TESSERA_THROW_IF(in_place_ && !(std::is_same_v<Grad, Reduce>), config_error,
                     "data_parallel: ", dtype_name<Grad>(),
                     " gradients cannot be reduced in place in ", dtype_name<Reduce>(),
                     ": build the model with its own gradient buffer");
    const std::size_t nb = plan.size();
    reductions_.assign(nb, 0);
    backwards_.assign(static_cast<std::size_t>(model.last_segment() - model.first_segment() + 1),
                      0);
    if constexpr (S::gradients == grad_home::bucket_buffer) {
      if (!local) {
        staging_ = kernels::make_tensor<Reduce>(*ctx_, plan.staging_size());
        kernels::zero_elements(*ctx_, staging_.data(), plan.staging_size());
      }
      if (in_place_) point_at_staging();
    } else {
      window_.resize(nb);
      reduced_once_.assign(nb, false);
      shard_ = kernels::make_tensor<Reduce>(*ctx_, plan.shard_size());
      kernels::zero_elements(*ctx_, shard_.data(), plan.shard_size());
      // Gradients go to the bucket buffers only (a model built without
      // external_grads keeps an unused flat buffer).
      for (int t = model.first_segment(); t <= model.last_segment(); ++t)
        model.set_segment_grads(t, nullptr);
    }
  }
  gradient_reducer(const gradient_reducer&) = delete;
  gradient_reducer& operator=(const gradient_reducer&) = delete;
  /// Waits for the reductions in flight (their buffers are about to be
  /// freed; errors dropped: the peers report them) and unpoints the model.
  ~gradient_reducer() {
    try {
      drain();
      settle();
    } catch (...) {
    }
    if constexpr (S::gradients == grad_home::shard) release_window();
    if (in_place_ || S::gradients == grad_home::shard) model_->reset_segment_grads();
  }

  // ---- the step ----
  /// Starts a step of `micro_batches` backwards. Throws tessera::error if
  /// reductions of the previous step were never waited for.
  void begin_step(std::int64_t micro_batches) {
    TESSERA_THROW_IF(!pending_.empty() || !settling_.empty(), error,
                     "begin_step: ", pending_.size() + settling_.size(),
                     " reductions of the previous step were never waited for");
    micro_batches_ = micro_batches;
    std::fill(backwards_.begin(), backwards_.end(), 0);
    events_.clear();
    if constexpr (S::gradients == grad_home::shard) {
      release_window();  // what an abandoned window left
      max_window_ = 0;
      std::fill(reduced_once_.begin(), reduced_once_.end(), false);
    }
  }
  /// Before micro-batch m's forward. Per micro-batch, the previous
  /// micro-batch's last reductions complete here (they had its end to do it
  /// in), so what is held is the same whatever the transport's timing.
  void begin_micro_batch(std::int64_t m) {
    micro_ = m;
    if (policy_ == grad_reduction::per_micro_batch) drain();
  }
  /// After a step that threw part-way: waits for what it issued (errors
  /// dropped) and frees its buffers.
  void abandon() noexcept {
    try {
      drain();
      settle();
    } catch (...) {
      pending_.clear();
      settling_.clear();
    }
    if constexpr (S::gradients == grad_home::shard) release_window();
  }
  /// Before segment s writes gradients (its backward, or the head's fused
  /// forward): under a sharded gradient, its bucket's buffer exists.
  void open(int s) {
    if constexpr (S::gradients == grad_home::shard) open_bucket(s);
  }
  /// After segment s's backward: when it completes its bucket (the bucket's
  /// lowest segment, on the window's last micro-batch or, per micro-batch,
  /// on every one), the bucket's reduction starts (asynchronous).
  void backward_done(int s) {
    const std::int64_t done = ++backwards_[static_cast<std::size_t>(s - model_->first_segment())];
    const bool complete = policy_ == grad_reduction::per_micro_batch || done == micro_batches_;
    if (!local_ && complete) {
      const int k = plan_->bucket_of_segment(s);
      if (plan_->buckets()[static_cast<std::size_t>(k)].first_segment == s) launch(k, s);
    }
    poll();
  }
  /// Lets the communicator progress (MPI advances nonblocking collectives
  /// only inside MPI calls); per step, a sharded gradient's completed
  /// reductions free their buffers at once (wait() rethrows their errors).
  /// Per micro-batch a reduction completes when the next bucket launches,
  /// the next micro-batch begins or the step finishes: one bucket reducing
  /// beside one filling, deterministically (the planner's count).
  void poll() {
    if (S::gradients == grad_home::shard && policy_ == grad_reduction::per_step) {
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->req.test()) {
          pending_reduction p = std::move(*it);
          it = pending_.erase(it);
          complete(p);
        } else {
          ++it;
        }
      }
    } else {
      for (auto& p : pending_) (void)p.req.test();
    }
  }
  /// The host waits for every reduction the context's stream was ordered
  /// after (their failures and timeouts surface here): before a blocking
  /// synchronisation of the context, which would otherwise wait for a
  /// collective without the communicator's timeout. comm_error.
  void settle_ordered() { settle(); }
  /// Waits for every reduction of the step (ordered before the context's
  /// later work, then on the host, in issue order); zero<0> with a
  /// separate model gradient buffer copies the reduced buckets back into
  /// it. Throws tessera::error if not every bucket was reduced (exactly once
  /// per step, or once per micro-batch), comm_error from a collective.
  void finish() {
    if (local_) return;
    TESSERA_NVTX_RANGE("zero: finish_gradients");
    drain();
    settle();
    if constexpr (S::gradients == grad_home::shard) release_window();
    const std::size_t want =
        plan_->size() *
        static_cast<std::size_t>(policy_ == grad_reduction::per_micro_batch ? micro_batches_ : 1);
    TESSERA_THROW_IF(events_.size() != want, error, "finish_gradients: ", events_.size(),
                     " bucket reductions this step, expected exactly ", want,
                     " (did every micro-batch announced to begin_step run its backward, with this "
                     "engine as the model's hooks?)");
    if constexpr (S::collective == bucket_collective::all_reduce) {
      if (!in_place_) {
        Grad* g = model_->grads();
        for (const bucket& b : plan_->buckets())
          copy_or_cast(g + b.begin, staging_.data() + b.staging_offset, b.numel());
      }
    }
  }

  // ---- the reduced gradient ----
  /// This rank's reduced chunk of bucket b (the reduce type: its position
  /// in the padded buffer, or in the shard).
  const Reduce* reduced_chunk(const bucket& b) const {
    if constexpr (S::gradients == grad_home::shard)
      return shard_.data() + b.shard_offset;
    else
      return staging_.data() + b.staging_offset + plan_->rank() * b.chunk;
  }
  Reduce* reduced_chunk(const bucket& b) {
    return const_cast<Reduce*>(std::as_const(*this).reduced_chunk(b));
  }
  /// The reduced-gradient shard (zero<2,3>; shard_size() elements), else null.
  const Reduce* shard() const { return shard_.data(); }
  /// Whether the model accumulates into the padded buffer (in place).
  bool in_place() const { return in_place_; }
  /// The padded buffer (zero<0,1>; null for one rank).
  Reduce* staging() { return staging_.data(); }
  /// Nothing is reduced (one rank under zero<0>).
  bool local() const { return local_; }

  /// Writes this rank's full reduced gradient in flat order into
  /// out[0, flat_size()) (the context's memory): the model's buffer or the
  /// padded buffer, or every bucket's reduced chunks all-gathered over dp
  /// (collective) for a reduce-scatter. Call after finish().
  void full_grads(Grad* out) {
    if (local_ || (S::collective == bucket_collective::all_reduce && !in_place_)) {
      kernels::copy_elements(*ctx_, out, model_->grads(), model_->flat_size());
      return;
    }
    for (const bucket& b : plan_->buckets()) {
      if constexpr (S::collective == bucket_collective::all_reduce) {
        copy_or_cast(out + b.begin, staging_.data() + b.staging_offset, b.numel());
      } else {
        tensor<Reduce, Backend> all = kernels::make_tensor<Reduce>(*ctx_, b.padded);
        comm_->all_gather(reduced_chunk(b), all.data(), static_cast<std::size_t>(b.chunk));
        copy_or_cast(out + b.begin, all.data(), b.numel());
      }
    }
  }

  /// After finish(): calls f(v, n) on the reduced gradient of flat
  /// elements [lo, hi) (the model's flat buffer), n = hi - lo values of the
  /// reduce type in the context's memory, whole on every rank, which f
  /// rewrites in place; what f leaves is written back where the norm and
  /// the optimizer read it (the model's buffer, the padded buffer, this
  /// rank's chunk). Under a reduce-scatter the bucket is first all-gathered
  /// over dp (collective over dp). Precondition: [lo, hi) lies in one
  /// bucket (one tensor: buckets never split a segment).
  template <class F>
  void update_reduced(std::int64_t lo, std::int64_t hi, F&& f) {
    const std::int64_t n = hi - lo;
    if (n <= 0) return;
    if (local_) {
      if constexpr (std::is_same_v<Grad, Reduce>) {
        f(model_->grads() + lo, n);
      } else {
        tensor<Reduce, Backend> v = kernels::make_tensor<Reduce>(*ctx_, n);
        copy_or_cast(v.data(), model_->grads() + lo, n);
        f(v.data(), n);
        copy_or_cast(model_->grads() + lo, v.data(), n);
      }
      return;
    }
    std::size_t k = 0;  // the bucket holding lo (buckets run from the head down)
    while (k < plan_->size() && !(plan_->buckets()[k].begin <= lo && lo < plan_->buckets()[k].end))
      ++k;
    TESSERA_EXPECTS(k < plan_->size() && hi <= plan_->buckets()[k].end,
                    "update_reduced: the range spans buckets");
    const bucket& b = plan_->buckets()[k];
    if constexpr (S::collective == bucket_collective::all_reduce) {
      Reduce* v = staging_.data() + b.staging_offset + (lo - b.begin);
      f(v, n);
      if (!in_place_) copy_or_cast(model_->grads() + lo, v, n);
    } else {
      tensor<Reduce, Backend> all = kernels::make_tensor<Reduce>(*ctx_, b.padded);
      comm_->all_gather(reduced_chunk(b), all.data(), static_cast<std::size_t>(b.chunk));
      f(all.data() + (lo - b.begin), n);
      const auto [a, e] = plan_->owned(k);
      const std::int64_t x0 = std::max(a, lo), x1 = std::min(e, hi);
      if (x0 < x1)
        kernels::copy_elements(*ctx_, reduced_chunk(b) + (x0 - a), all.data() + (x0 - b.begin),
                               x1 - x0);
    }
  }

  // ---- what it counts ----
  /// Bytes kept between steps (the padded buffer or the shard).
  std::size_t persistent_bytes() const { return staging_.bytes() + shard_.bytes(); }
  /// Bucket gradient buffers allocated now (zero<2,3>; 0 between steps).
  std::size_t buckets_held() const {
    std::size_t n = 0;
    for (const auto& w : window_) n += w.held();
    for (const auto& p : pending_) n += p.buf.held();
    return n;
  }
  /// The most bucket gradient buffers held at once since begin_step().
  std::size_t max_buckets_held() const { return max_window_; }
  /// Bytes of the transient buffers held at their most since construction.
  std::size_t max_transient_bytes() const { return max_transient_; }
  const std::vector<std::int64_t>& reductions_per_bucket() const { return reductions_; }
  const std::vector<reduction_event>& reductions_this_step() const { return events_; }

 private:
  using request = decltype(std::declval<C&>().iall_reduce(static_cast<float*>(nullptr),
                                                          std::size_t{0}, comm::reduce_op::sum));
  // zero<2,3>: one bucket's gradients while they are filled and reduced.
  struct bucket_buffer {
    // (padded if Grad is Reduce, else numel) the bucket's gradients in flat
    // order; with Grad == Reduce also the reduce-scatter's send buffer.
    tensor<Grad, Backend> grads;
    tensor<Reduce, Backend> send;  // Grad != Reduce: (padded) the converted send buffer
    tensor<Reduce, Backend> recv;  // per_micro_batch after the first: (chunk) the reduced chunk
    std::size_t held() const { return !grads.empty() || !send.empty(); }
    std::size_t bytes() const { return grads.bytes() + send.bytes() + recv.bytes(); }
  };
  // Members in this order: a reduction dropped unsettled (an exception)
  // waits (the request's destructor) before its buffers are freed.
  struct pending_reduction {
    int bucket;
    bucket_buffer buf;  // zero<2,3>: the buffers the reduction reads and writes
    request req;
  };

  // dst[0, n) = src[0, n), converted element by element when the types differ.
  template <class To, class From>
  void copy_or_cast(To* dst, const From* src, std::int64_t n) const {
    if constexpr (std::is_same_v<To, From>)
      kernels::copy_elements(*ctx_, dst, src, n);
    else
      cast(*ctx_, dst, src, n);
  }
  void point_at_staging() {
    for (const bucket& b : plan_->buckets())
      for (int t = b.first_segment; t <= b.last_segment; ++t)
        model_->set_segment_grads(t, reinterpret_cast<Grad*>(staging_.data()) + b.staging_offset +
                                         (model_->segment_begin(t) - b.begin));
  }
  std::size_t transient_bytes() const {
    std::size_t n = 0;
    for (const auto& w : window_) n += w.bytes();
    for (const auto& p : pending_) n += p.buf.bytes();
    return n;
  }
  // The high-water marks, with `extra` bytes held outside window_ and pending_.
  void note_transient(std::size_t extra = 0) {
    max_transient_ = std::max(max_transient_, transient_bytes() + extra);
    max_window_ = std::max(max_window_, buckets_held());
  }

  // zero<2,3>: makes sure the bucket holding segment s has its buffer
  // (allocated zeroed when the window's, or under per_micro_batch the
  // micro-batch's, first backward reaches it) and points the model's
  // segments of the bucket at it. Under per_micro_batch at most two bucket
  // buffers are held: the oldest reduction completes first (complete: the
  // context's work ordered after it, its buffer freed).
  void open_bucket(int s) {
    const int k = plan_->bucket_of_segment(s);
    bucket_buffer& w = window_[static_cast<std::size_t>(k)];
    if (w.held()) return;
    if (policy_ == grad_reduction::per_micro_batch)
      while (buckets_held() >= 2 && !pending_.empty()) {
        pending_reduction p = std::move(pending_.front());
        pending_.pop_front();
        complete(p);
      }
    const bucket& b = plan_->buckets()[static_cast<std::size_t>(k)];
    const std::int64_t n = std::is_same_v<Grad, Reduce> ? b.padded : b.numel();
    w.grads = kernels::make_tensor<Grad>(*ctx_, n);
    kernels::zero_elements(*ctx_, w.grads.data(), n);
    for (int t = b.first_segment; t <= b.last_segment; ++t)
      model_->set_segment_grads(t, w.grads.data() + (model_->segment_begin(t) - b.begin));
    note_transient();
  }
  // zero<2,3>: frees every bucket buffer. Precondition: no reduction pending.
  void release_window() {
    for (std::size_t k = 0; k < window_.size(); ++k) {
      const bucket& b = plan_->buckets()[k];
      for (int t = b.first_segment; t <= b.last_segment; ++t) model_->set_segment_grads(t, nullptr);
      window_[k] = {};
    }
  }

  // Starts bucket k's reduction after segment `after_segment`'s backward.
  void launch(int k, int after_segment) {
    TESSERA_NVTX_RANGE(S::collective == bucket_collective::reduce_scatter ? "reduce_scatter bucket "
                                                                          : "all_reduce bucket ",
                       k);
    const bucket& b = plan_->buckets()[static_cast<std::size_t>(k)];
    pending_reduction p{k, {}, request{}};
    if constexpr (S::gradients == grad_home::shard) {
      // Per micro-batch, the reductions before this one complete first (they
      // had this bucket's backward to do it in): one bucket reducing, the
      // next one filling, at any time.
      if (policy_ == grad_reduction::per_micro_batch) drain();
      // The bucket buffer moves to the reduction; the next micro-batch (per
      // micro-batch) opens a new one.
      p.buf = std::move(window_[static_cast<std::size_t>(k)]);
      window_[static_cast<std::size_t>(k)] = {};
      TESSERA_THROW_IF(p.buf.grads.empty(), error, "bucket ", k,
                       " has no gradient buffer at its reduction (no backward reached it)");
      for (int t = b.first_segment; t <= b.last_segment; ++t) model_->set_segment_grads(t, nullptr);
      Reduce* send;
      if constexpr (std::is_same_v<Grad, Reduce>) {
        send = p.buf.grads.data();  // padding zero since allocation
      } else {
        p.buf.send = kernels::make_tensor<Reduce>(*ctx_, b.padded);
        send = p.buf.send.data();
        cast(*ctx_, send, p.buf.grads.data(), b.numel());
        kernels::zero_elements(*ctx_, send + b.numel(), b.padded - b.numel());
        note_transient(p.buf.bytes());
        p.buf.grads.release();
      }
      // The first reduction of the bucket this step writes the shard; a
      // later micro-batch's goes to a chunk of its own, added on completion.
      Reduce* out = shard_.data() + b.shard_offset;
      if (reduced_once_[static_cast<std::size_t>(k)]) {
        p.buf.recv = kernels::make_tensor<Reduce>(*ctx_, b.chunk);
        out = p.buf.recv.data();
        note_transient(p.buf.bytes());
      }
      reduced_once_[static_cast<std::size_t>(k)] = true;
      p.req = comm_->ireduce_scatter(send, out, static_cast<std::size_t>(b.chunk),
                                     comm::reduce_op::sum);
    } else {
      Reduce* buf = staging_.data() + b.staging_offset;
      if (!in_place_) {
        copy_or_cast(buf, model_->grads() + b.begin, b.numel());
        kernels::zero_elements(*ctx_, buf + b.numel(), b.padded - b.numel());
      }
      if constexpr (S::collective == bucket_collective::reduce_scatter)
        p.req = comm_->ireduce_scatter(buf, buf + plan_->rank() * b.chunk,
                                       static_cast<std::size_t>(b.chunk), comm::reduce_op::sum);
      else
        p.req = comm_->iall_reduce(buf, static_cast<std::size_t>(b.padded), comm::reduce_op::sum);
    }
    pending_.push_back(std::move(p));
    note_transient();
    ++reductions_[static_cast<std::size_t>(k)];
    events_.push_back({k, micro_, after_segment});
  }

  // A reduction whose output is needed now: the context's later work is
  // ordered after it (a device request: on the stream, the host goes on),
  // a later micro-batch's reduced chunk is added into the shard, its
  // buffers are freed (the caller drops them) and its request waits for
  // the host in settling_.
  void complete(pending_reduction& p) {
    order_before(p.req, *ctx_);
    settling_.push_back(std::move(p.req));
    if constexpr (S::gradients == grad_home::shard) {
      if (!p.buf.recv.empty()) {
        const bucket& b = plan_->buckets()[static_cast<std::size_t>(p.bucket)];
        Reduce* acc = shard_.data() + b.shard_offset;
        residual_add(*ctx_, acc, acc, p.buf.recv.data(), b.chunk);  // (kernels::residual_add)
      }
    }
  }
  void drain() {
    while (!pending_.empty()) {
      pending_reduction p = std::move(pending_.front());
      pending_.pop_front();
      TESSERA_NVTX_RANGE("order after reduction of bucket ", p.bucket);
      complete(p);
    }
  }
  // The host waits for every completed reduction, in issue order (comm_error
  // for a failure or the timeout).
  void settle() {
    TESSERA_NVTX_RANGE("wait reductions");
    while (!settling_.empty()) {
      settling_.front().wait();
      settling_.pop_front();
    }
  }

  Model* model_;
  const Ctx* ctx_;
  C* comm_;
  const bucket_plan* plan_;
  grad_reduction policy_;
  bool local_;                             // one rank under zero<0>: nothing to reduce
  bool in_place_;                          // the model accumulates into staging_
  tensor<Reduce, Backend> staging_;        // zero<0,1>: (staging_size) the padded buckets
  tensor<Reduce, Backend> shard_;          // zero<2,3>: (shard_size) the reduced-gradient shard
  std::vector<bucket_buffer> window_;      // zero<2,3>: bucket k's buffer while it fills
  std::vector<bool> reduced_once_;         // zero<2,3>: bucket k reduced this step already
  std::deque<pending_reduction> pending_;  // issued, not yet ordered before the context
  std::deque<request> settling_;           // ordered before the context, not yet waited for
  std::vector<std::int64_t> reductions_;   // per bucket, since construction
  std::vector<std::int64_t> backwards_;    // per segment: backwards of this step so far
  std::vector<reduction_event> events_;
  std::size_t max_window_ = 0, max_transient_ = 0;
  std::int64_t micro_ = 0, micro_batches_ = 1;
};

}  // namespace tessera::parallel
