// Tests of the FP8 linear layers (nn/fp8_linear.hpp): for column- and
// row-parallel layers, both formats (hybrid, e4m3) and both scalings
// (delayed, current), forward, backward_input and backward_weight equal a
// float64 computation on the dequantised operands, which the test casts
// itself with the core FP8 types (x̂ = float(F8(x s)) * (1/s) in float);
// the scales are the recipe's (delayed: as they stood before the step, the
// step amaxes the operands' max |.|; current: fp8_max / amax). Under
// current scaling on a tp group of 2 each rank casts with the scale one
// rank would (the sharded operands' amaxes reduced with max).
#include "tessera/nn/fp8_linear.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <vector>

#include "../kernels/kernel_testing.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/nn/tensor_parallel.hpp"

namespace test_nn_fp8_linear {

using namespace tessera;
using precision::fp8_format;
using precision::fp8_recipe;
using precision::fp8_scaling;

namespace {

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed, double mag) {
  std::mt19937_64 rng(seed);
  return testing::random_vector<T>(n, rng, -mag, mag);
}

template <class T>
double amax_of(const std::vector<T>& v) {
  double m = 0;
  for (const T& x : v) m = std::max(m, std::fabs(to<double>(x)));
  return m;
}

// The operand an FP8 GEMM sees, cast independently of the kernels:
// float(F8(float(a) s)) * (1/s) in float, saturating.
template <class T>
std::vector<double> dequantised(const std::vector<T>& a, float s, bool e5m2) {
  std::vector<double> out(a.size());
  const float inv = 1.0f / s;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float v = to<float>(a[i]) * s;
    const float q = e5m2 ? static_cast<float>(fp8_e5m2(v, fp8_saturation::finite))
                         : static_cast<float>(fp8_e4m3(v, fp8_saturation::finite));
    out[i] = static_cast<double>(q * inv);
  }
  return out;
}

// y(M,N) = x(M,K) W(N,K)^T, dx(M,K) = dy(M,N) W, dW(N,K) = dy^T x in float64,
// with the sum of |terms| of each element (the float32 accumulation bound).
struct reference {
  std::vector<double> y, dx, dw, y_abs, dx_abs, dw_abs;
};
reference compute(const std::vector<double>& x, const std::vector<double>& w,
                  const std::vector<double>& dy, std::int64_t M, std::int64_t N, std::int64_t K) {
  reference r;
  r.y.assign(M * N, 0), r.y_abs.assign(M * N, 0);
  r.dx.assign(M * K, 0), r.dx_abs.assign(M * K, 0);
  r.dw.assign(N * K, 0), r.dw_abs.assign(N * K, 0);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t k = 0; k < K; ++k) {
        const double xw = x[m * K + k] * w[n * K + k], dyw = dy[m * N + n] * w[n * K + k],
                     dyx = dy[m * N + n] * x[m * K + k];
        r.y[m * N + n] += xw, r.y_abs[m * N + n] += std::fabs(xw);
        r.dx[m * K + k] += dyw, r.dx_abs[m * K + k] += std::fabs(dyw);
        r.dw[n * K + k] += dyx, r.dw_abs[n * K + k] += std::fabs(dyx);
      }
  return r;
}

// Tolerances: a float32 GEMM of K terms errs by at most about K 2^-24 times
// the sum of |terms| (use 4x that: the BLAS's blocking); a bf16 output adds
// one rounding, 2^-9 relative.
constexpr double f32_eps = 5.96e-8;
template <class T>
void check_close(const std::vector<T>& got, const std::vector<double>& want,
                 const std::vector<double>& abs_sum, std::int64_t terms, double rel_store) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = 4.0 * static_cast<double>(terms) * f32_eps * abs_sum[i] +
                       rel_store * std::fabs(want[i]) + 1e-30;
    if (std::fabs(to<double>(got[i]) - want[i]) > tol) ++bad;
  }
  CHECK(bad == 0);
}

// A float of a state's scalars (host memory here: the state's own).
float scalar(const nn::fp8_linear_state& st, kernels::fp8_role r, nn::fp8_slot w) {
  return st.scalars()[nn::fp8_linear_state::slot(r, w)];
}
constexpr auto X = kernels::fp8_role::x;

comm::comm_options quick() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(20);
  return o;
}

