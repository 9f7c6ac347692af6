#pragma once
/// \file tensor.hpp
/// `shape`, `tensor_view<T>` (non-owning pointer, shape, strides) and
/// `tensor<T, Backend>` (owning, allocated from a backend memory resource).
///
/// Shapes follow the field's letters: B batch, T sequence, H hidden (model
/// dim), V vocabulary, nh heads, nkv key/value heads, hd head dim, F ffn dim.
/// Layout is row-major (last dimension contiguous) unless strides say otherwise.

#include <array>
#include <cstring>
#include <type_traits>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>

#include "tessera/core/backend.hpp"
#include "tessera/core/checked.hpp"
#include "tessera/core/error.hpp"

namespace tessera {

/// Up to 4 dimensions, row-major. `shape{B, T, H}`.
struct shape {
  static constexpr int max_rank = 4;
  std::array<std::int64_t, max_rank> dims{};
  int rank = 0;

  shape() = default;
  shape(std::initializer_list<std::int64_t> d) {
    TESSERA_THROW_IF(static_cast<int>(d.size()) > max_rank, config_error, "shape rank ", d.size(),
                     " exceeds ", max_rank);
    std::int64_t n = 1;
    for (auto x : d) {
      TESSERA_THROW_IF(x < 0, config_error, "shape dimension ", x, " is negative");
      dims[rank++] = x;
      n = checked_mul(n, x, "the element count of a tensor");
    }
  }
  std::int64_t operator[](int i) const { return dims[i]; }
  /// Number of elements (1 for rank 0).
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string str() const {
    std::ostringstream os;
    os << "(";
    for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << dims[i];
    os << ")";
    return os.str();
  }
};

/// Non-owning view: pointer, shape and strides in elements. Trivially
/// copyable, usable on host and device.
template <class T>
struct tensor_view {
  T* data = nullptr;
  shape shp;
  std::array<std::int64_t, shape::max_rank> strides{};

  tensor_view() = default;
  /// Contiguous row-major view of `s` starting at `p`.
  tensor_view(T* p, shape s) : data(p), shp(s) {
    std::int64_t st = 1;
    for (int i = s.rank - 1; i >= 0; --i) {
      strides[i] = st;
      st *= s.dims[i];
    }
  }
  std::int64_t numel() const { return shp.numel(); }
  std::int64_t size(int i) const { return shp[i]; }
  int rank() const { return shp.rank; }
  /// Element access by index (no bounds check in release; contract-checked in debug).
  template <class... I>
  T& operator()(I... idx) const {
    static_assert(sizeof...(I) <= shape::max_rank);
    std::int64_t ix[] = {static_cast<std::int64_t>(idx)...};
    std::int64_t off = 0;
    for (std::size_t i = 0; i < sizeof...(I); ++i) {
      TESSERA_EXPECTS(ix[i] >= 0 && ix[i] < shp[static_cast<int>(i)], "tensor index out of range");
      off += ix[i] * strides[i];
    }
    return data[off];
  }
  bool contiguous() const {
    std::int64_t st = 1;
    for (int i = shp.rank - 1; i >= 0; --i) {
      if (shp.dims[i] != 1 && strides[i] != st) return false;
      st *= shp.dims[i];
    }
    return true;
  }
  operator tensor_view<const T>() const {
    tensor_view<const T> v;
    v.data = data;
    v.shp = shp;
    v.strides = strides;
    return v;
  }
};

/// Owning, contiguous tensor of `T` in `Backend` memory, allocated from a
/// memory resource (the backend's default unless one is given). Move-only.
/// Contents are uninitialised after construction; use fill() or zero().
template <class T, class Backend = host>
  requires backend<Backend>
class tensor {
public:
  using value_type = T;
  using backend_type = Backend;

  tensor() = default;
  explicit tensor(tessera::shape s, memory_resource& mr = Backend::default_resource())
      : shp_(s), mr_(&mr) {
    bytes_ = static_cast<std::size_t>(
        checked_mul(s.numel(), static_cast<std::int64_t>(sizeof(T)), "the bytes of a tensor"));
    data_ = static_cast<T*>(mr_->allocate(bytes_));
  }
  tensor(const tensor&) = delete;
  tensor& operator=(const tensor&) = delete;
  tensor(tensor&& o) noexcept { swap(o); }
  tensor& operator=(tensor&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  ~tensor() { release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  const tessera::shape& shape() const { return shp_; }
  std::int64_t numel() const { return shp_.numel(); }
  std::size_t bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }
  tensor_view<T> view() { return tensor_view<T>(data_, shp_); }
  tensor_view<const T> view() const { return tensor_view<const T>(data_, shp_); }

  /// Host-only element access for host tensors.
  T& operator[](std::int64_t i)
    requires std::is_same_v<Backend, host>
  {
    return data_[i];
  }
  const T& operator[](std::int64_t i) const
    requires std::is_same_v<Backend, host>
  {
    return data_[i];
  }
  /// Sets every byte to zero.
  void zero()
    requires std::is_same_v<Backend, host>
  {
    if (bytes_) std::memset(data_, 0, bytes_);
  }
  /// Sets every element to `v`.
  void fill(T v)
    requires std::is_same_v<Backend, host>
  {
    for (std::int64_t i = 0; i < numel(); ++i) data_[i] = v;
  }
  /// Frees the memory now (the tensor becomes empty).
  void release() {
    if (data_) mr_->deallocate(data_, bytes_);
    data_ = nullptr;
    bytes_ = 0;
    shp_ = tessera::shape{};
  }

private:
  void swap(tensor& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(shp_, o.shp_);
    std::swap(bytes_, o.bytes_);
    std::swap(mr_, o.mr_);
  }
  T* data_ = nullptr;
  tessera::shape shp_{};
  std::size_t bytes_ = 0;
  memory_resource* mr_ = &Backend::default_resource();
};

}  // namespace tessera
