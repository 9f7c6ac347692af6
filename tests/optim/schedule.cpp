// Tests include/tessera/optim/schedule.hpp: each learning-rate schedule
// equals its closed form, written here from the formulas of the paper or
// library it follows, in float64, at every step of a run and past its end
// (step 0, the last warmup step, the start and end of WSD's decay window,
// total - 1, total and after); cosine keeps the bits of the schedule
// tessera had before the choice (the golden trajectories depend on them);
// validate() refuses each bad value naming it; names parse and print.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "tessera/optim/schedule.hpp"

namespace test_optim_schedule {

using namespace tessera;
using optim::lr_schedule;
using optim::lr_schedule_kind;
using optim::wsd_cooldown;

namespace {

// The closed forms and the schedule compute the same real number in a
// different order of operations: a few float64 roundings (eps 2.2e-16)
// apart, so 1e-14 relative. A wrong step, phase or formula is off by far more.
constexpr double closed_form_rel = 1e-14;

constexpr double hi = 3e-3, lo = 3e-4;  // lr_max, lr_min
constexpr std::int64_t W = 7, T = 103;  // warmup, total

lr_schedule make(lr_schedule_kind k, optim::wsd_options wsd = {}) {
  return lr_schedule{k, hi, lo, W, T, wsd};
}

double warmup_form(std::int64_t s) {
  return hi * static_cast<double>(s + 1) / W;
}

// The decay after the warmup, W <= s < T, of each kind, written from its
// definition (not from schedule.hpp's code).
double cosine_form(std::int64_t s) {  // GPT-3 / llm.c: half a cosine from hi to lo over [W, T]
  const double p = static_cast<double>(s - W) / static_cast<double>(T - W);
  return lo + (hi - lo) * (1 + std::cos(std::acos(-1.0) * p)) / 2;
}
double linear_form(std::int64_t s) {  // a straight line from (W, hi) to (T, lo)
  return lo + (hi - lo) * static_cast<double>(T - s) / static_cast<double>(T - W);
}
// WSD: hi until the last D = round(f T) steps, then a cooldown from hi
// (at the window's first step) towards lo (reached at T).
std::int64_t wsd_decay_steps(double f, std::int64_t total) {
  return static_cast<std::int64_t>(std::floor(f * static_cast<double>(total) + 0.5));
}
double wsd_form(std::int64_t s, double f, bool sqrt_cooldown) {
  const std::int64_t d = wsd_decay_steps(f, T), start = T - d;
  if (s < start) return hi;
  const double q = static_cast<double>(s - start) / static_cast<double>(d);
  return lo + (hi - lo) * (sqrt_cooldown ? 1 - std::sqrt(q) : 1 - q);
}
double inverse_sqrt_form(std::int64_t s) {  // fairseq: hi sqrt(W / n) at update n = s + 1
  return hi / std::sqrt(static_cast<double>(s + 1) / W);
}

// Every step from 0 to past the end: warmup, the kind's decay, then lo.
template <class Decay>
void check_every_step(const lr_schedule& sch, Decay decay) {
  for (std::int64_t s = 0; s <= T + 5; ++s) {
    INFO("step " << s);
    const double expected = s < W ? warmup_form(s) : s < T ? decay(s) : lo;
    CHECK(sch(s) == Approx(expected).epsilon(closed_form_rel).margin(0));
  }
}

}  // namespace

TEST_CASE("warmup: step s < W is at lr_max (s+1)/W, reaching lr_max at W-1; lr_min from T",
          "[optim][schedule]") {
  for (auto k : {lr_schedule_kind::cosine, lr_schedule_kind::wsd, lr_schedule_kind::linear,
                 lr_schedule_kind::constant, lr_schedule_kind::inverse_sqrt}) {
    INFO(optim::to_string(k));
    const lr_schedule s = make(k);
    REQUIRE_NOTHROW(s.validate());
    CHECK(s(0) == hi / W);
    CHECK(s(W - 1) == hi);
    CHECK(s(T) == lo);
    CHECK(s(T + 1000) == lo);
  }
}

TEST_CASE("cosine equals its closed form at every step, and keeps the bits it had",
          "[optim][schedule]") {
  const lr_schedule s = make(lr_schedule_kind::cosine);
  check_every_step(s, cosine_form);
  CHECK(s(W) == hi);                                              // the decay starts at lr_max
  CHECK(s((W + T) / 2) == Approx((hi + lo) / 2).epsilon(1e-14));  // half way: the mean
  // The warmup-cosine schedule of tessera before the choice of schedules,
  // as it was written: the same bits at every step (the golden
  // trajectories of tests/train/golden.cpp replay through it).
  const auto previous = [](double max_lr, double min_lr, std::int64_t warmup, std::int64_t total,
                           std::int64_t step) {
    if (step < warmup) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
    if (step >= total) return min_lr;
    double span = static_cast<double>(total - warmup);
    double progress = span > 0 ? static_cast<double>(step - warmup) / span : 1.0;
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * progress));
  };
  for (std::int64_t step = 0; step <= T + 2; ++step) CHECK(s(step) == previous(hi, lo, W, T, step));
  const lr_schedule main_job{lr_schedule_kind::cosine, 2e-3, 2e-4, 50, 2400, {}};
  for (std::int64_t step = 0; step <= 2401; ++step)
    if (main_job(step) != previous(2e-3, 2e-4, 50, 2400, step)) FAIL("step " << step);
  // No warmup: step 0 is the top of the cosine.
  CHECK(lr_schedule{lr_schedule_kind::cosine, hi, lo, 0, T, {}}(0) == hi);
}

