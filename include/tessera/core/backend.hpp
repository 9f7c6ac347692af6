#pragma once
/// \file backend.hpp
/// Backend tags and the `backend` concept. A backend names where memory lives
/// and how work is ordered: `tessera::host` (CPU, OpenMP) and `tessera::cuda`
/// (GPU; include tessera/core/cuda.hpp under nvcc).

#include <concepts>
#include <cstddef>
#include <cstring>

#include "tessera/core/memory.hpp"

namespace tessera {

/// A backend provides a default memory resource, a way to copy between its
/// memory and the host, and a synchronize().
template <class B>
concept backend = requires(void* dst, const void* src, std::size_t n) {
  { B::name } -> std::convertible_to<const char*>;
  { B::default_resource() } -> std::same_as<memory_resource&>;
  { B::copy_to_host(dst, src, n) };
  { B::copy_from_host(dst, src, n) };
  { B::synchronize() };
};

/// The host (CPU) backend. Kernels run with OpenMP over the cores; GEMMs call
/// the CBLAS that tessera::host links.
struct host {
  static constexpr const char* name = "host";
  /// Process-wide default resource (like std::pmr::get_default_resource).
  /// Multi-rank code passes each rank its own resource instead.
  static memory_resource& default_resource() {
    static host_memory_resource r;
    return r;
  }
  static void copy_to_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  static void copy_from_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  static void synchronize() {}
};

static_assert(backend<host>);

}  // namespace tessera
