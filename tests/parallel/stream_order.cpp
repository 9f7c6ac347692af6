// The data-parallel engine's stream order (include/tessera/parallel/
// stream_order.hpp) under simulated streams (tests/support/
// simulated_streams.hpp: no GPU, no CUDA runtime, CUDA's stream and event
// semantics, a caching allocator's reuse of freed blocks).
//
// The real engine (parallel::data_parallel with its gradient_reducer and
// param_gatherer, the AdamW optimizer) runs over a small model of irregular
// segments whose kernels read their parameters and accumulate gradients, on
// rank 1 of a data-parallel group of 2 whose peer mirrors it (each
// collective adds or gathers the peer's copy of this rank's buffer, so every
// sum and gather is still a function of what this rank has written). The
// same steps in program order (every operation runs when it is queued: the
// host backend's order) are the reference; the orders that run the
// collectives as early as the events allow, the kernels as early as the
// events allow, and random orders must give the same bits: a checksum of
// every segment pass's parameters, the gradient norms and the final
// parameters. A system that drops the event a collective waits for, or the
// one the kernels after it wait for, gives other bits, and the tests show it.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../support/simulated_streams.hpp"
#include "tessera/nn/param_layout.hpp"
#include "tessera/nn/segment_hooks.hpp"
#include "tessera/optim/adamw.hpp"
#include "tessera/parallel/zero.hpp"
#include "tessera/precision/policy.hpp"

namespace test_parallel_stream_order {

using namespace tessera;
using namespace simulated_streams;

namespace {

/// The embedding, the blocks and the head of a model, as segments -1..L of
/// irregular sizes, with kernels that read the segment's parameters (a
/// checksum per pass, logged when the kernel runs) and accumulate its
/// gradients from them; the hooks in nn::llama's order.
template <class P>
class sim_model {
 public:
  using precision_type = P;
  using backend_type = device_backend;
  using context_type = sim_context;
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  struct options_type {
    struct {
      bool head = true;
    } stage;
  };

  sim_model(const sim_context& ctx, std::vector<std::int64_t> sizes, bool external_params,
            bool external_grads, std::vector<double>& log)
      : ctx_(&ctx), log_(&log) {
    begin_.push_back(0);
    for (const std::int64_t n : sizes) begin_.push_back(begin_.back() + n);
    const std::size_t segs = sizes.size();
    seg_params_.assign(segs, nullptr);
    seg_grads_.assign(segs, nullptr);
    if (!external_params) params_ = kernels::make_tensor<Param>(ctx, flat_size());
    if (!external_grads) {
      grads_ = kernels::make_tensor<Grad>(ctx, flat_size());
      kernels::zero_elements(ctx, grads_.data(), flat_size());
    }
    for (int s = first_segment(); s <= last_segment(); ++s) {
      if (!external_params) seg_params_[seg(s)] = params_.data() + segment_begin(s);
    }
    reset_segment_grads();
  }

