#pragma once
/// \file train/checkpoint_folder.hpp
/// Saving and loading a trainer's model chunks as a layout-free checkpoint
/// folder (train/checkpoint_index.hpp), collectively over the mesh (a run
/// folder's step-NNNNNN/ checkpoints: train/run_folder.hpp).
///
/// Save: every rank writes its own data file and its part of the metadata
/// at once (no gather to one rank); the ranks agree that every write
/// succeeded (a failure anywhere fails the save everywhere, naming the
/// rank: train/agree.hpp); world rank 0 then merges the parts into
/// metadata.json, the last file written, and the ranks agree again. A
/// folder without metadata.json is an incomplete save and is never loaded.
///
/// Load: every rank opens the folder and reads only the pieces of its own
/// shares (train/checkpoint_shards.hpp), whatever layout wrote them; the
/// run's settings are checked first, leaving out what a layout may change
/// (dp, tp, pp and their positions, the ZeRO stage, the virtual stages and
/// the pipeline schedule, the micro-batch, the flat buffer's size). A
/// change of model, precision, optimizer, global batch, corpus or schedule
/// settings is refused naming both values (check_resume_metadata).

#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/train/agree.hpp"
#include "tessera/train/checkpoint_io.hpp"
#include "tessera/train/checkpoint_shards.hpp"
#include "tessera/train/metadata.hpp"

namespace tessera::train {

/// The keys of a run's metadata that a layout may change (a load onto
/// another layout ignores them).
inline bool layout_key(const std::string& k) {
  static const char* const keys[] = {"dp",           "tp",       "cp",          "cp_kind",
                                     "tp_rank",      "pp",       "pp_stage",    "virtual_stages",
                                     "stage_blocks", "sharding", "micro_batch", "flat_elements",
                                     "pipeline",     "layout"};
  return std::find_if(std::begin(keys), std::end(keys), [&](const char* x) { return k == x; }) !=
         std::end(keys);
}

/// The run state a checkpoint of `chunks` records: `run` (the trainer's
/// metadata: step, data position, settings) with the optimizer's step
/// count and the layout that writes it.
template <class Chunks, class Layout>
nlohmann::json checkpoint_run_state(Chunks& chunks, const Layout& mesh, nlohmann::json run) {
  run["optimizer_steps"] = chunks.engine().optimizer().steps_taken();
  run["layout"] = {{"dp", mesh.dp()},
                   {"cp", mesh.cp()},
                   {"tp", mesh.tp()},
                   {"pp", mesh.pp()},
                   {"world", mesh.world_size()}};
  return run;
}

/// One rank's share of a checkpoint: the pieces of its data file and the
/// tensors they belong to.
struct rank_share {
  rank_file file;
  std::map<std::string, stored_tensor> tensors;
};

/// The share of `chunks` (every model chunk of this rank: parameters,
/// master weights, optimizer state) that tp rank `tp_rank` writes; its
/// pieces read the chunks when written (rank_file::snapshot copies them),
/// staged through page-locked host memory under a GPU backend.
template <class Chunks>
rank_share checkpoint_share(Chunks& chunks, int tp_rank) {
  rank_share s;
  // A GPU backend's shards go to the disk through page-locked host memory.
  using Backend = typename Chunks::model_type::backend_type;
  if constexpr (requires { Backend::pinned_resource(); })
    s.file.stage_through(&Backend::pinned_resource());
  for (int c = 0; c < chunks.size(); ++c)
    add_state_pieces(s.file, s.tensors, chunks.engine(c), tp_rank);
  return s;
}

/// Writes world rank `rank`'s share into checkpoint folder `dir` (created;
/// an older save's metadata there removed, it is stale): its data file and
/// its part of the metadata. Throws io_error.
inline void write_checkpoint_share(const std::filesystem::path& dir, int rank,
                                   const rank_share& share) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TESSERA_THROW_IF(ec || !std::filesystem::is_directory(dir), io_error,
                   "cannot create checkpoint folder '", dir.string(),
                   "': ", ec ? ec.message() : "a file of that name is in the way");
  std::filesystem::remove(dir / checkpoint_metadata_name, ec);
  TESSERA_THROW_IF(ec, io_error, "cannot remove the stale '",
                   (dir / checkpoint_metadata_name).string(), "': ", ec.message());
  write_rank_part(dir, rank, share.file, share.tensors);
}

