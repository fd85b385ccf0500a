// The command line's input checks, linked directly: strict numbers, the GPT footprint bound, the
// --costs reader, the vocabulary of weight files, the corpus's training/validation split, typo
// suggestions, the sampling helpers and the progress line.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "commands.h"
#include "corpus.h"
#include "costs.h"
#include "footprint.h"
#include "numbers.h"
#include "progress.h"
#include "remat/nn.h"
#include "temp_dir.h"
#include "usage.h"

using namespace remat;
using namespace remat::tools;

namespace {

// Expects `f` to throw remat::Error whose message contains every fragment.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << *fragments.begin();
  } catch (const Error& e) {
    for (const auto& fragment : fragments)
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what() << "\n  expected: " << fragment;
  }
}

}  // namespace

TEST(CliNumbers, IntegersAreDecimalDigitsOnly) {
  EXPECT_EQ(parse_int("--n", "42", 0, 100), 42);
  EXPECT_EQ(parse_int("--n", "-3", -5, 5), -3);
  EXPECT_EQ(parse_int("--n", "010", 0, 100), 10);  // decimal, not octal
  EXPECT_EQ(parse_int("--n", "9223372036854775807", 0, INT64_MAX), INT64_MAX);
  for (const char* bad : {"", " 1", "1 ", "+1", "0x10", "1e3", "1.0", "2x", "abc", "--1", "1,000", "١"})
    expect_error([&] { parse_int("--n", bad, 0, 100); }, {"--n: expected a whole number from 0 to 100"});
  expect_error([&] { parse_int("--n", "9223372036854775808", 0, INT64_MAX); }, {"--n", "is too large"});
  expect_error([&] { parse_int("--n", "12345678901234567890", 0, INT64_MAX); }, {"is too large"});
  expect_error([&] { parse_int("--threads", "-3", 0, 1024); }, {"--threads: -3 is out of range (a whole number from 0 to 1024)"});
  expect_error([&] { parse_int("--n", "101", 0, 100); }, {"101 is out of range"});
}

