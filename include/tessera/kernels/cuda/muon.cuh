#pragma once
/// \file kernels/cuda/muon.cuh
/// Muon's element-wise kernels on the GPU (declared and documented in
/// kernels/cuda/kernels.hpp), the host kernels of kernels/muon.hpp as CUDA
/// bodies over the primitive interface of kernels/cuda/block.hpp (so the
/// host tests run them under the block emulator,
/// tests/kernels/emulated_optimizer.cpp), with the arithmetic of
/// kernels/detail/muon.hpp:
///
///   muon_momentum   one thread an element of every segment: a matrix's
///                   momentum, another tensor's AdamW step (one launch for
///                   the whole flat buffer);
///   muon_nesterov   one thread an element of a matrix's shard;
///   muon_assemble   one thread an element of W: gathered shards -> W;
///   muon_normalise  one thread an element of W: W / max(||W||_F, eps),
///                   the squared norm read from the device (grad_sum_squares);
///   muon_apply      one thread an element of the shard: decay and update.
///
/// The Newton-Schulz products between them are cuBLASLt matmuls through
/// the context (kernels/cuda/ops.hpp, muon_newton_schulz), in float32.
/// Element-wise, no reduction: deterministic, and the host's bits where
/// both round alike. A non-finite clip coefficient makes the momentum,
/// Nesterov and update kernels return before they write.

#include <math.h>

#include <cstdint>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/adamw.cuh"
#include "tessera/kernels/cuda/block.hpp"
#include "tessera/kernels/detail/muon.hpp"

#if defined(__CUDACC__)
#include "tessera/kernels/cuda/kernels.hpp"
#endif

namespace tessera::kernels::cuda {

namespace detail {

using muon_params = kernels::detail::muon_step_params<float>;

/// The segment of `segments` (num_segments, sorted and disjoint) holding
/// element i, by binary search as find_segment; null for none.
template <class Ops>
TESSERA_BLOCK_FN const muon_segment* find_muon_segment(const muon_segment* segments,
                                                       int num_segments, std::int64_t i) {
  int lo = 0, hi = num_segments;  // first segment with begin > i
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (Ops::ld(&segments[mid].begin) <= i)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0 || i >= Ops::ld(&segments[lo - 1].end)) return nullptr;
  return segments + (lo - 1);
}

/// Applies the device clip coefficient to `scale`; false (write nothing)
/// when it is not finite.
template <class Ops>
TESSERA_BLOCK_FN bool muon_scale(const float* grad_scale, float& scale) {
  if (grad_scale) {
    const float c = Ops::ld(grad_scale);
    if (!isfinite(c)) return false;
    scale *= c;
  }
  return true;
}

/// The fused pass of a Muon step (kernels::muon_momentum_step).
template <class Param, class Grad, bool Master>
struct muon_momentum_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "muon_momentum";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, Param* params, float* master,
                                   float* m, float* v, const Grad* grads, std::int64_t n,
                                   const muon_segment* segments, int num_segments, muon_params s,
                                   const float* grad_scale) {
    if (!muon_scale<Ops>(grad_scale, s.grad_scale)) return;
    s.adamw.grad_scale = s.grad_scale;
    const std::int64_t stride = b.grid_x * b.threads;
    for (std::int64_t i = b.x * b.threads + b.tid; i < n; i += stride) {
      const muon_segment* seg = find_muon_segment<Ops>(segments, num_segments, i);
      if (seg == nullptr) continue;
      const float g = to<float>(Ops::ld(grads + i + Ops::ld(&seg->grad_shift)));
      float mi = Ops::ld(static_cast<const float*>(m + i));
      if (Ops::ld(&seg->muon) != 0) {
        kernels::detail::muon_momentum(mi, g * s.grad_scale, s);
      } else {
        float* vp = v + i + Ops::ld(&seg->v_shift);
        float vi = Ops::ld(static_cast<const float*>(vp));
        const bool decay = Ops::ld(&seg->decay) != 0;
        update_parameter<Ops, Master>(
            params + i + Ops::ld(&seg->param_shift), master, i,
            [&](float& p) { kernels::detail::adamw_update(p, mi, vi, g, s.adamw, decay); });
        Ops::st(vp, vi);
      }
      Ops::st(m + i, mi);
    }
  }
};

