// remat/nn/training_state.h - everything a training step depends on, written atomically and read
// back bit for bit, so that a stopped run resumes as if it had never stopped.
//
//   nn::TrainingState state{.step = done, .rng = rng_state(), .configuration = {{"lr", "0.004"}}};
//   nn::save_training_state(nn::training_state_path("run", state.step), model, optimizer, state);
//
// and a later process, with the same model and optimizer built, continues from the newest state:
//
//   const std::string newest = nn::latest_training_state("run");   // "run/step-00000040"
//   nn::TrainingState resumed = nn::load_training_state(newest, model, optimizer, {{"lr", "0.004"}});
//   for (int64_t step = resumed.step; step < steps; ++step) train_step(step);  // as if never stopped
//
// A state is a directory: model.safetensors (parameters and buffers, under the model's dotted
// names, with the caller's metadata: other tools read the weights from it), optimizer.safetensors
// (per parameter "NAME/exp_avg", ... and its counters; one file per shard under ZeRO-1:
// optimizer-shard-R-of-N.safetensors) and state.json (the step, the RNG state, the configuration,
// the caller's extra values, the modules' counters, and per file its size and a checksum of its
// header). Every tensor's data carries an XXH64 checksum (metadata "xxh64:NAME", 16 hexadecimal
// digits) and state.json one of itself, so one flipped byte anywhere is found and named.
//
// Atomic: a state is written under NAME.partial, every file flushed to disk, then renamed to NAME:
// a reader, or a crash at any instant, sees the whole state or none. A write error (a full disk,
// an unwritable directory) is a remat::Error naming the file and the reason; the partial directory
// is removed and every state written before is left as it was.
//
// Loading checks everything before it changes anything: the checksums, the configuration (every
// key of `configuration` must have the same value in the state), the model (names, shapes, dtypes
// of parameters, buffers and counters) and the optimizer (its kind, options, parameters and their
// state's shapes). A difference is a remat::Error naming it; the model, the optimizer and the RNG
// are then as they were. Tensors are read into host memory and copied to the device of the
// parameter (or buffer) they belong to, so a state written on one device loads on another.
#pragma once

#include <cstdint>
#include <string>

#include "remat/nn/module.h"
#include "remat/nn/optim.h"
#include "remat/random.h"

namespace remat::nn {

struct TrainingState {
  int64_t step = 0;        // optimizer steps completed: the schedule's and the data's position
  RngState rng;            // the default generator (remat/random.h), restored by load_training_state
  Metadata configuration;  // what defines the run; compared key by key when loading
  Metadata extra;          // anything else the caller keeps (loss history, a data cursor); returned as saved
};

// The optimizer state one process holds: all of it (count 1), or shard `index` of `count` (ZeRO-1:
// each process keeps the state of its own parameters).
struct StateShard {
  int index = 0, count = 1;
};

// Writes the state directory `path` (which must not exist yet) atomically, in one process.
// `model_metadata` goes into model.safetensors' metadata (e.g. what lets another tool read it).
void save_training_state(const std::string& path, const Module& model, const Optimizer& optimizer,
                         const TrainingState& state, const Metadata& model_metadata = {});

// The same in three steps, for processes that each hold one optimizer shard and share the
// directory (a file system every process sees). The caller makes each step wait for the previous
// one on every process, and every process learn whether any failed:
//   if (rank == 0) begin_training_state(path);                  // then: all wait
//   write_training_state_shard(path, model, optimizer, state, {rank, world});  // all; rank 0 also
//                                                                // writes the model and state.json's parts
//   if (rank == 0) commit_training_state(path, world);          // the rename: now it exists
// and on a failure anywhere, rank 0 calls abandon_training_state(path).
void begin_training_state(const std::string& path);
void write_training_state_shard(const std::string& path, const Module& model, const Optimizer& optimizer,
                                const TrainingState& state, StateShard shard, const Metadata& model_metadata = {});
void commit_training_state(const std::string& path, int shards);
void abandon_training_state(const std::string& path);

// Reads the state at `path` (a directory written above) into `model` and `optimizer` and sets the
// default generator; returns the state. `configuration`: the values this run expects (a key the
// state lacks, or holds with another value, is an error naming both). The optimizer's state is
// looked up by parameter name in every optimizer file of the state, so a state written by any
// number of shards loads into an optimizer that holds all the parameters or any shard of them
// (`shard`, this process's, only checked): a state is independent of the number of processes.
TrainingState load_training_state(const std::string& path, Module& model, Optimizer& optimizer,
                                  const Metadata& configuration, StateShard shard = {});
// Only state.json, checked: the step, configuration and extra of the state at `path` (to decide
// what to build before loading it). The tensors are checked by load_training_state.
TrainingState read_training_state(const std::string& path);

// A directory of states, one per step, named step-NNNNNNNN (at least 8 digits, so that names sort
// by step): the path of the state of `step`; the newest complete state ("" when there is none;
// partial directories of interrupted writes are ignored); removing all but the newest `keep`
// states and every partial directory left by an interrupted write.
std::string training_state_path(const std::string& directory, int64_t step);
std::string latest_training_state(const std::string& directory);
void prune_training_states(const std::string& directory, int keep);

}  // namespace remat::nn
