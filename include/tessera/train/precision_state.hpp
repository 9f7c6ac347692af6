#pragma once
/// \file train/precision_state.hpp
/// What a precision policy keeps beyond the tensors, in a checkpoint's run
/// state (docs/checkpoints.md): the loss scaler of a loss-scaled policy
/// (precision::fp16_mixed: its settings, compared on resume, and its
/// state) and the FP8 scales of an FP8 policy (precision::fp8_mixed: the
/// recipe, compared, and every block's linear states by global name,
/// gathered over the pipeline so that world rank 0's run state holds them
/// all and any layout can take its own blocks back).

#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/nn/fp8_linear.hpp"
#include "tessera/parallel/layout.hpp"
#include "tessera/precision/policy.hpp"
#include "tessera/train/agree.hpp"
#include "tessera/train/config.hpp"

namespace tessera::train {

/// Adds policy `P`'s settings to a checkpoint's metadata `m`: "loss_scale"
/// and "loss_scaler_state" with a loss scaler (`scaler` not null), "fp8"
/// (the recipe) under an FP8 policy.
template <class P>
void add_precision_settings(nlohmann::json& m, const train_config& cfg,
                            const precision::loss_scaler* scaler) {
  if (scaler) {
    m["loss_scale"] = cfg.loss_scale.to_json();
    m["loss_scaler_state"] = scaler->state();
  }
  if constexpr (precision::fp8_linear<P>) m["fp8"] = cfg.fp8.to_json();
}

/// Every block's FP8 linear states (nn::llama::fp8_state of each of this
/// rank's `chunks`) by global name, on every rank: each linear's three
/// scales and histories packed at a fixed place of one vector of the whole
/// model, zero where another stage's blocks go, summed over pp (exact: each
/// value meets only zeros). The tp and dp ranks of a stage hold equal
/// states. Collective over the pp group.
template <class Chunks, class Layout, class Ctx>
nlohmann::json gather_fp8_state(const Chunks& chunks, const Layout& mesh, const Ctx& ctx,
                                const train_config& cfg) {
  const std::int64_t blocks = chunks.model().config().n_layers;
  const std::size_t h = cfg.fp8.scaling == precision::fp8_scaling::delayed
                            ? static_cast<std::size_t>(cfg.fp8.history)
                            : 0;
  const std::size_t per = 1 + h;  // a scale and its history
  const char* ops[3] = {"x", "w", "dy"};
  auto name = [](std::int64_t l, int i) {
    return "blocks." + std::to_string(l) + "." +
           nn::block_linear_names[static_cast<std::size_t>(i)];
  };
  auto at = [&](std::vector<double>& v, std::int64_t l, int i, int o) {
    return v.data() + ((l * nn::block_linears + i) * 3 + o) * per;
  };
  std::vector<double> v(static_cast<std::size_t>(blocks * nn::block_linears) * 3 * per, 0.0);
  for (int c = 0; c < chunks.size(); ++c) {
    const nlohmann::json st = chunks.model(c).fp8_state();
    for (std::int64_t l = 0; l < blocks; ++l)
      for (int i = 0; i < nn::block_linears; ++i) {
        if (!st.contains(name(l, i))) continue;
        for (int o = 0; o < 3; ++o) {
          const nlohmann::json& s = st[name(l, i)][ops[o]];
          double* d = at(v, l, i, o);
          d[0] = s["scale"].get<double>();
          const auto hist = s["amax_history"].get<std::vector<double>>();
          std::copy(hist.begin(), hist.end(), d + 1);
        }
      }
  }
  mesh.reduce(ctx, std::span<double>(v), parallel::axis::pp);
  nlohmann::json out = nlohmann::json::object();
  for (std::int64_t l = 0; l < blocks; ++l)
    for (int i = 0; i < nn::block_linears; ++i) {
      nlohmann::json lin = nlohmann::json::object();
      for (int o = 0; o < 3; ++o) {
        const double* d = at(v, l, i, o);
        nlohmann::json hist = nlohmann::json::array();
        for (std::size_t k = 0; k < h; ++k) hist.push_back(static_cast<float>(d[1 + k]));
        lin[ops[o]] = {{"scale", static_cast<float>(d[0])}, {"amax_history", hist}};
      }
      out[name(l, i)] = lin;
    }
  return out;
}

/// Restores policy `P`'s run state from a loaded checkpoint's run state
/// `run` (its settings were compared with this run's, so the state is
/// there): the loss scaler's (`scaler` not null), every chunk's FP8
/// states. Collective over `mesh` (agreed: a failure on any rank throws on
/// every rank). Throws io_error naming `path` and the state (the linear
/// layer's global name) when it is missing or malformed.
template <class P, class Chunks, class Layout, class Ctx>
void restore_precision_state(const nlohmann::json& run, const std::filesystem::path& path,
                             precision::loss_scaler* scaler, Chunks& chunks, const Layout& mesh,
                             const Ctx& ctx) {
  std::exception_ptr failed;
  try {
    try {
      if (scaler) {
        TESSERA_THROW_IF(!run.contains("loss_scaler_state"), io_error, "it has no "
                         "loss_scaler_state for its ", P::name, " run");
        scaler->restore(run["loss_scaler_state"]);
      }
      if constexpr (precision::fp8_linear<P>) {
        TESSERA_THROW_IF(!run.contains("fp8_state"), io_error, "it has no fp8_state for its ",
                         P::name, " run");
        for (int c = 0; c < chunks.size(); ++c)
          chunks.model(c).restore_fp8_state(run["fp8_state"]);
      }
    } catch (const io_error& e) {
      throw io_error("checkpoint '" + path.string() + "': " + e.what());
    }
  } catch (...) {
    failed = std::current_exception();
  }
  auto world = mesh_reduction(mesh, ctx);
  agree_or_throw(world, mesh.world_rank(), failed,
                 "checkpoint load from '" + path.string() + "'");
}

}  // namespace tessera::train
