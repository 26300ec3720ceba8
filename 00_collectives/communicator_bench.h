// communicator_bench.h: chapter 00's `--communicator` tables: our Communicator's blocking
// collectives against raw MPI, size by size, and one model's gradient all-reduced three ways (at
// once, in chapter 03's buckets, per tensor as chapter 02). Defines communicator_tables().
#pragma once
#include <cstdint>

#include "base/metrics.h"  // JsonLinesWriter
#include "comm/comm.h"

// Prints both tables on rank 0 (JSON lines too, where `json` is open), sizes from min_bytes to
// max_bytes, x4 apart, over `comm` as it is (its emulated link included). Collective: every rank
// calls it. Returns the wrong elements found by the exact checks over all ranks (0 expected).
int64_t communicator_tables(Communicator& comm, int64_t min_bytes, int64_t max_bytes, JsonLinesWriter& json);
