// CUDA softmax / log_softmax against the CPU reference (itself tested against double precision in
// tests/ops/softmax_test.cpp): every path (a row per warp, a row per block, rows split across blocks, the
// strided path), every dtype, the fused dtype=f32 widening, unaligned and non-contiguous inputs, edge rows
// (-inf, all -inf, NaN, +inf, 1e30), graph capture and replay. The split path's (max, sum) combine is also
// checked on the host, where it runs without a GPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/nn.h"
#include "kiln/runtime.h"
#include "ops/softmax_math.h"
#include "test_util.h"
#if KILN_HAVE_CUDA
#include "cuda/softmax.h"
#endif

namespace kiln::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNan = std::nan("");
const DType kDtypes[] = {DType::F32, DType::F16, DType::BF16};

Device gpu() { return cuda_device(0); }

// The split path's launch mode (src/cuda/softmax.h); nothing to switch in a build without CUDA.
void set_dependent_launch(bool on) {
#if KILN_HAVE_CUDA
  cuda::set_softmax_dependent_launch(on);
#else
  (void)on;
#endif
}

// Softmax outputs of long rows are ~1e-5, inside the default atol: compare them relative to their size
// (f32: a few ulps of the sums' different orders; f16 atol: one subnormal step, f16 has no normal numbers
// below 6e-5).
Tolerance softmax_tolerance(DType t) {
  switch (t) {
    case DType::F32: return {2e-5, 1e-30};
    case DType::F16: return {1e-3, 1e-7};
    case DType::BF16: return {1.6e-2, 1e-30};
    default: return {1e-7, 1e-300};
  }
}

// Leaves `bytes` of freed NaN-filled (0xFF) memory in the allocator's cache, so an output that reuses it
// and misses an element shows NaN where a number is expected.
void poison_cache(int64_t bytes) {
  Tensor t = empty({bytes + 4096}, DType::U8, gpu());
  t.fill_(0xFF);
}

// CUDA vs CPU for both ops on the same values and layout (x_gpu: x_cpu's twin on the GPU).
void check_pair(const Tensor& x_cpu, const Tensor& x_gpu, int64_t dim, std::optional<DType> dtype = std::nullopt) {
  SCOPED_TRACE(x_cpu.meta() + " strides " + shape_str(x_cpu.strides()) + " dim " + std::to_string(dim) +
               (dtype ? std::string(" dtype=") + dtype_name(*dtype) : std::string()));
  ASSERT_EQ(x_cpu.strides(), x_gpu.strides());
  for (bool log : {false, true}) {
    SCOPED_TRACE(log ? "log_softmax" : "softmax");
    const Tensor want = log ? log_softmax(x_cpu, dim, dtype) : softmax(x_cpu, dim, dtype);
    poison_cache(want.numel() * itemsize(want.dtype()));
    const Tensor got = log ? log_softmax(x_gpu, dim, dtype) : softmax(x_gpu, dim, dtype);
    ASSERT_TRUE(got.is_cuda());
    ASSERT_EQ(got.dtype(), want.dtype());
    ASSERT_EQ(got.sizes(), want.sizes());
    const Tensor g = got.to(kCPU);
    EXPECT_TRUE(all_close(g, want));
    if (!log) EXPECT_TRUE(all_close(g, want, softmax_tolerance(want.dtype())));
  }
}

void check(const Tensor& x_cpu, int64_t dim, std::optional<DType> dtype = std::nullopt) {
  check_pair(x_cpu, x_cpu.to(gpu()), dim, dtype);
}

// A view of a fresh random [rows, n + 1] buffer starting at element 1 of each row: the base pointer is
// misaligned and rows are n + 1 apart (the scalar paths). Returns the CPU view and its GPU twin.
std::pair<Tensor, Tensor> offset_one(int64_t rows, int64_t n, DType t, double lo = -10, double hi = 10) {
  const Tensor base = random_tensor({rows, n + 1}, t, lo, hi);
  return {base.narrow(1, 1, n), base.to(gpu()).narrow(1, 1, n)};
}

// ---- host-only: the split path's combine gives the two-pass results ---------------------------------------

