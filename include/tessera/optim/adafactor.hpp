#pragma once
/// \file optim/adafactor.hpp
/// Adafactor as an optimizer policy (optim/optimizer.hpp): `optim::adafactor`,
/// and the optimizer it builds, `adafactor_optimizer<Param, Grad, Master,
/// Ctx>`, over a flat buffer on any execution context (kernels::adafactor_step
/// through the context: six passes over every tensor at once,
/// kernels/adafactor.hpp).
///
/// State: per matrix (rows x cols) its row and column means of the squared
/// gradient ("exp_avg_sq_row", "exp_avg_sq_col": rows + cols floats instead
/// of AdamW's 2 rows cols), per vector one statistic an element
/// ("exp_avg_sq"); the first moment ("exp_avg", 4 bytes a parameter) only
/// with beta1 > 0; master weights when Param is narrower than Master; the
/// tensor table and per-row and per-tensor scratch. All allocated when the
/// optimizer is built. transformers' state names.
///
/// Its statistics are of whole tensors (a matrix's row and column means,
/// each tensor's update RMS), so each range it is given must be a whole
/// tensor with its shape (nn::param_range's dims, rows, cols): the policy
/// says so (`whole_tensors`), and parallel::data_parallel refuses a ZeRO
/// stage whose shards would split one. Under tensor parallelism each rank's
/// shard of a split matrix is a matrix of its own: its column (row-split)
/// or row (column-split) statistics, the mean of its row statistics and its
/// update RMS are the shard's, so tp > 1 trains with a different (still
/// factored) second moment than one rank does; vectors and whole tensors
/// update as on one rank.
///
/// Source: Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with
/// Sublinear Memory Cost", Algorithms 4 and 5, update clipping (section 6),
/// the optional first moment, beta2_t = 1 - t^decay_rate (section 7), in the
/// arithmetic of transformers.optimization.Adafactor (kernels/detail/adafactor.hpp).
/// Defaults: beta1 off, d = 1, decay_rate -0.8, eps (1e-30, 1e-3), and, as
/// transformers' Adafactor(scale_parameter=False, relative_step=False,
/// warmup_init=False), the learning rate is the schedule's.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/kernels/adafactor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/optim/optimizer.hpp"

namespace tessera::optim {

/// Adafactor hyper-parameters (the learning rate comes from the schedule
/// each step, unless relative_step).
struct adafactor_config {
  double beta1 = 0.0;           ///< the first moment's decay; 0: none (transformers' beta1=None)
  double clip_threshold = 1.0;  ///< d: the update's RMS is clipped to it
  double decay_rate = -0.8;     ///< beta2_t = 1 - t^decay_rate
  double eps1 = 1e-30;          ///< added to g^2 (transformers' eps[0])
  double eps2 = 1e-3;           ///< floor of the parameter scale (eps[1])
  double weight_decay = 0.0;    ///< decoupled: p -= lr wd p (norms and biases excluded)
  /// lr *= max(eps2, rms(p)) of each tensor (transformers' scale_parameter).
  bool scale_parameter = false;
  /// lr = min(1e-2, 1 / sqrt(t)) instead of the schedule's (relative_step);
  /// with warmup_init min(1e-6 t, 1 / sqrt(t)).
  bool relative_step = false;
  bool warmup_init = false;
  /// Throws config_error if a value is out of range.
  void validate() const {
    TESSERA_THROW_IF(!(beta1 >= 0 && beta1 < 1), config_error, "beta1=", beta1,
                     " must be in [0, 1) (0: no first moment)");
    TESSERA_THROW_IF(!(clip_threshold > 0) || !std::isfinite(clip_threshold), config_error,
                     "clip_threshold=", clip_threshold, " must be finite and > 0");
    TESSERA_THROW_IF(!(decay_rate >= -1 && decay_rate < 0), config_error, "decay_rate=", decay_rate,
                     " must be in [-1, 0) (beta2_t = 1 - t^decay_rate)");
    TESSERA_THROW_IF(!(eps1 > 0) || !std::isfinite(eps1), config_error, "eps1=", eps1,
                     " must be finite and > 0");
    TESSERA_THROW_IF(!(eps2 >= 0) || !std::isfinite(eps2), config_error, "eps2=", eps2,
                     " must be finite and >= 0");
    TESSERA_THROW_IF(!(weight_decay >= 0) || !std::isfinite(weight_decay), config_error,
                     "weight_decay=", weight_decay, " must be finite and >= 0");
    TESSERA_THROW_IF(warmup_init && !relative_step, config_error,
                     "warmup_init shapes the relative step: it needs relative_step");
  }
  /// The learning rate of step t (1-based) given the schedule's `lr`: lr,
  /// or the relative step (transformers' _get_lr without the parameter scale).
  double step_lr(double lr, std::int64_t t) const {
    if (!relative_step) return lr;
    const double td = static_cast<double>(t);
    return std::min(warmup_init ? 1e-6 * td : 1e-2, 1.0 / std::sqrt(td));
  }
};

/// Adafactor over n elements of `Param` with gradients `Grad` and `Master`
/// state, on context `Ctx` (not owned). Built over ranges that are each a
/// whole tensor with its shape.
template <class Param, class Grad, class Master, class Ctx>
class adafactor_optimizer : public flat_optimizer<Param, Master, Ctx> {
  using base = flat_optimizer<Param, Master, Ctx>;
  using Backend = typename Ctx::backend_type;

