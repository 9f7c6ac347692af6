// The cuBLASLt matmuls of the model's linear layers, interpreted on the host: the
// descriptors' values (include/tessera/kernels/cuda/gemm_plan.hpp's
// lt_matmul, from which kernels/cuda/gemm.cuh creates the cuBLASLt
// descriptors one for one) are read with cuBLASLt's documented column-major
// semantics (D = alpha op(A) op(B) + beta C; element (i, j) of a layout at
// i + j * ld; op(A) is m x k, op(B) k x n, C m x n, ld >= rows) by a float64
// reference, and compared with the host model's GEMMs (kernels/gemm.hpp's
// linear_forward, linear_backward_input and linear_backward_weight on the
// same bf16 inputs, and fp16 inputs for precision::fp16_mixed).
//
// The GEMMs are those of a transformer block and the LM head, listed here as
// nn/transformer_block.hpp and nn/lm_head.hpp make them (every model GEMM
// goes through linear_forward, linear_backward_input or
// linear_backward_weight, whose calls gemm_plan.hpp's values are): q, k, v,
// gate and up are
// column-parallel (out features / tp), the attention output and down
// projections row-parallel (in features / tp), the head vocabulary-parallel
// (V / tp); each with its forward, its backward to the input (written, or
// added for k, v and up, which share their input with q and gate) and its
// backward to the weight (accumulated), at the Llama 2 7B and Llama 3 8B
// shapes: interpreted at tp 1, and at tp 2, 4 and 8 (which change only the
// sizes) checked for layouts that span exactly their buffers. The list's
// parameter count is checked against llama_config's, which ties its shapes
// to the model (not its accumulate flags, restated from the block). Rows M are few; each product is
// sampled at 512 output elements, the corners included.
//
// Tolerances: the reference sums in float64 and the host in float32 (BLAS
// blocking): f32_tol on float outputs; a bf16 output is the rounding of
// either, so it may land on the neighbouring bf16 value (2 * bf16_tol); an
// fp16 output likewise (2 * fp16_tol).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <tessera/kernels/cuda/gemm_plan.hpp>
#include <tessera/kernels/fp8.hpp>
#include <tessera/kernels/gemm.hpp>
#include <tessera/nn/llama_config.hpp>

#include "kernel_testing.hpp"

