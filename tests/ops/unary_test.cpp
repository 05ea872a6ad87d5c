// Unary elementwise ops against direct double-precision reference loops.
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace kiln {
namespace {

using test::all_close;
using test::equal;
using test::random_int_tensor;
using test::random_tensor;
using test::throws_error;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
const std::vector<DType> kFloatDTypes = {DType::F32, DType::F64, DType::F16, DType::BF16};

using Op = Tensor (*)(const Tensor&);
using Ref = double (*)(double);

double gelu_erf_ref(double x) { return x * 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  const double inner = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(inner));
}

struct FloatCase {
  const char* name;
  Op op;
  Ref ref;
  double lo, hi;  // a domain where the op is defined and well conditioned
};

// Every op that maps a float to a float of the same dtype.
const std::vector<FloatCase>& float_cases() {
  static const std::vector<FloatCase> cases = {
      {"neg", kiln::neg, [](double x) { return -x; }, -3, 3},
      {"abs", kiln::abs, [](double x) { return std::fabs(x); }, -3, 3},
      {"square", kiln::square, [](double x) { return x * x; }, -3, 3},
      {"sign", kiln::sign, [](double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }, -3, 3},
      {"relu", kiln::relu, [](double x) { return x < 0 ? 0.0 : x; }, -3, 3},
      {"exp", kiln::exp, [](double x) { return std::exp(x); }, -10, 10},
      {"exp2", kiln::exp2, [](double x) { return std::exp2(x); }, -10, 10},
      {"expm1", kiln::expm1, [](double x) { return std::expm1(x); }, -3, 3},
      {"log", kiln::log, [](double x) { return std::log(x); }, 0.01, 10},
      {"log2", kiln::log2, [](double x) { return std::log2(x); }, 0.01, 10},
      {"log10", kiln::log10, [](double x) { return std::log10(x); }, 0.01, 10},
      {"log1p", kiln::log1p, [](double x) { return std::log1p(x); }, -0.9, 5},
      {"sqrt", kiln::sqrt, [](double x) { return std::sqrt(x); }, 0, 10},
      {"rsqrt", kiln::rsqrt, [](double x) { return 1.0 / std::sqrt(x); }, 0.01, 10},
      {"reciprocal", kiln::reciprocal, [](double x) { return 1.0 / x; }, -3, 3},
      {"sin", kiln::sin, [](double x) { return std::sin(x); }, -4, 4},
      {"cos", kiln::cos, [](double x) { return std::cos(x); }, -4, 4},
      {"tan", kiln::tan, [](double x) { return std::tan(x); }, -1.5, 1.5},
      {"asin", kiln::asin, [](double x) { return std::asin(x); }, -1, 1},
      {"acos", kiln::acos, [](double x) { return std::acos(x); }, -1, 1},
      {"atan", kiln::atan, [](double x) { return std::atan(x); }, -5, 5},
      {"sinh", kiln::sinh, [](double x) { return std::sinh(x); }, -5, 5},
      {"cosh", kiln::cosh, [](double x) { return std::cosh(x); }, -5, 5},
      {"tanh", kiln::tanh, [](double x) { return std::tanh(x); }, -5, 5},
      {"erf", kiln::erf, [](double x) { return std::erf(x); }, -3, 3},
      {"sigmoid", kiln::sigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, -10, 10},
      {"silu", kiln::silu, [](double x) { return x / (1.0 + std::exp(-x)); }, -10, 10},
      {"gelu", [](const Tensor& x) { return kiln::gelu(x); }, gelu_erf_ref, -6, 6},
      {"gelu_tanh", [](const Tensor& x) { return kiln::gelu(x, "tanh"); }, gelu_tanh_ref, -6, 6},
      {"floor", kiln::floor, [](double x) { return std::floor(x); }, -5, 5},
      {"ceil", kiln::ceil, [](double x) { return std::ceil(x); }, -5, 5},
      {"trunc", kiln::trunc, [](double x) { return std::trunc(x); }, -5, 5},
      {"round", [](const Tensor& x) { return kiln::round(x); }, [](double x) { return std::nearbyint(x); }, -5, 5},
  };
  return cases;
}

// The reference computed in f64 from the input's (already rounded) values, rounded to the result dtype
// as PyTorch's own tests do.
Tensor reference(const Tensor& x, Ref ref, DType out) {
  auto v = x.to_vector<double>();
  for (auto& e : v) e = ref(e);
  return from_vector<double>(v, x.sizes()).to(out);
}

// Edge values: NaN, infinities, signed zeros, subnormals of the dtype, tiny/huge numbers.
Tensor edge_tensor(DType dt) {
  const double sub = dt == DType::F64 ? 5e-320 : dt == DType::F32 ? 1e-40 : dt == DType::F16 ? 6e-8 : 1e-39;
  std::vector<double> v = {kNan, kInf, -kInf, 0.0, -0.0, sub, -sub, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5,
                           1e4, -1e4, 1e30, -1e30, 88.0, -88.0, 1e-3};
  return from_vector<double>(v).to(dt);
}

TEST(UnaryFloat, MatchesDoubleReferenceForEveryFloatDtype) {
  for (DType dt : kFloatDTypes) {
    for (const auto& c : float_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      Tensor x = random_tensor({17, 33}, dt, c.lo, c.hi);
      Tensor y = c.op(x);
      ASSERT_EQ(y.dtype(), dt);
      EXPECT_TRUE(all_close(y, reference(x, c.ref, dt)));
    }
  }
}

TEST(UnaryFloat, EdgeValuesMatchReference) {
  for (DType dt : kFloatDTypes) {
    for (const auto& c : float_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      Tensor x = edge_tensor(dt);
      EXPECT_TRUE(all_close(c.op(x), reference(x, c.ref, dt)));
    }
  }
}

TEST(UnaryFloat, NonContiguousAndBroadcastInputs) {
  for (DType dt : {DType::F32, DType::F16}) {
    for (const auto& c : float_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      Tensor base = random_tensor({20, 13}, dt, c.lo, c.hi);
      Tensor transposed = base.t();                           // [13, 20], strides (1, 13)
      Tensor stepped = base.slice(0, 1, std::nullopt, 3).slice(1, 2, 11, 2);  // both dims strided
      Tensor expanded = base.slice(0, 0, 1).expand({5, 13});  // stride 0
      Tensor column = base.select(1, 4);                      // 1-d, stride 13
      for (const Tensor& x : {transposed, stepped, expanded, column}) {
        Tensor y = c.op(x);
        ASSERT_EQ(y.sizes(), x.sizes());
        EXPECT_TRUE(all_close(y, reference(x, c.ref, dt)));
      }
    }
  }
}

TEST(UnaryFloat, ZeroDimAndZeroSize) {
  for (const auto& c : float_cases()) {
    SCOPED_TRACE(c.name);
    Tensor s = scalar_tensor(0.5 * (c.lo + c.hi) + 0.25, DType::F32);
    Tensor y = c.op(s);
    EXPECT_EQ(y.dim(), 0);
    EXPECT_TRUE(all_close(y, reference(s, c.ref, DType::F32)));
    Tensor e = empty({0, 3}, DType::F64);
    Tensor z = c.op(e);
    EXPECT_EQ(z.sizes(), (Shape{0, 3}));
    EXPECT_EQ(z.dtype(), DType::F64);
  }
}

TEST(UnaryFloat, LargeInputsRunInParallel) {
  // Past the loops' parallel grain: every thread's chunk must land in the right place.
  Tensor x = random_tensor({300, 257}, DType::F32, -5, 5);
  EXPECT_TRUE(all_close(kiln::tanh(x), reference(x, [](double v) { return std::tanh(v); }, DType::F32)));
  EXPECT_TRUE(all_close(kiln::exp(x.t()), reference(x.t(), [](double v) { return std::exp(v); }, DType::F32)));
}

// Float ops on integer and bool inputs compute in (and return) float32.
TEST(UnaryFloat, IntegerAndBoolInputsGiveFloat32) {
  struct C {
    const char* name;
    Op op;
    Ref ref;
    int64_t lo, hi;
  };
  const std::vector<C> cases = {
      {"exp", kiln::exp, [](double x) { return std::exp(x); }, -5, 5},
      {"exp2", kiln::exp2, [](double x) { return std::exp2(x); }, -5, 5},
      {"expm1", kiln::expm1, [](double x) { return std::expm1(x); }, -5, 5},
      {"log", kiln::log, [](double x) { return std::log(x); }, 0, 100},
      {"log2", kiln::log2, [](double x) { return std::log2(x); }, 0, 100},
      {"log10", kiln::log10, [](double x) { return std::log10(x); }, 0, 100},
      {"log1p", kiln::log1p, [](double x) { return std::log1p(x); }, 0, 100},
      {"sqrt", kiln::sqrt, [](double x) { return std::sqrt(x); }, 0, 100},
      {"rsqrt", kiln::rsqrt, [](double x) { return 1.0 / std::sqrt(x); }, 0, 100},
      {"reciprocal", kiln::reciprocal, [](double x) { return 1.0 / x; }, -5, 5},
      {"sin", kiln::sin, [](double x) { return std::sin(x); }, -5, 5},
      {"cos", kiln::cos, [](double x) { return std::cos(x); }, -5, 5},
      {"tan", kiln::tan, [](double x) { return std::tan(x); }, -5, 5},
      {"asin", kiln::asin, [](double x) { return std::asin(x); }, -1, 1},
      {"acos", kiln::acos, [](double x) { return std::acos(x); }, -1, 1},
      {"atan", kiln::atan, [](double x) { return std::atan(x); }, -5, 5},
      {"sinh", kiln::sinh, [](double x) { return std::sinh(x); }, -5, 5},
      {"cosh", kiln::cosh, [](double x) { return std::cosh(x); }, -5, 5},
      {"tanh", kiln::tanh, [](double x) { return std::tanh(x); }, -5, 5},
      {"sigmoid", kiln::sigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, -5, 5},
      {"erf", kiln::erf, [](double x) { return std::erf(x); }, -5, 5},
  };
  for (const auto& c : cases) {
    for (DType dt : {DType::I8, DType::U8, DType::I16, DType::I32, DType::I64, DType::U32, DType::Bool}) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      const bool unsigned_ = is_unsigned(dt);
      Tensor x = dt == DType::Bool ? random_int_tensor({5, 7}, DType::I64, 0, 1).to(DType::Bool)
                                   : random_int_tensor({5, 7}, dt, unsigned_ ? std::max<int64_t>(c.lo, 0) : c.lo, c.hi);
      Tensor y = c.op(x.t());
      ASSERT_EQ(y.dtype(), DType::F32);
      EXPECT_TRUE(all_close(y, reference(x.t(), c.ref, DType::F32)));
    }
  }
}

