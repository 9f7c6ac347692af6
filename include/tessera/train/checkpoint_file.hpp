#pragma once
/// \file train/checkpoint_file.hpp
/// The checkpoint file of one rank: a header, JSON metadata, raw buffers and
/// a checksum. Written to a temporary name (unique per process and thread),
/// flushed to disk and renamed, so a run killed while saving leaves the
/// previous checkpoint intact.
///
/// Layout (little-endian):
///   magic "TSRACKP1" (8 bytes) | u32 version (checkpoint_version) | u32 reserved | u64 json bytes
///   | json (UTF-8) | u64 payload bytes | payload | u64 FNV-1a-64 of json + payload
/// (the metadata is covered too: an edited step or setting is refused).

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

namespace tessera::train {

inline constexpr char checkpoint_magic[9] = "TSRACKP1";
inline constexpr std::uint32_t checkpoint_version = 2;

/// FNV-1a 64-bit hash of bytes, continuing from `h` (detects truncation and
/// corruption, not tampering).
inline std::uint64_t fnv1a64(const char* p, std::size_t n,
                             std::uint64_t h = 1469598103934665603ull) {
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 1099511628211ull;
  }
  return h;
}

/// Streams the payload of a checkpoint to disk, hashing as it goes, so no
/// in-memory copy of the state is made.
class checkpoint_writer {
 public:
  /// Writes `bytes` of `p`. Throws io_error on a failed write.
  void write(const void* p, std::size_t bytes) {
    const char* c = static_cast<const char*>(p);
    hash_ = fnv1a64(c, bytes, hash_);
    written_ += bytes;
    out_->write(c, static_cast<std::streamsize>(bytes));
    TESSERA_THROW_IF(!*out_, io_error, "writing checkpoint '", path_,
                     "' failed: ", std::strerror(errno));
  }
  std::uint64_t written() const { return written_; }

 private:
  friend void write_checkpoint(const std::filesystem::path&, const nlohmann::json&, std::uint64_t,
                               const std::function<void(checkpoint_writer&)>&);
  checkpoint_writer(std::ofstream& out, std::string path) : out_(&out), path_(std::move(path)) {}
  std::ofstream* out_;
  std::string path_;
  std::uint64_t hash_ = 1469598103934665603ull;
  std::uint64_t written_ = 0;
};

/// Writes a checkpoint to `path` atomically: metadata, then `payload_bytes`
/// bytes produced by `fill` (which must write exactly that many), then the
/// checksum; the temporary file is fsync'ed, renamed over `path`, and the
/// folder fsync'ed. On any failure the temporary file is removed and io_error
/// names the path and the reason; `path` is left as it was.
inline void write_checkpoint(const std::filesystem::path& path, const nlohmann::json& meta,
                             std::uint64_t payload_bytes,
                             const std::function<void(checkpoint_writer&)>& fill) {
  const std::string js = meta.dump();
  write_file_atomically(path, [&](std::ofstream& out) {
    auto put64 = [&](std::uint64_t v) { out.write(reinterpret_cast<const char*>(&v), 8); };
    auto put32 = [&](std::uint32_t v) { out.write(reinterpret_cast<const char*>(&v), 4); };
    out.write(checkpoint_magic, 8);
    put32(checkpoint_version);
    put32(0);
    put64(js.size());
    out.write(js.data(), static_cast<std::streamsize>(js.size()));
    put64(payload_bytes);
    checkpoint_writer w(out, path.string());
    w.hash_ = fnv1a64(js.data(), js.size());
    fill(w);
    TESSERA_THROW_IF(w.written() != payload_bytes, io_error, "checkpoint '", path.string(),
                     "': wrote ", w.written(), " payload bytes, announced ", payload_bytes);
    put64(w.hash_);
  });
}

/// Reads a checkpoint written by write_checkpoint. Throws io_error naming the
/// path and the problem: missing, wrong magic, unsupported version, truncated,
/// or checksum mismatch. The whole file is read and verified before the
/// caller touches any state.
inline void read_checkpoint(const std::filesystem::path& path, nlohmann::json& meta,
                            std::vector<char>& payload) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_THROW_IF(!in, io_error, "cannot open checkpoint '", path.string(),
                   "': ", std::strerror(errno));
  char magic[8];
  in.read(magic, 8);
  TESSERA_THROW_IF(!in || std::memcmp(magic, checkpoint_magic, 8) != 0, io_error, "'",
                   path.string(), "' is not a tessera checkpoint (bad magic)");
  std::uint32_t version = 0, reserved = 0;
  std::uint64_t jn = 0, pn = 0, hash = 0;
  in.read(reinterpret_cast<char*>(&version), 4);
  in.read(reinterpret_cast<char*>(&reserved), 4);
  TESSERA_THROW_IF(!in, io_error, "checkpoint '", path.string(), "' is truncated (",
                   std::filesystem::file_size(path), " bytes, shorter than its header)");
  TESSERA_THROW_IF(version != checkpoint_version, io_error, "checkpoint '", path.string(),
                   "' has version ", version, "; this build reads version ", checkpoint_version);
  in.read(reinterpret_cast<char*>(&jn), 8);
  const auto fsize = std::filesystem::file_size(path);
  TESSERA_THROW_IF(!in || jn > fsize, io_error, "checkpoint '", path.string(),
                   "' is truncated or corrupt (metadata size ", jn, ", file ", fsize, " bytes)");
  std::string js(jn, '\0');
  in.read(js.data(), static_cast<std::streamsize>(jn));
  in.read(reinterpret_cast<char*>(&pn), 8);
  TESSERA_THROW_IF(!in, io_error, "checkpoint '", path.string(), "' is truncated (in the header)");
  // Bounded before the sum below, which a crafted size would wrap to the file's length.
  TESSERA_THROW_IF(pn > fsize, io_error, "checkpoint '", path.string(),
                   "' is corrupt: payload size ", pn, " (at byte ", 24 + jn,
                   ") exceeds the file's ", fsize, " bytes");
  const std::uint64_t expect = 8 + 4 + 4 + 8 + jn + 8 + pn + 8;
  TESSERA_THROW_IF(fsize != expect, io_error, "checkpoint '", path.string(), "' is ",
                   fsize < expect ? "truncated" : "corrupt (trailing bytes)", ": ", fsize,
                   " bytes, its header says ", expect);
  payload.assign(pn, '\0');
  in.read(payload.data(), static_cast<std::streamsize>(pn));
  in.read(reinterpret_cast<char*>(&hash), 8);
  TESSERA_THROW_IF(!in, io_error, "checkpoint '", path.string(), "' is truncated (in the payload)");
  TESSERA_THROW_IF(hash != fnv1a64(payload.data(), payload.size(), fnv1a64(js.data(), js.size())),
                   io_error, "checkpoint '", path.string(), "' is corrupt (checksum mismatch)");
  try {  // depth-bounded, as every JSON tessera reads (core/file.hpp)
    meta = parse_json_bounded("checkpoint '" + path.string() + "' metadata", js);
  } catch (const nlohmann::json::exception&) {
    meta = nlohmann::json(nlohmann::json::value_t::discarded);
  }
  TESSERA_THROW_IF(meta.is_discarded() || !meta.is_object(), io_error, "checkpoint '",
                   path.string(), "' has unreadable metadata");
}

}  // namespace tessera::train
