// linear_cross_entropy: cross_entropy(linear(x, weight, bias), target) in chunks of rows, so the
// (rows, classes) logits are never whole. A language model's head over a vocabulary of 30522
// holds two such tensors at once otherwise (the logits and their log-probabilities, then the
// log-probabilities and their gradient), the largest working set of a BERT training step.
//
// The loss is a scalar at the end of the graph, so each chunk's gradients are taken in the
// forward pass, while its logits exist, and summed; the backward node only scales them by the
// loss's gradient. Every chunk runs through the ordinary ops (linear, cross_entropy and its
// backward, matmul; the weight gradient sums into one tensor through addmm), so it works on every
// device and the memory layer sees each chunk's tensors.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "ops/loss.h"
#include "ops/ops.h"

namespace tessel {

namespace {

// The backward of linear_cross_entropy: the gradients taken in the forward pass, scaled by the
// loss's gradient. One per input (x, weight, bias); undefined where none was wanted.
class LinearCrossEntropyNode : public Node {
 public:
  explicit LinearCrossEntropyNode(std::vector<Tensor> grads) : grads_(std::move(grads)) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    TESSEL_CHECK(!released_,
                 "linear_cross_entropy: backward ran twice through the same graph; pass "
                 "retain_graph=true to the first backward call");
    const Tensor& grad_loss = grad_outputs.at(0);
    std::vector<Tensor> result(grads_.size());
    if (!grad_loss.defined()) return result;
    for (size_t i = 0; i < grads_.size(); ++i)
      if (grads_[i].defined()) result[i] = mul(grads_[i], grad_loss);
    return result;
  }
  std::string name() const override { return "linear_cross_entropy_backward"; }
  void release_saved() override {
    grads_.clear();
    released_ = true;
  }

 private:
  std::vector<Tensor> grads_;
  bool released_ = false;
};

// The logits of a chunk are about this size, or the size of x when x is larger: large enough
// for an efficient matrix product, small beside the whole logits of a large vocabulary.
constexpr int64_t kChunkLogitsBytes = int64_t{16} << 20;

int64_t default_chunk_rows(const Tensor& x, int64_t classes) {
  const int64_t row_bytes = classes * static_cast<int64_t>(x.element_size());
  const int64_t chunk_bytes = std::max<int64_t>(kChunkLogitsBytes, x.nbytes());
  return std::max<int64_t>(1, chunk_bytes / std::max<int64_t>(1, row_bytes));
}

void check_inputs(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& target,
                  const std::string& reduction, int64_t chunk_rows) {
  TESSEL_CHECK(x.defined() && weight.defined() && target.defined(),
               "linear_cross_entropy: x, weight and target must be defined");
  TESSEL_CHECK(x.dim() == 2, "linear_cross_entropy: expected x of shape (rows, in_features), got ",
               shape_str(x.sizes()), " (flatten the leading dimensions with reshape({-1, in}))");
  TESSEL_CHECK(weight.dim() == 2 && weight.size(1) == x.size(1),
               "linear_cross_entropy: expected weight of shape (classes, ", x.size(1), "), got ",
               shape_str(weight.sizes()));
  TESSEL_CHECK(weight.size(0) > 0, "linear_cross_entropy: weight has no classes");
  TESSEL_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
               "linear_cross_entropy: expected bias of shape (", weight.size(0), "), got ",
               shape_str(bias.sizes()));
  TESSEL_CHECK(target.sizes() == Shape{x.size(0)}, "linear_cross_entropy: target has shape ",
               shape_str(target.sizes()), " but x has ", x.size(0),
               " rows; expected target shape (", x.size(0), ")");
  TESSEL_CHECK(reduction == "mean" || reduction == "sum",
               "linear_cross_entropy: reduction must be \"mean\" or \"sum\", got \"", reduction,
               "\" (per-row losses need the whole logits: use cross_entropy(linear(x, weight, "
               "bias), target, ..., \"none\"))");
  TESSEL_CHECK(chunk_rows >= 0,
               "linear_cross_entropy: chunk_rows must be >= 0 (0: automatic), got ", chunk_rows);
}

