// Test support for tests/train: a temporary folder removed with its
// contents, and a byte-tokenized token file of random sentences from a
// small vocabulary of words (a corpus with structure a tiny model learns).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "tessera/core/random.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/data/tokenizer.hpp"

namespace train_support {

namespace fs = std::filesystem;

/// A folder under the system's temporary folder, named `prefix` and this
/// process's id, created now and removed (with what it holds) at the end.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& prefix)
      : path(fs::temp_directory_path() / (prefix + std::to_string(::getpid()))) {
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// Writes dir/corpus.tok: 20,000 bytes of words drawn by mix64 from `seed`,
/// byte-tokenized (vocabulary 256, u16). Returns its path.
inline fs::path write_word_corpus(const fs::path& dir, std::uint64_t seed) {
  std::string text;
  const char* words[] = {"the ",  "cat ", "sat ",  "on ", "a ",
                         "mat, ", "and ", "then ", "it ", "ran.\n"};
  std::uint64_t s = seed;
  while (text.size() < 20000) {
    s = tessera::mix64(s);
    text += words[s % 10];
  }
  const fs::path p = dir / "corpus.tok";
  tessera::data::write_token_file(p, tessera::data::byte_tokenizer::encode(text), 256,
                                  tessera::data::token_dtype::u16);
  return p;
}

}  // namespace train_support
