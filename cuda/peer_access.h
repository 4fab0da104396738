// Direct access between GPUs: enabled once per ordered pair (the device that issues a copy, the
// peer whose memory it reaches) where the hardware allows it, the answers cached for the process.
// Without it a copy between GPUs is staged through host memory. The CUDA calls are passed in, so
// the bookkeeping has no CUDA dependency (cuda/copy.cc binds the real ones).
//   PeerAccessTable table({can_access_peer, enable_peer_access});
//   table.ensure(0, 1);  // cuda:0 reads and writes cuda:1's memory directly from now on
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

namespace tessel::cuda {

class PeerAccessTable {
 public:
  struct Calls {
    // cudaDeviceCanAccessPeer(device, peer).
    std::function<bool(int device, int peer)> can_access;
    // cudaDeviceEnablePeerAccess(peer) with `device` current; an "already enabled" answer is
    // success (another library may have enabled it first). Throws on a real error.
    std::function<void(int device, int peer)> enable;
  };

  explicit PeerAccessTable(Calls calls) : calls_(std::move(calls)) {}

  // Whether `device` reaches `peer`'s memory directly after this call: asks and enables on the
  // first call for the pair only. A failed enable is not cached (the next call tries again).
  bool ensure(int device, int peer) {
    if (device == peer) return true;
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = states_.find({device, peer});
    if (found != states_.end()) return found->second == State::kEnabled;
    if (!calls_.can_access(device, peer)) {
      states_[{device, peer}] = State::kUnavailable;
      return false;
    }
    calls_.enable(device, peer);
    states_[{device, peer}] = State::kEnabled;
    return true;
  }

 private:
  enum class State : uint8_t { kEnabled, kUnavailable };
  Calls calls_;
  std::mutex mutex_;
  std::map<std::pair<int, int>, State> states_;
};

}  // namespace tessel::cuda
