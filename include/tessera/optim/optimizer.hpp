#pragma once
/// \file optim/optimizer.hpp
/// Optimizers as policies (DESIGN.md, "Key types"): a policy is a small tag
/// struct naming its hyper-parameters (`config`) and the optimizer it
/// builds for a parameter, gradient and master type on an execution
/// context (`state<Param, Grad, Master, Ctx>`), so a trainer swaps
/// optimizers by one template argument: `optim::adamw`, `optim::sgd`.
///
/// Every optimizer updates a flat buffer of n elements through the
/// context's kernels (kernels/optimizer.hpp): one multi-tensor pass over a
/// segment table, master weights when Param is narrower than Master, its
/// state allocated when it is built (so the memory floor is visible before
/// step 0), and the clip coefficient read from the context's memory (no
/// host synchronisation on a GPU; a non-finite one skips the step inside
/// the kernel).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/kernels/context.hpp"
#include "tessera/kernels/detail/adamw.hpp"
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
concept optimizer_policy =
    requires {
      { O::name } -> std::convertible_to<const char*>;
      typename O::config;
      typename O::template state<float, float, float, kernels::host_context>;
    } &&
    optimizer_state<typename O::template state<float, float, float, kernels::host_context>, float,
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

namespace detail {

/// The segment table of an optimizer over `n` elements, in the context's
/// memory: one segment per range, decay only where the range decays and
/// the decay coefficient is non-zero. Throws config_error if the ranges
/// are not sorted and disjoint (an element would be updated twice).
template <class Ctx>
tensor<kernels::optimizer_segment, typename Ctx::backend_type> segment_table(
    const Ctx& ctx, const std::vector<param_range>& ranges, std::int64_t n, bool decays) {
  std::vector<kernels::optimizer_segment> segs;
  for (std::size_t i = 1; i < ranges.size(); ++i)
    TESSERA_THROW_IF(ranges[i].begin < ranges[i - 1].end, config_error,
                     "optimizer ranges must be sorted and disjoint: [", ranges[i].begin, ", ",
                     ranges[i].end, ") starts before the end ", ranges[i - 1].end,
                     " of the range before it");
  for (const param_range& r : clip_ranges(ranges, 0, n))
    segs.push_back({r.begin, r.end, r.decay && decays ? 1 : 0});
  auto t = kernels::make_tensor<kernels::optimizer_segment>(ctx,
                                                           static_cast<std::int64_t>(segs.size()));
  ctx.from_host(t.data(), segs.data(), segs.size() * sizeof(kernels::optimizer_segment));
  return t;
}

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
}  // namespace tessera::optim
