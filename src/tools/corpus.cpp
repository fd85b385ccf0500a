#include "corpus.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "numbers.h"
#include "remat/memory.h"
#include "remat/random.h"

namespace remat::tools {

namespace fs = std::filesystem;

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

std::string too_large(const fs::path& p, size_t bytes_before, size_t max_bytes) {
  return detail::concat("corpus too large: ", p.string(), bytes_before > 0 ? " and the text before it" : "",
                        " come", bytes_before > 0 ? "" : "s", " to more than ", max_bytes, " bytes (",
                        memory::format_bytes(static_cast<double>(max_bytes)), "), the most remat reads from --data");
}

// Closes the descriptor on every way out.
struct FileDescriptor {
  int fd;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// The bytes of one corpus file. Opened without blocking (a FIFO with no writer would wait forever),
// checked on the open descriptor to be a regular file that fits in the `room` left of the limit,
// and read no further than that room (a file that grows while it is read is refused too): nothing
// endless or larger than the limit is ever read. `bytes_before` is the text already read.
std::string read_corpus_file(const fs::path& p, size_t bytes_before, size_t max_bytes) {
  const FileDescriptor file{::open(p.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)};
  REMAT_CHECK(file.fd >= 0, "cannot open corpus file ", p.string(), ": ", std::strerror(errno));
  struct stat st {};
  REMAT_CHECK(::fstat(file.fd, &st) == 0, "cannot read corpus file ", p.string(), ": ", std::strerror(errno));
  REMAT_CHECK(S_ISREG(st.st_mode), "corpus file ", p.string(), " is ", file_kind(st.st_mode),
              ", not a regular file: remat reads text files or folders of them (--data)");
  const size_t room = max_bytes - std::min(bytes_before, max_bytes);
  REMAT_CHECK(static_cast<uint64_t>(st.st_size) <= room, too_large(p, bytes_before, max_bytes));
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  char more[16384];  // what a file has beyond its stated size (a /proc file says 0; a file may grow)
  while (true) {
    const bool beyond = got == text.size();
    const ssize_t n = ::read(file.fd, beyond ? more : text.data() + got, beyond ? sizeof more : text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    REMAT_CHECK(n >= 0, "cannot read corpus file ", p.string(), ": ", std::strerror(errno));
    if (n == 0) break;
    if (beyond) text.append(more, static_cast<size_t>(n));
    got += static_cast<size_t>(n);
    REMAT_CHECK(got <= room, too_large(p, bytes_before, max_bytes));
  }
  text.resize(got);
  return text;
}

bool looks_like_text(const std::string& s) {
  if (s.empty()) return false;
  size_t control = 0;
  for (unsigned char c : s) {
    if (c == 0) return false;
    if (c < 32 && c != '\n' && c != '\r' && c != '\t' && c != '\f') ++control;
  }
  return control * 100 < s.size();  // under 1% odd control bytes
}

std::string how_to_fix(const std::string& path) {
  return "remat train reads a text file or a folder of text files (--data PATH). The default corpus is "
         "Debian's fortune cookies in " + std::string(kDefaultCorpus) +
         "; install it with `apt-get install fortunes` (scripts/demo does), or pass --data with your own text"
         " (looked at: " + path + ")";
}

}  // namespace

Corpus load_corpus(const std::string& path, size_t max_bytes) {
  Corpus corpus;
  std::error_code ec;
  fs::path root(path);
  REMAT_CHECK(fs::exists(root, ec), "corpus not found: ", path, ". ", how_to_fix(path));
  std::vector<fs::path> files;
  if (fs::is_directory(root, ec)) {
    for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      if (it->is_regular_file(ec) && !it->is_symlink(ec)) files.push_back(it->path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(root);
  }
  for (const auto& f : files) {
    if (f.extension() == ".dat") continue;  // fortune's binary index files
    std::string s = read_corpus_file(f, corpus.text.size(), max_bytes);
    if (!looks_like_text(s)) continue;
    corpus.text += s;
    if (!s.empty() && s.back() != '\n') corpus.text += '\n';
    corpus.files.push_back(f.string());
    corpus.file_ends.push_back(corpus.text.size());
  }
  REMAT_CHECK(!corpus.text.empty(), "corpus is empty: no text found in ", path, ". ", how_to_fix(path));
  REMAT_CHECK(corpus.text.size() >= 1000, "corpus too small: ", corpus.text.size(), " bytes in ", path,
              " (need at least 1000). ", how_to_fix(path));
  return corpus;
}

CharTokenizer CharTokenizer::from_text(const std::string& text) {
  bool present[256] = {};
  for (unsigned char c : text) present[c] = true;
  CharTokenizer t;
  std::fill(std::begin(t.index_), std::end(t.index_), -1);
  for (int c = 0; c < 256; ++c)
    if (present[c]) {
      t.index_[c] = static_cast<int>(t.bytes_.size());
      t.bytes_.push_back(static_cast<unsigned char>(c));
    }
  return t;
}

CharTokenizer CharTokenizer::from_string(const std::string& serialised, const std::string& what) {
  CharTokenizer t;
  std::fill(std::begin(t.index_), std::end(t.index_), -1);
  REMAT_CHECK(!serialised.empty(), what, " is empty");
  size_t begin = 0;
  while (true) {
    const size_t comma = std::min(serialised.find(',', begin), serialised.size());
    const int c = static_cast<int>(parse_int(what, std::string_view(serialised).substr(begin, comma - begin), 0, 255));
    REMAT_CHECK(t.index_[c] < 0, what, ": byte ", c, " appears twice");
    t.index_[c] = static_cast<int>(t.bytes_.size());
    t.bytes_.push_back(static_cast<unsigned char>(c));
    if (comma == serialised.size()) break;
    begin = comma + 1;
  }
  return t;
}

std::string CharTokenizer::to_string() const {
  std::string s;
  for (size_t i = 0; i < bytes_.size(); ++i) s += (i ? "," : "") + std::to_string(bytes_[i]);
  return s;
}

std::vector<int64_t> CharTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) {
    REMAT_CHECK(index_[c] >= 0, "text contains byte ", static_cast<int>(c), " which is not in the model's vocabulary");
    ids.push_back(index_[c]);
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  for (auto id : ids) {
    REMAT_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " out of range for vocabulary of ", vocab_size());
    s += static_cast<char>(bytes_[static_cast<size_t>(id)]);
  }
  return s;
}

TokenSplit split_tokens(const std::vector<int64_t>& tokens, const std::vector<size_t>& file_ends,
                        double validation_fraction) {
  REMAT_CHECK(validation_fraction >= 0 && validation_fraction < 1, "validation fraction must be in [0, 1), got ",
              validation_fraction);
  REMAT_CHECK(!file_ends.empty() && file_ends.back() == tokens.size() &&
                  std::is_sorted(file_ends.begin(), file_ends.end()),
              "split_tokens: the file ends must rise to the token count ", tokens.size());
  TokenSplit s;
  size_t begin = 0;
  for (size_t end : file_ends) {
    const size_t held_out = static_cast<size_t>(static_cast<double>(end - begin) * validation_fraction);
    const auto at = [&](size_t i) { return tokens.begin() + static_cast<std::ptrdiff_t>(i); };
    s.train.insert(s.train.end(), at(begin), at(end - held_out));
    s.validation.insert(s.validation.end(), at(end - held_out), at(end));
    begin = end;
  }
  return s;
}

Batch sample_batch(const std::vector<int64_t>& tokens, int64_t batch, int64_t seq, uint64_t seed, uint64_t step,
                   Device device) {
  REMAT_CHECK(static_cast<int64_t>(tokens.size()) > seq + 1, "text of ", tokens.size(),
              " tokens is too short for sequences of ", seq);
  uint64_t span = tokens.size() - static_cast<uint64_t>(seq) - 1;
  std::vector<int64_t> in(static_cast<size_t>(batch * seq)), out(static_cast<size_t>(batch * seq));
  for (int64_t b = 0; b < batch; ++b) {
    uint64_t word = (static_cast<uint64_t>(philox_word({seed, step * 1024}, static_cast<uint64_t>(2 * b))) << 32) |
                    philox_word({seed, step * 1024}, static_cast<uint64_t>(2 * b + 1));
    uint64_t start = word % span;
    for (int64_t t = 0; t < seq; ++t) {
      in[static_cast<size_t>(b * seq + t)] = tokens[start + static_cast<uint64_t>(t)];
      out[static_cast<size_t>(b * seq + t)] = tokens[start + static_cast<uint64_t>(t) + 1];
    }
  }
  return {from_indices(in, {batch, seq}, device), from_indices(out, {batch, seq}, device)};
}

}  // namespace remat::tools
