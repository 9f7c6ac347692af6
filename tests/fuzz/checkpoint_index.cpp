/// \file tests/fuzz/checkpoint_index.cpp
/// Fuzzes the layout-free checkpoint's metadata reader
/// (train::checkpoint_index::from_json after the depth-bounded JSON parse,
/// as checkpoint_reader reads metadata.json). A refusal must be a
/// tessera::error. Accepted metadata must survive its own JSON round trip,
/// and every region plan of a whole tensor's role (where the tensor is
/// small enough to walk) must copy inside the files the metadata records
/// and inside the tensor.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_common.hpp"
#include "tessera/core/file.hpp"
#include "tessera/train/checkpoint_index.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const std::string text(reinterpret_cast<const char*>(data), size);
  train::checkpoint_index x;
  const bool ok = fuzz::accepts([&] {
    nlohmann::json j;
    try {
      j = parse_json_bounded("metadata.json", text);
    } catch (const nlohmann::json::exception& e) {
      throw io_error(e.what());  // what checkpoint_reader reports
    }
    x = train::checkpoint_index::from_json(j, "metadata.json");
  });
  if (!ok) return 0;
  TESSERA_FUZZ_REQUIRE(
      train::checkpoint_index::from_json(x.to_json(), "again").to_json() == x.to_json(),
      "the metadata survives its JSON round trip");
  for (const auto& entry : x.tensors) {  // not a structured binding: clang 14 cannot capture one
    const std::string& name = entry.first;
    const train::stored_tensor& t = entry.second;
    train::index_box box{std::vector<std::int64_t>(t.shape.size(), 0), t.shape};
    std::int64_t n = 1;
    bool small = true;
    for (const std::int64_t s : t.shape) {
      if (s > 4096 || n > 4096) small = false;
      n *= small ? s : 1;
    }
    if (!small || n > 4096) continue;
    for (const auto& role_dtype : t.roles) {
      const std::string& role = role_dtype.first;
      const std::size_t esize = train::dtype_bytes_of(role_dtype.second);
      std::vector<train::region_copy> plan;
      if (!fuzz::accepts([&] { plan = x.plan_region(name, role, box, 0, n); })) continue;
      std::int64_t copied = 0;
      for (const train::region_copy& c : plan) {
        TESSERA_FUZZ_REQUIRE(c.file >= 0 && static_cast<std::size_t>(c.file) < x.files.size(),
                             "a copy's file exists");
        const std::uint64_t bytes = x.files[static_cast<std::size_t>(c.file)].bytes;
        TESSERA_FUZZ_REQUIRE(
            c.n > 0 && c.src <= bytes && static_cast<std::uint64_t>(c.n) * esize <= bytes - c.src,
            "a copy stays inside its file");
        TESSERA_FUZZ_REQUIRE(c.dst >= 0 && c.dst + c.n <= n, "a copy stays inside the tensor");
        copied += c.n;
      }
      TESSERA_FUZZ_REQUIRE(copied >= n, "an accepted plan covers every element");
    }
  }
  return 0;
}
