#pragma once
/// \file train/trace.hpp
/// The timeline of a step as Chrome trace JSON (the Trace Event Format's
/// complete events, "ph": "X"), which Perfetto (ui.perfetto.dev) and
/// chrome://tracing open: one row (tid) per rank, one box per action the
/// executor ran (parallel/executor.hpp: forwards, backwards or their B and
/// W parts, sends, receives, the gradient reductions, clipping and the
/// optimizer step), named by kind and micro-batch ("F3", "B3", "W3",
/// "send F3", ...), its chunk and micro-batch in "args". Times are
/// microseconds from the earliest event. scripts/render_trace.py draws the
/// same file as a PNG.
///
/// Also the bubble of a traced step, measured as the simulator reports it
/// (parallel/pipeline_sim.hpp): 1 - (compute time summed over the ranks) /
/// (ranks x span), with the span from the first action's start to the last
/// compute action's end over all ranks.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/parallel/executor.hpp"
#include "tessera/parallel/layout.hpp"
#include "tessera/parallel/schedule.hpp"

namespace tessera::train {

/// One action of one rank's timeline (seconds on the host's steady clock).
struct trace_event {
  int rank = 0;  ///< the world rank (comm::device_mesh order)
  parallel::timed_action t;
};

/// Every rank's `timeline` (the executor's last traced step,
/// parallel::executor::timeline) as trace events of its world rank, on
/// every rank: gathered over the mesh (parallel::layout::gather_rows) and
/// sorted by rank and start. Collective over the mesh.
template <class Layout, class Ctx>
std::vector<trace_event> gather_timeline(const Layout& mesh, const Ctx& ctx,
                                         const std::vector<parallel::timed_action>& timeline) {
  constexpr std::size_t width = 7;
  std::vector<double> v;
  for (const auto& t : timeline)
    v.insert(v.end(), {static_cast<double>(mesh.world_rank()), static_cast<double>(t.a.kind),
                       static_cast<double>(t.a.micro_batch), static_cast<double>(t.a.chunk),
                       t.start, t.end, static_cast<double>(t.allocated)});
  v = mesh.gather_rows(ctx, std::move(v), width, parallel::axes::all());
  std::vector<trace_event> out;
  for (std::size_t i = 0; i + width <= v.size(); i += width)
    out.push_back({static_cast<int>(v[i]),
                   {{static_cast<parallel::action_kind>(static_cast<int>(v[i + 1])),
                     static_cast<std::int64_t>(v[i + 2]), static_cast<int>(v[i + 3])},
                    v[i + 4],
                    v[i + 5],
                    static_cast<std::int64_t>(v[i + 6])}});
  std::stable_sort(out.begin(), out.end(), [](const trace_event& a, const trace_event& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.t.start < b.t.start;
  });
  return out;
}

/// "F3", "B3", "W3", "BW3" (a whole backward), "send F3", "recv B3",
/// "reduce", "clip", "step": the box label of an action.
inline std::string trace_name(const parallel::action& a) {
  using parallel::action_kind;
  const std::string m = std::to_string(a.micro_batch);
  switch (a.kind) {
    case action_kind::forward:
      return "F" + m;
    case action_kind::backward:
      return "BW" + m;
    case action_kind::backward_input:
      return "B" + m;
    case action_kind::backward_weight:
      return "W" + m;
    case action_kind::send_forward:
      return "send F" + m;
    case action_kind::recv_forward:
      return "recv F" + m;
    case action_kind::send_backward:
      return "send B" + m;
    case action_kind::recv_backward:
      return "recv B" + m;
    case action_kind::reduce_gradients:
      return "reduce";
    case action_kind::clip:
      return "clip";
    case action_kind::optimizer_step:
      return "step";
  }
  return "?";
}

/// The Chrome trace JSON of `events` (every rank's), with `meta` under
/// "otherData" (the run's layout and schedule).
inline nlohmann::json chrome_trace(const std::vector<trace_event>& events,
                                   const nlohmann::json& meta = nlohmann::json::object()) {
  double t0 = std::numeric_limits<double>::infinity();
  for (const auto& e : events) t0 = std::min(t0, e.t.start);
  nlohmann::json ev = nlohmann::json::array();
  std::vector<int> ranks;
  for (const auto& e : events) {
    if (std::find(ranks.begin(), ranks.end(), e.rank) == ranks.end()) ranks.push_back(e.rank);
    ev.push_back({{"name", trace_name(e.t.a)},
                  {"cat", parallel::to_string(e.t.a.kind)},
                  {"ph", "X"},
                  {"ts", (e.t.start - t0) * 1e6},
                  {"dur", (e.t.end - e.t.start) * 1e6},
                  {"pid", 0},
                  {"tid", e.rank},
                  {"args",
                   {{"micro_batch", e.t.a.micro_batch},
                    {"chunk", e.t.a.chunk},
                    {"allocated_bytes", e.t.allocated}}}});
  }
  for (int r : ranks)
    ev.push_back({{"name", "thread_name"},
                  {"ph", "M"},
                  {"pid", 0},
                  {"tid", r},
                  {"args", {{"name", "rank " + std::to_string(r)}}}});
  return {{"traceEvents", ev}, {"displayTimeUnit", "ms"}, {"otherData", meta}};
}

/// Writes chrome_trace(events, meta) to `path` (a temporary file renamed).
/// Throws io_error if it cannot be written.
inline void write_chrome_trace(const std::filesystem::path& path,
                               const std::vector<trace_event>& events,
                               const nlohmann::json& meta = nlohmann::json::object()) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp);
    TESSERA_THROW_IF(!f, io_error, "cannot write trace '", tmp.string(), "'");
    f << chrome_trace(events, meta).dump() << "\n";
    f.flush();
    TESSERA_THROW_IF(!f, io_error, "cannot write trace '", tmp.string(), "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  TESSERA_THROW_IF(ec, io_error, "cannot rename '", tmp.string(), "' to '", path.string(),
                   "': ", ec.message());
}

