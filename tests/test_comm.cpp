// test_comm.cpp: tests of the MPI communicator (comm_mpi.cpp, comm_engine.cpp, comm.cpp), run on several ranks:
//   mpiexec -n 2 ./test_comm && mpiexec -n 4 ./test_comm
// Data tests use exactly predictable values (rank r contributes r+1, or (r+1)(i+1) for element i):
// small integers, which fp32 sums exactly in any order, so no difference at all is allowed. Timing
// tests check what the communication thread promises: an async collective progresses while the
// caller computes, the emulated link takes at least its modelled time, waiting burns no CPU, and the
// in-flight time counts overlapping ops once. They leave wide margins, because 4 ranks share 2 cores
// here. The variable-count collectives get the uneven splits ZeRO makes, empty segments included.
#include <gtest/gtest.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ops/bf16.h"
#include "comm/comm.h"
#include "comm/comm_factory.h"  // communicator_for: the all-to-alls of CUDA tensors
#include "comm/lanes.h"         // LaneCommunicator: the two lanes of a pipeline's F&B pairs
#include "ops/device.h"        // cuda_device_count, transfer
#include "ops/memory.h"        // Buffer on the GPU
#include "mpi_test_env.h"
#include "comm/trace.h"
#include "comm/wire_format.h"  // CollectiveFormats: a recipe's formats on a communicator

namespace {

Tensor view(std::vector<float>& v) { return make_view(v.data(), {int64_t(v.size())}); }

// Exact comparison of a whole buffer; reports how many elements differ and the first of them.
testing::AssertionResult exactly(const std::vector<float>& got, const std::function<float(int64_t)>& expected) {
  int64_t mismatches = 0, first = -1;
  for (int64_t i = 0; i < int64_t(got.size()); i++)
    if (got[i] != expected(i) && mismatches++ == 0) first = i;
  if (mismatches == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure() << mismatches << " of " << got.size() << " elements differ; first at [" << first
                                     << "]: got " << got[first] << ", expected " << expected(first);
}

// Milliseconds on the machine's monotonic clock (steady_clock), which every process of one machine
// shares, unlike now_ms(), whose origin is each process's own. The tests' ranks run on one machine
// and compare such times to order their events: "rank 1 left after rank 0 entered" holds however
// the machine schedules them, where "rank 1 waited 100 ms from its own start" does not (a busy
// machine may start it late).
double machine_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// `value` as rank `from` has it, on every rank (a collective: every rank calls it).
double value_of_rank(Communicator& comm, int from, double value) {
  return comm.all_reduce_scalar(comm.rank() == from ? value : 0.0, ReduceOp::Sum);
}

// Keeps the core busy for `ms`, as a compute kernel would.
void compute_for(double ms) {
  const double until = now_ms() + ms;
  volatile double sink = 0;
  while (now_ms() < until)
    for (int i = 0; i < 1000; i++) sink = sink + 1.0;
}

double process_cpu_ms() {  // CPU time of every thread of this process
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

CollectiveCounters delta(const CommStats& after, const CommStats& before, CollectiveKind k) {
  const CollectiveCounters &a = after.kind[int(k)], &b = before.kind[int(k)];
  CollectiveCounters d;
  d.calls = a.calls - b.calls;
  d.launched = a.launched - b.launched;
  d.payload_bytes = a.payload_bytes - b.payload_bytes;
  d.sent_bytes = a.sent_bytes - b.sent_bytes;
  d.received_bytes = a.received_bytes - b.received_bytes;
  d.busy_ms = a.busy_ms - b.busy_ms;
  return d;
}

// Counts for the variable-count collectives that no uniform split gives: a repeating pattern with an
// empty segment, times `scale`. N=2: {5, 0}; N=3: {5, 0, 3}; N=4: {5, 0, 3, 1} (x scale).
std::vector<int64_t> uneven_counts(int N, int64_t scale) {
  const int64_t pattern[] = {5, 0, 3, 1};
  std::vector<int64_t> counts(N);
  for (int r = 0; r < N; r++) counts[r] = pattern[r % 4] * scale;
  return counts;
}

// Where segment r begins: counts[0] + ... + counts[r-1].
int64_t offset_of(const std::vector<int64_t>& counts, int r) {
  int64_t offset = 0;
  for (int q = 0; q < r; q++) offset += counts[q];
  return offset;
}

int64_t total_of(const std::vector<int64_t>& counts) { return offset_of(counts, int(counts.size())); }

// The rank whose segment holds element j.
int owner_of(const std::vector<int64_t>& counts, int64_t j) {
  int r = 0;
  while (j >= offset_of(counts, r + 1)) r++;
  return r;
}

// ZeRO's case: rank r owns the flat slice [r*S, (r+1)*S), and a range [begin, end) of the flat buffer
// (a bucket, a layer) splits by owner. Rank r's piece is [piece_begin, piece_end), empty for a rank
// that owns none of the range.
int64_t piece_begin(int64_t begin, int64_t end, int64_t S, int r) { return std::min(end, std::max(begin, r * S)); }
int64_t piece_end(int64_t begin, int64_t end, int64_t S, int r) {
  return std::max(piece_begin(begin, end, S, r), std::min(end, (r + 1) * S));
}
std::vector<int64_t> shard_counts(int64_t begin, int64_t end, int64_t S, int N) {
  std::vector<int64_t> counts(N);
  for (int r = 0; r < N; r++) counts[r] = piece_end(begin, end, S, r) - piece_begin(begin, end, S, r);
  return counts;
}

class CommTest : public testing::Test {
 protected:
  // Every test starts and ends with the emulated link off.
  void SetUp() override { comm.set_link_model({}); }
  void TearDown() override { comm.set_link_model({}); }

  Communicator& comm = test_comm();
  const int rank = comm.rank();
  const int N = comm.size();
  const float S1 = float(N * (N + 1) / 2);  // sum over ranks of r+1
};

// ---------------------------------------------------------------------------------------------
// Exact data, blocking and async forms

TEST_F(CommTest, AllReduceSumIsExact) {
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "blocking");
    std::vector<float> x(1000);
    for (int i = 0; i < 1000; i++) x[i] = float((rank + 1) * (i + 1));
    if (async) comm.all_reduce_async(view(x), ReduceOp::Sum).wait();
    else comm.all_reduce(view(x), ReduceOp::Sum);
    EXPECT_TRUE(exactly(x, [&](int64_t i) { return S1 * float(i + 1); }));
  }
}

TEST_F(CommTest, AllReduceAvgIsExact) {
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "blocking");
    std::vector<float> x(1000);
    for (int i = 0; i < 1000; i++) x[i] = float((rank + 1) * (i + 1));
    if (async) comm.all_reduce_async(view(x), ReduceOp::Avg).wait();
    else comm.all_reduce(view(x), ReduceOp::Avg);
    // Avg is the sum scaled by 1/N in fp32, which the expected value repeats operation for operation.
    EXPECT_TRUE(exactly(x, [&](int64_t i) { return S1 * float(i + 1) * (1.0f / float(N)); }));
  }
}

TEST_F(CommTest, AllReduceMaxMinIsExact) {
  // Which rank holds the largest value changes from element to element.
  auto fill = [&](std::vector<float>& x) {
    for (int i = 0; i < int(x.size()); i++) x[i] = float(((rank + i) % N + 1) * (i + 1));
  };
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "blocking");
    std::vector<float> hi(1000), lo(1000);
    fill(hi);
    fill(lo);
    if (async) {
      CommHandle a = comm.all_reduce_async(view(hi), ReduceOp::Max);
      CommHandle b = comm.all_reduce_async(view(lo), ReduceOp::Min);
      b.wait();
      a.wait();
    } else {
      comm.all_reduce(view(hi), ReduceOp::Max);
      comm.all_reduce(view(lo), ReduceOp::Min);
    }
    EXPECT_TRUE(exactly(hi, [&](int64_t i) { return float(N * (i + 1)); }));
    EXPECT_TRUE(exactly(lo, [&](int64_t i) { return float(i + 1); }));
  }
}

TEST_F(CommTest, ReduceScatterSumAvgIsExact) {
  const int m = 257;  // elements each rank receives
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg})
    for (bool async : {false, true}) {
      SCOPED_TRACE(std::string(op == ReduceOp::Sum ? "sum " : "avg ") + (async ? "async" : "blocking"));
      std::vector<float> in(size_t(N) * m), out(m, -1.0f);
      for (int j = 0; j < N * m; j++) in[j] = float((rank + 1) * (j + 1));
      if (async) comm.reduce_scatter_async(view(in), view(out), op).wait();
      else comm.reduce_scatter(view(in), view(out), op);
      EXPECT_TRUE(exactly(out, [&](int64_t i) {
        const float sum = S1 * float(rank * m + i + 1);  // chunk `rank` of the summed input
        return op == ReduceOp::Sum ? sum : sum * (1.0f / float(N));
      }));
    }
}

// bf16 (mixed precision's host-staged gradients and parameters): 16-bit words on the wire, reduced
// in fp32 and rounded by the communicator's own MPI ops. Small integers are exact in bf16 (8
// significant bits hold every integer up to 256), so exact comparison still applies.
std::vector<bf16_bits> bf16_vector(size_t n, const std::function<float(int64_t)>& value) {
  std::vector<bf16_bits> v(n);
  for (size_t i = 0; i < n; i++) v[i] = float_to_bf16(value(int64_t(i)));
  return v;
}
Tensor bf16_view(std::vector<bf16_bits>& v) { return make_view(v.data(), {int64_t(v.size())}, DType::BF16); }
testing::AssertionResult bf16_exactly(const std::vector<bf16_bits>& got,
                                      const std::function<float(int64_t)>& expected) {
  std::vector<float> widened(got.size());
  for (size_t i = 0; i < got.size(); i++) widened[i] = bf16_to_float(got[i]);
  return exactly(widened, [&](int64_t i) { return round_to_bf16(expected(i)); });
}

TEST_F(CommTest, Bf16AllReduceIsExactAndMovesTwoBytesPerElement) {
  const int n = 1000;
  auto value = [&](int64_t i) { return float((rank + 1) * (i % 16 + 1)); };
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    std::vector<bf16_bits> x = bf16_vector(n, value);
    const CommStats before = comm.stats();
    comm.all_reduce(bf16_view(x), op);
    EXPECT_EQ(delta(comm.stats(), before, CollectiveKind::AllReduce).payload_bytes, 2 * n);
    EXPECT_TRUE(bf16_exactly(x, [&](int64_t i) {
      const float unit = float(i % 16 + 1);
      if (op == ReduceOp::Max) return float(N) * unit;
      return op == ReduceOp::Sum ? S1 * unit : S1 * unit * (1.0f / float(N));
    }));
  }
}

