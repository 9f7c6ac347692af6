#pragma once
/// \file kernels/cuda/cross_entropy.cuh
/// The row kernels of the fused LM head and cross-entropy (declared and
/// documented in kernels/cuda/cross_entropy.hpp) and the chunk loop that
/// calls them between the cuBLASLt GEMMs: under nvcc, included by
/// cross_entropy.hpp in a header-only translation unit, and compiled once
/// into tessera::cuda_kernels by cuda/kernels_cross_entropy.cu
/// (kernels/cuda/linkage.hpp). Per-element arithmetic:
/// kernels/detail/cross_entropy.hpp, the same functions as the host loop.
/// The bodies are written over the primitive interface of
/// kernels/cuda/block.hpp and launched by the `*_launch` functions below, so
/// the host tests run them under the block emulator
/// (tests/kernels/emulated_cross_entropy.cpp) against the host kernels of
/// kernels/cross_entropy.hpp; the GEMMs and the chunk loop are nvcc only.
///
/// Gradient contract (llm.c): dwlm accumulates (+=), dx is written (=).
///
/// Per chunk of C rows (the scratch layout is lm_head_ce_scratch_layout):
///   logits (C, V) f32 = x_chunk (C, H) wlm (V, H)^T           linear_forward
///   row_loss[r0 + i], dlogits (C, V) T                         ce_softmax
///   dx_chunk (C, H) T = dlogits wlm                            linear_backward_input
///   dwlm (V, H) f32 += dlogits^T x_chunk                       linear_backward_weight
/// then once (lm_head_ce_finish_launch): dx rows of ignored positions = 0
/// (ce_zero_ignored_rows) and *loss_sum = sum of row_loss in a fixed order
/// (ce_loss_sum). T, the storage type of x, wlm, dx and dlogits, is bf16
/// or fp16 (precision::bf16_mixed*, fp16_mixed); the arithmetic is float32.
///
/// The vocabulary-parallel form (its chunk loop is in kernels/cuda/ops.hpp,
/// between the tp group's all-reduces) over this rank's logits (C, Vl):
///   row maxima (C) f32 over the real columns    vp_ce_row_max
///   all-reduce(max)
///   sums of exp (C) and owned target logits (C)  vp_ce_row_sums
///   all-reduce(sum) of the 2C values
///   row_loss, dlogits (C, Vl) T, padding 0       vp_ce_row_grad
///   dx partial sum, dwlm += as above, then lm_head_ce_finish.
///
/// Deterministic: every reduction is a CUB block tree whose shape depends on
/// the sizes only (V, Vl or N), and the loss sum is one block's; no atomics.

#include <math.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/block.hpp"
#include "tessera/kernels/detail/cross_entropy.hpp"

#if defined(__CUDACC__)
#include "tessera/kernels/cuda/cross_entropy.hpp"
#endif

