// Binary elementwise ops against direct references: double precision for floats, exact (modular) integer
// arithmetic for integers; broadcast, non-contiguous, zero-size and 0-d operands; edge values; in-place and
// out= forms; error messages.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "test_util.h"

namespace kiln::test {
namespace {

using F2 = std::function<double(double, double)>;
using I2 = std::function<int64_t(int64_t, int64_t)>;

constexpr DType kFloats[] = {DType::F32, DType::F64, DType::F16, DType::BF16};
constexpr DType kInts[] = {DType::U8, DType::I8, DType::I16, DType::U16, DType::I32, DType::U32, DType::I64};

// Reference: both operands converted to `compute`, broadcast, f applied in double, result as `out`.
Tensor ref_float(const Tensor& a, const Tensor& b, DType compute, DType out, const F2& f) {
  const Shape s = broadcast_shapes(a.sizes(), b.sizes());
  auto x = a.to(compute).expand(s).contiguous().to_vector<double>();
  auto y = b.to(compute).expand(s).contiguous().to_vector<double>();
  std::vector<double> r(x.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = f(x[i], y[i]);
  return from_vector<double>(r, s).to(out);
}

// Reference in int64 (exact for the ranges the tests draw); the result wraps into `out` by conversion.
Tensor ref_int(const Tensor& a, const Tensor& b, DType out, const I2& f) {
  const Shape s = broadcast_shapes(a.sizes(), b.sizes());
  auto x = a.expand(s).contiguous().to_vector<int64_t>();
  auto y = b.expand(s).contiguous().to_vector<int64_t>();
  std::vector<int64_t> r(x.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = f(x[i], y[i]);
  return from_vector<int64_t>(r, s).to(out);
}

// Operand pairs covering the layouts every op must handle.
struct Pair {
  const char* what;
  Tensor a, b;
};
std::vector<Pair> layouts(const std::function<Tensor(const Shape&)>& make) {
  std::vector<Pair> v;
  v.push_back({"contiguous", make({5, 7}), make({5, 7})});
  v.push_back({"transposed", make({7, 5}).t(), make({5, 7})});
  v.push_back({"sliced", make({5, 14}).slice(1, 0, std::nullopt, 2), make({7}).unsqueeze(0).expand({5, 7})});
  v.push_back({"broadcast [3,1] with [1,4]", make({3, 1}), make({1, 4})});
  v.push_back({"with 0-d", make({2, 3}), make({})});
  v.push_back({"0-d with 0-d", make({}), make({})});
  v.push_back({"zero-size", make({0, 3}), make({1, 3})});
  v.push_back({"large (parallel path)", make({300, 130}).t(), make({130, 1})});
  return v;
}

struct FloatCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  F2 ref;
  double lo = -3, hi = 3;
};

double py_floor_div(double a, double b) {
  if (b == 0) return a / b;
  const double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && (b < 0) != (mod < 0)) div -= 1;
  if (div == 0) return std::copysign(0.0, a / b);
  double fl = std::floor(div);
  if (div - fl > 0.5) fl += 1;
  return fl;
}
double py_remainder(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && (m < 0) != (b < 0)) m += b;
  return m;
}
double nan_max(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }
double nan_min(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); }

std::vector<FloatCase> float_cases() {
  return {
      {"add alpha", [](auto& a, auto& b) { return add(a, b, 0.5); }, [](double x, double y) { return x + 0.5 * y; }},
      {"sub", [](auto& a, auto& b) { return sub(a, b); }, [](double x, double y) { return x - y; }},
      {"mul", [](auto& a, auto& b) { return mul(a, b); }, [](double x, double y) { return x * y; }},
      {"div", [](auto& a, auto& b) { return div(a, b); }, [](double x, double y) { return x / y; }},
      {"div trunc", [](auto& a, auto& b) { return div(a, b, "trunc"); },
       [](double x, double y) { return std::trunc(x / y); }},
      {"div floor", [](auto& a, auto& b) { return div(a, b, "floor"); }, py_floor_div},
      {"pow", [](auto& a, auto& b) { return pow(a, b); }, [](double x, double y) { return std::pow(x, y); }, 0.1, 3},
      {"maximum", [](auto& a, auto& b) { return maximum(a, b); }, nan_max},
      {"minimum", [](auto& a, auto& b) { return minimum(a, b); }, nan_min},
      {"fmod", [](auto& a, auto& b) { return fmod(a, b); }, [](double x, double y) { return std::fmod(x, y); }},
      {"remainder", [](auto& a, auto& b) { return remainder(a, b); }, py_remainder},
      {"atan2", [](auto& a, auto& b) { return atan2(a, b); }, [](double x, double y) { return std::atan2(x, y); }},
  };
}

TEST(BinaryFloat, EveryOpMatchesDoubleReferenceOnEveryLayout) {
  for (const auto& c : float_cases()) {
    for (DType dt : kFloats) {
      for (auto& p : layouts([&](const Shape& s) { return random_tensor(s, dt, c.lo, c.hi); })) {
        SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt) + " " + p.what);
        Tensor r = c.op(p.a, p.b);
        ASSERT_EQ(r.dtype(), dt);
        Tensor e = ref_float(p.a, p.b, DType::F64, dt, c.ref);
        if ((std::string(c.name) == "div trunc" || std::string(c.name) == "div floor") && dt != DType::F64) {
          // Half types divide in f32 (PyTorch's opmath), so the reference does the same f32 arithmetic and
          // rounds once to dt: a double-precision quotient can land on the other side of an integer.
          e = ref_float(p.a, p.b, dt, dt, [&](double x, double y) -> double {
            const float a = static_cast<float>(x), b = static_cast<float>(y);
            if (std::string(c.name) == "div trunc") return std::trunc(a / b);
            if (b == 0) return a / b;
            const float mod = std::fmod(a, b);
            float q = (a - mod) / b;
            if (mod != 0 && (b < 0) != (mod < 0)) q -= 1;
            if (q == 0) return std::copysign(0.f, a / b);
            float fl = std::floor(q);
            if (q - fl > 0.5f) fl += 1;
            return fl;
          });
          EXPECT_TRUE(all_close(r, e, Tolerance{0, 0}));
          continue;
        }
        EXPECT_TRUE(all_close(r, e));
      }
    }
  }
}