TEST_F(CommTest, Bf16ReduceScatterVAndAllGatherVAreExact) {
  const std::vector<int64_t> counts = uneven_counts(N, 7);
  const int64_t mine = counts[rank], offset = offset_of(counts, rank), total = total_of(counts);
  std::vector<bf16_bits> in = bf16_vector(total, [&](int64_t j) { return float((rank + 1) * (j % 16 + 1)); });
  std::vector<bf16_bits> piece(mine);
  comm.reduce_scatter_v(bf16_view(in), mine > 0 ? bf16_view(piece) : Tensor(), counts, ReduceOp::Avg);
  EXPECT_TRUE(bf16_exactly(piece, [&](int64_t i) { return S1 * float((offset + i) % 16 + 1) * (1.0f / float(N)); }));
  std::vector<bf16_bits> gathered(total);
  comm.all_gather_v(mine > 0 ? bf16_view(piece) : Tensor(), bf16_view(gathered), counts);
  EXPECT_TRUE(bf16_exactly(gathered, [&](int64_t j) { return S1 * float(j % 16 + 1) * (1.0f / float(N)); }));
}

TEST_F(CommTest, AllGatherIsExact) {
  const int m = 301;
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "blocking");
    std::vector<float> in(m), out(size_t(N) * m, -1.0f);
    for (int i = 0; i < m; i++) in[i] = float((rank + 1) * 1000 + i);
    if (async) comm.all_gather_async(view(in), view(out)).wait();
    else comm.all_gather(view(in), view(out));
    EXPECT_TRUE(exactly(out, [&](int64_t j) { return float((j / m + 1) * 1000 + j % m); }));
  }
}

// In place, as ZeRO gathers parameters: send is this rank's own chunk of recv.
TEST_F(CommTest, AllGatherInPlaceIsExact) {
  const int m = 301;
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "blocking");
    std::vector<float> x(size_t(N) * m, -1.0f);
    for (int i = 0; i < m; i++) x[size_t(rank) * m + i] = float((rank + 1) * 1000 + i);
    const Tensor own = view(x).slice1d(int64_t(rank) * m, m);
    if (async) comm.all_gather_async(own, view(x)).wait();
    else comm.all_gather(own, view(x));
    EXPECT_TRUE(exactly(x, [&](int64_t j) { return float((j / m + 1) * 1000 + j % m); }));
  }
}

TEST_F(CommTest, ReduceScatterVSumAvgIsExact) {
  for (int64_t scale : {1, 300})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg})
      for (bool async : {false, true}) {
        SCOPED_TRACE("counts x" + std::to_string(scale) + (op == ReduceOp::Sum ? " sum " : " avg ") +
                     (async ? "async" : "blocking"));
        const std::vector<int64_t> counts = uneven_counts(N, scale);
        const int64_t mine = counts[rank], offset = offset_of(counts, rank);
        std::vector<float> in(total_of(counts)), out(mine, -1.0f);
        for (size_t j = 0; j < in.size(); j++) in[j] = float((rank + 1) * int64_t(j + 1));
        // A rank that receives nothing may pass an empty Tensor.
        const Tensor recv = mine > 0 ? view(out) : Tensor();
        // The async form gets a temporary vector, gone before the comm thread starts the op: the
        // communicator must have copied the counts.
        if (async) comm.reduce_scatter_v_async(view(in), recv, uneven_counts(N, scale), op).wait();
        else comm.reduce_scatter_v(view(in), recv, counts, op);
        EXPECT_TRUE(exactly(out, [&](int64_t i) {
          const float sum = S1 * float(offset + i + 1);  // segment `rank` of the summed input
          return op == ReduceOp::Sum ? sum : sum * (1.0f / float(N));
        }));
      }
}

TEST_F(CommTest, AllGatherVIsExact) {
  for (int64_t scale : {1, 300})
    for (bool in_place : {false, true})
      for (bool async : {false, true}) {
        SCOPED_TRACE("counts x" + std::to_string(scale) + (in_place ? " in place " : " ") +
                     (async ? "async" : "blocking"));
        const std::vector<int64_t> counts = uneven_counts(N, scale);
        const int64_t mine = counts[rank], offset = offset_of(counts, rank);
        auto value = [&](int64_t j) {  // element j of the gathered result, as its owner wrote it
          const int r = owner_of(counts, j);
          return float((r + 1) * 10000 + (j - offset_of(counts, r)));
        };
        std::vector<float> in(mine), out(total_of(counts), -1.0f);
        for (int64_t i = 0; i < mine; i++) (in_place ? out[offset + i] : in[i]) = value(offset + i);
        const Tensor send = in_place ? view(out).slice1d(offset, mine) : view(in);
        if (async) comm.all_gather_v_async(send, view(out), uneven_counts(N, scale)).wait();
        else comm.all_gather_v(send, view(out), counts);
        EXPECT_TRUE(exactly(out, value));
      }
}

// The ranges a ZeRO chapter hands to the variable-count collectives: rank r owns [r*S, (r+1)*S) of a
// flat buffer of N*S elements; a range [begin, end) may lie inside one shard, straddle several, cover
// everything or nothing. Each rank holds its pieces at their place in its shard (reduce-scatter) or in
// the full buffer (all-gather in place, ZeRO-1 and -2), or gathers into a buffer of its own (ZeRO-3).
TEST_F(CommTest, VariableCountsOfShardedRangesAreExact) {
  const int64_t S = 7, flat = N * S;
  const std::pair<int64_t, int64_t> ranges[] = {
      {0, flat}, {2, 5}, {S - 1, S + 1}, {3, flat - 2}, {flat - 1, flat}, {S, 2 * S}, {S, S}};
  for (const auto& range : ranges) {
    const int64_t begin = std::min(range.first, flat), end = std::min(range.second, flat);  // N = 1: S-1..S+1
    SCOPED_TRACE("range [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
    const std::vector<int64_t> counts = shard_counts(begin, end, S, N);
    const int64_t lo = piece_begin(begin, end, S, rank), hi = piece_end(begin, end, S, rank);
    const int64_t shard0 = rank * S;  // where this rank's shard begins
    // Where this rank's piece begins in its shard; for an empty piece, any place inside the shard.
    const int64_t in_shard = std::min(std::max(lo - shard0, int64_t(0)), S);
    auto owned = [&](int64_t g) { return g >= shard0 && g < shard0 + S; };
    auto in_range = [&](int64_t g) { return g >= begin && g < end; };

    // Reduce-scatter of gradients into this rank's shard; the rest of the shard stays untouched.
    std::vector<float> grads(flat), grad_shard(S, -1.0f);
    for (int64_t g = 0; g < flat; g++) grads[g] = float((rank + 1) * (g + 1));
    comm.reduce_scatter_v(view(grads).slice1d(begin, end - begin), view(grad_shard).slice1d(in_shard, hi - lo),
                          counts, ReduceOp::Sum);
    EXPECT_TRUE(exactly(grad_shard, [&](int64_t k) {
      return in_range(shard0 + k) ? S1 * float(shard0 + k + 1) : -1.0f;
    }));

    // All-gather in place: each rank wrote its own shard of the full buffer.
    std::vector<float> params(flat, -1.0f);
    for (int64_t g = shard0; g < shard0 + S; g++) params[g] = float(g + 1);
    comm.all_gather_v(view(params).slice1d(lo, hi - lo), view(params).slice1d(begin, end - begin), counts);
    EXPECT_TRUE(exactly(params, [&](int64_t g) { return in_range(g) || owned(g) ? float(g + 1) : -1.0f; }));

    // All-gather from a shard into a separate buffer that holds only the range.
    std::vector<float> shard(S), gathered(end - begin, -1.0f);
    for (int64_t k = 0; k < S; k++) shard[k] = float(shard0 + k + 1);
    comm.all_gather_v(view(shard).slice1d(in_shard, hi - lo), view(gathered), counts);
    EXPECT_TRUE(exactly(gathered, [&](int64_t j) { return float(begin + j + 1); }));
  }
}

TEST_F(CommTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < N; root++)
    for (bool async : {false, true}) {
      SCOPED_TRACE("root " + std::to_string(root) + (async ? " async" : " blocking"));
      std::vector<float> x(777);
      for (int i = 0; i < 777; i++) x[i] = rank == root ? float((root + 1) * (i + 1)) : -1.0f;
      if (async) comm.broadcast_async(view(x), root).wait();
      else comm.broadcast(view(x), root);
      EXPECT_TRUE(exactly(x, [&](int64_t i) { return float((root + 1) * (i + 1)); }));
    }
}

// Every rank sends to the next and receives from the previous, both in flight at once. 4 MB is far
// above MPI's eager limit, so a send completes only once its receive is posted: this deadlocks if
// the communication thread ran one op to completion before starting the next. Works with N = 1 too
// (a rank sends to itself).
TEST_F(CommTest, SendRecvRingAsync) {
  const int n = 1 << 20;
  const int next = (rank + 1) % N, prev = (rank + N - 1) % N;
  std::vector<float> out(n), in(n, -1.0f);
  for (int i = 0; i < n; i++) out[i] = float(rank * 4096 + i % 4096);
  CommHandle s = comm.send_async(view(out), next);
  CommHandle r = comm.recv_async(view(in), prev);
  r.wait();  // either order works
  s.wait();
  EXPECT_TRUE(exactly(in, [&](int64_t i) { return float(prev * 4096 + i % 4096); }));
}

// A group of sends and receives (what a pipeline issues between two passes under call order): one
// handle for all, both directions of a ring at once, every rank's bytes counted as sent and received.
TEST_F(CommTest, SendRecvGroupMovesBothWaysAroundTheRing) {
  const int n = 4096;
  const int next = (rank + 1) % N, prev = (rank + N - 1) % N;
  std::vector<float> to_next(n), to_prev(n), from_prev(n, -1.0f), from_next(n, -1.0f);
  for (int i = 0; i < n; i++) to_next[i] = float(rank * n + i), to_prev[i] = -float(rank * n + i);
  const CommStats before = comm.stats();
  CommHandle group = comm.send_recv_async({{true, view(to_next), next, 1},
                                           {false, view(from_next), next, 2},
                                           {true, view(to_prev), prev, 2},
                                           {false, view(from_prev), prev, 1}});
  ASSERT_TRUE(group.valid());
  group.wait();
  group.wait();  // waiting again is harmless: the pipeline holds one handle per message of the group
  EXPECT_TRUE(exactly(from_prev, [&](int64_t i) { return float(prev * n + i); }));
  EXPECT_TRUE(exactly(from_next, [&](int64_t i) { return -float(next * n + i); }));
  const CommStats step = comm.stats().since(before);
  const int64_t bytes = N > 1 ? 2 * int64_t(n) * 4 : 0;
  if (N > 1) {
    EXPECT_EQ(step.kind[int(CollectiveKind::SendRecv)].sent_bytes, bytes);
    EXPECT_EQ(step.kind[int(CollectiveKind::SendRecv)].received_bytes, bytes);
  }
  EXPECT_TRUE(comm.matches_by_tag()) << "MPI matches by tag";
}

