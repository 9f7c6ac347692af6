#pragma once
/// \file kernels/cuda/attention_merge.cuh
/// The merge of ring attention's partial results on the GPU (declared and
/// documented in kernels/cuda/attention.hpp as flash_attention_merge): an
/// accumulator (out_acc, lse_acc) and one key block's (out_part, lse_part),
/// float32, combined by their log-sum-exps with the host's per-element
/// functions (kernels::detail::attention_merge_lse and attention_merge_out),
/// so the emulated bodies give the host attention_merge's bits.
///
/// Two bodies over the primitive interface of kernels/cuda/block.hpp (the
/// host tests run them under the block emulator:
/// tests/kernels/emulated_attention_blocks.cpp), launched in this order on
/// one stream: attention_merge_out, a grid-stride loop over the B S nh hd
/// output elements (16-byte accesses when hd and the pointers allow), each
/// element's thread computing its row's factors from the two lse (cheap next
/// to the loads, and no thread waits for another); then
/// attention_merge_lse over the B nh S rows, which overwrites lse_acc only
/// after every output element has read it (the launch boundary orders them).
///
/// Source: Liu, Zaharia and Abbeel 2023, "Ring Attention with Blockwise
/// Transformers"; FlashAttention-2 (Dao 2023), Algorithm 1, lines 8-13.

#include <cstdint>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cuda/block.hpp"
#include "tessera/kernels/cuda/launch.hpp"
#include "tessera/kernels/detail/attention.hpp"

namespace tessera::kernels::cuda {

namespace detail {

/// out_acc[i] = merge of out_acc[i] and out_part[i] by the factors of their
/// row's lse_acc and lse_part; V floats per access (V divides hd).
template <int V>
struct attention_merge_out_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "attention_merge_out";
  template <class Ops>
  using shared_storage = no_shared;

  /// out_acc, out_part (B, S, nh, hd); lse_acc, lse_part (B, nh, S); n = B S nh hd.
  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& blk, no_shared&, float* out_acc,
                                   const float* lse_acc, const float* out_part,
                                   const float* lse_part, std::int64_t n, std::int64_t S,
                                   std::int64_t nh, std::int64_t hd) {
    elementwise_apply<V>(blk, n, [&]<int W>(std::int64_t i) {
      // The W elements share one (b, t, h) row: V divides hd.
      const std::int64_t row = i / hd;
      const std::int64_t h = row % nh, t = (row / nh) % S, b = row / (nh * S);
      const std::int64_t l = (b * nh + h) * S + t;
      const kernels::detail::attention_merge_factors<float> f =
          kernels::detail::attention_merge_lse(Ops::ld(lse_acc + l), Ops::ld(lse_part + l));
      const pack<float, W> a = Ops::template ld_pack<W>(out_acc + i);
      const pack<float, W> x = Ops::template ld_pack<W>(out_part + i);
      pack<float, W> o;
      TESSERA_UNROLL
      for (int k = 0; k < W; ++k) o.v[k] = kernels::detail::attention_merge_out(a.v[k], x.v[k], f);
      Ops::template st_pack<W>(out_acc + i, o);
    });
  }
};

/// lse_acc[r] = log(exp(lse_acc[r]) + exp(lse_part[r])), stably, for the n
/// = B nh S rows; after attention_merge_out has read them.
struct attention_merge_lse_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "attention_merge_lse";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& blk, no_shared&, float* lse_acc,
                                   const float* lse_part, std::int64_t n) {
    elementwise_apply<1>(blk, n, [&]<int W>(std::int64_t r) {
      Ops::st(
          lse_acc + r,
          kernels::detail::attention_merge_lse(Ops::ld(lse_acc + r), Ops::ld(lse_part + r)).lse);
    });
  }
};

}  // namespace detail

/// flash_attention_merge (kernels/cuda/attention.hpp) on `launch`: checks
/// the sizes (config_error naming them, before any launch), then
/// attention_merge_out (16-byte accesses when hd is a multiple of 4 and the
/// two outputs are 16-byte aligned) and attention_merge_lse.
template <class Launcher>
void attention_merge_launch(const Launcher& launch, float* d_out_acc, float* d_lse_acc,
                            const float* d_out_part, const float* d_lse_part, std::int64_t B,
                            std::int64_t S, std::int64_t nh, std::int64_t hd) {
  TESSERA_THROW_IF(B <= 0 || S <= 0 || nh <= 0 || hd <= 0, config_error,
                   "flash_attention_merge: every size must be >= 1, got B=", B, " S=", S,
                   " nh=", nh, " hd=", hd);
  const std::int64_t n = B * S * nh * hd, rows = B * nh * S;
  if (hd % 4 == 0 && detail::all_aligned(16, d_out_acc, d_out_part))
    launch.template run<detail::attention_merge_out_body<4>>(
        elementwise_config(n, 4), d_out_acc, d_lse_acc, d_out_part, d_lse_part, n, S, nh, hd);
  else
    launch.template run<detail::attention_merge_out_body<1>>(
        elementwise_config(n, 1), d_out_acc, d_lse_acc, d_out_part, d_lse_part, n, S, nh, hd);
  launch.template run<detail::attention_merge_lse_body>(elementwise_config(rows, 1), d_lse_acc,
                                                        d_lse_part, rows);
}

}  // namespace tessera::kernels::cuda
