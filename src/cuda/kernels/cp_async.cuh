// Shared-memory addresses and 16-byte cp.async copies, used by the attention and wgmma kernels.
#pragma once

#include <cstdint>

namespace kiln::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared (a pointer or a shared address); valid = false writes zeros and reads nothing
// (src must still be a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  cp_async16(smem_addr(dst), src, valid);
}
// The same with an L2 prefetch hint (Pf = 128): on a miss, L2 fetches the aligned 128-byte block around the
// address, not just the sectors asked for (streams that read each byte once). Pf = 0: no hint.
template <int Pf>
__device__ __forceinline__ void cp_async16_pf(uint32_t dst, const void* src, bool valid) {
  static_assert(Pf == 0 || Pf == 128, "L2 prefetch sizes: 0 or 128 bytes");
  if constexpr (Pf == 128)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
  else
    cp_async16(dst, src, valid);
}
template <int Pf>
__device__ __forceinline__ void cp_async16_pf(void* dst, const void* src, bool valid) {
  cp_async16_pf<Pf>(smem_addr(dst), src, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace kiln::cuda
