// mpi_test_env.h: what tests that run under mpiexec get from their main (mpi_gtest_main.cpp).
// Defines test_comm(), the communicator over every rank of the job. Every rank runs every test in
// the same order, so a test may call collectives freely, as long as all ranks make the same calls:
// check values with EXPECT_*, and keep ASSERT_* for conditions every rank sees alike, or a rank that
// returns early leaves the others waiting inside a collective.
#pragma once
#include "comm/comm.h"

Communicator& test_comm();
