// A Llama on a tensor-parallel group of thread ranks computes what one rank
// computes: the initial weights are slices of the single-rank model's, and
// one training forward and backward give the same loss and, shard by
// shard, the same parameter gradients (float64 to 1e-10, float32 to 1e-5
// relative), with and without activation checkpointing and sequence
// parallelism, with key/value heads split or replicated (tp > nkv). Heads,
// F and (sequence-parallel) T that tp does not divide are refused before
// any collective, with the numbers.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "tessera/comm/local.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/nn/tensor_parallel.hpp"

namespace test_nn_tensor_parallel_model {

using namespace tessera;

namespace {

struct run_result {
  double loss = 0;
  std::vector<double> params, grads;  // this rank's flat buffers, as double
  nn::param_layout layout;
};

comm::comm_options quick() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(30);
  return o;
}

std::vector<std::int32_t> tokens(std::int64_t n, std::int64_t V, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(V));
  return t;
}

// Which targets a batch scores: random ones, only ids of the first slice
// of the vocabulary (every target owned by tp rank 0), or random ones with
// every third position ignored.
enum class targets { random, first_slice, some_ignored };

// One training forward and backward of model `m` on a fixed batch.
template <class Model>
run_result forward_backward(Model& m, std::int64_t B, std::int64_t T,
                            targets kind = targets::random) {
  using P = typename Model::precision_type;
  using Grad = typename P::grad_type;
  const auto& c = m.config();
  const auto in = tokens(B * T, c.vocab, 5);
  auto tgt = tokens(B * T, kind == targets::first_slice ? c.vocab / 4 : c.vocab, 6);
  std::int64_t scored = B * T;
  if (kind == targets::some_ignored)
    for (std::size_t i = 0; i < tgt.size(); i += 3, --scored) tgt[i] = -100;
  m.init_weights(1234);
  typename Model::record r;
  double loss = 0;
  m.forward({in.data(), tgt.data(), nullptr, B, T}, r, Grad(1) / static_cast<Grad>(scored), &loss);
  m.backward(r);
  run_result out;
  out.loss = loss;
  out.layout = m.layout();
  for (std::int64_t i = 0; i < m.flat_size(); ++i) {
    out.params.push_back(tessera::to<double>(m.params()[i]));
    out.grads.push_back(static_cast<double>(m.grads()[i]));
  }
  return out;
}

// Every tensor of a tp rank's layout against the single-rank run: the
// weights bit for bit, the gradients to `tol` relative to the tensor's
// largest gradient; padding rows of the vocabulary zero, with zero
// gradient.
void compare_shards(const run_result& one, const run_result& shard, double tol) {
  for (const auto& e : shard.layout.entries()) {
    const auto& f = one.layout.at(e.name);
    double num = 0, den = 0;
    bool same_weights = true, padding_zero = true;
    for (std::int64_t j = 0; j < e.numel; ++j) {
      const std::int64_t k = e.offset + j;
      if (e.full_index(j) >= e.full.numel()) {
        padding_zero = padding_zero && shard.params[k] == 0 && shard.grads[k] == 0;
        continue;
      }
      const std::int64_t i = f.offset + e.full_index(j);
      same_weights = same_weights && shard.params[k] == one.params[i];
      num = std::max(num, std::fabs(shard.grads[k] - one.grads[i]));
      den = std::max(den, std::fabs(one.grads[i]));
    }
    INFO(e.name << ": gradient error " << num << " of " << den);
    CHECK(same_weights);
    CHECK(padding_zero);
    CHECK(num <= tol * den);
  }
}

template <class P>
void check_equivalence(const nn::llama_config& c, int tp, bool checkpoint, double tol,
                       targets kind = targets::random, bool sequence_parallel = false) {
  nn::llama_options opt;
  if (checkpoint) opt.checkpointing.mode = nn::activation_checkpointing::full;
  const std::int64_t B = 2, T = 12;
  nn::llama<P> one_model(c, opt);
  const run_result one = forward_backward(one_model, B, T, kind);
  std::mutex mu;
  comm::local_world::run(
      tp,
      [&](comm::local_communicator& g) {
        kernels::host_context ctx;
        ctx.threads = 1;
        ctx.apply_threads();
        using layers = nn::tensor_parallel_layers<comm::local_communicator>;
        layers l{&g};
        l.sequence_parallel = sequence_parallel;
        nn::llama<P, host, layers> m(c, opt, ctx, l);
        const run_result mine = forward_backward(m, B, T, kind);
        std::lock_guard<std::mutex> lock(mu);
        INFO("tp " << tp << " rank " << g.rank() << (checkpoint ? ", checkpointed" : "")
                   << (sequence_parallel ? ", sequence-parallel" : ""));
        CHECK(m.sequence_parallel() == sequence_parallel);
        CHECK(std::fabs(mine.loss - one.loss) <= tol * std::fabs(one.loss));
        CHECK(m.flat_size() < one_model.flat_size());
        compare_shards(one, mine, tol);
      },
      quick());
}

