// tp_bench: tokens/s of a training step at tensor-parallel degrees 1 and 2
// (and 2 with sequence parallelism) on thread ranks (the local
// communicator), with the share of the step spent in the tp collectives,
// the bytes each rank sends against the planner's formula
// (plan::plan_tp_bytes), and the activation bytes a micro-batch saves for
// its backward on each rank (nn::llama::record_bytes).
//
// Each case trains train::trainer<fp32, host, adamw, zero<0>,
// local_communicator, tensor_parallel_layers> on seeded random tokens, one
// micro-batch per step (G = B), --warmup untimed steps then --steps timed
// ones; the tp ranks share the machine's OpenMP threads (2 cores: tp 1
// runs one rank on 2 threads, tp 2 two ranks on 1 thread each). Reports
// the median step time of rank 0, tokens/s, and the communication share
// (rank 0's wall time inside the tp collectives over its step time).
//
//   build/host/benchmarks/tp_bench                 # small, and llama2_7b shapes with 2 layers
//   build/host/benchmarks/tp_bench --skip-7b --json /tmp/tp.json
//
// Writes benchmarks/tp_bench.json and prints a markdown table. Exit status
// 2 for bad arguments.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include <omp.h>
#include <unistd.h>

#include "bench_io.hpp"
#include "tessera/comm/device_mesh.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/core/random.hpp"
#include "tessera/kernels/blas.hpp"
#include "tessera/nn/tensor_parallel.hpp"
#include "tessera/plan/step.hpp"
#include "tessera/train/trainer.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

struct bench_case {
  std::string name, preset;
  std::int64_t layers = 0, B = 0, T = 0;
};

struct result {
  std::string name;
  int tp = 1;
  bool sp = false;         // sequence parallelism
  double saved_bytes = 0;  // activations a micro-batch keeps for backward, per rank
  double median_s = 0, tokens_per_s = 0, comm_share = 0;
  std::uint64_t bytes_per_step = 0, planned_bytes = 0;
  double params_per_rank = 0;
};

