// Launcher of the Hopper grouped tile kernel (kernels/grouped_mm_sm90.cuh).
#include "cuda/moe_sm90.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "cuda/kernels/grouped_mm_sm90.cuh"
#include "cuda/launch.h"
#include "cuda/moe.h"

namespace kiln::cuda {

namespace {

// Launches per TMA instance: 128 x 128 tiles alone, in clusters of 2, of 4; 64 x 128 tiles; 128 x 256 tiles
// alone, in pairs sharing B.
std::atomic<int64_t> tma_counts[6];
std::atomic<int64_t> tma_store_count{0};  // launches with the staged C epilogue
constexpr int count_index(int bm, int bn, int cs) {
  return bm == 64 ? 3 : bn == 256 ? (cs == 1 ? 4 : 5) : cs == 1 ? 0 : cs == 2 ? 1 : 2;
}

// Dynamic shared memory a block of `kernel` may opt into on `device`: the device's per-block limit less the
// kernel's static shared memory (cached per kernel and device).
size_t max_dynamic_smem(const void* kernel, int device) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int optin = 0;
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
  cudaFuncAttributes attr = {};
  check(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes");
  const size_t limit = static_cast<size_t>(optin) > attr.sharedSizeBytes ? static_cast<size_t>(optin) - attr.sharedSizeBytes : 0;
  return cache[key] = limit;
}

// Clusters of CS blocks of `kernel` (dynamic shared memory smem) that can be resident at once on `device`
// (the occupancy API, cached per kernel and device: always asked with the largest smem the kernel is
// launched with); 0 when the query fails.
int resident_clusters(const void* kernel, int cs, int threads, size_t smem, int device) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(cs));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cs);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  cache[key] = n;
  return n;
}

