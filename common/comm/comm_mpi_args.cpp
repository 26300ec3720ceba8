// comm_mpi_args.cpp: what an MPI call takes from an op (comm_mpi_args.h): MPI's types and ops (with
// bf16's and fp16's, which MPI lacks), the checks of an op's tensors, the counts of variable-count collectives,
// the Avg scaling, a local reduction, and what each rank sends and receives.
#include "comm/comm_mpi_args.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "ops/bf16.h"
#include "ops/float_formats.h"  // encode_float, decode_code: fp16 codes
#include "base/check.h"

namespace mpi_args {

namespace {

// bf16 tensors (the host-staged copies of mixed-precision GPU tensors, comm_nccl.cpp) travel as
// 16-bit words, MPI_UINT16_T, so every byte on the wire is what theory counts. MPI cannot add those
// words itself: reductions on them use user-defined ops that widen each pair to fp32, combine, and
// round back (bf16.h), as NCCL does on the GPU. Created once, after MPI_Init.
template <typename Combine>
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16_bits* a = static_cast<const bf16_bits*>(in);
  bf16_bits* b = static_cast<bf16_bits*>(inout);
  for (int i = 0; i < *len; i++) b[i] = float_to_bf16(Combine()(bf16_to_float(a[i]), bf16_to_float(b[i])));
}
// fp16 codes (a collective in fp16, wire_format.h) the same way, through float_formats.h.
template <typename Combine>
void fp16_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; i++)
    b[i] = encode_float(NumberFormat::FP16,
                        Combine()(decode_code(NumberFormat::FP16, a[i]), decode_code(NumberFormat::FP16, b[i])));
}
struct Add { float operator()(float a, float b) const { return a + b; } };
struct Larger { float operator()(float a, float b) const { return std::max(a, b); } };
struct Smaller { float operator()(float a, float b) const { return std::min(a, b); } };
MPI_Op g_bf16_sum = MPI_OP_NULL, g_bf16_max = MPI_OP_NULL, g_bf16_min = MPI_OP_NULL;
MPI_Op g_fp16_sum = MPI_OP_NULL, g_fp16_max = MPI_OP_NULL, g_fp16_min = MPI_OP_NULL;

}  // namespace

void create_bf16_ops() {
  if (g_bf16_sum != MPI_OP_NULL) return;
  MPI_CHECK(MPI_Op_create(&bf16_reduce<Add>, /*commute=*/1, &g_bf16_sum));
  MPI_CHECK(MPI_Op_create(&bf16_reduce<Larger>, 1, &g_bf16_max));
  MPI_CHECK(MPI_Op_create(&bf16_reduce<Smaller>, 1, &g_bf16_min));
  MPI_CHECK(MPI_Op_create(&fp16_reduce<Add>, 1, &g_fp16_sum));
  MPI_CHECK(MPI_Op_create(&fp16_reduce<Larger>, 1, &g_fp16_max));
  MPI_CHECK(MPI_Op_create(&fp16_reduce<Smaller>, 1, &g_fp16_min));
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT32_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::F32: break;
  }
  return MPI_FLOAT;
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  const bool bf16 = dtype == DType::BF16, fp16 = dtype == DType::F16;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return bf16 ? g_bf16_sum : fp16 ? g_fp16_sum : MPI_SUM;  // then scaled by 1/N: MPI has no average
    case ReduceOp::Max: return bf16 ? g_bf16_max : fp16 ? g_fp16_max : MPI_MAX;
    case ReduceOp::Min: return bf16 ? g_bf16_min : fp16 ? g_fp16_min : MPI_MIN;
  }
  return MPI_SUM;
}

// MPI counts are int. 2^31 - 1 floats is 8 GiB in one call, beyond any buffer this course builds.
int mpi_count(int64_t n) {
  ENSURE(n >= 0 && n <= INT_MAX, "more than INT_MAX elements in one MPI call");
  return int(n);
}

void ensure_cpu(const Tensor& t) {
  ENSURE(t.device == Device::CPU, "the MPI communicator moves CPU tensors; CUDA tensors need the NCCL or host-staged one");
  ENSURE(t.data != nullptr || t.numel() == 0, "tensor without memory");
}
// int32 (routing counts, moe.h) only travels: gathers, all-to-alls, broadcasts and messages.
void ensure_reducible(const Tensor& t) {
  ENSURE(t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16,
         "the MPI communicator reduces fp32, bf16 and fp16 tensors only");
}

// An empty side (a rank that owns none of a range passes Tensor()) has no dtype to compare.
void ensure_same_dtype(const Tensor& send, const Tensor& recv, const char* what) {
  if (send.numel() == 0 || recv.numel() == 0) return;
  ENSURE(send.dtype == recv.dtype, std::string(what) + ": send and recv differ in dtype");
}

// Whether two tensors share a byte. An empty tensor shares none, wherever its pointer points.
bool overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

