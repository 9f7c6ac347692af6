#pragma once
/// \file train/checkpoint_hf.hpp
/// A Hugging Face Llama folder (nn/hf_llama.hpp) from a layout-free
/// checkpoint folder (train/checkpoint_index.hpp) alone: no trainer, no
/// model, no corpus. The model's sizes come from the checkpoint's run state
/// (`run.model`, train/metadata.hpp) and each tensor is read whole from the
/// pieces, whatever layout wrote them. The files are those
/// train::export_hf writes for the same model from a trainer on one rank
/// (the same names, sharding and bytes).

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/data/safetensors.hpp"
#include "tessera/nn/hf_llama.hpp"
#include "tessera/train/checkpoint_consolidate.hpp"
#include "tessera/train/checkpoint_io.hpp"
#include "tessera/train/metadata.hpp"

namespace tessera::train {

namespace detail {

// Converts `n` elements of type `from` (a checkpoint dtype name) at `src`
// to doubles at `dst`.
inline void widen(const std::string& from, const char* src, std::int64_t n, double* dst) {
  auto go = [&](auto tag) {
    using S = decltype(tag);
    for (std::int64_t i = 0; i < n; ++i) {
      S x;
      std::memcpy(&x, src + static_cast<std::size_t>(i) * sizeof(S), sizeof(S));
      dst[i] = to<double>(x);
    }
  };
  if (from == "float64")
    go(double{});
  else if (from == "float32")
    go(float{});
  else if (from == "bf16")
    go(bf16{});
  else if (from == "fp16")
    go(fp16{});
  else
    throw io_error("checkpoint: a tensor stored as " + from + " is not a floating-point tensor");
}

}  // namespace detail

/// Writes the Hugging Face Llama folder `dst` (config.json for
/// LlamaForCausalLM and the tensors under transformers' names, in
/// model.safetensors or, above `max_shard_bytes`, in
/// model-0000i-of-0000N.safetensors with model.safetensors.index.json)
/// from checkpoint folder `src`, written at any layout. `role` is what is
/// exported: "param" (the parameters the model computes with, as
/// train::export_hf) or "master" (the float32 master weights of a
/// mixed-precision run). `torch_dtype` is float32, bfloat16, float16 or
/// float64; empty: bfloat16 for bf16 tensors, float64 for float64, else
/// float32. Each element goes through float64 and is rounded once to the
/// dtype (round to nearest even), as train::export_hf does, so the bytes
/// equal that export's. Memory: one output file's bytes plus one tensor in
/// float64. Writes into a temporary folder beside `dst` renamed at the end:
/// a failure leaves no `dst`.
///
/// Throws config_error for an existing `dst`, an unknown dtype, a role the
/// checkpoint does not store, or max_shard_bytes 0; io_error as
/// checkpoint_reader and for malformed model settings in the run state,
/// naming the file that cannot be written.
inline void export_checkpoint_hf(const std::filesystem::path& src, const std::filesystem::path& dst,
                                 std::string torch_dtype = "", const std::string& role = "param",
                                 std::uint64_t max_shard_bytes = nn::hf_default_shard_bytes) {
  namespace fs = std::filesystem;
  const auto fresh = detail::fresh_output(dst);  // refused when it exists
  checkpoint_reader rd(src);
  const checkpoint_index& in = rd.index();
  const std::string meta = (src / checkpoint_metadata_name).string();
  TESSERA_THROW_IF(!in.run.contains("model"), io_error, "'", meta,
                   "' records no model settings (run.model)");
  const nn::llama_config c = model_config_from_metadata(in.run["model"], meta);
  const nn::param_layout layout = nn::make_llama_layout(c);
  std::string stored;  // the role's element type (every tensor's the same)
  for (const auto& e : layout.entries()) {
    const auto t = in.tensors.find(e.name);
    TESSERA_THROW_IF(t == in.tensors.end(), io_error, "checkpoint '", src.string(),
                     "' has no tensor '", e.name, "' of its model");
    const std::vector<std::int64_t> full(e.full.dims.begin(), e.full.dims.begin() + e.full.rank);
    TESSERA_THROW_IF(t->second.shape != full, io_error, "checkpoint '", src.string(), "': tensor '",
                     e.name, "' has another shape than its model gives");
    const auto r = t->second.roles.find(role);
    TESSERA_THROW_IF(r == t->second.roles.end(), config_error, "checkpoint '", src.string(),
                     "' stores no ", role, " of '", e.name, "'",
                     role == "master" ? " (a run whose parameters are its master weights: "
                                        "export the param role)"
                                      : "");
    // One element type per role (the run's precision policy), which names
    // the export's dtype by default.
    TESSERA_THROW_IF(!stored.empty() && r->second != stored, io_error, "checkpoint '",
                     src.string(), "' stores ", role, " of '", e.name, "' as ", r->second,
                     ", another tensor's as ", stored, ": one run writes one element type");
    stored = r->second;
  }
  if (torch_dtype.empty())
    torch_dtype = stored == "bf16" ? "bfloat16" : stored == "float64" ? "float64" : "float32";
  const std::string dtype = nn::hf_safetensors_dtype(torch_dtype);
  const std::size_t eb = data::safetensors_dtype_bytes(dtype);
  const auto files = nn::plan_hf_files(c, {nn::stage_range{}}, eb, max_shard_bytes);

  detail::write_new_folder(fresh, "exporting", src, dst, [&](const fs::path& tmp) {
    std::vector<char> raw;
    std::vector<double> w;
    for (const auto& f : files) {
      std::vector<std::vector<unsigned char>> bytes;
      std::vector<data::safetensors_entry> entries;
      for (const auto& name : f.tensors) {
        const stored_tensor& t = in.tensors.at(name);
        const std::string& from = t.roles.at(role);
        const index_box box{std::vector<std::int64_t>(t.shape.size(), 0), t.shape};
        const std::int64_t n = box.numel();
        raw.resize(static_cast<std::size_t>(n) * dtype_bytes_of(from));
        rd.read(name, role, box, 0, n, raw.data());
        w.resize(static_cast<std::size_t>(n));
        detail::widen(from, raw.data(), n, w.data());
        auto& b = bytes.emplace_back(static_cast<std::size_t>(n) * eb);
        nn::encode_hf_tensor(dtype, w.data(), n, b.data());
        entries.push_back({nn::hf_tensor_name(name), dtype, t.shape, b.data(), b.size()});
      }
      data::write_safetensors(tmp / f.name, entries, {{"format", "pt"}});
    }
    write_json_file(tmp / "config.json", nn::hf_config_json(c, torch_dtype));
    if (files.size() > 1)
      write_json_file(tmp / "model.safetensors.index.json", nn::hf_index_json(files));
  });
}

}  // namespace tessera::train
