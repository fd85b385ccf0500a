// remat/tensor.h - the Tensor handle: shape, strides, dtype, device and shared storage.
//
// A Tensor is a cheap handle (a shared pointer). Copying a Tensor copies the handle, not the
// data: `Tensor b = a;` makes b and a the same tensor, just as in PyTorch or Flashlight. Views
// (reshape of a contiguous tensor, permute, transpose, slice, expand) are new handles that share
// the storage; `contiguous()` and `clone()` copy.
//
//   using namespace remat;
//   Tensor x = randn({4, 3}, DType::f32, RngState{1, 0});   // seed 1: the same values every run
//   Tensor w = zeros({3, 2}).requires_grad_();
//   Tensor y = matmul(x, w).tanh();
//   y.sum().backward();            // w.grad() now holds dL/dw
//
// Storage is row-major with explicit strides (in elements). dtypes: f32 and f64 for values, i64
// for indices (targets, token ids, argmax results), and the 16-bit floats bf16 (bfloat16: float32's
// range, 8 bits of precision) and f16 (IEEE binary16), stored in 2 bytes and computed in float32:
// an op on them widens its inputs exactly, computes in float32 and rounds its results once (to
// nearest, ties to even; NaN stays NaN). Statistics of 16-bit tensors (norms' mean and rstd,
// attention's log-sum-exp, a loss) are float32 (accumulate_dtype).
//
// Limits: rank at most kMaxRank = 6; every dimension and every shape's element count at most
// kMaxElements = 2^60, with zero-size axes counted as 1 (so that strides fit as well), for views
// as for allocated tensors. Then every element offset and byte size fits in int64. A shape beyond
// these limits, a negative dimension, or an allocation that fails is a remat::Error naming the
// operation and the shape (remat::OutOfMemory for a failed allocation, with the bytes asked).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "remat/checked.h"
#include "remat/error.h"
#include "remat/memory.h"

namespace remat {

enum class DType : uint8_t { f32, f64, i64, bf16, f16 };
const char* dtype_name(DType dtype);  // "f32", "f64", "i64", "bf16", "f16"
size_t dtype_size(DType dtype);       // bytes per element: 4, 8, 8, 2, 2
inline bool is_16bit_float(DType d) { return d == DType::bf16 || d == DType::f16; }
inline bool is_floating(DType d) { return d == DType::f32 || d == DType::f64 || is_16bit_float(d); }
// The dtype arithmetic on d's values runs in, and that of the statistics ops keep of them: f32
// for bf16 and f16, d itself otherwise.
inline DType accumulate_dtype(DType d) { return is_16bit_float(d) ? DType::f32 : d; }

// The elements of bf16 and f16 tensors (data<bfloat16>(), data<float16>()): the bits, with exact
// conversions to float and double and correctly rounded ones from them (to nearest, ties to even,
// NaN kept as a quiet NaN, overflow to infinity; from double in one rounding, not two).
struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float value) : bits(from_float(value)) {}
  explicit bfloat16(double value);
  explicit bfloat16(int64_t value) : bfloat16(static_cast<double>(value)) {}
  explicit operator float() const;
  explicit operator double() const { return static_cast<float>(*this); }
  explicit operator int64_t() const { return static_cast<int64_t>(static_cast<float>(*this)); }
  static uint16_t from_float(float value);
};
struct float16 {
  uint16_t bits = 0;
  float16() = default;
  explicit float16(float value) : bits(from_float(value)) {}
  explicit float16(double value);
  explicit float16(int64_t value) : float16(static_cast<double>(value)) {}
  explicit float16(bfloat16 value) : float16(static_cast<float>(value)) {}
  explicit operator float() const;
  explicit operator double() const { return static_cast<float>(*this); }
  explicit operator int64_t() const { return static_cast<int64_t>(static_cast<float>(*this)); }
  explicit operator bfloat16() const { return bfloat16(static_cast<float>(*this)); }
  static uint16_t from_float(float value);
};

namespace detail {
// A float that rounds to the same 16-bit value as `value` does in one rounding: `value` cut to a
// float toward zero, with the last bit set when anything was cut (round to odd; a float keeps at
// least two bits more than bf16 and f16, so rounding it again is exact rounding of the double).
inline float round_to_odd_float(double value) {
  if (!(value == value)) return static_cast<float>(value);
  float f = static_cast<float>(value);
  if (std::abs(static_cast<double>(f)) > std::abs(value)) f = std::nextafter(f, 0.0f);
  if (static_cast<double>(f) != value) f = std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
  return f;
}
}  // namespace detail

