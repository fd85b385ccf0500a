// `remat --device` and `remat --version` through the built executable: a device that is not one is
// a usage error (exit code 2); a device this build or machine cannot use (a build without CUDA, no
// CUDA device, an index past the last) is an error while running (exit code 1) with its reason,
// never a crash; the run's report names its device. On a machine with a GPU, a one-step run on it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "device_option.h"
#include "emulated_backend.h"
#include "remat/cpu_features.h"
#include "remat/devices.h"
#include "usage.h"

using namespace remat;
namespace fs = std::filesystem;

namespace {

struct CliRun {
  int code = -1;
  std::string output;  // stdout then stderr, merged
};

// The built executable, or $REMAT_CLI (scripts/cuda-check runs this test from a bundle elsewhere).
// `environment` (NAME=VALUE ...) is set for the run.
CliRun remat_cli(const std::string& args, const std::string& environment = "") {
  const char* env = std::getenv("REMAT_CLI");
  const std::string cli = env != nullptr && *env != '\0' ? env : REMAT_CLI_PATH;
  CliRun r;
  FILE* pipe = ::popen(("env " + environment + " timeout 300 " + cli + " " + args + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) r.output.append(buffer, n);
  const int status = ::pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

bool has(const CliRun& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

// A tiny corpus and the options of a one-step run on the smallest model.
std::string tiny_train(const std::string& extra) {
  static const fs::path corpus = [] {
    fs::path p = fs::temp_directory_path() / ("remat_cli_device_" + std::to_string(::getpid()) + ".txt");
    std::ofstream out(p);
    for (int i = 0; i < 100; ++i) out << "pack my box with five dozen liquor jugs " << i << "\n%\n";
    return p;
  }();
  return "train --quiet --threads 1 --layers 1 --width 8 --heads 2 --seq 8 --batch 2 --steps 1 --data " +
         corpus.string() + " " + extra;
}

// What `--device cuda` must say on this build and machine when there is no usable device.
std::string expected_cuda_reason() {
  if (compiled_backends().size() == 1) return "this remat was built without CUDA (REMAT_WITH_CUDA=OFF)";
  return "no CUDA device: " + unavailable_reason(DeviceType::cuda);
}

void expect_clean_error(const CliRun& r, int code, const std::string& fragment) {
  EXPECT_EQ(r.code, code) << r.output;
  EXPECT_TRUE(has(r, "remat: error: ")) << r.output;
  EXPECT_TRUE(has(r, fragment)) << r.output << "\nexpected: " << fragment;
  for (const char* bad : {"std::", "terminate", "Segmentation", "Aborted"}) EXPECT_FALSE(has(r, bad)) << r.output;
}

}  // namespace

TEST(CliDevice, VersionListsTheBackendsAndDevices) {
  const CliRun r = remat_cli("--version");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind(std::string("remat ") + REMAT_VERSION + "\n", 0), 0u) << r.output;
  std::string backends = "backends: cpu";
  if (compiled_backends().size() == 2) backends += ", cuda";
  EXPECT_TRUE(has(r, backends)) << r.output;
  if (device_count(DeviceType::cuda) == 0)
    EXPECT_TRUE(has(r, compiled_backends().size() == 2 ? expected_cuda_reason()
                                                       : "(this remat was built without CUDA (REMAT_WITH_CUDA=OFF))"))
        << r.output;
  else
    EXPECT_TRUE(has(r, "\ncuda:0: ")) << r.output;
}

TEST(CliDevice, TextThatIsNoDeviceIsAUsageError) {
  for (const std::string bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:0:1", "CPU", "cuda:99999999999"}) {
    SCOPED_TRACE(bad);
    expect_clean_error(remat_cli(tiny_train("--device '" + bad + "'")), 2, "train --device: \"" + bad + "\" is not a device");
  }
  expect_clean_error(remat_cli("sample --load nothing.safetensors --device gpu"), 2, "sample --device: \"gpu\" is not a device");
  // what the device path does not run (yet): refused before any device is asked for
  expect_clean_error(remat_cli(tiny_train("--device cuda --accumulate 2")), 2, "runs one micro-batch per step");
}

TEST(CliDevice, CudaWithoutAUsableDeviceIsAClearError) {
  if (device_count(DeviceType::cuda) > 0) {
    // an index past the last device
    const std::string past = "cuda:" + std::to_string(device_count(DeviceType::cuda));
    expect_clean_error(remat_cli(tiny_train("--device " + past)), 1, past + " does not exist");
    GTEST_SKIP() << "a CUDA device is present: the no-device error cannot be shown here";
  }
  for (const std::string device : {"cuda", "cuda:0", "cuda:3"}) {
    SCOPED_TRACE(device);
    const CliRun r = remat_cli(tiny_train("--device " + device));
    expect_clean_error(r, 1, "train --device " + device + ": " + expected_cuda_reason());
    const CliRun j = remat_cli(tiny_train("--json --device " + device));
    EXPECT_EQ(j.code, 1) << j.output;
    EXPECT_TRUE(has(j, "\"exit_code\":1")) << j.output;
  }
  // offload of device values is not refused: the device is what is missing
  expect_clean_error(remat_cli(tiny_train("--device cuda --policy offload:/tmp")), 1,
                     "train --device cuda: " + expected_cuda_reason());
  // sample refuses the device before reading the weights
  expect_clean_error(remat_cli("sample --load nothing.safetensors --device cuda"), 1,
                     "sample --device cuda: " + expected_cuda_reason());
}

// The backend options chosen with the device (select_device's `options`, the --backend-options
// text): parsed on the defaults; a name that is no option, or an option for the CPU (which has
// none), is a usage error; a device that holds no bf16 says why in its backend's words; the
// report's JSON lists every option with whether it is on and device-checked.
TEST(CliDevice, BackendOptionsAreChosenWithTheDevice) {
  EXPECT_EQ(tools::select_device("train --device", "cpu", ""), kCpu);
  EXPECT_THROW(tools::select_device("train --device", "cpu", "tf32"), tools::UsageError);
  try {
    tools::select_device("train --device", "cuda", "tf32,warp_speed");
    ADD_FAILURE() << "no error";
  } catch (const tools::UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'warp_speed'"), std::string::npos) << message;
    EXPECT_NE(message.find("sixteen_bit"), std::string::npos) << message;  // the known names
  }
  if (device_count(DeviceType::cuda) == 0)
    EXPECT_THROW(tools::select_device("train --device", "cuda", "tf32"), Error);
  remat::testing::EmulatedDevice dev(5);
  dev.backend.holds_16bit_floats = false;
  tools::check_device_dtype("train --dtype", dev.device, DType::f32);
  try {
    tools::check_device_dtype("train --dtype", dev.device, DType::bf16);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("emulated:5 holds no bf16 tensors: "), std::string::npos) << message;
    EXPECT_NE(message.find(backend(dev.device).why_not_held(DType::bf16)), std::string::npos) << message;
  }
  const nlohmann::json j = tools::backend_options_json(dev.device);
  ASSERT_EQ(j["options"].size(), 6u) << j.dump();
  EXPECT_EQ(j["options"][0]["name"], "async");
  EXPECT_EQ(j["options"][0]["on"], true);
  EXPECT_EQ(j["options"][0]["device_checked"], false);
  EXPECT_NE(j["text"].get<std::string>().find("async (not device-checked)"), std::string::npos) << j.dump();
  EXPECT_NE(tools::device_json(dev.device).dump().find("\"backend_options\""), std::string::npos);
  EXPECT_EQ(tools::device_json(kCpu).dump().find("backend_options"), std::string::npos);
}

TEST(CliDevice, TheReportNamesTheDevice) {
  CliRun r = remat_cli(tiny_train("--device cpu --json"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "\"device\":{\"description\":\"cpu (1 thread)\"")) << r.output;
  EXPECT_TRUE(has(r, "\"name\":\"cpu\"")) << r.output;
  r = remat_cli(tiny_train("--device cpu").replace(0, 13, "train"));  // the human report (no --quiet)
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "device: cpu (1 thread)")) << r.output;
}

