// Device code of topk, the greedy argmax and sample (definitions: src/ops/sampling_math.h; launchers and the
// choice of path: src/cuda/sampling.cu).
//
// Building blocks:
// - chunk kernels: a row of V elements is cut into `nb` chunks of `chunk` (<= kChunkMax) elements, one block
//   each (gridDim = (nb, rows)); each writes a per-chunk partial (argmax, or its first K in topk order).
// - row kernels: one block of kRowThreads per row combines the partials and finishes.
// - radix_select: walks the 32-bit keys from the top, 8 bits per round, with a histogram in shared memory,
//   to find the key at which a running count (top_k) or a running fixed-point sum of e (top_p) reaches a
//   target. Ties at that key are then resolved by position, which is index order.
// Keys: topk orders floats by topk_float_key (NaN largest, -0 == +0); sample orders e >= 0 by sample_key.
// Both leave 0 free as the key of padding, below every real key.
#pragma once

#include <cstdint>

#include "cuda/device_error.h"
#include "kiln/scalar_types.h"
#include "ops/sampling_math.h"

namespace kiln::cuda::sampling {

constexpr int kMaxK = 64;           // topk's k and the fast top_k path of sample
constexpr int kChunkMax = 4096;     // elements a chunk block holds in shared memory (16 KB of keys)
constexpr int kChunkThreads = 256;
constexpr int kRowThreads = 1024;
// top_p sums are taken in fixed point (e * 2^40, truncated): exact and independent of the summation
// order, so a seed gives the same tokens whatever the block schedule. e <= 1 and V < 2^23 keep it < 2^63.
constexpr double kFixedScale = 1099511627776.0;

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
  return static_cast<unsigned long long>(static_cast<double>(sample_key_value(key)) * kFixedScale);
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

// ---- kernels -------------------------------------------------------------------------------------------------
// Rows: blockIdx.y (chunk kernels) or blockIdx.x (row kernels), grid-strided. Within a row, int positions
// (V < 2^31, checked by the launcher); row offsets are int64.

// Per chunk: its argmax (topk order) into partial[row * nb + chunk], or, when tokens is set (nb == 1), the
// row's token. Block (0, 0) also takes the Philox offset from the device counter when there is one.
template <class T>
__global__ void __launch_bounds__(kChunkThreads)
    chunk_argmax_kernel(const T* __restrict__ x, int64_t rows, int V, int chunk, int nb, ArgPartial* partial,
                        int64_t* tokens, int64_t* offset_counter, uint64_t* offset_taken) {
  __shared__ ArgPartial red[33];
  if (offset_counter && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    const int64_t o = *offset_counter;
    *offset_taken = static_cast<uint64_t>(o);
    *offset_counter = o + 1;
  }
  const int begin = static_cast<int>(blockIdx.x) * chunk;
  const int n = ::min(chunk, V - begin);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const T* xr = x + row * V + begin;
    ArgPartial a = arg_identity();
#pragma unroll 4
    for (int p = threadIdx.x; p < n; p += kChunkThreads) {
      const ArgPartial b{convert<float>(xr[p]), begin + p};
      if (arg_before(b, a)) a = b;
    }
    a = block_argmax<kChunkThreads>(a, red);
    if (threadIdx.x == 0) {
      if (tokens) tokens[row] = a.i;
      else partial[row * nb + blockIdx.x] = a;
    }
  }
}

// The greedy token of each row from its partials: one warp per row.
__global__ void argmax_finalize_kernel(const ArgPartial* __restrict__ partial, int nb, int64_t rows,
                                       int64_t* __restrict__ tokens) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp
  const int lane = threadIdx.x & 31;
  ArgPartial a = arg_identity();
  for (int j = lane; j < nb; j += 32)
    if (arg_before(partial[row * nb + j], a)) a = partial[row * nb + j];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const ArgPartial b{__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)};
    if (arg_before(b, a)) a = b;
  }
  if (lane == 0) tokens[row] = a.i;
}

