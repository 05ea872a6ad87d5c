// Split-KV decode attention with K and V loaded straight into tensor-core fragments (no shared-memory ring,
// no per-tile barrier): the work of decode_attention_kernel (decode_attention.cuh) for KV groups of at most 8
// rows (rows = Hq / Hkv query heads x Lq queries), with the same grid, splits, partials and combine kernel.
// The default where it applies (DecodeTuning::kernel = Regs; KILN_DECODE_TUNING=kernel=cp.async forces the
// other).
//
// Why: the matrix-vector kernels, which load weights into registers with 16-byte loads and keep many warps
// streaming independently, reach 4.46 TB/s on the H200; the cp.async decode kernel streams about 3.4 TB/s
// inside the kernel. Here each warp streams its own keys in 16-key chunks, the next chunk's loads in flight
// while the current one multiplies. Measured on the H200 against the cp.async kernel (2026-12-03): up to
// 8% faster at 11 of the 12 benchmark shapes, 0.7% slower at the twelfth (Hq32/Hkv8
// L8192), and 3.5 TB/s of K/V at L32768 with 8 KV heads.
//
// Math, per warp and 16-key chunk, with the keys as the MMA's rows and the query rows as its 8 columns:
//   S^T (16 keys x 8 rows) = K (16 x D) Q^T (D x 8): m16n8k16 MMAs over D / 16 steps. Lane (g = lane / 4,
//     t = lane % 4) loads keys g and g + 8 at channels 32 j + 8 t .. + 7 (16 bytes, j < D / 32); in step
//     2 j + h its K slots (2t, 2t + 1, 2t + 8, 2t + 9) stand for channels 32 j + 8 t + 4 h + (0, 1, 2, 3),
//     and q (B, column g = query row g) is loaded with the same permutation once per block.
//   Online softmax per query row (a column: rows 2t, 2t + 1 of the lane), maxima over the 8 lanes of a
//     quad position by shuffles; P rounded to 16 bits.
//   P^T to the B layout (lane (g, t) needs row g at keys 2t, 2t + 1, 2t + 8, 2t + 9): four shuffles of
//     packed pairs.
//   O^T (D x 8) += V^T (D x 16 keys) P^T: D / 16 MMAs whose rows are channels permuted so that lane g's
//     16-byte V loads (keys 2t, 2t + 1, 2t + 8, 2t + 9; load j: channels 64 j + 8 g .. + 7, so the 8 lanes of
//     a key read 128 contiguous bytes) feed them: row g of m-tile i is channel 64 (i / 4) + 8 g + 2 (i % 4),
//     row g + 8 the next channel (byte permutes pair the keys).
// The four warps take chunks w, w + 4, ... of the block's keys; their states meet in shared memory as in
// decode_attention_kernel (decode_merge_red_store). Keys past the split's end are neither loaded nor seen
// (their registers are zero, their scores -inf). The loads carry no L2 prefetch hint (DecodeTuning::l2_prefetch
// is the cp.async kernel's).
//
// Measured and removed (H200, 2026-12-04): dynamic chunks, each warp taking two fixed
// chunks and then its KV head's remaining chunks one at a time from a counter (atomicInc), so that the splits
// end together. Correct, but 1-18% slower at L >= 8192 drawing one chunk ahead, and slower still drawing two.
#pragma once

#include "cuda/kernels/decode_attention.cuh"
#include "cuda/kernels/gemv.cuh"

