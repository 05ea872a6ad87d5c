// CUDA indexing (index_select, gather, take, scatter, scatter_add), range factories and random numbers,
// each against the CPU from the same inputs. Every test skips with a visible reason where no GPU can be
// used.
//
// Tolerances: data movement, integer sums, creation and random numbers are compared exactly (bit for bit
// where the brief of the op promises it). Exceptions, each explained where it is used: scatter_add over
// floats (atomics reassociate the sum), logspace (device pow vs glibc pow), randn in f64 (device log/cos vs
// glibc).
#include <algorithm>
#include <cstring>
#include <numeric>

#include "cuda/conformance.h"
#include "kiln/runtime.h"

namespace kiln {
namespace {

using test::Layout;
using test::Pair;

Device gpu() { return cuda_device(0); }

Pair twin(const Tensor& cpu_tensor) { return Pair{cpu_tensor, cpu_tensor.to(gpu())}; }

// Same dtype, shape and bytes (a CUDA tensor is copied to the host first; both must be contiguous there).
::testing::AssertionResult bits_equal(const Tensor& actual, const Tensor& expected) {
  Tensor a = actual.is_cuda() ? actual.to(kCPU) : actual.contiguous();
  Tensor e = expected.contiguous();
  if (a.dtype() != e.dtype() || a.sizes() != e.sizes())
    return ::testing::AssertionFailure() << "got " << a.meta() << ", expected " << e.meta();
  if (a.nbytes() == 0 || std::memcmp(a.data_ptr(), e.data_ptr(), a.nbytes()) == 0)
    return ::testing::AssertionSuccess();
  const size_t w = a.itemsize();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(static_cast<char*>(a.data_ptr()) + i * w, static_cast<char*>(e.data_ptr()) + i * w, w) != 0)
      return ::testing::AssertionFailure() << "first differing element at flat index " << i << ": got "
                                           << a.reshape({-1})[i].item().str() << ", expected "
                                           << e.reshape({-1})[i].item().str();
  }
  return ::testing::AssertionSuccess();
}

// Largest distance in units in the last place between two float tensors of one dtype (f16/bf16/f32/f64).
int64_t max_ulp_distance(const Tensor& actual, const Tensor& expected) {
  Tensor a = actual.to(kCPU).contiguous(), e = expected.contiguous();
  const size_t w = a.itemsize();
  const uint64_t sign = uint64_t{1} << (8 * w - 1);
  auto ordered = [&](uint64_t bits) -> __int128 {  // sign-magnitude -> a monotonic integer scale
    const __int128 mag = static_cast<__int128>(bits & (sign - 1));
    return (bits & sign) ? -mag : mag;
  };
  __int128 worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    uint64_t x = 0, y = 0;
    std::memcpy(&x, static_cast<char*>(a.data_ptr()) + i * w, w);
    std::memcpy(&y, static_cast<char*>(e.data_ptr()) + i * w, w);
    const __int128 d = ordered(x) - ordered(y);
    worst = std::max(worst, d < 0 ? -d : d);
  }
  return static_cast<int64_t>(std::min<__int128>(worst, INT64_MAX));
}

// An index tensor with values in [lo, hi] of `shape`, in the given layout class (contiguous, transposed or
// sliced), on both devices.
Pair index_pair(const Shape& shape, DType dtype, int64_t lo, int64_t hi, Layout layout = Layout::Contiguous) {
  if (layout == Layout::Transposed && shape.size() >= 2) {
    Shape base = shape;
    std::swap(base[base.size() - 1], base[base.size() - 2]);
    Pair p = twin(test::random_int_tensor(base, dtype, lo, hi));
    return Pair{p.cpu.transpose(-1, -2), p.cuda.transpose(-1, -2)};
  }
  if (layout == Layout::Sliced && !shape.empty()) {
    Shape base = shape;
    base.back() = shape.back() * 2;
    Pair p = twin(test::random_int_tensor(base, dtype, lo, hi));
    return Pair{p.cpu.slice(-1, 0, std::nullopt, 2), p.cuda.slice(-1, 0, std::nullopt, 2)};
  }
  return twin(test::random_int_tensor(shape, dtype, lo, hi));
}