// Per chunk: its first K elements in topk order. Output: candidates [rows, nb, K] (padded with key 0 where a
// chunk has fewer than K elements), or, for topk with one chunk per row (values set), the final values and
// indices. For sample's top_k path, block (0, 0) also takes the Philox offset from the device counter.
template <class T>
__global__ void __launch_bounds__(kChunkThreads)
    chunk_select_kernel(const T* __restrict__ x, int64_t rows, int V, int chunk, int nb, int K, uint32_t* ckey,
                        int32_t* cidx, T* values, int64_t* indices, int64_t* offset_counter, uint64_t* offset_taken) {
  __shared__ uint32_t keys[kChunkMax];
  __shared__ SelectSmem sm;
  if (offset_counter && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    const int64_t o = *offset_counter;
    *offset_taken = static_cast<uint64_t>(o);
    *offset_counter = o + 1;
  }
  const int begin = static_cast<int>(blockIdx.x) * chunk;
  const int n = ::min(chunk, V - begin);  // >= 1: nb = ceil(V / chunk)
  const int kb = ::min(K, n);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const T* xr = x + row * V;
    for (int p = threadIdx.x; p < n; p += kChunkThreads) keys[p] = topk_float_key(convert<float>(xr[begin + p]));
    __syncthreads();
    block_select<kChunkThreads>(
        n, kb, [&](int p) { return keys[p]; }, [&](int p) { return begin + p; }, sm);
    if (values) {
      for (int j = threadIdx.x; j < K; j += kChunkThreads) {
        const int32_t i = sm.sidx[j];
        values[row * K + j] = xr[i];  // the element itself: keeps -0.0 and NaN payloads
        indices[row * K + j] = i;
      }
    } else {
      const int64_t base = (row * nb + blockIdx.x) * K;
      for (int j = threadIdx.x; j < K; j += kChunkThreads) {
        ckey[base + j] = j < kb ? sm.skey[j] : 0u;
        cidx[base + j] = j < kb ? sm.sidx[j] : INT32_MAX;
      }
    }
    __syncthreads();  // keys and sm are reused by the next row
  }
}

// topk: the first K of the row's nb * K candidates (flattened in chunk order, each chunk's list in topk
// order, so equal keys appear in index order).
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    topk_merge_kernel(const T* __restrict__ x, int64_t rows, int V, int nb, int K, const uint32_t* __restrict__ ckey,
                      const int32_t* __restrict__ cidx, T* __restrict__ values, int64_t* __restrict__ indices) {
  __shared__ SelectSmem sm;
  const int n = nb * K;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const uint32_t* kr = ckey + row * n;
    const int32_t* ir = cidx + row * n;
    block_select<kRowThreads>(n, K, [&](int p) { return kr[p]; }, [&](int p) { return ir[p]; }, sm);
    for (int j = threadIdx.x; j < K; j += kRowThreads) {
      const int32_t i = sm.sidx[j];
      values[row * K + j] = x[row * V + i];
      indices[row * K + j] = i;
    }
    __syncthreads();
  }
}

struct SampleArgs {
  int64_t rows;
  int V;
  int nb;
  int top_k;       // 0: off (top_k == 0 or >= V)
  bool use_top_p;
  float top_p;
  bool use_min_p;
  float min_p;
  uint64_t seed;
  uint64_t offset;              // used when offset_taken is null
  const uint64_t* offset_taken;  // the offset chunk_argmax_kernel took from the device counter, or null
  int64_t* tokens;
  DeviceErrorRecord* err;
};

__device__ __forceinline__ void report_bad_row(const SampleArgs& a, int64_t row) {
  a.tokens[row] = 0;
  report_device_error(a.err, DeviceErrorCode::InvalidDistribution, OpId::Sample, row, a.V);
}

