#pragma once
/// \file token_file.hpp
/// The tessera token file (`.tok`): a 64-byte header followed by the token
/// ids, written atomically and read through a read-only memory map; and the
/// train/validation split every tool agrees on.
///
/// Format, version 1 (every integer little-endian):
///
///   offset  size  field
///        0     8  magic, the ASCII bytes "TSRATOK1"
///        8     4  u32 version = 1
///       12     4  u32 token dtype code: 1 = uint16, 2 = uint32
///       16     8  u64 token count N
///       24     8  u64 vocabulary size V (every token id is < V)
///       32     8  u64 header bytes = 64 (the offset of the first token)
///       40    24  reserved, zero
///       64  N*s   the tokens, s = 2 (uint16) or 4 (uint32) bytes each
///
/// The file size is exactly 64 + N*s; the reader rejects anything else.
/// scripts/ngram_baseline.py reads the same header and splits by the same rule
/// (`split_tokens`); change them together.
///
/// The reader also takes the token files people already have, told apart by
/// their first bytes: llm.c's shards (`.bin`: 256 int32, magic 20240520,
/// version 1 for uint16 or 2 for uint32 tokens, the count; then the
/// tokens) and NumPy arrays (`.npy`, "\x93NUMPY": one-dimensional uint16 or
/// uint32). Neither records a vocabulary: it is the largest id + 1.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

