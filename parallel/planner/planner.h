// The planner end to end: given a model traced on the meta device (models/trace.h traces the
// zoo's), list and cost every op's strategies, track the (memory, time) frontier (also under
// memory budgets the memory layer's `auto` policy meets by recomputation) and pick the fastest
// plan that fits.
//   PlanOptions options;  options.config.devices = 8;  options.config.profile = load_profile(p);
//   PlanResult result = plan_graph(models::trace_model(ModelSpec{"bert_base"}), options);
#pragma once

#include <map>
#include <string>
#include <vector>

#include "parallel/planner/frontier.h"
#include "parallel/planner/graph.h"
#include "parallel/planner/strategies.h"

namespace tessel::planner {

// A zoo model by name and the sizes it is planned at (traced by models::trace_model).
struct ModelSpec {
  std::string name;               // resnet18..152, shufflenet_v2_x0_5..x2_0, bert_tiny..bert_large
  int64_t batch = 32;             // global batch (samples per iteration over all devices)
  int64_t seq = 128;              // BERT sequence length
  int64_t image_size = 224;       // ResNet / ShuffleNet input height and width
  int64_t num_classes = 1000;     // ResNet / ShuffleNet classes
  int64_t in_channels = 3;        // ResNet / ShuffleNet image channels (1: Fashion-MNIST)
  bool small_image_stem = false;  // ResNet / ShuffleNet stem for small images (the options')
};

// Names starting with "bert_" are sequence models (seq matters, image_size does not).
bool is_bert(const std::string& model);

struct PlanOptions {
  PlannerConfig config;
  double memory_per_device = 0;  // bytes; 0: the profile's
  // Fractions of activation memory the memory layer may keep (1: no recomputation); each adds
  // the plans that fit by recomputing the rest.
  std::vector<double> remat_fractions = {1.0, 0.5, 0.25};
  // Per remat fraction, the factor k that prices its recomputation, (1 - f) * forward time * k,
  // as measured by the memory simulator (models::simulated_remat_overhead); fractions not
  // listed use the profile's remat_overhead_k.
  std::map<double, double> remat_overhead_k;
  FrontierOptions frontier{32};
  // false: every plan runs on one dp x tp grid (each op still picks its split: replicate,
  // column, row, heads, ...), one frontier per grid, united; this is what the runtime's process
  // groups build. true: each op may pick its own degrees too (TensorOpt's full space).
  bool per_op_degrees = false;
  // ZeRO stages priced (PlannerConfig::zero_stage), each a set of frontier points: 0 none, 1
  // optimizer state in data-parallel parts, 2 gradients too, 3 parameters too. The config's own
  // stage is ignored.
  std::vector<int> zero_stages = {0};
  // Choose only among points the runtime's recipes execute as priced (PlannedPoint::executable);
  // the frontier keeps every point either way.
  bool executable_only = false;
};

// Where one plan's memory and time go, per device.
struct PlanBreakdown {
  double parameter_bytes = 0;         // parameters, gradients, optimizer state
  double activation_bytes = 0;        // kept for backward (before recomputation)
  double backward_working_bytes = 0;  // the largest op's gradients alive at once in backward
  double compute_s = 0;               // forward and backward kernels, and the optimizer update
  double comm_s = 0;                  // collectives of the splits (row, column, vocabulary, loss)
  double gradient_sync_s = 0;         // data-parallel gradient all-reduce (and bucket copies)
  double redistribution_s = 0;        // moving tensors between layouts of consecutive ops
  double sync_wait_s =
      0;  // waiting for the slowest rank before those collectives (sequenced_waits)
  double recompute_s = 0;  // extra forward work under the memory budget
};

struct PlannedPoint {
  Cost cost;                    // memory per device (bytes), time per iteration (seconds)
  double remat_fraction = 1.0;  // < 1: runs under the `auto` memory policy with budget cost.memory
  int zero_stage = 0;           // PlannerConfig::zero_stage it was priced with
  std::vector<int> choice;      // strategy index per op
  int dp = 1, tp = 1;           // the degrees most of the work runs at
  std::string summary;          // "dp=4 tp=2, heads split in attention, vocab-parallel embedding"
  PlanBreakdown breakdown;
  // Whether the runtime's recipes run this plan as it is priced; why not, otherwise.
  bool executable = true;
  std::string not_executable_reason;
};

struct PlanResult {
  std::vector<std::vector<Strategy>> strategies;  // priced at the first of the zero stages
  std::vector<PlannedPoint> frontier;             // by memory, ascending
  // Fastest point within memory_per_device (and executable, with executable_only); -1: none.
  int chosen = -1;
  double memory_per_device = 0;
  FrontierStats stats;  // summed over the remat fractions
  double search_seconds = 0;
};

PlanResult plan_graph(const Graph& graph, const PlanOptions& options);

// The summary and breakdown of one choice (used by plan_graph; exposed for tests).
PlannedPoint describe_choice(const Graph& graph,
                             const std::vector<std::vector<Strategy>>& strategies,
                             const PlannerConfig& config, const std::vector<int>& choice,
                             double remat_fraction);

}  // namespace tessel::planner
