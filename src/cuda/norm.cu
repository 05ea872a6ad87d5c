// CUDA launchers of rms_norm, add_rms_norm, silu_and_mul, rope_ and the fused qk_norm_rope_append_
// (kernels: kernels/norm.cuh).
//
// This file is compiled with --fmad=false (src/CMakeLists.txt): rope's a*cos - b*sin must round after each
// product as the CPU does (x86-64 baseline has no fma), or results drift from the CPU reference by an ulp.
// The kernels are bandwidth bound, so the lost contraction costs nothing measurable.
#include "cuda/norm.h"

#include <climits>
#include <cstdint>

#include "core/dispatch.h"
#include "cuda/device_error.h"
#include "cuda/kernels/norm.cuh"
#include "cuda/launch.h"

namespace kiln::cuda {

namespace {

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

void check_cuda_tensor(const char* op, const Tensor& t, Device device) {
  KILN_CHECK(t.is_cuda(), op, ": expected a CUDA tensor, got ", t.meta());
  check_same_device(op, device, t);
}

template <class X, class P, bool ADD, int VEC>
void launch_rms(X* out, X* residual, const X* x, const P* w, int64_t rows, int d, double eps, cudaStream_t s,
                int device) {
  const int nvec = d / VEC;
  // Threads per row: enough that kNormCache vectors each cover the row, a whole number of warps. A decode
  // step has a row or a few: then one vector per thread (up to kNormMaxThreads), so every load of the row is
  // in flight at once and the row costs one memory round trip (at 256 threads x 4 vectors, [1, 8192] bf16
  // took 3.1 us graph-replayed against 1.6 us for a one-pass op of the same size).
  const int per_thread = rows <= 64 ? 1 : kNormCache;
  const int want = (nvec + per_thread - 1) / per_thread;
  const int group = std::min(kNormMaxThreads, std::max(32, (want + 31) / 32 * 32));
  // Short rows (q/k norms over D = 128, ...): one warp per row, 8 rows per block.
  const int rows_per_block = group == 32 ? static_cast<int>(std::min<int64_t>(8, rows)) : 1;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  KILN_CHECK(blocks <= INT_MAX, "rms_norm: too many rows (", rows, ") for one launch");
  // A dependent launch (kernels/pdl.cuh): the kernel waits for its predecessor before touching memory, so
  // only the launch itself overlaps the previous kernel.
  launch_dependent(rms_norm_rows<X, P, ADD, VEC>, dim3(static_cast<unsigned>(blocks)), dim3(group, rows_per_block), 0,
                   s, device, "rms_norm", out, residual, x, w, rows, d, eps);
}

// The single dtype dispatch point of rms_norm and add_rms_norm.
void rms_dispatch(const char* op, const Tensor& out, const Tensor* residual, const Tensor& x, const Tensor& weight,
                  double eps) {
  const int64_t d = x.size(-1), rows = x.numel() / d;
  KILN_CHECK(d <= INT_MAX, op, ": rows of more than 2^31 - 1 elements are not supported, got ", x.meta());
  DeviceGuard guard(x.device());
  const cudaStream_t s = stream_of(x.device());
  visit_dtypes<kFloatTypes>(x.dtype(), op, [&](auto tag) {
    using X = typename decltype(tag)::type;
    constexpr int V = static_cast<int>(16 / sizeof(X));
    auto run = [&](auto wtag) {
      using P = typename decltype(wtag)::type;
      X* po = static_cast<X*>(out.data_ptr());
      X* pr = residual ? static_cast<X*>(residual->data_ptr()) : nullptr;
      const X* px = static_cast<const X*>(x.data_ptr());
      const P* pw = static_cast<const P*>(weight.data_ptr());
      const bool vec = d % V == 0 && aligned_to(po, 16) && aligned_to(px, 16) && (!pr || aligned_to(pr, 16)) &&
                       aligned_to(pw, sizeof(P) * V);
      const int di = static_cast<int>(d);
      if (pr) {
        if (vec) launch_rms<X, P, true, V>(po, pr, px, pw, rows, di, eps, s, x.device().index);
        else launch_rms<X, P, true, 1>(po, pr, px, pw, rows, di, eps, s, x.device().index);
      } else {
        if (vec) launch_rms<X, P, false, V>(po, pr, px, pw, rows, di, eps, s, x.device().index);
        else launch_rms<X, P, false, 1>(po, pr, px, pw, rows, di, eps, s, x.device().index);
      }
    };
    // weight is in promote_types(weight, x): x's dtype, f32 or f64 (the op layer converted it).
    if (weight.dtype() == x.dtype()) run(TypeTag<X>{});
    else if (weight.dtype() == DType::F32) run(TypeTag<float>{});
    else if (weight.dtype() == DType::F64) run(TypeTag<double>{});
    else throw Error(str(op, ": internal error: weight ", weight.meta(), " for x ", x.meta()));
  });
  check_launch(op);
}

void check_rms_args(const char* op, const Tensor& out, const Tensor& x, const Tensor& weight) {
  check_cuda_tensor(op, x, x.device());
  check_cuda_tensor(op, out, x.device());
  check_cuda_tensor(op, weight, x.device());
  KILN_CHECK(x.dim() >= 1 && out.sizes() == x.sizes() && out.dtype() == x.dtype() && out.is_contiguous() &&
                 x.is_contiguous(),
             op, ": internal error: out ", out.meta(), " and x ", x.meta(), " must be contiguous, one shape and dtype");
  KILN_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1) && weight.is_contiguous(), op,
             ": internal error: weight ", weight.meta(), " must be contiguous [", x.size(-1), "]");
}

}  // namespace