namespace test_kernels_cuda_gemm_plan {

namespace kc = tessera::kernels::cuda;
namespace hk = tessera::kernels;
using tessera::bf16;
using tessera::fp16;
using tessera::nn::llama_config;
using namespace tessera::testing;

namespace {

// One linear layer of the model: its weight (out, in) on this tp rank, and
// whether its backward to the input adds (its input feeds another layer too).
struct layer {
  std::string name;
  std::int64_t out, in;
  bool accumulate_dinp;
};

std::vector<layer> model_linears(const llama_config& c, std::int64_t tp) {
  const std::int64_t H = c.dim, Hq = c.n_heads * c.head_dim(), kv = c.kv_dim(), F = c.ffn_dim;
  return {{"attn.wq", Hq / tp, H, false},   {"attn.wk", kv / tp, H, true},
          {"attn.wv", kv / tp, H, true},    {"attn.wo", H, Hq / tp, false},
          {"mlp.w_gate", F / tp, H, false}, {"mlp.w_up", F / tp, H, true},
          {"mlp.w_down", H, F / tp, false}, {"lm_head", c.vocab / tp, H, false}};
}

// Fast uniform values in [lo, hi) rounded to T (splitmix64 of the index): the
// 7B and 8B weights hold up to 525M elements, too many for a Mersenne twister
// per test.
template <class T>
std::vector<T> fast_random(std::size_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  std::vector<T> v(n);
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    v[i] = tessera::to<T>(static_cast<float>(lo) +
                          static_cast<float>(hi - lo) * static_cast<float>(z >> 40) * 0x1.0p-24f);
  }
  return v;
}

// Column-major element (i, j) of a layout over `p`.
template <class T>
double at(const T* p, const kc::lt_layout& l, std::int64_t i, std::int64_t j) {
  return as_double(p[static_cast<std::size_t>(i + j * l.ld)]);
}

// Checks a layout the way cuBLASLt's definition needs it and returns op(X)'s
// (rows, cols).
std::pair<std::int64_t, std::int64_t> op_shape(const kc::lt_layout& l, bool trans) {
  REQUIRE(l.rows >= 1);
  REQUIRE(l.cols >= 1);
  REQUIRE(l.ld >= l.rows);
  return trans ? std::pair{l.cols, l.rows} : std::pair{l.rows, l.cols};
}

// D(i, j) of one cuBLASLt matmul in float64, from its descriptor's values
// alone; `c_ij` is C(i, j) before the call.
template <class TA, class TB>
double interpret(const kc::lt_matmul& p, double alpha, const TA* A, const TB* B, float beta,
                 double c_ij, std::int64_t i, std::int64_t j) {
  double s = 0;
  for (std::int64_t l = 0; l < p.k; ++l) {
    const double a = p.trans_a ? at(A, p.a, l, i) : at(A, p.a, i, l);
    const double b = p.trans_b ? at(B, p.b, j, l) : at(B, p.b, l, j);
    s += a * b;
  }
  return double(alpha) * s + (beta != 0 ? double(beta) * c_ij : 0.0);
}

// The descriptor of a row-major GEMM g over A (a_n elements), B (b_n) and C
// (c, updated by `host`, the host model's call): checks the layouts against
// the buffers and 512 sampled elements (corners first) of the interpreted
// matmul against what the host computed.
template <class TAB, class TC, class Host>
void check_gemm(const hk::linear_gemm& g, const std::vector<TAB>& A, const std::vector<TAB>& B,
                std::vector<TC>& c, Host&& host, std::mt19937_64& rng) {
  const kc::lt_matmul p = kc::row_major_matmul(g.ta, g.tb, g.M, g.N, g.K, g.lda, g.ldb, g.ldc,
                                               kc::lt_dtype_of<TAB>(), kc::lt_dtype_of<TC>());
  // cuBLASLt's A is our B, its B our A; every layout lies inside its buffer.
  const auto [am, ak] = op_shape(p.a, p.trans_a);
  const auto [bk, bn] = op_shape(p.b, p.trans_b);
  REQUIRE(am == p.m);
  REQUIRE(ak == p.k);
  REQUIRE(bk == p.k);
  REQUIRE(bn == p.n);
  REQUIRE(p.c.rows == p.m);
  REQUIRE(p.c.cols == p.n);
  REQUIRE(p.c.ld >= p.c.rows);
  REQUIRE(p.a.type == kc::lt_dtype_of<TAB>());
  REQUIRE(p.b.type == kc::lt_dtype_of<TAB>());
  REQUIRE(p.c.type == kc::lt_dtype_of<TC>());
  REQUIRE(static_cast<std::size_t>((p.a.cols - 1) * p.a.ld + p.a.rows) <= B.size());
  REQUIRE(static_cast<std::size_t>((p.b.cols - 1) * p.b.ld + p.b.rows) <= A.size());
  REQUIRE(static_cast<std::size_t>((p.c.cols - 1) * p.c.ld + p.c.rows) <= c.size());
  // Row-major C(r, col) is column-major D(col, r).
  std::vector<std::pair<std::int64_t, std::int64_t>> at_rc;
  std::uniform_int_distribution<std::int64_t> ri(0, g.M - 1), ci(0, g.N - 1);
  for (int s = 0; s < 512; ++s)
    at_rc.emplace_back(s < 4 ? ((s & 1) ? g.M - 1 : 0) : ri(rng),
                       s < 4 ? ((s & 2) ? g.N - 1 : 0) : ci(rng));
  std::vector<double> before, got, want;
  for (auto [r, col] : at_rc)
    before.push_back(as_double(c[static_cast<std::size_t>(r * g.ldc + col)]));
  host();
  for (std::size_t s = 0; s < at_rc.size(); ++s) {
    const auto [r, col] = at_rc[s];
    want.push_back(as_double(c[static_cast<std::size_t>(r * g.ldc + col)]));
    const double d = interpret(p, g.alpha, B.data(), A.data(), g.beta, before[s], col, r);
    got.push_back(tessera::is_half_v<TC> ? as_double(tessera::to<TC>(d)) : d);
  }
  CHECK(max_rel_error(got, want) < (tessera::is_half_v<TC> ? 2 * tol_of<TC> : f32_tol));
}

// The three GEMMs of one layer with the model's types: T (bf16 or fp16)
// activations and activation gradients, float32 logits (the LM head's
// forward) and weight gradients.
template <class T>
void check_layer(const layer& L, std::int64_t M, std::uint64_t seed, std::mt19937_64& rng) {
  INFO(tessera::dtype_name<T>() << " " << L.name << " (" << L.out << " x " << L.in << "), M=" << M);
  const auto w = fast_random<T>(static_cast<std::size_t>(L.out * L.in), seed, -0.05, 0.05);
  const auto x = fast_random<T>(static_cast<std::size_t>(M * L.in), seed + 1);
  const auto dy = fast_random<T>(static_cast<std::size_t>(M * L.out), seed + 2);
  const hk::host_context hctx{};

  // Forward: out(M, out) = x w^T, written.
  if (L.name == "lm_head") {
    std::vector<float> y(static_cast<std::size_t>(M * L.out));
    poison(y);
    check_gemm(
        hk::linear_forward_gemm(M, L.out, L.in), x, w, y,
        [&] {
          hk::gemm_mixed<T, T, float>(hk::transpose::no, hk::transpose::yes, M, L.out, L.in, 1.f,
                                      x.data(), L.in, w.data(), L.in, 0.f, y.data(), L.out);
        },
        rng);
  } else {
    std::vector<T> y(static_cast<std::size_t>(M * L.out));
    poison(y);
    check_gemm(
        hk::linear_forward_gemm(M, L.out, L.in), x, w, y,
        [&] { hk::linear_forward(hctx, y.data(), x.data(), w.data(), M, L.out, L.in); }, rng);
  }

  // Backward to the input: dx(M, in) = dy w, written or added.
  auto dx = fast_random<T>(static_cast<std::size_t>(M * L.in), seed + 3);
  check_gemm(
      hk::linear_backward_input_gemm(M, L.out, L.in, L.accumulate_dinp), dy, w, dx,
      [&] {
        hk::linear_backward_input(hctx, dx.data(), dy.data(), w.data(), M, L.out, L.in,
                                  L.accumulate_dinp);
      },
      rng);

  // Backward to the weight: dw(out, in) += dy^T x, float32.
  auto dw = fast_random<float>(static_cast<std::size_t>(L.out * L.in), seed + 4);
  check_gemm(
      hk::linear_backward_weight_gemm(M, L.out, L.in), dy, x, dw,
      [&] { hk::linear_backward_weight(hctx, dw.data(), dy.data(), x.data(), M, L.out, L.in); },
      rng);
}

}  // namespace

