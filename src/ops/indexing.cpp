// Indexing and data movement: cat, stack, split, split_with_sizes, chunk, index_select, gather, scatter,
// scatter_add, take, masked_fill. Argument checks, output allocation and restriding happen here; the CPU
// kernels in src/cpu/indexing.cpp only move elements.
//
// cat/stack/split/chunk are built from views and copy_ alone, so they work on every device. index_select,
// gather, take and scatter* run on CUDA through src/cuda/indexing.h: there the kernels check the index
// values (reporting a bad one at the next synchronisation) instead of this file reading them on the host.
#include <cfloat>
#include <cstring>
#include <limits>

#include "core/copy.h"
#include "core/dispatch.h"
#include "cpu/indexing.h"
#include "kiln/ops.h"

#if KILN_HAVE_CUDA
#include "cuda/binary.h"
#include "cuda/indexing.h"
#endif

namespace kiln {

namespace {

// For the ops with a CUDA path: only a build without the CUDA backend refuses CUDA tensors.
void check_backend(const char* op, const Tensor& t) {
#if !KILN_HAVE_CUDA
  KILN_CHECK(t.is_cpu(), op, ": no CUDA implementation yet (got ", t.meta(), ")");
#else
  (void)op;
  (void)t;
#endif
}


void check_index_dtype(const char* op, const Tensor& index) {
  KILN_CHECK(index.dtype() == DType::I64 || index.dtype() == DType::I32, op,
             ": expected an index tensor of dtype int64 or int32, got ", index.meta());
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.device() == b.device(), op, ": tensors must be on one device, got ", a.meta(), " and ", b.meta());
}

// 0-d tensors take part as 1-d tensors of one element, as in PyTorch's gather/scatter.
Tensor as_1d_if_0d(const Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

void check_indices_in_range(const char* op, const Tensor& index, int64_t dim, int64_t size, bool wrap_negative) {
  if (auto bad = cpu::find_bad_index(index, wrap_negative ? -size : 0, size)) {
    if (dim < 0)
      throw Error(str(op, ": index ", *bad, " is out of range for a tensor of ", size, " elements (valid: ",
                      wrap_negative ? -size : 0, "..", size - 1, ")"));
    throw Error(str(op, ": index ", *bad, " is out of bounds for dimension ", dim, " with size ", size));
  }
}

// No element of self may be reached through two positions: scattering into it would be ill-defined.
void check_no_internal_overlap(const char* op, const Tensor& self) {
  for (int64_t d = 0; d < self.dim(); ++d)
    KILN_CHECK(self.size(d) <= 1 || self.stride(d) != 0, op, ": self ", self.meta(), " with strides ",
               self.strides(), " has elements that share memory (an expanded tensor); clone it first");
}

// True when the finite value v lies outside what dtype t can hold (PyTorch's c10::overflows).
bool value_overflows(const Scalar& value, DType t) {
  if (t == DType::Bool || is_complex(t)) return false;
  if (value.kind() == Scalar::Kind::Complex) return value.to_complex().im != 0.f || value_overflows(value.to_complex().re, t);
  if (is_floating(t)) {
    if (t == DType::F64) return false;
    const double v = value.to_double();
    if (std::isinf(v) || std::isnan(v)) return false;
    const double max = t == DType::F16 ? 65504.0 : t == DType::BF16 ? 3.3895313892515355e38
                       : t == DType::F8E4M3 ? 448.0 : t == DType::F8E5M2 ? 57344.0 : static_cast<double>(FLT_MAX);
    return v < -max || v > max;
  }
  return visit_dtypes<kIntTypes>(t, "value check", [&](auto tag) -> bool {
    using T = typename decltype(tag)::type;
    using L = std::numeric_limits<T>;
    if (value.is_floating()) {
      const double v = value.to_double();
      return v < static_cast<double>(L::lowest()) || v > static_cast<double>(L::max());
    }
    if (value.kind() == Scalar::Kind::UInt) return value.to_uint64() > static_cast<uint64_t>(L::max());
    const int64_t v = value.to_int64();
    if constexpr (std::is_signed_v<T>) {
      return v < static_cast<int64_t>(L::min()) || v > static_cast<int64_t>(L::max());
    } else {
      // Unsigned targets accept negatives down to -max (they wrap), as PyTorch does.
      if (v >= 0) return static_cast<uint64_t>(v) > static_cast<uint64_t>(L::max());
      return static_cast<uint64_t>(-(v + 1)) + 1 > static_cast<uint64_t>(L::max());
    }
  });
}

// The bytes of `value` converted to dtype t (8 bytes of room: every dtype fits).
void value_bytes(const char* op, const Scalar& value, DType t, unsigned char* out) {
  KILN_CHECK(!value_overflows(value, t), op, ": value ", value.str(), " cannot be converted to ", dtype_name(t),
             " without overflow");
  Tensor v = full({}, value, t, kCPU);
  std::memcpy(out, v.data_ptr(), v.itemsize());
}

// x restrided to `shape` with stride 0 along dim: element i of the result is the start of x's line through
// i's coordinates off dim (requires shape[d] <= x.size(d) for d != dim).
Tensor restride_dim0(const Tensor& x, const Shape& shape, int64_t dim) {
  Shape st = x.strides();
  st[dim] = 0;
  return x.as_strided(shape, st);
}

}  // namespace

// ---- cat / stack ------------------------------------------------------------------------------------------

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  // PyTorch's legacy rule: 1-d tensors of size 0 are skipped for shape checks (but still promote).
  auto skipped = [](const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; };
  DType dtype = tensors[0].dtype();
  const Tensor* ref = nullptr;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.defined(), "cat: tensor ", i, " is undefined");
    KILN_CHECK(t.dim() > 0, "cat: zero-dimensional tensor (at position ", i, ") cannot be concatenated");
    check_same_device("cat", tensors[0], t);
    if (i > 0) dtype = promote_types(dtype, t.dtype());
    if (!ref && !skipped(t)) ref = &t;
  }
  if (!ref) {
    wrap_dim(dim, 1, "cat");
    return empty({0}, dtype, tensors[0].device());
  }
  const int64_t nd = ref->dim();
  dim = wrap_dim(dim, nd, "cat");
  Shape out_shape = ref->sizes();
  out_shape[dim] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (skipped(t)) continue;
    KILN_CHECK(t.dim() == nd, "cat: tensors must have the same number of dims: tensor 0 (first non-empty) is ",
               ref->meta(), ", tensor ", i, " is ", t.meta());
    for (int64_t d = 0; d < nd; ++d)
      KILN_CHECK(d == dim || t.size(d) == ref->size(d), "cat: sizes must match except in dim ", dim,
                 ": tensor ", i, " has shape ", t.sizes(), " but expected size ", ref->size(d), " at dim ", d,
                 " (as in shape ", ref->sizes(), ")");
    out_shape[dim] += t.size(dim);
  }
  Tensor out = empty(out_shape, dtype, tensors[0].device());
  int64_t off = 0;
  for (const Tensor& t : tensors) {
    if (skipped(t) || t.size(dim) == 0) continue;
    Tensor part = out.narrow(dim, off, t.size(dim));
    copy_tensor(part, t);  // converts to the promoted dtype; safe when t overlaps nothing of out (new)
    off += t.size(dim);
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  KILN_CHECK(tensors[0].defined(), "stack: tensor 0 is undefined");
  dim = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    KILN_CHECK(tensors[i].defined(), "stack: tensor ", i, " is undefined");
    KILN_CHECK(tensors[i].sizes() == tensors[0].sizes(), "stack: expects tensors of equal shape, but got ",
               tensors[0].sizes(), " at entry 0 and ", tensors[i].sizes(), " at entry ", i);
    parts.push_back(tensors[i].unsqueeze(dim));
  }
  return cat(parts, dim);
}

