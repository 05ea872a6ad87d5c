// Split-KV decode attention (Lq <= 8 new queries per sequence over a KV cache [B, Hkv, Lmax, D] whose
// current lengths live on the device) and the combine of its splits. The tensor-core step is the prefill
// kernel's (warp_step in flash_attention.cuh).
//
// Decode is latency-bound for short caches and bandwidth-bound for long ones, so the kernel keeps its
// serial chain short (32-bit block indices, the length and q loads in flight together, the first K/V tiles
// requested before q reaches shared memory, one barrier per tile, a one-barrier merge of the four warps)
// and keeps bytes in flight for long caches (kDecodeStages-deep cp.async ring, two blocks per SM).
#pragma once

#include "cuda/kernels/flash_attention.cuh"

namespace kiln::cuda::attn {

constexpr int kMaxSplits = 128;       // splits of the decode kernel
// K/V tiles in the cp.async ring. Measured on the H200 against 2 stages with 3 blocks per SM and 4 stages
// with 1: 3 stages and 2 blocks per SM (what shared memory allows) are best or within 4% at every shape.
constexpr int kDecodeStages = 3;
constexpr int kDecodeBlocksPerSm = 2;
constexpr int kCombineThreads = 512;  // the global combine: 16 warps, a share of the splits each
constexpr int kCombinePerWarp = kMaxSplits / (kCombineThreads / 32);

struct DecodeParams {
  uint16_t* out;        // contiguous [B, Hq, Lq, D]
  float* part_o;        // splits > 1: [B * Hq * Lq, splits, D] unnormalised outputs
  float2* part_ml;      // and their (running max in the log2 domain, sum) [B * Hq * Lq, splits]
  const uint16_t *q, *k, *v;
  const int32_t* lengths;
  am::Layout L;  // decode layout: outer = B (strides bq/bk/bv[0]), heads = Hq, gk = gv = Hq / Hkv
  float scale_log2;
  int splits, row_tiles;
  int lq, rows;  // queries per sequence; rows of a KV group (Hq / Hkv * Lq), both < 2^31 (checked)
  bool q_vec;    // q rows can be read in 16-byte pieces (contiguous channels, 8-element strides, aligned)
  int early;     // register kernel, before its pdl_wait: 0 nothing, 1 L2 prefetch, 2 also speculative loads (DecodeTuning)
  int early_chunks;  // chunks of each warp prefetched into L2 before the wait (DecodeTuning::early_chunks)
  int guess_skew;  // tests: keys added to the length read before the wait (DecodeTuning::early_guess_skew)
  // Paged caches (register kernel only): key p of sequence b is row (table[b * table_stride + p / S] * S + p % S)
  // of k and v, S = 1 << block_shift; nullptr: row p (then the sequence's base is b * L.bk[0]).
  const int32_t* table;
  int64_t table_stride;
  int block_shift;
  int num_blocks;
  DeviceErrorRecord* err;
};

// Shared memory of the decode kernel, in 16-bit elements: the q tile and the K/V ring.
template <int D>
constexpr int decode_smem_elems() {
  return (16 + 2 * kDecodeStages * kTileKeys) * (D + kPad);
}

// A block's keys [kb, ke) of a sequence whose current length is n: n is checked against Lmax (a length out
// of range is reported once, by the block whose `reporter` is true, and taken as 0), then split into
// p.splits chunks of whole 64-key tiles.
struct SplitRange {
  int n, kb, ke;
};
// Split `split`'s keys [kb, ke) of a length n in [0, Lkv]: equal runs of whole tiles.
__device__ __forceinline__ SplitRange split_keys(const DecodeParams& p, int n, int split) {
  const int per = (n + p.splits - 1) / p.splits;
  const int chunk = (per + kTileKeys - 1) / kTileKeys * kTileKeys;
  const int kb = split * chunk;
  return {n, kb, kb + chunk < n ? kb + chunk : n};
}
__device__ __forceinline__ SplitRange decode_split_range(const DecodeParams& p, int n, int split, bool reporter) {
  if (n < 0 || n > p.L.lkv) {
    if (reporter) report_device_error(p.err, DeviceErrorCode::IndexOutOfRange, OpId::DecodeAttention, n, p.L.lkv + 1);
    n = 0;
  }
  return split_keys(p, n, split);
}
// The same for sequence b's length read before pdl_wait (possibly stale: the kernel that sets it may not have
// finished), to choose addresses only: no error report; a length out of range is clamped into it.
__device__ __forceinline__ SplitRange decode_split_range_guess(const DecodeParams& p, int b, int split) {
  int n;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(n) : "l"(p.lengths + b) : "memory");
  n += p.guess_skew;
  return split_keys(p, n < 0 ? 0 : n > p.L.lkv ? p.L.lkv : n, split);
}

