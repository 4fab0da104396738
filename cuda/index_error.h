// A bad index found on a GPU: index-reading kernels (embedding, index_select, gather, the class
// losses) check their indices on the device and record the first bad one here instead of making
// the host wait; the next synchronisation point reports it as a tessel::Error (as PyTorch's
// device-side asserts are reported). Plain data, shared by the kernels and the host.
#pragma once

#include <cstdint>
#include <string>

namespace tessel::cuda {

enum class IndexOp : int32_t {
  kNone = 0,  // nothing recorded
  kEmbedding,
  kIndexSelect,
  kGather,
  kCrossEntropy,
  kNllLoss,
};

struct IndexError {
  IndexOp op = IndexOp::kNone;
  int32_t dim = 0;           // index_select, gather: the dimension indexed
  int64_t size = 0;          // valid indices are 0..size-1 (classes, for the losses)
  int64_t ignore_index = 0;  // cross_entropy, nll_loss: a target that is valid too
  int64_t position = 0;      // flat position of the bad index in its tensor
  int64_t value = 0;         // the bad index
};

#ifdef __CUDACC__
#define TESSEL_INDEX_ERROR_HD __host__ __device__
#else
#define TESSEL_INDEX_ERROR_HD
#endif

// Whether `value` is a valid index for the op described by `check` (op, dim, size, ignore_index).
TESSEL_INDEX_ERROR_HD inline bool index_is_valid(const IndexError& check, int64_t value) {
  const bool has_ignore = check.op == IndexOp::kCrossEntropy || check.op == IndexOp::kNllLoss;
  return (value >= 0 && value < check.size) || (has_ignore && value == check.ignore_index);
}

// The message of the CPU kernels for the same bad index, with the valid range and where it was
// found, e.g. "embedding: index 7 is out of range for an embedding table of size 4 (valid: 0..3;
// found on cuda:0 by the op's check on the device and reported at the next synchronisation
// point)".
std::string index_error_message(const IndexError& error, int device);

}  // namespace tessel::cuda
