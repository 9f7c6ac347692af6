#pragma once
/// \file kernels/detail/muon.hpp
/// The arithmetic of Muon shared by the host kernels (kernels/muon.hpp) and
/// the CUDA bodies (kernels/cuda/muon.cuh): the segment and matrix tables,
/// the per-element momentum, Nesterov and update rules, and where each
/// element of a (possibly tensor-parallel) matrix lies in the matrix the
/// Newton-Schulz iteration runs on.
///
/// Source: K. Jordan et al. 2024, "Muon: An optimizer for hidden layers in
/// neural networks"; J. Liu et al. 2025, "Muon is Scalable for LLM
/// Training" (the match_rms_adamw scale), in the arithmetic of
/// torch.optim.Muon (torch/optim/_muon.py of PyTorch 2.9 and later; lines
/// of the 2.15.0 file: the defaults, 25-29; _zeropower_via_newtonschulz,
/// 32-71, its bfloat16 cast 56, transpose 57-58, clamped Frobenius norm 60,
/// quintic step 62-67; _adjust_lr, 74-87; _single_tensor_muon, 319-352, the
/// momentum lerp 344, Nesterov 345, decay 351, update 352).

#include <cstddef>
#include <cstdint>

#include "tessera/core/config.hpp"
#include "tessera/kernels/detail/adamw.hpp"

namespace tessera::kernels {

/// One range of a Muon optimizer's elements, as optimizer_segment with
/// what the fused pass needs besides: `muon` 1 for an element of a matrix
/// Muon updates (its momentum only in the fused pass), 0 for an element
/// AdamW updates (the embedding, the LM head, the norm gains), whose
/// second moment is at v[i + v_shift] (a buffer of the AdamW elements only).
struct muon_segment {
  std::int64_t begin;
  std::int64_t end;
  std::int32_t decay;
  std::int32_t muon;
  std::int64_t param_shift = 0;
  std::int64_t grad_shift = 0;
  std::int64_t v_shift = 0;
};
static_assert(sizeof(muon_segment) == 48);

/// One matrix Muon orthogonalises: elements [begin, end) of the optimizer
/// are elements [first, first + end - begin) of this rank's shard (`rows` x
/// `cols` row-major: all of it, or a ZeRO chunk's piece; its parameters at
/// param_shift and gradients at grad_shift from there) of a whole matrix
/// `full_rows` x `full_cols` (torch's param.shape: out x in features)
/// split along `split` (-1 whole, 0 rows, 1 columns) over a tp group of
/// `shards` ranks, this rank's shard index `shard` (of shards / replicas
/// distinct shards: `replicas` consecutive ranks hold the same rows when
/// key/value heads are replicated). The Newton-Schulz iteration runs on
/// the wide matrix W (m x n, m = min(full_rows, full_cols)): the whole
/// matrix, transposed when full_rows > full_cols (torch's `G.size(0) >
/// G.size(1)`).
struct muon_matrix {
  std::int64_t begin = 0, end = 0;
  std::int64_t param_shift = 0, grad_shift = 0;
  std::int64_t rows = 0, cols = 0;
  std::int64_t full_rows = 0, full_cols = 0;
  std::int64_t first = 0;
  std::int32_t split = -1, shards = 1, shard = 0, replicas = 1, decay = 1;
  /// Whether W is the transpose of the matrix.
  TESSERA_HOST_DEVICE bool transposed() const { return full_rows > full_cols; }
  /// W's rows (the smaller side) and columns.
  TESSERA_HOST_DEVICE std::int64_t wide_rows() const {
    return full_rows > full_cols ? full_cols : full_rows;
  }
  TESSERA_HOST_DEVICE std::int64_t wide_cols() const {
    return full_rows > full_cols ? full_rows : full_cols;
  }
  /// Elements of this rank's shard.
  TESSERA_HOST_DEVICE std::int64_t local() const { return rows * cols; }
  /// Elements of it this optimizer owns (the shard, or a ZeRO piece of it).
  TESSERA_HOST_DEVICE std::int64_t owned() const { return end - begin; }
  /// Elements of the whole matrix.
  TESSERA_HOST_DEVICE std::int64_t whole() const { return full_rows * full_cols; }
  /// Elements every rank's shard gathered over the tp group take.
  TESSERA_HOST_DEVICE std::int64_t gathered() const { return local() * shards; }
};

/// Scratch elements of the Newton-Schulz iteration on a wide m x n matrix
/// of `elem`-byte elements: W's partner (m n), the Gram matrix and its
/// polynomial (2 m m), and one double (the squared norm) with room to
/// align it to 8 bytes (muon_norm_slot).
inline std::int64_t muon_ns_scratch_elements(std::int64_t m, std::int64_t n, std::size_t elem) {
  const auto e = static_cast<std::int64_t>(elem);
  const std::int64_t slot = (8 + e - 1) / e, pad = e < 8 ? 8 / e - 1 : 0;
  return m * n + 2 * m * m + slot + pad;
}
/// The 8-byte aligned double of the scratch after `end` (muon_ns_scratch_elements).
template <class M>
TESSERA_HOST_DEVICE inline double* muon_norm_slot(M* end) {
  const auto a = reinterpret_cast<std::uintptr_t>(end);
  return reinterpret_cast<double*>((a + 7) / 8 * 8);
}
/// Scratch elements one step needs for matrix `t`: its shard (what is
/// orthogonalised), the gathered shards (split over tp > 1), W, and the
/// iteration's (muon_ns_scratch_elements).
inline std::int64_t muon_scratch_elements(const muon_matrix& t, std::size_t elem) {
  const std::int64_t gathered = t.split >= 0 && t.shards > 1 ? t.gathered() : 0;
  return t.local() + gathered + t.whole() +
         muon_ns_scratch_elements(t.wide_rows(), t.wide_cols(), elem);
}

}  // namespace tessera::kernels

