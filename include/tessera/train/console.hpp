#pragma once
/// \file train/console.hpp
/// `console_log`: a train::observer (train/fit.hpp) that prints a run on
/// standard output as train_llama does: what is trained and how (model,
/// data, layout, batch, MFU reference), one line per step (or a progress
/// bar that fits the terminal, on a terminal), the trace's bubble, the
/// end with the final validation loss beside the baseline, the export and
/// the decoded sample. Every line starts with the prefix ("train_llama: ").

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/kernels/peak.hpp"
#include "tessera/nn/checkpointing.hpp"
#include "tessera/train/fit.hpp"
#include "tessera/train/metrics.hpp"

namespace tessera::train {

/// The columns of the terminal on standard output: its window size, else
/// $COLUMNS, else 80.
inline int terminal_columns() {
  winsize w{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    const int n = std::atoi(c);
    if (n > 0) return n;
  }
  return 80;
}

/// A progress line that fits `columns` columns: the bar (10 to 30 columns,
/// as room allows) and as much of `tail` as fits, cut with "...".
inline std::string fitted_progress(std::int64_t step, std::int64_t total, const std::string& tail,
                                   int columns) {
  const int bar = std::clamp(columns / 4, 10, 30);
  std::string line = progress_bar(step, total, tail, bar);
  const auto room = static_cast<std::size_t>(std::max(columns - 1, bar + 3));
  if (line.size() > room) line = line.substr(0, room - 3) + "...";
  return line;
}

/// The console log of a run (file comment).
class console_log : public observer {
 public:
  struct options {
    std::string prefix = "train_llama";      ///< every line starts "<prefix>: "
    std::string data_path;                   ///< the token file, as named in the log
    std::string tokenizer;                   ///< its tokenizer.json, named in the log ("": bytes)
    const data::token_file* data = nullptr;  ///< its sizes in the log (not owned)
    std::string communicator;                ///< the dp/tp/pp groups' communicator ("local", "mpi")
    /// The steps the resumed checkpoint's run planned (a log line when the
    /// schedule now runs further); 0: not a resume.
    std::int64_t planned_steps = 0;
    /// Turns sampled tokens into text (default: bytes, an id >= 256 as <id>).
    std::function<std::string(const std::vector<std::int32_t>&)> decode;
    /// A progress bar instead of step lines (default: when stdout is a terminal).
    bool progress = stdout_is_terminal();
  };
  explicit console_log(options o) : o_(std::move(o)) {}

  void on_start(const run_start& s) override {
    const nn::llama_config& c = *s.model;
    const train_config& cfg = *s.config;
    s_ = s;
    line(
        "model %s (dim %lld, layers %lld, heads %lld/%lld kv, ffn %lld, vocab %lld) %.2fM params, "
        "precision %s, optimizer %s, backend %s",
        c.name.c_str(), ll(c.dim), ll(c.n_layers), ll(c.n_heads), ll(c.n_kv_heads), ll(c.ffn_dim),
        ll(c.vocab), c.num_params() / 1e6, s.precision, s.optimizer, s.backend);
    if (o_.data)
      line("data %s (%llu tokens, train %llu, val %llu%s%s)", o_.data_path.c_str(),
           static_cast<unsigned long long>(o_.data->size()),
           static_cast<unsigned long long>(o_.data->split().train.size()),
           static_cast<unsigned long long>(o_.data->split().val.size()),
           o_.tokenizer.empty() ? "" : "; tokenizer ", o_.tokenizer.c_str());
    if (s.dp > 1 || s.zero > 0 || s.tp > 1 || s.pp > 1 || cfg.cp > 1)
      line("data parallel dp=%d, zero%d, %s communicator, %zu gradient buckets", s.dp, s.zero,
           o_.communicator.c_str(), s.buckets);
    if (cfg.cp > 1)
      line(
          "context parallel cp=%lld, %s attention: each sequence's %lld tokens over the cp "
          "ranks, %lld each (head-tail); gradients%s over dp x cp = %lld ranks",
          ll(cfg.cp), nn::to_string(cfg.cp_kind), ll(cfg.seq), ll(cfg.seq / cfg.cp),
          s.zero > 0 ? " and ZeRO shards" : "", ll(s.dp * cfg.cp));
    if (s.tp > 1)
      line(
          "tensor parallel tp=%d (mesh dp %d x cp %lld x tp %d, tp fastest): each rank holds "
          "%.2fM of the %.2fM parameters%s",
          s.tp, s.dp, ll(cfg.cp), s.tp, static_cast<double>(s.params_per_rank) / 1e6, c.num_params() / 1e6,
          s.sequence_parallel ? "; sequence parallel: norms and residuals hold T/tp tokens" : "");
    if (s.pp > 1) {
      std::string stages;
      for (const auto& st : s.stages)
        stages += tessera::detail::str(stages.empty() ? "" : " ", st.last_block - st.first_block);
      line(
          "pipeline parallel pp=%d, schedule %s, %lld virtual stage%s per rank, blocks per stage "
          "[%s] (embedding on the first, head on the last)",
          s.pp, parallel::to_string(cfg.pipeline), ll(cfg.virtual_stages),
          cfg.virtual_stages > 1 ? "s" : "", stages.c_str());
    }
    line(
        "G=%lld sequences/step = dp %d x %lld micro-batches x B=%lld, T=%lld, %lld steps, lr "
        "%.1e, %s, checkpointing %s",
        ll(cfg.global_batch), s.dp, ll(s.accum_steps), ll(cfg.micro_batch), ll(cfg.seq),
        ll(cfg.steps), cfg.lr, cfg.schedule().describe().c_str(),
        nn::to_string(cfg.checkpointing.mode));
    line("MFU against %s", kernels::describe_peak(s.options->peak).c_str());
    if (s.options->baseline)
      line("4-gram Kneser-Ney baseline on val: %.4f nats/byte", *s.options->baseline);
    if (!cfg.init_from_hf.empty() && s.step == 0)
      line("weights from the Hugging Face Llama %s", cfg.init_from_hf.c_str());
    if (s.step > 0) line("resumed from step %lld", ll(s.step));
    if (o_.planned_steps > 0 && o_.planned_steps != cfg.steps)
      line("the schedule now runs to step %lld (the checkpoint's run planned %lld): %s",
           ll(cfg.steps), ll(o_.planned_steps), cfg.schedule().describe().c_str());
    std::fflush(stdout);
  }

