// Tests include/tessera/nn/segment_hooks.hpp with nn::llama: the documented
// hook order (a split backward's included), that segments tile the flat buffer, that a model
// reading its parameters from external per-segment pointers computes the same bits, and that
// init_weights_range reproduces any slice of init_weights.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tessera/core/random.hpp"
#include "tessera/nn/llama.hpp"

namespace test_nn_segment_hooks {

using namespace tessera;

namespace {

struct recorder : nn::segment_hooks {
  std::vector<std::string> events;
  void before_forward(int s) override { events.push_back("bf" + std::to_string(s)); }
  void after_forward(int s) override { events.push_back("af" + std::to_string(s)); }
  void before_backward(int s) override { events.push_back("bb" + std::to_string(s)); }
  void after_backward(int s) override { events.push_back("ab" + std::to_string(s)); }
  void after_backward_input(int s) override { events.push_back("abi" + std::to_string(s)); }
};

std::vector<std::int32_t> tokens(std::int64_t B, std::int64_t T, std::int64_t V, std::uint64_t s) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(B * (T + 1)));
  rng r(s);
  for (auto& x : t) x = static_cast<std::int32_t>(r.next_u64() % static_cast<std::uint64_t>(V));
  return t;
}

}  // namespace

TEST_CASE("segments tile the flat buffer and hooks run in the documented order", "[nn][hooks]") {
  nn::llama<precision::fp32> m(nn::llama_config::tiny());
  m.init_weights(3);
  const int L = m.last_segment();
  REQUIRE(L == 2);
  CHECK(m.segment_begin(-1) == 0);
  for (int s = -1; s < L; ++s) CHECK(m.segment_end(s) == m.segment_begin(s + 1));
  CHECK(m.segment_end(L) == m.layout().total());
  CHECK(m.segment_begin(L) == m.layout().at("final_norm").offset);
  recorder rec;
  m.set_hooks(&rec);
  auto tok = tokens(2, 8, m.config().vocab, 1);
  m.forward_backward(tok.data(), 2, 8, 1.0f / 16);
  const std::vector<std::string> fb = {"bf-1", "af-1", "bf0", "af0", "bf1", "af1",  "bf2",
                                       "ab2",  "bb1",  "ab1", "bb0", "ab0", "bb-1", "ab-1"};
  CHECK(rec.events == fb);
  rec.events.clear();
  m.forward_loss(tok.data(), 2, 8);
  const std::vector<std::string> fl = {"bf-1", "af-1", "bf0", "af0", "bf1", "af1", "bf2", "af2"};
  CHECK(rec.events == fl);
  // A split backward (zero-bubble schedules): B frees each block's
  // parameters (after_backward_input), W completes its gradients.
  std::vector<std::int32_t> in, tg;
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t t = 0; t < 8; ++t) {
      in.push_back(tok[static_cast<std::size_t>(b * 9 + t)]);
      tg.push_back(tok[static_cast<std::size_t>(b * 9 + t + 1)]);
    }
  decltype(m)::record r;
  double loss = 0;
  rec.events.clear();
  m.forward(nn::micro_batch<float>{in.data(), tg.data(), nullptr, 2, 8}, r, 1.0f / 16, &loss);
  m.backward_input(r);
  m.backward_weight(r);
  const std::vector<std::string> split = {"bf-1", "af-1", "bf0",  "af0",  "bf1", "af1",
                                          "bf2",  "ab2",  "bb1",  "abi1", "bb0", "abi0",
                                          "ab1",  "ab0",  "bb-1", "ab-1"};
  CHECK(rec.events == split);
  m.set_hooks(nullptr);
}

TEST_CASE("a model on external per-segment parameters computes the same bits", "[nn][hooks]") {
  const auto cfg = nn::llama_config::tiny();
  nn::llama<precision::fp32> a(cfg);
  a.init_weights(11);
  nn::llama_options o;
  o.external_params = true;
  nn::llama<precision::fp32> b(cfg, o);
  CHECK(b.params() == nullptr);
  CHECK_THROWS_AS(b.init_weights(11), config_error);
  // Each segment in its own allocation, filled by init_weights_range.
  std::vector<std::vector<float>> seg;
  for (int s = -1; s <= b.last_segment(); ++s) {
    seg.emplace_back(static_cast<std::size_t>(b.segment_end(s) - b.segment_begin(s)));
    b.init_weights_range(11, b.segment_begin(s), b.segment_end(s), seg.back().data());
    b.set_segment_params(s, seg.back().data());
  }
  auto tok = tokens(2, 9, cfg.vocab, 5);
  auto ra = a.forward_backward(tok.data(), 2, 9, 1.0f / 18);
  auto rb = b.forward_backward(tok.data(), 2, 9, 1.0f / 18);
  CHECK(ra.sum == rb.sum);
  for (std::int64_t i = 0; i < a.layout().total(); ++i) {
    INFO("element " << i);
    REQUIRE(a.grads()[i] == b.grads()[i]);
  }
}

TEST_CASE("init_weights_range reproduces every slice of init_weights", "[nn][init]") {
  nn::llama<precision::bf16_mixed> m(nn::llama_config::tiny());
  m.init_weights(7);
  const std::int64_t n = m.layout().total();
  for (std::int64_t lo : {std::int64_t{0}, std::int64_t{5}, std::int64_t{517}, n - 3, n}) {
    for (std::int64_t len : {std::int64_t{0}, std::int64_t{1}, std::int64_t{700}, n}) {
      const std::int64_t hi = std::min(n, lo + len);
      std::vector<bf16> out(static_cast<std::size_t>(hi - lo));
      m.init_weights_range(7, lo, hi, out.data());
      for (std::int64_t i = lo; i < hi; ++i)
        REQUIRE(to<float>(out[static_cast<std::size_t>(i - lo)]) == to<float>(m.params()[i]));
    }
  }
}

}  // namespace test_nn_segment_hooks
