// The ring-attention blocks of the CUDA flash attention, without a GPU: the
// block form of the forward, dK/dV and dQ bodies of
// include/tessera/kernels/cuda/attention.cuh (queries and keys at global
// offsets, float32 outputs) under the warp emulator of
// tests/support/cuda_emulator.hpp, and the merge bodies of
// kernels/cuda/attention_merge.cuh ("attention_merge_out",
// "attention_merge_lse") under its block launcher.
//
// - The merge: bit for bit the host kernels::attention_merge<float> (the
//   same per-element functions, compiled here by the same compiler), with
//   -inf rows, 16-byte and scalar accesses.
// - A ring: a sequence split over cp = 2 ranks, contiguously and head-tail
//   (rank r holding chunks r and 2 cp - 1 - r), chunks that are not
//   multiples of the kernels' 64- and 128-row tiles, with and without a
//   document mask; every rank's query chunks against every key chunk in
//   ring order (emulated forward blocks merged by the emulated merge; then
//   emulated backward blocks from the merged out and lse, dq accumulated in
//   float32, each key chunk's dk, dv summed over ranks) equals the float64
//   host attention of the whole sequence on the same rounded inputs, at the
//   tolerances of tests/kernels/cuda_attention_launch.cpp (FlashAttention-2
//   rounds P and dS to 16 bits per block as it does per tile). A block
//   wholly in the queries' future writes out 0, lse -inf, dk = dv = 0 and
//   leaves dq's bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <tessera/kernels/attention.hpp>
#include <tessera/kernels/cuda/attention.cuh>
#include <tessera/kernels/cuda/attention_launch.hpp>
#include <tessera/kernels/cuda/attention_merge.cuh>

#include "../support/cuda_emulator.hpp"
#include "kernel_testing.hpp"

namespace test_kernels_emulated_attention_blocks {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
using tessera::bf16;
using tessera::fp16;
using namespace tessera::testing;

namespace {

using strings = std::vector<std::string>;
constexpr float neg_inf = -std::numeric_limits<float>::infinity();

template <class T>
std::vector<std::uint16_t> bits_of(const std::vector<T>& v) {
  std::vector<std::uint16_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = v[i].bits;
  return b;
}
template <class T>
std::vector<double> doubles_of_bits(const std::vector<std::uint16_t>& b) {
  std::vector<double> d(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) d[i] = static_cast<float>(T::from_bits(b[i]));
  return d;
}

// Largest |got - want| / max(|want|, rms(want), floor), as
// cuda_attention_launch.cpp's max_error; equal infinities count as 0.
double max_error(const std::vector<double>& got, const std::vector<double>& want,
                 double floor = 1e-300) {
  REQUIRE(got.size() == want.size());
  double ss = 0;
  std::size_t n = 0;
  for (double w : want)
    if (std::isfinite(w)) ss += w * w, ++n;
  const double rms = std::sqrt(ss / static_cast<double>(std::max<std::size_t>(1, n)));
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return INFINITY;
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max({std::abs(want[i]), rms, floor}));
  }
  return worst;
}
double rms_of(const std::vector<double>& x) {
  double ss = 0;
  for (double v : x) ss += v * v;
  return std::sqrt(ss / static_cast<double>(std::max<std::size_t>(1, x.size())));
}

// Rows [t0, t0 + len) of every batch row of a (B, S, w) tensor, as (B, len, w).
template <class U>
std::vector<U> rows_of(const std::vector<U>& x, std::int64_t B, std::int64_t S, std::int64_t w,
                       std::int64_t t0, std::int64_t len) {
  std::vector<U> y;
  for (std::int64_t b = 0; b < B; ++b) {
    const auto first = x.begin() + (b * S + t0) * w;
    y.insert(y.end(), first, first + len * w);
  }
  return y;
}

