// Tensor parallelism against one process running the unsharded layers: the collectives with
// their backward, column and row parallel linear, vocabulary-parallel embedding and
// cross-entropy, the all-to-all, and BERT tiny (tp = 2, with dp = 2 at 4 ranks: gradients
// all-reduced over the data-parallel group) whose losses and gathered gradients match the full
// model's.
#include "parallel/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/rng.h"
#include "models/bert.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "parallel/counting_communicator.h"
#include "parallel/process_group.h"
#include "tests/parallel/mpi_testing.h"
#include "tests/testing.h"

namespace tessel::parallel {
namespace {

using tessel::testing::bitwise_equal;
using tessel::testing::throws_error;
using testing::MpiTest;

constexpr int kTensorParallel = 2;

// max|actual - expected| <= atol + rtol * max|expected|, the rule for whole models whose sums run
// in another order.
::testing::AssertionResult close_overall(const Tensor& actual, const Tensor& expected,
                                         const std::string& what, double rtol = 1e-4,
                                         double atol = 1e-6) {
  if (!actual.defined() || !expected.defined())
    return ::testing::AssertionFailure() << what << ": a tensor is undefined";
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(actual.sizes())
                                         << " vs " << shape_str(expected.sizes());
  NoGradGuard no_grad;
  const double difference = max(abs(sub(actual, expected))).item<double>();
  const double scale = max(abs(expected)).item<double>();
  if (difference <= atol + rtol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max|a-b| = " << difference << " exceeds "
                                       << atol << " + " << rtol << " * " << scale;
}

class TensorParallel : public MpiTest {
 protected:
  // dp x 2 over the world; built once per binary (a collective).
  static ProcessGrid& grid() {
    static ProcessGrid grid(size() / kTensorParallel, kTensorParallel);
    return grid;
  }
  static int64_t tp() { return register_tp_group(grid().tensor_parallel()); }
  static Communicator& tp_comm() { return *grid().tensor_parallel(); }
};

TEST_F(TensorParallel, CollectivesForwardAndBackwardAreDuals) {
  const int rank = grid().tp_index();
  manual_seed(11 + rank);  // a different x on each tp rank
  Tensor x = randn({3, 4}, DType::kFloat64).set_requires_grad(true);
  manual_seed(5);  // the same upstream gradient everywhere
  Tensor upstream = randn({3, 8}, DType::kFloat64);

  Tensor all_x = gather_shards(x, 1, tp_comm());
  Tensor gathered = gather_from_tp(x, tp());
  EXPECT_TRUE(close_overall(gathered, all_x, "gather_from_tp", 0, 0));
  sum(mul(gathered, upstream)).backward();
  EXPECT_TRUE(close_overall(x.grad(), narrow(upstream, 1, 4 * rank, 4), "gather backward", 0, 0));

  Tensor y = randn({3, 8}, DType::kFloat64).set_requires_grad(true);  // same on every rank
  Tensor scattered = scatter_to_tp(y, tp());
  EXPECT_TRUE(close_overall(scattered, narrow(y, 1, 4 * rank, 4), "scatter_to_tp", 0, 0));
  sum(mul(scattered, narrow(upstream, 1, 0, 4))).backward();
  // The all-gather of every rank's (equal) gradient part.
  Tensor expected_y_grad = cat({narrow(upstream, 1, 0, 4), narrow(upstream, 1, 0, 4)}, 1);
  EXPECT_TRUE(close_overall(y.grad(), expected_y_grad, "scatter backward", 0, 0));

  Tensor z = mul(x.detach(), 1.0).set_requires_grad(true);
  Tensor reduced = reduce_from_tp(z, tp());
  Tensor expected_sum = add(narrow(all_x, 1, 0, 4), narrow(all_x, 1, 4, 4));
  EXPECT_TRUE(close_overall(reduced, expected_sum, "reduce_from_tp", 1e-12, 0));
  Tensor local_upstream = narrow(upstream, 1, 4 * rank, 4);  // differs per rank
  sum(mul(reduced, local_upstream)).backward();
  EXPECT_TRUE(close_overall(z.grad(), local_upstream, "reduce backward (identity)", 0, 0));

  Tensor w = mul(x.detach(), 1.0).set_requires_grad(true);
  Tensor copied = copy_to_tp(w, tp());
  EXPECT_TRUE(close_overall(copied, x, "copy_to_tp", 0, 0));
  sum(mul(copied, local_upstream)).backward();
  Tensor upstream_sum = add(narrow(upstream, 1, 0, 4), narrow(upstream, 1, 4, 4));
  EXPECT_TRUE(close_overall(w.grad(), upstream_sum, "copy backward (all-reduce)", 1e-12, 0));
}

TEST_F(TensorParallel, CollectivesAcceptNonContiguousInputs) {
  const int rank = grid().tp_index();
  manual_seed(13 + rank);
  Tensor base = randn({4, 3}, DType::kFloat64);
  Tensor x = base.transpose(0, 1);  // (3, 4), strides (1, 3)
  EXPECT_TRUE(close_overall(gather_from_tp(x, tp()), gather_shards(x.contiguous(), 1, tp_comm()),
                            "gather of a transposed input", 0, 0));
  manual_seed(17);
  Tensor y = randn({8, 3}, DType::kFloat64).transpose(0, 1);  // (3, 8), same on every rank
  EXPECT_TRUE(close_overall(scatter_to_tp(y, tp()), narrow(y, 1, 4 * rank, 4),
                            "scatter of a transposed input", 0, 0));
  Tensor reduced = reduce_from_tp(x, tp());
  Tensor all_x = gather_shards(x.contiguous(), 1, tp_comm());
  EXPECT_TRUE(close_overall(reduced, add(narrow(all_x, 1, 0, 4), narrow(all_x, 1, 4, 4)),
                            "reduce of a transposed input", 1e-12, 0));
}

TEST_F(TensorParallel, ColumnParallelLinearMatchesLinear) {
  for (bool gather_output : {true, false}) {
    manual_seed(21);
    auto full = std::make_shared<nn::Linear>(6, 8);
    Tensor input = randn({2, 3, 6}).set_requires_grad(true);
    Tensor upstream = randn({2, 3, 8});
    sum(mul(full->forward(input), upstream)).backward();

    ColumnParallelLinear column(6, 8, tp(), /*bias=*/true, gather_output);
    column.load_from(*full);
    Tensor parallel_input = input.detach().clone().set_requires_grad(true);
    Tensor output = column.forward(parallel_input);
    const int64_t local = 8 / kTensorParallel;
    Tensor full_output = gather_output ? output : gather_shards(output, 2, tp_comm());
    Tensor my_upstream =
        gather_output ? upstream : narrow(upstream, 2, grid().tp_index() * local, local);
    sum(mul(output, my_upstream)).backward();

    const std::string label = gather_output ? " (gather_output)" : " (parallel output)";
    EXPECT_TRUE(close_overall(full_output, full->forward(input.detach()), "output" + label));
    EXPECT_TRUE(close_overall(parallel_input.grad(), input.grad(), "input grad" + label));
    EXPECT_TRUE(close_overall(gather_shards(column.weight.grad(), 0, tp_comm()),
                              full->weight.grad(), "weight grad" + label));
    EXPECT_TRUE(close_overall(gather_shards(column.bias.grad(), 0, tp_comm()), full->bias.grad(),
                              "bias grad" + label));
  }
}

TEST_F(TensorParallel, RowParallelLinearMatchesLinearWithBiasAddedOnce) {
  for (bool input_is_parallel : {false, true}) {
    manual_seed(31);
    auto full = std::make_shared<nn::Linear>(8, 5);
    Tensor input = randn({4, 8}).set_requires_grad(true);
    Tensor upstream = randn({4, 5});
    Tensor expected = full->forward(input);
    sum(mul(expected, upstream)).backward();

    RowParallelLinear row(8, 5, tp(), /*bias=*/true, input_is_parallel);
    row.load_from(*full);
    const int64_t local = 8 / kTensorParallel;
    Tensor leaf = input.detach().clone();
    if (input_is_parallel) leaf = narrow(leaf, 1, grid().tp_index() * local, local).contiguous();
    leaf.set_requires_grad(true);
    Tensor output = row.forward(leaf);
    sum(mul(output, upstream)).backward();

    const std::string label = input_is_parallel ? " (parallel input)" : " (replicated input)";
    EXPECT_TRUE(close_overall(output, expected.detach(), "output" + label));
    Tensor input_grad = input_is_parallel ? gather_shards(leaf.grad(), 1, tp_comm()) : leaf.grad();
    EXPECT_TRUE(close_overall(input_grad, input.grad(), "input grad" + label));
    EXPECT_TRUE(close_overall(gather_shards(row.weight.grad(), 1, tp_comm()), full->weight.grad(),
                              "weight grad" + label));
    EXPECT_TRUE(close_overall(row.bias.grad(), full->bias.grad(), "bias grad" + label));
  }
}

TEST_F(TensorParallel, VocabParallelEmbeddingMatchesEmbedding) {
  manual_seed(41);
  auto full = std::make_shared<nn::Embedding>(nn::EmbeddingOptions(10, 3));
  Tensor ids = from_vector<int64_t>({0, 9, 4, 5, 5, 2, 7, 1}, {2, 4}, DType::kInt64);
  Tensor upstream = randn({2, 4, 3});
  Tensor expected = full->forward(ids);
  sum(mul(expected, upstream)).backward();

  VocabParallelEmbedding parallel(10, 3, tp());
  parallel.load_from(*full);
  Tensor output = parallel.forward(ids);
  sum(mul(output, upstream)).backward();
  EXPECT_TRUE(close_overall(output, expected.detach(), "embedding output"));
  EXPECT_TRUE(close_overall(gather_shards(parallel.weight.grad(), 0, tp_comm()),
                            full->weight.grad(), "embedding weight grad"));
}

TEST_F(TensorParallel, VocabParallelCrossEntropyMatchesCrossEntropy) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    manual_seed(51);
    Tensor logits = mul(randn({6, 10}, dtype), 5.0).set_requires_grad(true);
    Tensor target = from_vector<int64_t>({3, 9, -100, 0, 5, 4}, {6}, DType::kInt64);
    Tensor expected = cross_entropy(logits, target);
    expected.backward();

    const int64_t local = 10 / kTensorParallel;
    Tensor local_logits = narrow(logits.detach(), 1, grid().tp_index() * local, local)
                              .clone()
                              .set_requires_grad(true);
    Tensor loss = vocab_parallel_cross_entropy(local_logits, target, tp());
    loss.backward();
    const std::string label = std::string(" in ") + dtype_name(dtype);
    EXPECT_TRUE(close_overall(loss, expected.detach(), "loss" + label, 1e-5));
    EXPECT_TRUE(close_overall(gather_shards(local_logits.grad(), 1, tp_comm()), logits.grad(),
                              "logits grad" + label, 1e-5));
  }
}

// BERT tiny with a 1000-token vocabulary, 16 positions, no dropout: the full model runs the whole
// batch in one process; the tensor-parallel copy runs this rank's data-parallel share, its
// gradients averaged over the data-parallel group, then gathered back to full shapes.
TEST_F(TensorParallel, BertTinyLossesAndGradientsMatchTheUnshardedModel) {
  const int64_t batch = 4, seq_len = 16, vocab = 1000;
  manual_seed(61);
  models::BertConfig config =
      models::BertConfig::tiny().vocab_size(vocab).dropout(0).max_position_embeddings(32);
  models::BertForPreTraining full(config);
  // Non-zero biases and LayerNorm parameters so their slices are exercised.
  {
    NoGradGuard no_grad;
    for (auto& [name, parameter] : full.named_parameters()) {
      Tensor noise = mul(randn(parameter.sizes()), 0.02);
      parameter.copy_(add(parameter, noise));
    }
  }
  Tensor ids = randint(0, vocab, {batch, seq_len});
  Tensor types = randint(0, 2, {batch, seq_len});
  Tensor mask = ones({batch, seq_len}, DType::kInt64);
  {
    NoGradGuard no_grad;
    narrow(mask, 1, seq_len - 3, 3).copy_(zeros({batch, 3}, DType::kInt64));  // padding
  }
  // Four labelled positions in every sequence, so every data-parallel share's mean is over the
  // same count and the mean of the shares is the full batch's mean.
  std::vector<int64_t> labels(batch * seq_len, -100);
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t t : {1, 4, 7, 10}) labels[n * seq_len + t] = (n * 131 + t * 37) % vocab;
  Tensor mlm_labels = from_vector<int64_t>(labels, {batch, seq_len}, DType::kInt64);
  Tensor nsp_labels = from_vector<int64_t>({0, 1, 1, 0}, {batch}, DType::kInt64);

