// llama7b_step: the cost of real optimizer steps of a 7B-class Llama on this
// machine (single rank, host or one GPU: train::trainer<P, Backend>). Builds the llama2_7b
// (or llama3_8b) preset with its real sizes (H, heads, F, V) but only the
// first --layers blocks, AdamW over the whole flat buffer at --precision,
// and times --steps optimizer steps after --warmup-steps untimed ones on
// seeded random tokens of the preset's vocabulary (a token file written to
// a temporary path and removed at exit). It prints:
//   - step time (best and mean) and tokens/s;
//   - MFU and HFU against the device's peak (host: the theoretical fp32
//     rate, threads x clock x FLOPs per cycle, kernels/peak.hpp, with the
//     measured sgemm rate beside it; GPU: the datasheet's dense bf16 rate;
//     or --peak-tflops), with the FLOP formula
//     (nn::flops_per_token: 6 N_matmul + 6 L H T per token, causal
//     attention counted once). HFU also counts the recomputation of
//     activation checkpointing (nn::recompute_flops_per_token);
//   - the peak bytes of the run's own caching resource during a step
//     against the planner's prediction for the same config (plan_memory,
//     dp 1, zero 0, micro-batch B, seq T) and their ratio;
//   - the parameter count of the full preset and of the layers built.
// Before any time is reported it checks the result: the first step's loss
// must be finite and within 1 nat of ln(V) (random tokens, fresh weights).
//
// --backend cuda (a build with the cuda preset) runs the same trainer on one
// GPU: all 32 layers at T 4096 and B 1 by default, bf16 weights,
// activations and activation gradients, float32 gradients, AdamW on the
// device, --checkpointing full (default) or none, fed by the pinned
// double-buffered loader. It prints the planner's device memory and margin
// first, then step time, tokens/s, MFU and HFU (HFU adds the recomputed
// forward) against the datasheet's rate, and the allocator's peak against the plan.
// --checkpointing full works on the host too (HFU then exceeds MFU).
// --precision fp16 trains under the dynamic loss scale on either backend;
// --precision fp8 (the blocks' linear layers as FP8 GEMMs, delayed scaling)
// on either backend (cuBLASLt's FP8 matmul on a GPU with FP8 tensor
// cores); on the host it also prints the planned FP8 state and operand
// copies (plan/fp8.hpp) beside what the model holds after the steps.
// --json FILE writes the figures (benchmarks/device_check.sh reads them);
// --memory-log FILE the device allocator's event log, which
// scripts/plot_memory.py plots against the plan.
//
// clang-format off
//   build/cuda/examples/llama7b_step --backend cuda                   # llama2_7b, 32 layers, T 4096, B 1
//   build/cuda/examples/llama7b_step --backend cuda --layers 2 --seq 1024 --steps 3 --json /tmp/s.json
//   build/host/examples/llama7b_step                                  # llama2_7b, 1 layer, T 256, 2 steps
//   build/host/examples/llama7b_step --layers 1 --seq 256 --steps 2
//   build/host/examples/llama7b_step --precision bf16 --layers 2 --seq 512 --micro-batch 2
//   build/host/examples/llama7b_step --precision fp8 --layers 1 --seq 64 --steps 1
//   build/host/examples/llama7b_step --preset llama3_8b --layers 1 --seq 128 --steps 1
//   build/host/examples/llama7b_step --layers 1 --seq 32 --steps 1 --warmup-steps 0   # the ctest
// clang-format on
//
// Memory: AdamW state is 16 bytes per parameter in fp32 (weights, gradients,
// two moments) and 18 in bf16 (bf16 weights, fp32 gradients, master, two
// moments). llama2_7b with 1 layer has ~0.46B parameters (the embedding and
// LM head are 0.26B of them): ~7.4 GB fp32, ~8.4 GB bf16; llama3_8b with 1
// layer has ~1.27B: ~20 GB fp32.
//
// Exit status: 0 on success, 2 on bad input (one-line error naming the value
// and the limit), 1 if the check fails or anything else goes wrong.

