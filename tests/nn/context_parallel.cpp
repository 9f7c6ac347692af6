// Tests of context-parallel attention (include/tessera/nn/context_parallel.hpp)
// on thread ranks (local_world): ring attention and Ulysses over cp 1, 2, 3
// and 4 ranks, causal and with packed documents (crossing chunk edges,
// one-token documents), grouped-query heads (nkv 4, 3, 2, 1 under nh 12:
// Ulysses splitting and replicating key/value heads), B 2, chunks of 24, 12,
// 8 and 6 tokens against attention tiles of 5 and 7. The reference is
// attention written out in float64 in the suite (cp_suite::naive: every
// score, a plain softmax, the masks by position), not the library's
// kernels: every rank's out, lse, dq, dk, dv equal it within 1e-12 in
// float64 (and Ulysses gives the single-rank kernels' bits where whole
// key/value groups stay on one rank), bf16 storage within its rounding.
// Two runs give the same bits. The communicator's byte counters and the
// context resource's peak equal the closed forms of
// cp_suite::expected_bytes (plus the kernels' own scratch), and so does
// cp_attention_bytes. Sizes that do not fit are refused before any traffic,
// with the numbers. The body is tests/nn/context_parallel_suite.hpp, which
// tests/mpi/context_parallel.cpp runs under mpirun.
#include "tessera/nn/context_parallel.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "context_parallel_suite.hpp"
#include "tessera/comm/local.hpp"

namespace test_nn_context_parallel {

using namespace tessera;
using nn::cp_kind;

namespace {

comm::comm_options quick() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(30);
  return o;
}

// Every rank's result of one layout, in rank order.
template <class T, class G>
std::vector<cp_suite::rank_result> run(int cp, const cp_suite::problem& p,
                                       const cp_suite::reference& want, cp_kind kind,
                                       kernels::attention_tiles tiles,
                                       const cp_suite::reference* bits_of = nullptr) {
  std::vector<cp_suite::rank_result> out(static_cast<std::size_t>(cp));
  std::mutex mu;
  comm::local_world::run(
      cp,
      [&](comm::local_communicator& c) {
        auto r = cp_suite::run_rank<T, G>(c, p, want, kind, tiles, bits_of);
        std::lock_guard lk(mu);
        out[static_cast<std::size_t>(c.rank())] = r;
      },
      quick());
  return out;
}

// Ulysses runs when cp divides nh and one of cp, nkv divides the other.
bool ulysses_fits(int cp, std::int64_t nh, std::int64_t nkv) {
  return nh % cp == 0 && (nkv % cp == 0 || cp % nkv == 0);
}

// The bytes every rank sent and held are the closed forms of
// cp_suite::expected_bytes, and cp_attention_bytes says the same.
void check_bytes(const cp_suite::rank_result& r) {
  INFO("rank " << r.rank);
  const cp_suite::byte_figures& e = r.expected;
  CHECK(r.forward_sent == e.forward_sent);
  CHECK(r.backward_sent == e.backward_sent);
  CHECK(r.forward_peak == e.forward_workspace + r.forward_scratch);
  CHECK(r.backward_peak == e.backward_workspace + r.backward_scratch);
  CHECK(r.predicted.forward_sent() == e.forward_sent);
  CHECK(r.predicted.backward_sent() == e.backward_sent);
  CHECK(r.predicted.forward_workspace() == e.forward_workspace);
  CHECK(r.predicted.backward_workspace() == e.backward_workspace);
}

}  // namespace