// The TMA kernel (kernels/grouped_mm_sm90.cuh, gmm_tma_kernel) with BM-row tiles in clusters of CS blocks
// (PB: pairs of m-tiles sharing B, else n-tiles sharing A); false, launching nothing, where it does not
// apply: gathered A rows (a_rows: TMA copies boxes, not lists of rows), K = 0, operands no tensor map
// describes, or (CS > 1) no cluster of CS such blocks fits the device.
template <int BM, int BN, int CS, bool PB = false>
bool launch_tma(const kernels::GmmArgs& p, bool bf16, int device, cudaStream_t stream, const char* op) {
  namespace k90 = kernels::gmm90;
  if (p.a_rows != nullptr || p.K <= 0) return false;
  if (p.a_sm < 0 || p.b_sn < 0 || p.a_sg < 0 || p.b_sg < 0) return false;  // tensor maps take no negative strides
  const bool batched = p.mode == kernels::GmmMode::Batched;
  k90::GmmTmaParams tp{};
  tp.p = p;
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  // A: rows a_sm apart; Batched A with a group stride has one slot per group.
  tp.a_slots = batched && p.a_sg != 0 && p.G > 1;
  const uint64_t a_dims[3] = {u(p.K), u(p.M), tp.a_slots ? u(p.G) : 1};
  const uint64_t a_strides[2] = {u(p.a_sm) * 2, tp.a_slots ? u(p.a_sg) * 2 : u(p.a_sm) * 2 * u(p.M)};
  // B: weight rows b_sn apart (2 N of them with act: gate, then up), one slot per group.
  tp.b_slots = p.b_sg != 0 && p.G > 1;
  const int64_t b_rows = p.act ? 2 * static_cast<int64_t>(p.N) : p.N;
  if (b_rows + 128 > INT_MAX) return false;  // box coordinates are int32
  const uint64_t b_dims[3] = {u(p.K), u(b_rows), tp.b_slots ? u(p.G) : 1};
  const uint64_t b_strides[2] = {u(p.b_sn) * 2, tp.b_slots ? u(p.b_sg) * 2 : u(p.b_sn) * 2 * u(b_rows)};
  if (!encode_tensor_map_3d(&tp.ta, p.a, bf16, a_dims, a_strides, 64, PB ? BM : BM / CS) ||
      !encode_tensor_map_3d(&tp.tb, p.b, bf16, b_dims, b_strides, 64, BN / 2))
    return false;
  // C through shared memory and TMA stores (kernels/grouped_mm_sm90.cuh, gmm90_epilogue_tma) where the switch
  // is on and C is 16-bit with contiguous, 16-byte aligned rows in product order, and the staging fits.
  if constexpr (k90::tma_store_capable<BM, CS, PB>()) {
    const int64_t c_slots = batched ? p.G : 1;
    const size_t with_stage = k90::tma_smem_bytes<BM, BN>(batched ? 0 : p.G, true);
    const void* fn = bf16 ? reinterpret_cast<const void*>(k90::gmm_tma_kernel<BFloat16, BM, BN, CS, PB>)
                          : reinterpret_cast<const void*>(k90::gmm_tma_kernel<Half, BM, BN, CS, PB>);
    if (grouped_tma_store() && p.fast_epilogue && !p.out_f32 && p.c_rows == nullptr && p.c_sn == 1 && p.c_sm > 0 &&
        (p.c_sm * 2) % 16 == 0 && (!batched || (p.c_sg > 0 && (p.c_sg * 2) % 16 == 0)) &&
        reinterpret_cast<uintptr_t>(p.c) % 16 == 0 && with_stage <= max_dynamic_smem(fn, device)) {
      const uint64_t c_dims[3] = {u(p.N), u(p.M), u(c_slots)};
      const uint64_t c_strides[2] = {u(p.c_sm) * 2, batched ? u(p.c_sg) * 2 : u(p.c_sm) * 2 * u(p.M)};
      tp.c_tma = encode_tensor_map_3d(&tp.tc, p.c, bf16, c_dims, c_strides, 64, 64) ? 1 : 0;
    }
  }
  const int64_t ncols = k90::tile_cols(p.act, BN);
  const int64_t nt = (p.N + ncols - 1) / ncols;
  const int64_t mt = (static_cast<int64_t>(p.M) + BM - 1) / BM;
  // The list entries there can be: RowGroups at most ceil(M / BM) + G + 1 m-tiles (one partial tile per
  // group and the rows past the last offset), times the groups of CS n-tiles. PB: spans of 2 BM rows
  // (ceil(M / 2 BM) + G + 1, or per group when Batched) times the n-tiles.
  const int64_t mspans = (static_cast<int64_t>(p.M) + 2 * BM - 1) / (2 * BM);
  const int64_t bound = PB ? (batched ? (mt + 1) / 2 * p.G : mspans + p.G + 1) * nt
                           : (batched ? mt * p.G : mt + p.G + 1) * ((nt + CS - 1) / CS);
  KILN_CHECK(bound < (int64_t{1} << 31), op, ": ", bound, " product tiles is too many for one launch");
  if (bound == 0) return true;
  tp.ntiles = static_cast<int>(nt);
  tp.mtiles = static_cast<int>(mt);
  const size_t smem = k90::tma_smem_bytes<BM, BN>(batched ? 0 : p.G, tp.c_tma != 0);
  constexpr int threads = k90::tma_threads<BM>();
  auto go = [&](auto kernel) {
    const void* fn = reinterpret_cast<const void*>(kernel);
    // The largest launch: every group scanned, or (with the staging) all the device allows a block.
    set_max_dynamic_smem(fn,
                         k90::tma_store_capable<BM, CS, PB>()
                             ? std::max(k90::tma_smem_bytes<BM, BN>(kernels::kGmmMaxGroups), max_dynamic_smem(fn, device))
                             : k90::tma_smem_bytes<BM, BN>(kernels::kGmmMaxGroups),
                         device, op);
    // Persistent: tma_blocks_per_sm blocks per SM, or as many clusters as can be resident at once.
    int64_t clusters = static_cast<int64_t>(multiprocessor_count(device)) * k90::tma_blocks_per_sm<BM>() / CS;
    if (CS > 1) {
      clusters = resident_clusters(fn, CS, threads, k90::tma_smem_bytes<BM, BN>(kernels::kGmmMaxGroups), device);
      if (clusters < 1) return false;
    }
    clusters = std::min<int64_t>(bound, clusters);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(clusters * CS));
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1] = {};
    if (CS > 1) {
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = CS;
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
    }
    check(cudaLaunchKernelEx(&cfg, kernel, tp), op);
    tma_counts[count_index(BM, BN, CS)].fetch_add(1, std::memory_order_relaxed);
    if (tp.c_tma) tma_store_count.fetch_add(1, std::memory_order_relaxed);
    return true;
  };
  return bf16 ? go(k90::gmm_tma_kernel<BFloat16, BM, BN, CS, PB>) : go(k90::gmm_tma_kernel<Half, BM, BN, CS, PB>);
}

}  // namespace

