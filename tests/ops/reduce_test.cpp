// Reductions against direct double-precision reference loops written here.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "test_util.h"

namespace kiln {
namespace {

using test::all_close;
using test::equal;
using test::random_int_tensor;
using test::random_tensor;
using test::throws_error;
using test::Tolerance;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Groups x's elements (row-major) by output element and applies f to each group, in double.
template <class V, class F>
std::vector<V> ref_groups(const Tensor& x, const std::vector<int64_t>& dims, F f, Shape& out_shape,
                          bool keepdim) {
  const int64_t nd = x.dim();
  std::vector<bool> mask(static_cast<size_t>(nd), dims.empty());
  for (int64_t d : dims) mask[static_cast<size_t>(d < 0 ? d + nd : d)] = true;
  out_shape.clear();
  Shape kept;
  for (int64_t d = 0; d < nd; ++d) {
    if (!mask[d]) kept.push_back(x.size(d));
    if (!mask[d]) out_shape.push_back(x.size(d));
    else if (keepdim) out_shape.push_back(1);
  }
  const std::vector<V> v = x.to_vector<V>();
  std::vector<std::vector<V>> groups(static_cast<size_t>(checked_numel(kept)));
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t rem = i, o = 0, mul = 1;
    for (int64_t d = nd - 1; d >= 0; --d) {
      const int64_t c = rem % x.size(d);
      rem /= x.size(d);
      if (!mask[d]) {
        o += c * mul;
        mul *= x.size(d);
      }
    }
    groups[static_cast<size_t>(o)].push_back(v[static_cast<size_t>(i)]);
  }
  std::vector<V> out;
  for (auto& g : groups) out.push_back(f(g));
  return out;
}

using RefFn = std::function<double(const std::vector<double>&)>;

Tensor reference(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const RefFn& f) {
  Shape s;
  auto v = ref_groups<double>(x, dims, f, s, keepdim);
  return from_vector<double>(v, s);
}

double ref_sum(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}
double ref_mean(const std::vector<double>& g) { return ref_sum(g) / static_cast<double>(g.size()); }
double ref_prod(const std::vector<double>& g) {
  double s = 1;
  for (double v : g) s *= v;
  return s;
}
double ref_max(const std::vector<double>& g) {
  double m = -kInf;
  for (double v : g) m = (std::isnan(v) || v > m) ? v : m;
  return std::isnan(m) ? m : m;
}
double ref_min(const std::vector<double>& g) {
  double m = kInf;
  for (double v : g) m = (std::isnan(v) || std::isnan(m) || v < m) ? (std::isnan(m) ? m : v) : m;
  return m;
}
double ref_var(const std::vector<double>& g, double correction) {
  const double m = ref_mean(g);
  double s = 0;
  for (double v : g) s += (v - m) * (v - m);
  return s / std::max(0.0, static_cast<double>(g.size()) - correction);
}
double ref_norm(const std::vector<double>& g, double p) {
  if (std::isinf(p)) {
    double m = p > 0 ? 0.0 : kInf;
    for (double v : g) m = p > 0 ? std::max(m, std::fabs(v)) : std::min(m, std::fabs(v));
    return m;
  }
  double s = 0;
  for (double v : g) s += p == 0 ? (v != 0) : std::pow(std::fabs(v), p);
  return p == 0 ? s : std::pow(s, 1.0 / p);
}
double ref_lse(const std::vector<double>& g) {
  double m = -kInf;
  for (double v : g) m = std::max(m, v);
  if (std::isinf(m)) return m;
  double s = 0;
  for (double v : g) s += std::exp(v - m);
  return m + std::log(s);
}

// The same logical [3, 4, 5, 6] input in four layouts.
std::vector<std::pair<std::string, Tensor>> layouts(DType dtype, double lo = -2.0, double hi = 2.0) {
  return {
      {"contiguous", random_tensor({3, 4, 5, 6}, dtype, lo, hi)},
      {"permuted", random_tensor({6, 4, 5, 3}, dtype, lo, hi).permute({3, 1, 2, 0})},
      {"sliced", random_tensor({3, 8, 5, 12}, dtype, lo, hi).slice(1, 0, 8, 2).slice(3, 1, 12, 2)},
      {"expanded", random_tensor({3, 1, 5, 1}, dtype, lo, hi).expand({3, 4, 5, 6})},
  };
}

const std::vector<std::vector<int64_t>> kDimSets = {{}, {3}, {0}, {2}, {0, 2}, {-1, -3}, {1, 2, 3}, {3, 0, 1, 2}};
const std::vector<DType> kFloats = {DType::F32, DType::F64, DType::F16, DType::BF16};

using OpFn = std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)>;