// The report names the CPU kernels' level and the features found (remat/cpu_features.h);
// REMAT_CPU_LEVEL forces a level the CPU has, and one it lacks, or a word that is no level, is an
// error (exit code 1) saying so.
TEST(CliDevice, TheReportNamesTheCpuLevel) {
  const CpuFeatures& cpu = cpu_features();
  const std::string level = std::string("\"level\":\"") + cpu_level_name(cpu.level) + "\"";
  CliRun r = remat_cli(tiny_train("--device cpu --json"), "-u REMAT_CPU_LEVEL");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "\"cpu\":{\"bf16_products\":")) << r.output;
  EXPECT_TRUE(has(r, level)) << r.output;
  EXPECT_TRUE(has(r, "\"forced\":false")) << r.output;
  if (cpu.widest >= CpuLevel::avx2) EXPECT_TRUE(has(r, "\"avx2\"")) << r.output;
  r = remat_cli(tiny_train("--device cpu --json"), "REMAT_CPU_LEVEL=baseline");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "\"level\":\"baseline\"")) << r.output;
  EXPECT_TRUE(has(r, "\"forced\":true")) << r.output;
  EXPECT_TRUE(has(r, "\"bf16_products\":\"float32\"")) << r.output;
  r = remat_cli(tiny_train("--device cpu").replace(0, 13, "train"), "-u REMAT_CPU_LEVEL");  // the human report
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, std::string("cpu kernels: ") + cpu_level_name(cpu.level))) << r.output;
  expect_clean_error(remat_cli(tiny_train("--device cpu"), "REMAT_CPU_LEVEL=wide"), 1,
                     "REMAT_CPU_LEVEL=wide names no level: baseline, avx2 or avx512");
  if (cpu.widest < CpuLevel::avx512)
    expect_clean_error(remat_cli(tiny_train("--device cpu"), "REMAT_CPU_LEVEL=avx512"), 1,
                       "this CPU's widest level is");
}

TEST(CliDevice, TrainsAndSamplesOnTheGpu) {
  if (device_count(DeviceType::cuda) == 0) GTEST_SKIP() << "CUDA is not usable here: " << unavailable_reason(DeviceType::cuda);
  const fs::path weights = fs::temp_directory_path() / ("remat_cli_device_" + std::to_string(::getpid()) + ".safetensors");
  const CliRun r = remat_cli(tiny_train("--device cuda --policy every-layer --json --save " + weights.string()));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "\"name\":\"cuda:0\"")) << r.output;
  EXPECT_TRUE(has(r, "\"total_bytes\":")) << r.output;
  const CliRun s = remat_cli("sample --device cuda --tokens 5 --temperature 0 --load " + weights.string());
  EXPECT_EQ(s.code, 0) << s.output;
  const CliRun cpu = remat_cli("sample --device cpu --tokens 5 --temperature 0 --load " + weights.string());
  EXPECT_EQ(s.output, cpu.output);  // greedy: the same most likely characters on either device
  fs::remove(weights);
  // offload: the device's saved values go through host memory to a file and back (this model's
  // largest saved values are 2-2.5 KiB: the MLP's hidden layer and the logits)
  const CliRun o = remat_cli(tiny_train("--device cuda --policy offload:/tmp,threshold=1KiB --json"));
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_FALSE(has(o, "\"values_offloaded\":0,")) << o.output;
}
