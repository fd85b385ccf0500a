// The built `remat` executable against bad input of every class: each must end with exit code 1
// and a message "remat: error: ..." naming what was wrong, never a crash, a hang, an uncaught
// std:: exception or a silent success. Tiny models and one or a few steps keep this fast.
#include <sys/stat.h>

#include "cli_harness.h"
#include "remat/budget.h"
#include "schedule/chain_internal.h"

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
  expect_usage_error(train_args({{"--threads", "-3"}}), {"train --threads: -3 is out of range (a whole number from 0 to 1024)"});
  expect_usage_error(train_args({{"--threads", "5000"}}), {"train --threads: 5000 is out of range"});
  expect_usage_error(train_args({{"--steps", "9223372036854775808"}}), {"train --steps: \"9223372036854775808\" is too large"});
  expect_usage_error(train_args({{"--steps", "100000001"}}), {"train --steps: 100000001 is out of range"});
  expect_usage_error(train_args({{"--steps", "0"}}), {"train --steps: 0 is out of range"});
  expect_usage_error(train_args({{"--steps", "0x10"}}), {"train --steps: expected a whole number", "\"0x10\""});
  expect_usage_error(train_args({{"--layers", "1e1"}}), {"train --layers: expected a whole number", "\"1e1\""});
  expect_usage_error(train_args({{"--heads", "2x"}}), {"train --heads: expected a whole number", "\"2x\""});
  expect_usage_error(train_args({{"--width", "' 8'"}}), {"train --width: expected a whole number"});
  expect_usage_error(train_args({{"--batch", "0"}}), {"train --batch: 0 is out of range"});
  expect_usage_error(train_args({{"--seq", "1"}}), {"train --seq: 1 is out of range"});
  expect_usage_error(train_args({{"--seed", "-1"}}), {"train --seed: expected a whole number from 0 to 18446744073709551615"});
  expect_usage_error(train_args({{"--seed", "18446744073709551616"}}), {"train --seed", "too large"});
  expect_usage_error(train_args({{"--lr", "nan"}}), {"train --lr: expected a finite number"});
  expect_usage_error(train_args({{"--lr", "inf"}}), {"train --lr: expected a finite number"});
  expect_usage_error(train_args({{"--lr", "1e400"}}), {"train --lr", "out of the range of a double"});
  expect_usage_error(train_args({{"--lr", "0"}}), {"--lr must be a finite number > 0"});
  expect_usage_error(train_args({{"--lr", "-1"}}), {"--lr must be a finite number > 0"});
  expect_usage_error(train_args({{"--dropout", "1"}}), {"--dropout must be in [0, 1)"});
  expect_usage_error(train_args({{"--width", "7"}, {"--heads", "2"}}), {"train: --width 7 is not a multiple of --heads 2"});
  const std::string w = " --load " + path("w.safetensors");
  expect_usage_error("sample --tokens 0" + w, {"sample --tokens: 0 is out of range"});
  expect_usage_error("sample --tokens 10000001" + w, {"sample --tokens: 10000001 is out of range"});
  expect_usage_error("sample --temperature nan" + w, {"sample --temperature: expected a finite number"});
  expect_usage_error("sample --temperature -1" + w, {"--temperature must be a finite number >= 0"});
  expect_usage_error("sample --seed 1.5" + w, {"sample --seed: expected a whole number"});
  expect_usage_error("sample --threads -1" + w, {"sample --threads: -1 is out of range"});
  expect_usage_error("plan --budget 1MiB --threads -3", {"plan --threads: -3 is out of range"});
  expect_usage_error("plan --budget 1MiB --layers x", {"plan --layers: expected a whole number"});
}

TEST_F(Cli, ImpossibleModelSizesAreRefusedBeforeBuilding) {
  const std::string t = "train --quiet --threads 1 --steps 1 --data " + path("corpus.txt");
  expect_error(t + " --width 4611686018427387904", {"--width 4611686018427387904", "more than 2^64"});
  expect_error(t + " --width 2147483648", {"--width 2147483648", "more than 2^64"});
  expect_error(t + " --seq 1000000", {"--seq 1000000", "needs at least", "bytes", "attention scores"});
  expect_error(t + " --width 8 --heads 2 --layers 100000000000", {"--layers 100000000000", "needs at least", "bytes"});
  expect_error(t + " --batch 4611686018427387904", {"--batch 4611686018427387904", "more than 2^64 bytes"});
  expect_error("plan --budget 1GiB --data " + path("corpus.txt") + " --seq 1000000",
               {"plan --layers 2 --width 128 --heads 4 --seq 1000000", "needs at least"});
}