TEST_CASE("linear equals its closed form at every step", "[optim][schedule]") {
  const lr_schedule s = make(lr_schedule_kind::linear);
  check_every_step(s, linear_form);
  CHECK(s(W) == hi);
  CHECK(s(T - 1) == Approx(lo + (hi - lo) / (T - W)).epsilon(1e-14));  // one step above lr_min
  CHECK(s(55) == Approx((hi + lo) / 2).epsilon(1e-14));                // half way: (7 + 103) / 2
}

TEST_CASE("wsd equals its closed form at every step, linear and 1-sqrt cooldowns",
          "[optim][schedule]") {
  for (const bool sq : {false, true})
    for (const double f : {0.1, 0.25, 1.0 - 7.0 / 103.0}) {  // the last: the whole run after warmup
      INFO("cooldown " << (sq ? "sqrt" : "linear") << ", decay fraction " << f);
      const optim::wsd_options o{f, sq ? wsd_cooldown::sqrt : wsd_cooldown::linear};
      const lr_schedule s = make(lr_schedule_kind::wsd, o);
      REQUIRE_NOTHROW(s.validate());
      check_every_step(s, [&](std::int64_t step) { return wsd_form(step, f, sq); });
      const std::int64_t d = wsd_decay_steps(f, T), start = T - d;
      CHECK(s.wsd.decay_steps(T) == d);
      CHECK(s.decay_start() == start);
      // The window's edges: stable up to it, lr_max at its first step (no
      // decay yet), one step of decay at the next, one step above lr_min
      // at its last (T - 1), lr_min at T.
      if (start > W) CHECK(s(start - 1) == hi);
      CHECK(s(start) == hi);
      const double one = 1.0 / static_cast<double>(d);
      CHECK(s(start + 1) ==
            Approx(lo + (hi - lo) * (sq ? 1 - std::sqrt(one) : 1 - one)).epsilon(1e-14));
      CHECK(s(T - 1) ==
            Approx(lo + (hi - lo) * (sq ? 1 - std::sqrt(1 - one) : one)).epsilon(1e-14));
      CHECK(s(T) == lo);
    }
  // The decay's length: D = round(f T), halves away from zero.
  CHECK(optim::wsd_options{0.1, {}}.decay_steps(103) == 10);
  CHECK(optim::wsd_options{0.1, {}}.decay_steps(105) == 11);  // 10.5
  CHECK(optim::wsd_options{0.1, {}}.decay_steps(5) == 1);     // 0.5
  CHECK(optim::wsd_options{0.1, {}}.decay_steps(4) == 0);     // a run too short to decay
  CHECK(optim::wsd_options{0.07, {}}.decay_steps(100) == 7);  // 0.07 x 100 is 7.000000000000001
  // A window of no steps: warmup, then lr_max to the end.
  const lr_schedule none{lr_schedule_kind::wsd, hi, lo, 1, 4, {}};
  REQUIRE_NOTHROW(none.validate());
  CHECK(none(1) == hi);
  CHECK(none(3) == hi);
  CHECK(none(4) == lo);
}

TEST_CASE("a longer total moves wsd's decay window to the new end", "[optim][schedule]") {
  const lr_schedule planned = make(lr_schedule_kind::wsd);  // D 10: decays from step 93
  lr_schedule longer = planned;
  longer.total = 2 * T;  // D 21: decays from step 185
  REQUIRE_NOTHROW(longer.validate());
  CHECK(planned(95) < hi);
  CHECK(longer(95) == hi);  // a step of the old window is stable again
  CHECK(longer.decay_start() == 2 * T - 21);
  CHECK(longer(2 * T - 1) == Approx(lo + (hi - lo) / 21).epsilon(1e-14));
}

TEST_CASE("constant and inverse_sqrt equal their closed forms at every step", "[optim][schedule]") {
  const lr_schedule c = make(lr_schedule_kind::constant);
  check_every_step(c, [](std::int64_t) { return hi; });
  CHECK(c(T - 1) == hi);
  const lr_schedule r = make(lr_schedule_kind::inverse_sqrt);
  check_every_step(r, inverse_sqrt_form);
  CHECK(r(W) == Approx(hi * std::sqrt(7.0 / 8.0)).epsilon(1e-14));  // just past the warmup
  CHECK(r(4 * W - 1) == hi / 2);                                    // sqrt(7 / 28) = 1/2
  CHECK(r(T - 1) == Approx(hi * std::sqrt(7.0 / 103.0)).epsilon(1e-14));
}

