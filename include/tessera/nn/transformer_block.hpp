#pragma once
/// \file nn/transformer_block.hpp
/// One pre-norm Llama block, forward and backward side by side
/// (Touvron et al. 2023):
///
///   xn1 = rmsnorm(x);  q,k,v = xn1 Wq^T, xn1 Wk^T, xn1 Wv^T;  rope(q, k)
///   a = causal_attention(q, k, v);  x' = x + a Wo^T
///   xn2 = rmsnorm(x');  h = silu(xn2 Wg^T) * (xn2 Wu^T);  y = x' + h Wd^T
///
/// Gradient contract (llm.c): parameter gradients accumulate (+=), the
/// residual-stream gradient is written (=). forward() saves exactly what
/// backward() needs in a `block_record`; backward() frees it as it goes.
///
/// The block reads its parameters from one pointer `p` to the first element
/// of its segment of the flat buffer (nn/segment_hooks.hpp), so the caller
/// decides where they live: inside the flat buffer, or a gathered copy under
/// ZeRO-3. `block_offsets` are relative to that pointer, and the same
/// offsets index the block's gradients from `g`.

#include <cstdint>
#include <string>

#include "tessera/core/tensor.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/rmsnorm.hpp"
#include "tessera/kernels/rope.hpp"
#include "tessera/kernels/swiglu.hpp"
#include "tessera/nn/llama_config.hpp"
#include "tessera/nn/param_layout.hpp"
#include "tessera/precision/policy.hpp"

namespace tessera::nn {

/// Element offsets of one block's tensors, relative to the block's first
/// element in the flat buffer (its segment start).
struct block_offsets {
  std::int64_t attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;

  /// Offsets of block `l` in `layout`, relative to `segment_begin` (the flat
  /// offset of the block's first tensor). Throws tessera::error if a tensor
  /// of the block is missing.
  static block_offsets of(const param_layout& layout, int l, std::int64_t segment_begin) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    auto at = [&](const char* n) { return layout.at(b + n).offset - segment_begin; };
    return {at("attn_norm"), at("attn.wq"),    at("attn.wk"),  at("attn.wv"),   at("attn.wo"),
            at("mlp_norm"),  at("mlp.w_gate"), at("mlp.w_up"), at("mlp.w_down")};
  }
};

/// What one block's forward saves for its backward (N = B*T token rows).
template <precision::policy P>
struct block_record {
  using Param = typename P::param_type;
  using Acc = typename P::accum_type;
  tensor<Param> x_in;   ///< (N, H) block input (residual stream)
  tensor<Acc> rstd1;    ///< (N)
  tensor<Param> xn1;    ///< (N, H)
  tensor<Param> q;      ///< (N, nh*hd) after RoPE
  tensor<Param> k, v;   ///< (N, nkv*hd), k after RoPE
  tensor<Param> att;    ///< (N, nh*hd) attention output
  tensor<Acc> lse;      ///< (B, nh, T)
  tensor<Param> x_mid;  ///< (N, H) after the attention residual
  tensor<Acc> rstd2;    ///< (N)
  tensor<Param> xn2;    ///< (N, H)
  tensor<Param> gate;   ///< (N, F)
  tensor<Param> up;     ///< (N, F)
  tensor<Param> h;      ///< (N, F) silu(gate) * up
};

/// Sizes and shared inputs of one block call.
struct block_dims {
  std::int64_t B, T, H, F, KV, nh, nkv, hd;
  double norm_eps;
  kernels::attention_tiles tiles;
  const float* rope_cos;  ///< (max_seq, hd/2)
  const float* rope_sin;  ///< (max_seq, hd/2)
  memory_resource* mr;
  std::int64_t N() const { return B * T; }

  static block_dims of(const llama_config& c, std::int64_t B, std::int64_t T,
                       kernels::attention_tiles tiles, const float* cos, const float* sin,
                       memory_resource& mr) {
    return {B,          T,     c.dim, c.ffn_dim, c.kv_dim(), c.n_heads, c.n_kv_heads, c.head_dim(),
            c.norm_eps, tiles, cos,   sin,       &mr};
  }
};

