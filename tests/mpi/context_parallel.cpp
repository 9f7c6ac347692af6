// Context-parallel attention over MPI processes (nn/context_parallel.hpp):
// the body of tests/nn/context_parallel_suite.hpp (the one
// tests/nn/context_parallel.cpp runs on threads) with the world as the cp
// group. Run by ctest as
//   mpirun -np N test_mpi --filenames-as-tags "[#context_parallel]"
// with N = 2 and 4 (any N with 2 N dividing 48 and N dividing 12 runs: 3
// too): ring and Ulysses, causal and with packed documents, key/value heads
// split and replicated; every process's out, lse, dq, dk, dv equal the
// suite's naive float64 attention on its tokens (1e-12; Ulysses the
// single-rank kernels' bits where whole key/value groups stay on one
// rank), bf16 storage within its rounding, two runs the same bits, and
// the bytes each process sent (MPI_Isend, MPI_Allgather) and allocated are
// the closed forms of cp_suite::expected_bytes, as cp_attention_bytes says.
#include <catch2/catch.hpp>

#include <tessera/comm/mpi.hpp>

#include "../nn/context_parallel_suite.hpp"

namespace test_mpi_context_parallel {

using namespace tessera;
using comm::mpi_communicator;
using nn::cp_kind;

namespace {

mpi_communicator world() {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  return mpi_communicator(MPI_COMM_WORLD, o);
}

bool ulysses_fits(int cp, std::int64_t nh, std::int64_t nkv) {
  return nh % cp == 0 && (nkv % cp == 0 || cp % nkv == 0);
}

void check_bytes(const cp_suite::rank_result& r) {
  const cp_suite::byte_figures& e = r.expected;
  CHECK(r.forward_sent == e.forward_sent);
  CHECK(r.backward_sent == e.backward_sent);
  CHECK(r.forward_peak == e.forward_workspace + r.forward_scratch);
  CHECK(r.backward_peak == e.backward_workspace + r.backward_scratch);
  CHECK(r.predicted.forward_sent() == e.forward_sent);
  CHECK(r.predicted.backward_sent() == e.backward_sent);
  CHECK(r.predicted.forward_workspace() == e.forward_workspace);
  CHECK(r.predicted.backward_workspace() == e.backward_workspace);
}

}  // namespace

TEST_CASE("mpi context-parallel attention equals naive float64 attention",
          "[mpi][context_parallel]") {
  auto w = world();
  const kernels::attention_tiles tiles{5, 7};
  for (const bool documents : {false, true})
    for (const std::int64_t nkv : {4, 3, 2, 1}) {
      const cp_suite::problem p = cp_suite::make_problem(12, nkv, documents);
      const cp_suite::reference want = cp_suite::naive(p);
      const cp_suite::reference one = cp_suite::single_rank<double, double>(p, tiles);
      for (const cp_kind kind : {cp_kind::ring, cp_kind::ulysses}) {
        if (kind == cp_kind::ulysses && !ulysses_fits(w.size(), p.nh, nkv)) continue;
        const auto r = cp_suite::run_rank<double, double>(w, p, want, kind, tiles, &one);
        INFO(nn::to_string(kind) << " cp=" << w.size() << " nkv=" << nkv << " documents "
                                 << documents << " rank " << r.rank);
        CHECK(r.out <= 1e-12);  // float64, as on threads
        CHECK(r.lse <= 1e-12);
        CHECK(r.dq <= 1e-12);
        CHECK(r.dk <= 1e-12);
        CHECK(r.dv <= 1e-12);
        if (kind == cp_kind::ulysses && nkv % w.size() == 0) CHECK(r.bits);
        check_bytes(r);
        // A second run: the same bits.
        const auto again = cp_suite::run_rank<double, double>(w, p, want, kind, tiles);
        CHECK(cp_suite::same(r.got, again.got));
      }
    }
}

TEST_CASE("mpi context-parallel attention with bf16 storage (as float on the wire)",
          "[mpi][context_parallel]") {
  // The bounds of tests/nn/context_parallel.cpp's bf16 case, against naive
  // float64 attention of the same rounded inputs, float gradients.
  auto w = world();
  const kernels::attention_tiles tiles{5, 7};
  cp_suite::problem p = cp_suite::make_problem(12, 1, true);
  for (auto* x : {&p.q, &p.k, &p.v}) *x = testing::to_double(cp_suite::cast_all<bf16>(*x));
  const cp_suite::reference want = cp_suite::naive(p);
  for (const cp_kind kind : {cp_kind::ring, cp_kind::ulysses}) {
    if (kind == cp_kind::ulysses && !ulysses_fits(w.size(), p.nh, p.nkv)) continue;
    const auto r = cp_suite::run_rank<bf16, float>(w, p, want, kind, tiles);
    INFO(nn::to_string(kind) << " cp=" << w.size() << " rank " << r.rank);
    CHECK(r.out <= 4e-3);
    CHECK(r.lse <= 1e-5);
    CHECK(r.dq <= 2e-3);
    CHECK(r.dk <= 2e-3);
    CHECK(r.dv <= 2e-3);
    CHECK(r.predicted.param_wire == 4);
    check_bytes(r);
  }
}

}  // namespace test_mpi_context_parallel
