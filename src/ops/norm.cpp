// rms_norm, add_rms_norm, silu_and_mul, rotary embeddings and the fused qk_norm_rope_append_: argument
// checks, dtype handling, output allocation; the kernels are in src/cpu/norm.cpp and src/cuda/norm.cu, their
// per-element math in src/ops/norm_math.h.
#include "core/copy.h"
#include "cpu/norm.h"
#include "kiln/nn.h"
#include "ops/norm_math.h"

#include <algorithm>
#include <utility>
#include <vector>

#if KILN_HAVE_CUDA
#include "cuda/norm.h"
#endif

namespace kiln {

namespace {

bool is_float_dtype(DType t) {
  return t == DType::F16 || t == DType::BF16 || t == DType::F32 || t == DType::F64;
}

void require_cpu(const char* op, const Tensor& t) {
#if !KILN_HAVE_CUDA
  KILN_CHECK(!t.is_cuda(), op, ": no CUDA implementation yet (input ", t.meta(), ")");
#endif
}

#if KILN_HAVE_CUDA
// The same elements in the same layout (an in-place update reads each element before writing it).
bool same_view(const Tensor& a, const Tensor& b) {
  return a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes() && a.strides() == b.strides();
}
#endif

// Byte interval [lo, hi) of a non-empty view's elements, relative to its first element.
std::pair<int64_t, int64_t> byte_span(const Tensor& t) {
  const int64_t isz = static_cast<int64_t>(t.itemsize());
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d) * isz;
    (reach < 0 ? lo : hi) += reach;
  }
  return {lo, hi + isz};
}

// A view as rows: its elements lie at first + n * stride + r with 0 <= r < window (bytes), stride being the
// largest stride among its dims of size > 1 (0 for one element) and window the span of the other dims.
// False for negative strides.
bool as_rows(const Tensor& t, int64_t& stride, int64_t& window) {
  const int64_t isz = static_cast<int64_t>(t.itemsize());
  int64_t outer = -1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) <= 1) continue;
    if (t.stride(d) < 0) return false;
    if (outer < 0 || t.stride(d) > t.stride(outer)) outer = d;
  }
  stride = outer < 0 ? 0 : t.stride(outer) * isz;
  window = isz;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (d != outer && t.size(d) > 1) window += (t.size(d) - 1) * t.stride(d) * isz;
  return true;
}

// False only when a and b provably share no byte: different storages, disjoint byte intervals, or rows of
// one stride whose windows do not meet modulo that stride (q, k and v of a fused [T, q + 2 kv] projection;
// two ranges of slots of one cache buffer). Anything else counts as overlapping.
bool may_overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || !a.is_alias_of(b)) return false;
  const int64_t oa = a.storage_offset() * static_cast<int64_t>(a.itemsize());
  const int64_t ob = b.storage_offset() * static_cast<int64_t>(b.itemsize());
  const auto [alo, ahi] = byte_span(a);
  const auto [blo, bhi] = byte_span(b);
  if (oa + ahi <= ob + blo || ob + bhi <= oa + alo) return false;
  int64_t sa = 0, wa = 0, sb = 0, wb = 0;
  if (!as_rows(a, sa, wa) || !as_rows(b, sb, wb)) return true;
  const int64_t row = std::max(sa, sb);
  if (row == 0 || (sa != 0 && sb != 0 && sa != sb) || wa > row || wb > row) return true;
  auto mod = [row](int64_t x) { return ((x % row) + row) % row; };
  const int64_t pa = mod(oa), pb = mod(ob);  // non-negative strides: the first element is the lowest byte
  return !(mod(pb - pa) >= wa && mod(pa - pb) >= wb);
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  KILN_CHECK(x.dim() >= 1, "rms_norm: x must have at least 1 dim (normalises the last), got ", x.meta());
  KILN_CHECK(is_float_dtype(x.dtype()) && is_float_dtype(weight.dtype()),
             "rms_norm: x and weight must be f16, bf16, f32 or f64, got x ", x.meta(), ", weight ", weight.meta());
  KILN_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "rms_norm: weight must be [", x.size(-1),
             "] (x's last dim), got weight ", weight.meta(), " for x ", x.meta());
  KILN_CHECK(x.device() == weight.device(), "rms_norm: x and weight must be on one device, got x ", x.meta(),
             ", weight ", weight.meta());
  require_cpu("rms_norm", x);
  const Tensor xc = x.contiguous();
  // Hugging Face multiplies weight * normalised-x in their promoted dtype: convert weight once so the
  // kernel needs no (x dtype x weight dtype) instantiations.
  const Tensor wc = weight.to(promote_types(weight.dtype(), x.dtype())).contiguous();
  Tensor out = empty(x.sizes(), x.dtype(), x.device());
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    cuda::rms_norm(out, xc, wc, eps);
    return out;
  }