// The inverse of topk_float_key (NaN for the NaN key; -0.0 comes back as +0.0).
__device__ __forceinline__ float float_of_topk_key(uint32_t k) {
  if (k == 0xFFFFFFFFu) return __int_as_float(0x7fffffff);
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// The fast top_k path (1 <= top_k <= kMaxK, top_k < V), from the row's chunk candidates by logit (the
// topk kernels' order; no pass over the row is needed first). e is non-decreasing in the logit, so the
// first top_k by (l desc, index asc) are the first top_k by (e desc, index asc) except when logits below the
// top_k-th one, l_K, round to the same e as it (tau): then the ties at tau are taken from the whole row in
// index order (a scan of the row by this block; it needs |l_K| below about T, and tau > 0). Then top_p,
// min_p and the draw exactly as the CPU does them: sequential f32 sums in the definition's order over at
// most kMaxK tokens.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    sample_topk_final_kernel(SampleArgs a, const T* __restrict__ x, float temperature,
                             const uint32_t* __restrict__ ckey, const int32_t* __restrict__ cidx) {
  __shared__ SelectSmem sm;
  __shared__ float fe[kMaxK], ge[kMaxK], de[kMaxK];
  __shared__ int32_t fidx[kMaxK], gidx[kMaxK], di[kMaxK];
  __shared__ int kept[kMaxK];
  __shared__ int prefix_len, n_gt, fallback;
  __shared__ float l_lo;
  const int K = a.top_k, V = a.V;
  const int n = a.nb * K;
  const uint64_t offset = a.offset_taken ? *a.offset_taken : a.offset;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const uint32_t* kr = ckey + row * n;
    const int32_t* ir = cidx + row * n;
    block_select<kRowThreads>(n, K, [&](int p) { return kr[p]; }, [&](int p) { return ir[p]; }, sm);
    // The row's maximum is the first candidate; NaN anywhere makes it NaN (NaN sorts first).
    const float m = float_of_topk_key(sm.skey[0]);
    if (row_is_bad(m)) {
      if (threadIdx.x == 0) report_bad_row(a, row);
      __syncthreads();  // sm is rewritten by the next row
      continue;         // uniform
    }
    if (threadIdx.x < K) fe[threadIdx.x] = sample_weight(float_of_topk_key(sm.skey[threadIdx.x]), m, temperature);
    __syncthreads();
    const float l_k = float_of_topk_key(sm.skey[K - 1]);
    const float tau = fe[K - 1];  // the smallest e of the candidates
    if (threadIdx.x == 0) {
      int gt = 0;
      while (gt < K && fe[gt] > tau) ++gt;  // e is non-increasing along the candidates
      n_gt = gt;
      int fb = 0;
      if (tau > 0.0f && sample_weight(nextafterf(l_k, -__int_as_float(0x7f800000)), m, temperature) == tau) {
        // Smallest logit with e == tau, by bisection over the ordered keys (e is monotone in the key).
        uint32_t lo = 0x007FFFFFu, hi = topk_float_key(l_k);  // -inf .. l_k
        while (lo < hi) {
          const uint32_t mid = lo + (hi - lo) / 2;
          if (sample_weight(float_of_topk_key(mid), m, temperature) >= tau) hi = mid;
          else lo = mid + 1;
        }
        l_lo = float_of_topk_key(hi);
        fb = 1;
      }
      fallback = fb;
    }
    __syncthreads();
    if (fallback) {  // uniform
      // Every element with l >= l_lo has e >= tau; those with e > tau are the first gt candidates. Take
      // the first K - gt with e == tau in the row, by index (at least that many exist: the candidates tied
      // at tau). fe[gt..K) already hold tau.
      const int gt = n_gt;
      const float lo = l_lo;
      const T* xr = x + row * V;
      if (threadIdx.x < K) fidx[threadIdx.x] = sm.sidx[threadIdx.x];  // [gt, K) are overwritten below
      gather_first<kRowThreads>(
          V, K - gt,
          [&](int p) {
            const float l = convert<float>(xr[p]);
            return l >= lo && sample_weight(l, m, temperature) == tau;
          },
          [&](int j, int p) { fidx[gt + j] = p; }, sm.wcnt);
    } else if (threadIdx.x < K) {
      fidx[threadIdx.x] = sm.sidx[threadIdx.x];
    }
    __syncthreads();
    // (e desc, index asc): candidates of different logits may share an e.
    if (threadIdx.x < K) {
      const float e = fe[threadIdx.x];
      const int32_t i = fidx[threadIdx.x];
      int rank = 0;
      for (int j = 0; j < K; ++j) rank += (fe[j] > e || (fe[j] == e && fidx[j] < i)) ? 1 : 0;
      ge[rank] = e;
      gidx[rank] = i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int np = K;
      if (a.use_top_p) {
        float s = 0.0f;
        for (int j = 0; j < K; ++j) s += ge[j];
        const float target = a.top_p * s;
        float c = 0.0f;
        for (np = 0; np < K;) {
          c += ge[np++];
          if (c >= target) break;
        }
      }
      prefix_len = np;
    }
    __syncthreads();
    if (threadIdx.x < K) {
      const float e = ge[threadIdx.x];
      kept[threadIdx.x] = (static_cast<int>(threadIdx.x) < prefix_len && !(a.use_min_p && e < a.min_p)) ? 1 : 0;
    }
    __syncthreads();
    // The kept tokens in ascending index order.
    if (threadIdx.x < K && kept[threadIdx.x]) {
      const int32_t i = gidx[threadIdx.x];
      int pos = 0;
      for (int j = 0; j < K; ++j) pos += (kept[j] && gidx[j] < i) ? 1 : 0;
      de[pos] = ge[threadIdx.x];
      di[pos] = i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int nk = 0;
      for (int j = 0; j < K; ++j) nk += kept[j];
      float w = 0.0f;
      int last = -1;
      for (int j = 0; j < nk; ++j) {
        w += de[j];
        if (de[j] > 0.0f) last = j;
      }
      const float t = sample_uniform(a.seed, offset, static_cast<uint64_t>(row)) * w;
      float c = 0.0f;
      int tok = -1;
      for (int j = 0; j < nk; ++j) {
        c += de[j];
        if (c > t) {
          tok = di[j];
          break;
        }
      }
      // last >= 0: e_max = 1 is always kept.
      a.tokens[row] = tok >= 0 ? tok : (last >= 0 ? di[last] : 0);
    }
    __syncthreads();
  }
}

