// An (N, C, ...) input of batch norm seen as (N, C, S): N batch entries, C channels, S spatial
// positions per channel. Shared by the CPU kernels (ops/cpu/norm.cc) and the CUDA kernels
// (cuda/ops/norm.cu).
//   ChannelLayout layout(x.sizes());  int64_t c = layout.channel_of(i);  // of dense element i
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace tessel {

struct ChannelLayout {
  int64_t batch = 0, channels = 0, spatial = 1;

  ChannelLayout() = default;
  // From the sizes (any container of dims, at least two) of the input.
  template <typename Sizes>
  explicit ChannelLayout(const Sizes& sizes) : batch(sizes[0]), channels(sizes[1]) {
    for (size_t d = 2; d < sizes.size(); ++d) spatial *= sizes[d];
  }
  // Values per channel.
  TESSEL_HOST_DEVICE int64_t per_channel() const { return batch * spatial; }
  // The channel of element i of the dense input.
  TESSEL_HOST_DEVICE int64_t channel_of(int64_t i) const { return (i / spatial) % channels; }
};

}  // namespace tessel