TEST(BinaryFloat, EdgeValuesFollowIeeeAndPyTorch) {
  const double inf = INFINITY;
  Tensor a = from_vector<float>({1.f, -1.f, 0.f, -0.f, NAN, INFINITY, -INFINITY, 1.f});
  Tensor b = from_vector<float>({0.f, 0.f, 0.f, 2.f, 1.f, INFINITY, 2.f, -0.f});
  EXPECT_TRUE(all_close(div(a, b), from_vector<double>({inf, -inf, NAN, -0.0, NAN, NAN, -inf, -inf}).to(DType::F32)));
  EXPECT_TRUE(all_close(div(a, b, "floor"),
                        from_vector<double>({inf, -inf, NAN, -0.0, NAN, NAN, NAN, -inf}).to(DType::F32)));
  // -0.0 keeps its sign where it should.
  EXPECT_TRUE(std::signbit(mul(from_vector<float>({-0.f}), from_vector<float>({1.f})).item<float>()));
  EXPECT_TRUE(std::signbit(div(from_vector<float>({-0.5f}), from_vector<float>({2.f}), "trunc").item<float>()));
  EXPECT_TRUE(std::signbit(remainder(from_vector<float>({-0.f}), from_vector<float>({2.f})).item<float>()));
  // PyTorch's floor division is exact near integers: 1.0 // 0.1 is 9.
  EXPECT_EQ(div(from_vector<double>({1.0, 7.0, -0.5}), from_vector<double>({0.1, 0.1, 2.0}), "floor")
                .to_vector<double>(),
            (std::vector<double>{9.0, 69.0, -1.0}));
  // remainder(-1, inf) is inf (fmod gives -1, then + inf for the sign rule), as in PyTorch.
  EXPECT_EQ(remainder(from_vector<float>({-1.f, 1.f}), from_vector<float>({INFINITY, INFINITY})).to_vector<float>(),
            (std::vector<float>{INFINITY, 1.f}));
  EXPECT_TRUE(std::isnan(fmod(from_vector<float>({5.f}), from_vector<float>({0.f})).item<float>()));
}

TEST(BinaryFloat, MaximumMinimumPropagateNanAndKeepFirstOnEqual) {
  Tensor a = from_vector<float>({1.f, NAN, -0.f, 0.f, 2.f});
  Tensor b = from_vector<float>({NAN, 3.f, 0.f, -0.f, -INFINITY});
  auto mx = maximum(a, b).to_vector<float>(), mn = minimum(a, b).to_vector<float>();
  EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[1]) && std::isnan(mn[0]) && std::isnan(mn[1]));
  EXPECT_TRUE(std::signbit(mx[2]) && std::signbit(mn[2]));    // (-0, 0) gives -0 both ways
  EXPECT_TRUE(!std::signbit(mx[3]) && !std::signbit(mn[3]));  // (0, -0) gives 0
  EXPECT_EQ(mx[4], 2.f);
  EXPECT_EQ(mn[4], -INFINITY);
}

TEST(BinaryFloat, HalfComputesInFloatAndRoundsOnce) {
  // 2049 is not an f16; 2048 + 1 rounds (to even) to 2048 once; exact in bf16 it is far off.
  Tensor a = full({4}, 2048.0, DType::F16), b = full({4}, 1.0, DType::F16);
  EXPECT_EQ(add(a, b).to_vector<float>(), std::vector<float>(4, 2048.f));
  EXPECT_EQ(add(a, b, 3).to_vector<float>(), std::vector<float>(4, 2052.f));
}

// Contiguous f16 rows go through bulk conversions (F16C where the CPU has it); every result must equal the
// per-element arithmetic: the operands as float, the op in float, one rounding to nearest even. Random bit
// patterns cover subnormals, infinities, NaN and sums that overflow; lengths cover the 256-value chunks' tails,
// and a strided view takes the element loop.
TEST(BinaryFloat, HalfRowsInBulkEqualTheElementLoop) {
  std::mt19937 rng(17);
  for (int64_t n : {1, 7, 255, 256, 257, 1000}) {
    std::vector<uint16_t> xa(static_cast<size_t>(n)), xb(static_cast<size_t>(n));
    for (auto& v : xa) v = static_cast<uint16_t>(rng());
    for (auto& v : xb) v = static_cast<uint16_t>(rng());
    Tensor a = empty({n}, DType::F16), b = empty({n}, DType::F16);
    std::memcpy(a.data_ptr(), xa.data(), 2 * static_cast<size_t>(n));
    std::memcpy(b.data_ptr(), xb.data(), 2 * static_cast<size_t>(n));
    const auto check = [&](const char* name, const Tensor& out, const Tensor& x, const Tensor& y, auto f) {
      const Tensor xc = x.contiguous(), yc = y.contiguous(), oc = out.contiguous();
      for (int64_t i = 0; i < oc.numel(); ++i) {
        const float fx = static_cast<float>(xc.data<const Half>()[i]), fy = static_cast<float>(yc.data<const Half>()[i]);
        const Half want = static_cast<Half>(f(fx, fy)), got = oc.data<const Half>()[i];
        if (std::isnan(static_cast<float>(want))) {
          ASSERT_TRUE(std::isnan(static_cast<float>(got))) << name << " n " << n << " i " << i;
        } else {
          ASSERT_EQ(got.x, want.x) << name << " n " << n << " i " << i << ": " << fx << ", " << fy;
        }
      }
    };
    check("add", add(a, b, 3), a, b, [](float x, float y) { return x + 3.f * y; });
    check("sub", sub(a, b), a, b, [](float x, float y) { return x - y; });
    check("mul", mul(a, b), a, b, [](float x, float y) { return x * y; });
    check("div", div(a, b), a, b, [](float x, float y) { return x / y; });
    if (n > 2) {
      const Tensor as = a.narrow(0, 0, n - 1);
      const Tensor ev = a.as_strided({n / 2}, {2}), od = b.as_strided({n / 2}, {2});
      check("strided add", add(ev, od), ev, od, [](float x, float y) { return x + y; });
      check("narrow mul", mul(as, b.narrow(0, 1, n - 1)), as, b.narrow(0, 1, n - 1),
            [](float x, float y) { return x * y; });
    }
  }
}

// ---- integers -----------------------------------------------------------------------------------------

int64_t lo_of(DType t) { return is_unsigned(t) ? 0 : (t == DType::I64 ? -(1ll << 40) : -(1ll << (itemsize(t) * 8 - 1))); }
int64_t hi_of(DType t) {
  if (t == DType::I64) return 1ll << 40;
  if (t == DType::U32) return 0xFFFFFFFFll;
  return (1ll << (itemsize(t) * 8 - (is_unsigned(t) ? 0 : 1))) - 1;
}
uint64_t wrap_mul(int64_t a, int64_t b) { return static_cast<uint64_t>(a) * static_cast<uint64_t>(b); }
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t py_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

