// CUDA FP8 against the CPU (tests/ops/moe_test.cpp checks the CPU against double references): quantize_fp8 bit
// for bit (values and scales), dequantize_fp8, linear(x, Fp8Weight) on every path, scaled_mm for every recipe
// and path, exact integer data, NaN/overflow, extreme scales, misaligned and strided operands, graph capture.
#include <cmath>

#include "kiln/nn.h"
#include "kiln/runtime.h"
#include "ops/linear_check.h"
#include "test_util.h"
#if KILN_HAVE_CUDA
#include "cuda/backend.h"
#include "cuda/fp8.h"
#endif

namespace kiln {
namespace {

#if KILN_HAVE_CUDA

using cuda::Fp8Path;

const Device kGpu = cuda_device(0);
const DType kActs[] = {DType::F32, DType::F16, DType::BF16};
const ScaleRecipe kRecipes[] = {ScaleRecipe::TensorWise, ScaleRecipe::RowWise, ScaleRecipe::BlockWise};

std::string rname(ScaleRecipe r) { return scale_recipe_name(r); }

using test::placed;

// Float8 values whose magnitudes span the e4m3 range (normals and subnormals), from random reals.
Tensor random_fp8(const Shape& s, double lo = -448, double hi = 448) {
  return test::random_tensor(s, DType::F32, lo, hi).to(DType::F8E4M3);
}

// Small integers: exact in e4m3, and every product and partial sum below exact in f32 and in the tensor cores.
Tensor int_fp8(const Shape& s, int64_t lo = -2, int64_t hi = 2) {
  return test::random_int_tensor(s, DType::I64, lo, hi).to(DType::F32).to(DType::F8E4M3);
}

// Powers of two 2^[lo, hi]: products of them are exact.
Tensor pow2_scales(const Shape& s, int64_t lo = -2, int64_t hi = 2) {
  return exp2(test::random_int_tensor(s, DType::I64, lo, hi).to(DType::F32));
}

bool values_all_finite(const Tensor& t) {
  for (double v : t.to(kCPU).to(DType::F64).contiguous().to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes())
    return ::testing::AssertionFailure() << a.meta() << " vs " << b.meta();
  const auto x = test::raw_bits(a.to(kCPU).contiguous()), y = test::raw_bits(b.to(kCPU).contiguous());
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != y[i])
      return ::testing::AssertionFailure() << "bits differ at flat index " << i << ": " << std::hex << x[i] << " vs "
                                           << y[i];
  return ::testing::AssertionSuccess();
}

// out vs ref (both [M, N]), each a sum of k products: |out - ref| <= ulp(out dtype) * |ref| + acc * scale, with
// scale = |a| @ |b| + |bias| (f64) and acc the accumulation error per unit of scale: 4 sqrt(k+1) 2^-24 for f32
// sums in any order (see linear_close), and 2^-10 for FP8 tensor cores, whose MMAs add products with fewer
// than f32's bits before cuBLASLt promotes the partial sums to f32 (DeepSeek-V3 report, sec. 3.3.2, measures
// ~14 bits); 2^-10 of the scale is still below the size of one product in the shapes tested (K <= 1024 with
// products of similar size: one term is ~1/K of the scale), so a missed or repeated term fails.
::testing::AssertionResult fp8_close(const Tensor& out, const Tensor& ref, const Tensor& scale, int64_t k,
                                     bool tensor_cores) {
  if (out.sizes() != ref.sizes())
    return ::testing::AssertionFailure() << shape_str(out.sizes()) << " vs " << shape_str(ref.sizes());
  const DType dt = out.dtype();
  const double rel = dt == DType::BF16 ? 0x1p-7 : dt == DType::F16 ? 0x1p-10 : 0x1p-23;
  const double tiny = dt == DType::F16 ? 0x1p-24 : 1e-30;
  const double acc = tensor_cores ? 0x1p-10 : 4.0 * std::sqrt(static_cast<double>(k) + 1.0) * 0x1p-24;
  const auto o = out.to(kCPU).to(DType::F64).contiguous().to_vector<double>();
  const auto r = ref.to(kCPU).to(DType::F64).contiguous().to_vector<double>();
  const auto s = scale.to(kCPU).to(DType::F64).contiguous().to_vector<double>();
  for (size_t i = 0; i < o.size(); ++i) {
    if (std::isnan(r[i]) || std::isinf(r[i])) {
      if (std::isnan(r[i]) ? !std::isnan(o[i]) : o[i] != r[i])
        return ::testing::AssertionFailure() << "at " << i << ": got " << o[i] << ", expected " << r[i];
      continue;
    }
    const double tol = rel * std::fabs(r[i]) + acc * s[i] + tiny;
    if (!(std::fabs(o[i] - r[i]) <= tol))
      return ::testing::AssertionFailure() << "at " << i << " (row " << i / out.size(1) << ", col " << i % out.size(1)
                                           << "): got " << o[i] << ", expected " << r[i] << ", tolerance " << tol;
  }
  return ::testing::AssertionSuccess();
}

// ---- quantize / dequantize ---------------------------------------------------------------------------------

TEST(CudaFp8, QuantiseMatchesCpuBitForBit) {
  KILN_REQUIRE_CUDA();
  const Shape shapes[] = {{1, 1}, {5, 7}, {150, 300}, {130, 257}, {3, 1000}, {256, 128}, {0, 5}, {4, 0}};
  for (const Shape& s : shapes)
    for (DType xt : kActs)
      for (DType f8 : {DType::F8E4M3, DType::F8E5M2})
        for (ScaleRecipe r : kRecipes)
          for (bool act : {true, false})
            for (int64_t block : {128, 48})
              for (bool transposed : {false, true}) {
                SCOPED_TRACE(str(shape_str(s), " ", dtype_name(xt), " ", dtype_name(f8), " ", rname(r),
                                 act ? " activation" : " weight", " block ", block, transposed ? " x^T" : ""));
                // Magnitudes from 1e-3 to 1e3 (so groups have very different scales), one all-zero row.
                Tensor x = mul(test::random_tensor(s, DType::F32, -1, 1),
                               exp2(test::random_int_tensor(s, DType::I64, -10, 10).to(DType::F32)))
                               .to(xt);
                if (s[0] > 2 && s[1] > 0) x.narrow(0, 2, 1).fill_(0);
                Tensor xg = x.to(kGpu);
                if (transposed) xg = x.t().contiguous().to(kGpu).t();  // same values, column-major
                const Fp8Tensor c = quantize_fp8(x, r, f8, act, block);
                const Fp8Tensor g = quantize_fp8(xg, r, f8, act, block);
                ASSERT_TRUE(g.values.is_cuda() && g.scales.is_cuda());
                EXPECT_TRUE(same_bits(g.values, c.values));
                EXPECT_TRUE(same_bits(g.scales, c.scales));
                if (f8 == DType::F8E4M3 && s[0] * s[1] > 0) {
                  // dequantize_fp8 on the device: the CPU's f32 bits, and its 16-bit roundings (written
                  // directly on the device, through f32 on the CPU).
                  for (DType od : {DType::F32, DType::BF16, DType::F16})
                    EXPECT_TRUE(same_bits(dequantize_fp8(g, r, od, act, block), dequantize_fp8(c, r, od, act, block)))
                        << dtype_name(od);
                }
              }
}

TEST(CudaFp8, QuantiseNonFiniteZerosAndLargeTensors) {
  KILN_REQUIRE_CUDA();
  // NaN / inf make their group's scale NaN; zeros give scale 1; saturation at the format's max.
  // (-NaN too: the sign of a NaN survives into the fp8 bits, 0xFF vs 0x7F.)
  Tensor x = from_vector<float>({1, NAN, 2, 3, 1, 2, 3, 4, INFINITY, -NAN, 0, -7, 0, 0, 0, 0, 1e38f, -3e38f, 5, 6},
                                Shape{5, 4});
  for (ScaleRecipe r : kRecipes)
    for (DType f8 : {DType::F8E4M3, DType::F8E5M2}) {
      SCOPED_TRACE(rname(r) + " " + dtype_name(f8));
      const Fp8Tensor c = quantize_fp8(x, r, f8, true, 2), g = quantize_fp8(x.to(kGpu), r, f8, true, 2);
      EXPECT_TRUE(same_bits(g.values, c.values));
      EXPECT_TRUE(same_bits(g.scales, c.scales));
      // Values equal, NaN where the CPU has NaN (which of two NaN operands a product returns is the compiler's
      // choice on the CPU, so NaN bits are not compared here).
      EXPECT_TRUE(test::all_close(dequantize_fp8(g, r, DType::F32, true, 2).to(kCPU),
                                  dequantize_fp8(c, r, DType::F32, true, 2), test::Tolerance{0, 0}));
    }
  // Tensor-wise over many blocks (the two-kernel reduction), with the NaN in the last partial's share, then
  // without it.
  for (bool with_nan : {false, true}) {
    Tensor big = test::random_tensor({1500, 3001}, DType::F32, -5, 5).to(DType::BF16);
    if (with_nan) big.narrow(0, 1499, 1).narrow(1, 3000, 1).fill_(NAN);
    const Fp8Tensor c = quantize_fp8(big, ScaleRecipe::TensorWise), g = quantize_fp8(big.to(kGpu), ScaleRecipe::TensorWise);
    EXPECT_TRUE(same_bits(g.values, c.values));
    EXPECT_TRUE(same_bits(g.scales, c.scales));
    EXPECT_EQ(std::isnan(g.scales.to(kCPU).to_vector<float>()[0]), with_nan);
  }
}

// ---- linear(x, Fp8Weight) ---------------------------------------------------------------------------------

struct Weight {
  Fp8Weight cpu, gpu;
};
Weight make_weight(int64_t n, int64_t k, ScaleRecipe r, int64_t bn = 128, int64_t bk = 128) {
  Fp8Weight w;
  w.recipe = r;
  w.block_n = bn;
  w.block_k = bk;
  if (r == ScaleRecipe::BlockWise && bn == bk) {
    const Fp8Tensor q = quantize_fp8(test::random_tensor({n, k}, DType::F32, -1, 1), r, DType::F8E4M3, false, bn);
    w.values = q.values;
    w.scales = q.scales;
  } else {
    w.values = random_fp8({n, k});
    const Shape grid = r == ScaleRecipe::TensorWise ? Shape{1} : r == ScaleRecipe::RowWise ? Shape{n}
                                                                 : Shape{(n + bn - 1) / bn, (k + bk - 1) / bk};
    w.scales = test::random_tensor(grid, DType::F32, 1.0 / 448, 4.0 / 448);
  }
  Fp8Weight g = w;
  g.values = w.values.to(kGpu);
  g.scales = w.scales.to(kGpu);
  return {w, g};
}

Tensor deq_weight(const Fp8Weight& w) {
  // The weight's real values in f64 on the CPU.
  const int64_t n = w.values.size(0), k = w.values.size(1);
  const auto v = w.values.to(kCPU).to(DType::F64).to_vector<double>();
  const Tensor s = w.scales.to(kCPU).to(DType::F64);
  const auto sv = s.contiguous().to_vector<double>();
  std::vector<double> out(v.size());
  const int64_t bn = w.recipe == ScaleRecipe::TensorWise ? n : w.recipe == ScaleRecipe::RowWise ? 1 : w.block_n;
  const int64_t bk = w.recipe == ScaleRecipe::BlockWise ? w.block_k : std::max<int64_t>(k, 1);
  const int64_t gk = (k + bk - 1) / bk;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) out[i * k + j] = v[i * k + j] * sv[(i / bn) * gk + j / bk];
  return from_vector<double>(out, Shape{n, k});
}

