#include "nn/embedding.h"

#include "core/autograd.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace tessel::nn {

Embedding::Embedding(const EmbeddingOptions& options_in) : Embedding("Embedding", options_in) {
  reset_parameters();
}

Embedding::Embedding(const std::string& name, const EmbeddingOptions& options_in)
    : Module(name), options(options_in) {
  const int64_t rows = options.num_embeddings();
  TESSEL_CHECK(rows > 0 && options.embedding_dim() > 0, name,
               ": num_embeddings and embedding_dim must be positive, got ", rows, " and ",
               options.embedding_dim());
  if (options.padding_idx()) {
    int64_t index = *options.padding_idx();
    TESSEL_CHECK(index >= -rows && index < rows, name, ": padding_idx ", index,
                 " is out of range for num_embeddings=", rows, " (expected ", -rows, " to ",
                 rows - 1, ")");
    padding_idx = index < 0 ? index + rows : index;
  }
  weight = register_parameter("weight", zeros({rows, options.embedding_dim()}));
}

void Embedding::reset_parameters() {
  init::normal_(weight);
  if (padding_idx >= 0) {
    NoGradGuard no_grad;
    weight.select(0, padding_idx).zero_();
  }
}

Tensor Embedding::forward(const Tensor& indices) {
  TESSEL_CHECK(!is_floating(indices.dtype()), "Embedding: indices must be integers (i64), got ",
               dtype_name(indices.dtype()));
  return embedding(weight, indices, padding_idx);
}

std::string Embedding::extra_repr() const {
  std::string text =
      std::to_string(options.num_embeddings()) + ", " + std::to_string(options.embedding_dim());
  if (padding_idx >= 0) text += ", padding_idx=" + std::to_string(padding_idx);
  return text;
}

}  // namespace tessel::nn
