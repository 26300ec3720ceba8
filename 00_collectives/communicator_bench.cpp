// communicator_bench.cpp: chapter 00's second table (--communicator): the communicator every chapter
// talks to, next to raw MPI, in the manner of NVIDIA/nccl-tests. Defines communicator_tables().
//
// Table 1 times all_reduce, reduce_scatter and all_gather, sizes x4 apart, twice: "raw" calls MPI
// directly (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather on a copy of MPI_COMM_WORLD),
// "ours" the blocking forms of common/comm/comm.h, and "x" is ours / raw: what our communicator (its
// progress engine, counters and checks) costs over MPI itself. Each size runs warm-up iterations, then
// enough timed iterations to fill about 0.2 s (at least 3, at most 1000). The time is the mean per
// call, averaged over ranks. One extra call per size, in which rank r contributes r+1, checks ours
// exactly: "#wrong" counts wrong elements over all ranks (0 expected). With an emulated link
// (--link-gbps, --link-latency-us) the raw calls sleep out the same modelled time after MPI returns,
// so that "x" still compares the mechanics. Below the table, the all-reduce at 4 B and at the
// smallest size once more, call by call: the median of 2000 calls of each side, raw and ours
// alternated in blocks of 200, which a busy machine moves far less than the table's means.
//
// How to read the columns (as nccl-tests defines them; bytes = the full size, for reduce_scatter
// the whole input, for all_gather the whole output):
//   algbw = bytes / time: how fast the user's buffer gets processed. It depends on N for the same
//           link, because a ring all-reduce makes every rank send 2(N-1)/N x bytes.
//   busbw = algbw x 2(N-1)/N (all_reduce), x (N-1)/N (reduce_scatter, all_gather): the rate each
//           rank's link actually carried. It is comparable across rank counts and with the link's
//           own speed. On an emulated link (--link-gbps G) busbw climbs toward G/8 GB/s as sizes grow
//           and the latency term 2(N-1) alpha fades; small sizes are latency-bound (busbw near 0).
//           Without emulation the ranks share one machine's memory, so large sizes measure copies and
//           additions, and small ones the latency of MPI's shared-memory path.
//
// Table 2 all-reduces the gradient of the tiny and small presets three ways, with the same bytes
// (the per-tensor plan skips the padding between units, where the rank count makes any):
//   raw MPI       one MPI_Allreduce of the whole flat buffer, called directly (only here; the
//                 framework always goes through the Communicator). With --link-gbps the caller then
//                 sleeps out the same modelled link time the Communicator would.
//   buckets       chapter 03: GradientBuckets of 0.125 MB, one async all_reduce each, then wait all.
//   per tensor    chapter 02: one async all_reduce per parameter tensor, then wait all.
// No compute runs beside them, so nothing is hidden: this is the bare cost of each plan. Every
// collective pays a fixed latency (on a link of latency alpha, 2(N-1) alpha per all-reduce), while
// the bytes cost the same however they are cut. So
//   time ~ collectives x 2(N-1) alpha + 2(N-1)/N x bytes / bandwidth,
// and the table prints what each collective beyond the first cost. The per-tensor plan pays the
// latency 28 (tiny) or 52 (small) times, buckets 4 or 13 times: nearly the single call's time, yet
// chapter 03 can still start sending before backward ends. Without --link-gbps the gap may vanish:
// MPI progresses collectives posted together concurrently through shared memory, where a real (or
// emulated) link carries one at a time. Run it with --link-gbps 0.5 --link-latency-us 50 to see it.
// All three use ReduceOp::Sum; the chapters use Avg, which adds a scaling pass.
#include "communicator_bench.h"

#include <mpi.h>  // the raw baselines of tables 1 and 2 only

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/check.h"
#include "comm/trace.h"  // now_ms()
#include "model/model_config.h"
#include "model/param_layout.h"
#include "ops/memory.h"
#include "parallel/buckets.h"

