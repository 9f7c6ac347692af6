#pragma once
/// \file parallel/zero.hpp
/// `data_parallel<Model, Optimizer, Sharding, Comm>`: the data-parallel
/// engine of one rank, under a sharding strategy `zero<0..3>`
/// (parallel/sharding.hpp), written once for every backend. It owns what
/// the strategy shards (optimizer state, reduced gradients, parameter
/// shards) in the model's backend memory, hooks into the model per segment
/// (nn/segment_hooks.hpp), and runs the collectives through a communicator
/// whose buffers live in that same memory (host memory: local_communicator,
/// mpi_communicator; device memory: nccl_communicator). A mismatch does not
/// compile.
///
/// One optimizer step (the trainer's executor drives it; seeds/004 "Data
/// parallelism" and "Sharding: ZeRO and FSDP"; Rajbhandari et al. 2020):
///
///   begin_step(A); for each micro-batch: begin_micro_batch(m);
///   model.forward(...); model.backward(...) -- gradients accumulate
///       locally; a bucket's reduction starts (async) as soon as the A-th
///       backward of the step has produced all of its gradients, while
///       earlier segments still compute (no_sync before that: whatever the
///       schedule's order of forwards and backwards);
///   finish_gradients()           -- waits for every reduction;
///   grad_norm_squared(d_out)     -- over every shard and rank, each element
///       once (one float64 all_reduce), into the context's memory;
///   step(lr, d_clip)             -- the optimizer on the owned elements,
///       then ZeRO-1/2 all-gather the updated parameters.
///
/// One rank (comm.size() == 1) under zero<0> has nothing to reduce: no
/// buckets are staged and the norm is one pass over the model's flat
/// gradient buffer, the single-rank step.
///
/// What each stage keeps per rank (Psi = parameters, padded per bucket;
/// R = reduce_type_t<P>):
///
///   zero<0>: full parameters, full optimizer state (master weights and
///            moments), full gradients, a persistent padded staging buffer
///            (Psi R; none on one rank); each bucket is all-reduced.
///   zero<1>: full parameters and gradients, optimizer state and a Param
///            copy of the shard (Psi/N), reduced-gradient shard (Psi/N R),
///            persistent staging; buckets are reduce-scattered, the updated
///            shard all-gathered.
///   zero<2>: as zero<1>, but no full gradient buffer and no staging buffer
///            between steps: only the reduced-gradient shard. Each bucket's
///            full-size (padded) gradient buffer exists only during the
///            accumulation window: allocated, zeroed, when the window's
///            first backward reaches the bucket, the model pointed at it
///            (llama::set_segment_grads; build the model with
///            llama_options::external_grads), accumulated over the window's
///            micro-batches (no_sync, as FSDP's), reduce-scattered from in
///            place once the bucket is complete, and freed as soon as that
///            reduce-scatter completes (tested after every later hook,
///            waited for at the latest in finish_gradients()).
///   zero<3>: as zero<2>, and no full parameter buffer: every segment (one
///            bucket each) is all-gathered before its forward and again
///            before its backward, freed after use, the next segment's gather
///            issued before the current one computes (prefetch).
///
/// Communication per optimizer step and rank, ring formulas of
/// comm/communicator.hpp, N ranks, P_k padded bucket sizes, A micro-batches:
///   zero<0>:   sum_k 2(N-1)/N P_k sizeof(R)                 (all_reduce)
///   zero<1,2>: sum_k (N-1)/N P_k (sizeof(R) + sizeof(Param)) (RS + AG)
///   zero<3>:   sum_k (N-1)/N P_k sizeof(R) + (N-1)/N sizeof(Param) *
///              (A (2 Psi_pad - P_head))                     (RS + AG fwd, bwd)
/// (the head's forward and backward are fused, so it is gathered once per
/// micro-batch), plus the trainer's 1-element all_reduces (scored tokens,
/// loss, norm). With R = Param = float32 and A = 1, ZeRO-1/2 equal zero<0>
/// and ZeRO-3 is 1.5x it less the head's second gather (ZeRO paper, section 7).
///
/// Determinism: the same sizes, ranks and communicator give the same bits.
/// Under local_communicator, all_reduce and reduce_scatter add each element
/// in the same ring order (the buckets are padded to equal chunks), the norm
/// is summed over the same chunks in the same order, and the optimizer is
/// element-wise, so zero<0..3> agree bit for bit when their buckets agree
/// (zero<3> uses one bucket per segment: give the others a bucket size
/// below the smallest segment to compare).
///
/// Streams (device communicators): the collectives run on the
/// communicator's stream, which must be the context's compute stream (the
/// constructor throws otherwise), so kernels, collectives and the caching
/// allocator's reuse of freed blocks are ordered on one stream. Collectives
/// therefore do not overlap compute on a GPU.
///
/// Thread-safety: one engine per rank, used from that rank's thread.
///
/// Profiling: each bucket reduction's issue and wait, each all-gather, the
/// gradient norm and the optimizer step are NVTX ranges (core/nvtx.hpp).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/nvtx.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/kernels/optimizer.hpp"
#include "tessera/nn/segment_hooks.hpp"
#include "tessera/optim/optimizer.hpp"
#include "tessera/parallel/buckets.hpp"
#include "tessera/parallel/sharding.hpp"
#include "tessera/precision/policy.hpp"