// --data /dev/zero once read until memory ran out; it is refused at once, as is a FIFO.
TEST_F(Cli, CorpusThatIsNotARegularFileIsRefusedAtOnce) {
  expect_error(train_args({{"--data", "/dev/zero"}}), {"corpus file /dev/zero is a character device"});
  expect_error("plan --budget 1GiB --threads 1 --data /dev/zero", {"corpus file /dev/zero is a character device"});
  const std::string fifo = path("corpus.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error(train_args({{"--data", fifo}}), {"corpus file " + fifo + " is a FIFO (named pipe)"});
  fs::remove(fifo);
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
  expect_usage_error("train --quiet --steps 1 --width 16 --data " + path("corpus.txt") + " --load " + path("w.safetensors"),
                     {"train: --width 16 disagrees with the model of", "(width 8)"});
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
  expect_error("sample --load " + dir_.string(), {"is a directory without model.safetensors"});
  fs::create_directories(path("nested/model.safetensors"));
  expect_error("sample --load " + path("nested"), {"is a directory without model.safetensors"});
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
  expect_usage_error("plan --budget 1KiB --layers 2 --costs " + path("ok.json"), {"cannot be combined with --costs"});
  // a chain too long for the planner is refused before planning
  std::string many = "[";
  for (int i = 0; i < 100001; ++i) many += (i ? "," : "") + stage("16");
  expect_error("plan --budget 1MiB --costs " + write("many.json", many + "]"),
               {"the chain has more than 100000 stages; remat plan reads at most 100000"});
}

TEST_F(Cli, VersionAndExitCodes) {
  Result r = run("--version");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind(std::string("remat ") + REMAT_VERSION + "\nbackends: cpu", 0), 0u) << r.output;
  // usage errors exit 2 (not CLI11's own codes), with the closest valid name suggested
  expect_usage_error(train_args() + " --stpes 3", {"--stpes", "did you mean --steps?", "remat train --help"});
  expect_usage_error(train_args() + " --json --polcy save-all", {"did you mean --policy?"});
  expect_usage_error("trian --steps 1", {"did you mean `remat train`?"});
  expect_usage_error("smaple --load x", {"did you mean `remat sample`?"});
  expect_usage_error("plan --budget", {"--budget"});  // the option without its value
  expect_usage_error(train_args({{"--policy", "every-kk:2"}}), {"train --policy:"});
  expect_usage_error("plan --budget 12 apples", {"apples"});
  Result far = run(train_args() + " --zzzzzzzz 1");
  EXPECT_EQ(far.code, 2) << far.output;
  EXPECT_EQ(far.output.find("did you mean"), std::string::npos) << far.output;  // nothing close
  // runtime errors exit 1
  expect_error(train_args({{"--data", path("missing.txt")}}), {"missing.txt"});
}

TEST_F(Cli, JsonCarriesTheVersionAndErrors) {
  Streams r = run_streams(train_args({{"--steps", "1"}}) + " --json");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(std::string("\"version\":\"") + REMAT_VERSION + "\""), std::string::npos) << r.out;
  // an error with --json: a JSON object on stdout as well as the message on stderr
  r = run_streams(train_args({{"--lr", "-1"}}) + " --json");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.out, std::string("{\"error\":\"train: --lr must be a finite number > 0, got -1\",\"exit_code\":2,\"version\":\"") +
                       REMAT_VERSION + "\"}\n");
  EXPECT_EQ(r.err, "remat: error: train: --lr must be a finite number > 0, got -1\n");
  r = run_streams(train_args({{"--data", path("missing.txt")}}) + " --json");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.out.find("\"exit_code\":1"), std::string::npos) << r.out;
  r = run_streams(train_args() + " --json --stpes 2");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.out.find("did you mean --steps?"), std::string::npos) << r.out;
}

TEST_F(Cli, LoadWithArchitectureFlags) {
  const std::string load = " --load " + path("w.safetensors");
  // flags that agree with the file are accepted
  Result r = run(train_args({{"--steps", "1"}}) + load);
  EXPECT_EQ(r.code, 0) << r.output;
  // flags that disagree are named, with the file's values
  expect_usage_error(train_args({{"--layers", "2"}, {"--heads", "4"}}) + load,
                     {"train: --layers 2, --heads 4 disagree with the model of", "(layers 1, heads 2)"});
  expect_usage_error(train_args({{"--seq", "16"}}) + load, {"--seq 16 disagrees", "(seq 8)"});
}

TEST_F(Cli, EvalOnly) {
  const std::string load = " --load " + path("w.safetensors");
  Streams r = run_streams(train_args() + load + " --eval-only --json");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(lines_of(r.out).size(), 1u) << r.out;
  EXPECT_NE(r.out.find("\"eval_only\":true"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"val_loss\":"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("final_loss"), std::string::npos) << r.out;  // nothing trained
  // the same weights give the same validation loss
  EXPECT_EQ(run_streams(train_args() + load + " --eval-only --json").out, r.out);
  r = run_streams("train --threads 1 --batch 2 --data " + path("corpus.txt") + load + " --eval-only");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("validation loss"), std::string::npos) << r.err;
  expect_usage_error(train_args() + " --eval-only", {"--eval-only needs --load"});
}

