// Backend options as a value (BackendOptions, remat/devices.h), on a machine with or without a
// GPU: their text form, the defaults read once from REMAT_BACKEND_OPTIONS, the options chosen with a
// device and held by its backend, and the description a run's report prints. The CUDA backend's
// own use of each option is tested on a device (tests/test_cuda.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "emulated_backend.h"
#include "remat/devices.h"
#include "remat/remat.h"

using namespace remat;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(DeviceOptions, TextNamesEachOptionAndRefusesOthers) {
  EXPECT_TRUE(parse_backend_options("") == BackendOptions{});
  const BackendOptions o = parse_backend_options("tf32,async");
  EXPECT_TRUE(o.tf32 && o.async);
  EXPECT_FALSE(o.sixteen_bit || o.copy_stream || o.stream_ordered_allocator || o.profile);
  EXPECT_EQ(backend_options_text(o), "async,tf32");  // in the options' order
  EXPECT_EQ(backend_options_text({}), "none");
  const BackendOptions every =
      parse_backend_options("async,stream_ordered_allocator,copy_stream,sixteen_bit,tf32,profile");
  EXPECT_TRUE(every.async && every.stream_ordered_allocator && every.copy_stream && every.sixteen_bit && every.tf32 &&
              every.profile);
  EXPECT_TRUE(parse_backend_options(backend_options_text(every)) == every);  // the text round-trips
  EXPECT_TRUE(parse_backend_options("none", every) == BackendOptions{});
  EXPECT_TRUE(parse_backend_options("-tf32,,", o) == parse_backend_options("async"));  // on top of a base
  EXPECT_TRUE(parse_backend_options("tf32,none,profile") == parse_backend_options("profile"));
  const std::string message = error_of([] { parse_backend_options("tf32,warp_speed"); });
  for (const char* part : {"'warp_speed'", "async", "sixteen_bit", "profile", "none"})
    EXPECT_NE(message.find(part), std::string::npos) << message;
  EXPECT_NE(error_of([] { parse_backend_options("-"); }), "");
}

TEST(DeviceOptions, DefaultsComeFromTheEnvironmentOnce) {
  const char* env = std::getenv("REMAT_BACKEND_OPTIONS");
  if (env != nullptr) GTEST_SKIP() << "REMAT_BACKEND_OPTIONS=" << env;
  EXPECT_TRUE(default_backend_options() == BackendOptions{});
  ::setenv("REMAT_BACKEND_OPTIONS", "tf32", 1);  // read once, at the first call: no effect now
  EXPECT_TRUE(default_backend_options() == BackendOptions{});
  ::unsetenv("REMAT_BACKEND_OPTIONS");
}

TEST(DeviceOptions, TheCpuHasNone) {
  use_device(kCpu);
  use_device(kCpu, {});
  const std::string message = error_of([] { use_device(kCpu, parse_backend_options("tf32")); });
  EXPECT_NE(message.find("the CPU backend has no options"), std::string::npos) << message;
  EXPECT_NE(message.find("tf32"), std::string::npos) << message;
  EXPECT_TRUE(backend(kCpu).options() == BackendOptions{});
  const BackendOptionsReport r = describe_backend_options(kCpu);
  EXPECT_EQ(r.device, "cpu");
  EXPECT_TRUE(r.options.empty());
  EXPECT_EQ(r.text, "cpu backend options: none (the CPU has none)");
}

// A device's options are its backend's, chosen once: use_device with the same options is a no-op,
// with others an error naming both; the report lists every option, on or off, and marks the ones
// on that have not passed a device check.
TEST(DeviceOptions, ADeviceKeepsTheOptionsItWasChosenWith) {
  remat::testing::EmulatedDevice dev(4);
  dev.backend.backend_options = parse_backend_options("async,sixteen_bit");
  use_device(dev.device);
  use_device(dev.device, dev.backend.backend_options);
  const std::string message = error_of([&] { use_device(dev.device, parse_backend_options("tf32")); });
  for (const char* part : {"emulated:4", "async,sixteen_bit", "tf32", "chosen with the device"})
    EXPECT_NE(message.find(part), std::string::npos) << message;
  EXPECT_TRUE(backend(dev.device).options() == dev.backend.backend_options);
  const BackendOptionsReport r = describe_backend_options(dev.device);
  EXPECT_EQ(r.device, "emulated:4");
  ASSERT_EQ(r.options.size(), 6u);
  for (const BackendOptionState& o : r.options) {
    EXPECT_EQ(o.on, o.name == "async" || o.name == "sixteen_bit") << o.name;
    EXPECT_EQ(o.device_checked, o.name == "tf32") << o.name;  // the one whose path a device check passed
    EXPECT_FALSE(o.what.empty()) << o.name;
  }
  EXPECT_EQ(r.text, "emulated:4 backend options: async (not device-checked), sixteen_bit (not device-checked)");
  dev.backend.backend_options = {};
  EXPECT_EQ(describe_backend_options(dev.device).text,
            "emulated:4 backend options: none (the device-checked default path)");
}

// A device that holds no 16-bit floats refuses them with its backend's reason (Backend::why_not_held;
// CUDA's names the option sixteen_bit and the missing device check: tests/test_cuda.cpp).
TEST(DeviceOptions, ADeviceThatHoldsNoBf16SaysWhy) {
  remat::testing::EmulatedDevice dev(6);
  dev.backend.holds_16bit_floats = false;
  EXPECT_EQ(backend(dev.device).why_not_held(DType::f32), "");
  const std::string reason = backend(dev.device).why_not_held(DType::bf16);
  EXPECT_NE(reason.find("no bf16 kernels"), std::string::npos) << reason;
  const std::string message = error_of([&] { (void)zeros({2, 3}, DType::bf16, memory::Tag::other, dev.device); });
  EXPECT_NE(message.find("emulated:6 holds no bf16 tensors: " + reason), std::string::npos) << message;
}
