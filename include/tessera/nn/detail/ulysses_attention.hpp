#pragma once
/// \file nn/detail/ulysses_attention.hpp
/// DeepSpeed-Ulysses attention over a context-parallel group (Jacobs et al.
/// 2023, "DeepSpeed Ulysses: System Optimizations for Enabling Training of
/// Extreme Long Sequence Transformer Models", section 3.1): all-to-alls turn
/// the sequence-sharded q, k, v (B, T/cp, heads, hd), in head-tail order,
/// into head-sharded ones over the whole sequence (B, T, heads/cp, hd), in
/// global order; plain attention runs on them; an all-to-all turns the
/// output back. The public entry points are context_parallel_attention's
/// (nn/context_parallel.hpp), which document shapes, types and errors.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tessera/core/cp_shard.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/nn/detail/cp_exchange.hpp"

namespace tessera::nn::detail {

/// Which heads each rank runs: nh/cp query heads, rank j's from j nh/cp;
/// and their key/value heads: nkv/cp of them from j nkv/cp when cp divides
/// nkv, else (nkv divides cp) the one key/value head its query heads
/// share, j nkv / cp, replicated on cp/nkv ranks.
struct ulysses_heads {
  int cp = 1;
  std::int64_t nh = 0, nkv = 0;
  std::int64_t nhl = 0;     ///< query heads per rank, nh/cp
  std::int64_t hk = 0;      ///< key/value heads per rank: nkv/cp, or 1 when replicated
  bool replicated = false;  ///< cp does not divide nkv: each kv head on cp/nkv ranks

