#pragma once
/// \file core/file.hpp
/// Files: writing one so that a reader never sees half of it (a temporary
/// name beside it, flushed to disk, renamed over the target), depth-bounded
/// JSON, the temporaries a killed writer left, the paths a failed program
/// created, and the files tessera ships (find_resource).

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"

namespace tessera {

/// The temporary name write_file_atomically writes `path` under:
/// `path.tmp.<pid>.<thread hash>`, unique per process and thread.
inline std::filesystem::path atomic_temporary_of(const std::filesystem::path& path) {
  return path.string() + ".tmp." + std::to_string(::getpid()) + "." +
         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
}

/// Writes `path` atomically: `fill(std::ofstream&)` writes the bytes to
/// atomic_temporary_of(path) in the same folder, which is flushed,
/// fsync'ed, renamed over `path`, and the folder fsync'ed. On any failure
/// (fill throwing included) the temporary is removed, `path` is left as it
/// was, and io_error names the file and the reason.
template <class Fill>
void write_file_atomically(const std::filesystem::path& path, Fill&& fill) {
  const std::string tmp = atomic_temporary_of(path).string();
  errno = 0;
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      TESSERA_THROW_IF(!out, io_error, "cannot create '", tmp, "' to write '", path.string(),
                       "': ", std::strerror(errno));
      fill(out);
      out.flush();
      const int e = errno;  // iostreams keep no error code; the last system call's, if any
      TESSERA_THROW_IF(!out, io_error, "writing '", tmp, "' (for '", path.string(), "') failed",
                       e != 0 ? std::string(": ") + std::strerror(e) : std::string());
      out.close();
      TESSERA_THROW_IF(out.fail(), io_error, "closing '", tmp, "' (for '", path.string(),
                       "') failed");
    }
    const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    const bool synced = fd >= 0 && ::fsync(fd) == 0;
    const int e = errno;
    if (fd >= 0) ::close(fd);
    TESSERA_THROW_IF(!synced, io_error, "cannot flush '", tmp, "' to disk: ", std::strerror(e));
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    TESSERA_THROW_IF(ec, io_error, "cannot rename '", tmp, "' to '", path.string(),
                     "': ", ec.message());
    const auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

/// The deepest nesting a JSON file tessera reads (a safetensors header, a
/// Hugging Face config.json or tokenizer.json) may have: theirs is at most 4; a bound
/// keeps a crafted file from exhausting memory or, in a message, the stack.
inline constexpr int json_max_depth = 16;

/// Parses JSON from [first, last) (or a stream) refusing nesting deeper than
/// json_max_depth. Throws nlohmann::json::exception as parse() does, and
/// io_error for the depth, naming `what`.
template <class... Source>
nlohmann::json parse_json_bounded(const std::string& what, Source&&... src) {
  return nlohmann::json::parse(
      std::forward<Source>(src)..., [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        TESSERA_THROW_IF(depth > json_max_depth, io_error, what, ": JSON nested deeper than ",
                         json_max_depth, " levels");
        return true;
      });
}

/// Reads the JSON file `path` (parse_json_bounded). Throws io_error naming
/// `what` and the path when the file cannot be opened ("is missing") or is
/// not JSON (with the parser's message).
inline nlohmann::json read_json_file(const std::filesystem::path& path, const std::string& what) {
  std::ifstream in(path);
  TESSERA_THROW_IF(!in, io_error, what, " '", path.string(), "' is missing");
  try {
    return parse_json_bounded(path.string(), in);
  } catch (const nlohmann::json::exception& e) {
    throw io_error(what + " '" + path.string() + "' is not JSON: " + e.what());
  }
}

/// Writes `j` to `path` as indented JSON, atomically (write_file_atomically).
/// Throws io_error as write_file_atomically.
inline void write_json_file(const std::filesystem::path& path, const nlohmann::json& j) {
  const std::string s = j.dump(2) + "\n";
  write_file_atomically(path, [&](std::ofstream& out) {
    out.write(s.data(), static_cast<std::streamsize>(s.size()));
  });
}

/// Removes the temporaries of write_file_atomically in `dir`
/// (NAME.tmp.<pid>.<thread hash>, digits only after ".tmp.") whose process
/// no longer runs (a killed run's); a live process's are another run's and
/// stay, and any other name (a user's "results.tmp.2024.csv") is not ours.
/// Errors are ignored.
inline void remove_stale_temporaries(const std::filesystem::path& dir) {
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    const std::size_t at = n.find(".tmp.");
    if (at == std::string::npos) continue;
    const std::string rest = n.substr(at + 5);
    const std::size_t dot = rest.find('.');
    const std::string pid = rest.substr(0, dot);
    const std::string hash = dot == std::string::npos ? "" : rest.substr(dot + 1);
    auto digits = [](const std::string& d) {
      return !d.empty() && d.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!digits(pid) || !digits(hash) || pid.size() > 9) continue;
    if (!std::filesystem::exists(std::filesystem::path("/proc") / pid, ec))
      stale.push_back(e.path());
  }
  for (const auto& p : stale) std::filesystem::remove(p, ec);
}

