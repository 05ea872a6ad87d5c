// CUDA launchers of attention: path choice (decode split-KV / flash prefill / general), grid sizes, shared
// memory, scratch for the split-KV combine, and the KV-cache append. Device code in
// kernels/flash_attention.cuh, kernels/decode_attention.cuh and kernels/attention_general.cuh.
#include "cuda/attention.h"

#include <atomic>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

#include "core/dispatch.h"
#include "cuda/attention_sm90.h"
#include "cuda/device_error.h"
#include "cuda/kernels/attention_general.cuh"
#include "cuda/kernels/decode_attention.cuh"
#include "cuda/kernels/decode_attention_regs.cuh"
#include "cuda/kernels/decode_attention_sm90.cuh"
#include "cuda/kernels/flash_attention.cuh"
#include "cuda/launch.h"
#include "kiln/ops.h"

namespace kiln::cuda {
namespace {

namespace am = attention_math;

bool tuning_valid(const DecodeTuning& t) {
  return t.min_split_keys >= 64 && t.min_split_keys % 64 == 0 && t.blocks_per_sm >= 1 && t.max_blocks >= 0 &&
         (t.l2_prefetch == 0 || t.l2_prefetch == 128) && t.row_combine_splits >= 0 && t.early >= 0 && t.early <= 2 &&
         t.early_chunks >= 0 && t.early_chunks <= 2;
}

DecodeTuning tuning_from_env() {
  DecodeTuning t;
  const char* v = std::getenv("KILN_DECODE_TUNING");
  if (!v || !*v) return t;
  std::string spec(v);
  size_t pos = 0;
  while (pos < spec.size()) {
    const size_t end = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, end - pos);
    const size_t eq = item.find('=');
    KILN_CHECK(eq != std::string::npos, "KILN_DECODE_TUNING: expected key=value items, got \"", item, "\"");
    const std::string key = item.substr(0, eq);
    const int val = std::atoi(item.c_str() + eq + 1);
    const std::string text = item.substr(eq + 1);
    if (key == "keys") t.min_split_keys = val;
    else if (key == "bps") t.blocks_per_sm = val;
    else if (key == "blocks") t.max_blocks = val;
    else if (key == "l2") t.l2_prefetch = val;
    else if (key == "rowc") t.row_combine_splits = val;
    else if (key == "early") t.early = val;
    else if (key == "pf") t.early_chunks = val;
    else if (key == "kernel" && (text == "cp.async" || text == "tma" || text == "regs"))
      t.kernel = text == "tma" ? DecodeKernel::Tma : text == "regs" ? DecodeKernel::Regs : DecodeKernel::CpAsync;
    else throw Error(str("KILN_DECODE_TUNING: unknown item \"", item, "\" (keys=N, bps=N, blocks=N, kernel=cp.async|tma|regs, "
                        "l2=0|128, rowc=N, early=0|1|2, pf=0|1|2)"));
    pos = end + 1;
  }
  KILN_CHECK(tuning_valid(t),
             "KILN_DECODE_TUNING: keys must be a positive multiple of 64, bps positive, blocks >= 0, l2 0 or 128, "
             "rowc >= 0, early and pf 0, 1 or 2, got \"",
             spec, "\"");
  return t;
}

std::mutex& tuning_mu() {
  static std::mutex mu;
  return mu;
}
DecodeTuning& tuning_ref() {
  static DecodeTuning t = tuning_from_env();
  return t;
}

std::atomic<int64_t>& tma_launches() {
  static std::atomic<int64_t> n{0};
  return n;
}
std::atomic<int64_t>& paged_launches() {
  static std::atomic<int64_t> n{0};
  return n;
}
std::atomic<int64_t>& regs_launches() {
  static std::atomic<int64_t> n{0};
  return n;
}
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool mult8(int64_t s) { return s % 8 == 0; }

// The tensor-core tiles need 16-byte rows: f16/bf16, D = Dv in {64, 128}, contiguous channels, and every
// k/v row start 16-byte aligned (base pointer and all strides that move between rows).
bool tiles_fit(const Tensor& q, const Tensor& k, const Tensor& v, const am::Layout& L) {
  if (q.dtype() != DType::F16 && q.dtype() != DType::BF16) return false;
  if (L.d != L.dv || (L.d != 64 && L.d != 128)) return false;
  // Masks are fused into the prefill tiles (bool or f32; is_causal never comes with one); decode has none.
  if (L.mask != am::MaskKind::None && (L.has_lengths || L.causal || L.mask == am::MaskKind::F64)) return false;
  if (L.k_col != 1 || L.v_col != 1 || !mult8(L.k_row) || !mult8(L.v_row)) return false;
  if (!aligned16(k.data_ptr()) || !aligned16(v.data_ptr())) return false;
  if (L.heads > 1 && (!mult8(L.hk) || !mult8(L.hv))) return false;
  const int nb = L.has_lengths ? (L.outer > 1 ? 1 : 0) : L.nbatch;
  for (int i = 0; i < nb; ++i)
    if (!mult8(L.bk[i]) || !mult8(L.bv[i])) return false;
  return true;
}

template <class F>
void with_tag(DType t, F&& f) {
  if (t == DType::BF16) f(attn::Bf16Tag{});
  else f(attn::F16Tag{});
}


PrefillKernel prefill_kernel_from_env() {
  const char* v = std::getenv("KILN_PREFILL_KERNEL");
  if (!v || !*v || std::string(v) == "auto") return PrefillKernel::Auto;
  if (std::string(v) == "mma") return PrefillKernel::Mma;
  throw Error(str("KILN_PREFILL_KERNEL: expected auto or mma, got \"", v, "\""));
}
PrefillKernel& prefill_kernel_ref() {
  static PrefillKernel k = prefill_kernel_from_env();
  return k;
}

int& prefill_blocks_ref() {
  static int n = [] {
    const char* v = std::getenv("KILN_PREFILL_BLOCKS");
    if (!v || !*v) return 0;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    KILN_CHECK(*end == '\0' && x >= 0 && x < (1L << 31), "KILN_PREFILL_BLOCKS: expected a count >= 0, got \"", v,
               "\"");
    return static_cast<int>(x);
  }();
  return n;
}

void launch_prefill(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                    const am::Layout& L, double scale, cudaStream_t stream) {
  if (launch_prefill_sm90(out, q, k, v, L, scale, stream)) return;
  attn::FlashParams p;
  p.out = static_cast<uint16_t*>(out.data_ptr());
  p.q = static_cast<const uint16_t*>(q.data_ptr());
  p.k = static_cast<const uint16_t*>(k.data_ptr());
  p.v = static_cast<const uint16_t*>(v.data_ptr());
  p.mask = L.mask == am::MaskKind::None ? nullptr : mask.data_ptr();
  p.L = L;
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.q_tiles = (L.lq + attn::kTileKeys - 1) / attn::kTileKeys;
  const int64_t blocks = p.q_tiles * L.heads * L.outer;
  KILN_CHECK(blocks < (int64_t{1} << 31), "scaled_dot_product_attention: too many query tiles (", blocks, ")");
  with_tag(q.dtype(), [&](auto tag) {
    using Tag = decltype(tag);
    auto go = [&](auto d_const, auto causal_const, auto mask_const) {
      constexpr int D = decltype(d_const)::value;
      constexpr bool C = decltype(causal_const)::value;
      constexpr int M = decltype(mask_const)::value;
      const size_t smem = static_cast<size_t>(5 * attn::kTileKeys) * (D + attn::kPad) * sizeof(uint16_t);
      auto kernel = attn::flash_prefill_kernel<Tag, D, C, M>;
      set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, out.device().index,
                           "scaled_dot_product_attention");
      kernel<<<static_cast<unsigned>(blocks), attn::kThreads, smem, stream>>>(p);
    };
    using D64 = std::integral_constant<int, 64>;
    using D128 = std::integral_constant<int, 128>;
    using T = std::true_type;
    using F = std::false_type;
    using None = std::integral_constant<int, attn::kNoMask>;
    using Bool = std::integral_constant<int, attn::kBoolMask>;
    using Float = std::integral_constant<int, attn::kFloatMask>;
    auto with_mask = [&](auto d_const) {
      if (L.causal) go(d_const, T{}, None{});
      else if (L.mask == am::MaskKind::Bool) go(d_const, F{}, Bool{});
      else if (L.mask == am::MaskKind::F32) go(d_const, F{}, Float{});
      else go(d_const, F{}, None{});
    };
    if (L.d == 64) with_mask(D64{});
    else with_mask(D128{});
  });
  check_launch("scaled_dot_product_attention (flash prefill)");
}

