// Allocator accounting: alignment, exact live/peak bytes per tag on a small graph whose saved
// values are computed by hand, the return to the starting values once everything is released,
// reset_peaks, thread safety, and parse_bytes/format_bytes.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "emulated_backend.h"
#include "remat/autodiff.h"
#include "remat/backend.h"
#include "remat/memory.h"
#include "remat/ops.h"

using namespace remat;
using memory::Tag;

namespace {

constexpr size_t kF32 = 4;

size_t live(Tag t) { return memory::stats().live(t); }
size_t peak(Tag t) { return memory::stats().peak(t); }

// Live bytes per tag relative to a starting point.
struct Delta {
  memory::Stats base = memory::stats();
  int64_t live(Tag t) const {
    return static_cast<int64_t>(memory::stats().live(t)) - static_cast<int64_t>(base.live(t));
  }
  // peak since the last reset_peaks, relative to the starting live value
  int64_t peak(Tag t) const {
    return static_cast<int64_t>(memory::stats().peak(t)) - static_cast<int64_t>(base.live(t));
  }
};

void expect_all_live_equal(const memory::Stats& a, const memory::Stats& b) {
  for (size_t t = 0; t < memory::kTagCount; ++t)
    EXPECT_EQ(a.live_bytes[t], b.live_bytes[t]) << "tag " << memory::tag_name(static_cast<Tag>(t));
  EXPECT_EQ(a.live_total, b.live_total);
}

Tensor parameter(const Shape& shape, uint64_t seed) {
  Tensor p = Tensor::empty(shape, DType::f32, Tag::parameter);
  p.copy_(randn(shape, DType::f32, RngState{seed, 0}, 0.0, 0.5));
  return p.requires_grad_();
}

// ============================================================================================
// Alignment and exact counting
// ============================================================================================

TEST(Memory, TensorDataIs64ByteAligned) {
  for (int64_t n : {0, 1, 3, 15, 16, 17, 63, 64, 65, 1000, 4097})
    for (DType d : {DType::f32, DType::f64, DType::i64}) {
      Tensor t = Tensor::empty({n}, d);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.storage()->data()) % memory::kAlignment, 0u) << n;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
    }
  // results of ops are fresh blocks too
  Tensor a = ones({3, 5}), b = ones({5, 7});
  for (const Tensor& t : {add(a, a), matmul(a, b), sum(a, {1}), a.transpose(0, 1).contiguous()})
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.storage()->data()) % 64, 0u);
  for (size_t bytes : {size_t{1}, size_t{7}, size_t{100}, size_t{4096}}) {
    void* p = memory::cpu().allocate(bytes, Tag::other);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    memory::cpu().deallocate(p, bytes, Tag::other);
  }
}

TEST(Memory, CountersAreExactBytesNotRounded) {
  Delta d;
  memory::reset_peaks();
  {
    Tensor a = Tensor::empty({3}, DType::f32);  // 12 bytes, not 64
    Tensor b = Tensor::empty({5}, DType::f64, Tag::parameter);
    Tensor c = Tensor::empty({0}, DType::f32);
    EXPECT_EQ(d.live(Tag::other), 12);
    EXPECT_EQ(d.live(Tag::parameter), 40);
    EXPECT_EQ(a.storage()->bytes(), 12u);
    EXPECT_EQ(c.nbytes(), 0u);
    memory::Stats s = memory::stats();
    EXPECT_EQ(s.allocations[static_cast<size_t>(Tag::other)], 2u);
    EXPECT_EQ(s.allocations[static_cast<size_t>(Tag::parameter)], 1u);
    EXPECT_EQ(s.allocations_total, 3u);
    size_t sum = 0;
    for (auto v : s.live_bytes) sum += v;
    EXPECT_EQ(s.live_total, sum);
  }
  expect_all_live_equal(memory::stats(), d.base);
  EXPECT_EQ(memory::live_bytes(Tag::other), d.base.live(Tag::other));
}

TEST(Memory, SetTagMovesTheWholeBlock) {
  Delta d;
  Tensor t = Tensor::empty({10}, DType::f64);
  EXPECT_EQ(d.live(Tag::other), 80);
  t.storage()->set_tag(Tag::parameter);
  EXPECT_EQ(d.live(Tag::other), 0);
  EXPECT_EQ(d.live(Tag::parameter), 80);
  t = Tensor();
  expect_all_live_equal(memory::stats(), d.base);
}

