// Tests include/tessera/train/trainer.hpp: bit-for-bit replay, exact resume
// from a checkpoint, accumulation invariance, and config errors.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/data/tokenizer.hpp"
#include "tessera/train/trainer.hpp"

namespace test_train_trainer {

using namespace tessera;
namespace fs = std::filesystem;

namespace {

fs::path make_corpus(const std::string& name, std::size_t bytes = 20000) {
  std::string text;
  const char* words[] = {"the ",  "cat ", "sat ",  "on ", "a ",
                         "mat, ", "and ", "then ", "it ", "ran.\n"};
  std::uint64_t s = 1;
  while (text.size() < bytes) {
    s = mix64(s);
    text += words[s % 10];
  }
  auto p = fs::temp_directory_path() /
           ("tessera_test_" + name + "_" + std::to_string(::getpid()) + ".tok");
  data::write_token_file(p, data::byte_tokenizer::encode(text), 256, data::token_dtype::u16);
  return p;
}

// Removes the file when the test case ends, pass or fail.
struct temp_file {
  fs::path path;
  ~temp_file() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

nn::llama_config model() {
  auto c = nn::llama_config::tiny();
  c.vocab = 256;
  return c;
}

train::train_config tcfg() {
  train::train_config t;
  t.steps = 6;
  t.global_batch = 4;
  t.micro_batch = 2;
  t.seq = 16;
  t.lr = 3e-3;
  t.warmup = 2;
  t.eval_windows = 8;
  return t;
}

}  // namespace

TEST_CASE("two runs with the same seed replay bit for bit", "[train][determinism]") {
  temp_file corpus{make_corpus("replay")};
  const fs::path& path = corpus.path;
  data::token_file f(path);
  train::trainer<precision::fp32> a(model(), tcfg(), f), b(model(), tcfg(), f);
  for (int s = 0; s < 4; ++s) {
    auto ma = a.train_step(), mb = b.train_step();
    CHECK(ma.loss == mb.loss);
    CHECK(ma.grad_norm == mb.grad_norm);
    CHECK(ma.lr == mb.lr);
  }
  CHECK(a.evaluate() == b.evaluate());
}

TEST_CASE("a run resumed from a checkpoint continues exactly", "[train][checkpoint]") {
  temp_file corpus{make_corpus("resume")};
  const fs::path& path = corpus.path;
  data::token_file f(path);
  auto ck =
      fs::temp_directory_path() / ("tessera_test_resume_" + std::to_string(::getpid()) + ".bin");
  std::vector<double> full;
  {
    train::trainer<precision::bf16_mixed> t(model(), tcfg(), f);
    for (int s = 0; s < 6; ++s) {
      full.push_back(t.train_step().loss);
      if (s == 2) t.save_checkpoint(ck);
    }
  }
  train::trainer<precision::bf16_mixed> r(model(), tcfg(), f);
  r.load_checkpoint(ck);
  CHECK(r.step() == 3);
  for (int s = 3; s < 6; ++s) CHECK(r.train_step().loss == full[static_cast<std::size_t>(s)]);
  // A foreign or truncated checkpoint is refused with the reason.
  { std::ofstream(ck, std::ios::binary | std::ios::trunc) << "not a checkpoint at all"; }
  CHECK_THROWS_WITH(r.load_checkpoint(ck), Catch::Contains("not a tessera checkpoint"));
  // A checkpoint of another configuration is refused naming every
  // differing field at once.
  {
    train::trainer<precision::bf16_mixed> t(model(), tcfg(), f);
    t.save_checkpoint(ck);
    auto other = tcfg();
    other.global_batch = 8;
    other.lr = 0.5;
    other.seed = 99;
    train::trainer<precision::bf16_mixed> u(model(), other, f);
    CHECK_THROWS_WITH(u.load_checkpoint(ck),
                      Catch::Contains("global_batch=4 in the checkpoint, 8 in this run") &&
                          Catch::Contains("lr=") && Catch::Contains("0.5 in this run") &&
                          Catch::Contains("seed=") && Catch::Contains("99 in this run"));
  }
  // More steps than planned: the run continues, its schedule over the new total.
  {
    auto base = tcfg();
    base.warmup = 1;  // below every steps tried here
    train::trainer<precision::bf16_mixed> t(model(), base, f);
    for (int s = 0; s < 3; ++s) t.train_step();
    t.save_checkpoint(ck);
    auto longer = base;
    longer.steps = base.steps + 10;
    train::trainer<precision::bf16_mixed> u(model(), longer, f);
    u.load_checkpoint(ck);
    CHECK(u.step() == 3);
    CHECK(u.train_step().lr == Approx(longer.schedule()(3)));
    auto shorter = base;
    shorter.steps = 2;
    train::trainer<precision::bf16_mixed> v(model(), shorter, f);
    CHECK_THROWS_WITH(v.load_checkpoint(ck), Catch::Contains("has step 3, not in [0, steps=2]"));
  }
  fs::remove(ck);
}

TEST_CASE("each lr schedule resumes exactly, and a checkpoint refuses another schedule",
          "[train][checkpoint][schedule]") {
  temp_file corpus{make_corpus("schedules")};
  data::token_file f(corpus.path);
  const auto ck =
      fs::temp_directory_path() / ("tessera_test_schedules_" + std::to_string(::getpid()) + ".bin");
  using optim::lr_schedule_kind;
  using optim::wsd_cooldown;
  // 8 steps, 2 of warmup, lr 3e-3 to 3e-4; wsd decays over the last
  // round(0.5 x 8) = 4 steps, [4, 8). Each run is saved after step 4 and
  // resumed at step 5, inside wsd's decay window.
  static constexpr double hi = 3e-3, lo = 3e-4;
  struct kind_case {
    const char* name;
    lr_schedule_kind kind;
    optim::wsd_options wsd;
    double (*closed_form)(std::int64_t);  // the lr of step s in [2, 8), from the formula
  };
  const kind_case cases[] = {
      {"wsd, linear cooldown",
       lr_schedule_kind::wsd,
       {0.5, wsd_cooldown::linear},
       [](std::int64_t s) { return s < 4 ? hi : lo + (hi - lo) * (1 - (s - 4) / 4.0); }},
      {"wsd, 1-sqrt cooldown",
       lr_schedule_kind::wsd,
       {0.5, wsd_cooldown::sqrt},
       [](std::int64_t s) { return s < 4 ? hi : lo + (hi - lo) * (1 - std::sqrt((s - 4) / 4.0)); }},
      {"linear",
       lr_schedule_kind::linear,
       {},
       [](std::int64_t s) { return lo + (hi - lo) * (8 - s) / 6.0; }},
      {"inverse_sqrt",
       lr_schedule_kind::inverse_sqrt,
       {},
       [](std::int64_t s) { return hi * std::sqrt(2.0 / static_cast<double>(s + 1)); }},
  };
  const auto config_of = [&](const kind_case& k) {
    auto c = tcfg();
    c.steps = 8;
    c.lr = hi;
    c.min_lr_ratio = 0.1;
    c.lr_schedule = k.kind;
    c.wsd = k.wsd;
    return c;
  };
  for (const kind_case& k : cases) {
    INFO(k.name);
    const train::train_config c = config_of(k);
    std::vector<train::step_metrics> whole;
    {
      train::trainer<precision::fp32> t(model(), c, f);
      for (int s = 0; s < 8; ++s) {
        whole.push_back(t.train_step());
        if (s == 4) t.save_checkpoint(ck);
      }
    }
    // The trainer steps with the schedule it was given (a few roundings
    // from the formula: 1e-14 relative).
    for (std::int64_t s = 2; s < 8; ++s)
      CHECK(whole[static_cast<std::size_t>(s)].lr ==
            Approx(k.closed_form(s)).epsilon(1e-14).margin(0));
    train::trainer<precision::fp32> r(model(), c, f);
    r.load_checkpoint(ck);
    REQUIRE(r.step() == 5);
    for (std::size_t s = 5; s < 8; ++s) {
      const auto m = r.train_step();
      CHECK(m.lr == whole[s].lr);  // bit for bit
      CHECK(m.loss == whole[s].loss);
    }
  }
  // A checkpoint of wsd (linear cooldown, 0.5) is refused by a run of
  // another schedule, cooldown or fraction, the two schedules named.
  const kind_case& wsd = cases[0];
  {
    train::trainer<precision::fp32> t(model(), config_of(wsd), f);
    t.save_checkpoint(ck);
  }
  auto cosine = config_of(wsd);
  cosine.lr_schedule = lr_schedule_kind::cosine;
  cosine.wsd = {};
  train::trainer<precision::fp32> a(model(), cosine, f);
  CHECK_THROWS_WITH(
      a.load_checkpoint(ck),
      Catch::Contains("schedule={\"cooldown\":\"linear\",\"decay_fraction\":0.5,\"min_lr_ratio\":"
                      "0.1,\"name\":\"wsd\"} in the checkpoint, "
                      "{\"min_lr_ratio\":0.1,\"name\":\"cosine\"} in this run"));
  auto sqrt_cooldown = config_of(wsd);
  sqrt_cooldown.wsd.cooldown = wsd_cooldown::sqrt;
  train::trainer<precision::fp32> b(model(), sqrt_cooldown, f);
  CHECK_THROWS_WITH(b.load_checkpoint(ck), Catch::Contains("\"cooldown\":\"sqrt\""));
  auto fraction = config_of(wsd);
  fraction.wsd.decay_fraction = 0.25;
  train::trainer<precision::fp32> d(model(), fraction, f);
  CHECK_THROWS_WITH(d.load_checkpoint(ck), Catch::Contains("\"decay_fraction\":0.25"));
  // More steps than planned: wsd's decay window moves to the new end
  // (round(0.5 x 16) = 8 steps, [8, 16)), so step 5, decaying in the
  // planned run, is back at the peak.
  {
    train::trainer<precision::fp32> t(model(), config_of(wsd), f);
    for (int s = 0; s < 5; ++s) t.train_step();
    t.save_checkpoint(ck);
  }
  auto longer = config_of(wsd);
  longer.steps = 16;
  train::trainer<precision::fp32> u(model(), longer, f);
  u.load_checkpoint(ck);
  REQUIRE(u.step() == 5);
  CHECK(config_of(wsd).schedule()(5) < hi);
  CHECK(u.train_step().lr == hi);
  CHECK(u.train_step().lr == hi);
  fs::remove(ck);
}

TEST_CASE("the loss curve does not depend on the micro-batch size (float64)",
          "[train][accumulation]") {
  temp_file corpus{make_corpus("accum")};
  const fs::path& path = corpus.path;
  data::token_file f(path);
  auto c1 = tcfg(), c2 = tcfg();
  c1.micro_batch = 4;  // one micro-batch per step
  c2.micro_batch = 1;  // four micro-batches per step
  train::trainer<precision::fp64> a(model(), c1, f), b(model(), c2, f);
  for (int s = 0; s < 4; ++s) {
    auto ma = a.train_step(), mb = b.train_step();
    CHECK(ma.loss == Approx(mb.loss).epsilon(1e-12));
    CHECK(ma.grad_norm == Approx(mb.grad_norm).epsilon(1e-10));
  }
}

TEST_CASE("trainer rejects inconsistent settings naming the numbers", "[train][errors]") {
  temp_file corpus{make_corpus("errors", 2000)};
  const fs::path& path = corpus.path;
  data::token_file f(path);
  auto c = tcfg();
  c.global_batch = 6;
  c.micro_batch = 4;
  CHECK_THROWS_WITH((train::trainer<precision::fp32>(model(), c, f)),
                    Catch::Contains("G=6 is not divisible by micro-batch B=4"));
  c = tcfg();
  c.micro_batch = 0;
  CHECK_THROWS_WITH((train::trainer<precision::fp32>(model(), c, f)), Catch::Contains("B=0"));
  c = tcfg();
  c.seq = 5000;
  CHECK_THROWS_AS((train::trainer<precision::fp32>(model(), c, f)), config_error);
}

TEST_CASE("optim::sgd in place of optim::adamw: one template argument, and the loss falls",
          "[train][optim]") {
  temp_file corpus{make_corpus("sgd")};
  data::token_file f(corpus.path);
  auto c = tcfg();
  c.steps = 30;
  c.lr = 0.3;
  c.sgd = {0.9, true, 0.0};  // Nesterov momentum
  train::trainer<precision::fp32, host, optim::sgd> t(model(), c, f);
  const double before = t.evaluate();
  double first = 0, last = 0;
  while (t.step() < c.steps) {
    const auto m = t.train_step();
    if (m.step == 1) first = m.loss;
    last = m.loss;
  }
  // From ~ln(256) = 5.5 nats: the repeated-words corpus is easy.
  CHECK(last < first - 1.0);
  CHECK(t.evaluate() < before - 1.0);
  CHECK(t.optimizer().steps_taken() == c.steps);
  CHECK(t.metadata()["optimizer"] == "sgd");
  CHECK(t.metadata()["sgd"]["nesterov"] == true);
}

TEST_CASE("the first SGD step equals a float64 reference of SGD with momentum and Nesterov",
          "[train][optim]") {
  // One step from the same weights and gradients: the trainer's update is
  // the formula applied to the gradient the model computed, so build both
  // on fp64 and compare parameters to 1e-15 relative.
  temp_file corpus{make_corpus("sgd_ref")};
  data::token_file f(corpus.path);
  auto c = tcfg();
  c.grad_clip = 0;  // no clipping: the raw gradient
  c.warmup = 0;
  c.sgd = {0.9, true, 0.01};
  train::trainer<precision::fp64, host, optim::sgd> t(model(), c, f);
  const std::int64_t n = t.model().flat_size();
  const std::vector<double> p0(t.model().params(), t.model().params() + n);
  t.train_step();
  // The gradient of that step, recomputed on a fresh model with the same
  // weights and the same windows (the sampler is a pure function of the step).
  nn::llama<precision::fp64> m(model());
  m.init_weights(c.seed);
  data::batch_sampler sampler(f, f.split().train, c.micro_batch, c.seq, c.seed);
  std::vector<std::int32_t> w(static_cast<std::size_t>(c.micro_batch * (c.seq + 1)));
  std::int64_t scored = 0;
  std::vector<std::vector<std::int32_t>> mbs;
  for (std::int64_t a = 0; a < c.accum_steps(); ++a) {
    sampler.fill(0, static_cast<std::uint64_t>(a), w.data());
    mbs.push_back(w);
    for (std::int64_t b = 0; b < c.micro_batch; ++b)
      for (std::int64_t k = 1; k <= c.seq; ++k)
        scored += w[static_cast<std::size_t>(b * (c.seq + 1) + k)] != -100;
  }
  for (auto& mb : mbs)
    m.forward_backward(mb.data(), c.micro_batch, c.seq, 1.0 / static_cast<double>(scored));
  const double lr = c.schedule()(0), mu = 0.9, wd = 0.01;
  double worst = 0;
  for (const auto& r : m.param_ranges())
    for (std::int64_t i = r.begin; i < r.end; ++i) {
      const double g = m.grads()[i] + (r.decay ? wd * p0[static_cast<std::size_t>(i)] : 0.0);
      const double buf = g;  // PyTorch: the first buffer is the gradient
      const double want = p0[static_cast<std::size_t>(i)] - lr * (g + mu * buf);  // Nesterov
      const double got = t.model().params()[i];
      worst = std::max(worst, std::abs(got - want) / std::max(std::abs(want), 1e-3));
    }
  CHECK(worst < 1e-14);
}

namespace {
// An optimizer policy of the user's: SGD's state under another name, with
// its hyper-parameters chosen from the train_config by config_from (the
// trainer's hook for policies train_config does not know).
struct half_momentum_sgd : optim::sgd {
  static constexpr const char* name = "half_momentum_sgd";
  static optim::sgd_config config_from(const train::train_config& c) {
    optim::sgd_config s = c.sgd;
    s.momentum = 0.5;
    return s;
  }
};
}  // namespace

TEST_CASE("a user's optimizer policy reaches the trainer through config_from", "[train][optim]") {
  temp_file corpus{make_corpus("user_opt")};
  data::token_file f(corpus.path);
  auto c = tcfg();
  c.lr = 0.1;
  c.sgd = {0.9, false, 0.0};
  train::trainer<precision::fp32, host, half_momentum_sgd> mine(model(), c, f);
  auto ref_cfg = c;
  ref_cfg.sgd.momentum = 0.5;
  train::trainer<precision::fp32, host, optim::sgd> ref(model(), ref_cfg, f);
  while (mine.step() < c.steps) {
    const auto a = mine.train_step(), b = ref.train_step();
    CHECK(a.loss == b.loss);  // the same update, bit for bit
    CHECK(a.grad_norm == b.grad_norm);
  }
  CHECK(mine.metadata()["optimizer"] == "half_momentum_sgd");
  CHECK(mine.metadata()["half_momentum_sgd"]["momentum"] == 0.5);
  // A temporary context would dangle: refused at compile time.
  using tr = train::trainer<precision::fp32, host, optim::adamw, parallel::zero<0>,
                            comm::self_communicator<kernels::host_context>>;
  using one_rank = parallel::layout<comm::self_communicator<kernels::host_context>>;
  static_assert(
      !std::is_constructible_v<tr, nn::llama_config, train::train_config, const data::token_file&,
                               one_rank, parallel::data_parallel_options, kernels::host_context&&>);
  static_assert(
      std::is_constructible_v<tr, nn::llama_config, train::train_config, const data::token_file&,
                              one_rank, parallel::data_parallel_options,
                              const kernels::host_context*>);
  static_assert(!std::is_constructible_v<comm::self_communicator<kernels::host_context>,
                                         kernels::host_context&&>);
}

TEST_CASE("a trainer on a context of its own counts its memory on its own resource", "[train]") {
  // Two trainers in one process (as thread ranks are): each one's figures
  // are its own, and the default resource holds none of their tensors.
  temp_file corpus{make_corpus("own_mr")};
  data::token_file f(corpus.path);
  const std::size_t before = host::default_resource().stats().allocated;
  train::trainer<precision::fp32> a(model(), tcfg(), f);
  const std::size_t one = a.context().resource().stats().allocated;
  train::trainer<precision::fp32> b(model(), tcfg(), f);
  CHECK(&a.context().resource() != &b.context().resource());
  CHECK(&a.context().resource() != &host::default_resource());
  CHECK(b.context().resource().stats().allocated == one);
  CHECK(a.context().resource().stats().allocated == one);
  CHECK(host::default_resource().stats().allocated == before);
  const auto ma = a.train_step();
  CHECK(ma.mem_peak >= ma.mem_allocated);
  CHECK(ma.mem_allocated == a.context().resource().stats().allocated);
  CHECK(b.context().resource().stats().allocated == one);
}

TEST_CASE("llm.c .bin and NumPy .npy inputs train to the losses of the same tokens",
          "[train][data]") {
  // The same ids in three formats: tessera's (vocabulary = largest id + 1,
  // as the other two imply), an llm.c shard and a .npy array.
  temp_file corpus{make_corpus("formats")};
  std::vector<std::uint32_t> ids;
  {
    data::token_file f(corpus.path);
    for (std::uint64_t i = 0; i < f.size(); ++i) ids.push_back(f[i]);
  }
  const std::uint64_t vocab = *std::max_element(ids.begin(), ids.end()) + 1ull;
  const fs::path dir =
      fs::temp_directory_path() / ("tessera_formats_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  data::write_token_file(dir / "a.tok", ids, vocab);
  {
    std::ofstream out(dir / "a.bin", std::ios::binary);
    std::vector<std::int32_t> head(256, 0);
    head[0] = 20240520;
    head[1] = 1;
    head[2] = static_cast<std::int32_t>(ids.size());
    out.write(reinterpret_cast<const char*>(head.data()), 1024);
    for (std::uint32_t v : ids) {
      const auto x = static_cast<std::uint16_t>(v);
      out.write(reinterpret_cast<const char*>(&x), 2);
    }
  }
  {
    std::ofstream out(dir / "a.npy", std::ios::binary);
    std::string dict = "{'descr': '<u4', 'fortran_order': False, 'shape': (" +
                       std::to_string(ids.size()) + ",), }";
    while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
    dict += '\n';
    const auto n = static_cast<std::uint16_t>(dict.size());
    out.write("\x93NUMPY\x01\x00", 8);
    out.write(reinterpret_cast<const char*>(&n), 2);
    out << dict;
    out.write(reinterpret_cast<const char*>(ids.data()),
              static_cast<std::streamsize>(4 * ids.size()));
  }
  auto losses = [&](const fs::path& p) {
    data::token_file f(p);
    CHECK(f.vocab() == vocab);
    auto c = model();
    c.vocab = static_cast<std::int64_t>(f.vocab());
    train::trainer<precision::fp32> t(c, tcfg(), f);
    std::vector<double> l;
    for (int s = 0; s < 3; ++s) l.push_back(t.train_step().loss);
    l.push_back(t.evaluate());
    return l;
  };
  const auto want = losses(dir / "a.tok");
  CHECK(losses(dir / "a.bin") == want);  // bit for bit
  CHECK(losses(dir / "a.npy") == want);
  fs::remove_all(dir);
}

}  // namespace test_train_trainer
