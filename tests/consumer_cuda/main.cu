// A program outside tessera that uses the CUDA backend header-only, as one
// uses CUTLASS, CUB or Thrust: this one .cu includes <tessera/cuda.hpp>, nvcc
// compiles every kernel the trainer instantiates from the headers, and the
// program links tessera::cuda (the CUDA runtime and cuBLASLt), not the
// precompiled tessera::cuda_kernels (CMakeLists.txt beside it). A cuda-preset
// build makes it against the installed package (target
// tessera_cuda_consumer, part of tessera_cuda_compile, which CI builds);
// nothing runs it there.
//
// On a GPU (ctest -L cuda: test_cuda_consumer): trainer<bf16_mixed, cuda>
// and trainer<bf16_mixed, host> take 10 steps in lockstep with the model,
// corpus and settings of tests/cuda/llama.cpp's trainer test, and are held
// to its tolerance: the GPU's loss within 1% of the host's at every step,
// and below 0.8 ln 256 after the tenth (it learns). Without a device it
// says so and exits 77, which ctest reports as skipped.
//
//   build/cuda/cuda/consumer/build/consumer_cuda
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include <tessera/cuda.hpp>

#if !TESSERA_CUDA_HEADER_ONLY_KERNELS
#error \
    "consumer_cuda: the kernels must come from the headers here (no TESSERA_CUDA_PRECOMPILED_KERNELS, no tessera::cuda_kernels)"
#endif

using namespace tessera;

namespace {

// A byte-level corpus of seeded words (tests/cuda/llama.cpp's), removed at exit.
struct corpus_file {
  std::filesystem::path path;
  corpus_file() {
    std::string text;
    const char* words[] = {"the ",  "cat ", "sat ",  "on ", "a ",
                           "mat, ", "and ", "then ", "it ", "ran.\n"};
    std::uint64_t s = 1;
    while (text.size() < 40000) {
      s = mix64(s);
      text += words[s % 10];
    }
    path = std::filesystem::temp_directory_path() /
           ("tessera_consumer_cuda_" + std::to_string(::getpid()) + ".tok");
    data::write_token_file(path, data::byte_tokenizer::encode(text), 256, data::token_dtype::u16);
  }
  ~corpus_file() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

int run() {
  corpus_file corpus;
  data::token_file f(corpus.path);
  // example-begin compose
  // hd 64 (a head size of the flash attention kernels), GQA 4 / 2.
  const nn::llama_config model{"gpu_test", 256, 2, 4, 2, 512, 256, 128, 10000.0, 1e-5};
  train::train_config t;
  t.steps = 10;
  t.global_batch = 4;
  t.micro_batch = 2;  // 2 micro-batches per step
  t.seq = 64;
  t.lr = 3e-3;
  t.warmup = 3;
  t.eval_windows = 4;
  t.ce_chunk = 50;
  t.checkpointing = {nn::activation_checkpointing::full, 1};
  train::trainer<precision::bf16_mixed, tessera::cuda> gpu(model, t, f);
  // example-end compose
  train::trainer<precision::bf16_mixed> host(model, t, f);  // the reference
  bool ok = true;
  double last = 0;
  for (int s = 1; s <= 10; ++s) {
    const train::step_metrics d = gpu.train_step();
    const train::step_metrics h = host.train_step();
    // bf16 roundings in the GPU's kernels and the order of float32 sums:
    // 1% on the loss (tests/cuda/llama.cpp).
    const bool close = std::abs(d.loss - h.loss) <= 1e-2 * h.loss;
    ok &= close;
    std::printf("consumer_cuda: step %2d loss %.5f (host %.5f)%s\n", s, d.loss, h.loss,
                close ? "" : "  MISMATCH");
    last = d.loss;
  }
  const bool learns = last < 0.8 * std::log(256.0);
  std::printf("consumer_cuda: %s (loss %.4f after 10 steps, %s 0.8 ln 256 = %.4f)\n",
              ok && learns ? "ok" : "FAILED", last, learns ? "below" : "NOT below",
              0.8 * std::log(256.0));
  return ok && learns ? 0 : 1;
}

}  // namespace

int main() {
  if (tessera::cuda::device_count() == 0) {
    std::printf(
        "SKIPPED: no CUDA device: consumer_cuda was compiled header-only and linked "
        "without tessera::cuda_kernels, but not run\n");
    return 77;
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer_cuda: %s\n", e.what());
    return 1;
  }
}
