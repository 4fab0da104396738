#include "parallel/planner/report.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/planner/cost_model.h"

namespace tessel::planner {

namespace {

std::string pad(const std::string& text, size_t width, bool right) {
  if (text.size() >= width) return text;
  return right ? std::string(width - text.size(), ' ') + text
               : text + std::string(width - text.size(), ' ');
}

// Every op of the chosen plan with its split, costs and parameters.
void print_chosen_ops(std::ostream& out, const Graph& graph, const PlanResult& result,
                      const PlannedPoint& chosen) {
  out << "\n  op  name                 output shape          split                    "
         "compute     collectives  parameters\n";
  char line[512];
  for (const TracedOp& op : graph.ops) {
    const Strategy& s = result.strategies[op.id][chosen.choice[op.id]];
    std::string parameters;
    for (const ParameterSplit& split : s.parameters)
      if (split.owned)
        parameters += (parameters.empty() ? "" : " ") + graph.tensors[split.tensor].parameter +
                      (split.dim >= 0 ? "[dim " + std::to_string(split.dim) + "/" +
                                            std::to_string(split.parts) + "]"
                                      : "");
    std::snprintf(line, sizeof line, "%4d  %-20s %-21s %-24s %-11s %-12s %s", op.id,
                  op.name.c_str(), shape_str(op.output_shapes.at(0)).c_str(), s.label().c_str(),
                  format_seconds(s.forward_compute + s.backward_compute).c_str(),
                  format_seconds(s.forward_comm + s.backward_comm + s.gradient_sync).c_str(),
                  parameters.c_str());
    out << line << "\n";
  }
}

}  // namespace

void print_frontier(std::ostream& out, const PlanResult& result, int64_t batch, size_t rows) {
  out << "    " << pad("memory/device", 14, true) << "  " << pad("time/iter", 11, true) << "  "
      << pad("samples/s", 10, true) << "  plan\n";
  const size_t count = result.frontier.size();
  std::vector<bool> shown(count, rows == 0 || count <= rows);
  if (rows > 0 && count > rows) {
    for (size_t r = 0; r < rows; ++r) shown[r * (count - 1) / (rows - 1 > 0 ? rows - 1 : 1)] = true;
    if (result.chosen >= 0) shown[result.chosen] = true;
  }
  char line[512];
  for (size_t i = 0; i < count; ++i) {
    if (!shown[i]) continue;
    const PlannedPoint& point = result.frontier[i];
    const bool chosen = static_cast<int>(i) == result.chosen;
    std::snprintf(line, sizeof line, "%s%3zu %14s  %11s  %10.1f  %s%s%s", chosen ? "*" : " ", i,
                  format_bytes(point.cost.memory).c_str(), format_seconds(point.cost.time).c_str(),
                  static_cast<double>(batch) / point.cost.time, point.summary.c_str(),
                  point.executable ? "" : " [not run as priced]", chosen ? "   <- chosen" : "");
    out << line << "\n";
  }
  for (const PlannedPoint& point : result.frontier)
    if (!point.executable) {
      out << "[not run as priced]: " << point.not_executable_reason << "\n";
      break;
    }
  const size_t printed = static_cast<size_t>(std::count(shown.begin(), shown.end(), true));
  if (printed < count) out << "(" << printed << " of " << count << " points shown)\n";
}

void print_chosen(std::ostream& out, const Graph& graph, const PlanResult& result, bool show_ops) {
  TESSEL_CHECK(result.chosen >= 0 && result.chosen < static_cast<int>(result.frontier.size()),
               "print_chosen: the plan result has no chosen point");
  const PlannedPoint& chosen = result.frontier[result.chosen];
  out << "chosen: point " << result.chosen << ", " << format_bytes(chosen.cost.memory)
      << " per device (limit " << format_bytes(result.memory_per_device) << "), "
      << format_seconds(chosen.cost.time) << " per iteration: " << chosen.summary << "\n";
  const PlanBreakdown& b = chosen.breakdown;
  out << "  memory: parameters, gradients and optimizer state " << format_bytes(b.parameter_bytes)
      << ", activations " << format_bytes(b.activation_bytes);
  if (chosen.remat_fraction < 1)
    out << " (" << static_cast<int>(chosen.remat_fraction * 100 + 0.5) << "% kept)";
  out << ", backward's largest gradients at once " << format_bytes(b.backward_working_bytes);
  // What a status line's memory shows besides: the data sets a process loads, buffers of the
  // runtime and the allocator's rounding.
  out << "; training only, not the data sets a process holds";
  out << "\n  time: compute " << format_seconds(b.compute_s) << ", split collectives "
      << format_seconds(b.comm_s)
      << (chosen.zero_stage > 0 ? ", ZeRO's gradient and parameter collectives "
                                : ", gradient all-reduce ")
      << format_seconds(b.gradient_sync_s) << ", re-distribution "
      << format_seconds(b.redistribution_s) << ", waits for the slowest rank "
      << format_seconds(b.sync_wait_s) << ", recompute " << format_seconds(b.recompute_s) << "\n";
  if (show_ops) print_chosen_ops(out, graph, result, chosen);
}

}  // namespace tessel::planner
