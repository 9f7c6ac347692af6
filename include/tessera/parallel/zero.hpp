#pragma once
/// \file parallel/zero.hpp
/// `data_parallel<Model, Optimizer, Sharding, Comm>`: the data-parallel
/// engine of one rank, under a sharding strategy `zero<0..3>`
/// (parallel/sharding.hpp), written once for every backend. It composes
/// the parts the strategy names, as CUTLASS composes a kernel from its
/// collectives:
///
///   gradient_reducer (parallel/grad_reducer.hpp)  the gradients: a
///       bucket-padded buffer reduced in place (all-reduce for zero<0>,
///       reduce-scatter for zero<1>), or transient bucket buffers
///       reduce-scattered into a reduced-gradient shard (zero<2,3>), per
///       step or per micro-batch (data_parallel_options::reduction);
///   the optimizer over the owned elements (optim/optimizer.hpp): its state
///       over the whole flat buffer (zero<0>) or this rank's shard
///       (zero<1..3>), its segment table saying where each owned element's
///       parameter and reduced gradient are; zero<1,2> then all-gather the
///       updated parameters, one bucket at a time, in place;
///   param_gatherer (parallel/param_gatherer.hpp)   zero<3>'s parameters: a
///       shard, each segment gathered before use with prefetch.
///
/// It hooks into the model per segment (nn/segment_hooks.hpp) and runs the
/// collectives through a communicator whose buffers live in the model's
/// backend memory (host memory: local_communicator, mpi_communicator;
/// device memory: nccl_communicator). A mismatch does not compile.
///
/// One optimizer step (the trainer's executor drives it; seeds/004 "Data
/// parallelism" and "Sharding: ZeRO and FSDP"; Rajbhandari et al. 2020):
///
///   begin_step(A); for each micro-batch: begin_micro_batch(m);
///   model.forward(...); model.backward(...) -- gradients accumulate; a
///       bucket's reduction starts (async) as soon as the backward has
///       produced all of its gradients (the A-th backward per step, or every
///       one per micro-batch), while earlier segments still compute;
///   finish_gradients()           -- waits for every reduction;
///   local_grad_norm_squared(d)   -- this rank's owned elements, each once;
///       the caller sums it over the mesh (parallel::layout::reduce: the
///       executor's clip action) into the context's memory;
///   step(lr, d_clip)             -- the optimizer on the owned elements,
///       then zero<1,2> all-gather the updated parameters.
///
/// What each stage keeps per rank (Psi = parameters, padded per bucket;
/// R = reduce_type_t<P>; the planner counts the same, plan/state.hpp):
///
///   zero<0>: parameters, optimizer state (master weights, moments) and the
///            padded gradient buffer (Psi R; the model's own flat buffer,
///            nothing reduced, on one rank).
///   zero<1>: parameters and the padded gradient buffer; the optimizer
///            state of this rank's chunks (Psi/N); each bucket is
///            reduce-scattered in place, the updated chunk all-gathered in
///            place.
///   zero<2>: parameters, the reduced-gradient shard (Psi/N R), the
///            optimizer's shard; the bucket buffers only while they fill
///            and reduce.
///   zero<3>: as zero<2>, and no full parameter buffer: the parameter
///            shard (Psi/N), a block at a time gathered.
/// (A model with its own gradient buffer, or bf16 gradients, keeps it
/// beside the padded buffer, into which each bucket is copied.)
///
/// Communication per optimizer step and rank, ring formulas of
/// comm/communicator.hpp, N ranks, P_k padded bucket sizes, A micro-batches:
///   zero<0>:   sum_k 2(N-1)/N P_k sizeof(R)                 (all_reduce)
///   zero<1,2>: sum_k (N-1)/N P_k (sizeof(R) + sizeof(Param)) (RS + AG)
///   zero<3>:   sum_k (N-1)/N P_k sizeof(R) + (N-1)/N sizeof(Param) *
///              (A (2 Psi_pad - P_head))                     (RS + AG fwd, bwd)
/// (per_micro_batch: the reduce-scatters A times; the head's forward and
/// backward are fused, so it is gathered once per micro-batch), plus the
/// trainer's 1-element all_reduces (scored tokens, loss, norm). With R =
/// Param = float32 and A = 1, ZeRO-1/2 equal zero<0> and ZeRO-3 is 1.5x it
/// less the head's second gather (ZeRO paper, section 7).
///
/// Determinism: the same sizes, ranks and communicator give the same bits.
/// Under local_communicator, all_reduce and reduce_scatter add each element
/// in the same ring order (the buckets are padded to equal chunks), the norm
/// is summed over the same chunks in the same order, and the optimizer is
/// element-wise, so zero<0..3> agree bit for bit when their buckets agree
/// (zero<3> uses one bucket per segment: give the others a bucket size
/// below the smallest segment to compare).
///
/// Streams (device communicators, parallel/stream_order.hpp): the
/// collectives run on the communicator's stream, which the constructor
/// makes follow the context's while it lives (context_follow): each waits for the kernels
/// queued before it, and the kernels that read a collective's output (or
/// reuse its buffers) wait for its event, so the bucket reductions overlap
/// the rest of the backward and the ZeRO-3 prefetch the previous segment
/// while the host keeps queueing work. The communicator may also run on
/// the context's stream (everything in one order, no overlap).
///
/// Thread-safety: one engine per rank, used from that rank's thread.
/// Profiling: each bucket reduction's issue and wait, each all-gather, the
/// gradient norm and the optimizer step are NVTX ranges (core/nvtx.hpp).

