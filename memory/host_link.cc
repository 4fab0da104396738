#include "memory/host_link.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "core/error.h"

namespace tessel::memory {

namespace {
// Copies go in pieces so the throttle paces them smoothly rather than in one burst.
constexpr size_t kPieceBytes = 1 << 20;

bool throttled(double bandwidth) { return bandwidth > 0 && std::isfinite(bandwidth); }

// The link stands for a DMA engine, which moves bytes while kernels run. On CPU its thread
// shares the cores with the compute threads. At a lowered priority its copies fill the moments
// a core is idle (between parallel regions, during serial bookkeeping) instead of preempting a
// compute thread in the middle of a region, which leaves the others waiting at its barrier
// (ShuffleNet at f = 0.5, interleaved runs: median 1.11x at nice +10, 1.16x at -10, 1.19x at 0).
constexpr int kLinkThreadNice = 10;

// A copy with non-temporal stores where alignment allows: the bytes bypass the caches, so a swap
// neither evicts the compute threads' working sets nor reads the destination first (about 1.3x
// the speed of memcpy for swap-sized copies). Tails and unaligned copies fall back to memcpy.
void copy_streaming(char* destination, const char* source, size_t bytes) {
#ifdef __AVX2__
  constexpr size_t kAlignment = 32, kStride = 128;
  if (reinterpret_cast<uintptr_t>(destination) % kAlignment == 0 &&
      reinterpret_cast<uintptr_t>(source) % kAlignment == 0) {
    const size_t streamed = bytes - bytes % kStride;
    for (size_t i = 0; i < streamed; i += kStride) {
      const auto* from = reinterpret_cast<const __m256i*>(source + i);
      auto* to = reinterpret_cast<__m256i*>(destination + i);
      const __m256i a = _mm256_load_si256(from), b = _mm256_load_si256(from + 1);
      const __m256i c = _mm256_load_si256(from + 2), d = _mm256_load_si256(from + 3);
      _mm256_stream_si256(to, a);
      _mm256_stream_si256(to + 1, b);
      _mm256_stream_si256(to + 2, c);
      _mm256_stream_si256(to + 3, d);
    }
    _mm_sfence();  // streamed stores are weakly ordered: make them visible before `done`
    std::memcpy(destination + streamed, source + streamed, bytes - streamed);
    return;
  }
#endif
  std::memcpy(destination, source, bytes);
}

struct CopyEngines {
  std::mutex mutex;
  std::shared_ptr<CopyEngine> by_type[kNumDeviceTypes];
};
CopyEngines& copy_engines() {
  static auto* engines = new CopyEngines;
  return *engines;
}
}  // namespace

void set_copy_engine(DeviceType type, std::shared_ptr<CopyEngine> engine) {
  std::lock_guard<std::mutex> lock(copy_engines().mutex);
  copy_engines().by_type[static_cast<int>(type)] = std::move(engine);
}

std::shared_ptr<CopyEngine> copy_engine_for(DeviceType type) {
  std::lock_guard<std::mutex> lock(copy_engines().mutex);
  return copy_engines().by_type[static_cast<int>(type)];
}

void SimulatedClock::wait_until(double time) {
  if (time <= now_) return;
  stalled_ += time - now_;
  now_ = time;
}

void copy_device_bytes(Device device, void* destination, const void* source, size_t bytes) {
  if (bytes == 0) return;
  std::shared_ptr<CopyEngine> engine = device.is_cpu() ? nullptr : copy_engine_for(device.type);
  if (!engine) {
    TESSEL_CHECK(!device.is_meta(), "copy_device_bytes: the meta device holds no bytes");
    std::memcpy(destination, source, bytes);
    return;
  }
  engine->copy(destination, source, bytes, engine->prepare(destination, source, bytes));
}

HostLink::HostLink(double bytes_per_second, std::shared_ptr<CopyEngine> engine)
    : bandwidth_(bytes_per_second),
      engine_(std::move(engine)),
      clock_(engine_ ? engine_->simulated_clock() : nullptr) {
  thread_ = std::thread([this] { run(); });
}

HostLink::~HostLink() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  thread_.join();
}

std::shared_ptr<HostTransfer> HostLink::copy_async(void* destination, const void* source,
                                                   size_t bytes) {
  if (clock_) return simulate(destination, source, bytes);
  std::shared_ptr<HostTransfer> transfer(new HostTransfer(destination, source, bytes));
  if (engine_) transfer->prepared_ = engine_->prepare(destination, source, bytes);
  enqueue(transfer);
  return transfer;
}

std::shared_ptr<HostTransfer> HostLink::simulate(void* destination, const void* source,
                                                 size_t bytes) {
  std::shared_ptr<HostTransfer> transfer(new HostTransfer(destination, source, bytes));
  std::lock_guard<std::mutex> lock(mutex_);
  const double seconds = throttled(bandwidth_) ? static_cast<double>(bytes) / bandwidth_ : 0.0;
  transfer->clock_ = clock_;
  transfer->complete_at_ = std::max(clock_->now(), link_free_at_) + seconds;
  link_free_at_ = transfer->complete_at_;
  bytes_copied_ += static_cast<int64_t>(bytes);
  busy_seconds_ += seconds;
  return transfer;
}

