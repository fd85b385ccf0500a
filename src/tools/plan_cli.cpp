// `remat plan`'s options (cli.h); the command is plan.cpp.
#include "cli.h"
#include "corpus.h"

namespace remat::tools {

Subcommand add_plan(CLI::App& app) {
  auto* p = app.add_subcommand("plan", "show the budgets a model can run under (budget: and dynamic:) and, with --budget, the "
                               "schedule budget:BYTES runs, against uniform segments and every-layer");
  auto command = std::make_shared<Parsed<PlanOptions>>(p);
  PlanOptions& plan = command->options;
  p->add_option("--budget", plan.budget, "memory budget for saved bytes, e.g. 64MiB (without it: the feasible range alone)");
  p->add_option("--costs", plan.costs, "JSON file of per-stage costs instead of profiling a model");
  p->add_option("--offload", plan.offload,
                "a directory to offload kept values to: also the smallest budget of budget:BYTES+offload:DIR, and "
                "--budget planned with it (at the directory's measured bandwidth)");
  p->add_option("--data", plan.train.data,
                "text file or folder, at most " + std::to_string(kMaxCorpusMiB) + " MiB (for the vocabulary)");
  add_model_options(command->numbers, plan.train);
  p->add_flag("--plan-from-flops", plan.train.plan_from_flops,
              "budget plans price each layer call by its FLOP estimate instead of its measured time: one model plans the same on every run and machine (predicted times are then nominal)");
  p->add_flag("--json", plan.train.json, "print one JSON object");
  return {p, [command] {
            command->numbers.convert();
            note_architecture(command->options.train);
            return run_plan(command->options);
          }};
}

}  // namespace remat::tools
