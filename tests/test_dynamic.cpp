// Saved-value hooks, dynamic rematerialization (dynamic:BYTES) and offloading (offload:DIR).
// Random DAG programs of plain ops (shared subexpressions, skip connections, views, dropout,
// custom ops, values used by several later ops, ops with aux outputs) under budget sweeps from
// the smallest feasible budget up to save-all's peak: gradients bitwise equal to save-all, the
// measured peak of saved bytes within the budget, the allocator back to its baseline after every
// step. Offload round trips and failure paths.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "module_models.h"
#include "remat/dynamic.h"
#include "remat/saved_hooks.h"
#include "temp_dir.h"

using namespace remat;
using remat::testing::bitwise_equal;
using remat::testing::fresh_dir;

namespace {

// ---- random DAG programs
struct Program {
  uint64_t seed;
  DType dtype;
  int64_t batch, width;
  int nodes;
  std::vector<Tensor> params;

  explicit Program(uint64_t s) : seed(s) {
    std::mt19937_64 rng(s);
    dtype = rng() % 2 == 0 ? DType::f32 : DType::f64;
    batch = 2 + static_cast<int64_t>(rng() % 6);
    width = 4 + static_cast<int64_t>(rng() % 12);
    nodes = 6 + static_cast<int>(rng() % 20);
    for (int i = 0; i < 4; ++i)
      params.push_back(randn({width, width}, dtype, RngState{s, static_cast<uint64_t>(i) << 32}, 0.0,
                             0.7 / std::sqrt(static_cast<double>(width)))
                           .requires_grad_());
    params.push_back(randn({width}, dtype, RngState{s + 1, 0}).requires_grad_());
  }

  // The same program every call (its shape drawn from the seed); dropout draws from the generator.
  Tensor run(const Tensor& x) const {
    static const CustomOp square_op{"square",
                                    [](const TensorList& in, SaveContext& ctx) {
                                      ctx.save(in[0]);
                                      return TensorList{mul(in[0], in[0])};
                                    },
                                    [](const TensorList& g, const SavedValues& saved) {
                                      return TensorList{mul(mul_scalar(saved[0], 2.0), g[0])};
                                    }};
    std::mt19937_64 rng(seed * 7 + 3);
    std::vector<Tensor> values{x};
    auto pick = [&](int window) {
      const int n = static_cast<int>(values.size());
      return values[static_cast<size_t>(std::max(0, n - 1 - static_cast<int>(rng() % static_cast<uint64_t>(std::min(n, window)))))];
    };
    for (int i = 0; i < nodes; ++i) {
      const Tensor& a = pick(3);
      const Tensor& b = pick(8);  // skip connections to older values
      Tensor v;
      switch (rng() % 12) {
        case 0: v = tanh(matmul(a, params[rng() % 4])); break;
        case 1: v = add(a, b); break;
        case 2: v = mul(a, sigmoid(b)); break;
        case 3: v = gelu(add(matmul(a, params[rng() % 4]), params[4]), true); break;
        case 4: v = dropout(a, 0.25); break;
        case 5: v = square_op({tanh(a)})[0]; break;
        case 6: v = layer_norm(a, params[4], params[4], 1e-5); break;
        case 7: v = softmax(a, -1); break;
        case 8: v = a.transpose(0, 1).contiguous().transpose(0, 1); break;          // views
        case 9: v = concat({a.slice(1, 0, width / 2), b.slice(1, width / 2, width)}, -1); break;
        case 10: v = exp(mul_scalar(tanh(a), 0.5)); break;
        default: v = mul(a, b); break;
      }
      values.push_back(v);
    }
    Tensor loss = mean(values.back());
    for (size_t i = 1; i + 1 < values.size(); i += 3) loss = add(loss, mul_scalar(mean(square(values[i])), 0.01));
    return loss;
  }

