// CUDA Q8_0, Q4_0, Q4_K, Q5_K and Q6_K weights against the CPU (tests/ops/quant_test.cpp checks the CPU against the formats'
// definitions): dequantisation bit for bit, linear on the int8 matrix-vector path (x quantised as the CPU
// quantises it, so only the order of the f32 sums differs) and on the dequantised-slices path, NaN
// activations, misaligned and strided operands, graph capture.
#include <cmath>
#include <type_traits>
#include <variant>

#include "kiln/nn.h"
#include "kiln/runtime.h"
#include "kblocks_random.h"
#include "ops/linear_check.h"
#include "test_util.h"
#if KILN_HAVE_CUDA
#include "cuda/backend.h"
#include "cuda/quant.h"
#endif

namespace kiln {
namespace {

#if KILN_HAVE_CUDA

const Device kGpu = cuda_device(0);

// A quantised weight of any of the five formats.
using QWeight = BlockWeight;

// Q5_K and Q6_K, which kiln does not quantise to: random super-blocks of w's shape (values up to about 3 and
// 1.2), a fresh draw each call.
uint64_t next_seed() {
  static uint64_t seed = 1000;
  return seed++;
}

struct Format {
  const char* name;
  int64_t k_multiple;
  QWeight (*quantize)(const Tensor& w);  // on the CPU
};

const Format kFormats[] = {
    {"q8_0", 32, [](const Tensor& w) { return QWeight(quantize_q8_0(w)); }},
    {"q4_0", 32, [](const Tensor& w) { return QWeight(quantize_q4_0(w)); }},
    {"q4_k", 256, [](const Tensor& w) { return QWeight(quantize_q4_k(w)); }},
    {"q5_k", 256, [](const Tensor& w) { return QWeight(test::random_q5k(w.size(0), w.size(1), next_seed(), 1e-3f, 1.5e-3f)); }},
    {"q6_k", 256, [](const Tensor& w) { return QWeight(test::random_q6k(w.size(0), w.size(1), next_seed(), 1e-4f, 3e-4f)); }}};

QWeight to(const QWeight& q, Device d) {
  return std::visit(
      [&](const auto& w) -> QWeight {
        using W = std::decay_t<decltype(w)>;
        if constexpr (requires { w.blocks; }) return W{w.blocks.to(d)};
        else return W{w.values.to(d), w.scales.to(d)};
      },
      q);
}

// linear on x's device (the weight moved there).
Tensor qlinear(const Tensor& x, const QWeight& q, const std::optional<Tensor>& b = std::nullopt) {
  return std::visit([&](const auto& w) { return linear(x, w, b); }, to(q, x.device()));
}

const DType kActs[] = {DType::F32, DType::F16, DType::BF16};

TEST(CudaQuant, DequantisationIsTheCpusBitForBit) {
  KILN_REQUIRE_CUDA();
  for (const Format& f : kFormats)
    for (int64_t k : {f.k_multiple, 3 * f.k_multiple, int64_t{1024}}) {
      const QWeight q = f.quantize(test::random_tensor({37, k}, DType::F32, -0.5, 0.5));
      for (DType dt : kActs) {
        SCOPED_TRACE(str(f.name, " K=", k, " ", dtype_name(dt)));
        EXPECT_TRUE(test::equal(dequantize(to(q, kGpu), dt).to(kCPU), dequantize(q, dt)));
      }
    }
}

// The CPU's result of the same product: up to kQuantGemvRows rows CUDA quantises x per block, as the CPU does
// (taken 16 rows at a time, which the CPU quantises on every instruction-set path); beyond that CUDA multiplies
// the weight dequantised to x's dtype, which the reference does on the CPU too.
Tensor cpu_linear(const Tensor& x, const QWeight& q, const std::optional<Tensor>& b) {
  const int64_t m = x.size(0);
  if (m > cuda::kQuantGemvRows) return linear(x, dequantize(q, x.dtype()), b);
  std::vector<Tensor> parts;
  for (int64_t m0 = 0; m0 < m; m0 += 16) parts.push_back(qlinear(x.narrow(0, m0, std::min<int64_t>(16, m - m0)), q, b));
  return cat(parts, 0);
}

TEST(CudaQuant, LinearMatchesTheCpuOnEveryRowCount) {
  KILN_REQUIRE_CUDA();
  for (const Format& f : kFormats)
    // 16384: several warps per weight row (the split); 131 weight rows: the last block partly empty.
    for (int64_t k : {f.k_multiple, int64_t{768}, int64_t{4096}, int64_t{16384}}) {
      for (int64_t n : {int64_t{1}, int64_t{131}}) {
        if (k == 16384 && n > 1) continue;
        const QWeight q = f.quantize(test::random_tensor({n, k}, DType::F32, -0.1, 0.1));
        const Tensor wd = dequantize(q, DType::F32);
        for (int64_t m : {1, 2, 3, 5, 8, 9, 16, 17, 32, 33}) {
          for (DType dt : kActs) {
            const bool with_bias = (m + static_cast<int64_t>(dt) + k / 256) % 2 == 1;
            SCOPED_TRACE(str(f.name, " K=", k, " N=", n, " M=", m, " ", dtype_name(dt), with_bias ? " bias" : ""));
            const Tensor x = test::random_tensor({m, k}, dt);
            const std::optional<Tensor> b =
                with_bias ? std::optional<Tensor>(test::random_tensor({n}, dt)) : std::nullopt;
            const Tensor ref = cpu_linear(x, q, b);
            const Tensor out = qlinear(x.to(kGpu), q, b ? std::optional<Tensor>(b->to(kGpu)) : std::nullopt);
            ASSERT_EQ(out.dtype(), dt);
            // The dense product beyond kQuantGemvRows runs in x's dtype on each side (cuBLAS / oneDNN, whose bias
            // epilogues may round before the bias).
            EXPECT_TRUE(test::linear_close(out, ref, test::linear_abs_scale(x, wd, b), dt, k,
                                           m > cuda::kQuantGemvRows && dt != DType::F32));
          }
        }
      }
    }
}

// The int8 path is not the float product: it is the product of x's codes (a check that x is quantised at all).
TEST(CudaQuant, FewRowsQuantiseTheActivations) {
  KILN_REQUIRE_CUDA();
  const int64_t n = 64, k = 512;
  const Tensor w = test::random_tensor({n, k}, DType::F32, -0.1, 0.1), x = test::random_tensor({3, k}, DType::F32);
  const QWeight q = quantize_q8_0(w);
  const Tensor y = qlinear(x.to(kGpu), q).to(kCPU), dense = linear(x, dequantize(q, DType::F32));
  const float scale = amax(abs(dense)).item<float>(), err = amax(abs(sub(y, dense))).item<float>();
  EXPECT_GT(err, 0.f);
  EXPECT_LT(err, 0.01f * scale);
}

TEST(CudaQuant, NonFiniteActivationsGiveNanRows) {
  KILN_REQUIRE_CUDA();
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    const int64_t n = 40, k = 512;
    const QWeight q = f.quantize(test::random_tensor({n, k}, DType::F32, -0.1, 0.1));
    Tensor x = test::random_tensor({3, k}, DType::F32);
    x.data<float>()[k + 300] = std::nanf("");
    x.data<float>()[2 * k + 7] = INFINITY;
    const Tensor y = qlinear(x.to(kGpu), q).to(kCPU);
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_TRUE(std::isfinite(y.data<float>()[j]));
      EXPECT_TRUE(std::isnan(y.data<float>()[n + j]));
      EXPECT_TRUE(std::isnan(y.data<float>()[2 * n + j]));
    }
  }
}

