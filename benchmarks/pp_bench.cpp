// pp_bench: tokens/s and the bubble of a pipelined training step at pp 1,
// 2 and 4 under each schedule (gpipe, 1f1b, interleaved with 2 virtual
// stages, zb1) on thread ranks (the local communicator), with the bubble
// measured from the step's trace beside the simulator's for the measured
// forward, backward (B, W) times, and each stage's peak activation bytes.
//
// Each case trains train::trainer<fp32, host, adamw, zero<0>,
// local_communicator> on seeded random tokens, M micro-batches of B
// sequences per step (G = M B), --warmup untimed steps then --steps timed
// ones; the ranks share the machine's OpenMP threads (each gets threads /
// pp, at least 1: with more stages than cores the ranks take turns, and
// their times include the waiting). One more step is traced
// (train::trainer::set_tracing): its bubble is train::measure_bubble over
// every rank (1 - compute time / (ranks x span)), and the simulator
// (plan::simulate_stages) runs the same schedule with each virtual stage's
// mean forward, B and W (a whole backward: two halves) durations from the
// trace.
//
//   build/host/benchmarks/pp_bench                  # small, and llama2_7b shapes with 4 layers
//   build/host/benchmarks/pp_bench --skip-7b --json /tmp/pp.json
//
// Writes benchmarks/pp_bench.json and prints a markdown table. Exit status
// 2 for bad arguments.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
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
#include "tessera/parallel/pipeline_sim.hpp"
#include "tessera/plan/pipeline.hpp"
#include "tessera/train/trace.hpp"
#include "tessera/train/trainer.hpp"

using namespace tessera;
namespace fs = std::filesystem;
using parallel::schedule_kind;

