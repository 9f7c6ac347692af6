// cuda_bench: GPU kernel benchmark. Prints a markdown table and writes JSON.
//
// Measures, in one run on one GPU (CUDA events; warm-up, then the median of
// --reps repetitions; every figure checked against a host reference on
// sampled elements before it is reported):
//   (a) the reference GEMM: cuBLASLt bf16 8192^3, float32 accumulation;
//   (b) every GEMM of a llama2_7b training step at B*T = 4096 tokens
//       (H 4096, F 11008, V 32000): forward, input gradient and weight
//       gradient of wq/wk/wv/wo, w_gate/w_up, w_down and the LM head
//       (kernels::cuda::linear_*), as TFLOP/s and a ratio to (a), and the
//       step's GEMM time (32 layers + head);
//   (c) flash attention forward and backward (B 1, S 4096, nh 32, nkv 32,
//       hd 128; kernels/cuda/attention.hpp), TFLOP/s and ratio to (a);
//   (d) the reference bandwidth: device-to-device cudaMemcpyAsync of 1 GiB,
//       counted as bytes read + bytes written;
//   (e) AdamW (kernels::cuda::adamw_step, bf16 params, float grads and
//       master/m/v, 256M elements; 30 bytes an element: read grad, master,
//       m, v 4 each, write master, m, v 4 each and param 2) and RMSNorm
//       forward/backward (N 4096 x H 4096, bf16), bytes/s and ratio to (d);
//   (f) embedding, SwiGLU and RoPE forward/backward bandwidths.
//
//   build/cuda/benchmarks/cuda_bench --json benchmarks/cuda_bench.json
//
// Without a CUDA device it prints why and exits 77 (nothing measured). Exit
// status 1 when a check failed (the JSON is still written, the failed rows
// marked), 2 for bad arguments.

#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/cuda.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/nvtx.hpp"
#include "tessera/kernels/cuda/gemm.cuh"
#include "tessera/kernels/cuda/kernels.hpp"
#include "tessera/kernels/cuda/launch.hpp"
#include "tessera/kernels/rope.hpp"
// Flash attention (kernels/cuda/attention.hpp) when the header exists; -D
// TESSERA_BENCH_ATTENTION=0 builds without it.
#if !defined(TESSERA_BENCH_ATTENTION)
#if __has_include("tessera/kernels/cuda/attention.hpp")
#define TESSERA_BENCH_ATTENTION 1
#else
#define TESSERA_BENCH_ATTENTION 0
#endif
#endif
#if TESSERA_BENCH_ATTENTION
#include "tessera/kernels/cuda/attention.hpp"
#endif

using namespace tessera;
namespace kc = tessera::kernels::cuda;

namespace {

template <class T>
double as_double(T x) {
  return static_cast<double>(static_cast<float>(x));
}

/// Waits for everything queued on the device. The set-up below uses the
/// legacy default stream (cudaMemcpy, cudaMemset), which does not order
/// with the benchmark's non-blocking stream, and a device-to-device
/// cudaMemcpy or a cudaMemset may return before it is done.
void settle() {
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- device buffers and data ----------------------------------------------------------------

/// An owning device array of n T (cudaMalloc, not the caching allocator:
/// each section frees what it used before the next one allocates).
template <class T>
struct dbuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit dbuf(std::size_t n_) : n(n_) {
    TESSERA_CUDA_CHECK(
        cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(1, n) * sizeof(T)));
  }
  ~dbuf() { (void)cudaFree(p); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  std::size_t bytes() const { return n * sizeof(T); }
  /// n elements back to the host.
  std::vector<T> to_host(std::size_t first, std::size_t count) const {
    std::vector<T> h(count);
    TESSERA_CUDA_CHECK(cudaMemcpy(h.data(), p + first, count * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  T at(std::size_t i) const { return to_host(i, 1)[0]; }
};

/// Random values repeated with period P (a prime, so the pattern does not
/// line up with any power-of-two dimension): element i is pool[i % P]. The
/// device array is filled by uploading the pool once and doubling it with
/// device-to-device copies, so large arrays cost no host time, and the host
/// knows every element for its reference checks.
template <class T>
struct pattern {
  static constexpr std::size_t P = 1000003;
  std::vector<T> pool;
  pattern(std::uint64_t seed, double lo, double hi) : pool(P) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(lo, hi);
    for (auto& x : pool) x = to<T>(u(rng));
  }
  T operator[](std::size_t i) const { return pool[i % P]; }
  void fill(dbuf<T>& d) const {
    const std::size_t first = std::min(d.n, P);
    TESSERA_CUDA_CHECK(cudaMemcpy(d.p, pool.data(), first * sizeof(T), cudaMemcpyHostToDevice));
    for (std::size_t have = first; have < d.n;) {
      const std::size_t c = std::min(have, d.n - have);
      TESSERA_CUDA_CHECK(cudaMemcpy(d.p + have, d.p, c * sizeof(T), cudaMemcpyDeviceToDevice));
      have += c;
    }
    settle();
  }
};

// ---- timing -----------------------------------------------------------------------------------

struct timing {
  double median_ms = 0, min_ms = 0;
};

/// `warmup` untimed calls, then `reps` calls each between two CUDA events
/// on `stream` (queued back to back, one host sync at the end); the median
/// and the minimum of the per-call times.
timing measure(cudaStream_t stream, int warmup, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<cuda::event> ev;
  ev.reserve(static_cast<std::size_t>(2 * reps));
  for (int i = 0; i < 2 * reps; ++i) ev.emplace_back(true);
  for (int i = 0; i < reps; ++i) {
    ev[static_cast<std::size_t>(2 * i)].record(stream);
    fn();
    ev[static_cast<std::size_t>(2 * i + 1)].record(stream);
  }
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i)
    ms.push_back(ev[static_cast<std::size_t>(2 * i + 1)].elapsed_ms_since(
        ev[static_cast<std::size_t>(2 * i)]));
  std::sort(ms.begin(), ms.end());
  const std::size_t n = ms.size();
  return {n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]), ms.front()};
}

