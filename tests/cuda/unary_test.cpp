// CUDA unary elementwise ops against the CPU backend from the same inputs (tests/cuda/conformance.h):
// every op x supported dtype x layout class, edge values, in-place and out= forms, CUDA graphs and
// unaligned (non-vectorised) inputs. Every test skips where no GPU can be used.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda/conformance.h"
#include "kiln/runtime.h"

namespace kiln {
namespace {

using test::all_close;
using test::equal;
using test::expect_conformant;
using test::Layout;
using test::make_pair;
using test::Pair;
using test::throws_error;
using test::Tolerance;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

const std::vector<DType> kFloats = {DType::F32, DType::F64, DType::F16, DType::BF16};
const std::vector<DType> kInts = {DType::U8, DType::I8, DType::I16, DType::U16,
                                  DType::I32, DType::U32, DType::I64, DType::U64};

std::vector<DType> floats_ints_bool(bool ints, bool boolean) {
  std::vector<DType> v = kFloats;
  if (ints) v.insert(v.end(), kInts.begin(), kInts.end());
  if (boolean) v.push_back(DType::Bool);
  return v;
}

// How closely CUDA must match the CPU.
enum class Match {
  Exact,     // same bits up to NaN payloads: IEEE-exact arithmetic (+-*/, sqrt, rounding) or none at all
  Libm,      // one libm call: CUDA's libm and glibc differ by a few ulp
  Compound,  // 1 + erf / 1 + tanh cancel for negative x and amplify libm's ulp differences
};

// Tolerance by the result's dtype. f32/f64: a few ulp of device libm vs glibc (torch.testing's f32
// default would do; the f64 one, 1e-7, would hide a real bug, so it is tightened). f16/bf16: the
// defaults, which cover a one-ulp flip when the float results straddle a rounding boundary.
std::optional<Tolerance> tolerance(Match m, DType result) {
  if (m == Match::Exact) return Tolerance{0, 0};
  if (result == DType::F32) return Tolerance{4e-6, 1e-5};
  if (result == DType::F64) return m == Match::Libm ? Tolerance{1e-14, 1e-15} : Tolerance{1e-12, 1e-15};
  return std::nullopt;
}

using UnaryFn = std::function<Tensor(const Tensor&)>;

struct OpCase {
  std::string name;
  UnaryFn fn;
  std::vector<DType> dtypes;
  Match match;
  double lo = -3, hi = 3;  // float inputs
  bool int_to_float = false;  // integer/bool inputs return float32
};

std::vector<OpCase> op_cases() {
  const auto real = floats_ints_bool(true, true);
  const auto numeric = floats_ints_bool(true, false);
  std::vector<OpCase> c = {
      {"neg", kiln::neg, numeric, Match::Exact},
      {"abs", kiln::abs, numeric, Match::Exact},
      {"square", kiln::square, real, Match::Exact},
      {"sign", kiln::sign, real, Match::Exact},
      {"relu", kiln::relu, numeric, Match::Exact},
      {"exp", kiln::exp, real, Match::Libm, -10, 10, true},
      {"exp2", kiln::exp2, real, Match::Libm, -10, 10, true},
      {"expm1", kiln::expm1, real, Match::Libm, -3, 3, true},
      // Some negative inputs: NaN must come out at the same places.
      {"log", kiln::log, real, Match::Libm, -0.5, 10, true},
      {"log2", kiln::log2, real, Match::Libm, -0.5, 10, true},
      {"log10", kiln::log10, real, Match::Libm, -0.5, 10, true},
      {"log1p", kiln::log1p, real, Match::Libm, -1.5, 5, true},
      // sqrt and division are correctly rounded on both (nvcc's default -prec-sqrt/-prec-div).
      {"sqrt", kiln::sqrt, real, Match::Exact, -0.5, 10, true},
      {"rsqrt", kiln::rsqrt, real, Match::Libm, -0.5, 10, true},
      {"reciprocal", kiln::reciprocal, real, Match::Exact, -3, 3, true},
      {"sin", kiln::sin, real, Match::Libm, -4, 4, true},
      {"cos", kiln::cos, real, Match::Libm, -4, 4, true},
      {"tan", kiln::tan, real, Match::Libm, -1.5, 1.5, true},
      {"asin", kiln::asin, real, Match::Libm, -1.1, 1.1, true},
      {"acos", kiln::acos, real, Match::Libm, -1.1, 1.1, true},
      {"atan", kiln::atan, real, Match::Libm, -5, 5, true},
      {"sinh", kiln::sinh, real, Match::Libm, -5, 5, true},
      {"cosh", kiln::cosh, real, Match::Libm, -5, 5, true},
      {"tanh", kiln::tanh, real, Match::Libm, -5, 5, true},
      {"erf", kiln::erf, real, Match::Libm, -3, 3, true},
      {"sigmoid", kiln::sigmoid, real, Match::Libm, -10, 10, true},
      {"silu", kiln::silu, kFloats, Match::Libm, -10, 10},
      {"gelu", [](const Tensor& x) { return kiln::gelu(x); }, kFloats, Match::Compound, -4, 4},
      {"gelu_tanh", [](const Tensor& x) { return kiln::gelu(x, "tanh"); }, kFloats, Match::Compound, -4, 4},
      {"floor", kiln::floor, numeric, Match::Exact, -5, 5},
      {"ceil", kiln::ceil, numeric, Match::Exact, -5, 5},
      {"trunc", kiln::trunc, numeric, Match::Exact, -5, 5},
      {"round", [](const Tensor& x) { return kiln::round(x); }, numeric, Match::Exact, -5, 5},
      {"round_decimals_2", [](const Tensor& x) { return kiln::round(x, 2); }, kFloats, Match::Exact, -5, 5},
      {"round_decimals_neg1", [](const Tensor& x) { return kiln::round(x, -1); }, kFloats, Match::Exact, -500, 500},
      {"signbit", kiln::signbit, real, Match::Exact},
      {"isnan", kiln::isnan, real, Match::Exact},
      {"isinf", kiln::isinf, real, Match::Exact},
      {"isfinite", kiln::isfinite, real, Match::Exact},
      {"logical_not", kiln::logical_not, real, Match::Exact},
      {"bitwise_not", kiln::bitwise_not, floats_ints_bool(true, true), Match::Exact},
  };
  // bitwise_not: integers and bool only.
  c.back().dtypes = kInts;
  c.back().dtypes.push_back(DType::Bool);
  return c;
}

// Integer inputs: a range that covers negatives (wrapping for unsigned types) and, for the float ops, the
// op's domain.
std::pair<double, double> int_range(const OpCase& c) {
  if (c.int_to_float) return {std::floor(c.lo), std::ceil(c.hi)};
  return {-100, 100};
}

class CudaUnaryConformance : public ::testing::TestWithParam<OpCase> {};

TEST_P(CudaUnaryConformance, MatchesCpuForEveryDtypeAndLayout) {
  KILN_REQUIRE_CUDA();
  const OpCase& c = GetParam();
  for (DType dt : c.dtypes) {
    const bool integral = is_integral(dt, true);
    const auto [lo, hi] = integral ? int_range(c) : std::pair<double, double>{c.lo, c.hi};
    const DType result = integral && c.int_to_float ? DType::F32 : dt;
    for (Layout l : test::all_layouts()) {
      const Pair p = make_pair(test::layout_shape(l), dt, l, lo, hi);
      expect_conformant(c.name + " " + dtype_name(dt) + " " + test::layout_name(l),
                        [&](const std::vector<Tensor>& in) { return test::one(c.fn(in[0])); }, {p},
                        tolerance(c.match, result));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaUnaryConformance, ::testing::ValuesIn(op_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& info) { return info.param.name; });

// ---- frexp -----------------------------------------------------------------------------------------------

TEST(CudaFrexp, MatchesCpuExactlyForEveryDtypeAndLayout) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kFloats) {
    for (Layout l : test::all_layouts()) {
      const Pair p = make_pair(test::layout_shape(l), dt, l, -1000, 1000);
      expect_conformant(std::string("frexp ") + dtype_name(dt) + " " + test::layout_name(l),
                        [](const std::vector<Tensor>& in) {
                          auto [m, e] = kiln::frexp(in[0]);
                          return std::vector<Tensor>{m, e};
                        },
                        {p}, Tolerance{0, 0});
    }
  }
}

// ---- edge values -------------------------------------------------------------------------------------------

// Values equal (NaN matches NaN, whatever its payload: x86 and CUDA make different default NaNs) and
// zeros of the same sign.
::testing::AssertionResult same_values_and_zero_signs(const Tensor& got, const Tensor& want) {
  auto r = equal(got, want);
  if (!r) return r;
  if (is_complex(want.dtype())) return r;
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < w.size(); ++i)
    if (w[i] == 0 && std::signbit(g[i]) != std::signbit(w[i]))
      return ::testing::AssertionFailure() << "sign of zero differs at " << i << ": got " << g[i] << ", expected "
                                           << w[i];
  return ::testing::AssertionSuccess();
}

std::vector<double> float_edge_values(DType dt) {
  std::vector<double> v = {kNan, kInf, -kInf, -0.0, 0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 1.0, -1.0, 3.7, -3.7,
                           1e-3, -1e-3, 100.0, -100.0, 1e30, -1e30};
  switch (dt) {
    case DType::F32: v.insert(v.end(), {1e-40, -1e-40, 1.4e-45, 3.4028234663852886e38, -3.4028234663852886e38}); break;
    case DType::F64: v.insert(v.end(), {1e-310, -1e-310, 4.9e-324, 1.7976931348623157e308, -1.7976931348623157e308}); break;
    case DType::F16: v.insert(v.end(), {6e-8, -6e-8, 3e-5, 65504.0, -65504.0}); break;
    default: v.insert(v.end(), {1e-40, -1e-40, 9.2e-41, 3.3895313892515355e38, -3.3895313892515355e38}); break;
  }
  return v;
}

TEST(CudaUnaryEdges, FloatEdgeValuesMatchCpu) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kFloats) {
    const Tensor x = from_vector<double>(float_edge_values(dt)).to(dt);
    const Tensor xd = x.to(cuda_device(0));
    for (const OpCase& c : op_cases()) {
      if (std::find(c.dtypes.begin(), c.dtypes.end(), dt) == c.dtypes.end()) continue;
      SCOPED_TRACE(c.name + " " + dtype_name(dt));
      const Tensor want = c.fn(x), got = c.fn(xd).to(kCPU);
      if (c.match == Match::Exact) EXPECT_TRUE(same_values_and_zero_signs(got, want));
      else EXPECT_TRUE(all_close(got, want, tolerance(c.match, want.dtype())));
    }
    SCOPED_TRACE(std::string("frexp ") + dtype_name(dt));
    auto [m, e] = kiln::frexp(x);
    auto [md, ed] = kiln::frexp(xd);
    EXPECT_TRUE(same_values_and_zero_signs(md.to(kCPU), m));
    EXPECT_TRUE(equal(ed.to(kCPU), e));
  }
}

