#pragma once
/// \file train/validate.hpp
/// Every check a training run must pass before anything is allocated, in
/// one place: the trainer runs it in its constructor, and a program runs it
/// before it starts its ranks (a bad configuration then fails at once, on
/// the launching thread, not inside dp x tp x pp rank threads or
/// processes). DESIGN.md principle 8: each refusal names the values and
/// the limit.

#include <algorithm>
#include <cstdint>

#include "tessera/core/checked.hpp"
#include "tessera/core/error.hpp"
#include "tessera/data/sampler.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/parallel/executor.hpp"
#include "tessera/parallel/pipeline_partition.hpp"
#include "tessera/parallel/pipeline_schedule.hpp"
#include "tessera/parallel/sharding.hpp"
#include "tessera/parallel/zero.hpp"
#include "tessera/precision/policy.hpp"
#include "tessera/train/config.hpp"

namespace tessera::train {

/// The most micro-batches one rank runs per optimizer step (G / (B dp)):
/// 2^20, far above any gradient accumulation in use (thousands), and a bound
/// on the step's action list and loss scalars.
inline constexpr std::int64_t max_micro_batches = std::int64_t{1} << 20;

/// A layout's degrees: anything with dp(), tp() and pp(), and cp() when it
/// has context parallelism (parallel::layout over its groups, or
/// comm::device_mesh before any group exists).
template <class M>
concept has_mesh_degrees = requires(const M& m) {
  { m.dp() } -> std::convertible_to<int>;
  { m.tp() } -> std::convertible_to<int>;
  { m.pp() } -> std::convertible_to<int>;
};

/// Tokens of the training data searched for the document separator
/// (check_document_separator): 2^24, so a run of any size starts at once.
inline constexpr std::uint64_t separator_search_tokens = std::uint64_t{1} << 24;

/// Checks packed documents' separator id against the model and the data:
/// it must be a token of both vocabularies and occur in the training data
/// (within its first separator_search_tokens tokens); a separator the data
/// never holds would leave every window one document, silently. Throws
/// config_error naming the id and the limit.
inline void check_document_separator(std::int32_t sep, const nn::llama_config& c,
                                     const data::token_file& d) {
  const auto id = static_cast<std::uint64_t>(sep);
  TESSERA_THROW_IF(sep < 0 || sep >= c.vocab, config_error, "document separator id ", sep,
                   " is outside the vocabulary [0, ", c.vocab, ")");
  TESSERA_THROW_IF(id >= d.vocab(), config_error, "document separator id ", sep,
                   " is outside the token file's vocabulary [0, ", d.vocab(), ") of '",
                   d.path().string(), "'");
  const std::uint64_t n = std::min(d.split().train.size(), separator_search_tokens);
  const std::uint64_t first = d.split().train.begin;
  bool found = false;
  for (std::uint64_t i = 0; i < n && !found; ++i) found = d[first + i] == id;
  TESSERA_THROW_IF(!found, config_error, "document separator id ", sep,
                   " does not occur in the first ", n, " training tokens of '", d.path().string(),
                   "': name the token that ends each document (examples/tokenize --append-eot "
                   "writes end-of-text, id 3, after each document of byte-level data)");
}

/// Checks model `c`, run `cfg`, the corpus `d` and the degrees of `mesh`
/// under sharding strategy `Sharding` together, before anything is
/// allocated. Throws config_error naming the value and the limit for: an
/// invalid model or run config (llama_config::validate,
/// train_config::validate); more than max_micro_batches micro-batches per
/// step and rank; dp, tp or pp in `cfg` other than the mesh's;
/// a sequence longer than max_seq; a corpus vocabulary beyond the model's;
/// a document separator outside the model's vocabulary;
/// one micro-batch's activation bytes beyond 64 bits; a pipeline the
/// schedule cannot run (parallel::check_pipeline: micro-batch count,
/// virtual stages, stages per layer) or whose message tags run past the
/// pipeline's range (parallel::check_pipeline_tags: K V at most 3650); a stage list that does not
/// sum to the layers; tp that does not split the heads or F (nn::check_tensor_parallel); sequence
/// parallelism with tp 1 or T not divisible by tp; a training or validation split shorter than one
/// window of T + 1 tokens; engine options `dpo` that are invalid, or a per-micro-batch reduction
/// without a sharded gradient (zero<2,3>) or with a pipeline; loss-scale settings other than the
/// defaults under a policy `P` that is not loss-scaled (precision::loss_scaled: they would be
/// ignored); FP8 settings other than the defaults under a policy without
/// FP8 linear layers (precision::fp8_linear).
template <parallel::sharding_strategy Sharding, precision::policy P, has_mesh_degrees Mesh>
void validate(const nn::llama_config& c, const train_config& cfg, const data::token_file& d,
              const Mesh& mesh, const parallel::data_parallel_options& dpo = {}) {
  c.validate();
  dpo.validate();
  TESSERA_THROW_IF(cfg.dp != mesh.dp(), config_error, "dp=", cfg.dp,
                   " does not match the communicator's ", mesh.dp(), " ranks (world size)");
  cfg.validate();
  TESSERA_THROW_IF(!precision::loss_scaled<P> && cfg.loss_scale != precision::loss_scale_options{},
                   config_error, "loss-scale settings ", cfg.loss_scale.to_json().dump(),
                   " under precision ", P::name,
                   ", which trains without a loss scale (fp16_mixed is the loss-scaled policy)");
  TESSERA_THROW_IF(!precision::fp8_linear<P> && cfg.fp8 != precision::fp8_recipe{}, config_error,
                   "FP8 settings ", cfg.fp8.to_json().dump(), " under precision ", P::name,
                   ", which has no FP8 GEMMs (fp8_mixed is the FP8 policy)");
  TESSERA_THROW_IF(
      cfg.accum_steps() > max_micro_batches, config_error, "G / (B x dp) = ", cfg.global_batch,
      " / (", cfg.micro_batch, " x ", cfg.dp, ") = ", cfg.accum_steps(),
      " micro-batches per step and rank exceed the limit of ", max_micro_batches,
      " (each holds a loss and its schedule's actions): raise the micro-batch B or dp, "
      "or lower the global batch G");
  TESSERA_THROW_IF(cfg.seq > c.max_seq, config_error, "sequence length T=", cfg.seq,
                   " exceeds the model's max_seq=", c.max_seq, " (preset '", c.name, "')");
  TESSERA_THROW_IF(d.vocab() > static_cast<std::uint64_t>(c.vocab), config_error,
                   "token file vocabulary ", d.vocab(), " exceeds the model's vocab=", c.vocab);
  if (cfg.document_separator) check_document_separator(*cfg.document_separator, c, d);
  // One micro-batch's activations (34 s b h per layer and the attention
  // scores, Korthikanti et al. 2022) in bytes fit 64 bits, so the planner
  // and the model's buffers cannot wrap.
  const char* w =
      "one micro-batch's activations (B x (T+1) x max(H, F, V, nh T) x layers x 64 bytes)";
  const std::int64_t width =
      std::max({c.dim, c.ffn_dim, c.vocab, checked_mul(c.n_heads, cfg.seq, w)});
  const std::int64_t rows = checked_mul(cfg.micro_batch, checked_add(cfg.seq, 1, w), w);
  (void)checked_mul(checked_mul(checked_mul(rows, width, w), c.n_layers, w), 64, w);
  // Tensor parallelism.
  TESSERA_THROW_IF(cfg.tp != mesh.tp(), config_error, "tp=", cfg.tp,
                   " does not match the tensor-parallel group's ", mesh.tp(), " ranks");
  nn::check_tensor_parallel(c, mesh.tp());
  // The pipeline.
  const int K = mesh.pp();
  TESSERA_THROW_IF(cfg.pp != K, config_error, "pp=", cfg.pp,
                   " does not match the pipeline group's ", K, " ranks");
  TESSERA_THROW_IF(cfg.virtual_stages < 1 || cfg.virtual_stages > 1024, config_error,
                   "virtual stages V=", cfg.virtual_stages, " must be in [1, 1024]");
  parallel::check_pipeline_tags(K, static_cast<int>(cfg.virtual_stages));
  parallel::check_pipeline(
      cfg.pipeline, {K, cfg.accum_steps(), static_cast<int>(cfg.virtual_stages)}, c.n_layers);
  (void)parallel::partition_stages(c, cfg.seq, K * static_cast<int>(cfg.virtual_stages),
                                   cfg.stage_blocks);
  // Context parallelism: each rank's T/cp tokens, head-tail; under
  // sequence parallelism the tp ranks split those.
  int cp = 1;
  if constexpr (requires { mesh.cp(); }) cp = mesh.cp();
  TESSERA_THROW_IF(cfg.cp != cp, config_error, "cp=", cfg.cp,
                   " does not match the context-parallel group's ", cp, " ranks");
  if (cp > 1) {
    const std::int64_t tp = mesh.tp();
    const std::int64_t nh = c.n_heads / tp, nkv = std::max<std::int64_t>(1, c.n_kv_heads / tp);
    TESSERA_THROW_IF(cfg.cp_kind == nn::cp_kind::ulysses && nh % cp != 0, config_error,
                     "--cp-kind ulysses: cp=", cp,
                     " does not divide the query heads of a tp rank, ", "nh/tp = ", c.n_heads, "/",
                     tp, " = ", nh, " (use --cp-kind ring)");
    nn::check_context_parallel(cfg.cp_kind, cp, cfg.seq, nh, nkv);
    // Current scaling takes each tensor's amax over the tokens it casts: a
    // cp rank sees T/cp of them, so its scales would not be one rank's.
    if constexpr (precision::fp8_linear<P>)
      TESSERA_THROW_IF(cfg.fp8.scaling == precision::fp8_scaling::current, config_error,
                       "FP8 current scaling under cp=", cp,
                       ": each rank would scale by the amax of its T/cp tokens; use delayed "
                       "scaling (its amaxes are reduced over dp, cp and tp)");
  }
  if (cfg.sequence_parallel) nn::check_sequence_parallel(cfg.seq / cp, mesh.tp());
  // Reducing per micro-batch needs a sharded gradient, and a chunk's
  // backwards that do not interleave across micro-batches.
  // (The sharding is known at compile time: if constexpr, so that no code
  // after an unconditional throw is unreachable, which nvcc warns about.)
  if (dpo.reduction == parallel::grad_reduction::per_micro_batch) {
    if constexpr (Sharding::gradients != parallel::grad_home::shard) {
      throw config_error(::tessera::detail::str(
          Sharding::name,
          " keeps the whole gradient and reduces it once per step: per-micro-batch "
          "reduction needs zero 2 or 3"));
    } else {
      TESSERA_THROW_IF(K > 1, config_error,
                       "per-micro-batch gradient reduction with a pipeline (pp=", K,
                       "): a stage runs other micro-batches' forwards and backwards between one "
                       "micro-batch's, so its buckets are not complete in turn; reduce once per "
                       "step with pp > 1");
    }
  }
  // The data: one window of each split.
  (void)data::val_windows(d, d.split().val, cfg.seq, cfg.eval_windows);
  (void)data::batch_sampler(d, d.split().train, cfg.micro_batch, cfg.seq, cfg.seed);
}

}  // namespace tessera::train
