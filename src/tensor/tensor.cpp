// Tensor handle, storage, shape helpers and factories. The tensor layer does not know the tape:
// the autodiff functions of Tensor are defined in src/autodiff/ (leaf.cpp, engine.cpp, ops/).
#include "remat/tensor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "remat/backend.h"
#include "tensor/allocate.h"

namespace remat {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i64: return "i64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64:
    case DType::i64: return 8;
    case DType::bf16:
    case DType::f16: return 2;
  }
  return 8;
}

std::string device_name(Device device) {
  switch (device.type) {
    case DeviceType::cpu: return "cpu";
    case DeviceType::cuda: return "cuda:" + std::to_string(device.index);
    case DeviceType::emulated: return "emulated:" + std::to_string(device.index);
  }
  return "?";
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

[[noreturn]] void too_many_elements(const Shape& shape, const char* op) {
  throw Error(detail::concat(op ? op : "", op ? ": " : "", "shape ", shape_str(shape), " has more than 2^60 = ",
                             kMaxElements, " elements (counting zero-size axes as 1), the largest tensor remat allows"));
}

// The product of the dimensions, zero-size axes counted as 1: the element count of a shape
// without empty axes, and a bound on every contiguous stride. Throws past kMaxElements.
int64_t checked_span(const Shape& shape, const char* op) {
  int64_t span = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(detail::concat(op ? op : "", op ? ": " : "", "negative dimension in shape ", shape_str(shape)));
    if (d > 1 && (__builtin_mul_overflow(span, d, &span) || span > kMaxElements)) too_many_elements(shape, op);
  }
  return span;
}

}  // namespace

void check_shape(const Shape& shape, const char* op) {
  REMAT_CHECK(static_cast<int>(shape.size()) <= kMaxRank, op, ": rank ", shape.size(), " of shape ",
              shape_str(shape), " exceeds the maximum rank ", kMaxRank);
  checked_span(shape, op);
}

int64_t shape_numel(const Shape& shape) {
  int64_t span = checked_span(shape, nullptr);
  for (int64_t d : shape)
    if (d == 0) return 0;
  return span;
}

Strides contiguous_strides(const Shape& shape) {
  checked_span(shape, nullptr);  // every stride is at most the span
  Strides strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    REMAT_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
                " cannot be broadcast together (axis ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  // two valid shapes can broadcast to one that is too large
  int64_t span = 1;
  bool fits = true;
  for (int64_t d : out) fits = fits && (d <= 1 || (!__builtin_mul_overflow(span, d, &span) && span <= kMaxElements));
  REMAT_CHECK(fits, op, ": shapes ", shape_str(a), " and ", shape_str(b), " broadcast to ", shape_str(out),
              ", which has more than 2^60 = ", kMaxElements, " elements, the largest tensor remat allows");
  return out;
}

// ---- Storage

Storage::Storage(size_t bytes, memory::Tag tag, Device device)
    : bytes_(bytes), tag_(tag), device_(device), allocator_(&backend(device).allocator()) {
  data_ = allocator_->allocate(bytes, tag);
}

Storage::Storage(void* data, size_t bytes, memory::Tag tag, Device device, std::function<void()> release)
    : data_(data), bytes_(bytes), tag_(tag), device_(device), allocator_(&backend(device).allocator()),
      release_(std::move(release)) {
  REMAT_ASSERT(release_ != nullptr, "external storage without a release function");
  allocator_->count_external(bytes, tag);
}

std::shared_ptr<const uint64_t> Storage::version_watch() const {
  if (!version_watch_) version_watch_ = std::make_shared<uint64_t>(version_);
  return version_watch_;
}

Storage::~Storage() {
  if (!release_) {
    allocator_->deallocate(data_, bytes_, tag_);
    return;
  }
  allocator_->uncount_external(bytes_, tag_);
  release_();
}

void Storage::set_tag(memory::Tag tag) {
  if (tag == tag_) return;
  allocator_->retag(bytes_, tag_, tag);
  tag_ = tag;
}

void Storage::add_saved_reference() {
  if (saved_references_++ == 0 && tag_ == memory::Tag::other) set_tag(memory::Tag::saved);
}