// ============================================================================================
// A fixed small graph with hand-computed saved bytes
//
//   x_in [8,16] f32 (other, 512 B)           W1 [16,4] (parameter, 256 B)
//   b1 [4] (parameter, 16 B)                 W2 [4,2]  (parameter, 32 B)
//   h = matmul(x_in, W1)  [8,4] 128 B   saves x_in (512 B -> saved) and W1 (stays parameter)
//   z = add(h, b1)        [8,4] 128 B   saves nothing
//   y = tanh(z)           [8,4] 128 B   saves its output y (128 B -> saved)
//   o = matmul(y, W2)     [8,2]  64 B   saves y (already saved: not counted twice) and W2
//   s = square(o)         [8,2]  64 B   saves its input o (64 B -> saved)
//   loss = mean(s)        []      4 B   saves nothing
// saved = 512 + 128 + 64 = 704 B; gradients = 256 + 16 + 32 = 304 B.
// ============================================================================================

TEST(Memory, SavedAndGradientBytesOfAFixedGraph) {
  const size_t x_bytes = 8 * 16 * kF32, w1_bytes = 16 * 4 * kF32, b1_bytes = 4 * kF32, w2_bytes = 4 * 2 * kF32;
  const size_t h_bytes = 8 * 4 * kF32, o_bytes = 8 * 2 * kF32, loss_bytes = kF32;
  const int64_t saved_bytes = x_bytes + h_bytes /* y */ + o_bytes;
  const int64_t param_bytes = w1_bytes + b1_bytes + w2_bytes;

  const memory::Stats start = memory::stats();
  {
    Delta d;
    Tensor W1 = parameter({16, 4}, 1), b1 = parameter({4}, 2), W2 = parameter({4, 2}, 3);
    Tensor x_in = randn({8, 16}, DType::f32, RngState{4, 0});
    EXPECT_EQ(d.live(Tag::parameter), param_bytes);
    EXPECT_EQ(d.live(Tag::other), static_cast<int64_t>(x_bytes));

    // ---- forward
    Delta f;
    memory::reset_peaks();
    Tensor h = matmul(x_in, W1);
    Tensor z = add(h, b1);
    Tensor y = tanh(z);
    Tensor o = matmul(y, W2);
    Tensor s = square(o);
    Tensor loss = mean(s);

    EXPECT_EQ(f.live(Tag::saved), saved_bytes);
    EXPECT_EQ(f.peak(Tag::saved), saved_bytes);
    EXPECT_EQ(x_in.storage()->tag(), Tag::saved);
    EXPECT_EQ(y.storage()->tag(), Tag::saved);
    EXPECT_EQ(o.storage()->tag(), Tag::saved);
    EXPECT_EQ(h.storage()->tag(), Tag::other);
    EXPECT_EQ(W1.storage()->tag(), Tag::parameter);
    // other: +h +z +s +loss, while x_in, y and o moved to saved
    EXPECT_EQ(f.live(Tag::other), static_cast<int64_t>(h_bytes * 2 + o_bytes + loss_bytes) - static_cast<int64_t>(x_bytes));
    // the highest point: x_in and h both counted as other, just before matmul's node saved x_in
    EXPECT_EQ(f.peak(Tag::other), static_cast<int64_t>(h_bytes));
    EXPECT_EQ(f.live(Tag::parameter), 0);
    EXPECT_EQ(f.peak(Tag::parameter), 0);
    EXPECT_EQ(f.peak(Tag::gradient), 0);
    // what each node keeps (storage bytes, whatever their tag)
    EXPECT_EQ(h.grad_fn()->saved_bytes(), x_bytes + w1_bytes);
    EXPECT_EQ(z.grad_fn()->saved_bytes(), 0u);
    EXPECT_EQ(y.grad_fn()->saved_bytes(), h_bytes);
    EXPECT_EQ(o.grad_fn()->saved_bytes(), h_bytes + w2_bytes);
    EXPECT_EQ(s.grad_fn()->saved_bytes(), o_bytes);
    EXPECT_EQ(loss.grad_fn()->saved_bytes(), 0u);
    EXPECT_EQ(memory::stats().allocations[static_cast<size_t>(Tag::saved)], 0u) << "saving must not allocate";

    // ---- backward
    memory::reset_peaks();
    EXPECT_EQ(f.peak(Tag::saved), saved_bytes) << "reset_peaks sets peaks to the live values";
    loss.backward();
    EXPECT_EQ(f.live(Tag::saved), 0) << "every saved value is released by the backward pass";
    EXPECT_EQ(f.peak(Tag::saved), saved_bytes) << "the backward pass saves nothing new";
    EXPECT_EQ(f.live(Tag::gradient), param_bytes);
    EXPECT_EQ(f.peak(Tag::gradient), param_bytes);
    EXPECT_EQ(W1.grad().storage()->tag(), Tag::gradient);
    EXPECT_EQ(x_in.storage()->tag(), Tag::other);
    EXPECT_EQ(h.grad_fn()->saved_bytes(), 0u);
    // all intermediates (still held here) are plain `other` blocks again; temporaries are gone
    EXPECT_EQ(f.live(Tag::other), static_cast<int64_t>(h_bytes * 3 + o_bytes * 2 + loss_bytes));
    EXPECT_EQ(f.live(Tag::parameter), 0);

    // zero_grad frees the gradient blocks
    W1.zero_grad();
    EXPECT_EQ(f.live(Tag::gradient), static_cast<int64_t>(b1_bytes + w2_bytes));
  }
  // everything released: back exactly to the starting values
  expect_all_live_equal(memory::stats(), start);
}

