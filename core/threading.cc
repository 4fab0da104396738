#include "core/threading.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/error.h"

namespace tessel {

namespace {
inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

std::atomic<int> num_threads{0};  // 0: not set yet
thread_local int thread_cap = 0;  // 0: none

// Spins until `counter` reaches `target`, yielding the core after a while so that a thread it
// waits for can run on it when threads outnumber cores.
void wait_for(const std::atomic<int64_t>& counter, int64_t target) {
  constexpr int kSpinsBeforeYield = 2048;
  for (int spins = 0; counter.load(std::memory_order_acquire) < target; ++spins) {
    if (spins < kSpinsBeforeYield) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
}
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
  // Waking a sleeping thread (OMP_WAIT_POLICY=passive) takes tens of microseconds, more in a VM.
  // Chunks are claimed from a counter, so the calling thread starts at once and takes the chunks
  // of threads not yet awake; and it waits for the others' last chunks by spinning, so that it
  // reaches OpenMP's closing barrier last and is not put to sleep there, which would cost it a
  // second wake-up. Each chunk covers the same items whichever thread runs it.
  std::atomic<int64_t> next_chunk{0};
  std::atomic<int64_t> chunks_done{0};
#pragma omp parallel num_threads(chunks)
  {
    for (int64_t chunk; (chunk = next_chunk.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      int64_t chunk_begin = begin + chunk * per_chunk;
      int64_t chunk_end = std::min(end, chunk_begin + per_chunk);
      if (chunk_begin < chunk_end) fn(chunk_begin, chunk_end);
      chunks_done.fetch_add(1, std::memory_order_acq_rel);
    }
    if (omp_get_thread_num() == 0) wait_for(chunks_done, chunks);
  }
}

}  // namespace tessel
