// Each CUDA kernel (include/tessera/kernels/cuda/) against the host
// implementation on fresh seeded random inputs, outputs poisoned with NaN
// before the launch: float32 against the host's float32 (f32_tol), bf16
// against a float64 reference of the same rounded inputs (bf16_tol).
// Vector (16-byte) and scalar paths are both exercised (sizes and offsets
// chosen to defeat the vector path). Skipped without a device (main.cpp).
#include <cstring>

#include <tessera/core/cp_shard.hpp>
#include <tessera/kernels/cuda/kernels.hpp>
#include <tessera/kernels/cuda/launch.hpp>
#include <tessera/kernels/elementwise.hpp>
#include <tessera/kernels/embedding.hpp>
#include <tessera/kernels/rmsnorm.hpp>
#include <tessera/kernels/rope.hpp>
#include <tessera/kernels/swiglu.hpp>
#include <tessera/optim/adamw.hpp>
#include <tessera/optim/clip.hpp>

#include "../support/cp_rows.hpp"
#include "cuda_testing.hpp"

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
/// The host context of the reference kernels.
const tessera::kernels::host_context hctx{};
using tessera::bf16;
using namespace tessera::testing;

namespace {

// float64 RMSNorm forward of rounded inputs.
template <class T>
void rmsnorm_ref(std::vector<double>& y, std::vector<double>& rstd, const std::vector<T>& x,
                 const std::vector<T>& w, std::int64_t N, std::int64_t H, double eps) {
  y.assign(static_cast<std::size_t>(N * H), 0);
  rstd.assign(static_cast<std::size_t>(N), 0);
  for (std::int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (std::int64_t h = 0; h < H; ++h) ss += as_double(x[n * H + h]) * as_double(x[n * H + h]);
    const double r = 1.0 / std::sqrt(ss / H + eps);
    rstd[n] = r;
    for (std::int64_t h = 0; h < H; ++h)
      y[n * H + h] = as_double(w[h]) * as_double(x[n * H + h]) * r;
  }
}

}  // namespace

TEST_CASE("cuda rmsnorm_forward float32 matches the host kernel", "[cuda][rmsnorm]") {
  std::mt19937_64 rng(101);
  tessera::cuda::stream s;
  for (auto [N, H, offset] : {std::tuple<std::int64_t, std::int64_t, int>{67, 4096, 0},
                              {5, 1001, 0},    // H % 4 != 0: scalar path
                              {9, 512, 1}}) {  // misaligned pointers: scalar path
    INFO("N=" << N << " H=" << H << " offset=" << offset);
    const auto x = random_vector<float>(static_cast<std::size_t>(N * H + offset), rng, -2, 2);
    const auto w = random_vector<float>(static_cast<std::size_t>(H + offset), rng, 0.5, 1.5);
    std::vector<float> y(static_cast<std::size_t>(N * H)), r(static_cast<std::size_t>(N));
    hk::rmsnorm_forward(hctx, y.data(), r.data(), x.data() + offset, w.data() + offset, N, H, 1e-5);
    auto dx = to_device(x);
    auto dw = to_device(w);
    auto dy = poisoned_device<float>(static_cast<std::size_t>(N * H + offset));
    auto dr = poisoned_device<float>(static_cast<std::size_t>(N));
    kc::rmsnorm_forward(dy.data() + offset, dr.data(), dx.data() + offset, dw.data() + offset, N, H,
                        1e-5, s);
    s.synchronize();
    auto gy = to_host(dy);
    gy.erase(gy.begin(), gy.begin() + offset);
    CHECK(first_nan(gy) == -1);
    CHECK(max_rel_error(gy, y) < f32_tol);
    CHECK(max_rel_error(to_host(dr), r) < f32_tol);
  }
}

