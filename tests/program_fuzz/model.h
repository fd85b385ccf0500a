// The model a program describes: custom nn::Module classes whose forward_impl interprets the
// module's statements, and the library's layers and containers, wired as the program says.
#pragma once

#include <memory>
#include <vector>

#include "program.h"
#include "remat/nn.h"
#include "remat/remat.h"

namespace remat::program_fuzz {

class ProgModule;

// The modules of one run, by program index (lib modules have no ProgModule).
struct Model {
  const Program* program = nullptr;
  std::vector<std::shared_ptr<nn::Module>> modules;
  std::vector<ProgModule*> progs;  // null where the module is not a prog
  std::shared_ptr<nn::Module> root() const { return modules[0]; }
};

// A module whose forward pass is its spec's statements.
class ProgModule final : public nn::Module {
 public:
  ProgModule(const Model* model, int index);  // `model` outlives every forward call
  TensorList forward_list_impl(const TensorList& inputs) override;
  std::string type_name() const override { return "M" + std::to_string(index_); }
  Tensor weight(const Tensor& p) const { return compute_weight(p); }
  void tie(const Tensor& shared) { w = share_parameter("w", shared); }
  void attach(const std::string& name, std::shared_ptr<nn::Module> child) { add_child(name, std::move(child)); }

  Tensor w, b, v, buffer;
  // Reachable by the program after the forward pass.
  TensorList stash;
  Tensor cond;                // set by the caller (set_cond)
  double scale = 1.5;         // a C++ member the driver may change between forward and backward
  int64_t side_effects = 0;   // counted by the custom op's side effect

 private:
  void run(const Stmt& s, TensorList& regs);
  Tensor call(const Stmt& s, int slot, const TensorList& regs, TensorList& out);
  const Model* model_;
  int index_;
  CustomOp cube_, cube_counted_;
};

// Builds the modules of `program` (parameters from its seed; bf16 compute if the driver says so).
// `program` must outlive the model.
std::shared_ptr<Model> build_model(const Program& program);

}  // namespace remat::program_fuzz
