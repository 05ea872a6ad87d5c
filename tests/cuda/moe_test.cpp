// CUDA grouped_mm, MoE router and MoE block against the CPU (which tests/ops/moe_test.cpp checks against
// double-precision references): the four grouped_mm forms in f32/f16/bf16 through both the matrix-vector and
// the tiled kernel, empty groups, offsets short of the grouped dim (zeros), G = 1, 512-row groups, the decode
// shape (8 rows in 8 of 128 groups, H 2048, I 768), weight-style and plain layouts, misaligned slices,
// integer data compared bit for bit, outputs on poisoned memory, invalid offsets raised at synchronize();
// the router (ties, every top_k), the MoE block for 1..512 tokens and 1..128 experts, and graph capture.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <utility>
#include <vector>

#include "kiln/nn.h"
#include "kiln/runtime.h"
#include "ops/linear_check.h"
#include "ops/moe_ref.h"
#include "test_util.h"
#if KILN_HAVE_CUDA
#include "cpu/moe.h"
#include "cuda/launch.h"
#include "cuda/moe.h"
#endif

namespace kiln {
namespace {

#if KILN_HAVE_CUDA

using cuda::GroupedMmPath;

const Device kGpu = cuda_device(0);
const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

// Forces a grouped_mm path for a scope.
struct ForcePath {
  explicit ForcePath(GroupedMmPath p) { cuda::set_forced_grouped_mm_path(p); }
  ~ForcePath() { cuda::set_forced_grouped_mm_path(GroupedMmPath::Auto); }
};
// Grouped-product settings (get / set functions of cuda/moe.h) changed for a scope.
using test::SettingScope;
// The register bound of the matrix-vector kernel's one-row instance.
using DecodeMinBlocks = SettingScope<int, cuda::grouped_decode_min_blocks, cuda::set_grouped_decode_min_blocks>;
// The Hopper tile kernels' straight-run epilogue (on by default).
using FastEpilogue = SettingScope<bool, cuda::grouped_fast_epilogue, cuda::set_grouped_fast_epilogue>;
// The straight run's 16-byte stores (on by default).
using WideStores = SettingScope<bool, cuda::grouped_wide_stores, cuda::set_grouped_wide_stores>;
// The 128-row tiles' idle warpgroup skipping its MMAs (on by default).
using SkipIdleHalf = SettingScope<bool, cuda::grouped_skip_idle_half, cuda::set_grouped_skip_idle_half>;
// The 128-row TMA tiles' staged C epilogue (on by default).
using TmaStore = SettingScope<bool, cuda::grouped_tma_store, cuda::set_grouped_tma_store>;
// The MoE combine fused into one token's down product (on by default).
using FusedCombine = SettingScope<bool, cuda::moe_fused_combine, cuda::set_moe_fused_combine>;
// One token's down product reading its row groups before its dependent-launch wait (on by default).
using EarlyDown = SettingScope<bool, cuda::moe_early_down, cuda::set_moe_early_down>;
const char* path_name(GroupedMmPath p) {
  switch (p) {
    case GroupedMmPath::Decode: return "decode";
    case GroupedMmPath::Tiled: return "tiled (cp.async wgmma where it applies)";
    case GroupedMmPath::TiledWide: return "tiled (wgmma 128 x 256 where it applies)";
    case GroupedMmPath::TiledTma: return "tiled (TMA wgmma 128 x 128 where it applies)";
    case GroupedMmPath::TiledTma64: return "tiled (TMA wgmma 64 x 128 where it applies)";
    case GroupedMmPath::TiledTmaWide: return "tiled (TMA wgmma 128 x 256 where it applies)";
    case GroupedMmPath::TiledTmaWidePair: return "tiled (TMA wgmma 128 x 256, pairs sharing B, where it applies)";
    case GroupedMmPath::TiledTmaCluster2: return "tiled (TMA wgmma, clusters of 2 sharing A, where it applies)";
    case GroupedMmPath::TiledTmaCluster4: return "tiled (TMA wgmma, clusters of 4 sharing A, where it applies)";
    case GroupedMmPath::TiledPortable: return "tiled (portable)";
    default: return "auto";
  }
}

// Leaves a freed block of `bytes` full of 0xFF (NaN in every float dtype) in the caching allocator, so the
// next allocation of that size most likely lands on it: an element the kernel fails to write stays NaN.
void poison_next(int64_t bytes) {
  Tensor t = empty({std::max<int64_t>(bytes, 1)}, DType::U8, kGpu);
  t.fill_(0xFF);
}

Tensor offsets(const std::vector<int32_t>& v) { return from_vector<int32_t>(v).to(kGpu); }

Tensor rnd(const Shape& s, DType d, bool integers, double lo = -1, double hi = 1) {
  return integers ? test::random_int_tensor(s, DType::I64, -3, 3).to(d) : test::random_tensor(s, d, lo, hi);
}

// grouped_mm on the GPU (poisoned output memory) against the CPU on the same values: within the f32
// accumulation bound of linear_close, or bit for bit (integer data: every sum is exact in f32).
::testing::AssertionResult check_gmm(const Tensor& a, const Tensor& b, const std::optional<Tensor>& offs_cpu,
                                     std::optional<DType> out_dtype, bool exact, int64_t k) {
  const Tensor a_gpu = a.to(kGpu), b_gpu = b.to(kGpu);
  const std::optional<Tensor> offs_gpu = offs_cpu ? std::optional<Tensor>(offs_cpu->to(kGpu)) : std::nullopt;
  const DType od = out_dtype.value_or(a.dtype());
  const Tensor ref = grouped_mm(a, b, offs_cpu, out_dtype);
  poison_next(ref.numel() * static_cast<int64_t>(itemsize(od)));
  const Tensor out = grouped_mm(a_gpu, b_gpu, offs_gpu, out_dtype);
  if (out.dtype() != od) return ::testing::AssertionFailure() << "dtype " << dtype_name(out.dtype());
  if (exact) return test::equal(out.to(kCPU), ref);
  auto abs32 = [](const Tensor& t) { return abs(t.to(DType::F32)); };
  const Tensor scale = grouped_mm(abs32(a), abs32(b), offs_cpu, DType::F32).to(DType::F64);
  return test::linear_close(out, ref, scale, od, k);
}

// A [rows, cols] view whose rows are `pad` elements apart, starting `offset` elements into a buffer.
Tensor strided_view(const Tensor& dense, int64_t offset, int64_t pad) {
  const int64_t rows = dense.size(0), cols = dense.size(1);
  Tensor base = zeros({rows * (cols + pad) + offset}, dense.dtype());
  Tensor v = base.as_strided({rows, cols}, {cols + pad, 1}, offset);
  v.copy_(dense);
  return v;
}

// Tensor.to(kGpu) makes a contiguous copy; for layouts that matter (transposed weights, misaligned slices)
// the GPU operand is built on the device with the same view.
Tensor gpu_view_like(const Tensor& cpu_view) {
  if (cpu_view.numel() == 0) return empty(cpu_view.sizes(), cpu_view.dtype(), kGpu);
  // The whole storage the view spans, copied, then the same view on it.
  const int64_t off = cpu_view.storage_offset();
  int64_t span = 1;
  for (int64_t d = 0; d < cpu_view.dim(); ++d) span += (cpu_view.size(d) - 1) * cpu_view.stride(d);
  const Tensor flat = cpu_view.as_strided({span}, {1}, off).contiguous().to(kGpu);
  Tensor base = empty({span + 1}, cpu_view.dtype(), kGpu);
  // Keep the misalignment: an odd storage offset on the device when the CPU view has one.
  const int64_t shift = off % 2;
  base.slice(0, shift, shift + span).copy_(flat);
  return base.as_strided(cpu_view.sizes(), cpu_view.strides(), base.storage_offset() + shift);
}

::testing::AssertionResult check_gmm_views(const Tensor& a, const Tensor& b, const std::optional<Tensor>& offs_cpu,
                                           std::optional<DType> out_dtype, bool exact, int64_t k) {
  const Tensor a_gpu = gpu_view_like(a), b_gpu = gpu_view_like(b);
  const std::optional<Tensor> offs_gpu = offs_cpu ? std::optional<Tensor>(offs_cpu->to(kGpu)) : std::nullopt;
  const DType od = out_dtype.value_or(a.dtype());
  const Tensor ref = grouped_mm(a, b, offs_cpu, out_dtype);
  poison_next(ref.numel() * static_cast<int64_t>(itemsize(od)));
  const Tensor out = grouped_mm(a_gpu, b_gpu, offs_gpu, out_dtype);
  if (out.dtype() != od) return ::testing::AssertionFailure() << "dtype " << dtype_name(out.dtype());
  if (exact) return test::equal(out.to(kCPU), ref);
  auto abs32 = [](const Tensor& t) { return abs(t.to(DType::F32)); };
  const Tensor scale = grouped_mm(abs32(a), abs32(b), offs_cpu, DType::F32).to(DType::F64);
  return test::linear_close(out, ref, scale, od, k);
}

// Every path a test can force (a TMA path falls back to the cp.async kernel where it does not apply), and
// the same after Auto.
const std::vector<GroupedMmPath> kEveryPath = {
    GroupedMmPath::Decode,           GroupedMmPath::Tiled,            GroupedMmPath::TiledWide,
    GroupedMmPath::TiledTma,         GroupedMmPath::TiledTma64,       GroupedMmPath::TiledTmaWide,
    GroupedMmPath::TiledTmaWidePair, GroupedMmPath::TiledTmaCluster2, GroupedMmPath::TiledTmaCluster4,
    GroupedMmPath::TiledPortable};
const std::vector<GroupedMmPath> kAutoAndEveryPath = [] {
  std::vector<GroupedMmPath> v = {GroupedMmPath::Auto};
  v.insert(v.end(), kEveryPath.begin(), kEveryPath.end());
  return v;
}();

struct RowCase {
  int64_t m, k, n;
  std::vector<int32_t> ends;
};
// Empty groups, the first group empty, offsets short of M (the last rows are zeros), G = 1, K not a multiple
// of 8, K < 8, N = 1, 512-row groups, K = 0, groups of several 128-row tiles with several column tiles and
// K steps (the last one partial).
const std::vector<RowCase> kRowCases = {
    {23, 19, 13, {0, 5, 5, 12, 21}}, {7, 64, 40, {7}},           {9, 8, 1, {2, 2, 9}},
    {5, 3, 70, {1, 2, 3, 4}},        {1100, 72, 96, {512, 512, 1030}}, {40, 256, 136, {3, 3, 3, 40}},
    {6, 0, 5, {2, 6}},               {17, 40, 33, {0, 0, 0}},     {64, 1000, 24, {1, 2, 4, 8, 16, 32, 48, 64}},
    {600, 264, 320, {100, 300, 300, 590}}};

// 2d x 3d with b as transposed weights ([G, N, K] storage: the MoE layout, the vector path) and as plain
// [G, K, N] storage, through both kernels, every dtype, random and integer data, f32 output too.
TEST(CudaGroupedMm, TwoDByThreeDMatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (GroupedMmPath path : kEveryPath) {
    ForcePath force(path);
    for (DType d : kDtypes)
      for (const RowCase& c : kRowCases)
        for (bool weights_layout : {true, false})
          for (bool integers : {false, true}) {
            const int64_t G = static_cast<int64_t>(c.ends.size());
            SCOPED_TRACE(str(path_name(path), " ", dtype_name(d), " M=", c.m, " K=", c.k, " N=", c.n, " G=", G,
                             weights_layout ? " [G,N,K] storage" : " [G,K,N] storage", integers ? " ints" : ""));
            const Tensor a = rnd({c.m, c.k}, d, integers);
            const Tensor b = weights_layout ? rnd({G, c.n, c.k}, d, integers).transpose(1, 2) : rnd({G, c.k, c.n}, d, integers);
            const Tensor offs = from_vector<int32_t>(c.ends);
            EXPECT_TRUE(check_gmm_views(a, b, offs, std::nullopt, integers, c.k));
            if (d != DType::F32) EXPECT_TRUE(check_gmm_views(a, b, offs, DType::F32, integers, c.k));
          }
  }
}

// More product tiles than the GPU has multiprocessors (about 300 tiles of 128 x 128, several waves), an empty
// group, offsets short of M (zero rows), K not a multiple of the 64-wide step.
TEST(CudaGroupedMm, TiledManyTilesPerBlockMatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (GroupedMmPath path : {GroupedMmPath::Tiled, GroupedMmPath::TiledWide, GroupedMmPath::TiledTma, GroupedMmPath::TiledTma64, GroupedMmPath::TiledTmaWide, GroupedMmPath::TiledTmaWidePair, GroupedMmPath::TiledTmaCluster2, GroupedMmPath::TiledTmaCluster4})
  for (DType d : {DType::BF16, DType::F16})
  // whole tiles through the general loop, the straight run, its 16-byte stores; and those with every
  // 128-row tile multiplied whole (no warpgroup skipping its MMAs). All from registers (the staged
  // epilogue, the default for 128-row TMA tiles, has its own test below).
  for (int form : {0, 1, 2, 3}) {
    const bool fast = form > 0;
    ForcePath force(path);
    FastEpilogue fast_scope(fast);
    WideStores wide_scope(form >= 2);
    SkipIdleHalf skip_scope(form != 3);
    TmaStore store(false);
    SCOPED_TRACE(str(path_name(path), " ", dtype_name(d), fast ? " straight-run epilogue" : "",
                     form >= 2 ? " (16-byte stores)" : "", form == 3 ? " without skipping idle halves" : ""));
    // N = 1300: 11 column tiles, so clusters of 2 and 4 have spare blocks (past the last n-tile). Groups
    // of 500, 700, 0, 1300 and 490 rows: last tiles of 116, 60, 20 and 106 rows (pairs sharing B: the
    // 1300-row group's last span of 20 rows leaves its second block without rows).
    const int64_t M = 3000, K = 136, N = 1300;
    const std::vector<int32_t> ends = {500, 1200, 1200, 2500, 2990};
    const Tensor a = rnd({M, K}, d, false);
    const Tensor b = rnd({static_cast<int64_t>(ends.size()), N, K}, d, false).transpose(1, 2);
    const bool tma = path != GroupedMmPath::Tiled && path != GroupedMmPath::TiledWide;
    const int64_t before = tma ? cuda::grouped_tma_launches(path) : 0;
    EXPECT_TRUE(check_gmm_views(a, b, from_vector<int32_t>(ends), std::nullopt, false, K));
    EXPECT_TRUE(check_gmm_views(a, b, from_vector<int32_t>(ends), DType::F32, false, K));  // f32 C too
    if (tma && cuda::wgmma_available(0))
      EXPECT_GT(cuda::grouped_tma_launches(path), before) << "the forced TMA kernel never ran";
  }
}

// The staged C epilogue of the 128-row TMA tiles (TMA stores from shared memory): 16-bit C whose rows are
// 16-byte aligned. Groups whose last tiles hold 116, 60, 20 and 106 rows, so one warpgroup stores through
// shared memory and the other from registers within a tile; a last column tile of 24 columns (the boxes
// past N write nothing); rows past the last offset (zeros). Every element against the CPU, with the output
// poisoned; the launch counter shows the staged epilogue ran.
TEST(CudaGroupedMm, TmaStoreEpilogueMatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (GroupedMmPath path : {GroupedMmPath::TiledTma, GroupedMmPath::TiledTmaWide, GroupedMmPath::TiledTmaWidePair})
    for (DType d : {DType::BF16, DType::F16})
      for (bool integers : {false, true}) {
        ForcePath force(path);
        TmaStore store(true);
        SCOPED_TRACE(str(path_name(path), " ", dtype_name(d), integers ? " ints" : ""));
        const int64_t M = 3000, K = 136, N = 1304;
        const std::vector<int32_t> ends = {500, 1200, 1200, 2500, 2990};
        const Tensor a = rnd({M, K}, d, integers);
        const Tensor b = rnd({static_cast<int64_t>(ends.size()), N, K}, d, integers).transpose(1, 2);
        const int64_t before = cuda::grouped_tma_store_launches();
        EXPECT_TRUE(check_gmm_views(a, b, from_vector<int32_t>(ends), std::nullopt, integers, K));
        if (cuda::wgmma_available(0))
          EXPECT_GT(cuda::grouped_tma_store_launches(), before) << "the staged epilogue never ran";
        // Batched (a slot of C per group), and a shape too small for a whole warpgroup of rows.
        for (const Shape& sh : {Shape{3, 300, 136, 280}, Shape{2, 40, 64, 72}}) {
          const Tensor ab = rnd({sh[0], sh[1], sh[2]}, d, integers);
          EXPECT_TRUE(check_gmm(ab, rnd({sh[0], sh[2], sh[3]}, d, integers), std::nullopt, std::nullopt, integers, sh[2]))
              << "batched " << shape_str(sh);
        }
      }
}

// Auto's tile size on Hopper follows the rows per group: 64 x 128 tiles at 32 rows a group, 128 x 128 at
// 80, 128 x 256 at 128 and 512, and in pairs sharing B at 256 (KILN_GMM_TMA64_ROWS / KILN_GMM_WIDE_ROWS
// unset); each result against the CPU.
TEST(CudaGroupedMm, AutoTileSizeFollowsRowsPerGroup) {
  KILN_REQUIRE_CUDA();
  if (!cuda::wgmma_available(0)) GTEST_SKIP() << "no Hopper tensor-core kernels on this GPU (wgmma_available is false)";
  if (std::getenv("KILN_GMM_TMA64_ROWS") || std::getenv("KILN_GMM_WIDE_ROWS") || std::getenv("KILN_GROUPED_MM_PATH"))
    GTEST_SKIP() << "KILN_GMM_TMA64_ROWS, KILN_GMM_WIDE_ROWS or KILN_GROUPED_MM_PATH is set: the defaults are not in force";
  const int64_t G = 4, K = 192, N = 264;
  const std::pair<int64_t, GroupedMmPath> cases[] = {
      {32, GroupedMmPath::TiledTma64}, {80, GroupedMmPath::TiledTma}, {128, GroupedMmPath::TiledTmaWide},
      {256, GroupedMmPath::TiledTmaWidePair}, {512, GroupedMmPath::TiledTmaWide}};
  for (const auto& [rows, expect] : cases) {
    SCOPED_TRACE(str(rows, " rows a group: expected ", path_name(expect)));
    std::vector<int32_t> ends;
    for (int64_t g = 1; g <= G; ++g) ends.push_back(static_cast<int32_t>(g * rows - (g == 2 ? 5 : 0)));  // one short group
    const Tensor a = rnd({G * rows, K}, DType::BF16, false);
    const Tensor b = rnd({G, N, K}, DType::BF16, false).transpose(1, 2);
    int64_t before[4];
    const GroupedMmPath all[4] = {GroupedMmPath::TiledTma64, GroupedMmPath::TiledTma, GroupedMmPath::TiledTmaWide,
                                  GroupedMmPath::TiledTmaWidePair};
    for (int i = 0; i < 4; ++i) before[i] = cuda::grouped_tma_launches(all[i]);
    EXPECT_TRUE(check_gmm_views(a, b, from_vector<int32_t>(ends), std::nullopt, false, K));
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(cuda::grouped_tma_launches(all[i]) - before[i], all[i] == expect ? 1 : 0) << path_name(all[i]);
  }
}

// Misaligned and strided A (rows one element into a buffer, rows padded) and a misaligned weight slice:
// the scalar paths.
TEST(CudaGroupedMm, MisalignedAndStridedOperandsMatchCpu) {
  KILN_REQUIRE_CUDA();
  for (GroupedMmPath path : kEveryPath) {
    ForcePath force(path);
    for (DType d : kDtypes)
      for (int64_t offset : {0, 1})
        for (int64_t pad : {0, 3, 8}) {
          SCOPED_TRACE(str(path_name(path), " ", dtype_name(d), " offset ", offset, " pad ", pad));
          const int64_t M = 30, K = 64, N = 48, G = 4;
          const Tensor a = strided_view(rnd({M, K}, d, false), offset, pad);
          const Tensor wbase = rnd({G * N * K + 1}, d, false);
          const Tensor b = wbase.as_strided({G, N, K}, {N * K, K, 1}, offset).transpose(1, 2);
          const Tensor offs = from_vector<int32_t>({4, 4, 20, 29});
          EXPECT_TRUE(check_gmm_views(a, b, offs, std::nullopt, false, K));
        }
  }
}

TEST(CudaGroupedMm, ThreeDByTwoDMatchesCpu) {
  KILN_REQUIRE_CUDA();
  struct C {
    int64_t g, m, k, n;
    std::vector<int32_t> ends;
  };
  const std::vector<C> cases = {{3, 7, 11, 20, {6, 6, 17}},   {1, 5, 64, 33, {33}},
                                {4, 70, 40, 9, {0, 2, 2, 5}}, {2, 130, 128, 600, {300, 600}}};
  for (GroupedMmPath path : kEveryPath) {
    ForcePath force(path);
    for (DType d : kDtypes)
      for (const C& c : cases)
        for (bool integers : {false, true}) {
          SCOPED_TRACE(str(path_name(path), " ", dtype_name(d), " G=", c.g, " M=", c.m, " K=", c.k, " N=", c.n,
                           integers ? " ints" : ""));
          const Tensor a = rnd({c.g, c.m, c.k}, d, integers), b = rnd({c.k, c.n}, d, integers);
          EXPECT_TRUE(check_gmm(a, b, from_vector<int32_t>(c.ends), std::nullopt, integers, c.k));
          // b stored as [N, K] (its transpose is the operand): K contiguous.
          const Tensor bt = rnd({c.n, c.k}, d, integers).t();
          EXPECT_TRUE(check_gmm_views(a, bt, from_vector<int32_t>(c.ends), std::nullopt, integers, c.k));
        }
  }
}

TEST(CudaGroupedMm, TwoDByTwoDGroupsKMatchesCpu) {
  KILN_REQUIRE_CUDA();
  struct C {
    int64_t m, k, n;
    std::vector<int32_t> ends;
  };
  // Empty K ranges (C[g] = 0), a short last offset, ranges that do not start on a multiple of 8.
  const std::vector<C> cases = {{6, 30, 9, {8, 8, 29}}, {65, 200, 70, {0, 37, 37, 150, 199}}, {3, 5, 2, {5}}};
  for (DType d : kDtypes)
    for (const C& c : cases)
      for (bool integers : {false, true}) {
        SCOPED_TRACE(str(dtype_name(d), " M=", c.m, " K=", c.k, " N=", c.n, integers ? " ints" : ""));
        const Tensor a = rnd({c.m, c.k}, d, integers), b = rnd({c.k, c.n}, d, integers);
        EXPECT_TRUE(check_gmm(a, b, from_vector<int32_t>(c.ends), std::nullopt, integers, c.k));
        EXPECT_TRUE(check_gmm_views(a.t().contiguous().t(), b, from_vector<int32_t>(c.ends), DType::F32, integers, c.k));
      }
}

TEST(CudaGroupedMm, BatchedMatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (GroupedMmPath path : {GroupedMmPath::Auto, GroupedMmPath::TiledTma, GroupedMmPath::TiledTma64, GroupedMmPath::TiledTmaWide, GroupedMmPath::TiledTmaWidePair, GroupedMmPath::TiledTmaCluster2, GroupedMmPath::TiledTmaCluster4})
  for (DType d : kDtypes)
    for (bool integers : {false, true})
      for (const Shape& s : {Shape{4, 5, 17, 6}, Shape{2, 100, 64, 72}, Shape{1, 1, 1, 1}, Shape{3, 300, 136, 280}}) {
        ForcePath force(path);
        SCOPED_TRACE(str(path_name(path), " ", dtype_name(d), " G,M,K,N = ", shape_str(s), integers ? " ints" : ""));
        const Tensor a = rnd({s[0], s[1], s[2]}, d, integers);
        EXPECT_TRUE(check_gmm(a, rnd({s[0], s[2], s[3]}, d, integers), std::nullopt, std::nullopt, integers, s[2]));
        EXPECT_TRUE(check_gmm_views(a, rnd({s[0], s[3], s[2]}, d, integers).transpose(1, 2), std::nullopt, DType::F32,
                                    integers, s[2]));
      }
}

// The decode shape of a 128-expert layer: one token's 8 rows, each in a different group, gate_up [E, 2I, H]
// and down [E, H, I] as transposed operands (H = 2048, I = 768). The CPU reference takes only the 8 used
// groups (the same rows against the same weights).
TEST(CudaGroupedMm, DecodeShapeEightOf128Groups) {
  KILN_REQUIRE_CUDA();
  const int64_t E = 128, H = 2048, I = 768;
  std::vector<int32_t> used = {3, 17, 18, 40, 77, 100, 101, 127};
  std::vector<int32_t> ends(E), compact_ends(used.size());
  for (int64_t g = 0, r = 0; g < E; ++g) {
    if (std::find(used.begin(), used.end(), g) != used.end()) ++r;
    ends[g] = static_cast<int32_t>(r);
  }
  std::iota(compact_ends.begin(), compact_ends.end(), 1);
  // Auto (the matrix-vector kernel) under its default choice and both register bounds of its one-row
  // instance, then the tiles.
  struct Run {
    GroupedMmPath path;
    int min_blocks;
  };
  const Run runs[] = {{GroupedMmPath::Auto, 0},         {GroupedMmPath::Auto, 1},         {GroupedMmPath::Auto, 6},
                      {GroupedMmPath::Tiled, 1},        {GroupedMmPath::TiledWide, 1},
                      {GroupedMmPath::TiledTma, 1},     {GroupedMmPath::TiledTma64, 1},
                      {GroupedMmPath::TiledTmaWide, 1}, {GroupedMmPath::TiledTmaWidePair, 1},
                      {GroupedMmPath::TiledTmaCluster2, 1},
                      {GroupedMmPath::TiledTmaCluster4, 1}, {GroupedMmPath::TiledPortable, 1}};
  for (const Run& run : runs) {
    const GroupedMmPath path = run.path;
    ForcePath force(path);
    DecodeMinBlocks bound(run.min_blocks);
    for (DType d : kDtypes)
      for (const auto& nk : {std::pair<int64_t, int64_t>{2 * I, H}, std::pair<int64_t, int64_t>{H, I}}) {
        const int64_t N = nk.first, K = nk.second;
        SCOPED_TRACE(str(path_name(path), " ", dtype_name(d), " N=", N, " K=", K, " one-row bound ", run.min_blocks,
                         " blocks/SM"));
        Tensor w = empty({E, N, K}, d, kGpu);
        uniform_(w, -1, 1);
        const Tensor a = test::random_tensor({8, K}, d, -1, 1);
        const Tensor out = grouped_mm(a.to(kGpu), w.transpose(1, 2), offsets(ends));
        const Tensor idx = from_vector<int64_t>(std::vector<int64_t>(used.begin(), used.end())).to(kGpu);
        const Tensor w_used = index_select(w, 0, idx).to(kCPU).transpose(1, 2);
        const Tensor offs = from_vector<int32_t>(compact_ends);
        const Tensor ref = grouped_mm(a, w_used, offs);
        const Tensor scale = grouped_mm(abs(a.to(DType::F32)), abs(w_used.to(DType::F32)), offs, DType::F32);
        EXPECT_TRUE(test::linear_close(out, ref, scale.to(DType::F64), d, K));
      }
  }
}

// The decode kernel's warps find their row's group straight from the offsets, 128 at a time: G up to 2048 and
// not a multiple of 32, a group alone in the last chunk (G = 129), runs of empty groups across chunks, rows
// past the last offset (zeros); then invalid offsets in a later chunk (one below its predecessor, one past M):
// the error raised at synchronize() and the product taken with the sanitised offsets. Integer data, every
// element compared bit for bit.
TEST(CudaGroupedMm, DecodeFindsGroupsAcrossManyOffsets) {
  KILN_REQUIRE_CUDA();
  ForcePath force(GroupedMmPath::Decode);
  const int64_t M = 12, K = 72, N = 24;
  for (int G : {33, 129, 300, 2048})
    for (DType d : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(str("G=", G, " ", dtype_name(d)));
      // Rows 0..9 in groups spread over 0..G-1 (non-decreasing); rows 10 and 11 past the last offset.
      std::vector<int32_t> ends(static_cast<size_t>(G), 0);
      for (int r = 0; r < 10; ++r)
        for (int g = r * (G - 1) / 9; g < G; ++g) ++ends[static_cast<size_t>(g)];
      const Tensor a = rnd({M, K}, d, true);
      const Tensor b = rnd({G, N, K}, d, true).transpose(1, 2);
      EXPECT_TRUE(check_gmm(a, b, from_vector<int32_t>(ends), std::nullopt, true, K));
      if (G < 300) continue;
      std::vector<int32_t> bad = ends, sane(static_cast<size_t>(G));
      bad[200] = 0;
      bad[250] = 1000;
      for (int g = 0, run = 0; g < G; ++g) {
        run = std::max(run, bad[static_cast<size_t>(g)]);
        sane[static_cast<size_t>(g)] = std::min<int32_t>(run, static_cast<int32_t>(M));
      }
      const Tensor out = grouped_mm(a.to(kGpu), b.to(kGpu), offsets(bad));
      EXPECT_TRUE(test::throws_error([&] { synchronize(kGpu); }, {"grouped_mm", "invalid group offset"}));
      EXPECT_TRUE(test::equal(out.to(kCPU), grouped_mm(a, b, from_vector<int32_t>(sane))));
    }
}

// Invalid offsets: no error at the call, an error naming grouped_mm at the next synchronize(), the output
// computed with the sanitised offsets (running maximum clamped to [0, extent]), nothing else written.
TEST(CudaGroupedMm, InvalidOffsetsRaiseAtSynchronizeWithoutStrayWrites) {
  KILN_REQUIRE_CUDA();
  struct C {
    std::vector<int32_t> bad, sane;
  };
  const std::vector<C> cases = {{{3, 2, 7}, {3, 3, 7}}, {{3, 5, 11}, {3, 5, 10}}, {{-1, 5, 7}, {0, 5, 7}},
                                {{12, 1, 4}, {10, 10, 10}}, {{INT32_MIN, INT32_MAX, 0}, {0, 10, 10}}};
  for (GroupedMmPath path : kEveryPath)
    for (const C& c : cases) {
      ForcePath force(path);
      SCOPED_TRACE(str(path_name(path), " offs ", c.bad[0], ",", c.bad[1], ",", c.bad[2]));
      const Tensor a = test::random_tensor({10, 24}, DType::F32), b = test::random_tensor({3, 24, 16}, DType::F32);
      // Canaries around the output's allocation.
      Tensor before = full({4096}, 7.0, DType::F32, kGpu);
      const Tensor out = grouped_mm(a.to(kGpu), b.to(kGpu), offsets(c.bad));
      Tensor after = full({4096}, 7.0, DType::F32, kGpu);
      EXPECT_TRUE(test::throws_error([&] { synchronize(kGpu); }, {"grouped_mm", "invalid group offset"}));
      EXPECT_NO_THROW(synchronize(kGpu));  // raised once
      const Tensor ref = grouped_mm(a, b, from_vector<int32_t>(c.sane));
      EXPECT_TRUE(test::all_close(out.to(kCPU), ref, test::Tolerance{1e-5, 1e-4}));
      EXPECT_TRUE(test::equal(before.to(kCPU), full({4096}, 7.0, DType::F32)));
      EXPECT_TRUE(test::equal(after.to(kCPU), full({4096}, 7.0, DType::F32)));
    }
  // The other forms.
  const Tensor a3 = test::random_tensor({3, 5, 8}, DType::F32, -1, 1, kGpu), b2 = test::random_tensor({8, 6}, DType::F32, -1, 1, kGpu);
  (void)grouped_mm(a3, b2, offsets({2, 1, 6}));
  EXPECT_TRUE(test::throws_error([&] { synchronize(kGpu); }, {"grouped_mm", "invalid group offset 1"}));
  const Tensor a2 = test::random_tensor({5, 8}, DType::BF16, -1, 1, kGpu), bk = test::random_tensor({8, 6}, DType::BF16, -1, 1, kGpu);
  (void)grouped_mm(a2, bk, offsets({2, 9}));
  EXPECT_TRUE(test::throws_error([&] { synchronize(kGpu); }, {"grouped_mm", "invalid group offset 9", "at most 8"}));
  // Valid offsets leave no error behind.
  (void)grouped_mm(a2, bk, offsets({2, 8}));
  EXPECT_NO_THROW(synchronize(kGpu));
}

TEST(CudaGroupedMm, GraphCaptureAndReplay) {
  KILN_REQUIRE_CUDA();
  for (GroupedMmPath path : kEveryPath) {
    ForcePath force(path);
    Tensor a = test::random_tensor({8, 256}, DType::BF16, -1, 1, kGpu);
    const Tensor w = test::random_tensor({16, 96, 256}, DType::BF16, -1, 1, kGpu);
    Tensor offs = offsets({0, 1, 1, 2, 3, 3, 3, 4, 5, 5, 6, 6, 6, 7, 8, 8});
    const Tensor eager = grouped_mm(a, w.transpose(1, 2), offs).to(kCPU);
    Stream s = Stream::create(kGpu);
    Graph g;
    Tensor out;
    g.capture(s, [&] { out = grouped_mm(a, w.transpose(1, 2), offs); });
    synchronize(kGpu);
    g.replay();
    s.synchronize();
    EXPECT_TRUE(test::equal(out.to(kCPU), eager));
    // New offsets and inputs in place: the replay reads them on the device.
    offs.copy_(offsets({2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 8}));
    a.copy_(test::random_tensor({8, 256}, DType::BF16, -1, 1, kGpu));
    const Tensor eager2 = grouped_mm(a, w.transpose(1, 2), offs).to(kCPU);
    synchronize(kGpu);
    g.replay();
    s.synchronize();
    EXPECT_TRUE(test::equal(out.to(kCPU), eager2));
  }
}

// ---- router and MoE block ------------------------------------------------------------------------------------

// Integer x and router rows: the logits are exact small integers in every dtype, so the GPU and the CPU
// route the same logits (many of them tie: the lower expert must win).
TEST(CudaMoeRoute, MatchesCpuWithTies) {
  KILN_REQUIRE_CUDA();
  for (DType d : kDtypes)
    for (int64_t E : {1, 8, 128, 256})
      for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{8}, int64_t{64}, E})
        for (bool norm : {true, false}) {
          if (k > E || k > 64) continue;
          SCOPED_TRACE(str(dtype_name(d), " E=", E, " k=", k, norm ? " norm" : ""));
          const Tensor x = test::random_int_tensor({37, 16}, d, -2, 2);
          const Tensor router = test::random_int_tensor({E, 16}, d, -1, 1);
          const MoeRouting ref = moe_route(x, router, k, norm);
          const MoeRouting r = moe_route(x.to(kGpu), router.to(kGpu), k, norm);
          EXPECT_TRUE(test::equal(r.experts.to(kCPU), ref.experts));
          EXPECT_EQ(r.weights.dtype(), d);
          EXPECT_TRUE(test::all_close(r.weights.to(kCPU), ref.weights,
                                      d == DType::F32 ? test::Tolerance{1e-5, 1e-7} : test::default_tolerance(d)));
        }
  // Identical router rows: every expert ties.
  const Tensor x = test::random_tensor({3, 8}, DType::F32, -1, 1, kGpu);
  const Tensor router = test::random_tensor({1, 8}, DType::F32).expand({6, 8}).contiguous().to(kGpu);
  const MoeRouting r = moe_route(x, router, 3, true);
  const auto ev = r.experts.to(kCPU).to_vector<int32_t>();
  const auto wv = r.weights.to(kCPU).to_vector<float>();
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(ev[t * 3 + j], j);
      EXPECT_NEAR(wv[t * 3 + j], 1.0 / 3, 1e-6);
    }
}

