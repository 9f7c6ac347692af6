#pragma once
/// \file kernels/cuda/embedding.cuh
/// Token embedding forward (row gather) and backward (scatter-add), and the
/// vocabulary-parallel embedding's local row indices, on the GPU (declared
/// and documented in kernels/cuda/kernels.hpp). The bodies are written over
/// the primitive interface of kernels/cuda/block.hpp, so the host tests run
/// them under the block emulator (tests/kernels/emulated_embedding.cpp)
/// against the host kernels of kernels/embedding.hpp.
///
/// Gradient contract (llm.c): dwte accumulates (+=).
///
/// The backward is deterministic without atomics and without sorting: block
/// (b, c) owns vocabulary rows [64 b, 64 b + 64) and columns
/// [1024 c, 1024 c + 1024) of dwte. It scans all tokens in tiles of 1024,
/// compacts the positions whose token it owns with a CUB block scan (which
/// keeps their order), and adds those dout rows one after another, so each
/// dwte element is the same sequence of float additions as on the host.
/// Cost: every block reads every token id (N * 4 bytes, from L2); dout is
/// read exactly once in all.

#include <cstdint>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/block.hpp"

#if defined(__CUDACC__)
#include "tessera/kernels/cuda/kernels.hpp"
#endif

namespace tessera::kernels::cuda {

namespace detail {

/// out (N, H) of T: row n is wte[tokens[n], :] (V_rows x H), or zeros when
/// tokens[n] is outside [0, V_rows). One token row per block (grid-stride
/// over rows), V elements per access.
template <class T, int V>
struct embedding_forward_body {
  static constexpr int threads = embedding_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "embedding_forward";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, T* out,
                                   const std::int32_t* tokens, const T* wte, std::int64_t N,
                                   std::int64_t V_rows, std::int64_t H) {
    for (std::int64_t n = b.x; n < N; n += b.grid_x) {
      const std::int64_t t = Ops::ld(tokens + n);
      T* dst = out + n * H;
      const bool ok = t >= 0 && t < V_rows;
      const T* src = wte + (ok ? t : 0) * H;
      for (std::int64_t h = static_cast<std::int64_t>(b.tid) * V; h < H;
           h += static_cast<std::int64_t>(threads) * V) {
        pack<T, V> p;
        if (ok) {
          p = Ops::template ld_pack<V>(src + h);
        } else {
          TESSERA_UNROLL
          for (int k = 0; k < V; ++k) p.v[k] = to<T>(0.0f);
        }
        Ops::template st_pack<V>(dst + h, p);
      }
    }
  }
};

/// dwte (V_rows, H) float32 += dout (N, H) of G scattered by tokens (N):
/// block (b, c) owns rows [64 b, 64 b + 64) and columns [1024 c, 1024 c +
/// 1024) of dwte; for each tile of 1024 tokens a block scan compacts the
/// positions it owns, in order, into shared memory, and the block adds those
/// dout rows one after another (one column per thread). Tokens outside
/// [0, V_rows) match no block: ignored.
template <class G>
struct embedding_backward_body {
  static constexpr int threads = embedding_threads;
  static constexpr std::size_t smem_bound = embedding_backward_smem_bound;
  static constexpr const char* name = "embedding_backward";
  /// Tile positions per thread, blocked: thread t holds positions 4t..4t+3.
  static constexpr int per_thread = embedding_backward_tile / threads;
  static_assert(per_thread * threads == embedding_backward_tile);
  template <class Ops>
  struct shared_storage {
    typename Ops::template block_scan<threads, per_thread>::storage scan;
    int matched[embedding_backward_tile];  // tile positions whose token this block owns, in order
  };

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, shared_storage<Ops>& sm, float* dwte,
                                   const G* dout, const std::int32_t* tokens, std::int64_t N,
                                   std::int64_t V_rows, std::int64_t H) {
    using scan = typename Ops::template block_scan<threads, per_thread>;
    const std::int64_t v0 = b.x * embedding_backward_rows;
    const std::int64_t v1 =
        v0 + embedding_backward_rows < V_rows ? v0 + embedding_backward_rows : V_rows;
    const std::int64_t c0 = b.y * embedding_backward_cols;
    const std::int64_t c1 = c0 + embedding_backward_cols < H ? c0 + embedding_backward_cols : H;
    for (std::int64_t base = 0; base < N; base += embedding_backward_tile) {
      int flag[per_thread], offset[per_thread];
      TESSERA_UNROLL
      for (int k = 0; k < per_thread; ++k) {
        const std::int64_t n = base + static_cast<std::int64_t>(b.tid) * per_thread + k;
        const std::int64_t t = n < N ? Ops::ld(tokens + n) : -1;
        flag[k] = t >= v0 && t < v1;
      }
      int count;
      scan::exclusive_sum(sm.scan, flag, offset, count);
      TESSERA_UNROLL
      for (int k = 0; k < per_thread; ++k)
        if (flag[k]) sm.matched[offset[k]] = b.tid * per_thread + k;
      Ops::sync();
      for (int j = 0; j < count; ++j) {
        const std::int64_t n = base + sm.matched[j];
        const std::int64_t t = Ops::ld(tokens + n);
        float* dst = dwte + t * H;
        const G* src = dout + n * H;
        for (std::int64_t h = c0 + b.tid; h < c1; h += threads)
          Ops::st(dst + h,
                  Ops::ld(static_cast<const float*>(dst + h)) + to<float>(Ops::ld(src + h)));
      }
      Ops::sync();  // sm is reused by the next tile
    }
  }
};

