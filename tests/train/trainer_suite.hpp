#pragma once
// Multi-rank bodies for train::trainer over a communicator, written once and run
// under local_communicator (tests/train/data_parallel.cpp) and
// mpi_communicator (tests/mpi/zero.cpp). Bodies throw zero_suite::suite_failure.
//
// The global batch G = 12 sequences per step is the same for every dp, so
// dp x A = 12 / B: the loss curve, the parameters and the evaluation must
// match train::trainer on one rank (float64 1e-12).

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <tessera/data/tokenizer.hpp>
#include <tessera/train/trainer.hpp>

#include "../parallel/zero_suite.hpp"

namespace trainer_suite {

using namespace tessera;
namespace fs = std::filesystem;
using zero_suite::check;

/// A byte-tokenized corpus of repeated words at a per-process, per-rank path.
inline fs::path make_corpus(const std::string& name, int rank) {
  std::string text;
  const char* words[] = {"the ",  "cat ", "sat ",  "on ", "a ",
                         "mat, ", "and ", "then ", "it ", "ran.\n"};
  std::uint64_t s = 1;
  while (text.size() < 20000) {
    s = mix64(s);
    text += words[s % 10];
  }
  auto p = fs::temp_directory_path() / ("tessera_dp_" + name + "_" + std::to_string(::getpid()) +
                                        "_" + std::to_string(rank) + ".tok");
  data::write_token_file(p, data::byte_tokenizer::encode(text), 256, data::token_dtype::u16);
  return p;
}
struct temp_file {
  fs::path path;
  ~temp_file() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

inline nn::llama_config model() {
  auto c = nn::llama_config::tiny();
  c.vocab = 256;
  return c;
}
inline train::train_config config(int dp) {
  train::train_config t;
  t.steps = 4;
  t.global_batch = 12;
  t.micro_batch = 1;
  t.seq = 16;
  t.lr = 3e-3;
  t.warmup = 1;
  t.eval_windows = 7;
  t.grad_clip = 0.5;
  t.dp = dp;
  return t;
}

/// train_step losses, norms, parameters and evaluate() of dp ranks under S
/// equal the 1-rank trainer's within float64 1e-12 (relative), on every rank.
template <class S, class Comm>
void matches_single_rank(Comm& c) {
  using P = precision::fp64;
  temp_file corpus{make_corpus("match", c.rank())};
  data::token_file f(corpus.path);
  train::trainer<P> one(model(), config(1), f);
  train::trainer<P, host, optim::adamw, S, Comm> many(model(), config(c.size()), f,
                                                      parallel::layout{c});
  for (int s = 0; s < 4; ++s) {
    const auto a = one.train_step(), b = many.train_step();
    check(std::abs(a.loss - b.loss) <= 1e-12 * a.loss, "rank ", c.rank(), " of ", c.size(), " ",
          S::name, " step ", s, ": loss ", b.loss, " vs 1-rank ", a.loss);
    check(std::abs(a.grad_norm - b.grad_norm) <= 1e-12 * a.grad_norm, "rank ", c.rank(), " ",
          S::name, " step ", s, ": grad norm ", b.grad_norm, " vs 1-rank ", a.grad_norm);
    check(a.scored == b.scored && a.tokens == b.tokens, "rank ", c.rank(), ": scored ", b.scored,
          " tokens ", b.tokens, " vs 1-rank ", a.scored, ", ", a.tokens);
  }
  check(one.step() == many.step(), "step counters differ");
  const std::vector<double> ref(one.model().params(),
                                one.model().params() + one.model().layout().total());
  std::vector<double> full(static_cast<std::size_t>(many.model().flat_size()));
  many.engine().full_params(full.data());
  const double d = zero_suite::rel_max_diff(full, ref);
  check(d <= 1e-12, "rank ", c.rank(), " of ", c.size(), " ", S::name,
        ": parameters differ from the 1-rank trainer by ", d);
  const double e1 = one.evaluate(), e2 = many.evaluate();
  check(std::abs(e1 - e2) <= 1e-12 * e1, "rank ", c.rank(), " ", S::name, ": eval ", e2,
        " vs 1-rank ", e1);
  const double a1 = one.evaluate(0), a2 = many.evaluate(0);  // the whole held-out split
  check(std::abs(a1 - a2) <= 1e-12 * a1, "rank ", c.rank(), " ", S::name, ": full eval ", a2,
        " vs 1-rank ", a1);
  const auto g1 = one.generate({65, 66}, 8, 0.8, 3), g2 = many.generate({65, 66}, 8, 0.8, 3);
  check(g1 == g2, "rank ", c.rank(), " ", S::name, ": generated tokens differ");
}

/// Degrees that do not match the world and batches that do not divide fail
/// in the constructor, before any collective, naming the numbers.
template <class Comm>
void bad_settings_fail_before_work(Comm& c) {
  temp_file corpus{make_corpus("bad", c.rank())};
  data::token_file f(corpus.path);
  const auto calls_before = c.stats().all_reduce.calls + c.stats().all_gather.calls;
  auto expect = [&](train::train_config t, const std::string& needle) {
    try {
      train::trainer<precision::fp32, host, optim::adamw, parallel::zero<1>, Comm> tr(
          model(), t, f, parallel::layout{c});
    } catch (const config_error& e) {
      check(std::string(e.what()).find(needle) != std::string::npos, "rank ", c.rank(),
            ": message '", e.what(), "' does not contain '", needle, "'");
      return;
    }
    throw zero_suite::suite_failure("rank " + std::to_string(c.rank()) + ": no config_error for '" +
                                    needle + "'");
  };
  auto t = config(c.size() + 1);
  expect(t, "dp=" + std::to_string(c.size() + 1) + " does not match the communicator's " +
                std::to_string(c.size()) + " ranks");
  t = config(c.size());
  t.global_batch = 5 * c.size() + (c.size() > 1 ? 1 : 0);
  t.micro_batch = c.size() > 1 ? 1 : 2;
  expect(t, "G=" + std::to_string(t.global_batch) + " is not divisible by micro-batch B=" +
                std::to_string(t.micro_batch) + " x dp=" + std::to_string(c.size()));
  const auto calls_after = c.stats().all_reduce.calls + c.stats().all_gather.calls;
  check(calls_after == calls_before, "rank ", c.rank(), ": ", calls_after - calls_before,
        " collectives ran before the error");
}

/// A dp run saved after two steps resumes on the same layout exactly: the
/// single file of earlier versions under zero<0> (rank 0 writes it), a
/// checkpoint folder under zero<2> (every rank its share); zero<2> refuses
/// the single file, naming why. `dir` is shared by the ranks.
template <class Comm>
void checkpoint_resumes_or_refuses(Comm& c, const fs::path& dir) {
  using P = precision::bf16_mixed;
  temp_file corpus{make_corpus("ckpt", c.rank())};
  data::token_file f(corpus.path);
  auto resumes = [&](auto strategy, const fs::path& ck) {
    using S = decltype(strategy);
    std::vector<double> full;
    {
      train::trainer<P, host, optim::adamw, S, Comm> t(model(), config(c.size()), f,
                                                       parallel::layout{c});
      for (int s = 0; s < 4; ++s) {
        full.push_back(t.train_step().loss);
        if (s == 1) t.save_checkpoint(ck);
      }
    }
    train::trainer<P, host, optim::adamw, S, Comm> r(model(), config(c.size()), f,
                                                     parallel::layout{c});
    r.load_checkpoint(ck);
    check(r.step() == 2, "rank ", c.rank(), ": ", S::name, " resumed at step ", r.step());
    for (int s = 2; s < 4; ++s) {
      const double l = r.train_step().loss;
      check(l == full[static_cast<std::size_t>(s)], "rank ", c.rank(), ": ", S::name,
            " resumed step ", s, " loss ", l, " vs ", full[static_cast<std::size_t>(s)]);
    }
  };
  resumes(parallel::zero<0>{}, dir / "dp.bin");
  resumes(parallel::zero<2>{}, dir / "dp_zero2");
  train::trainer<P, host, optim::adamw, parallel::zero<2>, Comm> z(model(), config(c.size()), f,
                                                                   parallel::layout{c});
  try {
    z.save_checkpoint(dir / "z.bin");
    throw zero_suite::suite_failure("zero<2> saved a single-file checkpoint");
  } catch (const config_error& e) {
    check(std::string(e.what()).find("cannot hold") != std::string::npos, "rank ", c.rank(), ": ",
          e.what());
  }
  c.barrier();
}

}  // namespace trainer_suite