namespace tessera::kernels::cuda {

namespace detail {

using ce_state = kernels::detail::ce_online<float>;

/// Block-reduction operator of the online softmax normaliser.
struct ce_combine_op {
  TESSERA_BLOCK_FN ce_state operator()(const ce_state& a, const ce_state& b) const {
    return kernels::detail::ce_online_combine(a, b);
  }
};

/// Block-reduction operator: the larger of two floats.
struct ce_max_op {
  TESSERA_BLOCK_FN float operator()(float a, float b) const { return a > b ? a : b; }
};

/// One block per row of the chunk (grid-stride over rows): row r of
/// `logits` (rows, V) float32 with target targets[r]. Writes row_loss[r]
/// (float64; 0 when ignored, NaN when the target is outside [0, V)) and, if
/// `dlogits` is not null, row r of dlogits (rows, V) T = grad_scale *
/// (softmax - onehot) (0 when ignored, NaN when the target is outside
/// [0, V)). Pass 1 keeps a running (max, sum of exp) per thread
/// (ce_online_update over its strided logits) and merges them with a block
/// reduction (ce_online_combine): one read of the row for the normaliser.
/// W logits per access (4: 16-byte loads, 8-byte T stores; 1: any V and
/// alignment). T: the 16-bit storage type (bf16 or fp16).
template <class T, int W>
struct ce_softmax_body {
  static constexpr int threads = lm_head_ce_threads;
  static constexpr std::size_t smem_bound = lm_head_ce_smem_bound;
  static constexpr const char* name = "ce_softmax";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<ce_state, threads>::storage reduce;
    float max;
    float inv_sum;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, double* row_loss,
                                   T* dlogits, const float* logits, const std::int32_t* targets,
                                   std::int64_t rows, std::int64_t V, std::int32_t ignore_index,
                                   float grad_scale) {
    using reduce = typename Ops::template block_reduce<ce_state, threads>;
    constexpr std::int64_t step = static_cast<std::int64_t>(threads) * W;
    const std::int64_t first = static_cast<std::int64_t>(b.tid) * W;
    for (std::int64_t row = b.x; row < rows; row += b.grid_x) {
      const float* z = logits + row * V;
      T* dz = dlogits != nullptr ? dlogits + row * V : nullptr;
      const std::int32_t y = Ops::ld(targets + row);  // the same for every thread: uniform branches
      if (y == ignore_index) {
        if (b.tid == 0) Ops::st(row_loss + row, 0.0);
        if (dz != nullptr)
          for (std::int64_t i = first; i < V; i += step) {
            pack<T, W> o;
            TESSERA_UNROLL
            for (int k = 0; k < W; ++k) o.v[k] = T::from_bits(0);
            Ops::template st_pack<W>(dz + i, o);
          }
        continue;  // no shared memory touched: no barrier needed
      }

      // Pass 1: running (max, sum exp) per thread, merged by a block tree.
      ce_state s{-INFINITY, 0.f};
      for (std::int64_t i = first; i < V; i += step) {
        const pack<float, W> p = Ops::template ld_pack<W>(z + i);
        TESSERA_UNROLL
        for (int k = 0; k < W; ++k) s = kernels::detail::ce_online_update(s, p.v[k]);
      }
      const ce_state total = reduce::reduce(sm.reduce, s, ce_combine_op{});
      if (b.tid == 0) {
        const bool valid = y >= 0 && y < V;
        const float nan = tessera::detail::bits_float(0x7fc00000u);
        const float loss =
            valid ? kernels::detail::ce_row_loss(total.max, total.sum, Ops::ld(z + y)) : nan;
        Ops::st(row_loss + row, static_cast<double>(loss));
        sm.max = total.max;
        sm.inv_sum = valid ? 1.f / total.sum : nan;  // NaN: the whole gradient row shows it
      }
      Ops::sync();

      // Pass 2 (training): grad_scale * (softmax - onehot), rounded once to T.
      if (dz != nullptr) {
        const float mx = sm.max, inv = sm.inv_sum;
        for (std::int64_t i = first; i < V; i += step) {
          const pack<float, W> p = Ops::template ld_pack<W>(z + i);
          pack<T, W> o;
          TESSERA_UNROLL
          for (int k = 0; k < W; ++k)
            o.v[k] = to<T>(kernels::detail::ce_dlogit(kernels::detail::ce_exp(p.v[k], mx), inv,
                                                      i + k == y, grad_scale));
          Ops::template st_pack<W>(dz + i, o);
        }
      }
      Ops::sync();  // sm is reused by the block's next row
    }
  }
};

/// dx rows (N, H) T (bf16 or fp16) of ignored positions set to 0 (whatever
/// the GEMM made of 0 * wlm, e.g. with a non-finite weight), as the host
/// does; one block per row (grid-stride), a scored row's block does
/// nothing. W elements per 16-byte store, or 1.
template <class T, int W>
struct ce_zero_ignored_rows_body {
  static constexpr int threads = lm_head_ce_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "ce_zero_ignored_rows";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, T* dx,
                                   const std::int32_t* targets, std::int64_t N, std::int64_t H,
                                   std::int32_t ignore_index) {
    constexpr std::int64_t step = static_cast<std::int64_t>(threads) * W;
    for (std::int64_t row = b.x; row < N; row += b.grid_x) {
      if (Ops::ld(targets + row) != ignore_index) continue;
      T* d = dx + row * H;
      for (std::int64_t i = static_cast<std::int64_t>(b.tid) * W; i < H; i += step) {
        pack<T, W> o;
        TESSERA_UNROLL
        for (int k = 0; k < W; ++k) o.v[k] = T::from_bits(0);
        Ops::template st_pack<W>(d + i, o);
      }
    }
  }
};

