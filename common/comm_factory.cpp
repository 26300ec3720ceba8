// comm_factory.cpp: communicator_for of comm_factory.h. Built with and without CUDA; the CUDA
// communicators themselves live in comm_nccl.cpp, compiled only in the CUDA build.
#include "comm_factory.h"

#include <utility>

#include "check.h"  // config_error

std::unique_ptr<Communicator> communicator_for(Device device, std::unique_ptr<Communicator> mpi) {
  if (device == Device::CPU) return mpi;
#ifdef GPT_WITH_CUDA
  return create_cuda_communicator(std::move(mpi));
#else
  config_error("a CUDA communicator was requested, but this program was built without CUDA (nvcc was not "
               "found when it was built); use the CPU, or rebuild on a machine with the CUDA toolkit");
#endif
}
