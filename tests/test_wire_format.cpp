// test_wire_format.cpp: collectives in a low-precision format (comm/wire_format.h), on 1, 2 and 4 ranks.
//   - an fp32 wire is the communicator's own collective: the same values bit for bit, the same bytes;
//   - a bf16 or fp16 reduction rounds each contribution once before the send, adds in fp32 and rounds
//     each sum to the format; an average is premultiplied by 1/N; a scale (a power of two) keeps small
//     values out of fp16's underflow, and the result is divided by it again;
//   - a gather moves the codes: E4M3 one byte an element, with its scale; a gather of mixed segments
//     keeps its fp32 elements bit for bit; an all-to-all (expert parallelism's) moves every segment's
//     codes, the rank's own included;
//   - the counters count the format's bytes: 2(N-1)/N x 2 bytes an element for a bf16 all-reduce, and so on;
//   - on one rank nothing travels and nothing is rounded: the values come back as they were;
//   - ZeRO-1's in-place gather keeps the rank's own chunk (its fp32 master) and takes the others' codes;
//   - the codes are staged in one buffer per communicator: as large as the calls in flight at once
//     stage, allocated in the first round of calls and reused, not grown, by the same round again.
// Values are chosen so that every sum is exact in the format whatever order the ranks add in.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "comm/wire_format.h"
#include "ops/memory.h"  // memory_stats: the staging counted
#include "mpi_test_env.h"