namespace tessera::data {

static_assert(std::endian::native == std::endian::little,
              "tessera token files are little-endian and read through mmap without byte "
              "swapping; this host is big-endian, so token_file.hpp would need a swapping reader");

/// How each token is stored on disk. The value is the dtype code in the header.
enum class token_dtype : std::uint32_t {
  u16 = 1,  ///< uint16: vocabularies of at most 65536 ids (the byte tokenizer, GPT-2, Llama 2)
  u32 = 2,  ///< uint32: larger vocabularies (Llama 3's 128256)
};

/// Bytes per stored token: 2 for `u16`, 4 for `u32`.
constexpr std::uint64_t dtype_bytes(token_dtype d) {
  return d == token_dtype::u16 ? 2 : 4;
}

/// "uint16" or "uint32", for messages.
constexpr const char* dtype_name(token_dtype d) {
  return d == token_dtype::u16 ? "uint16" : "uint32";
}

/// The 8 magic bytes that open every token file.
inline constexpr std::string_view token_file_magic = "TSRATOK1";
/// The format version this header writes and reads.
inline constexpr std::uint32_t token_file_version = 1;
/// Size of the header in bytes; the first token sits at this offset.
inline constexpr std::uint64_t token_file_header_bytes = 64;

/// Default fraction of a token file held out for validation, taken from the
/// END of the file. 0.1 keeps about 240 k tokens of the bundled 2.4 MB corpus
/// for evaluation (enough for a validation loss with a standard error well
/// below 0.01 nats) while leaving 90% for training.
inline constexpr double default_val_fraction = 0.1;

/// A half-open range [begin, end) of token positions in a file.
struct token_range {
  std::uint64_t begin = 0;  ///< first position, inclusive
  std::uint64_t end = 0;    ///< one past the last position
  /// Number of tokens in the range.
  constexpr std::uint64_t size() const { return end - begin; }
  constexpr bool operator==(const token_range&) const = default;
};

/// The train/validation split of a file of `n` tokens.
struct split_view {
  token_range train;  ///< [0, n - n_val)
  token_range val;    ///< [n - n_val, n): the held-out END of the file
};

/// Splits `n` tokens into train [0, n - n_val) and validation [n - n_val, n),
/// with n_val = floor(n * val_fraction) computed in IEEE double (exactly what
/// Python's `math.floor(n * f)` gives, which scripts/ngram_baseline.py uses).
/// The validation range is the END of the file, so the two never overlap and
/// no window drawn from one range contains a token of the other.
/// \pre 0 <= val_fraction < 1, n <= 2^53; throws config_error otherwise.
inline split_view split_tokens(std::uint64_t n, double val_fraction = default_val_fraction) {
  TESSERA_THROW_IF(!(val_fraction >= 0.0 && val_fraction < 1.0), config_error,
                   "val_fraction=", val_fraction, " must lie in [0, 1)");
  TESSERA_THROW_IF(n > (std::uint64_t{1} << 53), config_error, "token count ", n,
                   " exceeds 2^53, where the double-precision split rule stops being exact");
  const auto n_val = static_cast<std::uint64_t>(std::floor(static_cast<double>(n) * val_fraction));
  return split_view{token_range{0, n - n_val}, token_range{n - n_val, n}};
}

namespace detail {

inline std::uint32_t load_u32_le(const unsigned char* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
         std::uint32_t{p[3]} << 24;
}
inline std::uint64_t load_u64_le(const unsigned char* p) {
  return std::uint64_t{load_u32_le(p)} | std::uint64_t{load_u32_le(p + 4)} << 32;
}
inline void store_u32_le(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void store_u64_le(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

/// Renders up to `n` bytes for a message: printable ASCII as is, the rest \xHH.
inline std::string escape_bytes(const unsigned char* p, std::size_t n) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char c = p[i];
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      s += static_cast<char>(c);
    } else {
      s += "\\x";
      s += hex[c >> 4];
      s += hex[c & 15];
    }
  }
  return s;
}

/// Closes a POSIX file descriptor on scope exit.
struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace detail

/// Writes `tokens` as a token file at `path`, atomically
/// (write_file_atomically): the bytes go to a temporary beside it, are
/// flushed and fsync'ed, and the temporary is renamed over `path`. A reader never sees a partial file, and on any failure
/// the temporary is removed and `path` is left as it was.
///
/// \param tokens every id must be < `vocab` (dtype uint32 in memory, any length,
///        empty allowed).
/// \param vocab  vocabulary size V recorded in the header; 1 <= V, and V <= 65536
///        for `token_dtype::u16`.
/// \param dtype  on-disk width of each token.
/// \throws config_error before creating any file if `vocab` is 0 or too large
///         for `dtype`, or if a token is not below `vocab` (naming the token,
///         its position and V).
/// \throws io_error if the temporary cannot be created or written, or the
///         rename fails (naming the path and strerror).
inline void write_token_file(const std::filesystem::path& path,
                             std::span<const std::uint32_t> tokens, std::uint64_t vocab,
                             token_dtype dtype = token_dtype::u16) {
  TESSERA_THROW_IF(dtype != token_dtype::u16 && dtype != token_dtype::u32, config_error,
                   "token dtype code ", static_cast<std::uint32_t>(dtype),
                   " is not 1 (uint16) or 2 (uint32)");
  TESSERA_THROW_IF(vocab == 0, config_error, "vocabulary size 0 for token file '", path.string(),
                   "': it must be at least 1");
  const std::uint64_t max_vocab =
      dtype == token_dtype::u16 ? std::uint64_t{1} << 16 : std::uint64_t{1} << 32;
  TESSERA_THROW_IF(vocab > max_vocab, config_error, "vocabulary size ", vocab, " does not fit ",
                   dtype_name(dtype), " tokens (at most ", max_vocab,
                   " ids); write with token_dtype::u32");
  for (std::size_t i = 0; i < tokens.size(); ++i)
    TESSERA_THROW_IF(tokens[i] >= vocab, config_error, "token ", tokens[i], " at position ", i,
                     " is not below the vocabulary size ", vocab, " (writing '", path.string(),
                     "')");

  std::array<unsigned char, token_file_header_bytes> header{};
  std::memcpy(header.data(), token_file_magic.data(), 8);
  detail::store_u32_le(header.data() + 8, token_file_version);
  detail::store_u32_le(header.data() + 12, static_cast<std::uint32_t>(dtype));
  detail::store_u64_le(header.data() + 16, tokens.size());
  detail::store_u64_le(header.data() + 24, vocab);
  detail::store_u64_le(header.data() + 32, token_file_header_bytes);

  write_file_atomically(path, [&](std::ofstream& out) {
    out.write(reinterpret_cast<const char*>(header.data()),
              static_cast<std::streamsize>(header.size()));
    // Narrow or copy in chunks so a billion-token write needs no second full copy.
    constexpr std::size_t chunk = std::size_t{1} << 16;
    std::vector<unsigned char> buf(chunk * dtype_bytes(dtype));
    for (std::size_t at = 0; at < tokens.size() && out; at += chunk) {
      const std::size_t n = std::min(chunk, tokens.size() - at);
      if (dtype == token_dtype::u16) {
        for (std::size_t i = 0; i < n; ++i) {
          const auto v = static_cast<std::uint16_t>(tokens[at + i]);
          std::memcpy(buf.data() + 2 * i, &v, 2);
        }
      } else {
        std::memcpy(buf.data(), tokens.data() + at, 4 * n);
      }
      out.write(reinterpret_cast<const char*>(buf.data()),
                static_cast<std::streamsize>(n * dtype_bytes(dtype)));
    }
  });
}

/// A token file mapped read-only into memory. Move-only; unmapped on
/// destruction. `open` validates everything once (header, size, and that every
/// id is below the vocabulary), so the accessors never fail on a good index.
///
/// Thread safety: all accessors are const and may be called concurrently.
class token_file {
 public:
  token_file() = default;

