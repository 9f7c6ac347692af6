#pragma once
// The multi-rank bodies of the data-parallel / ZeRO tests, written once and
// run under both communicators (STYLE.md, "Tests"): tests/parallel/zero.cpp
// runs them on threads (local_world::run, dp 1..4), tests/mpi/zero.cpp under
// mpirun -np 1..4. Bodies throw suite_failure naming the rank and the values
// (Catch2 v2 assertions are not thread-safe).
//
// The scenario: the tiny preset, A = 3 micro-batches per rank whose targets
// are masked differently (so they hold different numbers of scored tokens,
// and one holds a padding input), 5 AdamW steps with clipping active on some
// of them. Rank r runs global micro-batches r*A .. r*A+A-1 through
// parallel::data_parallel; the reference is one nn::llama and one AdamW over
// the whole buffer processing all dp*A micro-batches in order, exactly as
// train::trainer does.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <tessera/core/random.hpp>
#include <tessera/kernels/context.hpp>
#include <tessera/kernels/optimizer.hpp>
#include <tessera/nn/llama.hpp>
#include <tessera/optim/adamw.hpp>
#include <tessera/optim/clip.hpp>
#include <tessera/parallel/zero.hpp>

namespace zero_suite {

using namespace tessera;
using tessera::detail::str;

struct suite_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
template <class... A>
void check(bool cond, const A&... a) {
  if (!cond) throw suite_failure(str(a...));
}

/// The run every body shares.
struct setup {
  std::int64_t A = 3;   // micro-batches per rank and step
  std::int64_t B = 2;   // rows per micro-batch
  std::int64_t T = 12;  // sequence length
  int steps = 5;
  std::uint64_t seed = 2024;
  double max_norm = 1.0;  // set by calibrate() so that some steps clip
  std::int64_t bucket_bytes = parallel::default_bucket_bytes;
  optim::adamw_config adamw{0.9, 0.95, 1e-8, 0.1};
  /// Before step 0, run its micro-batches' backwards (every bucket's
  /// reduction issued) and abandon the step (engine.abandon_step(), as the
  /// executor does when a step throws): the run must not change.
  bool abandon_first = false;
  /// When buckets reduce: once per step, or every micro-batch (zero<2,3>).
  parallel::grad_reduction reduction = parallel::grad_reduction::per_step;
  double lr(int s) const { return 3e-3 * (1.0 + 0.25 * s); }
};

inline nn::llama_config model_config() {
  return nn::llama_config::tiny();
}
constexpr std::int32_t ignore = -100;

/// Global micro-batch m of step s: (B, T+1) tokens drawn from (seed, s, m).
/// Micro-batch m masks (m + s) % 3 * 3 + (m % 2) targets of row 0, and every
/// third one also has a padding input (ignore_index at column T-1, which is
/// the target of position T-2 and the input of position T-1).
inline std::vector<std::int32_t> micro_batch(const setup& st, int s, std::int64_t m) {
  const std::int64_t V = model_config().vocab, B = st.B, T = st.T;
  std::vector<std::int32_t> t(static_cast<std::size_t>(B * (T + 1)));
  rng r(mix64(st.seed) ^
        mix64(static_cast<std::uint64_t>(s) * 1000003u + static_cast<std::uint64_t>(m)));
  for (auto& x : t) x = static_cast<std::int32_t>(r.next_u64() % static_cast<std::uint64_t>(V));
  const std::int64_t masked = (m + s) % 3 * 3 + (m % 2);
  for (std::int64_t j = 0; j < masked; ++j) t[static_cast<std::size_t>(1 + j)] = ignore;
  if (m % 3 == 2) t[static_cast<std::size_t>((T + 1) + T - 1)] = ignore;
  return t;
}

inline std::int64_t scored(const std::vector<std::int32_t>& t, const setup& st) {
  std::int64_t n = 0;
  for (std::int64_t b = 0; b < st.B; ++b)
    for (std::int64_t j = 1; j <= st.T; ++j)
      n += t[static_cast<std::size_t>(b * (st.T + 1) + j)] != ignore;
  return n;
}

/// The 1-rank reference: all dp*A micro-batches per step on one model.
/// Returns the parameters after st.steps steps, and the norms per step.
template <class P>
std::vector<typename P::param_type> reference(const setup& st, int dp,
                                              std::vector<double>* norms = nullptr) {
  using Param = typename P::param_type;
  const kernels::host_context& ctx = kernels::default_host_context();
  nn::llama<P> m(model_config());
  m.init_weights(st.seed);
  optim::adamw_optimizer<Param, typename P::grad_type, typename P::master_type,
                         kernels::host_context>
      opt(st.adamw, m.flat_size(), m.param_ranges(), ctx);
  opt.init_master(m.params());
  const std::int64_t M = dp * st.A;
  for (int s = 0; s < st.steps; ++s) {
    std::vector<std::vector<std::int32_t>> mb;
    std::int64_t n = 0;
    for (std::int64_t k = 0; k < M; ++k) {
      mb.push_back(micro_batch(st, s, k));
      n += scored(mb.back(), st);
    }
    m.zero_grad();
    const auto scale = static_cast<typename P::accum_type>(1.0 / static_cast<double>(n));
    for (auto& t : mb) m.forward_backward(t.data(), st.B, st.T, scale);
    double ss = 0;
    kernels::grad_sum_squares(ctx, &ss, m.grads(), m.flat_size());
    const double norm = std::sqrt(ss);
    if (norms) norms->push_back(norm);
    opt.step(m.params(), m.grads(), st.lr(s), optim::clip_coefficient(norm, st.max_norm));
  }
  return {m.params(), m.params() + m.layout().total()};
}

/// Picks max_norm between the smallest and largest reference norm of the
/// run, so clipping is active on some steps and not on others.
template <class P>
void calibrate(setup& st) {
  std::vector<double> n;
  setup probe = st;
  probe.max_norm = 0;  // off
  reference<P>(probe, 1, &n);
  const auto [lo, hi] = std::minmax_element(n.begin(), n.end());
  st.max_norm = 0.5 * (*lo + *hi);
}

/// What one data-parallel run observed.
template <class Param>
struct dp_result {
  std::vector<Param> params;                  // full parameters after the run
  std::vector<std::uint64_t> bytes_per_step;  // this rank's bytes sent per step
  std::size_t buckets = 0;
};

/// Runs st.steps steps of data parallelism under strategy S on communicator
/// c, checking on every step: exactly one reduction per bucket, all issued
/// on the last micro-batch (none on the no_sync micro-batches), each after
/// its lowest segment's backward (the head's bucket while blocks still have
/// to run when there is more than one bucket), and the per-step counts of
/// the communicator's reduce calls. One rank under zero<0> reduces nothing.
template <class P, class S, class Comm>
dp_result<typename P::param_type> run_dp(Comm& c, const setup& st) {
  using Param = typename P::param_type;
  const int r = c.rank();
  nn::llama_options o;
  o.external_params = S::shards_parameters;
  o.external_grads = S::shards_gradients;
  nn::llama<P> m(model_config(), o);
  if constexpr (!S::shards_parameters) m.init_weights(st.seed);
  parallel::data_parallel_options dpo;
  dpo.bucket_bytes = st.bucket_bytes;
  dpo.reduction = st.reduction;
  const bool per_mb = st.reduction == parallel::grad_reduction::per_micro_batch;
  const std::int64_t passes = per_mb ? st.A : 1;  // reductions of a bucket per step
  parallel::data_parallel<nn::llama<P>, optim::adamw, S, Comm> eng(m, c, st.adamw, st.seed, dpo);
  const auto& plan = eng.plan();
  const bool reduces = !eng.single_rank();
  const std::size_t want_reductions = reduces ? plan.size() * static_cast<std::size_t>(passes) : 0;
  dp_result<Param> out;
  out.buckets = plan.size();
  if (st.abandon_first) {
    std::int64_t n = 0;
    std::vector<std::vector<std::int32_t>> mb;
    for (std::int64_t a = 0; a < st.A; ++a) {
      mb.push_back(micro_batch(st, 0, r * st.A + a));
      n += scored(mb.back(), st);
    }
    m.zero_grad();
    eng.begin_step(st.A);
    for (std::int64_t a = 0; a < st.A; ++a) {
      eng.begin_micro_batch(a);
      m.forward_backward(mb[static_cast<std::size_t>(a)].data(), st.B, st.T,
                         static_cast<typename P::accum_type>(1.0 / static_cast<double>(n)));
    }
    eng.abandon_step();  // no finish_gradients: the reductions are still in flight
    if constexpr (S::shards_gradients)
      check(eng.grad_buckets_held() == 0, "rank ", r, ": ", eng.grad_buckets_held(),
            " bucket gradient buffers held after abandon_step");
  }
  for (int s = 0; s < st.steps; ++s) {
    const auto before = c.stats();
    std::vector<std::vector<std::int32_t>> mb;
    std::int64_t n = 0;
    for (std::int64_t a = 0; a < st.A; ++a) {
      mb.push_back(micro_batch(st, s, r * st.A + a));
      n += scored(mb.back(), st);
    }
    c.all_reduce(&n, 1, comm::reduce_op::sum);
    m.zero_grad();
    eng.begin_step(st.A);
    const auto scale = static_cast<typename P::accum_type>(1.0 / static_cast<double>(n));
    for (std::int64_t a = 0; a < st.A; ++a) {
      eng.begin_micro_batch(a);
      m.forward_backward(mb[static_cast<std::size_t>(a)].data(), st.B, st.T, scale);
      if (a < st.A - 1 && !per_mb)
        check(eng.reductions_this_step().empty(), "rank ", r, " step ", s, ": ",
              eng.reductions_this_step().size(), " reductions on no_sync micro-batch ", a);
    }
    eng.finish_gradients();
    double ss = 0;
    eng.grad_norm_squared(&ss);
    using Master = typename P::master_type;
    const Master coef = static_cast<Master>(optim::clip_coefficient(std::sqrt(ss), st.max_norm));
    eng.step(st.lr(s), &coef);
    if constexpr (S::shards_parameters)  // each block freed after use, the next one prefetched
      check(eng.segments_held() == 0 && eng.max_segments_held() == 2, "rank ", r,
            ": zero<3> holds ", eng.segments_held(), " gathered segments after the step, at most ",
            eng.max_segments_held(), " at once (expected 0 and 2)");
    if constexpr (S::shards_gradients)  // only the shard between steps; the window held all
      check(eng.grad_buckets_held() == 0 &&
                (per_mb ? eng.max_grad_buckets_held() <= 2
                        : eng.max_grad_buckets_held() ==
                              (st.A > 1 ? plan.size() : eng.max_grad_buckets_held())),
            "rank ", r, ": zero<2,3> hold ", eng.grad_buckets_held(),
            " bucket gradient buffers after the step, at most ", eng.max_grad_buckets_held(),
            " at once (expected 0 and ", plan.size(), ")");
    const auto after = c.stats();
    out.bytes_per_step.push_back(after.bytes_sent() - before.bytes_sent());
    // One reduction per bucket (per micro-batch: in each one), on the last
    // micro-batch, right after the backward of the bucket's lowest segment.
    const auto& ev = eng.reductions_this_step();
    check(ev.size() == want_reductions, "rank ", r, " step ", s, ": ", ev.size(),
          " bucket reductions, expected ", want_reductions);
    std::vector<int> seen(plan.size(), 0);
    for (const auto& e : ev) {
      ++seen[static_cast<std::size_t>(e.bucket)];
      check(per_mb || e.micro_batch == st.A - 1, "rank ", r, ": bucket ", e.bucket,
            " reduced in micro-batch ", e.micro_batch, " (no_sync until ", st.A - 1, ")");
      check(e.after_segment == plan.buckets()[static_cast<std::size_t>(e.bucket)].first_segment,
            "rank ", r, ": bucket ", e.bucket, " issued after segment ", e.after_segment);
    }
    for (std::size_t k = 0; k < plan.size() && reduces; ++k)
      check(seen[k] == passes, "rank ", r, ": bucket ", k, " reduced ", seen[k], " times in step ",
            s);
    if (plan.size() > 1 && reduces)
      check(ev.front().after_segment > -1, "rank ", r,
            ": the first bucket waited for the embedding's backward (no overlap)");
    // The communicator saw the same: the bucket collectives plus two
    // 1-element all_reduces (scored count, norm); one rank under zero<0>
    // only the body's scored count.
    const auto rs = after.reduce_scatter.calls - before.reduce_scatter.calls;
    const auto ar = after.all_reduce.calls - before.all_reduce.calls;
    if (!reduces)
      check(rs == 0 && ar == 1, "rank ", r, ": ", rs, " reduce_scatters and ", ar,
            " all_reduces in step ", s, " on one rank, expected 0 and 1");
    else if constexpr (S::shards_optimizer_state)
      check(rs == plan.size() * static_cast<std::size_t>(passes) && ar == 2, "rank ", r, ": ", rs,
            " reduce_scatters and ", ar, " all_reduces in step ", s, ", expected ",
            plan.size() * static_cast<std::size_t>(passes), " and 2");
    else
      check(rs == 0 && ar == plan.size() + 2, "rank ", r, ": ", ar, " all_reduces in step ", s,
            ", expected ", plan.size() + 2);
  }
  const std::int64_t issued = (st.steps + (st.abandon_first ? 1 : 0)) * passes;
  for (std::size_t k = 0; k < plan.size() && reduces; ++k)
    check(eng.reductions_per_bucket()[k] == issued, "rank ", r, ": bucket ", k, " reduced ",
          eng.reductions_per_bucket()[k], " times in ", issued, " steps");
  out.params.resize(static_cast<std::size_t>(m.flat_size()));
  eng.full_params(out.params.data());
  return out;
}

/// max |a - b| / max |b| (0 for equal vectors).
template <class T>
double rel_max_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double d = 0, s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(to<double>(a[i]) - to<double>(b[i])));
    s = std::max(s, std::abs(to<double>(b[i])));
  }
  return s > 0 ? d / s : d;
}
template <class T>
std::size_t first_bit_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return i;
  return a.size();
}

