// remat/remat.h - the core API in one include: tensors, ops, autodiff, checkpointing, policies,
// devices. Loops (remat/scan.h), saved-value hooks (remat/saved_hooks.h), the planners
// (remat/schedule.h), data parallelism (remat/distributed.h) and the layers (remat/nn.h) have
// their own includes.
#pragma once

#include "remat/autodiff.h"
#include "remat/backend.h"
#include "remat/chain.h"
#include "remat/checkpoint.h"
#include "remat/devices.h"
#include "remat/error.h"
#include "remat/grad_ready.h"
#include "remat/gradcheck.h"
#include "remat/memory.h"
#include "remat/ops.h"
#include "remat/policy.h"
#include "remat/random.h"
#include "remat/tensor.h"
