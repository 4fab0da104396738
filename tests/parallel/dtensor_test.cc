// Sharded tensors against one process computing on the whole tensors: every placement round
// trips, every redistribution gives the whole tensor's values and gradients (over equal parts,
// unequal ones and, at 4 ranks, an empty one), a Megatron MLP built from DTensor ops (columns
// then rows, equal or not) matches the unsharded one on a 1-D mesh over every rank and, at 4
// ranks, on a 2-D mesh (dp = 2 x tp = 2, the batch split over dp); conv2d by batch, output and
// input channels, embedding by rows and features, cross-entropy by classes and rows (equal or not),
// pooling by batch, channels, rows of the image and Partial sums, batch norm (training and eval)
// and layer norm by batch, channels or features match too; bad layouts are clear errors on every
// rank.
#include "parallel/dtensor.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "parallel/counting_communicator.h"
#include "parallel/process_group.h"
#include "tests/parallel/mpi_testing.h"
#include "tests/testing.h"

namespace tessel::parallel {
namespace {

using tessel::testing::all_close;
using tessel::testing::bitwise_equal;
using tessel::testing::throws_error;
using testing::MpiTest;

// The same values on every rank: integers, so sums in any order are exact.
Tensor whole(const Shape& sizes, uint64_t seed) {
  manual_seed(seed);
  return randint(-4, 5, sizes).to(DType::kFloat32);
}

// Where rank `index` of `parts` starts along a dim of `size` and how long its part is: the first
// size % parts parts hold one index more (as torch.tensor_split cuts).
std::pair<int64_t, int64_t> part_bounds(int64_t size, int parts, int index) {
  return {index * (size / parts) + std::min<int64_t>(index, size % parts),
          size / parts + (index < size % parts ? 1 : 0)};
}

// This rank's part of `full` along `dim` on a mesh dim of `parts` ranks, at `index`.
Tensor part(const Tensor& full, int64_t dim, int parts, int index) {
  const auto [start, length] = part_bounds(full.size(dim), parts, index);
  return narrow(full, dim, start, length).contiguous();
}

// `full` with zeros everywhere but rank `index`'s part along `dim`.
Tensor placed_part(const Tensor& full, int64_t dim, int parts, int index) {
  const auto [start, length] = part_bounds(full.size(dim), parts, index);
  Tensor placed = zeros_like(full);
  narrow(placed, dim, start, length).copy_(part(full, dim, parts, index));
  return placed;
}

// Shapes cut into equal parts, into unequal ones (7 and 5 over 2 or 4 ranks) and, for 3 rows over
// 4 ranks, into parts of which one is empty.
const std::vector<Shape>& shapes_to_cut() {
  static const std::vector<Shape> shapes = {{8, 4}, {7, 5}, {3, 6}};
  return shapes;
}

class DTensorTest : public MpiTest {
 protected:
  // One mesh dimension over every rank.
  static std::shared_ptr<const DeviceMesh> line() {
    static auto mesh = std::make_shared<const DeviceMesh>(shared_world(), "world");
    return mesh;
  }
  // dp x 2 (collectives: built once, by every rank).
  static ProcessGrid& grid() {
    static ProcessGrid grid(size() / 2, 2);
    return grid;
  }
  static std::shared_ptr<const DeviceMesh> grid_mesh() {
    static auto mesh = std::make_shared<const DeviceMesh>(grid());
    return mesh;
  }
};

TEST_F(DTensorTest, EveryPlacementRoundTrips) {
  for (const Shape& sizes : shapes_to_cut())
    for (const Placement& placement :
         {Placement::replicate(), Placement::shard(0), Placement::shard(1), Placement::shard(-1)}) {
      SCOPED_TRACE(shape_str(sizes) + " " + placement.str());
      const Tensor full = whole(sizes, 1);
      const DTensor x = distribute_tensor(full, line(), {placement});
      EXPECT_EQ(x.shape(), full.sizes());
      const Tensor expected_local =
          placement.is_shard()
              ? part(full, placement.dim < 0 ? placement.dim + 2 : placement.dim, size(), rank())
              : full;
      EXPECT_TRUE(bitwise_equal(x.local(), expected_local));
      EXPECT_TRUE(bitwise_equal(x.full_tensor(), full));
    }
}

TEST_F(DTensorTest, EveryRedistributionKeepsValuesAndGradients) {
  const std::vector<Placement> layouts = {Placement::replicate(), Placement::shard(0),
                                          Placement::shard(1), Placement::partial()};
  for (const Shape& sizes : shapes_to_cut()) {
    const Tensor full = whole(sizes, 2), weight = whole(sizes, 3);
    for (const Placement& from : layouts) {
      for (const Placement& to : layouts) {
        SCOPED_TRACE(shape_str(sizes) + " " + from.str() + " -> " + to.str());
        // The source as a leaf: a Partial one holds the whole tensor on rank 0 and zeros elsewhere.
        Tensor local = from.is_partial() ? (rank() == 0 ? full.clone() : zeros_like(full))
                       : from.is_shard() ? part(full, from.dim, size(), rank())
                                         : full.clone();
        local.set_requires_grad(true);
        const DTensor x(local, line(), {from}, sizes);
        const DTensor y = x.redistribute({to});
        EXPECT_EQ(y.placements()[0], to);
        EXPECT_EQ(y.shape(), sizes);
        EXPECT_EQ(y.local().sizes(),
                  (to.is_shard() ? part(full, to.dim, size(), rank()) : full).sizes());
        const Tensor y_full = y.full_tensor();
        EXPECT_TRUE(bitwise_equal(y_full, full));
        // The same loss on every rank: the gradient of each summand or part is weight's.
        sum(mul(y_full, weight)).backward();
        Tensor expected_grad = from.is_shard() ? part(weight, from.dim, size(), rank()) : weight;
        // Replicate -> Partial keeps the values on rank 0 only, and so their gradient.
        if (from.is_replicate() && to.is_partial() && rank() != 0)
          expected_grad = zeros_like(weight);
        EXPECT_TRUE(bitwise_equal(local.grad(), expected_grad));
        if (to.is_partial() && !from.is_partial()) {  // a local move: this rank's summand
          const Tensor summand = from.is_replicate() ? (rank() == 0 ? full : zeros_like(full))
                                                     : placed_part(full, from.dim, size(), rank());
          EXPECT_TRUE(bitwise_equal(y.local(), summand));
        }
      }
    }
  }
}

// Partial -> Shard is one reduce-scatter (half an all-reduce's traffic), Shard(i) -> Shard(j) one
// all-to-all's sends, Partial -> Replicate one all-reduce.
TEST_F(DTensorTest, RedistributionsIssueTheirOwnCollective) {
  auto counted = std::make_shared<parallel::CountingCommunicator>(shared_world());
  auto mesh = std::make_shared<const DeviceMesh>(counted, "counted");
  const int64_t rows = 4 * size();
  const DTensor partial(ones({rows, 4}), mesh, {Placement::partial()});
  counted->records.clear();
  const DTensor sharded = partial.redistribute({Placement::shard(0)});
  ASSERT_EQ(counted->records.size(), 1u);
  EXPECT_EQ(counted->records[0].kind, "reduce_scatter");
  EXPECT_EQ(counted->records[0].bytes, rows * 4 * 4);
  EXPECT_TRUE(bitwise_equal(sharded.local(), full(Shape{4, 4}, static_cast<double>(size()))));
  counted->records.clear();
  partial.redistribute({Placement::replicate()});
  ASSERT_EQ(counted->records.size(), 1u);
  EXPECT_EQ(counted->records[0].kind, "all_reduce");
}

// y = W2 relu(W1 x + b1) + b2, loss = sum(y * target): the whole computation on every rank.
struct Mlp {
  Tensor x, w1, b1, w2, b2, target;
  static Mlp make(int64_t hidden = 8) {
    Mlp mlp;
    mlp.x = whole({8, 6}, 10);
    mlp.w1 = mul(whole({hidden, 6}, 11), 0.25);
    mlp.b1 = whole({hidden}, 12);
    mlp.w2 = mul(whole({6, hidden}, 13), 0.5);
    mlp.b2 = whole({6}, 14);
    mlp.target = whole({8, 6}, 15);
    return mlp;
  }
  std::vector<Tensor> leaves() const { return {w1, b1, w2, b2}; }
};

// The MLP on whole tensors, backpropagated: the loss and the gradients of x and of each leaf.
struct MlpReference {
  Tensor loss, x;
  std::vector<Tensor> leaves;
  explicit MlpReference(const Mlp& mlp) : x(mlp.x.clone().set_requires_grad(true)) {
    for (const Tensor& leaf : mlp.leaves()) leaves.push_back(leaf.clone().set_requires_grad(true));
    loss =
        sum(mul(linear(relu(linear(x, leaves[0], leaves[1])), leaves[2], leaves[3]), mlp.target));
    loss.backward();
  }
};

TEST_F(DTensorTest, MegatronMlpMatchesOneProcessOnALine) {
  for (const int64_t width : {8, 7}) {  // 7: unequal columns of W1 and rows of W2
    SCOPED_TRACE("hidden width " + std::to_string(width));
    const Mlp mlp = Mlp::make(width);
    const MlpReference reference(mlp);

    // Columns of W1 (and b1) and rows of W2 per rank; x, b2 and the target replicated.
    const std::vector<Placement> layouts = {Placement::shard(0), Placement::shard(0),
                                            Placement::shard(1), Placement::replicate()};
    std::vector<DTensor> params;
    std::vector<Tensor> locals;
    for (size_t i = 0; i < layouts.size(); ++i) {
      DTensor param = distribute_tensor(mlp.leaves()[i], line(), {layouts[i]});
      Tensor local = param.local().detach().contiguous().set_requires_grad(true);
      locals.push_back(local);
      params.emplace_back(local, line(), param.placements(), param.shape());
    }
    // x a leaf too: each rank's columns give part of its gradient, summed in backward.
    Tensor x_local = mlp.x.clone().set_requires_grad(true);
    const DTensor x(x_local, line(), {Placement::replicate()});
    const DTensor hidden = dt::relu(dt::linear(x, params[0], params[1]));
    EXPECT_EQ(hidden.placements()[0], Placement::shard(1)) << hidden.str();
    const DTensor y = dt::linear(hidden, params[2], params[3]);
    EXPECT_EQ(y.placements()[0], Placement::replicate()) << y.str();
    const DTensor loss =
        dt::sum(dt::mul(y, distribute_tensor(mlp.target, line(), {Placement::replicate()})));
    EXPECT_TRUE(all_close(loss.local(), reference.loss, 1e-6, 1e-6));
    loss.local().backward();
    for (size_t i = 0; i < layouts.size(); ++i) {
      SCOPED_TRACE("parameter " + std::to_string(i));
      const Tensor& full_grad = reference.leaves[i].grad();
      const Tensor expected =
          layouts[i].is_shard() ? part(full_grad, layouts[i].dim, size(), rank()) : full_grad;
      EXPECT_TRUE(all_close(locals[i].grad(), expected, 1e-5, 1e-6));
    }
    EXPECT_TRUE(all_close(x_local.grad(), reference.x.grad(), 1e-5, 1e-6));
  }
}

TEST_F(DTensorTest, MegatronMlpMatchesOneProcessOnADataByTensorGrid) {
  if (size() != 4) GTEST_SKIP() << "needs 4 ranks (dp = 2 x tp = 2)";
  const Mlp mlp = Mlp::make();
  const MlpReference reference(mlp);

  const auto mesh = grid_mesh();
  const Placement r = Placement::replicate();
  const std::vector<std::vector<Placement>> layouts = {
      {r, Placement::shard(0)}, {r, Placement::shard(0)}, {r, Placement::shard(1)}, {r, r}};
  std::vector<DTensor> params;
  std::vector<Tensor> locals;
  for (size_t i = 0; i < layouts.size(); ++i) {
    DTensor param = distribute_tensor(mlp.leaves()[i], mesh, layouts[i]);
    Tensor local = param.local().detach().contiguous().set_requires_grad(true);
    locals.push_back(local);
    params.emplace_back(local, mesh, param.placements());
  }
  // The batch split over dp, replicated over tp.
  const DTensor x = distribute_tensor(mlp.x, mesh, {Placement::shard(0), r});
  const DTensor y = dt::linear(dt::relu(dt::linear(x, params[0], params[1])), params[2], params[3]);
  EXPECT_EQ(y.placements(), (std::vector<Placement>{Placement::shard(0), r})) << y.str();
  const DTensor loss =
      dt::sum(dt::mul(y, distribute_tensor(mlp.target, mesh, {Placement::shard(0), r})));
  EXPECT_TRUE(all_close(loss.local(), reference.loss, 1e-6, 1e-6));
  loss.local().backward();
  for (size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    // Each dp rank's gradient covers its rows of the batch: summed over dp, as DDP does.
    Tensor grad = locals[i].grad().clone();
    grid().data_parallel()->all_reduce(grad);
    const Tensor& full_grad = reference.leaves[i].grad();
    const Tensor expected = layouts[i][1].is_shard()
                                ? part(full_grad, layouts[i][1].dim, 2, mesh->coordinate(1))
                                : full_grad;
    EXPECT_TRUE(all_close(grad, expected, 1e-5, 1e-6));
  }
}

// The gradient a rank's local `leaf` should have: its part of the whole gradient.
Tensor expected_part(const Tensor& full_grad, const Placement& placement, int parts, int index) {
  return placement.is_shard() ? part(full_grad, placement.dim, parts, index) : full_grad;
}

// `full` laid out as `placement` on the line, its local part a leaf of its own.
DTensor leaf_on(const std::shared_ptr<const DeviceMesh>& mesh, const Tensor& full,
                std::vector<Placement> placements, Tensor* local) {
  const DTensor laid_out = distribute_tensor(full, mesh, std::move(placements));
  *local = laid_out.local().detach().contiguous().set_requires_grad(true);
  return DTensor(*local, mesh, laid_out.placements(), laid_out.shape());
}

TEST_F(DTensorTest, Conv2dByBatchOutputAndInputChannelsMatchesOneProcess) {
  const Tensor x = whole({4, 4, 6, 6}, 30), weight = mul(whole({4, 4, 3, 3}, 31), 0.25),
               bias = whole({4}, 32), target = whole({4, 4, 6, 6}, 33);
  Tensor full_weight = weight.clone().set_requires_grad(true);
  Tensor full_bias = bias.clone().set_requires_grad(true);
  sum(mul(conv2d(x, full_weight, full_bias, {1, 1}, {1, 1}), target)).backward();
  const Tensor expected_loss = sum(mul(conv2d(x, weight, bias, {1, 1}, {1, 1}), target));

  struct Case {
    Placement x, weight;
    Placement output;  // before the bias combines Partial sums
  };
  const Placement r = Placement::replicate();
  for (const Case& layout :
       {Case{Placement::shard(0), r, Placement::shard(0)},
        Case{r, Placement::shard(0), Placement::shard(1)},
        Case{Placement::shard(1), Placement::shard(1), Placement::partial()}}) {
    SCOPED_TRACE("x " + layout.x.str() + ", weight " + layout.weight.str());
    Tensor weight_local, bias_local;
    const DTensor w = leaf_on(line(), weight, {layout.weight}, &weight_local);
    const DTensor b =
        leaf_on(line(), bias, {layout.weight.is_shard(0) ? layout.weight : r}, &bias_local);
    const DTensor input = distribute_tensor(x, line(), {layout.x});
    EXPECT_EQ(dt::conv2d(input, w, DTensor(), {1, 1}, {1, 1}).placements()[0], layout.output);
    const DTensor y = dt::conv2d(input, w, b, {1, 1}, {1, 1});
    const DTensor loss = dt::sum(dt::mul(y, distribute_tensor(target, line(), {layout.x})));
    EXPECT_TRUE(all_close(loss.local(), expected_loss, 1e-6, 1e-6));
    loss.local().backward();
    Tensor weight_grad = weight_local.grad().clone(), bias_grad = bias_local.grad().clone();
    if (layout.x.is_shard(0)) {  // each rank's gradient covers its images: summed, as DDP does
      world().all_reduce(weight_grad);
      world().all_reduce(bias_grad);
    }
    EXPECT_TRUE(all_close(
        weight_grad, expected_part(full_weight.grad(), layout.weight, size(), rank()), 1e-5, 1e-6));
    EXPECT_TRUE(all_close(
        bias_grad, expected_part(full_bias.grad(), b.placements()[0], size(), rank()), 1e-5, 1e-6));
  }
}

TEST_F(DTensorTest, EmbeddingByRowsAndFeaturesMatchesOneProcess) {
  for (const Shape& table_sizes : {Shape{8, 4}, Shape{7, 5}}) {  // rows and features unequal
    SCOPED_TRACE("table " + shape_str(table_sizes));
    const Tensor table = whole(table_sizes, 40), target = whole({3, 5, table_sizes[1]}, 41);
    manual_seed(42);
    const Tensor ids = randint(0, table_sizes[0], {3, 5});
    Tensor full_table = table.clone().set_requires_grad(true);
    sum(mul(embedding(full_table, ids), target)).backward();
    for (const Placement& layout : {Placement::shard(0), Placement::shard(1)}) {
      SCOPED_TRACE(layout.str());
      Tensor table_local;
      const DTensor weight = leaf_on(line(), table, {layout}, &table_local);
      const DTensor rows =
          dt::embedding(weight, distribute_tensor(ids, line(), {Placement::replicate()}));
      EXPECT_EQ(rows.placements()[0],
                layout.is_shard(0) ? Placement::partial() : Placement::shard(2));
      EXPECT_TRUE(bitwise_equal(rows.full_tensor(), embedding(table, ids)));
      dt::sum(dt::mul(rows, distribute_tensor(target, line(), {Placement::replicate()})))
          .local()
          .backward();
      EXPECT_TRUE(all_close(table_local.grad(),
                            expected_part(full_table.grad(), layout, size(), rank()), 1e-6, 1e-6));
    }
  }
}

TEST_F(DTensorTest, CrossEntropyByClassesAndRowsMatchesOneProcess) {
  for (const int64_t classes : {12, 11}) {  // 11: unequal parts of the classes and of the rows
    SCOPED_TRACE(std::to_string(classes) + " classes");
    const int64_t row_count = classes == 12 ? 8 : 7;
    const Tensor logits = mul(whole({row_count, classes}, 50), 0.5);
    manual_seed(51);
    Tensor labels = randint(0, classes, {row_count});
    labels = where(eq(labels, 3.0), full({row_count}, -100, TensorOptions(DType::kInt64)), labels);
    Tensor full_logits = logits.clone().set_requires_grad(true);
    const Tensor expected = cross_entropy(full_logits, labels);
    expected.backward();
    for (const Placement& layout : {Placement::shard(1), Placement::shard(0)}) {
      SCOPED_TRACE(layout.str());
      Tensor local;
      const DTensor input = leaf_on(line(), logits, {layout}, &local);
      const DTensor loss =
          dt::cross_entropy(input, distribute_tensor(labels, line(), {Placement::replicate()}));
      EXPECT_TRUE(all_close(loss.local(), expected, 1e-5, 1e-6));
      loss.local().backward();
      EXPECT_TRUE(all_close(local.grad(), expected_part(full_logits.grad(), layout, size(), rank()),
                            1e-5, 1e-6));
    }
    if (size() == 4) {  // rows over dp and classes over tp at once
      Tensor local;
      const DTensor input =
          leaf_on(grid_mesh(), logits, {Placement::shard(0), Placement::shard(1)}, &local);
      const DTensor loss = dt::cross_entropy(
          input,
          distribute_tensor(labels, grid_mesh(), {Placement::replicate(), Placement::replicate()}));
      EXPECT_TRUE(all_close(loss.local(), expected, 1e-5, 1e-6));
      loss.local().backward();
      const Tensor rows = part(full_logits.grad(), 0, 2, grid_mesh()->coordinate(0));
      EXPECT_TRUE(
          all_close(local.grad(), part(rows, 1, 2, grid_mesh()->coordinate(1)), 1e-5, 1e-6));
    }
  }
}

// loss = sum(op(x) * target) on the whole tensors: the loss and x's gradient.
struct Reference {
  Tensor loss, x_grad;
};
Reference reference(const Tensor& x, const Tensor& target,
                    const std::function<Tensor(const Tensor&)>& op) {
  Tensor leaf = x.clone().set_requires_grad(true);
  Tensor loss = sum(mul(op(leaf), target));
  loss.backward();
  return {loss.detach(), leaf.grad()};
}

TEST_F(DTensorTest, PoolingKeepsBatchAndChannelShardsAndGathersSpatialOnes) {
  const Tensor x = whole({4, 4, 8, 8}, 60);
  struct Pool {
    const char* name;
    bool linear;  // keeps Partial
    std::function<Tensor(const Tensor&)> whole;
    std::function<DTensor(const DTensor&)> sharded;
  };
  const std::vector<Pool> pools = {{"max_pool2d", false,
                                    [](const Tensor& t) {
                                      return max_pool2d(t, {2, 2});
                                    },
                                    [](const DTensor& t) {
                                      return dt::max_pool2d(t, {2, 2});
                                    }},
                                   {"avg_pool2d", true,
                                    [](const Tensor& t) {
                                      return avg_pool2d(t, {2, 2});
                                    },
                                    [](const DTensor& t) {
                                      return dt::avg_pool2d(t, {2, 2});
                                    }},
                                   {"adaptive_avg_pool2d", true,
                                    [](const Tensor& t) {
                                      return adaptive_avg_pool2d(t, {4, 4});
                                    },
                                    [](const DTensor& t) {
                                      return dt::adaptive_avg_pool2d(t, {4, 4});
                                    }}};
  const Tensor target = whole({4, 4, 4, 4}, 61);
  for (const Pool& pool : pools) {
    const Reference expected = reference(x, target, pool.whole);
    for (const Placement& layout :
         {Placement::shard(0), Placement::shard(1), Placement::shard(2), Placement::partial()}) {
      SCOPED_TRACE(std::string(pool.name) + " of x " + layout.str());
      Tensor local;
      DTensor input;
      if (layout.is_partial()) {  // summands x / ranks
        local = mul(x, 1.0 / size()).set_requires_grad(true);
        input = DTensor(local, line(), {layout});
      } else {
        input = leaf_on(line(), x, {layout}, &local);
      }
      const DTensor y = pool.sharded(input);
      const Placement kept = layout.is_shard(2) || (layout.is_partial() && !pool.linear)
                                 ? Placement::replicate()
                                 : layout;
      EXPECT_EQ(y.placements()[0], kept);
      const DTensor loss = dt::sum(dt::mul(
          y,
          distribute_tensor(target, line(), {kept.is_partial() ? Placement::replicate() : kept})));
      EXPECT_TRUE(all_close(loss.local(), expected.loss, 1e-5, 1e-6));
      loss.local().backward();
      const Tensor grad = layout.is_partial()
                              ? expected.x_grad
                              : expected_part(expected.x_grad, layout, size(), rank());
      EXPECT_TRUE(all_close(local.grad(), grad, 1e-5, 1e-6));
    }
  }
}

TEST_F(DTensorTest, TrainingBatchNormOverSplitRowsMovesOnlyStatistics) {
  auto counted = std::make_shared<parallel::CountingCommunicator>(shared_world());
  auto mesh = std::make_shared<const DeviceMesh>(counted, "counted");
  const int64_t channels = 3;
  const Tensor x = whole({2 * size(), channels, 4, 4}, 80);
  Tensor local;
  const DTensor input = leaf_on(mesh, x, {Placement::shard(0)}, &local);
  counted->records.clear();
  const DTensor y = dt::batch_norm(input, DTensor(), DTensor(), DTensor(), DTensor(), true);
  // One all-gather of every rank's per-channel mean and centred sum of squares; x stays put.
  ASSERT_EQ(counted->records.size(), 1u);
  EXPECT_EQ(counted->records[0].kind, "all_gather");
  EXPECT_EQ(counted->records[0].bytes, size() * 2 * channels * 4);
  EXPECT_EQ(y.placements()[0], Placement::shard(0));
  const Tensor expected = batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  EXPECT_TRUE(all_close(y.local(), expected_part(expected, Placement::shard(0), size(), rank()),
                        1e-5, 1e-6));
  // Backward: the statistics' gradient summed over the ranks, one all-reduce.
  counted->records.clear();
  sum(y.local()).backward();
  ASSERT_EQ(counted->records.size(), 1u);
  EXPECT_EQ(counted->records[0].kind, "all_reduce");
}

TEST_F(DTensorTest, BatchAndLayerNormMatchOneProcess) {
  const Placement r = Placement::replicate();
  {  // batch norm, training and eval, x split by batch, channels or rows of the image
    const Tensor x = whole({4, 4, 4, 4}, 70), weight = whole({4}, 71), bias = whole({4}, 72),
                 target = whole({4, 4, 4, 4}, 73);
    for (bool training : {true, false}) {
      Tensor mean = full({4}, 0.5), var = full({4}, 2.0);
      Tensor full_weight = weight.clone().set_requires_grad(true);
      Tensor full_bias = bias.clone().set_requires_grad(true);
      const Reference expected = reference(x, target, [&](const Tensor& t) {
        return batch_norm(t, full_weight, full_bias, mean, var, training);
      });
      for (const Placement& layout :
           {Placement::shard(0), Placement::shard(1), Placement::shard(2)}) {
        SCOPED_TRACE(std::string(training ? "training" : "eval") + ", x " + layout.str());
        const Placement channels = layout.is_shard(1) ? Placement::shard(0) : r;
        Tensor local, weight_local, bias_local;
        const DTensor input = leaf_on(line(), x, {layout}, &local);
        const DTensor w = leaf_on(line(), weight, {channels}, &weight_local);
        const DTensor b = leaf_on(line(), bias, {channels}, &bias_local);
        const DTensor running_mean = distribute_tensor(full({4}, 0.5), line(), {channels});
        const DTensor running_var = distribute_tensor(full({4}, 2.0), line(), {channels});
        const DTensor y = dt::batch_norm(input, w, b, running_mean, running_var, training);
        EXPECT_EQ(y.placements()[0], layout);
        const DTensor loss = dt::sum(dt::mul(y, distribute_tensor(target, line(), {layout})));
        EXPECT_TRUE(all_close(loss.local(), expected.loss, 1e-4, 1e-5));
        loss.local().backward();
        EXPECT_TRUE(all_close(local.grad(), expected_part(expected.x_grad, layout, size(), rank()),
                              1e-4, 1e-5));
        Tensor weight_grad = weight_local.grad().clone(), bias_grad = bias_local.grad().clone();
        // Each rank normalises its own rows (in training by the whole batch's statistics), so a
        // whole parameter's gradient covers that part: summed, as DDP does.
        if (!layout.is_shard(1)) {
          world().all_reduce(weight_grad);
          world().all_reduce(bias_grad);
        }
        EXPECT_TRUE(all_close(
            weight_grad, expected_part(full_weight.grad(), channels, size(), rank()), 1e-4, 1e-5));
        EXPECT_TRUE(all_close(bias_grad, expected_part(full_bias.grad(), channels, size(), rank()),
                              1e-4, 1e-5));
        EXPECT_TRUE(all_close(running_mean.local(), expected_part(mean, channels, size(), rank()),
                              1e-5, 1e-6));
        EXPECT_TRUE(all_close(running_var.local(), expected_part(var, channels, size(), rank()),
                              1e-5, 1e-6));
      }
    }
  }
  {  // layer norm over the last dim, x split by rows or by features
    const Tensor x = whole({4, 4, 8}, 74), weight = whole({8}, 75), bias = whole({8}, 76),
                 target = whole({4, 4, 8}, 77);
    Tensor full_weight = weight.clone().set_requires_grad(true);
    const Reference expected = reference(
        x, target, [&](const Tensor& t) { return layer_norm(t, {8}, full_weight, bias); });
    for (const Placement& layout :
         {Placement::shard(0), Placement::shard(1), Placement::shard(2)}) {
      SCOPED_TRACE("layer norm, x " + layout.str());
      Tensor local, weight_local;
      const DTensor input = leaf_on(line(), x, {layout}, &local);
      const DTensor w = leaf_on(line(), weight, {r}, &weight_local);
      const DTensor y =
          dt::layer_norm(input, {8}, w, distribute_tensor(bias, line(), {Placement::shard(0)}));
      EXPECT_EQ(y.placements()[0], layout);
      const DTensor loss = dt::sum(dt::mul(y, distribute_tensor(target, line(), {layout})));
      EXPECT_TRUE(all_close(loss.local(), expected.loss, 1e-4, 1e-5));
      loss.local().backward();
      EXPECT_TRUE(all_close(local.grad(), expected_part(expected.x_grad, layout, size(), rank()),
                            1e-4, 1e-5));
      Tensor weight_grad = weight_local.grad().clone();
      if (!layout.is_shard(2)) world().all_reduce(weight_grad);  // each rank's rows
      EXPECT_TRUE(all_close(weight_grad, full_weight.grad(), 1e-4, 1e-5));
    }
  }
  const DTensor x = distribute_tensor(whole({4, 4, 4, 4}, 78), line(), {Placement::shard(1)});
  const DTensor stats = distribute_tensor(full({4}, 1.0), line(), {r});
  EXPECT_TRUE(throws_error([&] { dt::batch_norm(x, DTensor(), DTensor(), stats, stats, true); },
                           "must be laid out as x's channels"));
}

TEST_F(DTensorTest, BadLayoutsAreClearErrors) {
  const Tensor full = whole({8, 6}, 20);
  EXPECT_TRUE(throws_error([&] { distribute_tensor(full, line(), {}); }, "1 dims"));
  EXPECT_TRUE(throws_error([&] { distribute_tensor(full, line(), {Placement::shard(2)}); },
                           "out of range"));
  EXPECT_TRUE(throws_error(
      [&] {
        distribute_tensor(ones(Shape{8, 6}, TensorOptions(DType::kInt64)), line(),
                          {Placement::partial()});
      },
      "cannot be Partial"));
  EXPECT_TRUE(throws_error(
      [&] {
        DTensor(whole({part_bounds(7, size(), rank()).second + 1, 6}, 21), line(),
                {Placement::shard(0)}, {7, 6});
      },
      "is not this rank's part"));
  EXPECT_TRUE(throws_error(
      [&] {
        DTensor(whole({7, 6}, 21), line(), {Placement::replicate()}, {7, 6, 1});
      },
      "does not have the local tensor's 2 dims"));
  EXPECT_TRUE(throws_error(
      [&] {
        const DTensor rows =
            distribute_tensor(whole({size() + 1, 2, 1, 1}, 24), line(), {Placement::shard(0)});
        dt::batch_norm(rows, DTensor(), DTensor(), DTensor(), DTensor(), /*training=*/true);
      },
      "the rows must be cut into equal parts"));
  const DTensor x = distribute_tensor(full, line(), {Placement::shard(0)});
  const DTensor on_grid = distribute_tensor(whole({8, 6}, 23), grid_mesh(),
                                            {Placement::shard(0), Placement::replicate()});
  EXPECT_TRUE(throws_error(
      [&] {
        on_grid.redistribute({Placement::partial(), Placement::shard(0)});
      },
      "another mesh dim also cuts dim 0 is not offered"));
  const DTensor other = distribute_tensor(whole({6, 8}, 22), line(), {Placement::replicate()});
  EXPECT_TRUE(throws_error([&] { dt::add(x, other); }, "broadcasting is not offered"));
  EXPECT_TRUE(throws_error([&] { dt::linear(x, other); }, "does not match the weight"));
}

}  // namespace
}  // namespace tessel::parallel
