// Tests include/tessera/train/job.hpp, job_data.hpp and run_job.hpp: a job
// checked on its settings alone fills in the backend's defaults and refuses
// what they rule out, naming the option; its model and run configurations
// are the settings'; preparing it binds the data (and --sample-only writes
// nothing into the run folder); and a job run in code through the typed
// dispatch takes the same steps, bit for bit, as train::fit over the trainer
// its names select, composed by hand.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/data/tokenizer.hpp"
#include "tessera/train/run_job.hpp"
#include "word_corpus.hpp"

namespace test_train_job {

using namespace tessera;
namespace fs = std::filesystem;

namespace {

struct temp_dir : train_support::temp_dir {
  temp_dir() : train_support::temp_dir("tessera_job_") {}
};

fs::path make_corpus(const fs::path& dir) {
  return train_support::write_word_corpus(dir, 3);
}

// A small job on the tiny preset, reading `data`, writing `out`.
train::job tiny_job(const fs::path& data, const fs::path& out) {
  train::job j;
  j.preset = "tiny";
  j.data = data.string();
  j.out = out.string();
  j.cfg.steps = 4;
  j.cfg.global_batch = 4;
  j.cfg.micro_batch = 2;
  j.cfg.seq = 16;
  j.cfg.lr = 3e-3;
  j.cfg.warmup = 1;
  j.cfg.eval_every = 2;
  j.cfg.eval_windows = 4;
  j.no_baseline = true;
  j.sample_bytes = 0;
  j.checkpoint_every = 0;
  j.comm = "local";
  return j;
}

std::string refusal(train::job j) {
  try {
    train::check_job(j);
  } catch (const config_error& e) {
    return e.what();
  }
  return "accepted";
}

std::vector<double> losses(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::vector<double> l;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) l.push_back(j["loss"].get<double>());
  }
  return l;
}

}  // namespace

TEST_CASE("check_job fills in the backend's defaults", "[train][job]") {
  train::job h;
  train::check_job(h);
  CHECK(h.precision == "fp32");
  CHECK(h.checkpointing == "none");
  CHECK(h.comm == "local");
  CHECK_FALSE(h.parallel);
  train::job g;
  g.backend = "cuda";
  g.comm = "local";
  train::check_job(g);
  CHECK(g.precision == "bf16_mixed_bf16_grads");
  CHECK(g.checkpointing == "full");
  // SGD decays weights only when asked: AdamW's default decay is not SGD's.
  train::job s;
  s.optimizer = "sgd";
  s.cfg.adamw.weight_decay = 0.1;
  train::check_job(s);
  CHECK(s.cfg.sgd.weight_decay == 0);
  s.given.insert("--weight-decay");
  train::check_job(s);
  CHECK(s.cfg.sgd.weight_decay == 0.1);
  train::job d;
  d.dp = 2;
  train::check_job(d);
  CHECK(d.parallel);
}

TEST_CASE("check_job refuses what the settings alone rule out, naming the option", "[train][job]") {
  train::job j;
  j.zero = 4;
  CHECK(refusal(j) == "--zero 4 is not a ZeRO stage (valid: 0, 1, 2, 3)");
  j = {};
  j.given.insert("--schedule");
  CHECK(refusal(j) == "--schedule 1f1b orders a pipeline's stages: it needs --pp > 1");
  j = {};
  j.given.insert("--nesterov");
  CHECK(refusal(j) == "--nesterov sets SGD's momentum: it needs --optimizer sgd");
  j = {};
  j.out.clear();
  CHECK(refusal(j) == "accepted");  // only a given empty value is refused
  j.given.insert("--out");
  CHECK(refusal(j) == "--out is empty: name a folder");
  j = {};
  j.cfg.lr = 0;
  CHECK(refusal(j) == "lr=0 must be in (0, 1]");
  j = {};
  j.dp = 64;
  j.tp = 8;
  j.cfg.pp = 4;
  CHECK(refusal(j) == "dp=64 x tp=8 x pp=4 = 2048 ranks exceeds the limit of 1024");
  j = {};
  j.comm = "nccl";
  CHECK(refusal(j) == "--comm nccl reduces GPU memory: it needs --backend cuda");
  j = {};
  j.sample_only = true;
  CHECK(refusal(j) == "--sample-only samples from a checkpoint: it needs --resume DIR");
  // The learning-rate schedule: its names, and wsd's flags only with wsd.
  j = {};
  j.lr_schedule = "step";
  CHECK(refusal(j) ==
        "unknown lr schedule 'step' (valid: cosine, wsd, linear, constant, inverse_sqrt)");
  j = {};
  j.given.insert("--wsd-decay-fraction");
  CHECK(refusal(j) ==
        "--wsd-decay-fraction shapes wsd's decay: it needs --lr-schedule wsd "
        "(--lr-schedule cosine has none)");
  j = {};
  j.lr_schedule = "linear";
  j.wsd_cooldown = "sqrt";
  j.given.insert("--wsd-cooldown");
  CHECK(refusal(j) ==
        "--wsd-cooldown shapes wsd's decay: it needs --lr-schedule wsd "
        "(--lr-schedule linear has none)");
  j.lr_schedule = "wsd";
  CHECK(refusal(j) == "accepted");
  j.wsd_cooldown = "cosine";
  CHECK(refusal(j) == "unknown WSD cooldown 'cosine' (valid: linear, sqrt)");
  j = {};
  j.lr_schedule = "wsd";
  j.cfg.wsd.decay_fraction = 0;
  j.given.insert("--wsd-decay-fraction");
  CHECK(refusal(j) == "--wsd-decay-fraction 0 must be in (0, 1]");
  j = {};
  j.lr_schedule = "constant";
  j.given.insert("--min-lr-ratio");
  CHECK(refusal(j) ==
        "--min-lr-ratio sets the lr that cosine, linear and wsd decay to: "
        "--lr-schedule constant never reaches it");
  j.lr_schedule = "linear";
  CHECK(refusal(j) == "accepted");
  // Packed documents: the separator only with the mask.
  j = {};
  j.document_separator = 10;
  j.given.insert("--document-separator");
  CHECK(refusal(j) ==
        "--document-separator names the separator of packed documents: it needs "
        "--document-mask");
  j.document_mask = true;
  CHECK(refusal(j) == "accepted");
  // A Hugging Face folder's config.json says whether it is tied.
  j = {};
  j.init_from_hf = "some/folder";
  j.given.insert("--tie-embeddings");
  CHECK(refusal(j) ==
        "--tie-embeddings cannot be given with --init-from-hf: the model's sizes are its "
        "config.json's");
}