  /// Maps and validates the token file at `path` (see `open`).
  explicit token_file(const std::filesystem::path& path) {
    try {
      open_into(path);
    } catch (...) {
      release();  // a throwing constructor runs no destructor
      throw;
    }
  }

  /// Maps and validates the token file at `path` (tessera's format, an
  /// llm.c .bin shard or a NumPy .npy array; file comment). Scans every
  /// token (about 1 GB/s on one core), so a bad id fails here rather than
  /// mid-run.
  /// \throws io_error naming the path and the problem: missing or unreadable
  ///         (with strerror), not a regular file, empty, shorter than the
  ///         64-byte header ("truncated"), an unknown magic ("not a tessera
  ///         token file", showing what was found and "TSRATOK1"), an llm.c
  ///         version other than 1 or 2, a NumPy array that is not a 1-D
  ///         C-order '<u2' or '<u4' (naming what it is), unsupported
  ///         version, dtype or header size, a vocabulary too large for the
  ///         dtype, a size other than 64 + N * dtype bytes ("truncated: header
  ///         says N tokens ..."), or a token id not below the vocabulary
  ///         (naming the id, its index and V).
  static token_file open(const std::filesystem::path& path) { return token_file(path); }

  token_file(token_file&& o) noexcept { swap(o); }
  token_file& operator=(token_file&& o) noexcept {
    if (this != &o) {
      token_file tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  token_file(const token_file&) = delete;
  token_file& operator=(const token_file&) = delete;
  ~token_file() { release(); }

  /// Number of tokens N.
  std::uint64_t size() const { return count_; }
  /// Vocabulary size V from the header; every token id is < V.
  std::uint64_t vocab() const { return vocab_; }
  /// On-disk width of each token.
  token_dtype dtype() const { return dtype_; }
  /// The path this file was opened from (empty for a default-constructed one).
  const std::filesystem::path& path() const { return path_; }
  /// The train/validation split of this file (`split_tokens(size(), val_fraction)`).
  split_view split(double val_fraction = default_val_fraction) const {
    return split_tokens(count_, val_fraction);
  }

  /// Token id at position `i`. \pre i < size() (checked by TESSERA_EXPECTS).
  std::uint32_t operator[](std::uint64_t i) const {
    TESSERA_EXPECTS(i < count_, "token index out of range");
    if (dtype_ == token_dtype::u16) {
      std::uint16_t v;
      std::memcpy(&v, data_ + 2 * i, 2);
      return v;
    }
    std::uint32_t v;
    std::memcpy(&v, data_ + 4 * i, 4);
    return v;
  }

  /// Copies tokens [start, start + n) into `out` as int32 (the dtype the
  /// embedding and cross-entropy kernels index with).
  /// \param out host buffer of at least `n` int32; must not alias the map.
  /// \throws config_error if n < 0, the range passes size(), or V > 2^31 (ids
  ///         would not fit int32).
  void read(std::uint64_t start, std::int64_t n, std::int32_t* out) const {
    TESSERA_THROW_IF(n < 0, config_error, "token_file::read of n=", n, " tokens: n must be >= 0");
    TESSERA_THROW_IF(start > count_ || static_cast<std::uint64_t>(n) > count_ - start, config_error,
                     "token_file::read of [", start, ", ", start + n, ") passes the end of '",
                     path_.string(), "' (", count_, " tokens)");
    TESSERA_THROW_IF(vocab_ > (std::uint64_t{1} << 31), config_error, "vocabulary ", vocab_,
                     " of '", path_.string(), "' does not fit int32 token ids");
    if (n == 0) return;  // an empty file maps nothing: no memcpy from a null pointer
    if (dtype_ == token_dtype::u16) {
      const unsigned char* p = data_ + 2 * start;
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        out[i] = static_cast<std::int32_t>(v);
      }
    } else {
      std::memcpy(out, data_ + 4 * start, 4 * static_cast<std::size_t>(n));
    }
  }

 private:
  void release() noexcept {
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
    map_ = nullptr;
    map_bytes_ = 0;
    data_ = nullptr;
    count_ = 0;
  }

  void swap(token_file& o) noexcept {
    std::swap(map_, o.map_);
    std::swap(map_bytes_, o.map_bytes_);
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
    std::swap(vocab_, o.vocab_);
    std::swap(dtype_, o.dtype_);
    std::swap(path_, o.path_);
  }

  void open_into(const std::filesystem::path& path) {
    path_ = path;
    const std::string p = path.string();
    detail::fd_guard fd{::open(p.c_str(), O_RDONLY | O_CLOEXEC)};
    TESSERA_THROW_IF(fd.fd < 0, io_error, "cannot open token file '", p,
                     "': ", std::strerror(errno));
    struct stat st {};
    TESSERA_THROW_IF(::fstat(fd.fd, &st) != 0, io_error, "cannot stat token file '", p,
                     "': ", std::strerror(errno));
    TESSERA_THROW_IF(!S_ISREG(st.st_mode), io_error, "token file '", p,
                     "' is not a regular file (a directory or device?)");
    const auto bytes = static_cast<std::uint64_t>(st.st_size);
    TESSERA_THROW_IF(bytes == 0, io_error, "token file '", p,
                     "' is empty (0 bytes); expected a 64-byte \"TSRATOK1\" header and tokens "
                     "(write one with examples/tokenize)");
    TESSERA_THROW_IF(bytes < token_file_header_bytes, io_error, "token file '", p,
                     "' is truncated: ", bytes, " bytes, header needs ", token_file_header_bytes);

    void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd.fd, 0);
    TESSERA_THROW_IF(m == MAP_FAILED, io_error, "cannot mmap token file '", p, "' (", bytes,
                     " bytes): ", std::strerror(errno));
    map_ = m;  // owned from here: the destructor unmaps if a check below throws
    map_bytes_ = bytes;
    const auto* h = static_cast<const unsigned char*>(m);

    if (bytes >= 4 && detail::load_u32_le(h) == llmc_magic) return open_llmc(p, h, bytes);
    if (bytes >= 6 && std::memcmp(h, "\x93NUMPY", 6) == 0) return open_npy(p, h, bytes);
    TESSERA_THROW_IF(std::memcmp(h, token_file_magic.data(), 8) != 0, io_error, "'", p,
                     "' is not a tessera token file: magic is \"", detail::escape_bytes(h, 8),
                     "\", expected \"", token_file_magic,
                     "\" (or an llm.c .bin shard, or a NumPy .npy array of uint16 or uint32; "
                     "convert text with examples/tokenize)");
    const std::uint32_t version = detail::load_u32_le(h + 8);
    TESSERA_THROW_IF(version != token_file_version, io_error, "token file '", p,
                     "' has unsupported version ", version, "; this reader supports version ",
                     token_file_version);
    const std::uint32_t code = detail::load_u32_le(h + 12);
    TESSERA_THROW_IF(code != 1 && code != 2, io_error, "token file '", p,
                     "' has unsupported token dtype code ", code,
                     "; expected 1 (uint16) or 2 (uint32)");
    const auto dtype = static_cast<token_dtype>(code);
    const std::uint64_t count = detail::load_u64_le(h + 16);
    const std::uint64_t vocab = detail::load_u64_le(h + 24);
    const std::uint64_t header_bytes = detail::load_u64_le(h + 32);
    TESSERA_THROW_IF(header_bytes != token_file_header_bytes, io_error, "token file '", p,
                     "' has unsupported header size ", header_bytes, "; version 1 uses ",
                     token_file_header_bytes);
    const std::uint64_t max_vocab =
        dtype == token_dtype::u16 ? std::uint64_t{1} << 16 : std::uint64_t{1} << 32;
    TESSERA_THROW_IF(vocab > max_vocab, io_error, "token file '", p, "' declares vocabulary ",
                     vocab, ", more than ", dtype_name(dtype), " tokens can address (", max_vocab,
                     ")");
    take(p, h, bytes, token_file_header_bytes, count, dtype, vocab);
  }

