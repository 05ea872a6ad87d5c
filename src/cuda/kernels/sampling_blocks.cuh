// Building blocks of the sampling kernels (src/cuda/kernels/sampling.cuh): argmax partials, block reductions
// and scans, the radix search over 32-bit keys and the block-wide selection of the first K. Device code only.
#pragma once

#include <cstdint>

#include "kiln/scalar_types.h"
#include "ops/sampling_math.h"

namespace kiln::cuda::sampling {

constexpr int kMaxK = 64;           // topk's k and the fast top_k path of sample
constexpr int kChunkMax = 4096;     // elements a chunk block holds in shared memory (16 KB of keys)
constexpr int kChunkThreads = 256;
constexpr int kRowThreads = 1024;
// top_p sums are taken in fixed point (topp_fixed, src/ops/sampling_math.h: e * 2^40, truncated): exact and
// independent of the summation order, so a seed gives the same tokens whatever the block schedule, and the
// same kept set as the CPU.

struct ArgPartial {
  float v;
  int32_t i;
};

__device__ __forceinline__ bool arg_before(const ArgPartial& a, const ArgPartial& b) {
  return topk_before(a.v, static_cast<int64_t>(a.i), b.v, static_cast<int64_t>(b.i));
}
// Comes after every element, -inf ones included.
__device__ __forceinline__ ArgPartial arg_identity() { return {-__int_as_float(0x7f800000), INT32_MAX}; }

// A row whose distribution is undefined: its argmax (NaN counts as largest) is NaN, +inf or -inf.
__device__ __forceinline__ bool row_is_bad(float m) { return !(m == m) || m == __int_as_float(0x7f800000) ||
                                                              m == -__int_as_float(0x7f800000); }

// topk's order on floats as an unsigned order: NaN (any payload) largest, -0.0 == +0.0, -inf smallest
// (0x007FFFFF), so 0 is free for padding.
__device__ __forceinline__ uint32_t topk_float_key(float v) {
  if (v != v) return 0xFFFFFFFFu;
  uint32_t b = __float_as_uint(v);
  if (v == 0.0f) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ unsigned long long fixed_of_key(uint32_t key) {
  return topp_fixed(sample_key_value(key));
}

// ---- block reductions ------------------------------------------------------------------------------------

// red: 33 slots. Every thread gets the block's result.
template <int kThreads>
__device__ ArgPartial block_argmax(ArgPartial a, ArgPartial* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const ArgPartial b{__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)};
    if (arg_before(b, a)) a = b;
  }
  if (lane == 0) red[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < kThreads / 32 ? red[lane] : arg_identity();
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const ArgPartial b{__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)};
      if (arg_before(b, a)) a = b;
    }
    if (lane == 0) red[32] = a;
  }
  __syncthreads();
  const ArgPartial r = red[32];
  __syncthreads();
  return r;
}

// The row's argmax from its nb chunk partials.
template <int kThreads>
__device__ ArgPartial row_argmax(const ArgPartial* part, int nb, ArgPartial* red) {
  ArgPartial a = arg_identity();
  for (int j = threadIdx.x; j < nb; j += kThreads)
    if (arg_before(part[j], a)) a = part[j];
  return block_argmax<kThreads>(a, red);
}

template <int kThreads>
__device__ unsigned long long block_sum_u64(unsigned long long v, unsigned long long* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? red[lane] : 0ull;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[32] = v;
  }
  __syncthreads();
  const unsigned long long r = red[32];
  __syncthreads();
  return r;
}

template <int kThreads>
__device__ int block_max_int(int v, int* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = ::max(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? red[lane] : INT32_MIN;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = ::max(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) red[32] = v;
  }
  __syncthreads();
  const int r = red[32];
  __syncthreads();
  return r;
}

