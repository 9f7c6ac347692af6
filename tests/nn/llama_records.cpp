// Tests the activation records of include/tessera/nn/llama.hpp (with
// nn/checkpointing.hpp and nn/record_pool.hpp): activation checkpointing
// gives the same bits as keeping every record and holds less memory;
// record_bytes(B, T) is what a training forward leaves; several
// micro-batches in flight (forwards first, then their backwards) accumulate
// the gradients of one-at-a-time; two pipeline stages chained by their
// boundary hidden states compute the whole model's loss and gradients bit
// for bit; bf16 activation gradients (precision::bf16_mixed_bf16_grads)
// keep the forward and move the gradients by a bf16 rounding error only.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tessera/core/memory.hpp"
#include "tessera/core/random.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/nn/llama.hpp"
#include "tessera/nn/record_pool.hpp"

namespace test_nn_llama_records {

using namespace tessera;

namespace {

using nn::activation_checkpointing;

// The tiny preset (H 16, L 2, nh 4, nkv 2, F 24) with a byte vocabulary.
nn::llama_config cfg256() {
  auto c = nn::llama_config::tiny();
  c.vocab = 256;
  return c;
}

constexpr std::int64_t B = 2, T = 13;  // T odd, not a multiple of any tile

// (B, T+1) windows of random ids in [0, V), one target ignored.
std::vector<std::int32_t> windows(std::int64_t V, std::uint64_t seed) {
  rng r(seed);
  std::vector<std::int32_t> w(static_cast<std::size_t>(B * (T + 1)));
  for (auto& x : w) x = static_cast<std::int32_t>(r.next_u64() % static_cast<std::uint64_t>(V));
  w[5] = -100;
  return w;
}

// The (B, T) inputs and targets of windows `w` (as forward_backward splits them).
struct split {
  std::vector<std::int32_t> inputs, targets;
  explicit split(const std::vector<std::int32_t>& w) {
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t) {
        inputs.push_back(w[static_cast<std::size_t>(b * (T + 1) + t)]);
        targets.push_back(w[static_cast<std::size_t>(b * (T + 1) + t + 1)]);
      }
  }
  template <class Param>
  nn::micro_batch<Param> batch() const {
    return {inputs.data(), targets.data(), nullptr, B, T};
  }
};

template <class M>
std::vector<typename M::precision_type::grad_type> grads_of(const M& m) {
  return {m.grads(), m.grads() + m.flat_size()};
}

// Whether every segment of `m` in [first, last] holds a nonzero gradient
// (so a bitwise match is not a match of zeros).
template <class M>
bool every_segment_has_gradients(const M& m) {
  for (int s = m.first_segment(); s <= m.last_segment(); ++s)
    if (std::none_of(m.grads() + m.segment_begin(s), m.grads() + m.segment_end(s),
                     [](auto x) { return x != 0; }))
      return false;
  return true;
}

template <class G>
bool same_bits(const std::vector<G>& a, const G* b) {
  return std::memcmp(a.data(), b, a.size() * sizeof(G)) == 0;
}
bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof(double)) == 0;
}

// Poison for the loss a forward must write (=).
constexpr double poison = std::numeric_limits<double>::quiet_NaN();

// max |a - b| / max |b| over the whole buffer.
template <class G>
double max_rel_diff(const std::vector<G>& a, const std::vector<G>& b) {
  double diff = 0, mx = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    mx = std::max(mx, std::abs(static_cast<double>(b[i])));
  }
  return diff / mx;
}

struct step_result {
  double loss = 0;                        // sum over both micro-batches
  std::vector<unsigned char> grad_bytes;  // the flat gradient buffer's bytes
  bool has_gradients = false;             // every segment's gradient is nonzero somewhere
  std::size_t peak = 0;                   // peak allocated bytes during the step
};

// One optimizer step's gradients: two micro-batches accumulated with the
// host-memory forward_backward, under checkpointing `cp`.
template <class P>
step_result two_micro_batches(nn::checkpoint_policy cp) {
  host_memory_resource mr;
  const kernels::host_context ctx{&mr};
  nn::llama_options opt;
  opt.checkpointing = cp;
  nn::llama<P> m(cfg256(), opt, ctx);
  m.init_weights(17);
  const auto w0 = windows(256, 1), w1 = windows(256, 2);
  const auto scale = static_cast<typename P::accum_type>(1.0 / (2 * (B * T - 1)));
  m.zero_grad();
  mr.reset_peak();
  step_result s;
  s.loss = m.forward_backward(w0.data(), B, T, scale).sum;
  s.loss += m.forward_backward(w1.data(), B, T, scale).sum;
  s.peak = mr.stats().peak_allocated;
  const auto* g = reinterpret_cast<const unsigned char*>(m.grads());
  s.grad_bytes.assign(g, g + m.flat_size() * sizeof(*m.grads()));
  s.has_gradients = every_segment_has_gradients(m);
  return s;
}

}  // namespace