/// Completes a save of `ranks` ranks into `dir` once each has written its
/// share (`failed`: this rank's failure, or null): the ranks agree; world
/// rank 0 merges the parts into the metadata with run state `run`, the
/// last file; the ranks agree again. Collective over `world`
/// (train/agree.hpp). Throws on every rank the lowest failing rank's
/// error, naming it and the folder.
template <class World>
void commit_checkpoint_folder(World& world, int rank, int ranks, const std::filesystem::path& dir,
                              const nlohmann::json& run, std::exception_ptr failed) {
  const std::string what = "checkpoint save to '" + dir.string() + "'";
  agree_or_throw(world, rank, failed, what);
  if (rank == 0) {
    try {
      (void)merge_rank_parts(dir, ranks, run);
    } catch (...) {
      failed = std::current_exception();
    }
  }
  agree_or_throw(world, rank, failed, what);
}

/// Writes `chunks` (every model chunk of this rank: parameters, master
/// weights, optimizer state) to checkpoint folder `dir` with run state
/// `run` (the trainer's metadata: step, data position, settings), as the
/// file comment says. Collective over the mesh. Throws, on every rank, the
/// io_error (a full disk, a read-only folder) of the lowest failing world
/// rank, naming it and the folder.
template <class Chunks, class Layout>
void save_checkpoint_folder(Chunks& chunks, const Layout& mesh, const std::filesystem::path& dir,
                            nlohmann::json run) {
  auto world = mesh_reduction(mesh, chunks.model().context());
  run = checkpoint_run_state(chunks, mesh, std::move(run));
  std::exception_ptr failed;
  try {
    write_checkpoint_share(dir, mesh.world_rank(), checkpoint_share(chunks, mesh.tp_rank()));
  } catch (...) {
    failed = std::current_exception();
  }
  commit_checkpoint_folder(world, mesh.world_rank(), mesh.world_size(), dir, run, failed);
}

/// Restores `chunks` from checkpoint folder `dir`, written at any layout
/// the model allows, after checking its run settings against `mine` (the
/// trainer's metadata; layout keys left out) for a run of `steps` steps;
/// returns the checkpoint's step. Collective. Throws on every rank what the
/// lowest failing rank threw: io_error for a folder without metadata, a
/// missing, truncated or inconsistent file, or elements no piece holds;
/// config_error for other settings (every differing one named).
/// `run_state` (if not null) receives the checkpoint's run state (what a
/// policy restores beyond the tensors, e.g. the loss scaler's state).
template <class Chunks, class Layout>
std::int64_t load_checkpoint_folder(Chunks& chunks, const Layout& mesh,
                                    const std::filesystem::path& dir, const nlohmann::json& mine,
                                    std::int64_t steps, nlohmann::json* run_state = nullptr) {
  const auto& ctx = chunks.model().context();
  auto world = mesh_reduction(mesh, ctx);
  const int rank = mesh.world_rank();
  std::int64_t step = 0;
  std::exception_ptr failed;
  try {
    checkpoint_reader rd(dir);
    nlohmann::json theirs = rd.index().run, ours = nlohmann::json::object();
    for (const auto& [k, v] : mine.items())
      if (!layout_key(k)) ours[k] = v;
    for (auto it = theirs.begin(); it != theirs.end();)
      it = layout_key(it.key()) ? theirs.erase(it) : std::next(it);
    step = check_resume_metadata(dir / checkpoint_metadata_name, theirs, ours, steps);
    const std::int64_t t = rd.index().run.at("optimizer_steps").get<std::int64_t>();
    for (int c = 0; c < chunks.size(); ++c) load_state(rd, chunks.engine(c), mesh.tp_rank(), t);
    if (run_state) *run_state = rd.index().run;
  } catch (const nlohmann::json::exception& e) {
    failed = std::make_exception_ptr(
        io_error("checkpoint '" + dir.string() + "': its run state is malformed: " + e.what()));
  } catch (...) {
    failed = std::current_exception();
  }
  agree_or_throw(world, rank, failed, "checkpoint load from '" + dir.string() + "'");
  // Every rank must have loaded the same step (a run folder that is not
  // the same on every machine could give each its own newest checkpoint).
  std::vector<double> v{static_cast<double>(step), -static_cast<double>(step)};
  world(v, comm::reduce_op::max);
  TESSERA_THROW_IF(v[0] != -v[1], config_error, "checkpoint load from '", dir.string(),
                   "': the ranks loaded different steps (", static_cast<std::int64_t>(-v[1]),
                   " to ", static_cast<std::int64_t>(v[0]),
                   "); every rank must see the same run folder");
  return step;
}

}  // namespace tessera::train