struct IntCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  I2 ref;
  bool nonzero_b = false;
  bool shift = false;
};

std::vector<IntCase> int_cases(int bits, bool is_signed) {
  // Reference shifts: counts outside [0, bits) shift everything out.
  auto shl = [bits](int64_t a, int64_t b) -> int64_t {
    if (b < 0 || b >= bits) return 0;
    return static_cast<int64_t>(static_cast<uint64_t>(a) << b);  // wraps into the dtype by conversion
  };
  auto shr = [bits, is_signed](int64_t a, int64_t b) -> int64_t {
    if (b < 0 || b >= bits) return is_signed && a < 0 ? -1 : 0;
    return a >> b;  // a holds the dtype's value (non-negative for unsigned)
  };
  return {
      {"add", [](auto& a, auto& b) { return add(a, b, 3); },
       [](int64_t x, int64_t y) { return static_cast<int64_t>(x + wrap_mul(3, y)); }},
      {"sub", [](auto& a, auto& b) { return sub(a, b); },
       [](int64_t x, int64_t y) { return static_cast<int64_t>(static_cast<uint64_t>(x) - y); }},
      {"mul", [](auto& a, auto& b) { return mul(a, b); },
       [](int64_t x, int64_t y) { return static_cast<int64_t>(wrap_mul(x, y)); }},
      {"div trunc", [](auto& a, auto& b) { return div(a, b, "trunc"); }, [](int64_t x, int64_t y) { return x / y; },
       true},
      {"div floor", [](auto& a, auto& b) { return div(a, b, "floor"); }, floor_div, true},
      {"fmod", [](auto& a, auto& b) { return fmod(a, b); }, [](int64_t x, int64_t y) { return x % y; }, true},
      {"remainder", [](auto& a, auto& b) { return remainder(a, b); }, py_mod, true},
      {"maximum", [](auto& a, auto& b) { return maximum(a, b); }, [](int64_t x, int64_t y) { return std::max(x, y); }},
      {"minimum", [](auto& a, auto& b) { return minimum(a, b); }, [](int64_t x, int64_t y) { return std::min(x, y); }},
      {"bitwise_and", [](auto& a, auto& b) { return bitwise_and(a, b); }, [](int64_t x, int64_t y) { return x & y; }},
      {"bitwise_or", [](auto& a, auto& b) { return bitwise_or(a, b); }, [](int64_t x, int64_t y) { return x | y; }},
      {"bitwise_xor", [](auto& a, auto& b) { return bitwise_xor(a, b); }, [](int64_t x, int64_t y) { return x ^ y; }},
      {"left_shift", [](auto& a, auto& b) { return bitwise_left_shift(a, b); }, shl, false, true},
      {"right_shift", [](auto& a, auto& b) { return bitwise_right_shift(a, b); }, shr, false, true},
  };
}

TEST(BinaryInt, EveryOpMatchesExactReferenceIncludingUnsigned) {
  for (DType dt : kInts) {
    const int bits = static_cast<int>(itemsize(dt)) * 8;
    for (const auto& c : int_cases(bits, !is_unsigned(dt))) {
      auto make_a = [&](const Shape& s) { return random_int_tensor(s, dt, lo_of(dt), hi_of(dt)); };
      auto make_b = [&](const Shape& s) {
        if (c.shift) return random_int_tensor(s, dt, is_unsigned(dt) ? 0 : -2, bits + 2);
        Tensor t = random_int_tensor(s, dt, lo_of(dt), hi_of(dt));
        // Division tests keep divisors away from zero (division by zero is its own test).
        return c.nonzero_b ? where(eq(t, 0), full({}, 1, dt), t) : t;
      };
      for (auto& p : layouts(make_a)) {
        SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt) + " " + p.what);
        // Same layout for b, its own values.
        Tensor b = p.b;
        if (b.dim() == 0 || b.numel() > 0) b = make_b(b.sizes()).as_strided(b.sizes(), contiguous_strides(b.sizes()));
        Tensor r = c.op(p.a, b);
        ASSERT_EQ(r.dtype(), dt);
        EXPECT_TRUE(equal(r, ref_int(p.a, b, dt, c.ref)));
      }
    }
  }
}

TEST(BinaryInt, OverflowWrapsAndMinOverMinusOneDoesNotTrap) {
  const int64_t mn = INT64_MIN, mx = INT64_MAX;
  Tensor a = from_vector<int64_t>({mx, mn, mn, 3});
  Tensor b = from_vector<int64_t>({1, -1, -1, mx});
  EXPECT_EQ(add(a, b).to_vector<int64_t>(), (std::vector<int64_t>{mn, mx, mx, mn + 2}));
  EXPECT_EQ(mul(a, b).to_vector<int64_t>(), (std::vector<int64_t>{mx, mn, mn, static_cast<int64_t>(3ull * mx)}));
  // MIN / -1 overflows: kiln wraps to MIN (PyTorch's CPU build traps with SIGFPE here).
  EXPECT_EQ(div(a, b, "trunc").to_vector<int64_t>()[1], mn);
  EXPECT_EQ(div(a, b, "floor").to_vector<int64_t>()[1], mn);
  EXPECT_EQ(remainder(a, b).to_vector<int64_t>()[1], 0);
  EXPECT_EQ(fmod(a, b).to_vector<int64_t>()[1], 0);
  Tensor i32 = from_vector<int32_t>({INT32_MAX, INT32_MIN});
  EXPECT_EQ(add(i32, 1).to_vector<int32_t>(), (std::vector<int32_t>{INT32_MIN, INT32_MIN + 1}));
  EXPECT_EQ(add(from_vector<uint8_t>({255}), 1).to_vector<uint8_t>(), (std::vector<uint8_t>{0}));
  EXPECT_EQ(mul(from_vector<uint16_t>({65535}), from_vector<uint16_t>({65535})).to_vector<uint16_t>(),
            (std::vector<uint16_t>{1}));
}