// ---- split / chunk ------------------------------------------------------------------------------------------

std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  KILN_CHECK(x.dim() > 0, "split_with_sizes: cannot split a 0-d tensor");
  dim = wrap_dim(dim, x.dim(), "split_with_sizes");
  int64_t total = 0;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, "split_with_sizes: sizes must be non-negative, got ", Shape(sizes));
    total += s;
  }
  KILN_CHECK(total == x.size(dim), "split_with_sizes: sizes ", Shape(sizes), " must sum exactly to ", x.size(dim),
             " (the size of dim ", dim, " of ", x.meta(), ")");
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  int64_t off = 0;
  for (int64_t s : sizes) {
    out.push_back(x.narrow(dim, off, s));
    off += s;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  KILN_CHECK(x.dim() > 0, "split: cannot split a 0-d tensor");
  dim = wrap_dim(dim, x.dim(), "split");
  KILN_CHECK(split_size >= 0, "split: split_size must be non-negative, got ", split_size);
  const int64_t n = x.size(dim);
  KILN_CHECK(split_size > 0 || n == 0, "split: split_size can only be 0 if the dim size is 0, but dim ", dim,
             " of ", x.meta(), " has size ", n);
  const int64_t count = split_size == 0 ? 1 : std::max<int64_t>((n + split_size - 1) / split_size, 1);
  std::vector<Tensor> out;
  out.reserve(count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t start = i * split_size;
    out.push_back(x.narrow(dim, start, std::min(split_size, n - start)));
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  KILN_CHECK(x.dim() > 0, "chunk: cannot chunk a 0-d tensor");
  KILN_CHECK(chunks > 0, "chunk: chunks must be greater than 0, got ", chunks);
  dim = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.size(dim);
  const int64_t split_size = (n + chunks - 1) / chunks;
  // An empty dim gives `chunks` empty pieces (PyTorch), not the single piece split would give.
  if (split_size == 0 && n == 0) return split_with_sizes(x, std::vector<int64_t>(chunks, 0), dim);
  return split(x, split_size, dim);
}

// ---- index_select / gather / take ------------------------------------------------------------------------

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_index_dtype("index_select", index);
  check_same_device("index_select", x, index);
  KILN_CHECK(index.dim() <= 1, "index_select: index must be a vector (0-d or 1-d), got ", index.meta());
  KILN_CHECK(x.dim() > 0 || index.numel() == 1, "index_select: index to a 0-d tensor can have only 1 value, got ",
             index.numel(), " values");
  check_backend("index_select", x);
  dim = wrap_dim(dim, x.dim(), "index_select");
  Tensor xs = as_1d_if_0d(x), idx = as_1d_if_0d(index);
  const int64_t size = xs.size(dim);
  if (x.is_cpu()) check_indices_in_range("index_select", idx, dim, size, false);
  Shape shape = xs.sizes();
  shape[dim] = idx.numel();
  Tensor out = empty(shape, x.dtype(), x.device());
  if (out.numel() > 0) {
    Shape ist(shape.size(), 0);
    ist[dim] = idx.stride(0);
    const Tensor src_r = restride_dim0(xs, shape, dim), idx_r = idx.as_strided(shape, ist);
#if KILN_HAVE_CUDA
    if (x.is_cuda())
      cuda::gather_elements(out, src_r, idx_r, xs.stride(dim), size, cuda::OpId::IndexSelect);
    else
#endif
      cpu::gather_elements(out, src_r, idx_r, xs.stride(dim));
  }
  if (x.dim() == 0) return out.reshape({});
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  check_index_dtype("gather", index);
  check_same_device("gather", x, index);
  check_backend("gather", x);
  Tensor xs = as_1d_if_0d(x), idx = as_1d_if_0d(index);
  dim = wrap_dim(dim, xs.dim(), "gather");
  if (index.numel() == 0) return empty(index.sizes(), x.dtype(), x.device());
  KILN_CHECK(idx.dim() == xs.dim(), "gather: index ", index.meta(), " must have as many dims as input ", x.meta());
  for (int64_t d = 0; d < xs.dim(); ++d)
    KILN_CHECK(d == dim || idx.size(d) <= xs.size(d), "gather: index ", index.sizes(),
               " must be no larger than input ", x.sizes(), " in every dim but ", dim, " (dim ", d, ")");
  if (x.is_cpu()) check_indices_in_range("gather", idx, dim, xs.size(dim), false);
  Tensor out = empty(idx.sizes(), x.dtype(), x.device());
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    cuda::gather_elements(out, restride_dim0(xs, idx.sizes(), dim), idx, xs.stride(dim), xs.size(dim),
                          cuda::OpId::Gather);
    return out.reshape(index.sizes());
  }
