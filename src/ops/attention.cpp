// scaled_dot_product_attention, decode_attention, kv_cache_append_: argument checks (PyTorch's rules),
// broadcasting of the batch dims, the Layout that describes every operand to the kernels, dispatch to the
// CPU reference (src/cpu/attention.cpp) or the CUDA kernels (src/cuda/attention.cu).
#include <array>
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/copy.h"
#include "cpu/attention.h"
#include "kiln/nn.h"
#include "ops/attention_math.h"
#if KILN_HAVE_CUDA
#include "cuda/attention.h"
#endif

namespace kiln {
namespace {

namespace am = attention_math;

bool is_float_dtype(DType t) {
  return t == DType::F16 || t == DType::BF16 || t == DType::F32 || t == DType::F64;
}

Shape batch_of(const Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end() - 2); }

bool expands_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1 && from[i] != to[lead + i]) return false;
  return true;
}

// Fills the batch part of L from the expanded operands (q, k, v, mask: each [batch..., rows, cols] with the
// output's batch rank; mask may be undefined). The head dim is the last batch dim; the outer dims are
// coalesced where every operand allows it.
void fill_batch(am::Layout& L, const Shape& batch, const std::array<const Tensor*, 4>& ops, const char* op) {
  const size_t nb = batch.size();
  auto stride = [&](int t, size_t d) -> int64_t {
    const Tensor* x = ops[t];
    return x && x->defined() ? x->stride(static_cast<int64_t>(d)) : 0;
  };
  if (nb == 0) return;
  L.heads = batch.back();
  L.hq = stride(0, nb - 1);
  L.hk = stride(1, nb - 1);
  L.hv = stride(2, nb - 1);
  L.hm = stride(3, nb - 1);
  if (L.heads == 1) L.hq = L.hk = L.hv = L.hm = 0;
  struct Dim {
    int64_t size;
    std::array<int64_t, 4> st;
  };
  std::vector<Dim> dims;
  for (size_t d = 0; d + 1 < nb; ++d) {
    L.outer *= batch[d];
    if (batch[d] == 1) continue;
    Dim dim{batch[d], {stride(0, d), stride(1, d), stride(2, d), stride(3, d)}};
    if (!dims.empty()) {
      Dim& prev = dims.back();
      bool merge = true;
      for (int t = 0; t < 4; ++t) merge = merge && prev.st[t] == dim.st[t] * dim.size;
      if (merge) {
        prev.size *= dim.size;
        prev.st = dim.st;
        continue;
      }
    }
    dims.push_back(dim);
  }
  KILN_CHECK(static_cast<int>(dims.size()) <= am::kMaxBatchDims, op, ": the batch dims of the operands ",
             batch, " do not coalesce into at most ", am::kMaxBatchDims, " dims; make them contiguous first");
  L.nbatch = static_cast<int32_t>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    L.bsize[i] = dims[i].size;
    L.bq[i] = dims[i].st[0];
    L.bk[i] = dims[i].st[1];
    L.bv[i] = dims[i].st[2];
    L.bm[i] = dims[i].st[3];
  }
}

void run_attention(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                   const Tensor& lengths, const am::Layout& L, double scale) {
  if (out.numel() == 0) return;
#if KILN_HAVE_CUDA
  if (out.is_cuda()) {
    cuda::attention(out, q, k, v, mask, lengths, L, scale);
    return;
  }
#endif
  cpu::attention(out, q, k, v, mask, lengths, L, scale);
}

