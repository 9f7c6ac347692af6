// Tests tied embeddings (llama_config::tie_word_embeddings) in
// include/tessera/nn/llama.hpp and nn/llama_layout.hpp: the layout holds one
// (V, H) tensor, read by the embedding and by the LM head; the tied model's
// loss is the untied model's whose head equals the embedding, and its
// gradient is that model's two gradients summed (float64); the whole tied
// model's gradient equals central finite differences (float64); a tied
// model on a tensor-parallel group of thread ranks (vocabulary-parallel
// embedding and head, split alike) computes one rank's loss and gradient
// (float64 1e-10), the vocabulary padded or not; a pipeline's last stage
// holds a copy ("lm_head", tied to "embedding") drawn from the embedding's
// stream, on the host and through kernels::weight_init.
#include <catch2/catch.hpp>

#include <omp.h>

#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <vector>

#include "tessera/comm/local.hpp"
#include "tessera/kernels/blas.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/weight_init.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/nn/tensor_parallel.hpp"

namespace test_nn_llama_tied {

using namespace tessera;

namespace {

nn::llama_config tied_cfg(std::int64_t vocab = 32) {
  auto c = nn::llama_config::tiny();
  c.vocab = vocab;
  c.tie_word_embeddings = true;
  return c;
}

std::vector<std::int32_t> windows(std::int64_t B, std::int64_t T, std::int64_t V,
                                  std::uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<std::int32_t> t(static_cast<std::size_t>(B * (T + 1)));
  for (auto& x : t) x = static_cast<std::int32_t>(r() % static_cast<std::uint64_t>(V));
  return t;
}

// Tiny shapes: one thread avoids fork/join overhead dominating the many forwards.
struct one_thread {
  int omp = omp_get_max_threads(), blas = openblas_get_num_threads();
  one_thread() {
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
  }
  ~one_thread() {
    omp_set_num_threads(omp);
    openblas_set_num_threads(blas);
  }
};

// Generic weights: norm gains away from 1, matrices 3x the init.
template <class Model>
void perturb(Model& m) {
  rng r(7);
  for (const auto& e : m.layout().entries())
    if (e.shp.rank == 1)
      for (std::int64_t i = 0; i < e.numel; ++i) m.params()[e.offset + i] = 1.0 + 0.2 * r.normal();
  for (std::int64_t i = 0; i < m.flat_size(); ++i) m.params()[i] *= 3.0;
}

comm::comm_options quick() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(30);
  return o;
}

}  // namespace

TEST_CASE("tied layout: one (V, H) tensor, a tied copy only where asked", "[nn][tied]") {
  const auto c = tied_cfg();
  auto u = c;
  u.tie_word_embeddings = false;
  const nn::param_layout tied = nn::make_llama_layout(c), untied = nn::make_llama_layout(u);
  CHECK(tied.entries().size() + 1 == untied.entries().size());
  CHECK_THROWS(tied.at("lm_head"));
  CHECK(tied.num_params() + c.vocab * c.dim == untied.num_params());
  CHECK(c.num_params() == tied.num_params());
  CHECK(u.num_params() == untied.num_params());
  for (const auto& e : tied.entries()) {
    CHECK(e.tied.empty());
    CHECK(e.offset == untied.at(e.name).offset);  // the head was last: nothing moves
  }
  // The last pipeline stage's copy: "lm_head", tied to the embedding, its
  // shape and vocabulary split, after every other tensor.
  for (int tp : {1, 2, 4}) {
    for (int r = 0; r < tp; ++r) {
      const nn::param_layout cp = nn::make_llama_layout(c, {tp, r}, nn::tied_head::copy);
      const nn::param_layout sh = nn::make_llama_layout(c, {tp, r});
      const auto& h = cp.at("lm_head");
      const auto& e = cp.at("embedding");
      CHECK(h.tied == "embedding");
      CHECK(h.shp == e.shp);
      CHECK(h.full == e.full);
      CHECK(h.shard_dim == e.shard_dim);
      CHECK(h.shard_begin == e.shard_begin);
      CHECK(h.offset >= sh.total());
      CHECK(cp.entries().size() == sh.entries().size() + 1);
    }
  }
  // Untied, the head mode changes nothing.
  const nn::param_layout ucp = nn::make_llama_layout(u, {}, nn::tied_head::copy);
  CHECK(ucp.at("lm_head").tied.empty());
  CHECK(ucp.total() == untied.total());
}

