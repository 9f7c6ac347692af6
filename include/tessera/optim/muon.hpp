#pragma once
/// \file optim/muon.hpp
/// Muon as an optimizer policy (optim/optimizer.hpp): `optim::muon`, and
/// the optimizer it builds, `muon_optimizer<Param, Grad, Master, Ctx>`,
/// over a flat buffer on any execution context (kernels/muon.hpp on the
/// host, their overloads in kernels/cuda/ops.hpp on the GPU).
///
/// Muon updates the weight matrices of the transformer blocks (attention's
/// wq, wk, wv, wo and the MLP's gate, up and down: nn::param_range::hidden)
/// by their momentum orthogonalised with the quintic Newton-Schulz
/// iteration; the embedding, the LM head and the norm gains take AdamW, as
/// the reference recipes do (Keller Jordan's modded-nanogpt, Moonshot's
/// Moonlight; torch.optim.Muon refuses anything but 2-D tensors and its
/// documentation names AdamW for the rest). One step:
///
///   fused pass  every element: g *= clip; a matrix's momentum
///               buf = lerp(buf, g, 1 - mu); every other element its AdamW step;
///   per matrix  u = lerp(g, buf, mu) (Nesterov) or buf; under tensor
///               parallelism the shards all-gathered over the tp group;
///               W = NS(u), the whole matrix (transposed when it has more
///               rows than columns); p = p (1 - lr wd) - lr s W on this
///               rank's shard, s the shape's scale (muon_config::adjust).
///
/// State: one buffer of n Masters (a matrix's "momentum_buffer", another
/// tensor's "exp_avg"), AdamW's "exp_avg_sq" of the other tensors only,
/// master weights when Param is narrower than Master, the segment and
/// matrix tables, and the iteration's scratch (for the largest matrix:
/// its shard, the gathered shards under tp, W and its partner, two Gram
/// matrices; under ZeRO over dp > 1 also the largest bucket holding a
/// matrix). All allocated when the optimizer is built (the bucket when the
/// engine gives the buckets).
///
/// Each matrix is orthogonalised whole. Under tensor parallelism every
/// rank of the tp group gathers the split momentum, runs the iteration on
/// the whole matrix and keeps its own shard (Megatron-Core's tensor-parallel
/// Muon calls this mode "duplicated"). Under a ZeRO stage over dp > 1, whose
/// chunks may cut a matrix into pieces, each bucket holding a matrix has
/// every rank's chunk of what is orthogonalised all-gathered over dp, and
/// every rank owning a piece runs the iteration on the whole matrix and
/// updates its piece (gather_pieces_over). Every layout computes one rank's
/// update; parallel::data_parallel hands the optimizer both groups.
///
/// Precision: the iteration runs in Master (float64 or float32 on the host,
/// float32 on the GPU); torch.optim.Muon casts to bfloat16 for speed.
///
/// Source: K. Jordan et al. 2024, "Muon: An optimizer for hidden layers in
/// neural networks"; J. Liu et al. 2025, "Muon is Scalable for LLM
/// Training"; in the arithmetic of torch.optim.Muon (torch/optim/_muon.py,
/// PyTorch 2.9+: the defaults, _single_tensor_muon, _adjust_lr).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/muon.hpp"
#include "tessera/optim/optimizer.hpp"

namespace tessera::optim {

/// How Muon scales a matrix's update by its shape (rows x cols = out x in
/// features; torch's adjust_lr_fn).
enum class muon_adjust {
  original,        ///< sqrt(max(1, rows / cols)) (K. Jordan's; torch's default)
  match_rms_adamw  ///< 0.2 sqrt(max(rows, cols)) (Moonshot's: reuses AdamW's lr and decay)
};

/// The name of a muon_adjust ("original", "match_rms_adamw").
inline const char* name_of(muon_adjust a) {
  return a == muon_adjust::original ? "original" : "match_rms_adamw";
}
/// Parses a muon_adjust name; throws config_error listing the names.
inline muon_adjust parse_muon_adjust(const std::string& s) {
  if (s == "original") return muon_adjust::original;
  if (s == "match_rms_adamw") return muon_adjust::match_rms_adamw;
  throw config_error("unknown Muon update scale '" + s + "' (valid: original, match_rms_adamw)");
}

/// Muon hyper-parameters (the learning rate comes from the schedule each
/// step: the matrices' lr; the other tensors' AdamW lr is it times
/// adamw_lr_ratio). Defaults: torch.optim.Muon's and torch.optim.AdamW's
/// betas of the recipes (0.9, 0.95).
struct muon_config {
  double momentum = 0.95;  ///< mu
  bool nesterov = true;    ///< orthogonalise lerp(g, buf, mu) instead of buf
  int ns_steps = 5;        ///< Newton-Schulz iterations
  /// The quintic's coefficients (K. Jordan's: the largest slope at zero).
  double ns_a = 3.4445, ns_b = -4.7750, ns_c = 2.0315;
  double eps = 1e-7;  ///< W / max(||W||_F, eps) before the iteration
  muon_adjust adjust = muon_adjust::original;
  double weight_decay = 0.1;    ///< decoupled: p *= 1 - lr wd (norms excluded)
  double adamw_lr_ratio = 1.0;  ///< the AdamW tensors' lr over the matrices'
  double adamw_beta1 = 0.9, adamw_beta2 = 0.95, adamw_eps = 1e-8;