TEST(CliNumbers, Uint64HasNoSign) {
  EXPECT_EQ(parse_uint64("--seed", "18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(parse_uint64("--seed", "0"), 0u);
  expect_error([] { parse_uint64("--seed", "-1"); }, {"--seed: expected a whole number"});
  expect_error([] { parse_uint64("--seed", "18446744073709551616"); }, {"--seed", "too large"});
}

TEST(CliNumbers, RealsAreFinite) {
  EXPECT_EQ(parse_real("--lr", "2e-3"), 2e-3);
  EXPECT_EQ(parse_real("--lr", "0.5"), 0.5);
  EXPECT_EQ(parse_real("--lr", "1e300"), 1e300);
  for (const char* bad : {"", "nan", "inf", "-inf", "infinity", "1e", "0.5x", " 1", "0x1p3", "1,5"})
    expect_error([&] { parse_real("--lr", bad); }, {"--lr: expected a finite number"});
  expect_error([] { parse_real("--lr", "1e400"); }, {"--lr", "out of the range of a double"});
}

TEST(CliFootprint, ParameterCountIsTheModels) {
  for (const nn::GPTConfig& c : {nn::GPTConfig{.vocab = 7, .layers = 2, .width = 4, .heads = 2, .seq = 3},
                                 nn::GPTConfig{.vocab = 79, .layers = 0, .width = 8, .heads = 1, .seq = 16},
                                 nn::GPTConfig{.vocab = 256, .layers = 3, .width = 12, .heads = 3, .seq = 5}}) {
    nn::GPT model(c);
    EXPECT_EQ(gpt_parameter_count(c, "test"), static_cast<uint64_t>(model.num_parameters())) << c.layers << " " << c.width;
  }
}

TEST(CliFootprint, ImpossibleSizesAreErrorsNamingTheSourceAndTheBytes) {
  nn::GPTConfig c{.vocab = 79, .layers = 4, .width = 128, .heads = 4, .seq = 64};
  EXPECT_GT(check_footprint(c, 32, Use::train, "train"), 0u);
  nn::GPTConfig wide = c;
  wide.width = int64_t{1} << 62;  // 12 w^2 overflows
  expect_error([&] { check_footprint(wide, 32, Use::train, "train --width 4611686018427387904"); },
               {"train --width 4611686018427387904", "more than 2^64 parameters"});
  wide.width = int64_t{1} << 31;
  expect_error([&] { check_footprint(wide, 32, Use::train, "src"); }, {"src:", "more than 2^64"});
  nn::GPTConfig longseq = c;
  longseq.seq = 1000000;  // attention scores [32, 4, 1e6, 1e6]: 5.1e14 bytes
  expect_error([&] { check_footprint(longseq, 32, Use::train, "train --seq 1000000"); },
               {"train --seq 1000000: needs at least", "bytes", "attention scores [32, 4, 1000000, 1000000]"});
  nn::GPTConfig deep = c;
  deep.layers = 100000000000;  // 1e11 blocks of 12 w^2 + 13 w parameters
  expect_error([&] { check_footprint(deep, 1, Use::sample, "sample"); }, {"sample: needs at least", "parameters"});
  expect_error([&] { check_footprint(c, int64_t{1} << 62, Use::train, "batch"); }, {"batch:", "more than 2^64 bytes"});
}

TEST(CliTokenizer, VocabularyIsStrict) {
  CharTokenizer t = CharTokenizer::from_string("10,32,97");
  EXPECT_EQ(t.vocab_size(), 3);
  EXPECT_EQ(t.to_string(), "10,32,97");
  for (const char* bad : {"", "1,,2", "1,2,", ",1", "1, 2", "1,2x", "a", "256", "-1", "0x41"})
    expect_error([&] { CharTokenizer::from_string(bad, "metadata \"vocabulary\""); }, {"metadata \"vocabulary\""});
  expect_error([] { CharTokenizer::from_string("1,2,1", "v"); }, {"v: byte 1 appears twice"});
}

// Each file of a folder gives its last 5% to the validation text, so that text comes from every
// file in the training text's proportions (not, as a tail of the whole corpus would, from the last
// files alone).
TEST(CliCorpus, EachFileHoldsOutItsTail) {
  const std::string dir = remat::testing::fresh_dir("corpus-split");
  std::ofstream(dir + "/a") << std::string(999, 'a');  // 999 bytes and the newline load_corpus adds
  std::ofstream(dir + "/b") << std::string(199, 'b') << '\n';
  const Corpus c = load_corpus(dir);
  EXPECT_EQ(c.file_ends, (std::vector<size_t>{1000, 1200}));
  const CharTokenizer t = CharTokenizer::from_text(c.text);
  const TokenSplit s = split_tokens(t.encode(c.text), c.file_ends);
  const std::string train = t.decode(s.train), validation = t.decode(s.validation);
  EXPECT_EQ(train, std::string(950, 'a') + std::string(190, 'b'));
  EXPECT_EQ(validation, std::string(49, 'a') + "\n" + std::string(9, 'b') + "\n");
  // one file: its tail, as a single text's
  const std::vector<int64_t> ten = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const TokenSplit one = split_tokens(ten, {10}, 0.2);
  EXPECT_EQ(one.train, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(one.validation, (std::vector<int64_t>{8, 9}));
  expect_error([&] { split_tokens(ten, {4, 9}); }, {"file ends must rise to the token count 10"});
  expect_error([&] { split_tokens(ten, {6, 4, 10}); }, {"file ends must rise"});
  expect_error([&] { split_tokens(ten, {10}, 1.0); }, {"validation fraction must be in [0, 1)"});
  std::filesystem::remove_all(dir);
}

// --data that is not a regular file or a folder (/dev/zero, a FIFO with no writer) is refused on
// the open descriptor, before a byte is read: neither endless nor blocking.
TEST(CliCorpus, FilesThatAreNotRegularAreRefusedBeforeTheyAreRead) {
  expect_error([] { load_corpus("/dev/zero"); }, {"corpus file /dev/zero is a character device, not a regular file"});
  const std::string dir = remat::testing::fresh_dir("corpus-special");
  const std::string fifo = dir + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { load_corpus(fifo); }, {"corpus file " + fifo + " is a FIFO (named pipe), not a regular file"});
  // a folder reads its regular files and skips what is not one (the FIFO, a link to /dev/zero)
  std::ofstream(dir + "/text") << std::string(1999, 'x') << '\n';
  std::filesystem::create_symlink("/dev/zero", dir + "/zero");
  const Corpus c = load_corpus(dir);
  EXPECT_EQ(c.files, (std::vector<std::string>{dir + "/text"}));
  EXPECT_EQ(c.text.size(), 2000u);
  std::filesystem::remove_all(dir);
}

// More text than the limit (kMaxCorpusBytes unless given) is refused before the file that passes it
// is read, naming it; a file of exactly the room left is read.
TEST(CliCorpus, TextBeyondTheLimitIsRefusedNamingTheFile) {
  const std::string dir = remat::testing::fresh_dir("corpus-limit");
  std::ofstream(dir + "/a") << std::string(2999, 'a') << '\n';
  std::ofstream(dir + "/b") << std::string(1999, 'b') << '\n';
  EXPECT_EQ(load_corpus(dir, 5000).text.size(), 5000u);
  expect_error([&] { load_corpus(dir, 4999); },
               {"corpus too large: " + dir + "/b and the text before it come to more than 4999 bytes", "--data"});
  expect_error([&] { load_corpus(dir + "/a", 2999); },
               {"corpus too large: " + dir + "/a comes to more than 2999 bytes"});
  // the default limit, on a sparse file one byte past it: refused from its size, never read
  const std::string big = dir + "/big";
  std::ofstream(big).close();
  std::filesystem::resize_file(big, kMaxCorpusBytes + 1);
  expect_error([&] { load_corpus(big); }, {"corpus too large: " + big, "268435456 bytes (256.00 MiB)"});
  std::filesystem::remove_all(dir);
}

TEST(CliCosts, AValidFileReadsBack) {
  schedule::ChainCosts c = parse_costs(
      R"({"stages": [{"forward_seconds": 0.5, "backward_seconds": 1, "boundary_bytes": 100, "saved_bytes": 400},
                     {"forward_seconds": 0, "backward_seconds": 2e-3, "boundary_bytes": 200, "saved_bytes": 0}],
          "output_bytes": 50})",
      "c.json");
  EXPECT_EQ(c.num_stages(), 2);
  EXPECT_EQ(c.forward_time, (std::vector<double>{0.5, 0}));
  EXPECT_EQ(c.backward_time, (std::vector<double>{1, 2e-3}));
  EXPECT_EQ(c.boundary_bytes, (std::vector<size_t>{100, 200, 50}));
  EXPECT_EQ(c.saved_bytes, (std::vector<size_t>{400, 0}));
  schedule::ChainCosts list = parse_costs(
      R"([{"forward_seconds": 1, "backward_seconds": 1, "boundary_bytes": 8, "saved_bytes": 8}])", "l.json");
  EXPECT_EQ(list.boundary_bytes, (std::vector<size_t>{8, 8}));
  EXPECT_FALSE(list.can_offload());
  // an offload target's cost: the write part queued, the read back
  schedule::ChainCosts target = parse_costs(
      R"({"stages": [{"forward_seconds": 1, "backward_seconds": 1, "boundary_bytes": 8, "saved_bytes": 8}],
          "offload_write_seconds_per_byte": 0.25, "offload_read_seconds_per_byte": 0.5})",
      "t.json");
  EXPECT_EQ(target.offload_seconds_per_byte, 0.75);
  EXPECT_EQ(target.offload_write_seconds_per_byte, 0.25);
}