// Paged caches: the block table (i32 [B, W], contiguous), the block size's log2 and the pools' block count.
struct PagedArgs {
  const int32_t* table;
  int64_t width;
  int block_shift;
  int64_t num_blocks;
};

// False when the grid does not fit the decode kernel's (split, KV head x row tile, sequence) layout.

bool launch_decode(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lengths,
                   const am::Layout& L, double scale, cudaStream_t stream, DeviceErrorRecord* err,
                   const PagedArgs* paged = nullptr) {
  const Device dev = out.device();
  const int64_t b = L.outer, hq = L.heads, hkv = hq / L.gk, rows = L.gk * L.lq;
  const int64_t row_tiles = (rows + 15) / 16;
  if (L.lkv >= (int64_t{1} << 30)) return false;
  attn::DecodeParams p;
  p.out = static_cast<uint16_t*>(out.data_ptr());
  p.q = static_cast<const uint16_t*>(q.data_ptr());
  p.k = static_cast<const uint16_t*>(k.data_ptr());
  p.v = static_cast<const uint16_t*>(v.data_ptr());
  p.lengths = lengths.data<const int32_t>();
  p.L = L;
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.rows = static_cast<int>(rows);
  p.lq = static_cast<int>(L.lq);
  p.row_tiles = static_cast<int>(row_tiles);
  p.err = err;
  p.table = nullptr;
  p.table_stride = 0;
  p.block_shift = 0;
  p.num_blocks = 0;
  // 16-byte q loads: contiguous channels, every row start a multiple of 8 elements, an aligned base.
  p.q_vec = L.q_col == 1 && aligned16(q.data_ptr()) && mult8(L.q_row) && (L.heads == 1 || mult8(L.hq)) &&
            (L.outer == 1 || mult8(L.bq[0]));
  // Splits: at most one per tuning.min_split_keys keys of the cache. Sized by Lmax; the kernels divide the
  // current length (on the device) among them, so a short context leaves the later splits empty.
  const DecodeTuning tune = decode_tuning();
  p.early = tune.early;
  p.early_chunks = tune.early_chunks;
  p.guess_skew = tune.early_guess_skew;
  const int64_t base = b * hkv * row_tiles;
  const int64_t sms = multiprocessor_count(dev.index);
  const int64_t max_splits = std::clamp<int64_t>((L.lkv + tune.min_split_keys - 1) / tune.min_split_keys, 1,
                                                 attn::kMaxSplits);
  // The TMA kernel (Hopper, opt-in) needs q rows it can copy whole (p.q_vec) and caches that fit tensor maps.
  // Its persistent grid has `blocks` blocks, and its item index (< base x splits + blocks) stays in int.
  attn::dec90::Params tp{};
  int64_t blocks = tune.max_blocks > 0 ? std::min<int64_t>(tune.max_blocks, sms) : sms;
  const bool tma = !paged && tune.kernel == DecodeKernel::Tma && p.q_vec && wgmma_available(dev.index) &&
                   base * max_splits + blocks < (int64_t{1} << 31) &&
                   encode_decode_maps(&tp.tk, &tp.k_slot, &tp.tv, &tp.v_slot, k, v, L);
  // The register kernel (the default): KV groups of at most 8 rows, q rows it can load whole. Paged caches
  // take it alone, with nothing read before the dependent-launch wait.
  const bool regs = paged ? p.q_vec && rows <= attn::kRegsMaxRows
                          : !tma && tune.kernel == DecodeKernel::Regs && p.q_vec && rows <= attn::kRegsMaxRows;
  if (paged) {
    if (!regs || paged->num_blocks >= (int64_t{1} << 31)) return false;
    p.table = paged->table;
    p.table_stride = paged->width;
    p.block_shift = paged->block_shift;
    p.num_blocks = static_cast<int>(paged->num_blocks);
    p.early = 0;
  }
  // The cp.async and register kernels' grid: (split, KV head x row tile, sequence).
  if (!tma && (hkv * row_tiles > 65535 || b > 65535)) return false;
  if (tma) {
    // The split count minimises the rounds of items times an item's tiles (plus about one tile's time for
    // its q, merge and partial) at the full length.
    const int64_t tph = (L.lkv + attn::kTileKeys - 1) / attn::kTileKeys;
    int64_t best = 1, best_cost = -1;
    for (int64_t s = 1; s <= std::min(max_splits, std::max<int64_t>(tph, 1)); ++s) {
      const int64_t per = (L.lkv + s - 1) / s, ctiles = (per + attn::kTileKeys - 1) / attn::kTileKeys;
      const int64_t used = ctiles > 0 ? (L.lkv + ctiles * attn::kTileKeys - 1) / (ctiles * attn::kTileKeys) : 1;
      const int64_t cost = (base * used + blocks - 1) / blocks * (ctiles + 1);
      if (best_cost < 0 || cost < best_cost) best = s, best_cost = cost;
    }
    p.splits = static_cast<int>(best);
    blocks = std::min<int64_t>(blocks, base * p.splits);
    tma_launches().fetch_add(1, std::memory_order_relaxed);
  } else {
    // About tuning.blocks_per_sm blocks per multiprocessor over all (sequence, KV head, row tile).
    p.splits = static_cast<int>(std::clamp<int64_t>((tune.blocks_per_sm * sms + base - 1) / base, 1, max_splits));
  }
  const int64_t out_rows = b * hq * L.lq;
  Tensor scratch;  // the partials of the split combine through global memory
  if (p.splits > 1) {
    const int64_t n_o = out_rows * p.splits * L.dv, n_ml = out_rows * p.splits;
    scratch = empty({n_o + 2 * n_ml}, DType::F32, dev);
    p.part_o = scratch.data<float>();
    p.part_ml = reinterpret_cast<float2*>(p.part_o + n_o);  // n_o is a multiple of 64: 8-byte aligned
  } else {
    p.part_o = nullptr;
    p.part_ml = nullptr;
  }
  if (regs) regs_launches().fetch_add(1, std::memory_order_relaxed);
  if (paged) paged_launches().fetch_add(1, std::memory_order_relaxed);
  with_tag(q.dtype(), [&](auto tag) {
    using Tag = decltype(tag);
    auto go = [&](auto d_const) {
      constexpr int D = decltype(d_const)::value;
      if (tma) {
        namespace d90 = attn::dec90;
        tp.p = p;
        tp.items = static_cast<int>(base * p.splits);
        tp.head_rows = static_cast<int>(hkv * row_tiles);
        const size_t smem = d90::smem_bytes<D>();
        auto kernel = d90::decode_attention_tma_kernel<Tag, D>;
        set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, dev.index, "decode_attention");
        launch_dependent(kernel, dim3(static_cast<unsigned>(blocks)), dim3(d90::kThreads), smem, stream, dev.index,
                         "decode_attention", tp);
      } else if (regs) {
        const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(hkv), static_cast<unsigned>(b));
        launch_dependent(attn::decode_attention_regs_kernel<Tag, D>, grid, dim3(attn::kThreads), 0, stream,
                         dev.index, "decode_attention", p);
      } else {
        const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(hkv * row_tiles),
                        static_cast<unsigned>(b));
        const size_t smem = static_cast<size_t>(attn::decode_smem_elems<D>()) * sizeof(uint16_t);
        auto kernel = tune.l2_prefetch == 128 ? attn::decode_attention_kernel<Tag, D, 128>
                                              : attn::decode_attention_kernel<Tag, D, 0>;
        set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, dev.index, "decode_attention");
        launch_dependent(kernel, grid, dim3(attn::kThreads), smem, stream, dev.index, "decode_attention", p);
      }
      check_launch("decode_attention");
      if (p.splits == 1) return;
      // The splits folded, launched as a dependent of the decode kernel: one warp per output row for a few
      // splits, else one block per output row.
      if (p.splits <= tune.row_combine_splits) {
        const int64_t blocks_c = (out_rows + attn::kRowCombineWarps - 1) / attn::kRowCombineWarps;
        launch_dependent(attn::decode_combine_rows_kernel<Tag, D>, dim3(static_cast<unsigned>(blocks_c)),
                         dim3(attn::kRowCombineWarps * 32), 0, stream, dev.index, "decode_attention (combine)",
                         p.out, static_cast<const float*>(p.part_o), static_cast<const float2*>(p.part_ml), p.splits,
                         static_cast<int>(out_rows));
      } else {
        launch_dependent(attn::decode_combine_kernel<Tag, D>, dim3(static_cast<unsigned>(out_rows)),
                         dim3(attn::kCombineThreads), 0, stream, dev.index, "decode_attention (combine)", p.out,
                         static_cast<const float*>(p.part_o), static_cast<const float2*>(p.part_ml), p.splits);
      }
      check_launch("decode_attention (combine)");
    };
    if (L.d == 64) go(std::integral_constant<int, 64>{});
    else go(std::integral_constant<int, 128>{});
  });
  return true;
}

