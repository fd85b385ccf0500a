// libFuzzer target: the program fuzzer (tests/program_fuzz/) driven by bytes. The bytes choose a
// random model program (program.h: Source::from_bytes, two bytes a choice, zeros past the end),
// which runs under save-all and under every policy of the acceptance list; a pair that is wrong,
// misses save-all's error, raises an extra error, crashes or passes its budget silently aborts
// with the program printed as C++-like text (the input is then kept as the finding).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "program.h"
#include "run.h"

using namespace remat::program_fuzz;

namespace {

[[noreturn]] void finding(const std::string& what, const Program& program) {
  std::fprintf(stderr, "%s\n%s", what.c_str(), to_pseudo_code(program).c_str());
  std::error_code ignored;
  std::filesystem::remove_all(scratch_directory(), ignored);  // abort runs no atexit handler
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Source source = Source::from_bytes(data, size);
  const Program program = generate(source);
  const MatrixResult m = run_program_matrix(program, policy_names());
  const auto& e = m.save_all.error;
  if (e && (e->type != "remat::Error" || e->message.find("internal error") != std::string::npos))
    finding("save-all crashed: " + e->message, program);
  for (const PairResult& p : m.pairs)
    if (p.verdict.kind != VerdictKind::ok && p.verdict.kind != VerdictKind::refused) finding(describe(p), program);
  return 0;
}
