// checkpoint: inspect, check and convert tessera checkpoints without a
// trainer, a model on a device or a corpus.
//
// Shows the layout-free checkpoint folder (docs/checkpoints.md,
// tessera/train/checkpoint_index.hpp) read by a tool of its own: the
// metadata names every tensor, role and piece, so any program can list,
// verify, consolidate or export a checkpoint that any layout wrote.
//
// Run (from the repository root, after `cmake --preset host && cmake --build build/host`):
//
//   build/host/examples/checkpoint list runs/main                 # a run folder's checkpoints
//   build/host/examples/checkpoint list runs/main/step-000200     # one checkpoint (--json too)
//   build/host/examples/checkpoint verify runs/main/step-000200   # SHA-256, sizes, coverage
//   build/host/examples/checkpoint consolidate runs/main/step-000200 one/step-000200
//   build/host/examples/checkpoint export-hf runs/main/step-000200 hf --dtype bf16
//   build/host/examples/checkpoint convert old/checkpoint.bin runs/old/step-000100
//
// consolidate writes one data file holding every tensor whole, which
// trainer::load_checkpoint (and train_llama --resume) loads at any layout.
// export-hf writes config.json and safetensors for transformers. convert
// turns the single-file checkpoint.bin of earlier versions (tp 1, pp 1)
// into a checkpoint folder.
//
// Exit status: 0 on success; 2 on bad input (a missing folder, a folder
// without metadata.json, a truncated or damaged file, pieces that overlap
// or leave a gap, an OUT that exists), with one line on stderr naming the
// file or tensor; nothing is left at OUT in that case.

#include <cstdint>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/train/checkpoint_consolidate.hpp"
#include "tessera/train/checkpoint_convert.hpp"
#include "tessera/train/checkpoint_hf.hpp"
#include "tessera/train/checkpoint_io.hpp"
#include "tessera/train/run_folder.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace tessera;

// The value of key `k` of `j`, or `otherwise` when it has none.
json get(const json& j, const char* k, json otherwise) {
  return j.is_object() && j.contains(k) ? j[k] : otherwise;
}

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string plain(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// "zero3" as "ZeRO-3"; another name as it is.
std::string zero_text(const json& v) {
  const std::string z = plain(v);
  return z.size() == 5 && z.starts_with("zero") ? "ZeRO-" + z.substr(4) : "ZeRO " + z;
}

// A checkpoint folder as JSON: its step, the layout that wrote it, the
// model, the run's settings, every tensor and file.
json describe_checkpoint(const fs::path& dir) {
  train::checkpoint_reader rd(dir);
  const train::checkpoint_index& x = rd.index();
  const json& run = x.run;
  const json lay = get(run, "layout", json::object());
  json layout = {
      {"dp", get(lay, "dp", get(run, "dp", 1))},        {"tp", get(lay, "tp", get(run, "tp", 1))},
      {"pp", get(lay, "pp", get(run, "pp", 1))},        {"world", get(lay, "world", nullptr)},
      {"zero", get(run, "sharding", nullptr)},          {"schedule", get(run, "pipeline", nullptr)},
      {"virtual_stages", get(run, "virtual_stages", 1)}};
  if (lay.contains("consolidated_from")) layout["consolidated_from"] = lay["consolidated_from"];
  if (lay.contains("converted_from")) layout["converted_from"] = lay["converted_from"];
  std::map<std::pair<std::string, std::string>, int> pieces;
  for (const auto& p : x.pieces) ++pieces[{p.tensor, p.role}];
  json tensors = json::array();
  for (const auto& [name, t] : x.tensors) {
    json roles = json::object();
    for (const auto& [role, dt] : t.roles)
      roles[role] = {{"dtype", dt}, {"pieces", pieces[{name, role}]}};
    tensors.push_back({{"name", name}, {"shape", t.shape}, {"roles", roles}});
  }
  json files = json::array();
  std::uint64_t total = 0;
  for (const auto& f : x.files) {
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"sha256", f.sha256}});
    total += f.bytes;
  }
  json settings = json::object();
  for (const char* k : {"precision", "optimizer", "global_batch", "micro_batch", "seq", "steps",
                        "lr", "warmup", "seed"})
    if (run.contains(k)) settings[k] = run[k];
  return {{"kind", "checkpoint"},
          {"path", dir.string()},
          {"step", get(run, "step", nullptr)},
          {"optimizer_steps", get(run, "optimizer_steps", nullptr)},
          {"layout", layout},
          {"model", get(run, "model", nullptr)},
          {"settings", settings},
          {"tensors", tensors},
          {"files", files},
          {"bytes", total}};
}

