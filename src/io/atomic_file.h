// Internal: a file written whole or not at all (safetensors files, training states, the JSON files
// of a weight directory). See Note [atomic files] in atomic_file.cpp.
//
//   io::AtomicFile file(path, "save_safetensors(\"w.safetensors\")");
//   file.write(bytes.data(), bytes.size());   // a remat::Error on a full disk, naming the file
//   file.commit();                            // now `path` has the new contents, on disk
#pragma once

#include <cstddef>
#include <string>

namespace remat::io {

class AtomicFile {
 public:
  // Creates a temporary file beside `path`; `who` starts every error message.
  AtomicFile(const std::string& path, const std::string& who);
  ~AtomicFile();  // without commit(): the temporary file is removed, `path` is as it was
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  // Flushes the file to disk, renames it over `path` and flushes the directory entry.
  void commit();

 private:
  [[noreturn]] void fail(const std::string& what, int error);
  std::string path_, temp_, who_;
  int fd_ = -1;
};

// Writes `text` to `path` through an AtomicFile.
void write_file_atomically(const std::string& path, const std::string& text, const std::string& who);

// Flushes `directory`'s entries (a rename in it) to disk; a remat::Error naming `who` on failure.
void sync_directory(const std::string& directory, const std::string& who);

}  // namespace remat::io
