// remat_program_fuzz: the program fuzzer as a command.
//
//   remat_program_fuzz --seeds 0:1000                      every policy of the acceptance list
//   remat_program_fuzz --seeds 0:200 --policies every-k:2,budget:small --minimise 5
//   remat_program_fuzz --print 17                           the program of seed 17, as C++-like text
//   remat_program_fuzz --seed 17 --policies every-k:2 --minimise 1   shrink one failure
//
// Prints the summary table (pairs per policy and verdict, refusals by rule) and exits 1 when a
// pair is wrong, misses an error, raises an extra error, crashes or passes a budget silently.
//   --seeds A:B      programs of seeds A .. B-1 (default 0:100); --seed N is N:N+1
//   --policies LIST  comma-separated names of the acceptance list (default: all of them), or
//                    policy texts without commas ("DIR" stands for a scratch directory)
//   --no-fork        run in this process (a signal then ends the whole run)
//   --timeout S      seconds a program (all its policies) may take in a forked child (default 120)
//   --minimise N     shrink the first failure of up to N causes (runner.h, cause_of) and print them
//   --causes         print the failures grouped by cause: pairs, programs, policies
//   --log FILE       one line per failure: seed, policy, verdict, detail
//   --quiet          no line per failure on stderr
//   --census A:B     save-all only, in this process: how many programs of seeds A .. B-1 raise,
//                    and which errors (to tune the generator: most programs should run clean)
//   --explain SEED   run one program in this process and print each run: policy text, verdict,
//                    error, each step's peak of saved bytes, and the budgets the matrix chose
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <cctype>
#include <set>
#include <sstream>

#include "minimise.h"
#include "run.h"
#include "runner.h"

using namespace remat::program_fuzz;

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "remat_program_fuzz: " << why
            << "\nusage: remat_program_fuzz [--seeds A:B | --seed N] [--policies LIST] [--no-fork] [--timeout S]"
               " [--minimise N] [--log FILE] [--quiet] | --print SEED\n";
  std::exit(2);
}

