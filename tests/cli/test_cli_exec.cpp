// The built `remat` executable against bad input of every class: each must end with exit code 1
// and a message "remat: error: ..." naming what was wrong, never a crash, a hang, an uncaught
// std:: exception or a silent success. Tiny models and one or a few steps keep this fast.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "remat/nn.h"

using namespace remat;
namespace fs = std::filesystem;

namespace {

struct Result {
  int code = -1;  // exit code; 128 + N for signal N
  std::string output;  // stdout and stderr
};

// Runs `remat ARGS` (a shell fragment) with a time limit; stderr is merged into the output.
Result run(const std::string& args) {
  const std::string command = "timeout 120 " + std::string(REMAT_CLI_PATH) + " " + args + " 2>&1";
  Result r;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
  const int status = ::pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("remat_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream corpus(path("corpus.txt"));
    for (int i = 0; i < 200; ++i) corpus << "the quick brown fox " << i << " jumps over the lazy dog\n%\n";
    corpus.close();
    // one tiny trained model, reused by the weight-file tests
    Result r = run(train_args({{"--save", path("w.safetensors")}}));
    ASSERT_EQ(r.code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string path(const std::string& name) { return (dir_ / name).string(); }
  // `remat train` on the tiny model, with `options` ("--name value" pairs) replacing the defaults.
  static std::string train_args(std::map<std::string, std::string> options = {}) {
    const std::map<std::string, std::string> defaults = {
        {"--threads", "1"}, {"--data", path("corpus.txt")}, {"--layers", "1"}, {"--width", "8"},
        {"--heads", "2"},   {"--seq", "8"},                 {"--batch", "2"},  {"--steps", "1"}};
    for (const auto& [k, v] : defaults) options.emplace(k, v);  // keeps the given ones
    std::string args = "train --quiet";
    for (const auto& [k, v] : options) args += " " + k + " " + v;
    return args;
  }

  // Expects exit code 1 and every fragment in the output, which must start with the error line.
  static void expect_error(const std::string& args, std::initializer_list<std::string> fragments) {
    SCOPED_TRACE(args);
    Result r = run(args);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("remat: error: "), std::string::npos) << r.output;
    for (const auto& f : fragments) EXPECT_NE(r.output.find(f), std::string::npos) << r.output << "\nexpected: " << f;
    for (const char* bad : {"std::", "bad_alloc", "terminate", "Sanitizer", "runtime error"})
      EXPECT_EQ(r.output.find(bad), std::string::npos) << r.output;
  }

  // A copy of the trained weights with metadata `key` set to `value` (erased when value is null).
  static std::string with_metadata(const std::string& name, const std::string& key, const char* value) {
    nn::SafetensorsFile f = nn::load_safetensors(path("w.safetensors"));
    if (value) f.metadata[key] = value;
    else f.metadata.erase(key);
    nn::NamedTensors tensors(f.tensors.begin(), f.tensors.end());
    nn::save_safetensors(path(name), tensors, f.metadata);
    return path(name);
  }

  static fs::path dir_;
};

fs::path Cli::dir_;

}  // namespace

TEST_F(Cli, GoodInputSucceeds) {
  Result r = run(train_args({{"--steps", "2"}}) + " --json");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\"steps\":2"), std::string::npos) << r.output;
  r = run("sample --threads 1 --tokens 5 --load " + path("w.safetensors"));
  EXPECT_EQ(r.code, 0) << r.output;
  r = run("train --quiet --threads 1 --steps 1 --batch 2 --data " + path("corpus.txt") + " --load " + path("w.safetensors"));
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST_F(Cli, NumbersAreParsedStrictly) {
  expect_error(train_args({{"--threads", "-3"}}), {"train --threads: -3 is out of range (a whole number from 0 to 1024)"});
  expect_error(train_args({{"--threads", "5000"}}), {"train --threads: 5000 is out of range"});
  expect_error(train_args({{"--steps", "9223372036854775808"}}), {"train --steps: \"9223372036854775808\" is too large"});
  expect_error(train_args({{"--steps", "100000001"}}), {"train --steps: 100000001 is out of range"});
  expect_error(train_args({{"--steps", "0"}}), {"train --steps: 0 is out of range"});
  expect_error(train_args({{"--steps", "0x10"}}), {"train --steps: expected a whole number", "\"0x10\""});
  expect_error(train_args({{"--layers", "1e1"}}), {"train --layers: expected a whole number", "\"1e1\""});
  expect_error(train_args({{"--heads", "2x"}}), {"train --heads: expected a whole number", "\"2x\""});
  expect_error(train_args({{"--width", "' 8'"}}), {"train --width: expected a whole number"});
  expect_error(train_args({{"--batch", "0"}}), {"train --batch: 0 is out of range"});
  expect_error(train_args({{"--seq", "1"}}), {"train --seq: 1 is out of range"});
  expect_error(train_args({{"--seed", "-1"}}), {"train --seed: expected a whole number from 0 to 18446744073709551615"});
  expect_error(train_args({{"--seed", "18446744073709551616"}}), {"train --seed", "too large"});
  expect_error(train_args({{"--lr", "nan"}}), {"train --lr: expected a finite number"});
  expect_error(train_args({{"--lr", "inf"}}), {"train --lr: expected a finite number"});
  expect_error(train_args({{"--lr", "1e400"}}), {"train --lr", "out of the range of a double"});
  expect_error(train_args({{"--lr", "0"}}), {"--lr must be a finite number > 0"});
  expect_error(train_args({{"--lr", "-1"}}), {"--lr must be a finite number > 0"});
  expect_error(train_args({{"--dropout", "1"}}), {"--dropout must be in [0, 1)"});
  expect_error(train_args({{"--width", "7"}, {"--heads", "2"}}), {"train: --width 7 is not a multiple of --heads 2"});
  const std::string w = " --load " + path("w.safetensors");
  expect_error("sample --tokens 0" + w, {"sample --tokens: 0 is out of range"});
  expect_error("sample --tokens 10000001" + w, {"sample --tokens: 10000001 is out of range"});
  expect_error("sample --temperature nan" + w, {"sample --temperature: expected a finite number"});
  expect_error("sample --temperature 0" + w, {"--temperature must be a finite number > 0"});
  expect_error("sample --seed 1.5" + w, {"sample --seed: expected a whole number"});
  expect_error("sample --threads -1" + w, {"sample --threads: -1 is out of range"});
  expect_error("plan --budget 1MiB --threads -3", {"plan --threads: -3 is out of range"});
  expect_error("plan --budget 1MiB --layers x", {"plan --layers: expected a whole number"});
}

