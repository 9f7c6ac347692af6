#pragma once
/// \file kernels/cuda/kernels.hpp
/// Declarations of the CUDA kernel launchers. The definitions are in
/// kernels/cuda/*.cuh (nvcc). How they reach a program (kernels/cuda/linkage.hpp):
/// - nvcc, by default (header-only, as CUTLASS, CUB and Thrust): this header
///   includes the .cuh files at its end, and a translation unit compiles the
///   kernels it instantiates; link tessera::cuda (CUDA runtime, cuBLASLt).
/// - a host compiler (g++), or nvcc with TESSERA_CUDA_PRECOMPILED_KERNELS
///   (which linking tessera::cuda_kernels defines): `extern template` of the
///   types listed at the bottom, which cuda/kernels*.cu instantiate once
///   into tessera::cuda_kernels; link it.
///
/// Common rules (every launcher):
/// - All pointers are device pointers (`d_`), row-major, contiguous.
/// - Work is queued on `stream`; nothing synchronises the host. A bad launch
///   configuration throws tessera::cuda_error at the call; a fault inside
///   the kernel surfaces at the next synchronisation.
/// - Sizes are checked on the host first (config_error naming the value).
/// - Arithmetic is in float32 (the accumulation type of float, bf16 and fp16), by
///   the same TESSERA_HOST_DEVICE functions as the host kernels
///   (kernels/detail/), so results match the host to float rounding.
/// - Gradient contract (llm.c): parameter gradients accumulate (`+=`),
///   activation gradients are written (`=`).
/// - Deterministic: no float atomics; each reduction's order depends on the
///   sizes only (kernels/cuda/launch.hpp), so a run repeats bit for bit.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tessera/core/numeric.hpp"
#include "tessera/kernels/cuda/linkage.hpp"
#include "tessera/kernels/detail/adafactor.hpp"
#include "tessera/kernels/detail/adamw.hpp"
#include "tessera/kernels/detail/lion.hpp"
#include "tessera/kernels/detail/muon.hpp"
#include "tessera/kernels/detail/rope.hpp"
#include "tessera/kernels/detail/sgd.hpp"
#include "tessera/kernels/detail/weight_init.hpp"

