// Plan files: the chosen parallel plan as JSON, for the training recipes (--plan=FILE) and for
// people: the device mesh, how each parameter is cut, each op's strategy, the predicted memory
// and time. Also the frontier as JSON for tools/plot_frontier.py.
//   write_plan(make_plan_file(graph, result, result.chosen, spec, options), "plan.json");
//   PlanFile plan = read_plan("plan.json");   plan.mesh_dp, plan.parameters[0].parts ...
#pragma once

#include <string>
#include <vector>

#include "parallel/planner/planner.h"

namespace tessel::planner {

struct PlanFile {
  static constexpr int kVersion = 1;
  std::string model;
  int devices = 1;
  int64_t batch = 0;
  int64_t seq = 0;                // BERT only (0 otherwise)
  int64_t image_size = 0;         // vision models only (0 otherwise)
  int64_t in_channels = 0;        // vision models only: image channels (0 otherwise)
  bool small_image_stem = false;  // vision models only: the stem for small images
  std::string profile;            // the device profile's name
  std::string profile_layout;     // the thread layout it was measured under ("" if not recorded)
  double memory_per_device = 0;   // the limit the plan was chosen under, bytes
  int mesh_dp = 1, mesh_tp = 1;   // the degrees most of the work runs at
  // "none", or "auto" with memory_budget bytes: the memory layer recomputes what does not fit.
  std::string memory_policy = "none";
  double memory_budget = 0;
  double remat_fraction = 1.0;
  int zero_stage = 0;  // ZeRO over the dp group (parallel/zero.h): 0, 1, 2 or 3
  // Batch norm over a batch split: "whole_batch" statistics (gathered over dp) or "per_rank".
  std::string batch_norm = "whole_batch";
  double predicted_memory = 0;  // bytes per device
  double predicted_time = 0;    // seconds per iteration
  std::string summary;

  struct Parameter {
    std::string name;  // dotted, as named_parameters() lists it
    Shape shape;
    int split_dim = -1;  // -1: every device holds all of it
    int parts = 1;
    bool operator==(const Parameter& other) const {
      return name == other.name && shape == other.shape && split_dim == other.split_dim &&
             parts == other.parts;
    }
  };
  std::vector<Parameter> parameters;

  struct Op {
    int index = 0;
    std::string op;
    std::string strategy;  // split kind: replicate, column, row, heads, vocab, feature
    int dp = 1, tp = 1;
    std::vector<std::string> parameters;  // the parameters this op owns
    bool operator==(const Op& other) const {
      return index == other.index && op == other.op && strategy == other.strategy &&
             dp == other.dp && tp == other.tp && parameters == other.parameters;
    }
  };
  std::vector<Op> ops;
};

// The plan behind frontier point `point` of `result`.
PlanFile make_plan_file(const Graph& graph, const PlanResult& result, int point,
                        const ModelSpec& spec, const PlanOptions& options);

std::string plan_to_json(const PlanFile& plan);
// Checks every field; errors name the field and `where`.
PlanFile plan_from_json(const std::string& text, const std::string& where);
void write_plan(const PlanFile& plan, const std::string& path);
PlanFile read_plan(const std::string& path);

// {"model", "devices", "profile", "memory_per_device", "chosen", "points": [{"memory_bytes",
// "time_s", "remat_fraction", "zero_stage", "executable", "summary", "breakdown": {the
// PlanBreakdown's fields}}, ...]} for tools/plot_frontier.py.
std::string frontier_to_json(const PlanResult& result, const std::string& model, int devices,
                             const std::string& profile);

}  // namespace tessel::planner