#include <algorithm>
#include <cstdint>
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
#include "tessera/parallel/grad_reducer.hpp"
#include "tessera/parallel/param_gatherer.hpp"
#include "tessera/parallel/sharding.hpp"
#include "tessera/parallel/stream_order.hpp"
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
  /// When buckets are reduced: once per step (the default) or, under
  /// zero<2,3>, every micro-batch (grad_reduction).
  grad_reduction reduction = grad_reduction::per_step;
  /// Throws config_error if bucket_bytes < 1.
  void validate() const {
    TESSERA_THROW_IF(bucket_bytes < 1, config_error, "bucket_bytes=", bucket_bytes,
                     " must be >= 1");
  }
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
  /// The gradients the optimizer reads: Grad over the flat buffer, the
  /// reduce type over a shard.
  using optimizer_grad_type = std::conditional_t<S::shards_optimizer_state, Reduce, Grad>;
  /// The optimizer over the whole flat buffer (zero<0>) or this rank's shard.
  using optimizer_type = typename O::template state<Param, optimizer_grad_type, Master, Ctx>;
  static_assert(comm::comm_element<Reduce>,
                "reduce_type_t<P> must be a comm_element (float or double)");
  static_assert(comm::comm_element<Param> || sizeof(Param) == 2,
                "parameters are all-gathered as themselves or, 2-byte types, as 32-bit words");
  static_assert((comm::buffer_space_of<C> == comm::buffer_space::host) == Ctx::host_accessible,
                "data_parallel: the communicator's buffer space and the model's backend memory "
                "differ: host-memory communicators (local_communicator, mpi_communicator) go with "
                "the host backend, device-memory ones (nccl_communicator) with the cuda backend");

  /// Whether a model of this engine over `dp` ranks should be built with
  /// llama_options::external_grads: its gradients then live in the engine
  /// (the padded buffer, reduced in place, or the bucket buffers). A model
  /// with its own buffer works too, at the cost of a copy per bucket.
  static bool wants_external_grads(int dp) {
    if constexpr (S::gradients == grad_home::shard) return true;
    return std::is_same_v<Grad, Reduce> && !(S::stage == 0 && dp == 1);
  }
  /// Whether the model must be built with llama_options::external_params (zero<3>).
  static constexpr bool wants_external_params = S::parameters == param_home::shard;

  /// Builds the buckets and the shard of rank comm.rank() of comm.size(),
  /// allocates what the stage keeps (now, so the memory floor is visible
  /// before step 0), installs itself as the model's hooks, and initialises
  /// the optimizer's master weights (and, under zero<3>, the parameter
  /// shard from `seed`). Preconditions: under zero<0..2> the model's
  /// weights are initialised, the same on every rank (init_weights(seed));
  /// under zero<3> the model was built with llama_options::external_params;
  /// its gradients as wants_external_grads says (or its own buffer).
  /// Throws config_error naming the values if the model's parameter storage
  /// does not match the stage or a policy the stage cannot run. A device
  /// communicator is made to follow the context's stream while the engine
  /// lives (context_follow; config_error if it already follows another).
  data_parallel(Model& model, C& comm, typename O::config opt_cfg, std::uint64_t seed,
                data_parallel_options opt = {})
      : model_(&model),
        ctx_(&model.context()),
        comm_(&comm),
        opt_(checked(opt, model)),
        plan_(segments(model), comm.size(), comm.rank(),
              std::max<std::int64_t>(1, opt.bucket_bytes / std::int64_t{sizeof(Reduce)}),
              S::shards_parameters),
        follow_(comm, model.context()),
        grads_(model, comm, plan_, opt.reduction, S::stage == 0 && comm.size() == 1),
        params_(make_gatherer(seed)),
        optimizer_(opt_cfg, S::shards_optimizer_state ? plan_.shard_size() : model.flat_size(),
                   owned_ranges(), *ctx_) {
    optimizer_.init_master(param_base());
    give_tp_group();
    model.set_hooks(this);
  }
  /// Uninstalls the hooks (the parts wait for what they have in flight).
  ~data_parallel() override { model_->set_hooks(nullptr); }
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
  /// This rank's parameter shard (zero<3>: shard-local order,
  /// plan().shard_size() elements, the context's memory); null otherwise.
  Param* param_shard() { return params_ ? params_->shard() : nullptr; }
  /// The model (not owned).
  Model& model() { return *model_; }
  const Model& model() const { return *model_; }
  /// Bucket reductions issued since construction, per bucket.
  const std::vector<std::int64_t>& reductions_per_bucket() const {
    return grads_.reductions_per_bucket();
  }
  /// The bucket reductions of the current (or last) step, in issue order.
  const std::vector<reduction_event>& reductions_this_step() const {
    return grads_.reductions_this_step();
  }
  /// zero<3>: segments whose gathered parameters are allocated now (0
  /// between passes: every gathered block is freed after use).
  std::size_t segments_held() const { return params_ ? params_->held() : 0; }
  /// zero<3>: the most segments held at once since begin_step(): 2 with
  /// prefetch (the one computing and the next one arriving), 1 without.
  std::size_t max_segments_held() const { return params_ ? params_->max_held() : 0; }
  /// zero<2,3>: bucket gradient buffers allocated now (0 between steps).
  std::size_t grad_buckets_held() const { return grads_.buckets_held(); }
  /// zero<2,3>: the most bucket gradient buffers held at once since
  /// begin_step() (every bucket under per_step accumulation, two per micro-batch).
  std::size_t max_grad_buckets_held() const { return grads_.max_buckets_held(); }
  /// Bytes this engine keeps allocated between steps (the padded gradient
  /// buffer or the reduced-gradient shard, the parameter shard, the
  /// optimizer state).
  std::size_t persistent_bytes() const {
    return grads_.persistent_bytes() + (params_ ? params_->persistent_bytes() : 0) +
           optimizer_.state_bytes();
  }
  /// The engine's transient buffers at their most since construction, in
  /// bytes, as allocated (what the planner's transients count,
  /// plan/state.hpp): the bucket gradient buffers with their conversions
  /// and received chunks (reduce_staging), the gathered segments of
  /// zero<3> (gathered), the update's all-gather buffer of zero<1,2>
  /// (update_gather).
  struct transient_peaks {
    std::size_t grad_buckets = 0, gathered = 0, update_gather = 0;
  };
  transient_peaks max_transient_bytes() const {
    return {grads_.max_transient_bytes(), params_ ? params_->max_held_bytes() : 0,
            max_update_gather_};
  }
  /// True when this engine reduces nothing (one rank under zero<0>).
  bool single_rank() const { return grads_.local(); }
  /// The engine's options (bucket bytes, prefetch, reduction policy).
  const data_parallel_options& options() const { return opt_; }

  /// Starts an optimizer step of `micro_batches` backward passes. Throws
  /// tessera::error if reductions of the previous step were never waited
  /// for, config_error if micro_batches < 1.
  void begin_step(std::int64_t micro_batches) {
    TESSERA_THROW_IF(micro_batches < 1, config_error, "begin_step: micro_batches=", micro_batches,
                     " must be >= 1");
    grads_.begin_step(micro_batches);
    if (params_) params_->begin_step();
  }
  /// After a step that threw part-way: waits for the reductions it issued
  /// (their errors dropped: the step's own exception is the one to report)
  /// and frees what it held, so that the next begin_step() can start.
  void abandon_step() noexcept { grads_.abandon(); }
  /// Before micro-batch `m` (0-based) of the step runs a training forward
  /// (whose backward follows). `backward_next`: this rank's next pass is
  /// this micro-batch's backward on this model (forward_backward; a
  /// pipeline's last stage under 1F1B), so zero<3> prefetches its first
  /// segment at the head; false when other passes run first (GPipe's
  /// forwards, another chunk's pass), which would find it held.
  void begin_micro_batch(std::int64_t m, bool backward_next = true) {
    grads_.begin_micro_batch(m);
    backward_follows_ = true;
    backward_next_ = backward_next;
  }
  /// Before a forward-only pass (evaluation, generation): no reductions;
  /// zero<3> gathers forward only.
  void begin_forward_only() { backward_follows_ = backward_next_ = false; }

  /// The host waits for every collective the context's stream was ordered
  /// after and the host has not yet waited for (bucket reductions of
  /// earlier micro-batches, gathered ZeRO-3 segments in use): call it
  /// before a blocking synchronisation of the context (the executor's
  /// tracing does), which would otherwise wait for a collective of a
  /// missing peer without the communicator's timeout. Throws comm_error.
  void settle_ordered() {
    grads_.settle_ordered();
    if (params_) params_->settle_ordered();
  }
  /// Waits for every bucket reduction of the step (gradient_reducer::finish).
  void finish_gradients() { grads_.finish(); }

  /// Sum of squares of the reduced gradient over every element of every
  /// shard on every rank, each element once (padding is zero), in float64,
  /// into `*d_out` (one double in the context's memory). Collective. The
  /// same as local_grad_norm_squared(d_out) then reduce_grad_norm_squared(d_out).
  void grad_norm_squared(double* d_out) {
    local_grad_norm_squared(d_out, false);
    reduce_grad_norm_squared(d_out);
  }
  /// This rank's part of grad_norm_squared, written (or, with `accumulate`,
  /// added) to `*d_out`: its reduced chunks in bucket order (one rank: one
  /// pass over the model's flat gradient buffer; under tensor parallelism
  /// the ranges nn::llama::norm_ranges counts on this tp rank). No
  /// communication.
  void local_grad_norm_squared(double* d_out, bool accumulate) {
    TESSERA_NVTX_RANGE("zero: grad_norm_squared");
    // A tied copy (the last pipeline stage's) is not counted: the stage
    // holding the embedding counts the tensor (nn::llama::norm_ranges).
    if (model_->tp_size() > 1 || model_->holds_tied_copy()) {
      tp_local_norm_squared(d_out, accumulate);
      return;
    }
    if (grads_.local()) {
      grad_sum_squares(*ctx_, d_out, model_->grads(), model_->flat_size(), accumulate);
      return;
    }
    bool first = !accumulate;
    for (const bucket& b : plan_.buckets()) {
      grad_sum_squares(*ctx_, d_out, grads_.reduced_chunk(b), b.chunk, !first);
      first = false;
    }
  }
  /// Sums the parts of local_grad_norm_squared over the dp group and then
  /// the tp group (collective over both; nothing on one rank).
  void reduce_grad_norm_squared(double* d_out) {
    if (!grads_.local()) comm_->all_reduce(d_out, 1, comm::reduce_op::sum);
    if (model_->tp_size() > 1) model_->tp_all_reduce_sum(d_out);
  }

  /// Tied embeddings under a pipeline: after finish_gradients(), the
  /// reduced gradient of the tied tensor this stage shares with another
  /// (nn::llama::shared_tied_range: the first stage's embedding, the last
  /// stage's copy) summed over `group`, the embedding group of those two
  /// ranks (the same dp and tp coordinates; Megatron-LM's embedding group),
  /// in place: both then hold the same sum, and update the two copies
  /// alike. Under zero<1..3> the tensor's bucket is all-gathered over dp
  /// first (each stage's shards cut the tensor differently) and this rank's
  /// chunk written back. Collective over dp and `group`, whose buffers are
  /// the model's backend memory; nothing for a stage sharing no tensor.
  template <comm::communicator G>
  void sum_tied_gradient(G& group) {
    const nn::param_range r = model_->shared_tied_range();
    if (r.begin == r.end) return;
    TESSERA_NVTX_RANGE("zero: sum the tied embedding's gradient");
    grads_.update_reduced(r.begin, r.end, [&](Reduce* v, std::int64_t n) {
      group.all_reduce(v, static_cast<std::size_t>(n), comm::reduce_op::sum);
    });
  }

  /// The optimizer on the owned elements with the clip coefficient `*d_clip`
  /// (one Master in the context's memory; a non-finite one skips the step
  /// inside the kernel); zero<1,2> then all-gather the updated parameters
  /// over dp, bucket by bucket in place. Collective for zero<1,2>.
  void step(double lr, const Master* d_clip) {
    TESSERA_NVTX_RANGE("zero: optimizer step");
    optimizer_.step(param_base(), grad_base(), lr, d_clip);
    if constexpr (S::shards_optimizer_state && S::parameters == param_home::model)
      gather_updated_params();
  }

  /// Writes the full parameters of this rank into out[0, flat_size())
  /// (the context's memory; zero<3>: all-gathers every segment; collective).
  void full_params(Param* out) {
    if (params_)
      params_->full_params(out);
    else
      kernels::copy_elements(*ctx_, out, model_->params(), model_->flat_size());
  }
  /// Writes this rank's full reduced gradient (summed over dp and the
  /// micro-batches, before clipping) into out[0, flat_size()) (the
  /// context's memory, in Grad; zero<1..3> all-gather their chunks:
  /// collective). Call after finish_gradients() and before the next step's
  /// begin_step(). Under tensor parallelism `out` holds this tp rank's
  /// shards in the model's layout (nn::param_layout).
  void full_grads(Grad* out) { grads_.full_grads(out); }

  // ---- segment hooks (nn/segment_hooks.hpp) ----
  void before_forward(int s) override {
    // The head's forward and backward are fused: its gradients are written
    // before its after_backward with no before_backward. When the blocks'
    // backward runs next, the gatherer prefetches its first segment; a
    // pipeline stage without the head hands its output on and runs its
    // backward later, other passes between: no prefetch.
    if (backward_follows_ && s == model_->last_segment() && has_head()) grads_.open(s);
    if (params_) params_->before_forward(s, backward_next_ && has_head());
    // Tied embeddings on a stage holding both: the head reads the
    // embedding's parameters and adds to its gradients (segment -1), which
    // are gathered and opened for it too.
    if (at_tied_head(s)) {
      if (backward_follows_) grads_.open(-1);
      if (params_) params_->hold(-1);
    }
    grads_.poll();
  }
  void after_forward(int s) override {
    if (params_) params_->release(s);
    if (params_ && at_tied_head(s)) params_->release(-1);
    grads_.poll();
  }
  void before_backward(int s) override {
    grads_.open(s);
    if (params_) params_->before_backward(s, true);
    grads_.poll();
  }
  void before_backward_input(int s) override {
    // B of a split backward covers the blocks only: the embedding's
    // backward waits for W, so it is not prefetched here.
    grads_.open(s);
    if (params_) params_->before_backward(s, s - 1 >= 0);
    grads_.poll();
  }
  void after_backward_input(int s) override {
    if (params_) params_->release(s);  // W reads only the record and the gradients
    grads_.poll();
  }
  void after_backward(int s) override {
    if (params_) params_->release(s);
    if (params_ && at_tied_head(s)) params_->release(-1);
    grads_.backward_done(s);  // polls every reduction issued so far, the new one included
  }

 private:
  using gatherer_type = param_gatherer<Model, C>;

  static data_parallel_options checked(data_parallel_options o, const Model& m) {
    o.validate();
    TESSERA_THROW_IF(S::shards_parameters && m.params() != nullptr, config_error, S::name,
                     " shards the parameters: build the model with "
                     "llama_options::external_params = true");
    TESSERA_THROW_IF(!S::shards_parameters && m.params() == nullptr, config_error, S::name,
                     " needs the model's full parameter buffer (external_params = false)");
    return o;
  }
  static std::vector<segment_range> segments(const Model& m) {
    std::vector<segment_range> v;
    for (int s = m.first_segment(); s <= m.last_segment(); ++s)
      v.push_back({s, m.segment_begin(s), m.segment_end(s)});
    return v;
  }
  std::optional<gatherer_type> make_gatherer(std::uint64_t seed) {
    if constexpr (S::parameters == param_home::shard)
      return std::optional<gatherer_type>(std::in_place, *model_, *comm_, plan_, seed,
                                          opt_.prefetch);
    else
      return std::nullopt;
  }
  bool has_head() const { return model_->options().stage.head; }
  // Segment s is the head, and it reads the embedding (tied, both held).
  bool at_tied_head(int s) const {
    return s == model_->last_segment() && has_head() && model_->head_reads_embedding();
  }

  // Where the optimizer's elements are: its state is the flat buffer
  // (zero<0>) or this rank's chunks in bucket order (shard_offset); each
  // owned range says where its parameters are (the model's flat buffer;
  // zero<3>'s shard) and its reduced gradients (the model's flat buffer,
  // the padded buffer at the bucket's place or this rank's chunk of it,
  // the reduced-gradient shard).
  std::vector<optim::owned_range> owned_ranges() const {
    const std::vector<nn::param_range> flat = model_->param_ranges();
    std::vector<optim::owned_range> out;
    if constexpr (!S::shards_optimizer_state) {
      if (grads_.local() || !grads_.in_place()) return optim::owned(flat);
      for (const bucket& b : plan_.buckets())
        for (const nn::param_range& r : nn::clip_ranges(flat, b.begin, b.end))
          out.push_back(optim::owned(r, r.begin, r.end, 0, b.staging_offset - b.begin));
    } else {
      for (std::size_t k = 0; k < plan_.size(); ++k) {
        const bucket& b = plan_.buckets()[k];
        const auto [lo, hi] = plan_.owned(k);
        const std::int64_t to_state = b.shard_offset - lo;  // flat element -> state element
        const std::int64_t param_shift = S::parameters == param_home::model ? -to_state : 0;
        const std::int64_t grad_shift =
            S::gradients == grad_home::bucket_buffer
                ? b.staging_offset + plan_.rank() * b.chunk - b.shard_offset
                : 0;
        for (const nn::param_range& r : nn::clip_ranges(flat, lo, hi))
          out.push_back(
              optim::owned(r, r.begin + to_state, r.end + to_state, param_shift, grad_shift));
      }
    }
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.begin < b.begin; });
    return out;
  }
  // An optimizer whose state is of whole matrices (optim::muon, which
  // orthogonalises them; optim::adafactor, whose statistics sum over them:
  // it has gather_over) reaches the other ranks of a tensor-parallel model
  // through the model's tp group, which holds the other shards of a split
  // matrix; under a ZeRO stage over dp > 1 also the dp ranks, which hold the
  // other pieces of a tensor the stage's chunks split (gather_pieces_over),
  // with the buckets (each naming its hidden matrices and its split tensors).
  // The gathers move the optimizer's gather_value (optim::gather_value).
  void give_tp_group() {
    using G = typename optim::gather_value<optimizer_type, Master>::type;
    if constexpr (requires(optim::group_gather<G> g) { optimizer_.gather_over(g); }) {
      if (model_->tp_size() > 1) {
        optim::group_gather<G> g;
        g.size = model_->tp_size();
        g.all_gather = [m = model_](const G* in, G* out, std::int64_t n) {
          m->tp_all_gather(in, out, n);
        };
        optimizer_.gather_over(std::move(g));
      }
      if constexpr (S::shards_optimizer_state) {
        if (plan_.dp() < 2) return;
        const std::vector<nn::param_range> flat = model_->param_ranges();
        std::vector<optim::state_bucket> buckets;
        for (std::size_t k = 0; k < plan_.size(); ++k) {
          const bucket& b = plan_.buckets()[k];
          const auto [lo, hi] = plan_.owned(k);
          optim::state_bucket u{b.begin, lo, hi, b.shard_offset, b.chunk, false};
          for (const nn::param_range& r : flat)
            u.matrices = u.matrices || (r.begin >= b.begin && r.end <= b.end && r.hidden);
          u.split = plan_.split_ranges(k, flat);
          buckets.push_back(std::move(u));
        }
        optim::group_gather<G> g;
        g.size = plan_.dp();
        g.all_gather = [c = comm_](const G* in, G* out, std::int64_t n) {
          detail::gather_chunks(*c, in, out, n).wait();
        };
        optimizer_.gather_pieces_over(std::move(g), plan_.rank(), std::move(buckets));
      }
    }
  }
  // The parameters the optimizer updates (element i's at param_shift from here).
  Param* param_base() { return params_ ? params_->shard() : model_->params(); }
  // The reduced gradients it reads (element i's at grad_shift from here).
  const optimizer_grad_type* grad_base() {
    if constexpr (S::gradients == grad_home::shard) {
      return grads_.shard();
    } else if constexpr (S::shards_optimizer_state) {
      return grads_.staging();
    } else {
      if constexpr (std::is_same_v<Grad, Reduce>)
        if (grads_.in_place()) return grads_.staging();
      return model_->grads();
    }
  }

  // zero<1,2>: every bucket's updated chunk (this rank's owned elements of
  // the model's parameters) all-gathered over dp in place in a padded
  // buffer of the bucket, one bucket at a time, and copied back into the
  // parameters. Collective.
  void gather_updated_params() {
    TESSERA_NVTX_RANGE("all_gather params");
    Param* params = model_->params();
    for (std::size_t k = 0; k < plan_.size(); ++k) {
      const bucket& b = plan_.buckets()[k];
      const auto [lo, hi] = plan_.owned(k);
      tensor<Param, Backend> all = kernels::make_tensor<Param>(*ctx_, b.padded);
      Param* mine = all.data() + plan_.rank() * b.chunk;
      kernels::copy_elements(*ctx_, mine, params + lo, hi - lo);
      kernels::zero_elements(*ctx_, mine + (hi - lo), b.chunk - (hi - lo));
      detail::gather_chunks(*comm_, mine, all.data(), b.chunk).wait();
      kernels::copy_elements(*ctx_, params + b.begin, all.data(), b.numel());
      max_update_gather_ = std::max(max_update_gather_, all.bytes());
    }
  }

  // The norm under tensor parallelism: only the ranges the model counts on
  // this tp rank (nn::llama::norm_ranges: its shards, and the replicated
  // tensors on tp rank 0), within this rank's reduced chunks; summed over
  // dp and then over tp by reduce_grad_norm_squared, so every element of
  // the model counts once.
  void tp_local_norm_squared(double* d_out, bool accumulate) {
    const std::vector<nn::param_range> counted = model_->norm_ranges();
    bool first = !accumulate;
    // [lo, hi) of the flat buffer, read from `base` (which holds element lo).
    auto add = [&](const auto* base, std::int64_t lo, std::int64_t hi) {
      for (const nn::param_range& r : counted) {
        const std::int64_t b = std::max(r.begin, lo), e = std::min(r.end, hi);
        if (b >= e) continue;
        grad_sum_squares(*ctx_, d_out, base + (b - lo), e - b, !first);
        first = false;
      }
    };
    if (grads_.local()) {
      add(model_->grads(), 0, model_->flat_size());
    } else {
      for (const bucket& b : plan_.buckets()) {
        const std::int64_t c0 = b.begin + plan_.rank() * b.chunk;
        add(grads_.reduced_chunk(b), c0, std::min(c0 + b.chunk, b.end));
      }
    }
    if (first) grad_sum_squares(*ctx_, d_out, static_cast<const Reduce*>(nullptr), 0, false);
  }

  Model* model_;
  const Ctx* ctx_;
  C* comm_;
  data_parallel_options opt_;
  bucket_plan plan_;
  context_follow<C, Ctx> follow_;  // before the parts: they issue, and wait in their destructors
  gradient_reducer<Model, S, C> grads_;
  std::optional<gatherer_type> params_;  // zero<3>
  optimizer_type optimizer_;
  std::size_t max_update_gather_ = 0;  // zero<1,2>: the update gather's largest buffer
  bool backward_follows_ = false;
  bool backward_next_ = false;  // begin_micro_batch
};

}  // namespace tessera::parallel
