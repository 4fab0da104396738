// DistributedDataParallel over the NCCL communicator that linking //parallel:nccl registers
// (make_device_communicator), on one rank and one GPU (tagged gpu): with one rank the all-reduced
// mean is the gradient itself, so DDP's steps give the parameters plain training gives. Skips
// when no GPU is visible.
#include <mpi.h>

#include <memory>
#include <vector>

#include "core/device.h"
#include "core/rng.h"
#include "cuda/runtime.h"
#include "gtest/gtest.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/sgd.h"
#include "parallel/communicator.h"
#include "parallel/ddp.h"
#include "tests/gpu_skip.h"
#include "tests/parallel/one_rank_mpi.h"
#include "tests/testing.h"

namespace tessel::parallel {
namespace {

using tessel::testing::all_close;
using tessel::testing::throws_error;

const auto* const kMpi = ::testing::AddGlobalTestEnvironment(new OneRankMpiEnvironment);

// Convolutions with batch norm (buffers DDP broadcasts) and a classifier, on `device`.
std::shared_ptr<nn::Module> make_conv_net(Device device) {
  manual_seed(11);
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions(3, 4, 3).padding(1)),
      std::make_shared<nn::BatchNorm2d>(nn::BatchNormOptions(4)), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Conv2d>(nn::Conv2dOptions(4, 6, 3).stride(2).padding(1)),
      std::make_shared<nn::BatchNorm2d>(nn::BatchNormOptions(6)), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::AdaptiveAvgPool2d>(nn::IntPair(1, 1)), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(6, 5)});
  net->to(device);
  return net;
}

TEST(NcclDataParallel, LinkingParallelNcclRegistersTheCudaBackend) {
  EXPECT_TRUE(has_device_communicator_backend(DeviceType::kCuda));
  EXPECT_EQ(communicator_device_count(DeviceType::kCuda), cuda::device_count());
}

// Three SGD steps (momentum) through DDP over NCCL against the same steps without DDP. Small
// buckets, so several all-reduces are in flight in each backward; with find_unused_parameters
// the used-parameter flags go over NCCL too.
TEST(NcclDataParallel, OneRankDdpOverNcclTrainsLikePlainTraining) {
  TESSEL_SKIP_IF_NO_GPU();
  const Device gpu = Device::cuda(0);
  auto group = make_device_communicator(MPI_COMM_WORLD, gpu, CommOptions().name("dp"));
  ASSERT_EQ(group->device(), gpu);
  ASSERT_EQ(group->size(), 1);

  for (bool find_unused : {false, true}) {
    SCOPED_TRACE(find_unused ? "find_unused_parameters" : "default options");
    auto plain = make_conv_net(gpu);
    auto wrapped = make_conv_net(gpu);
    DistributedDataParallel ddp(
        wrapped, group,
        DDPOptions().bucket_cap_mb(0.0005).first_bucket_mb(0.0002).find_unused_parameters(
            find_unused));
    EXPECT_GT(ddp.buckets().size(), 1u);
    optim::SGD plain_sgd(plain->parameters(), optim::SGDOptions(0.1).momentum(0.9));
    optim::SGD ddp_sgd(wrapped->parameters(), optim::SGDOptions(0.1).momentum(0.9));
    manual_seed(5);
    for (int step = 0; step < 3; ++step) {
      const Tensor inputs = randn({4, 3, 8, 8}).to(gpu);
      const Tensor targets = from_vector<int64_t>({0, 1, 2, 4}, {4}).to(gpu);

      const Tensor plain_loss = cross_entropy(plain->forward(inputs), targets);
      plain_sgd.zero_grad();
      plain_loss.backward();
      plain_sgd.step();

      const Tensor ddp_loss = cross_entropy(ddp.forward(inputs), targets);
      ddp_sgd.zero_grad();
      ddp_loss.backward();
      ddp.finalize();
      ddp_sgd.step();
      EXPECT_NEAR(ddp_loss.item<double>(), plain_loss.item<double>(),
                  1e-5 * std::abs(plain_loss.item<double>()))
          << "step " << step;
    }
    const auto expected = plain->state_dict();
    const auto actual = wrapped->state_dict();
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(actual[i].second.device(), gpu) << actual[i].first;
      EXPECT_TRUE(
          all_close(actual[i].second.to(Device::cpu()), expected[i].second.to(Device::cpu())))
          << expected[i].first;
    }
  }
}

TEST(NcclDataParallel, AModuleLeftOnTheCpuIsAClearError) {
  TESSEL_SKIP_IF_NO_GPU();
  auto group = make_device_communicator(MPI_COMM_WORLD, Device::cuda(0), CommOptions().name("dp"));
  auto on_cpu = make_conv_net(Device::cpu());
  EXPECT_TRUE(throws_error([&] { DistributedDataParallel ddp(on_cpu, group); },
                           "is on cpu but communicator 'dp' moves tensors on cuda:0"));
}

}  // namespace
}  // namespace tessel::parallel
