#pragma once
/// \file kernels/cuda/rope.cuh
/// RoPE forward and backward on the GPU, in place on x (B, T, nh, hd)
/// (declared and documented in kernels/cuda/kernels.hpp). Per-pair
/// arithmetic: kernels/detail/rope.hpp (rope_rotate, rope_rotate_transpose),
/// the same functions as the host loop of kernels/rope.hpp, in float32.
/// One work item is V consecutive pairs (i, i + hd/2) of one head vector:
/// 16-byte accesses to both halves when hd/2 is a multiple of V and x is
/// aligned, one pair per item otherwise. Grid-stride (rope_config), 64-bit
/// indices. The bodies are written over the primitive interface of
/// kernels/cuda/block.hpp, so the host tests run them under the block
/// emulator (tests/kernels/emulated_rope.cpp).
///
/// Gradient contract (llm.c): no parameters; dx is overwritten in place.

#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/block.hpp"
#include "tessera/kernels/detail/rope.hpp"

#if defined(__CUDACC__)
#include "tessera/kernels/cuda/kernels.hpp"
#endif

namespace tessera::kernels::cuda {

namespace detail {

/// Applies `rotate(a1, a2, c, s, y1, y2)` in float32 to every pair of x
/// (B*T*nh rows of 2 * half), W pairs per item, `items` items over the
/// grid; each element is read and written once, by one thread. The tables
/// cos, sin (rows, half) are read per element, so they need no alignment;
/// token t of row b reads the row of its position,
/// kernels::detail::rope_position(positions, b T_ + t, T_) (t by default;
/// kernels::rope_positions: documents, context-parallel global positions).
template <class Ops, int W, class T, class Rotate>
TESSERA_BLOCK_FN void rope_apply(const block_index& b, T* x, const float* cos, const float* sin,
                                 std::int64_t T_, std::int64_t nh, std::int64_t half,
                                 std::int64_t items, rope_positions positions, Rotate rotate) {
  const std::int64_t stride = b.grid_x * b.threads;
  for (std::int64_t g = b.x * b.threads + b.tid; g < items; g += stride) {
    const std::int64_t p = g * W;  // first pair of the item
    const std::int64_t row = p / half;
    const std::int64_t i = p - row * half;
    const std::int64_t pos = kernels::detail::rope_position(positions, row / nh, T_);
    T* v1 = x + row * 2 * half + i;
    T* v2 = v1 + half;
    const float* c = cos + pos * half + i;
    const float* s = sin + pos * half + i;
    pack<T, W> h1 = Ops::template ld_pack<W>(v1);  // first elements of the W pairs
    pack<T, W> h2 = Ops::template ld_pack<W>(v2);  // their partners, hd/2 further
    TESSERA_UNROLL
    for (int k = 0; k < W; ++k) {
      float y1, y2;
      rotate(to<float>(h1.v[k]), to<float>(h2.v[k]), Ops::ld(c + k), Ops::ld(s + k), y1, y2);
      h1.v[k] = to<T>(y1);
      h2.v[k] = to<T>(y2);
    }
    Ops::template st_pack<W>(v1, h1);
    Ops::template st_pack<W>(v2, h2);
  }
}

/// Forward: each pair (x1, x2) becomes (x1 cos - x2 sin, x2 cos + x1 sin).
template <class T, int W>
struct rope_forward_body {
  static constexpr int threads = rope_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "rope_forward";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, T* x, const float* cos,
                                   const float* sin, std::int64_t T_, std::int64_t nh,
                                   std::int64_t half, std::int64_t items,
                                   rope_positions positions) {
    rope_apply<Ops, W>(b, x, cos, sin, T_, nh, half, items, positions,
                       [](float x1, float x2, float c, float s, float& y1, float& y2) {
                         kernels::detail::rope_rotate(x1, x2, c, s, y1, y2);
                       });
  }
};

/// Backward: the transpose rotation, dx1 = dy1 cos + dy2 sin,
/// dx2 = dy2 cos - dy1 sin.
template <class G, int W>
struct rope_backward_body {
  static constexpr int threads = rope_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "rope_backward";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, G* dx, const float* cos,
                                   const float* sin, std::int64_t T_, std::int64_t nh,
                                   std::int64_t half, std::int64_t items,
                                   rope_positions positions) {
    rope_apply<Ops, W>(b, dx, cos, sin, T_, nh, half, items, positions,
                       [](float dy1, float dy2, float c, float s, float& y1, float& y2) {
                         kernels::detail::rope_rotate_transpose(dy1, dy2, c, s, y1, y2);
                       });
  }
};