namespace kiln::cuda::attn {

constexpr int kRegsMaxRows = 8;  // query rows per KV group this kernel takes (the MMA's N)

// A 16-byte piece of K or V: coherent and volatile (kernels/pdl.cuh) when its address was chosen before the
// dependent-launch wait, else the read-only path.
template <bool kCoherent>
__device__ __forceinline__ uint4 regs_kv_load(const uint4* p) {
  if constexpr (kCoherent) return kernels::ld_stream_coherent(p);
  else return kernels::gemv_load_stream(p);
}

template <class Tag, int D>
__global__ void __launch_bounds__(kThreads, 2) decode_attention_regs_kernel(DecodeParams p) {
  constexpr int KS = D / 16;  // MMA steps of S, and m-tiles of O
  constexpr int KL = D / 32;  // 16-byte K loads per key and lane
  constexpr int VL = D / 64;  // 16-byte V loads per key and lane
  __shared__ __align__(16) float red_o[4 * 16 * D];
  __shared__ float red_ml[128];
  pdl_allow_dependents();
  const am::Layout& L = p.L;
  const int split = static_cast<int>(blockIdx.x), hk = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int group = static_cast<int>(L.gk), nrows = p.rows;  // nrows <= 8 (checked by the host)
  const uint16_t* qb = p.q + b * L.bq[0] + static_cast<int64_t>(hk) * group * L.hq;
  const uint16_t* kbase = p.k + b * L.bk[0] + hk * L.hk;
  const uint16_t* vbase = p.v + b * L.bv[0] + hk * L.hv;

  // Before the wait (p.early, DecodeTuning::early): the length as it stands now (the kernel that sets it may
  // not have finished) gives a guess of this split's keys; L2 is asked for the K/V lines of the warp's first
  // p.early_chunks chunks, and the first chunk is loaded speculatively after the wait (early = 2), so that
  // the first loads need not wait for the length's round trip. A prefetch is only a hint (L2 is coherent),
  // and the speculative chunk is used only where the real length gives it the same keys.
  SplitRange guess{0, 0, 0};
  if (p.early) {
    guess = decode_split_range_guess(p, b, split);
    constexpr int kLines = D * 2 / 128;  // 128-byte lines of a K or V row
    for (int i = lane; i < p.early_chunks * 16 * kLines; i += 32) {
      const int key = guess.kb + 16 * (warp + 4 * (i / (16 * kLines))) + (i / kLines) % 16;
      if (key >= guess.ke) continue;
      const int col = (i % kLines) * 64;
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(kbase + static_cast<int64_t>(key) * L.k_row + col));
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(vbase + static_cast<int64_t>(key) * L.v_row + col));
    }
  }
  kernels::pdl_wait();  // q, the caches and the lengths come from earlier kernels
  int n = p.lengths[b];
  // q as B fragments: column g = query row g (query head g / Lq, query g % Lq); rows past nrows are zero.
  uint32_t qf[KS][2];
  {
    const int row = g < nrows ? g : 0;
    const int gq = p.lq == 1 ? row : row / p.lq, tq = row - gq * p.lq;
    const uint4* qp = reinterpret_cast<const uint4*>(qb + static_cast<int64_t>(gq) * L.hq +
                                                     static_cast<int64_t>(tq) * L.q_row + 8 * t);
#pragma unroll
    for (int j = 0; j < KL; ++j) {
      const uint4 v = g < nrows ? qp[4 * j] : make_uint4(0, 0, 0, 0);  // channels 32 j + 8 t ..
      qf[2 * j][0] = v.x;
      qf[2 * j][1] = v.y;
      qf[2 * j + 1][0] = v.z;
      qf[2 * j + 1][1] = v.w;
    }
  }
  // The split's keys [kb, ke): the guess's while the speculative chunk loads, then the length's; e: one past
  // the last key each of the lane's two query rows (2t, 2t + 1) sees in this split (set below).
  int kb = guess.kb, ke = guess.ke;
  int e[2] = {0, 0};
  // Chunk c's keys into registers: K of keys g, g + 8; V of keys 2t, 2t + 1, 2t + 8, 2t + 9. A key at or past
  // ke reads key 0 of the head instead (in bounds even if the load is executed speculatively) and is zeroed.
  // The speculative chunk's addresses come from the guess made before the wait, so its loads are coherent and
  // volatile (kernels/pdl.cuh: an ld.global.nc could be moved above the wait, and the kernel before this one
  // may be appending to the caches); every other chunk's come from the length read after the wait.
  // The cache row of key k0 (paged caches: through the block table; a block outside the pools is reported and
  // read as block 0). A chunk's 16 keys lie in one block (chunks start at multiples of 16, S >= 16).
  auto row_of = [&](int k0) -> int64_t {
    if (p.table == nullptr) return k0;
    int blk = p.table[b * p.table_stride + (k0 >> p.block_shift)];
    if (static_cast<unsigned>(blk) >= static_cast<unsigned>(p.num_blocks)) {
      report_device_error(p.err, DeviceErrorCode::IndexOutOfRange, OpId::DecodeAttention, blk, p.num_blocks);
      blk = 0;
    }
    return (static_cast<int64_t>(blk) << p.block_shift) + (k0 & ((1 << p.block_shift) - 1));
  };
  auto load = [&](int c, uint4 (&kr)[2][KL], uint4 (&vr)[4][VL], bool coherent) {
    const int k0 = kb + 16 * c;
    const int64_t r0 = row_of(k0) - k0;  // key k of the chunk is row r0 + k
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int key = k0 + g + 8 * i;
      const bool ok = key < ke;
      const uint4* kp = reinterpret_cast<const uint4*>(kbase + (ok ? (r0 + key) * L.k_row : 0) + 8 * t);
#pragma unroll
      for (int j = 0; j < KL; ++j) {
        const uint4 v = coherent ? regs_kv_load<true>(kp + 4 * j) : regs_kv_load<false>(kp + 4 * j);
        kr[i][j] = ok ? v : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = k0 + 2 * t + (i & 1) + 8 * (i >> 1);
      const bool ok = key < ke;
      const uint4* vp = reinterpret_cast<const uint4*>(vbase + (ok ? (r0 + key) * L.v_row : 0) + 8 * g);
#pragma unroll
      for (int j = 0; j < VL; ++j) {  // channels 64 j + 8 g .. + 7: the 8 lanes of a key read 128 whole bytes
        const uint4 v = coherent ? regs_kv_load<true>(vp + 8 * j) : regs_kv_load<false>(vp + 8 * j);
        vr[i][j] = ok ? v : make_uint4(0, 0, 0, 0);
      }
    }
  };
  auto word = [](const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; };

  float o[KS][4];
