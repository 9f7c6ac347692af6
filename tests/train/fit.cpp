// Tests include/tessera/train/fit.hpp: train::fit adds nothing to the
// arithmetic of the steps it drives (bit for bit against a loop of
// train_step), runs its cadences (evaluation, checkpoints, metrics lines)
// and calls the observers in order, resumes a run folder bit for bit, names
// the step a failure happened in, and samples what generate samples.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/comm/device_mesh.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/data/tokenizer.hpp"
#include "tessera/train/fit.hpp"
#include "tessera/train/stop_signals.hpp"
#include "tessera/train/trainer.hpp"
#include "word_corpus.hpp"

namespace test_train_fit {

using namespace tessera;
namespace fs = std::filesystem;

namespace {

struct temp_dir : train_support::temp_dir {
  temp_dir() : train_support::temp_dir("tessera_fit_") {}
};

fs::path make_corpus(const fs::path& dir) {
  return train_support::write_word_corpus(dir, 1);
}

nn::llama_config model() {
  auto c = nn::llama_config::tiny();
  c.vocab = 256;
  return c;
}

train::train_config config() {
  train::train_config t;
  t.steps = 6;
  t.global_batch = 4;
  t.micro_batch = 2;
  t.seq = 16;
  t.lr = 3e-3;
  t.warmup = 2;
  t.eval_every = 2;
  t.eval_windows = 8;
  return t;
}

// Records every hook call, in order.
struct recorder : train::observer {
  std::vector<std::string> calls;
  std::vector<train::step_metrics> steps;
  std::vector<std::int32_t> sample;
  train::run_end end;
  std::int64_t start_step = -1;
  std::int64_t throw_at_checkpoint = 0;
  std::int64_t signal_at_step = 0;  // sends signal_sent to this process after that step
  int signal_sent = SIGTERM;
  int signal_times = 1;  // raised this many times at once (timeout's pair: 2)
  void on_start(const train::run_start& s) override {
    calls.push_back("start");
    start_step = s.step;
  }
  void on_step(const train::step_metrics& m) override {
    calls.push_back("step " + std::to_string(m.step));
    steps.push_back(m);
    if (m.step == signal_at_step)
      for (int i = 0; i < signal_times; ++i) ::raise(signal_sent);  // handled on this thread before it returns
  }
  void on_checkpoint(std::int64_t step, const fs::path&) override {
    calls.push_back("checkpoint " + std::to_string(step));
    if (step == throw_at_checkpoint) throw io_error("the observer stops the run");
  }
  void on_end(const train::run_end& e) override {
    calls.push_back("end");
    end = e;
  }
  void on_sample(const std::vector<std::int32_t>& t) override {
    calls.push_back("sample");
    sample = t;
  }
};

}  // namespace

TEST_CASE("fit drives the same steps as a loop of train_step, bit for bit, on its cadences",
          "[train][fit]") {
  temp_dir dir;
  const data::token_file f(make_corpus(dir.path));
  train::trainer<precision::fp32> a(model(), config(), f), b(model(), config(), f);
  recorder r;
  train::run_options opt;
  opt.out = dir.path / "run";
  fs::create_directories(opt.out);
  opt.checkpoint_every = 3;
  opt.settings = {{"note", "the settings as given"}};
  const train::run_end end = train::fit(a, opt, {&r});
  // The plain loop, evaluating where fit does (evaluation changes nothing).
  for (std::int64_t s = 1; s <= 6; ++s) {
    const train::step_metrics m = b.train_step();
    const train::step_metrics& got = r.steps[static_cast<std::size_t>(s - 1)];
    CHECK(got.step == s);
    CHECK(got.loss == m.loss);  // bit for bit: fit adds no arithmetic
    CHECK(got.grad_norm == m.grad_norm);
    CHECK(got.lr == m.lr);
    CHECK(got.val_loss.has_value() == (s % 2 == 0));
    if (s % 2 == 0) CHECK(*got.val_loss == b.evaluate(s == 6 ? 0 : -1));
  }
  CHECK(r.calls == std::vector<std::string>{"start", "step 1", "step 2", "step 3", "checkpoint 3",
                                            "step 4", "step 5", "step 6", "checkpoint 6", "end"});
  CHECK(end.val_loss == r.steps.back().val_loss);
  CHECK(!end.diverged);
  CHECK(end.checkpoint == opt.out / "step-000006");
  // Every checkpoint folder kept, each complete (its metadata written last).
  CHECK(fs::exists(opt.out / "step-000003" / "metadata.json"));
  CHECK(fs::exists(opt.out / "step-000006" / "metadata.json"));
  // metrics.jsonl: the settings, then one line per step.
  std::ifstream in(opt.out / "metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  REQUIRE(lines.size() == 7);
  CHECK(lines[0]["config"]["note"] == "the settings as given");
  for (std::size_t i = 1; i < 7; ++i) {
    CHECK(lines[i]["step"] == static_cast<int>(i));
    CHECK(lines[i]["loss"].get<double>() == r.steps[i - 1].loss);
  }
}

TEST_CASE("fit resumes a run folder where it stopped, bit for bit", "[train][fit]") {
  temp_dir dir;
  const data::token_file f(make_corpus(dir.path));
  train::run_options opt;
  opt.out = dir.path / "run";
  fs::create_directories(opt.out);
  opt.checkpoint_every = 3;
  recorder whole;
  {
    train::trainer<precision::fp32> t(model(), config(), f);
    train::run_options w = opt;
    w.out = dir.path / "whole";
    fs::create_directories(w.out);
    train::fit(t, w, {&whole});
  }
  {  // stopped after the step-3 checkpoint (an observer's failure, named with its step)
    train::trainer<precision::fp32> t(model(), config(), f);
    recorder r;
    r.throw_at_checkpoint = 3;
    REQUIRE_THROWS_MATCHES(train::fit(t, opt, {&r}), io_error,
                           Catch::Matchers::Message("step 3 of 6: the observer stops the run"));
  }
  train::trainer<precision::fp32> t(model(), config(), f);
  recorder r;
  train::run_options resumed = opt;
  resumed.resume = opt.out;
  train::fit(t, resumed, {&r});
  CHECK(r.start_step == 3);
  REQUIRE(r.steps.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(r.steps[i].step == whole.steps[i + 3].step);
    CHECK(r.steps[i].loss == whole.steps[i + 3].loss);
    CHECK(r.steps[i].grad_norm == whole.steps[i + 3].grad_norm);
  }
  // The metrics file reads as one run: steps 1..6, each once, and the resume recorded.
  std::ifstream in(opt.out / "metrics.jsonl");
  std::vector<std::int64_t> steps;
  bool resumed_at = false;
  for (std::string l; std::getline(in, l);) {
    const auto j = nlohmann::json::parse(l);
    if (j.contains("step")) steps.push_back(j["step"].get<std::int64_t>());
    resumed_at = resumed_at || (j.contains("resumed_at") && j["resumed_at"] == 3);
  }
  CHECK(steps == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6});
  CHECK(resumed_at);
}

TEST_CASE(
    "fit keeps the newest checkpoint folders, resumes past an interrupted save, and a "
    "fresh run replaces an earlier run's",
    "[train][fit]") {
  temp_dir dir;
  const data::token_file f(make_corpus(dir.path));
  train::run_options opt;
  opt.out = dir.path / "run";
  fs::create_directories(opt.out);
  opt.checkpoint_every = 1;
  opt.keep_checkpoints = 2;
  {
    train::trainer<precision::fp32> t(model(), config(), f);
    train::fit(t, opt);
  }
  std::vector<std::int64_t> kept;
  for (const auto& [step, path] : train::checkpoint_folders(opt.out)) kept.push_back(step);
  CHECK(kept == std::vector<std::int64_t>{5, 6});
  // A save killed before its metadata: never resumed from.
  fs::create_directories(opt.out / "step-000009");
  CHECK(train::resume_checkpoint(opt.out) == opt.out / "step-000006");
  fs::create_directories(dir.path / "nothing");
  CHECK_THROWS_WITH(train::resume_checkpoint(dir.path / "nothing"),
                    Catch::Contains("holds no checkpoint"));
  // A fresh run into the folder: refused, then with overwrite the earlier
  // run's checkpoints go, with the interrupted save's leftovers.
  train::train_config c = config();
  c.steps = 2;
  c.warmup = 1;
  train::trainer<precision::fp32> t(model(), c, f);
  opt.checkpoint_every = 0;
  CHECK_THROWS_MATCHES(
      train::fit(t, opt), config_error,
      Catch::Matchers::Message("opening the run folder failed on world rank 0: run folder '" +
                               opt.out.string() +
                               "' holds the checkpoint of an earlier run (newest: step-000006); "
                               "resume it (run_options::resume) or replace it "
                               "(run_options::overwrite)"));
  CHECK(t.step() == 0);
  CHECK(fs::exists(opt.out / "step-000006" / "metadata.json"));
  opt.overwrite = true;
  train::fit(t, opt);
  kept.clear();
  for (const auto& [step, path] : train::checkpoint_folders(opt.out)) kept.push_back(step);
  CHECK(kept == std::vector<std::int64_t>{2});
  CHECK(!fs::exists(opt.out / "step-000009"));
}

TEST_CASE("fit samples what generate samples, and only samples with sample_only", "[train][fit]") {
  temp_dir dir;
  const data::token_file f(make_corpus(dir.path));
  train::train_config c = config();
  c.steps = 2;
  c.warmup = 1;
  train::trainer<precision::fp32> a(model(), c, f), b(model(), c, f);
  recorder r;
  train::run_options opt;  // no run folder
  opt.prompt = {84, 104, 101, 32};
  opt.sample_tokens = 12;
  train::fit(a, opt, {&r});
  b.train_step();
  b.train_step();
  CHECK(r.sample == b.generate(opt.prompt, 12, 0.8, c.seed));
  CHECK(r.calls.back() == "sample");
  CHECK(!fs::exists(dir.path / "metrics.jsonl"));
  // sample_only: no step, no on_end, the sample of the trainer as it is.
  train::trainer<precision::fp32> s(model(), c, f);
  recorder only;
  opt.sample_only = true;
  train::fit(s, opt, {&only});
  CHECK(only.calls == std::vector<std::string>{"start", "sample"});
  CHECK(s.step() == 0);
}

}  // namespace test_train_fit