TEST_CASE("cuda rmsnorm_forward bf16 matches a float64 reference", "[cuda][rmsnorm]") {
  std::mt19937_64 rng(102);
  tessera::cuda::stream s;
  const std::int64_t N = 33, H = 4096;
  const auto x = random_vector<bf16>(static_cast<std::size_t>(N * H), rng, -2, 2);
  const auto w = random_vector<bf16>(static_cast<std::size_t>(H), rng, 0.5, 1.5);
  std::vector<double> y, r;
  rmsnorm_ref(y, r, x, w, N, H, 1e-6);
  auto dx = to_device(x);
  auto dw = to_device(w);
  auto dy = poisoned_device<bf16>(static_cast<std::size_t>(N * H));
  auto dr = poisoned_device<float>(static_cast<std::size_t>(N));
  kc::rmsnorm_forward(dy.data(), dr.data(), dx.data(), dw.data(), N, H, 1e-6, s);
  s.synchronize();
  const auto gy = to_host(dy);
  CHECK(first_nan(gy) == -1);
  CHECK(max_rel_error(gy, y) < bf16_tol);
  CHECK(max_rel_error(to_host(dr), r) < f32_tol);
}

TEST_CASE("cuda rmsnorm_backward float32 matches the host kernel", "[cuda][rmsnorm]") {
  std::mt19937_64 rng(103);
  tessera::cuda::stream s;
  for (auto [N, H, accumulate] :
       {std::tuple<std::int64_t, std::int64_t, bool>{300, 1024, false}, {7, 999, true}}) {
    INFO("N=" << N << " H=" << H << " accumulate=" << accumulate);
    const auto x = random_vector<float>(static_cast<std::size_t>(N * H), rng, -2, 2);
    const auto w = random_vector<float>(static_cast<std::size_t>(H), rng, 0.5, 1.5);
    const auto dout = random_vector<float>(static_cast<std::size_t>(N * H), rng);
    const auto dw0 = random_vector<float>(static_cast<std::size_t>(H), rng);
    const auto dx0 = random_vector<float>(static_cast<std::size_t>(N * H), rng);
    std::vector<float> y(x.size()), r(static_cast<std::size_t>(N));
    hk::rmsnorm_forward(hctx, y.data(), r.data(), x.data(), w.data(), N, H, 1e-5);
    std::vector<float> dx = dx0, dw = dw0;
    hk::rmsnorm_backward(hctx, dx.data(), dw.data(), dout.data(), x.data(), w.data(), r.data(), N, H,
                         accumulate);
    auto d_x = to_device(x);
    auto d_w = to_device(w);
    auto d_dout = to_device(dout);
    auto d_r = to_device(r);
    auto d_dw = to_device(dw0);
    auto d_dx = accumulate ? to_device(dx0) : poisoned_device<float>(x.size());
    const std::size_t sb = kc::rmsnorm_backward_scratch_bytes(N, H);
    auto scratch = poisoned_device<char>(sb);
    kc::rmsnorm_backward(d_dx.data(), d_dw.data(), d_dout.data(), d_x.data(), d_w.data(),
                         d_r.data(), N, H, scratch.data(), sb, s, accumulate);
    s.synchronize();
    CHECK(first_nan(to_host(d_dx)) == -1);
    CHECK(max_rel_error(to_host(d_dx), dx) < f32_tol);
    CHECK(max_rel_error(to_host(d_dw), dw) < f32_tol);
    CHECK_THROWS_AS(kc::rmsnorm_backward(d_dx.data(), d_dw.data(), d_dout.data(), d_x.data(),
                                         d_w.data(), d_r.data(), N, H, scratch.data(), sb - 1, s),
                    tessera::config_error);
  }
}

