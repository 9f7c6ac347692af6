// Tests include/tessera/train/checkpoint.hpp: a rank's chunks saved and
// restored through train::save_checkpoint / load_checkpoint continue bit for
// bit; the shard files of a tp and pp layout are named by position; a
// strategy that shards the optimizer state is refused before any work; a
// file of other settings is refused naming the field, a model of another
// RoPE scaling among them.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "tessera/train/checkpoint.hpp"
#include "trainer_suite.hpp"

namespace test_train_checkpoint {

using namespace tessera;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

TEST_CASE("the chunks of a rank save and load, and the run continues bit for bit",
          "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("chunks_ckpt", 0)};
  const data::token_file f(corpus.path);
  const fs::path ck =
      fs::temp_directory_path() / ("tessera_chunks_" + std::to_string(::getpid()) + ".bin");
  train::trainer<precision::fp64> a(trainer_suite::model(), trainer_suite::config(1), f);
  a.train_step();
  train::save_checkpoint<parallel::zero<0>>(a.all_chunks(), a.layout(), ck, a.metadata(), a.step());
  train::trainer<precision::fp64> b(trainer_suite::model(), trainer_suite::config(1), f);
  const std::int64_t step =
      train::load_checkpoint<parallel::zero<0>>(b.all_chunks(), b.layout(), ck, b.metadata(), 4);
  CHECK(step == 1);
  const std::int64_t n = a.model().flat_size();
  CHECK(std::equal(a.model().params(), a.model().params() + n, b.model().params()));
  CHECK(b.optimizer().steps_taken() == 1);
  // Restarted at the checkpoint's step (what trainer::load_checkpoint does).
  b.load_checkpoint(ck);
  for (int s = 0; s < 2; ++s) {
    const auto x = a.train_step(), y = b.train_step();
    CHECK(x.loss == y.loss);
    CHECK(x.grad_norm == y.grad_norm);
  }
  // Another run's settings: refused, the field named.
  auto other = trainer_suite::config(1);
  other.seed = 7;
  train::trainer<precision::fp64> c(trainer_suite::model(), other, f);
  REQUIRE_THROWS_WITH(
      train::load_checkpoint<parallel::zero<0>>(c.all_chunks(), c.layout(), ck, c.metadata(), 4),
      Contains("seed=1337 in the checkpoint, 7 in this run"));
  // A strategy that shards the optimizer state: refused before any work.
  REQUIRE_THROWS_WITH(
      train::save_checkpoint<parallel::zero<1>>(a.all_chunks(), a.layout(), ck, a.metadata(), 1),
      Contains("cannot hold") && Contains("checkpoint folder"));
  std::error_code ec;
  fs::remove(ck, ec);
}

TEST_CASE("a checkpoint of another RoPE scaling is refused; its metadata reads back",
          "[train][checkpoint][rope]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("rope_ckpt", 0)};
  const data::token_file f(corpus.path);
  const fs::path ck =
      fs::temp_directory_path() / ("tessera_rope_" + std::to_string(::getpid()) + ".bin");
  nn::llama_config scaled = trainer_suite::model();
  scaled.rope_scaling = nn::llama3_rope_scaling{8.0, 1.0, 4.0, 8};
  // The metadata carries the scaling and reads back; an unscaled model's
  // has no key for it (what tessera wrote before scaling existed).
  CHECK(train::model_metadata(scaled)["rope_scaling"]["factor"] == 8.0);
  CHECK(train::model_config_from_metadata(train::model_metadata(scaled), "m").rope_scaling ==
        scaled.rope_scaling);
  CHECK(!train::model_metadata(trainer_suite::model()).contains("rope_scaling"));
  CHECK(!train::model_config_from_metadata(train::model_metadata(trainer_suite::model()), "m")
             .rope_scaling);

  train::trainer<precision::fp64> a(scaled, trainer_suite::config(1), f);
  a.train_step();
  train::save_checkpoint<parallel::zero<0>>(a.all_chunks(), a.layout(), ck, a.metadata(), a.step());
  train::trainer<precision::fp64> b(scaled, trainer_suite::config(1), f);
  CHECK(train::load_checkpoint<parallel::zero<0>>(b.all_chunks(), b.layout(), ck, b.metadata(),
                                                  4) == 1);
  for (const auto& other : {std::optional<nn::llama3_rope_scaling>{},
                            std::optional{nn::llama3_rope_scaling{32.0, 1.0, 4.0, 8}}}) {
    nn::llama_config m = scaled;
    m.rope_scaling = other;
    train::trainer<precision::fp64> c(m, trainer_suite::config(1), f);
    REQUIRE_THROWS_WITH(
        train::load_checkpoint<parallel::zero<0>>(c.all_chunks(), c.layout(), ck, c.metadata(), 4),
        Contains("model={") && Contains("\"rope_scaling\":{\"factor\":8.0,"));
  }
  std::error_code ec;
  fs::remove(ck, ec);
}

TEST_CASE("shard files are named by their tp rank and stage", "[train][checkpoint]") {
  using train::detail::shard_path;
  CHECK(shard_path("run/checkpoint.bin", 0, 1, 0) == fs::path("run/checkpoint.bin"));
  CHECK(shard_path("run/checkpoint.bin", 0, 2, 1) == fs::path("run/checkpoint.bin.tp1"));
  CHECK(shard_path("run/checkpoint.bin", 2, 2, 0) == fs::path("run/checkpoint.bin.pp2"));
  CHECK(shard_path("run/checkpoint.bin", 3, 4, 2) == fs::path("run/checkpoint.bin.pp3.tp2"));
}

}  // namespace test_train_checkpoint
