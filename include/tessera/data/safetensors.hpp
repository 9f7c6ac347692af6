#pragma once
/// \file data/safetensors.hpp
/// The safetensors format (Hugging Face, github.com/huggingface/safetensors):
/// a little-endian u64 header length N, N bytes of JSON (read and written
/// with nlohmann-json) mapping each tensor name to {"dtype", "shape",
/// "data_offsets": [begin, end)} relative to the data that follows, and an
/// optional "__metadata__" map of strings; then the tensors' bytes,
/// row-major, little-endian. Read memory-mapped; written to a temporary
/// name, flushed and renamed.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/numeric.hpp"

namespace tessera::data {

static_assert(std::endian::native == std::endian::little,
              "safetensors files are little-endian and read through mmap without byte swaps");

/// The largest header a reader accepts (the format's reference reader caps
/// it at 100 MB): a bound before anything is allocated.
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;

/// Bytes per element of a safetensors dtype ("F64", "F32", "F16", "BF16",
/// "F8_E4M3", "F8_E5M2", "I64", "I32", "I16", "I8", "U8", "BOOL"); 0 for an
/// unknown name.
inline std::size_t safetensors_dtype_bytes(const std::string& dt) {
  if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
  if (dt == "F32" || dt == "I32" || dt == "U32") return 4;
  if (dt == "F16" || dt == "BF16" || dt == "I16" || dt == "U16") return 2;
  if (dt == "I8" || dt == "U8" || dt == "BOOL" || dt == "F8_E4M3" || dt == "F8_E5M2") return 1;
  return 0;
}

/// One tensor of a safetensors file: its dtype name, shape and bytes
/// (inside the file's mapping; valid while the file is open).
struct safetensors_tensor {
  std::string dtype;                ///< "F32", "BF16", ...
  std::vector<std::int64_t> shape;  ///< row-major dimensions ([] for a scalar)
  const unsigned char* data = nullptr;
  std::size_t bytes = 0;            ///< numel x safetensors_dtype_bytes(dtype)

  /// Product of the dimensions.
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
  /// Converts elements [first, first + n) (row-major) to double into `out`.
  /// Floating dtypes only (F64, F32, F16, BF16, and F8_E4M3 and F8_E5M2,
  /// which are tessera's fp8_e4m3 and fp8_e5m2). Throws config_error for
  /// another dtype. Precondition: first + n <= numel().
  void read(std::int64_t first, std::int64_t n, double* out) const {
    TESSERA_EXPECTS(first >= 0 && n >= 0 && first + n <= numel(), "safetensors read out of range");
    const auto at = static_cast<std::size_t>(first);
    auto load = [&](auto tag) {
      using T = decltype(tag);
      for (std::int64_t i = 0; i < n; ++i) {
        T v;
        std::memcpy(&v, data + (at + static_cast<std::size_t>(i)) * sizeof(T), sizeof(T));
        out[i] = to<double>(v);
      }
    };
    if (dtype == "F64") return load(double{});
    if (dtype == "F32") return load(float{});
    if (dtype == "BF16") return load(bf16{});
    if (dtype == "F16") return load(fp16{});
    if (dtype == "F8_E4M3") return load(fp8_e4m3{});
    if (dtype == "F8_E5M2") return load(fp8_e5m2{});
    throw config_error("safetensors tensor of dtype " + dtype +
                       " is not a floating type (F64, F32, F16, BF16, F8_E4M3 or F8_E5M2)");
  }
};

/// A safetensors file, memory-mapped and checked whole when opened.
class safetensors_file {
public:
  /// Opens and maps `path`, parses its header and checks every entry: the
  /// header length within the file and safetensors_max_header_bytes, the
  /// JSON an object of tensors with a known dtype, non-negative dims,
  /// offsets inside the data whose length is numel x dtype bytes (checked
  /// for overflow), the tensors tiling the data exactly (no overlap, gap or
  /// trailing bytes), no name twice. Throws io_error naming
  /// the file, the tensor and the numbers.
  explicit safetensors_file(const std::filesystem::path& path) : path_(path) {
    const std::string p = path.string();
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    TESSERA_THROW_IF(fd < 0, io_error, "cannot open safetensors file '", p, "': ",
                     std::strerror(errno));
    struct stat st {};
    const bool ok = ::fstat(fd, &st) == 0;
    if (!ok || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw io_error("safetensors file '" + p + "' is not a regular file");
    }
    bytes_ = static_cast<std::uint64_t>(st.st_size);
    if (bytes_ < 8) {
      ::close(fd);
      throw io_error("safetensors file '" + p + "' is truncated: " + std::to_string(bytes_) +
                     " bytes, the header length alone needs 8");
    }
    void* m = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    TESSERA_THROW_IF(m == MAP_FAILED, io_error, "cannot mmap safetensors file '", p, "' (",
                     bytes_, " bytes): ", std::strerror(errno));
    map_ = static_cast<const unsigned char*>(m);  // owned: the destructor unmaps
    try {
      parse();
    } catch (...) {
      unmap();
      throw;
    }
  }
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;
  ~safetensors_file() { unmap(); }

