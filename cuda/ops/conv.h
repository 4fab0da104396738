// What the cuDNN convolution kernels (cuda/ops/conv.cu) report about their algorithm choice:
// the search runs once per (pass, shapes, dtype, attributes, device) and is cached.
//   cuda::clear_conv_algorithm_cache();  conv2d(x, w);  conv_algorithm_stats().searches == 1
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessel::cuda {

struct ConvAlgorithmStats {
  int64_t searches = 0;            // cache misses: an algorithm search ran
  int64_t cache_hits = 0;          // calls that reused a cached choice
  int64_t heuristic_rankings = 0;  // misses under a memory policy: cuDNN's heuristics, no search
  int64_t fallbacks = 0;      // calls that skipped a faster algorithm whose workspace did not fit
  size_t last_workspace = 0;  // workspace bytes of the algorithm the last call ran
};

// Whether a convolution shape met for the first time times cuDNN's algorithms and takes the
// fastest (true, the default; TESSEL_CUDNN_SEARCH=0 starts with false) or takes cuDNN's heuristic
// ranking, which depends on the shapes alone: the same algorithms on every run, whatever memory is
// free. Rankings already cached stay.
void set_conv_algorithm_search(bool enabled);
bool conv_algorithm_search();

ConvAlgorithmStats conv_algorithm_stats();
// Forgets every cached choice and zeroes the statistics.
void clear_conv_algorithm_cache();

}  // namespace tessel::cuda