// acc += f * o and total += f * l: one partial (o, l) of a merge, weighted by f = 2^(its max - the merged max).
__device__ __forceinline__ void merge_partial(float4& acc, float& total, const float4& o, float l, float f) {
  total += l * f;
  acc.x += o.x * f;
  acc.y += o.y * f;
  acc.z += o.z * f;
  acc.w += o.w * f;
}
// Four output channels acc / total rounded to 16 bits at dst (0 where no key was visible: total 0).
template <class Tag>
__device__ __forceinline__ void store_normalized(uint16_t* dst, const float4& acc, float total) {
  const float inv = total > 0.f ? 1.f / total : 0.f;
  uint2 packed;
  packed.x = Mma<Tag>::pack(acc.x * inv, acc.y * inv);
  packed.y = Mma<Tag>::pack(acc.z * inv, acc.w * inv);
  *reinterpret_cast<uint2*>(dst) = packed;
}

// The four warps' (max, sum, o) of rows 0..nrows-1, already in red_ml (max [4][16], then sum [4][16]) and
// red_o ([4][16][D]), merged after `sync` and stored: the output itself with one split, else the split's f32
// partial (o, max, sum). The second half of decode_merge_store; the register kernel fills the buffers itself.
template <class Tag, int D, class Sync>
__device__ __forceinline__ void decode_merge_red_store(float* red_o, float* red_ml, const DecodeParams& p, int nrows,
                                                       int row0, int b, int hk, int split, Sync sync) {
  const am::Layout& L = p.L;
  const int tid = static_cast<int>(threadIdx.x);
  float* red_m = red_ml;          // [4][16]
  float* red_l = red_m + 4 * 16;  // [4][16]
  sync();
  constexpr int kQuads = D / 4;  // float4 pieces per row
  const int group = static_cast<int>(L.gk);
  for (int i = tid; i < nrows * kQuads; i += kThreads) {
    const int rr = i / kQuads, c = (i % kQuads) * 4;
    float mw[4], mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      mw[w] = red_m[w * 16 + rr];
      mx = fmaxf(mx, mw[w]);
    }
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float lsum = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float f = mw[w] == -INFINITY ? 0.f : exp2f(mw[w] - mx);
      merge_partial(acc, lsum, *reinterpret_cast<const float4*>(red_o + (w * 16 + rr) * D + c), red_l[w * 16 + rr], f);
    }
    const int row = row0 + rr, g = p.lq == 1 ? row : row / p.lq, t = row - g * p.lq;
    const int64_t out_row = (static_cast<int64_t>(b) * L.heads + static_cast<int64_t>(hk) * group + g) * p.lq + t;
    if (p.splits == 1) {
      store_normalized<Tag>(p.out + out_row * D + c, acc, lsum);
    } else {
      *reinterpret_cast<float4*>(p.part_o + (out_row * p.splits + split) * D + c) = acc;
      if (c == 0) p.part_ml[out_row * p.splits + split] = make_float2(mx, lsum);
    }
  }
}

// The four warps' states of one 16-row tile (warp w of the block held keys 16w..16w+15 of every tile)
// merged through shared memory and stored (decode_merge_red_store). `red_o` (4 x 16 x D floats) and `red_ml`
// (128 floats) are shared memory that no warp reads any more once `sync` (a barrier over the four warps,
// threads 0..127) has passed; every thread of the four warps calls.
template <class Tag, int D, class Sync>
__device__ __forceinline__ void decode_merge_store(const WarpState<D>& st, float* red_o, float* red_ml,
                                                   const DecodeParams& p, int nrows, int row0, int b, int hk,
                                                   int split, Sync sync) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  sync();
  float* red_m = red_ml;          // [4][16]
  float* red_l = red_m + 4 * 16;  // [4][16]
  const int t4 = lane % 4;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int row = lane / 4 + 8 * rr;
    if (row >= nrows) continue;
    if (t4 == 0) {
      red_m[warp * 16 + row] = st.m[rr];
      red_l[warp * 16 + row] = st.l[rr];
    }