void check_against_reference(const char* name, const OpFn& op, const RefFn& ref,
                             std::optional<Tolerance> tol_f32 = std::nullopt, double lo = -2.0, double hi = 2.0) {
  for (DType dt : kFloats) {
    for (auto& [layout, x] : layouts(dt, lo, hi)) {
      for (const auto& dims : kDimSets) {
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(std::string(name) + " " + dtype_name(dt) + " " + layout + " dims " + shape_str(dims) +
                       (keepdim ? " keepdim" : ""));
          const Tensor got = op(x, dims, keepdim);
          EXPECT_EQ(got.dtype(), dt);
          std::optional<Tolerance> tol;
          if (dt == DType::F32) tol = tol_f32;
          // The reference is rounded to the result dtype so that a value beyond f16's range is inf on both sides.
          EXPECT_TRUE(all_close(got, reference(x, dims, keepdim, ref).to(dt), tol));
        }
      }
    }
  }
}

// ---- arithmetic reductions over dim sets ---------------------------------------------------------------

TEST(Sum, MatchesReferenceForFloatLayoutsAndDims) {
  check_against_reference("sum", [](const Tensor& x, auto& d, bool k) { return sum(x, d, k); }, ref_sum);
}

TEST(Mean, MatchesReferenceForFloatLayoutsAndDims) {
  check_against_reference("mean", [](const Tensor& x, auto& d, bool k) { return mean(x, d, k); }, ref_mean);
}

TEST(Prod, MatchesReferenceForFloatLayoutsAndDims) {
  // Values near 1 keep the product of 360 elements finite. f32 products accumulate in f32 (as PyTorch):
  // the error grows like n * eps, so the reference is matched to 1e-5 rather than 1.3e-6.
  check_against_reference("prod", [](const Tensor& x, auto& d, bool k) { return prod(x, d, k); }, ref_prod,
                          Tolerance{1e-5, 1e-5}, 0.95, 1.05);
}

TEST(AmaxAmin, MatchReferenceForFloatLayoutsAndDims) {
  check_against_reference("amax", [](const Tensor& x, auto& d, bool k) { return amax(x, d, k); }, ref_max);
  check_against_reference("amin", [](const Tensor& x, auto& d, bool k) { return amin(x, d, k); }, ref_min);
}

TEST(VarStd, MatchReferenceForFloatLayoutsAndDims) {
  check_against_reference("var", [](const Tensor& x, auto& d, bool k) { return var(x, d, 1, k); },
                          [](const std::vector<double>& g) { return ref_var(g, 1); });
  check_against_reference("var0", [](const Tensor& x, auto& d, bool k) { return var(x, d, 0, k); },
                          [](const std::vector<double>& g) { return ref_var(g, 0); });
  check_against_reference("std", [](const Tensor& x, auto& d, bool k) { return kiln::std(x, d, 1, k); },
                          [](const std::vector<double>& g) { return std::sqrt(ref_var(g, 1)); });
}

TEST(Norm, MatchesReferenceForEveryKindOfP) {
  for (double p : {2.0, 1.0, 3.0, 0.5, kInf, -kInf, 0.0, -1.5}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    check_against_reference("norm", [p](const Tensor& x, auto& d, bool k) { return norm(x, p, d, k); },
                            [p](const std::vector<double>& g) { return ref_norm(g, p); });
  }
}

TEST(LogSumExp, MatchesReferenceForFloatLayoutsAndDims) {
  check_against_reference("logsumexp", [](const Tensor& x, auto& d, bool k) { return logsumexp(x, d, k); },
                          ref_lse);
}

// ---- integers and bool ----------------------------------------------------------------------------------

