// qk_norm_rope_append_ on CUDA: the fused kernel against the CUDA composition it replaces (rms_norm, rms_norm,
// rope_, kv_cache_append_, as src/llm/model.cpp runs them) and against the CPU op (itself bit for bit the CPU
// composition, tests/ops/qk_norm_rope_test.cpp), with caches poisoned before every call, an out-of-range cache
// slot, strided layouts, the cases that fall back to the composition, and graph replay.
//
// Exactness:
//  - Fused vs the CUDA composition: the same formulas (src/ops/norm_math.h), the same device cosf/sinf, both
//    compiled without fma contraction (src/cuda/norm.cu), so bit-identical, except that the f64 sum of a
//    row's f32 squares adds its terms in another order. That sum is exact (order-free) unless a row mixes
//    values more than ~2^11 apart in magnitude, and even then rounds to the same f32 but with probability
//    ~2^-29 per row; so: at most one (token, head) row of a tensor not bit-identical, within tolerance.
//  - Fused vs the CPU: device cosf/sinf vs glibc's (<= 2 ulp) as for rope_ (tests/cuda/norm_test.cpp): f32
//    within rtol = atol = 1e-5; f16/bf16 within 2 ulp (or 1e-5 where a result nearly cancels: seen once as
//    -8.9e-7 vs -8.3e-7 in bf16) on at most 1% of the elements (or 2), plus one row for the rms_norm sum order.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "kiln/nn.h"
#include "kiln/runtime.h"
#include "ops/qk_norm_rope_case.h"
#include "test_util.h"

#if KILN_HAVE_CUDA
#include "cuda/norm.h"
#endif

