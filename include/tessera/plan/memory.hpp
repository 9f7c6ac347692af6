#pragma once
/// \file plan/memory.hpp
/// The memory planner (DESIGN.md, principle 5, "Every byte is accounted"):
/// per-rank bytes of weights, gradients, master weights, optimizer state,
/// the data-parallel engine's reduction buffers and shards, RoPE tables, the
/// ZeRO-3 gathered blocks, and the activations of one micro-batch, computed
/// from the same parameter layout, buckets and saved set the model and
/// engine really allocate. tests/plan/memory.cpp holds these numbers against
/// a host_memory_resource around a real model and optimizer,
/// tests/parallel/memory.cpp against every rank's resource under the
/// data-parallel trainer.
///
/// The model state is planned in plan/state.hpp (two accountings: what the
/// engine allocates, and the ZeRO paper's formula), one micro-batch's
/// activations in plan/activations.hpp, an FP8 policy's operand copies and
/// scales in plan/fp8.hpp; memory_plan adds them up.
///
/// All figures are bytes unless a name says otherwise; GiB = 2^30 bytes.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/kernels/cuda/launch.hpp"
#include "tessera/plan/activations.hpp"
#include "tessera/plan/fp8.hpp"
#include "tessera/plan/state.hpp"

namespace tessera::plan {

struct memory_plan {
  std::string model;   ///< preset name
  dtype_sizes dtypes;  ///< precision
  optimizer_spec optimizer;
  sharding strategy;
  activation_options shape;
  state_plan state;
  activation_plan activations;
  std::uint64_t trainer = 0;  ///< trainer_bytes: the loader's buffers and the step's scalars
  /// Backend buffers of the context: the cuBLASLt workspace on a GPU, 0 on the host.
  std::uint64_t context = 0;
  /// cuda: the gradient norm kernel's scratch (after the backward); 0 on the host.
  std::uint64_t norm_scratch = 0;
  /// An FP8 policy's scalars, state and operand copies of every block
  /// (plan_fp8; zero otherwise). The scalars are in the memory resource; on
  /// the host the state and the grow-only operand copies are heap memory
  /// outside it (fp8_plan::outside_resource), on a GPU the operand copies
  /// are one GEMM's scratch (fp8_plan::transient).
  fp8_plan fp8{};

  /// Everything allocated between steps: the state, the trainer's and the
  /// context's buffers, and the FP8 scalars (and the host's FP8 state and copies).
  std::uint64_t persistent() const {
    return state.persistent() + trainer + context + fp8.persistent();
  }
  /// Predicted per-rank peak: the persistent bytes plus the larger of
  /// backward's (gathered units + reduction staging + activation peak) and
  /// the step's update all-gather or norm scratch (which run after the
  /// activations are freed), plus a GPU's FP8 operand copies (one GEMM's:
  /// counted as if at the peak, an upper bound).
  std::uint64_t total() const {
    return persistent() +
           std::max({state.gathered + state.reduce_staging + activations.peak,
                     state.update_gather, norm_scratch}) +
           fp8.transient();
  }