TEST_CASE("cuda rmsnorm_backward bf16 matches a float64 reference", "[cuda][rmsnorm]") {
  std::mt19937_64 rng(104);
  tessera::cuda::stream s;
  const std::int64_t N = 130, H = 2048;
  const auto x = random_vector<bf16>(static_cast<std::size_t>(N * H), rng, -2, 2);
  const auto w = random_vector<bf16>(static_cast<std::size_t>(H), rng, 0.5, 1.5);
  const auto dout = random_vector<bf16>(static_cast<std::size_t>(N * H), rng);
  std::vector<double> y, r;
  rmsnorm_ref(y, r, x, w, N, H, 1e-5);
  // The kernel takes rstd as saved (float): the reference uses the same value.
  std::vector<float> rf(r.begin(), r.end());
  std::vector<double> dx(x.size()), dw(static_cast<std::size_t>(H), 0.0);
  for (std::int64_t n = 0; n < N; ++n) {
    const double rr = rf[n];
    double dot = 0;
    for (std::int64_t h = 0; h < H; ++h)
      dot += as_double(w[h]) * as_double(dout[n * H + h]) * as_double(x[n * H + h]) * rr;
    for (std::int64_t h = 0; h < H; ++h) {
      const double xh = as_double(x[n * H + h]) * rr, g = as_double(dout[n * H + h]);
      dx[n * H + h] = rr * (as_double(w[h]) * g - xh * dot / H);
      dw[h] += g * xh;
    }
  }
  auto d_x = to_device(x);
  auto d_w = to_device(w);
  auto d_dout = to_device(dout);
  auto d_r = to_device(rf);
  auto d_dw = to_device(std::vector<float>(static_cast<std::size_t>(H), 0.f));
  auto d_dx = poisoned_device<bf16>(x.size());
  const std::size_t sb = kc::rmsnorm_backward_scratch_bytes(N, H);
  auto scratch = poisoned_device<char>(sb);
  kc::rmsnorm_backward(d_dx.data(), d_dw.data(), d_dout.data(), d_x.data(), d_w.data(), d_r.data(),
                       N, H, scratch.data(), sb, s);
  s.synchronize();
  const auto gdx = to_host(d_dx);
  CHECK(first_nan(gdx) == -1);
  CHECK(max_rel_error(gdx, dx) < bf16_tol);
  CHECK(max_rel_error(to_host(d_dw), dw) < f32_tol);  // float32 output, sums of N terms
}

TEST_CASE("cuda swiglu forward and backward match the host", "[cuda][swiglu]") {
  std::mt19937_64 rng(105);
  tessera::cuda::stream s;
  for (std::int64_t n : {std::int64_t(64 * 11008), std::int64_t(1003)}) {
    INFO("n=" << n);
    const auto un = static_cast<std::size_t>(n);
    const auto g = random_vector<float>(un, rng, -6, 6);
    const auto u = random_vector<float>(un, rng, -2, 2);
    const auto dy = random_vector<float>(un, rng);
    std::vector<float> out(un), dg(un), du(un);
    hk::swiglu_forward(hctx, out.data(), g.data(), u.data(), n);
    hk::swiglu_backward(hctx, dg.data(), du.data(), dy.data(), g.data(), u.data(), n);
    auto d_g = to_device(g), d_u = to_device(u), d_dy = to_device(dy);
    auto d_out = poisoned_device<float>(un), d_dg = poisoned_device<float>(un),
         d_du = poisoned_device<float>(un);
    kc::swiglu_forward(d_out.data(), d_g.data(), d_u.data(), n, s);
    kc::swiglu_backward(d_dg.data(), d_du.data(), d_dy.data(), d_g.data(), d_u.data(), n, s);
    s.synchronize();
    CHECK(max_rel_error(to_host(d_out), out) < f32_tol);
    CHECK(max_rel_error(to_host(d_dg), dg) < f32_tol);
    CHECK(max_rel_error(to_host(d_du), du) < f32_tol);

    // bf16 storage and bf16 gradients against float64.
    const auto gb = random_vector<bf16>(un, rng, -6, 6), ub = random_vector<bf16>(un, rng, -2, 2),
               dyb = random_vector<bf16>(un, rng);
    std::vector<double> ro(un), rdg(un), rdu(un);
    for (std::size_t i = 0; i < un; ++i) {
      const double a = as_double(gb[i]), b = as_double(ub[i]), d = as_double(dyb[i]);
      const double sig = 1.0 / (1.0 + std::exp(-a));
      ro[i] = a * sig * b;
      rdg[i] = d * b * sig * (1.0 + a * (1.0 - sig));
      rdu[i] = d * a * sig;
    }
    auto e_g = to_device(gb), e_u = to_device(ub), e_dy = to_device(dyb);
    auto e_out = poisoned_device<bf16>(un), e_dg = poisoned_device<bf16>(un),
         e_du = poisoned_device<bf16>(un);
    kc::swiglu_forward(e_out.data(), e_g.data(), e_u.data(), n, s);
    kc::swiglu_backward(e_dg.data(), e_du.data(), e_dy.data(), e_g.data(), e_u.data(), n, s);
    s.synchronize();
    CHECK(max_rel_error(to_host(e_out), ro) < bf16_tol);
    CHECK(max_rel_error(to_host(e_dg), rdg) < bf16_tol);
    CHECK(max_rel_error(to_host(e_du), rdu) < bf16_tol);
  }
}