void rms_norm(const Tensor& out, const Tensor& x, const Tensor& weight, double eps) {
  check_rms_args("rms_norm", out, x, weight);
  if (x.numel() == 0) return;
  rms_dispatch("rms_norm", out, nullptr, x, weight, eps);
}

void add_rms_norm(const Tensor& out, const Tensor& residual, const Tensor& x, const Tensor& weight, double eps) {
  check_rms_args("add_rms_norm", out, x, weight);
  check_cuda_tensor("add_rms_norm", residual, x.device());
  KILN_CHECK(residual.sizes() == x.sizes() && residual.dtype() == x.dtype() && residual.is_contiguous(),
             "add_rms_norm: internal error: residual ", residual.meta(), " must be contiguous like x ", x.meta());
  KILN_CHECK(!x.is_alias_of(residual) || x.data_ptr() == residual.data_ptr(),
             "add_rms_norm: internal error: x ", x.meta(), " overlaps residual ", residual.meta(),
             " without being the same view");
  if (x.numel() == 0) return;
  rms_dispatch("add_rms_norm", out, &residual, x, weight, eps);
}

void silu_and_mul(const Tensor& out, const Tensor& in) {
  check_cuda_tensor("silu_and_mul", in, in.device());
  check_cuda_tensor("silu_and_mul", out, in.device());
  KILN_CHECK(in.dim() >= 1 && in.is_contiguous() && out.is_contiguous() && out.dtype() == in.dtype() &&
                 out.dim() == in.dim() && out.size(-1) * 2 == in.size(-1) && out.numel() * 2 == in.numel(),
             "silu_and_mul: internal error: out ", out.meta(), " for in ", in.meta());
  if (out.numel() == 0) return;
  const int64_t inner = out.size(-1), rows = out.numel() / inner;
  DeviceGuard guard(in.device());
  const cudaStream_t s = stream_of(in.device());
  visit_dtypes<kFloatTypes>(in.dtype(), "silu_and_mul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = static_cast<int>(16 / sizeof(T));
    T* po = static_cast<T*>(out.data_ptr());
    const T* pi = static_cast<const T*>(in.data_ptr());
    const bool vec = inner % V == 0 && aligned_to(po, 16) && aligned_to(pi, 16);
    const int threads = 128;
    auto launch = [&](auto vtag) {
      constexpr int VV = decltype(vtag)::value;
      const int64_t nvec = inner / VV;
      // x covers one row (capped: the loop strides), y the rows (the kernel strides past 65535).
      const int64_t bx = std::min<int64_t>((nvec + threads - 1) / threads, 1024);
      const int64_t by = std::min<int64_t>(rows, 65535);
      launch_dependent(silu_and_mul_rows<T, VV>, dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by)),
                       dim3(threads), 0, s, in.device().index, "silu_and_mul", po, pi, rows, inner);
    };
    if (vec) launch(std::integral_constant<int, V>{});
    else launch(std::integral_constant<int, 1>{});
  });
  check_launch("silu_and_mul");
}

