// A Hugging Face folder from a checkpoint folder alone
// (include/tessera/train/checkpoint_hf.hpp): the files equal, byte for
// byte, those train::export_hf writes from a trainer holding the same
// state: a bf16_mixed run on one rank (bf16 parameters; float32; sharded
// into several files), and a dp 2 zero<3> run against one rank that loads
// its checkpoint. The master weights export as float32 exactly. A
// checkpoint without master weights and an unknown dtype are refused
// before any file is written.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/data/safetensors.hpp>
#include <tessera/train/checkpoint_hf.hpp>

#include "pp_suite.hpp"

namespace test_train_checkpoint_hf {

using namespace tessera;
namespace fs = std::filesystem;
using comm::local_communicator;
using P = precision::bf16_mixed;

namespace {

constexpr std::int64_t G = 8, steps = 4;

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path =
        fs::temp_directory_path() / ("tessera_ckpt_hf_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The folders `a` and `b` hold the same file names with the same bytes.
void require_same_files(const fs::path& a, const fs::path& b) {
  std::vector<std::string> na, nb;
  for (const auto& e : fs::directory_iterator(a)) na.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(b)) nb.push_back(e.path().filename().string());
  std::sort(na.begin(), na.end());
  std::sort(nb.begin(), nb.end());
  REQUIRE(na == nb);
  for (const auto& n : na) {
    INFO(n);
    CHECK(bytes_of(a / n) == bytes_of(b / n));
  }
}

pp_suite::layout layout_of(int dp) {
  pp_suite::layout l;
  l.dp = dp;
  l.micro_batches = G / dp;
  return l;
}

}  // namespace

TEST_CASE("a checkpoint exports the files a trainer with its state exports",
          "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_hf", 0)};
  data::token_file f(corpus.path);
  temp_dir d("one");
  train::trainer<P> tr(pp_suite::model(), pp_suite::config(layout_of(1), steps), f);
  (void)tr.train_step();
  tr.save_checkpoint(d.path / "ck");
  tr.export_hf(d.path / "want_bf16");
  train::export_checkpoint_hf(d.path / "ck", d.path / "got_bf16");
  require_same_files(d.path / "want_bf16", d.path / "got_bf16");
  tr.export_hf(d.path / "want_f32", "float32", 20000);  // several files and an index
  train::export_checkpoint_hf(d.path / "ck", d.path / "got_f32", "float32", "param", 20000);
  CHECK(fs::exists(d.path / "got_f32" / "model.safetensors.index.json"));
  require_same_files(d.path / "want_f32", d.path / "got_f32");

  // The master weights, as float32: exactly the checkpoint's.
  train::export_checkpoint_hf(d.path / "ck", d.path / "master", "float32", "master");
  train::checkpoint_reader rd(d.path / "ck");
  data::safetensors_file st(d.path / "master" / "model.safetensors");
  for (const auto& e : tr.model().layout().entries()) {
    INFO(e.name);
    const auto& t = rd.index().tensors.at(e.name);
    const train::index_box box{std::vector<std::int64_t>(t.shape.size(), 0), t.shape};
    std::vector<float> want(static_cast<std::size_t>(box.numel()));
    rd.read(e.name, "master", box, 0, box.numel(), want.data());
    const auto& got = st.tensors().at(nn::hf_tensor_name(e.name));
    REQUIRE(got.bytes == want.size() * sizeof(float));
    CHECK(std::memcmp(got.data, want.data(), got.bytes) == 0);
  }

  CHECK_THROWS_WITH(train::export_checkpoint_hf(d.path / "ck", d.path / "bad", "int8"),
                    Catch::Contains("'int8' is not one of"));
  CHECK_FALSE(fs::exists(d.path / "bad"));
  CHECK_THROWS_WITH(train::export_checkpoint_hf(d.path / "ck", d.path / "master"),
                    Catch::Contains("exists: give a new folder"));
}

TEST_CASE("a dp 2 zero<3> checkpoint exports as one rank that loads it", "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_hf_z3", 0)};
  data::token_file f(corpus.path);
  temp_dir d("z3");
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  comm::local_world::run(
      2,
      [&](local_communicator& world) {
        train::trainer<P, host, optim::adamw, parallel::zero<3>, local_communicator> tr(
            pp_suite::model(), pp_suite::config(layout_of(2), steps), f, parallel::layout{world});
        (void)tr.train_step();
        tr.save_checkpoint(d.path / "ck");
      },
      o);
  train::trainer<P> one(pp_suite::model(), pp_suite::config(layout_of(1), steps), f);
  one.load_checkpoint(d.path / "ck");
  one.export_hf(d.path / "want");
  train::export_checkpoint_hf(d.path / "ck", d.path / "got");
  require_same_files(d.path / "want", d.path / "got");

  // fp32 runs keep no master weights.
  train::trainer<precision::fp32> f32(pp_suite::model(), pp_suite::config(layout_of(1), steps), f);
  f32.save_checkpoint(d.path / "ck32");
  CHECK_THROWS_WITH(train::export_checkpoint_hf(d.path / "ck32", d.path / "m", "", "master"),
                    Catch::Contains("stores no master of"));
  CHECK_FALSE(fs::exists(d.path / "m"));
}

}  // namespace test_train_checkpoint_hf
