// CUDA launchers of grouped_mm, the fused MoE router and the MoE block (kernels in
// src/cuda/kernels/grouped_mm.cuh and src/cuda/kernels/moe.cuh). Every launch is asynchronous on the
// current stream; the offsets and routing stay on the device, so the block is graph-capturable.
#include "cuda/moe.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "core/dispatch.h"
#include "cuda/kernels/grouped_mm.cuh"
#include "cuda/kernels/moe.cuh"
#include "cuda/launch.h"
#include "cuda/linear.h"
#include "cuda/moe_sm90.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {

using kernels::GmmArgs;
using kernels::GmmMode;

// The initial value from KILN_GROUPED_MM_PATH (auto, decode, tiled, tiled-wide, tma, tma-64, tma-wide,
// tma-wide-pair, tma-cluster2, tma-cluster4, portable).
GroupedMmPath path_from_env() {
  const char* v = std::getenv("KILN_GROUPED_MM_PATH");
  if (!v || !*v) return GroupedMmPath::Auto;
  const std::string s(v);
  if (s == "auto") return GroupedMmPath::Auto;
  if (s == "decode") return GroupedMmPath::Decode;
  if (s == "tiled") return GroupedMmPath::Tiled;
  if (s == "tiled-wide") return GroupedMmPath::TiledWide;
  if (s == "tma") return GroupedMmPath::TiledTma;
  if (s == "tma-64") return GroupedMmPath::TiledTma64;
  if (s == "tma-wide") return GroupedMmPath::TiledTmaWide;
  if (s == "tma-wide-pair") return GroupedMmPath::TiledTmaWidePair;
  if (s == "tma-cluster2") return GroupedMmPath::TiledTmaCluster2;
  if (s == "tma-cluster4") return GroupedMmPath::TiledTmaCluster4;
  if (s == "portable") return GroupedMmPath::TiledPortable;
  throw Error(str("KILN_GROUPED_MM_PATH=", s, " is not one of auto, decode, tiled, tiled-wide, tma, tma-64, tma-wide, ",
                  "tma-wide-pair, tma-cluster2, tma-cluster4, portable"));
}
std::atomic<GroupedMmPath>& forced_path() {
  static std::atomic<GroupedMmPath> p{path_from_env()};
  return p;
}

// An on/off switch from an environment variable (0 or 1), or `fallback` when unset.
bool switch_from_env(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  const std::string s(v);
  KILN_CHECK(s == "0" || s == "1", name, "=", s, " is not 0 or 1");
  return s == "1";
}

// A setting from an environment variable that takes one of a few small integers (written as they are), or
// 0 when unset or empty (every such setting's default).
int choice_from_env(const char* name, std::initializer_list<int> allowed) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  const std::string s(v);
  std::string listed;
  for (int a : allowed) {
    if (s == std::to_string(a)) return a;
    listed += (listed.empty() ? "" : ", ") + std::to_string(a);
  }
  throw Error(str(name, "=", s, " is not one of ", listed));
}

// A row bound of Auto's tile choice from an environment variable (a count >= 0), or `fallback`.
int64_t rows_from_env(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  KILN_CHECK(end && *end == '\0' && n >= 0, name, "=", v, " is not a count >= 0");
  return n;
}

// Auto takes 64-row TMA tiles up to this many rows per group on average (KILN_GMM_TMA64_ROWS=N overrides;
// 0: never). TUNE (H200, 2026-12-03): at 16 and 32 rows a group (T512 over 256 and
// 128 experts) 64-row tiles took grouped_mm from 0.65-1.12x PyTorch to 1.16-1.24x and the MoE block from
// 1.19-1.32x to 1.48-1.55x; at 64 (T512 over 64 experts) grouped_mm gained (0.96-1.06x to 1.16-1.17x) but
// the MoE block, whose routed groups are uneven (a group past 64 rows reads its weights once per 64-row
// tile), lost (1.43x to 1.31x), hence 48; at 128 rows and more 64-row tiles were slower.
int64_t tma64_max_rows() {
  static const int64_t n = rows_from_env("KILN_GMM_TMA64_ROWS", 48);
  return n;
}

// Auto takes 128 x 256 TMA tiles from this many rows per group on average (KILN_GMM_WIDE_ROWS=N overrides;
// 0: never). TUNE (H200, 2026-12-03, both with the straight-run epilogue): at 256
// and 512 rows a group (T4096 over 128 and 64 experts) they took grouped_mm from 0.68-0.79x PyTorch to
// 0.77-0.96x (a quarter fewer bytes received per product); at 128 rows (T4096 over 256 experts) they tied
// on gate_up and lost on down (264 against 248 us), at 64 rows and fewer they lost everywhere. With
// the idle warpgroup of a group's last tile skipping its MMAs (GmmArgs::skip_idle_half): at 128
// rows they win (T4096 over 256 experts, down 240.8 -> 214.5 us, gate_up 343.3 -> 340.1), hence 96.
int64_t wide_min_rows() {
  static const int64_t n = rows_from_env("KILN_GMM_WIDE_ROWS", 96);
  return n;
}

