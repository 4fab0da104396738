// Intra-op threading: tessel::set_num_threads(n) (default: all cores) and parallel_for.
//   parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) { ... });
#pragma once

#include <cstdint>
#include <functional>

namespace tessel {

void set_num_threads(int threads);
// The threads an op started on this thread may use: set_num_threads's count, or less inside a
// ThreadCap on this thread.
int get_num_threads();

// Caps the threads of the ops this thread starts while it lives (e.g. a data loader's background
// thread, which runs beside the training step's ops and would otherwise double the threads).
class ThreadCap {
 public:
  explicit ThreadCap(int threads);
  ~ThreadCap();
  ThreadCap(const ThreadCap&) = delete;
  ThreadCap& operator=(const ThreadCap&) = delete;

 private:
  int previous_;
};
// Splits [begin, end) into at most get_num_threads() chunks of at least `grain` items.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn);

}  // namespace tessel