void print_checkpoint(const json& d) {
  const json& l = d["layout"];
  std::cout << "checkpoint " << plain(d["path"]) << ": step " << plain(d["step"]) << " of "
            << plain(get(d["settings"], "steps", "?")) << " (optimizer steps "
            << plain(d["optimizer_steps"]) << ")\n";
  std::cout << "  layout: dp " << plain(l["dp"]) << ", tp " << plain(l["tp"]) << ", pp "
            << plain(l["pp"]) << " (world " << plain(l["world"]) << "), " << zero_text(l["zero"])
            << ", schedule " << (l["schedule"].is_null() ? "not recorded" : plain(l["schedule"]))
            << ", virtual stages " << plain(l["virtual_stages"]) << "\n";
  if (l.contains("consolidated_from")) {
    const json& c = l["consolidated_from"];
    std::cout << "  consolidated from: dp " << plain(get(c, "dp", "?")) << ", tp "
              << plain(get(c, "tp", "?")) << ", pp " << plain(get(c, "pp", "?")) << " (world "
              << plain(get(c, "world", "?")) << ")\n";
  }
  if (l.contains("converted_from"))
    std::cout << "  converted from: " << plain(l["converted_from"]) << "\n";
  if (d["model"].is_object()) {
    std::cout << "  model:";
    const char* sep = " ";
    for (const auto& [k, v] : d["model"].items()) {
      std::cout << sep << k << " " << plain(v);
      sep = ", ";
    }
    std::cout << "\n";
  }
  std::cout << "  run:";
  const char* sep = " ";
  for (const auto& [k, v] : d["settings"].items()) {
    std::cout << sep << k << " " << plain(v);
    sep = ", ";
  }
  std::cout << "\n  tensors (" << d["tensors"].size() << "): name, shape, role dtype x pieces\n";
  std::size_t w = 4;
  for (const auto& t : d["tensors"]) w = std::max(w, t["name"].get<std::string>().size());
  for (const auto& t : d["tensors"]) {
    std::cout << "    " << std::left << std::setw(static_cast<int>(w)) << plain(t["name"]) << "  "
              << std::setw(12) << shape_text(t["shape"].get<std::vector<std::int64_t>>());
    const char* s = "  ";
    for (const auto& [role, r] : t["roles"].items()) {
      std::cout << s << role << " " << plain(r["dtype"]) << " x" << plain(r["pieces"]);
      s = ", ";
    }
    std::cout << "\n";
  }
  std::cout << std::right << "  files (" << d["files"].size() << ", " << plain(d["bytes"])
            << " bytes):\n";
  for (const auto& f : d["files"])
    std::cout << "    " << plain(f["name"]) << "  " << std::setw(12) << plain(f["bytes"])
              << " bytes  sha256 " << plain(f["sha256"]).substr(0, 16) << "...\n";
}