// Auto takes pairs of 128 x 256 tiles sharing each B tile (TmaWidePair) where the wide tiles apply and groups
// hold [192, 384) rows on average: two to three 128-row tiles a group, so the pairs are mostly full.
// TUNE (H200, 2026-12-04): at 256 rows a group (T4096 over 128 experts) pairs were never slower than
// single wide tiles in three runs on three machines (gate_up 0 to 5% faster, down 0 to 15%); at 512 rows (64 experts) 0.3-1.8% slower, at 128 rows (256
// experts, one m-tile a group: the second block of a pair only relays B) 23-42% slower.
constexpr int64_t kPairMinRows = 192, kPairEndRows = 384;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The matrix-vector kernel while groups are small on average (M rows over G groups): then a 64-row tile
// would be mostly padding and each expert's weights are read about once either way.
// TUNE (H200, `kiln bench ops`): the crossover, e.g. 64 tokens x top-8 over 128 experts (4 rows a group).
bool use_decode(int64_t m, int64_t g) {
  const GroupedMmPath f = forced_path().load(std::memory_order_relaxed);
  if (m > 65535) return false;  // grid.y holds one row slot per row
  if (f != GroupedMmPath::Auto) return f == GroupedMmPath::Decode;  // Tiled, TiledPortable: tiles
  return m <= 16 || m <= 2 * g;
}

// The Hopper tile kernel for the path. Auto: the TMA kernel, with 64 x 128 tiles where groups hold at most
// tma64_max_rows() rows on average (48 by default), 128 x 256 tiles from wide_min_rows() (96), in pairs
// sharing B for [kPairMinRows, kPairEndRows), else 128 x 128 (p: the product; null, 128 x 128).
// TUNE (H200, `kiln bench ops --filter 'grouped_mm|^moe/bf16'`, 2026-12-03): against the cp.async
// kernel the TMA kernel took grouped_mm T512/T4096 from 0.60-0.93x PyTorch to 0.54-1.11x (geomean up, 10 of
// 12 shapes faster) and the MoE block at T512 from 1.05-1.24x to 1.13-1.44x.
Gmm90Kernel sm90_kernel(GroupedMmPath f, const GmmArgs* p = nullptr) {
  if (f == GroupedMmPath::Auto && p) {
    const int64_t rows = p->mode == GmmMode::RowGroups ? p->M / std::max(p->G, 1) : p->M;
    if (rows <= tma64_max_rows()) return Gmm90Kernel::Tma64;
    const int64_t wide = wide_min_rows();
    if (wide <= 0 || rows < wide) return Gmm90Kernel::Tma;
    return rows >= kPairMinRows && rows < kPairEndRows ? Gmm90Kernel::TmaWidePair : Gmm90Kernel::TmaWide;
  }
  switch (f) {
    case GroupedMmPath::Tiled: return Gmm90Kernel::CpAsync;
    case GroupedMmPath::TiledWide: return Gmm90Kernel::CpAsyncWide;
    case GroupedMmPath::TiledTma64: return Gmm90Kernel::Tma64;
    case GroupedMmPath::TiledTmaWide: return Gmm90Kernel::TmaWide;
    case GroupedMmPath::TiledTmaWidePair: return Gmm90Kernel::TmaWidePair;
    case GroupedMmPath::TiledTmaCluster2: return Gmm90Kernel::TmaCluster2;
    case GroupedMmPath::TiledTmaCluster4: return Gmm90Kernel::TmaCluster4;
    default: return Gmm90Kernel::Tma;
  }
}

// Whether the tile products take a TMA kernel where it applies: then the MoE block gathers x's rows into
// expert order first, since that kernel reads A by boxes, not by a list of rows.
bool tma_tiles(int device) {
  const GroupedMmPath f = forced_path().load(std::memory_order_relaxed);
  if (f == GroupedMmPath::TiledPortable) return false;
  const Gmm90Kernel k = sm90_kernel(f);
  return k != Gmm90Kernel::CpAsync && k != Gmm90Kernel::CpAsyncWide && wgmma_available(device);
}

// Warps per weight-row group of the decode kernel: enough warps for ~16 per SM assuming every row slot
// works (one row per group, the decode case), more only while each thread keeps >= 2 chunks of K.
// Measured on the H200: forcing 2 or 4 warps, or the split whose grid best fills its rounds of resident
// blocks, was slower at every one-token shape (2026-12-03: T1 E128 gate_up 17.8 us against 18.2 / 21.5 /
// 21.4); aiming at 32 warps per SM gives E256 gate_up (8 rows x 512 column pairs) split 2, where split 1 took
// 10.47 against 11.86 us (2026-12-04; every other shape split 1 either way).
// KILN_GMM_DECODE_SPLIT=1|2|4|8 forces the split of every decode launch (a tuning knob for A/B runs; unset or 0:
// the rule).
int forced_decode_split() {
  static const int n = choice_from_env("KILN_GMM_DECODE_SPLIT", {0, 1, 2, 4, 8});
  return n;
}
int decode_split(int64_t m, int64_t n, int64_t k, int vec_elems, bool vec, bool act, int device) {
  if (const int f = forced_decode_split(); f > 0) return f;
  const int64_t cols_per_group = act ? kernels::kDecR / 2 : kernels::kDecR;
  const int64_t groups = m * ((n + cols_per_group - 1) / cols_per_group);
  const int64_t want = static_cast<int64_t>(multiprocessor_count(device)) * 16;
  const int64_t units = vec ? k / vec_elems : k;
  int split = 1;
  while (split < kernels::kDecWarps && groups * split < want && units >= 32 * 2 * split) split *= 2;
  return split;
}

