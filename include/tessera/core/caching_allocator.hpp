#pragma once
/// \file caching_allocator.hpp
/// The bookkeeping of a stream-ordered caching allocator, independent of the
/// device: size-rounded blocks carved from large segments, best-fit reuse on
/// the same stream without synchronisation, splitting and coalescing, events
/// for blocks used on other streams, allocated/reserved/peak statistics,
/// empty_cache() and an event log that dumps as JSON.
///
/// The memory itself comes from a `system_allocator` policy. On the GPU that
/// is cudaMalloc/cudaFree plus CUDA events (tessera/core/cuda.hpp,
/// `cuda_caching_resource`); tests/core/caching_allocator.cpp drives the same
/// class with a fake system on the host, so every rule below is tested
/// without a GPU.
///
/// Rules (the defaults follow PyTorch's CUDACachingAllocator, c10/cuda,
/// "kMinBlockSize", "kSmallSize", "kSmallBuffer", "kLargeBuffer",
/// "kMinLargeAlloc", "kRoundLarge"):
/// - A request of n bytes is served by a block of round_up(max(n,1), 512) B.
/// - Blocks of <= 1 MiB come from the small pool, carved from 2 MiB segments;
///   larger ones from the large pool: 20 MiB segments for blocks under
///   10 MiB, otherwise a segment of the block rounded up to 2 MiB.
/// - A free block is reused only by a request on the stream it was last
///   allocated on (stream order makes that safe without a sync); the
///   smallest free block that fits is taken (best fit, then lowest address).
/// - The rest of a block is split off when it is >= 512 B (small pool) or
///   > 1 MiB (large pool); freed neighbours in a segment coalesce.
/// - A block that was used on another stream (`record_stream`) is not reused
///   until an event recorded on each such stream at free time has completed.
/// - When the system refuses a segment, every free cached segment is returned
///   and the request is tried once more; then tessera::error is thrown with
///   the request and the figures.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <ostream>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/memory.hpp"

namespace tessera {

/// Opaque stream identity for the allocator (a cudaStream_t cast to an
/// integer on the GPU; any value in tests). 0 is the default stream.
using stream_id = std::uintptr_t;

/// What a caching allocator needs from the system below it.
/// - `allocate(bytes)` returns memory aligned to at least `base_alignment`, or
///   nullptr when the system is out of memory (it may throw on other errors);
/// - `deallocate(p, bytes)` returns a segment;
/// - `record_event(stream)` records an event on `stream` and returns it;
///   `event_done(e)` polls it; `wait_event(e)` blocks until it completed;
///   `destroy_event(e)` releases it;
/// - `name()` names the device ("cuda:0").
template <class S>
concept system_allocator = requires(S& s, const S& cs, std::size_t n, void* p, stream_id st,
                                    typename S::event_type e) {
  { S::base_alignment } -> std::convertible_to<std::size_t>;
  { s.allocate(n) } -> std::same_as<void*>;
  {s.deallocate(p, n)};
  { s.record_event(st) } -> std::same_as<typename S::event_type>;
  { s.event_done(e) } -> std::same_as<bool>;
  {s.wait_event(e)};
  {s.destroy_event(e)};
  { cs.name() } -> std::convertible_to<std::string>;
};

/// Size rules of a caching allocator, in bytes (values, not types: STYLE.md).
struct caching_allocator_config {
  std::size_t min_block = 512;              ///< every block is a multiple of this
  std::size_t small_size = 1u << 20;        ///< blocks up to this come from the small pool
  std::size_t small_segment = 2u << 20;     ///< segment size of the small pool
  std::size_t large_segment = 20u << 20;    ///< segment for large blocks below min_large_alloc
  std::size_t min_large_alloc = 10u << 20;  ///< from here a block gets its own segment
  std::size_t round_large = 2u << 20;       ///< ... rounded up to a multiple of this
  std::size_t max_log_events = 1u << 20;    ///< the event log keeps at most this many entries
  bool log_events = false;                  ///< record the event log from construction

