// Flash attention on the GPU (include/tessera/kernels/cuda/attention.hpp)
// against the host's float64 attention (kernels/attention.hpp) of the same
// bf16-rounded inputs: forward out and lse, backward dq, dk, dv, for hd 64
// and 128, grouped-query (nh 8, nkv 2) and multi-head (nh 4) attention,
// B = 2, S = 1, 17, 200 and 333 (not multiples of the 128/64-row tiles);
// outputs and scratch poisoned with NaN (0xFF) before each launch; two runs
// bit-identical; argument errors thrown before any launch. Skipped without a
// device (main.cpp). The same kernels run under a warp emulator in the host
// test tests/kernels/cuda_attention_launch.cpp, with the same tolerances.
#include <cstring>

#include <tessera/kernels/attention.hpp>
#include <tessera/kernels/cuda/attention.hpp>

#include "cuda_testing.hpp"

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
/// The host context of the reference kernels.
const tessera::kernels::host_context hctx{};
using tessera::bf16;
using namespace tessera::testing;

namespace {

// Tolerances against float64 of the same bf16 inputs (justified in
// tests/kernels/cuda_attention_launch.cpp): FlashAttention-2 rounds P and dS
// to bf16 before their products, and sums of terms of both signs give the
// error relative to the result's typical size a long tail (a float64 attention
// that rounds only P and the outputs shows up to 0.8% on out and 2% on dv).
constexpr double out_tol = 1.0 / 64;   // out, bf16
constexpr double lse_tol = 1e-5;       // lse, float32
constexpr double grad_tol = 1.0 / 32;  // dq, dk, dv, bf16

double rms_of(const std::vector<double>& x) {
  double ss = 0;
  for (double v : x) ss += v * v;
  return std::sqrt(ss / static_cast<double>(std::max<std::size_t>(1, x.size())));
}

// max_rel_error with a floor: dq and dk cancel to zero at S = 1 (float64)
// and to float32 rounding on the GPU, so they are measured against at least
// 2^-8 of the size of their terms.
double max_error(const std::vector<double>& got, const std::vector<double>& want,
                 double floor = 1e-300) {
  REQUIRE(got.size() == want.size());
  const double rms = rms_of(want);
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) return INFINITY;
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max({std::abs(want[i]), rms, floor}));
  }
  return worst;
}

struct attn_case {
  std::int64_t B, S, nh, nkv, hd;
};

}  // namespace

