// Collectives of MpiCommunicator against hand-computed results, in every dtype, contiguous and
// strided, with row counts the rank count does not divide; process groups on a dp x tp grid;
// groups over part of the ranks made of point-to-point messages (SubgroupCommunicator); launch
// helpers; bad arguments. Run with 2 and 4 ranks (tests/parallel/BUILD).
#include <algorithm>
#include <functional>
#include <thread>
#include <vector>

#include "core/threading.h"
#include "ops/ops.h"
#include "parallel/communicator.h"
#include "parallel/launch.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_group.h"
#include "parallel/subgroup_communicator.h"
#include "tests/parallel/mpi_testing.h"
#include "tests/testing.h"

namespace tessel::parallel {
namespace {

using tessel::testing::throws_error;
using testing::MpiTest;

const std::vector<DType> kAllDTypes = {DType::kFloat32, DType::kFloat64, DType::kBFloat16,
                                       DType::kFloat16, DType::kInt32,   DType::kInt64,
                                       DType::kUInt8,   DType::kBool};
const std::vector<DType> kFloatDTypes = {DType::kFloat32, DType::kFloat64, DType::kBFloat16,
                                         DType::kFloat16};

// Small integers, exact in every dtype (u8 and bf16 included) and in their sums over 4 ranks.
double value_of(int rank, int64_t index, DType dtype) {
  if (dtype == DType::kBool) return (index + rank) % 3 == 0 ? 1 : 0;
  return (rank + 1) * (index % 7 + 1);
}

std::vector<double> values_of(int rank, int64_t count, DType dtype, int64_t first_index = 0) {
  std::vector<double> values(count);
  for (int64_t i = 0; i < count; ++i) values[i] = value_of(rank, first_index + i, dtype);
  return values;
}

Tensor rank_tensor(int rank, const Shape& sizes, DType dtype, int64_t first_index = 0) {
  return from_vector<double>(values_of(rank, shape_numel(sizes), dtype, first_index), sizes, dtype);
}

// op over every rank's value_of, as the communicator defines it (bool: sum and max are "or").
std::vector<double> reduced(int64_t count, int ranks, DType dtype, ReduceOp op,
                            int64_t first_index = 0) {
  std::vector<double> result(count);
  for (int64_t i = 0; i < count; ++i) {
    double sum = 0, high = -1e300, low = 1e300;
    for (int r = 0; r < ranks; ++r) {
      double v = value_of(r, first_index + i, dtype);
      sum += v;
      high = std::max(high, v);
      low = std::min(low, v);
    }
    switch (op) {
      case ReduceOp::kSum:
        result[i] = dtype == DType::kBool ? high : sum;
        break;
      case ReduceOp::kMean:
        result[i] = sum / ranks;
        break;
      case ReduceOp::kMax:
        result[i] = high;
        break;
      case ReduceOp::kMin:
        result[i] = low;
        break;
    }
  }
  return result;
}

std::string label(DType dtype, ReduceOp op, int64_t count) {
  return std::string(dtype_name(dtype)) + " " + reduce_op_name(op) + " of " +
         std::to_string(count) + " elements";
}

class Collectives : public MpiTest {};

TEST(PartLayout, SplitsRowsLikeTensorSplit) {
  // torch.tensor_split(range(5), 2) -> sizes 3, 2; range(2) over 4 -> 1, 1, 0, 0.
  EXPECT_EQ(part_rows(5, 2, 0), 3);
  EXPECT_EQ(part_rows(5, 2, 1), 2);
  EXPECT_EQ(part_start(5, 2, 1), 3);
  EXPECT_EQ(part_rows(2, 4, 1), 1);
  EXPECT_EQ(part_rows(2, 4, 2), 0);
  EXPECT_EQ(part_start(2, 4, 3), 2);
  for (int64_t rows : {0, 1, 7, 12, 13}) {
    for (int parts : {1, 2, 3, 4}) {
      int64_t total = 0;
      for (int p = 0; p < parts; ++p) {
        EXPECT_EQ(part_start(rows, parts, p), total);
        total += part_rows(rows, parts, p);
      }
      EXPECT_EQ(total, rows);
    }
  }
  EXPECT_TRUE(throws_error([] { part_rows(4, 0, 0); }, "at least one part"));
}

TEST_F(Collectives, AllReduceSumMaxMinMatchHandComputedValuesInEveryDType) {
  for (DType dtype : kAllDTypes) {
    for (int64_t count : {1, 7, 1001}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        Tensor tensor = rank_tensor(rank(), {count}, dtype);
        world().all_reduce(tensor, op);
        EXPECT_EQ(tensor.dtype(), dtype);
        EXPECT_EQ(tensor.to_vector<double>(), reduced(count, size(), dtype, op))
            << label(dtype, op, count);
      }
    }
  }
}

TEST_F(Collectives, AllReduceMeanDividesBySizeInFloatingDTypes) {
  for (DType dtype : kFloatDTypes) {
    Tensor tensor = rank_tensor(rank(), {3, 5}, dtype);
    world().all_reduce(tensor, ReduceOp::kMean);
    EXPECT_EQ(tensor.to_vector<double>(), reduced(15, size(), dtype, ReduceOp::kMean))
        << dtype_name(dtype);
  }
}

TEST_F(Collectives, AllReduceOfAScalarAndOfAnEmptyTensor) {
  Tensor scalar = scalar_tensor(rank() + 1.0, DType::kFloat64);
  world().all_reduce(scalar);
  EXPECT_EQ(scalar.item<double>(), size() * (size() + 1) / 2.0);
  Tensor nothing = empty({0, 3});
  world().all_reduce(nothing);
  EXPECT_EQ(nothing.numel(), 0);
}

TEST_F(Collectives, AllReduceOfAStridedViewWritesOnlyTheView) {
  for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBFloat16}) {
    Tensor base = full({6, 8}, -1.0, dtype);
    // (4, 6) view with strides (2, 8): every other column, transposed.
    Tensor view = base.slice(1, 0, 8, 2).t();
    ASSERT_FALSE(view.is_contiguous());
    view.copy_(rank_tensor(rank(), {4, 6}, dtype));
    world().all_reduce(view, ReduceOp::kSum);
    EXPECT_EQ(view.contiguous().to_vector<double>(), reduced(24, size(), dtype, ReduceOp::kSum))
        << dtype_name(dtype);
    std::vector<double> odd_columns = base.slice(1, 1, 8, 2).contiguous().to_vector<double>();
    EXPECT_TRUE(std::all_of(odd_columns.begin(), odd_columns.end(), [](double v) {
      return v == -1.0;
    })) << "elements outside the view changed";
  }
}

