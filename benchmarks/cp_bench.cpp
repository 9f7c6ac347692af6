// cp_bench: what context parallelism buys on the host: for sequences of
// T = 4096, 8192 and 16384 tokens, each rank's peak memory in a training
// step above its persistent state (the activations, the attention's
// buffers, the step's other temporaries: its memory resource's high-water
// mark) and the step time, at cp 1, 2 and 4 on thread ranks (the local
// communicator) sharing the same cores, against the planner's figures
// (plan::plan_activations' peak and saved bytes; plan::plan_cp_bytes for
// the bytes each rank sends on its cp group, which must equal its
// communicator's count).
//
// Each case trains train::trainer<fp32, host, adamw, zero<0>,
// local_communicator> on seeded random tokens, the small preset (H 128,
// 4 layers, nh 4 over nkv 2) with max_seq widened to the longest T, one
// sequence per step (B = 1, G = 1): --warmup untimed steps, then --steps
// timed ones; the cp ranks share the machine's OpenMP threads (2 cores:
// cp 1 runs one rank on 2 threads, cp 2 two ranks on 1 thread each, cp 4
// four ranks on 1 thread each). Ring attention unless --cp-kind ulysses.
//
//   build/host/benchmarks/cp_bench                  # T 4096, 8192, 16384
//   build/host/benchmarks/cp_bench --seq 4096 --json /tmp/cp.json
//
// Writes benchmarks/cp_bench.json and prints a markdown table. Exit status
// 2 for bad arguments.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <omp.h>
#include <unistd.h>

#include "bench_io.hpp"
#include "tessera/comm/device_mesh.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/kernels/blas.hpp"
#include "tessera/plan/activations.hpp"
#include "tessera/plan/step.hpp"
#include "tessera/train/trainer.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

struct result {
  std::int64_t T = 0;
  int cp = 1;
  double peak_bytes = 0;     // rank 0's high-water mark in a step, above its state
  double planned_peak = 0;   // plan_activations' peak (one micro-batch)
  double saved_bytes = 0;    // what a forward keeps for its backward (the model's count)
  double planned_saved = 0;  // plan_activations' saved
  double median_s = 0, tokens_per_s = 0;
  std::uint64_t sent = 0, planned_sent = 0;  // on the cp group, per step
};