// The MoE block against a CPU reference: f32, accumulation order; half types, h may round differently by one
// ulp and the output rounds once on each side.
test::Tolerance moe_tolerance(DType d) {
  return d == DType::F32 ? test::Tolerance{2e-5, 2e-5}
         : d == DType::F16 ? test::Tolerance{2e-3, 2e-4}
                           : test::Tolerance{1.6e-2, 2e-3};
}

// Random FP8 experts on the GPU: e4m3 values from [-400, 400] (saturating at 448), scales in [2e-4, 1e-3] per
// bn x bk block; gate_up [E, 2I, H], down [E, H, I].
Fp8Experts random_fp8_experts(int64_t E, int64_t H, int64_t I, int64_t bn, int64_t bk) {
  auto stack = [&](int64_t R, int64_t K, Tensor& v, Tensor& sc) {
    v = test::random_tensor({E, R, K}, DType::F32, -400, 400).to(DType::F8E4M3).to(kGpu);
    sc = test::random_tensor({E, (R + bn - 1) / bn, (K + bk - 1) / bk}, DType::F32, 2e-4, 1e-3).to(kGpu);
  };
  Fp8Experts e;
  stack(2 * I, H, e.gate_up, e.gate_up_scales);
  stack(H, I, e.down, e.down_scales);
  e.block_n = bn, e.block_k = bk;
  return e;
}

