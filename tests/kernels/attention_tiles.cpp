// Tests include/tessera/kernels/detail/attention_host.hpp: the
// register-blocked tile products of the host attention give, bit for bit,
// what one-row-at-a-time loops give (each element summed in the same order
// with the same expression), over row counts around the block of 4, key
// counts around the 32 lanes, head sizes with and without a tail, and
// causal offsets; and they touch nothing outside what they document.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "tessera/kernels/detail/attention_host.hpp"

namespace test_kernels_attention_tiles {

namespace {

using namespace tessera::kernels::detail;

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The row-at-a-time forms: one row, one key at a time, in order.
void scores_reference(float* s, std::int64_t lds, const float* a, const float* bt, std::int64_t ldb,
                      std::int64_t rows, std::int64_t n, std::int64_t hd) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * lds;
    for (std::int64_t c = 0; c < n; ++c) sr[c] = 0;
    for (std::int64_t d = 0; d < hd; ++d)
      for (std::int64_t c = 0; c < n; ++c) sr[c] += a[r * hd + d] * bt[d * ldb + c];
  }
}

void rows_reference(float* y, std::int64_t ldy, const float* p, std::int64_t ldp, const float* x,
                    std::int64_t rows, std::int64_t diag, std::int64_t nk, std::int64_t hd) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < attention_row_keys(r, diag, nk); ++c)
      for (std::int64_t d = 0; d < hd; ++d) y[r * ldy + d] += p[r * ldp + c] * x[c * hd + d];
}

void cols_reference(float* y, const float* p, std::int64_t ldp, const float* x, std::int64_t rows,
                    std::int64_t diag, std::int64_t nk, std::int64_t hd) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < attention_row_keys(r, diag, nk); ++c)
      for (std::int64_t d = 0; d < hd; ++d) y[c * hd + d] += p[r * ldp + c] * x[r * hd + d];
}

}  // namespace

TEST_CASE("blocked attention tile products equal the row-at-a-time loops bit for bit",
          "[kernels][attention]") {
  std::uint32_t seed = 1;
  int cases = 0;
  for (std::int64_t hd : {8, 32, 33, 72})
    for (std::int64_t rows : {1, 3, 4, 5, 8, 9})
      for (std::int64_t nk : {1, 4, 7, 31, 32, 33, 64, 70})
        for (std::int64_t diag : {0, 3, 40}) {
          INFO("hd " << hd << " rows " << rows << " nk " << nk << " diag " << diag);
          const std::int64_t ld = attention_padded(nk);
          const auto a = random_floats(static_cast<std::size_t>(rows * hd), ++seed);
          const auto bt = random_floats(static_cast<std::size_t>(hd * ld), ++seed);

          // Scores: the columns < nk; the padding columns may hold anything.
          std::vector<float> s(static_cast<std::size_t>(rows * ld), 7.0f), s_ref = s;
          attention_tile_scores(s.data(), ld, a.data(), bt.data(), ld, rows, nk, hd);
          scores_reference(s_ref.data(), ld, a.data(), bt.data(), ld, rows, nk, hd);
          for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t c = nk; c < ld; ++c) s[static_cast<std::size_t>(r * ld + c)] =
                s_ref[static_cast<std::size_t>(r * ld + c)];
          CHECK(same_bits(s, s_ref));

          // O += P V into rows of stride ldy > hd: the gap between rows untouched.
          const std::int64_t ldy = hd + 5;
          const auto p = random_floats(static_cast<std::size_t>(rows * ld), ++seed);
          const auto x_keys = random_floats(static_cast<std::size_t>(nk * hd), ++seed);
          auto y = random_floats(static_cast<std::size_t>(rows * ldy), ++seed), y_ref = y;
          attention_tile_rows_acc(y.data(), ldy, p.data(), ld, x_keys.data(), rows, diag, nk, hd);
          rows_reference(y_ref.data(), ldy, p.data(), ld, x_keys.data(), rows, diag, nk, hd);
          CHECK(same_bits(y, y_ref));

          // dV += P^T dO.
          const auto x_rows = random_floats(static_cast<std::size_t>(rows * hd), ++seed);
          auto z = random_floats(static_cast<std::size_t>(nk * hd), ++seed), z_ref = z;
          attention_tile_cols_acc(z.data(), p.data(), ld, x_rows.data(), rows, diag, nk, hd);
          cols_reference(z_ref.data(), p.data(), ld, x_rows.data(), rows, diag, nk, hd);
          CHECK(same_bits(z, z_ref));
          ++cases;
        }
  CHECK(cases == 4 * 6 * 8 * 3);
}

TEST_CASE("attention_row_keys: row r sees keys c <= r + diag, at most nk", "[kernels][attention]") {
  CHECK(attention_row_keys(0, 0, 64) == 1);
  CHECK(attention_row_keys(5, 0, 64) == 6);
  CHECK(attention_row_keys(5, 100, 64) == 64);
  CHECK(attention_row_keys(0, -3, 64) == 0);
  CHECK(attention_padded(1) == attention_lanes);
  CHECK(attention_padded(attention_lanes) == attention_lanes);
  CHECK(attention_padded(attention_lanes + 1) == 2 * attention_lanes);
}

}  // namespace test_kernels_attention_tiles