TEST_CASE("cuda embedding forward copies rows and backward equals the host bit for bit",
          "[cuda][embedding]") {
  std::mt19937_64 rng(106);
  tessera::cuda::stream s;
  const std::int64_t N = 2500, V = 300, H = 1100;  // N spans 3 token tiles; V 5 row blocks
  std::vector<std::int32_t> tok(static_cast<std::size_t>(N));
  for (auto& t : tok) t = static_cast<std::int32_t>(rng() % 40 == 0 ? 7 : rng() % V);  // a hot row
  const auto wte = random_vector<bf16>(static_cast<std::size_t>(V * H), rng);
  std::vector<bf16> out(static_cast<std::size_t>(N * H));
  hk::embedding_forward(hctx, out.data(), tok.data(), wte.data(), N, V, H);
  auto d_tok = to_device(tok);
  auto d_wte = to_device(wte);
  auto d_out = poisoned_device<bf16>(out.size());
  kc::embedding_forward(d_out.data(), d_tok.data(), d_wte.data(), N, V, H, s);
  s.synchronize();
  CHECK(same_bits(to_host(d_out), out));

  const auto dout = random_vector<float>(static_cast<std::size_t>(N * H), rng);
  const auto dw0 = random_vector<float>(static_cast<std::size_t>(V * H), rng);
  std::vector<float> dw = dw0;
  hk::embedding_backward(hctx, dw.data(), dout.data(), tok.data(), N, V, H);
  auto d_dout = to_device(dout);
  auto d_dw = to_device(dw0);
  kc::embedding_backward(d_dw.data(), d_dout.data(), d_tok.data(), N, V, H, s);
  s.synchronize();
  CHECK(same_bits(to_host(d_dw), dw));  // same additions in the same order

  // bf16 dout: the host sums the exactly widened values.
  const auto doutb = random_vector<bf16>(static_cast<std::size_t>(N * H), rng);
  std::vector<float> doutf(doutb.size());
  hk::cast(hctx, doutf.data(), doutb.data(), static_cast<std::int64_t>(doutb.size()));
  std::vector<float> dwb = dw0;
  hk::embedding_backward(hctx, dwb.data(), doutf.data(), tok.data(), N, V, H);
  auto d_doutb = to_device(doutb);
  auto d_dwb = to_device(dw0);
  kc::embedding_backward(d_dwb.data(), d_doutb.data(), d_tok.data(), N, V, H, s);
  s.synchronize();
  CHECK(same_bits(to_host(d_dwb), dwb));
}

TEST_CASE("cuda casts give the host's bits", "[cuda][cast]") {
  std::mt19937_64 rng(107);
  tessera::cuda::stream s;
  for (std::int64_t n : {std::int64_t(1) << 20, std::int64_t(777)}) {
    auto f = random_vector<float>(static_cast<std::size_t>(n), rng, -1e3, 1e3);
    f[0] = 1e38f * 10;  // inf
    f[1] = -0.0f;
    f[2] = 1e-40f;  // subnormal
    std::vector<bf16> b(f.size());
    hk::cast(hctx, b.data(), f.data(), n);
    std::vector<float> back(f.size());
    hk::cast(hctx, back.data(), b.data(), n);
    auto d_f = to_device(f);
    auto d_b = poisoned_device<bf16>(f.size());
    auto d_back = poisoned_device<float>(f.size());
    kc::cast(d_b.data(), d_f.data(), n, s);
    kc::cast(d_back.data(), d_b.data(), n, s);
    s.synchronize();
    CHECK(same_bits(to_host(d_b), b));
    CHECK(same_bits(to_host(d_back), back));
  }
}

