// The numeric options and the model options the subcommands share (cli.h).
#include "cli.h"

#include "usage.h"
#include "remat/error.h"

namespace remat::tools {

void Numbers::add_real(const std::string& name, double& target, const std::string& help) {
  auto text = std::make_shared<std::string>(CLI::detail::to_string(target));
  CLI::Option* option = app_->add_option(name, *text, help)->capture_default_str();
  option->type_name("REAL");
  converters_.push_back([this, text, option, name, &target] {
    if (option->count() > 0) target = parse_real(app_->get_name() + " " + name, *text);
  });
}

void Numbers::convert() const {
  try {
    for (const auto& c : converters_) c();
  } catch (const UsageError&) {
    throw;
  } catch (const remat::Error& e) {
    throw UsageError(e.what());
  }
}

void add_model_options(Numbers& n, TrainOptions& o) {
  n.add<int64_t>("--layers", o.layers, 0, kMaxInt, "transformer blocks", &o.layers_given);
  n.add<int64_t>("--width", o.width, 1, kMaxInt, "embedding width", &o.width_given);
  n.add<int64_t>("--heads", o.heads, 1, kMaxInt, "attention heads (a divisor of --width)", &o.heads_given);
  n.add<int64_t>("--seq", o.seq, 2, kMaxInt, "sequence length", &o.seq_given);
  n.add<int64_t>("--batch", o.batch, 1, kMaxInt, "sequences per step");
  n.add<uint64_t>("--seed", o.seed, 0, std::numeric_limits<uint64_t>::max(), "seed for initialisation, batches and dropout");
  n.add_real("--dropout", o.dropout, "dropout probability, in [0, 1)");
  n.add<int>("--threads", o.threads, 0, kMaxThreads, "CPU threads (0: all cores)");
}

void note_architecture(TrainOptions& o) {
  o.architecture_given = o.layers_given || o.width_given || o.heads_given || o.seq_given;
}

}  // namespace remat::tools
