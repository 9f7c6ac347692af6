#pragma once
/// \file train/checkpoint.hpp
/// The checkpoint file of one rank: a header, JSON metadata, raw buffers and
/// a checksum. Written to a temporary name and renamed, so a run killed while
/// saving leaves the previous checkpoint intact.
///
/// Layout (little-endian):
///   magic "TSRACKP1" (8 bytes) | u32 version = 1 | u32 reserved | u64 json bytes
///   | json (UTF-8) | u64 payload bytes | payload | u64 FNV-1a-64 of the payload

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"

namespace tessera::train {

inline constexpr char checkpoint_magic[9] = "TSRACKP1";
inline constexpr std::uint32_t checkpoint_version = 1;

/// FNV-1a 64-bit hash of bytes (detects truncation and corruption, not tampering).
inline std::uint64_t fnv1a64(const char* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 1099511628211ull;
  }
  return h;
}

/// Writes metadata and payload to `path` atomically (temp file, then rename).
/// Throws io_error naming the path if any write fails.
inline void write_checkpoint(const std::filesystem::path& path, const nlohmann::json& meta,
                             const std::string& payload) {
  const std::string js = meta.dump();
  const std::string tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TESSERA_THROW_IF(!out, io_error, "cannot create checkpoint '", tmp, "': ", std::strerror(errno));
    auto put64 = [&](std::uint64_t v) { out.write(reinterpret_cast<const char*>(&v), 8); };
    auto put32 = [&](std::uint32_t v) { out.write(reinterpret_cast<const char*>(&v), 4); };
    out.write(checkpoint_magic, 8);
    put32(checkpoint_version);
    put32(0);
    put64(js.size());
    out.write(js.data(), static_cast<std::streamsize>(js.size()));
    put64(payload.size());
    out.write(payload.data(), static_cast<std::streamsize>(payload.size()));
    put64(fnv1a64(payload.data(), payload.size()));
    out.flush();
    TESSERA_THROW_IF(!out, io_error, "writing checkpoint '", tmp, "' failed: ", std::strerror(errno));
  }
  std::filesystem::rename(tmp, path);
}

/// Reads a checkpoint written by write_checkpoint. Throws io_error naming the
/// path and the problem: missing, wrong magic, unsupported version, truncated,
/// or checksum mismatch.
inline void read_checkpoint(const std::filesystem::path& path, nlohmann::json& meta,
                            std::string& payload) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_THROW_IF(!in, io_error, "cannot open checkpoint '", path.string(), "': ", std::strerror(errno));
  char magic[8];
  in.read(magic, 8);
  TESSERA_THROW_IF(!in || std::memcmp(magic, checkpoint_magic, 8) != 0, io_error, "'", path.string(),
                   "' is not a tessera checkpoint (bad magic)");
  std::uint32_t version = 0, reserved = 0;
  std::uint64_t jn = 0, pn = 0, hash = 0;
  in.read(reinterpret_cast<char*>(&version), 4);
  in.read(reinterpret_cast<char*>(&reserved), 4);
  TESSERA_THROW_IF(!in || version != checkpoint_version, io_error, "checkpoint '", path.string(),
                   "' has version ", version, "; this build reads version ", checkpoint_version);
  in.read(reinterpret_cast<char*>(&jn), 8);
  TESSERA_THROW_IF(!in || jn > (1ull << 30), io_error, "checkpoint '", path.string(),
                   "' is truncated or corrupt (metadata size ", jn, ")");
  std::string js(jn, '\0');
  in.read(js.data(), static_cast<std::streamsize>(jn));
  in.read(reinterpret_cast<char*>(&pn), 8);
  TESSERA_THROW_IF(!in, io_error, "checkpoint '", path.string(), "' is truncated (in the header)");
  const auto fsize = std::filesystem::file_size(path);
  TESSERA_THROW_IF(fsize != 8 + 4 + 4 + 8 + jn + 8 + pn + 8, io_error, "checkpoint '", path.string(),
                   "' is truncated: ", fsize, " bytes, header says ", 8 + 4 + 4 + 8 + jn + 8 + pn + 8);
  payload.assign(pn, '\0');
  in.read(payload.data(), static_cast<std::streamsize>(pn));
  in.read(reinterpret_cast<char*>(&hash), 8);
  TESSERA_THROW_IF(!in, io_error, "checkpoint '", path.string(), "' is truncated (in the payload)");
  TESSERA_THROW_IF(hash != fnv1a64(payload.data(), payload.size()), io_error, "checkpoint '",
                   path.string(), "' is corrupt (checksum mismatch)");
  meta = nlohmann::json::parse(js, nullptr, false);
  TESSERA_THROW_IF(meta.is_discarded(), io_error, "checkpoint '", path.string(),
                   "' has unreadable metadata");
}

}  // namespace tessera::train
