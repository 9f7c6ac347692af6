#pragma once
// The CUDA block emulator: runs a kernel body of include/tessera/kernels/cuda
// (written over the primitive interface of kernels/cuda/block.hpp, or the
// warp primitives of the attention kernels) on the CPU, one block at a time,
// its threads as fibers (ucontext) on the calling thread.
//
// A fiber runs until it reaches a barrier or a warp collective; the fibers
// are resumed in a fresh random order each round, so lanes of a warp meet at
// each collective as on a GPU and a missing barrier shows as a read of
// another thread's value before it was written. It checks what the hardware
// would fault on or silently get wrong:
// - a global access outside every registered buffer, misaligned for its
//   width, or a write to a buffer registered as an input;
// - lanes of a warp at different collectives; a barrier some threads never
//   reach (deadlock); a reduction's result read outside thread 0 (the other
//   threads get NaN, as CUB leaves them undefined);
// - shared memory read before it is written (it starts as NaN: 0xFF bytes);
//   cp.async data read before its cp.async.wait_group (copies land only at
//   the wait); bank conflicts of ldmatrix (counted);
// - a launch configuration outside the hardware's limits or inconsistent
//   with the body (block size, shared-memory bound).
//
// The block reduction adds in the order of CUB's default BlockReduce
// (BLOCK_REDUCE_WARP_REDUCTIONS, read from the CUDA 13 CCCL headers): in each
// warp a shuffle-down tree, lane l adding lane l + 1, 2, 4, 8, 16 to its own;
// then thread 0 adds the warps' sums in warp order. Blocks of a grid run one
// after another in a random order, so races between blocks do not show.
//
// What this cannot show: the speed, the PTX instructions' semantics beyond
// the PTX ISA's description (mma and ldmatrix layouts are encoded in
// kernels/cuda/attention_launch.hpp), races between fibers that meet at no
// barrier, and the compiler's own bugs. A lent GPU runs the same bodies
// (benchmarks/device_check.sh).
#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <tessera/core/numeric.hpp>
#include <tessera/kernels/cuda/attention.cuh>
#include <tessera/kernels/cuda/attention_launch.hpp>
#include <tessera/kernels/cuda/block.hpp>
#include <tessera/kernels/cuda/launch.hpp>

namespace tessera::testing {

/// One emulated block at a time: fibers, warps, barriers, shared memory and
/// the registered global buffers. Not thread-safe; one per test.
class cuda_emulator {
 public:
  enum op { op_shfl = 1, op_ldsm, op_ldsm_t, op_mma, op_syncwarp };

  struct copy {
    std::uint32_t dst;
    const std::uint16_t* src;  // null: zero-fill
    int group;
  };
  struct fiber {
    ucontext_t ctx{};
    std::unique_ptr<char[]> stack;
    bool done = false;
    const std::uint64_t* wait_gen = nullptr;  // blocked until *wait_gen != wait_value
    std::uint64_t wait_value = 0;
    std::vector<copy> pending;
    int committed = 0;
  };
  struct warp {
    int arrived = 0;
    int op = 0;
    std::uint64_t gen = 0;
    std::uint32_t u[32][6];
    float f[32];
  };
  struct region {
    const char* begin;
    std::size_t bytes;
    bool writable;
  };

  static constexpr std::size_t stack_bytes = 256 * 1024;

  explicit cuda_emulator(std::uint64_t seed = 12345) : rng(seed) {}
  cuda_emulator(const cuda_emulator&) = delete;
  cuda_emulator& operator=(const cuda_emulator&) = delete;

  /// Registers [p, p + bytes) as global memory a kernel may read (and write
  /// when `writable`). Accesses outside every registered buffer fail.
  void add_region(const void* p, std::size_t bytes, bool writable) {
    regions.push_back({static_cast<const char*>(p), bytes, writable});
  }
  /// Registers a vector as an input (read-only) or an output buffer.
  template <class T>
  void input(const std::vector<T>& v) {
    add_region(v.data(), v.size() * sizeof(T), false);
  }
  template <class T>
  void output(std::vector<T>& v) {
    add_region(v.data(), v.size() * sizeof(T), true);
  }
  /// Registers the n elements at p (a view into a larger buffer: a kernel
  /// touching one element past it fails).
  template <class T>
  void buffer(const T* p, std::int64_t n, bool writable) {
    add_region(p, static_cast<std::size_t>(n) * sizeof(T), writable);
  }
  void clear_regions() { regions.clear(); }
  /// Forgets the buffer registered last.
  void pop_region() { regions.pop_back(); }

