// Compiles include/tessera/comm/nccl.hpp under nvcc for sm_90a and sm_80
// with every warning an error, and instantiates every nccl_communicator
// operation (blocking and asynchronous) for every element type it takes
// (float, double, int32, int64, uint64, bf16), plus barrier, split, the
// debug hash and the request's wait/test/event. Nothing here runs: the GPU
// test is tests/cuda/nccl.cpp (test_cuda_nccl under mpirun).
#include <tessera/comm/nccl.hpp>

namespace tessera::comm {

#define TESSERA_NCCL_INSTANTIATE(T)                                                                \
  template void communicator_base<nccl_communicator>::all_reduce<T>(T*, std::size_t, reduce_op);   \
  template nccl_request nccl_communicator::iall_reduce<T>(T*, std::size_t, reduce_op);             \
  template void communicator_base<nccl_communicator>::reduce_scatter<T>(const T*, T*, std::size_t, \
                                                                        reduce_op);                \
  template nccl_request nccl_communicator::ireduce_scatter<T>(const T*, T*, std::size_t,           \
                                                              reduce_op);                          \
  template void communicator_base<nccl_communicator>::all_gather<T>(const T*, T*, std::size_t);    \
  template nccl_request nccl_communicator::iall_gather<T>(const T*, T*, std::size_t);              \
  template void communicator_base<nccl_communicator>::broadcast<T>(T*, std::size_t, int);          \
  template nccl_request nccl_communicator::ibroadcast<T>(T*, std::size_t, int);                    \
  template void communicator_base<nccl_communicator>::send<T>(const T*, std::size_t, int, int);    \
  template nccl_request nccl_communicator::isend<T>(const T*, std::size_t, int, int);              \
  template void communicator_base<nccl_communicator>::recv<T>(T*, std::size_t, int, int);          \
  template nccl_request nccl_communicator::irecv<T>(T*, std::size_t, int, int);                    \
  template void communicator_base<nccl_communicator>::sendrecv<T>(const T*, int, T*, int,          \
                                                                  std::size_t, int);               \
  template nccl_request nccl_communicator::isendrecv<T>(const T*, int, T*, int, std::size_t, int);

TESSERA_NCCL_INSTANTIATE(float)
TESSERA_NCCL_INSTANTIATE(double)
TESSERA_NCCL_INSTANTIATE(std::int32_t)
TESSERA_NCCL_INSTANTIATE(std::int64_t)
TESSERA_NCCL_INSTANTIATE(std::uint64_t)
TESSERA_NCCL_INSTANTIATE(tessera::bf16)
#undef TESSERA_NCCL_INSTANTIATE

static_assert(nccl_element<tessera::bf16> && !comm_element<tessera::bf16>);
static_assert(detail::nccl_type(dtype::bf16) == ncclBfloat16);
static_assert(detail::nccl_type(dtype_of<std::int32_t>()) == ncclInt32);
static_assert(comm_request<nccl_request>);

}  // namespace tessera::comm

/// The non-template members, the constructor and the request, odr-used so
/// nvcc generates them. Never called.
void tessera_nccl_check_members(tessera::comm::mpi_communicator& boot, int device) {
  using namespace tessera::comm;
  nccl_communicator c(boot, device);
  c.set_stream(nullptr);
  c.set_timeout(std::chrono::seconds(1));
  c.set_debug(true);
  c.barrier();
  nccl_request r = c.ibarrier();
  (void)r.test();
  (void)r.event();
  r.wait();
  nccl_communicator sub = c.split(0, c.rank());
  sub.verify_collective_hash();
  (void)sub.native();
  (void)sub.stream();
  (void)sub.device();
  (void)c.stats();
  (void)c.bytes_sent();
  (void)c.timeout();
  c.reset_stats();
}
