// Training states (remat/nn/training_state.h): a run stopped and resumed from its state ends with
// the bits of the run never stopped; every corruption, mismatch or failed write is a remat::Error
// naming what, after which the model, the optimizer and the RNG are as they were.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/xxh64.h"
#include "remat/nn.h"
#include "temp_dir.h"

using namespace remat;
namespace fs = std::filesystem;

namespace {

// A model with a parameter of every kind a state keeps: weights, BatchNorm buffers and its count,
// and dropout drawing from the default generator, under every-layer (the default).
class Net : public nn::Module {
 public:
  explicit Net(int64_t hidden = 8) {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(6, hidden));
    bn = register_module("bn", std::make_shared<nn::BatchNorm1d>(hidden));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.25));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden, 3));
  }
  Tensor forward_impl(const Tensor& x) override { return fc2->forward(drop->forward(relu(bn->forward(fc1->forward(x))))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::BatchNorm1d> bn;
  std::shared_ptr<nn::Dropout> drop;
};

struct Training {
  std::shared_ptr<Net> model = std::make_shared<Net>();
  std::unique_ptr<nn::AdamW> optimizer;
  nn::WarmupCosine schedule{.max_lr = 0.01, .min_lr = 0.0, .warmup_steps = 3, .total_steps = 12};
  explicit Training(uint64_t seed) {
    model->reset_parameters(seed);
    optimizer = std::make_unique<nn::AdamW>(model->parameters(), nn::AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  }
  void step(int64_t step) {
    Tensor x = randn({5, 6}, DType::f32, RngState{99, static_cast<uint64_t>(step) * 64});
    optimizer->zero_grad();
    mean(square(model->forward(x))).backward();
    nn::clip_grad_norm(model->parameters(), 1.0);
    optimizer->set_lr(schedule(step));
    optimizer->step();
  }
};

std::vector<std::vector<double>> values(const Training& r) {
  std::vector<std::vector<double>> v;
  for (const auto& [name, t] : r.model->named_parameters()) v.push_back(t.to_vector());
  for (const auto& [name, t] : r.model->named_buffers()) v.push_back(t.to_vector());
  for (size_t i = 0; i < r.optimizer->params().size(); ++i)
    if (r.optimizer->exp_avg(i).defined()) v.push_back(r.optimizer->exp_avg_sq(i).to_vector());
  return v;
}

const nn::Metadata kConfiguration = {{"lr", "0.01"}, {"steps", "12"}};

void flip_byte(const std::string& file, uint64_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

// The offset of the first data byte of `tensor` in a safetensors file.
uint64_t data_offset(const std::string& file, const std::string& tensor) {
  std::ifstream in(file, std::ios::binary);
  unsigned char length[8];
  in.read(reinterpret_cast<char*>(length), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  const auto j = nlohmann::json::parse(header);
  return 8 + n + j.at(tensor).at("data_offsets")[0].get<uint64_t>();
}

template <class F>
void expect_error(F&& f, std::initializer_list<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& fragment : fragments)
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what() << "\nexpected: " << fragment;
  }
}

}  // namespace

TEST(TrainingState, Xxh64KnownAnswers) {
  // from Python's xxhash package (xxhash.xxh64_hexdigest)
  std::vector<unsigned char> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 7 % 256);
  std::vector<unsigned char> counting(100);
  for (size_t i = 0; i < counting.size(); ++i) counting[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(io::xxh64_hex(io::xxh64("", 0)), "ef46db3751d8e999");
  EXPECT_EQ(io::xxh64_hex(io::xxh64("", 0, 5)), "4be1d406981cfd3b");
  EXPECT_EQ(io::xxh64_hex(io::xxh64("abc", 3)), "44bc2cf5ad770999");
  EXPECT_EQ(io::xxh64_hex(io::xxh64(counting.data(), 31)), "c346d2b59b4d8ee1");
  EXPECT_EQ(io::xxh64_hex(io::xxh64(counting.data(), 32)), "cbf59c5116ff32b4");
  EXPECT_EQ(io::xxh64_hex(io::xxh64(counting.data(), 100, 5)), "9c502a83dcb7c69e");
  EXPECT_EQ(io::xxh64_hex(io::xxh64(bytes.data(), bytes.size())), "25275608a9cfc168");
}

TEST(TrainingState, AResumedRunEndsWithTheBitsOfTheRunNeverStopped) {
  const std::string dir = remat::testing::fresh_dir("state-resume");
  manual_seed(7);
  Training straight(1);
  for (int64_t s = 0; s < 12; ++s) straight.step(s);

  manual_seed(7);
  Training first(1);
  for (int64_t s = 0; s < 5; ++s) first.step(s);
  const RngState rng_at_stop = rng_state();
  nn::save_training_state(nn::training_state_path(dir, 5), *first.model, *first.optimizer,
                          {.step = 5, .rng = rng_at_stop, .configuration = kConfiguration, .extra = {{"note", "x"}}},
                          {{"format", "test"}});
  EXPECT_EQ(nn::latest_training_state(dir), nn::training_state_path(dir, 5));
  // other tools read the weights: a plain safetensors file with the model's names
  nn::SafetensorsFile weights = nn::load_safetensors(nn::training_state_path(dir, 5) + "/model.safetensors");
  EXPECT_EQ(weights.metadata.at("format"), "test");
  EXPECT_EQ(weights.tensors.count("bn.running_mean"), 1u);
  EXPECT_EQ(weights.tensors.at("fc1.weight").to_vector(), first.model->fc1->weight.to_vector());

  manual_seed(12345);  // another process: other weights, another generator state
  Training resumed(2);
  const nn::TrainingState s =
      nn::load_training_state(nn::latest_training_state(dir), *resumed.model, *resumed.optimizer, kConfiguration);
  EXPECT_EQ(s.step, 5);
  EXPECT_EQ(s.extra.at("note"), "x");
  EXPECT_EQ(rng_state(), rng_at_stop);
  EXPECT_EQ(resumed.model->bn->num_batches_tracked(), 5);
  EXPECT_EQ(resumed.optimizer->steps(0), 5);
  EXPECT_EQ(values(resumed), values(first));
  for (int64_t step = s.step; step < 12; ++step) resumed.step(step);
  EXPECT_EQ(values(resumed), values(straight));
  EXPECT_EQ(resumed.model->bn->num_batches_tracked(), 12);
  fs::remove_all(dir);
}

TEST(TrainingState, AStateBeforeTheFirstStepHasNoMoments) {
  const std::string dir = remat::testing::fresh_dir("state-zero");
  Training a(1), b(2);
  nn::save_training_state(dir + "/s", *a.model, *a.optimizer, {.step = 0, .rng = rng_state()});
  nn::load_training_state(dir + "/s", *b.model, *b.optimizer, {});
  EXPECT_FALSE(b.optimizer->exp_avg(0).defined());
  EXPECT_EQ(values(a), values(b));
  fs::remove_all(dir);
}

TEST(TrainingState, ACorruptedByteIsRefusedNamingWhereAndNothingIsLoaded) {
  const std::string dir = remat::testing::fresh_dir("state-corrupt");
  Training a(1);
  for (int64_t s = 0; s < 2; ++s) a.step(s);
  const std::string state = dir + "/s";
  nn::save_training_state(state, *a.model, *a.optimizer, {.step = 2, .rng = {3, 4}, .configuration = kConfiguration});
  auto refused = [&](const std::string& file, uint64_t at, std::initializer_list<std::string> fragments) {
    SCOPED_TRACE(file);
    const std::string copy = dir + "/copy";
    fs::remove_all(copy);
    fs::copy(state, copy);
    flip_byte(copy + "/" + file, at);
    Training b(2);
    const auto before = values(b);
    const RngState rng = rng_state();
    expect_error([&] { nn::load_training_state(copy, *b.model, *b.optimizer, kConfiguration); }, fragments);
    EXPECT_EQ(values(b), before);
    EXPECT_EQ(rng_state(), rng);
    EXPECT_EQ(b.model->bn->num_batches_tracked(), 0);
    EXPECT_EQ(b.optimizer->steps(0), 0);
  };
  const std::string model = state + "/model.safetensors", optimizer = state + "/optimizer.safetensors";
  refused("model.safetensors", data_offset(model, "fc2.weight") + 5, {"tensor \"fc2.weight\"", "corrupted"});
  refused("model.safetensors", data_offset(model, "bn.running_var"), {"tensor \"bn.running_var\"", "corrupted"});
  refused("optimizer.safetensors", data_offset(optimizer, "fc1.bias/exp_avg_sq") + 3,
          {"tensor \"fc1.bias/exp_avg_sq\"", "corrupted"});
  refused("model.safetensors", 20, {"model.safetensors"});  // the header
  refused("state.json", 30, {"state.json"});
  fs::remove_all(dir);
}

TEST(TrainingState, AMismatchIsRefusedNamingIt) {
  const std::string dir = remat::testing::fresh_dir("state-mismatch");
  Training a(1);
  a.step(0);
  nn::save_training_state(dir + "/s", *a.model, *a.optimizer, {.step = 1, .rng = {}, .configuration = kConfiguration});
  Training b(2);
  const auto before = values(b);
  expect_error([&] { nn::load_training_state(dir + "/s", *b.model, *b.optimizer, {{"lr", "0.02"}, {"steps", "12"}}); },
               {"configuration", "lr: \"0.01\" in the state, \"0.02\" here"});
  expect_error([&] { nn::load_training_state(dir + "/s", *b.model, *b.optimizer, {{"seed", "1"}}); },
               {"seed: not in the state"});
  nn::AdamW other(b.model->parameters(), {.lr = 0.01, .weight_decay = 0.2});
  expect_error([&] { nn::load_training_state(dir + "/s", *b.model, other, kConfiguration); }, {"weight_decay"});
  nn::SGD sgd(b.model->parameters(), {.lr = 0.1});
  expect_error([&] { nn::load_training_state(dir + "/s", *b.model, sgd, kConfiguration); }, {"AdamW", "SGD"});
  auto wider = std::make_shared<Net>(9);
  nn::AdamW for_wider(wider->parameters(), {.lr = 0.01, .weight_decay = 0.1});
  expect_error([&] { nn::load_training_state(dir + "/s", *wider, for_wider, kConfiguration); },
               {"the model differs", "\"fc1.weight\" is f32 [8, 6] in the state, f32 [9, 6] in the model"});
  // a state whose optimizer holds only some parameters (one shard's) cannot fill a whole optimizer
  nn::AdamW half(TensorList{a.model->fc1->weight}, {.lr = 0.01, .weight_decay = 0.1});
  nn::save_training_state(dir + "/half", *a.model, half, {.step = 1, .rng = {}, .configuration = kConfiguration});
  expect_error([&] { nn::load_training_state(dir + "/half", *b.model, *b.optimizer, kConfiguration); },
               {"the state holds no optimizer state for \"fc1.bias\""});
  EXPECT_EQ(values(b), before);
  fs::remove_all(dir);
}

TEST(TrainingState, ShardsOfTheOptimizerAreWrittenAndReadByTheirProcesses) {
  // ZeRO-1 in one process: two optimizers, each over half the parameters
  const std::string dir = remat::testing::fresh_dir("state-shards");
  auto split = [](const Net& net, int shard) {
    TensorList all = net.parameters(), mine;
    for (size_t i = 0; i < all.size(); ++i)
      if (static_cast<int>(i * 2 / all.size()) == shard) mine.push_back(all[i]);
    return std::make_unique<nn::AdamW>(mine, nn::AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  };
  Training a(1);
  a.step(0);
  a.step(1);  // the moments of every parameter
  std::unique_ptr<nn::AdamW> s0 = split(*a.model, 0), s1 = split(*a.model, 1);
  for (nn::AdamW* shard : {s0.get(), s1.get()})
    for (size_t i = 0; i < shard->params().size(); ++i)
      shard->set_parameter_state(i, a.optimizer->parameter_state(static_cast<size_t>(a.optimizer->index_of(shard->params()[i]))));
  const std::string path = nn::training_state_path(dir, 2);
  nn::begin_training_state(path);
  nn::write_training_state_shard(path, *a.model, *s1, {.step = 2}, {1, 2});
  EXPECT_EQ(nn::latest_training_state(dir), "") << "not committed yet";
  nn::write_training_state_shard(path, *a.model, *s0, {.step = 2}, {0, 2});
  nn::commit_training_state(path, 2);

  Training b(2);
  std::unique_ptr<nn::AdamW> b0 = split(*b.model, 0), b1 = split(*b.model, 1);
  nn::load_training_state(path, *b.model, *b1, {}, {1, 2});
  nn::load_training_state(path, *b.model, *b0, {}, {0, 2});
  for (size_t i = 0; i < b1->params().size(); ++i)
    EXPECT_EQ(b1->exp_avg(i).to_vector(), s1->exp_avg(i).to_vector());
  EXPECT_EQ(b0->steps(0), 2);
  // independent of the number of processes: the two shards read into one whole optimizer, and
  // into three shards, by parameter name
  Training c(3);
  nn::load_training_state(path, *c.model, *c.optimizer, {});
  for (size_t i = 0; i < c.optimizer->params().size(); ++i) {
    EXPECT_EQ(c.optimizer->exp_avg(i).to_vector(), a.optimizer->exp_avg(i).to_vector()) << i;
    EXPECT_EQ(c.optimizer->exp_avg_sq(i).to_vector(), a.optimizer->exp_avg_sq(i).to_vector()) << i;
  }
  Training d(4);
  const TensorList all = d.model->parameters();  // the optimizers' order: a's parameter k is all[k]
  for (int third = 0; third < 3; ++third) {
    TensorList mine;
    std::vector<size_t> index;
    for (size_t k = 0; k < all.size(); ++k)
      if (static_cast<int>(k * 3 / all.size()) == third) {
        mine.push_back(all[k]);
        index.push_back(k);
      }
    nn::AdamW shard(mine, nn::AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
    nn::load_training_state(path, *d.model, shard, {}, {third, 3});
    for (size_t i = 0; i < mine.size(); ++i)
      EXPECT_EQ(shard.exp_avg_sq(i).to_vector(), a.optimizer->exp_avg_sq(index[i]).to_vector()) << third << " " << i;
  }
  fs::remove_all(dir);
}

TEST(TrainingState, InterruptedWritesAreIgnoredAndPruned) {
  const std::string dir = remat::testing::fresh_dir("state-prune");
  Training a(1);
  for (int64_t step : {1, 2, 3}) nn::save_training_state(nn::training_state_path(dir, step), *a.model, *a.optimizer, {.step = step});
  // a write killed half way: its partial directory, and a directory without state.json
  fs::create_directories(nn::training_state_path(dir, 4) + ".partial");
  fs::create_directories(nn::training_state_path(dir, 5));
  EXPECT_EQ(nn::latest_training_state(dir), nn::training_state_path(dir, 3));
  expect_error([&] { nn::save_training_state(nn::training_state_path(dir, 3), *a.model, *a.optimizer, {.step = 3}); },
               {"already exists"});
  nn::prune_training_states(dir, 2);
  EXPECT_FALSE(fs::exists(nn::training_state_path(dir, 1)));
  EXPECT_TRUE(fs::exists(nn::training_state_path(dir, 2)));
  EXPECT_TRUE(fs::exists(nn::training_state_path(dir, 3)));
  EXPECT_FALSE(fs::exists(nn::training_state_path(dir, 4) + ".partial"));
  EXPECT_EQ(nn::read_training_state(nn::training_state_path(dir, 2)).step, 2);
  expect_error([&] { nn::read_training_state(nn::training_state_path(dir, 5)); }, {"no state.json"});
  fs::remove_all(dir);
}

TEST(TrainingState, AFullDiskIsAnErrorAndLeavesThePreviousStateLoadable) {
  const std::string dir = remat::testing::fresh_dir("state-full");
  if (std::system(("mount -t tmpfs -o size=64k tmpfs " + dir + " 2>/dev/null").c_str()) != 0) {
    fs::remove_all(dir);
    GTEST_SKIP() << "cannot mount a tmpfs here (the command line's fault test injects the failure instead)";
  }
  Training a(1);
  a.step(0);
  nn::save_training_state(nn::training_state_path(dir, 1), *a.model, *a.optimizer, {.step = 1});
  {  // fill the disk
    std::ofstream fill(dir + "/filler", std::ios::binary);
    const std::string block(1024, 'x');
    for (int i = 0; i < 64 && fill.write(block.data(), block.size()); ++i) {}
  }
  a.step(1);
  expect_error([&] { nn::save_training_state(nn::training_state_path(dir, 2), *a.model, *a.optimizer, {.step = 2}); },
               {"No space left on device"});
  EXPECT_EQ(nn::latest_training_state(dir), nn::training_state_path(dir, 1));
  EXPECT_FALSE(fs::exists(nn::training_state_path(dir, 2) + ".partial"));
  Training b(2);
  EXPECT_EQ(nn::load_training_state(nn::latest_training_state(dir), *b.model, *b.optimizer, {}).step, 1);
  std::system(("umount " + dir).c_str());
  fs::remove_all(dir);
}