TEST_CASE("run_config: the document separator of --document-mask", "[train][job]") {
  train::job j;
  j.checkpointing = "none";  // check_job's default, which run_config parses
  CHECK_FALSE(train::run_config(j).document_separator);  // no mask by default
  j.document_mask = true;
  // Byte-level data: the byte tokenizer's end-of-text.
  j.data_vocab = 256;
  CHECK(train::run_config(j).document_separator == std::optional<std::int32_t>{3});
  j.document_separator = 128001;
  CHECK(train::run_config(j).document_separator == std::optional<std::int32_t>{128001});
  // A subword tokenizer's EOS must be named.
  j.document_separator.reset();
  j.tokenizer = "tokenizer.json";
  CHECK_THROWS_WITH(train::run_config(j), Catch::Contains("--document-mask needs "
                                                          "--document-separator ID"));
  j.tokenizer.clear();
  j.data_vocab = 32000;
  CHECK_THROWS_AS(train::run_config(j), config_error);
  j.document_separator = -1;
  CHECK_THROWS_WITH(train::run_config(j), Catch::Contains("--document-separator -1"));
}

TEST_CASE("model_config and run_config are the job's settings", "[train][job]") {
  train::job j;
  j.preset = "tiny";
  j.layers = 3;
  j.ffn = 96;
  j.data_vocab = 300;
  const nn::llama_config base = nn::llama_config::from_name("tiny");
  nn::llama_config m = train::model_config(j);
  CHECK(m.dim == base.dim);
  CHECK(m.n_layers == 3);
  CHECK(m.ffn_dim == 96);
  CHECK(m.vocab == 300);  // the data's, unless --vocab
  j.vocab = 512;
  CHECK(train::model_config(j).vocab == 512);
  // --tie-embeddings overrides the preset's choice only when given.
  CHECK(!train::model_config(j).tie_word_embeddings);
  j.tie_embeddings = true;
  CHECK(!train::model_config(j).tie_word_embeddings);
  j.given.insert("--tie-embeddings");
  CHECK(train::model_config(j).tie_word_embeddings);
  {
    train::job t;
    t.preset = "llama3_2_1b";
    CHECK(train::model_config(t).tie_word_embeddings);
    t.given.insert("--tie-embeddings");  // --tie-embeddings=false
    CHECK(!train::model_config(t).tie_word_embeddings);
  }
  j.dp = 2;
  j.tp = 2;
  j.schedule = "zb1";
  j.checkpointing = "full";
  j.checkpoint_layers = 2;
  j.init_from_hf = "some/folder";
  train::train_config c = train::run_config(j);
  CHECK(c.dp == 2);
  CHECK(c.tp == 2);
  CHECK(c.pipeline == parallel::schedule_kind::zero_bubble_h1);
  CHECK(c.checkpointing.every == 2);
  CHECK(c.init_from_hf == "some/folder");
  CHECK(c.lr_schedule == optim::lr_schedule_kind::cosine);  // the default: today's run
  CHECK(c.wsd == optim::wsd_options{});
  j.lr_schedule = "wsd";
  j.wsd_cooldown = "sqrt";
  j.cfg.wsd.decay_fraction = 0.2;
  c = train::run_config(j);
  CHECK(c.lr_schedule == optim::lr_schedule_kind::wsd);
  CHECK(c.wsd == optim::wsd_options{0.2, optim::wsd_cooldown::sqrt});
  CHECK(c.schedule().kind == optim::lr_schedule_kind::wsd);
  j.resume = "runs/x";  // a resume loads its own weights
  CHECK(train::run_config(j).init_from_hf.empty());
  j.bucket_mb = 2.5;
  j.grad_reduce = "micro-batch";
  CHECK(train::data_parallel_options_of(j).bucket_bytes == 2500000);
  CHECK(train::data_parallel_options_of(j).reduction == parallel::grad_reduction::per_micro_batch);
}