// The buffer handed to MPI: null for an empty tensor. MPI touches no byte of it either way, but
// MPICH checks that a send and a receive buffer do not start at the same address, and an empty view
// may well start where the other buffer does.
void* mpi_buffer(const Tensor& t) { return t.numel() == 0 ? nullptr : t.data; }

// Whether an all-gather runs in place: `send` IS this rank's segment of `recv`, which starts
// `own_offset` elements in (comm.h). Then MPI takes this rank's contribution from recv (MPI_IN_PLACE).
// Any other overlap would have MPI read a segment while another rank's data overwrites it: ENSURE.
bool gather_in_place(const Tensor& send, const Tensor& recv, int64_t own_offset, const char* what) {
  if (send.numel() > 0 && send.data == recv.slice1d(own_offset, send.numel()).data) return true;
  ENSURE(!overlap(send, recv), std::string(what) + ": send overlaps recv without being this rank's own "
                               "segment of it; MPI forbids that (in place, send must be exactly that segment)");
  return false;
}

// The counts of a variable-count collective as MPI wants them, int, with the displacement of each
// segment. Checked, and copied: the caller's vector may die before the op is posted, and MPI reads
// these arrays until the op completes, so the op's lambda owns them.
VarCounts var_counts(const std::vector<int64_t>& counts, int ranks, const char* what) {
  ENSURE(int(counts.size()) == ranks, std::string(what) + ": counts must have one entry per rank");
  VarCounts v;
  for (int64_t c : counts) {
    ENSURE(c >= 0, std::string(what) + ": negative count");
    v.displs.push_back(mpi_count(v.total));
    v.counts.push_back(mpi_count(c));
    v.total += c;
  }
  mpi_count(v.total);  // every displacement fits an int only if the total does
  return v;
}

// What the engine runs after the MPI call for `op`: nothing, or for Avg the scaling of the sum by
// 1/N (one multiply per element, cheaper than a divide; tests expect exactly sum * (1.0f / N)), in
// fp32 and rounded once for bf16.
std::function<void()> average_if(ReduceOp op, const Tensor& t, int ranks) {
  if (op != ReduceOp::Avg || t.numel() == 0 || ranks == 1) return {};
  const float inv_ranks = 1.0f / float(ranks);
  const int64_t n = t.numel();
  if (t.dtype == DType::BF16) {
    bf16_bits* data = static_cast<bf16_bits*>(t.data);
    return [=] {
      for (int64_t i = 0; i < n; i++) data[i] = float_to_bf16(bf16_to_float(data[i]) * inv_ranks);
    };
  }
  if (t.dtype == DType::F16) {
    uint16_t* data = static_cast<uint16_t*>(t.data);
    return [=] {
      for (int64_t i = 0; i < n; i++)
        data[i] = encode_float(NumberFormat::FP16, decode_code(NumberFormat::FP16, data[i]) * inv_ranks);
    };
  }
  float* data = t.f32();
  return [=] {
    for (int64_t i = 0; i < n; i++) data[i] *= inv_ranks;
  };
}

// What one rank sends and receives in a collective whose payload (`element` bytes per element)
// splits into segments of `counts` over the group, segment r belonging to rank r: a reduce-scatter
// sends every other rank's segment to its owner and receives N-1 contributions to its own; an
// all-gather the reverse. An all-reduce is both. Even counts give the ring's (N-1)/N.
Traffic split_traffic(CollectiveKind kind, const std::vector<int64_t>& counts, int rank, int64_t element) {
  const int n = int(counts.size());
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const int64_t others = (total - counts[rank]) * element, own_from_peers = (n - 1) * counts[rank] * element;
  if (kind == CollectiveKind::ReduceScatter) return {others, own_from_peers};
  return {own_from_peers, others};  // all-gather
}
std::vector<int64_t> even_counts(int64_t total, int n) { return std::vector<int64_t>(n, total / n); }

// mine = theirs op mine, elementwise, as MPI_Reduce_local(theirs, mine, ...) does. A sum of floats or
// doubles is our own loop, which the compiler vectorizes: MPICH's takes about 8 instructions an
// element (callgrind: 8,700 for 4 KB, more than the rest of a small all-reduce's path on our side).
void reduce_into(void* mine, const void* theirs, int n, MPI_Datatype type, MPI_Op op) {
  if (op == MPI_SUM && type == MPI_FLOAT) {
    float* a = static_cast<float*>(mine);
    const float* b = static_cast<const float*>(theirs);
    for (int i = 0; i < n; i++) a[i] = b[i] + a[i];
  } else if (op == MPI_SUM && type == MPI_DOUBLE) {
    double* a = static_cast<double*>(mine);
    const double* b = static_cast<const double*>(theirs);
    for (int i = 0; i < n; i++) a[i] = b[i] + a[i];
  } else {
    MPI_CHECK(MPI_Reduce_local(theirs, mine, n, type, op));
  }
}

}  // namespace mpi_args
