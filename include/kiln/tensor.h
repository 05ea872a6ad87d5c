// kiln::Tensor: a strided view of shared storage on one device.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln {

using Shape = std::vector<int64_t>;
class Stream;

// A block of device or host memory. Tensors share it; it is freed when the last one goes.
class Storage {
 public:
  Storage(std::shared_ptr<void> data, size_t nbytes, Device device)
      : data_(std::move(data)), nbytes_(nbytes), device_(device) {}
  void* data() const { return data_.get(); }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  // A promise that no kernel writes this memory any more (a model's weights once loaded; the engine marks
  // its own). CUDA kernels may then read it before the kernel ahead of them on the stream has finished: the
  // one-row matrix-vector products launch as dependents of that kernel and start streaming such weights
  // while it ends (docs/architecture.md, "Dependent launches"). Unmarked memory is read only after the kernel
  // ahead has finished, so a product may follow the op that wrote its weight. A kiln op that writes into the
  // memory (in place, out=, copy_, fill_, the cache appends) drops the mark first; writing marked memory by
  // other means (data_ptr, a caller's kernels) while later work that reads it may run is a race. Off by
  // default; views share their storage's mark.
  void set_constant(bool constant) { constant_.store(constant, std::memory_order_relaxed); }
  bool constant() const { return constant_.load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<void> data_;
  size_t nbytes_;
  Device device_;
  std::atomic<bool> constant_{false};
};

// Allocates storage on a device: aligned host memory, or the CUDA caching allocator.
std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device);
// Host storage over memory kiln did not allocate (a file mapping, a caller's buffer): `data` stays valid
// while `keep_alive` is held, and the storage holds it, so every tensor viewing the memory keeps it alive.
std::shared_ptr<Storage> wrap_host_memory(void* data, size_t nbytes, std::shared_ptr<const void> keep_alive);

// A number given to an op in place of a tensor ("wrapped number" in PyTorch): it takes part in type
// promotion only by its category (bool < integer < floating < complex), never by its width.
class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, UInt, Float, Complex };
  Scalar(bool v) : kind_(Kind::Bool), i_(v) {}
  Scalar(int v) : kind_(Kind::Int), i_(v) {}
  Scalar(long v) : kind_(Kind::Int), i_(v) {}
  Scalar(long long v) : kind_(Kind::Int), i_(v) {}
  Scalar(unsigned v) : kind_(Kind::Int), i_(v) {}
  Scalar(unsigned long v) : kind_(v > static_cast<unsigned long>(INT64_MAX) ? Kind::UInt : Kind::Int), u_(v) {}
  Scalar(unsigned long long v)
      : kind_(v > static_cast<unsigned long long>(INT64_MAX) ? Kind::UInt : Kind::Int), u_(v) {}
  Scalar(float v) : kind_(Kind::Float), d_(v) {}
  Scalar(double v) : kind_(Kind::Float), d_(v) {}
  Scalar(Complex64 v) : kind_(Kind::Complex), d_(v.re), im_(v.im) {}

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::Float; }
  bool is_integral() const { return kind_ == Kind::Int || kind_ == Kind::UInt || kind_ == Kind::Bool; }
  double to_double() const;
  int64_t to_int64() const;
  uint64_t to_uint64() const;
  Complex64 to_complex() const;
  // The dtype a 0-d tensor holding this value gets: bool, i64 (u64 above INT64_MAX), f64, c64.
  DType natural_dtype() const;
  std::string str() const;

 private:
  Kind kind_;
  union {
    int64_t i_;
    uint64_t u_;
    double d_;
  };
  float im_ = 0.f;
};

class Tensor;
std::ostream& operator<<(std::ostream& os, const Tensor& t);

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false and every other call throws

  // A tensor over existing storage.
  Tensor(std::shared_ptr<Storage> storage, Shape sizes, Shape strides, int64_t storage_offset, DType dtype);

  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const { return impl().sizes; }
  const Shape& strides() const { return impl().strides; }
  Shape shape() const { return impl().sizes; }
  int64_t size(int64_t dim) const;    // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(impl().sizes.size()); }
  int64_t numel() const { return impl().numel; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_cpu() const { return device().is_cpu(); }
  int64_t storage_offset() const { return impl().offset; }
  size_t itemsize() const { return kiln::itemsize(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(); }
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  bool is_contiguous() const;
  // True when this tensor and `other` may share memory.
  bool is_alias_of(const Tensor& other) const { return storage() == other.storage(); }

  // Address of element 0 (storage base + offset). T must match dtype(); void* skips the check.
  void* data_ptr() const;
  template <class T>
  T* data() const {
    KILN_CHECK(dtype_of<std::remove_const_t<T>>() == dtype(), "Tensor::data: tensor has dtype ",
               dtype_name(dtype()), ", asked for ", dtype_name(dtype_of<std::remove_const_t<T>>()));
    return static_cast<T*>(data_ptr());
  }

  // ---- views (share storage; no copy) ----
  Tensor view(Shape sizes) const;     // one dim may be -1; needs compatible strides
  Tensor reshape(Shape sizes) const;  // a view when possible, else a copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor permute(Shape dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // 2-d transpose (0-d and 1-d unchanged)
  Tensor slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor operator[](int64_t index) const { return select(0, index); }
  Tensor expand(Shape sizes) const;  // -1 keeps a size; new leading dims allowed
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor as_strided(Shape sizes, Shape strides, std::optional<int64_t> storage_offset = std::nullopt) const;
  Tensor view_as_dtype(DType dtype) const;  // reinterpret bits; itemsizes must match

  // ---- copies and conversions ----
  Tensor contiguous() const;  // this tensor if already contiguous
  Tensor clone() const;       // always a new contiguous tensor
  Tensor to(Device device) const;  // this tensor if already there
  Tensor to(DType dtype) const;    // this tensor if already that dtype
  Tensor to(Device device, DType dtype) const;
  Tensor cpu() const { return to(kCPU); }
  // Copies src into this tensor (broadcasting src to this shape, converting dtype, across devices).
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(const Scalar& value);
  Tensor& zero_();

  // The single value of a one-element tensor, converted to T (blocks on a device tensor).
  template <class T>
  T item() const;
  Scalar item() const;

  // The elements as a host vector of T (converted), in row-major order.
  template <class T>
  std::vector<T> to_vector() const;

  // Marks this CUDA tensor's memory as used by `stream` too: when the tensor is freed, the allocator does
  // not reuse the memory until the work enqueued on `stream` up to that point has completed.
  void record_stream(const Stream& stream) const;

  std::string str() const;  // "tensor([[1., 2.], ...], dtype=float32)" like PyTorch's repr
  std::string meta() const;  // "f32[2, 3] cpu" for error messages

 private:
  struct Impl {
    std::shared_ptr<Storage> storage;
    Shape sizes, strides;
    int64_t offset = 0;
    int64_t numel = 0;
    DType dtype = DType::F32;
  };
  const Impl& impl() const {
    if (!impl_) throw Error("operation on an undefined tensor");
    return *impl_;
  }
  std::shared_ptr<Impl> impl_;
};

// Contiguous (row-major) strides for a shape.
Shape contiguous_strides(const Shape& sizes);
// Product of sizes with overflow checking (throws kiln::Error past int64).
int64_t checked_numel(const Shape& sizes);
// Wraps a possibly negative dim into [0, ndim); throws with the op's name when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// Broadcast shape of two shapes (PyTorch rules); throws when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b);

}  // namespace kiln
