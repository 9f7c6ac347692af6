#pragma once
/// \file kernels/blas.hpp
/// What the host BLAS is and how fast it runs on this machine.
///
/// Debian's OpenBLAS 0.3.21 can misidentify a recent core (as "Prescott")
/// and then runs sgemm about 10x slow (~30 against ~280 GFLOP/s on our CPUs;
/// DESIGN.md, "Dependencies"). OpenBLAS reads OPENBLAS_CORETYPE when the
/// library loads, so the fix must happen before that: check_blas_core()
/// re-executes the program with the core type set, once, and otherwise warns.

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"

extern "C" char* openblas_get_corename(void);
extern "C" int openblas_get_num_threads(void);
extern "C" void openblas_set_num_threads(int);

namespace tessera::kernels {

/// The core OpenBLAS selected ("Haswell", "SkylakeX", "Prescott", ...).
inline std::string blas_core_name() {
  const char* n = openblas_get_corename();
  return n ? std::string(n) : std::string("unknown");
}

/// Threads OpenBLAS uses.
inline int blas_threads() {
  return openblas_get_num_threads();
}

/// True if /proc/cpuinfo lists the flag (e.g. "avx2", "avx512f").
inline bool cpu_has_flag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0)
      return (line + " ").find(" " + flag + " ") != std::string::npos;
  }
  return false;
}

/// The OPENBLAS_CORETYPE that fits this CPU ("SKYLAKEX" with AVX-512,
/// "HASWELL" with AVX2, "" if neither).
inline std::string preferred_core_type() {
  if (cpu_has_flag("avx512f") && cpu_has_flag("avx512bw")) return "SKYLAKEX";
  if (cpu_has_flag("avx2") && cpu_has_flag("fma")) return "HASWELL";
  return "";
}

/// True if OpenBLAS chose a core older than the CPU supports (a ~10x slow sgemm).
inline bool blas_core_is_stale() {
  const std::string core = blas_core_name();
  static const char* old_cores[] = {"Prescott", "Core2",     "Penryn",     "Dunnington", "Nehalem",
                                    "Atom",     "Katmai",    "Coppermine", "Northwood",  "Banias",
                                    "Opteron",  "Barcelona", "Generic",    "unknown"};
  bool old = false;
  for (const char* c : old_cores) old = old || core == c;
  return old && !preferred_core_type().empty();
}

/// Call first thing in main(). If OpenBLAS picked a stale core and
/// OPENBLAS_CORETYPE is unset, sets it to the preferred core and re-executes
/// the program (same argv) so the library loads with it; if that is not
/// possible, prints a loud warning to stderr. Returns a one-line description
/// of the BLAS for logs.
inline std::string check_blas_core(char** argv) {
  if (blas_core_is_stale()) {
    const char* set = std::getenv("OPENBLAS_CORETYPE");
    const std::string want = preferred_core_type();
    if (set == nullptr && argv != nullptr) {
      ::setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
      std::fprintf(stderr,
                   "tessera: OpenBLAS chose core '%s' on a CPU with %s; re-running with "
                   "OPENBLAS_CORETYPE=%s\n",
                   blas_core_name().c_str(), want == "SKYLAKEX" ? "AVX-512" : "AVX2", want.c_str());
      std::fflush(stderr);
      ::execv("/proc/self/exe", argv);  // returns only on failure
    }
    std::fprintf(stderr,
                 "tessera: WARNING: OpenBLAS uses core '%s' but this CPU supports %s: sgemm will "
                 "run about 10x slow. Set OPENBLAS_CORETYPE=%s before starting.\n",
                 blas_core_name().c_str(), want.c_str(), want.c_str());
  }
  return "OpenBLAS core " + blas_core_name() + ", " + std::to_string(blas_threads()) + " threads";
}