TEST(CliCosts, BadFilesAreErrorsNamingTheFileAndStage) {
  auto stage = [](const std::string& f, const std::string& b, const std::string& x, const std::string& s) {
    return R"({"forward_seconds": )" + f + R"(, "backward_seconds": )" + b + R"(, "boundary_bytes": )" + x +
           R"(, "saved_bytes": )" + s + "}";
  };
  const std::string ok = stage("1", "1", "8", "8");
  const std::pair<std::string, std::string> cases[] = {
      {"[" + ok + "," + stage("1", "1", "1.5", "8") + "]", "stage 1 boundary_bytes is 1.5; it must be a whole number"},
      {"[" + stage("1", "1", "8", "1e30") + "]", "stage 0 saved_bytes is 1e+30; it must be a whole number"},
      {"[" + stage("1", "1", "-8", "8") + "]", "stage 0 boundary_bytes is -8"},
      {"[" + stage("1", "1", "18446744073709551615", "8") + "]", "above the limit of 2^59"},
      {"[" + stage("1", "1", "576460752303423488", "576460752303423488") + "]", "sizes sum to more than"},
      {"[" + stage("-1", "1", "8", "8") + "]", "stage 0 forward_seconds is -1"},
      {"[" + stage("1", "1e300", "8", "8") + "]", "stage 0 backward_seconds is 1e+300"},
      {"[" + stage("\"1\"", "1", "8", "8") + "]", "stage 0 forward_seconds is \"1\""},
      {R"([{"forward_seconds": 1, "backward_seconds": 1, "boundary_bytes": 8}])", "stage 0 has no \"saved_bytes\""},
      {R"([{"forward_seconds": 1, "backward_seconds": 1, "boundary_bytes": 8, "saved_bytes": 8, "extra": 1}])",
       "unknown key \"extra\""},
      {R"([{"forward_seconds": 1, "forward_seconds": 2, "backward_seconds": 1, "boundary_bytes": 8, "saved_bytes": 8}])",
       "\"forward_seconds\" appears twice"},
      {R"({"stages": [)" + ok + R"(], "output_bytes": 0.5})", "output_bytes is 0.5"},
      {R"({"stages": [)" + ok + R"(], "outputs": 1})", "unknown key \"outputs\""},
      {R"({"output_bytes": 1})", "has no \"stages\""},
      {R"({"stages": [)" + ok + R"(], "offload_write_seconds_per_byte": -1, "offload_read_seconds_per_byte": 1e-9})",
       "offload_write_seconds_per_byte is -1; it must be a number of seconds per byte above 0"},
      {R"({"stages": [)" + ok + R"(], "offload_write_seconds_per_byte": 1e-9, "offload_read_seconds_per_byte": "x"})",
       "offload_read_seconds_per_byte is \"x\"; it must be a number of seconds per byte"},
      {R"({"stages": [)" + ok + R"(], "offload_write_seconds_per_byte": 1e-9})",
       "has \"offload_write_seconds_per_byte\" but no \"offload_read_seconds_per_byte\""},
      {"[]", "non-empty list of stages"},
      {"5", "non-empty list of stages"},
      {"[5]", "stage 0 is 5, not an object"},
      {"[" + ok, "not valid JSON"},
      {"", "not valid JSON"},
      {std::string(100000, '[') + std::string(100000, ']'), "nested more than 3 levels deep"},
      {R"({"stages": [[[1]]]})", "nested more than 3 levels deep"},
  };
  for (const auto& [text, fragment] : cases) {
    SCOPED_TRACE(text.substr(0, 80));
    expect_error([&text = text] { parse_costs(text, "bad.json"); }, {"plan: --costs bad.json: ", fragment});
  }
  expect_error([] { read_costs("/nonexistent/costs.json"); }, {"cannot read the --costs file /nonexistent/costs.json"});
}