TEMPLATE_TEST_CASE("activation checkpointing gives the same bits with less memory",
                   "[nn][checkpointing]", precision::fp32, precision::fp64) {
  using P = TestType;
  const auto none = two_micro_batches<P>({});
  std::size_t peak[3] = {0, 0, none.peak};  // full every 1, full every 2, none
  for (std::int64_t every : {1, 2}) {
    INFO("full, every " << every);
    const auto full = two_micro_batches<P>({activation_checkpointing::full, every});
    peak[every - 1] = full.peak;
    // The kernels are deterministic and the recompute runs the same kernels
    // on the same input, so the recomputed records, and every gradient,
    // are the original bits (nn/checkpointing.hpp): no tolerance.
    CHECK(same_bits(full.loss, none.loss));
    REQUIRE(full.grad_bytes.size() == none.grad_bytes.size());
    CHECK(full.grad_bytes == none.grad_bytes);
    // Under full a block holds its input only between its forward and its
    // backward, so the step's peak drops.
    INFO("peak allocated: none " << none.peak << ", full " << full.peak);
    CHECK(full.peak < none.peak);
  }
  // Checkpointing both blocks holds less than checkpointing block 0 only
  // (fp32, measured: 137136, 151592 and 169688 bytes for every 1, 2, none).
  CHECK(peak[0] < peak[1]);
  CHECK(none.has_gradients);  // not a match of zeros
}

TEMPLATE_TEST_CASE("record_bytes(B, T) is what a training forward leaves in its record",
                   "[nn][checkpointing][memory]", precision::fp32, precision::fp64) {
  using P = TestType;
  using Param = typename P::param_type;
  using Acc = typename P::accum_type;
  using ActGrad = typename P::act_grad_type;
  const auto c = cfg256();
  const std::int64_t N = B * T, H = c.dim, KV = c.kv_dim(), F = c.ffn_dim, L = c.n_layers;
  // Independently of the headers: a full block record is x_in, xn1, q, att,
  // x_mid, xn2 (H each), k, v (KV), gate, up, h (F) of Param and rstd1,
  // rstd2, lse (2 + nh) of Acc per token; a checkpointed block keeps x_in;
  // the embedding keeps the int32 ids, the head the (N, H) input gradient.
  const std::int64_t full_block =
      N * (static_cast<std::int64_t>(sizeof(Param)) * (6 * H + 2 * KV + 3 * F) +
           static_cast<std::int64_t>(sizeof(Acc)) * (2 + c.n_heads));
  const std::int64_t input_only = N * H * static_cast<std::int64_t>(sizeof(Param));
  const std::int64_t ends = N * 4 + N * H * static_cast<std::int64_t>(sizeof(ActGrad));
  struct expect {
    nn::checkpoint_policy cp;
    std::int64_t bytes;
  };
  for (const expect& e : {expect{{}, L * full_block + ends},
                          expect{{activation_checkpointing::full, 1}, L * input_only + ends},
                          expect{{activation_checkpointing::full, 2},
                                 input_only + full_block + ends}}) {  // block 0 of 2
    INFO(nn::to_string(e.cp.mode) << " every " << e.cp.every);
    host_memory_resource mr;
    const kernels::host_context ctx{&mr};
    nn::llama_options opt;
    opt.checkpointing = e.cp;
    nn::llama<P> m(c, opt, ctx);
    m.init_weights(3);
    CHECK(m.record_bytes(B, T) == e.bytes);
    // And it is what the record holds: the forward's bytes still allocated
    // when it returns (inputs and the loss live outside the resource).
    const split s(windows(c.vocab, 4));
    typename nn::llama<P>::record r;
    double loss = poison;
    const std::size_t before = mr.stats().allocated;
    m.forward(s.batch<Param>(), r, Acc(1), &loss);
    CHECK(std::isfinite(loss));
    CHECK(static_cast<std::int64_t>(mr.stats().allocated - before) == e.bytes);
    m.backward(r);
    CHECK(mr.stats().allocated == before);  // backward frees the whole record
  }
}