TEST_CASE("cuda flash attention forward and backward match float64 attention",
          "[cuda][attention]") {
  tessera::cuda::stream s;
  std::uint64_t seed = 9100;
  for (std::int64_t hd : {64, 128})
    for (auto [nh, nkv] : {std::pair<std::int64_t, std::int64_t>{8, 2}, {4, 4}})
      for (std::int64_t S : {1, 17, 200, 333}) {
        const attn_case c{2, S, nh, nkv, hd};
        INFO("B=" << c.B << " S=" << c.S << " nh=" << c.nh << " nkv=" << c.nkv << " hd=" << c.hd);
        std::mt19937_64 rng(++seed);
        const auto nq = static_cast<std::size_t>(c.B * c.S * c.nh * c.hd);
        const auto nk = static_cast<std::size_t>(c.B * c.S * c.nkv * c.hd);
        const auto nl = static_cast<std::size_t>(c.B * c.nh * c.S);
        // Scores of order 1 after the 1/sqrt(hd) scale: q, k in [-2, 2).
        const auto q = random_vector<bf16>(nq, rng, -2, 2);
        const auto k = random_vector<bf16>(nk, rng, -2, 2);
        const auto v = random_vector<bf16>(nk, rng);
        const auto dout = random_vector<bf16>(nq, rng);
        const auto qd = to_double(q), kd = to_double(k), vd = to_double(v), dod = to_double(dout);

        // Forward.
        std::vector<double> out_ref(nq), lse_ref(nl);
        hk::attention_forward<double>(hctx, out_ref.data(), lse_ref.data(), qd.data(), kd.data(),
                                      vd.data(), c.B, c.S, c.nh, c.nkv, c.hd);
        auto d_q = to_device(q), d_k = to_device(k), d_v = to_device(v), d_do = to_device(dout);
        auto d_out = poisoned_device<bf16>(nq);
        auto d_lse = poisoned_device<float>(nl);
        kc::flash_attention_forward(d_out.data(), d_lse.data(), d_q.data(), d_k.data(), d_v.data(),
                                    c.B, c.S, c.nh, c.nkv, c.hd, s);
        s.synchronize();
        const auto out = to_host(d_out);
        const auto lse = to_host(d_lse);
        CHECK(first_nan(out) == -1);  // every element written
        CHECK(first_nan(lse) == -1);
        CHECK(max_error(to_double(out), out_ref) < out_tol);
        CHECK(max_error(to_double(lse), lse_ref) < lse_tol);

        // Backward from the GPU's own out and lse (as a trainer saves them); the
        // reference gets the same values.
        std::vector<double> dq_ref(nq), dk_ref(nk), dv_ref(nk);
        const auto outd = to_double(out), lsed = to_double(lse);
        hk::attention_backward<double, double>(hctx, 
            dq_ref.data(), dk_ref.data(), dv_ref.data(), dod.data(), qd.data(), kd.data(),
            vd.data(), outd.data(), lsed.data(), c.B, c.S, c.nh, c.nkv, c.hd);
        const std::size_t sb =
            kc::flash_attention_backward_scratch_bytes(c.B, c.S, c.nh, c.nkv, c.hd);
        CHECK(sb == nl * sizeof(float));
        auto scratch = poisoned_device<char>(sb);
        auto d_dq = poisoned_device<bf16>(nq);
        auto d_dk = poisoned_device<bf16>(nk);
        auto d_dv = poisoned_device<bf16>(nk);
        auto backward = [&] {
          kc::flash_attention_backward(d_dq.data(), d_dk.data(), d_dv.data(), d_do.data(),
                                       d_q.data(), d_k.data(), d_v.data(), d_out.data(),
                                       d_lse.data(), c.B, c.S, c.nh, c.nkv, c.hd, scratch.data(),
                                       sb, s);
        };
        backward();
        s.synchronize();
        const auto dq = to_host(d_dq), dk = to_host(d_dk), dv = to_host(d_dv);
        CHECK(first_nan(dq) == -1);
        CHECK(first_nan(dk) == -1);
        CHECK(first_nan(dv) == -1);
        const double floor = rms_of(dod) * rms_of(vd) * rms_of(kd) / 256;
        CHECK(max_error(to_double(dq), dq_ref, floor) < grad_tol);
        CHECK(max_error(to_double(dk), dk_ref, floor) < grad_tol);
        CHECK(max_error(to_double(dv), dv_ref) < grad_tol);

        // Deterministic: a second run, into re-poisoned buffers, gives the same bits.
        TESSERA_CUDA_CHECK(cudaMemset(d_out.data(), 0xFF, nq * sizeof(bf16)));
        TESSERA_CUDA_CHECK(cudaMemset(d_lse.data(), 0xFF, nl * sizeof(float)));
        kc::flash_attention_forward(d_out.data(), d_lse.data(), d_q.data(), d_k.data(), d_v.data(),
                                    c.B, c.S, c.nh, c.nkv, c.hd, s);
        TESSERA_CUDA_CHECK(cudaMemset(d_dq.data(), 0xFF, nq * sizeof(bf16)));
        TESSERA_CUDA_CHECK(cudaMemset(d_dk.data(), 0xFF, nk * sizeof(bf16)));
        TESSERA_CUDA_CHECK(cudaMemset(d_dv.data(), 0xFF, nk * sizeof(bf16)));
        TESSERA_CUDA_CHECK(cudaMemset(scratch.data(), 0xFF, sb));
        backward();
        s.synchronize();
        CHECK(same_bits(to_host(d_out), out));
        CHECK(same_bits(to_host(d_lse), lse));
        CHECK(same_bits(to_host(d_dq), dq));
        CHECK(same_bits(to_host(d_dk), dk));
        CHECK(same_bits(to_host(d_dv), dv));
      }
}

