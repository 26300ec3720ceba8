// peer_state.h: what this node can see of the job's other ranks, for the watchdogs' messages. MPI
// cannot say which peer a stuck collective waits for; /proc can say which peers on this node are
// stopped or gone. The MPI watchdog (comm_engine.cpp) asks about a group, the GPU watchdog
// (watchdog.cpp) about the whole job. Defines set_world_processes() and stopped_or_ended_ranks().
#pragma once
#include <string>
#include <vector>

// Every world rank's process id and node (the lowest world rank on its node), gathered at start-up
// (init_mpi_communicator); `me` is this process's world rank.
void set_world_processes(const std::vector<int>& pids, const std::vector<int>& nodes, int me);

// Which of `world_ranks` (other than this process) that share its node are stopped (SIGSTOP, a
// debugger) or gone: "world rank 1 (pid 4242) is stopped (SIGSTOP, Ctrl-Z or a debugger)", several
// joined by "; "; "" when none is, none shares the node, or start-up has not run.
std::string stopped_or_ended_ranks(const std::vector<int>& world_ranks);
// The same over every rank of the job.
std::string stopped_or_ended_ranks();
