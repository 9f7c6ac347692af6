// Must not compile: device_mesh from four integers, which some callers
// read as (dp, tp, pp, world size) and others as (dp, cp, tp, pp). The
// constructor's static_assert asks for mesh_degrees.
// EXPECT: is ambiguous: write device_mesh
#include <tessera/comm/device_mesh.hpp>

int ranks() { return tessera::comm::device_mesh(2, 2, 2, 8).size(); }