#endif
  cpu::rms_norm(out, xc, wc, eps);
  return out;
}

Tensor add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& weight, double eps) {
  KILN_CHECK(x.sizes() == residual.sizes(), "add_rms_norm: x and residual must have one shape, got x ",
             x.meta(), ", residual ", residual.meta());
  KILN_CHECK(x.device() == residual.device(), "add_rms_norm: x and residual must be on one device, got x ",
             x.meta(), ", residual ", residual.meta());
  KILN_CHECK(is_float_dtype(residual.dtype()) && is_float_dtype(x.dtype()),
             "add_rms_norm: x and residual must be f16, bf16, f32 or f64, got x ", x.meta(), ", residual ",
             residual.meta());
  require_cpu("add_rms_norm", residual);
  // Check the norm's arguments before residual is modified, so an invalid call changes nothing.
  KILN_CHECK(residual.dim() >= 1 && weight.dim() == 1 && weight.size(0) == residual.size(-1),
             "add_rms_norm: weight must be [", residual.dim() >= 1 ? residual.size(-1) : 0,
             "] (residual's last dim), got weight ", weight.meta(), " for residual ", residual.meta());
  KILN_CHECK(is_float_dtype(weight.dtype()) && weight.device() == residual.device(),
             "add_rms_norm: weight must be f16, bf16, f32 or f64 on residual's device, got weight ",
             weight.meta(), ", residual ", residual.meta());
  note_write(residual);
#if KILN_HAVE_CUDA
  // One pass on CUDA when residual can be updated in place as it is (contiguous) and x has its dtype; any
  // other combination takes the two-step path below, which computes the same values.
  if (residual.is_cuda() && residual.is_contiguous() && x.dtype() == residual.dtype()) {
    // x overlapping residual other than as the very same view is read from a copy, as add_ would.
    const Tensor xc = !x.is_alias_of(residual) || same_view(x, residual) ? x.contiguous() : x.clone();
    const Tensor wc = weight.to(promote_types(weight.dtype(), residual.dtype())).contiguous();
    Tensor out = empty(residual.sizes(), residual.dtype(), residual.device());
    cuda::add_rms_norm(out, residual, xc, wc, eps);
    return out;
  }
#endif
  add_(residual, x);  // residual = residual + x, rounded to residual's dtype (PyTorch's +=)
  return rms_norm(residual, weight, eps);
}

Tensor silu_and_mul(const Tensor& gate_up) {
  KILN_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0,
             "silu_and_mul: gate_up's last dim must be even ([..., 2I]), got ", gate_up.meta());
  KILN_CHECK(is_float_dtype(gate_up.dtype()), "silu_and_mul: gate_up must be f16, bf16, f32 or f64, got ",
             gate_up.meta());
  require_cpu("silu_and_mul", gate_up);
  Shape out_shape = gate_up.sizes();
  out_shape.back() /= 2;
  Tensor out = empty(out_shape, gate_up.dtype(), gate_up.device());
#if KILN_HAVE_CUDA
  if (gate_up.is_cuda()) {
    cuda::silu_and_mul(out, gate_up.contiguous());
    return out;
  }
#endif
  cpu::silu_and_mul(out, gate_up.contiguous());
  return out;
}

Tensor rope_inv_freq(int64_t rotary_dim, double theta, Device device) {
  KILN_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rope_inv_freq: rotary_dim must be even and positive, got ",
             rotary_dim);
  KILN_CHECK(theta > 0, "rope_inv_freq: theta must be positive, got ", theta);
  std::vector<float> v(static_cast<size_t>(rotary_dim / 2));
  for (int64_t j = 0; j < rotary_dim / 2; ++j) v[j] = norm_math::rope_inv_freq(j, rotary_dim, theta);
  return from_vector<float>(v).to(device);
}

