// rms_norm, add_rms_norm, silu_and_mul and rotary embeddings: argument checks, dtype handling, output
// allocation; the kernels are in src/cpu/norm.cpp and src/cuda/norm.cu, their per-element math in
// src/ops/norm_math.h.
#include "cpu/norm.h"
#include "kiln/nn.h"
#include "ops/norm_math.h"

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

}  // namespace kiln