TEST(UnaryFloat, RsqrtAndReciprocalOfZeroAreSignedInfinity) {
  Tensor x = from_vector<float>({0.f, -0.f});
  EXPECT_EQ(kiln::rsqrt(x).to_vector<float>(), (std::vector<float>{INFINITY, -INFINITY}));
  EXPECT_EQ(kiln::reciprocal(x).to_vector<float>(), (std::vector<float>{INFINITY, -INFINITY}));
  EXPECT_EQ(kiln::rsqrt(from_vector<int64_t>({0, 4})).to_vector<float>(), (std::vector<float>{INFINITY, 0.5f}));
}

TEST(UnaryFloat, SigmoidSiluGeluSaturateWithoutNaN) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = from_vector<double>({-1e4, -1000.0, -800.0, 800.0, 1000.0, 1e4}).to(dt);
    EXPECT_TRUE(equal(kiln::sigmoid(x), from_vector<double>({0, 0, 0, 1, 1, 1}).to(dt)));
    auto s = kiln::silu(x).to_vector<double>();
    auto g = kiln::gelu(x).to_vector<double>();
    auto gt = kiln::gelu(x, "tanh").to_vector<double>();
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(s[i], 0.0);
      EXPECT_EQ(g[i], 0.0);
      EXPECT_EQ(gt[i], 0.0);
      EXPECT_TRUE(std::signbit(s[i]));  // -0, as PyTorch
    }
    const auto xv = x.to_vector<double>();
    for (size_t i = 3; i < 6; ++i) {
      EXPECT_EQ(s[i], xv[i]);
      EXPECT_EQ(g[i], xv[i]);
      EXPECT_EQ(gt[i], xv[i]);
    }
  }
  // x = -inf itself gives NaN (-inf * 0) in PyTorch's formulas; +inf gives inf.
  Tensor inf = from_vector<float>({-INFINITY, INFINITY});
  EXPECT_TRUE(equal(kiln::sigmoid(inf), from_vector<float>({0.f, 1.f})));
  EXPECT_TRUE(all_close(kiln::silu(inf), from_vector<float>({NAN, INFINITY})));
  EXPECT_TRUE(all_close(kiln::gelu(inf), from_vector<float>({NAN, INFINITY})));
  EXPECT_TRUE(all_close(kiln::gelu(inf, "tanh"), from_vector<float>({NAN, INFINITY})));
}

