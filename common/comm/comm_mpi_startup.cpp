// comm_mpi_startup.cpp: MPI's start-up and shut-down, and the calls that make groups without
// spinning. Defines init_mpi_communicator / shutdown_mpi, ranks_on_this_node, nodes_in_job and
// cores_for_this_job (comm.h), and wait_resting, split_resting and duplicate_resting
// (comm_mpi_internal.h), which the MPI communicator (comm_mpi.cpp) splits and copies its groups with.
#include <mpi.h>
#include <sched.h>  // sched_getaffinity
#include <unistd.h>  // getpid

#include <algorithm>
#include <chrono>
#include <cstdio>   // fflush
#include <cstdlib>  // setenv, getenv
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/peer_state.h"  // set_world_processes
#include "comm/comm.h"
#include "comm/comm_mpi_args.h"  // create_bf16_ops
#include "comm/comm_mpi_internal.h"
#include "comm/trace.h"  // sync_clock_epoch

namespace {
int g_ranks_on_node = 1;
int g_nodes = 1;
}  // namespace

// The collectives of start-up, shut-down and group creation are posted non-blocking and waited here,
// sleeping between polls, rather than called blocking: MPICH's blocking calls poll without rest, and
// where ranks outnumber cores (the tests run 4 to 16 on 2) a polling rank holds the core its late
// peer needs. Measured on 2 cores, 4 ranks: start-up's collectives took about 35 ms of CPU per rank
// blocking, a twentieth of a barrier's cost non-blocking. A few microseconds later where cores are
// plenty, once per group: nothing a step waits for.
void wait_resting(MPI_Request* request) {
  int done = 0;
  for (;;) {
    MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// MPI_Comm_split without spinning: every rank's (color, key) gathered as above, then the ranks of
// this rank's color, ordered by key and then by rank as MPI_Comm_split orders them, made a
// communicator by themselves alone (MPI_Comm_create_group: collective over that group only). The same
// communicator MPI_Comm_split makes; MPICH's split spins through several blocking rounds over the
// whole parent: on 2 cores, 4 ranks, 20 splits took 0.7 s of CPU, 20 of these about none.
MPI_Comm split_resting(MPI_Comm comm, int color, int key) {
  int size = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  const int mine[2] = {color, key};
  std::vector<int> pairs(size_t(2 * size), 0);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallgather(mine, 2, MPI_INT, pairs.data(), 2, MPI_INT, comm, &request));
  wait_resting(&request);
  std::vector<int> members;
  for (int r = 0; r < size; r++)
    if (pairs[size_t(2 * r)] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return pairs[size_t(2 * a + 1)] < pairs[size_t(2 * b + 1)]; });
  MPI_Group parent = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_CHECK(MPI_Comm_group(comm, &parent));
  MPI_CHECK(MPI_Group_incl(parent, int(members.size()), members.data(), &group));
  MPI_Comm sub = MPI_COMM_NULL;
  // (One tag serves every group: the groups of one split are disjoint, and splits come in order.)
  MPI_CHECK(MPI_Comm_create_group(comm, group, /*tag=*/0, &sub));
  MPI_CHECK(MPI_Group_free(&group));
  MPI_CHECK(MPI_Group_free(&parent));
  return sub;
}

// MPI_Comm_dup without spinning (MPI_Comm_idup, waited as above).
MPI_Comm duplicate_resting(MPI_Comm comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Comm_idup(comm, &copy, &request));
  wait_resting(&request);
  return copy;
}

int ranks_on_this_node() { return g_ranks_on_node; }

int nodes_in_job() { return g_nodes; }