TEST_F(Cli, ImpossibleModelSizesAreRefusedBeforeBuilding) {
  const std::string t = "train --quiet --threads 1 --steps 1 --data " + path("corpus.txt");
  expect_error(t + " --width 4611686018427387904", {"--width 4611686018427387904", "more than 2^64"});
  expect_error(t + " --width 2147483648", {"--width 2147483648", "more than 2^64"});
  expect_error(t + " --seq 1000000", {"--seq 1000000", "needs at least", "bytes", "attention scores"});
  expect_error(t + " --width 8 --heads 2 --layers 100000000000", {"--layers 100000000000", "needs at least", "bytes"});
  expect_error(t + " --batch 4611686018427387904", {"--batch 4611686018427387904", "more than 2^64 bytes"});
  expect_error("plan --budget 1GiB --data " + path("corpus.txt") + " --seq 1000000",
               {"plan --layers 4 --width 128 --heads 4 --seq 1000000", "needs at least"});
}

TEST_F(Cli, NonFiniteLossStopsTraining) {
  const std::string save = path("diverged.safetensors");
  expect_error(train_args({{"--steps", "5"}, {"--lr", "1e300"}, {"--save", save}}),
               {"train: step ", "has loss nan", "diverged", "--allow-nonfinite"});
  EXPECT_FALSE(fs::exists(save));
  Result r = run(train_args({{"--steps", "5"}, {"--lr", "1e300"}}) + " --allow-nonfinite --json");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\"final_loss\":null"), std::string::npos) << r.output;  // NaN in JSON
}