// ---- the chunked draw: no top_k, and top_p (if any) found over all chunks ------------------------------------
// Without top_k / top_p (temperature only, or min_p) every token is a candidate. With top_p alone on long rows,
// topp_round_kernel (4 launches) finds the threshold key tau by a radix search whose histograms every chunk
// adds to with integer atomics (exact, so every block replays the same decisions), and topp_ties_kernel counts
// each chunk's ties at tau: the prefix of the order (e desc, index asc) is {key > tau} and the first r ties.

// Per row: 4 rounds x 256 bins of the fixed-point e and the count (digits of sample_key, high first).
// Zeroed (memset) before round 0.
struct TopPHist {
  unsigned long long val[4][256];
  uint32_t cnt[4][256];
};

struct TopPThreshold {
  uint32_t tau;  // key
  int32_t r;     // ties at tau to keep, in index order
};

struct TopPState {
  uint32_t prefix, mask;
  unsigned long long remaining;
  uint32_t ties;
};

// The decisions of rounds [0, rounds) replayed from the row's histograms (every block gets the same). The
// target is top_p * S in fixed point, S = the total of round 0, rounded as sample_general_kernel does.
template <int kThreads>
__device__ TopPState topp_replay(const TopPHist& h, int rounds, float top_p, RadixSmem& sm, unsigned long long* ured) {
  TopPState st{0, 0, 0, 0};
  if (rounds == 0) return st;
  unsigned long long part = 0;
  for (int i = threadIdx.x; i < 256; i += kThreads) part += h.val[0][i];
  const unsigned long long s = block_sum_u64<kThreads>(part, ured);
  const float s_f = static_cast<float>(static_cast<double>(s) / kFixedScale);
  const float target_f = top_p * s_f;
  unsigned long long target = static_cast<unsigned long long>(static_cast<double>(target_f) * kFixedScale);
  st.remaining = target < 1 ? 1 : (target > s ? s : target);
  for (int j = 0; j < rounds; ++j) {
    if ((threadIdx.x >> 5) == 0)
      decide_digit([&](int d) -> unsigned long long { return h.val[j][d]; }, st.remaining, sm);
    __syncthreads();
    const uint32_t d = sm.digit;
    const int shift = 24 - 8 * j;
    st.prefix |= d << shift;
    st.mask |= 0xFFu << shift;
    st.remaining -= sm.above;
    st.ties = h.cnt[j][d];
    __syncthreads();
  }
  return st;
}