// ---- results ------------------------------------------------------------------------------------

struct row {
  row(std::string group_, std::string name_, std::string shape_, std::string dtype_)
      : group(std::move(group_)),
        name(std::move(name_)),
        shape(std::move(shape_)),
        dtype(std::move(dtype_)) {}
  std::string group;  // reference, gemm, attention, bandwidth
  std::string name;   // e.g. "wq/wk/wv/wo fwd"
  std::string shape;  // M x N x K, or the tensor sizes
  std::string dtype;
  double ms = 0, min_ms = 0;
  double work = 0;    // FLOPs (gemm, attention) or bytes (bandwidth)
  double rate = 0;    // FLOP/s or bytes/s
  double ratio = 0;   // of the group's reference
  std::string check;  // "ok" or what failed
  nlohmann::json extra = nlohmann::json::object();
};

struct bench {
  cudaStream_t stream;
  int warmup, reps;
  std::vector<row> rows;
  int failed = 0;

  row& add(row r, const timing& t) {
    r.ms = t.median_ms;
    r.min_ms = t.min_ms;
    r.rate = r.work / (t.median_ms * 1e-3);
    if (r.check.rfind("FAILED", 0) == 0) ++failed;
    rows.push_back(std::move(r));
    return rows.back();
  }
};

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

/// "ok" when |got - want| <= tol for every sample, else the worst one.
struct checker {
  double worst = 0;
  std::string what;
  void add(double got, double want, double tol, const std::string& where) {
    const double err = std::abs(got - want);
    if (!(err <= tol) && (what.empty() || err / tol > worst)) {
      worst = std::isfinite(err / tol) ? err / tol : 1e300;
      what = where + ": got " + fmt("%.6g", got) + ", want " + fmt("%.6g", want) + " (tol " +
             fmt("%.3g", tol) + ")";
    }
  }
  std::string result() const { return what.empty() ? "ok" : "FAILED " + what; }
};

// ---- (a), (b): GEMMs ---------------------------------------------------------------------------

constexpr double bf16_eps = 1.0 / 256;  // one bf16 rounding of the output, either neighbour

/// linear_forward, linear_backward_input and linear_backward_weight of a
/// layer with weight (N, K) on M tokens (only the forward when
/// `forward_only`): rows appended, ratios to `ref` (1 when ref is 0).
/// `count`: how many such layers a transformer block has (0: once a step).
void bench_linear(bench& b, kc::cublaslt_context& ctx, const std::string& name, std::int64_t M,
                  std::int64_t N, std::int64_t K, double ref, int count, std::uint64_t seed,
                  bool forward_only = false) {
  TESSERA_NVTX_RANGE("cuda_bench: gemm ", name);
  const pattern<bf16> pa(seed, -1, 1), pw(seed + 1, -1, 1), pd(seed + 2, -1, 1);
  dbuf<bf16> inp(static_cast<std::size_t>(M * K)), w(static_cast<std::size_t>(N * K)),
      dout(static_cast<std::size_t>(M * N)), out(static_cast<std::size_t>(M * N)),
      dinp(static_cast<std::size_t>(M * K));
  dbuf<float> dw(static_cast<std::size_t>(N * K));
  pa.fill(inp);
  pw.fill(w);
  pd.fill(dout);
  TESSERA_CUDA_CHECK(cudaMemset(dw.p, 0, dw.bytes()));
  settle();
  const std::string dims = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
  // One call each, checked on sampled elements against float64.
  kc::linear_forward<bf16>(ctx, out.p, inp.p, w.p, M, N, K, b.stream);
  kc::linear_backward_input<bf16>(ctx, dinp.p, dout.p, w.p, M, N, K, b.stream);
  kc::linear_backward_weight(ctx, dw.p, dout.p, inp.p, M, N, K, b.stream);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(b.stream));
  std::mt19937_64 rng(seed + 3);
  checker cf, ci, cw;
  for (int s = 0; s < 6; ++s) {
    const auto m = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(M));
    const auto n = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(N));
    const auto k = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(K));
    double f = 0, fa = 0, di = 0, dia = 0, dwv = 0, dwa = 0;
    for (std::int64_t j = 0; j < K; ++j) {  // out[m, n] = sum_j inp[m, j] w[n, j]
      const double t = as_double(pa[static_cast<std::size_t>(m * K + j)]) *
                       as_double(pw[static_cast<std::size_t>(n * K + j)]);
      f += t;
      fa += std::abs(t);
    }
    for (std::int64_t j = 0; j < N; ++j) {  // dinp[m, k] = sum_j dout[m, j] w[j, k]
      const double t = as_double(pd[static_cast<std::size_t>(m * N + j)]) *
                       as_double(pw[static_cast<std::size_t>(j * K + k)]);
      di += t;
      dia += std::abs(t);
    }
    for (std::int64_t j = 0; j < M; ++j) {  // dw[n, k] = sum_j dout[j, n] inp[j, k]
      const double t = as_double(pd[static_cast<std::size_t>(j * N + n)]) *
                       as_double(pa[static_cast<std::size_t>(j * K + k)]);
      dwv += t;
      dwa += std::abs(t);
    }
    // float32 accumulation: 1e-5 of sum |a b| covers any order; bf16 output: 2^-8.
    cf.add(as_double(out.at(static_cast<std::size_t>(m * N + n))), f,
           1e-5 * fa + bf16_eps * std::abs(f), "out");
    ci.add(as_double(dinp.at(static_cast<std::size_t>(m * K + k))), di,
           1e-5 * dia + bf16_eps * std::abs(di), "dinp");
    cw.add(dw.at(static_cast<std::size_t>(n * K + k)), dwv, 1e-5 * dwa, "dweight");
  }
  const double flops =
      2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  auto add = [&](const char* pass, const std::string& shape, const char* dtype, const checker& c,
                 const std::function<void()>& fn) {
    row r{"gemm", name + " " + pass, shape, dtype};
    r.work = flops;
    r.check = c.result();
    r.extra = {{"M", M}, {"N", N}, {"K", K}, {"pass", pass}, {"per_layer", count}};
    row& x = b.add(std::move(r), measure(b.stream, b.warmup, b.reps, fn));
    x.ratio = ref > 0 ? x.rate / ref : 1.0;
  };
  add("fwd", dims, "bf16 -> bf16", cf,
      [&] { kc::linear_forward<bf16>(ctx, out.p, inp.p, w.p, M, N, K, b.stream); });
  if (forward_only) return;
  add("dinp", std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N), "bf16 -> bf16",
      ci, [&] { kc::linear_backward_input<bf16>(ctx, dinp.p, dout.p, w.p, M, N, K, b.stream); });
  add("dweight", std::to_string(N) + "x" + std::to_string(K) + "x" + std::to_string(M),
      "bf16 -> f32 (+=)", cw,
      [&] { kc::linear_backward_weight(ctx, dw.p, dout.p, inp.p, M, N, K, b.stream); });
}


