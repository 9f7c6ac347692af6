#pragma once
// The multi-rank body of the context-parallel attention tests, written once
// and run under both communicators (STYLE.md, "Tests"):
// tests/nn/context_parallel.cpp runs it on thread ranks (local_world), and
// tests/mpi/context_parallel.cpp under mpirun. A body returns what it
// measured (Catch2 v2 assertions are not thread-safe); the callers assert.
//
// One problem: B sequences of S tokens in float64, drawn from a seed, with
// or without packed documents. The reference is attention written out here
// in float64 (naive(): every score, a plain softmax, the causal and
// document masks by position), not the library's kernels; the single-rank
// kernels' result is kept beside it only for the bit-for-bit checks. Every
// rank cuts its own tokens out (head-tail), runs context-parallel attention
// on them over the group, and returns its outputs, their worst differences
// from the reference, whether they are the single-rank kernels' bits, the
// bytes it sent and allocated, and what cp_attention_bytes predicted;
// expected_bytes() states the same figures in closed form, from the
// tensors the layer keeps and sends.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
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

#include "../kernels/kernel_testing.hpp"

namespace cp_suite {

using namespace tessera;
using tessera::testing::to_double;

/// Whole sequences in float64 (inputs drawn in [-1, 1)).
struct problem {
  std::int64_t B = 2, S = 48, nh = 12, nkv = 4, hd = 8;
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

/// The problem the tests share: B 2, S 48, nh 12 (cp 1 to 4 divide it, so
/// Ulysses runs at each), hd 8. Head-tail chunks of 24, 12, 8 and 6 tokens
/// for cp 1 to 4, none a multiple of the tiles 5 and 7 the callers use.
/// Documents, when asked for, cross chunk edges; row 0 has a one-token
/// document at 12 (a chunk edge for cp 2 and 4), row 1 one-token
/// documents at 0, 24 (a chunk edge for every cp) and 25.
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
  if (documents) p.ds = doc_starts({{5, 7, 1, 10, 9, 16}, {1, 23, 1, 1, 22}});
  return p;
}

template <class T>
std::vector<T> cast_all(const std::vector<double>& x) {
  std::vector<T> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = to<T>(x[i]);
  return y;
}

/// out, lse (B, nh, S), dq, dk, dv of whole sequences (or of a rank's
/// tokens), widened to float64.
struct reference {
  std::vector<double> out, lse, dq, dk, dv;
};

/// Causal attention of the whole sequences in float64, written out plainly
/// (the definition, not the library's tiled online softmax): for query t of
/// head h, the keys s of its key/value head h / (nh / nkv) with
/// doc_start[t] <= s <= t (0 <= s <= t without documents), scores
/// x_s = q_t . k_s / sqrt(hd), p_s = exp(x_s - m) / sum exp(x - m) with m
/// their max, out_t = sum p_s v_s, lse_t = m + log sum exp(x - m).
/// Backward from the same p: dv_s += p_s dout_t, dp_s = dout_t . v_s,
/// D_t = dout_t . out_t, ds_s = p_s (dp_s - D_t), dq_t = sum ds_s k_s /
/// sqrt(hd), dk_s += ds_s q_t / sqrt(hd).
inline reference naive(const problem& p) {
  const std::int64_t B = p.B, S = p.S, nh = p.nh, nkv = p.nkv, hd = p.hd, group = nh / nkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  reference r;
  r.out.assign(p.q.size(), 0.0);
  r.lse.assign(static_cast<std::size_t>(B * nh * S), 0.0);
  r.dq.assign(p.q.size(), 0.0);
  r.dk.assign(p.k.size(), 0.0);
  r.dv.assign(p.v.size(), 0.0);
  auto qi = [&](std::int64_t b, std::int64_t t, std::int64_t h) {
    return static_cast<std::size_t>(((b * S + t) * nh + h) * hd);
  };
  auto ki = [&](std::int64_t b, std::int64_t s, std::int64_t g) {
    return static_cast<std::size_t>(((b * S + s) * nkv + g) * hd);
  };
  std::vector<double> x(static_cast<std::size_t>(S)), pr(static_cast<std::size_t>(S));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < nh; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t t = 0; t < S; ++t) {
        const std::int64_t first = p.ds.empty() ? 0 : p.ds[static_cast<std::size_t>(b * S + t)];
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t s = first; s <= t; ++s) {
          double dot = 0;
          for (std::int64_t d = 0; d < hd; ++d) dot += p.q[qi(b, t, h) + d] * p.k[ki(b, s, g) + d];
          x[s] = dot * scale;
          m = std::max(m, x[s]);
        }
        double sum = 0;
        for (std::int64_t s = first; s <= t; ++s) sum += std::exp(x[s] - m);
        r.lse[static_cast<std::size_t>((b * nh + h) * S + t)] = m + std::log(sum);
        for (std::int64_t s = first; s <= t; ++s) {
          pr[s] = std::exp(x[s] - m) / sum;
          for (std::int64_t d = 0; d < hd; ++d)
            r.out[qi(b, t, h) + d] += pr[s] * p.v[ki(b, s, g) + d];
        }
        double D = 0;
        for (std::int64_t d = 0; d < hd; ++d) D += p.dout[qi(b, t, h) + d] * r.out[qi(b, t, h) + d];
        for (std::int64_t s = first; s <= t; ++s) {
          double dp = 0;
          for (std::int64_t d = 0; d < hd; ++d) {
            r.dv[ki(b, s, g) + d] += pr[s] * p.dout[qi(b, t, h) + d];
            dp += p.dout[qi(b, t, h) + d] * p.v[ki(b, s, g) + d];
          }
          const double dsc = pr[s] * (dp - D) * scale;
          for (std::int64_t d = 0; d < hd; ++d) {
            r.dq[qi(b, t, h) + d] += dsc * p.k[ki(b, s, g) + d];
            r.dk[ki(b, s, g) + d] += dsc * p.q[qi(b, t, h) + d];
          }
        }
      }
    }
  return r;
}