  TensorList grads(const Tensor& x, const Policy& policy, size_t* peak = nullptr) const {
    TensorList wrt = params;
    wrt.push_back(x);
    manual_seed(seed + 11);
    memory::reset_peaks();
    const size_t base = memory::live_bytes(memory::Tag::saved);
    const size_t total_base = memory::stats().live_total;
    TensorList g = remat::grad([&](const TensorList&) { return run(x); }, wrt, GradOptions{policy});
    if (peak) *peak = memory::peak_bytes(memory::Tag::saved) - base;
    EXPECT_EQ(memory::live_bytes(memory::Tag::saved), base) << "saved bytes left after the step";
    EXPECT_LE(memory::stats().live_total, total_base + [&] {
      size_t bytes = 0;
      for (const auto& t : g) bytes += t.nbytes();
      return bytes;
    }()) << "bytes left after the step beyond the returned gradients";
    return g;
  }
};

void expect_same(const TensorList& got, const TensorList& reference, const std::string& what) {
  ASSERT_EQ(got.size(), reference.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(bitwise_equal(got[i], reference[i])) << what << ": gradient " << i;
}

// mean(tanh(...tanh(tanh(x W) W)... W)) with n layers: a program whose saved values are x, the
// n activations (each the next matmul's input) and the weight.
std::function<Tensor()> tanh_chain(const Tensor& x, const Tensor& weight, int n) {
  return [x, weight, n] {
    Tensor h = x;
    for (int i = 0; i < n; ++i) h = tanh(matmul(h, weight));
    return mean(h);
  };
}

}  // namespace

// ---- saved-value hooks

TEST(SavedHooks, ACountingHookSeesEachStorageOnceAndChangesNothing) {
  Tensor w = randn({6, 6}, DType::f64, RngState{1, 0}).requires_grad_();
  Tensor x = randn({4, 6}, DType::f64, RngState{2, 0}).requires_grad_();
  auto f = [&] {
    Tensor h = tanh(matmul(x, w));   // tanh keeps h
    Tensor v = h.transpose(0, 1);    // a view of h
    return sum(mul_scalar(matmul(v, h), 0.5));  // matmul keeps v and h: the same storage as tanh's
  };
  TensorList reference = remat::grad([&](const TensorList&) { return f(); }, {w, x}, GradOptions{Policy::save_all()});
  int packs = 0, unpacks = 0;
  size_t packed_bytes = 0;
  SavedTensorHooks counting{[&](const Tensor& storage) -> PackedValue {
                              ++packs;
                              packed_bytes += storage.nbytes();
                              return std::make_shared<Tensor>(storage);
                            },
                            [&](const PackedValue& p) {
                              ++unpacks;
                              return *std::static_pointer_cast<Tensor>(p);
                            }};
  std::vector<PackedValue> repacked;  // what is saved again shares its first packed form
  counting.repack = [&](const PackedValue& p) { repacked.push_back(p); };
  TensorList got;
  {
    ScopedSavedTensorHooks hooks(counting);
    got = remat::grad([&](const TensorList&) { return f(); }, {w, x}, GradOptions{Policy::save_all()});
  }
  expect_same(got, reference, "counting hook");
  // saved: x, w (first matmul), h (tanh output; also both operands of the second matmul): 3 storages
  EXPECT_EQ(packs, 3);
  ASSERT_EQ(repacked.size(), 2u);  // h, by the second matmul, twice
  EXPECT_EQ(repacked[0], repacked[1]);
  EXPECT_EQ(packed_bytes, (4 * 6 + 36 + 4 * 6) * sizeof(double));
  EXPECT_GE(unpacks, 4);
}

TEST(SavedHooks, AnUnpackOfTheWrongSizeIsAnError) {
  Tensor w = randn({3, 3}, DType::f64, RngState{1, 0}).requires_grad_();
  Tensor loss;
  SavedTensorHooks bad{[](const Tensor& s) -> PackedValue { return std::make_shared<Tensor>(s); },
                       [](const PackedValue&) { return zeros({2}, DType::f64); }};
  {
    ScopedSavedTensorHooks hooks(bad);
    loss = sum(tanh(w));
  }
  try {
    loss.backward();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unpack returned"), std::string::npos) << e.what();
  }
}

TEST(SavedHooks, OverwritingASavedValueIsStillAnError) {
  Tensor w = randn({3, 3}, DType::f64, RngState{1, 0}).requires_grad_();
  Tensor x = randn({2, 3}, DType::f64, RngState{2, 0});
  Tensor loss;
  SavedTensorHooks keep{[](const Tensor& s) -> PackedValue { return std::make_shared<Tensor>(s); },
                        [](const PackedValue& p) { return *std::static_pointer_cast<Tensor>(p); }};
  {
    ScopedSavedTensorHooks hooks(keep);
    loss = sum(matmul(x, w));
  }
  {
    NoGradGuard no_grad;
    x.fill_(1.0);
  }
  EXPECT_THROW(loss.backward(), Error);
}

// ---- dynamic:BYTES

TEST(Dynamic, PolicyParsesAndPrints) {
  EXPECT_EQ(Policy::parse("dynamic:64MiB").to_string(), "dynamic:67108864");
  EXPECT_EQ(Policy::parse(Policy::parse("dynamic:1000").to_string()), Policy::dynamic(1000));
  EXPECT_EQ(Policy::parse("offload:/tmp,threshold=1KiB,ram=1MiB"), Policy::offload("/tmp", 1024, 1 << 20));
  EXPECT_EQ(Policy::parse(Policy::offload("/tmp", 4096).to_string()), Policy::offload("/tmp", 4096));
  for (const char* bad : {"dynamic:", "dynamic:0", "dynamic:lots", "offload:", "offload:/tmp,size=3", "offload:/tmp,ram=x"}) {
    try {
      Policy::parse(bad);
      ADD_FAILURE() << bad << " parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("dynamic:BYTES"), std::string::npos) << e.what();
    }
  }
}

TEST(Dynamic, RandomDagProgramsUnderBudgetSweepsMatchSaveAllBitwise) {
  const int cases = 200;
  int tight_cases = 0;
  uint64_t evictions = 0, remats = 0;
  for (int c = 0; c < cases; ++c) {
    Program program(9000 + static_cast<uint64_t>(c));
    Tensor x = randn({program.batch, program.width}, program.dtype, RngState{static_cast<uint64_t>(c), 5}).requires_grad_();
    size_t save_all_peak = 0;
    TensorList reference = program.grads(x, Policy::save_all(), &save_all_peak);
    // the smallest feasible budget, as a run at save-all's peak reports it
    reset_counters();
    size_t peak = 0;
    expect_same(program.grads(x, Policy::dynamic(std::max<size_t>(save_all_peak, 1)), &peak), reference,
                "case " + std::to_string(c) + " at save-all's peak");
    const size_t smallest = counters().dynamic.smallest_feasible_bytes;
    ASSERT_GT(smallest, 0u);
    ASSERT_LE(smallest, save_all_peak);
    for (double fraction : {0.0, 0.25, 0.5, 1.0}) {
      const size_t budget = smallest + static_cast<size_t>(fraction * static_cast<double>(save_all_peak - smallest));
      const std::string what = "case " + std::to_string(c) + " budget " + std::to_string(budget) + " (smallest " +
                               std::to_string(smallest) + ", save-all " + std::to_string(save_all_peak) + ")";
      reset_counters();
      TensorList got;
      try {
        got = program.grads(x, Policy::dynamic(budget), &peak);
      } catch (const Error& e) {
        FAIL() << what << ": " << e.what();
      }
      expect_same(got, reference, what);
      EXPECT_LE(peak, budget) << what;
      if (fraction == 0.0 && budget < save_all_peak) ++tight_cases;
      evictions += counters().dynamic.evictions;
      remats += counters().dynamic.rematerializations;
    }
  }
  RecordProperty("evictions", static_cast<int>(evictions));
  RecordProperty("rematerializations", static_cast<int>(remats));
  EXPECT_GT(tight_cases, cases / 2);
  EXPECT_GT(remats, 0u);
}

TEST(Dynamic, AChainInASqrtBudgetRecomputesAndStaysWithin) {
  // 64 layers of tanh(h @ W): save-all keeps 64 activations; a budget of about 2*sqrt(64) of them
  const int n = 64;
  const int64_t b = 16, w = 32;
  Tensor weight = randn({w, w}, DType::f32, RngState{3, 0}, 0.0, 1.0 / std::sqrt(static_cast<double>(w))).requires_grad_();
  Tensor x = randn({b, w}, DType::f32, RngState{4, 0});
  const auto chain = tanh_chain(x, weight, n);
  auto f = [&](const TensorList&) { return chain(); };
  TensorList reference = remat::grad(f, {weight}, GradOptions{Policy::save_all()});
  const size_t activation = static_cast<size_t>(b * w) * sizeof(float);
  const size_t budget = 16 * activation;
  memory::reset_peaks();
  reset_counters();
  const size_t base = memory::live_bytes(memory::Tag::saved);
  TensorList got = remat::grad(f, {weight}, GradOptions{Policy::dynamic(budget)});
  expect_same(got, reference, "chain");
  EXPECT_LE(memory::peak_bytes(memory::Tag::saved) - base, budget);
  const Counters c = counters();
  EXPECT_GT(c.dynamic.evictions, 0u);
  EXPECT_GT(c.dynamic.rematerializations, 0u);
  // O(N) extra ops for an O(sqrt N) budget, not O(N^2)
  EXPECT_LT(c.dynamic.rematerializations, static_cast<uint64_t>(8 * n));
}

TEST(Dynamic, AnInfeasibleBudgetNamesTheSmallestAndChangesNothing) {
  Tensor w = randn({64, 64}, DType::f32, RngState{3, 0}).requires_grad_();
  Tensor x = randn({32, 64}, DType::f32, RngState{4, 0});
  const size_t live_before = memory::stats().live_total;
  try {
    remat::grad([&](const TensorList&) { return mean(tanh(matmul(x, w))); }, {w}, GradOptions{Policy::dynamic(1024)});
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("smallest feasible budget"), std::string::npos) << m;
    EXPECT_NE(m.find("MiB"), std::string::npos) << m;
  }
  EXPECT_FALSE(w.grad().defined());
  EXPECT_EQ(memory::stats().live_total, live_before);
  EXPECT_FALSE(detail::dynamic_running());
}