TEST(Sum, IntegerAndBoolInputsGiveExactInt64) {
  struct Case {
    DType dt;
    int64_t lo, hi;
  };
  for (Case c : {Case{DType::I32, -100000, 100000}, Case{DType::U8, 0, 255}, Case{DType::I8, -128, 127},
                 Case{DType::I16, -30000, 30000}, Case{DType::Bool, 0, 1}, Case{DType::I64, -1000000, 1000000}}) {
    const Tensor base = random_int_tensor({6, 4, 5, 3}, c.dt, c.lo, c.hi);
    for (const Tensor& x : {base, base.permute({3, 1, 2, 0}), base.slice(0, 0, 6, 2)}) {
      for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {0}, {-1}, {0, 2}, {1, 2, 3}}) {
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(c.dt)) + " dims " + shape_str(dims));
          Shape s;
          auto exp_sum = ref_groups<int64_t>(x, dims, [](auto& g) {
            int64_t t = 0;
            for (auto v : g) t += v;
            return t;
          }, s, keepdim);
          EXPECT_TRUE(equal(sum(x, dims, keepdim), from_vector<int64_t>(exp_sum, s)));
          auto exp_max = ref_groups<int64_t>(x, dims, [](auto& g) { return *std::max_element(g.begin(), g.end()); },
                                             s, keepdim);
          EXPECT_TRUE(equal(amax(x, dims, keepdim), from_vector<int64_t>(exp_max, s).to(c.dt)));
          auto exp_min = ref_groups<int64_t>(x, dims, [](auto& g) { return *std::min_element(g.begin(), g.end()); },
                                             s, keepdim);
          EXPECT_TRUE(equal(amin(x, dims, keepdim), from_vector<int64_t>(exp_min, s).to(c.dt)));
        }
      }
    }
  }
}

TEST(Sum, IntegerExtremesWrapLikeInt64) {
  const int64_t mx = std::numeric_limits<int64_t>::max(), mn = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(sum(from_vector<int64_t>({mx, 1})).item<int64_t>(), mn);
  EXPECT_EQ(sum(from_vector<int64_t>({mn, mx})).item<int64_t>(), -1);
  // i32 values sum in i64, with no i32 overflow.
  EXPECT_EQ(sum(from_vector<int32_t>({INT32_MAX, INT32_MAX})).item<int64_t>(), 2LL * INT32_MAX);
  // Narrower dtype= wraps the result.
  const Tensor s32 = sum(from_vector<int32_t>({INT32_MAX, 1}), {}, false, DType::I32);
  EXPECT_EQ(s32.dtype(), DType::I32);
  EXPECT_EQ(s32.item<int64_t>(), INT32_MIN);
  const Tensor u = sum(from_vector<uint64_t>({1ULL << 63, (1ULL << 63) - 1}));
  EXPECT_EQ(u.dtype(), DType::U64);
  EXPECT_EQ(u.item<uint64_t>(), ~0ULL);
  EXPECT_EQ(prod(from_vector<int64_t>({1LL << 40, 1LL << 40})).item<int64_t>(), 0);
  EXPECT_EQ(prod(from_vector<int32_t>({-3, 5, 7})).dtype(), DType::I64);
  EXPECT_EQ(prod(from_vector<int32_t>({-3, 5, 7})).item<int64_t>(), -105);
  EXPECT_TRUE(equal(amax(from_vector<int64_t>({mn, mx, 0})), scalar_tensor(mx)));
  EXPECT_TRUE(equal(amin(from_vector<int64_t>({mn, mx, 0})), scalar_tensor(mn)));
  EXPECT_TRUE(equal(amax(from_vector<uint64_t>({~0ULL, 1})), scalar_tensor(~0ULL, DType::U64)));
  EXPECT_EQ(sum(from_vector<bool>({true, true, false})).item<int64_t>(), 2);
  EXPECT_EQ(sum(from_vector<bool>({true})).dtype(), DType::I64);
}

TEST(Sum, DtypeArgumentConvertsFirst) {
  const Tensor x = from_vector<int32_t>({1, 2, 4});
  const Tensor s = sum(x, {}, false, DType::F64);
  EXPECT_EQ(s.dtype(), DType::F64);
  EXPECT_EQ(s.item<double>(), 7.0);
  const Tensor m = mean(x, {}, false, DType::F32);
  EXPECT_EQ(m.dtype(), DType::F32);
  EXPECT_FLOAT_EQ(m.item<float>(), 7.0f / 3);
  const Tensor p = prod(from_vector<float>({1.5f, 2.f}), {}, false, DType::F64);
  EXPECT_EQ(p.dtype(), DType::F64);
  EXPECT_EQ(p.item<double>(), 3.0);
}

// ---- accuracy --------------------------------------------------------------------------------------------

