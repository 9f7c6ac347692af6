#pragma once
/// \file train/inference.hpp
/// Forward-only passes over a rank's model chunks (train/model_chunks.hpp):
/// the validation loss (`evaluate`) and sampling (`generate`), on one rank,
/// over dp ranks, and through a pipeline (the hidden states go stage to
/// stage by send and recv on the pp group; the last stage's result is
/// shared over the pp group). Both are collectives over the mesh: every
/// rank calls them in the same order and gets the same result.
///
/// Pipeline messages of these passes carry tag 2 K V + v (the sending
/// virtual stage v), above the training messages' 2 v and 2 v + 1
/// (train::validate keeps 3 K V within MPI's smallest tag bound, 32767).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "tessera/core/tensor.hpp"
#include "tessera/data/documents.hpp"
#include "tessera/data/sampler.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/parallel/executor.hpp"
#include "tessera/parallel/layout.hpp"
#include "tessera/train/sampling.hpp"

namespace tessera::train {

namespace detail {

// This rank's chunks in virtual-stage order: the hidden states received
// from the previous virtual stage (except on the first), the chunk's
// forward_hidden sent to the next, or on the last virtual stage `last`.
// `whole_rows`: every token row (generation), else the residual stream's.
template <class Chunks, class Layout, class Batch, class Last>
void run_forward_only(Chunks& chunks, const Layout& mesh, Batch&& batch, Last&& last,
                      bool whole_rows) {
  using model_type = typename Chunks::model_type;
  using Param = typename model_type::precision_type::param_type;
  using Backend = typename model_type::backend_type;
  auto& pp = *mesh.pp_group();
  const int tag = 2 * (chunks.last_virtual_stage() + 1);
  using request =
      decltype(parallel::detail::p2p_isend(pp, static_cast<const Param*>(nullptr), 0, 0, 0));
  struct send {  // the buffer goes after its request (which waits when destroyed)
    tensor<Param, Backend> buf;
    request req;
  };
  std::vector<send> sends;
  for (int c = 0; c < chunks.size(); ++c) {
    model_type& m = chunks.model(c);
    const int v = chunks.virtual_stage(c);
    chunks.engine(c).begin_forward_only();
    nn::micro_batch<Param> mb = batch(c);
    const std::int64_t rows = whole_rows ? mb.B * mb.T : m.stream_rows(mb.B * mb.T);
    tensor<Param, Backend> in;
    if (v > 0) {
      in = kernels::make_tensor<Param>(m.context(), rows * m.config().dim);
      parallel::detail::p2p_recv(pp, in.data(), in.numel(), chunks.rank_of_stage(v - 1),
                                 tag + v - 1);
      mb.hidden = in.data();
    }
    if (v == chunks.last_virtual_stage()) {
      last(c, mb);
      continue;
    }
    tensor<Param, Backend> x = m.forward_hidden(mb, whole_rows);
    request q =
        parallel::detail::p2p_isend(pp, x.data(), x.numel(), chunks.rank_of_stage(v + 1), tag + v);
    sends.push_back({std::move(x), std::move(q)});
  }
  for (auto& x : sends) x.req.wait();
}

// One batch of B windows of S + 1 tokens in host memory through every chunk
// of this rank in virtual-stage order: the loss sum and scored count on the
// rank of the last stage, zeros elsewhere (the caller sums over pp).
// h_doc_start: (B, S) document starts in host memory (every stage's), or null.
// Under context parallelism the windows are whole and this rank stages its
// tokens (cp_shard::take): the loss and the count are over them.
template <class Chunks, class Layout>
nn::loss_sum pipeline_forward_loss(Chunks& chunks, const Layout& mesh,
                                   const std::int32_t* h_windows, std::int64_t B, std::int64_t S,
                                   const std::int32_t* h_doc_start = nullptr) {
  using Param = typename Chunks::model_type::precision_type::param_type;
  const auto& ctx = chunks.model().context();
  const cp_shard sh = cp_shard::of(S, mesh.cp(), mesh.cp_rank());
  const std::int64_t T = sh.tokens(), N = B * T;
  std::vector<std::int32_t> h(static_cast<std::size_t>(2 * N));
  std::vector<std::int32_t> d(static_cast<std::size_t>(h_doc_start ? N : 0));
  for (std::int64_t b = 0; b < B; ++b) {
    sh.take(h_windows + b * (S + 1), h.data() + b * T);
    sh.take(h_windows + b * (S + 1) + 1, h.data() + N + b * T);
    if (h_doc_start) sh.take(h_doc_start + b * S, d.data() + b * T);
  }
  const std::int64_t scored = std::count_if(
      h.begin() + N, h.end(), [](std::int32_t id) { return id != Chunks::ignore_index; });
  auto tok = kernels::make_tensor<std::int32_t>(ctx, 2 * N);
  ctx.from_host(tok.data(), h.data(), h.size() * sizeof(std::int32_t));
  auto doc = kernels::make_tensor<std::int32_t>(ctx, h_doc_start ? N : 0);
  if (h_doc_start) ctx.from_host(doc.data(), d.data(), d.size() * sizeof(std::int32_t));
  auto d_loss = kernels::make_tensor<double>(ctx, 1);
  nn::loss_sum r;
  run_forward_only(
      chunks, mesh,
      [&](int c) {
        const int v = chunks.virtual_stage(c);
        return nn::micro_batch<Param>{v == 0 ? tok.data() : nullptr,
                                      v == chunks.last_virtual_stage() ? tok.data() + N : nullptr,
                                      nullptr,
                                      B,
                                      T,
                                      h_doc_start ? doc.data() : nullptr};
      },
      [&](int c, const nn::micro_batch<Param>& mb) {
        chunks.model(c).forward_loss(mb, d_loss.data());
        ctx.to_host(&r.sum, d_loss.data(), sizeof(double));
        r.scored = scored;
      },
      false);
  return r;
}

// Next-token logits of one sequence through the pipeline: every rank gets
// the last stage's V logits (broadcast over the pp group).
template <class Chunks, class Layout>
void pipeline_logits(Chunks& chunks, const Layout& mesh, const std::int32_t* h_ids,
                     std::int64_t len, float* h_logits) {
  using Param = typename Chunks::model_type::precision_type::param_type;
  const auto& ctx = chunks.model().context();
  auto ids = kernels::make_tensor<std::int32_t>(ctx, len);
  ctx.from_host(ids.data(), h_ids, static_cast<std::size_t>(len) * sizeof(std::int32_t));
  const std::int64_t V = chunks.model().config().vocab;
  auto logits = kernels::make_tensor<float>(ctx, V);
  run_forward_only(
      chunks, mesh,
      [&](int c) {
        return nn::micro_batch<Param>{chunks.virtual_stage(c) == 0 ? ids.data() : nullptr, nullptr,
                                      nullptr, 1, len};
      },
      [&](int c, const nn::micro_batch<Param>& mb) {
        chunks.model(c).next_token_logits_from(mb, logits.data());
      },
      true);
  mesh.pp_group()->broadcast(logits.data(), static_cast<std::size_t>(V), mesh.pp() - 1);
  ctx.to_host(h_logits, logits.data(), static_cast<std::size_t>(V) * sizeof(float));
}

}  // namespace detail

/// Mean loss (nats per token) of `chunks` over the windows of `val`, in
/// batches of `B` windows of T tokens, split across the dp ranks by batch
/// (batch j to dp rank j mod dp; a rank without a batch in the last round
/// repeats batch 0 and discards it, so every rank runs the same forwards,
/// which zero<3>'s gathers need), through the pipeline when mesh.pp() > 1,
/// each cp rank over its tokens of the windows under context parallelism.
/// Sums the loss and the scored tokens over dp, cp and pp. With
/// `document_separator`, the windows' documents attend only within
/// themselves, as in training (data::document_starts). Collective over the
/// mesh; the same value on every rank. NaN when no token is scored.
template <class Chunks, class Layout>
double evaluate(Chunks& chunks, const Layout& mesh, const data::val_windows& val, std::int64_t B,
                std::int64_t T, std::optional<std::int32_t> document_separator = {}) {
  const auto& ctx = chunks.model().context();
  const std::int64_t dp = mesh.dp();
  std::vector<std::int32_t> buf(static_cast<std::size_t>(B * (T + 1)));
  std::vector<std::int32_t> ds(document_separator ? static_cast<std::size_t>(B * T) : 0);
  double sum[2] = {0, 0};  // loss sum, scored
  const std::int64_t nb = val.batches(B), rounds = (nb + dp - 1) / dp;
  for (std::int64_t j = 0; j < rounds; ++j) {
    const std::int64_t k = j * dp + mesh.dp_rank();
    const std::int64_t rows = val.fill(k < nb ? k : 0, B, buf.data());
    const std::int32_t* pds = nullptr;
    if (document_separator) {
      data::document_starts(buf.data(), rows, T, *document_separator, ds.data());
      pds = ds.data();
    }
    const nn::loss_sum r =
        mesh.pp() > 1 ? detail::pipeline_forward_loss(chunks, mesh, buf.data(), rows, T, pds)
                      : (chunks.engine().begin_forward_only(),
                         chunks.model().forward_loss(buf.data(), rows, T, pds));
    if (k < nb) {
      sum[0] += r.sum;
      sum[1] += static_cast<double>(r.scored);
    }
  }
  mesh.reduce(ctx, std::span<double>(sum, 2),
              {parallel::axis::dp, parallel::axis::cp, parallel::axis::pp});
  return sum[1] > 0 ? sum[0] / sum[1] : std::nan("");
}

/// Samples `n` tokens after `prompt` (token ids) from the full softmax at
/// `temperature`, deterministic in `seed`, with a context of the last
/// `context` tokens, on the chunks' backend (V logits read back per token;
/// through the pipeline when mesh.pp() > 1). Returns the prompt followed
/// by the n sampled tokens. Collective (zero<3> gathers); the same tokens
/// on every rank. Throws config_error for an empty prompt, an id outside
/// the vocabulary, a negative n or a temperature that is not > 0.
template <class Chunks, class Layout>
std::vector<std::int32_t> generate(Chunks& chunks, const Layout& mesh,
                                   std::vector<std::int32_t> prompt, std::int64_t n,
                                   double temperature, std::uint64_t seed, std::int64_t context) {
  return generate_tokens(std::move(prompt), n, temperature, seed, chunks.model().config().vocab,
                         context, [&](const std::int32_t* ids, std::int64_t len, float* logits) {
                           if (mesh.pp() > 1)
                             return detail::pipeline_logits(chunks, mesh, ids, len, logits);
                           chunks.engine().begin_forward_only();
                           chunks.model().next_token_logits(ids, len, logits);
                         });
}

}  // namespace tessera::train
