#pragma once
/// \file nn/detail/ring_attention.hpp
/// Ring attention over a context-parallel group (Liu, Zaharia and Abbeel
/// 2023, "Ring Attention with Blockwise Transformers", section 3 and
/// algorithm 1), on head-tail shards (core/cp_shard.hpp): the public entry
/// points are context_parallel_attention's (nn/context_parallel.hpp), which
/// document shapes, types and errors; this file is their body.
///
/// Inside, a rank's two token chunks are kept chunk-major, (2, B, c, ...)
/// with c = T/(2 cp), so that each chunk is a dense (B, c, ...) tensor the
/// attention kernels take; a key/value block is [k chunk 0, k chunk 1,
/// v chunk 0, v chunk 1], and so is a dk/dv block. At ring step i rank r
/// holds the block of rank (r - i) mod cp.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tessera/comm/tags.hpp"
#include "tessera/core/cp_shard.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/nn/detail/cp_exchange.hpp"

namespace tessera::nn::detail {

/// Element counts of a ring's pieces: one query chunk (nq = B c nh hd),
/// one key chunk (nk = B c nkv hd), one chunk's lse (nl = B nh c).
struct ring_sizes {
  std::int64_t c = 0, nq = 0, nk = 0, nl = 0;
  static ring_sizes of(const cp_shard& s, std::int64_t B, std::int64_t nh, std::int64_t nkv,
                       std::int64_t hd) {
    const std::int64_t c = s.chunk();
    return {c, B * c * nh * hd, B * c * nkv * hd, B * nh * c};
  }
};

/// The forward: out, lse (local layout) of this rank's queries against
/// every rank's keys, the key/value blocks passed around the ring while
/// each step's attention runs.
template <class Ctx, class Comm, class T>
void ring_attention_forward(const Ctx& ctx, Comm& g, T* out, accum_t<T>* lse, const T* q,
                            const T* k, const T* v, std::int64_t B, std::int64_t S, std::int64_t nh,
                            std::int64_t nkv, std::int64_t hd, const std::int32_t* doc_start) {
  using A = accum_t<T>;
  static_assert(cp_check_wire<Comm, T>());
  using W = cp_wire_t<Comm, T>;
  constexpr bool narrow = !std::is_same_v<W, T>;  // 16-bit blocks travel as float
  const int cp = g.size(), r = g.rank(), next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  const cp_shard sh = cp_shard::of(S, cp, r);
  // Named copies, not a structured binding: the lambdas below capture them
  // (clang before 16 refuses to capture structured bindings).
  const ring_sizes sz = ring_sizes::of(sh, B, nh, nkv, hd);
  const std::int64_t c = sz.c, nq = sz.nq, nk = sz.nk, nl = sz.nl;

  // Workspace (context_parallel_attention::bytes counts it).
  auto qc = kernels::make_tensor<T>(ctx, 2 * nq);  // q chunk-major; at the end, out rounded
  auto dsc = kernels::make_tensor<std::int32_t>(ctx, doc_start ? 2 * B * c : 0);
  decltype(kernels::make_tensor<W>(ctx, 0)) ring[2];
  for (int i = 0; i < std::min(cp, 2); ++i) ring[i] = kernels::make_tensor<W>(ctx, 4 * nk);
  auto kvt = kernels::make_tensor<T>(ctx, narrow ? 4 * nk : 0);  // the block in hand, narrowed
  auto oacc = kernels::make_tensor<A>(ctx, 2 * nq), lacc = kernels::make_tensor<A>(ctx, 2 * nl);
  auto opart = kernels::make_tensor<A>(ctx, nq), lpart = kernels::make_tensor<A>(ctx, nl);

  cp_to_chunks(ctx, qc.data(), q, B, c, nh * hd);
  if (doc_start) cp_to_chunks(ctx, dsc.data(), doc_start, B, c, std::int64_t{1});
  T* own = narrow ? kvt.data() : reinterpret_cast<T*>(ring[0].data());
  cp_to_chunks(ctx, own, k, B, c, nkv * hd);
  cp_to_chunks(ctx, own + 2 * nk, v, B, c, nkv * hd);
  if constexpr (narrow) cast(ctx, ring[0].data(), kvt.data(), 4 * nk);

  bool first[2] = {true, true};  // query chunk j's accumulator not yet written
  for (int i = 0; i < cp; ++i) {
    const cp_shard kv = sh.of_rank((r - i + cp) % cp);  // the owner of the block in hand
    // Pass the block on and take the next one, before computing with it.
    cp_batch<Comm> x(g);
    if (i + 1 < cp) {
      x.send(ring[i % 2].data(), 4 * nk, next, comm::cp_tag_kv);
      x.recv(ring[(i + 1) % 2].data(), 4 * nk, prev, comm::cp_tag_kv);
    }
    x.start();
    const T* blk = narrow ? kvt.data() : reinterpret_cast<const T*>(ring[i % 2].data());
    for (int j = 0; j < 2; ++j)
      for (int m = 0; m < 2; ++m) {
        const std::int64_t q0 = sh.start(j), k0 = kv.start(m);
        if (k0 >= q0 + c) continue;  // wholly in the queries' future
        A* o = first[j] ? oacc.data() + j * nq : opart.data();
        A* l = first[j] ? lacc.data() + j * nl : lpart.data();
        attention_forward<T, A>(
            ctx, o, l, qc.data() + j * nq, blk + m * nk, blk + (2 + m) * nk, B, c, nh, nkv, hd,
            kernels::attention_mask{doc_start ? dsc.data() + j * B * c : nullptr},
            kernels::attention_span{q0, k0, c});
        if (!first[j])
          attention_merge(ctx, oacc.data() + j * nq, lacc.data() + j * nl, opart.data(),
                          lpart.data(), B, c, nh, hd);
        first[j] = false;
      }
    x.wait();
    if constexpr (narrow)
      if (i + 1 < cp) cast(ctx, kvt.data(), ring[(i + 1) % 2].data(), 4 * nk);
  }
  cast(ctx, qc.data(), oacc.data(), 2 * nq);  // rounded once
  cp_from_chunks(ctx, out, qc.data(), B, c, nh * hd);
  cp_from_chunks(ctx, lse, lacc.data(), B * nh, c, std::int64_t{1});
}

/// The backward: the key/value blocks go around the ring again, each with
/// the float dk/dv accumulator of the ranks it visited; this rank adds its
/// queries' part and passes both on. A block's accumulator is born at the
/// first rank after its owner and reaches the owner after cp - 1 hops,
/// where the owner's own part (computed at step 0) is added.
template <class Ctx, class Comm, class T, class G>
void ring_attention_backward(const Ctx& ctx, Comm& g, G* dq, G* dk, G* dv, const G* dout,
                             const T* q, const T* k, const T* v, const T* out,
                             const accum_t<T>* lse, std::int64_t B, std::int64_t S, std::int64_t nh,
                             std::int64_t nkv, std::int64_t hd, const std::int32_t* doc_start) {
  using A = accum_t<T>;
  static_assert(cp_check_wire<Comm, T>());
  using W = cp_wire_t<Comm, T>;
  constexpr bool narrow = !std::is_same_v<W, T>;
  constexpr bool wide_grad = !std::is_same_v<G, A>;  // 16-bit gradients: staged
  const int cp = g.size(), r = g.rank(), next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  const cp_shard sh = cp_shard::of(S, cp, r);
  // Named copies, not a structured binding: the lambdas below capture them
  // (clang before 16 refuses to capture structured bindings).
  const ring_sizes sz = ring_sizes::of(sh, B, nh, nkv, hd);
  const std::int64_t c = sz.c, nq = sz.nq, nk = sz.nk, nl = sz.nl;

  // Workspace (context_parallel_attention::bytes counts it).
  auto qc = kernels::make_tensor<T>(ctx, 2 * nq), oc = kernels::make_tensor<T>(ctx, 2 * nq);
  auto lc = kernels::make_tensor<A>(ctx, 2 * nl);
  auto dsc = kernels::make_tensor<std::int32_t>(ctx, doc_start ? 2 * B * c : 0);
  auto doc = kernels::make_tensor<A>(ctx, 2 * nq), dqc = kernels::make_tensor<A>(ctx, 2 * nq);
  auto stg = kernels::make_tensor<G>(ctx, wide_grad ? std::max(2 * nq, 4 * nk) : 0);
  decltype(kernels::make_tensor<W>(ctx, 0)) ring[2];
  for (int i = 0; i < std::min(cp, 2); ++i) ring[i] = kernels::make_tensor<W>(ctx, 4 * nk);
  auto kvt = kernels::make_tensor<T>(ctx, narrow ? 4 * nk : 0);
  auto own = kernels::make_tensor<A>(ctx, 4 * nk);   // the own block's dk/dv, then the sum
  decltype(kernels::make_tensor<A>(ctx, 0)) acc[2];  // travelling accumulators
  for (int i = 0; i < (cp > 1 ? 2 : 0); ++i) acc[i] = kernels::make_tensor<A>(ctx, 4 * nk);
  auto part = kernels::make_tensor<A>(ctx, cp > 2 ? 4 * nk : 0);  // this rank's part of a block
  auto tmp = kernels::make_tensor<A>(ctx, 2 * nk);  // a second query chunk's dk, dv of a key chunk

  cp_to_chunks(ctx, qc.data(), q, B, c, nh * hd);
  cp_to_chunks(ctx, oc.data(), out, B, c, nh * hd);
  cp_to_chunks(ctx, lc.data(), lse, B * nh, c, std::int64_t{1});
  if (doc_start) cp_to_chunks(ctx, dsc.data(), doc_start, B, c, std::int64_t{1});
  if constexpr (wide_grad) {
    cp_to_chunks(ctx, stg.data(), dout, B, c, nh * hd);
    cast(ctx, doc.data(), stg.data(), 2 * nq);
  } else {
    cp_to_chunks(ctx, doc.data(), dout, B, c, nh * hd);
  }
  T* ownkv = narrow ? kvt.data() : reinterpret_cast<T*>(ring[0].data());
  cp_to_chunks(ctx, ownkv, k, B, c, nkv * hd);
  cp_to_chunks(ctx, ownkv + 2 * nk, v, B, c, nkv * hd);
  if constexpr (narrow) cast(ctx, ring[0].data(), kvt.data(), 4 * nk);

  bool dq_first[2] = {true, true};
  // This rank's queries' dk, dv of the block `blk` of rank kv into
  // `target` (written; zero where no query sees a key chunk), dq += theirs.
  auto block = [&](A* target, const T* blk, const cp_shard& kv) {
    for (int m = 0; m < 2; ++m) {
      const std::int64_t k0 = kv.start(m);
      A* dkm = target + m * nk;
      A* dvm = target + (2 + m) * nk;
      bool written = false;
      for (int j = 0; j < 2; ++j) {
        const std::int64_t q0 = sh.start(j);
        if (k0 >= q0 + c) continue;  // wholly in the queries' future
        attention_backward<T, A>(
            ctx, dqc.data() + j * nq, written ? tmp.data() : dkm, written ? tmp.data() + nk : dvm,
            doc.data() + j * nq, qc.data() + j * nq, blk + m * nk, blk + (2 + m) * nk,
            oc.data() + j * nq, lc.data() + j * nl, B, c, nh, nkv, hd,
            kernels::attention_mask{doc_start ? dsc.data() + j * B * c : nullptr},
            kernels::attention_span{q0, k0, c},
            dq_first[j] ? kernels::attention_dq::write : kernels::attention_dq::accumulate);
        dq_first[j] = false;
        if (written) {
          residual_add(ctx, dkm, dkm, tmp.data(), nk);
          residual_add(ctx, dvm, dvm, tmp.data() + nk, nk);
        }
        written = true;
      }
      if (!written) {
        kernels::zero_elements(ctx, dkm, nk);
        kernels::zero_elements(ctx, dvm, nk);
      }
    }
  };

  for (int i = 0; i < cp; ++i) {
    const cp_shard kv = sh.of_rank((r - i + cp) % cp);
    // One batch: the next block in, this one out, and the accumulator of
    // the block of step i - 1 out while this step's comes in.
    cp_batch<Comm> x(g);
    if (i + 1 < cp) {
      x.send(ring[i % 2].data(), 4 * nk, next, comm::cp_tag_kv);
      x.recv(ring[(i + 1) % 2].data(), 4 * nk, prev, comm::cp_tag_kv);
    }
    if (i >= 2) {
      x.send(acc[(i - 1) % 2].data(), 4 * nk, next, comm::cp_tag_dkv);
      x.recv(acc[i % 2].data(), 4 * nk, prev, comm::cp_tag_dkv);
    }
    x.start();
    const T* blk = narrow ? kvt.data() : reinterpret_cast<const T*>(ring[i % 2].data());
    // Step 0: the own block; step 1: the accumulator is born here;
    // later: this rank's part, added to the accumulator that came in.
    A* target = i == 0 ? own.data() : i == 1 ? acc[1].data() : part.data();
    block(target, blk, kv);
    x.wait();
    if (i >= 2) residual_add(ctx, acc[i % 2].data(), acc[i % 2].data(), part.data(), 4 * nk);
    if constexpr (narrow)
      if (i + 1 < cp) cast(ctx, kvt.data(), ring[(i + 1) % 2].data(), 4 * nk);
  }
  if (cp > 1) {
    // The last accumulator to its owner (rank r + 1), this rank's own in.
    cp_batch<Comm> y(g);
    y.send(acc[(cp - 1) % 2].data(), 4 * nk, next, comm::cp_tag_dkv);
    y.recv(acc[cp % 2].data(), 4 * nk, prev, comm::cp_tag_dkv);
    y.start();
    y.wait();
    residual_add(ctx, own.data(), own.data(), acc[cp % 2].data(), 4 * nk);
  }
  if constexpr (wide_grad) {
    cast(ctx, stg.data(), dqc.data(), 2 * nq);
    cp_from_chunks(ctx, dq, stg.data(), B, c, nh * hd);
    cast(ctx, stg.data(), own.data(), 4 * nk);
    cp_from_chunks(ctx, dk, stg.data(), B, c, nkv * hd);
    cp_from_chunks(ctx, dv, stg.data() + 2 * nk, B, c, nkv * hd);
  } else {
    cp_from_chunks(ctx, dq, dqc.data(), B, c, nh * hd);
    cp_from_chunks(ctx, dk, own.data(), B, c, nkv * hd);
    cp_from_chunks(ctx, dv, own.data() + 2 * nk, B, c, nkv * hd);
  }
}

}  // namespace tessera::nn::detail
