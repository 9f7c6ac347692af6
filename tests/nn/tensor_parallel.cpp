// Tests of the column- and row-parallel layers (nn/linear.hpp) and the
// placement collectives (nn/tensor_parallel.hpp) on thread ranks: the
// layers alone and chained as the MLP chains them (column, row, one all_reduce each way), against the dense layer on
// one rank: float64 to 1e-12, float32 to 1e-5 relative. The bytes each
// placement collective sends equal the communicator's ring formulas, and
// a divisor that does not divide is refused with the numbers.
#include "tessera/nn/tensor_parallel.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <vector>

#include "tessera/comm/local.hpp"
#include "tessera/comm/self.hpp"
#include "tessera/kernels/context.hpp"
#include "../kernels/kernel_testing.hpp"

namespace test_nn_tensor_parallel {

using namespace tessera;

namespace {

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  return testing::random_vector<T>(n, rng);
}

// Largest |a - b| / (max |b| over the tensor): the relative error of a
// whole tensor against its reference.
template <class T>
double tensor_rel(const std::vector<T>& a, const std::vector<T>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

// Rows [r0, r0 + n) of a (rows, cols) row-major tensor.
template <class T>
std::vector<T> rows_of(const std::vector<T>& m, std::int64_t cols, std::int64_t r0, std::int64_t n) {
  return {m.begin() + r0 * cols, m.begin() + (r0 + n) * cols};
}
// Columns [c0, c0 + n) of a (rows, cols) row-major tensor.
template <class T>
std::vector<T> cols_of(const std::vector<T>& m, std::int64_t rows, std::int64_t cols,
                       std::int64_t c0, std::int64_t n) {
  std::vector<T> s(static_cast<std::size_t>(rows * n));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < n; ++j) s[i * n + j] = m[i * cols + c0 + j];
  return s;
}

comm::comm_options quick() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(20);
  return o;
}

// The dense layer on one rank: y = x W^T, dx = dy W, dW = dy^T x.
template <class T>
struct dense_ref {
  std::vector<T> y, dx, dw;
};
template <class T>
dense_ref<T> dense(const std::vector<T>& x, const std::vector<T>& w, const std::vector<T>& dy,
                   std::int64_t M, std::int64_t out, std::int64_t in) {
  kernels::host_context ctx;
  dense_ref<T> r{std::vector<T>(M * out), std::vector<T>(M * in), std::vector<T>(out * in, T(0))};
  kernels::linear_forward(ctx, r.y.data(), x.data(), w.data(), M, out, in);
  kernels::linear_backward_input(ctx, r.dx.data(), dy.data(), w.data(), M, out, in);
  kernels::linear_backward_weight(ctx, r.dw.data(), dy.data(), x.data(), M, out, in);
  return r;
}

template <class T>
void check_column(int tp, double tol) {
  const std::int64_t M = 37, out = 24, in = 20;
  const auto x = random_values<T>(M * in, 1), w = random_values<T>(out * in, 2),
             dy = random_values<T>(M * out, 3);
  const dense_ref<T> ref = dense(x, w, dy, M, out, in);
  std::mutex mu;
  comm::local_world::run(
      tp,
      [&](comm::local_communicator& c) {
        kernels::host_context ctx;
        const shard_range s = even_shard(out, tp, c.rank(), "out_features");
        const nn::column_parallel_linear layer{s.count, in, 0};
        const std::vector<T> w_r = rows_of(w, in, s.begin, s.count);
        std::vector<T> y(M * s.count), dx(M * in), dw(s.count * in, T(0));
        const replicated<const T> xv{x.data(), M, in};
        const feature_sharded<T> yv = layer.forward(ctx, y.data(), xv, w_r.data());
        const std::vector<T> dy_r = cols_of(dy, M, out, s.begin, s.count);
        const feature_sharded<const T> dyv{dy_r.data(), M, s.count};
        partial_sum<T> dxp = layer.backward_input(ctx, dx.data(), dyv, w_r.data());
        c.reset_stats();
        nn::all_reduce(c, dxp);
        layer.backward_weight(ctx, dw.data(), dyv, xv);
        std::lock_guard<std::mutex> lock(mu);
        INFO("tp " << tp << " rank " << c.rank());
        CHECK(yv.cols == s.count);
        CHECK(tensor_rel(y, cols_of(ref.y, M, out, s.begin, s.count)) <= tol);
        CHECK(tensor_rel(dx, ref.dx) <= tol);
        CHECK(tensor_rel(dw, rows_of(ref.dw, in, s.begin, s.count)) <= tol);
        CHECK(c.stats().all_reduce.bytes ==
              comm::ring_all_reduce_bytes(static_cast<std::size_t>(M * in), sizeof(T), tp,
                                          c.rank()));
      },
      quick());
}