  int first_segment() const { return -1; }
  int last_segment() const { return static_cast<int>(begin_.size()) - 3; }
  std::int64_t segment_begin(int s) const { return begin_[seg(s)]; }
  std::int64_t segment_end(int s) const { return begin_[seg(s) + 1]; }
  std::int64_t flat_size() const { return begin_.back(); }
  const sim_context& context() const { return *ctx_; }
  const options_type& options() const { return opt_; }
  Param* params() { return params_.data(); }
  const Param* params() const { return params_.data(); }
  Grad* grads() { return grads_.data(); }
  void set_hooks(nn::segment_hooks* h) { hooks_ = h; }
  std::vector<nn::param_range> param_ranges() const {
    std::vector<nn::param_range> r;
    for (int s = first_segment(); s <= last_segment(); ++s)
      r.push_back({segment_begin(s), segment_end(s), s % 2 == 0});
    return r;
  }
  std::vector<nn::param_range> norm_ranges() const { return param_ranges(); }
  int tp_size() const { return 1; }
  // Untied: the head reads only its own segment, and no stage holds a copy
  // of the embedding (nn::llama's tied-embedding queries).
  bool head_reads_embedding() const { return false; }
  bool holds_tied_copy() const { return false; }
  void tp_all_reduce_sum(double*) {}
  void set_segment_params(int s, const Param* p) { seg_params_[seg(s)] = p; }
  const Param* segment_params(int s) const { return seg_params_[seg(s)]; }
  void set_segment_grads(int s, Grad* g) { seg_grads_[seg(s)] = g; }
  void reset_segment_grads() {
    for (int s = first_segment(); s <= last_segment(); ++s)
      seg_grads_[seg(s)] = grads_.empty() ? nullptr : grads_.data() + segment_begin(s);
  }
  /// The initial value of flat element i.
  static Param initial(std::uint64_t seed, std::int64_t i) {
    return static_cast<Param>(
        static_cast<float>(std::sin(0.37 * static_cast<double>(i) + static_cast<double>(seed))));
  }
  void init_weights_range(std::uint64_t seed, std::int64_t lo, std::int64_t hi, Param* out) const {
    for (std::int64_t i = lo; i < hi; ++i) out[i - lo] = initial(seed, i);
  }
  void init_weights(std::uint64_t seed) {
    std::vector<Param> h(static_cast<std::size_t>(flat_size()));
    init_weights_range(seed, 0, flat_size(), h.data());
    ctx_->from_host(params_.data(), h.data(), h.size() * sizeof(Param));
  }

  /// One micro-batch's forward and backward (nn::llama::forward_backward's
  /// hook order: the head's forward and backward fused).
  void forward_backward(std::int64_t m) {
    const int L = last_segment();
    for (int s = first_segment(); s < L; ++s) {
      hook(&nn::segment_hooks::before_forward, s);
      forward(s, m);
      hook(&nn::segment_hooks::after_forward, s);
    }
    hook(&nn::segment_hooks::before_forward, L);
    forward(L, m);
    backward(L, m);
    hook(&nn::segment_hooks::after_backward, L);
    for (int s = L - 1; s >= first_segment(); --s) {
      hook(&nn::segment_hooks::before_backward, s);
      backward(s, m);
      hook(&nn::segment_hooks::after_backward, s);
    }
  }
  /// A forward-only pass (evaluation).
  void forward_only() {
    for (int s = first_segment(); s <= last_segment(); ++s) {
      hook(&nn::segment_hooks::before_forward, s);
      forward(s, -1);
      hook(&nn::segment_hooks::after_forward, s);
    }
  }
  /// Forward kernels queued before the gather of their own parameters ran
  /// (the host did not wait for it), and backward kernels queued while a
  /// collective was still queued (a bucket reducing beside the backward).
  int forwards_before_their_gather = 0, backwards_beside_comm = 0;

 private:
  std::size_t seg(int s) const { return static_cast<std::size_t>(s + 1); }
  void hook(void (nn::segment_hooks::*fn)(int), int s) {
    if (hooks_) (hooks_->*fn)(s);
  }
  bool comm_queued() const { return !ctx_->dev->queue_of(comm_stream).empty(); }
  // Logs a checksum of the segment's parameters when it runs.
  void forward(int s, std::int64_t m) {
    const Param* p = segment_params(s);
    REQUIRE(p != nullptr);
    // (ZeRO-3 gathers one segment per bucket: its parameters start the gather's output)
    forwards_before_their_gather +=
        static_cast<int>(ctx_->dev->unwritten.count(reinterpret_cast<const std::byte*>(p)));
    const std::int64_t n = segment_end(s) - segment_begin(s);
    std::vector<double>* log = log_;
    ctx_->kernel([p, n, m, log] {
      double sum = static_cast<double>(m);
      for (std::int64_t i = 0; i < n; ++i)
        sum += static_cast<double>(static_cast<float>(p[i])) * static_cast<double>(1 + i % 5);
      log->push_back(sum);
    });
  }
  // g += a function of the parameters, the micro-batch and the element.
  void backward(int s, std::int64_t m) {
    const Param* p = segment_params(s);
    Grad* g = seg_grads_[seg(s)];
    REQUIRE(p != nullptr);
    REQUIRE(g != nullptr);
    backwards_beside_comm += comm_queued();
    const std::int64_t n = segment_end(s) - segment_begin(s);
    ctx_->kernel([p, g, n, m] {
      for (std::int64_t i = 0; i < n; ++i)
        g[i] = static_cast<Grad>(static_cast<float>(g[i]) +
                                 static_cast<float>(p[i]) * 0.125f * static_cast<float>(m + 1) +
                                 0.01f * static_cast<float>(i % 7 - 3));
    });
  }