  /// Throws config_error if a value is out of range.
  void validate() const {
    TESSERA_THROW_IF(!(momentum >= 0 && momentum < 1), config_error, "muon momentum=", momentum,
                     " must be in [0, 1)");
    TESSERA_THROW_IF(ns_steps < 0 || ns_steps >= 100, config_error, "muon ns_steps=", ns_steps,
                     " must be in [0, 100)");
    TESSERA_THROW_IF(!std::isfinite(ns_a) || !std::isfinite(ns_b) || !std::isfinite(ns_c),
                     config_error, "muon coefficients (", ns_a, ", ", ns_b, ", ", ns_c,
                     ") must be finite");
    TESSERA_THROW_IF(!(eps > 0) || !std::isfinite(eps), config_error, "muon eps=", eps,
                     " must be finite and > 0");
    TESSERA_THROW_IF(!(weight_decay >= 0) || !std::isfinite(weight_decay), config_error,
                     "muon weight_decay=", weight_decay, " must be finite and >= 0");
    TESSERA_THROW_IF(!(adamw_lr_ratio >= 0) || !std::isfinite(adamw_lr_ratio), config_error,
                     "muon adamw_lr_ratio=", adamw_lr_ratio, " must be finite and >= 0");
    TESSERA_THROW_IF(!(adamw_beta1 >= 0 && adamw_beta1 < 1), config_error,
                     "muon adamw_beta1=", adamw_beta1, " must be in [0, 1)");
    TESSERA_THROW_IF(!(adamw_beta2 >= 0 && adamw_beta2 < 1), config_error,
                     "muon adamw_beta2=", adamw_beta2, " must be in [0, 1)");
    TESSERA_THROW_IF(!(adamw_eps > 0), config_error, "muon adamw_eps=", adamw_eps, " must be > 0");
  }
  /// The learning rate of a rows x cols matrix (out x in features, the
  /// whole matrix under tp): torch's _adjust_lr.
  double adjusted_lr(double lr, std::int64_t rows, std::int64_t cols) const {
    const double r = static_cast<double>(rows), c = static_cast<double>(cols);
    return adjust == muon_adjust::original ? lr * std::sqrt(std::max(1.0, r / c))
                                           : lr * 0.2 * std::sqrt(std::max(r, c));
  }
};

/// Whether Muon updates range `r` (nn::param_range or owned_range): a
/// transformer block's weight matrix; AdamW updates every other tensor.
template <class Range>
bool muon_updates(const Range& r) {
  return r.hidden && r.dims == 2;
}
/// The muon_matrix of range `r` (a whole tensor or its tp shard, with the
/// whole shape) on a tp group of `tp` ranks: elements [r.begin, r.end),
/// shifts 0, decay as r says.
template <class Range>
kernels::muon_matrix muon_matrix_of(const Range& r, int tp) {
  kernels::muon_matrix t;
  t.begin = r.begin;
  t.end = r.end;
  t.rows = r.rows;
  t.cols = r.cols;
  t.full_rows = r.split >= 0 ? r.full_rows : r.rows;
  t.full_cols = r.split >= 0 ? r.full_cols : r.cols;
  t.split = r.split;
  t.shards = r.split >= 0 ? tp : 1;
  t.shard = r.shard;
  t.replicas = r.replicas;
  t.decay = r.decay ? 1 : 0;
  return t;
}

/// Muon over n elements of `Param` with gradients `Grad` and `Master`
/// state, on context `Ctx` (not owned). Built over ranges that are each a
/// tensor (or its tp shard) with its shape, or a ZeRO chunk's piece of one.
template <class Param, class Grad, class Master, class Ctx>
class muon_optimizer : public flat_optimizer<Param, Master, Ctx> {
  using base = flat_optimizer<Param, Master, Ctx>;
  using Backend = typename Ctx::backend_type;

