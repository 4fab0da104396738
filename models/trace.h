// The model zoo as the planner sees it: one training forward pass of a zoo model (model and
// loss) traced on the meta device, no tensor bytes, ready for planner::plan_graph.
//   planner::PlanResult result = planner::plan_graph(trace_model({"bert_base"}), options);
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "parallel/planner/graph.h"
#include "parallel/planner/planner.h"
#include "parallel/planner/trace_module.h"

namespace tessel::models {

// Every model name trace_model accepts: resnet18..152, shufflenet_v2_x0_5..x2_0,
// bert_tiny..bert_large.
std::vector<std::string> known_models();
// An unknown name is an error listing the known ones.
planner::Graph trace_model(const planner::ModelSpec& spec);
// The ResNet or ShuffleNet of `spec` (classes, channels, stem), on the CPU.
std::shared_ptr<nn::Module> make_vision_model(const planner::ModelSpec& spec);

// BERT pre-training as a step of five int64 inputs, for planner::trace_module and
// parallel::ParallelModule over a BertForPreTraining: input_ids, token_type_ids, attention_mask
// and mlm_labels (batch, seq), nsp_labels (batch); the loss is bert_pretraining_loss's total.
planner::ModuleTraceOptions bert_pretraining_step(int64_t batch, int64_t seq);

}  // namespace tessel::models