/// Tolerance against the 1-rank run (DESIGN.md principle 6): float64 1e-12
/// and float32 1e-5, relative to the largest parameter (the sums differ only
/// in order: dp ranks add their A micro-batches, then the ring adds ranks).
template <class P>
constexpr double tolerance() {
  return sizeof(typename P::param_type) == 8 ? 1e-12 : 1e-5;
}

/// For every ZeRO stage: parameters after the run match the 1-rank
/// reference within tolerance; with `bitwise`, the four stages agree bit for
/// bit on two ranks or more (a bucket per segment for all of them, so the
/// ring cuts the same chunks; local_communicator's reduce_scatter adds in
/// all_reduce's order). On one rank zero<0> is the single-rank step, whose
/// norm is one pass over the flat buffer, while zero<1..3> sum the norm
/// over bucket chunks (shard order): the same value to float64 rounding,
/// not the same bits, so only the tolerance applies there.
template <class P, class Comm>
void stages_match_single_rank(Comm& c, bool bitwise) {
  setup st;
  calibrate<P>(st);
  st.bucket_bytes = 1;  // one bucket per segment for every stage
  const auto ref = reference<P>(st, c.size());
  const auto z0 = run_dp<P, parallel::zero<0>>(c, st);
  const auto z1 = run_dp<P, parallel::zero<1>>(c, st);
  const auto z2 = run_dp<P, parallel::zero<2>>(c, st);
  const auto z3 = run_dp<P, parallel::zero<3>>(c, st);
  const char* names[] = {"zero<0>", "zero<1>", "zero<2>", "zero<3>"};
  const decltype(z0)* all[] = {&z0, &z1, &z2, &z3};
  for (int k = 0; k < 4; ++k) {
    const double d = rel_max_diff(all[k]->params, ref);
    check(d <= tolerance<P>(), "rank ", c.rank(), " of ", c.size(), ", ", P::name, " ", names[k],
          ": parameters differ from the 1-rank run by ", d, " (relative to the largest), limit ",
          tolerance<P>());
    if (bitwise && k > 0 && c.size() > 1) {
      const std::size_t i = first_bit_difference(all[k]->params, z0.params);
      check(i == z0.params.size(), "rank ", c.rank(), " of ", c.size(), ", ", P::name, " ",
            names[k], " differs from zero<0> in the bits of element ", i);
    }
  }
  // The default bucket size (25 MB: one bucket for the tiny model) matches too.
  st.bucket_bytes = parallel::default_bucket_bytes;
  const auto d0 = run_dp<P, parallel::zero<0>>(c, st);
  const auto d2 = run_dp<P, parallel::zero<2>>(c, st);
  check(d0.buckets == 1, "tiny model in ", d0.buckets, " buckets of 25 MB");
  for (const auto* d : {&d0, &d2}) {
    const double e = rel_max_diff(d->params, ref);
    check(e <= tolerance<P>(), "rank ", c.rank(), " of ", c.size(), ", ", P::name,
          " default buckets: parameters differ from the 1-rank run by ", e);
  }
}

