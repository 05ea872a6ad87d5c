// Device code of the MoE block around the expert products (grouped_mm.cuh): the fused router (softmax,
// top-k, renormalisation), the token -> expert permutation and the weighted combine. The launcher is
// src/cuda/moe.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/gemv.cuh"
#include "cuda/kernels/grouped_mm.cuh"
#include "ops/math.h"
#include "ops/softmax_math.h"

namespace kiln::cuda::kernels {

inline constexpr int kRouteMaxExperts = 256;
inline constexpr int kRouteThreads = 128;  // one warp per token
inline constexpr int kRoutePerLane = kRouteMaxExperts / 32;

// a is a better pick than b: larger probability (NaN counts as the largest, as torch.topk), ties to the
// lower expert index.
__device__ __forceinline__ bool route_better(float va, int ea, float vb, int eb) {
  const bool na = va != va, nb = vb != vb;
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ea < eb;
}

// logits [T, E] (row stride ld, x's dtype) -> weights [T, k] (x's dtype), experts [T, k] i32, contiguous.
// As moe_route: p = softmax(logits) in f32, the k largest (ties: lower index) in descending order, then
// optionally p / sum(selected p). 1 <= k <= E <= kRouteMaxExperts.
// One warp routes token t (all 32 lanes call this together).
// slot[i] is left as the slot of expert lane + 32 i (-1: not selected).
template <class T>
__device__ __forceinline__ void route_token(const T* __restrict__ logits, int64_t ld, int64_t t, int E, int k,
                                            bool norm, T* __restrict__ weights, int32_t* __restrict__ experts,
                                            int (&slot)[kRoutePerLane]) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const T* row = logits + t * ld;
  float v[kRoutePerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? gemv_to_f32(row[e]) : -INFINITY;
    if (e < E) mx = softmax_math::max_nan(mx, v[i]);
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) mx = softmax_math::max_nan(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, d));
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? softmax_math::exp_shifted(v[i], mx) : 0.f;
    sum += v[i];
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, d);
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) v[i] = softmax_math::softmax_from_exp(v[i], sum);

  // k rounds of a warp arg-max over the experts not yet taken; each lane remembers the slot of the
  // experts it owns, so no per-slot arrays are needed and k is bounded only by E.
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) slot[i] = -1;
  float sel_sum = 0.f;  // the same on every lane, summed in slot order
  for (int q = 0; q < k; ++q) {
    float bv = -INFINITY;
    int be = INT_MAX;
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < E && slot[i] < 0 && route_better(v[i], e, bv, be)) {
        bv = v[i];
        be = e;
      }
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, d);
      const int oe = __shfl_xor_sync(0xFFFFFFFFu, be, d);
      if (route_better(ov, oe, bv, be)) {
        bv = ov;
        be = oe;
      }
    }
    // k <= E, so be is a real expert; its owner records the slot.
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i)
      if (lane + 32 * i == be) slot[i] = q;
    sel_sum += bv;
  }
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    if (slot[i] < 0) continue;
    const float w = norm ? v[i] / sel_sum : v[i];
    weights[t * k + slot[i]] = gemv_from_f32<T>(w);
    experts[t * k + slot[i]] = lane + 32 * i;
  }
}
template <class T>
__device__ void route_token(const T* __restrict__ logits, int64_t ld, int64_t t, int E, int k, bool norm,
                            T* __restrict__ weights, int32_t* __restrict__ experts) {
  int slot[kRoutePerLane];
  route_token(logits, ld, t, E, k, norm, weights, experts, slot);
}

// grid = ceil(T / 4) blocks of kRouteThreads: a warp per token.
template <class T>
__global__ void __launch_bounds__(kRouteThreads)
    moe_route_kernel(const T* __restrict__ logits, int64_t ld, int64_t tokens, int E, int k, bool norm,
                     T* __restrict__ weights, int32_t* __restrict__ experts) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (kRouteThreads / 32) + (threadIdx.x >> 5);
  if (t < tokens) route_token(logits, ld, t, E, k, norm, weights, experts);  // whole warps alike
}

inline constexpr int kPermuteThreads = 1024;
inline constexpr int kPermuteMaxExperts = 4096;

// One block. experts [P] (the router's [T, k] flattened; out-of-range ids are clamped, they come from the
// router) -> offs [E] (cumulative ends of each expert's rows), rows_tok [P] (token of the r-th row in
// expert order) and rows_pair [P] (its flat (token, slot) index). The order of rows inside one expert is
// the order of shared-memory atomics: it changes no result (every row's products are computed on their
// own, in a fixed order). Dynamic shared memory: 2 E ints.
template <int THREADS>
__device__ void permute_block(const int32_t* experts, int P, int E, int k, int32_t* __restrict__ offs,
                              int32_t* __restrict__ rows_tok, int32_t* __restrict__ rows_pair, int* ends,
                              int* cursor, int* warp_tmp) {
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = tid; e < E; e += THREADS) ends[e] = 0;
  __syncthreads();
  auto expert_of = [&](int i) {
    const int e = experts[i];
    return e < 0 ? 0 : (e >= E ? E - 1 : e);
  };
  for (int i = tid; i < P; i += THREADS) atomicAdd(&ends[expert_of(i)], 1);
  __syncthreads();
  for (int e = tid; e < E; e += THREADS) cursor[e] = ends[e];
  gmm_block_scan<THREADS>(ends, E, ScanSum{}, 0, warp_tmp);  // ends with a barrier
  for (int e = tid; e < E; e += THREADS) {
    cursor[e] = ends[e] - cursor[e];  // the expert's first row
    offs[e] = ends[e];
  }
  __syncthreads();
  for (int i = tid; i < P; i += THREADS) {
    const int pos = atomicAdd(&cursor[expert_of(i)], 1);
    rows_pair[pos] = i;
    rows_tok[pos] = i / k;
  }
}

