// `remat train`'s training states (train_state.h).
//
// Note [how often a state is written]. --state-every 0 (the default) writes the first state after
// the first step (which also proves early that the directory takes one), then every
// ceil(100 x w / s) steps, w the last write's time and s the median step time so far: the writes
// then cost about 1 % of the training time, whatever the model, the disk and the batch. Under
// mpirun rank 0's measurement decides for all.
#include "train_state.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "io/atomic_file.h"
#include "io/xxh64.h"
#include "numbers.h"
#include "train_signals.h"
#include "train_state_dir.h"
#include "usage.h"
#include "weights.h"

namespace remat::tools::training {

namespace {

namespace fs = std::filesystem;

// The shortest text that reads back as v.
std::string exact(double v) {
  char text[40];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, v);
    if (std::strtod(text, nullptr) == v || std::isnan(v)) break;
  }
  return text;
}
double real(const std::string& text) { return std::strtod(text.c_str(), nullptr); }
std::string bool_text(bool v) { return v ? "true" : "false"; }

// An option a state keeps: its key, its flag, how it reads from and writes into the options.
struct Kept {
  const char* key;
  const char* flag;
  std::function<std::string(const TrainOptions&)> get;
  std::function<void(TrainOptions&, const std::string&)> set;
  const char* absent = nullptr;  // the value of a state written before the option existed (else an error)
};

template <class T>
Kept integer(const char* key, const char* flag, T TrainOptions::*member) {
  return {key, flag, [member](const TrainOptions& o) { return std::to_string(o.*member); },
          [member, key](TrainOptions& o, const std::string& v) {
            o.*member = static_cast<T>(parse_int(detail::concat("the state's ", key), v, 0, kMaxSteps * 1000));
          }};
}
Kept number(const char* key, const char* flag, double TrainOptions::*member) {
  return {key, flag, [member](const TrainOptions& o) { return exact(o.*member); },
          [member](TrainOptions& o, const std::string& v) { o.*member = real(v); }};
}
Kept boolean(const char* key, const char* flag, bool TrainOptions::*member) {
  return {key, flag, [member](const TrainOptions& o) { return bool_text(o.*member); },
          [member](TrainOptions& o, const std::string& v) { o.*member = v == "true"; }};
}
Kept text(const char* key, const char* flag, std::string TrainOptions::*member) {
  return {key, flag, [member](const TrainOptions& o) { return o.*member; },
          [member](TrainOptions& o, const std::string& v) { o.*member = v; }};
}

Kept with_absent(Kept k, const char* value) {
  k.absent = value;
  return k;
}

// The options that define the run: given beside --resume they must agree with the state.
const std::vector<Kept>& defining() {
  static const std::vector<Kept> kept = {
      integer("layers", "--layers", &TrainOptions::layers), integer("width", "--width", &TrainOptions::width),
      integer("heads", "--heads", &TrainOptions::heads),    integer("seq", "--seq", &TrainOptions::seq),
      integer("batch", "--batch", &TrainOptions::batch),    integer("steps", "--steps", &TrainOptions::steps),
      number("lr", "--lr", &TrainOptions::lr),
      {"seed", "--seed", [](const TrainOptions& o) { return std::to_string(o.seed); },
       [](TrainOptions& o, const std::string& v) { o.seed = parse_uint64("the state's seed", v); }},
      number("dropout", "--dropout", &TrainOptions::dropout),
      integer("accumulate", "--accumulate", &TrainOptions::accumulate),
      text("reduce", "--reduce", &TrainOptions::reduce),
      number("clip", "--clip", &TrainOptions::clip),
      boolean("shard_optimizer", "--shard-optimizer", &TrainOptions::shard_optimizer),
      boolean("fuse_optimizer", "--fuse-optimizer", &TrainOptions::fuse_optimizer),
      boolean("allow_nonfinite", "--allow-nonfinite", &TrainOptions::allow_nonfinite),
      boolean("tie_embeddings", "--tie-embeddings", &TrainOptions::tie_embeddings),
      with_absent(text("dtype", "--dtype", &TrainOptions::dtype), "f32")};
  return kept;
}