void HostLink::enqueue(const std::shared_ptr<HostTransfer>& transfer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(transfer);
  }
  work_ready_.notify_one();
}

std::shared_ptr<HostTransfer> HostLink::copy_to_device(void* destination, const void* source,
                                                       size_t bytes) {
  if (clock_) return simulate(destination, source, bytes);
  std::shared_ptr<void> issued =
      engine_ ? engine_->issue_for_device(destination, source, bytes) : nullptr;
  if (!issued) return copy_async(destination, source, bytes);
  std::shared_ptr<HostTransfer> transfer(new HostTransfer(destination, source, bytes));
  transfer->prepared_ = issued;  // the link's thread waits for it, then marks the copy done
  transfer->issued_ = std::move(issued);
  enqueue(transfer);
  return transfer;
}

void HostLink::order_device_after(const std::shared_ptr<HostTransfer>& transfer) {
  if (!transfer) return;
  if (transfer->issued()) {
    engine_->order_device_after(transfer->issued_);
    return;
  }
  wait(transfer);
}

void HostLink::wait(const std::shared_ptr<HostTransfer>& transfer) {
  if (!transfer) return;
  if (transfer->clock_) {
    std::lock_guard<std::mutex> lock(mutex_);
    wait_seconds_ += std::max(0.0, transfer->complete_at_ - clock_->now());
    clock_->wait_until(transfer->complete_at_);
    return;
  }
  if (!transfer->done()) {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    work_done_.wait(lock, [&] { return transfer->done(); });
    wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  TESSEL_CHECK(transfer->error_.empty(), "host link: copy of ", transfer->bytes_,
               " bytes failed: ", transfer->error_);
}

void HostLink::wait_all() {
  if (clock_) {
    std::lock_guard<std::mutex> lock(mutex_);
    wait_seconds_ += std::max(0.0, link_free_at_ - clock_->now());
    clock_->wait_until(link_free_at_);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return queue_.empty(); });
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void HostLink::set_bandwidth(double bytes_per_second) {
  std::lock_guard<std::mutex> lock(mutex_);
  bandwidth_ = bytes_per_second;
}

double HostLink::bandwidth() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bandwidth_;
}

double HostLink::seconds_for(size_t bytes) const {
  double bandwidth = this->bandwidth();
  return throttled(bandwidth) ? static_cast<double>(bytes) / bandwidth : 0.0;
}

double HostLink::backlog_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (clock_) return std::max(0.0, link_free_at_ - clock_->now());
  if (!throttled(bandwidth_)) return 0.0;
  size_t bytes = 0;
  for (const auto& transfer : queue_) bytes += transfer->bytes_;
  return static_cast<double>(bytes) / bandwidth_;
}

int64_t HostLink::bytes_copied() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_copied_;
}

double HostLink::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return busy_seconds_;
}

double HostLink::wait_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return wait_seconds_;
}

double HostLink::now() const {
  if (clock_) return clock_->now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void HostLink::run() {
  // Lowering a thread's own priority needs no privilege; should it fail, the default one works.
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kLinkThreadNice);
  using Clock = std::chrono::steady_clock;
  while (true) {
    std::shared_ptr<HostTransfer> transfer;
    double bandwidth;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Transfers stay queued while they run, so wait_all sees them; the front is the current one.
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      transfer = queue_.front();
      bandwidth = bandwidth_;
    }
    const auto start = Clock::now();
    if (engine_) {
      try {
        engine_->bind_link_thread(transfer->prepared_);
        engine_->copy(transfer->destination_, transfer->source_, transfer->bytes_,
                      transfer->prepared_);
      } catch (const std::exception& error) {
        transfer->error_ = error.what();
      }
      transfer->prepared_.reset();
    }
    auto* destination = static_cast<char*>(transfer->destination_);
    const auto* source = static_cast<const char*>(transfer->source_);
    // With an engine the bytes are already there.
    for (size_t copied = engine_ ? transfer->bytes_ : 0; copied < transfer->bytes_;) {
      size_t piece = std::min(kPieceBytes, transfer->bytes_ - copied);
      copy_streaming(destination + copied, source + copied, piece);
      copied += piece;
      // Sleep until bytes / elapsed <= bandwidth.
      if (throttled(bandwidth)) {
        std::this_thread::sleep_until(
            start + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(static_cast<double>(copied) / bandwidth)));
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      transfer->done_.store(true, std::memory_order_release);
      queue_.pop_front();
      bytes_copied_ += static_cast<int64_t>(transfer->bytes_);
      busy_seconds_ += seconds;
    }
    work_done_.notify_all();
  }
}

}  // namespace tessel::memory