#pragma unroll
    for (int nn = 0; nn < D / 8; ++nn)
      *reinterpret_cast<float2*>(red_o + (warp * 16 + row) * D + 8 * nn + 2 * t4) =
          make_float2(st.o[nn][2 * rr], st.o[nn][2 * rr + 1]);
  }
  decode_merge_red_store<Tag, D>(red_o, red_ml, p, nrows, row0, b, hk, split, sync);
}

// Decode: grid (split, KV head x row tile, sequence). A block serves 16 rows of one KV group, rows being the
// group's G = Hq / Hkv query heads times Lq queries (row = g * Lq + t), so K and V are read once for all of
// them. Its keys are [split * chunk, ...), chunk from the sequence's current length (read here: the grid is
// sized by Lmax, so a captured graph stays valid as lengths grow), in 64-key tiles; warp w takes keys
// 16w..16w+15 of each tile with its own softmax state, and the four warps merge at the end. Query t sees
// keys <= n - Lq + t. With one split the block writes the output; with several, its f32 partial (o, max,
// sum) goes to global memory for decode_combine_kernel. (Two alternatives to that second kernel were
// measured slower on the H200 and removed: combining the splits of short caches inside a thread-block
// cluster through distributed shared memory, 5-17%; folding them in the last block of each row to store its
// partial, with per-row tickets, 1.07-2.1x.)
template <class Tag, int D, int Pf = 0>
__global__ void __launch_bounds__(kThreads, kDecodeBlocksPerSm) decode_attention_kernel(DecodeParams p) {
  constexpr int ld = D + kPad;
  constexpr int kChunks = D / 8;                    // 16-byte pieces per row
  constexpr int kRowsPerPass = kThreads / kChunks;  // rows one pass of the block copies
  constexpr int kTileElems = kTileKeys * ld;
  constexpr int S = kDecodeStages;
  static_assert((4 * 16 * D + 4 * 16 * 2) * sizeof(float) <= 2 * S * kTileElems * sizeof(uint16_t),
                "the merge buffers fit in the K/V ring");
  extern __shared__ __align__(16) uint16_t sm[];
  uint16_t* qs = sm;                // [16][ld]
  uint16_t* ks = qs + 16 * ld;      // [S][64][ld]
  uint16_t* vs = ks + S * kTileElems;  // [S][64][ld]
  pdl_allow_dependents();  // kernels/pdl.cuh: the combine or the output projection may start early
  const am::Layout& L = p.L;
  const int split = static_cast<int>(blockIdx.x);
  const int rt = p.row_tiles == 1 ? 0 : static_cast<int>(blockIdx.y % p.row_tiles);
  const int hk = p.row_tiles == 1 ? static_cast<int>(blockIdx.y) : static_cast<int>(blockIdx.y / p.row_tiles);
  const int b = static_cast<int>(blockIdx.z);
  const int group = static_cast<int>(L.gk);
  const int row0 = rt * 16;
  const int nrows = p.rows - row0 < 16 ? p.rows - row0 : 16;  // real rows of this tile
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const uint16_t* qb = p.q + b * L.bq[0] + static_cast<int64_t>(hk) * group * L.hq;
  const uint16_t* kbase = p.k + b * L.bk[0] + hk * L.hk;
  const uint16_t* vbase = p.v + b * L.bv[0] + hk * L.hv;
  const int cc = tid % kChunks, r0 = tid / kChunks;  // this thread's 16-byte piece of every copied row
  // Element offset of row rr of the tile in q (query head g, query t).
  auto q_off = [&](int rr) {
    const int row = row0 + rr;
    const int g = p.lq == 1 ? row : row / p.lq, t = row - g * p.lq;
    return static_cast<int64_t>(g) * L.hq + static_cast<int64_t>(t) * L.q_row;
  };

  kernels::pdl_wait();  // when launched as a dependent: q, the caches and the lengths come from earlier kernels
  int n = p.lengths[b];
  constexpr int kQv = 16 * kChunks / kThreads;  // 16-byte q pieces per thread (q_vec)
  uint4 qv[kQv];
  if (p.q_vec) {
#pragma unroll
    for (int j = 0; j < kQv; ++j) {
      const int i = tid + j * kThreads, rr = i / kChunks;
      qv[j] = rr < nrows ? *reinterpret_cast<const uint4*>(qb + q_off(rr) + (i % kChunks) * 8) : make_uint4(0, 0, 0, 0);
    }
  }
  const SplitRange range = decode_split_range(p, n, split, split == 0 && rt == 0 && hk == 0 && tid == 0);
  n = range.n;
  const int kb = range.kb, ke = range.ke;
  const int tiles = ke > kb ? (ke - kb + kTileKeys - 1) / kTileKeys : 0;
  // Tile t of the block's keys into ring stage `stage`: keys at or past ke are zero-filled, not read.
  auto issue = [&](int t, int stage) {
    const int key = kb + t * kTileKeys + r0;
    const uint16_t* kp = kbase + static_cast<int64_t>(key) * L.k_row + cc * 8;
    const uint16_t* vp = vbase + static_cast<int64_t>(key) * L.v_row + cc * 8;
    uint16_t* kd = ks + stage * kTileElems + r0 * ld + cc * 8;
    uint16_t* vd = vs + stage * kTileElems + r0 * ld + cc * 8;
#pragma unroll
    for (int j = 0; j < kTileKeys / kRowsPerPass; ++j) {
      const bool valid = key + j * kRowsPerPass < ke;
      const int64_t step = static_cast<int64_t>(j) * kRowsPerPass;
      cp_async16_pf<Pf>(kd + j * kRowsPerPass * ld, valid ? kp + step * L.k_row : kbase, valid);
      cp_async16_pf<Pf>(vd + j * kRowsPerPass * ld, valid ? vp + step * L.v_row : vbase, valid);
    }
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < tiles) issue(s, s);
    cp_async_commit();
  }
  if (p.q_vec) {
#pragma unroll
    for (int j = 0; j < kQv; ++j) {
      const int i = tid + j * kThreads;
      *reinterpret_cast<uint4*>(qs + (i / kChunks) * ld + (i % kChunks) * 8) = qv[j];
    }
  } else {
    for (int i = tid; i < 16 * D; i += kThreads) {
      const int rr = i / D, c = i % D;
      qs[rr * ld + c] = rr < nrows ? qb[q_off(rr) + c * L.q_col] : uint16_t(0);
    }
  }
  WarpState<D> st;
  clear_state<D>(st);
  int64_t e[2];  // one past the last key of the lane's rows within this split (bottom-right causal)
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int row = row0 + lane / 4 + 8 * rr;
    const int64_t lim = am::key_end(p.lq == 1 ? 0 : row % p.lq, p.lq, n, true, true);
    e[rr] = lim < ke ? lim : ke;
  }
  int stage = 0;
  for (int t = 0; t < tiles; ++t) {
    cp_async_wait<S - 2>();  // this thread's copies of tile t have landed
    __syncthreads();         // everyone's have; and every warp is done with the stage refilled below
    if (t == 0) load_q_frags<D>(st, qs, ld);
    const int refill = t + S - 1;
    if (refill < tiles) issue(refill, stage == 0 ? S - 1 : stage - 1);
    cp_async_commit();
    const int64_t key0 = kb + t * kTileKeys + warp * 16;
    warp_step<Tag, D, 16>(st, ks + stage * kTileElems + warp * 16 * ld, vs + stage * kTileElems + warp * 16 * ld, ld,
                          key0, e, p.scale_log2);
    stage = stage == S - 1 ? 0 : stage + 1;
  }
  cp_async_wait<0>();  // no copy may land in the merge buffers (copies past the last tile are empty groups)
  finish_l<D>(st);

  // Merge the four warps through shared memory, within the ring (no copy is in flight any more).
  float* red = reinterpret_cast<float*>(ks);
  decode_merge_store<Tag, D>(st, red, red + 4 * 16 * D, p, nrows, row0, b, hk, split, [] { __syncthreads(); });
}