// The options that do not change the bits: taken from the state unless given.
const std::vector<Kept>& settings() {
  static const std::vector<Kept> kept = {
      text("data", "--data", &TrainOptions::data),
      text("policy", "--policy", &TrainOptions::policy),
      text("memory_limit", "--memory-limit", &TrainOptions::memory_limit),
      text("bucket_bytes", "--bucket-bytes", &TrainOptions::bucket_bytes),
      integer("eval_every", "--eval-every", &TrainOptions::eval_every),
      integer("state_every", "--state-every", &TrainOptions::state_every),
      // the same bits need the same device and (oneDNN's GEMM) the same thread count
      text("device", "--device", &TrainOptions::device),
      integer("threads", "--threads", &TrainOptions::threads)};
  return kept;
}

const char* kSettingsKey = "settings";  // the settings, as a JSON object in the state's extra

// The state at `given`: a state itself, or the newest under a --state-dir.
std::string state_at(const std::string& given) {
  std::error_code ec;
  REMAT_USAGE_CHECK(fs::is_directory(given, ec), "train --resume ", given, ": no such directory");
  if (fs::exists(fs::path(given) / "state.json", ec)) return given;
  const std::string newest = nn::latest_training_state(given);
  REMAT_USAGE_CHECK(!newest.empty(), "train --resume ", given, ": the directory holds no training state (a --state-dir "
                    "has step-NNNNNNNN directories; one whose write did not finish is not a state)");
  return newest;
}

nlohmann::json parse_object(const std::string& text, const std::string& what) {
  REMAT_CHECK(nlohmann::json::accept(text), "train --resume: the state's ", what, " is not JSON");
  nlohmann::json j = nlohmann::json::parse(text);
  REMAT_CHECK(j.is_object() || j.is_array(), "train --resume: the state's ", what, " is not a JSON object");
  return j;
}

// A state that cannot be loaded (damaged, or another run's): the error, with the other states
// beside it, which the run can continue from instead.
[[noreturn]] void throw_naming_other_states(const Error& e, const std::string& state) {
  std::string others;
  const fs::path dir = fs::path(state).parent_path();
  std::error_code ec;
  for (fs::directory_iterator it(dir.empty() ? fs::path(".") : dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code not_a_directory;  // the lock file, say: not a state, and no reason to stop looking
    if (it->path() != fs::path(state) && fs::exists(it->path() / "state.json", not_a_directory))
      others += " " + it->path().string();
  }
  if (others.empty()) throw e;
  throw Error(detail::concat(e.what(), "; nothing was trained. Other states:", others,
                             " (pass one as --resume to continue from it)"));
}

// Note [extending a run]. `remat train --resume D --steps N` with N larger than the run's --steps
// continues a stopped or finished run up to step N. The learning rate of every step from the
// resumed one on is the schedule of an N-step run (warm-up min(100, N / 10) steps, then the cosine
// decay to 0 at step N), as a run started with --steps N has it; the steps before kept theirs.
// So the extended run is bitwise the run started with --steps N whenever the two schedules agree
// on every step before the state, that is when the state lies within the warm-up (or at its last
// step) and both runs have the same warm-up (both of at least 1000 steps, or N / 10 = S / 10): the
// test extends a run of 20 steps stopped after step 3 to 29 steps and compares with a run of 29.
// A finished run's schedule had decayed to 0; its extension starts again at the N-step
// schedule's rate at that step (what nanoGPT's users get when they raise max_iters and resume).
// The states written from then on record N as the run's length.
//
// --steps N beside --resume: the run's length. A larger N extends it (Note [extending a run]); a
// smaller one is refused (a run is ended early by stopping it).
void extend_steps(const TrainOptions& o, const nn::TrainingState& state) {
  const auto it = state.configuration.find("steps");
  REMAT_CHECK(it != state.configuration.end(), "train --resume ", o.resume_state, ": the state has no \"steps\"");
  const int64_t run = parse_int("the state's steps", it->second, 1, kMaxSteps);
  REMAT_USAGE_CHECK(o.steps >= run, "train --resume ", o.resume_state, ": --steps ", o.steps, " is below the run's ",
                    run, "; a resumed run can be extended (a larger --steps), not shortened: to end it early, stop it "
                    "(SIGINT or SIGTERM) when you want, and use that state");
}

// The global batch of a state: its ranks x its --accumulate micro-batches per step.
int64_t state_micro_batches(const nn::Metadata& c, const std::string& state) {
  auto get = [&](const char* key, const char* absent) {
    auto it = c.find(key);
    return parse_int(detail::concat("the ", key, " of the state ", state), it == c.end() ? absent : it->second, 1,
                     kMaxMicroBatches);
  };
  return get("accumulate", "1") * get("ranks", "1");
}

std::string corpus_checksum(const Loaded& l) {
  return io::xxh64_hex(io::xxh64(l.corpus.text.data(), l.corpus.text.size()));
}

}  // namespace

