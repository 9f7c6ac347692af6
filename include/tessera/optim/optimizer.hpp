#pragma once
/// \file optim/optimizer.hpp
/// Optimizers as policies (DESIGN.md, "Key types"): a policy is a small tag
/// struct naming its hyper-parameters (`config`) and the optimizer it
/// builds for a parameter, gradient and master type on an execution
/// context (`state<Param, Grad, Master, Ctx>`), so a trainer swaps
/// optimizers by one template argument: `optim::adamw`, `optim::sgd`.
///
/// Every optimizer updates n elements through the context's kernels
/// (kernels/optimizer.hpp): one multi-tensor pass over a segment table whose
/// ranges say where each element's parameter and gradient are, master
/// weights when Param is narrower than Master, its state allocated when it
/// is built (so the memory floor is visible before step 0), and the clip
/// coefficient read from the context's memory (no host synchronisation on a
/// GPU; a non-finite one skips the step inside the kernel). What they share
/// is flat_optimizer (the state) and fused_optimizer (the constructors and
/// the step forms), their bases: a new rule writes only its kernel call.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/adamw.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/nn/param_layout.hpp"

namespace tessera::optim {

/// The flat-buffer ranges with their weight-decay flag (nn::param_range).
using param_range = nn::param_range;

/// What a trainer needs of an optimizer instance O over Param/Grad/Master.
template <class O, class Param, class Grad, class Master>
concept optimizer_state = requires(O& o, const O& co, Param* p, const Param* cp, const Grad* g,
                                   const Master* scale, double lr) {
  o.init_master(cp);
  o.step(p, g, lr, scale);
  o.skipped();
  { co.steps_taken() } -> std::convertible_to<std::int64_t>;
  { co.state_bytes() } -> std::convertible_to<std::size_t>;
  { co.serialized_bytes() } -> std::convertible_to<std::size_t>;
};

/// An optimizer policy: `name` (checkpoints and logs), `config` (its
/// hyper-parameters, with validate()), and `state<Param, Grad, Master,
/// Ctx>`, the optimizer over a flat buffer on context Ctx.
template <class O>
concept optimizer_policy = requires {
  { O::name } -> std::convertible_to<const char*>;
  typename O::config;
  typename O::template state<float, float, float, kernels::host_context>;
}
&&optimizer_state<typename O::template state<float, float, float, kernels::host_context>, float,
                  float, float>;

/// Names what a would-be optimizer policy lacks, in words; use as
/// static_assert(check_optimizer_policy<O>()).
template <class O>
consteval bool check_optimizer_policy() {
  static_assert(
      requires {
        O::name;
        typename O::config;
      },
      "not a tessera optimizer policy: needs static constexpr const char* name and a nested "
      "`config` of hyper-parameters (use tessera::optim::adamw or tessera::optim::sgd)");
  static_assert(optimizer_policy<O>,
                "not a tessera optimizer policy: needs template <class Param, class Grad, class "
                "Master, class Ctx> using state = ...; an optimizer with init_master, step(params, "
                "grads, lr, const Master* clip), skipped(), steps_taken(), state_bytes(), "
                "serialized_bytes()");
  return true;
}

/// A range of an optimizer's elements, [begin, end) of its state (master
/// weights, moments), with its weight-decay flag and where its parameters
/// and gradients are: element i's at params[i + param_shift] and
/// grads[i + grad_shift] (kernels::optimizer_segment). Shifts are 0 where
/// the state, the parameters and the gradients share one layout (a whole
/// model's flat buffer on one rank). `dims`, `rows` and `cols` are the
/// shape of the tensor the range is of (nn::param_range's), which
/// optimizers with per-tensor state read (optim::adafactor).
struct owned_range {
  std::int64_t begin = 0, end = 0;
  bool decay = true;
  std::int64_t param_shift = 0, grad_shift = 0;
  int dims = 0;
  std::int64_t rows = 0, cols = 0;
  /// nn::param_range's: a transformer block's weight matrix, and the whole
  /// tensor a tensor-parallel shard is of (optim::muon and
  /// optim::adafactor read them).
  bool hidden = false;
  int split = -1, shard = 0, replicas = 1, replica = 0;
  std::int64_t full_rows = 0, full_cols = 0;
  /// The range's first element within its tensor (nn::param_range::first).
  std::int64_t first = 0;
  /// Whether the range holds its whole tensor (false when the shape is not known).
  bool whole() const { return dims > 0 && end - begin == rows * cols; }
};

/// The owned ranges themselves (fused_optimizer takes either form).
inline const std::vector<owned_range>& owned(const std::vector<owned_range>& ranges) {
  return ranges;
}
/// The owned_range of param_range `r` as elements [begin, end) of the
/// optimizer's state, its parameters and gradients at the shifts given.
inline owned_range owned(const param_range& r, std::int64_t begin, std::int64_t end,
                         std::int64_t param_shift, std::int64_t grad_shift) {
  owned_range o{begin, end, r.decay, param_shift, grad_shift, r.dims, r.rows, r.cols};
  o.hidden = r.hidden;
  o.split = r.split;
  o.shard = r.shard;
  o.replicas = r.replicas;
  o.replica = r.replica;
  o.full_rows = r.full_rows;
  o.full_cols = r.full_cols;
  o.first = r.first;
  return o;
}
/// The owned_range of every param_range, shifts 0.
inline std::vector<owned_range> owned(const std::vector<param_range>& ranges) {
  std::vector<owned_range> out;
  for (const param_range& r : ranges) out.push_back(owned(r, r.begin, r.end, 0, 0));
  return out;
}

/// How an optimizer with state of whole matrices (optim::muon,
/// optim::adafactor) reaches the other ranks of a group (its
/// tensor-parallel group; its data-parallel group under ZeRO): `size`
/// ranks, and all_gather(in, out, n), which writes every rank's n values of
/// type T (`Master`: Muon's momentum; double: Adafactor's sums,
/// gather_value) at `in` into out[r n, (r + 1) n) in rank order (the
/// context's memory; collective over the group).
/// parallel::data_parallel fills it from the model's tp group and its own
/// dp communicator.
template <class Master>
struct group_gather {
  int size = 1;
  std::function<void(const Master*, Master*, std::int64_t)> all_gather;
};

/// One gradient bucket of a ZeRO stage as an optimizer over this rank's
/// shard sees it (parallel::bucket_plan): the bucket's flat elements start
/// at `flat_begin`; this rank owns flat elements [lo, hi), its state
/// elements [state_begin, state_begin + hi - lo); each rank's chunk is
/// `chunk` elements (rank r's at flat_begin + r chunk); `matrices`: the
/// bucket holds a matrix a whole-matrix optimizer updates (the same on every rank);
/// `split`: the bucket's tensors whose elements lie in more than one rank's
/// chunk, in flat order (flat ranges with their shapes, the same on every
/// rank; optim::adafactor sums their statistics over the ranks).
struct state_bucket {
  std::int64_t flat_begin = 0, lo = 0, hi = 0, state_begin = 0, chunk = 0;
  bool matrices = false;
  std::vector<nn::param_range> split{};
};

/// The element type optimizer `Opt`'s group gathers move: its
/// `gather_value` (optim::adafactor's float64 sums), else `Master`
/// (optim::muon's momentum).
template <class Opt, class Master>
struct gather_value {
  using type = Master;
};
template <class Opt, class Master>
requires requires {
  typename Opt::gather_value;
}
struct gather_value<Opt, Master> {
  using type = typename Opt::gather_value;
};

namespace detail {

/// Writes `bytes` at `src` (the context's memory) through w.write(const
/// void*, bytes), staged through host blocks of at most 64 MiB unless the
/// context's memory is host memory.
template <class Ctx, class Writer>
void write_from(const Ctx& ctx, Writer& w, const void* src, std::size_t bytes) {
  if constexpr (Ctx::host_accessible) {
    w.write(src, bytes);
  } else {
    std::vector<char> buf(std::min<std::size_t>(bytes, std::size_t(64) << 20));
    for (std::size_t off = 0; off < bytes; off += buf.size()) {
      const std::size_t len = std::min(buf.size(), bytes - off);
      ctx.to_host(buf.data(), static_cast<const char*>(src) + off, len);
      w.write(buf.data(), len);
    }
  }
}

}  // namespace detail

/// What every optimizer over n elements shares (adamw_optimizer,
/// sgd_optimizer derive from it): the `moments` state buffers of Master
/// (AdamW's two, SGD's one), the master weights when Param is narrower than
/// Master, the segment table of its owned ranges in the context's memory,
/// and the step count; all allocated zero when it is built, so the memory
/// floor is visible before step 0. The context is not owned and must
/// outlive it.
template <class Param, class Master, class Ctx>
class flat_optimizer {
 public:
  using Backend = typename Ctx::backend_type;
  static constexpr bool has_master = !std::is_same_v<Param, Master>;

