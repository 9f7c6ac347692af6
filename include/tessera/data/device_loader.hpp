#pragma once
/// \file data/device_loader.hpp
/// The pinned, double-buffered loader: micro-batches of training windows go
/// from the sampler to two pinned host buffers and, by asynchronous copies on
/// a side stream, to two device buffers, so the copy of micro-batch k+1
/// overlaps the compute of micro-batch k (DESIGN.md, "One step, as data
/// flows": sampler -> pinned host buffer -> device, double-buffered).
///
/// A micro-batch is the sampler's (B, T+1) windows split into two int32
/// arrays of N = B*T elements, stored back to back in one buffer (one copy):
///   inputs[b*T + t]  = window[b][t]       (B, T), the tokens the model reads
///   targets[b*T + t] = window[b][t + 1]   (B, T), what position (b, t) predicts
/// Under context parallelism (options cp > 1) a rank keeps its L = T/cp
/// positions of each row (core/cp_shard.hpp, head-tail: chunks cp_rank and
/// 2 cp - 1 - cp_rank), so N = B*L and
///   inputs[b*L + l]  = window[b][p(l)],  targets[b*L + l] = window[b][p(l) + 1]
/// with p(l) = cp_shard::position(l): the same windows on every rank of the
/// cp group, each taking its tokens.
/// Every id is checked on the host before it is copied: it must lie in
/// [0, V) or equal the ignore index (padding: an ignored target is not
/// scored, an ignored input embeds to zeros). The device kernels do not
/// check ids (kernels/cuda/kernels.hpp, embedding_forward).
///
/// Protocol (slot i = one pinned buffer, one device buffer, two events):
///
///   prefetch(step, mb), into the slot not handed out by next():
///     1. fill and check the windows in a host scratch buffer (throws here,
///        before anything is queued: the slots are unchanged);
///     2. host_wait(copied[i]): the H2D copy that last read pinned i is done
///        (event synchronize; usually long done, see "Run-ahead");
///     3. write inputs and targets into pinned i, count the scored targets;
///     4. copy stream waits on released[i] (recorded on the compute stream
///        after the last work that read device i; no host block);
///     5. cudaMemcpyAsync(device i <- pinned i) on the copy stream;
///     6. record copied[i] on the copy stream.
///   next(), handing out micro-batch k from slot i:
///     0. fill and check micro-batch k+1 (step 1 above; a bad id throws
///        here, before anything changes);
///     1. record released[j] on the compute stream for the slot j handed out
///        by the previous next(): every kernel that read it is queued by now;
///     2. compute stream waits on copied[i] of the prefetched slot i (no host
///        block), and slot i is handed out;
///     3. steps 2-6 above for micro-batch k+1 into slot j: its copy waits
///        only for the compute of micro-batch k-1, so it runs while
///        micro-batch k computes.
///
/// The caller's contract: every kernel that reads a batch returned by next()
/// is queued on the compute stream before the next call to next(). The
/// pointers stay allocated for the loader's lifetime, but their contents
/// belong to later micro-batches after that.
///
/// Run-ahead: next(k) refills the pinned buffer of micro-batch k-1, so its
/// step 2 waits for the copy of k-1, which itself waited for the compute of
/// k-3. The host therefore blocks in next(k) only while the GPU has not
/// finished micro-batch k-3: at most two micro-batches of work stay queued
/// ahead of the one being issued, and that bound is also what makes two
/// pinned buffers enough.
///
/// The bookkeeping is device-independent: `basic_device_loader<System>`
/// takes a `loader_system` policy (memory, events, the two streams).
/// `cuda_loader_system` (below, when the CUDA runtime headers are available)
/// uses cudaHostAlloc'd pinned memory, the caching device allocator, CUDA
/// events and a non-blocking copy stream; tests/data/device_loader_bookkeeping.cpp
/// drives the same class with simulated streams on the host, and
/// tests/cuda/loader.cpp on a GPU.
///
/// Thread-safety: one loader per compute stream, used from one thread.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "tessera/core/backend.hpp"
#include "tessera/core/cp_shard.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/memory.hpp"
#include "tessera/core/nvtx.hpp"
#include "tessera/data/sampler.hpp"