  // The tokens after `header` bytes: the size checked against `count`,
  // the ids against `vocab` (0: the vocabulary is the largest id + 1).
  void take(const std::string& p, const unsigned char* h, std::uint64_t bytes,
            std::uint64_t header, std::uint64_t count, token_dtype dtype, std::uint64_t vocab) {
    const std::uint64_t width = dtype_bytes(dtype);
    const bool overflows = count > (std::numeric_limits<std::uint64_t>::max() - header) / width;
    const std::uint64_t expect = overflows ? 0 : header + count * width;
    if (overflows || expect != bytes) {
      const char* what = (!overflows && bytes > expect) ? "has trailing bytes" : "is truncated";
      throw io_error(tessera::detail::str(
          "token file '", p, "' ", what, ": header says ", count, " ", dtype_name(dtype),
          " tokens (", header, " + ", count, " * ", width, " = ",
          overflows ? std::string("overflow") : std::to_string(expect), " bytes) but file holds ",
          bytes));
    }
    data_ = h + header;
    count_ = count;
    dtype_ = dtype;
    vocab_ = vocab;
    const std::uint32_t mx = max_id();
    if (vocab_ == 0) vocab_ = count_ == 0 ? 1 : std::uint64_t{mx} + 1;
    check_ids(mx);
  }