double default_scale(int64_t d, std::optional<double> scale) {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d));
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const std::optional<Tensor>& attn_mask, bool is_causal,
                                    std::optional<double> scale, bool enable_gqa) {
  const char* op = "scaled_dot_product_attention";
  KILN_CHECK(q.defined() && k.defined() && v.defined(), op, ": q, k and v must be defined tensors");
  KILN_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, op,
             ": q, k and v must be at least 2-d ([..., L, D]), got q ", q.meta(), ", k ", k.meta(), ", v ",
             v.meta());
  KILN_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), op,
             ": q, k and v must have one dtype, got q ", q.meta(), ", k ", k.meta(), ", v ", v.meta());
  KILN_CHECK(is_float_dtype(q.dtype()), op, ": q, k and v must be f16, bf16, f32 or f64, got q ", q.meta());
  KILN_CHECK(q.device() == k.device() && q.device() == v.device(), op,
             ": q, k and v must be on one device, got q ", q.meta(), ", k ", k.meta(), ", v ", v.meta());
  KILN_CHECK(q.size(-1) == k.size(-1), op, ": q and k must have one head dim (last dim), got q ", q.meta(),
             ", k ", k.meta());
  KILN_CHECK(k.size(-2) == v.size(-2), op, ": k and v must have one sequence length (dim -2), got k ",
             k.meta(), ", v ", v.meta());
  KILN_CHECK(!(is_causal && attn_mask && attn_mask->defined()), op,
             ": attn_mask must not be given with is_causal=true (as in PyTorch), got mask ",
             attn_mask->meta());
  const Tensor mask_in = attn_mask ? *attn_mask : Tensor();
  if (mask_in.defined()) {
    KILN_CHECK(mask_in.dtype() == DType::Bool || mask_in.dtype() == DType::F32 || mask_in.dtype() == q.dtype(),
               op, ": attn_mask must be bool, f32 or q's dtype ", dtype_name(q.dtype()), ", got ", mask_in.meta());
    KILN_CHECK(mask_in.device() == q.device(), op, ": attn_mask must be on q's device, got mask ",
               mask_in.meta(), ", q ", q.meta());
  }

  Shape kb = batch_of(k), vb = batch_of(v);
  int64_t gk = 1, gv = 1;
  if (enable_gqa) {
    KILN_CHECK(q.dim() >= 3 && k.dim() >= 3 && v.dim() >= 3, op,
               ": enable_gqa needs a head dim (-3) in q, k and v, got q ", q.meta(), ", k ", k.meta(), ", v ",
               v.meta());
    const int64_t hq = q.size(-3), hk = k.size(-3), hv = v.size(-3);
    const bool all_equal = hq == hk && hk == hv;
    KILN_CHECK(all_equal || (hk > 0 && hv > 0 && hq % hk == 0 && hq % hv == 0), op,
               ": with enable_gqa the query heads (", hq, ") must be a multiple of the key heads (", hk,
               ") and of the value heads (", hv, ")");
    if (!all_equal) {
      gk = hq / hk;
      gv = hq / hv;
      kb.back() = hq;
      vb.back() = hq;
    }
  }
  Shape batch;
  try {
    batch = broadcast_shapes(broadcast_shapes(batch_of(q), kb), vb);
  } catch (const Error&) {
    KILN_CHECK(false, op, ": the batch dims of q ", q.meta(), ", k ", k.meta(), " and v ", v.meta(),
               " do not broadcast", enable_gqa ? " (with the heads grouped)" : "");
  }
  const int64_t lq = q.size(-2), lkv = k.size(-2), d = q.size(-1), dv = v.size(-1);
  Shape out_shape = batch;
  out_shape.push_back(lq);
  out_shape.push_back(dv);
  Tensor out = empty(out_shape, q.dtype(), q.device());

  auto with_rows = [&](Shape b, int64_t r, int64_t c) {
    b.push_back(r);
    b.push_back(c);
    return b;
  };
  Shape kshape = batch, vshape = batch;
  if (gk != 1) kshape.back() = k.size(-3);
  if (gv != 1) vshape.back() = v.size(-3);
  const Tensor qe = q.expand(with_rows(batch, lq, d));
  const Tensor ke = k.expand(with_rows(kshape, lkv, d));
  const Tensor ve = v.expand(with_rows(vshape, lkv, dv));
  Tensor me;
  am::Layout L;
  if (mask_in.defined()) {
    const Shape full = with_rows(batch, lq, lkv);
    KILN_CHECK(expands_to(mask_in.sizes(), full), op, ": attn_mask ", mask_in.meta(),
               " does not broadcast to the attention scores' shape ", full, " ([..., Hq, Lq, Lkv])");
    Tensor m = mask_in;
    if (m.dtype() != DType::Bool) m = m.to(q.dtype() == DType::F64 ? DType::F64 : DType::F32);
    me = m.expand(full);
    L.mask = m.dtype() == DType::Bool ? am::MaskKind::Bool
                                      : (m.dtype() == DType::F64 ? am::MaskKind::F64 : am::MaskKind::F32);
    L.m_row = me.stride(-2);
    L.m_col = me.stride(-1);
  }
  fill_batch(L, batch, {&qe, &ke, &ve, &me}, op);
  L.gk = gk;
  L.gv = gv;
  L.lq = lq;
  L.lkv = lkv;
  L.d = d;
  L.dv = dv;
  L.q_row = qe.stride(-2);
  L.q_col = qe.stride(-1);
  L.k_row = ke.stride(-2);
  L.k_col = ke.stride(-1);
  L.v_row = ve.stride(-2);
  L.v_col = ve.stride(-1);
  L.causal = is_causal;
  run_attention(out, qe, ke, ve, me, Tensor(), L, default_scale(d, scale));
  return out;
}

Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& lengths,
                        std::optional<double> scale) {
  const char* op = "decode_attention";
  KILN_CHECK(q.defined() && k_cache.defined() && v_cache.defined() && lengths.defined(), op,
             ": every argument must be a defined tensor");
  KILN_CHECK(q.dim() == 4 && k_cache.dim() == 4 && v_cache.dim() == 4, op,
             ": q must be [B, Hq, Lq, D] and the caches [B, Hkv, Lmax, D(v)], got q ", q.meta(), ", k_cache ",
             k_cache.meta(), ", v_cache ", v_cache.meta());
  const int64_t b = q.size(0), hq = q.size(1), lq = q.size(2), d = q.size(3);
  const int64_t hkv = k_cache.size(1), lmax = k_cache.size(2), dv = v_cache.size(3);
  KILN_CHECK(k_cache.size(0) == b && v_cache.size(0) == b && v_cache.size(1) == hkv && v_cache.size(2) == lmax &&
                 k_cache.size(3) == d,
             op, ": shapes do not match: q ", q.meta(), " ([B, Hq, Lq, D]), k_cache ", k_cache.meta(),
             " ([B, Hkv, Lmax, D]), v_cache ", v_cache.meta(), " ([B, Hkv, Lmax, Dv])");
  KILN_CHECK(hkv > 0 && hq % hkv == 0, op, ": the query heads (", hq, ") must be a multiple of the cache's heads (",
             hkv, ")");
  KILN_CHECK(q.dtype() == k_cache.dtype() && q.dtype() == v_cache.dtype() && is_float_dtype(q.dtype()), op,
             ": q and the caches must have one dtype (f16, bf16, f32; f64 on the CPU), got q ", q.meta(),
             ", k_cache ", k_cache.meta(), ", v_cache ", v_cache.meta());
  KILN_CHECK(lengths.dtype() == DType::I32 && lengths.dim() == 1 && lengths.size(0) == b, op,
             ": lengths must be i32 [", b, "] (one per sequence), got ", lengths.meta());
  KILN_CHECK(q.device() == k_cache.device() && q.device() == v_cache.device() && q.device() == lengths.device(),
             op, ": every argument must be on one device, got q ", q.meta(), ", k_cache ", k_cache.meta(),
             ", v_cache ", v_cache.meta(), ", lengths ", lengths.meta());
  Tensor out = empty({b, hq, lq, dv}, q.dtype(), q.device());
  const Tensor lens = lengths.contiguous();
  if (lens.is_cpu()) {
    const int32_t* lp = lens.data<const int32_t>();
    for (int64_t i = 0; i < b; ++i)
      KILN_CHECK(lp[i] >= 0 && lp[i] <= lmax, op, ": lengths[", i, "] = ", lp[i], " is outside [0, ", lmax,
                 "] (the cache holds Lmax = ", lmax, " positions)");
  }
  am::Layout L;
  L.nbatch = b == 1 ? 0 : 1;
  L.bsize[0] = b;
  L.bq[0] = q.stride(0);
  L.bk[0] = k_cache.stride(0);
  L.bv[0] = v_cache.stride(0);
  L.outer = b;
  L.heads = hq;
  L.hq = q.stride(1);
  L.hk = k_cache.stride(1);
  L.hv = v_cache.stride(1);
  L.gk = L.gv = hq / hkv;
  L.lq = lq;
  L.lkv = lmax;
  L.d = d;
  L.dv = dv;
  L.q_row = q.stride(2);
  L.q_col = q.stride(3);
  L.k_row = k_cache.stride(2);
  L.k_col = k_cache.stride(3);
  L.v_row = v_cache.stride(2);
  L.v_col = v_cache.stride(3);
  L.causal = true;
  L.has_lengths = true;
  run_attention(out, q, k_cache, v_cache, Tensor(), lens, L, default_scale(d, scale));
  return out;
}