namespace kiln::test {
namespace {

const Device kGpu = cuda_device(0);

// got vs want (any devices), one shape and dtype, rows of the last dim: NaN only where NaN, bit for bit;
// elements whose bits differ within max_ulp or 1e-5 (f16/bf16) or rtol = atol = 1e-5 (f32, f64). How many may differ:
// f16/bf16 at most max_fraction of the elements (or 2) plus free_rows whole rows; f32/f64 (where a cos/sin
// ulp shows in most results, as for rope_) any number, unless max_fraction is 0: then free_rows rows only.
::testing::AssertionResult close_bits(const Tensor& got_any, const Tensor& want_any, int64_t max_ulp,
                                      double max_fraction, int64_t free_rows) {
  const Tensor got = got_any.cpu(), want = want_any.cpu();
  if (got.sizes() != want.sizes() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure() << "got " << got.meta() << ", want " << want.meta();
  const auto gb = raw_bits(got), wb = raw_bits(want);
  const auto gv = got.to_vector<double>(), wv = want.to_vector<double>();
  const bool wide = got.dtype() == DType::F32 || got.dtype() == DType::F64;
  const int bits = static_cast<int>(itemsize(got.dtype()) * 8);
  const int64_t row_len = got.dim() > 0 && got.size(-1) > 0 ? got.size(-1) : 1;
  int64_t differing = 0, bad = -1;
  std::set<int64_t> rows;
  for (size_t i = 0; i < gb.size(); ++i) {
    if (gb[i] == wb[i]) continue;
    if (std::isnan(gv[i]) || std::isnan(wv[i])) {
      bad = static_cast<int64_t>(i);
      break;
    }
    if (gv[i] == wv[i]) continue;  // +0 / -0
    ++differing;
    rows.insert(static_cast<int64_t>(i) / row_len);
    // Half types: max_ulp, or 1e-5 absolute (torch's atol) for results that nearly cancel, where one f32
    // ulp of cos or sin (~6e-8 of inputs up to ~4) is many ulps of a result near 0.
    const double diff = std::fabs(gv[i] - wv[i]);
    const bool ok =
        wide ? diff <= 1e-5 + 1e-5 * std::fabs(wv[i]) : ulp_distance(gb[i], wb[i], bits) <= max_ulp || diff <= 1e-5;
    if (!ok && bad < 0) bad = static_cast<int64_t>(i);
  }
  if (bad >= 0)
    return ::testing::AssertionFailure() << "element " << bad << " (row " << bad / row_len << "): got " << gv[bad]
                                         << ", want " << wv[bad] << "; " << differing << " of " << gb.size()
                                         << " elements differ";
  const double allowed =
      max_fraction == 0.0 ? static_cast<double>(free_rows * row_len)
      : wide              ? static_cast<double>(gb.size())
             : std::max(2.0, max_fraction * static_cast<double>(gb.size())) + static_cast<double>(free_rows * row_len);
  if (static_cast<double>(differing) > allowed)
    return ::testing::AssertionFailure() << differing << " of " << gb.size() << " elements differ in " << rows.size()
                                         << " rows (allowed " << allowed << ")";
  return ::testing::AssertionSuccess();
}

// Fused vs the CUDA composition: bit-identical but for at most one row (see the top of the file).
::testing::AssertionResult same_as_composition(const Tensor& got, const Tensor& want) {
  return close_bits(got, want, 4, 0.0, 1);
}
// Fused (CUDA) vs the CPU op.
::testing::AssertionResult close_to_cpu(const Tensor& got, const Tensor& want) {
  return close_bits(got, want, 2, 0.01, 1);
}

using namespace qk_rope;
using Inputs = LayerInputs;

Inputs to_device(const Inputs& h) {
  auto dev = [](const Tensor& t) { return t.defined() ? t.to(kGpu) : t; };
  return {dev(h.qkv), dev(h.q_norm), dev(h.k_norm), dev(h.positions), dev(h.inv_freq), dev(h.at)};
}

// Caches of `c` on `device`, every element NaN.
std::pair<Tensor, Tensor> poisoned_caches(const Case& c, Device device) {
  Tensor kc = empty({1, c.hk, c.lmax, c.d}, c.dt, device), vc = empty({1, c.hk, c.lmax, c.d}, c.dt, device);
  poison(kc);
  poison(vc);
  return {kc, vc};
}

struct Result {
  Tensor qkv, q, k_cache, v_cache;  // qkv: the buffer after the call (q's part updated by the fused op only)
};

// The four ops as run_layers calls them (on the inputs' device).
Result composition(const Case& c, const Inputs& in, Device device) {
  Result r;
  r.qkv = in.qkv.clone();
  auto [kc, vc] = poisoned_caches(c, device);
  Views x = split(r.qkv, c);
  Tensor q = x.q, k = x.k;
  if (c.q_normed) q = rms_norm(q, in.q_norm, kEps);
  if (c.k_normed) k = rms_norm(k, in.k_norm, kEps);
  rope_(q, k, in.positions, in.inv_freq, c.scaling);
  kv_cache_append_(kc, vc, k.view({1, c.t_len, c.hk, c.d}).transpose(1, 2),
                   x.v.view({1, c.t_len, c.hk, c.d}).transpose(1, 2), in.at);
  r.q = q;
  r.k_cache = kc;
  r.v_cache = vc;
  return r;
}

Result fused(const Case& c, const Inputs& in, Device device) {
  Result r;
  r.qkv = in.qkv.clone();
  auto [kc, vc] = poisoned_caches(c, device);
  Views x = split(r.qkv, c);
  qk_norm_rope_append_(x.q, x.k, x.v, in.q_norm, in.k_norm, kEps, in.positions, in.inv_freq, c.scaling, kc, vc, in.at);
  r.q = x.q;
  r.k_cache = kc;
  r.v_cache = vc;
  return r;
}

// Runs the fused op on the GPU and checks it against the CUDA composition and the CPU op.
void check_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  const Inputs host = draw(c);
  const Inputs dev = to_device(host);
  const Result want_gpu = composition(c, dev, kGpu);
  const Result want_cpu = fused(c, host, kCPU);
  const Result got = fused(c, dev, kGpu);
  EXPECT_TRUE(got.q.is_cuda());
  EXPECT_TRUE(same_as_composition(got.q, want_gpu.q));
  EXPECT_TRUE(same_as_composition(got.k_cache, want_gpu.k_cache));
  EXPECT_EQ(raw_bits(got.v_cache.cpu()), raw_bits(want_gpu.v_cache.cpu()));
  EXPECT_TRUE(close_to_cpu(got.q, want_cpu.q));
  EXPECT_TRUE(close_to_cpu(got.k_cache, want_cpu.k_cache));
  EXPECT_EQ(raw_bits(got.v_cache.cpu()), raw_bits(want_cpu.v_cache));
  // k and v are only read: the buffer past q's columns is the input, bit for bit.
  const int64_t qs = c.hq * c.d, rest = host.qkv.size(1) - qs;
  EXPECT_EQ(raw_bits(got.qkv.cpu().narrow(1, qs, rest)), raw_bits(host.qkv.narrow(1, qs, rest)));
  // Slots outside [at, at + T) keep their poison.
  const Tensor kc = got.k_cache.cpu(), vc = got.v_cache.cpu();
  for (const Tensor& cache : {kc, vc}) {
    for (double e : cache.narrow(2, 0, c.at).to_vector<double>()) ASSERT_TRUE(std::isnan(e));
    for (double e : cache.narrow(2, c.at + c.t_len, c.lmax - c.at - c.t_len).to_vector<double>())
      ASSERT_TRUE(std::isnan(e));
  }
}

TEST(CudaQkNormRopeAppend, MatchesCompositionAndCpuOnDecodeAndPrefillShapes) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t d : {64, 128})
      for (auto [hq, hk] : {std::pair<int64_t, int64_t>{32, 8}, {16, 2}})
        for (int64_t t_len : {1, 7})
          for (bool normed : {true, false})
            check_case({dt, t_len, hq, hk, d, d, normed, normed, dt, t_len == 1 ? DType::I64 : DType::I32, 1.0, 40,
                        t_len == 1 ? 39 : 11});
}