/// Single-rank attention of the whole sequences with the library's host
/// kernels, storage T and gradients G, widened to float64: what Ulysses
/// reproduces bit for bit where whole key/value groups stay on one rank.
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
  return {to_double(out), to_double(lse), to_double(dq), to_double(dk), to_double(dv)};
}

/// The bytes one rank sends and holds, per call.
struct byte_figures {
  std::int64_t forward_sent = 0, backward_sent = 0, forward_workspace = 0, backward_workspace = 0;
};

/// The layer's traffic and workspace in closed form, from the tensors it
/// keeps and sends (nn/detail/ring_attention.hpp, ulysses_attention.hpp),
/// for storage T and gradients G on a host communicator (16-bit tensors
/// travel as float). L = S/cp tokens per rank, c = S/(2 cp) per chunk;
/// element sizes p (T), a (accum_t<T>), g (G), pw and gw (T and G on the
/// wire).
template <class T, class G>
byte_figures expected_bytes(nn::cp_kind kind, std::int64_t cp, const problem& pr, bool documents) {
  const std::int64_t B = pr.B, S = pr.S, nh = pr.nh, nkv = pr.nkv, hd = pr.hd;
  const std::int64_t L = S / cp, c = S / (2 * cp);
  const std::int64_t p = sizeof(T), a = sizeof(accum_t<T>), g = sizeof(G);
  const std::int64_t pw = sizeof(T) == 2 ? 4 : p, gw = sizeof(G) == 2 ? 4 : g;
  const std::int64_t i32 = 4;
  byte_figures f;
  if (kind == nn::cp_kind::ring) {
    const std::int64_t Q = B * L * nh * hd;    // this rank's q (or out, dq, dout)
    const std::int64_t KV = B * L * nkv * hd;  // this rank's k (or v, dk, dv)
    const std::int64_t LSE = B * nh * L;
    // The k, v blocks: the one in hand and the next (one at cp 1), and the
    // one in hand as T when it travels as float.
    const std::int64_t blocks =
        std::min<std::int64_t>(cp, 2) * 2 * KV * pw + (pw != p ? 2 * KV * p : 0);
    const std::int64_t docs = documents ? B * L * i32 : 0;  // doc_start, chunk-major
    // Forward: the k, v block goes to the next rank cp - 1 times.
    f.forward_sent = (cp - 1) * 2 * KV * pw;
    // Backward: the block again, with its float dk, dv accumulator.
    f.backward_sent = (cp - 1) * 2 * KV * (pw + a);
    // Forward: q chunk-major (then out, rounded); the out and lse
    // accumulators; one block's partial out and lse (one chunk).
    f.forward_workspace =
        Q * p + docs + blocks + (Q + LSE) * a + (B * c * nh * hd + B * nh * c) * a;
    // Backward: q, out (T) and lse chunk-major; dout as accum_t<T> and the
    // dq accumulator; 16-bit gradients staged through G; the own block's
    // dk, dv; two travelling accumulators (cp > 1); this rank's part of a
    // block (cp > 2); a second query chunk's dk, dv of one key chunk.
    f.backward_workspace = 2 * Q * p + LSE * a + docs + 2 * Q * a +
                           (g != a ? std::max(Q, 2 * KV) * g : 0) + blocks + 2 * KV * a +
                           (cp > 1 ? 2 * 2 * KV * a : 0) + (cp > 2 ? 2 * KV * a : 0) + KV * a;
    return f;
  }
  // Ulysses: rank j's nh/cp query heads, and nkv/cp key/value heads (or the
  // one its query heads share, replicated, when cp does not divide nkv).
  const std::int64_t nhl = nh / cp;
  const bool replicated = nkv % cp != 0;
  const std::int64_t hk = replicated ? 1 : nkv / cp;
  const bool staged = replicated && g != a;  // replicas' dk, dv summed in accum_t<T>
  const std::int64_t gk = staged ? a : g, gkw = staged ? a : gw;
  // What one rank sends one peer of each tensor (an all-to-all slot).
  const std::int64_t q1 = B * L * nhl * hd, kv1 = B * L * hk * hd, lse1 = B * nhl * L;
  const std::int64_t gathered = documents ? (cp - 1) * B * L * i32 : 0;  // doc_start all_gather
  // Forward: q, k, v to heads, out and lse back.
  f.forward_sent = (cp - 1) * (q1 * pw + 2 * kv1 * pw + q1 * pw + lse1 * a) + gathered;
  // Backward: q, k, v, out, lse, dout to heads; dq, dk, dv back.
  f.backward_sent =
      (cp - 1) * (2 * q1 * pw + 2 * kv1 * pw + lse1 * a + q1 * gw + q1 * gw + 2 * kv1 * gkw) +
      gathered;
  const std::int64_t QH = B * S * nhl * hd, KH = B * S * hk * hd, LH = B * nhl * S;
  const std::int64_t docs = documents ? 2 * B * S * i32 : 0;  // gathered, and in global order
  // Forward: q, out, k, v (T) and lse by heads; the all-to-all staging,
  // 2 cp slots of the largest piece.
  f.forward_workspace =
      2 * (QH + KH) * p + LH * a + 2 * cp * std::max({q1 * pw, kv1 * pw, lse1 * a}) + docs;
  // Backward: the same by heads, and dout, dq, dk, dv by heads (in
  // accum_t<T> when replicas are summed); staged, dout and dq in G and one
  // summed dk or dv of this rank's tokens; the staging of the largest piece.
  f.backward_workspace = 2 * (QH + KH) * p + LH * a + 2 * (QH + KH) * gk +
                         (staged ? QH * g + B * L * nkv * hd * a : 0) +
                         2 * cp * std::max({q1 * pw, kv1 * pw, lse1 * a, q1 * gw, kv1 * gkw}) +
                         docs;
  return f;
}