std::vector<std::int32_t> doc_starts(const std::vector<std::vector<std::int64_t>>& lengths) {
  std::vector<std::int32_t> ds;
  for (const auto& row : lengths) {
    std::int64_t start = 0;
    for (std::int64_t len : row) {
      ds.insert(ds.end(), static_cast<std::size_t>(len), static_cast<std::int32_t>(start));
      start += len;
    }
  }
  return ds;
}

// The merge of (out_acc, lse_acc) with a part under the emulator; checks
// its bits against the host attention_merge<float> on copies.
void emulated_merge(std::vector<float>& out_acc, std::vector<float>& lse_acc,
                    const std::vector<float>& out_part, const std::vector<float>& lse_part,
                    std::int64_t B, std::int64_t S, std::int64_t nh, std::int64_t hd,
                    std::uint64_t seed) {
  std::vector<float> want_out = out_acc, want_lse = lse_acc;
  hk::attention_merge(ctx, want_out.data(), want_lse.data(), out_part.data(), lse_part.data(), B, S,
                      nh, hd);
  cuda_emulator em(seed);
  em.output(out_acc);
  em.output(lse_acc);
  em.input(out_part);
  em.input(lse_part);
  strings launched;
  kc::attention_merge_launch(emulator_launcher{&em, std::int64_t(1) << 24, &launched},
                             out_acc.data(), lse_acc.data(), out_part.data(), lse_part.data(), B, S,
                             nh, hd);
  CHECK(launched == strings{"attention_merge_out", "attention_merge_lse"});
  CHECK(same_bits(out_acc, want_out));
  CHECK(same_bits(lse_acc, want_lse));
}

template <class T>
using emu_ops = emulator_attention_ops<T>;
using form = kc::detail::attention_form;

// Runs one emulated block body over its grid; fails the test on an emulator error.
template <class Body>
void run_grid(cuda_emulator& em, const kc::launch_config& c, std::size_t smem, Body body) {
  for (std::int64_t y = 0; y < c.grid_y; ++y)
    for (std::int64_t x = 0; x < c.grid_x; ++x) {
      const std::string err =
          em.run_block(kc::attention_threads, smem, [&](int tid) { body(x, y, tid); });
      if (!err.empty()) FAIL("block (" << x << ", " << y << "): " << err);
    }
}

struct dims {
  std::int64_t B, nh, nkv;
};

// One block forward (block form) under the emulator: out (B, S, nh, HD) and
// lse (B, nh, S) float32 of queries q (B, S, nh, HD) at span.q0 against
// k, v (B, Sk, nkv, HD) at span.k0.
template <class T, int HD>
void block_forward(cuda_emulator& em, std::vector<float>& out, std::vector<float>& lse,
                   const std::vector<std::uint16_t>& q, const std::vector<std::uint16_t>& k,
                   const std::vector<std::uint16_t>& v, const dims& d, std::int64_t S,
                   const std::int32_t* doc_start, hk::attention_span span) {
  out.assign(static_cast<std::size_t>(d.B * S * d.nh * HD),
             std::numeric_limits<float>::quiet_NaN());
  lse.assign(static_cast<std::size_t>(d.B * d.nh * S), std::numeric_limits<float>::quiet_NaN());
  const auto p =
      kc::detail::attention_forward_block_args(out.data(), lse.data(), q.data(), k.data(), v.data(),
                                               d.B, S, d.nh, d.nkv, HD, doc_start, span);
  em.clear_regions();
  em.input(q);
  em.input(k);
  em.input(v);
  em.output(out);
  em.output(lse);
  using ft = kc::attention_forward_traits<HD>;
  const auto c = kc::attention_forward_config(d.B, S, d.nh, d.nkv, HD);
  run_grid(em, c, c.dynamic_smem, [&](std::int64_t x, std::int64_t y, int tid) {
    auto& sm = *reinterpret_cast<typename ft::shared_storage*>(em.shared_base());
    kc::detail::attention_forward_block<emu_ops<T>, HD, form::block>(
        p, x, static_cast<int>(c.grid_y - 1 - y), sm, tid);
  });
}

