#pragma once
/// \file tests/fuzz/fuzz_common.hpp
/// What every fuzz target shares: a per-process temporary file for readers
/// that take a path, the rule for a clean refusal (tessera::error and its
/// subclasses only; anything else escapes and libFuzzer reports it), and a
/// cheap file-descriptor leak check.

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "tessera/core/error.hpp"

namespace tessera::fuzz {

/// A folder unique to this process under $TMPDIR (default /tmp), created
/// on first use and removed at exit.
inline const std::filesystem::path& temp_dir() {
  static const std::filesystem::path p = [] {
    const char* d = std::getenv("TMPDIR");
    const std::filesystem::path base = d != nullptr && *d != '\0' ? d : "/tmp";
    auto q = base / ("tessera_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(q);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(temp_dir(), ec);
    });
    return q;
  }();
  return p;
}

/// Writes `n` bytes of `data` to `path` (truncating). Aborts if it cannot:
/// a harness failure, not a finding in the reader.
inline void write_bytes(const std::filesystem::path& path, const std::uint8_t* data, std::size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (n > 0 && std::fwrite(data, 1, n, f) != n) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
}

/// The lowest free file descriptor: equal before and after a call unless the call leaked one.
inline int lowest_free_fd() {
  const int fd = ::dup(0);
  if (fd >= 0) ::close(fd);
  return fd;
}

/// Aborts with `what` when a property of an accepted input does not hold.
#define TESSERA_FUZZ_REQUIRE(cond, what)                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "tessera fuzz: property failed: %s (%s)\n", what, #cond); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

/// Runs `read()`; a tessera::error (io_error, config_error) is a clean
/// refusal and returns false, any other exception propagates (libFuzzer
/// reports an uncaught exception as a crash). Also aborts if the call left a
/// file descriptor open.
template <class Read>
bool accepts(Read&& read) {
  const int fd = lowest_free_fd();
  bool ok = true;
  try {
    read();
  } catch (const tessera::error&) {
    ok = false;
  }
  TESSERA_FUZZ_REQUIRE(lowest_free_fd() == fd, "the reader leaked a file descriptor");
  return ok;
}

}  // namespace tessera::fuzz