void launch_general(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                    const Tensor& lengths, const am::Layout& L, double scale, cudaStream_t stream,
                    DeviceErrorRecord* err) {
  const int64_t per_warp = (L.d + L.dv) * static_cast<int64_t>(sizeof(float));
  int warps = 4;
  if (warps * per_warp > 48 * 1024) warps = 1;
  KILN_CHECK(warps * per_warp <= 48 * 1024, "scaled_dot_product_attention: head dims D = ", L.d, " and Dv = ",
             L.dv, " are too large for the CUDA kernel (D + Dv must be at most 12288)");
  const int64_t rows = L.outer * L.heads * L.lq;
  const int64_t want = (rows + warps - 1) / warps;
  const int64_t cap = static_cast<int64_t>(multiprocessor_count(out.device().index)) * 64;
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(want, cap)));
  const void* mp = L.mask == am::MaskKind::None ? nullptr : mask.data_ptr();
  const int32_t* lp = L.has_lengths ? lengths.data<const int32_t>() : nullptr;
  visit_dtypes<dset(DType::F16, DType::BF16, DType::F32)>(q.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    attn::attention_general_kernel<T><<<grid, warps * 32, warps * per_warp, stream>>>(
        out.data<T>(), static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()),
        static_cast<const T*>(v.data_ptr()), mp, lp, L, static_cast<float>(scale), rows, err);
  });
  check_launch("scaled_dot_product_attention");
}

}  // namespace