// Integer extremes: wrapping neg/abs/square, sign, bitwise_not, predicates and the int -> float32 ops.
TEST(CudaUnaryEdges, IntegerExtremesMatchCpu) {
  KILN_REQUIRE_CUDA();
  const std::vector<int64_t> i64 = {INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - 1, INT64_MAX};
  for (DType dt : kInts) {
    // The dtype's own extremes: cast the i64 extremes of a matching signedness and width.
    std::vector<Tensor> parts = {from_vector<int64_t>({-1, 0, 1, 2, -2, 127, -128, 255})};
    if (dt == DType::I64 || dt == DType::U64) parts.push_back(from_vector<int64_t>(i64));
    else parts.push_back(from_vector<int64_t>({INT32_MIN, INT32_MAX, 65535, -32768, 32767, 0xFFFFFFFFll}));
    for (const Tensor& p : parts) {
      const Tensor x = p.to(dt);
      const Tensor xd = x.to(cuda_device(0));
      for (const OpCase& c : op_cases()) {
        if (std::find(c.dtypes.begin(), c.dtypes.end(), dt) == c.dtypes.end()) continue;
        SCOPED_TRACE(c.name + " " + dtype_name(dt));
        const Tensor want = c.fn(x), got = c.fn(xd).to(kCPU);
        if (c.match == Match::Exact) EXPECT_TRUE(same_values_and_zero_signs(got, want));
        else EXPECT_TRUE(all_close(got, want, tolerance(c.match, want.dtype())));
      }
    }
  }
  const Tensor b = from_vector<bool>({true, false});
  for (const OpCase& c : op_cases()) {
    if (std::find(c.dtypes.begin(), c.dtypes.end(), DType::Bool) == c.dtypes.end()) continue;
    SCOPED_TRACE(c.name + " bool");
    const Tensor want = c.fn(b), got = c.fn(b.to(cuda_device(0))).to(kCPU);
    EXPECT_TRUE(all_close(got, want, tolerance(c.match, want.dtype())));
  }
}

