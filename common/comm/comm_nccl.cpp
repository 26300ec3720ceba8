// comm_nccl.cpp: the communicator for CUDA tensors over NCCL, and create_cuda_communicator, the CUDA
// half of communicator_for (comm_factory.h), which chooses it, or the host-staged one
// (comm_host_staged.cpp) where ranks share a GPU. What the two share: comm_cuda_internal.h.
// Compiled only in the CUDA build (GPT_WITH_CUDA); in the CPU build this file is empty.
//
// NcclCommunicator, the normal case: one GPU per rank, collectives by NCCL.
//   Streams. Ops run on the compute stream (cuda::stream(), ops_cuda.h); NCCL runs on a stream of its
//   own, so a collective can proceed while the compute stream goes on with other kernels. That is
//   the GPU form of the MPI communicator's thread. The two streams are ordered with CUDA events,
//   never by blocking the host:
//     issue:  record `ready` on the compute stream, then cudaStreamWaitEvent(nccl stream, ready):
//             the collective starts only once the ops queued before it have produced its input.
//     wait(): cudaStreamWaitEvent(compute stream, end), `end` recorded on the NCCL stream right after
//             the collective: kernels queued after wait() run only once the result is there. wait()
//             itself returns at once; the host never blocks.
//   Ranks. Every rank issues the same collectives in the same order (as with MPI), which NCCL needs.
//   Sends and receives run on the one NCCL stream in issue order, match by that order (NCCL has no
//   tags), and a send waits for its receive to run: two ranks that both send first, then receive,
//   would deadlock. send_recv_async puts them in one group (ncclGroupStart/End), and a pipeline
//   orders its groups so that none waits forever (pipeline_schedule.h, Matching::ByCallOrder).
//   Statistics. calls and bytes are counted by wait(), as in comm_engine.cpp. Times come from events:
//     busy    = end - start, the two events recorded around the collective on the NCCL stream;
//     exposed = end - waited (when positive), `waited` recorded on the compute stream by wait():
//               how long the compute stream stalls for the collective, the GPU form of the time a
//               CPU caller blocks in wait().
//   The host cannot read an event's time before the GPU has passed it, and must not block for it,
//   so times are collected later, by any call on the communicator that finds both events complete,
//   and by collect_stats(), which a step calls at its end, after synchronizing the device: every op
//   the step waited for is then complete, and the step sees its own times.
//   Trace. When an op's times are collected, it becomes a span on the communication track (trace.h),
//   and a stall of the compute stream for it a span on the waiting track. Events tell the GPU's
//   clock, the trace the host's (now_ms()). An anchor event converts: recorded on an idle stream and
//   waited for, its host time is known to within a few microseconds, and then
//       host ms of an event = host ms of the anchor + cudaEventElapsedTime(anchor, event).
//   The anchor is renewed every few seconds, so that neither the drift between the two clocks nor
//   the float precision of cudaEventElapsedTime grows with the run. These spans show when the GPU
//   ran the collective; the compute track shows when the host queued its work, usually earlier.
//   Emulated link (LinkModel, comm.h). As over MPI, the link holds each message for its modelled time
//   before it enters the network: a one-thread kernel holds the NCCL stream for modelled_ms() right
//   before the collective (link_delay.h), so that a collective completes no earlier than the last
//   rank's entry plus the modelled time, and a message no earlier than its modelled time after it was
//   sent. Busy time includes the hold. With the link off (or one rank) nothing extra is launched.
//   Receives are not held (the sender's hold covers the message); but, NCCL having one stream here,
//   a send's hold also delays the receives queued after it, where MPI gives them a lane of their own.
//   Groups (split): each group is an NCCL communicator of its own, named by a unique id that the
//   group's rank 0 makes and broadcasts over the group's MPI communicator. Tags: NCCL has none, so
//   sends and receives between two ranks match in issue order whatever their tags.
//   Barrier. barrier() holds the host until every rank has reached it, as MPI's does (a checkpoint
//   relies on it): an all-reduce of one float on the NCCL stream, then the host waits for it.
//   CPU tensors, scalars, agree_or_die and broadcast_bytes of host memory go over MPI, through the
//   MPI communicator this one keeps; its statistics are added to ours after each of its ops, and our
//   link model is passed on to it, so those ops are delayed as they would be in a CPU run.
//
#ifdef GPT_WITH_CUDA