TEST_CASE("tied copy draws the embedding's values (host and weight_init)", "[nn][tied]") {
  const auto c = tied_cfg(31);  // a vocabulary tp 2 pads
  for (int tp : {1, 2}) {
    for (int r = 0; r < tp; ++r) {
      const nn::param_layout cp = nn::make_llama_layout(c, {tp, r}, nn::tied_head::copy);
      std::vector<double> a(static_cast<std::size_t>(cp.total()));
      nn::init_llama_weights_range(c, cp, 11, 0, cp.total(), a.data());
      std::vector<double> b(a.size(), -1.0);
      const auto ts = nn::llama_weight_init_tensors(c, cp, 11);
      kernels::weight_init(kernels::default_host_context(),
                           std::span<const kernels::weight_init_tensor>(ts), 0, cp.total(),
                           b.data());
      const auto& e = cp.at("embedding");
      const auto& h = cp.at("lm_head");
      std::int64_t same = 0, nonzero = 0;
      for (std::int64_t j = 0; j < e.numel; ++j) {
        const double x = a[static_cast<std::size_t>(e.offset + j)];
        same += x == a[static_cast<std::size_t>(h.offset + j)] &&
                x == b[static_cast<std::size_t>(h.offset + j)];
        nonzero += x != 0;
      }
      INFO("tp " << tp << " rank " << r);
      CHECK(same == e.numel);
      CHECK(nonzero > e.numel / 2);
      CHECK(a == b);
    }
  }
}

TEST_CASE("tied llama: the gradient is the untied model's two gradients summed (float64)",
          "[nn][tied]") {
  one_thread guard;
  const auto c = tied_cfg();
  auto u = c;
  u.tie_word_embeddings = false;
  nn::llama_options opt;
  opt.ce_chunk = 5;
  nn::llama<precision::fp64> tied(c, opt), untied(u, opt);
  tied.init_weights(3);
  perturb(tied);
  // The untied model: the same tensors, its head equal to the embedding.
  const auto& te = tied.layout();
  const auto& ue = untied.layout();
  for (const auto& e : ue.entries()) {
    const auto& from = te.at(e.name == "lm_head" ? "embedding" : e.name);
    std::copy_n(tied.params() + from.offset, e.numel, untied.params() + e.offset);
  }
  const std::int64_t B = 2, T = 9;
  auto tok = windows(B, T, c.vocab, 5);
  tok[4] = -100;
  tied.zero_grad();
  untied.zero_grad();
  const auto a = tied.forward_backward(tok.data(), B, T, 1.0 / 17);
  const auto b = untied.forward_backward(tok.data(), B, T, 1.0 / 17);
  CHECK(a.scored == b.scored);
  // The same function: the same operations in the same order.
  CHECK(a.sum == b.sum);
  double worst = 0, scale = 0;
  for (const auto& e : te.entries()) {
    for (std::int64_t j = 0; j < e.numel; ++j) {
      double want = untied.grads()[ue.at(e.name).offset + j];
      if (e.name == "embedding") want += untied.grads()[ue.at("lm_head").offset + j];
      const double got = tied.grads()[e.offset + j];
      worst = std::max(worst, std::fabs(got - want));
      scale = std::max(scale, std::fabs(want));
    }
  }
  INFO("largest difference " << worst << " of " << scale);
  // float64: the embedding's gradient adds the head's and the lookup's
  // contributions in another order (the head's first), a few ulps.
  CHECK(worst <= 1e-14 * scale);
  // And the head's contribution is there: not the lookup's alone.
  double head_part = 0;
  for (std::int64_t j = 0; j < ue.at("lm_head").numel; ++j)
    head_part = std::max(head_part, std::fabs(untied.grads()[ue.at("lm_head").offset + j]));
  CHECK(head_part > 0.1 * scale);
}

