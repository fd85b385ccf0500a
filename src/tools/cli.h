// The `remat` command line's subcommands as CLI11 sees them: each registers itself and its options
// on the top-level app (train_cli.cpp, sample_cli.cpp, plan_cli.cpp) and returns what runs when it
// is the one chosen; main.cpp parses, picks and reports errors.
//
//   CLI::App app{"remat: ..."};
//   const Subcommand train = add_train(app);
//   app.parse(argc, argv);
//   if (*train.app) return train.run();  // converts its numeric options, then runs
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "commands.h"
#include "numbers.h"

namespace remat::tools {

// One registered subcommand: its CLI11 app (true once parsed as the chosen one) and its run, which
// converts the numeric options (a bad value is a UsageError) and then runs the command.
struct Subcommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Subcommand add_train(CLI::App& app);
Subcommand add_sample(CLI::App& app);
Subcommand add_plan(CLI::App& app);

// The numeric options of one subcommand: registered as text, converted after parsing (numbers.h).
// Holds the conversions, which refer to it and to the targets: it must not move once an option is
// added, and must outlive the parse.
class Numbers {
 public:
  explicit Numbers(CLI::App* app) : app_(app) {}
  Numbers(const Numbers&) = delete;
  Numbers& operator=(const Numbers&) = delete;

  // An integer option in [min, max]; `given`, when not null, is set if the option was passed.
  template <class T>
  void add(const std::string& name, T& target, T min, T max, const std::string& help, bool* given = nullptr) {
    auto text = std::make_shared<std::string>(std::to_string(target));
    CLI::Option* option = app_->add_option(name, *text, detail(help, min, max))->capture_default_str();
    option->type_name(std::is_same_v<T, uint64_t> ? "UINT" : "INT");
    converters_.push_back([this, text, option, name, min, max, given, &target] {
      if (option->count() == 0) return;
      if (given) *given = true;
      const std::string what = app_->get_name() + " " + name;
      if constexpr (std::is_same_v<T, uint64_t>) {
        target = parse_uint64(what, *text);
      } else {
        target = static_cast<T>(parse_int(what, *text, static_cast<int64_t>(min), static_cast<int64_t>(max)));
      }
    });
  }

  // A real option: any finite number (the command checks its range).
  void add_real(const std::string& name, double& target, const std::string& help);

  // Parses the values; a bad one is a usage error.
  void convert() const;

 private:
  template <class T>
  static std::string detail(const std::string& help, T min, T max) {
    if constexpr (std::is_same_v<T, uint64_t>) return help;
    if (max == std::numeric_limits<T>::max()) return help + " (>= " + std::to_string(min) + ")";
    return help + " [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  }

  CLI::App* app_;
  std::vector<std::function<void()>> converters_;
};

// A subcommand's options and the conversions of its numeric ones, shared by its registration and
// its run (which holds it alive).
template <class Options>
struct Parsed {
  explicit Parsed(CLI::App* app) : numbers(app) {}
  Options options;
  Numbers numbers;
};

inline constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

// The model options shared by train and plan.
void add_model_options(Numbers& n, TrainOptions& o);
// After convert(): o.architecture_given from the flags that were passed.
void note_architecture(TrainOptions& o);

}  // namespace remat::tools
