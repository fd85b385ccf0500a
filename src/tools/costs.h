// The --costs file of `remat plan`: per-stage costs of a chain, instead of profiling a model.
//   {"stages": [{"forward_seconds": 0.01, "backward_seconds": 0.02,
//                "boundary_bytes": 1048576, "saved_bytes": 4194304}, ...],
//    "output_bytes": 1048576,
//    "offload_write_seconds_per_byte": 1e-9, "offload_read_seconds_per_byte": 5e-10}
// or the list of stages alone (the output then has the size of the last stage's input). The two
// offload costs (both or neither; above 0 and at most 1) are those of the --offload target,
// planned with instead of its measured bandwidth: the write queued behind the forward pass, the
// read back charged at its node (docs/planners.md, "the cost of a transfer"). The file
// is untrusted: JSON nested at most 3 levels, each key once, no other keys; seconds are numbers
// from 0 to 1e12 and bytes whole numbers (no fraction or exponent) within the planner's limits
// (their sum at most 2^59); at most 1000 stages. Every problem is a remat::Error naming the file and the stage.
#pragma once

#include <string>
#include <string_view>

#include "remat/schedule.h"

namespace remat::tools {

schedule::ChainCosts parse_costs(std::string_view text, const std::string& name);
schedule::ChainCosts read_costs(const std::string& path);  // reads the file, then parse_costs

}  // namespace remat::tools