// ---- sign, signbit, predicates -------------------------------------------------------------------------

TEST(Sign, NegativeZeroAndNaNGivePositiveZero) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    auto v = kiln::sign(from_vector<double>({-0.0, kNan, -kInf, kInf, -3.0, 1e-30}).to(dt)).to_vector<double>();
    EXPECT_EQ(v, (std::vector<double>{0, 0, -1, 1, -1, dt == DType::F16 ? 0.0 : 1.0}));
    EXPECT_FALSE(std::signbit(v[0]));
    EXPECT_FALSE(std::signbit(v[1]));
  }
  EXPECT_TRUE(equal(kiln::sign(from_vector<bool>({true, false})), from_vector<bool>({true, false})));
}

TEST(Predicates, FloatEdgeValues) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = from_vector<double>({kNan, -kNan, kInf, -kInf, 0.0, -0.0, -1.0, 2.0, 1e-40}).to(dt);
    auto bools = [](std::vector<bool> v) { return from_vector<bool>(v); };
    EXPECT_TRUE(equal(kiln::isnan(x), bools({1, 1, 0, 0, 0, 0, 0, 0, 0})));
    EXPECT_TRUE(equal(kiln::isinf(x), bools({0, 0, 1, 1, 0, 0, 0, 0, 0})));
    EXPECT_TRUE(equal(kiln::isfinite(x), bools({0, 0, 0, 0, 1, 1, 1, 1, 1})));
    // 1e-40 underflows to 0 in f16 only (bf16 has f32's exponent range).
    const bool tiny_is_zero = dt == DType::F16;
    EXPECT_TRUE(equal(kiln::logical_not(x), bools({0, 0, 0, 0, 1, 1, 0, 0, tiny_is_zero})));
    // (The NaNs' sign bits are left out: converting NaN to bf16 sets the sign, as PyTorch's cast does.)
    auto sb = kiln::signbit(x).to_vector<bool>();
    EXPECT_EQ(std::vector<bool>(sb.begin() + 2, sb.end()), (std::vector<bool>{0, 1, 0, 1, 1, 0, 0}));
  }
  auto sb = kiln::signbit(from_vector<float>({NAN, -NAN})).to_vector<bool>();
  EXPECT_EQ(sb, (std::vector<bool>{false, true}));
}

