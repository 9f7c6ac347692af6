#pragma once
/// \file train/checkpoint_convert.hpp
/// The single-file checkpoint of earlier versions (train/checkpoint.hpp,
/// train/checkpoint_file.hpp) as a layout-free checkpoint folder
/// (train/checkpoint_index.hpp), without a trainer or a corpus.
///
/// A file written at tp 1 and pp 1 holds one model chunk, whose flat
/// buffer is make_llama_layout(c)'s (every tensor whole at its offset):
///   params (F elements of the precision's parameter type)
///   | t (int64, the optimizer's step count)
///   | each moment (n elements of the master type: AdamW's exp_avg and
///     exp_avg_sq, SGD's momentum_buffer, Lion's exp_avg; element i is
///     flat element i)
///   | the master weights (n elements) when the parameter type is narrower.
/// The run state (`run` of the metadata) is the file's metadata with the
/// optimizer's step count and the layout added, as a folder's save does.
/// Under tensor or pipeline parallelism the file is one shard of several
/// (path.ppK.tpR) of another flat layout each: refused, naming the way on.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/train/checkpoint_consolidate.hpp"
#include "tessera/train/checkpoint_file.hpp"
#include "tessera/train/checkpoint_io.hpp"
#include "tessera/train/metadata.hpp"

