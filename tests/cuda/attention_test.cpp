// CUDA attention against the CPU reference (itself tested against a double-precision transcription of
// PyTorch's math path in tests/ops/attention_test.cpp): the flash prefill tiles (D 64/128, f16/bf16), the
// general kernel (f32, odd head dims, masks, unaligned rows), the split-KV decode kernel and its combine,
// the KV-cache append, the paged-cache ops, device-side errors, and graph capture while the device lengths grow.
//
// Tolerances: the tensor-core paths round P (the softmax weights) to 16 bits before P @ V, as every flash
// kernel does, so each output carries about one 16-bit rounding per term on top of the output rounding:
// bf16 atol 1e-2 (outputs are O(1) averages), f16 atol 2e-3. f32 runs in f32 (expf, f32 dot products)
// against the CPU's f64: rtol 1e-4, atol 5e-5.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/nn.h"
#include "kiln/runtime.h"
#include "test_util.h"
#if KILN_HAVE_CUDA
#include "cuda/attention.h"
#include "cuda/launch.h"
#endif

namespace kiln {
namespace {

using test::all_close;
using test::random_tensor;

const Device kGpu = cuda_device(0);

test::Tolerance tol(DType dt) {
  switch (dt) {
    case DType::BF16: return {1.6e-2, 1e-2};
    case DType::F16: return {2e-3, 2e-3};
    default: return {1e-4, 5e-5};
  }
}

// Frees a NaN-filled block of the output's size so the caching allocator hands it to the op next: an
// output element the kernel forgets to write stays NaN.
void poison_next(const Shape& shape, DType dt) {
  Tensor junk = full(shape, NAN, dt, kGpu);
  (void)junk;
}

Tensor sdpa_gpu(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask, bool causal,
                bool gqa, const Shape& out_shape) {
  poison_next(out_shape, q.dtype());
  return scaled_dot_product_attention(q.to(kGpu), k.to(kGpu), v.to(kGpu),
                                      mask ? std::optional<Tensor>(mask->to(kGpu)) : std::nullopt, causal,
                                      std::nullopt, gqa)
      .cpu();
}

// Each prefill kernel of the tensor-core path for a scope: the wgmma kernel (where this build and device have
// it) with its default grid and with grids of 3 and 5 persistent blocks (so that every block takes several
// items in turn, from the device counter or in the fixed two-round order, its K/V ring and q buffers running
// on across them), and the mma.sync kernel.
struct PrefillConfig {
  bool mma;        // force the mma.sync kernel
  int max_blocks;  // the wgmma kernel's grid limit (0: one block per multiprocessor)
};
std::string config_name(const PrefillConfig& c) {
  return c.mma ? std::string("mma.sync") : str("auto (wgmma, max blocks ", c.max_blocks, ")");
}
#if KILN_HAVE_CUDA
struct PrefillScope {
  explicit PrefillScope(const PrefillConfig& c) : kernel(cuda::prefill_kernel()), blocks(cuda::prefill_max_blocks()) {
    cuda::set_prefill_kernel(c.mma ? cuda::PrefillKernel::Mma : cuda::PrefillKernel::Auto);
    cuda::set_prefill_max_blocks(c.max_blocks);
  }
  ~PrefillScope() {
    cuda::set_prefill_kernel(kernel);
    cuda::set_prefill_max_blocks(blocks);
  }
  cuda::PrefillKernel kernel;
  int blocks;
};
std::vector<PrefillConfig> prefill_configs() {
  std::vector<PrefillConfig> cs{{true, 0}};
  if (cuda::wgmma_available(0)) {  // wgmma with TMA copies (where the operands fit tensor maps)
    cs.push_back({false, 0});
    cs.push_back({false, 3});  // more than two rounds: items from the device counter
    cs.push_back({false, 5});  // 6-10 items (one or two 128-row tiles of 8 heads): two rounds in a fixed order
  } else {
    std::printf("[   NOTE   ] the wgmma prefill kernel is not available here (it needs an sm_90a build on a "
                "device of compute capability 9.0)\n");
  }
  return cs;
}
#else
struct PrefillScope {
  explicit PrefillScope(const PrefillConfig&) {}
};
std::vector<PrefillConfig> prefill_configs() { return {{true, 0}}; }
#endif

TEST(CudaAttention, FlashPrefillMatchesCpu) {
  KILN_REQUIRE_CUDA();
  const std::pair<int64_t, int64_t> lens[] = {{1, 1},     {17, 17},  {64, 64},  {100, 100}, {257, 257}, {33, 300},
                                              {300, 33},  {128, 200}, {5, 0},   {128, 128}, {129, 129}, {700, 700},
                                              {200, 1000}};
  for (const PrefillConfig& kern : prefill_configs()) {
    PrefillScope scope(kern);
    for (int64_t d : {64, 128}) {
      for (DType dt : {DType::BF16, DType::F16}) {
        for (auto [lq, lkv] : lens) {
          for (bool causal : {false, true}) {
            for (int64_t ratio : {1, 4}) {
              SCOPED_TRACE(str(config_name(kern), " D ", d, " ", dtype_name(dt), " Lq ", lq, " Lkv ", lkv, " causal ",
                               causal, " gqa ", ratio));
              const int64_t b = 2, hq = 4, hkv = hq / ratio;
              const Tensor q = random_tensor({b, hq, lq, d}, dt), k = random_tensor({b, hkv, lkv, d}, dt);
              const Tensor v = random_tensor({b, hkv, lkv, d}, dt);
              const Tensor cpu = scaled_dot_product_attention(q, k, v, std::nullopt, causal, std::nullopt, true);
              const Tensor got = sdpa_gpu(q, k, v, std::nullopt, causal, true, cpu.sizes());
              EXPECT_TRUE(all_close(got, cpu, tol(dt)));
            }
          }
        }
      }
    }
  }
}

TEST(CudaAttention, FlashPrefillStridedAndBroadcastInputs) {
  KILN_REQUIRE_CUDA();
  for (const PrefillConfig& kern : prefill_configs()) {
    PrefillScope scope(kern);
    for (DType dt : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(str(config_name(kern), " ", dtype_name(dt)));
      // [B, L, H, D] buffers viewed as [B, H, L, D]: rows H * D apart (still 16-byte aligned: the tile path).
      const Tensor q = random_tensor({2, 70, 8, 128}, dt).transpose(1, 2);
      const Tensor k = random_tensor({2, 90, 2, 128}, dt).transpose(1, 2);
      const Tensor v = random_tensor({2, 90, 2, 128}, dt).transpose(1, 2);
      for (bool causal : {false, true}) {
        const Tensor cpu = scaled_dot_product_attention(q, k, v, std::nullopt, causal, std::nullopt, true);
        EXPECT_TRUE(all_close(sdpa_gpu(q, k, v, std::nullopt, causal, true, cpu.sizes()), cpu, tol(dt)));
      }
      // Batch dims broadcast: q [1, 1, 64] against k [2, 1, 1, 64]; q [3, 1, 9, 64] against k [1, 4, 20, 64].
      const Tensor q1 = random_tensor({1, 1, 64}, dt), k1 = random_tensor({2, 1, 1, 64}, dt), v1 = random_tensor({2, 1, 1, 64}, dt);
      const Tensor c1 = scaled_dot_product_attention(q1, k1, v1);
      EXPECT_TRUE(all_close(sdpa_gpu(q1, k1, v1, std::nullopt, false, false, c1.sizes()), c1, tol(dt)));
      const Tensor q2 = random_tensor({3, 1, 9, 64}, dt), k2 = random_tensor({1, 4, 20, 64}, dt), v2 = random_tensor({1, 4, 20, 64}, dt);
      const Tensor c2 = scaled_dot_product_attention(q2, k2, v2, std::nullopt, true);
      EXPECT_TRUE(all_close(sdpa_gpu(q2, k2, v2, std::nullopt, true, false, c2.sizes()), c2, tol(dt)));
      // More batch dims (outer [2, 3] with k broadcast over the 3) with grouped heads, on the tile path.
      const Tensor q5 = random_tensor({2, 3, 4, 40, 64}, dt), k5 = random_tensor({2, 1, 2, 50, 64}, dt);
      const Tensor v5 = random_tensor({2, 1, 2, 50, 64}, dt);
      for (bool causal : {false, true}) {
        const Tensor c5 = scaled_dot_product_attention(q5, k5, v5, std::nullopt, causal, std::nullopt, true);
        EXPECT_TRUE(all_close(sdpa_gpu(q5, k5, v5, std::nullopt, causal, true, c5.sizes()), c5, tol(dt)));
      }
      // Large logits (|q.k| * scale up to ~1e3): the online softmax must not overflow.
      const Tensor q4 = random_tensor({1, 2, 70, 64}, dt, -20, 20), k4 = random_tensor({1, 2, 90, 64}, dt, -20, 20);
      const Tensor v4 = random_tensor({1, 2, 90, 64}, dt);
      const Tensor c4 = scaled_dot_product_attention(q4, k4, v4, std::nullopt, true);
      EXPECT_TRUE(all_close(sdpa_gpu(q4, k4, v4, std::nullopt, true, false, c4.sizes()), c4, tol(dt)));
      // Unaligned rows (a slice starting at element 1 of rows of 129): the general kernel.
      const Tensor k3 = random_tensor({1, 2, 40, 129}, dt).narrow(-1, 1, 128), v3 = random_tensor({1, 2, 40, 128}, dt);
      const Tensor q3 = random_tensor({1, 2, 30, 128}, dt);
      const Tensor c3 = scaled_dot_product_attention(q3, k3, v3, std::nullopt, true);
      EXPECT_TRUE(all_close(sdpa_gpu(q3, k3, v3, std::nullopt, true, false, c3.sizes()), c3, tol(dt)));
    }
  }
}

// A captured prefill replayed on new inputs: the persistent kernel's item counter is reset inside the graph,
// so every replay covers every query tile (a stale counter would leave NaN-poisoned rows or old outputs).
TEST(CudaAttention, FlashPrefillGraphReplay) {
  KILN_REQUIRE_CUDA();
  for (const PrefillConfig& kern : prefill_configs()) {
    PrefillScope scope(kern);
    SCOPED_TRACE(config_name(kern));
    const DType dt = DType::BF16;
    const int64_t b = 2, hq = 8, hkv = 2, l = 300, d = 128;
    Tensor q = zeros({b, hq, l, d}, dt, kGpu), k = zeros({b, hkv, l, d}, dt, kGpu), v = zeros({b, hkv, l, d}, dt, kGpu);
    (void)scaled_dot_product_attention(q, k, v, std::nullopt, true, std::nullopt, true);  // one-time set-up
    synchronize(kGpu);
    Stream st = Stream::create(kGpu);
    Graph g;
    Tensor out;
    g.capture(st, [&] { out = scaled_dot_product_attention(q, k, v, std::nullopt, true, std::nullopt, true); });
    for (int rep = 0; rep < 3; ++rep) {
      const Tensor qh = random_tensor({b, hq, l, d}, dt), kh = random_tensor({b, hkv, l, d}, dt);
      const Tensor vh = random_tensor({b, hkv, l, d}, dt);
      {
        StreamGuard guard(st);
        q.copy_(qh);
        k.copy_(kh);
        v.copy_(vh);
        out.copy_(full(out.sizes(), NAN, dt, kGpu));
      }
      g.replay();
      st.synchronize();
      const Tensor cpu = scaled_dot_product_attention(qh, kh, vh, std::nullopt, true, std::nullopt, true);
      EXPECT_TRUE(all_close(out.cpu(), cpu, tol(dt))) << "replay " << rep;
    }
  }
}

TEST(CudaAttention, GeneralPathMatchesCpu) {
  KILN_REQUIRE_CUDA();
  struct Case {
    Shape q, k, v;
    DType dt;
    bool gqa;
  };
  const Case cases[] = {
      {{2, 4, 33, 64}, {2, 4, 47, 64}, {2, 4, 47, 64}, DType::F32, false},       // f32
      {{2, 4, 33, 80}, {2, 2, 47, 80}, {2, 2, 47, 80}, DType::BF16, true},       // D not 64/128, GQA
      {{2, 4, 33, 64}, {2, 4, 47, 64}, {2, 4, 47, 32}, DType::F16, false},       // Dv != D
      {{3, 17, 24}, {2, 1, 19, 24}, {19, 40}, DType::F32, false},                // broadcast, odd sizes
      {{1, 1, 1, 7}, {1, 1, 1, 7}, {1, 1, 1, 3}, DType::F32, false},             // size-1 rows
      {{2, 8, 5, 256}, {2, 1, 300, 256}, {2, 1, 300, 256}, DType::BF16, true},   // D = 256, MQA
  };
  for (const auto& c : cases) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(str("q ", c.q, " k ", c.k, " v ", c.v, " ", dtype_name(c.dt), " causal ", causal));
      const Tensor q = random_tensor(c.q, c.dt), k = random_tensor(c.k, c.dt), v = random_tensor(c.v, c.dt);
      const bool gqa = c.gqa;
      const Tensor cpu = scaled_dot_product_attention(q, k, v, std::nullopt, causal, std::nullopt, gqa);
      EXPECT_TRUE(all_close(sdpa_gpu(q, k, v, std::nullopt, causal, gqa, cpu.sizes()), cpu, tol(c.dt)));
    }
  }
}