TEST_CASE("context-parallel attention equals naive float64 attention", "[nn][context_parallel]") {
  const kernels::attention_tiles tiles{5, 7};
  double worst = 0;
  std::set<std::pair<int, bool>> ulysses_ran;  // (cp, key/value heads replicated)
  for (const bool documents : {false, true})
    for (const std::int64_t nkv : {4, 3, 2, 1}) {
      const cp_suite::problem p = cp_suite::make_problem(12, nkv, documents);
      const cp_suite::reference want = cp_suite::naive(p);
      const cp_suite::reference one = cp_suite::single_rank<double, double>(p, tiles);
      {
        INFO("single-rank kernels, nkv=" << nkv << " documents " << documents);
        CHECK(cp_suite::worst(one.out, want.out) <= 1e-12);  // the baseline agrees
        CHECK(cp_suite::worst(one.dk, want.dk) <= 1e-12);
      }
      for (const cp_kind kind : {cp_kind::ring, cp_kind::ulysses})
        for (const int cp : {1, 2, 3, 4}) {
          if (kind == cp_kind::ulysses && !ulysses_fits(cp, p.nh, nkv)) continue;  // refused
          if (kind == cp_kind::ulysses) ulysses_ran.insert({cp, nkv % cp != 0});
          const auto results = run<double, double>(cp, p, want, kind, tiles, &one);
          // Ulysses keeps whole heads: its outputs are the single-rank
          // kernels' bits unless a key/value head's query heads are split
          // over ranks (replicated heads: dk, dv summed in another order).
          const bool bits = kind == cp_kind::ulysses && nkv % cp == 0;
          for (const auto& r : results) {
            INFO(nn::to_string(kind) << " cp=" << cp << " nkv=" << nkv << " documents " << documents
                                     << " rank " << r.rank);
            // float64: blocks and heads summed in another order than the
            // reference's (1e-12, the house tolerance, DESIGN.md principle 6).
            CHECK(r.out <= 1e-12);
            CHECK(r.lse <= 1e-12);
            CHECK(r.dq <= 1e-12);
            CHECK(r.dk <= 1e-12);
            CHECK(r.dv <= 1e-12);
            if (bits) CHECK(r.bits);
            check_bytes(r);
            worst = std::max({worst, r.out, r.lse, r.dq, r.dk, r.dv});
          }
        }
    }
  // Ulysses ran at every cp with key/value heads split and replicated.
  for (const int cp : {2, 3, 4})
    for (const bool replicated : {false, true}) {
      INFO("ulysses cp=" << cp << " replicated " << replicated);
      CHECK(ulysses_ran.count({cp, replicated}) == 1);
    }
  UNSCOPED_INFO("worst difference from the naive reference: " << worst);
  CHECK(worst <= 1e-12);  // the worst over every layout (-s prints it)
}

TEST_CASE("context-parallel attention with bf16 storage stays within bf16 rounding",
          "[nn][context_parallel]") {
  // Against naive float64 attention of the same bf16-rounded inputs (and
  // dout), absolute differences: a bf16 output (|out| < 1) is float
  // arithmetic rounded once, half an ulp (2^-9 relative, under 4e-3);
  // lse carries only float summation error (under 1e-5); float gradients
  // inherit the output's rounding through D = rowsum(dout out) (under
  // 2e-3; 1.3e-3 measured); bf16 gradients are rounded once more, half an
  // ulp of their own size (2e-3 plus testing::bf16_tol = 2^-8 of the
  // tensor's largest magnitude: dv, summed over the 12 query heads of
  // nkv 1, reaches 7, and 1.5e-2 is measured there). The single-rank bf16 kernels
  // meet the same bounds (checked alongside): the split costs no accuracy
  // class.
  const kernels::attention_tiles tiles{5, 7};
  for (const std::int64_t nkv : {2, 1}) {
    cp_suite::problem p = cp_suite::make_problem(12, nkv, true);
    for (auto* x : {&p.q, &p.k, &p.v}) *x = testing::to_double(cp_suite::cast_all<bf16>(*x));
    auto layouts = [&]<class G>() {
      const bool g16 = std::is_same_v<G, bf16>;
      cp_suite::problem pg = p;  // dout as the gradient type holds it
      pg.dout = testing::to_double(cp_suite::cast_all<G>(p.dout));
      const cp_suite::reference want = cp_suite::naive(pg);
      const double out_tol = 4e-3, lse_tol = 1e-5;
      auto grad_tol = [&](const std::vector<double>& x) {
        double big = 0;
        for (const double e : x) big = std::max(big, std::abs(e));
        return 2e-3 + (g16 ? testing::bf16_tol * big : 0.0);
      };
      const double dq_tol = grad_tol(want.dq), dk_tol = grad_tol(want.dk),
                   dv_tol = grad_tol(want.dv);
      const cp_suite::reference one = cp_suite::single_rank<bf16, G>(pg, tiles);
      CHECK(cp_suite::worst(one.out, want.out) <= out_tol);
      CHECK(cp_suite::worst(one.lse, want.lse) <= lse_tol);
      CHECK(cp_suite::worst(one.dq, want.dq) <= dq_tol);
      CHECK(cp_suite::worst(one.dk, want.dk) <= dk_tol);
      CHECK(cp_suite::worst(one.dv, want.dv) <= dv_tol);
      for (const cp_kind kind : {cp_kind::ring, cp_kind::ulysses})
        for (const int cp : {2, 3, 4}) {
          if (kind == cp_kind::ulysses && !ulysses_fits(cp, pg.nh, nkv)) continue;
          for (const auto& r : run<bf16, G>(cp, pg, want, kind, tiles)) {
            INFO(nn::to_string(kind) << " cp=" << cp << " nkv=" << nkv << " G "
                                     << (g16 ? "bf16" : "float") << " rank " << r.rank);
            CHECK(r.out <= out_tol);
            CHECK(r.lse <= lse_tol);
            CHECK(r.dq <= dq_tol);
            CHECK(r.dk <= dk_tol);
            CHECK(r.dv <= dv_tol);
            check_bytes(r);
            // 16-bit tensors travel as float on this host communicator.
            CHECK(r.predicted.param_wire == 4);
          }
        }
    };
    layouts.template operator()<float>();
    layouts.template operator()<bf16>();
  }
}