/// Files and folders a program created, removed again (latest first) when
/// it is destroyed before keep() (a run that fails on bad input leaves
/// nothing partial behind).
class created_paths {
 public:
  created_paths() = default;
  created_paths(const created_paths&) = delete;
  created_paths& operator=(const created_paths&) = delete;
  ~created_paths() {
    if (keep_) return;
    std::error_code ec;
    for (auto it = paths_.rbegin(); it != paths_.rend(); ++it) std::filesystem::remove(*it, ec);
  }
  /// Records `p` as created by this program.
  void add(const std::filesystem::path& p) { paths_.push_back(p); }
  /// From now on everything recorded stays.
  void keep() { keep_ = true; }

 private:
  std::vector<std::filesystem::path> paths_;
  bool keep_ = false;
};

/// Creates folder `dir` and every missing folder above it, recording each
/// in `created`. Throws io_error naming `what` (the folder's name for the
/// user, "--out") and the path: when an existing part of it is not a
/// folder, or it cannot be created.
inline void create_folders(const std::filesystem::path& dir, created_paths& created,
                           const std::string& what = "folder") {
  std::error_code ec;
  std::vector<std::filesystem::path> missing;
  std::filesystem::path p = std::filesystem::absolute(dir);
  for (; !std::filesystem::exists(p, ec) && p.has_parent_path() && p != p.parent_path();
       p = p.parent_path())
    missing.push_back(p);
  TESSERA_THROW_IF(!std::filesystem::is_directory(p, ec), io_error, what, " '", dir.string(),
                   "': '", p.string(), "' is not a folder");
  std::filesystem::create_directories(dir, ec);
  TESSERA_THROW_IF(ec || !std::filesystem::is_directory(dir), io_error, "cannot create ", what,
                   " '", dir.string(), "'", ec ? ": " + ec.message() : std::string());
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) created.add(*it);
}

/// The first of the places a file `rel` shipped with tessera
/// (data/fortunes.txt, scripts/ngram_baseline.py) may be: the current
/// folder, the executable's folder and up to three above it (a build tree:
/// build/host/examples/), and PREFIX/share/tessera beside an installed
/// bin/. No path of the build machine is compiled in. Returns "" when none
/// holds it; `tried` (when given) lists the places.
inline std::filesystem::path find_resource(const std::string& rel, std::string* tried = nullptr) {
  std::vector<std::filesystem::path> places{std::filesystem::current_path()};
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    std::filesystem::path d = exe.parent_path();
    for (int up = 0; up < 4 && !d.empty(); ++up, d = d.parent_path()) places.push_back(d);
    places.push_back(exe.parent_path().parent_path() / "share" / "tessera");
  }
  for (const auto& p : places) {
    if (tried) *tried += (tried->empty() ? "" : ", ") + (p / rel).string();
    if (std::filesystem::exists(p / rel, ec)) return p / rel;
  }
  return {};
}

}  // namespace tessera
