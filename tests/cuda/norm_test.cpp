// rms_norm, add_rms_norm, silu_and_mul and rope_ on CUDA against the CPU kernels (themselves tested against
// double references and PyTorch in tests/ops/norm_test.cpp), for f32/f16/bf16 (and f64 once), decode and odd
// shapes, misaligned and strided views, poisoned outputs (through the launchers) and graph replay.
//
// Exactness: both backends evaluate the same formulas (src/ops/norm_math.h) with the same roundings and no
// fma contraction, so results are bit-identical except where a library function or a summation order
// differs:
//  - rms_norm: the sum of squares is accumulated in f64 on both, in a different order; the f64 sums can
//    differ in their last bits and, very rarely (~1e-5 per row), round to neighbouring f32 values; 1/sqrt
//    and the two products of that row can then move by an ulp each. So: at most one row of a tensor not
//    bit-identical, and that row within 2 ulp.
//  - silu_and_mul: device expf (<= 2 ulp) vs glibc's: f32 within 8 ulp; f16/bf16 within 1 ulp, and at most
//    1% of the elements (or 2) not bit-identical.
//  - rope_: device cosf/sinf (<= 2 ulp, full range reduction, positions up to 131071) vs glibc's: f32
//    within rtol = atol = 1e-5, f16/bf16 within 1 ulp (and at most 1% of the elements, or 2, not identical).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <vector>

#include "kiln/nn.h"
#include "kiln/runtime.h"
#include "test_util.h"

#if KILN_HAVE_CUDA
#include "cuda/norm.h"
#endif

namespace kiln::test {
namespace {

const Device kGpu = cuda_device(0);
const DType kDtypes[] = {DType::F32, DType::F16, DType::BF16};

// got (any device) vs want (CPU), one dtype and shape: every element within max_ulp ulps (NaN only where
// NaN), at most max_rows rows of row_len elements with any difference, at most max_fraction of the elements.
::testing::AssertionResult near_bits(const Tensor& got_any, const Tensor& want, int64_t max_ulp, int64_t max_rows,
                                     double max_fraction = 1.0) {
  const Tensor got = got_any.to(kCPU);
  if (got.sizes() != want.sizes() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure() << "got " << got.meta() << ", want " << want.meta();
  const auto gb = raw_bits(got), wb = raw_bits(want);
  const auto gv = got.to_vector<double>(), wv = want.to_vector<double>();
  const int bits = static_cast<int>(itemsize(got.dtype()) * 8);
  const int64_t row_len = got.dim() > 0 && got.size(-1) > 0 ? got.size(-1) : 1;
  int64_t worst = 0, worst_at = -1, differing = 0;
  std::set<int64_t> rows;
  for (size_t i = 0; i < gb.size(); ++i) {
    if (gb[i] == wb[i]) continue;
    int64_t u;
    if (std::isnan(gv[i]) || std::isnan(wv[i])) u = std::isnan(gv[i]) && std::isnan(wv[i]) ? 0 : INT64_MAX;
    else if (gv[i] == wv[i]) u = 0;  // +0 / -0
    else u = ulp_distance(gb[i], wb[i], bits);
    if (u == 0) continue;
    ++differing;
    rows.insert(static_cast<int64_t>(i) / row_len);
    if (u > worst) worst = u, worst_at = static_cast<int64_t>(i);
  }
  if (worst > max_ulp || static_cast<int64_t>(rows.size()) > max_rows ||
      static_cast<double>(differing) > std::max(2.0, max_fraction * static_cast<double>(gb.size())))
    return ::testing::AssertionFailure()
           << differing << " of " << gb.size() << " elements differ in " << rows.size() << " rows; worst " << worst
           << " ulp at flat index " << worst_at << " (got " << (worst_at >= 0 ? gv[worst_at] : 0.0) << ", want "
           << (worst_at >= 0 ? wv[worst_at] : 0.0) << "); allowed " << max_ulp << " ulp in " << max_rows << " rows, a fraction " << max_fraction;
  return ::testing::AssertionSuccess();
}

// rms_norm: bit-identical but for at most one row (see the top of the file).
::testing::AssertionResult rms_close(const Tensor& got, const Tensor& want) { return near_bits(got, want, 2, 1); }

// A contiguous [sizes] tensor on the GPU whose data starts `offset` elements into a larger buffer (so
// offset 1 is not 16-byte aligned); the buffer is returned too.
std::pair<Tensor, Tensor> offset_tensor(const Tensor& host, int64_t offset) {
  const int64_t n = host.numel();
  Tensor buf = empty({n + offset + 1}, host.dtype(), kGpu);
  poison(buf);
  Tensor t = buf.narrow(0, offset, n).view(host.sizes());
  t.copy_(host.to(kGpu));
  return {t, buf};
}

const std::vector<Shape> kNormShapes = {{1, 2048}, {1, 4096}, {7, 5120}, {3, 1000}, {3, 1001}, {64, 128},
                                        {1, 1},    {5, 8},    {2, 4098}, {2, 40000}, {2, 3, 96}, {33, 64}};

// ---- rms_norm -------------------------------------------------------------------------------------------

TEST(CudaRmsNorm, MatchesCpuOnDecodeAndOddShapes) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDtypes) {
    for (const Shape& shape : kNormShapes) {
      for (bool f32_weight : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape) + (f32_weight ? " f32 weight" : ""));
        const int64_t d = shape.back();
        const Tensor x = random_tensor(shape, dt, -3, 3);
        const Tensor w = random_tensor({d}, f32_weight ? DType::F32 : dt, 0.25, 2);
        const Tensor want = rms_norm(x, w, 1e-6);
        const Tensor got = rms_norm(x.to(kGpu), w.to(kGpu), 1e-6);
        EXPECT_TRUE(got.is_cuda());
        EXPECT_TRUE(rms_close(got, want));
      }
    }
  }
}

