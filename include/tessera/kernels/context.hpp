#pragma once
/// \file kernels/context.hpp
/// Execution contexts (DESIGN.md, "Seams"): what a kernel needs besides its
/// operands, passed explicitly as the first argument of every kernel entry
/// point. Each kernel family has one entry point per operation, overloaded
/// on the context with the same argument order and meaning on every
/// backend (Thrust dispatches on its execution policy the same way): the
/// `host_context` overload runs the CBLAS/OpenMP code of kernels/*.hpp, the
/// `cuda_context` overload (kernels/cuda/context.hpp, kernels/cuda/ops.hpp)
/// launches the CUDA kernels. Code above the kernels is written once
/// against a context type `Ctx` and calls the entry points unqualified, so
/// argument-dependent lookup finds the overload of the instantiated
/// backend; `host` and `cuda` are instantiations, never copies.
///
/// A context also moves bytes in its backend's memory (zero, copy, to and
/// from the host) and synchronises, so that code above the kernels never
/// calls memset, memcpy or cudaMemcpy itself.
///
/// `context_t<Backend>` names the context type of a backend tag
/// (core/backend.hpp).

#include <omp.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tessera/core/backend.hpp"
#include "tessera/core/caching_allocator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/memory.hpp"
#include "tessera/core/tensor.hpp"

namespace tessera::kernels {

/// Tile sizes of the host attention kernels, in rows: `q` query rows (Bq) and
/// `k` key rows (Bk) per tile. Values, not template parameters (STYLE.md).
/// Both must be >= 1; a tile larger than S is clamped to S.
struct attention_tiles {
  std::int64_t q = 64;
  std::int64_t k = 64;
};

/// The host execution context: where host kernels allocate their scratch
/// (`mr`), how many OpenMP threads they use, and the host kernels' tuning
/// values. A small value type; copies share the resource (not owned; it
/// must outlive every kernel call and every tensor allocated from it).
struct host_context {
  using backend_type = host;
  /// Host code may read and write this context's memory directly.
  static constexpr bool host_accessible = true;
  /// Scratch and activations come from here (the run's counted resource).
  memory_resource* mr = &host::default_resource();
  /// OpenMP threads of the kernels on the thread that calls apply_threads()
  /// (OpenMP's nthreads ICV is per thread, so thread ranks each set their
  /// own); 0 keeps the current setting.
  int threads = 0;
  /// Tiles of the host attention kernels.
  attention_tiles tiles{};

