// CUDA path of the binary elementwise family (src/cuda/binary*.cu, src/cuda/compare.cu) against the CPU
// backend from the same inputs: every op x supported dtype x layout class (contiguous, transposed,
// broadcast, [37,1] with [1,53], 0-d operands, sliced/unaligned, zero-size, large), Scalar forms, edge
// values, in-place and out= forms on poisoned outputs, integer division by zero raised at the next
// synchronisation, and a chain of ops captured in a CUDA graph.
//
// Tolerances: integer and bool results, comparisons, where, masked_fill, maximum/minimum, heaviside,
// bitwise ops, shifts and floor/trunc division are exact (equal()). Float add/sub/mul/div use the dtype's
// torch.testing tolerance (nvcc contracts a + alpha * b into one fma). pow, atan2, fmod and remainder add
// a few ulp of slack in f32 (rtol 2e-6 instead of 1.3e-6): device libm (powf 4 ulp, atan2f 3 ulp in the
// CUDA math docs) and glibc differ in the last bits; f16/bf16 round a float result, so their own
// tolerance (one half-precision ulp) already covers that.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda/conformance.h"

namespace kiln::test {
namespace {

using BinFn = std::function<Tensor(const Tensor&, const Tensor&)>;
using Gen = std::function<Tensor(const Shape&, DType)>;

Device dev() { return cuda_device(0); }

const std::vector<DType> kFloats = {DType::F32, DType::F64, DType::F16, DType::BF16};
const std::vector<DType> kInts = {DType::U8, DType::I8, DType::I16, DType::U16, DType::I32, DType::U32, DType::I64,
                                  DType::U64};

std::vector<DType> cat(std::vector<DType> a, const std::vector<DType>& b, bool with_bool = false) {
  a.insert(a.end(), b.begin(), b.end());
  if (with_bool) a.push_back(DType::Bool);
  return a;
}
const std::vector<DType> kNumeric = cat(kFloats, kInts);
const std::vector<DType> kAll = cat(kFloats, kInts, true);
const std::vector<DType> kIntsBool = cat(kInts, {}, true);

// Value generators (CPU, contiguous). Integers out of an unsigned dtype's range wrap, as conversion does.
Gen uniform(double lo, double hi) {
  return [=](const Shape& s, DType t) {
    if (is_integral(t, true)) return random_int_tensor(s, t, static_cast<int64_t>(lo), static_cast<int64_t>(hi));
    return random_tensor(s, t, lo, hi);
  };
}
// Integer values in every dtype (floats too), so that ties and zeros occur.
Gen integers(int64_t lo, int64_t hi) {
  return [=](const Shape& s, DType t) { return random_int_tensor(s, t, lo, hi); };
}

// As conformance.h's make_pair, with values from `gen`.
Pair pair_from(const Shape& shape, DType dtype, Layout layout, const Gen& gen) {
  Shape base = shape;
  const size_t n = shape.size();
  if (layout == Layout::Transposed && n >= 2) std::swap(base[n - 1], base[n - 2]);
  if (layout == Layout::Broadcast && n > 0) base[0] = 1;
  if (layout == Layout::Sliced && n > 0) base.back() = shape.back() * 2 + 1;
  auto view = [&](const Tensor& t) -> Tensor {
    if (layout == Layout::Transposed && n >= 2) return t.transpose(-1, -2);
    if (layout == Layout::Broadcast && n > 0) return t.expand(shape);
    if (layout == Layout::Sliced && n > 0) return t.slice(-1, 1, std::nullopt, 2);
    return t;
  };
  const Tensor c = gen(base, dtype);
  Pair p{view(c), view(c.to(dev()))};
  EXPECT_EQ(p.cpu.sizes(), shape);
  EXPECT_EQ(p.cpu.strides(), p.cuda.strides());
  return p;
}

// Operand pairs of one binary case: every layout class of the harness (the second operand contiguous
// where the first is broadcast), plus [37,1] with [1,53], a 0-d operand on either side, and a strided
// operand against a broadcast row.
struct Operands {
  std::string what;
  std::vector<Pair> in;
};
std::vector<Operands> operand_cases(DType ta, DType tb, const Gen& ga, const Gen& gb) {
  std::vector<Operands> v;
  for (Layout l : all_layouts()) {
    const Shape s = layout_shape(l);
    v.push_back({layout_name(l), {pair_from(s, ta, l, ga), pair_from(s, tb, l == Layout::Broadcast ? Layout::Contiguous : l, gb)}});
  }
  v.push_back({"[37,1] with [1,53]", {pair_from({37, 1}, ta, Layout::Contiguous, ga),
                                      pair_from({1, 53}, tb, Layout::Contiguous, gb)}});
  v.push_back({"tensor with 0-d", {pair_from({37, 53}, ta, Layout::Transposed, ga),
                                   pair_from({}, tb, Layout::Scalar0d, gb)}});
  v.push_back({"0-d with tensor", {pair_from({}, ta, Layout::Scalar0d, ga),
                                   pair_from({37, 53}, tb, Layout::Sliced, gb)}});
  v.push_back({"sliced with broadcast row", {pair_from({37, 53}, ta, Layout::Sliced, ga),
                                             pair_from({53}, tb, Layout::Sliced, gb)}});
  return v;
}

enum class Tol { Exact, Dtype, Libm };
std::optional<Tolerance> tolerance(Tol kind, DType result) {
  if (!is_floating(result) || kind == Tol::Exact) return Tolerance{0, 0};
  if (kind == Tol::Libm && result == DType::F32) return Tolerance{2e-6, 1e-5};
  return std::nullopt;
}

struct BinCase {
  std::string name;
  BinFn op;
  std::vector<DType> dtypes;
  Gen ga, gb;
  Tol tol;
};

void run_case(const BinCase& c, DType ta, DType tb) {
  for (const Operands& o : operand_cases(ta, tb, c.ga, c.gb)) {
    const std::string label = c.name + " " + dtype_name(ta) + "," + dtype_name(tb) + " " + o.what;
    // The result dtype, from one-element operands of the same dtypes and dim-ness (0-d operands promote
    // with lower priority).
    auto probe = [](const Pair& p) { return ones(p.cpu.dim() == 0 ? Shape{} : Shape{1}, p.cpu.dtype()); };
    const DType rt = c.op(probe(o.in[0]), probe(o.in[1])).dtype();
    expect_conformant(label, [&](const std::vector<Tensor>& x) { return one(c.op(x[0], x[1])); }, o.in,
                      tolerance(c.tol, rt));
  }
}

void run_cases(const std::vector<BinCase>& cases) {
  for (const BinCase& c : cases)
    for (DType t : c.dtypes) run_case(c, t, t);
}

Scalar alpha_for(DType t) {
  if (t == DType::Bool) return Scalar(true);
  if (is_integral(t, true)) return Scalar(3);
  return Scalar(2.5);
}

// ---- arithmetic -----------------------------------------------------------------------------------------

TEST(CudaBinary, ArithmeticMatchesCpuOnEveryLayout) {
  KILN_REQUIRE_CUDA();
  const Gen g = uniform(-100, 100), f = uniform(-2, 2);
  auto gen = [](Gen ints, Gen floats) {
    return [=](const Shape& s, DType t) { return is_integral(t, true) ? ints(s, t) : floats(s, t); };
  };
  const Gen ab = gen(g, f);
  run_cases({
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, kAll, ab, ab, Tol::Dtype},
      {"add alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, alpha_for(a.dtype())); }, kAll, ab, ab,
       Tol::Dtype},
      {"sub alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, alpha_for(a.dtype())); }, kNumeric, ab,
       ab, Tol::Dtype},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, kAll, ab, ab, Tol::Dtype},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, kAll, ab, ab, Tol::Dtype},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, kAll, integers(-3, 3), ab,
       Tol::Exact},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, kAll, integers(-3, 3), ab,
       Tol::Exact},
      {"heaviside", [](const Tensor& a, const Tensor& b) { return heaviside(a, b); }, kAll, integers(-2, 2), ab,
       Tol::Exact},
      {"atan2", [](const Tensor& a, const Tensor& b) { return atan2(a, b); }, kAll, ab, ab, Tol::Libm},
  });
}