TEST_CASE("context-parallel attention gives the same bits on every run", "[nn][context_parallel]") {
  // Every output tensor of every rank, twice, bit for bit: float64 and
  // bf16 with bf16 gradients, both kinds, cp 3 and 4, documents, key/value
  // heads replicated (Ulysses sums the replicas; the ring merges blocks).
  const kernels::attention_tiles tiles{5, 7};
  const cp_suite::problem p = cp_suite::make_problem(12, 1, true);
  const cp_suite::reference want = cp_suite::naive(p);
  for (const cp_kind kind : {cp_kind::ring, cp_kind::ulysses})
    for (const int cp : {3, 4}) {
      INFO(nn::to_string(kind) << " cp=" << cp);
      const auto a = run<double, double>(cp, p, want, kind, tiles);
      const auto b = run<double, double>(cp, p, want, kind, tiles);
      const auto a16 = run<bf16, bf16>(cp, p, want, kind, tiles);
      const auto b16 = run<bf16, bf16>(cp, p, want, kind, tiles);
      for (std::size_t r = 0; r < a.size(); ++r) {
        INFO("rank " << r);
        CHECK(cp_suite::same(a[r].got, b[r].got));
        CHECK(cp_suite::same(a16[r].got, b16[r].got));
        CHECK(!a[r].got.dq.empty());
      }
    }
}

TEST_CASE("the documented use: cut a rank's tokens, attend over the group, put them back",
          "[nn][context_parallel]") {
  // docs/context_parallel.md shows the region below: whole sequences cut
  // to each rank's tokens, forward and backward over a cp group of 4, the
  // outputs put back together equal to the naive reference.
  const cp_suite::problem p = cp_suite::make_problem(12, 4, true);
  const cp_suite::reference want = cp_suite::naive(p);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> whole_out(p.q.size(), nan), whole_dk(p.k.size(), nan);
  std::mutex mu;
  comm::local_world::run(
      4,
      [&](comm::local_communicator& group) {
        const kernels::host_context ctx{};
        const std::int64_t B = p.B, S = p.S, nh = p.nh, nkv = p.nkv, hd = p.hd;
        // example-begin cp_attention
        // Whole sequences (B, S, heads, hd) in; this rank's L = S / cp tokens
        // of each (head-tail: chunks r and 2 cp - 1 - r of 2 cp) cut out.
        const nn::context_parallel_attention<comm::local_communicator> attention{&group,
                                                                                 cp_kind::ring};
        const cp_shard s = attention.shard(S);
        const std::int64_t L = s.tokens();
        std::vector<double> q(B * L * nh * hd), k(B * L * nkv * hd), v(B * L * nkv * hd),
            dout(B * L * nh * hd);
        std::vector<std::int32_t> doc_start(B * L);  // global positions
        nn::shard_tokens(ctx, s, q.data(), p.q.data(), B, nh * hd);
        nn::shard_tokens(ctx, s, k.data(), p.k.data(), B, nkv * hd);
        nn::shard_tokens(ctx, s, v.data(), p.v.data(), B, nkv * hd);
        nn::shard_tokens(ctx, s, dout.data(), p.dout.data(), B, nh * hd);
        nn::shard_tokens(ctx, s, doc_start.data(), p.ds.data(), B, std::int64_t{1});
        const kernels::attention_mask mask{doc_start.data()};

        // Every rank of the group calls forward, then backward, with the same sizes.
        std::vector<double> out(B * L * nh * hd), lse(B * nh * L);
        attention.forward(ctx, out.data(), lse.data(), q.data(), k.data(), v.data(), B, S, nh, nkv,
                          hd, mask);
        std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
        attention.backward(ctx, dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                           v.data(), out.data(), lse.data(), B, S, nh, nkv, hd, mask);
        // example-end cp_attention
        std::lock_guard lk(mu);
        nn::unshard_tokens(ctx, s, whole_out.data(), out.data(), B, nh * hd);
        nn::unshard_tokens(ctx, s, whole_dk.data(), dk.data(), B, nkv * hd);
      },
      quick());
  CHECK(cp_suite::worst(whole_out, want.out) <= 1e-12);  // every row written, by its rank
  CHECK(cp_suite::worst(whole_dk, want.dk) <= 1e-12);
}