 public:
  static constexpr const char* name = "muon";
  using base::has_master;

  /// Builds the optimizer for elements [0, n), `ranges` (owned_range or
  /// param_range, sorted) each a tensor, tp shard or piece of one (`first`)
  /// of the shape it states: a hidden matrix (param_range::hidden) is
  /// Muon's, any other tensor AdamW's. A piece of a matrix needs
  /// gather_pieces_over before the first step. Allocates all state and
  /// scratch from the context now (zero). Throws config_error for bad
  /// hyper-parameters, n < 0, or a range of no known shape, beyond [0, n)
  /// or beyond its tensor (naming it).
  template <class Range>
  muon_optimizer(muon_config cfg, std::int64_t n, const std::vector<Range>& ranges, const Ctx& ctx)
      : base(n, owned(ranges), (cfg.validate(), cfg.weight_decay != 0.0), ctx, 1), cfg_(cfg) {
    std::int64_t vpos = 0, scratch = 0;
    for (const owned_range& r : owned(ranges)) {
      TESSERA_THROW_IF(r.dims < 1 || r.begin < 0 || r.end > n || r.first < 0 ||
                           r.first + (r.end - r.begin) > r.rows * r.cols,
                       config_error, "muon: elements [", r.begin, ", ", r.end, ") of its ", n,
                       " are not a tensor of a known shape or a piece of one (dims=", r.dims, ", ",
                       r.rows, " x ", r.cols, ", from its element ", r.first, ")");
      pieces_ = pieces_ || (muon_updates(r) && !r.whole());
      const bool decay = r.decay && cfg.weight_decay != 0.0;
      kernels::muon_segment s{r.begin, r.end, decay ? 1 : 0, 0, r.param_shift, r.grad_shift, 0};
      tensor_entry e{r.begin, r.end, false, 0};
      if (muon_updates(r)) {
        s.muon = 1;
        e.muon = true;
        kernels::muon_matrix t = muon_matrix_of(r, 1);
        t.begin = r.begin;
        t.end = r.end;
        t.first = r.first;
        t.param_shift = r.param_shift;
        t.grad_shift = r.grad_shift;
        t.decay = decay ? 1 : 0;
        matrices_.push_back(t);
      } else {
        s.v_shift = vpos - r.begin;
        e.v = vpos;
        vpos += r.end - r.begin;
      }
      segs_.push_back(s);
      entries_.push_back(e);
    }
    v_elems_ = vpos;
    for (const kernels::muon_matrix& t : matrices_) scratch = std::max(scratch, scratch_of(t, 1));
    v_ = kernels::make_tensor<Master>(ctx, v_elems_);
    kernels::zero_elements(ctx, v_.data(), v_elems_);
    segments_ = kernels::make_tensor<kernels::muon_segment>(ctx, std::int64_t(segs_.size()));
    ctx.from_host(segments_.data(), segs_.data(), segs_.size() * sizeof(kernels::muon_segment));
    allocate_scratch(scratch);
  }
  /// A temporary context would dangle: the optimizer keeps a pointer to it.
  template <class Range>
  muon_optimizer(muon_config, std::int64_t, const std::vector<Range>&, const Ctx&&) = delete;

  /// Gathers the matrices split over tensor parallelism through `g` (its
  /// size the tp degree the ranges' shards are of); the scratch grows by
  /// the gathered shards of the largest matrix. Required before the first
  /// step when a matrix is split; throws config_error if g.size < 1 or a
  /// gather function is missing for g.size > 1.
  void gather_over(group_gather<Master> g) {
    TESSERA_THROW_IF(g.size < 1 || (g.size > 1 && !g.all_gather), config_error,
                     "muon: a tp group of size ", g.size, " needs an all_gather (size >= 1)");
    tp_ = std::move(g);
    std::int64_t scratch = 0;
    for (kernels::muon_matrix& t : matrices_) {
      if (t.split >= 0) t.shards = tp_.size;
      scratch = std::max(scratch, scratch_of(t, tp_.size));
    }
    allocate_scratch(scratch);
  }

