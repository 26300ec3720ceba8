// test_comm.cpp: tests of the MPI communicator (comm_mpi.cpp), run on several ranks:
//   mpiexec -n 2 ./test_comm && mpiexec -n 4 ./test_comm
// Data tests use exactly predictable values (rank r contributes r+1, or (r+1)(i+1) for element i):
// small integers, which fp32 sums exactly in any order, so no difference at all is allowed. Timing
// tests check what the communication thread promises: an async collective progresses while the
// caller computes, the emulated link takes at least its modelled time, and waiting burns no CPU.
// They leave wide margins, because 4 ranks share 2 cores here.
#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "mpi_test_env.h"
#include "trace.h"

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
  d.payload_bytes = a.payload_bytes - b.payload_bytes;
  d.wire_bytes = a.wire_bytes - b.wire_bytes;
  d.busy_ms = a.busy_ms - b.busy_ms;
  return d;
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

TEST_F(CommTest, BarrierWaitsForTheSlowestRank) {
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "blocking");
    comm.barrier();
    const double t0 = now_ms();
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (async) comm.barrier_async().wait();
    else comm.barrier();
    const double waited = now_ms() - t0;
    // Rank 0 arrives 100 ms late; the margin covers the ranks' skew leaving the first barrier.
    if (rank != 0) {
      EXPECT_GE(waited, 50.0);
    }
  }
}

TEST_F(CommTest, AllReduceScalarIsExact) {
  EXPECT_EQ(comm.all_reduce_scalar(rank + 1, ReduceOp::Sum), double(S1));
  EXPECT_EQ(comm.all_reduce_scalar(rank + 1, ReduceOp::Avg), double(S1) / N);
  EXPECT_EQ(comm.all_reduce_scalar(rank + 1, ReduceOp::Max), double(N));
  EXPECT_EQ(comm.all_reduce_scalar(rank + 1, ReduceOp::Min), 1.0);
  EXPECT_EQ(comm.all_reduce_scalar(-0.5 * (rank + 1), ReduceOp::Sum), -0.5 * S1);
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
// stall of a few tens of ms. So an overlap experiment gets up to three tries, and passes when one
// try succeeds on every rank (the ranks agree after each try, so all run the same number of tries).
// A communicator that did not overlap would fail every try.
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
  std::vector<float> x(1 << 18);  // 1 MB
  double exposed = 0, busy = 0;
  const bool overlapped = on_every_rank_within_tries(3, [&] {
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
  const bool hidden = on_every_rank_within_tries(3, [&] {
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
    EXPECT_EQ(d.payload_bytes, e.payload);
    EXPECT_EQ(d.wire_bytes, e.wire);
    EXPECT_GT(d.busy_ms, 0.0);
  }
  EXPECT_EQ(after.total_calls() - before.total_calls(), 9);
  EXPECT_GE(after.exposed_ms, before.exposed_ms);
}

// ---------------------------------------------------------------------------------------------
// Link emulation

TEST_F(CommTest, EmulatedLinkTakesAtLeastModelledTime) {
  if (N == 1) GTEST_SKIP() << "one rank has no link to emulate";
  const LinkModel link{0.2, 500.0};  // 25 MB/s, 0.5 ms per message: tens of ms for 1 MB
  comm.set_link_model(link);
  std::vector<float> x(1 << 18), part(x.size() / N);  // 1 MB (divides by 2 and 4)
  const int64_t bytes = int64_t(x.size() * 4);

  struct Case {
    CollectiveKind kind;
    std::function<void()> run;
  };
  const Case cases[] = {
      {CollectiveKind::AllReduce, [&] { comm.all_reduce(view(x), ReduceOp::Sum); }},
      {CollectiveKind::ReduceScatter, [&] { comm.reduce_scatter(view(x), view(part), ReduceOp::Sum); }},
      {CollectiveKind::Broadcast, [&] { comm.broadcast(view(x), 0); }},
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

// The formula of comm_mpi.cpp against numbers worked out by hand.
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
  EXPECT_EQ(modelled_ms(LinkModel{}, CollectiveKind::AllReduce, S, 4), 0.0);
  EXPECT_EQ(modelled_ms(fast, CollectiveKind::AllReduce, S, 1), 0.0);
}

}  // namespace
