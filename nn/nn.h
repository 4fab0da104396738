// Tessel's neural-network layers in one include: Module and every layer, container and
// initialiser (namespace tessel::nn).
//   #include "nn/nn.h"   auto net = std::make_shared<nn::Linear>(4, 2);
#pragma once

#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "nn/options.h"
#include "nn/pooling.h"
