#pragma once
/// \file embedding.hpp
/// Token embedding lookup (forward) and its scatter-add (backward), host.
///
/// Gradient contract (llm.c): parameter gradients accumulate (`+=`:
/// `embedding_backward` adds into dwte). There is no activation gradient
/// (tokens are integers).
///
/// Determinism: the backward is parallel over disjoint column blocks of H;
/// within a column every row of dout is added in increasing token position n,
/// so dwte is bit-for-bit the same for any thread count.

#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/context.hpp"

namespace tessera::kernels {

namespace detail {
/// Throws config_error naming the first token outside [0, V) that is not
/// `ignore_index`, its position and V. Checked before anything is written.
inline void check_tokens(const char* who, const std::int32_t* tokens, std::int64_t N,
                         std::int64_t V, std::int32_t ignore_index) {
  TESSERA_THROW_IF(N < 0 || V <= 0, config_error, who, ": bad sizes N=", N, " V=", V);
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t t = tokens[n];
    if (t == ignore_index) continue;
    TESSERA_THROW_IF(t < 0 || t >= V, config_error, who, ": token id ", t, " at position ", n,
                     " is outside the vocabulary [0, V=", V, ") and is not the ignore index ",
                     ignore_index);
  }
}
}  // namespace detail

/// Embedding forward: out(N,H) = wte[tokens[n], :] for n in [0, N); a token
/// equal to `ignore_index` is padding and embeds to a row of zeros.
/// - `tokens` (N) int32, `wte` (V,H), `out` (N,H); T in {float, double, bf16}
///   (a copy: exact). `out` is written (=) and must not alias `wte`.
/// - Throws config_error naming the token, its position and V if any token
///   other than ignore_index is < 0 or >= V, or for N < 0, V <= 0, H < 0;
///   nothing is written then. (The CUDA overload cannot report a bad id
///   without a host sync: the loader checks ids on the host.)
/// Source: llm.c encoder_forward (without the position embedding).
template <class T>
void embedding_forward(const host_context& ctx, T* out, const std::int32_t* tokens, const T* wte,
                       std::int64_t N, std::int64_t V, std::int64_t H,
                       std::int32_t ignore_index = -100) {
  (void)ctx;
  TESSERA_THROW_IF(H < 0, config_error, "embedding_forward: negative H=", H);
  detail::check_tokens("embedding_forward", tokens, N, V, ignore_index);
#pragma omp parallel for schedule(static)
  for (std::int64_t n = 0; n < N; ++n) {
    T* dst = out + n * H;
    if (tokens[n] == ignore_index) {
      for (std::int64_t h = 0; h < H; ++h) dst[h] = to<T>(0.0);
      continue;
    }
    const T* src = wte + static_cast<std::int64_t>(tokens[n]) * H;
    for (std::int64_t h = 0; h < H; ++h) dst[h] = src[h];
  }
}

/// Embedding backward: dwte(V,H) += scatter-add of dout rows,
/// dwte[tokens[n], :] += dout[n, :] for n = 0, 1, ..., N-1 in that order,
/// skipping padding (tokens[n] == ignore_index: no gradient).
/// - `dout` (N,H) of GA (the activation-gradient type: float, double or
///   bf16, added in G), `dwte` (V,H) of G in {float, double}.
/// - Parameter gradient: accumulates. Deterministic and independent of the
///   thread count (parallel over column blocks of H, rows in order of n).
/// - Throws config_error as `embedding_forward`, before anything is written.
/// Source: llm.c encoder_backward.
template <class G, class GA>
void embedding_backward(const host_context& ctx, G* dwte, const GA* dout,
                        const std::int32_t* tokens, std::int64_t N, std::int64_t V, std::int64_t H,
                        std::int32_t ignore_index = -100) {
  (void)ctx;
  static_assert(std::is_same_v<G, float> || std::is_same_v<G, double>,
                "tessera::kernels::embedding_backward: G must be float or double");
  TESSERA_THROW_IF(H < 0, config_error, "embedding_backward: negative H=", H);
  detail::check_tokens("embedding_backward", tokens, N, V, ignore_index);
  constexpr std::int64_t block = 64;  // columns per task: one or two cache lines per row
  const std::int64_t n_blocks = (H + block - 1) / block;
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const std::int64_t h0 = b * block;
    const std::int64_t h1 = h0 + block < H ? h0 + block : H;
    for (std::int64_t n = 0; n < N; ++n) {
      if (tokens[n] == ignore_index) continue;
      const GA* src = dout + n * H;
      G* dst = dwte + static_cast<std::int64_t>(tokens[n]) * H;
      for (std::int64_t h = h0; h < h1; ++h) dst[h] += to<G>(src[h]);
    }
  }
}

/// The vocabulary-parallel embedding's row indices (Megatron's
/// VocabParallelEmbedding): this rank holds rows [v_begin, v_begin + Vl)
/// of the vocabulary; out[n] = ids[n] - v_begin where that row is held
/// here, else ignore_index (a zero row and no gradient in the embedding
/// kernels, the other ranks' rows).
/// - `ids`, `out` (N) int32; `out` may alias `ids`.
/// - Throws config_error naming the id, its position and V for an id
///   outside [0, V) that is not ignore_index, and for N < 0, V < 1, Vl < 1
///   or v_begin < 0; nothing is written then.
inline void embedding_local_ids(const host_context& ctx, std::int32_t* out, const std::int32_t* ids,
                                std::int64_t N, std::int64_t V, std::int64_t v_begin,
                                std::int64_t Vl, std::int32_t ignore_index) {
  (void)ctx;
  TESSERA_THROW_IF(Vl < 1 || v_begin < 0, config_error, "embedding_local_ids: slice [", v_begin,
                   ", ", v_begin + Vl, ") of the vocabulary is empty or negative");
  detail::check_tokens("embedding", ids, N, V, ignore_index);
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t l = static_cast<std::int64_t>(ids[n]) - v_begin;
    out[n] = (ids[n] != ignore_index && l >= 0 && l < Vl) ? static_cast<std::int32_t>(l)
                                                          : ignore_index;
  }
}

}  // namespace tessera::kernels