  /// Gathers the pieces of matrices a ZeRO stage splits between the dp
  /// ranks through `dp` (its all_gather over the dp group, `rank` this
  /// rank's index): per bucket holding a matrix (`buckets`, the engine's:
  /// parallel::bucket_plan), every rank writes what it orthogonalises of
  /// its chunk, the chunks are all-gathered into the whole bucket, and each
  /// rank orthogonalises the matrices it owns a piece of, whole. The scratch
  /// grows by the largest such bucket. Required before the first step when
  /// a range is a piece of a matrix; throws config_error for a bad group or
  /// a matrix piece in no bucket.
  void gather_pieces_over(group_gather<Master> dp, int rank, std::vector<state_bucket> buckets) {
    TESSERA_THROW_IF(dp.size < 1 || rank < 0 || rank >= dp.size || (dp.size > 1 && !dp.all_gather),
                     config_error, "muon: a dp group of size ", dp.size, " and rank ", rank,
                     " needs an all_gather (size >= 1, rank in [0, size))");
    dp_ = std::move(dp);
    dp_rank_ = rank;
    zero_ = true;
    buckets_ = std::move(buckets);
    bucket_of_.assign(matrices_.size(), -1);
    // Every bucket holding a matrix is gathered, whether this rank owns a
    // piece of one there or not.
    std::int64_t most = 0;
    for (const state_bucket& u : buckets_)
      if (u.matrices) most = std::max(most, u.chunk * dp_.size);
    for (std::size_t k = 0; k < matrices_.size(); ++k) {
      const kernels::muon_matrix& t = matrices_[k];
      for (std::size_t b = 0; b < buckets_.size(); ++b) {
        const state_bucket& u = buckets_[b];
        if (t.begin >= u.state_begin && t.end <= u.state_begin + (u.hi - u.lo))
          bucket_of_[k] = static_cast<int>(b);
      }
      TESSERA_THROW_IF(bucket_of_[k] < 0, config_error, "muon: the matrix piece at elements [",
                       t.begin, ", ", t.end, ") lies in no bucket given");
    }
    bucket_elems_ = most;
    allocate_scratch(scratch_elems_);
  }

  /// One step: the gradients scaled by `*d_clip` (one Master in the
  /// context's memory; a non-finite value writes nothing: call skipped()
  /// once the caller knows), the parameters updated in place, and with a
  /// master copy params = round(master). Collective over the tp group when
  /// a matrix is split. Throws tessera::error if the master weights were
  /// never initialised or a split matrix has no tp group (gather_over).
  void step(Param* params, const Grad* grads, double lr, const Master* d_clip) {
    launch(params, grads, lr, 1.0, d_clip);
  }
  /// One step with the gradient multiplier given on the host; a non-finite
  /// one skips the step (nothing written, not counted).
  void step(Param* params, const Grad* grads, double lr, double grad_scale = 1.0) {
    launch(params, grads, lr, grad_scale, nullptr);
  }
  /// The hyper-parameters.
  const muon_config& config() const { return cfg_; }
  /// The matrices Muon updates (host copy of the table).
  const std::vector<kernels::muon_matrix>& matrices() const { return matrices_; }
  /// The segment table of the fused pass (host copy).
  const std::vector<kernels::muon_segment>& muon_segments() const { return segs_; }
  /// The momentum of the matrices and AdamW's first moment of the other
  /// tensors (n elements, the context's memory).
  const Master* momentum() const { return this->moment(0); }
  /// AdamW's second moment of the other tensors, in their order
  /// (adamw_elements() Masters, the context's memory).
  const Master* exp_avg_sq() const { return v_.data(); }
  /// Elements AdamW updates (those of no block matrix, in this optimizer's ranges).
  std::int64_t adamw_elements() const { return v_elems_; }

  /// Bytes of state held: flat_optimizer's (the momentum, master weights,
  /// its segment table), AdamW's second moments, the Muon segment table (48
  /// bytes a tensor) and the iteration's scratch.
  std::size_t state_bytes() const {
    return base::state_bytes() + v_.bytes() + segments_.bytes() + scratch_.bytes();
  }
  /// Bytes of scratch (the largest matrix's: muon_scratch_elements).
  std::size_t scratch_bytes() const { return scratch_.bytes(); }
  /// Bytes save() writes: the step count, the momentum, the master
  /// weights (flat_optimizer's), then AdamW's second moments.
  std::size_t serialized_bytes() const { return base::serialized_bytes() + v_.bytes(); }
  /// Writes what serialized_bytes() counts through w.write(const void*, bytes).
  template <class Writer>
  void save(Writer& w) const {
    base::save(w);
    detail::write_from(this->ctx(), w, v_.data(), v_.bytes());
  }
  /// Restores what save() wrote from host memory `p` (serialized_bytes()).
  void load(const char* p) {
    base::load(p);
    this->ctx().from_host(v_.data(), p + base::serialized_bytes(), v_.bytes());
  }

