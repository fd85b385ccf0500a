// The data-parallel layer on one rank (a test process is not started by mpirun): the sharding of
// a step's global batch, the micro-batch numbering, the gradient buckets' layout and their
// ready/finish cycle, gradient accumulation over micro-batches (data_parallel_step) and the ZeRO-1
// ownership of the parameters. Several ranks are tested through `remat train` under mpirun
// (tests/mpi, ctest -L mpi).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "remat/autodiff.h"
#include "remat/checkpoint.h"
#include "remat/distributed.h"
#include "remat/grad_ready.h"
#include "remat/ops.h"
#include "emulated_backend.h"

using namespace remat;
namespace dist = remat::distributed;

namespace {

template <class F>
void expect_error(F&& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what() << "\n  expected: " << fragment;
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.nbytes() == b.nbytes() && a.is_contiguous() && b.is_contiguous() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

Tensor parameter(const Shape& shape, double start, DType dtype = DType::f32, const std::string& name = "p",
                 Device device = kCpu) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + 0.37 * static_cast<double>(i) - 0.11 * static_cast<double>(i % 3);
  Tensor t = from_vector(v, shape, dtype).to(device);
  t.requires_grad_();
  t.set_name(name);
  return t;
}

// A tiny model: loss(index) = sum(tanh(x_index @ w + b)^2), x_index [2, 4] a function of index;
// `unused` takes part in no loss. On `device` (the CPU unless given).
struct Tiny {
  explicit Tiny(Device device = kCpu) : device(device) {}
  Device device;
  Tensor w = parameter({4, 3}, -0.4, DType::f32, "w", device);
  Tensor b = parameter({3}, 0.2, DType::f32, "b", device);
  Tensor unused = parameter({2}, 1.0, DType::f32, "unused", device);
  std::vector<Tensor> params() const { return {w, b, unused}; }
  Tensor loss(int64_t index) const {
    std::vector<double> x(8);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1 * static_cast<double>((index * 7 + static_cast<int64_t>(i) * 3) % 11) - 0.5;
    return sum(square(tanh(add(matmul(from_vector(x, {2, 4}).to(device), w), b))));
  }
  // Accumulates the gradients of micro-batch `index` into the parameters; returns its loss.
  double backward_of(int64_t index) const {
    return backward([&] { return loss(index); }, GradOptions{Policy::save_all()}).to(kCpu).item();
  }
  // The gradients of micro-batch `index` alone (fresh, contiguous copies).
  std::vector<Tensor> gradients_of(int64_t index) const {
    for (Tensor p : params()) p.zero_grad();
    backward_of(index);
    return {w.grad().contiguous().clone(), b.grad().contiguous().clone()};
  }
};

// a = a + b, then a * (1 / n) in f32: what one process accumulating in order computes.
Tensor mean_in_order(const std::vector<Tensor>& grads) {
  std::vector<float> acc = grads[0].to_vector_as<float>();
  for (size_t k = 1; k < grads.size(); ++k) {
    const std::vector<float> g = grads[k].to_vector_as<float>();
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = acc[i] + g[i];
  }
  if (grads.size() > 1) {
    const float f = static_cast<float>(1.0 / static_cast<double>(grads.size()));
    for (float& v : acc) v *= f;
  }
  return from_vector(acc, grads[0].shape());
}

// The micro-batch tree written out recursively (an independent statement of Note [the micro-batch
// tree]): the sum over [begin, begin + size) of an aligned power-of-two block is the sum of its two
// halves, left + right; [0, n) is its largest aligned blocks from the left, added in that order.
std::vector<float> tree_block(const std::vector<std::vector<float>>& g, size_t begin, size_t size) {
  if (size == 1) return g[begin];
  std::vector<float> left = tree_block(g, begin, size / 2);
  const std::vector<float> right = tree_block(g, begin + size / 2, size / 2);
  for (size_t i = 0; i < left.size(); ++i) left[i] = left[i] + right[i];
  return left;
}
Tensor mean_in_tree(const std::vector<Tensor>& grads) {
  std::vector<std::vector<float>> g;
  for (const Tensor& t : grads) g.push_back(t.to_vector_as<float>());
  std::vector<float> total;
  for (size_t begin = 0; begin < g.size();) {
    size_t size = 1;
    while (begin % (2 * size) == 0 && begin + 2 * size <= g.size()) size *= 2;
    const std::vector<float> block = tree_block(g, begin, size);
    if (total.empty()) total = block;
    else for (size_t i = 0; i < total.size(); ++i) total[i] = total[i] + block[i];
    begin += size;
  }
  const float f = static_cast<float>(1.0 / static_cast<double>(grads.size()));
  for (float& v : total) v *= f;
  return from_vector(total, grads[0].shape());
}

}  // namespace