TEST(Memory, SavingAViewKeepsItsWholeBlock) {
  const memory::Stats start = memory::stats();
  {
    Tensor big = rand({8, 16}, DType::f32, RngState{9, 0}, 1.0, 2.0).requires_grad_();
    Tensor part = big.slice(0, 2, 4);      // [2,16]: 128 B of a 512 B block
    Delta d;
    Tensor y = log(part);                  // log saves its input: the whole block stays alive
    EXPECT_EQ(d.live(Tag::saved), 512);
    EXPECT_EQ(y.grad_fn()->saved_bytes(), 512u);
    Tensor y2 = sqrt(part);                // saves its output only (a fresh 128 B block)
    EXPECT_EQ(d.live(Tag::saved), 512 + 128);
    remat::backward({y, y2}, {ones({2, 16}), ones({2, 16})});
    EXPECT_EQ(d.live(Tag::saved), 0);
  }
  expect_all_live_equal(memory::stats(), start);
}

TEST(Memory, RetainGraphKeepsSavedValuesUntilTheGraphDies) {
  const memory::Stats start = memory::stats();
  {
    Tensor x = parameter({4, 4}, 11);
    Delta d;
    Tensor loss;
    {
      Tensor y = exp(matmul(x, x));  // matmul saves x (parameter), exp saves y (64 B)
      loss = sum(y);
    }
    EXPECT_EQ(d.live(Tag::saved), 64);
    loss.backward(Tensor(), /*retain_graph=*/true);
    EXPECT_EQ(d.live(Tag::saved), 64);
    loss.backward();
    EXPECT_EQ(d.live(Tag::saved), 0);
    EXPECT_EQ(d.live(Tag::other), 4) << "only the loss itself is left";
    // dropping the graph without running it backward also frees what it saved
    Tensor loss2 = sum(exp(matmul(x, x)));
    EXPECT_EQ(d.live(Tag::saved), 64);
    loss2 = Tensor();
    EXPECT_EQ(d.live(Tag::saved), 0);
  }
  expect_all_live_equal(memory::stats(), start);
}

TEST(Memory, NoGradRecordsNothing) {
  Tensor x = parameter({4, 4}, 12);
  Delta d;
  memory::reset_peaks();
  {
    NoGradGuard guard;
    Tensor y = tanh(matmul(x, x));
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(d.live(Tag::saved), 0);
  }
  EXPECT_EQ(d.peak(Tag::saved), 0);
  expect_all_live_equal(memory::stats(), d.base);
}

TEST(Memory, ForwardBackwardCycleReturnsToStart) {
  // a longer run, repeated: the counters must not drift
  Tensor w = parameter({8, 8}, 21), g = parameter({8}, 22);
  Tensor x = randn({4, 3, 8}, DType::f32, RngState{23, 0});
  Tensor targets = from_indices({1, 0, 7, 3, 2, 5, 6, 4, 0, 1, 2, 3}, {12});
  auto step = [&] {
    Tensor h = gelu(matmul(x, w));
    Tensor n = rms_norm(h, g);
    Tensor logits = softmax(n, -1).reshape({12, 8});
    Tensor loss = cross_entropy(logits, targets);
    loss.backward();
  };
  step();  // first run creates the gradient buffers
  const memory::Stats start = memory::stats();
  for (int i = 0; i < 3; ++i) {
    step();
    expect_all_live_equal(memory::stats(), start);
  }
  w.zero_grad();
  g.zero_grad();
  EXPECT_EQ(memory::stats().live(Tag::gradient), start.live(Tag::gradient) - (64 + 8) * kF32);
}