// ---- --resume

void apply_resume(TrainOptions& o) {
  if (o.resume.empty()) return;
  REMAT_USAGE_CHECK(o.load.empty(), "train: --resume continues from the state's weights; drop --load ", o.load);
  REMAT_USAGE_CHECK(!o.eval_only, "train: --eval-only evaluates --load weights; a state's are in ", o.resume,
                    "/step-N/model.safetensors");
  o.resume_state = state_at(o.resume);
  nn::TrainingState state;
  try {
    state = nn::read_training_state(o.resume_state);
  } catch (const Error& e) {
    throw_naming_other_states(e, o.resume_state);
  }
  const nn::Metadata& c = state.configuration;
  std::string disagree;
  for (const Kept& k : defining()) {
    auto it = c.find(k.key);
    REMAT_CHECK(it != c.end() || k.absent != nullptr, "train --resume ", o.resume_state, ": the state has no \"", k.key,
                "\" in its configuration");
    const std::string value = it != c.end() ? it->second : k.absent;
    const bool given = o.given.count(k.flag) != 0;
    // --steps may extend the run (extend_steps); --accumulate follows the number of ranks (fit_world)
    if (given && (std::string(k.key) == "steps" || std::string(k.key) == "accumulate")) continue;
    if (given && k.get(o) != value)
      disagree += detail::concat(disagree.empty() ? "" : ", ", k.flag, " ", k.get(o), " (the state's: ", value, ")");
    k.set(o, value);
  }
  if (o.given.count("--steps") != 0) extend_steps(o, state);
  REMAT_USAGE_CHECK(disagree.empty(), "train --resume ", o.resume_state, ": ", disagree, " disagree",
                    disagree.find(',') == std::string::npos ? "s" : "", " with the run in the state; a resumed run "
                    "takes its options from its state: drop them or pass the state's values");
  auto settings_text = state.extra.find(kSettingsKey);
  const nlohmann::json saved = settings_text == state.extra.end() ? nlohmann::json::object()
                                                                   : parse_object(settings_text->second, "settings");
  for (const Kept& k : settings()) {
    if (!saved.contains(k.key) || !saved[k.key].is_string()) continue;
    const std::string value = saved[k.key].get<std::string>();
    if (o.given.count(k.flag) == 0) k.set(o, value);
    else if ((std::string(k.key) == "device" || std::string(k.key) == "threads") && k.get(o) != value)
      std::fprintf(stderr, "remat train: warning: %s %s differs from the run's (%s): the resumed run's bits may differ "
                   "from those of the run never stopped\n", k.flag, k.get(o).c_str(), value.c_str());
  }
  o.layers_given = o.width_given = o.heads_given = o.seq_given = true;
  o.architecture_given = true;
  auto get = [&](const char* key) -> const std::string& {
    auto it = c.find(key);
    REMAT_CHECK(it != c.end(), "train --resume ", o.resume_state, ": the state has no \"", key, "\" in its configuration");
    return it->second;
  };
  o.vocabulary = get("vocabulary");
  o.tanh_gelu = get("gelu") == "tanh";
  if (o.state_dir.empty())  // new states go beside the one resumed
    o.state_dir = o.resume_state == o.resume ? fs::path(o.resume).parent_path().string() : o.resume;
}

