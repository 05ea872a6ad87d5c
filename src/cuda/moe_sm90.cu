// Launcher of the Hopper grouped tile kernel (kernels/grouped_mm_sm90.cuh).
#include "cuda/moe_sm90.h"

#include <type_traits>

#include "cuda/kernels/grouped_mm_sm90.cuh"
#include "cuda/launch.h"

namespace kiln::cuda {

bool launch_gmm_sm90(const kernels::GmmArgs& p, bool bf16, bool wide, int device, cudaStream_t stream,
                     const char* op) {
  namespace k90 = kernels::gmm90;
  if (!wgmma_available(device)) return false;
  if (p.mode != kernels::GmmMode::RowGroups && p.mode != kernels::GmmMode::Batched) return false;
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
