// ResNet and ShuffleNet v2 split over a tensor-parallel group: batch-split convolutions for the
// trunk, a classifier split by classes with the vocabulary-parallel cross-entropy, and
// ShuffleNet's widest convolution split by output channels (parallel/vision_parallel.h).
//   TensorParallelClassifier net(full_resnet, tp_group_id);  loss = net.loss(net.forward(x), y);
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/nn.h"
#include "parallel/tensor_parallel.h"
#include "parallel/vision_parallel.h"

namespace tessel::models {

// A ResNet or ShuffleNet v2 split over a tensor-parallel group (named like the full model, so
// its parameter names are the full model's):
// - the convolutional trunk runs batch-split: each rank convolves its rows of the group's batch
//   with replicated weights, whose gradients reduce_trunk_gradients() sums over the group (batch
//   norm uses each rank's rows, as data parallelism does);
// - the features are gathered by rows and the classifier `fc` is column parallel (classes
//   split), scored by vocab_parallel_cross_entropy.
// With split_widest_conv (ShuffleNet v2 only), the widest convolution, conv5 (1x1 to 1024
// channels), is split by output channels instead: the rows are gathered before it, each rank
// convolves every row into its channels and batch norm normalises its channels over all the
// group's rows; the classifier is then row parallel (input features split) and the logits come
// out whole, scored by plain cross_entropy.
class TensorParallelClassifier : public nn::Module {
 public:
  // `full` must be a models::ResNet or models::ShuffleNetV2 whose class count is divisible by
  // the group size; its modules are shared, not copied (fc is replaced by its shard).
  TensorParallelClassifier(std::shared_ptr<nn::Module> full, int64_t group,
                           bool split_widest_conv = false);
  // images (N, C, H, W), the same on every rank of the group, N divisible by the group size ->
  // logits (N, classes / tp): this rank's classes for every row (with split_widest_conv,
  // (N, classes): every class).
  Tensor forward(const Tensor& images) override;
  // Mean cross-entropy over the N rows (the same value on every rank of the group).
  Tensor loss(const Tensor& logits, const Tensor& targets) const;
  // Every class's logits (N, classes), without autograd (evaluation).
  Tensor gather_logits(const Tensor& logits) const;
  // Sums the trunk's (replicated) parameter gradients over the group; call after backward.
  // Gradients already dropped (ZeRO stages 2 and 3, which sum these first: sum_gradients_over)
  // are left out.
  void reduce_trunk_gradients();
  const std::vector<Tensor>& trunk_parameters() const { return trunk_parameters_; }
  // The full model (sharing the trunk); gather_into_full_model writes every class's weights into
  // its fc (a collective over the group), so it evaluates as this model does.
  const std::shared_ptr<nn::Module>& full_model() const { return full_; }
  void gather_into_full_model();

  int64_t group;
  int tp_size, tp_rank;
  std::shared_ptr<parallel::ColumnParallelLinear> fc;  // null with split_widest_conv
  // With split_widest_conv: conv5's convolution and batch norm split by channels, and the
  // row-parallel classifier.
  std::shared_ptr<parallel::ChannelParallelConv2d> split_conv;
  std::shared_ptr<nn::BatchNorm2d> split_norm;
  std::shared_ptr<parallel::RowParallelLinear> row_fc;

 private:
  Tensor trunk(const Tensor& rows);  // this rank's rows -> (n, features)
  std::shared_ptr<nn::Module> full_;
  std::shared_ptr<nn::Linear> full_fc_;
  std::shared_ptr<nn::Sequential> split_head_;  // conv5 split by channels
  std::string family_;                          // "resnet" or "shufflenet"
  std::vector<Tensor> trunk_parameters_;
};

}  // namespace tessel::models
