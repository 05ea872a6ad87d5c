// Launcher of the Hopper flash prefill kernel (kernels/flash_attention_sm90.cuh). The kernel exists only in
// sm_90a code: KILN_HAVE_SM90A is defined when CMAKE_CUDA_ARCHITECTURES lists 90a (src/CMakeLists.txt), and
// the device must have compute capability 9.0.
#include "cuda/attention_sm90.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <type_traits>

#include "cuda/attention.h"
#include "cuda/kernels/flash_attention_sm90.cuh"
#include "cuda/launch.h"
#include "kiln/ops.h"

namespace kiln::cuda {
namespace {

namespace am = attention_math;

bool mult8(int64_t s) { return s % 8 == 0; }

// A [slots][rows][d] tensor map over one operand (16-bit elements, rows `row` apart): slot stride = the gcd
// of the strides that move between its heads and batch entries, so every (batch, head) offset is a whole
// number of slots. Boxes of 64 columns x box_rows rows land with the 128-byte swizzle; rows past `rows` read
// as zero. False when the layout does not fit a map (negative strides, too many slots) or encoding fails.
bool encode_operand(CUtensorMap* map, int64_t* slot, const void* base, DType dt, const am::Layout& L, int64_t rows,
                    int64_t row, int64_t head_stride, int64_t nheads, const int64_t* bstride, uint32_t box_rows) {
  int64_t g = 0, span = 0;
  auto add = [&](int64_t stride, int64_t count) {
    if (count <= 1 || stride == 0) return true;
    if (stride < 0) return false;
    g = std::gcd(g, stride);
    span += (count - 1) * stride;
    return true;
  };
  if (!add(head_stride, nheads)) return false;
  for (int i = 0; i < L.nbatch; ++i)
    if (!add(bstride[i], L.bsize[i])) return false;
  if (g == 0) g = 8;  // one slot
  const int64_t slots = span / g + 1;
  if (g % 8 != 0 || row % 8 != 0 || slots >= (int64_t{1} << 31) || rows >= (int64_t{1} << 31)) return false;
  const uint64_t dims[3] = {static_cast<uint64_t>(L.d), static_cast<uint64_t>(std::max<int64_t>(rows, 1)),
                            static_cast<uint64_t>(slots)};
  const uint64_t strides[2] = {static_cast<uint64_t>(row) * 2, static_cast<uint64_t>(g) * 2};
  const bool ok = encode_tensor_map_3d(map, base, dt == DType::BF16, dims, strides, 64, box_rows);
  *slot = g;
  return ok;
}

}  // namespace

bool encode_decode_maps(CUtensorMap* tk, int64_t* k_slot, CUtensorMap* tv, int64_t* v_slot, const Tensor& k,
                        const Tensor& v, const am::Layout& L) {
  const uint32_t box = attn::kTileKeys;
  return encode_operand(tk, k_slot, k.data_ptr(), k.dtype(), L, L.lkv, L.k_row, L.hk, L.heads / L.gk, L.bk, box) &&
         encode_operand(tv, v_slot, v.data_ptr(), v.dtype(), L, L.lkv, L.v_row, L.hv, L.heads / L.gv, L.bv, box);
}

bool launch_prefill_sm90(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const am::Layout& L,
                         double scale, cudaStream_t stream) {
  const int dev = out.device().index;
  if (prefill_kernel() == PrefillKernel::Mma || !wgmma_available(dev)) return false;
  if (L.mask != am::MaskKind::None || L.has_lengths) return false;
  // The kernel takes the row max of the unscaled scores (kernels/flash_attention_sm90.cuh): scale > 0.
  if (!(scale > 0.0) || !std::isfinite(scale)) return false;
  // q rows go to shared memory by TMA: contiguous channels, 8-element strides, an aligned base.
  if (L.q_col != 1 || !mult8(L.q_row) || reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 != 0) return false;
  if (L.heads > 1 && !mult8(L.hq)) return false;
  for (int i = 0; i < L.nbatch; ++i)
    if (!mult8(L.bq[i])) return false;
  (void)k;
  (void)v;
  attn::FlashParams p;
  p.out = static_cast<uint16_t*>(out.data_ptr());
  p.q = static_cast<const uint16_t*>(q.data_ptr());
  p.k = static_cast<const uint16_t*>(k.data_ptr());
  p.v = static_cast<const uint16_t*>(v.data_ptr());
  p.mask = nullptr;
  p.L = L;
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.q_tiles = (L.lq + attn::sm90::kBM - 1) / attn::sm90::kBM;
  const int64_t items = p.q_tiles * L.heads * L.outer;
  if (items == 0) return true;
  // Persistent: one block per multiprocessor (shared memory allows one); items past the grid's first come from
  // a device counter that starts at zero, or for at most two rounds in a fixed order.
  const int limit = prefill_max_blocks();  // read once: another thread may change it
  const int max_blocks = limit > 0 ? limit : multiprocessor_count(dev);
  const int64_t blocks = std::min<int64_t>(items, max_blocks);
  // Causal with more items than blocks: every head's heaviest tiles first, while all K/V fit in L2 at once
  // (at most 32 MB: the H200 has 50); otherwise head by head. On the H200 the first order took L2048 from
  // 0.79x to 0.94x PyTorch; at 33.5 MB of K/V (L8192, 8 KV heads) it was 1-3% slower than head by head.
  // With one item per block the order only places the items: head by head spreads the heavy ones over the
  // machine, 1.5-3% faster at L512 with 32 query heads (2026-12-03).
  const int64_t kv_bytes = 2 * L.lkv * L.d * 2 * (L.heads / L.gk) * L.outer;
  p.tiles_major = L.causal && kv_bytes <= (int64_t{32} << 20) && items > blocks;
  // KILN_PREFILL_ORDER=tiles|heads forces one order (A/B measurements; both are exact).
  static const int order = [] {
    const char* v = std::getenv("KILN_PREFILL_ORDER");
    if (!v || !*v || std::strcmp(v, "auto") == 0) return 0;
    if (std::strcmp(v, "tiles") == 0) return 1;
    if (std::strcmp(v, "heads") == 0) return 2;
    throw Error(str("KILN_PREFILL_ORDER: expected auto, tiles or heads, got \"", v, "\""));
  }();
  if (order != 0) p.tiles_major = order == 1;
  KILN_CHECK(items < (int64_t{1} << 31), "scaled_dot_product_attention: too many query tiles (", items, ")");
  // The operands must fit tensor maps (otherwise the mma.sync kernel runs).
  attn::sm90::TmaParams tp{};
  const uint32_t kv_box = attn::sm90::kBN;
  if (!encode_operand(&tp.tq, &tp.q_slot, q.data_ptr(), q.dtype(), L, L.lq, L.q_row, L.hq, L.heads, L.bq, 64) ||
      !encode_operand(&tp.tk, &tp.k_slot, k.data_ptr(), q.dtype(), L, L.lkv, L.k_row, L.hk, L.heads / L.gk, L.bk,
                      kv_box) ||
      !encode_operand(&tp.tv, &tp.v_slot, v.data_ptr(), q.dtype(), L, L.lkv, L.v_row, L.hv, L.heads / L.gv, L.bv,
                      kv_box))
    return false;
  tp.p = p;
  tp.items = static_cast<int>(items);
  Tensor counter;
  if (blocks * 2 < items) {  // up to two rounds the fixed order needs no counter (and no memset before the launch)
    counter = empty({1}, DType::I32, out.device());
    check(cudaMemsetAsync(counter.data_ptr(), 0, sizeof(int), stream), "scaled_dot_product_attention");
    tp.next_item = static_cast<int*>(counter.data_ptr());
  }
  auto go = [&](auto tag, auto d_const, auto causal_const) {
    using Tag = decltype(tag);
    constexpr int D = decltype(d_const)::value;
    constexpr bool C = decltype(causal_const)::value;
    const size_t smem = attn::sm90::tma_smem_bytes(D);
    auto kernel = attn::sm90::flash_prefill_tma_kernel<Tag, D, C>;
    set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, dev, "scaled_dot_product_attention");
    launch_dependent(kernel, dim3(static_cast<unsigned>(blocks)), dim3(attn::sm90::kThreads), smem, stream, dev,
                     "scaled_dot_product_attention (flash prefill, sm_90a)", tp);
  };
  auto with_d = [&](auto tag) {
    auto with_causal = [&](auto d_const) {
      if (L.causal) go(tag, d_const, std::true_type{});
      else go(tag, d_const, std::false_type{});
    };
    if (L.d == 64) with_causal(std::integral_constant<int, 64>{});
    else with_causal(std::integral_constant<int, 128>{});
  };
  if (q.dtype() == DType::BF16) with_d(attn::Bf16Tag{});
  else with_d(attn::F16Tag{});
  check_launch("scaled_dot_product_attention (flash prefill, sm_90a)");
  return true;
}

}  // namespace kiln::cuda