// The decode kernel with one A row per block: when each row has its own block anyway (row_groups: the MoE
// routing's one row per block), or when there are so few rows (at most 16) that reading an expert once per
// row instead of once per kDecRows rows costs at most those 16 expert reads, as 16 distinct experts would.
// Measured on the H200: 8-23% faster for one-token MoE layers (bf16 and FP8 experts) than four rows per block.
bool decode_one_row(const GmmArgs& p) { return p.row_groups != nullptr || p.M <= 16; }

// The one-row decode instance's register bound (kernels::gmm_decode_kernel's MINB): 0 (the default, as 1),
// 1 (the compiler's choice: 56 registers in the 16-bit instances, 4 blocks of 256 threads per SM; 48 and 5
// in f32) or 6 (at most 40 registers, 6 blocks per SM; ptxas spills 32 bytes in the bf16 and f16 instances); also
// KILN_GMM_DECODE_MINB=0|1|6. FP8 experts keep 1 (at 40 registers they spill 184 bytes).
std::atomic<int>& decode_min_blocks_ref() {
  static std::atomic<int> n{choice_from_env("KILN_GMM_DECODE_MINB", {0, 1, 6})};
  return n;
}
int decode_min_blocks() { return decode_min_blocks_ref().load(std::memory_order_relaxed); }

// Whether the one-row decode instance takes the 40-register bound: only when asked (KILN_GMM_DECODE_MINB=6 or
// set_grouped_decode_min_blocks(6)). It fits some grids into one round of resident blocks instead of two,
// which paid while each block scanned the offsets (one-token grouped_mm over 128 experts, gate_up: 768
// blocks, 17.14 -> 16.39 us, H200, 2026-12-03). With the warps' own lookup the compiler's instance is faster
// there in two rounds of 528 blocks (15.80 against 16.48 us, 2026-12-04) and as fast or faster at every other
// one-token shape (the spilling instance 13-22% slower on the downs).
bool decode_take_min6() { return decode_min_blocks() == 6; }

// The Hopper tile kernels' straight-run epilogue (GmmArgs::fast_epilogue): on by default;
// KILN_GMM_FAST_EPILOGUE=0 or set_grouped_fast_epilogue(false) gives the general loop for every tile.
// Measured on the H200 (2026-12-03, one run): grouped_mm T512/T4096 faster at all
// 12 shapes (e.g. T512 E64 down 140.5 -> 112.0 us, T4096 E256 down 320.8 -> 248.0), geomean over the 18
// grouped_mm cases 1.10 -> 1.20x PyTorch, MoE block at T512 1.42-1.53x -> 1.49-1.58x; decode unchanged.
std::atomic<bool>& fast_epilogue_ref() {
  static std::atomic<bool> on{switch_from_env("KILN_GMM_FAST_EPILOGUE", true)};
  return on;
}

// The straight run's 16-byte stores of 16-bit C (GmmArgs::wide_stores): on by default;
// KILN_GMM_WIDE_STORES=0 or set_grouped_wide_stores(false) gives the 4-byte pairs. Measured on the H200
// (2026-12-03, one run): grouped_mm T4096 3-13% faster at all 6 shapes (E128 down
// 280.3 -> 242.6 us, E256 down 261.9 -> 225.5), the 128 x 256 kernel's store-queue stalls 2.9 -> 0.01 per
// issued instruction and its tensor pipe 48% -> 53% busy; T512, T1 and the MoE block within noise.
std::atomic<bool>& wide_stores_ref() {
  static std::atomic<bool> on{switch_from_env("KILN_GMM_WIDE_STORES", true)};
  return on;
}

// The Hopper 128-row tile kernels skip the MMAs of a warpgroup whose 64 rows all lie past the tile's end
// (GmmArgs::skip_idle_half): on by default; KILN_GMM_SKIP_IDLE_HALF=0 or set_grouped_skip_idle_half(false)
// multiplies every tile's 128 rows. A group's last tile holds at most 64 of its rows about half the time at
// prefill sizes (e.g. 4096 tokens over 128 experts: 256 +- 16 rows a group).
std::atomic<bool>& skip_idle_half_ref() {
  static std::atomic<bool> on{switch_from_env("KILN_GMM_SKIP_IDLE_HALF", true)};
  return on;
}

// The staged C epilogue of the 128-row TMA tiles (moe.h, set_grouped_tma_store).
std::atomic<bool>& tma_store_ref() {
  static std::atomic<bool> on{switch_from_env("KILN_GMM_TMA_STORE", true)};
  return on;
}

// One token's down product reading its row groups before its dependent-launch wait (moe.h, set_moe_early_down).
std::atomic<bool>& early_down_ref() {
  static std::atomic<bool> on{switch_from_env("KILN_MOE_EARLY_DOWN", true)};
  return on;
}

// The MoE combine fused into one token's down product (moe.h, set_moe_fused_combine) and its launches.
std::atomic<bool>& fused_combine_ref() {
  static std::atomic<bool> on{switch_from_env("KILN_MOE_FUSED_COMBINE", true)};
  return on;
}
std::atomic<int64_t> fused_combines{0};