// The CUDA split path in miniature: parts of `part` elements, each padded with -inf to a multiple of 8,
// reduced two-pass to a (max, sum) pair, the pairs folded with softmax_math::combine.
std::vector<double> split_reference(const std::vector<float>& x, int64_t part, bool log) {
  namespace sm = softmax_math;
  sm::MaxSum<float> acc = sm::max_sum_identity<float>();
  for (size_t lo = 0; lo < x.size(); lo += static_cast<size_t>(part)) {
    std::vector<float> p(x.begin() + lo, x.begin() + std::min(x.size(), lo + part));
    while (p.size() % 8 != 0) p.push_back(-INFINITY);
    float m = -INFINITY, s = 0;
    for (float v : p) m = sm::max_nan(m, v);
    for (float v : p) s += sm::exp_shifted(v, m);
    acc = sm::combine(acc, sm::MaxSum<float>{m, s});
  }
  std::vector<double> y;
  for (float v : x)
    y.push_back(log ? sm::log_softmax_value(v, acc.max, std::log(acc.sum))
                    : sm::softmax_from_exp(sm::exp_shifted(v, acc.max), acc.sum));
  return y;
}

TEST(SoftmaxMath, SplitCombineGivesTheTwoPassEdgeCases) {
  const std::vector<std::vector<double>> rows = {
      {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11},
      {-kInf, -kInf, -kInf, -kInf, -kInf, 3, 1, -kInf, 2, 0, -kInf},  // a whole part of -inf first
      {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf},
      {1, 2, 3, 4, 5, 6, kNan, 8, 9, 10, 11},
      {kNan, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf},
      {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, kInf},
      {kInf, 2, 3, 4, 5, 6, 7, 8, 9, 10, kInf},
      {-kInf, 2, 3, 4, 5, kInf, 7, 8, 9, 10, 11},
      {1e30, -1e30, 1e30, 0, 5, 1e30, -kInf, 1e29, 3, 1e30, -1e30},
      {-1e30, -1e30, -1e30, -1e30, -1e30, -1e30, -1e30, -1e30, -1e30, -1e30, -1e30},
      {3e38, -3e38, 1, 2, 3, 4, 5, 6, 7, 8, 9},
  };
  for (const auto& r : rows) {
    const Tensor x = from_vector<double>(r).to(DType::F32);
    const std::vector<float> xf = x.to_vector<float>();
    for (bool log : {false, true}) {
      const Tensor want = log ? log_softmax(x, 0) : softmax(x, 0);
      for (int64_t part : {1, 3, 5, 8, 11}) {
        SCOPED_TRACE(std::to_string(r[0]) + ", " + std::to_string(r[1]) + ", ..." + (log ? " log" : "") + " part " + std::to_string(part));
        EXPECT_TRUE(all_close(from_vector<double>(split_reference(xf, part, log)).to(DType::F32), want));
      }
    }
  }
}

// ---- CUDA ----------------------------------------------------------------------------------------------

TEST(CudaSoftmax, LongRowsSplitAcrossBlocksMatchCpu) {
  KILN_REQUIRE_CUDA();
  for (DType t : kDtypes) {
    check(random_tensor({1, 128256}, t, -10, 10), -1);
    check(random_tensor({1, 151936}, t, -10, 10), 1);
    check(random_tensor({4, 201088}, t, -10, 10), -1);
  }
  // A narrow logit range (sum ~ n): every output ~1/n, a dropped or doubled chunk shows at once.
  check(random_tensor({1, 128256}, DType::F32, -0.1, 0.1), -1);
  // Few rows of medium length go to the split path too; 17 rows do not.
  check(random_tensor({16, 20000}, DType::F32, -10, 10), 1);
  check(random_tensor({17, 20000}, DType::F32, -10, 10), 1);
  // Longer than a block holds (32768 for 4-byte, 16384 for f64 values): split, whatever the row count.
  check(random_tensor({40, 32769}, DType::BF16, -10, 10), 1);
  check(random_tensor({20, 16385}, DType::F64, -10, 10), 1);
  // Odd lengths: ragged last chunk and last group (unaligned rows: the scalar path).
  check(random_tensor({3, 100003}, DType::F32, -10, 10), 1);
  check(random_tensor({1, 65537}, DType::BF16, -10, 10), 1);
  // Chunks longer than one pass of a block (each thread loops, pass 2 prefetches then streams).
  check(random_tensor({1, 1 << 22}, DType::F32, -10, 10), 1);
  check(random_tensor({2, (1 << 21) + 3}, DType::BF16, -10, 10), 1);
}

