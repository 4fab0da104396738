// Parameter initialisers with PyTorch's formulas (torch.nn.init), drawing from Tessel's
// counter-based generator; they write in place without recording autograd.
//   nn::init::kaiming_normal_(conv->weight, 0.0, "fan_out", "relu");   // torchvision ResNet
#pragma once

#include <string>
#include <utility>

#include "core/tensor.h"

namespace tessel::nn::init {

// (fan_in, fan_out) of a weight: dim 1 and dim 0 sizes times the receptive field (dims 2+).
std::pair<int64_t, int64_t> fan_in_and_fan_out(const Tensor& weight);
// torch.nn.init.calculate_gain: linear/conv*/sigmoid 1, tanh 5/3, relu sqrt(2),
// leaky_relu sqrt(2 / (1 + param^2)), selu 3/4.
double calculate_gain(const std::string& nonlinearity, double param = 0.01);

Tensor& uniform_(Tensor& tensor, double low = 0.0, double high = 1.0);
Tensor& normal_(Tensor& tensor, double mean = 0.0, double stddev = 1.0);
Tensor& constant_(Tensor& tensor, double value);
Tensor& zeros_(Tensor& tensor);
Tensor& ones_(Tensor& tensor);
// U(-bound, bound), bound = gain * sqrt(3 / fan); a = sqrt(5) gives Linear/Conv's default.
Tensor& kaiming_uniform_(Tensor& tensor, double a = 0.0, const std::string& mode = "fan_in",
                         const std::string& nonlinearity = "leaky_relu");
// N(0, gain / sqrt(fan)).
Tensor& kaiming_normal_(Tensor& tensor, double a = 0.0, const std::string& mode = "fan_in",
                        const std::string& nonlinearity = "leaky_relu");
Tensor& xavier_uniform_(Tensor& tensor, double gain = 1.0);
Tensor& xavier_normal_(Tensor& tensor, double gain = 1.0);

}  // namespace tessel::nn::init
