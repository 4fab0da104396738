#include "models/vision_parallel.h"

#include <map>

#include "core/autograd.h"
#include "core/error.h"
#include "core/shape.h"
#include "models/resnet.h"
#include "models/shufflenet.h"
#include "ops/ops.h"

namespace tessel::models {

using parallel::ChannelParallelConv2d;
using parallel::ColumnParallelLinear;
using parallel::gather_rows_from_tp;
using parallel::gather_shards;
using parallel::ReduceOp;
using parallel::RowParallelLinear;
using parallel::tp_group;
using parallel::vocab_parallel_cross_entropy;

namespace {

void copy_into(const Tensor& target, const Tensor& source) {
  NoGradGuard no_grad;
  Tensor copy = target;
  copy.copy_(source);
}

// ShuffleNet's conv5 batch norm split by channels with its convolution: weight, bias and running
// statistics hold this rank's channels.
class ChannelSplitBatchNorm2d : public nn::BatchNorm2d, public parallel::SplitParameters {
 public:
  using nn::BatchNorm2d::BatchNorm2d;
  std::map<std::string, int64_t> split_parameter_dims() const override {
    return {{"weight", 0}, {"bias", 0}, {"running_mean", 0}, {"running_var", 0}};
  }
};

}  // namespace

TensorParallelClassifier::TensorParallelClassifier(std::shared_ptr<nn::Module> full,
                                                   int64_t group_in, bool split_widest_conv)
    : nn::Module("TensorParallelClassifier"), group(group_in), full_(std::move(full)) {
  TESSEL_CHECK(full_ != nullptr, "TensorParallelClassifier: no model given");
  const auto& comm = tp_group(group);
  tp_size = comm->size();
  tp_rank = comm->rank();
  std::shared_ptr<nn::Linear> full_fc;
  if (auto* resnet = dynamic_cast<ResNet*>(full_.get())) {
    family_ = "resnet";
    full_fc = resnet->fc;
  } else if (auto* shufflenet = dynamic_cast<ShuffleNetV2*>(full_.get())) {
    family_ = "shufflenet";
    full_fc = shufflenet->fc;
  } else {
    TESSEL_FAIL("TensorParallelClassifier: expected a ResNet or a ShuffleNetV2, got a ",
                full_->name());
  }
  const int64_t classes = full_fc->weight.size(0);
  TESSEL_CHECK(split_widest_conv || classes % tp_size == 0,
               "TensorParallelClassifier: the class count (", classes,
               ") must be a multiple of the tensor parallel size ", tp_size,
               " (the classifier is split by classes)");
  TESSEL_CHECK(!split_widest_conv || family_ == "shufflenet",
               "TensorParallelClassifier: split_widest_conv splits ShuffleNet v2's conv5; for "
               "ResNet the trunk is split by batch only");
  // The trunk keeps the full model's names; fc becomes the column-parallel shard.
  for (const auto& [name, child] : full_->named_children()) {
    if (name == "fc" || (split_widest_conv && name == "conv5")) continue;
    register_module(name, child);
    for (const Tensor& p : child->parameters()) trunk_parameters_.push_back(p);
  }
  full_fc_ = full_fc;
  if (split_widest_conv) {
    auto& net = static_cast<ShuffleNetV2&>(*full_);
    const auto& conv = *net.conv5->at<nn::Conv2d>(0);
    const auto& norm = *net.conv5->at<nn::BatchNorm2d>(1);
    split_conv = std::make_shared<ChannelParallelConv2d>(conv, group, /*gather_output=*/false);
    const int64_t local = split_conv->weight.size(0);
    split_norm = std::make_shared<ChannelSplitBatchNorm2d>(
        nn::BatchNormOptions(local).eps(norm.options.eps()).momentum(norm.options.momentum()));
    split_norm->to(norm.weight.dtype());
    for (auto [target, source] :
         std::vector<std::pair<Tensor, Tensor>>{{split_norm->weight, norm.weight},
                                                {split_norm->bias, norm.bias},
                                                {split_norm->running_mean, norm.running_mean},
                                                {split_norm->running_var, norm.running_var}})
      copy_into(target, narrow(source, 0, tp_rank * local, local));
    copy_into(split_norm->num_batches_tracked, norm.num_batches_tracked);
    split_head_ = register_module(
        "conv5",
        std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
            split_conv, split_norm, std::make_shared<nn::ReLU>()}));
    row_fc = register_module("fc", std::make_shared<RowParallelLinear>(
                                       full_fc->weight.size(1), classes, group,
                                       full_fc->bias.defined(), /*input_is_parallel=*/true));
    row_fc->to(full_fc->weight.dtype());
    row_fc->load_from(*full_fc);
    return;
  }
  fc = register_module("fc", std::make_shared<ColumnParallelLinear>(
                                 full_fc->weight.size(1), classes, group, full_fc->bias.defined(),
                                 /*gather_output=*/false));
  fc->to(full_fc->weight.dtype());  // the shard keeps the full layer's dtype
  fc->load_from(*full_fc);
}

