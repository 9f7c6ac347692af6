// Tests include/tessera/core/nvtx.hpp on the host (no TESSERA_WITH_NVTX):
// the macro compiles to nothing and evaluates nothing, and nvtx_range keeps
// ranges balanced per thread, through nesting, early returns and exceptions.
// The NVTX-enabled form is compiled by cuda/all_headers.cu (nvcc) and used by
// tests/cuda/loader.cpp (g++ with tessera::cuda, which defines TESSERA_WITH_NVTX).
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "tessera/core/nvtx.hpp"

namespace test_core_nvtx {

#define TESSERA_TEST_STR_IMPL(...) #__VA_ARGS__
#define TESSERA_TEST_STR(...) TESSERA_TEST_STR_IMPL(__VA_ARGS__)

using tessera::nvtx_range;

namespace {

int depth_inside(int levels) {
  if (levels == 0) return nvtx_range::depth();
  nvtx_range r("level ", levels);
  return depth_inside(levels - 1);
}

int early_return(bool early) {
  nvtx_range r("early_return");
  if (early) return nvtx_range::depth();
  nvtx_range inner("late");
  return nvtx_range::depth();
}

}  // namespace

#if defined(TESSERA_WITH_NVTX)
#error "tests/core/nvtx.cpp is the host test: it must be built without TESSERA_WITH_NVTX"
#endif

TEST_CASE("TESSERA_NVTX_RANGE compiles to nothing without TESSERA_WITH_NVTX", "[core][nvtx]") {
  static_assert(!nvtx_range::enabled);
  // The expansion is a no-op expression: nothing is declared.
  constexpr std::string_view expansion = TESSERA_TEST_STR(TESSERA_NVTX_RANGE("fwd block ", 3));
  STATIC_REQUIRE(expansion == "static_cast<void>(0)");
  // ... and the name's parts are not evaluated.
  int evaluated = 0;
  auto name = [&] {
    ++evaluated;
    return std::string("costly name");
  };
  {
    TESSERA_NVTX_RANGE(name());
    TESSERA_NVTX_RANGE("block ", name(), " of ", 32);
    CHECK(nvtx_range::depth() == 0);
  }
  CHECK(evaluated == 0);
  CHECK(name() == "costly name");  // (the lambda is otherwise unused without NVTX)
  CHECK(nvtx_range::depth() == 0);
}

TEST_CASE("nvtx_range: nested ranges are balanced", "[core][nvtx]") {
  REQUIRE(nvtx_range::depth() == 0);
  {
    nvtx_range a("step");
    CHECK(nvtx_range::depth() == 1);
    {
      nvtx_range b("fwd block ", 3);
      const std::string name = "bwd";
      nvtx_range c(name);
      CHECK(nvtx_range::depth() == 3);
    }
    CHECK(nvtx_range::depth() == 1);
    for (int l = 0; l < 32; ++l) {
      nvtx_range r("fwd block ", l, " of ", 32);
      CHECK(nvtx_range::depth() == 2);
    }
  }
  CHECK(nvtx_range::depth() == 0);
  CHECK(depth_inside(10) == 10);
  CHECK(nvtx_range::depth() == 0);
  CHECK(early_return(true) == 1);
  CHECK(early_return(false) == 2);
  CHECK(nvtx_range::depth() == 0);
}

TEST_CASE("nvtx_range: an exception pops every range it leaves", "[core][nvtx]") {
  try {
    nvtx_range a("outer");
    nvtx_range b("inner ", 1);
    throw std::runtime_error("leave");
  } catch (const std::runtime_error&) {
    CHECK(nvtx_range::depth() == 0);
  }
  CHECK(nvtx_range::depth() == 0);
}

TEST_CASE("nvtx_range: the depth is per thread", "[core][nvtx]") {
  nvtx_range a("main thread");
  int other = -1;
  std::thread t([&] {
    nvtx_range b("worker");
    nvtx_range c("worker inner");
    other = nvtx_range::depth();
  });
  t.join();
  CHECK(other == 2);
  CHECK(nvtx_range::depth() == 1);
}

}  // namespace test_core_nvtx

#undef TESSERA_TEST_STR
#undef TESSERA_TEST_STR_IMPL