void kv_cache_append_(Tensor& k_cache, Tensor& v_cache, const Tensor& k_new, const Tensor& v_new,
                      const Tensor& positions) {
  const char* op = "kv_cache_append_";
  KILN_CHECK(k_cache.defined() && v_cache.defined() && k_new.defined() && v_new.defined() && positions.defined(),
             op, ": every argument must be a defined tensor");
  KILN_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4 && k_new.dim() == 4 && v_new.dim() == 4, op,
             ": the caches must be [B, Hkv, Lmax, D(v)] and the new entries [B, Hkv, T, D(v)], got k_cache ",
             k_cache.meta(), ", v_cache ", v_cache.meta(), ", k_new ", k_new.meta(), ", v_new ", v_new.meta());
  const int64_t b = k_cache.size(0), hkv = k_cache.size(1), lmax = k_cache.size(2), t = k_new.size(2);
  KILN_CHECK(v_cache.size(0) == b && v_cache.size(1) == hkv && v_cache.size(2) == lmax && k_new.size(0) == b &&
                 k_new.size(1) == hkv && k_new.size(3) == k_cache.size(3) && v_new.size(0) == b &&
                 v_new.size(1) == hkv && v_new.size(2) == t && v_new.size(3) == v_cache.size(3),
             op, ": shapes do not match: k_cache ", k_cache.meta(), ", v_cache ", v_cache.meta(), ", k_new ",
             k_new.meta(), " (want [B, Hkv, T, D]), v_new ", v_new.meta(), " (want [B, Hkv, T, Dv])");
  KILN_CHECK(is_float_dtype(k_cache.dtype()) && is_float_dtype(v_cache.dtype()) && is_float_dtype(k_new.dtype()) &&
                 is_float_dtype(v_new.dtype()),
             op, ": caches and new entries must be floating point, got k_cache ", k_cache.meta(), ", k_new ",
             k_new.meta(), ", v_cache ", v_cache.meta(), ", v_new ", v_new.meta());
  KILN_CHECK(positions.dtype() == DType::I32 && positions.dim() == 1 && positions.size(0) == b, op,
             ": positions must be i32 [", b, "], got ", positions.meta());
  const Device dev = k_cache.device();
  KILN_CHECK(v_cache.device() == dev && k_new.device() == dev && v_new.device() == dev && positions.device() == dev,
             op, ": every argument must be on one device, got k_cache ", k_cache.meta(), ", v_cache ",
             v_cache.meta(), ", k_new ", k_new.meta(), ", v_new ", v_new.meta(), ", positions ", positions.meta());
  KILN_CHECK(!k_cache.is_alias_of(v_cache) || k_cache.data_ptr() != v_cache.data_ptr(), op,
             ": k_cache and v_cache must not be the same memory");
  if (t == 0 || b == 0 || hkv == 0) return;
  note_write(k_cache);
  note_write(v_cache);
