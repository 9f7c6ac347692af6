// compose_trainer: the README's example. Composes trainers from
// compile-time policies -- precision, backend, optimizer, sharding and
// communicator are template parameters of train::trainer, sizes are values
// -- and trains the `tiny` preset widened to the byte vocabulary for 40
// steps on the bundled corpus with each, checking that the validation loss
// fell every time:
//
//   1. trainer<bf16_mixed>                    one CPU rank, AdamW, zero<0>
//   2. trainer<fp32, host, optim::sgd>        SGD with momentum instead
//   3. trainer<bf16_mixed, host, optim::adamw, zero<2>, local_communicator>
//                                             two thread ranks under ZeRO-2
//   4. trainer<bf16_mixed_bf16_grads, cuda>   one GPU (cuda-preset builds,
//                                             when a device is visible)
//
//   build/host/examples/compose_trainer [data/fortunes.txt]

#include <omp.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include <tessera/kernels/peak.hpp>
#include <tessera/tessera.hpp>
#if defined(TESSERA_EXAMPLE_CUDA)
#include <tessera/cuda.hpp>
#endif

using namespace tessera;

namespace {

// The run every composition shares.
train::train_config run_config(std::int64_t dp) {
  train::train_config cfg;
  cfg.steps = 40;
  cfg.global_batch = 16;     // G sequences per optimizer step
  cfg.micro_batch = 8 / dp;  // B per forward: 2 micro-batches per rank
  cfg.seq = 64;              // T
  cfg.dp = dp;
  cfg.lr = 3e-3;
  cfg.warmup = 5;
  cfg.eval_windows = 64;
  return cfg;
}

// Trains and returns {val loss before, after}; prints every 10th step on rank 0.
template <class Trainer>
std::pair<double, double> fit(Trainer& trainer) {
  const auto& cfg = trainer.config();
  const double before = trainer.evaluate();
  while (trainer.step() < cfg.steps) {
    train::step_metrics m = trainer.train_step();
    if (m.step % 20 == 0) m.val_loss = trainer.evaluate();
    if (m.step % 10 == 0 && trainer.rank() == 0)
      std::puts(train::format_step(m, cfg.steps).c_str());
  }
  return {before, trainer.evaluate()};
}

bool report(const char* what, std::pair<double, double> l) {
  std::printf("compose_trainer: %s: val loss %.4f -> %.4f nats/byte\n", what, l.first, l.second);
  return l.second < l.first - 0.5;  // check the result before reporting success
}

}  // namespace

int run(int argc, char** argv) {
  // The bundled corpus, from the repository root, unless a file is named.
  const std::string text_path = argc > 1 ? argv[1] : "data/fortunes.txt";
  std::ifstream in(text_path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  if (text.empty())
    return std::fprintf(stderr, "compose_trainer: cannot read %s\n", text_path.c_str()), 2;
  const auto tok_path = std::filesystem::temp_directory_path() / "tessera_compose.tok";
  data::write_token_file(tok_path, data::byte_tokenizer::encode(text), 256);
  bool ok = true;
  // example-begin compose
  data::token_file corpus(tok_path);  // memory-mapped, validated
  nn::llama_config model = nn::llama_config::tiny();
  model.vocab = 256;  // byte-level tokens
  train::train_config cfg = run_config(1);
  {
    // One rank: bf16 weights and activations, float32 master weights,
    // gradients and AdamW state (the defaults: host, optim::adamw, zero<0>).
    train::trainer<precision::bf16_mixed> trainer(model, cfg, corpus);
    // MFU against the CPU's theoretical peak, with the measured sgemm rate beside it.
    const auto peak = kernels::host_peak(omp_get_max_threads(), kernels::measure_sgemm_flops());
    trainer.set_peak_flops(peak.flops);
    trainer.set_blas_flops(peak.blas_flops);
    ok &= report("bf16_mixed, adamw", fit(trainer));
  }
  {
    // SGD with momentum instead of AdamW: one template argument.
    cfg.sgd.momentum = 0.9;
    cfg.lr = 0.3;
    train::trainer<precision::fp32, host, optim::sgd> trainer(model, cfg, corpus);
    ok &= report("fp32, sgd", fit(trainer));
  }
  // Two data-parallel ranks (threads) under ZeRO-2: the same global batch,
  // the same loss curve.
  comm::local_world::run(2, [&](comm::local_communicator& c) {
    train::trainer<precision::bf16_mixed, host, optim::adamw, parallel::zero<2>,
                   comm::local_communicator>
        trainer(model, run_config(2), corpus, parallel::layout{c});
    const auto l = fit(trainer);
    if (c.rank() == 0) ok &= report("bf16_mixed, adamw, zero<2> on 2 thread ranks", l);
  });
  // example-end compose
#if defined(TESSERA_EXAMPLE_CUDA)
  if (tessera::cuda::device_count() > 0) {
    // The same trainer on one GPU: the backend is a template argument too.
    // The flash attention kernels take head dims 32, 64 and 128: tiny's
    // width with 2 heads of 32.
    nn::llama_config gpu_model = model;
    gpu_model.name = "tiny_hd32";
    gpu_model.dim = 64;
    gpu_model.n_heads = 2;
    gpu_model.n_kv_heads = 1;
    gpu_model.ffn_dim = 96;
    train::trainer<precision::bf16_mixed_bf16_grads, tessera::cuda> trainer(gpu_model,
                                                                            run_config(1), corpus);
    ok &= report("bf16_mixed_bf16_grads on the GPU", fit(trainer));
  } else {
    std::printf("compose_trainer: no CUDA device: the GPU composition is compiled, not run\n");
  }
#endif
  std::filesystem::remove(tok_path);
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  kernels::check_blas_core(argv);
  try {
    return run(argc, argv);
  } catch (const config_error& e) {
    std::fprintf(stderr, "compose_trainer: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compose_trainer: %s\n", e.what());
    return 1;
  }
}