namespace tessera::kernels::detail {

/// Hyper-parameters of one Muon step (the fused pass and the update).
template <class A>
struct muon_step_params {
  A lr;            ///< the matrices' learning rate of this step (before the shape scale)
  A momentum;      ///< mu: buf = lerp(buf, g, 1 - mu)
  A weight_decay;  ///< decoupled: p *= 1 - lr wd (both parts)
  A grad_scale;    ///< gradient multiplier (clip coefficient)
  bool nesterov;   ///< update = lerp(g, buf, mu) instead of buf
  /// AdamW's step for the other tensors (its lr already lr * adamw_lr_ratio).
  adamw_step_params<A> adamw;
};

/// torch.lerp's formula (ATen's lerp kernel, aten/src/ATen/native/Lerp.h):
/// start + w (end - start) for |w| < 0.5, else end - (end - start)(1 - w),
/// so that w = 1 gives end exactly.
template <class A>
TESSERA_HOST_DEVICE inline A muon_lerp(A start, A end, A w) {
  return (w < A(0.5) && w > A(-0.5)) ? start + w * (end - start) : end - (end - start) * (A(1) - w);
}

/// The momentum of one matrix element, as torch's `buf.lerp_(grad, 1 -
/// momentum)` (_muon.py, _single_tensor_muon): g is already scaled.
template <class A>
TESSERA_HOST_DEVICE inline void muon_momentum(A& buf, A g, const muon_step_params<A>& s) {
  buf = muon_lerp(buf, g, A(1) - s.momentum);
}

/// What Newton-Schulz orthogonalises of one element: `grad.lerp(buf,
/// momentum)` with Nesterov, else buf (_single_tensor_muon).
template <class A>
TESSERA_HOST_DEVICE inline A muon_nesterov(A buf, A g, const muon_step_params<A>& s) {
  return s.nesterov ? muon_lerp(g, buf, s.momentum) : buf;
}

/// The update of one matrix element by its orthogonalised value o:
/// `param.mul_(1 - lr wd); param.add_(o, alpha=-adjusted_lr)`
/// (_single_tensor_muon); `decay_factor` is 1 - lr wd (1 without decay).
template <class A>
TESSERA_HOST_DEVICE inline void muon_apply(A& p, A o, A decay_factor, A adjusted_lr) {
  p = p * decay_factor;
  p = p - adjusted_lr * o;
}

/// Where element (R, C) of the whole matrix lies in W (row-major m x n).
TESSERA_HOST_DEVICE inline std::int64_t muon_wide_index(const muon_matrix& t, std::int64_t R,
                                                        std::int64_t C) {
  return t.transposed() ? C * t.full_rows + R : R * t.full_cols + C;
}

/// Where element (R, C) of the whole matrix lies in the shards gathered in
/// tp rank order (each its rows x cols row-major), read from the first
/// replica of its shard: a row split's gather is the matrix itself (without
/// replicas), a column split's is its column blocks one after another.
TESSERA_HOST_DEVICE inline std::int64_t muon_gathered_index(const muon_matrix& t, std::int64_t R,
                                                            std::int64_t C) {
  if (t.split == 0) {
    const std::int64_t q = R / t.rows;
    return q * t.replicas * t.rows * t.cols + (R - q * t.rows) * t.cols + C;
  }
  if (t.split == 1) {
    const std::int64_t q = C / t.cols;
    return q * t.replicas * t.rows * t.cols + R * t.cols + (C - q * t.cols);
  }
  return R * t.full_cols + C;
}

/// Where local element j of this rank's shard (row-major rows x cols) lies in W.
TESSERA_HOST_DEVICE inline std::int64_t muon_local_to_wide(const muon_matrix& t, std::int64_t j) {
  const std::int64_t i = j / t.cols, c = j % t.cols;
  const std::int64_t R = t.split == 0 ? t.shard * t.rows + i : i;
  const std::int64_t C = t.split == 1 ? t.shard * t.cols + c : c;
  return muon_wide_index(t, R, C);
}

/// Where element k of W comes from in the gathered shards.
TESSERA_HOST_DEVICE inline std::int64_t muon_wide_to_gathered(const muon_matrix& t,
                                                              std::int64_t k) {
  const std::int64_t n = t.wide_cols();
  const std::int64_t a = k / n, b = k % n;  // W(a, b)
  return t.transposed() ? muon_gathered_index(t, b, a) : muon_gathered_index(t, a, b);
}

}  // namespace tessera::kernels::detail
