// Context-parallel attention over MPI processes (nn/context_parallel.hpp):
// the body of tests/nn/context_parallel_suite.hpp (the one
// tests/nn/context_parallel.cpp runs on threads) with the world as the cp
// group. Run by ctest as
//   mpirun -np N test_mpi --filenames-as-tags "[#context_parallel]"
// with N = 2 and 4: ring and Ulysses, causal and with packed documents,
// key/value heads split and replicated; every process's out, lse, dq, dk,
// dv equal single-rank attention's on its tokens in float64 (1e-12; Ulysses
// bit for bit where whole key/value groups stay on one rank), bf16 storage
// within its rounding, and the bytes each process sent (MPI_Isend) are
// cp_attention_bytes' figures.
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

}  // namespace

TEST_CASE("mpi context-parallel attention equals single-rank attention (float64)",
          "[mpi][context_parallel]") {
  auto w = world();
  const kernels::attention_tiles tiles{3, 5};
  for (const bool documents : {false, true})
    for (const std::int64_t nkv : {4, 2, 1}) {
      const cp_suite::problem p = cp_suite::make_problem(4, nkv, documents);
      const cp_suite::reference ref = cp_suite::single_rank<double, double>(p, tiles);
      for (const cp_kind kind : {cp_kind::ring, cp_kind::ulysses}) {
        const auto r = cp_suite::run_rank<double, double>(w, p, ref, kind, tiles);
        INFO(nn::to_string(kind) << " cp=" << w.size() << " nkv=" << nkv << " documents "
                                 << documents << " rank " << r.rank);
        CHECK(r.out <= 1e-12);  // float64, as on threads
        CHECK(r.lse <= 1e-12);
        CHECK(r.dq <= 1e-12);
        CHECK(r.dk <= 1e-12);
        CHECK(r.dv <= 1e-12);
        if (kind == cp_kind::ulysses && nkv % w.size() == 0) CHECK(r.bits);
        CHECK(r.forward_sent == r.predicted.forward_sent());
        CHECK(r.backward_sent == r.predicted.backward_sent());
        CHECK(r.forward_peak == r.predicted.forward_workspace() + r.forward_scratch);
        CHECK(r.backward_peak == r.predicted.backward_workspace() + r.backward_scratch);
      }
    }
}

TEST_CASE("mpi context-parallel attention with bf16 storage (as float on the wire)",
          "[mpi][context_parallel]") {
  // The bounds of tests/nn/context_parallel.cpp's bf16 case, against
  // float64 of the same rounded inputs, float gradients.
  auto w = world();
  const kernels::attention_tiles tiles{3, 5};
  cp_suite::problem p = cp_suite::make_problem(4, 1, true);
  for (auto* x : {&p.q, &p.k, &p.v}) *x = cp_suite::widen(cp_suite::cast_all<bf16>(*x));
  const cp_suite::reference want = cp_suite::single_rank<double, double>(p, tiles);
  for (const cp_kind kind : {cp_kind::ring, cp_kind::ulysses}) {
    const auto r = cp_suite::run_rank<bf16, float>(w, p, want, kind, tiles);
    INFO(nn::to_string(kind) << " cp=" << w.size() << " rank " << r.rank);
    CHECK(r.out <= 4e-3);
    CHECK(r.lse <= 1e-5);
    CHECK(r.dq <= 2e-3);
    CHECK(r.dk <= 2e-3);
    CHECK(r.dv <= 2e-3);
    CHECK(r.predicted.param_wire == 4);
    CHECK(r.forward_sent == r.predicted.forward_sent());
    CHECK(r.backward_sent == r.predicted.backward_sent());
  }
}

}  // namespace test_mpi_context_parallel