// An index for scatter with `shape` whose values along `dim` are distinct within each line (so scatter with
// a tensor src is deterministic), in [0, bound). shape[dim] <= bound.
Pair unique_index(const Shape& shape, int64_t dim, int64_t bound, DType dtype) {
  Tensor idx = empty(shape, DType::I64);
  const int64_t len = shape[dim], n = idx.numel();
  std::vector<int64_t> vals(n);
  const int64_t inner = std::accumulate(shape.begin() + dim + 1, shape.end(), int64_t{1}, std::multiplies<>());
  std::vector<int64_t> perm(bound);
  for (int64_t line = 0; len > 0 && line < n / len; ++line) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), test::rng());
    const int64_t outer = line / inner, in = line % inner;
    for (int64_t j = 0; j < len; ++j) vals[(outer * len + j) * inner + in] = perm[j];
  }
  return twin(from_vector<int64_t>(vals, shape).to(dtype));
}

const std::vector<DType> kMoveTypes = {DType::Bool, DType::U8, DType::I16, DType::F16, DType::BF16,
                                       DType::F32,  DType::I32, DType::F64, DType::I64, DType::C64};
const test::Tolerance kExact{0, 0};

// ---- index_select / gather / take ------------------------------------------------------------------------

TEST(CudaIndexSelect, MatchesCpuOverDtypesLayoutsAndIndexTypes) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kMoveTypes)
    for (Layout l : test::all_layouts()) {
      if (l == Layout::Large && dt != DType::F32) continue;
      const Shape shape = test::layout_shape(l);
      Pair x = test::make_pair(shape, dt, l);
      for (DType it : {DType::I64, DType::I32})
        for (int64_t dim : {int64_t{0}, int64_t{-1}}) {
          const int64_t size = shape.empty() ? 1 : shape[dim < 0 ? shape.size() - 1 : dim];
          const int64_t count = size == 0 ? 0 : shape.empty() ? 1 : 23;  // a 0-d input takes one index
          const int64_t hi = std::max<int64_t>(size - 1, 0);
          Pair idx = l == Layout::Sliced ? index_pair({count}, it, 0, hi, Layout::Sliced) : index_pair({count}, it, 0, hi);
          test::expect_conformant(
              str("index_select ", dtype_name(dt), " ", test::layout_name(l), " dim ", dim, " ", dtype_name(it)),
              [&](const std::vector<Tensor>& in) { return test::one(index_select(in[0], dim, in[1])); }, {x, idx},
              kExact);
        }
    }
}

TEST(CudaIndexSelect, ZeroDimIndexAndInput) {
  KILN_REQUIRE_CUDA();
  Pair x = test::make_pair({}, DType::F32, Layout::Scalar0d);
  Pair idx = twin(scalar_tensor(0, DType::I64));
  test::expect_conformant("index_select 0-d", [](const std::vector<Tensor>& in) {
    return test::one(index_select(in[0], 0, in[1]));
  }, {x, idx}, kExact);
  Pair m = test::make_pair({4, 6}, DType::F64, Layout::Contiguous);
  Pair i3 = twin(scalar_tensor(3, DType::I32));
  test::expect_conformant("index_select 0-d index", [](const std::vector<Tensor>& in) {
    return test::one(index_select(in[0], 0, in[1]));
  }, {m, i3}, kExact);
}

TEST(CudaGather, MatchesCpuOverDtypesLayoutsAndIndexTypes) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kMoveTypes)
    for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Broadcast, Layout::Sliced, Layout::ZeroSize}) {
      const Shape shape = test::layout_shape(l);
      Pair x = test::make_pair(shape, dt, l);
      for (DType it : {DType::I64, DType::I32})
        for (int64_t dim : {0, 1}) {
          // index no larger than x off dim; any length along dim.
          Shape ishape = {std::min<int64_t>(shape[0], 11), std::min<int64_t>(shape[1], 9)};
          ishape[dim] = 17;
          if (shape[dim] == 0) ishape[dim] = 0;
          for (Layout il : {Layout::Contiguous, Layout::Transposed}) {
            Pair idx = index_pair(ishape, it, 0, std::max<int64_t>(shape[dim] - 1, 0), il);
            test::expect_conformant(str("gather ", dtype_name(dt), " ", test::layout_name(l), " dim ", dim, " ",
                                        dtype_name(it), " index ", test::layout_name(il)),
                                    [&](const std::vector<Tensor>& in) { return test::one(gather(in[0], dim, in[1])); },
                                    {x, idx}, kExact);
          }
        }
    }
}