namespace tessera::data {

/// What a device loader needs from the system below it. All copies and
/// stream operations are asynchronous except `host_wait`.
/// - `allocate_pinned(bytes)` / `deallocate_pinned(p, bytes)`: page-locked
///   host memory (the copy source);
/// - `allocate_device(bytes)` / `deallocate_device(p, bytes)`: device memory
///   written on the copy stream and read on the compute stream;
/// - `create_event()` / `destroy_event(e)`;
/// - `copy_to_device(d_dst, h_src, bytes)`: host -> device on the copy stream;
/// - `record_on_copy_stream(e)`, `record_on_compute_stream(e)`: e completes
///   when the work queued so far on that stream has;
/// - `copy_stream_wait(e)`, `compute_stream_wait(e)`: later work on that
///   stream waits for e (no host block);
/// - `host_wait(e)`: blocks the host until e completed.
template <class S>
concept loader_system = requires(S& s, typename S::event_type& e, void* p, const void* cp,
                                 std::size_t n) {
  { s.allocate_pinned(n) } -> std::same_as<void*>;
  {s.deallocate_pinned(p, n)};
  { s.allocate_device(n) } -> std::same_as<void*>;
  {s.deallocate_device(p, n)};
  { s.create_event() } -> std::same_as<typename S::event_type>;
  {s.destroy_event(e)};
  {s.copy_to_device(p, cp, n)};
  {s.record_on_copy_stream(e)};
  {s.record_on_compute_stream(e)};
  {s.copy_stream_wait(e)};
  {s.compute_stream_wait(e)};
  {s.host_wait(e)};
};

/// A micro-batch on the device, as next() hands it out. Valid for kernels
/// queued on the compute stream before the following next(). L = T, or a
/// rank's T/cp tokens under context parallelism (file comment).
struct device_batch {
  const std::int32_t* d_inputs = nullptr;   ///< (B, L) int32, device: window[b][p(l)]
  const std::int32_t* d_targets = nullptr;  ///< (B, L) int32, device: window[b][p(l)+1]
  std::int64_t N = 0;                       ///< B * L elements in each array
  std::int64_t scored = 0;                  ///< of these targets, those != ignore_index
  std::uint64_t step = 0;                   ///< the optimizer step it belongs to
  std::uint64_t micro_batch = 0;            ///< its global micro-batch index
};

/// Fills the (B, T+1) int32 windows of (step, global micro-batch) into `out`
/// (row-major), as batch_sampler::fill does.
using window_source =
    std::function<void(std::uint64_t step, std::uint64_t micro_batch, std::int32_t* out)>;

/// Shapes, the vocabulary check and the order of micro-batches.
struct device_loader_options {
  std::int64_t B = 0;                   ///< rows per micro-batch
  std::int64_t T = 0;                   ///< sequence length (windows hold T+1)
  std::int64_t V = 0;                   ///< vocabulary size: ids must be < V
  std::int32_t ignore_index = -100;     ///< also accepted (llama_options::ignore_index)
  std::int64_t micro_batches = 1;       ///< A: this rank's micro-batches per step
  std::uint64_t first_micro_batch = 0;  ///< global index of local micro-batch 0 (rank * A)
  int cp = 1;                           ///< context-parallel ranks sharing each window
  int cp_rank = 0;                      ///< this rank's index among them (its tokens)

  /// Throws config_error naming the value if a size is < 1 or B*T overflows int32 counts.
  void validate() const {
    TESSERA_THROW_IF(B < 1 || T < 1, config_error, "device loader: B=", B, " and T=", T,
                     " must be >= 1");
    TESSERA_THROW_IF(V < 1, config_error, "device loader: vocabulary size V=", V, " must be >= 1");
    TESSERA_THROW_IF(micro_batches < 1, config_error,
                     "device loader: micro_batches=", micro_batches, " must be >= 1");
    TESSERA_THROW_IF(B > (std::int64_t{1} << 40) / T, config_error, "device loader: B*T = ", B, "*",
                     T, " tokens per micro-batch is too large");
    (void)shard();  // throws naming T and cp
  }
  /// The tokens of each row this rank keeps (all T when cp is 1). Throws
  /// config_error as cp_shard::of (2 cp must divide T).
  [[nodiscard]] cp_shard shard() const {
    return cp_shard::of(T, cp, cp_rank);
  }
};

/// The double-buffered loader over a `loader_system` (file comment:
/// protocol, contract, run-ahead). Owns its System, two pinned buffers and
/// two device buffers of 2*B*T int32 each, and four events.
template <loader_system System>
class basic_device_loader {
 public:
  using event_type = typename System::event_type;