// One layer's three calls on one rank (dense_layers) against the reference.
template <class Layer>
void check_layer(fp8_scaling scaling, fp8_format format) {
  const std::int64_t M = 19, N = 12, K = 20;
  // Magnitudes far from 1 so the scales matter (E4M3 without a scale would
  // flush x to subnormals and saturate W).
  const auto x = random_values<bf16>(M * K, 11, 3e-3), w = random_values<bf16>(N * K, 12, 900.0);
  const auto dy = random_values<float>(M * N, 13, 1e-6);
  fp8_recipe r;
  r.scaling = scaling;
  r.format = format;
  r.history = 4;
  nn::fp8_linear_state st(r);
  if (scaling == fp8_scaling::delayed) {  // a previous step's amaxes: scales not 1
    const float prev[3] = {2e-3f, 700.0f, 3e-6f};
    st.record_step(prev);
    st.write_scalars(st.scalars());
  }
  const float sx0 = st.x.scale(), sw0 = st.w.scale(), sdy0 = st.dy.scale();
  const bool e5m2 = format == fp8_format::hybrid;
  float sx = sx0, sw = sw0, sdy = sdy0;
  if (scaling == fp8_scaling::current) {
    sx = precision::fp8_scale_of(static_cast<float>(amax_of(x)), 448.0f, 0, 1.0f);
    sw = precision::fp8_scale_of(static_cast<float>(amax_of(w)), 448.0f, 0, 1.0f);
    sdy =
        precision::fp8_scale_of(static_cast<float>(amax_of(dy)), e5m2 ? 57344.0f : 448.0f, 0, 1.0f);
  }
  const reference ref = compute(dequantised(x, sx, false), dequantised(w, sw, false),
                                dequantised(dy, sdy, e5m2), M, N, K);

  kernels::host_context ctx;
  const nn::dense_layers layers;
  const Layer layer{N, K, 3};  // the weight 3 elements into its segment
  std::vector<bf16> seg(3 + N * K, bf16(0.0f));
  std::copy(w.begin(), w.end(), seg.begin() + 3);
  std::vector<bf16> y(M * N, bf16(NAN));
  std::vector<float> dx(M * K, NAN), g(3 + N * K, 0.0f);
  const nn::fp8_linear<Layer, nn::dense_layers> f(layer, layers, st);
  using Xv = std::conditional_t<std::is_same_v<Layer, nn::column_parallel_linear>,
                                replicated<const bf16>, feature_sharded<const bf16>>;
  using DYv = std::conditional_t<std::is_same_v<Layer, nn::column_parallel_linear>,
                                 feature_sharded<const float>, replicated<const float>>;
  const Xv xv{x.data(), M, K};
  const DYv dyv{dy.data(), M, N};
  const auto yv = f.forward(ctx, y.data(), xv, seg.data());
  CHECK(yv.data == y.data());
  CHECK(yv.cols == N);
  const auto dxv = f.backward_input(ctx, dx.data(), dyv, seg.data());
  CHECK(dxv.cols == K);
  f.backward_weight(ctx, g.data(), dyv, xv);
  f.backward_weight(ctx, g.data(), dyv, xv);  // accumulates (+=): twice the reference
  INFO(precision::to_string(scaling) << " " << precision::to_string(format));
  check_close(y, ref.y, ref.y_abs, K, std::ldexp(1.0, -8));
  check_close(dx, ref.dx, ref.dx_abs, N, 0.0);
  std::vector<double> dw2(ref.dw.size()), dw2_abs(ref.dw.size());
  for (std::size_t i = 0; i < dw2.size(); ++i)
    dw2[i] = 2 * ref.dw[i], dw2_abs[i] = 2 * ref.dw_abs[i];
  check_close(std::vector<float>(g.begin() + 3, g.end()), dw2, dw2_abs, 2 * M, 0.0);
  CHECK(g[0] == 0.0f);
  CHECK(g[2] == 0.0f);
  // accumulate: dx += d̂y Ŵ
  std::vector<float> dx2 = dx;
  f.backward_input(ctx, dx2.data(), dyv, seg.data(), true);
  for (std::size_t i = 0; i < dx.size(); ++i) REQUIRE(dx2[i] == Approx(2.0 * dx[i]).margin(1e-30));
  if (scaling == fp8_scaling::delayed) {
    // The scales the kernels cast with did not move within the step; the
    // step amaxes are the operands'.
    CHECK(scalar(st, X, nn::fp8_slot::scale) == sx0);
    CHECK(scalar(st, kernels::fp8_role::w, nn::fp8_slot::scale) == sw0);
    CHECK(scalar(st, kernels::fp8_role::dy, nn::fp8_slot::scale) == sdy0);
    float a[3];
    nn::fp8_linear_state::step_amaxes(st.scalars(), a);
    CHECK(a[0] == static_cast<float>(amax_of(x)));
    CHECK(a[1] == static_cast<float>(amax_of(w)));
    CHECK(a[2] == static_cast<float>(amax_of(dy)));
    st.record_step(a);  // the next step's scales follow the history's max
    st.write_scalars(st.scalars());
    CHECK(st.x.scale() == precision::fp8_scale_of(std::max(a[0], 2e-3f), 448.0f, 0, sx0));
    CHECK(scalar(st, X, nn::fp8_slot::scale) == st.x.scale());
    CHECK(scalar(st, X, nn::fp8_slot::step_amax) == 0.0f);
  } else {
    // The kernels set the scales in the scalars; the host objects take them for a checkpoint.
    CHECK(scalar(st, X, nn::fp8_slot::scale) == sx);
    CHECK(scalar(st, kernels::fp8_role::w, nn::fp8_slot::scale) == sw);
    CHECK(scalar(st, kernels::fp8_role::dy, nn::fp8_slot::scale) == sdy);
    st.read_current_scales(st.scalars());
    CHECK(st.x.scale() == sx);
    CHECK(st.w.scale() == sw);
    CHECK(st.dy.scale() == sdy);
  }
  // The last cast's inverse scale is what the GEMM multiplied by.
  CHECK(scalar(st, X, nn::fp8_slot::inverse) == 1.0f / scalar(st, X, nn::fp8_slot::scale));
  // An evaluation forward (observe off) reads the scales and moves nothing.
  const float ax = scalar(st, X, nn::fp8_slot::step_amax), scx = scalar(st, X, nn::fp8_slot::scale);
  st.observe = false;
  std::vector<bf16> y2(M * N);
  f.forward(ctx, y2.data(), Xv{w.data(), std::min(M, N), K}, seg.data());
  st.observe = true;
  CHECK(scalar(st, X, nn::fp8_slot::step_amax) == ax);
  CHECK(scalar(st, X, nn::fp8_slot::scale) == scx);
}

}  // namespace