// One block backward (block form) under the emulator from the final out
// (16-bit) and lse: dq (B, S, nh, HD) float32 accumulated into (or, with
// attention_dq::write, written), dk, dv (B, Sk, nkv, HD) float32 written.
template <class T, int HD>
void block_backward(cuda_emulator& em, std::vector<float>& dq, std::vector<float>& dk,
                    std::vector<float>& dv, const std::vector<std::uint16_t>& dout,
                    const std::vector<std::uint16_t>& q, const std::vector<std::uint16_t>& k,
                    const std::vector<std::uint16_t>& v, const std::vector<std::uint16_t>& out,
                    const std::vector<float>& lse, const dims& d, std::int64_t S,
                    const std::int32_t* doc_start, hk::attention_span span,
                    hk::attention_dq dq_mode = hk::attention_dq::accumulate) {
  const std::int64_t Sk = span.Sk;
  dk.assign(static_cast<std::size_t>(d.B * Sk * d.nkv * HD),
            std::numeric_limits<float>::quiet_NaN());
  dv = dk;
  std::vector<float> scratch(static_cast<std::size_t>(d.B * d.nh * S),
                             std::numeric_limits<float>::quiet_NaN());
  const auto p = kc::detail::attention_backward_block_args(
      dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
      lse.data(), d.B, S, d.nh, d.nkv, HD, scratch.data(), scratch.size() * sizeof(float),
      doc_start, span, dq_mode);
  em.clear_regions();
  for (const auto* in : {&dout, &q, &k, &v, &out}) em.input(*in);
  em.input(lse);
  em.output(scratch);
  em.output(dq);
  em.output(dk);
  em.output(dv);
  const auto cd = kc::attention_backward_d_config(d.B, S, d.nh, d.nkv, HD);
  run_grid(em, cd, 0, [&](std::int64_t x, std::int64_t, int tid) {
    kc::detail::attention_backward_d_block<emu_ops<T>, HD>(p, x, tid);
  });
  using kvt = kc::attention_backward_kv_traits<HD>;
  const auto ckv = kc::attention_backward_kv_config(d.B, Sk, d.nh, d.nkv, HD);
  run_grid(em, ckv, ckv.dynamic_smem, [&](std::int64_t x, std::int64_t y, int tid) {
    auto& sm = *reinterpret_cast<typename kvt::shared_storage*>(em.shared_base());
    kc::detail::attention_backward_kv_block<emu_ops<T>, HD, form::block>(p, x, static_cast<int>(y),
                                                                         sm, tid);
  });
  using qt = kc::attention_backward_q_traits<HD>;
  const auto cq = kc::attention_backward_q_config(d.B, S, d.nh, d.nkv, HD);
  run_grid(em, cq, cq.dynamic_smem, [&](std::int64_t x, std::int64_t y, int tid) {
    auto& sm = *reinterpret_cast<typename qt::shared_storage*>(em.shared_base());
    kc::detail::attention_backward_q_block<emu_ops<T>, HD, form::block>(
        p, x, static_cast<int>(cq.grid_y - 1 - y), sm, tid);
  });
}

// Tolerances: cuda_attention_launch.cpp's (P and dS rounded to 16 bits
// before they multiply V, dO, K, Q; here per block as there per tile).
template <class T>
constexpr double out_tol = std::is_same_v<T, fp16> ? 1.0 / 512 : 1.0 / 64;
template <class T>
constexpr double grad_tol = std::is_same_v<T, fp16> ? 1.0 / 256 : 1.0 / 32;
constexpr double lse_tol = 1e-5;