TEST(BinaryInt, UnsignedSixtyFourBitArithmetic) {
  const uint64_t big = (1ull << 63) + 5, max = UINT64_MAX;
  Tensor a = from_vector<uint64_t>({big, max, 7, 0});
  Tensor b = from_vector<uint64_t>({3, 1, 9, 1});
  EXPECT_EQ(add(a, b).to_vector<uint64_t>(), (std::vector<uint64_t>{big + 3, 0, 16, 1}));
  EXPECT_EQ(sub(a, b).to_vector<uint64_t>(), (std::vector<uint64_t>{big - 3, max - 1, max - 1, max}));
  EXPECT_EQ(mul(a, b).to_vector<uint64_t>(), (std::vector<uint64_t>{big * 3, max, 63, 0}));
  EXPECT_EQ(div(a, b, "floor").to_vector<uint64_t>(), (std::vector<uint64_t>{big / 3, max, 0, 0}));
  EXPECT_EQ(remainder(a, b).to_vector<uint64_t>(), (std::vector<uint64_t>{big % 3, 0, 7, 0}));
  EXPECT_EQ(maximum(a, b).to_vector<uint64_t>(), (std::vector<uint64_t>{big, max, 9, 1}));
  EXPECT_EQ(minimum(a, b).to_vector<uint64_t>(), (std::vector<uint64_t>{3, 1, 7, 0}));
  EXPECT_EQ(bitwise_xor(a, b).to_vector<uint64_t>(), (std::vector<uint64_t>{big ^ 3, max ^ 1, 7 ^ 9, 1}));
  EXPECT_EQ(bitwise_right_shift(a, from_vector<uint64_t>({63, 64, 1, 0})).to_vector<uint64_t>(),
            (std::vector<uint64_t>{1, 0, 3, 0}));
  EXPECT_EQ(bitwise_left_shift(a, from_vector<uint64_t>({1, 63, 200, 0})).to_vector<uint64_t>(),
            (std::vector<uint64_t>{10, 1ull << 63, 0, 0}));
  EXPECT_EQ(div(a, b).dtype(), DType::F32);
}

TEST(BinaryInt, ShiftsOutOfRangeAndOfNegativesMatchPyTorch) {
  Tensor a = from_vector<int8_t>({1, 2, -8, -1, -8, 5});
  Tensor b = from_vector<int8_t>({8, 100, 1, 100, -1, 7});
  EXPECT_EQ(bitwise_left_shift(a, b).to_vector<int8_t>(), (std::vector<int8_t>{0, 0, -16, 0, 0, -128}));
  EXPECT_EQ(bitwise_right_shift(a, b).to_vector<int8_t>(), (std::vector<int8_t>{0, 0, -4, -1, -1, 0}));
  EXPECT_EQ(bitwise_left_shift(from_vector<int64_t>({5, -8}), from_vector<int64_t>({64, -1})).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(bitwise_right_shift(from_vector<int64_t>({-8}), from_vector<int64_t>({-1})).item<int64_t>(), -1);
  EXPECT_EQ(bitwise_left_shift(from_vector<uint8_t>({200}), from_vector<uint8_t>({3})).item<int64_t>(), 64);
  EXPECT_TRUE(throws_error([] { bitwise_left_shift(from_vector<float>({1.f}), from_vector<float>({1.f})); },
                           {"bitwise_left_shift", "float32"}));
}

TEST(BinaryInt, IntegerDivisionByZeroIsAnError) {
  Tensor a = from_vector<int32_t>({7, -7}), z = from_vector<int32_t>({1, 0});
  EXPECT_TRUE(throws_error([&] { div(a, z, "trunc"); }, {"div", "ZeroDivisionError"}));
  EXPECT_TRUE(throws_error([&] { div(a, z, "floor"); }, {"div", "ZeroDivisionError"}));
  EXPECT_TRUE(throws_error([&] { remainder(a, z); }, {"remainder", "ZeroDivisionError"}));
  EXPECT_TRUE(throws_error([&] { fmod(a, 0); }, {"fmod", "ZeroDivisionError"}));
  EXPECT_TRUE(throws_error([&] { remainder(from_vector<uint64_t>({1}), 0); }, {"ZeroDivisionError"}));
  // True division promotes to float: no error.
  EXPECT_EQ(div(a, z).to_vector<float>(), (std::vector<float>{7.f, -INFINITY}));
}

TEST(BinaryInt, TrueDivisionOfIntegersGivesDefaultFloat) {
  Tensor r = div(from_vector<int64_t>({5, 6}), 2);
  EXPECT_EQ(r.dtype(), DType::F32);
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{2.5f, 3.f}));
  EXPECT_EQ(div(from_vector<int64_t>({5, 6}), 2, "floor").dtype(), DType::I64);
  EXPECT_EQ(div(from_vector<int32_t>({5}), from_vector<double>({2.0})).dtype(), DType::F64);
}

TEST(Pow, IntegerNegativeExponentsAndScalarForms) {
  Tensor b = from_vector<int64_t>({2, -1, 1, 0, 3, -1, -5});
  Tensor e = from_vector<int64_t>({-1, -3, -2, -1, 40, -2, 0});
  EXPECT_EQ(pow(b, e).to_vector<int64_t>(),
            (std::vector<int64_t>{0, -1, 1, 0, static_cast<int64_t>(12157665459056928801ull), 1, 1}));
  EXPECT_TRUE(throws_error([] { pow(from_vector<int64_t>({2, 3}), -1); }, {"pow", "negative"}));
  Tensor s = pow(2, from_vector<int64_t>({2, 3}));
  EXPECT_TRUE(equal(s, from_vector<int64_t>({4, 8})));
  Tensor f = pow(2.5, from_vector<int64_t>({2, 3}));
  EXPECT_EQ(f.dtype(), DType::F32);
  EXPECT_TRUE(all_close(f, from_vector<float>({6.25f, 15.625f})));
  Tensor g = pow(from_vector<int64_t>({2, 3}), 2.5);
  EXPECT_TRUE(all_close(g, from_vector<float>({static_cast<float>(std::pow(2.0, 2.5)), static_cast<float>(std::pow(3.0, 2.5))})));
  Tensor x = random_tensor({4, 5}, DType::F32, 0.1, 3);
  EXPECT_TRUE(all_close(pow(x, 3), ref_float(x, full({}, 3.0), DType::F64, DType::F32,
                                             [](double p, double q) { return std::pow(p, q); })));
  EXPECT_TRUE(all_close(pow(2.0, x), ref_float(full({}, 2.0), x, DType::F64, DType::F32,
                                               [](double p, double q) { return std::pow(p, q); })));
}

// ---- comparisons --------------------------------------------------------------------------------------

std::vector<bool> bools(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::Bool);
  return t.to_vector<bool>();
}

