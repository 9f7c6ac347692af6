#pragma once
/// \file data/hf_tokenizer.hpp
/// A Hugging Face `tokenizer.json` read for decoding: the bytes each id
/// stands for, so samples print as text and losses convert to nats per
/// byte. Training and encoding stay with the `tokenizers` library
/// (scripts/tokenizer.py); decoding is a table lookup.
///
/// Two decoders are understood: ByteLevel (GPT-2, Llama 3, the BPE that
/// scripts/tokenizer.py trains: each character of a token is one byte
/// through GPT-2's byte-to-unicode table) and SentencePiece's byte fallback
/// (Llama 2, Mistral: a Sequence of Replace "▁" -> " ", ByteFallback
/// "<0xNN>" -> byte NN, Fuse and Strip of the leading space).

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

namespace tessera::data {

/// GPT-2's byte-to-unicode table (bytes_to_unicode in its encoder.py): the
/// printable bytes 33-126, 161-172 and 174-255 stand for themselves, the
/// other 68 for the code points 256, 257, ... in byte order. Returns the
/// code point of byte b.
inline char32_t byte_level_char(unsigned char b) {
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  if (printable) return b;
  char32_t n = 0;  // the rank of b among the non-printable bytes
  for (unsigned c = 0; c < b; ++c)
    if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) ++n;
  return 256 + n;
}

/// A tokenizer.json's id -> bytes table.
class hf_tokenizer {
public:
  /// Reads `path`. Throws io_error naming the file for a missing or
  /// malformed one, config_error naming the decoder for one this reader
  /// does not decode, and io_error for a token that the decoder cannot
  /// map to bytes (a character outside GPT-2's table).
  explicit hf_tokenizer(const std::filesystem::path& path) : path_(path) {
    std::ifstream in(path);
    TESSERA_THROW_IF(!in, io_error, "cannot read tokenizer '", path.string(), "'");
    nlohmann::json j;
    try {
      j = tessera::parse_json_bounded("tokenizer '" + path.string() + "'", in);
    } catch (const nlohmann::json::exception& e) {
      throw io_error("tokenizer '" + path.string() + "' is not JSON: " + e.what());
    }
    TESSERA_THROW_IF(!j.is_object() || !j.contains("model") || !j["model"].is_object() ||
                         !j["model"].contains("vocab") || !j["model"]["vocab"].is_object(),
                     io_error, "tokenizer '", path.string(), "' has no model.vocab object");
    kind_ = decoder_kind(j.contains("decoder") ? j["decoder"] : nlohmann::json());
    std::vector<std::pair<std::uint64_t, std::string>> pieces;
    for (const auto& [tok, id] : j["model"]["vocab"].items()) {
      TESSERA_THROW_IF(!id.is_number_unsigned(), io_error, "tokenizer '", path.string(),
                       "': the id of '", tok, "' is not a non-negative integer");
      pieces.emplace_back(id.get<std::uint64_t>(), decode_piece(tok));
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
      for (const auto& a : j["added_tokens"])
        if (a.is_object() && a.contains("id") && a["id"].is_number_unsigned() &&
            a.contains("content") && a["content"].is_string())
          pieces.emplace_back(a["id"].get<std::uint64_t>(),
                              a.value("special", false) ? std::string()
                                                        : a["content"].get<std::string>());
    std::uint64_t n = 0;
    for (const auto& [id, b] : pieces) n = std::max(n, id + 1);
    TESSERA_THROW_IF(n > (std::uint64_t{1} << 31), io_error, "tokenizer '", path.string(),
                     "' has an id ", n - 1, " beyond 2^31");
    bytes_.assign(static_cast<std::size_t>(n), std::string());
    for (auto& [id, b] : pieces) bytes_[static_cast<std::size_t>(id)] = std::move(b);
  }

  /// Ids the tokenizer knows (its largest id + 1, added tokens included).
  std::uint64_t vocab_size() const { return bytes_.size(); }
  /// The bytes id `id` stands for ("" for a special token or an id out of range).
  const std::string& token_bytes(std::uint32_t id) const {
    static const std::string none;
    return id < bytes_.size() ? bytes_[id] : none;
  }
  /// The bytes of a sequence of ids (SentencePiece's leading space of the
  /// first piece stripped, as its Strip decoder does).
  std::string decode(std::span<const std::uint32_t> ids) const {
    std::string out;
    for (std::uint32_t id : ids) out += token_bytes(id);
    if (kind_ == kind::sentencepiece && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }
  const std::filesystem::path& path() const { return path_; }

private:
  enum class kind { byte_level, sentencepiece };

  kind decoder_kind(const nlohmann::json& d) const {
    const std::string t = d.is_object() && d.contains("type") && d["type"].is_string()
                              ? d["type"].get<std::string>()
                              : std::string("(none)");
    if (t == "ByteLevel") return kind::byte_level;
    if (t == "Sequence" || t == "Metaspace") return kind::sentencepiece;
    throw config_error("tokenizer '" + path_.string() + "' has decoder " + t +
                       "; tessera decodes ByteLevel (GPT-2, Llama 3, scripts/tokenizer.py's BPE) "
                       "and SentencePiece byte fallback (Llama 2)");
  }

  // One vocabulary entry as bytes.
  std::string decode_piece(const std::string& tok) const {
    if (kind_ == kind::sentencepiece) {
      if (tok.size() == 6 && tok.starts_with("<0x") && tok.back() == '>')
        return std::string(1, static_cast<char>(std::stoi(tok.substr(3, 2), nullptr, 16)));
      std::string out;
      for (std::size_t i = 0; i < tok.size(); ++i) {
        if (tok.compare(i, 3, "\xe2\x96\x81") == 0) {  // U+2581, SentencePiece's space
          out += ' ';
          i += 2;
        } else {
          out += tok[i];
        }
      }
      return out;
    }
    // ByteLevel: each UTF-8 character of the token is one byte.
    static const std::vector<int> from_char = [] {
      std::vector<int> m(512, -1);
      for (int b = 0; b < 256; ++b) m[byte_level_char(static_cast<unsigned char>(b))] = b;
      return m;
    }();
    std::string out;
    for (std::size_t i = 0; i < tok.size();) {
      const auto c = static_cast<unsigned char>(tok[i]);
      char32_t cp = 0;
      std::size_t len = 1;
      if (c < 0x80) cp = c;
      else if ((c >> 5) == 6 && i + 1 < tok.size()) {
        cp = (c & 0x1fu) << 6 | (static_cast<unsigned char>(tok[i + 1]) & 0x3fu);
        len = 2;
      } else {
        cp = 0x110000;  // longer sequences are outside the table
      }
      TESSERA_THROW_IF(cp >= from_char.size() || from_char[cp] < 0, io_error, "tokenizer '",
                       path_.string(), "': token '", tok,
                       "' has a character outside the byte-level table");
      out += static_cast<char>(from_char[cp]);
      i += len;
    }
    return out;
  }

  std::filesystem::path path_;
  kind kind_ = kind::byte_level;
  std::vector<std::string> bytes_;
};

}  // namespace tessera::data