namespace tessera::kernels::cuda {

// ---- RMSNorm (kernels/cuda/rmsnorm.cuh) ------------------------------------------------------

/// RMSNorm forward, as the host kernels::rmsnorm_forward:
/// rstd[n] = 1 / sqrt(mean_h(inp[n,h]^2) + eps), out[n,h] = weight[h] * inp[n,h] * rstd[n].
/// - `d_inp`, `d_out` (N,H) and `d_weight` (H) of T in {float, bf16, fp16};
///   `d_rstd` (N) float32, saved for the backward. `d_out` may alias `d_inp`.
/// - One block of 256 threads per row, CUB block reduction; 16-byte loads
///   when H and every pointer allow it.
/// - Throws config_error for N < 0, H < 1 or eps < 0.
/// Source: Zhang and Sennrich, "Root Mean Square Layer Normalization", 2019.
template <class T>
void rmsnorm_forward(T* d_out, float* d_rstd, const T* d_inp, const T* d_weight, std::int64_t N,
                     std::int64_t H, double eps, cudaStream_t stream);

/// RMSNorm backward, as the host kernels::rmsnorm_backward (xhat = inp * rstd):
/// dinp[n,:] = rstd[n] * (weight * dout - xhat * mean_h(weight * dout * xhat))
/// (written, or added when `accumulate_dinp`), dweight[h] += sum_n dout[n,h] xhat[n,h].
/// - `d_inp` (N,H), `d_weight` (H) of T in {float, bf16, fp16}; `d_dout`, `d_dinp`
///   (N,H) of G in {float, bf16, fp16} (G = float when T = float); `d_dweight` (H)
///   and `d_rstd` (N) float32.
/// - `d_scratch`: at least rmsnorm_backward_scratch_bytes(N, H) bytes
///   (launch.hpp): per-chunk dweight partial sums, added in chunk order, so
///   dweight is deterministic. `d_dinp` must not alias `d_dout` or `d_inp`.
/// - Throws config_error for bad sizes or a scratch buffer too small.
template <class T, class G>
void rmsnorm_backward(G* d_dinp, float* d_dweight, const G* d_dout, const T* d_inp,
                      const T* d_weight, const float* d_rstd, std::int64_t N, std::int64_t H,
                      void* d_scratch, std::size_t scratch_bytes, cudaStream_t stream,
                      bool accumulate_dinp = false);

// ---- SwiGLU (kernels/cuda/swiglu.cuh) --------------------------------------------------------

/// SwiGLU forward, as kernels::swiglu_forward: out = silu(gate) * up.
/// n elements of T in {float, bf16, fp16}; `d_out` may alias `d_gate` or `d_up`.
/// Throws config_error for n < 0. Source: Shazeer 2020, eq. 6.
template <class T>
void swiglu_forward(T* d_out, const T* d_gate, const T* d_up, std::int64_t n, cudaStream_t stream);

/// SwiGLU backward, as kernels::swiglu_backward: dgate = dout * up * silu'(gate),
/// dup = dout * silu(gate), both written. `d_gate`, `d_up` of T, `d_dout`,
/// `d_dgate`, `d_dup` of G in {float, bf16, fp16} (G = float when T = float); the
/// outputs may alias `d_dout` but not each other. Throws config_error for n < 0.
template <class T, class G>
void swiglu_backward(G* d_dgate, G* d_dup, const G* d_dout, const T* d_gate, const T* d_up,
                     std::int64_t n, cudaStream_t stream);

// ---- embedding (kernels/cuda/embedding.cuh) --------------------------------------------------

/// Embedding forward, as kernels::embedding_forward: out[n,:] = wte[tokens[n],:].
/// - `d_tokens` (N) int32, `d_wte` (V,H), `d_out` (N,H) of T in {float, bf16, fp16}.
/// - Tokens are not validated on the device (that would need a host sync):
///   the caller guarantees 0 <= tokens[n] < V (the data loader checks); a row
///   whose token is out of range is written as zeros, never read out of bounds.
/// - Throws config_error for N < 0, V < 1 or H < 0.
template <class T>
void embedding_forward(T* d_out, const std::int32_t* d_tokens, const T* d_wte, std::int64_t N,
                       std::int64_t V, std::int64_t H, cudaStream_t stream);

/// Embedding backward, as kernels::embedding_backward:
/// dwte[tokens[n], :] += dout[n, :] for n = 0..N-1, in that order.
/// - `d_dout` (N,H) of G in {float, bf16, fp16}, `d_dwte` (V,H) float32 (accumulates).
/// - Deterministic without atomics: each block owns 64 vocabulary rows and a
///   column block of dwte, and adds the matching dout rows in increasing n, so
///   the result is bit-for-bit the host's. Out-of-range tokens are ignored.
/// - Throws config_error for N < 0, V < 1 or H < 0.
template <class G>
void embedding_backward(float* d_dwte, const G* d_dout, const std::int32_t* d_tokens,
                        std::int64_t N, std::int64_t V, std::int64_t H, cudaStream_t stream);

/// The vocabulary-parallel embedding's row indices, as
/// kernels::embedding_local_ids: d_out[n] = d_ids[n] - v_begin where
/// 0 <= d_ids[n] - v_begin < Vl, else ignore_index. `d_out` may alias
/// `d_ids`. Ids are not validated on the device (the loader checks them):
/// an id outside [0, V) is not held by any rank and embeds to zeros.
/// Throws config_error for N < 0, Vl < 1 or v_begin < 0.
TESSERA_CUDA_ENTRY void embedding_local_ids(std::int32_t* d_out, const std::int32_t* d_ids,
                                            std::int64_t N, std::int64_t v_begin, std::int64_t Vl,
                                            std::int32_t ignore_index, cudaStream_t stream);

// ---- casts (kernels/cuda/elementwise.cuh) ----------------------------------------------------

/// out[i] = To(in[i]) for i < n, rounding to nearest even for bf16 and fp16 (the
/// same bits as the host kernels::cast). Instantiated for float <-> bf16, fp16.
/// Throws config_error for n < 0.
template <class To, class From>
void cast(To* d_out, const From* d_in, std::int64_t n, cudaStream_t stream);

// ---- residual add and the inf/NaN check (kernels/cuda/elementwise.cuh) -----------------------

/// out[i] = a[i] + b[i] for i < n, added in float32 and rounded once to T, as
/// the host kernels::residual_add (the same bits). T in {float, bf16, fp16}.
/// `d_out` may alias `d_a` or `d_b` (element for element, not shifted).
/// 16-byte accesses when all three pointers are 16-byte aligned.
/// Throws config_error for n < 0.
template <class T>
void residual_add(T* d_out, const T* d_a, const T* d_b, std::int64_t n, cudaStream_t stream);

/// The loss scaler's inf/NaN check: sets `*d_flag` (one int32 on the device)
/// to 1 if any of g[0, n) is inf or NaN (tested on the bits); never clears
/// it, so the caller zeroes it once and checks several buffers into it.
/// G in {float, bf16, fp16}. Each block that saw one sets the flag with an integer
/// atomic OR (no float atomics; the result does not depend on the order).
/// Throws config_error for n < 0, or a null `d_flag` with n > 0.
template <class G>
void count_nonfinite(std::int32_t* d_flag, const G* d_g, std::int64_t n, cudaStream_t stream);

// The fused LM head and cross-entropy is declared in kernels/cuda/cross_entropy.hpp
// (it takes a cublaslt_context from kernels/cuda/gemm.cuh).

// ---- initial weights (kernels/cuda/weight_init.cuh) -----------------------------------------

/// kernels::weight_init (kernels/weight_init.hpp) on the device: flat
/// elements [lo, hi) of a parameter buffer into d_out[0, hi - lo), each
/// from its index alone, by one thrust::tabulate per tensor on `stream`
/// (thrust::cuda::par_nosync: nothing synchronises the host).
/// - `h_tensors`: `num_tensors` tensors in host memory, sorted by offset,
///   disjoint; read during the call only (each launch copies its tensor).
/// - Param in {float, bf16, fp16}. Values: the host's, except where the device's
///   log and cos round differently (kernels/weight_init.hpp states how often).
/// - Throws config_error for a bad range or table (or null pointers), and
///   cuda_error when Thrust reports a launch failure.
template <class Param>
void weight_init(Param* d_out, const weight_init_tensor* h_tensors, std::int64_t num_tensors,
                 std::int64_t lo, std::int64_t hi, cudaStream_t stream);

// ---- global gradient norm (kernels/cuda/grad_norm.cuh) ---------------------------------------

/// Sum of squares of g[0, n) in float64: `*d_out` = sum (or `*d_out` += sum
/// when `accumulate`, to cover several flat buffers in a fixed order).
/// - `d_g` of G in {float, bf16, fp16}; `d_out` one double on the device.
/// - `d_scratch`: at least grad_sum_squares_scratch_bytes(n) bytes.
/// - Deterministic: the partition into at most 1024 partial sums and their
///   tree depend only on n. Agrees with the host optim::grad_sum_squares to
///   float64 rounding (1e-12 relative), not bit for bit (another order).
/// - Throws config_error for n < 0 or a scratch buffer too small.
template <class G>
void grad_sum_squares(double* d_out, const G* d_g, std::int64_t n, void* d_scratch,
                      std::size_t scratch_bytes, cudaStream_t stream, bool accumulate = false);

/// `*d_coef` = unscaled_clip_coefficient_of(*d_sum_squares, max_norm,
/// inv_loss_scale) as a float, on the device (no host sync): with norm =
/// sqrt(*d_sum_squares) * inv_loss_scale, min(1, max_norm / (norm + 1e-6))
/// (1 when max_norm <= 0) times inv_loss_scale, NaN when the norm is not
/// finite. F is float (a template only so that one instantiation in
/// cuda/kernels.cu serves all).
template <class F>
void clip_coefficient(F* d_coef, const double* d_sum_squares, double max_norm, cudaStream_t stream,
                      double inv_loss_scale = 1.0);

// ---- AdamW (kernels/cuda/adamw.cuh) ----------------------------------------------------------

/// The segment table of the optimizer kernels (kernels/detail/adamw.hpp):
/// [begin, end) of the optimizer's elements and the decay flag.
using optimizer_segment = kernels::optimizer_segment;

/// One AdamW step over a flat buffer in one launch (multi-tensor), as the
/// host optim::adamw::step: per element kernels::detail::adamw_update on the
/// float32 master weight (or the float parameter itself), then the parameter
/// is written back rounded, in the same pass.
/// - `d_params`, `d_grads`, `d_master`, `d_m`, `d_v`: n elements from the
///   optimizer's first element. Param in {float, bf16, fp16}, Grad in {float,
///   bf16, fp16}. When Param is float there is no master copy and `d_master` must
///   be nullptr; otherwise it is required.
/// - `d_segments` (device, `num_segments`, sorted and disjoint, within
///   [0, n)): only their elements are updated, with their decay flag.
/// - `step`: the step's hyper-parameters with bias corrections (as the host
///   builds them). If `d_grad_scale` is not null, the float it points to
///   (e.g. clip_coefficient's output) multiplies step.grad_scale on the
///   device, so clipping needs no host sync. A non-finite *d_grad_scale
///   (the gradient norm overflowed) makes the kernel return without writing
///   anything: the step is skipped, as the host trainer skips it.
/// - Throws config_error for n < 0, num_segments < 0, or a master pointer
///   that does not match Param.
/// Source: Loshchilov & Hutter, ICLR 2019, Algorithm 2 (torch.optim.AdamW form).
template <class Param, class Grad>
void adamw_step(Param* d_params, float* d_master, float* d_m, float* d_v, const Grad* d_grads,
                std::int64_t n, const optimizer_segment* d_segments, int num_segments,
                const kernels::detail::adamw_step_params<float>& step, const float* d_grad_scale,
                cudaStream_t stream);

/// One SGD-with-momentum step over a flat buffer in one launch, as the
/// host kernels::sgd_step: per element kernels::detail::sgd_update on the
/// float32 master weight (or the float parameter itself), the parameter
/// written back rounded in the same pass. `d_buf` is the momentum buffer;
/// the rest as adamw_step (segments, the clip coefficient's skip rule,
/// throws). Source: torch.optim.SGD (dampening 0).
template <class Param, class Grad>
void sgd_step(Param* d_params, float* d_master, float* d_buf, const Grad* d_grads, std::int64_t n,
              const optimizer_segment* d_segments, int num_segments,
              const kernels::detail::sgd_step_params<float>& step, const float* d_grad_scale,
              cudaStream_t stream);

// ---- Lion (kernels/cuda/lion.cuh) -----------------------------------------------------------

/// One Lion step over a flat buffer in one launch, as the host
/// kernels::lion_step: per element kernels::detail::lion_update on the
/// float32 master weight (or the float parameter itself), the parameter
/// written back rounded in the same pass. `d_m` is the momentum
/// ("exp_avg"); the rest as adamw_step (segments, the clip coefficient's
/// skip rule, throws). Source: Chen et al. 2023, Algorithm 1.
template <class Param, class Grad>
void lion_step(Param* d_params, float* d_master, float* d_m, const Grad* d_grads, std::int64_t n,
               const optimizer_segment* d_segments, int num_segments,
               const kernels::detail::lion_step_params<float>& step, const float* d_grad_scale,
               cudaStream_t stream);

// ---- Muon (kernels/cuda/muon.cuh) ---------------------------------------------------------

/// Muon's tables (kernels/detail/muon.hpp).
using muon_segment = kernels::muon_segment;
using muon_matrix = kernels::muon_matrix;

/// The fused pass of a Muon step in one launch, as the host
/// kernels::muon_momentum_step (kernels/muon.hpp): per element of every
/// segment, a matrix's momentum (d_m), or another tensor's AdamW step (d_m
/// and d_v at v_shift) on the float32 master weight (or the float parameter
/// itself), the parameter written back rounded. Segments, the clip
/// coefficient's skip rule and throws as adamw_step. Source:
/// torch/optim/_muon.py; torch.optim.AdamW.
template <class Param, class Grad>
void muon_momentum_step(Param* d_params, float* d_master, float* d_m, float* d_v,
                        const Grad* d_grads, std::int64_t n, const muon_segment* d_segments,
                        int num_segments, const kernels::detail::muon_step_params<float>& step,
                        const float* d_grad_scale, cudaStream_t stream);
/// What matrix `t` orthogonalises, its shard into d_out (t.local()
/// floats), as the host kernels::muon_nesterov.
template <class Grad>
void muon_nesterov(float* d_out, const float* d_m, const Grad* d_grads, const muon_matrix& t,
                   const kernels::detail::muon_step_params<float>& step, const float* d_grad_scale,
                   cudaStream_t stream);
/// W (t.whole() elements) from the shards gathered in tp rank order, as the
/// host kernels::muon_assemble.
template <class T>
void muon_assemble(T* d_wide, const T* d_gathered, const muon_matrix& t, cudaStream_t stream);
/// d_wide[0, n) /= max(sqrt(*d_ss), eps), the divisor rounded to T: the
/// normalisation before the Newton-Schulz iteration.
template <class T>
void muon_normalise(T* d_wide, std::int64_t n, const double* d_ss, double eps, cudaStream_t stream);
/// The update of matrix `t`'s shard by the orthogonalised W, as the host
/// kernels::muon_apply.
template <class Param>
void muon_apply(Param* d_params, float* d_master, const float* d_wide, const muon_matrix& t,
                float decay_factor, float adjusted_lr, const float* d_grad_scale,
                cudaStream_t stream);

// ---- Adafactor (kernels/cuda/adafactor.cuh) -------------------------------------------------

/// The tensor table, sizes and buffers of an Adafactor step (kernels/detail/adafactor.hpp).
using adafactor_tensor = kernels::adafactor_tensor;
using adafactor_sizes = kernels::adafactor_sizes;
template <class M>
using adafactor_buffers = kernels::adafactor_buffers<M>;

/// One Adafactor step over a flat buffer, or one phase of it, as the host
/// kernels::adafactor_step (kernels/adafactor.hpp): ten launches in three
/// phases, each over every tensor of the table: the sums areas (rows,
/// columns, p^2), the statistics, each tensor's row mean and lr, its sum of
/// u^2, its clip divisor, the update.
/// - `d_params`, `d_master`, `d_grads`: as adamw_step's, at each tensor's
///   shifts. Param in {float, bf16, fp16}, Grad in {float, bf16, fp16}.
/// - `d_tensors` (device, sizes.tensors entries): tensors, shards or pieces
///   of them, sorted; `buf`: device statistics, first moment (null unless
///   step.first_moment), 3 floats a tensor, one double a step row and the
///   sums areas (doubles).
/// - `phase`: all, or sums, statistics, update in order (the areas summed
///   over ranks between them: adafactor_sum_ranks).
/// - A non-finite *d_grad_scale makes every launch return before writing.
/// - Sums are float64 in fixed orders (not the host's: equal to float
///   rounding); deterministic. Throws config_error as
///   kernels::detail::check_adafactor_step.
/// Source: Shazeer & Stern 2018, Algorithms 4 and 5 (transformers' Adafactor).
template <class Param, class Grad>
void adafactor_step(Param* d_params, float* d_master, const Grad* d_grads,
                    const adafactor_tensor* d_tensors, const adafactor_sizes& sizes,
                    const adafactor_buffers<float>& buf,
                    const kernels::detail::adafactor_step_params<float>& step,
                    const float* d_grad_scale, kernels::adafactor_phase phase, cudaStream_t stream);

/// out[j] = sum over r < ranks of gathered[r stride + j], in rank order
/// (the ranks' all-gathered Adafactor sums areas), j < n; device memory,
/// `out` not overlapping `gathered`. T = double. Throws config_error for
/// ranks < 1, n < 0 or stride < n.
template <class T>
void adafactor_sum_ranks(T* d_out, const T* d_gathered, int ranks, std::int64_t n,
                         std::int64_t stride, cudaStream_t stream);

// ---- RoPE (kernels/cuda/rope.cuh) ------------------------------------------------------------

/// RoPE forward in place, as the host kernels::rope_forward (rotate-half
/// pairing): for each (b, t, h), pair i of x[b,t,h,:], (x[i], x[i + hd/2]),
/// becomes (x1 cos - x2 sin, x2 cos + x1 sin), cos = cos[p, i], sin = sin[p, i]
/// at token t's position p.
/// - `d_x` (B, T, nh, hd) of T in {float, bf16, fp16}, overwritten; arithmetic in
///   float32 (kernels::detail::rope_rotate), a 16-bit result rounded once.
/// - `d_cos`, `d_sin`: (rows, hd/2) float32 tables from the host
///   kernels::rope_table, copied to the device, a row for every position.
/// - `positions` (kernels::rope_positions, detail/rope.hpp), by value: t by
///   default; from a `doc_start` (B, T) int32 device pointer, t's position in
///   its packed document, t - doc_start[b T + t] (kernels::attention_mask);
///   from rope_positions::of(shard, d_doc_start) on a context-parallel rank
///   (T = shard.tokens()), t's global position cp_shard::position(t), less
///   its document's global start. The tables then cover the whole sequence.
/// - 16-byte accesses when hd/2 is a multiple of 16 / sizeof(T) and `d_x` is
///   aligned; launch configuration rope_config (launch.hpp).
/// - Throws config_error for a negative size, hd odd or <= 0, or positions
///   with split outside [0, T] or a negative offset.
/// Source: Su et al., "RoFormer", 2021, eq. 34, in the rotate-half pairing of Llama.
template <class T>
void rope_forward(T* d_x, const float* d_cos, const float* d_sin, std::int64_t B, std::int64_t T_,
                  std::int64_t nh, std::int64_t hd, cudaStream_t stream,
                  rope_positions positions = {});

/// RoPE backward in place, as the host kernels::rope_backward: `d_dx` holds
/// dL/dy on entry and dL/dx on return (the transpose rotation
/// dx1 = dy1 cos + dy2 sin, dx2 = dy2 cos - dy1 sin, rope_rotate_transpose).
/// G in {float, bf16, fp16}, arithmetic in float32, a 16-bit result rounded once.
/// Same tables, positions, layout and throws as rope_forward.
template <class G>
void rope_backward(G* d_dx, const float* d_cos, const float* d_sin, std::int64_t B, std::int64_t T_,
                   std::int64_t nh, std::int64_t hd, cudaStream_t stream,
                   rope_positions positions = {});

// ---- FP8 scaled casts (kernels/cuda/fp8.cuh) -------------------------------------------------

/// *d_amax = fp8_amax_max(*d_amax, max |x[i]| over [0, n)), as the host
/// kernels::fp8_amax_accumulate: the tensor's amax folded into a running one.
/// - `d_x` (n) of T in {float, bf16, fp16}; `d_amax` one float on the device.
/// - NaN if any x[i] (or *d_amax) is NaN, +inf if any is infinite; exact, so
///   the same bits as the host in any order. n = 0 launches nothing.
/// - `d_scratch`: at least fp8_amax_scratch_bytes(n) bytes (the partial maxima).
/// - Throws config_error for n < 0, a null d_amax or a scratch buffer too small.
/// Source: Micikevicius et al. 2022, "FP8 Formats for Deep Learning", section 4.
template <class T>
void fp8_amax_accumulate(float* d_amax, const T* d_x, std::int64_t n, void* d_scratch,
                         std::size_t scratch_bytes, cudaStream_t stream);

/// *d_scale = fp8_scale_of(*d_amax, fp8_max, margin, *d_scale) on the device
/// (core/fp8_scale.hpp; one thread, no host sync): fp8_max / amax / 2^margin,
/// or the scale as it was where the amax is 0 or not finite. How current
/// scaling sets the scale of the cast that follows from the tensor's amax.
/// Throws config_error for a null pointer, fp8_max not finite > 0 or margin
/// outside [0, 64]. Source: Transformer Engine's _default_sf_compute.
TESSERA_CUDA_ENTRY void fp8_update_scale(float* d_scale, const float* d_amax, float fp8_max,
                                         int margin, cudaStream_t stream);

/// The scaled cast, as the host kernels::fp8_quantize (the same bytes):
/// q[i] = F8(float(x[i]) * *d_scale), rounded to nearest even, saturating
/// to +-F8::max_finite for a finite x[i]; a non-finite x[i] is cast as it
/// is: NaN stays NaN with its sign, +-inf becomes E5M2's +-inf or E4M3's
/// NaN (kernels::detail::fp8_scaled_cast). When `d_inv_scale` is not null,
/// *d_inv_scale = 1.0f / *d_scale, written once (cuBLASLt's FP8 GEMM reads
/// it through its A/B scale pointer).
/// - `d_x` (n) of T in {float, bf16, fp16}, `d_q` (n) of F8 in {fp8_e4m3,
///   fp8_e5m2}; `d_scale`, `d_inv_scale` one float each. d_q must not alias
///   d_x; d_inv_scale must not alias d_scale.
/// - The scale is read on the device and not checked (that would need a host
///   sync): a scale s that is not finite > 0 casts all the same, a finite x
///   to F8(x * s) saturated: s = +-0 gives +-0, a negative s flips the
///   signs, NaN gives NaN, +inf gives +-max for a nonzero x and NaN for a
///   zero; a non-finite x is cast as it is; *d_inv_scale = 1 / s (+-inf for
///   +-0). The host overloads refuse such a scale (config_error).
/// - 16-byte loads when d_x and d_q are aligned for them.
/// - Throws config_error for n < 0 or a null d_scale.
/// Sources: Micikevicius et al. 2022; the OCP 8-bit floating point
/// specification (saturating conversion).
template <class F8, class T>
void fp8_quantize(F8* d_q, float* d_inv_scale, const T* d_x, std::int64_t n, const float* d_scale,
                  cudaStream_t stream);

/// The cast with a transpose (Transformer Engine's cast_transpose), as the
/// host kernels::fp8_quantize_transposed: `d_x` (rows, cols) row-major of T,
/// `d_qt` (cols, rows) row-major of F8, qt[j * rows + i] = the scaled cast of
/// x[i * cols + j]. cuBLASLt's FP8 GEMMs take only the TN layout, so the
/// backward GEMMs need these transposed copies. Tiles of 32 x 32 through
/// shared memory, coalesced on both sides. The scale and `d_inv_scale` as
/// fp8_quantize (not checked). Throws config_error for rows or cols < 0, rows * cols past 64
/// bits, or a null d_scale.
template <class F8, class T>
void fp8_quantize_transposed(F8* d_qt, float* d_inv_scale, const T* d_x, std::int64_t rows,
                             std::int64_t cols, const float* d_scale, cudaStream_t stream);

// ---- the instantiations cuda/kernels.cu provides ---------------------------------------------

// clang-format off
#define TESSERA_CUDA_KERNEL_INSTANTIATIONS(X)                                                       \
  X void rmsnorm_forward<float>(float*, float*, const float*, const float*, std::int64_t,          \
                                std::int64_t, double, cudaStream_t);                                \
  X void rmsnorm_forward<bf16>(bf16*, float*, const bf16*, const bf16*, std::int64_t, std::int64_t, \
                               double, cudaStream_t);                                               \
  X void rmsnorm_backward<float, float>(float*, float*, const float*, const float*, const float*,  \
                                        const float*, std::int64_t, std::int64_t, void*,            \
                                        std::size_t, cudaStream_t, bool);                           \
  X void rmsnorm_backward<bf16, float>(float*, float*, const float*, const bf16*, const bf16*,     \
                                       const float*, std::int64_t, std::int64_t, void*,             \
                                       std::size_t, cudaStream_t, bool);                            \
  X void rmsnorm_backward<bf16, bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*,        \
                                      const float*, std::int64_t, std::int64_t, void*,              \
                                      std::size_t, cudaStream_t, bool);                             \
  X void swiglu_forward<float>(float*, const float*, const float*, std::int64_t, cudaStream_t);   \
  X void swiglu_forward<bf16>(bf16*, const bf16*, const bf16*, std::int64_t, cudaStream_t);        \
  X void swiglu_backward<float, float>(float*, float*, const float*, const float*, const float*,   \
                                       std::int64_t, cudaStream_t);                                 \
  X void swiglu_backward<bf16, float>(float*, float*, const float*, const bf16*, const bf16*,      \
                                      std::int64_t, cudaStream_t);                                  \
  X void swiglu_backward<bf16, bf16>(bf16*, bf16*, const bf16*, const bf16*, const bf16*,          \
                                     std::int64_t, cudaStream_t);                                   \
  X void embedding_forward<float>(float*, const std::int32_t*, const float*, std::int64_t,        \
                                  std::int64_t, std::int64_t, cudaStream_t);                        \
  X void embedding_forward<bf16>(bf16*, const std::int32_t*, const bf16*, std::int64_t,           \
                                 std::int64_t, std::int64_t, cudaStream_t);                         \
  X void embedding_backward<float>(float*, const float*, const std::int32_t*, std::int64_t,       \
                                   std::int64_t, std::int64_t, cudaStream_t);                       \
  X void embedding_backward<bf16>(float*, const bf16*, const std::int32_t*, std::int64_t,         \
                                  std::int64_t, std::int64_t, cudaStream_t);                        \
  X void cast<bf16, float>(bf16*, const float*, std::int64_t, cudaStream_t);                       \
  X void cast<float, bf16>(float*, const bf16*, std::int64_t, cudaStream_t);                       \
  X void grad_sum_squares<float>(double*, const float*, std::int64_t, void*, std::size_t,         \
                                 cudaStream_t, bool);                                               \
  X void grad_sum_squares<bf16>(double*, const bf16*, std::int64_t, void*, std::size_t,           \
                                cudaStream_t, bool);                                                \
  X void clip_coefficient<float>(float*, const double*, double, cudaStream_t, double);             \
  X void adamw_step<float, float>(float*, float*, float*, float*, const float*, std::int64_t,      \
                                  const optimizer_segment*, int,                                        \
                                  const kernels::detail::adamw_step_params<float>&, const float*,  \
                                  cudaStream_t);                                                    \
  X void adamw_step<bf16, float>(bf16*, float*, float*, float*, const float*, std::int64_t,        \
                                 const optimizer_segment*, int,                                         \
                                 const kernels::detail::adamw_step_params<float>&, const float*,   \
                                 cudaStream_t);                                                     \
  X void adamw_step<bf16, bf16>(bf16*, float*, float*, float*, const bf16*, std::int64_t,          \
                                const optimizer_segment*, int,                                          \
                                const kernels::detail::adamw_step_params<float>&, const float*,    \
                                cudaStream_t);                                                    \
  X void sgd_step<float, float>(float*, float*, float*, const float*, std::int64_t,                 \
                                const optimizer_segment*, int,                                          \
                                const kernels::detail::sgd_step_params<float>&, const float*,      \
                                cudaStream_t);                                                      \
  X void sgd_step<bf16, float>(bf16*, float*, float*, const float*, std::int64_t,                   \
                               const optimizer_segment*, int,                                           \
                               const kernels::detail::sgd_step_params<float>&, const float*,       \
                               cudaStream_t);                                                       \
  X void sgd_step<bf16, bf16>(bf16*, float*, float*, const bf16*, std::int64_t,                     \
                              const optimizer_segment*, int,                                            \
                              const kernels::detail::sgd_step_params<float>&, const float*,        \
                              cudaStream_t);                                                        \
  X void lion_step<float, float>(float*, float*, float*, const float*, std::int64_t,                \
                                 const optimizer_segment*, int,                                     \
                                 const kernels::detail::lion_step_params<float>&, const float*,    \
                                 cudaStream_t);                                                     \
  X void lion_step<bf16, float>(bf16*, float*, float*, const float*, std::int64_t,                  \
                                const optimizer_segment*, int,                                      \
                                const kernels::detail::lion_step_params<float>&, const float*,     \
                                cudaStream_t);                                                      \
  X void lion_step<bf16, bf16>(bf16*, float*, float*, const bf16*, std::int64_t,                    \
                               const optimizer_segment*, int,                                       \
                               const kernels::detail::lion_step_params<float>&, const float*,      \
                               cudaStream_t);                                                       \
  X void muon_momentum_step<float, float>(float*, float*, float*, float*, const float*, std::int64_t,     \
                                      const muon_segment*, int,                                    \
                                      const kernels::detail::muon_step_params<float>&,             \
                                      const float*, cudaStream_t);                                 \
  X void muon_momentum_step<bf16, float>(bf16*, float*, float*, float*, const float*, std::int64_t,     \
                                      const muon_segment*, int,                                    \
                                      const kernels::detail::muon_step_params<float>&,             \
                                      const float*, cudaStream_t);                                 \
  X void muon_momentum_step<bf16, bf16>(bf16*, float*, float*, float*, const bf16*, std::int64_t,     \
                                      const muon_segment*, int,                                    \
                                      const kernels::detail::muon_step_params<float>&,             \
                                      const float*, cudaStream_t);                                 \
  X void muon_nesterov<float>(float*, const float*, const float*, const muon_matrix&,              \
                           const kernels::detail::muon_step_params<float>&, const float*,          \
                           cudaStream_t);                                                           \
  X void muon_nesterov<bf16>(float*, const float*, const bf16*, const muon_matrix&,              \
                           const kernels::detail::muon_step_params<float>&, const float*,          \
                           cudaStream_t);                                                           \
  X void muon_apply<float>(float*, float*, const float*, const muon_matrix&, float, float,            \
                        const float*, cudaStream_t);                                                \
  X void muon_apply<bf16>(bf16*, float*, const float*, const muon_matrix&, float, float,            \
                        const float*, cudaStream_t);                                                \
  X void muon_assemble<float>(float*, const float*, const muon_matrix&, cudaStream_t);            \
  X void muon_normalise<float>(float*, std::int64_t, const double*, double, cudaStream_t);         \
  X void adafactor_step<float, float>(float*, float*, const float*, const adafactor_tensor*,     \
                                     const adafactor_sizes&, const adafactor_buffers<float>&,       \
                                     const kernels::detail::adafactor_step_params<float>&,          \
                                     const float*, kernels::adafactor_phase, cudaStream_t);                                   \
  X void adafactor_sum_ranks<double>(double*, const double*, int, std::int64_t, std::int64_t,   \
                                     cudaStream_t);                                                \
  X void adafactor_step<bf16, float>(bf16*, float*, const float*, const adafactor_tensor*,       \
                                    const adafactor_sizes&, const adafactor_buffers<float>&,        \
                                    const kernels::detail::adafactor_step_params<float>&,           \
                                    const float*, kernels::adafactor_phase, cudaStream_t);                                    \
  X void adafactor_step<bf16, bf16>(bf16*, float*, const bf16*, const adafactor_tensor*,         \
                                   const adafactor_sizes&, const adafactor_buffers<float>&,         \
                                   const kernels::detail::adafactor_step_params<float>&,            \
                                   const float*, kernels::adafactor_phase, cudaStream_t);                                     \
  X void rope_forward<float>(float*, const float*, const float*, std::int64_t, std::int64_t,      \
                             std::int64_t, std::int64_t, cudaStream_t, rope_positions);            \
  X void rope_forward<bf16>(bf16*, const float*, const float*, std::int64_t, std::int64_t,        \
                            std::int64_t, std::int64_t, cudaStream_t, rope_positions);             \
  X void rope_backward<float>(float*, const float*, const float*, std::int64_t, std::int64_t,     \
                              std::int64_t, std::int64_t, cudaStream_t, rope_positions);           \
  X void rope_backward<bf16>(bf16*, const float*, const float*, std::int64_t, std::int64_t,       \
                             std::int64_t, std::int64_t, cudaStream_t, rope_positions);            \
  TESSERA_CUDA_KERNEL_FP16_INSTANTIATIONS(X)