/// Forward of one block: consumes `x` (N, H), the block input, into r.x_in
/// and leaves the block output (N, H) in `x`. `p` points at the block's
/// first parameter; `proj` is (N, H) scratch.
template <precision::policy P>
void block_forward(block_record<P>& r, tensor<typename P::param_type>& x,
                   const typename P::param_type* p, const block_offsets& o, const block_dims& d,
                   tensor<typename P::param_type>& proj) {
  using Param = typename P::param_type;
  using Acc = typename P::accum_type;
  const std::int64_t N = d.N(), H = d.H, F = d.F, KV = d.KV;
  memory_resource& mr = *d.mr;
  r.x_in = std::move(x);
  r.rstd1 = tensor<Acc>(shape{N}, mr);
  r.xn1 = tensor<Param>(shape{N, H}, mr);
  kernels::rmsnorm_forward<Param>(r.xn1.data(), r.rstd1.data(), r.x_in.data(), p + o.attn_norm, N,
                                  H, d.norm_eps);
  r.q = tensor<Param>(shape{N, H}, mr);
  r.k = tensor<Param>(shape{N, KV}, mr);
  r.v = tensor<Param>(shape{N, KV}, mr);
  kernels::linear_forward<Param>(r.q.data(), r.xn1.data(), p + o.wq, N, H, H);
  kernels::linear_forward<Param>(r.k.data(), r.xn1.data(), p + o.wk, N, KV, H);
  kernels::linear_forward<Param>(r.v.data(), r.xn1.data(), p + o.wv, N, KV, H);
  kernels::rope_forward<Param>(r.q.data(), d.rope_cos, d.rope_sin, d.B, d.T, d.nh, d.hd);
  kernels::rope_forward<Param>(r.k.data(), d.rope_cos, d.rope_sin, d.B, d.T, d.nkv, d.hd);
  r.att = tensor<Param>(shape{N, H}, mr);
  r.lse = tensor<Acc>(shape{d.B, d.nh, d.T}, mr);
  kernels::attention_forward<Param>(r.att.data(), r.lse.data(), r.q.data(), r.k.data(), r.v.data(),
                                    d.B, d.T, d.nh, d.nkv, d.hd, d.tiles, mr);
  kernels::linear_forward<Param>(proj.data(), r.att.data(), p + o.wo, N, H, H);
  r.x_mid = tensor<Param>(shape{N, H}, mr);
  kernels::residual_add<Param>(r.x_mid.data(), r.x_in.data(), proj.data(), N * H);
  r.rstd2 = tensor<Acc>(shape{N}, mr);
  r.xn2 = tensor<Param>(shape{N, H}, mr);
  kernels::rmsnorm_forward<Param>(r.xn2.data(), r.rstd2.data(), r.x_mid.data(), p + o.mlp_norm, N,
                                  H, d.norm_eps);
  r.gate = tensor<Param>(shape{N, F}, mr);
  r.up = tensor<Param>(shape{N, F}, mr);
  r.h = tensor<Param>(shape{N, F}, mr);
  kernels::linear_forward<Param>(r.gate.data(), r.xn2.data(), p + o.w_gate, N, F, H);
  kernels::linear_forward<Param>(r.up.data(), r.xn2.data(), p + o.w_up, N, F, H);
  kernels::swiglu_forward<Param>(r.h.data(), r.gate.data(), r.up.data(), N * F);
  kernels::linear_forward<Param>(proj.data(), r.h.data(), p + o.w_down, N, H, F);
  x = tensor<Param>(shape{N, H}, mr);
  kernels::residual_add<Param>(x.data(), r.x_mid.data(), proj.data(), N * H);
}

/// Scratch gradients one backward pass reuses across blocks.
template <precision::policy P>
struct block_grad_scratch {
  using Grad = typename P::grad_type;
  tensor<Grad> dxn, datt, dq;   ///< (N, H)
  tensor<Grad> dk, dv;          ///< (N, KV)
  tensor<Grad> dh, dgate, dup;  ///< (N, F)
  explicit block_grad_scratch(const block_dims& d) {
    const std::int64_t N = d.N();
    memory_resource& mr = *d.mr;
    dxn = tensor<Grad>(shape{N, d.H}, mr);
    datt = tensor<Grad>(shape{N, d.H}, mr);
    dq = tensor<Grad>(shape{N, d.H}, mr);
    dk = tensor<Grad>(shape{N, d.KV}, mr);
    dv = tensor<Grad>(shape{N, d.KV}, mr);
    dh = tensor<Grad>(shape{N, d.F}, mr);
    dgate = tensor<Grad>(shape{N, d.F}, mr);
    dup = tensor<Grad>(shape{N, d.F}, mr);
  }
};