  const std::filesystem::path& path() const { return path_; }
  /// Every tensor by name.
  const std::map<std::string, safetensors_tensor>& tensors() const { return tensors_; }
  /// The "__metadata__" strings (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The tensor `name`, or nullptr.
  const safetensors_tensor* find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }

private:
  void unmap() {
    if (map_ != nullptr) ::munmap(const_cast<unsigned char*>(map_), bytes_);
    map_ = nullptr;
  }
  void parse() {
    const std::string p = path_.string();
    std::uint64_t n = 0;
    std::memcpy(&n, map_, 8);
    TESSERA_THROW_IF(n > safetensors_max_header_bytes, io_error, "safetensors file '", p,
                     "': header length ", n, " exceeds the limit of ",
                     safetensors_max_header_bytes, " bytes");
    TESSERA_THROW_IF(n > bytes_ - 8, io_error, "safetensors file '", p, "': header length ", n,
                     " runs past the end of the file (", bytes_, " bytes)");
    nlohmann::json h;
    try {
      // Depth bounded as parse_json_bounded, and a name given twice refused
      // (nlohmann would keep the last silently).
      std::set<std::string> names;
      h = nlohmann::json::parse(
          map_ + 8, map_ + 8 + n,
          [&](int depth, nlohmann::json::parse_event_t e, nlohmann::json& v) {
            TESSERA_THROW_IF(depth > json_max_depth, io_error, "safetensors file '", p,
                             "': JSON nested deeper than ", json_max_depth, " levels");
            if (e == nlohmann::json::parse_event_t::key && depth == 1) {
              const std::string k = v.get<std::string>();
              TESSERA_THROW_IF(!names.insert(k).second, io_error, "safetensors file '", p,
                               "': tensor '", k, "' appears twice in the header");
            }
            return true;
          });
    } catch (const nlohmann::json::exception& e) {
      throw io_error("safetensors file '" + p + "': the header (bytes 8 to " +
                     std::to_string(8 + n) + ") is not JSON: " + e.what());
    }
    TESSERA_THROW_IF(!h.is_object(), io_error, "safetensors file '", p,
                     "': the header is not a JSON object");
    const unsigned char* data = map_ + 8 + n;
    const std::uint64_t data_bytes = bytes_ - 8 - n;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
    for (const auto& [name, v] : h.items()) {
      if (name == "__metadata__") {
        TESSERA_THROW_IF(!v.is_object(), io_error, "safetensors file '", p,
                         "': __metadata__ is not an object");
        for (const auto& [k, s] : v.items()) {
          TESSERA_THROW_IF(!s.is_string(), io_error, "safetensors file '", p,
                           "': __metadata__ value '", k, "' is not a string");
          metadata_[k] = s.get<std::string>();
        }
        continue;
      }
      const std::string what = "safetensors file '" + p + "': tensor '" + name + "'";
      TESSERA_THROW_IF(!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() ||
                           !v.contains("shape") || !v["shape"].is_array() ||
                           !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
                           v["data_offsets"].size() != 2,
                       io_error, what, " needs a string dtype, a shape array and two data_offsets");
      safetensors_tensor t;
      t.dtype = v["dtype"].get<std::string>();
      const std::size_t eb = safetensors_dtype_bytes(t.dtype);
      TESSERA_THROW_IF(eb == 0, io_error, what, " has unknown dtype '", t.dtype, "'");
      std::uint64_t numel = 1;
      for (const auto& d : v["shape"]) {
        TESSERA_THROW_IF(!d.is_number_unsigned(), io_error, what, " has a dimension ", d.dump(),
                         " that is not a non-negative integer");
        const std::uint64_t x = d.get<std::uint64_t>();
        // Every partial product within int64, as safetensors_tensor::numel() computes it
        // (a later 0 made [3, 2^62, 0] pass with a product above 2^63).
        constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
        TESSERA_THROW_IF(x > max || (x != 0 && numel > max / x), io_error, what, " has a shape ",
                         v["shape"].dump(), " whose element count overflows int64");
        numel *= x;
        t.shape.push_back(static_cast<std::int64_t>(x));
      }
      const auto& o = v["data_offsets"];
      TESSERA_THROW_IF(!o[0].is_number_unsigned() || !o[1].is_number_unsigned(), io_error, what,
                       " has data_offsets ", o.dump(), " that are not non-negative integers");
      const std::uint64_t b = o[0].get<std::uint64_t>(), e = o[1].get<std::uint64_t>();
      TESSERA_THROW_IF(b > e || e > data_bytes, io_error, what, " has data_offsets [", b, ", ", e,
                       ") outside the ", data_bytes, " data bytes");
      TESSERA_THROW_IF(numel > std::numeric_limits<std::uint64_t>::max() / eb || e - b != numel * eb,
                       io_error, what, " holds ", e - b, " bytes, but its shape ",
                       v["shape"].dump(), " of ", t.dtype, " needs ", numel, " x ", eb);
      t.data = data + b;
      t.bytes = static_cast<std::size_t>(e - b);
      spans.emplace_back(b, e);
      tensors_.emplace(name, std::move(t));
    }
    // The tensors tile the data exactly, as the format's reference reader
    // requires: no overlap, no gap, nothing after the last.
    std::sort(spans.begin(), spans.end());
    std::uint64_t at = 0;
    for (const auto& [b, e] : spans) {
      TESSERA_THROW_IF(b < at, io_error, "safetensors file '", p,
                       "': two tensors overlap at data bytes [", b, ", ", at, ")");
      TESSERA_THROW_IF(b > at, io_error, "safetensors file '", p, "': data bytes [", at, ", ", b,
                       ") belong to no tensor");
      at = e;
    }
    TESSERA_THROW_IF(at != data_bytes, io_error, "safetensors file '", p, "': the last ",
                     data_bytes - at, " data bytes belong to no tensor");
  }