TEST(Predicates, IntegerAndBoolInputs) {
  for (DType dt : {DType::Bool, DType::U8, DType::I8, DType::I16, DType::U16, DType::I32, DType::U32, DType::I64,
                   DType::U64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = dt == DType::Bool ? from_vector<bool>({true, false, true, false})
                                 : from_vector<int64_t>({0, 1, is_unsigned(dt) ? 7 : -7, 100}).to(dt);
    Tensor f = zeros({4}, DType::Bool), t = ones({4}, DType::Bool);
    EXPECT_TRUE(equal(kiln::isnan(x), f));
    EXPECT_TRUE(equal(kiln::isinf(x), f));
    EXPECT_TRUE(equal(kiln::isfinite(x), t));
    auto ref_not = x.to_vector<double>();
    std::vector<bool> nz, neg;
    for (double v : ref_not) nz.push_back(v == 0), neg.push_back(v < 0);
    EXPECT_TRUE(equal(kiln::logical_not(x), from_vector<bool>(nz)));
    EXPECT_TRUE(equal(kiln::signbit(x), from_vector<bool>(neg)));
  }
}

// ---- integer ops ---------------------------------------------------------------------------------------

template <class T>
::testing::AssertionResult same_values(const Tensor& a, const std::vector<T>& e) {
  if (a.dtype() != dtype_of<T>())
    return ::testing::AssertionFailure() << "dtype " << dtype_name(a.dtype()) << " != " << dtype_name(dtype_of<T>());
  auto v = a.to_vector<T>();
  if (v.size() != e.size()) return ::testing::AssertionFailure() << "size " << v.size() << " != " << e.size();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != e[i])
      return ::testing::AssertionFailure() << "at " << i << ": got " << +v[i] << ", expected " << +e[i];
  return ::testing::AssertionSuccess();
}

template <class T>
void check_integer_ops() {
  using L = std::numeric_limits<T>;
  SCOPED_TRACE(dtype_name(dtype_of<T>()));
  std::vector<T> v = {L::min(), L::max(), T(0), T(1), T(L::min() + 1), T(L::max() - 1), static_cast<T>(-1)};
  std::uniform_int_distribution<int64_t> dist(-1000, 1000);
  for (int i = 0; i < 40; ++i) v.push_back(static_cast<T>(dist(test::rng())));
  // A [47] vector seen through a stride-2 slice too.
  Tensor full_x = from_vector<T>(v);
  for (const Tensor& x : {full_x, full_x.slice(0, 1, std::nullopt, 2)}) {
    const std::vector<T> xs = x.to_vector<T>();
    std::vector<T> neg, abs, sq, sgn, relu, bnot;
    for (T a : xs) {
      const bool is_min = L::is_signed && a == L::min();
      neg.push_back(is_min ? a : static_cast<T>(-static_cast<__int128>(a)));  // wraps
      abs.push_back(a < T(0) ? (is_min ? a : static_cast<T>(-a)) : a);
      sq.push_back(static_cast<T>(static_cast<__int128>(a) * static_cast<__int128>(a)));
      sgn.push_back(static_cast<T>(a > T(0) ? 1 : a < T(0) ? -1 : 0));
      relu.push_back(a < T(0) ? T(0) : a);
      bnot.push_back(static_cast<T>(~a));
    }
    EXPECT_TRUE(same_values(kiln::neg(x), neg)) << "neg";
    EXPECT_TRUE(same_values(kiln::abs(x), abs)) << "abs";
    EXPECT_TRUE(same_values(kiln::square(x), sq)) << "square";
    EXPECT_TRUE(same_values(kiln::sign(x), sgn)) << "sign";
    EXPECT_TRUE(same_values(kiln::relu(x), relu)) << "relu";
    EXPECT_TRUE(same_values(kiln::bitwise_not(x), bnot)) << "bitwise_not";
    // Rounding ops return integers unchanged, in their dtype (a new tensor).
    for (Op op : {kiln::floor, kiln::ceil, kiln::trunc}) EXPECT_TRUE(same_values(op(x), xs));
    Tensor r = kiln::round(x);
    EXPECT_TRUE(same_values(r, xs));
    EXPECT_FALSE(r.is_alias_of(x));
  }
}

TEST(UnaryInt, WrapAroundAtExtremesForEveryIntegerDtype) {
  check_integer_ops<uint8_t>();
  check_integer_ops<int8_t>();
  check_integer_ops<int16_t>();
  check_integer_ops<uint16_t>();
  check_integer_ops<int32_t>();
  check_integer_ops<uint32_t>();
  check_integer_ops<int64_t>();
  check_integer_ops<uint64_t>();
}

TEST(UnaryInt, BoolInputs) {
  Tensor b = from_vector<bool>({true, false, true});
  EXPECT_TRUE(equal(kiln::bitwise_not(b), from_vector<bool>({false, true, false})));
  EXPECT_TRUE(equal(kiln::logical_not(b), from_vector<bool>({false, true, false})));
  // square(bool) is pow(x, 2) in PyTorch: int64.
  EXPECT_TRUE(equal(kiln::square(b), from_vector<int64_t>({1, 0, 1})));
  EXPECT_TRUE(equal(kiln::signbit(b), from_vector<bool>({false, false, false})));
}

TEST(UnaryInt, ZeroDimAndZeroSize) {
  Tensor s = scalar_tensor(-5, DType::I32);
  EXPECT_EQ(kiln::neg(s).item<int32_t>(), 5);
  EXPECT_EQ(kiln::neg(s).dim(), 0);
  EXPECT_EQ(kiln::abs(empty({2, 0}, DType::I16)).sizes(), (Shape{2, 0}));
  EXPECT_EQ(kiln::bitwise_not(empty({0}, DType::U8)).dtype(), DType::U8);
}

// ---- round ---------------------------------------------------------------------------------------------