TEST_F(Cli, WeightFileMetadataIsStrictAndMustMatchTheTensors) {
  const struct {
    const char* key;
    const char* value;
    std::vector<std::string> fragments;
  } cases[] = {
      {"layers", "abc", {"metadata \"layers\"", "expected a whole number", "\"abc\""}},
      {"layers", "12345678901234567890", {"metadata \"layers\"", "is too large"}},
      {"layers", "-1", {"metadata \"layers\"", "out of range"}},
      {"heads", "2x", {"metadata \"heads\"", "\"2x\""}},
      {"heads", "3", {"width 8 is not a multiple of heads 3"}},
      {"width", "4611686018427387904", {"width 4611686018427387904", "describes wte.weight", "but the file's is"}},
      {"seq", "1e9", {"metadata \"seq\"", "\"1e9\""}},
      {"seq", "1000000000", {"seq 1000000000", "describes wpe.weight [1000000000, 8]"}},
      {"layers", "100000", {"layers 100000", "parameters, but the file holds"}},
      {"layers", "4611686018427387904", {"more than 2^64 parameters"}},
      {"vocabulary", "1,2,x", {"metadata \"vocabulary\"", "\"x\""}},
      {"vocabulary", "", {"metadata \"vocabulary\"", "is empty"}},
      {"vocabulary", "65,65", {"appears twice"}},
      {"format", "pytorch", {"has format \"pytorch\""}},
      {"layers", nullptr, {"has no \"layers\" in its metadata"}},
  };
  int i = 0;
  for (const auto& c : cases) {
    const std::string file = with_metadata("m" + std::to_string(i++) + ".safetensors", c.key, c.value);
    for (const std::string command : {"sample --threads 1 --tokens 3", "train --quiet --threads 1 --steps 1 --batch 2"}) {
      const std::string args = command + " --data " + path("corpus.txt") + " --load " + file;
      SCOPED_TRACE(args);
      Result r = run(command.rfind("sample", 0) == 0 ? command + " --load " + file : args);
      EXPECT_EQ(r.code, 1) << r.output;
      EXPECT_NE(r.output.find("remat: error: "), std::string::npos) << r.output;
      EXPECT_NE(r.output.find(file), std::string::npos) << r.output;  // names the file
      for (const auto& f : c.fragments) EXPECT_NE(r.output.find(f), std::string::npos) << r.output << "\nexpected: " << f;
    }
  }
  expect_error("train --quiet --steps 1 --width 16 --data " + path("corpus.txt") + " --load " + path("w.safetensors"),
               {"cannot be combined with --load"});
}

TEST_F(Cli, HostileWeightFilesAreErrors) {
  auto write = [&](const std::string& name, const std::string& header) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    std::ofstream(path(name), std::ios::binary) << bytes << header;
    return path(name);
  };
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string nested = write("deep.safetensors", R"({"x":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})");
  const std::string offsets = write("offsets.safetensors", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":)" + deep + "}}");
  for (const std::string& file : {nested, offsets}) {
    expect_error("sample --load " + file, {file, "more than 3 levels deep"});
    expect_error("train --quiet --steps 1 --data " + path("corpus.txt") + " --load " + file,
                 {file, "more than 3 levels deep"});
  }
  const std::string garbage = write("garbage.safetensors", "{\"x\": not json");
  expect_error("sample --load " + garbage, {"not valid JSON"});
  expect_error("sample --load " + path("nothing.safetensors"), {"no such file"});
  expect_error("sample --load " + dir_.string(), {"not a regular file"});
}

TEST_F(Cli, CostsFilesAreStrict) {
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(path(name)) << text;
    return path(name);
  };
  auto stage = [](const std::string& bytes) {
    return R"({"forward_seconds": 1, "backward_seconds": 2, "boundary_bytes": )" + bytes + R"(, "saved_bytes": 64})";
  };
  Result r = run("plan --budget 1KiB --costs " + write("ok.json", "[" + stage("16") + "," + stage("16") + "]"));
  EXPECT_EQ(r.code, 0) << r.output;
  expect_error("plan --budget 1KiB --costs " + write("frac.json", "[" + stage("1.5") + "]"),
               {"frac.json", "stage 0 boundary_bytes is 1.5; it must be a whole number of bytes"});
  expect_error("plan --budget 1KiB --costs " + write("huge.json", "[" + stage("1e30") + "]"),
               {"huge.json", "stage 0 boundary_bytes is 1e+30"});
  expect_error("plan --budget 1KiB --costs " + write("deep.json", std::string(100000, '[') + std::string(100000, ']')),
               {"nested more than 3 levels deep"});
  expect_error("plan --budget 1KiB --costs " + path("missing.json"), {"cannot read the --costs file"});
  expect_error("plan --budget 1KiB --layers 2 --costs " + path("ok.json"), {"cannot be combined with --costs"});
  // a chain too long for the planner is refused before planning
  std::string many = "[";
  for (int i = 0; i < 1001; ++i) many += (i ? "," : "") + stage("16");
  expect_error("plan --budget 1MiB --costs " + write("many.json", many + "]"),
               {"the chain has 1001 stages; remat plan reads at most 1000"});
}