TEST(CudaQkNormRopeAppend, F32PartialRotaryOddHeadDimsAndMixedWeights) {
  KILN_REQUIRE_CUDA();
  // f32; partial rotary with YaRN-style scaling; the largest head dim; D not a multiple of 32 (and odd).
  check_case({DType::F32, 3, 8, 2, 128, 128, true, true, DType::F32, DType::I64, 1.0, 16, 5});
  check_case({DType::F32, 5, 4, 2, 128, 64, true, true, DType::F32, DType::I32, 1.25, 8, 3});
  check_case({DType::BF16, 2, 4, 2, 256, 256, true, true, DType::BF16, DType::I64, 1.0, 4, 2});
  check_case({DType::F16, 3, 6, 3, 80, 48, true, true, DType::F16, DType::I64, 0.5, 5, 0});
  check_case({DType::BF16, 4, 4, 1, 33, 16, true, true, DType::BF16, DType::I32, 1.0, 4, 0});
  check_case({DType::BF16, 2, 4, 2, 64, 2, true, true, DType::BF16, DType::I32, 1.0, 4, 1});  // one pair
  // One norm only; f32 weights with half inputs (promote_types: the weight product in f32).
  check_case({DType::BF16, 7, 16, 2, 128, 128, true, false, DType::BF16, DType::I64, 1.0, 9, 2});
  check_case({DType::F16, 7, 16, 2, 128, 128, false, true, DType::F16, DType::I64, 1.0, 9, 2});
  check_case({DType::BF16, 7, 16, 2, 128, 128, true, true, DType::F32, DType::I64, 1.0, 9, 2});
  check_case({DType::F16, 1, 32, 8, 64, 64, true, true, DType::F32, DType::I64, 1.0, 3, 0});
  // No k heads: q only, the caches untouched.
  check_case({DType::BF16, 2, 8, 0, 64, 64, true, true, DType::BF16, DType::I64, 1.0, 4, 1});
}