nn::llama_config tiny_mha() {
  auto c = nn::llama_config::tiny();
  c.n_kv_heads = c.n_heads;  // 4 key/value heads: tp 4 holds one each
  return c;
}

}  // namespace

TEST_CASE("a shard's elements map to the whole tensor's, by hand", "[nn][tp]") {
  // W (6, 4): rank 1 of 2 by rows holds rows 3..5; by columns, columns 2..3.
  nn::param_layout p;
  const nn::param_entry rows = p.add_shard("w_rows", {3, 4}, true, 0, {6, 4}, 0, 3);
  CHECK(rows.full_index(0) == 12);  // (3, 0)
  CHECK(rows.full_index(5) == 17);  // (4, 1)
  const nn::param_entry cols = p.add_shard("w_cols", {6, 2}, true, 0, {6, 4}, 1, 2);
  CHECK(cols.full_index(0) == 2);   // (0, 2)
  CHECK(cols.full_index(1) == 3);   // (0, 3)
  CHECK(cols.full_index(2) == 6);   // (1, 2)
  CHECK(cols.full_index(11) == 23);  // (5, 3)
  CHECK_THROWS_WITH(p.add_shard("bad", {6, 3}, true, 0, {6, 4}, 1, 2),
                    Catch::Contains("not a slice of 6 x 4"));
  CHECK_THROWS_WITH(p.add_shard("bad", {3, 5}, true, 0, {6, 4}, 0, 3),
                    Catch::Contains("not a slice of 6 x 4"));
  // A row shard may run past the rows: padding, mapped beyond the tensor.
  const nn::param_entry pad = p.add_shard("vocab", {4, 4}, true, -1, {6, 4}, 0, 4);
  CHECK(pad.full_index(7) == 23);
  CHECK(pad.full_index(8) >= pad.full.numel());
  CHECK_THROWS_WITH(p.add_shard("bad", {3, 4}, true, 0, {6, 4}, 2, 0),
                    Catch::Contains("shard_dim=2"));
}

TEST_CASE("a tp-sharded Llama's weights are slices of the single-rank model's", "[nn][tp]") {
  // init only, no collectives: the draws of every shard
  const auto c = nn::llama_config::tiny();
  nn::llama<precision::fp64> one(c);
  one.init_weights(77);
  for (int r = 0; r < 2; ++r) {
    const nn::param_layout shard = nn::make_llama_layout(c, {2, r});
    std::vector<double> mine(static_cast<std::size_t>(shard.total()));
    nn::init_llama_weights_range(c, shard, 77, 0, shard.total(), mine.data());
    for (const auto& e : shard.entries()) {
      const auto& f = one.layout().at(e.name);
      bool same = true;
      for (std::int64_t j = 0; j < e.numel; ++j)
        same = same && mine[e.offset + j] == one.params()[f.offset + e.full_index(j)];
      INFO(e.name << " rank " << r);
      CHECK(same);
    }
  }
}

TEST_CASE("tp Llama: one forward and backward equal one rank's (float64)", "[nn][tp]") {
  check_equivalence<precision::fp64>(nn::llama_config::tiny(), 2, false, 1e-10);
  check_equivalence<precision::fp64>(nn::llama_config::tiny(), 2, true, 1e-10);
  check_equivalence<precision::fp64>(tiny_mha(), 4, false, 1e-10);
}

TEST_CASE("tp Llama: a vocabulary tp does not divide, targets on one rank, ignored targets",
          "[nn][tp]") {
  auto odd = nn::llama_config::tiny();
  odd.vocab = 257;  // padded to 258 over tp 2: one padding row on rank 1
  check_equivalence<precision::fp64>(odd, 2, false, 1e-10);
  check_equivalence<precision::fp64>(odd, 2, false, 1e-10, targets::first_slice);
  check_equivalence<precision::fp64>(odd, 2, false, 1e-10, targets::some_ignored);
  auto mha = tiny_mha();
  mha.vocab = 30;  // over tp 4: slices of 8, the last with 6 ids and 2 padding rows
  check_equivalence<precision::fp64>(mha, 4, true, 1e-10, targets::some_ignored);
}