// Blocking sends and receives around a ring must be ordered by the caller, as with plain MPI: even
// ranks send first, odd ranks receive first.
TEST_F(CommTest, SendRecvRingBlocking) {
  if (N == 1) GTEST_SKIP() << "a blocking send to oneself waits for a receive that never comes";
  const int n = 1 << 18;
  const int next = (rank + 1) % N, prev = (rank + N - 1) % N;
  std::vector<float> out(n), in(n, -1.0f);
  for (int i = 0; i < n; i++) out[i] = float(rank * 4096 + i % 4096);
  if (rank % 2 == 0) {
    comm.send(view(out), next);
    comm.recv(view(in), prev);
  } else {
    comm.recv(view(in), prev);
    comm.send(view(out), next);
  }
  EXPECT_TRUE(exactly(in, [&](int64_t i) { return float(prev * 4096 + i % 4096); }));
}

// No rank leaves a barrier before the last one entered it. Rank 0 enters 100 ms late, so a barrier
// that did not wait would let the others leave long before. Stated as an order of events on the
// machine's clock, not as a time waited, it holds however the machine schedules the ranks.
TEST_F(CommTest, BarrierWaitsForTheSlowestRank) {
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "blocking");
    comm.barrier();
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double entered = machine_ms();
    if (async) comm.barrier_async().wait();
    else comm.barrier();
    const double left = machine_ms();
    const double last_entry = comm.all_reduce_scalar(entered, ReduceOp::Max);
    EXPECT_GE(left, last_entry) << "left " << last_entry - left << " ms before the last rank entered";
  }
}

TEST_F(CommTest, AllReduceScalarIsExact) {
  EXPECT_EQ(comm.all_reduce_scalar(rank + 1, ReduceOp::Sum), double(S1));
  EXPECT_EQ(comm.all_reduce_scalar(rank + 1, ReduceOp::Avg), double(S1) / N);
  EXPECT_EQ(comm.all_reduce_scalar(rank + 1, ReduceOp::Max), double(N));
  EXPECT_EQ(comm.all_reduce_scalar(rank + 1, ReduceOp::Min), 1.0);
  EXPECT_EQ(comm.all_reduce_scalar(-0.5 * (rank + 1), ReduceOp::Sum), -0.5 * S1);
}

// On two ranks a small all-reduce is one exchange, each rank adding the other's values to its own
// (comm_mpi.cpp, submit_exchange), larger ones MPI's: on data whose sums round, the result must be the
// same on every rank and from one call to the next, blocking or not, and the sum within fp32's
// rounding. At 4 B, 4 KB and 8 KB (the exchange on two ranks), and past it.
TEST_F(CommTest, SmallAllReduceIsTheSameOnEveryRankAndEveryCall) {
  for (int n : {1, 1024, 2048, 2049, 16384}) {
    for (bool async : {false, true}) {
      SCOPED_TRACE(std::to_string(n) + (async ? " floats, async" : " floats, blocking"));
      std::vector<float> mine(n);
      for (int i = 0; i < n; i++) mine[i] = 1.0f / float(rank + 3) + float(i % 97) * 1e-3f / float(rank + 1);
      std::vector<float> first = mine, second = mine;
      if (async) {
        CommHandle a = comm.all_reduce_async(view(first), ReduceOp::Sum);
        CommHandle b = comm.all_reduce_async(view(second), ReduceOp::Sum);
        b.wait();
        a.wait();
      } else {
        comm.all_reduce(view(first), ReduceOp::Sum);
        comm.all_reduce(view(second), ReduceOp::Sum);
      }
      EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float))) << "two calls differ";
      std::vector<float> every(size_t(N) * n);
      comm.all_gather(view(first), view(every));
      for (int r = 0; r < N; r++)
        EXPECT_EQ(0, std::memcmp(every.data() + size_t(r) * n, first.data(), first.size() * sizeof(float)))
            << "rank " << r << " holds another result than rank " << rank;
      for (int i = 0; i < n; i++) {
        double sum = 0;
        for (int r = 0; r < N; r++) sum += double(1.0f / float(r + 3) + float(i % 97) * 1e-3f / float(r + 1));
        ASSERT_NEAR(first[i], sum, 1e-6 * N * std::abs(sum)) << "element " << i;
      }
    }
  }
}

// More small all-reduces in flight at once than a group of two has receive buffers for its
// exchanges (comm_mpi.cpp, ExchangeSlots: 8), waited in an order that is neither issue's nor its
// reverse, twice: the calls past the slots take buffers of their own, the slots are given back
// and taken again, and no two calls in flight ever share one (each sum would then hold another
// call's values). At other sizes the same calls go to MPI, and must agree all the same.
TEST_F(CommTest, SmallAllReducesInFlightPastTheExchangeSlotsStayExact) {
  const int calls = 12, m = 2048;  // 8 KB each: the largest exchange
  for (int round = 0; round < 2; round++) {
    std::vector<std::vector<float>> bufs(calls, std::vector<float>(m));
    for (int c = 0; c < calls; c++)
      for (int i = 0; i < m; i++) bufs[c][i] = float((rank + 1) * (c + 1) + i % 7);
    std::vector<CommHandle> handles;
    for (int c = 0; c < calls; c++) handles.push_back(comm.all_reduce_async(view(bufs[c]), ReduceOp::Sum));
    for (int w = 0; w < calls; w++) handles[(w * 5 + round) % calls].wait();
    for (int c = 0; c < calls; c++)
      EXPECT_TRUE(exactly(bufs[c], [&](int64_t i) { return S1 * float(c + 1) + float(N * (i % 7)); }))
          << "call " << c << ", round " << round;
  }
}

// The failing path ends the job, so only the agreeing path can be tested in-process.
TEST_F(CommTest, AgreeOrDieReturnsWhenEveryRankSucceeded) {
  comm.agree_or_die(true, "not printed");
  SUCCEED();
}

TEST_F(CommTest, BroadcastBytesFromEveryRoot) {
  for (int root = 0; root < N; root++)
    for (size_t bytes : {size_t(0), size_t(1), size_t(1001)}) {
      SCOPED_TRACE("root " + std::to_string(root) + ", " + std::to_string(bytes) + " bytes");
      std::string expected(bytes, '\0'), data(bytes, '?');
      for (size_t i = 0; i < bytes; i++) expected[i] = char('a' + (root * 7 + i) % 26);
      if (rank == root) data = expected;
      comm.broadcast_bytes(bytes ? &data[0] : nullptr, bytes, root);
      EXPECT_EQ(data, expected);
    }
}

// Six collectives of different kinds in flight together, waited in an order that differs from rank
// to rank: waiting is local, only the issue order must agree.
TEST_F(CommTest, ManyInFlightWaitedInAnyOrder) {
  const int m = 4099;
  std::vector<float> sum(m), max(m), gather_in(m), gather_out(size_t(N) * m), bcast(m), rs_in(size_t(N) * m), rs_out(m);
  for (int i = 0; i < m; i++) {
    sum[i] = float((rank + 1) * (i + 1));
    max[i] = float(((rank + i) % N + 1) * (i + 1));
    gather_in[i] = float(rank * 10000 + i);
    bcast[i] = rank == N - 1 ? float(i) : -1.0f;
  }
  for (int j = 0; j < N * m; j++) rs_in[j] = float(rank + 1);

  std::vector<CommHandle> handles;
  handles.push_back(comm.all_reduce_async(view(sum), ReduceOp::Sum));
  handles.push_back(comm.all_gather_async(view(gather_in), view(gather_out)));
  handles.push_back(comm.broadcast_async(view(bcast), N - 1));
  handles.push_back(comm.reduce_scatter_async(view(rs_in), view(rs_out), ReduceOp::Avg));
  handles.push_back(comm.all_reduce_async(view(max), ReduceOp::Max));
  handles.push_back(comm.barrier_async());
  const int k = int(handles.size());
  for (int w = 0; w < k; w++) handles[rank % 2 ? k - 1 - w : (w + rank) % k].wait();

  EXPECT_TRUE(exactly(sum, [&](int64_t i) { return S1 * float(i + 1); }));
  EXPECT_TRUE(exactly(max, [&](int64_t i) { return float(N * (i + 1)); }));
  EXPECT_TRUE(exactly(gather_out, [&](int64_t j) { return float((j / m) * 10000 + j % m); }));
  EXPECT_TRUE(exactly(bcast, [&](int64_t i) { return float(i); }));
  EXPECT_TRUE(exactly(rs_out, [&](int64_t) { return S1 * (1.0f / float(N)); }));
}

// ---------------------------------------------------------------------------------------------
// Overlap: an async collective progresses while the caller computes

// Timing on a shared machine (4 ranks on 2 cores, maybe a compiler next door) can be spoiled by a
// stall of a few tens of ms. So an overlap experiment gets up to kTries tries, and passes when one
// try succeeds on every rank (the ranks agree after each try, so all run the same number of tries).
// A communicator that did not overlap would fail every try. A try takes a tenth of a second, so the
// tries are many: enough for a machine whose cores are all busy (make test-busy).
constexpr int kTries = 10;
bool on_every_rank_within_tries(int tries, const std::function<bool()>& attempt) {
  for (int t = 0; t < tries; t++) {
    const bool ok = attempt();
    if (test_comm().all_reduce_scalar(ok ? 1.0 : 0.0, ReduceOp::Min) == 1.0) return true;
  }
  return false;
}