/// What one matrix orthogonalises, its shard (kernels::muon_nesterov).
template <class Grad>
struct muon_nesterov_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "muon_nesterov";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, float* out, const float* m,
                                   const Grad* grads, muon_matrix t, muon_params s,
                                   const float* grad_scale) {
    if (!muon_scale<Ops>(grad_scale, s.grad_scale)) return;
    const std::int64_t n = t.owned(), stride = b.grid_x * b.threads;
    for (std::int64_t j = b.x * b.threads + b.tid; j < n; j += stride) {
      const float g = to<float>(Ops::ld(grads + t.begin + t.grad_shift + j)) * s.grad_scale;
      Ops::st(out + j, kernels::detail::muon_nesterov(Ops::ld(m + t.begin + j), g, s));
    }
  }
};

/// W from the gathered shards (kernels::muon_assemble).
struct muon_assemble_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "muon_assemble";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, float* wide,
                                   const float* gathered, muon_matrix t) {
    const std::int64_t n = t.whole(), stride = b.grid_x * b.threads;
    for (std::int64_t k = b.x * b.threads + b.tid; k < n; k += stride)
      Ops::st(wide + k, Ops::ld(gathered + kernels::detail::muon_wide_to_gathered(t, k)));
  }
};

/// W / max(sqrt(*ss), eps), the divisor rounded to float as the host's.
struct muon_normalise_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "muon_normalise";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, float* wide, std::int64_t n,
                                   const double* ss, double eps) {
    const double norm = sqrt(Ops::ld(ss));
    const float d = static_cast<float>(norm < eps ? eps : norm);  // std::max(norm, eps)
    const std::int64_t stride = b.grid_x * b.threads;
    for (std::int64_t k = b.x * b.threads + b.tid; k < n; k += stride)
      Ops::st(wide + k, Ops::ld(static_cast<const float*>(wide + k)) / d);
  }
};

/// The update of one matrix's shard (kernels::muon_apply).
template <class Param, bool Master>
struct muon_apply_body {
  static constexpr int threads = elementwise_threads;
  static constexpr std::size_t smem_bound = 0;
  static constexpr const char* name = "muon_apply";
  template <class Ops>
  using shared_storage = no_shared;

  template <class Ops>
  static TESSERA_BLOCK_FN void run(const block_index& b, no_shared&, Param* params, float* master,
                                   const float* wide, muon_matrix t, float decay_factor,
                                   float adjusted_lr, const float* grad_scale) {
    if (grad_scale && !isfinite(Ops::ld(grad_scale))) return;
    const float f = t.decay != 0 ? decay_factor : 1.0f;
    const std::int64_t n = t.owned(), stride = b.grid_x * b.threads;
    for (std::int64_t j = b.x * b.threads + b.tid; j < n; j += stride) {
      const std::int64_t i = t.begin + j;
      const float o = Ops::ld(wide + kernels::detail::muon_local_to_wide(t, t.first + j));
      update_parameter<Ops, Master>(params + i + t.param_shift, master, i, [&](float& p) {
        kernels::detail::muon_apply(p, o, f, adjusted_lr);
      });
    }
  }
};

}  // namespace detail

/// muon_momentum_step (kernels.hpp) on `launch`: as adamw_step_launch.
template <class Launcher, class Param, class Grad>
void muon_momentum_step_launch(const Launcher& launch, Param* d_params, float* d_master, float* d_m,
                               float* d_v, const Grad* d_grads, std::int64_t n,
                               const muon_segment* d_segments, int num_segments,
                               const kernels::detail::muon_step_params<float>& step,
                               const float* d_grad_scale) {
  constexpr bool has_master = !std::is_same_v<Param, float>;
  detail::check_optimizer_launch<Param>("muon_momentum_step", num_segments, d_master);
  const launch_config c = elementwise_config(n, 1);
  if (n == 0 || num_segments == 0) return;
  launch.template run<detail::muon_momentum_body<Param, Grad, has_master>>(
      c, d_params, d_master, d_m, d_v, d_grads, n, d_segments, num_segments, step, d_grad_scale);
}