  /// One state buffer of one element per optimizer element, and its role
  /// in a checkpoint: "master" when kept (the momenta are per tensor:
  /// statistics_of).
  struct state_buffer {
    const char* role;
    Master* data;
  };
  std::vector<state_buffer> state_buffers() {
    std::vector<state_buffer> v;
    if (Master* m = this->master_data()) v.push_back({"master", m});
    return v;
  }
  /// The state of one tensor as a checkpoint stores it, one Master an
  /// element of the tensor (`along` -2: split as the tensor is, a ZeRO
  /// piece holding its part): a matrix's "momentum_buffer"
  /// (torch.optim.Muon's name), another tensor's "exp_avg" and "exp_avg_sq"
  /// (torch.optim.AdamW's).
  struct tensor_statistic {
    const char* role;
    Master* data;
    std::int64_t count;
    int along;
  };
  /// The state from element `state_begin` to the end of the range holding
  /// it (a tensor, or this optimizer's piece of one). Throws tessera::error
  /// if no range holds it.
  std::vector<tensor_statistic> statistics_of(std::int64_t state_begin) {
    auto it = std::upper_bound(entries_.begin(), entries_.end(), state_begin,
                               [](std::int64_t b, const tensor_entry& t) { return b < t.begin; });
    TESSERA_THROW_IF(it == entries_.begin() || (it - 1)->end <= state_begin, error,
                     "muon: no tensor holds element ", state_begin);
    --it;
    const std::int64_t off = state_begin - it->begin, count = it->end - state_begin;
    Master* m = this->moment(0) + state_begin;
    if (it->muon) return {{"momentum_buffer", m, count, -2}};
    return {{"exp_avg", m, count, -2}, {"exp_avg_sq", v_.data() + it->v + off, count, -2}};
  }

  /// Scratch elements a matrix needs on a tp group of `shards` ranks
  /// (kernels::muon_scratch_elements).
  static std::int64_t scratch_of(const kernels::muon_matrix& t, int shards) {
    kernels::muon_matrix s = t;
    if (s.split >= 0) s.shards = shards;
    return kernels::muon_scratch_elements(s, sizeof(Master));
  }

 private:
  struct tensor_entry {
    std::int64_t begin, end;
    bool muon;
    std::int64_t v;  // AdamW's: its first element in v_
  };

  // The matrices' scratch (`elems`) and, after it, the largest bucket's.
  void allocate_scratch(std::int64_t elems) {
    scratch_elems_ = elems;
    scratch_ = kernels::make_tensor<Master>(this->ctx(), elems + bucket_elems_);
    kernels::zero_elements(this->ctx(), scratch_.data(), elems + bucket_elems_);
  }

