// Tests of the byte moves of the execution contexts
// (include/tessera/kernels/context.hpp) that code above the kernels uses:
// copy_rows (a strided copy: context parallelism's token chunks and heads)
// over the host context's copy_2d, over a context without one (a copy per
// row), and dense (one copy); rows and widths of zero move nothing.
#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

#include "tessera/kernels/context.hpp"

namespace test_kernels_context {

using namespace tessera;

namespace {

// A host context without copy_2d: copy_rows falls back to a copy per row,
// and counts them.
struct row_counting_context : kernels::host_context {
  mutable int copies = 0;
  void copy(void* dst, const void* src, std::size_t bytes) const {
    ++copies;
    kernels::host_context::copy(dst, src, bytes);
  }
  void copy_2d() const = delete;
};

}  // namespace

TEST_CASE("copy_rows copies strided rows, and nothing else", "[kernels][context]") {
  // src (5, 7): rows of 3 elements from column 2 into dst (5, 4) at column 1.
  std::vector<double> src(35);
  std::iota(src.begin(), src.end(), 0.0);
  auto check = [&](const std::vector<double>& dst) {
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 4; ++j) CHECK(dst[i * 4 + j] == (j >= 1 ? src[i * 7 + 2 + j - 1] : -1.0));
  };
  std::vector<double> dst(20, -1.0);
  kernels::copy_rows(kernels::host_context{}, dst.data() + 1, 4, src.data() + 2, 7, 3, 5);
  check(dst);

  row_counting_context rc;
  std::vector<double> dst2(20, -1.0);
  kernels::copy_rows(rc, dst2.data() + 1, 4, src.data() + 2, 7, 3, 5);
  check(dst2);
  CHECK(rc.copies == 5);

  // Dense rows: one copy.
  rc.copies = 0;
  std::vector<double> dense(35, -1.0);
  kernels::copy_rows(rc, dense.data(), 7, src.data(), 7, 7, 5);
  CHECK(dense == src);
  CHECK(rc.copies == 1);

  // Nothing to move.
  rc.copies = 0;
  kernels::copy_rows(rc, dense.data(), 7, src.data(), 7, 0, 5);
  kernels::copy_rows(rc, dense.data(), 7, src.data(), 7, 7, 0);
  CHECK(rc.copies == 0);
}

}  // namespace test_kernels_context
