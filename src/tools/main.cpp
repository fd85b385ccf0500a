// The `remat` command line.
//   remat train [--data PATH] [--device cpu|cuda[:N]] [--layers N] ... [--policy P] [--json]
//   remat sample --load FILE [--device D] [--prompt TEXT] [--tokens N]
//   remat plan [--budget BYTES] [model options | --costs FILE] [--json]
//   remat --version
// Numeric options are read as text and parsed strictly (numbers.h) with a range each. Exit codes:
// 0 success, 2 a usage error (unknown option or subcommand, with the closest valid one suggested;
// a value that does not parse or is out of range; options that cannot be combined), 1 an error
// while running (a weight file, the corpus, divergence, a --device this build or machine cannot
// use). Errors print "remat: error: ..." on
// stderr; with --json, also a JSON object {"error": ..., "exit_code": ...} on stdout.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "commands.h"
#include "device_option.h"
#include "remat/error.h"
#include "usage.h"

namespace {

using namespace remat::tools;

// The long option names of `app` (and of the top level's --help, --version).
std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : app.get_options())
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  return names;
}

// " (did you mean ...?)" for the first unknown subcommand or option of argv, or "".
std::string suggestion(const CLI::App& app, int argc, char** argv) {
  if (argc < 2) return "";
  std::vector<std::string> subcommands;
  for (const CLI::App* sub : app.get_subcommands({}))
    if (!sub->get_name().empty()) subcommands.push_back(sub->get_name());
  const std::string first = argv[1];
  const CLI::App* sub = nullptr;
  for (const CLI::App* candidate : app.get_subcommands({}))
    if (candidate->get_name() == first) sub = candidate;
  if (sub == nullptr) {
    if (first.rfind("-", 0) == 0) return "";
    std::string match = closest_match(first, subcommands);
    return match.empty() ? "" : " (did you mean `remat " + match + "`?)";
  }
  const std::vector<std::string> known = option_names(*sub);
  for (int i = 2; i < argc; ++i) {
    std::string word = argv[i];
    if (word.rfind("--", 0) != 0 || word.size() == 2) continue;
    word = word.substr(0, word.find('='));
    if (std::find(known.begin(), known.end(), word) != known.end()) continue;
    std::string match = closest_match(word, known);
    if (!match.empty()) return " (did you mean " + match + "?)";
    return "";
  }
  return "";
}

bool wants_json(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0) return true;
  return false;
}

// Prints the error (and, with --json, a JSON object on stdout); returns the exit code.
int report_error(const std::string& message, int code, bool json) {
  std::fprintf(stderr, "remat: error: %s\n", message.c_str());
  if (json) {
    nlohmann::json j = {{"error", message}, {"exit_code", code}, {"version", REMAT_VERSION}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    std::fflush(stdout);
  }
  return code;
}

// Runs the chosen subcommand; an error is reported (and, with --json, written as JSON) with its exit code.
int run_chosen(const std::vector<Subcommand>& subcommands, bool json) {
  try {
    for (const Subcommand& s : subcommands)
      if (*s.app) return s.run();
  } catch (const remat::tools::UsageError& e) {
    return report_error(e.what(), kExitUsageError, json);
  } catch (const remat::Error& e) {
    return report_error(e.what(), kExitRuntimeError, json);
  } catch (const std::bad_alloc&) {
    return report_error("out of memory", kExitRuntimeError, json);
  } catch (const std::exception& e) {
    return report_error(e.what(), kExitRuntimeError, json);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"remat: train differentiable tensor programs when memory is the limit (recomputation by default)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::function<std::string()>(version_text),
                       "print the version, the backends compiled in and the devices found");
  const std::vector<Subcommand> subcommands = {add_train(app), add_sample(app), add_plan(app)};

  const bool json = wants_json(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::string where = app.get_subcommands().empty() ? "remat" : "remat " + app.get_subcommands()[0]->get_name();
    return report_error(std::string(e.what()) + suggestion(app, argc, argv) + "; see `" + where + " --help`",
                        kExitUsageError, json);
  }
  return run_chosen(subcommands, json);
}