  auto sharded =
      models::shard_bert(full, tp());  // before the full model's backward: clean gradients

  models::BertPreTrainingOutput reference = full.forward(ids, types, mask);
  models::BertPreTrainingLoss reference_loss =
      models::bert_pretraining_loss(reference, mlm_labels, nsp_labels);
  reference_loss.total.backward();

  const int64_t share = batch / grid().dp_size(), first = grid().dp_index() * share;
  auto mine = [&](const Tensor& t) { return narrow(t, 0, first, share).contiguous(); };
  models::BertPreTrainingOutput output = sharded->forward(mine(ids), mine(types), mine(mask));
  EXPECT_EQ(output.vocab_group, tp());
  models::BertPreTrainingLoss loss =
      models::bert_pretraining_loss(output, mine(mlm_labels), mine(nsp_labels));
  loss.total.backward();

  Tensor logits = gather_shards(output.mlm_logits, 2, tp_comm());
  EXPECT_TRUE(close_overall(logits, mine(reference.mlm_logits.detach()), "mlm logits"));
  auto dp_mean = [&](const Tensor& t) {
    NoGradGuard no_grad;
    Tensor copy = t.detach().clone();
    grid().data_parallel()->all_reduce(copy, ReduceOp::kMean);
    return copy;
  };
  EXPECT_TRUE(close_overall(dp_mean(loss.mlm), reference_loss.mlm.detach(), "mlm loss"));
  EXPECT_TRUE(close_overall(dp_mean(loss.nsp), reference_loss.nsp.detach(), "nsp loss"));
  EXPECT_TRUE(close_overall(dp_mean(loss.total), reference_loss.total.detach(), "total loss"));

