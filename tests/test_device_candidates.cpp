// The candidate harness's logic (candidates/harness.h) on the emulated device, without a GPU: a
// candidate that gives the library's bits passes a bitwise agreement; one a unit in the last place
// off fails it, with the element named, and passes a tolerance that covers the difference; one
// that does not repeat its bits fails whatever its agreement; one that declines a problem is not
// applicable; one that throws is an error; a timed case that passed is timed on both sides; the
// table and the JSON lines report it all. The CUDA candidates themselves run on a GPU
// (remat_candidates, from scripts/cuda-check).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "candidates/harness.h"
#include "emulated_backend.h"
#include "remat/remat.h"

using namespace remat;
using namespace remat::candidates;

namespace {

// x on the device, and the library's side of every candidate below: exp(x).
struct Fixture {
  remat::testing::EmulatedDevice dev{7};
  Tensor x = randn({5, 37}, DType::f32, RngState{3, 0}).to(dev.device);
  TensorList library() const { return {exp(x)}; }
};

Candidate candidate(const std::string& name, Agreement agreement, std::function<TensorList(const Fixture&)> side,
                    const Fixture& f, bool timed = false) {
  Candidate c{name, "unary (test)", "a test candidate", std::move(agreement), {}};
  c.cases.push_back({"5 x 37", timed, [&f, side] {
                       return Trial{[&f] { return f.library(); }, [&f, side] { return side(f); }, {}};
                     }});
  return c;
}

// exp(x) with element 40 one unit in the last place up.
TensorList one_ulp_off(const Fixture& f) {
  std::vector<double> v = exp(f.x).to(kCpu).to_vector();
  v[40] = static_cast<double>(std::nextafter(static_cast<float>(v[40]), INFINITY));
  return {from_vector(v, {5, 37}, DType::f32).to(f.x.device())};
}

const Outcome& only(const std::vector<Outcome>& outcomes) {
  EXPECT_EQ(outcomes.size(), 1u);
  return outcomes.front();
}

}  // namespace

TEST(DeviceCandidates, TheLibrarysBitsPassABitwiseAgreement) {
  Fixture f;
  const std::vector<Candidate> c = {candidate("same", Agreement::bits(), [](const Fixture& g) { return g.library(); }, f)};
  const Outcome o = only(run(c, {.device = f.dev.device}));
  EXPECT_EQ(o.status, Status::passed) << o.detail;
  EXPECT_EQ(o.compared, 5u * 37u);
  EXPECT_EQ(o.mismatched, 0u);
  EXPECT_EQ(o.max_abs_diff, 0.0);
  EXPECT_FALSE(o.timed);
  EXPECT_TRUE(passed("same", run(c, {.device = f.dev.device})));
}

TEST(DeviceCandidates, OneUnitInTheLastPlaceFailsBitsAndPassesATolerance) {
  Fixture f;
  const Outcome bits = only(run({candidate("ulp", Agreement::bits(), one_ulp_off, f)}, {.device = f.dev.device}));
  EXPECT_EQ(bits.status, Status::failed);
  EXPECT_EQ(bits.mismatched, 1u);
  EXPECT_NE(bits.detail.find("element 40"), std::string::npos) << bits.detail;
  EXPECT_GT(bits.max_rel_diff, 0.0);
  EXPECT_LT(bits.max_rel_diff, 1e-6);
  const Outcome loose =
      only(run({candidate("ulp", Agreement::within(0, 1e-6, "another order"), one_ulp_off, f)}, {.device = f.dev.device}));
  EXPECT_EQ(loose.status, Status::passed) << loose.detail;
  const Outcome tight =
      only(run({candidate("ulp", Agreement::within(0, 1e-9, "too tight"), one_ulp_off, f)}, {.device = f.dev.device}));
  EXPECT_EQ(tight.status, Status::failed);
  // a case's own agreement overrides its candidate's
  Candidate own = candidate("ulp", Agreement::bits(), one_ulp_off, f);
  own.cases.front().agreement = Agreement::within(0, 1e-6, "this case's own");
  EXPECT_EQ(only(run({own}, {.device = f.dev.device})).status, Status::passed);
}

