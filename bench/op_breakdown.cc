// Where one rank's training step goes, op by op, against the planner's prices for the same ops:
// the wall time between consecutive op calls of a real step (forward, backward, optimizer),
// summed by registry name, beside the planner's 1-device compute time of the traced ops.
//   bazel-bin/bench/op_breakdown --model=shufflenet_v2_x1_0 --batch=8 --image_size=128
//       --threads=1 --profile=parallel/profiles/cpu_2core_example.json
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "bench/random_batch.h"
#include "core/op.h"
#include "core/rng.h"
#include "core/run_main.h"
#include "core/threading.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "models/trace.h"
#include "ops/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "parallel/planner/planner.h"
#include "tools/plan/plan_cli.h"

namespace tessel::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Totals {
  int calls = 0;
  double seconds = 0;
};

int run(int argc, char** argv) {
  CLI::App app("Per-op time of one training step against the planner's prices", "op_breakdown");
  std::string model_name = "resnet50", profile_name = "cpu_2core_example";
  int64_t batch = 4, image_size = 128, seq = 128;
  int threads = 1, steps = 2;
  app.add_option("--model", model_name);
  app.add_option("--batch", batch);
  app.add_option("--image_size", image_size);
  app.add_option("--seq", seq);
  app.add_option("--threads", threads);
  app.add_option("--steps", steps, "measured steps (after one warm-up step)");
  app.add_option("--profile", profile_name);
  CLI11_PARSE(app, argc, argv);
  set_num_threads(threads);

  // The planner's prices: every op replicated on one device.
  planner::ModelSpec spec;
  spec.name = model_name;
  spec.batch = batch;
  spec.seq = seq;
  spec.image_size = image_size;
  const planner::Graph graph = models::trace_model(spec);
  planner::PlannerConfig config;
  config.devices = 1;
  config.optimizer_states = planner::is_bert(model_name) ? 2 : 1;  // AdamW, SGD with momentum
  config.profile = planner::load_profile(planner::find_profile(profile_name));
  const auto strategies = planner::enumerate_strategies(graph, config);
  std::map<std::string, Totals> predicted_forward, predicted_backward;
  double predicted_total = 0, predicted_optimizer = 0;
  for (const planner::TracedOp& op : graph.ops) {
    const planner::Strategy& s = strategies[op.id][0];
    predicted_forward[op.name].calls++;
    predicted_forward[op.name].seconds += s.forward_compute;
    predicted_backward[op.name].seconds += s.backward_compute;
    predicted_total += s.forward_compute + s.backward_compute + s.optimizer_compute;
    predicted_optimizer += s.optimizer_compute;
  }

  manual_seed(0);
  const bool bert = planner::is_bert(model_name);
  std::shared_ptr<nn::Module> net;
  std::shared_ptr<models::BertForPreTraining> bert_model;
  models::BertConfig bert_config;
  if (bert) {
    bert_config = models::BertConfig::by_name(model_name.substr(5)).dropout(0.0);
    bert_model = std::make_shared<models::BertForPreTraining>(bert_config);
    net = bert_model;
  } else if (model_name.rfind("resnet", 0) == 0) {
    net = models::make_resnet(model_name, models::ResNetOptions());
  } else {
    net = models::make_shufflenet(model_name, models::ShuffleNetV2Options());
  }
  net->train();
  std::unique_ptr<optim::Optimizer> optimizer;
  if (bert)
    optimizer = std::make_unique<optim::AdamW>(net->named_parameters(), optim::AdamWOptions(1e-4));
  else
    optimizer = std::make_unique<optim::SGD>(net->named_parameters(),
                                             optim::SGDOptions(0.01).momentum(0.9));
  const RandomBatch data =
      random_batch(bert ? &bert_config : nullptr, batch, seq, image_size, 1000);

  std::map<std::string, Totals> measured[3];  // forward, backward, optimizer
  double phase_seconds[3] = {0, 0, 0};
  int phase = 0;
  bool recording = false;
  Clock::time_point last;
  set_trace_hook(
      [&](const OpDef& op, const std::vector<Tensor>&, const std::vector<Tensor>&, const Attrs&) {
        const Clock::time_point now = Clock::now();
        if (recording) {
          Totals& totals = measured[phase][op.name];
          totals.calls++;
          totals.seconds += std::chrono::duration<double>(now - last).count();
        }
        last = now;
      });
  auto step = [&](bool record) {
    recording = record;
    auto begin = Clock::now();
    last = begin;
    phase = 0;
    Tensor loss =
        bert ? models::bert_pretraining_loss(bert_model->forward(data.ids, data.types, data.mask),
                                             data.mlm_labels, data.nsp_labels)
                   .total
             : cross_entropy(net->forward(data.images), data.labels);
    auto forward_end = Clock::now();
    optimizer->zero_grad();
    phase = 1;
    last = Clock::now();
    loss.backward();
    auto backward_end = Clock::now();
    phase = 2;
    last = backward_end;
    optimizer->step();
    auto end = Clock::now();
    if (record) {
      phase_seconds[0] += std::chrono::duration<double>(forward_end - begin).count();
      phase_seconds[1] += std::chrono::duration<double>(backward_end - forward_end).count();
      phase_seconds[2] += std::chrono::duration<double>(end - backward_end).count();
    }
  };
  step(false);
  for (int i = 0; i < steps; ++i) step(true);

  std::printf("%s batch %lld, %d thread(s), profile %s; seconds per step\n", model_name.c_str(),
              static_cast<long long>(batch), threads, config.profile.name.c_str());
  const double measured_total = (phase_seconds[0] + phase_seconds[1] + phase_seconds[2]) / steps;
  std::printf(
      "measured %.3f (forward %.3f, backward %.3f, optimizer %.3f); predicted %.3f (optimizer "
      "%.3f), error %+.0f%%\n",
      measured_total, phase_seconds[0] / steps, phase_seconds[1] / steps, phase_seconds[2] / steps,
      predicted_total, predicted_optimizer,
      100 * (predicted_total - measured_total) / measured_total);
  std::printf("\n%-24s %6s %10s %10s %10s\n", "forward op", "calls", "measured", "predicted",
              "pred bwd");
  for (const auto& [name, totals] : predicted_forward) {
    const Totals& m = measured[0][name];
    std::printf("%-24s %6d %10.4f %10.4f %10.4f\n", name.c_str(), totals.calls, m.seconds / steps,
                totals.seconds, predicted_backward[name].seconds);
  }
  for (int p = 1; p < 3; ++p) {
    std::printf("\n%-24s %6s %10s\n", p == 1 ? "backward op" : "optimizer op", "calls", "measured");
    for (const auto& [name, totals] : measured[p])
      std::printf("%-24s %6d %10.4f\n", name.c_str(), totals.calls / steps, totals.seconds / steps);
  }
  return 0;
}

}  // namespace
}  // namespace tessel::bench

int main(int argc, char** argv) { return tessel::run_main(argc, argv, tessel::bench::run); }