TEST(Round, HalfToEven) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = from_vector<double>({0.5, 1.5, 2.5, -0.5, -2.5, 3.5, -0.4, kNan, kInf, -kInf}).to(dt);
    auto v = kiln::round(x).to_vector<double>();
    EXPECT_TRUE(all_close(kiln::round(x), from_vector<double>({0, 2, 2, -0.0, -2, 4, -0.0, kNan, kInf, -kInf}).to(dt)));
    EXPECT_TRUE(std::signbit(v[3]));  // -0.5 rounds to -0
  }
}

TEST(Round, DecimalsAsPyTorch) {
  // Values from torch.round(torch.tensor([...]), decimals=...).
  Tensor x = from_vector<float>({0.25f, 0.35f, 1.25f, -0.15f, 2.675f});
  EXPECT_TRUE(all_close(kiln::round(x, 1), from_vector<float>({0.2f, 0.4f, 1.2f, -0.2f, 2.7f})));
  Tensor y = from_vector<float>({25.f, 35.f, 15.f, -25.f});
  EXPECT_TRUE(equal(kiln::round(y, -1), from_vector<float>({20.f, 40.f, 20.f, -20.f})));
  // 10^40 overflows float: the scaled value is inf, and inf / inf is NaN, as in PyTorch.
  EXPECT_TRUE(std::isnan(kiln::round(from_vector<float>({1.2345f}), 40).item<float>()));
}

TEST(Round, DecimalsMatchReferenceInComputeType) {
  // The scale and the rounding happen in the compute type (float for f32/f16/bf16), so the reference
  // does the same: a double computation could round a float product differently at an exact tie.
  for (DType dt : kFloatDTypes) {
    for (int64_t d : {-2, -1, 1, 2, 3}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " decimals " + std::to_string(d));
      Tensor x = random_tensor({9, 11}, dt, -500, 500).t();
      auto v = x.to_vector<double>();
      for (auto& e : v) {
        if (dt == DType::F64) {
          const double p = std::pow(10.0, std::abs(d));
          e = d < 0 ? std::nearbyint(e / p) * p : std::nearbyint(e * p) / p;
        } else {
          const float p = static_cast<float>(std::pow(10.0, std::abs(d))), f = static_cast<float>(e);
          e = d < 0 ? std::nearbyint(f / p) * p : std::nearbyint(f * p) / p;
        }
      }
      EXPECT_TRUE(all_close(kiln::round(x, d), from_vector<double>(v, x.sizes()).to(dt)));
    }
  }
}

// ---- frexp ---------------------------------------------------------------------------------------------

TEST(Frexp, MatchesStdFrexpIncludingSubnormals) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const double sub = dt == DType::F64 ? 5e-324 : dt == DType::F32 ? 1.4e-45 : dt == DType::F16 ? 6e-8 : 1e-40;
    Tensor edges = from_vector<double>({sub, -sub, 3 * sub, 1.0, -3.0, 0.75, 1e4}).to(dt);
    Tensor rnd = random_tensor({6, 8}, dt, -1e3, 1e3).t();
    for (const Tensor& x : {edges, rnd}) {
      auto [m, e] = kiln::frexp(x);
      ASSERT_EQ(m.dtype(), dt);
      ASSERT_EQ(e.dtype(), DType::I32);
      std::vector<double> mref;
      std::vector<int32_t> eref;
      for (double v : x.to_vector<double>()) {
        int ex = 0;
        mref.push_back(std::frexp(v, &ex));
        eref.push_back(ex);
      }
      EXPECT_TRUE(equal(m, from_vector<double>(mref, x.sizes()).to(dt)));  // exact
      EXPECT_TRUE(same_values(e, eref));
      for (double mv : m.to_vector<double>()) EXPECT_TRUE(std::fabs(mv) >= 0.5 && std::fabs(mv) < 1.0) << mv;
    }
  }
  // Known values from torch.frexp.
  auto [m32, e32] = kiln::frexp(from_vector<float>({1e-45f}));
  EXPECT_EQ(m32.item<float>(), 0.5f);
  EXPECT_EQ(e32.item<int32_t>(), -148);
  auto [m64, e64] = kiln::frexp(from_vector<double>({5e-324}));
  EXPECT_EQ(e64.item<int32_t>(), -1073);
  auto [m16, e16] = kiln::frexp(from_vector<double>({6e-8}).to(DType::F16));
  EXPECT_EQ(e16.item<int32_t>(), -23);
}

TEST(Frexp, ZeroInfNaNGiveSelfAndZeroExponent) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = from_vector<double>({0.0, -0.0, kInf, -kInf, kNan}).to(dt);
    auto [m, e] = kiln::frexp(x);
    EXPECT_TRUE(all_close(m, x, test::Tolerance{0, 0}));
    EXPECT_TRUE(std::signbit(m.to_vector<double>()[1]));
    EXPECT_TRUE(same_values(e, std::vector<int32_t>{0, 0, 0, 0, 0}));
  }
  auto [m, e] = kiln::frexp(empty({0, 2}, DType::F32));
  EXPECT_EQ(m.sizes(), (Shape{0, 2}));
  EXPECT_EQ(e.sizes(), (Shape{0, 2}));
}

// ---- complex64 -----------------------------------------------------------------------------------------