TEST(CudaBinary, DivisionAndPowMatchCpuOnEveryLayout) {
  KILN_REQUIRE_CUDA();
  auto gen = [](Gen ints, Gen floats) {
    return [=](const Shape& s, DType t) { return is_integral(t, true) ? ints(s, t) : floats(s, t); };
  };
  const Gen num = gen(uniform(-100, 100), uniform(-10, 10));
  // Integer divisors never zero (a zero divisor is an error: see DivisionByZero... below); both signs.
  const Gen pos = gen(uniform(1, 13), uniform(0.25, 3)), neg = gen(uniform(-13, -1), uniform(-3, -0.25));
  for (const Gen& d : {pos, neg}) {
    run_cases({
        {"div trunc", [](const Tensor& a, const Tensor& b) { return div(a, b, "trunc"); }, kNumeric, num, d,
         Tol::Exact},
        {"div floor", [](const Tensor& a, const Tensor& b) { return div(a, b, "floor"); }, kNumeric, num, d,
         Tol::Exact},
        {"fmod", [](const Tensor& a, const Tensor& b) { return fmod(a, b); }, kNumeric, num, d, Tol::Libm},
        {"remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); }, kNumeric, num, d,
         Tol::Libm},
    });
  }
  // pow: positive float bases (negative ones give NaN for most exponents: covered by the edge values),
  // integer exponents from -3 (0 for negative powers of most bases) to 12 (wrapping).
  run_cases({{"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, kNumeric,
              gen(uniform(-6, 6), uniform(0.05, 3)), gen(uniform(-3, 12), uniform(-3, 3)), Tol::Libm}});
}

TEST(CudaBinary, BitwiseShiftAndLogicalMatchCpuOnEveryLayout) {
  KILN_REQUIRE_CUDA();
  const Gen wide = uniform(-100000, 100000);
  run_cases({
      {"bitwise_and", [](const Tensor& a, const Tensor& b) { return bitwise_and(a, b); }, kIntsBool, wide, wide,
       Tol::Exact},
      {"bitwise_or", [](const Tensor& a, const Tensor& b) { return bitwise_or(a, b); }, kIntsBool, wide, wide,
       Tol::Exact},
      {"bitwise_xor", [](const Tensor& a, const Tensor& b) { return bitwise_xor(a, b); }, kIntsBool, wide, wide,
       Tol::Exact},
      // Counts from -2 to 70 cover negative and too-large shifts (and, wrapped, huge unsigned counts).
      {"bitwise_left_shift", [](const Tensor& a, const Tensor& b) { return bitwise_left_shift(a, b); }, kInts,
       wide, uniform(-2, 70), Tol::Exact},
      {"bitwise_right_shift", [](const Tensor& a, const Tensor& b) { return bitwise_right_shift(a, b); }, kInts,
       wide, uniform(-2, 70), Tol::Exact},
      {"logical_and", [](const Tensor& a, const Tensor& b) { return logical_and(a, b); }, kAll, integers(-1, 1),
       integers(-1, 1), Tol::Exact},
      {"logical_or", [](const Tensor& a, const Tensor& b) { return logical_or(a, b); }, kAll, integers(-1, 1),
       integers(-1, 1), Tol::Exact},
      {"logical_xor", [](const Tensor& a, const Tensor& b) { return logical_xor(a, b); }, kAll, integers(-1, 1),
       integers(-1, 1), Tol::Exact},
  });
}

