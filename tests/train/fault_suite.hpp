#pragma once
// Fault bodies for train::trainer over a communicator, written once and run
// on threads (tests/train/faults.cpp) and MPI processes (tests/mpi/faults.cpp):
// a failure on one rank ends every rank at once with the same message, and
// ranks started with different settings are refused at construction.
// Bodies throw zero_suite::suite_failure.

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include <tessera/train/trainer.hpp>

#include "trainer_suite.hpp"

namespace fault_suite {

using namespace tessera;
namespace fs = std::filesystem;
using zero_suite::check;

/// Rank 0's checkpoint write fails (its folder is a regular file, as a full
/// disk fails it): every rank throws the same io_error naming the step, the
/// path and world rank 0 within seconds (the communicators' timeout is a
/// minute), and the run goes on: the next step and save work. `dir` is
/// shared by the ranks.
template <class Comm>
void failed_save_ends_every_rank(Comm& c, const fs::path& dir) {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("fault_save", c.rank())};
  data::token_file f(corpus.path);
  const fs::path blocker = dir / "blocker";
  if (c.rank() == 0) std::ofstream(blocker) << "a file where a folder should be";
  c.barrier();
  train::trainer<precision::fp32, host, optim::adamw, parallel::zero<0>, Comm> t(
      trainer_suite::model(), trainer_suite::config(c.size()), f, parallel::layout{c});
  (void)t.train_step();
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    t.save_checkpoint(blocker / "ck.bin");
  } catch (const io_error& e) {
    msg = e.what();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string want = "checkpoint save at step 1 to '" + (blocker / "ck.bin").string() +
                           "' failed on world rank 0: ";
  check(msg.find(want) == 0, "rank ", c.rank(), ": message '", msg, "' does not start with '", want,
        "'");
  check(secs < 10, "rank ", c.rank(), ": the failure took ", secs, " s to arrive");
  (void)t.train_step();  // the communicators are intact: the run can go on
  t.save_checkpoint(dir / "ck.bin");
  check(fs::exists(dir / "ck.bin"), "rank ", c.rank(), ": the second save wrote nothing");
  c.barrier();
}

/// A setting given differently to the last rank (the seed, the step count,
/// the learning rate, the gradient bucket size) is refused on every rank at
/// construction, naming the setting, its value on world rank 0 and on the
/// last rank; a program's own settings likewise (agree_settings), a
/// setting only the last rank holds named.
template <class Comm>
void differing_settings_refused(Comm& c) {
  if (c.size() == 1) return;
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("fault_settings", c.rank())};
  data::token_file f(corpus.path);
  const bool last = c.rank() == c.size() - 1;
  const std::string who = " on world rank 0 but ";
  const std::string tail = " on world rank " + std::to_string(c.size() - 1);
  auto expect = [&](train::train_config t, const std::string& needle) {
    try {
      train::trainer<precision::fp32, host, optim::adamw, parallel::zero<1>, Comm> tr(
          trainer_suite::model(), t, f, parallel::layout{c});
    } catch (const config_error& e) {
      check(std::string(e.what()).find(needle) != std::string::npos, "rank ", c.rank(),
            ": message '", e.what(), "' does not contain '", needle, "'");
      return;
    }
    throw zero_suite::suite_failure("rank " + std::to_string(c.rank()) + ": no config_error for '" +
                                    needle + "'");
  };
  auto t = trainer_suite::config(c.size());
  t.seed = last ? 8 : 7;
  expect(t, "the trainer's settings differ between ranks: seed is 7" + who + "8" + tail);
  t = trainer_suite::config(c.size());
  t.steps = last ? 9 : 4;
  expect(t, "steps is 4" + who + "9" + tail);
  t = trainer_suite::config(c.size());
  t.lr = last ? 1e-3 : 3e-3;
  expect(t, "lr is 0.003" + who + "0.001" + tail);
  t = trainer_suite::config(c.size());
  parallel::data_parallel_options dpo;
  dpo.bucket_bytes = last ? 4096 : 8192;  // buckets of other sizes: collectives of other lengths
  try {
    train::trainer<precision::fp32, host, optim::adamw, parallel::zero<1>, Comm> tr(
        trainer_suite::model(), t, f, parallel::layout{c}, dpo);
    throw zero_suite::suite_failure("rank " + std::to_string(c.rank()) +
                                    ": other bucket sizes accepted");
  } catch (const config_error& e) {
    check(std::string(e.what()).find("bucket_bytes is 8192" + who + "4096" + tail) !=
              std::string::npos,
          "rank ", c.rank(), ": ", e.what());
  }
  // Agreed settings construct, and train.
  train::trainer<precision::fp32, host, optim::adamw, parallel::zero<1>, Comm> ok(
      trainer_suite::model(), trainer_suite::config(c.size()), f, parallel::layout{c});
  (void)ok.train_step();
  // A program's own settings, one of them given to the last rank only: the
  // lists differ in length, and the extra setting is named.
  const nlohmann::json mine =
      last ? nlohmann::json{{"eval", 10}, {"zlast", 1}} : nlohmann::json{{"eval", 10}};
  try {
    ok.agree_settings(mine, "the program's settings");
    throw zero_suite::suite_failure("rank " + std::to_string(c.rank()) +
                                    ": an extra setting accepted");
  } catch (const config_error& e) {
    const std::string want =
        "the program's settings differ between ranks: world rank 0 has no "
        "further setting where world rank " +
        std::to_string(c.size() - 1) + " has zlast=1";
    check(std::string(e.what()).find(want) != std::string::npos, "rank ", c.rank(), ": ", e.what());
  }
  ok.agree_settings(nlohmann::json{{"eval", 10}}, "the program's settings");  // agreed: returns
  (void)ok.train_step();
}

}  // namespace fault_suite