TEST(Complex, MatchesStdComplexDoubleReference) {
  using cd = std::complex<double>;
  struct C {
    const char* name;
    Op op;
    cd (*ref)(cd);
  };
  const std::vector<C> cases = {
      {"neg", kiln::neg, [](cd z) { return -z; }},
      {"exp", kiln::exp, [](cd z) { return std::exp(z); }},
      {"log", kiln::log, [](cd z) { return std::log(z); }},
      {"sqrt", kiln::sqrt, [](cd z) { return std::sqrt(z); }},
      {"sin", kiln::sin, [](cd z) { return std::sin(z); }},
      {"cos", kiln::cos, [](cd z) { return std::cos(z); }},
      {"tanh", kiln::tanh, [](cd z) { return std::tanh(z); }},
      {"sigmoid", kiln::sigmoid, [](cd z) { return 1.0 / (1.0 + std::exp(-z)); }},
      {"square", kiln::square, [](cd z) { return z * z; }},
      {"reciprocal", kiln::reciprocal, [](cd z) { return 1.0 / z; }},
      {"rsqrt", kiln::rsqrt, [](cd z) { return 1.0 / std::sqrt(z); }},
      {"log10", kiln::log10, [](cd z) { return std::log10(z); }},
      {"tan", kiln::tan, [](cd z) { return std::tan(z); }},
      {"asin", kiln::asin, [](cd z) { return std::asin(z); }},
      {"acos", kiln::acos, [](cd z) { return std::acos(z); }},
      {"atan", kiln::atan, [](cd z) { return std::atan(z); }},
      {"sinh", kiln::sinh, [](cd z) { return std::sinh(z); }},
      {"cosh", kiln::cosh, [](cd z) { return std::cosh(z); }},
  };
  std::uniform_real_distribution<double> dist(-1.5, 1.5);
  std::vector<Complex64> v;
  for (int i = 0; i < 60; ++i) v.emplace_back(static_cast<float>(dist(test::rng())), static_cast<float>(dist(test::rng())));
  Tensor x = from_vector<Complex64>(v, Shape{6, 10}).t();
  const auto xs = x.to_vector<Complex64>();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<Complex64> ref;
    for (auto z : xs) {
      const cd r = c.ref(cd(z.re, z.im));
      ref.emplace_back(static_cast<float>(r.real()), static_cast<float>(r.imag()));
    }
    Tensor y = c.op(x);
    ASSERT_EQ(y.dtype(), DType::C64);
    EXPECT_TRUE(all_close(y, from_vector<Complex64>(ref, y.sizes())));
  }
  std::vector<float> mag;
  for (auto z : xs) mag.push_back(static_cast<float>(std::abs(cd(z.re, z.im))));
  EXPECT_TRUE(all_close(kiln::abs(x), from_vector<float>(mag, x.sizes())));  // abs of c64 is f32
  Tensor special = from_vector<Complex64>({Complex64(0, 0), Complex64(NAN, 1), Complex64(1, INFINITY), Complex64(0, 2)});
  EXPECT_TRUE(equal(kiln::isnan(special), from_vector<bool>({false, true, false, false})));
  EXPECT_TRUE(equal(kiln::isinf(special), from_vector<bool>({false, false, true, false})));
  EXPECT_TRUE(equal(kiln::isfinite(special), from_vector<bool>({true, false, false, true})));
  EXPECT_TRUE(equal(kiln::logical_not(special), from_vector<bool>({true, false, false, false})));
}

// ---- in place ------------------------------------------------------------------------------------------

TEST(InPlace, MatchesOutOfPlaceOnStridedViewsAndLeavesTheRestAlone) {
  struct C {
    const char* name;
    Tensor& (*op_)(Tensor&);
    Ref ref;
    double lo, hi;
  };
  const std::vector<C> cases = {
      {"neg_", kiln::neg_, [](double x) { return -x; }, -3, 3},
      {"abs_", kiln::abs_, [](double x) { return std::fabs(x); }, -3, 3},
      {"exp_", kiln::exp_, [](double x) { return std::exp(x); }, -5, 5},
      {"log_", kiln::log_, [](double x) { return std::log(x); }, 0.01, 5},
      {"sqrt_", kiln::sqrt_, [](double x) { return std::sqrt(x); }, 0, 5},
      {"rsqrt_", kiln::rsqrt_, [](double x) { return 1.0 / std::sqrt(x); }, 0.01, 5},
      {"sigmoid_", kiln::sigmoid_, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, -5, 5},
      {"silu_", kiln::silu_, [](double x) { return x / (1.0 + std::exp(-x)); }, -5, 5},
      {"relu_", kiln::relu_, [](double x) { return x < 0 ? 0.0 : x; }, -3, 3},
      {"tanh_", kiln::tanh_, [](double x) { return std::tanh(x); }, -3, 3},
      {"floor_", kiln::floor_, [](double x) { return std::floor(x); }, -3, 3},
      {"ceil_", kiln::ceil_, [](double x) { return std::ceil(x); }, -3, 3},
      {"round_", kiln::round_, [](double x) { return std::nearbyint(x); }, -3, 3},
  };
  for (DType dt : kFloatDTypes) {
    for (const auto& c : cases) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      Tensor base = random_tensor({8, 10}, dt, c.lo, c.hi);
      const Tensor before = base.clone();
      Tensor view = base.slice(1, 1, std::nullopt, 2).t();  // [5, 8], non-contiguous
      const Tensor expected = reference(view, c.ref, dt);
      Tensor& r = c.op_(view);
      EXPECT_EQ(&r, &view);
      EXPECT_TRUE(all_close(view, expected));
      // Even columns are not part of the view and keep their values.
      EXPECT_TRUE(equal(base.slice(1, 0, std::nullopt, 2), before.slice(1, 0, std::nullopt, 2)));
      Tensor s = scalar_tensor(0.5 * (c.lo + c.hi) + 0.125, dt);
      const Tensor se = reference(s, c.ref, dt);
      EXPECT_TRUE(all_close(c.op_(s), se));
    }
  }
}