// Round `round` of the top_p search: this chunk's keys under the decided prefix into the row's histogram.
template <class T>
__global__ void __launch_bounds__(kChunkThreads)
    topp_round_kernel(const T* __restrict__ x, int64_t rows, int V, int chunk, int nb,
                      const ArgPartial* __restrict__ partial, float temperature, float top_p, int round,
                      TopPHist* __restrict__ hist) {
  __shared__ ArgPartial red[33];
  __shared__ unsigned long long ured[33];
  __shared__ RadixSmem sm;
  const int begin = static_cast<int>(blockIdx.x) * chunk;
  const int n = ::min(chunk, V - begin);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const float m = row_argmax<kChunkThreads>(partial + row * nb, nb, red).v;
    if (row_is_bad(m)) continue;
    TopPHist& h = hist[row];
    const TopPState st = topp_replay<kChunkThreads>(h, round, top_p, sm, ured);
    for (int i = threadIdx.x; i < 256; i += kChunkThreads) {
      sm.val[i] = 0;
      sm.cnt[i] = 0;
    }
    __syncthreads();
    const T* xr = x + row * V + begin;
    histogram_keys<kChunkThreads, true>(
        n,
        [&](int p, uint32_t& k) {
          k = sample_key(sample_weight(convert<float>(xr[p]), m, temperature));
          return true;
        },
        st.mask, st.prefix, 24 - 8 * round, sm);
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += kChunkThreads) {
      if (sm.cnt[i]) {
        atomicAdd(&h.cnt[round][i], sm.cnt[i]);
        if (sm.val[i]) atomicAdd(&h.val[round][i], sm.val[i]);
      }
    }
    __syncthreads();  // sm is reused by the next row
  }
}

// After the 4 rounds: tau and r (written by chunk 0), and this chunk's count of keys equal to tau.
template <class T>
__global__ void __launch_bounds__(kChunkThreads)
    topp_ties_kernel(const T* __restrict__ x, int64_t rows, int V, int chunk, int nb,
                     const ArgPartial* __restrict__ partial, float temperature, float top_p,
                     const TopPHist* __restrict__ hist, TopPThreshold* __restrict__ thr, int* __restrict__ tie_count) {
  __shared__ ArgPartial red[33];
  __shared__ unsigned long long ured[33];
  __shared__ RadixSmem sm;
  const int begin = static_cast<int>(blockIdx.x) * chunk;
  const int n = ::min(chunk, V - begin);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const float m = row_argmax<kChunkThreads>(partial + row * nb, nb, red).v;
    if (row_is_bad(m)) continue;
    const TopPState st = topp_replay<kChunkThreads>(hist[row], 4, top_p, sm, ured);
    const uint32_t tau = st.prefix;
    const T* xr = x + row * V + begin;
    unsigned long long c = 0;
    for (int p = threadIdx.x; p < n; p += kChunkThreads)
      c += sample_key(sample_weight(convert<float>(xr[p]), m, temperature)) == tau ? 1 : 0;
    c = block_sum_u64<kChunkThreads>(c, ured);
    if (threadIdx.x == 0) {
      tie_count[row * nb + blockIdx.x] = static_cast<int>(c);
      if (blockIdx.x == 0) {
        const unsigned long long f = fixed_of_key(tau);  // > 0: the search stops in a bin of positive sum
        unsigned long long r = f ? (st.remaining + f - 1) / f : 1;
        r = r < 1 ? 1 : (r > st.ties ? st.ties : r);
        thr[row] = TopPThreshold{tau, static_cast<int32_t>(r)};
      }
    }
  }
}

struct ChunkSum {
  float w;       // the chunk's kept e, summed by the chunk scan below
  int32_t last;  // its last kept token with e > 0, or -1
};

// What the chunk kernels keep of a row.
struct KeepRule {
  bool use_min_p;
  float min_p;
  const TopPThreshold* thr;  // null: no top_p
  const int* tie_count;      // [rows, nb] with thr
};

// Walks one chunk tile by tile (kChunkThreads elements, index order); every thread of the block must call
// next() for each tile in turn. Returns element p's kept weight (0 if dropped or p >= n).
template <class T>
struct ChunkWalker {
  const T* xr;  // the chunk's first element
  int n;
  float m, temperature;
  KeepRule rule;
  uint32_t tau;
  int r, ties_before;  // ties at tau kept in all; ties in the chunks before this one
  float tie_carry;     // ties in this chunk's earlier tiles (exact: < 2^24)
  float* ws;