TEST_CASE("lr_schedule::validate refuses each bad value, naming it", "[optim][schedule]") {
  const auto refusal = [](const lr_schedule& s) -> std::string {
    try {
      s.validate();
    } catch (const config_error& e) {
      return e.what();
    }
    return "accepted";
  };
  lr_schedule s = make(lr_schedule_kind::cosine);
  CHECK(refusal(s) == "accepted");
  s.warmup = -1;
  CHECK(refusal(s) == "warmup=-1 must be >= 0");
  s = make(lr_schedule_kind::cosine);
  s.total = 0;
  CHECK(refusal(s) == "total steps=0 must be >= 1");
  s = make(lr_schedule_kind::linear);
  s.min_lr = 1e-2;
  CHECK(refusal(s) == "lr range [0.01, 0.003] must satisfy 0 <= min_lr <= max_lr");
  s = make(lr_schedule_kind::linear);
  s.max_lr = std::numeric_limits<double>::quiet_NaN();
  CHECK(refusal(s) == "lr range [0.0003, nan] must satisfy 0 <= min_lr <= max_lr");
  s = make(lr_schedule_kind::wsd, {0.0, wsd_cooldown::linear});
  CHECK(refusal(s) == "wsd decay_fraction=0 must be in (0, 1]");
  s = make(lr_schedule_kind::wsd, {1.5, wsd_cooldown::sqrt});
  CHECK(refusal(s) == "wsd decay_fraction=1.5 must be in (0, 1]");
  s = make(lr_schedule_kind::wsd, {0.1, wsd_cooldown::sqrt});
  s.warmup = 95;  // D = 10: the decay would start at 93
  CHECK(refusal(s) ==
        "wsd's decay of 10 steps (decay_fraction=0.1 of total=103) would start at step 93, "
        "inside the warmup of 95 steps: lower the warmup or the decay fraction");
  s.warmup = 93;  // the decay starts where the warmup ends
  CHECK(refusal(s) == "accepted");
  s = make(lr_schedule_kind::inverse_sqrt);
  s.warmup = 0;
  CHECK(refusal(s) ==
        "inverse_sqrt decays as max_lr sqrt(warmup / (step + 1)): it needs warmup >= 1 "
        "(warmup=0)");
  s = make(lr_schedule_kind::cosine, {0.2, wsd_cooldown::linear});
  CHECK(refusal(s) ==
        "wsd decay_fraction=0.2 and cooldown linear shape wsd's decay only, not the cosine "
        "schedule's");
  s = make(lr_schedule_kind::constant, {0.1, wsd_cooldown::sqrt});
  CHECK(refusal(s) ==
        "wsd decay_fraction=0.1 and cooldown sqrt shape wsd's decay only, not the constant "
        "schedule's");
}

TEST_CASE("schedule names parse and print; describe() names the phases", "[optim][schedule]") {
  for (auto k : {lr_schedule_kind::cosine, lr_schedule_kind::wsd, lr_schedule_kind::linear,
                 lr_schedule_kind::constant, lr_schedule_kind::inverse_sqrt})
    CHECK(optim::parse_lr_schedule_kind(optim::to_string(k)) == k);
  CHECK(std::string(optim::to_string(lr_schedule_kind::inverse_sqrt)) == "inverse_sqrt");
  CHECK_THROWS_WITH(
      optim::parse_lr_schedule_kind("warmup_cosine"),
      "unknown lr schedule 'warmup_cosine' (valid: cosine, wsd, linear, constant, inverse_sqrt)");
  CHECK(optim::parse_wsd_cooldown("sqrt") == wsd_cooldown::sqrt);
  CHECK(optim::parse_wsd_cooldown("linear") == wsd_cooldown::linear);
  CHECK_THROWS_WITH(optim::parse_wsd_cooldown("cosine"),
                    "unknown WSD cooldown 'cosine' (valid: linear, sqrt)");
  CHECK(optim::wsd_options{0.25, wsd_cooldown::sqrt}.to_json() ==
        nlohmann::json{{"decay_fraction", 0.25}, {"cooldown", "sqrt"}});
  CHECK(make(lr_schedule_kind::cosine).describe() == "warmup 7, cosine decay to step 103");
  CHECK(make(lr_schedule_kind::wsd, {0.1, wsd_cooldown::sqrt}).describe() ==
        "warmup 7, stable to step 93, 1-sqrt cooldown to step 103");
  CHECK(make(lr_schedule_kind::inverse_sqrt).describe() ==
        "warmup 7, inverse square root decay to step 103");
}

}  // namespace test_optim_schedule