/// bf16_mixed (bf16 parameters all-gathered as 32-bit words, float32
/// gradients, reductions and master weights): with the same buckets the
/// four stages agree bit for bit (`bitwise`, two ranks or more, as
/// stages_match_single_rank), and all stay within bf16
/// rounding of the 1-rank run (2^-7 relative to the largest parameter: a
/// different summation order can move a parameter by one bf16 ulp).
template <class Comm>
void bf16_stages_agree(Comm& c, bool bitwise) {
  using P = precision::bf16_mixed;
  setup st;
  calibrate<precision::fp32>(st);
  st.bucket_bytes = 1;
  const auto ref = reference<P>(st, c.size());
  const auto z0 = run_dp<P, parallel::zero<0>>(c, st);
  const auto z1 = run_dp<P, parallel::zero<1>>(c, st);
  const auto z3 = run_dp<P, parallel::zero<3>>(c, st);
  for (const auto* z : {&z0, &z1, &z3}) {
    const double d = rel_max_diff(z->params, ref);
    check(d <= 0x1p-7, "rank ", c.rank(), " of ", c.size(),
          ": bf16 parameters differ from the 1-rank run by ", d);
    if (bitwise && c.size() > 1) {
      const std::size_t i = first_bit_difference(z->params, z0.params);
      check(i == z0.params.size(), "rank ", c.rank(), " of ", c.size(),
            ": bf16 stage differs from zero<0> at element ", i);
    }
  }
}