// f16/bf16 with D 64/128 take the tiles with the mask fused; f32 takes the general kernel.
TEST(CudaAttention, MasksAndFullyMaskedRows) {
  KILN_REQUIRE_CUDA();
  const int64_t sizes[][3] = {{19, 37, 64}, {100, 150, 128}};
  for (const auto& sz : sizes)
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const int64_t b = 2, h = 4, lq = sz[0], lkv = sz[1], d = sz[2];
    const Tensor q = random_tensor({b, h, lq, d}, dt), k = random_tensor({b, h, lkv, d}, dt);
    const Tensor v = random_tensor({b, h, lkv, d}, dt, 1, 2);
    for (const Shape& ms : {Shape{lq, lkv}, Shape{b, 1, lq, lkv}, Shape{1, h, 1, lkv}, Shape{lkv}}) {
      SCOPED_TRACE(str(dtype_name(dt), " mask ", ms));
      Tensor bmask = gt(random_tensor(ms, DType::F32, 0, 1), 0.4);
      if (ms.size() >= 2) bmask.select(-2, 0).fill_(false);  // fully masked rows
      const Tensor cpu_b = scaled_dot_product_attention(q, k, v, bmask);
      EXPECT_TRUE(all_close(sdpa_gpu(q, k, v, bmask, false, false, cpu_b.sizes()), cpu_b, tol(dt)));
      const Tensor fmask = where(bmask, random_tensor(ms, DType::F32, -2, 2), full({}, -INFINITY, DType::F32));
      const Tensor cpu_f = scaled_dot_product_attention(q, k, v, fmask);
      EXPECT_TRUE(all_close(sdpa_gpu(q, k, v, fmask, false, false, cpu_f.sizes()), cpu_f, tol(dt)));
    }
  }
}

