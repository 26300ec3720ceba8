// link_delay.h: the emulated link (LinkModel, comm.h) for collectives that run on a CUDA stream.
// Defines LinkDelay, used by the NCCL communicator (comm_nccl.cpp); its kernels are in link_delay.cu.
//
// The MPI communicator's thread sleeps until an op's modelled time has passed. An NCCL collective
// has no thread to sleep on: it is a kernel queued on a stream. So the delay is queued there too,
// around the collective:
//   begin(s)           a one-thread kernel stamps the GPU's global clock (%globaltimer, ns) into a
//                      device slot, when the stream reaches it, i.e. when the collective can start;
//   ... collective ...
//   end(s, modelled)   a one-thread kernel spins (__nanosleep) until that clock reads stamp + modelled,
//                      and holds the stream until then.
// A collective then lasts max(its real time, the modelled time), as over MPI, and the ops of one
// stream follow one another as on one link. The host never waits. One slot serves every op, since
// the ops of the stream run one after another. With the link off, call neither: nothing is launched.
#pragma once
#include <cuda_runtime_api.h>  // cudaStream_t

class LinkDelay {
 public:
  LinkDelay();  // allocates the slot on the current device (device_alloc, counted as comm)
  ~LinkDelay();
  LinkDelay(const LinkDelay&) = delete;
  LinkDelay& operator=(const LinkDelay&) = delete;

  void begin(cudaStream_t stream);
  void end(cudaStream_t stream, double modelled_ms);

 private:
  unsigned long long* start_ns_ = nullptr;  // device: the stamp of begin()
};