TEST(Dynamic, ComposesWithRegionsAndModules) {
  remat::testing::LoopModel model(8, 16, DType::f64, 3, /*residual=*/true, /*wide=*/true);
  Tensor x = randn({4, 16}, DType::f64, RngState{5, 0}).requires_grad_();
  TensorList reference = remat::testing::module_grads(model, x, Policy::save_all());
  const size_t save_all = remat::testing::measure_step(model, x, Policy::save_all()).peak_saved;
  // plain layer calls under dynamic, and explicit regions inside it (their kept inputs evictable)
  for (double fraction : {0.3, 0.6}) {
    const Policy policy = Policy::dynamic(static_cast<size_t>(fraction * static_cast<double>(save_all)));
    auto m = remat::testing::measure_step(model, x, policy);
    EXPECT_LE(m.peak_saved, policy.saved.dynamic_bytes);
    EXPECT_EQ(m.counters.regions_created, 0u);
    TensorList got = remat::testing::module_grads(model, x, policy);
    expect_same(got, reference, policy.to_string());
  }
  Tensor w = model.parameter("layer0.up.weight");
  auto with_regions = [&](const TensorList&) {
    Tensor h = x;
    for (int i = 0; i < 4; ++i)
      h = checkpoint([&](const Tensor& in) { return tanh(matmul(in, w.transpose(0, 1).slice(1, 0, 16))); }, h);
    return mean(h);
  };
  TensorList r2 = remat::grad(with_regions, {w, x}, GradOptions{Policy::save_all()});
  TensorList g2 = remat::grad(with_regions, {w, x}, GradOptions{Policy::dynamic(save_all / 4)});
  expect_same(g2, r2, "regions under dynamic");
}

