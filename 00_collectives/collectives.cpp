// Chapter 00: collectives built from send and receive, timed against the alpha-beta model and
// against the library's own.
//
// The idea. Every later chapter calls all_reduce, reduce_scatter and all_gather, and the
// communicator hands them to MPI or NCCL. Underneath, each is a schedule of point-to-point messages,
// and which schedule wins depends on the message size. common/p2p_collectives.cpp builds four of
// them from nothing but Communicator::send_recv_async (read it first: it is this chapter's lesson):
//   ring                 N-1 steps each way, a 1/N segment per step: bandwidth-optimal, latency grows with N
//   halving-doubling     Rabenseifner: the ring's bytes in 2 lg N steps (powers of two, others folded)
//   recursive-doubling   lg N steps of the whole vector: few messages, lg N times the bytes
//   binomial-tree        reduce to rank 0, broadcast back: 2 lg N steps of the whole vector
// In the alpha-beta model (alpha a message's latency, beta the time per byte; docs/theory.md, section
// 15) small messages are latency-bound, and doubling's lg N alphas beat the ring's 2(N-1); large ones
// are bandwidth-bound, and the ring's 2(N-1)/N bytes beat doubling's lg N. This program measures
// alpha and beta once by a ping-pong between ranks 0 and 1, then times every algorithm and the
// library's own all-reduce at each size, and prints them beside the model, in nccl-tests' terms:
// algbw = bytes / time, busbw = algbw x 2(N-1)/N (what each link carried: comparable across N).
//
// Run:
//   make 00_collectives
//   mpiexec -n 4 ./00_collectives/collectives                                 # MPI's shared memory
//   mpiexec -n 4 ./00_collectives/collectives --link-gbps 10 --link-latency-us 20 # an emulated link
//   make collectives        # 2, 4 and 8 ranks, both links, then results/collectives.png
// Output: the measured alpha, beta and gamma; per size a row per algorithm: time, algbw, busbw, the
// model's time and its error, the bytes each rank sent from the counters against the closed forms;
// then the crossover sizes, measured and predicted.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "comm.h"
#include "flags.h"
#include "memory.h"
#include "metrics.h"        // JsonLinesWriter, format_bytes
#include "ops.h"            // add_inplace: the reduction gamma times
#include "output_paths.h"   // run_paths_problem
#include "p2p_collectives.h"
#include "trace.h"          // now_ms

namespace {

struct Options {
  int64_t min_bytes = 4, max_bytes = int64_t(64) << 20;
  int factor = 4;               // sizes grow by this factor
  double link_gbps = 0, link_latency_us = 0;
  std::string json;
  double budget_mb = 256;       // bytes reduced per size and algorithm, at least 3 calls, at most 50
};

// The median of a run of timings.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Seconds for one call of `op`, as nccl-tests reports it: every call starts together (a barrier),
// the slowest rank's time counts (a collective ends when its last rank does), median over calls.
template <typename Op>
double time_call(Communicator& comm, int calls, Op op) {
  op();  // warm-up: first touches of the buffers, the library's own set-up
  std::vector<double> took;
  for (int i = 0; i < calls; i++) {
    comm.barrier();
    const double start = now_ms();
    op();
    took.push_back(comm.all_reduce_scalar((now_ms() - start) / 1e3, ReduceOp::Max));
  }
  return median(took);
}

// The model's three constants, measured here. alpha: half a round trip of 4 bytes; beta: half a
// round trip of a large message, less alpha, per byte; gamma: adding one buffer into another.
CostModel measure_cost_model(Communicator& comm, int64_t large_bytes) {
  CostModel m;
  if (comm.size() < 2) return m;
  Buffer buf(large_bytes / 4, MemCategory::CommBuffers), other(large_bytes / 4, MemCategory::CommBuffers);
  auto round_trip = [&](int64_t bytes) {
    const Tensor t = buf.view().slice1d(0, bytes / 4);
    return time_call(comm, 20, [&] {
      if (comm.rank() == 0) comm.send(t, 1, 1), comm.recv(t, 1, 2);
      if (comm.rank() == 1) comm.recv(t, 0, 1), comm.send(t, 0, 2);
    });
  };
  m.alpha_s = round_trip(4) / 2;
  m.beta_s_per_byte = std::max(0.0, round_trip(large_bytes) / 2 - m.alpha_s) / double(large_bytes);
  // gamma: the ring's reduction step, local, on this rank's core.
  std::fill(buf.f32(), buf.f32() + buf.count(), 1.0f);
  std::fill(other.f32(), other.f32() + other.count(), 2.0f);
  std::vector<double> took;
  for (int i = 0; i < 5; i++) {
    const double start = now_ms();
    add_inplace(buf.view(), other.view());
    took.push_back((now_ms() - start) / 1e3);
  }
  m.gamma_s_per_byte = comm.all_reduce_scalar(median(took), ReduceOp::Max) / double(large_bytes);
  return m;
}

struct Row {
  std::string algorithm;
  double seconds = 0, predicted = 0;
  int64_t sent = 0, sent_predicted = -1;  // the most any rank sent, from its counters
};

}  // namespace