  /// The emulator running now (set for the duration of run_block).
  static cuda_emulator*& current() {
    static cuda_emulator* e = nullptr;
    return e;
  }

  /// Records the first error and unwinds the calling fiber.
  [[noreturn]] void fail(const std::string& what) {
    if (error.empty()) error = what;
    throw std::runtime_error(what);
  }
  void check_global(const void* p, std::size_t bytes, bool write, const char* what) {
    const char* c = static_cast<const char*>(p);
    for (const auto& r : regions)
      if (c >= r.begin && c + bytes <= r.begin + r.bytes) {
        if (write && !r.writable) fail(std::string(what) + ": write to an input buffer");
        if (reinterpret_cast<std::uintptr_t>(c) % bytes != 0)
          fail(std::string(what) + ": misaligned global access of " + std::to_string(bytes) +
               " bytes");
        return;
      }
    fail(std::string(what) + ": global access of " + std::to_string(bytes) +
         " bytes outside every buffer");
  }
  unsigned char* shared(std::uint32_t a, std::size_t bytes, const char* what) {
    if (a % bytes != 0 || a + bytes > smem_bytes)
      fail(std::string(what) + ": shared address " + std::to_string(a) + " misaligned or past " +
           std::to_string(smem_bytes));
    return smem + a;
  }

  /// Blocks the current fiber until *gen changes.
  void wait_on(const std::uint64_t* gen) {
    fiber& f = fibers[static_cast<std::size_t>(cur)];
    f.wait_gen = gen;
    f.wait_value = *gen;
    swapcontext(&f.ctx, &sched);
  }
  void warp_barrier(int o) {
    warp& w = warps[static_cast<std::size_t>(cur / 32)];
    if (w.arrived == 0)
      w.op = o;
    else if (w.op != o)
      fail("lanes of warp " + std::to_string(cur / 32) + " at different collectives (" +
           std::to_string(w.op) + " and " + std::to_string(o) + ")");
    if (++w.arrived == 32) {
      w.arrived = 0;
      ++w.gen;
    } else {
      wait_on(&w.gen);
    }
  }
  /// __syncthreads.
  void block_barrier() { block_barrier_or(false); }
  /// __syncthreads_or: a barrier whose result is the OR of every thread's `p`.
  /// The result of a round is kept until the next round completes, which
  /// needs every thread again, so each reads its own round's.
  bool block_barrier_or(bool p) {
    bar_or = bar_or || p;
    if (++bar_arrived == threads) {
      bar_arrived = 0;
      released_or = bar_or;
      bar_or = false;
      ++bar_gen;
    } else {
      wait_on(&bar_gen);
    }
    return released_or;
  }

  /// Runs body(tid) for tid in [0, n_threads) as one block with
  /// `shared_bytes` of shared memory (NaN-filled, 128-byte aligned, at
  /// shared_base()); returns the first error ("" if none).
  std::string run_block(int n_threads, std::size_t shared_bytes,
                        const std::function<void(int)>& b) {
    if (n_threads < 1 || n_threads > kernels::cuda::launch_limits::max_block)
      return "block of " + std::to_string(n_threads) + " threads: need 1 to 1024";
    current() = this;
    body = b;
    threads = n_threads;
    smem_bytes = shared_bytes;
    smem_buf.assign(shared_bytes + 128, 0xFF);  // NaN in bf16, fp16, float and double
    smem = smem_buf.data() + (128 - reinterpret_cast<std::uintptr_t>(smem_buf.data()) % 128) % 128;
    bar_arrived = 0;
    bar_or = false;
    if (fibers.size() < static_cast<std::size_t>(threads)) fibers.resize(threads);
    warps.assign(static_cast<std::size_t>((threads + 31) / 32),
                 warp{});  // a partial warp's collectives deadlock
    for (int t = 0; t < threads; ++t) {
      fiber& f = fibers[static_cast<std::size_t>(t)];
      if (!f.stack) f.stack.reset(new char[stack_bytes]);
      f.done = false;
      f.wait_gen = nullptr;
      f.pending.clear();
      f.committed = 0;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.get();
      f.ctx.uc_stack.ss_size = stack_bytes;
      f.ctx.uc_link = &sched;
      makecontext(&f.ctx, &cuda_emulator::entry, 0);
    }
    std::vector<int> order(static_cast<std::size_t>(threads));
    for (int t = 0; t < threads; ++t) order[static_cast<std::size_t>(t)] = t;
    while (error.empty()) {
      std::shuffle(order.begin(), order.end(), rng);  // vary the interleaving
      bool any = false, ran = false;
      for (int t : order) {
        fiber& f = fibers[static_cast<std::size_t>(t)];
        if (f.done) continue;
        any = true;
        if (f.wait_gen && *f.wait_gen == f.wait_value) continue;  // still blocked
        f.wait_gen = nullptr;
        cur = t;
        ran = true;
        swapcontext(&sched, &f.ctx);
        if (!error.empty()) break;
      }
      if (!any) break;
      if (!ran && error.empty()) error = "deadlock: every live thread waits at a barrier";
    }
    std::string e = error;
    error.clear();
    return e;
  }