// A sequence of S tokens cut into chunks at `start` (chunk c: [start[c],
// start[c + 1])), rank r holding the chunks ranks[r]: the emulated ring
// against the host's float64 attention of the whole sequence.
template <class T, int HD>
void ring_case(const dims& d, std::int64_t S, const std::vector<std::int64_t>& start,
               const std::vector<std::vector<std::size_t>>& ranks,
               const std::vector<std::int32_t>& ds_all, std::uint64_t seed) {
  INFO(tessera::dtype_name<T>() << " hd=" << HD << " S=" << S << " ranks=" << ranks.size()
                                << " documents=" << !ds_all.empty());
  const std::int64_t B = d.B, nh = d.nh, nkv = d.nkv;
  std::mt19937_64 rng(seed);
  const auto nq = static_cast<std::size_t>(B * S * nh * HD);
  const auto nk = static_cast<std::size_t>(B * S * nkv * HD);
  const auto q = bits_of(random_vector<T>(nq, rng, -2, 2));
  const auto k = bits_of(random_vector<T>(nk, rng, -2, 2));
  const auto v = bits_of(random_vector<T>(nk, rng));
  const auto dout = bits_of(random_vector<T>(nq, rng));
  const auto qd = doubles_of_bits<T>(q), kd = doubles_of_bits<T>(k), vd = doubles_of_bits<T>(v),
             dod = doubles_of_bits<T>(dout);
  const hk::attention_mask mask{ds_all.empty() ? nullptr : ds_all.data()};

  // The float64 reference: forward; then the backward from that out rounded
  // to T and lse to float, which the ring's backward gets too (as a trainer
  // hands the saved ones).
  std::vector<double> ref_out(nq), ref_lse(static_cast<std::size_t>(B * nh * S));
  hk::attention_forward<double>(ctx, ref_out.data(), ref_lse.data(), qd.data(), kd.data(),
                                vd.data(), B, S, nh, nkv, HD, mask);
  std::vector<std::uint16_t> out_final(nq);
  std::vector<double> out_final_d(nq);
  for (std::size_t i = 0; i < nq; ++i) {
    out_final[i] = T(ref_out[i]).bits;
    out_final_d[i] = static_cast<float>(T::from_bits(out_final[i]));
  }
  std::vector<float> lse_final(ref_lse.begin(), ref_lse.end());
  std::vector<double> lse_final_d(lse_final.begin(), lse_final.end());
  std::vector<double> ref_dq(nq), ref_dk(nk), ref_dv(nk);
  hk::attention_backward<double, double>(
      ctx, ref_dq.data(), ref_dk.data(), ref_dv.data(), dod.data(), qd.data(), kd.data(), vd.data(),
      out_final_d.data(), lse_final_d.data(), B, S, nh, nkv, HD, mask);

  std::vector<double> out(nq), lse(ref_lse.size()), dq(nq), dk(nk, 0.0), dv(nk, 0.0);
  cuda_emulator em(seed);
  const std::size_t cp = ranks.size();
  for (std::size_t r = 0; r < cp; ++r)
    for (std::size_t qc : ranks[r]) {
      const std::int64_t q0 = start[qc], Sq = start[qc + 1] - q0;
      const auto qr = rows_of(q, B, S, nh * HD, q0, Sq);
      const auto dor = rows_of(dout, B, S, nh * HD, q0, Sq);
      const auto outr = rows_of(out_final, B, S, nh * HD, q0, Sq);
      const auto lser = rows_of(lse_final, B * nh, S, 1, q0, Sq);
      const auto dsr = ds_all.empty() ? ds_all : rows_of(ds_all, B, S, 1, q0, Sq);
      const std::int32_t* dsp = dsr.empty() ? nullptr : dsr.data();
      std::vector<float> o_acc(qr.size(), 0.0f),
          l_acc(static_cast<std::size_t>(B * nh * Sq), neg_inf);
      std::vector<float> o_part, l_part, dq_acc(qr.size(), 0.0f), dk_part, dv_part;
      for (std::size_t i = 0; i < cp; ++i)
        for (std::size_t kc_ : ranks[(r + cp - i) % cp]) {
          const std::int64_t k0 = start[kc_], Sk = start[kc_ + 1] - k0;
          const auto kr = rows_of(k, B, S, nkv * HD, k0, Sk),
                     vr = rows_of(v, B, S, nkv * HD, k0, Sk);
          const hk::attention_span span{q0, k0, Sk};
          INFO("queries " << q0 << "+" << Sq << ", keys " << k0 << "+" << Sk);
          block_forward<T, HD>(em, o_part, l_part, qr, kr, vr, d, Sq, dsp, span);
          CHECK(first_nan(o_part) == -1);  // every element written
          CHECK(first_nan(l_part) == -1);
          if (k0 > q0 + Sq - 1) {  // wholly in the future: out 0, lse -inf
            CHECK(std::all_of(o_part.begin(), o_part.end(), [](float x) { return x == 0.0f; }));
            CHECK(std::all_of(l_part.begin(), l_part.end(), [](float x) { return x == neg_inf; }));
          }
          emulated_merge(o_acc, l_acc, o_part, l_part, B, Sq, nh, HD, seed + i);
          // The backward of the block, from the final out and lse.
          const std::vector<float> dq_before = dq_acc;
          block_backward<T, HD>(em, dq_acc, dk_part, dv_part, dor, qr, kr, vr, outr, lser, d, Sq,
                                dsp, span);
          CHECK(first_nan(dq_acc) == -1);
          CHECK(first_nan(dk_part) == -1);
          CHECK(first_nan(dv_part) == -1);
          if (k0 > q0 + Sq - 1) {  // nothing flows: dq's bits kept, dk = dv = 0
            CHECK(same_bits(dq_acc, dq_before));
            CHECK(std::all_of(dk_part.begin(), dk_part.end(), [](float x) { return x == 0.0f; }));
            CHECK(std::all_of(dv_part.begin(), dv_part.end(), [](float x) { return x == 0.0f; }));
          }
          for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t j = 0; j < Sk * nkv * HD; ++j) {
              const auto at = static_cast<std::size_t>((b * S + k0) * nkv * HD + j);
              const auto from = static_cast<std::size_t>(b * Sk * nkv * HD + j);
              dk[at] += dk_part[from];
              dv[at] += dv_part[from];
            }
        }
      for (std::int64_t b = 0; b < B; ++b) {
        for (std::int64_t j = 0; j < Sq * nh * HD; ++j) {
          const auto at = static_cast<std::size_t>((b * S + q0) * nh * HD + j);
          const auto from = static_cast<std::size_t>(b * Sq * nh * HD + j);
          out[at] = o_acc[from];
          dq[at] = dq_acc[from];
        }
        for (std::int64_t h = 0; h < nh; ++h)
          for (std::int64_t t = 0; t < Sq; ++t)
            lse[static_cast<std::size_t>((b * nh + h) * S + q0 + t)] =
                l_acc[static_cast<std::size_t>((b * nh + h) * Sq + t)];
      }
    }
  CHECK(em.bank_conflicts == 0);
  CHECK(em.leftover_copies == 0);
  const double floor = rms_of(dod) * rms_of(vd) * rms_of(kd) / 256;
  const double e_out = max_error(out, ref_out), e_lse = max_error(lse, ref_lse);
  const double e_dq = max_error(dq, ref_dq, floor), e_dk = max_error(dk, ref_dk, floor),
               e_dv = max_error(dv, ref_dv);
  UNSCOPED_INFO("errors: out " << e_out << " lse " << e_lse << " dq " << e_dq << " dk " << e_dk
                               << " dv " << e_dv);
  CHECK(e_out < out_tol<T>);
  CHECK(e_lse < lse_tol);
  CHECK(e_dq < grad_tol<T>);
  CHECK(e_dk < grad_tol<T>);
  CHECK(e_dv < grad_tol<T>);
}

