// Device code of topk, the greedy argmax and sample (definitions: src/ops/sampling_math.h; launchers and the
// choice of path: src/cuda/sampling.cu).
//
// Building blocks:
// - chunk kernels: a row of V elements is cut into `nb` chunks of `chunk` (<= kChunkMax) elements, one block
//   each (gridDim = (nb, rows)); each writes a per-chunk partial (argmax, or its first K in topk order).
// - row kernels: one block of kRowThreads per row combines the partials and finishes.
// - radix_select (sampling_blocks.cuh): walks the 32-bit keys from the top, 8 bits per round, with a histogram in shared memory,
//   to find the key at which a running count (top_k) or a running fixed-point sum of e (top_p) reaches a
//   target. Ties at that key are then resolved by position, which is index order.
// Keys: topk orders floats by topk_float_key (NaN largest, -0 == +0); sample orders e >= 0 by sample_key.
// Both leave 0 free as the key of padding, below every real key.
#pragma once

#include <cstdint>

#include "cuda/device_error.h"
#include "cuda/kernels/sampling_blocks.cuh"
#include "kiln/scalar_types.h"
#include "ops/sampling_math.h"

namespace kiln::cuda::sampling {

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
        uint64_t s = 0;
        for (int j = 0; j < K; ++j) s += topp_fixed(ge[j]);
        const uint64_t target = topp_target(s, a.top_p);
        uint64_t c = 0;
        for (np = 0; np < K;) {
          c += topp_fixed(ge[np++]);
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
  st.remaining = topp_target(s, top_p);
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
      const unsigned long long target = topp_target(s, a.top_p);
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