namespace {

constexpr int kWarmupIters = 2;     // the first touches the pages and sets up MPI's connections
constexpr double kTargetMs = 200;   // timed duration to aim for per collective, size and side
constexpr int kMinIters = 3;
constexpr int kMaxIters = 1000;
constexpr double kBucketBytes = 0.125e6;  // chapter 03's default --bucket-mb


// Runs `iteration` (one or more collectives, identical on every rank) kWarmupIters times, then times
// it; returns the mean milliseconds per iteration, averaged over ranks. The number of timed
// iterations follows from the warm-up's duration. Every rank must run the same number, since each
// iteration is a collective, so the ranks agree on the slowest rank's estimate first.
double time_iterations(Communicator& comm, const std::function<void()>& iteration) {
  comm.barrier();
  double start = now_ms();
  for (int i = 0; i < kWarmupIters; i++) iteration();
  const double warmup_ms = comm.all_reduce_scalar((now_ms() - start) / kWarmupIters, ReduceOp::Max);
  const int iters = std::clamp(int(kTargetMs / std::max(warmup_ms, 1e-3)), kMinIters, kMaxIters);

  comm.barrier();  // start together, so no rank's mean includes waiting for a late peer
  start = now_ms();
  for (int i = 0; i < iters; i++) iteration();
  return comm.all_reduce_scalar((now_ms() - start) / iters, ReduceOp::Avg);
}

// ---------------------------------------------------------------------------------------------
// Table 1: one collective at a time

// `count` is always the full size in floats (a multiple of the rank count): all_reduce reduces
// count, reduce_scatter turns count into count/N per rank, all_gather turns count/N into count.
void run_collective(Communicator& comm, CollectiveKind kind, const Tensor& send, const Tensor& recv, int64_t count) {
  const int64_t chunk = count / comm.size();
  switch (kind) {
    case CollectiveKind::AllReduce: comm.all_reduce(send.slice1d(0, count), ReduceOp::Sum); break;
    case CollectiveKind::ReduceScatter:
      comm.reduce_scatter(send.slice1d(0, count), recv.slice1d(0, chunk), ReduceOp::Sum);
      break;
    case CollectiveKind::AllGather: comm.all_gather(send.slice1d(0, chunk), recv.slice1d(0, count)); break;
    default: ENSURE(false, "the --communicator table times all_reduce, reduce_scatter and all_gather only");
  }
}

// The same collective straight through MPI on `raw` (a copy of MPI_COMM_WORLD), then a sleep for the
// emulated link's modelled time, as the Communicator would hold it.
void run_raw(MPI_Comm raw, const LinkModel& link, CollectiveKind kind, const Tensor& send, const Tensor& recv,
             int64_t count, int n) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const int chunk = int(count / n);
  switch (kind) {
    case CollectiveKind::AllReduce:
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, send.f32(), int(count), MPI_FLOAT, MPI_SUM, raw));
      break;
    case CollectiveKind::ReduceScatter:
      MPI_CHECK(MPI_Reduce_scatter_block(send.f32(), recv.f32(), chunk, MPI_FLOAT, MPI_SUM, raw));
      break;
    case CollectiveKind::AllGather:
      MPI_CHECK(MPI_Allgather(send.f32(), chunk, MPI_FLOAT, recv.f32(), chunk, MPI_FLOAT, raw));
      break;
    default: ENSURE(false, "the --communicator table times all_reduce, reduce_scatter and all_gather only");
  }
  const double link_ms = modelled_ms(link, kind, count * 4, n);
  if (link_ms > 0)
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double, std::milli>(link_ms)));
}

// One checked call: rank r contributes r+1, so a correct sum is N(N+1)/2 in every element and
// gathered chunk j holds j+1. Small integers are exact in fp32: any difference is an error.
// Returns the wrong elements over all ranks.
int64_t count_wrong(Communicator& comm, CollectiveKind kind, const Tensor& send, const Tensor& recv, int64_t count) {
  const int n = comm.size();
  const int64_t chunk = count / n;
  std::fill(send.f32(), send.f32() + count, float(comm.rank() + 1));
  run_collective(comm, kind, send, recv, count);

  const float sum = float(n * (n + 1) / 2);
  int64_t wrong = 0;
  if (kind == CollectiveKind::AllReduce) {
    for (int64_t i = 0; i < count; i++) wrong += send.f32()[i] != sum;
  } else if (kind == CollectiveKind::ReduceScatter) {
    for (int64_t i = 0; i < chunk; i++) wrong += recv.f32()[i] != sum;
  } else {
    for (int64_t i = 0; i < count; i++) wrong += recv.f32()[i] != float(i / chunk + 1);
  }
  // The timed calls then run on zeros, which stay zeros: an in-place sum of r+1 would double with
  // every call until it overflowed. Adding zeros costs what adding anything else does.
  std::fill(send.f32(), send.f32() + count, 0.0f);
  return int64_t(comm.all_reduce_scalar(double(wrong), ReduceOp::Sum));
}