#endif
  cpu::gather_elements(out, restride_dim0(xs, idx.sizes(), dim), idx, xs.stride(dim));
  return out.reshape(index.sizes());
}

Tensor take(const Tensor& x, const Tensor& index) {
  check_index_dtype("take", index);
  check_same_device("take", x, index);
  check_backend("take", x);
  const int64_t n = x.numel();
  KILN_CHECK(n > 0 || index.numel() == 0, "take: cannot take from an empty tensor ", x.meta(), " (index ",
             index.meta(), ")");
  if (x.is_cpu()) check_indices_in_range("take", index, -1, n, true);
  Tensor out = empty(index.sizes(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    cuda::take(out, x, index);  // reads x through its strides: no contiguous copy
    return out;
  }
#endif
  Tensor flat = x.contiguous().reshape({n});
  cpu::gather_elements(out, flat.as_strided(index.sizes(), Shape(index.dim(), 0)), index, 1, n);
  return out;
}

// ---- scatter ----------------------------------------------------------------------------------------------

namespace {

// PyTorch's scatter shape rules; returns self/index/src as at least 1-d.
void check_scatter(const char* op, const Tensor& self, int64_t& dim, const Tensor& index, const Tensor* src) {
  check_index_dtype(op, index);
  check_same_device(op, self, index);
  if (src) {
    check_same_device(op, self, *src);
    KILN_CHECK(src->dtype() == self.dtype(), op, ": expected self and src to have the same dtype, got ",
               self.meta(), " and ", src->meta());
  }
  check_backend(op, self);
  const int64_t nd = std::max<int64_t>(self.dim(), 1);
  dim = wrap_dim(dim, nd, op);
  if (index.numel() == 0) return;
  const int64_t ind = std::max<int64_t>(index.dim(), 1);
  KILN_CHECK(ind == nd, op, ": index ", index.meta(), " must have as many dims as self ", self.meta());
  if (src)
    KILN_CHECK(std::max<int64_t>(src->dim(), 1) == nd, op, ": src ", src->meta(), " must have as many dims as self ",
               self.meta());
  Tensor s1 = as_1d_if_0d(self), i1 = as_1d_if_0d(index);
  for (int64_t d = 0; d < nd; ++d) {
    const bool ok = (d == dim || i1.size(d) <= s1.size(d)) && (!src || i1.size(d) <= as_1d_if_0d(*src).size(d));
    KILN_CHECK(ok, op, ": expected index ", index.sizes(), " to be no larger than self ", self.sizes(),
               " apart from dim ", dim, src ? " and no larger than src " : "", src ? src->sizes() : Shape{},
               " (dim ", d, ")");
  }
  if (self.is_cpu()) check_indices_in_range(op, i1, dim, s1.size(dim), false);
}

void scatter_into(const char* op, Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                  const void* value, bool add) {
  if (index.numel() == 0) return;
  KILN_CHECK(!add || (self.dtype() != DType::F8E4M3 && self.dtype() != DType::F8E5M2), op,
             ": float8 dtypes are not supported, got ", self.meta());
#if KILN_HAVE_CUDA
  if (self.is_cuda()) {
    // The launcher handles f16/bf16 sums itself (in an f32 copy on the device, rounded once).
    cuda::scatter_elements(as_1d_if_0d(self), dim, as_1d_if_0d(index), src.defined() ? as_1d_if_0d(src) : src,
                           value, add);
    return;
  }
#endif
  if (add && (self.dtype() == DType::F16 || self.dtype() == DType::BF16)) {
    // PyTorch 2.11's CPU scatter_add accumulates half types in float and rounds each element once
    // (3000 f16 ones into one slot give 3000, not the 2048 of per-addition rounding).
    Tensor self32 = self.to(DType::F32);
    scatter_into(op, self32, dim, index, src.to(DType::F32), value, add);
    self.copy_(self32);
    return;
  }
  cpu::scatter_elements(as_1d_if_0d(self), dim, as_1d_if_0d(index), src.defined() ? as_1d_if_0d(src) : src,
                        value, add);
}

}  // namespace

Tensor& scatter_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  check_scatter("scatter_", self, dim, index, &src);
  check_no_internal_overlap("scatter_", self);
  note_write(self);
  scatter_into("scatter_", self, dim, index, src, nullptr, false);
  return self;
}