namespace tessera::parallel {

/// Run-time settings of the data-parallel engine.
struct data_parallel_options {
  /// Bucket capacity in bytes of the reduce type (default 25 MB, as DDP).
  /// Ignored by zero<3>, which reduces and gathers per segment.
  std::int64_t bucket_bytes = default_bucket_bytes;
  /// zero<3>: issue the next segment's all-gather before the current
  /// segment computes.
  bool prefetch = true;
  /// Throws config_error if bucket_bytes < 1.
  void validate() const {
    TESSERA_THROW_IF(bucket_bytes < 1, config_error, "bucket_bytes=", bucket_bytes,
                     " must be >= 1");
  }
};

/// One bucket reduction, as issued: which bucket, in which micro-batch of the
/// step, and after which segment's backward (the overlap: a bucket issued
/// after segment s > -1 overlaps the backward of segments below s).
struct reduction_event {
  int bucket = 0;
  std::int64_t micro_batch = 0;
  int after_segment = 0;
};

/// The data-parallel engine of one rank (file comment). `Model` is an
/// nn::llama (or a stage of one), `O` an optimizer policy, `S` a sharding
/// strategy (zero<0..3>), `C` a communicator over the dp ranks whose
/// buffer space is the model's backend memory. Holds references to the
/// model and the communicator (not owned).
template <class Model, optim::optimizer_policy O, sharding_strategy S, comm::communicator C>
class data_parallel final : public nn::segment_hooks {
 public:
  using precision_type = typename Model::precision_type;
  using P = precision_type;
  using Backend = typename Model::backend_type;
  using Ctx = typename Model::context_type;
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  using Master = typename P::master_type;
  using Reduce = reduce_type_t<P>;
  using model_type = Model;
  using sharding_type = S;
  /// The optimizer over the whole flat buffer (zero<0>) or this rank's shard.
  using optimizer_type =
      typename O::template state<Param, std::conditional_t<S::shards_optimizer_state, Reduce, Grad>,
                                 Master, Ctx>;
  static_assert(comm::comm_element<Reduce>,
                "reduce_type_t<P> must be a comm_element (float or double)");
  static_assert(comm::comm_element<Param> || sizeof(Param) == 2,
                "parameters are all-gathered as themselves or, 2-byte types, as 32-bit words");
  static_assert((comm::buffer_space_of<C> == comm::buffer_space::host) == Ctx::host_accessible,
                "data_parallel: the communicator's buffer space and the model's backend memory "
                "differ: host-memory communicators (local_communicator, mpi_communicator) go with "
                "the host backend, device-memory ones (nccl_communicator) with the cuda backend");