// ---- decode ----

struct DecodeCase {
  int64_t b, hq, hkv, d, lmax;
  std::vector<int32_t> lens;
};

// unaligned: caches that are slices starting at element 1 of wider rows (the general kernel).
// q_unaligned: q rows that start at odd elements (the tiles read q element by element).
void check_decode(const DecodeCase& c, DType dt, int64_t lq, bool unaligned = false, bool q_unaligned = false) {
  SCOPED_TRACE(str(dtype_name(dt), " B ", c.b, " Hq ", c.hq, " Hkv ", c.hkv, " D ", c.d, " Lmax ", c.lmax, " Lq ", lq,
                   unaligned ? " unaligned" : "", q_unaligned ? " q unaligned" : ""));
  // [B, Hq, Lq, D] view of [B, Lq, Hq, D] (or of [B, Lq, Hq, D + 1] from element 1)
  const Tensor q = q_unaligned ? random_tensor({c.b, lq, c.hq, c.d + 1}, dt).narrow(-1, 1, c.d).transpose(1, 2)
                               : random_tensor({c.b, lq, c.hq, c.d}, dt).transpose(1, 2);
  const int64_t w = unaligned ? c.d + 1 : c.d;
  const Tensor kc = random_tensor({c.b, c.hkv, c.lmax, w}, dt).narrow(-1, w - c.d, c.d);
  const Tensor vc = random_tensor({c.b, c.hkv, c.lmax, w}, dt).narrow(-1, w - c.d, c.d);
  const Tensor lens = from_vector<int32_t>(c.lens);
  const Tensor cpu = decode_attention(q, kc, vc, lens);
  poison_next(cpu.sizes(), dt);
  const Tensor got = decode_attention(q.to(kGpu), kc.to(kGpu), vc.to(kGpu), lens.to(kGpu)).cpu();
  EXPECT_TRUE(all_close(got, cpu, tol(dt)));
}