// ---- offload:DIR

namespace {

size_t files_under(const std::string& dir) {
  size_t n = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

// Runs a step of f under an offload scope whose disk fills up: the step fails with a
// remat::Error that says so and that nothing was lost, no gradient is written and every byte
// the step allocated is back.
void expect_full_disk_error(const OffloadTarget& options, const OffloadFaults& faults, const std::function<Tensor()>& f,
                            const Tensor& weight, bool wait_for_writes) {
  const size_t live_before = memory::stats().live_total;
  bool failed = false;
  try {
    OffloadScope scope(options, faults);
    Tensor loss = f();
    if (wait_for_writes) scope.wait_for_writes();
    loss.backward();
  } catch (const Error& e) {
    failed = true;
    EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nothing was lost"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(failed);
  EXPECT_FALSE(weight.grad().defined());
  EXPECT_EQ(memory::stats().live_total, live_before);
}

}  // namespace

// dynamic:B+offload:DIR: at the same (smallest feasible) budget, evictions whose recomputation is
// dearer than a round trip through the file are written and read back instead of recomputed;
// gradients stay save-all's bits, the peak within the budget, and no file is left.
TEST(Dynamic, EvictingToAFileReadsBackInsteadOfRecomputing) {
  const std::string dir = fresh_dir("dynamic-offload");
  uint64_t remats_dropping = 0, remats_writing = 0;
  size_t written = 0, read = 0;
  for (int c = 0; c < 40; ++c) {
    Program program(9500 + static_cast<uint64_t>(c));
    Tensor x = randn({program.batch, program.width}, program.dtype, RngState{static_cast<uint64_t>(c), 5}).requires_grad_();
    size_t save_all_peak = 0, peak = 0;
    TensorList reference = program.grads(x, Policy::save_all(), &save_all_peak);
    reset_counters();
    program.grads(x, Policy::dynamic(std::max<size_t>(save_all_peak, 1)));
    const size_t budget = counters().dynamic.smallest_feasible_bytes;
    const std::string what = "case " + std::to_string(c) + " budget " + std::to_string(budget);
    reset_counters();
    expect_same(program.grads(x, Policy::dynamic(budget)), reference, what);
    remats_dropping += counters().dynamic.rematerializations;
    reset_counters();
    const Policy to_file = Policy::dynamic(budget).with_offload(OffloadTarget{dir, 0, 0});
    expect_same(program.grads(x, to_file, &peak), reference, what + " +offload");
    EXPECT_LE(peak, budget) << what;
    remats_writing += counters().dynamic.rematerializations;
    written += counters().dynamic.bytes_offloaded;
    read += counters().dynamic.bytes_read_on_demand;
    EXPECT_EQ(files_under(dir), 0u) << what;
  }
  EXPECT_GT(written, 0u);
  EXPECT_GT(read, 0u);
  EXPECT_LT(remats_writing, remats_dropping);
  std::filesystem::remove_all(dir);
}

TEST(Offload, RoundTripsBitwiseAndRemovesItsFiles) {
  const std::string dir = fresh_dir("offload");
  size_t offloaded = 0;
  for (int c = 0; c < 40; ++c) {
    Program program(7000 + static_cast<uint64_t>(c));
    Tensor x = randn({program.batch, program.width}, program.dtype, RngState{static_cast<uint64_t>(c), 5}).requires_grad_();
    TensorList reference = program.grads(x, Policy::save_all());
    reset_counters();
    TensorList got = program.grads(x, Policy::offload(dir, /*threshold=*/64, /*ram=*/c % 2 ? 4096 : 0));
    expect_same(got, reference, "offload case " + std::to_string(c));
    // a write still in flight when the backward pass needs its value is simply not waited for
    offloaded += counters().dynamic.bytes_offloaded;
    EXPECT_EQ(files_under(dir), 0u) << "files left after case " << c;
  }
  EXPECT_GT(offloaded, 0u);
  // nothing left: not even the private folders
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

TEST(Offload, PrefetchReadsAheadOfNeed) {
  const std::string dir = fresh_dir("prefetch");
  const int n = 24;
  Tensor weight = randn({64, 64}, DType::f32, RngState{3, 0}, 0.0, 0.12).requires_grad_();
  Tensor x = randn({64, 64}, DType::f32, RngState{4, 0});
  const auto f = tanh_chain(x, weight, n);
  ScopedPolicy keep(Policy::save_all());
  TensorList reference = remat::grad(TensorList{f()}, {weight});
  reset_counters();
  TensorList got;
  {
    OffloadTarget options;
    options.directory = dir;
    options.threshold_bytes = 1024;
    OffloadScope scope(options);
    Tensor loss = f();
    // Every value on disk before the backward starts (on a loaded machine the writes may still be
    // running otherwise, and a value still in memory is neither prefetched nor read).
    scope.wait_for_writes();
    // One file per saved storage: x, the n tanh outputs (each the next matmul's input) and the
    // weight, each 64 x 64 f32.
    EXPECT_EQ(counters().dynamic.bytes_offloaded, size_t{n + 2} * 64 * 64 * 4);
    got = remat::grad(TensorList{loss}, {weight});
  }
  expect_same(got, reference, "prefetch");
  const Counters c = counters();
  EXPECT_GT(c.dynamic.bytes_prefetched, 0u);
  EXPECT_EQ(c.dynamic.bytes_prefetched + c.dynamic.bytes_read_on_demand, c.dynamic.bytes_offloaded);
  std::filesystem::remove_all(dir);
}

TEST(Offload, ADirectoryThatCannotBeUsedIsAClearError) {
  const std::string dir = fresh_dir("notadir");
  const std::string file = dir + "/plain-file";
  std::ofstream(file) << "x";
  Tensor w = randn({3, 3}, DType::f64, RngState{1, 0}).requires_grad_();
  for (const std::string& bad : {file, dir + "/missing"}) {
    try {
      remat::grad([&](const TensorList&) { return sum(tanh(w)); }, {w}, GradOptions{Policy::offload(bad)});
      ADD_FAILURE() << bad << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not a directory"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(detail::offload_running());
  std::filesystem::remove_all(dir);
}

TEST(Offload, AFailedWriteIsAnErrorAndLosesNothing) {
  const std::string dir = fresh_dir("full");
  Tensor weight = randn({32, 32}, DType::f32, RngState{3, 0}, 0.0, 0.2).requires_grad_();
  Tensor x = randn({32, 32}, DType::f32, RngState{4, 0});
  const auto f = tanh_chain(x, weight, 12);
  TensorList reference = remat::grad([&](const TensorList&) { return f(); }, {weight}, GradOptions{Policy::save_all()});
  OffloadTarget options;
  options.directory = dir;
  options.threshold_bytes = 1024;
  options.ram_bytes = 2 * 32 * 32 * sizeof(float);         // the forward waits for the writes
  OffloadFaults full;
  full.fail_after_bytes = 3 * 32 * 32 * sizeof(float);     // the disk is full after 3 values
  expect_full_disk_error(options, full, f, weight, /*wait_for_writes=*/false);
  EXPECT_EQ(files_under(dir), 0u);
  // the program still works (under offload with a healthy disk, too)
  TensorList again = remat::grad([&](const TensorList&) { return f(); }, {weight}, GradOptions{Policy::offload(dir, 1024)});
  expect_same(again, reference, "after the failure");
  std::filesystem::remove_all(dir);
}

namespace {

// The open descriptors of this process that point at a file under dir (an offload store's
// nameless file shows as "dir/#inode (deleted)").
size_t descriptors_under(const std::string& dir) {
  size_t n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind(dir + "/", 0) == 0) ++n;
  }
  return n;
}

}  // namespace

TEST(Offload, AnEndedScopeKeepsItsNamelessFileForTheNext) {
  const std::string dir = fresh_dir("pool");
  release_offload_files();
  Tensor weight = randn({48, 48}, DType::f32, RngState{3, 0}, 0.0, 0.15).requires_grad_();
  Tensor x = randn({48, 48}, DType::f32, RngState{4, 0});
  const auto f = tanh_chain(x, weight, 10);
  const TensorList reference = remat::grad([&](const TensorList&) { return f(); }, {weight}, GradOptions{Policy::save_all()});
  EXPECT_EQ(descriptors_under(dir), 0u);
  for (int step = 0; step < 3; ++step) {
    reset_counters();
    TensorList got;
    {
      ScopedPolicy keep(Policy::save_all());
      OffloadTarget options;
      options.directory = dir;
      options.threshold_bytes = 1024;
      OffloadScope scope(options);
      Tensor loss = f();
      scope.wait_for_writes();  // every value on disk (in the file) before the backward pass
      got = remat::grad(TensorList{loss}, {weight});
    }
    expect_same(got, reference, "step " + std::to_string(step));
    EXPECT_EQ(counters().dynamic.bytes_offloaded, size_t{12} * 48 * 48 * 4);  // x, 10 outputs, weight
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the file has no name";
    EXPECT_EQ(descriptors_under(dir), 1u) << "step " << step << ": one file, reused by every step";
  }
  release_offload_files();
  EXPECT_EQ(descriptors_under(dir), 0u);
  std::filesystem::remove_all(dir);
}

namespace {

// Whether [p, p + bytes) lies in a mapping of a file under dir (/proc/self/maps names an offload
// store's nameless file "dir/#inode (deleted)").
bool mapped_from(const void* p, size_t bytes, const std::string& dir) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    if (line.find(" " + dir + "/") == std::string::npos) continue;
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &begin, &end) == 2 && at >= begin && at + bytes <= end) return true;
  }
  return false;
}