TEST(CudaSoftmax, MoreRowsThanTheGridCoversLoopOverRows) {
  KILN_REQUIRE_CUDA();
  check(random_tensor({100000, 5}, DType::F32), 1);            // a row per warp
  check(random_tensor({9000, 1100}, DType::BF16, -10, 10), 1);  // a row per block
  check(random_tensor({5000, 3, 2}, DType::F32), 1);            // strided
}

TEST(CudaSoftmax, SplitPathWithAndWithoutDependentLaunch) {
  KILN_REQUIRE_CUDA();
  const Tensor x = random_tensor({2, 151936}, DType::BF16, -10, 10);
  for (bool pdl : {false, true}) {
    SCOPED_TRACE(pdl ? "programmatic dependent launch" : "plain launches");
    set_dependent_launch(pdl);
    check(x, 1);
    check(x, 1, DType::F32);
    check(random_tensor({1, 128256}, DType::F32, -10, 10), 1);
  }
  set_dependent_launch(true);
}

TEST(CudaSoftmax, ManyShortAndMediumRowsMatchCpu) {
  KILN_REQUIRE_CUDA();
  for (DType t : kDtypes) {
    SCOPED_TRACE(dtype_name(t));
    check(random_tensor({64, 32000}, t, -10, 10), -1);
    check(random_tensor({3, 7}, t), 1);
    check(random_tensor({3, 7}, t), 0);
    check(random_tensor({5, 1}, t), 1);
    check(random_tensor({5, 1}, t), 0);
    check(random_tensor({1, 1}, t), -1);
    check(random_tensor({1000, 7}, t), 1);
    check(random_tensor({333, 1000}, t, -10, 10), 1);   // warp path, tails of the last groups
    check(random_tensor({40, 1024}, t, -10, 10), 1);    // warp path, full
    check(random_tensor({40, 1025}, t, -10, 10), 1);    // block path from here
    check(random_tensor({21, 2000}, t, -10, 10), 1);
    check(random_tensor({19, 4099}, t, -10, 10), 1);
    check(random_tensor({33, 32768}, t, -10, 10), 1);   // the largest block-path row (4-byte and 2-byte)
    check(random_tensor({4, 3, 5, 8}, t), 3);
    check(random_tensor({5, 7, 1}, t), 1);              // trailing size-1 dims: still rows
  }
  for (int64_t n : {1, 7, 100, 1024, 1025, 5000, 16384})
    check(random_tensor({9, n}, DType::F64, -10, 10), 1);
}

TEST(CudaSoftmax, EveryDimOfA3dTensor) {
  KILN_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    const Tensor x = random_tensor({2, 3, 4}, t, -5, 5);
    for (int64_t dim : {0, 1, 2, -1, -2, -3}) check(x, dim);
    const Tensor y = random_tensor({3, 50, 70}, t, -5, 5);  // inner 70: three column tiles, the last partial
    for (int64_t dim : {0, 1, 2}) check(y, dim);
    check(random_tensor({2, 5000, 3}, t, -5, 5), 1);  // long strided columns
  }
}