  __device__ float next(int p) {
    const bool valid = p < n;
    const float e = valid ? sample_weight(convert<float>(xr[p]), m, temperature) : 0.0f;
    bool keep = valid;
    if (rule.thr) {  // uniform
      const uint32_t k = sample_key(e);
      const bool is_tie = valid && k == tau;
      float tile_ties;
      const float incl = block_scan<kChunkThreads>(is_tie ? 1.0f : 0.0f, ws, tile_ties);
      const int rank = ties_before + static_cast<int>(tie_carry) + static_cast<int>(incl) - 1;
      keep = valid && (k > tau || (is_tie && rank < r));
      tie_carry += tile_ties;
    }
    return (keep && !(rule.use_min_p && e < rule.min_p)) ? e : 0.0f;
  }
};

// Ties at tau in the chunks before `b` (all threads get it).
__device__ __forceinline__ int ties_before_chunk(const KeepRule& rule, int64_t row, int nb, int b,
                                                 unsigned long long* ured) {
  if (!rule.thr) return 0;
  unsigned long long c = 0;
  for (int j = threadIdx.x; j < b; j += kChunkThreads) c += static_cast<unsigned long long>(rule.tie_count[row * nb + j]);
  return static_cast<int>(block_sum_u64<kChunkThreads>(c, ured));
}

// Step 1, per chunk: W_b = the chunk's kept e, added tile by tile with block_scan (the order step 2 repeats).
template <class T>
__global__ void __launch_bounds__(kChunkThreads)
    sample_chunk_sums_kernel(const T* __restrict__ x, int64_t rows, int V, int chunk, int nb,
                             const ArgPartial* __restrict__ partial, float temperature, KeepRule rule,
                             ChunkSum* __restrict__ sums) {
  __shared__ ArgPartial red[33];
  __shared__ float ws[33];
  __shared__ int ired[33];
  __shared__ unsigned long long ured[33];
  const int begin = static_cast<int>(blockIdx.x) * chunk;
  const int n = ::min(chunk, V - begin);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const float m = row_argmax<kChunkThreads>(partial + row * nb, nb, red).v;
    if (row_is_bad(m)) continue;
    ChunkWalker<T> walk{x + row * V + begin, n, m, temperature, rule, 0u, 0, 0, 0.0f, ws};
    if (rule.thr) {
      walk.tau = rule.thr[row].tau;
      walk.r = rule.thr[row].r;
      walk.ties_before = ties_before_chunk(rule, row, nb, static_cast<int>(blockIdx.x), ured);
    }
    float carry = 0.0f;
    int last = -1;
    for (int tile = 0; tile < n; tile += kChunkThreads) {
      const int p = tile + static_cast<int>(threadIdx.x);
      const float v = walk.next(p);
      if (v > 0.0f) last = begin + p;
      float total;
      block_scan<kChunkThreads>(v, ws, total);
      carry += total;
    }
    last = block_max_int<kChunkThreads>(last, ired);
    if (threadIdx.x == 0) sums[row * nb + blockIdx.x] = ChunkSum{carry, last};
  }
}