TEST(CudaBinary, MixedDtypesPromoteAsOnCpu) {
  KILN_REQUIRE_CUDA();
  const std::vector<std::pair<DType, DType>> pairs = {
      {DType::U8, DType::I8},  {DType::I32, DType::F16}, {DType::BF16, DType::F16}, {DType::F32, DType::F64},
      {DType::U16, DType::I64}, {DType::Bool, DType::U32}, {DType::I64, DType::BF16}};
  const Gen g = uniform(-20, 20);
  const BinCase cases[] = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, {}, g, g, Tol::Dtype},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, {}, g, g, Tol::Dtype},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, {}, g, g, Tol::Dtype},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, {}, g, g, Tol::Exact},
  };
  for (const auto& [ta, tb] : pairs)
    for (const BinCase& c : cases) run_case(c, ta, tb);
}

// Every pair of edge values (NaN, ±inf, ±0, subnormal, huge) through every float op.
TEST(CudaBinary, FloatEdgeValuesMatchCpu) {
  KILN_REQUIRE_CUDA();
  const std::vector<double> e = {0.0,   -0.0, 1.0,  -1.0,  0.5, -2.5, 3.0,  INFINITY, -INFINITY,
                                 NAN,   1e-40, 6e-8, 65504, 1e30, -7.0, 0.1, 1e300,   -1e-310};
  const int64_t n = static_cast<int64_t>(e.size());
  const std::vector<std::pair<std::string, std::pair<BinFn, Tol>>> ops = {
      {"add", {[](const Tensor& a, const Tensor& b) { return add(a, b, 2.5); }, Tol::Dtype}},
      {"mul", {[](const Tensor& a, const Tensor& b) { return mul(a, b); }, Tol::Dtype}},
      {"div", {[](const Tensor& a, const Tensor& b) { return div(a, b); }, Tol::Dtype}},
      {"div trunc", {[](const Tensor& a, const Tensor& b) { return div(a, b, "trunc"); }, Tol::Exact}},
      {"div floor", {[](const Tensor& a, const Tensor& b) { return div(a, b, "floor"); }, Tol::Exact}},
      {"pow", {[](const Tensor& a, const Tensor& b) { return pow(a, b); }, Tol::Libm}},
      {"maximum", {[](const Tensor& a, const Tensor& b) { return maximum(a, b); }, Tol::Exact}},
      {"minimum", {[](const Tensor& a, const Tensor& b) { return minimum(a, b); }, Tol::Exact}},
      {"fmod", {[](const Tensor& a, const Tensor& b) { return fmod(a, b); }, Tol::Libm}},
      {"remainder", {[](const Tensor& a, const Tensor& b) { return remainder(a, b); }, Tol::Libm}},
      {"atan2", {[](const Tensor& a, const Tensor& b) { return atan2(a, b); }, Tol::Libm}},
      {"heaviside", {[](const Tensor& a, const Tensor& b) { return heaviside(a, b); }, Tol::Exact}},
      {"lt", {[](const Tensor& a, const Tensor& b) { return lt(a, b); }, Tol::Exact}},
      {"eq", {[](const Tensor& a, const Tensor& b) { return eq(a, b); }, Tol::Exact}},
      {"ge", {[](const Tensor& a, const Tensor& b) { return ge(a, b); }, Tol::Exact}},
  };
  for (DType t : kFloats) {
    const Tensor col = from_vector<double>(e, Shape{n, 1}).to(t), row = from_vector<double>(e, Shape{1, n}).to(t);
    const std::vector<Pair> in = {{col, col.to(dev())}, {row, row.to(dev())}};
    for (const auto& [name, op] : ops) {
      const BinFn f = op.first;
      expect_conformant(name + " edge values " + dtype_name(t),
                        [&](const std::vector<Tensor>& x) { return one(f(x[0], x[1])); }, in,
                        tolerance(op.second, f(col, row).dtype()));
    }
  }
}