template <class T>
void check_row(int tp, double tol) {
  const std::int64_t M = 29, out = 18, in = 32;
  const auto x = random_values<T>(M * in, 4), w = random_values<T>(out * in, 5),
             dy = random_values<T>(M * out, 6);
  const dense_ref<T> ref = dense(x, w, dy, M, out, in);
  std::mutex mu;
  comm::local_world::run(
      tp,
      [&](comm::local_communicator& c) {
        kernels::host_context ctx;
        const shard_range s = even_shard(in, tp, c.rank(), "in_features");
        const nn::row_parallel_linear layer{out, s.count, 0};
        const std::vector<T> w_r = cols_of(w, out, in, s.begin, s.count);
        const std::vector<T> x_r = cols_of(x, M, in, s.begin, s.count);
        std::vector<T> y(M * out), dx(M * s.count), dw(out * s.count, T(0));
        const feature_sharded<const T> xv{x_r.data(), M, s.count};
        partial_sum<T> yp = layer.forward(ctx, y.data(), xv, w_r.data());
        c.reset_stats();
        const replicated<T> yv = nn::all_reduce(c, yp);
        const replicated<const T> dyv{dy.data(), M, out};
        layer.backward_input(ctx, dx.data(), dyv, w_r.data());
        layer.backward_weight(ctx, dw.data(), dyv, xv);
        std::lock_guard<std::mutex> lock(mu);
        INFO("tp " << tp << " rank " << c.rank());
        CHECK(yv.data == y.data());
        CHECK(tensor_rel(y, ref.y) <= tol);
        CHECK(tensor_rel(dx, cols_of(ref.dx, M, in, s.begin, s.count)) <= tol);
        CHECK(tensor_rel(dw, cols_of(ref.dw, out, in, s.begin, s.count)) <= tol);
        CHECK(c.stats().all_reduce.bytes ==
              comm::ring_all_reduce_bytes(static_cast<std::size_t>(M * out), sizeof(T), tp,
                                          c.rank()));
      },
      quick());
}

}  // namespace

TEST_CASE("column-parallel linear equals the dense layer's slices", "[nn][tp]") {
  for (int tp : {1, 2, 3, 4}) {
    check_column<double>(tp, 1e-12);
    check_column<float>(tp, 1e-5);
  }
}

TEST_CASE("row-parallel linear's all-reduced output equals the dense layer", "[nn][tp]") {
  for (int tp : {1, 2, 4}) {
    check_row<double>(tp, 1e-12);
    check_row<float>(tp, 1e-5);
  }
}

TEST_CASE("column then row parallel (the MLP's pattern) equals two dense layers", "[nn][tp]") {
  // z = (x W1^T) W2^T: one all_reduce after the row layer's forward, one
  // after the column layer's input gradient; everything between is local.
  const std::int64_t M = 16, H = 12, F = 40;
  const auto x = random_values<double>(M * H, 7), w1 = random_values<double>(F * H, 8),
             w2 = random_values<double>(H * F, 9), dz = random_values<double>(M * H, 10);
  const dense_ref<double> l1 = dense(x, w1, std::vector<double>(M * F, 0.0), M, F, H);
  const dense_ref<double> l2 = dense(l1.y, w2, dz, M, H, F);
  const dense_ref<double> l1b = dense(x, w1, l2.dx, M, F, H);
  for (int tp : {2, 4}) {
    std::mutex mu;
    comm::local_world::run(
        tp,
        [&](comm::local_communicator& c) {
          kernels::host_context ctx;
          const shard_range s = even_shard(F, tp, c.rank(), "ffn_dim");
          const nn::column_parallel_linear up{s.count, H, 0};
          const nn::row_parallel_linear down{H, s.count, 0};
          const auto w1_r = rows_of(w1, H, s.begin, s.count);
          const auto w2_r = cols_of(w2, H, F, s.begin, s.count);
          std::vector<double> h(M * s.count), z(M * H), dh(M * s.count), dx(M * H);
          std::vector<double> dw1(s.count * H, 0.0), dw2(H * s.count, 0.0);
          const replicated<const double> xv{x.data(), M, H};
          const feature_sharded<double> hv = up.forward(ctx, h.data(), xv, w1_r.data());
          const replicated<double> zv = nn::all_reduce(c, down.forward(ctx, z.data(), hv, w2_r.data()));
          const replicated<const double> dzv{dz.data(), M, H};
          const feature_sharded<double> dhv = down.backward_input(ctx, dh.data(), dzv, w2_r.data());
          down.backward_weight(ctx, dw2.data(), dzv, hv);
          const replicated<double> dxv = nn::all_reduce(c, up.backward_input(ctx, dx.data(), dhv, w1_r.data()));
          up.backward_weight(ctx, dw1.data(), dhv, xv);
          (void)zv, (void)dxv;
          std::lock_guard<std::mutex> lock(mu);
          INFO("tp " << tp << " rank " << c.rank());
          CHECK(tensor_rel(z, l2.y) <= 1e-12);
          CHECK(tensor_rel(dx, l1b.dx) <= 1e-12);
          CHECK(tensor_rel(dw1, rows_of(l1b.dw, H, s.begin, s.count)) <= 1e-12);
          CHECK(tensor_rel(dw2, cols_of(l2.dw, H, F, s.begin, s.count)) <= 1e-12);
        },
        quick());
  }
}