TEST(CudaGather, ZeroDim) {
  KILN_REQUIRE_CUDA();
  Pair x = test::make_pair({}, DType::I64, Layout::Scalar0d, -100, 100);
  Pair idx = twin(scalar_tensor(0, DType::I64));
  test::expect_conformant("gather 0-d", [](const std::vector<Tensor>& in) { return test::one(gather(in[0], 0, in[1])); },
                          {x, idx}, kExact);
}

TEST(CudaTake, MatchesCpuWithNegativeIndices) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kMoveTypes)
    for (Layout l : test::all_layouts()) {
      if (l == Layout::Large && dt != DType::F64) continue;
      const Shape shape = test::layout_shape(l);
      Pair x = test::make_pair(shape, dt, l);
      const int64_t n = x.cpu.numel();
      for (DType it : {DType::I64, DType::I32})
        for (Layout il : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
          const Shape ishape = n == 0 ? Shape{0, 5} : Shape{6, 9};
          Pair idx = index_pair(ishape, it, -n, std::max<int64_t>(n - 1, 0), il);
          test::expect_conformant(str("take ", dtype_name(dt), " ", test::layout_name(l), " ", dtype_name(it),
                                      " index ", test::layout_name(il)),
                                  [&](const std::vector<Tensor>& in) { return test::one(take(in[0], in[1])); },
                                  {x, idx}, kExact);
        }
    }
}

// ---- scatter / scatter_add --------------------------------------------------------------------------------

// Float sums over duplicate indices run through atomics in no fixed order: the result is the CPU's up to
// reassociation. With at most ~40 terms of magnitude <= 2 per slot, the f32 reassociation error is below
// 40 * 80 * 2^-24 ~ 2e-4 absolute; f16/bf16 round the f32 sum once, so they may differ by one ulp of the
// output type where the two f32 sums straddle a rounding boundary.
test::Tolerance scatter_add_tolerance(DType dt) {
  switch (dt) {
    case DType::F32: case DType::C64: return {1e-5, 2e-4};
    case DType::F64: return {1e-12, 1e-12};
    case DType::F16: return {1e-3, 2e-3};
    case DType::BF16: return {8e-3, 1.6e-2};
    default: return kExact;  // integer (wrapping) sums and bool or are associative
  }
}

TEST(CudaScatter, TensorSrcMatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kMoveTypes)
    for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Broadcast, Layout::Sliced})
      for (DType it : {DType::I64, DType::I32})
        for (int64_t dim : {0, 1}) {
          const Shape shape = test::layout_shape(l);  // {37, 53}
          Pair x = test::make_pair(shape, dt, l);
          Shape ishape = {13, 29};
          Pair idx = unique_index(ishape, dim, shape[dim], it);
          Pair src = test::make_pair({21, 40}, dt, l == Layout::Broadcast ? Layout::Transposed : l);
          test::expect_conformant(
              str("scatter ", dtype_name(dt), " ", test::layout_name(l), " dim ", dim, " ", dtype_name(it)),
              [&](const std::vector<Tensor>& in) { return test::one(scatter(in[0], dim, in[1], in[2])); },
              {x, idx, src}, kExact);
        }
}

TEST(CudaScatter, ValueMatchesCpuWithDuplicateIndices) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kMoveTypes)
    for (Layout il : {Layout::Contiguous, Layout::Transposed}) {
      Pair x = test::make_pair({19, 23}, dt, Layout::Sliced);
      Pair idx = index_pair({12, 10}, DType::I64, 0, 18, il);  // duplicates write the same value
      const Scalar v = dt == DType::Bool ? Scalar(true) : Scalar(1);
      test::expect_conformant(str("scatter value ", dtype_name(dt), " index ", test::layout_name(il)),
                              [&](const std::vector<Tensor>& in) { return test::one(scatter(in[0], 0, in[1], v)); },
                              {x, idx}, kExact);
    }
}