TEST(CudaQkNormRopeAppend, FallbackCasesMatchCpu) {
  KILN_REQUIRE_CUDA();
  // f64, a head dim past the kernel's 256, and f64 weights: the composition on the GPU.
  check_case({DType::F64, 3, 4, 2, 64, 64, true, true, DType::F64, DType::I64, 1.0, 6, 1});
  check_case({DType::BF16, 3, 4, 2, 288, 288, true, true, DType::BF16, DType::I64, 1.0, 6, 1});
  check_case({DType::BF16, 3, 4, 2, 64, 64, true, true, DType::F64, DType::I64, 1.0, 6, 1});
  // Caches of another dtype than q: converted by the append.
  const int64_t t_len = 2, hq = 4, hk = 2, d = 64, lmax = 5;
  const Tensor qkv = random_tensor({t_len, (hq + 2 * hk) * d}, DType::BF16);
  const Tensor w = random_tensor({d}, DType::BF16, 0.5, 1.5), pos = from_vector<int64_t>({31000, 5});
  const Tensor inv = rope_inv_freq(d, 1e6), at = from_vector<int32_t>({1});
  const Case c{DType::BF16, t_len, hq, hk, d, d, true, true, DType::BF16, DType::I64, 1.0, lmax, 1};
  auto run = [&](Device device) {
    Tensor buf = qkv.to(device).clone();  // .to(kCPU) would be qkv itself
    Views x = split(buf, c);
    Tensor kc = zeros({1, hk, lmax, d}, DType::F32, device), vc = zeros({1, hk, lmax, d}, DType::F32, device);
    qk_norm_rope_append_(x.q, x.k, x.v, w.to(device), w.to(device), kEps, pos.to(device), inv.to(device), 1.0, kc, vc,
                         at.to(device));
    return std::vector<Tensor>{x.q.cpu(), kc.cpu(), vc.cpu()};
  };
  const auto want = run(kCPU), got = run(kGpu);
  EXPECT_TRUE(close_to_cpu(got[0], want[0]));
  // The f32 cache holds bf16 values exactly (rope rounded to q's dtype, then the append converted).
  EXPECT_TRUE(close_to_cpu(got[1].to(DType::BF16), want[1].to(DType::BF16)));
  EXPECT_TRUE(equal(got[2], want[2]));
}

TEST(CudaQkNormRopeAppend, StridedQSeparateKVAndPositionMajorCaches) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (int64_t dv : {96, 320}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " Dv " + std::to_string(dv));
      const int64_t t_len = 3, hq = 8, hk = 2, d = 64, lmax = 7;
      // q [T, Hq, D] transposed from [T, D, Hq] (channel stride Hq); k, v separate; Dv != D (past 256: the
      // composition); positions with stride 2; caches stored [1, Lmax, Hk, D] and seen as [1, Hk, Lmax, D].
      const Tensor q0 = random_tensor({t_len, d, hq}, dt), k0 = random_tensor({t_len, hk, d}, dt);
      const Tensor v0 = random_tensor({t_len, hk, dv}, dt);
      const Tensor wq = random_tensor({d}, dt, 0.5, 1.5), wk = random_tensor({d}, dt, 0.5, 1.5);
      const Tensor pos2 = from_vector<int64_t>({30001, -1, 7, -1, 131071, -1}, Shape{t_len, 2});
      const Tensor inv = rope_inv_freq(d, 1e4), at = from_vector<int32_t>({3});
      auto run = [&](Device device, bool use_fused) {
        Tensor q = q0.to(device).clone().transpose(1, 2);
        Tensor kc = empty({1, lmax, hk, d}, dt, device).transpose(1, 2),
               vc = empty({1, lmax, hk, dv}, dt, device).transpose(1, 2);
        poison(kc);
        poison(vc);
        const Tensor k = k0.to(device), v = v0.to(device), pos = pos2.to(device).select(1, 0);
        if (use_fused) {
          qk_norm_rope_append_(q, k, v, wq.to(device), wk.to(device), kEps, pos, inv.to(device), 1.0, kc, vc,
                               at.to(device));
        } else {
          Tensor qn = rms_norm(q, wq.to(device), kEps), kn = rms_norm(k, wk.to(device), kEps);
          rope_(qn, kn, pos, inv.to(device), 1.0);
          kv_cache_append_(kc, vc, kn.unsqueeze(0).transpose(1, 2), v.unsqueeze(0).transpose(1, 2), at.to(device));
          q.copy_(qn);
        }
        EXPECT_EQ(raw_bits(k.cpu()), raw_bits(k0));
        return std::vector<Tensor>{q.cpu(), kc.cpu(), vc.cpu()};
      };
      const auto got = run(kGpu, true), comp = run(kGpu, false), cpu = run(kCPU, true);
      EXPECT_TRUE(same_as_composition(got[0], comp[0]));
      EXPECT_TRUE(same_as_composition(got[1], comp[1]));
      EXPECT_EQ(raw_bits(got[2]), raw_bits(comp[2]));
      EXPECT_TRUE(close_to_cpu(got[0], cpu[0]));
      EXPECT_TRUE(close_to_cpu(got[1], cpu[1]));
      EXPECT_EQ(raw_bits(got[2]), raw_bits(cpu[2]));
    }
}