TEST(Sum, TenMillionFloatsAreAccurate) {
  const Tensor x = full({10000000}, 0.1f, DType::F32);
  const double exact = 1e7 * static_cast<double>(0.1f);
  EXPECT_NEAR(sum(x).item<double>(), exact, exact * 1e-6);
  EXPECT_NEAR(mean(x).item<double>(), static_cast<double>(0.1f), 1e-6 * 0.1);
  // The same as one column per output (dim 0 of [N, 2]) and as rows.
  const Tensor cols = full({5000000, 2}, 0.1f, DType::F32);
  for (double v : sum(cols, {0}).to_vector<double>()) EXPECT_NEAR(v, exact / 2, exact / 2 * 1e-6);
  const Tensor rows = full({2, 5000000}, 0.1f, DType::F32);
  for (double v : sum(rows, {1}).to_vector<double>()) EXPECT_NEAR(v, exact / 2, exact / 2 * 1e-6);
}

TEST(Sum, HalfAccumulatesInFloat) {
  // 4096 * 1 in f16 accumulation would stall at 2048; the result (4096) is representable.
  EXPECT_EQ(sum(ones({4096}, DType::F16)).item<float>(), 4096.f);
  EXPECT_EQ(sum(ones({4096}, DType::BF16)).item<float>(), 4096.f);
  EXPECT_EQ(sum(ones({4096}, DType::F16)).dtype(), DType::F16);
}

TEST(Var, LargeOffsetIsAccurate) {
  // 1e8 + noise: sum(x^2)/n - mean^2 loses every digit here; Welford does not.
  const Tensor noise = random_tensor({100000}, DType::F64, -1.0, 1.0);
  std::vector<double> v = noise.to_vector<double>();
  for (double& e : v) e += 1e8;
  const Tensor x = from_vector<double>(v);
  EXPECT_TRUE(all_close(var(x), reference(x, {}, false, [](auto& g) { return ref_var(g, 1); })));
  const Tensor x32 = from_vector<double>(v, Shape{100, 1000}).to(DType::F32);
  // f32 inputs at 1e8 are multiples of 8: the variance of those exact values is what is checked.
  EXPECT_TRUE(all_close(var(x32, {1}), reference(x32, {1}, false, [](auto& g) { return ref_var(g, 1); })));
  EXPECT_TRUE(all_close(var(x32, {0}), reference(x32, {0}, false, [](auto& g) { return ref_var(g, 1); })));
}

TEST(Var, CorrectionBeyondCountGivesInfOrNan) {
  const Tensor x = from_vector<float>({1.f, 2.f});
  EXPECT_EQ(var(x, {}, 3).item<float>(), INFINITY);
  EXPECT_TRUE(std::isnan(var(from_vector<float>({1.f})).item<float>()));
  EXPECT_TRUE(std::isnan(var(from_vector<float>({1.f, 1.f}), {}, 2).item<float>()));
  EXPECT_EQ(kiln::std(from_vector<float>({1.f, 2.f, 4.f}), {}, 3).item<float>(), INFINITY);
  EXPECT_NEAR(var(from_vector<float>({1.f, 2.f, 4.f}), {}, 0.5).item<float>(), 4.666666666 / 2.5, 1e-6);
}

// ---- large shapes (parallel and split paths) -------------------------------------------------------------

TEST(Sum, LargeShapesMatchReferenceOnEveryPath) {
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
  };
  for (const Case& c : {Case{{300, 700}, {0}}, Case{{300, 700}, {1}}, Case{{200000, 3}, {0}},
                        Case{{3, 200000}, {1}}, Case{{40, 50, 60}, {0, 2}}, Case{{70000, 1}, {0}}}) {
    SCOPED_TRACE(shape_str(c.shape) + " dims " + shape_str(c.dims));
    const Tensor x = random_tensor(c.shape, DType::F32);
    EXPECT_TRUE(all_close(sum(x, c.dims), reference(x, c.dims, false, ref_sum)));
    EXPECT_TRUE(all_close(amax(x, c.dims), reference(x, c.dims, false, ref_max)));
    EXPECT_TRUE(all_close(var(x, c.dims), reference(x, c.dims, false, [](auto& g) { return ref_var(g, 1); })));
    EXPECT_TRUE(all_close(logsumexp(x, c.dims), reference(x, c.dims, false, ref_lse)));
    if (c.dims.size() == 1) {
      auto [val, idx] = max(x, c.dims[0]);
      EXPECT_TRUE(all_close(val, reference(x, c.dims, false, ref_max)));
      // The index points at the maximum.
      const auto xv = x.contiguous().to_vector<float>();
      const auto iv = idx.to_vector<int64_t>();
      const auto vv = val.to_vector<float>();
      const int64_t d = c.dims[0], inner = d == 0 ? x.size(1) : 1, stride = d == 0 ? x.size(1) : 1;
      for (size_t o = 0; o < iv.size(); ++o) {
        const int64_t base = d == 0 ? static_cast<int64_t>(o) : static_cast<int64_t>(o) * x.size(1);
        ASSERT_EQ(xv[static_cast<size_t>(base + iv[o] * stride)], vv[o]);
        (void)inner;
      }
    }
  }
}

