#pragma once
/// \file train/metadata.hpp
/// The checkpoint metadata of a run, written once for every trainer: the
/// model, the precision and optimizer, the sharding and dp, the step and
/// data position, every setting a resume must match, and the corpus
/// fingerprint. A checkpoint moves between backends (a GPU run resumes on
/// the host and back) because the backend is not part of it.

#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/data/fingerprint.hpp"
#include "tessera/data/sampler.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/nn/hf_llama.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/train/config.hpp"

namespace tessera::train {

/// The model's sizes as checkpoint metadata. A RoPE scaling is written as
/// "rope_scaling" in config.json's form (nn::hf_rope_scaling_json); a model
/// without one has no such key, so the metadata of an unscaled model is what
/// tessera wrote before scaling existed, and a resume with another scaling
/// (or none) differs in "model" and is refused (check_resume_metadata).
/// Tied embeddings likewise add "tie_word_embeddings": true (untied, no
/// key): a tied checkpoint holds no "lm_head", and a resume with the other
/// choice is refused.
inline nlohmann::json model_metadata(const nn::llama_config& c) {
  nlohmann::json m = {{"name", c.name},
                      {"dim", c.dim},
                      {"n_layers", c.n_layers},
                      {"n_heads", c.n_heads},
                      {"n_kv_heads", c.n_kv_heads},
                      {"ffn_dim", c.ffn_dim},
                      {"vocab", c.vocab},
                      {"max_seq", c.max_seq},
                      {"rope_theta", c.rope_theta},
                      {"norm_eps", c.norm_eps}};
  if (c.rope_scaling) m["rope_scaling"] = nn::hf_rope_scaling_json(c.rope_scaling);
  if (c.tie_word_embeddings) m["tie_word_embeddings"] = true;
  return m;
}

/// The model config that model_metadata wrote (`m`, read from `where`,
/// named in errors; no "rope_scaling", or null: none; no
/// "tie_word_embeddings": untied). Throws io_error
/// naming `where` and the key for a missing key or one of another type,
/// config_error as nn::hf_rope_scaling and llama_config::validate.
inline nn::llama_config model_config_from_metadata(const nlohmann::json& m,
                                                   const std::string& where) {
  nn::llama_config c;
  try {
    c.name = m.at("name").get<std::string>();
    c.dim = m.at("dim").get<std::int64_t>();
    c.n_layers = m.at("n_layers").get<std::int64_t>();
    c.n_heads = m.at("n_heads").get<std::int64_t>();
    c.n_kv_heads = m.at("n_kv_heads").get<std::int64_t>();
    c.ffn_dim = m.at("ffn_dim").get<std::int64_t>();
    c.vocab = m.at("vocab").get<std::int64_t>();
    c.max_seq = m.at("max_seq").get<std::int64_t>();
    c.rope_theta = m.at("rope_theta").get<double>();
    c.norm_eps = m.at("norm_eps").get<double>();
    if (m.contains("tie_word_embeddings"))
      c.tie_word_embeddings = m.at("tie_word_embeddings").get<bool>();
  } catch (const nlohmann::json::exception& e) {
    throw io_error("'" + where + "': its model settings are malformed: " + e.what());
  }
  if (m.contains("rope_scaling") && !m["rope_scaling"].is_null())
    c.rope_scaling = nn::hf_rope_scaling(m["rope_scaling"], "rope_scaling", "'" + where + "'");
  c.validate();
  return c;
}

/// The hyper-parameters of an optimizer config.
inline nlohmann::json optimizer_metadata(const optim::adamw_config& a) {
  return {{"beta1", a.beta1}, {"beta2", a.beta2}, {"eps", a.eps},
          {"weight_decay", a.weight_decay}};
}
inline nlohmann::json optimizer_metadata(const optim::sgd_config& s) {
  return {{"momentum", s.momentum}, {"nesterov", s.nesterov}, {"weight_decay", s.weight_decay}};
}
inline nlohmann::json optimizer_metadata(const optim::lion_config& l) {
  return {{"beta1", l.beta1}, {"beta2", l.beta2}, {"weight_decay", l.weight_decay}};
}
inline nlohmann::json optimizer_metadata(const optim::adafactor_config& a) {
  return {{"beta1", a.beta1},
          {"clip_threshold", a.clip_threshold},
          {"decay_rate", a.decay_rate},
          {"eps1", a.eps1},
          {"eps2", a.eps2},
          {"weight_decay", a.weight_decay},
          {"scale_parameter", a.scale_parameter},
          {"relative_step", a.relative_step},
          {"warmup_init", a.warmup_init}};
}
inline nlohmann::json optimizer_metadata(const optim::muon_config& m) {
  return {{"momentum", m.momentum},
          {"nesterov", m.nesterov},
          {"ns_steps", m.ns_steps},
          {"ns_coefficients", {m.ns_a, m.ns_b, m.ns_c}},
          {"eps", m.eps},
          {"adjust_lr", optim::name_of(m.adjust)},
          {"weight_decay", m.weight_decay},
          {"adamw_lr_ratio", m.adamw_lr_ratio},
          {"adamw_beta1", m.adamw_beta1},
          {"adamw_beta2", m.adamw_beta2},
          {"adamw_eps", m.adamw_eps}};
}

/// The hyper-parameters of another optimizer's config: its
/// optimizer_metadata overload (found by argument-dependent lookup) or its
/// nlohmann-json conversion (to_json), which the resume check compares.
template <class OptConfig>
nlohmann::json optimizer_config_json(const OptConfig& opt) {
  if constexpr (requires { optimizer_metadata(opt); })
    return optimizer_metadata(opt);
  else {
    static_assert(std::is_constructible_v<nlohmann::json, const OptConfig&>,
                  "an optimizer config needs optimizer_metadata(const config&) or a "
                  "nlohmann-json to_json(json&, const config&) for the checkpoint metadata");
    return nlohmann::json(opt);
  }
}

/// The learning-rate schedule as checkpoint metadata: its name and the
/// parameters that are not recorded beside it (lr, warmup and steps are):
/// {"name": "cosine", "min_lr_ratio": 0.1}; wsd adds "decay_fraction" and
/// "cooldown". A resume compares it whole: another schedule is refused.
inline nlohmann::json schedule_metadata(const train_config& cfg) {
  nlohmann::json j{{"name", optim::to_string(cfg.lr_schedule)}, {"min_lr_ratio", cfg.min_lr_ratio}};
  if (cfg.lr_schedule == optim::lr_schedule_kind::wsd) j.update(cfg.wsd.to_json());
  return j;
}

/// The document mask as checkpoint metadata: the separator id of packed
/// documents (train_config::document_separator), or null without a
/// document mask. A resume compares it: another setting is refused.
inline nlohmann::json document_separator_metadata(const train_config& cfg) {
  return cfg.document_separator ? nlohmann::json(*cfg.document_separator) : nlohmann::json();
}

/// The checkpoint metadata of a run at `step` (every trainer writes this).
/// `optimizer` names the policy and `opt` is its config; `sharding` the
/// ZeRO strategy's name, `dp` the data-parallel degree; `flat_elements`
/// the model's flat buffer.
template <class OptConfig>
nlohmann::json run_metadata(const nn::llama_config& c, const train_config& cfg,
                            const char* precision, const char* optimizer, const OptConfig& opt,
                            const char* sharding, std::int64_t dp, std::int64_t step,
                            std::int64_t flat_elements, const data::token_file& data) {
  return {{"model", model_metadata(c)},
          {"precision", precision},
          {"optimizer", optimizer},
          {optimizer, optimizer_config_json(opt)},
          {"sharding", sharding},
          {"dp", dp},
          {"step", step},
          {"data_position", {{"step", step}, {"sampler", "window_start(seed, step, g)"}}},
          {"schedule_position", step},
          {"rng", {{"seed", cfg.seed}, {"generator", "mix64 counter (stateless)"}}},
          {"schedule", schedule_metadata(cfg)},
          {"grad_clip", cfg.grad_clip},
          {"ce_chunk", cfg.ce_chunk},
          {"document_separator", document_separator_metadata(cfg)},
          {"global_batch", cfg.global_batch},
          {"micro_batch", cfg.micro_batch},
          {"seq", cfg.seq},
          {"seed", cfg.seed},
          {"steps", cfg.steps},
          {"lr", cfg.lr},
          {"warmup", cfg.warmup},
          {"flat_elements", flat_elements},
          {"data", {{"tokens", data.size()}, {"vocab", data.vocab()},
                    {"fingerprint", data::fingerprint(data)}}}};
}

/// Checks a checkpoint's metadata against this run's before a resume: every
/// key of `mine` except the positions (step, data_position,
/// schedule_position, loss_scaler_state) and the planned steps must be
/// present and equal, the
/// tensor-parallel degree and the pipeline layout checked first. A run may
/// plan more steps than the checkpoint's (`steps`, at least its step): the
/// learning-rate schedule then decays over the new total (cosine and
/// linear stretch; wsd's decay window moves to the new total's last
/// steps: optim/schedule.hpp). Throws
/// config_error listing every differing field with both values in one
/// message, and io_error if the step is not an integer in [0, steps].
/// Returns the checkpoint's step.
inline std::int64_t check_resume_metadata(const std::filesystem::path& path, nlohmann::json& meta,
                                          const nlohmann::json& mine, std::int64_t steps) {
  // The tensor-parallel degree first: a checkpoint of another tp holds
  // other shards, and every later field (flat_elements) would differ for
  // that one reason. A run without tp is tp 1.
  const auto tp_of = [](const nlohmann::json& j) {
    return j.contains("tp") ? j["tp"] : nlohmann::json(1);
  };
  TESSERA_THROW_IF(tp_of(meta) != tp_of(mine), config_error, "checkpoint '", path.string(),
                   "' was written at tp=", tp_of(meta).dump(), " but this run has tp=",
                   tp_of(mine).dump(),
                   ": a checkpoint resumes at its own tensor-parallel degree (it is not "
                   "resharded)");
  // The pipeline layout likewise: a stage's file holds its chunks only.
  const auto pp_of = [](const nlohmann::json& j) {
    return nlohmann::json::array({j.contains("pp") ? j["pp"] : nlohmann::json(1),
                                  j.contains("virtual_stages") ? j["virtual_stages"]
                                                               : nlohmann::json(1)});
  };
  TESSERA_THROW_IF(pp_of(meta) != pp_of(mine), config_error, "checkpoint '", path.string(),
                   "' was written at pp=", pp_of(meta)[0].dump(), " with ",
                   pp_of(meta)[1].dump(), " virtual stages but this run has pp=",
                   pp_of(mine)[0].dump(), " with ", pp_of(mine)[1].dump(),
                   ": a checkpoint resumes at its own pipeline layout (it is not resharded)");
  // Checkpoints of tessera before the SHA-256 fingerprint recorded the
  // corpus by a 64-bit FNV-1a of sampled tokens: said so, not a bare mismatch.
  TESSERA_THROW_IF(meta.contains("data") && meta["data"].is_object() &&
                       meta["data"].contains("fingerprint") &&
                       meta["data"]["fingerprint"].is_number(),
                   config_error, "checkpoint '", path.string(),
                   "' records its corpus by the fingerprint of an older tessera (a 64-bit hash "
                   "of sampled tokens; now SHA-256 over every token), so its corpus cannot be "
                   "verified: resume it with the tessera that wrote it, or start a new run");
  // Checkpoints of tessera before the choice of schedules recorded the one
  // it had as {"name": "warmup_cosine", "min_lr_ratio": r}: that is cosine's.
  if (meta.contains("schedule") && meta["schedule"].is_object() &&
      meta["schedule"].value("name", nlohmann::json()) == "warmup_cosine")
    meta["schedule"]["name"] = "cosine";
  // Checkpoints of tessera before the document mask trained without one.
  if (!meta.contains("document_separator")) meta["document_separator"] = nullptr;
  std::string diff;
  for (const auto& [k, v] : mine.items()) {
    if (k == "step" || k == "data_position" || k == "schedule_position" || k == "steps" ||
        k == "loss_scaler_state")
      continue;
    if (meta.contains(k) && meta[k] == v) continue;
    diff += tessera::detail::str(diff.empty() ? "" : "; ", k, "=",
                                 meta.contains(k) ? meta[k].dump() : "(missing)",
                                 " in the checkpoint, ", v.dump(), " in this run");
  }
  TESSERA_THROW_IF(!diff.empty(), config_error, "checkpoint '", path.string(),
                   "' was written with other settings: ", diff);
  TESSERA_THROW_IF(!meta.contains("step") || !meta["step"].is_number_integer() ||
                       meta["step"].get<std::int64_t>() < 0 ||
                       meta["step"].get<std::int64_t>() > steps,
                   io_error, "checkpoint '", path.string(), "' has step ",
                   meta.contains("step") ? meta["step"].dump() : "(missing)", ", not in [0, steps=",
                   steps, "]");
  return meta["step"].get<std::int64_t>();
}

}  // namespace tessera::train