// An all-reduce started before 60 ms of compute is finished by the time the caller waits: the
// exposed wait is a small part of the collective's busy time. (1 MB takes a few ms alone, 10-20 ms
// while 4 ranks compute on 2 cores; far larger buffers cannot finish there while every core is busy
// computing, because the communication thread then gets only a share of a core.)
TEST_F(CommTest, AsyncAllReduceOverlapsCompute) {
  if (N == 1) GTEST_SKIP() << "one rank has nothing to exchange: its collectives complete at issue";
  std::vector<float> x(1 << 18);  // 1 MB
  double exposed = 0, busy = 0;
  const bool overlapped = on_every_rank_within_tries(kTries, [&] {
    for (size_t i = 0; i < x.size(); i++) x[i] = float(rank + 1);
    const CommStats before = comm.stats();
    CommHandle h = comm.all_reduce_async(view(x), ReduceOp::Sum);
    compute_for(60);
    h.wait();
    exposed = comm.stats().exposed_ms - before.exposed_ms;
    busy = delta(comm.stats(), before, CollectiveKind::AllReduce).busy_ms;
    EXPECT_TRUE(exactly(x, [&](int64_t) { return S1; }));
    return busy > 0 && exposed < 0.25 * busy;
  });
  EXPECT_TRUE(overlapped) << "last try: exposed " << exposed << " ms of " << busy << " ms busy";
}

// The same on the emulated link, where the numbers are known in advance: the all-reduce takes 100 ms
// modelled, the caller computes 150 ms, so wait() returns at once.
TEST_F(CommTest, AsyncAllReduceHiddenBehindComputeOnEmulatedLink) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  std::vector<float> x(1 << 18);  // 1 MB
  // Without latency the modelled time scales as 1/gbps: pick the bandwidth that gives 100 ms.
  const double at_1gbps = modelled_ms({1.0, 0.0}, CollectiveKind::AllReduce, int64_t(x.size() * 4), N);
  comm.set_link_model({at_1gbps / 100.0, 0.0});
  double exposed = 0, busy = 0;
  const bool hidden = on_every_rank_within_tries(kTries, [&] {
    for (size_t i = 0; i < x.size(); i++) x[i] = float(rank + 1);
    const CommStats before = comm.stats();
    CommHandle h = comm.all_reduce_async(view(x), ReduceOp::Sum);
    compute_for(150);
    h.wait();
    exposed = comm.stats().exposed_ms - before.exposed_ms;
    busy = delta(comm.stats(), before, CollectiveKind::AllReduce).busy_ms;
    EXPECT_TRUE(exactly(x, [&](int64_t) { return S1; }));
    EXPECT_GE(busy, 99.9);  // never shorter than modelled, stall or not
    return exposed < 10.0;
  });
  EXPECT_TRUE(hidden) << "last try: exposed " << exposed << " ms of " << busy << " ms busy";
}

// ---------------------------------------------------------------------------------------------
// Counters

TEST_F(CommTest, CountersMatchFormulas) {
  const int64_t m = 1024;  // elements per rank's chunk
  const int64_t chunk = 4 * m, full = 4 * m * N;  // bytes
  std::vector<float> a(size_t(N) * m, 1.0f), b(m, 1.0f), c(m, 1.0f);
  char bytes[1000] = {};
  const CommStats before = comm.stats();
  const double t0 = now_ms();

  comm.all_reduce(view(a), ReduceOp::Sum);                      // payload N*m floats
  comm.reduce_scatter(view(a), view(b), ReduceOp::Sum);         // input N*m floats
  comm.all_gather(view(b), view(a));                            // output N*m floats
  comm.broadcast(view(b), 0);                                   // m floats
  comm.broadcast_bytes(bytes, sizeof bytes, 0);                 // 1000 bytes, also a broadcast
  CommHandle s = comm.send_async(view(b), (rank + 1) % N);      // m floats out...
  CommHandle r = comm.recv_async(view(c), (rank + N - 1) % N);  // ...and m floats in
  s.wait();
  r.wait();
  r.wait();  // a second wait returns at once and counts nothing
  comm.barrier();
  comm.all_reduce_scalar(1.0, ReduceOp::Sum);
  const double wall = now_ms() - t0;
  const CommStats after = comm.stats();

  // wire = bytes this rank sends: 2(N-1)/N of the payload for all-reduce, (N-1)/N for reduce-scatter
  // and all-gather, the payload for broadcast and send, nothing for a receive or a barrier, and
  // nothing at all with one rank.
  struct Expected {
    CollectiveKind kind;
    int64_t calls, payload, wire;
  };
  const bool many = N > 1;
  const Expected expected[] = {
      {CollectiveKind::AllReduce, 1, full, 2 * (N - 1) * chunk},
      {CollectiveKind::ReduceScatter, 1, full, (N - 1) * chunk},
      {CollectiveKind::AllGather, 1, full, (N - 1) * chunk},
      {CollectiveKind::Broadcast, 2, chunk + 1000, many ? chunk + 1000 : 0},
      {CollectiveKind::SendRecv, 2, 2 * chunk, many ? chunk : 0},
      {CollectiveKind::Barrier, 1, 0, 0},
      {CollectiveKind::Scalar, 1, 8, 2 * (N - 1) * 8 / N},
  };
  for (const Expected& e : expected) {
    SCOPED_TRACE(collective_name(e.kind));
    const CollectiveCounters d = delta(after, before, e.kind);
    EXPECT_EQ(d.calls, e.calls);
    EXPECT_EQ(d.launched, e.calls);  // everything issued was waited
    EXPECT_EQ(d.payload_bytes, e.payload);
    EXPECT_EQ(d.sent_bytes, e.wire);
    // One rank exchanges nothing: its collectives complete at issue (messages to itself still travel).
    if (many || e.kind == CollectiveKind::SendRecv) EXPECT_GT(d.busy_ms, 0.0);
    else EXPECT_EQ(d.busy_ms, 0.0);
  }
  EXPECT_EQ(after.total_calls() - before.total_calls(), 9);
  EXPECT_EQ(after.total_launched() - before.total_launched(), 9);
  EXPECT_GE(after.exposed_ms, before.exposed_ms);
  // One op after another, but for the send and the receive, which overlap on their two lanes: the
  // busy times of the rest fit in the wall time.
  const double send_recv_busy = delta(after, before, CollectiveKind::SendRecv).busy_ms;
  EXPECT_LE(after.total_busy_ms() - before.total_busy_ms() - send_recv_busy, wall);
  // The union of the in-flight intervals fits in the wall time and never exceeds the busy times' sum.
  const double in_flight = after.in_flight_ms - before.in_flight_ms;
  EXPECT_GT(in_flight, 0.0);
  EXPECT_LE(in_flight, wall);
  EXPECT_LE(in_flight, after.total_busy_ms() - before.total_busy_ms() + 1e-6);
  EXPECT_LE(after.exposed_ms - before.exposed_ms, in_flight + 1e-9);
}

// Exposed communication is the part of the in-flight time that the caller spent waiting: it can never
// exceed it, whatever mix of ops overlaps (async ops waited late, early, in any order, on a link).
TEST_F(CommTest, ExposedNeverExceedsInFlight) {
  comm.set_link_model({2.0, 200.0});
  std::vector<float> a(1 << 16, 1.0f), b(1 << 16, 1.0f), c(1 << 14), d(1 << 14);
  const CommStats before = comm.stats();
  for (int round = 0; round < 3; round++) {
    CommHandle x = comm.all_reduce_async(view(a), ReduceOp::Sum);
    compute_for(2.0 * round);
    CommHandle y = comm.all_reduce_async(view(b), ReduceOp::Max);
    CommHandle s = comm.send_async(view(c), (rank + 1) % N);
    CommHandle r = comm.recv_async(view(d), (rank + N - 1) % N);
    y.wait();
    compute_for(1.0);
    r.wait();
    x.wait();
    s.wait();
    comm.all_reduce_scalar(1.0, ReduceOp::Sum);
  }
  const CommStats step = comm.stats().since(before);
  EXPECT_GT(step.in_flight_ms, 0.0);
  EXPECT_LE(step.exposed_ms, step.in_flight_ms + 1e-9);
}

// One rank has no peer: collectives complete at issue, with nothing sent, no time in flight and
// nothing exposed, link or no link (chapter runs at 1 rank report 0 ms of communication).
TEST_F(CommTest, AtOneRankCollectivesCostNothing) {
  if (N > 1) GTEST_SKIP() << "a one-rank property (run under mpiexec -n 1)";
  comm.set_link_model({0.01, 1000.0});
  std::vector<float> x(4096, 2.0f), piece(4096), all(4096);
  const CommStats before = comm.stats();
  comm.all_reduce(view(x), ReduceOp::Avg);
  comm.reduce_scatter(view(x), view(piece), ReduceOp::Avg);
  comm.all_gather(view(piece), view(all));
  comm.broadcast(view(x), 0);
  comm.barrier();
  comm.all_reduce_scalar(3.0, ReduceOp::Sum);
  const CommStats step = comm.stats().since(before);
  EXPECT_EQ(step.total_calls(), 6);
  EXPECT_EQ(step.total_sent_bytes(), 0);
  EXPECT_EQ(step.in_flight_ms, 0.0);
  EXPECT_EQ(step.exposed_ms, 0.0);
  EXPECT_TRUE(exactly(all, [](int64_t) { return 2.0f; }));  // the copies a one-rank collective makes
}

// The variable-count forms count as their uniform kinds, with the full size sum(counts) as the
// payload; what a rank sends and receives follows the counts: in a reduce-scatter it sends every
// other rank's segment and receives N-1 contributions to its own, in an all-gather the reverse.
TEST_F(CommTest, VariableCountCollectivesCountTheirTrafficByCounts) {
  const std::vector<int64_t> counts = uneven_counts(N, 100);
  const int64_t total = total_of(counts), full = 4 * total;  // elements, bytes
  std::vector<float> in(total, 1.0f), part(counts[rank]), out(total);
  const CommStats before = comm.stats();
  comm.reduce_scatter_v(view(in), view(part), counts, ReduceOp::Sum);
  comm.all_gather_v(view(part), view(out), counts);
  const CommStats after = comm.stats();
  const int64_t others = 4 * (total - counts[rank]), own_from_peers = 4 * (N - 1) * counts[rank];
  for (CollectiveKind kind : {CollectiveKind::ReduceScatter, CollectiveKind::AllGather}) {
    SCOPED_TRACE(collective_name(kind));
    const CollectiveCounters d = delta(after, before, kind);
    EXPECT_EQ(d.calls, 1);
    EXPECT_EQ(d.launched, 1);
    EXPECT_EQ(d.payload_bytes, full);
    const bool rs = kind == CollectiveKind::ReduceScatter;
    EXPECT_EQ(d.sent_bytes, N == 1 ? 0 : rs ? others : own_from_peers);
    EXPECT_EQ(d.received_bytes, N == 1 ? 0 : rs ? own_from_peers : others);
  }
  EXPECT_EQ(after.total_calls() - before.total_calls(), 2);
}

