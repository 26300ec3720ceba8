// link_delay.h: the emulated link (LinkModel, comm.h) for collectives that run on a CUDA stream.
// Defines hold_stream(), used by the NCCL communicator (comm_nccl.cpp); its kernel is in link_delay.cu.
//
// The MPI communicator holds a message for its modelled time before it posts the MPI call. An NCCL
// collective has no thread to hold it: it is a kernel queued on a stream. So the hold is queued
// there too, right before the collective: a one-thread kernel reads the GPU's global clock
// (%globaltimer, ns) when the stream reaches it and spins (__nanosleep) until `ms` have passed. The
// collective then starts no earlier than that on every rank, and completes no earlier than the last
// rank's arrival plus the modelled time, as over MPI. The host never waits. With the link off, do
// not call it: nothing is launched.
#pragma once
#include <cuda_runtime_api.h>  // cudaStream_t

void hold_stream(cudaStream_t stream, double ms);
