// comm_p2p.h: a communicator whose all-reduces, reduce-scatters and all-gathers are chapter 00's,
// built from send and receive (p2p_collectives.h), over any other communicator (MPI, NCCL,
// host-staged). Defines CollectivesChoice, parse_collectives() and with_collectives(), which a
// chapter's `--collectives ours|ring|...|library` applies to its world communicator.
//
// Everything else (point to point, all-to-all, broadcast, scalars, agree_or_die) goes to the inner
// communicator unchanged. The algorithms' messages travel on a group of their own, split from the
// inner one, so their tag can never meet a pipeline's or a ring attention's. What they send is
// counted under the collective's kind (AllReduce, ReduceScatter, AllGather), as the library's would
// be: the chapters' reports and the tests read the same counters either way.
//
// One difference: the library's collectives progress in the background while the caller computes;
// these run to completion when issued (the caller's thread drives every step), so the overlap that
// chapters 02-06 teach is lost under them, and their time all counts as exposed. The losses are the
// library's, within the rounding of another summation order.
#pragma once
#include <memory>
#include <string>

#include "comm.h"
#include "p2p_collectives.h"

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

// `inner` itself for the library; else a communicator over it (and over every group split from it)
// that runs the collectives from send and receive.
std::unique_ptr<Communicator> with_collectives(const CollectivesChoice& choice, std::unique_ptr<Communicator> inner);