void check_linear(int64_t m, int64_t n, int64_t k, ScaleRecipe r, DType dt, bool with_bias, int64_t x_off,
                  Fp8Path path, int64_t bn = 128, int64_t bk = 128, Fp8Path* took = nullptr, double x_mult = 1.0) {
  SCOPED_TRACE(str("M=", m, " N=", n, " K=", k, " ", rname(r), " ", dtype_name(dt), with_bias ? " bias" : "",
                   x_off ? " x offset 1" : "", " blocks ", bn, "x", bk, " path ", cuda::fp8_path_name(path)));
  const Weight w = make_weight(n, k, r, bn, bk);
  const Tensor xc = x_mult == 1.0 ? test::random_tensor({m, k}, dt, -1, 1)
                                  : mul(test::random_tensor({m, k}, DType::F64, -1, 1), x_mult).to(dt);
  const Tensor xg = placed(xc, x_off, kGpu);
  const Tensor bc = with_bias ? test::random_tensor({n}, dt) : Tensor();
  const Tensor bg = with_bias ? bc.to(kGpu) : Tensor();
  Fp8Path taken = Fp8Path::Auto;
  const Tensor scales2d = w.gpu.scales.reshape({r == ScaleRecipe::TensorWise ? 1 : w.gpu.scales.size(0),
                                                r == ScaleRecipe::BlockWise ? w.gpu.scales.size(1) : 1});
  const int64_t ebn = r == ScaleRecipe::TensorWise ? n : r == ScaleRecipe::RowWise ? 1 : bn;
  const int64_t ebk = r == ScaleRecipe::BlockWise ? bk : k;
  Tensor y = cuda::linear_fp8(xg, w.gpu.values, scales2d.contiguous(), ebn, ebk, r, with_bias ? &bg : nullptr, path,
                              &taken);
  ASSERT_EQ(y.dtype(), dt);
  ASSERT_EQ(y.sizes(), (Shape{m, n}));
  const Tensor wd = deq_weight(w.cpu);
  const Tensor scale = test::linear_abs_scale(xc, wd, with_bias ? std::optional<Tensor>(bc) : std::nullopt);
  if (taken == Fp8Path::CublasLt) {
    // The activations were quantised (per 1 x 128 block against block weights, else per row against per-channel
    // scales): the reference is that computation on the CPU.
    const ScaleRecipe qr = r == ScaleRecipe::BlockWise ? ScaleRecipe::BlockWise : ScaleRecipe::RowWise;
    const Fp8Tensor q = quantize_fp8(xc, qr, DType::F8E4M3, true, 128);
    const Tensor sb = r == ScaleRecipe::BlockWise ? w.cpu.scales.t()
                      : r == ScaleRecipe::RowWise ? w.cpu.scales.reshape({1, n})
                                                  : w.cpu.scales.reshape({1, 1}).expand({1, n}).contiguous();
    const Tensor ref = scaled_mm(q.values, w.cpu.values.t(), q.scales, sb, qr,
                                 with_bias ? std::optional<Tensor>(bc) : std::nullopt, dt);
    const Tensor qs = test::linear_abs_scale(dequantize_fp8(q, qr, DType::F64), wd,
                                             with_bias ? std::optional<Tensor>(bc) : std::nullopt);
    EXPECT_TRUE(fp8_close(y, ref, qs, k, true));
    // And within the activation rounding (2^-4 relative per element) of the unquantised definition.
    EXPECT_TRUE(fp8_close(y, linear(xc, w.cpu, with_bias ? std::optional<Tensor>(bc) : std::nullopt),
                          mul(scale, 64.0), k, true));  // 2^-10 * 64 = 2^-4 of the scale
  } else {
    const Tensor ref = linear(xc, w.cpu, with_bias ? std::optional<Tensor>(bc) : std::nullopt);
    EXPECT_TRUE(test::linear_close(y, ref, scale, dt, k)) << "took " << cuda::fp8_path_name(taken);
  }
  if (path == Fp8Path::Auto && m <= 16) EXPECT_EQ(taken, Fp8Path::Gemv);
  if (path != Fp8Path::Auto && path != Fp8Path::CublasLt) EXPECT_EQ(taken, path);
  if (took) *took = taken;
}