  /// Allocates the buffers (now, so the memory is visible before step 0).
  /// Throws config_error for bad options, and what System throws.
  basic_device_loader(System sys, window_source source, device_loader_options opt)
      : sys_(std::move(sys)), source_(std::move(source)), opt_(checked(opt)) {
    TESSERA_THROW_IF(!source_, config_error, "device loader: the window source is empty");
    N_ = opt_.B * opt_.shard().tokens();
    window_.resize(static_cast<std::size_t>(opt_.B * (opt_.T + 1)));
    try {
      for (slot& s : slots_) {
        s.h_tokens = static_cast<std::int32_t*>(sys_.allocate_pinned(buffer_bytes()));
        s.d_tokens = static_cast<std::int32_t*>(sys_.allocate_device(buffer_bytes()));
        s.copied = sys_.create_event();
        s.has_copied_event = true;
        s.released = sys_.create_event();
        s.has_released_event = true;
      }
    } catch (...) {
      free_all();
      throw;
    }
  }
  /// The loader over a batch_sampler (not owned; must outlive the loader),
  /// with its B and T.
  basic_device_loader(System sys, const batch_sampler& sampler, std::int64_t V,
                      std::int64_t micro_batches = 1, std::uint64_t first_micro_batch = 0,
                      std::int32_t ignore_index = -100)
      : basic_device_loader(
            std::move(sys),
            [s = &sampler](std::uint64_t step, std::uint64_t mb, std::int32_t* out) {
              s->fill(step, mb, out);
            },
            device_loader_options{sampler.B, sampler.T, V, ignore_index, micro_batches,
                                  first_micro_batch}) {}

  /// Waits for the copies still in flight (they read the pinned buffers),
  /// then frees everything. Device buffers are returned to System, which
  /// must keep them from reuse until the compute stream's reads are done
  /// (cuda_loader_system: the caching allocator's record_stream).
  ~basic_device_loader() {
    for (slot& s : slots_)
      if (s.copy_recorded) try {
          sys_.host_wait(s.copied);
        } catch (...) {
        }
    free_all();
  }
  basic_device_loader(const basic_device_loader&) = delete;
  basic_device_loader& operator=(const basic_device_loader&) = delete;

  /// Starts loading global micro-batch `micro_batch` of step `step` into the
  /// slot not handed out by next() (a batch prefetched there but not yet
  /// handed out is replaced). Steps 1-6 of the protocol.
  /// \throws config_error if micro_batch is outside [first_micro_batch,
  ///         first_micro_batch + micro_batches), or if a token id is neither
  ///         in [0, V) nor the ignore index (naming the id, its row and
  ///         position in the window, the step, the micro-batch and V); the
  ///         loader is unchanged then. What the source or System throws.
  void prefetch(std::uint64_t step, std::uint64_t micro_batch) {
    TESSERA_NVTX_RANGE("loader: prefetch step ", step, " micro-batch ", micro_batch);
    stage(step, micro_batch);
    commit(step, micro_batch);
  }

  /// Hands out the prefetched micro-batch: releases the previous one (event
  /// on the compute stream), makes the compute stream wait for the copy (no
  /// host block), and, when `prefetch_following`, prefetches the micro-batch
  /// after it (following_micro_batch) into the other slot.
  /// \throws error if nothing was prefetched; config_error as prefetch() if
  ///         the following micro-batch holds a bad id (checked first: the
  ///         loader is unchanged and nothing is handed out); what System throws.
  device_batch next(bool prefetch_following = true) {
    TESSERA_NVTX_RANGE("loader: next");
    const int i = loaded_slot();
    TESSERA_THROW_IF(i < 0, error,
                     "device loader: next() with nothing prefetched; call prefetch(step, "
                     "micro_batch) first");
    slot& s = slots_[static_cast<std::size_t>(i)];
    const auto [f_step, f_mb] = following_micro_batch(s.step, s.micro_batch);
    if (prefetch_following) stage(f_step, f_mb);  // 3a. fill and check k+1 (may throw)
    if (in_use_ >= 0) {                           // 1. release the batch handed out before
      slot& old = slots_[static_cast<std::size_t>(in_use_)];
      sys_.record_on_compute_stream(old.released);
      old.release_recorded = true;
      old.state = slot_state::free;
    }
    sys_.compute_stream_wait(s.copied);  // 2. compute waits for the copy
    s.state = slot_state::in_use;
    in_use_ = i;
    const device_batch out{s.d_tokens, s.d_tokens + N_, N_, s.scored, s.step, s.micro_batch};
    if (prefetch_following) commit(f_step, f_mb);  // 3b. its copy overlaps the compute of k
    return out;
  }