  /// Rows (label, bytes) in table order: the persistent state, the
  /// transients, then the totals. Under an FP8 policy "fp8 scalars" (and on
  /// the host "fp8 state" and "fp8 operand copies") come before
  /// "persistent"; on a GPU "fp8 operand copies" comes after "activation
  /// peak", with the transients.
  std::vector<std::pair<std::string, std::uint64_t>> rows() const {
    std::vector<std::pair<std::string, std::uint64_t>> r = {
        {"weights", state.weights},
        {"parameter shard", state.param_shard},
        {"gradients", state.grads},
        {"reduction buffers", state.reduce_buffers},
        {"master weights", state.master},
        {"optimizer state", state.optimizer},
        {"optimizer segments", state.segment_table},
        {"rope tables", state.rope_tables},
        {"trainer buffers", trainer},
        {"context (cuBLASLt)", context}};
    if (dtypes.fp8_linear) {
      r.push_back({"fp8 scalars", fp8.scalars});
      if (fp8.backend == backend_kind::host) {
        r.push_back({"fp8 state", fp8.state});
        r.push_back({"fp8 operand copies", fp8.operands});
      }
    }
    r.insert(r.end(), {{"persistent", persistent()},
                       {"zero-3 gathered", state.gathered},
                       {"reduction staging", state.reduce_staging},
                       {"update all-gather", state.update_gather},
                       {"activations (saved)", activations.saved},
                       {"logits workspace", activations.logits_workspace},
                       {"activation peak", activations.peak}});
    if (dtypes.fp8_linear && fp8.backend != backend_kind::host)
      r.push_back({"fp8 operand copies", fp8.operands});
    r.push_back({"total", total()});
    return r;
  }
  /// Under an FP8 policy, one line (no newline) saying what the two FP8
  /// rows count on this plan's backend; empty otherwise.
  std::string fp8_note() const {
    if (!dtypes.fp8_linear) return {};
    const auto& e = fp8.largest;
    if (fp8.backend == backend_kind::host)
      return tessera::detail::str(
          "(fp8: ", fp8.blocks, " blocks x ", nn::block_linears, " linears, ",
          precision::to_string(fp8.recipe.scaling), " scaling",
          fp8.recipe.scaling == precision::fp8_scaling::delayed
              ? tessera::detail::str(", amax history ", fp8.recipe.history)
              : std::string(),
          ": ", nn::fp8_linear_scalars,
          " scalars each in the memory resource; a scale per x, W, dy",
          fp8.recipe.scaling == precision::fp8_scaling::delayed ? " and its history" : "",
          " and float copies of the largest x (", e.x, "), W (", e.w, ") and dy (", e.dy,
          " elements) in the heap, outside it)");
    return tessera::detail::str("(fp8: ", fp8.blocks, " blocks x ", nn::block_linears,
                                " linears x ", nn::fp8_linear_scalars,
                                " device floats; one GEMM's one-byte operand copies at the "
                                "largest, ", e.gemm, " elements, while it runs "
                                "(plan::fp8_operand_bytes); the amax histories stay on the host)");
  }
  /// Fixed-width text table: item, bytes, GiB; then the 34sbh comparison line.
  std::string to_table() const {
    std::string s;
    char line[160];
    std::snprintf(
        line, sizeof line, "%s %s, %s, zero-%d, dp=%d, B=%lld, T=%lld (per rank, %s)\n",
        model.c_str(), dtypes.name.c_str(), optimizer.name.c_str(), strategy.zero, strategy.dp,
        static_cast<long long>(shape.micro_batch),
        static_cast<long long>(activations.tokens / std::max<std::int64_t>(1, shape.micro_batch)),
        state.mode == accounting::engine ? "engine" : "ideal");
    s += line;
    for (const auto& [k, v] : rows()) {
      if (k == "persistent" || k == "zero-3 gathered" || k == "activations (saved)" || k == "total")
        s += std::string(56, '-') + "\n";
      std::snprintf(line, sizeof line, "  %-22s %18llu B %10.2f GiB\n", k.c_str(),
                    static_cast<unsigned long long>(v), static_cast<double>(v) / gib);
      s += line;
    }
    std::snprintf(line, sizeof line,
                  "  (activation peak includes backward temporaries %.2f GiB; Korthikanti 34sbh "
                  "estimate %.2f GiB)\n",
                  static_cast<double>(activations.backward_temporaries) / gib,
                  static_cast<double>(activations.korthikanti_34sbh) / gib);
    s += line;
    if (dtypes.fp8_linear) s += "  " + fp8_note() + "\n";
    return s;
  }
  /// Every field, in bytes, as JSON.
  nlohmann::json to_json() const {
    nlohmann::json j;
    j["model"] = model;
    j["precision"] = dtypes.name;
    j["optimizer"] = optimizer.name;
    j["zero"] = strategy.zero;
    j["dp"] = strategy.dp;
    j["accounting"] = state.mode == accounting::engine ? "engine" : "ideal";
    j["bucket_bytes"] = strategy.bucket_bytes;
    j["micro_batch"] = shape.micro_batch;
    j["tokens"] = activations.tokens;
    j["num_params"] = state.num_params;
    j["flat_elems"] = state.flat_elems;
    j["padded_elems"] = state.padded_elems;
    j["shard_elems"] = state.shard_elems;
    j["buckets"] = state.buckets;
    j["state"] = {{"weights", state.weights},
                  {"param_shard", state.param_shard},
                  {"grads", state.grads},
                  {"reduce_buffers", state.reduce_buffers},
                  {"master", state.master},
                  {"optimizer", state.optimizer},
                  {"rope_tables", state.rope_tables},
                  {"gathered", state.gathered},
                  {"reduce_staging", state.reduce_staging},
                  {"update_gather", state.update_gather},
                  {"model_state", state.model_state()},
                  {"persistent", state.persistent()},
                  {"total", state.total()}};
    j["activations"] = {{"saved", activations.saved},
                        {"forward_temporaries", activations.forward_temporaries},
                        {"logits_workspace", activations.logits_workspace},
                        {"backward_temporaries", activations.backward_temporaries},
                        {"attention_scratch", activations.attention_scratch},
                        {"peak", activations.peak},
                        {"host_gemm_workspace", activations.host_gemm_workspace},
                        {"korthikanti_34sbh", activations.korthikanti_34sbh}};
    if (dtypes.fp8_linear)
      j["fp8"] = {{"backend", fp8.backend == backend_kind::host ? "host" : "cuda"},
                  {"recipe", fp8.recipe.to_json()},
                  {"blocks", fp8.blocks},
                  {"scalars", fp8.scalars},
                  {"state", fp8.state},
                  {"operands", fp8.operands},
                  {"largest_operand_elems",
                   {{"x", fp8.largest.x},
                    {"w", fp8.largest.w},
                    {"dy", fp8.largest.dy},
                    {"gemm", fp8.largest.gemm}}},
                  {"total", fp8.total()}};
    j["total"] = total();
    return j;
  }
};

/// Plans model state (under `mode`; default: what the engine allocates),
/// one micro-batch's activations and, under an FP8 policy (d.fp8_linear),
/// the FP8 operand copies and scales of every block (plan_fp8 on tp rank
/// sh.tp_rank, recipe a.model.fp8) for `c`. Throws config_error for an
/// invalid config, sharding, micro-batch shape or FP8 recipe.
inline memory_plan plan_memory(const nn::llama_config& c, const dtype_sizes& d,
                               const optimizer_spec& o, const sharding& sh,
                               const activation_options& a, accounting mode = accounting::engine) {
  memory_plan m{c.name, d, o, sh, a, plan_state(c, d, o, sh, mode), plan_activations(c, d, a)};
  // the loader's slots hold a rank's tokens: T/cp under context parallelism
  const std::int64_t T = (a.seq > 0 ? a.seq : c.max_seq) / std::max(1, a.cp);
  m.trainer = trainer_bytes(a, T, d);
  if (a.backend == backend_kind::cuda) {
    m.context = a.cublaslt_workspace;
    const std::int64_t n = sh.zero >= 1 ? m.state.shard_elems : m.state.flat_elems;
    m.norm_scratch = kernels::cuda::grad_sum_squares_scratch_bytes(n);
  }
  m.fp8 = plan_fp8(c, d, a, {sh.tp, sh.tp_rank}, c.n_layers);
  return m;
}

}  // namespace tessera::plan