TEST_CASE("reduce_scatter and all_gather move token shards and count the ring's bytes",
          "[nn][tp]") {
  const std::int64_t rows = 12, cols = 5;
  for (int tp : {1, 2, 3, 4}) {
    std::mutex mu;
    comm::local_world::run(
        tp,
        [&](comm::local_communicator& c) {
          // rank r's partial: r + 1 times a common tensor; the sum is tp(tp+1)/2 times it
          const auto base = random_values<double>(rows * cols, 11);
          std::vector<double> p(base);
          for (auto& v : p) v *= c.rank() + 1;
          std::vector<double> mine(rows / tp * cols), full(rows * cols);
          c.reset_stats();
          const token_sharded<double> sh =
              nn::reduce_scatter(c, partial_sum<double>{p.data(), rows, cols}, mine.data());
          const std::uint64_t rs_bytes = c.stats().reduce_scatter.bytes;
          const replicated<double> g = nn::all_gather(c, sh, full.data());
          std::lock_guard<std::mutex> lock(mu);
          INFO("tp " << tp << " rank " << c.rank());
          CHECK(sh.rows == rows / tp);
          CHECK(g.rows == rows);
          const double k = tp * (tp + 1) / 2.0;
          std::vector<double> want(base);
          for (auto& v : want) v *= k;
          CHECK(tensor_rel(full, want) <= 1e-15);
          const auto chunk = static_cast<std::size_t>(rows / tp * cols);
          CHECK(rs_bytes == comm::ring_scatter_gather_bytes(chunk, sizeof(double), tp));
          CHECK(c.stats().all_gather.bytes ==
                comm::ring_scatter_gather_bytes(chunk, sizeof(double), tp));
        },
        quick());
  }
}

TEST_CASE("a tp that does not divide is refused with the numbers", "[nn][tp]") {
  CHECK_THROWS_WITH(even_shard(11008, 3, 0, "ffn_dim"),
                    Catch::Contains("ffn_dim=11008") && Catch::Contains("tp=3"));
  CHECK_THROWS_WITH(even_shard(8, 0, 0, "n_heads"), Catch::Contains("tp=0"));
  CHECK_THROWS_WITH(even_shard(8, 2, 2, "n_heads"), Catch::Contains("rank 2"));
  const auto s = even_shard(12, 4, 3, "rows");
  CHECK(s.begin == 9);
  CHECK(s.count == 3);
}

TEST_CASE("placement-checked residual add and norm compute the kernels' result", "[nn][tp]") {
  kernels::host_context ctx;
  const std::int64_t N = 6, H = 8;
  const auto a = random_values<float>(N * H, 12), b = random_values<float>(N * H, 13),
             w = random_values<float>(H, 14);
  std::vector<float> out(N * H), want(N * H), rstd(N), want_rstd(N);
  nn::placed::residual_add(ctx, replicated<float>{out.data(), N, H},
                           replicated<const float>{a.data(), N, H},
                           replicated<const float>{b.data(), N, H});
  kernels::residual_add(ctx, want.data(), a.data(), b.data(), N * H);
  CHECK(out == want);
  nn::placed::rmsnorm_forward(ctx, replicated<float>{out.data(), N, H}, rstd.data(),
                              replicated<const float>{a.data(), N, H}, w.data(), 1e-5);
  kernels::rmsnorm_forward(ctx, want.data(), want_rstd.data(), a.data(), w.data(), N, H, 1e-5);
  CHECK(out == want);
  CHECK(rstd == want_rstd);
  CHECK_THROWS_WITH(nn::placed::residual_add(ctx, replicated<float>{out.data(), N, H},
                                             replicated<const float>{a.data(), N - 1, H},
                                             replicated<const float>{b.data(), N, H}),
                    Catch::Contains("(5, 8)"));
}

}  // namespace test_nn_tensor_parallel
