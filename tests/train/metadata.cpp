// Tests include/tessera/train/metadata.hpp: the learning-rate schedule a
// checkpoint records (its name and the parameters not recorded beside it),
// and the resume check on it: another schedule is refused naming both, and
// the record of a tessera before the choice of schedules
// ({"name": "warmup_cosine", ...}) reads as cosine; the document mask a
// checkpoint records, and the resume check on it.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "tessera/train/metadata.hpp"

namespace test_train_metadata {

using namespace tessera;
using nlohmann::json;

namespace {

// The outcome of check_resume_metadata: the step, or the refusal's text.
std::string resume(json theirs, const json& mine) {
  try {
    return std::to_string(train::check_resume_metadata("ck", theirs, mine, 10));
  } catch (const config_error& e) {
    return e.what();
  }
}

// A run's settings as the resume check sees them (the keys that matter here).
json settings(const train::train_config& c, std::int64_t step) {
  return {{"step", step},
          {"lr", c.lr},
          {"warmup", c.warmup},
          {"steps", c.steps},
          {"schedule", train::schedule_metadata(c)}};
}

}  // namespace

TEST_CASE("schedule_metadata records the schedule's name and parameters", "[train][metadata]") {
  train::train_config c;
  CHECK(train::schedule_metadata(c) == json{{"name", "cosine"}, {"min_lr_ratio", 0.1}});
  c.lr_schedule = optim::lr_schedule_kind::wsd;
  c.wsd = {0.2, optim::wsd_cooldown::sqrt};
  c.min_lr_ratio = 0;
  CHECK(
      train::schedule_metadata(c) ==
      json{{"name", "wsd"}, {"min_lr_ratio", 0.0}, {"decay_fraction", 0.2}, {"cooldown", "sqrt"}});
  c.lr_schedule = optim::lr_schedule_kind::inverse_sqrt;
  c.wsd = {};
  CHECK(train::schedule_metadata(c) == json{{"name", "inverse_sqrt"}, {"min_lr_ratio", 0.0}});
}

TEST_CASE("a resume refuses another schedule, naming both; an older cosine record is cosine",
          "[train][metadata]") {
  train::train_config cosine, wsd, linear;
  wsd.lr_schedule = optim::lr_schedule_kind::wsd;
  linear.lr_schedule = optim::lr_schedule_kind::linear;
  CHECK(resume(settings(wsd, 4), settings(wsd, 0)) == "4");
  CHECK(resume(settings(wsd, 4), settings(linear, 0)) ==
        "checkpoint 'ck' was written with other settings: "
        "schedule={\"cooldown\":\"linear\",\"decay_fraction\":0.1,\"min_lr_ratio\":0.1,\"name\":"
        "\"wsd\"} in the checkpoint, {\"min_lr_ratio\":0.1,\"name\":\"linear\"} in this run");
  auto sqrt = wsd;
  sqrt.wsd.cooldown = optim::wsd_cooldown::sqrt;
  CHECK(resume(settings(wsd, 4), settings(sqrt, 0)) ==
        "checkpoint 'ck' was written with other settings: "
        "schedule={\"cooldown\":\"linear\",\"decay_fraction\":0.1,\"min_lr_ratio\":0.1,\"name\":"
        "\"wsd\"} in the checkpoint, {\"cooldown\":\"sqrt\",\"decay_fraction\":0.1,\"min_lr_"
        "ratio\":0.1,\"name\":\"wsd\"} in this run");
  // More steps than the checkpoint planned resume under any schedule.
  auto longer = wsd;
  longer.steps = 5000;
  CHECK(resume(settings(wsd, 4), settings(longer, 0)) == "4");
  // What a tessera before the choice of schedules wrote for its
  // warmup-cosine: cosine, at its own ratio.
  json old = settings(cosine, 3);
  old["schedule"] = {{"name", "warmup_cosine"}, {"min_lr_ratio", 0.1}};
  CHECK(resume(old, settings(cosine, 0)) == "3");
  CHECK(resume(old, settings(wsd, 0)) ==
        "checkpoint 'ck' was written with other settings: "
        "schedule={\"min_lr_ratio\":0.1,\"name\":\"cosine\"} in the checkpoint, "
        "{\"cooldown\":\"linear\",\"decay_fraction\":0.1,\"min_lr_ratio\":0.1,\"name\":\"wsd\"} "
        "in this run");
  old["schedule"]["min_lr_ratio"] = 0.2;
  CHECK(resume(old, settings(cosine, 0)) ==
        "checkpoint 'ck' was written with other settings: "
        "schedule={\"min_lr_ratio\":0.2,\"name\":\"cosine\"} in the checkpoint, "
        "{\"min_lr_ratio\":0.1,\"name\":\"cosine\"} in this run");
}

TEST_CASE("a resume refuses another document mask; a checkpoint without the record had none",
          "[train][metadata][document_mask]") {
  train::train_config plain, docs, other;
  docs.document_separator = 3;
  other.document_separator = 10;
  CHECK(train::document_separator_metadata(plain) == json());
  CHECK(train::document_separator_metadata(docs) == json(3));
  auto with_mask = [](const train::train_config& c, std::int64_t step) {
    json j = settings(c, step);
    j["document_separator"] = train::document_separator_metadata(c);
    return j;
  };
  CHECK(resume(with_mask(docs, 2), with_mask(docs, 0)) == "2");
  CHECK(resume(with_mask(docs, 2), with_mask(plain, 0)) ==
        "checkpoint 'ck' was written with other settings: document_separator=3 in the checkpoint, "
        "null in this run");
  CHECK(resume(with_mask(docs, 2), with_mask(other, 0)) ==
        "checkpoint 'ck' was written with other settings: document_separator=3 in the checkpoint, "
        "10 in this run");
  // A checkpoint of a tessera before the document mask trained without one.
  CHECK(resume(settings(plain, 2), with_mask(plain, 0)) == "2");
  CHECK(resume(settings(plain, 2), with_mask(docs, 0)) ==
        "checkpoint 'ck' was written with other settings: document_separator=null in the checkpoint, "
        "3 in this run");
}

}  // namespace test_train_metadata
