// Tests precision::loss_scaler against DeepSpeed's own formulation of the
// dynamic loss scale (DynamicLossScaler.update_scale in
// deepspeed/runtime/fp16/loss_scaler.py, consecutive_hysteresis off: an
// iteration counter, the last overflow's iteration and a hysteresis that
// counts down to 1), written out below independently of the tracker
// counts the library keeps, over fixed and random overflow sequences; the
// static scale; the checkpoint state's round trip; and the refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <tessera/core/random.hpp>
#include <tessera/precision/loss_scaler.hpp>

namespace test_precision_loss_scaler {

using tessera::config_error;
using tessera::io_error;
using tessera::precision::loss_scale_options;
using tessera::precision::loss_scaler;

namespace {
// DeepSpeed's DynamicLossScaler, consecutive_hysteresis = False.
struct deepspeed_scaler {
  double cur_scale, scale_factor, min_scale;
  std::int64_t scale_window, delayed_shift, cur_hysteresis, cur_iter = 0, last_overflow_iter = -1;
  explicit deepspeed_scaler(const loss_scale_options& o)
      : cur_scale(o.initial),
        scale_factor(1 / o.backoff_factor),  // DeepSpeed grows and backs off by one factor
        min_scale(o.min_scale),
        scale_window(o.growth_interval),
        delayed_shift(o.hysteresis),
        cur_hysteresis(o.hysteresis) {}
  void update_scale(bool overflow) {
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1)
        cur_scale = std::max(cur_scale / scale_factor, min_scale);
      else
        cur_hysteresis -= 1;
      last_overflow_iter = cur_iter;
    } else if ((cur_iter - last_overflow_iter) % scale_window == 0) {
      cur_hysteresis = delayed_shift;
      cur_scale *= scale_factor;
    }
    cur_iter += 1;
  }
};
}  // namespace

TEST_CASE("the dynamic loss scale moves as DeepSpeed's, with hysteresis", "[precision][scaler]") {
  for (std::int64_t hysteresis : {1, 2, 3}) {
    for (std::int64_t window : {1, 2, 5}) {
      loss_scale_options o;
      o.initial = 1024;
      o.growth_interval = window;
      o.hysteresis = hysteresis;
      o.min_scale = 4;
      for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        INFO("hysteresis " << hysteresis << " window " << window << " seed " << seed);
        loss_scaler s(o);
        deepspeed_scaler ds(o);
        std::uint64_t r = seed;
        std::int64_t overflows = 0;
        for (int it = 0; it < 400; ++it) {
          r = tessera::mix64(r);
          // runs of overflows and clean steps: one step in 3 overflows, in bursts
          const bool overflow = (r % 3 == 0) || (it > 100 && it < 120);
          overflows += overflow;
          CHECK(s.scale() == ds.cur_scale);
          s.update(overflow);
          ds.update_scale(overflow);
        }
        CHECK(s.scale() == ds.cur_scale);
        CHECK(s.skipped() == overflows);
        CHECK(s.scale() >= o.min_scale);
      }
    }
  }
}

TEST_CASE("one overflow without hysteresis halves the scale; the window grows it back",
          "[precision][scaler]") {
  loss_scale_options o;
  o.initial = 65536;
  o.hysteresis = 1;
  o.growth_interval = 3;
  loss_scaler s(o);
  s.update(true);
  CHECK(s.scale() == 32768);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 32768);
  s.update(false);
  CHECK(s.scale() == 65536);
  // With the default hysteresis of 2, the first overflow is tolerated.
  loss_scaler d{loss_scale_options{}};
  d.update(true);
  CHECK(d.scale() == 65536);
  d.update(true);
  CHECK(d.scale() == 32768);
  d.update(true);  // none left: every further overflow backs off
  CHECK(d.scale() == 16384);
  CHECK(d.skipped() == 3);
}

TEST_CASE("the scale never backs off below its minimum", "[precision][scaler]") {
  loss_scale_options o;
  o.initial = 8;
  o.min_scale = 2;
  o.hysteresis = 1;
  loss_scaler s(o);
  for (int i = 0; i < 10; ++i) s.update(true);
  CHECK(s.scale() == 2);
}

TEST_CASE("a static loss scale stays, and still counts the skipped steps", "[precision][scaler]") {
  loss_scale_options o;
  o.dynamic = false;
  o.initial = 128;
  o.growth_interval = 1;
  loss_scaler s(o);
  for (int i = 0; i < 5; ++i) s.update(i % 2 == 0);
  CHECK(s.scale() == 128);
  CHECK(s.skipped() == 3);
}

TEST_CASE("the scaler's state survives a checkpoint's JSON round trip", "[precision][scaler]") {
  loss_scale_options o;
  o.growth_interval = 4;
  o.hysteresis = 3;
  loss_scaler a(o), b(o);
  const bool seq[] = {false, true, false, false, true, true, true, false};
  for (bool f : seq) a.update(f);
  b.restore(nlohmann::json::parse(a.state().dump()));
  CHECK(b.state() == a.state());
  // From here both move alike.
  for (int i = 0; i < 12; ++i) {
    const bool f = i % 5 == 0;
    a.update(f);
    b.update(f);
    CHECK(a.scale() == b.scale());
  }
  CHECK(b.skipped() == a.skipped());
}

TEST_CASE("bad loss-scale settings and states are refused naming the value",
          "[precision][scaler][errors]") {
  auto refused = [](auto edit, const char* why) {
    loss_scale_options o;
    edit(o);
    REQUIRE_THROWS_AS(loss_scaler(o), config_error);
    REQUIRE_THROWS_WITH(loss_scaler(o), Catch::Contains(why));
  };
  refused([](loss_scale_options& o) { o.initial = 0; }, "loss scale 0 must be a finite value > 0");
  refused([](loss_scale_options& o) { o.growth_factor = 1; }, "growth factor 1 must be > 1");
  refused([](loss_scale_options& o) { o.backoff_factor = 1; }, "backoff factor 1 must be in (0, 1)");
  refused([](loss_scale_options& o) { o.growth_interval = 0; }, "growth interval) 0 must be >= 1");
  refused([](loss_scale_options& o) { o.hysteresis = 0; }, "hysteresis 0 must be >= 1");
  refused([](loss_scale_options& o) { o.min_scale = 1e9; },
          "minimum loss scale 1e+09 must be > 0 and at most the initial scale 65536");
  loss_scaler s;
  REQUIRE_THROWS_AS(s.restore(nlohmann::json{{"scale", 2}}), io_error);
  REQUIRE_THROWS_WITH(s.restore(nlohmann::json{{"scale", 2}}), Catch::Contains("is malformed"));
  auto st = s.state();
  st["scale"] = -1;
  REQUIRE_THROWS_WITH(s.restore(st), Catch::Contains("out of range"));
  CHECK(s.scale() == 65536);  // a refused state changes nothing
}

}  // namespace test_precision_loss_scaler