void Storage::remove_saved_reference() {
  REMAT_ASSERT(saved_references_ > 0);
  if (--saved_references_ == 0 && tag_ == memory::Tag::saved) set_tag(memory::Tag::other);
}

// ---- Tensor

namespace detail {

namespace {

// The byte size of a contiguous tensor of `shape`, after check_shape (errors name `op`).
size_t checked_bytes(const char* op, const Shape& shape, DType dtype) {
  check_shape(shape, op);
  // numel <= 2^60 and at most 8 bytes per element: the product fits; checked all the same
  return checked_mul(static_cast<size_t>(shape_numel(shape)), dtype_size(dtype),
                     [&] { return concat(op, ": byte size of shape ", shape_str(shape)); });
}


// A contiguous tensor of `shape` over the whole of `storage`.
Tensor contiguous_over(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  return tensor_over(std::move(storage), 0, shape, contiguous_strides(shape), dtype);
}

}  // namespace

Tensor tensor_over(std::shared_ptr<Storage> storage, int64_t offset, const Shape& shape, const Strides& strides,
                   DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset = offset;
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor allocate_tensor(const char* op, const Shape& shape, DType dtype, memory::Tag tag, Device device) {
  const size_t bytes = checked_bytes(op ? op : "empty", shape, dtype);
  // A device holds 16-bit floats only where its backend says so (Backend::holds; the CPU's does),
  // and the backend says why not (CUDA: not without the backend option sixteen_bit).
  if (is_16bit_float(dtype) && device.type != DeviceType::cpu && !backend(device).holds(dtype))
    throw Error(concat(op ? op : "empty", ": ", device_name(device), " holds no ", dtype_name(dtype), " tensors: ",
                       backend(device).why_not_held(dtype), "; shape ", shape_str(shape)));
  std::shared_ptr<Storage> storage;
  try {
    storage = std::make_shared<Storage>(bytes, tag, device);
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(concat(op ? op : "", op ? ": " : "", "cannot allocate ", memory::format_bytes(static_cast<double>(bytes)),
                             " (", bytes, " bytes) for a ", dtype_name(dtype), " tensor of shape ", shape_str(shape),
                             " (", e.what(), ")"),
                      bytes);
  }
  return contiguous_over(std::move(storage), shape, dtype);
}

Tensor external_tensor(void* data, const Shape& shape, DType dtype, memory::Tag tag, Device device,
                       std::function<void()> release) {
  const size_t bytes = checked_bytes("external_tensor", shape, dtype);
  return contiguous_over(std::make_shared<Storage>(data, bytes, tag, device, std::move(release)), shape, dtype);
}

void note_index_range(const Tensor& t, const int64_t* values) {
  const int64_t n = t.numel();
  if (n == 0 || t.offset() != 0 || !t.is_contiguous() || t.nbytes() != t.storage()->bytes()) return;
  int64_t lo = values[0], hi = values[0];
  for (int64_t i = 1; i < n; ++i) lo = std::min(lo, values[i]), hi = std::max(hi, values[i]);
  t.storage()->set_index_range(lo, hi);
}

}  // namespace detail

Tensor Tensor::empty(const Shape& shape, DType dtype, memory::Tag tag, Device device) {
  return detail::allocate_tensor("empty", shape, dtype, tag, device);
}

TensorImpl& Tensor::impl() const {
  REMAT_CHECK(impl_ != nullptr, "operation on an undefined tensor");
  return *impl_;
}

int64_t Tensor::size(int64_t axis) const {
  int64_t rank = dim();
  int64_t a = axis < 0 ? axis + rank : axis;
  REMAT_CHECK(a >= 0 && a < rank, "size: axis ", axis, " out of range for shape ", shape_str(shape()));
  return impl().shape[a];
}

bool Tensor::is_contiguous() const {
  const auto& s = impl().shape;
  const auto& st = impl().strides;
  int64_t expected = 1;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != 1 && st[i] != expected) return false;
    expected *= s[i];
  }
  return true;
}