// The decode kernel: grid, shared memory and the rows-per-block instance. F8: B holds FP8 experts (vec).
template <class T, bool F8>
void launch_gmm_decode(const GmmArgs& p, bool vec, int vec_elems, int device, cudaStream_t stream, const char* op) {
  // The fused combine (GmmArgs::comb_weights): the warps of a block split among the M rows.
  const bool fuse = p.comb_weights != nullptr;
  const int split = fuse ? kernels::kDecWarps / p.M : decode_split(p.M, p.N, p.K, vec_elems, vec, p.act, device);
  const int64_t cols = fuse ? kernels::kDecR : kernels::gmm_decode_cols_per_block(split, p.act);
  const int64_t gx = (p.N + cols - 1) / cols;
  KILN_CHECK(gx <= INT_MAX, op, ": N = ", p.N, " needs too many blocks");
  const dim3 grid(static_cast<unsigned>(gx), fuse ? 1u : static_cast<unsigned>(p.M));
  auto go = [&](auto kernel) {
    launch_dependent(kernel, grid, dim3(kernels::kDecThreads), 0, stream, device, op, p, split, vec);
  };
  if (!decode_one_row(p)) {
    go(kernels::gmm_decode_kernel<T, F8>);
  } else if constexpr (F8) {  // the early down product and the gate_up ahead of it: FP8 experts only
    if (p.groups_before_wait && p.row_groups != nullptr)
      go(kernels::gmm_decode_kernel<T, F8, 1, 1, kernels::kDecEarly>);
    else if (p.dependents_after_wait)
      go(kernels::gmm_decode_kernel<T, F8, 1, 1, kernels::kDecAfterWait>);
    else
      go(kernels::gmm_decode_kernel<T, F8, 1>);
  } else if (!decode_take_min6())
    go(kernels::gmm_decode_kernel<T, F8, 1>);
  else go(kernels::gmm_decode_kernel<T, F8, 1, 6>);
}

// Launches one grouped product (p fully described except the pointers' alignment checks). T: input type.
template <class T>
void launch_gmm(const GmmArgs& p, bool decode, int device, cudaStream_t stream, const char* op) {
  constexpr int64_t isz = sizeof(T);
  constexpr int vec_elems = static_cast<int>(16 / isz);
  auto al = [](int64_t stride) { return (stride * isz) % 16 == 0; };
  if (decode) {
    const bool vec = p.a_sk == 1 && p.b_sk == 1 && p.K % vec_elems == 0 && aligned16(p.a) && aligned16(p.b) &&
                     al(p.a_sm) && al(p.b_sn) && al(p.b_sg);
    launch_gmm_decode<T, false>(p, vec, vec_elems, device, stream, op);
  } else {
    const bool vec = p.mode != GmmMode::KGroups && p.a_sk == 1 && p.b_sk == 1 && p.K % vec_elems == 0 &&
                     aligned16(p.a) && aligned16(p.b) && al(p.a_sm) && al(p.a_sg) && al(p.b_sn) && al(p.b_sg);
    if constexpr (!std::is_same_v<T, float>) {
      const GroupedMmPath f = forced_path().load(std::memory_order_relaxed);
      GmmArgs q = p;
      q.fast_epilogue = fast_epilogue_ref().load(std::memory_order_relaxed);
      q.wide_stores = wide_stores_ref().load(std::memory_order_relaxed);
      q.skip_idle_half = skip_idle_half_ref().load(std::memory_order_relaxed);
      if (vec && p.mode != GmmMode::KGroups && f != GroupedMmPath::TiledPortable &&
          launch_gmm_sm90(q, std::is_same_v<T, BFloat16>, sm90_kernel(f, &q), device, stream, op))
        return;
    }
    const int64_t ncols = kernels::gmm_tile_cols(p.act);
    const int64_t gx = (p.N + ncols - 1) / ncols;  // <= INT_MAX: N is an int
    const int64_t mt = (static_cast<int64_t>(p.M) + kernels::kBM - 1) / kernels::kBM;
    dim3 grid;
    size_t smem = 0;
    if (p.mode == GmmMode::RowGroups) {
      KILN_CHECK(mt + p.G + 1 <= 65535, op, ": M = ", p.M, " rows in ", p.G, " groups is too large for one launch (at most ",
                 (65535 - p.G - 1) * kernels::kBM, " rows)");
      grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(mt + p.G + 1), 1);
      smem = static_cast<size_t>(2 * p.G + 1) * sizeof(int);
    } else {
      KILN_CHECK(mt <= 65535 && p.G <= 65535, op, ": ", p.G, " groups of ", p.M, " rows is too large for one launch");
      grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(mt), static_cast<unsigned>(p.G));
      if (p.mode == GmmMode::KGroups) smem = static_cast<size_t>(p.G) * sizeof(int);
    }
    kernels::gmm_tile_kernel<T><<<grid, kernels::kTileThreads, smem, stream>>>(p, vec);
  }
  check_launch(op);
}

// The decode kernel over FP8 experts (p.b FP8 with p.b_scales), activations T (f16/bf16); the caller has
// checked that every row takes 16-byte loads.
template <class T>
void launch_gmm_fp8(const GmmArgs& p, int device, cudaStream_t stream, const char* op) {
  launch_gmm_decode<T, true>(p, true, 16, device, stream, op);
  check_launch(op);
}