// The ring's traffic factor (docs/theory.md, section 5): what turns algbw into busbw.
double bus_factor(CollectiveKind kind, int n) {
  return kind == CollectiveKind::AllReduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
}

// " label " padded with dashes to `width`, to head a group of columns.
std::string centered(const std::string& label, int width) {
  const int dashes = std::max(0, width - int(label.size()) - 2);
  return std::string(dashes / 2, '-') + " " + label + " " + std::string(dashes - dashes / 2, '-');
}

// The all-reduce of `count` floats timed call by call, raw MPI and ours alternated in kBlocks blocks
// of kCallsPerBlock calls, the median of each side, averaged over ranks; {raw, ours} in ms. The
// table's mean over 0.2 s takes in every moment the scheduler gave the core to another process,
// which on a busy machine is most of a small call's mean; the median is the call itself.
std::pair<double, double> median_all_reduce(Communicator& comm, MPI_Comm raw, const Tensor& buf, int64_t count) {
  constexpr int kBlocks = 10, kCallsPerBlock = 200;
  const LinkModel link = comm.link_model();
  std::vector<double> times[2];  // raw, ours
  for (int block = 0; block < kBlocks; block++)
    for (int side = 0; side < 2; side++) {
      comm.barrier();
      for (int i = 0; i < kCallsPerBlock; i++) {
        const double start = now_ms();
        if (side == 0) run_raw(raw, link, CollectiveKind::AllReduce, buf, buf, count, comm.size());
        else run_collective(comm, CollectiveKind::AllReduce, buf, buf, count);
        times[side].push_back(now_ms() - start);
      }
    }
  double median[2];
  for (int side = 0; side < 2; side++) {
    std::vector<double>& t = times[side];
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    median[side] = comm.all_reduce_scalar(t[t.size() / 2], ReduceOp::Avg);
  }
  return {median[0], median[1]};
}

