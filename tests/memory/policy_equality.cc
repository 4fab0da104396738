#include "tests/memory/policy_equality.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "gtest/gtest.h"
#include "memory/memory.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "ops/cpu/gemm.h"
#include "ops/ops.h"
#include "optim/sgd.h"
#include "tests/testing.h"

namespace tessel::memory {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::throws_error;

constexpr double kModelRtol = 1e-4;  // the closeness rule for whole f32 models (tests/testing.h)
constexpr double kModelAtol = 1e-6;
constexpr double kLaterLossRtol = 1e-3;
constexpr int kSteps = 3;
constexpr size_t kMinCandidateBytes = 4 * 1024;
constexpr int64_t kBertVocab = 30522;
// Costs estimated from each op's FLOPs and bytes rather than timed: the same evictions on every
// run, so a budget that works once works always (measured costs are the default elsewhere).

struct PolicyCase {
  std::string name;
  std::function<std::shared_ptr<nn::Module>()> make_model;
  // The loss of `step` (its batch drawn on the CPU from a seed of its own, then moved to
  // `device`).
  std::function<Tensor(nn::Module& model, int step, Device device)> loss;
  // A real learning rate: a wrong backward must show in the parameters' changes.
  double learning_rate = 1e-3;
  // Convolutions take im2col workspaces that a split shrinks; BERT's ops need none, so under
  // the split policy every op fits once others are evicted and nothing is split.
  bool splits_expected = true;
  // Activation fractions to train at: budget = fixed + f * (peak - fixed); on the CPU the
  // low ones too.
  std::vector<double> fractions = {0.7, 0.5, 0.3};
  std::vector<double> cpu_low_fractions = {0.2, 0.1};
  // dtr moves only tensors with op records: below this fraction what it cannot move (parameters,
  // their gradients and momentum, inputs) and one op's operands may leave it no room, and it must
  // then fail saying so and naming the least budget that op needs.
  double dtr_lowest_fraction = 0;
  // The batch must make activations at least this share of the peak, or budgets cut little.
  double min_activation_share = 0.75;
};

// A tensor's values and shape, copied out without touching the budgeted allocator.
struct HostCopy {
  std::vector<float> values;
  Shape shape;
  explicit HostCopy(const Tensor& tensor)
      : values(tensor.to_vector<float>()), shape(tensor.sizes()) {}
  Tensor tensor() const { return tessel::tensor(values, shape); }
};

struct TrainingRun {
  std::vector<float> losses;
  // After the first step, which starts from the same parameters under every policy: each
  // parameter's gradient and its change (parameter after the step minus before).
  std::vector<HostCopy> first_gradients;
  std::vector<HostCopy> first_changes;
  std::vector<Tensor> parameters;  // on the CPU
  std::vector<Tensor> buffers;     // batch-norm running statistics, on the CPU
  size_t peak = 0;
  size_t fixed = 0;  // parameters, gradients and momentum
  PolicyCounters counters;
};

TrainingRun train(const PolicyCase& policy_case, const MemoryOptions& options) {
  TrainingRun run;
  MemoryScope scope(options);
  manual_seed(7);
  auto model = policy_case.make_model();
  const Device device = options.device();
  if (!device.is_cpu()) model->to(device);
  model->train();
  optim::SGD sgd(model->parameters(), optim::SGDOptions(policy_case.learning_rate).momentum(0.9));
  run.fixed = fixed_memory_bytes(model->parameters(), 1);
  std::vector<HostCopy> initial;
  for (const Tensor& parameter : model->parameters()) initial.emplace_back(parameter);
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad();
    Tensor loss = policy_case.loss(*model, step, device);
    loss.backward();
    if (step == 0)
      for (const Tensor& parameter : model->parameters())
        run.first_gradients.emplace_back(parameter.grad());
    sgd.step();
    if (step == 0) {
      const std::vector<Tensor> parameters = model->parameters();
      for (size_t i = 0; i < parameters.size(); ++i) {
        HostCopy change(parameters[i]);
        for (size_t j = 0; j < change.values.size(); ++j) change.values[j] -= initial[i].values[j];
        run.first_changes.push_back(std::move(change));
      }
    }
    run.losses.push_back(loss.item<float>());
  }
  run.peak = static_cast<size_t>(scope.allocator().memory_stats().base.peak_allocated_bytes);
  run.counters = scope.allocator().policy_counters();
  for (const Tensor& parameter : model->parameters())
    run.parameters.push_back(parameter.to(Device::cpu()));
  for (const Tensor& buffer : model->buffers()) run.buffers.push_back(buffer.to(Device::cpu()));
  return run;
}