  /// Elements [0, n) in `ranges` (sorted, disjoint; clipped to n), decay
  /// only where `decays`. Throws config_error for n < 0 or overlapping ranges.
  flat_optimizer(std::int64_t n, const std::vector<owned_range>& ranges, bool decays,
                 const Ctx& ctx, int moments)
      : n_(n), ctx_(&ctx) {
    TESSERA_THROW_IF(n < 0, config_error, "optimizer size n=", n, " must be >= 0");
    for (int k = 0; k < moments; ++k) {
      moments_.push_back(kernels::make_tensor<Master>(ctx, n));
      kernels::zero_elements(ctx, moments_.back().data(), n);
    }
    if constexpr (has_master) {
      master_ = kernels::make_tensor<Master>(ctx, n);
      kernels::zero_elements(ctx, master_.data(), n);
    }
    std::vector<kernels::optimizer_segment> segs;
    for (std::size_t i = 1; i < ranges.size(); ++i)
      TESSERA_THROW_IF(ranges[i].begin < ranges[i - 1].end, config_error,
                       "optimizer ranges must be sorted and disjoint: [", ranges[i].begin, ", ",
                       ranges[i].end, ") starts before the end ", ranges[i - 1].end,
                       " of the range before it");
    for (const owned_range& r : ranges) {
      const std::int64_t b = std::max<std::int64_t>(r.begin, 0), e = std::min(r.end, n);
      if (b < e) segs.push_back({b, e, r.decay && decays ? 1 : 0, r.param_shift, r.grad_shift});
    }
    host_segments_ = segs;
    segments_ = kernels::make_tensor<kernels::optimizer_segment>(
        ctx, static_cast<std::int64_t>(segs.size()));
    ctx.from_host(segments_.data(), segs.data(), segs.size() * sizeof(kernels::optimizer_segment));
  }
  flat_optimizer(const flat_optimizer&) = delete;
  flat_optimizer& operator=(const flat_optimizer&) = delete;