TEST_CASE("cuda flash attention with a document mask matches float64 attention per document",
          "[cuda][attention][document_mask]") {
  // Packed documents (doc_start, kernels::attention_mask): the host's float64
  // attention with the same mask is the reference (it equals attention run
  // on each document alone: tests/kernels/attention_document_mask.cpp).
  // Documents crossing the 128-row query and 64/128-row key tiles, a row
  // that starts with a one-token document, runs of length-1 documents, a
  // last query tile whose document starts after key tile 0. A mask of one
  // document per row (all zeros) gives the bits of no mask.
  tessera::cuda::stream s;
  const std::int64_t B = 2, S = 333, nh = 8, nkv = 2;
  std::vector<std::int32_t> ds;
  for (const auto& row : {std::vector<std::int64_t>{1, 70, 1, 1, 60, 67, 133},
                          std::vector<std::int64_t>{130, 1, 1, 1, 200}}) {
    std::int64_t start = 0;
    for (std::int64_t len : row) {
      ds.insert(ds.end(), static_cast<std::size_t>(len), static_cast<std::int32_t>(start));
      start += len;
    }
  }
  REQUIRE(ds.size() == static_cast<std::size_t>(B * S));
  const std::vector<std::int32_t> zeros(ds.size(), 0);
  auto d_ds = to_device(ds);
  auto d_zeros = to_device(zeros);
  std::uint64_t seed = 9300;
  for (std::int64_t hd : {64, 128}) {
    INFO("hd=" << hd);
    std::mt19937_64 rng(++seed);
    const auto nq = static_cast<std::size_t>(B * S * nh * hd);
    const auto nk = static_cast<std::size_t>(B * S * nkv * hd);
    const auto nl = static_cast<std::size_t>(B * nh * S);
    const auto q = random_vector<bf16>(nq, rng, -2, 2);
    const auto k = random_vector<bf16>(nk, rng, -2, 2);
    const auto v = random_vector<bf16>(nk, rng);
    const auto dout = random_vector<bf16>(nq, rng);
    const auto qd = to_double(q), kd = to_double(k), vd = to_double(v), dod = to_double(dout);
    auto d_q = to_device(q), d_k = to_device(k), d_v = to_device(v), d_do = to_device(dout);
    const std::size_t sb = kc::flash_attention_backward_scratch_bytes(B, S, nh, nkv, hd);
    struct result {
      std::vector<bf16> out, dq, dk, dv;
      std::vector<float> lse;
    };
    auto run = [&](const std::int32_t* d_doc) {
      auto d_out = poisoned_device<bf16>(nq);
      auto d_lse = poisoned_device<float>(nl);
      auto scratch = poisoned_device<char>(sb);
      auto d_dq = poisoned_device<bf16>(nq);
      auto d_dk = poisoned_device<bf16>(nk);
      auto d_dv = poisoned_device<bf16>(nk);
      kc::flash_attention_forward(d_out.data(), d_lse.data(), d_q.data(), d_k.data(), d_v.data(), B,
                                  S, nh, nkv, hd, s, d_doc);
      kc::flash_attention_backward(d_dq.data(), d_dk.data(), d_dv.data(), d_do.data(), d_q.data(),
                                   d_k.data(), d_v.data(), d_out.data(), d_lse.data(), B, S, nh,
                                   nkv, hd, scratch.data(), sb, s, d_doc);
      s.synchronize();
      return result{to_host(d_out), to_host(d_dq), to_host(d_dk), to_host(d_dv), to_host(d_lse)};
    };
    const result g = run(d_ds.data());
    CHECK(first_nan(g.out) == -1);
    CHECK(first_nan(g.lse) == -1);
    CHECK(first_nan(g.dq) == -1);
    CHECK(first_nan(g.dk) == -1);
    CHECK(first_nan(g.dv) == -1);
    const hk::attention_mask mask{ds.data()};
    std::vector<double> out_ref(nq), lse_ref(nl), dq_ref(nq), dk_ref(nk), dv_ref(nk);
    hk::attention_forward<double>(hctx, out_ref.data(), lse_ref.data(), qd.data(), kd.data(),
                                  vd.data(), B, S, nh, nkv, hd, mask);
    CHECK(max_error(to_double(g.out), out_ref) < out_tol);
    CHECK(max_error(to_double(g.lse), lse_ref) < lse_tol);
    const auto outd = to_double(g.out), lsed = to_double(g.lse);
    hk::attention_backward<double, double>(hctx, dq_ref.data(), dk_ref.data(), dv_ref.data(),
                                           dod.data(), qd.data(), kd.data(), vd.data(), outd.data(),
                                           lsed.data(), B, S, nh, nkv, hd, mask);
    const double floor = rms_of(dod) * rms_of(vd) * rms_of(kd) / 256;
    CHECK(max_error(to_double(g.dq), dq_ref, floor) < grad_tol);
    CHECK(max_error(to_double(g.dk), dk_ref, floor) < grad_tol);
    CHECK(max_error(to_double(g.dv), dv_ref) < grad_tol);

    // One document per row: the unmasked kernels' bits.
    const result plain = run(nullptr), one = run(d_zeros.data());
    CHECK(same_bits(one.out, plain.out));
    CHECK(same_bits(one.lse, plain.lse));
    CHECK(same_bits(one.dq, plain.dq));
    CHECK(same_bits(one.dk, plain.dk));
    CHECK(same_bits(one.dv, plain.dv));
  }
}