  /// Throws config_error unless the sizes are powers of two in a sane order.
  void validate() const {
    auto pow2 = [](std::size_t x) { return x && !(x & (x - 1)); };
    TESSERA_THROW_IF(!pow2(min_block) || !pow2(round_large), config_error,
                     "caching allocator: min_block=", min_block, " and round_large=", round_large,
                     " must be powers of two");
    TESSERA_THROW_IF(small_size < min_block || small_segment < small_size ||
                         large_segment < min_large_alloc || min_large_alloc <= small_size,
                     config_error,
                     "caching allocator: need min_block <= small_size <= "
                     "small_segment and small_size < min_large_alloc <= large_segment (got ",
                     min_block, ", ", small_size, ", ", small_segment, ", ", min_large_alloc, ", ",
                     large_segment, ")");
    TESSERA_THROW_IF(
        small_segment % min_block || large_segment % min_block || round_large % min_block,
        config_error,
        "caching allocator: segment sizes must be multiples of "
        "min_block=",
        min_block);
  }
};

/// Figures beyond `memory_stats`, in bytes unless named a count.
struct caching_stats {
  memory_stats base;               ///< allocated (as requested), reserved, peaks, num_allocs
  std::size_t active = 0;          ///< bytes of blocks handed out (rounded sizes)
  std::size_t cached = 0;          ///< bytes of free blocks in the pools, ready for reuse
  std::size_t pending = 0;         ///< bytes of freed blocks waiting on cross-stream events
  std::size_t inactive_split = 0;  ///< free bytes inside segments that are partly in use
  std::size_t largest_free = 0;    ///< the largest free block
  std::size_t segments = 0;        ///< segments held from the system (count)
  std::size_t system_allocs = 0;   ///< segments ever obtained (count)
  std::size_t system_frees = 0;    ///< segments ever returned (count)
  std::size_t oom_retries = 0;     ///< times the cache was emptied to retry a refused segment
  std::size_t bad_frees = 0;       ///< deallocate() calls with an unknown pointer (count)
  std::size_t event_failures =
      0;  ///< events that could not be recorded (those blocks are never reused)
};

/// Kind of one event-log entry.
enum class alloc_event_kind { alloc, free, segment_alloc, segment_free };

/// Name of an event kind, as written in the JSON log.
inline const char* alloc_event_name(alloc_event_kind k) {
  switch (k) {
    case alloc_event_kind::alloc:
      return "alloc";
    case alloc_event_kind::free:
      return "free";
    case alloc_event_kind::segment_alloc:
      return "segment_alloc";
    case alloc_event_kind::segment_free:
      return "segment_free";
  }
  return "unknown";
}

/// One entry of the event log. `bytes` is the request for alloc and free, the
/// segment size for segment events; `allocated` and `reserved` are the
/// figures just after the event; `t_ns` counts from the allocator's creation.
struct alloc_event {
  alloc_event_kind kind;
  std::uint64_t t_ns;
  std::uintptr_t addr;
  std::size_t bytes;
  stream_id stream;
  std::size_t allocated;
  std::size_t reserved;
};

/// Caching memory resource over the system allocator `System` (see the file
/// comment for the rules). Thread-safe (one mutex). `allocate(bytes, align)`
/// from memory_resource allocates on the current stream (set_stream);
/// `allocate_on` names the stream. Alignment up to System::base_alignment is
/// guaranteed (every block starts a multiple of min_block from its segment's
/// base). Deallocating a pointer that did not come from this allocator is
/// counted in caching_stats::bad_frees and otherwise ignored.
template <system_allocator System>
class caching_allocator : public memory_resource {
 public:
  /// Builds an allocator over `sys`; throws config_error for a bad `cfg`.
  explicit caching_allocator(System sys = System{}, caching_allocator_config cfg = {})
      : sys_(std::move(sys)), cfg_(cfg), t0_(std::chrono::steady_clock::now()) {
    cfg_.validate();
    logging_ = cfg_.log_events;
  }
  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;
  /// Returns every segment to the system (live blocks included: their owners
  /// must not use them after this).
  ~caching_allocator() override {
    try {
      for (auto& pe : pending_) sys_.wait_event(pe.event), sys_.destroy_event(pe.event);
    } catch (...) {  // a failing device at exit: the segments go back below anyway
    }
    for (block* seg : segments_) {
      try {
        sys_.deallocate(seg->ptr, seg->segment_size);
      } catch (...) {
      }
      for (block* b = seg; b;) {
        block* n = b->next;
        delete b;
        b = n;
      }
    }
  }