  /// The micro-batch after (step, micro_batch) in this rank's order: the
  /// next micro-batch of the step, or the first one of the next step.
  std::pair<std::uint64_t, std::uint64_t> following_micro_batch(std::uint64_t step,
                                                                std::uint64_t micro_batch) const {
    if (micro_batch + 1 < opt_.first_micro_batch + static_cast<std::uint64_t>(opt_.micro_batches))
      return {step, micro_batch + 1};
    return {step + 1, opt_.first_micro_batch};
  }

  /// The options (B, T, V, ignore index, order).
  const device_loader_options& options() const { return opt_; }
  /// Elements of each array of a micro-batch: B * T (B * T/cp under
  /// context parallelism).
  std::int64_t N() const { return N_; }
  /// Bytes of one buffer (inputs and targets): 2 * N() * 4.
  std::size_t buffer_bytes() const {
    return 2 * static_cast<std::size_t>(N_) * sizeof(std::int32_t);
  }
  /// Pinned host bytes held: two buffers.
  std::size_t pinned_bytes() const { return 2 * buffer_bytes(); }
  /// Device bytes held: two buffers.
  std::size_t device_bytes() const { return 2 * buffer_bytes(); }
  /// Host -> device copies issued so far.
  std::int64_t copies() const { return copies_; }
  /// Whether a prefetched micro-batch waits to be handed out.
  bool has_prefetched() const { return loaded_slot() >= 0; }
  /// The System (for its streams, or a test's observations).
  System& system() { return sys_; }
  const System& system() const { return sys_; }

 private:
  enum class slot_state { free, loaded, in_use };
  struct slot {
    std::int32_t* h_tokens = nullptr;  // (2, B, T) pinned: inputs then targets
    std::int32_t* d_tokens = nullptr;  // (2, B, T) device: the same
    event_type copied{};               // after the H2D copy that read h_tokens
    event_type released{};             // after the compute that read d_tokens
    bool has_copied_event = false, has_released_event = false;
    bool copy_recorded = false, release_recorded = false;
    slot_state state = slot_state::free;
    std::uint64_t step = 0, micro_batch = 0;
    std::int64_t scored = 0;
  };

  static device_loader_options checked(device_loader_options o) {
    o.validate();
    return o;
  }
  int loaded_slot() const {
    for (int i = 0; i < 2; ++i)
      if (slots_[static_cast<std::size_t>(i)].state == slot_state::loaded) return i;
    return -1;
  }
  // Protocol step 1 of prefetch: the windows of (step, micro_batch) into
  // the scratch buffer, checked. Changes nothing else; throws config_error.
  void stage(std::uint64_t step, std::uint64_t micro_batch) {
    TESSERA_THROW_IF(
        micro_batch < opt_.first_micro_batch ||
            micro_batch - opt_.first_micro_batch >= static_cast<std::uint64_t>(opt_.micro_batches),
        config_error, "device loader: micro-batch ", micro_batch, " is outside [",
        opt_.first_micro_batch, ", ",
        opt_.first_micro_batch + static_cast<std::uint64_t>(opt_.micro_batches),
        "), this rank's micro-batches of a step");
    source_(step, micro_batch, window_.data());
    check_ids(step, micro_batch);
  }
  // Protocol steps 2-6 of prefetch for the staged windows.
  void commit(std::uint64_t step, std::uint64_t micro_batch) {
    const int i = target_slot();
    slot& s = slots_[static_cast<std::size_t>(i)];
    // 2. the copy that last read pinned i is done
    if (s.copy_recorded) sys_.host_wait(s.copied);
    // 3. inputs and targets into pinned i: this rank's chunks of each row
    // (one chunk of all T tokens without context parallelism)
    const std::int64_t T = opt_.T;
    const cp_shard sh = opt_.shard();
    const std::int64_t L = sh.tokens();
    std::int32_t* in = s.h_tokens;
    std::int32_t* tg = s.h_tokens + N_;
    for (std::int64_t b = 0; b < opt_.B; ++b) {
      const std::int32_t* w = window_.data() + b * (T + 1);
      sh.take(w, in + b * L);
      sh.take(w + 1, tg + b * L);
    }
    const std::int64_t scored =
        std::count_if(tg, tg + N_, [&](std::int32_t id) { return id != opt_.ignore_index; });
    // 4. device i is free once the compute that read it is done
    if (s.release_recorded) sys_.copy_stream_wait(s.released);
    // 5, 6. the copy, and its event
    sys_.copy_to_device(s.d_tokens, s.h_tokens, buffer_bytes());
    sys_.record_on_copy_stream(s.copied);
    s.copy_recorded = true;
    s.state = slot_state::loaded;
    s.step = step;
    s.micro_batch = micro_batch;
    s.scored = scored;
    ++copies_;
  }