  /// The emulated shared memory of the running block.
  unsigned char* shared_base() { return smem; }
  std::size_t shared_size() const { return smem_bytes; }

  int threads = 0;
  int cur = 0;
  std::vector<warp> warps;
  std::vector<fiber> fibers;
  std::uint64_t ldsm_phases = 0, bank_conflicts = 0, leftover_copies = 0;
  std::uint64_t blocks_run = 0;
  std::mt19937_64 rng;

 private:
  static void entry() {
    cuda_emulator& e = *current();
    const int tid = e.cur;
    try {
      e.body(tid);
    } catch (const std::exception& ex) {
      if (e.error.empty()) e.error = ex.what();
    }
    fiber& f = e.fibers[static_cast<std::size_t>(tid)];
    e.leftover_copies += f.pending.size();
    f.done = true;
  }

  int bar_arrived = 0;
  std::uint64_t bar_gen = 0;
  bool bar_or = false, released_or = false;
  ucontext_t sched{};
  std::vector<unsigned char> smem_buf;
  unsigned char* smem = nullptr;
  std::size_t smem_bytes = 0;
  std::vector<region> regions;
  std::function<void(int)> body;
  std::string error;
};

/// A value with every byte 0xFF: NaN for floating types (and structs of
/// them), -1 for signed integers. What a thread other than 0 gets from a
/// block reduction.
template <class T>
T nan_bytes() {
  static_assert(std::is_trivially_copyable_v<T>);
  T v;
  std::memset(static_cast<void*>(&v), 0xFF, sizeof(T));
  return v;
}

/// The primitive interface of kernels/cuda/block.hpp, and the warp
/// primitives of the attention kernels (attention_device_ops) that do not
/// depend on the storage type, on the emulator; emulator_attention_ops<T>
/// (below) adds the mma and the rounding of T.
struct emulator_ops {
  static cuda_emulator& e() { return *cuda_emulator::current(); }
  static int lane() { return e().cur % 32; }
  static cuda_emulator::warp& w() { return e().warps[static_cast<std::size_t>(e().cur / 32)]; }

  // ---- block.hpp: global memory, barriers, atomics, CUB ----
  template <class T>
  static T ld(const T* p) {
    e().check_global(p, sizeof(T), false, "ld.global");
    return *p;
  }
  template <class T>
  static void st(T* p, T v) {
    e().check_global(p, sizeof(T), true, "st.global");
    *p = v;
  }
  template <int N, class T>
  static kernels::cuda::detail::pack<T, N> ld_pack(const T* p) {
    e().check_global(p, sizeof(T) * N, false, "ld.global (vector)");
    kernels::cuda::detail::pack<T, N> r;
    std::memcpy(static_cast<void*>(&r), p, sizeof(r));
    return r;
  }
  template <int N, class T>
  static void st_pack(T* p, const kernels::cuda::detail::pack<T, N>& x) {
    e().check_global(p, sizeof(T) * N, true, "st.global (vector)");
    std::memcpy(static_cast<void*>(p), &x, sizeof(x));
  }
  static void sync() { e().block_barrier(); }
  static bool sync_or(bool p) { return e().block_barrier_or(p); }
  static void atomic_or(std::int32_t* p, std::int32_t v) {
    e().check_global(p, sizeof(std::int32_t), true, "atomicOr");
    *p |= v;  // fibers run one at a time: atomic by construction
  }

