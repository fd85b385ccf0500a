// docs/cli.md's option tables against the built `remat SUBCOMMAND --help`, which the page calls
// authoritative: the same options, the same required ones, the same defaults and the same text, so
// that the page cannot drift from the program. An option added to a subcommand needs its row.
#include <map>
#include <regex>
#include <sstream>

#include "cli_harness.h"

namespace {

struct Row {
  std::string default_value;  // "" when none is shown
  bool required = false;
  std::string meaning;
};
using Table = std::map<std::string, Row>;  // by option name, "--data"

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(' '), b = s.find_last_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::string unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '`' && s.back() == '`') s = s.substr(1, s.size() - 2);
  return s;
}

// The cells of a Markdown table row; "\|" is a '|' inside a cell.
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  for (size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (line[i] == '|') {
      out.push_back(trim(cell));
      cell.clear();
    } else {
      cell += line[i];
    }
  }
  return out;
}

// The option table under "## `remat SUBCOMMAND`" in docs/cli.md.
Table doc_table(const std::string& subcommand) {
  std::ifstream in(std::string(REMAT_SOURCE_DIR) + "/docs/cli.md");
  EXPECT_TRUE(in) << "cannot read docs/cli.md";
  const std::string heading = "## `remat " + subcommand + "`";
  Table table;
  bool in_section = false, in_table = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) {
      if (in_section) break;
      in_section = line == heading;
      continue;
    }
    if (!in_section) continue;
    if (line.rfind("|", 0) != 0) {
      if (in_table) break;  // the first table of the section only
      continue;
    }
    in_table = true;
    const std::vector<std::string> c = cells(line);
    if (c.size() != 3 || c[0] == "option" || c[0].rfind("---", 0) == 0) continue;
    Row row;
    row.required = c[1] == "required";
    row.default_value = row.required ? "" : unquote(c[1]);
    row.meaning = c[2];
    EXPECT_TRUE(table.emplace(unquote(c[0]), row).second) << subcommand << ": " << c[0] << " has two rows";
  }
  EXPECT_FALSE(table.empty()) << "docs/cli.md has no option table under " << heading;
  return table;
}

// The options of `remat SUBCOMMAND --help` (CLI11's layout: "  --name TYPE=default REQUIRED", or
// "TYPE [default]" in later CLI11 versions, then the description from a fixed column, on the same
// line or, after a long head, on the next).
Table help_table(const std::string& subcommand) {
  const Result r = run(subcommand + " --help");
  EXPECT_EQ(r.code, 0) << r.output;
  const std::regex head(R"(^  (--[a-z0-9-]+)(?: [A-Z]+(?:=(\S*)| \[([^\]]*)\])?)?( REQUIRED)?(?:  +(.*))?$)");
  Table table;
  std::string current;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (line.rfind("  -h,--help", 0) == 0) {
      current.clear();
      continue;
    }
    if (std::regex_match(line, m, head)) {
      current = m[1];
      Row row;
      row.default_value = m[2].matched ? m[2].str() : m[3].str();
      row.required = m[4].matched;
      row.meaning = m[5];
      EXPECT_TRUE(table.emplace(current, row).second) << subcommand << " --help lists " << current << " twice";
    } else if (!current.empty() && line.rfind("      ", 0) == 0) {  // the description, continued
      std::string& meaning = table[current].meaning;
      meaning += (meaning.empty() ? "" : " ") + trim(line);
    } else {
      current.clear();
    }
  }
  EXPECT_FALSE(table.empty()) << r.output;
  return table;
}

void expect_same_tables(const std::string& subcommand) {
  SCOPED_TRACE("remat " + subcommand);
  const Table docs = doc_table(subcommand), help = help_table(subcommand);
  for (const auto& [name, row] : help) {
    const auto d = docs.find(name);
    if (d == docs.end()) {
      ADD_FAILURE() << "docs/cli.md's table of `remat " << subcommand << "` has no row for " << name
                    << " (--help: \"" << row.meaning << "\")";
      continue;
    }
    EXPECT_EQ(d->second.required, row.required)
        << name << ": --help says " << (row.required ? "" : "not ") << "required, docs/cli.md the opposite";
    EXPECT_EQ(d->second.default_value, row.default_value) << name << ": the default";
    EXPECT_EQ(d->second.meaning, row.meaning) << name << ": the meaning";
  }
  for (const auto& [name, row] : docs)
    EXPECT_TRUE(help.count(name)) << "docs/cli.md lists " << name << ", which `remat " << subcommand
                                  << " --help` does not have";
}

}  // namespace

TEST(CliDocs, TrainTableIsTheHelp) { expect_same_tables("train"); }
TEST(CliDocs, SampleTableIsTheHelp) { expect_same_tables("sample"); }
TEST(CliDocs, PlanTableIsTheHelp) { expect_same_tables("plan"); }
