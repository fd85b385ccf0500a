// A random model program as plain data: a tree of modules whose forward passes are small
// interpreted programs, and a driver that trains the model for a few steps.
//
//   Source source = Source::from_seed(17);
//   Program program = generate(source, 17);      // generate.cpp
//   std::cout << to_pseudo_code(program);       // print.cpp: readable C++-like text
//   MatrixResult m = run_program_matrix(program, {"every-k:2"});   // run.h: save-all, then every-k:2
//
// The program is data so that a minimiser can drop statements and modules (minimise.cpp) and a
// failure prints as something a person can turn into a test. Every tensor of a module's forward
// is a register; a statement reads earlier registers and defines new ones (calls define one per
// output). Shapes come in three classes: full [B, W], col [B, 1] (a reduction over the last
// axis) and row [W] (a parameter vector) or [1, W] (a reduction over the batch); elementwise
// ops broadcast, and statements that need [B, W] (a Linear, a layer call) get it (check.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace remat::program_fuzz {

// Random choices, from a seed (the ctest and the runner) or from bytes (the libFuzzer target).
class Source {
 public:
  static Source from_seed(uint64_t seed);
  static Source from_bytes(const uint8_t* data, size_t size);
  uint32_t next();
  int below(int n);                  // uniform in [0, n); 0 when n <= 1
  int between(int lo, int hi) { return lo + below(hi - lo + 1); }
  bool chance(int percent) { return below(100) < percent; }

 private:
  uint64_t state_ = 0;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0, pos_ = 0;
  bool bytes_ = false;
};

enum class ShapeClass { full, col, row };

enum class Op {
  unary,        // unary_kind(arg0)
  binary,       // binary_kind(arg0, arg1), broadcasting
  reduce_last,  // mean(arg0, {-1}, keepdim): col
  reduce_batch, // sum(arg0, {0}, keepdim): row
  linear,       // linear(arg0, owner.w, owner.b): owner = `module` (this module or another's)
  param,        // owner.v (row): a parameter read as a value (returned, added, used across layers)
  call,         // children[child](args...): one register per output of the child
  route,        // data-dependent: children[child] if sum(arg0) > 0, else children[child2]
  detach,       // arg0.detach()
  dropout,      // dropout(arg0, c) from the default generator
  noise,        // arg0 + 0.1 * randn(shape, dtype, RngState{seed, 0}): a constant made inside
  constant,     // arg0 * full(shape, c): a constant made by a factory
  in_place,     // arg0 scaled by c in place (an alias of arg0; no new value)
  stash,        // pushes arg0 to this module's member list (an alias of arg0)
  set_cond,     // children[child]->cond = arg0 (FiLM-style conditioning; an alias of arg0)
  read_cond,    // arg0 * this->cond (cond set by the caller, ones if never set)
  view,         // arg0.slice(-1, 0, size): a view of arg0
  custom,       // a remat::CustomOp (cube, saving its input; with a side effect counter when c > 0)
  async,        // tanh(arg0) computed on another thread (std::async)
  scalar,       // arg0 * this->scale, a C++ member the driver changes between forward and backward
  buffer,       // the registered buffer updated from arg0 (skipped while recomputing when c > 0)
  checkpoint,   // remat::checkpoint(tanh(linear(arg0, w, b))): an explicit region
};
inline constexpr int kOpCount = 22;
const char* op_name(Op op);

enum class Unary { tanh, sigmoid, gelu, silu, square, neg, relu, exp, mul_scalar, add_scalar };
inline constexpr int kUnaryCount = 10;
enum class Binary { add, sub, mul, maximum };
inline constexpr int kBinaryCount = 4;

struct Stmt {
  Op op = Op::unary;
  std::vector<int> args;  // registers read
  int kind = 0;           // Unary / Binary
  int module = -1;        // linear, param: the owner (an index into Program::modules)
  int child = -1;         // call, route, set_cond: an index into the module's `children`
  int child2 = -1;        // route
  double c = 0;           // a constant (scale, dropout p, flag)
  uint64_t seed = 0;      // noise
  bool no_grad = false;   // runs under NoGradGuard
  // derived by check(): registers defined, their classes
  int outs = 1;
  std::vector<ShapeClass> out_classes;
};

enum class ModuleKind { prog, linear, dropout, tanh, layer_norm, sequential };
enum class Role { automatic, layer, transparent };

struct ModuleSpec {
  ModuleKind kind = ModuleKind::prog;
  Role role = Role::automatic;
  std::string own_policy;        // "" or a policy text set with set_policy
  int n_in = 1;                  // prog: inputs (1 or 2)
  std::vector<int> children;     // indices into Program::modules (prog and sequential)
  std::vector<Stmt> body;        // prog
  std::vector<int> returns;      // prog: registers returned
  int tie_to = -1;               // prog: its weight `w` is module tie_to's (weight tying)
  double dropout_p = 0.25;       // dropout
  // derived by check()
  std::vector<ShapeClass> out_classes;
  int n_out = 1;
};

enum class BackwardKind { plain, retain_twice, grad_intermediate, accumulate };

struct Driver {
  int steps = 3;
  std::vector<int> batch;        // per step
  BackwardKind backward = BackwardKind::plain;
  int optimizer = 0;             // 0 none, 1 SGD, 2 AdamW
  bool aux_loss = true;          // 0.01 * sum of the stashes' means added to the loss
  bool input_requires_grad = false;
  bool bf16 = false;             // root->set_compute_dtype(bf16)
  bool change_scale = false;     // the scale members change between forward and backward
  uint64_t data_seed = 0;
};

// The rules a program can break knowingly (an error naming one is a refusal, not a failure):
//   deterministic  a layer reads C++ state that changes between its forward and its backward (a
//                  scalar member the driver changes, a member tensor its caller sets after the call)
//   buffer_write   a layer writes a registered buffer in forward_impl without skipping it while
//                  is_recomputing() (docs/guide.md, rule 4)
//   thread         a layer computes a value on another thread
//   in_place       the program writes a value in place (copy_) that the forward pass read or
//                  reads after (docs/guide.md, rule 5): no recomputation can repeat the write
enum class Rule { deterministic, buffer_write, thread, in_place };
inline constexpr int kRuleCount = 4;

struct Program {
  uint64_t seed = 0;
  int width = 4;
  std::vector<ModuleSpec> modules;  // [0] is the root (prog)
  Driver driver;

  // The rules the program breaks, from its statements and driver (generate.cpp).
  std::vector<Rule> broken_rules() const;
};

Program generate(Source& source, uint64_t seed_label = 0);
// Makes the program well formed after edits (minimise.cpp) or generation: drops references to
// registers that do not exist, gives statements that need [B, W] a register that has it, and
// derives each statement's outputs and each module's output classes. Returns false if the
// program cannot be made well formed (a call cycle, no root).
bool check(Program& program);
std::string to_pseudo_code(const Program& program);
// Modules reachable from the root through calls (children lists), root first.
std::vector<int> reachable_modules(const Program& program);

}  // namespace remat::program_fuzz