  /// Builds the buckets and the shard of rank comm.rank() of comm.size(),
  /// allocates what the stage keeps (now, so the memory floor is visible
  /// before step 0), installs itself as the model's hooks, and initialises
  /// the optimizer (and, under zero<3>, the parameter shard from `seed`).
  /// Preconditions: under zero<0..2> the model's weights are initialised,
  /// the same on every rank (init_weights(seed)); under zero<3> the model was
  /// built with llama_options::external_params. Under zero<2,3> the model
  /// should be built with llama_options::external_grads (else its flat
  /// gradient buffer stays allocated, unused). Throws config_error naming
  /// the values if the model's parameter storage does not match the stage,
  /// zero<0,1> get a model without a gradient buffer, or a device
  /// communicator's stream is not the model context's stream.
  data_parallel(Model& model, C& comm, typename O::config opt_cfg, std::uint64_t seed,
                data_parallel_options opt = {})
      : model_(&model),
        ctx_(&model.context()),
        comm_(&comm),
        opt_(checked(opt, model)),
        local_(S::stage == 0 && comm.size() == 1),
        plan_(segments(model), comm.size(), comm.rank(),
              std::max<std::int64_t>(1, opt.bucket_bytes / std::int64_t{sizeof(Reduce)}),
              S::shards_parameters),
        optimizer_(make_optimizer(opt_cfg)) {
    const Ctx& ctx = *ctx_;
    if constexpr (requires { comm.stream(); ctx.stream(); }) {
      TESSERA_THROW_IF(static_cast<const void*>(comm.stream()) !=
                           static_cast<const void*>(ctx.stream()),
                       config_error, "data_parallel: the communicator's stream ", comm.stream(),
                       " is not the model context's stream ", ctx.stream(),
                       ": build the context on the communicator's stream");
    }
    const std::size_t nb = plan_.size();
    reductions_.assign(nb, 0);
    backwards_.assign(static_cast<std::size_t>(model.last_segment() - model.first_segment() + 1),
                      0);
    if constexpr (!S::shards_gradients) {
      if (!local_) {
        staging_ = kernels::make_tensor<Reduce>(ctx, plan_.staging_size());
        kernels::zero_elements(ctx, staging_.data(), plan_.staging_size());
      }
    } else {
      // Gradients go to the window buffers only (a model built without
      // external_grads keeps an unused flat buffer).
      window_.resize(nb);
      for (int t = model.first_segment(); t <= model.last_segment(); ++t)
        model.set_segment_grads(t, nullptr);
    }
    if constexpr (S::shards_optimizer_state) {
      shard_grads_ = kernels::make_tensor<Reduce>(ctx, plan_.shard_size());
      kernels::zero_elements(ctx, shard_grads_.data(), plan_.shard_size());
      shard_params_ = kernels::make_tensor<Param>(ctx, plan_.shard_size());
      kernels::zero_elements(ctx, shard_params_.data(), plan_.shard_size());
      for (std::size_t k = 0; k < nb; ++k) {
        const auto [lo, hi] = plan_.owned(k);
        Param* dst = shard_params_.data() + plan_.buckets()[k].shard_offset;
        if constexpr (S::shards_parameters) {
          std::vector<Param> h(static_cast<std::size_t>(hi - lo));
          model.init_weights_range(seed, lo, hi, h.data());
          ctx.from_host(dst, h.data(), h.size() * sizeof(Param));
        } else {
          kernels::copy_elements(ctx, dst, model.params() + lo, hi - lo);
        }
      }
      optimizer_.init_master(shard_params_.data());
    } else {
      optimizer_.init_master(model.params());
    }
    if constexpr (S::shards_parameters) gathered_.resize(nb);
    model.set_hooks(this);
  }
  /// Waits for any collective still in flight (its buffers are about to be
  /// freed) and uninstalls the hooks. Errors of those collectives are
  /// dropped here: they were or will be reported by the peers.
  ~data_parallel() override {
    try {
      drain();
      for (auto& g : gathered_)
        if (g.req) g.req->wait();
    } catch (...) {
    }
    if constexpr (S::shards_gradients) {
      release_window();
      model_->reset_segment_grads();
    }
    model_->set_hooks(nullptr);
  }
  data_parallel(const data_parallel&) = delete;
  data_parallel& operator=(const data_parallel&) = delete;

  /// The buckets and this rank's shard.
  const bucket_plan& plan() const { return plan_; }
  /// The optimizer: over the whole flat buffer (zero<0>) or this rank's
  /// shard-local buffer (zero<1..3>, plan().shard_ranges offsets).
  optimizer_type& optimizer() { return optimizer_; }
  const optimizer_type& optimizer() const { return optimizer_; }
  /// The communicator over the dp ranks (not owned).
  C& communicator() { return *comm_; }
  /// This rank's parameter shard (shard-local order, plan().shard_size()
  /// elements, the context's memory); null under zero<0>.
  const Param* shard_params() const { return shard_params_.data(); }
  /// Bucket reductions issued since construction, per bucket.
  const std::vector<std::int64_t>& reductions_per_bucket() const { return reductions_; }
  /// The bucket reductions of the current (or last) step, in issue order.
  const std::vector<reduction_event>& reductions_this_step() const { return events_; }
  /// zero<3>: segments whose gathered parameters are allocated now (0
  /// between passes: every gathered block is freed after use).
  std::size_t segments_held() const { return held_; }
  /// zero<3>: the most segments held at once since begin_step(): 2 with
  /// prefetch (the one computing and the next one arriving), 1 without.
  std::size_t max_segments_held() const { return max_held_; }
  /// zero<2,3>: bucket gradient buffers allocated now (0 between steps:
  /// each is freed once its reduce-scatter completes).
  std::size_t grad_buckets_held() const {
    std::size_t n = 0;
    for (const auto& w : window_) n += !w.grads.empty() || !w.send.empty();
    return n;
  }
  /// zero<2,3>: the most bucket gradient buffers held at once since
  /// begin_step() (every bucket under accumulation: the window's no_sync
  /// micro-batches fill them all).
  std::size_t max_grad_buckets_held() const { return max_window_; }
  /// Bytes this engine keeps allocated between steps (staging, reduced
  /// gradient shard, parameter shard, optimizer state).
  std::size_t persistent_bytes() const {
    return staging_.bytes() + shard_grads_.bytes() + shard_params_.bytes() +
           optimizer_.state_bytes();
  }
  /// True when this engine reduces nothing (one rank under zero<0>).
  bool single_rank() const { return local_; }