TEST(CudaRmsNorm, F64AndF64Weight) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {DType::F64, DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = random_tensor({3, 520}, dt);
    const Tensor w = random_tensor({520}, DType::F64, 0.5, 1.5);
    const Tensor got = rms_norm(x.to(kGpu), w.to(kGpu), 1e-5), want = rms_norm(x, w, 1e-5);
    // f64 sums its squares in f64 in a different order on each backend, and nothing rounds the result to a
    // shorter type, so every element of a row may move by a few f64 ulps (16 allowed; seen: 5).
    if (dt == DType::F64) EXPECT_TRUE(near_bits(got, want, 16, INT64_MAX));
    else EXPECT_TRUE(rms_close(got, want));
  }
}

TEST(CudaRmsNorm, MisalignedWeightAndInput) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDtypes) {
    for (const Shape& shape : {Shape{1, 4096}, Shape{64, 128}, Shape{3, 1000}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape));
      const int64_t d = shape.back();
      const Tensor x = random_tensor(shape, dt);
      const Tensor w = random_tensor({d}, dt, 0.5, 1.5);
      const Tensor want = rms_norm(x, w, 1e-6);
      auto [wg, wbuf] = offset_tensor(w, 1);  // weight from a slice at element 1
      EXPECT_TRUE(rms_close(rms_norm(x.to(kGpu), wg, 1e-6), want));
      auto [xg, xbuf] = offset_tensor(x, 3);  // x misaligned as well
      EXPECT_TRUE(rms_close(rms_norm(xg, wg, 1e-6), want));
      // A non-contiguous x (the normalised dim strided) is copied first.
      const Tensor xt = x.to(kGpu).transpose(0, 1).contiguous().transpose(0, 1);
      EXPECT_TRUE(rms_close(rms_norm(xt, w.to(kGpu), 1e-6), want));
    }
  }
}

TEST(CudaRmsNorm, ZeroRowsAndEmpty) {
  KILN_REQUIRE_CUDA();
  EXPECT_TRUE(equal(rms_norm(zeros({4, 256}, DType::BF16, kGpu), ones({256}, DType::BF16, kGpu), 1e-6).cpu(),
                    zeros({4, 256}, DType::BF16)));
  EXPECT_EQ(rms_norm(empty({0, 64}, DType::F32, kGpu), ones({64}, DType::F32, kGpu), 1e-6).sizes(), (Shape{0, 64}));
  EXPECT_TRUE(throws_error([] { rms_norm(ones({2, 8}, DType::F32, kGpu), ones({8}), 1e-6); },
                           {"rms_norm", "one device"}));
}

