// Tests include/tessera/parallel/pipeline_schedule.hpp and pipeline_sim.hpp,
// for every schedule and K = 1..8 stages, M = 1..3K micro-batches, V = 1..3
// virtual stages (V > 1 only for interleaved; the combinations
// check_pipeline refuses are checked to be refused, with their messages):
//
// - each rank's list holds exactly one forward and one backward (or one B
//   and one W) per (micro-batch, chunk), runs each chunk's backwards in
//   micro-batch order, keeps the send/receive contract of the header and
//   ends with reduce_gradients, clip, optimizer_step;
// - every send matches exactly one receive, the simulation never
//   deadlocks (also with a message latency), and in simulated time the
//   forward of (m, v) follows the forward of (m, v - 1) and precedes its own
//   backward, which follows the backward of (m, v + 1);
// - bubbles with F = 1, B + W = 2: gpipe and 1f1b (K-1)/(M+K-1),
//   interleaved (K-1)/(V M+K-1); ZB-H1 with F = B = W = 1 idles K-1 per rank
//   when M >= K (a third of 1F1B's 3(K-1)), 2K-1-M when M < K;
// - peak in flight: gpipe M, 1f1b and zb1 min(K, M) on stage 0, and never
//   above K on any stage;
// - interleaved with V = 1 is 1f1b's list; with K = 1, 1f1b and zb1 are
//   forward m, backward m (zb1: F, B, W), gpipe is no_pipeline(M, M);
// - the simulator names the ranks of a deadlock and refuses unmatched
//   messages;
// - under the rendezvous transport (NCCL: a send waits for its receive,
//   each message group issued whole, messages between two ranks matched in
//   order) every schedule completes, gpipe, 1f1b and interleaved in the
//   buffered step time; crossing sends deadlock there, interleaved without
//   its per-step groups deadlocks, and out-of-order messages are refused.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <tessera/parallel/pipeline_schedule.hpp>
#include <tessera/parallel/pipeline_sim.hpp>

