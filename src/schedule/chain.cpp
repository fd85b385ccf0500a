// Heterogeneous chains: plan trees, their action lists and the fixed plans (save-all,
// every-layer, every-k, uniform segments). The simulator: simulate.cpp; the costs' validation:
// chain_costs.cpp.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "chain_internal.h"
#include "remat/schedule.h"

namespace remat::schedule {

namespace {

std::string node_name(const PlanNode& node) {
  std::ostringstream out;
  if (node.kind == PlanNode::Kind::stage)
    out << "stage " << node.first;
  else
    out << "region [" << node.first << ".." << node.last << "]";
  return out.str();
}

void validate_sequence(const std::vector<PlanNode>& sequence, int first, int last, bool in_region) {
  const std::string where = in_region ? "validate_tree: children of region [" + std::to_string(first) + ".." +
                                            std::to_string(last) + "]"
                                      : "validate_tree";
  if (sequence.empty()) invalid(where, "empty sequence (stages " + std::to_string(first) + ".." +
                                           std::to_string(last) + " not covered)");
  int expected = first;
  for (const PlanNode& node : sequence) {
    if (node.first != expected)
      invalid(where, node_name(node) + " starts at " + std::to_string(node.first) + ", expected stage " +
                         std::to_string(expected));
    if (node.kind == PlanNode::Kind::stage) {
      if (node.last != node.first) invalid(where, "a stage node needs first == last, got " + node_name(node));
      if (!node.children.empty()) invalid(where, node_name(node) + " has children");
    } else {
      if (node.last < node.first || node.last > last) invalid(where, node_name(node) + " is out of range");
      if (node.children.size() == 1 && node.children[0].kind == PlanNode::Kind::region &&
          node.children[0].first == node.first && node.children[0].last == node.last)
        invalid(where, node_name(node) + " has a single child region over the same stages");
      validate_sequence(node.children, node.first, node.last, true);
    }
    if (node.offloaded && in_region) invalid(where, node_name(node) + " is offloaded inside a region (only top-level nodes are)");
    if (node.offloaded && node.kind == PlanNode::Kind::region && node.first == 0)
      invalid(where, node_name(node) + " is offloaded, but its input is the chain input a_0, which the caller holds");
    expected = node.last + 1;
  }
  if (expected != last + 1)
    invalid(where, "covers stages " + std::to_string(first) + ".." + std::to_string(expected - 1) + ", expected " +
                       std::to_string(first) + ".." + std::to_string(last));
}

// Appends the actions of a sequence over stages [first, last]; top: the chain's top level.
void append_sequence(const std::vector<PlanNode>& sequence, int last, bool top, std::vector<Action>& out) {
  for (const PlanNode& node : sequence) {
    if (node.kind == PlanNode::Kind::stage) {
      out.push_back({ActionKind::forward_save_all, node.first});
    } else {
      out.push_back({ActionKind::forward_no_save, node.first});
      for (int j = node.first + 1; j <= node.last; ++j) {
        out.push_back({ActionKind::forward_no_save, j});
        out.push_back({ActionKind::drop, j});
      }
    }
    if (node.offloaded) out.push_back({ActionKind::offload, node.first});
  }
  out.push_back(top ? Action{ActionKind::loss, last + 1} : Action{ActionKind::drop, last + 1});
  for (size_t k = sequence.size(); k-- > 0;) {
    const PlanNode& node = sequence[k];
    if (k + 1 < sequence.size()) out.push_back({ActionKind::drop, node.last + 1});
    if (node.offloaded) out.push_back({ActionKind::fetch, node.first});
    if (node.kind == PlanNode::Kind::stage)
      out.push_back({ActionKind::backward, node.first});
    else
      append_sequence(node.children, node.last, false, out);
  }
}

}  // namespace

void validate_tree(const std::vector<PlanNode>& tree, int num_stages) {
  if (num_stages < 1) invalid("validate_tree", "num_stages must be >= 1, got " + std::to_string(num_stages));
  validate_sequence(tree, 0, num_stages - 1, false);
}

std::vector<Action> plan_actions(const std::vector<PlanNode>& tree, int num_stages) {
  validate_tree(tree, num_stages);
  std::vector<Action> out;
  append_sequence(tree, num_stages - 1, true, out);
  return out;
}

Plan make_plan(const ChainCosts& costs, std::vector<PlanNode> tree) {
  Plan plan;
  plan.actions = plan_actions(tree, costs.num_stages());
  plan.tree = std::move(tree);
  const SimResult result = simulate_actions(costs, plan.actions);
  plan.predicted_peak_bytes = result.peak_bytes;
  plan.predicted_time = result.total_time;
  plan.reads = result.reads;
  return plan;
}

Plan plan_save_all(const ChainCosts& costs) {
  costs.validate();
  std::vector<PlanNode> tree;
  for (int i = 0; i < costs.num_stages(); ++i) tree.push_back(PlanNode::stage(i));
  return make_plan(costs, std::move(tree));
}

Plan plan_every_k(const ChainCosts& costs, int k) {
  costs.validate();
  if (k < 1) invalid("plan_every_k", "k must be >= 1, got " + std::to_string(k));
  const int stages = costs.num_stages();
  std::vector<PlanNode> tree;
  for (int first = 0; first < stages; first += k) {
    const int last = std::min(stages - 1, first + k - 1);
    std::vector<PlanNode> children;
    for (int i = first; i <= last; ++i) children.push_back(PlanNode::stage(i));
    tree.push_back(PlanNode::region(first, last, std::move(children)));
  }
  return make_plan(costs, std::move(tree));
}

Plan plan_every_layer(const ChainCosts& costs) { return plan_every_k(costs, 1); }

Plan plan_uniform_segments(const ChainCosts& costs, int segments) {
  costs.validate();
  const int stages = costs.num_stages();
  if (segments < 1 || segments > stages)
    invalid("plan_uniform_segments", "segments must be in 1.." + std::to_string(stages) + ", got " +
                                         std::to_string(segments));
  const int size = stages / segments;
  std::vector<PlanNode> tree;
  int next = 0;
  for (int segment = 0; segment + 1 < segments; ++segment, next += size) {
    std::vector<PlanNode> children;
    for (int i = next; i < next + size; ++i) children.push_back(PlanNode::stage(i));
    tree.push_back(PlanNode::region(next, next + size - 1, std::move(children)));
  }
  for (int i = next; i < stages; ++i) tree.push_back(PlanNode::stage(i));
  return make_plan(costs, std::move(tree));
}

std::string format_tree(const std::vector<PlanNode>& tree) {
  std::string out;
  for (const PlanNode& node : tree) {
    if (!out.empty()) out += ' ';
    if (node.kind == PlanNode::Kind::stage)
      out += 'S' + std::to_string(node.first);
    else
      out += "R[" + std::to_string(node.first) + ".." + std::to_string(node.last) + "](" +
             format_tree(node.children) + ")";
    if (node.offloaded) out += "+o";
  }
  return out;
}

std::string format_actions(const std::vector<Action>& actions) {
  std::string out;
  for (const Action& action : actions) {
    if (!out.empty()) out += ' ';
    switch (action.kind) {
      case ActionKind::forward_no_save: out += "Fn"; break;
      case ActionKind::forward_save_all: out += "Fa"; break;
      case ActionKind::backward: out += "B"; break;
      case ActionKind::drop: out += "D"; break;
      case ActionKind::loss: out += "L"; break;
      case ActionKind::offload: out += "O"; break;
      case ActionKind::fetch: out += "I"; break;
      default: out += "?"; break;
    }
    if (action.kind != ActionKind::loss) out += std::to_string(action.index);
  }
  return out;
}

}  // namespace remat::schedule