/// cuBLASLt's FP8 matmul at the reference's shape (M = N = K = 8192, the
/// linear forward's layout C = A B^T): E4M3 x E4M3 -> bf16, float32
/// accumulation (no fast accumulation), unit inverse scales read from device
/// memory, as the FP8 linear layers call it; checked on sampled elements
/// against float64 of the FP8 values; its rate as a ratio of the bf16 GEMM
/// `ref` (Hopper's dense FP8 peak is twice its bf16 peak).
void bench_fp8_gemm(bench& b, kc::cublaslt_context& ctx, double ref) {
  TESSERA_NVTX_RANGE("cuda_bench: fp8 gemm");
  const std::int64_t M = 8192, N = 8192, K = 8192;
  const pattern<fp8_e4m3> pa(31, -2, 2), pw(32, -2, 2);
  dbuf<fp8_e4m3> a(static_cast<std::size_t>(M * K)), w(static_cast<std::size_t>(N * K));
  dbuf<bf16> out(static_cast<std::size_t>(M * N));
  dbuf<float> one(2);
  pa.fill(a);
  pw.fill(w);
  const float ones[2] = {1.0f, 1.0f};
  TESSERA_CUDA_CHECK(cudaMemcpy(one.p, ones, sizeof ones, cudaMemcpyHostToDevice));
  row r{"reference", "cuBLASLt FP8 GEMM 8192^3 (E4M3, f32 accumulate)",
        "8192x8192x8192", "fp8_e4m3 -> bf16"};
  r.work = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  auto run = [&] {
    ctx.gemm_fp8(M, N, K, a.p, K, one.p, w.p, K, one.p + 1, 0.0f, out.p, N, b.stream);
  };
  try {
    run();
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(b.stream));
  } catch (const std::exception& e) {  // no FP8 tensor cores (before sm_89): say so, go on
    std::printf("cuda_bench: FP8 GEMM not measured: %s\n", e.what());
    return;
  }
  std::mt19937_64 rng(33);
  checker c;
  for (int s = 0; s < 6; ++s) {
    const auto m = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(M));
    const auto n = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(N));
    double f = 0, fa = 0;
    for (std::int64_t j = 0; j < K; ++j) {
      const double t = as_double(pa[static_cast<std::size_t>(m * K + j)]) *
                       as_double(pw[static_cast<std::size_t>(n * K + j)]);
      f += t;
      fa += std::abs(t);
    }
    c.add(as_double(out.at(static_cast<std::size_t>(m * N + n))), f,
          1e-5 * fa + bf16_eps * std::abs(f), "out");
  }
  r.check = c.result();
  r.extra = {{"M", M}, {"N", N}, {"K", K}, {"of", "the bf16 reference GEMM"}};
  row& x = b.add(std::move(r), measure(b.stream, b.warmup, b.reps, run));
  x.ratio = ref > 0 ? x.rate / ref : 1.0;
}
// ---- (c): attention ----------------------------------------------------------------------------