TEST(CliUsage, ClosestMatchSuggestsLikelyTypos) {
  const std::vector<std::string> options = {"--steps", "--seed", "--seq", "--save", "--policy", "--lr", "--layers"};
  EXPECT_EQ(edit_distance("--stpes", "--steps"), 1u);  // a transposition is one edit
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(closest_match("--stpes", options), "--steps");
  EXPECT_EQ(closest_match("--polcy", options), "--policy");
  EXPECT_EQ(closest_match("--layer", options), "--layers");
  EXPECT_EQ(closest_match("--zzzzzzzz", options), "");
  EXPECT_EQ(closest_match("trian", {"train", "sample", "plan"}), "train");
  EXPECT_EQ(closest_match("xyz", {"train", "sample", "plan"}), "");
}

TEST(CliSampling, GreedyTopKTopP) {
  const std::vector<double> z = {1.0, 3.0, 2.0, 3.0, -1.0};
  // greedy: the first most likely
  EXPECT_EQ(sampling_weights(z, 0.0, 0, 1.0), (std::vector<double>{0, 1, 0, 0, 0}));
  // temperature only: exp((z - max) / t), all candidates
  std::vector<double> w = sampling_weights(z, 2.0, 0, 1.0);
  for (size_t k = 0; k < z.size(); ++k) EXPECT_DOUBLE_EQ(w[k], std::exp((z[k] - 3.0) / 2.0));
  // top-k 2 keeps the two 3.0 logits
  w = sampling_weights(z, 1.0, 2, 1.0);
  EXPECT_GT(w[1], 0);
  EXPECT_GT(w[3], 0);
  EXPECT_EQ(w[0], 0);
  EXPECT_EQ(w[2], 0);
  EXPECT_EQ(w[4], 0);
  // top-p: the fewest candidates whose probability reaches p
  const std::vector<double> two = {std::log(0.6), std::log(0.3), std::log(0.1)};
  w = sampling_weights(two, 1.0, 0, 0.5);
  EXPECT_GT(w[0], 0);
  EXPECT_EQ(w[1], 0);
  w = sampling_weights(two, 1.0, 0, 0.85);
  EXPECT_GT(w[1], 0);
  EXPECT_EQ(w[2], 0);
  w = sampling_weights(two, 1.0, 0, 1.0);
  EXPECT_GT(w[2], 0);
}