  /// Allocates `bytes` on the current stream. Throws config_error for an
  /// alignment above System::base_alignment, out_of_memory when the system
  /// refuses even after the cache was emptied.
  void* allocate(std::size_t bytes, std::size_t alignment = 64) override {
    return allocate_on(bytes, current_stream_, alignment);
  }

  /// Allocates `bytes` for use on `stream` (stream-ordered: the memory may
  /// still be in use by earlier work on that same stream, never on another).
  void* allocate_on(std::size_t bytes, stream_id stream, std::size_t alignment = 64) {
    TESSERA_THROW_IF(
        alignment == 0 || (alignment & (alignment - 1)) || alignment > System::base_alignment,
        config_error, "caching allocator: alignment ", alignment,
        " must be a power of two <= ", System::base_alignment);
    std::lock_guard lock(mu_);
    process_events();
    const std::size_t size = round_size(bytes);
    const bool small = size <= cfg_.small_size;
    block* b = find_free(small ? small_pool_ : large_pool_, size, stream);
    if (!b) b = new_segment(size, small, stream, bytes);
    split(b, size);
    b->allocated = true;
    b->requested = bytes;
    active_.emplace(b->ptr, b);
    active_bytes_ += b->size;
    allocated_ += bytes;
    ++num_allocs_;
    peak_allocated_ = std::max(peak_allocated_, allocated_);
    log(alloc_event_kind::alloc, b->ptr, bytes, stream);
    return b->ptr;
  }

  /// Returns a block. Stream-ordered: the block becomes reusable on its
  /// stream at once, or after the events of record_stream() complete.
  void deallocate(void* p, std::size_t /*bytes*/) noexcept override {
    if (!p) return;
    std::lock_guard lock(mu_);
    auto it = active_.find(static_cast<char*>(p));
    if (it == active_.end()) {
      ++bad_frees_;
      return;
    }
    block* b = it->second;
    active_.erase(it);
    active_bytes_ -= b->size;
    allocated_ -= b->requested;
    log(alloc_event_kind::free, b->ptr, b->requested, b->stream);
    b->requested = 0;
    if (b->used_on.empty()) {
      free_block(b);
      return;
    }
    // Used on other streams: reusable only once their work up to now is done.
    pending_bytes_ += b->size;
    for (stream_id s : b->used_on) {
      try {
        pending_.push_back({sys_.record_event(s), b});
        ++b->pending_events;
      } catch (...) {
        // No event, so no way to know when that stream is done with the
        // block: it is never reused (it stays counted as pending).
        ++b->pending_events;
        ++event_failures_;
      }
    }
    b->used_on.clear();
  }

  /// Marks the live block at `p` as used by `stream` too (torch's
  /// Tensor.record_stream): when it is freed, it waits for that stream's work
  /// before anyone reuses it. Throws tessera::error for an unknown pointer.
  void record_stream(void* p, stream_id stream) {
    std::lock_guard lock(mu_);
    auto it = active_.find(static_cast<char*>(p));
    TESSERA_THROW_IF(it == active_.end(), error,
                     "caching allocator: record_stream on a pointer this allocator did not hand "
                     "out (or already freed)");
    block* b = it->second;
    if (stream != b->stream &&
        std::find(b->used_on.begin(), b->used_on.end(), stream) == b->used_on.end())
      b->used_on.push_back(stream);
  }

  /// Sets the stream that allocate(bytes, alignment) uses (0 at construction).
  void set_stream(stream_id s) {
    std::lock_guard lock(mu_);
    current_stream_ = s;
  }
  stream_id current_stream() const {
    std::lock_guard lock(mu_);
    return current_stream_;
  }