TEST(InPlace, IntegerRules) {
  Tensor x = from_vector<int32_t>({-3, 0, 7, INT32_MIN});
  kiln::neg_(x);
  EXPECT_TRUE(same_values(x, std::vector<int32_t>{3, 0, -7, INT32_MIN}));
  kiln::relu_(x);
  EXPECT_TRUE(same_values(x, std::vector<int32_t>{3, 0, 0, 0}));
  Tensor y = from_vector<int64_t>({-5, 9});
  kiln::abs_(y);
  kiln::floor_(y);
  kiln::ceil_(y);
  kiln::round_(y);
  EXPECT_TRUE(same_values(y, std::vector<int64_t>{5, 9}));
  // A float result cannot be written into an integer tensor.
  EXPECT_TRUE(throws_error([&] { kiln::exp_(y); }, {"exp_", "float32", "int64"}));
  EXPECT_TRUE(throws_error([&] { kiln::sqrt_(y); }, {"sqrt_", "can't be cast"}));
  EXPECT_TRUE(throws_error([&] { kiln::sigmoid_(y); }, {"sigmoid_", "int64"}));
  Tensor b = from_vector<bool>({true});
  EXPECT_TRUE(throws_error([&] { kiln::neg_(b); }, {"neg_", "bool", "logical_not"}));
  Tensor c = from_vector<Complex64>({Complex64(3, 4)});
  EXPECT_TRUE(throws_error([&] { kiln::abs_(c); }, {"abs_", "float32", "complex64"}));
}

TEST(InPlace, ExpandedTensorIsRejected) {
  Tensor x = zeros({1, 3}).expand({2, 3});
  EXPECT_TRUE(throws_error([&] { kiln::exp_(x); }, {"exp_", "single memory location", "[2, 3]"}));
}

// ---- exp_out -------------------------------------------------------------------------------------------

TEST(ExpOut, WritesIntoPoisonedOut) {
  auto ref = [](double v) { return std::exp(v); };
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = random_tensor({7, 9}, dt, -4, 4);
    Tensor out = empty({7, 9}, dt);
    test::poison(out);
    const void* p = out.data_ptr();
    Tensor& r = kiln::exp_out(out, x);
    EXPECT_EQ(&r, &out);
    EXPECT_EQ(out.data_ptr(), p);  // same shape: no reallocation
    EXPECT_TRUE(all_close(out, reference(x, ref, dt)));
  }
}

TEST(ExpOut, CastsToOutDtypeWhenAllowed) {
  auto ref = [](double v) { return std::exp(v); };
  Tensor x = random_tensor({5, 6}, DType::F32, -3, 3);
  for (DType od : {DType::F64, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(od));
    Tensor out = empty({5, 6}, od);
    test::poison(out);
    kiln::exp_out(out, x);
    ASSERT_EQ(out.dtype(), od);
    // The result is computed in f32 (the input's dtype) and then cast to out's dtype: into f64 it keeps f32's
    // rounding error (an ulp of f32 is 6e-8 relative, f64's default tolerance 1e-7), so f32's tolerance.
    const test::Tolerance tol = test::default_tolerance(od == DType::F64 ? DType::F32 : od);
    EXPECT_TRUE(all_close(out, reference(x, ref, DType::F32).to(od), tol));
  }
  Tensor oc = empty({5, 6}, DType::C64);
  test::poison(oc);
  kiln::exp_out(oc, x);
  EXPECT_TRUE(all_close(oc, reference(x, ref, DType::F32).to(DType::C64)));
  // Integer input: computed in f32, written into a float out.
  Tensor xi = random_int_tensor({4}, DType::I64, -3, 3);
  Tensor of = empty({4}, DType::F64);
  test::poison(of);
  kiln::exp_out(of, xi);
  EXPECT_TRUE(all_close(of, reference(xi, ref, DType::F32).to(DType::F64), test::default_tolerance(DType::F32)));
}

TEST(ExpOut, IntegerOrBoolOutIsAnError) {
  Tensor x = random_tensor({3}, DType::F32);
  Tensor oi = empty({3}, DType::I64), ob = empty({3}, DType::Bool);
  EXPECT_TRUE(throws_error([&] { kiln::exp_out(oi, x); }, {"exp_out", "float32", "can't be cast", "int64"}));
  EXPECT_TRUE(throws_error([&] { kiln::exp_out(ob, x); }, {"exp_out", "bool"}));
  Tensor xi = from_vector<int32_t>({1, 2, 3});
  EXPECT_TRUE(throws_error([&] { kiln::exp_out(oi, xi); }, {"exp_out", "float32", "int64"}));
  Tensor of = empty({1}, DType::F32);
  Tensor xc = from_vector<Complex64>({Complex64(1, 1)});
  EXPECT_TRUE(throws_error([&] { kiln::exp_out(of, xc); }, {"exp_out", "complex64", "float32"}));
}