TEST(CudaSoftmax, UnalignedAndNonContiguousInputs) {
  KILN_REQUIRE_CUDA();
  for (DType t : kDtypes) {
    SCOPED_TRACE(dtype_name(t));
    for (int64_t n : {7, 1000, 3000, 32000, 128256}) {
      auto [c, g] = offset_one(3, n, t);  // base misaligned, row stride n + 1
      check_pair(c, g, 1);
    }
    // Step-2 slice from offset 1 along the reduced dim (copied to contiguous first).
    const Tensor base = random_tensor({4, 2 * 2001 + 1}, t, -10, 10);
    check_pair(base.slice(-1, 1, std::nullopt, 2), base.to(gpu()).slice(-1, 1, std::nullopt, 2), 1);
    // Transposed: the reduced dim strided (dim 1) or contiguous but not innermost (dim 0).
    const Tensor tr = random_tensor({300, 40}, t, -10, 10);
    check_pair(tr.t(), tr.to(gpu()).t(), 1);
    check_pair(tr.t(), tr.to(gpu()).t(), 0);
    // Rows of a wider buffer: aligned row stride (vector path with a ragged last group for f32 output).
    const Tensor wide = random_tensor({3, 100008}, t, -10, 10);
    check_pair(wide.narrow(1, 0, 100004), wide.to(gpu()).narrow(1, 0, 100004), 1);
    check_pair(wide.narrow(1, 0, 100004), wide.to(gpu()).narrow(1, 0, 100004), 1, DType::F32);
    // Outer dims that nest (one row stride) and that do not (copied first).
    const Tensor b3 = random_tensor({2, 3, 40}, t);
    check_pair(b3.narrow(2, 1, 33), b3.to(gpu()).narrow(2, 1, 33), 2);
    check_pair(b3.narrow(1, 0, 2).narrow(2, 1, 33), b3.to(gpu()).narrow(1, 0, 2).narrow(2, 1, 33), 2);
    // Permuted 3-d and a broadcast row (row stride 0).
    const Tensor p = random_tensor({4, 3, 5}, t);
    check_pair(p.permute({2, 0, 1}), p.to(gpu()).permute({2, 0, 1}), 1);
    const Tensor e = random_tensor({1, 2000}, t);
    check_pair(e.expand({6, 2000}), e.to(gpu()).expand({6, 2000}), 1);
    check_pair(e.expand({6, 2000}), e.to(gpu()).expand({6, 2000}), 0);  // stride 0 along the reduced dim
  }
}

TEST(CudaSoftmax, DtypeOption) {
  KILN_REQUIRE_CUDA();
  // f16/bf16 -> f32 is fused into the kernels; the others convert the input first, as the CPU does.
  for (DType in : {DType::BF16, DType::F16}) {
    check(random_tensor({1, 128256}, in, -10, 10), 1, DType::F32);
    check(random_tensor({64, 32000}, in, -10, 10), 1, DType::F32);
    check(random_tensor({100, 77}, in, -10, 10), 1, DType::F32);
    check(random_tensor({3, 50, 70}, in, -10, 10), 1, DType::F32);
    auto [c, g] = offset_one(5, 3001, in);
    check_pair(c, g, 1, DType::F32);
  }
  check(random_tensor({4, 5000}, DType::F32, -10, 10), 1, DType::BF16);
  check(random_tensor({4, 5000}, DType::F32, -10, 10), 1, DType::F16);
  check(random_tensor({4, 5000}, DType::BF16, -10, 10), 1, DType::F64);
  check(random_int_tensor({4, 900}, DType::I64, -5, 5), 1, DType::F32);
  // 0-d input is one row of one element.
  check(scalar_tensor(2.5, DType::BF16), 0, DType::F32);
  check(scalar_tensor(2.5, DType::F32), -1);
}

// Rows with special values for each path: n = 11 (warp), 3000 (block), 70000 (split, 4 rows), and the
// same values down dim 0 (strided).
TEST(CudaSoftmax, EdgeRowsMatchCpu) {
  KILN_REQUIRE_CUDA();
  for (int64_t n : {11, 3000, 70000}) {
    for (DType t : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::to_string(n) + " " + dtype_name(t));
      std::vector<std::vector<double>> rows;
      auto fresh = [&] { return random_tensor({n}, DType::F64, -5, 5).to_vector<double>(); };
      std::vector<double> r = fresh();
      for (int64_t i = 0; i < n; i += 3) r[i] = -kInf;  // -inf entries: exact 0 / -inf
      rows.push_back(r);
      r = fresh();
      std::fill(r.begin(), r.begin() + n * 2 / 3, -kInf);  // a long -inf prefix (whole chunks of -inf)
      rows.push_back(r);
      rows.push_back(std::vector<double>(n, -kInf));  // all -inf: NaN
      r = fresh();
      r[n / 2] = kNan;
      rows.push_back(r);
      r = fresh();
      r[n - 1] = kInf;
      rows.push_back(r);
      r = fresh();
      r[0] = kInf;
      r[n - 1] = kInf;
      rows.push_back(r);
      r = fresh();
      r[1] = -kInf;
      r[n / 3] = kInf;
      rows.push_back(r);
      r = std::vector<double>(n, -kInf);
      r[n - 1] = 4;  // one finite entry, at the very end
      rows.push_back(r);
      if (t == DType::F32) {
        r = fresh();
        for (int64_t i = 0; i < n; i += 2) r[i] = (i % 4 == 0 ? 1e30 : -1e30) + r[i];
        rows.push_back(r);
        rows.push_back(std::vector<double>(n, -1e30));
        r = fresh();
        r[n / 4] = 3e38;
        r[n / 5] = -3e38;
        rows.push_back(r);
      }
      std::vector<double> flat;
      for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
      const Tensor x = from_vector<double>(flat, Shape{static_cast<int64_t>(rows.size()), n}).to(t);
      check(x, 1);
      if (n <= 3000) check(x.t().contiguous(), 0);
      check(x, 1, t == DType::F32 ? std::nullopt : std::optional<DType>(DType::F32));
    }
  }
}