// TESSEL_POLICY_PROBE=1 prints peaks, activation shares and counters.
bool probing() { return std::getenv("TESSEL_POLICY_PROBE") != nullptr; }

void expect_same(const TrainingRun& actual, const TrainingRun& expected, bool bitwise) {
  ASSERT_EQ(actual.losses.size(), expected.losses.size());
  for (size_t i = 0; i < actual.losses.size(); ++i) {
    if (bitwise) {
      EXPECT_EQ(std::memcmp(&actual.losses[i], &expected.losses[i], sizeof(float)), 0)
          << "loss of step " << i << ": " << actual.losses[i] << " vs " << expected.losses[i];
    } else {
      // The first loss comes from the same parameters, later ones from parameters that differ by
      // the rounding of split sums, which a small batch's batch norm amplifies: at -O1 (the
      // sanitizer builds, gcc and clang alike) ShuffleNet's third loss under split moved by 1.6e-4
      // of itself. The first step's gradients and changes below hold every policy to the
      // closeness rule.
      const double rtol = i == 0 ? kModelRtol : kLaterLossRtol;
      EXPECT_LE(std::fabs(actual.losses[i] - expected.losses[i]),
                kModelAtol + rtol * std::fabs(expected.losses[i]))
          << "loss of step " << i << ": " << actual.losses[i] << " vs " << expected.losses[i];
    }
  }
  auto compare = [&](const std::vector<Tensor>& a, const std::vector<Tensor>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      if (bitwise) {
        EXPECT_TRUE(bitwise_equal(a[i], b[i])) << what << " " << i;
      } else {
        EXPECT_TRUE(all_close(a[i], b[i], kModelRtol, kModelAtol)) << what << " " << i;
      }
    }
  };
  // Gradients and parameter changes of the first step, each against its own size (the
  // closeness rule over the tensor): a wrong backward under a policy shows here at once.
  auto compare_first = [&](const std::vector<HostCopy>& a, const std::vector<HostCopy>& b,
                           const char* what) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      if (bitwise) {
        EXPECT_EQ(a[i].values, b[i].values) << what << " " << i << " after the first step";
      } else {
        EXPECT_TRUE(all_close(a[i].tensor(), b[i].tensor(), kModelRtol, kModelAtol))
            << what << " " << i << " after the first step";
      }
    }
  };
  compare_first(actual.first_gradients, expected.first_gradients, "gradient of parameter");
  compare_first(actual.first_changes, expected.first_changes, "change of parameter");
  // Later steps start from parameters that already differ by rounding (split sums in another
  // order), so only the bitwise policies must end on the same parameters; every policy must give
  // the same losses.
  if (bitwise) {
    compare(actual.parameters, expected.parameters, "parameter");
    compare(actual.buffers, expected.buffers, "buffer");
  }
}

// ---- the models and their batches ----

PolicyCase resnet18_case() {
  PolicyCase result;
  result.name = "resnet18";
  // The CPU's kernels set what dtr cannot move: without AVX-512 (other GEMM and Winograd blocking,
  // other scratch memory) it ran out of tensors to move at f = 0.2 (its least budget 216.6 MiB
  // against 207.1 MiB on an AMD EPYC with AVX2 only) and trained at f = 0.1.
  result.dtr_lowest_fraction = cpu::avx512_kernels() ? 0.2 : 0.3;
  result.make_model = [] {
    return models::resnet18(models::ResNetOptions().num_classes(10).small_image_stem(true));
  };
  result.loss = [](nn::Module& model, int step, Device device) {
    constexpr int64_t kBatch = 352;  // 11.2M parameters: activations must outweigh 3 copies
    manual_seed(100 + step);
    Tensor images = randn({kBatch, 3, 16, 16}).to(device);
    Tensor labels = randint(0, 10, {kBatch}).to(device);
    return cross_entropy(model.forward(images), labels);
  };
  return result;
}

