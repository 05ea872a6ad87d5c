#include "kiln/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "core/copy.h"

namespace kiln {

// ---- shapes ------------------------------------------------------------------------------------------

Shape contiguous_strides(const Shape& sizes) {
  Shape strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

int64_t checked_numel(const Shape& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, "negative dimension ", s, " in shape ", sizes);
    if (__builtin_mul_overflow(n, s, &n)) throw Error(str("shape ", sizes, " has more than 2^63 elements"));
  }
  return n;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  KILN_CHECK(dim >= lo && dim <= hi, op, ": dim ", dim, " is out of range for a tensor of ", ndim,
             " dims (expected ", lo, "..", hi, ")");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t sa = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t sb = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(sa == sb || sa == 1 || sb == 1, "shapes ", a, " and ", b, " cannot be broadcast together (dim ",
               i, ": ", sa, " vs ", sb, ")");
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

// ---- Tensor ------------------------------------------------------------------------------------------

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape sizes, Shape strides, int64_t storage_offset,
               DType dtype) {
  KILN_CHECK(storage != nullptr, "Tensor: null storage");
  KILN_CHECK(sizes.size() == strides.size(), "Tensor: sizes ", sizes, " and strides ", strides,
             " differ in length");
  KILN_CHECK(storage_offset >= 0, "Tensor: negative storage offset ", storage_offset);
  auto impl = std::make_shared<Impl>();
  impl->numel = checked_numel(sizes);
  // Every element must lie inside the storage (also for views made with as_strided).
  if (impl->numel > 0) {
    int64_t lo = storage_offset, hi = storage_offset;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t ext = (sizes[i] - 1) * strides[i];
      if (ext < 0) lo += ext;
      else hi += ext;
    }
    const int64_t cap = static_cast<int64_t>(storage->nbytes() / kiln::itemsize(dtype));
    KILN_CHECK(lo >= 0 && hi < cap, "Tensor: view of sizes ", sizes, ", strides ", strides, ", offset ",
               storage_offset, " reaches elements [", lo, ", ", hi, "] outside a storage of ", cap, " ",
               dtype_name(dtype), " elements");
  }
  impl->storage = std::move(storage);
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->offset = storage_offset;
  impl->dtype = dtype;
  impl_ = std::move(impl);
}

int64_t Tensor::size(int64_t d) const { return sizes()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (sizes()[i] == 1) continue;
    if (strides()[i] != expected) return numel() == 0;
    expected *= sizes()[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  return static_cast<char*>(storage()->data()) + storage_offset() * static_cast<int64_t>(itemsize());
}

std::string Tensor::meta() const {
  if (!defined()) return "undefined";
  return ::kiln::str(dtype_name(dtype()), shape_str(sizes()), " ", device().str());
}

// ---- views -------------------------------------------------------------------------------------------

namespace {
Shape infer_size(Shape sizes, int64_t numel, const Tensor& t) {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1) {
      KILN_CHECK(infer < 0, "view: only one dimension can be -1, got ", sizes);
      infer = static_cast<int64_t>(i);
    } else {
      KILN_CHECK(sizes[i] >= 0, "view: invalid size ", sizes[i], " in ", sizes);
      if (__builtin_mul_overflow(known, sizes[i], &known)) throw Error(str("view: shape ", sizes, " overflows"));
    }
  }
  if (infer >= 0) {
    KILN_CHECK(known != 0 && numel % known == 0, "view: shape ", sizes, " is invalid for ", t.meta(), " (",
               numel, " elements)");
    sizes[infer] = numel / known;
  } else {
    KILN_CHECK(known == numel, "view: shape ", sizes, " is invalid for ", t.meta(), " (", numel,
               " elements)");
  }
  return sizes;
}

// Strides for viewing (sizes, strides) as new_sizes without a copy, if possible (PyTorch's computeStride).
std::optional<Shape> view_strides(const Shape& sizes, const Shape& strides, const Shape& new_sizes) {
  if (sizes.empty()) return Shape(new_sizes.size(), 1);
  const int64_t numel = checked_numel(sizes);
  if (numel == 0) return contiguous_strides(new_sizes);
  Shape out(new_sizes.size());
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[d];
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}
}  // namespace

