// Launcher of the Hopper grouped tile kernel (kernels/grouped_mm_sm90.cuh).
#include "cuda/moe_sm90.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/kernels/grouped_mm_sm90.cuh"
#include "cuda/launch.h"

namespace kiln::cuda {
namespace {

// The persistent warp-specialised kernel (gmm_ws_kernel); false (nothing launched) where B does not fit a
// tensor map.
bool launch_gmm_ws(const kernels::GmmArgs& p, bool bf16, int device, cudaStream_t stream, const char* op) {
  namespace ws = kernels::gmm90::ws;
  if (p.K <= 0 || p.N <= 0 || p.M <= 0) return false;
  ws::Params wp{};
  const int64_t rows = p.act ? 2 * static_cast<int64_t>(p.N) : p.N;
  const uint64_t dims[3] = {static_cast<uint64_t>(p.K), static_cast<uint64_t>(rows),
                            static_cast<uint64_t>(p.b_sg != 0 ? p.G : 1)};
  const uint64_t strides[2] = {static_cast<uint64_t>(p.b_sn) * 2,
                               static_cast<uint64_t>(p.b_sg != 0 ? p.b_sg : rows * p.b_sn) * 2};
  if (p.b_sn <= 0 || p.b_sg < 0 || !encode_tensor_map_3d(&wp.tb, p.b, bf16, dims, strides, 64, ws::kBN / 2))
    return false;
  wp.p = p;
  const int64_t n_tiles = (p.N + ws::tile_cols(p.act) - 1) / ws::tile_cols(p.act);
  const int64_t mt = (static_cast<int64_t>(p.M) + ws::kBM - 1) / ws::kBM;
  const int64_t slots = p.mode == kernels::GmmMode::RowGroups ? mt + p.G + 1 : mt * p.G;
  KILN_CHECK(slots * n_tiles < (int64_t{1} << 31), op, ": M = ", p.M, ", N = ", p.N, " in ", p.G,
             " groups is too large for one launch");
  wp.n_tiles = static_cast<int>(n_tiles);
  wp.mt = static_cast<int>(mt);
  const int64_t blocks = std::min<int64_t>(slots * n_tiles, multiprocessor_count(device));
  const size_t smem = ws::smem_bytes(p.mode == kernels::GmmMode::RowGroups ? p.G : 0);
  auto go = [&](auto kernel) {
    set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), ws::smem_bytes(kernels::kGmmMaxGroups), device, op);
    launch_dependent(kernel, dim3(static_cast<unsigned>(blocks)), dim3(ws::kThreads), smem, stream, device, op, wp);
  };
  if (bf16) go(kernels::gmm90::gmm_ws_kernel<BFloat16>);
  else go(kernels::gmm90::gmm_ws_kernel<Half>);
  return true;
}

// KILN_GMM90=cpasync takes the two-blocks-per-SM cp.async kernel (gmm_wgmma_kernel) instead (A/B runs).
bool use_cpasync_kernel() {
  static const bool v = [] {
    const char* e = std::getenv("KILN_GMM90");
    return e != nullptr && std::string(e) == "cpasync";
  }();
  return v;
}

}  // namespace

bool launch_gmm_sm90(const kernels::GmmArgs& p, bool bf16, int device, cudaStream_t stream, const char* op) {
  namespace k90 = kernels::gmm90;
  if (!wgmma_available(device)) return false;
  if (p.mode != kernels::GmmMode::RowGroups && p.mode != kernels::GmmMode::Batched) return false;
  if (!use_cpasync_kernel() && launch_gmm_ws(p, bf16, device, stream, op)) {
    check_launch(op);
    return true;
  }
  const int64_t ncols = k90::tile_cols(p.act);
  const int64_t gx = (p.N + ncols - 1) / ncols;
  const int64_t mt = (static_cast<int64_t>(p.M) + k90::kBM - 1) / k90::kBM;
  dim3 grid;
  size_t smem = 0;
  if (p.mode == kernels::GmmMode::RowGroups) {
    KILN_CHECK(mt + p.G + 1 <= 65535, op, ": M = ", p.M, " rows in ", p.G, " groups is too large for one launch");
    grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(mt + p.G + 1), 1);
    smem = k90::smem_bytes(p.G);
  } else {
    KILN_CHECK(mt <= 65535 && p.G <= 65535, op, ": ", p.G, " groups of ", p.M, " rows is too large for one launch");
    grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(mt), static_cast<unsigned>(p.G));
    smem = k90::smem_bytes(0);
  }
  auto go = [&](auto kernel) {
    // The largest smem this kernel is ever launched with (G <= kGmmMaxGroups) is opted into once.
    set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), k90::smem_bytes(kernels::kGmmMaxGroups), device, op);
    kernel<<<grid, k90::kThreads, smem, stream>>>(p);
  };
  if (bf16) go(k90::gmm_wgmma_kernel<BFloat16>);
  else go(k90::gmm_wgmma_kernel<Half>);
  check_launch(op);
  return true;
}

}  // namespace kiln::cuda
