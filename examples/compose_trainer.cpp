// compose_trainer: the README's example. Composes trainers from
// compile-time policies -- precision, backend, optimizer, sharding,
// communicator, layer family and pipeline schedule are template parameters
// of train::trainer, sizes are values -- and trains the `tiny` preset
// widened to the byte vocabulary for 40 steps on the bundled corpus with
// each through train::fit, with an observer of its own, checking that the
// validation loss fell every time:
//
//   1. trainer<bf16_mixed>                    one CPU rank, AdamW, zero<0>
//   2. trainer<fp32, host, optim::sgd>        SGD with momentum instead
//   3. trainer<bf16_mixed, host, optim::adamw, zero<2>, local_communicator>
//                                             two thread ranks under ZeRO-2
//   4. trainer<fp32, host, optim::adamw, zero<0>, local_communicator,
//              nn::dense_layers, parallel::one_f_one_b>
//                                             two pipeline stages, 1F1B fixed
//   5. trainer<bf16_mixed_bf16_grads, cuda>   one GPU (cuda-preset builds,
//                                             when a device is visible)
//
//   build/host/examples/compose_trainer [TEXT]      (default: data/fortunes.txt)

#include <omp.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <tessera/kernels/blas.hpp>
#include <tessera/kernels/peak.hpp>
#include <tessera/tessera.hpp>
#if defined(TESSERA_EXAMPLE_CUDA)
#include <tessera/cuda.hpp>
#endif

using namespace tessera;

namespace {

// The run every composition shares: G = 16 sequences of T = 64 per step.
train::train_config run_config(std::int64_t dp) {
  train::train_config cfg;
  cfg.steps = 40;
  cfg.global_batch = 16;     // G sequences per optimizer step
  cfg.micro_batch = 8 / dp;  // B per forward: 2 micro-batches per rank
  cfg.seq = 64;              // T
  cfg.dp = dp;
  cfg.lr = 3e-3;
  cfg.warmup = 5;
  cfg.eval_every = 20;
  cfg.eval_windows = 64;
  return cfg;
}

// example-begin observer
// An observer of our own: train::fit calls it on world rank 0 after every
// step (with the validation loss on evaluation steps) and at the end.
struct val_curve : train::observer {
  double first = 0, last = 0;
  void on_step(const train::step_metrics& m) override {
    if (m.step % 10 == 0) std::printf("  %s\n", train::format_step(m, 40).c_str());
  }
  void on_end(const train::run_end& e) override { last = e.val_loss.value_or(0); }
};
// example-end observer

// Trains through train::fit; returns whether the validation loss fell.
template <class Trainer>
bool fit_and_check(Trainer& trainer, const std::string& what) {
  val_curve curve;
  curve.first = trainer.evaluate();
  train::run_options run;  // no run folder: no checkpoint, no metrics file
  train::fit(trainer, run, {&curve});
  if (trainer.world_rank() != 0) return true;
  std::printf("compose_trainer: %s: val loss %.4f -> %.4f nats/byte\n", what.c_str(), curve.first,
              curve.last);
  return curve.last < curve.first - 0.5;  // check the result before reporting success
}

}  // namespace

int run(int argc, char** argv) {
  // The bundled corpus (found from any working folder), unless a file is named.
  const std::filesystem::path text_path =
      argc > 1 ? std::filesystem::path(argv[1]) : find_resource("data/fortunes.txt");
  std::ifstream in(text_path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  if (text.empty())
    return std::fprintf(stderr, "compose_trainer: cannot read '%s'\n", text_path.c_str()), 2;
  // A folder of our own in the temporary folder: the token file and its
  // fingerprint cache, removed at the end.
  std::string dir = (std::filesystem::temp_directory_path() / "tessera_compose.XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr)
    return std::fprintf(stderr, "compose_trainer: cannot create a temporary folder\n"), 2;
  struct remove_at_exit {
    std::filesystem::path p;
    ~remove_at_exit() { std::filesystem::remove_all(p); }
  } cleanup{dir};
  const auto tok_path = std::filesystem::path(dir) / "fortunes.tok";
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
    ok &= fit_and_check(trainer, "bf16_mixed, adamw");
  }
  {
    // SGD with momentum instead of AdamW: one template argument.
    cfg.sgd.momentum = 0.9;
    cfg.lr = 0.3;
    train::trainer<precision::fp32, host, optim::sgd> trainer(model, cfg, corpus);
    ok &= fit_and_check(trainer, "fp32, sgd");
  }
  // Two data-parallel ranks (threads) under ZeRO-2: the same global batch,
  // the same loss curve. The layout holds this rank's groups.
  comm::local_world::run(2, [&](comm::local_communicator& dp) {
    train::trainer<precision::bf16_mixed, host, optim::adamw, parallel::zero<2>,
                   comm::local_communicator>
        trainer(model, run_config(2), corpus, parallel::layout{dp});
    const bool fell = fit_and_check(trainer, "bf16_mixed, adamw, zero<2> on 2 thread ranks");
    if (dp.rank() == 0) ok &= fell;
  });
  // Two pipeline stages (threads) under 1F1B, a schedule fixed at compile
  // time (parallel::any_schedule, the default, takes cfg.pipeline instead).
  comm::local_world::run(2, [&](comm::local_communicator& world) {
    auto g = comm::make_groups(world, comm::device_mesh(1, 1, 2));  // dp 1, tp 1, pp 2
    train::train_config piped = run_config(1);
    piped.pp = 2;
    train::trainer<precision::fp32, host, optim::adamw, parallel::zero<0>, comm::local_communicator,
                   nn::dense_layers, parallel::one_f_one_b>
        trainer(model, piped, corpus, parallel::layout{g.dp, nn::dense_layers{}, g.pp});
    const bool fell = fit_and_check(trainer, "fp32, adamw, 2 pipeline stages under 1F1B");
    if (world.rank() == 0) ok &= fell;
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
    ok &= fit_and_check(trainer, "bf16_mixed_bf16_grads on the GPU");
  } else {
    std::printf("compose_trainer: no CUDA device: the GPU composition is compiled, not run\n");
  }
#endif
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  kernels::check_blas_core(argv);
  try {
    kernels::check_openmp_environment();
    return run(argc, argv);
  } catch (const config_error& e) {
    std::fprintf(stderr, "compose_trainer: %s\n", e.what());
    return 2;
  } catch (const io_error& e) {
    std::fprintf(stderr, "compose_trainer: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compose_trainer: %s\n", e.what());
    return 1;
  }
}