TEST(CudaScatter, InPlaceIntoSlicedSelfWritesThroughStrides) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {DType::F32, DType::I8, DType::F16}) {
    Pair base = test::make_pair({16, 31}, dt, Layout::Contiguous);
    Tensor self_cpu = base.cpu.slice(1, 1, std::nullopt, 2), self_cuda = base.cuda.slice(1, 1, std::nullopt, 2);
    Pair idx = unique_index({16, 7}, 1, self_cpu.size(1), DType::I64);
    Pair src = test::make_pair({16, 9}, dt, Layout::Transposed);
    scatter_(self_cpu, 1, idx.cpu, src.cpu);
    scatter_(self_cuda, 1, idx.cuda, src.cuda);
    EXPECT_TRUE(bits_equal(base.cuda, base.cpu)) << dtype_name(dt);  // the elements between stay untouched
    // Along dim 0 the same index has duplicates (values < 15 <= 16 rows).
    scatter_add_(self_cpu, 0, idx.cpu, src.cpu);
    scatter_add_(self_cuda, 0, idx.cuda, src.cuda);
    EXPECT_TRUE(test::all_close(base.cuda.to(kCPU), base.cpu, scatter_add_tolerance(dt))) << dtype_name(dt);
  }
}

TEST(CudaScatter, ZeroSizeAndZeroDim) {
  KILN_REQUIRE_CUDA();
  Pair x = test::make_pair({5, 4}, DType::F32, Layout::Contiguous);
  Pair idx = twin(empty({0, 4}, DType::I64));
  Pair src = test::make_pair({3, 4}, DType::F32, Layout::Contiguous);
  test::expect_conformant("scatter empty index", [](const std::vector<Tensor>& in) {
    return test::one(scatter(in[0], 0, in[1], in[2]));
  }, {x, idx, src}, kExact);
  Pair x0 = test::make_pair({}, DType::F64, Layout::Scalar0d);
  Pair i0 = twin(scalar_tensor(0, DType::I32));
  Pair s0 = test::make_pair({}, DType::F64, Layout::Scalar0d);
  test::expect_conformant("scatter_add 0-d", [](const std::vector<Tensor>& in) {
    return test::one(scatter_add(in[0], 0, in[1], in[2]));
  }, {x0, i0, s0}, kExact);
}

TEST(CudaScatterAdd, MatchesCpuWithDuplicateIndices) {
  KILN_REQUIRE_CUDA();
  const std::vector<DType> types = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::C64, DType::Bool,
                                    DType::I8,  DType::U8,  DType::I16, DType::U16,  DType::I32, DType::U32,
                                    DType::I64, DType::U64};
  for (DType dt : types)
    for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Sliced})
      for (DType it : {DType::I64, DType::I32})
        for (int64_t dim : {0, 1}) {
          // Integers span their whole range so that sums wrap.
          const bool integer = is_integral(dt, false);
          const double lo = integer ? -120 : -2, hi = integer ? 120 : 2;
          Pair x = test::make_pair({9, 11}, dt, l, dt == DType::Bool ? 0 : lo, dt == DType::Bool ? 1 : hi);
          Pair src = test::make_pair({40, 40}, dt, l, dt == DType::Bool ? 0 : lo, dt == DType::Bool ? 1 : hi);
          Shape ishape = {9, 11};
          ishape[dim] = 37;  // ~4 hits per slot of self
          Pair idx = index_pair(ishape, it, 0, (dim == 0 ? 9 : 11) - 1, l == Layout::Transposed ? l : Layout::Contiguous);
          test::expect_conformant(
              str("scatter_add ", dtype_name(dt), " ", test::layout_name(l), " dim ", dim, " ", dtype_name(it)),
              [&](const std::vector<Tensor>& in) { return test::one(scatter_add(in[0], dim, in[1], in[2])); },
              {x, idx, src}, scatter_add_tolerance(dt));
        }
}

TEST(CudaScatterAdd, NarrowIntegersWrapUnderContention) {
  KILN_REQUIRE_CUDA();
  // 5000 additions into 3 neighbouring bytes of one 32-bit word: the CAS loop must not lose any.
  for (DType dt : {DType::I8, DType::U8, DType::I16, DType::U16}) {
    Pair x = twin(zeros({3}, dt));
    Pair src = twin(test::random_int_tensor({5000}, dt, 0, 100));
    Pair idx = index_pair({5000}, DType::I64, 0, 2);
    test::expect_conformant(str("scatter_add contention ", dtype_name(dt)), [](const std::vector<Tensor>& in) {
      return test::one(scatter_add(in[0], 0, in[1], in[2]));
    }, {x, idx, src}, kExact);
  }
}