// ---- complex64 -----------------------------------------------------------------------------------------

// A complex64 pair with random real and imaginary parts in [-2, 2) (make_pair's values would be real).
Pair make_complex_pair(const Shape& shape, Layout layout) {
  Shape base_shape = shape;
  if (layout == Layout::Transposed && shape.size() >= 2) std::swap(base_shape[shape.size() - 1], base_shape[shape.size() - 2]);
  if (layout == Layout::Broadcast && !shape.empty()) base_shape[0] = 1;
  if (layout == Layout::Sliced && !shape.empty()) base_shape.back() = shape.back() * 2 + 1;
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<Complex64> v(static_cast<size_t>(checked_numel(base_shape)));
  for (auto& z : v) z = Complex64(dist(test::rng()), dist(test::rng()));
  const Tensor base = from_vector<Complex64>(v, base_shape);
  auto view_of = [&](const Tensor& t) -> Tensor {
    if (shape.empty()) return t;
    switch (layout) {
      case Layout::Transposed: return t.transpose(-1, -2);
      case Layout::Broadcast: return t.expand(shape);
      case Layout::Sliced: return t.slice(-1, 1, std::nullopt, 2);
      default: return t;
    }
  };
  Pair p{view_of(base), view_of(base.to(cuda_device(0)))};
  EXPECT_EQ(p.cpu.sizes(), shape);
  return p;
}

