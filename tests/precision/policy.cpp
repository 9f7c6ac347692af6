// Tests include/tessera/precision/policy.hpp: the short precision names of
// the command lines map to their policies, one helper for every program.
#include <catch2/catch.hpp>

#include "tessera/precision/policy.hpp"

namespace test_precision_policy {

using namespace tessera;

TEST_CASE("policy_name: bf16, fp16 and fp8 name the mixed policies", "[precision]") {
  CHECK(precision::policy_name("bf16") == precision::bf16_mixed::name);
  CHECK(precision::policy_name("fp16") == precision::fp16_mixed::name);
  CHECK(precision::policy_name("fp8") == precision::fp8_mixed::name);
  // Any other name is returned as it is, for its caller to look up.
  for (const char* n : {"fp32", "fp64", "bf16_mixed", "bf16_mixed_bf16_grads", "fp16_mixed",
                        "fp8_mixed", "seed004", "fp4"})
    CHECK(precision::policy_name(n) == n);
}

}  // namespace test_precision_policy
