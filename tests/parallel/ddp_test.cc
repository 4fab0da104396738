// DistributedDataParallel against one process that runs the same per-rank shards one after
// another and averages their gradients (the project's rule for parallel forms): after 3 SGD steps
// the parameters (and every step's losses) agree, for an MLP, a conv net with batch norm (per-shard
// statistics), ResNet-18 with the small-image stem and BERT tiny (dropout off, losses normalised
// by global counts). Also: buckets, unused parameters, mismatched modules. Run with 2 and 4 ranks.
#include "parallel/ddp.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/rng.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/sgd.h"
#include "parallel/mpi_communicator.h"
#include "tests/parallel/mpi_testing.h"
#include "tests/testing.h"

namespace tessel::parallel {
namespace {

using tessel::testing::all_close;
using tessel::testing::throws_error;
using testing::MpiTest;

// The loss of shard `shard` (of `shards`) at `step`, scaled so that the mean over the shards is
// the loss of the whole global batch. Runs forward through `ddp` when given, else directly.
using ShardLoss = std::function<Tensor(nn::Module& model, DistributedDataParallel* ddp, int step,
                                       int shard, int shards)>;
using MakeModel = std::function<std::shared_ptr<nn::Module>()>;

// The same data on every rank and in the reference: seeded by step and shard.
void seed_data(int step, int shard) { manual_seed(7919 * (step + 1) + 104729 * (shard + 1)); }

Tensor forward_through(nn::Module& model, DistributedDataParallel* ddp, const Tensor& input) {
  return ddp != nullptr ? ddp->forward(input) : model.forward(input);
}

// Classification on random inputs of `input_shape` (per shard), cross-entropy summed over the
// shard and divided by the global batch size, times the shard count.
ShardLoss classification_loss(Shape input_shape, int64_t classes, DType dtype = DType::kFloat32) {
  return [input_shape, classes, dtype](nn::Module& model, DistributedDataParallel* ddp, int step,
                                       int shard, int shards) {
    seed_data(step, shard);
    Tensor input = randn(input_shape, dtype);
    Tensor target = randint(0, classes, {input_shape[0]});
    Tensor logits = forward_through(model, ddp, input);
    double global_batch = static_cast<double>(input_shape[0]) * shards;
    return cross_entropy(logits, target, -100, 0.0, "sum") * (shards / global_batch);
  };
}

class DataParallel : public MpiTest {
 protected:
  // Trains `make()` for `steps` SGD steps with DDP on every rank and, on rank 0, the reference
  // over all shards in turn; compares losses each step and parameters at the end.
  void expect_matches_sequential_shards(const MakeModel& make, const ShardLoss& loss,
                                        DDPOptions options = {}, double lr = 0.1,
                                        double rtol = 1e-4) {
    const int steps = 3;
    // A different initialisation on every rank: DDP must start everyone from rank 0's.
    manual_seed(1000 + rank());
    std::shared_ptr<nn::Module> model = make();
    DistributedDataParallel ddp(model, shared_world(), options);
    std::shared_ptr<nn::Module> reference;
    if (rank() == 0) {
      reference = make();
      reference->load_state_dict(model->state_dict());
    }
    const auto sgd_options = optim::SGDOptions(lr).momentum(0.9);
    optim::SGD sgd(model->named_parameters(), sgd_options);
    std::unique_ptr<optim::SGD> reference_sgd;
    if (reference)
      reference_sgd = std::make_unique<optim::SGD>(reference->named_parameters(), sgd_options);

    for (int step = 0; step < steps; ++step) {
      sgd.zero_grad();
      Tensor shard_loss = loss(*model, &ddp, step, rank(), size());
      shard_loss.backward();  // the averaged gradients are in place when it returns
      sgd.step();
      Tensor losses = zeros({size()}, shard_loss.dtype());
      shared_world()->all_gather(shard_loss.detach().reshape({1}), losses);

      if (rank() == 0) {
        reference_sgd->zero_grad();
        std::vector<double> reference_losses;
        for (int shard = 0; shard < size(); ++shard) {
          Tensor value = loss(*reference, nullptr, step, shard, size());
          value.backward();
          reference_losses.push_back(value.item<double>());
        }
        {
          NoGradGuard no_grad;
          for (auto& parameter : reference->parameters()) {
            Tensor grad = parameter.grad();
            if (grad.defined()) grad.mul_(1.0 / size());
          }
        }
        reference_sgd->step();
        EXPECT_TRUE(all_close(
            losses, from_vector<double>(reference_losses, {size()}, losses.dtype()), rtol))
            << "losses of step " << step;
      }
    }

    auto named = model->named_parameters();
    if (rank() == 0) {
      auto expected = reference->named_parameters();
      ASSERT_EQ(named.size(), expected.size());
      for (size_t i = 0; i < named.size(); ++i) {
        EXPECT_TRUE(all_close(named[i].second, expected[i].second, rtol)) << named[i].first;
      }
    }
    // Every rank holds rank 0's parameters.
    for (auto& [name, parameter] : named) {
      Tensor rank0 = parameter.detach().clone();
      shared_world()->broadcast(rank0, 0);
      EXPECT_TRUE(all_close(parameter.detach(), rank0, 1e-6, 0)) << name << " on rank " << rank();
    }
  }
};

std::shared_ptr<nn::Module> make_mlp() {
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 3)});
}

