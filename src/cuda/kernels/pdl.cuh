// Programmatic dependent launch (sm_90; a no-op below). A kernel launched with the programmatic-serialization
// attribute (launch_dependent in launch.h) may start while the kernel before it on the stream still runs; it
// must call pdl_wait() before it reads anything an earlier kernel writes or writes anything an earlier kernel
// reads: the wait returns once the previous grid has completed and its memory is visible (and, that grid
// having waited the same way, every grid before it). Work that touches only data no kernel that may still run
// writes (the weights of a matrix-vector product, when marked constant: launch_dependent_if and constant_input
// in launch.h) may come first: that is the point.
//
// pdl_allow_dependents() lets the next kernel, if it was launched that way, start before this one ends (its
// blocks then take free slots and wait); without it the next kernel starts as this one's blocks exit. It
// changes no result: the dependent's wait still covers this grid's completion.
#pragma once

#include <cuda_runtime.h>

namespace kiln::cuda::kernels {

__device__ __forceinline__ void pdl_allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Loads of data that the kernel before this one may write, issued after pdl_wait(). Never ld.global.nc
// (__ldg, or the compiler's own choice for a const __restrict__ pointer): PTX asks that data be read-only for
// the kernel's whole lifetime, and under a dependent launch that lifetime overlaps the writer's, so ptxas may
// and did schedule such loads above griddepcontrol.wait (the activation loads of the one-row matrix-vector
// kernels: a stale row of x, seen as a wrong FP8 decode step with dependent launches on and a right one with
// them off). These are coherent ld.global, and volatile so that the compiler keeps them after the wait.
__device__ __forceinline__ uint4 ld_after_wait(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ int ld_after_wait(const int* p) {
  int v;
  asm volatile("ld.global.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
// A 16-byte piece of a stream read once (not kept in L1), coherent and volatile: data an earlier kernel may
// write, loaded after the wait at addresses known before it (decode attention's speculative K/V chunk), or a
// weight prefetch that must stay before the wait (gemv_load_stream_early).
__device__ __forceinline__ uint4 ld_stream_coherent(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

}  // namespace kiln::cuda::kernels