void rope_(Tensor& q, Tensor& k, const Tensor& positions, const Tensor& inv_freq, double attention_scaling) {
  KILN_CHECK(q.dim() == 3 && k.dim() == 3, "rope_: q and k must be [T, H, D], got q ", q.meta(), ", k ",
             k.meta());
  KILN_CHECK(q.size(2) == k.size(2), "rope_: q and k must have one head dim D, got q ", q.meta(), ", k ",
             k.meta());
  KILN_CHECK(q.size(0) == k.size(0), "rope_: q and k must have one token count T, got q ", q.meta(), ", k ",
             k.meta());
  KILN_CHECK(positions.dim() == 1 && positions.size(0) == q.size(0), "rope_: positions must be [", q.size(0),
             "] (q's T), got ", positions.meta());
  KILN_CHECK(positions.dtype() == DType::I32 || positions.dtype() == DType::I64,
             "rope_: positions must be i32 or i64, got ", positions.meta());
  KILN_CHECK(is_float_dtype(q.dtype()) && is_float_dtype(k.dtype()),
             "rope_: q and k must be f16, bf16, f32 or f64, got q ", q.meta(), ", k ", k.meta());
  KILN_CHECK(inv_freq.dim() == 1 && is_float_dtype(inv_freq.dtype()),
             "rope_: inv_freq must be a 1-d float tensor [rotary_dim / 2], got ", inv_freq.meta());
  const int64_t rotary_dim = 2 * inv_freq.size(0);
  KILN_CHECK(rotary_dim <= q.size(2), "rope_: rotary_dim (2 * inv_freq.numel() = ", rotary_dim,
             ") must be <= the head dim ", q.size(2), ", got inv_freq ", inv_freq.meta(), ", q ", q.meta());
  KILN_CHECK(k.device() == q.device() && positions.device() == q.device() && inv_freq.device() == q.device(),
             "rope_: q, k, positions and inv_freq must be on one device, got q ", q.meta(), ", k ", k.meta(),
             ", positions ", positions.meta(), ", inv_freq ", inv_freq.meta());
  KILN_CHECK(!q.is_alias_of(k) || q.numel() == 0 || k.numel() == 0 ||
                 // Views of one qkv buffer are fine as long as they do not overlap; a cheap sufficient check
                 // is that they are different tensors. Rotating the same memory twice would be wrong.
                 q.data_ptr() != k.data_ptr(),
             "rope_: q and k must not be the same memory, got q ", q.meta(), ", k ", k.meta());
  for (const Tensor* t : {&q, &k})
    for (int64_t d = 0; d < 3; ++d)
      KILN_CHECK(t->stride(d) != 0 || t->size(d) <= 1, "rope_: q and k are updated in place and must not be "
                 "expanded views (several elements in one memory location), got ", t->meta(), " with strides ",
                 t->strides());
  require_cpu("rope_", q);
  note_write(q);
  note_write(k);
#if KILN_HAVE_CUDA
  if (q.is_cuda()) {
    // One launch for q and k; cos/sin are computed per token on the device (positions never leave it).
    cuda::rope_(q, k, positions, inv_freq.to(DType::F32).contiguous(), attention_scaling);
    return;
  }
#endif
  const int64_t t_len = q.size(0), half = rotary_dim / 2;
  Tensor cos = empty({t_len, half}, DType::F32, q.device());
  Tensor sin = empty({t_len, half}, DType::F32, q.device());
  cpu::rope_cos_sin(cos, sin, positions, inv_freq.to(DType::F32).contiguous(), attention_scaling);
  cpu::rope_apply(q, cos, sin);
  cpu::rope_apply(k, cos, sin);
}

void rope_(Tensor& q, Tensor& k, const Tensor& positions, double theta) {
  KILN_CHECK(q.dim() == 3, "rope_: q and k must be [T, H, D], got q ", q.meta(), ", k ", k.meta());
  KILN_CHECK(q.size(2) % 2 == 0 && q.size(2) > 0, "rope_: the head dim D must be even to rotate all of it, got q ",
             q.meta());
  rope_(q, k, positions, rope_inv_freq(q.size(2), theta, q.device()), 1.0);
}


