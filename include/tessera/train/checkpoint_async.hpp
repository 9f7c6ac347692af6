#pragma once
/// \file train/checkpoint_async.hpp
/// An asynchronous checkpoint save (PyTorch DCP's async_save, Megatron's
/// --async-save): at the step, every rank copies its share of the state to
/// host memory (rank_file::snapshot) and a background thread writes it
/// while training goes on; the ranks complete the save together later
/// (commit_checkpoint_folder: agreed, then the metadata, the last file).
///
///   async_checkpoint a;
///   a.begin(chunks, mesh, "runs/a/step-000200", run);  // local: copy, start the writer
///   ... steps ...
///   a.finish(world, false);  // collective, each step: completes once every rank has written
///   a.finish(world, true);   // collective: waits for this rank's writer, then completes
///
/// A failed background write (a full disk) fails the save on every rank at
/// its finish, naming the rank, as a synchronous save does. A folder is
/// complete only once its metadata is written, so a run killed with a
/// write in flight resumes from the save before. The copy holds host
/// memory of one rank's share for the run's life: the next save copies
/// into the same buffers.

#include <atomic>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"
#include "tessera/train/checkpoint_folder.hpp"

namespace tessera::train {

/// One checkpoint folder saved in the background at a time (file comment).
/// Every rank of the mesh holds one and calls begin and finish at the same
/// points. Destruction waits for a write in flight (its folder stays
/// incomplete). Not copyable.
class async_checkpoint {
 public:
  async_checkpoint() = default;
  async_checkpoint(const async_checkpoint&) = delete;
  async_checkpoint& operator=(const async_checkpoint&) = delete;
  ~async_checkpoint() {
    if (writer_.joinable()) writer_.join();
  }

  /// True from begin until the finish that completes the save.
  bool pending() const { return !dir_.empty(); }
  /// The folder being saved (empty: none).
  const std::filesystem::path& folder() const { return dir_; }

  /// Copies this rank's share of `chunks` to host memory and starts
  /// writing it into `dir` in the background; `run`: the trainer's
  /// metadata (checkpoint_run_state adds the rest). Not collective.
  /// Throws error when a save is pending (finish it first); any other
  /// failure here (a host allocation, a device copy, the thread) is
  /// reported at finish, on every rank, as a write's is.
  template <class Chunks, class Layout>
  void begin(Chunks& chunks, const Layout& mesh, std::filesystem::path dir, nlohmann::json run) {
    TESSERA_THROW_IF(pending(), error, "async_checkpoint::begin: the save to '", dir_.string(),
                     "' is not finished");
    dir_ = std::move(dir);
    run_ = checkpoint_run_state(chunks, mesh, std::move(run));
    rank_ = mesh.world_rank();
    ranks_ = mesh.world_size();
    failed_ = nullptr;
    written_.store(false);
    try {
      rank_share share = checkpoint_share(chunks, mesh.tp_rank());
      rank_share copy{share.file.snapshot(&staging_), std::move(share.tensors)};
      writer_ = std::thread([this, copy = std::move(copy)] {
        try {
          write_checkpoint_share(dir_, rank_, copy);
        } catch (...) {
          failed_ = std::current_exception();  // read by finish after the join
        }
        written_.store(true, std::memory_order_release);
      });
    } catch (...) {  // nothing started: finish reports it
      failed_ = std::current_exception();
      written_.store(true);
    }
  }

  /// Completes the pending save once every rank's write has ended (`wait`:
  /// this rank waits for its own first); returns the folder completed, or
  /// an empty path when none is pending or, without `wait`, a rank is
  /// still writing. Collective over `world` (train/agree.hpp) whenever a
  /// save is pending: one all-reduce without `wait`. Throws on every rank
  /// the lowest failing rank's error, naming it and the folder (the save
  /// is then over: nothing pending).
  template <class World>
  std::filesystem::path finish(World& world, bool wait) {
    if (!pending()) return {};
    if (!wait) {
      std::vector<double> busy{written_.load(std::memory_order_acquire) ? 0.0 : 1.0};
      world(busy, comm::reduce_op::max);
      if (busy[0] != 0) return {};
    }
    if (writer_.joinable()) writer_.join();
    std::filesystem::path dir = std::move(dir_);
    dir_.clear();
    commit_checkpoint_folder(world, rank_, ranks_, dir, run_, std::exchange(failed_, nullptr));
    return dir;
  }

 private:
  std::filesystem::path dir_;
  nlohmann::json run_;
  int rank_ = 0, ranks_ = 1;
  std::exception_ptr failed_;
  std::atomic<bool> written_{false};
  rank_file::staging staging_;  // the host copy, reused by the next save
  std::thread writer_;
};

}  // namespace tessera::train