TEST_F(Collectives, AsyncAllReducesCanOverlapAndFinishInAnyOrder) {
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int64_t count : {10, 100000, 3}) {
    tensors.push_back(rank_tensor(rank(), {count}, DType::kFloat32));
    works.push_back(world().all_reduce_async(tensors.back(), ReduceOp::kSum));
  }
  works[2]->wait();
  works[0]->wait();
  works[1]->wait();
  works[1]->wait();  // waiting twice is harmless
  EXPECT_TRUE(works[0]->poll());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(tensors[i].to_vector<double>(),
              reduced(tensors[i].numel(), size(), DType::kFloat32, ReduceOp::kSum));
  }
}

TEST_F(Collectives, ReduceScatterGivesEachRankItsRowsOfTheSum) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kInt64,
                      DType::kUInt8, DType::kBool}) {
    // Row counts divisible by the rank count, not divisible, and smaller than it.
    for (int64_t rows : {int64_t{size()} * 3, int64_t{5}, int64_t{1}}) {
      const int64_t width = 3;
      Tensor input = rank_tensor(rank(), {rows, width}, dtype);
      int64_t my_rows = part_rows(rows, size(), rank());
      Tensor output = full({my_rows, width}, 0.0, dtype);
      world().reduce_scatter(input, output, ReduceOp::kSum);
      int64_t first = part_start(rows, size(), rank()) * width;
      EXPECT_EQ(output.to_vector<double>(),
                reduced(my_rows * width, size(), dtype, ReduceOp::kSum, first))
          << dtype_name(dtype) << " rows " << rows;
    }
  }
}