/// Launches `BodyV` (V pairs an item) when hd/2 is a multiple of V and x is
/// aligned for V elements, `Body1` (one pair) otherwise; nothing when there
/// are no pairs. Throws config_error (rope_config) for a negative size or hd
/// odd or <= 0, and (kernels::detail::check_rope_positions) for positions
/// with split outside [0, T_] or a negative offset.
template <class BodyV, class Body1, int V, class Launcher, class T>
void rope_launch(const Launcher& launch, T* x, const float* cos, const float* sin, std::int64_t B,
                 std::int64_t T_, std::int64_t nh, std::int64_t hd, rope_positions positions) {
  const std::int64_t half = hd / 2;
  const bool vec = half % V == 0 && all_aligned(V * sizeof(T), x);
  const launch_config c = rope_config(B, T_, nh, hd, vec ? V : 1);
  kernels::detail::check_rope_positions("rope (cuda)", positions, T_);
  const std::int64_t pairs = B * T_ * nh * half;
  if (pairs == 0) return;
  if (vec)
    launch.template run<BodyV>(c, x, cos, sin, T_, nh, half, pairs / V, positions);
  else
    launch.template run<Body1>(c, x, cos, sin, T_, nh, half, pairs, positions);
}

}  // namespace detail

/// rope_forward (kernels.hpp) on `launch` (`positions.doc_start`, if any,
/// in the memory the launcher's kernels read: device memory on a GPU).
template <class Launcher, class T>
void rope_forward_launch(const Launcher& launch, T* d_x, const float* d_cos, const float* d_sin,
                         std::int64_t B, std::int64_t T_, std::int64_t nh, std::int64_t hd,
                         rope_positions positions = {}) {
  static_assert(std::is_same_v<T, float> || is_half_v<T>,
                "tessera::kernels::cuda::rope_forward: T must be float, bf16 or fp16");
  constexpr int V = detail::vec_width<T>;
  detail::rope_launch<detail::rope_forward_body<T, V>, detail::rope_forward_body<T, 1>, V>(
      launch, d_x, d_cos, d_sin, B, T_, nh, hd, positions);
}

/// rope_backward (kernels.hpp) on `launch`.
template <class Launcher, class G>
void rope_backward_launch(const Launcher& launch, G* d_dx, const float* d_cos, const float* d_sin,
                          std::int64_t B, std::int64_t T_, std::int64_t nh, std::int64_t hd,
                          rope_positions positions = {}) {
  static_assert(std::is_same_v<G, float> || is_half_v<G>,
                "tessera::kernels::cuda::rope_backward: G must be float, bf16 or fp16");
  constexpr int V = detail::vec_width<G>;
  detail::rope_launch<detail::rope_backward_body<G, V>, detail::rope_backward_body<G, 1>, V>(
      launch, d_dx, d_cos, d_sin, B, T_, nh, hd, positions);
}

#if defined(__CUDACC__)

template <class T>
void rope_forward(T* d_x, const float* d_cos, const float* d_sin, std::int64_t B, std::int64_t T_,
                  std::int64_t nh, std::int64_t hd, cudaStream_t stream, rope_positions positions) {
  rope_forward_launch(device_launcher{stream}, d_x, d_cos, d_sin, B, T_, nh, hd, positions);
}

template <class G>
void rope_backward(G* d_dx, const float* d_cos, const float* d_sin, std::int64_t B, std::int64_t T_,
                   std::int64_t nh, std::int64_t hd, cudaStream_t stream,
                   rope_positions positions) {
  rope_backward_launch(device_launcher{stream}, d_dx, d_cos, d_sin, B, T_, nh, hd, positions);
}

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
