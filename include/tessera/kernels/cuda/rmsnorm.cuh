#pragma once
/// \file kernels/cuda/rmsnorm.cuh
/// RMSNorm forward and backward on the GPU (declared and documented in
/// kernels/cuda/kernels.hpp). Per-element arithmetic: kernels/detail/rmsnorm.hpp,
/// the same functions as the host loop. The bodies are written over the
/// primitive interface of kernels/cuda/block.hpp, so the host tests run them
/// under the block emulator (tests/kernels/cuda_emulated.cpp).
///
/// Gradient contract (llm.c): dweight accumulates (+=), dinp is written (=)
/// unless accumulate_dinp. Forward and dinp: one block of 256 threads per
/// row, a CUB block reduction, 16-byte loads when aligned. dweight: partial
/// sums over 256-row chunks into scratch, then a per-column sum in chunk
/// order: deterministic, no atomics.

#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/block.hpp"
#include "tessera/kernels/detail/rmsnorm.hpp"

#if defined(__CUDACC__)
#include "tessera/kernels/cuda/kernels.hpp"
#endif

namespace tessera::kernels::cuda {

namespace detail {

/// Forward of one row per block (grid-stride over rows): rstd by a block
/// sum of squares, then out = weight * x * rstd. V elements per access.
template <class T, int V>
struct rmsnorm_forward_body {
  static constexpr int threads = rmsnorm_threads;
  static constexpr std::size_t smem_bound = rmsnorm_smem_bound;
  static constexpr const char* name = "rmsnorm_forward";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<float, threads>::storage reduce;
    float rstd;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, T* out,
                                   float* rstd, const T* inp, const T* weight, std::int64_t N,
                                   std::int64_t H, float eps) {
    using reduce = typename Ops::template block_reduce<float, threads>;
    const float Hf = static_cast<float>(H);
    const std::int64_t first = static_cast<std::int64_t>(b.tid) * V,
                       step = std::int64_t(threads) * V;
    for (std::int64_t row = b.x; row < N; row += b.grid_x) {
      const T* x = inp + row * H;
      T* y = out + row * H;
      float ss = 0.f;
      for (std::int64_t i = first; i < H; i += step) {
        const pack<T, V> p = Ops::template ld_pack<V>(x + i);
        TESSERA_UNROLL
        for (int k = 0; k < V; ++k) {
          const float v = to<float>(p.v[k]);
          ss += v * v;
        }
      }
      const float total = reduce::sum(sm.reduce, ss);
      if (b.tid == 0) {
        const float r = kernels::detail::rmsnorm_rstd(total, Hf, eps);
        sm.rstd = r;
        Ops::st(rstd + row, r);
      }
      Ops::sync();
      const float r = sm.rstd;
      for (std::int64_t i = first; i < H; i += step) {
        const pack<T, V> p = Ops::template ld_pack<V>(x + i);
        const pack<T, V> w = Ops::template ld_pack<V>(weight + i);
        pack<T, V> o;
        TESSERA_UNROLL
        for (int k = 0; k < V; ++k)
          o.v[k] = to<T>(kernels::detail::rmsnorm_out(to<float>(p.v[k]), to<float>(w.v[k]), r));
        Ops::template st_pack<V>(y + i, o);
      }
      Ops::sync();  // sm is reused by the next row
    }
  }
};

/// dinp of one row per block: mean(w dy xhat) by a block sum, then dx.
template <class T, class G, int V>
struct rmsnorm_dinp_body {
  static constexpr int threads = rmsnorm_threads;
  static constexpr std::size_t smem_bound = rmsnorm_smem_bound;
  static constexpr const char* name = "rmsnorm_dinp";
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_reduce<float, threads>::storage reduce;
    float mean;
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, G* dinp,
                                   const G* dout, const T* inp, const T* weight, const float* rstd,
                                   std::int64_t N, std::int64_t H, bool accumulate) {
    using reduce = typename Ops::template block_reduce<float, threads>;
    const float Hf = static_cast<float>(H);
    const std::int64_t first = static_cast<std::int64_t>(b.tid) * V,
                       step = std::int64_t(threads) * V;
    for (std::int64_t row = b.x; row < N; row += b.grid_x) {
      const T* x = inp + row * H;
      const G* dy = dout + row * H;
      G* dx = dinp + row * H;
      const float r = Ops::ld(rstd + row);
      float dot = 0.f;  // sum_h w dy xhat
      for (std::int64_t i = first; i < H; i += step) {
        const pack<T, V> xp = Ops::template ld_pack<V>(x + i);
        const pack<T, V> wp = Ops::template ld_pack<V>(weight + i);
        const pack<G, V> gp = Ops::template ld_pack<V>(dy + i);
        TESSERA_UNROLL
        for (int k = 0; k < V; ++k)
          dot += to<float>(wp.v[k]) * to<float>(gp.v[k]) * (to<float>(xp.v[k]) * r);
      }
      const float total = reduce::sum(sm.reduce, dot);
      if (b.tid == 0) sm.mean = total / Hf;
      Ops::sync();
      const float mean = sm.mean;
      for (std::int64_t i = first; i < H; i += step) {
        const pack<T, V> xp = Ops::template ld_pack<V>(x + i);
        const pack<T, V> wp = Ops::template ld_pack<V>(weight + i);
        const pack<G, V> gp = Ops::template ld_pack<V>(dy + i);
        pack<G, V> o;
        if (accumulate) o = Ops::template ld_pack<V>(static_cast<const G*>(dx + i));
        TESSERA_UNROLL
        for (int k = 0; k < V; ++k) {
          const float g = kernels::detail::rmsnorm_dx(to<float>(gp.v[k]), to<float>(wp.v[k]),
                                                      to<float>(xp.v[k]) * r, r, mean);
          o.v[k] = to<G>(accumulate ? to<float>(o.v[k]) + g : g);
        }
        Ops::template st_pack<V>(dx + i, o);
      }
      Ops::sync();
    }
  }
};