  /// Waits for every pending cross-stream event, then returns every segment
  /// with no live block to the system (torch.cuda.empty_cache()). Live
  /// blocks are untouched.
  void empty_cache() {
    std::lock_guard lock(mu_);
    for (auto& pe : pending_) sys_.wait_event(pe.event);
    process_events();
    release_free_segments();
  }

  memory_stats stats() const override {
    std::lock_guard lock(mu_);
    return base_stats();
  }

  /// Every figure, including fragmentation (inactive_split, largest_free).
  caching_stats detailed_stats() const {
    std::lock_guard lock(mu_);
    caching_stats s;
    s.base = base_stats();
    s.active = active_bytes_;
    s.pending = pending_bytes_;
    for (const auto* pool : {&small_pool_, &large_pool_})
      for (const block* b : *pool) {
        s.cached += b->size;
        s.largest_free = std::max(s.largest_free, b->size);
        if (b->prev || b->next) s.inactive_split += b->size;
      }
    s.segments = segments_.size();
    s.system_allocs = system_allocs_;
    s.system_frees = system_frees_;
    s.oom_retries = oom_retries_;
    s.bad_frees = bad_frees_;
    s.event_failures = event_failures_;
    return s;
  }

  void reset_peak() override {
    std::lock_guard lock(mu_);
    peak_allocated_ = allocated_;
    peak_reserved_ = reserved_;
  }

  std::string name() const override { return sys_.name(); }

  /// The block size a request of `bytes` gets: round_up(max(bytes, 1), min_block).
  std::size_t round_size(std::size_t bytes) const {
    const std::size_t n = bytes ? bytes : 1;
    return (n + cfg_.min_block - 1) / cfg_.min_block * cfg_.min_block;
  }

  /// Size of the segment obtained from the system for a block of `size`
  /// bytes that no cached block can hold.
  std::size_t segment_size(std::size_t size) const {
    if (size <= cfg_.small_size) return cfg_.small_segment;
    if (size < cfg_.min_large_alloc) return cfg_.large_segment;
    return (size + cfg_.round_large - 1) / cfg_.round_large * cfg_.round_large;
  }

  /// Turns the event log on or off (entries already logged stay).
  void set_event_logging(bool on) {
    std::lock_guard lock(mu_);
    logging_ = on;
  }
  /// A copy of the event log, oldest first.
  std::vector<alloc_event> events() const {
    std::lock_guard lock(mu_);
    return log_;
  }
  /// Entries not logged because the log held max_log_events already.
  std::size_t dropped_events() const {
    std::lock_guard lock(mu_);
    return dropped_;
  }
  void clear_event_log() {
    std::lock_guard lock(mu_);
    log_.clear();
    dropped_ = 0;
  }

  /// Writes {"device", "stats", "dropped", "events": [{"t_ns", "kind",
  /// "addr", "bytes", "stream", "allocated", "reserved"}, ...]} to `os`, one
  /// event per line, for a plotting script (addresses as integers).
  void write_json(std::ostream& os) const {
    std::lock_guard lock(mu_);
    const memory_stats s = base_stats();
    os << "{\"device\": \"" << sys_.name() << "\",\n \"stats\": {\"allocated\": " << s.allocated
       << ", \"reserved\": " << s.reserved << ", \"peak_allocated\": " << s.peak_allocated
       << ", \"peak_reserved\": " << s.peak_reserved << ", \"num_allocs\": " << s.num_allocs
       << "},\n \"dropped\": " << dropped_ << ",\n \"events\": [";
    for (std::size_t i = 0; i < log_.size(); ++i) {
      const alloc_event& e = log_[i];
      os << (i ? ",\n  " : "\n  ") << "{\"t_ns\": " << e.t_ns << ", \"kind\": \""
         << alloc_event_name(e.kind) << "\", \"addr\": " << e.addr << ", \"bytes\": " << e.bytes
         << ", \"stream\": " << e.stream << ", \"allocated\": " << e.allocated
         << ", \"reserved\": " << e.reserved << "}";
    }
    os << "\n ]}\n";
  }