// ---- max/min with indices, argmax/argmin ----------------------------------------------------------------

// Reference values and first-index of the extreme (NaN wins, first NaN) along dim d.
std::pair<Tensor, Tensor> ref_extreme(const Tensor& x, int64_t d, bool keepdim, bool is_max) {
  Shape s;
  auto idx = ref_groups<double>(x, {d}, [is_max](const std::vector<double>& g) {
    size_t best = 0;
    for (size_t i = 1; i < g.size(); ++i) {
      if (std::isnan(g[best])) break;
      if (std::isnan(g[i]) || (is_max ? g[i] > g[best] : g[i] < g[best])) best = i;
    }
    return static_cast<double>(best);
  }, s, keepdim);
  const Tensor vals = reference(x, {d}, keepdim, is_max ? RefFn(ref_max) : RefFn(ref_min));
  std::vector<int64_t> iv(idx.begin(), idx.end());
  return {vals, from_vector<int64_t>(iv, s)};
}

TEST(MaxDim, ValuesAndFirstIndicesMatchReference) {
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::U8}) {
    // Few distinct values so that ties are common; expanded layouts tie on every element.
    for (auto& [layout, x] : layouts(dt, 0, 4)) {
      for (int64_t d : {0, 1, 2, 3, -1, -3}) {
        for (bool keepdim : {false, true}) {
          for (bool is_max : {true, false}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " " + layout + " dim " + std::to_string(d) +
                         (is_max ? " max" : " min") + (keepdim ? " keepdim" : ""));
            auto [v, i] = is_max ? max(x, d, keepdim) : min(x, d, keepdim);
            auto [ev, ei] = ref_extreme(x, d, keepdim, is_max);
            EXPECT_EQ(v.dtype(), dt);
            EXPECT_TRUE(all_close(v, ev));
            EXPECT_TRUE(equal(i, ei));
            EXPECT_TRUE(equal(is_max ? argmax(x, d, keepdim) : argmin(x, d, keepdim), ei));
          }
        }
      }
    }
  }
}

TEST(MaxDim, NanWinsAndItsIndexIsReturned) {
  const Tensor x = from_vector<float>({1.f, NAN, 3.f, NAN, 7.f}, Shape{5});
  auto [v, i] = max(x, 0);
  EXPECT_TRUE(std::isnan(v.item<float>()));
  EXPECT_EQ(i.item<int64_t>(), 1);
  auto [v2, i2] = min(x, 0);
  EXPECT_TRUE(std::isnan(v2.item<float>()));
  EXPECT_EQ(i2.item<int64_t>(), 1);
  EXPECT_EQ(argmax(x).item<int64_t>(), 1);
  EXPECT_EQ(argmin(x).item<int64_t>(), 1);
  EXPECT_TRUE(std::isnan(amax(x).item<float>()));
  EXPECT_TRUE(std::isnan(amin(x).item<float>()));
  EXPECT_TRUE(std::isnan(max(x).item<float>()));
  EXPECT_TRUE(std::isnan(min(x).item<float>()));
  // A NaN late in a long row (past the parallel split) still wins.
  std::vector<float> big(200000, 1.f);
  big[150000] = NAN;
  big[170000] = NAN;
  big[10] = INFINITY;
  const Tensor b = from_vector<float>(big);
  EXPECT_EQ(argmax(b).item<int64_t>(), 150000);
  EXPECT_TRUE(std::isnan(amax(b).item<float>()));
}

TEST(MaxDim, TiesGiveFirstIndexEvenInLongRows) {
  std::vector<float> big(300000, 0.f);
  big[123456] = 5.f;
  big[234567] = 5.f;
  big[299999] = 5.f;
  big[7] = -1.f;
  big[200000] = -1.f;
  const Tensor b = from_vector<float>(big);
  EXPECT_EQ(argmax(b).item<int64_t>(), 123456);
  EXPECT_EQ(argmin(b).item<int64_t>(), 7);
  // Constant input: index 0 everywhere, also when each output is a column.
  EXPECT_TRUE(equal(argmax(zeros({100000, 3}), 0), zeros({3}, DType::I64)));
  EXPECT_TRUE(equal(argmin(full({4, 1000}, 2.f), 1), zeros({4}, DType::I64)));
  EXPECT_EQ(argmax(from_vector<float>({-INFINITY, -INFINITY})).item<int64_t>(), 0);
}