 public:
  static constexpr const char* name = "adafactor";
  using base::has_master;

  /// Builds the optimizer for elements [0, n), `ranges` (owned_range or
  /// param_range, sorted) each a whole tensor of the shape it states (a
  /// matrix is factored, a vector is not) with its decay flag and shifts.
  /// Allocates all state from the context now (zero). Throws config_error
  /// for bad hyper-parameters, n < 0, or a range that is not a whole
  /// tensor of a known shape inside [0, n) (naming it).
  template <class Range>
  adafactor_optimizer(adafactor_config cfg, std::int64_t n, const std::vector<Range>& ranges,
                      const Ctx& ctx)
      : base(n, owned(ranges), (cfg.validate(), cfg.weight_decay != 0.0), ctx,
             cfg.beta1 > 0 ? 1 : 0),
        cfg_(cfg) {
    std::int64_t stat = 0;
    for (const owned_range& r : owned(ranges)) {
      TESSERA_THROW_IF(!r.whole() || r.begin < 0 || r.end > n, config_error,
                       "adafactor: elements [", r.begin, ", ", r.end, ") of its ", n,
                       " are not a whole tensor of a known shape (dims=", r.dims, ", ", r.rows,
                       " x ", r.cols,
                       "): its statistics are of whole tensors (a ZeRO stage "
                       "over dp > 1 splits them: use stage 0)");
      kernels::adafactor_tensor t;
      t.begin = r.begin;
      t.end = r.end;
      t.param_shift = r.param_shift;
      t.grad_shift = r.grad_shift;
      t.decay = r.decay && cfg.weight_decay != 0.0 ? 1 : 0;
      t.factored = r.dims >= 2 ? 1 : 0;
      t.stat = stat;
      t.row = sizes_.rows;
      if (t.factored != 0) {
        t.rows = r.rows;
        t.cols = r.cols;
        t.col = sizes_.cols;
        sizes_.cols += t.cols;
        stat += t.rows + t.cols;
      } else {
        const std::int64_t numel = r.end - r.begin;
        t.cols = std::min(numel, kernels::adafactor_vector_row);
        t.rows = (numel + t.cols - 1) / t.cols;
        t.col = sizes_.cols;
        stat += numel;
      }
      sizes_.rows += t.rows;
      table_.push_back(t);
    }
    sizes_.tensors = static_cast<int>(table_.size());
    sizes_.n = n;
    tensors_ = kernels::make_tensor<kernels::adafactor_tensor>(ctx, sizes_.tensors);
    ctx.from_host(tensors_.data(), table_.data(),
                  table_.size() * sizeof(kernels::adafactor_tensor));
    stats_ = kernels::make_tensor<Master>(ctx, stat);
    kernels::zero_elements(ctx, stats_.data(), stat);
    scalars_ = kernels::make_tensor<Master>(ctx, 3 * std::int64_t{sizes_.tensors});
    kernels::zero_elements(ctx, scalars_.data(), 3 * std::int64_t{sizes_.tensors});
    partial_ = kernels::make_tensor<double>(ctx, sizes_.rows);
    kernels::zero_elements(ctx, partial_.data(), sizes_.rows);
  }
  /// A temporary context would dangle: the optimizer keeps a pointer to it.
  template <class Range>
  adafactor_optimizer(adafactor_config, std::int64_t, const std::vector<Range>&,
                      const Ctx&&) = delete;

  /// One step: the gradients are scaled by `*d_clip` (one Master in the
  /// context's memory; a non-finite value writes nothing: call skipped()
  /// once the caller knows), the parameters updated in place, and with a
  /// master copy params = round(master). Throws tessera::error if the
  /// master weights were never initialised.
  void step(Param* params, const Grad* grads, double lr, const Master* d_clip) {
    launch(params, grads, lr, 1.0, d_clip);
  }
  /// One step with the gradient multiplier given on the host; a non-finite
  /// one skips the step (nothing written, not counted).
  void step(Param* params, const Grad* grads, double lr, double grad_scale = 1.0) {
    launch(params, grads, lr, grad_scale, nullptr);
  }
  /// The hyper-parameters.
  const adafactor_config& config() const { return cfg_; }

  /// The first moment (n elements, the context's memory); null without one.
  const Master* exp_avg() const { return cfg_.beta1 > 0 ? this->moment(0) : nullptr; }
  /// The tensor table, as the kernels read it (host copy).
  const std::vector<kernels::adafactor_tensor>& tensors() const { return table_; }
  /// The second-moment statistics (adafactor_tensor::stat; the context's memory).
  const Master* statistics() const { return stats_.data(); }

