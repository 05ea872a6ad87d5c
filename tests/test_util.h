// Shared test helpers: fresh random inputs, poisoned outputs, comparison with dtype tolerances.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kiln/ops.h"

namespace kiln::test {

// A generator seeded differently on every run (the seed is printed on failure through SCOPED_TRACE by
// the callers that want it): tests must hold for any valid input, not one lucky draw.
inline std::mt19937_64& rng() {
  static std::mt19937_64 g(std::random_device{}());
  return g;
}

// True under compute-sanitizer (scripts/device-test.sh sets KILN_UNDER_SANITIZER in its sanitizer modes, where
// kernels run 10-100x slower): statistical tests then draw a few batches for memory and barrier safety and
// skip the statistics, which the plain run checks.
inline bool under_gpu_sanitizer() {
  const char* v = std::getenv("KILN_UNDER_SANITIZER");
  return v != nullptr && *v != '\0' && *v != '0';
}

// Host values uniform in [lo, hi) as a tensor of `dtype` (converted from f64).
inline Tensor random_tensor(const Shape& shape, DType dtype, double lo = -2.0, double hi = 2.0,
                            Device device = kCPU) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(checked_numel(shape)));
  for (auto& x : v) x = dist(rng());
  return from_vector<double>(v, shape).to(dtype).to(device);
}

// Random integers in [lo, hi] as `dtype`.
inline Tensor random_int_tensor(const Shape& shape, DType dtype, int64_t lo, int64_t hi, Device device = kCPU) {
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  std::vector<int64_t> v(static_cast<size_t>(checked_numel(shape)));
  for (auto& x : v) x = dist(rng());
  return from_vector<int64_t>(v, shape).to(dtype).to(device);
}

// Fills t with a value no correct kernel produces by accident (NaN for floats, 0x5A bytes otherwise).
inline void poison(Tensor& t) {
  if (is_floating(t.dtype()) || is_complex(t.dtype())) t.fill_(NAN);
  else if (t.dtype() == DType::Bool) t.fill_(true);
  else t.fill_(0x5A);
}

struct Tolerance {
  double rtol, atol;
};
// torch.testing's defaults per dtype.
inline Tolerance default_tolerance(DType t) {
  switch (t) {
    case DType::F16: return {1e-3, 1e-5};
    case DType::BF16: return {1.6e-2, 1e-5};
    case DType::F32: return {1.3e-6, 1e-5};
    case DType::C64: return {1.3e-6, 1e-5};
    case DType::F64: return {1e-7, 1e-7};
    case DType::F8E4M3: return {0.125, 1e-3};
    case DType::F8E5M2: return {0.25, 1e-3};
    default: return {0, 0};
  }
}

// Checks |actual - expected| <= atol + rtol * |expected| elementwise (NaN matches NaN, inf matches the
// same inf), shapes equal. Compares in f64 (complex: both parts).
inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected,
                                            std::optional<Tolerance> tol = std::nullopt) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << shape_str(actual.sizes()) << " != expected "
                                         << shape_str(expected.sizes());
  const Tolerance t = tol.value_or(default_tolerance(actual.dtype()));
  auto cmp = [&](const std::vector<double>& a, const std::vector<double>& e, const char* part)
      -> ::testing::AssertionResult {
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < a.size(); ++i) {
      const double x = a[i], y = e[i];
      bool ok;
      if (std::isnan(y)) ok = std::isnan(x);
      else if (std::isinf(y)) ok = x == y;
      else ok = std::fabs(x - y) <= t.atol + t.rtol * std::fabs(y);
      if (!ok) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++bad;
      }
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << bad << " of " << a.size() << " elements differ" << part
                                         << "; first at flat index " << first << ": got " << a[first]
                                         << ", expected " << e[first] << " (rtol " << t.rtol << ", atol "
                                         << t.atol << ")";
  };
  if (is_complex(actual.dtype()) || is_complex(expected.dtype())) {
    auto a = actual.to_vector<Complex64>(), e = expected.to_vector<Complex64>();
    std::vector<double> ar, ai, er, ei;
    for (auto& c : a) ar.push_back(c.re), ai.push_back(c.im);
    for (auto& c : e) er.push_back(c.re), ei.push_back(c.im);
    auto r = cmp(ar, er, " (real part)");
    if (!r) return r;
    return cmp(ai, ei, " (imaginary part)");
  }
  return cmp(actual.to_vector<double>(), expected.to_vector<double>(), "");
}