  void launch(Param* params, const Grad* grads, double lr, double grad_scale,
              const Master* d_clip) {
    if (d_clip == nullptr && !std::isfinite(grad_scale)) return;  // skipped: not counted
    TESSERA_THROW_IF(pieces_ && !zero_, error,
                     "muon: a ZeRO chunk holds a piece of a matrix, and each matrix is "
                     "orthogonalised whole: give the optimizer its dp group and buckets "
                     "(gather_pieces_over) first");
    for (const kernels::muon_matrix& t : matrices_)
      TESSERA_THROW_IF(t.split >= 0 && tp_.size < 2, error, "muon: a matrix of ", t.full_rows,
                       " x ", t.full_cols,
                       " is split over tensor parallelism, and its momentum must be "
                       "gathered whole: give the optimizer its tp group (gather_over) first");
    const std::int64_t step_t = this->begin_step(name);
    const muon_config& c = cfg_;
    const double alr = lr * c.adamw_lr_ratio;
    const double td = static_cast<double>(step_t);
    kernels::detail::muon_step_params<Master> s{
        static_cast<Master>(lr),
        static_cast<Master>(c.momentum),
        static_cast<Master>(c.weight_decay),
        static_cast<Master>(grad_scale),
        c.nesterov,
        {static_cast<Master>(alr), static_cast<Master>(c.adamw_beta1),
         static_cast<Master>(c.adamw_beta2), static_cast<Master>(c.adamw_eps),
         static_cast<Master>(c.weight_decay),
         static_cast<Master>(1.0 - std::pow(c.adamw_beta1, td)),
         static_cast<Master>(1.0 - std::pow(c.adamw_beta2, td)), static_cast<Master>(grad_scale)}};
    const Ctx& ctx = this->ctx();
    Master* m = this->moment(0);
    Master* master = this->master_data();
    muon_momentum_step(ctx, params, master, m, v_.data(), grads, this->size(), segments_.data(),
                       static_cast<int>(segs_.size()), s, d_clip);
    const Master decay = static_cast<Master>(1.0 - lr * c.weight_decay);
    // Matrix t's shard whole at `src` (this rank's tp shard): gathered over
    // tp when split, laid out as W, orthogonalised, and this optimizer's
    // elements of it updated.
    auto orthogonalise = [&](const kernels::muon_matrix& t, const Master* src) {
      Master* gathered = scratch_.data() + t.local();
      const bool gather = t.split >= 0 && t.shards > 1;
      Master* wide = gathered + (gather ? t.gathered() : 0);
      Master* ns = wide + t.whole();
      if (gather) {
        tp_.all_gather(src, gathered, t.local());
        src = gathered;
      }
      muon_assemble(ctx, wide, src, t);
      muon_newton_schulz(ctx, wide, t.wide_rows(), t.wide_cols(), ns, c.ns_a, c.ns_b, c.ns_c,
                         c.ns_steps, c.eps);
      muon_apply(ctx, params, master, static_cast<const Master*>(wide), t, decay,
                 static_cast<Master>(c.adjusted_lr(lr, t.full_rows, t.full_cols)), d_clip);
    };
    if (!zero_) {
      for (const kernels::muon_matrix& t : matrices_) {
        muon_nesterov(ctx, scratch_.data(), m, grads, t, s, d_clip);
        orthogonalise(t, scratch_.data());
      }
      return;
    }
    // ZeRO: per bucket holding a matrix (every rank, whether it owns a
    // piece of one or not), every rank's chunk of what is orthogonalised,
    // all-gathered over dp into the whole bucket (flat order).
    Master* bucket = scratch_.data() + scratch_elems_;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const state_bucket& u = buckets_[b];
      if (!u.matrices) continue;
      Master* mine = bucket + u.chunk * dp_rank_;
      const std::int64_t to_flat = u.lo - u.state_begin;  // state element -> flat element
      for (std::size_t k = 0; k < matrices_.size(); ++k)
        if (bucket_of_[k] == static_cast<int>(b))
          muon_nesterov(ctx, mine + (matrices_[k].begin + to_flat - u.lo), m, grads, matrices_[k],
                        s, d_clip);
      dp_.all_gather(mine, bucket, u.chunk);
      for (std::size_t k = 0; k < matrices_.size(); ++k) {
        const kernels::muon_matrix& t = matrices_[k];
        if (bucket_of_[k] != static_cast<int>(b)) continue;
        orthogonalise(t, bucket + (t.begin + to_flat - t.first - u.flat_begin));
      }
    }
  }

  muon_config cfg_;
  std::vector<kernels::muon_segment> segs_;
  std::vector<kernels::muon_matrix> matrices_;
  std::vector<tensor_entry> entries_;
  std::int64_t v_elems_ = 0;
  tensor<Master, Backend> v_;
  tensor<kernels::muon_segment, Backend> segments_;
  tensor<Master, Backend> scratch_;
  std::int64_t scratch_elems_ = 0, bucket_elems_ = 0;
  group_gather<Master> tp_;
  // ZeRO (gather_pieces_over): the dp group, the buckets, each matrix's bucket.
  bool pieces_ = false, zero_ = false;
  group_gather<Master> dp_;
  int dp_rank_ = 0;
  std::vector<state_bucket> buckets_;
  std::vector<int> bucket_of_;
};

/// The Muon policy: `trainer<P, B, optim::muon, ...>`. Each matrix is
/// orthogonalised whole: parallel::data_parallel gives the optimizer the
/// tp group (gather_over) when the model is tensor-parallel, and under a
/// ZeRO stage over dp > 1 the dp group and the buckets (gather_pieces_over).
struct muon {
  static constexpr const char* name = "muon";
  using config = muon_config;
  template <class Param, class Grad, class Master, class Ctx>
  using state = muon_optimizer<Param, Grad, Master, Ctx>;
};

static_assert(check_optimizer_policy<muon>());

}  // namespace tessera::optim