#include <unistd.h>

#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/comm/self.hpp"
#include "tessera/core/memory.hpp"
#include "tessera/core/random.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/blas.hpp"
#include "tessera/kernels/peak.hpp"
#include "tessera/nn/flops.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/plan/memory.hpp"
#include "tessera/plan/step.hpp"
#include "tessera/precision/policy.hpp"
#include "tessera/train/trainer.hpp"
#if defined(TESSERA_EXAMPLE_CUDA)
#include "tessera/cuda.hpp"
#endif

namespace fs = std::filesystem;
using namespace tessera;

namespace {

struct options {
  std::string backend = "host";
  std::string preset = "llama2_7b";
  std::string precision = "";  // host: fp32, cuda: bf16_mixed_bf16_grads; bf16, fp16, fp8 short
  std::int64_t layers = 0;     // host: 1, cuda: all of the preset's
  std::int64_t seq = 0;        // host: 256, cuda: 4096
  std::int64_t micro_batch = 1;
  std::int64_t warmup_steps = 1;
  std::int64_t steps = 2;
  std::uint64_t seed = 1337;
  std::string checkpointing = "";      // host: none, cuda: full
  std::int64_t checkpoint_layers = 1;  // with full: every k-th block recomputes
  std::int64_t ce_chunk = 256;         // LM-head/CE chunk rows (cuda: 1024 by default)
  double peak_tflops = 0;              // 0: theoretical (host) or datasheet (GPU) peak
  std::string json;                    // write the results here too
  std::string memory_log;              // cuda: the allocator's event log (scripts/plot_memory.py)
};

// Throws config_error now, before any work, when `path` (if given) cannot be
// written: its temporary file is created and removed again.
void check_json_path(const std::string& path) {
  if (path.empty()) return;
  const fs::path tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    TESSERA_THROW_IF(!f, config_error, "cannot write '", tmp.string(), "' (for '", path, "')");
  }
  std::error_code ec;
  fs::remove(tmp, ec);
}

// Writes `j` to `path` through a temporary name and a rename.
void write_json(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  const fs::path tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    TESSERA_THROW_IF(!f, error, "cannot write '", tmp.string(), "'");
    f << j.dump(2) << "\n";
    TESSERA_THROW_IF(!f, error, "writing '", tmp.string(), "' failed");
  }
  fs::rename(tmp, path);
}

// The temporary token file, removed when the run ends (success or not).
struct temp_file {
  fs::path path;
  ~temp_file() {
    std::error_code ec;
    if (!path.empty()) fs::remove(path, ec);
  }
};

// Writes `n` seeded uniform random tokens below V to `path` (u16 when V fits).
void write_random_tokens(const fs::path& path, std::uint64_t n, std::int64_t V,
                         std::uint64_t seed) {
  std::vector<std::uint32_t> tok(n);
  rng r(seed);
  for (auto& t : tok)
    t = std::min<std::uint32_t>(static_cast<std::uint32_t>(r.uniform() * static_cast<double>(V)),
                                static_cast<std::uint32_t>(V - 1));
  data::write_token_file(path, tok, static_cast<std::uint64_t>(V),
                         V <= 65536 ? data::token_dtype::u16 : data::token_dtype::u32);
}

double gib(double bytes) {
  return bytes / plan::gib;
}

// What the warm-up and timed steps of a run measured.
struct step_times {
  double best = 0, mean = 0;  // seconds of the timed steps
  double first_loss = 0;      // of the first step (warm-up or timed)
  std::size_t mem_peak = 0;   // peak bytes allocated during a step, less `base`
};