struct MoeCase {
  int64_t T, H, I, E, k;
  bool norm;
};

// The CUDA block against the CPU expert loop on the routing the GPU chose (routing itself is compared
// above), and against the whole CPU moe_forward when x and the router are integers (same routing).
void check_moe(const MoeCase& c, DType d, bool integer_routing) {
  SCOPED_TRACE(str(dtype_name(d), " T=", c.T, " H=", c.H, " I=", c.I, " E=", c.E, " k=", c.k, c.norm ? " norm" : "",
                   integer_routing ? " integer routing" : ""));
  const Tensor x = integer_routing ? test::random_int_tensor({c.T, c.H}, d, -2, 2) : test::random_tensor({c.T, c.H}, d, -1, 1);
  const Tensor router = integer_routing ? test::random_int_tensor({c.E, c.H}, d, -1, 1)
                                        : test::random_tensor({c.E, c.H}, d, -1, 1);
  // Small enough that h stays well below 1: h is rounded to x's dtype on both sides, and where the two f32
  // values straddle a rounding boundary the references differ by one ulp of h times a down weight. Scaled
  // with H (gate and up have a standard deviation of about 0.2 at any H: at H = 256 a fixed 0.1 gave h
  // values near 2, whose one-ulp differences, summed over I, exceeded the f16 tolerance on small outputs).
  const double ws = integer_routing ? 0.3 / c.H : std::min(0.1, 0.6 / std::sqrt(static_cast<double>(c.H)));
  const Tensor gate_up = test::random_tensor({c.E, 2 * c.I, c.H}, d, -ws, ws);
  const Tensor down = test::random_tensor({c.E, c.H, c.I}, d, -0.3, 0.3);
  const Tensor xg = x.to(kGpu), rg = router.to(kGpu), gug = gate_up.to(kGpu), dg = down.to(kGpu);
  poison_next(c.T * c.H * static_cast<int64_t>(itemsize(d)));
  const Tensor out = moe_forward(xg, rg, gug, dg, c.k, c.norm);
  ASSERT_EQ(out.sizes(), x.sizes());
  ASSERT_EQ(out.dtype(), d);
  const MoeRouting r = moe_route(xg, rg, c.k, c.norm);
  Tensor ref = empty({c.T, c.H}, d);
  cpu::moe_experts(ref, x, r.experts.to(kCPU), r.weights.to(kCPU), gate_up, down);
  const test::Tolerance tol = moe_tolerance(d);
  EXPECT_TRUE(test::all_close(out.to(kCPU), ref, tol));
  if (integer_routing) EXPECT_TRUE(test::all_close(out.to(kCPU), moe_forward(x, router, gate_up, down, c.k, c.norm), tol));
}

