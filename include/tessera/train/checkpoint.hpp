#pragma once
/// \file train/checkpoint.hpp
/// Saving and restoring a rank's model chunks (train/model_chunks.hpp):
/// their parameters and optimizer state, in the single-file format of
/// train/checkpoint_file.hpp with the run's metadata (train/metadata.hpp).
///
/// The single-file format of earlier versions; a checkpoint folder
/// (train/checkpoint_folder.hpp) is what every layout writes and loads.
/// zero<0>: dp rank 0 writes the file; every dp rank restores it. Under
/// tensor and pipeline parallelism dp rank 0 of every (tp, pp) position
/// writes its shards: tp rank r of stage k to `path`.pp<k>.tp<r> (".pp<k>"
/// only for k > 0, ".tp<r>" only for r > 0; every chunk of the stage in one
/// file), and the metadata records tp, pp, V and the position, so a resume
/// needs the same layout. zero<1..3> keep the optimizer state sharded over
/// dp: refused before any work (config_error). Both operations are
/// collectives over the mesh and agree their failures (train/agree.hpp).

#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/optim/optimizer.hpp"
#include "tessera/parallel/layout.hpp"
#include "tessera/train/agree.hpp"
#include "tessera/train/checkpoint_file.hpp"
#include "tessera/train/metadata.hpp"

namespace tessera::train {

namespace detail {

// The file of this stage's tp rank 0: `p`, or `p`.pp<k> for stage k > 0.
inline std::filesystem::path stage_path(const std::filesystem::path& p, int stage) {
  if (stage == 0) return p;
  return std::filesystem::path(p.string() + ".pp" + std::to_string(stage));
}
// This rank's shard file: stage_path, and ".tp<r>" for tp rank r > 0.
inline std::filesystem::path shard_path(const std::filesystem::path& p, int stage, int tp,
                                        int tp_rank) {
  const std::filesystem::path sp = stage_path(p, stage);
  if (tp == 1 || tp_rank == 0) return sp;
  return std::filesystem::path(sp.string() + ".tp" + std::to_string(tp_rank));
}
// Removes `path`.<what><k>... for every k >= `degree` (files of a run at a
// larger tp or pp, which this checkpoint replaces). Errors are ignored: a
// stale shard is refused by its metadata anyway.
inline void remove_stale_shards(const std::filesystem::path& path, const char* what, int degree) {
  const std::string prefix = path.filename().string() + "." + what;
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() <= prefix.size() || n.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = n.substr(prefix.size());
    const std::size_t digits = rest.find_first_not_of("0123456789");
    const std::string k = rest.substr(0, digits);
    if (k.empty() || k.size() > 4) continue;
    if (digits != std::string::npos && rest.compare(digits, 3, ".tp") != 0) continue;
    if (std::stoi(k) >= degree) stale.push_back(e.path());
  }
  for (const auto& p : stale) std::filesystem::remove(p, ec);
}
// The payload bytes of every chunk: parameters, then the optimizer's state.
template <class Chunks>
std::size_t payload_bytes(const Chunks& chunks) {
  using Param = typename Chunks::model_type::precision_type::param_type;
  std::size_t bytes = 0;
  for (int c = 0; c < chunks.size(); ++c)
    bytes += sizeof(Param) * static_cast<std::size_t>(chunks.model(c).flat_size()) +
             chunks.engine(c).optimizer().serialized_bytes();
  return bytes;
}
template <class Sharding>
void refuse_sharded(const char* what, int dp) {
  TESSERA_THROW_IF(Sharding::shards_optimizer_state, config_error, what,
                   "_checkpoint: ", Sharding::name,
                   " keeps the optimizer state sharded over dp=", dp,
                   " ranks, which the single-file checkpoint (.bin) of earlier versions cannot "
                   "hold: use a checkpoint folder (any path not ending in .bin), which every "
                   "layout writes and loads, or --zero 0 for this file");
}

}  // namespace detail

/// Writes `chunks` (parameters and optimizer state) with the metadata
/// `meta` of the run at `step` to `path` (its shard file under tp and pp),
/// streamed through host blocks, fsync'ed and renamed (checkpoint_file.hpp);
/// collective over the mesh (the ranks wait for the files). If a write
/// fails on any rank, every rank throws the same io_error, naming `step`,
/// the path, the failing world rank and its error. Throws config_error for
/// a strategy that shards the optimizer state, before any work.
template <class Sharding, class Chunks, class Layout>
void save_checkpoint(Chunks& chunks, const Layout& mesh, const std::filesystem::path& path_,
                     const nlohmann::json& meta, std::int64_t step) {
  using Param = typename Chunks::model_type::precision_type::param_type;
  detail::refuse_sharded<Sharding>("save", mesh.dp());
  const auto& ctx = chunks.model().context();
  const int tp = chunks.model().tp_size();
  const std::filesystem::path path = detail::shard_path(path_, mesh.stage(), tp, mesh.tp_rank());
  std::exception_ptr failed;
  if (mesh.dp_rank() == 0 && mesh.cp_rank() == 0) {  // one writer of each (tp, pp) shard
    try {
      write_checkpoint(path, meta, detail::payload_bytes(chunks), [&](checkpoint_writer& w) {
        for (int c = 0; c < chunks.size(); ++c) {
          optim::detail::write_from(
              ctx, w, chunks.model(c).params(),
              sizeof(Param) * static_cast<std::size_t>(chunks.model(c).flat_size()));
          chunks.engine(c).optimizer().save(w);
        }
      });
      // Shards of an earlier run at a larger tp or pp would be stale beside this one.
      if (mesh.tp_rank() == 0)
        detail::remove_stale_shards(detail::stage_path(path_, mesh.stage()), "tp", tp);
      if (mesh.tp_rank() == 0 && mesh.stage() == 0)
        detail::remove_stale_shards(path_, "pp", mesh.pp());
    } catch (...) {
      failed = std::current_exception();
    }
  }
  // Every shard is written when any rank returns; a failed write (a full
  // disk) ends every rank now with the writer's message, not the others
  // at their next collective's timeout.
  auto world = mesh_reduction(mesh, ctx);
  agree_or_throw(
      world, mesh.world_rank(), failed,
      tessera::detail::str("checkpoint save at step ", step, " to '", path_.string(), "'"));
}