// Every split/combine configuration of the decode kernel (cuda::DecodeTuning) for a scope.
#if KILN_HAVE_CUDA
using Tuning = cuda::DecodeTuning;
struct TuningScope {
  explicit TuningScope(const Tuning& t) : before(cuda::decode_tuning()) { cuda::set_decode_tuning(t); }
  ~TuningScope() { cuda::set_decode_tuning(before); }
  Tuning before;
};
using cuda::DecodeKernel;
#else
enum class DecodeKernel { CpAsync, Tma, Regs };
struct Tuning {
  int min_split_keys, blocks_per_sm;
  DecodeKernel kernel;
  int max_blocks, l2_prefetch, row_combine_splits = 16, early = 2, early_chunks = 1, early_guess_skew = 0;
};
struct TuningScope {
  explicit TuningScope(const Tuning&) {}
};
#endif
// The register kernel (the default; KV groups of at most 8 rows, others take the cp.async kernel) with the
// default, with longer splits, and with every split count combined by one kind of combine kernel (one warp
// per row, one block per row); the cp.async kernel with the 128-byte L2 prefetch, with longer splits, with
// fewer blocks (so fewer splits) and no prefetch hint, and with more blocks than fit at once; the TMA kernel
// (Hopper) by default and on a persistent grid of three blocks (each block takes many items, its ring running
// on from one into the next). The register kernel's work before its wait: by default the L2 prefetch of one
// chunk and the speculative first chunk (early = 2); also nothing (0), the prefetch of two chunks alone (1),
// and both with two chunks.
const Tuning kTunings[] = {{64, 2, DecodeKernel::Regs, 0, 128},    {256, 1, DecodeKernel::Regs, 0, 128},
                           {64, 2, DecodeKernel::Regs, 0, 128, 128}, {64, 2, DecodeKernel::Regs, 0, 128, 0},
                           {64, 2, DecodeKernel::Regs, 0, 128, 16, 0}, {64, 2, DecodeKernel::Regs, 0, 128, 16, 1, 2},
                           {64, 2, DecodeKernel::Regs, 0, 128, 16, 2, 2},
                           {64, 2, DecodeKernel::CpAsync, 0, 128}, {256, 1, DecodeKernel::CpAsync, 0, 128},
                           {64, 1, DecodeKernel::CpAsync, 0, 0},   {64, 6, DecodeKernel::CpAsync, 0, 128},
                           {64, 2, DecodeKernel::Tma, 0, 128},     {256, 1, DecodeKernel::Tma, 3, 128}};
std::string tuning_name(const Tuning& t) {
  const char* kernel = t.kernel == DecodeKernel::Tma    ? "TMA kernel"
                       : t.kernel == DecodeKernel::Regs ? "register kernel"
                                                        : "cp.async kernel";
  return str(kernel, ", keys ", t.min_split_keys, ", ", t.blocks_per_sm, " blocks/SM, ", t.max_blocks,
             " blocks, L2 prefetch ", t.l2_prefetch, ", row combine up to ", t.row_combine_splits, " splits, early ",
             t.early, " (", t.early_chunks, " chunks)", t.early_guess_skew ? str(" (guess off by ", t.early_guess_skew, " keys)") : std::string());
}

