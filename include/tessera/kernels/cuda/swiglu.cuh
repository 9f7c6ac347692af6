#pragma once
/// \file kernels/cuda/swiglu.cuh
/// SwiGLU forward and backward on the GPU (declared and documented in
/// kernels/cuda/kernels.hpp). Per-element arithmetic: kernels/detail/swiglu.hpp,
/// the same functions as the host loop. Element-wise, grid-stride
/// (elementwise_config), 16-byte accesses when every pointer is aligned, a
/// scalar tail. The bodies are written over the primitive interface of
/// kernels/cuda/block.hpp, so the host tests run them under the block
/// emulator (tests/kernels/emulated_swiglu.cpp).
///
/// Gradient contract (llm.c): no parameters; dgate and dup are written (=).

#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/block.hpp"
#include "tessera/kernels/detail/swiglu.hpp"

#if defined(__CUDACC__)
#include "tessera/kernels/cuda/kernels.hpp"
#endif

namespace tessera::kernels::cuda {

namespace detail {

/// out = silu(gate) * up over n elements of T, V per access.
template <class T, int V>
struct swiglu_forward_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "swiglu_forward";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, T* out, const T* gate,
                                   const T* up, std::int64_t n) {
    elementwise_apply<V>(b, n, [&]<int W>(std::int64_t i) {
      const pack<T, W> g = Ops::template ld_pack<W>(gate + i);
      const pack<T, W> u = Ops::template ld_pack<W>(up + i);
      pack<T, W> o;
      TESSERA_UNROLL
      for (int k = 0; k < W; ++k)
        o.v[k] = to<T>(kernels::detail::swiglu_out(to<float>(g.v[k]), to<float>(u.v[k])));
      Ops::template st_pack<W>(out + i, o);  // after the loads: out may be gate or up
    });
  }
};

/// dgate, dup of G from dout (G), gate and up (T); V elements per access.
template <class T, class G, int V>
struct swiglu_backward_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "swiglu_backward";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, G* dgate, G* dup,
                                   const G* dout, const T* gate, const T* up, std::int64_t n) {
    elementwise_apply<V>(b, n, [&]<int W>(std::int64_t i) {
      const pack<T, W> g = Ops::template ld_pack<W>(gate + i);
      const pack<T, W> u = Ops::template ld_pack<W>(up + i);
      const pack<G, W> dy = Ops::template ld_pack<W>(dout + i);
      pack<G, W> dg, du;
      TESSERA_UNROLL
      for (int k = 0; k < W; ++k) {
        float dgk, duk;
        kernels::detail::swiglu_grad(to<float>(dy.v[k]), to<float>(g.v[k]), to<float>(u.v[k]), dgk,
                                     duk);
        dg.v[k] = to<G>(dgk);
        du.v[k] = to<G>(duk);
      }
      // After the loads: dgate or dup may be dout.
      Ops::template st_pack<W>(dgate + i, dg);
      Ops::template st_pack<W>(dup + i, du);
    });
  }
};

}  // namespace detail

/// swiglu_forward (kernels.hpp) on `launch`: 16-byte accesses when all
/// three pointers are 16-byte aligned.
template <class Launcher, class T>
void swiglu_forward_launch(const Launcher& launch, T* d_out, const T* d_gate, const T* d_up,
                           std::int64_t n) {
  constexpr int V = detail::vec_width<T>;
  const launch_config c = elementwise_config(n, V);
  if (n == 0) return;
  if (detail::all_aligned(16, d_out, d_gate, d_up))
    launch.template run<detail::swiglu_forward_body<T, V>>(c, d_out, d_gate, d_up, n);
  else
    launch.template run<detail::swiglu_forward_body<T, 1>>(c, d_out, d_gate, d_up, n);
}

/// swiglu_backward (kernels.hpp) on `launch`: V = 16 / max(sizeof(T),
/// sizeof(G)) elements per access when every pointer is aligned for V of its
/// type.
template <class Launcher, class T, class G>
void swiglu_backward_launch(const Launcher& launch, G* d_dgate, G* d_dup, const G* d_dout,
                            const T* d_gate, const T* d_up, std::int64_t n) {
  static_assert(std::is_same_v<G, float> || (is_half_v<T> && std::is_same_v<G, T>),
                "tessera::kernels::cuda::swiglu_backward: G must be float, or the 16-bit "
                "storage type T itself (bf16 or fp16)");
  constexpr int V = detail::vec_width<T, G>;
  const launch_config c = elementwise_config(n, V);
  if (n == 0) return;
  if (detail::all_aligned(V * sizeof(G), d_dgate, d_dup, d_dout) &&
      detail::all_aligned(V * sizeof(T), d_gate, d_up))
    launch.template run<detail::swiglu_backward_body<T, G, V>>(c, d_dgate, d_dup, d_dout, d_gate,
                                                               d_up, n);
  else
    launch.template run<detail::swiglu_backward_body<T, G, 1>>(c, d_dgate, d_dup, d_dout, d_gate,
                                                               d_up, n);
}

#if defined(__CUDACC__)

template <class T>
void swiglu_forward(T* d_out, const T* d_gate, const T* d_up, std::int64_t n, cudaStream_t stream) {
  swiglu_forward_launch(device_launcher{stream}, d_out, d_gate, d_up, n);
}

template <class T, class G>
void swiglu_backward(G* d_dgate, G* d_dup, const G* d_dout, const T* d_gate, const T* d_up,
                     std::int64_t n, cudaStream_t stream) {
  swiglu_backward_launch(device_launcher{stream}, d_dgate, d_dup, d_dout, d_gate, d_up, n);
}

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
