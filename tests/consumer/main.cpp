// Builds against the installed tessera and checks one small computation.
#include <tessera/tessera.hpp>

#include <cstdio>

int main() {
  tessera::tensor<float> x(tessera::shape{4});
  for (int i = 0; i < 4; ++i) x[i] = static_cast<float>(i);
  float b = static_cast<float>(tessera::bf16(1.5f));
  if (b != 1.5f || x.numel() != 4) return 1;
  std::printf("tessera consumer ok\n");
  return 0;
}