/// *loss_sum = sum of row_loss[0, N): thread t adds rows t, t + 256, ... in
/// order (float64), then a block tree. One block; the order depends on N only.
struct ce_loss_sum_body {
  static constexpr int threads = lm_head_ce_threads;
  static constexpr std::size_t smem_bound = lm_head_ce_smem_bound;
  static constexpr const char* name = "ce_loss_sum";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<double, threads>::storage reduce;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, double* loss_sum,
                                   const double* row_loss, std::int64_t N) {
    using reduce = typename Ops::template block_reduce<double, threads>;
    double s = 0.0;
    for (std::int64_t i = b.tid; i < N; i += threads) s += Ops::ld(row_loss + i);
    const double total = reduce::sum(sm.reduce, s);
    if (b.tid == 0) Ops::st(loss_sum, total);
  }
};

/// vocab_parallel_ce_row_max (cross_entropy.hpp): one block per row of
/// `logits` (rows, Vl); the largest of the first `real` columns.
struct vp_ce_row_max_body {
  static constexpr int threads = lm_head_ce_threads;
  static constexpr std::size_t smem_bound = lm_head_ce_smem_bound;
  static constexpr const char* name = "vp_ce_row_max";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<float, threads>::storage reduce;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, float* row_max,
                                   const float* logits, std::int64_t rows, std::int64_t Vl,
                                   std::int64_t real) {
    using reduce = typename Ops::template block_reduce<float, threads>;
    for (std::int64_t row = b.x; row < rows; row += b.grid_x) {
      const float* z = logits + row * Vl;
      float m = -INFINITY;
      for (std::int64_t i = b.tid; i < real; i += threads) {
        const float v = Ops::ld(z + i);
        m = m > v ? m : v;
      }
      const float total = reduce::reduce(sm.reduce, m, ce_max_op{});
      if (b.tid == 0) Ops::st(row_max + row, total);
      Ops::sync();  // sm is reused by the block's next row
    }
  }
};

/// vocab_parallel_ce_row_sums (cross_entropy.hpp): one block per row;
/// sums (2, rows): the sum of exp over the real columns, then the owned
/// target logit (0 on other ranks, NaN for a target outside [0, V)).
struct vp_ce_row_sums_body {
  static constexpr int threads = lm_head_ce_threads;
  static constexpr std::size_t smem_bound = lm_head_ce_smem_bound;
  static constexpr const char* name = "vp_ce_row_sums";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<float, threads>::storage reduce;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, float* sums,
                                   const float* logits, const float* row_max,
                                   const std::int32_t* targets, std::int64_t rows, std::int64_t V,
                                   std::int64_t v_begin, std::int64_t Vl, std::int64_t real,
                                   std::int32_t ignore_index) {
    using reduce = typename Ops::template block_reduce<float, threads>;
    for (std::int64_t row = b.x; row < rows; row += b.grid_x) {
      const std::int32_t y = Ops::ld(targets + row);  // uniform over the block
      if (y == ignore_index) {
        if (b.tid == 0) {
          Ops::st(sums + row, 0.f);
          Ops::st(sums + rows + row, 0.f);
        }
        continue;  // no shared memory touched
      }
      const float* z = logits + row * Vl;
      const float mx = Ops::ld(row_max + row);
      float s = 0.f;
      for (std::int64_t i = b.tid; i < real; i += threads)
        s += kernels::detail::ce_exp(Ops::ld(z + i), mx);
      const float total = reduce::sum(sm.reduce, s);
      if (b.tid == 0) {
        const std::int64_t yl = static_cast<std::int64_t>(y) - v_begin;
        const bool valid = y >= 0 && y < V;
        const float target = !valid                   ? tessera::detail::bits_float(0x7fc00000u)
                             : (yl >= 0 && yl < real) ? Ops::ld(z + yl)
                                                      : 0.f;
        Ops::st(sums + row, total);
        Ops::st(sums + rows + row, target);
      }
      Ops::sync();
    }
  }
};