// A CustomOp y = x * x whose backward keeps its saved x in `stash` (while `keep`).
struct StashSquare {
  TensorList stash;
  bool keep = true;
  CustomOp op{"stash_square",
              [](const TensorList& in, SaveContext& ctx) {
                ctx.save(in[0]);
                return TensorList{mul(in[0], in[0])};
              },
              [this](const TensorList& g, const SavedValues& saved) {
                if (keep) stash.push_back(saved[0]);
                return TensorList{mul(mul_scalar(saved[0], 2.0), g[0])};
              }};
};

}  // namespace

TEST(Offload, TheBackwardReadsResidentValuesThroughTheFilesMapping) {
  const std::string dir = fresh_dir("mapped");
  release_offload_files();
  ScopedPolicy keep(Policy::save_all());
  StashSquare square;
  Tensor w = randn({256, 64}, DType::f32, RngState{3, 0}).requires_grad_();
  auto f = [&] { return sum(square.op({tanh(w)})[0]); };
  const TensorList reference = remat::grad([&](const TensorList&) { return f(); }, {w}, GradOptions{Policy::save_all()});
  square.stash.clear();
  const size_t allocations_before = memory::stats().allocations_total;
  remat::grad([&](const TensorList&) { return f(); }, {w}, GradOptions{Policy::save_all()});
  const uint64_t save_all_allocations = memory::stats().allocations_total - allocations_before;
  square.stash.clear();
  reset_counters();
  TensorList got;
  uint64_t offload_allocations = 0;
  {
    OffloadTarget options;
    options.directory = dir;
    options.threshold_bytes = 1024;
    OffloadScope scope(options);
    const size_t before = memory::stats().allocations_total;
    Tensor loss = f();
    scope.wait_for_writes();  // tanh(w) (and tanh's output, the same storage) in the file, out of memory
    got = remat::grad(TensorList{loss}, {w});
    offload_allocations = memory::stats().allocations_total - before;
  }
  expect_same(got, reference, "mapped");
  EXPECT_EQ(counters().dynamic.bytes_offloaded, size_t{256} * 64 * 4);
  EXPECT_EQ(counters().dynamic.bytes_mapped, counters().dynamic.bytes_offloaded);
  ASSERT_EQ(square.stash.size(), 1u);
  EXPECT_TRUE(mapped_from(square.stash[0].raw_data(), square.stash[0].nbytes(), dir))
      << "the backward got a copy, not the file's pages";
  // No buffer was allocated to read the value back: the step allocated what save-all's does.
  EXPECT_EQ(offload_allocations, save_all_allocations);
  square.stash.clear();
  release_offload_files();
  EXPECT_EQ(descriptors_under(dir), 0u);
  std::filesystem::remove_all(dir);
}

