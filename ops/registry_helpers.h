// Small helpers for op registration files (ops/*.cc).
//   TESSEL_REGISTER_OPS(elementwise) { OpDef& op = OpRegistry::get().define(ops::relu); ... }
// runs the body once at start-up (the library is alwayslink, so the object file is kept).
#pragma once

#include "core/autograd.h"
#include "core/op.h"
#include "core/threading.h"

#define TESSEL_REGISTER_OPS(group)                       \
  static void tessel_register_ops_##group();             \
  static const bool tessel_ops_registered_##group = [] { \
    tessel_register_ops_##group();                       \
    return true;                                         \
  }();                                                   \
  static void tessel_register_ops_##group()
