#pragma once
/// \file train/checkpoint_shards.hpp
/// What one rank of a data-parallel engine (parallel::data_parallel) holds
/// of the model's state, in the layout-free terms of
/// train/checkpoint_index.hpp: per tensor of the model's layout and per
/// role (param, the optimizer's state buffers by role, master), the box of
/// the global tensor its tensor-parallel shard covers (vocabulary padding
/// left out) and the elements of that box in its memory.
///
/// Which elements (F: the model's flat elements on this tp rank and stage;
/// owned: this rank's chunk of every bucket, parallel/buckets.hpp):
///
///   role        holds (what a load fills)         writes (each element once)
///   param       zero<0..2>: all F; zero<3>: owned  as the optimizer state
///   state       zero<0>: all F; zero<1..3>: owned  zero<0>: the dp rank's 1/dp of F
///                                                  (the replicas share the writing);
///                                                  zero<1..3>: owned
/// and a tensor replicated over the tp group (norm gains) or whose shard
/// several tp ranks hold (key/value heads when tp > nkv) is written by one
/// of them only (tp rank 0, replica 0). Every pipeline stage writes its own
/// tensors. A tied copy (the last stage's "lm_head" of tied embeddings,
/// nn::param_entry::tied) is stored once, as its tensor ("embedding", which
/// the first stage writes): it is never written, and a load fills it from
/// that tensor (its parameters and optimizer state are the embedding's).
///
/// An optimizer with per-tensor state (statistics_of) adds it: one
/// element an element of the tensor, split as the tensor is (`along` -2:
/// optim::muon's momentum_buffer and AdamW moments, optim::adafactor's
/// vector statistic "exp_avg_sq"), as a role of the tensor held and written
/// where its elements are, like the state buffers; and statistics of whole
/// matrices (optim::adafactor's row and column statistics, `along` 0 and
/// 1) as tensors of their own, "<name>.exp_avg_sq_row" of shape (rows) and
/// "<name>.exp_avg_sq_col" of shape (cols), the whole matrix's on every
/// layout: held whole by every rank holding a part of the matrix, written
/// once (by the dp rank that writes the tensor's first element, on tp shard
/// 0 and its replica 0), so any layout resumes from any other. A checkpoint
/// of an older tessera stored them per tp shard, shape (S, rows or cols):
/// one written at tp 1 (S = 1) loads as the whole matrix's; S > 1 is refused.

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/numeric.hpp"
#include "tessera/nn/param_layout.hpp"
#include "tessera/train/checkpoint_index.hpp"
#include "tessera/train/checkpoint_io.hpp"