  // llm.c's token shards (dev/data/data_common.py): 256 little-endian int32
  // (magic 20240520, version 1 = uint16 tokens or 2 = uint32, token
  // count), then the tokens. No vocabulary is recorded: the largest id + 1.
  static constexpr std::uint32_t llmc_magic = 20240520;
  static constexpr std::uint64_t llmc_header_bytes = 256 * 4;
  void open_llmc(const std::string& p, const unsigned char* h, std::uint64_t bytes) {
    TESSERA_THROW_IF(bytes < llmc_header_bytes, io_error, "llm.c token file '", p,
                     "' is truncated: ", bytes, " bytes, its header needs ", llmc_header_bytes);
    const std::uint32_t version = detail::load_u32_le(h + 4);
    TESSERA_THROW_IF(version != 1 && version != 2, io_error, "llm.c token file '", p,
                     "' has version ", version, "; this reader knows 1 (uint16) and 2 (uint32)");
    const std::uint64_t count = detail::load_u32_le(h + 8);
    take(p, h, bytes, llmc_header_bytes, count, version == 1 ? token_dtype::u16 : token_dtype::u32, 0);
  }

  // A NumPy .npy file (format versions 1 to 3) of a one-dimensional
  // C-order array of little-endian uint16 or uint32 ('<u2', '<u4'). The
  // header is the Python literal NumPy writes ({'descr': ..., 'fortran_order':
  // ..., 'shape': (N,), }), read field by field. No vocabulary is recorded:
  // the largest id + 1.
  void open_npy(const std::string& p, const unsigned char* h, std::uint64_t bytes) {
    TESSERA_THROW_IF(bytes < 10, io_error, "NumPy file '", p, "' is truncated: ", bytes, " bytes");
    const unsigned major = h[6];
    TESSERA_THROW_IF(major < 1 || major > 3, io_error, "NumPy file '", p, "' has format version ",
                     major, "; this reader knows 1 to 3");
    const std::uint64_t len_bytes = major == 1 ? 2 : 4;
    TESSERA_THROW_IF(bytes < 8 + len_bytes, io_error, "NumPy file '", p, "' is truncated");
    const std::uint64_t hlen =
        major == 1 ? std::uint64_t{h[8]} | std::uint64_t{h[9]} << 8 : detail::load_u32_le(h + 8);
    const std::uint64_t header = 8 + len_bytes + hlen;
    TESSERA_THROW_IF(header > bytes, io_error, "NumPy file '", p, "': its header of ", hlen,
                     " bytes runs past the end of the file (", bytes, " bytes)");
    const std::string dict(reinterpret_cast<const char*>(h + 8 + len_bytes), hlen);
    auto field = [&](const std::string& key) {
      const std::size_t k = dict.find("'" + key + "'");
      TESSERA_THROW_IF(k == std::string::npos, io_error, "NumPy file '", p, "': no '", key,
                       "' in its header ", dict);
      const std::size_t colon = dict.find(':', k);
      TESSERA_THROW_IF(colon == std::string::npos, io_error, "NumPy file '", p,
                       "': a malformed header ", dict);
      std::size_t b = dict.find_first_not_of(' ', colon + 1);
      std::size_t e = b;
      if (b != std::string::npos && dict[b] == '(') e = dict.find(')', b) + 1;
      else if (b != std::string::npos && dict[b] == '\'') e = dict.find('\'', b + 1) + 1;
      else e = dict.find_first_of(",}", b);
      TESSERA_THROW_IF(b == std::string::npos || e == std::string::npos || e <= b, io_error,
                       "NumPy file '", p, "': a malformed header ", dict);
      return dict.substr(b, e - b);
    };
    const std::string descr = field("descr"), order = field("fortran_order"), shape = field("shape");
    TESSERA_THROW_IF(descr != "'<u2'" && descr != "'<u4'", io_error, "NumPy file '", p,
                     "' holds dtype ", descr, "; token ids are read as '<u2' or '<u4' (uint16 or "
                     "uint32): convert with arr.astype(np.uint32)");
    TESSERA_THROW_IF(order != "False", io_error, "NumPy file '", p,
                     "' is in Fortran order; save a C-order array");
    // "(N,)" or "(N)": one dimension.
    std::uint64_t count = 0;
    std::size_t i = 1, digits = 0;
    for (; i < shape.size() && shape[i] >= '0' && shape[i] <= '9'; ++i, ++digits) {
      TESSERA_THROW_IF(count > (std::numeric_limits<std::uint64_t>::max() - 9) / 10, io_error,
                       "NumPy file '", p, "': shape ", shape, " overflows 64 bits");
      count = count * 10 + static_cast<std::uint64_t>(shape[i] - '0');
    }
    const std::string rest = shape.substr(i);
    TESSERA_THROW_IF(digits == 0 || (rest != ",)" && rest != ")"), io_error, "NumPy file '", p,
                     "' has shape ", shape, "; token ids are one-dimensional, (N,)");
    take(p, h, bytes, header, count, descr == "'<u2'" ? token_dtype::u16 : token_dtype::u32, 0);
  }

