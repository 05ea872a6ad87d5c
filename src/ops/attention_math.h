// The index math of attention shared by the CPU reference and the CUDA kernels: how a (batch, head) pair
// finds its q, k, v and mask rows under broadcasting and grouped-query attention, and which keys a query row
// may attend under the causal rules. Plain data and KILN_HD functions only.
#pragma once

#include <cstdint>

#include "kiln/scalar_types.h"

namespace kiln::attention_math {

// Outer batch dims (all dims before the head dim) left after coalescing; more is an error in the op.
inline constexpr int kMaxBatchDims = 6;

enum class MaskKind : int32_t { None = 0, Bool = 1, F32 = 2, F64 = 3 };

// Where every operand of one attention call lives, in elements. The output is [outer..., H, Lq, Dv]
// contiguous; outer index o (row-major over `bsize`) and head h give q/mask rows at h and k/v rows at
// h / gk and h / gv (grouped-query attention: repeat_interleave without a copy). Broadcast dims have stride 0.
struct Layout {
  int32_t nbatch = 0;
  int64_t bsize[kMaxBatchDims] = {};
  int64_t bq[kMaxBatchDims] = {}, bk[kMaxBatchDims] = {}, bv[kMaxBatchDims] = {}, bm[kMaxBatchDims] = {};
  int64_t outer = 1, heads = 1;
  int64_t hq = 0, hk = 0, hv = 0, hm = 0;  // head strides
  int64_t gk = 1, gv = 1;                  // query heads per key / value head
  int64_t lq = 0, lkv = 0, d = 0, dv = 0;
  int64_t q_row = 0, q_col = 1, k_row = 0, k_col = 1, v_row = 0, v_col = 1, m_row = 0, m_col = 0;
  MaskKind mask = MaskKind::None;
  bool causal = false;
  // Decode: lengths[o] is the valid key count of outer index o, and causal is bottom-right aligned to it.
  bool has_lengths = false;
};

struct Offsets {
  int64_t q, k, v, m;
};

// Element offsets of (outer index o, head h).
KILN_HD Offsets batch_offsets(const Layout& L, int64_t o, int64_t h) {
  Offsets off{h * L.hq, (h / L.gk) * L.hk, (h / L.gv) * L.hv, h * L.hm};
  for (int i = L.nbatch - 1; i >= 0; --i) {
    const int64_t idx = o % L.bsize[i];
    o /= L.bsize[i];
    off.q += idx * L.bq[i];
    off.k += idx * L.bk[i];
    off.v += idx * L.bv[i];
    off.m += idx * L.bm[i];
  }
  return off;
}

// One past the last key query row i attends, of kv_len valid keys. Causal: key j is visible when
// j <= i + offset, where offset is 0 for PyTorch's is_causal (top-left aligned tril, whatever Lq and Lkv are)
// and kv_len - lq for decode (the last query sits at the last valid key). Can be 0: the row is fully masked.
KILN_HD int64_t key_end(int64_t i, int64_t lq, int64_t kv_len, bool causal, bool bottom_right) {
  if (!causal) return kv_len;
  const int64_t e = i + (bottom_right ? kv_len - lq : 0) + 1;
  return e < 0 ? 0 : (e > kv_len ? kv_len : e);
}

}  // namespace kiln::attention_math