/// partial[c, h] = sum over rows n of chunk c of dout[n,h] * inp[n,h] * rstd[n],
/// in order of n: block (c, column block), one column per thread.
template <class T, class G>
struct rmsnorm_dweight_partial_body {
  static constexpr int threads = rmsnorm_dweight_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "rmsnorm_dweight_partial";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, float* partial, const G* dout,
                                   const T* inp, const float* rstd, std::int64_t N,
                                   std::int64_t H) {
    const std::int64_t h = b.y * threads + b.tid;
    if (h >= H) return;
    const std::int64_t n0 = b.x * rmsnorm_dweight_rows;
    const std::int64_t n1 = n0 + rmsnorm_dweight_rows < N ? n0 + rmsnorm_dweight_rows : N;
    float acc = 0.f;
    for (std::int64_t n = n0; n < n1; ++n)
      acc += to<float>(Ops::ld(dout + n * H + h)) *
             (to<float>(Ops::ld(inp + n * H + h)) * Ops::ld(rstd + n));
    Ops::st(partial + b.x * H + h, acc);
  }
};

/// dweight[h] += sum_c partial[c, h], chunks in order; one column per thread.
struct rmsnorm_dweight_reduce_body {
  static constexpr int threads = rmsnorm_dweight_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "rmsnorm_dweight_reduce";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, float* dweight,
                                   const float* partial, std::int64_t chunks, std::int64_t H) {
    const std::int64_t h = b.x * threads + b.tid;
    if (h >= H) return;
    float s = 0.f;
    for (std::int64_t c = 0; c < chunks; ++c) s += Ops::ld(partial + c * H + h);
    Ops::st(dweight + h, Ops::ld(static_cast<const float*>(dweight + h)) + s);
  }
};

}  // namespace detail

