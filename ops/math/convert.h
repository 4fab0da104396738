// One value between element types, as every cast, copy and fill does on CPU and CUDA: 16-bit
// floats through float, bool as (float) value != 0.
//   BFloat16 b = convert_value<BFloat16>(0.1);  bool nonzero = convert_value<bool>(b);
#pragma once

#include <type_traits>

#include "core/half.h"
#include "core/host_device.h"

namespace tessel {

template <typename T>
constexpr bool kIsHalf = std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;

template <typename To, typename From>
TESSEL_HOST_DEVICE inline To convert_value(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<double>(static_cast<float>(value)) != 0.0;
  } else if constexpr (kIsHalf<To>) {
    return To(static_cast<float>(value));
  } else if constexpr (kIsHalf<From>) {
    return static_cast<To>(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

}  // namespace tessel