  template <class T, int Threads>
  struct block_reduce {
    static_assert(Threads % 32 == 0, "whole warps");
    /// Lives in the emulated shared memory (NaN until written).
    struct storage {
      T v[Threads];
    };
    struct plus {
      T operator()(const T& a, const T& b) const { return a + b; }
    };
    static T sum(storage& s, T v) { return reduce(s, v, plus{}); }
    template <class Op>
    static T reduce(storage& s, T v, Op op) {
      cuda_emulator& em = e();
      if (em.threads != Threads)
        em.fail("block_reduce of " + std::to_string(Threads) + " threads in a block of " +
                std::to_string(em.threads));
      const int t = em.cur;
      s.v[t] = v;
      em.block_barrier();  // CUB synchronises once, between the warps' sums and thread 0
      if (t != 0) return nan_bytes<T>();
      T total{};
      for (int w = 0; w < Threads / 32; ++w) {
        T lanes[32];
        for (int l = 0; l < 32; ++l) lanes[l] = s.v[32 * w + l];
        for (int off = 1; off < 32; off *= 2)  // shuffle-down tree, ascending lanes read ahead
          for (int l = 0; l + off < 32; ++l) lanes[l] = op(lanes[l], lanes[l + off]);
        total = w == 0 ? lanes[0] : op(total, lanes[0]);
      }
      return total;
    }
  };

  template <int Threads, int Items>
  struct block_scan {
    struct storage {
      int v[Threads * Items];
    };
    static void exclusive_sum(storage& s, int (&in)[Items], int (&out)[Items], int& total) {
      cuda_emulator& em = e();
      if (em.threads != Threads)
        em.fail("block_scan of " + std::to_string(Threads) + " threads in a block of " +
                std::to_string(em.threads));
      const int t = em.cur;
      for (int k = 0; k < Items; ++k) s.v[t * Items + k] = in[k];
      em.block_barrier();
      int run = 0, mine = 0;
      for (int i = 0; i < Threads * Items; ++i) {
        if (i == t * Items) mine = run;
        run += s.v[i];
      }
      for (int k = 0; k < Items; ++k) {
        out[k] = mine;
        mine += in[k];
      }
      total = run;
      em.block_barrier();  // CUB's scan storage may be reused after a barrier only
    }
  };

