// grid_report.h: what chapter 12 shows of its groups besides the step line (docs/theory.md, section
// 16): once, after its first measured step, every rank's bytes sent in each group of the grid (TP,
// CP's ring, DP x CP, expert DP, EP's all-to-alls and routing counts) next to that group's formula,
// and its expert parameters next to theirs; the same numbers as a JSON record ("groups"). The
// pipeline's own groups (point-to-point, embedding) are 08's report (pipeline_report.h). Defines
// GroupRow and report_groups().
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"          // Communicator
#include "training/training_run.h"  // TrainingRun: the JSON records

// One figure of this rank: what it measured, and what its formula says.
struct GroupRow {
  std::string name;  // "tp", "cp", ...: a column of the table, a key of the record
  double measured = 0, theory = 0;
};

// Collective over `world`: every rank's rows (the same names, in the same order, on every rank) go to
// rank 0 (as scalars, counted apart from the training traffic), which prints a line per rank and the
// formulas under the table, and writes the record (rank{q}_{name} and rank{q}_{name}_theory).
void report_groups(TrainingRun& run, Communicator& world, const std::vector<GroupRow>& mine,
                   const std::vector<std::pair<std::string, std::string>>& formulas);