// Dispatch on the inputs' dtype (the one point where it becomes a template argument).
void run_gmm(const GmmArgs& p, DType dtype, bool decode, Device dev, const char* op) {
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  if (p.b_scales) {  // FP8 experts: decode kernel only (checked by the caller)
    visit_dtypes<dset(DType::F16, DType::BF16)>(dtype, op, [&](auto tag) {
      launch_gmm_fp8<typename decltype(tag)::type>(p, dev.index, stream, op);
    });
    return;
  }
  visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(dtype, op, [&](auto tag) {
    launch_gmm<typename decltype(tag)::type>(p, decode, dev.index, stream, op);
  });
}

// log2(v) when v is a power of two, else -1.
int log2_exact(int v) {
  if (v <= 0 || (v & (v - 1)) != 0) return -1;
  int s = 0;
  while ((1 << s) < v) ++s;
  return s;
}

int to_int(int64_t v, const char* op, const char* what) {
  KILN_CHECK(v >= 0 && v <= INT_MAX - 2 * kernels::kBM, op, ": ", what, " = ", v, " is too large for the CUDA kernels (at most ",
             INT_MAX - 2 * kernels::kBM, ")");
  return static_cast<int>(v);
}

}  // namespace

void set_forced_grouped_mm_path(GroupedMmPath p) { forced_path().store(p, std::memory_order_relaxed); }

void set_grouped_decode_min_blocks(int n) {
  KILN_CHECK(n == 0 || n == 1 || n == 6, "set_grouped_decode_min_blocks: expected 0, 1 or 6, got ", n);
  decode_min_blocks_ref().store(n, std::memory_order_relaxed);
}
int grouped_decode_min_blocks() { return decode_min_blocks(); }

void set_grouped_fast_epilogue(bool on) { fast_epilogue_ref().store(on, std::memory_order_relaxed); }
bool grouped_fast_epilogue() { return fast_epilogue_ref().load(std::memory_order_relaxed); }

void set_grouped_wide_stores(bool on) { wide_stores_ref().store(on, std::memory_order_relaxed); }
bool grouped_wide_stores() { return wide_stores_ref().load(std::memory_order_relaxed); }

void set_grouped_tma_store(bool on) { tma_store_ref().store(on, std::memory_order_relaxed); }
bool grouped_tma_store() { return tma_store_ref().load(std::memory_order_relaxed); }
void set_moe_early_down(bool on) { early_down_ref().store(on, std::memory_order_relaxed); }
bool moe_early_down() { return early_down_ref().load(std::memory_order_relaxed); }
void set_moe_fused_combine(bool on) { fused_combine_ref().store(on, std::memory_order_relaxed); }
bool moe_fused_combine() { return fused_combine_ref().load(std::memory_order_relaxed); }
int64_t moe_fused_combine_launches() { return fused_combines.load(std::memory_order_relaxed); }

void set_grouped_skip_idle_half(bool on) { skip_idle_half_ref().store(on, std::memory_order_relaxed); }
bool grouped_skip_idle_half() { return skip_idle_half_ref().load(std::memory_order_relaxed); }

int64_t grouped_tma_launches(GroupedMmPath path) {
  KILN_CHECK(path == GroupedMmPath::TiledTma || path == GroupedMmPath::TiledTma64 || path == GroupedMmPath::TiledTmaWide ||
                 path == GroupedMmPath::TiledTmaWidePair || path == GroupedMmPath::TiledTmaCluster2 ||
                 path == GroupedMmPath::TiledTmaCluster4,
             "grouped_tma_launches: expected a TMA path");
  return gmm_tma_launches(sm90_kernel(path));
}