using test::placed;

// Misaligned weight rows (the dequantised-slices path for every row count), a misaligned x, x with a row
// stride and a transposed x: the same results as contiguous operands.
TEST(CudaQuant, MisalignedAndStridedOperands) {
  KILN_REQUIRE_CUDA();
  const int64_t n = 48, k = 256;
  const Tensor w = test::random_tensor({n, k}, DType::F32, -0.1, 0.1);
  const Q4KWeight q = quantize_q4_k(w);
  const Q8Weight q8 = quantize_q8_0(w);
  for (int64_t m : {1, 4, 40}) {
    SCOPED_TRACE(str("M=", m));
    const Tensor x = test::random_tensor({m, k}, DType::BF16);
    const Tensor ref = linear(x.to(kGpu), Q4KWeight{q.blocks.to(kGpu)}).to(kCPU);
    const Tensor ref8 = qlinear(x.to(kGpu), q8).to(kCPU);
    // Misaligned Q4_K blocks and Q8_0 values, Q8_0 scales with a column stride: copied to an aligned buffer,
    // the same bits as the aligned weight on the int8 path (same kernels), and within tolerance on the dense
    // path (whose cuBLASLt algorithm may depend on the alignment).
    auto same = [&](const Tensor& a, const Tensor& e) {
      return m <= cuda::kQuantGemvRows ? test::equal(a.to(kCPU), e) : test::all_close(a.to(kCPU), e);
    };
    EXPECT_TRUE(same(linear(x.to(kGpu), Q4KWeight{placed(q.blocks, 1, kGpu)}), ref));
    const Tensor scales_t = q8.scales.t().contiguous().to(kGpu).t();
    EXPECT_TRUE(same(linear(x.to(kGpu), Q8Weight{placed(q8.values, 3, kGpu), scales_t}), ref8));
    // Activations: misaligned, row-strided, transposed storage.
    EXPECT_TRUE(same(linear(placed(x, 1, kGpu), Q4KWeight{q.blocks.to(kGpu)}), ref));
    const Tensor wide = empty({m, 2 * k}, DType::BF16, kGpu);
    wide.narrow(1, 0, k).copy_(x.to(kGpu));
    EXPECT_TRUE(same(linear(wide.narrow(1, 0, k), Q4KWeight{q.blocks.to(kGpu)}), ref));
    const Tensor xt = x.t().contiguous().to(kGpu).t();
    EXPECT_TRUE(same(qlinear(xt, q8), ref8));
  }
}