TEST_F(Collectives, ReduceScatterMeanIntoAStridedOutput) {
  const int64_t rows = 7, width = 4;
  Tensor input = rank_tensor(rank(), {rows, width}, DType::kFloat64).t().contiguous().t();
  ASSERT_FALSE(input.is_contiguous());
  int64_t my_rows = part_rows(rows, size(), rank());
  Tensor storage = zeros({width, my_rows}, DType::kFloat64);
  Tensor output = storage.t();  // (my_rows, width), column-major
  world().reduce_scatter(input, output, ReduceOp::kMean);
  int64_t first = part_start(rows, size(), rank()) * width;
  EXPECT_EQ(output.contiguous().to_vector<double>(),
            reduced(my_rows * width, size(), DType::kFloat64, ReduceOp::kMean, first));
}

TEST_F(Collectives, AllGatherConcatenatesThePartsInRankOrder) {
  for (DType dtype : kAllDTypes) {
    for (int64_t rows : {int64_t{size()} * 2, int64_t{7}, int64_t{2}}) {
      const int64_t width = 2;
      int64_t my_rows = part_rows(rows, size(), rank());
      int64_t first = part_start(rows, size(), rank()) * width;
      Tensor input = rank_tensor(rank(), {my_rows, width}, dtype, first);
      Tensor output = full({rows, width}, 0.0, dtype);
      world().all_gather(input, output);
      std::vector<double> expected;
      for (int r = 0; r < size(); ++r) {
        auto part = values_of(r, part_rows(rows, size(), r) * width, dtype,
                              part_start(rows, size(), r) * width);
        expected.insert(expected.end(), part.begin(), part.end());
      }
      EXPECT_EQ(output.to_vector<double>(), expected) << dtype_name(dtype) << " rows " << rows;
    }
  }
}

TEST_F(Collectives, AllGatherFromAndIntoStridedTensors) {
  const int64_t rows = 5, width = 3;
  int64_t my_rows = part_rows(rows, size(), rank());
  Tensor input = full({width, my_rows}, static_cast<double>(rank()), DType::kInt32).t();
  Tensor output = zeros({width, rows}, DType::kInt32).t();
  world().all_gather(input, output);
  std::vector<double> expected;
  for (int r = 0; r < size(); ++r) {
    for (int64_t i = 0; i < part_rows(rows, size(), r) * width; ++i) expected.push_back(r);
  }
  EXPECT_EQ(output.contiguous().to_vector<double>(), expected);
}

TEST_F(Collectives, BroadcastFromTheLastRankInEveryDType) {
  int root = size() - 1;
  for (DType dtype : kAllDTypes) {
    Tensor tensor = rank_tensor(rank(), {4, 3}, dtype);
    world().broadcast(tensor, root);
    EXPECT_EQ(tensor.to_vector<double>(), values_of(root, 12, dtype)) << dtype_name(dtype);
  }
  Tensor base = zeros({3, 4}, DType::kFloat32);
  Tensor view = base.t();
  view.copy_(rank_tensor(rank(), {4, 3}, DType::kFloat32));
  world().broadcast(view, root);
  EXPECT_EQ(view.contiguous().to_vector<double>(), values_of(root, 12, DType::kFloat32));
}

TEST_F(Collectives, SendAndRecvAroundARing) {
  int next = (rank() + 1) % size();
  int previous = (rank() + size() - 1) % size();
  for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBFloat16, DType::kBool}) {
    // 100000 elements go by rendezvous rather than eagerly: the even/odd order avoids a cycle.
    for (int64_t count : {5, 100000}) {
      Tensor outgoing = rank_tensor(rank(), {count}, dtype);
      Tensor incoming = zeros({count}, dtype);
      if (rank() % 2 == 0) {
        world().send(outgoing, next, 7);
        world().recv(incoming, previous, 7);
      } else {
        world().recv(incoming, previous, 7);
        world().send(outgoing, next, 7);
      }
      EXPECT_EQ(incoming.to_vector<double>(), values_of(previous, count, dtype))
          << dtype_name(dtype) << " count " << count;
    }
  }
}