TEST_CASE("cuda grad_sum_squares is deterministic and matches the host in float64",
          "[cuda][grad_norm]") {
  std::mt19937_64 rng(108);
  tessera::cuda::stream s;
  const std::int64_t n = 3'000'001;
  const auto g = random_vector<bf16>(static_cast<std::size_t>(n), rng);
  const auto f = random_vector<float>(static_cast<std::size_t>(n), rng);
  double host = 0;
  hk::grad_sum_squares(hctx, &host, g.data(), n);
  hk::grad_sum_squares(hctx, &host, f.data(), n, /*accumulate=*/true);
  auto d_g = to_device(g);
  auto d_f = to_device(f);
  auto d_out = poisoned_device<double>(1);
  const std::size_t sb = kc::grad_sum_squares_scratch_bytes(n);
  auto scratch = poisoned_device<char>(sb);
  double got[2];
  for (double& v : got) {
    kc::grad_sum_squares(d_out.data(), d_g.data(), n, scratch.data(), sb, s);
    kc::grad_sum_squares(d_out.data(), d_f.data(), n, scratch.data(), sb, s, /*accumulate=*/true);
    s.synchronize();
    v = to_host(d_out)[0];
  }
  CHECK(std::memcmp(&got[0], &got[1], sizeof(double)) == 0);
  // float64 sums of a few million positive terms in two orders: 1e-12.
  CHECK(std::abs(got[0] - host) <= 1e-12 * host);

  // The clip coefficient on the device, as optim::clip_coefficient.
  auto d_coef = poisoned_device<float>(1);
  for (double max_norm : {1.0, 1e6, 0.0}) {
    kc::clip_coefficient(d_coef.data(), d_out.data(), max_norm, s);
    s.synchronize();
    CHECK(to_host(d_coef)[0] ==
          static_cast<float>(tessera::optim::clip_coefficient(std::sqrt(got[0]), max_norm)));
  }
}