TEST(CliSampling, Utf8Escaping) {
  EXPECT_EQ(utf8_escaped("plain text\n"), "plain text\n");
  EXPECT_EQ(utf8_escaped("caf\xC3\xA9"), "caf\xC3\xA9");                   // 2 bytes
  EXPECT_EQ(utf8_escaped("\xE2\x82\xAC"), "\xE2\x82\xAC");                  // euro sign, 3 bytes
  EXPECT_EQ(utf8_escaped("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");          // 4 bytes
  EXPECT_EQ(utf8_escaped("a\xA9z"), "a\\xA9z");                             // lone continuation
  EXPECT_EQ(utf8_escaped("\xC3"), "\\xC3");                                 // truncated
  EXPECT_EQ(utf8_escaped("\xC3(x"), "\\xC3(x");                             // bad continuation
  EXPECT_EQ(utf8_escaped("\xC0\xAF"), "\\xC0\\xAF");                        // overlong
  EXPECT_EQ(utf8_escaped("\xED\xA0\x80"), "\\xED\\xA0\\x80");               // surrogate
  EXPECT_EQ(utf8_escaped("\xF4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");      // beyond U+10FFFF
  EXPECT_EQ(utf8_escaped("\xFF"), "\\xFF");
}

namespace {

// The fields of a training step's progress line, as train shows them.
const std::vector<ProgressField> kStepFields = {
    {"loss 2.310", 90}, {"val 2.402", 70}, {"15.3k tok/s", 60}, {"peak 45.1 MiB", 50}};

// `line` split at its two-space separators.
std::vector<std::string> parts_of(const std::string& line) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (size_t gap; (gap = line.find("  ", begin)) != std::string::npos; begin = gap + 2) parts.push_back(line.substr(begin, gap - begin));
  parts.push_back(line.substr(begin));
  return parts;
}

}  // namespace

TEST(CliProgress, EveryWidthKeepsWholeFieldsInPriorityOrder) {
  for (bool bar : {true, false})
    for (int columns = 20; columns <= 200; ++columns) {
      const std::string line = progress_line("train", 12, 100, kStepFields, 0.3, bar, columns);
      SCOPED_TRACE(::testing::Message() << "bar " << bar << ", " << columns << " columns: \"" << line << "\"");
      EXPECT_LE(line.size(), static_cast<size_t>(columns - 1));  // the last column stays free
      // the head: [label] [bar] counter, one space apart; then whole fields, two spaces apart
      std::vector<std::string> parts = parts_of(line);
      ASSERT_FALSE(parts.empty());
      const std::string head = parts.front();
      EXPECT_TRUE(head.ends_with("12/100")) << head;  // the counter is always there
      const std::string before = head.substr(0, head.size() - 6);
      if (!before.empty())
        EXPECT_TRUE(before == "train " || before == "train step " ||
                    (bar && before.starts_with("train [") && before.ends_with("] ")) ||
                    (bar && before.starts_with("[") && before.ends_with("] ")))
            << before;
      std::vector<int> kept;  // the priorities of the fields shown
      for (size_t i = 1; i < parts.size(); ++i) {
        bool whole = parts[i] == "ETA 2s";
        if (whole) kept.push_back(kEtaPriority);
        for (const ProgressField& f : kStepFields)
          if (parts[i] == f.text) whole = true, kept.push_back(f.priority);
        EXPECT_TRUE(whole) << "\"" << parts[i] << "\" is not a whole field";
      }
      // a field is shown only if every higher-priority one is
      std::vector<int> all = {kEtaPriority};
      for (const ProgressField& f : kStepFields) all.push_back(f.priority);
      for (int shown : kept)
        for (int p : all)
          if (p > shown) EXPECT_NE(std::find(kept.begin(), kept.end(), p), kept.end()) << p << " dropped before " << shown;
    }
}

TEST(CliProgress, WidthDecidesWhatIsShown) {
  // everything, with the widest bar, when the width allows
  EXPECT_EQ(progress_line("train", 12, 100, kStepFields, 0.3, true, 200),
            "train [##......................] 12/100  loss 2.310  val 2.402  15.3k tok/s  peak 45.1 MiB  ETA 2s");
  EXPECT_EQ(progress_line("train", 12, 100, kStepFields, 0.3, false, 0),
            "train step 12/100  loss 2.310  val 2.402  15.3k tok/s  peak 45.1 MiB  ETA 2s");
  // narrower: the bar narrows, then it, the label and the peak go whole (at 60 columns the line
  // once ended "15.3k tok/s  pe  ETA 3s")
  EXPECT_EQ(progress_line("train", 12, 100, kStepFields, 0.3, true, 90),
            "train [#..............] 12/100  loss 2.310  val 2.402  15.3k tok/s  peak 45.1 MiB  ETA 2s");
  EXPECT_EQ(progress_line("train", 12, 100, kStepFields, 0.3, true, 60), "12/100  loss 2.310  val 2.402  15.3k tok/s  ETA 2s");
  EXPECT_EQ(progress_line("train", 12, 100, kStepFields, 0.3, false, 60), "12/100  loss 2.310  val 2.402  15.3k tok/s  ETA 2s");
  EXPECT_EQ(progress_line("train", 12, 100, kStepFields, 0.3, true, 40), "12/100  loss 2.310  val 2.402  ETA 2s");
  EXPECT_EQ(progress_line("train", 12, 100, kStepFields, 0.3, true, 20), "12/100  loss 2.310");
  // done: the elapsed time in place of the ETA; an empty field is left out
  EXPECT_EQ(progress_line("train", 100, 100, {{"loss 1.5", 90}, {"", 70}}, 95, false, 0), "train step 100/100  loss 1.5  1m35s");
}