TEST(CudaScatterAdd, HalfAccumulatesInFloatAndRoundsOnce) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {DType::F16, DType::BF16}) {
    Tensor self = zeros({2}, dt, gpu());
    Tensor out = scatter_add(self, 0, zeros({3000}, DType::I64, gpu()), ones({3000}, dt, gpu()));
    EXPECT_EQ(out.to(kCPU).to_vector<double>(), (std::vector<double>{dt == DType::F16 ? 3000.0 : 3008.0, 0.0}))
        << dtype_name(dt);  // bf16(3000) rounds to 3008 (8-bit mantissa)
  }
}

// ---- out-of-range indices -----------------------------------------------------------------------------

// Runs `op` (which must return without blocking), then expects the error at the next synchronisation and
// a device that still works.
template <class Op>
void expect_deferred_error(const char* what, Op op, std::initializer_list<std::string> parts) {
  SCOPED_TRACE(what);
  EXPECT_NO_THROW(op());
  EXPECT_TRUE(test::throws_error([] { synchronize(gpu()); }, parts));
  // The record is cleared: the device stays usable and the next sync is clean.
  Tensor a = arange(10, DType::F32, gpu());
  EXPECT_TRUE(test::equal(index_select(a, 0, from_vector<int64_t>({3, 1}, std::nullopt, gpu())).to(kCPU),
                          from_vector<float>({3.f, 1.f})));
  EXPECT_NO_THROW(synchronize(gpu()));
}

TEST(CudaIndexErrors, RaisedAtNextSyncNamingOpIndexAndBound) {
  KILN_REQUIRE_CUDA();
  Tensor x = test::random_tensor({5, 4}, DType::F32, -2, 2, gpu());
  Tensor bad = from_vector<int64_t>({1, 7, 2}, std::nullopt, gpu());
  Tensor neg = from_vector<int32_t>({0, -1}, std::nullopt, gpu());
  expect_deferred_error("index_select", [&] { (void)index_select(x, 0, bad); }, {"index_select", "index 7", "size 5"});
  expect_deferred_error("index_select negative", [&] { (void)index_select(x, 1, neg); },
                        {"index_select", "index -1", "size 4"});
  expect_deferred_error("gather", [&] { (void)gather(x, 0, bad.reshape({3, 1})); }, {"gather", "index 7", "size 5"});
  expect_deferred_error("take", [&] { (void)take(x, from_vector<int64_t>({-21}, std::nullopt, gpu())); },
                        {"take", "index -21", "size 20"});
  expect_deferred_error("scatter", [&] { (void)scatter(x, 1, bad.reshape({1, 3}), x); },
                        {"scatter", "index 7", "size 4"});
  expect_deferred_error("scatter value", [&] { (void)scatter(x, 0, bad.reshape({3, 1}), Scalar(2.0)); },
                        {"scatter", "index 7", "size 5"});
  expect_deferred_error("scatter_add", [&] { (void)scatter_add(x, 0, neg.reshape({2, 1}), x); },
                        {"scatter_add", "index -1", "size 5"});
  // A copy to the host is a synchronisation point too.
  Tensor r = gather(x, 0, bad.reshape({3, 1}));
  EXPECT_TRUE(test::throws_error([&] { (void)r.to(kCPU); }, {"gather", "index 7"}));
}

TEST(CudaIndexErrors, OutOfRangeTouchesNoMemoryOutsideTheTensors) {
  KILN_REQUIRE_CUDA();
  // self is the middle of a larger buffer; indices past either end must leave the rest as it was.
  for (DType dt : {DType::F32, DType::I8, DType::F16}) {
    Tensor buf = test::random_int_tensor({64}, dt, 1, 9, gpu());
    const Tensor before = buf.to(kCPU);
    Tensor self = buf.narrow(0, 24, 8);
    Tensor idx = from_vector<int64_t>({8, -1, 100, 3}, std::nullopt, gpu());
    Tensor src = full({4}, 0, dt, gpu());
    scatter_(self, 0, idx, src);
    scatter_add_(self, 0, idx, full({4}, 1, dt, gpu()));
    EXPECT_TRUE(test::throws_error([] { synchronize(gpu()); }, {"index"}));
    Tensor want = before.clone();
    want.narrow(0, 24 + 3, 1).fill_(1);  // only index 3 was valid: set to 0, then +1
    EXPECT_TRUE(bits_equal(buf, want)) << dtype_name(dt);
  }
}