TEST(CudaDecodeAttention, MatchesCpuForLengthsAndGroups) {
  KILN_REQUIRE_CUDA();
  for (const Tuning& tune : kTunings)
  for (DType dt : {DType::BF16, DType::F16}) {
    TuningScope scope(tune);
    SCOPED_TRACE(tuning_name(tune));
#if KILN_HAVE_CUDA
    const int64_t tma_before = cuda::decode_tma_launches(), regs_before = cuda::decode_regs_launches();
#endif
    for (int64_t lq = 1; lq <= 8; ++lq) {
      check_decode({3, 32, 4, 128, 600, {1, 100, 513}}, dt, lq);
      check_decode({2, 8, 8, 64, 130, {130, 17}}, dt, lq);
    }
    check_decode({2, 32, 8, 128, 4097, {4097, 2000}}, dt, 1);
    check_decode({2, 8, 4, 128, 700, {700, 65}}, dt, 2);  // D = 128, Lq = 2 in groups of 4 rows
    check_decode({1, 64, 8, 128, 4097, {4096}}, dt, 2);
    check_decode({2, 8, 2, 128, 32768, {32768, 30001}}, dt, 1);
    check_decode({1, 4, 1, 128, 16384, {16384}}, dt, 1);  // one KV head: the most splits (128)
    check_decode({1, 4, 1, 64, 16384, {9001}}, dt, 2);
    check_decode({4, 4, 4, 64, 64, {0, 1, 63, 64}}, dt, 1);  // a length of 0 gives 0
    check_decode({2, 32, 8, 128, 700, {700, 65}}, dt, 1, false, true);
    check_decode({1, 16, 2, 64, 100, {37}}, dt, 3, false, true);
    check_decode({1, 3, 1, 128, 900, {899}}, dt, 1);  // 3 output rows: a partly used combine block
    // Enough (sequence, KV head) pairs that each takes one block: no split, no combine.
    std::vector<int32_t> many(40);
    for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<int32_t>(1 + (i * 37) % 200);
    check_decode({40, 16, 8, 64, 200, many}, dt, 1);
#if KILN_HAVE_CUDA
    // On Hopper the TMA tunings must run the TMA kernel, not fall back to the cp.async one unnoticed.
    if (tune.kernel == DecodeKernel::Tma && cuda::wgmma_available(kGpu.index))
      EXPECT_GT(cuda::decode_tma_launches(), tma_before) << "the TMA kernel never ran";
    if (tune.kernel == DecodeKernel::Regs)
      EXPECT_GT(cuda::decode_regs_launches(), regs_before) << "the register kernel never ran";
#endif
  }
  // f32 caches and unaligned caches take the general kernel.
  check_decode({2, 8, 2, 64, 300, {300, 7}}, DType::F32, 3);
  check_decode({2, 8, 2, 128, 300, {300, 7}}, DType::BF16, 2, true);
}

// Decode over caches [3, 2, 3000, 128] (16 query heads) whose rows past each sequence's length hold NaN in K
// and v_past in V (a cache never written there), for each Lq in lqs: the GPU against the CPU.
void check_decode_past_lengths(DType dt, const std::vector<int32_t>& lens, float v_past,
                               std::initializer_list<int64_t> lqs) {
  const int64_t b = static_cast<int64_t>(lens.size()), hq = 16, hkv = 2, d = 128, lmax = 3000;
  Tensor kc = random_tensor({b, hkv, lmax, d}, dt), vc = random_tensor({b, hkv, lmax, d}, dt);
  for (int64_t i = 0; i < b; ++i) {
    kc.select(0, i).narrow(1, lens[i], lmax - lens[i]).fill_(NAN);
    vc.select(0, i).narrow(1, lens[i], lmax - lens[i]).fill_(v_past);
  }
  for (int64_t lq : lqs) {
    const Tensor q = random_tensor({b, hq, lq, d}, dt);
    const Tensor cpu = decode_attention(q, kc, vc, from_vector<int32_t>(lens));
    poison_next(cpu.sizes(), dt);
    const Tensor got = decode_attention(q.to(kGpu), kc.to(kGpu), vc.to(kGpu), from_vector<int32_t>(lens).to(kGpu)).cpu();
    EXPECT_TRUE(all_close(got, cpu, tol(dt))) << "Lq " << lq;
  }
}

// The register kernel's speculative first chunk (early = 2) when the length read before the wait is not the
// length after it (as when the kernel that sets it runs late): guesses short and long by a key, by a chunk,
// by a whole split and past the cache; the chunk must be loaded again wherever its keys differ. The caches
// past each length hold NaN, so a chunk kept with keys the real length excludes would show.
TEST(CudaDecodeAttention, SpeculativeFirstChunkWithAWrongGuess) {
  KILN_REQUIRE_CUDA();
  for (int skew : {1, -1, 16, -16, 700, -700, 100000, -100000})
  for (DType dt : {DType::BF16, DType::F16}) {
    TuningScope scope(Tuning{64, 2, DecodeKernel::Regs, 0, 128, 16, 2, skew % 2 == 0 ? 1 : 2, skew});
    SCOPED_TRACE(str(dtype_name(dt), ", guess off by ", skew));
    check_decode_past_lengths(dt, {2999, 1300, 17}, NAN, {1, 2});
  }
}