TEST_CASE("cuda adamw_step matches the host optimizer over segments", "[cuda][adamw]") {
  std::mt19937_64 rng(109);
  tessera::cuda::stream s;
  const std::int64_t n = 100'003;
  // Decay, no decay, a gap left alone, decay again.
  const std::vector<tessera::optim::param_range> ranges = {
      {0, 40'000, true}, {40'000, 40'100, false}, {50'000, n, true}};
  std::vector<kc::optimizer_segment> segs;
  for (const auto& r : ranges) segs.push_back({r.begin, r.end, r.decay ? 1 : 0});
  auto d_segs = to_device(segs);
  tessera::optim::adamw_config cfg;
  cfg.weight_decay = 0.1;
  const double lr = 3e-4, scale = 0.7;
  auto params_for = [&](int t) {
    return tessera::kernels::detail::adamw_step_params<float>{
        static_cast<float>(lr),
        static_cast<float>(cfg.beta1),
        static_cast<float>(cfg.beta2),
        static_cast<float>(cfg.eps),
        static_cast<float>(cfg.weight_decay),
        static_cast<float>(1.0 - std::pow(cfg.beta1, t)),
        static_cast<float>(1.0 - std::pow(cfg.beta2, t)),
        static_cast<float>(scale)};
  };

  SECTION("bf16 parameters, float32 master, bf16 gradients") {
    auto p = random_vector<bf16>(static_cast<std::size_t>(n), rng);
    tessera::optim::adamw_optimizer<bf16, bf16, float, tessera::kernels::host_context> host(
        cfg, n, ranges, hctx);
    host.init_master(p.data());
    auto d_p = to_device(p);
    std::vector<float> master(p.size());
    hk::cast(hctx, master.data(), p.data(), n);
    auto d_master = to_device(master);
    auto d_m = to_device(std::vector<float>(p.size(), 0.f));
    auto d_v = to_device(std::vector<float>(p.size(), 0.f));
    for (int t = 1; t <= 3; ++t) {
      const auto g = random_vector<bf16>(static_cast<std::size_t>(n), rng);
      host.step(p.data(), g.data(), lr, scale);
      auto d_g = to_device(g);
      kc::adamw_step(d_p.data(), d_master.data(), d_m.data(), d_v.data(), d_g.data(), n,
                     d_segs.data(), static_cast<int>(segs.size()), params_for(t), nullptr, s);
    }
    s.synchronize();
    const std::vector<float> hm(host.master(), host.master() + n),
        m1(host.exp_avg(), host.exp_avg() + n), v1(host.exp_avg_sq(), host.exp_avg_sq() + n);
    CHECK(max_rel_error(to_host(d_master), hm) < f32_tol);
    CHECK(max_rel_error(to_host(d_m), m1) < f32_tol);
    CHECK(max_rel_error(to_host(d_v), v1) < f32_tol);
    // Parameters: the master rounded once; a master within f32_tol can round to
    // the neighbouring bf16 only when it sits at a midpoint, so allow one bf16 ulp.
    CHECK(max_rel_error(to_host(d_p), p) < bf16_tol);
    // The gap was left alone.
    const auto gp = to_host(d_p);
    CHECK(std::memcmp(gp.data() + 40'100, p.data() + 40'100, 9'900 * sizeof(bf16)) == 0);
  }

  SECTION("float32 parameters in place, a device-side gradient scale") {
    auto p = random_vector<float>(static_cast<std::size_t>(n), rng);
    tessera::optim::adamw_optimizer<float, float, float, tessera::kernels::host_context> host(
        cfg, n, ranges, hctx);
    host.init_master(p.data());
    auto d_p = to_device(p);
    auto d_m = to_device(std::vector<float>(p.size(), 0.f));
    auto d_v = to_device(std::vector<float>(p.size(), 0.f));
    auto d_scale = to_device(std::vector<float>{0.5f});
    for (int t = 1; t <= 2; ++t) {
      const auto g = random_vector<float>(static_cast<std::size_t>(n), rng);
      host.step(p.data(), g.data(), lr, scale * 0.5);
      auto d_g = to_device(g);
      kc::adamw_step(d_p.data(), static_cast<float*>(nullptr), d_m.data(), d_v.data(), d_g.data(),
                     n, d_segs.data(), static_cast<int>(segs.size()), params_for(t), d_scale.data(),
                     s);
    }
    s.synchronize();
    CHECK(max_rel_error(to_host(d_p), p) < f32_tol);
    CHECK(max_rel_error(to_host(d_m), std::vector<float>(host.exp_avg(), host.exp_avg() + n)) <
          f32_tol);
    CHECK_THROWS_AS(kc::adamw_step(d_p.data(), d_p.data(), d_m.data(), d_v.data(), d_p.data(), n,
                                   d_segs.data(), 1, params_for(1), nullptr, s),
                    tessera::config_error);
  }
}

TEST_CASE("cuda rope forward and backward float32 match the host", "[cuda][rope]") {
  std::mt19937_64 rng(108);
  tessera::cuda::stream s;
  for (auto [B, T, nh, hd, offset] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, int>{2, 37, 4, 128, 0},
        {1, 9, 3, 6, 0},      // hd/2 = 3: scalar path
        {2, 5, 2, 64, 1}}) {  // misaligned x: scalar path
    INFO("B=" << B << " T=" << T << " nh=" << nh << " hd=" << hd << " offset=" << offset);
    const std::size_t n = static_cast<std::size_t>(B * T * nh * hd);
    std::vector<float> cos(static_cast<std::size_t>(T * hd / 2)), sin(cos.size());
    hk::rope_table(cos.data(), sin.data(), T, hd, 10000.0);
    const auto x = random_vector<float>(n + offset, rng, -2, 2);
    const auto dy = random_vector<float>(n + offset, rng);
    std::vector<float> y(x.begin() + offset, x.end()), dx(dy.begin() + offset, dy.end());
    hk::rope_forward(hctx, y.data(), cos.data(), sin.data(), B, T, nh, hd);
    hk::rope_backward(hctx, dx.data(), cos.data(), sin.data(), B, T, nh, hd);
    auto d_cos = to_device(cos);
    auto d_sin = to_device(sin);
    auto d_x = to_device(x);
    auto d_dy = to_device(dy);
    kc::rope_forward(d_x.data() + offset, d_cos.data(), d_sin.data(), B, T, nh, hd, s);
    kc::rope_backward(d_dy.data() + offset, d_cos.data(), d_sin.data(), B, T, nh, hd, s);
    s.synchronize();
    auto gy = to_host(d_x);
    auto gdx = to_host(d_dy);
    CHECK(std::equal(gy.begin(), gy.begin() + offset, x.begin()));  // outside untouched
    gy.erase(gy.begin(), gy.begin() + offset);
    gdx.erase(gdx.begin(), gdx.begin() + offset);
    CHECK(first_nan(gy) == -1);
    CHECK(first_nan(gdx) == -1);
    CHECK(max_rel_error(gy, y) < 1e-6);
    CHECK(max_rel_error(gdx, dx) < 1e-6);
  }
  float* none = nullptr;
  CHECK_THROWS_AS(kc::rope_forward(none, none, none, 1, 1, 1, 7, s), tessera::config_error);
  CHECK_THROWS_AS(kc::rope_backward(none, none, none, -1, 1, 1, 8, s), tessera::config_error);
}

TEST_CASE("cuda rope forward and backward bf16 match a float64 reference", "[cuda][rope]") {
  std::mt19937_64 rng(109);
  tessera::cuda::stream s;
  for (auto [B, T, nh, hd] : {std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>{
                                  2, 33, 4, 128},
                              {1, 7, 3, 12}}) {  // hd/2 = 6: scalar path
    INFO("B=" << B << " T=" << T << " nh=" << nh << " hd=" << hd);
    const std::int64_t half = hd / 2;
    const std::size_t n = static_cast<std::size_t>(B * T * nh * hd);
    std::vector<float> cos(static_cast<std::size_t>(T * half)), sin(cos.size());
    hk::rope_table(cos.data(), sin.data(), T, hd, 500000.0);
    const auto x = random_vector<bf16>(n, rng, -2, 2);
    const auto dy = random_vector<bf16>(n, rng);
    std::vector<double> y(n), dx(n);
    for (std::int64_t r = 0; r < B * T * nh; ++r) {
      const std::int64_t t = (r / nh) % T;
      for (std::int64_t i = 0; i < half; ++i) {
        const std::size_t a = static_cast<std::size_t>(r * hd + i), b = a + half;
        const double c = cos[t * half + i], sn = sin[t * half + i];
        y[a] = as_double(x[a]) * c - as_double(x[b]) * sn;
        y[b] = as_double(x[b]) * c + as_double(x[a]) * sn;
        dx[a] = as_double(dy[a]) * c + as_double(dy[b]) * sn;
        dx[b] = as_double(dy[b]) * c - as_double(dy[a]) * sn;
      }
    }
    auto d_cos = to_device(cos);
    auto d_sin = to_device(sin);
    auto d_x = to_device(x);
    auto d_dy = to_device(dy);
    kc::rope_forward(d_x.data(), d_cos.data(), d_sin.data(), B, T, nh, hd, s);
    kc::rope_backward(d_dy.data(), d_cos.data(), d_sin.data(), B, T, nh, hd, s);
    s.synchronize();
    const auto gy = to_host(d_x);
    const auto gdx = to_host(d_dy);
    CHECK(first_nan(gy) == -1);
    CHECK(first_nan(gdx) == -1);
    CHECK(max_rel_error(gy, y) < bf16_tol);
    CHECK(max_rel_error(gdx, dx) < bf16_tol);
  }
}

namespace {

// doc_start (B, T) of rows cut into documents of 5, 1, 7, 3, 2, 9, ...
// tokens in turn: global positions, documents across the cp chunks.
std::vector<std::int32_t> rope_doc_starts(std::int64_t B, std::int64_t T) {
  return tessera::testing::packed_doc_starts(B, T, {5, 1, 7, 3, 2, 9});
}
using tessera::testing::shard_rows;

// The GPU kernels on a whole (B, T) batch (with a device doc_start of global
// document starts, or none), then on each cp rank's tokens with
// rope_positions::of(shard, the rank's rows of doc_start, on the device):
// the same compiled code on the same values, so bit for bit the whole
// batch's rows at the ranks' positions. The whole float32 batch against the
// host as the plain case above: within 1e-6 relative (FMA contraction).
template <class T>
void rope_cp_case(bool documents, std::uint64_t seed) {
  INFO("documents=" << documents);
  std::mt19937_64 rng(seed);
  tessera::cuda::stream s;
  const std::int64_t B = 2, T_ = 24, nh = 4, hd = 128, width = nh * hd;
  std::vector<float> cos(static_cast<std::size_t>(T_ * hd / 2)), sin(cos.size());
  hk::rope_table(cos.data(), sin.data(), T_, hd, 10000.0);
  const auto d_cos = to_device(cos);
  const auto d_sin = to_device(sin);
  const auto ds = documents ? rope_doc_starts(B, T_) : std::vector<std::int32_t>(1);
  const auto d_ds = to_device(ds);
  const auto x = random_vector<T>(static_cast<std::size_t>(B * T_ * width), rng, -2, 2);
  const auto dy = random_vector<T>(x.size(), rng);
  auto d_x = to_device(x);
  auto d_dy = to_device(dy);
  kc::rope_forward(d_x.data(), d_cos.data(), d_sin.data(), B, T_, nh, hd, s,
                   documents ? d_ds.data() : nullptr);
  kc::rope_backward(d_dy.data(), d_cos.data(), d_sin.data(), B, T_, nh, hd, s,
                    documents ? d_ds.data() : nullptr);
  s.synchronize();
  const auto y = to_host(d_x);
  const auto dx = to_host(d_dy);
  if constexpr (std::is_same_v<T, float>) {
    auto hy = x, hdx = dy;
    hk::rope_forward(hctx, hy.data(), cos.data(), sin.data(), B, T_, nh, hd,
                     documents ? ds.data() : nullptr);
    hk::rope_backward(hctx, hdx.data(), cos.data(), sin.data(), B, T_, nh, hd,
                      documents ? ds.data() : nullptr);
    CHECK(max_rel_error(y, hy) < 1e-6);
    CHECK(max_rel_error(dx, hdx) < 1e-6);
  }
  for (int cp : {2, 3})
    for (int r = 0; r < cp; ++r) {
      INFO("cp=" << cp << " rank=" << r);
      const tessera::cp_shard sh = tessera::cp_shard::of(T_, cp, r);
      const auto d_ds_local = to_device(documents ? shard_rows(ds, sh, B, 1) : ds);
      const hk::rope_positions pos =
          hk::rope_positions::of(sh, documents ? d_ds_local.data() : nullptr);
      auto d_xl = to_device(shard_rows(x, sh, B, width));
      auto d_dyl = to_device(shard_rows(dy, sh, B, width));
      kc::rope_forward(d_xl.data(), d_cos.data(), d_sin.data(), B, sh.tokens(), nh, hd, s, pos);
      kc::rope_backward(d_dyl.data(), d_cos.data(), d_sin.data(), B, sh.tokens(), nh, hd, s, pos);
      s.synchronize();
      CHECK(same_bits(to_host(d_xl), shard_rows(y, sh, B, width)));
      CHECK(same_bits(to_host(d_dyl), shard_rows(dx, sh, B, width)));
    }
}

}  // namespace

TEST_CASE("cuda rope at cp ranks' global positions gives the whole batch's bits", "[cuda][rope]") {
  std::uint64_t seed = 110;
  for (bool documents : {false, true}) {
    rope_cp_case<float>(documents, seed++);
    rope_cp_case<bf16>(documents, seed++);
  }
}
