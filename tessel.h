// Tessel in one include, as <torch/torch.h> is for libtorch: tensors and every op, autograd and
// its guards (NoGradGuard, InferenceMode, AutocastGuard), nn, optim, data loading, checkpoints,
// safetensors and run_main. Bazel: deps = ["//:tessel"].
//   #include "tessel.h"
//   tessel::NoGradGuard no_grad;  tessel::nn::Sequential net(tessel::nn::Linear(4, 2));
#pragma once

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/run_main.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "data/augment.h"
#include "data/data_loader.h"
#include "data/dataset.h"
#include "data/synthetic.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/lr_scheduler.h"
#include "optim/optim.h"
#include "train/state/checkpoint.h"