// Cache rows past each sequence's length hold NaN and inf (a cache that was never written there): no kernel
// may let them reach the output, whatever the split and tile boundaries.
TEST(CudaDecodeAttention, CachePastTheLengthIsNeverRead) {
  KILN_REQUIRE_CUDA();
  for (const Tuning& tune : kTunings)
  for (DType dt : {DType::BF16, DType::F16}) {
    TuningScope scope(tune);
    SCOPED_TRACE(str(dtype_name(dt), ", ", tuning_name(tune)));
    check_decode_past_lengths(dt, {2999, 130, 1}, INFINITY, {1, 3});
  }
}

TEST(CudaDecodeAttention, DecodeKernelEqualsPrefillOnTheSameData) {
  KILN_REQUIRE_CUDA();
  for (const Tuning& tune : kTunings)
  for (DType dt : {DType::BF16, DType::F16}) {
    TuningScope scope(tune);
    SCOPED_TRACE(str(dtype_name(dt), ", ", tuning_name(tune)));
    const int64_t b = 1, hq = 32, hkv = 8, d = 128, lmax = 1000, n = 777;
    const Tensor kc = random_tensor({b, hkv, lmax, d}, dt, -2, 2, kGpu), vc = random_tensor({b, hkv, lmax, d}, dt, -2, 2, kGpu);
    const Tensor lens = from_vector<int32_t>({static_cast<int32_t>(n)}).to(kGpu);
    const Tensor kv = kc.narrow(2, 0, n), vv = vc.narrow(2, 0, n);
    // Lq = 1: the last position sees every valid key (non-causal prefill over the first n keys).
    const Tensor q1 = random_tensor({b, hq, 1, d}, dt, -2, 2, kGpu);
    EXPECT_TRUE(all_close(decode_attention(q1, kc, vc, lens).cpu(),
                          scaled_dot_product_attention(q1, kv, vv, std::nullopt, false, std::nullopt, true).cpu(), tol(dt)));
    // Lq = n = Lkv: bottom-right and top-left causal coincide.
    const Tensor qn = random_tensor({b, hq, n, d}, dt, -2, 2, kGpu);
    EXPECT_TRUE(all_close(decode_attention(qn, kc, vc, lens).cpu(),
                          scaled_dot_product_attention(qn, kv, vv, std::nullopt, true, std::nullopt, true).cpu(), tol(dt)));
  }
}

TEST(CudaDecodeAttention, AppendThenDecodeMatchesCpu) {
  KILN_REQUIRE_CUDA();
  const int64_t b = 3, hkv = 4, hq = 16, lmax = 300, d = 128, t = 2;
  for (DType dt : {DType::BF16, DType::F16}) {
    Tensor kc = random_tensor({b, hkv, lmax, d}, dt), vc = random_tensor({b, hkv, lmax, d}, dt);
    Tensor kg = kc.to(kGpu), vg = vc.to(kGpu);
    const Tensor kn = random_tensor({b, t, hkv, d}, DType::F32).transpose(1, 2);  // strided, converted
    const Tensor vn = random_tensor({b, hkv, t, d}, dt);
    const std::vector<int32_t> pos = {0, 150, 298};
    kv_cache_append_(kc, vc, kn, vn, from_vector<int32_t>(pos));
    kv_cache_append_(kg, vg, kn.to(kGpu), vn.to(kGpu), from_vector<int32_t>(pos).to(kGpu));
    EXPECT_TRUE(test::equal(kg.cpu(), kc));
    EXPECT_TRUE(test::equal(vg.cpu(), vc));
    const std::vector<int32_t> lens = {2, 152, 300};
    const Tensor q = random_tensor({b, hq, t, d}, dt);
    EXPECT_TRUE(all_close(decode_attention(q.to(kGpu), kg, vg, from_vector<int32_t>(lens).to(kGpu)).cpu(),
                          decode_attention(q, kc, vc, from_vector<int32_t>(lens)), tol(dt)));
  }
}

TEST(CudaDecodeAttention, AppendWithDifferentCacheDtypesAndHeadDims) {
  KILN_REQUIRE_CUDA();
  // k cache f32 [.., 96], v cache bf16 [.., 40]: two launches (element widths differ); same widths: one.
  for (DType vdt : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(vdt));
    Tensor kc = random_tensor({2, 3, 50, 96}, DType::F32), vc = random_tensor({2, 3, 50, 40}, vdt);
    Tensor kg = kc.to(kGpu), vg = vc.to(kGpu);
    const Tensor kn = random_tensor({2, 3, 5, 96}, DType::BF16), vn = random_tensor({2, 3, 5, 40}, DType::F16);
    const std::vector<int32_t> pos = {45, 7};
    kv_cache_append_(kc, vc, kn, vn, from_vector<int32_t>(pos));
    kv_cache_append_(kg, vg, kn.to(kGpu), vn.to(kGpu), from_vector<int32_t>(pos).to(kGpu));
    EXPECT_TRUE(test::equal(kg.cpu(), kc));
    EXPECT_TRUE(test::equal(vg.cpu(), vc));
  }
}