  // ---- the attention kernels' warp primitives (attention_device_ops) ----
  static std::uint32_t smem_addr(const void* p) {
    const auto* c = static_cast<const unsigned char*>(p);
    if (c < e().shared_base() || c > e().shared_base() + e().shared_size())
      e().fail("smem_addr: not shared memory");
    return static_cast<std::uint32_t>(c - e().shared_base());
  }
  static std::uint32_t opaque(std::uint32_t x) { return x; }
  static void ldsm(std::uint32_t (&r)[4], std::uint32_t a, bool trans) {
    namespace mm = kernels::cuda::mma_m16n8k16;
    e().shared(a, 16, "ldmatrix");
    const int l = lane();
    w().u[l][0] = a;
    e().warp_barrier(trans ? cuda_emulator::op_ldsm_t : cuda_emulator::op_ldsm);
    for (int j = 0; j < 4; ++j) {
      r[j] = 0;
      for (int h = 0; h < 2; ++h) {
        const auto c = mm::ldmatrix_coord(l, h, trans);
        std::uint16_t x;
        std::memcpy(&x, e().shared_base() + w().u[8 * j + c.row][0] + 2 * c.col, 2);
        r[j] |= std::uint32_t(x) << (16 * h);
      }
    }
    if (l == 0)
      for (int j = 0; j < 4; ++j) {
        std::set<std::uint32_t> groups;
        for (int i = 0; i < 8; ++i) groups.insert((w().u[8 * j + i][0] / 16) % 8);
        ++e().ldsm_phases;
        if (groups.size() != 8) ++e().bank_conflicts;
      }
    e().warp_barrier(cuda_emulator::op_syncwarp);
  }
  static void ldsm_x4(std::uint32_t (&r)[4], std::uint32_t a) { ldsm(r, a, false); }
  static void ldsm_x4_trans(std::uint32_t (&r)[4], std::uint32_t a) { ldsm(r, a, true); }
  /// d += a b (16 x 16 T times 16 x 8 T, T bf16 or fp16), each element's
  /// products summed in float64 and rounded once. Both operand types are
  /// exact in float, and so is each product (8 + 8 or 11 + 11 significant
  /// bits), as on the tensor cores; only the accumulation order differs
  /// from the hardware's, which adds in float32 in an unspecified order.
  template <class T>
  static void mma_of(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                     std::uint32_t b1) {
    const auto wide = [](std::uint32_t bits) {
      return static_cast<float>(T::from_bits(static_cast<std::uint16_t>(bits & 0xffffu)));
    };
    namespace mm = kernels::cuda::mma_m16n8k16;
    const int l = lane();
    for (int i = 0; i < 4; ++i) w().u[l][i] = a[i];
    w().u[l][4] = b0;
    w().u[l][5] = b1;
    e().warp_barrier(cuda_emulator::op_mma);
    float A[16][16], Bm[16][8];
    for (int x = 0; x < 32; ++x) {
      for (int i = 0; i < 8; ++i) {
        const auto c = mm::a_coord(x, i);
        A[c.row][c.col] = wide(w().u[x][i / 2] >> (16 * (i % 2)));
      }
      for (int i = 0; i < 4; ++i) {
        const auto c = mm::b_coord(x, i);
        Bm[c.row][c.col] = wide(w().u[x][4 + i / 2] >> (16 * (i % 2)));
      }
    }
    for (int i = 0; i < 4; ++i) {
      const auto c = mm::c_coord(l, i);
      double s = d[i];
      for (int k = 0; k < 16; ++k) s += double(A[c.row][k]) * Bm[k][c.col];
      d[i] = static_cast<float>(s);
    }
    e().warp_barrier(cuda_emulator::op_syncwarp);
  }
  static float shfl_xor(float v, int mask) {
    const int l = lane();
    w().f[l] = v;
    e().warp_barrier(cuda_emulator::op_shfl);
    const float r = w().f[l ^ mask];
    e().warp_barrier(cuda_emulator::op_syncwarp);
    return r;
  }
  static void cp_async16(std::uint32_t dst, const std::uint16_t* src, bool valid) {
    e().shared(dst, 16, "cp.async dst");
    if (valid) e().check_global(src, 16, false, "cp.async src");
    auto& f = e().fibers[static_cast<std::size_t>(e().cur)];
    f.pending.push_back({dst, valid ? src : nullptr, f.committed});
  }
  static void cp_commit() { ++e().fibers[static_cast<std::size_t>(e().cur)].committed; }
  template <int N>
  static void cp_wait() {
    auto& f = e().fibers[static_cast<std::size_t>(e().cur)];
    std::vector<cuda_emulator::copy> keep;
    for (const auto& c : f.pending) {
      if (c.group >= f.committed) e().fail("cp.async.wait_group with uncommitted copies");
      if (c.group < f.committed - N) {
        if (c.src)
          std::memcpy(e().shared_base() + c.dst, c.src, 16);
        else
          std::memset(e().shared_base() + c.dst, 0, 16);
      } else {
        keep.push_back(c);
      }
    }
    f.pending = keep;
  }
  static void sync_warp() { e().warp_barrier(cuda_emulator::op_syncwarp); }
  /// Two floats rounded to T (nearest even, as cvt.rn.{bf16,f16}x2.f32),
  /// `lo` in the low half.
  template <class T>
  static std::uint32_t pack_of(float lo, float hi) {
    return std::uint32_t(T(lo).bits) | (std::uint32_t(T(hi).bits) << 16);
  }
  static void st_shared32(std::uint16_t* p, std::uint32_t v) {
    std::memcpy(e().shared(smem_addr(p), 4, "st.shared"), &v, 4);
  }
  static kernels::cuda::detail::attention_vec16 ld_shared16(const std::uint16_t* p) {
    kernels::cuda::detail::attention_vec16 v;
    std::memcpy(&v, e().shared(smem_addr(p), 16, "ld.shared"), 16);
    return v;
  }
  static kernels::cuda::detail::attention_vec16 ld_global16(const std::uint16_t* p) {
    e().check_global(p, 16, false, "ld.global");
    kernels::cuda::detail::attention_vec16 v;
    std::memcpy(&v, p, 16);
    return v;
  }
  static void st_global16(std::uint16_t* p, const kernels::cuda::detail::attention_vec16& v) {
    e().check_global(p, 16, true, "st.global");
    std::memcpy(p, &v, 16);
  }
  static float ld_global_f32(const float* p) {
    e().check_global(p, 4, false, "ld.global.f32");
    return *p;
  }
  /// A float the kernel also writes (attention_device_ops::ld_global_acc).
  static float ld_global_acc(const float* p) {
    e().check_global(p, 4, false, "ld.global.f32 (accumulator)");
    return *p;
  }
  static void st_global_f32(float* p, float v) {
    e().check_global(p, 4, true, "st.global.f32");
    *p = v;
  }
};

/// The attention kernels' Ops on the emulator for the storage type T (bf16
/// or fp16), as attention_device_ops<T>: T's mma and rounding.
template <class T>
struct emulator_attention_ops : emulator_ops {
  static_assert(is_half_v<T>, "flash attention: the storage type is bf16 or fp16");
  using storage = T;
  static void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
    mma_of<T>(d, a, b0, b1);
  }
  static std::uint32_t pack(float lo, float hi) { return pack_of<T>(lo, hi); }
};

