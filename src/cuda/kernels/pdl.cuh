// Programmatic dependent launch (sm_90; a no-op below). A kernel launched with the programmatic-serialization
// attribute (launch_dependent in launch.h) may start while the kernel before it on the stream still runs; it
// must call pdl_wait() before it reads anything an earlier kernel writes or writes anything an earlier kernel
// reads: the wait returns once the previous grid has completed and its memory is visible (and, that grid
// having waited the same way, every grid before it). Work that touches only data no kernel writes (the
// weights of a matrix-vector product) may come first: that is the point.
//
// pdl_allow_dependents() lets the next kernel, if it was launched that way, start before this one ends (its
// blocks then take free slots and wait); without it the next kernel starts as this one's blocks exit. It
// changes no result: the dependent's wait still covers this grid's completion.
#pragma once

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

}  // namespace kiln::cuda::kernels