int64_t resumed_run_steps(const TrainOptions& o) {
  if (o.resume_state.empty()) return o.steps;
  const nn::TrainingState state = nn::read_training_state(o.resume_state);
  const auto it = state.configuration.find("steps");
  return it == state.configuration.end() ? o.steps : parse_int("the state's steps", it->second, 1, kMaxSteps);
}

void fit_world(TrainOptions& o, DataParallel& dp) {
  if (o.resume_state.empty()) return;
  const nn::TrainingState state = nn::read_training_state(o.resume_state);
  const int64_t total = state_micro_batches(state.configuration, o.resume_state);
  const auto ranks = state.configuration.find("ranks");
  const std::string written = ranks == state.configuration.end() ? "1" : ranks->second;
  if (o.given.count("--accumulate") != 0) {
    REMAT_USAGE_CHECK(o.accumulate * dp.world == total, "train --resume ", o.resume_state, ": --accumulate ",
                      o.accumulate, " on ", dp.world, " rank(s) is a global batch of ", o.accumulate * dp.world,
                      " micro-batches, the run's is ", total, " (", written, " rank(s) x --accumulate ",
                      total / std::max<int64_t>(1, parse_int("ranks", written, 1, kMaxMicroBatches)),
                      "); drop --accumulate, or pass ", total, " / ", dp.world);
  } else {
    REMAT_USAGE_CHECK(total % dp.world == 0, "train --resume ", o.resume_state, ": the run's global batch is ", total,
                      " micro-batches per step (written by ", written, " rank(s)), which ", dp.world,
                      " ranks cannot share evenly; resume with a number of ranks that divides ", total);
    o.accumulate = total / dp.world;
  }
  dp.accumulate = o.accumulate;
}

void check_resumed_corpus(const TrainOptions& o, const Corpus& corpus, const std::string& data_path) {
  if (o.resume_state.empty()) return;
  const nn::TrainingState state = nn::read_training_state(o.resume_state);
  auto it = state.configuration.find("corpus_xxh64");
  if (it == state.configuration.end()) return;
  REMAT_USAGE_CHECK(it->second == io::xxh64_hex(io::xxh64(corpus.text.data(), corpus.text.size())),
                    "train --resume ", o.resume_state, ": the text of --data ", data_path, " is not the run's corpus (its "
                    "checksum differs from the one the state recorded); pass the --data the run was trained on");
}

nn::Metadata run_configuration(const TrainOptions& o, const DataParallel& dp, const Loaded& l) {
  nn::Metadata c;
  for (const Kept& k : defining()) c[k.key] = k.get(o);
  // the model's own values (with --load they come from the file, not the options)
  c["layers"] = std::to_string(l.config.layers);
  c["width"] = std::to_string(l.config.width);
  c["heads"] = std::to_string(l.config.heads);
  c["seq"] = std::to_string(l.config.seq);
  c["tie_embeddings"] = bool_text(l.config.tie_embeddings);
  c["gelu"] = l.config.tanh_gelu ? "tanh" : "exact";
  c["vocabulary"] = l.tokenizer.to_string();
  c["corpus_xxh64"] = corpus_checksum(l);
  c["ranks"] = std::to_string(dp.world);
  c["micro_batches"] = std::to_string(dp.micro_batches());
  return c;
}