#pragma unroll
  for (int i = 0; i < KS; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // Chunk c (its keys in kr / vr) into the state.
  auto step = [&](int c, const uint4 (&kr)[2][KL], const uint4 (&vr)[4][VL]) {
    // S^T = K Q^T.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < KL; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t a[4] = {word(kr[0][j], 2 * h), word(kr[1][j], 2 * h), word(kr[0][j], 2 * h + 1),
                               word(kr[1][j], 2 * h + 1)};
        Mma<Tag>::mma(s, a, qf[2 * j + h][0], qf[2 * j + h][1]);
      }
    // s: (key g, row 2t), (key g, row 2t + 1), (key g + 8, row 2t), (key g + 8, row 2t + 1).
    const int k0 = kb + 16 * c;
    s[0] = k0 + g < e[0] ? s[0] * p.scale_log2 : -INFINITY;
    s[1] = k0 + g < e[1] ? s[1] * p.scale_log2 : -INFINITY;
    s[2] = k0 + g + 8 < e[0] ? s[2] * p.scale_log2 : -INFINITY;
    s[3] = k0 + g + 8 < e[1] ? s[3] * p.scale_log2 : -INFINITY;
    float mx0 = fmaxf(s[0], s[2]), mx1 = fmaxf(s[1], s[3]);
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xFFFFFFFFu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xFFFFFFFFu, mx1, off));
    }
    const float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);
    const float base0 = mn0 == -INFINITY ? 0.f : mn0, base1 = mn1 == -INFINITY ? 0.f : mn1;
    const float corr0 = exp2f(m[0] - base0), corr1 = exp2f(m[1] - base1);
    const float p0 = exp2f(s[0] - base0), p1 = exp2f(s[1] - base1), p2 = exp2f(s[2] - base0),
                p3 = exp2f(s[3] - base1);
    l[0] = l[0] * corr0 + (p0 + p2);
    l[1] = l[1] * corr1 + (p1 + p3);
    m[0] = mn0;
    m[1] = mn1;
#pragma unroll
    for (int i = 0; i < KS; ++i) {
      o[i][0] *= corr0;
      o[i][1] *= corr1;
      o[i][2] *= corr0;
      o[i][3] *= corr1;
    }
    // P^T in the B layout: lane (g, t) takes row g at keys 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1) from the
    // lanes that hold keys 2t and 2t + 1 (quad rows 2t, 2t + 1) at quad position g / 2.
    const uint32_t u01 = Mma<Tag>::pack(p0, p1), u23 = Mma<Tag>::pack(p2, p3);  // rows (2t, 2t + 1)
    const int src_a = 8 * t + g / 2, src_b = src_a + 4;
    const uint32_t a01 = __shfl_sync(0xFFFFFFFFu, u01, src_a), b01 = __shfl_sync(0xFFFFFFFFu, u01, src_b);
    const uint32_t a23 = __shfl_sync(0xFFFFFFFFu, u23, src_a), b23 = __shfl_sync(0xFFFFFFFFu, u23, src_b);
    const uint32_t sel = g & 1 ? 0x7632u : 0x5410u;  // the high or the low halves of both
    const uint32_t pb0 = __byte_perm(a01, b01, sel), pb1 = __byte_perm(a23, b23, sel);
    // O^T += V^T P^T.