void rope_(const Tensor& q, const Tensor& k, const Tensor& positions, const Tensor& inv_freq, double scaling) {
  const Device dev = q.device();
  check_cuda_tensor("rope_", q, dev);
  check_cuda_tensor("rope_", k, dev);
  check_cuda_tensor("rope_", positions, dev);
  check_cuda_tensor("rope_", inv_freq, dev);
  KILN_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2) &&
                 inv_freq.dtype() == DType::F32 && inv_freq.is_contiguous() && inv_freq.dim() == 1 &&
                 2 * inv_freq.size(0) <= q.size(2) && positions.dim() == 1 && positions.size(0) == q.size(0),
             "rope_: internal error: q ", q.meta(), ", k ", k.meta(), ", positions ", positions.meta(), ", inv_freq ",
             inv_freq.meta());
  const int64_t t_len = q.size(0), half = inv_freq.size(0);
  if (t_len == 0 || half == 0 || (q.numel() == 0 && k.numel() == 0)) return;
  // cos/sin of one token live in shared memory (2 * half floats, under the 48 KB default).
  KILN_CHECK(half <= 4096, "rope_: rotary_dim up to 8192 is supported on CUDA, got ", 2 * half, " (inv_freq ",
             inv_freq.meta(), ")");
  KILN_CHECK(t_len <= INT_MAX && q.size(1) + k.size(1) <= INT_MAX, "rope_: too many tokens or heads for one launch: q ",
             q.meta(), ", k ", k.meta());
  DeviceGuard guard(dev);
  const cudaStream_t s = stream_of(dev);
  const int h = static_cast<int>(half);
  const float sc = static_cast<float>(scaling);  // torch multiplies the f32 cos/sin by the scalar in f32

  // One launch over the heads of `a` then those of `b` (b may have no heads).
  auto launch = [&](const Tensor& a, const Tensor* b) {
    visit_dtypes<kFloatTypes>(a.dtype(), "rope_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      constexpr int V = static_cast<int>(16 / sizeof(T));
      auto heads_of = [](const Tensor* t) {
        RopeHeads<T> r{nullptr, 0, 0, 1, 0};
        if (t && t->numel() > 0)
          r = {static_cast<T*>(t->data_ptr()), t->stride(0), t->stride(1), t->stride(2), static_cast<int>(t->size(1))};
        return r;
      };
      const RopeHeads<T> ha = heads_of(&a), hb = heads_of(b);
      auto vec_ok = [&](const RopeHeads<T>& r) {
        return r.heads == 0 || (r.sd == 1 && r.st % V == 0 && r.sh % V == 0 && aligned_to(r.base, 16));
      };
      const bool vec = half % V == 0 && vec_ok(ha) && vec_ok(hb);
      const int total = ha.heads + hb.heads;
      if (total == 0) return;
      const int threads = 128;
      visit_dtypes<dset(DType::I32, DType::I64)>(positions.dtype(), "rope_", [&](auto itag) {
        using I = typename decltype(itag)::type;
        const I* pp = static_cast<const I*>(positions.data_ptr());
        auto go = [&](auto vtag) {
          constexpr int VV = decltype(vtag)::value;
          const int per_head = h / VV;
          // About one pair-vector per thread; more heads per block when a grid of 65535 rows would not do.
          int hpb = std::max(1, threads / per_head);
          hpb = std::max(hpb, (total + 65534) / 65535);
          const int by = (total + hpb - 1) / hpb;
          rope_heads<T, I, VV><<<dim3(static_cast<unsigned>(t_len), static_cast<unsigned>(by)), threads,
                                 2 * half * sizeof(float), s>>>(ha, hb, pp, positions.stride(0),
                                                                static_cast<const float*>(inv_freq.data_ptr()), h, sc,
                                                                hpb);
        };
        if (vec) go(std::integral_constant<int, V>{});
        else go(std::integral_constant<int, 1>{});
      });
    });
  };
  if (q.dtype() == k.dtype()) {
    launch(q, &k);
  } else {
    launch(q, nullptr);
    launch(k, nullptr);
  }
  check_launch("rope_");
}


