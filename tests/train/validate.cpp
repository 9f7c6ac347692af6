// Tests include/tessera/train/validate.hpp: every refusal names the value
// and the limit, on a layout's degrees alone (comm::device_mesh, before any
// group exists: what a program checks before it starts its ranks), and a
// valid run passes. The trainer runs the same checks (tests/train/trainer.cpp,
// tensor_parallel.cpp, pipeline.cpp hold it to them on real groups).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "tessera/comm/device_mesh.hpp"
#include "tessera/data/tokenizer.hpp"
#include "tessera/train/validate.hpp"

namespace test_train_validate {

using namespace tessera;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
struct corpus {
  fs::path path =
      fs::temp_directory_path() / ("tessera_validate_" + std::to_string(::getpid()) + ".tok");
  explicit corpus(std::size_t bytes) {
    data::write_token_file(path, data::byte_tokenizer::encode(std::string(bytes, 'a')), 256,
                           data::token_dtype::u16);
  }
  ~corpus() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};
nn::llama_config model() {
  auto c = nn::llama_config::tiny();  // H 16, L 2, nh 4, nkv 2, F 24, max_seq 64
  c.vocab = 256;
  return c;
}
train::train_config run(int dp = 1, int tp = 1, int pp = 1) {
  train::train_config t;
  t.steps = 4;
  t.global_batch = 8;
  t.micro_batch = 2;
  t.seq = 16;
  t.warmup = 1;
  t.eval_windows = 4;
  t.dp = dp;
  t.tp = tp;
  t.pp = pp;
  return t;
}
// train::validate under zero<0> and float32.
void check_setup(const nn::llama_config& c, const train::train_config& t,
                 const data::token_file& f, const comm::device_mesh& m) {
  train::validate<parallel::zero<0>, precision::fp32>(c, t, f, m);
}
}  // namespace

TEST_CASE("validate refuses, naming the values, before anything is allocated",
          "[train][validate]") {
  corpus text(20000);
  const data::token_file f(text.path);
  const comm::device_mesh one(1, 1, 1);
  REQUIRE_NOTHROW(check_setup(model(), run(), f, one));
  REQUIRE_NOTHROW(check_setup(model(), run(2, 2, 2), f, comm::device_mesh(2, 2, 2)));
  auto refused = [&](const train::train_config& c, const comm::device_mesh& m,
                     const std::string& why, const nn::llama_config& mc = model()) {
    INFO(why);
    REQUIRE_THROWS_AS(check_setup(mc, c, f, m), config_error);
    REQUIRE_THROWS_WITH(check_setup(mc, c, f, m), Contains(why));
  };
  refused(run(2), one, "dp=2 does not match the communicator's 1 ranks");
  refused(run(1, 2), one, "tp=2 does not match the tensor-parallel group's 1 ranks");
  refused(run(1, 1, 2), one, "pp=2 does not match the pipeline group's 1 ranks");
  refused(run(1, 3), comm::device_mesh(1, 3, 1), "tp=3 must divide the query heads nh=4");
  auto c = run();
  c.global_batch = 1 << 22;
  c.micro_batch = 1;
  refused(c, one, "= 4194304 micro-batches per step and rank exceed the limit of 1048576");
  c = run();
  c.seq = 65;
  refused(c, one, "sequence length T=65 exceeds the model's max_seq=64");
  c = run(1, 1, 2);
  c.virtual_stages = 2;
  refused(c, comm::device_mesh(1, 1, 2), "virtual stages V=2 need the interleaved schedule");
  c = run(1, 1, 4);
  c.global_batch = 8;
  refused(c, comm::device_mesh(1, 1, 4), "more virtual stages (K V = 4 x 1 = 4) than layers (2)");
  // The executor's tags 2v, 2v+1 must stay in comm::pipeline_tags (K V <= 3650).
  c = run(1, 1, 4);
  c.pipeline = parallel::schedule_kind::interleaved;
  c.virtual_stages = 1000;
  refused(c, comm::device_mesh(1, 1, 4), "K=4 stages x V=1000 virtual stages per rank = 4000");
  c = run(1, 1, 2);
  c.stage_blocks = {1, 2};
  refused(c, comm::device_mesh(1, 1, 2), "the listed stage sizes sum to 3 blocks, the model has 2");
  c = run(1, 2);
  c.sequence_parallel = true;
  c.seq = 15;
  refused(c, comm::device_mesh(1, 2, 1), "sequence length T=15 is not divisible by tp=2");
  c = run();
  c.sequence_parallel = true;
  refused(c, one, "needs tp > 1");
  auto wide = model();
  wide.vocab = 100;
  refused(run(), one, "token file vocabulary 256 exceeds the model's vocab=100", wide);
  // zero<3> with a pipeline passes (it gathers per pass under every
  // schedule); a corpus shorter than one window does not.
  REQUIRE_NOTHROW(train::validate<parallel::zero<3>, precision::fp32>(model(), run(1, 1, 2), f,
                                                                     comm::device_mesh(1, 1, 2)));
  corpus tiny(100);
  const data::token_file t(tiny.path);
  REQUIRE_THROWS_WITH(check_setup(model(), run(), t, one),
                      Contains("smaller than one window of T+1"));
}

}  // namespace test_train_validate