// A corpus of seeded random tokens of vocabulary V, removed at exit.
struct corpus {
  fs::path path;
  corpus(std::int64_t V, std::uint64_t n) {
    path = fs::temp_directory_path() / ("tessera_cp_bench_" + std::to_string(::getpid()) + ".tok");
    bench::write_random_tokens(path, V, n, 11);
  }
  ~corpus() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

result run_case(const nn::llama_config& mc, const corpus& text, std::int64_t T, int cp,
                nn::cp_kind kind, std::int64_t warmup, std::int64_t steps) {
  using P = precision::fp32;
  train::train_config cfg;
  cfg.steps = warmup + steps;
  cfg.global_batch = 1;
  cfg.micro_batch = 1;
  cfg.seq = T;
  cfg.lr = 3e-4;
  cfg.warmup = 0;
  cfg.eval_windows = 1;
  cfg.cp = cp;
  cfg.cp_kind = kind;
  const int threads = std::max(1, omp_get_max_threads() / cp);
  result res;
  res.T = T;
  res.cp = cp;
  std::mutex mu;
  comm::local_world::run(cp, [&](comm::local_communicator& world) {
    omp_set_num_threads(threads);
    auto g = comm::make_groups(world, comm::device_mesh(comm::mesh_degrees{.cp = cp}));
    host_memory_resource mr;
    kernels::host_context ctx{&mr};
    ctx.threads = threads;
    data::token_file f(text.path);
    train::trainer<P, host, optim::adamw, parallel::zero<0>, comm::local_communicator> tr(
        mc, cfg, f, parallel::layout{g, nn::dense_layers{}}, {}, &ctx);
    for (std::int64_t s = 0; s < warmup; ++s) tr.train_step();
    g.cp.reset_stats();
    std::vector<double> secs;
    std::size_t peak = 0;
    for (std::int64_t s = 0; s < steps; ++s) {
      const std::size_t base = mr.stats().allocated;
      mr.reset_peak();
      secs.push_back(tr.train_step().seconds);
      peak = std::max(peak, mr.stats().peak_allocated - base);
    }
    if (world.rank() != 0) return;
    std::lock_guard<std::mutex> lock(mu);
    std::sort(secs.begin(), secs.end());
    res.median_s = secs[secs.size() / 2];
    res.tokens_per_s = static_cast<double>(T) / res.median_s;
    res.peak_bytes = static_cast<double>(peak);
    res.saved_bytes = static_cast<double>(tr.model().record_bytes(1, T / cp));
    res.sent = g.cp.stats().of(comm::op_kind::send).bytes / static_cast<std::uint64_t>(steps);
    plan::activation_options o;
    o.micro_batch = 1;
    o.seq = T;
    o.threads = threads;
    o.tiles = ctx.tiles;
    o.cp = cp;
    o.cp_kind = kind;
    const auto a = plan::plan_activations(mc, plan::dtype_sizes::of<P>(), o);
    res.planned_peak = static_cast<double>(a.peak);
    res.planned_saved = static_cast<double>(a.saved);
    res.planned_sent = plan::plan_cp_bytes(mc, 1, T, 1, cp, 1, kind);
  });
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string blas = kernels::check_blas_core(argv);
  std::string json_path =
      std::filesystem::is_directory("benchmarks") ? "benchmarks/cp_bench.json" : "cp_bench.json";
  std::int64_t warmup = 1, steps = 2;
  std::vector<std::int64_t> seqs = {4096, 8192, 16384};
  std::vector<int> cps = {1, 2, 4};
  std::string kind_name = "ring";
  CLI::App app{
      "cp_bench: per-rank peak memory and step time at context-parallel degrees 1, 2 and 4 on "
      "thread ranks, against the planner"};
  app.add_option("--json", json_path, "where to write the JSON results")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--steps", steps, "timed steps")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--seq", seqs, "sequence lengths T (each divisible by 2 x the largest cp)")
      ->capture_default_str();
  app.add_option("--cp", cps, "context-parallel degrees")->capture_default_str();
  app.add_option("--cp-kind", kind_name, "ring or ulysses")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    const nn::cp_kind kind = nn::parse_cp_kind(kind_name);
    TESSERA_THROW_IF(cps.empty() || cps.front() != 1, config_error,
                     "--cp: the first degree is the baseline of its row and must be 1");
    for (const int cp : cps)
      TESSERA_THROW_IF(cp < 1 || cp > 64, config_error, "--cp ", cp, " must be in [1, 64]");
    auto mc = nn::llama_config::small();
    mc.max_seq = *std::max_element(seqs.begin(), seqs.end());
    for (const std::int64_t T : seqs)
      for (const int cp : cps)
        if (cp > 1) nn::check_context_parallel(kind, cp, T, mc.n_heads, mc.n_kv_heads);
    // the held-out tenth must hold a window of the longest T + 1 tokens
    const corpus text(mc.vocab, static_cast<std::uint64_t>(12 * (mc.max_seq + 1)));
    std::vector<result> rows;
    for (const std::int64_t T : seqs)
      for (const int cp : cps) {
        rows.push_back(run_case(mc, text, T, cp, kind, warmup, steps));
        const auto& r = rows.back();
        // Check before reporting: the communicators' count is the plan's,
        // and so are the saved activations.
        TESSERA_THROW_IF(r.sent != r.planned_sent, error, "cp_bench: T ", T, " cp ", cp, ": ",
                         r.sent, " bytes sent per step, the plan says ", r.planned_sent);
        TESSERA_THROW_IF(r.saved_bytes != r.planned_saved, error, "cp_bench: T ", T, " cp ", cp,
                         ": ", r.saved_bytes, " bytes saved for backward, the plan says ",
                         r.planned_saved);
        std::printf(
            "cp_bench: T %lld cp %d: peak %.1f MiB above the state (planned activation peak %.1f "
            "MiB), median step %.3f s, %.0f tokens/s, %llu bytes sent per step\n",
            static_cast<long long>(T), cp, r.peak_bytes / 1048576.0, r.planned_peak / 1048576.0,
            r.median_s, r.tokens_per_s, static_cast<unsigned long long>(r.sent));
        std::fflush(stdout);
      }
    std::printf(
        "\ncp_bench: %s, %d OpenMP threads shared by the cp ranks, %s attention, %lld timed "
        "step%s\n\n",
        blas.c_str(), omp_get_max_threads(), kind_name.c_str(), static_cast<long long>(steps),
        steps > 1 ? "s" : "");
    std::printf(
        "| T | cp | step peak per rank (MiB) | planned activation peak (MiB) | saved activations "
        "(MiB) | vs cp 1 | median step (s) | tokens/s | vs cp 1 | cp bytes sent per step |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n");
    nlohmann::json j;
    j["blas"] = blas;
    j["threads"] = omp_get_max_threads();
    j["steps"] = steps;
    j["cp_kind"] = kind_name;
    j["model"] = "small, max_seq " + std::to_string(mc.max_seq);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      const result& base = rows[i - i % cps.size()];  // this T's first cp (cp 1)
      std::printf("| %lld | %d | %.1f | %.1f | %.1f | %.2f | %.3f | %.0f | %.2f | %llu |\n",
                  static_cast<long long>(r.T), r.cp, r.peak_bytes / 1048576.0,
                  r.planned_peak / 1048576.0, r.saved_bytes / 1048576.0,
                  r.peak_bytes / base.peak_bytes, r.median_s, r.tokens_per_s,
                  r.tokens_per_s / base.tokens_per_s, static_cast<unsigned long long>(r.sent));
      j["cases"].push_back({{"T", r.T},
                            {"cp", r.cp},
                            {"step_peak_bytes", r.peak_bytes},
                            {"planned_activation_peak_bytes", r.planned_peak},
                            {"saved_activation_bytes", r.saved_bytes},
                            {"median_s", r.median_s},
                            {"tokens_per_s", r.tokens_per_s},
                            {"cp_bytes_per_step", r.sent},
                            {"planned_cp_bytes_per_step", r.planned_sent}});
    }
    bench::write_json(json_path, j);
    std::printf("\ncp_bench: wrote %s\n", json_path.c_str());
  } catch (const tessera::config_error& e) {
    std::fprintf(stderr, "cp_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cp_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