void grouped_mm(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor* offs) {
  const char* op = "grouped_mm";
  const Device dev = out.device();
  check_same_device(op, dev, a);
  check_same_device(op, dev, b);
  if (offs) check_same_device(op, dev, *offs);
  if (out.numel() == 0) return;
  GmmArgs p{};
  p.out_f32 = out.dtype() == DType::F32 && a.dtype() != DType::F32;
  p.c = out.data_ptr();
  p.err = device_error_record(dev.index);
  const Tensor o = offs ? offs->contiguous() : Tensor();
  p.offs = offs ? o.data<const int32_t>() : nullptr;
  p.G = offs ? static_cast<int>(offs->numel()) : 0;
  const bool has_offs = offs != nullptr;
  if (has_offs)
    KILN_CHECK(p.G <= kernels::kGmmMaxGroups, op, ": ", p.G, " groups; the CUDA kernels take at most ",
               kernels::kGmmMaxGroups, " (offsets are scanned in shared memory)");
  bool decode = false;
  if (a.dim() == 2 && b.dim() == 3) {  // rows grouped
    p.mode = GmmMode::RowGroups;
    p.a = a.data_ptr(), p.a_sg = 0, p.a_sm = a.stride(0), p.a_sk = a.stride(1);
    p.b = b.data_ptr(), p.b_sg = b.stride(0), p.b_sk = b.stride(1), p.b_sn = b.stride(2);
    p.c_sg = 0, p.c_sm = out.stride(0), p.c_sn = out.stride(1);
    p.M = to_int(a.size(0), op, "M"), p.N = to_int(b.size(2), op, "N"), p.K = to_int(a.size(1), op, "K");
    decode = use_decode(p.M, p.G);
  } else if (a.dim() == 3 && b.dim() == 2) {
    // Columns grouped: out^T [N, M] = b^T [N, K] @ a[g]^T [K, M] with the rows of out^T grouped, as above.
    p.mode = GmmMode::RowGroups;
    p.a = b.data_ptr(), p.a_sg = 0, p.a_sm = b.stride(1), p.a_sk = b.stride(0);
    p.b = a.data_ptr(), p.b_sg = a.stride(0), p.b_sk = a.stride(2), p.b_sn = a.stride(1);
    p.c_sg = 0, p.c_sm = out.stride(1), p.c_sn = out.stride(0);
    p.M = to_int(b.size(1), op, "N"), p.N = to_int(a.size(1), op, "M"), p.K = to_int(a.size(2), op, "K");
    decode = use_decode(p.M, p.G);
  } else if (a.dim() == 2 && b.dim() == 2) {  // K grouped
    p.mode = GmmMode::KGroups;
    p.a = a.data_ptr(), p.a_sg = 0, p.a_sm = a.stride(0), p.a_sk = a.stride(1);
    p.b = b.data_ptr(), p.b_sg = 0, p.b_sk = b.stride(0), p.b_sn = b.stride(1);
    p.c_sg = out.stride(0), p.c_sm = out.stride(1), p.c_sn = out.stride(2);
    p.M = to_int(a.size(0), op, "M"), p.N = to_int(b.size(1), op, "N"), p.K = to_int(a.size(1), op, "K");
  } else {  // batched
    p.mode = GmmMode::Batched;
    p.G = to_int(a.size(0), op, "G");
    p.a = a.data_ptr(), p.a_sg = a.stride(0), p.a_sm = a.stride(1), p.a_sk = a.stride(2);
    p.b = b.data_ptr(), p.b_sg = b.stride(0), p.b_sk = b.stride(1), p.b_sn = b.stride(2);
    p.c_sg = out.stride(0), p.c_sm = out.stride(1), p.c_sn = out.stride(2);
    p.M = to_int(a.size(1), op, "M"), p.N = to_int(b.size(2), op, "N"), p.K = to_int(a.size(2), op, "K");
  }
  if (p.M == 0 || p.N == 0) return;
  run_gmm(p, a.dtype(), decode, dev, op);
}

namespace {

// Whether the fused routing kernels (a warp per token, E values over its lanes) take E experts.
bool fused_route(int64_t E) { return E <= kernels::kRouteMaxExperts; }

MoeRouting route_composed(const Tensor& logits, int64_t top_k, bool norm_topk_prob, DType dtype) {
  const Tensor probs = softmax(logits, -1, DType::F32);
  auto [values, indices] = topk(probs, top_k);
  if (norm_topk_prob) values = div(values, sum(values, {-1}, true));
  return MoeRouting{values.to(dtype), indices.to(DType::I32)};
}

}  // namespace

MoeRouting moe_route(const Tensor& x, const Tensor& router_weight, int64_t top_k, bool norm_topk_prob) {
  const Device dev = x.device();
  check_same_device("moe_route", dev, router_weight);
  const Tensor logits = cuda::linear(x, router_weight, std::nullopt);
  const int64_t T = x.size(0), E = router_weight.size(0);
  if (!fused_route(E)) return route_composed(logits, top_k, norm_topk_prob, x.dtype());
  MoeRouting r{empty({T, top_k}, x.dtype(), dev), empty({T, top_k}, DType::I32, dev)};
  if (T == 0) return r;
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  constexpr int64_t warps = kernels::kRouteThreads / 32;
  const int64_t blocks = (T + warps - 1) / warps;
  KILN_CHECK(blocks <= INT_MAX, "moe_route: T = ", T, " is too large for one launch");
  visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(x.dtype(), "moe_route", [&](auto tag) {
    using X = typename decltype(tag)::type;
    kernels::moe_route_kernel<X><<<static_cast<unsigned>(blocks), kernels::kRouteThreads, 0, stream>>>(
        logits.data<const X>(), logits.stride(0), T, static_cast<int>(E), static_cast<int>(top_k), norm_topk_prob,
        r.weights.data<X>(), r.experts.data<int32_t>());
  });
  check_launch("moe_route");
  return r;
}

namespace {

// The FP8 experts' scales and blocks (null: plain experts).
struct ExpertScales {
  Tensor gate_up, down;
  int64_t block_n, block_k;
};

// The MoE block; with `f8`, gate_up/down are FP8 values and the expert products take the FP8 decode kernel.
// Returns an undefined tensor (having launched nothing) when f8 is given and that kernel does not apply.
Tensor moe_forward_impl(const Tensor& x_in, const Tensor& router_weight, const Tensor& gate_up_in,
                        const Tensor& down_in, int64_t top_k, bool norm_topk_prob, const ExpertScales* f8) {
  const char* op = "moe_forward";
  const Device dev = x_in.device();
  const int64_t T = x_in.size(0), H = x_in.size(1), E = gate_up_in.size(0), I = down_in.size(2);
  const Tensor x = x_in.contiguous(), gate_up = gate_up_in.contiguous(), down = down_in.contiguous();
  const int P = to_int(T * top_k, op, "tokens x top_k");
  if (f8) {
    // The FP8 kernel: decode shapes, f16/bf16 activations, 16-byte rows, K blocks of whole chunks.
    const bool fits = use_decode(P, E) && (x.dtype() == DType::BF16 || x.dtype() == DType::F16) && I > 0 &&
                      H % 16 == 0 && I % 16 == 0 && f8->block_k % 16 == 0 && aligned16(x.data_ptr()) &&
                      aligned16(gate_up.data_ptr()) && aligned16(down.data_ptr()) && (H * x.itemsize()) % 16 == 0 &&
                      (I * x.itemsize()) % 16 == 0 && f8->gate_up.is_contiguous() && f8->down.is_contiguous();
    if (!fits) return Tensor();
  }
  Tensor out = empty({T, H}, x_in.dtype(), dev);
  if (T == 0 || H == 0) return out;
  KILN_CHECK(E <= kernels::kPermuteMaxExperts, op, ": E = ", E, " experts; the CUDA permutation takes at most ",
             kernels::kPermuteMaxExperts);
  // The tile kernels scan the offsets in shared memory (2 E + 1 ints); the decode kernel takes E <= 4096.
  KILN_CHECK(use_decode(P, E) || E <= kernels::kGmmMaxGroups, op, ": E = ", E, " experts with ", P,
             " routed rows; the CUDA tile kernels take at most ", kernels::kGmmMaxGroups, " experts");
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);

