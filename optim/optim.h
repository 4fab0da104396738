// Tessel's optimizers in one include: SGD, Adam, AdamW and clip_grad_norm (namespace
// tessel::optim). The updates run as the "sgd_update" / "adam_update" ops.
//   #include "optim/optim.h"   optim::Adam adam(net->parameters(), optim::AdamOptions(1e-3));
#pragma once

#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"
