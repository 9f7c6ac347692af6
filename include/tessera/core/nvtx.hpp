#pragma once
/// \file core/nvtx.hpp
/// NVTX ranges, so a profile (`nsys profile --trace=cuda,nvtx ...`) shows
/// which phase of a step each kernel and copy belongs to.
///
///   TESSERA_NVTX_RANGE("optimizer step");             // a fixed name
///   TESSERA_NVTX_RANGE("fwd block ", l);              // "fwd block 3"
///
/// `TESSERA_NVTX_RANGE(parts...)` declares a `tessera::nvtx_range` that
/// lives to the end of the enclosing scope: it pushes a range named by the
/// parts (streamed like `detail::str`) and pops it on scope exit, so nested
/// ranges are balanced whatever way the scope is left (return, exception).
/// Without `TESSERA_WITH_NVTX` the macro expands to `static_cast<void>(0)`:
/// nothing is declared and the parts are not evaluated, so host builds pay
/// nothing. Use it at block scope, followed by `;`.
///
/// `TESSERA_WITH_NVTX` is defined by the `tessera::cuda` CMake target. NVTX3
/// is header-only (`<nvtx3/nvToolsExt.h>` under the CUDA toolkit's include
/// directory; no library to link): without a profiler attached each push and
/// pop is an indirect call to an empty function, a few nanoseconds, and a
/// formatted name costs one string build. Ranges are host-side: they mark
/// when the host issued the work, which nsys lines up with the kernels it
/// launched.
///
/// `nvtx_range` can also be used directly; without `TESSERA_WITH_NVTX` it
/// pushes nothing (its parts are still evaluated, not formatted). Either way
/// it keeps a per-thread depth (`nvtx_range::depth()`) that tests use to
/// check that ranges are balanced.
///
/// ODR: the class lives in an inline namespace named after the mode
/// (`nvtx_on` / `nvtx_off`), so a program that links translation units built
/// with and without `TESSERA_WITH_NVTX` gets two distinct classes, not one
/// class with two definitions. Inline code that uses the macro differs
/// between the modes as code using `assert` differs under NDEBUG: build a
/// program with one setting (every target linking tessera::cuda has it on).
///
/// Source: NVIDIA NVTX3 C API (nvtxRangePushA / nvtxRangePop, thread ranges).

#include <string>

#include "tessera/core/error.hpp"

#if defined(TESSERA_WITH_NVTX)
#if !__has_include(<nvtx3/nvToolsExt.h>)
#error \
    "TESSERA_WITH_NVTX is defined but <nvtx3/nvToolsExt.h> is not found: add the CUDA toolkit's include directory (link tessera::cuda) or undefine TESSERA_WITH_NVTX"
#endif
#include <nvtx3/nvToolsExt.h>
#define TESSERA_NVTX_ENABLED 1
#else
#define TESSERA_NVTX_ENABLED 0
#endif

namespace tessera {

#if TESSERA_NVTX_ENABLED
inline namespace nvtx_on {
#else
inline namespace nvtx_off {
#endif

/// An NVTX thread range, pushed on construction and popped on destruction
/// (RAII; not copyable or movable, so a push is popped exactly once, on the
/// thread that pushed it). See the file comment for the macro form.
class nvtx_range {
 public:
  /// Whether ranges reach NVTX in this translation unit (TESSERA_WITH_NVTX).
  static constexpr bool enabled = TESSERA_NVTX_ENABLED != 0;

  /// Pushes a range named `name` (NVTX copies the string). Never throws.
  explicit nvtx_range(const char* name) noexcept {
#if TESSERA_NVTX_ENABLED
    nvtxRangePushA(name);
#else
    (void)name;
#endif
    ++depth_ref();
  }
  /// Pushes a range named `name`. Never throws.
  explicit nvtx_range(const std::string& name) noexcept : nvtx_range(name.c_str()) {}
  /// Pushes a range named by the streamed parts, e.g. ("fwd block ", 3) ->
  /// "fwd block 3". Throws only what building the string throws (bad_alloc).
  template <class... Parts>
  requires(sizeof...(Parts) >= 2) explicit nvtx_range(const Parts&... parts) {
#if TESSERA_NVTX_ENABLED
    const std::string name = detail::str(parts...);
    nvtxRangePushA(name.c_str());
#else
    ((void)parts, ...);
#endif
    ++depth_ref();
  }
  ~nvtx_range() {
#if TESSERA_NVTX_ENABLED
    nvtxRangePop();
#endif
    --depth_ref();
  }
  nvtx_range(const nvtx_range&) = delete;
  nvtx_range& operator=(const nvtx_range&) = delete;

  /// Ranges of this class open on the calling thread now (0 when every
  /// range has been popped).
  static int depth() noexcept {
    return depth_ref();
  }

 private:
  static int& depth_ref() noexcept {
    thread_local int d = 0;
    return d;
  }
};

}  // namespace nvtx_on / nvtx_off
}  // namespace tessera

#define TESSERA_NVTX_CONCAT_IMPL(a, b) a##b
#define TESSERA_NVTX_CONCAT(a, b) TESSERA_NVTX_CONCAT_IMPL(a, b)

#if TESSERA_NVTX_ENABLED
/// A range from here to the end of the enclosing scope, named by the
/// streamed `parts` (file comment). Compiles to nothing without TESSERA_WITH_NVTX.
#define TESSERA_NVTX_RANGE(...) \
  const ::tessera::nvtx_range TESSERA_NVTX_CONCAT(tessera_nvtx_range_, __COUNTER__)(__VA_ARGS__)
#else
/// A range from here to the end of the enclosing scope, named by the
/// streamed `parts` (file comment). Compiles to nothing without TESSERA_WITH_NVTX.
#define TESSERA_NVTX_RANGE(...) static_cast<void>(0)
#endif