inline uint16_t bfloat16::from_float(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: quiet
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline bfloat16::bfloat16(double value) : bits(from_float(detail::round_to_odd_float(value))) {}
inline bfloat16::operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

inline uint16_t float16::from_float(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (u >> 16) & 0x8000u, magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));  // NaN
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal of 2^-24 units, rounded by adding 2^23
    const float units = std::bit_cast<float>(magnitude) * 16777216.0f + 8388608.0f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(units) - 0x4b000000u));
  }
  const uint32_t rebiased = magnitude - 0x38000000u;  // exponent 127 -> 15
  return static_cast<uint16_t>(sign | ((rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13));
}
inline float16::float16(double value) : bits(from_float(detail::round_to_odd_float(value))) {}
inline float16::operator float() const {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16, exponent = (bits >> 10) & 0x1fu,
                 mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    const float v = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24, exact
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Where a tensor's storage lives. `emulated` is reserved for a test-only backend (tests/
// emulated_backend.h) that keeps its memory on the host but behaves as an accelerator would: its
// own allocator and counters, and no host access without an explicit copy. It proves the device
// seam on machines without a GPU; no backend for it is registered by the library.
enum class DeviceType : uint8_t { cpu, cuda, emulated };
inline constexpr int kDeviceTypeCount = 3;
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};
inline constexpr Device kCpu{};
std::string device_name(Device device);  // "cpu", "cuda:0", "emulated:0"