void qk_norm_rope_append_(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                          double eps, const Tensor& positions, const Tensor& inv_freq, double attention_scaling,
                          Tensor& k_cache, Tensor& v_cache, const Tensor& at) {
  const char* op = "qk_norm_rope_append_";
  KILN_CHECK(q.defined() && k.defined() && v.defined() && positions.defined() && inv_freq.defined() &&
                 k_cache.defined() && v_cache.defined() && at.defined(),
             op, ": q, k, v, positions, inv_freq, k_cache, v_cache and at must be defined tensors (only q_norm and "
             "k_norm may be undefined: no norm)");
  KILN_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, op,
             ": q, k and v must be [T, Hq, D], [T, Hk, D] and [T, Hk, Dv], got q ", q.meta(), ", k ", k.meta(), ", v ",
             v.meta());
  const int64_t t_len = q.size(0), hk = k.size(1), d = q.size(2), dv = v.size(2);
  KILN_CHECK(k.size(0) == t_len && v.size(0) == t_len, op, ": q, k and v must have one token count T, got q ",
             q.meta(), ", k ", k.meta(), ", v ", v.meta());
  KILN_CHECK(k.size(2) == d, op, ": q and k must have one head dim D, got q ", q.meta(), ", k ", k.meta());
  KILN_CHECK(v.size(1) == hk, op, ": v must have k's head count Hk = ", hk, ", got k ", k.meta(), ", v ", v.meta());
  KILN_CHECK(k_cache.dim() == 4 && v_cache.dim() == 4 && k_cache.size(0) == 1 && v_cache.size(0) == 1 &&
                 k_cache.size(1) == hk && v_cache.size(1) == hk && k_cache.size(3) == d && v_cache.size(3) == dv &&
                 v_cache.size(2) == k_cache.size(2),
             op, ": the caches must be k_cache [1, ", hk, ", Lmax, ", d, "] and v_cache [1, ", hk, ", Lmax, ", dv,
             "] with one Lmax (for k ", k.meta(), ", v ", v.meta(), "), got k_cache ", k_cache.meta(), ", v_cache ",
             v_cache.meta());
  KILN_CHECK(is_float_dtype(q.dtype()) && is_float_dtype(k.dtype()) && is_float_dtype(v.dtype()) &&
                 is_float_dtype(k_cache.dtype()) && is_float_dtype(v_cache.dtype()),
             op, ": q, k, v and the caches must be f16, bf16, f32 or f64, got q ", q.meta(), ", k ", k.meta(), ", v ",
             v.meta(), ", k_cache ", k_cache.meta(), ", v_cache ", v_cache.meta());
  for (const auto& [name, w] : {std::pair<const char*, const Tensor*>{"q_norm", &q_norm}, {"k_norm", &k_norm}}) {
    if (!w->defined()) continue;
    KILN_CHECK(w->dim() == 1 && w->size(0) == d && is_float_dtype(w->dtype()), op, ": ", name,
               " must be a float tensor [", d, "] (the head dim) or undefined (no norm), got ", w->meta());
    KILN_CHECK(w->device() == q.device(), op, ": ", name, " must be on q's device, got ", w->meta(), " for q ",
               q.meta());
  }
  KILN_CHECK(positions.dim() == 1 && positions.size(0) == t_len &&
                 (positions.dtype() == DType::I32 || positions.dtype() == DType::I64),
             op, ": positions must be i32 or i64 [", t_len, "] (q's T), got ", positions.meta());
  KILN_CHECK(inv_freq.dim() == 1 && is_float_dtype(inv_freq.dtype()), op,
             ": inv_freq must be a 1-d float tensor [rotary_dim / 2], got ", inv_freq.meta());
  const int64_t rotary_dim = 2 * inv_freq.size(0);
  KILN_CHECK(rotary_dim <= d, op, ": rotary_dim (2 * inv_freq.numel() = ", rotary_dim, ") must be <= the head dim ",
             d, ", got inv_freq ", inv_freq.meta(), ", q ", q.meta());
  KILN_CHECK(at.dtype() == DType::I32 && at.dim() == 1 && at.size(0) == 1, op,
             ": at must be i32 [1] (the cache slot of token 0), got ", at.meta());
  const Device dev = q.device();
  KILN_CHECK(k.device() == dev && v.device() == dev && positions.device() == dev && inv_freq.device() == dev &&
                 k_cache.device() == dev && v_cache.device() == dev && at.device() == dev,
             op, ": every tensor must be on one device, got q ", q.meta(), ", k ", k.meta(), ", v ", v.meta(),
             ", positions ", positions.meta(), ", inv_freq ", inv_freq.meta(), ", k_cache ", k_cache.meta(),
             ", v_cache ", v_cache.meta(), ", at ", at.meta());
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"q", &q}, {"k_cache", &k_cache},
                                {"v_cache", &v_cache}})
    for (int64_t i = 0; i < t->dim(); ++i)
      KILN_CHECK(t->stride(i) != 0 || t->size(i) <= 1, op, ": ", name, " is written and must not be an expanded "
                 "view (several elements in one memory location), got ", t->meta(), " with strides ", t->strides());
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"q", &q}, {"k", &k}, {"v", &v}})
    KILN_CHECK(!t->is_alias_of(k_cache) && !t->is_alias_of(v_cache), op, ": ", name,
               " must not share memory with k_cache or v_cache, got ", name, " ", t->meta(), ", k_cache ",
               k_cache.meta(), ", v_cache ", v_cache.meta());
  KILN_CHECK(!may_overlap(k_cache, v_cache), op, ": k_cache and v_cache must not overlap, got k_cache ",
             k_cache.meta(), ", v_cache ", v_cache.meta());
  if (t_len == 0) return;
  const int64_t lmax = k_cache.size(2);
  if (!q.is_cuda() && hk > 0) {
    // The CPU throws before anything is written, q included (as kv_cache_append_ does for the caches).
    const int64_t p = at.contiguous().data<const int32_t>()[0];
    KILN_CHECK(p >= 0 && p <= lmax - t_len, op, ": at = ", p, " with T = ", t_len,
               " new tokens does not fit the cache of Lmax = ", lmax, " (valid: 0 <= at <= ", lmax - t_len, ")");
  }
  require_cpu(op, q);
  note_write(q);
  note_write(k_cache);
  note_write(v_cache);