// `grad` in the dtype of the input it belongs to (autocast may have computed it in another).
Tensor as_dtype_of(const Tensor& grad, const Tensor& input) {
  return grad.dtype() == input.dtype() ? grad : to_dtype(grad, input.dtype());
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& target, int64_t ignore_index, double label_smoothing,
                            const std::string& reduction, int64_t chunk_rows) {
  check_inputs(x, weight, bias, target, reduction, chunk_rows);
  const int64_t rows = x.size(0), classes = weight.size(0);
  const bool record = GradMode::is_enabled();
  const bool needs_x = record && x.requires_grad();
  const bool needs_weight = record && weight.requires_grad();
  const bool needs_bias = record && bias.defined() && bias.requires_grad();
  const bool needs_grad = needs_x || needs_weight || needs_bias;
  if (chunk_rows == 0) chunk_rows = default_chunk_rows(x, classes);

  NoGradGuard no_grad;
  Attrs attrs{{"ignore_index", ignore_index},
              {"reduction", std::string("sum")},
              {"label_smoothing", label_smoothing}};
  // Every chunk's loss is a sum over its rows; "mean" divides by the rows not ignored, over all
  // chunks, which also scales each chunk's gradient.
  const DType loss_dtype = x.dtype() == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  Tensor scale = ones({}, TensorOptions(loss_dtype).device(x.device()));
  if (reduction == "mean") scale = div(scale, sum(to_dtype(ne(target, ignore_index), loss_dtype)));

  Tensor loss, grad_x, grad_weight, grad_bias;
  if (needs_x && chunk_rows < rows)
    grad_x = zeros(x.sizes(), TensorOptions(x.dtype()).device(x.device()));
  for (int64_t begin = 0; begin < rows; begin += chunk_rows) {
    const int64_t length = std::min(chunk_rows, rows - begin);
    const Tensor x_chunk = x.narrow(0, begin, length);
    const Tensor target_chunk = target.narrow(0, begin, length);
    const Tensor logits = linear(x_chunk, weight, bias);
    std::vector<Tensor> scored = dispatch(ops::cross_entropy, {logits, target_chunk}, attrs);
    loss = loss.defined() ? add(loss, scored[0]) : scored[0];
    if (!needs_grad) continue;
    Tensor grad_logits =
        dispatch(ops::cross_entropy_backward, {scale, scored[1], target_chunk}, attrs)[0];
    scored.clear();  // the log-probabilities go before the products below allocate
    if (needs_x) {
      Tensor part = as_dtype_of(matmul(grad_logits, weight), x);
      if (grad_x.defined()) {
        grad_x.narrow(0, begin, length).copy_(part);
      } else {
        grad_x = part;  // one chunk: the whole gradient
      }
    }
    if (needs_weight) {
      if (!grad_weight.defined()) {
        grad_weight = as_dtype_of(matmul(grad_logits.t(), x_chunk), weight);
      } else if (grad_logits.dtype() == grad_weight.dtype() &&
                 x_chunk.dtype() == grad_weight.dtype()) {
        grad_weight.addmm_(grad_logits.t(), x_chunk);  // no temporary for the chunk's product
      } else {
        grad_weight.add_(as_dtype_of(matmul(grad_logits.t(), x_chunk), weight));  // autocast
      }
    }
    if (needs_bias) {
      Tensor part = as_dtype_of(sum(grad_logits, {0}), bias);
      if (grad_bias.defined()) {
        grad_bias.add_(part);
      } else {
        grad_bias = part;
      }
    }
  }
  if (reduction == "mean") loss = mul(loss, scale);
  if (!needs_grad) return loss;

  // The loss becomes the output of a node whose inputs are x, weight and bias.
  auto node = std::make_shared<LinearCrossEntropyNode>(
      std::vector<Tensor>{grad_x, grad_weight, needs_bias ? grad_bias : Tensor()});
  node->sequence_nr = next_sequence_nr();
  for (const Tensor* input : {&x, &weight, &bias}) {
    const bool needs = input->defined() && input->requires_grad();
    node->next_edges.push_back(needs ? gradient_edge(*input) : Edge{});
  }
  node->output_specs.push_back({loss.sizes(), loss.dtype()});
  node->output_devices.push_back(loss.device());
  node->pre_hooks.resize(1);
  TensorImpl* impl = loss.impl();
  impl->requires_grad = true;
  impl->grad_fn = node;
  impl->output_nr = 0;
  return loss;
}

}  // namespace tessel
