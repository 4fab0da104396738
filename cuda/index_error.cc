#include "cuda/index_error.h"

#include "ops/index.h"
#include "ops/loss.h"

namespace tessel::cuda {

std::string index_error_message(const IndexError& error, int device) {
  using std::to_string;
  const std::string where =
      "found on cuda:" + to_string(device) +
      " by the op's check on the device and reported at the next synchronisation point";
  const std::string valid = error.size > 0 ? "0.." + to_string(error.size - 1) : "none";
  switch (error.op) {
    case IndexOp::kEmbedding:
      return std::string(ops::embedding.name()) + ": index " + to_string(error.value) +
             " is out of range for an embedding table of size " + to_string(error.size) +
             " (valid: " + valid + "; " + where + ")";
    case IndexOp::kIndexSelect:
    case IndexOp::kGather:
      return std::string(error.op == IndexOp::kGather ? ops::gather.name()
                                                      : ops::index_select.name()) +
             ": index " + to_string(error.value) + " is out of range for dimension " +
             to_string(error.dim) + " of size " + to_string(error.size) + " (valid: " + valid +
             "; " + where + ")";
    case IndexOp::kCrossEntropy:
    case IndexOp::kNllLoss:
      return std::string(error.op == IndexOp::kNllLoss ? ops::nll_loss.name()
                                                       : ops::cross_entropy.name()) +
             ": target " + to_string(error.value) + " (at flat index " + to_string(error.position) +
             ") is out of range for " + to_string(error.size) + " classes; expected " + valid +
             " or ignore_index " + to_string(error.ignore_index) + " (" + where + ")";
    case IndexOp::kNone:
      break;
  }
  return "an index op on cuda:" + to_string(device) + " read index " + to_string(error.value) +
         " at flat index " + to_string(error.position) + ", outside 0.." +
         to_string(error.size - 1);
}

}  // namespace tessel::cuda