// Cross entropy keeps its input logits (no new storage) and one log-sum-exp per row, never an
// [N, C] log-softmax: the forward's new live bytes are lse [N] + the mean's weight + the loss, its
// peak adds the per-row losses [N] and their sum, and the backward reads the logits back.
TEST(Memory, CrossEntropyKeepsOneLogSumExpPerRow) {
  const int64_t n = 8, classes = 1000;
  Tensor logits = randn({n, classes}, DType::f32, RngState{61, 0}).requires_grad_();
  Tensor targets = from_indices({0, 999, 5, -100, 17, 3, 400, 2}, {n});
  memory::reset_peaks();
  const memory::Stats before = memory::stats();
  Tensor loss = cross_entropy(logits, targets, 0.1);
  const memory::Stats after = memory::stats();
  const size_t lse = n * kF32, scale = kF32, value = kF32;
  EXPECT_EQ(after.live_total - before.live_total, lse + scale + value);  // was n * classes * 4 + scale + value
  EXPECT_LE(after.peak_total - before.live_total, lse + scale + value + n * kF32 + kF32);
  // the node's saved values: the logits it was given, the targets, lse and the weight
  EXPECT_EQ(loss.grad_fn()->saved_bytes(), n * classes * kF32 + n * sizeof(int64_t) + lse + scale);
  Tensor g = remat::grad({loss}, {logits})[0];
  for (int64_t c = 0; c < classes; ++c) EXPECT_EQ(g.at({3, c}), 0.0);  // the ignored row
}

TEST(Memory, ResetPeaks) {
  Delta d;
  memory::reset_peaks();
  memory::Stats s0 = memory::stats();
  EXPECT_EQ(s0.peak_bytes, s0.live_bytes);
  EXPECT_EQ(s0.peak_total, s0.live_total);
  EXPECT_EQ(s0.allocations_total, 0u);
  {
    Tensor a = Tensor::empty({100}, DType::f64);  // 800 B
    Tensor b = Tensor::empty({50}, DType::f32);   // 200 B
  }
  memory::Stats s1 = memory::stats();
  EXPECT_EQ(s1.peak(Tag::other) - s0.live(Tag::other), 1000u);
  EXPECT_EQ(s1.peak_total - s0.live_total, 1000u);
  EXPECT_EQ(s1.allocations_total, 2u);
  EXPECT_EQ(s1.live(Tag::other), s0.live(Tag::other));
  memory::reset_peaks();
  memory::Stats s2 = memory::stats();
  EXPECT_EQ(s2.peak(Tag::other), s2.live(Tag::other));
  EXPECT_EQ(s2.allocations_total, 0u);
  EXPECT_EQ(memory::peak_bytes(Tag::other), memory::live_bytes(Tag::other));
}

// ============================================================================================
// Thread safety
// ============================================================================================

TEST(Memory, ConcurrentAllocateFreeKeepsCountersConsistent) {
  const memory::Stats start = memory::stats();
  memory::reset_peaks();
  constexpr int kThreads = 8, kIterations = 2000;
  std::atomic<bool> go{false};
  std::atomic<int> finished{0};
  std::atomic<uint64_t> bytes_allocated{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<void*, std::pair<size_t, Tag>>> held;
      while (!go) std::this_thread::yield();
      for (int i = 0; i < kIterations; ++i) {
        size_t bytes = 1 + rng() % 3000;
        Tag tag = static_cast<Tag>(rng() % memory::kTagCount);
        void* p = memory::cpu().allocate(bytes, tag);
        bytes_allocated += bytes;
        held.push_back({p, {bytes, tag}});
        if (held.size() > 4 || rng() % 2) {
          size_t k = rng() % held.size();
          auto [q, info] = held[k];
          if (rng() % 3 == 0 && info.second != Tag::saved) {
            memory::cpu().retag(info.first, info.second, Tag::saved);
            info.second = Tag::saved;
          }
          memory::cpu().deallocate(q, info.first, info.second);
          held.erase(held.begin() + static_cast<long>(k));
        }
      }
      for (auto& [q, info] : held) memory::cpu().deallocate(q, info.first, info.second);
      ++finished;
    });
  go = true;
  // a reader sees consistent snapshots meanwhile
  int snapshots = 0, inconsistent = 0;
  while (finished < kThreads) {
    memory::Stats s = memory::stats();
    size_t sum = 0;
    bool ok = s.peak_total >= s.live_total;
    for (size_t t = 0; t < memory::kTagCount; ++t) {
      sum += s.live_bytes[t];
      ok = ok && s.peak_bytes[t] >= s.live_bytes[t];
    }
    ok = ok && sum == s.live_total;
    ++snapshots;
    if (!ok) ++inconsistent;
    std::this_thread::yield();
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(inconsistent, 0) << "of " << snapshots << " snapshots";
  memory::Stats end = memory::stats();
  expect_all_live_equal(end, start);
  EXPECT_EQ(end.allocations_total, static_cast<uint64_t>(kThreads) * kIterations);
  uint64_t per_tag = 0;
  for (auto a : end.allocations) per_tag += a;
  EXPECT_EQ(per_tag, end.allocations_total);
  EXPECT_GE(end.peak_total, start.live_total);
}