TEST(Compare, FloatsAgainstReferenceWithNanAndInf) {
  Tensor a = from_vector<float>({1.f, NAN, INFINITY, -INFINITY, -0.f, 2.f});
  Tensor b = from_vector<float>({1.f, NAN, INFINITY, 0.f, 0.f, NAN});
  EXPECT_EQ(bools(eq(a, b)), (std::vector<bool>{true, false, true, false, true, false}));
  EXPECT_EQ(bools(ne(a, b)), (std::vector<bool>{false, true, false, true, false, true}));
  EXPECT_EQ(bools(lt(a, b)), (std::vector<bool>{false, false, false, true, false, false}));
  EXPECT_EQ(bools(le(a, b)), (std::vector<bool>{true, false, true, true, true, false}));
  EXPECT_EQ(bools(gt(a, b)), (std::vector<bool>(6, false)));
  EXPECT_EQ(bools(ge(a, b)), (std::vector<bool>{true, false, true, false, true, false}));
  EXPECT_EQ(bools(gt(a, NAN)), std::vector<bool>(6, false));
  for (DType dt : kFloats) {
    for (auto& p : layouts([&](const Shape& s) { return random_int_tensor(s, DType::I32, -2, 2).to(dt); })) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + p.what);
      EXPECT_TRUE(equal(le(p.a, p.b), ref_float(p.a, p.b, DType::F64, DType::Bool,
                                                 [](double x, double y) { return x <= y ? 1.0 : 0.0; })));
      EXPECT_TRUE(equal(ne(p.a, p.b), ref_float(p.a, p.b, DType::F64, DType::Bool,
                                                 [](double x, double y) { return x != y ? 1.0 : 0.0; })));
    }
  }
}

TEST(Compare, MixedSignednessIsExact) {
  EXPECT_TRUE(gt(from_vector<uint32_t>({4000000000u}), from_vector<int32_t>({-1})).item<bool>());
  EXPECT_TRUE(gt(from_vector<uint64_t>({(1ull << 63) + 1}), from_vector<int64_t>({-1})).item<bool>());
  EXPECT_TRUE(lt(from_vector<int64_t>({-1}), from_vector<uint64_t>({(1ull << 63) + 1})).item<bool>());
  EXPECT_FALSE(eq(from_vector<uint64_t>({UINT64_MAX}), from_vector<int8_t>({-1})).item<bool>());
  EXPECT_EQ(bools(ge(from_vector<uint64_t>({5, 0, UINT64_MAX}), from_vector<int32_t>({5, -3, 7}))),
            (std::vector<bool>{true, true, true}));
  EXPECT_EQ(bools(le(from_vector<int16_t>({5, -3, 7}), from_vector<uint64_t>({5, 0, UINT64_MAX}))),
            (std::vector<bool>{true, true, true}));
  // 0-d operands compare exactly too (result_type would wrap the u64 0-d into i64).
  EXPECT_TRUE(gt(full({}, static_cast<unsigned long long>((1ull << 63) + 1), DType::U64),
                 from_vector<int64_t>({1})).item<bool>());
  // Random mixes against an exact reference via __int128.
  for (DType ua : {DType::U8, DType::U16, DType::U32, DType::U64}) {
    for (DType sb : {DType::I8, DType::I16, DType::I32, DType::I64}) {
      Tensor a = random_int_tensor({40}, DType::I64, 0, INT64_MAX).to(ua);
      Tensor b = random_int_tensor({40}, DType::I64, INT64_MIN, INT64_MAX).to(sb);
      auto x = a.to_vector<uint64_t>();
      auto y = b.to_vector<int64_t>();
      std::vector<bool> e(40);
      for (int i = 0; i < 40; ++i) e[i] = static_cast<__int128>(x[i]) < static_cast<__int128>(y[i]);
      EXPECT_EQ(bools(lt(a, b)), e) << dtype_name(ua) << " vs " << dtype_name(sb);
    }
  }
}

TEST(Compare, ScalarAgainstUnsignedTensorIsExact) {
  // kiln defines these exactly, as NumPy 2 does (PyTorch 2.11 refuses gt on u32 and wraps -1 into a u8).
  EXPECT_EQ(bools(gt(from_vector<uint32_t>({4, 0}), -1)), (std::vector<bool>{true, true}));
  EXPECT_EQ(bools(gt(from_vector<uint8_t>({4, 0}), -1)), (std::vector<bool>{true, true}));
  EXPECT_EQ(bools(ne(from_vector<uint64_t>({UINT64_MAX, 0}), -1)), (std::vector<bool>{true, true}));
  EXPECT_EQ(bools(lt(from_vector<uint64_t>({UINT64_MAX, 0}), -1)), (std::vector<bool>{false, false}));
  EXPECT_EQ(bools(eq(from_vector<uint8_t>({4}), 260)), (std::vector<bool>{false}));
  EXPECT_EQ(bools(le(from_vector<int8_t>({127, -128}), 1000)), (std::vector<bool>{true, true}));
  EXPECT_EQ(bools(ge(from_vector<int8_t>({127, -128}), -1000)), (std::vector<bool>{true, true}));
  EXPECT_EQ(bools(eq(from_vector<uint64_t>({(1ull << 63) + 1, 1}), Scalar((1ull << 63) + 1))),
            (std::vector<bool>{true, false}));
  EXPECT_EQ(bools(gt(from_vector<int64_t>({INT64_MAX}), Scalar((1ull << 63) + 1))), (std::vector<bool>{false}));
  // Float Scalars promote as in PyTorch.
  EXPECT_EQ(bools(gt(from_vector<int64_t>({2, 3}), 2.5)), (std::vector<bool>{false, true}));
  EXPECT_EQ(bools(eq(from_vector<bool>({true, false}), 1)), (std::vector<bool>{true, false}));
}

TEST(Compare, IntegersAgainstReferenceOnEveryLayout) {
  for (DType dt : kInts) {
    for (auto& p : layouts([&](const Shape& s) { return random_int_tensor(s, dt, 0, 3); })) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + p.what);
      EXPECT_TRUE(equal(lt(p.a, p.b), ref_int(p.a, p.b, DType::Bool, [](int64_t x, int64_t y) { return x < y; })));
      EXPECT_TRUE(equal(eq(p.a, 2), ref_int(p.a, full({}, 2), DType::Bool,
                                             [](int64_t x, int64_t y) { return x == y; })));
    }
  }
}

// ---- bitwise / logical / heaviside --------------------------------------------------------------------

