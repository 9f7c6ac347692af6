/// \file tests/fuzz/token_file.cpp
/// Fuzzes data::token_file (tessera's .tok, llm.c .bin shards, NumPy .npy):
/// arbitrary bytes are written to a temporary file and opened. A refusal
/// must be a tessera::error; an accepted file must hold every id below its
/// vocabulary, and its tokens must be the last N x width bytes of the input
/// (every format puts them at the end, and the reader checks the size exactly).

#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_common.hpp"
#include "tessera/data/token_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera;
  const auto path = fuzz::temp_dir() / "input.tok";
  fuzz::write_bytes(path, data, size);
  fuzz::accepts([&] {
    const data::token_file f = data::token_file::open(path);
    const std::uint64_t n = f.size(), w = data::dtype_bytes(f.dtype());
    TESSERA_FUZZ_REQUIRE(f.vocab() >= 1, "an accepted file has a vocabulary of at least 1");
    TESSERA_FUZZ_REQUIRE(n <= size / w, "the tokens fit the file");
    const std::uint8_t* tokens = data + (size - n * w);
    for (std::uint64_t i = 0; i < n; ++i) {
      std::uint32_t v = 0;
      std::memcpy(&v, tokens + i * w, w);
      TESSERA_FUZZ_REQUIRE(f[i] == v, "token i is the file's bytes at its end");
      TESSERA_FUZZ_REQUIRE(f[i] < f.vocab(), "every id is below the vocabulary");
    }
    const auto s = f.split();
    TESSERA_FUZZ_REQUIRE(s.train.begin == 0 && s.train.end == s.val.begin && s.val.end == n,
                         "the split covers the file");
    if (f.vocab() <= (std::uint64_t{1} << 31)) {  // read() refuses larger ones (documented)
      std::vector<std::int32_t> out(n);
      f.read(0, static_cast<std::int64_t>(n), out.data());
      for (std::uint64_t i = 0; i < n; ++i)
        TESSERA_FUZZ_REQUIRE(static_cast<std::uint32_t>(out[i]) == f[i], "read() agrees with []");
    }
  });
  return 0;
}