TEST(Offload, AValueHeldPastItsScopeKeepsItsBytesAndItsFile) {
  // A tensor over a value's mapped pages outlives the scope: its range is not reused by the next
  // scope, and its file closes only when the tensor is gone.
  const std::string dir = fresh_dir("held");
  release_offload_files();
  ScopedPolicy keep(Policy::save_all());
  StashSquare square;
  OffloadTarget options;
  options.directory = dir;
  options.threshold_bytes = 1024;
  auto step = [&](uint64_t seed) {
    Tensor w = randn({128, 64}, DType::f32, RngState{seed, 0}).requires_grad_();
    OffloadScope scope(options);
    Tensor loss = sum(square.op({tanh(w)})[0]);
    scope.wait_for_writes();
    loss.backward();
    return tanh(w).detach();  // what the stashed value holds
  };
  const Tensor first = step(1);
  ASSERT_EQ(square.stash.size(), 1u);
  Tensor held = square.stash[0];
  ASSERT_TRUE(mapped_from(held.raw_data(), held.nbytes(), dir));
  EXPECT_EQ(descriptors_under(dir), 1u) << "the held value's file, not pooled";
  square.keep = false;
  for (uint64_t seed = 2; seed < 5; ++seed) step(seed);  // other values of the same size, in a new file
  EXPECT_EQ(descriptors_under(dir), 2u) << "the held value's file and the pooled one";
  expect_same({held}, {first}, "held past its scope");
  square.stash.clear();
  EXPECT_EQ(descriptors_under(dir), 2u) << "held is still alive";
  held = Tensor();
  EXPECT_EQ(descriptors_under(dir), 1u) << "the held value's file closed with it";
  release_offload_files();
  EXPECT_EQ(descriptors_under(dir), 0u);
  std::filesystem::remove_all(dir);
}

