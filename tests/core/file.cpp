// Tests include/tessera/core/file.hpp's folders and resources: created_paths
// removes what a failed program created (latest first) unless kept;
// create_folders records every folder it creates and refuses a path under
// a file; remove_stale_temporaries removes a dead process's temporaries
// only; find_resource finds the bundled corpus from the test's executable.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tessera/core/file.hpp"

namespace test_core_file {

using namespace tessera;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {
struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("tessera_file_" + std::to_string(::getpid()));
  temp_dir() { fs::create_directories(path); }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
}  // namespace

TEST_CASE("created folders are removed unless kept; a path under a file is refused",
          "[core][file]") {
  temp_dir t;
  {
    created_paths created;
    create_folders(t.path / "a" / "b" / "c", created);
    CHECK(fs::is_directory(t.path / "a" / "b" / "c"));
  }
  CHECK(!fs::exists(t.path / "a"));  // every folder it created, removed
  {
    created_paths created;
    create_folders(t.path / "kept" / "run", created);
    created.keep();
  }
  CHECK(fs::is_directory(t.path / "kept" / "run"));
  std::ofstream(t.path / "file") << "x";
  created_paths none;
  REQUIRE_THROWS_AS(create_folders(t.path / "file" / "sub", none, "--out"), io_error);
  REQUIRE_THROWS_WITH(create_folders(t.path / "file" / "sub", none, "--out"),
                      Contains("--out '" + (t.path / "file" / "sub").string() + "': '" +
                               (t.path / "file").string() + "' is not a folder"));
}

TEST_CASE("stale temporaries of dead processes are removed, a live one's kept", "[core][file]") {
  temp_dir t;
  const fs::path dead = t.path / "checkpoint.bin.tmp.999999999.1";
  const fs::path live = t.path / ("checkpoint.bin.tmp." + std::to_string(::getpid()) + ".1");
  const fs::path other = t.path / "metrics.jsonl";
  // A user's files whose names merely contain ".tmp.<digits>" are not ours.
  const fs::path users = t.path / "results.tmp.2024.csv", bare = t.path / "notes.tmp.999999999";
  for (const auto& p : {dead, live, other, users, bare}) std::ofstream(p) << "x";
  remove_stale_temporaries(t.path);
  CHECK(!fs::exists(dead));
  CHECK(fs::exists(live));
  CHECK(fs::exists(other));
  CHECK(fs::exists(users));
  CHECK(fs::exists(bare));
}

TEST_CASE("find_resource finds the bundled corpus from the executable's folder", "[core][file]") {
  std::string tried;
  const fs::path p = find_resource("data/fortunes.txt", &tried);
  INFO(tried);
  REQUIRE(!p.empty());
  CHECK(fs::file_size(p) > 1000000);
  CHECK(find_resource("data/no_such_file.txt").empty());
}

}  // namespace test_core_file
