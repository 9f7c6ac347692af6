#pragma once
/// \file optim/cuda_adamw.hpp
/// AdamW with global-norm clipping over a flat buffer on one GPU: float32
/// master weights and moments, bf16 weights written in the same pass
/// (kernels::cuda::adamw_step), the global gradient norm in float64 with a
/// deterministic device reduction (kernels::cuda::grad_sum_squares) and the
/// clip coefficient computed on the device, so a step needs no host
/// synchronisation. The same hyper-parameters, bias corrections and decay
/// rules as optim::adamw (the host optimizer).
///
/// Plain C++ (g++ with the CUDA runtime headers); link tessera::cuda_kernels.
/// Source: Loshchilov & Hutter, ICLR 2019, Algorithm 2; Pascanu et al. 2013
/// (clipping by the global norm).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tessera/core/cuda.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/nvtx.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/cuda/kernels.hpp"
#include "tessera/kernels/cuda/launch.hpp"
#include "tessera/nn/param_layout.hpp"
#include "tessera/optim/adamw.hpp"

namespace tessera::optim {

// plan::plan_cuda_step counts 24 bytes per segment (it cannot include the
// CUDA headers); keep the two in step.
static_assert(sizeof(kernels::cuda::adamw_segment) == 24);

/// AdamW over the whole flat buffer of a param_layout (bf16 parameters,
/// float32 gradients), on one stream.
class cuda_adamw {
 public:
  /// Allocates master weights, both moments (zero), the segment table (one
  /// segment per tensor of `layout`, decay as param_entry::decay) and the
  /// norm scratch from `mr` on `stream` (neither owned; both must outlive
  /// the optimizer). Throws config_error for bad hyper-parameters;
  /// tessera::error if the device runs out of memory.
  cuda_adamw(adamw_config cfg, const nn::param_layout& layout, cudaStream_t stream,
             cuda_caching_resource& mr)
      : cfg_(cfg), n_(layout.total()), stream_(stream), mr_(mr, stream) {
    cfg_.validate();
    master_ = tensor<float, tessera::cuda>(shape{n_}, mr_);
    m_ = tensor<float, tessera::cuda>(shape{n_}, mr_);
    v_ = tensor<float, tessera::cuda>(shape{n_}, mr_);
    TESSERA_CUDA_CHECK(cudaMemsetAsync(m_.data(), 0, m_.bytes(), stream_));
    TESSERA_CUDA_CHECK(cudaMemsetAsync(v_.data(), 0, v_.bytes(), stream_));
    std::vector<kernels::cuda::adamw_segment> segs;
    for (const auto& e : layout.entries())
      segs.push_back({e.offset, e.offset + e.numel, e.decay ? 1 : 0});
    num_segments_ = static_cast<int>(segs.size());
    const auto seg_bytes = static_cast<std::int64_t>(segs.size() * sizeof(segs[0]));
    segments_ = tensor<std::uint8_t, tessera::cuda>(shape{seg_bytes}, mr_);
    tessera::cuda::copy_from_host(segments_.data(), segs.data(), static_cast<std::size_t>(seg_bytes),
                                  stream_);
    norm_scratch_bytes_ = kernels::cuda::grad_sum_squares_scratch_bytes(n_);
    norm_scratch_ = tensor<std::uint8_t, tessera::cuda>(
        shape{static_cast<std::int64_t>(norm_scratch_bytes_)}, mr_);
    sum_squares_ = tensor<double, tessera::cuda>(shape{1}, mr_);
    coef_ = tensor<float, tessera::cuda>(shape{1}, mr_);
  }

  /// Waits for the stream (see cuda_llama's destructor).
  ~cuda_adamw() { (void)cudaStreamSynchronize(stream_); }
  // Not copyable or movable: the tensors deallocate through mr_.
  cuda_adamw(const cuda_adamw&) = delete;
  cuda_adamw& operator=(const cuda_adamw&) = delete;

  /// master = float(params) (call once after the weights are set). Enqueued.
  void init_master(const bf16* d_params) {
    kernels::cuda::cast<float, bf16>(master_.data(), d_params, n_, stream_);
  }