TEST_F(Cli, HumanOutputOnStderrJsonLinesOnStdout) {
  const std::string args = train_args({{"--steps", "4"}, {"--eval-every", "2"}, {"--policy", "budget:30MiB"}});
  // --quiet --json: nothing on stderr, one JSON line per validation and the results
  Streams r = run_streams(args + " --json");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  std::vector<std::string> lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  for (const auto& line : lines) EXPECT_EQ(line.front(), '{') << line;
  EXPECT_NE(lines[0].find("\"event\":\"eval\",\"seconds\""), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("\"step\":2"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("\"step\":4"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("\"budget_bytes\":31457280"), std::string::npos) << lines[2];  // bytes in JSON
  // without --quiet: the human report on stderr in human units, nothing on stdout without --json
  std::string loud = args;
  loud.replace(loud.find("train --quiet"), 13, "train");
  r = run_streams(loud);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("policy budget:30MiB"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("31457280"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("step 2/4: train loss"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("validation loss"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" KiB"), std::string::npos) << r.err;
}

TEST_F(Cli, ProgressFitsTheWidth) {
  std::string args = train_args({{"--steps", "30"}});
  args.replace(args.find("train --quiet"), 13, "train");
  for (int columns : {60, 120}) {
    SCOPED_TRACE(columns);
    // a log (not a terminal): plain progress lines, fit to COLUMNS (whole fields dropped: at 60
    // the label and the peak go, see CliProgress in test_cli_units)
    Streams r = run_streams(args, "COLUMNS=" + std::to_string(columns));
    EXPECT_EQ(r.code, 0) << r.err;
    int progress_lines = 0;
    for (const auto& line : lines_of(r.err)) {
      if (line.find("/30  loss ") == std::string::npos || line.rfind("step ", 0) == 0) continue;
      EXPECT_EQ(line.rfind(columns == 120 ? "train step " : "", 0), 0u) << line;
      EXPECT_EQ(line.find("pe "), std::string::npos) << line;  // no field cut short
      ++progress_lines;
      EXPECT_LT(line.size(), static_cast<size_t>(columns)) << line;
      if (line.find("30/30  ") == std::string::npos) EXPECT_NE(line.find("ETA "), std::string::npos) << line;
    }
    EXPECT_GE(progress_lines, 20) << r.err;
  }
  // a narrow log: the evaluation notes are whole lines, never cut
  Streams narrow = run_streams(args, "COLUMNS=20");
  EXPECT_NE(narrow.err.find("\nstep 30/30: train loss "), std::string::npos) << narrow.err;
  for (const auto& line : lines_of(narrow.err))
    if (line.rfind("step ", 0) == 0) EXPECT_NE(line.find(", validation loss "), std::string::npos) << line;
  // a pseudo-terminal (script(1)): every redraw of the bar fits in 60 columns and shows an ETA
  if (std::system("command -v script > /dev/null 2>&1") != 0) GTEST_SKIP() << "no script(1) for a pseudo-terminal";
  const std::string typescript = path("typescript");
  std::string long_run = train_args({{"--steps", "200"}});
  long_run.replace(long_run.find("train --quiet"), 13, "train");
  const std::string command =
      "COLUMNS=60 script -qec '" + std::string(REMAT_CLI_PATH) + " " + long_run + "' " + typescript + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0);
  std::ifstream in(typescript, std::ios::binary);
  const std::string screen((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int redraws = 0, with_eta = 0;
  size_t start = 0;
  for (size_t end; (end = screen.find("\033[K", start)) != std::string::npos; start = end + 1) {
    // each redraw: "\r" LINE "\033[K"
    const size_t from = screen.rfind('\r', end);
    if (from == std::string::npos || from < start) continue;
    const std::string bar = screen.substr(from + 1, end - from - 1);
    if (bar.find("/200  loss ") == std::string::npos) continue;  // the line cleared for a note
    EXPECT_LT(bar.size(), 60u) << bar;
    ++redraws;
    if (bar.find("ETA ") != std::string::npos) ++with_eta;
  }
  EXPECT_GE(redraws, 1) << screen;
  EXPECT_GE(with_eta + 1, redraws) << screen;  // all but the last (which shows the elapsed time)
}

TEST_F(Cli, Sampling) {
  const std::string w = " --threads 1 --tokens 20 --load " + path("w.safetensors");
  // greedy decoding does not depend on the seed; top-k 1 is greedy
  Result greedy = run("sample --temperature 0 --seed 1" + w);
  EXPECT_EQ(greedy.code, 0) << greedy.output;
  EXPECT_EQ(run("sample --temperature 0 --seed 2" + w).output, greedy.output);
  EXPECT_EQ(run("sample --top-k 1 --seed 3" + w).output, greedy.output);
  EXPECT_EQ(run("sample --top-p 0.000001 --seed 4" + w).output, greedy.output);
  EXPECT_EQ(run("sample --top-k 3 --top-p 0.9" + w).code, 0);
  expect_usage_error("sample --top-p 0" + w, {"--top-p must be in (0, 1]"});
  expect_usage_error("sample --top-p 1.5" + w, {"--top-p must be in (0, 1]"});
  expect_usage_error("sample --top-k -1" + w, {"sample --top-k: -1 is out of range"});
  // a prompt byte outside the vocabulary
  expect_usage_error("sample --prompt 'fox!'" + w, {"sample --prompt: byte 3 ('!') is not in the vocabulary of", "characters"});
}

TEST_F(Cli, SampleOutputIsUtf8UnlessRaw) {
  // a corpus whose vocabulary holds the two bytes of "é" (C3 A9) separately usable
  {
    std::ofstream corpus(path("accents.txt"), std::ios::binary);
    for (int i = 0; i < 100; ++i) corpus << "caf\xC3\xA9 cr\xC3\xA8me " << i << "\n%\n";
  }
  const std::string weights = path("accents.safetensors");
  Result r = run(train_args({{"--data", path("accents.txt")}, {"--save", weights}}));
  ASSERT_EQ(r.code, 0) << r.output;
  // the prompt "é" then a lone A9 byte: the first is UTF-8, the second is not
  const std::string args =
      "sample --threads 1 --tokens 1 --temperature 0 --load " + weights + " --prompt \"$(printf '\\303\\251\\251')\"";
  r = run(args);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("\xC3\xA9\\xA9", 0), 0u) << r.output;  // é kept, the lone byte escaped
  r = run(args + " --raw");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("\xC3\xA9\xA9", 0), 0u) << r.output;  // the bytes as they are
}

TEST_F(Cli, PlanExplainsItsNotation) {
  const std::string stage = R"({"forward_seconds": 1, "backward_seconds": 2, "boundary_bytes": 16, "saved_bytes": 64})";
  std::ofstream(path("two.json")) << "[" << stage << "," << stage << "]";
  Result r = run("plan --budget 1KiB --costs " + path("two.json"));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("S = stage run with recording, R[a..b](...) = region re-run"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Fn i / Fa i = stage i's forward without / with recording, L = the loss"), std::string::npos)
      << r.output;
  // everything fits: every stage recorded; boundary 1 freed once stage 1's backward is done
  EXPECT_NE(r.output.find("\n  Fa0 Fa1 L B1 D1 B0\n"), std::string::npos) << r.output;
}

// `remat plan` prints the feasible budgets of a GPT; `remat train` runs one step at the
// printed smallest dynamic: budget and fails, naming that smallest, one byte below it; the same
// for budget: at its printed smallest (the step after the profiling steps plans).
TEST_F(Cli, PlanPrintsTheFeasibleRange) {
  // a small GPT (the default one takes about a minute here, and several under the sanitizers)
  const std::string model = " --layers 2 --width 32 --heads 2 --seq 16 --batch 4";
  Result r = run("plan --threads 2 --budget 1GiB" + model);
  ASSERT_EQ(r.code, 0) << r.output;
  // "  budget:  from N bytes (...), save-all's peak M bytes (...)": {N, M}
  auto range_of = [&](const std::string& key) -> std::pair<size_t, size_t> {
    const size_t at = r.output.find(key), top = r.output.find("save-all's peak ", at);
    if (at == std::string::npos || top == std::string::npos) return {0, 0};
    return {std::stoull(r.output.substr(at + key.size())), std::stoull(r.output.substr(top + 16))};
  };
  const auto [budget_min, budget_top] = range_of("\n  budget:  from ");
  const auto [dynamic_min, dynamic_top] = range_of("\n  dynamic: from ");
  ASSERT_GT(budget_min, 0u) << r.output;
  ASSERT_GT(dynamic_min, 0u) << r.output;
  EXPECT_LT(budget_min, budget_top) << r.output;
  EXPECT_LT(dynamic_min, dynamic_top) << r.output;
  // without --budget: the same range, and no plan
  const Result alone = run("plan --threads 2" + model);
  ASSERT_EQ(alone.code, 0) << alone.output;
  EXPECT_NE(alone.output.find("\n  budget:  from " + std::to_string(budget_min) + " bytes"), std::string::npos) << alone.output;
  EXPECT_NE(alone.output.find("\n  dynamic: from "), std::string::npos) << alone.output;
  EXPECT_EQ(alone.output.find("planner:"), std::string::npos) << alone.output;
  // --json: the budget: range of a --costs chain is the planner's least peak and save-all's
  const std::string stage = R"({"forward_seconds": 1, "backward_seconds": 2, "boundary_bytes": 16, "saved_bytes": 64})";
  std::ofstream(path("range.json")) << "[" << stage << "," << stage << "," << stage << "]";
  r = run("plan --budget 1KiB --json --costs " + path("range.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(lines_of(r.output).back());
  const schedule::ChainCosts costs = schedule::ChainCosts::uniform(3, 1, 2, 16, 64);
  EXPECT_EQ(j["feasible"]["budget"]["smallest_bytes"], schedule::min_feasible_memory(costs)) << r.output;
  EXPECT_EQ(j["feasible"]["budget"]["save_all_peak_bytes"], schedule::plan_save_all(costs).predicted_peak_bytes);
  EXPECT_FALSE(j["feasible"].contains("dynamic")) << r.output;
  // the per-stage report at the smallest budget: some stage recomputed, at its forward time per re-run
  const size_t smallest = j["feasible"]["budget"]["smallest_bytes"];
  r = run("plan --json --budget " + std::to_string(smallest) + " --costs " + path("range.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json tight = nlohmann::json::parse(lines_of(r.output).back());
  ASSERT_EQ(tight["plan_stages"].size(), 3u) << r.output;
  int recomputed = 0;
  for (const auto& stage : tight["plan_stages"]) {
    const int runs = stage["forward_runs"];
    EXPECT_EQ(stage["decision"], runs > 1 ? "recompute" : "keep") << stage;
    EXPECT_EQ(stage["recompute_seconds"], static_cast<double>(runs - 1)) << stage;  // forward_seconds 1
    EXPECT_EQ(stage["saved_bytes"], 64u);
    recomputed += runs > 1;
  }
  EXPECT_GT(recomputed, 0) << r.output;

  const std::string train = "train --threads 2 --json" + model + " --policy ";
  r = run(train + "dynamic:" + std::to_string(dynamic_min) + " --steps 1");
  EXPECT_EQ(r.code, 0) << r.output;
  r = run(train + "dynamic:" + std::to_string(dynamic_min - 1) + " --steps 1");
  EXPECT_EQ(r.code, 1) << r.output;
  // the error names the whole step's minimum, the one `remat plan` printed, not the part seen so far
  EXPECT_NE(r.output.find("the smallest feasible dynamic: budget of a step of this model, " + std::to_string(dynamic_min) +
                          " bytes"),
            std::string::npos)
      << r.output;
  // with evictions to a file the minimum is the same, and the advice keeps the placement
  const std::string to_file = "+offload:" + path("") + ",threshold=0";
  r = run(train + "dynamic:" + std::to_string(dynamic_min - 1) + to_file + " --steps 1");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("pass --policy dynamic:" + std::to_string(dynamic_min) + to_file), std::string::npos) << r.output;
  const std::string planned = " --steps " + std::to_string(BudgetPlanner::kProfilingSteps + 1);
  r = run(train + "budget:" + std::to_string(budget_min) + planned);
  EXPECT_EQ(r.code, 0) << r.output;
  r = run(train + "budget:" + std::to_string(budget_min - 1) + planned);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("smallest feasible budget for the model with input [4, 16]: " + std::to_string(budget_min) +
                          " bytes"),
            std::string::npos)
      << r.output;
}

// grad_digest hashes the first step that runs a budget policy's plan (the profiling steps before
// it run as every-layer), so it checks the plan: under a budget below save-all's peak, that step
// ran the plan and its digest is save-all's; a run too short to plan says its step did not.
// --offload DIR: the smallest budget with kept values allowed in the directory, beside the one
// without (the planner's least peak with an offload target, whatever its cost per byte), and
// --budget planned with it: a budget at that smallest one runs. A directory that cannot be
// written is an error naming it.
TEST_F(Cli, PlanWithOffloadPrintsBothSmallestBudgets) {
  std::string text = "[";
  for (int i = 0; i < 12; ++i)
    text += std::string(i ? "," : "") + R"({"forward_seconds": 1, "backward_seconds": 2, "boundary_bytes": )" +
            std::to_string(16 + 8 * (i % 3)) + R"(, "saved_bytes": )" + std::to_string(64 + 32 * (i % 4)) + "}";
  std::ofstream(path("offload.json")) << text << "]";
  fs::create_directories(path("target"));
  Result r = run("plan --json --offload " + path("target") + " --costs " + path("offload.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(lines_of(r.output).back());
  schedule::ChainCosts costs;
  for (int i = 0; i < 12; ++i) {
    costs.forward_time.push_back(1);
    costs.backward_time.push_back(2);
    costs.boundary_bytes.push_back(static_cast<size_t>(16 + 8 * (i % 3)));
    costs.saved_bytes.push_back(static_cast<size_t>(64 + 32 * (i % 4)));
  }
  costs.boundary_bytes.push_back(costs.boundary_bytes.back());
  const size_t without = j["feasible"]["budget"]["smallest_bytes"];
  ASSERT_TRUE(j["feasible"].contains("budget_offload")) << r.output;
  const size_t with = j["feasible"]["budget_offload"]["smallest_bytes"];
  EXPECT_LE(with, without);
  costs.offload_seconds_per_byte = 0;
  EXPECT_EQ(with, schedule::min_feasible_memory(costs)) << r.output;
  EXPECT_GT(j["feasible"]["budget_offload"]["write_bytes_per_second"].get<double>(), 0.0);
  EXPECT_EQ(j["feasible"]["budget_offload"]["target"], "offload:" + path("target") + ",threshold=1048576");
  r = run("plan --offload " + path("target") + " --budget " + std::to_string(with) + " --costs " + path("offload.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\n  budget:+offload:" + path("target")), std::string::npos) << r.output;
  expect_error("plan --offload " + path("missing/dir") + " --costs " + path("offload.json"), {path("missing/dir")});
}

// A profiled model long enough for the grouped planner (114 layer calls): the smallest budgets
// `remat plan` prints, with and without --offload DIR, are the ones `remat train` runs from (one
// byte less is refused), and a plan's predicted peak at that budget is what train reports.
TEST_F(Cli, PlanPrintsTheSmallestBudgetsTrainRunsFrom) {
  fs::create_directories(path("smallest"));
  const std::string model = " --threads 1 --data " + path("corpus.txt") + " --layers 110 --width 8 --heads 2 --seq 8 --batch 2";
  const Result range = run("plan --json --offload " + path("smallest") + model);
  ASSERT_EQ(range.code, 0) << range.output;
  const nlohmann::json feasible = nlohmann::json::parse(lines_of(range.output).back())["feasible"];
  const std::string steps = std::to_string(BudgetPlanner::kProfilingSteps + 1);
  for (const std::string& offload : std::vector<std::string>{"", "+offload:" + path("smallest") + ",threshold=0"}) {
    const size_t smallest = feasible[offload.empty() ? "budget" : "budget_offload"]["smallest_bytes"];
    SCOPED_TRACE("budget:" + std::to_string(smallest) + offload);
    const Result runs = run("train --quiet --json --steps " + steps + " --policy budget:" + std::to_string(smallest) + offload + model);
    EXPECT_EQ(runs.code, 0) << runs.output;
    const Result below = run("train --quiet --steps " + steps + " --policy budget:" + std::to_string(smallest - 1) + offload + model);
    EXPECT_NE(below.output.find("is below the smallest feasible budget"), std::string::npos) << below.output;
    if (!offload.empty()) {  // within the plan's prediction: the saved bytes never went over its cap
      EXPECT_NE(runs.output.find("\"bytes_over_plan\":0,"), std::string::npos) << runs.output;
      continue;
    }
    const Result plan = run("plan --json --budget " + std::to_string(smallest) + model);
    ASSERT_EQ(plan.code, 0) << plan.output;
    const size_t predicted = nlohmann::json::parse(lines_of(plan.output).back())["plan"]["predicted_peak_bytes"];
    const std::string key = "\"predicted_peak_saved_bytes\":";
    const size_t at = runs.output.rfind(key);
    ASSERT_NE(at, std::string::npos) << runs.output;
    EXPECT_EQ(std::stoull(runs.output.substr(at + key.size())), predicted) << runs.output;
  }
}

TEST_F(Cli, GradDigestHashesAStepThatRanThePlan) {
  auto field = [](const std::string& out, const std::string& name) {
    const size_t at = out.rfind("\"" + name + "\":");
    return at == std::string::npos ? std::string() : out.substr(at + name.size() + 3, out.find_first_of(",}", at) - at - name.size() - 3);
  };
  const std::string planned = std::to_string(BudgetPlanner::kProfilingSteps + 1);
  auto with = [&](const std::string& policy, const std::string& steps) {
    return run(train_args({{"--policy", policy}, {"--steps", steps}, {"--layers", "3"}}) + " --json");
  };
  const Result all = with("save-all", planned);
  ASSERT_EQ(all.code, 0) << all.output;
  const size_t top = std::stoull(field(all.output, "save_all_peak_saved_bytes"));
  // the smallest feasible budget of this model, from `remat plan`
  const Result range = run("plan --budget 1GiB --json --threads 1 --data " + path("corpus.txt") +
                           " --layers 3 --width 8 --heads 2 --seq 8 --batch 2");
  ASSERT_EQ(range.code, 0) << range.output;
  const std::string smallest =
      nlohmann::json::parse(lines_of(range.output).back())["feasible"]["budget"]["smallest_bytes"].dump();
  const Result tight = with("budget:" + smallest, planned);
  ASSERT_EQ(tight.code, 0) << tight.output;
  EXPECT_EQ(field(tight.output, "grad_digest_step"), planned);
  EXPECT_EQ(field(tight.output, "grad_digest_under_plan"), "true");
  EXPECT_LT(std::stoull(field(tight.output, "predicted_peak_saved_bytes")), top) << tight.output;  // it recomputes
  EXPECT_EQ(field(tight.output, "grad_digest"), field(all.output, "grad_digest"));
  const Result short_run = with("budget:" + smallest, std::to_string(BudgetPlanner::kProfilingSteps));
  ASSERT_EQ(short_run.code, 0) << short_run.output;
  EXPECT_EQ(field(short_run.output, "grad_digest_step"), std::to_string(BudgetPlanner::kProfilingSteps));
  EXPECT_EQ(field(short_run.output, "grad_digest_under_plan"), "false");
}

// The two axes of --policy composed, and budget:auto: every-layer with its kept boundaries in
// files, and a budget from the machine (save-all when it fits) or from --memory-limit (a plan that
// recomputes), all with save-all's gradients; bad combinations are errors that say why.
TEST_F(Cli, ComposedPoliciesAndTheAutomaticBudget) {
  auto field = [](const std::string& out, const std::string& name) {
    const size_t at = out.rfind("\"" + name + "\":");
    return at == std::string::npos ? std::string() : out.substr(at + name.size() + 3, out.find_first_of(",}", at) - at - name.size() - 3);
  };
  const std::string steps = std::to_string(BudgetPlanner::kProfilingSteps + 1);
  auto with = [&](const std::string& policy, const std::string& extra = "") {
    return run(train_args({{"--policy", policy}, {"--steps", steps}, {"--layers", "3"}}) + " --json" + extra);
  };
  const Result all = with("save-all");
  ASSERT_EQ(all.code, 0) << all.output;
  const std::string digest = field(all.output, "grad_digest");

  const Result offloaded = with("every-layer+offload:" + path("") + ",threshold=0");
  ASSERT_EQ(offloaded.code, 0) << offloaded.output;
  EXPECT_NE(field(offloaded.output, "values_offloaded"), "0") << offloaded.output;
  EXPECT_GT(std::stoull(field(offloaded.output, "regions_created")), 0u) << offloaded.output;
  EXPECT_EQ(field(offloaded.output, "grad_digest"), digest);

  const Result fits = with("budget:auto");
  ASSERT_EQ(fits.code, 0) << fits.output;
  EXPECT_EQ(field(fits.output, "save_all_fits"), "true") << fits.output;
  EXPECT_EQ(field(fits.output, "plan").find("R["), std::string::npos) << fits.output;  // recomputes nothing
  EXPECT_EQ(field(fits.output, "grad_digest"), digest);

  // a limit that leaves half of save-all's peak for saved values: the plan recomputes, within it
  const size_t held = std::stoull(field(fits.output, "held_besides_saved_bytes"));
  const size_t top = std::stoull(field(fits.output, "save_all_peak_bytes"));
  const Result tight = with("budget:auto", " --memory-limit " + std::to_string(held + top / 2));
  ASSERT_EQ(tight.code, 0) << tight.output;
  EXPECT_EQ(field(tight.output, "save_all_fits"), "false") << tight.output;
  EXPECT_EQ(field(tight.output, "capacity_source"), "\"the memory limit\"") << tight.output;
  EXPECT_NE(field(tight.output, "plan").find("R["), std::string::npos) << tight.output;
  EXPECT_LE(std::stoull(field(tight.output, "predicted_peak_saved_bytes")), top / 2) << tight.output;
  EXPECT_EQ(field(tight.output, "grad_digest"), digest);

  // the same allowance as a budget with an offload target: the plan may offload, and says so
  const Result planned = with("budget:" + std::to_string(top / 2) + "+offload:" + path("") + ",threshold=0");
  ASSERT_EQ(planned.code, 0) << planned.output;
  EXPECT_NE(planned.output.find("\"plan_offload\":{"), std::string::npos) << planned.output;
  EXPECT_GT(std::stod(field(planned.output, "write_bytes_per_second")), 0.0) << planned.output;
  EXPECT_NE(field(planned.output, "predicted_offloaded_bytes"), "") << planned.output;
  EXPECT_EQ(field(planned.output, "grad_digest"), digest);

  expect_error(train_args({{"--policy", "budget:auto"}, {"--steps", steps}, {"--memory-limit", "1KiB"}}),
               {"budget:auto", "besides saved values", "may use only 1024 bytes", "the memory limit"});
  expect_error(train_args({{"--policy", "every-layer"}, {"--memory-limit", "1GiB"}}),
               {"--memory-limit caps the memory of --policy budget:auto"}, 2);
  expect_error(train_args({{"--policy", "budget:auto,limit=1GiB"}, {"--memory-limit", "1GiB"}}),
               {"give one of them"}, 2);
  expect_error(train_args({{"--policy", "dynamic:1MiB+offload:/tmp,ram=1MiB"}}), {"ram= does not apply to dynamic:"}, 2);
  expect_error(train_args({{"--policy", "every-layer+every-k:2"}}), {"after '+' comes where kept values live"}, 2);
}

// --fuse-optimizer: refused with clipping (it needs every gradient first) and under a bad
// combination; with --clip 0 it saves the weights of the unfused run byte for byte, prints its
// grad_digest, and its peak total bytes are lower (the gradients are freed one by one).
TEST_F(Cli, FusedOptimizer) {
  expect_usage_error(train_args() + " --fuse-optimizer",
                     {"--fuse-optimizer updates each parameter as soon as its gradient is final", "--clip 0"});
  expect_usage_error(train_args({{"--clip", "-2"}}), {"--clip must be a finite number >= 0"});
  auto field = [](const std::string& out, const std::string& name) {
    const std::string key = "\"" + name + "\":";
    const size_t at = out.rfind(key);
    if (at == std::string::npos) return std::string();
    const size_t end = out.find_first_of(",}", at);
    return out.substr(at + key.size(), end - at - key.size());
  };
  const std::string a = path("unfused.safetensors"), b = path("fused.safetensors");
  const auto common = std::map<std::string, std::string>{{"--steps", "3"}, {"--accumulate", "2"}, {"--clip", "0"},
                                                         {"--width", "16"}, {"--layers", "2"}};
  auto with = [&](const std::string& save) {
    auto o = common;
    o["--save"] = save;
    return train_args(o);
  };
  Result plain = run(with(a) + " --json");
  Result fused = run(with(b) + " --json --fuse-optimizer");
  ASSERT_EQ(plain.code, 0) << plain.output;
  ASSERT_EQ(fused.code, 0) << fused.output;
  EXPECT_EQ(field(fused.output, "fuse_optimizer"), "true");
  for (const char* f : {"grad_digest", "first_loss", "final_loss", "val_loss"})
    EXPECT_EQ(field(plain.output, f), field(fused.output, f)) << f;
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  const std::string wa((std::istreambuf_iterator<char>(fa)), std::istreambuf_iterator<char>());
  const std::string wb((std::istreambuf_iterator<char>(fb)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "the fused run saved other weights";
  EXPECT_LT(std::stoull(field(fused.output, "peak_total_bytes")), std::stoull(field(plain.output, "peak_total_bytes")));
  // a divergent fused step stops before the update of the first non-finite gradient
  expect_error(train_args({{"--steps", "5"}, {"--lr", "1e300"}, {"--clip", "0"}}) + " --fuse-optimizer",
               {"diverged", "--fuse-optimizer", "--allow-nonfinite"});
}

// --tie-embeddings: one parameter for wte and lm_head, saved once; a file without lm_head.weight
// loads as tied; an untied file is not turned into a tied model (nor the other way) silently.
TEST_F(Cli, TiedEmbeddings) {
  const std::string tied = path("tied.safetensors");
  Streams r = run_streams(train_args({{"--save", tied}, {"--tie-embeddings", ""}, {"--json", ""}}));
  ASSERT_EQ(r.code, 0) << r.err;
  Streams u = run_streams(train_args({{"--json", ""}}));
  ASSERT_EQ(u.code, 0) << u.err;
  auto parameters = [](const std::string& out) {
    const size_t at = out.rfind("\"parameters\":");
    return at == std::string::npos ? -1 : std::stoll(out.substr(at + 13));
  };
  nn::SafetensorsFile f = nn::load_safetensors(tied);
  EXPECT_EQ(f.tensors.count("lm_head.weight"), 0u);
  const int64_t vocab = f.tensors.at("wte.weight").size(0), width = f.tensors.at("wte.weight").size(1);
  EXPECT_EQ(parameters(r.out), parameters(u.out) - vocab * width) << r.out;  // the report counts it once
  // loads as tied (the file says so), trains on, samples; the model line says it
  Streams again = run_streams("train --threads 1 --steps 1 --batch 2 --data " + path("corpus.txt") + " --load " + tied);
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("(lm_head tied to wte)"), std::string::npos) << again.err;
  EXPECT_EQ(run("sample --threads 1 --tokens 5 --load " + tied).code, 0);
  // saved as nanoGPT and Hugging Face files: once, and the same text from each
  const std::string s = "sample --threads 1 --tokens 20 --temperature 0 --load ";
  const std::string expected = run(s + tied).output;
  for (const std::string format : {"nanogpt", "hf-gpt2"}) {
    const std::string file = path("tied-" + format);  // a directory for hf-gpt2
    ASSERT_EQ(run(train_args({{"--save", file}, {"--tie-embeddings", ""}, {"--format", format}})).code, 0);
    const std::string weights = format == "hf-gpt2" ? file + "/model.safetensors" : file;
    EXPECT_EQ(nn::load_safetensors(weights).tensors.count("lm_head.weight"), 0u) << format;
    EXPECT_EQ(run(s + file).output, expected) << format;
  }
  // the optimizer inside the backward updates the tied weight once both uses have contributed:
  // the same weights as the unfused run
  const std::string plain = path("tied-plain.safetensors"), fused = path("tied-fused.safetensors");
  const std::map<std::string, std::string> o = {{"--steps", "3"}, {"--clip", "0"}, {"--tie-embeddings", ""}};
  auto with = [&](const std::string& save) {
    auto options = o;
    options["--save"] = save;
    return train_args(options);
  };
  ASSERT_EQ(run(with(plain)).code, 0);
  Result rf = run(with(fused) + " --fuse-optimizer");
  ASSERT_EQ(rf.code, 0) << rf.output;
  std::ifstream fa(plain, std::ios::binary), fb(fused, std::ios::binary);
  const std::string wa((std::istreambuf_iterator<char>(fa)), std::istreambuf_iterator<char>());
  const std::string wb((std::istreambuf_iterator<char>(fb)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "the fused run saved other weights";
  // the flag with an untied file disagrees with it
  expect_usage_error(train_args({{"--tie-embeddings", ""}}) + " --load " + path("w.safetensors"),
                     {"--tie-embeddings disagrees with the model of", "lm_head.weight"});
}