Tensor Tensor::view(Shape new_sizes) const {
  new_sizes = infer_size(std::move(new_sizes), numel(), *this);
  auto st = view_strides(sizes(), strides(), new_sizes);
  KILN_CHECK(st.has_value(), "view: cannot view ", meta(), " with strides ", strides(), " as ", new_sizes,
             " without a copy; use reshape");
  return Tensor(storage(), std::move(new_sizes), std::move(*st), storage_offset(), dtype());
}

Tensor Tensor::reshape(Shape new_sizes) const {
  new_sizes = infer_size(std::move(new_sizes), numel(), *this);
  if (auto st = view_strides(sizes(), strides(), new_sizes))
    return Tensor(storage(), std::move(new_sizes), std::move(*st), storage_offset(), dtype());
  return contiguous().view(std::move(new_sizes));
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  start_dim = wrap_dim(start_dim, dim(), "flatten");
  end_dim = wrap_dim(end_dim, dim(), "flatten");
  KILN_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " must not exceed end_dim ", end_dim);
  Shape s(sizes().begin(), sizes().begin() + start_dim);
  int64_t n = 1;
  for (int64_t i = start_dim; i <= end_dim; ++i) n *= sizes()[i];
  s.push_back(n);
  s.insert(s.end(), sizes().begin() + end_dim + 1, sizes().end());
  return reshape(std::move(s));
}

Tensor Tensor::permute(Shape dims) const {
  KILN_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: ", dims.size(), " dims given for ", meta());
  Shape ns(dim()), nst(dim());
  std::vector<bool> seen(dim(), false);
  for (int64_t i = 0; i < dim(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    KILN_CHECK(!seen[d], "permute: dim ", d, " repeats in ", dims);
    seen[d] = true;
    ns[i] = sizes()[d];
    nst[i] = strides()[d];
  }
  return Tensor(storage(), std::move(ns), std::move(nst), storage_offset(), dtype());
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  if (dim() == 0) {
    wrap_dim(d0, 0, "transpose");
    wrap_dim(d1, 0, "transpose");
    return *this;
  }
  d0 = wrap_dim(d0, dim(), "transpose");
  d1 = wrap_dim(d1, dim(), "transpose");
  Shape ns = sizes(), nst = strides();
  std::swap(ns[d0], ns[d1]);
  std::swap(nst[d0], nst[d1]);
  return Tensor(storage(), std::move(ns), std::move(nst), storage_offset(), dtype());
}

Tensor Tensor::t() const {
  KILN_CHECK(dim() <= 2, "t: expects a tensor of at most 2 dims, got ", meta());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::slice(int64_t d, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) const {
  KILN_CHECK(dim() > 0, "slice: cannot slice a 0-d tensor");
  d = wrap_dim(d, dim(), "slice");
  KILN_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = sizes()[d];
  auto clampi = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
  const int64_t s = start ? clampi(*start) : 0;
  const int64_t e = std::max(s, end ? clampi(*end) : n);
  Shape ns = sizes(), nst = strides();
  ns[d] = (e - s + step - 1) / step;
  nst[d] = strides()[d] * step;
  return Tensor(storage(), std::move(ns), std::move(nst), storage_offset() + s * strides()[d], dtype());
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  KILN_CHECK(dim() > 0, "narrow: cannot narrow a 0-d tensor");
  d = wrap_dim(d, dim(), "narrow");
  const int64_t n = sizes()[d];
  if (start < 0) start += n;
  KILN_CHECK(start >= 0 && length >= 0 && start <= n - length, "narrow: start ", start, " + length ", length,
             " exceeds dim ", d, " of size ", n, " in ", meta());
  return slice(d, start, start + length, 1);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  KILN_CHECK(dim() > 0, "select: cannot select on a 0-d tensor");
  d = wrap_dim(d, dim(), "select");
  const int64_t n = sizes()[d];
  KILN_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dim ", d, " of size ", n,
             " in ", meta());
  if (index < 0) index += n;
  Shape ns = sizes(), nst = strides();
  ns.erase(ns.begin() + d);
  nst.erase(nst.begin() + d);
  return Tensor(storage(), std::move(ns), std::move(nst), storage_offset() + index * strides()[d], dtype());
}

Tensor Tensor::expand(Shape target) const {
  KILN_CHECK(static_cast<int64_t>(target.size()) >= dim(), "expand: target ", target, " has fewer dims than ",
             meta());
  const size_t lead = target.size() - static_cast<size_t>(dim());
  Shape nst(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < lead) {
      KILN_CHECK(target[i] >= 0, "expand: new leading dim ", i, " cannot be ", target[i]);
      nst[i] = 0;
      continue;
    }
    const int64_t s = sizes()[i - lead];
    if (target[i] == -1) target[i] = s;
    if (s == target[i]) {
      nst[i] = strides()[i - lead];
    } else {
      KILN_CHECK(s == 1, "expand: the size of dim ", i - lead, " (", s, ") must be 1 to expand ", meta(),
                 " to ", target);
      nst[i] = 0;
    }
  }
  return Tensor(storage(), std::move(target), std::move(nst), storage_offset(), dtype());
}

