#pragma once
/// \file train/cuda_trainer.hpp
/// Single-GPU training loop: the same data order, learning-rate schedule,
/// loss normalisation, clipping and AdamW as train::trainer (the host
/// loop), on nn::cuda_llama + optim::cuda_adamw, fed by the pinned
/// double-buffered data::device_loader.
///
/// One step, all enqueued on one compute stream with no host
/// synchronisation until its end: zero_grad -> for each micro-batch
/// (next() from the loader, whose copy of the following micro-batch
/// overlaps this one's compute) forward_backward -> gradient norm, clip
/// coefficient and AdamW on the device -> one copy of the losses and the
/// norm to pinned memory, one stream synchronize, the metrics.
///
/// Plain C++ (g++ with the CUDA runtime headers); link tessera::cuda_kernels.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "tessera/core/cuda.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/nvtx.hpp"
#include "tessera/data/device_loader.hpp"
#include "tessera/data/sampler.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/nn/cuda_llama.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/optim/clip.hpp"
#include "tessera/optim/cuda_adamw.hpp"
#include "tessera/train/checkpoint.hpp"
#include "tessera/train/metrics.hpp"
#include "tessera/train/trainer.hpp"

namespace tessera::train {

/// The single-GPU trainer. Not thread-safe; one per GPU.
class cuda_trainer {
 public:
  /// Builds the model (weights from cfg.seed, the host trainer's values),
  /// the optimizer, the samplers and the loader on a new stream of the
  /// current device, and prefetches the first micro-batch. `data` is not
  /// owned and must outlive the trainer. Throws config_error for an
  /// invalid config (as train::trainer, plus dp != 1) or a corpus smaller
  /// than one window; tessera::error if the device runs out of memory.
  cuda_trainer(nn::llama_config model_cfg, train_config cfg, const data::token_file& data,
               nn::activation_checkpointing ckpt = nn::activation_checkpointing::full)
      : cfg_(checked(cfg)),
        model_(validated(model_cfg, cfg_, data), cfg_.micro_batch, cfg_.seq,
               nn::cuda_llama_options{cfg_.ce_chunk, -100, ckpt}, stream_.get()),
        opt_(cfg_.adamw, model_.layout(), stream_.get(),
             tessera::cuda::resource(tessera::cuda::current_device())),
        data_(&data),
        split_(data.split()),
        sampler_(data, split_.train, cfg_.micro_batch, cfg_.seq, cfg_.seed),
        loader_(data::cuda_loader_system(stream_.get()), sampler_, model_.config().vocab,
                cfg_.accum_steps()),
        sched_(cfg_.schedule()),
        losses_mr_(tessera::cuda::resource(tessera::cuda::current_device()), stream_.get()),
        losses_(shape{cfg_.accum_steps()}, losses_mr_),
        host_(static_cast<std::size_t>(cfg_.accum_steps() + 1)),
        windows_(static_cast<std::size_t>(cfg_.micro_batch * (cfg_.seq + 1))) {
    model_.init_weights(cfg_.seed);
    opt_.init_master(model_.params());
    loader_.prefetch(0, 0);
  }

  nn::cuda_llama& model() { return model_; }
  optim::cuda_adamw& optimizer() { return opt_; }
  const train_config& config() const { return cfg_; }
  cudaStream_t stream() const { return stream_.get(); }
  /// Optimizer steps taken so far.
  std::int64_t step() const { return step_; }
  /// Peak FLOP/s used for MFU (e.g. 989e12 for an H100/H200's dense bf16).
  void set_peak_flops(double f) { peak_flops_ = f; }