RunMeasure restore_state(const TrainOptions& o, const DataParallel& dp, Loaded& l, Optimization& opt) {
  RunMeasure m;
  if (o.resume_state.empty()) return m;
  const nn::StateShard shard = opt.sharded ? nn::StateShard{dp.rank, dp.world} : nn::StateShard{};
  // a state is the same whatever the number of ranks that wrote it: the global batch must agree
  // (fit_world), the run's length may grow (--steps), the rest must be equal
  nn::Metadata expected = run_configuration(o, dp, l);
  for (const char* key : {"steps", "accumulate", "ranks", "micro_batches"}) expected.erase(key);
  const nn::TrainingState check = nn::read_training_state(o.resume_state);
  REMAT_CHECK(state_micro_batches(check.configuration, o.resume_state) == dp.micro_batches(), "train --resume ",
              o.resume_state, ": the state's global batch is ", state_micro_batches(check.configuration, o.resume_state),
              " micro-batches per step, this run's ", dp.micro_batches());
  nn::TrainingState s;
  try {
    s = nn::load_training_state(o.resume_state, *l.model, opt.optimizer, expected, shard);
  } catch (const Error& e) {
    throw_naming_other_states(e, o.resume_state);
  }
  auto extra = [&](const char* key) -> std::string {
    auto it = s.extra.find(key);
    return it == s.extra.end() ? std::string() : it->second;
  };
  m.start_step = s.step;
  m.first_loss = real(extra("first_loss"));
  for (const auto& v : parse_object(extra("recent_losses").empty() ? "[]" : extra("recent_losses"), "losses"))
    m.losses.push_back(v.is_string() ? real(v.get<std::string>()) : std::nan(""));
  if (!extra("last_val_loss").empty()) m.last_val_loss = real(extra("last_val_loss"));
  m.digest = extra("grad_digest");
  if (!m.digest.empty()) m.digest_step = std::stoll(extra("grad_digest_step"));
  m.digest_under_plan = extra("grad_digest_under_plan") == "true";
  if (!extra("optimizer_state_bytes").empty()) m.optimizer_state_bytes = std::stoull(extra("optimizer_state_bytes"));
  return m;
}

// ---- the states

StateKeeper::StateKeeper(const TrainOptions& o, const DataParallel& dp, Loaded& l, Optimization& opt, int64_t start)
    : o_(o),
      dp_(dp),
      l_(l),
      opt_(opt),
      configuration_(run_configuration(o, dp, l)),
      interval_(o.state_every),
      next_(start + 1),
      written_step_(o.resume_state.empty() ? -1 : start) {
  // what a run killed between a state's rename and the removal of the oldest left behind
  if (dp.rank == 0) nn::prune_training_states(o.state_dir, 2);
}

bool StateKeeper::stop_requested() const {
  const uint64_t mine = static_cast<uint64_t>(StopSignals::received());
  if (dp_.world == 1) return mine != 0;
  for (uint64_t s : distributed::all_gather(mine))
    if (s != 0) return true;
  return false;
}

int StateKeeper::after_step(int64_t done, const RunMeasure& m) {
  pause_for_test(done);
  if (o_.state_dir.empty()) return 0;
  bool stop = stop_requested();
  const bool due = interval_ > 0 ? done % interval_ == 0 : done >= next_;
  if ((stop || due) && done < o_.steps) {
    write(done, m);
    stop = stop || stop_requested();  // a signal during the write: stop on the state just written
  }
  if (!stop || done == o_.steps) return 0;  // stopped at the last step: the run ends as usual
  int sig = StopSignals::received();
  if (dp_.world > 1) {  // the first signal any rank received names the stop
    for (uint64_t s : distributed::all_gather(static_cast<uint64_t>(sig)))
      if (sig == 0 && s != 0) sig = static_cast<int>(s);
  }
  return sig;
}

void StateKeeper::finish(int64_t done, const RunMeasure& m) {
  if (!o_.state_dir.empty() && written_step_ != done) write(done, m);
}

std::string resume_command(const TrainOptions& o) {
  const std::string mpi = detail::concat("mpirun -np ", distributed::world_size(), " ");
  return detail::concat(distributed::world_size() > 1 ? mpi : "", "remat train --resume ", o.state_dir);
}

}  // namespace remat::tools::training

