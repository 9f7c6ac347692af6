// The FP8 path on a GPU against the host, through the cuda_context entry
// points nn::fp8_linear calls (kernels/cuda/ops.hpp):
//   - fp8_amax_accumulate, fp8_update_scale, fp8_quantize (with its inverse
//     scale) and fp8_quantize_transposed give the host kernels' bits, on
//     inputs with NaN, infinities, values past the format's range and both
//     formats (the casts are exact functions of their inputs);
//   - fp8_gemm, for each of a linear layer's three products (forward,
//     backward to the input, backward to the weight accumulating), equals the
//     host fp8_gemm of the same operands and scales to float32 summation
//     order (the FP8 values and their products are exact on both sides).
// Skipped without a device (main.cpp); the GEMMs pass nothing on a GPU
// without FP8 tensor cores (before sm_89), where they check the refusal.
#include <cstring>

#include <tessera/kernels/cuda/ops.hpp>
#include <tessera/kernels/fp8_gemm.hpp>

#include "cuda_testing.hpp"

namespace hk = tessera::kernels;
using tessera::bf16;
using tessera::fp8_e4m3;
using tessera::fp8_e5m2;
using namespace tessera::testing;

namespace {

const hk::host_context hctx{};

// Values over several binades, with NaN, +-inf and values past E5M2's range planted.
template <class T>
std::vector<T> fp8_inputs(std::size_t n, std::mt19937_64& rng) {
  std::vector<T> v = random_vector<T>(n, rng, -3, 3);
  std::uniform_int_distribution<int> e(-12, 12);
  for (auto& x : v) x = tessera::to<T>(tessera::to<float>(x) * std::ldexp(1.0f, e(rng)));
  if (n > 10) {
    v[1] = tessera::to<T>(NAN);
    v[4] = tessera::to<T>(INFINITY);
    v[7] = tessera::to<T>(-INFINITY);
    v[9] = tessera::to<T>(60000.0f);
  }
  return v;
}

template <class F8>
bool same_bytes(const std::vector<F8>& a, const std::vector<F8>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

template <class F8, class T>
void check_casts(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  INFO(tessera::dtype_name<F8>() << " from " << tessera::dtype_name<T>() << ", " << rows << " x "
                                 << cols);
  std::mt19937_64 rng(seed);
  const std::int64_t n = rows * cols;
  const auto x = fp8_inputs<T>(static_cast<std::size_t>(n), rng);
  hk::cuda_context ctx;
  auto dx = to_device(x);

  // amax: +inf with the planted NaN and infinities; accumulated into a
  // running value.
  float amax_h = 0.5f;
  hk::fp8_amax_accumulate(hctx, &amax_h, x.data(), n);
  auto d_amax = to_device(std::vector<float>{0.5f});
  hk::fp8_amax_accumulate(ctx, d_amax.data(), dx.data(), n);
  ctx.synchronize();
  CHECK(to_host(d_amax)[0] == amax_h);
  // A finite amax: the values after the planted ones, the largest last (in
  // the last block's share).
  if (n > 20) {
    std::vector<T> y(x.begin() + 10, x.end());
    float m = 0;
    for (const T& v : y) m = std::max(m, std::fabs(tessera::to<float>(v)));
    y.back() = tessera::to<T>(-2.0f * m);
    float fa_h = 0.0f;
    hk::fp8_amax_accumulate(hctx, &fa_h, y.data(), static_cast<std::int64_t>(y.size()));
    auto dy = to_device(y);
    auto d_fa2 = to_device(std::vector<float>{0.0f});
    hk::fp8_amax_accumulate(ctx, d_fa2.data(), dy.data(), static_cast<std::int64_t>(y.size()));
    ctx.synchronize();
    REQUIRE(std::isfinite(fa_h));
    CHECK(to_host(d_fa2)[0] == fa_h);
  }

  // The scale from a finite amax (the inputs without their planted specials).
  float scale_h = 1.0f;
  const float finite_amax = 1234.5f;
  hk::fp8_update_scale(hctx, &scale_h, &finite_amax, static_cast<float>(F8::max_finite), 1);
  auto d_scale = to_device(std::vector<float>{1.0f});
  auto d_fa = to_device(std::vector<float>{finite_amax});
  hk::fp8_update_scale(ctx, d_scale.data(), d_fa.data(), static_cast<float>(F8::max_finite), 1);
  ctx.synchronize();
  REQUIRE(to_host(d_scale)[0] == scale_h);

  // The casts, with the inverse scale.
  std::vector<F8> q_h(static_cast<std::size_t>(n)), qt_h(q_h.size());
  float inv_h = 0, inv_th = 0;
  hk::fp8_quantize(hctx, q_h.data(), &inv_h, x.data(), n, &scale_h);
  hk::fp8_quantize_transposed(hctx, qt_h.data(), &inv_th, x.data(), rows, cols, &scale_h);
  auto d_q = poisoned_device<F8>(static_cast<std::size_t>(n));
  auto d_qt = poisoned_device<F8>(static_cast<std::size_t>(n));
  auto d_inv = to_device(std::vector<float>{0.0f, 0.0f});
  hk::fp8_quantize(ctx, d_q.data(), d_inv.data(), dx.data(), n, d_scale.data());
  hk::fp8_quantize_transposed(ctx, d_qt.data(), d_inv.data() + 1, dx.data(), rows, cols,
                              d_scale.data());
  ctx.synchronize();
  CHECK(same_bytes(to_host(d_q), q_h));
  CHECK(same_bytes(to_host(d_qt), qt_h));
  const auto inv = to_host(d_inv);
  CHECK(inv[0] == inv_h);
  CHECK(inv[1] == inv_th);
}

// A linear layer's three FP8 products (nn::fp8_linear's calls) on the GPU
// and on the host with the same operands and scales.
template <class GA>
void check_products(std::int64_t M, std::int64_t N, std::int64_t K, bool hybrid,
                    std::uint64_t seed) {
  INFO("M=" << M << " N=" << N << " K=" << K << (hybrid ? " hybrid" : " e4m3") << ", dy "
            << tessera::dtype_name<GA>());
  std::mt19937_64 rng(seed);
  const auto x = random_vector<bf16>(static_cast<std::size_t>(M * K), rng, -2, 2);
  const auto w = random_vector<bf16>(static_cast<std::size_t>(N * K), rng, -0.05, 0.05);
  const auto dy = random_vector<GA>(static_cast<std::size_t>(M * N), rng, -1e-3, 1e-3);
  // Scales (x, W, dy) that are not powers of two; inverses written by the casts.
  std::vector<float> sc = {
      0.9f * 448 / 2, 0.7f * 448 / 0.05f, (hybrid ? 57344.0f : 448.0f) * 0.3f / 1e-3f, 0, 0, 0};
  hk::cuda_context ctx;
  auto d_sc = to_device(sc);
  auto op = [&](float* base, int i, bool e5m2) {
    hk::fp8_operand o;
    o.e5m2 = e5m2;
    o.scale = base + i;
    o.inverse = base + 3 + i;
    o.role = static_cast<hk::fp8_role>(i);
    return o;
  };
  const hk::linear_gemm f = hk::linear_forward_gemm(M, N, K);
  const hk::linear_gemm bi = hk::linear_backward_input_gemm(M, N, K, true);
  const hk::linear_gemm bw = hk::linear_backward_weight_gemm(M, N, K);

  std::vector<bf16> y_h(static_cast<std::size_t>(M * N));
  auto dx_h = random_vector<GA>(static_cast<std::size_t>(M * K), rng, -1e-3, 1e-3);
  auto dw_h = random_vector<float>(static_cast<std::size_t>(N * K), rng, -1e-3, 1e-3);
  auto d_x = to_device(x), d_w = to_device(w), d_dy = to_device(dy);
  auto d_y = poisoned_device<bf16>(y_h.size());
  auto d_dx = to_device(dx_h);
  auto d_dw = to_device(dw_h);
  float* hs = sc.data();
  float* ds = d_sc.data();
  hk::fp8_gemm(hctx, f.ta, f.tb, f.M, f.N, f.K, x.data(), f.lda, op(hs, 0, false), w.data(), f.ldb,
               op(hs, 1, false), f.beta, y_h.data(), f.ldc);
  hk::fp8_gemm(ctx, f.ta, f.tb, f.M, f.N, f.K, d_x.data(), f.lda, op(ds, 0, false), d_w.data(),
               f.ldb, op(ds, 1, false), f.beta, d_y.data(), f.ldc);
  hk::fp8_gemm(hctx, bi.ta, bi.tb, bi.M, bi.N, bi.K, dy.data(), bi.lda, op(hs, 2, hybrid), w.data(),
               bi.ldb, op(hs, 1, false), bi.beta, dx_h.data(), bi.ldc);
  hk::fp8_gemm(ctx, bi.ta, bi.tb, bi.M, bi.N, bi.K, d_dy.data(), bi.lda, op(ds, 2, hybrid),
               d_w.data(), bi.ldb, op(ds, 1, false), bi.beta, d_dx.data(), bi.ldc);
  hk::fp8_gemm(hctx, bw.ta, bw.tb, bw.M, bw.N, bw.K, dy.data(), bw.lda, op(hs, 2, hybrid), x.data(),
               bw.ldb, op(hs, 0, false), bw.beta, dw_h.data(), bw.ldc);
  hk::fp8_gemm(ctx, bw.ta, bw.tb, bw.M, bw.N, bw.K, d_dy.data(), bw.lda, op(ds, 2, hybrid),
               d_x.data(), bw.ldb, op(ds, 0, false), bw.beta, d_dw.data(), bw.ldc);
  ctx.synchronize();
  // The inverse scales the casts wrote.
  const auto inv = to_host(d_sc);
  for (int i = 0; i < 3; ++i)
    CHECK(inv[static_cast<std::size_t>(3 + i)] == sc[static_cast<std::size_t>(3 + i)]);
  // float32 sums of exact products in two orders: K 2^-24 of the magnitude
  // bounds the difference (4x for the BLAS's blocking); a 16-bit output may
  // land on the neighbouring value.
  CHECK(max_rel_error(to_host(d_y), y_h) < 2 * tol_of<bf16>);
  CHECK(max_rel_error(to_host(d_dx), dx_h) < (tessera::is_half_v<GA> ? 2 * tol_of<GA> : 1e-4));
  CHECK(max_rel_error(to_host(d_dw), dw_h) < 1e-4);
}

}  // namespace

TEST_CASE("cuda FP8 amax, scale and casts give the host kernels' bits", "[cuda][fp8]") {
  std::uint64_t seed = 801;
  for (auto [rows, cols] : {std::pair<std::int64_t, std::int64_t>{1, 1},
                            {1, 333},
                            {333, 1},
                            {64, 96},
                            {257, 129},
                            {4096, 1024}}) {
    check_casts<fp8_e4m3, bf16>(rows, cols, seed++);
    check_casts<fp8_e5m2, bf16>(rows, cols, seed++);
    check_casts<fp8_e4m3, float>(rows, cols, seed++);
    check_casts<fp8_e5m2, tessera::fp16>(rows, cols, seed++);
  }
}

TEST_CASE("cuda fp8_gemm: a linear layer's three FP8 products equal the host's",
          "[cuda][fp8][gemm]") {
  if (!has_fp8_tensor_cores()) {
    hk::cuda_context ctx;
    auto d = to_device(std::vector<bf16>(256));
    auto s = to_device(std::vector<float>{1, 1, 1, 1});
    hk::fp8_operand a{false, s.data(), s.data() + 2, hk::fp8_role::x};
    hk::fp8_operand b{false, s.data() + 1, s.data() + 3, hk::fp8_role::w};
    CHECK_THROWS_AS(hk::fp8_gemm(ctx, hk::transpose::no, hk::transpose::yes, 16, 16, 16, d.data(),
                                 16, a, d.data(), 16, b, 0.0f, d.data(), 16),
                    tessera::cuda_error);
    return;
  }
  check_products<float>(128, 384, 256, true, 811);  // fp8_mixed: float activation gradients
  check_products<float>(64, 96, 160, false, 812);   // E4M3 everywhere
  check_products<bf16>(256, 128, 512, true, 813);
}