std::shared_ptr<nn::Module> make_conv_net() {
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions(3, 4, 3).padding(1)),
      std::make_shared<nn::BatchNorm2d>(nn::BatchNormOptions(4)), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions(4, 6, 3).stride(2).padding(1)),
      std::make_shared<nn::BatchNorm2d>(nn::BatchNormOptions(6)), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::AdaptiveAvgPool2d>(nn::IntPair(1, 1)), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(6, 5)});
}

TEST_F(DataParallel, MlpMatchesSequentialShards) {
  expect_matches_sequential_shards(make_mlp, classification_loss({4, 6}, 3));
}

TEST_F(DataParallel, MlpWithSeveralSmallBucketsMatchesSequentialShards) {
  // 64-byte buckets: nearly one bucket per parameter.
  expect_matches_sequential_shards(
      make_mlp, classification_loss({4, 6}, 3),
      DDPOptions().bucket_cap_mb(256.0 / (1 << 20)).first_bucket_mb(64.0 / (1 << 20)));
}

TEST_F(DataParallel, ConvNetWithBatchNormMatchesSequentialShards) {
  // Batch norm normalises each shard with its own statistics, in both runs.
  expect_matches_sequential_shards(make_conv_net, classification_loss({3, 3, 6, 6}, 5),
                                   DDPOptions().bucket_cap_mb(0.0005));
}

TEST_F(DataParallel, ResNet18SmallImageMatchesSequentialShards) {
  auto make = [] {
    auto net = models::resnet18(
        models::ResNetOptions().num_classes(10).in_channels(3).small_image_stem(true));
    net->to(DType::kFloat64);
    return std::static_pointer_cast<nn::Module>(net);
  };
  // In f64: batch norm over 2 images of 8x8 (layer4 sees 2 values per channel and shard) is so
  // ill-conditioned that in f32 the rounding of the 4-way gradient sum (1e-7, summed in another
  // order than the reference's) grows past 1e-2 in 3 steps; in f64 it stays near 1e-7.
  expect_matches_sequential_shards(make, classification_loss({2, 3, 8, 8}, 10, DType::kFloat64),
                                   DDPOptions().bucket_cap_mb(8), 0.05);
}

TEST_F(DataParallel, BertTinyMatchesSequentialShards) {
  const int64_t vocab = 50, batch = 2, length = 8;
  auto config =
      models::BertConfig::tiny().vocab_size(vocab).max_position_embeddings(16).dropout(0.0);
  auto make = [config] {
    return std::static_pointer_cast<nn::Module>(
        std::make_shared<models::BertForPreTraining>(config));
  };
  // Masked positions vary per shard: the MLM loss is divided by the global count of masked
  // tokens (the NSP loss by the global batch), times the shard count.
  auto batch_of = [=](int step, int shard) {
    seed_data(step, shard);
    Tensor ids = randint(0, vocab, {batch, length});
    Tensor types = cat(
        {zeros({batch, length / 2}, DType::kInt64), ones({batch, length / 2}, DType::kInt64)}, 1);
    Tensor masked = lt(rand({batch, length}), full({batch, length}, 0.3));
    Tensor labels = where(masked, randint(0, vocab, {batch, length}),
                          full({batch, length}, -100.0, DType::kInt64));
    Tensor next = randint(0, 2, {batch});
    return std::vector<Tensor>{ids, types, labels, next};
  };
  auto loss = [=](nn::Module& model, DistributedDataParallel* ddp, int step, int shard,
                  int shards) {
    double global_masked = 0;
    for (int s = 0; s < shards; ++s) {
      global_masked += ne(batch_of(step, s)[2], full({batch, length}, -100.0, DType::kInt64))
                           .to(DType::kFloat64)
                           .sum()
                           .item<double>();
    }
    auto inputs = batch_of(step, shard);
    auto& bert = static_cast<models::BertForPreTraining&>(model);
    if (ddp != nullptr) ddp->prepare_forward();
    models::BertPreTrainingOutput out = bert.forward(inputs[0], inputs[1]);
    if (ddp != nullptr) ddp->prepare_for_backward({out.mlm_logits, out.nsp_logits});
    Tensor mlm = cross_entropy(out.mlm_logits.reshape({batch * length, vocab}),
                               inputs[2].reshape({batch * length}), -100, 0.0, "sum");
    Tensor nsp = cross_entropy(out.nsp_logits, inputs[3], -100, 0.0, "sum");
    return mlm * (shards / global_masked) + nsp * (shards / double(batch * shards));
  };
  expect_matches_sequential_shards(make, loss, DDPOptions().bucket_cap_mb(0.25));
}