// ---- creation --------------------------------------------------------------------------------------------

TEST(CudaCreation, ArangeEqualsCpuBitForBit) {
  KILN_REQUIRE_CUDA();
  struct Case {
    Scalar start, end, step;
  };
  const std::vector<Case> cases = {{0, 1000, 1},      {-3.5, 97.25, 0.37}, {1.0, -2.0, -0.003},
                                   {0.1, 3000.3, 0.1}, {-7, 50003, 3},      {1e6, 1e6 + 4096, 1.0 / 3}, {2, 150, 3}};
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I16, DType::U8})
    for (const Case& c : cases) {
      if (!is_floating(dt) && (c.start.is_floating() || c.step.is_floating())) continue;
      if (dt == DType::U8 || dt == DType::I16) {
        if (c.end.to_double() > 200 || c.start.to_double() < 0) continue;
      }
      if ((dt == DType::F16 || dt == DType::BF16) && std::fabs(c.end.to_double()) > 60000) continue;
      const Tensor want = arange(c.start, c.end, c.step, dt, kCPU);
      const Tensor got = arange(c.start, c.end, c.step, dt, gpu());
      EXPECT_TRUE(bits_equal(got, want)) << dtype_name(dt) << " arange(" << c.start.str() << ", " << c.end.str()
                                         << ", " << c.step.str() << ")";
    }
  EXPECT_TRUE(bits_equal(arange(0, DType::F32, gpu()), arange(0, DType::F32)));
}

TEST(CudaCreation, LinspaceEqualsCpuBitForBit) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32})
    for (int64_t steps : {0, 1, 2, 7, 100, 1001, 65537})
      for (auto [a, b] : {std::pair{-1.0, 1.0}, std::pair{3.0, -20.5}, std::pair{0.0, 1e4}}) {
        EXPECT_TRUE(bits_equal(linspace(a, b, steps, dt, gpu()), linspace(a, b, steps, dt, kCPU)))
            << dtype_name(dt) << " linspace(" << a << ", " << b << ", " << steps << ")";
      }
}

// logspace calls pow: CUDA's pow (documented max 2 ulp) and powf (a few ulp) are not glibc's (< 1 ulp), so
// values may differ by a few ulp of the computing type; rounding to f16/bf16 keeps at most one ulp of that; integer outputs
// truncate, so an exact power may land one below (e.g. 999 for 10^3).
TEST(CudaCreation, LogspaceMatchesCpuWithinPowAccuracy) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64})
    for (int64_t steps : {1, 2, 50, 1001})
      for (double base : {10.0, 2.0, 1.5}) {
        const double end = dt == DType::F16 ? 4.0 : 9.0;
        const Tensor want = logspace(-3.0, end, steps, base, dt, kCPU);
        const Tensor got = logspace(-3.0, end, steps, base, dt, gpu());
        SCOPED_TRACE(str(dtype_name(dt), " logspace(-3, ", end, ", ", steps, ", base ", base, ")"));
        if (dt == DType::I64) {
          EXPECT_TRUE(test::all_close(got.to(kCPU), want, test::Tolerance{0, 1}));
        } else {
          const int64_t allowed = dt == DType::F32 ? 8 : dt == DType::F64 ? 3 : 1;
          EXPECT_LE(max_ulp_distance(got, want), allowed);
        }
      }
}

TEST(CudaCreation, EyeEqualsCpu) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {DType::Bool, DType::U8, DType::F16, DType::F32, DType::F64, DType::C64, DType::I64})
    for (auto [n, m] : {std::pair<int64_t, int64_t>{5, 5}, {3, 7}, {9, 2}, {0, 4}, {300, 301}}) {
      EXPECT_TRUE(bits_equal(eye(n, m, dt, gpu()), eye(n, m, dt, kCPU))) << dtype_name(dt) << " " << n << "x" << m;
    }
}

// ---- random numbers ------------------------------------------------------------------------------------