namespace {

Tensor view(std::vector<float>& v) { return make_view(v.data(), {int64_t(v.size())}); }

const CollectiveCounters& counters(Communicator& c, CollectiveKind k) { return c.stats().kind[int(k)]; }

float in_format(NumberFormat f, float x, float scale = 1) {
  const Overflow o = f == NumberFormat::E4M3 || f == NumberFormat::E5M2 ? Overflow::Saturate : Overflow::Ieee;
  return decode_code(f, encode_float(f, x * scale, o)) / scale;
}

TEST(WireFormat, Fp32IsTheCollectiveItself) {
  Communicator& comm = test_comm();
  const int N = comm.size(), r = comm.rank();
  std::vector<float> a(1000), b;
  for (size_t i = 0; i < a.size(); i++) a[i] = std::sin(0.37f * float(i) + float(r)) / float(i + 1);
  b = a;
  const CollectiveCounters before = counters(comm, CollectiveKind::AllReduce);
  comm.all_reduce(view(a), ReduceOp::Avg);
  const int64_t plain_bytes = counters(comm, CollectiveKind::AllReduce).sent_bytes - before.sent_bytes;
  wire_all_reduce_async(comm, view(b), ReduceOp::Avg, Wire()).wait();
  const int64_t wire_bytes = counters(comm, CollectiveKind::AllReduce).sent_bytes - before.sent_bytes - plain_bytes;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  EXPECT_EQ(wire_bytes, plain_bytes);
  EXPECT_EQ(wire_bytes, N > 1 ? 2 * (N - 1) * 4000 / N : 0);
}

TEST(WireFormat, AReductionRoundsEachContributionAndAddsTheCodes) {
  Communicator& comm = test_comm();
  const int N = comm.size(), r = comm.rank();
  const int64_t n = 64 * N;
  for (NumberFormat f : {NumberFormat::BF16, NumberFormat::FP16}) {
    // Rank r gives (r+1)(i%8+1) plus a part below the format's half ulp: rounded away before the send,
    // where an fp32 all-reduce would keep it. Every partial sum is a small integer, exact in the format.
    std::vector<float> x(size_t(n), 0.0f);
    for (int64_t i = 0; i < n; i++) x[size_t(i)] = float((r + 1) * (i % 8 + 1)) * (1 + std::ldexp(1.0f, -13));
    const CollectiveCounters before = counters(comm, CollectiveKind::AllReduce);
    wire_all_reduce_async(comm, view(x), ReduceOp::Sum, Wire::in(f)).wait();
    for (int64_t i = 0; i < n; i++) {
      const float sum = float(N * (N + 1) / 2 * (i % 8 + 1));
      EXPECT_EQ(x[size_t(i)], N == 1 ? sum * (1 + std::ldexp(1.0f, -13)) : sum) << format_name(f) << " " << i;
    }
    EXPECT_EQ(counters(comm, CollectiveKind::AllReduce).sent_bytes - before.sent_bytes, 2 * (N - 1) * n * 2 / N);
    // An average: each contribution times 1/N before the send (exact: N is a power of two here).
    if ((N & (N - 1)) == 0) {
      for (int64_t i = 0; i < n; i++) x[size_t(i)] = float(N * (r + 1));
      wire_all_reduce_async(comm, view(x), ReduceOp::Avg, Wire::in(f)).wait();
      for (int64_t i = 0; i < n; i++) EXPECT_EQ(x[size_t(i)], float(N * (N + 1) / 2)) << format_name(f);
    }
  }
  if (N == 2) {  // the sum itself is rounded: 256 + 1 is a tie between 256 and 258 in bf16; it goes to 256
    std::vector<float> x(4, r == 0 ? 256.0f : 1.0f);
    wire_all_reduce_async(comm, view(x), ReduceOp::Sum, Wire::in(NumberFormat::BF16)).wait();
    EXPECT_EQ(x[0], 256.0f);
    std::vector<float> y(4, r == 0 ? 2048.0f : 1.0f);  // fp16's tie: 2049 -> 2048
    wire_all_reduce_async(comm, view(y), ReduceOp::Sum, Wire::in(NumberFormat::FP16)).wait();
    EXPECT_EQ(y[0], 2048.0f);
  }
}

TEST(WireFormat, AScaleKeepsSmallGradientsAboveFp16sUnderflow) {
  Communicator& comm = test_comm();
  const int N = comm.size();
  const float tiny = std::ldexp(1.0f, -30);  // below fp16's smallest subnormal, 2^-24
  std::vector<float> plain(8, tiny), scaled(8, tiny);
  wire_all_reduce_async(comm, view(plain), ReduceOp::Sum, Wire::in(NumberFormat::FP16)).wait();
  wire_all_reduce_async(comm, view(scaled), ReduceOp::Sum, Wire::in(NumberFormat::FP16, std::ldexp(1.0f, 24))).wait();
  EXPECT_EQ(plain[0], N == 1 ? tiny : 0.0f);
  EXPECT_EQ(scaled[0], float(N) * tiny);
}

TEST(WireFormat, AReduceScatterMovesCodes) {
  Communicator& comm = test_comm();
  const int N = comm.size(), r = comm.rank();
  const int64_t n = 40;
  std::vector<float> send(static_cast<size_t>(n * N)), recv(static_cast<size_t>(n));
  // Integers below 256, exact in bf16 whatever the order of the sums; the added part is rounded away.
  for (int64_t i = 0; i < n * N; i++) send[size_t(i)] = float((r + 1) * (i % 16 + 1)) + std::ldexp(1.0f, -12);
  const CollectiveCounters before = counters(comm, CollectiveKind::ReduceScatter);
  wire_reduce_scatter_async(comm, view(send), view(recv), ReduceOp::Sum, Wire::in(NumberFormat::BF16)).wait();
  for (int64_t i = 0; i < n; i++) {
    const int64_t global = r * n + i;
    const float sum = float(N * (N + 1) / 2 * (global % 16 + 1));
    EXPECT_EQ(recv[size_t(i)], N == 1 ? sum + std::ldexp(1.0f, -12) : sum) << i;
  }
  EXPECT_EQ(counters(comm, CollectiveKind::ReduceScatter).sent_bytes - before.sent_bytes, (N - 1) * n * 2);
}

TEST(WireFormat, AnAllToAllMovesCodesOfEverySegment) {
  // Expert parallelism's exchange (wire_all_to_all_v_async): rank r sends q + 1 elements to rank q,
  // each the value r + 1 + q/8 + 2^-12 (the last part below half of fp16's ulp at a scale of 4:
  // rounded away), its own segment included; fp16 at the loss scale 4, as a gradient travels.
  Communicator& comm = test_comm();
  const int N = comm.size(), r = comm.rank();
  std::vector<int64_t> send_counts(static_cast<size_t>(N), 0), recv_counts(static_cast<size_t>(N), int64_t(r + 1));
  std::vector<float> send;
  for (int q = 0; q < N; q++) {
    send_counts[size_t(q)] = q + 1;
    for (int i = 0; i <= q; i++) send.push_back(float(r + 1) + float(q) / 8 + std::ldexp(1.0f, -12));
  }
  std::vector<float> recv(size_t(N * (r + 1)), -1.0f);
  const CollectiveCounters before = counters(comm, CollectiveKind::AllToAll);
  wire_all_to_all_v_async(comm, view(send), send_counts, view(recv), recv_counts, Wire::in(NumberFormat::FP16, 4)).wait();
  for (int s = 0; s < N; s++) {
    for (int i = 0; i <= r; i++) {
      const float exact = float(s + 1) + float(r) / 8, got = recv[size_t(s * (r + 1) + i)];
      EXPECT_EQ(got, N == 1 ? exact + std::ldexp(1.0f, -12) : exact) << "from " << s;
      if (N > 1) {
        EXPECT_EQ(got, in_format(NumberFormat::FP16, exact + std::ldexp(1.0f, -12), 4)) << "from " << s;
      }
    }
  }
  // 2 bytes an element to every other rank: (sum of q + 1 over q != r) x 2.
  EXPECT_EQ(counters(comm, CollectiveKind::AllToAll).sent_bytes - before.sent_bytes,
            N > 1 ? 2 * (N * (N + 1) / 2 - (r + 1)) : 0);
}

TEST(WireFormat, AnFp8GatherMovesOneByteAnElementWithItsScale) {
  Communicator& comm = test_comm();
  const int N = comm.size(), r = comm.rank();
  const int64_t n = 100;
  const float scale = 1024;  // 0.001 x 1024 ~ 1: inside E4M3's normal range
  std::vector<float> full(size_t(n * N), -1.0f);
  auto value = [](int64_t g) { return 0.001f * float(g % 37 + 1) * (g % 2 ? -1.0f : 1.0f); };
  for (int64_t i = 0; i < n; i++) full[size_t(r * n + i)] = value(r * n + i);
  const CollectiveCounters before = counters(comm, CollectiveKind::AllGather);
  // In place: send is this rank's chunk of recv, as ZeRO gathers.
  wire_all_gather_async(comm, view(full).slice1d(r * n, n), view(full), Wire::in(NumberFormat::E4M3, scale)).wait();
  for (int64_t g = 0; g < n * N; g++)
    EXPECT_EQ(full[size_t(g)], N == 1 ? value(g) : in_format(NumberFormat::E4M3, value(g), scale)) << g;
  if (N > 1) {
    EXPECT_NE(full[1], value(1));  // the values did travel rounded
  }
  EXPECT_EQ(counters(comm, CollectiveKind::AllGather).sent_bytes - before.sent_bytes, (N - 1) * n);
}

TEST(WireFormat, AGatherOfSegmentsKeepsItsFp32ElementsExactly) {
  Communicator& comm = test_comm();
  const int N = comm.size(), r = comm.rank();
  const int64_t n = 30, total = n * N;
  // fp32 at the start, bf16 in the middle, fp32 again, e4m3 at the end: uneven bytes per rank.
  const std::vector<WireSegment> segments = {{5, total / 2 - 5, Wire::in(NumberFormat::BF16)},
                                             {total - 7, 7, Wire::in(NumberFormat::E4M3, 64)}};
  auto wire_of = [&](int64_t g) {
    return g >= 5 && g < total / 2 ? 2 : g >= total - 7 ? 1 : 0;  // 0: fp32
  };
  auto value = [](int64_t g) { return 1.0f / float(g + 3); };
  std::vector<float> send(static_cast<size_t>(n)), recv(static_cast<size_t>(total));
  for (int64_t i = 0; i < n; i++) send[size_t(i)] = value(r * n + i);
  const CollectiveCounters before = counters(comm, CollectiveKind::AllGather);
  wire_all_gather_segments_async(comm, view(send), view(recv), segments).wait();
  for (int64_t g = 0; g < total; g++) {
    const int w = wire_of(g);
    const float expected = w == 0 || N == 1 ? value(g) : w == 2 ? in_format(NumberFormat::BF16, value(g))
                                                      : in_format(NumberFormat::E4M3, value(g), 64);
    EXPECT_EQ(recv[size_t(g)], expected) << g;
  }
  int64_t mine = 0;
  for (int64_t i = r * n; i < (r + 1) * n; i++) mine += wire_of(i) == 0 ? 4 : wire_of(i);
  EXPECT_EQ(wire_bytes_of_range(segments, r * n, n), mine);
  EXPECT_EQ(counters(comm, CollectiveKind::AllGather).sent_bytes - before.sent_bytes, (N - 1) * mine);  // 0 on one rank
}

TEST(WireFormat, AGatherInPlaceKeepsTheOwnChunkAsItIs) {
  Communicator& comm = test_comm();
  const int N = comm.size(), r = comm.rank();
  const int64_t n = 40;
  auto value = [](int64_t g) { return 1.0f / float(g + 3); };  // none of them a bf16 value
  std::vector<float> full(size_t(n * N), -1.0f);
  for (int64_t i = 0; i < n; i++) full[size_t(r * n + i)] = value(r * n + i);
  const std::vector<WireSegment> all_bf16 = {{0, n * N, Wire::in(NumberFormat::BF16)}};
  wire_all_gather_segments_async(comm, view(full).slice1d(r * n, n), view(full), all_bf16, /*keep_own=*/true).wait();
  for (int64_t g = 0; g < n * N; g++) {
    const bool own = g / n == r;
    EXPECT_EQ(full[size_t(g)], own || N == 1 ? value(g) : in_format(NumberFormat::BF16, value(g))) << g;
  }
}

TEST(WireFormat, TheStagingBufferIsReusedNotGrown) {
  // A fresh group, so that its staging holds only this test's calls.
  Communicator& world = test_comm();
  std::unique_ptr<Communicator> comm = world.split(0, world.rank(), "staging");
  const int N = comm->size();
  const int64_t n = 64;  // elements of each rank's piece
  std::vector<float> a(size_t(n * N), 0.5f), b(size_t(n * N), 0.25f), piece(static_cast<size_t>(n));
  const Wire bf16 = Wire::in(NumberFormat::BF16);
  auto one_round = [&] {  // an all-reduce and a reduce-scatter in flight at once, then waited
    CommHandle x = wire_all_reduce_async(*comm, view(a), ReduceOp::Sum, bf16);
    CommHandle y = wire_reduce_scatter_async(*comm, view(b), view(piece), ReduceOp::Sum, bf16);
    x.wait();
    y.wait();
  };
  EXPECT_EQ(wire_staging_bytes(*comm), 0);
  one_round();
  // Their codes side by side: nN (all-reduce) + nN + n (the reduce-scatter's send and its piece), 2
  // bytes each; nothing on one rank, where no byte travels.
  const int64_t codes = N == 1 ? 0 : 2 * (n * N + n * N + n);
  EXPECT_EQ(wire_staging_bytes(*comm), codes);
  const int64_t counted = memory_stats().current[int(MemCategory::CommBuffers)];
  for (int i = 0; i < 3; i++) one_round();
  EXPECT_EQ(wire_staging_bytes(*comm), codes);  // the block the first round grew, reused
  EXPECT_EQ(memory_stats().current[int(MemCategory::CommBuffers)], counted);
  if (N > 1) {
    EXPECT_GE(counted, codes);  // counted as communication buffers
  }
}

}  // namespace