TEST(Memory, ConcurrentTrainingStepsOnThreadsReturnToStart) {
  // tensors, saved values (retagged blocks) and gradients from several threads at once
  const memory::Stats start = memory::stats();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      try {
        Tensor w = parameter({8, 8}, 100 + t);
        for (int i = 0; i < 50; ++i) {
          Tensor x = randn({4, 8}, DType::f32, RngState{static_cast<uint64_t>(t), static_cast<uint64_t>(i) * 64});
          Tensor loss = sum(tanh(matmul(x, w)));
          loss.backward();
        }
        if (!w.grad().defined()) ++failures;
      } catch (...) {
        ++failures;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, 0);
  expect_all_live_equal(memory::stats(), start);
}

// ============================================================================================
// parse_bytes / format_bytes
// ============================================================================================

TEST(Memory, ParseBytes) {
  using memory::parse_bytes;
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("0"), 0u);
  EXPECT_EQ(parse_bytes("7B"), 7u);
  EXPECT_EQ(parse_bytes("64MiB"), 64u << 20);
  EXPECT_EQ(parse_bytes("1.5GB"), 1500000000u);
  EXPECT_EQ(parse_bytes("1KiB"), 1024u);
  EXPECT_EQ(parse_bytes("0.5KiB"), 512u);
  EXPECT_EQ(parse_bytes("2 KiB"), 2048u);
  EXPECT_EQ(parse_bytes("10kb"), 10000u);
  EXPECT_EQ(parse_bytes("1k"), 1000u);
  EXPECT_EQ(parse_bytes("3M"), 3000000u);
  EXPECT_EQ(parse_bytes("1.5 mib"), 1572864u);
  EXPECT_EQ(parse_bytes("1GiB"), size_t{1} << 30);
  EXPECT_EQ(parse_bytes("2g"), 2000000000u);
  EXPECT_EQ(parse_bytes("2TiB"), size_t{2} << 40);
  EXPECT_EQ(parse_bytes("1TB"), 1000000000000u);
}

TEST(Memory, ParseBytesRejectsGarbage) {
  for (const char* bad : {"", "abc", "MiB", "12XB", "-5", "1e3", ".", "1.2.3MiB", "64 Mi B x", " 64MiB", "1..5KiB"}) {
    try {
      size_t v = memory::parse_bytes(bad);
      ADD_FAILURE() << "parse_bytes accepted '" << bad << "' as " << v;
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(std::string("'") + bad + "'"), std::string::npos) << m;
    }
  }
}

TEST(Memory, FormatBytes) {
  using memory::format_bytes;
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1), "1 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(64.0 * 1024 * 1024), "64.00 MiB");
  EXPECT_EQ(format_bytes(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
  EXPECT_EQ(format_bytes(2.0 * 1024 * 1024 * 1024 * 1024), "2.00 TiB");
  EXPECT_EQ(format_bytes(5000.0 * 1024 * 1024 * 1024 * 1024), "5000.00 TiB");
  for (double v : {0.0, 1.0, 1023.0, 1024.0, 1536.0, 64.0 * 1024 * 1024, 3.0 * 1024 * 1024 * 1024})
    EXPECT_EQ(static_cast<double>(memory::parse_bytes(format_bytes(v))), v) << format_bytes(v);
}

}  // namespace
