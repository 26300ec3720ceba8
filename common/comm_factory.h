// comm_factory.h: the communicator for the device a run computes on. Defines create_communicator,
// which a chapter calls instead of init_mpi_communicator (comm.h) when it may run on GPUs.
#pragma once
#include <memory>

#include "comm.h"    // Communicator, init_mpi_communicator, shutdown_mpi
#include "tensor.h"  // Device

// Initialises MPI (init_mpi_communicator), then returns
//   for Device::CPU:  the MPI communicator, exactly what init_mpi_communicator returns;
//   for Device::CUDA: after selecting this rank's GPU (node-local rank modulo the GPUs it sees), the
//                     NCCL communicator (comm_nccl.cpp). Collectives of CUDA tensors run on NCCL's
//                     own stream, ordered after the compute stream with CUDA events; CPU tensors,
//                     scalars and byte broadcasts go over MPI. If two ranks of one node got the same
//                     GPU, NCCL cannot work (it needs one GPU per rank): rank 0 says so once and
//                     every rank falls back to MPI with host staging (device -> host, MPI, host ->
//                     device): correct, but slow and without overlap.
// Device::CUDA needs the CUDA build; without it, a config_error says so. Call it first thing in
// main; end with shutdown_mpi(std::move(comm)).
std::unique_ptr<Communicator> create_communicator(int* argc, char*** argv, Device device);

#ifdef GPT_WITH_CUDA
// The Device::CUDA half of create_communicator, in comm_nccl.cpp. `mpi` is the MPI communicator
// (MPI is initialised); the CUDA communicator keeps it for what travels over MPI.
std::unique_ptr<Communicator> create_cuda_communicator(std::unique_ptr<Communicator> mpi);
#endif
