// Element access from the host: item, to_vector, fill_, printing.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "core/copy.h"
#include "core/dispatch.h"
#include "cpu/loops.h"
#include "kiln/tensor.h"
#if KILN_HAVE_CUDA
#include "cuda/backend.h"
#endif

namespace kiln {

namespace {
// Converts a Scalar to storage type T as PyTorch's fill does (from the scalar's own kind).
template <class T>
T scalar_to(const Scalar& s) {
  switch (s.kind()) {
    case Scalar::Kind::Bool: return convert<T>(s.to_int64() != 0);
    case Scalar::Kind::Int: return convert<T>(s.to_int64());
    case Scalar::Kind::UInt: return convert<T>(s.to_uint64());
    case Scalar::Kind::Float: return convert<T>(s.to_double());
    default: return convert<T>(s.to_complex());
  }
}
}  // namespace

Tensor& Tensor::fill_(const Scalar& value) {
  if (numel() == 0) return *this;
  note_write(*this);
  visit_dtype(dtype(), "fill_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = scalar_to<T>(value);
    if (is_cpu()) {
      cpu::StridedLoop<1> loop(sizes(), {this});
      loop.for_each_row([&](char* const* p, int64_t n, const int64_t* s) {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
      });
    } else {
#if KILN_HAVE_CUDA
      unsigned char bytes[sizeof(T)];
      std::memcpy(bytes, &v, sizeof(T));
      cuda::fill_bytes(*this, bytes, sizeof(T));
#endif
    }
  });
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0); }

template <class T>
T Tensor::item() const {
  KILN_CHECK(numel() == 1, "item: a tensor with ", numel(), " elements cannot be converted to a scalar (",
             meta(), ")");
  Tensor host = to(kCPU);
  return visit_dtype(dtype(), "item", [&](auto tag) -> T {
    using S = typename decltype(tag)::type;
    return convert<T>(*static_cast<const S*>(host.data_ptr()));
  });
}

Scalar Tensor::item() const {
  if (dtype() == DType::Bool) return Scalar(item<bool>());
  if (is_complex(dtype())) return Scalar(item<Complex64>());
  if (is_floating(dtype())) return Scalar(item<double>());
  if (dtype() == DType::U64) return Scalar(static_cast<unsigned long long>(item<uint64_t>()));
  return Scalar(static_cast<long long>(item<int64_t>()));
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(kCPU, dtype_of<T>()).contiguous();
  if constexpr (std::is_same_v<T, bool>) {
    const bool* p = static_cast<const bool*>(host.data_ptr());
    return std::vector<bool>(p, p + numel());
  } else {
    std::vector<T> out(static_cast<size_t>(numel()));
    if (numel() > 0) std::memcpy(out.data(), host.data_ptr(), host.nbytes());
    return out;
  }
}

#define KILN_INSTANTIATE_ACCESS(T)          \
  template T Tensor::item<T>() const;       \
  template std::vector<T> Tensor::to_vector<T>() const;
KILN_INSTANTIATE_ACCESS(bool)
KILN_INSTANTIATE_ACCESS(uint8_t)
KILN_INSTANTIATE_ACCESS(int8_t)
KILN_INSTANTIATE_ACCESS(int16_t)
KILN_INSTANTIATE_ACCESS(uint16_t)
KILN_INSTANTIATE_ACCESS(int32_t)
KILN_INSTANTIATE_ACCESS(uint32_t)
KILN_INSTANTIATE_ACCESS(int64_t)
KILN_INSTANTIATE_ACCESS(uint64_t)
KILN_INSTANTIATE_ACCESS(Half)
KILN_INSTANTIATE_ACCESS(BFloat16)
KILN_INSTANTIATE_ACCESS(float)
KILN_INSTANTIATE_ACCESS(double)
KILN_INSTANTIATE_ACCESS(Complex64)
KILN_INSTANTIATE_ACCESS(Float8_e4m3fn)
KILN_INSTANTIATE_ACCESS(Float8_e5m2)
#undef KILN_INSTANTIATE_ACCESS

// ---- printing ----------------------------------------------------------------------------------------

namespace {
std::string fmt_float(double v, bool int_mode, int precision) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  if (int_mode) std::snprintf(buf, sizeof buf, "%.0f.", v);
  else std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  return buf;
}
}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  Tensor host = to(kCPU).contiguous();
  const int64_t n = numel();
  // Element strings, then the nested bracket layout PyTorch prints (summarised past 1000 elements).
  std::vector<std::string> items(static_cast<size_t>(n));
  const bool floating = is_floating(dtype()) || is_complex(dtype());
  bool all_int = true, sci = false;
  double maxabs = 0, minabs = INFINITY;
  if (floating && !is_complex(dtype())) {
    auto vals = host.to_vector<double>();
    for (double v : vals) {
      if (!std::isfinite(v)) continue;
      if (v != std::nearbyint(v)) all_int = false;
      maxabs = std::max(maxabs, std::fabs(v));
      if (v != 0) minabs = std::min(minabs, std::fabs(v));
    }
    sci = maxabs >= 1e8 || (minabs < 1e-4 && !all_int);
    for (int64_t i = 0; i < n; ++i) {
      if (sci && std::isfinite(vals[i])) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.4e", vals[i]);
        items[i] = buf;
      } else {
        items[i] = fmt_float(vals[i], all_int, 4);
      }
    }
  } else if (is_complex(dtype())) {
    auto vals = host.to_vector<Complex64>();
    for (int64_t i = 0; i < n; ++i) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.4f%+.4fj", vals[i].re, vals[i].im);
      items[i] = buf;
    }
  } else if (dtype() == DType::Bool) {
    auto vals = host.to_vector<bool>();
    for (int64_t i = 0; i < n; ++i) items[i] = vals[i] ? "True" : "False";
  } else if (dtype() == DType::U64) {
    auto vals = host.to_vector<uint64_t>();
    for (int64_t i = 0; i < n; ++i) items[i] = std::to_string(vals[i]);
  } else {
    auto vals = host.to_vector<int64_t>();
    for (int64_t i = 0; i < n; ++i) items[i] = std::to_string(vals[i]);
  }
  size_t width = 0;
  for (auto& s : items) width = std::max(width, s.size());
  const bool summarize = n > 1000;
  const int64_t edge = 3;
  std::ostringstream os;
  os << "tensor(";
  // Recursive print over dims.
  auto rec = [&](auto&& self, int64_t d, int64_t offset, int indent) -> void {
    if (d == dim()) {
      const auto& s = items[static_cast<size_t>(offset)];
      os << std::string(width - s.size(), ' ') << s;
      return;
    }
    const int64_t sz = sizes()[d];
    const int64_t stride = contiguous_strides(sizes())[d];
    os << "[";
    for (int64_t i = 0; i < sz; ++i) {
      if (summarize && sz > 2 * edge && i == edge) {
        os << (d + 1 == dim() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
        i = sz - edge;
      }
      self(self, d + 1, offset + i * stride, indent + 1);
      if (i + 1 < sz) {
        if (d + 1 == dim()) os << ", ";
        else os << "," << std::string(static_cast<size_t>(dim() - d - 1), '\n') << std::string(indent + 1, ' ');
      }
    }
    os << "]";
  };
  if (n == 0 && dim() > 0) os << "[]";
  else rec(rec, 0, 0, 7);
  if (dtype() != DType::F32 && dtype() != DType::I64 && dtype() != DType::Bool)
    os << ", dtype=" << dtype_name(dtype());
  if (n == 0 && dim() > 0) os << ", size=" << shape_str(sizes());
  if (!is_cpu()) os << ", device='" << device().str() << "'";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace kiln