  void on_step(const step_metrics& m) override {
    const std::string text = format_step(m, s_.config->steps, s_.options->baseline);
    if (o_.progress) {
      std::printf("\r\033[K%s",
                  fitted_progress(m.step, s_.config->steps, text, terminal_columns()).c_str());
      if (m.val_loss) std::printf("\n");
    } else {
      std::printf("%s\n", text.c_str());
    }
    std::fflush(stdout);
  }

  void on_trace(std::int64_t step, const std::filesystem::path& path,
                const trace_bubble& b) override {
    line("trace of step %lld written to %s (bubble %.1f%% of %.3f s)", ll(step), path.c_str(),
         100 * b.bubble_fraction, b.span);
  }

  void on_end(const run_end& e) override {
    if (o_.progress) std::printf("\n");
    if (e.stopped_by != 0) {  // one line: the step, the checkpoint, the folder to resume
      std::printf("%s: stopped by %s after step %lld of %lld (%.1f s): %s\n", o_.prefix.c_str(),
                  signal_name(e.stopped_by).c_str(), ll(e.step), ll(e.steps), e.seconds,
                  e.checkpoint.empty()
                      ? "no checkpoint written (none since the run started, or no run folder)"
                      : ("checkpoint " + e.checkpoint.string() + " saved; resume from " +
                         e.checkpoint.parent_path().string())
                            .c_str());
      std::fflush(stdout);
      return;
    }
    const double bpt = s_.options->val_bytes_per_token;
    std::string l = tessera::detail::str(o_.prefix, ": done, ", e.steps, " steps in ",
                                         fixed(e.seconds, 1), " s");
    if (e.val_loss && bpt <= 0)
      l += ", final val loss " + fixed(*e.val_loss, 4) + " nats/byte (whole held-out split)";
    else if (e.val_loss)
      l += ", final val loss " + fixed(*e.val_loss, 4) +
           " nats/token = " + fixed(*e.val_loss / bpt, 4) + " nats/byte (" + fixed(bpt, 3) +
           " bytes per token; whole held-out split)";
    if (e.val_loss && s_.options->baseline)
      l += " (4-gram " + fixed(*s_.options->baseline, 4) + ": " +
           (*e.val_loss < *s_.options->baseline ? "beaten" : "NOT beaten") + ")";
    std::printf("%s\n", l.c_str());
    line("%s%s, metrics %s", e.checkpoint.empty() ? "no checkpoint" : "checkpoint ",
         e.checkpoint.c_str(), e.metrics.c_str());
    if (e.diverged)
      std::fprintf(stderr, "%s: training diverged: final validation loss %f (lr %g)\n",
                   o_.prefix.c_str(), *e.val_loss, s_.config->lr);
    std::fflush(stdout);
  }

  void on_export(const std::filesystem::path& dir) override {
    line(
        "Hugging Face Llama written to %s (config.json, safetensors; "
        "LlamaForCausalLM.from_pretrained reads it)",
        dir.c_str());
  }

  void on_sample(const std::vector<std::int32_t>& tokens) override {
    std::string text;
    if (o_.decode) {
      text = o_.decode(tokens);
    } else {  // bytes; an id of a larger vocabulary shown as <id>
      for (std::int32_t id : tokens)
        text += id >= 0 && id < 256 ? std::string(1, static_cast<char>(id))
                                    : "<" + std::to_string(id) + ">";
    }
    std::printf("---- sample (temperature %.1f) ----\n%s\n----\n", s_.options->temperature,
                text.c_str());
    std::fflush(stdout);
  }

 private:
  static long long ll(std::int64_t v) { return static_cast<long long>(v); }
  static std::string fixed(double v, int digits) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", digits, v);
    return b;
  }
  __attribute__((format(printf, 2, 3))) void line(const char* fmt, ...) {
    std::printf("%s: ", o_.prefix.c_str());
    va_list a;
    va_start(a, fmt);
    std::vprintf(fmt, a);
    va_end(a);
    std::printf("\n");
  }

  options o_;
  run_start s_{};
};

}  // namespace tessera::train