// Integer extremes (MIN / -1, MIN * -1, overflowing sums and powers, shifts of negative values).
TEST(CudaBinary, IntegerExtremesMatchCpu) {
  KILN_REQUIRE_CUDA();
  const std::vector<std::pair<std::string, BinFn>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b, 3); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
      {"bitwise_xor", [](const Tensor& a, const Tensor& b) { return bitwise_xor(a, b); }},
      {"bitwise_left_shift", [](const Tensor& a, const Tensor& b) { return bitwise_left_shift(a, b); }},
      {"bitwise_right_shift", [](const Tensor& a, const Tensor& b) { return bitwise_right_shift(a, b); }},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }},
  };
  const std::vector<std::pair<std::string, BinFn>> division = {
      {"div trunc", [](const Tensor& a, const Tensor& b) { return div(a, b, "trunc"); }},
      {"div floor", [](const Tensor& a, const Tensor& b) { return div(a, b, "floor"); }},
      {"fmod", [](const Tensor& a, const Tensor& b) { return fmod(a, b); }},
      {"remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); }},
  };
  for (DType t : kInts) {
    // min, min + 1, max - 1, max (through int64 / uint64 and wrapping conversion), and small values.
    std::vector<uint64_t> v = {0, 1, 2, 7, 63, uint64_t(-1), uint64_t(-2), uint64_t(-7)};
    const int bits = static_cast<int>(itemsize(t)) * 8;
    const uint64_t top = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
    const uint64_t half = uint64_t{1} << (bits - 1);
    for (uint64_t x : {top, top - 1, half, half - 1, half + 1}) v.push_back(x);
    const int64_t n = static_cast<int64_t>(v.size());
    const Tensor col = from_vector<uint64_t>(v, Shape{n, 1}).to(t), row = from_vector<uint64_t>(v, Shape{1, n}).to(t);
    const std::vector<Pair> in = {{col, col.to(dev())}, {row, row.to(dev())}};
    for (const auto& [name, f] : ops)
      expect_conformant(name + " extremes " + dtype_name(t),
                        [&](const std::vector<Tensor>& x) { return one(f(x[0], x[1])); }, in, Tolerance{0, 0});
    std::vector<uint64_t> nz;
    for (uint64_t x : v)
      if (x != 0) nz.push_back(x);
    const Tensor row_nz = from_vector<uint64_t>(nz, Shape{1, n - 1}).to(t);
    const std::vector<Pair> in_nz = {{col, col.to(dev())}, {row_nz, row_nz.to(dev())}};
    for (const auto& [name, f] : division)
      expect_conformant(name + " extremes " + dtype_name(t),
                        [&](const std::vector<Tensor>& x) { return one(f(x[0], x[1])); }, in_nz, Tolerance{0, 0});
  }
}

// ---- Scalar operands and operators -----------------------------------------------------------------------

TEST(CudaBinary, ScalarOperandsMatchCpu) {
  KILN_REQUIRE_CUDA();
  using SFn = std::function<Tensor(const Tensor&, const Scalar&)>;
  const std::vector<std::pair<std::string, SFn>> ops = {
      {"add", [](const Tensor& a, const Scalar& s) { return add(a, s, 2); }},
      {"sub", [](const Tensor& a, const Scalar& s) { return sub(a, s); }},
      {"mul", [](const Tensor& a, const Scalar& s) { return mul(a, s); }},
      {"div", [](const Tensor& a, const Scalar& s) { return div(a, s); }},
      {"div trunc", [](const Tensor& a, const Scalar& s) { return div(a, s, "trunc"); }},
      {"div floor", [](const Tensor& a, const Scalar& s) { return div(a, s, "floor"); }},
      {"pow", [](const Tensor& a, const Scalar& s) { return pow(a, s); }},
      {"pow scalar base", [](const Tensor& a, const Scalar& s) { return pow(s, a); }},
      {"fmod", [](const Tensor& a, const Scalar& s) { return fmod(a, s); }},
      {"remainder", [](const Tensor& a, const Scalar& s) { return remainder(a, s); }},
      {"operator+", [](const Tensor& a, const Scalar& s) { return a + s; }},
      {"operator-", [](const Tensor& a, const Scalar& s) { return a - s; }},
      {"operator*", [](const Tensor& a, const Scalar& s) { return a * s; }},
      {"operator/", [](const Tensor& a, const Scalar& s) { return a / s; }},
  };
  const std::vector<Scalar> scalars = {Scalar(3), Scalar(-2), Scalar(2.5), Scalar(0.5f)};
  for (DType t : kNumeric) {
    for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Scalar0d, Layout::Sliced}) {
      const std::vector<Pair> in = {pair_from(layout_shape(l), t, l, uniform(0, 9))};
      for (const auto& [name, f] : ops) {
        for (const Scalar& s : scalars) {
          // Refused on both devices alike (integer ** negative integer, float alpha with integers...).
          if (name == "pow" && is_integral(t, true) && s.is_integral() && s.to_int64() < 0) continue;
          const Tensor probe = f(in[0].cpu, s);
          const Tol tol = name.rfind("pow", 0) == 0 || name == "fmod" || name == "remainder" ? Tol::Libm
                          : name.rfind("div ", 0) == 0                                      ? Tol::Exact
                                                                                            : Tol::Dtype;
          expect_conformant(name + " " + dtype_name(t) + " " + layout_name(l) + " scalar " + s.str(),
                            [&](const std::vector<Tensor>& x) { return one(f(x[0], s)); }, in,
                            tolerance(tol, probe.dtype()));
        }
      }
    }
  }
}

TEST(CudaBinary, OperatorsMatchCpu) {
  KILN_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::BF16, DType::I32, DType::U8}) {
    const std::vector<Pair> in = {pair_from({37, 53}, t, Layout::Transposed, uniform(1, 20)),
                                  pair_from({1, 53}, t, Layout::Contiguous, uniform(1, 20))};
    expect_conformant(std::string("operators ") + dtype_name(t),
                      [](const std::vector<Tensor>& x) {
                        return std::vector<Tensor>{x[0] + x[1], x[0] - x[1], x[0] * x[1], x[0] / x[1], -x[0]};
                      },
                      in, tolerance(Tol::Dtype, t));
  }
}

// ---- comparisons ------------------------------------------------------------------------------------------