TEST(CudaDecodeAttention, BadLengthsAndPositionsRaiseAtTheNextSync) {
  KILN_REQUIRE_CUDA();
  const Tensor q = random_tensor({2, 8, 1, 128}, DType::BF16, -2, 2, kGpu);
  Tensor kc = random_tensor({2, 2, 64, 128}, DType::BF16, -2, 2, kGpu), vc = random_tensor({2, 2, 64, 128}, DType::BF16, -2, 2, kGpu);
  EXPECT_TRUE(test::throws_error([&] { (void)decode_attention(q, kc, vc, from_vector<int32_t>({3, 65}).to(kGpu)).cpu(); },
                                 {"decode_attention", "65"}));
  // The general kernel (f32) checks too.
  EXPECT_TRUE(test::throws_error(
      [&] { (void)decode_attention(q.to(DType::F32), kc.to(DType::F32), vc.to(DType::F32), from_vector<int32_t>({-1, 3}).to(kGpu)).cpu(); },
      {"decode_attention", "-1"}));
  const Tensor k0 = kc.cpu();
  const Tensor kn = random_tensor({2, 2, 4, 128}, DType::BF16, -2, 2, kGpu), vn = random_tensor({2, 2, 4, 128}, DType::BF16, -2, 2, kGpu);
  EXPECT_TRUE(test::throws_error([&] {
    kv_cache_append_(kc, vc, kn, vn, from_vector<int32_t>({61, 0}).to(kGpu));
    (void)kc.cpu();
  }, {"kv_cache_append_", "61"}));
  // Sequence 0 (out of range) was skipped; sequence 1 was written.
  const Tensor k1 = kc.cpu();
  EXPECT_TRUE(test::equal(k1.select(0, 0), k0.select(0, 0)));
  EXPECT_TRUE(test::equal(k1.select(0, 1).narrow(1, 0, 4), kn.cpu().select(0, 1)));
}

TEST(CudaDecodeAttention, GraphReplayFollowsGrowingDeviceLengths) {
  KILN_REQUIRE_CUDA();
  for (const Tuning& tune : kTunings)
  for (DType dt : {DType::BF16, DType::F32}) {
    TuningScope scope(tune);
    SCOPED_TRACE(str(dtype_name(dt), ", ", tuning_name(tune)));
    const int64_t b = 2, hkv = 8, hq = 32, lmax = 2048, d = 128;
    Tensor kc = zeros({b, hkv, lmax, d}, dt, kGpu), vc = zeros({b, hkv, lmax, d}, dt, kGpu);
    Tensor kc_cpu = zeros({b, hkv, lmax, d}, dt), vc_cpu = zeros({b, hkv, lmax, d}, dt);
    Tensor q = zeros({b, hq, 1, d}, dt, kGpu), kn = zeros({b, hkv, 1, d}, dt, kGpu), vn = zeros({b, hkv, 1, d}, dt, kGpu);
    Tensor pos = zeros({b}, DType::I32, kGpu), lens = zeros({b}, DType::I32, kGpu);
    // Prefill some history on both sides.
    std::vector<int32_t> len = {100, 1500};
    for (int64_t i = 0; i < b; ++i) {
      const Tensor kh = random_tensor({hkv, len[i], d}, dt), vh = random_tensor({hkv, len[i], d}, dt);
      kc_cpu.select(0, i).narrow(1, 0, len[i]).copy_(kh);
      vc_cpu.select(0, i).narrow(1, 0, len[i]).copy_(vh);
    }
    kc.copy_(kc_cpu);
    vc.copy_(vc_cpu);
    Stream s = Stream::create(kGpu);
    Graph g;
    Tensor out;
    (void)decode_attention(q, kc, vc, lens);  // warm-up outside the capture (one-time kernel set-up)
    synchronize(kGpu);
    g.capture(s, [&] {
      kv_cache_append_(kc, vc, kn, vn, pos);
      out = decode_attention(q, kc, vc, lens);
    });
    for (int step = 0; step < 6; ++step) {
      const Tensor qh = random_tensor({b, hq, 1, d}, dt), kh = random_tensor({b, hkv, 1, d}, dt), vh = random_tensor({b, hkv, 1, d}, dt);
      const Tensor ph = from_vector<int32_t>(len);
      std::vector<int32_t> next = len;
      for (auto& x : next) x += 1;
      const Tensor lh = from_vector<int32_t>(next);
      {
        StreamGuard guard(s);
        q.copy_(qh);
        kn.copy_(kh);
        vn.copy_(vh);
        pos.copy_(ph);
        lens.copy_(lh);
      }
      g.replay();
      s.synchronize();
      kv_cache_append_(kc_cpu, vc_cpu, kh, vh, ph);
      const Tensor expect = decode_attention(qh, kc_cpu, vc_cpu, lh);
      EXPECT_TRUE(all_close(out.cpu(), expect, tol(dt))) << "step " << step;
      len = next;
      len[0] += 300;  // jumps too: the graph reads whatever the device holds
    }
  }
}


// ---- paged caches ----