// Step 2, one block per row: W = the chunk sums in chunk order, t = u W, the chunk where the running sum
// first exceeds t, and within it the first token whose running sum (the same additions as step 1) exceeds t.
template <class T>
__global__ void __launch_bounds__(kChunkThreads)
    sample_chunk_draw_kernel(SampleArgs a, const T* __restrict__ x, int chunk, const ArgPartial* __restrict__ partial,
                             float temperature, KeepRule rule, const ChunkSum* __restrict__ sums) {
  __shared__ ArgPartial red[33];
  __shared__ float ws[33];
  __shared__ unsigned long long ured[33];
  __shared__ int sel_chunk, sel_last, found;
  __shared__ float sel_before, sel_t;
  const int nb = a.nb, V = a.V;
  const uint64_t offset = a.offset_taken ? *a.offset_taken : a.offset;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const float m = row_argmax<kChunkThreads>(partial + row * nb, nb, red).v;
    if (row_is_bad(m)) {
      if (threadIdx.x == 0) report_bad_row(a, row);
      continue;
    }
    const ChunkSum* rs = sums + row * nb;
    if (threadIdx.x == 0) {
      float w = 0.0f;
      int last = -1;
      for (int b = 0; b < nb; ++b) {
        w += rs[b].w;
        last = ::max(last, rs[b].last);
      }
      const float t = sample_uniform(a.seed, offset, static_cast<uint64_t>(row)) * w;
      // The running sum repeats W's additions, so it reaches W > t (W >= e_max = 1) by the last chunk.
      float c = 0.0f;
      int chosen = -1;
      float before = 0.0f;
      for (int b = 0; b < nb; ++b) {
        const float c2 = c + rs[b].w;
        if (c2 > t) {
          chosen = b;
          before = c;
          break;
        }
        c = c2;
      }
      sel_chunk = chosen;
      sel_before = before;
      sel_t = t;
      sel_last = last;
      found = INT32_MAX;
    }
    __syncthreads();
    const int b = sel_chunk;
    if (b < 0) {  // uniform; only if rounding left no crossing
      if (threadIdx.x == 0) a.tokens[row] = sel_last >= 0 ? sel_last : 0;
      __syncthreads();
      continue;
    }
    const int begin = b * chunk;
    const int n = ::min(chunk, V - begin);
    ChunkWalker<T> walk{x + row * V + begin, n, m, temperature, rule, 0u, 0, 0, 0.0f, ws};
    if (rule.thr) {
      walk.tau = rule.thr[row].tau;
      walk.r = rule.thr[row].r;
      walk.ties_before = ties_before_chunk(rule, row, nb, b, ured);
    }
    const float before = sel_before, t = sel_t;
    float local = 0.0f;
    for (int tile = 0; tile < n; tile += kChunkThreads) {
      const int p = tile + static_cast<int>(threadIdx.x);
      const float v = walk.next(p);
      float total;
      const float incl = block_scan<kChunkThreads>(v, ws, total);
      if (v > 0.0f && before + (local + incl) > t) atomicMin(&found, begin + p);
      local += total;
      __syncthreads();
      if (found != INT32_MAX) break;  // uniform: read after the barrier
    }
    if (threadIdx.x == 0) {
      const int in_chunk = rs[b].last;
      a.tokens[row] = found != INT32_MAX ? found : (in_chunk >= 0 ? in_chunk : (sel_last >= 0 ? sel_last : 0));
    }
    __syncthreads();
  }
}

// The general path, step 1: e of every element into ew [rows, V] (f32), chunk by chunk.
template <class T>
__global__ void __launch_bounds__(kChunkThreads)
    sample_weights_kernel(const T* __restrict__ x, int64_t rows, int V, int chunk, int nb,
                          const ArgPartial* __restrict__ partial, float temperature, float* __restrict__ ew) {
  __shared__ ArgPartial red[33];
  const int begin = static_cast<int>(blockIdx.x) * chunk;
  const int n = ::min(chunk, V - begin);
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const float m = row_argmax<kChunkThreads>(partial + row * nb, nb, red).v;
    if (row_is_bad(m)) continue;
    const T* xr = x + row * V + begin;
    float* er = ew + row * V + begin;
#pragma unroll 4
    for (int p = threadIdx.x; p < n; p += kChunkThreads) er[p] = sample_weight(convert<float>(xr[p]), m, temperature);
  }
}

