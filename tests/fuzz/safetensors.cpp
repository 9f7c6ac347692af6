/// \file tests/fuzz/safetensors.cpp
/// Fuzzes data::safetensors_file: arbitrary bytes written to a temporary
/// file and opened. A refusal must be a tessera::error. An accepted file's
/// tensors must lie inside it and tile its data exactly (each tensor's
/// bytes are the input's bytes at its offset), hold numel x dtype bytes,
/// and a floating tensor must convert every element.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_common.hpp"
#include "tessera/data/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const auto path = fuzz::temp_dir() / "input.safetensors";
  fuzz::write_bytes(path, data, size);
  fuzz::accepts([&] {
    const data::safetensors_file f(path);
    TESSERA_FUZZ_REQUIRE(size >= 8, "an accepted file holds the header length");
    std::uint64_t n = 0;
    std::memcpy(&n, data, 8);
    TESSERA_FUZZ_REQUIRE(n <= size - 8, "the header lies inside the file");
    const std::uint64_t data_bytes = size - 8 - n;
    const std::uint8_t* in = data + 8 + n;  // the input's data section
    // The tiling puts the lowest tensor at offset 0 of the data.
    const unsigned char* lo = nullptr;
    std::uint64_t total = 0;
    for (const auto& [name, t] : f.tensors())
      if (lo == nullptr || t.data < lo) lo = t.data;
    std::vector<double> buf;
    for (const auto& [name, t] : f.tensors()) {
      const auto off = static_cast<std::uint64_t>(t.data - lo);
      TESSERA_FUZZ_REQUIRE(off <= data_bytes && t.bytes <= data_bytes - off,
                           "a tensor lies inside the data");
      TESSERA_FUZZ_REQUIRE(t.bytes == 0 || std::memcmp(t.data, in + off, t.bytes) == 0,
                           "a tensor's bytes are the file's at its offset");
      const std::size_t eb = data::safetensors_dtype_bytes(t.dtype);
      TESSERA_FUZZ_REQUIRE(eb > 0, "an accepted dtype is known");
      for (std::int64_t d : t.shape) TESSERA_FUZZ_REQUIRE(d >= 0, "dimensions are >= 0");
      const std::int64_t numel = t.numel();
      TESSERA_FUZZ_REQUIRE(numel >= 0 && static_cast<std::uint64_t>(numel) * eb == t.bytes,
                           "bytes = numel x dtype bytes");
      total += t.bytes;
      if (t.dtype == "F64" || t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16") {
        buf.resize(static_cast<std::size_t>(numel));
        t.read(0, numel, buf.data());
      }
    }
    TESSERA_FUZZ_REQUIRE(total == data_bytes, "the tensors tile the data");
    for (const auto& [k, v] : f.metadata()) (void)v;
  });
  return 0;
}
