#pragma once
/// \file plan/activations.hpp
/// Bytes of one micro-batch's activations, workspaces and kernel scratch on
/// a backend: the allocation timeline of nn::llama's forward then backward,
/// walked from the modules' own byte reports (nn::block_bytes) and each
/// backend's kernel scratch, activation checkpointing included; and the
/// trainer's own buffers. tests/nn/llama_records.cpp holds the host figures
/// to the allocator's measured peak to the byte.
///
/// All figures are bytes unless a name says otherwise.

#include <algorithm>
#include <cstdint>

#include "tessera/core/error.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/cross_entropy.hpp"
#include "tessera/kernels/cuda/launch.hpp"
#include "tessera/nn/context_parallel.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/llama_record.hpp"
#include "tessera/plan/state.hpp"

namespace tessera::plan {

/// Which backend's kernels a plan sizes the scratch of (the model's and the
/// optimizer's tensors are the same on both: one code path).
enum class backend_kind { host, cuda };

/// Shape of one micro-batch and the options that size its workspaces.
struct activation_options {
  std::int64_t micro_batch = 1;  ///< B, sequences per micro-batch
  std::int64_t seq = 0;          ///< T, tokens per sequence (0: the config's max_seq)
  nn::llama_options model{};     ///< ce_chunk and the checkpointing policy, as given to nn::llama
  int threads = 1;               ///< host: OpenMP threads (attention scratch is per thread)
  kernels::attention_tiles tiles{};  ///< host attention tiles (kernels::host_context::tiles)
  backend_kind backend = backend_kind::host;  ///< whose kernels' scratch to count
  /// host: bf16 x bf16 GEMMs run on oneDNN's native bf16 matmul and need
  /// no conversion buffers (kernels::detail::bf16_gemm_native(): this build
  /// on this CPU).
  bool host_bf16_gemm_native = kernels::detail::bf16_gemm_native();
  std::int64_t micro_batches = 1;  ///< A, micro-batches per step and rank (the step's loss scalars)
  /// Packed documents (train_config::document_separator): the step's
  /// (A, B, T) int32 document starts, in the context's memory.
  bool document_mask = false;
  /// Tensor parallelism: each block's record and workspace hold this
  /// rank's heads and SwiGLU columns (nh/tp, nkv/tp, F/tp); the embedding
  /// and the head are whole.
  int tp = 1;
  /// Sequence parallelism over tp: the residual stream, the norms and the
  /// head's input gradient hold N/tp token rows; the forward keeps a
  /// gathered (N, H) norm output beside the projection buffer, and the
  /// backward workspace the gathered and reduce-scattered buffers
  /// (nn::block_bytes with rows_div = tp).
  bool sequence_parallel = false;
  /// Context parallelism: each rank holds T/cp tokens of every sequence
  /// (seq stays the whole T), so every activation shrinks by cp, and the
  /// attention runs over the cp group: its workspace (nn::cp_attention_bytes)
  /// and its kernels' scratch on the blocks it computes (ring: chunks of
  /// T/(2 cp) queries and keys; Ulysses: whole sequences, nh/cp heads).
  int cp = 1;
  nn::cp_kind cp_kind = nn::cp_kind::ring;
  /// cuda: the context's cuBLASLt workspace (kernels::cuda_context_options).
  std::uint64_t cublaslt_workspace = std::uint64_t(32) << 20;
};

/// Bytes train::trainer allocates from the context's resource besides the
/// model and the engine: the loader's buffers (data/device_loader.hpp: two
/// slots of 2 B T int32 inputs and targets; on the host the "pinned" and
/// "device" buffers are both in the resource, on a GPU the pinned ones are
/// page-locked host memory, outside the device allocator), the step's
/// scalars ((1 + A) doubles: the norm and each micro-batch's loss), the
/// clip coefficient (one master_type) and, with a document mask, the
/// step's (A, B, T) int32 document starts. (Host values summed over the mesh
/// travel through a transient buffer of their own: parallel::layout::reduce.)
inline std::uint64_t trainer_bytes(const activation_options& o, std::int64_t T,
                                   const dtype_sizes& d) {
  const auto N = static_cast<std::uint64_t>(o.micro_batch * T);
  const std::uint64_t slot = 2 * N * sizeof(std::int32_t);
  const std::uint64_t loader = (o.backend == backend_kind::host ? 4 : 2) * slot;
  const std::uint64_t documents =
      o.document_mask ? static_cast<std::uint64_t>(o.micro_batches) * N * sizeof(std::int32_t) : 0;
  return loader + static_cast<std::uint64_t>(1 + o.micro_batches) * sizeof(double) + d.master +
         documents;
}

/// Activation bytes of one micro-batch's training forward and backward
/// (nn::llama::forward then backward), and their peak over the timeline.
struct activation_plan {
  std::int64_t tokens = 0;  ///< N = B T
  /// What the training forward leaves for the backward (llama::record_bytes):
  /// every block's record (or, checkpointed, its input), the ids, the
  /// head's input gradient.
  std::uint64_t saved = 0;
  std::uint64_t forward_temporaries = 0;  ///< the (N, H) output-projection buffer of the forward
  /// The fused LM head: chunk V accum + chunk doubles (+ bf16 conversion
  /// blocks on the host; the CUDA kernel's scratch and bf16 dx on a GPU).
  std::uint64_t logits_workspace = 0;
  /// The backward's gradients: the residual stream's (N, H) and the blocks'
  /// workspace (nn::block_bytes::workspace), plus the recompute's
  /// projection buffer under checkpointing.
  std::uint64_t backward_temporaries = 0;
  std::uint64_t attention_scratch = 0;  ///< largest attention workspace (forward or backward)
  std::uint64_t peak = 0;               ///< the most bytes live at once over forward and backward
  /// Host backend only, outside the memory resource: bf16 GEMM conversion
  /// buffers (kernels::gemm_workspace_bytes after one step); not in peak,
  /// nor is oneDNN's scratchpad (kernels::detail::onednn_workspace_bytes).
  std::uint64_t host_gemm_workspace = 0;
  /// Korthikanti et al. 2022 (seeds/001, "Phase 1"): 34 s b h bytes per layer
  /// for a standard 16-bit transformer without recomputation, L layers. For
  /// comparison only: our block saves a different set (SwiGLU's three F-wide
  /// tensors, q/k/v after RoPE, no dropout masks, lse instead of scores).
  std::uint64_t korthikanti_34sbh = 0;
};

namespace detail {
// The scratch the kernels of one backend allocate inside a call, in bytes.
struct kernel_scratch {
  std::uint64_t attention_forward = 0, attention_backward = 0;
  std::uint64_t cross_entropy = 0;     // the fused LM head (training)
  std::uint64_t rmsnorm_backward = 0;  // per call
  std::uint64_t mlp_backward = 0;    // the largest bf16 copy of a float gradient into a GEMM (cuda)
  std::uint64_t attention_gemm = 0;  // the same for the attention's GEMMs (cuda)
};

inline kernel_scratch scratch_of(const nn::llama_config& c, const dtype_sizes& d,
                                 const activation_options& o, std::int64_t B, std::int64_t T) {
  const std::uint64_t N = static_cast<std::uint64_t>(B * T), H = static_cast<std::uint64_t>(c.dim),
                      F = static_cast<std::uint64_t>(c.ffn_dim),
                      KV = static_cast<std::uint64_t>(c.kv_dim()),
                      nh = static_cast<std::uint64_t>(c.n_heads),
                      hd = static_cast<std::uint64_t>(c.head_dim()),
                      V = static_cast<std::uint64_t>(c.vocab);
  const std::uint64_t A = d.accum, G = d.act_grad;
  kernel_scratch k;
  const auto C = static_cast<std::uint64_t>(std::min<std::int64_t>(o.model.ce_chunk, B * T));
  if (o.backend == backend_kind::host) {
    const auto thr = static_cast<std::uint64_t>(o.threads);
    // One rank holds the whole sequence: its T queries see T keys (Sk = T);
    // under ring context parallelism each call is one chunk's queries
    // against one chunk's keys, under Ulysses whole sequences.
    // (T is this rank's tokens: T/cp of the sequence's.)
    const std::int64_t Tk = o.cp > 1 && o.cp_kind == nn::cp_kind::ring ? T / 2 : T * o.cp;
    const auto tiles_fwd = static_cast<std::uint64_t>(
        kernels::detail::attention_forward_tile_elements(o.tiles, Tk, Tk, c.head_dim()));
    const auto tiles_bwd = static_cast<std::uint64_t>(
        kernels::detail::attention_backward_tile_elements(o.tiles, Tk, Tk, c.head_dim()));
    k.attention_forward = thr * tiles_fwd * A;
    // D, the tiles, and with 16-bit activation gradients a float dQ
    // accumulator; the ring's calls are one query chunk's (half this rank's
    // tokens) and accumulate dq in the layer's own float buffer.
    const bool ring = o.cp > 1 && o.cp_kind == nn::cp_kind::ring;
    const std::uint64_t Nq = ring ? N / 2 : N;
    k.attention_backward =
        Nq * nh * A + thr * tiles_bwd * A + (G != A && !ring ? N * nh * hd * A : 0);
    k.cross_entropy = C * V * A + C * sizeof(double);
    if (d.param != A) {  // 16-bit storage: x rows and a block of wlm converted to accum_type
      const std::uint64_t Vb = std::min<std::uint64_t>(
          V,
          std::max<std::uint64_t>(1, static_cast<std::uint64_t>(kernels::ce_wlm_block_elems) / H));
      k.cross_entropy += C * H * A + Vb * H * A;
    }
    if (G != A) k.cross_entropy += C * H * A;  // bf16 dx: each chunk's float dx first
  } else {
    // kernels/cuda/ops.hpp: each overload's ctx.scratch(...).
    const bool wide = G != 2;  // float32 activation gradients go through bf16 copies
    k.attention_backward = N * nh * 4 + (wide ? 2 * N * (2 * H + 2 * KV) : 0);
    k.cross_entropy = kernels::cuda::lm_head_cross_entropy_scratch_bytes(B * T, c.vocab, c.dim,
                                                                         o.model.ce_chunk) +
                      (wide ? 2 * N * H : 0);
    k.rmsnorm_backward = kernels::cuda::rmsnorm_backward_scratch_bytes(B * T, c.dim);
    k.mlp_backward = wide ? 2 * N * std::max(H, F) : 0;
    k.attention_gemm = wide ? 2 * N * H : 0;
  }
  return k;
}
}  // namespace detail

/// Activation bytes of one micro-batch, walking the model's allocation
/// timeline (nn/llama.hpp: embedding, blocks, head in forward; workspace,
/// blocks in reverse, embedding in backward) with the bytes each module
/// reports (nn::block_bytes) and the scratch of the backend's kernels.
/// Throws config_error for an invalid config or policy, B or T < 1 or
/// T > max_seq.
inline activation_plan plan_activations(const nn::llama_config& c, const dtype_sizes& d,
                                        const activation_options& o) {
  c.validate();
  o.model.checkpointing.validate();
  const std::int64_t B = o.micro_batch, S = o.seq > 0 ? o.seq : c.max_seq;
  TESSERA_THROW_IF(B < 1, config_error, "micro-batch B=", B, " must be >= 1");
  TESSERA_THROW_IF(S > c.max_seq, config_error, "sequence length T=", S,
                   " exceeds the model's max_seq=", c.max_seq);
  TESSERA_THROW_IF(o.threads < 1, config_error, "threads=", o.threads, " must be >= 1");
  if (o.cp > 1)
    nn::check_context_parallel(o.cp_kind, o.cp, S, c.n_heads / o.tp,
                               std::max<std::int64_t>(1, c.n_kv_heads / o.tp));
  const std::int64_t T = S / o.cp;  // this rank's tokens of each sequence
  const std::int64_t Ni = B * T;
  const std::uint64_t N = static_cast<std::uint64_t>(Ni), H = static_cast<std::uint64_t>(c.dim);
  const std::uint64_t P = d.param, G = d.act_grad, A = d.accum;
  nn::check_tensor_parallel(c, o.tp);
  nn::block_bytes bb = nn::block_bytes::of(
      c, static_cast<std::int64_t>(P), static_cast<std::int64_t>(G), static_cast<std::int64_t>(A));
  const int kv_rep = nn::kv_replicas(c, o.tp);
  bb.Hq /= o.tp;
  bb.KV = kv_rep > 1 ? c.head_dim() : bb.KV / o.tp;  // one head, replicated, when tp > nkv
  bb.F /= o.tp;
  bb.nh /= o.tp;
  bb.grad = static_cast<std::int64_t>(d.grad);
  bb.kv_scratch = kv_rep > 1 ? bb.KV * c.dim : 0;
  if (o.sequence_parallel) nn::check_sequence_parallel(T, o.tp);
  const bool sp = o.sequence_parallel;
  if (sp) bb.rows_div = o.tp;
  const std::uint64_t R = sp ? N / static_cast<std::uint64_t>(o.tp) : N;  // residual rows
  detail::kernel_scratch ks = detail::scratch_of(c, d, o, B, T);
  if (o.cp > 1) {  // the cp layer's own buffers, beside its kernels' scratch
    nn::cp_attention_bytes cb;
    cb.kind = o.cp_kind;
    cb.cp = o.cp;
    cb.B = B;
    cb.S = S;
    cb.nh = bb.nh;
    cb.nkv = bb.KV / c.head_dim();
    cb.hd = c.head_dim();
    cb.documents = o.document_mask;
    cb.param = static_cast<std::int64_t>(P);
    cb.act_grad = static_cast<std::int64_t>(G);
    cb.accum = static_cast<std::int64_t>(A);
    // host communicators carry 16-bit values as float; NCCL natively
    const bool host_wire = o.backend == backend_kind::host;
    cb.param_wire = host_wire ? std::max<std::int64_t>(4, cb.param) : cb.param;
    cb.grad_wire = host_wire ? std::max<std::int64_t>(4, cb.act_grad) : cb.act_grad;
    ks.attention_forward += static_cast<std::uint64_t>(cb.forward_workspace());
    ks.attention_backward += static_cast<std::uint64_t>(cb.backward_workspace());
  }
  const auto u = [](std::int64_t x) { return static_cast<std::uint64_t>(x); };
  const std::uint64_t att = u(bb.attention_part(Ni)), mlp = u(bb.mlp_part(Ni)), x = u(bb.input(Ni)),
                      ws = u(bb.workspace(Ni));
  const nn::checkpoint_policy& ck = o.model.checkpointing;
  activation_plan a;
  a.tokens = Ni;
  std::uint64_t live = 0, peak = 0;
  auto at = [&](std::uint64_t extra) { peak = std::max(peak, live + extra); };
  // ---- forward: embedding (ids, x), the projection buffer, the blocks.
  live = N * sizeof(std::int32_t) + R * H * P;
  if (sp) at(N * H * P);  // the embedding's rows before their reduce-scatter
  a.forward_temporaries = N * H * P * (sp ? 2 : 1);
  live += a.forward_temporaries;
  std::uint64_t held = N * sizeof(std::int32_t);  // what the record keeps from forward to backward
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    at(att + ks.attention_forward);  // the attention, its part of the record allocated
    at(att + mlp + x);               // the whole record and the block's output
    // The input moves into the record (already live); the output is new; a
    // checkpointed block frees the rest of its record.
    live += (ck.recomputes(l) ? 0 : att + mlp) + x;
    held += ck.recomputes(l) ? x : x + att + mlp;
  }
  live -= a.forward_temporaries;  // the projection buffer goes with the forward's blocks
  // ---- the head: final norm, fused LM head + cross-entropy, final norm backward.
  // rstd, xn, dxn (and under sequence parallelism the gathered xn, and
  // dxn's reduce-scattered rows)
  const std::uint64_t head_fwd = R * A + R * H * P + N * H * G + (sp ? N * H * P : 0);
  a.logits_workspace = ks.cross_entropy;
  at(head_fwd + ks.cross_entropy);
  const std::uint64_t head_bwd = sp ? R * A + R * H * P + 2 * R * H * G + H * d.grad
                                    : head_fwd + N * H * G;  // + the record's input gradient
  at(head_bwd + ks.rmsnorm_backward);
  live += R * H * G - x;  // the head keeps its input gradient; the last output goes
  held += R * H * G;
  a.saved = held;
  // ---- backward: the residual gradient (the head's), the workspace, the blocks.
  live += ws;
  a.backward_temporaries = R * H * G + ws;
  at(0);
  bool proj = false;
  for (std::int64_t l = c.n_layers - 1; l >= 0; --l) {
    if (ck.recomputes(l)) {
      if (!proj) {  // the recompute's projection buffer, once
        live += N * H * P;
        a.backward_temporaries += N * H * P;
        proj = true;
      }
      at(att + ks.attention_forward);  // recomputing the attention
      live += att + mlp;               // the record again (its input was kept)
    }
    at(std::max(ks.mlp_backward, ks.rmsnorm_backward));  // the MLP backward
    live -= mlp;                                         // its part of the record goes
    at(std::max({ks.attention_backward, ks.attention_gemm, ks.rmsnorm_backward}));
    live -= att + x;  // the rest of the record
  }
  // The embedding's backward, after the workspace went: under sequence
  // parallelism it gathers every rank's rows of the residual gradient.
  if (sp) peak = std::max(peak, live - ws + N * H * G);
  a.attention_scratch = std::max(ks.attention_forward, ks.attention_backward);
  a.peak = peak;
  if (o.backend == backend_kind::host && P != A) {
    // gemm_mixed converts bf16 A, B and C operands into per-slot float
    // buffers: A (N x max(H, F)), B (the larger of a weight and an
    // activation) and C. With native bf16 GEMMs the forward's bf16 x bf16
    // calls need none, and the backward's float x bf16 calls only B (dout
    // is A, in float); with 16-bit activation gradients every call is bf16
    // x bf16.
    const std::uint64_t act = N * std::max<std::uint64_t>(H, static_cast<std::uint64_t>(c.ffn_dim));
    const std::uint64_t b_slot =
        std::max<std::uint64_t>(static_cast<std::uint64_t>(c.ffn_dim) * H, act);
    if (!o.host_bf16_gemm_native)
      a.host_gemm_workspace = A * (act + b_slot + act);
    else if (G == A)
      a.host_gemm_workspace = A * b_slot;
  }
  a.korthikanti_34sbh = 34 * N * H * static_cast<std::uint64_t>(c.n_layers);
  return a;
}

/// A complete per-rank memory plan: model state, the trainer's buffers and

}  // namespace tessera::plan