#if KILN_HAVE_CUDA
// The launcher writes exactly out's elements: a poisoned buffer around a misaligned out keeps its poison.
TEST(CudaRmsNorm, LauncherWritesEveryOutputElementAndNothingElse) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDtypes) {
    for (const Shape& shape : {Shape{1, 2048}, Shape{64, 128}, Shape{3, 1001}, Shape{2, 40000}}) {
      for (int64_t off : {0, 1}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape) + " offset " + std::to_string(off));
        const Tensor x = random_tensor(shape, dt);
        const Tensor w = random_tensor({shape.back()}, dt);
        const Tensor want = rms_norm(x, w, 1e-6);
        auto [out, buf] = offset_tensor(zeros(shape, dt), off);
        poison(buf);
        cuda::rms_norm(out, x.to(kGpu), w.to(kGpu), 1e-6);
        EXPECT_TRUE(rms_close(out, want));
        const Tensor b = buf.cpu();
        EXPECT_TRUE(std::isnan(b.narrow(0, b.numel() - 1, 1).to_vector<double>()[0]));
        if (off > 0) EXPECT_TRUE(std::isnan(b.narrow(0, off - 1, 1).to_vector<double>()[0]));
      }
    }
  }
}
#endif

// ---- add_rms_norm ---------------------------------------------------------------------------------------

TEST(CudaAddRmsNorm, MatchesCpuAndUpdatesResidual) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDtypes) {
    for (const Shape& shape : kNormShapes) {
      for (bool f32_weight : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape) + (f32_weight ? " f32 weight" : ""));
        const Tensor x = random_tensor(shape, dt);
        const Tensor r0 = random_tensor(shape, dt, -4, 4);
        const Tensor w = random_tensor({shape.back()}, f32_weight ? DType::F32 : dt, 0.25, 2);
        Tensor rc = r0.clone();
        const Tensor want = add_rms_norm(x, rc, w, 1e-6);
        Tensor rg = r0.to(kGpu);
        const Tensor got = add_rms_norm(x.to(kGpu), rg, w.to(kGpu), 1e-6);
        EXPECT_TRUE(equal(rg.cpu(), rc));  // the add rounds the same way on both: bit for bit
        EXPECT_TRUE(rms_close(got, want));
      }
    }
  }
}

TEST(CudaAddRmsNorm, AliasingAsTheCpuDefinesIt) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor w = random_tensor({512}, dt, 0.5, 1.5);
    // x is residual itself: residual = 2 * residual.
    {
      const Tensor r0 = random_tensor({3, 512}, dt);
      Tensor rc = r0.clone(), rg = r0.to(kGpu);
      const Tensor want = add_rms_norm(rc, rc, w, 1e-6);
      const Tensor got = add_rms_norm(rg, rg, w.to(kGpu), 1e-6);
      EXPECT_TRUE(equal(rg.cpu(), rc));
      EXPECT_TRUE(rms_close(got, want));
    }
    // x overlaps residual shifted by one row: the old x is added (add_ computes into a temporary).
    {
      const Tensor b0 = random_tensor({5, 512}, dt);
      Tensor bc = b0.clone(), bg = b0.to(kGpu);
      Tensor rc = bc.narrow(0, 0, 4), rg = bg.narrow(0, 0, 4);
      const Tensor want = add_rms_norm(bc.narrow(0, 1, 4), rc, w, 1e-6);
      const Tensor got = add_rms_norm(bg.narrow(0, 1, 4), rg, w.to(kGpu), 1e-6);
      EXPECT_TRUE(equal(bg.cpu(), bc));
      EXPECT_TRUE(rms_close(got, want));
    }
  }
}

TEST(CudaAddRmsNorm, MixedDtypesAndStridedResidualTakeTheTwoStepPath) {
  KILN_REQUIRE_CUDA();
  const Tensor w = random_tensor({256}, DType::BF16);
  {
    const Tensor x = random_tensor({4, 256}, DType::BF16);
    const Tensor r0 = random_tensor({4, 256}, DType::F32);
    Tensor rc = r0.clone(), rg = r0.to(kGpu);
    const Tensor want = add_rms_norm(x, rc, w, 1e-6);
    const Tensor got = add_rms_norm(x.to(kGpu), rg, w.to(kGpu), 1e-6);
    EXPECT_TRUE(equal(rg.cpu(), rc));
    EXPECT_TRUE(rms_close(got, want));
  }
  {
    const Tensor x = random_tensor({4, 256}, DType::BF16);
    const Tensor b0 = random_tensor({256, 4}, DType::BF16);
    Tensor bc = b0.clone(), bg = b0.to(kGpu);
    Tensor rc = bc.t(), rg = bg.t();
    const Tensor want = add_rms_norm(x, rc, w, 1e-6);
    const Tensor got = add_rms_norm(x.to(kGpu), rg, w.to(kGpu), 1e-6);
    EXPECT_TRUE(equal(bg.cpu(), bc));
    EXPECT_TRUE(rms_close(got, want));
  }
}