TEST(CudaUnaryComplex, MatchesCpuForEveryLayout) {
  KILN_REQUIRE_CUDA();
  // cuda::std::complex (and Kahan's tanh/tan) vs glibc: several libm calls per result, each a few ulp
  // apart, and components that cancel (z * z, exp(a) cos(b)); inputs stay away from the poles of
  // tan/tanh/sigmoid only as far as random sampling does, which Kahan's formula handles.
  const Tolerance libm{1e-5, 1e-5};
  struct C {
    const char* name;
    UnaryFn fn;
    std::optional<Tolerance> tol;
  };
  const std::vector<C> cases = {
      {"neg", kiln::neg, Tolerance{0, 0}},       {"abs", kiln::abs, libm},
      {"square", kiln::square, libm},            {"reciprocal", kiln::reciprocal, libm},
      {"rsqrt", kiln::rsqrt, libm},              {"exp", kiln::exp, libm},
      {"log", kiln::log, libm},                  {"log10", kiln::log10, libm},
      {"sqrt", kiln::sqrt, libm},                {"sin", kiln::sin, libm},
      {"cos", kiln::cos, libm},                  {"tan", kiln::tan, libm},
      {"asin", kiln::asin, libm},                {"acos", kiln::acos, libm},
      {"atan", kiln::atan, libm},                {"sinh", kiln::sinh, libm},
      {"cosh", kiln::cosh, libm},                {"tanh", kiln::tanh, libm},
      {"sigmoid", kiln::sigmoid, libm},          {"isnan", kiln::isnan, Tolerance{0, 0}},
      {"isinf", kiln::isinf, Tolerance{0, 0}},   {"isfinite", kiln::isfinite, Tolerance{0, 0}},
      {"logical_not", kiln::logical_not, Tolerance{0, 0}},
  };
  for (const auto& c : cases) {
    for (Layout l : test::all_layouts()) {
      const Pair p = make_complex_pair(test::layout_shape(l), l);
      expect_conformant(std::string(c.name) + " complex64 " + test::layout_name(l),
                        [&](const std::vector<Tensor>& in) { return test::one(c.fn(in[0])); }, {p}, c.tol);
    }
  }
}