#if KILN_HAVE_CUDA
  if (k_cache.is_cuda()) {
    cuda::kv_cache_append(k_cache, k_new.to(k_cache.dtype()), v_cache, v_new.to(v_cache.dtype()),
                          positions.contiguous(), lmax);
    return;
  }
#endif
  const Tensor pos = positions.contiguous();
  const int32_t* pp = pos.data<const int32_t>();
  for (int64_t i = 0; i < b; ++i)
    KILN_CHECK(pp[i] >= 0 && pp[i] <= lmax - t, op, ": positions[", i, "] = ", pp[i], " with T = ", t,
               " new entries does not fit the cache of Lmax = ", lmax, " (valid: 0 <= p <= ", lmax - t, ")");
  for (int64_t i = 0; i < b; ++i) {
    k_cache.select(0, i).narrow(1, pp[i], t).copy_(k_new.select(0, i));
    v_cache.select(0, i).narrow(1, pp[i], t).copy_(v_new.select(0, i));
  }
}

}  // namespace kiln

namespace kiln {

namespace {

// The pools' shapes: k_pool [NB, S, Hkv, D], v_pool [NB, S, Hkv, Dv], contiguous, on one device.
void check_pools(const char* op, const Tensor& k_pool, const Tensor& v_pool) {
  KILN_CHECK(k_pool.defined() && v_pool.defined(), op, ": the pools must be defined tensors");
  KILN_CHECK(k_pool.dim() == 4 && v_pool.dim() == 4 && k_pool.size(0) == v_pool.size(0) &&
                 k_pool.size(1) == v_pool.size(1) && k_pool.size(2) == v_pool.size(2),
             op, ": the pools must be k_pool [NB, S, Hkv, D] and v_pool [NB, S, Hkv, Dv], got ", k_pool.meta(), " and ",
             v_pool.meta());
  KILN_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous(), op, ": the pools must be contiguous, got ",
             k_pool.meta(), " and ", v_pool.meta());
  KILN_CHECK(k_pool.device() == v_pool.device(), op, ": the pools must be on one device, got ", k_pool.meta(),
             " and ", v_pool.meta());
  KILN_CHECK(k_pool.data_ptr() != v_pool.data_ptr() || k_pool.numel() == 0, op,
             ": k_pool and v_pool must not be the same memory");
}

// A pool [NB, S, H, D] as the cache of `b` sequences that all see every slot: [b, H, NB * S, D] with stride 0
// over the sequences (a view; row p of the cache is slot p).
Tensor slots_view(const Tensor& pool, int64_t b) {
  const int64_t nb = pool.size(0), s = pool.size(1), h = pool.size(2), d = pool.size(3);
  return pool.as_strided({b, h, nb * s, d}, {0, d, h * d, 1});
}

}  // namespace