/// Bytes per step and rank, float32, A = 1: zero<1> and zero<2> equal
/// zero<0>; zero<3> equals the ring formula of parallel/zero.hpp (the head,
/// whose forward and backward are fused, gathered once per micro-batch).
/// Returns {zero0, zero1, zero2, zero3} bytes of this rank's last step.
template <class Comm>
std::vector<std::uint64_t> comm_bytes_per_step(Comm& c) {
  using P = precision::fp32;
  setup st;
  st.A = 1;
  st.steps = 2;
  st.bucket_bytes = 4000;  // several buckets
  const auto z0 = run_dp<P, parallel::zero<0>>(c, st);
  const auto z1 = run_dp<P, parallel::zero<1>>(c, st);
  const auto z2 = run_dp<P, parallel::zero<2>>(c, st);
  const auto z3 = run_dp<P, parallel::zero<3>>(c, st);
  const int N = c.size(), r = c.rank();
  // The 1-element all_reduces of the body (scored count int64, norm double).
  const std::uint64_t scalars = comm::ring_all_reduce_bytes(1, 8, N, r) * 2;
  // (One rank sends nothing at all.)
  nn::llama<P> m(model_config());
  std::vector<parallel::segment_range> segs;
  for (int s = m.first_segment(); s <= m.last_segment(); ++s)
    segs.push_back({s, m.segment_begin(s), m.segment_end(s)});
  const parallel::bucket_plan plan0(segs, N, r, st.bucket_bytes / 4, false);
  const parallel::bucket_plan plan3(segs, N, r, 1, true);
  std::uint64_t ar = 0, rsag = 0, z3f = 0;
  for (const auto& b : plan0.buckets()) {
    ar += comm::ring_all_reduce_bytes(static_cast<std::size_t>(b.padded), 4, N, r);
    rsag += 2 * comm::ring_scatter_gather_bytes(static_cast<std::size_t>(b.chunk), 4, N);
  }
  for (const auto& b : plan3.buckets()) {
    const auto one = comm::ring_scatter_gather_bytes(static_cast<std::size_t>(b.chunk), 4, N);
    z3f += one * (b.last_segment == m.last_segment() ? 2 : 3);  // RS + AG fwd (+ AG bwd)
  }
  const std::uint64_t got[4] = {z0.bytes_per_step.back(), z1.bytes_per_step.back(),
                                z2.bytes_per_step.back(), z3.bytes_per_step.back()};
  const std::uint64_t want[4] = {ar + scalars, rsag + scalars, rsag + scalars, z3f + scalars};
  for (int k = 0; k < 4; ++k)
    check(got[k] == want[k], "rank ", r, " of ", N, ": zero<", k, "> sent ", got[k],
          " bytes in a step, formula ", want[k]);
  if (N > 1) {
    check(got[1] == got[0] && got[2] == got[0], "rank ", r, ": zero<1,2> sent ", got[1], ", ",
          got[2], " bytes, zero<0> ", got[0]);
  }
  return {got[0], got[1], got[2], got[3]};
}

