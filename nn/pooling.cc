#include "nn/pooling.h"

#include "ops/ops.h"

namespace tessel::nn {

namespace {
// PyTorch prints what the user passed; a pair of equal numbers reads best as one number.
std::string format_pair(const IntPair& pair) {
  return pair.first == pair.second ? std::to_string(pair.first) : detail::format_tuple(pair.vec());
}

void check_window(const char* layer, const IntPair& kernel, const IntPair& stride,
                  const IntPair& padding) {
  TESSEL_CHECK(kernel.first > 0 && kernel.second > 0, layer, ": kernel_size must be positive, got ",
               kernel.vec());
  TESSEL_CHECK(stride.first > 0 && stride.second > 0, layer, ": stride must be positive, got ",
               stride.vec());
  TESSEL_CHECK(padding.first >= 0 && padding.second >= 0 && padding.first <= kernel.first / 2 &&
                   padding.second <= kernel.second / 2,
               layer, ": padding must be between 0 and half the kernel size, got padding ",
               padding.vec(), " for kernel_size ", kernel.vec());
}

void check_input(const char* layer, const Tensor& input) {
  TESSEL_CHECK(input.dim() == 4, layer, ": expected a 4-D input (N, C, H, W), got shape ",
               shape_str(input.sizes()));
}
}  // namespace

MaxPool2d::MaxPool2d(const MaxPool2dOptions& options_in)
    : Module("MaxPool2d"), options(options_in) {
  check_window("MaxPool2d", options.kernel_size(), options.stride(), options.padding());
  TESSEL_CHECK(options.dilation().first > 0 && options.dilation().second > 0,
               "MaxPool2d: dilation must be positive, got ", options.dilation().vec());
}

Tensor MaxPool2d::forward(const Tensor& input) {
  check_input("MaxPool2d", input);
  return max_pool2d(input, options.kernel_size().vec(), options.stride().vec(),
                    options.padding().vec(), options.dilation().vec(), options.ceil_mode());
}

std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + format_pair(options.kernel_size()) +
         ", stride=" + format_pair(options.stride()) +
         ", padding=" + format_pair(options.padding()) +
         ", dilation=" + format_pair(options.dilation()) +
         ", ceil_mode=" + detail::format_bool(options.ceil_mode());
}

AvgPool2d::AvgPool2d(const AvgPool2dOptions& options_in)
    : Module("AvgPool2d"), options(options_in) {
  check_window("AvgPool2d", options.kernel_size(), options.stride(), options.padding());
}

Tensor AvgPool2d::forward(const Tensor& input) {
  check_input("AvgPool2d", input);
  return avg_pool2d(input, options.kernel_size().vec(), options.stride().vec(),
                    options.padding().vec(), options.ceil_mode(), options.count_include_pad());
}

std::string AvgPool2d::extra_repr() const {
  return "kernel_size=" + format_pair(options.kernel_size()) +
         ", stride=" + format_pair(options.stride()) +
         ", padding=" + format_pair(options.padding());
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(IntPair output_size_in)
    : Module("AdaptiveAvgPool2d"), output_size(output_size_in) {
  TESSEL_CHECK(output_size.first > 0 && output_size.second > 0,
               "AdaptiveAvgPool2d: output_size must be positive, got ", output_size.vec());
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& input) {
  check_input("AdaptiveAvgPool2d", input);
  return adaptive_avg_pool2d(input, output_size.vec());
}

std::string AdaptiveAvgPool2d::extra_repr() const {
  return "output_size=" + format_pair(output_size);
}

}  // namespace tessel::nn
