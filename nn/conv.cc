#include "nn/conv.h"

#include <cmath>

#include "nn/init.h"
#include "ops/ops.h"

namespace tessel::nn {

Conv2d::Conv2d(const Conv2dOptions& options_in) : Module("Conv2d"), options(options_in) {
  const auto& o = options;
  TESSEL_CHECK(o.in_channels() > 0 && o.out_channels() > 0,
               "Conv2d: in_channels and out_channels must be positive, got ", o.in_channels(),
               " and ", o.out_channels());
  TESSEL_CHECK(o.kernel_size().first > 0 && o.kernel_size().second > 0,
               "Conv2d: kernel_size must be positive, got ", o.kernel_size().vec());
  TESSEL_CHECK(o.stride().first > 0 && o.stride().second > 0,
               "Conv2d: stride must be positive, got ", o.stride().vec());
  TESSEL_CHECK(o.padding().first >= 0 && o.padding().second >= 0,
               "Conv2d: padding must be non-negative, got ", o.padding().vec());
  TESSEL_CHECK(o.dilation().first > 0 && o.dilation().second > 0,
               "Conv2d: dilation must be positive, got ", o.dilation().vec());
  TESSEL_CHECK(o.groups() > 0, "Conv2d: groups must be positive, got ", o.groups());
  TESSEL_CHECK(o.in_channels() % o.groups() == 0, "Conv2d: in_channels (", o.in_channels(),
               ") must be divisible by groups (", o.groups(), ")");
  TESSEL_CHECK(o.out_channels() % o.groups() == 0, "Conv2d: out_channels (", o.out_channels(),
               ") must be divisible by groups (", o.groups(), ")");
  weight = register_parameter("weight", empty({o.out_channels(), o.in_channels() / o.groups(),
                                               o.kernel_size().first, o.kernel_size().second}));
  if (o.bias()) bias = register_parameter("bias", empty({o.out_channels()}));
  reset_parameters();
}

void Conv2d::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    int64_t fan_in = init::fan_in_and_fan_out(weight).first;
    double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  TESSEL_CHECK(input.dim() == 4, "Conv2d: expected a 4-D input (N, C, H, W), got shape ",
               shape_str(input.sizes()));
  TESSEL_CHECK(input.size(1) == options.in_channels(), "Conv2d: input has ", input.size(1),
               " channels but the layer expects ", options.in_channels(), " (input shape ",
               shape_str(input.sizes()), ")");
  return conv2d(input, weight, bias, options.stride().vec(), options.padding().vec(),
                options.dilation().vec(), options.groups());
}

std::string Conv2d::extra_repr() const {
  const auto& o = options;
  std::string text = std::to_string(o.in_channels()) + ", " + std::to_string(o.out_channels()) +
                     ", kernel_size=" + detail::format_tuple(o.kernel_size().vec()) +
                     ", stride=" + detail::format_tuple(o.stride().vec());
  if (!o.padding().both(0)) text += ", padding=" + detail::format_tuple(o.padding().vec());
  if (!o.dilation().both(1)) text += ", dilation=" + detail::format_tuple(o.dilation().vec());
  if (o.groups() != 1) text += ", groups=" + std::to_string(o.groups());
  if (!bias.defined()) text += ", bias=False";
  return text;
}

}  // namespace tessel::nn