TEMPLATE_TEST_CASE("micro-batches in flight accumulate the gradients of one at a time",
                   "[nn][records]", precision::fp32, precision::fp64) {
  using P = TestType;
  using Param = typename P::param_type;
  using Acc = typename P::accum_type;
  using model = nn::llama<P>;
  for (std::int64_t k = 1; k <= 4; ++k) {
    INFO("k = " << k << " micro-batches in flight");
    std::vector<split> mbs;
    for (std::int64_t m = 0; m < k; ++m)
      mbs.emplace_back(windows(256, 100 + static_cast<std::uint64_t>(m)));
    const Acc scale = Acc(1) / static_cast<Acc>(k * (B * T - 1));
    model mdl(cfg256());
    mdl.init_weights(5);

    // One at a time: forward m, backward m.
    std::vector<double> loss1(static_cast<std::size_t>(k), poison);
    mdl.zero_grad();
    for (std::int64_t m = 0; m < k; ++m) {
      typename model::record r;
      mdl.forward(mbs[m].template batch<Param>(), r, scale, &loss1[m]);
      mdl.backward(r);
    }
    const auto one = grads_of(mdl);

    // k forwards, then their k backwards, in the given order.
    auto in_flight = [&](bool reverse, std::vector<double>& loss) {
      nn::record_pool<typename model::record> pool(k);
      mdl.zero_grad();
      for (std::int64_t m = 0; m < k; ++m)
        mdl.forward(mbs[m].template batch<Param>(), pool.acquire(m), scale, &loss[m]);
      CHECK(pool.in_flight() == k);
      for (std::int64_t i = 0; i < k; ++i) {
        const std::int64_t m = reverse ? k - 1 - i : i;
        mdl.backward(pool.at(m));
        pool.release(m);
      }
      CHECK(pool.in_flight() == 0);
      CHECK(pool.peak_in_flight() == k);
      return grads_of(mdl);
    };
    std::vector<double> loss2(static_cast<std::size_t>(k), poison), loss3(loss2);
    const auto fifo = in_flight(false, loss2);
    // The same kernels in the same order per gradient element (the head's
    // gradients accumulate in the forwards, the rest in the backwards, both
    // in micro-batch order): the same bits.
    CHECK(same_bits(fifo, one.data()));
    CHECK(every_segment_has_gradients(mdl));
    const auto lifo = in_flight(true, loss3);
    for (std::int64_t m = 0; m < k; ++m) {
      CHECK(std::isfinite(loss1[m]));        // every loss written
      CHECK(same_bits(loss2[m], loss1[m]));  // a forward reads no other micro-batch's state
      CHECK(same_bits(loss3[m], loss1[m]));
    }
    // Reversed backwards only reorder the k <= 4 addends of each block and
    // embedding gradient element: at most (k - 1) u of the sum of their
    // magnitudes, u = 2^-24 (float32) or 2^-53 (float64). Relative to the
    // largest element, with headroom for the GEMMs' blocking: float32 1e-6,
    // float64 1e-12 (measured: 0 for k <= 2, at most 4.4e-8 and 8.3e-17).
    const double tol = sizeof(Param) == 4 ? 1e-6 : 1e-12;
    const double rel = max_rel_diff(lifo, one);
    INFO("reverse order: max |diff| / max |g| = " << rel);
    CHECK(rel <= tol);
  }
}