TEST(CudaQkNormRopeAppend, AtOutOfRangeIsRaisedAtTheNextSyncAndNoCacheIsWritten) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F32}) {
    for (int32_t at : {-1, 6, 1 << 30}) {  // Lmax 8, T 3: valid slots are 0..5
      const Case c{dt, 3, 8, 2, 64, 64, true, true, dt, DType::I64, 1.0, 8, 0};
      SCOPED_TRACE(describe(c) + " bad at " + std::to_string(at));
      Inputs host = draw(c);
      host.at = from_vector<int32_t>({at});
      const Inputs dev = to_device(host);
      Tensor buf = dev.qkv.clone();
      Views x = split(buf, c);
      auto [kc, vc] = poisoned_caches(c, kGpu);
      synchronize(kGpu);
      EXPECT_TRUE(throws_error(
          [&] {
            qk_norm_rope_append_(x.q, x.k, x.v, dev.q_norm, dev.k_norm, kEps, dev.positions, dev.inv_freq, 1.0, kc, vc,
                                 dev.at);
            synchronize(kGpu);
          },
          // The fused kernel's own record (the composition would name kv_cache_append_).
          {"qk_norm_rope_append_", std::to_string(at), "size 6"}));
      // No cache element was written; q was still normalised and rotated (as the composition does).
      for (const Tensor& cache : {kc.cpu(), vc.cpu()})
        for (double e : cache.to_vector<double>()) ASSERT_TRUE(std::isnan(e));
      Inputs ok = dev;
      ok.at = from_vector<int32_t>({0}).to(kGpu);
      EXPECT_TRUE(same_as_composition(x.q, composition(c, ok, kGpu).q));
      // The error was reported once and cleared: the next call runs normally.
      Tensor buf2 = dev.qkv.clone();
      Views x2 = split(buf2, c);
      qk_norm_rope_append_(x2.q, x2.k, x2.v, dev.q_norm, dev.k_norm, kEps, dev.positions, dev.inv_freq, 1.0, kc, vc,
                           ok.at);
      synchronize(kGpu);
      EXPECT_TRUE(same_as_composition(kc, composition(c, ok, kGpu).k_cache));
    }
  }
}

#if KILN_HAVE_CUDA
// The launcher itself (the op could fall back to the composition unnoticed): the engine's decode layout.
TEST(CudaQkNormRopeAppend, LauncherMatchesComposition) {
  KILN_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    for (int64_t t_len : {1, 7}) {
      for (bool normed : {true, false}) {
        const Case c{dt, t_len, 32, 8, 128, 128, normed, normed, dt, DType::I64, 1.0, 20, 13 - t_len};
        SCOPED_TRACE(describe(c));
        const Inputs dev = to_device(draw(c));
        const Result want = composition(c, dev, kGpu);
        Tensor buf = dev.qkv.clone();
        Views x = split(buf, c);
        auto [kc, vc] = poisoned_caches(c, kGpu);
        cuda::qk_norm_rope_append(x.q, x.k, x.v, dev.q_norm, dev.k_norm, kEps, dev.positions, dev.inv_freq, 1.0, kc, vc,
                                  dev.at);
        EXPECT_TRUE(same_as_composition(x.q, want.q));
        EXPECT_TRUE(same_as_composition(kc, want.k_cache));
        EXPECT_EQ(raw_bits(vc.cpu()), raw_bits(want.v_cache.cpu()));
      }
    }
  }
}
#endif