// The splits of decode_attention_kernel folded: one block per output row (contiguous [rows, D]), warp w
// takes splits w, w + 16, ... (all its loads in flight at once) and lane l channels 4l..4l+3; the warps'
// partial results merge through shared memory. A split that saw no key has max -inf and sum 0 and adds
// nothing. Launched as a dependent of the decode kernel (kernels/pdl.cuh).
template <class Tag, int D>
__global__ void __launch_bounds__(kCombineThreads)
    decode_combine_kernel(uint16_t* __restrict__ out, const float* part_o, const float2* part_ml, int splits) {
  constexpr int kWarps = kCombineThreads / 32;
  __shared__ float4 w_o[kWarps][D / 4];
  __shared__ float2 w_ml[kWarps];
  pdl_allow_dependents();
  kernels::pdl_wait();
  const int64_t r = blockIdx.x;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const bool has_c = lane < D / 4;
  float2 ml[kCombinePerWarp];
  float4 o[kCombinePerWarp];
#pragma unroll
  for (int j = 0; j < kCombinePerWarp; ++j) {
    const int s = warp + j * kWarps;
    if (s < splits) {
      ml[j] = part_ml[r * splits + s];
      if (has_c) o[j] = reinterpret_cast<const float4*>(part_o + (r * splits + s) * D)[lane];
    }
  }
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kCombinePerWarp; ++j)
    if (warp + j * kWarps < splits) mx = fmaxf(mx, ml[j].x);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float total = 0.f;
