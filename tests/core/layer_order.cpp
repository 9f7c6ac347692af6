// The layer order of DESIGN.md ("Layer order"; docs/architecture.md):
//   core < kernels, comm, data, precision < nn < optim < parallel < plan < train < tessera.hpp
// Reads every header under include/tessera/ and fails on an include that
// points upward or sideways (into another folder of the same layer), naming
// the header, the include and both layers. Also: no CUDA translation unit
// (cuda/*.cu) reaches cblas.h through its includes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace test_core_layer_order {

#ifndef TESSERA_SOURCE_DIR
#error "layer_order.cpp needs TESSERA_SOURCE_DIR (the repository root)"
#endif

namespace fs = std::filesystem;

namespace {

const fs::path root = fs::path(TESSERA_SOURCE_DIR);

// The layer of a path relative to include/tessera/: its first folder, or the
// umbrella headers at the top.
int layer_of(const std::string& rel) {
  static const std::map<std::string, int> layers = {
      {"core", 0}, {"kernels", 1},  {"comm", 1}, {"data", 1},  {"precision", 1},
      {"nn", 2},   {"optim", 3},    {"parallel", 4}, {"plan", 5}, {"train", 6}};
  const auto slash = rel.find('/');
  if (slash == std::string::npos) return 7;  // tessera.hpp, cuda.hpp
  const auto it = layers.find(rel.substr(0, slash));
  return it == layers.end() ? -1 : it->second;
}
std::string folder_of(const std::string& rel) {
  const auto slash = rel.find('/');
  return slash == std::string::npos ? "" : rel.substr(0, slash);
}

// The tessera headers a file includes, relative to include/tessera/.
std::vector<std::string> tessera_includes(const fs::path& file) {
  static const std::regex inc(R"(^\s*#\s*include\s*[<"]tessera/([^>"]+)[>"])");
  std::vector<std::string> out;
  std::ifstream in(file);
  std::string line;
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, inc)) out.push_back(m[1]);
  return out;
}
// The system headers a file includes (<name>).
std::vector<std::string> system_includes(const fs::path& file) {
  static const std::regex inc(R"(^\s*#\s*include\s*<([^>]+)>)");
  std::vector<std::string> out;
  std::ifstream in(file);
  std::string line;
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, inc)) out.push_back(m[1]);
  return out;
}

std::vector<std::string> all_headers() {
  std::vector<std::string> hs;
  const fs::path inc = root / "include" / "tessera";
  for (const auto& e : fs::recursive_directory_iterator(inc)) {
    const auto ext = e.path().extension();
    if (e.is_regular_file() && (ext == ".hpp" || ext == ".cuh"))
      hs.push_back(fs::relative(e.path(), inc).generic_string());
  }
  return hs;
}

}  // namespace

TEST_CASE("no header includes one of a higher layer or of a sibling layer", "[layers]") {
  const auto headers = all_headers();
  REQUIRE(headers.size() > 50);  // the tree was found
  std::vector<std::string> violations;
  for (const auto& h : headers) {
    const int lh = layer_of(h);
    INFO(h);
    REQUIRE(lh >= 0);  // every folder has a layer
    for (const auto& i : tessera_includes(root / "include" / "tessera" / h)) {
      const int li = layer_of(i);
      const bool upward = li > lh;
      const bool sideways = li == lh && folder_of(i) != folder_of(h) && lh != 7;
      if (li < 0 || upward || sideways)
        violations.push_back(h + " (layer " + std::to_string(lh) + ") includes tessera/" + i +
                             " (layer " + std::to_string(li) + ")");
    }
  }
  for (const auto& v : violations) FAIL_CHECK(v);
  CHECK(violations.empty());
}

TEST_CASE("the checker itself flags an upward include", "[layers]") {
  // The rule, on names: nn (2) may include kernels (1), not plan (5); kernels
  // may not include comm (the same layer, another folder).
  CHECK(layer_of("nn/llama.hpp") == 2);
  CHECK(layer_of("plan/memory.hpp") > layer_of("nn/llama.hpp"));
  CHECK(layer_of("kernels/gemm.hpp") == layer_of("comm/local.hpp"));
  CHECK(folder_of("kernels/cuda/gemm.cuh") == "kernels");
  CHECK(layer_of("tessera.hpp") == 7);
}

TEST_CASE("no CUDA translation unit reaches cblas.h", "[layers][cuda]") {
  const fs::path inc = root / "include" / "tessera";
  std::vector<fs::path> tus;
  for (const auto& e : fs::directory_iterator(root / "cuda"))
    if (e.path().extension() == ".cu" && e.path().filename().string().rfind("kernels", 0) == 0)
      tus.push_back(e.path());
  REQUIRE(tus.size() >= 2);
  for (const auto& tu : tus) {
    INFO(tu.filename().string());
    // The transitive closure of its tessera includes.
    std::set<std::string> seen;
    std::vector<std::string> todo = tessera_includes(tu);
    bool cblas = false;
    std::string via;
    while (!todo.empty()) {
      const std::string h = todo.back();
      todo.pop_back();
      if (!seen.insert(h).second) continue;
      for (const auto& s : system_includes(inc / h))
        if (s == "cblas.h") {
          cblas = true;
          via = h;
        }
      for (const auto& i : tessera_includes(inc / h)) todo.push_back(i);
    }
    INFO("cblas.h through tessera/" << via);
    CHECK_FALSE(cblas);
    CHECK(seen.size() > 3);
  }
}

// The tsan preset runs the unit tests that start threads, found by scanning
// each test's source (tests/CMakeLists.txt, label `threads`): sound only if
// no library header starts a thread (other than OpenMP's, one per rank under
// that preset) that a test could reach without naming the thread
// communicator. This keeps it so: comm/local.hpp is the one header that does,
// and the one that names it, with train/run_job.hpp (a job's ranks as
// threads) and train/checkpoint_async.hpp (the writer of an asynchronous
// save, reached through async_checkpoint or run_options::async_checkpoints),
// which the scan also looks for. (The pattern is assembled from pieces so that
// the scan, which reads this file too, does not label this test.)
TEST_CASE("only comm/local.hpp, train/checkpoint_async.hpp and train/run_job.hpp start threads",
          "[layers][threads]") {
  const std::string std_ = "std::";
  const std::regex starts(std_ + R"((thread|jthread)\b(?!::)|)" + std_ + R"(async\b|pthread_)" +
                          "create|local_" + "world");
  const fs::path inc = root / "include" / "tessera";
  std::vector<std::string> starters;
  for (const auto& h : all_headers()) {
    std::ifstream in(inc / h);
    std::string line;
    while (std::getline(in, line))
      if (std::regex_search(line, starts)) {
        starters.push_back(h);
        break;
      }
  }
  INFO("headers that start threads or name the thread communicator: " << starters.size());
  std::sort(starters.begin(), starters.end());
  CHECK(starters == std::vector<std::string>{"comm/local.hpp", "train/checkpoint_async.hpp",
                                             "train/run_job.hpp"});
  CHECK(std::regex_search(std_ + "vector<" + std_ + "thread> ts;", starts));
  CHECK(std::regex_search(std_ + "array<" + std_ + "thread, 4> ts;", starts));
  CHECK_FALSE(std::regex_search(std_ + "hash<" + std_ + "thread::id>{}", starts));
}

}  // namespace test_core_layer_order