// The affinity mask first (a container or a scheduler's cgroup may give a process fewer cores than
// the machine has), then the test runner's share, when it runs jobs side by side.
int cores_for_this_job() {
  int cores = int(std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  if (const char* share = std::getenv("GPT_CORES_PER_JOB")) {
    const int n = std::atoi(share);
    if (n >= 1) cores = std::min(cores, n);
  }
  return std::max(1, cores);
}

// ---------------------------------------------------------------------------------------------
// Start-up and shut-down

std::unique_ptr<Communicator> init_mpi_communicator(int* argc, char*** argv) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) fatal("init_mpi_communicator() called twice");
  // MPICH 4.0 picks, for non-blocking reduce-scatters of about 256 KB to 1 MB, a recursive-halving
  // schedule that runs 3 to 9 times slower than its own blocking call on one host (measured with
  // make bench-comm); the pairwise schedule matches the blocking call at every size. ZeRO reduce-
  // scatters buckets of about that size, so choose it, unless the user chose otherwise. Other MPI
  // libraries ignore these variables.
  setenv("MPIR_CVAR_IREDUCE_SCATTER_BLOCK_INTRA_ALGORITHM", "sched_pairwise", /*overwrite=*/0);
  setenv("MPIR_CVAR_IREDUCE_SCATTER_INTRA_ALGORITHM", "sched_pairwise", 0);
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  // From here on MPI returns error codes instead of aborting on its own, so MPI_CHECK can report
  // the rank, the call and the file:line along with MPI's message.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  set_error_context(rank, size);
  // The engine's thread calls MPI while the main thread may call it too (a waiting caller, MPI_Abort).
  if (provided < MPI_THREAD_MULTIPLE)
    config_error("this MPI library does not support MPI_THREAD_MULTIPLE (provided level " +
                 std::to_string(provided) + "); the communication thread needs it. Use an MPI built with "
                 "thread support (MPICH: --enable-threads=multiple, the default of distribution packages)");
  mpi_args::create_bf16_ops();
  // The ranks of one node: those whose host has the same name (MPI_Get_processor_name, the host name
  // under MPICH, whose process manager groups a node's ranks by it, as MPI_COMM_TYPE_SHARED does; the
  // emulated cluster gives each node a name of its own). Each rank's name and process id travel in one
  // gather, waited resting: MPI_Comm_split_type and the counts after it were four spinning calls.
  struct Card {
    int pid;
    char host[MPI_MAX_PROCESSOR_NAME];
  };
  Card mine{};
  mine.pid = int(getpid());
  int length = 0;
  MPI_CHECK(MPI_Get_processor_name(mine.host, &length));
  std::vector<Card> cards(static_cast<size_t>(size));
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Iallgather(&mine, int(sizeof(Card)), MPI_BYTE, cards.data(), int(sizeof(Card)), MPI_BYTE,
                           MPI_COMM_WORLD, &request));
  wait_resting(&request);
  auto same_host = [&](const Card& a, const Card& b) { return std::strncmp(a.host, b.host, sizeof a.host) == 0; };
  // A node is named by its lowest world rank; the nodes are counted as a real cluster's are.
  std::vector<int> world_pids(size_t(size), 0), world_nodes(size_t(size), 0);
  g_ranks_on_node = 0, g_nodes = 0;
  for (size_t r = 0; r < size_t(size); r++) {
    world_pids[r] = cards[r].pid;
    size_t first = 0;
    while (!same_host(cards[first], cards[r])) first++;
    world_nodes[r] = int(first);
    if (first == r) g_nodes++;
    if (same_host(cards[r], mine)) g_ranks_on_node++;
  }
  set_world_processes(world_pids, world_nodes, rank);  // for the watchdogs' messages
  // A private copy of MPI_COMM_WORLD: our collectives and messages cannot be confused with MPI calls
  // made elsewhere in the process (the test harness, a library) on MPI_COMM_WORLD.
  MPI_Comm world = duplicate_resting(MPI_COMM_WORLD);
  std::unique_ptr<Communicator> comm =
      make_mpi_world_communicator(world, /*may_spin=*/g_ranks_on_node <= cores_for_this_job());
  sync_clock_epoch(*comm);
  return comm;
}

void shutdown_mpi(std::unique_ptr<Communicator> comm) {
  comm.reset();  // drains what it issued and frees it
  ENSURE(!mpi_engine_in_use(), "shutdown_mpi() while a communicator split from the world is still alive: destroy "
                             "every group's communicator first");
  // Across hosts over UCX's TCP transport (MPICH 4.0.2, UCX 1.13), MPI_Finalize hangs in a fraction of
  // runs: one rank waits forever for its endpoints to flush while the others, done with theirs, wait in
  // the process manager's barrier. Every result is written by now, and after a barrier every message
  // has been delivered, so such a run may leave without MPI_Finalize: mpiexec accepts it, 20 runs in a
  // row out of 20 (docs/cluster.md, "A reliable MPI"). Opt-in, since one host's MPI_Finalize is fine.
  const char* skip = std::getenv("GPT_SKIP_MPI_FINALIZE");
  // Either way the ranks first meet in a barrier waited without spinning, so that MPI_Finalize's own
  // synchronization, which spins, finds every rank there.
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &request));
  wait_resting(&request);
  if (skip != nullptr && std::string(skip) == "1") {
    std::fflush(nullptr);
    return;
  }
  MPI_CHECK(MPI_Finalize());
}
