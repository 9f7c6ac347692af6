// compose_trainer: the README's example. Composes a trainer from a precision
// policy (bf16_mixed: bf16 weights and activations, float32 master weights
// and AdamW state) and run-time sizes, trains the `tiny` preset widened to
// the byte vocabulary for 40 steps on the bundled corpus, and checks that the
// validation loss fell.
//
//   build/host/examples/compose_trainer [data/fortunes.txt]

#include <cstdio>
#include <fstream>
#include <iterator>

#include <tessera/tessera.hpp>

#ifndef TESSERA_SOURCE_DIR
#define TESSERA_SOURCE_DIR "."
#endif

using namespace tessera;

int main(int argc, char** argv) {
  kernels::check_blas_core(argv);
  const std::string text_path = argc > 1 ? argv[1] : TESSERA_SOURCE_DIR "/data/fortunes.txt";
  std::ifstream in(text_path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  if (text.empty()) return std::fprintf(stderr, "compose_trainer: cannot read %s\n", text_path.c_str()), 2;
  const auto tok_path = std::filesystem::temp_directory_path() / "tessera_compose.tok";
  data::write_token_file(tok_path, data::byte_tokenizer::encode(text), 256);
  // example-begin compose
  data::token_file corpus(tok_path);             // memory-mapped, validated
  nn::llama_config model = nn::llama_config::tiny();
  model.vocab = 256;                             // byte-level tokens
  train::train_config cfg;
  cfg.steps = 40;
  cfg.global_batch = 16;                         // G sequences per optimizer step
  cfg.micro_batch = 8;                           // B per forward: 2 micro-batches
  cfg.seq = 64;                                  // T
  cfg.lr = 3e-3;
  cfg.warmup = 5;
  cfg.eval_windows = 64;
  train::trainer<precision::bf16_mixed> trainer(model, cfg, corpus);
  trainer.set_peak_flops(kernels::measure_sgemm_flops());  // MFU against this machine's sgemm
  const double before = trainer.evaluate();
  while (trainer.step() < cfg.steps) {
    train::step_metrics m = trainer.train_step();
    if (m.step % 20 == 0) m.val_loss = trainer.evaluate();
    if (m.step % 10 == 0) std::puts(train::format_step(m, cfg.steps).c_str());
  }
  const double after = trainer.evaluate();
  // example-end compose
  std::filesystem::remove(tok_path);
  std::printf("compose_trainer: val loss %.4f -> %.4f nats/byte\n", before, after);
  return after < before - 0.5 ? 0 : 1;  // check the result before reporting success
}