TEST(ExpOut, ResizesAFreshOutButNotAView) {
  Tensor x = random_tensor({3, 4}, DType::F32, -2, 2);
  Tensor out = empty({5}, DType::F32);
  test::poison(out);
  kiln::exp_out(out, x);
  EXPECT_EQ(out.sizes(), (Shape{3, 4}));
  EXPECT_TRUE(all_close(out, reference(x, [](double v) { return std::exp(v); }, DType::F32)));
  Tensor base = zeros({4, 4});
  Tensor col = base.select(1, 0);  // a view of base, shape [4]
  EXPECT_TRUE(throws_error([&] { kiln::exp_out(col, x); }, {"exp_out", "[3, 4]", "view"}));
}

TEST(ExpOut, NonContiguousOutAndAliasedInput) {
  auto ref = [](double v) { return std::exp(v); };
  Tensor base = zeros({4, 6});
  Tensor out = base.slice(1, 0, std::nullopt, 2);  // [4, 3] view, strides (6, 2)
  Tensor x = random_tensor({4, 3}, DType::F32, -2, 2);
  kiln::exp_out(out, x);
  EXPECT_TRUE(all_close(base.slice(1, 0, std::nullopt, 2), reference(x, ref, DType::F32)));
  EXPECT_TRUE(equal(base.slice(1, 1, std::nullopt, 2), zeros({4, 3})));
  // out is x itself: in place.
  Tensor y = random_tensor({5}, DType::F32, -2, 2);
  const Tensor expected = reference(y, ref, DType::F32);
  kiln::exp_out(y, y);
  EXPECT_TRUE(all_close(y, expected));
  // out overlaps x at shifted positions: the result must still be exp of the original x.
  Tensor buf = random_tensor({6}, DType::F32, -2, 2);
  Tensor src = buf.slice(0, 0, 5), dst = buf.slice(0, 1, 6);
  const Tensor expected2 = reference(src, ref, DType::F32);
  kiln::exp_out(dst, src);
  EXPECT_TRUE(all_close(dst, expected2));
}

// ---- errors --------------------------------------------------------------------------------------------

TEST(UnaryErrors, Float8InputsAskForAConversion) {
  for (DType dt : {DType::F8E4M3, DType::F8E5M2}) {
    Tensor x = from_vector<float>({1.f}).to(dt);
    for (Op op : {kiln::exp, kiln::neg, kiln::abs, kiln::isnan, kiln::relu, kiln::floor, kiln::sigmoid}) {
      EXPECT_TRUE(throws_error([&] { op(x); }, {dtype_name(dt), "convert"}));
    }
    EXPECT_TRUE(throws_error([&] { kiln::frexp(x); }, {"frexp", dtype_name(dt), "convert"}));
    EXPECT_TRUE(throws_error([&] { kiln::exp_(x); }, {"exp_", dtype_name(dt)}));
  }
  Tensor x = from_vector<float>({1.f}).to(DType::F8E4M3);
  EXPECT_TRUE(throws_error([&] { kiln::exp(x); }, {"exp: float8_e4m3fn"}));
}

TEST(UnaryErrors, UnsupportedDtypesNameTheOpAndTheValidOnes) {
  Tensor b = from_vector<bool>({true});
  Tensor f = from_vector<float>({1.f});
  Tensor i = from_vector<int64_t>({1});
  Tensor c = from_vector<Complex64>({Complex64(1, 1)});
  EXPECT_TRUE(throws_error([&] { kiln::neg(b); }, {"neg", "bool", "logical_not"}));
  EXPECT_TRUE(throws_error([&] { kiln::abs(b); }, {"abs", "bool", "supported:"}));
  EXPECT_TRUE(throws_error([&] { kiln::relu(b); }, {"relu", "bool"}));
  EXPECT_TRUE(throws_error([&] { kiln::floor(b); }, {"floor", "bool"}));
  EXPECT_TRUE(throws_error([&] { kiln::bitwise_not(f); }, {"bitwise_not", "float32", "int64"}));
  EXPECT_TRUE(throws_error([&] { kiln::silu(i); }, {"silu", "int64", "float32"}));
  EXPECT_TRUE(throws_error([&] { kiln::gelu(i); }, {"gelu", "int64"}));
  EXPECT_TRUE(throws_error([&] { kiln::gelu(f, "fast"); }, {"gelu", "\"none\"", "\"tanh\"", "fast"}));
  EXPECT_TRUE(throws_error([&] { kiln::sign(c); }, {"sign", "complex64"}));
  EXPECT_TRUE(throws_error([&] { kiln::floor(c); }, {"floor", "complex64"}));
  EXPECT_TRUE(throws_error([&] { kiln::signbit(c); }, {"signbit", "complex64"}));
  EXPECT_TRUE(throws_error([&] { kiln::erf(c); }, {"erf", "complex64"}));
  EXPECT_TRUE(throws_error([&] { kiln::frexp(i); }, {"frexp", "int64", "float32"}));
  EXPECT_TRUE(throws_error([&] { kiln::round(i, 2); }, {"round", "decimals=2", "int64"}));
  EXPECT_TRUE(throws_error([&] { kiln::exp(Tensor()); }, {"undefined"}));
}

}  // namespace
}  // namespace kiln