#include <cuda_runtime_api.h>
#include <mpi.h>
#ifdef GPT_WITH_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm_cuda_internal.h"
#include "comm/comm_factory.h"
#include "comm/comm_mpi_args.h"  // overlap
#include "base/cuda_check.h"  // CUDA_CHECK, NCCL_CHECK
#include "ops/device.h"      // cuda_device_count, set_ranks_per_gpu
#include "comm/link_delay.h"  // hold_stream: the emulated link on the NCCL stream
#include "ops/memory.h"      // Buffer, device_alloc: scratch memory is counted (host staging is not: HostCopy)
#include "ops/ops.h"         // copy_tensor: a one-rank collective's copy
#include "ops/ops_cuda.h"    // cuda::stream(), the compute stream
#include "comm/trace.h"       // now_ms, trace_span
namespace {

using namespace cuda_comm;

// ---------------------------------------------------------------------------------------------
// NCCL (where the build found it: GPT_WITH_NCCL, set by cuda.mk)

#ifdef GPT_WITH_NCCL


ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::F16: return ncclHalf;
    case DType::U8: return ncclUint8;
  }
  fatal("nccl_type: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;  // NCCL divides by the rank count itself (NCCL >= 2.10)
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

// One collective issued on the NCCL stream, until its times have been collected.
struct NcclOp {
  CollectiveKind kind = CollectiveKind::AllReduce;
  const char* name = "";         // for the trace, as in comm_mpi.cpp: "all_reduce", "send", ...
  int64_t payload_bytes = 0;
  int64_t sent_bytes = 0, received_bytes = 0;
  cudaEvent_t start = nullptr;   // NCCL stream, just before the collective (and its link delay)
  cudaEvent_t end = nullptr;     // NCCL stream, just after them
  cudaEvent_t waited = nullptr;  // compute stream, where wait() made it wait for `end`
  bool counted = false;          // wait() was called (the op is counted once, at the first wait)
  bool collected = false;        // its times are in stats_ and its events destroyed
};

class NcclCommunicator final : public CudaCommunicatorBase {
 public:
  explicit NcclCommunicator(std::unique_ptr<Communicator> mpi) : CudaCommunicatorBase(std::move(mpi), "nccl") {
    // Rank 0 makes the id that names this NCCL communicator; MPI carries it to everyone.
    // The group's rank 0 makes the id that names this NCCL communicator; the group's MPI communicator
    // carries it to the others.
    ncclUniqueId id;
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    mpi_->broadcast_bytes(&id, sizeof id, 0);
    absorb_mpi_stats();
    // Non-blocking: this stream never synchronises implicitly with the legacy default stream; its
    // ordering with the compute stream is exactly the events described at the top of the file.
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
    // NCCL has no barrier; barrier_async all-reduces this one float instead.
    barrier_value_ = static_cast<float*>(device_alloc(sizeof(float), MemCategory::CommBuffers, Device::CUDA));
    // The trace's clock conversion (top of the file): a stream that never gets work, so that an event
    // recorded on it completes at once, and the anchor event.
    CUDA_CHECK(cudaStreamCreateWithFlags(&clock_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&anchor_));
    anchor_clock();
  }

  // Lets every issued collective finish (peers are finishing the same ones), then tears down.
  ~NcclCommunicator() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (auto& op : in_flight_) destroy_events(*op);
    in_flight_.clear();
    NCCL_CHECK(ncclCommFinalize(comm_));
    NCCL_CHECK(ncclCommDestroy(comm_));
    CUDA_CHECK(cudaStreamDestroy(stream_));
    CUDA_CHECK(cudaEventDestroy(anchor_));
    CUDA_CHECK(cudaStreamDestroy(clock_stream_));
    device_free(barrier_value_);
  }

  std::unique_ptr<Communicator> split_group(int color, int key, const std::string& group) override {
    return std::make_unique<NcclCommunicator>(mpi_->split(color, key, group));
  }

  CommHandle all_reduce_async(Tensor buf, ReduceOp op) override {
    if (buf.device == Device::CPU) return over_mpi(mpi_->all_reduce_async(buf, op));
    if (size_ == 1) return alone(CollectiveKind::AllReduce, int64_t(buf.bytes()));
    void* data = buf.data;
    const size_t n = size_t(buf.numel());
    const ncclDataType_t type = nccl_type(buf.dtype);
    return issue(CollectiveKind::AllReduce, "all_reduce", int64_t(buf.bytes()), even(CollectiveKind::AllReduce, buf.bytes()), [=](cudaStream_t s) {
      NCCL_CHECK(ncclAllReduce(data, data, n, type, nccl_op(op), comm_, s));
    });
  }

  CommHandle reduce_scatter_async(Tensor send, Tensor recv, ReduceOp op) override {
    if (device_of(send, recv, "reduce_scatter") == Device::CPU)
      return over_mpi(mpi_->reduce_scatter_async(send, recv, op));
    ENSURE(send.numel() == int64_t(size_) * recv.numel(), "reduce_scatter: send must hold size() x recv elements");
    ensure_disjoint(send, recv, "reduce_scatter");
    if (size_ == 1) return alone(CollectiveKind::ReduceScatter, int64_t(send.bytes()), recv, send);
    const void* in = send.data;
    void* out = recv.data;
    const size_t n = size_t(recv.numel());
    const ncclDataType_t type = nccl_type(send.dtype);
    return issue(CollectiveKind::ReduceScatter, "reduce_scatter", int64_t(send.bytes()),
                 even(CollectiveKind::ReduceScatter, send.bytes()),
                 [=](cudaStream_t s) { NCCL_CHECK(ncclReduceScatter(in, out, n, type, nccl_op(op), comm_, s)); });
  }

  CommHandle all_gather_async(Tensor send, Tensor recv) override {
    if (device_of(send, recv, "all_gather") == Device::CPU) return over_mpi(mpi_->all_gather_async(send, recv));
    ENSURE(recv.numel() == int64_t(size_) * send.numel(), "all_gather: recv must hold size() x send elements");
    ensure_gather_buffers(send, recv, int64_t(rank_) * send.numel(), "all_gather");  // NCCL handles in place too
    if (size_ == 1) return alone(CollectiveKind::AllGather, int64_t(recv.bytes()), recv, send);
    const void* in = send.data;
    void* out = recv.data;
    const size_t n = size_t(send.numel());
    const ncclDataType_t type = nccl_type(send.dtype);
    return issue(CollectiveKind::AllGather, "all_gather", int64_t(recv.bytes()), even(CollectiveKind::AllGather, recv.bytes()),
                 [=](cudaStream_t s) { NCCL_CHECK(ncclAllGather(in, out, n, type, comm_, s)); });
  }

  // NCCL has no variable-count reduce-scatter: one ncclReduce per segment, to the rank that owns it,
  // inside one group (ncclGroupStart/End), so that NCCL runs them as a single operation. Ranks with
  // an empty segment are skipped; counts are the same on every rank, so every rank skips alike.
  CommHandle reduce_scatter_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts,
                                    ReduceOp op) override {
    if (device_of(send, recv, "reduce_scatter_v") == Device::CPU)
      return over_mpi(mpi_->reduce_scatter_v_async(send, recv, counts, op));
    const std::vector<int64_t> displs = displacements(counts, size_, "reduce_scatter_v");
    ENSURE(send.numel() == displs.back() + counts.back(), "reduce_scatter_v: send must hold sum(counts) elements");
    ENSURE(recv.numel() == counts[rank_], "reduce_scatter_v: recv must hold counts[rank()] elements");
    ensure_disjoint(send, recv, "reduce_scatter_v");
    if (size_ == 1) return alone(CollectiveKind::ReduceScatter, int64_t(send.bytes()), recv, send);
    const char* in = static_cast<const char*>(send.data);
    const size_t element = dtype_size(send.dtype);
    const ncclDataType_t type = nccl_type(send.dtype);
    const int64_t payload = int64_t(send.bytes());
    return issue(CollectiveKind::ReduceScatter, "reduce_scatter_v", payload,
                 by_counts(CollectiveKind::ReduceScatter, counts, element), [&](cudaStream_t s) {
      NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; r++) {
        if (counts[r] == 0) continue;
        const void* segment = in + size_t(displs[r]) * element;
        // recvbuff is used on the root only; elsewhere any valid address will do.
        void* result = r == rank_ ? recv.data : const_cast<void*>(segment);
        NCCL_CHECK(ncclReduce(segment, result, size_t(counts[r]), type, nccl_op(op), r, comm_, s));
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }

  // Likewise: one ncclBroadcast per segment, from the rank that owns it, in one group. The owner's
  // broadcast runs in place when send already is its segment of recv.
  CommHandle all_gather_v_async(Tensor send, Tensor recv, const std::vector<int64_t>& counts) override {
    if (device_of(send, recv, "all_gather_v") == Device::CPU)
      return over_mpi(mpi_->all_gather_v_async(send, recv, counts));
    const std::vector<int64_t> displs = displacements(counts, size_, "all_gather_v");
    ENSURE(send.numel() == counts[rank_], "all_gather_v: send must hold counts[rank()] elements");
    ENSURE(recv.numel() == displs.back() + counts.back(), "all_gather_v: recv must hold sum(counts) elements");
    ensure_gather_buffers(send, recv, displs[rank_], "all_gather_v");
    if (size_ == 1) return alone(CollectiveKind::AllGather, int64_t(recv.bytes()), recv, send);
    char* out = static_cast<char*>(recv.data);
    const size_t element = dtype_size(recv.dtype);
    const ncclDataType_t type = nccl_type(recv.dtype);
    return issue(CollectiveKind::AllGather, "all_gather_v", int64_t(recv.bytes()),
                 by_counts(CollectiveKind::AllGather, counts, element), [&](cudaStream_t s) {
      NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; r++) {
        if (counts[r] == 0) continue;
        void* segment = out + size_t(displs[r]) * element;
        const void* source = r == rank_ ? send.data : segment;  // sendbuff is read on the root only
        NCCL_CHECK(ncclBroadcast(source, segment, size_t(counts[r]), type, r, comm_, s));
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }

  // NCCL has no all-to-all call: one ncclSend and one ncclRecv per peer (this rank included, which
  // NCCL copies locally), inside one group, so that every pair progresses at once. Empty segments
  // are skipped; both sides know the counts (comm.h), so a skipped send meets a skipped receive.
  CommHandle all_to_all_async(Tensor send, Tensor recv) override {
    if (device_of(send, recv, "all_to_all") == Device::CPU) return over_mpi(mpi_->all_to_all_async(send, recv));
    ENSURE(send.numel() == recv.numel() && send.numel() % size_ == 0,
           "all_to_all: send and recv must each hold size() chunks of the same number of elements");
    ensure_disjoint(send, recv, "all_to_all");
    if (size_ == 1) return alone(CollectiveKind::AllToAll, int64_t(send.bytes()), recv, send);
    const std::vector<int64_t> counts(size_t(size_), send.numel() / size_);
    return exchange("all_to_all", send, counts, recv, counts, even(CollectiveKind::AllToAll, send.bytes()), -1);
  }

  CommHandle all_to_all_v_async(Tensor send, const std::vector<int64_t>& send_counts, Tensor recv,
                                const std::vector<int64_t>& recv_counts) override {
    if (device_of(send, recv, "all_to_all_v") == Device::CPU)
      return over_mpi(mpi_->all_to_all_v_async(send, send_counts, recv, recv_counts));
    const std::vector<int64_t> send_displs = displacements(send_counts, size_, "all_to_all_v (send_counts)");
    const std::vector<int64_t> recv_displs = displacements(recv_counts, size_, "all_to_all_v (recv_counts)");
    ENSURE(send.numel() == send_displs.back() + send_counts.back(), "all_to_all_v: send must hold sum(send_counts) elements");
    ENSURE(recv.numel() == recv_displs.back() + recv_counts.back(), "all_to_all_v: recv must hold sum(recv_counts) elements");
    ENSURE(send_counts[rank_] == recv_counts[rank_],
           "all_to_all_v: this rank's own segment must have the same count in send_counts and recv_counts");
    ensure_disjoint(send, recv, "all_to_all_v");
    if (size_ == 1) return alone(CollectiveKind::AllToAll, int64_t(send.bytes()), recv, send);
    const int64_t element = int64_t(dtype_size(send.numel() > 0 ? send.dtype : recv.dtype));
    const Traffic traffic{(send.numel() - send_counts[rank_]) * element, (recv.numel() - recv_counts[rank_]) * element};
    return exchange("all_to_all_v", send, send_counts, recv, recv_counts, traffic,
                    all_to_all_v_link_bytes(traffic.sent, traffic.received, size_));
  }

  CommHandle broadcast_async(Tensor buf, int root) override {
    ENSURE(root >= 0 && root < size_, "broadcast: root out of range");
    if (buf.device == Device::CPU) return over_mpi(mpi_->broadcast_async(buf, root));
    if (size_ == 1) return alone(CollectiveKind::Broadcast, int64_t(buf.bytes()));
    void* data = buf.data;
    const size_t n = size_t(buf.numel());
    const ncclDataType_t type = nccl_type(buf.dtype);
    const int64_t bytes = int64_t(buf.bytes());
    return issue(CollectiveKind::Broadcast, "broadcast", bytes, {bytes, rank_ == root ? 0 : bytes},
                 [=](cudaStream_t s) { NCCL_CHECK(ncclBroadcast(data, data, n, type, root, comm_, s)); });
  }

  // NCCL has no tags: `tag` orders nothing here (comm.h).
  CommHandle send_async(Tensor buf, int peer, int tag) override {
    ENSURE(peer >= 0 && peer < size_, "send: peer out of range");
    if (buf.device == Device::CPU) return over_mpi(mpi_->send_async(buf, peer, tag));
    const void* data = buf.data;
    const size_t n = size_t(buf.numel());
    const ncclDataType_t type = nccl_type(buf.dtype);
    return issue(CollectiveKind::SendRecv, "send", int64_t(buf.bytes()), {int64_t(buf.bytes()), 0},
                 [=](cudaStream_t s) { NCCL_CHECK(ncclSend(data, n, type, peer, comm_, s)); });
  }

  CommHandle recv_async(Tensor buf, int peer, int tag) override {
    ENSURE(peer >= 0 && peer < size_, "recv: peer out of range");
    if (buf.device == Device::CPU) return over_mpi(mpi_->recv_async(buf, peer, tag));
    void* data = buf.data;
    const size_t n = size_t(buf.numel());
    const ncclDataType_t type = nccl_type(buf.dtype);
    return issue(CollectiveKind::SendRecv, "recv", int64_t(buf.bytes()), {0, int64_t(buf.bytes())},
                 [=](cudaStream_t s) { NCCL_CHECK(ncclRecv(data, n, type, peer, comm_, s)); });
  }

  // One group call: every send and receive of `ops` progresses at once (comm.h). Counted as one
  // point-to-point op with their bytes; the emulated link holds the group for its largest send, as
  // messages to different peers, or in the two directions of a link, travel side by side.
  CommHandle send_recv_async(const std::vector<PointToPoint>& ops) override {
    if (ops.empty() || ops[0].buf.device == Device::CPU) return Communicator::send_recv_async(ops);
    int64_t sent = 0, received = 0, largest_send = 0;
    for (const PointToPoint& op : ops) {
      ENSURE(op.peer >= 0 && op.peer < size_, "send_recv: peer out of range");
      ENSURE(op.buf.device == Device::CUDA, "send_recv: every buffer of a group on the GPU");
      const int64_t bytes = int64_t(op.buf.bytes());
      (op.send ? sent : received) += bytes;
      if (op.send) largest_send = std::max(largest_send, bytes);
    }
    const std::vector<PointToPoint> group = ops;
    return issue(CollectiveKind::SendRecv, "send_recv", sent + received, {sent, received},
                 [this, group](cudaStream_t s) {
                   NCCL_CHECK(ncclGroupStart());
                   for (const PointToPoint& op : group) {
                     const size_t n = size_t(op.buf.numel());
                     const ncclDataType_t type = nccl_type(op.buf.dtype);
                     if (op.send)
                       NCCL_CHECK(ncclSend(op.buf.data, n, type, op.peer, comm_, s));
                     else
                       NCCL_CHECK(ncclRecv(op.buf.data, n, type, op.peer, comm_, s));
                   }
                   NCCL_CHECK(ncclGroupEnd());
                 },
                 largest_send);
  }

  bool matches_by_tag() const override { return false; }

  // A barrier holds the host, as MPI's does: save_checkpoint relies on it (no rank goes on before
  // rank 0 has written the file). The all-reduce finishes only once every rank has issued it, and
  // wait() blocks the host until it has (the compute stream waits for it, the host for that stream).
  // Its blocked time is the compute stream's stall, counted as exposed like any other op's.
  CommHandle barrier_async() override {
    if (size_ == 1) return alone(CollectiveKind::Barrier, 0);
    float* value = barrier_value_;
    CommHandle device = issue(CollectiveKind::Barrier, "barrier", 0, {0, 0}, [=](cudaStream_t s) {
      NCCL_CHECK(ncclAllReduce(value, value, 1, ncclFloat, ncclSum, comm_, s));
    });
    return CommHandle([this, device]() mutable {
      device.wait();
      cuda::synchronize();  // (watched: watchdog.h)
      collect_times();
    });
  }

  double all_reduce_scalar(double value, ReduceOp op) override {
    collect_times();
    return CudaCommunicatorBase::all_reduce_scalar(value, op);
  }

  // Host memory over MPI; device memory over NCCL, ordered like any collective (the compute stream
  // waits for it), so ops queued after the call see the bytes.
  void broadcast_bytes(void* data, size_t bytes, int root) override {
    ENSURE(root >= 0 && root < size_, "broadcast_bytes: root out of range");
    if (bytes == 0 || !is_device_memory(data)) {
      mpi_->broadcast_bytes(data, bytes, root);
      absorb_mpi_stats();
      return;
    }
    const int64_t n = int64_t(bytes);
    issue(CollectiveKind::Broadcast, "broadcast_bytes", n, {n, rank_ == root ? 0 : n}, [=](cudaStream_t s) {
      NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, s));
    }).wait();
  }

 private:
  // Queues `collective` on the NCCL stream after the compute stream's work so far, between the two
  // timing events (and, while the link model is on, between the two kernels of the link delay), and
  // returns its handle.
  // A collective of one rank: nothing to exchange, no time (as in comm_mpi.cpp), only the copy where
  // the result goes to another buffer, queued on the compute stream.
  CommHandle alone(CollectiveKind kind, int64_t payload_bytes, Tensor to = Tensor(), Tensor from = Tensor()) {
    stats_.kind[int(kind)].launched += 1;
    if (from.numel() > 0 && from.data != to.data) copy_tensor(to, from);
    return CommHandle([this, kind, payload_bytes, counted = false]() mutable {
      if (counted) return;
      counted = true;
      stats_.kind[int(kind)].calls += 1;
      stats_.kind[int(kind)].payload_bytes += payload_bytes;
    });
  }

  // What one rank sends and receives, as comm_mpi.cpp counts it: an even split, or by counts.
  struct Traffic {
    int64_t sent = 0, received = 0;
  };
  Traffic even(CollectiveKind kind, size_t payload) const {
    const int64_t wire = wire_bytes_for(kind, int64_t(payload), size_);
    return {wire, wire};
  }
  Traffic by_counts(CollectiveKind kind, const std::vector<int64_t>& counts, size_t element) const {
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    const int64_t others = (total - counts[rank_]) * int64_t(element);
    const int64_t own_from_peers = (size_ - 1) * counts[rank_] * int64_t(element);
    if (kind == CollectiveKind::ReduceScatter) return {others, own_from_peers};
    return {own_from_peers, others};
  }

  // The all-to-alls: segment r of send to rank r, segment r of recv from rank r, one group call.
  CommHandle exchange(const char* name, Tensor send, const std::vector<int64_t>& send_counts, Tensor recv,
                      const std::vector<int64_t>& recv_counts, Traffic traffic, int64_t link_bytes) {
    const DType dtype = send.numel() > 0 ? send.dtype : recv.dtype;
    const size_t element = dtype_size(dtype);
    const ncclDataType_t type = nccl_type(dtype);
    const char* in = static_cast<const char*>(send.data);
    char* out = static_cast<char*>(recv.data);
    return issue(CollectiveKind::AllToAll, name, int64_t(send.bytes()), traffic, [&](cudaStream_t s) {
      NCCL_CHECK(ncclGroupStart());
      int64_t sent = 0, received = 0;
      for (int r = 0; r < size_; r++) {
        if (send_counts[r] > 0)
          NCCL_CHECK(ncclSend(in + size_t(sent) * element, size_t(send_counts[r]), type, r, comm_, s));
        if (recv_counts[r] > 0)
          NCCL_CHECK(ncclRecv(out + size_t(received) * element, size_t(recv_counts[r]), type, r, comm_, s));
        sent += send_counts[r];
        received += recv_counts[r];
      }
      NCCL_CHECK(ncclGroupEnd());
    }, link_bytes);
  }

  // link_bytes: what the emulated link holds the op for (-1: its payload).
  CommHandle issue(CollectiveKind kind, const char* name, int64_t payload_bytes, Traffic traffic,
                   const std::function<void(cudaStream_t)>& collective, int64_t link_bytes = -1) {
    collect_times();
    auto op = std::make_shared<NcclOp>();
    op->kind = kind;
    op->name = name;
    op->payload_bytes = payload_bytes;
    if (size_ > 1) {
      op->sent_bytes = traffic.sent;
      op->received_bytes = traffic.received;
    }
    stats_.kind[int(kind)].launched += 1;

    // The input is produced by ops queued on the compute stream: the NCCL stream waits for them.
    cudaEvent_t ready;
    CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ready, cuda::stream()));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    CUDA_CHECK(cudaEventDestroy(ready));  // allowed before it completes: released once the GPU passes it

    CUDA_CHECK(cudaEventCreate(&op->start));
    CUDA_CHECK(cudaEventCreate(&op->end));
    // The link model of this moment (set_link_model belongs to this thread, as in comm_mpi.cpp).
    // A receive (sends nothing) is not held: the sender's hold covers its message.
    const bool receive = kind == CollectiveKind::SendRecv && traffic.sent == 0;
    const double link_ms = receive ? 0.0 : modelled_ms(link_, kind, link_bytes >= 0 ? link_bytes : payload_bytes, size_);
    CUDA_CHECK(cudaEventRecord(op->start, stream_));
    if (link_ms > 0) hold_stream(stream_, link_ms);  // the link holds the message before it enters
    collective(stream_);
    CUDA_CHECK(cudaEventRecord(op->end, stream_));
    in_flight_.push_back(op);
    return CommHandle([this, op] { wait_for(*op); });
  }

  // The body of handle.wait(): the compute stream waits for the collective; the host does not.
  void wait_for(NcclOp& op) {
    if (op.collected) return;  // finished and collected: nothing left to wait for
    if (!op.counted) {
      op.counted = true;
      stats_.kind[int(op.kind)].count_op(op.payload_bytes, op.sent_bytes, op.received_bytes);
      // Recorded before the wait is queued: the stall of the compute stream is end - waited.
      CUDA_CHECK(cudaEventCreate(&op.waited));
      CUDA_CHECK(cudaEventRecord(op.waited, cuda::stream()));
    }
    CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(), op.end, 0));
    collect_times();
  }

  // True once the GPU has passed `event`; never blocks.
  static bool completed(cudaEvent_t event) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaErrorNotReady) return false;
    CUDA_CHECK(status);
    return true;
  }

  void collect_stats() override { collect_times(); }

  // Adds busy and exposed times of the waited ops whose events the GPU has passed, records their
  // trace spans, then forgets them.
  void collect_times() {
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      NcclOp& op = **it;
      if (!op.counted || !completed(op.end) || !completed(op.waited)) {
        ++it;
        continue;
      }
      float busy = 0, stall = 0;
      CUDA_CHECK(cudaEventElapsedTime(&busy, op.start, op.end));
      CUDA_CHECK(cudaEventElapsedTime(&stall, op.waited, op.end));
      if (tracing_enabled()) {
        if (now_ms() - anchor_host_ms_ > kAnchorRenewMs) anchor_clock();
        const double end_ms = host_ms(op.end);
        trace_span(group_ == "tp" ? Track::TensorParallel : Track::Comm, op.name, end_ms - busy, end_ms,
                   std::to_string(op.payload_bytes) + " B, NCCL");
        if (stall > 0)
          trace_span(Track::Wait, std::string("wait ") + op.name, end_ms - stall, end_ms);  // (the op's span's name)
      }
      stats_.kind[int(op.kind)].busy_ms += busy;
      // The collectives run one after another on the one NCCL stream, so their intervals never
      // overlap and the time anything was in flight is the sum of their busy times. (Ops of CPU
      // tensors, over MPI, are added as MPI counts them; an overlap between the two is not removed.)
      stats_.in_flight_ms += busy;
      stats_.exposed_ms += std::max(0.0f, stall);  // negative: the result was there before it was needed
      stats_.kind[int(op.kind)].exposed_ms += std::max(0.0f, stall);
      destroy_events(op);
      op.collected = true;
      it = in_flight_.erase(it);
    }
  }

  // Takes the anchor's host time as the middle of the interval in which the GPU stamped it.
  void anchor_clock() {
    const double before_ms = now_ms();
    CUDA_CHECK(cudaEventRecord(anchor_, clock_stream_));
    CUDA_CHECK(cudaEventSynchronize(anchor_));
    anchor_host_ms_ = 0.5 * (before_ms + now_ms());
  }

  // The host time (now_ms()) at which the GPU passed `event`, a completed event.
  double host_ms(cudaEvent_t event) const {
    float since_anchor = 0;
    CUDA_CHECK(cudaEventElapsedTime(&since_anchor, anchor_, event));
    return anchor_host_ms_ + since_anchor;
  }

  static void destroy_events(NcclOp& op) {
    for (cudaEvent_t* e : {&op.start, &op.end, &op.waited}) {
      if (*e) CUDA_CHECK(cudaEventDestroy(*e));
      *e = nullptr;
    }
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* barrier_value_ = nullptr;
  std::list<std::shared_ptr<NcclOp>> in_flight_;  // issued, times not yet collected

  // The trace's clock conversion. Renewed after 10 s: by then a float of milliseconds resolves 1 us.
  static constexpr double kAnchorRenewMs = 10e3;
  cudaStream_t clock_stream_ = nullptr;  // never given work
  cudaEvent_t anchor_ = nullptr;
  double anchor_host_ms_ = 0;            // now_ms() when the GPU passed anchor_
};

