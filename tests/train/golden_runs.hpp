// The runs behind the golden trajectories (golden_suite.hpp names the
// cases). Each returns the trajectory of its run on this rank; every rank
// of a data-parallel run returns the same global figures.
#pragma once

#include <omp.h>

#include <filesystem>
#include <string>

#include "golden_suite.hpp"
#include "tessera/train/trainer.hpp"

namespace golden {

using namespace tessera;

/// The small preset's golden settings: the main job's hyper-parameters with
/// two micro-batches per step.
inline train::train_config small_config() {
  train::train_config t;
  t.steps = 50;
  t.global_batch = 16;
  t.micro_batch = 8;
  t.seq = 128;
  t.lr = 2e-3;
  t.warmup = 5;
  t.eval_every = 0;
  t.adamw.weight_decay = 0.1;
  t.adamw.beta2 = 0.99;
  t.seed = 1337;
  return t;
}

/// tiny with the byte vocabulary.
inline nn::llama_config tiny_model() {
  auto c = nn::llama_config::tiny();
  c.vocab = 256;
  return c;
}

/// tiny's data-parallel settings: G 16 over dp ranks of B `micro`.
inline train::train_config tiny_config(std::int64_t steps, std::int64_t dp, std::int64_t micro) {
  train::train_config t;
  t.steps = steps;
  t.global_batch = 16;
  t.micro_batch = micro;
  t.seq = 32;
  t.dp = dp;
  t.lr = 3e-3;
  t.warmup = 3;
  t.eval_every = 0;
  t.seed = 20261201;
  return t;
}

template <class Trainer>
trajectory run_steps(Trainer& tr, std::int64_t until) {
  trajectory t;
  while (tr.step() < until) {
    const auto m = tr.train_step();
    t.push_back({m.step, m.loss, m.grad_norm, m.lr});
  }
  return t;
}

/// small_fp32 / small_bf16 on one rank, 2 OpenMP threads.
template <precision::policy P>
trajectory small_run() {
  omp_set_num_threads(2);
  data::token_file data(corpus("small"));
  train::trainer<P> tr(nn::llama_config::small(), small_config(), data);
  return run_steps(tr, 50);
}

/// tiny_single (resume_at = 0) or tiny_resume (saved at resume_at, rebuilt,
/// loaded, continued: the steps after resume_at only), one rank, 2 threads.
inline trajectory tiny_single_run(std::int64_t resume_at) {
  omp_set_num_threads(2);
  data::token_file data(corpus("tiny"));
  const auto cfg = tiny_config(50, 1, 4);
  if (resume_at == 0) {
    train::trainer<precision::fp32> tr(tiny_model(), cfg, data);
    return run_steps(tr, 50);
  }
  const fs::path ck =
      fs::temp_directory_path() / ("tessera_golden_resume_" + std::to_string(::getpid()) + ".bin");
  {
    train::trainer<precision::fp32> tr(tiny_model(), cfg, data);
    run_steps(tr, resume_at);
    tr.save_checkpoint(ck);
  }
  train::trainer<precision::fp32> tr(tiny_model(), cfg, data);
  tr.load_checkpoint(ck);
  std::error_code ec;
  fs::remove(ck, ec);
  return run_steps(tr, 50);
}

/// tiny under data parallelism on communicator `comm` (dp = comm.size()),
/// ZeRO stage S, B `micro`, 20 steps, 1 OpenMP thread per rank, 4 KiB
/// buckets (several buckets per step).
template <class S, class Comm>
trajectory tiny_dp_run(Comm& comm, std::int64_t micro, const std::string& tag) {
  omp_set_num_threads(1);
  data::token_file data(corpus(tag + std::to_string(comm.rank())));
  parallel::data_parallel_options dpo;
  dpo.bucket_bytes = 4096;
  train::trainer<precision::fp32, host, optim::adamw, S, Comm> tr(
      tiny_model(), tiny_config(20, comm.size(), micro), data, parallel::layout{comm}, dpo);
  return run_steps(tr, 20);
}

}  // namespace golden
