// host_bench: host kernel and step benchmark. Prints a table and writes JSON.
//
// Measures, in one run on this machine:
//   - the best sgemm rate (square 1024..2048): the machine's GEMM peak, the
//     reference every other figure is a ratio against;
//   - linear-layer GEMMs (forward, input gradient, weight gradient) at the
//     `small` preset's shapes and at llama2_7b's (M = 256 tokens) in fp32 and
//     bf16 storage (float32 accumulation);
//   - attention forward/backward, RMSNorm, the fused LM head + cross-entropy;
//   - one optimizer step of the `small` preset (G=B=16, T=128): time,
//     tokens/s and MFU against the measured sgemm peak;
//   - memory bandwidth: STREAM copy and triad over the same OpenMP threads,
//     and the optimizer kernels (AdamW fp32, AdamW bf16 with fp32 master
//     weights, SGD with momentum) in bytes moved per second, as a fraction
//     of the copy rate (bytes per element stated in each row).
//
//   build/host/benchmarks/host_bench --json benchmarks/host_bench.json
//
// Each figure is checked before it is reported (the step's loss is finite and
// near ln(256) at initialisation).

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/core/random.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/blas.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/cross_entropy.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/optimizer.hpp"
#include "tessera/kernels/rmsnorm.hpp"
#include "tessera/nn/flops.hpp"
#include "tessera/train/trainer.hpp"

using namespace tessera;
using clk = std::chrono::steady_clock;

namespace {

// Best-of-`reps` seconds of fn (after one warm-up call).
double best_seconds(const std::function<void()>& fn, int reps) {
  fn();
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    auto t0 = clk::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(clk::now() - t0).count());
  }
  return best;
}

template <class T>
std::vector<T> random_vec(std::size_t n, std::uint64_t seed, double scale = 0.1) {
  rng r(seed);
  std::vector<T> v(n);
  for (auto& x : v) x = to<T>(scale * r.normal());
  return v;
}

struct row {
  std::string name, shape, dtype;
  double seconds, flops, rate, ratio;
};

template <class T>
void bench_linear(const kernels::host_context& ctx, std::vector<row>& rows, const std::string& tag,
                  std::int64_t M, std::int64_t N, std::int64_t K, double peak, int reps) {
  using G = accum_t<T>;
  auto x = random_vec<T>(M * K, 1), w = random_vec<T>(N * K, 2);
  std::vector<T> y(M * N);
  auto dy = random_vec<G>(M * N, 3);
  std::vector<G> dx(M * K), dw(N * K, G(0));
  const double f = 2.0 * M * N * K;
  const std::string shp = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
  auto add = [&](const char* what, double s) {
    rows.push_back({tag + " " + what, shp, dtype_name<T>(), s, f, f / s, f / s / peak});
  };
  add("fwd", best_seconds([&] { kernels::linear_forward(ctx, y.data(), x.data(), w.data(), M, N, K); }, reps));
  add("dinp", best_seconds([&] { kernels::linear_backward_input(ctx, dx.data(), dy.data(), w.data(), M, N, K); }, reps));
  add("dweight", best_seconds([&] { kernels::linear_backward_weight(ctx, dw.data(), dy.data(), x.data(), M, N, K); }, reps));
  if constexpr (std::is_same_v<T, float>) {
    if (kernels::detail::sgemm_engine() != "OpenBLAS") {  // the same calls on OpenBLAS alone
      kernels::detail::onednn_sgemm_allowed() = false;
      add("fwd, OpenBLAS", best_seconds([&] { kernels::linear_forward(ctx, y.data(), x.data(), w.data(), M, N, K); }, reps));
      add("dinp, OpenBLAS", best_seconds([&] { kernels::linear_backward_input(ctx, dx.data(), dy.data(), w.data(), M, N, K); }, reps));
      kernels::detail::onednn_sgemm_allowed() = true;
    }
  }
  if constexpr (std::is_same_v<T, bf16>) {
    if (kernels::detail::bf16_gemm_native()) {  // the same call without oneDNN, for the ratio
      kernels::detail::onednn_bf16_allowed() = false;
      add("fwd, convert + sgemm", best_seconds([&] { kernels::linear_forward(ctx, y.data(), x.data(), w.data(), M, N, K); }, reps));
      kernels::detail::onednn_bf16_allowed() = true;
    }
  }
}

struct bandwidth_row {
  std::string name;
  double bytes_per_element, seconds, bytes_per_s, of_copy;
};