TEST(CudaMoeForward, MatchesCpuOverTokensExpertsAndTopk) {
  KILN_REQUIRE_CUDA();
  for (GroupedMmPath path : kAutoAndEveryPath) {
    ForcePath force(path);
    SCOPED_TRACE(path_name(path));
    for (int64_t T : {1, 3, 64, 512})
      for (int64_t E : {1, 8, 128})
        for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{8}, E}) {
          if (k > E || k > 64 || (k == E && E > 8 && k != 1)) continue;
          if (path != GroupedMmPath::Auto && T == 512 && E == 128) continue;  // covered by Auto
          for (bool norm : {true, false}) {
            const DType d = kDtypes[(T + E + k + norm) % 3];
            check_moe(MoeCase{T, 40, 24, E, k, norm}, d, false);
          }
        }
  }
}

// The straight-run epilogue (the default; with and without its 16-byte stores) in the MoE block, and
// the same through the general epilogue: T = 300 tokens over 4 experts (groups with whole 128-row tiles and
// a partial one); gate_up's h with SiLU-mul,
// I = 192 (three whole 64-column output tiles, one whole 128-column one); down's f32 partials scattered to
// their rows, H = 256 (two whole 128-column tiles, one of 256).
TEST(CudaMoeForward, StraightRunEpilogueMatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (GroupedMmPath path : {GroupedMmPath::Tiled, GroupedMmPath::TiledTma, GroupedMmPath::TiledTma64, GroupedMmPath::TiledTmaWide,
                             GroupedMmPath::TiledTmaWidePair})
    // the general loop, the straight run, its 16-byte stores; those without skipping idle halves; the
    // staged epilogue (128-row TMA tiles)
    for (int form : {0, 1, 2, 3, 4}) {
      const bool fast = form > 0;
      ForcePath force(path);
      FastEpilogue fast_scope(fast);
      WideStores wide_scope(form >= 2);
      SkipIdleHalf skip_scope(form != 3);
      TmaStore store(form == 4);
      SCOPED_TRACE(str(path_name(path), fast ? " straight-run epilogue" : " general epilogue",
                       form >= 2 ? " (16-byte stores)" : "", form == 3 ? " without skipping idle halves" : "",
                       form == 4 ? " staged through shared memory" : ""));
      const bool tma = path != GroupedMmPath::Tiled;
      const int64_t before = tma ? cuda::grouped_tma_launches(path) : 0;
      const int64_t staged = cuda::grouped_tma_store_launches();
      for (DType d : {DType::BF16, DType::F16}) check_moe(MoeCase{300, 256, 192, 4, 2, true}, d, false);
      if (tma && cuda::wgmma_available(0))
        EXPECT_GT(cuda::grouped_tma_launches(path), before) << "the forced TMA kernel never ran";
      if (form == 4 && path != GroupedMmPath::Tiled && path != GroupedMmPath::TiledTma64 && cuda::wgmma_available(0))
        EXPECT_GT(cuda::grouped_tma_store_launches(), staged) << "the staged epilogue never ran";
    }
}