// Inclusive scan of one float per thread over the block (thread order); `total` = the last thread's
// inclusive value, so that a running carry plus the last element's value equals the next tile's carry.
// ws: 33 slots. Deterministic: the same inputs give the same bits.
template <int kThreads>
__device__ float block_scan(float v, float* ws, float& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  if (lane == 31) ws[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < kThreads / 32 ? ws[lane] : 0.0f;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    if (lane < kThreads / 32) ws[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v += ws[warp - 1];
  if (threadIdx.x == kThreads - 1) ws[32] = v;
  __syncthreads();
  total = ws[32];
  __syncthreads();
  return v;
}

// ---- radix select ------------------------------------------------------------------------------------------

struct RadixSmem {
  unsigned long long val[256];
  uint32_t cnt[256];
  uint32_t digit;
  unsigned long long above;
};

struct RadixResult {
  uint32_t key;                  // tau
  unsigned long long remaining;  // the part of the target still missing after every eligible key > tau
  uint32_t ties;                 // eligible elements with key tau
};

// Walking the eligible elements of positions [0, n) by key, largest first, the running total of 1 per
// element (kBySum false) or of fixed_of_key (kBySum true) first reaches `target` within the elements of
// key tau. Requires 1 <= target <= the total over the eligible elements. key_of(p, k) sets k and returns
// whether p is eligible. All threads of the block must call it; all get the result.
// Adds the eligible keys of positions [0, n) whose bits under `mask` equal `prefix` to sm's histogram of
// digit (k >> shift) & 255: counts, and with kBySum the fixed-point e. Keys crowd into a few bins (e spans
// few exponents), so the lanes of a warp that share a bin add together: one shared atomic per bin and warp
// instead of up to 32 serialised ones. key_of(p, k) sets k and returns whether p is eligible.
template <int kThreads, bool kBySum, class KeyFn>
__device__ void histogram_keys(int n, KeyFn key_of, uint32_t mask, uint32_t prefix, int shift, RadixSmem& sm) {
  const int lane = threadIdx.x & 31;
  for (int base = 0; base < n; base += kThreads) {  // uniform: every lane reaches the warp intrinsics
    const int p = base + static_cast<int>(threadIdx.x);
    uint32_t k = 0;
    const bool ok = p < n && key_of(p, k) && (k & mask) == prefix;
    const uint32_t d = ok ? (k >> shift) & 0xFFu : 0x100u;
    const uint32_t peers = __match_any_sync(0xffffffffu, d);
    if (ok) {
      const bool leader = lane == __ffs(peers) - 1;
      if constexpr (kBySum) {
        // f <= 2^40: two 20-bit halves, each summed over <= 32 lanes in 32 bits.
        const unsigned long long f = fixed_of_key(k);
        const uint32_t lo = __reduce_add_sync(peers, static_cast<uint32_t>(f & 0xFFFFFull));
        const uint32_t hi = __reduce_add_sync(peers, static_cast<uint32_t>(f >> 20));
        const unsigned long long sum = (static_cast<unsigned long long>(hi) << 20) + lo;
        if (leader && sum) atomicAdd(&sm.val[d], sum);
      }
      if (leader) atomicAdd(&sm.cnt[d], static_cast<uint32_t>(__popc(peers)));
    }
  }
}

// Call from warp 0 only: the bin d (walking 255 down) with above(d) < remaining <= above(d) + bin(d), into
// sm.digit and sm.above. Exactly one bin qualifies when 1 <= remaining <= the total of the bins.
template <class BinFn>
__device__ void decide_digit(BinFn bin, unsigned long long remaining, RadixSmem& sm) {
  const int lane = threadIdx.x & 31;
  // Lane l owns bins 255 - 8l .. 248 - 8l.
  unsigned long long s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += bin(255 - 8 * lane - j);
  unsigned long long incl = s;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  unsigned long long cum = incl - s;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int d = 255 - 8 * lane - j;
    const unsigned long long v = bin(d);
    if (cum < remaining && remaining <= cum + v) {
      sm.digit = static_cast<uint32_t>(d);
      sm.above = cum;
    }
    cum += v;
  }
}

// Walking the eligible elements of positions [0, n) by key, largest first, the running total of 1 per
// element (kBySum false) or of fixed_of_key (kBySum true) first reaches `target` within the elements of
// key tau. Requires 1 <= target <= the total over the eligible elements. key_of(p, k) sets k and returns
// whether p is eligible. All threads of the block must call it; all get the result.
template <int kThreads, bool kBySum, class KeyFn>
__device__ RadixResult radix_select(int n, unsigned long long target, KeyFn key_of, RadixSmem& sm) {
  const int warp = threadIdx.x >> 5;
  uint32_t prefix = 0, mask = 0, ties = 0;
  unsigned long long remaining = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) {
      sm.val[i] = 0;
      sm.cnt[i] = 0;
    }
    __syncthreads();
    histogram_keys<kThreads, kBySum>(n, key_of, mask, prefix, shift, sm);
    __syncthreads();
    if (warp == 0) {
      if constexpr (kBySum) decide_digit([&](int d) -> unsigned long long { return sm.val[d]; }, remaining, sm);
      else decide_digit([&](int d) -> unsigned long long { return sm.cnt[d]; }, remaining, sm);
    }
    __syncthreads();
    const uint32_t d = sm.digit;
    prefix |= d << shift;
    mask |= 0xFFu << shift;
    remaining -= sm.above;
    ties = sm.cnt[d];
    __syncthreads();  // the next round clears the histogram
  }
  return {prefix, remaining, ties};
}