TEMPLATE_TEST_CASE("two pipeline stages chained compute the whole model's bits", "[nn][stages]",
                   precision::fp32, precision::fp64) {
  using P = TestType;
  using Param = typename P::param_type;
  using Acc = typename P::accum_type;
  using model = nn::llama<P>;
  const auto c = cfg256();
  REQUIRE(c.n_layers == 2);
  model whole(c);
  nn::llama_options oa, ob;
  oa.stage = {0, 1, true, false};   // embedding, block 0
  ob.stage = {1, -1, false, true};  // block 1, head
  model a(c, oa), b(c, ob);
  whole.init_weights(23);
  a.init_weights(23);
  b.init_weights(23);
  // The stages tile the whole layout, each holding only its segments.
  CHECK(a.flat_begin() == 0);
  CHECK(a.first_segment() == -1);
  CHECK(a.last_segment() == 0);
  CHECK(b.first_segment() == 1);
  CHECK(b.last_segment() == 2);
  CHECK(b.flat_begin() == a.flat_size());
  CHECK(a.flat_size() + b.flat_size() == whole.flat_size());
  CHECK(std::memcmp(a.params(), whole.params(), a.flat_size() * sizeof(Param)) == 0);
  CHECK(std::memcmp(b.params(), whole.params() + b.flat_begin(), b.flat_size() * sizeof(Param)) ==
        0);

  const std::vector<split> mbs = {split(windows(c.vocab, 31)), split(windows(c.vocab, 32))};
  const Acc scale = Acc(1) / static_cast<Acc>(2 * (B * T - 1));
  whole.zero_grad();
  a.zero_grad();
  b.zero_grad();
  for (std::size_t m = 0; m < mbs.size(); ++m) {
    INFO("micro-batch " << m);
    double loss_whole = poison, loss_b = poison;
    typename model::record rw, ra, rb;
    whole.forward(mbs[m].template batch<Param>(), rw, scale, &loss_whole);
    whole.backward(rw);

    a.forward({mbs[m].inputs.data(), nullptr, nullptr, B, T}, ra, scale, nullptr);
    REQUIRE(ra.output.numel() == B * T * c.dim);
    b.forward({nullptr, mbs[m].targets.data(), ra.output.data(), B, T}, rb, scale, &loss_b);
    b.backward(rb);
    REQUIRE(rb.grad_input.numel() == B * T * c.dim);
    a.backward(ra, rb.grad_input.data());
    // The stages run the whole model's kernels on the same operands (the
    // boundary hidden states and their gradient are copied, not rounded):
    // the same bits.
    CHECK(std::isfinite(loss_whole));
    CHECK(same_bits(loss_b, loss_whole));
  }
  const auto ga = grads_of(a), gb = grads_of(b);
  CHECK(same_bits(ga, whole.grads()));
  CHECK(same_bits(gb, whole.grads() + b.flat_begin()));
  CHECK(every_segment_has_gradients(whole));  // not a match of zeros
}

TEMPLATE_TEST_CASE("a split backward (B, then W later) adds the full backward's bits",
                   "[nn][stages][zero_bubble]", precision::fp32, precision::fp64) {
  using P = TestType;
  using Param = typename P::param_type;
  using Acc = typename P::accum_type;
  using model = nn::llama<P>;
  const auto c = cfg256();
  const bool checkpointed = GENERATE(false, true);
  INFO("checkpointed " << checkpointed);
  nn::llama_options ow, oa, ob;
  if (checkpointed) ow.checkpointing = nn::checkpoint_policy{activation_checkpointing::full};
  oa = ob = ow;
  oa.stage = {0, 1, true, false};
  ob.stage = {1, -1, false, true};
  model whole(c, ow), a(c, oa), b(c, ob);
  whole.init_weights(29);
  a.init_weights(29);
  b.init_weights(29);
  const std::vector<split> mbs = {split(windows(c.vocab, 41)), split(windows(c.vocab, 42))};
  const Acc scale = Acc(1) / static_cast<Acc>(2 * (B * T - 1));
  whole.zero_grad();
  a.zero_grad();
  b.zero_grad();
  for (std::size_t m = 0; m < mbs.size(); ++m) {
    typename model::record rw;
    double loss = poison;
    whole.forward(mbs[m].template batch<Param>(), rw, scale, &loss);
    whole.backward(rw);
  }
  // Both micro-batches' forwards, then both B passes, then both W passes
  // (ZB-H1's order within a stage): records stay in flight between B and W.
  typename model::record ra[2], rb[2];
  double loss_b[2] = {poison, poison};
  for (std::size_t m = 0; m < 2; ++m) {
    a.forward({mbs[m].inputs.data(), nullptr, nullptr, B, T}, ra[m], scale, nullptr);
    b.forward({nullptr, mbs[m].targets.data(), ra[m].output.data(), B, T}, rb[m], scale,
              &loss_b[m]);
  }
  for (std::size_t m = 0; m < 2; ++m) {
    b.backward_input(rb[m]);
    CHECK(rb[m].weights_pending);
    CHECK_THROWS_AS(b.backward(rb[m]), error);  // B ran: no full backward of it
    a.backward_input(ra[m], rb[m].grad_input.data());
    REQUIRE(ra[m].grad_embedding.numel() == B * T * c.dim);
  }
  // No weight gradient of a block or the embedding yet: only the head's
  // (fused in its forward) and the norm gains' (in B).
  const auto ga_b = grads_of(a);
  const auto& l = whole.layout();
  const auto& wq = l.at("blocks.0.attn.wq");
  const auto& emb = l.at("embedding");
  CHECK(std::all_of(ga_b.begin() + wq.offset, ga_b.begin() + wq.offset + wq.numel,
                    [](auto v) { return v == 0; }));
  CHECK(std::all_of(ga_b.begin() + emb.offset, ga_b.begin() + emb.offset + emb.numel,
                    [](auto v) { return v == 0; }));
  for (std::size_t m = 0; m < 2; ++m) {
    b.backward_weight(rb[m]);
    a.backward_weight(ra[m]);
    CHECK(!ra[m].weights_pending);
    CHECK(ra[m].blocks.empty());
    CHECK_THROWS_AS(a.backward_weight(ra[m]), error);
  }
  CHECK(same_bits(grads_of(a), whole.grads()));
  CHECK(same_bits(grads_of(b), whole.grads() + b.flat_begin()));
  CHECK(every_segment_has_gradients(whole));

  // Evaluation through the stages: forward_hidden then forward_loss.
  const auto& mb = mbs[0];
  double lw = poison, ls = poison;
  whole.forward_loss(mb.template batch<Param>(), &lw);
  auto h = a.forward_hidden({mb.inputs.data(), nullptr, nullptr, B, T});
  b.forward_loss({nullptr, mb.targets.data(), h.data(), B, T}, &ls);
  CHECK(same_bits(ls, lw));
  CHECK_THROWS_AS(a.forward_loss(mb.template batch<Param>(), &ls), config_error);
  CHECK_THROWS_AS(b.forward_hidden({nullptr, nullptr, h.data(), B, T}), config_error);
}