TEST(CudaFp8Linear, DefaultPathMatchesCpu) {
  KILN_REQUIRE_CUDA();
  struct NK {
    int64_t n, k;
  };
  for (const NK s : {NK{200, 300}, NK{256, 512}, NK{96, 1024}, NK{48, 4096}, NK{1, 16}, NK{3, 5}})
    for (int64_t m : {1, 2, 5, 16, 17, 64})
      for (ScaleRecipe r : kRecipes)
        for (DType dt : kActs)
          for (int64_t x_off : {0, 1}) check_linear(m, s.n, s.k, r, dt, (m + x_off) % 2 == 1, x_off, Fp8Path::Auto);
}

TEST(CudaFp8Linear, EveryPathMatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (Fp8Path p : {Fp8Path::Gemv, Fp8Path::Fallback, Fp8Path::CublasLt})
    for (int64_t m : {1, 7, 33, 128})
      for (ScaleRecipe r : kRecipes)
        for (DType dt : kActs) check_linear(m, 256, 1024, r, dt, true, 0, p);
  // Block shapes other than 128 x 128: a 48-wide K block (whole 16-element chunks), a 40-wide one (the
  // element path), tall 32-row blocks.
  for (int64_t m : {1, 3, 16, 20})
    for (int64_t bk : {48, 40})
      for (DType dt : kActs) {
        check_linear(m, 100, 480, ScaleRecipe::BlockWise, dt, true, 0, Fp8Path::Auto, 32, bk);
        check_linear(m, 100, 480, ScaleRecipe::BlockWise, dt, false, 0, Fp8Path::Fallback, 32, bk);
      }
}

// The process-wide one-row kernel shape, set for a test and restored when it ends (-1: auto).
using GemvConfigScope = test::SettingScope<int, cuda::fp8_gemv_config, cuda::set_fp8_gemv_config>;

// Every shape of the one-row kernel (cuda::set_fp8_gemv_config): row counts that leave partial warp groups,
// K that leaves partial unrolled steps, each recipe, 16-bit activations with and without bias.
TEST(CudaFp8Linear, EveryOneRowKernelShapeMatchesCpu) {
  KILN_REQUIRE_CUDA();
  const GemvConfigScope restore(-1);
  struct NK {
    int64_t n, k;
  };
  // Configs 4..6 software-pipeline the steps: the K lengths give each thread odd and even step counts and a
  // remainder after them (2064 = 129 chunks of 16).
  // -1: auto; 7: the tensor-core kernel (K a multiple of 64 only); 8: config 3's shape, the general loop.
  for (int cfg = -1; cfg < 9; ++cfg) {
    SCOPED_TRACE(str("config ", cfg));
    cuda::set_fp8_gemv_config(cfg);
    for (const NK s : {NK{200, 384}, NK{1, 16}, NK{37, 4096}, NK{515, 1040}, NK{64, 14336}, NK{130, 2064}})
      for (ScaleRecipe r : kRecipes)
        for (DType dt : {DType::BF16, DType::F16}) {
          Fp8Path took = Fp8Path::Auto;
          check_linear(1, s.n, s.k, r, dt, s.n % 2 == 1, 0, Fp8Path::Auto, 128, 128, &took);
          EXPECT_EQ(took, Fp8Path::Gemv);
        }
    // 48-wide K blocks: the scale block by a division instead of a shift.
    for (DType dt : {DType::BF16, DType::F16}) {
      Fp8Path took = Fp8Path::Auto;
      check_linear(1, 100, 480, ScaleRecipe::BlockWise, dt, true, 0, Fp8Path::Auto, 32, 48, &took);
      EXPECT_EQ(took, Fp8Path::Gemv);
    }
  }
  EXPECT_THROW(cuda::set_fp8_gemv_config(9), Error);
  EXPECT_THROW(cuda::set_fp8_gemv_config(-2), Error);
}