/// Restores what save_checkpoint wrote into `chunks`, on every rank,
/// verified whole before any state changes; returns the checkpoint's step.
/// `mine` is this run's metadata, held against the file's
/// (check_resume_metadata: the model, precision, optimizer, batch, dp,
/// strategy, ... named with both values on a difference); `steps` the
/// steps this run plans. Under tensor or pipeline parallelism the ranks
/// agree first: a missing shard of a checkpoint written at another tp
/// names both degrees; a rank whose shard fails makes every rank throw;
/// shards of different steps (a save interrupted between ranks) throw
/// config_error naming the steps. Throws io_error for a missing, truncated
/// or corrupt file; config_error for a strategy that shards the optimizer
/// state, before any work. `run_state` (if not null) receives the file's
/// metadata (the run state a policy restores, e.g. the loss scaler's).
template <class Sharding, class Chunks, class Layout>
std::int64_t load_checkpoint(Chunks& chunks, const Layout& mesh, const std::filesystem::path& path_,
                             const nlohmann::json& mine, std::int64_t steps,
                             nlohmann::json* run_state = nullptr) {
  using Param = typename Chunks::model_type::precision_type::param_type;
  detail::refuse_sharded<Sharding>("load", mesh.dp());
  const auto& ctx = chunks.model().context();
  const int tp = chunks.model().tp_size();
  const std::filesystem::path path = detail::shard_path(path_, mesh.stage(), tp, mesh.tp_rank());
  nlohmann::json meta;
  std::vector<char> payload;
  std::int64_t step = 0;
  const std::size_t bytes = detail::payload_bytes(chunks);
  std::exception_ptr failed;
  try {
    if (path != path_ && !std::filesystem::exists(path) && std::filesystem::exists(path_)) {
      // No shard for this position: the first shard says how it was written.
      read_checkpoint(path_, meta, payload);
      nlohmann::json first = mine;
      if (first.contains("tp_rank")) first["tp_rank"] = 0;
      if (first.contains("pp_stage")) first["pp_stage"] = 0;
      (void)check_resume_metadata(path_, meta, first, steps);  // names the tp first
      throw io_error("checkpoint '" + path_.string() + "' has no shard '" + path.string() +
                     "' for tp rank " + std::to_string(mesh.tp_rank()) + " of stage " +
                     std::to_string(mesh.stage()));
    }
    read_checkpoint(path, meta, payload);
    step = check_resume_metadata(path, meta, mine, steps);
    if (run_state) *run_state = meta;
    TESSERA_THROW_IF(payload.size() != bytes, io_error, "checkpoint '", path.string(), "' holds ",
                     payload.size(), " payload bytes; this run needs ", bytes);
  } catch (...) {
    failed = std::current_exception();
  }
  // The shards of the tp and pp ranks are one checkpoint only if every
  // one loads and all are of the same step (a save interrupted between
  // two ranks' renames leaves shards of two steps): agreed before any
  // state changes.
  if (mesh.ranks({parallel::axis::tp, parallel::axis::pp}) > 1) {
    double v[3] = {failed ? 1.0 : 0.0, static_cast<double>(step), -static_cast<double>(step)};
    mesh.reduce(ctx, std::span<double>(v, 3), {parallel::axis::tp, parallel::axis::pp},
                comm::reduce_op::max);
    TESSERA_THROW_IF(!failed && v[0] > 0, io_error, "checkpoint '", path_.string(),
                     "': another tp or pp rank could not load its shard (its error names it)");
    TESSERA_THROW_IF(!failed && v[1] != -v[2], config_error, "checkpoint '", path_.string(),
                     "': its shards are of different steps (", static_cast<std::int64_t>(-v[2]),
                     " to ", static_cast<std::int64_t>(v[1]),
                     "): a save was interrupted between ranks; resume from a complete checkpoint");
  }
  if (failed) std::rethrow_exception(failed);
  std::size_t at = 0;
  for (int c = 0; c < chunks.size(); ++c) {
    const std::size_t pb = sizeof(Param) * static_cast<std::size_t>(chunks.model(c).flat_size());
    ctx.from_host(chunks.model(c).params(), payload.data() + at, pb);
    at += pb;
    chunks.engine(c).optimizer().load(payload.data() + at);
    at += chunks.engine(c).optimizer().serialized_bytes();
  }
  return step;
}

}  // namespace tessera::train
