#pragma once
/// \file train/metrics.hpp
/// Step metrics, the step log line, the progress bar and the JSONL metrics file.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
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
#include "tessera/core/file.hpp"

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
  double loss_scale = 0;              ///< loss scale S the step ran under (0: no loss scale)
  std::int64_t skipped_steps = 0;     ///< steps skipped so far in the run (under a loss scale)
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
    if (loss_scale > 0) {
      j["loss_scale"] = loss_scale;
      j["skipped_steps"] = skipped_steps;
    }
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
  std::snprintf(buf, sizeof buf, " lr %.2e norm %.3f%s", m.lr, m.grad_norm,
                m.skipped ? " SKIPPED" : "");
  os << buf;
  if (m.loss_scale > 0) {  // the scale the step ran under, and the steps skipped so far
    const bool whole = m.loss_scale == std::floor(m.loss_scale) && m.loss_scale < 1e15;
    std::snprintf(buf, sizeof buf, whole ? " scale %.0f skipped %lld" : " scale %g skipped %lld",
                  m.loss_scale, static_cast<long long>(m.skipped_steps));
    os << buf;
  }
  std::snprintf(buf, sizeof buf, " tok/s %.0f mfu %s", m.tokens_per_s,
                format_utilisation(m.mfu).c_str());
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

/// The current time as ISO 8601 UTC with milliseconds ("2026-12-03T19:24:05.123Z").
inline std::string utc_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

/// Appends one JSON object per line to a metrics file, each with its "time"
/// (utc_timestamp). Lines with a "step" are the steps; lines without one
/// record the run (its configuration, a resume). On resume, truncate_after()
/// drops the steps after the checkpoint so the file reads as one run.
class jsonl_writer {
public:
  jsonl_writer() = default;
  /// Opens `path` for appending (creating it). Throws io_error if it cannot.
  explicit jsonl_writer(const std::filesystem::path& path) : path_(path) {
    out_.open(path, std::ios::app);
    TESSERA_THROW_IF(!out_, io_error, "cannot open metrics file '", path.string(), "' for writing");
  }
  /// Writes one line with "time" added (unless `j` has one) and flushes it
  /// (a killed run keeps every finished step). Throws io_error naming the
  /// file when the write fails (a full disk).
  void write(nlohmann::json j) {
    if (!out_.is_open()) return;
    if (!j.contains("time")) j["time"] = utc_timestamp();
    out_ << j.dump() << '\n';
    out_.flush();
    TESSERA_THROW_IF(!out_, io_error, "writing metrics file '", path_.string(),
                     "' failed: ", std::strerror(errno));
  }
  /// Keeps the lines whose "step" is <= `step` and the lines without a step
  /// (the run's records), and drops a last line cut by a kill; rewritten
  /// atomically (write_file_atomically). Throws io_error naming the file
  /// and the line for a line that is not JSON or whose step is not an
  /// integer (before the last line).
  static void truncate_after(const std::filesystem::path& path, std::int64_t step) {
    if (!std::filesystem::exists(path)) return;
    std::ifstream in(path);
    TESSERA_THROW_IF(!in, io_error, "cannot read metrics file '", path.string(), "'");
    std::vector<std::string> lines, keep;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    in.close();
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].empty()) continue;
      auto j = nlohmann::json::parse(lines[i], nullptr, false);
      const bool last = i + 1 == lines.size();
      if (j.is_discarded() && last) continue;  // a line cut by a kill
      TESSERA_THROW_IF(j.is_discarded() || !j.is_object(), io_error, "metrics file '",
                       path.string(), "' line ", i + 1, " is not a JSON object");
      if (!j.contains("step")) {
        keep.push_back(lines[i]);
        continue;
      }
      TESSERA_THROW_IF(!j["step"].is_number_integer(), io_error, "metrics file '", path.string(),
                       "' line ", i + 1, " has step ", j["step"].dump(), ", not an integer");
      if (j["step"].get<std::int64_t>() <= step) keep.push_back(lines[i]);
    }
    write_file_atomically(path, [&](std::ofstream& out) {
      for (const auto& l : keep) out << l << '\n';
    });
  }

private:
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace tessera::train
