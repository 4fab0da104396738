// Intra-op threading: tessel::set_num_threads(n) (default: all cores) and parallel_for.
//   parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) { ... });
#pragma once

#include <cstdint>
#include <functional>

namespace tessel {

void set_num_threads(int threads);
int get_num_threads();
// Splits [begin, end) into at most get_num_threads() chunks of at least `grain` items.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn);

}  // namespace tessel