TEST(CudaUnaryComplex, PredicatesOnSpecialValues) {
  KILN_REQUIRE_CUDA();
  const Tensor x = from_vector<Complex64>({Complex64(0, 0), Complex64(NAN, 1), Complex64(1, INFINITY),
                                           Complex64(0, 2), Complex64(-0.f, -0.f), Complex64(INFINITY, NAN)});
  const Tensor xd = x.to(cuda_device(0));
  for (const UnaryFn& f : std::vector<UnaryFn>{kiln::isnan, kiln::isinf, kiln::isfinite, kiln::logical_not})
    EXPECT_TRUE(equal(f(xd).to(kCPU), f(x)));
  EXPECT_TRUE(equal(kiln::neg(xd).to(kCPU), kiln::neg(x)));
}

// ---- in place and out= -------------------------------------------------------------------------------------

// A strided view of a poisoned buffer holds the inputs; the op must change the view and nothing else.
TEST(CudaUnaryInPlace, StridedViewLeavesTheRestAlone) {
  KILN_REQUIRE_CUDA();
  using InPlace = Tensor& (*)(Tensor&);
  struct C {
    const char* name;
    InPlace op_;
    bool ints;
    Match match;
  };
  const std::vector<C> cases = {
      {"neg_", kiln::neg_, true, Match::Exact},         {"abs_", kiln::abs_, true, Match::Exact},
      {"exp_", kiln::exp_, false, Match::Libm},         {"log_", kiln::log_, false, Match::Libm},
      {"sqrt_", kiln::sqrt_, false, Match::Exact},      {"rsqrt_", kiln::rsqrt_, false, Match::Libm},
      {"sigmoid_", kiln::sigmoid_, false, Match::Libm}, {"silu_", kiln::silu_, false, Match::Libm},
      {"relu_", kiln::relu_, true, Match::Exact},       {"tanh_", kiln::tanh_, false, Match::Libm},
      {"floor_", kiln::floor_, true, Match::Exact},     {"ceil_", kiln::ceil_, true, Match::Exact},
      {"round_", kiln::round_, true, Match::Exact},
  };
  // -7 is changed by every op above (log/sqrt/rsqrt of it are NaN), so a stray write shows.
  const double sentinel = -7.0;
  for (const auto& c : cases) {
    std::vector<DType> dts = kFloats;
    if (c.ints) dts.insert(dts.end(), {DType::I32, DType::I8, DType::I64});
    for (DType dt : dts) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      // Every third column from 1 of the transpose: non-contiguous in both dims.
      Tensor base = full({19, 40}, sentinel, dt);
      Tensor base_d = full({19, 40}, sentinel, dt, cuda_device(0));
      Tensor view = base.t().slice(0, 1, std::nullopt, 3);
      Tensor view_d = base_d.t().slice(0, 1, std::nullopt, 3);
      const Tensor vals = is_integral(dt, true) ? test::random_int_tensor(view.sizes(), dt, -50, 50)
                                                : test::random_tensor(view.sizes(), dt, 0.1, 4.0);
      view.copy_(vals);
      view_d.copy_(vals);
      c.op_(view);
      Tensor& r = c.op_(view_d);
      EXPECT_EQ(r.data_ptr(), view_d.data_ptr());  // returns self
      const auto tol = tolerance(c.match, dt);
      EXPECT_TRUE(all_close(base_d.to(kCPU), base, tol));
      // Outside the view: still the sentinel.
      Tensor mask = full({19, 40}, true, DType::Bool);
      mask.t().slice(0, 1, std::nullopt, 3).fill_(false);
      const auto got = base_d.to(kCPU).to_vector<double>();
      const auto m = mask.to_vector<bool>();
      int64_t touched = 0;
      for (size_t i = 0; i < got.size(); ++i) touched += m[i] && got[i] != sentinel;
      EXPECT_EQ(touched, 0) << "elements outside the view were written";
    }
  }
}

