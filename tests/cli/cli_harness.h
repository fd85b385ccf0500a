// What the tests of the built `remat` executable share (test_cli_exec, test_cli_formats): running
// it with a time limit, and the Cli fixture (a scratch directory, a small corpus, one tiny trained
// model, error expectations).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

struct Streams {
  int code = -1;
  std::string out, err;  // stdout, stderr
};

// Runs `ENV remat ARGS` with stdout and stderr kept apart.
Streams run_streams(const std::string& args, const std::string& env = "") {
  const std::string err_path = (fs::temp_directory_path() / ("remat_cli_err_" + std::to_string(::getpid()))).string();
  Result r;
  {
    const std::string command = env + " timeout 120 " + std::string(REMAT_CLI_PATH) + " " + args + " 2>" + err_path;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return {};
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
    const int status = ::pclose(pipe);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::ifstream in(err_path, std::ios::binary);
  std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(err_path);
  return {r.code, r.output, err};
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
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

  // Expects exit code `code` (1: an error while running, 2: a usage error) and every fragment in
  // the output, which must hold the error line.
  static void expect_error(const std::string& args, std::initializer_list<std::string> fragments, int code = 1) {
    SCOPED_TRACE(args);
    Result r = run(args);
    EXPECT_EQ(r.code, code) << r.output;
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

  static void expect_usage_error(const std::string& args, std::initializer_list<std::string> fragments) {
    expect_error(args, fragments, 2);
  }

  inline static fs::path dir_;
};

}  // namespace