/// zero<2,3> reducing every micro-batch (grad_reduction::per_micro_batch):
/// each micro-batch's buckets reduce-scattered as they complete, two bucket
/// buffers held at most (run_dp checks both), the parameters within the
/// tolerance of the 1-rank run (the micro-batches' reduced sums are added:
/// another order than reducing their sum), and with one micro-batch per step
/// the bits of the once-per-step reduction.
template <class P, class Comm>
void per_micro_batch_matches_single_rank(Comm& c) {
  setup st;
  calibrate<P>(st);
  st.bucket_bytes = 4096;  // several buckets
  st.reduction = parallel::grad_reduction::per_micro_batch;
  const auto ref = reference<P>(st, c.size());
  auto near = [&](const auto& z, const char* name) {
    const double d = rel_max_diff(z.params, ref);
    check(d <= tolerance<P>(), "rank ", c.rank(), " of ", c.size(), ", ", P::name, " ", name,
          " per micro-batch: parameters differ from the 1-rank run by ", d);
  };
  near(run_dp<P, parallel::zero<2>>(c, st), "zero<2>");
  near(run_dp<P, parallel::zero<3>>(c, st), "zero<3>");
  st.A = 1;
  const auto mb = run_dp<P, parallel::zero<2>>(c, st);
  st.reduction = parallel::grad_reduction::per_step;
  const auto step = run_dp<P, parallel::zero<2>>(c, st);
  check(first_bit_difference(mb.params, step.params) == mb.params.size(), "rank ", c.rank(),
        ": one micro-batch per step, per-micro-batch and per-step reductions differ in the bits");
}

/// A step abandoned part-way (its reductions in flight) leaves no trace:
/// the run after it equals the run without it bit for bit, under zero<0..3>.
template <class P, class Comm>
void abandoned_step_leaves_no_trace(Comm& c) {
  setup st;
  st.steps = 2;
  st.bucket_bytes = 4096;  // several buckets
  auto same = [&](auto strategy) {
    using S = decltype(strategy);
    setup a = st;
    a.abandon_first = true;
    const auto want = run_dp<P, S>(c, st).params, got = run_dp<P, S>(c, a).params;
    check(std::memcmp(want.data(), got.data(), want.size() * sizeof(want[0])) == 0, "rank ",
          c.rank(), ": ", S::name, ": the run after an abandoned step differs");
  };
  same(parallel::zero<0>{});
  same(parallel::zero<1>{});
  same(parallel::zero<2>{});
  same(parallel::zero<3>{});
}

}  // namespace zero_suite
