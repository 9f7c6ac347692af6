// checkpoint_bench: what a checkpoint costs at dp 2 under ZeRO-1 (two
// ranks as threads), on llama2_7b-shaped blocks (H 4096, F 11008, 32
// heads; --layers of them, 2 by default, and a byte vocabulary, so the
// blocks are the state): the synchronous save's and the load's seconds and
// bytes per rank beside this disk's write rate measured by dd in the same
// run (the same bytes, conv=fsync, as the save syncs every file), and the
// step-time cost of a checkpoint saved synchronously against one saved in
// the background (train/checkpoint_async.hpp): the step that saves, from
// its start to the next step's start, against a step without a save.
//
//   build/host/benchmarks/checkpoint_bench                       # into a folder under /tmp
//   build/host/benchmarks/checkpoint_bench --dir /scratch/ck --json out.json
//
// Writes benchmarks/checkpoint_bench.json (or --json) and prints a markdown
// table. Exit status 2 for bad arguments or a folder it cannot write.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <omp.h>
#include <unistd.h>

#include "bench_io.hpp"
#include "tessera/comm/device_mesh.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/train/checkpoint_async.hpp"
#include "tessera/train/trainer.hpp"

using namespace tessera;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::uint64_t folder_bytes(const fs::path& dir, const std::string& name) {
  std::error_code ec;
  const auto n = fs::file_size(dir / name, ec);
  return ec ? 0 : n;
}