TEST_CASE("FP8 column-parallel linear equals float64 on the dequantised operands", "[nn][fp8]") {
  for (fp8_scaling s : {fp8_scaling::delayed, fp8_scaling::current})
    for (fp8_format f : {fp8_format::hybrid, fp8_format::e4m3})
      check_layer<nn::column_parallel_linear>(s, f);
}

TEST_CASE("FP8 row-parallel linear equals float64 on the dequantised operands", "[nn][fp8]") {
  for (fp8_scaling s : {fp8_scaling::delayed, fp8_scaling::current})
    for (fp8_format f : {fp8_format::hybrid, fp8_format::e4m3})
      check_layer<nn::row_parallel_linear>(s, f);
}

TEST_CASE("FP8 current scaling on tp 2 casts with the one-rank scales", "[nn][fp8][tp]") {
  const std::int64_t M = 16, N = 8, K = 12;
  const auto x = random_values<bf16>(M * K, 21, 0.5), w = random_values<bf16>(N * K, 22, 4.0);
  const auto dy = random_values<float>(M * N, 23, 1e-3);
  fp8_recipe r;
  r.scaling = fp8_scaling::current;
  const float sx = precision::fp8_scale_of(static_cast<float>(amax_of(x)), 448.0f, 0, 1.0f);
  const float sw = precision::fp8_scale_of(static_cast<float>(amax_of(w)), 448.0f, 0, 1.0f);
  const float sdy = precision::fp8_scale_of(static_cast<float>(amax_of(dy)), 57344.0f, 0, 1.0f);
  std::mutex mu;
  comm::local_world::run(
      2,
      [&](comm::local_communicator& c) {
        kernels::host_context ctx;
        nn::tensor_parallel_layers<comm::local_communicator> layers;
        layers.group = &c;
        const std::int64_t Nr = N / 2, Kr = K / 2, rk = c.rank();
        // Column: W rows [rk Nr, (rk+1) Nr), dy columns likewise.
        std::vector<bf16> wc(w.begin() + rk * Nr * K, w.begin() + (rk + 1) * Nr * K);
        std::vector<float> dyc(M * Nr);
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t n = 0; n < Nr; ++n) dyc[m * Nr + n] = dy[m * N + rk * Nr + n];
        nn::fp8_linear_state col(r);
        const nn::column_parallel_linear cl{Nr, K, 0};
        nn::fp8_linear<nn::column_parallel_linear, decltype(layers)> fc(cl, layers, col);
        std::vector<bf16> y(M * Nr);
        std::vector<float> dx(M * K), g(Nr * K, 0.0f);
        fc.forward(ctx, y.data(), replicated<const bf16>{x.data(), M, K}, wc.data());
        fc.backward_input(ctx, dx.data(), feature_sharded<const float>{dyc.data(), M, Nr},
                          wc.data());
        // Row: x columns and W columns [rk Kr, (rk+1) Kr).
        std::vector<bf16> xr(M * Kr), wr(N * Kr);
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t k = 0; k < Kr; ++k) xr[m * Kr + k] = x[m * K + rk * Kr + k];
        for (std::int64_t n = 0; n < N; ++n)
          for (std::int64_t k = 0; k < Kr; ++k) wr[n * Kr + k] = w[n * K + rk * Kr + k];
        nn::fp8_linear_state row(r);
        const nn::row_parallel_linear rl{N, Kr, 0};
        nn::fp8_linear<nn::row_parallel_linear, decltype(layers)> fr(rl, layers, row);
        std::vector<bf16> yr(M * N);
        fr.forward(ctx, yr.data(), feature_sharded<const bf16>{xr.data(), M, Kr}, wr.data());
        col.read_current_scales(col.scalars());
        row.read_current_scales(row.scalars());
        std::lock_guard<std::mutex> lock(mu);
        INFO("rank " << c.rank());
        CHECK(col.x.scale() == sx);
        CHECK(col.w.scale() == sw);
        CHECK(col.dy.scale() == sdy);
        CHECK(row.x.scale() == sx);
        CHECK(row.w.scale() == sw);
      },
      quick());
}

}  // namespace test_nn_fp8_linear