/// The CPUs this process may run on (its affinity mask: a cpuset, taskset
/// or mpirun binding), at least 1. Under OpenMP thread binding
/// (OMP_PROC_BIND, OMP_PLACES) the runtime has already pinned this thread
/// to one place, so the CPUs are those of the place list.
inline int available_cpus() {
  if (omp_get_proc_bind() != omp_proc_bind_false && omp_get_num_places() > 0) {
    int n = 0;
    for (int p = 0; p < omp_get_num_places(); ++p) n += omp_get_place_num_procs(p);
    return std::max(1, n);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

/// Refuses an OpenMP environment under which the host kernels would hang,
/// crash or crawl, before any parallel region runs (call it first thing in
/// main, after check_blas_core): OMP_DYNAMIC=true (OpenMP may give a region
/// fewer threads than OpenBLAS waits for: it spins for ever), OMP_NUM_THREADS
/// above OMP_THREAD_LIMIT (the same), and OMP_NUM_THREADS above the CPUs
/// this process may use (many times slower: every GEMM's threads wait for
/// descheduled peers; 99999 crashes libgomp). Throws config_error naming
/// the variables, their values and the limit; also for an OMP_NUM_THREADS
/// that is not a list of positive integers (libgomp warns and ignores it).
inline void check_openmp_environment() {
  if (const char* v = std::getenv("OMP_NUM_THREADS")) {
    const std::string s = v;
    bool ok = true;
    for (std::size_t i = 0; ok && i <= s.size();) {  // each comma-separated part
      const std::size_t e = std::min(s.find(',', i), s.size());
      const std::string part = s.substr(i, e - i);
      ok = !part.empty() && part.size() <= 9 &&
           part.find_first_not_of("0123456789") == std::string::npos && std::stol(part) > 0;
      i = e + 1;
    }
    TESSERA_THROW_IF(!ok, config_error, "OMP_NUM_THREADS='", s,
                     "' is not a positive integer (or a comma-separated list of them); OpenMP "
                     "would ignore it");
  }
  TESSERA_THROW_IF(omp_get_dynamic() != 0, config_error,
                   "OMP_DYNAMIC is true: OpenMP may then run a parallel region on fewer threads "
                   "than OpenBLAS waits for, which hangs; unset OMP_DYNAMIC (or set it to false)");
  const int threads = omp_get_max_threads(), limit = omp_get_thread_limit(),
            cpus = available_cpus();
  TESSERA_THROW_IF(threads > limit, config_error, "OMP_NUM_THREADS=", threads,
                   " exceeds OMP_THREAD_LIMIT=", limit,
                   ": a parallel region would get fewer threads than OpenBLAS waits for (it "
                   "hangs); set OMP_NUM_THREADS to at most ",
                   limit);
  TESSERA_THROW_IF(
      threads > cpus, config_error, "OMP_NUM_THREADS=", threads, " exceeds the ", cpus,
      " CPUs this process may use (its affinity): the threads would wait on each other "
      "many times slower; set OMP_NUM_THREADS to at most ",
      cpus);
}

/// Measures this machine's sgemm rate in FLOP/s: the best of `reps` runs of
/// an n x n x n product (2 n^3 FLOPs each). Used as the peak for MFU on the
/// host. Takes about (reps + 1) * 2n^3 / rate seconds (~0.4 s for n = 2048 on
/// two cores). n = 2048: at 1024 two threads reached only ~75% of the rate
/// the 2048 product shows on our machines (benchmarks/RESULTS.md), which
/// would overstate MFU.
inline double measure_sgemm_flops(int n = 2048, int reps = 3) {
  std::vector<float> a(static_cast<std::size_t>(n) * n), b(a.size()), c(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>((i * 7) % 13) * 0.01f;
    b[i] = static_cast<float>((i * 5) % 11) * 0.01f;
  }
  double best = 0;
  for (int r = 0; r < reps + 1; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::max(best, 2.0 * n * n * static_cast<double>(n) / s);  // first is warm-up
  }
  return best;
}

}  // namespace tessera::kernels
