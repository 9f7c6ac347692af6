#pragma once
/// \file fingerprint.hpp
/// The identity of a token file's contents (data::fingerprint): SHA-256
/// through OpenSSL's libcrypto (linked by tessera::host), cached beside
/// the file. Checkpoints record it, so a resume on another corpus is
/// refused; the 4-gram baseline's cache is keyed by it.

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/sha256.hpp"
#include "tessera/data/token_file.hpp"

namespace tessera::data {

namespace detail {

/// SHA-256 of f's count, vocabulary and token ids (32-bit little-endian),
/// through OpenSSL's EVP interface, as "sha256:<64 hex digits>".
inline std::string sha256_of_tokens(const token_file& f) {
  sha256_stream h(f.path().string());
  const std::uint64_t head[2] = {f.size(), f.vocab()};
  h.update(head, sizeof head);
  std::vector<std::int32_t> block(1 << 16);  // the ids' bits, hashed as uint32
  for (std::uint64_t i = 0; i < f.size(); i += block.size()) {
    const std::uint64_t n = std::min<std::uint64_t>(block.size(), f.size() - i);
    if (f.vocab() <= (std::uint64_t{1} << 31))
      f.read(i, static_cast<std::int64_t>(n), block.data());
    else  // ids past int32 (read() refuses them): the same bits one by one
      for (std::uint64_t j = 0; j < n; ++j) block[j] = static_cast<std::int32_t>(f[i + j]);
    h.update(block.data(), n * sizeof(std::int32_t));
  }
  return "sha256:" + h.hex();
}

}  // namespace detail

/// Where fingerprint() caches the fingerprint of token file `f`:
/// `<f>.fingerprint.json` beside it.
inline std::filesystem::path fingerprint_cache_path(const std::filesystem::path& f) {
  return f.string() + ".fingerprint.json";
}

/// The identity of a token file's contents, for checkpoints and caches:
/// "sha256:<64 hex digits>", SHA-256 (OpenSSL) over the token count, the
/// vocabulary and every token id as a 32-bit little-endian integer, so one
/// token changed anywhere changes it, and the same tokens in tessera's,
/// llm.c's or NumPy's format share it. A resumed run compares it to refuse
/// a different corpus. Hashing reads the whole file (about 1-2 GB/s), so
/// the result is kept for the process and cached beside the file in
/// `<file>.fingerprint.json`, keyed by its size, modification and change
/// times and inode; a file modified within the second before it was hashed
/// is not cached (a later change in the same clock tick would go unseen, as
/// git treats racily clean files). Where the folder is not writable the
/// process keeps it. Throws io_error if OpenSSL fails.
inline std::string fingerprint(const token_file& f) {
  struct ::stat st {};
  if (::stat(f.path().c_str(), &st) != 0) return detail::sha256_of_tokens(f);
  const std::int64_t mtime =
      static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  // ctime too: utimes() can restore an mtime after an in-place rewrite,
  // not the change time.
  const std::int64_t ctime =
      static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  const nlohmann::json key = {{"size", static_cast<std::uint64_t>(st.st_size)},
                              {"mtime_ns", mtime},
                              {"ctime_ns", ctime},
                              {"inode", static_cast<std::uint64_t>(st.st_ino)},
                              {"device", static_cast<std::uint64_t>(st.st_dev)}};
  const std::filesystem::path cache = fingerprint_cache_path(f.path());
  {
    std::ifstream in(cache);
    nlohmann::json j;
    try {
      if (in) j = parse_json_bounded("'" + cache.string() + "'", in);
    } catch (const std::exception&) {  // damaged: hashed again and rewritten
    }
    if (j.is_object() && j.value("key", nlohmann::json()) == key && j.contains("sha256") &&
        j["sha256"].is_string())
      return j["sha256"].get<std::string>();
  }
  // Once per process too (a read-only folder, a checkpoint every few steps).
  static std::mutex mu;
  static std::map<std::string, std::string> memo;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = memo.find(f.path().string() + key.dump()); it != memo.end()) return it->second;
  }
  const auto started = std::chrono::system_clock::now().time_since_epoch();
  const std::string h = detail::sha256_of_tokens(f);
  const std::int64_t started_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(started).count();
  if (std::max(mtime, ctime) < started_ns - 1000000000) {
    {
      std::lock_guard<std::mutex> lock(mu);
      memo[f.path().string() + key.dump()] = h;
    }
    try {
      write_json_file(cache,
                      {{"key", key}, {"sha256", h}, {"what", "tessera token file fingerprint"}});
    } catch (const std::exception&) {  // a read-only folder: the process's memo holds it
    }
  }
  return h;
}

}  // namespace tessera::data
