// comm_host_staged.cpp: the communicator of CUDA tensors when ranks share a GPU, or where the build
// found no NCCL.
// HostStagedCommunicator (NCCL refuses two ranks on one GPU):
//   every collective of a CUDA tensor waits for the compute stream, copies the tensor to host memory,
//   runs the MPI collective, and wait() copies the result back. Correct, slow, no overlap; the host
//   time spent copying counts as exposed communication. The MPI collectives carry the link model and
//   the trace spans, as in a CPU run. The host copies are host RAM, left out of the GPU's memory table.
// Compiled only in the CUDA build (GPT_WITH_CUDA); in the CPU build this file is empty.
#ifdef GPT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm_cuda_internal.h"
#include "comm/trace.h"    // now_ms, trace_span
#include "ops/memory.h"    // host staging is host RAM, not counted (HostCopy)
#include "ops/ops.h"       // copy_tensor: a one-rank collective's copy
#include "ops/ops_cuda.h"  // cuda::stream(), the compute stream

namespace cuda_comm {
namespace {

class HostStagedCommunicator final : public CudaCommunicatorBase {
 public:
  explicit HostStagedCommunicator(std::unique_ptr<Communicator> mpi)
      : CudaCommunicatorBase(std::move(mpi), "mpi (host-staged)") {}

  std::unique_ptr<Communicator> split_group(int color, int key, const std::string& group) override {
    return std::make_unique<HostStagedCommunicator>(mpi_->split(color, key, group));
  }

  CommHandle all_reduce_async(Tensor buf, ReduceOp op) override {
    if (buf.device == Device::CPU) return over_mpi(mpi_->all_reduce_async(buf, op));
    auto host = to_host(buf);
    return staged(mpi_->all_reduce_async(host->view(), op), nullptr, host, buf);
  }

  CommHandle reduce_scatter_async(Tensor send, Tensor recv, ReduceOp op) override {
    if (device_of(send, recv, "reduce_scatter") == Device::CPU)
      return over_mpi(mpi_->reduce_scatter_async(send, recv, op));
    ensure_disjoint(send, recv, "reduce_scatter");
    auto host_send = to_host(send);
    auto host_recv = host_buffer(recv);
    return staged(mpi_->reduce_scatter_async(host_send->view(), host_recv->view(), op), host_send, host_recv, recv);
  }

  // (In place on the device becomes two separate host buffers: MPI then simply gathers all segments.)
  CommHandle all_gather_async(Tensor send, Tensor recv) override {
    if (device_of(send, recv, "all_gather") == Device::CPU) return over_mpi(mpi_->all_gather_async(send, recv));
    ensure_gather_buffers(send, recv, int64_t(rank_) * send.numel(), "all_gather");
    auto host_send = to_host(send);
    auto host_recv = host_buffer(recv);
    return staged(mpi_->all_gather_async(host_send->view(), host_recv->view()), host_send, host_recv, recv);
  }

  CommHandle reduce_scatter_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts,
                                    ReduceOp op) override {
    if (device_of(send, recv, "reduce_scatter_v") == Device::CPU)
      return over_mpi(mpi_->reduce_scatter_v_async(send, recv, counts, op));
    ensure_disjoint(send, recv, "reduce_scatter_v");
    auto host_send = to_host(send);
    auto host_recv = host_buffer(recv);
    return staged(mpi_->reduce_scatter_v_async(host_send->view(), host_recv->view(), counts, op), host_send,
                  host_recv, recv);
  }

  CommHandle all_gather_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts) override {
    if (device_of(send, recv, "all_gather_v") == Device::CPU)
      return over_mpi(mpi_->all_gather_v_async(send, recv, counts));
    const std::vector<int64_t> displs = displacements(counts, size_, "all_gather_v");
    ensure_gather_buffers(send, recv, displs[rank_], "all_gather_v");
    auto host_send = to_host(send);
    auto host_recv = host_buffer(recv);
    return staged(mpi_->all_gather_v_async(host_send->view(), host_recv->view(), counts), host_send, host_recv,
                  recv);
  }

  CommHandle all_to_all_async(Tensor send, Tensor recv) override {
    if (device_of(send, recv, "all_to_all") == Device::CPU) return over_mpi(mpi_->all_to_all_async(send, recv));
    ensure_disjoint(send, recv, "all_to_all");
    auto host_send = to_host(send);
    auto host_recv = host_buffer(recv);
    return staged(mpi_->all_to_all_async(host_send->view(), host_recv->view()), host_send, host_recv, recv);
  }

  CommHandle all_to_all_v_async(Tensor send, const std::vector<int64_t>& send_counts, Tensor recv,
                                const std::vector<int64_t>& recv_counts) override {
    if (device_of(send, recv, "all_to_all_v") == Device::CPU)
      return over_mpi(mpi_->all_to_all_v_async(send, send_counts, recv, recv_counts));
    ensure_disjoint(send, recv, "all_to_all_v");
    auto host_send = to_host(send);
    auto host_recv = host_buffer(recv);
    return staged(mpi_->all_to_all_v_async(host_send->view(), send_counts, host_recv->view(), recv_counts), host_send,
                  host_recv, recv);
  }

