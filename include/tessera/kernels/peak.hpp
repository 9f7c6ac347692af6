#pragma once
/// \file kernels/peak.hpp
/// The peak FLOP rate that model FLOPs utilisation (MFU) is taken against,
/// and how it was obtained. MFU = model FLOPs per second / peak (PaLM,
/// Chowdhery et al. 2022, appendix B); the peak must not move with the
/// machine's load, so it is the device's theoretical rate, not a rate
/// measured once at start-up (which drops on a loaded machine and lets MFU
/// read over 100%). The measured sgemm rate is reported beside it, as
/// "of BLAS peak".
///
/// Host: threads x clock x fp32 FLOPs per cycle of the vector unit found at
/// start-up: 2 fused multiply-add units assumed (AVX-512F: 2 x 16 x 2 = 64;
/// AVX2 with FMA: 2 x 8 x 2 = 32; AVX: 8 x 2 = 16; SSE2: 4 x 2 = 8); the
/// clock from cpufreq's cpuinfo_max_freq, else the highest "cpu MHz" of
/// /proc/cpuinfo, else the "@ x.xxGHz" of the model name. When the sgemm
/// rate measured in the same run is above that figure (a clock that boosts
/// beyond what the system reports), the measured rate is the peak and the
/// line says so: MFU never exceeds what the BLAS reaches.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/kernels/blas.hpp"

namespace tessera::kernels {

/// A peak FLOP rate (FLOP/s, per rank) for MFU, with the one line that says
/// how it was obtained, and the measured sgemm rate beside it.
struct peak_flops {
  double flops = 0;       ///< the rate MFU is taken against, FLOP/s
  double blas_flops = 0;  ///< measured sgemm rate, FLOP/s (best of several runs); 0: not measured
  std::string how;        ///< e.g. "2 threads x 2.445 GHz (/proc/cpuinfo) x 32 FLOP/cycle (AVX2+FMA)"
};

/// fp32 FLOPs per cycle and core of this CPU's widest vector unit, and its
/// name ("AVX2+FMA"), as detected at run time (GCC/Clang __builtin_cpu_supports).
inline std::pair<int, std::string> host_flops_per_cycle() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {64, "AVX-512F, 2 FMA units"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return {32, "AVX2+FMA, 2 FMA units"};
  if (__builtin_cpu_supports("avx")) return {16, "AVX, add + multiply"};
  return {8, "SSE2, add + multiply"};
#elif defined(__aarch64__)
  return {16, "NEON, 2 FMA units"};
#else
  return {2, "scalar FMA"};
#endif
}

/// This CPU's clock in GHz and where it was read; {0, ""} when no source
/// gives one.
inline std::pair<double, std::string> host_clock_ghz() {
  {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
    double khz = 0;
    if (f >> khz && khz > 0) return {khz / 1e6, "cpufreq cpuinfo_max_freq"};
  }
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  double mhz = 0, model_ghz = 0;
  while (std::getline(f, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (line.rfind("cpu MHz", 0) == 0) {
      mhz = std::max(mhz, std::atof(line.c_str() + colon + 1));
    } else if (line.rfind("model name", 0) == 0) {
      const auto at = line.find('@');
      if (at != std::string::npos) model_ghz = std::max(model_ghz, std::atof(line.c_str() + at + 1));
    }
  }
  if (mhz > 0) return {mhz / 1e3, "/proc/cpuinfo cpu MHz"};
  if (model_ghz > 0) return {model_ghz, "/proc/cpuinfo model name"};
  return {0.0, ""};
}

/// The host's theoretical fp32 peak for `threads` cores: threads x clock x
/// FLOPs per cycle (file comment), FLOP/s, with the line that says so; 0
/// (and a line saying why) when the clock cannot be read. Throws
/// config_error for threads < 1.
inline peak_flops host_theoretical_peak(int threads) {
  TESSERA_THROW_IF(threads < 1, config_error, "host_theoretical_peak: threads=", threads,
                   " must be >= 1");
  const auto [fpc, unit] = host_flops_per_cycle();
  const auto [ghz, source] = host_clock_ghz();
  peak_flops p;
  if (ghz <= 0) {
    p.how = "no CPU clock found (cpufreq, /proc/cpuinfo)";
    return p;
  }
  p.flops = threads * ghz * 1e9 * fpc;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%d thread%s x %.3f GHz (%s) x %d fp32 FLOP/cycle (%s)", threads,
                threads == 1 ? "" : "s", ghz, source.c_str(), fpc, unit.c_str());
  p.how = buf;
  return p;
}

/// The peak of one rank on the host for MFU: `override_flops` when > 0
/// (--peak-tflops), else host_theoretical_peak(threads); beside it the
/// sgemm rate `blas_flops` measured by the caller (kernels::
/// measure_sgemm_flops, best of several runs, on this rank's share of the
/// machine; 0: not measured). A measured rate above the theoretical one
/// becomes the peak, and `how` says so. Throws config_error for a
/// non-finite or negative override, or when neither a clock nor a
/// measurement gives a peak (pass --peak-tflops).
inline peak_flops host_peak(int threads, double blas_flops, double override_flops = 0) {
  TESSERA_THROW_IF(!(override_flops >= 0) || override_flops > 1e21, config_error,
                   "the given peak (--peak-tflops) of ", override_flops / 1e12,
                   " TFLOP/s must be >= 0 and finite");
  peak_flops p;
  if (override_flops > 0) {
    p.flops = override_flops;
    p.how = "given (--peak-tflops)";
  } else {
    p = host_theoretical_peak(threads);
    if (blas_flops > p.flops) {
      char buf[320];
      std::snprintf(buf, sizeof buf,
                    "the measured sgemm rate, above the theoretical %.1f GFLOP/s of %s (the clock "
                    "boosts beyond what the system reports)",
                    p.flops / 1e9, p.how.c_str());
      p.how = buf;
      p.flops = blas_flops;
    }
  }
  TESSERA_THROW_IF(!(p.flops > 0), config_error, "no peak FLOP rate for MFU: ", p.how,
                   "; pass --peak-tflops");
  p.blas_flops = blas_flops;
  return p;
}

/// One line for logs: "peak 156.5 GFLOP/s = <how>; BLAS <core> sgemm 151.4
/// GFLOP/s (96.7% of peak, best of 5)".
inline std::string describe_peak(const peak_flops& p) {
  char buf[512];
  if (p.blas_flops > 0 && p.blas_flops <= p.flops)
    std::snprintf(buf, sizeof buf, "peak %.1f GFLOP/s = %s; measured sgemm %.1f GFLOP/s (%.1f%% of peak)",
                  p.flops / 1e9, p.how.c_str(), p.blas_flops / 1e9, 100 * p.blas_flops / p.flops);
  else if (p.blas_flops > 0)  // a given peak below what the BLAS reaches: MFU may read n/a
    std::snprintf(buf, sizeof buf, "peak %.1f GFLOP/s = %s; measured sgemm %.1f GFLOP/s, above it",
                  p.flops / 1e9, p.how.c_str(), p.blas_flops / 1e9);
  else
    std::snprintf(buf, sizeof buf, "peak %.1f GFLOP/s = %s", p.flops / 1e9, p.how.c_str());
  return buf;
}

}  // namespace tessera::kernels