TEST_CASE("prepare_job binds the data, and --sample-only writes nothing into the run folder",
          "[train][job]") {
  temp_dir dir;
  const fs::path corpus = make_corpus(dir.path);
  {
    train::job j = tiny_job(corpus, dir.path / "a");
    j.sample_bytes = 10;
    train::check_job(j);
    created_paths created;
    train::job_session s;
    REQUIRE(train::prepare_job(j, created, s));
    CHECK(s.tokens == corpus);
    CHECK(j.data_vocab == 256);
    CHECK(train::model_config(j).vocab == 256);
    CHECK(fs::is_directory(dir.path / "a"));
  }
  CHECK_FALSE(fs::exists(dir.path / "a"));  // never kept: the run did not start
  {
    train::job j = tiny_job(corpus, dir.path / "b");
    j.vocab = 100;
    train::check_job(j);
    created_paths created;
    train::job_session s;
    CHECK_THROWS_WITH(train::prepare_job(j, created, s),
                      Catch::Contains("token file vocabulary 256") &&
                          Catch::Contains("exceeds the model's vocab=100 (--vocab)"));
  }
  // Text is byte-tokenized; under --sample-only into a temporary folder.
  const fs::path text = dir.path / "t.txt";
  std::ofstream(text) << "some text to tokenize, some text to tokenize.\n";
  fs::path temporary;
  {
    train::job j = tiny_job(text, dir.path / "c");
    j.resume = (dir.path / "c").string();
    j.sample_only = true;
    j.sample_bytes = 5;
    train::check_job(j);
    created_paths created;
    train::job_session s;
    REQUIRE(train::prepare_job(j, created, s));
    temporary = s.temporary;
    CHECK(s.tokens.parent_path() == temporary);
    CHECK(fs::exists(s.tokens));
  }
  CHECK_FALSE(fs::exists(temporary));
  CHECK_FALSE(fs::exists(dir.path / "c"));
}

TEST_CASE("a job run in code takes the steps of the trainer its names select, bit for bit",
          "[train][job]") {
  temp_dir dir;
  const fs::path corpus = make_corpus(dir.path);
  train::job j = tiny_job(corpus, dir.path / "job");
  j.config_toml = "steps = 4\n";
  // example-begin job
  j.optimizer = "sgd";  // names, as train_llama's options give them
  j.cfg.sgd.momentum = 0.9;
  train::check_job(j);    // the settings alone (throws config_error naming the option)
  created_paths created;  // what a failure before the first step removes
  train::job_session s;   // the token file (and MPI, under mpirun) until the run ends
  REQUIRE(train::prepare_job(j, created, s));  // folders, tokens, vocabulary
  const int status = train::dispatch_job<host, precision::fp32>(j, s.tokens, created);
  // example-end job
  REQUIRE(status == 0);
  created.keep();
  // run.toml holds the settings as given; the folder is kept.
  std::ifstream toml(dir.path / "job" / "run.toml");
  CHECK(std::string(std::istreambuf_iterator<char>(toml), {}) == "steps = 4\n");

  // By hand: the trainer of (fp32, host, sgd) and train::fit.
  const data::token_file f(corpus);
  train::trainer<precision::fp32, host, optim::sgd> tr(train::model_config(j), train::run_config(j),
                                                       f);
  train::run_options r;
  r.out = dir.path / "hand";
  fs::create_directories(r.out);
  (void)train::fit(tr, r);
  const std::vector<double> a = losses(dir.path / "job" / "metrics.jsonl");
  const std::vector<double> b = losses(dir.path / "hand" / "metrics.jsonl");
  REQUIRE(a.size() == 4);
  CHECK(a == b);  // bit for bit: the job adds no arithmetic

  // An unknown name is refused by the dispatch itself.
  j.optimizer = "adagrad";
  CHECK_THROWS_WITH((train::dispatch_job<host, precision::fp32>(j, s.tokens, created)),
                    "unknown optimizer 'adagrad' (valid: adamw, sgd, lion, adafactor, muon)");
}

}  // namespace test_train_job