// The general path, step 2: one block per row over e (which stays in L2). The kept prefix of the order
// (e desc, index asc) is {key > tk} + {key == tk, index <= ti}; top_k finds (tk, ti) by a count search,
// top_p within it by a fixed-point sum search; then min_p, and the draw by a block scan in index order.
__global__ void __launch_bounds__(kRowThreads)
    sample_general_kernel(SampleArgs a, const ArgPartial* __restrict__ partial, const float* __restrict__ ew) {
  __shared__ RadixSmem rs;
  __shared__ ArgPartial red[33];
  __shared__ unsigned long long ured[33];
  __shared__ int ired[33];
  __shared__ float ws[33];
  __shared__ uint32_t wcnt[32];
  __shared__ int found;
  const int V = a.V;
  const uint64_t offset = a.offset_taken ? *a.offset_taken : a.offset;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const float m = row_argmax<kRowThreads>(partial + row * a.nb, a.nb, red).v;
    if (row_is_bad(m)) {
      if (threadIdx.x == 0) report_bad_row(a, row);
      continue;
    }
    const float* e = ew + row * V;
    uint32_t tk = 0;  // every key is > 0: all of the row
    int ti = INT32_MAX;
    if (a.top_k > 0) {
      const RadixResult rr = radix_select<kRowThreads, false>(
          V, static_cast<unsigned long long>(a.top_k),
          [&](int p, uint32_t& k) {
            k = sample_key(e[p]);
            return true;
          },
          rs);
      const uint32_t tau = rr.key;
      ti = nth_match<kRowThreads>(
          V, static_cast<int>(rr.remaining), [&](int p) { return sample_key(e[p]) == tau; }, wcnt, &found);
      tk = tau;
    }
    if (a.use_top_p) {
      const uint32_t tk0 = tk;
      const int ti0 = ti;
      auto in_prefix = [=](int p, uint32_t k) { return k > tk0 || (k == tk0 && p <= ti0); };
      unsigned long long s = 0;
      for (int p = threadIdx.x; p < V; p += kRowThreads) {
        const uint32_t k = sample_key(e[p]);
        if (in_prefix(p, k)) s += fixed_of_key(k);
      }
      s = block_sum_u64<kRowThreads>(s, ured);  // >= 2^40: e_max = 1 is in the prefix
      const float s_f = static_cast<float>(static_cast<double>(s) / kFixedScale);
      const float target_f = a.top_p * s_f;
      unsigned long long target = static_cast<unsigned long long>(static_cast<double>(target_f) * kFixedScale);
      target = target < 1 ? 1 : (target > s ? s : target);
      const RadixResult rr = radix_select<kRowThreads, true>(
          V, target,
          [&](int p, uint32_t& k) {
            k = sample_key(e[p]);
            return in_prefix(p, k);
          },
          rs);
      const uint32_t tau = rr.key;
      const unsigned long long f = fixed_of_key(tau);  // > 0: the search stops in a bin of positive sum
      unsigned long long r = f ? (rr.remaining + f - 1) / f : 1;
      r = r < 1 ? 1 : (r > rr.ties ? rr.ties : r);
      ti = nth_match<kRowThreads>(
          V, static_cast<int>(r),
          [&](int p) {
            const uint32_t k = sample_key(e[p]);
            return k == tau && in_prefix(p, k);
          },
          wcnt, &found);
      tk = tau;
    }
    auto weight = [&](int p) -> float {  // e if p is kept, else 0
      const float ep = e[p];
      const uint32_t k = sample_key(ep);
      const bool keep = (k > tk || (k == tk && p <= ti)) && !(a.use_min_p && ep < a.min_p);
      return keep ? ep : 0.0f;
    };
    // W, and the last kept token with e > 0 (the fallback when rounding leaves no crossing).
    float carry = 0.0f;
    int last = -1;
    for (int tile = 0; tile < V; tile += kRowThreads) {
      const int p = tile + static_cast<int>(threadIdx.x);
      const float v = p < V ? weight(p) : 0.0f;
      if (v > 0.0f) last = p;
      float total;
      block_scan<kRowThreads>(v, ws, total);
      carry += total;
    }
    last = block_max_int<kRowThreads>(last, ired);
    const float t = sample_uniform(a.seed, offset, static_cast<uint64_t>(row)) * carry;
    if (threadIdx.x == 0) found = INT32_MAX;
    __syncthreads();
    carry = 0.0f;
    for (int tile = 0; tile < V; tile += kRowThreads) {
      const int p = tile + static_cast<int>(threadIdx.x);
      const float v = p < V ? weight(p) : 0.0f;
      float total;
      const float incl = block_scan<kRowThreads>(v, ws, total);
      if (v > 0.0f && carry + incl > t) atomicMin(&found, p);
      carry += total;
      __syncthreads();
      if (found != INT32_MAX) break;  // uniform: read after the barrier, written before it
    }
    if (threadIdx.x == 0) a.tokens[row] = found != INT32_MAX ? found : (last >= 0 ? last : 0);
    __syncthreads();
  }
}

}  // namespace kiln::cuda::sampling