TEST(CudaSoftmax, ResultsAreDeterministic) {
  KILN_REQUIRE_CUDA();
  for (const Shape& s : {Shape{1, 128256}, Shape{64, 32000}, Shape{100, 1000}}) {
    const Tensor x = random_tensor(s, DType::F32, -10, 10, gpu());
    EXPECT_EQ(raw_bits(softmax(x, -1).to(kCPU)), raw_bits(softmax(x, -1).to(kCPU)));
    EXPECT_EQ(raw_bits(log_softmax(x, -1).to(kCPU)), raw_bits(log_softmax(x, -1).to(kCPU)));
  }
}

class CudaSoftmaxGraph : public ::testing::TestWithParam<bool> {
 protected:
  void TearDown() override { set_dependent_launch(true); }
};

TEST_P(CudaSoftmaxGraph, CaptureAndReplay) {
  KILN_REQUIRE_CUDA();
  set_dependent_launch(GetParam());
  Tensor a = random_tensor({1, 128256}, DType::F32, -10, 10, gpu());
  Tensor b = random_tensor({4, 201088}, DType::BF16, -10, 10, gpu());
  Tensor c = random_tensor({64, 32000}, DType::BF16, -10, 10, gpu());
  Tensor d = random_tensor({300, 40}, DType::F32, -10, 10, gpu());
  auto run = [&] {
    return std::vector<Tensor>{softmax(a, -1), log_softmax(a, -1), softmax(b, 1, DType::F32),
                               log_softmax(b, -1), softmax(c, -1), log_softmax(c, 1, DType::F32),
                               softmax(d, 0), log_softmax(d.narrow(1, 1, 39), 1), softmax(d.t(), 1)};
  };
  Stream s = Stream::create(gpu());
  Graph g;
  std::vector<Tensor> out;
  g.capture(s, [&] { out = run(); });
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    if (round == 1) {  // new values in place: the replay reads the same buffers
      a.copy_(random_tensor({1, 128256}, DType::F32, -10, 10, gpu()));
      b.copy_(random_tensor({4, 201088}, DType::BF16, -10, 10, gpu()));
      c.copy_(random_tensor({64, 32000}, DType::BF16, -10, 10, gpu()));
      d.copy_(random_tensor({300, 40}, DType::F32, -10, 10, gpu()));
    }
    std::vector<Tensor> eager = run();
    synchronize(gpu());
    for (Tensor& o : out) o.fill_(NAN);  // replay must rewrite every element
    synchronize(gpu());
    g.replay();
    s.synchronize();
    ASSERT_EQ(out.size(), eager.size());
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(raw_bits(out[i].to(kCPU)), raw_bits(eager[i].to(kCPU))) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(DependentLaunch, CudaSoftmaxGraph, ::testing::Bool());

TEST(CudaSoftmax, InvalidInputNamesTheProblem) {
  KILN_REQUIRE_CUDA();
  const Tensor f8 = zeros({2, 3}, DType::F32, gpu()).to(DType::F8E4M3);
  EXPECT_TRUE(throws_error([&] { softmax(f8, 1); }, {"softmax", "float8_e4m3fn", "not supported"}));
  const Tensor xi = zeros({2, 3}, DType::I32, gpu());
  EXPECT_TRUE(throws_error([&] { log_softmax(xi, 1); }, {"log_softmax", "int32", "not supported"}));
  EXPECT_TRUE(throws_error([&] { softmax(zeros({2, 3}, DType::F32, gpu()), 2); }, {"softmax", "dim 2", "out of range"}));
  // Integer input with dtype= converts on the device.
  check(random_int_tensor({3, 40}, DType::I32, -4, 4), 1, DType::F32);
}

}  // namespace
}  // namespace kiln::test