  /// One optimizer step over A = G / B micro-batches; the metrics of
  /// train::trainer::train_step (seconds is wall time including the final
  /// synchronize; mem_* are the device allocator's bytes). A non-finite
  /// gradient norm skips the update (metrics.skipped), as on the host.
  step_metrics train_step() {
    TESSERA_NVTX_RANGE("train step");
    const auto t0 = std::chrono::steady_clock::now();
    auto& mr = tessera::cuda::resource(tessera::cuda::current_device());
    mr.reset_peak();
    const std::int64_t A = cfg_.accum_steps(), B = cfg_.micro_batch, T = cfg_.seq;
    step_metrics m;
    m.lr = sched_(step_);
    // The loss is normalised by the scored tokens of the whole step, which
    // must be known before the first backward: count them on the host from
    // the sampler (the loader checks and copies the same windows).
    std::int64_t scored = 0;
    for (std::int64_t a = 0; a < A; ++a) {
      sampler_.fill(static_cast<std::uint64_t>(step_), static_cast<std::uint64_t>(a),
                    windows_.data());
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 1; t <= T; ++t) scored += windows_[static_cast<std::size_t>(b * (T + 1) + t)] != -100;
    }
    TESSERA_THROW_IF(scored == 0, config_error, "step ", step_,
                     " has no scored tokens (every target is ignore_index)");
    const float scale = static_cast<float>(1.0 / static_cast<double>(scored));
    model_.zero_grad();
    for (std::int64_t a = 0; a < A; ++a) {
      const data::device_batch b = loader_.next();
      TESSERA_EXPECTS(b.step == static_cast<std::uint64_t>(step_) &&
                          b.micro_batch == static_cast<std::uint64_t>(a),
                      "loader out of order");
      model_.forward_backward(b.d_inputs, b.d_targets, losses_.data() + a, scale);
    }
    opt_.step(model_.params(), model_.grads(), m.lr, cfg_.grad_clip);
    // host_ is pageable: each copy returns once its data is on the host.
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(host_.data(), losses_.data(),
                                       static_cast<std::size_t>(A) * sizeof(double),
                                       cudaMemcpyDeviceToHost, stream_.get()));
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(host_.data() + A, opt_.sum_squares(), sizeof(double),
                                       cudaMemcpyDeviceToHost, stream_.get()));
    stream_.synchronize();
    double loss_sum = 0;
    for (std::int64_t a = 0; a < A; ++a) loss_sum += host_[static_cast<std::size_t>(a)];
    m.loss = loss_sum / static_cast<double>(scored);
    m.grad_norm = std::sqrt(host_[static_cast<std::size_t>(A)]);
    m.clip = optim::clip_coefficient(m.grad_norm, cfg_.grad_clip);
    if (!std::isfinite(m.clip)) {
      m.skipped = true;  // the AdamW kernel wrote nothing
      opt_.skipped();
    }
    ++step_;
    m.step = step_;
    m.tokens = A * B * T;
    m.scored = scored;
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m.tokens_per_s = static_cast<double>(m.tokens) / m.seconds;
    m.flops = flops_per_token(model_.config(), T) * static_cast<double>(m.tokens);
    m.mfu = peak_flops_ > 0 ? m.flops / m.seconds / peak_flops_ : 0.0;
    const auto st = mr.stats();
    m.mem_allocated = st.allocated;
    m.mem_peak = st.peak_allocated;
    return m;
  }

  /// Mean loss (nats per token) over the first `windows` fixed validation
  /// windows (-1: the configured eval_windows; 0: every window of the
  /// split), as train::trainer::evaluate. Rows past a partial last batch are
  /// padding (ignored inputs and targets). Allocates two (B, T) token
  /// buffers and a double for its duration; synchronises once per batch.
  double evaluate(std::int64_t windows = -1) {
    TESSERA_NVTX_RANGE("evaluate");
    const std::int64_t B = cfg_.micro_batch, T = cfg_.seq, N = B * T;
    const data::val_windows val(*data_, split_.val, T,
                                windows < 0 ? cfg_.eval_windows : windows);
    std::vector<std::int32_t> buf(static_cast<std::size_t>(B * (T + 1)));
    std::vector<std::int32_t> host(static_cast<std::size_t>(2 * N));
    tensor<std::int32_t, tessera::cuda> tokens(shape{2 * N}, losses_mr_);
    tensor<double, tessera::cuda> loss(shape{1}, losses_mr_);
    double sum = 0;
    std::int64_t n = 0;
    for (std::int64_t k = 0; k < val.batches(B); ++k) {
      const std::int64_t rows = val.fill(k, B, buf.data());
      std::int64_t scored = 0;
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < T; ++t) {
          const std::size_t i = static_cast<std::size_t>(b * T + t);
          const bool pad = b >= rows;
          host[i] = pad ? -100 : buf[static_cast<std::size_t>(b * (T + 1) + t)];
          host[i + static_cast<std::size_t>(N)] =
              pad ? -100 : buf[static_cast<std::size_t>(b * (T + 1) + t + 1)];
          scored += host[i + static_cast<std::size_t>(N)] != -100;
        }
      tessera::cuda::copy_from_host(tokens.data(), host.data(), host.size() * sizeof(std::int32_t),
                                    stream_.get());
      model_.forward_loss(tokens.data(), tokens.data() + N, loss.data());
      double l = 0;
      tessera::cuda::copy_to_host(&l, loss.data(), sizeof(double), stream_.get());
      sum += l;
      n += scored;
    }
    return n ? sum / static_cast<double>(n) : std::nan("");
  }

  /// Samples `n` tokens after `prompt` at `temperature`, deterministic in
  /// `seed`, as train::trainer<bf16_mixed>::generate: the weights are copied
  /// into a host nn::llama<bf16_mixed> (host memory: 6 bytes a parameter)
  /// and sampled there, token by token. Throws as the host generate.
  std::vector<std::int32_t> generate(std::vector<std::int32_t> prompt, std::int64_t n,
                                     double temperature, std::uint64_t seed) {
    TESSERA_THROW_IF(prompt.empty(), config_error, "generation needs a non-empty prompt");
    nn::llama<precision::bf16_mixed> host(model_.config(), nn::llama_options{cfg_.ce_chunk, {}, -100});
    model_.copy_params_to_host(host.params());
    return generate_tokens(std::move(prompt), n, temperature, seed, model_.config().vocab,
                           std::min(model_.config().max_seq, cfg_.seq),
                           [&](const std::int32_t* ids, std::int64_t len, float* logits) {
                             host.next_token_logits(ids, len, logits);
                           });
  }

  /// The checkpoint's metadata: the host trainer<bf16_mixed>'s keys and
  /// values, so a checkpoint written here resumes on the host and back.
  nlohmann::json metadata() const {
    return run_metadata(model_.config(), cfg_, precision::bf16_mixed::name,
                        optim::adamw<bf16, float>::name, step_,
                        model_.layout().total(), *data_);
  }

  /// Writes weights, optimizer state, step, schedule and data position in
  /// the host trainer<bf16_mixed>'s format (train/checkpoint.hpp: streamed
  /// to a temporary file through 64 MiB host blocks, fsync'ed, renamed).
  /// Throws io_error if the file cannot be written.
  void save_checkpoint(const std::filesystem::path& path) const {
    const std::size_t pbytes = sizeof(bf16) * static_cast<std::size_t>(model_.layout().total());
    write_checkpoint(path, metadata(), pbytes + opt_.serialized_bytes(), [&](checkpoint_writer& w) {
      std::vector<char> buf(std::min<std::size_t>(pbytes, std::size_t(64) << 20));
      const char* d = reinterpret_cast<const char*>(model_.params());
      for (std::size_t off = 0; off < pbytes; off += buf.size()) {
        const std::size_t len = std::min(buf.size(), pbytes - off);
        tessera::cuda::copy_to_host(buf.data(), d + off, len, stream_.get());
        w.write(buf.data(), len);
      }
      opt_.save(w);
    });
  }

  /// Restores what save_checkpoint (or the host trainer<bf16_mixed>) wrote,
  /// verified whole before any state changes (host memory: the file's
  /// size), and prefetches the resumed step's first micro-batch. Throws as
  /// train::trainer::load_checkpoint.
  void load_checkpoint(const std::filesystem::path& path) {
    nlohmann::json meta;
    std::vector<char> payload;
    read_checkpoint(path, meta, payload);
    const std::int64_t step = check_resume_metadata(path, meta, metadata(), cfg_.steps);
    const std::size_t pbytes = sizeof(bf16) * static_cast<std::size_t>(model_.layout().total());
    TESSERA_THROW_IF(payload.size() != pbytes + opt_.serialized_bytes(), io_error, "checkpoint '",
                     path.string(), "' holds ", payload.size(), " payload bytes; this model needs ",
                     pbytes + opt_.serialized_bytes());
    model_.load_params(reinterpret_cast<const bf16*>(payload.data()));
    opt_.load(payload.data() + pbytes);
    step_ = step;
    loader_.prefetch(static_cast<std::uint64_t>(step_), 0);
  }

 private:
  static train_config checked(train_config c) {
    c.validate();
    return c;
  }
  static nn::llama_config validated(nn::llama_config c, const train_config& cfg,
                                    const data::token_file& d) {
    check_single_rank(c, cfg, d);
    return c;
  }

  train_config cfg_;
  tessera::cuda::stream stream_;
  nn::cuda_llama model_;
  optim::cuda_adamw opt_;
  const data::token_file* data_;
  data::split_view split_;
  data::batch_sampler sampler_;
  data::device_loader loader_;
  optim::warmup_cosine sched_;
  stream_bound_resource losses_mr_;  // the loss buffer's view, on the compute stream
  tensor<double, tessera::cuda> losses_;
  std::vector<double> host_;
  std::vector<std::int32_t> windows_;
  std::int64_t step_ = 0;
  double peak_flops_ = 0;
};

}  // namespace tessera::train