// ---- Buckets ----

TEST_F(DataParallel, BucketsFollowReverseRegistrationOrderAndRespectTheCaps) {
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(16, 32), std::make_shared<nn::Linear>(32, 32),
      std::make_shared<nn::Linear>(32, 8)});
  // Gradients in backward order: 2.bias (32 B), 2.weight (1024 B), 1.bias (128 B),
  // 1.weight (4096 B), 0.bias (128 B), 0.weight (2048 B).
  const double first_cap = 1100, cap = 4300;
  DistributedDataParallel ddp(
      model, shared_world(),
      DDPOptions().first_bucket_mb(first_cap / (1 << 20)).bucket_cap_mb(cap / (1 << 20)));
  const auto& buckets = ddp.buckets();
  std::vector<std::vector<std::string>> names;
  for (const auto& bucket : buckets) names.push_back(bucket.names);
  EXPECT_EQ(names, (std::vector<std::vector<std::string>>{
                       {"2.bias", "2.weight"}, {"1.bias", "1.weight"}, {"0.bias", "0.weight"}}));
  EXPECT_EQ(buckets[0].capacity, static_cast<int64_t>(first_cap));
  EXPECT_EQ(buckets[1].capacity, static_cast<int64_t>(cap));
  std::vector<bool> seen(model->parameters().size(), false);
  for (const auto& bucket : buckets) {
    EXPECT_LE(bucket.bytes, bucket.capacity);
    EXPECT_EQ(bucket.dtype, DType::kFloat32);
    for (size_t index : bucket.parameters) {
      EXPECT_FALSE(seen[index]);
      seen[index] = true;
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), static_cast<long>(seen.size()));

  // A parameter larger than the cap gets a bucket of its own; defaults give one bucket here.
  DistributedDataParallel tiny_caps(model, shared_world(),
                                    DDPOptions().first_bucket_mb(1e-5).bucket_cap_mb(1e-5));
  EXPECT_EQ(tiny_caps.buckets().size(), model->parameters().size());
  DistributedDataParallel defaults(model, shared_world());
  EXPECT_EQ(defaults.buckets().size(), 1u);
}

TEST_F(DataParallel, BadOptionsAreClearErrors) {
  auto model = make_mlp();
  EXPECT_TRUE(throws_error(
      [&] { DistributedDataParallel ddp(model, shared_world(), DDPOptions().bucket_cap_mb(0)); },
      "bucket_cap_mb must be positive"));
  EXPECT_TRUE(
      throws_error([&] { DistributedDataParallel ddp(model, nullptr); }, "process_group is null"));
}

// ---- Unused parameters ----

// Two heads; `head` picks the one forward uses, and the "spare" layer is never used.
class TwoHeads : public nn::Module {
 public:
  TwoHeads() : nn::Module("TwoHeads") {
    trunk = register_module("trunk", std::make_shared<nn::Linear>(4, 8));
    left = register_module("left", std::make_shared<nn::Linear>(8, 3));
    right = register_module("right", std::make_shared<nn::Linear>(8, 3));
    spare = register_module("spare", std::make_shared<nn::Linear>(8, 3));
  }
  Tensor forward(const Tensor& x) override {
    Tensor hidden = relu(trunk->forward(x));
    return use_right ? right->forward(hidden) : left->forward(hidden);
  }
  bool use_right = false;
  std::shared_ptr<nn::Linear> trunk, left, right, spare;
};