TEST_CASE("bf16 activation gradients keep the forward and move gradients by bf16 rounding",
          "[nn][precision]") {
  using Pf = precision::bf16_mixed;
  using Pb = precision::bf16_mixed_bf16_grads;
  const auto c = cfg256();
  nn::llama<Pf> mf(c);
  nn::llama<Pb> mb(c);
  mf.init_weights(41);
  mb.init_weights(41);
  const std::int64_t N = B * T;
  // The head's record is the (N, H) input gradient: bf16 instead of float32.
  CHECK(mf.record_bytes(B, T) - mb.record_bytes(B, T) == N * c.dim * 2);
  const auto w0 = windows(c.vocab, 51), w1 = windows(c.vocab, 52);
  const float scale = 1.0f / static_cast<float>(2 * (N - 1));
  mf.zero_grad();
  mb.zero_grad();
  double lf = 0, lb = 0;
  for (const auto* w : {&w0, &w1}) {
    lf += mf.forward_backward(w->data(), B, T, scale).sum;
    lb += mb.forward_backward(w->data(), B, T, scale).sum;
  }
  // The forward (bf16 weights and activations, float32 accumulation) is
  // the same code on the same values: the loss is the same bits.
  CHECK(same_bits(lb, lf));

  // Gradients, per tensor: ||g_bf16grads - g_bf16_mixed|| / ||g_bf16_mixed||.
  // bf16 activation gradients round to u = 2^-9 ~ 2e-3 relative wherever
  // one is stored: the head's input gradient, and in each block the residual
  // stream (also at each of its two accumulations), the norm, attention,
  // q/k/v and MLP gradients: ~10 roundings on a path through a block, ~25
  // from the loss to the embedding. They are independent and of either
  // sign, so a parameter gradient (a float32 sum over N = 26 tokens of
  // products with those) moves by ~sqrt(25) u ~ 1e-2 relative (measured:
  // 6.3e-3 in the worst tensor); bound at 5e-2 normwise per tensor. A wrong
  // gradient (a missing term, a wrong sign) moves a tensor's gradient by O(1).
  double worst = 0;
  for (const auto& e : mf.layout().entries()) {
    double d2 = 0, r2 = 0;
    for (std::int64_t i = e.offset; i < e.offset + e.numel; ++i) {
      const double a = mb.grads()[i], r = mf.grads()[i];
      d2 += (a - r) * (a - r);
      r2 += r * r;
    }
    REQUIRE(r2 > 0);
    const double rel = std::sqrt(d2 / r2);
    worst = std::max(worst, rel);
    INFO(e.name << ": normwise relative difference " << rel);
    CHECK(rel < 5e-2);
  }
  // The policy does change the backward (bf16 rounding is visible).
  CHECK(worst > 0);
}

}  // namespace test_nn_llama_records