/// What a traced step measured: the span from the first action's start to
/// the last compute action's end (seconds), each rank's compute time, the
/// bubble fraction 1 - sum(busy) / (ranks span), and the mean duration of
/// each compute kind (forward, backward, B, W; 0 where none ran).
struct trace_bubble {
  double span = 0, bubble_fraction = 0;
  std::vector<double> busy;
  double forward = 0, backward = 0, backward_input = 0, backward_weight = 0;
};

/// Measures `events` (one step of `ranks` ranks, world ranks 0..ranks-1).
inline trace_bubble measure_bubble(const std::vector<trace_event>& events, int ranks) {
  trace_bubble b;
  b.busy.assign(static_cast<std::size_t>(ranks), 0.0);
  double t0 = std::numeric_limits<double>::infinity(), t1 = -t0;
  double sum[4] = {0, 0, 0, 0};
  int n[4] = {0, 0, 0, 0};
  for (const auto& e : events) {
    t0 = std::min(t0, e.t.start);
    if (!parallel::is_compute(e.t.a.kind)) continue;
    t1 = std::max(t1, e.t.end);
    const double d = e.t.end - e.t.start;
    b.busy[static_cast<std::size_t>(e.rank)] += d;
    const int k = e.t.a.kind == parallel::action_kind::forward          ? 0
                  : e.t.a.kind == parallel::action_kind::backward       ? 1
                  : e.t.a.kind == parallel::action_kind::backward_input ? 2
                                                                        : 3;
    sum[k] += d;
    ++n[k];
  }
  b.span = t1 > t0 ? t1 - t0 : 0;
  double busy = 0;
  for (double x : b.busy) busy += x;
  b.bubble_fraction = b.span > 0 ? 1 - busy / (ranks * b.span) : 0;
  b.forward = n[0] ? sum[0] / n[0] : 0;
  b.backward = n[1] ? sum[1] / n[1] : 0;
  b.backward_input = n[2] ? sum[2] / n[2] : 0;
  b.backward_weight = n[3] ? sum[3] / n[3] : 0;
  return b;
}

}  // namespace tessera::train
