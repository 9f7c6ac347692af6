// Tests include/tessera/train/trainer.hpp: bit-for-bit replay, exact resume
// from a checkpoint, accumulation invariance, and config errors.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/data/tokenizer.hpp"
#include "tessera/train/trainer.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

fs::path make_corpus(const std::string& name, std::size_t bytes = 20000) {
  std::string text;
  const char* words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat, ", "and ", "then ", "it ", "ran.\n"};
  std::uint64_t s = 1;
  while (text.size() < bytes) {
    s = mix64(s);
    text += words[s % 10];
  }
  auto p = fs::temp_directory_path() /
           ("tessera_test_" + name + "_" + std::to_string(::getpid()) + ".tok");
  data::write_token_file(p, data::byte_tokenizer::encode(text), 256, data::token_dtype::u16);
  return p;
}

// Removes the file when the test case ends, pass or fail.
struct temp_file {
  fs::path path;
  ~temp_file() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

nn::llama_config model() {
  auto c = nn::llama_config::tiny();
  c.vocab = 256;
  return c;
}

train::train_config tcfg() {
  train::train_config t;
  t.steps = 6;
  t.global_batch = 4;
  t.micro_batch = 2;
  t.seq = 16;
  t.lr = 3e-3;
  t.warmup = 2;
  t.eval_windows = 8;
  return t;
}

}  // namespace

TEST_CASE("two runs with the same seed replay bit for bit", "[train][determinism]") {
  temp_file corpus{make_corpus("replay")};
  const fs::path& path = corpus.path;
  data::token_file f(path);
  train::trainer<precision::fp32> a(model(), tcfg(), f), b(model(), tcfg(), f);
  for (int s = 0; s < 4; ++s) {
    auto ma = a.train_step(), mb = b.train_step();
    CHECK(ma.loss == mb.loss);
    CHECK(ma.grad_norm == mb.grad_norm);
    CHECK(ma.lr == mb.lr);
  }
  CHECK(a.evaluate() == b.evaluate());
}

TEST_CASE("a run resumed from a checkpoint continues exactly", "[train][checkpoint]") {
  temp_file corpus{make_corpus("resume")};
  const fs::path& path = corpus.path;
  data::token_file f(path);
  auto ck = fs::temp_directory_path() / ("tessera_test_resume_" + std::to_string(::getpid()) + ".ckpt");
  std::vector<double> full;
  {
    train::trainer<precision::bf16_mixed> t(model(), tcfg(), f);
    for (int s = 0; s < 6; ++s) {
      full.push_back(t.train_step().loss);
      if (s == 2) t.save_checkpoint(ck);
    }
  }
  train::trainer<precision::bf16_mixed> r(model(), tcfg(), f);
  r.load_checkpoint(ck);
  CHECK(r.step() == 3);
  for (int s = 3; s < 6; ++s) CHECK(r.train_step().loss == full[static_cast<std::size_t>(s)]);
  // A foreign or truncated checkpoint is refused with the reason.
  {
    std::ofstream(ck, std::ios::binary | std::ios::trunc) << "not a checkpoint at all";
  }
  CHECK_THROWS_WITH(r.load_checkpoint(ck), Catch::Contains("not a tessera checkpoint"));
  // A checkpoint of another configuration is refused naming the field.
  {
    train::trainer<precision::bf16_mixed> t(model(), tcfg(), f);
    t.save_checkpoint(ck);
    auto other = tcfg();
    other.global_batch = 8;
    train::trainer<precision::bf16_mixed> u(model(), other, f);
    CHECK_THROWS_WITH(u.load_checkpoint(ck), Catch::Contains("global_batch"));
  }
  fs::remove(ck);
}

TEST_CASE("the loss curve does not depend on the micro-batch size (float64)", "[train][accumulation]") {
  temp_file corpus{make_corpus("accum")};
  const fs::path& path = corpus.path;
  data::token_file f(path);
  auto c1 = tcfg(), c2 = tcfg();
  c1.micro_batch = 4;  // one micro-batch per step
  c2.micro_batch = 1;  // four micro-batches per step
  train::trainer<precision::fp64> a(model(), c1, f), b(model(), c2, f);
  for (int s = 0; s < 4; ++s) {
    auto ma = a.train_step(), mb = b.train_step();
    CHECK(ma.loss == Approx(mb.loss).epsilon(1e-12));
    CHECK(ma.grad_norm == Approx(mb.grad_norm).epsilon(1e-10));
  }
}

TEST_CASE("trainer rejects inconsistent settings naming the numbers", "[train][errors]") {
  temp_file corpus{make_corpus("errors", 2000)};
  const fs::path& path = corpus.path;
  data::token_file f(path);
  auto c = tcfg();
  c.global_batch = 6;
  c.micro_batch = 4;
  CHECK_THROWS_WITH((train::trainer<precision::fp32>(model(), c, f)),
                    Catch::Contains("G=6 is not divisible by micro-batch B=4"));
  c = tcfg();
  c.micro_batch = 0;
  CHECK_THROWS_WITH((train::trainer<precision::fp32>(model(), c, f)), Catch::Contains("B=0"));
  c = tcfg();
  c.seq = 5000;
  CHECK_THROWS_AS((train::trainer<precision::fp32>(model(), c, f)), config_error);
}