// `launched` counts an op when it is issued, `calls` when it is waited: a test can then tell that
// nothing was even started during a stretch of code (no_sync's micro-batches), which calls cannot.
TEST_F(CommTest, LaunchedCountsAtIssueCallsAtWait) {
  std::vector<float> x(64, 1.0f);
  const CommStats before = comm.stats();
  CommHandle h = comm.all_reduce_async(view(x), ReduceOp::Sum);
  const CommStats issued = comm.stats();
  EXPECT_EQ(delta(issued, before, CollectiveKind::AllReduce).launched, 1);
  EXPECT_EQ(delta(issued, before, CollectiveKind::AllReduce).calls, 0);  // finished or not: not waited
  EXPECT_EQ(issued.total_launched() - before.total_launched(), 1);
  EXPECT_EQ(issued.total_calls() - before.total_calls(), 0);

  h.wait();
  h.wait();  // a second wait counts nothing
  const CommStats waited = comm.stats();
  EXPECT_EQ(delta(waited, before, CollectiveKind::AllReduce).launched, 1);
  EXPECT_EQ(delta(waited, before, CollectiveKind::AllReduce).calls, 1);

  // The blocking forms and the scalar count under their own kinds; total_launched() counts every kind.
  comm.barrier();
  comm.all_reduce_scalar(1.0, ReduceOp::Sum);
  const CommStats after = comm.stats();
  EXPECT_EQ(delta(after, waited, CollectiveKind::Barrier).launched, 1);
  EXPECT_EQ(delta(after, waited, CollectiveKind::Scalar).launched, 1);
  EXPECT_EQ(after.total_launched() - waited.total_launched(), 2);
  EXPECT_EQ(after.total_launched() - before.total_launched(), after.total_calls() - before.total_calls());
}

// ---------------------------------------------------------------------------------------------
// Link emulation

TEST_F(CommTest, EmulatedLinkTakesAtLeastModelledTime) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  const LinkModel link{0.2, 500.0};  // 25 MB/s, 0.5 ms per message: tens of ms for these sizes
  comm.set_link_model(link);
  std::vector<float> x(size_t(N) << 16), part(1 << 16);  // 256 KB per rank
  const int64_t bytes = int64_t(x.size() * 4);
  // The same full size split unevenly: rank 0 twice the share, rank 1 nothing, the others one share.
  std::vector<int64_t> counts(N, int64_t(1) << 16);
  counts[0] = int64_t(N == 1 ? 1 : 2) << 16;
  if (N > 1) counts[1] = 0;
  std::vector<float> piece(counts[rank]);

  struct Case {
    CollectiveKind kind;
    std::function<void()> run;
  };
  const Case cases[] = {
      {CollectiveKind::AllReduce, [&] { comm.all_reduce(view(x), ReduceOp::Sum); }},
      {CollectiveKind::ReduceScatter, [&] { comm.reduce_scatter(view(x), view(part), ReduceOp::Sum); }},
      {CollectiveKind::Broadcast, [&] { comm.broadcast(view(x), 0); }},
      // The variable-count forms take the time of the uniform ones for the same full size.
      {CollectiveKind::ReduceScatter, [&] { comm.reduce_scatter_v(view(x), view(piece), counts, ReduceOp::Sum); }},
      {CollectiveKind::AllGather, [&] { comm.all_gather_v(view(piece), view(x), counts); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(collective_name(c.kind));
    const double expected = modelled_ms(link, c.kind, bytes, N);
    const CommStats before = comm.stats();
    const double t0 = now_ms();
    c.run();
    const double wall = now_ms() - t0;
    const CommStats after = comm.stats();
    EXPECT_GE(wall, expected);
    EXPECT_GE(delta(after, before, c.kind).busy_ms, expected - 1e-3);
    // Waited at once, so exposed; not all of it, as the caller may lose its core before wait() starts.
    EXPECT_GT(after.exposed_ms - before.exposed_ms, 0.0);
  }

  // The link carries one collective at a time: two all-reduces queued together take twice as long.
  const double one = modelled_ms(link, CollectiveKind::AllReduce, bytes, N);
  std::vector<float> y(x.size());
  const double t0 = now_ms();
  CommHandle a = comm.all_reduce_async(view(x), ReduceOp::Sum);
  CommHandle b = comm.all_reduce_async(view(y), ReduceOp::Sum);
  b.wait();
  a.wait();
  EXPECT_GE(now_ms() - t0, 2 * one);
}

// While a collective waits out 300 ms of modelled link time, neither the caller (asleep in wait())
// nor the communication thread (asleep until the link delivers) uses the CPU.
TEST_F(CommTest, EmulatedLinkWaitsWithoutBurningCpu) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  // A 4 KB all-reduce whose time is all latency: 2(N-1) messages of 300/(2(N-1)) ms.
  const LinkModel link{100.0, 300e3 / (2 * (N - 1))};
  std::vector<float> x(1024, 1.0f);
  ASSERT_NEAR(modelled_ms(link, CollectiveKind::AllReduce, 4096, N), 300.0, 0.1);
  comm.set_link_model(link);
  const double cpu0 = process_cpu_ms(), t0 = now_ms();
  comm.all_reduce(view(x), ReduceOp::Sum);
  const double cpu = process_cpu_ms() - cpu0, wall = now_ms() - t0;
  EXPECT_GE(wall, 300.0);
  EXPECT_LT(cpu, 0.3 * wall) << "cpu " << cpu << " ms over " << wall << " ms";
}

// ---------------------------------------------------------------------------------------------
// In-flight time: the union of the intervals during which ops were in flight

// The link model on which a small op of `kind` takes `ms`: all latency (1 Pbit/s moves 4 KB in 33
// ps). With a latency of 1000 us, the op takes 1 ms per message it sends; scale that to `ms`.
LinkModel link_for(CollectiveKind kind, double ms, int N) {
  const double ms_per_ms_of_latency = modelled_ms({1e6, 1000.0}, kind, 0, N);
  return {1e6, 1000.0 * ms / ms_per_ms_of_latency};
}

// One op alone: its in-flight time is its busy time, both measured from the same two moments.
TEST_F(CommTest, InFlightTimeOfOneOpIsItsBusyTime) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  std::vector<float> x(1024, 1.0f);
  comm.set_link_model(link_for(CollectiveKind::AllReduce, 50.0, N));
  const CommStats before = comm.stats();
  comm.all_reduce(view(x), ReduceOp::Sum);
  const CommStats after = comm.stats();
  const double busy = after.total_busy_ms() - before.total_busy_ms();
  EXPECT_GE(busy, 50.0 - 1e-3);
  EXPECT_NEAR(after.in_flight_ms - before.in_flight_ms, busy, 1e-3);
}

// Two all-reduces queued together on the link take 50 ms each, one after the other. A lane's busy
// times never overlap (the second op is charged from the first one's retirement), so here the busy
// times and the in-flight time agree: about 100 ms.
TEST_F(CommTest, InFlightTimeOfQueuedOpsIsTheirBusyTime) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  std::vector<float> x(1024, 1.0f), y(1024, 1.0f);
  comm.set_link_model(link_for(CollectiveKind::AllReduce, 50.0, N));
  const CommStats before = comm.stats();
  CommHandle a = comm.all_reduce_async(view(x), ReduceOp::Sum);
  CommHandle b = comm.all_reduce_async(view(y), ReduceOp::Sum);
  a.wait();
  b.wait();
  const CommStats after = comm.stats();
  const double busy = after.total_busy_ms() - before.total_busy_ms();
  EXPECT_GE(busy, 100.0 - 1e-3);
  EXPECT_NEAR(after.in_flight_ms - before.in_flight_ms, busy, 1e-3);
}

// A send and a receive around a ring, 50 ms each, travel at the same time on their own lanes: their
// busy times add up to about 100 ms, but communication was in flight for only about 50. (The receive
// ends when the left neighbour's message arrives, 50 ms after that neighbour sent it: a little more
// or less than 50 ms after this rank posted it.)
TEST_F(CommTest, InFlightTimeCountsOverlappingLanesOnce) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  std::vector<float> out(1024, float(rank)), in(1024, -1.0f);
  comm.set_link_model(link_for(CollectiveKind::SendRecv, 50.0, N));
  double busy = 0, in_flight = 0, wall = 0;
  const bool once = on_every_rank_within_tries(kTries, [&] {
    const CommStats before = comm.stats();
    const double t0 = now_ms();
    CommHandle s = comm.send_async(view(out), (rank + 1) % N);
    CommHandle r = comm.recv_async(view(in), (rank + N - 1) % N);
    s.wait();
    r.wait();
    wall = now_ms() - t0;
    const CommStats after = comm.stats();
    busy = after.total_busy_ms() - before.total_busy_ms();
    in_flight = after.in_flight_ms - before.in_flight_ms;
    EXPECT_GE(busy, 50.0 - 1e-3);  // the send takes its modelled time, stall or not
    EXPECT_GE(in_flight, 50.0 - 1e-3);
    EXPECT_LE(in_flight, wall);
    return in_flight < 0.75 * busy;  // about 50 of 100, unless a stall stretched one op
  });
  EXPECT_TRUE(once) << "last try: in flight " << in_flight << " ms, busy " << busy << " ms, wall " << wall << " ms";
}

// Ops retire in start order only within a lane. Rank 1 receives from rank 0 for 100 ms; 30 ms later
// every rank starts a 50 ms all-reduce, which on rank 1 retires first, at 80 ms, while the receive is
// still in flight. Rank 1 had communication in flight from 0 to 100 ms: charging each op from its own
// start or the previous retirement, whichever is later, would lose 0..30 ms and give 70.
TEST_F(CommTest, InFlightTimeWhenALaterOpRetiresFirst) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  std::vector<float> msg(1024, 1.0f), x(1024, 1.0f);
  const CommStats before = comm.stats();
  const double t0 = now_ms();
  comm.set_link_model(link_for(CollectiveKind::SendRecv, 100.0, N));
  CommHandle p2p;
  const double started = machine_ms();  // the send's on rank 0, the receive's on rank 1
  if (rank == 0) p2p = comm.send_async(view(msg), 1);
  if (rank == 1) p2p = comm.recv_async(view(msg), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  comm.set_link_model(link_for(CollectiveKind::AllReduce, 50.0, N));
  CommHandle all = comm.all_reduce_async(view(x), ReduceOp::Sum);
  all.wait();
  if (p2p.valid()) p2p.wait();
  const double wall = now_ms() - t0;
  const CommStats after = comm.stats();
  const double in_flight = after.in_flight_ms - before.in_flight_ms;
  EXPECT_LE(in_flight, wall);
  // The message arrives 100 ms after rank 0 sent it: 100 ms after rank 1 posted its receive, less
  // what rank 1 posted late (a busy machine may run it a little after rank 0).
  const double sent = value_of_rank(comm, 0, started);
  if (rank == 1) {
    EXPECT_GE(in_flight, std::min(100.0, sent + 100.0 - started) - 1e-3)
        << "the receive alone was in flight for its 100 modelled ms";
  }
  if (rank == 0) {  // the send and then the all-reduce, one lane: 100 + 50 ms
    EXPECT_GE(in_flight, 150.0 - 1e-3);
  }
}