int main(int argc, char** argv) {
  auto comm = init_mpi_communicator(&argc, &argv);
  Options opt;
  FlagParser flags;
  flags.add("--min-bytes", &opt.min_bytes, "smallest message, bytes (a multiple of 4)");
  flags.add("--max-bytes", &opt.max_bytes, "largest message, bytes");
  flags.add("--factor", &opt.factor, "each size is the one before times this");
  flags.add("--link-gbps", &opt.link_gbps, "emulated link bandwidth in Gbit/s (0: MPI's own transport)");
  flags.add("--link-latency-us", &opt.link_latency_us, "emulated link latency per message in microseconds");
  flags.add("--budget-mb", &opt.budget_mb, "megabytes reduced per size and algorithm: sets the number of calls");
  flags.add("--json", &opt.json, "JSON lines output, one record per size and algorithm", "PATH");
  if (!flags.parse(argc, argv, "Chapter 00: collectives from send and receive, against the alpha-beta model.")) {
    shutdown_mpi(std::move(comm));
    return 0;
  }
  const int N = comm->size();
  // Every check before the first collective, the same on every rank.
  if (opt.min_bytes < 4 || opt.min_bytes % 4 != 0) config_error("--min-bytes must be a positive multiple of 4");
  if (opt.max_bytes < opt.min_bytes || opt.max_bytes > (int64_t(1) << 30))
    config_error("--max-bytes must be between --min-bytes and 1 GiB");
  if (opt.factor < 2) config_error("--factor must be 2 or more");
  if (!(opt.budget_mb > 0)) config_error("--budget-mb must be > 0");
  if (opt.link_gbps < 0 || opt.link_gbps > kMaxLinkGbps || (opt.link_gbps > 0 && opt.link_gbps < kMinLinkGbps))
    config_error("--link-gbps must be 0 (off) or between 0.001 and 100000");
  if (opt.link_latency_us < 0 || opt.link_latency_us > kMaxLinkLatencyUs)
    config_error("--link-latency-us must be between 0 and 1e6");
  RunPaths paths;
  paths.json = opt.json;
  const std::string path_problem = run_paths_problem(paths);
  if (!path_problem.empty()) config_error(path_problem);
  comm->set_link_model(LinkModel{opt.link_gbps, opt.link_latency_us});
  const bool root = comm->rank() == 0;
  JsonLinesWriter json;
  if (root && !opt.json.empty()) json.open(opt.json);

  // 1. The model's constants, measured on this link.
  const CostModel model = measure_cost_model(*comm, std::min<int64_t>(opt.max_bytes, int64_t(4) << 20));
  char emulated[96];
  std::snprintf(emulated, sizeof emulated, "an emulated link of %g Gbit/s, %g us", opt.link_gbps, opt.link_latency_us);
  const std::string link = LinkModel{opt.link_gbps, opt.link_latency_us}.on()
                               ? std::string(emulated)
                               : std::string("MPI's own transport (shared memory on one machine)");
  if (root) {
    std::printf("%d ranks over %s\n", N, link.c_str());
    std::printf("alpha %.2f us, beta %.3f ns/B (%.2f GB/s), gamma %.3f ns/B: ping-pong of 4 B and %s between ranks "
                "0 and 1, median of 20; gamma from adding two buffers on one core\n",
                model.alpha_s * 1e6, model.beta_s_per_byte * 1e9,
                model.beta_s_per_byte > 0 ? 1e-9 / model.beta_s_per_byte : 0.0, model.gamma_s_per_byte * 1e9,
                format_bytes(double(std::min<int64_t>(opt.max_bytes, int64_t(4) << 20))).c_str());
    std::printf("\nall-reduce, fp32. busbw = algbw x 2(N-1)/N. modelled: docs/theory.md section 15. sent: the most "
                "any rank sent, from the counters (closed form)\n");
    std::printf("%10s  %-19s %11s %9s %9s %11s %7s %12s %12s\n", "bytes", "algorithm", "time us", "algbw GB/s",
                "busbw", "modelled us", "error", "sent/rank", "closed form");
  }

  // 2. Every algorithm, and the library's own, at every size.
  struct Best { int64_t bytes; std::string measured, modelled; };
  std::vector<Best> winners;
  for (int64_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= opt.factor) {
    const int64_t n = bytes / 4;
    Buffer buf(n, MemCategory::CommBuffers);
    const int calls = int(std::clamp(opt.budget_mb * 1e6 / double(bytes), 3.0, 50.0));
    std::vector<Row> rows;
    for (Algorithm a : kAllAlgorithms) {
      Row row{algorithm_name(a)};
      const CommStats before = comm->stats();
      row.seconds = time_call(*comm, calls, [&] { p2p_all_reduce(*comm, buf.view(), ReduceOp::Sum, a); });
      const int64_t mine = comm->stats().since(before).kind[int(CollectiveKind::SendRecv)].sent_bytes / (calls + 1);
      row.sent = int64_t(comm->all_reduce_scalar(double(mine), ReduceOp::Max));
      int64_t closed = 0;
      for (int r = 0; r < N; r++) closed = std::max(closed, predicted_sent_bytes(a, CollectiveKind::AllReduce, bytes, 4, N, r));
      row.sent_predicted = closed;
      row.predicted = predicted_seconds(model, a, CollectiveKind::AllReduce, bytes, N);
      rows.push_back(row);
    }
    Row library{"library (" + comm->name() + ")"};
    library.seconds = time_call(*comm, calls, [&] { comm->all_reduce(buf.view(), ReduceOp::Sum); });
    rows.push_back(library);

    Best best{bytes, rows[0].algorithm, rows[0].algorithm};
    double best_measured = rows[0].seconds, best_modelled = rows[0].predicted;
    for (size_t i = 1; i + 1 < rows.size(); i++) {
      if (rows[i].seconds < best_measured) best_measured = rows[i].seconds, best.measured = rows[i].algorithm;
      if (rows[i].predicted < best_modelled) best_modelled = rows[i].predicted, best.modelled = rows[i].algorithm;
    }
    winners.push_back(best);
    if (!root) continue;
    for (const Row& row : rows) {
      const double algbw = row.seconds > 0 ? double(bytes) / row.seconds / 1e9 : 0;
      const double busbw = algbw * 2.0 * (N - 1) / N;
      const bool ours = row.sent_predicted >= 0;
      const double error = ours && row.predicted > 0 ? (row.seconds - row.predicted) / row.predicted : 0;
      std::printf("%10lld  %-19s %11.1f %9.3f %9.3f %11s %7s %12s %12s%s\n", (long long)bytes, row.algorithm.c_str(),
                  row.seconds * 1e6, algbw, busbw, ours ? std::to_string(int64_t(std::lround(row.predicted * 1e6))).c_str() : "",
                  ours ? (std::to_string(int(std::lround(error * 100))) + "%").c_str() : "",
                  ours ? format_bytes(double(row.sent)).c_str() : "", ours ? format_bytes(double(row.sent_predicted)).c_str() : "",
                  ours && row.sent != row.sent_predicted ? "  <- the counters disagree with the closed form" : "");
      if (json.is_open()) {
        JsonObject o;
        o.add("type", "all_reduce").add("ranks", N).add("bytes", bytes).add("algorithm", row.algorithm)
            .add("link", link).add("seconds", row.seconds).add("algbw_gbs", algbw).add("busbw_gbs", busbw)
            .add("alpha_s", model.alpha_s).add("beta_s_per_byte", model.beta_s_per_byte)
            .add("gamma_s_per_byte", model.gamma_s_per_byte);
        if (ours) o.add("modelled_seconds", row.predicted).add("sent_bytes", row.sent).add("sent_closed_form", row.sent_predicted);
        json.write(o);
      }
    }
    std::printf("\n");
  }

  // 3. The crossovers: where the fastest algorithm changes, measured and in the model.
  if (root) {
    std::printf("fastest algorithm by size, measured | modelled:\n");
    for (size_t i = 0; i < winners.size(); i++) {
      const bool changed = i == 0 || winners[i].measured != winners[i - 1].measured ||
                           winners[i].modelled != winners[i - 1].modelled;
      if (changed)
        std::printf("  from %10s: %-19s | %s\n", format_bytes(double(winners[i].bytes)).c_str(),
                    winners[i].measured.c_str(), winners[i].modelled.c_str());
    }
  }
  if (json.is_open()) json.close();
  comm->set_link_model(LinkModel{});
  shutdown_mpi(std::move(comm));
  return 0;
}