/// out[n] = ids[n] - v_begin where that is in [0, Vl) and ids[n] is not
/// ignore_index, else ignore_index; one position per thread, grid-stride.
/// out may alias ids (each thread reads then writes its own position).
struct embedding_local_ids_body {
  static constexpr int threads = embedding_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "embedding_local_ids";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, std::int32_t* out,
                                   const std::int32_t* ids, std::int64_t N, std::int64_t v_begin,
                                   std::int64_t Vl, std::int32_t ignore_index) {
    for (std::int64_t n = b.x * threads + b.tid; n < N; n += b.grid_x * threads) {
      const std::int32_t id = Ops::ld(ids + n);
      const std::int64_t l = static_cast<std::int64_t>(id) - v_begin;
      Ops::st(out + n, (id != ignore_index && l >= 0 && l < Vl) ? static_cast<std::int32_t>(l)
                                                                : ignore_index);
    }
  }
};

}  // namespace detail

/// embedding_forward (kernels.hpp) on `launch`: the configuration and the
/// variant (16-byte accesses when H and the pointers allow), then the body.
template <class Launcher, class T>
void embedding_forward_launch(const Launcher& launch, T* d_out, const std::int32_t* d_tokens,
                              const T* d_wte, std::int64_t N, std::int64_t V, std::int64_t H) {
  TESSERA_THROW_IF(V < 1, config_error, "embedding_forward (cuda): V=", V, " must be >= 1");
  const launch_config c = embedding_forward_config(N, H);
  if (N == 0 || H == 0) return;
  constexpr int W = detail::vec_width<T>;
  if (H % W == 0 && detail::all_aligned(16, d_out, d_wte))
    launch.template run<detail::embedding_forward_body<T, W>>(c, d_out, d_tokens, d_wte, N, V, H);
  else
    launch.template run<detail::embedding_forward_body<T, 1>>(c, d_out, d_tokens, d_wte, N, V, H);
}

/// embedding_backward (kernels.hpp) on `launch`.
template <class Launcher, class G>
void embedding_backward_launch(const Launcher& launch, float* d_dwte, const G* d_dout,
                               const std::int32_t* d_tokens, std::int64_t N, std::int64_t V,
                               std::int64_t H) {
  const launch_config c = embedding_backward_config(N, V, H);
  if (N == 0 || H == 0) return;
  launch.template run<detail::embedding_backward_body<G>>(c, d_dwte, d_dout, d_tokens, N, V, H);
}

/// embedding_local_ids (kernels.hpp) on `launch`; the cudaStream_t function
/// (not a template) below calls it with device_launcher.
template <class Launcher>
void embedding_local_ids_launch(const Launcher& launch, std::int32_t* d_out,
                                const std::int32_t* d_ids, std::int64_t N, std::int64_t v_begin,
                                std::int64_t Vl, std::int32_t ignore_index) {
  TESSERA_THROW_IF(N < 0 || Vl < 1 || v_begin < 0, config_error,
                   "embedding_local_ids (cuda): N=", N, " and the slice [", v_begin, ", ",
                   v_begin + Vl, ") must be N >= 0, Vl >= 1, v_begin >= 0");
  const launch_config c = embedding_local_ids_config(N);
  if (N == 0) return;
  launch.template run<detail::embedding_local_ids_body>(c, d_out, d_ids, N, v_begin, Vl,
                                                        ignore_index);
}

#if defined(__CUDACC__)

template <class T>
void embedding_forward(T* d_out, const std::int32_t* d_tokens, const T* d_wte, std::int64_t N,
                       std::int64_t V, std::int64_t H, cudaStream_t stream) {
  embedding_forward_launch(device_launcher{stream}, d_out, d_tokens, d_wte, N, V, H);
}

template <class G>
void embedding_backward(float* d_dwte, const G* d_dout, const std::int32_t* d_tokens,
                        std::int64_t N, std::int64_t V, std::int64_t H, cudaStream_t stream) {
  embedding_backward_launch(device_launcher{stream}, d_dwte, d_dout, d_tokens, N, V, H);
}

#if TESSERA_CUDA_DEFINES_ENTRIES  // header-only, or cuda/kernels.cu (kernels/cuda/linkage.hpp)
TESSERA_CUDA_ENTRY void embedding_local_ids(std::int32_t* d_out, const std::int32_t* d_ids,
                                            std::int64_t N, std::int64_t v_begin, std::int64_t Vl,
                                            std::int32_t ignore_index, cudaStream_t stream) {
  embedding_local_ids_launch(device_launcher{stream}, d_out, d_ids, N, v_begin, Vl, ignore_index);
}
#endif

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