// A run folder as JSON: every step-NNNNNN folder, complete or not, the
// newest complete one marked, and a checkpoint.bin of earlier versions.
json describe_run(const fs::path& dir) {
  const auto complete = train::checkpoint_folders(dir);
  const fs::path newest = complete.empty() ? fs::path() : complete.back().second;
  std::vector<std::pair<std::int64_t, fs::path>> all;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.size() < 6 || n.compare(0, 5, "step-") != 0 ||
        n.find_first_not_of("0123456789", 5) != std::string::npos || n.size() > 5 + 12)
      continue;
    all.emplace_back(std::stoll(n.substr(5)), e.path());
  }
  std::sort(all.begin(), all.end());
  json list = json::array();
  for (const auto& [step, p] : all) {
    // A live run renames files as it saves: what vanishes is not counted.
    std::uint64_t bytes = 0;
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(p, ec)) {
      std::error_code fe;
      const auto n = f.is_regular_file(fe) ? f.file_size(fe) : 0;
      if (!fe) bytes += n;
    }
    const bool done = fs::exists(p / train::checkpoint_metadata_name, ec);
    list.push_back({{"name", p.filename().string()},
                    {"step", step},
                    {"complete", done},
                    {"newest", p == newest},
                    {"bytes", bytes}});
  }
  json out = {{"kind", "run"}, {"path", dir.string()}, {"checkpoints", list}};
  if (!newest.empty()) out["resume_from"] = newest.filename().string();
  if (fs::exists(dir / "checkpoint.bin"))
    out["checkpoint_bin"] = {{"bytes", fs::file_size(dir / "checkpoint.bin")}};
  return out;
}

void print_run(const json& d) {
  std::cout << "run folder " << plain(d["path"]) << ": " << d["checkpoints"].size()
            << " checkpoint folder" << (d["checkpoints"].size() == 1 ? "" : "s") << "\n";
  for (const auto& c : d["checkpoints"])
    std::cout << "  " << plain(c["name"]) << "  step " << std::setw(6) << plain(c["step"]) << "  "
              << std::setw(12) << plain(c["bytes"]) << " bytes  "
              << (c["complete"].get<bool>() ? "complete" : "incomplete (no metadata.json)")
              << (c["newest"].get<bool>() ? "  <- newest complete (--resume uses it)" : "") << "\n";
  if (d.contains("checkpoint_bin"))
    std::cout << "  checkpoint.bin  " << plain(d["checkpoint_bin"]["bytes"])
              << " bytes (single-file format of earlier versions)\n";
}

int list(const fs::path& dir, bool as_json) {
  TESSERA_THROW_IF(!fs::is_directory(dir), config_error, "'", dir.string(),
                   "' is not a folder (a checkpoint folder or a run folder)");
  json d;
  if (fs::exists(dir / train::checkpoint_metadata_name)) {
    d = describe_checkpoint(dir);
  } else {
    d = describe_run(dir);
    TESSERA_THROW_IF(d["checkpoints"].empty() && !d.contains("checkpoint_bin"), io_error, "'",
                     dir.string(), "' has no ", train::checkpoint_metadata_name,
                     " (not a checkpoint folder, or an incomplete save) and no step-NNNNNN "
                     "folders or checkpoint.bin (not a run folder)");
  }
  if (as_json)
    std::cout << d.dump(2) << "\n";
  else if (d["kind"] == "checkpoint")
    print_checkpoint(d);
  else
    print_run(d);
  return 0;
}

int verify(const fs::path& dir) {
  TESSERA_THROW_IF(!fs::is_directory(dir), config_error, "'", dir.string(),
                   "' is not a checkpoint folder");
  train::checkpoint_reader rd(dir);  // the metadata, every file present at its size
  rd.verify();                       // every file's SHA-256
  train::check_piece_coverage(rd.index());
  std::uint64_t bytes = 0;
  for (const auto& f : rd.index().files) bytes += f.bytes;
  std::cout << "checkpoint " << dir.string() << ": ok (" << rd.index().files.size() << " files, "
            << bytes << " bytes, SHA-256 match; " << rd.index().tensors.size() << " tensors, "
            << rd.index().pieces.size() << " pieces, each role covered exactly once)\n";
  return 0;
}

int consolidate(const fs::path& src, const fs::path& dst, bool check) {
  train::consolidate_checkpoint(src, dst, check);
  std::cout << "checkpoint " << src.string() << " -> " << dst.string() << " (one file, "
            << fs::file_size(dst / train::rank_data_name(0)) << " bytes)\n";
  return 0;
}