__global__ void __launch_bounds__(kPermuteThreads)
    moe_permute_kernel(const int32_t* __restrict__ experts, int P, int E, int k, int32_t* __restrict__ offs,
                       int32_t* __restrict__ rows_tok, int32_t* __restrict__ rows_pair) {
  extern __shared__ int perm_dyn[];
  __shared__ int warp_tmp[kPermuteThreads / 32];
  permute_block<kPermuteThreads>(experts, P, E, k, offs, rows_tok, rows_pair, perm_dyn, perm_dyn + E, warp_tmp);
}

// Routing and permutation in one block for a few tokens (decode): one launch less. Each warp routes tokens
// warp, warp + 32, ...; the block barrier then makes their expert ids visible to the permutation.
template <class T>
__global__ void __launch_bounds__(kPermuteThreads)
    moe_route_permute_kernel(const T* __restrict__ logits, int64_t ld, int tokens, int E, int k, bool norm,
                             T* __restrict__ weights, int32_t* experts, int32_t* __restrict__ offs,
                             int32_t* __restrict__ rows_tok, int32_t* __restrict__ rows_pair) {
  // experts is written by the routing warps and read back by other threads after the barrier: plain
  // (coherent) loads, never the read-only path, hence no __restrict__.
  extern __shared__ int perm_dyn[];
  __shared__ int warp_tmp[kPermuteThreads / 32];
  for (int t = static_cast<int>(threadIdx.x >> 5); t < tokens; t += kPermuteThreads / 32)
    route_token(logits, ld, t, E, k, norm, weights, experts);
  __syncthreads();
  permute_block<kPermuteThreads>(experts, tokens * k, E, k, offs, rows_tok, rows_pair, perm_dyn, perm_dyn + E,
                                 warp_tmp);
}

// Routing and permutation of one token (decode) by one warp: the k selected experts are distinct, so the
// permutation is a prefix count over the experts (ballots in expert order): offs[e] = selected experts <= e,
// and the row of selected expert e is offs[e] - 1, holding slot[e] of token 0. Same outputs as
// moe_route_permute_kernel with tokens = 1, without its 1024-thread block and scans, plus rows_expert [k]:
// the expert of each row, so the expert kernels need not scan the offsets (GmmArgs::row_groups).
template <class T>
__global__ void __launch_bounds__(32)
    moe_route_one_kernel(const T* logits, int E, int k, bool norm, T* __restrict__ weights,
                         int32_t* __restrict__ experts, int32_t* __restrict__ offs, int32_t* __restrict__ rows_tok,
                         int32_t* __restrict__ rows_pair, int32_t* __restrict__ rows_expert) {
  const int lane = static_cast<int>(threadIdx.x);
  pdl_allow_dependents();
  pdl_wait();  // launched as a dependent (kernels/pdl.cuh)
  int slot[kRoutePerLane];
  route_token(logits, 0, 0, E, k, norm, weights, experts, slot);
  int before = 0;  // selected experts below 32 i
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    const int e = lane + 32 * i;
    const unsigned sel = __ballot_sync(0xFFFFFFFFu, e < E && slot[i] >= 0);
    const int end = before + __popc(sel & (0xFFFFFFFFu >> (31 - lane)));  // lanes <= this one
    if (e < E) offs[e] = end;
    if (e < E && slot[i] >= 0) {
      rows_pair[end - 1] = slot[i];
      rows_tok[end - 1] = 0;
      rows_expert[end - 1] = e;
    }
    before += __popc(sel);
  }
}

// xs[m] = x[rows_tok[m]] for the P sorted rows (the tile kernel that reads A by tensor-map boxes takes rows
// in expert order, not a row list). Rows of `chunks` 16-byte chunks (H x sizeof(T) / 16), both contiguous and
// 16-byte aligned; rows_tok from the permutation (in range).
__global__ void moe_gather_rows_kernel(const uint4* __restrict__ x, const int32_t* __restrict__ rows_tok, int64_t P,
                                       int64_t chunks, uint4* __restrict__ xs) {
  const int64_t n = P * chunks;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / chunks, c = i - m * chunks;
    xs[i] = x[static_cast<int64_t>(rows_tok[m]) * chunks + c];
  }
}

// out[t, c] = sum over slots j < k, in order, of weight[t, j] * y[t * k + j, c] in f32, rounded once.
// y [T k, H] f32 contiguous, weights [T, k], out [T, H] contiguous.
template <class T>
__global__ void moe_combine_kernel(const float* y, const T* weights, int64_t tokens,
                                   int64_t H, int k, T* __restrict__ out) {
  pdl_allow_dependents();
  pdl_wait();  // launched as a dependent (kernels/pdl.cuh)
  const int64_t n = tokens * H;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / H, c = i - t * H;
    float acc = 0.f;
    for (int j = 0; j < k; ++j) acc += gemv_to_f32(weights[t * k + j]) * y[(t * k + j) * H + c];
    out[i] = gemv_from_f32<T>(acc);
  }
}

}  // namespace kiln::cuda::kernels