#if KILN_HAVE_CUDA
TEST(CudaAddRmsNorm, LauncherWritesEveryOutputElementAndNothingElse) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDtypes) {
    for (const Shape& shape : {Shape{1, 4096}, Shape{64, 128}, Shape{3, 1001}, Shape{2, 40000}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape));
      const Tensor x = random_tensor(shape, dt);
      const Tensor r0 = random_tensor(shape, dt);
      const Tensor w = random_tensor({shape.back()}, dt);
      Tensor rc = r0.clone();
      const Tensor want = add_rms_norm(x, rc, w, 1e-6);
      auto [out, buf] = offset_tensor(zeros(shape, dt), 1);
      poison(buf);
      Tensor rg = r0.to(kGpu);
      cuda::add_rms_norm(out, rg, x.to(kGpu), w.to(kGpu), 1e-6);
      EXPECT_TRUE(equal(rg.cpu(), rc));
      EXPECT_TRUE(rms_close(out, want));
      const auto b = buf.cpu().to_vector<double>();
      EXPECT_TRUE(std::isnan(b.front()) && std::isnan(b.back()));
    }
  }
}
#endif

// ---- silu_and_mul ---------------------------------------------------------------------------------------

int64_t silu_ulps(DType dt) { return dt == DType::F32 || dt == DType::F64 ? 8 : 1; }
double silu_fraction(DType dt) { return dt == DType::F32 || dt == DType::F64 ? 1.0 : 0.01; }

TEST(CudaSiluAndMul, MatchesCpu) {
  KILN_REQUIRE_CUDA();
  const std::vector<Shape> shapes = {{1, 2 * 14336}, {1, 2 * 2048}, {7, 2 * 5120}, {3, 2 * 1001},
                                     {64, 2 * 128},  {1, 2},        {70000, 6},    {2, 3, 2 * 40}};
  for (DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape));
      const Tensor in = random_tensor(shape, dt, -8, 8);
      const Tensor want = silu_and_mul(in);
      EXPECT_TRUE(near_bits(silu_and_mul(in.to(kGpu)), want, silu_ulps(dt), INT64_MAX, silu_fraction(dt)));
    }
  }
}

TEST(CudaSiluAndMul, MisalignedAndStridedInputs) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor in = random_tensor({5, 2 * 512}, dt, -8, 8);
    const Tensor want = silu_and_mul(in);
    auto [ig, buf] = offset_tensor(in, 1);
    EXPECT_TRUE(near_bits(silu_and_mul(ig), want, silu_ulps(dt), INT64_MAX, silu_fraction(dt)));
    const Tensor it = in.to(kGpu).t().contiguous().t();  // not contiguous: copied first
    EXPECT_TRUE(near_bits(silu_and_mul(it), want, silu_ulps(dt), INT64_MAX, silu_fraction(dt)));
  }
}

TEST(CudaSiluAndMul, EdgeValues) {
  KILN_REQUIRE_CUDA();
  const Tensor in = from_vector<float>({-INFINITY, INFINITY, NAN, -1000.f, 0.f, 2.f, 3.f, 1.f, 1.f, 1.f}, Shape{10});
  const auto got = silu_and_mul(in.to(kGpu)).cpu().to_vector<float>();
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_EQ(got[1], INFINITY);
  EXPECT_TRUE(std::isnan(got[2]));
  EXPECT_EQ(got[3], 0.f);
  EXPECT_TRUE(std::signbit(got[3]));
  EXPECT_EQ(got[4], 0.f);
  EXPECT_EQ(silu_and_mul(empty({0, 4}, DType::BF16, kGpu)).sizes(), (Shape{0, 2}));
}