// Q6_K's 210-byte blocks are 2-byte aligned: the kernels read them in place at any even address (rows of 420
// bytes here) and copy them from an odd one. Every placement gives the CPU's result; a weight marked constant
// and read in place makes the product a dependent launch, which a copy (not constant) would not.
TEST(CudaQuant, Q6KBlocksAtAnyEvenAddress) {
  KILN_REQUIRE_CUDA();
  const bool pdl = cuda::dependent_launch_enabled(0);
  const int64_t n = 37, k = 512;
  const Q6KWeight q = test::random_q6k(n, k, 71, 1e-4f, 3e-4f);
  const Tensor wd = dequantize_q6_k(q);
  for (int64_t m : {1, 5, 40}) {
    SCOPED_TRACE(str("M=", m));
    const Tensor x = test::random_tensor({m, k}, DType::BF16);
    const Tensor ref = cpu_linear(x, q, std::nullopt);
    for (int64_t offset : {0, 2, 6, 1}) {
      SCOPED_TRACE(str("offset ", offset));
      const Q6KWeight g{placed(q.blocks, offset, kGpu)};
      mark_constant(g.blocks);
      const int64_t before = cuda::dependent_launches();
      const Tensor out = linear(x.to(kGpu), g);
      // The activations' quantisation is always a dependent launch; the product (one per 8 rows) when in place.
      if (m <= cuda::kQuantGemvRows)
        EXPECT_EQ(cuda::dependent_launches() - before, pdl ? 1 + (offset % 2 == 0 ? (m + 7) / 8 : 0) : 0);
      EXPECT_TRUE(test::linear_close(out, ref, test::linear_abs_scale(x, wd, std::nullopt), DType::BF16, k,
                                     m > cuda::kQuantGemvRows));
      EXPECT_TRUE(test::equal(dequantize_q6_k(g).to(kCPU), wd));
    }
  }
}

// Fewer blocks than row blocks (each looping over its rows, the next ones' loads in flight): the same bits as
// one block per row block, with one and several warps per row, one and two steps per row, threads without a
// chunk (K = 256), and few and many rows of x.
TEST(CudaQuant, LoopingBlocksGiveTheSameBits) {
  KILN_REQUIRE_CUDA();
  using PerSm = test::SettingScope<int64_t, cuda::qgemv_blocks_per_sm, cuda::set_qgemv_blocks_per_sm>;
  for (const Format& f : kFormats)
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{5000, 1024}, {700, 16384}, {3000, 256}}) {
      const QWeight q = to(f.quantize(test::random_tensor({n, k}, DType::F32, -0.1, 0.1)), kGpu);
      for (int64_t m : {1, 3, 8}) {
        SCOPED_TRACE(str(f.name, " N=", n, " K=", k, " M=", m));
        const Tensor x = test::random_tensor({m, k}, DType::BF16, -1, 1, kGpu);
        Tensor one;
        {
          const PerSm all(0);
          one = qlinear(x, q).to(kCPU);
        }
        const PerSm looping(1);
        EXPECT_TRUE(test::equal(qlinear(x, q).to(kCPU), one));
      }
    }
}