/// rmsnorm_forward (kernels.hpp) on `launch`: the configuration and the
/// variant (16-byte accesses when H and the pointers allow), then the body.
template <class Launcher, class T>
void rmsnorm_forward_launch(const Launcher& launch, T* d_out, float* d_rstd, const T* d_inp,
                            const T* d_weight, std::int64_t N, std::int64_t H, double eps) {
  TESSERA_THROW_IF(!(eps >= 0), config_error, "rmsnorm_forward (cuda): eps=", eps, " must be >= 0");
  const launch_config c = rmsnorm_row_config(N, H);
  if (N == 0) return;
  constexpr int V = detail::vec_width<T>;
  const float e = static_cast<float>(eps);
  if (H % V == 0 && detail::all_aligned(16, d_out, d_inp, d_weight))
    launch.template run<detail::rmsnorm_forward_body<T, V>>(c, d_out, d_rstd, d_inp, d_weight, N, H,
                                                            e);
  else
    launch.template run<detail::rmsnorm_forward_body<T, 1>>(c, d_out, d_rstd, d_inp, d_weight, N, H,
                                                            e);
}

/// rmsnorm_backward (kernels.hpp) on `launch`: dinp, then dweight's partial
/// sums into the scratch and their reduction.
template <class Launcher, class T, class G>
void rmsnorm_backward_launch(const Launcher& launch, G* d_dinp, float* d_dweight, const G* d_dout,
                             const T* d_inp, const T* d_weight, const float* d_rstd, std::int64_t N,
                             std::int64_t H, void* d_scratch, std::size_t scratch_bytes,
                             bool accumulate_dinp) {
  static_assert(std::is_same_v<G, float> || (is_half_v<T> && std::is_same_v<G, T>),
                "tessera::kernels::cuda::rmsnorm_backward: G must be float, or the 16-bit "
                "storage type T itself (bf16 or fp16)");
  const launch_config rows = rmsnorm_row_config(N, H);
  const launch_config part = rmsnorm_dweight_partial_config(N, H);
  const launch_config red = rmsnorm_dweight_reduce_config(H);
  TESSERA_THROW_IF(scratch_bytes < part.scratch_bytes, config_error,
                   "rmsnorm_backward (cuda): scratch of ", scratch_bytes, " bytes is below the ",
                   part.scratch_bytes, " that N=", N, " H=", H,
                   " need (rmsnorm_backward_scratch_bytes)");
  if (N == 0) return;
  constexpr int V = detail::vec_width<T, G>;
  if (H % V == 0 && detail::all_aligned(16, d_dinp, d_dout) &&
      detail::all_aligned(V * sizeof(T), d_inp, d_weight))
    launch.template run<detail::rmsnorm_dinp_body<T, G, V>>(rows, d_dinp, d_dout, d_inp, d_weight,
                                                            d_rstd, N, H, accumulate_dinp);
  else
    launch.template run<detail::rmsnorm_dinp_body<T, G, 1>>(rows, d_dinp, d_dout, d_inp, d_weight,
                                                            d_rstd, N, H, accumulate_dinp);
  float* partial = static_cast<float*>(d_scratch);
  launch.template run<detail::rmsnorm_dweight_partial_body<T, G>>(part, partial, d_dout, d_inp,
                                                                  d_rstd, N, H);
  launch.template run<detail::rmsnorm_dweight_reduce_body>(
      red, d_dweight, static_cast<const float*>(partial), part.grid_x, H);
}

#if defined(__CUDACC__)

template <class T>
void rmsnorm_forward(T* d_out, float* d_rstd, const T* d_inp, const T* d_weight, std::int64_t N,
                     std::int64_t H, double eps, cudaStream_t stream) {
  rmsnorm_forward_launch(device_launcher{stream}, d_out, d_rstd, d_inp, d_weight, N, H, eps);
}

template <class T, class G>
void rmsnorm_backward(G* d_dinp, float* d_dweight, const G* d_dout, const T* d_inp,
                      const T* d_weight, const float* d_rstd, std::int64_t N, std::int64_t H,
                      void* d_scratch, std::size_t scratch_bytes, cudaStream_t stream,
                      bool accumulate_dinp) {
  rmsnorm_backward_launch(device_launcher{stream}, d_dinp, d_dweight, d_dout, d_inp, d_weight,
                          d_rstd, N, H, d_scratch, scratch_bytes, accumulate_dinp);
}

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