/// vocab_parallel_ce_row_grad (cross_entropy.hpp): one block per row;
/// row_loss from the reduced max and sums, and (dlogits not null) the row's
/// (Vl) T (bf16 or fp16) gradient, 0 over padding and for ignored rows. No
/// shared memory (its bound is the row configuration's).
template <class T>
struct vp_ce_row_grad_body {
  static constexpr int threads = lm_head_ce_threads;
  static constexpr std::size_t smem_bound = lm_head_ce_smem_bound;
  static constexpr const char* name = "vp_ce_row_grad";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, double* row_loss, T* dlogits,
                                   const float* logits, const float* row_max, const float* sums,
                                   const std::int32_t* targets, std::int64_t rows,
                                   std::int64_t v_begin, std::int64_t Vl, std::int64_t real,
                                   std::int32_t ignore_index, float grad_scale) {
    for (std::int64_t row = b.x; row < rows; row += b.grid_x) {
      const std::int32_t y = Ops::ld(targets + row);
      T* dz = dlogits != nullptr ? dlogits + row * Vl : nullptr;
      if (y == ignore_index) {
        if (b.tid == 0) Ops::st(row_loss + row, 0.0);
        if (dz != nullptr)
          for (std::int64_t i = b.tid; i < Vl; i += threads) Ops::st(dz + i, T::from_bits(0));
        continue;
      }
      const float mx = Ops::ld(row_max + row), se = Ops::ld(sums + row),
                  target = Ops::ld(sums + rows + row);
      if (b.tid == 0)
        Ops::st(row_loss + row, static_cast<double>(kernels::detail::ce_row_loss(mx, se, target)));
      if (dz == nullptr) continue;
      // A NaN target logit (a target outside [0, V)) makes the whole row NaN.
      const float inv = (target == target) ? 1.f / se : target;
      const float* z = logits + row * Vl;
      const std::int64_t yl = static_cast<std::int64_t>(y) - v_begin;
      for (std::int64_t i = b.tid; i < Vl; i += threads)
        Ops::st(dz + i, i < real ? to<T>(kernels::detail::ce_dlogit(
                                       kernels::detail::ce_exp(Ops::ld(z + i), mx), inv, i == yl,
                                       grad_scale))
                                 : T::from_bits(0));  // padding: no gradient
    }
  }
};

/// Throws config_error unless rows >= 0, Vl >= 1 and 0 <= real <= Vl.
inline void vp_check(const char* who, std::int64_t rows, std::int64_t Vl, std::int64_t real) {
  TESSERA_THROW_IF(rows < 0 || Vl < 1 || real < 0 || real > Vl, config_error, who, ": rows=", rows,
                   " Vl=", Vl, " real=", real, " must satisfy rows >= 0, Vl >= 1, 0 <= real <= Vl");
}

}  // namespace detail

/// The softmax cross-entropy rows of one chunk of lm_head_cross_entropy on
/// `launch`: d_row_loss (rows) float64 and, if d_dlogits is not null, the
/// (rows, V) T (bf16 or fp16) logit gradient of d_logits (rows, V) float32 (the
/// ce_softmax body). 16-byte loads when V is a multiple of 4 and the
/// pointers allow (always, in the chunk loop: its scratch regions are
/// 256-byte aligned), else one logit per access. Throws config_error for
/// rows < 0 or V < 1; rows = 0 launches nothing.
template <class Launcher, class T>
void lm_head_ce_softmax_launch(const Launcher& launch, double* d_row_loss, T* d_dlogits,
                               const float* d_logits, const std::int32_t* d_targets,
                               std::int64_t rows, std::int64_t V, std::int32_t ignore_index,
                               float grad_scale) {
  const launch_config c = lm_head_ce_row_config(rows, V);
  if (rows == 0) return;
  constexpr int W = detail::vec_width<float>;
  if (V % W == 0 && detail::all_aligned(16, d_logits) &&
      detail::all_aligned(W * sizeof(T), d_dlogits))
    launch.template run<detail::ce_softmax_body<T, W>>(
        c, d_row_loss, d_dlogits, d_logits, d_targets, rows, V, ignore_index, grad_scale);
  else
    launch.template run<detail::ce_softmax_body<T, 1>>(
        c, d_row_loss, d_dlogits, d_logits, d_targets, rows, V, ignore_index, grad_scale);
}

/// lm_head_ce_finish (cross_entropy.hpp) on `launch`: the dx rows (N, H)
/// T (bf16 or fp16) of ignored targets zeroed (when d_dx is not null and N > 0; 16-byte
/// stores when H and d_dx allow), then *d_loss_sum = the sum of d_row_loss
/// (N) by one block. Throws config_error for N < 0 before any launch.
template <class Launcher, class T>
void lm_head_ce_finish_launch(const Launcher& launch, double* d_loss_sum, const double* d_row_loss,
                              T* d_dx, const std::int32_t* d_targets, std::int64_t N,
                              std::int64_t H, std::int32_t ignore_index) {
  const launch_config lc = lm_head_ce_loss_config(N);
  if (d_dx != nullptr && N > 0) {
    const launch_config zc = lm_head_ce_zero_rows_config(N);
    constexpr int W = detail::vec_width<T>;
    if (H % W == 0 && detail::all_aligned(16, d_dx))
      launch.template run<detail::ce_zero_ignored_rows_body<T, W>>(zc, d_dx, d_targets, N, H,
                                                                   ignore_index);
    else
      launch.template run<detail::ce_zero_ignored_rows_body<T, 1>>(zc, d_dx, d_targets, N, H,
                                                                   ignore_index);
  }
  launch.template run<detail::ce_loss_sum_body>(lc, d_loss_sum, d_row_loss, N);
}