// A message arrives no earlier than its modelled time after it was SENT, however early its receive
// was posted: rank 1 posts its receive at once, rank 0 sends 200 ms later a message modelled at
// 335.5 ms (4 MiB at 0.1 Gbit/s). The receive must not complete before 535.5 ms.
TEST_F(CommTest, EarlyReceiveStillTakesTheSendersModelledTime) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  const LinkModel link{0.1, 0.0};
  std::vector<float> msg(1 << 20, float(rank));  // 4 MB
  const double modelled = modelled_ms(link, CollectiveKind::SendRecv, int64_t(msg.size() * 4), N);
  ASSERT_NEAR(modelled, 335.5, 0.1);
  comm.set_link_model(link);
  comm.barrier();
  double sent = 0, arrived = 0;
  if (rank == 1) {
    comm.recv(view(msg), 0, 7);
    arrived = machine_ms();
    EXPECT_TRUE(exactly(msg, [](int64_t) { return 0.0f; }));
  }
  if (rank == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    sent = machine_ms();
    comm.send(view(msg), 1, 7);
  }
  comm.set_link_model({});
  // Measured from the send, on the machine's clock: rank 1's own start may come late on a busy machine.
  sent = value_of_rank(comm, 0, sent);
  if (rank == 1) {
    EXPECT_GE(arrived - sent, modelled) << "the message overtook its modelled time";
  }
  comm.barrier();
}

// The same for collectives: a rank that enters an all-reduce 150 ms late delays everyone's result to
// at least its entry plus the modelled time, not just the early ranks' entry plus the modelled time.
TEST_F(CommTest, CollectiveEndsNoEarlierThanTheLastEntryPlusModelledTime) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  const LinkModel link{0.5, 0.0};
  std::vector<float> x(1 << 18, 1.0f);  // 1 MB
  const double modelled = modelled_ms(link, CollectiveKind::AllReduce, int64_t(x.size() * 4), N);
  comm.set_link_model(link);
  comm.barrier();
  if (rank == N - 1) std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const double entered = machine_ms();
  comm.all_reduce(view(x), ReduceOp::Sum);
  const double done = machine_ms();
  comm.set_link_model({});
  // From the last entry on the machine's clock, not from this rank's own start, which a busy machine
  // may delay past the others'.
  const double last_entry = comm.all_reduce_scalar(entered, ReduceOp::Max);
  EXPECT_GE(done - last_entry, modelled) << "done " << done - last_entry << " ms after the last rank entered";
}

// --link-latency-us without --link-gbps models latency alone: a small all-reduce then costs its
// 2(N-1) latencies, a send one.
TEST_F(CommTest, LatencyAloneIsModelled) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  const LinkModel link{0.0, 20000.0};  // 20 ms a message, unlimited bandwidth
  EXPECT_TRUE(link.on());
  EXPECT_NEAR(modelled_ms(link, CollectiveKind::AllReduce, 1 << 20, N), 2 * (N - 1) * 20.0, 1e-9);
  EXPECT_NEAR(modelled_ms(link, CollectiveKind::SendRecv, 1 << 20, N), 20.0, 1e-9);
  comm.set_link_model(link);
  std::vector<float> x(256, 1.0f);
  const double t0 = now_ms();
  comm.all_reduce(view(x), ReduceOp::Sum);
  EXPECT_GE(now_ms() - t0, 2 * (N - 1) * 20.0);
  comm.barrier();
  const double sent = machine_ms();
  CommHandle s = comm.send_async(view(x), (rank + 1) % N);
  std::vector<float> in(256);
  comm.recv(view(in), (rank + N - 1) % N);
  const double arrived = machine_ms();
  s.wait();
  comm.set_link_model({});
  // The message from the left arrives 20 ms after the left neighbour sent it (its time, on the
  // machine's clock: this rank may have started late).
  double left_sent = 0;
  for (int r = 0; r < N; r++) {
    const double v = value_of_rank(comm, r, sent);
    if (r == (rank + N - 1) % N) left_sent = v;
  }
  EXPECT_GE(arrived - left_sent, 20.0);
}

// Groups split from the world: each is a communicator of its own, with its own ranks and counters.
// Here ranks of equal parity form a group (ranks 0, 2, .. and 1, 3, ..), ordered by world rank.
TEST_F(CommTest, SplitGroupsReduceWithinThemselves) {
  std::unique_ptr<Communicator> group = comm.split(rank % 2, rank, "parity");
  const int members = (N - rank % 2 + 1) / 2;
  EXPECT_EQ(group->size(), members);
  EXPECT_EQ(group->rank(), rank / 2);
  EXPECT_EQ(group->group(), "parity");
  std::vector<float> x(1000, float(rank + 1));
  group->all_reduce(view(x), ReduceOp::Sum);
  float expected = 0;  // the sum of r+1 over the ranks of this parity
  for (int r = rank % 2; r < N; r += 2) expected += float(r + 1);
  EXPECT_TRUE(exactly(x, [&](int64_t) { return expected; }));
  EXPECT_EQ(group->stats().kind[int(CollectiveKind::AllReduce)].calls, 1);
  // The world's ops go on beside the group's, counted apart.
  const CommStats before = comm.stats();
  CommHandle world_op = comm.all_reduce_async(view(x), ReduceOp::Max);
  const double sum = group->all_reduce_scalar(1.0, ReduceOp::Sum);
  world_op.wait();
  EXPECT_EQ(sum, double(members));
  EXPECT_EQ(comm.stats().since(before).kind[int(CollectiveKind::AllReduce)].calls, 1);
  EXPECT_EQ(comm.stats().since(before).kind[int(CollectiveKind::Scalar)].calls, 0);
  // Tagged messages within the group: the tag, not the order, decides which receive gets which.
  if (group->size() > 1) {
    const int next = (group->rank() + 1) % group->size(), prev = (group->rank() + group->size() - 1) % group->size();
    std::vector<float> a(16, 1.0f), b(16, 2.0f), got_a(16), got_b(16);
    CommHandle rb = group->recv_async(view(got_b), prev, 2);
    CommHandle ra = group->recv_async(view(got_a), prev, 1);
    group->send(view(a), next, 1);
    group->send(view(b), next, 2);
    ra.wait();
    rb.wait();
    EXPECT_TRUE(exactly(got_a, [](int64_t) { return 1.0f; }));
    EXPECT_TRUE(exactly(got_b, [](int64_t) { return 2.0f; }));
  }
}

// A mixed-precision recipe's formats belong to the run's communicators, not to the process
// (Communicator::formats): installed on one, they hold for every group split from it, before or after,
// for its copy and for a LaneCommunicator around a group; cleared, every one of them is fp32 again.
TEST_F(CommTest, CollectiveFormatsHoldForEveryGroupOfTheCommunicator) {
  std::unique_ptr<Communicator> before = comm.split(rank % 2, rank, "split before");
  CollectiveFormats recipe;
  recipe.gradients = Wire::in(NumberFormat::FP16, 64);
  recipe.activations = Wire::in(NumberFormat::BF16);
  set_collective_formats(comm, recipe);
  std::unique_ptr<Communicator> after = comm.split(0, rank, "split after");
  std::unique_ptr<Communicator> copy = comm.duplicate("copy");
  LaneCommunicator lanes(*before);
  const std::vector<const Communicator*> every = {&comm, before.get(), after.get(), copy.get(), &lanes,
                                                  &lanes.of(Lane::Backward)};
  for (const Communicator* c : every) {
    const CollectiveFormats& f = collective_formats(*c);
    EXPECT_FALSE(f.gradients.fp32) << c->group();
    EXPECT_EQ(f.gradients.format, NumberFormat::FP16) << c->group();
    EXPECT_EQ(f.gradients.scale, 64.0f) << c->group();
    EXPECT_EQ(f.activations.format, NumberFormat::BF16) << c->group();
    EXPECT_TRUE(f.weights.fp32) << c->group();
  }
  set_collective_formats(comm, {});
  for (const Communicator* c : every)
    EXPECT_TRUE(collective_formats(*c).gradients.fp32 && collective_formats(*c).activations.fp32) << c->group();
}

// The two lanes of dualpipev's F&B pairs (lanes.h): two threads issue collectives on one group at
// once, each through its lane's communicator (the group, or its copy), in their own order. Every
// result is exact; the group's statistics are both lanes'; and the copy shares the group's emulated
// link, so two lanes' all-reduces issued at once take the time of two, one after the other.
TEST_F(CommTest, TwoLanesIssueCollectivesAtOnceEachOnItsCopyOfTheGroup) {
  LaneCommunicator lanes(comm);
  EXPECT_EQ(lanes.of(Lane::Backward).group(), comm.group() + " (backward lane)");
  EXPECT_EQ(lanes.of(Lane::Backward).size(), N);
  EXPECT_EQ(lanes.of(Lane::Backward).rank(), rank);
  const CommStats before = lanes.stats();
  constexpr int kRounds = 20;
  bool exact[kLanes] = {true, true};
  auto lane_work = [&](Lane lane) {
    const LaneScope scope(lane);
    const float scale = lane == Lane::Forward ? 1.0f : 100.0f;
    for (int i = 0; i < kRounds; i++) {
      std::vector<float> x(257, scale * float(rank + 1) * float(i + 1));
      lanes.all_reduce(view(x), ReduceOp::Sum);  // the lane's own communicator (LaneCommunicator::mine)
      exact[int(lane)] = exact[int(lane)] && exactly(x, [&](int64_t) { return scale * S1 * float(i + 1); });
    }
  };
  std::thread backward(lane_work, Lane::Backward);
  lane_work(Lane::Forward);
  backward.join();
  EXPECT_TRUE(exact[0]);
  EXPECT_TRUE(exact[1]);
  const CommStats both = lanes.stats().since(before);
  EXPECT_EQ(both.kind[int(CollectiveKind::AllReduce)].calls, 2 * kRounds);
  EXPECT_EQ(lanes.of(Lane::Forward).stats().kind[int(CollectiveKind::AllReduce)].calls +
                lanes.of(Lane::Backward).stats().kind[int(CollectiveKind::AllReduce)].calls,
            lanes.stats().kind[int(CollectiveKind::AllReduce)].calls);
  if (N == 1) return;
  const LinkModel link{0.2, 500.0};
  lanes.set_link_model(link);  // the group's and the copy's
  std::vector<float> x(size_t(1) << 16), y(x.size());
  const double one = modelled_ms(link, CollectiveKind::AllReduce, int64_t(x.size() * 4), N);
  const double t0 = now_ms();
  std::thread other([&] {
    const LaneScope scope(Lane::Backward);
    lanes.all_reduce(view(y), ReduceOp::Sum);
  });
  lanes.all_reduce(view(x), ReduceOp::Sum);
  other.join();
  EXPECT_GE(now_ms() - t0, 2 * one) << "the copy has a link of its own";
  lanes.set_link_model({});
}

