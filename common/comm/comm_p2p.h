// comm_p2p.h: a communicator whose all-reduces, reduce-scatters and all-gathers are chapter 00's,
// built from send and receive (p2p_collectives.h), over any other communicator (MPI, NCCL,
// host-staged). Defines CollectivesChoice, parse_collectives() and with_collectives(), which a
// chapter's `--collectives ours|ring|...|library` applies to its world communicator.
//
// Everything else (point to point, all-to-all, broadcast, scalars, agree_or_die) goes to the inner
// communicator unchanged. The algorithms' messages travel on a group of their own (the lane), split
// from the inner one, so their tag can never meet a pipeline's or a ring attention's. What they send
// is counted under the collective's kind (AllReduce, ReduceScatter, AllGather), as the library's
// would be: the chapters' reports and the tests read the same counters either way.
//
// Asynchronous, as the library's are. Each communicator owns one worker thread; an `_async` call
// queues its collective there and returns at once, and the handle's wait() blocks until the worker
// has run it. One worker a communicator, first in first out, so that its collectives run in issue
// order on every rank, as MPI requires; collectives of different groups (DP, TP, the embedding's)
// run side by side on theirs. A small blocking collective (up to kSmallAllReduceBytes: the norm's
// and the loss's scalars, a layer's small sums) skips the hand-off: when the worker is idle with
// nothing queued, the caller runs it on its own thread, claiming the lane so that order holds. While a worker sends and receives on its lane, the caller's thread may
// exchange its own messages on the inner communicator (a pipeline's activations): MPI is initialised
// with MPI_THREAD_MULTIPLE (comm.h), the lane is another MPI communicator, and only the worker ever
// touches it. So the overlap that 02-06 teach holds under these collectives too, and a pipeline's
// stage goes on sending activations while its gradients travel. Counted as the library's: `launched`
// at issue; calls and bytes at wait(); exposed, the caller's time blocked in wait(); in flight, the
// union of the collectives' intervals from issue to completion.
//
// On the GPU the worker selects the caller's device and queues its kernels on a stream of its own
// (cuda::use_stream_on_this_thread), which first waits for an event recorded on the caller's stream
// at issue (the input is written); wait() makes the caller's stream wait for an event recorded after
// the collective's last kernel, without blocking the host. One caveat there: NCCL's guide asks that
// operations of different communicators of one GPU reach it in the same order on every rank (its
// kernels wait for their peers, and a kernel that cannot be resident waits behind another). The
// worker queues the lane's kernels on its own schedule, beside the caller's on the inner
// communicator, as the framework's groups (DP, TP, the embedding's) already run side by side; where
// a GPU cannot keep both resident, a step could stall. The losses are the library's, within the
// rounding of another summation order.
#pragma once
#include <memory>
#include <string>

#include "comm/comm.h"
#include "comm/p2p_collectives.h"

struct CollectivesChoice {
  bool library = true;     // the inner communicator's own collectives
  bool by_size = false;    // ours, each call's algorithm chosen by size (below)
  Algorithm forced = Algorithm::Ring;  // ours, one algorithm for every call that it has
};
// "library", "ours" (by size: recursive doubling for all-reduces up to kSmallAllReduceBytes, the ring
// above and for every reduce-scatter and all-gather), or one algorithm's name (p2p_collectives.h),
// used for every collective it has (the ring for the others). False for anything else.
bool parse_collectives(const std::string& text, CollectivesChoice* out);
// MPICH's default threshold between its latency- and bandwidth-bound all-reduces is of this order.
constexpr int64_t kSmallAllReduceBytes = 64 * 1024;
// The algorithm `choice` runs for a collective of `kind` moving `bytes` (its payload on the wire):
// the rule above, which the communicator follows and the theory table predicts by (docs/theory.md,
// section 15). Not for the library.
Algorithm algorithm_for(const CollectivesChoice& choice, CollectiveKind kind, int64_t bytes);
// What rank `rank` of `ranks` sends in one collective of `kind` moving `bytes` (elements of
// `element_bytes`) under `choice`: the library's count (comm.h, wire_bytes_for), else the bytes of
// the algorithm algorithm_for picks (p2p_collectives.h, predicted_sent_bytes). Every byte row of the
// theory table that counts its calls one by one predicts by this (docs/theory.md, section 15).
int64_t collective_sent_bytes(const CollectivesChoice& choice, CollectiveKind kind, int64_t bytes, int element_bytes,
                              int ranks, int rank);

// `inner` itself for the library; else a communicator over it (and over every group split from it)
// that runs the collectives from send and receive.
std::unique_ptr<Communicator> with_collectives(const CollectivesChoice& choice, std::unique_ptr<Communicator> inner);
