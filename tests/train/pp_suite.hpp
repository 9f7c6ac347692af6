#pragma once
// Multi-rank bodies for train::trainer on a dp x tp x pp mesh (tp fastest,
// then dp, then pp: Megatron order), written once and run under
// local_communicator (tests/train/pipeline.cpp) and mpi_communicator
// (tests/mpi/pipeline.cpp). Bodies throw zero_suite::suite_failure.
//
// Every rank trains five AdamW steps (or another optimizer policy's, the
// template argument O) with gradient accumulation (G = M dp
// sequences, B = 1, so M micro-batches per step go through the pipeline)
// on a tiny-shaped model of 4 layers, and is held against the single-rank
// trainer: the loss and the gradient norm of every step, every gradient of
// each of its chunks before clipping (gathered over dp) after every step,
// at `tol` relative (of each tensor's largest entry), and every parameter
// after the last at `tol` times the steps.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/parallel/pipeline_schedule.hpp>

#include "tp_suite.hpp"
#include "trainer_suite.hpp"

namespace pp_suite {

using namespace tessera;
using zero_suite::check;

/// The tiny preset with `layers` blocks (4: pp 4, or pp 2 with 2 virtual
/// stages; 8: pp 4 with 2), its embeddings tied if `tied`.
inline nn::llama_config model(std::int64_t layers = 4, bool tied = false) {
  auto c = trainer_suite::model();
  c.n_layers = layers;
  c.tie_word_embeddings = tied;
  return c;
}

/// One layout and schedule of a run.
struct layout {
  int dp = 1, tp = 1, pp = 1;
  int cp = 1;                             ///< context parallelism (each sequence over cp ranks)
  nn::cp_kind cp_kind = nn::cp_kind::ring;  ///< how attention runs over the cp group
  parallel::schedule_kind schedule = parallel::schedule_kind::one_f_one_b;
  int virtual_stages = 1;
  std::int64_t micro_batches = 8;  ///< M per step and dp rank
  bool sequence_parallel = false;
  std::int64_t layers = 4;  ///< the model's blocks (pp_suite::model)
  bool tied = false;        ///< tied embeddings (llama_config::tie_word_embeddings)
  /// Packed documents: the separator id (train_config::document_separator), or none.
  std::optional<std::int32_t> document_separator{};
  /// Ranks of the mesh: dp cp tp pp.
  int ranks() const { return dp * cp * tp * pp; }
  std::string name() const {
    const std::string c =
        cp == 1 ? "" : tessera::detail::str("cp ", cp, " ", nn::to_string(cp_kind), " ");
    return tessera::detail::str("(dp, tp, pp) = (", dp, ", ", tp, ", ", pp, ") ", c,
                                parallel::to_string(schedule), " V ", virtual_stages, " M ",
                                micro_batches, sequence_parallel ? " sp" : "", " L ", layers,
                                tied ? " tied" : "", document_separator ? " documents" : "");
  }
};

/// A (dp, tp, pp) mesh of `schedule` with V chunks a rank and four
/// micro-batches per dp rank: the layout the optimizer, Muon and
/// packed-document suites hold to one rank.
inline layout mesh(int dp, int tp, int pp,
                   parallel::schedule_kind schedule = parallel::schedule_kind::one_f_one_b,
                   int V = 1) {
  layout l;
  l.dp = dp;
  l.tp = tp;
  l.pp = pp;
  l.schedule = schedule;
  l.virtual_stages = V;
  l.micro_batches = 4;
  return l;
}

/// Communicator options of a threaded test: a timeout of `seconds`, so a
/// rank left waiting fails the test instead of hanging it.
inline comm::comm_options test_options(int seconds = 120) {
  comm::comm_options o;
  o.timeout = std::chrono::seconds(seconds);
  return o;
}

/// The run's settings (see the file comment).
inline train::train_config config(const layout& l, std::int64_t steps) {
  train::train_config t = trainer_suite::config(l.dp);
  t.steps = steps;
  t.micro_batch = 1;
  t.global_batch = l.micro_batches * l.dp;
  t.tp = l.tp;
  t.pp = l.pp;
  t.cp = l.cp;
  t.cp_kind = l.cp_kind;
  t.pipeline = l.schedule;
  t.virtual_stages = l.virtual_stages;
  t.sequence_parallel = l.sequence_parallel;
  t.document_separator = l.document_separator;
  t.adamw.eps = 1e-6;  // as tp_suite: no amplification of rounding by a tiny first update
  // optim::lion's runs decay their matrices too.
  t.lion.weight_decay = 0.1;
  return t;
}

/// The single-rank run every mesh is held against (tp_suite's record).
using tp_suite::reference;

template <class P, class O = optim::adamw>
reference single_rank(const data::token_file& f, std::int64_t steps, std::int64_t G,
                      std::int64_t layers = 4, bool tied = false,
                      std::optional<std::int32_t> document_separator = {}) {
  layout one;
  one.micro_batches = G;
  one.document_separator = document_separator;
  train::trainer<P, host, O> tr(model(layers, tied), config(one, steps), f);
  return tp_suite::record_run(tr, steps);
}

/// `values` (a chunk's flat buffer, from flat_begin) against the reference
/// `want` (the single-rank layout): every tensor of the chunk within `tol`
/// of its largest entry (a tied copy against its tensor), tp padding exactly 0.
template <class M, class T>
void check_chunk(const M& model, const T* values, const std::vector<double>& want,
                 const nn::param_layout& ref_layout, double tol, const std::string& what) {
  const std::int64_t lo = model.flat_begin(), hi = lo + model.flat_size();
  for (const auto& e : model.layout().entries()) {
    if (e.offset < lo || e.offset >= hi) continue;
    const auto& r = ref_layout.at(e.tied.empty() ? e.name : e.tied);
    double worst = 0, scale = 0;
    for (std::int64_t j = 0; j < e.numel; ++j) {
      const double a = tessera::to<double>(values[e.offset - lo + j]);
      if (e.full_index(j) >= e.full.numel()) {
        check(a == 0, what, ": ", e.name, " padding holds ", a);
        continue;
      }
      const double b = want[static_cast<std::size_t>(r.offset + e.full_index(j))];
      worst = std::max(worst, std::fabs(a - b));
      scale = std::max(scale, std::fabs(b));
    }
    check(worst <= tol * scale, what, ": ", e.name, " differs from one rank's by ", worst, " of ",
          scale);
  }
}

/// One rank of the mesh `l` on `world` (dp tp pp ranks): trains as the
/// reference did and checks everything the file comment lists.
template <class P, class S, class O = optim::adamw, class Comm>
void check_mesh(Comm& world, const reference& ref, const data::token_file& f, const layout& l,
                double tol_) {
  // float32 under tp: the tp ranks' partial sums round in another order; on
  // the 4-block model block 0's wq gradient (1e-4 of the largest gradients)
  // moves by 1.4e-5 of its own largest entry at step 2, the same bits with
  // and without the pipeline (tp 2 alone gives them): 2 tol there.
  const double tol = l.tp > 1 && sizeof(typename P::param_type) == 4 ? 2 * tol_ : tol_;
  using tp_layers = nn::tensor_parallel_layers<Comm>;
  const auto steps = static_cast<std::int64_t>(ref.loss.size());
  const comm::device_mesh mesh(
      comm::mesh_degrees{.dp = l.dp, .cp = l.cp, .tp = l.tp, .pp = l.pp});
  auto g = comm::make_groups(world, mesh);
  const train::train_config cfg = config(l, steps);
  const auto where = [&] {
    return l.name() + " " + S::name + " world rank " + std::to_string(world.rank());
  };
  auto body = [&](auto& tr) {
    check(tr.pp_rank() == mesh.coord(world.rank()).pp, where(), ": stage ", tr.pp_rank());
    check(tr.chunks() == l.virtual_stages, where(), ": ", tr.chunks(), " chunks");
    const std::int64_t grad_steps = sizeof(typename P::param_type) == 2 ? 1 : steps;
    for (std::int64_t s = 0; s < steps; ++s) {
      const auto m = tr.train_step();
      const auto u = static_cast<std::size_t>(s);
      check(std::fabs(m.loss - ref.loss[u]) <= tol * ref.loss[u], where(), " step ", s + 1,
            ": loss ", m.loss, " vs one rank's ", ref.loss[u]);
      check(std::fabs(m.grad_norm - ref.norm[u]) <= tol * ref.norm[u], where(), " step ", s + 1,
            ": gradient norm ", m.grad_norm, " vs one rank's ", ref.norm[u]);
      // Every gathered segment (zero<3>) is freed within the step, so none
      // carries parameters of before the update into the next one; and a
      // chunk holds at most two at once (the one in use, the one prefetched)
      // under every schedule, B of a split backward included; three when
      // the head reads the tied embedding's segment beside its own.
      for (int c = 0; c < tr.chunks(); ++c) {
        const std::size_t most = tr.model(c).head_reads_embedding() ? 3 : 2;
        check(tr.engine(c).segments_held() == 0, where(), " step ", s + 1, " chunk ", c, ": ",
              tr.engine(c).segments_held(), " gathered segments held after the step");
        check(tr.engine(c).max_segments_held() <= most, where(), " step ", s + 1, " chunk ", c,
              ": ", tr.engine(c).max_segments_held(), " gathered segments held at once");
      }
      if (s >= grad_steps) continue;
      for (int c = 0; c < tr.chunks(); ++c) {
        std::vector<typename P::grad_type> full(static_cast<std::size_t>(tr.model(c).flat_size()));
        tr.engine(c).full_grads(full.data());
        check_chunk(tr.model(c), full.data(), ref.grads[u], ref.layout, tol,
                    tessera::detail::str(where(), " step ", s + 1, " chunk ", c, " gradient"));
      }
    }
    // The parameters carry every step's update: AdamW's m / sqrt(v) turns
    // each step's gradient rounding into parameter rounding, which adds up
    // over the steps (float32 under tp reached 1.4e-5 after five).
    // Tied embeddings under a pipeline: the first stage's embedding and
    // the last stage's copy (the chunks' shared_tied_range) hold the same
    // bits after the steps, gathered over the pp group (other stages send
    // zeros).
    const std::int64_t tied_n = l.tied && l.pp > 1 ? tr.model(0).layout().at("embedding").numel : 0;
    std::vector<double> tied(static_cast<std::size_t>(tied_n), 0.0);
    for (int c = 0; c < tr.chunks(); ++c) {
      std::vector<typename P::param_type> full(static_cast<std::size_t>(tr.model(c).flat_size()));
      tr.engine(c).full_params(full.data());
      check_chunk(tr.model(c), full.data(), ref.params, ref.layout,
                  tol * static_cast<double>(steps),
                  tessera::detail::str(where(), " chunk ", c, " parameters"));
      const nn::param_range r = tr.model(c).shared_tied_range();
      if (tied_n > 0 && r.end > r.begin) {
        check(r.end - r.begin == tied_n, where(), ": the tied range holds ", r.end - r.begin);
        for (std::int64_t j = 0; j < tied_n; ++j)
          tied[static_cast<std::size_t>(j)] =
              tessera::to<double>(full[static_cast<std::size_t>(r.begin + j)]);
      }
    }
    if (tied_n > 0) {
      std::vector<double> all(tied.size() * static_cast<std::size_t>(l.pp));
      g.pp.all_gather(tied.data(), all.data(), tied.size());
      const double* last = all.data() + (l.pp - 1) * tied.size();
      std::int64_t differ = 0, nonzero = 0;
      for (std::size_t j = 0; j < tied.size(); ++j) {
        differ += std::memcmp(&all[j], &last[j], sizeof(double)) != 0;
        nonzero += all[j] != 0;
      }
      check(differ == 0 && nonzero > tied_n / 2, where(),
            ": the last stage's tied copy differs from the first stage's embedding in ", differ,
            " of ", tied_n, " elements (", nonzero, " nonzero)");
    }
  };
  if (l.tp > 1) {
    train::trainer<P, host, O, S, Comm, tp_layers> tr(
        model(l.layers, l.tied), cfg, f, parallel::layout{g, tp_layers{&g.tp}});
    body(tr);
  } else {
    train::trainer<P, host, O, S, Comm> tr(model(l.layers, l.tied), cfg, f,
                                           parallel::layout{g, nn::dense_layers{}});
    body(tr);
  }
}

}  // namespace pp_suite
