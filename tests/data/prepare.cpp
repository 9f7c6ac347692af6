// Tests include/tessera/data/prepare.hpp: UTF-8 text becomes a byte-level
// token file in the output folder (recorded as created), a token file is
// used as it is, bad data is refused naming it, and a token file's own
// tokenizer.json is found before its folder's.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tessera/data/prepare.hpp"

namespace test_data_prepare {

using namespace tessera;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {
struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("tessera_prepare_" + std::to_string(::getpid()));
  temp_dir() { fs::create_directories(path); }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
}  // namespace

TEST_CASE("text becomes a byte-level token file; a token file is read as it is",
          "[data][prepare]") {
  temp_dir t;
  std::ofstream(t.path / "story.txt") << "h\xc3\xa9llo";  // UTF-8: h, 2 bytes of e-acute, l, l, o
  const fs::path out = t.path / "out";
  fs::create_directories(out);
  fs::path tok;
  {
    created_paths created;
    tok = data::prepare_token_file(t.path / "story.txt", out, "auto", created);
    CHECK(tok == out / "story.tok");
    CHECK(tok == data::token_file_path(t.path / "story.txt", out, "auto"));
    const data::token_file f(tok);
    REQUIRE(f.size() == 6);
    CHECK(f[0] == 'h');
    CHECK(f[1] == 0xc3);
    CHECK(f[2] == 0xa9);
    CHECK(f.vocab() == 256);
    created.keep();
  }
  created_paths created;
  CHECK(data::prepare_token_file(tok, out, "auto", created) == tok);  // a token file: itself
  CHECK(data::is_text_data("a.md", "auto"));
  CHECK(!data::is_text_data("a.bin", "auto"));
  CHECK(data::is_text_data("a.bin", "text"));
  std::ofstream(t.path / "bad.txt") << "ok \xff no";
  REQUIRE_THROWS_WITH(data::prepare_token_file(t.path / "bad.txt", out, "auto", created),
                      Contains("is not UTF-8 text (invalid UTF-8 at byte 3 of 7)"));
  REQUIRE_THROWS_WITH(data::prepare_token_file("", out, "auto", created),
                      Contains("--data is empty"));
  REQUIRE_THROWS_WITH(data::prepare_token_file(t.path, out, "auto", created),
                      Contains("is a directory"));
  REQUIRE_THROWS_WITH(data::prepare_token_file(tok, out, "csv", created),
                      Contains("'csv' is not one of"));
}

TEST_CASE("a token file's own tokenizer is found before its folder's", "[data][prepare]") {
  temp_dir t;
  const fs::path tok = t.path / "b.tok";
  CHECK(data::tokenizer_of(tok).empty());
  std::ofstream(t.path / "tokenizer.json") << "{}";
  CHECK(data::tokenizer_of(tok) == t.path / "tokenizer.json");
  std::ofstream(t.path / "b.tokenizer.json") << "{}";
  CHECK(data::tokenizer_of(tok) == t.path / "b.tokenizer.json");
  CHECK(data::tokenizer_of(t.path / "a.tok") == t.path / "tokenizer.json");
  REQUIRE_THROWS_WITH(data::encode_with_tokenizer(t.path / "b.tokenizer.json", "\xff"),
                      Contains("not UTF-8 (invalid UTF-8 at byte 0 of 1)"));
}

}  // namespace test_data_prepare