TEST_CASE("cuda gemm plans: the model's linear layers are the model's parameters",
          "[kernels][cuda_gemm_plan]") {
  for (const auto& c : {llama_config::llama2_7b(), llama_config::llama3_8b()}) {
    INFO(c.name);
    std::int64_t block = 0, head = 0;
    for (const auto& L : model_linears(c, 1)) (L.name == "lm_head" ? head : block) += L.out * L.in;
    // A block's parameters are its linears plus two RMSNorm weights (H each).
    CHECK(block + 2 * c.dim == c.block_params());
    CHECK(head == c.vocab * c.dim);
  }
}

TEST_CASE("cuda gemm plans: every cuBLASLt matmul of the 7B and 8B models equals the host GEMM",
          "[kernels][cuda_gemm_plan]") {
  std::mt19937_64 rng(2026);
  for (const auto& c : {llama_config::llama2_7b(), llama_config::llama3_8b()})
    for (const auto& L : model_linears(c, 1)) {
      INFO(c.name);
      check_layer<bf16>(L, 3, rng(), rng);
    }
  // fp16 storage (precision::fp16_mixed): fp16 x fp16 -> fp16 or float C.
  // The 7B model's layers (the 8B's differ in sizes only, for time).
  for (const auto& L : model_linears(llama_config::llama2_7b(), 1))
    check_layer<fp16>(L, 3, rng(), rng);
}

