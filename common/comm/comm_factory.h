// comm_factory.h: the communicator for the device a run computes on. Defines communicator_for,
// which a chapter calls right after parsing its flags, on the MPI communicator it started with.
#pragma once
#include <memory>
#include <string>

#include "comm/comm.h"    // Communicator
#include "ops/tensor.h"  // Device

// Returns
//   for Device::CPU:  `mpi` itself, the MPI communicator of init_mpi_communicator (comm.h);
//   for Device::CUDA: after selecting this rank's GPU (node-local rank modulo the GPUs it sees), the
//                     NCCL communicator (comm_nccl.cpp). Collectives of CUDA tensors run on NCCL's
//                     own stream, ordered after the compute stream with CUDA events; CPU tensors,
//                     scalars and byte broadcasts go over MPI. If two ranks of one node got the same
//                     GPU, NCCL cannot work (it needs one GPU per rank): rank 0 says so once and
//                     every rank falls back to MPI with host staging (device -> host, MPI, host ->
//                     device): correct, but slow and without overlap.
// Device::CUDA needs the CUDA build; without it, a config_error says so. With `collectives` other than
// "library" (the --collectives flag, already checked), that communicator is wrapped so that its
// all-reduces, reduce-scatters and all-gathers are chapter 00's, from send and receive (comm_p2p.h).
// The chapter still ends with shutdown_mpi(std::move(comm)).
std::unique_ptr<Communicator> communicator_for(Device device, std::unique_ptr<Communicator> mpi,
                                               const std::string& collectives = "library");

#ifdef GPT_WITH_CUDA
// The Device::CUDA half of communicator_for, in comm_nccl.cpp. `mpi` is the MPI communicator
// (MPI is initialised); the CUDA communicator keeps it for what travels over MPI.
std::unique_ptr<Communicator> create_cuda_communicator(std::unique_ptr<Communicator> mpi);
#endif