std::vector<std::int64_t> even_starts(std::int64_t S, std::int64_t chunks) {
  std::vector<std::int64_t> s;
  for (std::int64_t i = 0; i <= chunks; ++i) s.push_back(i * (S / chunks));
  return s;
}

}  // namespace

TEST_CASE("emulated attention_merge gives the host merge's bits, -inf rows included",
          "[kernels][emulated][attention_blocks]") {
  // hd 64 (16-byte accesses) and hd 6 (one float at a time); lse of both
  // sides finite, one side -inf, both -inf, and gaps of hundreds.
  for (const std::int64_t hd : {64, 6}) {
    INFO("hd=" << hd);
    const std::int64_t B = 2, S = 5, nh = 3;
    std::mt19937_64 rng(9100 + static_cast<std::uint64_t>(hd));
    auto o_acc = random_vector<float>(static_cast<std::size_t>(B * S * nh * hd), rng);
    const auto o_part = random_vector<float>(o_acc.size(), rng);
    auto l_acc = random_vector<float>(static_cast<std::size_t>(B * nh * S), rng, -3, 3);
    auto l_part = random_vector<float>(l_acc.size(), rng, -3, 3);
    l_acc[0] = neg_inf;                      // the accumulator empty: the part's bits
    l_part[1] = neg_inf;                     // the part empty: the accumulator's bits
    l_acc[2] = l_part[2] = neg_inf;          // both: out 0, lse -inf
    l_acc[3] = 300.0f, l_part[3] = -300.0f;  // exp(600) overflows a float: stable form
    emulated_merge(o_acc, l_acc, o_part, l_part, B, S, nh, hd, 9200);
    for (float x : o_acc) CHECK(!std::isnan(x));
    CHECK(l_acc[2] == neg_inf);
  }
}