TEST(CudaMoeForward, EveryDtypeOddSizesAndIntegerRouting) {
  KILN_REQUIRE_CUDA();
  for (DType d : kDtypes)
    for (const MoeCase& c : {MoeCase{5, 16, 8, 1, 1, true}, MoeCase{4, 16, 8, 4, 4, false}, MoeCase{64, 8, 4, 32, 2, true},
                             MoeCase{7, 37, 21, 8, 2, true}, MoeCase{3, 40, 20, 8, 8, false}, MoeCase{33, 64, 1, 6, 3, true},
                             MoeCase{2000, 24, 16, 64, 8, true},  // thousands of tokens: 16000 rows
                             // one token (the one-warp routing): experts across lanes and ballots, k = E
                             MoeCase{1, 16, 8, 40, 6, true}, MoeCase{1, 24, 8, 200, 16, false}, MoeCase{1, 8, 4, 8, 8, true},
                             MoeCase{1, 8, 4, 256, 32, true}}) {
      check_moe(c, d, false);
      check_moe(c, d, true);
    }
}

// Qwen3-30B-A3B-like decode and a small prefill (E 128, H 2048, I 768, top-8).
TEST(CudaMoeForward, DecodeShapeOf128Experts) {
  KILN_REQUIRE_CUDA();
  const int64_t E = 128, H = 2048, I = 768;
  // Auto (T = 40 takes the tiles), and the other tile kernels at T = 40: many K steps and column tiles with
  // the SiLU-mul epilogue (with the TMA paths x's rows are first gathered into expert order).
  // One token also under the matrix-vector kernel's 6-blocks-per-SM register bound (act, routed rows).
  for (GroupedMmPath path : {GroupedMmPath::Auto, GroupedMmPath::TiledWide, GroupedMmPath::TiledTma, GroupedMmPath::TiledTma64, GroupedMmPath::TiledTmaWide, GroupedMmPath::TiledTmaWidePair, GroupedMmPath::TiledTmaCluster2, GroupedMmPath::TiledTmaCluster4})
  for (DType d : {DType::BF16, DType::F32})
    for (int64_t T : {1, 4, 40})
    for (int min_blocks : {1, 6}) {
      if (path != GroupedMmPath::Auto && (T != 40 || d != DType::BF16)) continue;
      if (min_blocks == 6 && (path != GroupedMmPath::Auto || T != 1)) continue;
      ForcePath force(path);
      DecodeMinBlocks bound(min_blocks);
      SCOPED_TRACE(str(path_name(path), " ", dtype_name(d), " T=", T, " one-row bound ", min_blocks, " blocks/SM"));
      Tensor gate_up = empty({E, 2 * I, H}, d, kGpu), down = empty({E, H, I}, d, kGpu);
      uniform_(gate_up, -0.03, 0.03);
      uniform_(down, -0.03, 0.03);
      const Tensor x = test::random_tensor({T, H}, d, -1, 1, kGpu), router = test::random_tensor({E, H}, d, -0.05, 0.05, kGpu);
      const Tensor out = moe_forward(x, router, gate_up, down, 8, true);
      const MoeRouting r = moe_route(x, router, 8, true);
      Tensor ref = empty({T, H}, d);
      cpu::moe_experts(ref, x.to(kCPU), r.experts.to(kCPU), r.weights.to(kCPU), gate_up.to(kCPU), down.to(kCPU));
      EXPECT_TRUE(test::all_close(out.to(kCPU), ref, d == DType::F32 ? test::Tolerance{1e-4, 1e-5} : test::Tolerance{1.6e-2, 1e-3}));
    }
}