// A corpus of seeded random tokens of vocabulary V, removed at exit.
struct corpus {
  fs::path path;
  corpus(std::int64_t V, std::uint64_t n) {
    path = fs::temp_directory_path() / ("tessera_tp_bench_" + std::to_string(::getpid()) + ".tok");
    bench::write_random_tokens(path, V, n, 7);
  }
  ~corpus() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

result run_case(const bench_case& bc, int tp, bool sp, std::int64_t warmup, std::int64_t steps) {
  auto mc = nn::llama_config::from_name(bc.preset);
  if (bc.layers > 0) mc.n_layers = bc.layers;
  if (bc.preset == "small") mc.vocab = 256;
  corpus text(mc.vocab,
              static_cast<std::uint64_t>(std::max<std::int64_t>(8192, 40 * bc.B * (bc.T + 1))));
  train::train_config cfg;
  cfg.steps = warmup + steps;
  cfg.global_batch = bc.B;
  cfg.micro_batch = bc.B;
  cfg.seq = bc.T;
  cfg.lr = 3e-4;
  cfg.warmup = 0;
  cfg.eval_windows = 1;
  cfg.tp = tp;
  cfg.sequence_parallel = sp;
  const int threads = std::max(1, omp_get_max_threads() / tp);
  result res;
  res.name = bc.name;
  res.tp = tp;
  res.sp = sp;
  std::mutex mu;
  comm::local_world::run(tp, [&](comm::local_communicator& world) {
    omp_set_num_threads(threads);
    const comm::device_mesh mesh(1, tp, 1);
    auto g = comm::make_groups(world, mesh);
    double comm_s = 0;
    using layers = nn::tensor_parallel_layers<comm::local_communicator>;
    data::token_file f(text.path);
    train::trainer<precision::fp32, host, optim::adamw, parallel::zero<0>, comm::local_communicator,
                   layers>
        tr(mc, cfg, f, parallel::layout{g.dp, layers{&g.tp, &comm_s}});
    for (std::int64_t s = 0; s < warmup; ++s) tr.train_step();
    comm_s = 0;
    g.tp.reset_stats();
    std::vector<double> secs;
    for (std::int64_t s = 0; s < steps; ++s) secs.push_back(tr.train_step().seconds);
    if (world.rank() != 0) return;
    std::lock_guard<std::mutex> lock(mu);
    double total = 0;
    for (double x : secs) total += x;
    std::sort(secs.begin(), secs.end());
    res.median_s = secs[secs.size() / 2];
    res.tokens_per_s = static_cast<double>(bc.B * bc.T) / res.median_s;
    res.comm_share = total > 0 ? comm_s / total : 0.0;
    res.bytes_per_step = g.tp.stats().bytes_sent() / static_cast<std::uint64_t>(steps);
    plan::tp_traffic traffic;
    traffic.sequence_parallel = sp;
    res.planned_bytes = plan::plan_tp_bytes(mc, bc.B, bc.T, 1, tp, 0, traffic);
    res.params_per_rank = static_cast<double>(tr.model().num_params());
    res.saved_bytes = static_cast<double>(tr.model().record_bytes(bc.B, bc.T));
  });
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string blas = kernels::check_blas_core(argv);
  // Beside the other results when run from the repository root, else here.
  std::string json_path =
      std::filesystem::is_directory("benchmarks") ? "benchmarks/tp_bench.json" : "tp_bench.json";
  std::int64_t warmup = 2, steps = 8;
  bool skip_7b = false;
  CLI::App app{
      "tp_bench: tokens/s at tp 1, 2 and 2 with sequence parallelism on thread ranks, with the "
      "communication share"};
  app.add_option("--json", json_path, "where to write the JSON results")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--steps", steps, "timed steps")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_flag("--skip-7b", skip_7b, "skip the llama2_7b-shaped case (2 layers, T 256)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    std::vector<bench_case> cases = {{"small preset, fp32, B 16, T 128", "small", 0, 16, 128}};
    if (!skip_7b)
      cases.push_back({"llama2_7b shapes, 2 layers, fp32, B 1, T 256", "llama2_7b", 2, 1, 256});
    std::vector<result> rows;
    for (const auto& c : cases)
      for (auto [tp, sp] : {std::pair{1, false}, std::pair{2, false}, std::pair{2, true}}) {
        rows.push_back(run_case(c, tp, sp, warmup, steps));
        const auto& r = rows.back();
        // Check before reporting: the communicators' count is the plan's.
        TESSERA_THROW_IF(r.bytes_per_step != r.planned_bytes, error, "tp_bench: ", r.name, " tp ",
                         r.tp, r.sp ? " sp" : "", ": ", r.bytes_per_step,
                         " bytes sent per step, the plan says ", r.planned_bytes);
        std::printf(
            "tp_bench: %s, tp %d%s: median step %.4f s, %.0f tokens/s, tp collectives "
            "%.1f%% of the step, %llu bytes sent per step (planned %llu)\n",
            r.name.c_str(), r.tp, r.sp ? " sp" : "", r.median_s, r.tokens_per_s, 100 * r.comm_share,
            (unsigned long long)r.bytes_per_step, (unsigned long long)r.planned_bytes);
        std::fflush(stdout);
      }
    std::printf("\ntp_bench: %s, %d OpenMP threads shared by the tp ranks, %lld timed steps\n\n",
                blas.c_str(), omp_get_max_threads(), (long long)steps);
    std::printf(
        "| step | tp | parameters per rank | saved activations per rank (MiB) | median step (s) | "
        "tokens/s | vs tp 1 | tp collectives share | bytes sent per step (planned) "
        "|\n|---|---|---|---|---|---|---|---|---|\n");
    nlohmann::json j;
    j["blas"] = blas;
    j["threads"] = omp_get_max_threads();
    j["steps"] = steps;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      const double base = rows[i - i % 3].tokens_per_s;  // the case's tp 1 row
      std::printf("| %s | %d%s | %.2fM | %.1f | %.4f | %.0f | %.2f | %.1f%% | %llu (%llu) |\n",
                  r.name.c_str(), r.tp, r.sp ? " + sequence parallel" : "", r.params_per_rank / 1e6,
                  r.saved_bytes / 1048576.0, r.median_s, r.tokens_per_s, r.tokens_per_s / base,
                  100 * r.comm_share, (unsigned long long)r.bytes_per_step,
                  (unsigned long long)r.planned_bytes);
      j["cases"].push_back({{"name", r.name},
                            {"tp", r.tp},
                            {"sequence_parallel", r.sp},
                            {"saved_activation_bytes", r.saved_bytes},
                            {"params_per_rank", r.params_per_rank},
                            {"median_s", r.median_s},
                            {"tokens_per_s", r.tokens_per_s},
                            {"comm_share", r.comm_share},
                            {"bytes_per_step", r.bytes_per_step},
                            {"planned_bytes_per_step", r.planned_bytes}});
    }
    bench::write_json(json_path, j);
    std::printf("\ntp_bench: wrote %s\n", json_path.c_str());
  } catch (const tessera::config_error& e) {
    std::fprintf(stderr, "tp_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tp_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