TEST(CudaRandom, RandEqualsCpuBitForBitAndAdvancesOffsets) {
  KILN_REQUIRE_CUDA();
  const uint64_t seed = test::rng()();
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    Generator gc(seed), gg(seed);
    for (int call = 0; call < 2; ++call) {
      const Tensor want = rand({333, 77}, dt, kCPU, &gc);
      const Tensor got = rand({333, 77}, dt, gpu(), &gg);
      EXPECT_TRUE(bits_equal(got, want)) << dtype_name(dt) << " call " << call << " seed " << seed;
    }
    EXPECT_EQ(gg.offset(), gc.offset());
    EXPECT_EQ(gg.offset(), 2u);
  }
}

TEST(CudaRandom, RandintEqualsCpuBitForBit) {
  KILN_REQUIRE_CUDA();
  const uint64_t seed = test::rng()();
  struct Case {
    int64_t low, high;
    DType dt;
  };
  for (const Case& c : {Case{-5, 17, DType::I64}, Case{INT64_MIN / 2, INT64_MAX / 2, DType::I64},
                        Case{0, 256, DType::U8}, Case{-1000, 1000, DType::I32}, Case{0, 2, DType::Bool},
                        Case{-100, 100, DType::F32}, Case{0, 10, DType::F64}, Case{-50, 50, DType::F16},
                        Case{-50, 50, DType::BF16}}) {
    Generator gc(seed), gg(seed);
    gc.set_offset(41);
    gg.set_offset(41);
    EXPECT_TRUE(bits_equal(randint(c.low, c.high, {1000, 13}, c.dt, gpu(), &gg),
                           randint(c.low, c.high, {1000, 13}, c.dt, kCPU, &gc)))
        << dtype_name(c.dt) << " [" << c.low << ", " << c.high << ") seed " << seed;
    EXPECT_EQ(gg.offset(), 42u);
  }
}

TEST(CudaRandom, RandnEqualsCpu) {
  KILN_REQUIRE_CUDA();
  const uint64_t seed = test::rng()();
  // f32/f16/bf16 round a double Box-Muller value: equal bits (a differing device log/cos ulp would have to
  // land exactly on a rounding boundary of the narrower type).
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    Generator gc(seed), gg(seed);
    EXPECT_TRUE(bits_equal(randn({500, 61}, dt, gpu(), &gg), randn({500, 61}, dt, kCPU, &gc)))
        << dtype_name(dt) << " seed " << seed;
  }
  // f64 keeps the double: CUDA's log (1 ulp) and cos (2 ulp) are not glibc's (< 1 ulp each), so the
  // product may differ by a few ulp. 4 covers the documented bounds of both libraries.
  Generator gc(seed), gg(seed);
  EXPECT_LE(max_ulp_distance(randn({500, 61}, DType::F64, gpu(), &gg), randn({500, 61}, DType::F64, kCPU, &gc)), 4)
      << "seed " << seed;
}

TEST(CudaRandom, InPlaceFillsWriteThroughStrides) {
  KILN_REQUIRE_CUDA();
  const uint64_t seed = test::rng()();
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    // uniform_ on a transposed view: element i of the stream goes to element i of the view (row-major).
    Pair base = test::make_pair({40, 27}, dt, Layout::Contiguous);
    Tensor vc = base.cpu.t(), vg = base.cuda.t();
    Generator gc(seed), gg(seed);
    uniform_(vc, -3.0, 5.0, &gc);
    uniform_(vg, -3.0, 5.0, &gg);
    EXPECT_TRUE(bits_equal(base.cuda, base.cpu)) << "uniform_ " << dtype_name(dt);
    // normal_ on a sliced view leaves the elements between untouched.
    Pair wide = test::make_pair({13, 50}, dt, Layout::Contiguous);
    Tensor sc = wide.cpu.slice(1, 1, std::nullopt, 3), sg = wide.cuda.slice(1, 1, std::nullopt, 3);
    normal_(sc, 2.0, 0.5, &gc);
    normal_(sg, 2.0, 0.5, &gg);
    if (dt == DType::F64) {
      EXPECT_LE(max_ulp_distance(wide.cuda, wide.cpu), 4);  // see RandnEqualsCpu
    } else {
      EXPECT_TRUE(bits_equal(wide.cuda, wide.cpu)) << "normal_ " << dtype_name(dt);
    }
  }
}

