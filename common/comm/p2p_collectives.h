// p2p_collectives.h: all-reduce, reduce-scatter and all-gather built from nothing but a
// communicator's point-to-point send and receive: chapter 00's lesson (00_collectives), and what
// `--collectives ours` runs in every chapter. Defines Algorithm, the three collectives under each
// algorithm that has them, the binomial tree's reduce and broadcast, and each algorithm's cost in
// the alpha-beta-gamma model (docs/theory.md, section 15).
//
// The algorithms, and what each one costs for n bytes on N ranks (alpha: a message's latency; beta:
// seconds per byte on the wire; gamma: seconds per byte to reduce):
//   Ring               reduce-scatter / all-gather: (N-1) alpha + (N-1)/N n beta (+ (N-1)/N n gamma)
//                      all-reduce: the two in sequence, twice that (the gamma term once)
//   HalvingDoubling    Rabenseifner's all-reduce: a reduce-scatter by recursive halving, then an
//                      all-gather by recursive doubling: 2 lg N alpha + 2 (N-1)/N n beta + (N-1)/N n gamma
//   RecursiveDoubling  all-reduce: lg N steps, each exchanging the whole vector with the partner at
//                      distance 2^k and reducing: lg N (alpha + n beta + n gamma). Also all-gather.
//   BinomialTree       reduce to rank 0 then broadcast from it, each lg N steps of the whole vector:
//                      about 2 lg N (alpha + n beta) (+ lg N n gamma)
// Ranks that are not a power of two (halving-doubling, recursive doubling) are folded as MPICH folds
// them: with p the largest power of two <= N and r = N - p, each of the first r even ranks hands its
// vector to the odd rank after it and sits out; the p that remain run the algorithm; at the end the
// odd ranks hand the result back. That costs one more step each way, and the cost functions count it.
//
// Every tensor may live on the CPU (fp32 or bf16) or, through a device communicator, on the GPU (Sum
// and Avg there). Lengths need not divide by N: the ring and the halving split a vector into N
// segments whose sizes differ by at most one element. Every rank ends with bit-identical results.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"

enum class Algorithm { Ring, HalvingDoubling, RecursiveDoubling, BinomialTree };
constexpr Algorithm kAllAlgorithms[] = {Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::RecursiveDoubling,
                                        Algorithm::BinomialTree};
const char* algorithm_name(Algorithm a);  // "ring", "halving-doubling", "recursive-doubling", "binomial-tree"
bool parse_algorithm(const std::string& name, Algorithm* out);
// Whether `a` implements collective `kind` (AllReduce, ReduceScatter, AllGather) here.
bool algorithm_has(Algorithm a, CollectiveKind kind);

// In place over buf, every rank ending with the reduction of every rank's buf.
void p2p_all_reduce(Communicator& comm, Tensor buf, ReduceOp op, Algorithm a);
// send holds N segments, recv this rank's: the reduction of segment rank(). Ring and
// HalvingDoubling. `counts` are the segments' sizes (comm.h's variable-count forms); empty, they are
// segment_counts(send.numel(), N), even where N divides the length.
void p2p_reduce_scatter(Communicator& comm, Tensor send, Tensor recv, ReduceOp op, Algorithm a,
                        const std::vector<int64_t>& counts = {});
// send holds this rank's segment, recv all N in rank order (in place when send is recv's own segment,
// as comm.h allows). Ring and RecursiveDoubling. `counts` as above, of recv.
void p2p_all_gather(Communicator& comm, Tensor send, Tensor recv, Algorithm a, const std::vector<int64_t>& counts = {});
// The binomial tree's halves: the reduction of every rank's buf lands in root's buf (the others'
// bufs hold partial sums afterwards); and root's buf copied to every rank.
void p2p_reduce(Communicator& comm, Tensor buf, ReduceOp op, int root);
void p2p_broadcast(Communicator& comm, Tensor buf, int root);

// The scratch the algorithms allocate for one collective of `payload_bytes` (communication buffers,
// freed when it returns): at most twice the payload, a reduce-scatter's working copy of its input and
// the segment arriving beside it (a ring all-reduce needs a segment only; doubling and the tree a
// whole vector).
inline double p2p_scratch_bytes_at_most(double payload_bytes) { return 2 * payload_bytes; }

// How a vector of n elements splits over N ranks: segment r has n / N elements, one more for the
// first n % N ranks. Segments follow each other in rank order.
std::vector<int64_t> segment_counts(int64_t n, int ranks);

// The alpha-beta-gamma model of one collective of `bytes` on `ranks` ranks.
struct CostModel {
  double alpha_s = 0;          // latency of one message, seconds
  double beta_s_per_byte = 0;  // 1 / bandwidth of a link, seconds per byte
  double gamma_s_per_byte = 0; // reducing one byte into another, seconds per byte
};
double predicted_seconds(const CostModel& m, Algorithm a, CollectiveKind kind, int64_t bytes, int ranks);
// What rank `rank` sends in the collective, from closed forms over the segments: the bytes the
// communicator's SendRecv counters must show. For the ring, (N-1)/N of the vector in a
// reduce-scatter or an all-gather and twice that in its all-reduce, on every rank; the tree and the
// folded ranks of a non-power-of-two N send unequal shares.
int64_t predicted_sent_bytes(Algorithm a, CollectiveKind kind, int64_t bytes, int element_bytes, int ranks, int rank);
