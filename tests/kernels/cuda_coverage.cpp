// Every CUDA kernel is run by the block emulator in the host tests: the
// kernels are the bodies of include/tessera/kernels/cuda/*.cuh (a `name`
// each, launched through block.hpp's one __global__ template) and the four
// flash-attention kernels, the only other __global__ functions. Each body's
// name must appear in a tests/kernels/emulated_*.cpp, whose tests record and
// check the names of the kernels they launch; the attention kernels run in
// cuda_attention_launch.cpp. README.md states the count.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace test_kernels_cuda_coverage {

namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const fs::path root = TESSERA_SOURCE_DIR;

}  // namespace

TEST_CASE("every CUDA kernel runs under the emulator in a host test", "[kernels][emulated]") {
  std::set<std::string> bodies, globals;
  const std::regex name_re(R"re(static constexpr const char\* name = "([a-z0-9_]+)")re");
  const std::regex global_re(R"(__global__ void __launch_bounds__\([^)]*\)\s*(\w+)\()");
  for (const auto& e : fs::directory_iterator(root / "include/tessera/kernels/cuda")) {
    const std::string text = read(e.path());
    for (std::sregex_iterator it(text.begin(), text.end(), name_re), end; it != end; ++it)
      bodies.insert((*it)[1]);
    for (std::sregex_iterator it(text.begin(), text.end(), global_re), end; it != end; ++it)
      globals.insert((*it)[1]);
  }
  // The one kernel template of the bodies, and the attention kernels.
  const std::set<std::string> allowed = {
      "block_kernel", "attention_forward_kernel", "attention_backward_d_kernel",
      "attention_backward_kv_kernel", "attention_backward_q_kernel"};
  CHECK(globals == allowed);

  std::string tests;
  for (const auto& e : fs::directory_iterator(root / "tests/kernels"))
    if (e.path().filename().string().rfind("emulated_", 0) == 0) tests += read(e.path());
  for (const auto& b : bodies) {
    INFO("kernel " << b);
    CHECK(tests.find('"' + b + '"') != std::string::npos);
  }
  const std::string attention = read(root / "tests/kernels/cuda_attention_launch.cpp");
  for (const char* f : {"attention_forward_block", "attention_backward_d_block",
                        "attention_backward_kv_block", "attention_backward_q_block"})
    CHECK(attention.find(f) != std::string::npos);

  const std::size_t kernels = bodies.size() + 4;
  CHECK(kernels >= 29);
  const std::string readme = read(root / "README.md");
  INFO("README.md must say: all " << kernels << " CUDA kernels");
  CHECK(readme.find("all " + std::to_string(kernels) + " CUDA kernels") != std::string::npos);
}

}  // namespace test_kernels_cuda_coverage