TEST_CASE("emulated ring attention blocks (cp 2, contiguous) match float64 attention",
          "[kernels][emulated][attention_blocks]") {
  // Chunks of 100: two 64-key tiles, the second cut; a 128-query tile cut.
  ring_case<bf16, 64>({2, 4, 2}, 200, even_starts(200, 2), {{0}, {1}}, {}, 9301);
}

TEST_CASE("emulated ring attention blocks (cp 2, head-tail) match float64 attention",
          "[kernels][emulated][attention_blocks]") {
  // Chunks of 50 (4 chunks; rank 0 holds 0 and 3, rank 1 holds 1 and 2):
  // every key block shorter than a tile; blocks wholly in the future, in
  // the past and on the diagonal; hd 32, 64 and 128, bf16 and fp16.
  const std::vector<std::vector<std::size_t>> ht = {{0, 3}, {1, 2}};
  ring_case<bf16, 64>({1, 4, 2}, 200, even_starts(200, 4), ht, {}, 9401);
  ring_case<bf16, 32>({1, 2, 1}, 200, even_starts(200, 4), ht, {}, 9402);
  ring_case<bf16, 128>({1, 2, 2}, 136, even_starts(136, 4), ht, {}, 9403);
  ring_case<fp16, 64>({1, 2, 1}, 200, even_starts(200, 4), ht, {}, 9404);
}

TEST_CASE("emulated ring attention blocks with a document mask match float64 attention",
          "[kernels][emulated][attention_blocks][document_mask]") {
  // Global doc_start: documents crossing chunk edges (50, 100, 150), a
  // length-1 document at a chunk's first row (100), one starting at 150;
  // row 1: a one-token document first, then a document spanning three chunks.
  const auto ds = doc_starts({{30, 45, 25, 1, 24, 75}, {1, 160, 39}});
  ring_case<bf16, 64>({2, 4, 2}, 200, even_starts(200, 4), {{0, 3}, {1, 2}}, ds, 9501);
  ring_case<bf16, 64>({2, 2, 1}, 200, {0, 37, 120, 200}, {{0}, {1}, {2}}, ds, 9502);
}