#if TESSERA_BENCH_ATTENTION
void bench_attention(bench& b, double ref) {
  TESSERA_NVTX_RANGE("cuda_bench: attention");
  const std::int64_t B = 1, S = 4096, nh = 32, nkv = 32, hd = 128;
  const std::size_t nq = static_cast<std::size_t>(B * S * nh * hd),
                    nk = static_cast<std::size_t>(B * S * nkv * hd);
  const pattern<bf16> pq(41, -2, 2), pk(42, -2, 2), pv(43, -1, 1), pd(44, -1, 1);
  dbuf<bf16> q(nq), k(nk), v(nk), out(nq), dout(nq), dq(nq), dk(nk), dv(nk);
  dbuf<float> lse(static_cast<std::size_t>(B * nh * S));
  pq.fill(q);
  pk.fill(k);
  pv.fill(v);
  pd.fill(dout);
  const std::size_t scratch_bytes = kc::flash_attention_backward_scratch_bytes(B, S, nh, nkv, hd);
  dbuf<unsigned char> scratch(scratch_bytes);
  kc::flash_attention_forward(out.p, lse.p, q.p, k.p, v.p, B, S, nh, nkv, hd, b.stream);
  kc::flash_attention_backward(dq.p, dk.p, dv.p, dout.p, q.p, k.p, v.p, out.p, lse.p, B, S, nh, nkv,
                               hd, scratch.p, scratch_bytes, b.stream);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(b.stream));
  // Reference rows (b = 0): query t of head h attends to keys 0..t of head h
  // (nkv == nh). out row, lse, and the dq row, in float64 from the same
  // bf16 inputs; P and dS are rounded to bf16 on the GPU, so the bound is
  // 2^-6 of the row's largest magnitude.
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  auto at = [&](const pattern<bf16>& p, std::int64_t t, std::int64_t h, std::int64_t d) {
    return as_double(p[static_cast<std::size_t>((t * nh + h) * hd + d)]);
  };
  checker cf, cb;
  const std::pair<std::int64_t, std::int64_t> samples[] = {
      {0, 0}, {777, 5}, {4095, 31}, {2048, 17}};
  for (const auto& [t, h] : samples) {
    std::vector<double> sc(static_cast<std::size_t>(t + 1));
    double mx = -1e300;
    for (std::int64_t s = 0; s <= t; ++s) {
      double x = 0;
      for (std::int64_t d = 0; d < hd; ++d) x += at(pq, t, h, d) * at(pk, s, h, d);
      sc[static_cast<std::size_t>(s)] = x * scale;
      mx = std::max(mx, x * scale);
    }
    double z = 0;
    for (double& x : sc) z += (x = std::exp(x - mx));
    const double lse_ref = mx + std::log(z);
    std::vector<double> o(static_cast<std::size_t>(hd), 0.0),
        dq_ref(static_cast<std::size_t>(hd), 0.0);
    for (std::int64_t s = 0; s <= t; ++s)
      for (std::int64_t d = 0; d < hd; ++d)
        o[static_cast<std::size_t>(d)] += sc[static_cast<std::size_t>(s)] / z * at(pv, s, h, d);
    const auto got_o =
        out.to_host(static_cast<std::size_t>((t * nh + h) * hd), static_cast<std::size_t>(hd));
    double omax = 0;
    for (double x : o) omax = std::max(omax, std::abs(x));
    for (std::int64_t d = 0; d < hd; ++d)
      cf.add(as_double(got_o[static_cast<std::size_t>(d)]), o[static_cast<std::size_t>(d)],
             omax / 64 + 1e-6, "out");
    cf.add(lse.at(static_cast<std::size_t>(h * S + t)), lse_ref,
           1e-3 * std::max(1.0, std::abs(lse_ref)), "lse");
    // dq_t = scale sum_s P_ts (dP_ts - D_t) k_s, dP_ts = dout_t . v_s, D_t = dout_t . out_t
    double Dt = 0;
    for (std::int64_t d = 0; d < hd; ++d) Dt += at(pd, t, h, d) * o[static_cast<std::size_t>(d)];
    for (std::int64_t s = 0; s <= t; ++s) {
      double dp = 0;
      for (std::int64_t d = 0; d < hd; ++d) dp += at(pd, t, h, d) * at(pv, s, h, d);
      const double ds = sc[static_cast<std::size_t>(s)] / z * (dp - Dt);
      for (std::int64_t d = 0; d < hd; ++d)
        dq_ref[static_cast<std::size_t>(d)] += scale * ds * at(pk, s, h, d);
    }
    const auto got_dq =
        dq.to_host(static_cast<std::size_t>((t * nh + h) * hd), static_cast<std::size_t>(hd));
    double dmax = 0;
    for (double x : dq_ref) dmax = std::max(dmax, std::abs(x));
    for (std::int64_t d = 0; d < hd; ++d)
      cb.add(as_double(got_dq[static_cast<std::size_t>(d)]), dq_ref[static_cast<std::size_t>(d)],
             dmax / 32 + 1e-4, "dq");
  }
  const std::string shape = "B1 S4096 nh32 nkv32 hd128 causal";
  const nlohmann::json dims = {{"B", B}, {"S", S}, {"nh", nh}, {"nkv", nkv}, {"hd", hd}};
  row f{"attention", "flash attention fwd", shape, "bf16"};
  f.work = kc::flash_attention_forward_flops(B, S, nh, hd);
  f.check = cf.result();
  f.extra = dims;
  row& rf =
      b.add(std::move(f), measure(b.stream, b.warmup, b.reps, [&] {
              kc::flash_attention_forward(out.p, lse.p, q.p, k.p, v.p, B, S, nh, nkv, hd, b.stream);
            }));
  rf.ratio = rf.rate / ref;
  row bw{"attention", "flash attention bwd", shape, "bf16"};
  bw.work = kc::flash_attention_backward_flops(B, S, nh, hd);
  bw.check = cb.result();
  bw.extra = dims;
  row& rb =
      b.add(std::move(bw), measure(b.stream, b.warmup, b.reps, [&] {
              kc::flash_attention_backward(dq.p, dk.p, dv.p, dout.p, q.p, k.p, v.p, out.p, lse.p, B,
                                           S, nh, nkv, hd, scratch.p, scratch_bytes, b.stream);
            }));
  rb.ratio = rb.rate / ref;
}
#endif

// ---- (d), (e), (f): bandwidth ------------------------------------------------------------------

double bench_copy(bench& b, std::size_t bytes) {
  TESSERA_NVTX_RANGE("cuda_bench: copy");
  dbuf<unsigned char> src(bytes), dst(bytes);
  TESSERA_CUDA_CHECK(cudaMemset(src.p, 0x5A, bytes));
  TESSERA_CUDA_CHECK(cudaMemset(dst.p, 0, bytes));
  settle();
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, b.stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(b.stream));
  checker c;
  for (std::size_t i : {std::size_t(0), bytes / 3, bytes - 1}) c.add(dst.at(i), 0x5A, 0, "byte");
  row r{"bandwidth", "copy D2D (reference)",
        fmt("%.0f MiB", static_cast<double>(bytes) / (1 << 20)), "bytes"};
  r.work = 2.0 * static_cast<double>(bytes);  // read + write
  r.check = c.result();
  r.extra = {{"bytes_copied", bytes}, {"bytes_per_element", 2}};
  row& x = b.add(std::move(r), measure(b.stream, b.warmup, b.reps, [&] {
                   TESSERA_CUDA_CHECK(
                       cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, b.stream));
                 }));
  x.ratio = 1.0;
  return x.rate;
}

