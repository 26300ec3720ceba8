// comm_mpi_internal.h: what the MPI communicator (comm_mpi.cpp) and MPI's start-up and shut-down
// (comm_mpi_startup.cpp) share, and nothing outside the two uses: the group-making calls that wait
// without spinning, and the world's communicator with the process's one progress engine.
#pragma once
#include <mpi.h>

#include <memory>

#include "comm/comm.h"

// Waits for a non-blocking MPI call, sleeping between polls (why: comm_mpi_startup.cpp).
void wait_resting(MPI_Request* request);
// MPI_Comm_split and MPI_Comm_dup, each the same communicator, made without spinning.
MPI_Comm split_resting(MPI_Comm comm, int color, int key);
MPI_Comm duplicate_resting(MPI_Comm comm);

// The communicator over `world` (a copy of MPI_COMM_WORLD), with the process's progress engine,
// which spins while it waits only where `may_spin` (a core for each rank of the node).
std::unique_ptr<Communicator> make_mpi_world_communicator(MPI_Comm world, bool may_spin);
// Whether some communicator still holds the engine (shut-down refuses to finalize under it).
bool mpi_engine_in_use();