// clang-format on

// The fp16 storage (precision::fp16_mixed) twins of the bf16 entries above:
// the same kernels, instantiated for tessera::fp16.
// clang-format off
#define TESSERA_CUDA_KERNEL_FP16_INSTANTIATIONS(X)                                                  \
  X void rmsnorm_forward<fp16>(fp16*, float*, const fp16*, const fp16*, std::int64_t, std::int64_t, \
                               double, cudaStream_t);                                               \
  X void rmsnorm_backward<fp16, float>(float*, float*, const float*, const fp16*, const fp16*,     \
                                       const float*, std::int64_t, std::int64_t, void*,             \
                                       std::size_t, cudaStream_t, bool);                            \
  X void rmsnorm_backward<fp16, fp16>(fp16*, float*, const fp16*, const fp16*, const fp16*,        \
                                      const float*, std::int64_t, std::int64_t, void*,              \
                                      std::size_t, cudaStream_t, bool);                             \
  X void swiglu_forward<fp16>(fp16*, const fp16*, const fp16*, std::int64_t, cudaStream_t);        \
  X void swiglu_backward<fp16, float>(float*, float*, const float*, const fp16*, const fp16*,      \
                                      std::int64_t, cudaStream_t);                                  \
  X void swiglu_backward<fp16, fp16>(fp16*, fp16*, const fp16*, const fp16*, const fp16*,          \
                                     std::int64_t, cudaStream_t);                                   \
  X void embedding_forward<fp16>(fp16*, const std::int32_t*, const fp16*, std::int64_t,           \
                                 std::int64_t, std::int64_t, cudaStream_t);                         \
  X void embedding_backward<fp16>(float*, const fp16*, const std::int32_t*, std::int64_t,         \
                                  std::int64_t, std::int64_t, cudaStream_t);                        \
  X void cast<fp16, float>(fp16*, const float*, std::int64_t, cudaStream_t);                       \
  X void cast<float, fp16>(float*, const fp16*, std::int64_t, cudaStream_t);                       \
  X void grad_sum_squares<fp16>(double*, const fp16*, std::int64_t, void*, std::size_t,           \
                                cudaStream_t, bool);                                                \
  X void adamw_step<fp16, float>(fp16*, float*, float*, float*, const float*, std::int64_t,        \
                                 const optimizer_segment*, int,                                     \
                                 const kernels::detail::adamw_step_params<float>&, const float*,   \
                                 cudaStream_t);                                                     \
  X void adamw_step<fp16, fp16>(fp16*, float*, float*, float*, const fp16*, std::int64_t,          \
                                const optimizer_segment*, int,                                      \
                                const kernels::detail::adamw_step_params<float>&, const float*,    \
                                cudaStream_t);                                                      \
  X void sgd_step<fp16, float>(fp16*, float*, float*, const float*, std::int64_t,                   \
                               const optimizer_segment*, int,                                       \
                               const kernels::detail::sgd_step_params<float>&, const float*,       \
                               cudaStream_t);                                                       \
  X void sgd_step<fp16, fp16>(fp16*, float*, float*, const fp16*, std::int64_t,                     \
                              const optimizer_segment*, int,                                        \
                              const kernels::detail::sgd_step_params<float>&, const float*,        \
                              cudaStream_t);                                                        \
  X void lion_step<fp16, float>(fp16*, float*, float*, const float*, std::int64_t,                  \
                                const optimizer_segment*, int,                                      \
                                const kernels::detail::lion_step_params<float>&, const float*,     \
                                cudaStream_t);                                                      \
  X void lion_step<fp16, fp16>(fp16*, float*, float*, const fp16*, std::int64_t,                    \
                               const optimizer_segment*, int,                                       \
                               const kernels::detail::lion_step_params<float>&, const float*,      \
                               cudaStream_t);                                                       \
  X void muon_momentum_step<fp16, float>(fp16*, float*, float*, float*, const float*, std::int64_t,     \
                                      const muon_segment*, int,                                    \
                                      const kernels::detail::muon_step_params<float>&,             \
                                      const float*, cudaStream_t);                                 \
  X void muon_momentum_step<fp16, fp16>(fp16*, float*, float*, float*, const fp16*, std::int64_t,     \
                                      const muon_segment*, int,                                    \
                                      const kernels::detail::muon_step_params<float>&,             \
                                      const float*, cudaStream_t);                                 \
  X void muon_nesterov<fp16>(float*, const float*, const fp16*, const muon_matrix&,              \
                           const kernels::detail::muon_step_params<float>&, const float*,          \
                           cudaStream_t);                                                           \
  X void muon_apply<fp16>(fp16*, float*, const float*, const muon_matrix&, float, float,            \
                        const float*, cudaStream_t);                                                \
  X void adafactor_step<fp16, float>(fp16*, float*, const float*, const adafactor_tensor*,       \
                                    const adafactor_sizes&, const adafactor_buffers<float>&,        \
                                    const kernels::detail::adafactor_step_params<float>&,           \
                                    const float*, kernels::adafactor_phase, cudaStream_t);                                    \
  X void adafactor_step<fp16, fp16>(fp16*, float*, const fp16*, const adafactor_tensor*,         \
                                   const adafactor_sizes&, const adafactor_buffers<float>&,         \
                                   const kernels::detail::adafactor_step_params<float>&,            \
                                   const float*, kernels::adafactor_phase, cudaStream_t);                                     \
  X void rope_forward<fp16>(fp16*, const float*, const float*, std::int64_t, std::int64_t,        \
                            std::int64_t, std::int64_t, cudaStream_t, rope_positions);             \
  X void rope_backward<fp16>(fp16*, const float*, const float*, std::int64_t, std::int64_t,       \
                             std::int64_t, std::int64_t, cudaStream_t, rope_positions);
