// Packed documents through the whole model (nn::llama with
// micro_batch::doc_start from data::document_starts): the loss of windows
// that pack several documents equals the sum of the losses of each document
// run alone, and so do the gradients (float64, 1e-12); RoPE positions
// restart at each document, so a document's loss does not depend on where
// in the window it sits. Windows that start with a separator and documents
// of length 1 included.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include <tessera/core/random.hpp>
#include <tessera/data/documents.hpp>
#include <tessera/nn/llama.hpp>

namespace test_nn_llama_documents {

using namespace tessera;

namespace {

constexpr std::int32_t sep = 7;  // the separator id of these tests

}  // namespace

TEST_CASE("data::document_starts: the separator ends its document", "[data][document_mask]") {
  // Inputs are columns 0..T-1 of each (T+1)-token window.
  const std::int64_t T = 8;
  const std::vector<std::int32_t> w = {sep, 1, 2, sep, sep, 3, 4,     5, sep,  // starts with sep
                                       1,   2, 3, 4,   5,   6, 7 - 7, 1, 2};   // no separator
  std::vector<std::int32_t> ds(2 * T, -1);
  data::document_starts(w.data(), 2, T, sep, ds.data());
  // Row 0: [sep] [1 2 sep] [sep] [3 4 5]; the separator in the last
  // column is a target only.
  CHECK(ds == std::vector<std::int32_t>{0, 1, 1, 1, 4, 5, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0});
  CHECK_THROWS_AS(data::document_starts(w.data(), 0, T, sep, ds.data()), config_error);
}

TEST_CASE("llama on packed documents: loss and gradients are the per-document sums (float64)",
          "[nn][document_mask]") {
  auto c = nn::llama_config::tiny();
  c.n_kv_heads = 2;
  const std::int64_t B = 3, T = 21, V = c.vocab;
  // Random tokens with separators at chosen places: row 0 starts with one,
  // row 1 holds runs of one-token documents, row 2 none (one document).
  rng r(20261207);
  std::vector<std::int32_t> w(static_cast<std::size_t>(B * (T + 1)));
  for (auto& x : w) {
    x = static_cast<std::int32_t>(r.next_u64() % static_cast<std::uint64_t>(V));
    if (x == sep) x = sep + 1;
  }
  for (const std::int64_t i : {0, 4, 5, 13, 20}) w[static_cast<std::size_t>(i)] = sep;
  for (const std::int64_t i : {2, 3, 4, 5, 11, 12, 19})
    w[static_cast<std::size_t>(T + 1 + i)] = sep;
  std::vector<std::int32_t> ds(static_cast<std::size_t>(B * T));
  data::document_starts(w.data(), B, T, sep, ds.data());

  // Attention tiles smaller than the documents and not aligned to them.
  kernels::host_context ctx;
  ctx.tiles = {4, 3};
  nn::llama_options opt;
  opt.ce_chunk = 5;
  nn::llama<precision::fp64> packed(c, opt, ctx), alone(c, opt, ctx);
  packed.init_weights(11);
  alone.init_weights(11);
  packed.zero_grad();
  alone.zero_grad();
  const nn::loss_sum lp = packed.forward_backward(w.data(), B, T, 1.0, ds.data());

  // Each document alone: input columns [a, e) of its row, targets a+1 .. e.
  double sum = 0;
  std::int64_t scored = 0, docs = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    std::int64_t a = 0;
    for (std::int64_t t = 1; t <= T; ++t) {
      if (t < T &&
          ds[static_cast<std::size_t>(b * T + t)] == ds[static_cast<std::size_t>(b * T + a)])
        continue;
      const std::int32_t* first = w.data() + b * (T + 1) + a;
      const std::vector<std::int32_t> one(first, first + (t - a) + 1);
      const nn::loss_sum l = alone.forward_backward(one.data(), 1, t - a, 1.0);
      sum += l.sum;
      scored += l.scored;
      ++docs;
      a = t;
    }
  }
  CHECK(docs == 5 + 8 + 1);
  CHECK(scored == lp.scored);
  INFO("packed " << lp.sum << " vs per-document sum " << sum << ": relative difference "
                 << std::abs(lp.sum - sum) / std::abs(sum));
  // float64: the same sums in another order (the chunked cross-entropy and
  // the weight-gradient GEMMs group tokens differently).
  CHECK(std::abs(lp.sum - sum) <= 1e-12 * std::abs(sum));
  double worst = 0, largest = 0;
  for (std::int64_t i = 0; i < packed.layout().total(); ++i) {
    worst = std::max(worst, std::abs(packed.grads()[i] - alone.grads()[i]));
    largest = std::max(largest, std::abs(alone.grads()[i]));
  }
  INFO("gradients: worst " << worst << " of largest " << largest);
  CHECK(worst <= 1e-12 * largest);

  // Without the mask the same windows give another loss: the test sees the mask.
  const nn::loss_sum plain = packed.forward_loss(w.data(), B, T);
  CHECK(std::abs(plain.sum - lp.sum) > 1e-6 * std::abs(lp.sum));

  // Starts past their position (RoPE would rotate by a negative position)
  // or decreasing along a row (the kernels' tile bounds assume documents
  // are contiguous) are refused, naming the place.
  std::vector<std::int32_t> bad = ds;
  bad[static_cast<std::size_t>(T + 3)] = 4;  // row 1, position 3
  CHECK_THROWS_WITH(packed.forward_loss(w.data(), B, T, bad.data()),
                    Catch::Contains("document start 4 at row 1 position 3 must lie in ["));
  bad = ds;
  bad[static_cast<std::size_t>(2 * T + 7)] = -1;
  CHECK_THROWS_WITH(packed.forward_loss(w.data(), B, T, bad.data()),
                    Catch::Contains("document start -1 at row 2 position 7"));
}

}  // namespace test_nn_llama_documents
