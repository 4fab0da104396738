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

// How a link moves bytes. Without one: memcpy, throttled to the bandwidth (the simulated device).
// The CUDA backend registers one for CUDA devices: copies on its copy stream, not throttled.
class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // On the submitting thread, when the copy is queued (e.g. to order it after queued work).
  virtual std::shared_ptr<void> prepare(void* destination, const void* source, size_t bytes) = 0;
  // On the link's thread; returns once the bytes are at `destination`.
  virtual void copy(void* destination, const void* source, size_t bytes,
                    const std::shared_ptr<void>& prepared) = 0;
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
  bool done() const { return done_.load(std::memory_order_acquire); }
  size_t bytes() const { return bytes_; }

 private:
  friend class HostLink;
  HostTransfer(void* destination, const void* source, size_t bytes)
      : destination_(destination), source_(source), bytes_(bytes) {}
  void* destination_;
  const void* source_;
  size_t bytes_;
  std::shared_ptr<void> prepared_;  // the copy engine's, from submission
  std::string error_;               // set when the engine failed
  std::atomic<bool> done_{false};
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
  // Blocks until `transfer` is done; throws tessel::Error when its copy failed.
  void wait(const std::shared_ptr<HostTransfer>& transfer);
  // Blocks until every queued copy is done.
  void wait_all();

  void set_bandwidth(double bytes_per_second);
  double bandwidth() const;
  // Seconds a copy of `bytes` takes at the configured bandwidth (0 when unthrottled).
  double seconds_for(size_t bytes) const;

  int64_t bytes_copied() const;
  double busy_seconds() const;  // time the copy thread spent copying (sleeps included)
  double wait_seconds() const;  // time callers spent blocked in wait and wait_all (stalls)

 private:
  void run();

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::deque<std::shared_ptr<HostTransfer>> queue_;
  double bandwidth_;
  std::shared_ptr<CopyEngine> engine_;
  bool stopping_ = false;
  int64_t bytes_copied_ = 0;
  double busy_seconds_ = 0;
  double wait_seconds_ = 0;
  std::thread thread_;
};

}  // namespace tessel::memory
