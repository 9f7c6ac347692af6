#pragma once
/// \file train/run_folder.hpp
/// A run folder's life (the `out` of train::fit, train_llama's --out), as
/// users of Megatron-LM and torchtitan expect it:
///
///   runs/main/
///     .lock              held by the run that uses the folder (run_folder_lock)
///     step-000100/       a checkpoint folder (train/checkpoint_folder.hpp);
///     step-000200/       complete once its metadata.json is written
///     metrics.jsonl, run.toml, ...
///
/// - One run at a time: run_folder_lock holds an exclusive flock(2) on
///   `out`/.lock for the run's life. The kernel releases it when the
///   process ends, however it ends, so a killed run's successor takes it
///   at once; the file names its holder (pid, host, start time) for the
///   refusal.
/// - A fresh run does not silently replace a checkpointed run:
///   check_fresh_run refuses a folder that holds a checkpoint unless the
///   run overwrites it (then remove_checkpoints clears the earlier run's).
/// - Resuming picks the newest complete checkpoint (resume_checkpoint);
///   keep_newest_checkpoints keeps the last N.

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/train/checkpoint_io.hpp"

namespace tessera::train {

/// The name of the checkpoint folder of `step` in a run folder: step-000200.
inline std::string checkpoint_folder_name(std::int64_t step) {
  char b[40];
  std::snprintf(b, sizeof b, "step-%06lld", static_cast<long long>(step));
  return b;
}

/// The complete checkpoint folders (with metadata.json) of run folder
/// `out`, by step, oldest first. Folders of other names and incomplete
/// saves are left out.
inline std::vector<std::pair<std::int64_t, std::filesystem::path>> checkpoint_folders(
    const std::filesystem::path& out) {
  std::vector<std::pair<std::int64_t, std::filesystem::path>> v;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() < 6 || n.compare(0, 5, "step-") != 0) continue;
    if (n.find_first_not_of("0123456789", 5) != std::string::npos || n.size() > 5 + 12) continue;
    if (!std::filesystem::exists(e.path() / checkpoint_metadata_name, ec)) continue;
    v.emplace_back(std::stoll(n.substr(5)), e.path());
  }
  std::sort(v.begin(), v.end());
  return v;
}

/// The checkpoint a run folder resumes from: its newest complete
/// checkpoint folder, else the single file of earlier versions
/// (`run`/checkpoint.bin). Throws io_error naming the folder when it does
/// not exist, is itself a checkpoint folder (naming its run folder), or
/// holds neither (a folder whose every save was interrupted included).
inline std::filesystem::path resume_checkpoint(const std::filesystem::path& run) {
  std::error_code ec;
  TESSERA_THROW_IF(!std::filesystem::is_directory(run, ec), io_error, "run folder '", run.string(),
                   "' does not exist");
  TESSERA_THROW_IF(std::filesystem::exists(run / checkpoint_metadata_name, ec), io_error, "'",
                   run.string(), "' is a checkpoint folder, not a run folder: resume its run "
                   "folder '", run.parent_path().string(), "' (its newest checkpoint)");
  const auto all = checkpoint_folders(run);
  if (!all.empty()) return all.back().second;
  const std::filesystem::path legacy = run / "checkpoint.bin";
  TESSERA_THROW_IF(!std::filesystem::exists(legacy), io_error, "run folder '", run.string(),
                   "' holds no checkpoint: no step-NNNNNN folder with its ",
                   checkpoint_metadata_name, " (an interrupted save has none), no checkpoint.bin");
  return legacy;
}

/// Removes the complete checkpoint folders of `out` but the newest `keep`
/// (keep >= 1). Errors are ignored (a folder left over is harmless).
inline void keep_newest_checkpoints(const std::filesystem::path& out, int keep) {
  auto all = checkpoint_folders(out);
  for (std::size_t i = 0; i + static_cast<std::size_t>(std::max(keep, 1)) < all.size(); ++i) {
    std::error_code ec;
    std::filesystem::remove_all(all[i].second, ec);
  }
}

/// True when run folder `out` holds a checkpoint a run could resume: a
/// complete checkpoint folder or the checkpoint.bin of earlier versions.
inline bool holds_checkpoint(const std::filesystem::path& out) {
  std::error_code ec;
  return !checkpoint_folders(out).empty() || std::filesystem::exists(out / "checkpoint.bin", ec);
}