TEST_F(DataParallel, UnusedParametersCountAsZeroWithFindUnusedParameters) {
  // Shard 0 uses the right head, the others the left one; nobody uses the spare layer.
  auto loss = [](nn::Module& model, DistributedDataParallel* ddp, int step, int shard, int shards) {
    static_cast<TwoHeads&>(model).use_right = shard == 0;
    return classification_loss({4, 4}, 3)(model, ddp, step, shard, shards);
  };
  auto make = [] { return std::static_pointer_cast<nn::Module>(std::make_shared<TwoHeads>()); };
  expect_matches_sequential_shards(make, loss,
                                   DDPOptions().find_unused_parameters(true).bucket_cap_mb(1e-4));

  // The spare layer, unused everywhere, keeps no gradient; the heads get the group average.
  manual_seed(5);
  auto model = std::make_shared<TwoHeads>();
  DistributedDataParallel ddp(model, shared_world(), DDPOptions().find_unused_parameters(true));
  loss(*model, &ddp, 0, rank(), size()).backward();
  EXPECT_FALSE(model->spare->weight.grad().defined());
  EXPECT_TRUE(model->right->weight.grad().defined());
  EXPECT_TRUE(model->left->weight.grad().defined());
}

TEST_F(DataParallel, AnUnusedParameterWithoutFindUnusedParametersIsAClearError) {
  // The reduction finishes at the end of backward, so backward itself reports the parameters.
  manual_seed(6);
  auto model = std::make_shared<TwoHeads>();
  DistributedDataParallel ddp(model, shared_world());
  auto loss = classification_loss({4, 4}, 3);
  EXPECT_TRUE(throws_error([&] { loss(*model, &ddp, 0, rank(), size()).backward(); },
                           "backward ended before this step's gradient reduction finished; these "
                           "parameters received no gradient: right.weight, right.bias, "
                           "spare.weight, spare.bias"));
  EXPECT_TRUE(throws_error([&] { ddp.forward(randn({4, 4})); }, "find_unused_parameters(true)"));
}

TEST_F(DataParallel, GradientsAreTheAverageOverTheShardsWhenBackwardReturns) {
  // No finalize(): the end-of-backward callback has waited for every bucket already.
  manual_seed(9);
  std::shared_ptr<nn::Module> model = make_mlp();
  std::shared_ptr<nn::Module> reference = make_mlp();
  reference->load_state_dict(model->state_dict());  // the same start on every rank
  DistributedDataParallel ddp(model, shared_world(), DDPOptions().bucket_cap_mb(1e-3));
  auto loss = classification_loss({5, 6}, 3);
  loss(*model, &ddp, 0, rank(), size()).backward();
  // One process: every shard's gradient in turn, then their mean.
  for (int shard = 0; shard < size(); ++shard)
    loss(*reference, nullptr, 0, shard, size()).backward();
  const auto expected = reference->named_parameters();
  const auto actual = model->named_parameters();
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_TRUE(actual[i].second.grad().defined()) << actual[i].first;
    const Tensor mean = expected[i].second.grad() * (1.0 / size());
    EXPECT_TRUE(all_close(actual[i].second.grad(), mean, 1e-5, 1e-7)) << actual[i].first;
  }
  ddp.finalize();  // free after the callback
}

TEST_F(DataParallel, ParametersFrozenAfterConstructionKeepTheirValues) {
  manual_seed(8);
  auto model = make_mlp();
  DistributedDataParallel ddp(model, shared_world());
  Tensor frozen = model->parameters()[0];
  frozen.set_requires_grad(false);
  Tensor before = frozen.detach().clone();
  optim::SGD sgd(model->parameters(), optim::SGDOptions(0.1));
  auto loss = classification_loss({4, 6}, 3);
  for (int step = 0; step < 2; ++step) {
    sgd.zero_grad();
    loss(*model, &ddp, step, rank(), size()).backward();
    ddp.finalize();
    sgd.step();
  }
  EXPECT_TRUE(tessel::testing::bitwise_equal(frozen, before));
  EXPECT_FALSE(frozen.grad().defined());
  EXPECT_TRUE(model->parameters()[1].grad().defined());
}