// STREAM copy and triad (McCalpin) over n floats, then one optimizer step
// over n elements of each kind, best of `reps`: bytes moved per second.
std::vector<bandwidth_row> bench_bandwidth(const kernels::host_context& ctx, std::int64_t n, int reps) {
  std::vector<bandwidth_row> rows;
  auto add = [&](const std::string& name, double bpe, double s) {
    rows.push_back({name, bpe, s, bpe * static_cast<double>(n) / s, 0});
  };
  std::vector<float> a(n), b = random_vec<float>(n, 21), c = random_vec<float>(n, 22);
  float* pa = a.data();
  const float* pb = b.data();
  const float* pc = c.data();
  add("STREAM copy a = b", 8, best_seconds([&] {
#pragma omp parallel for simd schedule(static)
        for (std::int64_t i = 0; i < n; ++i) pa[i] = pb[i];
      }, reps));
  add("STREAM triad a = b + s c", 12, best_seconds([&] {
#pragma omp parallel for simd schedule(static)
        for (std::int64_t i = 0; i < n; ++i) pa[i] = pb[i] + 3.0f * pc[i];
      }, reps));
  const kernels::optimizer_segment seg{0, n, 1};
  kernels::detail::adamw_step_params<float> ap{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 1.0f};
  {
    auto p = random_vec<float>(n, 23), g = random_vec<float>(n, 24);
    std::vector<float> m(n, 0.f), v(n, 0.f);
    // reads g, p, m, v; writes p, m, v: 7 x 4 bytes
    add("AdamW fp32 (p, m, v, g)", 28, best_seconds([&] {
          kernels::adamw_step(ctx, p.data(), static_cast<float*>(nullptr), m.data(), v.data(), g.data(), n, &seg, 1, ap, static_cast<const float*>(nullptr));
        }, reps));
  }
  {
    auto master = random_vec<float>(n, 25), g = random_vec<float>(n, 26);
    std::vector<float> m(n, 0.f), v(n, 0.f);
    std::vector<bf16> p(n);
    // reads g, master, m, v (4 x 4); writes master, m, v (3 x 4) and the bf16 weight (2)
    add("AdamW bf16 weights, fp32 master", 30, best_seconds([&] {
          kernels::adamw_step(ctx, p.data(), master.data(), m.data(), v.data(), g.data(), n, &seg, 1, ap, static_cast<const float*>(nullptr));
        }, reps));
  }
  {
    auto p = random_vec<float>(n, 27), g = random_vec<float>(n, 28);
    std::vector<float> buf(n, 0.f);
    const kernels::detail::sgd_step_params<float> sp{1e-2f, 0.9f, 1e-4f, 1.0f, false};
    // reads g, p, buf; writes p, buf: 5 x 4 bytes
    add("SGD momentum fp32 (p, buf, g)", 20, best_seconds([&] {
          kernels::sgd_step(ctx, p.data(), static_cast<float*>(nullptr), buf.data(), g.data(), n, &seg, 1, sp, static_cast<const float*>(nullptr));
        }, reps));
  }
  for (auto& r : rows) r.of_copy = r.bytes_per_s / rows[0].bytes_per_s;
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string blas = kernels::check_blas_core(argv);
  // Beside the other results when run from the repository root, else here.
  std::string json_path = std::filesystem::is_directory("benchmarks") ? "benchmarks/host_bench.json" : "host_bench.json";
  int reps = 3;
  bool skip_7b = false;
  int steps = 3;
  CLI::App app{"host_bench: host GEMM, kernel and step benchmark"};
  app.add_option("--json", json_path, "where to write the JSON results")->capture_default_str();
  app.add_option("--reps", reps, "repetitions per figure (best is reported)")->capture_default_str();
  app.add_option("--steps", steps, "timed optimizer steps of the small preset")->capture_default_str();
  app.add_flag("--skip-7b", skip_7b, "skip the 7B-shape GEMMs (slow on two cores)");
  CLI11_PARSE(app, argc, argv);

  const kernels::host_context& ctx = kernels::default_host_context();
  std::vector<row> rows;
  double peak = 0;
  for (int n : {1024, 1536, 2048}) {
    double f = kernels::measure_sgemm_flops(n, reps);
    rows.push_back({"sgemm square", std::to_string(n) + "^3", "float32", 2.0 * n * n * n / f,
                    2.0 * n * n * n, f, 0});
    peak = std::max(peak, f);
  }
  for (auto& r : rows) r.ratio = r.rate / peak;

  const auto sm = nn::llama_config::small();
  const std::int64_t tokens = 16 * 128;
  bench_linear<float>(ctx, rows, "small wq", tokens, sm.dim, sm.dim, peak, reps);
  bench_linear<float>(ctx, rows, "small w_gate", tokens, sm.ffn_dim, sm.dim, peak, reps);
  bench_linear<float>(ctx, rows, "small w_down", tokens, sm.dim, sm.ffn_dim, peak, reps);
  bench_linear<bf16>(ctx, rows, "small w_gate", tokens, sm.ffn_dim, sm.dim, peak, reps);
  if (!skip_7b) {
    const auto l7 = nn::llama_config::llama2_7b();
    bench_linear<float>(ctx, rows, "7b wq", 256, l7.dim, l7.dim, peak, 1);
    bench_linear<float>(ctx, rows, "7b w_gate", 256, l7.ffn_dim, l7.dim, peak, 1);
    bench_linear<float>(ctx, rows, "7b w_down", 256, l7.dim, l7.ffn_dim, peak, 1);
    bench_linear<bf16>(ctx, rows, "7b w_gate", 256, l7.ffn_dim, l7.dim, peak, 1);
  }
  {  // attention at the small preset's shape
    const std::int64_t B = 16, S = 128, nh = sm.n_heads, nkv = sm.n_kv_heads, hd = sm.head_dim();
    auto q = random_vec<float>(B * S * nh * hd, 4, 1.0), k = random_vec<float>(B * S * nkv * hd, 5, 1.0),
         v = random_vec<float>(B * S * nkv * hd, 6, 1.0), dout = random_vec<float>(B * S * nh * hd, 7);
    std::vector<float> out(q.size()), lse(B * nh * S), dq(q.size()), dk(k.size()), dv(v.size());
    const double f_fwd = 4.0 * B * nh * hd * S * S / 2, f_bwd = 2.5 * f_fwd;
    double s = best_seconds([&] { kernels::attention_forward(ctx, out.data(), lse.data(), q.data(), k.data(), v.data(), B, S, nh, nkv, hd); }, reps);
    const std::string shp = "B16 S128 nh" + std::to_string(nh) + " nkv" + std::to_string(nkv) + " hd" + std::to_string(hd);
    rows.push_back({"attention fwd", shp, "float32", s, f_fwd, f_fwd / s, f_fwd / s / peak});
    s = best_seconds([&] { kernels::attention_backward(ctx, dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), B, S, nh, nkv, hd); }, reps);
    rows.push_back({"attention bwd", shp, "float32", s, f_bwd, f_bwd / s, f_bwd / s / peak});
  }
  {  // fused LM head + cross-entropy
    const std::int64_t B = 16, S = 128, H = sm.dim, V = sm.vocab;
    auto x = random_vec<float>(B * S * H, 8), w = random_vec<float>(V * H, 9);
    std::vector<std::int32_t> tok(B * (S + 1));  // (B, S+1) windows
    rng r(10);
    for (auto& t : tok) t = static_cast<std::int32_t>(r.next_u64() % V);
    std::vector<std::int32_t> targets(B * S);  // (B*S) row b*S+t predicts window[b][t+1]
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < S; ++t) targets[b * S + t] = tok[b * (S + 1) + t + 1];
    std::vector<float> dx(B * S * H), dw(V * H, 0.f);
    const double f = 6.0 * B * S * H * V;
    double loss_sum = 0;
    double s = best_seconds([&] { kernels::lm_head_cross_entropy(ctx, &loss_sum, x.data(), w.data(), targets.data(), B * S, V, H, -100, 1.0f / (B * S), dx.data(), dw.data(), 256); }, reps);
    rows.push_back({"lm_head+CE fwd+bwd", "B16 S128 H" + std::to_string(H) + " V" + std::to_string(V), "float32", s, f, f / s, f / s / peak});
  }
  // One optimizer step of the small preset on a synthetic token file.
  double step_s = 0, step_mfu = 0, step_tps = 0, step_loss = 0;
  {
    std::vector<std::uint32_t> toks(200000);
    rng r(11);
    for (auto& t : toks) t = static_cast<std::uint32_t>(r.next_u64() % 256);
    const auto path = std::filesystem::temp_directory_path() / "tessera_host_bench.tok";
    data::write_token_file(path, toks, 256, data::token_dtype::u16);
    data::token_file f(path);
    train::train_config tc;
    tc.steps = steps + 1;
    tc.global_batch = 16;
    tc.micro_batch = 16;
    tc.seq = 128;
    tc.eval_windows = 1;
    tc.warmup = 1;
    train::trainer<precision::fp32> tr(sm, tc, f);
    tr.set_peak_flops(peak);
    auto first = tr.train_step();  // warm-up
    step_loss = first.loss;
    step_s = 1e300;
    for (int i = 0; i < steps; ++i) {
      auto m = tr.train_step();
      if (m.seconds < step_s) {
        step_s = m.seconds;
        step_mfu = m.mfu;
        step_tps = m.tokens_per_s;
      }
    }
    std::filesystem::remove(path);
    if (!(std::abs(step_loss - std::log(256.0)) < 0.5)) {
      std::fprintf(stderr, "host_bench: step loss %.4f is not near ln(256) at init: result invalid\n", step_loss);
      return 1;
    }
    const double fl = nn::flops_per_token(sm, 128) * tokens;
    rows.push_back({"small step fp32 (fwd+bwd+adamw)", "G16 B16 T128", "float32", step_s, fl, fl / step_s, step_mfu});
  }

  const std::int64_t bw_n = 16 << 20;  // 64 MiB per float buffer: far beyond the caches
  const auto bw = bench_bandwidth(ctx, bw_n, std::max(reps, 5));

  std::printf("host_bench: %s, float GEMMs: %s\n", blas.c_str(),
              kernels::detail::sgemm_engine().c_str());
  std::printf("host_bench: %s, sgemm peak %.1f GFLOP/s, bf16 GEMMs: %s\n\n", blas.c_str(),
              peak / 1e9, kernels::detail::bf16_gemm_engine().c_str());
  std::printf("%-34s %-24s %-8s %10s %10s %8s\n", "what", "shape (MxNxK)", "dtype", "ms", "GFLOP/s", "of peak");
  nlohmann::json j;
  j["blas"] = blas;
  j["bf16_gemm"] = kernels::detail::bf16_gemm_engine();
  j["sgemm_peak_flops"] = peak;
  j["float_gemm_engine"] = kernels::detail::sgemm_engine();
  for (const auto& r : rows) {
    std::printf("%-34s %-24s %-8s %10.3f %10.1f %7.1f%%\n", r.name.c_str(), r.shape.c_str(),
                r.dtype.c_str(), r.seconds * 1e3, r.rate / 1e9, 100 * r.ratio);
    j["rows"].push_back({{"name", r.name}, {"shape", r.shape}, {"dtype", r.dtype}, {"seconds", r.seconds},
                         {"flops", r.flops}, {"flops_per_s", r.rate}, {"fraction_of_peak", r.ratio}});
  }
  std::printf("\n%-34s %10s %10s %10s %9s\n", "bandwidth (16M elements)", "B/element", "ms", "GB/s", "of copy");
  for (const auto& r : bw) {
    std::printf("%-34s %10.0f %10.3f %10.2f %8.1f%%\n", r.name.c_str(), r.bytes_per_element,
                r.seconds * 1e3, r.bytes_per_s / 1e9, 100 * r.of_copy);
    j["bandwidth"].push_back({{"name", r.name}, {"elements", bw_n}, {"bytes_per_element", r.bytes_per_element},
                              {"seconds", r.seconds}, {"bytes_per_s", r.bytes_per_s}, {"fraction_of_copy", r.of_copy}});
  }
  j["small_step"] = {{"seconds", step_s}, {"tokens_per_s", step_tps}, {"mfu", step_mfu}, {"initial_loss", step_loss}};
  std::printf("\nsmall preset step: %.3f s, %.0f tokens/s, MFU %.1f%% of measured sgemm peak\n", step_s, step_tps, 100 * step_mfu);
  {  // written to a temporary name and renamed, so a failed run leaves the old file
    const std::string tmp = json_path + ".tmp";
    {
      std::ofstream f(tmp);
      if (!(f << j.dump(2) << "\n")) {
        std::fprintf(stderr, "host_bench: error: cannot write '%s'\n", tmp.c_str());
        return 2;
      }
    }
    std::filesystem::rename(tmp, json_path);
  }
  std::printf("host_bench: wrote %s\n", json_path.c_str());
  return 0;
}