namespace detail {
static const char* element_type_name(DType d) {
  switch (d) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::i64: return "int64_t";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
  }
  return "?";
}
void data_dtype_mismatch(const Tensor& t, DType wanted, bool contiguity) {
  std::string which = t.name().empty() ? std::string("a tensor") : "tensor '" + t.name() + "'";
  if (contiguity) {
    std::string strides;
    for (size_t i = 0; i < t.strides().size(); ++i) strides += (i ? ", " : "") + std::to_string(t.strides()[i]);
    throw Error(concat("Tensor::contiguous_data<", element_type_name(wanted), ">(): ", which, " of shape ",
                       shape_str(t.shape()), " with strides [", strides,
                       "] is not contiguous; call .contiguous() first or index with strides() through data<",
                       element_type_name(wanted), ">()"));
  }
  throw Error(concat("Tensor::data<", element_type_name(wanted), ">(): ", which, " of shape ", shape_str(t.shape()),
                     " has dtype ", dtype_name(t.dtype()), ", not ", dtype_name(wanted), "; use data<",
                     element_type_name(t.dtype()), ">() or convert with .to(DType::", dtype_name(wanted), ")"));
}
namespace {
std::atomic<int> device_kernels_running{0};
}
DeviceKernelScope::DeviceKernelScope() { ++device_kernels_running; }
DeviceKernelScope::~DeviceKernelScope() { --device_kernels_running; }
void check_device_access(const Tensor& t) {
  if (t.device().type == DeviceType::cpu || device_kernels_running.load(std::memory_order_relaxed) > 0) return;
  throw Error(concat("a ", dtype_name(t.dtype()), " tensor of shape ", shape_str(t.shape()), " is on ",
                     device_name(t.device()), ", not in host memory; copy it with .to(remat::kCpu) to read it on the host"));
}
}  // namespace detail

void* Tensor::raw_data() const {
  if (device().type != DeviceType::cpu) detail::check_device_access(*this);
  return static_cast<char*>(impl().storage->data()) + impl().offset * static_cast<int64_t>(dtype_size(dtype()));
}

static double read_element(const Tensor& t, int64_t flat_offset) {
  const char* base = static_cast<const char*>(t.storage()->data());
  switch (t.dtype()) {
    case DType::f32: return reinterpret_cast<const float*>(base)[flat_offset];
    case DType::f64: return reinterpret_cast<const double*>(base)[flat_offset];
    case DType::i64: return static_cast<double>(reinterpret_cast<const int64_t*>(base)[flat_offset]);
    case DType::bf16: return static_cast<double>(reinterpret_cast<const bfloat16*>(base)[flat_offset]);
    case DType::f16: return static_cast<double>(reinterpret_cast<const float16*>(base)[flat_offset]);
  }
  return 0;
}

double Tensor::item() const {
  REMAT_CHECK(numel() == 1, "item: tensor of shape ", shape_str(shape()), " has ", numel(), " elements, not 1");
  REMAT_CHECK(device().type == DeviceType::cpu, "item: tensor is on ", device_name(device()),
              " (copy it with .to(remat::kCpu))");
  return read_element(*this, offset());
}

double Tensor::at(const std::vector<int64_t>& index) const {
  REMAT_CHECK(device().type == DeviceType::cpu, "at: tensor is on ", device_name(device()), " (copy it with .to(remat::kCpu))");
  REMAT_CHECK(static_cast<int64_t>(index.size()) == dim(), "at: index of rank ", index.size(),
              " for tensor of shape ", shape_str(shape()));
  int64_t off = offset();
  for (size_t i = 0; i < index.size(); ++i) {
    int64_t k = index[i] < 0 ? index[i] + shape()[i] : index[i];
    REMAT_CHECK(k >= 0 && k < shape()[i], "at: index ", index[i], " out of range for axis ", i, " of shape ",
                shape_str(shape()));
    off += k * strides()[i];
  }
  return read_element(*this, off);
}

