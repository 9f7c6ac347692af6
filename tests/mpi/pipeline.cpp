// The trainer on a dp x tp x pp mesh of MPI processes computes the
// single-rank run: the bodies of tests/train/pp_suite.hpp (the same ones
// tests/train/pipeline.cpp runs on threads). Run by ctest as
//   mpirun -np N test_mpi --filenames-as-tags "[#pipeline]" with
//   N = 2: pp 2 under every schedule
//   N = 4: pp 4; (2, 1, 2) and (1, 2, 2)
//   N = 8: (2, 2, 2), 1f1b and interleaved
// under zero<0> and zero<1> (and zero<2> and zero<3> where dp > 1), and
// optim::muon and optim::adafactor on (1, 1, 2), (2, 1, 2) and (2, 2, 2)
// (Adafactor under zero<2> too where dp > 1); and under context
// parallelism, N = 2: cp 2 ring and Ulysses; N = 4: (dp, cp, tp, pp) =
// (2, 2, 1, 1), (1, 2, 1, 2), cp 4; N = 8: (2, 2, 2, 1) and (1, 2, 2, 2).
// (A failing stage: tests/mpi/pipeline_fault.cpp.)
#include <catch2/catch.hpp>

#include <type_traits>

#include <tessera/comm/mpi.hpp>
#include <tessera/optim/adafactor.hpp>
#include <tessera/optim/muon.hpp>

#include "pp_suite.hpp"

namespace test_mpi_pipeline {

using namespace tessera;
using comm::mpi_communicator;
using parallel::schedule_kind;

namespace {

mpi_communicator world() {
  comm::comm_options o;
  // 8 processes on 2 cores beside other jobs: a collective can wait long.
  o.timeout = std::chrono::seconds(150);
  return mpi_communicator(MPI_COMM_WORLD, o);
}

pp_suite::layout pipe(int dp, int tp, int pp, schedule_kind s, int V, std::int64_t M) {
  pp_suite::layout l;
  l.dp = dp;
  l.tp = tp;
  l.pp = pp;
  l.schedule = s;
  l.virtual_stages = V;
  l.micro_batches = M;
  return l;
}

template <class P>
void meshes(double tol) {
  auto w = world();
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("mpi_pp", w.rank())};
  data::token_file f(corpus.path);
  std::vector<pp_suite::layout> layouts;
  const auto all = {schedule_kind::gpipe, schedule_kind::one_f_one_b,
                    schedule_kind::zero_bubble_h1};
  if (w.size() == 2) {
    for (auto s : all) layouts.push_back(pipe(1, 1, 2, s, 1, 8));
    layouts.push_back(pipe(1, 1, 2, schedule_kind::interleaved, 2, 8));
  }
  if (w.size() == 4) {
    for (auto s : all) layouts.push_back(pipe(1, 1, 4, s, 1, 8));
    layouts.push_back(pipe(2, 1, 2, schedule_kind::one_f_one_b, 1, 4));
    layouts.push_back(pipe(2, 1, 2, schedule_kind::zero_bubble_h1, 1, 4));
    layouts.push_back(pipe(1, 2, 2, schedule_kind::zero_bubble_h1, 1, 8));
  }
  if (w.size() == 8) {
    layouts.push_back(pipe(2, 2, 2, schedule_kind::one_f_one_b, 1, 4));
    layouts.push_back(pipe(2, 2, 2, schedule_kind::interleaved, 2, 4));
  }
  for (const auto& l : layouts) {
    INFO(l.name());
    const pp_suite::reference ref = pp_suite::single_rank<P>(f, 5, l.micro_batches * l.dp);
    REQUIRE_NOTHROW(pp_suite::check_mesh<P, parallel::zero<0>>(w, ref, f, l, tol));
    REQUIRE_NOTHROW(pp_suite::check_mesh<P, parallel::zero<1>>(w, ref, f, l, tol));
    if (l.dp > 1) REQUIRE_NOTHROW(pp_suite::check_mesh<P, parallel::zero<2>>(w, ref, f, l, tol));
    if (l.dp > 1) REQUIRE_NOTHROW(pp_suite::check_mesh<P, parallel::zero<3>>(w, ref, f, l, tol));
  }
}

// optim::muon and optim::adafactor over processes: Muon gathers each
// matrix whole over tp (its shards) and over dp (ZeRO's pieces, a bucket at
// a time); Adafactor all-gathers its float64 sums over dp and tp, on MPI.
template <class O>
void whole_matrix_meshes(const char* corpus_name) {
  auto w = world();
  trainer_suite::temp_file corpus{trainer_suite::make_corpus(corpus_name, w.rank())};
  data::token_file f(corpus.path);
  std::vector<pp_suite::layout> layouts;
  if (w.size() == 2) layouts.push_back(pipe(1, 1, 2, schedule_kind::one_f_one_b, 1, 8));
  if (w.size() == 4) layouts.push_back(pipe(2, 1, 2, schedule_kind::one_f_one_b, 1, 4));
  if (w.size() == 8) layouts.push_back(pipe(2, 2, 2, schedule_kind::one_f_one_b, 1, 4));
  using P = precision::fp64;
  for (const auto& l : layouts) {
    INFO(O::name << " " << l.name());
    const pp_suite::reference ref = pp_suite::single_rank<P, O>(f, 5, l.micro_batches * l.dp);
    REQUIRE_NOTHROW(pp_suite::check_mesh<P, parallel::zero<0>, O>(w, ref, f, l, 1e-10));
    REQUIRE_NOTHROW(pp_suite::check_mesh<P, parallel::zero<1>, O>(w, ref, f, l, 1e-10));
    if (l.dp > 1 && std::is_same_v<O, optim::adafactor>)
      REQUIRE_NOTHROW(pp_suite::check_mesh<P, parallel::zero<2>, O>(w, ref, f, l, 1e-10));
    if (l.dp > 1)
      REQUIRE_NOTHROW(pp_suite::check_mesh<P, parallel::zero<3>, O>(w, ref, f, l, 1e-10));
  }
}

}  // namespace