TEST_CASE("cp rank 0's diagonal block with float outputs runs the block kernels (dq written)",
          "[kernels][emulated][attention_blocks]") {
  // A ring's first step on cp rank 0: its first query chunk against its own
  // key chunk, q0 = k0 = 0 and Sk = S, a span that looks like the default.
  // The dispatch of kernels/cuda/ops.hpp (cuda::attention_runs_blocks) must
  // send it to the block kernels: the causal ones would hand back 16-bit
  // out, dq, dk, dv widened, rounded before the merge and the ring's sums.
  // Run here as ops.hpp runs it: forward with a float32 out, backward with
  // float32 gradients and dq written (the block's first), against the host
  // kernels on the same bf16 inputs and span.
  using T = bf16;
  constexpr int HD = 64;
  const dims d{2, 4, 2};
  const std::int64_t S = 100;  // a 128-query tile and two 64-key tiles, each cut
  const hk::attention_span span{0, 0, S};
  CHECK(kc::attention_runs_blocks(true, span));                            // forward, float out
  CHECK(kc::attention_runs_blocks(false, span, hk::attention_dq::write));  // backward, span given
  CHECK(kc::attention_runs_blocks(false, {}, hk::attention_dq::accumulate));
  CHECK(kc::attention_runs_blocks(false, {0, 0, -1}, hk::attention_dq::write) == false);
  CHECK(kc::attention_runs_blocks(false, {}) == false);  // single-rank: the causal kernels

  for (const bool documents : {false, true}) {
    INFO("documents " << documents);
    std::mt19937_64 rng(9601 + documents);
    const auto nq = static_cast<std::size_t>(d.B * S * d.nh * HD);
    const auto nk = static_cast<std::size_t>(d.B * S * d.nkv * HD);
    const auto qb = random_vector<T>(nq, rng, -2, 2), kb = random_vector<T>(nk, rng, -2, 2),
               vb = random_vector<T>(nk, rng), dob = random_vector<T>(nq, rng);
    const auto ds = documents ? doc_starts({{30, 1, 69}, {64, 36}}) : std::vector<std::int32_t>{};
    const hk::attention_mask mask{ds.empty() ? nullptr : ds.data()};
    const std::int32_t* dsp = mask.doc_start;

    // The host kernels: float32 partial out and lse, then float32
    // gradients from that out rounded to bf16 (what a ring saves), dq written.
    std::vector<float> h_out(nq), h_lse(static_cast<std::size_t>(d.B * d.nh * S));
    hk::attention_forward<T, float>(ctx, h_out.data(), h_lse.data(), qb.data(), kb.data(),
                                    vb.data(), d.B, S, d.nh, d.nkv, HD, mask, span);
    std::vector<T> out16(nq);
    for (std::size_t i = 0; i < nq; ++i) out16[i] = T(h_out[i]);
    std::vector<float> dof(nq);
    for (std::size_t i = 0; i < nq; ++i) dof[i] = static_cast<float>(dob[i]);
    std::vector<float> h_dq = poisoned<float>(nq), h_dk = poisoned<float>(nk),
                       h_dv = poisoned<float>(nk);
    hk::attention_backward<T, float>(ctx, h_dq.data(), h_dk.data(), h_dv.data(), dof.data(),
                                     qb.data(), kb.data(), vb.data(), out16.data(), h_lse.data(),
                                     d.B, S, d.nh, d.nkv, HD, mask, span, hk::attention_dq::write);

    // The block kernels under the emulator, on the same bits.
    cuda_emulator em(9611 + documents);
    std::vector<float> out, lse;
    block_forward<T, HD>(em, out, lse, bits_of(qb), bits_of(kb), bits_of(vb), d, S, dsp, span);
    CHECK(first_nan(out) == -1);  // every element written
    CHECK(first_nan(lse) == -1);
    std::vector<float> dq = poisoned<float>(nq), dk, dv;  // write mode overwrites the poison
    block_backward<T, HD>(em, dq, dk, dv, bits_of(dob), bits_of(qb), bits_of(kb), bits_of(vb),
                          bits_of(out16), h_lse, d, S, dsp, span, hk::attention_dq::write);
    CHECK(first_nan(dq) == -1);
    CHECK(first_nan(dk) == -1);
    CHECK(first_nan(dv) == -1);
    CHECK(em.bank_conflicts == 0);
    CHECK(em.leftover_copies == 0);

    // Against the host: the tolerances of the ring cases above (the GPU
    // rounds P and dS to bf16 before they multiply; the host keeps them float).
    const auto rms_do = rms_of(to_double(dob)), rms_v = rms_of(to_double(vb)),
               rms_k = rms_of(to_double(kb));
    const double floor = rms_do * rms_v * rms_k / 256;
    CHECK(max_error(to_double(out), to_double(h_out)) < out_tol<T>);
    CHECK(max_error(to_double(lse), to_double(h_lse)) < lse_tol);
    CHECK(max_error(to_double(dq), to_double(h_dq), floor) < grad_tol<T>);
    CHECK(max_error(to_double(dk), to_double(h_dk), floor) < grad_tol<T>);
    CHECK(max_error(to_double(dv), to_double(h_dv)) < grad_tol<T>);
    // Unrounded: float32 values, not bf16 ones widened (what the causal
    // kernels' outputs would be: every element on the bf16 grid). A
    // computed float lands on it with probability about 2^-16; the zeros
    // (queries and keys of one-token documents, a row's first query) do.
    auto on_bf16_grid = [](const std::vector<float>& x) {
      std::size_t n = 0;
      for (const float e : x) n += static_cast<float>(T(e)) == e;
      return n;
    };
    CHECK(on_bf16_grid(out) < nq / 10);
    CHECK(on_bf16_grid(dq) < nq / 10);  // zeros: rows that see only themselves
    CHECK(on_bf16_grid(dk) < nk / 10);
    CHECK(on_bf16_grid(dv) < nk / 10);
  }
}