TEST(DataParallel, OneRankWithoutMpirun) {
  EXPECT_EQ(dist::rank(), 0);
  EXPECT_EQ(dist::world_size(), 1);
}

TEST(DataParallel, ShardsAreContiguousAndBalanced) {
  for (int64_t count = 0; count <= 20; ++count)
    for (int world = 1; world <= 5; ++world) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const dist::Range range = dist::shard(count, r, world);
        EXPECT_EQ(range.begin, next) << count << " " << r << "/" << world;
        EXPECT_EQ(range.end - range.begin, count / world + (r < count % world ? 1 : 0)) << count << " " << r << "/" << world;
        next = range.end;
      }
      EXPECT_EQ(next, count);
    }
  expect_error([] { dist::shard(5, 3, 3); }, "shard(5, rank 3, world 3) is out of range");
  expect_error([] { dist::shard(-1, 0, 1); }, "is out of range");
  expect_error([] { dist::shard(5, 0, 0); }, "is out of range");
}

TEST(DataParallel, MicroBatchesAreNumberedRankMajor) {
  // world 3, 2 per rank: step 1 holds 6..11, rank r the run 6 + 2r, 7 + 2r
  EXPECT_EQ(dist::micro_batch_index(1, 0, 2, 0, 3), 6);
  EXPECT_EQ(dist::micro_batch_index(1, 1, 2, 2, 3), 11);
  for (int64_t step = 0; step < 4; ++step)
    for (int world = 1; world <= 4; ++world)
      for (int r = 0; r < world; ++r)  // rank r of `world` runs one process's micro-batch r of `world`
        EXPECT_EQ(dist::micro_batch_index(step, 0, 1, r, world), dist::micro_batch_index(step, r, world, 0, 1));
  EXPECT_EQ(dist::micro_batch_index(5, 1, 3), 16);  // this process: rank 0 of 1
  expect_error([] { dist::micro_batch_index(0, 2, 2, 0, 1); }, "is out of range");
  expect_error([] { dist::micro_batch_index(-1, 0, 1, 0, 1); }, "is out of range");
  expect_error([] { dist::micro_batch_index(0, 0, 1, 1, 1); }, "is out of range");
}

TEST(DataParallel, BucketsFollowReverseOrderSizeAndDtype) {
  // 40, 12, 16 (f64), 400 and 20 bytes, in buckets of 64: from the last parameter back, a new
  // bucket where the dtype changes or the next gradient does not fit; the 400 bytes alone
  const std::vector<Tensor> params = {parameter({10}, 0), parameter({3}, 0), parameter({2}, 0, DType::f64),
                                      parameter({100}, 0), parameter({5}, 0)};
  dist::GradientBuckets buckets(params, 64);
  EXPECT_EQ(buckets.bucket_count(), 4u);
  const std::vector<size_t> expected = {3, 3, 2, 1, 0};
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(buckets.bucket_of(i), expected[i]) << i;
  EXPECT_EQ(buckets.buffer_bytes(), 488u);  // one rank: no gathered copies
  expect_error([&] { buckets.bucket_of(5); }, "parameter index 5 out of range");
  expect_error([] { dist::GradientBuckets({parameter({2}, 0), Tensor()}, 64); }, "parameter 1 is undefined");
  Tensor twice = parameter({2}, 0);
  expect_error([&] { dist::GradientBuckets({twice, twice}, 64); }, "is listed twice");
}