TEST(CudaUnaryOut, ExpOutWritesPoisonedOutputs) {
  KILN_REQUIRE_CUDA();
  const Device dev = cuda_device(0);
  for (DType dt : kFloats) {
    SCOPED_TRACE(dtype_name(dt));
    const Pair p = make_pair({37, 53}, dt, Layout::Transposed, -5, 5);
    const Tensor want = kiln::exp(p.cpu);
    const auto tol = tolerance(Match::Libm, dt);
    // Contiguous out.
    Tensor out = empty({37, 53}, dt, dev);
    test::poison(out);
    Tensor& r = kiln::exp_out(out, p.cuda);
    EXPECT_EQ(r.data_ptr(), out.data_ptr());
    EXPECT_TRUE(all_close(out.to(kCPU), want, tol));
    // Strided out: a transposed view of a poisoned buffer.
    Tensor buf = empty({53, 37}, dt, dev);
    test::poison(buf);
    Tensor out_t = buf.t();
    kiln::exp_out(out_t, p.cuda);
    EXPECT_TRUE(all_close(buf.t().to(kCPU), want, tol));
    // A wider out dtype: computed in dt, then cast.
    Tensor out64 = empty({37, 53}, DType::F64, dev);
    test::poison(out64);
    kiln::exp_out(out64, p.cuda);
    EXPECT_TRUE(all_close(out64.to(kCPU), want.to(DType::F64), tol.value_or(test::default_tolerance(dt))));
    // Wrong shape, not shared: resized.
    Tensor small = empty({3}, dt, dev);
    kiln::exp_out(small, p.cuda);
    EXPECT_TRUE(small.is_cuda());
    EXPECT_TRUE(all_close(small.to(kCPU), want, tol));
    // out is x itself.
    Tensor x = p.cuda.clone();
    kiln::exp_out(x, x);
    EXPECT_TRUE(all_close(x.to(kCPU), want, tol));
  }
  // Integer input: float32 result.
  const Pair pi = make_pair({37, 53}, DType::I32, Layout::Sliced, -20, 20);
  Tensor out = empty({37, 53}, DType::F32, dev);
  test::poison(out);
  kiln::exp_out(out, pi.cuda);
  EXPECT_TRUE(all_close(out.to(kCPU), kiln::exp(pi.cpu), tolerance(Match::Libm, DType::F32)));
}

// ---- graphs, alignment, errors ----------------------------------------------------------------------

TEST(CudaUnaryGraph, CapturedChainReplaysTheEagerResult) {
  KILN_REQUIRE_CUDA();
  const Device dev = cuda_device(0);
  Tensor x = test::random_tensor({129, 257}, DType::F32, -3, 3, dev);
  Tensor x16 = test::random_tensor({129, 257}, DType::F16, -3, 3, dev);
  Tensor out_buf = empty({129, 257}, DType::F32, dev);
  auto chain = [&](Tensor& dst) {
    Tensor y = kiln::tanh(kiln::neg(x));
    kiln::sqrt_(kiln::abs_(y));
    Tensor z = kiln::round(kiln::sigmoid(y.t()), 2);
    Tensor m = kiln::frexp(kiln::exp(kiln::gelu(x16))).first.to(DType::F32);
    kiln::exp_out(dst, kiln::silu(z.t()) );
    return std::vector<Tensor>{y, z, m, kiln::isnan(kiln::log(x)), kiln::floor(x)};
  };
  Tensor eager_out = empty({129, 257}, DType::F32, dev);
  const auto eager = chain(eager_out);
  synchronize(dev);

  Stream s = Stream::create(dev);
  Graph g;
  std::vector<Tensor> captured;
  g.capture(s, [&] { captured = chain(out_buf); });
  g.replay();
  s.synchronize();
  for (size_t i = 0; i < eager.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(equal(captured[i].to(kCPU), eager[i].to(kCPU)));
  }
  EXPECT_TRUE(equal(out_buf.to(kCPU), eager_out.to(kCPU)));

  // New inputs in the same buffers: a replay recomputes from them.
  x.copy_(test::random_tensor({129, 257}, DType::F32, -3, 3));
  x16.copy_(test::random_tensor({129, 257}, DType::F16, -3, 3));
  synchronize(dev);
  g.replay();
  s.synchronize();
  Tensor eager_out2 = empty({129, 257}, DType::F32, dev);
  const auto eager2 = chain(eager_out2);
  for (size_t i = 0; i < eager2.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(equal(captured[i].to(kCPU), eager2[i].to(kCPU)));
  }
  EXPECT_TRUE(equal(out_buf.to(kCPU), eager_out2.to(kCPU)));
}