#if KILN_HAVE_CUDA
TEST(CudaSiluAndMul, LauncherWritesEveryOutputElementAndNothingElse) {
  KILN_REQUIRE_CUDA();
  for (DType dt : kDtypes) {
    for (const Shape& shape : {Shape{1, 2 * 4096}, Shape{3, 2 * 1001}, Shape{70000, 6}}) {
      for (int64_t off : {0, 1}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape) + " offset " + std::to_string(off));
        const Tensor in = random_tensor(shape, dt, -8, 8);
        const Tensor want = silu_and_mul(in);
        auto [out, buf] = offset_tensor(zeros(want.sizes(), dt), off);
        poison(buf);
        cuda::silu_and_mul(out, in.to(kGpu));
        EXPECT_TRUE(near_bits(out, want, silu_ulps(dt), INT64_MAX, silu_fraction(dt)));
        const auto b = buf.cpu().to_vector<double>();
        EXPECT_TRUE(std::isnan(b.back()));
        if (off > 0) EXPECT_TRUE(std::isnan(b.front()));
      }
    }
  }
}
#endif

// ---- rope_ ----------------------------------------------------------------------------------------------

// The device's cosf/sinf may differ from glibc's by an ulp or two (see the top of the file). An f32 ulp of
// cos or sin moves x*cos - y*sin by ~2^-24 of |x| + |y|, which for a result that nearly cancels (|result| <<
// |x|) is more than one half-type ulp of the result: seen on the H200 as 2 f16 ulps at 9e-5 (20 of 153600
// elements). Hence 2 ulps, on at most 1% of the elements; and a result within 1e-6 of the CPU's counts as
// equal however few ulps that is (inputs in [-2, 2): 2^-24 (|x| + |y|) <= 2.4e-7; seen: 3 bf16 ulps at 1.1e-5,
// 1.8e-7 apart).
::testing::AssertionResult rope_close(const Tensor& got, const Tensor& want) {
  if (want.dtype() == DType::F32 || want.dtype() == DType::F64) return all_close(got.cpu(), want, Tolerance{1e-5, 1e-5});
  std::vector<double> g = got.cpu().contiguous().to_vector<double>();
  const std::vector<double> w = want.contiguous().to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i)
    if (std::fabs(g[i] - w[i]) <= 1e-6) g[i] = w[i];
  return near_bits(from_vector<double>(g, want.sizes()).to(want.dtype()), want, 2, INT64_MAX, 0.01);
}

struct RopeCase {
  int64_t t_len, hq, hk, d, rot;
  DType dt;
  DType pos_dt;
  double scaling;
};

// q and k as views of one fused [T, (Hq + 2 Hk) * D] qkv buffer; v must stay untouched.
void check_rope_on_qkv(const RopeCase& c, const std::vector<int64_t>& pos) {
  SCOPED_TRACE(std::string(dtype_name(c.dt)) + " T " + std::to_string(c.t_len) + " Hq " + std::to_string(c.hq) +
               " Hk " + std::to_string(c.hk) + " D " + std::to_string(c.d) + " rot " + std::to_string(c.rot) +
               " pos " + dtype_name(c.pos_dt) + " scaling " + std::to_string(c.scaling));
  const int64_t heads = c.hq + 2 * c.hk;
  const Tensor qkv0 = random_tensor({c.t_len, heads * c.d}, c.dt);
  const Tensor positions = from_vector<int64_t>(pos).to(c.pos_dt);
  const Tensor inv = rope_inv_freq(c.rot, 1e6);

  Tensor hc = qkv0.clone().view({c.t_len, heads, c.d});
  Tensor qc = hc.narrow(1, 0, c.hq), kc = hc.narrow(1, c.hq, c.hk);
  rope_(qc, kc, positions, inv, c.scaling);

  Tensor hg = qkv0.to(kGpu).view({c.t_len, heads, c.d});
  Tensor qg = hg.narrow(1, 0, c.hq), kg = hg.narrow(1, c.hq, c.hk);
  rope_(qg, kg, positions.to(kGpu), inv.to(kGpu), c.scaling);

  EXPECT_TRUE(rope_close(qg, qc.contiguous()));
  EXPECT_TRUE(rope_close(kg, kc.contiguous()));
  // Channels past rotary_dim and the v heads: bit for bit the input.
  const Tensor h0 = qkv0.view({c.t_len, heads, c.d});
  const Tensor hgc = hg.cpu();
  if (c.rot < c.d)
    EXPECT_EQ(raw_bits(hgc.narrow(1, 0, c.hq + c.hk).narrow(2, c.rot, c.d - c.rot)),
              raw_bits(h0.narrow(1, 0, c.hq + c.hk).narrow(2, c.rot, c.d - c.rot)));
  EXPECT_EQ(raw_bits(hgc.narrow(1, c.hq + c.hk, c.hk)), raw_bits(h0.narrow(1, c.hq + c.hk, c.hk)));
}