  std::map<std::string, Tensor> expected_grads;
  for (auto& [name, parameter] : full.named_parameters()) expected_grads[name] = parameter.grad();
  const auto split_dims = tensor_parallel_split_dims(*sharded);
  EXPECT_EQ(split_dims.count("bert.encoder.layer.0.attention.self.query.weight"), 1u);
  EXPECT_EQ(split_dims.count("cls.predictions.bias"), 1u);
  const auto named = sharded->named_parameters();
  EXPECT_EQ(named.size(), expected_grads.size());
  for (auto& [name, parameter] : named) {
    ASSERT_EQ(expected_grads.count(name), 1u) << name;
    Tensor grad = dp_mean(parameter.grad());
    auto split = split_dims.find(name);
    if (split != split_dims.end()) grad = gather_shards(grad, split->second, tp_comm());
    EXPECT_TRUE(close_overall(grad, expected_grads[name], name + " grad"));
  }
}

TEST_F(TensorParallel, AllToAllMovesASplitToAnotherDimAndBack) {
  // Over every rank: a tensor cut along one dim comes out cut along another, bitwise, and the
  // gradient goes back to the first cut.
  const int64_t world_group = register_tp_group(shared_world());
  const int parts = size();
  manual_seed(3);  // the same whole tensors on every rank
  Tensor whole = randn({2 * parts, 3, 5 * parts}, DType::kFloat64);
  Tensor upstream = randn({2 * parts, 3, 5 * parts}, DType::kFloat64);
  Tensor x = narrow(whole, 0, 2 * rank(), 2).contiguous().set_requires_grad(true);
  Tensor y = all_to_all_tp(x, /*split_dim=*/2, /*concat_dim=*/0, world_group);
  EXPECT_TRUE(bitwise_equal(y, narrow(whole, 2, 5 * rank(), 5)));
  sum(mul(y, narrow(upstream, 2, 5 * rank(), 5))).backward();
  EXPECT_TRUE(bitwise_equal(x.grad(), narrow(upstream, 0, 2 * rank(), 2)));

  // A strided input (a transposed view), moved from dim 2 to dim 1 (f32).
  Tensor whole_f = randn({4, 3 * parts, 2 * parts});
  Tensor shard = narrow(whole_f, 2, 2 * rank(), 2);  // not contiguous
  EXPECT_TRUE(bitwise_equal(all_to_all_tp(transpose(shard, 0, 2), 1, 0, world_group),
                            transpose(narrow(whole_f, 1, 3 * rank(), 3), 0, 2).contiguous()));

  EXPECT_TRUE(throws_error(
      [&] {
        all_to_all_tp(zeros({parts, 3}), 1, 0, world_group);
      },
      "is not divisible by the group size"));
  EXPECT_TRUE(throws_error(
      [&] {
        all_to_all_tp(zeros({parts, parts}), 1, 1, world_group);
      },
      "must be two different dims"));
}

