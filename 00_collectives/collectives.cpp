// Chapter 00: collectives built from send and receive, timed against the alpha-beta model and
// against the library's own.
//
// The idea. Every later chapter calls all_reduce, reduce_scatter and all_gather, and the
// communicator hands them to MPI or NCCL. Underneath, each is a schedule of point-to-point messages,
// and which schedule wins depends on the message size. common/comm/p2p_collectives.cpp builds four of
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
//   mpiexec -n 2 ./00_collectives/collectives --communicator --min-bytes 4096   # make bench-comm
// With --communicator it times, instead, what every later chapter calls: our Communicator's blocking
// collectives against raw MPI, and a gradient all-reduced at once, in buckets and per tensor
// (communicator_bench.cpp).
// Output: the measured alpha, beta and gamma; per size a row per algorithm: time, algbw, busbw, the
// model's time and its error, the bytes each rank sent from the counters against the closed forms;
// then the crossover sizes, measured and predicted.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/check.h"
#include "comm/comm.h"
#include "comm/comm_factory.h"  // communicator_for: NCCL for --device cuda
#include "ops/device.h"        // pick_device, synchronize
#include "training/flags.h"
#include "ops/memory.h"
#include "base/metrics.h"        // JsonLinesWriter, format_bytes
#include "ops/ops.h"            // add_inplace: the reduction gamma times
#include "base/output_paths.h"   // run_paths_problem
#include "comm/p2p_collectives.h"
#include "comm/trace.h"          // now_ms
#include "communicator_bench.h"  // --communicator: communicator_tables