uint64_t number(const std::string& s) {
  try {
    size_t used = 0;
    const unsigned long long v = std::stoull(s, &used);
    if (used != s.size()) usage("not a number: " + s);
    return v;
  } catch (const std::exception&) {
    usage("not a number: " + s);
  }
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, ',')) out.push_back(part);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  FuzzOptions o;
  o.first_seed = 0, o.last_seed = 99;
  int minimise_groups = 0;
  bool quiet = false, causes = false;
  std::string log_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--seeds") {
      const std::string v = value();
      const size_t colon = v.find(':');
      if (colon == std::string::npos) usage("--seeds takes A:B");
      o.first_seed = number(v.substr(0, colon));
      const uint64_t end = number(v.substr(colon + 1));
      if (end <= o.first_seed) usage("--seeds A:B needs A < B");
      o.last_seed = end - 1;
    } else if (a == "--seed") {
      o.first_seed = o.last_seed = number(value());
    } else if (a == "--policies") {
      o.policies = split(value());
    } else if (a == "--no-fork") {
      o.fork = false;
    } else if (a == "--timeout") {
      o.timeout_seconds = static_cast<int>(number(value()));
    } else if (a == "--minimise") {
      minimise_groups = static_cast<int>(number(value()));
    } else if (a == "--log") {
      log_path = value();
    } else if (a == "--causes") {
      causes = true;
    } else if (a == "--quiet") {
      quiet = true;
    } else if (a == "--census") {
      const std::string v = value();
      const size_t colon = v.find(':');
      if (colon == std::string::npos) usage("--census takes A:B");
      std::map<std::string, int> errors;
      int clean = 0, total = 0;
      for (uint64_t seed = number(v.substr(0, colon)); seed < number(v.substr(colon + 1)); ++seed, ++total) {
        Source source = Source::from_seed(seed);
        const MatrixResult m = run_program_matrix(generate(source, seed), std::vector<std::string>{});
        if (!m.save_all.error) {
          ++clean;
          continue;
        }
        std::string key = m.save_all.error->phase + ": " + m.save_all.error->message.substr(0, 90);
        for (char& c : key)
          if (std::isdigit(static_cast<unsigned char>(c))) c = 'N';
        ++errors[key];
      }
      std::cout << clean << " of " << total << " programs run clean under save-all\n";
      for (const auto& [e, n] : errors) std::cout << n << "  " << e << "\n";
      return 0;
    } else if (a == "--explain") {
      const uint64_t seed = number(value());
      Source source = Source::from_seed(seed);
      const Program program = generate(source, seed);
      std::cout << to_pseudo_code(program);
      MatrixOptions mo;
      if (!o.policies.empty()) mo.policies = o.policies;
      const MatrixResult m = run_program_matrix(program, mo);
      auto show = [](const std::string& name, const Record& r) {
        std::cout << name << ": " << r.obs.size() << " observations";
        if (r.error) std::cout << ", raised at step " << r.error->step << " " << r.error->phase << ": " << r.error->message;
        std::cout << "\n  peaks:";
        for (const StepMemory& s : r.steps)
          std::cout << " " << s.peak_saved << (s.profiling ? "p" : "") << (s.warned ? "w" : "")
                    << (s.planned_budget ? "/" + std::to_string(s.planned_budget) : "");
        if (r.smallest_budget) std::cout << "; feasible " << r.smallest_budget << " .. " << r.planned_save_all_peak;
        for (const std::string& w : r.warnings) std::cout << "\n  warning: " << w;
        std::cout << "\n";
      };
      show("save-all", m.save_all);
      std::cout << "sizes: small " << m.sizes.small << ", medium " << m.sizes.medium << ", large " << m.sizes.large
                << ", dynamic " << m.sizes.dynamic << "\n";
      for (const PairResult& p : m.pairs) {
        show(p.text, p.record);
        std::cout << "  => " << describe(p) << "\n";
      }
      return 0;
    } else if (a == "--print") {
      Source source = Source::from_seed(number(value()));
      std::cout << to_pseudo_code(generate(source, number(argv[i])));
      return 0;
    } else {
      usage("unknown argument " + a);
    }
  }
  std::ofstream log;
  if (!log_path.empty()) log.open(log_path);
  o.on_failure = [&](const Failure& f) {
    const std::string line = std::to_string(f.seed) + "\t" + f.policy + "\t" + verdict_name(f.verdict.kind) + "\t" +
                             f.verdict.detail;
    if (!quiet) std::cerr << line << "\n";
    if (log) log << line << "\n" << std::flush;
  };
  const Tally t = fuzz(o);
  std::cout << summary_table(t);
  // Group by cause: pairs, programs, policies, the first seed.
  struct Group {
    uint64_t pairs = 0;
    std::set<uint64_t> seeds;
    std::set<std::string> policies;
    const Failure* first = nullptr;
  };
  std::map<std::string, Group> groups;
  for (const Failure& f : t.failures) {
    Group& g = groups[cause_of(f)];
    ++g.pairs;
    g.seeds.insert(f.seed);
    g.policies.insert(f.policy);
    if (!g.first) g.first = &f;
  }
  if (causes) {
    std::cout << "\nfailures by cause (pairs, programs, first seed, policies):\n";
    for (const auto& [cause, g] : groups) {
      std::cout << g.pairs << "\t" << g.seeds.size() << "\t" << g.first->seed << "\t" << cause << "\t";
      for (const std::string& p : g.policies) std::cout << p << " ";
      std::cout << "\n";
    }
  }
  // Shrink the first failure of each cause, in this process, after all children.
  int shrunk = 0;
  for (const auto& [cause, g] : groups) {
    if (shrunk >= minimise_groups) break;
    const Failure& f = *g.first;
    if (f.verdict.detail.find("child process died") != std::string::npos) continue;  // a signal: not in this process
    ++shrunk;
    Source source = Source::from_seed(f.seed);
    const Program program = generate(source, f.seed);
    const MinimiseResult r = minimise(program, f.policy, f.verdict);
    std::cout << "\n==== " << cause << "\n==== seed " << f.seed << ", policy " << f.policy << ": "
              << verdict_name(r.verdict.kind) << " (" << r.runs << " candidates)\n"
              << r.verdict.detail << "\n"
              << to_pseudo_code(r.program);
  }
  return t.failed() == 0 ? 0 : 1;
}