TEST_F(DataParallel, ModulesThatDifferBetweenRanksAreRejectedOnEveryRank) {
  auto model = rank() == size() - 1 ? std::make_shared<nn::Linear>(3, 5)
                                    : std::make_shared<nn::Linear>(3, 4);
  EXPECT_TRUE(throws_error([&] { DistributedDataParallel ddp(model, shared_world()); },
                           "the module differs between ranks"));
}

// A communicator that claims to move GPU tensors (NCCL's place), over MPI.
class ClaimsGpuCommunicator : public MpiCommunicator {
 public:
  explicit ClaimsGpuCommunicator(MPI_Comm comm) : MpiCommunicator(comm) {}
  Device device() const override { return Device::cuda(0); }
};

TEST_F(DataParallel, AModuleOnAnotherDeviceThanTheCommunicatorIsRejectedBeforeAnyCollective) {
  auto model = std::make_shared<nn::Linear>(3, 4);
  auto gpu_group = std::make_shared<ClaimsGpuCommunicator>(MPI_COMM_WORLD);
  EXPECT_TRUE(throws_error([&] { DistributedDataParallel ddp(model, gpu_group); },
                           "parameter weight is on cpu but communicator 'world' moves tensors on "
                           "cuda:0"));
  // Nothing was sent: the communicator still works.
  Tensor tensor = ones({2});
  gpu_group->all_reduce(tensor);
  EXPECT_EQ(tensor.to_vector<float>(), std::vector<float>(2, size()));
}

TEST_F(DataParallel, ConstructionCopiesRankZerosParametersAndBuffers) {
  manual_seed(50 + rank());
  auto model = make_conv_net();
  {
    NoGradGuard no_grad;
    for (auto& buffer : model->buffers()) {
      if (buffer.dtype() == DType::kFloat32) buffer.fill_(rank() + 1.0);
    }
  }
  DistributedDataParallel ddp(model, shared_world());
  for (auto& [name, tensor] : model->state_dict()) {
    Tensor rank0 = tensor.clone();
    shared_world()->broadcast(rank0, 0);
    EXPECT_TRUE(tessel::testing::bitwise_equal(tensor, rank0)) << name;
  }
  EXPECT_EQ(model->buffers()[0].to_vector<float>()[0], 1.0f);
}

// Batch norm statistics of different rows on each rank (broadcast_buffers off), then
// sync_buffers: the running statistics become the ranks' mean, num_batches_tracked rank 0's; with
// from_rank0 every buffer becomes rank 0's.
TEST_F(DataParallel, SyncBuffersAveragesRunningStatisticsOverTheRanks) {
  manual_seed(60);
  auto model = make_conv_net();
  DistributedDataParallel ddp(model, shared_world(), DDPOptions().broadcast_buffers(false));
  manual_seed(61 + rank());
  {
    NoGradGuard no_grad;
    for (int step = 0; step <= rank(); ++step) ddp.forward(randn({4, 3, 8, 8}));
  }
  std::map<std::string, Tensor> mean_before, rank0_before;
  for (const auto& [name, buffer] : model->named_buffers()) {
    rank0_before[name] = buffer.clone();
    shared_world()->broadcast(rank0_before[name], 0);
    if (!is_floating(buffer.dtype())) continue;
    mean_before[name] = buffer.clone();
    shared_world()->all_reduce(mean_before[name], ReduceOp::kMean);
  }
  ASSERT_FALSE(mean_before.empty());
  if (size() > 1) {  // the ranks saw different rows: their statistics differ from the mean
    const auto buffers = model->named_buffers();
    const auto& [name, first] = buffers[0];
    EXPECT_FALSE(all_close(first, mean_before.at(name), 0, 0)) << name;
  }

  ddp.sync_buffers();
  for (const auto& [name, buffer] : model->named_buffers()) {
    const Tensor& expected =
        is_floating(buffer.dtype()) ? mean_before.at(name) : rank0_before.at(name);
    EXPECT_TRUE(tessel::testing::bitwise_equal(buffer, expected)) << name;
  }

  {
    NoGradGuard no_grad;
    manual_seed(70 + rank());
    ddp.forward(randn({4, 3, 8, 8}));
  }
  ddp.sync_buffers(/*from_rank0=*/true);
  for (const auto& [name, buffer] : model->named_buffers()) {
    Tensor rank0 = buffer.clone();
    shared_world()->broadcast(rank0, 0);
    EXPECT_TRUE(tessel::testing::bitwise_equal(buffer, rank0)) << name;
  }
}

}  // namespace
}  // namespace tessel::parallel
