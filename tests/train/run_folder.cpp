// Tests include/tessera/train/run_folder.hpp and train/stop_signals.hpp: one
// run in a run folder at a time (the lock refuses a second holder, names
// the first, and passes to a killed holder's successor), a fresh run does
// not replace a checkpointed run unless it overwrites it, and the stop
// signals (the first asks, the second ends the process with the signal's
// default action). The processes that hold a lock or take a signal are
// forked children, so this process's state is never at stake.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tessera/train/run_folder.hpp"
#include "tessera/train/stop_signals.hpp"
#include "word_corpus.hpp"

namespace test_train_run_folder {

using namespace tessera;
namespace fs = std::filesystem;

namespace {

struct temp_dir : train_support::temp_dir {
  temp_dir() : train_support::temp_dir("tessera_run_folder_") {}
};

// A complete checkpoint folder as far as the run folder's rules go: one
// with its metadata file (or without, an interrupted save).
void fake_checkpoint(const fs::path& out, std::int64_t step, bool complete = true) {
  const fs::path d = out / train::checkpoint_folder_name(step);
  fs::create_directories(d);
  std::ofstream(d / "rank-00000.bin") << "x";
  if (complete) std::ofstream(d / train::checkpoint_metadata_name) << "{}";
}

// Forks a child that runs `f` and exits with its status; returns waitpid's status.
template <class F>
int in_child(F&& f) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(f());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

}  // namespace

TEST_CASE("a run folder's lock admits one run, names it, and passes on when it dies",
          "[train][run_folder]") {
  temp_dir dir;
  {
    train::run_folder_lock a(dir.path);
    CHECK(a.held());
    // A second holder, even in this process (flock is per open file).
    CHECK_THROWS_MATCHES(
        train::run_folder_lock(dir.path), config_error,
        Catch::Matchers::Predicate<std::exception>(
            [&](const std::exception& e) {
              const std::string m = e.what();
              return m.starts_with("run folder '" + dir.path.string() +
                                   "' is in use by another run (pid " +
                                   std::to_string(::getpid()) + " on host ") &&
                     m.ends_with(" UTC): wait for it to end, or give another folder");
            },
            "names the holder"));
  }
  train::run_folder_lock again(dir.path);  // released with its holder
  CHECK(again.held());
}

TEST_CASE("a killed run's lock is free for its successor", "[train][run_folder]") {
  temp_dir dir;
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t holder = ::fork();
  REQUIRE(holder >= 0);
  if (holder == 0) {
    train::run_folder_lock l(dir.path);
    (void)!::write(ready[1], "1", 1);
    ::pause();  // until SIGKILL
    ::_exit(0);
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  CHECK_THROWS_WITH(train::run_folder_lock(dir.path),
                    Catch::Contains("(pid " + std::to_string(holder) + " on host "));
  ::kill(holder, SIGKILL);  // no unwinding: the kernel releases the flock
  int status = 0;
  ::waitpid(holder, &status, 0);
  CHECK(WIFSIGNALED(status));
  train::run_folder_lock successor(dir.path);
  CHECK(successor.held());
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_CASE("a fresh run into a checkpointed folder is refused unless it overwrites it",
          "[train][run_folder]") {
  temp_dir dir;
  const fs::path out = dir.path / "run";
  CHECK_NOTHROW(train::check_fresh_run(out, false, "x"));  // no folder yet
  fs::create_directories(out);
  fake_checkpoint(out, 7, false);  // an interrupted save only: nothing to resume
  CHECK(!train::holds_checkpoint(out));
  CHECK_NOTHROW(train::check_fresh_run(out, false, "x"));
  fake_checkpoint(out, 3);
  fake_checkpoint(out, 12);
  CHECK(train::holds_checkpoint(out));
  CHECK_THROWS_MATCHES(train::check_fresh_run(out, false, "give --resume to continue it"),
                       config_error,
                       Catch::Matchers::Message("run folder '" + out.string() +
                                                "' holds the checkpoint of an earlier run "
                                                "(newest: step-000012); give --resume to continue "
                                                "it"));
  CHECK_NOTHROW(train::check_fresh_run(out, true, "x"));
  CHECK(train::resume_checkpoint(out) == out / "step-000012");
  // A checkpoint folder given as the run folder, or no folder: named.
  CHECK_THROWS_WITH(train::resume_checkpoint(out / "step-000012"),
                    Catch::Contains("is a checkpoint folder, not a run folder: resume its run "
                                    "folder '" + out.string() + "'"));
  CHECK_THROWS_WITH(train::resume_checkpoint(dir.path / "nowhere"),
                    Catch::Contains("run folder '" + (dir.path / "nowhere").string() +
                                    "' does not exist"));
  std::ofstream(out / "metrics.jsonl") << "{}\n";
  train::remove_checkpoints(out);  // what overwrite does: every step folder, complete or not
  CHECK(!train::holds_checkpoint(out));
  CHECK(!fs::exists(out / "step-000007"));
  CHECK(fs::exists(out / "metrics.jsonl"));  // the rest is the run's to replace
  // The single file of earlier versions counts as a checkpoint too.
  std::ofstream(out / "checkpoint.bin") << "x";
  CHECK_THROWS_WITH(train::check_fresh_run(out, false, "x"),
                    Catch::Contains("(newest: checkpoint.bin)"));
  train::remove_checkpoints(out);
  CHECK(!fs::exists(out / "checkpoint.bin"));
}

TEST_CASE("keep_newest_checkpoints keeps the newest complete folders", "[train][run_folder]") {
  temp_dir dir;
  for (std::int64_t s : {2, 4, 6, 8}) fake_checkpoint(dir.path, s);
  fake_checkpoint(dir.path, 10, false);
  train::keep_newest_checkpoints(dir.path, 2);
  std::vector<std::int64_t> kept;
  for (const auto& [step, path] : train::checkpoint_folders(dir.path)) kept.push_back(step);
  CHECK(kept == std::vector<std::int64_t>{6, 8});
  CHECK(fs::exists(dir.path / "step-000010"));  // not counted, not removed
}

TEST_CASE("the first stop signal asks, a second a second later ends the process", "[train][signal]") {
  // One signal: recorded, the process goes on (exit 7 by its own hand).
  for (int sig : {SIGINT, SIGTERM}) {
    const int once = in_child([sig] {
      const train::stop_signals guard;
      ::kill(::getpid(), sig);
      return train::stop_signals::requested() == sig ? 7 : 1;
    });
    CHECK(WIFEXITED(once));
    CHECK(WEXITSTATUS(once) == 7);
    // Two at once (`timeout -s INT` delivers its signal to the process and
    // to its group): one request, the process goes on.
    const int pair = in_child([sig] {
      const train::stop_signals guard;
      ::kill(::getpid(), sig);
      ::kill(::getpid(), sig);
      return train::stop_signals::requested() == sig ? 7 : 1;
    });
    CHECK(WIFEXITED(pair));
    CHECK(WEXITSTATUS(pair) == 7);
    // A second one more than a second later takes the default action,
    // ending the process by it.
    const int twice = in_child([sig] {
      const train::stop_signals guard;
      ::kill(::getpid(), sig);
      std::this_thread::sleep_for(std::chrono::milliseconds(1100));
      ::kill(::getpid(), sig);
      return 1;
    });
    CHECK(WIFSIGNALED(twice));
    CHECK(WTERMSIG(twice) == sig);
    // A consumed request re-arms: the next signal asks again.
    const int rearmed = in_child([sig] {
      const train::stop_signals guard;
      ::kill(::getpid(), sig);
      train::stop_signals::consume();
      ::kill(::getpid(), sig);
      return train::stop_signals::requested() == sig ? 7 : 1;
    });
    CHECK(WIFEXITED(rearmed));
    CHECK(WEXITSTATUS(rearmed) == 7);
  }
  // Without a guard the dispositions are the program's again (here the
  // test runner's own handlers).
  struct sigaction before {}, during {}, after {};
  sigaction(SIGTERM, nullptr, &before);
  {
    const train::stop_signals guard;
    CHECK(train::stop_signals::installed());
    sigaction(SIGTERM, nullptr, &during);
  }
  sigaction(SIGTERM, nullptr, &after);
  CHECK(!train::stop_signals::installed());
  CHECK(during.sa_handler != before.sa_handler);
  CHECK(after.sa_handler == before.sa_handler);
}

}  // namespace test_train_run_folder
