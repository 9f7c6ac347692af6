#pragma once
/// \file core/file.hpp
/// Writing a file so that a reader never sees half of it: a temporary name
/// beside it, flushed to disk, renamed over the target.

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
    TESSERA_THROW_IF(ec, io_error, "cannot rename '", tmp, "' to '", path.string(), "': ",
                     ec.message());
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
      std::forward<Source>(src)...,
      [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        TESSERA_THROW_IF(depth > json_max_depth, io_error, what, ": JSON nested deeper than ",
                         json_max_depth, " levels");
        return true;
      });
}

/// Writes `j` to `path` as indented JSON, atomically (write_file_atomically).
/// Throws io_error as write_file_atomically.
inline void write_json_file(const std::filesystem::path& path, const nlohmann::json& j) {
  const std::string s = j.dump(2) + "\n";
  write_file_atomically(path, [&](std::ofstream& out) {
    out.write(s.data(), static_cast<std::streamsize>(s.size()));
  });
}

}  // namespace tessera