PolicyCase shufflenet_case() {
  PolicyCase result;
  result.name = "shufflenet_v2_x0_5";
  result.make_model = [] {
    return models::shufflenet_v2_x0_5(
        models::ShuffleNetV2Options().num_classes(10).small_image_stem(true));
  };
  result.loss = [](nn::Module& model, int step, Device device) {
    manual_seed(200 + step);
    Tensor images = randn({8, 3, 32, 32}).to(device);
    Tensor labels = randint(0, 10, {8}).to(device);
    return cross_entropy(model.forward(images), labels);
  };
  return result;
}

// BERT tiny with dropout. With a small vocabulary at f = 0.7, 0.5, 0.3; with BERT's 30522 words
// at f = 0.2 and 0.1, which only the MLM head scored in chunks lets any policy reach.
PolicyCase bert_case(int64_t vocab) {
  constexpr int64_t kBatch = 8, kSequence = 128;
  PolicyCase result;
  result.name = vocab == kBertVocab ? "bert_tiny_vocab30522" : "bert_tiny";
  if (vocab == kBertVocab) {
    result.fractions = {0.2, 0.1};
    result.cpu_low_fractions = {};
    // The word table (30522 x 128, with its gradient and momentum) is most of the fixed memory.
    result.min_activation_share = 0.55;
  }
  result.make_model = [vocab] {
    return std::make_shared<models::BertForPreTraining>(
        models::BertConfig::tiny().vocab_size(vocab).dropout(0.1));
  };
  result.loss = [vocab](nn::Module& model, int step, Device device) {
    auto& bert = static_cast<models::BertForPreTraining&>(model);
    manual_seed(300 + step);
    Tensor input_ids = randint(0, vocab, {kBatch, kSequence});
    Tensor token_types = randint(0, 2, {kBatch, kSequence});
    // Predict about 15% of the positions; -100 elsewhere.
    Tensor unmasked = ge(rand({kBatch, kSequence}), full({kBatch, kSequence}, 0.15));
    Tensor mlm_labels = masked_fill(input_ids, unmasked, -100);
    Tensor nsp_labels = randint(0, 2, {kBatch});
    // The MLM head scored in chunks (linear_cross_entropy): the chunks' ops under every policy.
    models::BertPreTrainingOutput output = bert.forward(
        input_ids.to(device), token_types.to(device), Tensor(), models::MlmOutput::kHeadInput);
    return models::bert_pretraining_loss(output, mlm_labels.to(device), nsp_labels.to(device))
        .total;
  };
  result.splits_expected = false;
  return result;
}

PolicyCase make_case(const std::string& model) {
  if (model == "resnet18") return resnet18_case();
  if (model == "shufflenet_v2_x0_5") return shufflenet_case();
  if (model == "bert_tiny_vocab30522") return bert_case(kBertVocab);
  return bert_case(256);
}

// The unbudgeted run of each model on each device, once per process.
const TrainingRun& reference(const PolicyCase& policy_case, Device device) {
  static std::map<std::string, TrainingRun> runs;
  const std::string key = policy_case.name + " on " + device.str();
  auto found = runs.find(key);
  if (found != runs.end()) return found->second;
  TrainingRun run = train(policy_case, MemoryOptions().device(device));
  if (probing()) {
    std::cout << policy_case.name << ": peak " << format_bytes(run.peak) << ", fixed "
              << format_bytes(run.fixed) << ", activations "
              << 100.0 * (1.0 - static_cast<double>(run.fixed) / run.peak) << "% of the peak\n";
  }
  return runs.emplace(key, std::move(run)).first->second;
}

}  // namespace