namespace remat::tools::training {

namespace {

// What the report of a resumed run needs of the steps before the state.
nn::Metadata run_record(const TrainOptions& o, const RunMeasure& m) {
  nlohmann::json recent = nlohmann::json::array();
  const size_t tail = std::min<size_t>(kReportedLossTail, m.losses.size());
  for (size_t i = m.losses.size() - tail; i < m.losses.size(); ++i) recent.push_back(exact(m.losses[i]));
  nlohmann::json saved = nlohmann::json::object();
  for (const Kept& k : settings()) saved[k.key] = k.get(o);
  saved["threads"] = std::to_string(num_threads());  // the count in use (0 would mean another machine's cores)
  std::error_code ec;
  if (!o.data.empty()) saved["data"] = fs::absolute(o.data, ec).string();  // a resume may run elsewhere
  nn::Metadata record = {{"first_loss", exact(m.first_loss)},
                         {"recent_losses", recent.dump()},
                         {"last_val_loss", exact(m.last_val_loss)},
                         {"optimizer_state_bytes", std::to_string(m.optimizer_state_bytes)},
                         {kSettingsKey, saved.dump()}};
  if (!m.digest.empty()) {
    record["grad_digest"] = m.digest;
    record["grad_digest_step"] = std::to_string(m.digest_step);
    record["grad_digest_under_plan"] = bool_text(m.digest_under_plan);
  }
  return record;
}

}  // namespace

void StateKeeper::write(int64_t done, const RunMeasure& m) {
  const auto t0 = Clock::now();
  const std::string path = nn::training_state_path(o_.state_dir, done);
  const nn::TrainingState state{.step = done, .rng = rng_state(), .configuration = configuration_,
                                .extra = run_record(o_, m)};
  const nn::Metadata weights = char_gpt_metadata(l_.config, l_.tokenizer);
  const bool root = dp_.rank == 0;
  std::string error;
  auto attempt = [&](bool mine, const std::function<void()>& f) {
    if (!mine) return;
    try {
      f();
    } catch (const Error& e) {
      error = e.what();
    }
  };
  // every rank learns whether any failed; a failure is an error on every rank, naming the state kept
  auto all_succeeded = [&] {
    std::vector<uint64_t> failed = {error.empty() ? 0u : 1u};
    if (dp_.world > 1) failed = distributed::all_gather(failed[0]);
    for (size_t r = 0; r < failed.size(); ++r) {
      if (failed[r] == 0) continue;
      if (root) nn::abandon_training_state(path);
      const std::string kept = nn::latest_training_state(o_.state_dir);
      throw Error(detail::concat(
          "train: writing the training state of step ", done, " to ", path, " failed",
          static_cast<int>(r) == dp_.rank ? ": " + error : detail::concat(" on rank ", r), "; ",
          kept.empty() ? "no earlier state was kept"
                       : detail::concat("the previous state, ", kept, ", is intact: free space (or make the directory "
                                        "writable) and continue with: ", resume_command(o_))));
    }
  };
  // the older kept state goes first, so that the directory needs room for two states, not three
  // (Note [a state directory that cannot trap]); then the room is checked before anything is written
  attempt(root, [&] {
    nn::prune_training_states(o_.state_dir, 1);
    check_room_for_state(o_.state_dir, last_state_bytes_ > 0 ? last_state_bytes_ : state_bytes_estimate(l_));
  });
  all_succeeded();
  if (!opt_.sharded) {
    attempt(root, [&] { nn::save_training_state(path, *l_.model, opt_.optimizer, state, weights); });
    all_succeeded();
  } else {
    const nn::StateShard shard{dp_.rank, dp_.world};
    attempt(root, [&] { nn::begin_training_state(path); });
    all_succeeded();
    attempt(true, [&] { nn::write_training_state_shard(path, *l_.model, opt_.optimizer, state, shard, weights); });
    all_succeeded();
    attempt(root, [&] { nn::commit_training_state(path, dp_.world); });
    all_succeeded();
  }
  if (root) last_state_bytes_ = directory_bytes(path);
  written_step_ = done;
  last_path_ = path;
  ++writes_;
  double seconds = seconds_since(t0), step = median(m.step_seconds);
  if (dp_.world > 1) {  // rank 0's measures decide (Note [how often a state is written])
    seconds = distributed::all_gather(seconds)[0];
    step = distributed::all_gather(step)[0];
  }
  write_seconds_ += seconds;
  last_write_seconds_ = seconds;
  if (interval_ == 0)
    next_ = done + std::max<int64_t>(1, static_cast<int64_t>(std::ceil(100.0 * seconds / std::max(step, 1e-9))));
}

}  // namespace remat::tools::training
