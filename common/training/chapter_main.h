// chapter_main.h: the main() every chapter shares, so that a chapter's own main() is one call and its
// diff against its base shows the lesson only. Defines run_chapter().
//
// A chapter hands it its Options (the chapter's own flags, declared and checked by the struct itself)
// and its train() (the whole run). In that order, run_chapter
//   1. starts MPI (comm.h);
//   2. lets Options::declare(flags, cfg) add the chapter's flags to the shared ones (flags.h), and
//      change a shared default (11: --preset moe-tiny);
//   3. parses the command line (--help prints every flag and returns 0);
//   4. calls Options::check(cfg, ranks): every refusal that needs the parsed flags or the rank
//      count, before the first collective, the same on every rank (config_error: one line, exit 1);
//   5. picks the communicator for the device (NCCL on GPUs; comm_factory.h);
//   6. calls train(world, cfg, options), which returns once every group it split is gone;
//   7. ends MPI, and returns train()'s status.
#pragma once
#include <string>
#include <utility>

#include "comm/comm.h"          // init_mpi_communicator, shutdown_mpi
#include "comm/comm_factory.h"  // communicator_for
#include "ops/device.h"         // pick_device
#include "training/flags.h"     // TrainConfig, FlagParser, parse_train_flags

template <class Options>
int run_chapter(int argc, char** argv, const std::string& chapter, const std::string& about,
                int (*train)(Communicator& world, TrainConfig& cfg, const Options& opt)) {
  auto comm = init_mpi_communicator(&argc, &argv);
  TrainConfig cfg;
  FlagParser flags;
  Options opt;
  opt.declare(flags, cfg);
  if (!parse_train_flags(argc, argv, chapter, about, flags, &cfg)) {  // --help
    shutdown_mpi(std::move(comm));
    return 0;
  }
  opt.check(cfg, comm->size());
  comm = communicator_for(pick_device(cfg.device), std::move(comm), cfg.collectives);
  const int status = train(*comm, cfg, opt);
  shutdown_mpi(std::move(comm));
  return status;
}