void qk_norm_rope_append(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                         double eps, const Tensor& positions, const Tensor& inv_freq, double scaling,
                         const Tensor& k_cache, const Tensor& v_cache, const Tensor& at) {
  const char* op = "qk_norm_rope_append_";
  const Device dev = q.device();
  for (const Tensor* t : {&q, &k, &v, &positions, &inv_freq, &k_cache, &v_cache, &at}) check_cuda_tensor(op, *t, dev);
  for (const Tensor* t : {&q_norm, &k_norm})
    if (t->defined()) check_cuda_tensor(op, *t, dev);
  const DType dt = q.dtype();
  const bool norms_ok = (!q_norm.defined() || !k_norm.defined() || q_norm.dtype() == k_norm.dtype()) &&
                        (!q_norm.defined() || (q_norm.dim() == 1 && q_norm.size(0) == q.size(2) &&
                                               q_norm.is_contiguous())) &&
                        (!k_norm.defined() || (k_norm.dim() == 1 && k_norm.size(0) == q.size(2) &&
                                               k_norm.is_contiguous()));
  KILN_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && k_cache.dim() == 4 && v_cache.dim() == 4 &&
                 k.dtype() == dt && v.dtype() == dt && k_cache.dtype() == dt && v_cache.dtype() == dt &&
                 k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(2) == q.size(2) &&
                 v.size(1) == k.size(1) && k_cache.size(0) == 1 && k_cache.size(1) == k.size(1) &&
                 k_cache.size(3) == q.size(2) && v_cache.size(0) == 1 && v_cache.size(1) == k.size(1) &&
                 v_cache.size(2) == k_cache.size(2) && v_cache.size(3) == v.size(2) &&
                 q.size(2) <= kQkNormRopeMaxD && v.size(2) <= kQkNormRopeMaxD &&
                 inv_freq.dtype() == DType::F32 && inv_freq.dim() == 1 && inv_freq.is_contiguous() &&
                 2 * inv_freq.size(0) <= q.size(2) && positions.dim() == 1 && positions.size(0) == q.size(0) &&
                 (positions.dtype() == DType::I32 || positions.dtype() == DType::I64) && at.dtype() == DType::I32 &&
                 at.numel() == 1 && norms_ok,
             op, ": internal error: q ", q.meta(), ", k ", k.meta(), ", v ", v.meta(), ", k_cache ", k_cache.meta(),
             ", v_cache ", v_cache.meta(), ", positions ", positions.meta(), ", inv_freq ", inv_freq.meta(), ", at ",
             at.meta());
  const int64_t t_len = q.size(0), hq = q.size(1), hk = k.size(1);
  if (t_len == 0 || hq + hk == 0) return;
  KILN_CHECK(hq + 2 * hk <= INT_MAX, op, ": too many heads for one launch: q ", q.meta(), ", k ", k.meta());
  const int64_t rows = t_len * (hq + 2 * hk);
  const int64_t blocks = (rows + kQkWarpsPerBlock - 1) / kQkWarpsPerBlock;
  KILN_CHECK(blocks <= INT_MAX, op, ": too many tokens for one launch: q ", q.meta());

  QkRopeDims a;
  a.t_len = t_len;
  a.hq = static_cast<int>(hq);
  a.hk = static_cast<int>(hk);
  a.d = static_cast<int>(q.size(2));
  a.dv = static_cast<int>(v.size(2));
  a.half = static_cast<int>(inv_freq.size(0));
  a.q_st = q.stride(0), a.q_sh = q.stride(1), a.q_sd = q.stride(2);
  a.k_st = k.stride(0), a.k_sh = k.stride(1), a.k_sd = k.stride(2);
  a.v_st = v.stride(0), a.v_sh = v.stride(1), a.v_sd = v.stride(2);
  a.kc_sh = k_cache.stride(1), a.kc_sp = k_cache.stride(2), a.kc_sd = k_cache.stride(3);
  a.vc_sh = v_cache.stride(1), a.vc_sp = v_cache.stride(2), a.vc_sd = v_cache.stride(3);
  a.lmax = k_cache.size(2);
  a.pos_stride = positions.stride(0);
  a.pos_i64 = positions.dtype() == DType::I64;
  a.scaling = static_cast<float>(scaling);  // torch multiplies the f32 cos/sin by the scalar in f32
  a.eps = eps;

  DeviceGuard guard(dev);
  const cudaStream_t s = stream_of(dev);
  DeviceErrorRecord* err = device_error_record(dev.index);
  const Tensor& any_norm = q_norm.defined() ? q_norm : k_norm;
  visit_dtypes<dset(DType::F16, DType::BF16, DType::F32)>(dt, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto go = [&](auto wtag) {
      using P = typename decltype(wtag)::type;
      auto wp = [](const Tensor& w) { return w.defined() ? static_cast<const P*>(w.data_ptr()) : nullptr; };
      launch_dependent(qk_norm_rope_append_kernel<T, P>, dim3(static_cast<unsigned>(blocks)),
                       dim3(32 * kQkWarpsPerBlock), 0, s, dev.index, op, static_cast<T*>(q.data_ptr()),
                       static_cast<const T*>(k.data_ptr()), static_cast<const T*>(v.data_ptr()), wp(q_norm),
                       wp(k_norm), static_cast<const void*>(positions.data_ptr()),
                       static_cast<const float*>(inv_freq.data_ptr()), static_cast<T*>(k_cache.data_ptr()),
                       static_cast<T*>(v_cache.data_ptr()), static_cast<const int32_t*>(at.data_ptr()), a, err);
    };
    // The norm weights are in promote_types(weight, q): q's dtype or f32 (the op layer converted them).
    if (!any_norm.defined() || any_norm.dtype() == dt) go(TypeTag<T>{});
    else if (any_norm.dtype() == DType::F32) go(TypeTag<float>{});
    else throw Error(str(op, ": internal error: norm weight ", any_norm.meta(), " for q ", q.meta()));
  });
  check_launch(op);
}

}  // namespace kiln::cuda