  /// Copies the parameters of every owned element (params[i + param_shift],
  /// the context's memory) into the master weights: once, after the model
  /// is initialised. Elements in no range stay 0.
  void init_master(const Param* params) {
    if constexpr (has_master)
      for (const auto& s : host_segments_)
        cast(*ctx_, master_.data() + s.begin, params + s.begin + s.param_shift, s.end - s.begin);
    master_ready_ = true;
  }
  /// Takes back the step count of a step the kernel skipped (non-finite clip
  /// coefficient), so the bias corrections stay those of the steps taken.
  void skipped() {
    TESSERA_THROW_IF(t_ == 0, error, "optimizer: skipped() without a step");
    --t_;
  }
  std::int64_t steps_taken() const { return t_; }
  /// n: the elements of the state.
  std::int64_t size() const { return n_; }
  /// The master weights (n, the context's memory; null without a copy).
  const Master* master() const { return has_master ? master_.data() : nullptr; }
  /// Bytes of state held (moments, master weights, the segment table).
  std::size_t state_bytes() const {
    std::size_t b = master_.bytes() + segments_.bytes();
    for (const auto& m : moments_) b += m.bytes();
    return b;
  }
  /// Writes the step count and every state buffer (raw little-endian bytes:
  /// t, each moment, then the master weights when kept; serialized_bytes()
  /// in all) through `w.write(const void*, bytes)`, staged through host memory.
  template <class Writer>
  void save(Writer& w) const {
    w.write(&t_, sizeof(t_));
    for (const auto& m : moments_) detail::write_from(*ctx_, w, m.data(), m.bytes());
    if constexpr (has_master) detail::write_from(*ctx_, w, master_.data(), master_.bytes());
  }
  /// Restores what save() wrote from host memory `p`, which holds
  /// serialized_bytes() bytes (the caller checks the size before calling).
  void load(const char* p) {
    std::memcpy(&t_, p, sizeof(t_));
    p += sizeof(t_);
    for (auto& m : moments_) {
      ctx_->from_host(m.data(), p, m.bytes());
      p += m.bytes();
    }
    if constexpr (has_master) ctx_->from_host(master_.data(), p, master_.bytes());
    master_ready_ = true;
  }
  /// After a checkpoint filled the state buffers in place (a layout-free
  /// checkpoint reads each rank's share of them): the step count `t`, and
  /// the master weights count as initialised.
  void restore_steps(std::int64_t t) {
    t_ = t;
    master_ready_ = true;
  }
  /// Bytes save() writes.
  std::size_t serialized_bytes() const {
    std::size_t b = sizeof(t_) + master_.bytes();
    for (const auto& m : moments_) b += m.bytes();
    return b;
  }

 protected:
  /// Counts a step (t + 1) and returns t. Throws tessera::error naming
  /// `who` when the master weights were never initialised (init_master or
  /// load), which would write zeros into the parameters.
  std::int64_t begin_step(const char* who) {
    TESSERA_THROW_IF(has_master && !master_ready_, error, who,
                     ": master weights not initialised; call init_master(params) first");
    return ++t_;
  }
  const Ctx& ctx() const { return *ctx_; }
  Master* moment(int k) { return moments_[static_cast<std::size_t>(k)].data(); }
  const Master* moment(int k) const { return moments_[static_cast<std::size_t>(k)].data(); }
  Master* master_data() { return has_master ? master_.data() : nullptr; }
  const kernels::optimizer_segment* segments() const { return segments_.data(); }
  int num_segments() const { return static_cast<int>(segments_.numel()); }

