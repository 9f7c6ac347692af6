#pragma once
/// \file plan/host_memory.hpp
/// Whether a planned run fits the host: the memory this process's ranks can
/// use (the kernel's MemAvailable and SwapFree, or less where a cgroup v2
/// limit applies: Slurm, Kubernetes, containers), held against the
/// planner's bytes (plan/memory.hpp) before anything is allocated, so a run
/// that cannot fit fails at once naming its settings instead of after
/// minutes of allocation, or by the kernel's out-of-memory killer.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/plan/state.hpp"

namespace tessera::plan {

/// Bytes this process can use: MemAvailable plus SwapFree of /proc/meminfo,
/// or memory.max - memory.current of the process's cgroup (v2) when that
/// is smaller; 0 when unknown (no /proc: the check is then skipped).
inline std::uint64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  std::uint64_t kib = 0, total = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:" || key == "SwapFree:") total += kib * 1024;
  }
  std::ifstream mx("/sys/fs/cgroup/memory.max"), cur("/sys/fs/cgroup/memory.current");
  std::uint64_t limit = 0, used = 0;
  if (mx >> limit && cur >> used && limit > used && total > 0)  // "max" fails the read: no limit
    total = std::min(total, limit - used);
  return total;
}

/// Throws config_error when `need` bytes exceed `available` (> 0; 0 skips
/// the check): "<what> needs N GiB (<settings>) but the machine has M GiB
/// available (MemAvailable + SwapFree): <fix>". GiB rounded to integers.
inline void check_host_fit(double need, std::uint64_t available, const std::string& what,
                           const std::string& settings, const std::string& fix) {
  if (available == 0 || need <= static_cast<double>(available)) return;
  throw config_error(tessera::detail::str(
      what, " needs ", std::llround(need / gib), " GiB (", settings, ") but the machine has ",
      std::llround(static_cast<double>(available) / gib),
      " GiB available (MemAvailable + SwapFree): ", fix));
}

}  // namespace tessera::plan