  std::filesystem::path path_;
  const unsigned char* map_ = nullptr;
  std::uint64_t bytes_ = 0;
  std::map<std::string, safetensors_tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// A tensor to write: name, dtype name, shape, and its bytes (row-major,
/// numel x dtype bytes; not owned).
struct safetensors_entry {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  std::size_t bytes = 0;
};

/// Writes `tensors` (in this order in the data; names unique, not
/// "__metadata__") and `metadata` as a safetensors file at `path`,
/// atomically (write_file_atomically). The header is padded with spaces
/// to a multiple of 8 bytes, as the reference writer does. Throws
/// config_error for a duplicate name, an unknown dtype or bytes that do
/// not match the shape; io_error if the file cannot be written.
inline void write_safetensors(const std::filesystem::path& path,
                              const std::vector<safetensors_entry>& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    TESSERA_THROW_IF(t.name == "__metadata__" || h.contains(t.name), config_error,
                     "safetensors: tensor name '", t.name, "' is reserved or repeated");
    const std::size_t eb = safetensors_dtype_bytes(t.dtype);
    TESSERA_THROW_IF(eb == 0, config_error, "safetensors: tensor '", t.name, "' has unknown dtype '",
                     t.dtype, "'");
    std::uint64_t numel = 1;
    for (std::int64_t d : t.shape) {
      TESSERA_THROW_IF(d < 0, config_error, "safetensors: tensor '", t.name, "' has dimension ",
                       d, " < 0");
      const auto ud = static_cast<std::uint64_t>(d);
      TESSERA_THROW_IF(ud != 0 && numel > std::numeric_limits<std::uint64_t>::max() / eb / ud,
                       config_error, "safetensors: tensor '", t.name,
                       "' has a shape whose byte count overflows 64 bits");
      numel *= ud;
    }
    TESSERA_THROW_IF(numel * eb != t.bytes, config_error, "safetensors: tensor '", t.name, "' has ",
                     t.bytes, " bytes, its shape needs ", numel * eb);
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes}}};
    at += t.bytes;
  }
  std::string js = h.dump();
  js.append((8 - js.size() % 8) % 8, ' ');
  write_file_atomically(path, [&](std::ofstream& out) {
    const std::uint64_t n = js.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(js.data(), static_cast<std::streamsize>(js.size()));
    for (const auto& t : tensors)
      out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.bytes));
  });
}

}  // namespace tessera::data