  /// Bytes of state held: flat_optimizer's (first moment, master weights,
  /// segment table), the statistics, the tensor table (80 bytes a tensor),
  /// 3 Masters a tensor and one double a row of scratch.
  std::size_t state_bytes() const {
    return base::state_bytes() + stats_.bytes() + tensors_.bytes() + scalars_.bytes() +
           partial_.bytes();
  }
  /// Bytes save() writes: the step count, the first moment, the master
  /// weights (flat_optimizer's), then the statistics.
  std::size_t serialized_bytes() const { return base::serialized_bytes() + stats_.bytes(); }
  /// Writes what serialized_bytes() counts through w.write(const void*, bytes).
  template <class Writer>
  void save(Writer& w) const {
    base::save(w);
    detail::write_from(this->ctx(), w, stats_.data(), stats_.bytes());
  }
  /// Restores what save() wrote from host memory `p` (serialized_bytes()).
  void load(const char* p) {
    base::load(p);
    this->ctx().from_host(stats_.data(), p + base::serialized_bytes(), stats_.bytes());
  }

  /// One state buffer of one element per optimizer element, and its role
  /// in a checkpoint: "exp_avg" with beta1 > 0, then "master" when kept.
  struct state_buffer {
    const char* role;
    Master* data;
  };
  std::vector<state_buffer> state_buffers() {
    std::vector<state_buffer> v;
    if (cfg_.beta1 > 0) v.push_back({"exp_avg", this->moment(0)});
    if (Master* m = this->master_data()) v.push_back({"master", m});
    return v;
  }

  /// A statistic of one tensor, as a checkpoint stores it: `count` Masters
  /// at `data` (the context's memory), one an element of the tensor
  /// (`along` -1: a vector's "exp_avg_sq"), one a row (0: a matrix's
  /// "exp_avg_sq_row") or one a column (1: "exp_avg_sq_col").
  struct tensor_statistic {
    const char* role;
    Master* data;
    std::int64_t count;
    int along;
  };
  /// The statistics of the tensor whose first element is `state_begin` (in
  /// the optimizer's elements). Throws tessera::error if no tensor begins there.
  std::vector<tensor_statistic> statistics_of(std::int64_t state_begin) {
    const auto it = std::lower_bound(
        table_.begin(), table_.end(), state_begin,
        [](const kernels::adafactor_tensor& t, std::int64_t b) { return t.begin < b; });
    TESSERA_THROW_IF(it == table_.end() || it->begin != state_begin, error,
                     "adafactor: no tensor begins at element ", state_begin);
    Master* s = stats_.data() + it->stat;
    if (it->factored == 0) return {{"exp_avg_sq", s, it->end - it->begin, -1}};
    return {{"exp_avg_sq_row", s, it->rows, 0}, {"exp_avg_sq_col", s + it->rows, it->cols, 1}};
  }

 private:
  void launch(Param* params, const Grad* grads, double lr, double grad_scale,
              const Master* d_clip) {
    if (d_clip == nullptr && !std::isfinite(grad_scale)) return;  // skipped: not counted
    const std::int64_t t = this->begin_step(name);
    const adafactor_config& c = cfg_;
    const kernels::detail::adafactor_step_params<Master> s{
        static_cast<Master>(c.step_lr(lr, t)),
        static_cast<Master>(1.0 - std::pow(static_cast<double>(t), c.decay_rate)),
        static_cast<Master>(c.eps1),
        static_cast<Master>(c.eps2),
        static_cast<Master>(c.clip_threshold),
        static_cast<Master>(c.beta1),
        static_cast<Master>(c.weight_decay),
        static_cast<Master>(grad_scale),
        c.beta1 > 0,
        c.scale_parameter};
    const kernels::adafactor_buffers<Master> b{
        stats_.data(), c.beta1 > 0 ? this->moment(0) : nullptr, scalars_.data(), partial_.data()};
    adafactor_step(this->ctx(), params, this->master_data(), grads, tensors_.data(), sizes_, b, s,
                   d_clip);
  }

  adafactor_config cfg_;
  std::vector<kernels::adafactor_tensor> table_;
  kernels::adafactor_sizes sizes_;
  tensor<kernels::adafactor_tensor, Backend> tensors_;
  tensor<Master, Backend> stats_, scalars_;
  tensor<double, Backend> partial_;
};

/// The Adafactor policy: `trainer<P, B, optim::adafactor, ...>`. Its state
/// is of whole tensors (`whole_tensors`): parallel::data_parallel refuses
/// a ZeRO stage whose shards split one.
struct adafactor {
  static constexpr const char* name = "adafactor";
  static constexpr bool whole_tensors = true;
  using config = adafactor_config;
  template <class Param, class Grad, class Master, class Ctx>
  using state = adafactor_optimizer<Param, Grad, Master, Ctx>;
};

static_assert(check_optimizer_policy<adafactor>());

}  // namespace tessera::optim