/// What one rank measured.
struct rank_result {
  int rank = 0;
  reference got;  // its out, lse, dq, dk, dv (local tokens), widened
  double out = 0, lse = 0, dq = 0, dk = 0,
         dv = 0;      // worst |cp - naive reference| (inf: NaN or unwritten)
  bool bits = false;  // every output equals the single-rank kernels' bit for bit (as float64)
  std::int64_t forward_sent = 0, backward_sent = 0;        // the communicator's counters
  std::int64_t forward_peak = 0, backward_peak = 0;        // the context resource's peak
  nn::cp_attention_bytes predicted;                        // bytes()
  byte_figures expected;                                   // expected_bytes()
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
/// The five tensors bit for bit.
inline bool same(const reference& a, const reference& b) {
  return same(a.out, b.out) && same(a.lse, b.lse) && same(a.dq, b.dq) && same(a.dk, b.dk) &&
         same(a.dv, b.dv);
}

/// A whole-sequence result cut to this rank's tokens.
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
/// a resource of its own. `want`: the naive reference of the whole
/// sequences (of the inputs as T holds them); `bits_of`: the single-rank
/// kernels' result to compare bit for bit, or null.
template <class T, class G, class Comm>
rank_result run_rank(Comm& g, const problem& p, const reference& want_whole, nn::cp_kind kind,
                     kernels::attention_tiles tiles, const reference* bits_of = nullptr) {
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
  res.expected = expected_bytes<T, G>(kind, g.size(), p, mask.doc_start != nullptr);

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

  res.got = {to_double(out), to_double(lse), to_double(dq), to_double(dk), to_double(dv)};
  const reference want = cut(want_whole, p, s);
  res.out = worst(res.got.out, want.out);
  res.lse = worst(res.got.lse, want.lse);
  res.dq = worst(res.got.dq, want.dq);
  res.dk = worst(res.got.dk, want.dk);
  res.dv = worst(res.got.dv, want.dv);
  if (bits_of != nullptr) res.bits = same(res.got, cut(*bits_of, p, s));
  return res;
}

}  // namespace cp_suite