/// vocab_parallel_ce_row_max (cross_entropy.hpp) on `launch`.
template <class Launcher>
void vocab_parallel_ce_row_max_launch(const Launcher& launch, float* d_max, const float* d_logits,
                                      std::int64_t rows, std::int64_t Vl, std::int64_t real) {
  detail::vp_check("vocab_parallel_ce_row_max", rows, Vl, real);
  if (rows == 0) return;
  const launch_config rc = lm_head_ce_row_config(rows, Vl);
  launch.template run<detail::vp_ce_row_max_body>(rc, d_max, d_logits, rows, Vl, real);
}

/// vocab_parallel_ce_row_sums (cross_entropy.hpp) on `launch`.
template <class Launcher>
void vocab_parallel_ce_row_sums_launch(const Launcher& launch, float* d_sums, const float* d_logits,
                                       const float* d_max, const std::int32_t* d_targets,
                                       std::int64_t rows, std::int64_t V, std::int64_t v_begin,
                                       std::int64_t Vl, std::int64_t real,
                                       std::int32_t ignore_index) {
  detail::vp_check("vocab_parallel_ce_row_sums", rows, Vl, real);
  if (rows == 0) return;
  const launch_config rc = lm_head_ce_row_config(rows, Vl);
  launch.template run<detail::vp_ce_row_sums_body>(rc, d_sums, d_logits, d_max, d_targets, rows, V,
                                                   v_begin, Vl, real, ignore_index);
}

/// vocab_parallel_ce_row_grad (cross_entropy.hpp) on `launch`.
template <class Launcher, class T>
void vocab_parallel_ce_row_grad_launch(const Launcher& launch, double* d_row_loss, T* d_dlogits,
                                       const float* d_logits, const float* d_max,
                                       const float* d_sums, const std::int32_t* d_targets,
                                       std::int64_t rows, std::int64_t v_begin, std::int64_t Vl,
                                       std::int64_t real, std::int32_t ignore_index,
                                       float grad_scale) {
  detail::vp_check("vocab_parallel_ce_row_grad", rows, Vl, real);
  if (rows == 0) return;
  const launch_config rc = lm_head_ce_row_config(rows, Vl);
  launch.template run<detail::vp_ce_row_grad_body<T>>(rc, d_row_loss, d_dlogits, d_logits, d_max,
                                                      d_sums, d_targets, rows, v_begin, Vl, real,
                                                      ignore_index, grad_scale);
}

/// The three GEMMs of a chunk of lm_head_cross_entropy_chunks (below) over
/// the 16-bit storage type T: forward, backward to the input, backward to
/// the weight.
template <class G, class T>
concept head_gemms = requires(const G& g, float* f32, T* b, const T* cb, std::int64_t n) {
  g.forward(f32, cb, cb, n, n, n);
  g.backward_input(b, cb, cb, n, n, n);
  g.backward_weight(f32, cb, cb, n, n, n);
};