// dd's rate for `bytes` written to `dir` with an fsync at the end (as the
// save syncs each file), in bytes per second; the file is removed.
double dd_rate(const fs::path& dir, std::uint64_t bytes) {
  const std::uint64_t mib = std::max<std::uint64_t>(1, bytes >> 20);
  const fs::path f = dir / "dd.bin";
  const std::string cmd = "dd if=/dev/zero of='" + f.string() + "' bs=1M count=" +
                          std::to_string(mib) + " conv=fsync status=none";
  const auto t = clock_type::now();
  const int rc = std::system(cmd.c_str());
  const double s = since(t);
  std::error_code ec;
  fs::remove(f, ec);
  TESSERA_THROW_IF(rc != 0, io_error, "'", cmd, "' failed with status ", rc);
  return static_cast<double>(mib << 20) / s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"checkpoint_bench: save, load and async-save costs at dp 2, ZeRO-1"};
  std::int64_t layers = 2, seq = 32, steps = 3;
  std::string dir_opt, json_out = "benchmarks/checkpoint_bench.json";
  app.add_option("--layers", layers, "llama2_7b blocks")->check(CLI::Range(1, 32));
  app.add_option("--seq", seq, "tokens per sequence")->check(CLI::Range(8, 4096));
  app.add_option("--steps", steps, "plain steps timed (median)")->check(CLI::Range(1, 100));
  app.add_option("--dir", dir_opt, "folder to write checkpoints in (default: under /tmp)");
  app.add_option("--json", json_out, "where to write the JSON results");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    const fs::path dir = dir_opt.empty()
                             ? fs::temp_directory_path() /
                                   ("tessera_checkpoint_bench_" + std::to_string(::getpid()))
                             : fs::path(dir_opt);
    fs::create_directories(dir);
    auto mc = nn::llama_config::from_name("llama2_7b");
    mc.n_layers = layers;
    mc.vocab = 256;
    const fs::path tok = dir / "corpus.tok";
    bench::write_random_tokens(tok, mc.vocab, 1 << 16, 5);
    train::train_config cfg;
    cfg.steps = 100;
    cfg.dp = 2;
    cfg.global_batch = 2;
    cfg.micro_batch = 1;
    cfg.seq = seq;
    cfg.lr = 1e-4;
    cfg.warmup = 0;
    cfg.eval_windows = 1;
    const int threads = std::max(1, omp_get_max_threads() / 2);

    double step_s = 0, sync_step_s = 0, save_s = 0, load_s = 0;
    double copy_s[2] = {0, 0}, next_s[2] = {0, 0}, wait_s[2] = {0, 0}, async_cost_s[2] = {0, 0};
    std::vector<std::uint64_t> rank_bytes(2, 0);
    comm::local_world::run(2, [&](comm::local_communicator& world) {
      omp_set_num_threads(threads);
      auto g = comm::make_groups(world, comm::device_mesh(2, 1, 1));
      const data::token_file f(tok);
      train::trainer<precision::fp32, host, optim::adamw, parallel::zero<1>,
                     comm::local_communicator>
          tr(mc, cfg, f, parallel::layout{g.dp, nn::dense_layers{}, g.pp});
      auto world_reduce = train::mesh_reduction(tr.layout(), tr.context());
      const bool lead = world.rank() == 0;
      tr.train_step();  // warm-up
      // A step without a save, from its start to the next one's.
      std::vector<double> plain;
      for (std::int64_t s = 0; s < steps; ++s) {
        world.barrier();
        const auto t = clock_type::now();
        tr.train_step();
        world.barrier();
        plain.push_back(since(t));
      }
      // A synchronous save after a step.
      world.barrier();
      tr.train_step();
      world.barrier();
      auto t = clock_type::now();
      tr.save_checkpoint(dir / "step-sync");
      world.barrier();
      const double saved = since(t);
      // The load of it.
      t = clock_type::now();
      tr.load_checkpoint(dir / "step-sync");
      world.barrier();
      const double loaded = since(t);
      // Steps that save in the background, twice (the second copies into
      // the first's host buffers, as every later save of a run does): the
      // step, the copy to host memory, then the next step with the writer
      // running (its cost is what that step takes beyond a plain one),
      // then the wait for the writer.
      train::async_checkpoint a;
      double began[2] = {0, 0}, next[2] = {0, 0}, waited[2] = {0, 0};
      for (int k = 0; k < 2; ++k) {
        world.barrier();
        tr.train_step();
        auto b = clock_type::now();
        tr.begin_checkpoint(dir / ("step-async-" + std::to_string(k)), a);
        world.barrier();
        began[k] = since(b);
        b = clock_type::now();
        tr.train_step();
        world.barrier();
        next[k] = since(b);
        b = clock_type::now();
        const fs::path done = a.finish(world_reduce, true);
        TESSERA_THROW_IF(done.empty(), error, "the asynchronous save did not complete");
        world.barrier();
        waited[k] = since(b);
      }
      if (lead) {
        step_s = median(plain);
        sync_step_s = step_s + saved;
        save_s = saved;
        load_s = loaded;
        for (int k = 0; k < 2; ++k) {
          copy_s[k] = began[k];
          next_s[k] = next[k];
          wait_s[k] = waited[k];
          // The save's cost to the steps: the copy, and what the next step
          // took beyond a plain one while the writer ran.
          async_cost_s[k] = began[k] + std::max(0.0, next[k] - step_s);
        }
      }
    });
    for (int r = 0; r < 2; ++r)
      rank_bytes[static_cast<std::size_t>(r)] =
          folder_bytes(dir / "step-sync", train::rank_data_name(r));
    const std::uint64_t total = rank_bytes[0] + rank_bytes[1];
    const double dd = dd_rate(dir, total);
    const double save_rate = static_cast<double>(total) / save_s;
    nlohmann::json j = {
        {"model", {{"preset", "llama2_7b"}, {"layers", layers}, {"vocab", mc.vocab}}},
        {"layout", {{"dp", 2}, {"zero", 1}, {"precision", "fp32"}, {"optimizer", "adamw"}}},
        {"threads_per_rank", threads},
        {"seq", seq},
        {"bytes_per_rank", rank_bytes},
        {"save_s", save_s},
        {"load_s", load_s},
        {"save_bytes_per_s", save_rate},
        {"dd_bytes_per_s", dd},
        {"save_vs_dd", save_rate / dd},
        {"step_s", step_s},
        {"step_with_sync_save_s", sync_step_s},
        {"sync_overhead", sync_step_s / step_s - 1},
        {"async_first", {{"copy_s", copy_s[0]}, {"next_step_s", next_s[0]},
                         {"finish_wait_s", wait_s[0]}, {"overhead", async_cost_s[0] / step_s}}},
        {"async_later", {{"copy_s", copy_s[1]}, {"next_step_s", next_s[1]},
                         {"finish_wait_s", wait_s[1]}, {"overhead", async_cost_s[1] / step_s}}},
        {"dir", dir.string()}};
    bench::write_json(json_out, j);
    std::printf(
        "| llama2_7b x %lld blocks, dp 2 ZeRO-1, fp32 AdamW | value |\n| --- | ---: |\n"
        "| bytes per rank | %.2f GB, %.2f GB |\n"
        "| save (both ranks at once, fsync'ed) | %.2f s, %.0f MB/s |\n"
        "| dd of the same bytes (conv=fsync) | %.0f MB/s (save at %.0f%%) |\n"
        "| load | %.2f s |\n"
        "| step without a save | %.2f s |\n"
        "| step with a synchronous save | %.2f s (+%.0f%%) |\n",
        static_cast<long long>(layers), rank_bytes[0] / 1e9, rank_bytes[1] / 1e9, save_s,
        save_rate / 1e6, dd / 1e6, 100 * save_rate / dd, load_s, step_s, sync_step_s,
        100 * (sync_step_s / step_s - 1));
    for (int k = 0; k < 2; ++k)
      std::printf(
          "| step with an asynchronous save, %s (copy %.2f s, next step %.2f s, wait %.2f s) | "
          "%.2f s (+%.0f%%) |\n",
          k == 0 ? "first (new host buffers)" : "later (buffers reused)", copy_s[k], next_s[k],
          wait_s[k], step_s + async_cost_s[k], 100 * async_cost_s[k] / step_s);
    if (dir_opt.empty()) {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_bench: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