  /// Starts an optimizer step of `micro_batches` backward passes: a bucket
  /// reduces once the last of them has produced its gradients. Throws
  /// tessera::error if reductions of the previous step were never waited
  /// for, config_error if micro_batches < 1.
  void begin_step(std::int64_t micro_batches) {
    TESSERA_THROW_IF(!pending_.empty(), error, "begin_step: ", pending_.size(),
                     " reductions of the previous step were never waited for");
    TESSERA_THROW_IF(micro_batches < 1, config_error, "begin_step: micro_batches=",
                     micro_batches, " must be >= 1");
    micro_batches_ = micro_batches;
    std::fill(backwards_.begin(), backwards_.end(), 0);
    events_.clear();
    max_held_ = held_;
    if constexpr (S::shards_gradients) {
      release_window();  // what an abandoned window left
      max_window_ = 0;
    }
  }
  /// After a step that threw part-way: waits for the reductions it issued
  /// (their errors dropped: the step's own exception is the one to report)
  /// and frees what it held, so that the next begin_step() can start. The
  /// gradients are those of a partial step; the next step zeroes them.
  void abandon_step() noexcept {
    try {
      drain();
    } catch (...) {
      pending_.clear();
    }
    if constexpr (S::shards_gradients) release_window();
  }
  /// Before micro-batch `m` (0-based, for the reduction log) of the step
  /// runs a training forward (whose backward follows).
  void begin_micro_batch(std::int64_t m) {
    micro_ = m;
    backward_follows_ = true;
  }
  /// Before a forward-only pass (evaluation, generation): no reductions;
  /// zero<3> gathers forward only.
  void begin_forward_only() { backward_follows_ = false; }

  /// Waits for every bucket reduction of the step (in issue order).
  /// zero<0> copies the all-reduced buckets back into the model's gradient
  /// buffer; zero<2,3> have freed every bucket gradient buffer when it
  /// returns (each as soon as its reduce-scatter completed). Throws
  /// tessera::error if not every bucket was reduced exactly once (the model
  /// ran without this engine's hooks, or fewer backwards than begin_step
  /// announced), and comm_error from a failed collective.
  void finish_gradients() {
    if (local_) return;
    TESSERA_NVTX_RANGE("zero: finish_gradients");
    drain();
    if constexpr (S::shards_gradients) release_window();
    TESSERA_THROW_IF(events_.size() != plan_.size(), error, "finish_gradients: ", events_.size(),
                     " bucket reductions this step, expected exactly ", plan_.size(),
                     " (one per bucket: did every micro-batch announced to begin_step run its "
                     "backward, with this engine as the model's hooks?)");
    if constexpr (!S::shards_optimizer_state) {
      Grad* g = model_->grads();
      for (const bucket& b : plan_.buckets())
        copy_or_cast(g + b.begin, staging_.data() + b.staging_offset, b.numel());
    }
  }

  /// Sum of squares of the reduced gradient over every element of every
  /// shard on every rank, each element once (padding is zero), in float64,
  /// into `*d_out` (one double in the context's memory): each rank sums its
  /// chunks (kernels::grad_sum_squares per chunk, in bucket order), then one
  /// all_reduce. One rank under zero<0>: one pass over the model's flat
  /// gradient buffer. Collective. Call after finish_gradients(). The same
  /// as local_grad_norm_squared(d_out) then reduce_grad_norm_squared(d_out).
  void grad_norm_squared(double* d_out) {
    local_grad_norm_squared(d_out, false);
    reduce_grad_norm_squared(d_out);
  }
  /// This rank's part of grad_norm_squared, written (or, with `accumulate`,
  /// added) to `*d_out`: its reduced chunks (under tensor parallelism the
  /// ranges nn::llama::norm_ranges counts on this tp rank). No
  /// communication. A pipeline rank holding several model chunks sums
  /// every chunk's part before one reduce_grad_norm_squared.
  void local_grad_norm_squared(double* d_out, bool accumulate) {
    TESSERA_NVTX_RANGE("zero: grad_norm_squared");
    const Ctx& ctx = *ctx_;
    if (model_->tp_size() > 1) {
      tp_local_norm_squared(d_out, accumulate);
      return;
    }
    if (local_) {
      grad_sum_squares(ctx, d_out, model_->grads(), model_->flat_size(), accumulate);
      return;
    }
    bool first = !accumulate;
    for (const bucket& b : plan_.buckets()) {
      grad_sum_squares(ctx, d_out, reduced_chunk(b), b.chunk, !first);
      first = false;
    }
  }
  /// Sums the parts of local_grad_norm_squared over the dp group and then
  /// the tp group (collective over both; nothing on one rank).
  void reduce_grad_norm_squared(double* d_out) {
    if (!local_) comm_->all_reduce(d_out, 1, comm::reduce_op::sum);
    if (model_->tp_size() > 1) model_->tp_all_reduce_sum(d_out);
  }

