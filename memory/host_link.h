// The link between the (simulated) device and host memory: one copy thread that moves bytes at a
// configurable bandwidth (default 25 GB/s, like PCIe), so swaps cost time on CPU as on a GPU and
// overlap with compute. Copies run in submission order; waiting on one returns once it is done.
//   HostLink link(25e9);  auto copy = link.copy_async(host, device, bytes);  ...  link.wait(copy);
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/device.h"

namespace tessel::memory {

// Simulated time (memory/sim): the clock of a simulated device's compute stream, which op times
// advance and waits for copies move forward. A link whose copy engine has one moves no bytes:
// each copy occupies the link for bytes / bandwidth of simulated time, in submission order, and
// waiting for a copy advances the clock to its end. Used from one thread.
class SimulatedClock {
 public:
  double now() const { return now_; }
  void advance(double seconds) { now_ += seconds; }
  // Waits until `time`: the clock moves there when it is later, and the wait counts as a stall.
  void wait_until(double time);
  double stalled_seconds() const { return stalled_; }

 private:
  double now_ = 0;
  double stalled_ = 0;
};

// How a link moves bytes. Without one: memcpy, throttled to the bandwidth (the simulated device).
// The CUDA backend registers one for CUDA devices: copies on its copy stream, not throttled, and
// swap-ins that the compute stream waits for on the device.
class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // On the submitting thread, when the copy is queued (e.g. to order it after queued work).
  virtual std::shared_ptr<void> prepare(void* destination, const void* source, size_t bytes) = 0;
  // On the link's thread, before each `copy`: a link serves one device, so an engine may make
  // that device current for the thread for good here, instead of switching in every copy.
  virtual void bind_link_thread(const std::shared_ptr<void>& /*prepared*/) {}
  // On the link's thread (or the caller's, for copy_device_bytes); returns once the bytes are at
  // `destination`.
  virtual void copy(void* destination, const void* source, size_t bytes,
                    const std::shared_ptr<void>& prepared) = 0;
  // For copies into device memory that the device's later work reads (swap-ins): issues the copy
  // at once, on the submitting thread, and returns its state; `copy` then only waits for it (on
  // the link's thread, to tell when the source may be reused) and `order_device_after` makes the
  // device's later work wait for it on the device, without the host. nullptr (the default): the
  // engine cannot, and the copy is queued as any other, the host waiting for it.
  virtual std::shared_ptr<void> issue_for_device(void* /*destination*/, const void* /*source*/,
                                                 size_t /*bytes*/) {
    return nullptr;
  }
  virtual void order_device_after(const std::shared_ptr<void>& /*issued*/) {}
  // The simulated clock of a simulated device (copies then move no bytes); null for real ones.
  virtual SimulatedClock* simulated_clock() { return nullptr; }
};
// The engine for links of managers on `type` (nullptr: memcpy). Thread-safe.
void set_copy_engine(DeviceType type, std::shared_ptr<CopyEngine> engine);
std::shared_ptr<CopyEngine> copy_engine_for(DeviceType type);
// Copies `bytes` between two blocks of `device` (or its host memory) and returns when they have
// arrived: memcpy on the CPU, the device's copy engine elsewhere (ordered after queued work).
void copy_device_bytes(Device device, void* destination, const void* source, size_t bytes);

// One queued copy; shared between the submitter and the copy thread.
class HostTransfer {
 public:
  bool done() const {
    return clock_ ? clock_->now() >= complete_at_ : done_.load(std::memory_order_acquire);
  }
  size_t bytes() const { return bytes_; }
  // Issued at once by the engine, ordered on the device (HostLink::copy_to_device).
  bool issued() const { return issued_ != nullptr; }

 private:
  friend class HostLink;
  HostTransfer(void* destination, const void* source, size_t bytes)
      : destination_(destination), source_(source), bytes_(bytes) {}
  void* destination_;
  const void* source_;
  size_t bytes_;
  std::shared_ptr<void> prepared_;  // the copy engine's, from submission
  std::shared_ptr<void> issued_;    // the engine's state of an issued copy, kept after it is done
  std::string error_;               // set when the engine failed
  std::atomic<bool> done_{false};
  const SimulatedClock* clock_ = nullptr;  // a simulated copy: done once the clock reaches
  double complete_at_ = 0;                 // this time
};

class HostLink {
 public:
  static constexpr double kDefaultBandwidth = 25e9;  // bytes per second

  // `bytes_per_second` <= 0 or infinite: copies run at memcpy speed. With an `engine`, copies go
  // through it unthrottled (the bandwidth then only feeds seconds_for, the cost estimate).
  explicit HostLink(double bytes_per_second = kDefaultBandwidth,
                    std::shared_ptr<CopyEngine> engine = nullptr);
  // Finishes the queued copies, then stops the thread.
  ~HostLink();
  HostLink(const HostLink&) = delete;
  HostLink& operator=(const HostLink&) = delete;

  // Queues a copy of `bytes` from `source` to `destination`; both must stay valid until it is done.
  std::shared_ptr<HostTransfer> copy_async(void* destination, const void* source, size_t bytes);
  // A copy into device memory that the device's later work reads (a swap-in). With an engine
  // that issues such copies (the CUDA one), it starts now on the device; otherwise it is queued
  // as by copy_async. Either way done() tells when `source` may be reused.
  std::shared_ptr<HostTransfer> copy_to_device(void* destination, const void* source, size_t bytes);
  // Orders the device's later work after a copy_to_device: an issued copy is waited for on the
  // device (the host goes on), any other on the host, as by wait.
  void order_device_after(const std::shared_ptr<HostTransfer>& transfer);
  // Blocks until `transfer` is done; throws tessel::Error when its copy failed.
  void wait(const std::shared_ptr<HostTransfer>& transfer);
  // Blocks until every queued copy is done.
  void wait_all();

  void set_bandwidth(double bytes_per_second);
  double bandwidth() const;
  // Seconds a copy of `bytes` takes at the configured bandwidth (0 when unthrottled).
  double seconds_for(size_t bytes) const;
  // Seconds until the copies queued now are done, at the configured bandwidth (0 when idle or
  // unthrottled); a copy queued now starts after them.
  double backlog_seconds() const;

  int64_t bytes_copied() const;
  double busy_seconds() const;  // time the copy thread spent copying (sleeps included)
  double wait_seconds() const;  // time callers spent blocked in wait and wait_all (stalls)
  // Seconds on the device's clock: the simulated one for a simulated device, else wall time.
  double now() const;

 private:
  void enqueue(const std::shared_ptr<HostTransfer>& transfer);
  void run();
  // A copy on the simulated clock: scheduled after the link's previous one, no bytes moved.
  std::shared_ptr<HostTransfer> simulate(void* destination, const void* source, size_t bytes);

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::deque<std::shared_ptr<HostTransfer>> queue_;
  double bandwidth_;
  std::shared_ptr<CopyEngine> engine_;
  SimulatedClock* clock_ = nullptr;  // the engine's, for a simulated device
  double link_free_at_ = 0;          // simulated time the last copy ends
  bool stopping_ = false;
  int64_t bytes_copied_ = 0;
  double busy_seconds_ = 0;
  double wait_seconds_ = 0;
  std::thread thread_;
};

}  // namespace tessel::memory