TEST_CASE("cuda flash attention refuses bad arguments before any launch", "[cuda][attention]") {
  tessera::cuda::stream s;
  const std::int64_t B = 1, S = 40, nh = 4, nkv = 2, hd = 64;
  const auto nq = static_cast<std::size_t>(B * S * nh * hd);
  const auto nk = static_cast<std::size_t>(B * S * nkv * hd);
  std::mt19937_64 rng(9200);
  auto d_q = to_device(random_vector<bf16>(nq + 8, rng));
  auto d_k = to_device(random_vector<bf16>(nk, rng));
  auto d_v = to_device(random_vector<bf16>(nk, rng));
  auto d_out = poisoned_device<bf16>(nq);
  auto d_lse = poisoned_device<float>(static_cast<std::size_t>(B * nh * S));
  using tessera::config_error;
  auto fwd = [&](const bf16* q, std::int64_t nkv_, std::int64_t hd_) {
    kc::flash_attention_forward(d_out.data(), d_lse.data(), q, d_k.data(), d_v.data(), B, S, nh,
                                nkv_, hd_, s);
  };
  CHECK_THROWS_WITH(fwd(d_q.data(), 3, hd), Catch::Contains("nkv=3") && Catch::Contains("nh=4"));
  CHECK_THROWS_WITH(fwd(d_q.data(), nkv, 96), Catch::Contains("hd=96"));
  CHECK_THROWS_WITH(fwd(d_q.data() + 1, nkv, hd), Catch::Contains("d_q"));  // 2-byte aligned
  CHECK_THROWS_AS(fwd(nullptr, nkv, hd), config_error);
  CHECK_THROWS_AS(kc::flash_attention_forward(d_out.data(), d_lse.data(), d_q.data(), d_k.data(),
                                              d_v.data(), B, 0, nh, nkv, hd, s),
                  config_error);
  // The poisoned output was not touched by any of these.
  CHECK(first_nan(to_host(d_out)) == 0);

  const std::size_t sb = kc::flash_attention_backward_scratch_bytes(B, S, nh, nkv, hd);
  CHECK(sb == static_cast<std::size_t>(B * nh * S) * sizeof(float));
  auto scratch = poisoned_device<char>(sb);
  auto d_dq = poisoned_device<bf16>(nq);
  auto d_dk = poisoned_device<bf16>(nk);
  auto d_dv = poisoned_device<bf16>(nk);
  CHECK_THROWS_WITH(
      kc::flash_attention_backward(d_dq.data(), d_dk.data(), d_dv.data(), d_out.data(), d_q.data(),
                                   d_k.data(), d_v.data(), d_out.data(), d_lse.data(), B, S, nh,
                                   nkv, hd, scratch.data(), sb - 4, s),
      Catch::Contains("scratch_bytes") && Catch::Contains(std::to_string(sb)));
  CHECK_THROWS_AS(
      kc::flash_attention_backward(d_dq.data() + 3, d_dk.data(), d_dv.data(), d_out.data(),
                                   d_q.data(), d_k.data(), d_v.data(), d_out.data(), d_lse.data(),
                                   B, S, nh, nkv, hd, scratch.data(), sb, s),
      config_error);
  CHECK_THROWS_AS(kc::flash_attention_backward_scratch_bytes(B, S, nh, nkv, 80), config_error);
  CHECK(first_nan(to_host(d_dq)) == 0);
}

TEST_CASE("cuda flash attention FLOP counts", "[cuda][attention]") {
  // 2 B nh S^2 hd forward (Q K^T and P V over the causal half), 2.5 times that backward.
  CHECK(kc::flash_attention_forward_flops(1, 4096, 32, 128) == 2.0 * 32 * 4096.0 * 4096 * 128);
  CHECK(kc::flash_attention_backward_flops(1, 4096, 32, 128) ==
        2.5 * kc::flash_attention_forward_flops(1, 4096, 32, 128));
  CHECK(kc::flash_attention_forward_flops(2, 100, 8, 64) == 2.0 * 2 * 8 * 100 * 100 * 64);
}