TEST(Logical, AnyDtypeByTruthValue) {
  Tensor a = from_vector<float>({1.f, 0.f, NAN, -0.f});
  Tensor b = from_vector<int64_t>({2, 0, 0, 5});
  EXPECT_EQ(bools(logical_and(a, b)), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(bools(logical_or(a, b)), (std::vector<bool>{true, false, true, true}));
  EXPECT_EQ(bools(logical_xor(a, b)), (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(logical_and(random_tensor({3, 1}, DType::F32), random_tensor({1, 4}, DType::F16)).sizes(), (Shape{3, 4}));
}

TEST(Bitwise, BoolAndPromotion) {
  Tensor t = from_vector<bool>({true, false, true}), f = from_vector<bool>({true, true, false});
  EXPECT_TRUE(equal(bitwise_and(t, f), from_vector<bool>({true, false, false})));
  EXPECT_TRUE(equal(bitwise_xor(t, f), from_vector<bool>({false, true, true})));
  EXPECT_TRUE(equal(bitwise_and(t, from_vector<int64_t>({2, 3, 3})), from_vector<int64_t>({0, 0, 1})));
  EXPECT_TRUE(throws_error([] { bitwise_and(from_vector<float>({1.f}), from_vector<int64_t>({1})); },
                           {"bitwise_and", "float32"}));
}

TEST(Heaviside, ZeroTakesValuesNanGivesZero) {
  Tensor x = from_vector<float>({-1.f, 0.f, 2.f, NAN, -0.f});
  EXPECT_EQ(heaviside(x, from_vector<float>({0.5f})).to_vector<float>(),
            (std::vector<float>{0.f, 0.5f, 1.f, 0.f, 0.5f}));
  EXPECT_TRUE(equal(heaviside(from_vector<int64_t>({-3, 0, 4}), from_vector<int64_t>({7})),
                    from_vector<int64_t>({0, 7, 1})));
  EXPECT_TRUE(throws_error([] { heaviside(from_vector<int64_t>({1}), from_vector<float>({1.f})); },
                           {"heaviside", "int64", "float32"}));
}

// ---- where / clamp / masked_fill_ ---------------------------------------------------------------------

TEST(Where, BroadcastsAllThreeAndPromotes) {
  Tensor c = from_vector<bool>({true, false, true}, Shape{3, 1});
  Tensor a = random_tensor({1, 4}, DType::F32);
  Tensor b = full({}, -7.0, DType::F64);
  Tensor r = where(c, a, b);
  ASSERT_EQ(r.sizes(), (Shape{3, 4}));
  EXPECT_EQ(r.dtype(), DType::F32);  // a 0-d f64 does not outrank a dimensioned f32
  auto av = a.to_vector<float>();
  auto rv = r.to_vector<float>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(rv[i * 4 + j], i == 1 ? -7.f : av[j]);
  Tensor s = where(from_vector<bool>({true, false}), from_vector<int64_t>({1, 2}), 2.5);
  EXPECT_EQ(s.dtype(), DType::F32);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1.f, 2.5f}));
  EXPECT_EQ(where(from_vector<bool>({true, false}), from_vector<int32_t>({1, 2}), 9).dtype(), DType::I32);
  Tensor bt = random_tensor({4, 3}, DType::BF16).t();  // non-contiguous
  Tensor w = where(gt(bt, 0.0), bt, 0.0);
  EXPECT_TRUE(equal(w, maximum(bt, zeros({}, DType::BF16))));
  EXPECT_EQ(where(zeros({0, 2}, DType::Bool), zeros({0, 2}), 1.0).sizes(), (Shape{0, 2}));
  EXPECT_TRUE(throws_error([] { where(from_vector<int64_t>({1}), ones({1}), ones({1})); },
                           {"where", "bool", "int64"}));
}

TEST(Clamp, ScalarBoundsPromoteAndPropagateNan) {
  Tensor x = from_vector<float>({-2.f, 0.5f, 3.f, NAN});
  EXPECT_TRUE(all_close(clamp(x, Scalar(0.0), Scalar(1.0)), from_vector<float>({0.f, 0.5f, 1.f, NAN})));
  EXPECT_TRUE(all_close(clamp(x, std::nullopt, Scalar(0)), from_vector<float>({-2.f, 0.f, 0.f, NAN})));
  // min > max gives max everywhere; a NaN bound gives NaN (PyTorch).
  EXPECT_TRUE(all_close(clamp(x, Scalar(1.5), Scalar(0.5)), from_vector<float>({0.5f, 0.5f, 0.5f, NAN})));
  EXPECT_TRUE(std::isnan(clamp(x, Scalar(NAN), Scalar(0.5)).to_vector<float>()[0]));
  Tensor i = clamp(from_vector<int64_t>({1, 2}), Scalar(0.5), Scalar(1.5));
  EXPECT_EQ(i.dtype(), DType::F32);
  EXPECT_EQ(i.to_vector<float>(), (std::vector<float>{1.f, 1.5f}));
  EXPECT_TRUE(equal(clamp(from_vector<uint8_t>({0, 100, 255}), Scalar(10), Scalar(200)),
                    from_vector<uint8_t>({10, 100, 200})));
  EXPECT_TRUE(throws_error([] { clamp(ones({2}), std::optional<Scalar>(), std::optional<Scalar>()); },
                           {"clamp", "min or max"}));
}

TEST(Clamp, TensorBoundsBroadcast) {
  Tensor x = random_tensor({3, 4}, DType::F32, -3, 3).t();  // [4, 3], non-contiguous
  Tensor lo = random_tensor({1, 3}, DType::F32, -2, 0), hi = random_tensor({4, 1}, DType::F64, 0, 2);
  Tensor r = clamp(x, std::optional<Tensor>(lo), std::optional<Tensor>(hi));
  EXPECT_EQ(r.dtype(), DType::F64);
  Tensor e = ref_float(ref_float(x, lo, DType::F64, DType::F64, nan_max), hi, DType::F64, DType::F64, nan_min);
  EXPECT_TRUE(all_close(r, e));
  Tensor only = clamp(x, std::optional<Tensor>(), std::optional<Tensor>(full({}, 0.0, DType::F32)));
  EXPECT_TRUE(all_close(only, ref_float(x, full({}, 0.0), DType::F64, DType::F32, nan_min)));
}