/// Refuses a fresh run (one that does not resume `out` itself) into run
/// folder `out` when it holds a checkpoint, unless `overwrite`: that run's
/// checkpoints would be replaced, and a later resume would mix the two
/// runs. `how` names the ways on ("set run_options::resume ..."). Throws
/// config_error naming the folder and its newest checkpoint.
inline void check_fresh_run(const std::filesystem::path& out, bool overwrite,
                            std::string_view how) {
  if (overwrite || !holds_checkpoint(out)) return;
  const auto all = checkpoint_folders(out);
  const std::string newest =
      all.empty() ? "checkpoint.bin" : all.back().second.filename().string();
  throw config_error(tessera::detail::str("run folder '", out.string(),
                                          "' holds the checkpoint of an earlier run (newest: ",
                                          newest, "); ", how));
}

/// Removes the checkpoints of run folder `out`: every step-NNNNNN folder,
/// complete or not, and checkpoint.bin (a fresh run that overwrites the
/// folder). Throws io_error naming what cannot be removed.
inline void remove_checkpoints(const std::filesystem::path& out) {
  std::error_code ec;
  std::vector<std::filesystem::path> gone;
  for (const auto& e : std::filesystem::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 5 && n.compare(0, 5, "step-") == 0 &&
        n.find_first_not_of("0123456789", 5) == std::string::npos && e.is_directory())
      gone.push_back(e.path());
  }
  if (std::filesystem::exists(out / "checkpoint.bin", ec)) gone.push_back(out / "checkpoint.bin");
  for (const auto& p : gone) {
    std::filesystem::remove_all(p, ec);
    TESSERA_THROW_IF(ec, io_error, "cannot remove the earlier run's checkpoint '", p.string(),
                     "': ", ec.message());
  }
}

/// The name of a run folder's lock file.
inline constexpr const char* run_lock_name = ".lock";

/// One run in a run folder at a time (file comment): an exclusive,
/// non-blocking flock(2) on `out`/.lock, held until destruction (or the
/// process's end). On a file system without flock (some parallel file
/// systems return ENOLCK or EOPNOTSUPP) it warns once on stderr and holds
/// nothing. Not copyable.
class run_folder_lock {
 public:
  /// Takes the lock of existing folder `out`. Throws config_error naming
  /// the holder when another run holds it, io_error when the lock file
  /// cannot be opened.
  explicit run_folder_lock(const std::filesystem::path& out) {
    const std::filesystem::path p = out / run_lock_name;
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    TESSERA_THROW_IF(fd_ < 0, io_error, "cannot open the run folder's lock '", p.string(),
                     "': ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      record_holder();
      return;
    }
    const int e = errno;
    if (e == EWOULDBLOCK) {
      const std::string who = holder();
      ::close(fd_);
      fd_ = -1;
      throw config_error(tessera::detail::str(
          "run folder '", out.string(), "' is in use by another run", who.empty() ? "" : " (",
          who, who.empty() ? "" : ")", ": wait for it to end, or give another folder"));
    }
    std::fprintf(stderr,
                 "tessera: warning: cannot lock run folder '%s' (%s): nothing keeps a second run "
                 "out of it\n",
                 out.c_str(), std::strerror(e));
    ::close(fd_);
    fd_ = -1;
  }
  ~run_folder_lock() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
  }
  run_folder_lock(const run_folder_lock&) = delete;
  run_folder_lock& operator=(const run_folder_lock&) = delete;

  /// True when the lock is held (false where the file system has none).
  bool held() const { return fd_ >= 0; }

 private:
  // "pid 1234 on host h since 2026-12-06 19:40:01 UTC", for a refused run.
  void record_holder() {
    char host[256] = "?";
    ::gethostname(host, sizeof host - 1);
    const std::time_t now = std::time(nullptr);
    char when[32] = "";
    std::tm tm{};
    if (::gmtime_r(&now, &tm)) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    const std::string t =
        tessera::detail::str("pid ", static_cast<long>(::getpid()), " on host ", host, " since ", when);
    // Best effort: the lock holds without the note.
    if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, t.data(), t.size(), 0);
  }
  std::string holder() const {
    char b[512];
    const ssize_t n = ::pread(fd_, b, sizeof b - 1, 0);
    std::string t(b, n > 0 ? static_cast<std::size_t>(n) : 0);
    t.erase(std::remove_if(t.begin(), t.end(), [](char c) { return c < 0x20 || c == 0x7f; }),
            t.end());
    return t;
  }
  int fd_ = -1;
};

}  // namespace tessera::train