TEST(Argmax, WithoutDimIndexesTheFlattenedTensor) {
  const Tensor base = random_tensor({5, 7}, DType::F32);
  const Tensor x = base.t();  // non-contiguous: the index is into x's own row-major order
  const auto v = x.contiguous().to_vector<float>();
  const int64_t expect_max = std::max_element(v.begin(), v.end()) - v.begin();
  const int64_t expect_min = std::min_element(v.begin(), v.end()) - v.begin();
  EXPECT_EQ(argmax(x).item<int64_t>(), expect_max);
  EXPECT_EQ(argmin(x).item<int64_t>(), expect_min);
  EXPECT_EQ(argmax(x).dim(), 0);
  EXPECT_EQ(argmax(x, std::nullopt, true).sizes(), (Shape{1, 1}));
  EXPECT_EQ(max(x).item<float>(), v[static_cast<size_t>(expect_max)]);
  EXPECT_EQ(min(x).item<float>(), v[static_cast<size_t>(expect_min)]);
}

TEST(MaxDim, BoolInputsWorkButArgmaxRejectsThem) {
  const Tensor x = from_vector<bool>({false, true, true});
  auto [v, i] = max(x, 0);
  EXPECT_TRUE(equal(v, scalar_tensor(true)));
  EXPECT_EQ(i.item<int64_t>(), 1);
  EXPECT_TRUE(equal(amin(x), scalar_tensor(false)));
  EXPECT_TRUE(throws_error([&] { argmax(x); }, {"argmax", "does not support bool"}));
}

// ---- all / any -------------------------------------------------------------------------------------------

TEST(AllAny, MatchReferenceForEveryDtype) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::U8, DType::Bool,
                   DType::I64, DType::C64}) {
    Tensor base = random_int_tensor({4, 6, 5}, DType::I64, 0, 2).to(dt);
    for (const Tensor& x : {base, base.permute({2, 0, 1}), base.slice(1, 0, 6, 3)}) {
      for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {0}, {-1}, {0, 2}}) {
        for (bool keepdim : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + " dims " + shape_str(dims));
          const DType rt = dt == DType::U8 ? DType::U8 : DType::Bool;
          Tensor xr = x.to(DType::Bool).to(DType::F64);
          auto ra = reference(xr, dims, keepdim, [](auto& g) {
            return static_cast<double>(std::all_of(g.begin(), g.end(), [](double v) { return v != 0; }));
          });
          auto rn = reference(xr, dims, keepdim, [](auto& g) {
            return static_cast<double>(std::any_of(g.begin(), g.end(), [](double v) { return v != 0; }));
          });
          EXPECT_TRUE(equal(all(x, dims, keepdim), ra.to(rt)));
          EXPECT_TRUE(equal(any(x, dims, keepdim), rn.to(rt)));
        }
      }
    }
  }
}

TEST(AllAny, NanIsTrueAndNegativeZeroIsFalse) {
  EXPECT_TRUE(all(from_vector<float>({1.f, NAN})).item<bool>());
  EXPECT_FALSE(any(from_vector<float>({0.f, -0.f})).item<bool>());
  EXPECT_TRUE(all(empty({0}, DType::F32)).item<bool>());
  EXPECT_FALSE(any(empty({0}, DType::F32)).item<bool>());
  EXPECT_TRUE(equal(all(empty({0, 3}), {0}), ones({3}, DType::Bool)));
  EXPECT_TRUE(equal(any(empty({0, 3}), {0}), zeros({3}, DType::Bool)));
  EXPECT_TRUE(all(full({200000}, 1.f)).item<bool>());
  Tensor big = full({200000}, 1.f);
  big.slice(0, 199999, 200000).fill_(0.f);
  EXPECT_FALSE(all(big).item<bool>());
}

// ---- special values --------------------------------------------------------------------------------------

