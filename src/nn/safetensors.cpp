// safetensors reading and writing: validate the whole header before allocating, write atomically.
#include "remat/nn/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "remat/backend.h"

namespace remat::nn {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; add byte swapping for this platform");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull * 1024 * 1024;  // as the reference implementation
constexpr const char* kMetadataKey = "__metadata__";

const char* format_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i64: return "I64";
  }
  return "?";
}

bool parse_dtype(const std::string& text, DType& dtype) {
  if (text == "F32") dtype = DType::f32;
  else if (text == "F64") dtype = DType::f64;
  else if (text == "I64") dtype = DType::i64;
  else return false;
  return true;
}

template <class... Parts>
[[noreturn]] void fail(const std::string& path, Parts&&... parts) {
  throw Error(detail::concat("load_safetensors(\"", path, "\"): ", std::forward<Parts>(parts)...));
}

// A CPU, contiguous tensor with the values of t (t itself when it already is one).
Tensor host_contiguous(const Tensor& t) {
  Tensor d = t.detach();
  if (d.device().type == DeviceType::cpu && d.is_contiguous()) return d;
  Tensor host = Tensor::empty(d.shape(), d.dtype());
  backend(d.device()).copy(d, host);
  return host;
}

std::string temporary_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return detail::concat(path, ".tmp-", ::getpid(), "-", counter.fetch_add(1));
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// Parses and checks one tensor entry of the header.
Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& value, uint64_t data_bytes) {
  if (!value.is_object()) fail(path, "header entry \"", name, "\" is not an object");
  auto field = [&](const char* key) -> const nlohmann::json& {
    auto it = value.find(key);
    if (it == value.end()) fail(path, "tensor \"", name, "\" has no \"", key, "\"");
    return *it;
  };
  Entry e;
  e.name = name;
  const nlohmann::json& dtype = field("dtype");
  if (!dtype.is_string()) fail(path, "tensor \"", name, "\": \"dtype\" is not a string");
  if (!parse_dtype(dtype.get<std::string>(), e.dtype))
    fail(path, "tensor \"", name, "\" has dtype ", dtype.get<std::string>(), ", which remat does not read (F32, F64, I64)");

  const nlohmann::json& shape = field("shape");
  if (!shape.is_array()) fail(path, "tensor \"", name, "\": \"shape\" is not an array");
  if (shape.size() > static_cast<size_t>(kMaxRank))
    fail(path, "tensor \"", name, "\" has rank ", shape.size(), ", above the maximum rank ", kMaxRank);
  uint64_t bytes = dtype_size(e.dtype);
  for (const auto& d : shape) {
    if (!d.is_number_unsigned()) fail(path, "tensor \"", name, "\": shape ", shape.dump(), " is not a list of sizes");
    const uint64_t size = d.get<uint64_t>();
    if (size > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(bytes, size, &bytes))
      fail(path, "tensor \"", name, "\": shape ", shape.dump(), " is too large");
    e.shape.push_back(static_cast<int64_t>(size));
  }

  const nlohmann::json& offsets = field("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    fail(path, "tensor \"", name, "\": \"data_offsets\" ", offsets.dump(), " is not [begin, end]");
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_bytes)
    fail(path, "tensor \"", name, "\": data_offsets [", e.begin, ", ", e.end, "] are out of range of the ", data_bytes,
         "-byte data section");
  if (e.end - e.begin != bytes)
    fail(path, "tensor \"", name, "\": data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin,
         " bytes, but ", format_dtype(e.dtype), " ", shape_str(e.shape), " needs ", bytes);
  return e;
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    REMAT_CHECK(!name.empty(), "save_safetensors(\"", path, "\"): a tensor has an empty name");
    REMAT_CHECK(name != kMetadataKey, "save_safetensors(\"", path, "\"): \"", kMetadataKey,
                "\" is reserved and cannot name a tensor");
    REMAT_CHECK(names.insert(name).second, "save_safetensors(\"", path, "\"): two tensors are named \"", name, "\"");
    REMAT_CHECK(t.defined(), "save_safetensors(\"", path, "\"): tensor \"", name, "\" is undefined");
  }

  std::string header;
  try {
    nlohmann::ordered_json json = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
      nlohmann::ordered_json meta = nlohmann::ordered_json::object();
      for (const auto& [key, value] : metadata) meta[key] = value;
      json[kMetadataKey] = std::move(meta);
    }
    uint64_t offset = 0;
    for (const auto& [name, t] : tensors) {
      const uint64_t bytes = t.nbytes();
      json[name] = {{"dtype", format_dtype(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
    header = json.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(detail::concat("save_safetensors(\"", path, "\"): cannot encode the header: ", e.what()));
  }
  header.append((8 - header.size() % 8) % 8, ' ');

  // Write a temporary file next to the target, flush it to disk, then rename it over the target:
  // a reader (or a crash) sees the old file or the new one, never half of one.
  const std::string temp = temporary_name(path);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(detail::concat("save_safetensors(\"", path, "\"): cannot create ", temp, ": ", std::strerror(errno)));
  auto fail_write = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    ::unlink(temp.c_str());
    throw Error(detail::concat("save_safetensors(\"", path, "\"): ", what, " ", temp, " failed: ", reason));
  };
  auto write_all = [&](const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd, p, bytes);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail_write("writing");
      p += n;
      bytes -= static_cast<size_t>(n);
    }
  };
  char length[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  write_all(length, 8);
  write_all(header.data(), header.size());
  for (const auto& [name, t] : tensors) {
    Tensor host = host_contiguous(t);
    if (host.nbytes() > 0) write_all(host.raw_data(), host.nbytes());
  }
  if (::fsync(fd) != 0) fail_write("flushing");
  if (::close(fd) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temp.c_str());
    throw Error(detail::concat("save_safetensors(\"", path, "\"): closing ", temp, " failed: ", reason));
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temp.c_str());
    throw Error(detail::concat("save_safetensors(\"", path, "\"): cannot rename ", temp, " to the target: ", reason));
  }
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot read the file: ", ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open the file: ", std::strerror(errno));
  if (file_bytes < 8) fail(path, "the file has ", file_bytes, " bytes, fewer than the 8-byte header length");

  unsigned char length[8];
  in.read(reinterpret_cast<char*>(length), 8);
  if (in.gcount() != 8) fail(path, "cannot read the header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
  if (n > file_bytes - 8)
    fail(path, "the header length ", n, " exceeds the ", file_bytes - 8, " bytes after the length (truncated or not "
               "a safetensors file)");
  if (n > kMaxHeaderBytes) fail(path, "the header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (static_cast<uint64_t>(in.gcount()) != n) fail(path, "cannot read the ", n, "-byte header");
  const uint64_t data_bytes = file_bytes - 8 - n;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, "the header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) fail(path, "the header is not a JSON object");

  SafetensorsFile file;
  std::vector<Entry> entries;
  try {
    for (const auto& [key, value] : header.items()) {
      if (key == kMetadataKey) {
        if (!value.is_object()) fail(path, "\"", kMetadataKey, "\" is not an object");
        for (const auto& [mk, mv] : value.items()) {
          if (!mv.is_string()) fail(path, "metadata \"", mk, "\" is not a string");
          file.metadata[mk] = mv.get<std::string>();
        }
        continue;
      }
      entries.push_back(parse_entry(path, key, value, data_bytes));
    }
  } catch (const nlohmann::json::exception& e) {
    fail(path, "malformed header: ", e.what());
  }

  // The tensors must tile the data section exactly: no overlap, no gap, nothing left over.
  std::vector<const Entry*> order;
  for (const auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : order) {
    if (e->begin < cursor)
      fail(path, "tensor \"", e->name, "\" [", e->begin, ", ", e->end, "] overlaps \"", previous->name, "\" [",
           previous->begin, ", ", previous->end, "]");
    if (e->begin > cursor) fail(path, "bytes [", cursor, ", ", e->begin, ") of the data section belong to no tensor");
    cursor = e->end;
    previous = e;
  }
  if (cursor != data_bytes)
    fail(path, "the data section has ", data_bytes, " bytes but the tensors cover ", cursor,
         " (truncated, or trailing bytes)");

  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    const uint64_t bytes = e.end - e.begin;
    if (bytes > 0) {
      in.seekg(static_cast<std::streamoff>(8 + n + e.begin));
      in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(bytes));
      if (!in || static_cast<uint64_t>(in.gcount()) != bytes) fail(path, "cannot read the data of tensor \"", e.name, "\"");
    }
    t.set_name(e.name);
    file.tensors.emplace(e.name, std::move(t));
  }
  return file;
}

}  // namespace remat::nn
