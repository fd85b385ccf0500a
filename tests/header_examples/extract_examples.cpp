// Builds the header-example tests: every code example in a public header's comments is compiled
// and run, so an example that no longer compiles, or does something other than it says, fails.
//
// An example block is a run of consecutive comment lines indented by at least three spaces after
// the "//" in a header under include/remat/:
//
//   //   Tensor x = randn({4, 3});          <- the block's first line, after "//   "
//   //   Tensor y = tanh(x);
//
// A harness (tests/header_examples/*.cpp) gives an example the surrounding it needs, written out
// in the harness (declarations, inputs, checks of what the example says it does), and pulls the
// block in with a line
//
//   REMAT_EXAMPLE(include/remat/tensor.h: Tensor x = randn)
//
// naming the header and the start of the block's first line (the text up to the closing ")" that
// ends the line). Each such line is replaced by the block itself, the "//   " removed, under #line
// directives, so the compiler reports an error in an example at its line in the header.
//
//   extract_examples generate SOURCE_DIR OUT_DIR HARNESS...
//       writes OUT_DIR/NAME for each harness NAME; a marker that names no block, or more than one,
//       becomes an #error saying so, so that the example test does not build.
//   extract_examples check SOURCE_DIR HARNESS...
//       fails (exit 1) unless every block of every public header is used by a harness or listed in
//       tests/header_examples/not_code.txt (tables, formulas and lists that are not C++), and
//       every marker and every line of that list names exactly one block.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Block {
  std::string header;  // relative to the source directory: include/remat/...
  int first_line = 0;  // 1-based line in the header
  std::vector<std::string> lines;  // without the leading "//   "
  int uses = 0;
};

// A reference to a block: "include/remat/x.h: start of the first line".
struct Reference {
  std::string header, prefix;
};

const std::string kIndent = "//   ";

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<Block> header_blocks(const fs::path& source) {
  std::vector<fs::path> headers;
  for (const auto& entry : fs::recursive_directory_iterator(source / "include" / "remat"))
    if (entry.is_regular_file() && entry.path().extension() == ".h") headers.push_back(entry.path());
  std::sort(headers.begin(), headers.end());
  std::vector<Block> blocks;
  for (const fs::path& header : headers) {
    const std::vector<std::string> lines = read_lines(header);
    const std::string name = fs::relative(header, source).generic_string();
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].rfind(kIndent, 0) != 0) continue;
      Block block{name, static_cast<int>(i + 1), {}, 0};
      for (; i < lines.size() && lines[i].rfind(kIndent, 0) == 0; ++i) block.lines.push_back(lines[i].substr(kIndent.size()));
      blocks.push_back(block);
    }
  }
  return blocks;
}

// "include/remat/x.h: prefix" (the form of markers and of not_code.txt).
bool parse_reference(const std::string& text, Reference& ref) {
  const size_t colon = text.find(": ");
  if (colon == std::string::npos) return false;
  ref.header = trim(text.substr(0, colon));
  ref.prefix = trim(text.substr(colon + 2));
  return !ref.header.empty() && !ref.prefix.empty();
}

// The blocks a reference names; a prefix matches the block's first line with its indentation
// beyond the three spaces removed.
std::vector<Block*> matches(std::vector<Block>& blocks, const Reference& ref) {
  std::vector<Block*> found;
  for (Block& b : blocks)
    if (b.header == ref.header && trim(b.lines.front()).rfind(ref.prefix, 0) == 0) found.push_back(&b);
  return found;
}

std::string describe(const Reference& ref) { return ref.header + ": " + ref.prefix; }

// The marker of a harness line, if it is one.
bool marker_of(const std::string& line, Reference& ref) {
  const std::string t = trim(line);
  const std::string open = "REMAT_EXAMPLE(";
  if (t.rfind(open, 0) != 0) return false;
  std::string inside = t.substr(open.size());
  if (!inside.empty() && inside.back() == ')') inside.pop_back();
  return parse_reference(inside, ref);
}

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return q + "\"";
}

