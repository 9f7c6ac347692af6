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
/// Every layout computes one rank's update. A matrix's statistics are of
/// the whole matrix: under tensor parallelism (a row- or column-split
/// shard, key/value shards replicated over tp / nkv ranks) and under a ZeRO
/// stage over dp > 1 (a chunk holding a piece of a tensor) each rank sums
/// g^2 + eps1 over the rows and columns of its part, p^2 and then u^2 over
/// its elements, into a sums area per tensor in whole-matrix coordinates
/// (kernels/detail/adafactor.hpp); the areas are all-gathered over the dp
/// group (the ZeRO pieces), then over the tp group (the shards), through
/// optim::group_gather as optim::muon gathers its momentum, and summed in
/// rank order, so every rank holding a part keeps the same whole
/// statistics (full_rows + full_cols a matrix) and the same row mean, lr
/// and clip divisor, and updates its own elements. That moves full_rows +
/// full_cols + 1 and then 1 doubles a split tensor per group rank, not the
/// gradient (Muon must gather it: its update is not a sum); the sums run
/// in another order than one rank's (a row's over its pieces), which
/// float64 rounding alone separates (relative 1e-16 a sum).
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
#include <utility>
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
  /// param_range, sorted) each a tensor, its tp shard (split, shard,
  /// replicas and the whole shape) or a ZeRO chunk's piece of one (`first`)
  /// of the shape it states (a matrix, dims >= 2, is factored; a vector is
  /// not), with its decay flag and shifts. A shard needs gather_over, a
  /// piece gather_pieces_over, before the first step. Allocates all state
  /// from the context now (zero). Throws config_error for bad
  /// hyper-parameters, n < 0, or a range of no known shape, beyond [0, n)
  /// or beyond its tensor (naming it).
  template <class Range>
  adafactor_optimizer(adafactor_config cfg, std::int64_t n, const std::vector<Range>& ranges,
                      const Ctx& ctx)
      : base(n, owned(ranges), (cfg.validate(), cfg.weight_decay != 0.0), ctx,
             cfg.beta1 > 0 ? 1 : 0),
        cfg_(cfg) {
    for (const owned_range& r : owned(ranges)) {
      const std::int64_t len = r.end - r.begin;
      TESSERA_THROW_IF(r.dims < 1 || r.begin < 0 || r.end > n || len < 1 || r.first < 0 ||
                           r.first + len > r.rows * r.cols,
                       config_error, "adafactor: elements [", r.begin, ", ", r.end, ") of its ", n,
                       " are not a tensor of a known shape or a piece of one (dims=", r.dims, ", ",
                       r.rows, " x ", r.cols, ", from its element ", r.first, ")");
      kernels::adafactor_tensor t;
      t.begin = r.begin;
      t.end = r.end;
      t.param_shift = r.param_shift;
      t.grad_shift = r.grad_shift;
      t.decay = r.decay && cfg.weight_decay != 0.0 ? 1 : 0;
      t.factored = r.dims >= 2 ? 1 : 0;
      t.full_rows = r.split >= 0 ? r.full_rows : r.rows;
      t.full_cols = r.split >= 0 ? r.full_cols : r.cols;
      t.numel = t.full_rows * t.full_cols;
      t.stat = sizes_.stats;
      t.sum = sizes_.sums;
      t.row = sizes_.rows;
      t.col = sizes_.cols;
      if (t.factored != 0) {
        t.rows = r.rows;
        t.cols = r.cols;
        t.first = r.first;
        t.row_off = r.split == 0 ? r.shard * r.rows : 0;
        t.col_off = r.split == 1 ? r.shard * r.cols : 0;
        t.nrows = (r.first + len - 1) / r.cols - r.first / r.cols + 1;
        sizes_.cols += t.cols;
        sizes_.stats += t.full_rows + t.full_cols;
      } else {
        t.cols = std::min(len, kernels::adafactor_vector_row);
        t.rows = t.nrows = (len + t.cols - 1) / t.cols;
        sizes_.stats += len;
      }
      sizes_.rows += t.nrows;
      sizes_.sums += kernels::adafactor_sum_slots(t);
      table_.push_back(t);
      part_.push_back({r.first, r.split >= 0, r.replica != 0, len != r.rows * r.cols, -1});
    }
    sizes_.tensors = static_cast<int>(table_.size());
    sizes_.n = n;
    tensors_ = kernels::make_tensor<kernels::adafactor_tensor>(ctx, sizes_.tensors);
    ctx.from_host(tensors_.data(), table_.data(),
                  table_.size() * sizeof(kernels::adafactor_tensor));
    stats_ = kernels::make_tensor<Master>(ctx, sizes_.stats);
    kernels::zero_elements(ctx, stats_.data(), sizes_.stats);
    scalars_ = kernels::make_tensor<Master>(ctx, 3 * std::int64_t{sizes_.tensors});
    kernels::zero_elements(ctx, scalars_.data(), 3 * std::int64_t{sizes_.tensors});
    partial_ = kernels::make_tensor<double>(ctx, sizes_.rows);
    kernels::zero_elements(ctx, partial_.data(), sizes_.rows);
    sums_ = kernels::make_tensor<double>(ctx, sizes_.sums);
    kernels::zero_elements(ctx, sums_.data(), sizes_.sums);
  }
  /// A temporary context would dangle: the optimizer keeps a pointer to it.
  template <class Range>
  adafactor_optimizer(adafactor_config, std::int64_t, const std::vector<Range>&,
                      const Ctx&&) = delete;

  /// The element type its group gathers move (parallel::data_parallel
  /// builds its group_gather of it): the sums are float64 on every context.
  using gather_value = double;

  /// Sums the areas of the tensors split over tensor parallelism through
  /// `g` (its size the tp degree the ranges' shards are of; every rank of
  /// the group has the same table). The exchange scratch grows to fit.
  /// Required before the first step when a tensor is split; throws
  /// config_error if g.size < 1 or the gather is missing for g.size > 1.
  void gather_over(group_gather<double> g) {
    TESSERA_THROW_IF(g.size < 1 || (g.size > 1 && !g.all_gather), config_error,
                     "adafactor: a tp group of size ", g.size, " needs an all_gather (size >= 1)");
    tp_ = std::move(g);
    tp_list_.clear();
    for (std::size_t k = 0; k < table_.size(); ++k)
      if (part_[k].tp && tp_.size > 1) tp_list_.push_back(static_cast<int>(k));
    allocate_exchange();
  }

  /// Sums the areas of the tensors a ZeRO stage splits between the dp
  /// ranks through `dp` (its all_gather over the dp group, `rank` this
  /// rank's index): the tensors every bucket lists as split
  /// (state_bucket::split, the same on every rank) take their places in one
  /// exchange in that order, each rank writing the areas of its pieces
  /// (zero elsewhere). The exchange scratch grows to fit. Required before
  /// the first step when a range is a piece of a tensor; throws
  /// config_error for a bad group or a piece no bucket lists.
  void gather_pieces_over(group_gather<double> dp, int rank, std::vector<state_bucket> buckets) {
    TESSERA_THROW_IF(dp.size < 1 || rank < 0 || rank >= dp.size || (dp.size > 1 && !dp.all_gather),
                     config_error, "adafactor: a dp group of size ", dp.size, " and rank ", rank,
                     " needs an all_gather (size >= 1, rank in [0, size))");
    dp_ = std::move(dp);
    zero_ = true;
    // The listed tensors' places in the exchange (both rounds).
    dp_places_.clear();
    std::int64_t at = 0;
    for (const state_bucket& u : buckets)
      for (const nn::param_range& r : u.split) {
        kernels::adafactor_tensor t;
        t.factored = r.dims >= 2 ? 1 : 0;
        t.full_rows = r.split >= 0 ? r.full_rows : r.rows;
        t.full_cols = r.split >= 0 ? r.full_cols : r.cols;
        dp_places_.push_back({r.begin, at, kernels::adafactor_sum_slots(t)});
        at += kernels::adafactor_sum_slots(t);
      }
    for (std::size_t k = 0; k < table_.size(); ++k) {
      part_[k].dp_place = -1;
      if (!part_[k].piece) continue;
      const kernels::adafactor_tensor& t = table_[k];
      for (const state_bucket& u : buckets) {
        if (t.begin < u.state_begin || t.end > u.state_begin + (u.hi - u.lo)) continue;
        const std::int64_t flat = t.begin - u.state_begin + u.lo - part_[k].first;
        for (std::size_t j = 0; j < dp_places_.size(); ++j)
          if (dp_places_[j].flat_begin == flat) part_[k].dp_place = static_cast<int>(j);
      }
      TESSERA_THROW_IF(part_[k].dp_place < 0, config_error, "adafactor: the piece at elements [",
                       t.begin, ", ", t.end, ") is of a tensor no bucket lists as split");
    }
    allocate_exchange();
  }

  /// One step: the gradients are scaled by `*d_clip` (one Master in the
  /// context's memory; a non-finite value writes nothing: call skipped()
  /// once the caller knows), the parameters updated in place, and with a
  /// master copy params = round(master). Collective over the dp and tp
  /// groups given when a tensor is split between ranks. Throws
  /// tessera::error if the master weights were never initialised, or a
  /// tensor is split and its group was not given.
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
  /// The table's sizes, as the kernels take them.
  const kernels::adafactor_sizes& sizes() const { return sizes_; }
  /// The second-moment statistics (adafactor_tensor::stat; the context's memory).
  const Master* statistics() const { return stats_.data(); }
  /// Whether table entry k is a ZeRO piece of its tensor (not all its elements).
  bool piece(std::size_t k) const { return part_.at(k).piece; }

  /// Bytes of state held: flat_optimizer's (first moment, master weights,
  /// segment table), the statistics, the tensor table (144 bytes a tensor),
  /// 3 Masters a tensor, one double a step row, the sums areas and the
  /// exchange scratch (adafactor_exchange_elements doubles).
  std::size_t state_bytes() const {
    return base::state_bytes() + stats_.bytes() + tensors_.bytes() + scalars_.bytes() +
           partial_.bytes() + sums_.bytes() + exchange_.bytes();
  }
  /// Doubles this rank sends in round `round` (0: the sums of rows,
  /// columns and p^2; 1: of u^2) of the exchange over dp (ZeRO pieces,
  /// every rank alike) and over tp (its split tensors): plan::plan_comm's.
  std::pair<std::int64_t, std::int64_t> exchange_lengths(int round) const {
    std::int64_t dp = 0, tp = 0;
    if (zero_ && dp_.size > 1)
      for (const dp_place& p : dp_places_) dp += round == 0 ? p.slots - 1 : 1;
    for (int k : tp_list_)
      tp += round == 0 ? kernels::adafactor_sum_slots(table_[std::size_t(k)]) - 1 : 1;
    return {dp, tp};
  }
  /// Bytes of the exchange scratch (0 when no tensor is split between ranks).
  std::size_t exchange_bytes() const { return exchange_.bytes(); }
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
  /// at `data` (the context's memory): one an element of the tensor from
  /// the element asked for to the end of this optimizer's part of it
  /// (`along` -2: a vector's "exp_avg_sq", split as the tensor is), or the
  /// whole matrix's one a row (0: "exp_avg_sq_row", full_rows) or one a
  /// column (1: "exp_avg_sq_col", full_cols), the same on every rank
  /// holding a part of it.
  struct tensor_statistic {
    const char* role;
    Master* data;
    std::int64_t count;
    int along;
  };
  /// The statistics of the tensor holding element `state_begin` (in the
  /// optimizer's elements). Throws tessera::error if no tensor holds it.
  std::vector<tensor_statistic> statistics_of(std::int64_t state_begin) {
    auto it = std::upper_bound(
        table_.begin(), table_.end(), state_begin,
        [](std::int64_t b, const kernels::adafactor_tensor& t) { return b < t.begin; });
    TESSERA_THROW_IF(it == table_.begin() || (it - 1)->end <= state_begin, error,
                     "adafactor: no tensor holds element ", state_begin);
    --it;
    Master* s = stats_.data() + it->stat;
    if (it->factored == 0)
      return {{"exp_avg_sq", s + (state_begin - it->begin), it->end - state_begin, -2}};
    return {{"exp_avg_sq_row", s, it->full_rows, 0},
            {"exp_avg_sq_col", s + it->full_rows, it->full_cols, 1}};
  }

 private:
  // What the exchanges need of table entry k beyond the kernels' view.
  struct part_info {
    std::int64_t first;  // its first element within its tensor (a piece's)
    bool tp;             // split over tensor parallelism
    bool replica;        // a replica (not the first) of its tp shard: sends zeros
    bool piece;          // a ZeRO piece: summed over dp
    int dp_place;        // its place in the dp exchange (gather_pieces_over)
  };
  struct dp_place {
    std::int64_t flat_begin, at, slots;
  };

  // Doubles one exchange round needs over a group of `size` with `len`
  // doubles of its own: the send block and every rank's gathered.
  static std::int64_t exchange_of(std::int64_t len, int size) { return len * (1 + size); }

  void allocate_exchange() {
    std::int64_t tp_len = 0, dp_len = 0;
    for (int k : tp_list_) tp_len += kernels::adafactor_sum_slots(table_[std::size_t(k)]) - 1;
    for (const dp_place& p : dp_places_) dp_len += p.slots - 1;
    const std::int64_t elems =
        std::max(zero_ ? exchange_of(dp_len, dp_.size) : 0, exchange_of(tp_len, tp_.size));
    exchange_ = kernels::make_tensor<double>(this->ctx(), elems);
    kernels::zero_elements(this->ctx(), exchange_.data(), elems);
  }

  // Sums round `round`'s slots of the split tensors' areas over the dp
  // group (ZeRO pieces), then over the tp group (shards): round 0 the
  // areas but their last slot, round 1 the last (the sum of u^2).
  void exchange(int round) {
    const Ctx& ctx = this->ctx();
    double* sums = sums_.data();
    auto slots = [&](std::int64_t all, std::int64_t& lo) {
      lo = round == 0 ? 0 : all - 1;
      return round == 0 ? all - 1 : std::int64_t{1};
    };
    if (zero_ && !dp_places_.empty() && dp_.size > 1) {
      std::int64_t len = 0;
      std::vector<std::int64_t> off;
      for (const dp_place& p : dp_places_) {
        std::int64_t lo = 0;
        off.push_back(len);
        len += slots(p.slots, lo);
      }
      double* send = exchange_.data();
      double* all = send + len;
      kernels::zero_elements(ctx, send, len);
      for (std::size_t k = 0; k < table_.size(); ++k) {
        if (!part_[k].piece) continue;
        std::int64_t lo = 0;
        const std::int64_t n = slots(kernels::adafactor_sum_slots(table_[k]), lo);
        kernels::copy_elements(ctx, send + off[std::size_t(part_[k].dp_place)],
                               sums + table_[k].sum + lo, n);
      }
      dp_.all_gather(send, all, len);
      for (std::size_t k = 0; k < table_.size(); ++k) {
        if (!part_[k].piece) continue;
        std::int64_t lo = 0;
        const std::int64_t n = slots(kernels::adafactor_sum_slots(table_[k]), lo);
        adafactor_sum_ranks(ctx, sums + table_[k].sum + lo,
                            all + off[std::size_t(part_[k].dp_place)], dp_.size, n, len);
      }
    }
    if (!tp_list_.empty()) {
      std::int64_t len = 0;
      std::vector<std::int64_t> off;
      for (int k : tp_list_) {
        std::int64_t lo = 0;
        off.push_back(len);
        len += slots(kernels::adafactor_sum_slots(table_[std::size_t(k)]), lo);
      }
      double* send = exchange_.data();
      double* all = send + len;
      for (std::size_t j = 0; j < tp_list_.size(); ++j) {
        const std::size_t k = std::size_t(tp_list_[j]);
        std::int64_t lo = 0;
        const std::int64_t n = slots(kernels::adafactor_sum_slots(table_[k]), lo);
        if (part_[k].replica)
          kernels::zero_elements(ctx, send + off[j], n);
        else
          kernels::copy_elements(ctx, send + off[j], sums + table_[k].sum + lo, n);
      }
      tp_.all_gather(send, all, len);
      for (std::size_t j = 0; j < tp_list_.size(); ++j) {
        const std::size_t k = std::size_t(tp_list_[j]);
        std::int64_t lo = 0;
        const std::int64_t n = slots(kernels::adafactor_sum_slots(table_[k]), lo);
        adafactor_sum_ranks(ctx, sums + table_[k].sum + lo, all + off[j], tp_.size, n, len);
      }
    }
  }

  void launch(Param* params, const Grad* grads, double lr, double grad_scale,
              const Master* d_clip) {
    if (d_clip == nullptr && !std::isfinite(grad_scale)) return;  // skipped: not counted
    bool pieces = false, split = false;
    for (const part_info& p : part_) {
      pieces = pieces || p.piece;
      split = split || p.tp;
    }
    TESSERA_THROW_IF(pieces && !zero_, error,
                     "adafactor: a ZeRO chunk holds a piece of a tensor, whose statistics are "
                     "of the whole tensor: give the optimizer its dp group and buckets "
                     "(gather_pieces_over) first");
    TESSERA_THROW_IF(split && tp_.size < 2, error,
                     "adafactor: a tensor is split over tensor parallelism, and its statistics "
                     "are of the whole tensor: give the optimizer its tp group (gather_over) "
                     "first");
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
    const kernels::adafactor_buffers<Master> b{stats_.data(),
                                               c.beta1 > 0 ? this->moment(0) : nullptr,
                                               scalars_.data(), partial_.data(), sums_.data()};
    Master* m = this->master_data();
    if (!pieces && !split) {
      adafactor_step(this->ctx(), params, m, grads, tensors_.data(), sizes_, b, s, d_clip,
                     kernels::adafactor_phase::all);
      return;
    }
    adafactor_step(this->ctx(), params, m, grads, tensors_.data(), sizes_, b, s, d_clip,
                   kernels::adafactor_phase::sums);
    exchange(0);
    adafactor_step(this->ctx(), params, m, grads, tensors_.data(), sizes_, b, s, d_clip,
                   kernels::adafactor_phase::statistics);
    exchange(1);
    adafactor_step(this->ctx(), params, m, grads, tensors_.data(), sizes_, b, s, d_clip,
                   kernels::adafactor_phase::update);
  }

  adafactor_config cfg_;
  std::vector<kernels::adafactor_tensor> table_;
  std::vector<part_info> part_;
  kernels::adafactor_sizes sizes_;
  tensor<kernels::adafactor_tensor, Backend> tensors_;
  tensor<Master, Backend> stats_, scalars_;
  tensor<double, Backend> partial_, sums_, exchange_;
  group_gather<double> tp_, dp_;
  bool zero_ = false;
  std::vector<int> tp_list_;
  std::vector<dp_place> dp_places_;
};

/// The Adafactor policy: `trainer<P, B, optim::adafactor, ...>`. Its
/// statistics are of whole tensors: parallel::data_parallel gives the
/// optimizer the tp group (gather_over) when the model is tensor-parallel,
/// and under a ZeRO stage over dp > 1 the dp group and the buckets
/// (gather_pieces_over), as it does optim::muon.
struct adafactor {
  static constexpr const char* name = "adafactor";
  using config = adafactor_config;
  template <class Param, class Grad, class Master, class Ctx>
  using state = adafactor_optimizer<Param, Grad, Master, Ctx>;
};

static_assert(check_optimizer_policy<adafactor>());

}  // namespace tessera::optim