  const sim_context* ctx_;
  std::vector<double>* log_;
  options_type opt_;
  std::vector<std::int64_t> begin_;
  tensor<Param, device_backend> params_;
  tensor<Grad, device_backend> grads_;
  std::vector<const Param*> seg_params_;
  std::vector<Grad*> seg_grads_;
  nn::segment_hooks* hooks_ = nullptr;
};

/// A layout of the engine to run.
struct setup {
  int stage = 0;  // zero<stage>
  parallel::grad_reduction reduction = parallel::grad_reduction::per_step;
  bool prefetch = true;
  bool model_grads = false;    // the model keeps its own gradient buffer (a copy per bucket)
  bool abandon_first = false;  // a step abandoned after its first micro-batch comes first
  std::string describe() const {
    return "zero<" + std::to_string(stage) + "> reduction per " + parallel::to_string(reduction) +
           (prefetch ? "" : ", no prefetch") +
           (model_grads ? ", the model's own gradient buffer" : "") +
           (abandon_first ? ", after an abandoned step" : "");
  }
};

/// What a run produced, compared bit for bit.
struct outcome {
  std::vector<std::uint64_t> checksums, norms;  // as bits
  std::vector<std::uint8_t> params;             // the final parameters' bytes
  int collectives = 0, reused_blocks = 0;
  int forwards_before_their_gather = 0, backwards_beside_comm = 0;
  bool operator==(const outcome& o) const {
    return checksums == o.checksums && norms == o.norms && params == o.params;
  }
};

constexpr int dp = 2, this_rank = 1, steps = 3, micro_batches = 3;
const std::vector<std::int64_t> segment_sizes = {37, 120, 95, 140, 61};  // -1, 0, 1, 2, head

template <class P, int Stage>
outcome run_as(const setup& su, run_order order, const faults& f, std::uint64_t seed) {
  using S = parallel::zero<Stage>;
  using model_type = sim_model<P>;
  using engine_type = parallel::data_parallel<model_type, optim::adamw, S, sim_communicator>;
  using Param = typename P::param_type;
  device dev;
  dev.order = order;
  dev.rng.seed(seed);
  device_memory mem(dev);
  host_memory_resource host_mem;
  const sim_context ctx{&dev, &mem, kernels::host_context{&host_mem, 1}};
  sim_communicator comm(dev, this_rank, dp, f);
  std::vector<double> log;
  const bool external_grads = !su.model_grads && engine_type::wants_external_grads(dp);
  model_type model(ctx, segment_sizes, engine_type::wants_external_params, external_grads, log);
  if (!engine_type::wants_external_params) model.init_weights(5);
  parallel::data_parallel_options dpo;
  dpo.bucket_bytes = 100 * static_cast<std::int64_t>(sizeof(float));  // several buckets
  dpo.prefetch = su.prefetch;
  dpo.reduction = su.reduction;
  optim::adamw_config oc;
  oc.weight_decay = 0.1;
  outcome out;
  {
    engine_type engine(model, comm, oc, 5, dpo);
    tensor<double, device_backend> norm = kernels::make_tensor<double>(ctx, 1);
    tensor<float, device_backend> clip = kernels::make_tensor<float>(ctx, 1);
    if (su.abandon_first) {  // a step that threw after its first micro-batch's backward
      engine.begin_step(micro_batches);
      engine.begin_micro_batch(0);
      model.forward_backward(0);
      engine.abandon_step();
    }
    for (int t = 0; t < steps; ++t) {
      engine.begin_step(micro_batches);
      for (int m = 0; m < micro_batches; ++m) {
        engine.begin_micro_batch(m);
        model.forward_backward(m);
      }
      engine.finish_gradients();
      engine.grad_norm_squared(norm.data());
      clip_coefficient(ctx, clip.data(), static_cast<const double*>(norm.data()), 1.0);
      engine.step(1e-2 * (t + 1), clip.data());
      double h = 0;
      ctx.to_host(&h, norm.data(), sizeof h);
      out.norms.push_back(std::bit_cast<std::uint64_t>(h));
      engine.begin_forward_only();
      model.forward_only();
    }
    tensor<Param, device_backend> full = kernels::make_tensor<Param>(ctx, model.flat_size());
    engine.full_params(full.data());
    out.params.resize(static_cast<std::size_t>(full.bytes()));
    ctx.to_host(out.params.data(), full.data(), out.params.size());
  }
  dev.host_wait_stream(comm_stream);
  dev.host_wait_stream(compute_stream);
  for (const double c : log) out.checksums.push_back(std::bit_cast<std::uint64_t>(c));
  out.collectives = comm.issued();
  out.reused_blocks = mem.reused();
  out.forwards_before_their_gather = model.forwards_before_their_gather;
  out.backwards_beside_comm = model.backwards_beside_comm;
  return out;
}

template <class P>
outcome run(const setup& su, run_order order, const faults& f = {}, std::uint64_t seed = 1) {
  switch (su.stage) {
    case 0:
      return run_as<P, 0>(su, order, f, seed);
    case 1:
      return run_as<P, 1>(su, order, f, seed);
    case 2:
      return run_as<P, 2>(su, order, f, seed);
    default:
      return run_as<P, 3>(su, order, f, seed);
  }
}

const std::vector<setup>& layouts() {
  using parallel::grad_reduction;
  static const std::vector<setup> all = {
      {0, grad_reduction::per_step, true, false},
      {0, grad_reduction::per_step, true, true},
      {1, grad_reduction::per_step, true, false},
      {2, grad_reduction::per_step, true, false},
      {2, grad_reduction::per_micro_batch, true, false},
      {3, grad_reduction::per_step, true, false},
      {3, grad_reduction::per_micro_batch, true, false},
      {3, grad_reduction::per_step, false, false},
      {2, grad_reduction::per_micro_batch, true, false, true},
      {3, grad_reduction::per_micro_batch, true, false, true},
  };
  return all;
}

// The layouts in which the kernels read a collective's output (or reuse its
// buffers) with no host wait between: ZeRO-3's gathered segments, and the
// per-micro-batch addition of a reduced chunk into the shard. Elsewhere
// the engine's host waits (finish_gradients, the blocking gathers of the
// update) order the kernels after the collectives too.
bool consumes_on_the_stream(const setup& su) {
  return su.stage == 3 || su.reduction == parallel::grad_reduction::per_micro_batch;
}

}  // namespace

TEMPLATE_TEST_CASE(
    "every layout of the engine gives the program order's bits under adversarial "
    "stream orders",
    "[parallel][streams]", precision::fp32, precision::bf16_mixed) {
  for (const setup& su : layouts()) {
    INFO(su.describe());
    const outcome ref = run<TestType>(su, run_order::program);
    REQUIRE(ref.collectives > 0);
    REQUIRE(ref.checksums.size() ==
            static_cast<std::size_t>((steps * (micro_batches + 1) + (su.abandon_first ? 1 : 0)) *
                                     segment_sizes.size()));
    for (const run_order o : {run_order::comm_first, run_order::compute_first}) {
      INFO(name(o));
      const outcome got = run<TestType>(su, o);
      CHECK(got == ref);
      CHECK(got.collectives == ref.collectives);
    }
    for (std::uint64_t seed = 1; seed <= 4; ++seed) {
      INFO("random order, seed " << seed);
      CHECK(run<TestType>(su, run_order::random, {}, seed) == ref);
    }
  }
}

TEST_CASE(
    "the host queues kernels while collectives are still queued: reductions beside the "
    "backward, a ZeRO-3 segment's kernels before its gather ran",
    "[parallel][streams]") {
  using parallel::grad_reduction;
  // Nothing runs until the host waits, so a kernel queued while the
  // communicator's stream still holds work was queued without waiting for it.
  const outcome z0 =
      run<precision::fp32>({0, grad_reduction::per_step, true, false}, run_order::comm_first);
  CHECK(z0.backwards_beside_comm > 0);  // buckets reduce while the backward goes on
  const outcome z3 =
      run<precision::fp32>({3, grad_reduction::per_step, true, false}, run_order::comm_first);
  // A segment's kernels are queued before its gather ran: they wait for it
  // on the stream, and the gather runs beside the segment before.
  CHECK(z3.forwards_before_their_gather > 0);
  CHECK(z3.backwards_beside_comm > 0);
  // Freed collective buffers were handed out again (the reuse the order protects).
  CHECK(z3.reused_blocks > 0);
}

TEST_CASE("one communicator follows one context's stream at a time, while its engine lives",
          "[parallel][streams]") {
  using model_type = sim_model<precision::fp32>;
  using engine_type =
      parallel::data_parallel<model_type, optim::adamw, parallel::zero<1>, sim_communicator>;
  device dev;
  device_memory mem(dev);
  host_memory_resource host_mem;
  const faults f;
  sim_communicator comm(dev, this_rank, dp, f);
  std::vector<double> log;
  const sim_context ctx{&dev, &mem, kernels::host_context{&host_mem, 1}, compute_stream};
  const sim_context other{&dev, &mem, kernels::host_context{&host_mem, 1}, comm_stream + 1};
  model_type m1(ctx, segment_sizes, false, true, log), m2(ctx, segment_sizes, false, true, log),
      m3(other, segment_sizes, false, true, log);
  m1.init_weights(5);
  m2.init_weights(5);
  m3.init_weights(5);
  {
    engine_type e1(m1, comm, {}, 5, {});
    CHECK(comm.followed_stream() == compute_stream);
    // A second engine on the same context (a pipeline rank's chunks) shares it.
    { engine_type e2(m2, comm, {}, 5, {}); }
    CHECK(comm.followed_stream() == compute_stream);
    // Another context's engine would take the ordering from the first.
    CHECK_THROWS_WITH(engine_type(m3, comm, {}, 5, {}),
                      Catch::Contains("already orders itself after another context's stream"));
    CHECK(comm.followed_stream() == compute_stream);
  }
  CHECK(comm.followed_stream() == 0);  // restored when the engine goes
}

TEST_CASE("a collective that does not wait for the kernels before it gives other bits",
          "[parallel][streams]") {
  faults f;
  f.drop_follow = true;
  for (const setup& su : layouts()) {
    INFO(su.describe());
    const outcome ref = run<precision::fp32>(su, run_order::program);
    // In program order every kernel has run when a collective is issued.
    CHECK(run<precision::fp32>(su, run_order::program, f) == ref);
    // Run as early as the (missing) event allows, the collective reads
    // gradients the backward has not written, or a shard not yet updated.
    CHECK_FALSE(run<precision::fp32>(su, run_order::comm_first, f) == ref);
  }
}

TEST_CASE("kernels that do not wait for the collective before them give other bits",
          "[parallel][streams]") {
  faults f;
  f.drop_order_before = true;
  int caught = 0;
  for (const setup& su : layouts()) {
    INFO(su.describe());
    const outcome ref = run<precision::fp32>(su, run_order::program);
    CHECK(run<precision::fp32>(su, run_order::program, f) == ref);
    const bool differs = !(run<precision::fp32>(su, run_order::compute_first, f) == ref);
    // Where a host wait stands between the collective and its readers the
    // dropped event does no harm; where none does, the kernels read a
    // segment not yet gathered or a chunk not yet reduced.
    CHECK(differs == consumes_on_the_stream(su));
    caught += differs;
  }
  CHECK(caught >= 4);
}

}  // namespace test_parallel_stream_order