TEST_F(TensorParallel, ReduceScatterSumsTheSummandsAndKeepsThisRanksPart) {
  // Over every rank: rank q holds summand q (small integers, so every order of the sum gives the
  // same bits); each gets its part of the sum along the dim asked for, and the gradient of every
  // summand is the whole upstream gradient, gathered from the ranks' parts.
  const int64_t world_group = register_tp_group(shared_world());
  const int parts = size();
  auto summand = [&](int q, const Shape& sizes) {
    manual_seed(40 + q);
    return randint(-8, 8, sizes, DType::kFloat64);
  };
  const Shape sizes{2, 3 * parts, 5};
  Tensor whole = zeros(sizes, DType::kFloat64);
  for (int q = 0; q < parts; ++q) whole = add(whole, summand(q, sizes));
  manual_seed(7);  // the same upstream gradient on every rank
  const Tensor upstream = randn(sizes, DType::kFloat64);
  Tensor x = summand(rank(), sizes).set_requires_grad(true);
  const Tensor y = reduce_scatter_to_tp(x, world_group, 1);
  EXPECT_TRUE(bitwise_equal(y, narrow(whole, 1, 3 * rank(), 3)));
  sum(mul(y, narrow(upstream, 1, 3 * rank(), 3))).backward();
  EXPECT_TRUE(bitwise_equal(x.grad(), upstream));

  // A strided input (a transposed view) cut along its first dim, f32.
  const Shape wide{5, 2 * parts};
  Tensor whole_f = zeros(wide);
  for (int q = 0; q < parts; ++q) whole_f = add(whole_f, summand(q, wide).to(DType::kFloat32));
  const Tensor mine = transpose(summand(rank(), wide).to(DType::kFloat32), 0, 1);
  EXPECT_TRUE(bitwise_equal(reduce_scatter_to_tp(mine, world_group, 0),
                            narrow(transpose(whole_f, 0, 1), 0, 2 * rank(), 2).contiguous()));

  // One reduce-scatter of the whole input, nothing else.
  auto counted = std::make_shared<CountingCommunicator>(shared_world());
  reduce_scatter_to_tp(zeros({parts, 4}), register_tp_group(counted), 0);
  ASSERT_EQ(counted->records.size(), 1u);
  EXPECT_EQ(counted->records[0].kind, "reduce_scatter");
  EXPECT_EQ(counted->records[0].bytes, parts * 4 * 4);

  EXPECT_TRUE(throws_error(
      [&] {
        reduce_scatter_to_tp(zeros({parts + 1, 3}), world_group, 0);
      },
      "is not divisible by the group size"));
  EXPECT_TRUE(throws_error([&] { reduce_scatter_to_tp(zeros({parts}), world_group, 1); },
                           "reduce_scatter_to_tp: dim"));
}