namespace test_parallel_pipeline_schedule {

using namespace tessera;
using namespace tessera::parallel;
using Catch::Matchers::Contains;

namespace {

constexpr schedule_kind all_kinds[] = {schedule_kind::gpipe, schedule_kind::one_f_one_b,
                                       schedule_kind::interleaved, schedule_kind::zero_bubble_h1};

// The simulated times are sums of small dyadic or 1/V multiples; 1e-12
// absorbs the rounding of the 1/3 chunk costs over at most ~150 additions.
constexpr double eps = 1e-12;

bool refused(schedule_kind kind, pipeline_shape s) {
  if (s.virtual_stages > 1 && kind != schedule_kind::interleaved) return true;
  return kind == schedule_kind::interleaved && (s.stages < 2 || s.micro_batches % s.stages != 0);
}

// Calls body(kind, shape) for every accepted combination in the test's
// range, and checks the refused ones are refused with their message.
template <class Body>
void for_each_shape(Body body) {
  for (schedule_kind kind : all_kinds)
    for (int K = 1; K <= 8; ++K)
      for (std::int64_t M = 1; M <= 3 * K; ++M)
        for (int V = 1; V <= 3; ++V) {
          const pipeline_shape s{K, M, V};
          INFO(to_string(kind) << " K=" << K << " M=" << M << " V=" << V);
          if (!refused(kind, s)) {
            REQUIRE_NOTHROW(check_pipeline(kind, s));
            body(kind, s);
            continue;
          }
          std::string why;
          if (V > 1 && kind != schedule_kind::interleaved)
            why = "virtual stages V=" + std::to_string(V) + " need the interleaved schedule";
          else if (K < 2)
            why = "interleaved needs pp >= 2 stages, got pp=1";
          else
            why = "interleaved needs the micro-batch count M=" + std::to_string(M) +
                  " to be a multiple of pp=" + std::to_string(K);
          REQUIRE_THROWS_AS(check_pipeline(kind, s), config_error);
          REQUIRE_THROWS_WITH(check_pipeline(kind, s), Contains(why));
          REQUIRE_THROWS_WITH(make_schedule(kind, 0, s), Contains(why));
        }
}

std::vector<std::vector<action>> all_lists(schedule_kind kind, pipeline_shape s) {
  std::vector<std::vector<action>> lists;
  for (int k = 0; k < s.stages; ++k) lists.push_back(make_schedule(kind, k, s));
  return lists;
}

bool is_split(schedule_kind kind) {
  return kind == schedule_kind::zero_bubble_h1;
}

// The compute actions of a list, in order.
std::vector<action> compute_order(const std::vector<action>& list) {
  std::vector<action> out;
  for (const action& a : list)
    if (a.kind == action_kind::forward || a.kind == action_kind::backward ||
        a.kind == action_kind::backward_input || a.kind == action_kind::backward_weight)
      out.push_back(a);
  return out;
}

void check_list(schedule_kind kind, pipeline_shape s, int k, const std::vector<action>& list) {
  const int K = s.stages, V = s.virtual_stages, KV = K * V;
  const std::int64_t M = s.micro_batches;
  INFO("rank " << k);
  // Ends with the step's three actions, and has them nowhere else.
  REQUIRE(list.size() >= 3);
  const std::size_t n = list.size();
  CHECK(list[n - 3] == action{action_kind::reduce_gradients, -1, 0});
  CHECK(list[n - 2] == action{action_kind::clip, -1, 0});
  CHECK(list[n - 1] == action{action_kind::optimizer_step, -1, 0});
  // One forward and one backward (or B and W) per (m, c); chunk backwards
  // (B's, W's) in micro-batch order.
  std::map<std::tuple<int, std::int64_t, int>, int> count;  // (kind, m, c)
  std::vector<std::int64_t> last_backward(static_cast<std::size_t>(V), -1);
  std::vector<std::int64_t> last_weight(static_cast<std::size_t>(V), -1);
  for (std::size_t i = 0; i + 3 < n; ++i) {
    const action& a = list[i];
    REQUIRE(a.kind != action_kind::reduce_gradients);
    REQUIRE(a.kind != action_kind::clip);
    REQUIRE(a.kind != action_kind::optimizer_step);
    REQUIRE(a.micro_batch >= 0);
    REQUIRE(a.micro_batch < M);
    REQUIRE(a.chunk >= 0);
    REQUIRE(a.chunk < V);
    ++count[{static_cast<int>(a.kind), a.micro_batch, a.chunk}];
    const int v = a.chunk * K + k;
    const auto c = static_cast<std::size_t>(a.chunk);
    // The receive of a compute comes before it and its send after it, with
    // only messages between, or, in interleaved's per-step groups (V > 1),
    // also the step's other compute.
    const int between = kind == schedule_kind::interleaved && V > 1 ? 1 : 0;
    auto computes_between = [&](std::size_t lo, std::size_t hi) {
      int c = 0;
      for (std::size_t j = lo + 1; j < hi; ++j) c += !is_message(list[j].kind);
      return c;
    };
    auto prev_is = [&](action_kind want) {
      for (std::size_t j = i; j-- > 0;)
        if (list[j] == action{want, a.micro_batch, a.chunk})
          return computes_between(j, i) <= between;
      return false;
    };
    auto next_is = [&](action_kind want) {
      for (std::size_t j = i + 1; j < n; ++j)
        if (list[j] == action{want, a.micro_batch, a.chunk})
          return computes_between(i, j) <= between;
      return false;
    };
    switch (a.kind) {
      case action_kind::forward:
        CHECK(prev_is(action_kind::recv_forward) == (v > 0));
        CHECK(next_is(action_kind::send_forward) == (v < KV - 1));
        break;
      case action_kind::backward:
      case action_kind::backward_input:
        CHECK(prev_is(action_kind::recv_backward) == (v < KV - 1));
        CHECK(next_is(action_kind::send_backward) == (v > 0));
        CHECK(a.micro_batch > last_backward[c]);
        last_backward[c] = a.micro_batch;
        break;
      case action_kind::backward_weight:
        CHECK(a.micro_batch > last_weight[c]);
        last_weight[c] = a.micro_batch;
        break;
      case action_kind::recv_forward:
        CHECK(next_is(action_kind::forward));
        break;
      case action_kind::send_forward:
        CHECK(prev_is(action_kind::forward));
        break;
      case action_kind::recv_backward:
        CHECK((next_is(action_kind::backward) || next_is(action_kind::backward_input)));
        break;
      case action_kind::send_backward:
        CHECK((prev_is(action_kind::backward) || prev_is(action_kind::backward_input)));
        break;
      default:
        break;
    }
  }
  const int n_kinds = is_split(kind) ? 2 : 1;
  std::size_t compute = 0;
  for (std::int64_t m = 0; m < M; ++m)
    for (int c = 0; c < V; ++c) {
      auto get = [&](action_kind x) {
        auto it = count.find({static_cast<int>(x), m, c});
        return it == count.end() ? 0 : it->second;
      };
      INFO("micro-batch " << m << " chunk " << c);
      CHECK(get(action_kind::forward) == 1);
      if (is_split(kind)) {
        CHECK(get(action_kind::backward) == 0);
        CHECK(get(action_kind::backward_input) == 1);
        CHECK(get(action_kind::backward_weight) == 1);
      } else {
        CHECK(get(action_kind::backward) == 1);
        CHECK(get(action_kind::backward_input) == 0);
        CHECK(get(action_kind::backward_weight) == 0);
      }
      compute += static_cast<std::size_t>(1 + n_kinds);
    }
  CHECK(compute_order(list).size() == compute);
}

// Every send matches exactly one receive: (direction, m, receiving
// virtual stage) is sent once and received once, across all ranks.
void check_messages(pipeline_shape s, const std::vector<std::vector<action>>& lists) {
  const int K = s.stages;
  std::map<std::tuple<int, std::int64_t, int>, std::pair<int, int>> msgs;  // -> (sends, recvs)
  for (int k = 0; k < K; ++k)
    for (const action& a : lists[static_cast<std::size_t>(k)]) {
      const int v = a.chunk * K + k;
      if (a.kind == action_kind::send_forward) ++msgs[{0, a.micro_batch, v + 1}].first;
      if (a.kind == action_kind::recv_forward) ++msgs[{0, a.micro_batch, v}].second;
      if (a.kind == action_kind::send_backward) ++msgs[{1, a.micro_batch, v - 1}].first;
      if (a.kind == action_kind::recv_backward) ++msgs[{1, a.micro_batch, v}].second;
    }
  // One forward and one backward message per micro-batch and boundary.
  CHECK(msgs.size() == static_cast<std::size_t>(2 * s.micro_batches * (K * s.virtual_stages - 1)));
  for (const auto& [key, sr] : msgs) {
    INFO("direction " << std::get<0>(key) << " micro-batch " << std::get<1>(key)
                      << " to virtual stage " << std::get<2>(key));
    CHECK(sr.first == 1);
    CHECK(sr.second == 1);
  }
}

// In simulated time: F(m, v-1) ends (plus the hop) before F(m, v) starts,
// F(m, v) ends before its backward starts, B(m, v+1) ends (plus the hop)
// before B(m, v) starts, B before W.
void check_times(pipeline_shape s, const simulation& r, double hop) {
  const int K = s.stages, V = s.virtual_stages, KV = K * V;
  struct times {
    double f0 = -1, f1 = -1, b0 = -1, b1 = -1, w0 = -1;
  };
  std::map<std::pair<std::int64_t, int>, times> t;  // (m, v)
  for (int k = 0; k < K; ++k)
    for (const timed_action& ta : r.timeline[static_cast<std::size_t>(k)]) {
      REQUIRE(ta.end >= ta.start);
      times& x = t[{ta.a.micro_batch, ta.a.chunk * K + k}];
      switch (ta.a.kind) {
        case action_kind::forward:
          x.f0 = ta.start, x.f1 = ta.end;
          break;
        case action_kind::backward:
        case action_kind::backward_input:
          x.b0 = ta.start, x.b1 = ta.end;
          break;
        case action_kind::backward_weight:
          x.w0 = ta.start;
          break;
        default:
          break;
      }
    }
  for (std::int64_t m = 0; m < s.micro_batches; ++m)
    for (int v = 0; v < KV; ++v) {
      INFO("micro-batch " << m << " virtual stage " << v);
      const times& x = t[{m, v}];
      REQUIRE(x.f0 >= 0);
      REQUIRE(x.b0 >= 0);
      CHECK(x.f1 <= x.b0);
      if (x.w0 >= 0) CHECK(x.b1 <= x.w0);
      if (v > 0) CHECK(t[{m, v - 1}].f1 + hop <= x.f0 + eps);
      if (v < KV - 1) CHECK(t[{m, v + 1}].b1 + hop <= x.b0 + eps);
    }
}

}  // namespace

TEST_CASE("schedule names round-trip and unknown names are refused", "[pipeline]") {
  for (schedule_kind kind : all_kinds) CHECK(parse_schedule_kind(to_string(kind)) == kind);
  CHECK(std::string(to_string(schedule_kind::one_f_one_b)) == "1f1b");
  CHECK(std::string(to_string(schedule_kind::zero_bubble_h1)) == "zb1");
  REQUIRE_THROWS_AS(parse_schedule_kind("pipedream"), config_error);
  REQUIRE_THROWS_WITH(parse_schedule_kind("pipedream"),
                      Contains("'pipedream'") && Contains("gpipe, 1f1b, interleaved or zb1"));
}

TEST_CASE("check_pipeline refuses impossible shapes, naming the numbers", "[pipeline]") {
  using K = schedule_kind;
  REQUIRE_THROWS_WITH(check_pipeline(K::gpipe, {0, 4, 1}), Contains("pp=0 stages must be >= 1"));
  REQUIRE_THROWS_WITH(check_pipeline(K::one_f_one_b, {2, 0, 1}),
                      Contains("micro-batch count M=0 must be >= 1"));
  REQUIRE_THROWS_WITH(check_pipeline(K::interleaved, {2, 4, 0}),
                      Contains("virtual stages V=0 must be >= 1"));
  REQUIRE_THROWS_WITH(check_pipeline(K::zero_bubble_h1, {2, 4, 2}),
                      Contains("V=2 need the interleaved schedule, not zb1"));
  REQUIRE_THROWS_WITH(check_pipeline(K::interleaved, {1, 4, 2}),
                      Contains("interleaved needs pp >= 2 stages, got pp=1"));
  REQUIRE_THROWS_WITH(check_pipeline(K::interleaved, {2, 5, 2}),
                      Contains("interleaved needs the micro-batch count M=5 to be a multiple "
                               "of pp=2"));
  REQUIRE_THROWS_WITH(check_pipeline(K::interleaved, {4, 8, 3}, 11),
                      Contains("more virtual stages (K V = 4 x 3 = 12) than layers (11)"));
  REQUIRE_THROWS_WITH(check_pipeline(K::one_f_one_b, {4, 8, 1}, 3),
                      Contains("(K V = 4 x 1 = 4) than layers (3)"));
  REQUIRE_NOTHROW(check_pipeline(K::interleaved, {4, 8, 3}, 12));
  REQUIRE_NOTHROW(check_pipeline(K::gpipe, {4, 3, 1}, -1));
  // A stage outside [0, K).
  REQUIRE_THROWS_WITH(one_f_one_b::actions(4, {4, 8, 1}), Contains("stage=4 must be in [0, pp=4)"));
  REQUIRE_THROWS_WITH(gpipe::actions(-1, {4, 8, 1}), Contains("stage=-1"));
  REQUIRE_THROWS_AS(zero_bubble_h1::actions(2, {2, 8, 1}), config_error);
  REQUIRE_THROWS_AS(interleaved_one_f_one_b::actions(2, {2, 8, 2}), config_error);
}

TEST_CASE("every schedule's lists are complete, matched, deadlock-free and causal", "[pipeline]") {
  for_each_shape([](schedule_kind kind, pipeline_shape s) {
    const auto lists = all_lists(kind, s);
    for (int k = 0; k < s.stages; ++k) check_list(kind, s, k, lists[static_cast<std::size_t>(k)]);
    check_messages(s, lists);
    for (double hop : {0.0, 0.25}) {
      INFO("hop " << hop);
      stage_costs costs;
      costs.forward = 1, costs.backward_input = 1.5, costs.backward_weight = 0.75, costs.hop = hop;
      simulation r;
      REQUIRE_NOTHROW(r = simulate(lists, s.virtual_stages, costs));
      check_times(s, r, hop);
      REQUIRE(r.timeline.size() == static_cast<std::size_t>(s.stages));
      for (int k = 0; k < s.stages; ++k)
        CHECK(r.timeline[static_cast<std::size_t>(k)].size() ==
              lists[static_cast<std::size_t>(k)].size());
    }
  });
}

TEST_CASE("bubble fractions and idle times follow the papers' formulas", "[pipeline]") {
  for_each_shape([](schedule_kind kind, pipeline_shape s) {
    const double K = s.stages, M = static_cast<double>(s.micro_batches), V = s.virtual_stages;
    // F = 1, B + W = 2 (a full backward costs 2), no latency.
    stage_costs costs;
    costs.forward = 1, costs.backward_input = 1, costs.backward_weight = 1, costs.hop = 0;
    const simulation r = simulate(kind, s, costs);
    for (int k = 0; k < s.stages; ++k) {
      CHECK(r.busy[static_cast<std::size_t>(k)] == Approx(3 * M).epsilon(eps));
      CHECK(r.idle[static_cast<std::size_t>(k)] ==
            Approx(r.step_time - r.busy[static_cast<std::size_t>(k)]).margin(eps));
    }
    double max_idle = 0;
    for (double x : r.idle) max_idle = std::max(max_idle, x);
    switch (kind) {
      case schedule_kind::gpipe:
      case schedule_kind::one_f_one_b:
        // Narayanan et al. 2021, section 2.2.1: (K-1)/(M+K-1), for every M.
        CHECK(r.bubble_fraction == Approx((K - 1) / (M + K - 1)).epsilon(eps));
        CHECK(max_idle == Approx(3 * (K - 1)).margin(eps));
        break;
      case schedule_kind::interleaved:
        // Section 2.2.2, chunks costing 1/V: (K-1)/(V M+K-1); M is a
        // multiple of K here (check_pipeline), M = K included.
        CHECK(r.bubble_fraction == Approx((K - 1) / (V * M + K - 1)).epsilon(eps));
        break;
      case schedule_kind::zero_bubble_h1:
        // Qi et al. 2023, section 3.1: with F = B = W = 1 every rank (not
        // only the worst) idles exactly (K-1)(F+B-W) = K-1 when M >= K, a
        // third of 1F1B's (K-1)(F+B+W) = 3(K-1). When M < K the deferred
        // W's cannot fill the whole cool-down: every rank idles 2K-1-M
        // (= (K-1) + (K-M)), still below 1F1B's 3(K-1).
        for (double x : r.idle)
          CHECK(x == Approx(s.micro_batches >= s.stages ? K - 1 : 2 * K - 1 - M).margin(eps));
        if (s.micro_batches >= s.stages) {
          const simulation one = simulate(schedule_kind::one_f_one_b, s, costs);
          double max_one = 0;
          for (double x : one.idle) max_one = std::max(max_one, x);
          CHECK(max_idle * 3 == Approx(max_one).margin(eps));
        }
        break;
    }
  });
}

TEST_CASE("peak in flight: gpipe M, 1f1b and zb1 min(K, M) on stage 0 and <= K", "[pipeline]") {
  for_each_shape([](schedule_kind kind, pipeline_shape s) {
    const simulation r = simulate(kind, s, stage_costs{});
    const std::int64_t K = s.stages, M = s.micro_batches;
    for (int k = 0; k < s.stages; ++k) {
      const std::int64_t peak = r.peak_in_flight[static_cast<std::size_t>(k)];
      INFO("rank " << k);
      switch (kind) {
        case schedule_kind::gpipe:
          CHECK(peak == M);
          break;
        case schedule_kind::one_f_one_b:
          CHECK(peak == std::min(K - k, M));
          break;
        case schedule_kind::zero_bubble_h1:
          // Every rank holds back k W's: all reach 1F1B's stage-0 peak.
          CHECK(peak == std::min(K, M));
          break;
        case schedule_kind::interleaved:
          // Warm-up plus one, over all chunks (Megatron's count).
          CHECK(peak ==
                std::min<std::int64_t>(s.virtual_stages == 1
                                           ? K - k
                                           : (K - k - 1) * 2 + (s.virtual_stages - 1) * K + 1,
                                       M * s.virtual_stages));
          break;
      }
    }
  });
}

TEST_CASE("interleaved with V = 1 is 1f1b; K = 1 is gradient accumulation", "[pipeline]") {
  for (int K = 2; K <= 8; ++K)
    for (std::int64_t M = K; M <= 3 * K; M += K)
      for (int k = 0; k < K; ++k) {
        INFO("K=" << K << " M=" << M << " rank " << k);
        const auto a = interleaved_one_f_one_b::actions(k, {K, M, 1});
        const auto b = one_f_one_b::actions(k, {K, M, 1});
        CHECK(compute_order(a) == compute_order(b));
        CHECK(a == b);  // sends and receives too
      }
  for (std::int64_t M = 1; M <= 4; ++M) {
    INFO("M=" << M);
    std::vector<action> want, want_split;
    for (std::int64_t m = 0; m < M; ++m) {
      want.push_back({action_kind::forward, m});
      want.push_back({action_kind::backward, m});
      want_split.push_back({action_kind::forward, m});
      want_split.push_back({action_kind::backward_input, m});
      want_split.push_back({action_kind::backward_weight, m});
    }
    for (auto* w : {&want, &want_split}) {
      w->push_back({action_kind::reduce_gradients, -1});
      w->push_back({action_kind::clip, -1});
      w->push_back({action_kind::optimizer_step, -1});
    }
    // 1f1b and zb1 are one-at-a-time accumulation; gpipe stays GPipe (all
    // forwards, then all backwards in forward order: peak M, like K > 1).
    CHECK(one_f_one_b::actions(0, {1, M, 1}) == want);
    CHECK(one_f_one_b::actions(0, {1, M, 1}) == no_pipeline(M));
    CHECK(gpipe::actions(0, {1, M, 1}) == no_pipeline(M, M, backward_order::forward_order));
    CHECK(zero_bubble_h1::actions(0, {1, M, 1}) == want_split);
    REQUIRE_THROWS_WITH(interleaved_one_f_one_b::actions(0, {1, M, 1}),
                        Contains("interleaved needs pp >= 2 stages"));
  }
}

TEST_CASE("interleaved runs micro-batches through the chunks in groups of K", "[pipeline]") {
  // K = 2, M = 4, V = 2, rank 0: warm-up (2-0-1) 2 + (2-1) 2 = 4 forwards:
  // (m, c) = (0,0) (1,0) (0,1) (1,1); then 1F1B over virtual micro-batches,
  // backwards starting from the last chunk.
  std::vector<std::pair<std::int64_t, int>> f, b;
  for (const action& a : compute_order(interleaved_one_f_one_b::actions(0, {2, 4, 2}))) {
    if (a.kind == action_kind::forward) f.push_back({a.micro_batch, a.chunk});
    if (a.kind == action_kind::backward) b.push_back({a.micro_batch, a.chunk});
  }
  using P = std::vector<std::pair<std::int64_t, int>>;
  CHECK(f == P{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {3, 0}, {2, 1}, {3, 1}});
  CHECK(b == P{{0, 1}, {1, 1}, {0, 0}, {1, 0}, {2, 1}, {3, 1}, {2, 0}, {3, 0}});
  const auto order = compute_order(interleaved_one_f_one_b::actions(0, {2, 4, 2}));
  CHECK(order[4] == action{action_kind::forward, 2, 0});
  CHECK(order[5] == action{action_kind::backward, 0, 1});
}

TEST_CASE("the simulator names a deadlock's ranks and refuses unmatched messages", "[pipeline]") {
  // Both ranks receive first: rank 0 waits for micro-batch 0's output
  // gradient from rank 1, rank 1 for micro-batch 0's input from rank 0.
  const std::vector<std::vector<action>> stuck = {{{action_kind::recv_backward, 0},
                                                   {action_kind::forward, 0},
                                                   {action_kind::send_forward, 0},
                                                   {action_kind::backward, 0}},
                                                  {{action_kind::recv_forward, 0},
                                                   {action_kind::forward, 0},
                                                   {action_kind::backward, 0},
                                                   {action_kind::send_backward, 0}}};
  REQUIRE_THROWS_AS(simulate(stuck, 1, stage_costs{}), config_error);
  REQUIRE_THROWS_WITH(simulate(stuck, 1, stage_costs{}),
                      Contains("deadlock") &&
                          Contains("rank 0 waits in recv_backward of micro-batch 0 (chunk 0)") &&
                          Contains("rank 1 waits in recv_forward of micro-batch 0 (chunk 0)"));

  // A receive whose send is missing, and a send nobody receives.
  auto lists = all_lists(schedule_kind::one_f_one_b, {3, 4, 1});
  auto drop = [](std::vector<action>& l, action a) {
    for (auto it = l.begin(); it != l.end(); ++it)
      if (*it == a) {
        l.erase(it);
        return;
      }
    FAIL("no such action");
  };
  auto no_send = lists;
  drop(no_send[1], {action_kind::send_forward, 2});
  REQUIRE_THROWS_WITH(simulate(no_send, 1, stage_costs{}),
                      Contains("rank 2's recv_forward of micro-batch 2") &&
                          Contains("has no matching send_forward"));
  auto no_recv = lists;
  drop(no_recv[0], {action_kind::recv_backward, 1});
  REQUIRE_THROWS_WITH(
      simulate(no_recv, 1, stage_costs{}),
      Contains("rank 1's send_backward of micro-batch 1") && Contains("is never received"));
  // A send off the end of the pipeline, and a chunk outside [0, V).
  auto off_end = lists;
  off_end[2].insert(off_end[2].begin(), action{action_kind::send_forward, 0});
  REQUIRE_THROWS_WITH(simulate(off_end, 1, stage_costs{}), Contains("has no next virtual stage"));
  const std::vector<std::vector<action>> bad_chunk = {{{action_kind::forward, 0, 1}}};
  REQUIRE_THROWS_WITH(simulate(bad_chunk, 1, stage_costs{}), Contains("chunk 1 outside [0, V=1)"));
}

TEST_CASE("message_groups are the maximal runs of adjacent messages", "[pipeline]") {
  using A = action_kind;
  const std::vector<action> l = {{A::recv_forward, 0},     {A::forward, 0},  {A::send_forward, 0},
                                 {A::recv_backward, 0},    {A::backward, 0}, {A::send_backward, 0},
                                 {A::reduce_gradients, -1}};
  CHECK(message_groups(l) == std::vector<action_range>{{0, 1}, {2, 4}, {5, 6}});
  CHECK(message_groups({}).empty());
}

TEST_CASE("every schedule completes under NCCL's rendezvous, each group at once", "[pipeline]") {
  // A send waits for its receive; a rank issues each message group whole and
  // waits for it; sends and receives between two ranks match in order.
  for_each_shape([](schedule_kind kind, pipeline_shape s) {
    const auto lists = all_lists(kind, s);
    for (double hop : {0.0, 0.25}) {
      INFO("hop " << hop);
      stage_costs costs;
      costs.forward = 1, costs.backward_input = 1.5, costs.backward_weight = 0.75, costs.hop = hop;
      simulation r;
      REQUIRE_NOTHROW(r = simulate(lists, s.virtual_stages, costs, message_transport::rendezvous));
      check_times(s, r, hop);
      const simulation b = simulate(lists, s.virtual_stages, costs);
      // Waiting for the receiver never makes a step shorter.
      CHECK(r.step_time >= b.step_time - 1e-12);
      // Without a latency, gpipe's, 1f1b's and interleaved's groups pair up
      // exactly: the same step time as over buffered messages.
      if (hop == 0 && kind != schedule_kind::zero_bubble_h1)
        CHECK(r.step_time == Approx(b.step_time).epsilon(1e-12));
    }
  });
}

TEST_CASE("rendezvous: crossing sends deadlock, out-of-order messages are refused", "[pipeline]") {
  using A = action_kind;
  // Rank 0 sends micro-batch 1 before receiving 0's gradient, rank 1 sends
  // that gradient before receiving micro-batch 1, each in a group of its
  // own (a compute between): buffered, it runs; under rendezvous each send
  // waits for a receive queued behind the other's.
  const std::vector<std::vector<action>> crossing = {{{A::forward, 0},
                                                      {A::send_forward, 0},
                                                      {A::forward, 1},
                                                      {A::send_forward, 1},
                                                      {A::forward, 2},
                                                      {A::recv_backward, 0},
                                                      {A::backward, 0},
                                                      {A::send_forward, 2},
                                                      {A::recv_backward, 1},
                                                      {A::backward, 1},
                                                      {A::recv_backward, 2},
                                                      {A::backward, 2}},
                                                     {{A::recv_forward, 0},
                                                      {A::forward, 0},
                                                      {A::backward_input, 0},
                                                      {A::send_backward, 0},
                                                      {A::backward_weight, 0},
                                                      {A::recv_forward, 1},
                                                      {A::forward, 1},
                                                      {A::backward, 1},
                                                      {A::send_backward, 1},
                                                      {A::recv_forward, 2},
                                                      {A::forward, 2},
                                                      {A::backward, 2},
                                                      {A::send_backward, 2}}};
  REQUIRE_NOTHROW(simulate(crossing, 1, stage_costs{}));
  REQUIRE_THROWS_WITH(simulate(crossing, 1, stage_costs{}, message_transport::rendezvous),
                      Contains("deadlock") &&
                          Contains("rank 0 waits in send_forward of micro-batch 1") &&
                          Contains("rank 1 waits in send_backward of micro-batch 0"));

  // Interleaved 1F1B's steady step with the receives beside the computes
  // (not grouped per step as make_schedule does): a deadlock under
  // rendezvous on every interleaved shape tried.
  for (int K : {2, 4})
    for (int V : {2, 3}) {
      const pipeline_shape s{K, 2 * K, V};
      std::vector<std::vector<action>> lists;
      for (int k = 0; k < K; ++k) {
        std::vector<action> l;
        for (const action& a : interleaved_one_f_one_b::actions(k, s)) l.push_back(a);
        // Undo the per-step grouping: each receive right before its compute,
        // each send right after it.
        std::vector<action> computes, out;
        for (const action& a : l)
          if (!is_message(a.kind)) computes.push_back(a);
        for (const action& a : computes) {
          const int v = a.chunk * K + k;
          const bool f = a.kind == A::forward, b = a.kind == A::backward;
          if (f && v > 0) out.push_back({A::recv_forward, a.micro_batch, a.chunk});
          if (b && v < K * V - 1) out.push_back({A::recv_backward, a.micro_batch, a.chunk});
          out.push_back(a);
          if (f && v < K * V - 1) out.push_back({A::send_forward, a.micro_batch, a.chunk});
          if (b && v > 0) out.push_back({A::send_backward, a.micro_batch, a.chunk});
        }
        lists.push_back(out);
      }
      INFO("K " << K << " V " << V);
      REQUIRE_NOTHROW(simulate(lists, V, stage_costs{}));
      REQUIRE_THROWS_WITH(simulate(lists, V, stage_costs{}, message_transport::rendezvous),
                          Contains("deadlock"));
    }

  // Two messages from rank 0 to rank 1 received in the other order: MPI's
  // tags match them, NCCL's order cannot.
  const std::vector<std::vector<action>> swapped = {{{A::forward, 0},
                                                     {A::send_forward, 0},
                                                     {A::forward, 1},
                                                     {A::send_forward, 1},
                                                     {A::recv_backward, 1},
                                                     {A::backward, 1},
                                                     {A::recv_backward, 0},
                                                     {A::backward, 0}},
                                                    {{A::recv_forward, 1},
                                                     {A::recv_forward, 0},
                                                     {A::forward, 1},
                                                     {A::forward, 0},
                                                     {A::backward, 1},
                                                     {A::backward, 0},
                                                     {A::send_backward, 1},
                                                     {A::send_backward, 0}}};
  REQUIRE_THROWS_WITH(simulate(swapped, 1, stage_costs{}, message_transport::rendezvous),
                      Contains("rank 0's send #0 to rank 1 is micro-batch 0") &&
                          Contains("rank 1's receive #0 from rank 0 expects micro-batch 1") &&
                          Contains("matches them in order"));
}

}  // namespace test_parallel_pipeline_schedule
