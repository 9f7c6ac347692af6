#pragma once
/// \file documents.hpp
/// Packed documents: where each document of a training window starts, from a
/// separator token, for the document mask (kernels::attention_mask) and the
/// positions RoPE rotates by.
///
/// The separator rule (torchtitan's and Megatron-LM's): the separator (the
/// tokenizer's EOS) is the last token of the document it ends, and the token
/// after it is position 0 of the next document. A window is cut from the
/// stream anywhere, so its first token starts a document (the rest of one
/// whose beginning lies before the window); a window that starts with a
/// separator holds a one-token document first. Nothing is added to the loss
/// mask: the target after a separator (the next document's first token) is
/// scored as before.

#include <cstdint>

#include "tessera/core/error.hpp"

namespace tessera::data {

/// Writes `doc_start` (B, T) int32: for the inputs of B windows (`windows`
/// (B, T+1) int32 row-major, inputs columns 0..T-1, as batch_sampler::fill
/// gives them), the column at which each input token's document starts in
/// its row: doc_start[b T + t] = 1 + the last column u < t whose token is
/// `separator`, or 0 when there is none. Position t - doc_start[b T + t] is
/// the token's position in its document (0 at each document's first token);
/// doc_start is nondecreasing along a row, as the attention kernels require.
/// Throws config_error if B or T < 1.
inline void document_starts(const std::int32_t* windows, std::int64_t B, std::int64_t T,
                            std::int32_t separator, std::int32_t* doc_start) {
  TESSERA_THROW_IF(B < 1 || T < 1, config_error, "document_starts: B=", B, " and T=", T,
                   " must be >= 1");
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int32_t* w = windows + b * (T + 1);
    std::int32_t start = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      if (t > 0 && w[t - 1] == separator) start = static_cast<std::int32_t>(t);
      doc_start[b * T + t] = start;
    }
  }
}

}  // namespace tessera::data