TEST_F(Collectives, RecvIntoATensorOfTheWrongSizeIsAClearError) {
  if (rank() == 0) {
    world().send(arange(0, 5, 1, DType::kFloat32), 1, 3);
    world().send(arange(0, 5, 1, DType::kFloat32), 1, 4);
  } else if (rank() == 1) {
    Tensor small = zeros({3});
    EXPECT_TRUE(throws_error([&] { world().recv(small, 0, 3); }, "larger than the tensor"));
    Tensor large = zeros({7});
    EXPECT_TRUE(throws_error([&] { world().recv(large, 0, 4); }, "the message holds 5"));
  }
  Tensor check = ones({2});
  world().all_reduce(check);  // still usable
  EXPECT_EQ(check.to_vector<double>(), std::vector<double>(2, size()));
}

TEST_F(Collectives, BarriersKeepTheRanksInStep) {
  for (int round = 0; round < 5; ++round) {
    // Uneven work before the barrier.
    if (rank() == round % size()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    world().barrier();
    Tensor tensor = full({1}, static_cast<double>(round), DType::kInt64);
    world().all_reduce(tensor, ReduceOp::kMax);
    EXPECT_EQ(tensor.item<int64_t>(), round);
  }
}

// A collective whose handle is dropped unfinished (an error path, a prefetch nobody reads): the
// other ranks' arrival messages and the collective's data still come to rank 0 later, into memory
// the dropped handle leaves alive, and the communicator goes on with the next collectives.
TEST_F(Collectives, ACollectiveDroppedUnfinishedLeavesTheCommunicatorUsable) {
  auto group = MpiCommunicator::world(CommOptions().name("dropped"));
  for (int round = 0; round < 3; ++round) {
    Tensor dropped = full({1000}, 1.0, DType::kFloat32);
    // Rank 0 drops its handle before the others have even started theirs.
    if (rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    group->all_reduce_async(dropped, ReduceOp::kSum).reset();
    Tensor checked = full({4}, static_cast<double>(rank() + round), DType::kInt64);
    group->all_reduce(checked, ReduceOp::kSum);
    const int64_t expected = size() * (size() - 1) / 2 + size() * round;
    EXPECT_EQ(checked.to_vector<int64_t>(), std::vector<int64_t>(4, expected)) << "round " << round;
    group->barrier();
  }
}

TEST_F(Collectives, BadArgumentsAreClearErrorsAndLeaveTheCommunicatorUsable) {
  int rows = 2 * size() + 1;
  Tensor part = zeros({part_rows(rows, size(), rank()), 3});
  // One row more for every rank, so every rank sees the mismatch.
  EXPECT_TRUE(throws_error(
      [&] {
        world().all_gather(part, zeros({rows + size(), 3}));
      },
      "all_gather: input has shape"));
  EXPECT_TRUE(throws_error(
      [&] {
        world().all_gather(part, zeros({rows, 4}));
      },
      "all_gather: input has shape"));
  EXPECT_TRUE(throws_error(
      [&] {
        world().all_gather(part, zeros({rows, 3}, DType::kFloat64));
      },
      "all_gather: input is f32 but output is f64"));
  EXPECT_TRUE(throws_error([&] { world().all_gather(scalar_tensor(1), scalar_tensor(1)); },
                           "at least one dimension"));
  EXPECT_TRUE(throws_error(
      [&] {
        world().reduce_scatter(zeros({rows, 3}), zeros({rows, 3}));
      },
      "reduce_scatter: output has shape"));
  EXPECT_TRUE(throws_error([&] { world().all_reduce(ones({3}, DType::kInt32), ReduceOp::kMean); },
                           "op mean needs a floating-point tensor, got i32"));
  EXPECT_TRUE(throws_error([&] { world().all_reduce(ones({1}).expand({4})); }, "expanded view"));
  EXPECT_TRUE(throws_error([&] { world().all_reduce(Tensor()); }, "undefined tensor"));
  EXPECT_TRUE(throws_error([&] { world().all_reduce(empty({2}, Device::meta())); },
                           "MpiCommunicator moves CPU tensors"));
  EXPECT_TRUE(throws_error([&] { world().broadcast(ones({2}), size()); },
                           "broadcast: root " + std::to_string(size()) + " is out of range"));
  EXPECT_TRUE(throws_error([&] { world().send(ones({2}), rank(), 0); }, "cannot send to itself"));
  EXPECT_TRUE(throws_error([&] { world().send(ones({2}), (rank() + 1) % size(), 40000); },
                           "tag 40000 is outside"));
  EXPECT_TRUE(throws_error([&] { world().recv(ones({2}), -1, 0); }, "source -1 is out of range"));

  Tensor check = full({3}, 2.0);
  world().all_reduce(check);
  EXPECT_EQ(check.to_vector<double>(), std::vector<double>(3, 2.0 * size()));
}

// ---- Process groups ----

TEST_F(Collectives, GridOfTwoByTwoReducesOverTheRightRanks) {
  if (size() != 4) GTEST_SKIP() << "needs 4 ranks";
  ProcessGrid grid(2, 2, CommOptions().timeout_s(world().timeout_s()));
  EXPECT_EQ(grid.dp_index(), rank() / 2);
  EXPECT_EQ(grid.tp_index(), rank() % 2);
  EXPECT_EQ(grid.data_parallel()->size(), 2);
  EXPECT_EQ(grid.tensor_parallel()->size(), 2);
  EXPECT_EQ(grid.data_parallel()->rank(), grid.dp_index());
  EXPECT_EQ(grid.tensor_parallel()->rank(), grid.tp_index());
  EXPECT_EQ(grid.data_parallel()->name(), "dp");
  EXPECT_EQ(grid.world()->size(), 4);

  // dp group: ranks with the same tp index, {t, 2 + t}; tp group: {2d, 2d + 1}.
  Tensor over_dp = full({3}, static_cast<double>(rank()), DType::kInt64);
  grid.data_parallel()->all_reduce(over_dp);
  EXPECT_EQ(over_dp.to_vector<double>(), std::vector<double>(3, 2 * grid.tp_index() + 2));
  Tensor over_tp = full({2}, static_cast<double>(rank()), DType::kFloat32);
  grid.tensor_parallel()->all_reduce(over_tp, ReduceOp::kMax);
  EXPECT_EQ(over_tp.to_vector<double>(), std::vector<double>(2, 2 * grid.dp_index() + 1));

  // all_gather in the tp group collects the two ranks of this dp row.
  Tensor gathered = zeros({3}, DType::kInt32);
  Tensor mine =
      full({part_rows(3, 2, grid.tp_index())}, static_cast<double>(rank()), DType::kInt32);
  grid.tensor_parallel()->all_gather(mine, gathered);
  double row = 2 * grid.dp_index();
  EXPECT_EQ(gathered.to_vector<double>(), (std::vector<double>{row, row, row + 1}));

  // reduce_scatter in the dp group with 3 rows over 2 ranks.
  Tensor input = full({3, 2}, static_cast<double>(rank()), DType::kFloat64);
  Tensor output = zeros({part_rows(3, 2, grid.dp_index()), 2}, DType::kFloat64);
  grid.data_parallel()->reduce_scatter(input, output);
  EXPECT_EQ(output.to_vector<double>(),
            std::vector<double>(output.numel(), 2.0 * grid.tp_index() + 2));

  // broadcast from the group's rank 1 (world rank 2 + t in the dp group).
  Tensor value = full({1}, static_cast<double>(rank()), DType::kBFloat16);
  grid.data_parallel()->broadcast(value, 1);
  EXPECT_EQ(value.item<double>(), 2 + grid.tp_index());
  grid.tensor_parallel()->barrier();
}

TEST_F(Collectives, OneDimensionalGridsAreTheWorldAndSingletons) {
  ProcessGrid data_only(size(), 1);
  EXPECT_EQ(data_only.data_parallel()->size(), size());
  EXPECT_EQ(data_only.tensor_parallel()->size(), 1);
  Tensor tensor = ones({2});
  data_only.tensor_parallel()->all_reduce(tensor);
  EXPECT_EQ(tensor.to_vector<double>(), std::vector<double>(2, 1.0));
  data_only.data_parallel()->all_reduce(tensor);
  EXPECT_EQ(tensor.to_vector<double>(), std::vector<double>(2, size()));

  ProcessGrid tensor_only(1, size());
  EXPECT_EQ(tensor_only.tensor_parallel()->rank(), rank());
  EXPECT_EQ(tensor_only.data_parallel()->size(), 1);
}

TEST_F(Collectives, GridWhoseProductIsNotTheRankCountIsAClearError) {
  int ranks = size();
  EXPECT_TRUE(throws_error([] { ProcessGrid grid(3, 1); }, "dp (3) x tp (1) = 3 but the job has " +
                                                               std::to_string(ranks) + " ranks"));
  EXPECT_TRUE(throws_error([] { ProcessGrid grid(0, 2); }, "at least 1"));
}

// ---- Communicators for device tensors: a registry (//parallel:nccl registers NCCL for CUDA)

// Stands in for NCCL in a CPU build: an MPI communicator that reports the GPU it was made for.
class FakeGpuCommunicator : public MpiCommunicator {
 public:
  FakeGpuCommunicator(MPI_Comm comm, int device, CommOptions options)
      : MpiCommunicator(comm, std::move(options)), device_(device) {}
  Device device() const override { return Device::cuda(device_); }

 private:
  int device_;
};

// Registers the fake as the CUDA backend for its lifetime.
class FakeGpuBackend {
 public:
  // Devices made current through use_device, in call order.
  std::shared_ptr<std::vector<int>> used_devices = std::make_shared<std::vector<int>>();

  explicit FakeGpuBackend(bool with_use_device = true) {
    DeviceCommunicatorBackend backend;
    backend.device_count = [] { return 3; };
    backend.make = [](MPI_Comm comm, int device, CommOptions options) {
      return std::static_pointer_cast<Communicator>(
          std::make_shared<FakeGpuCommunicator>(comm, device, std::move(options)));
    };
    if (with_use_device) {
      backend.use_device = [used = used_devices](int device) { used->push_back(device); };
    }
    set_device_communicator_backend(DeviceType::kCuda, std::move(backend));
  }
  ~FakeGpuBackend() { set_device_communicator_backend(DeviceType::kCuda, {}); }
};

TEST_F(Collectives, UseRankDeviceMakesTheRanksGpuCurrentThroughItsBackend) {
  // Without a backend a GPU cannot be chosen; the CPU needs none.
  EXPECT_TRUE(throws_error([] { use_rank_device(Device::cuda(0)); },
                           "use_rank_device: this binary has no communicator for CUDA tensors"));
  use_rank_device(Device::cpu());
  {
    FakeGpuBackend fake;
    use_rank_device(Device::cuda(2));
    use_rank_device(Device::cpu());
    EXPECT_EQ(*fake.used_devices, std::vector<int>{2});
  }
  // A backend whose devices have no current one: nothing to do, no error.
  FakeGpuBackend without_current(/*with_use_device=*/false);
  use_rank_device(Device::cuda(1));
  EXPECT_TRUE(without_current.used_devices->empty());
}

TEST_F(Collectives, WithoutABackendACudaCommunicatorIsAClearError) {
  // This binary does not link //parallel:nccl (no --config=cuda build does either).
  EXPECT_FALSE(has_device_communicator_backend(DeviceType::kCuda));
  const std::string needs_cuda = "NCCL needs a --config=cuda build";
  EXPECT_TRUE(throws_error([] { make_device_communicator(MPI_COMM_WORLD, Device::cuda(0)); },
                           "make_device_communicator: this binary has no communicator for CUDA "
                           "tensors: " +
                               needs_cuda));
  EXPECT_TRUE(throws_error([] { communicator_device_count(DeviceType::kCuda); }, needs_cuda));
  EXPECT_TRUE(throws_error(
      [] { ProcessGrid grid(size(), 1, CommOptions(), MPI_COMM_WORLD, Device::cuda(0)); },
      needs_cuda));
  EXPECT_TRUE(throws_error([] { make_device_communicator(MPI_COMM_WORLD, Device::meta()); },
                           "no communicator moves tensors on meta devices"));
  EXPECT_TRUE(throws_error(
      [] {
        DeviceCommunicatorBackend half;
        half.device_count = [] { return 1; };
        set_device_communicator_backend(DeviceType::kCuda, half);
      },
      "needs both make and device_count"));
}

TEST_F(Collectives, ACpuDeviceCommunicatorIsMpiAndTheGridReusesItsGroups) {
  auto cpu = make_device_communicator(MPI_COMM_WORLD, Device::cpu(), CommOptions().name("cpu"));
  EXPECT_EQ(cpu->device(), Device::cpu());
  EXPECT_EQ(cpu->name(), "cpu");
  EXPECT_EQ(cpu->size(), size());
  Tensor tensor = ones({3});
  cpu->all_reduce(tensor);
  EXPECT_EQ(tensor.to_vector<double>(), std::vector<double>(3, size()));
  EXPECT_EQ(communicator_device_count(DeviceType::kCpu), 1);

  ProcessGrid grid(size(), 1);
  EXPECT_EQ(grid.data_parallel_on_device(), grid.data_parallel());
  EXPECT_EQ(grid.tensor_parallel_on_device(), grid.tensor_parallel());
  EXPECT_EQ(grid.data_parallel()->device(), Device::cpu());
}

TEST_F(Collectives, ARegisteredBackendGivesTheGridDeviceGroupsOverTheDpAndTpRanks) {
  FakeGpuBackend fake;
  EXPECT_TRUE(has_device_communicator_backend(DeviceType::kCuda));
  EXPECT_EQ(communicator_device_count(DeviceType::kCuda), 3);
  EXPECT_EQ(make_device_communicator(MPI_COMM_WORLD, Device::cuda(1))->device(), Device::cuda(1));

  // dp 2 x tp 1 at 2 ranks, dp 2 x tp 2 at 4.
  ProcessGrid grid(2, size() / 2, CommOptions(), MPI_COMM_WORLD, Device::cuda(2));
  const std::shared_ptr<Communicator>& on_device = grid.data_parallel_on_device();
  EXPECT_NE(on_device, grid.data_parallel());
  EXPECT_EQ(on_device->device(), Device::cuda(2));
  EXPECT_EQ(on_device->name(), "dp");
  EXPECT_EQ(on_device->size(), grid.data_parallel()->size());
  EXPECT_EQ(on_device->rank(), grid.dp_index());
  // The same ranks as the dp group: the sum of world ranks over each agrees.
  Tensor over_device = full({1}, rank(), DType::kInt64);
  Tensor over_mpi = full({1}, rank(), DType::kInt64);
  on_device->all_reduce(over_device);
  grid.data_parallel()->all_reduce(over_mpi);
  EXPECT_EQ(over_device.item<int64_t>(), over_mpi.item<int64_t>());
  // Likewise the tp group: its own device communicator over the tp ranks, in tp order.
  const std::shared_ptr<Communicator>& tp_on_device = grid.tensor_parallel_on_device();
  EXPECT_NE(tp_on_device, grid.tensor_parallel());
  EXPECT_NE(tp_on_device, on_device);
  EXPECT_EQ(tp_on_device->device(), Device::cuda(2));
  EXPECT_EQ(tp_on_device->name(), "tp");
  EXPECT_EQ(tp_on_device->size(), grid.tp_size());
  EXPECT_EQ(tp_on_device->rank(), grid.tp_index());
  Tensor over_tp_device = full({1}, rank(), DType::kInt64);
  Tensor over_tp_mpi = full({1}, rank(), DType::kInt64);
  tp_on_device->all_reduce(over_tp_device);
  grid.tensor_parallel()->all_reduce(over_tp_mpi);
  EXPECT_EQ(over_tp_device.item<int64_t>(), over_tp_mpi.item<int64_t>());
  // CPU bookkeeping stays on the MPI groups.
  EXPECT_EQ(grid.world()->device(), Device::cpu());
  EXPECT_EQ(grid.tensor_parallel()->device(), Device::cpu());
}

// ---- Groups over part of the ranks ----

// Pairs of neighbouring ranks (0-1, 2-3) and the whole world in reverse order, each a
// SubgroupCommunicator over the world.
TEST_F(Collectives, SubgroupsOfPointToPointMessagesMatchTheirMembersValues) {
  const int pair_first = rank() / 2 * 2;
  std::vector<int> pair_ranks{pair_first, pair_first + 1}, reversed;
  for (int r = size() - 1; r >= 0; --r) reversed.push_back(r);
  for (const auto& members : {pair_ranks, reversed}) {
    SubgroupCommunicator group(shared_world(), members, "sub");
    const int n = group.size();
    ASSERT_EQ(members[static_cast<size_t>(group.rank())], rank());
    std::vector<int> order(members.begin(), members.end());
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kMean}) {
      Tensor tensor = rank_tensor(rank(), {2, 3}, DType::kFloat32);
      group.all_reduce(tensor, op);
      for (int64_t i = 0; i < 6; ++i) {
        double sum = 0, high = -1e300, low = 1e300;
        for (int member : order) {
          const double v = value_of(member, i, DType::kFloat32);
          sum += v;
          high = std::max(high, v);
          low = std::min(low, v);
        }
        const double expected = op == ReduceOp::kSum   ? sum
                                : op == ReduceOp::kMax ? high
                                : op == ReduceOp::kMin ? low
                                                       : sum / n;
        EXPECT_DOUBLE_EQ(tensor.to_vector<double>()[static_cast<size_t>(i)], expected)
            << reduce_op_name(op) << " element " << i;
      }
    }
    // All-gather: the members' rows in the group's order, into a strided output too.
    Tensor gathered = zeros({2 * n, 3});
    group.all_gather(rank_tensor(rank(), {2, 3}, DType::kFloat32), gathered);
    Tensor strided = transpose(zeros({3, 2 * n}), 0, 1);
    group.all_gather(rank_tensor(rank(), {2, 3}, DType::kFloat32), strided);
    for (int member = 0; member < n; ++member) {
      const Tensor expected =
          rank_tensor(order[static_cast<size_t>(member)], {2, 3}, DType::kFloat32);
      EXPECT_TRUE(tessel::testing::all_close(narrow(gathered, 0, 2 * member, 2), expected, 0, 0));
      EXPECT_TRUE(tessel::testing::all_close(narrow(strided, 0, 2 * member, 2), expected, 0, 0));
    }
    // Reduce-scatter: this member's rows of the sum; broadcast: the root's values.
    Tensor rows = zeros({2, 3});
    group.reduce_scatter(rank_tensor(rank(), {2 * n, 3}, DType::kFloat32), rows);
    Tensor whole_sum = zeros({2 * n, 3});
    for (int member : order)
      whole_sum = add(whole_sum, rank_tensor(member, {2 * n, 3}, DType::kFloat32));
    EXPECT_TRUE(tessel::testing::all_close(rows, narrow(whole_sum, 0, 2 * group.rank(), 2), 0, 0));
    Tensor value = rank_tensor(rank(), {4}, DType::kInt64);
    group.broadcast(value, n - 1);
    EXPECT_EQ(value.to_vector<double>(), values_of(order.back(), 4, DType::kInt64));
    group.barrier();
  }
}