#pragma unroll
    for (int i = 0; i < KS; ++i) {
      const uint32_t w0 = word(vr[0][i / 4], i % 4), w1 = word(vr[1][i / 4], i % 4);
      const uint32_t w2 = word(vr[2][i / 4], i % 4), w3 = word(vr[3][i / 4], i % 4);
      const uint32_t a[4] = {__byte_perm(w0, w1, 0x5410u), __byte_perm(w0, w1, 0x7632u),
                             __byte_perm(w2, w3, 0x5410u), __byte_perm(w2, w3, 0x7632u)};
      Mma<Tag>::mma(o[i], a, pb0, pb1);
    }
  };
  auto zero = [](uint4 (&kr)[2][KL], uint4 (&vr)[4][VL]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < KL; ++j) kr[i][j] = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < VL; ++j) vr[i][j] = make_uint4(0, 0, 0, 0);
  };
  // Two register buffers in turn (no copies): the next chunk's loads in flight while a chunk multiplies.
  uint4 kx[2][KL], vx[4][VL], ky[2][KL], vy[4][VL];
  const bool spec = p.early == 2 && kb + 16 * warp < ke;
  if (spec) load(warp, kx, vx, true);
  const SplitRange range = decode_split_range(p, n, split, split == 0 && hk == 0 && tid == 0);
  n = range.n;
  // The speculative chunk stands where the length gives the split the same start and the chunk the same
  // keys (it lies below both ends, or the ends agree).
  const int k0 = kb + 16 * warp;
  const bool keep = spec && range.kb == kb && (range.ke == ke || (k0 + 16 <= range.ke && k0 + 16 <= ke));
  kb = range.kb;
  ke = range.ke;
  const int nch = ke > kb ? (ke - kb + 15) / 16 : 0;  // 16-key chunks of the block
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int row = 2 * t + c;
    const int64_t lim = row < nrows ? am::key_end(p.lq == 1 ? 0 : row % p.lq, p.lq, n, true, true) : ke;
    e[c] = lim < ke ? static_cast<int>(lim) : ke;
  }
  int c = warp;
  if (c < nch && !keep) load(c, kx, vx, false);
  for (; c < nch; c += 8) {
    if (c + 4 < nch) load(c + 4, ky, vy, false);
    else zero(ky, vy);
    step(c, kx, vx);
    if (c + 4 >= nch) break;
    if (c + 8 < nch) load(c + 8, kx, vx, false);
    else zero(kx, vx);
    step(c + 4, ky, vy);
  }
  // The warp's state into shared memory: sums over the 8 lanes of a quad position, then rows 2t, 2t + 1.
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    l[0] += __shfl_xor_sync(0xFFFFFFFFu, l[0], off);
    l[1] += __shfl_xor_sync(0xFFFFFFFFu, l[1], off);
  }
  float* red_m = red_ml;
  float* red_l = red_ml + 4 * 16;
#pragma unroll
  for (int cc = 0; cc < 2; ++cc) {
    const int row = 2 * t + cc;
    if (row >= nrows) continue;
    if (g == 0) {
      red_m[warp * 16 + row] = m[cc];
      red_l[warp * 16 + row] = l[cc];
    }
#pragma unroll
    for (int i = 0; i < KS; ++i)  // channels 64 (i / 4) + 8 g + 2 (i % 4) (C rows g) and + 1 (C rows g + 8)
      *reinterpret_cast<float2*>(red_o + (warp * 16 + row) * D + 64 * (i / 4) + 8 * g + 2 * (i % 4)) =
          make_float2(o[i][cc], o[i][2 + cc]);
  }
  decode_merge_red_store<Tag, D>(red_o, red_ml, p, nrows, 0, b, hk, split, [] { __syncthreads(); });
}

}  // namespace kiln::cuda::attn
