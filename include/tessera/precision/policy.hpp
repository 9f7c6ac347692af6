#pragma once
/// \file precision/policy.hpp
/// Precision policies: which type stores parameters and saved activations,
/// which type gradients use, which type the master weights and optimizer
/// state use, and which type every GEMM and reduction accumulates in.
///
/// Presets: `fp32`, `bf16_mixed` (bf16 weights and activations, float32
/// master weights, optimizer state, gradients and accumulation), and `fp64`
/// (float64 throughout; what the finite-difference tests run).

#include <concepts>
#include <string_view>
#include <type_traits>

#include "tessera/core/numeric.hpp"

namespace tessera::precision {

/// A precision policy names its types and a short name for logs.
template <class P>
concept policy = requires {
  typename P::param_type;   // parameters and saved activations (storage)
  typename P::grad_type;    // parameter and activation gradients
  typename P::master_type;  // master weights and optimizer state
  typename P::accum_type;   // accumulation in GEMMs and reductions
  { P::name } -> std::convertible_to<std::string_view>;
} && std::is_same_v<typename P::accum_type, accum_t<typename P::param_type>>;

/// float32 everywhere: parameters are their own master weights.
struct fp32 {
  using param_type = float;
  using grad_type = float;
  using master_type = float;
  using accum_type = float;
  static constexpr const char* name = "fp32";
};

/// float64 everywhere (reference runs and finite-difference tests).
struct fp64 {
  using param_type = double;
  using grad_type = double;
  using master_type = double;
  using accum_type = double;
  static constexpr const char* name = "fp64";
};

/// bf16 weights and saved activations; float32 gradients, master weights and
/// optimizer state; float32 accumulation in every GEMM and reduction
/// (Micikevicius et al. 2018, "Mixed Precision Training", with bf16 needing
/// no loss scaling).
struct bf16_mixed {
  using param_type = bf16;
  using grad_type = float;
  using master_type = float;
  using accum_type = float;
  static constexpr const char* name = "bf16_mixed";
};

static_assert(policy<fp32> && policy<fp64> && policy<bf16_mixed>);

}  // namespace tessera::precision