// One token with k = 1, 2, 4, 8 slots: the combine fused into the down product (it must run: its launch count
// grows) gives bit for bit the output of the separate combine kernel (same f32 sums in the same order, one
// rounding) over every dtype, bf16/f16 FP8 experts included; k = 3 and 6 keep the separate kernel. Both, and
// the down product that waits before reading its row groups (EarlyDown off), give the same bits. Poisoned
// output memory; then against the CPU.
TEST(CudaMoeForward, OneTokenFusedCombineMatchesSeparateKernel) {
  KILN_REQUIRE_CUDA();
  const int64_t E = 16, H = 272, I = 96;
  for (DType d : kDtypes)
    for (int64_t k : {1, 2, 3, 4, 6, 8})
      for (bool fp8 : {false, true}) {
        if (fp8 && d == DType::F32) continue;  // f32 activations: dequantised experts, no decode kernel
        SCOPED_TRACE(str(dtype_name(d), " k=", k, fp8 ? " FP8 experts" : ""));
        const Tensor x = test::random_tensor({1, H}, d, -1, 1, kGpu), router = test::random_tensor({E, H}, d, -1, 1, kGpu);
        Tensor gate_up, down;
        Fp8Experts e;
        if (fp8) {
          e = random_fp8_experts(E, H, I, 16, 16);
        } else {
          gate_up = test::random_tensor({E, 2 * I, H}, d, -0.03, 0.03, kGpu);
          down = test::random_tensor({E, H, I}, d, -0.3, 0.3, kGpu);
        }
        auto run = [&](bool fused, bool early = true) {
          FusedCombine scope(fused);
          EarlyDown early_scope(early);
          poison_next(H * static_cast<int64_t>(itemsize(d)));
          return (fp8 ? moe_forward(x, router, e, k, true) : moe_forward(x, router, gate_up, down, k, true)).to(kCPU);
        };
        const int64_t before = cuda::moe_fused_combine_launches();
        const Tensor fused = run(true);
        EXPECT_EQ(cuda::moe_fused_combine_launches() > before, 8 % k == 0) << "the fused combine ran where it should";
        const int64_t mid = cuda::moe_fused_combine_launches();
        const Tensor separate = run(false);
        EXPECT_EQ(cuda::moe_fused_combine_launches(), mid) << "switched off, the fused combine still ran";
        EXPECT_TRUE(test::equal(fused, separate));
        EXPECT_TRUE(test::equal(run(true, false), fused)) << "the down product waiting first";
        EXPECT_TRUE(test::equal(run(false, false), separate)) << "the down product waiting first, separate combine";
        if (!fp8) {
          const MoeRouting r = moe_route(x, router, k, true);
          Tensor ref = empty({1, H}, d);
          cpu::moe_experts(ref, x.to(kCPU), r.experts.to(kCPU), r.weights.to(kCPU), gate_up.to(kCPU), down.to(kCPU));
          EXPECT_TRUE(test::all_close(fused, ref, moe_tolerance(d)));
        }
      }
}