// The position of the r-th (1-based) p in [0, n), ascending, with match(p); -1 if there are fewer.
// wcnt: 32 slots; found: one slot.
template <int kThreads, class MatchFn>
__device__ int nth_match(int n, int r, MatchFn match, uint32_t* wcnt, int* found) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) *found = -1;
  __syncthreads();
  int base = 0;  // the same in every thread
  for (int tile = 0; tile < n && base < r; tile += kThreads) {
    const int p = tile + static_cast<int>(threadIdx.x);
    const bool f = p < n && match(p);
    const uint32_t b = __ballot_sync(0xffffffffu, f);
    if (lane == 0) wcnt[warp] = __popc(b);
    __syncthreads();
    int before = base + __popc(b & ((1u << lane) - 1u)), total = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      const int c = static_cast<int>(wcnt[w]);
      total += c;
      if (w < warp) before += c;
    }
    if (f && before + 1 == r) *found = p;
    base += total;
    __syncthreads();
  }
  const int res = *found;
  __syncthreads();
  return res;
}

// Calls put(j, p) for the first r positions p in [0, n), ascending, with match(p) (j = 0, 1, ...: the rank).
// Returns how many were found (<= r). wcnt: 32 slots. Ends with a barrier.
template <int kThreads, class MatchFn, class PutFn>
__device__ int gather_first(int n, int r, MatchFn match, PutFn put, uint32_t* wcnt) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int base = 0;  // the same in every thread
  for (int tile = 0; tile < n && base < r; tile += kThreads) {
    const int p = tile + static_cast<int>(threadIdx.x);
    const bool f = p < n && match(p);
    const uint32_t b = __ballot_sync(0xffffffffu, f);
    if (lane == 0) wcnt[warp] = __popc(b);
    __syncthreads();
    int before = base + __popc(b & ((1u << lane) - 1u)), total = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      const int c = static_cast<int>(wcnt[w]);
      total += c;
      if (w < warp) before += c;
    }
    if (f && before < r) put(before, p);
    base += total;
    __syncthreads();
  }
  return base < r ? base : r;
}

struct SelectSmem {
  RadixSmem radix;
  uint32_t key[kMaxK];
  int32_t idx[kMaxK];
  uint32_t skey[kMaxK];  // the result, sorted
  int32_t sidx[kMaxK];
  uint32_t wcnt[32];
  int count;
};

// The first K (1 <= K <= min(n, kMaxK)) of positions [0, n) in (key desc, index asc) order, sorted, into
// sm.skey / sm.sidx. Among equal keys, position order must be index order.
template <int kThreads, class KeyFn, class IdxFn>
__device__ void block_select(int n, int K, KeyFn key_at, IdxFn index_at, SelectSmem& sm) {
  const RadixResult rr = radix_select<kThreads, false>(
      n, static_cast<unsigned long long>(K), [&](int p, uint32_t& k) { k = key_at(p); return true; }, sm.radix);
  const uint32_t tau = rr.key;
  const int r = static_cast<int>(rr.remaining);  // ties to take, 1 <= r <= rr.ties
  const int gt = K - r;                          // exactly gt keys are > tau
  if (threadIdx.x == 0) sm.count = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < n; p += kThreads) {
    const uint32_t k = key_at(p);
    if (k > tau) {
      const int s = atomicAdd(&sm.count, 1);
      sm.key[s] = k;
      sm.idx[s] = index_at(p);
    }
  }
  // The first r ties by position.
  gather_first<kThreads>(
      n, r, [&](int p) { return key_at(p) == tau; },
      [&](int j, int p) {
        sm.key[gt + j] = tau;
        sm.idx[gt + j] = index_at(p);
      },
      sm.wcnt);
  if (threadIdx.x < K) {
    const uint32_t k = sm.key[threadIdx.x];
    const int32_t i = sm.idx[threadIdx.x];
    int rank = 0;
    for (int j = 0; j < K; ++j) {
      const uint32_t kj = sm.key[j];
      rank += (kj > k || (kj == k && sm.idx[j] < i)) ? 1 : 0;
    }
    sm.skey[rank] = k;
    sm.sidx[rank] = i;
  }
  __syncthreads();
}

}  // namespace kiln::cuda::sampling