  /// The optimizer on the owned elements with the clip coefficient `*d_clip`
  /// (one Master in the context's memory; a non-finite one skips the step
  /// inside the kernel); zero<1,2> then all-gather the updated shards into
  /// every rank's full parameters (in Param, the compute dtype). Collective
  /// for zero<1,2>.
  void step(double lr, const Master* d_clip) {
    TESSERA_NVTX_RANGE("zero: optimizer step");
    if constexpr (!S::shards_optimizer_state) {
      optimizer_.step(model_->params(), model_->grads(), lr, d_clip);
    } else {
      optimizer_.step(shard_params_.data(), shard_grads_.data(), lr, d_clip);
      if constexpr (!S::shards_parameters) gather_all_params();
    }
  }

  /// Writes the full parameters of this rank into out[0, flat_size())
  /// (the context's memory; zero<3>: all-gathers every segment; collective).
  void full_params(Param* out) {
    const Ctx& ctx = *ctx_;
    if constexpr (S::shards_parameters) {
      for (int s = model_->first_segment(); s <= model_->last_segment(); ++s) {
        acquire(s);
        kernels::copy_elements(ctx, out + model_->segment_begin(s), model_->segment_params(s),
                               model_->segment_end(s) - model_->segment_begin(s));
        release(s);
      }
    } else {
      kernels::copy_elements(ctx, out, model_->params(), model_->flat_size());
    }
  }

  /// Writes this rank's full reduced gradient (summed over dp and the
  /// micro-batches, before clipping: the optimizer scales by the clip
  /// coefficient without writing it back) into out[0, flat_size()) (the
  /// context's memory, in Grad). zero<0>: the model's flat gradient buffer;
  /// zero<1..3>: every bucket's reduced chunks all-gathered over dp
  /// (collective). Call after finish_gradients() and before the next step's
  /// begin_step(). Under tensor parallelism `out` holds this tp rank's
  /// shards in the model's layout (nn::param_layout).
  void full_grads(Grad* out) {
    if constexpr (!S::shards_optimizer_state)
      kernels::copy_elements(*ctx_, out, model_->grads(), model_->flat_size());
    else
      gather_buckets(shard_grads_.data(), out);
  }

  // ---- segment hooks (nn/segment_hooks.hpp) ----
  void before_forward(int s) override {
    // The head's forward and backward are fused: its gradients are written
    // before its after_backward with no before_backward.
    if constexpr (S::shards_gradients)
      if (backward_follows_ && s == model_->last_segment() && has_head()) open_bucket(s);
    if constexpr (S::shards_parameters) {
      acquire(s);
      if (opt_.prefetch) {
        if (s < model_->last_segment())
          issue_gather(s + 1);
        else if (backward_follows_ && s - 1 >= model_->first_segment())
          issue_gather(s - 1);
      }
    }
    poll();
  }
  void after_forward(int s) override {
    if constexpr (S::shards_parameters) release(s);
    poll();
  }
  void before_backward(int s) override {
    if constexpr (S::shards_gradients) open_bucket(s);
    if constexpr (S::shards_parameters) {
      acquire(s);
      if (opt_.prefetch && s - 1 >= model_->first_segment()) issue_gather(s - 1);
    }
    poll();
  }
  void after_backward(int s) override {
    if constexpr (S::shards_parameters) release(s);
    const std::int64_t done = ++backwards_[static_cast<std::size_t>(s - model_->first_segment())];
    if (!local_ && done == micro_batches_) {
      const int k = plan_.bucket_of_segment(s);
      if (plan_.buckets()[static_cast<std::size_t>(k)].first_segment == s) launch(k, s);
    }
    poll();  // tests every reduction issued so far, the new one included
  }