TEST_F(Collectives, ASubgroupWithoutThisRankOrWithARankTwiceIsAClearError) {
  const int other = (rank() + 1) % size();
  EXPECT_TRUE(throws_error([&] { SubgroupCommunicator(shared_world(), {other}, "g"); },
                           "is not in the group"));
  EXPECT_TRUE(throws_error(
      [&] {
        SubgroupCommunicator(shared_world(), {rank(), rank()}, "g");
      },
      "listed twice"));
  EXPECT_TRUE(throws_error(
      [&] {
        SubgroupCommunicator(shared_world(), {rank(), size()}, "g");
      },
      "is not one of"));
  SubgroupCommunicator alone(shared_world(), {rank()}, "alone");
  EXPECT_TRUE(throws_error(
      [&] {
        Tensor flags = zeros({2}, DType::kBool);
        alone.all_reduce(flags);
      },
      "bool"));
}

// ---- Launch helpers ----

TEST_F(Collectives, OnlyRankZeroIsTheMainRank) {
  EXPECT_EQ(is_main_rank(), rank() == 0);
  EXPECT_EQ(world_rank(), rank());
  EXPECT_EQ(world_size(), size());
  Tensor mains = full({1}, is_main_rank() ? 1.0 : 0.0, DType::kInt32);
  world().all_reduce(mains);
  EXPECT_EQ(mains.item<int32_t>(), 1);
}

TEST_F(Collectives, EachRankGetsItsShareOfTheCores) {
  // Every rank of these tests runs on this one node.
  EXPECT_EQ(local_rank_count(), size());
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(default_threads_per_rank(), std::max(1, cores / size()));
  // run_ranks applied it (no --threads on this command line).
  EXPECT_EQ(get_num_threads(), default_threads_per_rank());
}

}  // namespace
}  // namespace tessel::parallel
