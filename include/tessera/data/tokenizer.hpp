#pragma once
/// \file tokenizer.hpp
/// The byte-level tokenizer: every byte of the (UTF-8) text is one token, so
/// the vocabulary is exactly the 256 byte values and any byte string round
/// trips. A multi-byte UTF-8 character becomes several tokens ("é" is
/// 0xC3 0xA9); the model learns the encoding, as byte-level models do.
///
/// End of text: there is no token outside the 256 bytes. Tools that separate
/// documents (examples/tokenize --append-eot) use `byte_tokenizer::eot`, the
/// ASCII control byte ETX ("end of text", 0x03), which does not occur in
/// ordinary text, so the vocabulary stays 256.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"

namespace tessera::data {

/// Offset of the first byte of `text` that is not part of well-formed UTF-8
/// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), or
/// std::string::npos if the whole text is valid. Used to refuse a binary or
/// foreign file offered as text.
inline std::size_t first_invalid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong 3-byte forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // no overlong 4-byte forms
      if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string::npos;
}

/// Byte-level tokenizer, vocabulary 256. Stateless; all members are static.
struct byte_tokenizer {
  /// Vocabulary size V: the 256 byte values.
  static constexpr std::uint32_t vocab_size = 256;
  /// End-of-text separator: ASCII ETX (0x03). Itself a byte, so V stays 256.
  static constexpr std::uint32_t eot = 0x03;

  /// Encodes `text` (any bytes; UTF-8 by convention) to one token per byte:
  /// result[i] = (unsigned char)text[i], each in [0, 256). Length = text.size().
  static std::vector<std::uint32_t> encode(std::string_view text) {
    std::vector<std::uint32_t> out(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
    return out;
  }

  /// Decodes tokens back to the bytes they stand for (the inverse of `encode`).
  /// Accepts any integer token type (uint32 from `encode`, int32 from the
  /// sampler's batches). The result may be invalid UTF-8 if `tokens` cuts a
  /// multi-byte character; use `printable` for logs.
  /// \throws config_error naming the token and its position if one is not in [0, 256).
  template <class Int>
  requires std::is_integral_v<Int>
  static std::string decode(std::span<const Int> tokens) {
    std::string out(tokens.size(), '\0');
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto t = tokens[i];
      TESSERA_THROW_IF(!std::in_range<unsigned char>(t), config_error, "token ", +t,
                       " at position ", i,
                       " is not a byte: the byte tokenizer's vocabulary is [0, 256)");
      out[i] = static_cast<char>(static_cast<unsigned char>(t));
    }
    return out;
  }
  /// `decode` for a vector of uint32 tokens.
  static std::string decode(const std::vector<std::uint32_t>& tokens) {
    return decode(std::span<const std::uint32_t>(tokens));
  }

  /// Renders bytes for a one-line log: well-formed UTF-8 sequences and
  /// printable ASCII pass through; newline, tab and carriage return become
  /// \n \t \r; backslash becomes \\; every other byte (control bytes, stray
  /// continuation bytes, a character cut at either end) becomes \xHH.
  /// The output never contains a raw control byte or newline.
  static std::string printable(std::string_view bytes) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string s;
    s.reserve(bytes.size());
    std::size_t i = 0;
    while (i < bytes.size()) {
      const auto c = static_cast<unsigned char>(bytes[i]);
      if (c >= 0x80) {
        const std::size_t len = utf8_sequence_length(bytes.substr(i));
        if (len > 0) {
          s.append(bytes.substr(i, len));
          i += len;
          continue;
        }
      }
      switch (c) {
        case '\n':
          s += "\\n";
          break;
        case '\t':
          s += "\\t";
          break;
        case '\r':
          s += "\\r";
          break;
        case '\\':
          s += "\\\\";
          break;
        default:
          if (c >= 0x20 && c < 0x7f) {
            s += static_cast<char>(c);
          } else {
            s += "\\x";
            s += hex[c >> 4];
            s += hex[c & 15];
          }
      }
      ++i;
    }
    return s;
  }
  /// `printable(decode(tokens))`. \throws config_error as `decode`.
  template <class Int>
  requires std::is_integral_v<Int>
  static std::string printable(std::span<const Int> tokens) {
    return printable(std::string_view(decode(tokens)));
  }

 private:
  // Length (2..4) of the well-formed UTF-8 sequence starting `s` (RFC 3629:
  // no overlongs, no surrogates, at most U+10FFFF), or 0 if it is not one.
  static std::size_t utf8_sequence_length(std::string_view s) {
    const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(0);
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return 0;
    }
    if (s.size() < len) return 0;
    if (b(1) < lo || b(1) > hi) return 0;
    for (std::size_t k = 2; k < len; ++k)
      if (b(k) < 0x80 || b(k) > 0xBF) return 0;
    return len;
  }
};

}  // namespace tessera::data
