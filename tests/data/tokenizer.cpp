// Tests include/tessera/data/tokenizer.hpp: byte-level encode/decode round
// trips (ASCII, multi-byte UTF-8, arbitrary bytes) and the log rendering.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tessera/data/tokenizer.hpp"

namespace test_data_tokenizer {

using Catch::Contains;
using tessera::data::byte_tokenizer;

TEST_CASE("byte tokenizer: one token per UTF-8 byte", "[data]") {
  STATIC_REQUIRE(byte_tokenizer::vocab_size == 256);
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";  // a é € 😀 (1+2+3+4 bytes)
  const auto t = byte_tokenizer::encode(text);
  CHECK(t ==
        std::vector<std::uint32_t>{0x61, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80});
  CHECK(byte_tokenizer::decode(t) == text);
}

TEST_CASE("byte tokenizer round trips UTF-8 text and arbitrary bytes", "[data]") {
  const std::string text =
      "The quick brown fox — naïve café, Straße,\n"
      "Ελληνικά, 日本語, emoji 🦊.\n"
      "\tTabs, \\ and \"quotes\".";
  CHECK(byte_tokenizer::decode(byte_tokenizer::encode(text)) == text);
  CHECK(byte_tokenizer::encode("").empty());

  std::mt19937 rng(11);
  std::string bytes(4096, '\0');
  for (auto& c : bytes) c = static_cast<char>(rng() & 0xFF);
  const auto t = byte_tokenizer::encode(bytes);
  for (auto x : t) REQUIRE(x < 256);
  CHECK(byte_tokenizer::decode(t) == bytes);

  // int32 tokens, as the sampler's batches hold them
  const std::vector<std::int32_t> t32(t.begin(), t.end());
  CHECK(byte_tokenizer::decode(std::span<const std::int32_t>(t32)) == bytes);
}

TEST_CASE("byte tokenizer rejects ids outside [0, 256)", "[data]") {
  const std::vector<std::uint32_t> bad{104, 105, 256};
  REQUIRE_THROWS_AS(byte_tokenizer::decode(bad), tessera::config_error);
  REQUIRE_THROWS_WITH(byte_tokenizer::decode(bad), Contains("token 256") && Contains("position 2"));
  const std::vector<std::int32_t> neg{-1};
  REQUIRE_THROWS_WITH(byte_tokenizer::decode(std::span<const std::int32_t>(neg)),
                      Contains("token -1"));
}

TEST_CASE("printable rendering keeps UTF-8 and escapes the rest", "[data]") {
  CHECK(byte_tokenizer::printable("caf\xC3\xA9\n\tx\\y") == "caf\xC3\xA9\\n\\tx\\\\y");
  CHECK(byte_tokenizer::printable(std::string("a\x00\x03z", 4)) == "a\\x00\\x03z");
  // a character cut by a window boundary, a stray continuation byte, an overlong
  CHECK(byte_tokenizer::printable("\xE2\x82") == "\\xe2\\x82");
  CHECK(byte_tokenizer::printable("\x80x") == "\\x80x");
  CHECK(byte_tokenizer::printable("\xC0\xAF") == "\\xc0\\xaf");
  const std::vector<std::uint32_t> t{0x68, 0x69, 0x0A};
  CHECK(byte_tokenizer::printable(std::span<const std::uint32_t>(t)) == "hi\\n");
  CHECK(byte_tokenizer::eot == 0x03);
}

}  // namespace test_data_tokenizer