TEST(CudaRandom, SameSeedGivesSameNumbersEveryRun) {
  KILN_REQUIRE_CUDA();
  manual_seed(1234);
  const Tensor a = rand({4096}, DType::F32, gpu());
  const Tensor b = randn({4096}, DType::F32, gpu());
  manual_seed(1234);
  EXPECT_TRUE(bits_equal(rand({4096}, DType::F32, gpu()), a.to(kCPU)));
  EXPECT_TRUE(bits_equal(randn({4096}, DType::F32, gpu()), b.to(kCPU)));
  manual_seed(1234);  // and the CPU's default generator gives the same stream
  EXPECT_TRUE(bits_equal(a, rand({4096}, DType::F32, kCPU)));
  EXPECT_TRUE(test::throws_error([] { rand({2}, DType::I32, gpu()); }, {"rand", "int32"}));
  EXPECT_TRUE(bits_equal(rand({0, 3}, DType::F32, gpu()), rand({0, 3}, DType::F32, kCPU)));
}

// ---- CUDA graphs ---------------------------------------------------------------------------------------

TEST(CudaIndexGraph, CapturedSequenceReplaysWithoutHostSync) {
  KILN_REQUIRE_CUDA();
  const Device d = gpu();
  Pair x = test::make_pair({64, 48}, DType::F32, Layout::Transposed);
  Pair idx = index_pair({30}, DType::I64, 0, 63);
  Pair gidx = index_pair({20, 48}, DType::I32, 0, 63);
  Pair sidx = index_pair({64, 10}, DType::I64, 0, 47);
  Pair hsrc = test::make_pair({64, 10}, DType::F16, Layout::Contiguous);
  Pair hself = test::make_pair({64, 48}, DType::F16, Layout::Contiguous);
  Pair tidx = index_pair({100}, DType::I64, -3072, 3071);
  Stream s = Stream::create(d);
  Generator gen(99);
  auto body = [&](const std::vector<Tensor>& in, Device dev, Generator* g) {
    std::vector<Tensor> out;
    out.push_back(index_select(in[0], 0, in[1]));
    out.push_back(gather(in[0], 0, in[2]));
    out.push_back(scatter(in[0], 1, in[3], Scalar(-1.5)));
    out.push_back(scatter_add(in[4], 1, in[3], in[5]));  // f16: the f32 round trip is captured too
    out.push_back(take(in[0], in[6]));
    out.push_back(rand({1000}, DType::F32, dev, g));
    out.push_back(randn({1000}, DType::BF16, dev, g));
    out.push_back(arange(0.5, 100.0, 0.25, DType::F32, dev));
    out.push_back(eye(7, 9, DType::F64, dev));
    Tensor u = empty({40, 8}, DType::F32, dev).t();
    uniform_(u, 0.0, 2.0, g);
    out.push_back(u);
    return out;
  };
  const std::vector<Tensor> in_cpu = {x.cpu, idx.cpu, gidx.cpu, sidx.cpu, hself.cpu, hsrc.cpu, tidx.cpu};
  const std::vector<Tensor> in_cuda = {x.cuda, idx.cuda, gidx.cuda, sidx.cuda, hself.cuda, hsrc.cuda, tidx.cuda};
  {
    StreamGuard guard(s);
    (void)body(in_cuda, d, &gen);  // warm-up outside capture (first-use allocations, error record)
    s.synchronize();
  }
  gen.set_offset(0);
  std::vector<Tensor> got;
  Graph g;
  g.capture(s, [&] { got = body(in_cuda, d, &gen); });
  Generator gc(99);
  const std::vector<Tensor> want = body(in_cpu, kCPU, &gc);
  for (int replay = 0; replay < 2; ++replay) {
    g.replay();
    s.synchronize();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      // u (last) is a transposed view: compare its contiguous base through a strided-free route.
      const Tensor gi = got[i].is_contiguous() ? got[i] : got[i].t();
      const Tensor wi = got[i].is_contiguous() ? want[i] : want[i].t();
      if (i == 3) EXPECT_TRUE(test::all_close(gi.to(kCPU), wi, scatter_add_tolerance(DType::F16))) << "output " << i;
      else EXPECT_TRUE(bits_equal(gi, wi)) << "output " << i << " replay " << replay;
    }
  }
}

}  // namespace
}  // namespace kiln
