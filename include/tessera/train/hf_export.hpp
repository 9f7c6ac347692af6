#pragma once
/// \file train/hf_export.hpp
/// Writes a rank's model chunks (train/model_chunks.hpp), on every layout,
/// as one Hugging Face Llama folder (nn/hf_llama.hpp): each chunk's
/// parameters are gathered over the tp group (and, under zero<3>, over dp)
/// onto dp rank 0 and tp rank 0 of its stage, which writes that stage's
/// files (nn::write_hf_stage_files); world rank 0 then writes config.json
/// and the index. Collective over the mesh.

#include <cstdint>
#include <exception>
#include <filesystem>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/core/file.hpp"
#include "tessera/core/numeric.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/data/safetensors.hpp"
#include "tessera/nn/hf_llama.hpp"
#include "tessera/train/agree.hpp"

namespace tessera::train {

/// Writes `chunks` as a Hugging Face Llama folder `dir` (created if
/// missing): config.json for LlamaForCausalLM and the tensors under
/// transformers' names, in model.safetensors or, above `max_shard_bytes`
/// or under a pipeline (each stage writes its own files), in
/// model-0000i-of-0000N.safetensors listed by model.safetensors.index.json.
/// The tensors are the parameters the model computes with (bf16 under
/// bf16_mixed, not the fp32 master weights) stored as `torch_dtype`:
/// float32, bfloat16, float16 or float64; empty: bfloat16 for bf16
/// parameters, float64 for double, else float32. Under tensor parallelism
/// the shards are gathered over the tp group (padding rows dropped);
/// zero<3> gathers over dp. World rank 0 then writes config.json and the
/// index and removes the weight files of an earlier export in `dir` that
/// this one does not write. Collective over the mesh; every rank throws
/// when any rank fails (io_error naming the file there, the others naming
/// the failure elsewhere). Memory: each rank gathers its stage's
/// parameters of the whole tp group (tp x the stage's parameters, in the
/// context's memory and on the host), and the writer holds one file's
/// bytes. Throws config_error for an unknown dtype before any work.
template <class Chunks, class Layout>
void export_hf(Chunks& chunks, const Layout& mesh, const std::filesystem::path& dir,
               std::string torch_dtype = "",
               std::uint64_t max_shard_bytes = nn::hf_default_shard_bytes) {
  using Param = typename Chunks::model_type::precision_type::param_type;
  using Backend = typename Chunks::model_type::backend_type;
  const auto& ctx = chunks.model().context();
  if (torch_dtype.empty())
    torch_dtype = std::is_same_v<Param, bf16>     ? "bfloat16"
                  : std::is_same_v<Param, double> ? "float64"
                                                  : "float32";
  const std::string dtype = nn::hf_safetensors_dtype(torch_dtype);
  const nn::llama_config& c = chunks.model().config();
  const int T = mesh.tp();
  const auto files =
      nn::plan_hf_files(c, chunks.stages(), data::safetensors_dtype_bytes(dtype), max_shard_bytes);
  const bool writer = mesh.dp_rank() == 0 && mesh.cp_rank() == 0 && mesh.tp_rank() == 0;
  auto world = mesh_reduction(mesh, ctx);
  std::exception_ptr failed;
  try {
    if (writer) std::filesystem::create_directories(dir);
  } catch (...) {
    failed = std::current_exception();
  }
  for (int ch = 0; ch < chunks.size(); ++ch) {
    // This chunk's parameters of every tp rank, on the host (collective).
    // 16-bit parameters travel as pairs in 32-bit words (as zero's
    // gathers): the stride rounds up to even.
    const auto& m = chunks.model(ch);
    const std::int64_t n = m.flat_size();
    const std::int64_t stride = sizeof(Param) == 2 ? (n + 1) / 2 * 2 : n;
    tensor<Param, Backend> full = kernels::make_tensor<Param>(ctx, stride);
    chunks.engine(ch).full_params(full.data());
    std::vector<Param> h(static_cast<std::size_t>(stride * T));
    if constexpr (Layout::layers_type::tensor_parallel) {
      tensor<Param, Backend> all = kernels::make_tensor<Param>(ctx, stride * T);
      if constexpr (comm::comm_element<Param>)
        mesh.layers().group->all_gather(full.data(), all.data(), static_cast<std::size_t>(stride));
      else
        mesh.layers().group->all_gather(reinterpret_cast<const std::int32_t*>(full.data()),
                                        reinterpret_cast<std::int32_t*>(all.data()),
                                        static_cast<std::size_t>(stride / 2));
      ctx.to_host(h.data(), all.data(), h.size() * sizeof(Param));
    } else {
      ctx.to_host(h.data(), full.data(), h.size() * sizeof(Param));
    }
    if (!writer || failed) continue;
    try {
      nn::write_hf_stage_files(dir, files, chunks.virtual_stage(ch), c, m.tp_size(), m.flat_begin(),
                               n, h, stride, dtype);
    } catch (...) {
      failed = std::current_exception();
    }
  }
  // Every stage's files are in place before the folder names them: then
  // world rank 0 writes config.json and the index and removes weight
  // files of an earlier export that this one does not have.
  agree_or_throw(world, mesh.world_rank(), failed, "export to '" + dir.string() + "'");
  if (mesh.world_rank() == 0) {
    try {
      write_json_file(dir / "config.json", nn::hf_config_json(c, torch_dtype));
      const std::filesystem::path index = dir / "model.safetensors.index.json";
      if (files.size() > 1) write_json_file(index, nn::hf_index_json(files));
      std::set<std::string> mine{"model.safetensors.index.json"};
      if (files.size() == 1) mine.erase("model.safetensors.index.json");
      for (const auto& f : files) mine.insert(f.name);
      std::vector<std::filesystem::path> stale;
      for (const auto& e : std::filesystem::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (name.starts_with("model") &&
            (name.ends_with(".safetensors") || name == "model.safetensors.index.json") &&
            !mine.contains(name))
          stale.push_back(e.path());
      }
      for (const auto& p : stale) std::filesystem::remove(p);
    } catch (...) {
      failed = std::current_exception();
    }
  }
  agree_or_throw(world, mesh.world_rank(), failed, "export to '" + dir.string() + "'");
}

}  // namespace tessera::train
