// plan: what one training step of a Llama costs per rank before anything
// runs (DESIGN.md, principle 5). Prints the per-rank bytes (weights,
// parameter shard, gradients, reduction buffers, master weights, optimizer
// state, RoPE tables; the transient ZeRO-3 gathered segments, reduction
// staging and update all-gather; saved activations, logits workspace,
// activation peak, total), the model FLOPs per step, the bytes each rank
// sends per step, and whether it fits the device memory with the margin.
// By default the figures are what parallel::data_parallel and its trainer
// allocate and send (buckets of --bucket-mb padded to equal chunks, full
// gradient buffer, one reduction per step); --accounting ideal prints the
// ZeRO paper's textbook formula instead. --seed004 prints seeds/004's ZeRO
// table (16 bytes per parameter, 7B and the real llama2_7b count, ideal).
// --gpu-step prints the one-GPU step of the same trainer instead
// (plan/cuda_step.hpp: the CUDA kernels' scratch and the cuBLASLt workspace,
// bf16 activation gradients and full activation checkpointing by default).
// --checkpointing and --optimizer apply to both. Under --precision fp8_mixed
// each plan adds the FP8 linear layers' state (scales, step amaxes and,
// with --fp8-scaling delayed, amax histories of --fp8-amax-history floats)
// and operand copies (plan/fp8.hpp): on the host the float copies
// nn::fp8_linear makes, with --gpu-step the one-byte buffers and device
// scales the CUDA FP8 linear allocates. --pp P (with --schedule,
// --virtual-stages, --micro-batches, --stage-blocks) prints the pipeline
// plan instead (plan/pipeline.hpp): per pipeline rank its blocks,
// parameters, model state (and, --zero 2 and 3, the gradient buckets of
// the accumulation window; --zero 3, the gathered segments), micro-batches
// held, peak activations and p2p bytes, the bubble (simulated with
// FLOP-proportional stage costs, and the closed form), and whether the
// largest stage's peak fits the device memory.
//
// clang-format off
//   build/host/examples/plan --preset llama2_7b --precision bf16_mixed --dp 8 --zero 3 --micro-batch 1 --seq 4096
//   build/host/examples/plan --seed004
//   build/host/examples/plan --preset llama3_8b --zero 1 --json
//   build/host/examples/plan --gpu-step --preset llama2_7b --seq 4096 --micro-batch 1   # one H200
//   build/host/examples/plan --preset llama2_7b --precision fp8_mixed --dp 8 --zero 1 --seq 4096
//   build/host/examples/plan --gpu-step --preset llama2_7b --precision fp8_mixed --seq 4096
//   build/host/examples/plan --preset llama2_7b --precision bf16_mixed --dp 2 --zero 1 --pp 4 --schedule zb1 --micro-batches 8 --seq 4096
// clang-format on
//
// Exit status: 0 when it fits (or with --seed004), 1 when it does not fit,
// 2 on bad input (one-line error naming the value).

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_layout.hpp"
#include "tessera/parallel/grad_reducer.hpp"
#include "tessera/plan/cuda_step.hpp"
#include "tessera/plan/memory.hpp"
#include "tessera/plan/pipeline.hpp"
#include "tessera/plan/step.hpp"
#include "tessera/precision/fp8_scaling.hpp"
#include "tessera/precision/policy.hpp"

using namespace tessera;