inline constexpr int kMaxRank = 6;
inline constexpr int64_t kMaxElements = int64_t{1} << 60;
using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;
std::string shape_str(const Shape& shape);
// The number of elements; throws remat::Error naming the shape if a dimension is negative or the
// count exceeds kMaxElements.
int64_t shape_numel(const Shape& shape);
// Row-major strides (in elements); throws like shape_numel if they would exceed kMaxElements.
Strides contiguous_strides(const Shape& shape);
// Throws remat::Error naming `op` and the shape unless the shape is within the limits above
// (rank <= kMaxRank, no negative dimension, element count within kMaxElements counting zero-size
// axes as 1).
void check_shape(const Shape& shape, const char* op);
// NumPy broadcasting of two shapes; throws remat::Error naming `op` if incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// A block of device memory with its accounting tag. Owned by shared_ptr; freed when the last
// tensor (or saved value) using it goes away.
class Storage {
 public:
  Storage(size_t bytes, memory::Tag tag, Device device);
  // Memory remat did not allocate (a file's pages mapped into the process by offload:DIR): the
  // allocator counts `bytes` under `tag` as it counts an allocation, and `release` runs instead
  // of a free when the storage ends.
  Storage(void* data, size_t bytes, memory::Tag tag, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  memory::Tag tag() const { return tag_; }
  // Changes the accounting tag of the whole block.
  void set_tag(memory::Tag tag);

  // Number of SavedTensors keeping this block for a backward pass; the first one moves an
  // `other` block to the `saved` account, the last one moves it back.
  void add_saved_reference();
  void remove_saved_reference();
  int saved_references() const { return saved_references_; }

  // Bumped by every in-place write, so a saved value can tell it was overwritten.
  uint64_t version() const { return version_; }
  void bump_version() {
    ++version_;
    if (version_watch_) *version_watch_ = version_;
    range_known_ = false;
  }
  // A copy of version() that follows every write and outlives the storage: a holder that let the
  // storage go (a saved value a recomputation will make again) still sees a write made before the
  // storage was freed.
  std::shared_ptr<const uint64_t> version_watch() const;
  // The smallest and largest value of an i64 block when they are known without reading it (it was
  // written from host values, or by arange); any in-place write forgets them. An index kernel of
  // a device that runs asynchronously then needs no check on the device.
  void set_index_range(int64_t lo, int64_t hi) {
    range_lo_ = lo, range_hi_ = hi;
    range_known_ = true;
  }
  bool index_range(int64_t& lo, int64_t& hi) const {
    if (range_known_) lo = range_lo_, hi = range_hi_;
    return range_known_;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  memory::Tag tag_;
  Device device_;
  memory::Allocator* allocator_;  // the device's, kept so that freeing never looks up a backend
  std::function<void()> release_;  // external memory only
  int saved_references_ = 0;
  uint64_t version_ = 0;
  mutable std::shared_ptr<uint64_t> version_watch_;  // made by the first version_watch()
  bool range_known_ = false;
  int64_t range_lo_ = 0, range_hi_ = 0;
};

namespace autodiff {
class Node;
}

class Tensor;
namespace detail {
// The dtype whose elements are T (float, double, int64_t, bfloat16, float16, const or not); other
// T do not compile.
template <class T>
constexpr DType dtype_of() {
  using U = std::remove_cv_t<T>;
  static_assert(std::is_same_v<U, float> || std::is_same_v<U, double> || std::is_same_v<U, int64_t> ||
                    std::is_same_v<U, bfloat16> || std::is_same_v<U, float16>,
                "Tensor::data<T>(): T must be float (f32), double (f64), int64_t (i64), bfloat16 (bf16) or "
                "float16 (f16)");
  if constexpr (std::is_same_v<U, float>) return DType::f32;
  else if constexpr (std::is_same_v<U, double>) return DType::f64;
  else if constexpr (std::is_same_v<U, bfloat16>) return DType::bf16;
  else if constexpr (std::is_same_v<U, float16>) return DType::f16;
  else return DType::i64;
}
// Throws the remat::Error of a data<T>() call that asked for `wanted` (or, with
// `contiguity`, of a contiguous_data<T>() call on a strided tensor).
[[noreturn]] void data_dtype_mismatch(const Tensor& t, DType wanted, bool contiguity);
// Host code may read a tensor's memory only on the CPU. For other devices data<T>() and
// raw_data() are for kernels: the backend dispatcher (src/tensor/dispatch.cpp) opens a
// DeviceKernelScope around every kernel call it forwards, and outside one a pointer to
// non-CPU memory is refused with a remat::Error that says to copy with .to(kCpu). (Process-wide:
// the scope is a test aid for backends whose memory the host can in fact read.)
void check_device_access(const Tensor& t);
class DeviceKernelScope {
 public:
  DeviceKernelScope();
  ~DeviceKernelScope();
  DeviceKernelScope(const DeviceKernelScope&) = delete;
  DeviceKernelScope& operator=(const DeviceKernelScope&) = delete;
};
}  // namespace detail

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Strides strides;     // in elements
  DType dtype = DType::f32;

  // autodiff metadata
  bool requires_grad = false;
  std::shared_ptr<autodiff::Node> grad_fn;   // null for leaves and constants
  uint32_t output_nr = 0;                    // which output of grad_fn this is
  std::weak_ptr<autodiff::Node> grad_accumulator;  // leaves: the node that accumulates into grad
  std::shared_ptr<TensorImpl> grad;          // leaves: accumulated gradient
  std::shared_ptr<void> lineage;             // dynamic rematerialization: how this value was made
  std::string name;                          // optional, for messages and weight files
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Allocates uninitialised storage (tag `other` unless given).
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, memory::Tag tag = memory::Tag::other,
                      Device device = {});

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Strides& strides() const { return impl().strides; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t axis) const;  // negative axes count from the end
  int64_t numel() const { return shape_numel(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  int64_t offset() const { return impl().offset; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }

  // The first element, typed: T is float for f32, double for f64, int64_t for i64, bfloat16 for
  // bf16, float16 for f16 (const allowed). A T that does not match dtype() throws remat::Error naming both; the pointer is to
  // a possibly strided layout (index with strides()). contiguous_data<T>() also requires
  // is_contiguous(), for kernels that read or write data[0 .. numel()) as a flat array.
  template <class T>
  T* data() const {
    const TensorImpl& i = impl();
    if (i.dtype != detail::dtype_of<T>()) detail::data_dtype_mismatch(*this, detail::dtype_of<T>(), false);
    if (i.storage->device().type != DeviceType::cpu) detail::check_device_access(*this);
    return static_cast<T*>(i.storage->data()) + i.offset;
  }
  template <class T>
  T* contiguous_data() const {
    T* p = data<T>();
    if (!is_contiguous()) detail::data_dtype_mismatch(*this, detail::dtype_of<T>(), true);
    return p;
  }
  void* raw_data() const;

  // Element access for tests and small tensors (converts to double); slow. CPU tensors only
  // (copy others with .to(kCpu) first).
  double item() const;                 // requires numel() == 1
  double at(const std::vector<int64_t>& index) const;
  std::vector<double> to_vector() const;  // row-major order
  template <class T>
  std::vector<T> to_vector_as() const {
    auto v = to_vector();
    return std::vector<T>(v.begin(), v.end());
  }

  // autodiff. The metadata lives in TensorImpl; the functions that act on the tape (requires_grad_,
  // grad, zero_grad, set_grad) are defined in src/autodiff/leaf.cpp and backward() in
  // src/autodiff/engine.cpp: the tensor layer does not know the tape.
  bool requires_grad() const { return impl().requires_grad; }
  // Marks a leaf as requiring grad; throws if called on a non-leaf.
  Tensor& requires_grad_(bool value = true);
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  const std::shared_ptr<autodiff::Node>& grad_fn() const { return impl().grad_fn; }
  Tensor grad() const;  // undefined if none accumulated yet
  void zero_grad();     // drops the accumulated gradient (frees its storage)
  // Replaces the accumulated gradient with a copy of `grad`, which must have this tensor's shape,
  // dtype and device (an undefined `grad` drops it, like zero_grad). The copy is a fresh
  // contiguous gradient buffer, so later backward passes never write into the caller's tensor.
  void set_grad(const Tensor& grad);
  // Back-propagates from this scalar (or with an explicit gradient) into leaves' grad().
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  // A new handle on the same storage with no autodiff history.
  Tensor detach() const;

  const std::string& name() const { return impl().name; }
  Tensor& set_name(std::string name);

  // Views (share storage; differentiable). These and the conversions below are ops: reshape, view,
  // permute, transpose, slice, expand, squeeze, unsqueeze, contiguous, clone and to() are defined in
  // src/autodiff/ops/views.cpp, the elementwise shorthands with their op families
  // (src/autodiff/ops/unary.cpp, reduce.cpp).
  Tensor reshape(const Shape& shape) const;   // copies if the layout does not allow a view
  Tensor view(const Shape& shape) const;      // requires a contiguous tensor
  Tensor permute(const std::vector<int64_t>& axes) const;
  Tensor transpose(int64_t axis0, int64_t axis1) const;
  Tensor slice(int64_t axis, int64_t start, int64_t stop, int64_t step = 1) const;
  Tensor expand(const Shape& shape) const;
  Tensor unsqueeze(int64_t axis) const;
  Tensor squeeze(int64_t axis) const;
  Tensor flatten() const { return reshape({numel()}); }
  Tensor contiguous() const;                  // itself if already contiguous
  Tensor clone() const;                       // always copies (differentiable)
  Tensor to(DType dtype) const;               // converts (differentiable between floating dtypes)
  // A copy on `device` (itself if already there); differentiable: the gradient goes back to this
  // tensor's device. The only way data crosses between host and device memory.
  Tensor to(Device device) const;

  // Elementwise shorthands (see remat/ops.h for the full set)
  Tensor sum() const;
  Tensor mean() const;
  Tensor tanh() const;
  Tensor exp() const;
  Tensor log() const;

  // In-place writes, never recorded on the tape (for optimisers and initialisers, under no-grad).
  void copy_(const Tensor& source);   // broadcasting copy into this tensor
  void fill_(double value);

  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);
std::string to_string(const Tensor& tensor, int max_per_axis = 6);

using TensorList = std::vector<Tensor>;

// Factories. Tag defaults to `other`; pass memory::Tag::parameter for model weights. Each takes the
// device to allocate on (default: the CPU); from_vector and from_indices copy the host values there.
Tensor zeros(const Shape& shape, DType dtype = DType::f32, memory::Tag tag = memory::Tag::other, Device device = {});
Tensor ones(const Shape& shape, DType dtype = DType::f32, memory::Tag tag = memory::Tag::other, Device device = {});
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, memory::Tag tag = memory::Tag::other,
            Device device = {});
Tensor arange(int64_t stop, DType dtype = DType::f32, Device device = {});
Tensor arange(double start, double stop, double step, DType dtype = DType::f32, Device device = {});
Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f32,
                   memory::Tag tag = memory::Tag::other, Device device = {});
Tensor from_vector(const std::vector<float>& values, const Shape& shape, memory::Tag tag = memory::Tag::other,
                   Device device = {});
Tensor from_indices(const std::vector<int64_t>& values, const Shape& shape, Device device = {});
Tensor scalar_tensor(double value, DType dtype = DType::f32, Device device = {});
Tensor zeros_like(const Tensor& t);  // t's shape, dtype and device
Tensor ones_like(const Tensor& t);

}  // namespace remat