int64_t grouped_tma_store_launches() { return tma_store_count.load(std::memory_order_relaxed); }

int64_t gmm_tma_launches(Gmm90Kernel which) {
  switch (which) {
    case Gmm90Kernel::Tma: return tma_counts[count_index(128, 128, 1)].load(std::memory_order_relaxed);
    case Gmm90Kernel::Tma64: return tma_counts[count_index(64, 128, 1)].load(std::memory_order_relaxed);
    case Gmm90Kernel::TmaWide: return tma_counts[count_index(128, 256, 1)].load(std::memory_order_relaxed);
    case Gmm90Kernel::TmaWidePair: return tma_counts[count_index(128, 256, 2)].load(std::memory_order_relaxed);
    case Gmm90Kernel::TmaCluster2: return tma_counts[count_index(128, 128, 2)].load(std::memory_order_relaxed);
    case Gmm90Kernel::TmaCluster4: return tma_counts[count_index(128, 128, 4)].load(std::memory_order_relaxed);
    default: return 0;
  }
}

bool launch_gmm_sm90(const kernels::GmmArgs& p, bool bf16, Gmm90Kernel which, int device, cudaStream_t stream,
                     const char* op) {
  namespace k90 = kernels::gmm90;
  if (!wgmma_available(device)) return false;
  if (p.mode != kernels::GmmMode::RowGroups && p.mode != kernels::GmmMode::Batched) return false;
  if (which != Gmm90Kernel::CpAsync && which != Gmm90Kernel::CpAsyncWide) {
    const bool ok = which == Gmm90Kernel::Tma           ? launch_tma<128, 128, 1>(p, bf16, device, stream, op)
                    : which == Gmm90Kernel::Tma64       ? launch_tma<64, 128, 1>(p, bf16, device, stream, op)
                    : which == Gmm90Kernel::TmaWide     ? launch_tma<128, 256, 1>(p, bf16, device, stream, op)
                    : which == Gmm90Kernel::TmaWidePair ? launch_tma<128, 256, 2, true>(p, bf16, device, stream, op)
                    : which == Gmm90Kernel::TmaCluster2 ? launch_tma<128, 128, 2>(p, bf16, device, stream, op)
                                                        : launch_tma<128, 128, 4>(p, bf16, device, stream, op);
    if (ok) {
      check_launch(op);
      return true;
    }
  }
  const bool wide = which == Gmm90Kernel::CpAsyncWide;
  auto run = [&](auto bn_const) {
    constexpr int BN = decltype(bn_const)::value;
    const int64_t ncols = k90::tile_cols(p.act, BN);
    const int64_t gx = (p.N + ncols - 1) / ncols;
    const int64_t mt = (static_cast<int64_t>(p.M) + k90::kBM - 1) / k90::kBM;
    dim3 grid;
    size_t smem = 0;
    if (p.mode == kernels::GmmMode::RowGroups) {
      KILN_CHECK(mt + p.G + 1 <= 65535, op, ": M = ", p.M, " rows in ", p.G, " groups is too large for one launch");
      grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(mt + p.G + 1), 1);
      smem = k90::smem_bytes<BN>(p.G);
    } else {
      KILN_CHECK(mt <= 65535 && p.G <= 65535, op, ": ", p.G, " groups of ", p.M, " rows is too large for one launch");
      grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(mt), static_cast<unsigned>(p.G));
      smem = k90::smem_bytes<BN>(0);
    }
    auto go = [&](auto kernel) {
      // The largest smem this kernel is ever launched with (G <= kGmmMaxGroups) is opted into once.
      set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), k90::smem_bytes<BN>(kernels::kGmmMaxGroups), device,
                           op);
      kernel<<<grid, k90::kThreads, smem, stream>>>(p);
    };
    if (bf16) go(k90::gmm_wgmma_kernel<BFloat16, BN>);
    else go(k90::gmm_wgmma_kernel<Half, BN>);
  };
  if (wide) run(std::integral_constant<int, 256>{});
  else run(std::integral_constant<int, 128>{});
  check_launch(op);
  return true;
}

}  // namespace kiln::cuda