TEST(CudaMoeForward, GraphCaptureAndReplay) {
  KILN_REQUIRE_CUDA();
  for (int64_t T : {1, 300}) {
    SCOPED_TRACE(str("T=", T));
    const int64_t E = 16, H = 64, I = 32;
    Tensor x = test::random_tensor({T, H}, DType::BF16, -1, 1, kGpu);
    const Tensor router = test::random_tensor({E, H}, DType::BF16, -1, 1, kGpu);
    const Tensor gate_up = test::random_tensor({E, 2 * I, H}, DType::BF16, -0.3, 0.3, kGpu);
    const Tensor down = test::random_tensor({E, H, I}, DType::BF16, -0.3, 0.3, kGpu);
    const Tensor eager = moe_forward(x, router, gate_up, down, 4, true).to(kCPU);
    Stream s = Stream::create(kGpu);
    Graph g;
    Tensor out;
    g.capture(s, [&] { out = moe_forward(x, router, gate_up, down, 4, true); });
    synchronize(kGpu);
    g.replay();
    s.synchronize();
    EXPECT_TRUE(test::equal(out.to(kCPU), eager));
    // New tokens in place: new routing, computed on the device by the replay.
    x.copy_(test::random_tensor({T, H}, DType::BF16, -1, 1, kGpu));
    const Tensor eager2 = moe_forward(x, router, gate_up, down, 4, true).to(kCPU);
    synchronize(kGpu);
    g.replay();
    s.synchronize();
    EXPECT_TRUE(test::equal(out.to(kCPU), eager2));
  }
}

// ---- experts in block formats ----------------------------------------------------------------------------------

BlockWeight block_on(const BlockWeight& w, Device d) {
  return std::visit([&](const auto& b) -> BlockWeight {
    using W = std::decay_t<decltype(b)>;
    if constexpr (requires { b.scales; }) return W{b.values.to(d), b.scales.to(d)};
    else return W{b.blocks.to(d)};
  }, w);
}

// moe_forward over block experts on CUDA against the CPU's on the same experts. One token runs the grouped
// int8 kernels, which quantise x and SiLU x up as the CPU does (the same codes and scales), so the two differ by
// the order of f32 sums (and in bf16 by where those move a rounding); more tokens multiply the experts
// dequantised (activations not quantised): within the CPU's 8-bit activation error of it. A captured graph
// replays the one-token block with new activations, routed on the device.
TEST(CudaMoeBlocks, MatchTheCpu) {
  KILN_REQUIRE_CUDA();
  using Case = test::BlockMoeCase;
  for (const Case& c : {Case{1, 256, 256, 8, 2, "q8_0", "q8_0", DType::F32}, Case{1, 256, 256, 16, 8, "q4_k", "q4_k", DType::BF16},
                        Case{1, 512, 64, 8, 4, "q4_k", "q4_0", DType::F16}, Case{1, 64, 32, 128, 8, "q4_0", "q8_0", DType::F32},
                        Case{6, 256, 256, 8, 2, "q4_k", "q8_0", DType::BF16}, Case{1, 256, 256, 8, 2, "q5_k", "q6_k", DType::BF16},
                        Case{1, 512, 256, 16, 4, "q6_k", "q5_k", DType::F32}, Case{5, 256, 256, 8, 2, "q5_k", "q6_k", DType::F16}}) {
    SCOPED_TRACE(c.name());
    const Tensor x = test::random_tensor({c.T, c.H}, c.dtype);
    const Tensor router = test::random_tensor({c.E, c.H}, c.dtype, -1, 1);
    const BlockExperts e = c.experts([](const Shape& s) { return test::random_tensor(s, DType::F32, -0.3, 0.3); });
    const BlockExperts eg{block_on(e.gate_up, kGpu), block_on(e.down, kGpu), c.E};
    const Tensor cpu = moe_forward(x, router, e, c.k, true).to(DType::F64);
    Tensor xg = x.to(kGpu);
    const Tensor rg = router.to(kGpu);
    const Tensor gpu = moe_forward(xg, rg, eg, c.k, true);
    ASSERT_EQ(gpu.sizes(), x.sizes());
    ASSERT_EQ(gpu.dtype(), c.dtype);
    const double scale = amax(abs(cpu)).item<double>();
    const double diff = amax(abs(sub(gpu.to(kCPU).to(DType::F64), cpu))).item<double>();
    const double rel = c.T > 1 ? 0.03 : c.dtype == DType::F32 ? 2e-3 : 2e-2;
    EXPECT_GT(scale, 0.05);
    EXPECT_LE(diff, rel * scale) << "scale " << scale;
    if (c.T != 1) continue;
    Stream s = Stream::create(kGpu);
    Graph g;
    Tensor out;
    g.capture(s, [&] { out = moe_forward(xg, rg, eg, c.k, true); });
    xg.copy_(test::random_tensor({1, c.H}, c.dtype, -2, 2, kGpu));
    const Tensor eager = moe_forward(xg, rg, eg, c.k, true).to(kCPU);
    synchronize(kGpu);
    g.replay();
    s.synchronize();
    EXPECT_TRUE(test::equal(out.to(kCPU), eager));
  }
}

// More experts than the tile kernels' offsets scan holds (E > 2048) with many routed rows: a clear error
// before anything runs; with one token (the decode kernel) the block still runs.
TEST(CudaMoeForward, TooManyExpertsForTheTilesIsAnError) {
  KILN_REQUIRE_CUDA();
  const int64_t E = 3000, H = 8, I = 8;
  const Tensor router = test::random_tensor({E, H}, DType::BF16, -1, 1, kGpu);
  const Tensor gate_up = test::random_tensor({E, 2 * I, H}, DType::BF16, -0.3, 0.3, kGpu);
  const Tensor down = test::random_tensor({E, H, I}, DType::BF16, -0.3, 0.3, kGpu);
  const Tensor many = test::random_tensor({800, H}, DType::BF16, -1, 1, kGpu);  // 6400 rows > 2 E: tiles
  EXPECT_TRUE(test::throws_error([&] { (void)moe_forward(many, router, gate_up, down, 8, true); },
                                 {"moe_forward", "E = 3000", "at most 2048"}));
  const Tensor one = test::random_tensor({1, H}, DType::BF16, -1, 1, kGpu);
  const Tensor out = moe_forward(one, router, gate_up, down, 8, true);
  const MoeRouting r = moe_route(one, router, 8, true);
  Tensor ref = empty({1, H}, DType::BF16);
  cpu::moe_experts(ref, one.to(kCPU), r.experts.to(kCPU), r.weights.to(kCPU), gate_up.to(kCPU), down.to(kCPU));
  EXPECT_TRUE(test::all_close(out.to(kCPU), ref, test::Tolerance{1.6e-2, 1e-3}));
  EXPECT_NO_THROW(synchronize(kGpu));
}