#if KILN_HAVE_CUDA
  if (q.is_cuda()) {
    // Hugging Face multiplies by the weight in promote_types(weight, x), as rms_norm does.
    const DType dt = q.dtype();
    auto promoted = [&](const Tensor& w) { return w.defined() ? w.to(promote_types(w.dtype(), dt)).contiguous() : w; };
    const Tensor wq = promoted(q_norm), wk = promoted(k_norm);
    auto weight_fits = [&](const Tensor& w) { return !w.defined() || w.dtype() == dt || w.dtype() == DType::F32; };
    const bool fits = (dt == DType::F16 || dt == DType::BF16 || dt == DType::F32) && k.dtype() == dt &&
                      v.dtype() == dt && k_cache.dtype() == dt && v_cache.dtype() == dt && d <= cuda::kQkNormRopeMaxD &&
                      dv <= cuda::kQkNormRopeMaxD &&
                      weight_fits(wq) && weight_fits(wk) &&
                      (!wq.defined() || !wk.defined() || wq.dtype() == wk.dtype()) && !may_overlap(q, k) &&
                      !may_overlap(q, v);
    if (fits) {
      cuda::qk_norm_rope_append(q, k, v, wq, wk, eps, positions, inv_freq.to(DType::F32).contiguous(),
                                attention_scaling, k_cache, v_cache, at);
      return;
    }
  }
#endif
  // The composition (the CPU path, and CUDA cases the fused kernel does not take): every input is read before
  // q is written, so q may overlap k or v here.
  Tensor kn = k_norm.defined() ? rms_norm(k, k_norm, eps) : k.clone();
  const bool direct = !q_norm.defined() && !may_overlap(q, v);  // rotate q where it is: v is read after
  Tensor qn = q_norm.defined() ? rms_norm(q, q_norm, eps) : direct ? q : q.clone();
  rope_(qn, kn, positions, inv_freq, attention_scaling);
  kv_cache_append_(k_cache, v_cache, kn.unsqueeze(0).transpose(1, 2), v.unsqueeze(0).transpose(1, 2), at);
  if (!direct) q.copy_(qn);
}

}  // namespace kiln