// Two groups over the same ranks, their ops overlapping on the link: each communicator's exposed time
// stays within its own in-flight time (an op of the other group completing first must not take this
// group's interval).
TEST_F(CommTest, ExposedWithinInFlightAcrossGroups) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  std::unique_ptr<Communicator> group = comm.split(0, rank, "everyone");
  const LinkModel link{0.5, 0.0};
  comm.set_link_model(link);
  group->set_link_model(link);
  std::vector<float> small(1 << 16, 1.0f), large(1 << 18, 1.0f);  // 256 KB, 1 MB
  const CommStats world_before = comm.stats(), group_before = group->stats();
  CommHandle w = comm.all_reduce_async(view(small), ReduceOp::Sum);
  CommHandle g = group->all_reduce_async(view(large), ReduceOp::Sum);
  g.wait();
  w.wait();
  const CommStats world_step = comm.stats().since(world_before), group_step = group->stats().since(group_before);
  EXPECT_GT(group_step.exposed_ms, 0.0);
  EXPECT_LE(group_step.exposed_ms, group_step.in_flight_ms + 1e-9);
  EXPECT_LE(world_step.exposed_ms, world_step.in_flight_ms + 1e-9);
  group->set_link_model({});
}

// split() is a blocking collective on its communicator: it comes after the ops issued before it on
// every rank alike, even those the emulated link still holds.
TEST_F(CommTest, SplitAfterAnOpTheLinkStillHolds) {
  comm.set_link_model({1.0, 0.0});
  std::vector<float> x(1 << 18, float(rank + 1));  // 1 MB: several ms on the link
  CommHandle pending = comm.all_reduce_async(view(x), ReduceOp::Sum);
  std::unique_ptr<Communicator> group = comm.split(rank % 2, rank, "parity");
  pending.wait();
  EXPECT_TRUE(exactly(x, [&](int64_t) { return S1; }));
  EXPECT_EQ(group->size(), (N - rank % 2 + 1) / 2);
}

// The watchdog's message names what a stuck receive waits for: the peer by its world rank, which is
// not its rank in the group, and the group by its members' world ranks. DISABLED_, so not run with
// the others: the watchdog ends the whole job. tests/test_run_guards.cpp
// (Stops.TheWatchdogNamesThePeerOfAStuckReceiveAndItsGroup) runs it alone on 4 ranks and reads what
// it printed. World rank 3 receives from rank 0 of the odd ranks' group, world rank 1, which never
// sends.
TEST_F(CommTest, DISABLED_WatchdogEndsAReceiveThatNoOneSends) {
  if (N != 4) GTEST_SKIP() << "runs on 4 ranks";
  std::unique_ptr<Communicator> group = comm.split(rank % 2, rank, "pp");
  set_comm_timeout(1);
  std::vector<float> msg(64);
  if (rank == 3) group->recv(view(msg), 0);
  // The other ranks go on to the test's end, where the harness's agreement (mpi_gtest_main.cpp)
  // waits for rank 3 until the watchdog ends the job.
}

// Waits for `pending` while another thread interrupts the emulated link 100 ms in, as the run's
// signal handler would.
void wait_through_an_interrupt(CommHandle& pending) {
  std::thread interrupter([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    interrupt_link_emulation();
  });
  pending.wait();
  interrupter.join();
}

// A modelled wait ends when the run is interrupted (SIGINT, SIGTERM: the run's handler calls
// interrupt_link_emulation): the link stops holding, the op is posted at once, and its data arrives
// exact. Here each rank's all-reduce is held for 2(N-1) x 1000 s, until a thread interrupts it
// 100 ms in; before the hold was interruptible, this wait slept its full modelled time.
TEST_F(CommTest, AnInterruptEndsAModelledWait) {
  if (N < 2) GTEST_SKIP() << "one rank: nothing is held";
  comm.set_link_model({0.0, 1e9});  // 1000 s a hop: no flag allows it, a test may
  std::vector<float> x(1024, float(rank + 1));
  const auto start = std::chrono::steady_clock::now();
  CommHandle pending = comm.all_reduce_async(view(x), ReduceOp::Sum);
  wait_through_an_interrupt(pending);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // After the interrupt, new ops are not held either.
  std::vector<float> y(16, float(rank + 1));
  comm.all_reduce(view(y), ReduceOp::Sum);
  interrupt_link_emulation(false);
  EXPECT_TRUE(exactly(x, [&](int64_t) { return S1; }));
  EXPECT_TRUE(exactly(y, [&](int64_t) { return S1; }));
  EXPECT_LT(seconds, 10.0) << "the modelled wait outlived the interrupt";
}

// An interrupt posts what the link holds; once it is lifted, the link holds ops again, but only for
// their own time: not until the end of the 2000 s hold that the interrupted op skipped, which its lane
// still counted as busy (every later op on the communicator waited for it, forever to a test).
TEST_F(CommTest, AfterAnInterruptTheLinkHoldsOnlyNewOps) {
  if (N < 2) GTEST_SKIP() << "one rank: nothing is held";
  comm.set_link_model({0.0, 1e9});  // 1000 s a hop
  std::vector<float> x(256, float(rank + 1));
  CommHandle pending = comm.all_reduce_async(view(x), ReduceOp::Sum);
  wait_through_an_interrupt(pending);
  interrupt_link_emulation(false);  // lifted before any other op is issued
  comm.set_link_model({0.0, 1000.0});  // 1 ms a hop
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> y(16, float(rank + 1));
  comm.all_reduce(view(y), ReduceOp::Sum);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(exactly(y, [&](int64_t) { return S1; }));
  EXPECT_LT(seconds, 20.0) << "an op after the interrupt waited for the hold the interrupt skipped";
}

// The watchdog watches a modelled wait too, and says that the link is slow, not that a rank is dead:
// every rank holds its all-reduce 2(N-1) x 1000 s with a 1 s timeout. DISABLED_ (the watchdog ends
// the job): tests/test_refusals.cpp runs it alone on 2 ranks and reads what it printed.
TEST_F(CommTest, DISABLED_WatchdogEndsAModelledWaitLongerThanTheTimeout) {
  set_comm_timeout(1);
  comm.set_link_model({0.0, 1e9});
  std::vector<float> x(1024, float(rank + 1));
  comm.all_reduce(view(x), ReduceOp::Sum);
}

// The formula of comm.cpp against numbers worked out by hand.
TEST_F(CommTest, ModelledMsMatchesHandComputedValues) {
  // 8 Gbit/s = 1e9 bytes/s, alpha = 10 us, 4 ranks, 4 MB.
  const LinkModel fast{8.0, 10.0};
  const int64_t S = 4000000;
  // all-reduce: 2*3 * (10e-6 + 4e6 / (4 * 1e9)) s = 6 * 1.01 ms
  EXPECT_NEAR(modelled_ms(fast, CollectiveKind::AllReduce, S, 4), 6.06, 1e-9);
  // reduce-scatter and all-gather: half of it
  EXPECT_NEAR(modelled_ms(fast, CollectiveKind::ReduceScatter, S, 4), 3.03, 1e-9);
  EXPECT_NEAR(modelled_ms(fast, CollectiveKind::AllGather, S, 4), 3.03, 1e-9);
  // broadcast and send/recv: 10e-6 + 4e6 / 1e9 s
  EXPECT_NEAR(modelled_ms(fast, CollectiveKind::Broadcast, S, 4), 4.01, 1e-9);
  EXPECT_NEAR(modelled_ms(fast, CollectiveKind::SendRecv, S, 4), 4.01, 1e-9);
  // barrier: 2*3 latencies
  EXPECT_NEAR(modelled_ms(fast, CollectiveKind::Barrier, 0, 4), 0.06, 1e-12);
  // scalar: an all-reduce of 8 bytes, 6 * (10e-6 + 8 / 4e9) s
  EXPECT_NEAR(modelled_ms(fast, CollectiveKind::Scalar, 8, 4), 0.060012, 1e-12);

  // 1 Gbit/s = 1.25e8 bytes/s, no latency, 2 ranks, 1 MB: all-reduce 2 * 1e6 / 2.5e8 s.
  const LinkModel slow{1.0, 0.0};
  EXPECT_NEAR(modelled_ms(slow, CollectiveKind::AllReduce, 1000000, 2), 8.0, 1e-9);
  EXPECT_NEAR(modelled_ms(slow, CollectiveKind::AllGather, 1000000, 2), 4.0, 1e-9);
  EXPECT_NEAR(modelled_ms(slow, CollectiveKind::SendRecv, 1000000, 2), 8.0, 1e-9);

  // No link, or nobody to talk to: no time.
  EXPECT_FALSE(LinkModel{}.on());
  EXPECT_EQ(modelled_ms(LinkModel{}, CollectiveKind::AllReduce, S, 4), 0.0);
  EXPECT_EQ(modelled_ms(fast, CollectiveKind::AllReduce, S, 1), 0.0);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// All-to-all (expert parallelism's dispatch and combine)

namespace {
// Element i of what rank `from` sends to rank `to`: every (from, to, i) its own small integer.
float a2a_value(int from, int to, int64_t i) { return float((from + 1) * 100000 + (to + 1) * 1000 + i); }
// How many elements rank `from` sends to rank `to` in the variable-count tests: uneven, zero for
// some pairs (a rank that routes no token to another's experts), times `scale`.
int64_t a2a_count(int from, int to, int64_t scale) { return ((from + 2 * to) % 3) * scale; }
}  // namespace

TEST_F(CommTest, AllToAllIsExact) {
  const int64_t n = 37;  // elements per chunk
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "blocking");
    std::vector<float> in(size_t(N * n)), out(size_t(N * n), -1.0f);
    for (int to = 0; to < N; to++)
      for (int64_t i = 0; i < n; i++) in[size_t(to * n + i)] = a2a_value(rank, to, i);
    if (async) comm.all_to_all_async(view(in), view(out)).wait();
    else comm.all_to_all(view(in), view(out));
    EXPECT_TRUE(exactly(out, [&](int64_t j) { return a2a_value(int(j / n), rank, j % n); }));
  }
}

