// remat_candidates: the CUDA candidate harness. Runs every candidate kernel of candidates/cuda/
// beside the library's kernel for its row on one GPU: checks each (candidates/harness.h) and times
// the timed cases, prints a markdown table, and writes one JSON line per case.
//
//   build/candidates/remat_candidates [--device cuda:0] [--only NAME,NAME] [--repeats 10] [--warmup 2]
//                                     [--json FILE] [--list]
//
// The device is used with the backend option sixteen_bit (the 16-bit candidates' cases need bf16
// tensors there) and no other option: the library's side is its default path. Exit code 0 when
// every case ran (passed, failed or not applicable: a failed candidate is a finding, not an error
// of the harness), 1 on an error of the harness or of a case, 2 on bad arguments.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "candidates/cuda_candidates.h"
#include "remat/devices.h"

using namespace remat;

namespace {

struct Options {
  std::string device = "cuda:0", json;
  std::vector<std::string> only;
  int repeats = 10, warmup = 2;
  bool list = false;
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    if (comma > at) out.push_back(text.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: remat_candidates [--device cuda:N] [--only NAME,...] [--repeats N] [--warmup N] [--json FILE] "
               "[--list]\n");
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--device") o.device = value();
    else if (a == "--only") o.only = split(value());
    else if (a == "--repeats") o.repeats = std::stoi(value());
    else if (a == "--warmup") o.warmup = std::stoi(value());
    else if (a == "--json") o.json = value();
    else if (a == "--list") o.list = true;
    else usage();
  }
  if (o.repeats < 1 || o.warmup < 0) usage();
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    const Device device = parse_device(o.device);
    use_device(device, parse_backend_options("sixteen_bit"));
    std::printf("remat_candidates: %s; %s\n\n", describe_device(device).c_str(),
                describe_backend_options(device).text.c_str());
    const std::vector<candidates::Candidate> all = candidates::cuda_candidates(device);
    if (o.list) {
      for (const candidates::Candidate& c : all) std::printf("%s\t%s\t%s\n", c.name.c_str(), c.replaces.c_str(), c.what.c_str());
      return 0;
    }
    const std::vector<candidates::Outcome> outcomes =
        candidates::run(all, {.device = device, .warmup = o.warmup, .repeats = o.repeats, .only = o.only});
    std::printf("%s", candidates::markdown(all, outcomes).c_str());
    if (!o.json.empty()) {
      std::ofstream out(o.json);
      out << candidates::json_lines(outcomes);
      REMAT_CHECK(out.good(), "remat_candidates: cannot write ", o.json);
    }
    for (const candidates::Outcome& x : outcomes)
      if (x.status == candidates::Status::error) return 1;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "remat_candidates: error: %s\n", e.what());
    return 1;
  }
}
