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
/// optim::muon's momentum_buffer and AdamW moments), as a role of the
/// tensor held and written where its elements are, like the state buffers;
/// and statistics of whole tensors (optim::adafactor's): a vector's one-an-element statistic as a
/// role of the tensor ("exp_avg_sq"), a matrix's row and column statistics as tensors of their own,
/// "<name>.exp_avg_sq_row" of shape (S, rows) and
/// "<name>.exp_avg_sq_col" of shape (S, cols), row q the statistics of tp
/// shard q of S (S = 1 for a whole matrix: a split matrix's shards are
/// matrices of their own, so their statistics are per shard and a resume at
/// another tp is refused for them). Written by the dp rank that writes the
/// tensor's first element, held by every rank that holds the tensor.

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
/// its first element `first` of the model chunk's flat buffer) when
/// one of `owned` ([lo, hi) of the flat buffer from state element `state`)
/// holds that first element (file comment).
template <class Optimizer, class Owned>
void add_statistics(std::vector<state_region>& out, Optimizer& opt, const nn::param_entry& e,
                    const std::string& name, const index_box& box, std::int64_t first,
                    const std::vector<Owned>& owned, const char* dtype) {
  // One an element, split as the tensor is (optim::muon's, `along` -2):
  // every owned piece of the box, as the optimizer's state buffers.
  const std::int64_t n = box.numel();
  for (const Owned& r : owned) {
    const std::int64_t a = std::max(r.lo, first), b = std::min(r.hi, first + n);
    if (a >= b) continue;
    for (const auto& st : opt.statistics_of(r.state + (a - r.lo)))
      if (st.along == -2) out.push_back({name, st.role, dtype, box, a - first, b - first, st.data});
  }
  for (const Owned& r : owned) {
    if (first < r.lo || first >= r.hi) continue;
    const int d = e.shard_dim;
    const std::int64_t S = d < 0 ? 1 : (e.full[d] + e.shp[d] - 1) / e.shp[d];
    const std::int64_t q = d < 0 ? 0 : e.shard_begin / e.shp[d];
    for (const auto& st : opt.statistics_of(r.state + (first - r.lo))) {
      if (st.along == -2) continue;  // above
      if (st.along < 0) {
        out.push_back({name, st.role, dtype, box, 0, box.numel(), st.data});
        continue;
      }
      index_box b;
      b.start = {q, 0};
      b.shape = {1, st.count};
      out.push_back({name + "." + st.role, st.role, dtype, b, 0, st.count, st.data,
                     std::vector<std::int64_t>{S, st.count}});
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
                             dtype_name<Master>());
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
    TESSERA_THROW_IF(!r.shape.empty() && t->second.shape != r.shape, io_error, "checkpoint '",
                     rd.folder().string(), "' stores '", r.tensor, "' for ",
                     t->second.shape.empty() ? 0 : t->second.shape[0],
                     " tp shard(s) of its matrix; this run splits it into ", r.shape[0],
                     ": an optimizer's statistics of a split matrix are per shard, so resume at "
                     "the tensor-parallel degree that wrote it");
    host.resize(r.bytes());
    rd.read(r.tensor, r.role, r.box, r.flat_begin, r.flat_end, host.data());
    ctx.from_host(r.data, host.data(), host.size());
  }
  engine.optimizer().restore_steps(steps);
}

}  // namespace tessera::train