void paged_kv_append_(Tensor& k_pool, Tensor& v_pool, const Tensor& k_new, const Tensor& v_new, const Tensor& slots) {
  const char* op = "paged_kv_append_";
  check_pools(op, k_pool, v_pool);
  KILN_CHECK(k_new.defined() && v_new.defined() && slots.defined(), op, ": every argument must be a defined tensor");
  const int64_t t = k_new.dim() == 3 ? k_new.size(0) : -1;
  KILN_CHECK(k_new.dim() == 3 && v_new.dim() == 3 && v_new.size(0) == t && k_new.size(1) == k_pool.size(2) &&
                 v_new.size(1) == v_pool.size(2) && k_new.size(2) == k_pool.size(3) && v_new.size(2) == v_pool.size(3),
             op, ": the new entries must be k_new [T, Hkv, D] and v_new [T, Hkv, Dv] for pools ", k_pool.meta(), " and ",
             v_pool.meta(), ", got ", k_new.meta(), " and ", v_new.meta());
  KILN_CHECK(slots.dtype() == DType::I32 && slots.dim() == 1 && slots.size(0) == t, op, ": slots must be i32 [", t,
             "] (one per new row), got ", slots.meta());
  KILN_CHECK(slots.device() == k_pool.device(), op, ": slots must be on the pools' device, got ", slots.meta(),
             " for pools on ", k_pool.device());
  if (slots.is_cpu()) {
    const Tensor sc = slots.contiguous();
    const int32_t* sp = sc.data<const int32_t>();
    const int64_t n = k_pool.size(0) * k_pool.size(1);
    for (int64_t i = 0; i < t; ++i)
      KILN_CHECK(sp[i] >= 0 && sp[i] < n, op, ": slots[", i, "] = ", sp[i], " is outside the pools' ", n,
                 " slots (NB x S = ", k_pool.size(0), " x ", k_pool.size(1), ")");
  }
  // Row t is sequence t of kv_cache_append_ over caches that see every slot, with one new entry each.
  Tensor kc = slots_view(k_pool, t), vc = slots_view(v_pool, t);
  kv_cache_append_(kc, vc, k_new.unsqueeze(2), v_new.unsqueeze(2), slots);
}

