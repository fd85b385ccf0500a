// Internal: the names of a training state's files and directories (training_state.cpp writes and
// reads a state, training_state_dir.cpp finds and prunes the states of a directory).
#pragma once

namespace remat::nn::state_names {

inline constexpr const char* kManifest = "state.json";
inline constexpr const char* kPartial = ".partial";    // a directory being written or removed
inline constexpr const char* kStepPrefix = "step-";   // + the step, 8 digits or more

}  // namespace remat::nn::state_names
