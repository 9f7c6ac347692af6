#pragma once
/// \file train/job_data.hpp
/// What a checked job (train/job.hpp) needs before its trainers exist: its
/// folders (created, or checked writable), its token file (text
/// byte-tokenized once; under an MPI launch by rank 0 alone, the others
/// waiting for it), the vocabulary and tokenizer bound to the data, and
/// the planner's bytes held against this machine's memory. Everything here
/// runs before anything large is allocated, so a job that cannot run fails
/// at once, naming the setting, and leaves nothing behind (created_paths).

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>

#include "tessera/comm/launch.hpp"
#include "tessera/core/file.hpp"
#include "tessera/data/hf_tokenizer.hpp"
#include "tessera/data/prepare.hpp"
#include "tessera/data/sampler.hpp"
#include "tessera/data/token_file.hpp"
#include "tessera/plan/host_memory.hpp"
#include "tessera/plan/memory.hpp"
#include "tessera/train/job.hpp"
#include "tessera/train/run_folder.hpp"
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
#include "tessera/comm/mpi.hpp"
#endif

namespace tessera::train {

/// Creates (recording in `created`) or checks the folders the job writes:
/// --out (unless --sample-only, which writes nothing there), --export-hf's,
/// and --trace's parent. Takes --out's lock into `lock` before anything is
/// written there, refuses a fresh run into an --out that holds a
/// checkpoint without --overwrite (train/run_folder.hpp), and removes a
/// killed run's temporaries from it. Throws io_error naming the option and
/// the path, config_error for a folder in use or checkpointed.
inline void prepare_folders(job& j, created_paths& created, std::optional<run_folder_lock>& lock) {
  namespace fs = std::filesystem;
  auto writable = [](const fs::path& p) { return ::access(p.c_str(), W_OK) == 0; };
  if (!j.export_hf.empty()) {
    TESSERA_THROW_IF(fs::exists(j.export_hf) && !fs::is_directory(j.export_hf), io_error,
                     "--export-hf '", j.export_hf, "' exists and is not a folder");
    create_folders(j.export_hf, created, "--export-hf");
    TESSERA_THROW_IF(!writable(j.export_hf), io_error, "--export-hf '", j.export_hf,
                     "' cannot be written");
  }
  if (!j.trace.empty()) {
    const fs::path t = fs::absolute(j.trace);
    TESSERA_THROW_IF(fs::is_directory(t), io_error, "--trace '", j.trace, "' is a directory");
    // Not a file this run reads or writes (paths compared resolved; one
    // that cannot be resolved is not compared).
    auto resolved = [](const fs::path& p) {
      std::error_code ec;
      const fs::path r = fs::weakly_canonical(p, ec);
      return ec ? fs::path() : r;
    };
    const fs::path out = j.out.empty() ? fs::path() : resolved(j.out), tr = resolved(t);
    for (const fs::path& mine :
         {fs::path(j.data), data::token_file_path(j.data, j.out, j.data_format), out / "run.toml",
          out / "metrics.jsonl", out / "checkpoint.bin", fs::path(j.tokenizer)})
      TESSERA_THROW_IF(!mine.empty() && !tr.empty() && resolved(mine) == tr, config_error,
                       "--trace '", j.trace, "' is '", mine.string(),
                       "', which this run reads or writes: name another file");
    TESSERA_THROW_IF(!fs::is_directory(t.parent_path()) || !writable(t.parent_path()), io_error,
                     "--trace '", j.trace, "': folder '", t.parent_path().string(),
                     "' does not exist or is not writable");
  }
  if (j.sample_only) return;  // nothing is written: the folder may be read-only
  create_folders(j.out, created, "output folder");
  TESSERA_THROW_IF(!writable(j.out), io_error, "output folder '", j.out, "' is not writable");
  const bool had_lock = std::filesystem::exists(fs::path(j.out) / run_lock_name);
  lock.emplace(j.out);
  if (!had_lock)
    created.add(fs::path(j.out) / run_lock_name);  // removed with a refused run's folder
  std::error_code ec;
  if (j.resume.empty() || !fs::equivalent(j.resume, j.out, ec))
    check_fresh_run(j.out, j.overwrite,
                    "give --resume " + j.out +
                        " to continue it (or --auto-resume, which resumes whenever it holds "
                        "one), or --overwrite to replace it");
  remove_stale_temporaries(j.out);
}

/// Binds the job to its token file `tok`: the model's vocabulary follows
/// the file unless --vocab sets it, --seq defaults to at most the model's
/// context, and a tokenizer.json of the token file (or --tokenizer)
/// decodes the samples, measures the validation split's bytes per token
/// and encodes the prompt (Hugging Face tokenizers). Throws config_error
/// when the data, the tokenizer, the prompt and the model disagree.
inline void bind_data(job& j, const std::filesystem::path& tok) {
  const data::token_file f(tok);
  j.data_vocab = f.vocab();
  if (j.tokenizer.empty() && tok == std::filesystem::path(j.data))
    j.tokenizer = data::tokenizer_of(tok).string();
  TESSERA_THROW_IF(!j.tokenizer.empty() && !std::filesystem::is_regular_file(j.tokenizer),
                   config_error, "--tokenizer '", j.tokenizer,
                   "' is not a file (a Hugging Face tokenizer.json)");
  const nn::llama_config mc = model_config(j);
  TESSERA_THROW_IF(f.vocab() > static_cast<std::uint64_t>(mc.vocab), config_error,
                   "token file vocabulary ", f.vocab(), " of '", j.data,
                   "' exceeds the model's vocab=", mc.vocab,
                   j.init_from_hf.empty() ? " (--vocab)" : " (config.json of --init-from-hf)");
  if (!j.was_given("--seq") && j.cfg.seq > mc.max_seq) j.cfg.seq = mc.max_seq;
  // A window of T+1 tokens in each split: refused here, where the ranks of
  // an MPI launch agree (prepare_job), not when the trainer is built, where
  // rank 0 would unwind first and remove the token file a slower rank is
  // still opening (a second, misleading error).
  if (!j.sample_only) {  // (sampling reads no window)
    (void)data::val_windows(f, f.split().val, j.cfg.seq, 1);
    (void)data::window_start(j.cfg.seed, 0, 0, f.split().train.begin, f.split().train.end,
                             j.cfg.seq);
  }
  if (j.tokenizer.empty()) {
    for (unsigned char c : j.prompt)  // the byte tokenizer's ids are the bytes
      TESSERA_THROW_IF(j.sample_bytes > 0 && c >= mc.vocab, config_error, "--prompt byte ",
                       static_cast<int>(c), " is outside the model's vocabulary of ", mc.vocab);
    TESSERA_THROW_IF(j.sample_bytes > 0 && f.vocab() > 256, config_error, "--data '", j.data,
                     "' has a vocabulary of ", f.vocab(),
                     " ids but no tokenizer.json beside it to decode samples with: give "
                     "--tokenizer FILE, or --sample-bytes 0");
    return;
  }
  const data::hf_tokenizer t(j.tokenizer);
  TESSERA_THROW_IF(t.vocab_size() < f.vocab(), config_error, "tokenizer '", j.tokenizer, "' knows ",
                   t.vocab_size(), " ids but the data uses ids up to ", f.vocab() - 1);
  std::uint64_t bytes = 0;
  const auto val = f.split().val;
  for (std::uint64_t i = val.begin; i < val.end; ++i) bytes += t.token_bytes(f[i]).size();
  j.val_bytes_per_token = val.size() > 0 && bytes > 0
                              ? static_cast<double>(bytes) / static_cast<double>(val.size())
                              : 1.0;
  if (j.sample_bytes == 0) return;
  try {
    j.prompt_ids = data::encode_with_tokenizer(j.tokenizer, j.prompt);
  } catch (const config_error& e) {
    throw config_error(std::string("--prompt: ") + e.what() + " (or --sample-bytes 0)");
  }
  for (std::int32_t id : j.prompt_ids)
    TESSERA_THROW_IF(id < 0 || id >= mc.vocab, config_error, "--prompt encodes to id ", id,
                     ", outside the model's vocabulary of ", mc.vocab);
}

/// What a prepared job holds until it ends: its token file, the temporary
/// folder --sample-only byte-tokenizes text into (removed with this object:
/// such a run writes nothing into its run folder) and, under an MPI launch,
/// the MPI environment (initialised before rank 0 writes the files,
/// finalised after the run).
struct job_session {
  std::filesystem::path tokens;  ///< the token file the trainers read
  std::filesystem::path temporary;
  std::optional<run_folder_lock> lock;  ///< --out's, on world rank 0 (not under --sample-only)
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
  std::optional<comm::mpi_environment> mpi;
#endif
  job_session() = default;
  job_session(const job_session&) = delete;
  job_session& operator=(const job_session&) = delete;
  ~job_session() {
    std::error_code ec;
    if (!temporary.empty()) std::filesystem::remove_all(temporary, ec);
  }
};

/// Prepares the job's folders (prepare_folders) and token file
/// (data::prepare_token_file) into `s`, then binds the data (bind_data).
/// Under an MPI launch (--comm other than local) world rank 0 alone
/// writes, and the others learn whether it failed; then every rank binds
/// the data and the ranks agree whether any failed. Returns false on a rank
/// that did not fail itself when another did (that one reports it). Throws
/// as the functions it calls.
inline bool prepare_job(job& j, created_paths& created, job_session& s) {
  namespace fs = std::filesystem;
  const int rank = comm::launched_world().rank;
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
  if (j.comm != "local") s.mpi.emplace();
#endif
  fs::path into = j.out;
  if (j.sample_only) {  // every rank's own temporary folder
    std::string t = (fs::temp_directory_path() / "tessera_job.XXXXXX").string();
    TESSERA_THROW_IF(::mkdtemp(t.data()) == nullptr, io_error,
                     "cannot create a temporary folder in '", fs::temp_directory_path().string(),
                     "'");
    into = s.temporary = t;
  }
  std::exception_ptr failed;
  if (rank == 0 || j.sample_only) {
    try {
      prepare_folders(j, created, s.lock);
      s.tokens = data::prepare_token_file(j.data, into, j.data_format, created);
    } catch (...) {
      failed = std::current_exception();
    }
  }
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
  if (s.mpi) {
    comm::mpi_communicator w(MPI_COMM_WORLD, comm_options_of(j));
    double f = failed ? 1.0 : 0.0;
    w.broadcast(&f, 1, 0);
    if (f != 0 && !failed) return false;
  }
#endif
  if (failed) std::rethrow_exception(failed);
  if (rank != 0 && !j.sample_only) s.tokens = data::token_file_path(j.data, into, j.data_format);
  // Every rank binds the data; a failure (a corpus too small for a window,
  // the same on every rank) is agreed before any rank unwinds, because
  // rank 0's unwinding removes the token file it created: a rank still
  // opening it would fail otherwise with a second, misleading error.
  std::exception_ptr bind_failed;
  try {
    bind_data(j, s.tokens);
  } catch (...) {
    bind_failed = std::current_exception();
  }
#if defined(TESSERA_HAS_MPI) && TESSERA_HAS_MPI
  if (s.mpi) {
    comm::mpi_communicator w(MPI_COMM_WORLD, comm_options_of(j));
    double f = bind_failed ? 1.0 : 0.0;
    w.all_reduce(&f, 1, comm::reduce_op::max);
    if (f != 0 && !bind_failed) return false;  // another rank reports it
  }
#endif
  if (bind_failed) std::rethrow_exception(bind_failed);
  return true;
}

/// Refuses, before anything is allocated, a host job that cannot fit the
/// memory this machine's ranks share (plan::check_host_fit): first its
/// model state (weights, gradients, master weights, optimizer state under
/// this --zero and --tp: the planner's persistent bytes), then one step
/// (the state, the activation peak of a micro-batch, the loader's buffers
/// and, under fp8, the FP8 state and operand copies). `d`: the precision's
/// dtype sizes. Throws config_error naming the settings and the limit.
inline void check_host_memory(const job& j, const plan::dtype_sizes& d) {
  const std::uint64_t avail = plan::available_host_memory();
  if (avail == 0) return;
  const nn::llama_config mc = model_config(j);
  const train_config rc = run_config(j);
  plan::sharding sh;  // as the engine will run: prefetch on, the job's buckets and reduction
  sh.zero = j.zero;
  sh.dp = j.dp * static_cast<int>(rc.cp);  // ZeRO shards over dp x cp
  sh.bucket_bytes = std::max<std::int64_t>(1, std::llround(j.bucket_mb * 1e6));
  sh.tp = j.tp;
  sh.per_micro_batch =
      parallel::parse_grad_reduction(j.grad_reduce) == parallel::grad_reduction::per_micro_batch;
  sh.micro_batches = rc.accum_steps();
  plan::activation_options a;
  a.micro_batch = rc.micro_batch;
  a.seq = rc.seq;
  a.model.ce_chunk = rc.ce_chunk;
  a.model.checkpointing = rc.checkpointing;
  a.model.fp8 = rc.fp8;  // fp8: the histories the FP8 scales keep (plan/fp8.hpp)
  a.micro_batches = rc.accum_steps();
  a.document_mask = rc.document_separator.has_value();
  a.tp = j.tp;
  a.sequence_parallel = rc.sequence_parallel;
  a.cp = static_cast<int>(rc.cp);
  a.cp_kind = rc.cp_kind;
  plan::optimizer_spec o = plan::optimizer_spec::from_name(j.optimizer);
  if (o.factored && j.cfg.adafactor.beta1 > 0) o = plan::optimizer_spec::adafactor(true);
  const auto m = plan::plan_memory(mc, d, o, sh, a);
  // Ranks on this machine: threads of this process, or mpirun's local size;
  // stages split the layers, so a pipeline's ranks hold one copy between them.
  const double here = j.comm == "mpi" || comm::launched_by_mpi()
                          ? comm::launched_world().local_size
                          : static_cast<double>(j.world_size());
  const double stages = static_cast<double>(std::max<std::int64_t>(1, rc.pp));
  plan::check_host_fit(
      static_cast<double>(m.state.persistent()) * here / stages, avail,
      "the model state of this run",
      tessera::detail::str(mc.num_params(), " parameters of --dim ", mc.dim, " --layers ",
                           mc.n_layers, " --ffn ", mc.ffn_dim, " --vocab ", mc.vocab,
                           ": weights, gradients and optimizer state under --precision ",
                           j.precision, " --zero ", j.zero, ", ", here,
                           " rank(s) on this machine; the planner, plan/memory.hpp"),
      "reduce the model, or shard its state over more machines (--zero, --dp, --tp, --pp under "
      "mpirun)");
  plan::check_host_fit(
      static_cast<double>(m.total()) * here / stages, avail, "one step of this run",
      tessera::detail::str("--micro-batch ", rc.micro_batch, " x --seq ", rc.seq, ": activations ",
                           std::llround(static_cast<double>(m.activations.peak) / plan::gib),
                           " GiB and loader buffers beside the model state, ", here,
                           " rank(s) on this machine; the planner, plan/memory.hpp"),
      "reduce --micro-batch (the accumulation keeps --global-batch) or --seq, or recompute "
      "activations (--checkpointing full)");
}

}  // namespace tessera::train