Tensor paged_decode_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& block_table,
                              const Tensor& lengths, std::optional<double> scale) {
  const char* op = "paged_decode_attention";
  check_pools(op, k_pool, v_pool);
  KILN_CHECK(q.defined() && block_table.defined() && lengths.defined(), op,
             ": every argument must be a defined tensor");
  KILN_CHECK(q.dim() == 4, op, ": q must be [B, Hq, Lq, D], got ", q.meta());
  const int64_t b = q.size(0), nb = k_pool.size(0), s = k_pool.size(1), hkv = k_pool.size(2);
  KILN_CHECK(block_table.dtype() == DType::I32 && block_table.dim() == 2 && block_table.size(0) == b, op,
             ": block_table must be i32 [", b, ", W] (a row per sequence), got ", block_table.meta());
  KILN_CHECK(block_table.device() == q.device() && k_pool.device() == q.device(), op,
             ": every argument must be on one device, got q ", q.meta(), ", k_pool ", k_pool.meta(), ", block_table ",
             block_table.meta());
  KILN_CHECK(s >= 1, op, ": the block size must be at least 1, got pools ", k_pool.meta());
  const int64_t w = block_table.size(1);
  const Tensor table = block_table.contiguous();
  if (table.is_cpu()) {
    const int32_t* tp = table.data<const int32_t>();
    for (int64_t i = 0; i < table.numel(); ++i)
      KILN_CHECK(tp[i] >= 0 && tp[i] < nb, op, ": block_table[", i / std::max<int64_t>(w, 1), ", ",
                 i % std::max<int64_t>(w, 1), "] = ", tp[i], " is not a block of the pools (0 <= block < ", nb, ")");
  }
  KILN_CHECK(q.size(3) == k_pool.size(3) && hkv > 0 && q.size(1) % hkv == 0, op, ": q ", q.meta(),
             " does not match the pools ", k_pool.meta(), " (want [B, Hq, Lq, D] with Hq a multiple of Hkv = ", hkv, ")");
  KILN_CHECK(q.dtype() == k_pool.dtype() && q.dtype() == v_pool.dtype() && is_float_dtype(q.dtype()), op,
             ": q and the pools must have one floating dtype, got q ", q.meta(), ", k_pool ", k_pool.meta(),
             ", v_pool ", v_pool.meta());
  KILN_CHECK(lengths.dtype() == DType::I32 && lengths.dim() == 1 && lengths.size(0) == b &&
                 lengths.device() == q.device(),
             op, ": lengths must be i32 [", b, "] on q's device, got ", lengths.meta());
#if KILN_HAVE_CUDA
  if (q.is_cuda()) {
    Tensor out = empty({b, q.size(1), q.size(2), v_pool.size(3)}, q.dtype(), q.device());
    if (out.numel() == 0) return out;
    if (cuda::paged_decode_attention(out, q, k_pool, v_pool, table, lengths.contiguous(),
                                     default_scale(q.size(3), scale)))
      return out;
  }
#endif
  // Each sequence's blocks gathered into a cache of W * S positions: [B, Hkv, W * S, D]. On the CPU only the
  // table's first columns that hold a position below the longest length are gathered (a server's table is as
  // wide as the context, its sequences mostly far shorter).
  int64_t wu = w;
  if (table.is_cpu() && lengths.is_cpu() && b > 0) {
    const Tensor len = lengths.contiguous();
    const int32_t* lp = len.data<const int32_t>();
    const int64_t longest = *std::max_element(lp, lp + b);
    wu = std::clamp<int64_t>((longest + s - 1) / s, 1, std::max<int64_t>(w, 1));
    if (w == 0) wu = 0;
  }
  const Tensor used = wu == w ? table : table.narrow(1, 0, wu).contiguous();
  auto gather = [&](const Tensor& pool) {
    return index_select(pool, 0, used.reshape({b * wu}))
        .view({b, wu * s, hkv, pool.size(3)})
        .transpose(1, 2);
  };
  return decode_attention(q, gather(k_pool), gather(v_pool), lengths, scale);
}

}  // namespace kiln