TEST(CudaRope, MatchesCpuOnGqaQkvSlices) {
  KILN_REQUIRE_CUDA();
  const std::vector<int64_t> pos = {0, 5, 1000, 131071};
  for (DType dt : kDtypes)
    for (DType pdt : {DType::I32, DType::I64})
      for (int64_t d : {64, 128}) {
        check_rope_on_qkv({4, 32, 8, d, d, dt, pdt, 1.0}, pos);
        check_rope_on_qkv({1, 32, 8, d, d, dt, pdt, 1.0}, {131071});  // decode
      }
}

TEST(CudaRope, PartialRotaryScalingAndManyTokens) {
  KILN_REQUIRE_CUDA();
  std::vector<int64_t> many(300);
  for (size_t t = 0; t < many.size(); ++t) many[t] = static_cast<int64_t>(t) * 437 % 131072;
  for (DType dt : kDtypes) {
    check_rope_on_qkv({4, 16, 4, 128, 64, dt, DType::I64, 1.25}, {3, 0, 70000, 131071});  // vector path
    check_rope_on_qkv({4, 6, 2, 64, 8, dt, DType::I32, 1.0}, {3, 0, 70000, 131071});      // half 4: scalar
    check_rope_on_qkv({4, 4, 2, 80, 80, dt, DType::I32, 0.5}, {1, 2, 3, 4});               // half 40
    check_rope_on_qkv({300, 8, 2, 64, 64, dt, DType::I64, 1.0}, many);
    check_rope_on_qkv({3, 40, 0, 128, 128, dt, DType::I64, 1.0}, {7, 8, 9});  // no k heads
  }
  check_rope_on_qkv({4, 8, 2, 64, 64, DType::F64, DType::I64, 1.0}, {0, 5, 1000, 131071});
}

TEST(CudaRope, MisalignedTransposedAndStridedPositions) {
  KILN_REQUIRE_CUDA();
  const Tensor inv = rope_inv_freq(64, 1e4);
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t t_len = 3;
    // q heads start one element into each row (base misaligned), k transposed (channel stride H).
    const Tensor qb0 = random_tensor({t_len, 4, 65}, dt);
    const Tensor kb0 = random_tensor({t_len, 64, 2}, dt);
    // positions with stride 2 (a column of a [T, 2] tensor).
    const Tensor pos2 = from_vector<int64_t>({1000, -1, 5, -1, 131071, -1}, Shape{t_len, 2});
    Tensor qbc = qb0.clone(), kbc = kb0.clone();
    Tensor qc = qbc.narrow(2, 1, 64), kc = kbc.transpose(1, 2);
    rope_(qc, kc, pos2.select(1, 0), inv, 1.0);
    Tensor qbg = qb0.to(kGpu), kbg = kb0.to(kGpu);
    Tensor qg = qbg.narrow(2, 1, 64), kg = kbg.transpose(1, 2);
    rope_(qg, kg, pos2.to(kGpu).select(1, 0), inv.to(kGpu), 1.0);
    EXPECT_TRUE(rope_close(qg, qc.contiguous()));
    EXPECT_TRUE(rope_close(kg, kc.contiguous()));
    EXPECT_EQ(raw_bits(qbg.cpu().narrow(2, 0, 1)), raw_bits(qb0.narrow(2, 0, 1)));
  }
}

TEST(CudaRope, DifferentQAndKDtypes) {
  KILN_REQUIRE_CUDA();
  const Tensor q0 = random_tensor({2, 4, 64}, DType::F32), k0 = random_tensor({2, 2, 64}, DType::BF16);
  const Tensor pos = from_vector<int32_t>({17, 4096});
  Tensor qc = q0.clone(), kc = k0.clone();
  rope_(qc, kc, pos, 1e4);
  Tensor qg = q0.to(kGpu), kg = k0.to(kGpu);
  rope_(qg, kg, pos.to(kGpu), rope_inv_freq(64, 1e4, kGpu), 1.0);
  EXPECT_TRUE(rope_close(qg, qc));
  EXPECT_TRUE(rope_close(kg, kc));
}