  // The slot prefetch() fills: the one not handed out by next() (before
  // the first next(), slot 0, replacing a batch prefetched there).
  int target_slot() const { return in_use_ >= 0 ? 1 - in_use_ : 0; }

  // Every id of the window in [0, V) or the ignore index; on failure names
  // the first bad one. The scan is branch-free; only a failure searches.
  void check_ids(std::uint64_t step, std::uint64_t micro_batch) const {
    const std::int64_t V = opt_.V;
    const std::int32_t ign = opt_.ignore_index;
    std::size_t bad = 0;
    for (const std::int32_t x : window_) bad += (x < 0 || x >= V) && x != ign;
    if (bad == 0) return;
    const std::int64_t W = opt_.T + 1;
    for (std::size_t k = 0; k < window_.size(); ++k) {
      const std::int32_t x = window_[k];
      if ((x < 0 || x >= V) && x != ign) {
        const auto idx = static_cast<std::int64_t>(k);
        throw config_error(::tessera::detail::str(
            "device loader: token id ", x, " at row ", idx / W, ", position ", idx % W,
            " of the (B=", opt_.B, ", T+1=", W, ") window of step ", step, ", micro-batch ",
            micro_batch, " is not a valid id for the vocabulary size V=", V,
            " (ids must be in [0, ", V, ") or the ignore index ", ign, "; ", bad,
            " such ids in this micro-batch): the data's vocabulary does not match the "
            "model's"));
      }
    }
  }

  void free_all() noexcept {
    for (slot& s : slots_) {
      if (s.h_tokens) sys_.deallocate_pinned(s.h_tokens, buffer_bytes());
      if (s.d_tokens) sys_.deallocate_device(s.d_tokens, buffer_bytes());
      if (s.has_copied_event) sys_.destroy_event(s.copied);
      if (s.has_released_event) sys_.destroy_event(s.released);
      s = slot{};
    }
  }

  System sys_;
  window_source source_;
  device_loader_options opt_;
  std::int64_t N_ = 0;
  std::vector<std::int32_t> window_;  // (B, T+1) scratch: filled and checked before use
  std::array<slot, 2> slots_{};
  int in_use_ = -1;  // the slot handed out by the last next(), -1 before the first
  std::int64_t copies_ = 0;
};

/// The host backend's loader system: "pinned" and "device" buffers are
/// both host memory from one memory resource (counted with the run's other
/// bytes), copies are memcpy and every stream operation is already
/// complete, so the loader's protocol (checked ids, two slots, the next
/// micro-batch staged while this one computes) is the same code on the host
/// as on a GPU.
class host_loader_system {
 public:
  /// An empty event (host work is synchronous).
  struct event_type {};

  /// Buffers from `mr` (not owned; must outlive the loader).
  explicit host_loader_system(memory_resource& mr) : mr_(&mr) {}

  void* allocate_pinned(std::size_t n) { return mr_->allocate(n, 64); }
  void deallocate_pinned(void* p, std::size_t n) noexcept { mr_->deallocate(p, n); }
  void* allocate_device(std::size_t n) { return mr_->allocate(n, 64); }
  void deallocate_device(void* p, std::size_t n) noexcept { mr_->deallocate(p, n); }
  event_type create_event() { return {}; }
  void destroy_event(event_type&) noexcept {}
  void copy_to_device(void* dst, const void* src, std::size_t n) {
    if (n) std::memcpy(dst, src, n);
  }
  void record_on_copy_stream(event_type&) {}
  void record_on_compute_stream(event_type&) {}
  void copy_stream_wait(event_type&) {}
  void compute_stream_wait(event_type&) {}
  void host_wait(event_type&) {}

 private:
  memory_resource* mr_;
};

static_assert(loader_system<host_loader_system>);

/// The loader system of a backend: `type`, and `make(ctx)` building it for
/// an execution context of that backend (kernels/context.hpp); the cuda
/// specialisation is in data/cuda_loader.hpp (<tessera/cuda.hpp>).
template <class Backend>
struct loader_system_for;
template <>
struct loader_system_for<host> {
  using type = host_loader_system;
  template <class Ctx>
  static type make(const Ctx& ctx) {
    return type(ctx.resource());
  }
};

/// The double-buffered loader of backend `Backend`.
template <class Backend>
using loader_for = basic_device_loader<typename loader_system_for<Backend>::type>;


}  // namespace tessera::data