  // Routing and the token -> expert permutation: offs [E] (int32 cumulative ends), the rows in expert
  // order. Up to kFusedRouteTokens tokens both run in one block (decode: one launch less).
  constexpr int64_t kFusedRouteTokens = 64;
  const Tensor offs = empty({E}, DType::I32, dev);
  const Tensor rows_tok = empty({P}, DType::I32, dev), rows_pair = empty({P}, DType::I32, dev);
  const size_t perm_smem = static_cast<size_t>(2 * E) * sizeof(int);
  MoeRouting r;
  // One token: the routing also gives each row's expert, and the decode kernels skip the offsets scan.
  Tensor rows_expert;
  const int32_t* row_groups = nullptr;
  if (fused_route(E) && T == 1) {
    rows_expert = empty({P}, DType::I32, dev);
    // One token: one warp routes and permutes.
    const Tensor logits = cuda::linear(x, router_weight, std::nullopt);
    r = MoeRouting{empty({T, top_k}, x.dtype(), dev), empty({T, top_k}, DType::I32, dev)};
    visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(x.dtype(), op, [&](auto tag) {
      using X = typename decltype(tag)::type;
      launch_dependent(kernels::moe_route_one_kernel<X>, dim3(1), dim3(32), 0, stream, dev.index, op,
          logits.data<const X>(), static_cast<int>(E), static_cast<int>(top_k), norm_topk_prob, r.weights.data<X>(),
          r.experts.data<int32_t>(), offs.data<int32_t>(), rows_tok.data<int32_t>(), rows_pair.data<int32_t>(),
          rows_expert.data<int32_t>());
    });
    check_launch(op);
    row_groups = rows_expert.data<const int32_t>();
  } else if (fused_route(E) && T <= kFusedRouteTokens) {
    const Tensor logits = cuda::linear(x, router_weight, std::nullopt);
    r = MoeRouting{empty({T, top_k}, x.dtype(), dev), empty({T, top_k}, DType::I32, dev)};
    visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(x.dtype(), op, [&](auto tag) {
      using X = typename decltype(tag)::type;
      kernels::moe_route_permute_kernel<X><<<1, kernels::kPermuteThreads, perm_smem, stream>>>(
          logits.data<const X>(), logits.stride(0), static_cast<int>(T), static_cast<int>(E), static_cast<int>(top_k),
          norm_topk_prob, r.weights.data<X>(), r.experts.data<int32_t>(), offs.data<int32_t>(),
          rows_tok.data<int32_t>(), rows_pair.data<int32_t>());
    });
    check_launch(op);
  } else {
    r = cuda::moe_route(x, router_weight, top_k, norm_topk_prob);
    const Tensor experts = r.experts.contiguous();
    kernels::moe_permute_kernel<<<1, kernels::kPermuteThreads, perm_smem, stream>>>(
        experts.data<const int32_t>(), P, static_cast<int>(E), static_cast<int>(top_k), offs.data<int32_t>(),
        rows_tok.data<int32_t>(), rows_pair.data<int32_t>());
    check_launch(op);
  }
  const Tensor weights = r.weights.contiguous();