  const caching_allocator_config& config() const { return cfg_; }
  System& system() { return sys_; }

 private:
  struct block {
    char* ptr = nullptr;
    std::size_t size = 0;          // bytes of this block
    std::size_t requested = 0;     // bytes asked for while allocated
    std::size_t segment_size = 0;  // set on a segment's first block
    stream_id stream = 0;
    bool small = false;
    bool allocated = false;  // handed out, or freed but waiting on events
    int pending_events = 0;
    block* prev = nullptr;  // neighbours in the segment, by address
    block* next = nullptr;
    std::vector<stream_id> used_on;  // other streams (record_stream)
  };
  struct block_less {
    bool operator()(const block* a, const block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->ptr < b->ptr;
    }
  };
  using pool = std::set<block*, block_less>;
  struct pending_free {
    typename System::event_type event;
    block* b;
  };

  memory_stats base_stats() const {
    memory_stats s;
    s.allocated = allocated_;
    s.reserved = reserved_;
    s.peak_allocated = peak_allocated_;
    s.peak_reserved = peak_reserved_;
    s.num_allocs = num_allocs_;
    return s;
  }

  pool& pool_of(const block* b) { return b->small ? small_pool_ : large_pool_; }

  block* find_free(pool& p, std::size_t size, stream_id stream) {
    block key;
    key.stream = stream;
    key.size = size;
    auto it = p.lower_bound(&key);
    if (it == p.end() || (*it)->stream != stream) return nullptr;
    block* b = *it;
    p.erase(it);
    return b;
  }

  block* new_segment(std::size_t size, bool small, stream_id stream, std::size_t requested) {
    const std::size_t seg = segment_size(size);
    void* p = sys_.allocate(seg);
    if (!p) {
      ++oom_retries_;
      for (auto& pe : pending_) sys_.wait_event(pe.event);
      process_events();
      release_free_segments();
      p = sys_.allocate(seg);
    }
    TESSERA_THROW_IF(!p, out_of_memory, sys_.name(), ": out of memory allocating ", requested, " bytes (a ",
                     seg, "-byte segment); ", allocated_, " bytes allocated, ", reserved_,
                     " reserved, peak allocated ", peak_allocated_,
                     ". Reduce the micro-batch or enable activation checkpointing");
    block* b = new block;
    b->ptr = static_cast<char*>(p);
    b->size = seg;
    b->segment_size = seg;
    b->stream = stream;
    b->small = small;
    segments_.push_back(b);
    reserved_ += seg;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    ++system_allocs_;
    log(alloc_event_kind::segment_alloc, b->ptr, seg, stream);
    return b;
  }

  // Splits the tail of a (not pooled) block off into the pool if large enough.
  void split(block* b, std::size_t size) {
    const std::size_t rest = b->size - size;
    const bool do_split = b->small ? rest >= cfg_.min_block : rest > cfg_.small_size;
    if (!do_split) return;
    block* r = new block;
    r->ptr = b->ptr + size;
    r->size = rest;
    r->stream = b->stream;
    r->small = b->small;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    pool_of(r).insert(r);
  }

  // Marks a block free, merges it with free neighbours, and pools the result.
  void free_block(block* b) {
    b->allocated = false;
    pool& p = pool_of(b);
    if (block* prev = b->prev; prev && !prev->allocated) {
      p.erase(prev);
      prev->size += b->size;
      prev->next = b->next;
      if (b->next) b->next->prev = prev;
      delete b;
      b = prev;
    }
    if (block* next = b->next; next && !next->allocated) {
      p.erase(next);
      b->size += next->size;
      b->next = next->next;
      if (next->next) next->next->prev = b;
      delete next;
    }
    p.insert(b);
  }

  // Pools every block whose cross-stream events have all completed.
  void process_events() {
    for (std::size_t i = 0; i < pending_.size();) {
      if (!sys_.event_done(pending_[i].event)) {
        ++i;
        continue;
      }
      block* b = pending_[i].b;
      sys_.destroy_event(pending_[i].event);
      pending_[i] = pending_.back();
      pending_.pop_back();
      if (--b->pending_events == 0) {
        pending_bytes_ -= b->size;
        free_block(b);
      }
    }
  }