const std::vector<std::pair<std::string, BinFn>>& comparisons() {
  static const std::vector<std::pair<std::string, BinFn>> v = {
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }},
  };
  return v;
}

TEST(CudaCompare, EveryComparisonMatchesCpuOnEveryLayout) {
  KILN_REQUIRE_CUDA();
  std::vector<BinCase> cases;
  for (const auto& [name, f] : comparisons()) cases.push_back({name, f, kAll, integers(-3, 3), integers(-3, 3), Tol::Exact});
  run_cases(cases);
}

TEST(CudaCompare, MixedSignednessMatchesCpu) {
  KILN_REQUIRE_CUDA();
  // Values from -3 to 3: in unsigned dtypes the negative ones wrap to values near the top of the range.
  const std::vector<std::pair<DType, DType>> pairs = {
      {DType::U64, DType::I64}, {DType::I64, DType::U64}, {DType::U64, DType::I8},  {DType::I32, DType::U64},
      {DType::U32, DType::I32}, {DType::U8, DType::I8},   {DType::U16, DType::I64}, {DType::Bool, DType::U64},
      {DType::U64, DType::F32}, {DType::I64, DType::F16}};
  for (const auto& [ta, tb] : pairs)
    for (const auto& [name, f] : comparisons()) run_case({name, f, {}, integers(-3, 3), integers(-3, 3), Tol::Exact}, ta, tb);
}