TEST(LogSumExp, StableAndExactForInfinities) {
  EXPECT_NEAR(logsumexp(from_vector<float>({1000.f, 1000.f}), {0}).item<double>(), 1000 + std::log(2.0), 1e-4);
  EXPECT_EQ(logsumexp(from_vector<float>({-INFINITY, -INFINITY}), {0}).item<float>(), -INFINITY);
  EXPECT_EQ(logsumexp(from_vector<float>({INFINITY, 1.f, INFINITY}), {0}).item<float>(), INFINITY);
  EXPECT_EQ(logsumexp(from_vector<float>({INFINITY, -INFINITY}), {0}).item<float>(), INFINITY);
  EXPECT_TRUE(std::isnan(logsumexp(from_vector<float>({1.f, NAN}), {0}).item<float>()));
  EXPECT_EQ(logsumexp(empty({0}), {0}).item<float>(), -INFINITY);
  const Tensor li = logsumexp(from_vector<int64_t>({1, 2}), {0});
  EXPECT_EQ(li.dtype(), DType::F32);
  EXPECT_NEAR(li.item<double>(), 2.3132617, 1e-6);
}

TEST(Sum, NanAndInfPropagate) {
  EXPECT_TRUE(std::isnan(sum(from_vector<float>({1.f, NAN})).item<float>()));
  EXPECT_TRUE(std::isnan(sum(from_vector<float>({INFINITY, -INFINITY})).item<float>()));
  EXPECT_EQ(sum(from_vector<float>({INFINITY, 1.f})).item<float>(), INFINITY);
  EXPECT_EQ(amax(from_vector<float>({-INFINITY, -1.f})).item<float>(), -1.f);
  EXPECT_TRUE(std::isnan(norm(from_vector<float>({1.f, NAN}), kInf).item<float>()));
  EXPECT_TRUE(std::isnan(var(from_vector<float>({1.f, INFINITY})).item<float>()));
  // Subnormals are summed, not flushed.
  const float sub = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(sum(from_vector<float>({sub, sub})).item<float>(), 2 * sub);
}

// ---- 0-d and zero-size -----------------------------------------------------------------------------------

TEST(Reduce, ZeroDimInputs) {
  const Tensor x = scalar_tensor(3.5f);
  for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {0}, {-1}}) {
    for (bool keepdim : {false, true}) {
      EXPECT_EQ(sum(x, dims, keepdim).dim(), 0);
      EXPECT_EQ(sum(x, dims, keepdim).item<float>(), 3.5f);
      EXPECT_EQ(mean(x, dims, keepdim).item<float>(), 3.5f);
      EXPECT_EQ(amax(x, dims, keepdim).item<float>(), 3.5f);
      EXPECT_EQ(norm(x, 2, dims, keepdim).item<float>(), 3.5f);
      EXPECT_EQ(logsumexp(x, dims, keepdim).item<float>(), 3.5f);
    }
  }
  auto [v, i] = max(x, 0);
  EXPECT_EQ(v.item<float>(), 3.5f);
  EXPECT_EQ(i.item<int64_t>(), 0);
  EXPECT_EQ(argmax(x, 0, true).dim(), 0);
  EXPECT_TRUE(std::isnan(var(x).item<float>()));
  EXPECT_EQ(var(x, {}, 0).item<float>(), 0.f);
  EXPECT_TRUE(throws_error([&] { sum(x, {1}); }, {"sum", "out of range"}));
  EXPECT_TRUE(throws_error([&] { sum(x, {0, -1}); }, {"sum", "appears multiple times"}));
}

TEST(Reduce, ZeroSizeInputsGiveIdentities) {
  const Tensor x = empty({0, 3});
  EXPECT_TRUE(equal(sum(x, {0}), zeros({3})));
  EXPECT_TRUE(equal(prod(x, {0}), ones({3})));
  EXPECT_EQ(sum(x).item<float>(), 0.f);
  EXPECT_EQ(prod(x).item<float>(), 1.f);
  EXPECT_EQ(sum(empty({0}, DType::I32)).item<int64_t>(), 0);
  EXPECT_EQ(prod(empty({0}, DType::I32)).item<int64_t>(), 1);
  EXPECT_TRUE(std::isnan(mean(x).item<float>()));
  EXPECT_TRUE(all_close(mean(x, {0}), full({3}, NAN)));
  EXPECT_TRUE(all_close(var(x, {0}), full({3}, NAN)));
  EXPECT_TRUE(equal(norm(x, 2, {0}), zeros({3})));
  EXPECT_TRUE(equal(norm(x, 0, {0}), zeros({3})));
  EXPECT_TRUE(all_close(logsumexp(x, {0}), full({3}, -INFINITY)));
  // Reducing the non-empty dim leaves an empty result.
  EXPECT_EQ(sum(x, {1}).sizes(), (Shape{0}));
  EXPECT_EQ(amax(x, {1}).sizes(), (Shape{0}));
  EXPECT_EQ(argmax(x, 1).sizes(), (Shape{0}));
  EXPECT_EQ(amax(x, {1}, true).sizes(), (Shape{0, 1}));
}