TEST_CASE("shard_tokens and unshard_tokens cut a rank's tokens out and back",
          "[nn][context_parallel]") {
  // (outer 2, T 24, width 3) over cp 3: chunks of 4; rank 0 holds chunks 0
  // and 5, rank 1 1 and 4, rank 2 2 and 3.
  const std::int64_t T = 24;
  const kernels::host_context ctx{};
  std::vector<double> whole(2 * T * 3), back(whole.size(), -1.0);
  for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<double>(i);
  for (int r = 0; r < 3; ++r) {
    const cp_shard s = cp_shard::of(T, 3, r);
    std::vector<double> local(static_cast<std::size_t>(2 * s.tokens() * 3));
    nn::shard_tokens(ctx, s, local.data(), whole.data(), 2, 3);
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t t = 0; t < s.tokens(); ++t)
        for (std::int64_t w = 0; w < 3; ++w)
          CHECK(local[(b * s.tokens() + t) * 3 + w] == whole[(b * T + s.position(t)) * 3 + w]);
    nn::unshard_tokens(ctx, s, back.data(), local.data(), 2, 3);
  }
  CHECK(back == whole);  // every row written back, by exactly its rank
}

TEST_CASE("context parallelism refuses sizes that do not fit, before any traffic, with the numbers",
          "[nn][context_parallel]") {
  using Catch::Matchers::Contains;
  const nn::context_parallel_attention<comm::local_communicator> none{};
  CHECK_THROWS_WITH(none.size(), Contains("no cp group"));

  // Every rank throws the same config_error, forward and backward alike,
  // and none sends a byte: each check runs before the first exchange.
  struct refusal {
    cp_kind kind;
    std::int64_t B, S, nh, nkv, hd;
    kernels::attention_tiles tiles;
    std::vector<std::string> words;
  };
  const kernels::attention_tiles ok{3, 5};
  const std::vector<refusal> cases = {
      // Head-tail: 2 cp must divide T.
      {cp_kind::ring, 1, 30, 4, 2, 4, ok, {"T=30", "2*cp=8", "cp=4"}},
      {cp_kind::ulysses, 1, 30, 4, 2, 4, ok, {"T=30", "cp=4"}},
      {cp_kind::ring, 1, 0, 4, 2, 4, ok, {"T=0"}},
      // Ulysses' head split.
      {cp_kind::ulysses, 1, 32, 6, 2, 4, ok, {"cp=4 does not divide nh=6"}},
      {cp_kind::ulysses, 1, 32, 12, 6, 4, ok, {"cp=4", "nkv=6", "divides the other"}},
      // The kernels' own preconditions, as each kind would call them.
      {cp_kind::ring, 1, 32, 6, 4, 4, ok, {"nkv=4", "does not divide nh=6"}},
      {cp_kind::ulysses, 1, 32, 6, 4, 4, ok, {"nkv=4", "does not divide nh=6"}},
      {cp_kind::ring, 1, 32, 4, 2, 4, {0, 5}, {"tile sizes must be >= 1", "q=0"}},
      {cp_kind::ulysses, 1, 32, 4, 2, 4, {3, 0}, {"tile sizes must be >= 1", "k=0"}},
      {cp_kind::ring, 0, 32, 4, 2, 4, ok, {"every size must be >= 1", "B=0"}},
      {cp_kind::ulysses, 1, 32, 4, 2, 0, ok, {"every size must be >= 1", "hd=0"}},
  };
  for (const refusal& rc : cases) {
    std::vector<std::string> what(4);
    std::vector<std::uint64_t> sent(4, 1);
    comm::local_world::run(
        4,
        [&](comm::local_communicator& c) {
          const nn::context_parallel_attention<comm::local_communicator> cpa{&c, rc.kind};
          const std::int64_t L = std::max<std::int64_t>(rc.S / 4, 1);
          const std::int64_t B = std::max<std::int64_t>(rc.B, 1),
                             hd = std::max<std::int64_t>(rc.hd, 1);
          std::vector<double> q(B * L * rc.nh * hd, 0.5), kv(B * L * rc.nkv * hd, 0.5),
              out(q.size()), lse(B * rc.nh * L);
          const kernels::host_context ctx{&host::default_resource(), 0, rc.tiles};
          std::string& mine = what[static_cast<std::size_t>(c.rank())];
          try {
            cpa.forward(ctx, out.data(), lse.data(), q.data(), kv.data(), kv.data(), rc.B, rc.S,
                        rc.nh, rc.nkv, rc.hd);
            mine = "forward did not throw";
          } catch (const config_error& e) {
            mine = e.what();
          }
          std::vector<double> dq(q.size()), dkv(kv.size());
          try {
            cpa.backward(ctx, dq.data(), dkv.data(), dkv.data(), q.data(), q.data(), kv.data(),
                         kv.data(), out.data(), lse.data(), rc.B, rc.S, rc.nh, rc.nkv, rc.hd);
            mine += " | backward did not throw";
          } catch (const config_error& e) {
            if (mine != e.what()) mine += " | backward: " + std::string(e.what());
          }
          sent[static_cast<std::size_t>(c.rank())] = c.bytes_sent();
        },
        quick());
    for (int r = 0; r < 4; ++r) {
      INFO(nn::to_string(rc.kind) << " B=" << rc.B << " S=" << rc.S << " nh=" << rc.nh << " nkv="
                                  << rc.nkv << " hd=" << rc.hd << " rank " << r << ": " << what[r]);
      for (const auto& w : rc.words) CHECK(what[r].find(w) != std::string::npos);
      CHECK(what[r].find('\n') == std::string::npos);   // one line
      CHECK(what[r].find(" | ") == std::string::npos);  // backward refuses alike
      CHECK(what[r] == what[0]);                        // every rank alike
      CHECK(sent[r] == 0);
    }
  }
}