// Context parallelism over processes: each sequence split head-tail over
// the cp ranks, gradients and ZeRO over dp x cp.
TEST_CASE("mpi trainer under context parallelism equals one rank's (float64)", "[mpi][cp]") {
  using P = precision::fp64;
  using nn::cp_kind;
  auto w = world();
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("mpi_cp", w.rank())};
  data::token_file f(corpus.path);
  auto cp_mesh = [](int dp, int cp, int tp, int pp, cp_kind kind) {
    pp_suite::layout l = pipe(dp, tp, pp, schedule_kind::one_f_one_b, 1, 4);
    l.cp = cp;
    l.cp_kind = kind;
    return l;
  };
  std::vector<pp_suite::layout> layouts;
  if (w.size() == 2) {
    layouts.push_back(cp_mesh(1, 2, 1, 1, cp_kind::ring));
    layouts.push_back(cp_mesh(1, 2, 1, 1, cp_kind::ulysses));
  }
  if (w.size() == 4) {
    layouts.push_back(cp_mesh(2, 2, 1, 1, cp_kind::ring));
    layouts.push_back(cp_mesh(1, 2, 1, 2, cp_kind::ulysses));
    layouts.push_back(cp_mesh(1, 4, 1, 1, cp_kind::ring));
  }
  if (w.size() == 8) {
    layouts.push_back(cp_mesh(2, 2, 2, 1, cp_kind::ring));
    layouts.push_back(cp_mesh(1, 2, 2, 2, cp_kind::ulysses));
  }
  for (const auto& l : layouts) {
    INFO(l.name());
    const pp_suite::reference ref = pp_suite::single_rank<P>(f, 5, l.micro_batches * l.dp);
    REQUIRE_NOTHROW(pp_suite::check_mesh<P, parallel::zero<1>>(w, ref, f, l, 1e-10));
    if (l.dp > 1 || l.cp > 1)
      REQUIRE_NOTHROW(pp_suite::check_mesh<P, parallel::zero<2>>(w, ref, f, l, 1e-10));
  }
}

TEST_CASE("mpi pp trainer with Muon equals one rank's (float64)", "[mpi][pp][muon]") {
  whole_matrix_meshes<optim::muon>("mpi_pp_muon");
}
TEST_CASE("mpi pp trainer with Adafactor equals one rank's (float64)", "[mpi][pp][adafactor]") {
  whole_matrix_meshes<optim::adafactor>("mpi_pp_adafactor");
}
TEST_CASE("mpi pp trainer equals one rank's (float64)", "[mpi][pp]") {
  meshes<precision::fp64>(1e-10);
}
TEST_CASE("mpi pp trainer equals one rank's (float32)", "[mpi][pp]") {
  meshes<precision::fp32>(1e-5);
}

}  // namespace test_mpi_pipeline