TEST_CASE("tp Llama: one forward and backward equal one rank's (float32)", "[nn][tp]") {
  check_equivalence<precision::fp32>(nn::llama_config::tiny(), 2, false, 1e-5);
  check_equivalence<precision::fp32>(tiny_mha(), 4, true, 1e-5);
}

TEST_CASE("tp > nkv: key/value heads replicated on the ranks that share them", "[nn][tp]") {
  const auto c = nn::llama_config::tiny();  // nh 4, nkv 2: tp 4 puts each kv head on 2 ranks
  for (int r = 0; r < 4; ++r) {
    const nn::param_layout l = nn::make_llama_layout(c, {4, r});
    const nn::param_entry& wk = l.at("blocks.0.attn.wk");
    INFO("rank " << r);
    CHECK(wk.shp[0] == c.head_dim());        // one head
    CHECK(wk.shard_begin == (r / 2) * c.head_dim());  // the head its query heads use
    CHECK(wk.replicas == 2);
    CHECK(wk.replica == r % 2);
    CHECK(l.at("blocks.0.attn.wq").replicas == 1);
  }
  check_equivalence<precision::fp64>(c, 4, false, 1e-10);
  check_equivalence<precision::fp64>(c, 4, true, 1e-10, targets::some_ignored);
  check_equivalence<precision::fp32>(c, 4, false, 1e-5);
}

TEST_CASE("sequence parallelism: one forward and backward equal one rank's", "[nn][tp][sp]") {
  check_equivalence<precision::fp64>(nn::llama_config::tiny(), 2, false, 1e-10, targets::random,
                                     true);
  check_equivalence<precision::fp64>(nn::llama_config::tiny(), 2, true, 1e-10, targets::random,
                                     true);
  check_equivalence<precision::fp64>(nn::llama_config::tiny(), 4, true, 1e-10,
                                     targets::some_ignored, true);  // kv replicated too
  auto odd = tiny_mha();
  odd.vocab = 257;
  check_equivalence<precision::fp64>(odd, 4, false, 1e-10, targets::first_slice, true);
  check_equivalence<precision::fp32>(tiny_mha(), 4, false, 1e-5, targets::random, true);
}

TEST_CASE("sequence parallelism: T not divisible by tp is refused before any collective",
          "[nn][tp][sp]") {
  std::mutex mu;
  comm::local_world::run(
      4,
      [&](comm::local_communicator& g) {
        kernels::host_context ctx;
        ctx.threads = 1;
        using layers = nn::tensor_parallel_layers<comm::local_communicator>;
        layers l{&g};
        l.sequence_parallel = true;
        nn::llama<precision::fp64, host, layers> m(tiny_mha(), {}, ctx, l);
        m.init_weights(1);
        g.reset_stats();
        const std::vector<std::int32_t> w(2 * 11, 1);  // B 2, T 10: 10 % 4 != 0
        std::string message;
        try {
          m.forward_backward(w.data(), 2, 10, 1.0);
        } catch (const config_error& e) {
          message = e.what();
        }
        const std::uint64_t sent = g.stats().bytes_sent();
        // Generation is never token-sharded: a length tp does not divide runs.
        std::vector<float> logits(static_cast<std::size_t>(m.config().vocab));
        m.next_token_logits(w.data(), 5, logits.data());
        std::lock_guard<std::mutex> lock(mu);
        CHECK_THAT(message, Catch::Contains("T=10") && Catch::Contains("tp=4"));
        CHECK(sent == 0);
        for (float x : logits) CHECK(std::isfinite(x));
      },
      quick());
}

TEST_CASE("tp that does not split the heads or F is refused with the numbers", "[nn][tp]") {
  const auto c = nn::llama_config::tiny();  // nh 4, nkv 2, F 24
  CHECK_THROWS_WITH(nn::make_llama_layout(c, {3, 0}), Catch::Contains("tp=3"));
  auto g = nn::llama_config::tiny();  // tp 6 divides nh 12 but is no multiple of nkv 4
  g.dim = 24;
  g.n_heads = 12;
  g.n_kv_heads = 4;
  CHECK_THROWS_WITH(nn::make_llama_layout(g, {6, 0}),
                    Catch::Contains("tp=6") && Catch::Contains("nkv=4") &&
                        Catch::Contains("nh=12"));
  auto f = tiny_mha();
  f.ffn_dim = 26;
  CHECK_THROWS_WITH(nn::make_llama_layout(f, {4, 1}),
                    Catch::Contains("tp=4") && Catch::Contains("F=26"));
  CHECK_THROWS_WITH(nn::make_llama_layout(c, {2, 2}), Catch::Contains("rank 2"));
}

}  // namespace test_nn_tensor_parallel_model
