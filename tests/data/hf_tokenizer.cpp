// Tests include/tessera/data/hf_tokenizer.hpp: GPT-2's byte-to-unicode table
// (all 256 bytes, one to one, the printable ones themselves), ByteLevel and
// SentencePiece byte-fallback decoding of hand-written tokenizer.json files,
// special tokens, and the refusals. (Against the `tokenizers` library on a
// trained BPE: tests/python/hf_interop.sh.)
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/data/hf_tokenizer.hpp"

namespace test_data_hf_tokenizer {

namespace fs = std::filesystem;
using namespace tessera;
using Catch::Contains;

namespace {

fs::path write_json(const std::string& name, const nlohmann::json& j) {
  const fs::path p = fs::temp_directory_path() /
                     ("tessera_tok_" + std::to_string(::getpid()) + "_" + name + ".json");
  std::ofstream(p) << j.dump();
  return p;
}

// UTF-8 of a code point below 0x800.
std::string utf8(char32_t c) {
  if (c < 0x80) return std::string(1, static_cast<char>(c));
  return {static_cast<char>(0xc0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3f))};
}

}  // namespace

TEST_CASE("GPT-2's byte-to-unicode table is a bijection onto 256 code points", "[data][tokenizer]") {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = data::byte_level_char(static_cast<unsigned char>(b));
    seen.insert(c);
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    if (printable) CHECK(c == static_cast<char32_t>(b));
    else CHECK(c >= 256);
  }
  CHECK(seen.size() == 256);
  // The worked values of GPT-2's encoder.py: space is 'Ġ' (U+0120), newline 'Ċ' (U+010A).
  CHECK(data::byte_level_char(' ') == 0x120);
  CHECK(data::byte_level_char('\n') == 0x10a);
  CHECK(data::byte_level_char(0) == 256);
}

TEST_CASE("a ByteLevel tokenizer.json decodes ids to bytes", "[data][tokenizer]") {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[utf8(data::byte_level_char(static_cast<unsigned char>(b)))] = b;
  vocab[utf8(0x120) + "the"] = 256;                     // " the"
  vocab["ca" + utf8(0x10a)] = 257;                      // "ca\n"
  vocab[utf8(data::byte_level_char(0xc3)) + utf8(data::byte_level_char(0xa9))] = 258;  // "é"
  const nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", {{{"id", 259}, {"content", "<|endoftext|>"}, {"special", true}},
                        {{"id", 260}, {"content", "<tag>"}, {"special", false}}}}};
  const fs::path p = write_json("bytelevel", j);
  const data::hf_tokenizer t(p);
  CHECK(t.vocab_size() == 261);
  const std::vector<std::uint32_t> ids = {'H', 'i', 256, 257, 258, 259, 260, 0};
  CHECK(t.decode(ids) == std::string("Hi the") + "ca\n" + "\xc3\xa9" + "<tag>" + std::string(1, '\0'));
  CHECK(t.token_bytes(259).empty());   // special: not text
  CHECK(t.token_bytes(9999).empty());  // out of range
  fs::remove(p);
}

TEST_CASE("a SentencePiece byte-fallback tokenizer.json decodes as Llama 2's does", "[data][tokenizer]") {
  const nlohmann::json j = {
      {"model",
       {{"type", "BPE"},
        {"vocab",
         {{"<unk>", 0}, {"<0x0A>", 1}, {"\xe2\x96\x81Hello", 2}, {"\xe2\x96\x81world", 3}, {"!", 4}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}}, {{"type", "ByteFallback"}}, {{"type", "Fuse"}}, {{"type", "Strip"}}}}}}};
  const fs::path p = write_json("spm", j);
  const data::hf_tokenizer t(p);
  const std::vector<std::uint32_t> ids = {2, 3, 4, 1, 2};
  CHECK(t.decode(ids) == "Hello world!\n Hello");
  fs::remove(p);
}

TEST_CASE("tokenizer.json files tessera cannot decode are refused, naming them", "[data][tokenizer]") {
  const fs::path wp = write_json(
      "wordpiece", {{"model", {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}}},
                    {"decoder", {{"type", "WordPiece"}}}});
  REQUIRE_THROWS_AS(data::hf_tokenizer(wp), config_error);
  REQUIRE_THROWS_WITH(data::hf_tokenizer(wp), Contains("has decoder WordPiece") && Contains(wp.string()));
  const fs::path unigram = write_json("unigram", {{"model", {{"type", "Unigram"}, {"vocab", nlohmann::json::array({nlohmann::json::array({"a", -0.5})})}}}});
  REQUIRE_THROWS_WITH(data::hf_tokenizer(unigram), Contains("has no model.vocab object"));
  const fs::path bad = write_json("bad", {{"model", {{"vocab", {{utf8(0x400), 0}}}}}, {"decoder", {{"type", "ByteLevel"}}}});
  REQUIRE_THROWS_WITH(data::hf_tokenizer(bad), Contains("outside the byte-level table"));
  REQUIRE_THROWS_WITH(data::hf_tokenizer("/nonexistent/tokenizer.json"), Contains("cannot read tokenizer"));
  for (const auto& p : {wp, unigram, bad}) fs::remove(p);
}

}  // namespace test_data_hf_tokenizer
