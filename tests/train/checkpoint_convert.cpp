// Converting the single-file checkpoint.bin of earlier versions into a
// checkpoint folder (include/tessera/train/checkpoint_convert.hpp): a run
// (bf16_mixed AdamW, with master weights; fp32 SGD with momentum) saves a
// .bin after two steps; the converted folder, loaded by a trainer, holds
// the same state as the .bin loaded by another (each saves a folder right
// after the load, compared byte for byte) and both train the same next
// steps bit for bit. A tp shard is refused naming the way on; a damaged
// file leaves no output.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <tessera/comm/device_mesh.hpp>
#include <tessera/comm/local.hpp>
#include <tessera/nn/tensor_parallel.hpp>
#include <tessera/train/checkpoint_convert.hpp>

#include "pp_suite.hpp"

namespace test_train_checkpoint_convert {

using namespace tessera;
namespace fs = std::filesystem;
using comm::local_communicator;

namespace {

constexpr std::int64_t G = 8, steps = 4, saved_at = 2;

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() /
           ("tessera_ckpt_convert_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

train::train_config config() {
  pp_suite::layout one;
  one.micro_batches = G;
  return pp_suite::config(one, steps);
}

struct trajectory {
  std::vector<double> loss, norm;
};

// One rank: loads `from` (if set) and saves a folder to `resaved` at once
// (if set); trains until `until`; saves to `to` (if set).
template <class P, class O>
trajectory run(const data::token_file& f, const fs::path& from, const fs::path& resaved,
               std::int64_t until, const fs::path& to) {
  train::trainer<P, host, O> tr(pp_suite::model(), config(), f);
  if (!from.empty()) tr.load_checkpoint(from);
  if (!resaved.empty()) tr.save_checkpoint(resaved);
  trajectory out;
  while (tr.step() < until) {
    const auto s = tr.train_step();
    out.loss.push_back(s.loss);
    out.norm.push_back(s.grad_norm);
  }
  if (!to.empty()) tr.save_checkpoint(to);
  return out;
}

void require_same_state(const fs::path& a, const fs::path& b, std::size_t roles) {
  train::checkpoint_reader ra(a), rb(b);
  REQUIRE(ra.index().tensors.size() == rb.index().tensors.size());
  CHECK(ra.index().run.at("step") == rb.index().run.at("step"));
  CHECK(ra.index().run.at("optimizer_steps") == rb.index().run.at("optimizer_steps"));
  for (const auto& [name, t] : ra.index().tensors) {
    REQUIRE(rb.index().tensors.count(name) == 1);
    CHECK(rb.index().tensors.at(name).roles == t.roles);
    CHECK(t.roles.size() == roles);
    const train::index_box box{std::vector<std::int64_t>(t.shape.size(), 0), t.shape};
    for (const auto& [role, dtype] : t.roles) {
      INFO(role << " of " << name);
      const std::size_t bytes =
          static_cast<std::size_t>(box.numel()) * train::dtype_bytes_of(dtype);
      std::vector<char> x(bytes), y(bytes);
      ra.read(name, role, box, 0, box.numel(), x.data());
      rb.read(name, role, box, 0, box.numel(), y.data());
      CHECK(std::memcmp(x.data(), y.data(), bytes) == 0);
    }
  }
}

template <class P, class O>
void convert_and_compare(const data::token_file& f, std::size_t roles) {
  temp_dir d("run");
  const fs::path bin = d.path / "checkpoint.bin", folder = d.path / "step-000002";
  (void)run<P, O>(f, {}, {}, saved_at, bin);
  train::convert_checkpoint_file(bin, folder);
  CHECK(train::checkpoint_reader(folder).index().run.at("optimizer_steps") == saved_at);
  const trajectory a = run<P, O>(f, bin, d.path / "resaved_bin", steps, {});
  const trajectory b = run<P, O>(f, folder, d.path / "resaved_folder", steps, {});
  require_same_state(d.path / "resaved_bin", d.path / "resaved_folder", roles);
  REQUIRE(a.loss.size() == static_cast<std::size_t>(steps - saved_at));
  CHECK(a.loss == b.loss);  // bit for bit: the same state on the same layout
  CHECK(a.norm == b.norm);
}

}  // namespace

TEST_CASE("a converted checkpoint.bin loads as the file itself", "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_convert", 0)};
  data::token_file f(corpus.path);
  SECTION("bf16_mixed, AdamW: param, master, exp_avg, exp_avg_sq") {
    convert_and_compare<precision::bf16_mixed, optim::adamw>(f, 4);
  }
  SECTION("fp32, SGD: param, momentum_buffer") {
    convert_and_compare<precision::fp32, optim::sgd>(f, 2);
  }
}

TEST_CASE("convert refuses a tp shard and a damaged file, leaving no output",
          "[train][checkpoint]") {
  trainer_suite::temp_file corpus{trainer_suite::make_corpus("ckpt_convert_bad", 0)};
  data::token_file f(corpus.path);
  temp_dir d("bad");
  const fs::path bin = d.path / "checkpoint.bin", out = d.path / "out";
  comm::comm_options o;
  o.timeout = std::chrono::seconds(60);
  pp_suite::layout l;
  l.tp = 2;
  l.micro_batches = G;
  comm::local_world::run(
      2,
      [&](local_communicator& world) {
        using layers_t = nn::tensor_parallel_layers<local_communicator>;
        auto g = comm::make_groups(world, comm::device_mesh(1, 2, 1));
        train::trainer<precision::fp32, host, optim::adamw, parallel::zero<0>, local_communicator,
                       layers_t>
            tr(pp_suite::model(), pp_suite::config(l, steps), f,
               parallel::layout{g.dp, layers_t{&g.tp}, g.pp});
        (void)tr.train_step();
        tr.save_checkpoint(bin);
      },
      o);
  CHECK_THROWS_WITH(train::convert_checkpoint_file(bin, out),
                    Catch::Contains("is one shard of a run at tp=2, pp=1"));
  CHECK_FALSE(fs::exists(out));
  fs::remove(bin);
  (void)run<precision::fp32, optim::adamw>(f, {}, {}, 1, bin);
  fs::resize_file(bin, fs::file_size(bin) - 1);
  CHECK_THROWS_WITH(train::convert_checkpoint_file(bin, out), Catch::Contains("truncated"));
  CHECK_FALSE(fs::exists(out));
  fs::create_directories(out);
  CHECK_THROWS_WITH(train::convert_checkpoint_file(bin, out),
                    Catch::Contains("exists: give a new folder"));
}

}  // namespace test_train_checkpoint_convert