TEST_CASE("cuda gemm plans: the tensor-parallel shards' matmuls are well formed",
          "[kernels][cuda_gemm_plan]") {
  // tp 2, 4, 8 change only the sizes: each descriptor's layouts are checked
  // against its buffers (the numbers at tp 1 above, at 7B shapes).
  for (const auto& c : {llama_config::llama2_7b(), llama_config::llama3_8b()})
    for (std::int64_t tp : {2, 4, 8})
      for (const auto& L : model_linears(c, tp))
        for (const auto& g : {hk::linear_forward_gemm(4096, L.out, L.in),
                              hk::linear_backward_input_gemm(4096, L.out, L.in, true),
                              hk::linear_backward_weight_gemm(4096, L.out, L.in)}) {
          INFO(c.name << " tp=" << tp << " " << L.name);
          const auto p = kc::row_major_matmul(g.ta, g.tb, g.M, g.N, g.K, g.lda, g.ldb, g.ldc,
                                              kc::lt_dtype::bf16, kc::lt_dtype::f32);
          const auto [am, ak] = op_shape(p.a, p.trans_a);
          const auto [bk, bn] = op_shape(p.b, p.trans_b);
          CHECK((am == p.m && ak == p.k && bk == p.k && bn == p.n));
          CHECK((p.c.rows == p.m && p.c.cols == p.n && p.c.ld >= p.m));
          // Our A (g.M x g.K or transposed) and B hold exactly the elements the layouts span.
          const std::int64_t a_elems = g.M * g.K, b_elems = g.N * g.K;
          CHECK((p.b.cols - 1) * p.b.ld + p.b.rows == a_elems);
          CHECK((p.a.cols - 1) * p.a.ld + p.a.rows == b_elems);
          CHECK((p.c.cols - 1) * p.c.ld + p.c.rows == g.M * g.N);
        }
}

TEST_CASE("cuda gemm plans: transposes, leading dimensions and refusals",
          "[kernels][cuda_gemm_plan]") {
  // A padded leading dimension and every transpose pair, against kernels::gemm.
  std::mt19937_64 rng(7);
  for (auto ta : {hk::transpose::no, hk::transpose::yes})
    for (auto tb : {hk::transpose::no, hk::transpose::yes}) {
      const std::int64_t M = 5, N = 7, K = 9;
      const std::int64_t lda = (ta == hk::transpose::no ? K : M) + 3;
      const std::int64_t ldb = (tb == hk::transpose::no ? N : K) + 2;
      const std::int64_t ldc = N + 1;
      const auto A = random_vector<bf16>(
          static_cast<std::size_t>(lda * (ta == hk::transpose::no ? M : K)), rng);
      const auto B = random_vector<bf16>(
          static_cast<std::size_t>(ldb * (tb == hk::transpose::no ? K : N)), rng);
      auto C = random_vector<float>(static_cast<std::size_t>(ldc * M), rng);
      const hk::linear_gemm g{ta, tb, M, N, K, lda, ldb, ldc, 0.5f, 2.f};
      INFO("ta=" << int(ta) << " tb=" << int(tb));
      check_gemm(
          g, A, B, C,
          [&] {
            hk::gemm_mixed<bf16, bf16, float>(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb,
                                              2.f, C.data(), ldc);
          },
          rng);
      // fp16 operands: the same values rounded to fp16 (exact for a bf16 value
      // in fp16's normal range), C float.
      std::vector<fp16> Ah(A.size()), Bh(B.size());
      for (std::size_t i = 0; i < A.size(); ++i)
        Ah[i] = tessera::to<fp16>(tessera::to<float>(A[i]));
      for (std::size_t i = 0; i < B.size(); ++i)
        Bh[i] = tessera::to<fp16>(tessera::to<float>(B[i]));
      check_gemm(
          g, Ah, Bh, C,
          [&] {
            hk::gemm_mixed<fp16, fp16, float>(ta, tb, M, N, K, 0.5f, Ah.data(), lda, Bh.data(), ldb,
                                              2.f, C.data(), ldc);
          },
          rng);
    }
  // The refusals kernels::gemm makes, and K = 0 (no cuBLASLt matmul has k = 0).
  CHECK_THROWS_AS(kc::row_major_matmul(hk::transpose::no, hk::transpose::no, 2, 3, 0, 1, 3, 3,
                                       kc::lt_dtype::bf16, kc::lt_dtype::f32),
                  tessera::config_error);
  CHECK_THROWS_AS(kc::row_major_matmul(hk::transpose::no, hk::transpose::no, 2, 3, 4, 3, 3, 3,
                                       kc::lt_dtype::bf16, kc::lt_dtype::f32),
                  tessera::config_error);
}

// ---- FP8 (cublaslt_context::gemm_fp8) -----------------------------------------------------------

