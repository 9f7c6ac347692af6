// Must not compile: a type that is not an optimizer policy, checked with
// check_optimizer_policy, fails with a message saying what is missing.
// EXPECT: not a tessera optimizer policy
#include <tessera/optim/optimizer.hpp>

struct lion {};  // no name, no config, no state
static_assert(tessera::optim::check_optimizer_policy<lion>());