#pragma unroll
  for (int j = 0; j < kCombinePerWarp; ++j) {
    if (warp + j * kWarps < splits && ml[j].x != -INFINITY) {
      const float f = exp2f(ml[j].x - mx);
      total += ml[j].y * f;
      if (has_c) {
        acc.x += o[j].x * f;
        acc.y += o[j].y * f;
        acc.z += o[j].z * f;
        acc.w += o[j].w * f;
      }
    }
  }
  if (has_c) w_o[warp][lane] = acc;
  if (lane == 0) w_ml[warp] = make_float2(mx, total);
  __syncthreads();
  if (warp != 0 || !has_c) return;
  float gmx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) gmx = fmaxf(gmx, w_ml[w].x);
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  float gtotal = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float2 wm = w_ml[w];
    if (wm.x == -INFINITY) continue;
    merge_partial(sum, gtotal, w_o[w][lane], wm.y, exp2f(wm.x - gmx));
  }
  store_normalized<Tag>(out + r * D + 4 * lane, sum, gtotal);
}

// The splits folded with one warp per output row (a block of kRowCombineWarps rows, contiguous [rows, D]):
// lane l holds channels 4l..4l+3 and every lane reads each split's (max, sum), eight splits' loads in flight
// at a time, folded by a running maximum. No shared memory and no barrier between the loads and the store:
// for a few splits (a short cache) this chain is shorter than decode_combine_kernel's, whose second level
// merges its 16 warps' results through shared memory. Launched as a dependent of the decode kernel.
constexpr int kRowCombineWarps = 4;
constexpr int kRowCombineBatch = 8;
template <class Tag, int D>
__global__ void __launch_bounds__(kRowCombineWarps * 32)
    decode_combine_rows_kernel(uint16_t* __restrict__ out, const float* part_o, const float2* part_ml, int splits,
                               int rows) {
  pdl_allow_dependents();
  kernels::pdl_wait();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowCombineWarps + static_cast<int>(threadIdx.x) / 32;
  if (r >= rows) return;
  const bool has_c = lane < D / 4;
  float mx = -INFINITY, total = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < splits; s0 += kRowCombineBatch) {
    float2 ml[kRowCombineBatch];
    float4 o[kRowCombineBatch];
#pragma unroll
    for (int j = 0; j < kRowCombineBatch; ++j) {
      const int s = s0 + j;
      ml[j] = s < splits ? part_ml[r * splits + s] : make_float2(-INFINITY, 0.f);
      o[j] = s < splits && has_c ? reinterpret_cast<const float4*>(part_o + (r * splits + s) * D)[lane]
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float bm = mx;
#pragma unroll
    for (int j = 0; j < kRowCombineBatch; ++j) bm = fmaxf(bm, ml[j].x);
    if (bm == -INFINITY) continue;  // no split so far saw a key
    const float f_old = mx == -INFINITY ? 0.f : exp2f(mx - bm);
    total *= f_old;
    acc.x *= f_old;
    acc.y *= f_old;
    acc.z *= f_old;
    acc.w *= f_old;
#pragma unroll
    for (int j = 0; j < kRowCombineBatch; ++j)
      if (ml[j].x != -INFINITY) merge_partial(acc, total, o[j], ml[j].y, exp2f(ml[j].x - bm));
    mx = bm;
  }
  if (has_c) store_normalized<Tag>(out + r * D + 4 * lane, acc, total);
}

}  // namespace kiln::cuda::attn