TEST(DeviceCandidates, ACandidateThatDoesNotRepeatItsBitsFails) {
  Fixture f;
  auto calls = std::make_shared<int>(0);
  const auto flaky = [calls](const Fixture& g) { return ++*calls % 2 ? g.library() : one_ulp_off(g); };
  const Outcome o =
      only(run({candidate("flaky", Agreement::within(1, 1, "anything"), flaky, f)}, {.device = f.dev.device}));
  EXPECT_EQ(o.status, Status::failed);
  EXPECT_NE(o.detail.find("does not repeat its bits"), std::string::npos) << o.detail;
}

TEST(DeviceCandidates, DecliningIsNotApplicableAndThrowingIsAnError) {
  Fixture f;
  const std::vector<Candidate> c = {
      candidate("declines", Agreement::bits(), [](const Fixture&) { return TensorList{}; }, f),
      candidate("throws", Agreement::bits(), [](const Fixture&) -> TensorList { throw Error("the kernel failed"); }, f),
      candidate("shape", Agreement::bits(), [](const Fixture& g) { return TensorList{exp(g.x).reshape({37, 5})}; }, f)};
  const std::vector<Outcome> o = run(c, {.device = f.dev.device});
  ASSERT_EQ(o.size(), 3u);
  EXPECT_EQ(o[0].status, Status::not_applicable);
  EXPECT_FALSE(passed("declines", o));  // not one case passed
  EXPECT_EQ(o[1].status, Status::error);
  EXPECT_EQ(o[1].detail, "the kernel failed");
  EXPECT_EQ(o[2].status, Status::failed);
  EXPECT_NE(o[2].detail.find("[37, 5]"), std::string::npos) << o[2].detail;
  EXPECT_THROW(run(c, {.device = f.dev.device, .only = {"nothing"}}), Error);
  EXPECT_EQ(run(c, {.device = f.dev.device, .only = {"throws"}}).size(), 1u);
}

// A timed case runs each side `warmup` + `repeats` times more between two waits for the device;
// the reset hook restores in-place state before each checked call.
TEST(DeviceCandidates, ATimedCaseIsTimedOnBothSidesAndReported) {
  Fixture f;
  auto resets = std::make_shared<int>(0);
  Candidate c{"timed", "unary (test)", "a timed test candidate", Agreement::bits(), {}};
  c.cases.push_back({"5 x 37", true, [&f, resets] {
                       return Trial{[&f] { return f.library(); }, [&f] { return f.library(); }, [resets] { ++*resets; }};
                     }});
  const uint64_t waits = f.dev.backend.synchronizations;
  const std::vector<Outcome> outcomes = run({c}, {.device = f.dev.device, .warmup = 1, .repeats = 3});
  const Outcome& o = only(outcomes);
  EXPECT_EQ(o.status, Status::passed) << o.detail;
  EXPECT_EQ(*resets, 3);  // before the library's call and the candidate's two
  EXPECT_TRUE(o.timed);
  EXPECT_GT(o.library_seconds, 0.0);
  EXPECT_GT(o.candidate_seconds, 0.0);
  EXPECT_EQ(f.dev.backend.synchronizations - waits, 4u);  // two waits around each side's timed calls
  const std::string table = markdown({c}, outcomes);
  for (const char* part : {"| timed | 5 x 37 | passed | 185 |", " ms |", "x |", "- timed (unary (test)): passed; agreement: bitwise"})
    EXPECT_NE(table.find(part), std::string::npos) << table;
  const std::string json = json_lines(outcomes);
  for (const char* part : {"\"candidate\": \"timed\"", "\"status\": \"passed\"", "\"timed\": true", "\"compared\": 185"})
    EXPECT_NE(json.find(part), std::string::npos) << json;
  EXPECT_EQ(std::count(json.begin(), json.end(), '\n'), 1);
}