namespace test_train_fit {

TEST_CASE("a stop signal ends fit after its step with a checkpoint that resumes bit for bit",
          "[train][fit][signal]") {
  temp_dir dir;
  const data::token_file f(make_corpus(dir.path));
  recorder whole;
  {
    train::trainer<precision::fp32> t(model(), config(), f);
    train::run_options w;
    train::fit(t, w, {&whole});
  }
  train::run_options opt;
  opt.out = dir.path / "run";
  opt.stop_on_signals = true;
  struct sigaction before {}, now {};
  sigaction(SIGINT, nullptr, &before);
  {
    const train::stop_signals outer;  // held across both runs: fit consumes the request
    {
      const train::stop_signals guard;  // a nested guard changes nothing
      train::trainer<precision::fp32> t(model(), config(), f);
      recorder r;
      r.signal_at_step = 4;
      r.signal_sent = SIGINT;
      r.signal_times = 2;  // as `timeout -s INT` delivers it: one request, not two
      const train::run_end e = train::fit(t, opt, {&r});
      CHECK(e.stopped_by == SIGINT);
      CHECK(e.step == 4);
      CHECK(e.checkpoint == opt.out / "step-000004");
      CHECK(r.calls.back() == "end");
      CHECK(r.calls[r.calls.size() - 2] == "checkpoint 4");
    }
    CHECK(train::stop_signals::installed());
    // Still under `outer`: the request was consumed, so this run goes to its end.
    train::trainer<precision::fp32> t(model(), config(), f);
    recorder r;
    train::run_options resumed = opt;
    resumed.resume = opt.out;
    const train::run_end e = train::fit(t, resumed, {&r});
    CHECK(e.stopped_by == 0);
    REQUIRE(r.steps.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {
      CHECK(r.steps[i].step == whole.steps[i + 4].step);
      CHECK(r.steps[i].loss == whole.steps[i + 4].loss);
      CHECK(r.steps[i].grad_norm == whole.steps[i + 4].grad_norm);
      CHECK(r.steps[i].lr == whole.steps[i + 4].lr);
    }
  }
  // The handler is gone with the last guard.
  sigaction(SIGINT, nullptr, &now);
  CHECK(now.sa_handler == before.sa_handler);
  std::vector<std::int64_t> kept;
  for (const auto& [step, path] : train::checkpoint_folders(opt.out)) kept.push_back(step);
  CHECK(kept == std::vector<std::int64_t>{4, 6});
}

TEST_CASE("a stop signal during the last step skips the sample and reports the stop",
          "[train][fit][signal]") {
  temp_dir dir;
  const data::token_file f(make_corpus(dir.path));
  const train::stop_signals guard;
  train::trainer<precision::fp32> t(model(), config(), f);
  recorder r;
  r.signal_at_step = 6;
  train::run_options opt;
  opt.out = dir.path / "run";
  opt.stop_on_signals = true;
  opt.sample_tokens = 8;
  opt.prompt = {1, 2};
  const train::run_end e = train::fit(t, opt, {&r});
  CHECK(e.stopped_by == SIGTERM);
  CHECK(e.step == 6);
  CHECK(e.checkpoint == opt.out / "step-000006");
  CHECK(r.calls.back() == "end");  // no "sample"
  CHECK(train::stop_signals::requested() == 0);  // consumed
}

TEST_CASE("a stop signal seen by one rank stops every rank after the same step",
          "[train][fit][signal]") {
  temp_dir dir;
  const data::token_file f(make_corpus(dir.path));
  using trainer_t = train::trainer<precision::fp32, host, optim::adamw, parallel::zero<1>,
                                   comm::local_communicator, nn::dense_layers>;
  // Two ranks of dp under ZeRO-1: to the end, or stopped by a signal the
  // lead's observer sends after `signal_at` (resumed from `from` if set).
  auto run = [&](const fs::path& out, std::int64_t signal_at, const fs::path& from) {
    std::vector<train::run_end> ends(2);
    recorder r;
    r.signal_at_step = signal_at;
    comm::comm_options o;
    o.timeout = std::chrono::seconds(60);
    comm::local_world::run(
        2,
        [&](comm::local_communicator& world) {
          auto g = comm::make_groups(world, comm::device_mesh(2, 1, 1));
          train::train_config c = config();
          c.dp = 2;
          trainer_t t(model(), c, f, parallel::layout{g.dp, nn::dense_layers{}, g.pp});
          train::run_options opt;
          opt.out = out;
          opt.resume = from;
          opt.stop_on_signals = true;
          ends[static_cast<std::size_t>(world.rank())] = train::fit(t, opt, {&r});
        },
        o);
    return std::make_pair(ends, r);
  };
  const auto [whole_ends, whole] = run(dir.path / "whole", 0, {});
  const train::stop_signals guard;
  const auto [ends, stopped] = run(dir.path / "run", 3, {});
  for (const auto& e : ends) {
    CHECK(e.stopped_by == SIGTERM);
    CHECK(e.step == 3);
  }
  CHECK(fs::exists(dir.path / "run" / "step-000003" / "metadata.json"));
  const auto [resumed_ends, resumed] = run(dir.path / "run", 0, dir.path / "run");
  for (const auto& e : resumed_ends) CHECK(e.step == 6);
  REQUIRE(resumed.steps.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(resumed.steps[i].loss == whole.steps[i + 3].loss);
    CHECK(resumed.steps[i].grad_norm == whole.steps[i + 3].grad_norm);
  }
}

}  // namespace test_train_fit

namespace test_train_fit {

namespace {
std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace

TEST_CASE("asynchronous saves write the same checkpoint folders as synchronous ones",
          "[train][fit][async]") {
  temp_dir dir;
  const data::token_file f(make_corpus(dir.path));
  using trainer_t = train::trainer<precision::fp32, host, optim::adamw, parallel::zero<3>,
                                   comm::local_communicator, nn::dense_layers>;
  // Two ranks of dp under ZeRO-3, a checkpoint every 2 steps.
  auto run = [&](const fs::path& out, bool async) {
    recorder r;
    comm::comm_options o;
    o.timeout = std::chrono::seconds(60);
    comm::local_world::run(
        2,
        [&](comm::local_communicator& world) {
          auto g = comm::make_groups(world, comm::device_mesh(2, 1, 1));
          train::train_config c = config();
          c.dp = 2;
          trainer_t t(model(), c, f, parallel::layout{g.dp, nn::dense_layers{}, g.pp});
          train::run_options opt;
          opt.out = out;
          opt.checkpoint_every = 2;
          opt.async_checkpoints = async;
          train::fit(t, opt, {&r});
        },
        o);
    return r;
  };
  const recorder sync = run(dir.path / "sync", false);
  const recorder async = run(dir.path / "async", true);
  REQUIRE(sync.steps.size() == 6);
  REQUIRE(async.steps.size() == 6);
  for (std::size_t i = 0; i < 6; ++i) CHECK(async.steps[i].loss == sync.steps[i].loss);
  // Each save completes at a later step's start (or the end), in order.
  std::vector<std::string> saves;
  for (const auto& c : async.calls)
    if (c.starts_with("checkpoint")) saves.push_back(c);
  CHECK(saves == std::vector<std::string>{"checkpoint 2", "checkpoint 4", "checkpoint 6"});
  CHECK(async.calls.back() == "end");
  for (const char* step : {"step-000002", "step-000004", "step-000006"})
    for (const char* file : {"metadata.json", "rank-00000.bin", "rank-00001.bin"}) {
      INFO(step << "/" << file);
      const std::string a = file_bytes(dir.path / "async" / step / file);
      CHECK(!a.empty());
      CHECK(a == file_bytes(dir.path / "sync" / step / file));
    }
}

TEST_CASE("a failed background write ends the run at the next step, naming the folder",
          "[train][fit][async]") {
  temp_dir dir;
  const data::token_file f(make_corpus(dir.path));
  train::run_options opt;
  opt.out = dir.path / "run";
  opt.checkpoint_every = 2;
  opt.async_checkpoints = true;
  fs::create_directories(opt.out);
  std::ofstream(opt.out / "step-000002") << "a file where the folder would go";
  train::trainer<precision::fp32> t(model(), config(), f);
  recorder r;
  CHECK_THROWS_MATCHES(
      train::fit(t, opt, {&r}), io_error,
      Catch::Matchers::Predicate<std::exception>(
          [&](const std::exception& e) {
            // At step 3's start if the writer has failed by then, else at
            // the next save (in step 4), which waits for it.
            const std::string m = e.what(),
                              tail = "the checkpoint of step 2: checkpoint save to '" +
                                     (opt.out / "step-000002").string() +
                                     "' failed on world rank 0: cannot create checkpoint folder";
            return m.starts_with(tail) || m.starts_with("step 4 of 6: " + tail);
          },
          "names the step, the folder and the rank"));
  CHECK(r.steps.size() <= 4);  // never past the save that waits for it
  CHECK(!train::holds_checkpoint(opt.out));
}

}  // namespace test_train_fit