std::vector<double> Tensor::to_vector() const {
  REMAT_CHECK(device().type == DeviceType::cpu, "to_vector: tensor is on ", device_name(device()),
              " (copy it with .to(remat::kCpu))");
  std::vector<double> out;
  try {
    out.resize(static_cast<size_t>(numel()));
  } catch (const std::exception&) {  // bad_alloc or length_error: e.g. a huge expanded view
    throw OutOfMemory(detail::concat("to_vector: cannot hold the ", numel(), " elements of shape ", shape_str(shape()),
                                     " in a std::vector<double>"),
                      static_cast<size_t>(numel()) * sizeof(double));
  }
  const auto& s = shape();
  std::vector<int64_t> idx(s.size(), 0);
  for (size_t n = 0; n < out.size(); ++n) {
    int64_t off = offset();
    for (size_t i = 0; i < s.size(); ++i) off += idx[i] * strides()[i];
    out[n] = read_element(*this, off);
    for (size_t i = s.size(); i-- > 0;) {
      if (++idx[i] < s[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

Tensor Tensor::detach() const {
  auto alias = std::make_shared<TensorImpl>();
  alias->storage = impl().storage;
  alias->offset = impl().offset;
  alias->shape = impl().shape;
  alias->strides = impl().strides;
  alias->dtype = impl().dtype;
  alias->name = impl().name;
  alias->lineage = impl().lineage;  // the same value: how it was made still holds
  return Tensor(std::move(alias));
}

Tensor& Tensor::set_name(std::string name) {
  impl().name = std::move(name);
  return *this;
}

void Tensor::copy_(const Tensor& source) {
  REMAT_CHECK(source.defined(), "copy_: source is undefined");
  Shape b = broadcast_shapes(source.shape(), shape(), "copy_");
  REMAT_CHECK(b == shape(), "copy_: source of shape ", shape_str(source.shape()),
              " cannot be broadcast to destination shape ", shape_str(shape()));
  if (source.device() == device()) backend(device()).copy(source, *this);
  else copy_between_devices(source, *this);
  storage()->bump_version();
}

void Tensor::fill_(double value) {
  backend(device()).fill(*this, value);
  storage()->bump_version();
}

// ---- printing

std::string to_string(const Tensor& t, int max_per_axis) {
  if (!t.defined()) return "Tensor(undefined)";
  std::ostringstream out;
  out << "Tensor(shape=" << shape_str(t.shape()) << ", dtype=" << dtype_name(t.dtype());
  if (t.requires_grad()) out << ", requires_grad";
  out << ",\n  ";
  std::vector<double> values;
  if (t.device().type == DeviceType::cpu) {
    values = t.to_vector();
  } else {  // printing copies to the host
    Tensor host = detail::allocate_tensor("to_string", t.shape(), t.dtype(), memory::Tag::other, kCpu);
    copy_between_devices(t, host);
    values = host.to_vector();
  }
  const auto& s = t.shape();
  out << std::setprecision(t.dtype() == DType::f64 ? 10 : is_16bit_float(t.dtype()) ? 4 : 6);
  // Recursive pretty print with elision of long axes.
  std::function<void(size_t, size_t)> rec = [&](size_t axis, size_t base) {
    if (axis == s.size()) {
      out << values[base];
      return;
    }
    size_t stride = 1;
    for (size_t i = axis + 1; i < s.size(); ++i) stride *= static_cast<size_t>(s[i]);
    out << "[";
    int64_t n = s[axis];
    for (int64_t i = 0; i < n; ++i) {
      if (n > max_per_axis && i == max_per_axis / 2) {
        out << "...";
        i = n - max_per_axis / 2 - 1;
        if (i + 1 < n) out << ", ";
        continue;
      }
      rec(axis + 1, base + static_cast<size_t>(i) * stride);
      if (i + 1 < n) out << (axis + 1 == s.size() ? ", " : ",\n   ");
    }
    out << "]";
  };
  rec(0, 0);
  out << ")";
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) { return out << to_string(tensor); }

// ---- factories

namespace {
Tensor filled(const char* op, const Shape& shape, double value, DType dtype, memory::Tag tag, Device device) {
  Tensor t = detail::allocate_tensor(op, shape, dtype, tag, device);
  backend(device).fill(t, value);
  return t;
}
// A new tensor on `device` holding `count` host elements of `dtype` at `host`.
Tensor from_host(const char* op, const void* host, const Shape& shape, DType dtype, memory::Tag tag, Device device) {
  Tensor t = detail::allocate_tensor(op, shape, dtype, tag, device);
  if (t.nbytes() > 0) backend(device).copy_from_host(host, t);
  if (dtype == DType::i64) detail::note_index_range(t, static_cast<const int64_t*>(host));
  return t;
}
}  // namespace

Tensor full(const Shape& shape, double value, DType dtype, memory::Tag tag, Device device) {
  return filled("full", shape, value, dtype, tag, device);
}
Tensor zeros(const Shape& shape, DType dtype, memory::Tag tag, Device device) {
  return filled("zeros", shape, 0.0, dtype, tag, device);
}
Tensor ones(const Shape& shape, DType dtype, memory::Tag tag, Device device) {
  return filled("ones", shape, 1.0, dtype, tag, device);
}
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), memory::Tag::other, t.device()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype(), memory::Tag::other, t.device()); }
Tensor scalar_tensor(double value, DType dtype, Device device) { return full({}, value, dtype, memory::Tag::other, device); }

Tensor arange(double start, double stop, double step, DType dtype, Device device) {
  REMAT_CHECK(std::isfinite(start) && std::isfinite(stop) && std::isfinite(step), "arange: start, stop and step must be ",
              "finite, got start ", start, ", stop ", stop, ", step ", step);
  REMAT_CHECK(step != 0, "arange: step must be nonzero");
  const double count = std::ceil((stop - start) / step);  // may be inf when step is tiny
  REMAT_CHECK(!(count > static_cast<double>(kMaxElements)), "arange: [", start, ", ", stop, ") in steps of ", step,
              " has ", count, " elements, more than 2^60 = ", kMaxElements);
  const int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
  Tensor t = detail::allocate_tensor("arange", {n}, dtype, memory::Tag::other, device);
  backend(device).arange(t, start, step);
  if (dtype == DType::i64 && n > 0) {  // the kernels' rule: value i is int64(start + step * i)
    const auto first = static_cast<int64_t>(start), last = static_cast<int64_t>(start + step * static_cast<double>(n - 1));
    t.storage()->set_index_range(std::min(first, last), std::max(first, last));
  }
  return t;
}
Tensor arange(int64_t stop, DType dtype, Device device) {
  return arange(0.0, static_cast<double>(stop), 1.0, dtype, device);
}

Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype, memory::Tag tag, Device device) {
  check_shape(shape, "from_vector");
  REMAT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
              " values do not fill shape ", shape_str(shape));
  // for another device, a host staging buffer (tagged `other`) that is copied there
  const bool on_host = device.type == DeviceType::cpu;
  Tensor t = detail::allocate_tensor("from_vector", shape, dtype, on_host ? tag : memory::Tag::other, kCpu);
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::f32: t.data<float>()[i] = static_cast<float>(values[i]); break;
      case DType::f64: t.data<double>()[i] = values[i]; break;
      case DType::i64: t.data<int64_t>()[i] = static_cast<int64_t>(values[i]); break;
      case DType::bf16: t.data<bfloat16>()[i] = bfloat16(values[i]); break;
      case DType::f16: t.data<float16>()[i] = float16(values[i]); break;
    }
  }
  if (on_host) return t;
  return from_host("from_vector", t.raw_data(), shape, dtype, tag, device);
}

Tensor from_vector(const std::vector<float>& values, const Shape& shape, memory::Tag tag, Device device) {
  check_shape(shape, "from_vector");
  REMAT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
              " values do not fill shape ", shape_str(shape));
  return from_host("from_vector", values.data(), shape, DType::f32, tag, device);
}

Tensor from_indices(const std::vector<int64_t>& values, const Shape& shape, Device device) {
  check_shape(shape, "from_indices");
  REMAT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_indices: ", values.size(),
              " values do not fill shape ", shape_str(shape));
  return from_host("from_indices", values.data(), shape, DType::i64, memory::Tag::other, device);
}

}  // namespace remat