// clang-format on

// The instantiations cuda/kernels_cross_entropy.cu provides (a TU of its own:
// cuda/kernels.cu does not compile them).
// clang-format off
#define TESSERA_CUDA_ELEMENTWISE_MODEL_INSTANTIATIONS(X)                                            \
  X void residual_add<float>(float*, const float*, const float*, std::int64_t, cudaStream_t);     \
  X void residual_add<bf16>(bf16*, const bf16*, const bf16*, std::int64_t, cudaStream_t);         \
  X void count_nonfinite<float>(std::int32_t*, const float*, std::int64_t, cudaStream_t);         \
  X void count_nonfinite<bf16>(std::int32_t*, const bf16*, std::int64_t, cudaStream_t);         \
  X void residual_add<fp16>(fp16*, const fp16*, const fp16*, std::int64_t, cudaStream_t);         \
  X void count_nonfinite<fp16>(std::int32_t*, const fp16*, std::int64_t, cudaStream_t);
// clang-format on

// The instantiations cuda/kernels_weight_init.cu provides (a TU of its own:
// cuda/kernels.cu does not include Thrust).
// clang-format off
#define TESSERA_CUDA_WEIGHT_INIT_INSTANTIATIONS(X)                                                  \
  X void weight_init<float>(float*, const weight_init_tensor*, std::int64_t, std::int64_t,        \
                             std::int64_t, cudaStream_t);                                           \
  X void weight_init<bf16>(bf16*, const weight_init_tensor*, std::int64_t, std::int64_t,          \
                            std::int64_t, cudaStream_t);                                    \
  X void weight_init<fp16>(fp16*, const weight_init_tensor*, std::int64_t, std::int64_t,          \
                            std::int64_t, cudaStream_t);