namespace {

// The row-major transpose of a rows x cols matrix.
template <class T>
std::vector<T> transposed(const std::vector<T>& a, std::int64_t rows, std::int64_t cols) {
  std::vector<T> t(a.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      t[static_cast<std::size_t>(j * rows + i)] = a[static_cast<std::size_t>(i * cols + j)];
  return t;
}

// One FP8 product of a linear layer as the CUDA path runs it: FP8 copies of
// its operands (our A rows x K, our B N x K: transposed copies where the
// product needs them), the TN matmul of row_major_fp8_matmul with the
// inverse scales as its scale pointers, against the host reference (the
// float GEMM of the round-tripped operands in the product's own layout, as
// nn::fp8_linear computes it on the host).
template <class FA, class FB, class TC>
void check_fp8_product(const char* what, std::int64_t M, std::int64_t N, std::int64_t K,
                       const std::vector<FA>& qa, float sa, const std::vector<FB>& qb, float sb,
                       float beta, std::vector<TC>& c, const std::vector<TC>& want,
                       std::mt19937_64& rng) {
  INFO(what << " M=" << M << " N=" << N << " K=" << K);
  const kc::lt_matmul p = kc::row_major_fp8_matmul(M, N, K, K, K, N, kc::lt_dtype_of<FA>(),
                                                   kc::lt_dtype_of<FB>(), kc::lt_dtype_of<TC>());
  REQUIRE(p.trans_a);  // cuBLASLt's FP8 layout: "TN"
  REQUIRE(!p.trans_b);
  REQUIRE(p.a.type == kc::lt_dtype_of<FB>());
  REQUIRE(p.b.type == kc::lt_dtype_of<FA>());
  const double inv = double(1.0f / sa) * double(1.0f / sb);
  std::uniform_int_distribution<std::int64_t> ri(0, M - 1), ci(0, N - 1);
  double worst = 0;
  for (int s = 0; s < 256; ++s) {
    const std::int64_t r = s < 4 ? ((s & 1) ? M - 1 : 0) : ri(rng);
    const std::int64_t col = s < 4 ? ((s & 2) ? N - 1 : 0) : ci(rng);
    const std::size_t at_rc = static_cast<std::size_t>(r * N + col);
    double d = interpret(p, inv, qb.data(), qa.data(), beta, as_double(c[at_rc]), col, r);
    if (tessera::is_half_v<TC>) d = as_double(tessera::to<TC>(d));
    const double w = as_double(want[at_rc]);
    // Relative to |w|, floored at 1e-3 (the outputs are O(0.1..10): an
    // output near zero is judged on its absolute error).
    worst = std::max(worst, std::abs(d - w) / (std::abs(w) + 1e-3));
  }
  CHECK(worst < (tessera::is_half_v<TC> ? 2 * tol_of<TC> : f32_tol));
}

// A layer's three FP8 products: forward y = x̂ Ŵ^T (E4M3 x E4M3 -> bf16),
// backward_input dx = d̂y Ŵ (dy in `FD`, W^T copied; -> bf16) and
// backward_weight dW += d̂y^T x̂ (dy^T and x^T copied; -> float, beta 1).
template <class FD>
void check_fp8_layer(std::int64_t M, std::int64_t N, std::int64_t K, std::uint64_t seed,
                     std::mt19937_64& rng) {
  using tessera::fp8_e4m3;
  INFO("dy as " << tessera::dtype_name<FD>());
  const hk::host_context h{};
  const auto x = fast_random<bf16>(static_cast<std::size_t>(M * K), seed, -3, 3);
  const auto w = fast_random<bf16>(static_cast<std::size_t>(N * K), seed + 1, -0.05, 0.05);
  const auto dy = fast_random<bf16>(static_cast<std::size_t>(M * N), seed + 2, -1e-3, 1e-3);
  // Scales that are not powers of two (the dequantisation rounds).
  const float sx = 448.0f / hk::fp8_amax(h, x.data(), M * K) * 0.9f;
  const float sw = 448.0f / hk::fp8_amax(h, w.data(), N * K) * 0.7f;
  const float sd = static_cast<float>(FD::max_finite) / hk::fp8_amax(h, dy.data(), M * N) * 0.3f;
  std::vector<fp8_e4m3> qx(x.size()), qw(w.size());
  std::vector<FD> qd(dy.size());
  hk::fp8_quantize(h, qx.data(), x.data(), M * K, sx);
  hk::fp8_quantize(h, qw.data(), w.data(), N * K, sw);
  hk::fp8_quantize(h, qd.data(), dy.data(), M * N, sd);
  std::vector<float> xh(x.size()), wh(w.size()), dh(dy.size());
  hk::fp8_round_trip<fp8_e4m3>(h, xh.data(), x.data(), M * K, sx);
  hk::fp8_round_trip<fp8_e4m3>(h, wh.data(), w.data(), N * K, sw);
  hk::fp8_round_trip<FD>(h, dh.data(), dy.data(), M * N, sd);

  auto host = [](const hk::linear_gemm& g, const std::vector<float>& a, const std::vector<float>& b,
                 auto& out) {
    hk::gemm_mixed<float, float>(g.ta, g.tb, g.M, g.N, g.K, g.alpha, a.data(), g.lda, b.data(),
                                 g.ldb, g.beta, out.data(), g.ldc);
  };
  std::vector<bf16> y(static_cast<std::size_t>(M * N)), y_want(y.size());
  host(hk::linear_forward_gemm(M, N, K), xh, wh, y_want);
  check_fp8_product("forward", M, N, K, qx, sx, qw, sw, 0.0f, y, y_want, rng);

  std::vector<bf16> dx(static_cast<std::size_t>(M * K)), dx_want(dx.size());
  host(hk::linear_backward_input_gemm(M, N, K, false), dh, wh, dx_want);
  check_fp8_product("backward_input", M, K, N, qd, sd, transposed(qw, N, K), sw, 0.0f, dx, dx_want,
                    rng);

  auto dw = fast_random<float>(static_cast<std::size_t>(N * K), seed + 3, -1e-4, 1e-4);
  auto dw_want = dw;
  host(hk::linear_backward_weight_gemm(M, N, K), dh, xh, dw_want);
  check_fp8_product("backward_weight", N, K, M, transposed(qd, M, N), sd, transposed(qx, M, K), sx,
                    1.0f, dw, dw_want, rng);
}

}  // namespace

TEST_CASE("cuda gemm plans: the FP8 matmuls of a linear layer equal the host FP8 reference",
          "[kernels][cuda_gemm_plan]") {
  std::mt19937_64 rng(88);
  // A wide layer on a few tokens, and small odd ones (multiples of 16, as
  // FP8 matmuls need); the descriptors depend on the sizes only through the
  // layouts, which the 7B shapes above check for the bf16 matmuls.
  check_fp8_layer<tessera::fp8_e5m2>(32, 1024, 2048, rng(), rng);  // hybrid: E5M2 gradients
  check_fp8_layer<tessera::fp8_e4m3>(48, 80, 112, rng(), rng);     // E4M3 everywhere
  check_fp8_layer<tessera::fp8_e5m2>(16, 176, 32, rng(), rng);
}

TEST_CASE("cuda gemm plans: FP8 refusals name the constraint", "[kernels][cuda_gemm_plan]") {
  using kc::lt_dtype;
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const tessera::config_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(msg([] { kc::row_major_fp8_matmul(16, 16, 16, 16, 16, 16, lt_dtype::e5m2,
                                               lt_dtype::e5m2, lt_dtype::bf16); }),
             Catch::Contains("fp8_e5m2 x fp8_e5m2"));
  CHECK_THAT(msg([] { kc::row_major_fp8_matmul(16, 16, 16, 16, 16, 16, lt_dtype::bf16,
                                               lt_dtype::e4m3, lt_dtype::bf16); }),
             Catch::Contains("operands bf16 x fp8_e4m3"));
  CHECK_THAT(msg([] { kc::row_major_fp8_matmul(16, 16, 16, 16, 16, 16, lt_dtype::e4m3,
                                               lt_dtype::e4m3, lt_dtype::e4m3); }),
             Catch::Contains("output fp8_e4m3"));
  CHECK_THAT(msg([] { kc::row_major_fp8_matmul(16, 16, 24, 24, 24, 16, lt_dtype::e4m3,
                                               lt_dtype::e4m3, lt_dtype::bf16); }),
             Catch::Contains("K=24 lda=24 ldb=24 must be multiples of 16"));
  CHECK_THAT(msg([] { kc::row_major_fp8_matmul(16, 12, 16, 16, 16, 12, lt_dtype::e4m3,
                                               lt_dtype::e4m3, lt_dtype::bf16); }),
             Catch::Contains("ldc=12 of bf16 is not 16-byte aligned"));
  CHECK_NOTHROW(kc::row_major_fp8_matmul(16, 12, 16, 16, 16, 12, lt_dtype::e4m3, lt_dtype::e5m2,
                                         lt_dtype::f32));
}

}  // namespace test_kernels_cuda_gemm_plan