/// The launcher of kernels/cuda/block.hpp on the emulator: runs every block
/// of the grid (in a random order) and throws std::runtime_error naming the
/// kernel and the block at the first error. Checks the configuration first:
/// within the hardware limits (launch_config::valid), the body's block size,
/// and the configuration's shared memory equal to the body's bound plus the
/// dynamic part.
struct emulator_launcher {
  cuda_emulator* em;
  /// Most threads (blocks x block size) one launch may emulate.
  std::int64_t max_threads = std::int64_t(1) << 24;
  /// Launches seen, by kernel name (the tests check every kernel ran).
  std::vector<std::string>* launched = nullptr;

  template <class Body, class... A>
  void run(const kernels::cuda::launch_config& c, A... a) const {
    using storage = typename Body::template shared_storage<emulator_ops>;
    static_assert(std::is_trivially_destructible_v<storage>);
    const std::string name = Body::name;
    if (launched) launched->push_back(name);
    if (!c.valid()) throw std::runtime_error(name + ": launch configuration outside the limits");
    if (c.block != Body::threads)
      throw std::runtime_error(name + ": launch of " + std::to_string(c.block) +
                               " threads, the kernel is built for " +
                               std::to_string(Body::threads));
    if (c.smem != Body::smem_bound + c.dynamic_smem)
      throw std::runtime_error(name + ": launch_config.smem " + std::to_string(c.smem) +
                               " is not the body's bound " + std::to_string(Body::smem_bound) +
                               " plus the dynamic " + std::to_string(c.dynamic_smem));
    if (c.grid_x * c.grid_y * c.block > max_threads)
      throw std::runtime_error(name + ": grid too large to emulate");
    std::vector<std::pair<std::int64_t, std::int64_t>> blocks;
    for (std::int64_t y = 0; y < c.grid_y; ++y)
      for (std::int64_t x = 0; x < c.grid_x; ++x) blocks.emplace_back(x, y);
    std::shuffle(blocks.begin(), blocks.end(), em->rng);
    for (const auto& xy : blocks) {
      const std::int64_t x = xy.first,
                         y = xy.second;  // not a structured binding: clang 14 cannot capture one
      const std::string err =
          em->run_block(c.block, sizeof(storage) + c.dynamic_smem, [&](int tid) {
            auto* sm = std::launder(reinterpret_cast<storage*>(em->shared_base()));
            const kernels::cuda::block_index b{x, y, c.grid_x, c.grid_y, tid, Body::threads};
            Body::template run<emulator_ops>(b, *sm, a...);
          });
      ++em->blocks_run;
      if (!err.empty())
        throw std::runtime_error(name + " block (" + std::to_string(x) + ", " + std::to_string(y) +
                                 "): " + err);
    }
  }
};

}  // namespace tessera::testing