  /// Throws config_error naming the values when cp does not divide nh, or
  /// when neither of cp and nkv divides the other.
  static ulysses_heads of(int cp, std::int64_t nh, std::int64_t nkv) {
    TESSERA_THROW_IF(nh % cp != 0, config_error, "ulysses context parallelism: cp=", cp,
                     " does not divide nh=", nh,
                     " (each rank runs nh/cp query heads; use cp_kind::ring)");
    TESSERA_THROW_IF(nkv % cp != 0 && cp % nkv != 0, config_error,
                     "ulysses context parallelism: neither of cp=", cp, " and nkv=", nkv,
                     " divides the other (a rank's query heads would need parts of several "
                     "key/value heads; use cp_kind::ring)");
    const bool rep = nkv % cp != 0;
    return {cp, nh, nkv, nh / cp, rep ? 1 : nkv / cp, rep};
  }
  /// Rank j's first query head.
  [[nodiscard]] std::int64_t q0(int j) const { return j * nhl; }
  /// Rank j's first key/value head.
  [[nodiscard]] std::int64_t kv0(int j) const { return replicated ? j * nkv / cp : j * hk; }
};

/// X (B, T/cp, H, hd), this rank's tokens -> Y (B, T, Hr, hd): the Hr heads
/// from h0(r) of every token in global order (rank j gets heads h0(j) ..).
template <class U, class Ctx, class Comm, class H0>
void ulysses_to_heads(const Ctx& ctx, Comm& g, std::uint8_t* staging, const cp_shard& sh, U* Y,
                      const U* X, std::int64_t B, std::int64_t H, std::int64_t Hr, std::int64_t hd,
                      H0 h0) {
  const std::int64_t L = sh.tokens(), c = sh.chunk(), S = sh.T, w = Hr * hd;
  cp_all_to_all<U>(
      ctx, g, staging, B * L * w,
      [&](int j, U* dst) { kernels::copy_rows(ctx, dst, w, X + h0(j) * hd, H * hd, w, B * L); },
      [&](auto slot) {
        for (int j = 0; j < sh.cp; ++j)
          for (int m = 0; m < 2; ++m)
            kernels::copy_rows(ctx, Y + sh.of_rank(j).start(m) * w, S * w, slot(j) + m * c * w,
                               L * w, c * w, B);
      });
}

/// Y (B, T, Hr, hd), this rank's heads of every token -> X (B, T/cp, H,
/// hd): rank j's Hr heads land at h0(j); with `sum`, ranks with the same
/// h0 (replicated key/value heads) are added in rank order.
template <class U, class Ctx, class Comm, class H0>
void ulysses_to_tokens(const Ctx& ctx, Comm& g, std::uint8_t* staging, const cp_shard& sh, U* X,
                       const U* Y, std::int64_t B, std::int64_t H, std::int64_t Hr, std::int64_t hd,
                       H0 h0, bool sum) {
  const std::int64_t L = sh.tokens(), c = sh.chunk(), S = sh.T, w = Hr * hd, n = B * L * w;
  cp_all_to_all<U>(
      ctx, g, staging, n,
      [&](int j, U* dst) {
        for (int m = 0; m < 2; ++m)
          kernels::copy_rows(ctx, dst + m * c * w, L * w, Y + sh.of_rank(j).start(m) * w, S * w,
                             c * w, B);
      },
      [&](auto slot) {
        for (int j = 0; j < sh.cp; ++j) {
          if (sum && j > 0 && h0(j) == h0(j - 1)) continue;  // added into the first replica
          if (sum)
            for (int i = j + 1; i < sh.cp && h0(i) == h0(j); ++i)
              residual_add(ctx, slot(j), slot(j), slot(i), n);
          kernels::copy_rows(ctx, X + h0(j) * hd, H * hd, slot(j), w, w, B * L);
        }
      });
}

/// lse (B, nh, T/cp) -> (B, nh/cp, T): this rank's heads, global order.
template <class A, class Ctx, class Comm>
void ulysses_lse_to_heads(const Ctx& ctx, Comm& g, std::uint8_t* staging, const cp_shard& sh, A* lh,
                          const A* lse, std::int64_t B, const ulysses_heads& hp) {
  const std::int64_t L = sh.tokens(), c = sh.chunk(), S = sh.T, nhl = hp.nhl;
  cp_all_to_all<A>(
      ctx, g, staging, B * nhl * L,
      [&](int j, A* dst) {
        kernels::copy_rows(ctx, dst, nhl * L, lse + hp.q0(j) * L, hp.nh * L, nhl * L, B);
      },
      [&](auto slot) {
        for (int j = 0; j < sh.cp; ++j)
          for (int m = 0; m < 2; ++m)
            kernels::copy_rows(ctx, lh + sh.of_rank(j).start(m), S, slot(j) + m * c, L, c, B * nhl);
      });
}

/// lse (B, nh/cp, T) of this rank's heads -> (B, nh, T/cp) of its tokens.
template <class A, class Ctx, class Comm>
void ulysses_lse_to_tokens(const Ctx& ctx, Comm& g, std::uint8_t* staging, const cp_shard& sh,
                           A* lse, const A* lh, std::int64_t B, const ulysses_heads& hp) {
  const std::int64_t L = sh.tokens(), c = sh.chunk(), S = sh.T, nhl = hp.nhl;
  cp_all_to_all<A>(
      ctx, g, staging, B * nhl * L,
      [&](int j, A* dst) {
        for (int m = 0; m < 2; ++m)
          kernels::copy_rows(ctx, dst + m * c, L, lh + sh.of_rank(j).start(m), S, c, B * nhl);
      },
      [&](auto slot) {
        for (int j = 0; j < sh.cp; ++j)
          kernels::copy_rows(ctx, lse + hp.q0(j) * L, hp.nh * L, slot(j), nhl * L, nhl * L, B);
      });
}

/// doc_start (B, T/cp) of every rank, all-gathered (`gathered`, cp B T/cp)
/// and put in global order into ds (B, T).
template <class Ctx, class Comm>
void ulysses_documents(const Ctx& ctx, Comm& g, const cp_shard& sh, std::int32_t* ds,
                       std::int32_t* gathered, const std::int32_t* doc_start, std::int64_t B) {
  const std::int64_t L = sh.tokens(), c = sh.chunk();
  g.all_gather(doc_start, gathered, static_cast<std::size_t>(B * L));
  for (int j = 0; j < sh.cp; ++j)
    for (int m = 0; m < 2; ++m)
      kernels::copy_rows(ctx, ds + sh.of_rank(j).start(m), sh.T, gathered + j * B * L + m * c, L, c,
                         B);
}

/// Elements of one all-to-all slot (what a rank sends one peer) of each
/// kind of tensor; the staging holds 2 cp of the largest, in bytes.
struct ulysses_slots {
  std::int64_t q = 0, kv = 0, lse = 0;  ///< elements of one slot: B L nhl hd, B L hk hd, B nhl L
};

template <class Ctx, class Comm, class T>
void ulysses_attention_forward(const Ctx& ctx, Comm& g, T* out, accum_t<T>* lse, const T* q,
                               const T* k, const T* v, std::int64_t B, std::int64_t S,
                               std::int64_t nh, std::int64_t nkv, std::int64_t hd,
                               const std::int32_t* doc_start) {
  using A = accum_t<T>;
  const int cp = g.size();
  const cp_shard sh = cp_shard::of(S, cp, g.rank());
  const ulysses_heads hp = ulysses_heads::of(cp, nh, nkv);
  const std::int64_t L = sh.tokens(), nqh = B * S * hp.nhl * hd, nkh = B * S * hp.hk * hd;
  const ulysses_slots n{B * L * hp.nhl * hd, B * L * hp.hk * hd, B * hp.nhl * L};
  auto qhead = [&](int j) { return hp.q0(j); };
  auto kvhead = [&](int j) { return hp.kv0(j); };

  // Workspace (context_parallel_attention::bytes counts it).
  auto qh = kernels::make_tensor<T>(ctx, nqh), oh = kernels::make_tensor<T>(ctx, nqh);
  auto kh = kernels::make_tensor<T>(ctx, nkh), vh = kernels::make_tensor<T>(ctx, nkh);
  auto lh = kernels::make_tensor<A>(ctx, B * hp.nhl * S);
  const std::int64_t slot = std::max(
      {cp_slot_bytes<Comm, T>(n.q), cp_slot_bytes<Comm, T>(n.kv), cp_slot_bytes<Comm, A>(n.lse)});
  auto staging = kernels::make_tensor<std::uint8_t>(ctx, 2 * cp * slot);
  auto ds = kernels::make_tensor<std::int32_t>(ctx, doc_start ? B * S : 0);
  auto gathered = kernels::make_tensor<std::int32_t>(ctx, doc_start ? B * S : 0);

  std::uint8_t* st = staging.data();
  ulysses_to_heads(ctx, g, st, sh, qh.data(), q, B, nh, hp.nhl, hd, qhead);
  ulysses_to_heads(ctx, g, st, sh, kh.data(), k, B, nkv, hp.hk, hd, kvhead);
  ulysses_to_heads(ctx, g, st, sh, vh.data(), v, B, nkv, hp.hk, hd, kvhead);
  if (doc_start) ulysses_documents(ctx, g, sh, ds.data(), gathered.data(), doc_start, B);
  attention_forward<T>(ctx, oh.data(), lh.data(), qh.data(), kh.data(), vh.data(), B, S, hp.nhl,
                       hp.hk, hd, kernels::attention_mask{doc_start ? ds.data() : nullptr});
  ulysses_to_tokens(ctx, g, st, sh, out, oh.data(), B, nh, hp.nhl, hd, qhead, false);
  ulysses_lse_to_tokens(ctx, g, st, sh, lse, lh.data(), B, hp);
}

/// The backward with the gradients of the head-sharded attention in Gk:
/// G, or accum_t<T> when key/value heads are replicated (their dk, dv are
/// summed over the replicas unrounded).
template <class Gk, class Ctx, class Comm, class T, class G>
void ulysses_attention_backward_as(const Ctx& ctx, Comm& g, G* dq, G* dk, G* dv, const G* dout,
                                   const T* q, const T* k, const T* v, const T* out,
                                   const accum_t<T>* lse, std::int64_t B, std::int64_t S,
                                   std::int64_t nh, std::int64_t nkv, std::int64_t hd,
                                   const std::int32_t* doc_start) {
  using A = accum_t<T>;
  const int cp = g.size();
  const cp_shard sh = cp_shard::of(S, cp, g.rank());
  const ulysses_heads hp = ulysses_heads::of(cp, nh, nkv);
  const std::int64_t L = sh.tokens(), nqh = B * S * hp.nhl * hd, nkh = B * S * hp.hk * hd;
  const ulysses_slots n{B * L * hp.nhl * hd, B * L * hp.hk * hd, B * hp.nhl * L};
  constexpr bool staged = !std::is_same_v<Gk, G>;  // replicated heads, 16-bit gradients
  auto qhead = [&](int j) { return hp.q0(j); };
  auto kvhead = [&](int j) { return hp.kv0(j); };

  // Workspace (context_parallel_attention::bytes counts it).
  auto qh = kernels::make_tensor<T>(ctx, nqh), oh = kernels::make_tensor<T>(ctx, nqh);
  auto kh = kernels::make_tensor<T>(ctx, nkh), vh = kernels::make_tensor<T>(ctx, nkh);
  auto lh = kernels::make_tensor<A>(ctx, B * hp.nhl * S);
  auto doh = kernels::make_tensor<Gk>(ctx, nqh), dqh = kernels::make_tensor<Gk>(ctx, nqh);
  auto dkh = kernels::make_tensor<Gk>(ctx, nkh), dvh = kernels::make_tensor<Gk>(ctx, nkh);
  auto dog = kernels::make_tensor<G>(ctx, staged ? nqh : 0);                // dout, dq in G
  auto kvl = kernels::make_tensor<Gk>(ctx, staged ? B * L * nkv * hd : 0);  // dk or dv, summed
  const std::int64_t slot = std::max({cp_slot_bytes<Comm, T>(n.q), cp_slot_bytes<Comm, T>(n.kv),
                                      cp_slot_bytes<Comm, A>(n.lse), cp_slot_bytes<Comm, G>(n.q),
                                      cp_slot_bytes<Comm, Gk>(n.kv)});
  auto staging = kernels::make_tensor<std::uint8_t>(ctx, 2 * cp * slot);
  auto ds = kernels::make_tensor<std::int32_t>(ctx, doc_start ? B * S : 0);
  auto gathered = kernels::make_tensor<std::int32_t>(ctx, doc_start ? B * S : 0);

  std::uint8_t* st = staging.data();
  ulysses_to_heads(ctx, g, st, sh, qh.data(), q, B, nh, hp.nhl, hd, qhead);
  ulysses_to_heads(ctx, g, st, sh, kh.data(), k, B, nkv, hp.hk, hd, kvhead);
  ulysses_to_heads(ctx, g, st, sh, vh.data(), v, B, nkv, hp.hk, hd, kvhead);
  ulysses_to_heads(ctx, g, st, sh, oh.data(), out, B, nh, hp.nhl, hd, qhead);
  ulysses_lse_to_heads(ctx, g, st, sh, lh.data(), lse, B, hp);
  if constexpr (staged) {
    ulysses_to_heads(ctx, g, st, sh, dog.data(), dout, B, nh, hp.nhl, hd, qhead);
    cast(ctx, doh.data(), dog.data(), nqh);
  } else {
    ulysses_to_heads(ctx, g, st, sh, doh.data(), dout, B, nh, hp.nhl, hd, qhead);
  }
  if (doc_start) ulysses_documents(ctx, g, sh, ds.data(), gathered.data(), doc_start, B);
  attention_backward<T, Gk>(ctx, dqh.data(), dkh.data(), dvh.data(), doh.data(), qh.data(),
                            kh.data(), vh.data(), oh.data(), lh.data(), B, S, hp.nhl, hp.hk, hd,
                            kernels::attention_mask{doc_start ? ds.data() : nullptr});
  if constexpr (staged) {
    cast(ctx, dog.data(), dqh.data(), nqh);
    ulysses_to_tokens(ctx, g, st, sh, dq, dog.data(), B, nh, hp.nhl, hd, qhead, false);
    ulysses_to_tokens(ctx, g, st, sh, kvl.data(), dkh.data(), B, nkv, hp.hk, hd, kvhead, true);
    cast(ctx, dk, kvl.data(), B * L * nkv * hd);
    ulysses_to_tokens(ctx, g, st, sh, kvl.data(), dvh.data(), B, nkv, hp.hk, hd, kvhead, true);
    cast(ctx, dv, kvl.data(), B * L * nkv * hd);
  } else {
    ulysses_to_tokens(ctx, g, st, sh, dq, dqh.data(), B, nh, hp.nhl, hd, qhead, false);
    ulysses_to_tokens(ctx, g, st, sh, dk, dkh.data(), B, nkv, hp.hk, hd, kvhead, hp.replicated);
    ulysses_to_tokens(ctx, g, st, sh, dv, dvh.data(), B, nkv, hp.hk, hd, kvhead, hp.replicated);
  }
}

template <class Ctx, class Comm, class T, class G>
void ulysses_attention_backward(const Ctx& ctx, Comm& g, G* dq, G* dk, G* dv, const G* dout,
                                const T* q, const T* k, const T* v, const T* out,
                                const accum_t<T>* lse, std::int64_t B, std::int64_t S,
                                std::int64_t nh, std::int64_t nkv, std::int64_t hd,
                                const std::int32_t* doc_start) {
  using A = accum_t<T>;
  // Replicated key/value heads with 16-bit gradients: the head-sharded
  // gradients in accum_t<T>, so the replicas' dk, dv are summed unrounded.
  if (!std::is_same_v<G, A> && ulysses_heads::of(g.size(), nh, nkv).replicated)
    ulysses_attention_backward_as<A>(ctx, g, dq, dk, dv, dout, q, k, v, out, lse, B, S, nh, nkv, hd,
                                     doc_start);
  else
    ulysses_attention_backward_as<G>(ctx, g, dq, dk, dv, dout, q, k, v, out, lse, B, S, nh, nkv, hd,
                                     doc_start);
}

}  // namespace tessera::nn::detail