TEST(CudaRope, ZeroTokensAndErrors) {
  KILN_REQUIRE_CUDA();
  Tensor q = empty({0, 2, 8}, DType::F32, kGpu), k = empty({0, 1, 8}, DType::F32, kGpu);
  rope_(q, k, empty({0}, DType::I64, kGpu), rope_inv_freq(8, 1e4, kGpu), 1.0);
  Tensor q1 = ones({1, 2, 8}, DType::F32, kGpu), k1 = ones({1, 1, 8}, DType::F32, kGpu);
  EXPECT_TRUE(throws_error([&] { rope_(q1, k1, from_vector<int64_t>({0}), rope_inv_freq(8, 1e4, kGpu), 1.0); },
                           {"rope_", "one device"}));
}

// ---- graph capture --------------------------------------------------------------------------------------

TEST(CudaNormGraph, DecodeStepCapturesAndReplays) {
  KILN_REQUIRE_CUDA();
  const DType dt = DType::BF16;
  const int64_t hidden = 2048, hq = 16, hk = 4, d = 128, inter = 6144;
  const Tensor x0 = random_tensor({1, hidden}, dt).to(kGpu);
  const Tensor r0 = random_tensor({1, hidden}, dt).to(kGpu);
  const Tensor gu0 = random_tensor({1, 2 * inter}, dt, -6, 6).to(kGpu);
  const Tensor qkv0 = random_tensor({1, (hq + 2 * hk) * d}, dt).to(kGpu);
  const Tensor w = random_tensor({hidden}, dt, 0.5, 1.5).to(kGpu);
  const Tensor wq = random_tensor({d}, dt, 0.5, 1.5).to(kGpu);
  const Tensor inv = rope_inv_freq(d, 1e6, kGpu);
  Tensor pos = from_vector<int64_t>({1000}).to(kGpu);
  Tensor x = x0.clone(), residual = r0.clone(), gu = gu0.clone(), qkv = qkv0.clone();

  struct Outs {
    Tensor n1, n2, act, qn, qkv, residual;
  };
  auto step = [&]() {
    Outs o;
    o.n1 = rms_norm(x, w, 1e-6);
    o.n2 = add_rms_norm(x, residual, w, 1e-6);
    o.act = silu_and_mul(gu);
    Tensor h = qkv.view({1, hq + 2 * hk, d});
    Tensor q = h.narrow(1, 0, hq), k = h.narrow(1, hq, hk);
    o.qn = rms_norm(q, wq, 1e-6);  // q_norm over [T, H, 128]
    rope_(q, k, pos, inv, 1.0);
    return o;
  };
  auto reset = [&] {
    residual.copy_(r0);
    qkv.copy_(qkv0);
  };
  const Outs eager = step();
  const Tensor eager_res = residual.cpu(), eager_qkv = qkv.cpu();

  reset();
  synchronize(kGpu);
  Stream s = Stream::create(kGpu);
  Graph g;
  Outs cap;
  g.capture(s, [&] { cap = step(); });
  synchronize(kGpu);
  reset();
  synchronize(kGpu);
  // Poison the captured outputs: the replay must rewrite every element.
  for (Tensor* t : {&cap.n1, &cap.n2, &cap.act, &cap.qn}) poison(*t);
  synchronize(kGpu);
  g.replay();
  s.synchronize();
  EXPECT_TRUE(equal(cap.n1.cpu(), eager.n1.cpu()));
  EXPECT_TRUE(equal(cap.n2.cpu(), eager.n2.cpu()));
  EXPECT_TRUE(equal(cap.act.cpu(), eager.act.cpu()));
  EXPECT_TRUE(equal(cap.qn.cpu(), eager.qn.cpu()));
  EXPECT_TRUE(equal(residual.cpu(), eager_res));
  EXPECT_TRUE(equal(qkv.cpu(), eager_qkv));

  // A new position written on the device between replays is read by the replay (no host copy of it).
  reset();
  pos.copy_(from_vector<int64_t>({131071}).to(kGpu));
  synchronize(kGpu);
  g.replay();
  s.synchronize();
  Tensor hc = qkv0.cpu().view({1, hq + 2 * hk, d});
  Tensor qc = hc.narrow(1, 0, hq), kc = hc.narrow(1, hq, hk);
  rope_(qc, kc, from_vector<int64_t>({131071}), inv.cpu(), 1.0);
  EXPECT_TRUE(rope_close(qkv.view({1, hq + 2 * hk, d}), hc));
}

}  // namespace
}  // namespace kiln::test