  /// One step, enqueued on the stream: sum of squares of `d_grads` (float64,
  /// into sum_squares()), the clip coefficient min(1, max_norm / (norm +
  /// 1e-6)) on the device (1 when max_norm <= 0), and the AdamW update of
  /// master, moments and `d_params` at learning rate `lr` with the gradients
  /// scaled by the coefficient. When the norm is not finite the kernel
  /// writes nothing; the caller, which reads the norm at the end of the
  /// step, then calls skipped() so the bias corrections stay those of the
  /// steps taken (as the host trainer never calls optim::adamw::step).
  void step(bf16* d_params, const float* d_grads, double lr, double max_norm) {
    TESSERA_NVTX_RANGE("optimizer: grad norm + clip + adamw");
    kernels::cuda::grad_sum_squares<float>(sum_squares_.data(), d_grads, n_, norm_scratch_.data(),
                                           norm_scratch_bytes_, stream_);
    kernels::cuda::clip_coefficient<float>(coef_.data(), sum_squares_.data(), max_norm, stream_);
    ++t_;
    const kernels::detail::adamw_step_params<float> s{
        static_cast<float>(lr),
        static_cast<float>(cfg_.beta1),
        static_cast<float>(cfg_.beta2),
        static_cast<float>(cfg_.eps),
        static_cast<float>(cfg_.weight_decay),
        static_cast<float>(1.0 - std::pow(cfg_.beta1, static_cast<double>(t_))),
        static_cast<float>(1.0 - std::pow(cfg_.beta2, static_cast<double>(t_))),
        1.0f};
    kernels::cuda::adamw_step<bf16, float>(
        d_params, master_.data(), m_.data(), v_.data(), d_grads, n_,
        reinterpret_cast<const kernels::cuda::adamw_segment*>(segments_.data()), num_segments_, s,
        coef_.data(), stream_);
  }

  /// Undoes the step count of a step whose kernel skipped (non-finite norm).
  void skipped() {
    TESSERA_THROW_IF(t_ == 0, error, "cuda_adamw::skipped: no step was taken");
    --t_;
  }

  /// Bytes save() writes: the step count (int64) and m, v, master (float32
  /// each), the same bytes in the same order as the host
  /// optim::adamw<bf16, float>::save, so checkpoints move between backends.
  std::size_t serialized_bytes() const {
    return sizeof(std::int64_t) + 3 * static_cast<std::size_t>(n_) * sizeof(float);
  }

  /// Writes serialized_bytes() bytes through `w.write(const void*, bytes)`,
  /// staging the device buffers through host memory in blocks of
  /// `block_bytes`. Synchronises the stream.
  template <class Writer>
  void save(Writer& w, std::size_t block_bytes = std::size_t(64) << 20) const {
    w.write(&t_, sizeof(t_));
    std::vector<char> buf(std::min(block_bytes, static_cast<std::size_t>(n_) * sizeof(float)));
    for (const float* d : {m_.data(), v_.data(), master_.data()}) {
      const std::size_t total = static_cast<std::size_t>(n_) * sizeof(float);
      for (std::size_t off = 0; off < total; off += buf.size()) {
        const std::size_t len = std::min(buf.size(), total - off);
        tessera::cuda::copy_to_host(buf.data(), reinterpret_cast<const char*>(d) + off, len,
                                    stream_);
        w.write(buf.data(), len);
      }
    }
  }

  /// Restores what save() wrote from `p` (serialized_bytes() bytes; the
  /// caller checks the size). Synchronises the stream.
  void load(const char* p) {
    std::memcpy(&t_, p, sizeof(t_));
    p += sizeof(t_);
    const std::size_t bytes = static_cast<std::size_t>(n_) * sizeof(float);
    for (float* d : {m_.data(), v_.data(), master_.data()}) {
      tessera::cuda::copy_from_host(d, p, bytes, stream_);
      p += bytes;
    }
  }

  /// The last step's gradient sum of squares (one double, device).
  const double* sum_squares() const { return sum_squares_.data(); }
  std::int64_t steps_taken() const { return t_; }
  std::int64_t size() const { return n_; }
  const adamw_config& config() const { return cfg_; }
  const float* master() const { return master_.data(); }
  const float* exp_avg() const { return m_.data(); }
  const float* exp_avg_sq() const { return v_.data(); }

 private:
  adamw_config cfg_;
  std::int64_t n_;
  cudaStream_t stream_;
  stream_bound_resource mr_;  // before every tensor: they deallocate through it
  std::int64_t t_ = 0;
  int num_segments_ = 0;
  tensor<float, tessera::cuda> master_, m_, v_;
  tensor<std::uint8_t, tessera::cuda> segments_, norm_scratch_;
  std::size_t norm_scratch_bytes_ = 0;
  tensor<double, tessera::cuda> sum_squares_;
  tensor<float, tessera::cuda> coef_;
};

}  // namespace tessera::optim