// The one-row kernel reads its activations only after the kernel that writes them has finished. Under
// dependent launches (kernels/pdl.cuh) its loads of x once ran ahead of the wait in the compiled code, and a
// decode step read the previous step's x (qwen3-tiny-fp8's golden test). Here x comes from rms_norm launched
// just before, into a buffer that the allocator hands back each round holding the previous round's x; the
// reference is the CPU product of the x the GPU wrote (read back afterwards). The weight is constant, as a
// model's (Storage::set_constant), so the product is launched as a dependent. Every one-row kernel shape.
TEST(CudaFp8Linear, OneRowReadsActivationsWrittenJustBefore) {
  KILN_REQUIRE_CUDA();
  const GemvConfigScope restore(-1);
  const Weight w = make_weight(96, 64, ScaleRecipe::BlockWise, 32, 32);
  mark_constant(w.gpu.values);
  mark_constant(w.gpu.scales);
  const bool pdl = cuda::dependent_launch_enabled(0);
  const Tensor wd = deq_weight(w.cpu);
  const Tensor norm = test::random_tensor({64}, DType::BF16, 0.5, 1.5).to(kGpu);
  for (int cfg = -1; cfg < 9; ++cfg) {
    SCOPED_TRACE(str("config ", cfg));
    cuda::set_fp8_gemv_config(cfg);
    for (int round = 0; round < 8; ++round) {
      const Tensor h = test::random_tensor({1, 64}, DType::BF16, -2, 2).to(kGpu);
      const Tensor x = rms_norm(h, norm, 1e-6);
      const int64_t before = cuda::dependent_launches();
      const Tensor y = linear(x, w.gpu);
      EXPECT_EQ(cuda::dependent_launches() - before, pdl ? 1 : 0);
      const Tensor xc = x.to(kCPU);
      EXPECT_TRUE(test::linear_close(y, linear(xc, w.cpu), test::linear_abs_scale(xc, wd, std::nullopt),
                                     DType::BF16, 64))
          << "round " << round;
    }
  }
}

// Weight scales that the kernel just before wrote: the last rows of a large rms_norm output over f32 rows
// (128 MB, written over many rounds of blocks; rms_norm lets the next kernel start once its last blocks have
// started, which is when those rows are being written), in blocks the allocator hands back each round holding
// the previous round's values. They are not marked constant, so the product is not launched as a dependent
// and reads them only after rms_norm has finished. Every one-row kernel shape; the reference is the CPU
// product with the scales read back.
TEST(CudaFp8Linear, OneRowReadsScalesWrittenJustBefore) {
  KILN_REQUIRE_CUDA();
  const GemvConfigScope restore(-1);
  const int64_t n = 2048, k = 1024, bn = 128, bk = 128;
  const Weight w = make_weight(n, k, ScaleRecipe::BlockWise, bn, bk);
  const Tensor gain = test::random_tensor({k / bk}, DType::F32, 0.5, 1.5, kGpu);
  const Tensor x = test::random_tensor({1, k}, DType::BF16, -2, 2, kGpu);
  const Tensor xc = x.cpu();
  const int64_t total = (int64_t{32} << 20) / (k / bk);  // rows of the rms_norm output
  for (int cfg = -1; cfg < 9; ++cfg) {
    SCOPED_TRACE(str("config ", cfg));
    cuda::set_fp8_gemv_config(cfg);
    for (int round = 0; round < 3; ++round) {
      Tensor raw = empty({total, k / bk}, DType::F32, kGpu);
      uniform_(raw, 1.0 / 448, 4.0 / 448);
      Fp8Weight g = w.gpu;
      g.scales = rms_norm(raw, gain, 1e-6).narrow(0, total - n / bn, n / bn);
      const int64_t before = cuda::dependent_launches();
      const Tensor y = linear(x, g);
      EXPECT_EQ(cuda::dependent_launches(), before) << "a product of unmarked scales launched as a dependent";
      Fp8Weight c = w.cpu;
      c.scales = g.scales.cpu();
      const Tensor wd = deq_weight(c);
      EXPECT_TRUE(test::linear_close(y, linear(xc, c), test::linear_abs_scale(xc, wd, std::nullopt), DType::BF16, k))
          << "round " << round;
    }
  }
}

// Config 3's shape through the lean one-row loop and through the general loop (config 8, auto's choice from
// 64 MB of weights) computes the same products in the same order: the same bits, every recipe and dtype.
TEST(CudaFp8Linear, GeneralLoopMatchesLeanLoopBitForBit) {
  KILN_REQUIRE_CUDA();
  const GemvConfigScope restore(-1);
  for (ScaleRecipe r : kRecipes)
    for (DType dt : {DType::BF16, DType::F16})
      for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{515, 1040}, {64, 14336}, {130, 2064}}) {
        SCOPED_TRACE(str(rname(r), " ", dtype_name(dt), " N=", n, " K=", k));
        const Weight w = make_weight(n, k, r);
        const Tensor x = test::random_tensor({1, k}, dt, -2, 2, kGpu);
        cuda::set_fp8_gemv_config(3);
        const Tensor lean = linear(x, w.gpu);
        cuda::set_fp8_gemv_config(8);
        const Tensor general = linear(x, w.gpu);
        EXPECT_TRUE(same_bits(lean, general));
      }
}

// Activations far from 1 on the matrix-vector kernel: products and sums stay in f32, so nothing is lost
// until the output's own rounding.
TEST(CudaFp8Linear, MatrixVectorActivationsOfExtremeMagnitude) {
  KILN_REQUIRE_CUDA();
  for (double mult : {0x1p100, 0x1p-100, 3e2, 1e-30})
    for (DType dt : {DType::BF16, DType::F16}) {
      if (dt == DType::F16 && (mult > 1e3 || mult < 1e-7)) continue;  // outputs past f16's range, or not f16 values
      SCOPED_TRACE(str("activations times ", mult));
      Fp8Path took = Fp8Path::Auto;
      check_linear(3, 200, 512, ScaleRecipe::BlockWise, dt, false, 0, Fp8Path::Auto, 128, 128, &took, mult);
      EXPECT_EQ(took, Fp8Path::Gemv);
    }
}