  // The largest id (0 for an empty file). The scan vectorizes.
  std::uint32_t max_id() const {
    std::uint32_t mx = 0;
    if (dtype_ == token_dtype::u16) {
      for (std::uint64_t i = 0; i < count_; ++i) {
        std::uint16_t v;
        std::memcpy(&v, data_ + 2 * i, 2);
        mx = v > mx ? v : mx;
      }
    } else {
      for (std::uint64_t i = 0; i < count_; ++i) {
        std::uint32_t v;
        std::memcpy(&v, data_ + 4 * i, 4);
        mx = v > mx ? v : mx;
      }
    }
    return mx;
  }

  // Every id < vocab, given the largest id `mx`; only a failure looks for the index.
  void check_ids(std::uint32_t mx) const {
    if (count_ == 0 || mx < vocab_) return;
    for (std::uint64_t i = 0; i < count_; ++i) {
      const std::uint32_t v = (*this)[i];
      TESSERA_THROW_IF(v >= vocab_, io_error, "token file '", path_.string(), "' holds token id ",
                       v, " at index ", i, ", not below the vocabulary size ", vocab_);
    }
  }

  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;  // first token, (N,) of dtype_
  std::uint64_t count_ = 0;
  std::uint64_t vocab_ = 0;
  token_dtype dtype_ = token_dtype::u16;
  std::filesystem::path path_;
};

}  // namespace tessera::data
