// Embedding: a lookup table of num_embeddings rows of size embedding_dim, initialised N(0, 1)
// with the padding_idx row zero (that row also gets no gradient).
//   auto tokens = std::make_shared<Embedding>(EmbeddingOptions(30522, 256).padding_idx(0));
#pragma once

#include <optional>
#include <string>

#include "core/arg.h"
#include "nn/module.h"

namespace tessel::nn {

class EmbeddingOptions {
 public:
  EmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }

  // A negative index counts from the end, as in PyTorch.
  TESSEL_ARG(std::optional<int64_t>, padding_idx);

 private:
  int64_t num_embeddings_;
  int64_t embedding_dim_;
};

class Embedding : public Module {
 public:
  explicit Embedding(const EmbeddingOptions& options);
  // indices (...) of i64 -> (..., embedding_dim)
  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;
  void reset_parameters();

  EmbeddingOptions options;
  Tensor weight;             // (num_embeddings, embedding_dim)
  int64_t padding_idx = -1;  // normalised to [0, num_embeddings), -1 for none

 protected:
  // For tables that hold a part of a larger one (the tensor-parallel shards): a zero table of
  // these sizes named `name`, filled from the full table, so nothing is drawn.
  Embedding(const std::string& name, const EmbeddingOptions& options);
};

}  // namespace tessel::nn
