// char_rnn: a character-level recurrent network trained through remat::scan over long sequences
// of Debian's fortune cookies, with Revolve checkpointing: the backward pass keeps --snapshots
// states of the recurrence instead of all --seq of them.
//
//   char_rnn [--data PATH] [--seq 4096] [--batch 4] [--hidden 128] [--snapshots 64] [--steps 30]
//
// The loop state carries the hidden state [B, H] and, in one extra column, each sequence's
// running loss, so the whole sequence is one scan.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "remat/nn.h"
#include "remat/remat.h"
#include "remat/scan.h"

using namespace remat;

namespace {

std::string read_corpus(const std::string& path) {
  namespace fs = std::filesystem;
  std::string text;
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (auto& e : fs::directory_iterator(path))
      if (e.is_regular_file() && !e.is_symlink() && e.path().extension() != ".dat") files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else if (fs::exists(path)) {
    files.push_back(path);
  }
  for (auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    text += s.str();
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = "/usr/share/games/fortunes";
  int64_t seq = 4096, batch = 4, hidden = 128, steps = 30;
  int snapshots = 64;
  double lr = 3e-3;
  CLI::App app{"char_rnn: a character RNN trained through a checkpointed scan"};
  app.add_option("--data", data, "text file or folder")->capture_default_str();
  app.add_option("--seq", seq, "characters per sequence (loop length)")->capture_default_str();
  app.add_option("--batch", batch, "sequences per step")->capture_default_str();
  app.add_option("--hidden", hidden, "hidden units")->capture_default_str();
  app.add_option("--snapshots", snapshots, "Revolve slots")->capture_default_str();
  app.add_option("--steps", steps, "training steps")->capture_default_str();
  app.add_option("--lr", lr, "AdamW learning rate")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    std::string text = read_corpus(data);
    REMAT_CHECK(text.size() > static_cast<size_t>(seq + 2), "char_rnn: corpus at ", data,
                " is missing or too short; install Debian's fortunes package or pass --data");
    int index[256];
    std::fill(std::begin(index), std::end(index), -1);
    int64_t vocab = 0;
    for (unsigned char c : text)
      if (index[c] < 0) index[c] = static_cast<int>(vocab++);
    std::vector<int64_t> tokens(text.size());
    for (size_t i = 0; i < text.size(); ++i) tokens[i] = index[static_cast<unsigned char>(text[i])];

    const DType f32 = DType::f32;
    auto param = [&](const Shape& shape, double scale, uint64_t seed) {
      Tensor p = Tensor::empty(shape, f32, memory::Tag::parameter);
      p.copy_(randn(shape, f32, RngState{seed, 0}, 0.0, scale));
      return p.requires_grad_();
    };
    Tensor embed = param({vocab, hidden}, 0.1, 1), w_h = param({hidden, hidden}, 1.0 / std::sqrt(hidden), 2),
           bias = param({hidden}, 0.0 + 1e-9, 3), w_out = param({hidden, vocab}, 1.0 / std::sqrt(hidden), 4),
           b_out = param({vocab}, 1e-9, 5);
    TensorList params{embed, w_h, bias, w_out, b_out};
    nn::AdamW optimizer(params, {.lr = lr});

    // one training step's loss through scan; ids [B, seq + 1]
    auto sequence_loss = [&](const Tensor& ids, const ScanOptions& options) {
      Tensor state0 = zeros({batch, hidden + 1}, f32);
      auto step = [&](const Tensor& state, int64_t t) {
        Tensor h = state.slice(1, 0, hidden), acc = state.slice(1, hidden, hidden + 1);
        Tensor x = embedding(embed, ids.slice(1, t, t + 1).reshape({batch}));      // [B, H]
        Tensor h_next = tanh(add(add(x, matmul(h, w_h)), bias));
        Tensor logits = add(matmul(h_next, w_out), b_out);                          // [B, V]
        Tensor loss = cross_entropy(logits, ids.slice(1, t + 1, t + 2).reshape({batch}));
        return concat({h_next, add(acc, loss.reshape({1, 1}))}, 1);
      };
      Tensor final_state = scan(step, state0, seq, options);
      return mul_scalar(mean(final_state.slice(1, hidden, hidden + 1)), 1.0 / static_cast<double>(seq));
    };
    auto batch_ids = [&](int64_t step) {
      std::vector<int64_t> ids(static_cast<size_t>(batch * (seq + 1)));
      uint64_t span = tokens.size() - static_cast<uint64_t>(seq) - 1;
      for (int64_t b = 0; b < batch; ++b) {
        uint64_t start = philox_word({7, static_cast<uint64_t>(step) * 64}, static_cast<uint64_t>(b)) % span;
        for (int64_t t = 0; t <= seq; ++t) ids[static_cast<size_t>(b * (seq + 1) + t)] = tokens[start + t];
      }
      return from_indices(ids, {batch, seq + 1});
    };

    const ScanOptions revolve{ScanSchedule::revolve, snapshots};
    std::printf("char_rnn: vocabulary %lld, sequences of %lld characters, batch %lld, hidden %lld, %d snapshots\n",
                static_cast<long long>(vocab), static_cast<long long>(seq), static_cast<long long>(batch),
                static_cast<long long>(hidden), snapshots);
    size_t peak_revolve = 0;
    double first = 0, last = 0, total_seconds = 0;
    for (int64_t s = 0; s < steps; ++s) {
      Tensor ids = batch_ids(s);
      optimizer.zero_grad();
      memory::reset_peaks();
      size_t base = memory::live_bytes(memory::Tag::saved);
      auto t0 = std::chrono::steady_clock::now();
      Tensor loss = sequence_loss(ids, revolve);
      loss.backward();
      nn::clip_grad_norm(params, 1.0);
      optimizer.step();
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      total_seconds += seconds;
      peak_revolve = std::max(peak_revolve, memory::peak_bytes(memory::Tag::saved) - base);
      last = loss.item();
      if (s == 0) first = last;
      std::printf("  step %lld/%lld: loss %.4f (%.2f s)\n", static_cast<long long>(s + 1), static_cast<long long>(steps),
                  last, seconds);
      std::fflush(stdout);
    }
    // memory and time of one gradient under store-all, side by side with Revolve
    Tensor ids = batch_ids(steps);
    auto measure = [&](const ScanOptions& options) {
      optimizer.zero_grad();
      memory::reset_peaks();
      size_t base = memory::live_bytes(memory::Tag::saved);
      auto t0 = std::chrono::steady_clock::now();
      sequence_loss(ids, options).backward();
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return std::make_pair(memory::peak_bytes(memory::Tag::saved) - base, seconds);
    };
    auto [rev_bytes, rev_seconds] = measure(revolve);
    auto [all_bytes, all_seconds] = measure({ScanSchedule::store_all, 1});
    std::printf("report: loss %.4f -> %.4f over %lld steps (%.1f s)\n", first, last, static_cast<long long>(steps),
                total_seconds);
    std::printf("  one gradient, revolve (%d slots): peak saved %zu bytes (%s), %.2f s\n", snapshots, rev_bytes,
                memory::format_bytes(static_cast<double>(rev_bytes)).c_str(), rev_seconds);
    std::printf("  one gradient, store-all:          peak saved %zu bytes (%s), %.2f s\n", all_bytes,
                memory::format_bytes(static_cast<double>(all_bytes)).c_str(), all_seconds);
    std::printf("  revolve / store-all: memory %.4f, time %.2f\n", static_cast<double>(rev_bytes) / all_bytes,
                rev_seconds / all_seconds);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "char_rnn: error: %s\n", e.what());
    return 1;
  }
}
