// Tessel's neural-network layers in one include: Module and every layer, container and
// initialiser (namespace tessel::nn).
//   #include "models/nn/nn.h"   auto net = std::make_shared<nn::Linear>(4, 2);
#pragma once

#include "models/nn/activation.h"
#include "models/nn/container.h"
#include "models/nn/conv.h"
#include "models/nn/dropout.h"
#include "models/nn/embedding.h"
#include "models/nn/init.h"
#include "models/nn/linear.h"
#include "models/nn/module.h"
#include "models/nn/normalization.h"
#include "models/nn/options.h"
#include "models/nn/pooling.h"
