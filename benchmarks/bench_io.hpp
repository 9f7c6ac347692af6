// What the benchmark programs share: a JSON file written through a
// temporary name and a rename, and a token file of seeded random ids.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/random.hpp"
#include "tessera/data/token_file.hpp"

namespace bench {

/// Writes `j` (indent 1) to `path` through `path`.tmp and a rename, so a
/// reader never sees half a file. Throws tessera::io_error if it cannot write.
inline void write_json(const std::filesystem::path& path, const nlohmann::json& j) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp);
    TESSERA_THROW_IF(!(f << j.dump(1) << "\n"), tessera::io_error, "cannot write '",
                     tmp.string(), "'");
  }
  std::filesystem::rename(tmp, path);
}

/// A token file of `n` ids drawn uniformly from [0, V) with tessera::rng(seed),
/// 16-bit ids when V <= 65536.
inline void write_random_tokens(const std::filesystem::path& path, std::int64_t V,
                                std::uint64_t n, std::uint64_t seed) {
  std::vector<std::uint32_t> tok(n);
  tessera::rng r(seed);
  for (auto& t : tok)
    t = std::min<std::uint32_t>(static_cast<std::uint32_t>(r.uniform() * static_cast<double>(V)),
                                static_cast<std::uint32_t>(V - 1));
  tessera::data::write_token_file(path, tok, static_cast<std::uint64_t>(V),
                                  V <= 65536 ? tessera::data::token_dtype::u16
                                             : tessera::data::token_dtype::u32);
}

}  // namespace bench