TEST(DataParallel, ReadyAndFinishOnOneRank) {
  const std::vector<Tensor> params = {parameter({6}, 0, DType::f32, "a"), parameter({3}, 0, DType::f64, "b"),
                                      parameter({4}, 0, DType::f32, "c")};
  dist::GradientBuckets buckets(params, 16);
  for (int step = 0; step < 2; ++step) {
    std::vector<Tensor> expected;
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor p = params[i];
      p.set_grad(parameter(p.shape(), 0.5 + step + static_cast<double>(i), p.dtype()).detach());
      expected.push_back(p.grad().clone());
    }
    buckets.ready(params[2]);
    buckets.ready(params[1]);
    expect_error([&] { buckets.ready(params[1]); }, "the gradient of \"b\" was reported twice in one step");
    // "a" is not reported: it contributes zeros
    const dist::GradientBuckets::Timing t = buckets.finish();
    EXPECT_EQ(t.buckets_started_early, 2u);  // c's and b's buckets, started by ready()
    EXPECT_TRUE(same_bits(params[2].grad(), expected[2]));  // the sum over one rank: itself
    EXPECT_TRUE(same_bits(params[1].grad(), expected[1]));
    EXPECT_EQ(params[0].grad().to_vector(), std::vector<double>(6, 0.0));
  }
  expect_error([&] { buckets.ready(parameter({6}, 0)); }, "is not one of the bucketed parameters");
  Tensor c = params[2];
  c.zero_grad();
  expect_error([&] { buckets.ready(c); }, "the gradient of \"c\" must be f32 [4], got none");
}

TEST(DataParallel, StepAccumulatesInOrderAndScalesToTheMean) {
  Tiny m;
  for (int64_t accumulate : {1, 3}) {
    SCOPED_TRACE(accumulate);
    const int64_t step = 2;
    std::vector<Tensor> ws, bs;
    double loss_sum = 0;
    for (int64_t k = 0; k < accumulate; ++k) {
      const int64_t index = step * accumulate + k;
      std::vector<Tensor> g = m.gradients_of(index);
      ws.push_back(g[0]);
      bs.push_back(g[1]);
      loss_sum += m.loss(index).item();
    }
    std::vector<int64_t> indices;
    std::vector<bool> lasts;
    const dist::StepResult r = dist::data_parallel_step(
        m.params(), step, {.accumulate = accumulate}, [&](int64_t index, bool last, const dist::HandOnFn&) {
          indices.push_back(index);
          lasts.push_back(last);
          EXPECT_FALSE(m.w.grad().defined());  // each micro-batch starts on cleared gradients
          return m.backward_of(index);
        });
    std::vector<int64_t> expected_indices;
    for (int64_t k = 0; k < accumulate; ++k) expected_indices.push_back(step * accumulate + k);
    EXPECT_EQ(indices, expected_indices);
    EXPECT_EQ(lasts.back(), true);
    EXPECT_EQ(std::count(lasts.begin(), lasts.end(), true), 1);
    EXPECT_TRUE(same_bits(m.w.grad(), mean_in_order(ws)));
    EXPECT_TRUE(same_bits(m.b.grad(), mean_in_order(bs)));
    EXPECT_FALSE(m.unused.grad().defined());  // no gradient in any micro-batch: none
    EXPECT_EQ(r.loss, loss_sum / static_cast<double>(accumulate));
    EXPECT_EQ(r.communication_seconds, 0.0);
  }
}

// Four or more micro-batches: the pairwise tree of their index (((g0 + g1) + (g2 + g3)) ...), not a
// running sum, so that every split of a step over ranks gives the same bits; the losses likewise.
TEST(DataParallel, StepAddsThePairwiseTreeOfTheMicroBatchIndex) {
  Tiny m;
  for (int64_t accumulate : {4, 5, 6, 8}) {
    SCOPED_TRACE(accumulate);
    const int64_t step = 1;
    std::vector<Tensor> ws, bs;
    for (int64_t k = 0; k < accumulate; ++k) {
      std::vector<Tensor> g = m.gradients_of(step * accumulate + k);
      ws.push_back(g[0]);
      bs.push_back(g[1]);
    }
    dist::data_parallel_step(m.params(), step, {.accumulate = accumulate},
                             [&](int64_t index, bool, const dist::HandOnFn&) { return m.backward_of(index); });
    EXPECT_TRUE(same_bits(m.w.grad(), mean_in_tree(ws)));
    EXPECT_TRUE(same_bits(m.b.grad(), mean_in_tree(bs)));
    if (accumulate >= 4) EXPECT_FALSE(same_bits(m.w.grad(), mean_in_order(ws))) << "the tree is not the running sum";
  }
}