  const bool decode = use_decode(P, E);
  // B's block scales for the FP8 decode kernel (scales [E, row blocks, K blocks], contiguous).
  auto fp8_scales = [&](GmmArgs& p, const Tensor& scales) {
    p.b_scales = scales.data<const float>();
    p.bs_sg = scales.stride(0), p.bs_sn = scales.stride(1);
    p.b_bn = static_cast<int>(f8->block_n), p.b_bk = static_cast<int>(f8->block_k);
    p.b_bk_shift = log2_exact(p.b_bk);
  };
  // With the TMA tiles, x's rows in expert order (xs [P, H]) instead of a row list.
  Tensor xs;
  if (!decode && !f8 && I > 0 && x.dtype() != DType::F32 && tma_tiles(dev.index) && aligned16(x.data_ptr()) &&
      (H * x.itemsize()) % 16 == 0) {
    xs = empty({P, H}, x.dtype(), dev);
    const int64_t chunks = H * x.itemsize() / 16;
    constexpr int kThreads = 256;
    kernels::moe_gather_rows_kernel<<<grid_for(P * chunks, kThreads, dev.index), kThreads, 0, stream>>>(
        static_cast<const uint4*>(x.data_ptr()), rows_tok.data<const int32_t>(), P, chunks,
        static_cast<uint4*>(xs.data_ptr()));
    check_launch(op);
  }
  // With FP8 experts, one token's down product reads its rows' experts before its wait
  // (GmmArgs::groups_before_wait): the kernel just ahead of it is gate_up's decode kernel (I > 0), which then
  // lets it start only after its own wait, when the routing that wrote them has completed. TUNE (H200, one
  // machine, scripts/ab-binaries.sh, 2026-12-04): 1.0-4.0% faster MoE blocks with
  // FP8 experts, 0.2% faster to 1.3% slower with bf16 ones, which keep the usual order. Its first weight loads
  // go out before the wait too; the experts need not be constant (constant_input) for that: every kernel that
  // ran before gate_up's wait returned has completed, and no kernel of this call writes them.
  const bool early_down =
      decode && f8 != nullptr && row_groups != nullptr && I > 0 && early_down_ref().load(std::memory_order_relaxed);
  // h [P, I] (x's dtype, expert order) = silu(x_tok @ gate_e^T) * (x_tok @ up_e^T).
  const Tensor h = empty({P, I}, x.dtype(), dev);
  if (I > 0) {
    GmmArgs p{};
    p.mode = GmmMode::RowGroups;
    p.a = xs.defined() ? xs.data_ptr() : x.data_ptr(), p.a_sg = 0, p.a_sm = H, p.a_sk = 1;
    p.b = gate_up.data_ptr(), p.b_sg = 2 * I * H, p.b_sk = 1, p.b_sn = H;
    p.c = h.data_ptr(), p.c_sg = 0, p.c_sm = I, p.c_sn = 1;
    p.a_rows = xs.defined() ? nullptr : rows_tok.data<const int32_t>();
    p.offs = offs.data<const int32_t>();
    p.G = static_cast<int>(E), p.M = P, p.N = to_int(I, op, "I"), p.K = to_int(H, op, "H");
    p.act = true;
    p.err = device_error_record(dev.index);
    if (decode) p.row_groups = row_groups;
    p.dependents_after_wait = early_down;
    if (f8) fp8_scales(p, f8->gate_up);
    run_gmm(p, x.dtype(), decode, dev, op);
  }
  // down: y [P, H] f32, at row (token, slot) = h @ down_e^T, combined by the kernel below. One token whose
  // slots divide a decode block's warps: the combine rides on the down product instead (the decode kernel's
  // fused combine, GmmArgs::comb_weights): one launch less and no f32 rows in between.
  const bool fuse = decode && row_groups != nullptr && T == 1 && I > 0 && kernels::kDecWarps % P == 0 &&
                    fused_combine_ref().load(std::memory_order_relaxed);
  Tensor y;
  {
    GmmArgs p{};
    p.mode = GmmMode::RowGroups;
    p.a = h.data_ptr(), p.a_sg = 0, p.a_sm = I, p.a_sk = 1;
    p.b = down.data_ptr(), p.b_sg = H * I, p.b_sk = 1, p.b_sn = I;
    p.c_sg = 0, p.c_sm = H, p.c_sn = 1;
    p.offs = offs.data<const int32_t>();
    p.G = static_cast<int>(E), p.M = P, p.N = to_int(H, op, "H"), p.K = to_int(I, op, "I");
    p.err = device_error_record(dev.index);
    if (decode) p.row_groups = row_groups;
    p.groups_before_wait = early_down;
    if (f8) fp8_scales(p, f8->down);
    if (fuse) {
      p.comb_weights = weights.data_ptr();
      p.comb_pairs = rows_pair.data<const int32_t>();
      p.comb_out = out.data_ptr();
      run_gmm(p, x.dtype(), decode, dev, op);
      fused_combines.fetch_add(1, std::memory_order_relaxed);
      return out;
    }
    y = empty({P, H}, DType::F32, dev);
    p.c = y.data_ptr();
    p.c_rows = rows_pair.data<const int32_t>();
    p.out_f32 = true;
    if (p.K == 0) y.zero_();
    else run_gmm(p, x.dtype(), decode, dev, op);
  }
  // out[t] = sum over t's slots, in order, of weight * y: f32, one rounding.
  constexpr int kThreads = 256;
  visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(x.dtype(), op, [&](auto tag) {
    using X = typename decltype(tag)::type;
    launch_dependent(kernels::moe_combine_kernel<X>, dim3(grid_for(T * H, kThreads, dev.index)), dim3(kThreads), 0,
                     stream, dev.index, op, y.data<const float>(), weights.data<const X>(), T, H,
                     static_cast<int>(top_k), out.data<X>());
  });
  check_launch(op);
  return out;
}

}  // namespace

Tensor moe_forward(const Tensor& x, const Tensor& router_weight, const Tensor& gate_up, const Tensor& down,
                   int64_t top_k, bool norm_topk_prob) {
  return moe_forward_impl(x, router_weight, gate_up, down, top_k, norm_topk_prob, nullptr);
}

Tensor moe_forward_fp8(const Tensor& x, const Tensor& router_weight, const Fp8Experts& e, int64_t top_k,
                       bool norm_topk_prob) {
  const ExpertScales f8{e.gate_up_scales, e.down_scales, e.block_n, e.block_k};
  return moe_forward_impl(x, router_weight, e.gate_up, e.down, top_k, norm_topk_prob, &f8);
}

}  // namespace kiln::cuda