// clang-format on

// The instantiations cuda/kernels_fp8.cu provides (a TU of its own: the FP8
// casts compile quickly, and a change to them recompiles only that).
// clang-format off
#define TESSERA_CUDA_FP8_INSTANTIATIONS(X)                                                          \
  TESSERA_CUDA_FP8_INPUT_INSTANTIATIONS(X, float)                                                   \
  TESSERA_CUDA_FP8_INPUT_INSTANTIATIONS(X, bf16)                                                    \
  TESSERA_CUDA_FP8_INPUT_INSTANTIATIONS(X, fp16)
#define TESSERA_CUDA_FP8_INPUT_INSTANTIATIONS(X, T)                                                 \
  X void fp8_amax_accumulate<T>(float*, const T*, std::int64_t, void*, std::size_t, cudaStream_t); \
  X void fp8_quantize<fp8_e4m3, T>(fp8_e4m3*, float*, const T*, std::int64_t, const float*,        \
                                   cudaStream_t);                                                   \
  X void fp8_quantize<fp8_e5m2, T>(fp8_e5m2*, float*, const T*, std::int64_t, const float*,        \
                                   cudaStream_t);                                                   \
  X void fp8_quantize_transposed<fp8_e4m3, T>(fp8_e4m3*, float*, const T*, std::int64_t,          \
                                              std::int64_t, const float*, cudaStream_t);            \
  X void fp8_quantize_transposed<fp8_e5m2, T>(fp8_e5m2*, float*, const T*, std::int64_t,          \
                                              std::int64_t, const float*, cudaStream_t);