// all_close with tol for all but max_fraction of the elements, and with the looser `loose` for every element:
// for results where a few intermediate roundings may land on the other side of a boundary than the
// reference's (each such flip moves its outputs by a bounded amount).
inline ::testing::AssertionResult all_close_but_few(const Tensor& actual, const Tensor& expected, Tolerance tol,
                                                    Tolerance loose, double max_fraction) {
  auto r = all_close(actual, expected, loose);
  if (!r) return r;
  const auto a = actual.to_vector<double>(), e = expected.to_vector<double>();
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - e[i]) <= tol.atol + tol.rtol * std::fabs(e[i]))) ++bad;
  if (static_cast<double>(bad) <= max_fraction * static_cast<double>(a.size())) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.size() << " elements exceed rtol " << tol.rtol
                                       << ", atol " << tol.atol << " (at most " << max_fraction * 100
                                       << "% may, within rtol " << loose.rtol << ", atol " << loose.atol << ")";
}

// Exact equality of values and dtype (for integer and bool results).
inline ::testing::AssertionResult equal(const Tensor& actual, const Tensor& expected) {
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure() << "dtype " << dtype_name(actual.dtype()) << " != expected "
                                         << dtype_name(expected.dtype());
  return all_close(actual, expected, Tolerance{0, 0});
}

// Runs `fn` and checks it throws kiln::Error whose message contains every one of `parts`.
template <class F>
::testing::AssertionResult throws_error(F&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      if (msg.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << p << "\"";
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-kiln exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// The raw bits of every element (row-major), widened to u64: for bit-exact comparisons of floats.
inline std::vector<uint64_t> raw_bits(const Tensor& t) {
  std::vector<uint64_t> out;
  switch (itemsize(t.dtype())) {
    case 1: for (auto v : t.view_as_dtype(DType::U8).to_vector<uint8_t>()) out.push_back(v); break;
    case 2: for (auto v : t.view_as_dtype(DType::U16).to_vector<uint16_t>()) out.push_back(v); break;
    case 4: for (auto v : t.view_as_dtype(DType::U32).to_vector<uint32_t>()) out.push_back(v); break;
    default: for (auto v : t.view_as_dtype(DType::U64).to_vector<uint64_t>()) out.push_back(v); break;
  }
  return out;
}

// Distance in ulps between two floats of one dtype given as raw bits (`bits` wide; sign-magnitude mapped to a
// line, so +0 and -0 are 0 apart).
inline int64_t ulp_distance(uint64_t a, uint64_t b, int bits) {
  const uint64_t sign = uint64_t{1} << (bits - 1);
  auto key = [&](uint64_t v) {
    const int64_t mag = static_cast<int64_t>(v & (sign - 1));
    return (v & sign) ? -mag : mag;
  };
  const int64_t ka = key(a), kb = key(b);
  return ka > kb ? ka - kb : kb - ka;
}

// A view of a fresh buffer shaped [rows, cols] starting `offset` elements in (offset 1: misaligned rows),
// holding `values` (a contiguous [rows, cols] tensor), on `device`.
inline Tensor placed(const Tensor& values, int64_t offset, Device device) {
  const int64_t rows = values.size(0), cols = values.size(1);
  Tensor base = empty({rows * cols + offset}, values.dtype(), device);
  Tensor v = base.as_strided({rows, cols}, {cols, 1}, base.storage_offset() + offset);
  v.copy_(values.to(device));
  return v;
}

// Skips a CUDA test with a visible reason when no GPU can be used.
#define KILN_REQUIRE_CUDA()                                                        \
  do {                                                                             \
    if (!::kiln::cuda_available()) GTEST_SKIP() << "no usable CUDA device in this environment"; \
  } while (0)

// A process-wide setting (a get and a set function, e.g. of cuda/linear.h or cuda/moe.h) changed for a scope
// and restored at its end, also when an assertion ends the test early.
template <class V, V (*Get)(), void (*Set)(V)>
struct SettingScope {
  explicit SettingScope(V v) : before(Get()) { Set(v); }
  ~SettingScope() { Set(before); }
  V before;
};

}  // namespace kiln::test