/// muon_nesterov (kernels.hpp) on `launch`.
template <class Launcher, class Grad>
void muon_nesterov_launch(const Launcher& launch, float* d_out, const float* d_m,
                          const Grad* d_grads, const muon_matrix& t,
                          const kernels::detail::muon_step_params<float>& step,
                          const float* d_grad_scale) {
  if (t.owned() == 0) return;
  launch.template run<detail::muon_nesterov_body<Grad>>(elementwise_config(t.owned(), 1), d_out,
                                                        d_m, d_grads, t, step, d_grad_scale);
}

/// muon_assemble (kernels.hpp) on `launch`.
template <class Launcher>
void muon_assemble_launch(const Launcher& launch, float* d_wide, const float* d_gathered,
                          const muon_matrix& t) {
  if (t.whole() == 0) return;
  launch.template run<detail::muon_assemble_body>(elementwise_config(t.whole(), 1), d_wide,
                                                  d_gathered, t);
}

/// muon_normalise (kernels.hpp) on `launch`.
template <class Launcher>
void muon_normalise_launch(const Launcher& launch, float* d_wide, std::int64_t n,
                           const double* d_ss, double eps) {
  TESSERA_THROW_IF(n < 0, config_error, "muon_normalise (cuda): n=", n, " must be >= 0");
  if (n == 0) return;
  launch.template run<detail::muon_normalise_body>(elementwise_config(n, 1), d_wide, n, d_ss, eps);
}

/// muon_apply (kernels.hpp) on `launch`.
template <class Launcher, class Param>
void muon_apply_launch(const Launcher& launch, Param* d_params, float* d_master,
                       const float* d_wide, const muon_matrix& t, float decay_factor,
                       float adjusted_lr, const float* d_grad_scale) {
  constexpr bool has_master = !std::is_same_v<Param, float>;
  detail::check_optimizer_launch<Param>("muon_apply", 0, d_master);
  if (t.owned() == 0) return;
  launch.template run<detail::muon_apply_body<Param, has_master>>(
      elementwise_config(t.owned(), 1), d_params, d_master, d_wide, t, decay_factor, adjusted_lr,
      d_grad_scale);
}

#if defined(__CUDACC__)

template <class Param, class Grad>
void muon_momentum_step(Param* d_params, float* d_master, float* d_m, float* d_v,
                        const Grad* d_grads, std::int64_t n, const muon_segment* d_segments,
                        int num_segments, const kernels::detail::muon_step_params<float>& step,
                        const float* d_grad_scale, cudaStream_t stream) {
  muon_momentum_step_launch(device_launcher{stream}, d_params, d_master, d_m, d_v, d_grads, n,
                            d_segments, num_segments, step, d_grad_scale);
}

template <class Grad>
void muon_nesterov(float* d_out, const float* d_m, const Grad* d_grads, const muon_matrix& t,
                   const kernels::detail::muon_step_params<float>& step, const float* d_grad_scale,
                   cudaStream_t stream) {
  muon_nesterov_launch(device_launcher{stream}, d_out, d_m, d_grads, t, step, d_grad_scale);
}

template <class T>
void muon_assemble(T* d_wide, const T* d_gathered, const muon_matrix& t, cudaStream_t stream) {
  muon_assemble_launch(device_launcher{stream}, d_wide, d_gathered, t);
}

template <class T>
void muon_normalise(T* d_wide, std::int64_t n, const double* d_ss, double eps,
                    cudaStream_t stream) {
  muon_normalise_launch(device_launcher{stream}, d_wide, n, d_ss, eps);
}

template <class Param>
void muon_apply(Param* d_params, float* d_master, const float* d_wide, const muon_matrix& t,
                float decay_factor, float adjusted_lr, const float* d_grad_scale,
                cudaStream_t stream) {
  muon_apply_launch(device_launcher{stream}, d_params, d_master, d_wide, t, decay_factor,
                    adjusted_lr, d_grad_scale);
}

#endif  // __CUDACC__

}  // namespace tessera::kernels::cuda