// clang-format on

// Precompiled (a host compiler, or TESSERA_CUDA_PRECOMPILED_KERNELS): the
// instantiations above are tessera::cuda_kernels', never this translation
// unit's. Header-only (nvcc): none; the definitions follow.
#if !TESSERA_CUDA_HEADER_ONLY_KERNELS && !defined(TESSERA_CUDA_KERNELS_INSTANTIATING)
TESSERA_CUDA_KERNEL_INSTANTIATIONS(extern template)
TESSERA_CUDA_ELEMENTWISE_MODEL_INSTANTIATIONS(extern template)
TESSERA_CUDA_WEIGHT_INIT_INSTANTIATIONS(extern template)
TESSERA_CUDA_FP8_INSTANTIATIONS(extern template)
#endif

}  // namespace tessera::kernels::cuda

#if TESSERA_CUDA_HEADER_ONLY_KERNELS
#include "tessera/kernels/cuda/adafactor.cuh"
#include "tessera/kernels/cuda/adamw.cuh"
#include "tessera/kernels/cuda/elementwise.cuh"
#include "tessera/kernels/cuda/embedding.cuh"
#include "tessera/kernels/cuda/fp8.cuh"
#include "tessera/kernels/cuda/grad_norm.cuh"
#include "tessera/kernels/cuda/lion.cuh"
#include "tessera/kernels/cuda/muon.cuh"
#include "tessera/kernels/cuda/rmsnorm.cuh"
#include "tessera/kernels/cuda/rope.cuh"
#include "tessera/kernels/cuda/swiglu.cuh"
#include "tessera/kernels/cuda/weight_init.cuh"
#endif