// Runs --warmup-steps + --steps optimizer steps of `tr` (train::trainer on
// either backend), printing each. Checks the result before any time is
// reported: the first step's loss must be finite and within 1 nat of ln(V)
// (random tokens, fresh weights); otherwise prints why and returns nothing.
template <class Trainer>
std::optional<step_times> timed_steps(Trainer& tr, const options& o, std::int64_t V,
                                      std::size_t base) {
  step_times r;
  std::vector<double> secs;
  const double ln_v = std::log(static_cast<double>(V));
  for (std::int64_t s = 0; s < o.warmup_steps + o.steps; ++s) {
    const train::step_metrics m = tr.train_step();
    r.mem_peak = std::max<std::size_t>(r.mem_peak, m.mem_peak - base);
    const bool timed = s >= o.warmup_steps;
    std::printf("llama7b_step: step %lld (%s) loss %.4f, grad norm %.3g, %.3f s\n",
                (long long)m.step, timed ? "timed" : "warmup", m.loss, m.grad_norm, m.seconds);
    std::fflush(stdout);
    if (s == 0) {
      r.first_loss = m.loss;
      if (!std::isfinite(m.loss) || std::abs(m.loss - ln_v) > 1.0) {
        std::fprintf(stderr,
                     "llama7b_step: check failed: first step's loss %f is not finite or not "
                     "within 1 nat of ln(V) = %f (V = %lld)\n",
                     m.loss, ln_v, (long long)V);
        return std::nullopt;
      }
    }
    if (timed) secs.push_back(m.seconds);
  }
  r.best = *std::min_element(secs.begin(), secs.end());
  for (double x : secs) r.mean += x;
  r.mean /= static_cast<double>(secs.size());
  return r;
}

// The peak MFU is taken against: --peak-tflops if given; else on the host
// the theoretical fp32 peak (threads x clock x FLOPs per cycle, with the
// measured sgemm rate beside it), on a GPU its datasheet's dense bf16 rate.
template <class Backend>
kernels::peak_flops peak_of(const options& o) {
  if constexpr (std::is_same_v<Backend, host>) {
    auto p = kernels::host_peak(omp_get_max_threads(), kernels::measure_sgemm_flops(),
                                o.peak_tflops * 1e12);
    p.how += detail::str(", BLAS ", kernels::blas_core_name());
    return p;
  } else {
    kernels::peak_flops p;
    if (o.peak_tflops > 0) {
      p.flops = o.peak_tflops * 1e12;
      p.how = "given (--peak-tflops)";
    } else {
      p.flops = Backend::datasheet_bf16_flops(Backend::current_device());
      TESSERA_THROW_IF(!(p.flops > 0), config_error,
                       "this GPU is not in the table of datasheet bf16 rates: pass --peak-tflops");
      p.how = "the GPU's datasheet dense bf16 rate";
    }
    return p;
  }
}

// The visible GPU of backend B (its name and capability, and its memory in
// bytes); defined for tessera::cuda in a CUDA build only, and called only
// there (the host's run discards the branch that names it).
struct device_facts {
  std::string name;
  double bytes = 0;
};
template <class B>
device_facts visible_device();
#if defined(TESSERA_EXAMPLE_CUDA)
template <>
device_facts visible_device<tessera::cuda>() {
  TESSERA_THROW_IF(tessera::cuda::device_count() < 1, config_error,
                   "--backend cuda: no CUDA device is visible");
  cudaDeviceProp prop{};
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&prop, tessera::cuda::current_device()));
  const double bytes = static_cast<double>(prop.totalGlobalMem);
  return {detail::str(prop.name, " (", gib(bytes), " GiB, sm_", prop.major, prop.minor, ")"),
          bytes};
}
#endif

