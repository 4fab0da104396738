#include "cuda/index_error.h"

#include "core/error.h"

namespace tessel::cuda {

std::string index_error_message(const IndexError& error, int device) {
  const std::string where = detail::str_cat(
      "found on cuda:", device,
      " by the op's check on the device and reported at the next synchronisation point");
  const std::string valid = error.size > 0 ? detail::str_cat("0..", error.size - 1) : "none";
  switch (error.op) {
    case IndexOp::kEmbedding:
      return detail::str_cat("embedding: index ", error.value,
                             " is out of range for an embedding table of size ", error.size,
                             " (valid: ", valid, "; ", where, ")");
    case IndexOp::kIndexSelect:
    case IndexOp::kGather:
      return detail::str_cat(error.op == IndexOp::kGather ? "gather" : "index_select", ": index ",
                             error.value, " is out of range for dimension ", error.dim, " of size ",
                             error.size, " (valid: ", valid, "; ", where, ")");
    case IndexOp::kCrossEntropy:
    case IndexOp::kNllLoss:
      return detail::str_cat(error.op == IndexOp::kNllLoss ? "nll_loss" : "cross_entropy",
                             ": target ", error.value, " (at flat index ", error.position,
                             ") is out of range for ", error.size, " classes; expected ", valid,
                             " or ignore_index ", error.ignore_index, " (", where, ")");
    case IndexOp::kNone:
      break;
  }
  return detail::str_cat("an index op on cuda:", device, " read index ", error.value,
                         " at flat index ", error.position, ", outside 0..", error.size - 1);
}

}  // namespace tessel::cuda