DecodeTuning decode_tuning() {
  std::lock_guard<std::mutex> lock(tuning_mu());
  return tuning_ref();
}
PrefillKernel prefill_kernel() {
  std::lock_guard<std::mutex> lock(tuning_mu());
  return prefill_kernel_ref();
}
void set_prefill_kernel(PrefillKernel k) {
  std::lock_guard<std::mutex> lock(tuning_mu());
  prefill_kernel_ref() = k;
}
int prefill_max_blocks() {
  std::lock_guard<std::mutex> lock(tuning_mu());
  return prefill_blocks_ref();
}
void set_prefill_max_blocks(int n) {
  KILN_CHECK(n >= 0, "set_prefill_max_blocks: expected a count >= 0, got ", n);
  std::lock_guard<std::mutex> lock(tuning_mu());
  prefill_blocks_ref() = n;
}

int64_t decode_tma_launches() { return tma_launches().load(std::memory_order_relaxed); }
int64_t decode_regs_launches() { return regs_launches().load(std::memory_order_relaxed); }
int64_t decode_paged_launches() { return paged_launches().load(std::memory_order_relaxed); }

void set_decode_tuning(const DecodeTuning& t) {
  KILN_CHECK(tuning_valid(t),
             "set_decode_tuning: min_split_keys must be a positive multiple of 64, blocks_per_sm positive, "
             "max_blocks >= 0, l2_prefetch 0 or 128, row_combine_splits >= 0, early and early_chunks 0, 1 or 2");
  std::lock_guard<std::mutex> lock(tuning_mu());
  tuning_ref() = t;
}

