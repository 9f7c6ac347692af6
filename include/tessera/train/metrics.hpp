#pragma once
/// \file train/metrics.hpp
/// Step metrics, the step log line, the progress bar and the JSONL metrics file.

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"

namespace tessera::train {

/// What one optimizer step reports.
struct step_metrics {
  std::int64_t step = 0;              ///< 1-based number of the step just taken
  double loss = 0;                    ///< mean training loss of the step, nats per token
  std::optional<double> val_loss;     ///< mean validation loss, nats per token (eval steps)
  double lr = 0;                      ///< learning rate used
  double grad_norm = 0;               ///< global L2 norm before clipping
  double clip = 1;                    ///< clip coefficient applied (1 = none)
  bool skipped = false;               ///< step skipped (non-finite gradient norm)
  std::int64_t tokens = 0;            ///< tokens processed in the step (all micro-batches)
  std::int64_t scored = 0;            ///< tokens scored (targets not ignored)
  double seconds = 0;                 ///< wall time of the step
  double tokens_per_s = 0;            ///< tokens / seconds
  double flops = 0;                   ///< model FLOPs of the step (see trainer::flops_per_token)
  double mfu = 0;                     ///< flops / seconds / peak (kernels::peak_flops::flops)
  double mfu_blas = 0;                ///< flops / seconds / measured sgemm rate (0: not measured)
  std::size_t mem_allocated = 0;      ///< bytes allocated at the end of the step
  std::size_t mem_peak = 0;           ///< peak bytes allocated during the step

  /// JSON object for the metrics file (one line per step). A utilisation
  /// the log prints as "n/a" (no peak, or above 1) is null here too.
  nlohmann::json to_json() const {
    auto utilisation = [](double u) { return u > 0 && u <= 1.0 ? nlohmann::json(u) : nlohmann::json(); };
    nlohmann::json j{{"step", step},     {"loss", loss},         {"lr", lr},
                     {"grad_norm", grad_norm}, {"clip", clip},   {"tokens", tokens},
                     {"scored", scored}, {"seconds", seconds},   {"tokens_per_s", tokens_per_s},
                     {"mfu", utilisation(mfu)}, {"mfu_of_blas", utilisation(mfu_blas)},
                     {"mem_allocated", mem_allocated}, {"mem_peak", mem_peak}};
    if (val_loss) j["val_loss"] = *val_loss;
    if (skipped) j["skipped"] = true;
    return j;
  }
};

/// Bytes as "12.3MiB".
inline std::string format_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024.0 && i < 4) {
    b /= 1024.0;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, i == 0 ? "%.0f%s" : "%.1f%s", b, u[i]);
  return buf;
}

/// A utilisation (0.231) as "23.1%"; 0 (no peak set) or above 1 (a peak
/// set too low, or a step timed wrong) reads "n/a": a figure over 100% is
/// never printed.
inline std::string format_utilisation(double u) {
  if (!(u > 0) || u > 1.0) return "n/a";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * u);
  return buf;
}

/// The step log line: every field named, e.g.
/// `step 120/1000 loss 2.4100 val 2.4700 (4-gram 2.1000) lr 3.00e-04 norm 0.512 tok/s 12345 mfu 23.1% (35.2% of BLAS) mem 12.3MiB peak 45.6MiB`
inline std::string format_step(const step_metrics& m, std::int64_t total_steps,
                               std::optional<double> baseline = std::nullopt) {
  char buf[512];
  std::ostringstream os;
  std::snprintf(buf, sizeof buf, "step %lld/%lld loss %.4f", static_cast<long long>(m.step),
                static_cast<long long>(total_steps), m.loss);
  os << buf;
  if (m.val_loss) {
    std::snprintf(buf, sizeof buf, " val %.4f", *m.val_loss);
    os << buf;
    if (baseline) {
      std::snprintf(buf, sizeof buf, " (4-gram %.4f)", *baseline);
      os << buf;
    }
  }
  std::snprintf(buf, sizeof buf, " lr %.2e norm %.3f%s tok/s %.0f mfu %s", m.lr, m.grad_norm,
                m.skipped ? " SKIPPED" : "", m.tokens_per_s, format_utilisation(m.mfu).c_str());
  os << buf;
  if (m.mfu_blas > 0) os << " (" << format_utilisation(m.mfu_blas) << " of BLAS)";
  std::snprintf(buf, sizeof buf, " mem %s peak %s",
                format_bytes(static_cast<double>(m.mem_allocated)).c_str(),
                format_bytes(static_cast<double>(m.mem_peak)).c_str());
  os << buf;
  return os.str();
}

/// A one-line progress bar for a terminal: `[#####.....] 120/1000 loss 2.41 ...`.
/// A step outside [0, total] shows an empty or a full bar.
inline std::string progress_bar(std::int64_t step, std::int64_t total, const std::string& tail,
                                int width = 30) {
  width = std::max(width, 0);
  const double f = total > 0 ? static_cast<double>(step) / static_cast<double>(total) : 1.0;
  const int filled = static_cast<int>(std::lround(std::clamp(f, 0.0, 1.0) * width));
  std::string bar = "[";
  bar.append(static_cast<std::size_t>(filled), '#');
  bar.append(static_cast<std::size_t>(width - filled), '.');
  return bar.append("] ").append(tail);
}

/// True when standard output is a terminal (progress bar) rather than a file or pipe.
inline bool stdout_is_terminal() {
  // mpirun gives its ranks a pseudo-terminal even when its own output goes
  // to a file or a pipe, so a rank never draws the progress bar.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v) != nullptr) return false;
  return ::isatty(STDOUT_FILENO) == 1;
}

/// Appends one JSON object per line to a metrics file. On resume, truncate_after()
/// drops lines for steps after the checkpoint so the file reads as one run.
class jsonl_writer {
public:
  jsonl_writer() = default;
  /// Opens `path` for appending (creating it). Throws io_error if it cannot.
  explicit jsonl_writer(const std::filesystem::path& path) : path_(path) {
    out_.open(path, std::ios::app);
    TESSERA_THROW_IF(!out_, io_error, "cannot open metrics file '", path.string(), "' for writing");
  }
  /// Writes one line and flushes it (a killed run keeps every finished step).
  void write(const nlohmann::json& j) {
    if (!out_.is_open()) return;
    out_ << j.dump() << '\n';
    out_.flush();
  }
  /// Keeps only lines whose "step" is <= `step` (rewritten via a temp file and rename).
  static void truncate_after(const std::filesystem::path& path, std::int64_t step) {
    if (!std::filesystem::exists(path)) return;
    std::ifstream in(path);
    std::vector<std::string> keep;
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;  // a line cut by a kill
      if (j.contains("step") && j["step"].get<std::int64_t>() <= step) keep.push_back(line);
    }
    in.close();
    const auto tmp = path.string() + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      for (const auto& l : keep) out << l << '\n';
      TESSERA_THROW_IF(!out, io_error, "cannot write '", tmp, "'");
    }
    std::filesystem::rename(tmp, path);
  }

private:
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace tessera::train
