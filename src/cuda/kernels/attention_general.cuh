// Device code of the attention paths that are not tensor-core tiles: the general kernel (any dtype, head
// dims, strides, masks, broadcasting; the correct fallback for every shape) and the KV-cache append.
#pragma once

#include <cstdint>

#include "cuda/device_error.h"
#include "cuda/kernels/pdl.cuh"
#include "cuda/kernels/strided.cuh"
#include "kiln/scalar_types.h"
#include "ops/attention_math.h"

namespace kiln::cuda::attn {

namespace am = attention_math;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The valid key count of outer index o: Lkv, or lengths[o] for decode. A length outside [0, Lkv] is
// reported (once per sequence: by its row 0 of head 0) and treated as 0, so nothing out of bounds is read.
__device__ __forceinline__ int64_t valid_keys(const am::Layout& L, const int32_t* lengths, int64_t o, bool reporter,
                                              DeviceErrorRecord* err) {
  if (!L.has_lengths) return L.lkv;
  const int64_t n = lengths[o];
  if (n < 0 || n > L.lkv) {
    if (reporter) report_device_error(err, DeviceErrorCode::IndexOutOfRange, OpId::DecodeAttention, n, L.lkv + 1);
    return 0;
  }
  return n;
}

// One warp per query row. Keys go 32 at a time, one per lane (each lane a full dot product with the row of
// q held in shared memory), then an online-softmax update of the row's accumulator (shared memory, lanes
// owning channels lane, lane + 32, ...). Rows with no key to attend give 0, as the CPU reference.
// Dynamic shared memory: warps_per_block * (D + Dv) floats.
template <class T>
__global__ void attention_general_kernel(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k,
                                         const T* __restrict__ v, const void* __restrict__ mask,
                                         const int32_t* __restrict__ lengths, am::Layout L, float scale,
                                         int64_t rows, DeviceErrorRecord* err) {
  extern __shared__ float smem[];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* qs = smem + warp * (L.d + L.dv);
  float* acc = qs + L.d;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    const int64_t i = row % L.lq, task = row / L.lq;
    const int64_t h = task % L.heads, o = task / L.heads;
    const am::Offsets off = am::batch_offsets(L, o, h);
    const int64_t kv_len = valid_keys(L, lengths, o, lane == 0 && h == 0 && i == 0, err);
    const int64_t e = am::key_end(i, L.lq, kv_len, L.causal, L.has_lengths);
    for (int64_t c = lane; c < L.d; c += 32) qs[c] = convert<float>(q[off.q + i * L.q_row + c * L.q_col]);
    for (int64_t c = lane; c < L.dv; c += 32) acc[c] = 0.f;
    __syncwarp();
    float m = -INFINITY, l = 0.f;
    for (int64_t j0 = 0; j0 < e; j0 += 32) {
      const int64_t j = j0 + lane;
      float s = -INFINITY;
      if (j < e) {
        const T* kr = k + off.k + j * L.k_row;
        float dot = 0.f;
        for (int64_t c = 0; c < L.d; ++c) dot += qs[c] * convert<float>(kr[c * L.k_col]);
        s = dot * scale;
        const int64_t mi = off.m + i * L.m_row + j * L.m_col;
        if (L.mask == am::MaskKind::Bool) s = static_cast<const bool*>(mask)[mi] ? s : -INFINITY;
        else if (L.mask == am::MaskKind::F32) s += static_cast<const float*>(mask)[mi];
      }
      const float mnew = fmaxf(m, warp_max(s));
      if (mnew == -INFINITY) continue;  // every key so far masked (warp-uniform)
      const float p = s == -INFINITY ? 0.f : expf(s - mnew);
      const float corr = m == -INFINITY ? 0.f : expf(m - mnew);
      l = l * corr + warp_sum(p);
      m = mnew;
      const int cnt = static_cast<int>(e - j0 < 32 ? e - j0 : 32);
      for (int64_t c = lane; c < L.dv; c += 32) acc[c] *= corr;
      for (int jj = 0; jj < cnt; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
        if (pj == 0.f) continue;  // a masked key adds nothing, even where v holds inf
        const T* vr = v + off.v + (j0 + jj) * L.v_row;
        for (int64_t c = lane; c < L.dv; c += 32) acc[c] += pj * convert<float>(vr[c * L.v_col]);
      }
    }
    T* orow = out + row * L.dv;
    const float inv = m == -INFINITY ? 0.f : 1.f / l;
    for (int64_t c = lane; c < L.dv; c += 32) orow[c] = convert<T>(m == -INFINITY ? 0.f : acc[c] * inv);
    __syncwarp();
  }
}

// cache[b, h, p_b + t, c] = src[b, h, t, c] with p_b = positions[b], copied as raw elements of width U, for
// the key cache and (in the same launch) the value cache. A sequence with p_b outside [0, lmax - T] is
// skipped and reported (by the key pass only: both read the same positions).
struct AppendDims {
  int64_t b = 0, h = 0, t = 0, d = 0, lmax = 0;
  int64_t cs[4] = {}, ss[4] = {};  // cache and src strides (elements) over (b, h, position, channel)
  KILN_HD int64_t numel() const { return b * h * t * d; }
};

template <class U>
__device__ __forceinline__ void append_one(U* __restrict__ cache, const U* __restrict__ src,
                                           const int32_t* __restrict__ positions, const AppendDims& a, int64_t i,
                                           bool report, DeviceErrorRecord* err) {
  int64_t r = i;
  const int64_t c = r % a.d;
  r /= a.d;
  const int64_t t = r % a.t;
  r /= a.t;
  const int64_t h = r % a.h;
  const int64_t b = r / a.h;
  const int64_t p = positions[b];
  if (p < 0 || p > a.lmax - a.t) {
    if (report && h == 0 && t == 0 && c == 0)
      report_device_error(err, DeviceErrorCode::IndexOutOfRange, OpId::KvCacheAppend, p, a.lmax - a.t + 1);
    return;
  }
  cache[b * a.cs[0] + h * a.cs[1] + (p + t) * a.cs[2] + c * a.cs[3]] =
      src[b * a.ss[0] + h * a.ss[1] + t * a.ss[2] + c * a.ss[3]];
}

template <class U>
__global__ void kv_append_kernel(U* __restrict__ k_cache, const U* __restrict__ k_src, AppendDims ka,
                                 U* __restrict__ v_cache, const U* __restrict__ v_src, AppendDims va,
                                 const int32_t* __restrict__ positions, DeviceErrorRecord* err) {
  const int64_t nk = ka.numel(), n = nk + va.numel();
  for (int64_t i = global_thread(); i < n; i += grid_stride()) {
    if (i < nk) append_one(k_cache, k_src, positions, ka, i, true, err);
    else append_one(v_cache, v_src, positions, va, i - nk, false, err);
  }
}

}  // namespace kiln::cuda::attn
