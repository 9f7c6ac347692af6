/// \file tests/fuzz/checkpoint.cpp
/// Fuzzes train::read_checkpoint (header, JSON metadata, payload, FNV-1a
/// checksum). Each input is read twice: as given, which exercises the
/// header and size checks, and repaired (magic, version, payload length
/// and checksum made consistent with the bytes), which lets the fuzzer
/// reach the metadata parser past the checksum it could not forge. A
/// refusal must be a tessera::error; an accepted checkpoint must give an
/// object and exactly the payload bytes of the file.

#include <cstdint>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_common.hpp"
#include "tessera/train/checkpoint_file.hpp"

namespace {

std::uint64_t load64(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void read_one(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const auto path = fuzz::temp_dir() / "input.ckpt";
  fuzz::write_bytes(path, data, size);
  nlohmann::json meta;
  std::vector<char> payload;
  if (!fuzz::accepts([&] { train::read_checkpoint(path, meta, payload); })) return;
  TESSERA_FUZZ_REQUIRE(meta.is_object(), "accepted metadata is an object");
  TESSERA_FUZZ_REQUIRE(size >= 40, "an accepted file holds the fixed fields");
  const std::uint64_t jn = load64(data + 16);
  TESSERA_FUZZ_REQUIRE(jn <= size - 40, "the metadata lies inside the file");
  const std::uint64_t pn = load64(data + 24 + jn);
  TESSERA_FUZZ_REQUIRE(pn == size - 40 - jn && payload.size() == pn, "the payload length");
  TESSERA_FUZZ_REQUIRE(pn == 0 || std::memcmp(payload.data(), data + 32 + jn, pn) == 0,
                       "the payload is the file's bytes");
  (void)meta.dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  read_one(data, size);
  // The repaired copy: needs room for the 40 bytes of fixed fields.
  if (size < 40) return 0;
  std::vector<std::uint8_t> b(data, data + size);
  std::memcpy(b.data(), tessera::train::checkpoint_magic, 8);
  const std::uint32_t version = tessera::train::checkpoint_version;
  std::memcpy(b.data() + 8, &version, 4);
  std::uint64_t jn = load64(b.data() + 16);
  if (jn > size - 40) {
    jn %= size - 40 + 1;
    std::memcpy(b.data() + 16, &jn, 8);
  }
  const std::uint64_t pn = size - 40 - jn;
  std::memcpy(b.data() + 24 + jn, &pn, 8);
  const char* js = reinterpret_cast<const char*>(b.data() + 24);
  const std::uint64_t h = tessera::train::fnv1a64(reinterpret_cast<const char*>(b.data() + 32 + jn),
                                                  pn, tessera::train::fnv1a64(js, jn));
  std::memcpy(b.data() + size - 8, &h, 8);
  read_one(b.data(), b.size());
  return 0;
}