Tensor Tensor::squeeze() const {
  Shape ns, nst;
  for (int64_t i = 0; i < dim(); ++i)
    if (sizes()[i] != 1) {
      ns.push_back(sizes()[i]);
      nst.push_back(strides()[i]);
    }
  return Tensor(storage(), std::move(ns), std::move(nst), storage_offset(), dtype());
}

Tensor Tensor::squeeze(int64_t d) const {
  if (dim() == 0) {
    wrap_dim(d, 0, "squeeze");
    return *this;
  }
  d = wrap_dim(d, dim(), "squeeze");
  if (sizes()[d] != 1) return *this;
  Shape ns = sizes(), nst = strides();
  ns.erase(ns.begin() + d);
  nst.erase(nst.begin() + d);
  return Tensor(storage(), std::move(ns), std::move(nst), storage_offset(), dtype());
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape ns = sizes(), nst = strides();
  const int64_t st = d < dim() ? sizes()[d] * strides()[d] : 1;
  ns.insert(ns.begin() + d, 1);
  nst.insert(nst.begin() + d, st);
  return Tensor(storage(), std::move(ns), std::move(nst), storage_offset(), dtype());
}

Tensor Tensor::as_strided(Shape ns, Shape nst, std::optional<int64_t> off) const {
  return Tensor(storage(), std::move(ns), std::move(nst), off.value_or(storage_offset()), dtype());
}

Tensor Tensor::view_as_dtype(DType t) const {
  KILN_CHECK(kiln::itemsize(t) == itemsize(), "view_as_dtype: cannot reinterpret ", meta(), " as ",
             dtype_name(t), " (element sizes differ)");
  return Tensor(storage(), sizes(), strides(), storage_offset(), t);
}

// ---- copies ------------------------------------------------------------------------------------------

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor out(allocate_storage(nbytes(), device()), sizes(), contiguous_strides(sizes()), 0, dtype());
  copy_tensor(out, *this);
  return out;
}

Tensor Tensor::to(Device d) const { return to(d, dtype()); }
Tensor Tensor::to(DType t) const { return to(device(), t); }
Tensor Tensor::to(Device d, DType t) const {
  if (d == device() && t == dtype()) return *this;
  Tensor out(allocate_storage(static_cast<size_t>(numel()) * kiln::itemsize(t), d), sizes(),
             contiguous_strides(sizes()), 0, t);
  copy_tensor(out, *this);
  return out;
}

Tensor& Tensor::copy_(const Tensor& src) {
  KILN_CHECK(src.defined(), "copy_: source is undefined");
  if (src.sizes() == sizes()) copy_tensor(*this, src);
  else copy_tensor(*this, src.expand(sizes()));
  return *this;
}

}  // namespace kiln