namespace {

struct bench_case {
  std::string name, preset;
  std::int64_t layers = 0, B = 0, T = 0, M = 0;
};

struct result {
  std::string name, schedule;
  int pp = 1, V = 1;
  double median_s = 0, tokens_per_s = 0;
  std::vector<double> losses;  // every step's loss (the check against pp 1)
  double bubble_trace = 0, bubble_sim = 0, bubble_formula = 0;
  double forward_ms = 0, backward_ms = 0;   // mean per chunk action (B + W for zb1)
  std::vector<double> peak_activation_mib;  // per stage: the most record bytes held
};

struct corpus {
  fs::path path;
  corpus(std::int64_t V, std::uint64_t n) {
    path = fs::temp_directory_path() / ("tessera_pp_bench_" + std::to_string(::getpid()) + ".tok");
    bench::write_random_tokens(path, V, n, 11);
  }
  ~corpus() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

result run_case(const bench_case& bc, int pp, schedule_kind sk, int V, std::int64_t warmup,
                std::int64_t steps) {
  auto mc = nn::llama_config::from_name(bc.preset);
  if (bc.layers > 0) mc.n_layers = bc.layers;
  corpus text(mc.vocab, static_cast<std::uint64_t>(
                            std::max<std::int64_t>(8192, 4 * bc.M * bc.B * (bc.T + 1))));
  train::train_config cfg;
  cfg.steps = warmup + steps + 1;
  cfg.global_batch = bc.M * bc.B;
  cfg.micro_batch = bc.B;
  cfg.seq = bc.T;
  cfg.lr = 3e-4;
  cfg.warmup = 0;
  cfg.eval_windows = 1;
  cfg.pp = pp;
  cfg.pipeline = sk;
  cfg.virtual_stages = V;
  const int threads = std::max(1, omp_get_max_threads() / pp);
  result res;
  res.name = bc.name;
  res.schedule = parallel::to_string(sk);
  res.pp = pp;
  res.V = V;
  res.peak_activation_mib.assign(static_cast<std::size_t>(pp), 0.0);
  std::mutex mu;
  comm::local_world::run(pp, [&](comm::local_communicator& world) {
    omp_set_num_threads(threads);
    const comm::device_mesh mesh(1, 1, pp);
    auto g = comm::make_groups(world, mesh);
    data::token_file f(text.path);
    train::trainer<precision::fp32, host, optim::adamw, parallel::zero<0>, comm::local_communicator>
        tr(mc, cfg, f, parallel::layout{g.dp, nn::dense_layers{}, g.pp});
    std::vector<double> losses;
    for (std::int64_t s = 0; s < warmup; ++s) losses.push_back(tr.train_step().loss);
    std::vector<double> secs;
    for (std::int64_t s = 0; s < steps; ++s) {
      const auto m = tr.train_step();
      secs.push_back(m.seconds);
      losses.push_back(m.loss);
    }
    // The traced step: allocated bytes at each action's end, from the
    // value before the step (the records and messages held).
    const double before = static_cast<double>(tr.context().resource().stats().allocated);
    tr.set_tracing(true);
    tr.train_step();
    tr.set_tracing(false);
    double held = 0;
    for (const auto& t : tr.executor().timeline())
      held = std::max(held, static_cast<double>(t.allocated) - before);
    const auto events = tr.gather_timeline();
    std::lock_guard<std::mutex> lock(mu);
    res.peak_activation_mib[static_cast<std::size_t>(tr.pp_rank())] = held / 1048576.0;
    if (world.rank() != 0) return;
    res.losses = losses;
    std::sort(secs.begin(), secs.end());
    res.median_s = secs[secs.size() / 2];
    res.tokens_per_s = static_cast<double>(bc.M * bc.B * bc.T) / res.median_s;
    const train::trace_bubble b = train::measure_bubble(events, pp);
    res.bubble_trace = b.bubble_fraction;
    // The simulator with each virtual stage's mean forward, B and W times
    // from the trace (a whole backward counted as B + W halves): the
    // stages differ (the head sits on the last).
    const std::size_t KV = static_cast<std::size_t>(pp * V);
    plan::virtual_stage_costs vc;
    std::vector<double> nf(KV, 0), nb(KV, 0), nw(KV, 0);
    vc.forward.assign(KV, 0);
    vc.backward_input.assign(KV, 0);
    vc.backward_weight.assign(KV, 0);
    for (const auto& e : events) {
      const auto v = static_cast<std::size_t>(e.t.a.chunk * pp + e.rank);
      const double d = e.t.end - e.t.start;
      switch (e.t.a.kind) {
        case parallel::action_kind::forward:
          vc.forward[v] += d, ++nf[v];
          break;
        case parallel::action_kind::backward:
          vc.backward_input[v] += d / 2, ++nb[v];
          vc.backward_weight[v] += d / 2, ++nw[v];
          break;
        case parallel::action_kind::backward_input:
          vc.backward_input[v] += d, ++nb[v];
          break;
        case parallel::action_kind::backward_weight:
          vc.backward_weight[v] += d, ++nw[v];
          break;
        default:
          break;
      }
    }
    for (std::size_t v = 0; v < KV; ++v) {
      vc.forward[v] /= std::max(1.0, nf[v]);
      vc.backward_input[v] /= std::max(1.0, nb[v]);
      vc.backward_weight[v] /= std::max(1.0, nw[v]);
    }
    if (pp > 1) {
      std::vector<std::vector<parallel::action>> lists;
      for (int k = 0; k < pp; ++k) lists.push_back(parallel::make_schedule(sk, k, {pp, bc.M, V}));
      const parallel::simulation sim = plan::simulate_stages(lists, V, vc);
      double busy = 0;
      for (double x : sim.busy) busy += x;
      res.bubble_sim = 1 - busy / (pp * sim.step_time);
    }
    const double K = pp, M = static_cast<double>(bc.M);
    res.bubble_formula =
        sk == schedule_kind::interleaved ? (K - 1) / (V * M + K - 1) : (K - 1) / (M + K - 1);
    res.forward_ms = 1e3 * b.forward;
    res.backward_ms =
        1e3 *
        (sk == schedule_kind::zero_bubble_h1 ? b.backward_input + b.backward_weight : b.backward);
  });
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string blas = kernels::check_blas_core(argv);
  // Beside the other results when run from the repository root, else here.
  std::string json_path =
      std::filesystem::is_directory("benchmarks") ? "benchmarks/pp_bench.json" : "pp_bench.json";
  std::int64_t warmup = 1, steps = 3;
  bool skip_7b = false, skip_small = false;
  CLI::App app{"pp_bench: tokens/s and bubble at pp 1, 2, 4 under each schedule on thread ranks"};
  app.add_option("--json", json_path, "where to write the JSON results")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--steps", steps, "timed steps")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_flag("--skip-7b", skip_7b, "skip the llama2_7b-shaped case (4 layers, T 256)");
  app.add_flag("--skip-small", skip_small, "skip the small preset's case");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    std::vector<bench_case> cases;
    if (!skip_small)
      cases.push_back({"small preset, fp32, M 8 x B 4, T 128", "small", 0, 4, 128, 8});
    if (!skip_7b)
      cases.push_back(
          {"llama2_7b shapes, 4 layers, fp32, M 4 x B 1, T 256", "llama2_7b", 4, 1, 256, 4});
    std::vector<result> rows;
    for (const auto& c : cases) {
      rows.push_back(run_case(c, 1, schedule_kind::one_f_one_b, 1, warmup, steps));
      const std::vector<double> base_losses = rows.back().losses;
      for (int pp : {2, 4})
        for (auto [sk, V] :
             {std::pair{schedule_kind::gpipe, 1}, std::pair{schedule_kind::one_f_one_b, 1},
              std::pair{schedule_kind::interleaved, 2},
              std::pair{schedule_kind::zero_bubble_h1, 1}}) {
          if (sk == schedule_kind::interleaved && (pp * V > c.layers && c.layers > 0)) continue;
          if (sk == schedule_kind::interleaved && c.layers == 0 && pp * V > 4) continue;
          if (sk == schedule_kind::interleaved && c.M % pp != 0) continue;
          rows.push_back(run_case(c, pp, sk, V, warmup, steps));
          const auto& r = rows.back();
          // Check before reporting: the pipeline trains what one rank does.
          for (std::size_t i = 0; i < r.losses.size(); ++i) {
            const double want = base_losses[i];
            TESSERA_THROW_IF(std::abs(r.losses[i] - want) > 1e-4 * std::abs(want), error,
                             "pp_bench: ", r.name, " pp ", r.pp, " ", r.schedule, ": step ", i + 1,
                             " loss ", r.losses[i], " differs from pp 1's ", want);
          }
          std::printf(
              "pp_bench: %s, pp %d %s V %d: median step %.3f s, %.0f tokens/s, bubble "
              "%.1f%% traced, %.1f%% simulated, %.1f%% closed form\n",
              r.name.c_str(), r.pp, r.schedule.c_str(), r.V, r.median_s, r.tokens_per_s,
              100 * r.bubble_trace, 100 * r.bubble_sim, 100 * r.bubble_formula);
          std::fflush(stdout);
        }
    }
    std::printf("\npp_bench: %s, %d OpenMP threads shared by the stages, %lld timed steps\n\n",
                blas.c_str(), omp_get_max_threads(), (long long)steps);
    std::printf(
        "| step | pp | schedule | median step (s) | tokens/s | vs pp 1 | bubble traced | "
        "bubble simulated (traced F, B, W) | (K-1)/(M+K-1) | F / B+W per chunk (ms) | "
        "peak activations per stage (MiB) |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    nlohmann::json j;
    j["blas"] = blas;
    j["threads"] = omp_get_max_threads();
    j["steps"] = steps;
    double base = 0;
    for (const auto& r : rows) {
      if (r.pp == 1) base = r.tokens_per_s;
      std::string peaks;
      for (double m : r.peak_activation_mib)
        peaks += tessera::detail::str(peaks.empty() ? "" : " / ", static_cast<long long>(m + 0.5));
      std::printf(
          "| %s | %d | %s%s | %.3f | %.0f | %.2f | %.1f%% | %.1f%% | %.1f%% | %.1f / %.1f | %s |\n",
          r.name.c_str(), r.pp, r.pp == 1 ? "none" : r.schedule.c_str(), r.V > 1 ? " (V 2)" : "",
          r.median_s, r.tokens_per_s, r.tokens_per_s / base, 100 * r.bubble_trace,
          100 * r.bubble_sim, 100 * r.bubble_formula, r.forward_ms, r.backward_ms, peaks.c_str());
      j["cases"].push_back({{"name", r.name},
                            {"pp", r.pp},
                            {"schedule", r.schedule},
                            {"virtual_stages", r.V},
                            {"median_s", r.median_s},
                            {"tokens_per_s", r.tokens_per_s},
                            {"bubble_traced", r.bubble_trace},
                            {"bubble_simulated", r.bubble_sim},
                            {"bubble_closed_form", r.bubble_formula},
                            {"forward_ms", r.forward_ms},
                            {"backward_ms", r.backward_ms},
                            {"peak_activation_mib", r.peak_activation_mib}});
    }
    bench::write_json(json_path, j);
    std::printf("\npp_bench: wrote %s\n", json_path.c_str());
  } catch (const tessera::config_error& e) {
    std::fprintf(stderr, "pp_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pp_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