// The many-rows path in several slices of the weight (a bias slice each) against the CPU's dense product.
TEST(CudaQuant, ManyRowsInSlices) {
  KILN_REQUIRE_CUDA();
  using Slice = test::SettingScope<int64_t, cuda::quant_slice_elements, cuda::set_quant_slice_elements>;
  const int64_t n = 100, k = 512, m = 40;
  for (const Format& f : kFormats) {
    const Slice slice(30 * k);  // slices of 30 rows: 30, 30, 30, 10
    SCOPED_TRACE(f.name);
    const QWeight q = f.quantize(test::random_tensor({n, k}, DType::F32, -0.1, 0.1));
    const Tensor x = test::random_tensor({m, k}, DType::F32), b = test::random_tensor({n}, DType::F32);
    const Tensor wd = dequantize(q, DType::F32);
    EXPECT_TRUE(test::linear_close(qlinear(x.to(kGpu), q, b.to(kGpu)), linear(x, wd, b),
                                   test::linear_abs_scale(x, wd, b), DType::F32, k));
  }
}

// Weights marked constant: the product is launched as a dependent of the kernel before it (the activations'
// quantisation), its weight loads issued before the wait; the results are those of unmarked weights, also
// when the activations come from the kernel just before (rms_norm).
TEST(CudaQuant, ConstantWeightsLaunchAsDependents) {
  KILN_REQUIRE_CUDA();
  const bool pdl = cuda::dependent_launch_enabled(0);
  const int64_t n = 1000, k = 4096;
  const Tensor gain = test::random_tensor({k}, DType::BF16, 0.5, 1.5, kGpu);
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    const QWeight host = f.quantize(test::random_tensor({n, k}, DType::F32, -0.1, 0.1));
    const QWeight plain = to(host, kGpu), marked = to(host, kGpu);  // two uploads of the same codes
    std::visit(
        [](const auto& w) {
          if constexpr (requires { w.blocks; }) mark_constant(w.blocks);
          else mark_constant(w.values), mark_constant(w.scales);
        },
        marked);
    for (int64_t m : {1, 12}) {
      const Tensor x = rms_norm(test::random_tensor({m, k}, DType::BF16, -2, 2, kGpu), gain, 1e-6);
      const int64_t before = cuda::dependent_launches();
      const Tensor y = qlinear(x, marked);
      // The quantisation kernel, then one product per 8 rows.
      EXPECT_EQ(cuda::dependent_launches() - before, pdl ? 1 + (m + 7) / 8 : 0) << "M=" << m;
      EXPECT_TRUE(test::equal(y.to(kCPU), qlinear(x.clone(), plain).to(kCPU))) << "M=" << m;
    }
  }
}

TEST(CudaQuant, GraphCaptureAndReplayMatchEager) {
  KILN_REQUIRE_CUDA();
  const int64_t n = 96, k = 1024;
  const Q4KWeight q{quantize_q4_k(test::random_tensor({n, k}, DType::F32, -0.1, 0.1)).blocks.to(kGpu)};
  for (int64_t m : {1, 12, 48}) {
    SCOPED_TRACE(str("M=", m));
    Tensor x = test::random_tensor({m, k}, DType::BF16).to(kGpu);
    const Tensor b = test::random_tensor({n}, DType::BF16).to(kGpu);
    const Tensor eager = linear(x, q, b).to(kCPU);
    Stream s = Stream::create(kGpu);
    Graph g;
    Tensor out;
    synchronize(kGpu);
    g.capture(s, [&] { out = linear(x, q, b); });
    g.replay();
    s.synchronize();
    auto same = [&](const Tensor& a, const Tensor& e) {
      return m <= cuda::kQuantGemvRows ? test::equal(a.to(kCPU), e) : test::all_close(a.to(kCPU), e);
    };
    EXPECT_TRUE(same(out, eager));
    const Tensor x2 = test::random_tensor({m, k}, DType::BF16);
    x.copy_(x2.to(kGpu));
    synchronize(kGpu);
    g.replay();
    s.synchronize();
    EXPECT_TRUE(same(out, linear(x, q, b).to(kCPU)));
  }
}

#else

TEST(CudaQuant, NeedsTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif  // KILN_HAVE_CUDA

}  // namespace
}  // namespace kiln