void bench_adamw(bench& b, std::int64_t n, double ref) {
  TESSERA_NVTX_RANGE("cuda_bench: adamw");
  const auto un = static_cast<std::size_t>(n);
  dbuf<bf16> params(un);
  dbuf<float> master(un), m(un), v(un), grads(un);
  const pattern<float> pm(51, -1, 1), pmo(52, -1e-3, 1e-3), pv(53, 0, 1e-6), pg(54, -1e-2, 1e-2);
  pm.fill(master);
  pmo.fill(m);
  pv.fill(v);
  pg.fill(grads);
  const kc::optimizer_segment seg{0, n, 1};
  dbuf<kc::optimizer_segment> d_seg(1);
  TESSERA_CUDA_CHECK(cudaMemcpy(d_seg.p, &seg, sizeof seg, cudaMemcpyHostToDevice));
  settle();
  const kernels::detail::adamw_step_params<float> sp{1e-4f, 0.9f,     0.95f,     1e-8f,
                                                     0.1f,  1 - 0.9f, 1 - 0.95f, 1.0f};
  auto step = [&] {
    kc::adamw_step<bf16, float>(params.p, master.p, m.p, v.p, grads.p, n, d_seg.p, 1, sp, nullptr,
                                b.stream);
  };
  step();
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(b.stream));
  checker c;
  for (std::size_t i : {std::size_t(0), un / 7, un / 2 + 3, un - 1}) {
    float p = pm[i], mm = pmo[i], vv = pv[i];
    kernels::detail::adamw_update<float>(p, mm, vv, pg[i], sp, true);
    c.add(master.at(i), p, 1e-6 * std::abs(p) + 1e-12, "master");
    c.add(m.at(i), mm, 1e-6 * std::abs(mm) + 1e-12, "m");
    c.add(v.at(i), vv, 1e-6 * std::abs(vv) + 1e-18, "v");
    c.add(as_double(params.at(i)), p, bf16_eps * std::abs(p), "param");
  }
  row r{"bandwidth", "adamw step", std::to_string(n) + " elements",
        "bf16 param, f32 grad/master/m/v"};
  r.work = 30.0 * static_cast<double>(n);
  r.check = c.result();
  r.extra = {
      {"elements", n},
      {"bytes_per_element", 30},
      {"bytes_note", "read grad 4 + master 4 + m 4 + v 4, write master 4 + m 4 + v 4 + param 2"}};
  row& x = b.add(std::move(r), measure(b.stream, b.warmup, b.reps, step));
  x.ratio = x.rate / ref;
}

void bench_rmsnorm(bench& b, double ref) {
  TESSERA_NVTX_RANGE("cuda_bench: rmsnorm");
  const std::int64_t N = 4096, H = 4096;
  const auto nh = static_cast<std::size_t>(N * H);
  const pattern<bf16> px(61, -2, 2), pw(62, 0.5, 1.5), pd(63, -1, 1);
  dbuf<bf16> x(nh), w(static_cast<std::size_t>(H)), out(nh), dout(nh), dinp(nh);
  dbuf<float> rstd(static_cast<std::size_t>(N)), dw(static_cast<std::size_t>(H));
  px.fill(x);
  pw.fill(w);
  pd.fill(dout);
  TESSERA_CUDA_CHECK(cudaMemset(dw.p, 0, dw.bytes()));
  settle();
  const std::size_t scratch_bytes = kc::rmsnorm_backward_scratch_bytes(N, H);
  dbuf<unsigned char> scratch(scratch_bytes);
  const double eps = 1e-5;
  kc::rmsnorm_forward<bf16>(out.p, rstd.p, x.p, w.p, N, H, eps, b.stream);
  kc::rmsnorm_backward<bf16, bf16>(dinp.p, dw.p, dout.p, x.p, w.p, rstd.p, N, H, scratch.p,
                                   scratch_bytes, b.stream);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(b.stream));
  checker cf, cb;
  for (std::int64_t n : {std::int64_t(0), std::int64_t(1234), N - 1}) {
    double ss = 0;
    for (std::int64_t h = 0; h < H; ++h)
      ss += std::pow(as_double(px[static_cast<std::size_t>(n * H + h)]), 2);
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(H) + eps);
    double dot = 0;  // mean_h(w dout xhat)
    for (std::int64_t h = 0; h < H; ++h)
      dot += as_double(pw[static_cast<std::size_t>(h)]) *
             as_double(pd[static_cast<std::size_t>(n * H + h)]) *
             as_double(px[static_cast<std::size_t>(n * H + h)]) * r;
    dot /= static_cast<double>(H);
    cf.add(rstd.at(static_cast<std::size_t>(n)), r, 1e-5 * r, "rstd");
    const auto o = out.to_host(static_cast<std::size_t>(n * H), static_cast<std::size_t>(H));
    const auto di = dinp.to_host(static_cast<std::size_t>(n * H), static_cast<std::size_t>(H));
    for (std::int64_t h = 0; h < H; h += 511) {
      const double xv = as_double(px[static_cast<std::size_t>(n * H + h)]);
      const double want = as_double(pw[static_cast<std::size_t>(h)]) * xv * r;
      cf.add(as_double(o[static_cast<std::size_t>(h)]), want, bf16_eps * std::abs(want) + 1e-6,
             "out");
      const double wd = as_double(pw[static_cast<std::size_t>(h)]) *
                        as_double(pd[static_cast<std::size_t>(n * H + h)]);
      const double dwant = r * (wd - xv * r * dot);
      cb.add(as_double(di[static_cast<std::size_t>(h)]), dwant,
             bf16_eps * std::abs(dwant) + 1e-3 * r, "dinp");
    }
  }
  const std::string shape = "N4096 x H4096";
  row f{"bandwidth", "rmsnorm fwd", shape, "bf16"};
  // read x, write out (bf16); read weight; write rstd (f32)
  f.work = 2.0 * 2 * static_cast<double>(nh) + 2.0 * H + 4.0 * N;
  f.check = cf.result();
  f.extra = {{"bytes_note", "read x 2NH + weight 2H, write out 2NH + rstd 4N"}};
  row& rf = b.add(std::move(f), measure(b.stream, b.warmup, b.reps, [&] {
                    kc::rmsnorm_forward<bf16>(out.p, rstd.p, x.p, w.p, N, H, eps, b.stream);
                  }));
  rf.ratio = rf.rate / ref;
  row bw{"bandwidth", "rmsnorm bwd", shape, "bf16 (dinp bf16, dweight f32 +=)"};
  // read x, dout (bf16), weight, rstd; write dinp; partial dweight sums
  // written and read once (scratch), dweight read and written.
  bw.work = 3.0 * 2 * static_cast<double>(nh) + 2.0 * H + 4.0 * N +
            2.0 * static_cast<double>(scratch_bytes) + 8.0 * H;
  bw.check = cb.result();
  bw.extra = {{"bytes_note",
               "read x, dout 2NH each + weight + rstd, write dinp 2NH, scratch written+read, "
               "dweight read+written"}};
  row& rb = b.add(std::move(bw), measure(b.stream, b.warmup, b.reps, [&] {
                    kc::rmsnorm_backward<bf16, bf16>(dinp.p, dw.p, dout.p, x.p, w.p, rstd.p, N, H,
                                                     scratch.p, scratch_bytes, b.stream);
                  }));
  rb.ratio = rb.rate / ref;
}