void TensorParallelClassifier::gather_into_full_model() {
  NoGradGuard no_grad;
  auto& comm = *tp_group(group);
  if (split_head_) {
    auto& net = static_cast<ShuffleNetV2&>(*full_);
    auto& conv = *net.conv5->at<nn::Conv2d>(0);
    auto& norm = *net.conv5->at<nn::BatchNorm2d>(1);
    copy_into(conv.weight, gather_shards(split_conv->weight, 0, comm));
    for (auto [target, source] :
         std::vector<std::pair<Tensor, Tensor>>{{norm.weight, split_norm->weight},
                                                {norm.bias, split_norm->bias},
                                                {norm.running_mean, split_norm->running_mean},
                                                {norm.running_var, split_norm->running_var}})
      copy_into(target, gather_shards(source, 0, comm));
    copy_into(norm.num_batches_tracked, split_norm->num_batches_tracked);
    copy_into(full_fc_->weight, gather_shards(row_fc->weight, 1, comm));
    if (row_fc->bias.defined()) copy_into(full_fc_->bias, row_fc->bias);
    return;
  }
  copy_into(full_fc_->weight, gather_shards(fc->weight, 0, comm));
  if (fc->bias.defined()) copy_into(full_fc_->bias, gather_shards(fc->bias, 0, comm));
}

Tensor TensorParallelClassifier::trunk(const Tensor& x) {
  if (family_ == "resnet") {
    auto& net = static_cast<ResNet&>(*full_);
    Tensor out = net.maxpool->forward(net.relu->forward(net.bn1->forward(net.conv1->forward(x))));
    out = net.layer4->forward(net.layer3->forward(net.layer2->forward(net.layer1->forward(out))));
    return flatten(net.avgpool->forward(out), 1);
  }
  auto& net = static_cast<ShuffleNetV2&>(*full_);
  Tensor out = net.maxpool->forward(net.conv1->forward(x));
  out = net.conv5->forward(net.stage4->forward(net.stage3->forward(net.stage2->forward(out))));
  return mean(out, {2, 3});
}

Tensor TensorParallelClassifier::forward(const Tensor& images) {
  TESSEL_CHECK(images.dim() == 4, "TensorParallelClassifier: expected images (N, C, H, W), got ",
               shape_str(images.sizes()));
  const int64_t rows = images.size(0);
  TESSEL_CHECK(rows % tp_size == 0, "TensorParallelClassifier: the batch (", rows,
               " rows on this data-parallel rank) must be a multiple of the tensor parallel "
               "size ",
               tp_size, " (the convolutions split the batch)");
  const int64_t local = rows / tp_size;
  if (split_head_) {
    // Batch-split up to conv5, then every row through this rank's channels of conv5.
    auto& net = static_cast<ShuffleNetV2&>(*full_);
    Tensor out =
        net.maxpool->forward(net.conv1->forward(narrow(images, 0, tp_rank * local, local)));
    out = net.stage4->forward(net.stage3->forward(net.stage2->forward(out)));
    const Tensor head = split_head_->forward(gather_rows_from_tp(out, group));
    return row_fc->forward(mean(head, {2, 3}));
  }
  Tensor features = trunk(narrow(images, 0, tp_rank * local, local));
  // Every rank classifies every row for its classes; ColumnParallelLinear's copy_to_tp sums the
  // features' gradient over the classes, and the gather's backward keeps this rank's rows.
  return fc->forward(gather_rows_from_tp(features, group));
}

Tensor TensorParallelClassifier::loss(const Tensor& logits, const Tensor& targets) const {
  if (split_head_) return cross_entropy(logits, targets);
  return vocab_parallel_cross_entropy(logits, targets, group);
}

Tensor TensorParallelClassifier::gather_logits(const Tensor& logits) const {
  NoGradGuard no_grad;
  if (split_head_) return logits.detach();
  return gather_shards(logits, 1, *tp_group(group));
}

void TensorParallelClassifier::reduce_trunk_gradients() {
  NoGradGuard no_grad;
  std::map<DType, std::vector<Tensor>> by_dtype;
  for (const Tensor& p : trunk_parameters_)
    if (p.grad().defined()) by_dtype[p.dtype()].push_back(p.grad());
  auto& comm = *tp_group(group);
  for (auto& [dtype, grads] : by_dtype) {
    std::vector<Tensor> flat;
    for (const Tensor& g : grads) flat.push_back(g.reshape({-1}));
    Tensor buffer = cat(flat, 0);
    comm.all_reduce(buffer, ReduceOp::kSum);
    int64_t offset = 0;
    for (const Tensor& g : grads) {
      copy_into(g, buffer.narrow(0, offset, g.numel()).view(g.sizes()));
      offset += g.numel();
    }
  }
}

}  // namespace tessel::models