 private:
  using request = decltype(std::declval<C&>().iall_reduce(static_cast<float*>(nullptr),
                                                          std::size_t{0}, comm::reduce_op::sum));
  static_assert(
      std::same_as<request, decltype(std::declval<C&>().iall_gather(
                                static_cast<const std::int32_t*>(nullptr),
                                static_cast<std::int32_t*>(nullptr), std::size_t{0}))> &&
          std::same_as<request, decltype(std::declval<C&>().ireduce_scatter(
                                    static_cast<const float*>(nullptr),
                                    static_cast<float*>(nullptr), std::size_t{0},
                                    comm::reduce_op::sum))>,
      "data_parallel: the communicator's asynchronous collectives must return one request type");
  struct gathered_segment {
    tensor<Param, Backend> buf;  // (padded) the segment in flat order, then padding
    std::optional<request> req;
    bool ready = false;
  };
  // zero<2,3>: one bucket's gradients during the accumulation window.
  struct window_bucket {
    // (padded if Grad is Reduce, else numel) the bucket's gradients in flat
    // order; with Grad == Reduce also the reduce-scatter's send buffer.
    tensor<Grad, Backend> grads;
    tensor<Reduce, Backend> send;  // Grad != Reduce: (padded) the converted send buffer
  };
  struct pending_reduction {
    int bucket;
    request req;
  };

  static data_parallel_options checked(data_parallel_options o, const Model& m) {
    o.validate();
    TESSERA_THROW_IF(S::shards_parameters && m.params() != nullptr, config_error, S::name,
                     " shards the parameters: build the model with "
                     "llama_options::external_params = true");
    TESSERA_THROW_IF(!S::shards_parameters && m.params() == nullptr, config_error, S::name,
                     " needs the model's full parameter buffer (external_params = false)");
    TESSERA_THROW_IF(!S::shards_gradients && m.grads() == nullptr, config_error, S::name,
                     " needs the model's full gradient buffer (external_grads = false)");
    return o;
  }
  static std::vector<segment_range> segments(const Model& m) {
    std::vector<segment_range> v;
    for (int s = m.first_segment(); s <= m.last_segment(); ++s)
      v.push_back({s, m.segment_begin(s), m.segment_end(s)});
    return v;
  }
  bool has_head() const { return model_->options().stage.head; }
  optimizer_type make_optimizer(const typename O::config& cfg) const {
    if constexpr (S::shards_optimizer_state)
      return optimizer_type(cfg, plan_.shard_size(), plan_.shard_ranges(model_->param_ranges()),
                            *ctx_);
    else
      return optimizer_type(cfg, model_->flat_size(), model_->param_ranges(), *ctx_);
  }

  // dst[0, n) = src[0, n), converted element by element when the types differ.
  template <class To, class From>
  void copy_or_cast(To* dst, const From* src, std::int64_t n) const {
    if constexpr (std::is_same_v<To, From>)
      kernels::copy_elements(*ctx_, dst, src, n);
    else
      cast(*ctx_, dst, src, n);
  }

  // The norm under tensor parallelism: only the ranges the model counts on
  // this tp rank (nn::llama::norm_ranges: its shards, and the replicated
  // tensors on tp rank 0), within this rank's reduced chunks; summed over
  // dp and then over tp by reduce_grad_norm_squared, so every element of
  // the model counts once.
  void tp_local_norm_squared(double* d_out, bool accumulate) {
    const Ctx& ctx = *ctx_;
    const std::vector<nn::param_range> counted = model_->norm_ranges();
    bool first = !accumulate;
    // [lo, hi) of the flat buffer, read from `base` (which holds element lo).
    auto add = [&](const auto* base, std::int64_t lo, std::int64_t hi) {
      for (const nn::param_range& r : counted) {
        const std::int64_t b = std::max(r.begin, lo), e = std::min(r.end, hi);
        if (b >= e) continue;
        grad_sum_squares(ctx, d_out, base + (b - lo), e - b, !first);
        first = false;
      }
    };
    if (local_) {
      add(model_->grads(), 0, model_->flat_size());
    } else {
      for (const bucket& b : plan_.buckets()) {
        const std::int64_t c0 = b.begin + plan_.rank() * b.chunk;
        add(reduced_chunk(b), c0, std::min(c0 + b.chunk, b.end));
      }
    }
    if (first) grad_sum_squares(ctx, d_out, static_cast<const Reduce*>(nullptr), 0, false);
  }

  // This rank's reduced chunk of bucket b.
  const Reduce* reduced_chunk(const bucket& b) const {
    if constexpr (S::shards_optimizer_state)
      return shard_grads_.data() + b.shard_offset;
    else
      return staging_.data() + b.staging_offset + plan_.rank() * b.chunk;
  }