// The harness with its markers replaced; returns false (and writes #error lines) on a bad marker.
bool expand(const fs::path& harness, const fs::path& source, std::vector<Block>& blocks, std::ostream& out) {
  const std::vector<std::string> lines = read_lines(harness);
  const std::string harness_name = quoted(fs::absolute(harness).generic_string());
  bool ok = true;
  out << "// Generated by extract_examples from " << harness.filename().string() << "; do not edit.\n";
  out << "#line 1 " << harness_name << "\n";
  for (size_t i = 0; i < lines.size(); ++i) {
    Reference ref;
    if (!marker_of(lines[i], ref)) {
      if (trim(lines[i]).rfind("REMAT_EXAMPLE", 0) == 0) {
        out << "#error " << quoted("malformed marker (REMAT_EXAMPLE(include/remat/x.h: first line)): " + lines[i]) << "\n";
        ok = false;
      } else {
        out << lines[i] << "\n";
      }
      continue;
    }
    const std::vector<Block*> found = matches(blocks, ref);
    if (found.size() != 1) {
      out << "#error " << quoted(std::to_string(found.size()) + " example blocks match " + describe(ref) +
                                 " (exactly one must): was the example changed or moved?")
          << "\n";
      ok = false;
      continue;
    }
    const Block& b = *found.front();
    out << "#line " << b.first_line << " " << quoted((source / b.header).generic_string()) << "\n";
    for (const std::string& l : b.lines) out << l << "\n";
    out << "#line " << i + 2 << " " << harness_name << "\n";
  }
  return ok;
}

int generate(const fs::path& source, const fs::path& out_dir, const std::vector<fs::path>& harnesses) {
  std::vector<Block> blocks = header_blocks(source);
  fs::create_directories(out_dir);
  int status = 0;
  for (const fs::path& h : harnesses) {
    std::ostringstream text;
    if (!expand(h, source, blocks, text)) {
      std::cerr << h.string() << ": a marker names no single example block (see the #error in the generated file)\n";
    }
    const fs::path target = out_dir / h.filename();
    // rewrite only on change, so that an unchanged example is not recompiled
    std::ifstream old(target);
    std::stringstream before;
    before << old.rdbuf();
    if (!old || before.str() != text.str()) {
      std::ofstream(target) << text.str();
      if (!fs::exists(target)) status = 1;
    }
  }
  return status;
}

int check(const fs::path& source, const std::vector<fs::path>& harnesses) {
  std::vector<Block> blocks = header_blocks(source);
  int problems = 0;
  auto use = [&](const Reference& ref, const std::string& where) {
    const std::vector<Block*> found = matches(blocks, ref);
    if (found.size() == 1) {
      ++found.front()->uses;
      return;
    }
    ++problems;
    std::cerr << where << ": " << found.size() << " example blocks match '" << describe(ref)
              << "' (exactly one must)\n";
  };
  for (const fs::path& h : harnesses) {
    const std::vector<std::string> lines = read_lines(h);
    for (size_t i = 0; i < lines.size(); ++i) {
      Reference ref;
      if (marker_of(lines[i], ref)) use(ref, h.string() + ":" + std::to_string(i + 1));
    }
  }
  const fs::path not_code = source / "tests" / "header_examples" / "not_code.txt";
  const std::vector<std::string> listed = read_lines(not_code);
  for (size_t i = 0; i < listed.size(); ++i) {
    const std::string line = trim(listed[i]);
    if (line.empty() || line[0] == '#') continue;
    Reference ref;
    const std::string where = not_code.string() + ":" + std::to_string(i + 1);
    if (!parse_reference(line, ref)) {
      ++problems;
      std::cerr << where << ": expected 'include/remat/x.h: start of the first line', got '" << line << "'\n";
      continue;
    }
    use(ref, where);
  }
  for (const Block& b : blocks) {
    if (b.uses > 0) continue;
    ++problems;
    std::cerr << (source / b.header).string() << ":" << b.first_line
              << ": this example block is compiled by no test. Add it to a harness in tests/header_examples/ "
                 "(a line REMAT_EXAMPLE("
              << b.header << ": " << trim(b.lines.front()).substr(0, 40)
              << ")), or, if it is not C++ (a table, a formula, a list), to tests/header_examples/not_code.txt\n";
  }
  std::cout << blocks.size() << " indented blocks in the public headers, " << problems << " problem(s)\n";
  return problems == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "generate" && argc >= 4) return generate(argv[2], argv[3], {argv + 4, argv + argc});
    if (mode == "check" && argc >= 3) return check(argv[2], {argv + 3, argv + argc});
    std::cerr << "usage: extract_examples generate SOURCE_DIR OUT_DIR HARNESS... | check SOURCE_DIR HARNESS...\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "extract_examples: " << e.what() << "\n";
    return 1;
  }
}