/// The chunk loop of lm_head_cross_entropy (arguments and contract in
/// cross_entropy.hpp), written once over `launch` (the row kernels: a
/// device_launcher on the GPU, the block emulator in the host tests) and
/// `gemm`, the three GEMMs of a chunk of `rows` tokens:
///   gemm.forward(logits, x, wlm, rows, V, H)          logits (rows, V) f32 = x wlm^T
///   gemm.backward_input(dx, dlogits, wlm, rows, V, H)  dx (rows, H) T = dlogits wlm
///   gemm.backward_weight(dwlm, dlogits, x, rows, V, H) dwlm (V, H) f32 += dlogits^T x
/// (cuBLASLt through linear_forward and its backward on the GPU); T, the
/// storage type of x, wlm, dx and the logit gradient, is bf16 or fp16. Every
/// check comes before any work: config_error for bad sizes (the scratch
/// layout), a null loss pointer, inputs null with N > 0, d_dx without d_dwlm
/// or the reverse, scratch below lm_head_cross_entropy_scratch_bytes or not
/// aligned to lm_head_ce_scratch_align bytes.
template <class Launcher, class Gemm, class T>
requires head_gemms<Gemm, T>
void lm_head_cross_entropy_chunks(const Launcher& launch, const Gemm& gemm, double* d_loss_sum,
                                  const T* d_x, const T* d_wlm, const std::int32_t* d_targets,
                                  std::int64_t N, std::int64_t V, std::int64_t H,
                                  std::int32_t ignore_index, float grad_scale, T* d_dx,
                                  float* d_dwlm, std::int64_t chunk, void* d_scratch,
                                  std::size_t scratch_bytes) {
  const lm_head_ce_scratch lay = lm_head_ce_scratch_layout(N, V, H, chunk);
  TESSERA_THROW_IF(d_loss_sum == nullptr, config_error,
                   "lm_head_cross_entropy (cuda): d_loss_sum is null");
  TESSERA_THROW_IF(N > 0 && (d_x == nullptr || d_wlm == nullptr || d_targets == nullptr),
                   config_error, "lm_head_cross_entropy (cuda): N=", N,
                   " rows but d_x, d_wlm or d_targets is null");
  TESSERA_THROW_IF((d_dx == nullptr) != (d_dwlm == nullptr), config_error,
                   "lm_head_cross_entropy (cuda): pass both d_dx and d_dwlm (training) or neither "
                   "(evaluation); got d_dx ",
                   d_dx ? "set" : "null", ", d_dwlm ", d_dwlm ? "set" : "null");
  TESSERA_THROW_IF(scratch_bytes < lay.bytes || d_scratch == nullptr, config_error,
                   "lm_head_cross_entropy (cuda): scratch of ", scratch_bytes, " bytes",
                   d_scratch == nullptr ? " (null)" : "", " is below the ", lay.bytes,
                   " that N=", N, " V=", V, " H=", H, " chunk=", chunk,
                   " need (lm_head_cross_entropy_scratch_bytes)");
  TESSERA_THROW_IF(!detail::all_aligned(lm_head_ce_scratch_align, d_scratch), config_error,
                   "lm_head_cross_entropy (cuda): scratch pointer is not aligned to ",
                   lm_head_ce_scratch_align, " bytes");
  const bool grad = d_dx != nullptr;

  auto* base = static_cast<unsigned char*>(d_scratch);
  float* logits = reinterpret_cast<float*>(base + lay.logits);
  T* dlogits = grad ? reinterpret_cast<T*>(base + lay.dlogits) : nullptr;
  double* row_loss = reinterpret_cast<double*>(base + lay.row_loss);

  // Rows start at multiples of V elements from 256-byte aligned regions, so
  // the row kernel takes 16-byte loads whenever V % 4 == 0.
  for (std::int64_t r0 = 0; r0 < N; r0 += lay.rows) {
    const std::int64_t c = std::min(lay.rows, N - r0);
    const T* xc = d_x + r0 * H;
    gemm.forward(logits, xc, d_wlm, c, V, H);
    lm_head_ce_softmax_launch(launch, row_loss + r0, dlogits, logits, d_targets + r0, c, V,
                              ignore_index, grad_scale);
    if (!grad) continue;
    gemm.backward_input(d_dx + r0 * H, dlogits, d_wlm, c, V, H);
    gemm.backward_weight(d_dwlm, dlogits, xc, c, V, H);
  }

  lm_head_ce_finish_launch(launch, d_loss_sum, row_loss, grad ? d_dx : static_cast<T*>(nullptr),
                           d_targets, N, H, ignore_index);
}

#if defined(__CUDACC__) && TESSERA_CUDA_DEFINES_ENTRIES

namespace detail {
// The chunk loop's GEMMs on cuBLASLt (gemm.cuh's linear_*), on `stream`,
// over the storage type T (bf16 or fp16).
template <class T>
struct cublaslt_head_gemms {
  cublaslt_context* ctx;
  cudaStream_t stream;
  void forward(float* logits, const T* x, const T* wlm, std::int64_t rows, std::int64_t V,
               std::int64_t H) const {
    linear_forward<float>(*ctx, logits, x, wlm, rows, V, H, stream);
  }
  void backward_input(T* dx, const T* dlogits, const T* wlm, std::int64_t rows, std::int64_t V,
                      std::int64_t H) const {
    linear_backward_input<T>(*ctx, dx, dlogits, wlm, rows, V, H, stream);
  }
  void backward_weight(float* dwlm, const T* dlogits, const T* x, std::int64_t rows, std::int64_t V,
                       std::int64_t H) const {
    linear_backward_weight(*ctx, dwlm, dlogits, x, rows, V, H, stream);
  }
};
}  // namespace detail

