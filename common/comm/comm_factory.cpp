// comm_factory.cpp: communicator_for of comm_factory.h. Built with and without CUDA; the CUDA
// communicators themselves live in comm_nccl.cpp, compiled only in the CUDA build.
#include "comm/comm_factory.h"

#include <utility>

#include "base/check.h"     // config_error
#include "comm/comm_p2p.h"  // with_collectives

std::unique_ptr<Communicator> communicator_for(Device device, std::unique_ptr<Communicator> mpi,
                                               const std::string& collectives) {
  CollectivesChoice choice;
  ENSURE(parse_collectives(collectives, &choice), "--collectives " + collectives + " was not checked");
  if (device == Device::CPU) return with_collectives(choice, std::move(mpi));
#ifdef GPT_WITH_CUDA
  return with_collectives(choice, create_cuda_communicator(std::move(mpi)));
#else
  config_error("a CUDA communicator was requested, but this program was built without CUDA (nvcc was not "
               "found when it was built); use the CPU, or rebuild on a machine with the CUDA toolkit");
#endif
}
