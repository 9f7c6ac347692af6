#pragma once
/// \file kernels/cuda/elementwise.cuh
/// Element-wise kernels on the GPU (declared and documented in
/// kernels/cuda/kernels.hpp): casts between storage types, the residual add
/// and the inf/NaN check of the loss scaler. The arithmetic is tessera::to
/// and one float32 add, the same as the host kernels::cast and
/// kernels::residual_add, so the bits match. The bodies are written over the
/// primitive interface of kernels/cuda/block.hpp, so the host tests run them
/// under the block emulator (tests/kernels/emulated_elementwise.cpp).
///
/// Each is a grid-stride loop over n elements (elementwise_config), 16-byte
/// accesses when the pointers allow, a scalar tail; no shared memory.
/// count_nonfinite's result is an integer OR, so it is the same in any order.

#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/block.hpp"

#if defined(__CUDACC__)
#include "tessera/kernels/cuda/kernels.hpp"
#endif

namespace tessera::kernels::cuda {

namespace detail {

/// out[i] = To(in[i]), V elements per access.
template <class To, class From, int V>
struct cast_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "cast";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, To* out, const From* in,
                                   std::int64_t n) {
    elementwise_apply<V>(b, n, [&]<int W>(std::int64_t i) {
      const pack<From, W> x = Ops::template ld_pack<W>(in + i);
      pack<To, W> y;
      TESSERA_UNROLL
      for (int k = 0; k < W; ++k) y.v[k] = to<To>(x.v[k]);
      Ops::template st_pack<W>(out + i, y);
    });
  }
};

/// out[i] = T(float(a[i]) + float(b[i])), V elements per access.
template <class T, int V>
struct residual_add_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "residual_add";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& blk, no_shared&, T* out, const T* a,
                                   const T* b, std::int64_t n) {
    using A = accum_t<T>;
    elementwise_apply<V>(blk, n, [&]<int W>(std::int64_t i) {
      const pack<T, W> x = Ops::template ld_pack<W>(a + i);
      const pack<T, W> y = Ops::template ld_pack<W>(b + i);
      pack<T, W> o;
      TESSERA_UNROLL
      for (int k = 0; k < W; ++k) o.v[k] = to<T>(to<A>(x.v[k]) + to<A>(y.v[k]));
      Ops::template st_pack<W>(out + i, o);  // after both loads: out may be a or b
    });
  }
};

/// True when x is inf or NaN (all exponent bits set), by the bits, so no
/// compiler flag can fold the test away.
template <class G>
TESSERA_BLOCK_FN bool nonfinite(G x) {
  if constexpr (std::is_same_v<G, bf16>)
    return (x.bits & 0x7f80u) == 0x7f80u;
  else if constexpr (std::is_same_v<G, fp16>)
    return (x.bits & 0x7c00u) == 0x7c00u;
  else
    return (::tessera::detail::float_bits(x) & 0x7f800000u) == 0x7f800000u;
}

/// *flag |= 1 when any of g[0, n) is inf or NaN; V elements per access.
template <class G, int V>
struct count_nonfinite_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "count_nonfinite";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, std::int32_t* flag, const G* g,
                                   std::int64_t n) {
    int found = 0;
    elementwise_apply<V>(b, n, [&]<int W>(std::int64_t i) {
      const pack<G, W> p = Ops::template ld_pack<W>(g + i);
      TESSERA_UNROLL
      for (int k = 0; k < W; ++k) found |= nonfinite(p.v[k]) ? 1 : 0;
    });
    // One integer atomic per block that saw one (a plain store from several
    // blocks would be a data race); the result is 1 in any order.
    if (Ops::sync_or(found != 0) && b.tid == 0) Ops::atomic_or(flag, 1);
  }
};

}  // namespace detail

/// cast (kernels.hpp) on `launch`: 16-byte accesses of the wider type when
/// both pointers are aligned for them, else one element per access.
template <class Launcher, class To, class From>
void cast_launch(const Launcher& launch, To* d_out, const From* d_in, std::int64_t n) {
  constexpr int V = detail::vec_width<To, From>;
  const launch_config c = elementwise_config(n, V);
  if (n == 0) return;
  if (detail::all_aligned(V * sizeof(To), d_out) && detail::all_aligned(V * sizeof(From), d_in))
    launch.template run<detail::cast_body<To, From, V>>(c, d_out, d_in, n);
  else
    launch.template run<detail::cast_body<To, From, 1>>(c, d_out, d_in, n);
}

/// residual_add (kernels.hpp) on `launch`: 16-byte accesses when all three
/// pointers are 16-byte aligned.
template <class Launcher, class T>
void residual_add_launch(const Launcher& launch, T* d_out, const T* d_a, const T* d_b,
                         std::int64_t n) {
  static_assert(std::is_same_v<T, float> || is_half_v<T>,
                "tessera::kernels::cuda::residual_add: T must be float, bf16 or fp16");
  constexpr int V = detail::vec_width<T>;
  const launch_config c = elementwise_config(n, V);
  if (n == 0) return;
  if (detail::all_aligned(16, d_out, d_a, d_b))
    launch.template run<detail::residual_add_body<T, V>>(c, d_out, d_a, d_b, n);
  else
    launch.template run<detail::residual_add_body<T, 1>>(c, d_out, d_a, d_b, n);
}

/// count_nonfinite (kernels.hpp) on `launch`: 16-byte loads when g is
/// 16-byte aligned. n = 0 launches nothing and leaves the flag as it is.
template <class Launcher, class G>
void count_nonfinite_launch(const Launcher& launch, std::int32_t* d_flag, const G* d_g,
                            std::int64_t n) {
  static_assert(std::is_same_v<G, float> || is_half_v<G>,
                "tessera::kernels::cuda::count_nonfinite: G must be float, bf16 or fp16");
  constexpr int V = detail::vec_width<G>;
  const launch_config c = elementwise_config(n, V);
  TESSERA_THROW_IF(n > 0 && d_flag == nullptr, config_error,
                   "count_nonfinite (cuda): d_flag is null");
  if (n == 0) return;
  if (detail::all_aligned(16, d_g))
    launch.template run<detail::count_nonfinite_body<G, V>>(c, d_flag, d_g, n);
  else
    launch.template run<detail::count_nonfinite_body<G, 1>>(c, d_flag, d_g, n);
}

#if defined(__CUDACC__)

template <class To, class From>
void cast(To* d_out, const From* d_in, std::int64_t n, cudaStream_t stream) {
  cast_launch(device_launcher{stream}, d_out, d_in, n);
}

template <class T>
void residual_add(T* d_out, const T* d_a, const T* d_b, std::int64_t n, cudaStream_t stream) {
  residual_add_launch(device_launcher{stream}, d_out, d_a, d_b, n);
}

template <class G>
void count_nonfinite(std::int32_t* d_flag, const G* d_g, std::int64_t n, cudaStream_t stream) {
  count_nonfinite_launch(device_launcher{stream}, d_flag, d_g, n);
}

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
