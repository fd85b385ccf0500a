// Every policy string remat accepted before the policy became two values (Keep and Saved) is
// accepted with the same meaning, prints back as it did, and every malformed one fails with the
// message it had. The expected texts were printed by the parser of commit 91cb538 (main before
// the change); the strings come from policy.h's comment, docs/checkpointing.md, the README's
// table, docs/cli.md and the tests.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "remat/checkpoint.h"
#include "remat/error.h"
#include "remat/ops.h"
#include "remat/policy.h"
#include "temp_dir.h"

using namespace remat;

namespace {

#define FORMS                                                                                                        \
  "valid forms: save-all, every-layer, every-k:K (K >= 1), selective:OP[,OP...] (e.g. selective:matmul), "           \
  "budget:BYTES (e.g. budget:64MiB), budget:auto[,limit=BYTES], dynamic:BYTES (e.g. dynamic:64MiB), "                 \
  "offload:DIR[,threshold=BYTES][,ram=BYTES] (e.g. offload:/tmp,threshold=1MiB), and KEEP+offload:DIR[,...] for any " \
  "of the first six (e.g. every-layer+offload:/tmp; dynamic: without ram=)"

// (text as written, its printed form)
const std::vector<std::pair<std::string, std::string>> kAccepted = {
    {"save-all", "save-all"},
    {"every-layer", "every-layer"},
    {"every-k:1", "every-k:1"},
    {"every-k:2", "every-k:2"},
    {"every-k:3", "every-k:3"},
    {"every-k:4", "every-k:4"},
    {"every-k:2147483647", "every-k:2147483647"},
    {"selective:matmul", "selective:matmul"},
    {"selective:matmul,tanh", "selective:matmul,tanh"},
    {"selective:conv2d", "selective:conv2d"},
    {"selective:matmul,conv2d", "selective:matmul,conv2d"},
    {"selective:matmul,scaled_dot_product_attention", "selective:matmul,scaled_dot_product_attention"},
    {"budget:1048576", "budget:1048576"},
    {"budget:64MiB", "budget:67108864"},
    {"budget:32MiB", "budget:33554432"},
    {"budget:48MiB", "budget:50331648"},
    {"budget:12MiB", "budget:12582912"},
    {"budget:2GiB", "budget:2147483648"},
    {"budget:1.5GB", "budget:1500000000"},
    {"budget:9223372036854775807", "budget:9223372036854775807"},
    {"budget:auto", "budget:auto"},
    {"budget:auto,limit=1073741824", "budget:auto,limit=1073741824"},
    {"budget:auto,limit=2GiB", "budget:auto,limit=2147483648"},
    {"dynamic:4096", "dynamic:4096"},
    {"dynamic:64MiB", "dynamic:67108864"},
    {"dynamic:320KiB", "dynamic:327680"},
    {"offload:/tmp", "offload:/tmp,threshold=1048576"},
    {"offload:/scratch", "offload:/scratch,threshold=1048576"},
    {"offload:/tmp,threshold=1MiB", "offload:/tmp,threshold=1048576"},
    {"offload:/tmp,threshold=0", "offload:/tmp,threshold=0"},
    {"offload:/tmp,ram=4096", "offload:/tmp,threshold=1048576,ram=4096"},
    {"offload:/tmp,threshold=1024,ram=4096", "offload:/tmp,threshold=1024,ram=4096"},
    {"offload:/tmp,ram=4096,threshold=1024", "offload:/tmp,threshold=1024,ram=4096"},
    {"offload:/tmp/x+y,threshold=1048576", "offload:/tmp/x+y,threshold=1048576"},
    {"save-all+offload:/tmp", "offload:/tmp,threshold=1048576"},
    {"every-layer+offload:/scratch", "every-layer+offload:/scratch,threshold=1048576"},
    {"every-layer+offload:/tmp/a,threshold=1024", "every-layer+offload:/tmp/a,threshold=1024"},
    {"every-layer+offload:/tmp/x+y,threshold=1048576", "every-layer+offload:/tmp/x+y,threshold=1048576"},
    {"every-k:2+offload:/tmp,threshold=0,ram=4096", "every-k:2+offload:/tmp,threshold=0,ram=4096"},
    {"selective:matmul,tanh+offload:/tmp,threshold=1", "selective:matmul,tanh+offload:/tmp,threshold=1"},
    {"budget:2048+offload:/tmp,threshold=1024", "budget:2048+offload:/tmp,threshold=1024"},
    {"budget:2GiB+offload:/scratch", "budget:2147483648+offload:/scratch,threshold=1048576"},
    {"budget:12MiB+offload:/tmp,threshold=64KiB", "budget:12582912+offload:/tmp,threshold=65536"},
    {"budget:auto+offload:/tmp,threshold=1024", "budget:auto+offload:/tmp,threshold=1024"},
    {"budget:auto,limit=1GiB+offload:/tmp", "budget:auto,limit=1073741824+offload:/tmp,threshold=1048576"},
    {"dynamic:4096+offload:/tmp,threshold=0", "dynamic:4096+offload:/tmp,threshold=0"},
    {"dynamic:64MiB+offload:/scratch", "dynamic:67108864+offload:/scratch,threshold=1048576"},
    {" every-layer ", "every-layer"},
    {"save-all ", "save-all"},
    {"every-k: 2", "every-k:2"},
    {"budget: 64MB", "budget:64000000"},
    {"budget:64 MiB", "budget:67108864"},
    {"dynamic:\t4096", "dynamic:4096"},
    {"budget:auto ", "budget:auto"},
    {"budget:auto, limit=1GiB", "budget:auto,limit=1073741824"},
    {"selective: matmul , tanh ", "selective:matmul,tanh"},
    {"offload: /tmp ", "offload:/tmp,threshold=1048576"},
    {"every-layer + offload:/scratch,threshold=1MiB", "every-layer+offload:/scratch,threshold=1048576"},
    {"every-layer+offload:/tmp, threshold=1MiB", "every-layer+offload:/tmp,threshold=1048576"},
    {"budget:64MB+ offload:/tmp", "budget:64000000+offload:/tmp,threshold=1048576"},
    {"every-k:2+offload:/tmp ", "every-k:2+offload:/tmp,threshold=1048576"},
};

// (text, the whole error message; for an unknown op kind, the message up to the list of kinds)
const std::vector<std::pair<std::string, std::string>> kRefused = {
    {"", "cannot parse policy ''; " FORMS ""},
    {"everylayer", "cannot parse policy 'everylayer'; " FORMS ""},
    {"every-k", "cannot parse policy 'every-k'; " FORMS ""},
    {"every-k:0", "cannot parse policy 'every-k:0': K must be a positive integer; " FORMS ""},
    {"every-k:x", "cannot parse policy 'every-k:x': K must be a positive integer of at most 2147483647; " FORMS ""},
    {"every-k:2x", "cannot parse policy 'every-k:2x': K must be a positive integer; " FORMS ""},
    {"every-k:+3", "cannot parse policy 'every-k:+3': K must be a positive integer of at most 2147483647; " FORMS ""},
    {"every-k:-3", "cannot parse policy 'every-k:-3': K must be a positive integer of at most 2147483647; " FORMS ""},
    {"every-k:3.0", "cannot parse policy 'every-k:3.0': K must be a positive integer; " FORMS ""},
    {"every-k:0x10", "cannot parse policy 'every-k:0x10': K must be a positive integer; " FORMS ""},
    {"every-k:3 4", "cannot parse policy 'every-k:3 4': K must be a positive integer; " FORMS ""},
    {"every-k:4294967297", "cannot parse policy 'every-k:4294967297': K must be a positive integer of at most 2147483647; " FORMS ""},
    {"selective:", "cannot parse policy 'selective:': empty op name; " FORMS ""},
    {"selective:matmul,,tanh", "cannot parse policy 'selective:matmul,,tanh': empty op name; " FORMS ""},
    {"selective:notanop", "cannot parse policy 'selective:notanop': policy selective: unknown op kind 'notanop'; the op kinds are "},
    {"selective:matmul,Tanh", "cannot parse policy 'selective:matmul,Tanh': policy selective: unknown op kind 'Tanh'; the op kinds are "},
    {"selective:custom:foo", "cannot parse policy 'selective:custom:foo': policy selective: invalid op kind 'custom:foo' (custom ops are always recomputed)"},
    {"budget:", "cannot parse policy 'budget:': parse_bytes: cannot parse byte count '': expected a number with an optional unit (B, KB, KiB, MB, MiB, GB, GiB, TB, TiB), e.g. 64MiB; " FORMS ""},
    {"budget:0", "cannot parse policy 'budget:0': the budget must be positive; " FORMS ""},
    {"budget:12parsecs", "cannot parse policy 'budget:12parsecs': parse_bytes: cannot parse byte count '12parsecs': unknown unit 'parsecs' (use B, KB, KiB, MB, MiB, GB, GiB, TB or TiB); " FORMS ""},
    {"budget:10000000000000000000", "cannot parse policy 'budget:10000000000000000000': parse_bytes: cannot parse byte count '10000000000000000000': more than 2^63 - 1 bytes; " FORMS ""},
    {"budget:99999999999999999999999GiB", "cannot parse policy 'budget:99999999999999999999999GiB': parse_bytes: cannot parse byte count '99999999999999999999999GiB': more than 2^63 - 1 bytes; " FORMS ""},
    {"budget:1e400MiB", "cannot parse policy 'budget:1e400MiB': parse_bytes: cannot parse byte count '1e400MiB': unknown unit 'e400MiB' (use B, KB, KiB, MB, MiB, GB, GiB, TB or TiB); " FORMS ""},
    {"budget:64MB ", "cannot parse policy 'budget:64MB ': nothing may follow the number '64MB', not even a space; " FORMS ""},
    {"budget:auto,limit=0", "cannot parse policy 'budget:auto,limit=0': the memory limit must be positive; " FORMS ""},
    {"budget:auto,limit=lots", "cannot parse policy 'budget:auto,limit=lots': limit: parse_bytes: cannot parse byte count 'lots': expected a number with an optional unit (B, KB, KiB, MB, MiB, GB, GiB, TB, TiB), e.g. 64MiB; " FORMS ""},
    {"budget:auto,max=1GiB", "cannot parse policy 'budget:auto,max=1GiB': unknown budget:auto option 'max=1GiB' (limit=BYTES); " FORMS ""},
    {"budget:auto,limit=1GiB ", "cannot parse policy 'budget:auto,limit=1GiB ': nothing may follow the number '1GiB', not even a space; " FORMS ""},
    {"save-all:3", "cannot parse policy 'save-all:3'; " FORMS ""},
    {"dynamic:", "cannot parse policy 'dynamic:': parse_bytes: cannot parse byte count '': expected a number with an optional unit (B, KB, KiB, MB, MiB, GB, GiB, TB, TiB), e.g. 64MiB; " FORMS ""},
    {"dynamic:0", "cannot parse policy 'dynamic:0': the budget must be positive; " FORMS ""},
    {"dynamic:64MiB ", "cannot parse policy 'dynamic:64MiB ': nothing may follow the number '64MiB', not even a space; " FORMS ""},
    {"dynamic:1MiB+offload:/tmp,ram=1MiB", "cannot parse policy 'dynamic:1MiB+offload:/tmp,ram=1MiB': policy dynamic:1048576+offload:/tmp,threshold=1048576,ram=1048576: ram= does not apply to dynamic:+offload: (its evicted values are written by the evicting thread, none is in flight); leave it out"},
    {"every-layer+every-k:2", "cannot parse policy 'every-layer+every-k:2': after '+' comes where kept values live, offload:DIR[,...], got 'every-k:2'; " FORMS ""},
    {"every-layer+", "cannot parse policy 'every-layer+': after '+' comes where kept values live, offload:DIR[,...], got ''; " FORMS ""},
    {"every-layer+offload:", "cannot parse policy 'every-layer+offload:': the directory is empty; " FORMS ""},
    {"every-layer+offload:/tmp,bogus=1", "cannot parse policy 'every-layer+offload:/tmp,bogus=1': unknown offload option 'bogus=1' (threshold=BYTES or ram=BYTES); " FORMS ""},
    {"bogus+offload:/tmp", "cannot parse policy 'bogus+offload:/tmp'; " FORMS ""},
    {"offload:", "cannot parse policy 'offload:': the directory is empty; " FORMS ""},
    {"offload:/tmp,threshold=0,threshold=1GiB", "cannot parse policy 'offload:/tmp,threshold=0,threshold=1GiB': the offload option threshold is given twice; " FORMS ""},
    {"offload:/tmp,ram=1MiB,ram=2MiB", "cannot parse policy 'offload:/tmp,ram=1MiB,ram=2MiB': the offload option ram is given twice; " FORMS ""},
    {"offload:/tmp,ram=4096 ", "cannot parse policy 'offload:/tmp,ram=4096 ': nothing may follow the number '4096', not even a space; " FORMS ""},
    {"offload:/tmp,threshold=1MiB ,ram=4096", "cannot parse policy 'offload:/tmp,threshold=1MiB ,ram=4096': nothing may follow the number '1MiB', not even a space; " FORMS ""},
    {"offload:/tmp,threshold=lots", "cannot parse policy 'offload:/tmp,threshold=lots': threshold: parse_bytes: cannot parse byte count 'lots': expected a number with an optional unit (B, KB, KiB, MB, MiB, GB, GiB, TB, TiB), e.g. 64MiB; " FORMS ""},
    {"every-layer+offload:/tmp,threshold=1MiB ", "cannot parse policy 'every-layer+offload:/tmp,threshold=1MiB ': nothing may follow the number '1MiB', not even a space; " FORMS ""},
    {"budget:64MB +offload:/tmp", "cannot parse policy 'budget:64MB +offload:/tmp': nothing may follow the number '64MB', not even a space; " FORMS ""},
    {"every-k:2 +offload:/tmp", "cannot parse policy 'every-k:2 +offload:/tmp': nothing may follow the number '2', not even a space; " FORMS ""},
    {"every-layer+dynamic:1MiB", "cannot parse policy 'every-layer+dynamic:1MiB': after '+' comes where kept values live, offload:DIR[,...], got 'dynamic:1MiB'; " FORMS ""},
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST(PolicyForms, EveryFormAcceptedBeforeParsesAndPrintsTheSame) {
  for (const auto& [text, printed] : kAccepted) {
    SCOPED_TRACE("'" + text + "'");
    const Policy p = Policy::parse(text);
    EXPECT_EQ(p.to_string(), printed);
    EXPECT_EQ(Policy::parse(printed), p);  // the printed form means the same
    EXPECT_EQ(Policy::parse(p.to_string()).to_string(), printed);
    EXPECT_NO_THROW(p.validate());
  }
}

// The printed form names every field, so equal prints mean equal meanings; this pins the two
// values a few of them split into.
TEST(PolicyForms, TheTwoValuesOfEachKind) {
  Policy p = Policy::parse("every-k:3");
  EXPECT_EQ(p.keep.kind, Keep::Kind::every_k);
  EXPECT_EQ(p.keep.k, 3);
  EXPECT_TRUE(p.saved.in_memory());
  p = Policy::parse("selective:matmul,tanh+offload:/tmp,threshold=1");
  EXPECT_EQ(p.keep.ops, (std::vector<std::string>{"matmul", "tanh"}));
  EXPECT_EQ(p.saved.offload, (OffloadTarget{"/tmp", 1, 0}));
  EXPECT_EQ(p.saved.dynamic_bytes, 0u);
  p = Policy::parse("budget:auto,limit=2GiB+offload:/scratch,ram=4096");
  EXPECT_EQ(p.keep.kind, Keep::Kind::budget);
  EXPECT_TRUE(p.keep.budget_auto);
  EXPECT_EQ(p.keep.memory_limit_bytes, size_t{2} << 30);
  EXPECT_EQ(p.saved.offload, (OffloadTarget{"/scratch", size_t{1} << 20, 4096}));
  // dynamic: is where kept values live; what layer calls keep stays save-all's
  p = Policy::parse("dynamic:64MiB+offload:/tmp,threshold=0");
  EXPECT_EQ(p.keep, Keep{Keep::Kind::save_all});
  EXPECT_EQ(p.saved.dynamic_bytes, size_t{64} << 20);
  EXPECT_EQ(p.saved.offload, (OffloadTarget{"/tmp", 0, 0}));
  EXPECT_EQ(p.saved.to_string(), "dynamic:67108864+offload:/tmp,threshold=0");
  EXPECT_TRUE(p.recomputes());
  EXPECT_FALSE(p.keep.recomputes());
  // offload:DIR is save-all with its kept values in the file
  p = Policy::parse("offload:/tmp");
  EXPECT_EQ(p, Policy::save_all().with_offload({"/tmp"}));
  EXPECT_FALSE(p.recomputes());
  EXPECT_EQ(p.in_memory(), Policy::save_all());
  EXPECT_EQ(Policy::every_layer().saved.to_string(), "memory");
}

TEST(PolicyForms, EveryMalformedStringFailsWithTheMessageItHad) {
  for (const auto& [text, message] : kRefused) {
    SCOPED_TRACE("'" + text + "'");
    const std::string& refused = text;  // a structured binding is not captured (clang)
    const std::string got = error_of([&] { Policy::parse(refused); });
    if (message.size() >= 17 && message.compare(message.size() - 17, 17, "the op kinds are ") == 0)
      EXPECT_EQ(got.substr(0, message.size()), message);
    else
      EXPECT_EQ(got, message);
  }
}

TEST(PolicyForms, ConstructorsAndScopesFailWithTheMessagesTheyHad) {
  EXPECT_EQ(error_of([] { Policy::dynamic(1024).with_offload({"/tmp", 0, 4096}); }),
            "policy dynamic:1024+offload:/tmp,threshold=0,ram=4096: ram= does not apply to dynamic:+offload: (its "
            "evicted values are written by the evicting thread, none is in flight); leave it out");
  EXPECT_EQ(error_of([] { Policy::every_k(0); }), "policy every-k: K must be at least 1, got 0");
  EXPECT_EQ(error_of([] { Policy::budget(0); }), "policy budget: the budget must be positive");
  EXPECT_EQ(error_of([] { Policy::dynamic(0); }), "policy dynamic: the budget must be positive");
  EXPECT_EQ(error_of([] { Policy::selective({}); }), "policy selective: list at least one op kind (e.g. selective:matmul)");
  EXPECT_EQ(error_of([] { Policy::offload(""); }), "policy offload: the directory is empty");
  const std::string dir = ::testing::TempDir();
  const std::string running = " which is running on this thread (one dynamic: or offload: runtime at a time); end it first";
  EXPECT_EQ(error_of([] {
              ScopedPolicy a(Policy::dynamic(1 << 20));
              ScopedPolicy b(Policy::dynamic(1 << 10));
            }),
            "policy dynamic:1024: cannot start inside policy dynamic:1048576," + running);
  EXPECT_EQ(error_of([&] {
              ScopedPolicy a(Policy::dynamic(1 << 20));
              ScopedPolicy b(Policy::offload(dir));
            }),
            "policy offload:" + dir + ",threshold=1048576: cannot start inside policy dynamic:1048576," + running);
  EXPECT_EQ(error_of([&] {
              ScopedPolicy a(Policy::offload(dir));
              ScopedPolicy b(Policy::dynamic(1 << 20));
            }),
            "policy dynamic:1048576: cannot start inside policy offload:" + dir + ",threshold=1048576," + running);
  // the same runtime continues, whatever the keep axis
  EXPECT_EQ(error_of([] {
              ScopedPolicy a(Policy::dynamic(1 << 20));
              ScopedPolicy b(Policy::dynamic(1 << 20));
            }),
            "accepted");
  EXPECT_EQ(error_of([&] {
              ScopedPolicy a(Policy::dynamic(1 << 20).with_offload({dir, 0, 0}));
              ScopedPolicy b(Policy::dynamic(1 << 20));
            }),
            "accepted");
  EXPECT_EQ(error_of([&] {
              ScopedPolicy a(Policy::offload(dir));
              ScopedPolicy b(Policy::every_layer().with_offload({dir}));
            }),
            "accepted");
}

// Two values that do not go together, built in C++ (no string parses to them), are refused by
// ScopedPolicy before anything changes.
TEST(PolicyForms, ValuesThatDoNotGoTogetherAreRefused) {
  Policy p = Policy::every_layer();
  p.saved.dynamic_bytes = 4096;
  EXPECT_EQ(p.to_string(), "every-layer+dynamic:4096");
  const std::string error = error_of([&] { ScopedPolicy scope(p); });
  EXPECT_NE(error.find("policy every-layer+dynamic:4096: dynamic: decides value by value what is kept"), std::string::npos)
      << error;
  EXPECT_EQ(current_policy(), Policy::every_layer());  // nothing changed
  p = Policy::dynamic(4096);
  p.saved.offload = OffloadTarget{"/tmp", 0, 1024};
  EXPECT_NE(error_of([&] { p.validate(); }).find("ram= does not apply"), std::string::npos);
  p = Policy::save_all();
  p.saved.offload = OffloadTarget{""};
  EXPECT_NE(error_of([&] { ScopedPolicy scope(p); }).find("the directory is empty"), std::string::npos);
  p = Policy::every_layer();
  p.keep.kind = Keep::Kind::every_k;
  p.keep.k = 0;
  EXPECT_NE(error_of([&] { ScopedPolicy scope(p); }).find("K must be at least 1"), std::string::npos);
}

// wait_for_offload_writes: under an offload: policy, every value the forward pass handed to the
// runtime is written out when it returns (the count of written bytes moves only as finished writes
// are collected: without the wait, the last value's write is never counted before the backward);
// the backward then writes nothing more, and the gradient is save-all's. Without a runtime it
// returns at once.
TEST(PolicyForms, AScopeWaitsForItsOffloadWrites) {
  const std::string dir = remat::testing::fresh_dir("scoped-wait");
  Tensor w = randn({48, 48}, DType::f32, RngState{3, 0}, 0.0, 0.15).requires_grad_();
  const Tensor x = randn({48, 48}, DType::f32, RngState{4, 0});
  const auto loss = [&] {
    Tensor h = x;
    for (int i = 0; i < 6; ++i) h = tanh(matmul(h, w));
    return mean(h);
  };
  const TensorList reference = grad([&](const TensorList&) { return loss(); }, {w}, GradOptions{Policy::save_all()});
  reset_counters();
  size_t written = 0;
  TensorList got;
  {
    ScopedPolicy scope(Policy::offload(dir, 1024));
    Tensor l = loss();
    scope.wait_for_offload_writes();
    written = counters().dynamic.bytes_offloaded;
    got = grad(TensorList{l}, {w});
  }
  EXPECT_GT(written, 0u);
  EXPECT_EQ(counters().dynamic.bytes_offloaded, written);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(max(abs(sub(got[0], reference[0]))).item(), 0.0);
  ScopedPolicy in_memory(Policy::every_layer());
  in_memory.wait_for_offload_writes();
  std::filesystem::remove_all(dir);
}