// The cudaStream_t entry points of cross_entropy.hpp: inline in a header-only
// translation unit, defined once in cuda/kernels_cross_entropy.cu for
// tessera::cuda_kernels (kernels/cuda/linkage.hpp).

TESSERA_CUDA_ENTRY void vocab_parallel_ce_row_max(float* d_max, const float* d_logits,
                                                  std::int64_t rows, std::int64_t Vl,
                                                  std::int64_t real, cudaStream_t stream) {
  vocab_parallel_ce_row_max_launch(device_launcher{stream}, d_max, d_logits, rows, Vl, real);
}

TESSERA_CUDA_ENTRY void vocab_parallel_ce_row_sums(float* d_sums, const float* d_logits,
                                                   const float* d_max,
                                                   const std::int32_t* d_targets, std::int64_t rows,
                                                   std::int64_t V, std::int64_t v_begin,
                                                   std::int64_t Vl, std::int64_t real,
                                                   std::int32_t ignore_index, cudaStream_t stream) {
  vocab_parallel_ce_row_sums_launch(device_launcher{stream}, d_sums, d_logits, d_max, d_targets,
                                    rows, V, v_begin, Vl, real, ignore_index);
}

// One definition per storage type (bf16, fp16), each the same launch.
#define TESSERA_CE_ENTRIES(T)                                                                      \
  TESSERA_CUDA_ENTRY void vocab_parallel_ce_row_grad(                                              \
      double* d_row_loss, T* d_dlogits, const float* d_logits, const float* d_max,                 \
      const float* d_sums, const std::int32_t* d_targets, std::int64_t rows, std::int64_t v_begin, \
      std::int64_t Vl, std::int64_t real, std::int32_t ignore_index, float grad_scale,             \
      cudaStream_t stream) {                                                                       \
    vocab_parallel_ce_row_grad_launch(device_launcher{stream}, d_row_loss, d_dlogits, d_logits,    \
                                      d_max, d_sums, d_targets, rows, v_begin, Vl, real,           \
                                      ignore_index, grad_scale);                                   \
  }                                                                                                \
  /* The end of the chunk loop: ignored dx rows zeroed, the loss summed. */                        \
  TESSERA_CUDA_ENTRY void lm_head_ce_finish(                                                       \
      double* d_loss_sum, const double* d_row_loss, T* d_dx, const std::int32_t* d_targets,        \
      std::int64_t N, std::int64_t H, std::int32_t ignore_index, cudaStream_t stream) {            \
    lm_head_ce_finish_launch(device_launcher{stream}, d_loss_sum, d_row_loss, d_dx, d_targets, N,  \
                             H, ignore_index);                                                     \
  }                                                                                                \
  /* The chunk loop of lm_head_cross_entropy on cuBLASLt and the context's stream. */              \
  TESSERA_CUDA_ENTRY void lm_head_cross_entropy(                                                   \
      cublaslt_context& ctx, double* d_loss_sum, const T* d_x, const T* d_wlm,                     \
      const std::int32_t* d_targets, std::int64_t N, std::int64_t V, std::int64_t H,               \
      std::int32_t ignore_index, float grad_scale, T* d_dx, float* d_dwlm, std::int64_t chunk,     \
      void* d_scratch, std::size_t scratch_bytes, cudaStream_t stream) {                           \
    lm_head_cross_entropy_chunks(device_launcher{stream},                                          \
                                 detail::cublaslt_head_gemms<T>{&ctx, stream}, d_loss_sum, d_x,    \
                                 d_wlm, d_targets, N, V, H, ignore_index, grad_scale, d_dx,        \
                                 d_dwlm, chunk, d_scratch, scratch_bytes);                         \
  }

TESSERA_CE_ENTRIES(bf16)
TESSERA_CE_ENTRIES(fp16)
#undef TESSERA_CE_ENTRIES

#endif  // __CUDACC__ && TESSERA_CUDA_DEFINES_ENTRIES

}  // namespace tessera::kernels::cuda
