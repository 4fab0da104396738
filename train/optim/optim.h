// Tessel's optimizers in one include: SGD, Adam, AdamW and clip_grad_norm (namespace
// tessel::optim). The updates run as the "sgd_update" / "adam_update" ops.
//   #include "train/optim/optim.h"   optim::Adam adam(net->parameters(), optim::AdamOptions(1e-3));
#pragma once

#include "train/optim/adam.h"
#include "train/optim/clip_grad.h"
#include "train/optim/optimizer.h"
#include "train/optim/sgd.h"
