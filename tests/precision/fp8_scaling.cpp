// Tests precision::fp8_scale against Transformer Engine's delayed-scaling
// update written out here (a history of the last L amaxes, zeros to start;
// the scale fp8_max / amax / 2^margin from their maximum or the newest,
// the previous scale kept where that amax is 0 or not finite), computed in
// float64 and compared within one float rounding; the current recipe; the
// checkpoint state's round trip; and the refusals.
#include <catch2/catch.hpp>

#include <cmath>
#include <deque>
#include <vector>

#include <tessera/core/random.hpp>
#include <tessera/precision/fp8_scaling.hpp>

namespace test_precision_fp8_scaling {

using namespace tessera;
using precision::fp8_recipe;
using precision::fp8_scale;
using precision::fp8_scaling;

namespace {
struct te_delayed {
  std::deque<double> history;
  double scale = 1, fp8_max;
  int margin;
  bool over_history;
  te_delayed(std::int64_t L, double max, int m, bool all)
      : history(static_cast<std::size_t>(L), 0.0), fp8_max(max), margin(m), over_history(all) {}
  void update(double amax) {
    history.pop_front();
    history.push_back(amax);
    double a = amax;
    if (over_history)
      for (double h : history) a = std::isnan(h) || std::isnan(a) ? NAN : std::max(a, h);
    const double sf = fp8_max / a / std::ldexp(1.0, margin);
    if (a > 0 && std::isfinite(a) && std::isfinite(sf)) scale = sf;
  }
};
}  // namespace

TEST_CASE("the delayed FP8 scale follows Transformer Engine's update", "[precision][fp8]") {
  for (std::int64_t L : {1, 4, 16}) {
    for (int margin : {0, 2}) {
      for (bool all : {true, false}) {
        INFO("history " << L << " margin " << margin << " max over history " << all);
        fp8_recipe r;
        r.history = L;
        r.margin = margin;
        r.amax_over_history = all;
        fp8_scale s(r, fp8_e4m3::max_finite);
        te_delayed te(L, fp8_e4m3::max_finite, margin, all);
        std::uint64_t seed = 5;
        for (int i = 0; i < 300; ++i) {
          seed = mix64(seed);
          float amax = static_cast<float>(std::exp(static_cast<double>(seed % 1000) / 100.0 - 5));
          if (i % 37 == 5) amax = 0;            // an all-zero tensor keeps the scale
          if (i % 53 == 7) amax = INFINITY;     // an overflow keeps it too
          s.record(amax);
          te.update(amax);
          CHECK(s.scale() == Approx(te.scale).epsilon(1.2e-7));
          CHECK(s.inverse() == Approx(1 / te.scale).epsilon(2.4e-7));
        }
      }
    }
  }
}

TEST_CASE("the current FP8 scale comes from the tensor's own amax", "[precision][fp8]") {
  fp8_recipe r;
  r.scaling = fp8_scaling::current;
  fp8_scale s(r, fp8_e5m2::max_finite);
  s.set_current(2.0f);
  CHECK(s.scale() == 57344.0f / 2.0f);
  s.record(1e9f);  // current scaling keeps no history
  CHECK(s.scale() == 57344.0f / 2.0f);
  s.set_current(0.0f);
  CHECK(s.scale() == 57344.0f / 2.0f);
  s.set_current(NAN);
  CHECK(s.scale() == 57344.0f / 2.0f);
  CHECK(s.state().at("amax_history").empty());
}

TEST_CASE("the FP8 scale's state survives a JSON round trip", "[precision][fp8]") {
  fp8_recipe r;
  r.history = 5;
  fp8_scale a(r, 448.0f), b(r, 448.0f);
  for (float x : {1.0f, 3.0f, 0.5f, 7.0f, 2.0f, 0.25f, 9.0f}) a.record(x);
  b.restore(nlohmann::json::parse(a.state().dump()));
  CHECK(b.state() == a.state());
  for (float x : {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}) {
    a.record(x);
    b.record(x);
    CHECK(a.scale() == b.scale());
  }
  // An overflowed use's amax (+inf) is written as JSON's null and read back
  // as +inf: the states and scales stay equal.
  a.record(INFINITY);
  b.record(INFINITY);
  fp8_scale d(r, 448.0f);
  d.restore(nlohmann::json::parse(a.state().dump()));
  for (float x : {0.5f, 4.0f, 1.0f, 2.0f, 3.0f, 0.7f}) {
    a.record(x);
    d.record(x);
    CHECK(a.scale() == d.scale());
  }
  fp8_recipe other = r;
  other.history = 6;
  fp8_scale c(other, 448.0f);
  REQUIRE_THROWS_AS(c.restore(a.state()), io_error);
  REQUIRE_THROWS_WITH(c.restore(a.state()), Catch::Contains("this recipe keeps 6"));
}

TEST_CASE("bad FP8 recipes are refused naming the value", "[precision][fp8][errors]") {
  fp8_recipe r;
  r.history = 0;
  REQUIRE_THROWS_WITH(fp8_scale(r, 448.0f), Catch::Contains("FP8 amax history 0 must be in"));
  r.history = 8;
  r.margin = -1;
  REQUIRE_THROWS_WITH(fp8_scale(r, 448.0f), Catch::Contains("FP8 scale margin -1 must be in"));
  REQUIRE_THROWS_WITH(precision::parse_fp8_scaling("tensorwise"),
                      Catch::Contains("unknown FP8 scaling 'tensorwise' (valid: delayed, current)"));
  CHECK(precision::parse_fp8_scaling("current") == fp8_scaling::current);
}

}  // namespace test_precision_fp8_scaling
