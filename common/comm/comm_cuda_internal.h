// comm_cuda_internal.h: what the two communicators of CUDA tensors share, NCCL's (comm_nccl.cpp)
// and the host-staged fallback (comm_host_staged.cpp), and nothing else includes: CudaCommunicatorBase
// (the MPI communicator each keeps for host data, whose statistics it adds to its own), the checks of
// a collective's buffers as the MPI communicator makes them, and the host-staged one's constructor,
// which the factory (comm_nccl.cpp) calls. CUDA build only (GPT_WITH_CUDA).
#pragma once
#ifdef GPT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/cuda_check.h"     // CUDA_CHECK
#include "comm/comm.h"
#include "comm/comm_mpi_args.h"  // overlap

namespace cuda_comm {

inline bool is_device_memory(const void* ptr) {
  cudaPointerAttributes attributes;
  CUDA_CHECK(cudaPointerGetAttributes(&attributes, ptr));
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

inline double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

// What both CUDA communicators share: the MPI communicator they keep for host data, and the
// bookkeeping that adds its statistics to ours.
class CudaCommunicatorBase : public Communicator {
 public:
  double all_reduce_scalar(double value, ReduceOp op) override {
    const double result = mpi_->all_reduce_scalar(value, op);
    absorb_mpi_stats();
    return result;
  }

  void agree_or_die(bool ok, const std::string& msg) override {
    mpi_->agree_or_die(ok, msg);
    absorb_mpi_stats();
  }

 protected:
  CudaCommunicatorBase(std::unique_ptr<Communicator> mpi, const char* name) : mpi_(std::move(mpi)) {
    rank_ = mpi_->rank();
    size_ = mpi_->size();
    device_ = Device::CUDA;
    name_ = name;
    group_ = mpi_->group();
    link_ = mpi_->link_model();
    share_formats_of(*mpi_);
  }

  // Ours, and the MPI communicator's: what travels over MPI is delayed as in a CPU run.
  void set_link_model(LinkModel link) override {
    Communicator::set_link_model(link);
    mpi_->set_link_model(link);
  }

  // Adds what the MPI communicator counted since the last call to our own statistics. Both are
  // written only by the thread that issues and waits, so a difference of snapshots is exact.
  void absorb_mpi_stats() {
    const CommStats& now = mpi_->stats();
    for (int k = 0; k < kCollectiveKinds; k++) {
      CollectiveCounters& ours = stats_.kind[k];
      ours.calls += now.kind[k].calls - mpi_seen_.kind[k].calls;
      ours.launched += now.kind[k].launched - mpi_seen_.kind[k].launched;
      ours.payload_bytes += now.kind[k].payload_bytes - mpi_seen_.kind[k].payload_bytes;
      ours.sent_bytes += now.kind[k].sent_bytes - mpi_seen_.kind[k].sent_bytes;
      ours.received_bytes += now.kind[k].received_bytes - mpi_seen_.kind[k].received_bytes;
      ours.max_sent_share = std::max(ours.max_sent_share, now.kind[k].max_sent_share);
      ours.max_received_share = std::max(ours.max_received_share, now.kind[k].max_received_share);
      ours.busy_ms += now.kind[k].busy_ms - mpi_seen_.kind[k].busy_ms;
      ours.exposed_ms += now.kind[k].exposed_ms - mpi_seen_.kind[k].exposed_ms;
    }
    stats_.exposed_ms += now.exposed_ms - mpi_seen_.exposed_ms;
    stats_.in_flight_ms += now.in_flight_ms - mpi_seen_.in_flight_ms;
    mpi_seen_ = now;
  }

  // A handle for an op just issued on the MPI communicator: its `launched` count comes over now,
  // the rest when it is waited.
  CommHandle over_mpi(CommHandle inner) {
    absorb_mpi_stats();
    return CommHandle([this, inner]() mutable {
      inner.wait();
      absorb_mpi_stats();
    });
  }

  std::unique_ptr<Communicator> mpi_;
  CommStats mpi_seen_;  // the MPI communicator's statistics when we last absorbed them
};

// The device of a collective with a send and a recv tensor. Either may be an empty Tensor (a rank
// that owns no segment of a variable-count collective), which says nothing about the device.
inline Device device_of(const Tensor& send, const Tensor& recv, const char* what) {
  ENSURE(send.empty() || recv.empty() || (send.device == recv.device && send.dtype == recv.dtype),
         std::string(what) + ": send and recv must have the same device and dtype");
  return send.empty() ? recv.device : send.device;
}

using mpi_args::overlap;  // whether two tensors share a byte (comm_mpi_args.h)

// The same rules as the MPI communicator (comm.h), so that a program runs on either: send and recv
// share no byte, except an all-gather in place, whose send is exactly this rank's segment of recv.
inline void ensure_disjoint(const Tensor& send, const Tensor& recv, const char* what) {
  ENSURE(!overlap(send, recv), std::string(what) + ": send and recv overlap; use a separate recv (comm.h)");
}
inline void ensure_gather_buffers(const Tensor& send, const Tensor& recv, int64_t own_offset, const char* what) {
  if (send.numel() == 0 || send.data == recv.slice1d(own_offset, send.numel()).data) return;  // in place
  ENSURE(!overlap(send, recv), std::string(what) + ": send overlaps recv without being this rank's own segment "
                               "of it (in place, send must be exactly that segment)");
}

// Checks the counts of a variable-count collective and returns where each segment begins.
inline std::vector<int64_t> displacements(const std::vector<int64_t>& counts, int ranks, const char* what) {
  ENSURE(int(counts.size()) == ranks, std::string(what) + ": counts must have one entry per rank");
  std::vector<int64_t> displs;
  int64_t total = 0;
  for (int64_t c : counts) {
    ENSURE(c >= 0, std::string(what) + ": negative count");
    displs.push_back(total);
    total += c;
  }
  return displs;
}

// Every collective of a CUDA tensor through host memory over MPI (ranks share a GPU: comm_host_staged.cpp).
std::unique_ptr<Communicator> make_host_staged_communicator(std::unique_ptr<Communicator> mpi);

}  // namespace cuda_comm

#endif  // GPT_WITH_CUDA