TEST(Offload, AFullFileSystemIsAnErrorAndLosesNothing) {
  // A real full disk where the test may mount one (root, as CI runs it); otherwise skipped, the
  // injected failure above covering the same path.
  const std::string dir = fresh_dir("tmpfs");
  if (std::system(("mount -t tmpfs -o size=64k tmpfs " + dir + " 2>/dev/null").c_str()) != 0) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "cannot mount a tmpfs here";
  }
  Tensor weight = randn({64, 64}, DType::f32, RngState{3, 0}, 0.0, 0.12).requires_grad_();
  Tensor x = randn({64, 64}, DType::f32, RngState{4, 0});
  const auto f = tanh_chain(x, weight, 12);  // 12 x 16 KiB: more than 64 KiB
  const TensorList reference = remat::grad([&](const TensorList&) { return f(); }, {weight}, GradOptions{Policy::save_all()});
  OffloadTarget options;
  options.directory = dir;
  options.threshold_bytes = 1024;
  expect_full_disk_error(options, {}, f, weight, /*wait_for_writes=*/true);
  release_offload_files();
  EXPECT_EQ(descriptors_under(dir), 0u);
  std::system(("umount " + dir).c_str());
  std::filesystem::remove_all(dir);
}

TEST(Offload, AYieldedCoreChangesNoResult) {
  // offload's thread gives a core to its I/O worker (detail::yield_core). oneDNN's sgemm splits
  // k over threads for shapes like these, so its results depend on the thread count: GEMM and
  // oneDNN convolutions keep every thread, and the rest of the kernels do not depend on it.
  const int before = num_threads();
  set_num_threads(2);
  Tensor a = randn({8, 65536}, DType::f32, RngState{1, 0}), b = randn({65536, 8}, DType::f32, RngState{2, 0});
  Tensor img = randn({4, 8, 20, 20}, DType::f32, RngState{3, 0}), k = randn({16, 8, 3, 3}, DType::f32, RngState{4, 0});
  Tensor big = randn({1 << 20}, DType::f32, RngState{5, 0});
  auto run = [&] {
    TensorList out;
    out.push_back(matmul(a, b));
    out.push_back(matmul(b.transpose(0, 1), a.transpose(0, 1)));
    for (ConvAlgorithm algorithm : {ConvAlgorithm::onednn_plain, ConvAlgorithm::onednn_blocked, ConvAlgorithm::im2col_gemm}) {
      set_conv_algorithm(algorithm);
      out.push_back(conv2d(img, k, Tensor(), {1, 1}, {1, 1}));
    }
    set_conv_algorithm(ConvAlgorithm::automatic);
    out.push_back(sum(tanh(big)));
    out.push_back(softmax(big.reshape({1024, 1024}), 1));
    return out;
  };
  const TensorList full = run();
  EXPECT_FALSE(detail::yield_core(true));
  EXPECT_EQ(num_threads(), 2) << "num_threads() reports what was set, not the yielded count";
  const TensorList yielded = run();
  EXPECT_TRUE(detail::yield_core(false));
  set_num_threads(before);
  expect_same(yielded, full, "yielded core");
}