// One run on backend `Backend` with precision P: the same trainer on the
// host and on a GPU; only the peak, the device's capacity and the memory
// log differ.
template <precision::policy P, class Backend>
int run(const options& o, const nn::llama_config& full, const nn::llama_config& mc) {
  constexpr bool gpu = !std::is_same_v<Backend, host>;
  const std::int64_t B = o.micro_batch, T = o.seq, V = mc.vocab;
  const nn::checkpoint_policy ck{nn::parse_checkpointing(o.checkpointing), o.checkpoint_layers};
  TESSERA_THROW_IF(o.ce_chunk < 1, config_error, "--ce-chunk ", o.ce_chunk, " must be >= 1");
  train::train_config cfg;
  cfg.steps = o.warmup_steps + o.steps;
  cfg.global_batch = B;  // one micro-batch per step
  cfg.micro_batch = B;
  cfg.seq = T;
  cfg.lr = 3e-4;
  cfg.warmup = 0;
  cfg.eval_windows = 1;
  cfg.seed = o.seed;
  cfg.ce_chunk = o.ce_chunk;
  cfg.checkpointing = ck;

  // The planner's prediction for this config, before anything is
  // allocated: one rank, zero<0> (tests/plan/memory.cpp holds the host's
  // accounting to the byte against the same allocations).
  plan::activation_options ao;
  ao.micro_batch = B;
  ao.seq = T;
  ao.model.ce_chunk = o.ce_chunk;
  ao.model.checkpointing = ck;
  ao.model.fp8 = cfg.fp8;  // fp8_mixed: the recipe the trainer gives the model
  ao.threads = kernels::detail::attention_max_threads();
  ao.backend = gpu ? plan::backend_kind::cuda : plan::backend_kind::host;
  const auto mp =
      plan::plan_memory(mc, plan::dtype_sizes::of<P>(), plan::optimizer_spec::adamw(), {0, 1}, ao);
  const auto fp = plan::plan_flops(mc, B, T);
  // What the run's resource holds: on the host the FP8 state and operand
  // copies are heap memory outside it, so they are compared apart.
  const std::uint64_t fp8_outside = mp.fp8.outside_resource();
  check_json_path(o.json);
  check_json_path(o.memory_log);
  std::string device = "host";
  double device_bytes = 0;
  if constexpr (gpu) {
    // Everything the command line can get wrong is checked: now the device.
    const device_facts d = visible_device<Backend>();
    device = d.name;
    device_bytes = d.bytes;
    TESSERA_THROW_IF(static_cast<double>(mp.total()) > device_bytes, config_error, "the planned ",
                     gib(static_cast<double>(mp.total())), " GiB exceed the device's ",
                     gib(device_bytes),
                     " GiB; use fewer --layers, a shorter --seq, a smaller --micro-batch or "
                     "--checkpointing full");
  }

  // Random tokens: enough for the train split's windows and one validation window.
  temp_file tmp;
  tmp.path =
      fs::temp_directory_path() / ("tessera_llama7b_step_" + std::to_string(::getpid()) + ".tok");
  const std::uint64_t n_tokens =
      std::max<std::uint64_t>(4096, static_cast<std::uint64_t>(20 * (B + 1) * (T + 1)));
  write_random_tokens(tmp.path, n_tokens, V, o.seed);
  data::token_file corpus(tmp.path);

  const kernels::peak_flops pk = peak_of<Backend>(o);
  const double peak = pk.flops;
  std::printf(
      "llama7b_step: preset %s (H %lld, L %lld, heads %lld/%lld kv, F %lld, V %lld), "
      "built %lld of %lld layers, precision %s, AdamW, checkpointing %s (every %lld), "
      "single rank on %s\n",
      full.name.c_str(), (long long)mc.dim, (long long)full.n_layers, (long long)mc.n_heads,
      (long long)mc.n_kv_heads, (long long)mc.ffn_dim, (long long)V, (long long)mc.n_layers,
      (long long)full.n_layers, P::name, to_string(ck.mode), (long long)ck.every, device.c_str());
  std::printf("llama7b_step: parameters: full preset %lld (%.3fB), built %lld (%.3fB)\n",
              (long long)full.num_params(), full.num_params() / 1e9, (long long)mc.num_params(),
              mc.num_params() / 1e9);
  std::printf(
      "llama7b_step: B=%lld, T=%lld, %lld warmup + %lld timed steps on seeded random "
      "tokens (seed %llu, %llu tokens in %s)\n",
      (long long)B, (long long)T, (long long)o.warmup_steps, (long long)o.steps,
      (unsigned long long)o.seed, (unsigned long long)n_tokens, tmp.path.c_str());
  std::printf("llama7b_step: MFU against %s\n", kernels::describe_peak(pk).c_str());
  std::printf(
      "llama7b_step: planned %.3f GiB: persistent %.3f (weights %.3f, gradients %.3f, "
      "master %.3f, moments %.3f, RoPE %.3f, trainer %.6f, context %.3f) + activation "
      "peak %.3f%s\n",
      gib(static_cast<double>(mp.total())), gib(static_cast<double>(mp.persistent())),
      gib(static_cast<double>(mp.state.weights)), gib(static_cast<double>(mp.state.grads)),
      gib(static_cast<double>(mp.state.master)), gib(static_cast<double>(mp.state.optimizer)),
      gib(static_cast<double>(mp.state.rope_tables)), gib(static_cast<double>(mp.trainer)),
      gib(static_cast<double>(mp.context)), gib(static_cast<double>(mp.activations.peak)),
      gpu ? detail::str("; margin ", gib(device_bytes - static_cast<double>(mp.total())), " GiB")
                .c_str()
          : "");
  if constexpr (precision::fp8_linear<P>)
    std::printf(
        "llama7b_step: planned FP8: scalars %llu B, state %llu B (%lld blocks x %d "
        "linears, %s scaling, amax history %lld), operand copies %llu B (%.3f GiB)\n",
        (unsigned long long)mp.fp8.scalars, (unsigned long long)mp.fp8.state,
        (long long)mp.fp8.blocks, nn::block_linears,
        precision::to_string(cfg.fp8.scaling), (long long)cfg.fp8.history,
        (unsigned long long)mp.fp8.operands, gib(static_cast<double>(mp.fp8.operands)));
  std::fflush(stdout);

  using Ctx = kernels::context_t<Backend>;
  host_caching_resource host_mr;  // the host run's own resource: cached, counted
  std::unique_ptr<Ctx> ctx;
  if constexpr (gpu)
    ctx = std::make_unique<Ctx>();
  else
    ctx = std::make_unique<Ctx>(Ctx{&host_mr});
  memory_resource& mr = ctx->resource();
  ctx->synchronize();
  const std::size_t base = mr.stats().allocated;
  if constexpr (gpu)
    if (!o.memory_log.empty()) Backend::resource(Backend::current_device()).set_event_logging(true);
  const auto t_build = std::chrono::steady_clock::now();
  comm::self_communicator<Ctx> self(*ctx);
  train::trainer<P, Backend> tr(mc, cfg, corpus, parallel::layout{self}, {}, ctx.get());
  tr.set_peak_flops(peak);
  tr.set_blas_flops(pk.blas_flops);
  ctx->synchronize();
  const double build_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_build).count();
  std::printf(
      "llama7b_step: built and initialised in %.1f s; %.3f GiB allocated (planned "
      "persistent %.3f GiB%s)\n",
      build_s, gib(static_cast<double>(mr.stats().allocated - base)),
      gib(static_cast<double>(mp.persistent() - fp8_outside)), fp8_outside > 0 ? ", less FP8" : "");
  std::fflush(stdout);

  const auto run = timed_steps(tr, o, V, base);
  if (!run) return 1;
  const double best = run->best, mean = run->mean, first_loss = run->first_loss,
               ln_v = std::log(static_cast<double>(V));
  const std::size_t mem_peak = run->mem_peak;
  const double tokens = static_cast<double>(B * T);
  const double fpt = nn::flops_per_token(mc, T);
  const double rpt = nn::recompute_flops_per_token(mc, T, ck);
  const double H = static_cast<double>(mc.dim), L = static_cast<double>(mc.n_layers);
  const double n_matmul = (fpt - 6.0 * L * H * static_cast<double>(T)) / 6.0;
  const double mfu = fpt * tokens / mean / peak, mfu_best = fpt * tokens / best / peak;
  const double hfu = (fpt + rpt) * tokens / mean / peak;
  const double planned = static_cast<double>(mp.total() - fp8_outside);
  std::printf(
      "llama7b_step: check passed: first step's loss %.4f, ln(V) = %.4f (|diff| %.4f <= 1)\n",
      first_loss, ln_v, std::abs(first_loss - ln_v));
  std::printf("llama7b_step: step time best %.3f s, mean %.3f s over %zu timed steps\n", best, mean,
              static_cast<std::size_t>(o.steps));
  std::printf("llama7b_step: tokens/s %.1f (mean), %.1f (best); %lld tokens per step\n",
              tokens / mean, tokens / best, (long long)(B * T));
  std::printf(
      "llama7b_step: FLOPs: MFU counts nn::flops_per_token = 6 N_matmul + 6 L H T per "
      "token (causal attention counted once), N_matmul = %.0f (L %lld, H %lld, T %lld): "
      "%.4g FLOP/token, %.4g FLOP/step (plan_flops: %.4g); HFU adds the recomputed "
      "forward of checkpointing (nn::recompute_flops_per_token): %.4g FLOP/token\n",
      n_matmul, (long long)mc.n_layers, (long long)mc.dim, (long long)T, fpt, fpt * tokens,
      fp.flops_per_rank, rpt);
  std::printf("llama7b_step: MFU %s (mean), %s (best), HFU %s (mean) of peak %.1f GFLOP/s",
              train::format_utilisation(mfu).c_str(), train::format_utilisation(mfu_best).c_str(),
              train::format_utilisation(hfu).c_str(), peak / 1e9);
  if (pk.blas_flops > 0)
    std::printf("; %s (mean) of the measured sgemm rate",
                train::format_utilisation(fpt * tokens / mean / pk.blas_flops).c_str());
  std::printf("\n");
  std::printf(
      "llama7b_step: peak memory measured %.3f GiB (%zu B, the run's allocator during a "
      "step), planned %.3f GiB (%llu B, plan_memory dp 1, zero 0%s): measured/planned "
      "%.4f\n",
      gib(static_cast<double>(mem_peak)), mem_peak, gib(planned),
      (unsigned long long)(mp.total() - fp8_outside), fp8_outside > 0 ? ", less FP8" : "",
      static_cast<double>(mem_peak) / planned);
  if constexpr (precision::fp8_linear<P>) {
    if constexpr (!gpu) {
      // The model's FP8 states: per operand a scale and its history, and
      // each state's own scalars.
      std::uint64_t held = 0;
      for (const nn::fp8_linear_state& st : tr.model().fp8_linear_states()) {
        held += sizeof(float) * nn::fp8_linear_scalars;
        for (const precision::fp8_scale* sc : {&st.x, &st.w, &st.dy})
          held += sizeof(float) * (1 + sc->state()["amax_history"].size());
      }
      std::printf(
          "llama7b_step: FP8 outside the resource: state %llu B held by the model (planned "
          "%llu B), operand copies %zu B (nn::fp8_workspace_bytes; planned %llu B)\n",
          (unsigned long long)held, (unsigned long long)mp.fp8.state, nn::fp8_workspace_bytes(),
          (unsigned long long)mp.fp8.operands);
    }
  }
  if (mp.activations.host_gemm_workspace > 0)
    std::printf(
        "llama7b_step: the bf16 GEMM conversion buffers (%.3f GiB) live outside the "
        "resource\n",
        gib(static_cast<double>(mp.activations.host_gemm_workspace)));
  if constexpr (gpu) {
    if (!o.memory_log.empty()) {
      const fs::path tmp_log = o.memory_log + ".tmp";
      {
        std::ofstream f(tmp_log);
        TESSERA_THROW_IF(!f, error, "cannot write '", tmp_log.string(), "'");
        Backend::resource(Backend::current_device()).write_json(f);
        TESSERA_THROW_IF(!f, error, "writing '", tmp_log.string(), "' failed");
      }
      fs::rename(tmp_log, o.memory_log);
      std::printf(
          "llama7b_step: allocator event log %s (scripts/plot_memory.py %s --plan-bytes "
          "%llu)\n",
          o.memory_log.c_str(), o.memory_log.c_str(), (unsigned long long)mp.total());
    }
  }
  write_json(o.json, {{"backend", gpu ? "cuda" : "host"},
                      {"device", device},
                      {"preset", full.name},
                      {"layers", mc.n_layers},
                      {"precision", P::name},
                      {"checkpointing", to_string(ck.mode)},
                      {"checkpoint_every", ck.every},
                      {"B", B},
                      {"T", T},
                      {"steps", o.steps},
                      {"first_loss", first_loss},
                      {"step_s", mean},
                      {"step_best_s", best},
                      {"tokens_per_s", tokens / mean},
                      {"flops_per_token", fpt},
                      {"recompute_flops_per_token", rpt},
                      {"peak_flops", peak},
                      {"peak_how", pk.how},
                      {"blas_flops", pk.blas_flops},
                      {"mfu", mfu},
                      {"hfu", hfu},
                      {"peak_bytes", mem_peak},
                      {"planned_peak_bytes", mp.total()},
                      {"device_bytes", device_bytes}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kernels::check_blas_core(argv);
  options o;
  CLI::App app{
      "llama7b_step: time optimizer steps of a 7B-class Llama (single rank: the host, or one GPU "
      "with --backend cuda)"};
  app.add_option("--backend", o.backend, "host or cuda (a build with the cuda preset)")
      ->capture_default_str();
  app.add_option("--preset", o.preset, "llama2_7b or llama3_8b")->capture_default_str();
  app.add_option("--precision", o.precision,
                 "fp32, bf16 (bf16_mixed), bf16_mixed_bf16_grads, fp16 (fp16_mixed) or fp8 "
                 "(fp8_mixed); default fp32 on the host, bf16_mixed_bf16_grads "
                 "on cuda");
  app.add_option("--layers", o.layers,
                 "blocks to build, 1 to the preset's layers; default 1 on the host, all on cuda");
  app.add_option(
      "--seq", o.seq,
      "T: tokens per sequence, 1 to the preset's max_seq; default 256 on the host, 4096 on cuda");
  app.add_option("--micro-batch", o.micro_batch, "B: sequences per step")->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "untimed steps first")->capture_default_str();
  app.add_option("--steps", o.steps, "timed optimizer steps")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of weights and tokens")->capture_default_str();
  app.add_option("--checkpointing", o.checkpointing,
                 "activation checkpointing: none (the host's default) or full (cuda's)");
  app.add_option("--checkpoint-layers", o.checkpoint_layers,
                 "with --checkpointing full: every k-th block recomputes (1: all)")
      ->capture_default_str();
  app.add_option(
      "--ce-chunk", o.ce_chunk,
      "token rows per LM-head/cross-entropy chunk (default 256 on the host, 1024 on cuda)");
  app.add_option("--peak-tflops", o.peak_tflops,
                 "the peak TFLOP/s for MFU/HFU (default: the host's theoretical fp32 peak; a GPU's "
                 "datasheet dense bf16 rate)")
      ->check(CLI::Range(0.0, 1e9));
  app.add_option("--json", o.json, "also write the results to this JSON file");
  app.add_option(
      "--memory-log", o.memory_log,
      "cuda: write the device allocator's event log here (scripts/plot_memory.py plots it)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "llama7b_step: error: %s\n", e.what());
    return 2;
  }
  try {
    TESSERA_THROW_IF(o.backend != "host" && o.backend != "cuda", config_error, "unknown backend '",
                     o.backend, "' (valid: host, cuda)");
    const bool gpu = o.backend == "cuda";
    if (o.precision.empty()) o.precision = gpu ? "bf16_mixed_bf16_grads" : "fp32";
    o.precision = precision::policy_name(o.precision);
    if (o.checkpointing.empty()) o.checkpointing = gpu ? "full" : "none";
    if (gpu && app.count("--ce-chunk") == 0) o.ce_chunk = 1024;
    (void)nn::parse_checkpointing(o.checkpointing);
    TESSERA_THROW_IF(o.checkpoint_layers < 1, config_error, "--checkpoint-layers ",
                     o.checkpoint_layers, " must be >= 1");
    TESSERA_THROW_IF(app.count("--seq") && o.seq < 1, config_error, "--seq ", o.seq,
                     " must be >= 1");
    TESSERA_THROW_IF(app.count("--layers") && o.layers < 1, config_error, "--layers ", o.layers,
                     " must be >= 1");
    if (o.seq == 0) o.seq = gpu ? 4096 : 256;
    TESSERA_THROW_IF(o.preset != "llama2_7b" && o.preset != "llama3_8b", config_error,
                     "unknown preset '", o.preset, "' (valid: llama2_7b, llama3_8b)");
    const nn::llama_config full = nn::llama_config::from_name(o.preset);
    if (o.layers == 0) o.layers = gpu ? full.n_layers : 1;
    TESSERA_THROW_IF(o.precision != "fp32" && o.precision != "bf16_mixed" &&
                         o.precision != "bf16_mixed_bf16_grads" && o.precision != "fp16_mixed" &&
                         o.precision != "fp8_mixed",
                     config_error, "unknown precision '", o.precision,
                     "' (valid: fp32, bf16, bf16_mixed_bf16_grads, fp16, fp8)");
    TESSERA_THROW_IF(o.layers < 1 || o.layers > full.n_layers, config_error, "--layers ", o.layers,
                     " must be in [1, ", full.n_layers, "] (preset '", full.name, "')");
    TESSERA_THROW_IF(o.seq < 1 || o.seq > full.max_seq, config_error, "--seq ", o.seq,
                     " must be in [1, ", full.max_seq, "] (max_seq of preset '", full.name, "')");
    TESSERA_THROW_IF(o.micro_batch < 1, config_error, "--micro-batch ", o.micro_batch,
                     " must be >= 1");
    TESSERA_THROW_IF(o.steps < 1, config_error, "--steps ", o.steps, " must be >= 1");
    TESSERA_THROW_IF(o.warmup_steps < 0, config_error, "--warmup-steps ", o.warmup_steps,
                     " must be >= 0");
    nn::llama_config mc = full;
    mc.n_layers = o.layers;
    const bool bf16g = o.precision == "bf16_mixed_bf16_grads";
    if (gpu) {
      TESSERA_THROW_IF(o.precision == "fp32", config_error, "--precision ", o.precision,
                       ": the cuda backend trains 16-bit weights (bf16, bf16_mixed_bf16_grads, "
                       "fp16) and fp8; fp32 runs on the host");
#if defined(TESSERA_EXAMPLE_CUDA)
      if (o.precision == "fp16_mixed")
        return run<precision::fp16_mixed, tessera::cuda>(o, full, mc);
      if (o.precision == "fp8_mixed") return run<precision::fp8_mixed, tessera::cuda>(o, full, mc);
      return bf16g ? run<precision::bf16_mixed_bf16_grads, tessera::cuda>(o, full, mc)
                   : run<precision::bf16_mixed, tessera::cuda>(o, full, mc);
#else
      throw config_error(
          "--backend cuda: this build has no CUDA backend (configure with the cuda preset: "
          "cmake --preset cuda)");
#endif
    }
    TESSERA_THROW_IF(!o.memory_log.empty(), config_error,
                     "--memory-log: the host backend has no device allocator log (--backend cuda)");
    if (o.precision == "fp32") return run<precision::fp32, host>(o, full, mc);
    if (bf16g) return run<precision::bf16_mixed_bf16_grads, host>(o, full, mc);
    if (o.precision == "fp16_mixed") return run<precision::fp16_mixed, host>(o, full, mc);
    if (o.precision == "fp8_mixed") return run<precision::fp8_mixed, host>(o, full, mc);
    return run<precision::bf16_mixed, host>(o, full, mc);
  } catch (const config_error& e) {
    std::fprintf(stderr, "llama7b_step: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama7b_step: failed: %s\n", e.what());
    return 1;
  }
}