void attention(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
               const Tensor& lengths, const attention_math::Layout& L, double scale) {
  const char* op = L.has_lengths ? "decode_attention" : "scaled_dot_product_attention";
  KILN_CHECK(q.dtype() != DType::F64, op, ": f64 is not supported on CUDA (q ", q.meta(), "); use f32, f16 or bf16");
  KILN_CHECK(L.mask != am::MaskKind::F64, op, ": internal error: f64 mask on CUDA");
  const Device dev = out.device();
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  DeviceErrorRecord* err = device_error_record(dev.index);
  if (out.numel() == 0) return;
  if (tiles_fit(q, k, v, L)) {
    if (!L.has_lengths) {
      launch_prefill(out, q, k, v, mask, L, scale, stream);
      return;
    }
    if (launch_decode(out, q, k, v, lengths, L, scale, stream, err)) return;
  }
  launch_general(out, q, k, v, mask, lengths, L, scale, stream, err);
}

bool paged_decode_attention(const Tensor& out, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                            const Tensor& table, const Tensor& lengths, double scale) {
  const int64_t b = q.size(0), hq = q.size(1), lq = q.size(2), d = q.size(3);
  const int64_t nb = k_pool.size(0), s = k_pool.size(1), hkv = k_pool.size(2), dv = v_pool.size(3);
  const int64_t w = table.size(1);
  // S a power of two of at least 16 (a 16-key chunk lies in one block); positions within int.
  if (s < 16 || (s & (s - 1)) != 0 || w * s >= (int64_t{1} << 30)) return false;
  am::Layout L;
  L.nbatch = b == 1 ? 0 : 1;
  L.bsize[0] = b;
  L.bq[0] = q.stride(0);
  L.bk[0] = 0;  // every sequence addresses the whole pool through its row of the table
  L.bv[0] = 0;
  L.outer = b;
  L.heads = hq;
  L.hq = q.stride(1);
  L.hk = d;
  L.hv = dv;
  L.gk = L.gv = hq / hkv;
  L.lq = lq;
  L.lkv = w * s;
  L.d = d;
  L.dv = dv;
  L.q_row = q.stride(2);
  L.q_col = q.stride(3);
  L.k_row = hkv * d;
  L.k_col = 1;
  L.v_row = hkv * dv;
  L.v_col = 1;
  L.causal = true;
  L.has_lengths = true;
  if (!tiles_fit(q, k_pool, v_pool, L)) return false;
  const Device dev = out.device();
  DeviceGuard guard(dev);
  int shift = 0;
  while ((int64_t{1} << shift) < s) ++shift;
  const PagedArgs paged{table.data<const int32_t>(), w, shift, nb};
  return launch_decode(out, q, k_pool, v_pool, lengths, L, scale, stream_of(dev), device_error_record(dev.index),
                       &paged);
}