TEST(Reduce, KeepdimShapes) {
  const Tensor x = random_tensor({2, 3, 4, 5}, DType::F32);
  EXPECT_EQ(sum(x, {1, 3}, true).sizes(), (Shape{2, 1, 4, 1}));
  EXPECT_EQ(sum(x, {1, 3}, false).sizes(), (Shape{2, 4}));
  EXPECT_EQ(sum(x, {}, true).sizes(), (Shape{1, 1, 1, 1}));
  EXPECT_EQ(sum(x).dim(), 0);
  EXPECT_EQ(max(x, -2, true).second.sizes(), (Shape{2, 3, 1, 5}));
  EXPECT_EQ(argmin(x, 0).sizes(), (Shape{3, 4, 5}));
}

// ---- errors ----------------------------------------------------------------------------------------------

TEST(Reduce, InvalidCallsThrowNamedErrors) {
  const Tensor x = random_tensor({2, 3}, DType::F32);
  EXPECT_TRUE(throws_error([&] { sum(x, {2}); }, {"sum", "dim 2", "out of range"}));
  EXPECT_TRUE(throws_error([&] { amax(x, {-3}); }, {"amax", "out of range"}));
  EXPECT_TRUE(throws_error([&] { max(x, 5); }, {"max", "out of range"}));
  EXPECT_TRUE(throws_error([&] { sum(x, {0, -2}); }, {"sum", "dim 0 appears multiple times"}));
  EXPECT_TRUE(throws_error([&] { var(x, {1, 1}); }, {"var", "dim 1 appears multiple times"}));
  EXPECT_TRUE(throws_error([&] { mean(from_vector<int64_t>({1, 2})); },
                           {"mean(): could not infer output dtype", "Input dtype", "int64"}));
  EXPECT_TRUE(throws_error([&] { mean(from_vector<float>({1, 2}), {}, false, DType::I32); },
                           {"mean()", "Optional dtype", "int32"}));
  EXPECT_TRUE(throws_error([&] { mean(from_vector<bool>({true})); }, {"mean()", "bool"}));
  const Tensor e = empty({0, 3});
  EXPECT_TRUE(throws_error([&] { amax(e, {0}); }, {"amax", "reduction dim 0", "non-zero size"}));
  EXPECT_TRUE(throws_error([&] { amin(e, {0, 1}); }, {"amin", "reduction dim 0", "non-zero size"}));
  EXPECT_TRUE(throws_error([&] { max(e, 0); }, {"max", "reduction dim 0", "non-zero size"}));
  EXPECT_TRUE(throws_error([&] { max(e); }, {"max", "input.numel() == 0"}));
  EXPECT_TRUE(throws_error([&] { min(e); }, {"min", "input.numel() == 0"}));
  EXPECT_TRUE(throws_error([&] { amax(e); }, {"amax", "input.numel() == 0"}));
  EXPECT_TRUE(throws_error([&] { argmax(e); }, {"argmax", "input.numel() == 0"}));
  EXPECT_TRUE(throws_error([&] { argmin(e, 0); }, {"argmin", "reduction dim 0"}));
  EXPECT_TRUE(throws_error([&] { norm(e, kInf, {0}); }, {"norm", "dim 0", "no identity"}));
  EXPECT_TRUE(throws_error([&] { norm(e, -1, {0}); }, {"norm", "dim 0", "no identity"}));
  EXPECT_TRUE(throws_error([&] { var(from_vector<int64_t>({1, 2})); }, {"var", "floating point", "int64"}));
  EXPECT_TRUE(throws_error([&] { norm(from_vector<int64_t>({1, 2})); }, {"norm", "floating point", "int64"}));
  EXPECT_TRUE(throws_error([&] { sum(ones({2}, DType::F8E4M3)); }, {"sum", "float8_e4m3fn"}));
  EXPECT_TRUE(throws_error([&] { sum(Tensor()); }, {"sum", "undefined"}));
}

}  // namespace
}  // namespace kiln
