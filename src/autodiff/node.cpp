#include <atomic>

#include "autodiff/kernels.h"
#include "autodiff/state.h"
#include "remat/autodiff.h"
#include "tensor/allocate.h"

namespace remat::autodiff {

namespace {
std::atomic<uint64_t> sequence_counter{1};
}

ThreadState& thread_state() {
  thread_local ThreadState state;
  return state;
}

uint64_t next_sequence_nr() { return sequence_counter.load(); }

Node::Node() : sequence_nr_(sequence_counter.fetch_add(1)) {}

// Long chains of nodes would otherwise be destroyed recursively (one stack frame per node): edges
// whose node dies with us go to the queue of the outermost destruction in progress on the thread,
// which drains it. The queue lives on that call's stack and the thread only points at it, so a
// node destroyed after the thread's thread-local objects (a global tensor holding history at exit)
// touches nothing already destroyed.
Node::~Node() {
  thread_local std::vector<std::shared_ptr<Node>>* draining = nullptr;
  std::vector<std::shared_ptr<Node>> own;
  std::vector<std::shared_ptr<Node>>& pending = draining != nullptr ? *draining : own;
  for (auto& edge : next_edges)
    if (edge.node && edge.node.use_count() == 1) pending.push_back(std::move(edge.node));
  next_edges.clear();
  if (draining != nullptr) return;
  draining = &own;
  while (!own.empty()) {
    std::shared_ptr<Node> node = std::move(own.back());
    own.pop_back();
    node.reset();
  }
  draining = nullptr;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined()) return {};
  TensorImpl& impl = t.impl();
  if (impl.grad_fn) return {impl.grad_fn, impl.output_nr};
  if (!impl.requires_grad) return {};
  std::shared_ptr<Node> accumulator = impl.grad_accumulator.lock();
  if (!accumulator) {
    accumulator = std::make_shared<AccumulateGrad>(t.impl_ptr());
    impl.grad_accumulator = accumulator;
  }
  return {accumulator, 0};
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {
  outputs.push_back({leaf_->shape, leaf_->dtype, leaf_->storage->device()});
}

AccumulateGrad::Staged AccumulateGrad::stage(const Tensor& g) const {
  REMAT_ASSERT(g.defined());
  REMAT_ASSERT(g.shape() == leaf_->shape, "gradient of shape ", shape_str(g.shape()), " for leaf of shape ",
               shape_str(leaf_->shape));
  REMAT_ASSERT(g.dtype() == leaf_->dtype, "gradient of dtype ", dtype_name(g.dtype()), " for a leaf of dtype ",
               dtype_name(leaf_->dtype));
  Staged staged;
  if (!leaf_->grad) {
    // The incoming tensor becomes the gradient when nothing else can see its storage (the usual
    // case: a fresh result of the last backward formula), retagged as gradient at commit;
    // otherwise (a view, or shared) a fresh gradient-tagged copy.
    const std::shared_ptr<Storage>& storage = g.storage();
    const bool sole_owner = g.impl_ptr().use_count() == 1 && storage.use_count() == 1 && g.is_contiguous() &&
                            g.offset() == 0 && storage->bytes() == g.nbytes() && g.dtype() == leaf_->dtype &&
                            storage->tag() == memory::Tag::other;
    if (sole_owner) {
      staged.fresh = g.detach();
      staged.adopt = true;
    } else {
      Tensor leaf(leaf_);
      staged.fresh =
          detail::allocate_tensor("backward", leaf_->shape, leaf_->dtype, memory::Tag::gradient, leaf.device());
      backend(leaf.device()).copy(g, staged.fresh);
    }
  } else {
    Tensor grad(leaf_->grad);
    REMAT_ASSERT(grad.shape() == leaf_->shape && grad.dtype() == leaf_->dtype, "the gradient of a leaf of shape ",
                 shape_str(leaf_->shape), " is ", dtype_name(grad.dtype()), " ", shape_str(grad.shape()));
    staged.increment = g;
  }
  return staged;
}

void AccumulateGrad::commit(Staged staged) noexcept {
  if (staged.fresh.defined()) {
    if (staged.adopt) staged.fresh.storage()->set_tag(memory::Tag::gradient);
    leaf_->grad = staged.fresh.impl_ptr();
  } else if (staged.increment.defined()) {
    Tensor grad(leaf_->grad);
    backend(grad.device()).binary(BinaryOp::add, grad, staged.increment, grad);
    grad.storage()->bump_version();
  }
}

TensorList AccumulateGrad::apply(TensorList&& grad_outputs) {
  const Tensor& g = grad_outputs.at(0);
  if (g.defined()) commit(stage(g));
  return {};
}

}  // namespace remat::autodiff
