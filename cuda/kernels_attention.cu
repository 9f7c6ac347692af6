// The flash attention launchers of kernels/cuda/attention.hpp: argument
// checks (config_error before any launch), then the kernels of
// kernels/cuda/attention.cuh, instantiated here once per supported head
// dimension (32, 64, 128) and architecture (sm_90a, sm_80). Part of
// tessera::cuda_kernels (cuda/CMakeLists.txt globs kernels*.cu, with
// -Xptxas=-v so the build log lists each kernel's registers and spills).
#include <cmath>
#include <initializer_list>
#include <utility>

#include "tessera/kernels/cuda/attention.cuh"
#include "tessera/kernels/cuda/attention.hpp"

namespace tessera::kernels::cuda {

namespace {

const std::uint16_t* bits(const bf16* p) {
  return reinterpret_cast<const std::uint16_t*>(p);
}
std::uint16_t* bits(bf16* p) {
  return reinterpret_cast<std::uint16_t*>(p);
}

void check_bf16_pointers(const char* fn,
                         std::initializer_list<std::pair<const char*, const void*>> ps) {
  for (const auto& [name, p] : ps) attention_check_aligned(fn, name, p, 16);
}

}  // namespace

void flash_attention_forward(bf16* d_out, float* d_lse, const bf16* d_q, const bf16* d_k,
                             const bf16* d_v, std::int64_t B, std::int64_t S, std::int64_t nh,
                             std::int64_t nkv, std::int64_t hd, cudaStream_t stream) {
  constexpr const char* fn = "flash_attention_forward";
  attention_check_args(fn, B, S, nh, nkv, hd);
  check_bf16_pointers(fn, {{"d_out", d_out}, {"d_q", d_q}, {"d_k", d_k}, {"d_v", d_v}});
  attention_check_aligned(fn, "d_lse", d_lse, sizeof(float));
  const launch_config c = attention_forward_config(B, S, nh, nkv, hd);
  detail::attention_forward_params p{};
  p.out = bits(d_out);
  p.lse = d_lse;
  p.q = bits(d_q);
  p.k = bits(d_k);
  p.v = bits(d_v);
  p.S = S;
  p.nh = static_cast<int>(nh);
  p.nkv = static_cast<int>(nkv);
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  switch (hd) {
    case 32:
      detail::attention_forward_launch<32>(p, c, stream);
      break;
    case 64:
      detail::attention_forward_launch<64>(p, c, stream);
      break;
    default:
      detail::attention_forward_launch<128>(p, c, stream);
      break;
  }
}

void flash_attention_backward(bf16* d_dq, bf16* d_dk, bf16* d_dv, const bf16* d_dout,
                              const bf16* d_q, const bf16* d_k, const bf16* d_v, const bf16* d_out,
                              const float* d_lse, std::int64_t B, std::int64_t S, std::int64_t nh,
                              std::int64_t nkv, std::int64_t hd, void* d_scratch,
                              std::size_t scratch_bytes, cudaStream_t stream) {
  constexpr const char* fn = "flash_attention_backward";
  attention_check_args(fn, B, S, nh, nkv, hd);
  check_bf16_pointers(fn, {{"d_dq", d_dq},
                           {"d_dk", d_dk},
                           {"d_dv", d_dv},
                           {"d_dout", d_dout},
                           {"d_q", d_q},
                           {"d_k", d_k},
                           {"d_v", d_v},
                           {"d_out", d_out}});
  attention_check_aligned(fn, "d_lse", d_lse, sizeof(float));
  attention_check_aligned(fn, "d_scratch", d_scratch, sizeof(float));
  const launch_config cd = attention_backward_d_config(B, S, nh, nkv, hd);
  TESSERA_THROW_IF(scratch_bytes < cd.scratch_bytes, config_error, fn,
                   ": scratch_bytes=", scratch_bytes, " is below the ", cd.scratch_bytes,
                   " bytes needed (flash_attention_backward_scratch_bytes: B*nh*S floats for D)");
  const launch_config ckv = attention_backward_kv_config(B, S, nh, nkv, hd);
  const launch_config cq = attention_backward_q_config(B, S, nh, nkv, hd);
  detail::attention_backward_params p{};
  p.dq = bits(d_dq);
  p.dk = bits(d_dk);
  p.dv = bits(d_dv);
  p.dout = bits(d_dout);
  p.q = bits(d_q);
  p.k = bits(d_k);
  p.v = bits(d_v);
  p.out = bits(d_out);
  p.lse = d_lse;
  p.d = static_cast<float*>(d_scratch);
  p.rows = B * S * nh;
  p.S = S;
  p.nh = static_cast<int>(nh);
  p.nkv = static_cast<int>(nkv);
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  switch (hd) {
    case 32:
      detail::attention_backward_launch<32>(p, cd, ckv, cq, stream);
      break;
    case 64:
      detail::attention_backward_launch<64>(p, cd, ckv, cq, stream);
      break;
    default:
      detail::attention_backward_launch<128>(p, cd, ckv, cq, stream);
      break;
  }
}

}  // namespace tessera::kernels::cuda