TEST(AllToAllSchedule, EveryPairMeetsOnceWithOneSenderFirst) {
  for (int size : {1, 2, 3, 4, 5, 8}) {
    std::vector<std::vector<AllToAllStep>> schedules;
    for (int rank = 0; rank < size; ++rank) schedules.push_back(all_to_all_schedule(rank, size));
    for (int rank = 0; rank < size; ++rank) {
      std::vector<int> peers;
      for (size_t round = 0; round < schedules[rank].size(); ++round) {
        const AllToAllStep step = schedules[rank][round];
        peers.push_back(step.peer);
        // In the same round the peer pairs back with this rank, and exactly one sends first.
        const AllToAllStep back = schedules[step.peer][round];
        EXPECT_EQ(back.peer, rank) << "size " << size << " round " << round;
        if (step.peer != rank) {
          EXPECT_NE(step.send_first, back.send_first);
        }
      }
      std::sort(peers.begin(), peers.end());
      for (int peer = 0; peer < size; ++peer) EXPECT_EQ(peers[peer], peer);
    }
  }
}

// Along another dim than the last (the channels of images): the same values and duals as
// gathering and cutting that dim by hand, for dense and for transposed inputs.
TEST_F(TensorParallel, GathersAndScattersAlongAnyDim) {
  const int rank = grid().tp_index();
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "transposed input" : "dense input");
    manual_seed(19 + rank);  // a different x on each tp rank
    Tensor base = randn({2, 3, 5}, DType::kFloat64);
    Tensor x = (transposed ? randn({2, 5, 3}, DType::kFloat64).transpose(1, 2) : base)
                   .detach()
                   .set_requires_grad(true);  // (2, 3, 5)
    manual_seed(23);                          // the same upstream gradient everywhere
    Tensor upstream = randn({2, 6, 5}, DType::kFloat64);
    Tensor gathered = gather_from_tp(x, tp(), 1);
    EXPECT_TRUE(close_overall(gathered, gather_shards(x.detach().contiguous(), 1, tp_comm()),
                              "gather along dim 1", 0, 0));
    sum(mul(gathered, upstream)).backward();
    EXPECT_TRUE(close_overall(x.grad(), narrow(upstream, 1, 3 * rank, 3), "its backward", 0, 0));

    Tensor y = (transposed ? randn({2, 5, 6}, DType::kFloat64).transpose(1, 2)
                           : randn({2, 6, 5}, DType::kFloat64))
                   .detach()
                   .set_requires_grad(true);  // the same on every rank
    Tensor scattered = scatter_to_tp(y, tp(), 1);
    EXPECT_TRUE(
        close_overall(scattered, narrow(y.detach(), 1, 3 * rank, 3), "scatter along dim 1", 0, 0));
    sum(mul(scattered, narrow(upstream, 1, 0, 3))).backward();
    Tensor expected = cat({narrow(upstream, 1, 0, 3), narrow(upstream, 1, 0, 3)}, 1);
    EXPECT_TRUE(close_overall(y.grad(), expected, "its backward", 0, 0));
  }
  EXPECT_TRUE(throws_error([] { gather_from_tp(zeros({2, 3}), tp(), 2); }, "dim"));
  EXPECT_TRUE(throws_error(
      [] {
        scatter_to_tp(zeros({3, 4}), tp(), 0);
      },
      "is not divisible by the group size 2"));
}