// On a device (the emulated one refuses host reads of its memory, as a GPU's is out of the host's
// reach) the step accumulates, scales and installs the gradients without reading them in place,
// and they have the CPU's bits.
TEST(DataParallel, StepRunsOnADevice) {
  remat::testing::EmulatedDevice dev;
  for (int64_t accumulate : {1, 3}) {
    SCOPED_TRACE(accumulate);
    Tiny host, on_device(dev.device);
    const auto micro = [](const Tiny& m) {
      return [&m](int64_t index, bool, const dist::HandOnFn&) { return m.backward_of(index); };
    };
    const dist::StepResult r_host = dist::data_parallel_step(host.params(), 1, {.accumulate = accumulate}, micro(host));
    const dist::StepResult r_dev =
        dist::data_parallel_step(on_device.params(), 1, {.accumulate = accumulate}, micro(on_device));
    EXPECT_EQ(r_dev.loss, r_host.loss);
    ASSERT_EQ(on_device.w.grad().device(), dev.device);
    EXPECT_TRUE(same_bits(on_device.w.grad().to(kCpu), host.w.grad()));
    EXPECT_TRUE(same_bits(on_device.b.grad().to(kCpu), host.b.grad()));
    EXPECT_FALSE(on_device.unused.grad().defined());
  }
}

TEST(DataParallel, HandOnGivesTheMeanToAConsumerInsideTheLastBackward) {
  Tiny m;
  const std::vector<Tensor> g2 = m.gradients_of(2), g3 = m.gradients_of(3);
  const Tensor w_mean = mean_in_order({g2[0], g3[0]}), b_mean = mean_in_order({g2[1], g3[1]});
  std::vector<Tensor> given;  // what the consumer received, in order
  dist::data_parallel_step(m.params(), 1, {.accumulate = 2}, [&](int64_t index, bool last, const dist::HandOnFn& hand_on) {
    if (!last) {
      expect_error([&] { hand_on(m.w); }, "hand_on is for the last micro-batch's backward");
      return m.backward_of(index);
    }
    EXPECT_FALSE(hand_on(parameter({2}, 0)));  // not a parameter
    GradReadyHook consumer([&](const Tensor& leaf) {
      if (!hand_on(leaf)) return;
      given.push_back(leaf.grad().contiguous().clone());
      Tensor(leaf).zero_grad();  // consumed: the step must leave it so
    });
    return m.backward_of(index);
  });
  ASSERT_EQ(given.size(), 2u);  // w and b, each once
  const bool w_first = given[0].shape() == m.w.shape();
  EXPECT_TRUE(same_bits(given[w_first ? 0 : 1], w_mean));
  EXPECT_TRUE(same_bits(given[w_first ? 1 : 0], b_mean));
  for (Tensor p : m.params()) EXPECT_FALSE(p.grad().defined()) << p.name();
}

TEST(DataParallel, StepOptionsAreChecked) {
  Tiny m;
  auto micro = [&](int64_t index, bool, const dist::HandOnFn&) { return m.loss(index).item(); };
  expect_error([&] { dist::data_parallel_step(m.params(), 0, {.accumulate = 0}, micro); }, "accumulate >= 1");
  expect_error([&] { dist::data_parallel_step(m.params(), -1, {}, micro); }, "step >= 0");
  expect_error([&] { dist::data_parallel_step(m.params(), 0, {}, nullptr); }, "needs a micro-batch function");
}

TEST(DataParallel, OptimizerOwnersSplitTheBytesIntoContiguousRuns) {
  const std::vector<Tensor> params = {parameter({10}, 0), parameter({10}, 0), parameter({10}, 0), parameter({30}, 0)};
  EXPECT_EQ(dist::optimizer_owners(params, 1), (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(dist::optimizer_owners(params, 2), (std::vector<int>{0, 0, 0, 1}));  // 30 | 30 elements
  // midpoints 5, 15, 25, 45 of 60 elements, in shares of 15: ranks 0, 1, 1, 3 (rank 2 owns nothing)
  EXPECT_EQ(dist::optimizer_owners(params, 4), (std::vector<int>{0, 1, 1, 3}));
  const std::vector<int> many = dist::optimizer_owners(params, 9);  // more ranks than parameters
  EXPECT_TRUE(std::is_sorted(many.begin(), many.end()));
  EXPECT_LE(many.back(), 8);
  EXPECT_EQ(dist::optimizer_owners({}, 3), std::vector<int>{});
  expect_error([&] { dist::optimizer_owners(params, 0); }, "world >= 1");
  const std::vector<double> before = params[3].to_vector();
  dist::broadcast_from_owners(params, {0, 0, 0, 0});  // one rank: its own values
  EXPECT_EQ(params[3].to_vector(), before);
  expect_error([&] { dist::broadcast_from_owners(params, {0}); }, "got 1 owners for 4 parameters");
}