// Non-finite activations on the matrix-vector kernel: a row holding NaN gives NaN everywhere, a row holding inf
// gives what the definition gives (inf of either sign, or NaN where the signs meet), the other rows are
// unaffected.
TEST(CudaFp8Linear, MatrixVectorNonFiniteActivations) {
  KILN_REQUIRE_CUDA();
  const int64_t n = 64, k = 256;
  const Weight w = make_weight(n, k, ScaleRecipe::BlockWise);
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = test::random_tensor({3, k}, DType::F32, -1, 1);
    std::vector<float> xv = x.contiguous().to_vector<float>();
    xv[5] = NAN;               // row 0
    xv[k + 17] = INFINITY;     // row 1, with a finite value past f16's range (-inf in an f16 x)
    xv[k + 18] = -1e6f;
    x = from_vector<float>(xv, Shape{3, k}).to(dt);
    const Tensor scales2d = w.gpu.scales.reshape({w.gpu.scales.size(0), w.gpu.scales.size(1)}).contiguous();
    Fp8Path taken = Fp8Path::Auto;
    const Tensor y = cuda::linear_fp8(x.to(kGpu), w.gpu.values, scales2d, 128, 128, ScaleRecipe::BlockWise, nullptr,
                                      Fp8Path::Auto, &taken)
                         .to(DType::F32)
                         .cpu();
    EXPECT_EQ(taken, Fp8Path::Gemv);
    const Tensor ref = linear(x, w.cpu).to(DType::F32);
    const std::vector<float> yv = y.contiguous().to_vector<float>(), rv = ref.contiguous().to_vector<float>();
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_TRUE(std::isnan(yv[j])) << "row 0, column " << j;
      const float got = yv[n + j], want = rv[n + j];
      EXPECT_TRUE((std::isnan(got) && std::isnan(want)) || got == want) << "row 1, column " << j << ": " << got
                                                                          << " against " << want;
    }
    EXPECT_TRUE(test::linear_close(y.narrow(0, 2, 1).to(dt), ref.narrow(0, 2, 1).to(dt),
                                   test::linear_abs_scale(x.narrow(0, 2, 1), deq_weight(w.cpu), std::nullopt), dt, k));
  }
}

// The tensor-core one-row kernel (config 7): activations of extreme and of mixed magnitude (the row is scaled
// by a power of two into f16 once), scale blocks of 64 and of 192 (not a power of two), every recipe, bias,
// partial tiles, and non-finite activations.
TEST(CudaFp8Linear, TensorCoreOneRowKernel) {
  KILN_REQUIRE_CUDA();
  const GemvConfigScope restore(7);
  const int64_t launches = cuda::fp8_gemv_mma_launches();
  int64_t expected = 0;
  for (double mult : {0x1p100, 0x1p-100, 3e2, 1e-30, 1.0})
    for (DType dt : {DType::BF16, DType::F16}) {
      if (dt == DType::F16 && (mult > 1e3 || mult < 1e-7)) continue;  // outputs past f16's range, or not f16 values
      SCOPED_TRACE(str("activations times ", mult));
      check_linear(1, 200, 512, ScaleRecipe::BlockWise, dt, true, 0, Fp8Path::Auto, 128, 128, nullptr, mult);
      ++expected;
    }
  for (int64_t bk : {64, 192})
    for (ScaleRecipe r : kRecipes)
      for (int64_t n : {1, 37, 300}) {
        check_linear(1, n, 1152, r, DType::BF16, n == 37, 0, Fp8Path::Auto, bk, bk);
        ++expected;
      }
  EXPECT_EQ(cuda::fp8_gemv_mma_launches() - launches, expected);

  const int64_t n = 40, k = 640;
  const Weight w = make_weight(n, k, ScaleRecipe::BlockWise);
  const Tensor wd = deq_weight(w.cpu);
  const Tensor scales2d = w.gpu.scales.reshape({w.gpu.scales.size(0), w.gpu.scales.size(1)}).contiguous();
  auto run = [&](const Tensor& x) {
    return cuda::linear_fp8(x.to(kGpu), w.gpu.values, scales2d, 128, 128, ScaleRecipe::BlockWise, nullptr,
                            Fp8Path::Auto, nullptr)
        .to(DType::F32)
        .cpu();
  };
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    // Magnitudes over 24 binades in one row: each keeps its bits after the row's scaling.
    std::vector<float> xv = test::random_tensor({1, k}, DType::F32, -1, 1).contiguous().to_vector<float>();
    for (int64_t j = 0; j < k; ++j) xv[j] = std::ldexp(xv[j], -static_cast<int>(j % 24));
    Tensor x = from_vector<float>(xv, Shape{1, k}).to(dt);
    EXPECT_TRUE(test::linear_close(run(x).to(dt), linear(x, w.cpu).to(dt),
                                   test::linear_abs_scale(x, wd, std::nullopt), dt, k));
    // Pieces of very different magnitude (each 128-activation piece has its own scale): zeros, 1e-30 times
    // the random values (zeros again in f16), 300 times, then as drawn.
    xv = test::random_tensor({1, k}, DType::F32, -1, 1).contiguous().to_vector<float>();
    for (int64_t j = 0; j < k; ++j) {
      const int64_t piece = j / 128;
      xv[j] = piece == 0 ? 0.f : piece == 1 ? xv[j] * 1e-30f : piece == 2 ? xv[j] * 3e2f : xv[j];
    }
    x = from_vector<float>(xv, Shape{1, k}).to(dt);
    EXPECT_TRUE(test::linear_close(run(x).to(dt), linear(x, w.cpu).to(dt),
                                   test::linear_abs_scale(x, wd, std::nullopt), dt, k));
    // NaN anywhere: NaN everywhere.
    xv = test::random_tensor({1, k}, DType::F32, -1, 1).contiguous().to_vector<float>();
    xv[5] = NAN;
    std::vector<float> yv = run(from_vector<float>(xv, Shape{1, k}).to(dt)).contiguous().to_vector<float>();
    for (int64_t j = 0; j < n; ++j) EXPECT_TRUE(std::isnan(yv[j])) << "column " << j;
    // inf with a finite value past f16's range (-inf in an f16 x): what the definition gives.
    xv[5] = 0.5f;
    xv[17] = INFINITY;
    xv[18] = -1e6f;
    x = from_vector<float>(xv, Shape{1, k}).to(dt);
    yv = run(x).contiguous().to_vector<float>();
    const std::vector<float> rv = linear(x, w.cpu).to(DType::F32).contiguous().to_vector<float>();
    for (int64_t j = 0; j < n; ++j)
      EXPECT_TRUE((std::isnan(yv[j]) && std::isnan(rv[j])) || yv[j] == rv[j])
          << "column " << j << ": " << yv[j] << " against " << rv[j];
    expected += 4;
  }
  EXPECT_EQ(cuda::fp8_gemv_mma_launches() - launches, expected);
}