  // Returns each segment that is one free block to the system.
  void release_free_segments() {
    for (std::size_t i = 0; i < segments_.size();) {
      block* seg = segments_[i];
      if (seg->allocated || seg->next) {
        ++i;
        continue;
      }
      pool_of(seg).erase(seg);
      sys_.deallocate(seg->ptr, seg->segment_size);
      reserved_ -= seg->segment_size;
      ++system_frees_;
      log(alloc_event_kind::segment_free, seg->ptr, seg->segment_size, seg->stream);
      delete seg;
      segments_[i] = segments_.back();
      segments_.pop_back();
    }
  }

  void log(alloc_event_kind k, const char* p, std::size_t bytes, stream_id s) {
    if (!logging_) return;
    if (log_.size() >= cfg_.max_log_events) {
      ++dropped_;
      return;
    }
    const auto t = std::chrono::steady_clock::now() - t0_;
    log_.push_back({k,
                    static_cast<std::uint64_t>(
                        std::chrono::duration_cast<std::chrono::nanoseconds>(t).count()),
                    reinterpret_cast<std::uintptr_t>(p), bytes, s, allocated_, reserved_});
  }

  mutable std::mutex mu_;
  System sys_;
  caching_allocator_config cfg_;
  std::chrono::steady_clock::time_point t0_;
  pool small_pool_, large_pool_;
  std::unordered_map<char*, block*> active_;
  std::vector<block*> segments_;  // first block of each segment
  std::vector<pending_free> pending_;
  stream_id current_stream_ = 0;
  std::size_t allocated_ = 0, reserved_ = 0, peak_allocated_ = 0, peak_reserved_ = 0;
  std::size_t num_allocs_ = 0, active_bytes_ = 0, pending_bytes_ = 0;
  std::size_t system_allocs_ = 0, system_frees_ = 0, oom_retries_ = 0, bad_frees_ = 0,
              event_failures_ = 0;
  bool logging_ = false;
  std::vector<alloc_event> log_;
  std::size_t dropped_ = 0;
};

namespace detail {
/// The system below a host caching allocator: page-aligned memory from
/// aligned_alloc, and no events (host kernels are synchronous, so a freed
/// block is reusable at once; record_stream is never needed on the host).
struct host_system {
  using event_type = int;
  /// Blocks start a multiple of min_block (512 B) from a page-aligned segment.
  static constexpr std::size_t base_alignment = 512;
  void* allocate(std::size_t n) {
    const std::size_t page = 4096;
    return std::aligned_alloc(page, (n + page - 1) / page * page);
  }
  void deallocate(void* p, std::size_t) { std::free(p); }
  int record_event(stream_id) { return 0; }
  bool event_done(int) const { return true; }
  void wait_event(int) {}
  void destroy_event(int) {}
  std::string name() const { return "host"; }
};
}  // namespace detail

/// A caching host memory resource: host memory that is reused, not returned.
/// The rules of caching_allocator (PyTorch's CUDACachingAllocator) over
/// page-aligned host segments: a freed block goes back to its pool and
/// serves the next request that fits, so a training step that allocates
/// and frees the same activations every step makes no system allocation
/// and touches no new page after the first step (glibc would hand large
/// blocks back to the kernel at each free, and every reuse would fault the
/// pages in again). Statistics as the CUDA allocator's: allocated (as
/// requested), reserved (segments held), peaks; detailed_stats() counts
/// system_allocs, the figure a steady-state test holds at zero.
/// empty_cache() returns the free segments. Thread-safe. Alignment up to
/// 512 B (config_error above).
class host_caching_resource final : public caching_allocator<detail::host_system> {
 public:
  /// An empty cache; nothing is allocated until the first request.
  explicit host_caching_resource(caching_allocator_config cfg = {})
      : caching_allocator(detail::host_system{}, cfg) {}
};
static_assert(system_allocator<detail::host_system>);

}  // namespace tessera