// dynamic_feasible_range on random programs: the smallest budget it names runs the step within
// itself with save-all's gradients, one byte less fails with an error naming the measured
// smallest, and at save-all's peak nothing is evicted.
TEST(Dynamic, FeasibleRangeIsTheSmallestBudgetThatRuns) {
  int below_first_need = 0;
  for (int c = 0; c < 30; ++c) {
    const std::string what = "case " + std::to_string(c);
    Program program(7000 + static_cast<uint64_t>(c));
    Tensor x = randn({program.batch, program.width}, program.dtype, RngState{static_cast<uint64_t>(c), 9}).requires_grad_();
    TensorList wrt = program.params;
    wrt.push_back(x);
    const TensorList reference = program.grads(x, Policy::save_all());
    auto step = [&] {
      manual_seed(program.seed + 11);
      remat::grad([&](const TensorList&) { return program.run(x); }, wrt, GradOptions{});
    };
    const DynamicRange range = dynamic_feasible_range(step);
    EXPECT_FALSE(detail::dynamic_running());
    ASSERT_GE(range.smallest_budget_bytes, 1u) << what;
    ASSERT_LE(range.smallest_budget_bytes, range.save_all_peak_bytes) << what;
    EXPECT_GE(range.runs, 2) << what;
    if (range.runs > 3) ++below_first_need;
    size_t peak = 0;
    expect_same(program.grads(x, Policy::dynamic(range.smallest_budget_bytes), &peak), reference, what);
    EXPECT_LE(peak, range.smallest_budget_bytes) << what;
    if (range.smallest_budget_bytes > 1) {
      try {
        program.grads(x, Policy::dynamic(range.smallest_budget_bytes - 1));
        ADD_FAILURE() << what << ": one byte below the smallest budget ran";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("of the whole step, measured by dynamic_feasible_range, is " +
                         std::to_string(range.smallest_budget_bytes) + " bytes"),
                  std::string::npos)
            << m;
      }
    }
    reset_counters();
    program.grads(x, Policy::dynamic(range.save_all_peak_bytes));
    EXPECT_EQ(counters().dynamic.evictions, 0u) << what;
  }
  RecordProperty("cases_past_the_first_need", below_first_need);
}