namespace {

struct Options {
  int64_t min_bytes = 4, max_bytes = int64_t(64) << 20;
  int factor = 4;               // sizes grow by this factor
  double link_gbps = 0, link_latency_us = 0;
  std::string json;
  std::string device = "cpu";   // cpu | cuda | auto (device.h, pick_device)
  double budget_mb = 256;       // bytes reduced per size and algorithm, at least 3 calls, at most 50
  bool communicator = false;    // the Communicator against raw MPI instead (communicator_bench.h)
};

// The median of a run of timings.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Seconds for one call of each of `ops` (each warmed up already), as nccl-tests reports it: every
// call starts together (a barrier), the slowest rank's time counts (a collective ends when its last
// rank does), the median over calls. The ops take turns, call by call, so that a load that comes and
// goes on a shared machine falls on all of them alike: their ratios hold where their times move.
std::vector<double> time_calls(Communicator& comm, int calls, const std::vector<std::function<void()>>& ops) {
  std::vector<std::vector<double>> took(ops.size());
  for (int i = 0; i < calls; i++)
    for (size_t k = 0; k < ops.size(); k++) {
      comm.barrier();
      const double start = now_ms();
      ops[k]();
      synchronize(comm.device());
      took[k].push_back(comm.all_reduce_scalar((now_ms() - start) / 1e3, ReduceOp::Max));
    }
  std::vector<double> medians;
  for (const std::vector<double>& t : took) medians.push_back(median(t));
  return medians;
}

// Seconds for one call of `op`, timed as above (the cost model's ping-pong).
// On a GPU a collective returns before its kernels end: the clock stops once the device is done.
template <typename Op>
double time_call(Communicator& comm, int calls, Op op) {
  op();  // warm-up: first touches of the buffers, the library's own set-up
  synchronize(comm.device());
  std::vector<double> took;
  for (int i = 0; i < calls; i++) {
    comm.barrier();
    const double start = now_ms();
    op();
    synchronize(comm.device());
    took.push_back(comm.all_reduce_scalar((now_ms() - start) / 1e3, ReduceOp::Max));
  }
  return median(took);
}

// The model's three constants, measured here, as the algorithms pay them. Every step of every
// algorithm is an exchange: a rank sends to one peer while it receives from one. So ranks 0 and 1
// time exactly that, each sending m bytes to the other at once (a ping-pong both ways): alpha is
// that time for 4 bytes, beta the time for 4 MB less alpha, per byte, each the median of 50, as the
// algorithms' times are (a message held by the emulated link costs the hold plus the sleep's
// wake-up, which a fastest-of would leave out and every algorithm's step pays). gamma: adding one 4 MB buffer
// into another on one core, the reduction each step of a reduce-scatter does.
CostModel measure_cost_model(Communicator& comm) {
  constexpr int64_t kLarge = int64_t(4) << 20;
  CostModel m;
  if (comm.size() < 2) return m;
  Buffer out(kLarge / 4, MemCategory::CommBuffers, comm.device()), in(kLarge / 4, MemCategory::CommBuffers, comm.device());
  auto exchange_time = [&](int64_t bytes) {
    const Tensor o = out.view().slice1d(0, bytes / 4), i = in.view().slice1d(0, bytes / 4);
    const int peer = 1 - comm.rank();
    return time_call(comm, 50, [&] {
      if (comm.rank() < 2) comm.send_recv({{true, o, peer, 1}, {false, i, peer, 1}});
    });
  };
  m.alpha_s = exchange_time(4);
  m.beta_s_per_byte = std::max(0.0, exchange_time(kLarge) - m.alpha_s) / double(kLarge);
  fill_zero(out.view()), fill_zero(in.view());
  std::vector<double> took;
  for (int i = 0; i < 5; i++) {
    const double start = now_ms();
    add_inplace(out.view(), in.view());
    synchronize(comm.device());
    took.push_back((now_ms() - start) / 1e3);
  }
  m.gamma_s_per_byte = comm.all_reduce_scalar(median(took), ReduceOp::Max) / double(kLarge);
  return m;
}

std::string fixed1(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", v);
  return text;
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
  flags.add("--device", &opt.device, "cpu | cuda | auto: where the buffers live (cuda: NCCL is the library)", "NAME");
  flags.add("--json", &opt.json, "JSON lines output, one record per size and algorithm", "PATH");
  flags.add_switch("--communicator", &opt.communicator,
                   "time our Communicator's collectives against raw MPI, and a gradient three ways, instead");
  if (!flags.parse(argc, argv, "Chapter 00: collectives from send and receive, against the alpha-beta model.")) {
    shutdown_mpi(std::move(comm));
    return 0;
  }
  const int N = comm->size();
  // Every check before the first collective, the same on every rank.
  if (N < 2)
    config_error("one rank has no one to send to, so there is nothing to measure: run on 2 ranks or more "
                 "(mpiexec -n 4 ./00_collectives/collectives)");
  if (opt.min_bytes < 4 || opt.min_bytes % 4 != 0) config_error("--min-bytes must be a positive multiple of 4");
  if (opt.max_bytes < opt.min_bytes || opt.max_bytes > (int64_t(1) << 30))
    config_error("--max-bytes must be between --min-bytes and 1 GiB");
  if (opt.factor < 2) config_error("--factor must be 2 or more");
  if (!(opt.budget_mb > 0)) config_error("--budget-mb must be > 0");
  if (opt.link_gbps < 0 || opt.link_gbps > kMaxLinkGbps || (opt.link_gbps > 0 && opt.link_gbps < kMinLinkGbps))
    config_error("--link-gbps must be 0 (off) or between 0.001 and 100000");
  if (opt.link_latency_us < 0 || opt.link_latency_us > kMaxLinkLatencyUs)
    config_error("--link-latency-us must be between 0 and 1e6");
  if (opt.communicator && opt.device != "cpu")
    config_error("--communicator compares with raw MPI on the CPU: drop --device " + opt.device);
  RunPaths paths;
  paths.json = opt.json;
  const std::string path_problem = run_paths_problem(paths);
  if (!path_problem.empty()) config_error(path_problem);
  comm = communicator_for(pick_device(opt.device), std::move(comm));
  comm->set_link_model(LinkModel{opt.link_gbps, opt.link_latency_us});
  const bool root = comm->rank() == 0;
  JsonLinesWriter json;
  if (root && !opt.json.empty()) json.open(opt.json);
  if (opt.communicator) {
    const int64_t wrong = communicator_tables(*comm, opt.min_bytes, opt.max_bytes, json);
    if (json.is_open()) json.close();
    comm->set_link_model(LinkModel{});
    shutdown_mpi(std::move(comm));
    return wrong == 0 ? 0 : 1;
  }

  // 1. The model's constants, measured on this link.
  const CostModel model = measure_cost_model(*comm);
  char emulated[96];
  std::snprintf(emulated, sizeof emulated, "an emulated link of %g Gbit/s, %g us", opt.link_gbps, opt.link_latency_us);
  const std::string link = LinkModel{opt.link_gbps, opt.link_latency_us}.on()
                               ? std::string(emulated)
                               : std::string("MPI's own transport (shared memory on one machine)");
  if (root) {
    std::printf("%d ranks over %s, buffers on the %s\n", N, link.c_str(), device_name(comm->device()));
    std::printf("alpha %.2f us, beta %.3f ns/B (%.2f GB/s), gamma %.3f ns/B: ranks 0 and 1 exchanging 4 B and 4 MB "
                "both ways at once (a ping-pong, as each step of the algorithms), median of 50; gamma from adding "
                "two 4 MB buffers on one core\n",
                model.alpha_s * 1e6, model.beta_s_per_byte * 1e9,
                model.beta_s_per_byte > 0 ? 1e-9 / model.beta_s_per_byte : 0.0, model.gamma_s_per_byte * 1e9);
    std::printf("\nall-reduce, fp32. busbw = algbw x 2(N-1)/N. modelled: docs/theory.md section 15. sent: the most "
                "any rank sent, from the counters (closed form)\n");
    std::printf("%10s  %-19s %11s %9s %9s %11s %7s %12s %12s\n", "bytes", "algorithm", "time us", "algbw GB/s",
                "busbw", "modelled us", "error", "sent/rank", "closed form");
  }

  // 2. Every algorithm, and the library's own, at every size, their calls interleaved (time_calls).
  struct Best { int64_t bytes; std::string measured, modelled; double measured_s, library_s; };
  std::vector<Best> winners;
  std::vector<std::vector<Row>> all_rows;  // per size: the algorithms', then the library's
  for (int64_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= opt.factor) {
    const int64_t n = bytes / 4;
    Buffer buf(n, MemCategory::CommBuffers, comm->device());
    fill_zero(buf.view());  // calls sum in place: zeros stay zeros, where anything else would grow every call
    const int calls = int(std::clamp(opt.budget_mb * 1e6 / double(bytes), 3.0, 50.0));
    std::vector<Row> rows;
    std::vector<std::function<void()>> ops;
    for (Algorithm a : kAllAlgorithms) {
      Row row{algorithm_name(a)};
      ops.push_back([&comm, &buf, a] { p2p_all_reduce(*comm, buf.view(), ReduceOp::Sum, a); });
      const CommStats before = comm->stats();
      ops.back()();  // the warm-up call, counted
      synchronize(comm->device());
      const int64_t mine = comm->stats().since(before).kind[int(CollectiveKind::SendRecv)].sent_bytes;
      row.sent = int64_t(comm->all_reduce_scalar(double(mine), ReduceOp::Max));
      int64_t closed = 0;
      for (int r = 0; r < N; r++) closed = std::max(closed, predicted_sent_bytes(a, CollectiveKind::AllReduce, bytes, 4, N, r));
      row.sent_predicted = closed;
      row.predicted = predicted_seconds(model, a, CollectiveKind::AllReduce, bytes, N);
      rows.push_back(row);
    }
    rows.push_back(Row{"library (" + comm->name() + ")"});
    ops.push_back([&comm, &buf] { comm->all_reduce(buf.view(), ReduceOp::Sum); });
    ops.back()();  // its warm-up
    const std::vector<double> seconds = time_calls(*comm, calls, ops);
    for (size_t i = 0; i < rows.size(); i++) rows[i].seconds = seconds[i];
    const Row& library = rows.back();

    all_rows.push_back(rows);
    Best best{bytes, rows[0].algorithm, rows[0].algorithm, 0, library.seconds};
    double best_measured = rows[0].seconds, best_modelled = rows[0].predicted;
    for (size_t i = 1; i + 1 < rows.size(); i++) {
      if (rows[i].seconds < best_measured) best_measured = rows[i].seconds, best.measured = rows[i].algorithm;
      if (rows[i].predicted < best_modelled) best_modelled = rows[i].predicted, best.modelled = rows[i].algorithm;
    }
    best.measured_s = best_measured;
    winners.push_back(best);
    if (!root) continue;
    for (const Row& row : rows) {
      const double algbw = row.seconds > 0 ? double(bytes) / row.seconds / 1e9 : 0;
      const double busbw = algbw * 2.0 * (N - 1) / N;
      const bool ours = row.sent_predicted >= 0;
      const double error = ours && row.predicted > 0 ? (row.seconds - row.predicted) / row.predicted : 0;
      std::printf("%10lld  %-19s %11.1f %9.3f %9.3f %11s %7s %12s %12s%s\n", (long long)bytes, row.algorithm.c_str(),
                  row.seconds * 1e6, algbw, busbw, ours ? fixed1(row.predicted * 1e6).c_str() : "",
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
    // 4. How far each algorithm's time was from its model: the median and the worst over the sizes
    // (the worst is usually the smallest message, where software overhead rather than the link rules).
    std::printf("\nmodel error per algorithm over the sizes, median | worst (at):\n");
    for (size_t a = 0; a + 1 < all_rows.front().size(); a++) {
      std::vector<double> errors;
      double worst = 0;
      int64_t worst_at = 0;
      for (size_t i = 0; i < all_rows.size(); i++) {
        const Row& row = all_rows[i][a];
        if (row.predicted <= 0) continue;
        const double e = (row.seconds - row.predicted) / row.predicted;
        errors.push_back(std::fabs(e));
        if (std::fabs(e) >= std::fabs(worst)) worst = e, worst_at = winners[i].bytes;
      }
      std::printf("  %-19s %6.0f%% | %+6.0f%% (%s)\n", all_rows.front()[a].algorithm.c_str(), median(errors) * 100,
                  worst * 100, format_bytes(double(worst_at)).c_str());
    }
    // 5. Against the library: the fastest of ours over MPI's (or NCCL's) own, size by size.
    std::printf("\nthe fastest of ours against the library's own (time ours / library):\n ");
    for (const Best& b : winners)
      std::printf(" %s %.2fx", format_bytes(double(b.bytes)).c_str(), b.library_s > 0 ? b.measured_s / b.library_s : 0.0);
    std::printf("\n");
  }
  if (json.is_open()) json.close();
  comm->set_link_model(LinkModel{});
  shutdown_mpi(std::move(comm));
  return 0;
}