std::vector<PolicyEqualityCase> policy_equality_cases() {
  std::vector<PolicyEqualityCase> cases;
  for (const char* model : {"resnet18", "shufflenet_v2_x0_5", "bert_tiny"})
    for (Policy policy : {Policy::kDtr, Policy::kSwap, Policy::kSplit, Policy::kAuto})
      cases.push_back({model, policy});
  // At f = 0.2 the activations' room (14 MiB) is less than the word table's gradient alone
  // (15 MiB), which no recompute can shrink: only the policies that move state train it.
  for (Policy policy : {Policy::kSwap, Policy::kAuto})
    cases.push_back({"bert_tiny_vocab30522", policy});
  return cases;
}

std::string policy_equality_case_name(const PolicyEqualityCase& test_case) {
  return test_case.model + "_" + policy_name(test_case.policy);
}

void check_policy_equality(const std::string& model, Policy policy, Device device, bool bitwise) {
  const PolicyCase policy_case = make_case(model);
  const TrainingRun& expected = reference(policy_case, device);
  ASSERT_GE(1.0 - static_cast<double>(expected.fixed) / static_cast<double>(expected.peak),
            policy_case.min_activation_share)
      << "the batch is too small: activations must be at least "
      << 100 * policy_case.min_activation_share << "% of the peak";

  PolicyCounters total;
  std::vector<double> fractions = policy_case.fractions;
  if (device.is_cpu())
    fractions.insert(fractions.end(), policy_case.cpu_low_fractions.begin(),
                     policy_case.cpu_low_fractions.end());
  for (double fraction : fractions) {
    const size_t budget = activation_budget(expected.fixed, expected.peak, fraction);
    SCOPED_TRACE(policy_case.name + " under " + policy_name(policy) +
                 " at f = " + std::to_string(fraction) + " (" + format_bytes(budget) + ")");
    const MemoryOptions options = MemoryOptions()
                                      .device(device)
                                      .budget(budget)
                                      .policy(policy)
                                      .min_candidate_bytes(kMinCandidateBytes)
                                      .cost_source(CostSource::kEstimated)
                                      .fixed_bytes(expected.fixed);
    TrainingRun run;
    if (policy == Policy::kDtr && fraction < policy_case.dtr_lowest_fraction) {
      // Below it dtr may run out of tensors it can move (where depends on the order of its
      // evictions, not only on the budget): it then stops naming the least budget that op needs,
      // or else it trains like without a budget.
      std::optional<TrainingRun> trained;
      if (throws_error([&] { trained = train(policy_case, options); },
                       "least budget for this op under dtr"))
        continue;
      ASSERT_TRUE(trained.has_value()) << "dtr failed without naming the least budget";
      run = std::move(*trained);
    } else {
      run = train(policy_case, options);
    }
    if (probing()) {
      std::cout << "  " << policy_case.name << " " << policy_name(policy) << " f=" << fraction
                << ": peak " << format_bytes(run.peak) << " of " << format_bytes(budget) << "; "
                << format_counters(run.counters) << "\n";
    }
    EXPECT_LE(run.peak, budget);
    expect_same(run, expected, bitwise);
    total.evictions += run.counters.evictions;
    total.recomputes += run.counters.recomputes;
    total.swaps_out += run.counters.swaps_out;
    total.swaps_in += run.counters.swaps_in;
    total.splits += run.counters.splits;
  }
  // The policy did its work.
  switch (policy) {
    case Policy::kDtr:
      EXPECT_GT(total.evictions, 0);
      EXPECT_GT(total.recomputes, 0);
      break;
    case Policy::kSwap:
      EXPECT_GT(total.swaps_out, 0);
      EXPECT_GT(total.swaps_in, 0);
      EXPECT_EQ(total.recomputes, 0);
      break;
    case Policy::kSplit:
      // On CUDA a convolution whose fastest algorithm's workspace does not fit takes one that
      // needs less, so ResNet's ops fit whole and the policy evicts instead.
      if (policy_case.splits_expected && !device.is_cuda()) {
        EXPECT_GT(total.splits, 0);
      } else {
        EXPECT_GT(total.evictions, 0);
      }
      break;
    default:
      EXPECT_GT(total.evictions + total.swaps_out, 0);
      break;
  }
}

}  // namespace tessel::memory
