// distributed::data_parallel_step: gradient accumulation over micro-batches and ranks, and the
// ZeRO-1 ownership of the parameters (the rules are in remat/distributed.h).
#include <algorithm>
#include <chrono>
#include <optional>
#include <unordered_map>

#include "async_sum.h"
#include "remat/distributed.h"
#include "remat/error.h"
#include "remat/grad_ready.h"

namespace remat::distributed {

namespace {

// Runs f on t's values in host memory: t itself on the CPU; on a device, a host copy that is
// written back afterwards (the sums are the host's arithmetic on every device, so a device's
// accumulated gradient has the bits of the CPU's).
template <class F>
void on_host(const Tensor& t, F&& f) {
  if (t.device().type == DeviceType::cpu) return f(t);
  const Tensor host = t.to(kCpu);
  f(host);
  Tensor(t).copy_(host);
}

// into = into + g (f32 or f64, contiguous, same shape): the accumulated sum is the left operand.
void add_gradient(const Tensor& into, const Tensor& g) {
  REMAT_CHECK(into.dtype() == g.dtype() && into.numel() == g.numel() && into.is_contiguous() && g.is_contiguous(),
              "distributed: the gradients of one parameter differ between micro-batches");
  REMAT_CHECK(into.dtype() == DType::f32 || into.dtype() == DType::f64,
              "distributed: gradient accumulation supports f32 and f64, got ", dtype_name(into.dtype()));
  const Tensor gh = g.device().type == DeviceType::cpu ? g : g.to(kCpu);
  on_host(into, [&](const Tensor& a_t) {
    const int64_t n = a_t.numel();
    if (a_t.dtype() == DType::f32) {
      float* a = static_cast<float*>(a_t.raw_data());
      const float* b = static_cast<const float*>(gh.raw_data());
      for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
    } else {
      double* a = static_cast<double*>(a_t.raw_data());
      const double* b = static_cast<const double*>(gh.raw_data());
      for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
    }
  });
}

void scale_gradient(const Tensor& g, double factor) {
  on_host(g, [&](const Tensor& t) {
    const int64_t n = t.numel();
    if (t.dtype() == DType::f32) {
      float* a = static_cast<float*>(t.raw_data());
      const float f = static_cast<float>(factor);
      for (int64_t i = 0; i < n; ++i) a[i] *= f;
    } else {
      double* a = static_cast<double*>(t.raw_data());
      for (int64_t i = 0; i < n; ++i) a[i] *= factor;
    }
  });
}

// Note [the micro-batch tree]. A step's global batch is N ranks x K micro-batches, numbered
// rank-major (micro_batch_index). Its gradient is the sum of the N x K micro-batch gradients added
// in one fixed order that depends on N x K alone: the pairwise tree over the micro-batch index. A
// binary counter builds it (TreeStack): micro-batch i's gradient is pushed as the block [i, i + 1),
// two neighbouring blocks that are the halves of an aligned block of twice their size are added
// at once (left + right), and what remains is added largest first. Each rank pushes its own
// micro-batches and is left with the aligned blocks its range splits into (one when K is a power of
// two, at most about 2 log2 K otherwise); the reduction (Note [the ordered reduction] in mpi.cpp)
// pushes every rank's blocks, rank after rank, into the same counter. A block pushed whole gives the
// additions its leaves would have, so 1 x 4, 2 x 2 and 4 x 1 add ((g0 + g1) + (g2 + g3)), and a
// state written at one number of ranks resumes at another with the same bits. The cost over one
// running sum is memory: a rank holds up to log2 K + 1 partial sums (K = 2: one, as before). The
// losses are added in the same order. Each micro-batch runs on cleared gradients, so its gradient is
// computed exactly as a lone micro-batch's would be (contributions of a parameter used twice are
// summed within it first). In the last micro-batch a gradient can be final before the backward
// ends: take() pushes it at that moment and hands the rank's blocks on (to a reduction bucket) or,
// with one rank, installs their sum as the parameter's .grad() (for an optimizer inside the
// backward); the parameters not taken are pushed after the backward.
class Accumulation {
 public:
  Accumulation(const std::vector<Tensor>& params, int64_t first_index)
      : params_(params), stacks_(params.size()), taken_(params.size(), 0), first_(first_index) {
    for (size_t i = 0; i < params.size(); ++i) index_.emplace(params[i].impl_ptr().get(), i);
  }
  // The parameter's index, or -1.
  int64_t find(const Tensor& leaf) const {
    auto it = leaf.defined() ? index_.find(leaf.impl_ptr().get()) : index_.end();
    return it == index_.end() ? -1 : static_cast<int64_t>(it->second);
  }
  // `leaf`'s gradient is final (in the last micro-batch `index`): its index, -1 if it is not a parameter.
  int64_t take(const Tensor& leaf, int64_t index) {
    const int64_t i = find(leaf);
    if (i < 0) return -1;
    const auto k = static_cast<size_t>(i);
    REMAT_CHECK(!taken_[k], "distributed: the gradient of \"", leaf.name(), "\" was reported final twice in one step");
    push(k, index);
    taken_[k] = 1;
    return i;
  }
  void end_micro_batch(int64_t index) {
    for (size_t i = 0; i < params_.size(); ++i)
      if (!taken_[i]) push(i, index);
  }
  // One rank: parameter i's gradient becomes the step's sum.
  void install(size_t i) {
    if (stacks_[i].empty()) return;
    Tensor total = stacks_[i].fold(add_gradient);
    const Tensor g = params_[i].grad();
    if (!g.defined() || g.storage() != total.storage()) {  // compared without reading values (a device's)
      params_[i].zero_grad();
      params_[i].set_grad(total);
    }
  }
  void install_rest() {
    for (size_t i = 0; i < params_.size(); ++i)
      if (!taken_[i]) install(i);
  }
  bool taken(size_t i) const { return taken_[i] != 0; }
  // Several ranks: parameter i's partial sums, one per block of this rank (zeros where it had no
  // gradient: another rank may have one).
  std::vector<Tensor> pieces(size_t i, const std::vector<internal::Block>& blocks) {
    if (stacks_[i].empty()) {
      std::vector<Tensor> zero;
      for (size_t j = 0; j < blocks.size(); ++j) zero.push_back(zeros(params_[i].shape(), params_[i].dtype()));
      return zero;
    }
    REMAT_ASSERT(stacks_[i].blocks() == blocks, "a rank's partial sums are not the blocks of its micro-batches");
    return stacks_[i].take_values();
  }