// Returns the number of wrong elements found over the whole table.
int64_t collective_table(Communicator& comm, int64_t min_bytes, int64_t max_bytes, JsonLinesWriter& json) {
  const int n = comm.size();
  const CollectiveKind kinds[] = {CollectiveKind::AllReduce, CollectiveKind::ReduceScatter,
                                  CollectiveKind::AllGather};
  // Allocated once at the largest size; every size uses a prefix of them.
  Buffer send(max_bytes / 4, MemCategory::CommBuffers);
  Buffer recv(max_bytes / 4, MemCategory::CommBuffers);
  const bool root = comm.rank() == 0;
  MPI_Comm raw = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &raw));

  if (root) {
    std::printf("#\n# Table 1: collectives through raw MPI and through our Communicator (blocking calls, "
                "ReduceOp::Sum), %d ranks\n", n);
    std::printf("# %23s", "");
    for (CollectiveKind k : kinds) std::printf("  %s", centered(collective_name(k), 38).c_str());
    std::printf("\n# %10s %12s", "size", "count");
    for (int i = 0; i < 3; i++) std::printf("  %8s %8s %5s %7s %6s", "raw", "ours", "x", "busbw", "#wrong");
    std::printf("\n# %10s %12s", "(B)", "(floats)");
    for (int i = 0; i < 3; i++) std::printf("  %8s %8s %5s %7s %6s", "(us)", "(us)", "", "(GB/s)", "");
    std::printf("\n");
  }

  int64_t total_wrong = 0;
  double busbw_sum = 0;
  int busbw_count = 0;
  for (int64_t size = min_bytes; size <= max_bytes; size *= 4) {
    // Rounded down to whole floats that divide among the ranks (4 KB is 1024 floats: 3 ranks get
    // 341 each), and the table prints the bytes actually moved.
    const int64_t count = size / 4 / n * n;
    const int64_t bytes = count * 4;
    if (count == 0) continue;  // less than a float per rank
    if (root) std::printf("  %10lld %12lld", (long long)bytes, (long long)count);
    for (CollectiveKind kind : kinds) {
      const Tensor s = send.view(), r = recv.view();
      const int64_t wrong = count_wrong(comm, kind, s, r, count);
      const LinkModel link = comm.link_model();
      const double raw_ms = time_iterations(comm, [&] { run_raw(raw, link, kind, s, r, count, n); });
      const double ms = time_iterations(comm, [&] { run_collective(comm, kind, s, r, count); });
      const double algbw = bytes / (ms * 1e-3) / 1e9;
      const double busbw = algbw * bus_factor(kind, n);
      total_wrong += wrong;
      if (kind == CollectiveKind::AllReduce) {
        busbw_sum += busbw;
        busbw_count++;
      }
      if (root) {
        std::printf("  %8.1f %8.1f %5.2f %7.3f %6lld", raw_ms * 1e3, ms * 1e3, ms / raw_ms, busbw, (long long)wrong);
        std::fflush(stdout);  // one column group at a time: a slow link shows progress
        json.write(JsonObject()
                       .add("type", "collective")
                       .add("collective", collective_name(kind))
                       .add("ranks", n)
                       .add("bytes", bytes)
                       .add("count", count)
                       .add("raw_time_us", raw_ms * 1e3)
                       .add("time_us", ms * 1e3)
                       .add("ours_over_raw", ms / raw_ms)
                       .add("algbw_gbps", algbw)
                       .add("busbw_gbps", busbw)
                       .add("wrong", wrong));
      }
    }
    if (root) std::printf("\n");
  }
  if (root) {
    std::printf("# wrong elements: %lld %s\n", (long long)total_wrong, total_wrong == 0 ? "OK" : "FAILED");
    std::printf("# average all_reduce busbw (ours): %.3f GB/s\n", busbw_count ? busbw_sum / busbw_count : 0.0);
    std::printf("# all_reduce, median of 2000 calls each, raw and ours alternated in blocks of 200 (steady where "
                "the machine is busy):");
  }
  // At 4 B (one float) and at the table's smallest size.
  std::vector<int64_t> counts = {1};
  if (min_bytes / 4 > 1) counts.push_back(min_bytes / 4);
  for (int64_t count : counts) {
    const Tensor buf = send.view().slice1d(0, count);
    std::fill(buf.f32(), buf.f32() + count, 0.0f);
    const auto [raw_ms, ms] = median_all_reduce(comm, raw, buf, count);
    if (root) {
      std::printf("%s %lld B: raw %.2f us, ours %.2f us (%.2fx)", count == 1 ? "" : ";", (long long)(count * 4),
                  raw_ms * 1e3, ms * 1e3, ms / raw_ms);
      json.write(JsonObject()
                     .add("type", "median_per_call")  // (no "collective" field: not a row of the table)
                     .add("op", "all_reduce")
                     .add("ranks", n)
                     .add("bytes", count * 4)
                     .add("raw_time_us", raw_ms * 1e3)
                     .add("time_us", ms * 1e3)
                     .add("ours_over_raw", ms / raw_ms));
    }
  }
  if (root) std::printf("\n");
  MPI_CHECK(MPI_Comm_free(&raw));
  return total_wrong;
}

// ---------------------------------------------------------------------------------------------
// Table 2: one model's gradient, three ways

struct Plan {
  const char* method;
  int collectives;
  int64_t bytes;
  std::function<void()> run;
};

