// Must not compile: the trainer composed with a type that is not an
// optimizer policy fails at the trainer with a message saying what the
// type lacks (not deep inside the engine).
// EXPECT: not a tessera optimizer policy
#include <tessera/train/trainer.hpp>

struct lion {};  // no name, no config, no state
using composed = tessera::train::trainer<tessera::precision::fp32, tessera::host, lion>;
static_assert(sizeof(composed) > 0);