Tensor& scatter_add_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  check_scatter("scatter_add_", self, dim, index, &src);
  check_no_internal_overlap("scatter_add_", self);
  note_write(self);
  scatter_into("scatter_add_", self, dim, index, src, nullptr, true);
  return self;
}

Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  check_scatter("scatter", x, dim, index, &src);
  Tensor out = x.clone();
  scatter_into("scatter", out, dim, index, src, nullptr, false);
  return out;
}

Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Scalar& value) {
  check_scatter("scatter", x, dim, index, nullptr);
  unsigned char bytes[8];
  value_bytes("scatter", value, x.dtype(), bytes);
  Tensor out = x.clone();
  scatter_into("scatter", out, dim, index, Tensor(), bytes, false);
  return out;
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  check_scatter("scatter_add", x, dim, index, &src);
  Tensor out = x.clone();
  scatter_into("scatter_add", out, dim, index, src, nullptr, true);
  return out;
}

// ---- masked_fill ------------------------------------------------------------------------------------------

Tensor masked_fill(const Tensor& x, const Tensor& mask, const Scalar& value) {
  KILN_CHECK(mask.dtype() == DType::Bool, "masked_fill: only boolean masks are supported, got mask ", mask.meta());
  check_same_device("masked_fill", x, mask);
  check_backend("masked_fill", x);
  unsigned char bytes[8];
  value_bytes("masked_fill", value, x.dtype(), bytes);
  // Out of place, x and mask broadcast together (as torch.masked_fill does).
  const Shape shape = broadcast_shapes(x.sizes(), mask.sizes());
  Tensor out = empty(shape, x.dtype(), x.device());
  if (out.numel() == 0) return out;
  copy_tensor(out, x.expand(shape));
#if KILN_HAVE_CUDA
  if (out.is_cuda()) {
    cuda::masked_fill(out, mask.expand(shape), bytes);  // the CUDA kernel of the binary family (src/cuda/compare.cu)
    return out;
  }
#endif
  cpu::masked_fill(out, mask.expand(shape), bytes);
  return out;
}

}  // namespace kiln