TEST(CudaFp8Linear, PublicOpAnd3dInput) {
  KILN_REQUIRE_CUDA();
  const Weight w = make_weight(130, 384, ScaleRecipe::BlockWise);
  const Tensor x = test::random_tensor({2, 3, 384}, DType::BF16);
  const Tensor b = test::random_tensor({130}, DType::BF16);
  Tensor y = linear(x.to(kGpu), w.gpu, b.to(kGpu));
  ASSERT_EQ(y.sizes(), (Shape{2, 3, 130}));
  const Tensor ref = linear(x, w.cpu, b);
  EXPECT_TRUE(test::linear_close(y.reshape({6, 130}), ref.reshape({6, 130}),
                                 test::linear_abs_scale(x.reshape({6, 384}), deq_weight(w.cpu), b), DType::BF16, 384));
  // Large K (split-K over many warps, the unrolled loop) for every row count template.
  for (int64_t m : {1, 2, 4, 8, 16}) check_linear(m, 136, 14336, ScaleRecipe::BlockWise, DType::BF16, true, 0, Fp8Path::Gemv);
  // The weight's scales must be on its device.
  Fp8Weight bad = w.gpu;
  bad.scales = w.cpu.scales;
  EXPECT_TRUE(test::throws_error([&] { linear(x.to(kGpu), bad); }, {"linear(fp8)", "not on x's device"}));
}

// ---- scaled_mm -----------------------------------------------------------------------------------------------

struct Operands {
  Tensor a, b, sa, sb;  // CPU: a [M, K], b = W^T [K, N] (column-major), scales per scaled_mm's contract
};
Operands make_operands(int64_t m, int64_t n, int64_t k, ScaleRecipe r, bool integers) {
  Operands o;
  const int64_t kb = (k + 127) / 128, nb = (n + 127) / 128;
  o.a = integers ? int_fp8({m, k}) : random_fp8({m, k});
  const Tensor w = integers ? int_fp8({n, k}) : random_fp8({n, k});
  o.b = w.t();
  auto sc = [&](const Shape& s) { return integers ? pow2_scales(s) : test::random_tensor(s, DType::F32, 1e-3, 1e-2); };
  switch (r) {
    case ScaleRecipe::TensorWise: o.sa = sc({1}), o.sb = sc({1}); break;
    case ScaleRecipe::RowWise: o.sa = sc({m, 1}), o.sb = sc({n, 1}).t(); break;
    default: o.sa = sc({m, kb}), o.sb = sc({nb, kb}).t(); break;
  }
  return o;
}
Operands to_gpu(const Operands& o) {
  // b keeps its column-major layout (W^T of a contiguous W on the device).
  return {o.a.to(kGpu), o.b.t().contiguous().to(kGpu).t(), o.sa.to(kGpu), o.sb.t().contiguous().to(kGpu).t()};
}
Tensor deq_a(const Operands& o, ScaleRecipe r) {
  const int64_t m = o.a.size(0), k = o.a.size(1);
  const Tensor sa = r == ScaleRecipe::TensorWise ? o.sa.reshape({1, 1}) : o.sa;
  return dequantize_fp8({o.a, sa.contiguous()}, r, DType::F64, true, 128).reshape({m, k});
}
Tensor deq_b(const Operands& o, ScaleRecipe r) {
  // b [K, N] = W^T; W's scales are sb^T.
  const Tensor w = o.b.t().contiguous();
  if (r == ScaleRecipe::RowWise) return mul(w.to(DType::F64), o.sb.t().to(DType::F64)).t();
  return dequantize_fp8({w, o.sb.t().contiguous()}, r, DType::F64, false, 128).t();
}
Tensor abs_mm(const Tensor& a, const Tensor& b, const std::optional<Tensor>& bias) {
  Tensor s = mm(abs(a), abs(b));
  if (bias) s = add(s, abs(bias->to(DType::F64)));
  return s;
}

void check_scaled(const Operands& oc, ScaleRecipe r, DType od, const std::optional<Tensor>& bias, Fp8Path path,
                  bool exact, const std::string& what) {
  SCOPED_TRACE(str(what, " ", rname(r), " out ", dtype_name(od), bias ? str(" bias ", dtype_name(bias->dtype())) : "",
                   " path ", cuda::fp8_path_name(path)));
  const Operands og = to_gpu(oc);
  const std::optional<Tensor> bg = bias ? std::optional<Tensor>(bias->to(kGpu)) : std::nullopt;
  Fp8Path taken = Fp8Path::Auto;
  std::optional<Tensor> y = cuda::scaled_mm(og.a, og.b, og.sa, og.sb, r, bg, od, path, &taken);
  if (!y) {
    // What the op runs then: the reference composition on the device.
    taken = Fp8Path::Fallback;
    const Fp8Path before = cuda::forced_fp8_path();
    cuda::set_forced_fp8_path(Fp8Path::Fallback);
    y = scaled_mm(og.a, og.b, og.sa, og.sb, r, bg, od);
    cuda::set_forced_fp8_path(before);
  }
  ASSERT_EQ(y->dtype(), od);
  const Tensor ref = scaled_mm(oc.a, oc.b, oc.sa, oc.sb, r, bias, od);
  if (exact) {
    EXPECT_TRUE(same_bits(*y, ref)) << "took " << cuda::fp8_path_name(taken);
  } else {
    const Tensor scale = abs_mm(deq_a(oc, r), deq_b(oc, r), bias);
    EXPECT_TRUE(fp8_close(*y, ref, scale, oc.a.size(1), taken == Fp8Path::CublasLt))
        << "took " << cuda::fp8_path_name(taken);
  }
  if (path == Fp8Path::Gemv && oc.a.size(0) > 0 && oc.a.dtype() == DType::F8E4M3 && oc.b.dtype() == DType::F8E4M3)
    EXPECT_EQ(taken, Fp8Path::Gemv);
}