  CommHandle broadcast_async(Tensor buf, int root) override {
    if (buf.device == Device::CPU) return over_mpi(mpi_->broadcast_async(buf, root));
    auto host = to_host(buf);
    return staged(mpi_->broadcast_async(host->view(), root), nullptr, host, buf);
  }

  CommHandle send_async(Tensor buf, int peer, int tag) override {
    if (buf.device == Device::CPU) return over_mpi(mpi_->send_async(buf, peer, tag));
    auto host = to_host(buf);
    return staged(mpi_->send_async(host->view(), peer, tag), host, nullptr, Tensor{});
  }

  CommHandle recv_async(Tensor buf, int peer, int tag) override {
    if (buf.device == Device::CPU) return over_mpi(mpi_->recv_async(buf, peer, tag));
    auto host = host_buffer(buf);
    return staged(mpi_->recv_async(host->view(), peer, tag), nullptr, host, buf);
  }

  CommHandle barrier_async() override { return over_mpi(mpi_->barrier_async()); }

  void broadcast_bytes(void* data, size_t bytes, int root) override {
    if (bytes == 0 || !is_device_memory(data)) {
      mpi_->broadcast_bytes(data, bytes, root);
    } else {
      cuda::synchronize();  // the compute stream has written the bytes
      std::vector<char> host(bytes);
      CUDA_CHECK(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost));
      mpi_->broadcast_bytes(host.data(), bytes, root);
      CUDA_CHECK(cudaMemcpy(data, host.data(), bytes, cudaMemcpyHostToDevice));
    }
    absorb_mpi_stats();
  }

 private:
  // A staging copy lives in host memory. A GPU run's memory table is the GPU's (what docs/theory.md
  // predicts and the driver counts), so these copies are plain host allocations, outside the
  // framework's counters: counting them would report as GPU memory bytes that only this fallback
  // for ranks sharing a GPU needs, and that sit in the host's RAM.
  class HostCopy {
   public:
    explicit HostCopy(const Tensor& like) : bytes_(std::max<size_t>(like.bytes(), 1)) {
      view_.data = bytes_.data();
      view_.dtype = like.dtype;
      view_.device = Device::CPU;
      view_.ndim = 1;
      view_.shape[0] = like.numel();
    }
    Tensor view() const { return view_; }
    void* data() { return bytes_.data(); }

   private:
    std::vector<char> bytes_;
    Tensor view_;
  };
  using HostBuffer = std::shared_ptr<HostCopy>;

  // A staging copy is communication the caller waits for: exposed, and in flight (so that exposed
  // time never exceeds the time communication was in flight).
  void count_copy(double ms) {
    stats_.exposed_ms += ms;
    stats_.in_flight_ms += ms;
  }

  // In the tensor's own dtype: bf16 travels as bf16 (the MPI communicator reduces it in fp32).
  static HostBuffer host_buffer(const Tensor& t) { return std::make_shared<HostCopy>(t); }

  // A host copy of t, taken once the compute stream has finished writing it. The host blocks for
  // both; only the copy counts as exposed communication (the wait before it is compute time).
  HostBuffer to_host(const Tensor& t) {
    cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    HostBuffer host = host_buffer(t);
    if (t.bytes() > 0) CUDA_CHECK(cudaMemcpy(host->data(), t.data, t.bytes(), cudaMemcpyDeviceToHost));
    count_copy(elapsed_ms(start));
    return host;
  }

  // The handle of a staged collective: wait() waits for MPI, then copies `result` (if any) back into
  // `device`. The copy runs on the legacy default stream, with which the compute stream is ordered
  // (ops_cuda.h), so ops queued after wait() see the result. The handle keeps the host buffers alive
  // until then; `input` is the one MPI reads from, when it is not `result` itself.
  CommHandle staged(CommHandle inner, HostBuffer input, HostBuffer result, Tensor device) {
    absorb_mpi_stats();  // the op's `launched` count
    return CommHandle([this, inner, input, result, device, done = false]() mutable {
      if (done) return;
      done = true;
      inner.wait();
      absorb_mpi_stats();
      if (result && device.bytes() > 0) {
        // A copy from pageable memory waits for the queued compute first: that wait is not communication.
        cuda::synchronize();
        const auto start = std::chrono::steady_clock::now();
        CUDA_CHECK(cudaMemcpy(device.data, result->data(), device.bytes(), cudaMemcpyHostToDevice));
        count_copy(elapsed_ms(start));
      }
      input.reset();
      result.reset();
    });
  }
};

}  // namespace

std::unique_ptr<Communicator> make_host_staged_communicator(std::unique_ptr<Communicator> mpi) {
  return std::make_unique<HostStagedCommunicator>(std::move(mpi));
}

}  // namespace cuda_comm

#endif  // GPT_WITH_CUDA
