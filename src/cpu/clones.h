// KILN_SIMD_CLONES before a hot loop's function builds it twice on x86-64: for the baseline the build
// targets (no -march: SSE2) and for x86-64-v3 (AVX2, FMA, F16C), the dynamic loader picking one for the
// machine (GCC/Clang target_clones). Elsewhere it is empty.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define KILN_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KILN_SIMD_CLONES
#endif