TEST_F(TensorParallel, SizesNotDivisibleByTheGroupAreClearErrors) {
  EXPECT_TRUE(throws_error([] { ColumnParallelLinear(4, 7, tp()); },
                           "out_features (7) must be a positive multiple of the tensor parallel"));
  EXPECT_TRUE(throws_error([] { RowParallelLinear(5, 4, tp()); }, "in_features (5)"));
  EXPECT_TRUE(throws_error([] { VocabParallelEmbedding(999, 4, tp()); }, "num_embeddings (999)"));
  EXPECT_TRUE(throws_error(
      [] {
        scatter_to_tp(zeros({2, 3}), tp());
      },
      "not divisible by the group size 2"));
  EXPECT_TRUE(throws_error([] { copy_to_tp(zeros({2}), 1 << 20); }, "unknown group id"));
  EXPECT_TRUE(throws_error(
      [] {
        models::BertForPreTraining bert(models::BertConfig::tiny()
                                            .vocab_size(1000)
                                            .num_attention_heads(1)
                                            .hidden_size(64)
                                            .intermediate_size(64)
                                            .num_hidden_layers(1));
        models::shard_bert(bert, tp());
      },
      "num_attention_heads (1)"));
}

TEST_F(TensorParallel, LoadShardsTakesThisRanksSliceAndNamesMismatches) {
  manual_seed(5);
  nn::Linear full(4, 6);
  ColumnParallelLinear column(4, 6, tp());
  load_shards(column, full, tp());
  const int64_t rank = tp_comm().rank();
  EXPECT_TRUE(bitwise_equal(column.weight, narrow(full.weight, 0, 3 * rank, 3)));
  EXPECT_TRUE(bitwise_equal(column.bias, narrow(full.bias, 0, 3 * rank, 3)));
  RowParallelLinear row(6, 4, tp());
  nn::Linear full_row(6, 4);
  load_shards(row, full_row, tp());
  EXPECT_TRUE(bitwise_equal(row.weight, narrow(full_row.weight, 1, 3 * rank, 3)));
  EXPECT_TRUE(bitwise_equal(row.bias, full_row.bias));  // replicated

  const Tensor before = column.weight.clone();
  EXPECT_TRUE(throws_error([&] { load_shards(column, nn::Linear(4, 8), tp()); },
                           "load_shards: weight has shape [3, 4] (split along dim 0) but the "
                           "full model's is [8, 4]"));
  nn::Linear no_bias(nn::LinearOptions(4, 6).bias(false));
  EXPECT_TRUE(throws_error([&] { load_shards(column, no_bias, tp()); },
                           "the full model has no tensor 'bias'"));
  // Every tensor is checked before any is copied.
  EXPECT_TRUE(bitwise_equal(column.weight, before));

  models::BertForPreTraining bert(models::BertConfig::tiny().vocab_size(64).num_hidden_layers(1));
  auto shard = models::shard_bert(bert, tp());
  EXPECT_TRUE(throws_error([&] { models::shard_bert(*shard, tp()); }, "already split over group"));
}

}  // namespace
}  // namespace tessel::parallel