TEST(Clamp, InPlace) {
  Tensor x = random_tensor({4, 6}, DType::F16, -3, 3);
  Tensor v = x.slice(1, 0, std::nullopt, 2);  // non-contiguous view
  Tensor expected = clamp(v, Scalar(-1.0), Scalar(1.0));
  clamp_(v, Scalar(-1.0), Scalar(1.0));
  EXPECT_TRUE(equal(v, expected));
  EXPECT_TRUE(equal(x.slice(1, 0, std::nullopt, 2), expected));
  Tensor i = from_vector<int64_t>({1, 2});
  EXPECT_TRUE(throws_error([&] { clamp_(i, Scalar(0.5), Scalar(1.5)); }, {"clamp_", "float32", "int64"}));
}

TEST(MaskedFill, BroadcastMaskIntoSelf) {
  Tensor x = random_tensor({4, 3}, DType::F32).t();  // [3, 4] non-contiguous
  Tensor keep = x.clone();
  Tensor mask = from_vector<bool>({true, false, false, true}, Shape{1, 4});
  masked_fill_(x, mask, 2.5);
  auto xv = x.to_vector<float>(), kv = keep.to_vector<float>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(xv[i * 4 + j], (j == 0 || j == 3) ? 2.5f : kv[i * 4 + j]);
  Tensor n = from_vector<int64_t>({1, 2});
  masked_fill_(n, from_vector<bool>({true, false}), 2.7);  // cast to self's dtype, as PyTorch
  EXPECT_EQ(n.to_vector<int64_t>(), (std::vector<int64_t>{2, 2}));
  Tensor u = zeros({2}, DType::U64);
  masked_fill_(u, full({}, true, DType::Bool), Scalar(UINT64_MAX));
  EXPECT_EQ(u.to_vector<uint64_t>(), (std::vector<uint64_t>{UINT64_MAX, UINT64_MAX}));
  Tensor f = ones({2});
  EXPECT_TRUE(throws_error([&] { masked_fill_(f, from_vector<int64_t>({1, 0}), 2.0); },
                           {"masked_fill_", "bool", "int64"}));
  EXPECT_TRUE(throws_error([&] { masked_fill_(f, zeros({2, 1}, DType::Bool), 2.0); },
                           {"masked_fill_", "[2, 1]", "[2]"}));
}

// ---- in place, out=, operators, errors ----------------------------------------------------------------

TEST(InPlace, WritesIntoSelfWithBroadcastOther) {
  Tensor x = random_tensor({5, 4}, DType::F32).t();  // [4, 5], non-contiguous
  Tensor x0 = x.clone();
  Tensor o = random_tensor({5}, DType::F64);
  add_(x, o, 2);
  EXPECT_EQ(x.dtype(), DType::F32);
  EXPECT_TRUE(all_close(x, ref_float(x0, o, DType::F64, DType::F32, [](double a, double b) { return a + 2 * b; })));
  Tensor y = x0.clone();
  sub_(y, y);  // self as other
  EXPECT_TRUE(equal(y, zeros({4, 5})));
  Tensor sq = random_tensor({4, 4}, DType::F64), sq0 = sq.clone();
  mul_(sq, sq.t());  // overlapping, differently strided other
  EXPECT_TRUE(all_close(sq, mul(sq0, sq0.t())));
  Tensor d = from_vector<float>({1.f, 2.f});
  div_(d, 4);
  EXPECT_EQ(d.to_vector<float>(), (std::vector<float>{0.25f, 0.5f}));
  Tensor i = from_vector<int32_t>({1, 2});
  mul_(i, from_vector<bool>({true, false}));
  add_(i, 5);
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{6, 5}));
  Tensor h = from_vector<float>({1.f, 2.f}).to(DType::F16);
  add_(h, from_vector<double>({0.5, 0.25}));  // f64 result cast back into f16
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{1.5f, 2.25f}));
}

TEST(InPlace, ResultThatDoesNotFitSelfIsAnError) {
  Tensor i = from_vector<int64_t>({1, 2});
  EXPECT_TRUE(throws_error([&] { add_(i, from_vector<float>({1.5f, 2.f})); }, {"add_", "float32", "int64"}));
  EXPECT_TRUE(throws_error([&] { add_(i, 1.5); }, {"add_", "float32", "int64"}));
  EXPECT_TRUE(throws_error([&] { div_(i, 2); }, {"div_", "float32", "int64"}));
  Tensor b = from_vector<bool>({true});
  EXPECT_TRUE(throws_error([&] { mul_(b, from_vector<int32_t>({1})); }, {"mul_", "int32", "bool"}));
  EXPECT_TRUE(throws_error([&] { add_(i, zeros({1, 2}, DType::I64)); }, {"add_", "[2]", "[1, 2]"}));
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));  // untouched
  Tensor e = zeros({1}).expand({3});
  EXPECT_TRUE(throws_error([&] { add_(e, 1.0); }, {"add_", "single memory location"}));
}

TEST(OutForms, PoisonedOutIsOverwrittenResizedOrRejected) {
  Tensor a = random_tensor({3, 4}, DType::F32), b = random_tensor({4}, DType::F32);
  Tensor out = empty({3, 4}, DType::F32);
  poison(out);
  add_out(out, a, b, -1.5);
  EXPECT_TRUE(all_close(out, ref_float(a, b, DType::F64, DType::F32, [](double x, double y) { return x - 1.5 * y; })));
  Tensor wrong = empty({7}, DType::F32);  // resized to the result's shape
  poison(wrong);
  mul_out(wrong, a, b);
  EXPECT_EQ(wrong.sizes(), (Shape{3, 4}));
  EXPECT_TRUE(all_close(wrong, mul(a, b)));
  Tensor h = empty({3, 4}, DType::F16);  // f32 result cast into f16
  poison(h);
  sub_out(h, a, b);
  EXPECT_TRUE(equal(h, sub(a, b).to(DType::F16)));
  Tensor d = empty({2}, DType::F64);
  poison(d);
  div_out(d, from_vector<int64_t>({1, 2}), from_vector<int64_t>({3, 3}));
  EXPECT_TRUE(all_close(d, from_vector<double>({1.0 / 3, 2.0 / 3}), Tolerance{1.3e-6, 1e-5}));  // computed in f32
  Tensor i = empty({3, 4}, DType::I64);
  EXPECT_TRUE(throws_error([&] { add_out(i, a, b); }, {"add_out", "float32", "int64"}));
  Tensor self_out = a.clone();
  add_out(self_out, self_out, self_out);
  EXPECT_TRUE(all_close(self_out, mul(a, 2)));
}

