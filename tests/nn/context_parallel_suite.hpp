#pragma once
// The multi-rank body of the context-parallel attention tests, written once
// and run under both communicators (STYLE.md, "Tests"):
// tests/nn/context_parallel.cpp runs it on thread ranks (local_world), and
// tests/mpi/context_parallel.cpp under mpirun. A body returns what it
// measured (Catch2 v2 assertions are not thread-safe); the callers assert.
//
// One problem: B sequences of S tokens in float64, drawn from a seed, with
// or without packed documents; every rank computes the single-rank
// attention of the whole sequence itself (the reference), cuts its own
// tokens out (head-tail), runs context-parallel attention on them over the
// group, and returns its worst differences from the reference, whether they
// are the reference's bits, the bytes it sent and allocated, and what
// cp_attention_bytes predicted.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <tessera/core/cp_shard.hpp>
#include <tessera/core/memory.hpp>
#include <tessera/core/numeric.hpp>
#include <tessera/kernels/attention.hpp>
#include <tessera/kernels/context.hpp>
#include <tessera/nn/context_parallel.hpp>

namespace cp_suite {

using namespace tessera;

/// Whole sequences in float64 (inputs drawn in [-1, 1)).
struct problem {
  std::int64_t B = 2, S = 56, nh = 4, nkv = 2, hd = 8;
  std::vector<double> q, k, v, dout;  // (B, S, nh|nkv, hd)
  std::vector<std::int32_t> ds;       // (B, S) global doc_start, or empty: causal only
  const std::int32_t* doc_start() const { return ds.empty() ? nullptr : ds.data(); }
};

inline std::vector<double> draw(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> x(static_cast<std::size_t>(n));
  for (auto& e : x) e = u(gen);
  return x;
}

/// doc_start (B, S) of rows cut into documents of the given lengths.
inline std::vector<std::int32_t> doc_starts(const std::vector<std::vector<std::int64_t>>& rows) {
  std::vector<std::int32_t> ds;
  for (const auto& row : rows) {
    std::int64_t start = 0;
    for (std::int64_t len : row) {
      for (std::int64_t i = 0; i < len; ++i) ds.push_back(static_cast<std::int32_t>(start));
      start += len;
    }
  }
  return ds;
}

/// The problem the tests share: B 2, S 56 (head-tail chunks of 14 tokens
/// for cp 2 and 7 for cp 4, neither a multiple of the tiles 3 and 5), hd 8.
/// Documents, when asked for, cross chunk edges; row 0 has a one-token
/// document at 14 (a chunk edge for cp 2 and 4), row 1 one-token documents
/// at 0, 21 (a cp-4 chunk's first token) and 22.
inline problem make_problem(std::int64_t nh, std::int64_t nkv, bool documents,
                            std::uint64_t seed = 91) {
  problem p;
  p.nh = nh;
  p.nkv = nkv;
  const std::int64_t nq = p.B * p.S * nh * p.hd, nk = p.B * p.S * nkv * p.hd;
  p.q = draw(nq, seed);
  p.k = draw(nk, seed + 1);
  p.v = draw(nk, seed + 2);
  p.dout = draw(nq, seed + 3);
  if (documents) p.ds = doc_starts({{5, 9, 1, 6, 7, 13, 15}, {1, 20, 1, 1, 33}});
  return p;
}

template <class T>
std::vector<T> cast_all(const std::vector<double>& x) {
  std::vector<T> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = to<T>(x[i]);
  return y;
}
template <class T>
double as_double(T x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return static_cast<double>(to<float>(x));
}
template <class T>
std::vector<double> widen(const std::vector<T>& x) {
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = as_double(x[i]);
  return y;
}

/// Single-rank attention of the whole sequences with storage T and
/// gradients G, widened to float64: out, lse (B, nh, S), dq, dk, dv.
struct reference {
  std::vector<double> out, lse, dq, dk, dv;
};
template <class T, class G>
reference single_rank(const problem& p, kernels::attention_tiles tiles) {
  using A = accum_t<T>;
  const kernels::host_context ctx{&host::default_resource(), 0, tiles};
  const auto q = cast_all<T>(p.q), k = cast_all<T>(p.k), v = cast_all<T>(p.v);
  const auto dout = cast_all<G>(p.dout);
  std::vector<T> out(q.size());
  std::vector<A> lse(static_cast<std::size_t>(p.B * p.nh * p.S));
  std::vector<G> dq(q.size()), dk(k.size()), dv(v.size());
  const kernels::attention_mask mask{p.doc_start()};
  kernels::attention_forward<T>(ctx, out.data(), lse.data(), q.data(), k.data(), v.data(), p.B, p.S,
                                p.nh, p.nkv, p.hd, mask);
  kernels::attention_backward<T, G>(ctx, dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                    k.data(), v.data(), out.data(), lse.data(), p.B, p.S, p.nh,
                                    p.nkv, p.hd, mask);
  return {widen(out), widen(lse), widen(dq), widen(dk), widen(dv)};
}

/// What one rank measured.
struct rank_result {
  int rank = 0;
  double out = 0, lse = 0, dq = 0, dk = 0,
         dv = 0;      // worst |cp - reference| (inf: NaN or unwritten)
  bool bits = false;  // every output equals the reference bit for bit (as float64)
  std::int64_t forward_sent = 0, backward_sent = 0;        // the communicator's counters
  std::int64_t forward_peak = 0, backward_peak = 0;        // the context resource's peak
  nn::cp_attention_bytes predicted;                        // bytes()
  std::int64_t forward_scratch = 0, backward_scratch = 0;  // the host kernels' own scratch
};

inline double worst(const std::vector<double>& a, const std::vector<double>& b) {
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;  // equal infinities included
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    w = std::max(w, std::abs(a[i] - b[i]));
  }
  return w;
}
inline bool same(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

/// The reference cut to this rank's tokens.
inline reference cut(const reference& ref, const problem& p, const cp_shard& s) {
  const kernels::host_context ctx{};
  reference r;
  auto part = [&](const std::vector<double>& whole, std::int64_t outer, std::int64_t width) {
    std::vector<double> local(static_cast<std::size_t>(outer * s.tokens() * width));
    nn::shard_tokens(ctx, s, local.data(), whole.data(), outer, width);
    return local;
  };
  r.out = part(ref.out, p.B, p.nh * p.hd);
  r.lse = part(ref.lse, p.B * p.nh, 1);
  r.dq = part(ref.dq, p.B, p.nh * p.hd);
  r.dk = part(ref.dk, p.B, p.nkv * p.hd);
  r.dv = part(ref.dv, p.B, p.nkv * p.hd);
  return r;
}

/// This rank's part of context-parallel attention over `g` (every rank of
/// g calls it): storage T, gradients G, the host context with `tiles` over
/// a resource of its own.
template <class T, class G, class Comm>
rank_result run_rank(Comm& g, const problem& p, const reference& ref, nn::cp_kind kind,
                     kernels::attention_tiles tiles) {
  using A = accum_t<T>;
  host_memory_resource mr;
  const kernels::host_context ctx{&mr, 0, tiles};
  const cp_shard s = cp_shard::of(p.S, g.size(), g.rank());
  const std::int64_t B = p.B, L = s.tokens(), nh = p.nh, nkv = p.nkv, hd = p.hd;
  auto local = [&](const std::vector<double>& whole, std::int64_t width) {
    std::vector<double> x(static_cast<std::size_t>(B * L * width));
    nn::shard_tokens(kernels::host_context{}, s, x.data(), whole.data(), B, width);
    return x;
  };
  const auto q = cast_all<T>(local(p.q, nh * hd)), k = cast_all<T>(local(p.k, nkv * hd)),
             v = cast_all<T>(local(p.v, nkv * hd));
  const auto dout = cast_all<G>(local(p.dout, nh * hd));
  std::vector<std::int32_t> ds;
  if (!p.ds.empty()) {
    ds.resize(static_cast<std::size_t>(B * L));
    nn::shard_tokens(kernels::host_context{}, s, ds.data(), p.ds.data(), B, std::int64_t{1});
  }
  const kernels::attention_mask mask{ds.empty() ? nullptr : ds.data()};
  const A nan = std::numeric_limits<A>::quiet_NaN();  // poison: every output must be written
  std::vector<T> out(q.size(), to<T>(nan));
  std::vector<A> lse(static_cast<std::size_t>(B * nh * L), nan);
  std::vector<G> dq(q.size(), to<G>(nan)), dk(k.size(), to<G>(nan)), dv(v.size(), to<G>(nan));

  const nn::context_parallel_attention<Comm> cpa{&g, kind};
  rank_result res;
  res.rank = g.rank();
  g.reset_stats();
  mr.reset_peak();
  cpa.forward(ctx, out.data(), lse.data(), q.data(), k.data(), v.data(), B, p.S, nh, nkv, hd, mask);
  res.forward_sent = static_cast<std::int64_t>(g.bytes_sent());
  res.forward_peak = static_cast<std::int64_t>(mr.stats().peak_allocated);
  g.reset_stats();
  mr.reset_peak();
  cpa.backward(ctx, dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
               out.data(), lse.data(), B, p.S, nh, nkv, hd, mask);
  res.backward_sent = static_cast<std::int64_t>(g.bytes_sent());
  res.backward_peak = static_cast<std::int64_t>(mr.stats().peak_allocated);
  res.predicted = cpa.template bytes<T, G>(B, p.S, nh, nkv, hd, mask.doc_start != nullptr);

  // The host kernels' scratch on top of the layer's workspace (attention.hpp).
#if defined(_OPENMP)
  const std::int64_t threads = omp_get_max_threads();
#else
  const std::int64_t threads = 1;
#endif
  const auto a = static_cast<std::int64_t>(sizeof(A));
  namespace kd = kernels::detail;
  if (kind == nn::cp_kind::ring) {
    const std::int64_t c = s.chunk();
    res.forward_scratch = threads * kd::attention_forward_tile_elements(tiles, c, c, hd) * a;
    res.backward_scratch =
        (B * nh * c + threads * kd::attention_backward_tile_elements(tiles, c, c, hd)) * a;
  } else {
    const std::int64_t S = p.S, nhl = nh / g.size();
    const bool replicated = nkv % g.size() != 0;
    // 16-bit gradients of whole heads go through the kernel's float dq.
    const bool wide_dq = !std::is_same_v<G, A> && !replicated;
    res.forward_scratch = threads * kd::attention_forward_tile_elements(tiles, S, S, hd) * a;
    res.backward_scratch =
        (B * nhl * S + threads * kd::attention_backward_tile_elements(tiles, S, S, hd) +
         (wide_dq ? B * S * nhl * hd : 0)) *
        a;
  }

  const reference want = cut(ref, p, s);
  const reference got{widen(out), widen(lse), widen(dq), widen(dk), widen(dv)};
  res.out = worst(got.out, want.out);
  res.lse = worst(got.lse, want.lse);
  res.dq = worst(got.dq, want.dq);
  res.dk = worst(got.dk, want.dk);
  res.dv = worst(got.dv, want.dv);
  res.bits = same(got.out, want.out) && same(got.lse, want.lse) && same(got.dq, want.dq) &&
             same(got.dk, want.dk) && same(got.dv, want.dv);
  return res;
}

}  // namespace cp_suite
