#include "parallel/communicator.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace tessel::parallel {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

int64_t part_rows(int64_t rows, int parts, int index) {
  TESSEL_CHECK(parts >= 1, "part_rows: expected at least one part, got ", parts);
  TESSEL_CHECK(index >= 0 && index < parts, "part_rows: part ", index, " out of range for ", parts,
               " parts");
  TESSEL_CHECK(rows >= 0, "part_rows: negative row count ", rows);
  return rows / parts + (index < rows % parts ? 1 : 0);
}

int64_t part_start(int64_t rows, int parts, int index) {
  TESSEL_CHECK(parts >= 1, "part_start: expected at least one part, got ", parts);
  TESSEL_CHECK(index >= 0 && index <= parts, "part_start: part ", index, " out of range for ",
               parts, " parts");
  int64_t base = rows / parts;
  int64_t extra = rows % parts;
  return index * base + std::min<int64_t>(index, extra);
}

double collective_timeout_from_env() {
  const char* text = std::getenv("TESSEL_COLLECTIVE_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return 300.0;
  char* end = nullptr;
  errno = 0;
  double seconds = std::strtod(text, &end);
  TESSEL_CHECK(errno == 0 && end != text && *end == '\0' && std::isfinite(seconds) && seconds > 0,
               "TESSEL_COLLECTIVE_TIMEOUT_S must be a positive number of seconds, got '", text,
               "'");
  return seconds;
}

}  // namespace tessel::parallel
