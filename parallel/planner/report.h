// The planner's results as text, as the `plan` command prints them.
//   print_frontier(std::cout, result, /*batch=*/64, /*rows=*/12);
//   if (result.chosen >= 0) print_chosen(std::cout, graph, result);
#pragma once

#include <cstdint>
#include <ostream>

#include "parallel/planner/graph.h"
#include "parallel/planner/planner.h"

namespace tessel::planner {

// The frontier as a table (memory per device, time and samples per second per iteration, the
// plan): `rows` points (0: all) spread evenly over it, always with both ends and the chosen one
// (marked *). Points the runtime would not run as priced are marked, and why is said once.
void print_frontier(std::ostream& out, const PlanResult& result, int64_t batch, size_t rows = 0);

// The chosen point: its memory and time and where they go; with `show_ops`, every op's split,
// costs and parameters. The result must have a chosen point.
void print_chosen(std::ostream& out, const Graph& graph, const PlanResult& result,
                  bool show_ops = false);

}  // namespace tessel::planner