void gradient_table(Communicator& comm, JsonLinesWriter& json) {
  const int n = comm.size();
  const bool root = comm.rank() == 0;
  if (root) {
    std::printf("#\n# Table 2: a whole gradient all-reduced three ways (no compute beside it), %d ranks\n", n);
    // "+ per extra": what each collective beyond the first added, against the single raw call.
    std::printf("# %-7s %-9s %-28s %11s %9s %7s %10s\n", "preset", "gradient", "method", "collectives", "time",
                "algbw", "+ per extra");
    std::printf("# %-7s %-9s %-28s %11s %9s %7s %10s\n", "", "", "", "", "(ms)", "(GB/s)", "coll. (us)");
  }
  for (const char* preset : {"tiny", "small"}) {
    GPT2Config cfg;
    ENSURE(find_preset(preset, &cfg), "unknown preset");
    const ParamLayout layout = build_gpt2_layout(cfg, n);
    Buffer grads(layout.padded_size, MemCategory::Grads);
    const Tensor g = grads.view();
    const GradientBuckets buckets(layout, kBucketBytes);
    const LinkModel link = comm.link_model();

    std::vector<Plan> plans;
    plans.push_back({"one MPI_Allreduce (raw MPI)", 1, int64_t(g.bytes()), [&] {
                       using Clock = std::chrono::steady_clock;
                       const Clock::time_point start = Clock::now();
                       MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, g.f32(), int(g.numel()), MPI_FLOAT, MPI_SUM,
                                               MPI_COMM_WORLD));
                       // The same emulated link the Communicator applies: done no earlier than the model says.
                       const double link_ms = modelled_ms(link, CollectiveKind::AllReduce, int64_t(g.bytes()), n);
                       std::this_thread::sleep_until(
                           start + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double, std::milli>(link_ms)));
                     }});
    plans.push_back({"buckets of 0.125 MB (ch. 03)", buckets.count(), int64_t(g.bytes()), [&] {
                       std::vector<CommHandle> in_flight;
                       for (int b = 0; b < buckets.count(); b++)
                         in_flight.push_back(
                             comm.all_reduce_async(g.slice1d(buckets.begin(b), buckets.size(b)), ReduceOp::Sum));
                       for (CommHandle& h : in_flight) h.wait();
                     }});
    // Backward order, as chapter 02 launches them; the padding between units is not sent.
    plans.push_back({"one per tensor (ch. 02)", int(layout.params.size()), layout.num_params * 4, [&] {
                       std::vector<CommHandle> in_flight;
                       for (int p = int(layout.params.size()) - 1; p >= 0; p--) {
                         const ParamInfo& info = layout.params[p];
                         in_flight.push_back(comm.all_reduce_async(g.slice1d(info.offset, info.size), ReduceOp::Sum));
                       }
                       for (CommHandle& h : in_flight) h.wait();
                     }});

    double raw_ms = 0;
    for (size_t i = 0; i < plans.size(); i++) {
      const Plan& plan = plans[i];
      const double ms = time_iterations(comm, plan.run);
      if (i == 0) raw_ms = ms;
      const double algbw = plan.bytes / (ms * 1e-3) / 1e9;
      if (!root) continue;
      const std::string extra_us =
          plan.collectives > 1 ? std::to_string(int((ms - raw_ms) * 1e3 / (plan.collectives - 1) + 0.5)) : "-";
      std::printf("  %-7s %-9s %-28s %11d %9.3f %7.3f %10s\n", i == 0 ? preset : "",
                  i == 0 ? format_bytes(double(plan.bytes)).c_str() : "", plan.method, plan.collectives, ms, algbw,
                  extra_us.c_str());
      json.write(JsonObject()
                     .add("type", "gradient")
                     .add("preset", preset)
                     .add("ranks", n)
                     .add("method", plan.method)
                     .add("collectives", plan.collectives)
                     .add("bytes", plan.bytes)
                     .add("time_ms", ms)
                     .add("algbw_gbps", algbw));
    }
  }
  if (!root) return;
  const LinkModel link = comm.link_model();
  if (link.on())
    std::printf("# the emulated link charges each all-reduce 2(N-1) alpha = %.0f us of latency\n",
                2 * (n - 1) * link.latency_us);
  else
    std::printf("# no emulated link: collectives posted together progress concurrently in shared memory, so\n"
                "# extra collectives cost little here; add --link-gbps 0.5 --link-latency-us 50 to see latency\n");
}

}  // namespace

int64_t communicator_tables(Communicator& comm, int64_t min_bytes, int64_t max_bytes, JsonLinesWriter& json) {
  if (comm.rank() == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_CHECK(MPI_Get_library_version(version, &length));
    std::string library(version, length);
    library = library.substr(0, library.find('\n'));
    std::printf("# %d ranks, our Communicator (progress engine) over %s\n", comm.size(), library.c_str());
    const LinkModel link = comm.link_model();
    if (link.on())
      std::printf("# emulated link: %.3g Gbit/s = %.4g GB/s, %.3g us latency: busbw approaches %.4g GB/s\n",
                  link.gbps, link.gbps / 8, link.latency_us, link.gbps / 8);
    else
      std::printf("# no emulated link: ranks exchange through shared memory (--link-gbps G to emulate one)\n");
    std::printf("# time = mean per call over %d..%d timed calls after %d warm-up calls, averaged over ranks\n",
                kMinIters, kMaxIters, kWarmupIters);
  }
  const int64_t wrong = collective_table(comm, min_bytes, max_bytes, json);
  gradient_table(comm, json);
  return wrong;
}