TEST(CudaCompare, UnsignedAgainstSignedIsExactOnTheDevice) {
  KILN_REQUIRE_CUDA();
  auto dev_bool = [](const Tensor& t) { return t.to(kCPU).to_vector<bool>(); };
  const Tensor u32 = from_vector<uint32_t>({4000000000u, 0u, 5u}, std::nullopt, dev());
  const Tensor i32 = from_vector<int32_t>({-1, -1, 5}, std::nullopt, dev());
  EXPECT_EQ(dev_bool(gt(u32, i32)), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(dev_bool(lt(i32, u32)), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(dev_bool(eq(u32, i32)), (std::vector<bool>{false, false, true}));

  const uint64_t big = (uint64_t{1} << 63) + 1;
  const Tensor u64 = from_vector<uint64_t>({big, ~uint64_t{0}, 7}, std::nullopt, dev());
  const Tensor i64 = from_vector<int64_t>({-1, -1, 7}, std::nullopt, dev());
  EXPECT_EQ(dev_bool(gt(u64, i64)), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(dev_bool(ge(u64, i64)), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(dev_bool(lt(i64, u64)), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(dev_bool(le(u64, i64)), (std::vector<bool>{false, false, true}));
  EXPECT_EQ(dev_bool(ne(i64, u64)), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(dev_bool(eq(u64, i64)), (std::vector<bool>{false, false, true}));
  EXPECT_EQ(dev_bool(gt(u64, Scalar(-1))), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(dev_bool(lt(i64, Scalar(~uint64_t{0}))), (std::vector<bool>{true, true, true}));

  const Tensor u8 = from_vector<uint8_t>({0, 200, 255}, std::nullopt, dev());
  EXPECT_EQ(dev_bool(gt(u8, Scalar(-1))), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(dev_bool(eq(u8, Scalar(-1))), (std::vector<bool>{false, false, false}));
  EXPECT_EQ(dev_bool(lt(u8, Scalar(256))), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(dev_bool(ge(u8, Scalar(255))), (std::vector<bool>{false, false, true}));
}

TEST(CudaCompare, ScalarFormsMatchCpu) {
  KILN_REQUIRE_CUDA();
  const std::vector<Scalar> scalars = {Scalar(0), Scalar(-1), Scalar(2), Scalar(300), Scalar(1.5),
                                       Scalar(~uint64_t{0}), Scalar(true), Scalar(-1e10)};
  using SFn = std::function<Tensor(const Tensor&, const Scalar&)>;
  const std::vector<std::pair<std::string, SFn>> ops = {
      {"eq", [](const Tensor& a, const Scalar& s) { return eq(a, s); }},
      {"ne", [](const Tensor& a, const Scalar& s) { return ne(a, s); }},
      {"lt", [](const Tensor& a, const Scalar& s) { return lt(a, s); }},
      {"le", [](const Tensor& a, const Scalar& s) { return le(a, s); }},
      {"gt", [](const Tensor& a, const Scalar& s) { return gt(a, s); }},
      {"ge", [](const Tensor& a, const Scalar& s) { return ge(a, s); }},
  };
  for (DType t : kAll) {
    for (Layout l : {Layout::Transposed, Layout::Scalar0d, Layout::ZeroSize}) {
      const std::vector<Pair> in = {pair_from(layout_shape(l), t, l, integers(-2, 3))};
      for (const auto& [name, f] : ops)
        for (const Scalar& s : scalars)
          expect_conformant(name + " " + dtype_name(t) + " " + layout_name(l) + " scalar " + s.str(),
                            [&](const std::vector<Tensor>& x) { return one(f(x[0], s)); }, in, Tolerance{0, 0});
    }
  }
}

// ---- where, clamp, masked_fill -----------------------------------------------------------------------------

TEST(CudaWhere, MatchesCpuForEveryDtypeAndLayout) {
  KILN_REQUIRE_CUDA();
  for (DType t : kAll) {
    for (Layout l : all_layouts()) {
      const Shape s = layout_shape(l);
      const std::vector<Pair> in = {pair_from(s, DType::Bool, l, integers(0, 1)), pair_from(s, t, Layout::Contiguous, uniform(-9, 9)),
                                    pair_from(s, t, l == Layout::Broadcast ? Layout::Sliced : l, uniform(-9, 9))};
      expect_conformant(std::string("where ") + dtype_name(t) + " " + layout_name(l),
                        [](const std::vector<Tensor>& x) { return one(where(x[0], x[1], x[2])); }, in, Tolerance{0, 0});
    }
    // cond [37,1], a [1,53], b 0-d; and a Scalar other.
    const std::vector<Pair> in = {pair_from({37, 1}, DType::Bool, Layout::Contiguous, integers(0, 1)),
                                  pair_from({1, 53}, t, Layout::Contiguous, uniform(-9, 9)),
                                  pair_from({}, t, Layout::Scalar0d, uniform(-9, 9))};
    expect_conformant(std::string("where broadcast ") + dtype_name(t),
                      [](const std::vector<Tensor>& x) {
                        return std::vector<Tensor>{where(x[0], x[1], x[2]), where(x[0], x[1], Scalar(7))};
                      },
                      in, Tolerance{0, 0});
  }
  // Mixed dtypes promote.
  const std::vector<Pair> in = {pair_from({37, 53}, DType::Bool, Layout::Contiguous, integers(0, 1)),
                                pair_from({37, 53}, DType::I32, Layout::Transposed, uniform(-9, 9)),
                                pair_from({53}, DType::F16, Layout::Contiguous, uniform(-9, 9))};
  expect_conformant("where i32/f16", [](const std::vector<Tensor>& x) { return one(where(x[0], x[1], x[2])); }, in,
                    Tolerance{0, 0});
}

TEST(CudaClamp, ScalarAndTensorBoundsMatchCpu) {
  KILN_REQUIRE_CUDA();
  for (DType t : kNumeric) {
    for (Layout l : all_layouts()) {
      const Shape s = layout_shape(l);
      const std::vector<Pair> in = {pair_from(s, t, l, uniform(-9, 9))};
      expect_conformant(std::string("clamp scalar ") + dtype_name(t) + " " + layout_name(l),
                        [](const std::vector<Tensor>& x) {
                          return std::vector<Tensor>{clamp(x[0], Scalar(-2), Scalar(3)),
                                                     clamp(x[0], Scalar(1), std::nullopt),
                                                     clamp(x[0], std::nullopt, Scalar(2.5)),
                                                     clamp(x[0], Scalar(4), Scalar(1))};  // lo > hi gives hi
                        },
                        in, Tolerance{0, 0});
    }
    const std::vector<Pair> in = {pair_from({37, 53}, t, Layout::Sliced, uniform(-9, 9)),
                                  pair_from({37, 1}, t, Layout::Contiguous, uniform(-5, 0)),
                                  pair_from({53}, t, Layout::Contiguous, uniform(0, 5))};
    expect_conformant(std::string("clamp tensor ") + dtype_name(t),
                      [](const std::vector<Tensor>& x) {
                        return std::vector<Tensor>{clamp(x[0], std::optional<Tensor>(x[1]), std::optional<Tensor>(x[2])),
                                                   clamp(x[0], std::optional<Tensor>(), std::optional<Tensor>(x[2]))};
                      },
                      in, Tolerance{0, 0});
    // In place: self's own layout kept, written through the view.
    const Pair p = pair_from({37, 53}, t, Layout::Transposed, uniform(-9, 9));
    Tensor a = p.cpu, b = p.cuda;
    clamp_(a, Scalar(-1), Scalar(4));
    clamp_(b, Scalar(-1), Scalar(4));
    EXPECT_TRUE(b.is_cuda());
    EXPECT_TRUE(equal(b.to(kCPU), a)) << "clamp_ " << dtype_name(t);
  }
  // NaN propagates from x (and from a NaN bound).
  const Tensor x = from_vector<float>({NAN, 1.f, 5.f}, std::nullopt, dev());
  EXPECT_TRUE(equal(clamp(x, Scalar(0), Scalar(2)).to(kCPU), from_vector<float>({NAN, 1.f, 2.f})));
}

TEST(CudaMaskedFill, InPlaceAndOutOfPlaceMatchCpu) {
  KILN_REQUIRE_CUDA();
  for (DType t : kAll) {
    // In range for the dtype: the out-of-place form refuses values that overflow it.
    const Scalar value = t == DType::Bool     ? Scalar(true)
                         : is_floating(t)     ? Scalar(NAN)
                         : is_unsigned(t)     ? Scalar(200)
                                              : Scalar(-1);
    for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Sliced, Layout::ZeroSize, Layout::Scalar0d,
                     Layout::Large}) {
      const Shape s = layout_shape(l);
      const Pair self = pair_from(s, t, l, uniform(-9, 9));
      for (const Pair& mask : {pair_from(s, DType::Bool, Layout::Contiguous, integers(0, 1)),
                               pair_from(s, DType::Bool, Layout::Broadcast, integers(0, 1))}) {
        SCOPED_TRACE(std::string("masked_fill_ ") + dtype_name(t) + " " + layout_name(l));
        // In place through a fresh view of the layout (transposed, sliced...) on both sides.
        const Pair fresh = pair_from(s, t, l, uniform(-9, 9));
        Tensor a = fresh.cpu, b = fresh.cuda;
        masked_fill_(a, mask.cpu, value);
        masked_fill_(b, mask.cuda, value);
        EXPECT_TRUE(b.is_cuda());
        EXPECT_TRUE(equal(b.to(kCPU), a));
        expect_conformant(std::string("masked_fill ") + dtype_name(t) + " " + layout_name(l),
                          [&](const std::vector<Tensor>& x) { return one(masked_fill(x[0], x[1], value)); },
                          {self, mask}, Tolerance{0, 0});
      }
    }
  }
  // Out of place, mask and x broadcast together.
  const std::vector<Pair> in = {pair_from({1, 53}, DType::F32, Layout::Contiguous, uniform(-9, 9)),
                                pair_from({37, 1}, DType::Bool, Layout::Contiguous, integers(0, 1))};
  expect_conformant("masked_fill broadcast", [](const std::vector<Tensor>& x) { return one(masked_fill(x[0], x[1], 2.5)); },
                    in, Tolerance{0, 0});
}

// ---- in place and out= ---------------------------------------------------------------------------------------

TEST(CudaBinary, InPlaceFormsMatchCpu) {
  KILN_REQUIRE_CUDA();
  using IFn = std::function<void(Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, IFn>> ops = {
      {"add_", [](Tensor& s, const Tensor& o) { add_(s, o, 2); }},
      {"add_ scalar", [](Tensor& s, const Tensor&) { add_(s, Scalar(3), 2); }},
      {"sub_", [](Tensor& s, const Tensor& o) { sub_(s, o); }},
      {"mul_", [](Tensor& s, const Tensor& o) { mul_(s, o); }},
      {"mul_ scalar", [](Tensor& s, const Tensor&) { mul_(s, Scalar(-3)); }},
      {"div_", [](Tensor& s, const Tensor& o) { div_(s, o); }},
      {"div_ scalar", [](Tensor& s, const Tensor&) { div_(s, Scalar(4)); }},
  };
  for (DType t : kNumeric) {
    // other of the same dtype, and of another one (the result is computed in the promoted dtype, then cast
    // into self); uint64 with a signed type would promote to float64, which does not cast back.
    for (DType other : {t, t == DType::U64 ? DType::U8 : DType::I16}) {
      const Pair o = pair_from({53}, other, Layout::Contiguous, uniform(1, 9));
      for (const auto& [name, f] : ops) {
        const bool div_int = name.rfind("div_", 0) == 0 && is_integral(t, true);  // float into int: refused
        SCOPED_TRACE(name + " " + dtype_name(t) + " with " + dtype_name(other));
        // self: a fresh transposed view, written through its strides.
        const Pair self = pair_from({37, 53}, t, Layout::Transposed, uniform(1, 9));
        Tensor a = self.cpu, b = self.cuda;
        const void* ptr = b.data_ptr();
        if (div_int) {
          EXPECT_TRUE(throws_error([&] { f(b, o.cuda); }, {"can't be cast"}));
          continue;
        }
        f(a, o.cpu);
        f(b, o.cuda);
        EXPECT_EQ(b.data_ptr(), ptr) << "in place must write into self";
        EXPECT_TRUE(all_close(b.to(kCPU), a, tolerance(Tol::Dtype, t)));
      }
    }
  }
  // self overlapping its operand other than as the same view: computed into a temporary first.
  const Pair sq = pair_from({37, 37}, DType::F32, Layout::Contiguous, uniform(-9, 9));
  Tensor a = sq.cpu.clone(), b = sq.cuda.clone();
  add_(a, a.t());
  add_(b, b.t());
  EXPECT_TRUE(all_close(b.to(kCPU), a));
}

TEST(CudaBinary, OutFormsWriteIntoPoisonedOutputs) {
  KILN_REQUIRE_CUDA();
  using OFn = std::function<void(Tensor&, const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, OFn>> ops = {
      {"add_out", [](Tensor& out, const Tensor& a, const Tensor& b) { add_out(out, a, b, 2); }},
      {"sub_out", [](Tensor& out, const Tensor& a, const Tensor& b) { sub_out(out, a, b); }},
      {"mul_out", [](Tensor& out, const Tensor& a, const Tensor& b) { mul_out(out, a, b); }},
      {"div_out", [](Tensor& out, const Tensor& a, const Tensor& b) { div_out(out, a, b); }},
  };
  for (DType t : kNumeric) {
    const Pair a = pair_from({37, 53}, t, Layout::Sliced, uniform(1, 9));
    const Pair b = pair_from({37, 1}, t, Layout::Contiguous, uniform(1, 9));
    for (const auto& [name, f] : ops) {
      const DType out_t = name == "div_out" && is_integral(t, true) ? DType::F32 : t;
      // A contiguous out, a transposed out (written through its strides), and an out of another dtype
      // (f64 holds every result here).
      for (int kind = 0; kind < 3; ++kind) {
        SCOPED_TRACE(name + " " + dtype_name(t) + " out kind " + std::to_string(kind));
        const DType ot = kind == 2 ? DType::F64 : out_t;
        Tensor oc = kind == 1 ? empty({53, 37}, ot).t() : empty({37, 53}, ot);
        Tensor od = kind == 1 ? empty({53, 37}, ot, dev()).t() : empty({37, 53}, ot, dev());
        poison(oc);
        poison(od);
        const void* ptr = od.data_ptr();
        f(oc, a.cpu, b.cpu);
        f(od, a.cuda, b.cuda);
        EXPECT_EQ(od.data_ptr(), ptr);
        EXPECT_EQ(od.strides(), oc.strides());
        EXPECT_TRUE(all_close(od.to(kCPU), oc, tolerance(Tol::Dtype, ot)));
      }
    }
  }
  // An out of another shape is replaced by one of the result's shape.
  Tensor od = empty({3}, DType::F32, dev());
  const Pair a = pair_from({37, 53}, DType::F32, Layout::Contiguous, uniform(-2, 2));
  add_out(od, a.cuda, a.cuda);
  EXPECT_TRUE(od.is_cuda());
  EXPECT_TRUE(all_close(od.to(kCPU), add(a.cpu, a.cpu)));
}

// ---- errors and graphs -----------------------------------------------------------------------------------------

TEST(CudaBinary, IntegerDivisionByZeroRaisesAtTheNextSynchronisation) {
  KILN_REQUIRE_CUDA();
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&, const Tensor&)>>> ops = {
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b, "trunc"); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b, "floor"); }},
      {"fmod", [](const Tensor& a, const Tensor& b) { return fmod(a, b); }},
      {"remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); }},
  };
  for (DType t : {DType::I32, DType::U8, DType::I64, DType::U64}) {
    const Tensor a = from_vector<int64_t>({7, 8, 9, 10}).to(t).to(dev());
    const Tensor b = from_vector<int64_t>({2, 0, 3, 0}).to(t).to(dev());
    for (const auto& [name, f] : ops) {
      SCOPED_TRACE(name + " " + dtype_name(t));
      Tensor r;
      ASSERT_NO_THROW(r = f(a, b));  // asynchronous: nothing is known yet
      EXPECT_TRUE(throws_error([] { synchronize(dev()); }, {name, "ZeroDivisionError"}));
      // Reported once; the elements are 0 and the device stays usable.
      EXPECT_NO_THROW(synchronize(dev()));
      const auto v = r.to(kCPU).to(DType::I64).to_vector<int64_t>();
      EXPECT_EQ(v[1], 0);
      EXPECT_EQ(v[3], 0);
      // Raised by a copy to the host too.
      f(a, b);
      EXPECT_TRUE(throws_error([&] { (void)r.to(kCPU); }, {"ZeroDivisionError"}));
    }
    EXPECT_TRUE(throws_error([&] { (void)remainder(a.to(kCPU), Scalar(0)); }, {"ZeroDivisionError"}));
    (void)remainder(a, Scalar(0));
    EXPECT_TRUE(throws_error([] { synchronize(dev()); }, {"ZeroDivisionError"}));
    EXPECT_TRUE(equal(add(a, a).to(kCPU), add(a.to(kCPU), a.to(kCPU))));
  }
  // Float division by zero is no error.
  const Tensor x = from_vector<float>({1.f, -1.f, 0.f}, std::nullopt, dev());
  const Tensor z = zeros({3}, DType::F32, dev());
  EXPECT_TRUE(equal(div(x, z, "floor").to(kCPU), div(x.to(kCPU), z.to(kCPU), "floor")));
  EXPECT_NO_THROW(synchronize(dev()));
}

TEST(CudaBinary, GraphCapturedChainReplaysLikeEager) {
  KILN_REQUIRE_CUDA();
  const Pair xp = pair_from({37, 53}, DType::F32, Layout::Contiguous, uniform(0.5, 4));
  const Pair yp = pair_from({53}, DType::F32, Layout::Contiguous, uniform(0.5, 4));
  const Pair ip = pair_from({37, 53}, DType::I32, Layout::Contiguous, uniform(-50, 50));
  const Pair jp = pair_from({37, 53}, DType::I32, Layout::Contiguous, uniform(1, 7));
  Tensor x = xp.cuda.clone(), y = yp.cuda.clone(), i = ip.cuda.clone(), j = jp.cuda.clone();
  auto chain = [](const Tensor& x, const Tensor& y, const Tensor& i, const Tensor& j) {
    Tensor a = add(mul(x, y), y, 0.5);
    Tensor b = div(a, Scalar(3)) - pow(x, Scalar(2));
    Tensor c = where(gt(x, y), maximum(a, b), atan2(b, x));
    Tensor k = remainder(bitwise_xor(i, j), j) + div(i, j, "floor");
    Tensor d = add(c, k.to(DType::F32));
    masked_fill_(d, lt(d, Scalar(0)), -1);
    return clamp(d, Scalar(-0.5), Scalar(100));
  };
  const Tensor eager = chain(x, y, i, j).to(kCPU);  // also creates the device error record before capture
  EXPECT_TRUE(all_close(eager, chain(xp.cpu, yp.cpu, ip.cpu, jp.cpu), Tolerance{2e-6, 1e-5}));

  const Stream s = Stream::create(dev());
  Graph g;
  Tensor out;
  // Inputs are read by the replay where they are now: new values go in with copy_.
  g.capture(s, [&] { out = chain(x, y, i, j); });
  ASSERT_TRUE(g.captured());
  g.replay();
  s.synchronize();
  EXPECT_TRUE(equal(out.to(kCPU), eager));

  const Pair x2 = pair_from({37, 53}, DType::F32, Layout::Contiguous, uniform(0.5, 4));
  const Pair i2 = pair_from({37, 53}, DType::I32, Layout::Contiguous, uniform(-50, 50));
  x.copy_(x2.cuda);
  i.copy_(i2.cuda);
  synchronize(dev());
  g.replay();
  s.synchronize();
  EXPECT_TRUE(equal(out.to(kCPU), chain(x, y, i, j).to(kCPU)));
}

}  // namespace
}  // namespace kiln::test