// ---- FP8 experts ----

// value x scale per element, f32 on the CPU ([E, R, K], scales [E, ceil(R / bn), ceil(K / bk)]).
Tensor dequant_cpu(const Tensor& v, const Tensor& s, int64_t bn, int64_t bk) {
  const int64_t E = v.size(0), R = v.size(1), K = v.size(2);
  const auto vv = v.to(DType::F32).contiguous().to_vector<float>(), sv = s.contiguous().to_vector<float>();
  std::vector<float> out(vv.size());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k)
        out[(e * R + r) * K + k] = vv[(e * R + r) * K + k] * sv[(e * s.size(1) + r / bn) * s.size(2) + k / bk];
  return from_vector<float>(out).view({E, R, K});
}

// The CUDA FP8 block against the double reference (tests/ops/moe_ref.h: h rounded to x's dtype, as the GPU
// stores it) on the routing the GPU chose. fp8_kernel: the case takes the FP8
// decode kernel, whose weights are value x scale in f32; otherwise the block runs on experts dequantised to
// x's dtype, and so does the reference (in bf16, where h rounds coarsely, the two weight roundings would flip
// many h values by an ulp).
void check_moe_fp8(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, int64_t bn, int64_t bk, DType d,
                   bool fp8_kernel) {
  SCOPED_TRACE(str(dtype_name(d), " T=", T, " H=", H, " I=", I, " E=", E, " k=", k, " blocks ", bn, "x", bk,
                   fp8_kernel ? " (FP8 kernel)" : " (dequantised experts)"));
  const Tensor x = test::random_tensor({T, H}, d, -1, 1, kGpu), router = test::random_tensor({E, H}, d, -1, 1, kGpu);
  const Fp8Experts e = random_fp8_experts(E, H, I, bn, bk);
  const Tensor &gu = e.gate_up, &gus = e.gate_up_scales, &dn = e.down, &dns = e.down_scales;
  poison_next(T * H * static_cast<int64_t>(itemsize(d)));
  const Tensor out = moe_forward(x, router, e, k, true);
  ASSERT_EQ(out.sizes(), x.sizes());
  ASSERT_EQ(out.dtype(), d);
  const MoeRouting r = moe_route(x, router, k, true);
  Tensor gw = dequant_cpu(gu.cpu(), gus.cpu(), bn, bk), dw = dequant_cpu(dn.cpu(), dns.cpu(), bn, bk);
  if (!fp8_kernel) {
    gw = gw.to(d).to(DType::F32);
    dw = dw.to(d).to(DType::F32);
  }
  const auto ref = test::moe_ref_routed(x, r, gw, dw, d);
  const Tensor expect = from_vector<double>(ref).view({T, H}).to(d);
  // Beyond the output rounding: f32 accumulation order (it differs between the kernels), and the rare h
  // whose f32 value sits on the other side of a rounding boundary than the double: one ulp of h (|h| up to
  // ~4 here: 4e-3 in f16, 3e-2 in bf16) times a down weight (|w| <= 0.4). One such h moves every output of
  // its token, so up to 1% of the elements may take the wider bound (with T = 1 a single flip put 4 of 2048
  // elements past the strict one on the H200); every element stays within it.
  const test::Tolerance tol = moe_tolerance(d);
  const test::Tolerance flip = d == DType::F16 ? test::Tolerance{2e-3, 2e-3} : test::Tolerance{1.6e-2, 1.6e-2};
  EXPECT_TRUE(test::all_close_but_few(out.to(kCPU), expect, tol, d == DType::F32 ? tol : flip, 1e-2));
  // The dequantised experts equal the CPU's value x scale exactly (f32), and in x's dtype its rounding of it
  // (the device writes that dtype directly).
  auto [gd, dd] = dequantize_fp8_experts(e, DType::F32);
  EXPECT_TRUE(test::equal(gd.cpu(), dequant_cpu(gu.cpu(), gus.cpu(), bn, bk)));
  EXPECT_TRUE(test::equal(dd.cpu(), dequant_cpu(dn.cpu(), dns.cpu(), bn, bk)));
  auto [gx, dx] = dequantize_fp8_experts(e, d);
  ASSERT_EQ(gx.dtype(), d);
  EXPECT_TRUE(test::equal(gx.cpu(), dequant_cpu(gu.cpu(), gus.cpu(), bn, bk).to(d)));
  EXPECT_TRUE(test::equal(dx.cpu(), dequant_cpu(dn.cpu(), dns.cpu(), bn, bk).to(d)));
}

TEST(CudaMoeForward, Fp8ExpertsMatchCpu) {
  KILN_REQUIRE_CUDA();
  for (DType d : {DType::BF16, DType::F16}) {
    check_moe_fp8(1, 256, 128, 16, 4, 128, 128, d, true);   // decode: the FP8 kernel, one row per expert
    check_moe_fp8(3, 256, 128, 16, 4, 128, 128, d, true);   // a few rows per expert: the FP8 kernel with row runs
    check_moe_fp8(1, 512, 256, 64, 8, 64, 32, d, true);     // non-square blocks
    check_moe_fp8(1, 2048, 768, 32, 8, 128, 128, d, true);  // the Qwen3-30B-A3B expert shape
    check_moe_fp8(64, 256, 128, 16, 4, 128, 128, d, false);  // many rows per expert: dequantised experts, tiles
    check_moe_fp8(2, 256, 128, 8, 2, 128, 8, d, false);     // K blocks of 8: not the FP8 kernel, dequantised
    check_moe_fp8(1, 40, 24, 8, 2, 16, 16, d, false);       // rows not multiples of 16 bytes: dequantised
  }
  check_moe_fp8(2, 256, 128, 8, 2, 128, 128, DType::F32, false);  // f32 activations: dequantised
}

TEST(CudaMoeForward, Fp8ExpertsGraphCaptureAndReplay) {
  KILN_REQUIRE_CUDA();
  const int64_t T = 1, H = 512, I = 256, E = 32;
  Tensor x = test::random_tensor({T, H}, DType::BF16, -1, 1, kGpu);
  const Tensor router = test::random_tensor({E, H}, DType::BF16, -1, 1, kGpu);
  const Fp8Experts e{test::random_tensor({E, 2 * I, H}, DType::F32, -400, 400).to(DType::F8E4M3).to(kGpu),
                     test::random_tensor({E, 2 * I / 128, H / 128}, DType::F32, 2e-4, 1e-3, kGpu),
                     test::random_tensor({E, H, I}, DType::F32, -400, 400).to(DType::F8E4M3).to(kGpu),
                     test::random_tensor({E, H / 128, I / 128}, DType::F32, 2e-4, 1e-3, kGpu), 128, 128};
  const Tensor eager = moe_forward(x, router, e, 8, true).to(kCPU);
  Stream s = Stream::create(kGpu);
  Graph g;
  Tensor out;
  g.capture(s, [&] { out = moe_forward(x, router, e, 8, true); });
  synchronize(kGpu);
  g.replay();
  s.synchronize();
  EXPECT_TRUE(test::equal(out.to(kCPU), eager));
  x.copy_(test::random_tensor({T, H}, DType::BF16, -1, 1, kGpu));
  const Tensor eager2 = moe_forward(x, router, e, 8, true).to(kCPU);
  synchronize(kGpu);
  g.replay();
  s.synchronize();
  EXPECT_TRUE(test::equal(out.to(kCPU), eager2));
}

#endif  // KILN_HAVE_CUDA

TEST(CudaMoe, BuildHasCuda) {
#if !KILN_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#endif
  KILN_REQUIRE_CUDA();
}

}  // namespace
}  // namespace kiln