#endif  // GPT_WITH_NCCL

}  // namespace

// ---------------------------------------------------------------------------------------------
// The factory

std::unique_ptr<Communicator> create_cuda_communicator(std::unique_ptr<Communicator> mpi) {
  const int rank = mpi->rank();
  std::string why;
  const int devices = cuda_device_count(&why);
  if (devices == 0) fatal("a CUDA run, but this rank can use no GPU: " + why);

  // The node-local rank: MPI_COMM_TYPE_SHARED groups the ranks that can share memory, i.e. a node.
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int local_rank = 0, local_size = 1;
  MPI_CHECK(MPI_Comm_rank(node, &local_rank));
  MPI_CHECK(MPI_Comm_size(node, &local_size));
  const int device = local_rank % devices;
  CUDA_CHECK(cudaSetDevice(device));  // before the first op creates the compute stream on it

  // Do two ranks of this node hold one GPU? Compared by the GPUs' UUIDs, not by device numbers: a
  // launcher that gives each rank its own CUDA_VISIBLE_DEVICES makes every rank's GPU "device 0".
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::vector<cudaUUID_t> uuids(static_cast<size_t>(local_size));
  MPI_CHECK(MPI_Allgather(&prop.uuid, int(sizeof(cudaUUID_t)), MPI_BYTE, uuids.data(), int(sizeof(cudaUUID_t)),
                          MPI_BYTE, node));
  MPI_CHECK(MPI_Comm_free(&node));
  int ranks_per_gpu = 0;  // the most ranks of this node on one GPU
  for (const cudaUUID_t& a : uuids) {
    const auto same = std::count_if(uuids.begin(), uuids.end(), [&](const cudaUUID_t& b) {
      return std::memcmp(a.bytes, b.bytes, sizeof a.bytes) == 0;
    });
    ranks_per_gpu = std::max(ranks_per_gpu, int(same));
  }
  // Every rank must choose alike: a rank that enters ncclCommInitRank while another does not would
  // wait there forever.
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ranks_per_gpu, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  set_ranks_per_gpu(ranks_per_gpu);  // for the memory check: they share the GPU's memory
#ifndef GPT_WITH_NCCL
  if (rank == 0) {
    std::printf("note: built without NCCL (nccl.h was not found), so CUDA tensors travel through host memory over "
                "MPI (device->host copy, MPI, host->device copy): correct, but slow and without overlap.\n");
    std::fflush(stdout);
  }
  return cuda_comm::make_host_staged_communicator(std::move(mpi));
#else
  if (ranks_per_gpu > 1) {
    if (rank == 0) {
      std::printf("note: %d ranks share one GPU (rank 0's node runs %d ranks on %d GPU%s). NCCL needs one GPU per "
                  "rank, so CUDA tensors travel through host memory over MPI instead (device->host copy, MPI, "
                  "host->device copy): correct, but slow and without overlap.\n",
                  ranks_per_gpu, local_size, devices, devices == 1 ? "" : "s");
      std::fflush(stdout);
    }
    return cuda_comm::make_host_staged_communicator(std::move(mpi));
  }
  return std::make_unique<NcclCommunicator>(std::move(mpi));
#endif
}

#endif  // GPT_WITH_CUDA