 private:
  static void add_gradient(Tensor& into, const Tensor& g) { distributed::add_gradient(into, g); }
  void push(size_t i, int64_t index) {
    Tensor g = params_[i].grad();
    if (!g.defined()) {
      // a micro-batch that gave this parameter no gradient: zeros keep the blocks of the tree
      if (stacks_[i].empty()) return;  // none yet: zeros are pushed if a later micro-batch has one
      g = zeros(params_[i].shape(), params_[i].dtype());
      if (params_[i].device().type != DeviceType::cpu) g = g.to(params_[i].device());
    } else if (!g.is_contiguous()) {
      params_[i].set_grad(g.contiguous());
      g = params_[i].grad();
    }
    if (stacks_[i].empty() && index != first_) {  // earlier micro-batches had none: zeros for them
      for (int64_t j = first_; j < index; ++j) {
        Tensor z = zeros(params_[i].shape(), params_[i].dtype());
        if (params_[i].device().type != DeviceType::cpu) z = z.to(params_[i].device());
        stacks_[i].push({j, 1}, z, add_gradient);
      }
    }
    stacks_[i].push({index, 1}, g, add_gradient);
  }

  std::vector<Tensor> params_;
  std::vector<internal::TreeStack<Tensor>> stacks_;
  std::vector<char> taken_;
  int64_t first_;
  std::unordered_map<const TensorImpl*, size_t> index_;
};

// The reduction after the backward (no buckets): each parameter's partial sums over the ranks, one
// parameter after the other; the sums become the gradients. Returns the seconds it took.
double reduce_pieces(const std::vector<Tensor>& params, Accumulation& acc, const internal::SumLayout& layout,
                     Reduction mode) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<internal::Block>& mine = layout.blocks[static_cast<size_t>(rank())];
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = params[i];
    const std::vector<Tensor> pieces = acc.pieces(i, mine);
    std::vector<Tensor> flats;
    for (const Tensor& piece : pieces) flats.push_back(piece.reshape({piece.numel()}));
    const Tensor scratch = mode == Reduction::ordered
                               ? Tensor::empty({internal::scratch_elements(p.numel(), layout)}, p.dtype())
                               : Tensor();
    internal::start_sum(flats, scratch, layout, mode)->wait();
    const Tensor g = p.grad();
    if (!g.defined() || g.storage() != pieces.front().storage()) {
      p.zero_grad();
      p.set_grad(pieces.front());
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

StepResult data_parallel_step(const std::vector<Tensor>& params, int64_t step, const StepOptions& options,
                              const MicroBatchFn& micro) {
  const int me = rank(), world = world_size();
  REMAT_CHECK(options.accumulate >= 1 && step >= 0, "distributed: data_parallel_step needs accumulate >= 1 and step >= 0, got ",
              options.accumulate, " and ", step);
  REMAT_CHECK(micro != nullptr, "distributed: data_parallel_step needs a micro-batch function");
  const int64_t n = options.accumulate * world;
  const internal::SumLayout layout = internal::layout_of(options.accumulate, world);
  const std::vector<internal::Block>& mine = layout.blocks[static_cast<size_t>(me)];
  // the blocks by global index within the step: the tree is the same whatever the step
  const int64_t first = micro_batch_index(step, 0, options.accumulate, me, world);
  Accumulation acc(params, first - step * n);
  std::vector<char> handed_scaled(params.size(), 0);  // hand_on scaled it and gave it away
  std::vector<double> losses;
  for (int64_t m = 0; m < options.accumulate; ++m) {
    const int64_t index = micro_batch_index(step, m, options.accumulate, me, world);
    const int64_t in_step = index - step * n;
    const bool last = m + 1 == options.accumulate;
    for (Tensor p : params) p.zero_grad();
    const HandOnFn hand_on = [&](const Tensor& p) {
      REMAT_CHECK(last && world == 1, "distributed: hand_on is for the last micro-batch's backward of a one-rank step "
                  "(with several ranks the gradients are reduced before they are final)");
      const int64_t i = acc.take(p, in_step);
      if (i < 0) return false;
      acc.install(static_cast<size_t>(i));
      if (n > 1 && p.grad().defined()) scale_gradient(p.grad(), 1.0 / static_cast<double>(n));
      handed_scaled[static_cast<size_t>(i)] = 1;
      return true;
    };
    std::optional<GradReadyHook> to_buckets;
    if (last && world > 1 && options.buckets != nullptr)
      to_buckets.emplace([&](const Tensor& leaf) {
        const int64_t i = acc.take(leaf, in_step);
        if (i >= 0) options.buckets->ready(leaf, acc.pieces(static_cast<size_t>(i), mine));
      });
    losses.push_back(micro(index, last, hand_on));
    to_buckets.reset();
    acc.end_micro_batch(in_step);
  }
  StepResult out;
  if (world == 1) {
    acc.install_rest();
  } else if (options.buckets != nullptr) {
    // the parameters no hook reported: their partial sums now (zeros where there are none)
    for (size_t i = 0; i < params.size(); ++i)
      if (!acc.taken(i)) options.buckets->ready(params[i], acc.pieces(i, mine));
    const GradientBuckets::Timing t = options.buckets->finish();
    out.communication_seconds = t.hidden_seconds + t.exposed_seconds;
    out.hidden_seconds = t.hidden_seconds;
  } else {
    out.communication_seconds = reduce_pieces(params, acc, layout, options.reduction);
  }
  // the losses in the tree's order, over every rank's micro-batches
  internal::TreeStack<double> loss_tree;
  const std::vector<double> all = internal::all_gather_values(losses);
  for (size_t i = 0; i < all.size(); ++i)
    loss_tree.push({static_cast<int64_t>(i), 1}, all[i], [](double& a, const double& b) { a = a + b; });
  out.loss = loss_tree.fold([](double& a, const double& b) { a = a + b; }) / static_cast<double>(n);
  if (n > 1)
    for (size_t i = 0; i < params.size(); ++i)
      if (!handed_scaled[i] && params[i].grad().defined()) scale_gradient(params[i].grad(), 1.0 / static_cast<double>(n));
  return out;
}

std::vector<int> optimizer_owners(const std::vector<Tensor>& params, int world) {
  REMAT_CHECK(world >= 1, "distributed: optimizer_owners needs world >= 1, got ", world);
  double total = 0;
  for (const Tensor& p : params) total += static_cast<double>(p.nbytes());
  std::vector<int> owners;
  double before = 0;
  for (const Tensor& p : params) {
    const double mid = before + static_cast<double>(p.nbytes()) / 2;
    const int owner = total > 0 ? static_cast<int>(mid / total * world) : 0;
    owners.push_back(std::min(std::max(owner, owners.empty() ? 0 : owners.back()), world - 1));
    before += static_cast<double>(p.nbytes());
  }
  return owners;
}

void broadcast_from_owners(const std::vector<Tensor>& params, const std::vector<int>& owners) {
  REMAT_CHECK(owners.size() == params.size(), "distributed: broadcast_from_owners got ", owners.size(), " owners for ",
              params.size(), " parameters");
  for (size_t i = 0; i < params.size(); ++i) broadcast({params[i]}, owners[i]);
}

}  // namespace remat::distributed