TEST(Operators, MatchNamedOps) {
  Tensor a = random_tensor({2, 3}, DType::F32), b = random_tensor({3}, DType::F32, 0.5, 2);
  EXPECT_TRUE(equal(a + b, add(a, b)));
  EXPECT_TRUE(equal(a - b, sub(a, b)));
  EXPECT_TRUE(equal(a * b, mul(a, b)));
  EXPECT_TRUE(equal(a / b, div(a, b)));
  EXPECT_TRUE(equal(a + 2, add(a, 2)));
  EXPECT_TRUE(equal(a - 2.5, sub(a, 2.5)));
  EXPECT_TRUE(equal(a * 3, mul(a, 3)));
  EXPECT_TRUE(equal(a / 4, div(a, 4)));
  Tensor n = -from_vector<float>({1.f, -0.f, 0.f, INFINITY});
  auto nv = n.to_vector<float>();
  EXPECT_EQ(nv[0], -1.f);
  EXPECT_FALSE(std::signbit(nv[1]));
  EXPECT_TRUE(std::signbit(nv[2]));
  EXPECT_EQ(nv[3], -INFINITY);
  EXPECT_TRUE(equal(-from_vector<uint8_t>({1, 0}), from_vector<uint8_t>({255, 0})));
  EXPECT_TRUE(equal(-from_vector<int64_t>({INT64_MIN, 5}), from_vector<int64_t>({INT64_MIN, -5})));
  EXPECT_TRUE(equal(from_vector<int32_t>({1}) / 2, from_vector<float>({0.5f})));
}

TEST(Errors, NameOpShapesDtypesAndDevices) {
  EXPECT_TRUE(throws_error([] { add(ones({2}), ones({3})); }, {"add", "[2]", "[3]"}));
  EXPECT_TRUE(throws_error([] { maximum(ones({2, 3}), ones({4, 1, 2})); }, {"maximum", "[2, 3]", "[4, 1, 2]"}));
  EXPECT_TRUE(throws_error([] { sub(from_vector<bool>({true}), from_vector<bool>({true})); },
                           {"sub", "two bool tensors", "logical_xor"}));
  EXPECT_TRUE(throws_error([] { sub(from_vector<bool>({true}), 1); }, {"sub", "bool tensor"}));
  EXPECT_TRUE(throws_error([] { sub(ones({1}), from_vector<bool>({true})); }, {"sub", "bool tensor"}));
  EXPECT_TRUE(throws_error([] { -from_vector<bool>({true}); }, {"bool", "logical_not"}));
  EXPECT_TRUE(throws_error([] { add(from_vector<int64_t>({1}), from_vector<int64_t>({1}), 2.5); },
                           {"add", "alpha", "floating"}));
  EXPECT_TRUE(throws_error([] { add(ones({1}), ones({1}), true); }, {"add", "alpha"}));
  EXPECT_TRUE(throws_error([] { div(ones({1}), ones({1}), "round"); }, {"div", "round", "trunc", "floor"}));
  EXPECT_TRUE(throws_error([] { add(from_vector<float>({1.f}).to(DType::F8E4M3), ones({1})); },
                           {"float8_e4m3fn", "float32"}));
  // A tensor whose storage claims to be on a GPU (never read): the device check comes before any access.
  auto host = std::shared_ptr<void>(std::malloc(16), std::free);
  Tensor gpu(std::make_shared<Storage>(host, 16, cuda_device(0)), Shape{2}, Shape{1}, 0, DType::F32);
  EXPECT_TRUE(throws_error([&] { add(ones({2}), gpu); }, {"add", "same device", "cpu", "cuda"}));
  EXPECT_TRUE(throws_error([&] { lt(gpu, ones({2})); }, {"lt", "same device"}));
  EXPECT_TRUE(throws_error([&] { where(ones({2}, DType::Bool), gpu, ones({2})); }, {"where", "same device"}));
#if !KILN_HAVE_CUDA
  // With the CUDA backend built this would launch a real kernel on the fake storage (tests/cuda covers it).
  EXPECT_TRUE(throws_error([&] { add(gpu, gpu); }, {"add", "no CUDA"}));
#endif
}

}  // namespace
}  // namespace kiln::test

namespace kiln {
namespace {

TEST(BinaryComplex, ArithmeticMatchesStdComplex) {
  const int64_t n = 257;
  std::vector<Complex64> av(n), bv(n);
  std::uniform_real_distribution<float> d(-3.f, 3.f);
  for (int64_t i = 0; i < n; ++i) {
    av[i] = Complex64(d(test::rng()), d(test::rng()));
    bv[i] = Complex64(d(test::rng()), d(test::rng()));
  }
  const Tensor a = from_vector<Complex64>(av), b = from_vector<Complex64>(bv);
  struct Case {
    const char* name;
    Tensor got;
    std::complex<double> (*ref)(std::complex<double>, std::complex<double>);
  };
  const Case cases[] = {
      {"add", add(a, b, Complex64(0.5f, -1.f)), [](std::complex<double> x, std::complex<double> y) {
         return x + std::complex<double>(0.5, -1.0) * y;
       }},
      {"sub", sub(a, b), [](std::complex<double> x, std::complex<double> y) { return x - y; }},
      {"mul", mul(a, b), [](std::complex<double> x, std::complex<double> y) { return x * y; }},
      {"div", div(a, b), [](std::complex<double> x, std::complex<double> y) { return x / y; }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(c.got.dtype(), DType::C64);
    std::vector<Complex64> want(n);
    for (int64_t i = 0; i < n; ++i) {
      const auto r = c.ref({av[i].re, av[i].im}, {bv[i].re, bv[i].im});
      want[i] = Complex64(static_cast<float>(r.real()), static_cast<float>(r.imag()));
    }
    // A few f32 roundings per element (and cancellation in a*d - b*c): relative to the magnitude.
    EXPECT_TRUE(test::all_close(c.got, from_vector<Complex64>(want), test::Tolerance{1e-5, 1e-5}));
  }
  EXPECT_EQ(mul(a, 2).dtype(), DType::C64);
  // Smith's division: no overflow in |b|^2 for large operands (3e30+1e30j) / (1e30-2e30j) = 0.2+1.4j.
  const Complex64 q = div(from_vector<Complex64>({Complex64(3e30f, 1e30f)}),
                          from_vector<Complex64>({Complex64(1e30f, -2e30f)})).item<Complex64>();
  EXPECT_NEAR(q.re, 0.2f, 1e-6f);
  EXPECT_NEAR(q.im, 1.4f, 1e-6f);
}

}  // namespace
}  // namespace kiln