  memory_resource& resource() const { return *mr; }
  /// Sets the calling thread's OpenMP thread count to `threads` (if > 0).
  void apply_threads() const {
    if (threads > 0) omp_set_num_threads(threads);
  }
  /// Sets `bytes` bytes at `p` to zero.
  void zero(void* p, std::size_t bytes) const {
    if (bytes) std::memset(p, 0, bytes);
  }
  /// Copies `bytes` bytes from `src` to `dst` (both in this context's
  /// memory; they must not overlap).
  void copy(void* dst, const void* src, std::size_t bytes) const {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  /// Copies `rows` rows of `width` bytes, row i from `src` + i `src_pitch`
  /// to `dst` + i `dst_pitch` (pitches in bytes, >= width; source and
  /// destination rows must not overlap).
  void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t width, std::size_t rows) const {
    if (!width) return;
    for (std::size_t i = 0; i < rows; ++i)
      std::memcpy(static_cast<char*>(dst) + i * dst_pitch,
                  static_cast<const char*>(src) + i * src_pitch, width);
  }
  /// Copies `bytes` bytes of this context's memory to host memory; returns
  /// when they are there.
  void to_host(void* h_dst, const void* src, std::size_t bytes) const { copy(h_dst, src, bytes); }
  /// Copies `bytes` bytes of host memory into this context's memory.
  void from_host(void* dst, const void* h_src, std::size_t bytes) const { copy(dst, h_src, bytes); }
  /// Waits for the work issued on this context (nothing: host kernels are synchronous).
  void synchronize() const {}
};

/// A process-wide host context over host::default_resource() (the
/// counterpart of the default resource; multi-rank code gives each rank
/// its own context and resource instead).
inline const host_context& default_host_context() {
  static const host_context c{};
  return c;
}

/// Maps a backend tag to its execution context (specialised for `cuda` in
/// kernels/cuda/context.hpp, which <tessera/cuda.hpp> includes).
template <class Backend>
struct context_of {
  static_assert(!std::same_as<Backend, Backend>,
                "no execution context for this backend: include <tessera/cuda.hpp> (and compile "
                "with nvcc or link tessera::cuda) for the cuda backend");
};
template <>
struct context_of<host> {
  using type = host_context;
};
/// The execution context of backend `Backend`.
template <class Backend>
using context_t = typename context_of<Backend>::type;

/// A context that a component builds for itself when it is given none
/// (specialised per context type): on the host, a context over a caching
/// resource of its own (host_caching_resource: a steady-state step reuses
/// the blocks of the step before and makes no system allocation), so that
/// each rank's memory figures and peak are its own (thread ranks share a
/// process); on a GPU (kernels/cuda/context.hpp),
/// a cuda_context on a stream of its own or on a given one. Not copyable or
/// movable: the context refers to the resource; hold it by unique_ptr.
template <class Ctx>
struct owned_context;
template <>
struct owned_context<host_context> {
  host_caching_resource mr;  ///< this context's memory, cached and counted on its own
  host_context ctx{&mr};    ///< OpenMP threads and attention tiles at their defaults
  owned_context() = default;
  owned_context(const owned_context&) = delete;
  owned_context& operator=(const owned_context&) = delete;
};

/// What code above the kernels needs of a context: its backend, a memory
/// resource in that backend's memory, byte moves, synchronisation, and
/// apply_threads() (the host's OpenMP thread count; nothing on a GPU).
template <class C>
concept execution_context = requires(const C& c, void* p, const void* cp, std::size_t n) {
  typename C::backend_type;
  { C::host_accessible } -> std::convertible_to<bool>;
  { c.resource() } -> std::same_as<memory_resource&>;
  c.zero(p, n);
  c.copy(p, cp, n);
  c.to_host(p, cp, n);
  c.from_host(p, cp, n);
  c.synchronize();
  c.apply_threads();
};
static_assert(execution_context<host_context>);

/// A tensor of `n` elements of T in `ctx`'s memory, allocated from its resource.
template <class T, execution_context Ctx>
tensor<T, typename Ctx::backend_type> make_tensor(const Ctx& ctx, std::int64_t n) {
  return tensor<T, typename Ctx::backend_type>(shape{n}, ctx.resource());
}
/// Sets the `n` elements at `p` to zero (all-zero bytes: +0.0 for floats).
template <class T, execution_context Ctx>
void zero_elements(const Ctx& ctx, T* p, std::int64_t n) {
  ctx.zero(p, static_cast<std::size_t>(n) * sizeof(T));
}
/// Copies `n` elements from `src` to `dst` in `ctx`'s memory.
template <class T, execution_context Ctx>
void copy_elements(const Ctx& ctx, T* dst, const T* src, std::int64_t n) {
  ctx.copy(dst, src, static_cast<std::size_t>(n) * sizeof(T));
}
/// Copies `rows` rows of `width` elements in `ctx`'s memory: dst[i
/// dst_stride + j] = src[i src_stride + j] for i < rows, j < width (strides
/// in elements, >= width; the rows must not overlap). One strided copy
/// where the context has one (copy_2d: a loop of memcpy on the host,
/// cudaMemcpy2DAsync on a GPU), else a copy per row; one flat copy when
/// both are dense. What context parallelism cuts and pastes token chunks
/// and heads with (nn/context_parallel.hpp).
template <class T, execution_context Ctx>
void copy_rows(const Ctx& ctx, T* dst, std::int64_t dst_stride, const T* src,
               std::int64_t src_stride, std::int64_t width, std::int64_t rows) {
  if (width <= 0 || rows <= 0) return;
  const auto w = static_cast<std::size_t>(width) * sizeof(T);
  if (dst_stride == width && src_stride == width) {
    ctx.copy(dst, src, w * static_cast<std::size_t>(rows));
  } else if constexpr (requires { ctx.copy_2d(dst, w, src, w, w, w); }) {
    ctx.copy_2d(dst, static_cast<std::size_t>(dst_stride) * sizeof(T), src,
                static_cast<std::size_t>(src_stride) * sizeof(T), w,
                static_cast<std::size_t>(rows));
  } else {
    for (std::int64_t i = 0; i < rows; ++i) ctx.copy(dst + i * dst_stride, src + i * src_stride, w);
  }
}

}  // namespace tessera::kernels
