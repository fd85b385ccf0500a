#include "runner.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "matrix.h"
#include "run.h"

namespace remat::program_fuzz {

uint64_t Tally::count(VerdictKind kind) const {
  uint64_t n = 0;
  for (const auto& [policy, counts] : by_policy) n += counts[static_cast<int>(kind)];
  return n;
}

uint64_t Tally::failed() const {
  return count(VerdictKind::wrong) + count(VerdictKind::missing_error) + count(VerdictKind::extra_error) +
         count(VerdictKind::crash) + count(VerdictKind::budget);
}

namespace {

void add(Tally& t, const FuzzOptions& o, uint64_t seed, const std::string& policy, const Verdict& v) {
  auto& counts = t.by_policy[policy];
  ++counts[static_cast<int>(v.kind)];
  ++t.pairs;
  if (v.kind == VerdictKind::refused) ++t.refusals_by_rule[v.rule];
  if (v.kind == VerdictKind::ok || v.kind == VerdictKind::refused) return;
  Failure f{seed, policy, v};
  if (o.on_failure) o.on_failure(f);
  t.failures.push_back(std::move(f));
}

// Runs one program under every policy; `start` and `pair` stream what happens.
void run_seed(uint64_t seed, const std::vector<std::string>& policies,
              const std::function<void(const std::string&)>& start,
              const std::function<void(const std::string&, const Verdict&)>& pair) {
  Source source = Source::from_seed(seed);
  const Program program = generate(source, seed);
  MatrixOptions o;
  o.policies = policies;
  o.on_start = start;
  o.on_pair = [&](const PairResult& p) { pair(p.policy, p.verdict); };
  const MatrixResult m = run_program_matrix(program, o);
  const auto& e = m.save_all.error;
  if (e && (e->type != "remat::Error" || e->message.find("internal error") != std::string::npos))
    pair("save-all", Verdict{VerdictKind::crash, "", "step " + std::to_string(e->step) + " " + e->phase + ": " + e->message});
}

std::string escape(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\t' || c == '\r') c = ' ';
  return s;
}

void write_line(int fd, const std::string& line) {
  const std::string text = line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) _exit(3);
    done += static_cast<size_t>(n);
  }
}

[[noreturn]] void child(uint64_t first, uint64_t last, const std::vector<std::string>& policies, int timeout, int fd) {
  for (uint64_t seed = first; seed <= last; ++seed) {
    alarm(static_cast<unsigned>(timeout));
    write_line(fd, "BEGIN\t" + std::to_string(seed));
    run_seed(
        seed, policies, [&](const std::string& name) { write_line(fd, "RUN\t" + name); },
        [&](const std::string& name, const Verdict& v) {
          write_line(fd, "PAIR\t" + name + "\t" + std::to_string(static_cast<int>(v.kind)) + "\t" + escape(v.rule) +
                             "\t" + escape(v.detail));
        });
    write_line(fd, "END\t" + std::to_string(seed));
  }
  write_line(fd, "DONE");
  _exit(0);
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(line);
  while (std::getline(in, part, '\t')) parts.push_back(part);
  return parts;
}

void fuzz_forked(const FuzzOptions& o, const std::vector<std::string>& policies, Tally& t) {
  // Made here, so that every child uses this one and this process removes it at exit (children
  // leave by _exit).
  scratch_directory();
  uint64_t next = o.first_seed;
  while (next <= o.last_seed) {
    int fds[2];
    if (pipe(fds) != 0) throw Error("program_fuzz: pipe failed");
    const pid_t pid = fork();
    if (pid < 0) throw Error("program_fuzz: fork failed");
    if (pid == 0) {
      close(fds[0]);
      child(next, o.last_seed, policies, o.timeout_seconds, fds[1]);
    }
    close(fds[1]);
    FILE* in = fdopen(fds[0], "r");
    char* buffer = nullptr;
    size_t capacity = 0;
    bool done = false, in_seed = false;
    uint64_t seed = next;
    std::string running = "save-all";
    while (getline(&buffer, &capacity, in) > 0) {
      std::string line(buffer);
      if (!line.empty() && line.back() == '\n') line.pop_back();
      const std::vector<std::string> f = split_tabs(line);
      if (f.empty()) continue;
      if (f[0] == "BEGIN") seed = std::stoull(f[1]), in_seed = true, ++t.programs, running = "save-all";
      else if (f[0] == "RUN") running = f[1];
      else if (f[0] == "PAIR" && f.size() >= 3)
        add(t, o, seed, f[1], Verdict{static_cast<VerdictKind>(std::stoi(f[2])), f.size() > 3 ? f[3] : "", f.size() > 4 ? f[4] : ""});
      else if (f[0] == "END") next = seed + 1, in_seed = false;
      else if (f[0] == "DONE") done = true;
    }
    free(buffer);
    fclose(in);
    int status = 0;
    waitpid(pid, &status, 0);
    if (done) break;
    std::string how = WIFSIGNALED(status) ? std::string("signal ") + strsignal(WTERMSIG(status))
                                          : "exit status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) how = "timeout (" + std::to_string(o.timeout_seconds) + " s)";
    if (!in_seed) seed = next, ++t.programs;
    add(t, o, seed, running, Verdict{VerdictKind::crash, "", "the child process died: " + how});
    next = seed + 1;
  }
}

}  // namespace

Tally fuzz(const FuzzOptions& o) {
  Tally t;
  const std::vector<std::string> policies = o.policies.empty() ? policy_names() : o.policies;
  const auto start = std::chrono::steady_clock::now();
  if (o.fork) {
    fuzz_forked(o, policies, t);
  } else {
    for (uint64_t seed = o.first_seed; seed <= o.last_seed; ++seed) {
      ++t.programs;
      run_seed(seed, policies, {}, [&](const std::string& name, const Verdict& v) { add(t, o, seed, name, v); });
    }
  }
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return t;
}

std::string cause_of(const Failure& f) { return cause_of(f.verdict); }

std::string summary_table(const Tally& t) {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-46s", "policy");
  out << line;
  for (int k = 0; k < kVerdictCount; ++k) {
    std::snprintf(line, sizeof line, " %13s", verdict_name(static_cast<VerdictKind>(k)));
    out << line;
  }
  out << "\n";
  std::array<uint64_t, kVerdictCount> total{};
  for (const auto& [policy, counts] : t.by_policy) {
    std::snprintf(line, sizeof line, "%-46.46s", policy.c_str());
    out << line;
    for (int k = 0; k < kVerdictCount; ++k) {
      std::snprintf(line, sizeof line, " %13llu", static_cast<unsigned long long>(counts[k]));
      out << line;
      total[k] += counts[k];
    }
    out << "\n";
  }
  std::snprintf(line, sizeof line, "%-46s", "total");
  out << line;
  for (int k = 0; k < kVerdictCount; ++k) {
    std::snprintf(line, sizeof line, " %13llu", static_cast<unsigned long long>(total[k]));
    out << line;
  }
  out << "\n" << t.programs << " programs, " << t.pairs << " program-policy pairs in " << t.seconds << " s\n";
  out << "refusals by rule:";
  if (t.refusals_by_rule.empty()) out << " none";
  for (const auto& [rule, n] : t.refusals_by_rule) out << "\n  " << rule << ": " << n;
  out << "\n";
  return out.str();
}

}  // namespace remat::program_fuzz
