// comm_mpi_args.h: what the MPI communicator (comm_mpi.cpp) hands an MPI call, apart from the
// communicator itself: the datatype and reduction of a tensor's dtype (bf16 included, through ops
// of our own), the checks of an op's tensors, the int counts and displacements MPI wants, the scaling
// that turns a sum into Avg, a local reduction (reduce_into), and the bytes each rank sends and
// receives in a collective. Defined in
// comm_mpi_args.cpp.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/comm.h"

namespace mpi_args {

// bf16's sum, max and min as MPI ops (MPI has no bf16): once, after MPI_Init.
void create_bf16_ops();
MPI_Datatype mpi_type(DType dtype);
MPI_Op mpi_op(ReduceOp op, DType dtype);
// n as MPI's int count, refused beyond INT_MAX.
int mpi_count(int64_t n);

void ensure_cpu(const Tensor& t);
void ensure_reducible(const Tensor& t);
void ensure_same_dtype(const Tensor& send, const Tensor& recv, const char* what);
// Whether two tensors share a byte (an empty tensor shares none).
bool overlap(const Tensor& a, const Tensor& b);
// The buffer handed to MPI: null for an empty tensor.
void* mpi_buffer(const Tensor& t);
// Whether an all-gather runs in place (`send` is this rank's segment of `recv`); any other overlap
// is refused.
bool gather_in_place(const Tensor& send, const Tensor& recv, int64_t own_offset, const char* what);

// The counts of a variable-count collective as MPI wants them, int, with each segment's displacement.
struct VarCounts {
  std::vector<int> counts, displs;
  int64_t total = 0;
};
VarCounts var_counts(const std::vector<int64_t>& counts, int ranks, const char* what);

// mine = theirs op mine, elementwise, as MPI_Reduce_local(theirs, mine, ...) does: where two ranks
// exchange their values (comm_mpi.cpp's submit_exchange). Sums of floats and doubles are our own.
void reduce_into(void* mine, const void* theirs, int n, MPI_Datatype type, MPI_Op op);

// Nothing, or for Avg the scaling of the sum by 1/N that the engine runs after the MPI call.
std::function<void()> average_if(ReduceOp op, const Tensor& t, int ranks);

// What one rank sends and receives in a reduce-scatter or all-gather of `counts` segments.
struct Traffic {
  int64_t sent = 0, received = 0;
};
Traffic split_traffic(CollectiveKind kind, const std::vector<int64_t>& counts, int rank, int64_t element);
std::vector<int64_t> even_counts(int64_t total, int n);

}  // namespace mpi_args