TEST(CudaScaledMm, AllRecipesAndPathsMatchCpu) {
  KILN_REQUIRE_CUDA();
  struct NK {
    int64_t n, k;
  };
  for (const NK s : {NK{140, 300}, NK{256, 512}, NK{128, 1024}, NK{16, 2048}})
    for (int64_t m : {1, 5, 16, 17, 64})
      for (ScaleRecipe r : kRecipes) {
        const Operands o = make_operands(m, s.n, s.k, r, false);
        for (DType od : kActs)
          for (Fp8Path p : {Fp8Path::Auto, Fp8Path::Gemv, Fp8Path::CublasLt, Fp8Path::Fallback}) {
            const std::optional<Tensor> bias =
                p == Fp8Path::Auto ? std::optional<Tensor>(test::random_tensor({s.n}, od))
                : p == Fp8Path::Gemv ? std::optional<Tensor>(test::random_tensor({s.n}, DType::F32))
                                     : std::nullopt;
            check_scaled(o, r, od, bias, p, false, str("M=", m, " N=", s.n, " K=", s.k));
          }
      }
}

// Integer operands and power-of-two scales: every product and every partial sum is exact in f32 and in the
// tensor cores, so every path must give the CPU's bits. A scale read from the wrong block, a transposed scale
// layout or a missed K block shows up as a different number.
TEST(CudaScaledMm, IntegerDataIsExactOnEveryPath) {
  KILN_REQUIRE_CUDA();
  // K = 640: 5 K blocks, so cuBLASLt's block-scale rows are padded (to 8).
  for (int64_t k : {1024, 640})
    for (int64_t m : {1, 4, 16, 64, 256})
      for (ScaleRecipe r : kRecipes) {
        const Operands o = make_operands(m, 384, k, r, true);
        for (DType od : kActs)
          for (Fp8Path p : {Fp8Path::Gemv, Fp8Path::CublasLt, Fp8Path::Fallback}) {
            const std::optional<Tensor> bias =
                od == DType::F32 ? std::nullopt
                                 : std::optional<Tensor>(test::random_int_tensor({384}, DType::I64, -9, 9).to(od));
            check_scaled(o, r, od, bias, p, true, str("integers M=", m, " K=", k));
          }
      }
}

TEST(CudaScaledMm, LayoutsAndAlignment) {
  KILN_REQUIRE_CUDA();
  const int64_t m = 9, n = 64, k = 256;
  for (ScaleRecipe r : kRecipes) {
    SCOPED_TRACE(rname(r));
    const Operands o = make_operands(m, n, k, r, false);
    const Operands g = to_gpu(o);
    const Tensor ref = scaled_mm(o.a, o.b, o.sa, o.sb, r, std::nullopt, DType::F32);
    const Tensor scale = abs_mm(deq_a(o, r), deq_b(o, r), std::nullopt);
    // a misaligned by one byte; b row-major [K, N] (not W^T); both. M = 9 rows take cuBLASLt where it accepts
    // the operands and the matrix-vector kernel where not, so the tolerance is the tensor cores' (2^-10 of
    // the magnitudes: a scale read from the wrong place is off by far more).
    const Tensor a_mis = placed(o.a, 1, kGpu);
    const Tensor b_row = o.b.contiguous().to(kGpu);
    EXPECT_TRUE(fp8_close(scaled_mm(a_mis, g.b, g.sa, g.sb, r, std::nullopt, DType::F32), ref, scale, k, true));
    EXPECT_TRUE(fp8_close(scaled_mm(g.a, b_row, g.sa, g.sb, r, std::nullopt, DType::F32), ref, scale, k, true));
    EXPECT_TRUE(fp8_close(scaled_mm(a_mis, b_row, g.sa, g.sb, r, std::nullopt, DType::F32), ref, scale, k, true));
    // Scales given with other strides (a transposed copy viewed back).
    EXPECT_TRUE(fp8_close(scaled_mm(g.a, g.b, g.sa.t().contiguous().t(), g.sb.contiguous(), r, std::nullopt, DType::F32),
                          ref, scale, k, true));
    // The same through the matrix-vector kernel, to f32 accuracy.
    Fp8Path taken = Fp8Path::Auto;
    const std::optional<Tensor> yg = cuda::scaled_mm(g.a, g.b, g.sa.t().contiguous().t(), g.sb.contiguous(), r,
                                                     std::nullopt, DType::F32, Fp8Path::Gemv, &taken);
    ASSERT_TRUE(yg.has_value());
    EXPECT_EQ(taken, Fp8Path::Gemv);
    EXPECT_TRUE(fp8_close(*yg, ref, scale, k, false));
  }
  // A bias on another device is an error, not a read of host memory from the device.
  {
    const Operands g = to_gpu(make_operands(m, n, k, ScaleRecipe::TensorWise, false));
    EXPECT_TRUE(test::throws_error(
        [&] { scaled_mm(g.a, g.b, g.sa, g.sb, ScaleRecipe::TensorWise, test::random_tensor({n}, DType::F32)); },
        {"scaled_mm: bias", "not on a's device"}));
  }
  // Empty M and N.
  const Operands e = to_gpu(make_operands(0, 32, 64, ScaleRecipe::TensorWise, false));
  EXPECT_EQ(scaled_mm(e.a, e.b, e.sa, e.sb, ScaleRecipe::TensorWise).sizes(), (Shape{0, 32}));
}