/// Backward of one block. dres: (N, H) gradient of the block output on
/// entry, of the block input on return (=). Parameter gradients accumulate
/// (+=) into `g` (the block's first gradient element, same offsets as `p`).
/// Frees the record's tensors as they are consumed.
template <precision::policy P>
void block_backward(block_record<P>& r, tensor<typename P::grad_type>& dres,
                    const typename P::param_type* p, typename P::grad_type* g,
                    const block_offsets& o, const block_dims& d, block_grad_scratch<P>& s) {
  using Param = typename P::param_type;
  using Grad = typename P::grad_type;
  const std::int64_t N = d.N(), H = d.H, F = d.F, KV = d.KV;
  // MLP: y = x_mid + h Wd^T
  kernels::linear_backward_input<Param, Grad>(s.dh.data(), dres.data(), p + o.w_down, N, H, F);
  kernels::linear_backward_weight<Param, Grad>(g + o.w_down, dres.data(), r.h.data(), N, H, F);
  kernels::swiglu_backward<Param, Grad>(s.dgate.data(), s.dup.data(), s.dh.data(), r.gate.data(),
                                        r.up.data(), N * F);
  kernels::linear_backward_input<Param, Grad>(s.dxn.data(), s.dgate.data(), p + o.w_gate, N, F, H);
  kernels::linear_backward_input<Param, Grad>(s.dxn.data(), s.dup.data(), p + o.w_up, N, F, H,
                                              true);
  kernels::linear_backward_weight<Param, Grad>(g + o.w_gate, s.dgate.data(), r.xn2.data(), N, F, H);
  kernels::linear_backward_weight<Param, Grad>(g + o.w_up, s.dup.data(), r.xn2.data(), N, F, H);
  kernels::rmsnorm_backward<Param, Grad>(dres.data(), g + o.mlp_norm, s.dxn.data(), r.x_mid.data(),
                                         p + o.mlp_norm, r.rstd2.data(), N, H, true);
  r.h.release();
  r.gate.release();
  r.up.release();
  r.xn2.release();
  r.x_mid.release();
  r.rstd2.release();
  // Attention: x_mid = x_in + att Wo^T
  kernels::linear_backward_input<Param, Grad>(s.datt.data(), dres.data(), p + o.wo, N, H, H);
  kernels::linear_backward_weight<Param, Grad>(g + o.wo, dres.data(), r.att.data(), N, H, H);
  kernels::attention_backward<Param, Grad>(
      s.dq.data(), s.dk.data(), s.dv.data(), s.datt.data(), r.q.data(), r.k.data(), r.v.data(),
      r.att.data(), r.lse.data(), d.B, d.T, d.nh, d.nkv, d.hd, d.tiles, *d.mr);
  kernels::rope_backward<Grad>(s.dq.data(), d.rope_cos, d.rope_sin, d.B, d.T, d.nh, d.hd);
  kernels::rope_backward<Grad>(s.dk.data(), d.rope_cos, d.rope_sin, d.B, d.T, d.nkv, d.hd);
  kernels::linear_backward_input<Param, Grad>(s.dxn.data(), s.dq.data(), p + o.wq, N, H, H);
  kernels::linear_backward_input<Param, Grad>(s.dxn.data(), s.dk.data(), p + o.wk, N, KV, H, true);
  kernels::linear_backward_input<Param, Grad>(s.dxn.data(), s.dv.data(), p + o.wv, N, KV, H, true);
  kernels::linear_backward_weight<Param, Grad>(g + o.wq, s.dq.data(), r.xn1.data(), N, H, H);
  kernels::linear_backward_weight<Param, Grad>(g + o.wk, s.dk.data(), r.xn1.data(), N, KV, H);
  kernels::linear_backward_weight<Param, Grad>(g + o.wv, s.dv.data(), r.xn1.data(), N, KV, H);
  kernels::rmsnorm_backward<Param, Grad>(dres.data(), g + o.attn_norm, s.dxn.data(), r.x_in.data(),
                                         p + o.attn_norm, r.rstd1.data(), N, H, true);
  r = block_record<P>{};
}

}  // namespace tessera::nn