namespace tessera::train {

/// Writes checkpoint folder `dst` (one data file, every tensor whole) from
/// the single-file checkpoint `src` (a checkpoint.bin, zero<0>, tp 1, pp
/// 1), its parameters, optimizer state and master weights bit for bit in
/// their types, so that trainer::load_checkpoint at any layout continues
/// the run as loading `src` at its own layout would. The whole file is
/// read and its checksum verified first (read_checkpoint: its size in host
/// memory). Writes into a temporary folder beside `dst` renamed at the end.
///
/// Throws config_error for an existing `dst`; for a file of tp or pp > 1,
/// a precision other than fp32, fp64, bf16_mixed and
/// bf16_mixed_bf16_grads, or an optimizer other than adamw, sgd and lion
/// (each named); io_error as read_checkpoint (missing, truncated, corrupt), for
/// a payload whose size does not match the model's, and naming the file
/// that cannot be written.
inline void convert_checkpoint_file(const std::filesystem::path& src,
                                    const std::filesystem::path& dst) {
  namespace fs = std::filesystem;
  const auto fresh = detail::fresh_output(dst);  // refused when it exists
  std::error_code ec;
  TESSERA_THROW_IF(!fs::is_regular_file(src, ec), io_error, "checkpoint file '", src.string(),
                   "' does not exist or is not a file");
  nlohmann::json meta;
  std::vector<char> payload;
  read_checkpoint(src, meta, payload);
  const std::string where = src.string();
  auto degree = [&](const char* k) {
    return meta.contains(k) && meta[k].is_number_integer() ? meta[k].get<std::int64_t>() : 1;
  };
  TESSERA_THROW_IF(degree("tp") != 1 || degree("pp") != 1, config_error, "checkpoint '", where,
                   "' is one shard of a run at tp=", degree("tp"), ", pp=", degree("pp"),
                   " (its other shards are files of their own): resume it with train_llama "
                   "--resume at that layout, which saves checkpoint folders");
  TESSERA_THROW_IF(
      !meta.contains("model") || !meta.contains("precision") || !meta.contains("optimizer") ||
          !meta["precision"].is_string() || !meta["optimizer"].is_string(),
      io_error, "checkpoint '", where, "' does not record its model, precision and optimizer");
  const nn::llama_config c = model_config_from_metadata(meta["model"], where);
  const std::string precision = meta["precision"].get<std::string>();
  const std::string optimizer = meta["optimizer"].get<std::string>();
  std::string param, master;
  if (precision == "fp32") {
    param = master = "float32";
  } else if (precision == "fp64") {
    param = master = "float64";
  } else if (precision == "bf16_mixed" || precision == "bf16_mixed_bf16_grads") {
    param = "bf16";
    master = "float32";
  } else {
    throw config_error("checkpoint '" + where + "' has precision '" + precision +
                       "', which convert does not know (fp32, fp64, bf16_mixed, "
                       "bf16_mixed_bf16_grads)");
  }
  std::vector<std::string> roles;
  if (optimizer == "adamw")
    roles = {"exp_avg", "exp_avg_sq"};
  else if (optimizer == "sgd")
    roles = {"momentum_buffer"};
  else if (optimizer == "lion")
    roles = {"exp_avg"};
  else
    throw config_error("checkpoint '" + where + "' has optimizer '" + optimizer +
                       "', which convert does not know (adamw, sgd, lion)");
  if (param != master) roles.push_back("master");

  // The payload: F params, t, then each state buffer of n elements.
  const nn::param_layout layout = nn::make_llama_layout(c);
  const std::uint64_t pb = dtype_bytes_of(param), mb = dtype_bytes_of(master);
  std::uint64_t end = 0;  // past the last tensor; the flat buffer may be longer (flat_elements)
  for (const auto& e : layout.entries())
    end = std::max<std::uint64_t>(end, static_cast<std::uint64_t>(e.offset + e.numel));
  const std::uint64_t F =
      meta.contains("flat_elements") && meta["flat_elements"].is_number_unsigned()
          ? meta["flat_elements"].get<std::uint64_t>()
          : end;
  TESSERA_THROW_IF(F < end, io_error, "checkpoint '", where, "' records flat_elements=", F,
                   "; its model's tensors need ", end);
  const std::uint64_t P = payload.size(), k = roles.size();
  const std::uint64_t head = F * pb + sizeof(std::int64_t);
  TESSERA_THROW_IF(P < head || (P - head) % (k * mb) != 0 || (P - head) / (k * mb) < F, io_error,
                   "checkpoint '", where, "' holds ", P, " payload bytes, which is not ", F,
                   " parameters of ", param, ", a step count and ", k, " state buffers of ", master,
                   " of its model (", c.name, ")");
  const std::uint64_t n = (P - head) / (k * mb);
  std::int64_t t = 0;
  std::memcpy(&t, payload.data() + F * pb, sizeof t);

  rank_file file;
  std::map<std::string, stored_tensor> tensors;
  for (const auto& e : layout.entries()) {
    stored_tensor& st = tensors[e.name];
    st.shape.assign(e.full.dims.begin(), e.full.dims.begin() + e.full.rank);
    const index_box box{std::vector<std::int64_t>(st.shape.size(), 0), st.shape};
    const auto off = static_cast<std::uint64_t>(e.offset);
    st.roles["param"] = param;
    file.add({e.name, "param", box, 0, e.numel, 0, 0}, payload.data() + off * pb,
             static_cast<std::size_t>(e.numel) * pb);
    for (std::uint64_t r = 0; r < k; ++r) {
      st.roles[roles[r]] = master;
      file.add({e.name, roles[r], box, 0, e.numel, 0, 0},
               payload.data() + head + r * n * mb + off * mb,
               static_cast<std::size_t>(e.numel) * mb);
    }
  }
  nlohmann::json run = meta;
  run["optimizer_steps"] = t;
  run["layout"] = {
      {"dp", 1}, {"tp", 1}, {"pp", 1}, {"world", 1}, {"converted_from", src.filename().string()}};

  detail::write_new_folder(fresh, "converting", src, dst, [&](const fs::path& tmp) {
    checkpoint_index out;
    out.tensors = std::move(tensors);
    auto [f, pieces] = file.write(tmp, rank_data_name(0), 0);
    out.files.push_back(std::move(f));
    out.pieces = std::move(pieces);
    out.run = std::move(run);
    write_checkpoint_metadata(tmp, out);
  });
}

}  // namespace tessera::train