TEST_CASE("the CUDA attention blocks refuse bad spans before any launch, naming the value",
          "[kernels][emulated][attention_blocks]") {
  const std::int64_t B = 1, S = 8, nh = 2, nkv = 1, hd = 64;
  alignas(16) static std::uint16_t q[B * S * nh * hd], kv[B * S * nkv * hd];
  static float out[B * S * nh * hd], lse[B * nh * S], scratch[B * nh * S];
  using Catch::Matchers::Contains;
  const auto forward = [&](hk::attention_span span) {
    return kc::detail::attention_forward_block_args(out, lse, q, kv, kv, B, S, nh, nkv, hd, nullptr,
                                                    span);
  };
  const auto backward = [&](hk::attention_span span) {
    return kc::detail::attention_backward_block_args(out, out, out, q, q, kv, kv, q, lse, B, S, nh,
                                                     nkv, hd, scratch, sizeof(scratch), nullptr,
                                                     span, hk::attention_dq::accumulate);
  };
  for (const auto& [span, what] :
       {std::pair{hk::attention_span{-1, 0, 8}, "q0=-1"},
        std::pair{hk::attention_span{0, -2, 8}, "k0=-2"},
        std::pair{hk::attention_span{0, 0, 0}, "Sk=0"},
        std::pair{hk::attention_span{0, 0, -3}, "Sk=-3"},
        std::pair{hk::attention_span{std::int64_t(1) << 30, 0, 8}, "q0=1073741824"}}) {
    CHECK_THROWS_AS(forward(span), tessera::config_error);
    CHECK_THROWS_WITH(forward(span), Contains(what));
    CHECK_THROWS_WITH(backward(span), Contains(what));
  }
  const auto p = forward({40, 16, -1});  // -1: Sk = S
  CHECK(p.span.Sk == S);
  CHECK(p.span.q0 == 40);
  CHECK(p.span.k0 == 16);
  CHECK(p.out == nullptr);
  CHECK(backward({0, 0, 3}).dq_accumulate == 1);
}

}  // namespace test_kernels_emulated_attention_blocks