TEST_CASE("cp_attention_bytes refuses sizes the layer would refuse, with the numbers",
          "[nn][context_parallel]") {
  using Catch::Matchers::Contains;
  auto bytes = [](cp_kind kind, std::int64_t cp, std::int64_t S, std::int64_t nh,
                  std::int64_t nkv) {
    nn::cp_attention_bytes b;
    b.kind = kind;
    b.cp = cp;
    b.B = 2;
    b.S = S;
    b.nh = nh;
    b.nkv = nkv;
    b.hd = 8;
    return b;
  };
  // Each figure refuses, not only the first.
  const nn::cp_attention_bytes odd = bytes(cp_kind::ring, 4, 30, 4, 2);
  for (auto figure :
       {&nn::cp_attention_bytes::forward_workspace, &nn::cp_attention_bytes::backward_workspace,
        &nn::cp_attention_bytes::forward_sent, &nn::cp_attention_bytes::backward_sent}) {
    CHECK_THROWS_AS((odd.*figure)(), config_error);
    CHECK_THROWS_WITH((odd.*figure)(), Contains("S=30") && Contains("2*cp=8") && Contains("cp=4"));
  }
  CHECK_THROWS_WITH(bytes(cp_kind::ring, 0, 32, 4, 2).forward_sent(), Contains("cp=0"));
  CHECK_THROWS_WITH(bytes(cp_kind::ring, -2, 32, 4, 2).forward_sent(), Contains("cp=-2"));
  CHECK_THROWS_WITH(bytes(cp_kind::ulysses, 4, 32, 6, 2).forward_sent(),
                    Contains("cp=4 does not divide nh=6"));
  CHECK_THROWS_WITH(bytes(cp_kind::ulysses, 4, 32, 12, 6).backward_sent(),
                    Contains("cp=4") && Contains("nkv=6"));
  CHECK_THROWS_WITH(bytes(cp_kind::ring, 2, 32, 6, 4).forward_workspace(),
                    Contains("nkv=4 does not divide nh=6"));
  CHECK_THROWS_WITH(bytes(cp_kind::ring, 2, 0, 4, 2).forward_sent(), Contains("S=0"));
  // The same sizes under the ring are fine: only Ulysses splits heads.
  CHECK_NOTHROW(bytes(cp_kind::ring, 4, 32, 6, 2).forward_sent());
  CHECK_NOTHROW(bytes(cp_kind::ulysses, 4, 32, 4, 1).backward_workspace());
}

}  // namespace test_nn_context_parallel
