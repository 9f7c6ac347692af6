#pragma once
/// \file data/prepare.hpp
/// Turning what a user names as training data into what a trainer reads:
/// a token file (tessera's, llm.c's .bin, NumPy's .npy) as it is, or UTF-8
/// text byte-tokenized into a token file; the Hugging Face tokenizer that
/// belongs to a token file; a text encoded through it
/// (scripts/tokenizer.py, Hugging Face `tokenizers`); and the 4-gram
/// Kneser-Ney baseline of a corpus (scripts/ngram_baseline.py), cached
/// beside it. The scripts are found with find_resource.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/data/fingerprint.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/data/tokenizer.hpp"

namespace tessera::data {

/// `s` quoted for /bin/sh (single quotes, embedded ones escaped).
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// The most bytes of text prepare_token_file byte-tokenizes in memory (4 GiB).
inline constexpr std::uintmax_t max_text_bytes = std::uintmax_t{1} << 32;

/// Whether prepare_token_file reads `data` as UTF-8 text under `format`:
/// "text", or under "auto" a .txt, .text or .md extension.
inline bool is_text_data(const std::filesystem::path& data, const std::string& format) {
  const std::string ext = data.extension().string();
  return format == "text" ||
         (format == "auto" && (ext == ".txt" || ext == ".text" || ext == ".md"));
}

/// The path prepare_token_file returns for `data` (nothing is checked or written).
inline std::filesystem::path token_file_path(const std::filesystem::path& data,
                                             const std::filesystem::path& out,
                                             const std::string& format) {
  return is_text_data(data, format) ? out / (data.stem().string() + ".tok") : data;
}

/// The token file of `data`: `data` itself when it is a token file (every
/// header field and id checked, the file named), or, for UTF-8 text, a
/// byte-tokenized copy `out`/<stem>.tok written now (recorded in `created`
/// when new). Text is text by `format` "text", or under "auto" by its
/// extension (.txt, .text, .md), so a token file whose header is damaged
/// is refused by its reader, never trained on as text. Only regular files
/// are read (a device or a FIFO would never end). Throws config_error for
/// a format other than auto, text, tokens; io_error naming the file for a
/// missing, unreadable, empty, non-UTF-8 or oversized text (max_text_bytes)
/// and for what token_file refuses.
inline std::filesystem::path prepare_token_file(const std::filesystem::path& data,
                                                const std::filesystem::path& out,
                                                const std::string& format, created_paths& created) {
  namespace fs = std::filesystem;
  std::error_code ec;
  TESSERA_THROW_IF(format != "auto" && format != "text" && format != "tokens", config_error,
                   "--data-format '", format, "' is not one of auto, text, tokens");
  TESSERA_THROW_IF(data.empty(), config_error,
                   "--data is empty: name a token file or a UTF-8 text");
  TESSERA_THROW_IF(!fs::exists(data, ec), io_error, "data file '", data.string(),
                   "' does not exist");
  TESSERA_THROW_IF(fs::is_directory(data, ec), io_error, "data path '", data.string(),
                   "' is a directory, not a file");
  TESSERA_THROW_IF(!fs::is_regular_file(data, ec), io_error, "data path '", data.string(),
                   "' is not a regular file (a device, a FIFO or a socket would not end)");
  std::ifstream probe(data, std::ios::binary);
  TESSERA_THROW_IF(!probe, io_error, "data file '", data.string(), "' is not readable");
  if (!is_text_data(data, format)) {
    (void)token_file(data);
    return data;
  }
  // Text: byte-tokenized into the output folder on every run (2.5 MB takes
  // milliseconds), so a cached file can never stand in for different text.
  const std::uintmax_t size = fs::file_size(data, ec);
  TESSERA_THROW_IF(size > max_text_bytes, io_error, "text file '", data.string(), "' holds ", size,
                   " bytes, more than the ", max_text_bytes,
                   " tessera byte-tokenizes in memory: write a token file with "
                   "examples/tokenize or scripts/tokenizer.py");
  const fs::path tok = token_file_path(data, out, format);
  std::string bytes((std::istreambuf_iterator<char>(probe)), std::istreambuf_iterator<char>());
  TESSERA_THROW_IF(bytes.empty(), io_error, "data file '", data.string(), "' is empty");
  const std::size_t bad = first_invalid_utf8(bytes);
  TESSERA_THROW_IF(bad != std::string::npos, io_error, "data file '", data.string(),
                   "' is not UTF-8 text (invalid UTF-8 at byte ", bad, " of ", bytes.size(),
                   "); a token file is read by its header: give it another extension than .txt, "
                   ".text or .md, or --data-format tokens");
  const bool existed = fs::exists(tok);
  write_token_file(tok, byte_tokenizer::encode(bytes), byte_tokenizer::vocab_size,
                   token_dtype::u16);
  if (!existed) {  // with the fingerprint cache a later read may write beside it
    created.add(tok);
    created.add(fingerprint_cache_path(tok));
  }
  return tok;
}

/// The Hugging Face tokenizer.json a token file was encoded with, as
/// scripts/tokenizer.py writes it: <stem>.tokenizer.json beside the token
/// file, else (files of older tessera) tokenizer.json in its folder; ""
/// when neither exists.
inline std::filesystem::path tokenizer_of(const std::filesystem::path& token_file) {
  std::error_code ec;
  const std::filesystem::path own =
      token_file.parent_path() / (token_file.stem().string() + ".tokenizer.json");
  if (std::filesystem::is_regular_file(own, ec)) return own;
  const std::filesystem::path folder = token_file.parent_path() / "tokenizer.json";
  if (std::filesystem::is_regular_file(folder, ec)) return folder;
  return {};
}

/// The ids of the UTF-8 `text` through the Hugging Face tokenizer
/// `tokenizer` (scripts/tokenizer.py ids, found by find_resource; python3
/// with `tokenizers`). Throws config_error naming the cause for text that
/// is not UTF-8, a missing script or python3, a failed encoding (its
/// message), or no tokens.
inline std::vector<std::int32_t> encode_with_tokenizer(const std::filesystem::path& tokenizer,
                                                       const std::string& text) {
  const std::size_t bad = first_invalid_utf8(text);
  TESSERA_THROW_IF(bad != std::string::npos, config_error,
                   "the text to encode is not UTF-8 "
                   "(invalid UTF-8 at byte ",
                   bad, " of ", text.size(), ")");
  std::string tried;
  const std::filesystem::path script = find_resource("scripts/tokenizer.py", &tried);
  TESSERA_THROW_IF(script.empty(), config_error,
                   "encoding text needs scripts/tokenizer.py (looked in ", tried, ")");
  // "--" ends the options: a text that starts with '-' is the text.
  const std::string cmd = "python3 " + shell_quote(script.string()) + " ids --tokenizer " +
                          shell_quote(tokenizer.string()) + " -- " + shell_quote(text) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  TESSERA_THROW_IF(p == nullptr, config_error, "cannot run python3 to encode text");
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int rc = ::pclose(p);
  TESSERA_THROW_IF(rc != 0, config_error, "encoding with '", tokenizer.string(),
                   "' failed (python3 scripts/tokenizer.py ids; Hugging Face tokenizers: pip "
                   "install tokenizers): ",
                   out);
  std::vector<std::int32_t> ids;
  std::istringstream is(out);
  for (long long id; is >> id;) ids.push_back(static_cast<std::int32_t>(id));
  TESSERA_THROW_IF(ids.empty(), config_error, "'", text, "' encodes to no tokens through '",
                   tokenizer.string(), "'");
  return ids;
}

/// The 4-gram Kneser-Ney validation loss (nats per byte) of the token file
/// `tok` (scripts/ngram_baseline.py): computed once per corpus and cached
/// as JSON beside `corpus` (the file the user named; beside `tok` when that
/// folder is not writable), keyed by the token file's fingerprint.
/// nullopt when python3 or the script is missing (the run goes on without
/// it); never throws for them.
inline std::optional<double> ngram_baseline(const std::filesystem::path& tok,
                                            const std::filesystem::path& corpus) {
  const token_file tf(tok);
  const std::string fp = fingerprint(tf);
  const std::vector<std::filesystem::path> caches{corpus.string() + ".ngram4.json",
                                                  tok.string() + ".ngram4.json"};
  for (const auto& c : caches) {
    std::ifstream in(c);
    if (!in) continue;
    const auto j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_discarded() && j.contains("fingerprint") && j["fingerprint"] == fp &&
        j.contains("val_nats_per_byte") && j["val_nats_per_byte"].is_number())
      return j["val_nats_per_byte"].get<double>();
  }
  const std::filesystem::path script = find_resource("scripts/ngram_baseline.py");
  if (script.empty()) return std::nullopt;
  const std::string cmd = "python3 " + shell_quote(script.string()) + " --json " +
                          shell_quote(tok.string()) + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  ::pclose(p);
  const auto brace = out.find_last_of('{');
  if (brace == std::string::npos) return std::nullopt;
  const auto j = nlohmann::json::parse(out.substr(brace), nullptr, false);
  if (j.is_discarded() || !j.contains("val_nats_per_byte")) return std::nullopt;
  const double v = j["val_nats_per_byte"].get<double>();
  for (const auto& c : caches) {  // the first folder that takes it
    try {
      write_json_file(c, {{"fingerprint", fp},
                          {"val_nats_per_byte", v},
                          {"order", 4},
                          {"token_file", tok.string()}});
      break;
    } catch (const std::exception&) {
    }
  }
  return v;
}

}  // namespace tessera::data
