#pragma once
/// \file error.hpp
/// `tessera::error` and the check macros (STYLE.md, "Errors").
///
/// Host run-time failures throw `tessera::error` (or a subclass) whose message
/// names the value, the limit and the fix. Library headers never call exit()
/// or abort() on a recoverable error.

#include <sstream>
#include <stdexcept>
#include <string>

#include "tessera/core/config.hpp"

namespace tessera {

/// Base class of every exception tessera throws.
class error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// A value supplied by the user (a size, a degree, a flag) is out of range or
/// inconsistent with another value. Example programs map it to exit status 2.
class config_error : public error {
public:
  using error::error;
};

/// A file is missing, unreadable, truncated or of the wrong kind.
class io_error : public error {
public:
  using error::error;
};

/// An allocation failed (host or device memory): the message names the
/// bytes asked for and what the resource held. Programs map it to exit
/// status 2 and name the settings that drove it.
class out_of_memory : public error {
public:
  using error::error;
};

/// A collective failed: timed out, mismatched, or a peer died.
class comm_error : public error {
public:
  using error::error;
};

namespace detail {

/// Streams every argument into one string: `str("tp=", 3, " does not divide ", 8)`.
template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] inline void throw_check_failed(const char* cond, const char* file, int line,
                                            const std::string& msg) {
  throw error(str(msg, " (check `", cond, "` failed at ", file, ":", line, ")"));
}

}  // namespace detail
}  // namespace tessera

/// Throws `ErrorType` with the streamed message if `cond` is false. Always on.
/// Usage: `TESSERA_THROW_IF(tp == 0, config_error, "tp=", tp, " must be >= 1")`.
#define TESSERA_THROW_IF(cond, ErrorType, ...)                      \
  do {                                                              \
    if (cond) throw ErrorType(::tessera::detail::str(__VA_ARGS__)); \
  } while (0)

/// Throws `tessera::error` naming the condition and location if it is false.
/// Always on (use for checks of user input on the host).
#define TESSERA_CHECK(cond, ...)                                                       \
  do {                                                                                 \
    if (!(cond))                                                                       \
      ::tessera::detail::throw_check_failed(#cond, __FILE__, __LINE__,                 \
                                            ::tessera::detail::str(__VA_ARGS__));      \
  } while (0)

/// Contract check (Kokkos' KOKKOS_EXPECTS): on in debug builds and tests, off
/// under NDEBUG. On the device it traps; on the host it throws tessera::error.
#if TESSERA_ENABLE_CONTRACTS
#if defined(__CUDA_ARCH__)
#define TESSERA_EXPECTS(cond, msg) \
  do {                             \
    if (!(cond)) __trap();         \
  } while (0)
#else
#define TESSERA_EXPECTS(cond, msg) TESSERA_CHECK(cond, msg)
#endif
#else
#define TESSERA_EXPECTS(cond, msg) \
  do {                             \
  } while (0)
#endif
