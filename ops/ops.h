// Every op Tensor offers, as free functions (libtorch style). Each goes through the
// dispatcher (core/op.h) under the registry name given in brackets, so autograd, op records,
// meta tracing and splitting apply to all of them.
//   Tensor y = tessel::relu(tessel::linear(x, w, b));
//   Tensor loss = tessel::cross_entropy(logits, labels);
#pragma once

#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace tessel {

// ---- creation [full, arange, rand, randn, randint] ----
Tensor full(const Shape& sizes, double value, TensorOptions options = {});
Tensor zeros(const Shape& sizes, TensorOptions options = {});
Tensor ones(const Shape& sizes, TensorOptions options = {});
Tensor zeros_like(const Tensor& like);
Tensor ones_like(const Tensor& like);
Tensor full_like(const Tensor& like, double value);
Tensor arange(int64_t end, TensorOptions options = DType::kInt64);
Tensor arange(double start, double end, double step = 1.0, TensorOptions options = DType::kFloat32);
// Random: Philox counters from the global generator (core/rng.h).
Tensor rand(const Shape& sizes, TensorOptions options = {});   // uniform [0, 1)
Tensor randn(const Shape& sizes, TensorOptions options = {});  // standard normal
Tensor randint(int64_t low, int64_t high, const Shape& sizes,
               TensorOptions options = DType::kInt64);
// Uniform in [low, high), in place (initialisers).
Tensor& uniform_(Tensor& tensor, double low, double high);
Tensor& normal_(Tensor& tensor, double mean, double stddev);

// ---- copies and conversion [clone, contiguous, to_dtype, copy_] ----
Tensor clone(const Tensor& x);
Tensor contiguous(const Tensor& x);  // x itself when already contiguous
Tensor to_dtype(const Tensor& x, DType dtype);

// ---- element-wise binary, with broadcasting and type promotion [add sub mul div pow maximum
// minimum] ----
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// Scalar forms keep the tensor's dtype [add_scalar mul_scalar pow_scalar ...]
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);
Tensor operator-(const Tensor& a);

// ---- element-wise unary [neg abs exp log sqrt rsqrt tanh sigmoid relu gelu clamp] ----
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// approximate: "none" (erf form) or "tanh".
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
// Either bound may be omitted with -inf / +inf.
Tensor clamp(const Tensor& x, double min, double max);

// ---- selection and comparison (comparisons return bool) [where masked_fill eq ne lt le gt ge]
// ----
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
// A scalar compares in a's dtype when that is floating point, else in i64 (a whole number) or
// f64 (a fraction): eq(int_tensor, 2.5) is false everywhere.
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);
// Element-wise, as in libtorch: (x > 0) is a bool tensor, not a bool.
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator==(const Tensor& a, double b);
Tensor operator!=(const Tensor& a, double b);
Tensor operator<(const Tensor& a, double b);
Tensor operator<=(const Tensor& a, double b);
Tensor operator>(const Tensor& a, double b);
Tensor operator>=(const Tensor& a, double b);
Tensor operator==(double a, const Tensor& b);
Tensor operator!=(double a, const Tensor& b);
Tensor operator<(double a, const Tensor& b);
Tensor operator<=(double a, const Tensor& b);
Tensor operator>(double a, const Tensor& b);
Tensor operator>=(double a, const Tensor& b);

// ---- reductions; empty dims means all [sum mean max min argmax var] ----
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);  // values
Tensor min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // over all elements
Tensor min(const Tensor& x);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // i64
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, bool unbiased = true,
           bool keepdim = false);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// ---- views: share storage, no copy [reshape transpose permute slice expand squeeze unsqueeze]
// ----
Tensor reshape(
    const Tensor& x,
    const Shape& sizes);  // copies only when x's strides do not allow a view; one -1 allowed
Tensor view(const Tensor& x, const Shape& sizes);  // never copies; an error when impossible
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor expand(const Tensor& x, const Shape& sizes);  // -1 keeps a size
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);

// ---- joining and indexing [cat stack index_select gather] ----
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);  // views
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);      // views
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);  // index: i64 or i32, 1-D
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);

// ---- linear algebra [matmul bmm linear addmm] ----
Tensor matmul(const Tensor& a,
              const Tensor& b);                // 1-D, 2-D and batched (broadcast) like torch.matmul
Tensor bmm(const Tensor& a, const Tensor& b);  // (B,n,k) x (B,k,m)
Tensor linear(const Tensor& x, const Tensor& weight,
              const Tensor& bias = Tensor());  // x W^T + b, W (out,in)
// c + a b for c (n,m), a (n,k), b (k,m), one GEMM; c.addmm_(a, b) accumulates into c in place
// without a temporary for the product (a sum of products over chunks, say).
Tensor addmm(const Tensor& c, const Tensor& a, const Tensor& b);

// ---- convolution and pooling, NCHW [conv2d max_pool2d avg_pool2d adaptive_avg_pool2d] ----
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0},
              std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1);
Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0, 0},
                  std::vector<int64_t> dilation = {1, 1}, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel_size,
                  std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0, 0},
                  bool ceil_mode = false, bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& x, std::vector<int64_t> output_size);

// ---- normalisation, embedding, dropout [batch_norm layer_norm embedding dropout] ----
// Training: normalises with batch statistics and updates running_mean/var in place (a declared
// side effect, never repeated on recompute). Eval: uses the running statistics.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum = 0.1, double eps = 1e-5);
// Eval batch_norm and relu in one pass over x, the bits of relu(batch_norm(..., false, ...)):
// for inference only (an error where an input would need a gradient).
Tensor batch_norm_relu_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var,
                            double eps = 1e-5);
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx = -1);
Tensor dropout(const Tensor& x, double p, bool training);

// ---- losses [cross_entropy nll_loss mse_loss] ----
// reduction: "mean", "sum" or "none". Targets are class indices (i64).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, const std::string& reduction = "mean");
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100,
                const std::string& reduction = "mean");
Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");
// cross_entropy(linear(x, weight, bias), target, ...) for x (rows, in) and weight (classes, in),
// computed in chunks of `chunk_rows` rows so the (rows, classes) logits never exist whole: the
// loss head of a large vocabulary without its largest tensors. Each chunk's gradients are taken
// in the forward pass (no extra work: the backward only scales them), so reduction is "mean" or
// "sum". chunk_rows 0: rows enough for about 16 MiB of logits per chunk (more when x is larger).
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& target, int64_t ignore_index = -100,
                            double label_smoothing = 0.0, const std::string& reduction = "mean",
                            int64_t chunk_rows = 0);

}  // namespace tessel
