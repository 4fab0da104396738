#include "core/threading.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "core/error.h"

namespace tessel {

namespace {
std::atomic<int> num_threads{0};  // 0: not set yet
thread_local int thread_cap = 0;  // 0: none
}  // namespace

void set_num_threads(int threads) {
  TESSEL_CHECK(threads >= 1, "set_num_threads: expected at least 1 thread, got ", threads);
  num_threads.store(threads);
  omp_set_num_threads(threads);
}

int get_num_threads() {
  int threads = num_threads.load();
  if (threads == 0) {
    threads = std::max(1u, std::thread::hardware_concurrency());
    set_num_threads(threads);
  }
  return thread_cap > 0 ? std::min(threads, thread_cap) : threads;
}

ThreadCap::ThreadCap(int threads) : previous_(thread_cap) {
  TESSEL_CHECK(threads >= 1, "ThreadCap: expected at least 1 thread, got ", threads);
  thread_cap = previous_ > 0 ? std::min(previous_, threads) : threads;
}

ThreadCap::~ThreadCap() { thread_cap = previous_; }

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (end <= begin) return;
  int64_t total = end - begin;
  int64_t chunks = std::min<int64_t>(
      get_num_threads(), (total + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1));
  if (chunks <= 1 || omp_in_parallel()) {
    fn(begin, end);
    return;
  }
  int64_t per_chunk = (total + chunks - 1) / chunks;
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    int64_t chunk_begin = begin + chunk * per_chunk;
    int64_t chunk_end = std::min(end, chunk_begin + per_chunk);
    if (chunk_begin < chunk_end) fn(chunk_begin, chunk_end);
  }
}

}  // namespace tessel
