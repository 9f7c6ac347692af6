// Tests include/tessera/train/metrics.hpp: the step log line names every
// field, byte formatting, the progress bar, the metrics file's truncation on
// resume (a line cut by a kill, temp file and rename), and that the JSON of
// a step carries doubles bit for bit (tests/train/resume_kill.sh compares
// resumed and uninterrupted runs through that file with exact equality).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "tessera/core/random.hpp"
#include "tessera/train/metrics.hpp"

namespace test_train_metrics {

using namespace tessera;
namespace fs = std::filesystem;

namespace {

train::step_metrics sample_metrics() {
  train::step_metrics m;
  m.step = 120;
  m.loss = 2.41;
  m.lr = 3e-4;
  m.grad_norm = 0.512;
  m.tokens_per_s = 12345;
  m.mfu = 0.231;
  m.mem_allocated = 12897485;  // 12.3 MiB
  m.mem_peak = 47815066;       // 45.6 MiB
  return m;
}

std::uint64_t bits(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

// A fresh directory under the temp dir, removed at scope exit.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() /
           ("tessera_test_metrics_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> n;
    for (const auto& e : fs::directory_iterator(path)) n.push_back(e.path().filename().string());
    return n;
  }
};

std::vector<std::string> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> v;
  std::string l;
  while (std::getline(in, l)) v.push_back(l);
  return v;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("format_step names every field", "[train][metrics]") {
  auto m = sample_metrics();
  m.val_loss = 2.47;
  const std::string s = train::format_step(m, 1000, 2.1);
  CHECK(s ==
        "step 120/1000 loss 2.4100 val 2.4700 (4-gram 2.1000) lr 3.00e-04 norm 0.512 tok/s 12345 "
        "mfu 23.1% mem 12.3MiB peak 45.6MiB");
  for (const char* field : {"step ", " loss ", " val ", "(4-gram ", " lr ", " norm ", " tok/s ",
                            " mfu ", " mem ", " peak "})
    CHECK_THAT(s, Catch::Contains(field));
}

TEST_CASE("format_step never prints a utilisation over 100% or without a peak",
          "[train][metrics]") {
  auto m = sample_metrics();
  m.mfu_blas = 0.352;
  CHECK_THAT(train::format_step(m, 1000), Catch::Contains(" mfu 23.1% (35.2% of BLAS) mem "));
  m.mfu = 1.0001;
  m.mfu_blas = 1.7;
  CHECK_THAT(train::format_step(m, 1000), Catch::Contains(" mfu n/a (n/a of BLAS) mem "));
  m.mfu = 0;  // no peak set
  m.mfu_blas = 0;
  CHECK_THAT(train::format_step(m, 1000), Catch::Contains(" mfu n/a mem "));
  CHECK(train::format_utilisation(1.0) == "100.0%");
  CHECK(train::format_utilisation(std::nan("")) == "n/a");
}

TEST_CASE("format_step shows val and the baseline only on eval steps, and SKIPPED",
          "[train][metrics]") {
  auto m = sample_metrics();
  SECTION("no eval: neither val nor the baseline, even when a baseline is given") {
    const std::string s = train::format_step(m, 1000, 2.1);
    CHECK(s ==
          "step 120/1000 loss 2.4100 lr 3.00e-04 norm 0.512 tok/s 12345 mfu 23.1% mem 12.3MiB "
          "peak 45.6MiB");
  }
  SECTION("eval without a baseline") {
    m.val_loss = 2.47;
    CHECK_THAT(train::format_step(m, 1000), Catch::Contains("loss 2.4100 val 2.4700 lr 3.00e-04"));
  }
  SECTION("a skipped step says so after its (non-finite) norm") {
    m.grad_norm = std::numeric_limits<double>::infinity();
    m.skipped = true;
    CHECK_THAT(train::format_step(m, 1000), Catch::Contains("norm inf SKIPPED tok/s"));
  }
}

TEST_CASE("format_bytes picks the unit at each power of 1024", "[train][metrics]") {
  CHECK(train::format_bytes(0) == "0B");
  CHECK(train::format_bytes(1023) == "1023B");
  CHECK(train::format_bytes(1024) == "1.0KiB");
  CHECK(train::format_bytes(1536) == "1.5KiB");
  CHECK(train::format_bytes(12.3 * 1024 * 1024) == "12.3MiB");
  CHECK(train::format_bytes(141.0 * 1024 * 1024 * 1024) == "141.0GiB");
  CHECK(train::format_bytes(2.0 * 1024 * 1024 * 1024 * 1024) == "2.0TiB");
  // TiB is the largest unit
  CHECK(train::format_bytes(2048.0 * 1024 * 1024 * 1024 * 1024) == "2048.0TiB");
}

TEST_CASE("progress_bar fills in proportion to the step", "[train][metrics]") {
  CHECK(train::progress_bar(0, 1000, "tail") == "[" + std::string(30, '.') + "] tail");
  CHECK(train::progress_bar(500, 1000, "x") ==
        "[" + std::string(15, '#') + std::string(15, '.') + "] x");
  CHECK(train::progress_bar(1000, 1000, "") == "[" + std::string(30, '#') + "] ");
  CHECK(train::progress_bar(1, 3, "t", 10) == "[###.......] t");  // 3.33 rounds to 3
  CHECK(train::progress_bar(2, 3, "t", 10) == "[#######...] t");  // 6.67 rounds to 7
  CHECK(train::progress_bar(5, 0, "t", 4) == "[####] t");         // no total: full
  // out of range (a run resumed past a smaller --steps): clamped, never throws
  CHECK(train::progress_bar(1200, 1000, "t", 4) == "[####] t");
  CHECK(train::progress_bar(-1, 1000, "t", 4) == "[....] t");
}

TEST_CASE("step_metrics::to_json names the fields; optional ones only when set",
          "[train][metrics]") {
  auto m = sample_metrics();
  auto j = m.to_json();
  for (const char* k : {"step", "loss", "lr", "grad_norm", "clip", "tokens", "scored", "seconds",
                        "tokens_per_s", "mfu", "mem_allocated", "mem_peak"})
    CHECK(j.contains(k));
  CHECK_FALSE(j.contains("val_loss"));
  CHECK_FALSE(j.contains("skipped"));
  // A utilisation over 100% (a peak set too low) is null, as the log's "n/a".
  m.mfu = 5.2;
  CHECK(m.to_json()["mfu"].is_null());
  m.mfu = 0.25;
  CHECK(m.to_json()["mfu"].get<double>() == 0.25);
  m.val_loss = 2.47;
  m.skipped = true;
  j = m.to_json();
  CHECK(j["val_loss"].get<double>() == 2.47);
  CHECK(j["skipped"].get<bool>());
}

TEST_CASE("step_metrics::to_json round-trips doubles bit for bit through dump and parse",
          "[train][metrics]") {
  // resume_kill.sh compares loss, grad_norm and lr of two runs with exact
  // equality after they pass through the metrics file, so dump() must print
  // enough digits and parse() must round correctly: every finite double,
  // including subnormals, the extremes and -0.0, must come back with the same bits.
  std::vector<double> values = {0.1,
                                1.0 / 3.0,
                                2.4100000000000001,
                                3e-4,
                                -0.0,
                                0.0,
                                5e-324,
                                std::numeric_limits<double>::min(),
                                std::numeric_limits<double>::max(),
                                -std::numeric_limits<double>::max(),
                                std::nextafter(1.0, 2.0),
                                std::nextafter(1.0, 0.0),
                                9007199254740993.0};
  rng r(2026);
  while (values.size() < 20000) {  // random bit patterns over every exponent
    const std::uint64_t u = r.next_u64();
    double d;
    std::memcpy(&d, &u, sizeof d);
    if (std::isfinite(d)) values.push_back(d);
  }
  for (int i = 0; i < 2000; ++i) values.push_back(10.0 * r.uniform());  // loss-like values
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    train::step_metrics m = sample_metrics();
    m.step = static_cast<std::int64_t>(i) + 1;
    m.loss = values[i];
    m.grad_norm = values[values.size() - 1 - i];
    m.lr = values[(i * 7919) % values.size()];
    m.val_loss = values[(i * 104729) % values.size()];
    const auto back = nlohmann::json::parse(m.to_json().dump());
    const bool same = bits(back["loss"].get<double>()) == bits(m.loss) &&
                      bits(back["grad_norm"].get<double>()) == bits(m.grad_norm) &&
                      bits(back["lr"].get<double>()) == bits(m.lr) &&
                      bits(back["val_loss"].get<double>()) == bits(*m.val_loss) &&
                      back["step"].get<std::int64_t>() == m.step;
    if (!same) {
      INFO("value " << values[i] << " dumped as " << m.to_json().dump());
      CHECK(same);
      ++bad;
    }
  }
  CHECK(bad == 0);
  // integers too, up to the size_t range of the memory counters
  train::step_metrics m = sample_metrics();
  m.mem_peak = std::numeric_limits<std::size_t>::max();
  m.tokens = std::numeric_limits<std::int64_t>::max();
  const auto back = nlohmann::json::parse(m.to_json().dump());
  CHECK(back["mem_peak"].get<std::size_t>() == m.mem_peak);
  CHECK(back["tokens"].get<std::int64_t>() == m.tokens);
}

TEST_CASE("a skipped step's non-finite norm writes a line that still parses", "[train][metrics]") {
  // JSON has no NaN or infinity: nlohmann writes them as null. The line must
  // still parse and keep its step, so truncate_after keeps it.
  train::step_metrics m = sample_metrics();
  m.grad_norm = std::numeric_limits<double>::quiet_NaN();
  m.skipped = true;
  const auto back = nlohmann::json::parse(m.to_json().dump());
  CHECK(back["grad_norm"].is_null());
  CHECK(back["step"].get<std::int64_t>() == 120);
  CHECK(back["skipped"].get<bool>());
}

TEST_CASE("jsonl_writer::truncate_after keeps steps <= k and drops a line cut by a kill",
          "[train][metrics]") {
  temp_dir dir("truncate");
  const fs::path p = dir.path / "metrics.jsonl";
  std::vector<std::string> written;
  {
    train::jsonl_writer w(p);
    for (std::int64_t s = 1; s <= 10; ++s) {
      auto m = sample_metrics();
      m.step = s;
      m.loss = 1.0 / static_cast<double>(s);
      if (s % 4 == 0) m.val_loss = 2.0 + 1.0 / static_cast<double>(s);
      w.write(m.to_json());
      written.push_back(m.to_json().dump());
    }
  }
  // One object per line, flushed, each with its time (ISO 8601 UTC).
  auto untimed = [](std::vector<std::string> lines) {
    for (auto& l : lines) {
      auto j = nlohmann::json::parse(l);
      REQUIRE(j.contains("time"));
      const std::string t = j["time"];
      CHECK(t.size() == 24);
      CHECK(t[10] == 'T');
      CHECK(t.back() == 'Z');
      j.erase("time");
      l = j.dump();
    }
    return lines;
  };
  REQUIRE(untimed(read_lines(p)) == written);
  // A kill in the middle of step 11's line: no closing brace, no newline.
  {
    auto m = sample_metrics();
    m.step = 11;
    const std::string line = m.to_json().dump();
    std::ofstream(p, std::ios::app) << line.substr(0, line.size() / 2);
  }

  SECTION("k inside the file: steps 1..k, byte for byte") {
    const auto before = read_lines(p);
    train::jsonl_writer::truncate_after(p, 6);
    std::string want;
    for (int s = 0; s < 6; ++s) want += before[static_cast<std::size_t>(s)] + "\n";
    CHECK(read_all(p) == want);
  }
  SECTION("k past the last full line: every full line, the cut one dropped") {
    train::jsonl_writer::truncate_after(p, 12);
    CHECK(untimed(read_lines(p)) == written);
  }
  SECTION("k = 0: an empty file") {
    train::jsonl_writer::truncate_after(p, 0);
    CHECK(fs::exists(p));
    CHECK(fs::file_size(p) == 0);
  }
  SECTION("appending after truncation continues the run as one file") {
    train::jsonl_writer::truncate_after(p, 8);
    {
      train::jsonl_writer w(p);
      auto m = sample_metrics();
      m.step = 9;
      w.write(m.to_json());
    }
    const auto lines = read_lines(p);
    REQUIRE(lines.size() == 9);
    for (std::size_t i = 0; i < lines.size(); ++i)
      CHECK(nlohmann::json::parse(lines[i])["step"].get<std::int64_t>() ==
            static_cast<std::int64_t>(i) + 1);
  }
  // rewritten through a temp file and rename: no temp file is left behind
  CHECK(dir.entries() == std::vector<std::string>{"metrics.jsonl"});
}

TEST_CASE("jsonl_writer::truncate_after keeps the run's records and names a damaged line",
          "[train][metrics]") {
  temp_dir dir("records");
  const fs::path p = dir.path / "metrics.jsonl";
  {
    std::ofstream out(p);
    out << R"({"config":{"steps":"4"}})" << "\n"
        << R"({"step":1,"loss":2})" << "\n"
        << R"({"step":2,"loss":1})" << "\n"
        << R"({"resumed_at":1})" << "\n";
  }
  train::jsonl_writer::truncate_after(p, 1);
  CHECK(read_lines(p) == std::vector<std::string>{R"({"config":{"steps":"4"}})",
                                                  R"({"step":1,"loss":2})",
                                                  R"({"resumed_at":1})"});
  { std::ofstream(p, std::ios::app) << R"({"step":"x"})" << "\n" << R"({"step":3})" << "\n"; }
  CHECK_THROWS_WITH(train::jsonl_writer::truncate_after(p, 1),
                    Catch::Contains("metrics.jsonl' line 4 has step \"x\", not an integer"));
  { std::ofstream(p) << "garbage\n" << R"({"step":3})" << "\n"; }
  CHECK_THROWS_WITH(train::jsonl_writer::truncate_after(p, 1),
                    Catch::Contains("metrics.jsonl' line 1 is not a JSON object"));
}

TEST_CASE("jsonl_writer::truncate_after on a missing file does nothing; open errors name the path",
          "[train][metrics]") {
  temp_dir dir("missing");
  train::jsonl_writer::truncate_after(dir.path / "none.jsonl", 3);
  CHECK(dir.entries().empty());
  CHECK_THROWS_WITH(train::jsonl_writer(dir.path / "no_such_dir" / "m.jsonl"),
                    Catch::Contains("no_such_dir/m.jsonl"));
}

}  // namespace test_train_metrics