  // zero<2,3>: makes sure the bucket holding segment s has its window
  // gradient buffer (allocated zeroed on the window's first backward to
  // reach it) and points the model's segments of the bucket at it.
  void open_bucket(int s) {
    const int k = plan_.bucket_of_segment(s);
    window_bucket& w = window_[static_cast<std::size_t>(k)];
    if (!w.grads.empty() || !w.send.empty()) return;  // open, or reducing
    const bucket& b = plan_.buckets()[static_cast<std::size_t>(k)];
    const std::int64_t n = std::is_same_v<Grad, Reduce> ? b.padded : b.numel();
    w.grads = kernels::make_tensor<Grad>(*ctx_, n);
    kernels::zero_elements(*ctx_, w.grads.data(), n);
    for (int t = b.first_segment; t <= b.last_segment; ++t)
      model_->set_segment_grads(t, w.grads.data() + (model_->segment_begin(t) - b.begin));
    std::size_t open = 0;
    for (const auto& x : window_) open += !x.grads.empty() || !x.send.empty();
    max_window_ = std::max(max_window_, open);
  }
  // zero<2,3>: frees bucket k's window buffers (its reduction is complete or
  // was never started) and unpoints the model's segments.
  void close_bucket(int k) {
    window_bucket& w = window_[static_cast<std::size_t>(k)];
    const bucket& b = plan_.buckets()[static_cast<std::size_t>(k)];
    for (int t = b.first_segment; t <= b.last_segment; ++t) model_->set_segment_grads(t, nullptr);
    w.grads.release();
    w.send.release();
  }
  // zero<2,3>: frees every window buffer. Precondition: no reduction pending.
  void release_window() {
    for (std::size_t k = 0; k < window_.size(); ++k) close_bucket(static_cast<int>(k));
  }

  // Starts bucket k's reduction. zero<0,1>: copies the model's gradients of
  // the bucket into its padded staging buffer. zero<2,3>: reduce-scatters
  // the bucket's window buffer in place (converted first when Grad is not
  // Reduce), which is freed once the reduction completes.
  void launch(int k, int after_segment) {
    TESSERA_NVTX_RANGE(S::shards_optimizer_state ? "reduce_scatter bucket " : "all_reduce bucket ",
                       k);
    const Ctx& ctx = *ctx_;
    const bucket& b = plan_.buckets()[static_cast<std::size_t>(k)];
    Reduce* buf;
    if constexpr (S::shards_gradients) {
      window_bucket& w = window_[static_cast<std::size_t>(k)];
      TESSERA_THROW_IF(w.grads.empty(), error, "bucket ", k,
                       " has no gradient buffer at its reduction (no backward reached it)");
      for (int t = b.first_segment; t <= b.last_segment; ++t)
        model_->set_segment_grads(t, nullptr);
      if constexpr (std::is_same_v<Grad, Reduce>) {
        buf = w.grads.data();  // padding zero since allocation
      } else {
        w.send = kernels::make_tensor<Reduce>(ctx, b.padded);
        buf = w.send.data();
        cast(ctx, buf, w.grads.data(), b.numel());
        kernels::zero_elements(ctx, buf + b.numel(), b.padded - b.numel());
        w.grads.release();
      }
    } else {
      buf = staging_.data() + b.staging_offset;
      copy_or_cast(buf, model_->grads() + b.begin, b.numel());
      kernels::zero_elements(ctx, buf + b.numel(), b.padded - b.numel());
    }
    if constexpr (S::shards_optimizer_state)
      pending_.push_back({k, comm_->ireduce_scatter(buf, shard_grads_.data() + b.shard_offset,
                                                    static_cast<std::size_t>(b.chunk),
                                                    comm::reduce_op::sum)});
    else
      pending_.push_back(
          {k, comm_->iall_reduce(buf, static_cast<std::size_t>(b.padded), comm::reduce_op::sum)});
    ++reductions_[static_cast<std::size_t>(k)];
    events_.push_back({k, micro_, after_segment});
  }