namespace {

using precision::policy_name;  // "bf16", "fp16" and "fp8" are short for the mixed policies

struct options {
  std::string preset = "llama2_7b";
  std::string precision = "bf16_mixed";
  int dp = 8, zero = 3, prefetch = 1, tp = 1;
  bool sequence_parallel = false;  // --sequence-parallel (with --tp > 1)
  int cp = 1;                      // --cp: context-parallel ranks
  std::string cp_kind = "ring";    // --cp-kind
  std::int64_t micro_batch = 1, seq = 4096, micro_batches = 1, ce_chunk = 256;
  int threads = 1;
  std::int64_t reduce_bytes = 0;     // 0: the precision's reduce type
  double bucket_mb = 25;             // engine bucket capacity, MB of the reduce type
  std::string grad_reduce = "step";  // when buckets reduce: step, or micro-batch (zero 2, 3)
  std::string accounting = "engine";
  double memory_gib = 140.4;   // one H200 as nvidia-smi reports it: 143,771 MiB
  double peak_tflops = 989.0;  // H200 dense bf16 (NVIDIA datasheet, without sparsity)
  double step_seconds = 0;     // optional: measured step time, for MFU
  bool step_seconds_given = false;
  bool json = false, seed004 = false;
  bool gpu_step = false;               // the one-GPU step instead
  std::string checkpointing;           // none or full; default: none, full with --gpu-step
  std::int64_t checkpoint_layers = 1;  // with full: every k-th block recomputes
  std::string optimizer = "adamw";     // adamw, sgd, lion, adafactor or muon
  bool ce_chunk_given = false;
  int pp = 1;                              // pipeline ranks (--pp > 1: the pipeline plan)
  std::string schedule = "1f1b";           // gpipe, 1f1b, interleaved, zb1
  int virtual_stages = 1;                  // model chunks per pipeline rank (interleaved)
  std::vector<std::int64_t> stage_blocks;  // blocks of each virtual stage (empty: by FLOPs)
  bool schedule_given = false;
  std::string fp8_scaling = "delayed";                              // fp8_mixed: delayed or current
  std::int64_t fp8_amax_history = precision::fp8_recipe{}.history;  // delayed: floats per history
};

// The FP8 recipe of --fp8-scaling and --fp8-amax-history (fp8_mixed); the
// planner counts the histories it keeps. Throws config_error as the recipe.
precision::fp8_recipe fp8_recipe_of(const options& o) {
  precision::fp8_recipe r;
  r.scaling = precision::parse_fp8_scaling(o.fp8_scaling);
  r.history = o.fp8_amax_history;
  r.validate();
  return r;
}

// Sizes the planners take: at least 1, and at most 2^31 - 1 tokens per
// micro-batch (token ids and counts are int32 on the device, and the byte
// counts stay far from 64-bit overflow).
void check_batch(const options& o) {
  TESSERA_THROW_IF(o.micro_batch < 1, config_error, "micro-batch B=", o.micro_batch,
                   " must be >= 1");
  TESSERA_THROW_IF(o.seq < 1, config_error, "sequence length T=", o.seq, " must be >= 1");
  TESSERA_THROW_IF(o.micro_batches < 1, config_error, "micro-batches=", o.micro_batches,
                   " must be >= 1");
  constexpr std::int64_t max_tokens = (std::int64_t{1} << 31) - 1;
  TESSERA_THROW_IF(o.micro_batch > max_tokens / o.seq, config_error,
                   "micro-batch B=", o.micro_batch, " x T=", o.seq, " exceeds ", max_tokens,
                   " tokens per micro-batch");
  TESSERA_THROW_IF(o.micro_batches > 1 << 20, config_error, "micro-batches=", o.micro_batches,
                   " exceeds 1048576");
  TESSERA_THROW_IF(!(o.memory_gib > 0) || !std::isfinite(o.memory_gib), config_error,
                   "memory-gib=", o.memory_gib, " must be a finite number > 0");
}

// --gpu-step: the device memory of one training step of train::trainer on
// one GPU (plan/cuda_step.hpp: the model's tensors, the CUDA kernels'
// scratch, the cuBLASLt workspace, the loader's device buffers), row by
// row, and whether it fits --memory-gib. One GPU: --dp, --zero and the
// other data-parallel options do not apply and are ignored.
int print_gpu_step(const options& o) {
  const auto cfg = nn::llama_config::from_name(o.preset);
  TESSERA_THROW_IF(!(o.memory_gib > 0), config_error, "memory-gib=", o.memory_gib, " must be > 0");
  check_batch(o);
  plan::cuda_step_options co;
  co.micro_batch = o.micro_batch;
  co.seq = o.seq;
  co.micro_batches = o.micro_batches;
  co.checkpointing = {nn::parse_checkpointing(o.checkpointing), o.checkpoint_layers};
  co.precision = policy_name(o.precision);
  co.optimizer = o.optimizer;
  if (o.ce_chunk_given) co.ce_chunk = o.ce_chunk;
  const plan::memory_plan p = plan::plan_cuda_step(cfg, co);
  const bool fp8 = p.dtypes.fp8_linear;
  const double mem = o.memory_gib * plan::gib;
  const double margin = mem - static_cast<double>(p.total());
  if (o.json) {
    nlohmann::json j = p.to_json();
    j["checkpointing"] = o.checkpointing;
    j["checkpoint_layers"] = o.checkpoint_layers;
    j["ce_chunk"] = co.ce_chunk;
    j["memory_bytes"] = mem;
    j["margin_bytes"] = margin;
    j["fits"] = margin >= 0;
    std::cout << j.dump(2) << "\n";
    return margin >= 0 ? 0 : 1;
  }
  std::printf(
      "One-GPU training step of train::trainer<%s, cuda, %s> (%s, %lld parameters), B "
      "%lld x T %lld, %lld micro-batch(es), activation checkpointing %s (every %lld), CE "
      "chunk %lld\n",
      co.precision.c_str(), o.optimizer.c_str(), cfg.name.c_str(), (long long)cfg.num_params(),
      (long long)o.micro_batch, (long long)o.seq, (long long)o.micro_batches,
      o.checkpointing.c_str(), (long long)o.checkpoint_layers, (long long)co.ce_chunk);
  if (fp8)
    std::printf(
        "(fp8_mixed on the GPU: bf16 weights and activations, float32 activation gradients, "
        "the FP8 scalars (plan::fp8_scalar_bytes) and one GEMM's FP8 operand copies "
        "(plan::fp8_operand_bytes))\n");
  std::printf("%s", p.to_table().c_str());
  std::printf("\nMemory: %.2f GiB (%.2f GB) of %.2f GiB: %s, margin %.2f GiB\n",
              static_cast<double>(p.total()) / plan::gib, static_cast<double>(p.total()) / 1e9,
              o.memory_gib, margin >= 0 ? "fits" : "DOES NOT FIT", margin / plan::gib);
  return margin >= 0 ? 0 : 1;
}

// seeds/004's table: model state per GPU for 7B on 8 GPUs, ZeRO 0..3.
int print_seed004() {
  const auto d = plan::dtype_sizes::seed004();
  const auto real = nn::llama_config::llama2_7b();
  std::printf("seeds/004 model state per GPU, 8 GPUs, mixed-precision Adam (16 bytes/param)\n");
  std::printf("  %-8s %14s %14s %22s\n", "stage", "N = 7e9", "seed formula",
              "llama2_7b (N = real)");
  const char* names[] = {"DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"};
  for (int z = 0; z <= 3; ++z) {
    const double a = static_cast<double>(
        plan::plan_state(7'000'000'000, d, plan::optimizer_spec::adamw(), {z, 8}).model_state());
    const double b = static_cast<double>(
        plan::plan_state_ideal(real, d, plan::optimizer_spec::adamw(), {z, 8}).model_state());
    const double seed = plan::seed004_training_memory_gib(7e9, 8, z);
    if (std::abs(a / plan::gib - seed) > 1e-9 * seed) {  // the planner must reproduce the seed
      std::fprintf(stderr, "plan: planner %.6f GiB != seed %.6f GiB at zero %d\n", a / plan::gib,
                   seed, z);
      return 1;
    }
    std::printf("  %-8s %10.2f GiB %10.2f GiB %18.2f GiB\n", names[z], a / plan::gib, seed,
                b / plan::gib);
  }
  std::printf("  (llama2_7b has %lld parameters; activations come on top)\n",
              static_cast<long long>(real.num_params()));
  return 0;
}

// --pp: the pipeline plan (plan/pipeline.hpp), one row per pipeline rank.
// The model state is the ideal accounting of each rank's chunks (no
// buckets or padding); activations are the saved records and the message
// buffers between actions at their most, without the workspaces inside an
// action. The bubble is idealised: no communication cost.
int print_pipeline(const options& o) {
  const auto cfg = nn::llama_config::from_name(o.preset);
  const auto d = plan::dtype_sizes::from_name(policy_name(o.precision));
  check_batch(o);
  TESSERA_THROW_IF(o.pp < 1 || o.pp > 1024, config_error, "pp=", o.pp, " must be in [1, 1024]");
  TESSERA_THROW_IF(
      parallel::parse_grad_reduction(o.grad_reduce) == parallel::grad_reduction::per_micro_batch,
      config_error, "--grad-reduce micro-batch with a pipeline (pp=", o.pp,
      "): its stages interleave micro-batches, so gradients reduce once per step "
      "(--grad-reduce step)");
  TESSERA_THROW_IF(o.virtual_stages < 1 || o.virtual_stages > 1024, config_error,
                   "virtual-stages=", o.virtual_stages, " must be in [1, 1024]");
  TESSERA_THROW_IF(o.ce_chunk < 1, config_error, "ce-chunk=", o.ce_chunk, " must be >= 1");
  // ZeRO shards over the ranks holding the same weights: dp x cp.
  const plan::sharding sh{o.zero, o.dp * o.cp, o.prefetch, parallel::default_bucket_bytes, 0, o.tp,
                          0};
  sh.validate();
  plan::pipeline_options p;
  p.pp = o.pp;
  p.virtual_stages = o.virtual_stages;
  p.schedule = parallel::parse_schedule_kind(o.schedule);
  p.micro_batches = o.micro_batches;
  p.stage_blocks = o.stage_blocks;
  p.act.micro_batch = o.micro_batch;
  p.act.seq = o.seq;
  p.act.tp = o.tp;
  p.act.sequence_parallel = o.sequence_parallel;
  p.act.cp = o.cp;
  p.act.cp_kind = nn::parse_cp_kind(o.cp_kind);
  p.act.model.ce_chunk = o.ce_chunk;
  p.act.model.checkpointing = {nn::parse_checkpointing(o.checkpointing), o.checkpoint_layers};
  p.act.model.fp8 = fp8_recipe_of(o);
  const plan::pipeline_plan pl =
      plan::plan_pipeline(cfg, d, plan::optimizer_spec::from_name(o.optimizer), sh, p);
  // Whether it fits --memory-gib: the stage of the largest peak.
  std::uint64_t peak = 0;
  for (const auto& st : pl.stages) peak = std::max(peak, st.peak());
  const double margin = o.memory_gib * plan::gib - static_cast<double>(peak);
  const bool fits = margin >= 0;
  auto blocks = [](const plan::pipeline_stage_plan& st) {
    std::string b;
    for (const auto& ch : st.chunks)
      b += tessera::detail::str(b.empty() ? "" : ",", ch.range.embedding ? "E+" : "",
                                ch.range.first_block, "-", ch.range.last_block - 1,
                                ch.range.head ? "+H" : "");
    return b;
  };
  if (o.json) {
    nlohmann::json j;
    j["preset"] = cfg.name;
    j["precision"] = d.name;
    j["dp"] = o.dp;
    j["zero"] = o.zero;
    j["tp"] = o.tp;
    j["pp"] = o.pp;
    j["schedule"] = parallel::to_string(pl.schedule);
    j["virtual_stages"] = o.virtual_stages;
    j["micro_batches"] = o.micro_batches;
    j["micro_batch"] = pl.B;
    j["seq"] = pl.T;
    j["bubble_fraction"] = pl.bubble_fraction;
    j["bubble_closed_form"] = pl.bubble_closed_form;
    j["step_time_flops_per_token"] = pl.step_time;
    j["memory_gib"] = o.memory_gib;
    j["peak_bytes"] = peak;
    j["fits"] = fits;
    j["margin_bytes"] = margin;
    nlohmann::json stages = nlohmann::json::array();
    for (const auto& st : pl.stages) {
      nlohmann::json chunks = nlohmann::json::array();
      for (const auto& ch : st.chunks)
        chunks.push_back({{"chunk", ch.chunk},
                          {"virtual_stage", ch.virtual_stage},
                          {"first_block", ch.range.first_block},
                          {"last_block", ch.range.last_block},
                          {"embedding", ch.range.embedding},
                          {"head", ch.range.head},
                          {"params", ch.params},
                          {"gathered_bytes", ch.gathered},
                          {"saved_bytes", ch.saved},
                          {"weight_pending_bytes", ch.weight_pending},
                          {"peak_in_flight", ch.peak_in_flight},
                          {"flops_per_token", ch.flops_per_token}});
      stages.push_back({{"stage", st.stage},
                        {"chunks", chunks},
                        {"params", st.params},
                        {"weights", st.weights},
                        {"grads", st.grads},
                        {"master", st.master},
                        {"optimizer", st.optimizer},
                        {"model_state", st.model_state()},
                        {"gathered", st.gathered},
                        {"reduce_staging", st.reduce_staging},
                        {"peak_in_flight", st.peak_in_flight},
                        {"peak_record_bytes", st.peak_record_bytes},
                        {"peak_activation_bytes", st.peak_activation_bytes},
                        {"p2p_bytes_per_step", st.p2p_bytes},
                        {"sends_per_step", st.sends},
                        {"busy", st.busy},
                        {"fp8_scalars", st.fp8.scalars},
                        {"fp8_state", st.fp8.state},
                        {"fp8_operands", st.fp8.operands},
                        {"peak", st.peak()}});
    }
    j["stages"] = stages;
    std::cout << nlohmann::json{{"pipeline", j}}.dump(2) << "\n";
    return fits ? 0 : 1;
  }
  std::printf(
      "Pipeline plan: %s (%lld parameters), %s, pp=%d %s V=%d, M=%lld micro-batches "
      "of B %lld x T %lld per dp rank, dp=%d zero-%d, tp=%d, checkpointing %s\n",
      cfg.name.c_str(), static_cast<long long>(cfg.num_params()), d.name.c_str(), o.pp,
      parallel::to_string(pl.schedule), o.virtual_stages, static_cast<long long>(o.micro_batches),
      static_cast<long long>(pl.B), static_cast<long long>(pl.T), o.dp, o.zero, o.tp,
      o.checkpointing.c_str());
  // ZeRO-2/3 add a column: the gradient buckets of the accumulation window;
  // ZeRO-3 another: the segments a rank's engine holds gathered at once.
  // FP8 policies another: the FP8 state and operand copies of the stage's blocks.
  const bool z2 = o.zero >= 2, z3 = o.zero >= 3, f8 = d.fp8_linear;
  std::printf("  %-5s %-16s %14s %10s%s%s%s %6s %10s %12s\n", "stage", "blocks", "params",
              "state GiB", z2 ? "  bucket GiB" : "", z3 ? "  gath. GiB" : "", f8 ? "  fp8 GiB" : "",
              "held", "act GiB", "p2p MB/step");
  for (const auto& st : pl.stages) {
    char buckets[16] = "", gathered[16] = "", fp8[16] = "";
    if (z2)
      std::snprintf(buckets, sizeof buckets, " %11.3f",
                    static_cast<double>(st.reduce_staging) / plan::gib);
    if (z3)
      std::snprintf(gathered, sizeof gathered, " %10.3f",
                    static_cast<double>(st.gathered) / plan::gib);
    if (f8)
      std::snprintf(fp8, sizeof fp8, " %8.3f", static_cast<double>(st.fp8.total()) / plan::gib);
    std::printf("  %-5d %-16s %14lld %10.3f%s%s%s %6lld %10.3f %12.1f\n", st.stage,
                blocks(st).c_str(), static_cast<long long>(st.params),
                static_cast<double>(st.model_state()) / plan::gib, buckets, gathered, fp8,
                static_cast<long long>(st.peak_in_flight),
                static_cast<double>(st.peak_activation_bytes) / plan::gib,
                static_cast<double>(st.p2p_bytes) / 1e6);
  }
  std::printf(
      "  (state: weights + gradients + master + optimizer, ideal accounting%s; held: "
      "micro-batches in flight at most; act: saved records and message buffers at "
      "their most, without the workspaces inside an action; E embedding, H head)\n",
      z3   ? ", each a dp shard; bucket: the gradient buffers of the accumulation window; "
             "gath.: the ZeRO-3 segments gathered at once at most, inside a forward or backward"
      : z2 ? "; bucket: the gradient buffers of the accumulation window"
           : "");
  if (f8)
    std::printf(
        "  (fp8: the FP8 state of the stage's blocks, %s scaling%s, and the float copies of "
        "the largest FP8 operands, per rank; in the peak)\n",
        precision::to_string(p.act.model.fp8.scaling),
        p.act.model.fp8.scaling == precision::fp8_scaling::delayed
            ? tessera::detail::str(", amax history ", p.act.model.fp8.history).c_str()
            : "");
  std::printf(
      "Pipeline bubble: %.2f%% simulated (stage costs proportional to their FLOPs, "
      "no communication cost), %.2f%% closed form %s\n",
      100.0 * pl.bubble_fraction, 100.0 * pl.bubble_closed_form,
      pl.schedule == parallel::schedule_kind::interleaved
          ? "(K-1)/(VM+K-1)"
          : (pl.schedule == parallel::schedule_kind::zero_bubble_h1 && o.micro_batches >= o.pp
                 ? "(K-1)/(3M+K-1)"
                 : "(K-1)/(M+K-1)"));
  std::printf("Memory: the largest stage's peak %.2f GiB (%.2f GB) of %.2f GiB: %s, margin %.2f "
              "GiB (model state, gathered segments, gradient buckets%s and activations each at "
              "their most; no workspaces inside an action)\n",
              static_cast<double>(peak) / plan::gib, static_cast<double>(peak) / 1e9,
              o.memory_gib, fits ? "fits" : "DOES NOT FIT", margin / plan::gib,
              f8 ? ", FP8 state and operand copies" : "");
  return fits ? 0 : 1;
}

int run(const options& o) {
  const auto cfg = nn::llama_config::from_name(o.preset);
  const auto d = plan::dtype_sizes::from_name(policy_name(o.precision));
  TESSERA_THROW_IF(o.accounting != "engine" && o.accounting != "ideal", config_error,
                   "accounting '", o.accounting, "' (valid: engine, ideal)");
  const auto mode = o.accounting == "ideal" ? plan::accounting::ideal : plan::accounting::engine;
  TESSERA_THROW_IF(!(o.bucket_mb > 0) || !(o.bucket_mb <= 1e6), config_error,
                   "bucket-mb=", o.bucket_mb, " must be in (0, 1e6]");
  const plan::sharding sh{
      o.zero,
      o.dp * o.cp,  // ZeRO shards over the ranks holding the same weights: dp x cp
      o.prefetch,
      std::max<std::int64_t>(1, std::llround(o.bucket_mb * 1e6)),
      0,
      o.tp,
      0,
      parallel::parse_grad_reduction(o.grad_reduce) == parallel::grad_reduction::per_micro_batch,
      o.micro_batches};
  sh.validate();
  const std::int64_t reduce_bytes =
      o.reduce_bytes ? o.reduce_bytes : static_cast<std::int64_t>(d.reduce);
  check_batch(o);
  TESSERA_THROW_IF(reduce_bytes != 2 && reduce_bytes != 4 && reduce_bytes != 8, config_error,
                   "reduce-bytes=", reduce_bytes, " must be 2, 4 or 8");
  TESSERA_THROW_IF(!(o.memory_gib > 0), config_error, "memory-gib=", o.memory_gib, " must be > 0");
  TESSERA_THROW_IF(!(o.peak_tflops > 0) || !std::isfinite(o.peak_tflops), config_error,
                   "peak-tflops=", o.peak_tflops, " must be a finite number > 0");
  TESSERA_THROW_IF(o.step_seconds < 0 || (o.step_seconds_given && !(o.step_seconds > 0)),
                   config_error, "step-seconds=", o.step_seconds, " must be > 0");
  TESSERA_THROW_IF(o.prefetch < 0 || o.prefetch > cfg.n_layers, config_error,
                   "prefetch=", o.prefetch, " must be in [0, ", cfg.n_layers,
                   "] (the model's blocks)");
  plan::activation_options ao;
  ao.micro_batch = o.micro_batch;
  ao.seq = o.seq;
  ao.threads = o.threads;
  ao.micro_batches = o.micro_batches;
  ao.tp = o.tp;
  ao.sequence_parallel = o.sequence_parallel;
  ao.cp = o.cp;
  ao.cp_kind = nn::parse_cp_kind(o.cp_kind);
  ao.model.ce_chunk = o.ce_chunk;
  ao.model.checkpointing = {nn::parse_checkpointing(o.checkpointing), o.checkpoint_layers};
  ao.model.fp8 = fp8_recipe_of(o);
  TESSERA_THROW_IF(o.ce_chunk < 1, config_error, "ce-chunk=", o.ce_chunk, " must be >= 1");
  TESSERA_THROW_IF(o.seq < 1, config_error, "sequence length T=", o.seq, " must be >= 1");
  auto dr = d;
  dr.reduce = static_cast<std::size_t>(reduce_bytes);
  const auto mem =
      plan::plan_memory(cfg, dr, plan::optimizer_spec::from_name(o.optimizer), sh, ao, mode);
  const auto comm = plan::plan_comm(cfg, sh,
                                    {static_cast<std::size_t>(reduce_bytes), d.param,
                                     o.micro_batches, 0, o.optimizer == "adafactor"},
                                    mode);
  const auto flops =
      plan::plan_flops(cfg, o.micro_batch, o.seq, o.micro_batches, o.dp, o.tp, o.cp);
  // Tensor parallelism runs on the host communicators, which move float
  // and double: 16-bit tensors travel as float.
  plan::tp_traffic traffic;
  traffic.act = std::max<std::size_t>(4, d.param);
  traffic.act_grad = std::max<std::size_t>(4, d.act_grad);
  traffic.accum = d.accum;
  traffic.grad = d.grad;
  traffic.ce_chunk = o.ce_chunk;
  traffic.checkpointing = ao.model.checkpointing;
  traffic.sequence_parallel = o.sequence_parallel;
  const std::uint64_t tp_bytes =
      plan::plan_tp_bytes(cfg, o.micro_batch, o.seq / o.cp, o.micro_batches, o.tp, 0, traffic);
  const std::uint64_t kv_bytes = plan::plan_kv_replica_bytes(cfg, o.micro_batches, o.tp, 0, d.grad);
  // Context parallelism on the host communicators, 16-bit as float too.
  plan::cp_traffic cpt;
  cpt.param = static_cast<std::int64_t>(d.param);
  cpt.act_grad = static_cast<std::int64_t>(d.act_grad);
  cpt.accum = static_cast<std::int64_t>(d.accum);
  cpt.param_wire = std::max<std::int64_t>(4, cpt.param);
  cpt.grad_wire = std::max<std::int64_t>(4, cpt.act_grad);
  cpt.checkpointing = ao.model.checkpointing;
  const std::uint64_t cp_bytes = plan::plan_cp_bytes(cfg, o.micro_batch, o.seq, o.micro_batches,
                                                     o.cp, o.tp, ao.cp_kind, cpt);

  // Check before reporting: the persistent rows add up to their subtotal,
  // and the total is it plus the larger of backward's and the update's transients.
  std::uint64_t sum = 0;
  for (const auto& [k, v] : mem.rows()) {
    if (k == "persistent") break;
    sum += v;
  }
  TESSERA_THROW_IF(sum != mem.persistent(), error, "plan rows sum to ", sum, " != persistent ",
                   mem.persistent());
  TESSERA_THROW_IF(mem.total() != sum + std::max({mem.state.gathered + mem.state.reduce_staging +
                                                      mem.activations.peak,
                                                  mem.state.update_gather, mem.norm_scratch}),
                   error, "plan total ", mem.total(), " does not add up");

  const double capacity = o.memory_gib * plan::gib;
  const double margin = capacity - static_cast<double>(mem.total());
  const bool fits = margin >= 0;
  const double peak = o.peak_tflops * 1e12;
  if (o.json) {
    nlohmann::json j = mem.to_json();
    j["comm"] = plan::to_json(comm);
    j["flops"] = plan::to_json(flops);
    j["tp"] = o.tp;
    j["sequence_parallel"] = o.sequence_parallel;
    j["tp_bytes_per_step"] = tp_bytes;
    j["kv_replica_bytes_per_step"] = kv_bytes;
    j["cp"] = o.cp;
    j["cp_kind"] = o.cp_kind;
    j["cp_bytes_per_step"] = cp_bytes;
    j["memory_gib"] = o.memory_gib;
    j["fits"] = fits;
    j["margin_bytes"] = margin;
    if (o.step_seconds > 0) j["mfu"] = flops.mfu(o.step_seconds, peak);
    std::cout << j.dump(2) << "\n";
    return fits ? 0 : 1;
  }
  if (o.tp > 1)
    std::printf("tp=%d (world dp %d x tp %d): the bytes below are one tp rank's, its shards%s\n",
                o.tp, o.dp, o.tp, o.sequence_parallel ? ", sequence parallel" : "");
  if (o.cp > 1)
    std::printf(
        "cp=%d (%s): each rank holds %lld of every sequence's %lld tokens (head-tail); the "
        "activations below are one cp rank's\n",
        o.cp, o.cp_kind.c_str(), static_cast<long long>(o.seq / o.cp),
        static_cast<long long>(o.seq));
  std::printf("%s", mem.to_table().c_str());
  std::printf(
      "\nFLOPs per step (per rank, %lld tokens): %.4g model FLOPs (%.4g per token); "
      "6ND over %lld global tokens: %.4g\n",
      static_cast<long long>(flops.tokens_per_rank), flops.flops_per_rank, flops.flops_per_token,
      static_cast<long long>(flops.tokens_global), flops.six_nd);
  std::printf("  at %.0f TFLOP/s peak and 40%% MFU: %.3f s per step\n", o.peak_tflops,
              flops.step_seconds(peak, 0.40));
  if (o.step_seconds > 0)
    std::printf("  measured %.3f s per step: MFU %.1f%%\n", o.step_seconds,
                100.0 * flops.mfu(o.step_seconds, peak));
  std::printf(
      "\nCommunication per step (zero-%d, dp=%d, %s, ring, %zu-byte reduction, %zu-byte "
      "parameters, %lld micro-batches):\n%s",
      o.zero, o.dp, o.accounting.c_str(), reduce_bytes, d.param,
      static_cast<long long>(o.micro_batches), plan::to_table(comm).c_str());
  if (o.tp > 1)
    std::printf(
        "\nTensor parallelism tp=%d: each rank holds its shards of the blocks and of "
        "the vocabulary (the norm gains whole) and sends %llu B (%.2f GiB) per step in "
        "the tp %s, on top of the data-parallel traffic above (per block and "
        "micro-batch four of B T H elements, ring, plus the embedding and the "
        "cross-entropy; 16-bit elements as float, as the host communicators move them)\n",
        o.tp, static_cast<unsigned long long>(tp_bytes), static_cast<double>(tp_bytes) / plan::gib,
        o.sequence_parallel
            ? "all-gathers and reduce-scatters (sequence parallel: norms and residuals "
              "hold T/tp tokens; the norm outputs are gathered again in backward)"
            : "all-reduces");
  if (o.cp > 1)
    std::printf(
        "\nContext parallelism cp=%d (%s): each rank sends %llu B (%.3f GiB) per step on its "
        "cp group (per block and micro-batch the attention's forward and backward, "
        "nn::cp_attention_bytes; a recomputed block's forward again)\n",
        o.cp, o.cp_kind.c_str(), static_cast<unsigned long long>(cp_bytes),
        static_cast<double>(cp_bytes) / plan::gib);
  if (kv_bytes > 0)
    std::printf(
        "Key/value heads: tp=%d > nkv=%lld, each head on %d ranks, whose wk and wv "
        "gradients they sum: %llu B per step per rank\n",
        o.tp, static_cast<long long>(cfg.n_kv_heads), nn::kv_replicas(cfg, o.tp),
        static_cast<unsigned long long>(kv_bytes));
  std::printf("\nMemory: %.2f GiB of %.2f GiB: %s, margin %.2f GiB\n",
              static_cast<double>(mem.total()) / plan::gib, o.memory_gib,
              fits ? "fits" : "DOES NOT FIT", margin / plan::gib);
  return fits ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"plan: per-rank memory, FLOPs and communication of a Llama training step"};
  app.add_option("--preset", o.preset,
                 "tiny, small, llama2_7b, llama3_8b, llama3_1_8b, llama3_2_1b, llama3_2_3b")
      ->capture_default_str();
  app.add_option("--precision", o.precision,
                 "fp32, fp64, bf16_mixed (or bf16), bf16_mixed_bf16_grads, fp16_mixed (or fp16), "
                 "fp8_mixed (or fp8), seed004 (--gpu-step: bf16_mixed_bf16_grads, bf16_mixed, "
                 "fp16_mixed or fp8_mixed; default bf16_mixed_bf16_grads)")
      ->capture_default_str();
  app.add_option("--fp8-scaling", o.fp8_scaling,
                 "fp8_mixed: delayed (amax histories) or current scaling")
      ->capture_default_str();
  app.add_option("--fp8-amax-history", o.fp8_amax_history,
                 "fp8_mixed, delayed scaling: amaxes each scale keeps (floats per history)")
      ->capture_default_str();
  app.add_option("--dp", o.dp, "data-parallel ranks")->capture_default_str();
  app.add_option("--tp", o.tp, "tensor-parallel ranks (per-rank bytes are one tp rank's)")
      ->capture_default_str();
  app.add_flag("--sequence-parallel", o.sequence_parallel,
               "with --tp > 1: norms and residuals hold T/tp tokens");
  app.add_option("--cp", o.cp,
                 "context-parallel ranks (per-rank activations are one cp rank's T/cp tokens)")
      ->capture_default_str();
  app.add_option("--cp-kind", o.cp_kind, "ring or ulysses (with --cp > 1)")->capture_default_str();
  app.add_option("--zero", o.zero, "ZeRO stage 0..3")->capture_default_str();
  app.add_option("--prefetch", o.prefetch, "ZeRO-3 units gathered ahead")->capture_default_str();
  app.add_option("--micro-batch", o.micro_batch, "sequences per micro-batch (B)")
      ->capture_default_str();
  app.add_option("--seq", o.seq, "tokens per sequence (T)")->capture_default_str();
  app.add_option("--micro-batches", o.micro_batches, "micro-batches per rank per step")
      ->capture_default_str();
  app.add_option("--ce-chunk", o.ce_chunk, "token rows per LM-head/CE chunk")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "threads (attention scratch is per thread)")
      ->capture_default_str();
  app.add_option("--reduce-bytes", o.reduce_bytes,
                 "bytes per element of the gradient reduction (0: the precision's reduce type)")
      ->capture_default_str();
  app.add_option("--grad-reduce", o.grad_reduce,
                 "when gradient buckets reduce: step (once per step, the window accumulated) or "
                 "micro-batch (zero 2, 3: every micro-batch, two bucket buffers at most)")
      ->capture_default_str();
  app.add_option("--bucket-mb", o.bucket_mb, "gradient bucket size in MB (engine, zero 0-2)")
      ->capture_default_str();
  app.add_option("--accounting", o.accounting,
                 "engine (what tessera's data-parallel engine does) or ideal (ZeRO paper)")
      ->capture_default_str();
  app.add_option("--memory-gib", o.memory_gib, "device memory in GiB (140.4: one H200, 143771 MiB)")
      ->capture_default_str();
  app.add_option("--peak-tflops", o.peak_tflops, "peak TFLOP/s per device")->capture_default_str();
  app.add_option("--step-seconds", o.step_seconds, "measured step time, for MFU");
  app.add_flag("--json", o.json, "print JSON instead of tables");
  app.add_flag("--seed004", o.seed004, "print seeds/004's ZeRO table and exit");
  app.add_flag("--gpu-step", o.gpu_step,
               "plan the one-GPU step of train::trainer<P, cuda> instead (bf16 activation "
               "gradients and full checkpointing by default)");
  app.add_option("--checkpointing", o.checkpointing,
                 "activation checkpointing, none or full (default: none; full with --gpu-step)");
  app.add_option("--checkpoint-layers", o.checkpoint_layers,
                 "with --checkpointing full: every k-th block recomputes")
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer,
                 "adamw, sgd, lion, adafactor (its statistics counted per tensor) or muon (its "
                 "AdamW moments and Newton-Schulz scratch per tensor)")
      ->capture_default_str()
      ->capture_default_str();
  app.add_option("--pp", o.pp, "pipeline ranks (> 1: print the pipeline plan)")
      ->capture_default_str();
  app.add_option("--schedule", o.schedule, "pipeline schedule: gpipe, 1f1b, interleaved, zb1")
      ->capture_default_str();
  app.add_option("--virtual-stages", o.virtual_stages,
                 "model chunks per pipeline rank (interleaved)")
      ->capture_default_str();
  app.add_option(
         "--stage-blocks", o.stage_blocks,
         "blocks of each of pp x V virtual stages, comma-separated (default: balanced by FLOPs)")
      ->delimiter(',');
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "plan: error: %s\n", e.what());
    return 2;
  }
  o.step_seconds_given = app.count("--step-seconds") > 0;
  o.ce_chunk_given = app.count("--ce-chunk") > 0;
  o.schedule_given = app.count("--schedule") > 0 || app.count("--virtual-stages") > 0 ||
                     app.count("--stage-blocks") > 0;
  try {
    if (o.seed004) return print_seed004();
    if (o.checkpointing.empty()) o.checkpointing = o.gpu_step ? "full" : "none";
    if (o.gpu_step && app.count("--precision") == 0) o.precision = "bf16_mixed_bf16_grads";
    for (const char* f : {"--fp8-scaling", "--fp8-amax-history"})
      TESSERA_THROW_IF(app.count(f) > 0 && policy_name(o.precision) != "fp8_mixed", config_error, f,
                       " sets the FP8 recipe: it needs --precision fp8_mixed (--precision ",
                       o.precision, " has no FP8 GEMMs)");
    (void)fp8_recipe_of(o);
    TESSERA_THROW_IF(o.checkpoint_layers < 1, config_error,
                     "checkpoint-layers=", o.checkpoint_layers, " must be >= 1");
    TESSERA_THROW_IF(o.tp < 1 || o.tp > 64, config_error, "tp=", o.tp,
                     " must be in [1, 64] (one node's ranks)");
    TESSERA_THROW_IF(o.cp < 1 || o.cp > 64, config_error, "cp=", o.cp, " must be in [1, 64]");
    (void)nn::parse_cp_kind(o.cp_kind);
    TESSERA_THROW_IF(app.count("--cp-kind") > 0 && o.cp == 1, config_error, "--cp-kind ",
                     o.cp_kind, " needs --cp > 1");
    TESSERA_THROW_IF(o.gpu_step && o.cp > 1, config_error, "--gpu-step plans one GPU: --cp ", o.cp,
                     " must be 1 (plan a cp rank's bytes without --gpu-step)");
    if (o.cp > 1) (void)cp_shard::of(o.seq, o.cp, 0);  // 2 cp must divide T, before T/cp is used
    if (o.sequence_parallel) nn::check_sequence_parallel(o.seq / o.cp, o.tp);
    TESSERA_THROW_IF(o.gpu_step && o.tp > 1, config_error, "--gpu-step plans one GPU: --tp ", o.tp,
                     " must be 1 (plan a tp rank's bytes without --gpu-step)");
    TESSERA_THROW_IF(o.gpu_step && (o.pp != 1 || o.schedule_given), config_error,
                     "--gpu-step plans one GPU without a pipeline: --pp ", o.pp, " must be 1");
    if (o.gpu_step) return print_gpu_step(o);
    // A pipeline: without --zero its plan shards over dp as ZeRO-1 does
    // (--zero 3 counts the weight shards and the gathered segments too).
    if (o.pp > 1 && app.count("--zero") == 0) o.zero = 1;
    if (o.pp != 1) return print_pipeline(o);
    TESSERA_THROW_IF(
        o.schedule_given, config_error,
        "--schedule, --virtual-stages and --stage-blocks plan a pipeline: give --pp > 1");
    return run(o);
  } catch (const config_error& e) {
    std::fprintf(stderr, "plan: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plan: failed: %s\n", e.what());
    return 1;
  }
}