// A slice from element 1 is contiguous but not 16-byte aligned: the scalar contiguous path.
TEST(CudaUnaryAlignment, UnalignedInputsAndOutputsAreRight) {
  KILN_REQUIRE_CUDA();
  const Device dev = cuda_device(0);
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::I32}) {
    SCOPED_TRACE(dtype_name(dt));
    for (int64_t n : {1, 2, 7, 8, 9, 1001, 4099}) {
      const Tensor base = is_integral(dt, true) ? test::random_int_tensor({n + 1}, dt, -100, 100)
                                                : test::random_tensor({n + 1}, dt, 0.1, 3.0);
      const Tensor x = base.slice(0, 1, std::nullopt);
      const Tensor xd = base.to(dev).slice(0, 1, std::nullopt);
      ASSERT_TRUE(xd.is_contiguous());
      EXPECT_TRUE(equal(kiln::neg(xd).to(kCPU), kiln::neg(x)));
      EXPECT_TRUE(equal(kiln::signbit(xd).to(kCPU), kiln::signbit(x)));
      EXPECT_TRUE(equal(kiln::sqrt(xd).to(kCPU), kiln::sqrt(x)));
      const Tensor e = kiln::exp(x);
      EXPECT_TRUE(all_close(kiln::exp(xd).to(kCPU), e, tolerance(Match::Libm, e.dtype())));
      if (!is_integral(dt, true)) {
        // Unaligned output too, aligned input.
        Tensor obuf = empty({n + 1}, dt, dev);
        test::poison(obuf);
        Tensor o = obuf.slice(0, 1, std::nullopt);
        kiln::exp_out(o, xd.clone());
        EXPECT_TRUE(all_close(o.to(kCPU), e, tolerance(Match::Libm, dt)));
        EXPECT_TRUE(std::isnan(obuf.slice(0, 0, 1).to(kCPU).item<double>())) << "element before the slice written";
        // In place on the unaligned view.
        Tensor y = base.to(dev);
        Tensor yv = y.slice(0, 1, std::nullopt);
        kiln::floor_(yv);
        EXPECT_TRUE(equal(y.slice(0, 1, std::nullopt).to(kCPU), kiln::floor(x)));
        EXPECT_TRUE(equal(y.slice(0, 0, 1).to(kCPU), base.slice(0, 0, 1)));
      }
    }
  }
}

TEST(CudaUnaryErrors, InvalidCallsNameTheOpAndDevices) {
  KILN_REQUIRE_CUDA();
  const Device dev = cuda_device(0);
  const Tensor xd = test::random_tensor({4, 5}, DType::F32, -1, 1, dev);
  Tensor out_cpu = empty({4, 5}, DType::F32);
  EXPECT_TRUE(throws_error([&] { kiln::exp_out(out_cpu, xd); }, {"exp_out", "cpu", "cuda", "same device"}));
  const Tensor id = test::random_int_tensor({3}, DType::I64, -5, 5, dev);
  EXPECT_TRUE(throws_error([&] { kiln::round(id, 2); }, {"round", "decimals", "int64"}));
  EXPECT_TRUE(throws_error([&] { kiln::frexp(id); }, {"frexp", "int64"}));
  EXPECT_TRUE(throws_error([&] { kiln::neg(full({2}, true, DType::Bool, dev)); }, {"neg", "bool"}));
  EXPECT_TRUE(throws_error([&] { kiln::silu(id); }, {"silu", "int64"}));
  Tensor xi = id.clone();
  EXPECT_TRUE(throws_error([&] { kiln::exp_(xi); }, {"exp_", "float32", "int64"}));
  const Tensor c = from_vector<Complex64>({Complex64(1, 2)}).to(dev);
  EXPECT_TRUE(throws_error([&] { kiln::sign(c); }, {"sign", "complex64"}));
  EXPECT_TRUE(throws_error([&] { kiln::erf(c); }, {"erf", "complex64"}));
  Tensor expanded = full({1}, 1.f, DType::F32, dev).expand({4});
  EXPECT_TRUE(throws_error([&] { kiln::neg_(expanded); }, {"neg_", "memory location"}));
}

}  // namespace
}  // namespace kiln