// NaN in an operand or a scale reaches the outputs it touches (and only those); values at the edge of the
// range overflow f16 outputs to inf as the CPU does; extreme scales whose product is moderate give finite
// outputs (the kernels multiply the two scales before the sum, not the sum by one of them first).
TEST(CudaScaledMm, NonFiniteAndExtremeScales) {
  KILN_REQUIRE_CUDA();
  for (int64_t m : {2, 64})
    for (ScaleRecipe r : kRecipes)
      for (Fp8Path p : {Fp8Path::Gemv, Fp8Path::CublasLt, Fp8Path::Fallback}) {
        const std::string what = str("M=", m);
        Operands o = make_operands(m, 128, 512, r, false);
        o.a.narrow(0, 1, 1).narrow(1, 7, 1).fill_(NAN);  // row 1 of the output becomes NaN
        check_scaled(o, r, DType::BF16, std::nullopt, p, false, what + " NaN in a");
        Operands o2 = make_operands(m, 128, 512, r, false);
        o2.sa = o2.sa.contiguous();
        o2.sa.narrow(0, 0, 1).fill_(NAN);
        check_scaled(o2, r, DType::F32, std::nullopt, p, false, what + " NaN scale");
        // Saturated operands: sums reach 448 * 448 * 512 ~ 1e8 > f16's max.
        Operands o3 = make_operands(m, 128, 512, r, false);
        o3.a.fill_(448);
        o3.b = full({128, 512}, 448.0, DType::F8E4M3).t();
        o3.sa.fill_(1);
        o3.sb = o3.sb.contiguous();
        o3.sb.fill_(1);
        check_scaled(o3, r, DType::F16, std::nullopt, p, false, what + " f16 overflow");
        // scale_a 1e-30 and scale_b 1e30 (and the reverse): finite outputs of ordinary size.
        for (double sa : {1e-30, 1e30}) {
          Operands o4 = make_operands(m, 128, 512, r, false);
          o4.sa.fill_(sa);
          o4.sb = o4.sb.contiguous();
          o4.sb.fill_(1.0 / sa);
          check_scaled(o4, r, DType::BF16, std::nullopt, p, false, what + str(" scale_a ", sa));
          const Operands g = to_gpu(o4);
          const std::optional<Tensor> y = cuda::scaled_mm(g.a, g.b, g.sa, g.sb, r, std::nullopt, DType::F32, p);
          if (y) EXPECT_TRUE(values_all_finite(*y));
        }
      }
}

// float8_e5m2 operands (alone or mixed with e4m3): cuBLASLt where it has kernels (not e5m2 x e5m2), else the
// reference composition; and an e5m2 weight in linear (the exact fallback).
TEST(CudaScaledMm, E5m2Operands) {
  KILN_REQUIRE_CUDA();
  for (int64_t m : {4, 64})
    for (DType ta : {DType::F8E4M3, DType::F8E5M2})
      for (DType tb : {DType::F8E4M3, DType::F8E5M2})
        for (ScaleRecipe r : kRecipes)
          for (Fp8Path p : {Fp8Path::Auto, Fp8Path::CublasLt, Fp8Path::Gemv}) {
            Operands o = make_operands(m, 128, 512, r, false);
            o.a = test::random_tensor({m, 512}, DType::F32, -400, 400).to(ta);
            o.b = test::random_tensor({128, 512}, DType::F32, -400, 400).to(tb).t();
            check_scaled(o, r, DType::BF16, std::nullopt, p, false,
                         str("M=", m, " a ", dtype_name(ta), " b ", dtype_name(tb)));
          }
  for (int64_t m : {1, 20}) {
    Fp8Weight w{random_fp8({96, 256}).to(DType::F32).to(DType::F8E5M2),
                test::random_tensor({1, 2}, DType::F32, 0.01, 0.02), ScaleRecipe::BlockWise, 128, 128};
    Fp8Weight wg = w;
    wg.values = w.values.to(kGpu);
    wg.scales = w.scales.to(kGpu);
    const Tensor x = test::random_tensor({m, 256}, DType::BF16);
    EXPECT_TRUE(test::linear_close(linear(x.to(kGpu), wg), linear(x, w),
                                   test::linear_abs_scale(x, deq_weight(w), std::nullopt), DType::BF16, 256));
  }
}

// ---- graph capture ---------------------------------------------------------------------------------------------

TEST(CudaFp8, GraphCaptureAndReplayMatchEager) {
  KILN_REQUIRE_CUDA();
  for (int64_t m : {1, 64}) {
    SCOPED_TRACE(str("M=", m));
    const int64_t n = 256, k = 1024;
    const Operands o = to_gpu(make_operands(m, n, k, ScaleRecipe::RowWise, false));
    const Weight w = make_weight(n, k, ScaleRecipe::BlockWise);
    Tensor x = test::random_tensor({m, k}, DType::BF16).to(kGpu);
    const Tensor b = test::random_tensor({n}, DType::BF16).to(kGpu);
    const Tensor mm_eager = scaled_mm(o.a, o.b, o.sa, o.sb, ScaleRecipe::RowWise, b, DType::BF16).to(kCPU);
    const Tensor lin_eager = linear(x, w.gpu, b).to(kCPU);
    const Fp8Tensor q_eager = quantize_fp8(x, ScaleRecipe::TensorWise);
    Stream s = Stream::create(kGpu);
    Graph g;
    Tensor mm_out, lin_out;
    Fp8Tensor q_out;
    synchronize(kGpu);
    g.capture(s, [&] {
      mm_out = scaled_mm(o.a, o.b, o.sa, o.sb, ScaleRecipe::RowWise, b, DType::BF16);
      lin_out = linear(x, w.gpu, b);
      q_out = quantize_fp8(x, ScaleRecipe::TensorWise);
    });
    g.replay();
    s.synchronize();
    // The same kernels on the same data give the same bits; cuBLASLt (M = 64) only within tolerance, as its
    // algorithm could differ with the graph's workspace.
    auto same = [&](const Tensor& a, const Tensor& b) {
      return m <= 16 ? same_bits(a, b) : test::all_close(a.to(kCPU), b.to(kCPU));
    };
    EXPECT_TRUE(same(mm_out, mm_eager));
    EXPECT_TRUE(same(lin_out, lin_eager));
    EXPECT_TRUE(same_bits(q_out.values, q_eager.values));
    EXPECT_TRUE(same_bits(q_out.scales, q_eager.scales));
    // New activations in the same buffer: the replay reads them.
    const Tensor x2 = test::random_tensor({m, k}, DType::BF16);
    x.copy_(x2.to(kGpu));
    synchronize(kGpu);
    g.replay();
    s.synchronize();
    EXPECT_TRUE(same(lin_out, linear(x, w.gpu, b)));
    EXPECT_TRUE(same_bits(q_out.values, quantize_fp8(x2, ScaleRecipe::TensorWise).values));
  }
}

#endif  // KILN_HAVE_CUDA

}  // namespace
}  // namespace kiln