int export_hf(const fs::path& src, const fs::path& dst, std::string dtype, bool master,
              double shard_gb, bool check) {
  static const std::map<std::string, std::string> alias = {
      {"bf16", "bfloat16"}, {"fp32", "float32"}, {"fp16", "float16"}, {"fp64", "float64"}};
  if (auto it = alias.find(dtype); it != alias.end()) dtype = it->second;
  TESSERA_THROW_IF(!(shard_gb > 0), config_error, "--shard-gb ", shard_gb, " must be > 0");
  if (check) {
    train::checkpoint_reader rd(src);
    rd.verify();  // a damaged file is named, not exported
  }
  train::export_checkpoint_hf(src, dst, dtype, master ? "master" : "param",
                              static_cast<std::uint64_t>(shard_gb * 1e9));
  std::cout << "checkpoint " << src.string() << " -> Hugging Face folder " << dst.string() << " ("
            << tessera::read_json_file(dst / "config.json", "config.json")["torch_dtype"]
                   .get<std::string>()
            << ")\n";
  return 0;
}

int convert(const fs::path& src, const fs::path& dst) {
  train::convert_checkpoint_file(src, dst);
  std::cout << "checkpoint " << src.string() << " -> checkpoint folder " << dst.string() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Inspect, verify, consolidate, export and convert tessera checkpoints"};
  app.require_subcommand(1);
  std::string dir, out, dtype;
  bool as_json = false, no_verify = false, master = false;
  double shard_gb = 5.0;

  auto* list_cmd = app.add_subcommand(
      "list",
      "the step, layout, model, tensors and files of a checkpoint folder, or the "
      "checkpoints of a run folder");
  list_cmd->add_option("DIR", dir, "checkpoint folder (with metadata.json) or run folder")
      ->required();
  list_cmd->add_flag("--json", as_json, "print the same as JSON");

  auto* verify_cmd = app.add_subcommand(
      "verify",
      "check every file's size and SHA-256 and that the pieces cover every tensor "
      "exactly once");
  verify_cmd->add_option("DIR", dir, "checkpoint folder")->required();

  auto* cons_cmd =
      app.add_subcommand("consolidate",
                         "write OUT: the checkpoint with every tensor whole in one data file, "
                         "loadable at any layout");
  cons_cmd->add_option("DIR", dir, "checkpoint folder")->required();
  cons_cmd->add_option("OUT", out, "new checkpoint folder (must not exist)")->required();
  cons_cmd->add_flag("--no-verify", no_verify,
                     "skip hashing the source's files and checking its pieces first");

  auto* hf_cmd = app.add_subcommand(
      "export-hf", "write OUT: a Hugging Face Llama folder (config.json and safetensors)");
  hf_cmd->add_option("DIR", dir, "checkpoint folder")->required();
  hf_cmd->add_option("OUT", out, "new folder (must not exist)")->required();
  hf_cmd->add_option("--dtype", dtype,
                     "bf16 (bfloat16), fp32 (float32), fp16 (float16) or fp64 (float64); "
                     "default: bfloat16 for bf16 parameters, float64 for float64, else float32");
  hf_cmd->add_flag("--master", master,
                   "export the float32 master weights of a mixed-precision run instead of "
                   "the parameters");
  hf_cmd->add_option("--shard-gb", shard_gb, "largest safetensors file, in GB (1e9 bytes)")
      ->capture_default_str();
  hf_cmd->add_flag("--no-verify", no_verify, "skip hashing the source's files first");

  auto* conv_cmd =
      app.add_subcommand("convert",
                         "write OUT: a checkpoint folder from the single-file checkpoint.bin of "
                         "earlier versions (tp 1, pp 1)");
  conv_cmd->add_option("FILE", dir, "checkpoint.bin")->required();
  conv_cmd->add_option("OUT", out, "new checkpoint folder (must not exist)")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "checkpoint: error: " << e.what() << " (see --help)\n";
    return 2;
  }
  try {
    if (*list_cmd) return list(dir, as_json);
    if (*verify_cmd) return verify(dir);
    if (*cons_cmd) return consolidate(dir, out, !no_verify);
    if (*hf_cmd) return export_hf(dir, out, dtype, master, shard_gb, !no_verify);
    return convert(dir, out);
  } catch (const std::exception& e) {
    std::cerr << "checkpoint: error: " << e.what() << "\n";
    return 2;
  }
}
