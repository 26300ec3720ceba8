// planner_shape_refusals.h: what the planner refuses for a published shape's grid (planner_shape.cpp):
// degrees that do not divide the GPUs, the batch, the heads (TP, then Ulysses), the MLP, the
// experts or the data-parallel group; schedules the shape cannot run. Defines shape_invalid_reason().
#pragma once
#include <string>

#include "planner/planner.h"  // PlanInputs, PlanConfig

// Why `c` cannot run for in.shape on in.gpus, in one sentence naming the degree; "" when it can.
std::string shape_invalid_reason(const PlanInputs& in, const PlanConfig& c);