TEST(CudaQkNormRopeAppend, GraphReplayReadsAtAndPositionsFromTheDevice) {
  KILN_REQUIRE_CUDA();
  const Case c{DType::BF16, 1, 16, 4, 128, 128, true, true, DType::BF16, DType::I64, 1.0, 64, 0};
  const Inputs host = draw(c);
  const Inputs dev = to_device(host);
  Tensor qkv = dev.qkv.clone(), pos = dev.positions.clone(), at = dev.at.clone();
  auto [kc, vc] = poisoned_caches(c, kGpu);
  Views x = split(qkv, c);
  auto step = [&] {
    qk_norm_rope_append_(x.q, x.k, x.v, dev.q_norm, dev.k_norm, kEps, pos, dev.inv_freq, 1.0, kc, vc, at);
  };
  step();  // eager once (also any one-time set-up outside the capture)
  synchronize(kGpu);
  Stream s = Stream::create(kGpu);
  Graph g;
  g.capture(s, step);
  synchronize(kGpu);
  Tensor kc_cpu = kc.cpu(), vc_cpu = vc.cpu();  // the CPU mirror of the caches
  for (int step_i = 0; step_i < 4; ++step_i) {
    SCOPED_TRACE(step_i);
    Inputs h = draw(c);  // fresh q/k/v and position; the norms stay those captured
    h.q_norm = host.q_norm;
    h.k_norm = host.k_norm;
    const int32_t slot = 5 + 13 * step_i;
    h.at = from_vector<int32_t>({slot});
    {
      StreamGuard guard(s);
      qkv.copy_(h.qkv.to(kGpu));
      pos.copy_(h.positions.to(kGpu));
      at.copy_(h.at.to(kGpu));
    }
    g.replay();
    s.synchronize();
    Tensor qkv_h = h.qkv.clone();
    Views xh = split(qkv_h, c);
    qk_norm_rope_append_(xh.q, xh.k, xh.v, h.q_norm, h.k_norm, kEps, h.positions, h.inv_freq, 1.0, kc_cpu, vc_cpu,
                         h.at);
    EXPECT_TRUE(close_to_cpu(x.q, xh.q));
    EXPECT_TRUE(close_to_cpu(kc, kc_cpu));
    EXPECT_EQ(raw_bits(vc.cpu()), raw_bits(vc_cpu));
  }
}

TEST(CudaQkNormRopeAppend, ZeroTokensAndDeviceErrors) {
  KILN_REQUIRE_CUDA();
  Tensor q = empty({0, 4, 64}, DType::BF16, kGpu);
  const Tensor k = empty({0, 2, 64}, DType::BF16, kGpu), v = empty({0, 2, 64}, DType::BF16, kGpu);
  Tensor kc = zeros({1, 2, 4, 64}, DType::BF16, kGpu), vc = zeros({1, 2, 4, 64}, DType::BF16, kGpu);
  const Tensor w = ones({64}, DType::BF16, kGpu), inv = rope_inv_freq(64, 1e4, kGpu);
  qk_norm_rope_append_(q, k, v, w, w, kEps, empty({0}, DType::I64, kGpu), inv, 1.0, kc, vc,
                       from_vector<int32_t>({9}).to(kGpu));
  synchronize(kGpu);  // T = 0 checks no slot, as kv_cache_append_
  EXPECT_TRUE(equal(kc.cpu(), zeros({1, 2, 4, 64}, DType::BF16)));
  Tensor q1 = ones({1, 4, 64}, DType::BF16, kGpu);
  const Tensor k1 = ones({1, 2, 64}, DType::BF16, kGpu), v1 = ones({1, 2, 64}, DType::BF16, kGpu);
  const Tensor pos = from_vector<int64_t>({3}).to(kGpu), at = from_vector<int32_t>({0}).to(kGpu);
  EXPECT_TRUE(throws_error(
      [&] { qk_norm_rope_append_(q1, k1, v1, w, w, kEps, pos, inv, 1.0, kc, vc, from_vector<int32_t>({0})); },
      {"qk_norm_rope_append_", "one device"}));
  EXPECT_TRUE(throws_error(
      [&] { qk_norm_rope_append_(q1, k1, v1, ones({64}, DType::BF16), w, kEps, pos, inv, 1.0, kc, vc, at); },
      {"qk_norm_rope_append_", "q_norm", "q's device"}));
  EXPECT_TRUE(equal(q1.cpu(), ones({1, 4, 64}, DType::BF16)));
}

}  // namespace
}  // namespace kiln::test