  // Lets the communicator progress (MPI advances nonblocking collectives
  // only inside MPI calls). zero<2,3>: a completed reduction's window buffer
  // is freed at once (wait() rethrows its error, if any).
  void poll() {
    if constexpr (S::shards_gradients) {
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->req.test()) {
          pending_reduction p = std::move(*it);
          it = pending_.erase(it);
          p.req.wait();
          close_bucket(p.bucket);
        } else {
          ++it;
        }
      }
    } else {
      for (auto& p : pending_) (void)p.req.test();
    }
  }
  void drain() {
    while (!pending_.empty()) {
      pending_reduction p = std::move(pending_.front());
      pending_.pop_front();
      TESSERA_NVTX_RANGE("wait reduction of bucket ", p.bucket);
      p.req.wait();
      if constexpr (S::shards_gradients) close_bucket(p.bucket);
    }
  }

  template <class T>
  request gather_chunks(const T* send, T* recv, std::int64_t chunk) {
    if constexpr (comm::comm_element<T>) {
      return comm_->iall_gather(send, recv, static_cast<std::size_t>(chunk));
    } else {
      static_assert(sizeof(T) == 2 && chunk_align % 2 == 0);
      return comm_->iall_gather(reinterpret_cast<const std::int32_t*>(send),
                                reinterpret_cast<std::int32_t*>(recv),
                                static_cast<std::size_t>(chunk / 2));
    }
  }

  // zero<1,2>: all-gather every updated shard into the full parameters.
  void gather_all_params() {
    TESSERA_NVTX_RANGE("all_gather params");
    gather_buckets(shard_params_.data(), model_->params());
  }

  // Every bucket's chunks of `shard` (shard-local order) all-gathered over
  // dp into out[b.begin, b.end) (flat order, converted to Out). Collective.
  template <class T, class Out>
  void gather_buckets(const T* shard, Out* out) {
    tensor<T, Backend> all = kernels::make_tensor<T>(*ctx_, plan_.staging_size());
    std::vector<request> reqs;
    for (const bucket& b : plan_.buckets())
      reqs.push_back(gather_chunks(shard + b.shard_offset, all.data() + b.staging_offset, b.chunk));
    for (std::size_t k = 0; k < reqs.size(); ++k) {
      reqs[k].wait();
      const bucket& b = plan_.buckets()[k];
      copy_or_cast(out + b.begin, all.data() + b.staging_offset, b.numel());
    }
  }

  // zero<3>: segment s is bucket bucket_of_segment(s).
  gathered_segment& slot(int s) {
    return gathered_[static_cast<std::size_t>(plan_.bucket_of_segment(s))];
  }
  void issue_gather(int s) {
    gathered_segment& g = slot(s);
    if (g.req || g.ready) return;
    const bucket& b = plan_.buckets()[static_cast<std::size_t>(plan_.bucket_of_segment(s))];
    TESSERA_NVTX_RANGE("all_gather segment ", s);
    g.buf = kernels::make_tensor<Param>(*ctx_, b.padded);
    max_held_ = std::max(max_held_, ++held_);
    g.req.emplace(gather_chunks(shard_params_.data() + b.shard_offset, g.buf.data(), b.chunk));
  }
  void acquire(int s) {
    issue_gather(s);
    gathered_segment& g = slot(s);
    if (!g.ready) {
      TESSERA_NVTX_RANGE("wait all_gather segment ", s);
      g.req->wait();
      g.req.reset();
      g.ready = true;
    }
    model_->set_segment_params(s, g.buf.data());
  }
  void release(int s) {
    gathered_segment& g = slot(s);
    if (g.req) {  // a prefetch still in flight: its buffer must outlive it
      g.req->wait();
      g.req.reset();
    }
    g.ready = false;
    if (!g.buf.empty()) --held_;
    g.buf.release();
    model_->set_segment_params(s, nullptr);
  }

  Model* model_;
  const Ctx* ctx_;
  C* comm_;
  data_parallel_options opt_;
  bool local_;  // one rank under zero<0>: nothing to reduce
  bucket_plan plan_;
  optimizer_type optimizer_;
  tensor<Reduce, Backend> staging_;         // zero<0,1>: (staging_size) padded buckets
  std::vector<window_bucket> window_;       // zero<2,3>: bucket k's gradients in the window
  tensor<Reduce, Backend> shard_grads_;     // zero>=1: (shard_size) reduced gradient shard
  tensor<Param, Backend> shard_params_;     // zero>=1: (shard_size) parameter shard
  std::vector<gathered_segment> gathered_;  // zero<3>: per bucket (= segment)
  std::deque<pending_reduction> pending_;
  std::vector<std::int64_t> reductions_;
  std::vector<std::int64_t> backwards_;  // per segment: backwards of this step so far
  std::vector<reduction_event> events_;
  std::size_t held_ = 0, max_held_ = 0;  // zero<3>: gathered segments allocated
  std::size_t max_window_ = 0;           // zero<2,3>: most window buffers at once
  std::int64_t micro_ = 0;
  std::int64_t micro_batches_ = 1;
  bool backward_follows_ = false;
};

}  // namespace tessera::parallel