 private:
  std::int64_t n_;
  const Ctx* ctx_;
  std::vector<tensor<Master, Backend>> moments_;
  tensor<Master, Backend> master_;
  tensor<kernels::optimizer_segment, Backend> segments_;
  std::vector<kernels::optimizer_segment> host_segments_;
  std::int64_t t_ = 0;
  bool master_ready_ = !has_master;
};

/// An optimizer whose update is one fused pass over flat_optimizer's state
/// (adamw_optimizer, sgd_optimizer derive from it, CRTP; a new rule writes
/// only its kernel call). It gives every such optimizer the same surface:
/// constructors over owned_range or param_range (the config validated
/// first; decay only where weight_decay != 0), the two step forms, and the
/// skip of a non-finite host scale. `Derived` provides `name` and
/// `update(params, grads, lr, grad_scale, d_clip, t)`, the kernel call of
/// step t (1-based); `Config` has validate() and weight_decay; `Moments`
/// is the number of Master state buffers.
template <class Derived, class Config, int Moments, class Param, class Grad, class Master,
          class Ctx>
class fused_optimizer : public flat_optimizer<Param, Master, Ctx> {
  using base = flat_optimizer<Param, Master, Ctx>;

 public:
  using base::has_master;
  /// Bytes of optimizer state per parameter (the moments, plus master weights if kept).
  static constexpr std::size_t state_bytes_per_param =
      (Moments + (has_master ? 1 : 0)) * sizeof(Master);

  /// Builds the optimizer for elements [0, n), `ranges` (owned_range or
  /// param_range) giving each element's decay flag and where its parameter
  /// and gradient are (ranges beyond n are clipped). Allocates all state
  /// from the context now (zero). Throws config_error for bad
  /// hyper-parameters or n < 0.
  template <class Range>
  fused_optimizer(Config cfg, std::int64_t n, const std::vector<Range>& ranges, const Ctx& ctx)
      : base(n, owned(ranges), (cfg.validate(), cfg.weight_decay != 0.0), ctx, Moments),
        cfg_(cfg) {}
  /// A temporary context would dangle: the optimizer keeps a pointer to it.
  template <class Range>
  fused_optimizer(Config, std::int64_t, const std::vector<Range>&, const Ctx&&) = delete;

  /// One step: the gradients are scaled by `*d_clip` (the clip
  /// coefficient, one Master in the context's memory; a non-finite value
  /// writes nothing: call skipped() once the caller knows), the parameters
  /// updated in place, and with a master copy params = round(master).
  /// Throws tessera::error if the master weights were never initialised
  /// (init_master or load), which would write zeros into the parameters.
  void step(Param* params, const Grad* grads, double lr, const Master* d_clip) {
    launch(params, grads, lr, 1.0, d_clip);
  }
  /// One step with the gradient multiplier `grad_scale` given on the host; a
  /// non-finite one skips the step (nothing written, not counted).
  void step(Param* params, const Grad* grads, double lr, double grad_scale = 1.0) {
    launch(params, grads, lr, grad_scale, nullptr);
  }
  /// The hyper-parameters.
  const Config& config() const { return cfg_; }

  /// One state buffer: size() elements of Master in the context's memory,
  /// and its role in a checkpoint ("exp_avg", "master", ...).
  struct state_buffer {
    const char* role;
    Master* data;
  };
  /// The state buffers: the policy's moments, named by
  /// Derived::moment_roles (std::array of Moments names; "moment0", ...
  /// when the policy names none), then "master" when master weights are
  /// kept.
  std::vector<state_buffer> state_buffers() {
    static constexpr const char* unnamed[] = {"moment0", "moment1", "moment2", "moment3"};
    std::vector<state_buffer> v;
    for (int k = 0; k < Moments; ++k) {
      const char* role = nullptr;
      if constexpr (requires { Derived::moment_roles; })
        role = Derived::moment_roles[static_cast<std::size_t>(k)];
      else
        role = k < 4 ? unnamed[k] : "moment";
      v.push_back({role, this->moment(k)});
    }
    if (Master* m = this->master_data()) v.push_back({"master", m});
    return v;
  }

 private:
  void launch(Param* params, const Grad* grads, double lr, double grad_scale,
              const Master* d_clip) {
    if (d_clip == nullptr && !std::isfinite(grad_scale))
      return;  // skipped: nothing written, not counted
    const std::int64_t t = this->begin_step(Derived::name);
    static_cast<Derived*>(this)->update(params, grads, lr, grad_scale, d_clip, t);
  }

  Config cfg_;
};

}  // namespace tessera::optim