namespace tessera::train {

/// One region of a rank's state: elements [flat_begin, flat_end) of `box`
/// of role `role` of tensor `tensor`, stored as `dtype`, the first of them
/// at `data` in the engine context's memory (consecutive after it).
struct state_region {
  std::string tensor, role, dtype;
  index_box box;
  std::int64_t flat_begin = 0, flat_end = 0;
  void* data = nullptr;
  /// The global shape of `tensor` when it is not a tensor of the model's
  /// layout (an optimizer's per-tensor statistics); empty for the model's.
  std::vector<std::int64_t> shape{};
  /// Bytes of the region.
  std::size_t bytes() const {
    return static_cast<std::size_t>(flat_end - flat_begin) * dtype_bytes_of(dtype);
  }
};

/// The box of the global tensor that layout entry `e` covers on this tp
/// rank, its padding rows (the vocabulary padded to a multiple of tp) left
/// out; an empty box (shape 0) when the shard is all padding.
inline index_box global_box(const nn::param_entry& e) {
  index_box b;
  for (int d = 0; d < e.full.rank; ++d) {
    b.start.push_back(0);
    b.shape.push_back(e.full[d]);
  }
  if (e.shard_dim >= 0) {
    const int d = e.shard_dim;
    b.start[static_cast<std::size_t>(d)] = e.shard_begin;
    b.shape[static_cast<std::size_t>(d)] =
        std::clamp<std::int64_t>(e.full[d] - e.shard_begin, 0, e.shp[d]);
  }
  return b;
}

namespace detail {

/// The regions of optimizer `opt`'s statistics of layout entry `e`, stored
/// as tensor `name` (e.name, or the tensor a tied copy is of; box `box`,
/// its first element `first` of the model chunk's flat buffer), where
/// `owned` ([lo, hi) of the flat buffer from state element `state`) meets
/// it: what this rank holds, or (`writing`) writes (file comment).
template <class Optimizer, class Owned>
void add_statistics(std::vector<state_region>& out, Optimizer& opt, const nn::param_entry& e,
                    const std::string& name, const index_box& box, std::int64_t first,
                    const std::vector<Owned>& owned, const char* dtype, bool writing) {
  // One an element, split as the tensor is (optim::muon's, `along` -2):
  // every owned piece of the box, as the optimizer's state buffers.
  const std::int64_t n = box.numel();
  for (const Owned& r : owned) {
    const std::int64_t a = std::max(r.lo, first), b = std::min(r.hi, first + n);
    if (a >= b) continue;
    for (const auto& st : opt.statistics_of(r.state + (a - r.lo)))
      if (st.along == -2) out.push_back({name, st.role, dtype, box, a - first, b - first, st.data});
  }
  // Of the whole matrix: held by every rank holding a part of it, written
  // by the one holding its first element on tp shard 0.
  const std::int64_t numel = e.numel;
  for (const Owned& r : owned) {
    const std::int64_t a = std::max(r.lo, first), b = std::min(r.hi, first + numel);
    if (writing ? first < r.lo || first >= r.hi : a >= b) continue;
    if (writing && e.shard_dim >= 0 && e.shard_begin != 0) return;
    for (const auto& st : opt.statistics_of(r.state + (a - r.lo))) {
      if (st.along == -2) continue;  // above
      index_box b1;
      b1.start = {0};
      b1.shape = {st.count};
      out.push_back({name + "." + st.role, st.role, dtype, b1, 0, st.count, st.data,
                     std::vector<std::int64_t>{st.count}});
    }
    return;
  }
}

}  // namespace detail

/// The regions of `engine`'s chunk (a parallel::data_parallel over an
/// nn::llama or a stage of one) that this rank holds (`writing` false: what
/// a load fills) or writes (`writing` true: each element of the model once
/// over the mesh; table in the file comment). `dp_rank` and `dp` are the
/// engine's group, `tp_rank` this rank's index in the tensor-parallel group.
template <class Engine>
std::vector<state_region> state_regions(Engine& engine, bool writing, int tp_rank) {
  using S = typename Engine::sharding_type;
  using Param = typename Engine::Param;
  using Master = typename Engine::Master;
  auto& model = engine.model();
  const auto& plan = engine.plan();
  const std::int64_t dp = plan.dp(), dp_rank = plan.rank();
  // The model's flat buffer is [lo, lo + F) of the whole layout (a stage's part).
  const std::int64_t lo = model.flat_begin(), F = model.flat_size();
  // This rank's ranges [lo, hi) of the flat buffer, each with the state
  // element of its first (the optimizer's own order).
  struct owned_range {
    std::int64_t lo, hi, state;
  };
  std::vector<owned_range> state_owned;
  if constexpr (!S::shards_optimizer_state) {
    if (writing)
      state_owned.push_back({F * dp_rank / dp, F * (dp_rank + 1) / dp, F * dp_rank / dp});
    else
      state_owned.push_back({0, F, 0});
  } else {
    for (std::size_t k = 0; k < plan.size(); ++k) {
      const auto [a, b] = plan.owned(k);
      if (a < b) state_owned.push_back({a, b, plan.buckets()[k].shard_offset});
    }
  }
  // The parameters: in the state's order in ZeRO-3's shard, else the flat buffer.
  const std::vector<owned_range> param_owned =
      S::shards_parameters || writing ? state_owned : std::vector<owned_range>{{0, F, 0}};
  Param* params = S::shards_parameters ? engine.param_shard() : model.params();
  const auto buffers = engine.optimizer().state_buffers();

  std::vector<state_region> out;
  for (const nn::param_entry& e : model.layout().entries()) {
    if (e.offset < lo || e.offset >= lo + F) continue;  // another stage's
    if (writing && (e.shard_dim < 0 ? tp_rank != 0 : e.replica != 0)) continue;
    if (writing && !e.tied.empty()) continue;  // a tied copy: its tensor is written where it lives
    const std::string& name = e.tied.empty() ? e.name : e.tied;
    const index_box box = global_box(e);
    const std::int64_t n = box.numel(), first = e.offset - lo;
    if (n == 0) continue;
    // Elements [first, first + n) of the flat buffer, where `ranges` meet them.
    auto add = [&](const std::vector<owned_range>& ranges, const char* role, const char* dtype,
                   auto* base, bool state_order) {
      for (const owned_range& r : ranges) {
        const std::int64_t a = std::max(r.lo, first), b = std::min(r.hi, first + n);
        if (a >= b) continue;
        const std::int64_t at = state_order ? r.state + (a - r.lo) : a;
        out.push_back({name, role, dtype, box, a - first, b - first, base + at});
      }
    };
    add(param_owned, "param", dtype_name<Param>(), params, S::shards_parameters);
    for (const auto& sb : buffers) add(state_owned, sb.role, dtype_name<Master>(), sb.data, true);
    if constexpr (requires { engine.optimizer().statistics_of(std::int64_t{}); })
      detail::add_statistics(out, engine.optimizer(), e, name, box, first, state_owned,
                             dtype_name<Master>(), writing);
  }
  return out;
}

/// Adds the regions this rank writes of `engine`'s chunk to `file` (each
/// staged from the context's memory through the writer's host blocks) and
/// their tensors, with global shapes and element types, to `tensors`.
template <class Engine>
void add_state_pieces(rank_file& file, std::map<std::string, stored_tensor>& tensors,
                      Engine& engine, int tp_rank) {
  const auto& ctx = engine.model().context();
  const nn::param_layout& layout = engine.model().layout();
  for (const state_region& r : state_regions(engine, true, tp_rank)) {
    stored_tensor& t = tensors[r.tensor];
    if (!r.shape.empty()) {
      t.shape = r.shape;
    } else {
      const nn::param_entry& e = layout.at(r.tensor);
      t.shape.assign(e.full.dims.begin(), e.full.dims.begin() + e.full.rank);
    }
    t.roles[r.role] = r.dtype;
    const char* src = static_cast<const char*>(r.data);
    file.add(
        {r.tensor, r.role, r.box, r.flat_begin, r.flat_end, 0, 0}, r.bytes(),
        [&ctx, src](std::size_t at, void* dst, std::size_t n) { ctx.to_host(dst, src + at, n); });
  }
}

/// Fills every region of `engine`'s chunk this rank holds from the
/// checkpoint `rd`, through a host buffer, and sets the optimizer's step
/// count to `steps`. Throws io_error for a tensor or role the checkpoint
/// lacks or stores in another element type (naming both), or elements no
/// piece holds (checkpoint_index::plan_region); nothing of the optimizer's
/// step count changes then, but state read before the error has been
/// written: the caller agrees the failure and discards the run.
template <class Engine>
void load_state(checkpoint_reader& rd, Engine& engine, int tp_rank, std::int64_t steps) {
  const auto& ctx = engine.model().context();
  std::vector<char> host;
  for (const state_region& r : state_regions(engine, false, tp_rank)) {
    const auto t = rd.index().tensors.find(r.tensor);
    TESSERA_THROW_IF(t == rd.index().tensors.end(), io_error, "checkpoint '", rd.folder().string(),
                     "' has no tensor '", r.tensor, "'");
    const auto role = t->second.roles.find(r.role);
    TESSERA_THROW_IF(role == t->second.roles.end(), io_error, "checkpoint '", rd.folder().string(),
                     "' stores no ", r.role, " of '", r.tensor, "' (this run keeps it)");
    TESSERA_THROW_IF(role->second != r.dtype, io_error, "checkpoint '", rd.folder().string(),
                     "' stores ", r.role, " of '", r.tensor, "' as ", role->second,
                     "; this run keeps it as ", r.dtype);
    // A whole matrix's statistic; an older tessera's per tp shard (S, count)
    // reads as the whole at S = 1.
    index_box box = r.box;
    if (!r.shape.empty() && t->second.shape != r.shape) {
      const std::vector<std::int64_t>& had = t->second.shape;
      TESSERA_THROW_IF(had.size() != 2 || had[1] != r.shape[0] || had[0] != 1, io_error,
                       "checkpoint '", rd.folder().string(), "' stores '", r.tensor,
                       "' per tensor-parallel shard (", had.empty() ? 0 : had[0],
                       " shards, an older tessera's layout), not the whole matrix's ", r.shape[0],
                       ": resume it with the tessera that wrote it");
      box.start = {0, 0};
      box.shape = {1, r.shape[0]};
    }
    host.resize(r.bytes());
    rd.read(r.tensor, r.role, box, r.flat_begin, r.flat_end, host.data());
    ctx.from_host(r.data, host.data(), host.size());
  }
  engine.optimizer().restore_steps(steps);
}

}  // namespace tessera::train