// The register kernel reading K and V through the block table (f16/bf16, D = Dv in {64, 128}, KV groups of at
// most 8 rows, S a power of two >= 16) and the gathered path (everything else) against the CPU's paged op
// (tests/ops/attention_test.cpp holds it to a double-precision reference): tables with blocks out of order,
// shared and repeated, lengths from 0 to W * S.
TEST(CudaPagedAttention, MatchesCpuInPlaceAndGathered) {
  KILN_REQUIRE_CUDA();
  struct Case {
    DType dt;
    int64_t s, hq, hkv, d, lq;
    bool in_place;
  };
  const Case cases[] = {{DType::BF16, 16, 32, 8, 128, 1, true}, {DType::F16, 32, 8, 1, 64, 1, true},
                        {DType::BF16, 16, 16, 4, 128, 2, true}, {DType::BF16, 64, 16, 2, 64, 1, true},
                        {DType::BF16, 24, 8, 2, 128, 1, false}, {DType::F32, 16, 8, 2, 64, 1, false},
                        {DType::BF16, 16, 16, 2, 128, 3, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(str(dtype_name(c.dt), " S ", c.s, " Hq ", c.hq, " Hkv ", c.hkv, " D ", c.d, " Lq ", c.lq));
    const int64_t nb = 48, w = 40, b = 5;
    const Tensor kp = random_tensor({nb, c.s, c.hkv, c.d}, c.dt), vp = random_tensor({nb, c.s, c.hkv, c.d}, c.dt);
    const Tensor table = randint(0, nb, {b, w}, DType::I64).to(DType::I32);
    const std::vector<int32_t> lens = {0, 1, static_cast<int32_t>(c.s * 7 + 3), static_cast<int32_t>(w * c.s),
                                       static_cast<int32_t>(w * c.s - 17)};
    const Tensor q = random_tensor({b, c.lq, c.hq, c.d}, c.dt).transpose(1, 2);
    const Tensor lens_t = from_vector<int32_t>(lens);
    const Tensor cpu = paged_decode_attention(q, kp, vp, table, lens_t);
#if KILN_HAVE_CUDA
    const int64_t before = cuda::decode_paged_launches();
#endif
    poison_next(cpu.sizes(), c.dt);
    const Tensor got =
        paged_decode_attention(q.to(kGpu), kp.to(kGpu), vp.to(kGpu), table.to(kGpu), lens_t.to(kGpu)).cpu();
#if KILN_HAVE_CUDA
    EXPECT_EQ(cuda::decode_paged_launches() > before, c.in_place);
#endif
    EXPECT_TRUE(all_close(got, cpu, tol(c.dt)));
  }
}

TEST(CudaPagedAttention, AppendMatchesCpuAndBadEntriesRaiseAtTheNextSync) {
  KILN_REQUIRE_CUDA();
  const int64_t nb = 6, s = 16;
  Tensor kp = random_tensor({nb, s, 2, 128}, DType::BF16), vp = random_tensor({nb, s, 2, 128}, DType::BF16);
  Tensor kg = kp.to(kGpu), vg = vp.to(kGpu);
  const Tensor kn = random_tensor({3, 2, 128}, DType::F32), vn = random_tensor({3, 2, 128}, DType::F32);
  const Tensor slots = from_vector<int32_t>({95, 0, 33});
  paged_kv_append_(kp, vp, kn, vn, slots);
  paged_kv_append_(kg, vg, kn.to(kGpu), vn.to(kGpu), slots.to(kGpu));
  EXPECT_TRUE(test::equal(kg.cpu(), kp));
  EXPECT_TRUE(test::equal(vg.cpu(), vp));
  // A slot past the pools: that row is skipped, the others written.
  const Tensor k0 = kg.cpu();
  EXPECT_TRUE(test::throws_error([&] {
    paged_kv_append_(kg, vg, kn.to(kGpu), vn.to(kGpu), from_vector<int32_t>({96, 1, 2}).to(kGpu));
    (void)kg.cpu();
  }, {"kv_cache_append_", "96"}));
  EXPECT_TRUE(test::equal(kg.cpu().view({nb * s, 2, 128}).narrow(0, 1, 2), kn.narrow(0, 1, 2).to(DType::BF16)));
  EXPECT_TRUE(test::equal(kg.cpu().view({nb * s, 2, 128}).narrow(0, 3, nb * s - 3), k0.view({nb * s, 2, 128}).narrow(0, 3, nb * s - 3)));
  // A table entry outside the pools, in place (the register kernel) and gathered (f32).
  const Tensor q = random_tensor({2, 8, 1, 128}, DType::BF16, -2, 2, kGpu);
  const Tensor bad = from_vector<int32_t>({0, 1, 2, 9}, Shape{2, 2}).to(kGpu);
  const Tensor lens = from_vector<int32_t>({5, 20}).to(kGpu);
  EXPECT_TRUE(test::throws_error([&] { (void)paged_decode_attention(q, kg, vg, bad, lens).cpu(); }, {"decode_attention", "9"}));
  EXPECT_TRUE(test::throws_error(
      [&] { (void)paged_decode_attention(q.to(DType::F32), kg.to(DType::F32), vg.to(DType::F32), bad, lens).cpu(); },
      {"index_select", "9"}));
  // A length past W * S.
  EXPECT_TRUE(test::throws_error(
      [&] { (void)paged_decode_attention(q, kg, vg, from_vector<int32_t>({0, 1, 2, 3}, Shape{2, 2}).to(kGpu),
                                         from_vector<int32_t>({5, 33}).to(kGpu)).cpu(); },
      {"decode_attention", "33"}));
}

}  // namespace
}  // namespace kiln