// MoE routing counts travel as int32 (moe.h): exact past 2^24, where a float count would round.
TEST_F(CommTest, Int32CountsGatherAndAllToAllExactly) {
  const int32_t big = (1 << 24) + 1;  // the first integer a float cannot hold
  std::vector<int32_t> mine(static_cast<size_t>(N)), gathered(size_t(N * N), -1), received(size_t(N), -1);
  for (int to = 0; to < N; to++) mine[size_t(to)] = big + 2 * (rank * N + to);
  comm.all_gather(make_view(mine.data(), {int64_t(N)}, DType::I32), make_view(gathered.data(), {int64_t(N * N)}, DType::I32));
  comm.all_to_all(make_view(mine.data(), {int64_t(N)}, DType::I32), make_view(received.data(), {int64_t(N)}, DType::I32));
  for (int from = 0; from < N; from++) {
    EXPECT_EQ(received[size_t(from)], big + 2 * (from * N + rank)) << "from rank " << from;
    for (int to = 0; to < N; to++) EXPECT_EQ(gathered[size_t(from * N + to)], big + 2 * (from * N + to));
  }
}

TEST_F(CommTest, AllToAllVIsExact) {
  for (int64_t scale : {1, 500})
    for (bool async : {false, true}) {
      SCOPED_TRACE("counts x" + std::to_string(scale) + (async ? " async" : " blocking"));
      std::vector<int64_t> send_counts(N), recv_counts(N);
      for (int r = 0; r < N; r++) send_counts[r] = a2a_count(rank, r, scale), recv_counts[r] = a2a_count(r, rank, scale);
      std::vector<float> in(total_of(send_counts)), out(total_of(recv_counts), -1.0f);
      for (int to = 0; to < N; to++)
        for (int64_t i = 0; i < send_counts[to]; i++) in[size_t(offset_of(send_counts, to) + i)] = a2a_value(rank, to, i);
      if (async) comm.all_to_all_v_async(view(in), send_counts, view(out), recv_counts).wait();
      else comm.all_to_all_v(view(in), send_counts, view(out), recv_counts);
      EXPECT_TRUE(exactly(out, [&](int64_t j) {
        const int from = owner_of(recv_counts, j);
        return a2a_value(from, rank, j - offset_of(recv_counts, from));
      }));
    }
}

// Even counts: each rank keeps its own chunk and sends the other N-1, so it sends and receives
// (N-1)/N of its send buffer. Variable counts: what the counts say, the own segment excluded.
TEST_F(CommTest, AllToAllCountsItsBytes) {
  const int64_t n = 256;
  std::vector<float> in(size_t(N * n), 1.0f), out(size_t(N * n));
  CommStats before = comm.stats();
  comm.all_to_all(view(in), view(out));
  CollectiveCounters d = delta(comm.stats(), before, CollectiveKind::AllToAll);
  const int64_t S = 4 * N * n;
  EXPECT_EQ(d.calls, 1);
  EXPECT_EQ(d.launched, 1);
  EXPECT_EQ(d.payload_bytes, S);
  EXPECT_EQ(d.sent_bytes, (N - 1) * S / N);
  EXPECT_EQ(d.received_bytes, (N - 1) * S / N);
  EXPECT_EQ(wire_bytes_for(CollectiveKind::AllToAll, S, N), (N - 1) * S / N);

  std::vector<int64_t> send_counts(N), recv_counts(N);
  int64_t sent = 0, received = 0;
  for (int r = 0; r < N; r++) {
    send_counts[r] = a2a_count(rank, r, 100), recv_counts[r] = a2a_count(r, rank, 100);
    if (r != rank) sent += 4 * send_counts[r], received += 4 * recv_counts[r];
  }
  std::vector<float> vin(total_of(send_counts), 1.0f), vout(total_of(recv_counts));
  before = comm.stats();
  comm.all_to_all_v(view(vin), send_counts, view(vout), recv_counts);
  d = delta(comm.stats(), before, CollectiveKind::AllToAll);
  EXPECT_EQ(d.calls, 1);
  EXPECT_EQ(d.payload_bytes, int64_t(4 * vin.size()));
  EXPECT_EQ(d.sent_bytes, N == 1 ? 0 : sent);
  EXPECT_EQ(d.received_bytes, N == 1 ? 0 : received);
  // What travelled, summed over the group, is what was sent, summed: every byte has one sender.
  EXPECT_EQ(comm.all_reduce_scalar(double(d.sent_bytes), ReduceOp::Sum),
            comm.all_reduce_scalar(double(d.received_bytes), ReduceOp::Sum));
}

// The formula of docs/theory.md: (N-1)(alpha + S/(N beta)), and the variable form's link bytes give
// back S for an even split.
TEST(AllToAllModel, ModelledTimeIsPairwiseExchange) {
  const LinkModel link{8.0, 10.0};  // 1 GB/s, 10 us
  for (int n : {2, 3, 4, 8}) {
    const int64_t S = 3000000;
    const double expected_ms = (n - 1) * (10e-6 + double(S) / n / 1e9) * 1e3;
    EXPECT_NEAR(modelled_ms(link, CollectiveKind::AllToAll, S, n), expected_ms, 1e-9) << n << " ranks";
    const int64_t travelling = (n - 1) * S / n;
    EXPECT_EQ(all_to_all_v_link_bytes(travelling, travelling, n), S) << n << " ranks";
    // Uneven: the larger direction sets the time, (N-1) alpha + max(sent, received) / beta.
    EXPECT_NEAR(modelled_ms(link, CollectiveKind::AllToAll, all_to_all_v_link_bytes(1000, 700000, n), n),
                ((n - 1) * 10e-6 + 700000 / 1e9) * 1e3, 1e-6)
        << n << " ranks";
  }
  EXPECT_EQ(modelled_ms(link, CollectiveKind::AllToAll, 1000, 1), 0.0);
}

TEST_F(CommTest, AllToAllTakesAtLeastItsModelledTime) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  const LinkModel link{0.2, 500.0};  // 25 MB/s, 0.5 ms per message
  comm.set_link_model(link);
  std::vector<float> in(size_t(N) << 14, 1.0f), out(in.size());
  const double expected = modelled_ms(link, CollectiveKind::AllToAll, int64_t(4 * in.size()), N);
  CommStats before = comm.stats();
  double t0 = now_ms();
  comm.all_to_all(view(in), view(out));
  EXPECT_GE(now_ms() - t0, expected);
  EXPECT_GE(delta(comm.stats(), before, CollectiveKind::AllToAll).busy_ms, expected - 1e-3);

  std::vector<int64_t> send_counts(N), recv_counts(N);
  int64_t sent = 0, received = 0;
  for (int r = 0; r < N; r++) {
    send_counts[r] = a2a_count(rank, r, 4000), recv_counts[r] = a2a_count(r, rank, 4000);
    if (r != rank) sent += 4 * send_counts[r], received += 4 * recv_counts[r];
  }
  std::vector<float> vin(total_of(send_counts), 1.0f), vout(total_of(recv_counts));
  const double own = modelled_ms(link, CollectiveKind::AllToAll, all_to_all_v_link_bytes(sent, received, N), N);
  before = comm.stats();
  t0 = now_ms();
  comm.all_to_all_v(view(vin), send_counts, view(vout), recv_counts);
  EXPECT_GE(now_ms() - t0, own);
  EXPECT_GE(delta(comm.stats(), before, CollectiveKind::AllToAll).busy_ms, own - 1e-3);
}

// The same exchanges of CUDA tensors, through the CUDA communicator (comm_nccl.cpp): NCCL at one rank,
// the host-staged fallback when several ranks share a GPU (one GPU per rank would run NCCL's grouped
// ncclSend/ncclRecv). Skipped without a GPU or a CUDA build.
TEST_F(CommTest, AllToAllOfCudaTensors) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU here: " << why;
  std::unique_ptr<Communicator> cuda = communicator_for(Device::CUDA, comm.split(0, rank, "cuda"));
  ASSERT_EQ(cuda->device(), Device::CUDA);
  const int64_t n = 37;
  std::vector<float> in(size_t(N * n)), out(size_t(N * n), -1.0f);
  for (int to = 0; to < N; to++)
    for (int64_t i = 0; i < n; i++) in[size_t(to * n + i)] = a2a_value(rank, to, i);
  Buffer send(N * n, MemCategory::Other, Device::CUDA), recv(N * n, MemCategory::Other, Device::CUDA);
  transfer(send.view(), view(in));
  cuda->all_to_all(send.view(), recv.view());
  transfer(view(out), recv.view());
  EXPECT_TRUE(exactly(out, [&](int64_t j) { return a2a_value(int(j / n), rank, j % n); }));

  std::vector<int64_t> send_counts(N), recv_counts(N);
  for (int r = 0; r < N; r++) send_counts[r] = a2a_count(rank, r, 100), recv_counts[r] = a2a_count(r, rank, 100);
  std::vector<float> vin(total_of(send_counts)), vout(total_of(recv_counts), -1.0f);
  for (int to = 0; to < N; to++)
    for (int64_t i = 0; i < send_counts[to]; i++) vin[size_t(offset_of(send_counts, to) + i)] = a2a_value(rank, to, i);
  Buffer vsend(std::max<int64_t>(1, total_of(send_counts)), MemCategory::Other, Device::CUDA);
  Buffer vrecv(std::max<int64_t>(1, total_of(recv_counts)), MemCategory::Other, Device::CUDA);
  const Tensor vs = vsend.view().slice1d(0, total_of(send_counts)), vr = vrecv.view().slice1d(0, total_of(recv_counts));
  if (!vin.empty()) transfer(vs, view(vin));
  const CommStats before = cuda->stats();
  cuda->all_to_all_v(vs, send_counts, vr, recv_counts);
  if (!vout.empty()) transfer(view(vout), vr);
  EXPECT_TRUE(exactly(vout, [&](int64_t j) {
    const int from = owner_of(recv_counts, j);
    return a2a_value(from, rank, j - offset_of(recv_counts, from));
  }));
  int64_t sent = 0;
  for (int r = 0; r < N; r++)
    if (r != rank) sent += 4 * send_counts[r];
  EXPECT_EQ(delta(cuda->stats(), before, CollectiveKind::AllToAll).sent_bytes, N == 1 ? 0 : sent);
}