TEST_CASE("tied llama gradient equals central finite differences (float64)", "[nn][tied][fd]") {
  one_thread guard;
  nn::llama_options opt;
  opt.ce_chunk = 5;
  const kernels::host_context ctx{&host::default_resource(), 0, {4, 3}};
  nn::llama<precision::fp64> m(tied_cfg(), opt, ctx);
  m.init_weights(42);
  perturb(m);
  const std::int64_t B = 2, T = 7;
  auto tok = windows(B, T, m.config().vocab, 99);
  tok[3] = -100;
  m.zero_grad();
  const auto r = m.forward_backward(tok.data(), B, T, 1.0);
  const double scale = 1.0 / static_cast<double>(r.scored);
  auto mean_loss = [&] {
    const auto l = m.forward_loss(tok.data(), B, T);
    return l.sum / static_cast<double>(l.scored);
  };
  // Fourth-order central differences (tests/nn/llama.cpp): rounding ~4e-12
  // with h = 1e-4. Every element of the tied embedding (both uses), every
  // norm gain, 1 in 5 elements of the other matrices.
  const double h = 1e-4;
  double num_sq = 0, diff_sq = 0;
  std::int64_t checked = 0;
  for (const auto& e : m.layout().entries()) {
    const std::int64_t st = e.shp.rank == 1 || e.name == "embedding" ? 1 : 5;
    for (std::int64_t i = 0; i < e.numel; i += st) {
      double& p = m.params()[e.offset + i];
      const double p0 = p;
      auto at = [&](double x) {
        p = x;
        return mean_loss();
      };
      const double num =
          (8 * (at(p0 + h) - at(p0 - h)) - (at(p0 + 2 * h) - at(p0 - 2 * h))) / (12 * h);
      p = p0;
      const double a = m.grads()[e.offset + i] * scale;
      num_sq += num * num;
      diff_sq += (a - num) * (a - num);
      INFO(e.name << "[" << i << "] analytic " << a << " numeric " << num);
      REQUIRE(std::abs(a - num) <= 1e-6 * std::abs(num) + 1e-10);
      ++checked;
    }
  }
  CHECK(checked > m.config().vocab * m.config().dim);
  CHECK(std::sqrt(diff_sq / num_sq) < 1e-6);
}

TEST_CASE("tied llama on tp 2 and 4 equals one rank (float64 1e-10)", "[nn][tied][tp]") {
  // V 32 splits evenly; V 31 pads the last rank's rows (tp 2: 16 + 15 + 1 padding).
  for (std::int64_t V : {std::int64_t{32}, std::int64_t{31}}) {
    for (int tp : {2, 4}) {
      auto c = tied_cfg(V);
      c.n_kv_heads = c.n_heads;  // tp 4 holds one key/value head each
      const std::int64_t B = 2, T = 12;
      const auto tok = windows(B, T, V, 8);
      nn::llama<precision::fp64> one(c, {});
      one.init_weights(1234);
      one.zero_grad();
      const auto ref = one.forward_backward(tok.data(), B, T, 1.0 / (B * T));
      std::mutex mu;
      comm::local_world::run(
          tp,
          [&](comm::local_communicator& g) {
            kernels::host_context ctx;
            ctx.threads = 1;
            ctx.apply_threads();
            using layers = nn::tensor_parallel_layers<comm::local_communicator>;
            nn::llama<precision::fp64, host, layers> m(c, {}, ctx, layers{&g});
            m.init_weights(1234);
            m.zero_grad();
            const auto got = m.forward_backward(tok.data(), B, T, 1.0 / (B * T));
            // Generation reads the tied head too (a collective: before the lock).
            std::vector<float> lg(static_cast<std::size_t>(V)), lg1(lg.size());
            m.next_token_logits(tok.data(), T, lg.data());
            std::lock_guard<std::mutex> lock(mu);
            one.next_token_logits(tok.data(), T, lg1.data());
            INFO("V " << V << " tp " << tp << " rank " << g.rank());
            CHECK(std::fabs(got.sum - ref.sum) <= 1e-10 * ref.sum);
            CHECK_THROWS(m.layout().at("lm_head"));
            const auto& emb = m.layout().at("embedding");
            CHECK(emb.shard_dim == 0);
            for (const auto& e : m.layout().entries()) {
              const auto& f = one.layout().at(e.name);
              double worst = 0, scale = 0;
              bool same_weights = true, padding_zero = true;
              for (std::int64_t j = 0; j < e.numel; ++j) {
                const std::int64_t k = e.offset + j;
                if (e.full_index(j) >= e.full.numel()) {
                  padding_zero = padding_zero && m.params()[k] == 0 && m.grads()[k] == 0;
                  continue;
                }
                const std::int64_t i = f.offset + e.full_index(j);
                same_weights = same_weights && m.params()[k] == one.params()[i];
                worst = std::max(worst, std::fabs(m.grads()[k] - one.grads()[i]));
                scale = std::max(scale, std::fabs(one.grads()[i]));
              }
              INFO(e.name << ": gradient differs by " << worst << " of " << scale);
              CHECK(same_weights);
              CHECK(padding_zero);
              CHECK(worst <= 1e-10 * scale);
            }
            for (std::size_t v = 0; v < lg.size(); ++v)
              CHECK(std::fabs(lg[v] - lg1[v]) <= 1e-5f * (1 + std::fabs(lg1[v])));
          },
          quick());
    }
  }
}

}  // namespace test_nn_llama_tied