/// (f): embedding, SwiGLU, RoPE at the 7B shapes (4096 tokens).
void bench_bonus(bench& b, double ref) {
  TESSERA_NVTX_RANGE("cuda_bench: embedding, swiglu, rope");
  const std::int64_t N = 4096, H = 4096, V = 32000, F = 11008, nh = 32, hd = 128;
  auto finish = [&](row r, const std::function<void()>& fn) {
    row& x = b.add(std::move(r), measure(b.stream, b.warmup, b.reps, fn));
    x.ratio = x.rate / ref;
  };
  {  // embedding
    const pattern<bf16> pw(71, -1, 1), pd(72, -1, 1);
    dbuf<bf16> wte(static_cast<std::size_t>(V * H)), out(static_cast<std::size_t>(N * H)),
        dout(static_cast<std::size_t>(N * H));
    dbuf<float> dwte(static_cast<std::size_t>(V * H));
    dbuf<std::int32_t> tok(static_cast<std::size_t>(N));
    pw.fill(wte);
    pd.fill(dout);
    TESSERA_CUDA_CHECK(cudaMemset(dwte.p, 0, dwte.bytes()));
    std::vector<std::int32_t> h_tok(static_cast<std::size_t>(N));
    std::mt19937_64 rng(73);
    for (auto& t : h_tok) t = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(V));
    TESSERA_CUDA_CHECK(cudaMemcpy(tok.p, h_tok.data(), h_tok.size() * 4, cudaMemcpyHostToDevice));
    settle();
    kc::embedding_forward<bf16>(out.p, tok.p, wte.p, N, V, H, b.stream);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(b.stream));
    checker c;
    for (std::int64_t n : {std::int64_t(0), std::int64_t(2000), N - 1})
      for (std::int64_t h : {std::int64_t(0), H / 2, H - 1})
        c.add(as_double(out.at(static_cast<std::size_t>(n * H + h))),
              as_double(pw[static_cast<std::size_t>(h_tok[static_cast<std::size_t>(n)] * H + h)]),
              0, "row copy");
    std::vector<std::int32_t> uniq = h_tok;
    std::sort(uniq.begin(), uniq.end());
    const auto rows = static_cast<double>(std::unique(uniq.begin(), uniq.end()) - uniq.begin());
    row f{"bandwidth", "embedding fwd", "N4096 V32000 H4096", "bf16"};
    f.work = 4.0 * N + 2.0 * 2 * static_cast<double>(N * H);
    f.check = c.result();
    f.extra = {{"bytes_note", "read ids 4N, rows 2NH, write 2NH"}};
    finish(std::move(f),
           [&] { kc::embedding_forward<bf16>(out.p, tok.p, wte.p, N, V, H, b.stream); });
    row bw{"bandwidth", "embedding bwd", "N4096 V32000 H4096", "bf16 dout, f32 dwte +="};
    bw.work = 2.0 * static_cast<double>(N * H) + 8.0 * rows * static_cast<double>(H);
    bw.check = "not checked here (bit-exact against the host in tests/cuda/kernels.cpp)";
    bw.extra = {{"bytes_note",
                 "read dout 2NH, read+write the touched dwte rows 8 H each (ids re-read per block "
                 "not counted)"},
                {"distinct_rows", rows}};
    finish(std::move(bw),
           [&] { kc::embedding_backward<bf16>(dwte.p, dout.p, tok.p, N, V, H, b.stream); });
  }
  {  // SwiGLU on (N, F)
    const auto n = static_cast<std::size_t>(N * F);
    const pattern<bf16> pg(81, -3, 3), pu(82, -1, 1), pd(83, -1, 1);
    dbuf<bf16> g(n), u(n), out(n), dout(n), dg(n), du(n);
    pg.fill(g);
    pu.fill(u);
    pd.fill(dout);
    kc::swiglu_forward<bf16>(out.p, g.p, u.p, static_cast<std::int64_t>(n), b.stream);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(b.stream));
    checker c;
    for (std::size_t i : {std::size_t(0), n / 3, n - 1}) {
      const double gv = as_double(pg[i]), want = gv / (1 + std::exp(-gv)) * as_double(pu[i]);
      c.add(as_double(out.at(i)), want, bf16_eps * std::abs(want) + 1e-6, "out");
    }
    row f{"bandwidth", "swiglu fwd", "N4096 x F11008", "bf16"};
    f.work = 3.0 * 2 * static_cast<double>(n);
    f.check = c.result();
    f.extra = {{"bytes_note", "read gate, up, write out: 2 bytes each"}};
    finish(std::move(f), [&] {
      kc::swiglu_forward<bf16>(out.p, g.p, u.p, static_cast<std::int64_t>(n), b.stream);
    });
    row bw{"bandwidth", "swiglu bwd", "N4096 x F11008", "bf16"};
    bw.work = 5.0 * 2 * static_cast<double>(n);
    bw.check = "not checked here (tests/cuda/kernels.cpp)";
    bw.extra = {{"bytes_note", "read dout, gate, up, write dgate, dup: 2 bytes each"}};
    finish(std::move(bw), [&] {
      kc::swiglu_backward<bf16, bf16>(dg.p, du.p, dout.p, g.p, u.p, static_cast<std::int64_t>(n),
                                      b.stream);
    });
  }
  {  // RoPE, in place on q (B 1, T 4096, nh 32, hd 128)
    const auto n = static_cast<std::size_t>(N * nh * hd);
    const pattern<bf16> px(91, -1, 1);
    dbuf<bf16> x(n);
    px.fill(x);
    std::vector<float> c(static_cast<std::size_t>(N * hd / 2)), s(c.size());
    kernels::rope_table(c.data(), s.data(), N, hd, 10000.0);
    dbuf<float> dc(c.size()), ds(s.size());
    TESSERA_CUDA_CHECK(cudaMemcpy(dc.p, c.data(), dc.bytes(), cudaMemcpyHostToDevice));
    TESSERA_CUDA_CHECK(cudaMemcpy(ds.p, s.data(), ds.bytes(), cudaMemcpyHostToDevice));
    settle();
    kc::rope_forward<bf16>(x.p, dc.p, ds.p, 1, N, nh, hd, b.stream);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(b.stream));
    checker ck;
    for (std::int64_t t : {std::int64_t(0), std::int64_t(1000), N - 1}) {
      const std::int64_t h = 7, i = 5;  // pair (i, i + hd/2) of head h at position t
      const std::size_t base = static_cast<std::size_t>((t * nh + h) * hd);
      const double x1 = as_double(px[base + static_cast<std::size_t>(i)]),
                   x2 = as_double(px[base + static_cast<std::size_t>(i + hd / 2)]);
      const double cs = c[static_cast<std::size_t>(t * hd / 2 + i)],
                   sn = s[static_cast<std::size_t>(t * hd / 2 + i)];
      const double y1 = x1 * cs - x2 * sn;
      ck.add(as_double(x.at(base + static_cast<std::size_t>(i))), y1,
             bf16_eps * std::abs(y1) + 1e-6, "y1");
    }
    row f{"bandwidth", "rope fwd (in place)", "B1 T4096 nh32 hd128", "bf16"};
    f.work = 2.0 * 2 * static_cast<double>(n);
    f.check = ck.result();
    f.extra = {{"bytes_note", "read and write x, 2 bytes each (tables stay in L2)"}};
    finish(std::move(f), [&] { kc::rope_forward<bf16>(x.p, dc.p, ds.p, 1, N, nh, hd, b.stream); });
    row bw{"bandwidth", "rope bwd (in place)", "B1 T4096 nh32 hd128", "bf16"};
    bw.work = 2.0 * 2 * static_cast<double>(n);
    bw.check = "not checked here (tests/cuda/kernels.cpp)";
    bw.extra = f.extra;
    finish(std::move(bw),
           [&] { kc::rope_backward<bf16>(x.p, dc.p, ds.p, 1, N, nh, hd, b.stream); });
  }
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path = "benchmarks/cuda_bench.json";
  int reps = 20, warmup = 3, device = 0;
  std::int64_t adamw_elements = std::int64_t(256) << 20;
  std::int64_t copy_mib = 1024;
  CLI::App app{"cuda_bench: GPU GEMM, attention and bandwidth benchmark (llama2_7b shapes)"};
  app.add_option("--json", json_path, "where to write the JSON results")->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions per figure (the median is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  app.add_option("--warmup", warmup, "untimed calls before each figure")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("--adamw-elements", adamw_elements, "AdamW elements (30 bytes each)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 34));
  app.add_option("--copy-mib", copy_mib, "bytes of the reference D2D copy, MiB")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 20));
  app.add_option("--device", device, "CUDA device index")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& pe) {
    return app.exit(pe) == 0 ? 0 : 2;  // --help: 0; a bad argument: 2
  }

  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf(
        "cuda_bench: SKIPPED: no CUDA device (cudaGetDeviceCount: %s, %d devices); nothing "
        "measured\n",
        e == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(e), count);
    return 77;
  }
  if (device < 0 || device >= count) {
    std::fprintf(stderr, "cuda_bench: --device %d is outside [0, %d)\n", device, count);
    return 2;
  }
  try {
    TESSERA_CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop{};
    TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    int driver = 0, runtime = 0;
    TESSERA_CUDA_CHECK(cudaDriverGetVersion(&driver));
    TESSERA_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    cuda::stream stream;
    bench b{stream.get(), warmup, reps, {}, 0};
    kc::cublaslt_context ctx;

    // (a) reference GEMM
    double ref_flops = 0;
    {
      TESSERA_NVTX_RANGE("cuda_bench: reference gemm");
      // linear_forward's layout (C = A B^T), bf16 in and out, f32 accumulation
      bench_linear(b, ctx, "cuBLASLt bf16 GEMM", 8192, 8192, 8192, 0, 0, 11, true);
      row& ref = b.rows.back();
      ref.group = "reference";
      ref.name = "cuBLASLt bf16 GEMM 8192^3 (f32 accumulate)";
      ref.ratio = 1.0;
      ref_flops = ref.rate;
    }
    bench_fp8_gemm(b, ctx, ref_flops);  // FP8 beside it (precision::fp8_mixed's GEMMs)
    // (b) the GEMMs of a llama2_7b step, 4096 tokens
    const std::int64_t M = 4096, H = 4096, F = 11008, V = 32000, L = 32;
    bench_linear(b, ctx, "wq/wk/wv/wo", M, H, H, ref_flops, 4, 21);
    bench_linear(b, ctx, "w_gate/w_up", M, F, H, ref_flops, 2, 22);
    bench_linear(b, ctx, "w_down", M, H, F, ref_flops, 1, 23);
    bench_linear(b, ctx, "lm_head", M, V, H, ref_flops, 0, 24);
    double step_ms = 0, step_flops = 0;
    for (const row& r : b.rows) {
      if (r.group != "gemm") continue;
      const int per_layer = r.extra.at("per_layer").get<int>();
      const double times = per_layer > 0 ? static_cast<double>(per_layer * L) : 1.0;
      step_ms += times * r.ms;
      step_flops += times * r.work;
    }
    // (c) attention
#if TESSERA_BENCH_ATTENTION
    bench_attention(b, ref_flops);
#else
    std::printf(
        "cuda_bench: kernels/cuda/attention.hpp not found at build time: attention not measured\n");
#endif
    // (d) reference bandwidth, (e) AdamW and RMSNorm, (f) the rest
    const double copy_rate = bench_copy(b, static_cast<std::size_t>(copy_mib) << 20);
    bench_adamw(b, adamw_elements, copy_rate);
    bench_rmsnorm(b, copy_rate);
    bench_bonus(b, copy_rate);

    // ---- report ----
    std::printf(
        "cuda_bench: %s (sm_%d%d, %d SMs, %.1f GiB), driver %d, runtime %d; median of %d after %d "
        "warm-up\n\n",
        prop.name, prop.major, prop.minor, prop.multiProcessorCount,
        static_cast<double>(prop.totalGlobalMem) / (1u << 30), driver, runtime, reps, warmup);
    std::printf("| group | what | shape | dtype | ms | rate | of reference | check |\n");
    std::printf("|---|---|---|---|---:|---:|---:|---|\n");
    nlohmann::json j;
    j["schema"] = "tessera.cuda_bench/1";
    j["date"] = now_utc();
    j["device"] = {{"index", device},
                   {"name", prop.name},
                   {"sm", std::to_string(prop.major) + std::to_string(prop.minor)},
                   {"multiprocessors", prop.multiProcessorCount},
                   {"memory_bytes", prop.totalGlobalMem},
                   {"driver_version", driver},
                   {"runtime_version", runtime}};
    j["settings"] = {{"warmup", warmup},
                     {"reps", reps},
                     {"statistic", "median of reps (CUDA events)"},
                     {"adamw_elements", adamw_elements},
                     {"copy_bytes", copy_mib << 20}};
    double gemm_min = 1e300, gemm_max = 0;
    nlohmann::json rows = nlohmann::json::array();
    for (const row& r : b.rows) {
      const bool flops = r.group != "bandwidth";
      std::printf("| %s | %s | %s | %s | %.3f | %.1f %s | %.1f%% | %s |\n", r.group.c_str(),
                  r.name.c_str(), r.shape.c_str(), r.dtype.c_str(), r.ms,
                  flops ? r.rate / 1e12 : r.rate / 1e9, flops ? "TFLOP/s" : "GB/s", 100 * r.ratio,
                  r.check.c_str());
      nlohmann::json x = {{"group", r.group},
                          {"name", r.name},
                          {"shape", r.shape},
                          {"dtype", r.dtype},
                          {"ms", r.ms},
                          {"min_ms", r.min_ms},
                          {flops ? "flops" : "bytes", r.work},
                          {flops ? "flops_per_s" : "bytes_per_s", r.rate},
                          {"ratio", r.ratio},
                          {"check", r.check}};
      for (auto it = r.extra.begin(); it != r.extra.end(); ++it) x[it.key()] = it.value();
      rows.push_back(x);
      if (r.group == "gemm") {
        gemm_min = std::min(gemm_min, r.ratio);
        gemm_max = std::max(gemm_max, r.ratio);
      }
    }
    j["rows"] = rows;
    auto find = [&](const std::string& name) -> const row* {
      for (const row& r : b.rows)
        if (r.name == name) return &r;
      return nullptr;
    };
    const row* af = find("flash attention fwd");
    const row* ab = find("flash attention bwd");
    const row* aw = find("adamw step");
    j["reference"] = {{"gemm_8192_flops_per_s", ref_flops}, {"copy_bytes_per_s", copy_rate}};
    j["gemm_step"] = {
        {"layers", L},
        {"tokens", M},
        {"ms", step_ms},
        {"flops", step_flops},
        {"flops_per_s", step_flops / (step_ms * 1e-3)},
        {"ratio", step_flops / (step_ms * 1e-3) / ref_flops},
        {"note",
         "sum of the measured GEMMs of one llama2_7b step: 32 x (4 attention "
         "projections + gate/up + down) x (fwd, dinp, dweight) + the LM head's three"}};
    j["summary"] = {{"gemm_min_ratio", gemm_min},
                    {"gemm_max_ratio", gemm_max},
                    {"attention_forward_ratio", af ? nlohmann::json(af->ratio) : nlohmann::json()},
                    {"attention_backward_ratio", ab ? nlohmann::json(ab->ratio) : nlohmann::json()},
                    {"adamw_ratio", aw ? nlohmann::json(aw->ratio) : nlohmann::json()},
                    {"checks_failed", b.failed}};
    std::printf(
        "\nGEMMs of one llama2_7b step (4096 tokens): %.2f ms, %.1f TFLOP/s, %.1f%% of the 8192^3 "
        "rate\n",
        step_ms, step_flops / (step_ms * 1e-3) / 1e12,
        100 * step_flops / (step_ms * 1e-3) / ref_flops);
    if (b.failed) std::printf("cuda_bench: %d check(s) FAILED (see the check column)\n", b.failed);
    // Write to a temporary name, then rename: a reader never sees half a file.
    const std::filesystem::path out(json_path);
    if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
    const std::filesystem::path tmp = out.string() + ".tmp";
    {
      std::ofstream f(tmp);
      f << j.dump(2) << "\n";
      if (!f) throw error("cuda_bench: cannot write " + tmp.string());
    }
    std::filesystem::rename(tmp, out);
    std::printf("cuda_bench: wrote %s\n", json_path.c_str());
    return b.failed ? 1 : 0;
  } catch (const config_error& ex) {
    std::fprintf(stderr, "cuda_bench: %s\n", ex.what());
    return 2;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "cuda_bench: error: %s\n", ex.what());
    return 1;
  }
}
