// safetensors reading and writing: validate the whole header before allocating, write atomically.
#include "remat/nn/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "remat/backend.h"
#include "io/atomic_file.h"
#include "io/strict_json.h"

namespace remat::nn {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; add byte swapping for this platform");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100000000;  // 100 MB, as the reference implementation
constexpr const char* kMetadataKey = "__metadata__";

const char* format_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i64: return "I64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  return "?";
}

bool parse_dtype(const std::string& text, DType& dtype) {
  for (DType d : {DType::f32, DType::f64, DType::i64, DType::bf16, DType::f16})
    if (text == format_dtype(d)) {
      dtype = d;
      return true;
    }
  return false;
}

// The header is an object (depth 0) of objects (1) whose values are strings or flat arrays (2).
constexpr int kMaxDepth = 3;

// `where` names the call and the file, e.g. load_safetensors("w.safetensors").
template <class... Parts>
[[noreturn]] void fail(const std::string& where, Parts&&... parts) {
  throw Error(detail::concat(where, ": ", std::forward<Parts>(parts)...));
}

// A CPU, contiguous tensor with the values of t (t itself when it already is one).
Tensor host_contiguous(const Tensor& t) {
  Tensor d = t.detach();
  if (d.device().type == DeviceType::cpu && d.is_contiguous()) return d;
  Tensor host = Tensor::empty(d.shape(), d.dtype());
  backend(d.device()).copy(d, host);
  return host;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

const char* file_dtype(const Entry& e) { return format_dtype(e.dtype); }

// A short rendering of a JSON value for messages (a hostile header may hold huge values).
std::string brief(const nlohmann::json& value) {
  std::string text = value.dump();  // depth <= kMaxDepth: no deep recursion
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

// A size: a JSON integer in [0, 2^63) (no sign, no fraction, no exponent, no overflow).
bool is_size(const nlohmann::json& value) {
  return value.is_number_unsigned() && value.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
}

// Parses and checks one tensor entry of the header.
Entry parse_entry(const std::string& where, const std::string& name, const nlohmann::json& value, uint64_t data_bytes) {
  if (!value.is_object()) fail(where, "header entry \"", name, "\" is not an object but ", brief(value));
  auto field = [&](const char* key) -> const nlohmann::json& {
    auto it = value.find(key);
    if (it == value.end()) fail(where, "tensor \"", name, "\" has no \"", key, "\"");
    return *it;
  };
  Entry e;
  e.name = name;
  const nlohmann::json& dtype = field("dtype");
  if (!dtype.is_string()) fail(where, "tensor \"", name, "\": \"dtype\" is ", brief(dtype), ", not a string");
  if (!parse_dtype(dtype.get<std::string>(), e.dtype))
    fail(where, "tensor \"", name, "\" has dtype ", brief(dtype), ", which remat does not read (F32, F64, I64, F16, BF16)");

  const nlohmann::json& shape = field("shape");
  if (!shape.is_array()) fail(where, "tensor \"", name, "\": \"shape\" is ", brief(shape), ", not an array");
  if (shape.size() > static_cast<size_t>(kMaxRank))
    fail(where, "tensor \"", name, "\" has rank ", shape.size(), ", above the maximum rank ", kMaxRank);
  // bytes = itemsize x every size; `nonzero` = itemsize x every non-zero size, which bounds the
  // strides of a tensor with a zero size, e.g. [0, 2^62, 2^62].
  uint64_t bytes = dtype_size(e.dtype), nonzero = bytes;
  for (size_t i = 0; i < shape.size(); ++i) {
    const nlohmann::json& d = shape[i];
    if (!is_size(d))
      fail(where, "tensor \"", name, "\": size ", i, " of shape ", brief(shape), " is ", brief(d),
           ", not an integer in [0, 2^63)");
    const uint64_t size = d.get<uint64_t>();
    if (__builtin_mul_overflow(bytes, size, &bytes) || (size > 0 && __builtin_mul_overflow(nonzero, size, &nonzero)) ||
        nonzero > static_cast<uint64_t>(INT64_MAX))
      fail(where, "tensor \"", name, "\": shape ", brief(shape), " is too large (its byte count overflows 2^63)");
    e.shape.push_back(static_cast<int64_t>(size));
  }

  const nlohmann::json& offsets = field("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !is_size(offsets[0]) || !is_size(offsets[1]))
    fail(where, "tensor \"", name, "\": \"data_offsets\" ", brief(offsets), " is not [begin, end] (two integers)");
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_bytes)
    fail(where, "tensor \"", name, "\": data_offsets [", e.begin, ", ", e.end, "] are out of range of the ", data_bytes,
         "-byte data section");
  if (e.end - e.begin != bytes)
    fail(where, "tensor \"", name, "\": data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin,
         " bytes, but ", file_dtype(e), " ", shape_str(e.shape), " needs ", bytes);
  return e;
}

// Parses the header text as JSON, refusing values nested deeper than kMaxDepth (an object of
// objects holding flat arrays) and repeated keys before anything is built (Note [strict JSON]).
nlohmann::json parse_header_json(const std::string& where, const std::string& text) {
  using io::strict_json::Problem;
  const Problem p = io::strict_json::check(text, {.max_depth = kMaxDepth});
  switch (p.kind) {
    case Problem::none:
      return nlohmann::json::parse(text);
    case Problem::too_deep:
      fail(where, "the header nests values more than ", kMaxDepth, " levels deep (a safetensors header is an "
                 "object of objects whose values are strings or flat arrays of integers)");
    case Problem::repeated_key:
      fail(where, "the header has the key \"", p.detail, "\" twice in one object");
    case Problem::too_many_objects:
    case Problem::invalid:
      break;
  }
  fail(where, "the header is not valid JSON: ", p.detail);
}

// Reads the header of a safetensors file of `file_bytes` bytes. Returns the metadata and the validated entries (no tensor storage yet).
struct Header {
  Metadata metadata;
  std::vector<Entry> entries;
  uint64_t data_start = 0;  // file offset of the data section
};

// read(offset, n, into, what): n bytes of the file from `offset`; `what` names them in errors.
using ReadBytes = std::function<void(uint64_t offset, uint64_t n, char* into, const std::string& what)>;

Header read_header(const std::string& where, uint64_t file_bytes, const ReadBytes& read) {
  if (file_bytes < 8) fail(where, "the file has ", file_bytes, " bytes, fewer than the 8-byte header length");
  unsigned char length[8];
  read(0, 8, reinterpret_cast<char*>(length), "the header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
  if (n > file_bytes - 8)
    fail(where, "the header length ", n, " exceeds the ", file_bytes - 8, " bytes after the length (truncated or not "
               "a safetensors file)");
  if (n > kMaxHeaderBytes) fail(where, "the header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  std::string text(n, '\0');
  read(8, n, text.data(), "the header");
  Header h;
  h.data_start = 8 + n;
  const uint64_t data_bytes = file_bytes - h.data_start;

  const nlohmann::json header = parse_header_json(where, text);
  if (!header.is_object()) fail(where, "the header is not a JSON object");
  try {
    for (const auto& [key, value] : header.items()) {
      if (key == kMetadataKey) {
        if (!value.is_object()) fail(where, "\"", kMetadataKey, "\" is not an object");
        for (const auto& [mk, mv] : value.items()) {
          if (!mv.is_string()) fail(where, "metadata \"", mk, "\" is ", brief(mv), ", not a string");
          h.metadata[mk] = mv.get<std::string>();
        }
        continue;
      }
      h.entries.push_back(parse_entry(where, key, value, data_bytes));
    }
  } catch (const nlohmann::json::exception& e) {
    fail(where, "malformed header: ", e.what());
  }

  // The tensors must tile the data section exactly: no overlap, no gap, nothing left over.
  std::vector<const Entry*> order;
  for (const auto& e : h.entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : order) {
    if (e->begin < cursor)
      fail(where, "tensor \"", e->name, "\" [", e->begin, ", ", e->end, "] overlaps \"", previous->name, "\" [",
           previous->begin, ", ", previous->end, "]");
    if (e->begin > cursor) fail(where, "bytes [", cursor, ", ", e->begin, ") of the data section belong to no tensor");
    cursor = e->end;
    previous = e;
  }
  if (cursor != data_bytes)
    fail(where, "the data section has ", data_bytes, " bytes but the tensors cover ", cursor,
         " (truncated, or trailing bytes)");
  return h;
}

// Allocates the tensors of a validated header and fills them with read(offset, n, into); with
// widen_16bit_floats, BF16 and F16 entries become f32 tensors.
SafetensorsFile read_tensors(const std::string& where, Header& h, const ReadBytes& read, const LoadOptions& options) {
  SafetensorsFile file;
  for (const Entry& e : h.entries) {
    const bool widen = options.widen_16bit_floats && is_16bit_float(e.dtype);
    Tensor t;
    try {
      t = Tensor::empty(e.shape, widen ? DType::f32 : e.dtype);
    } catch (const Error& error) {
      fail(where, "tensor \"", e.name, "\" (", file_dtype(e), " ", shape_str(e.shape), "): ", error.what());
    } catch (const std::bad_alloc&) {
      fail(where, "tensor \"", e.name, "\" (", file_dtype(e), " ", shape_str(e.shape), "): cannot allocate ",
           e.end - e.begin, " bytes");
    }
    if (e.end > e.begin && !widen) {
      read(h.data_start + e.begin, e.end - e.begin, static_cast<char*>(t.raw_data()),
           detail::concat("the data of tensor \"", e.name, "\""));
    } else if (e.end > e.begin) {
      // the 2-byte values land in the second half of the f32 buffer, then widen in place from the
      // front (element i is written at 4i after its source at 2n + 2i was read)
      const size_t n = static_cast<size_t>(t.numel());
      char* base = static_cast<char*>(t.raw_data());
      read(h.data_start + e.begin, e.end - e.begin, base + 2 * n, detail::concat("the data of tensor \"", e.name, "\""));
      float* out = t.contiguous_data<float>();
      for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, base + 2 * n + 2 * i, sizeof v);
        out[i] = e.dtype == DType::f16 ? static_cast<float>(std::bit_cast<float16>(v))
                                       : static_cast<float>(std::bit_cast<bfloat16>(v));
      }
    }
    t.set_name(e.name);
    file.tensors.emplace(e.name, std::move(t));
  }
  file.metadata = std::move(h.metadata);
  return file;
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

  // A temporary file next to the target, flushed to disk, then renamed over it (Note [atomic
  // files]): a reader (or a crash) sees the old file or the new one, never half of one.
  io::AtomicFile file(path, detail::concat("save_safetensors(\"", path, "\")"));
  char length[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  file.write(length, 8);
  file.write(header.data(), header.size());
  for (const auto& [name, t] : tensors) {
    Tensor host = host_contiguous(t);
    if (host.nbytes() > 0) file.write(host.raw_data(), host.nbytes());
  }
  file.commit();
}

SafetensorsFile load_safetensors(const std::string& path, const LoadOptions& options) {
  const std::string where = detail::concat("load_safetensors(\"", path, "\")");
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) fail(where, "cannot read the file: no such file");
  if (ec) fail(where, "cannot read the file: ", ec.message());
  if (!std::filesystem::is_regular_file(status)) fail(where, "cannot read the file: not a regular file");
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (ec) fail(where, "cannot read the file: ", ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(where, "cannot open the file: ", std::strerror(errno));
  auto read = [&](uint64_t offset, uint64_t n, char* into, const std::string& what) {
    in.seekg(static_cast<std::streamoff>(offset));
    in.read(into, static_cast<std::streamsize>(n));
    if (!in || static_cast<uint64_t>(in.gcount()) != n) fail(where, "cannot read ", what, " (the file changed?)");
  };
  Header header = read_header(where, file_bytes, read);
  return read_tensors(where, header, read, options);
}

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& name, const LoadOptions& options) {
  auto copy = [&](uint64_t offset, uint64_t n, char* into, const std::string&) {
    std::memcpy(into, bytes.data() + offset, n);
  };
  const std::string where = detail::concat("parse_safetensors(\"", name, "\")");
  Header header = read_header(where, bytes.size(), copy);
  return read_tensors(where, header, copy, options);
}

}  // namespace remat::nn
