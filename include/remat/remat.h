// remat/remat.h - everything in one include.
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