void kv_cache_append(const Tensor& k_cache, const Tensor& k_src, const Tensor& v_cache, const Tensor& v_src,
                     const Tensor& positions, int64_t lmax) {
  const Device dev = k_cache.device();
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  DeviceErrorRecord* err = device_error_record(dev.index);
  auto dims = [&](const Tensor& cache, const Tensor& src) {
    attn::AppendDims a;
    a.b = src.size(0);
    a.h = src.size(1);
    a.t = src.size(2);
    a.d = src.size(3);
    a.lmax = lmax;
    for (int i = 0; i < 4; ++i) {
      a.cs[i] = cache.stride(i);
      a.ss[i] = src.stride(i);
    }
    return a;
  };
  // One launch for both caches when their elements are as wide (the usual case); otherwise one each.
  auto launch = [&](const Tensor& kc, const Tensor& ks, const attn::AppendDims& ka, const Tensor* vc,
                    const Tensor* vs, const attn::AppendDims& va) {
    const int64_t n = ka.numel() + va.numel();
    if (n == 0) return;
    const unsigned grid = grid_for(n, 256, dev.index);
    auto go = [&](auto* type_tag) {
      using U = std::remove_pointer_t<decltype(type_tag)>;
      attn::kv_append_kernel<U><<<grid, 256, 0, stream>>>(
          static_cast<U*>(kc.data_ptr()), static_cast<const U*>(ks.data_ptr()), ka,
          vc ? static_cast<U*>(vc->data_ptr()) : nullptr, vs ? static_cast<const U*>(vs->data_ptr()) : nullptr, va,
          positions.data<const int32_t>(), err);
    };
    switch (kc.itemsize()) {
      case 2: go(static_cast<uint16_t*>(nullptr)); break;
      case 4: go(static_cast<uint32_t*>(nullptr)); break;
      case 8: go(static_cast<uint64_t*>(nullptr)); break;
      default: throw Error(str("kv_cache_append_: unsupported cache dtype ", kc.meta()));
    }
    check_launch("kv_cache_append_");
  };
  const attn::AppendDims ka = dims(k_cache, k_src), va = dims(v_cache, v_src);
  if (k_cache.itemsize() == v_cache.itemsize()) {
    launch(k_cache, k_src, ka, &v_cache, &v_src, va);
  } else {
    launch(k_cache, k_src, ka, nullptr, nullptr, attn::AppendDims{});
    launch(v_cache, v_src, va, nullptr, nullptr, attn::AppendDims{});
  }
}

}  // namespace kiln::cuda
