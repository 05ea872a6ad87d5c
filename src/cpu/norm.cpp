#include "cpu/norm.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dispatch.h"
#include "cpu/clones.h"
#include "cpu/loops.h"
#include "ops/norm_math.h"

namespace kiln::cpu {

namespace {

// Rows of length d: parallel over rows once the whole tensor is large enough to pay for threads.
template <class F>
void for_rows(int64_t rows, int64_t d, F f) {
  if (rows * d >= kParallelGrain && rows > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) f(r);
  } else {
    for (int64_t r = 0; r < rows; ++r) f(r);
  }
}

// for_rows with scratch: make() once per thread, f(r, scratch) for each row.
template <class Make, class F>
void for_rows_with(int64_t rows, int64_t d, Make make, F f) {
  if (rows * d >= kParallelGrain && rows > 1) {
#pragma omp parallel
    {
      auto scratch = make();
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) f(r, scratch);
    }
  } else {
    auto scratch = make();
    for (int64_t r = 0; r < rows; ++r) f(r, scratch);
  }
}

// rms_norm_kernel's f16 rows with an f16 or f32 weight: the same arithmetic on rows widened to f32 in bulk
// (F16C; converted one element at a time they took 6% of an f16 prefill), the hidden state rounded to X and
// back as rms_apply rounds it, the product rounded once to X (for P = X, rms_apply's two roundings are one).
// Bit for bit the general loop's results. bf16 keeps the general loop (its conversions are shifts the
// compiler vectorises).
template <class X, class P>
void rms_norm_f16(const Tensor& out, const Tensor& x, const Tensor& weight, double eps) {
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const X* xp = x.data<const X>();
  X* op = out.data<X>();
  std::vector<float> w(static_cast<size_t>(d));
  if constexpr (std::is_same_v<P, float>) std::copy_n(weight.data<const float>(), d, w.data());
  else simd_widen(weight.data<const P>(), d, w.data());
  const auto make = [n = static_cast<size_t>(d)] { return std::pair(std::vector<float>(n), std::vector<X>(n)); };
  for_rows_with(rows, d, make, [&](int64_t r, auto& scratch) {
    float* b = scratch.first.data();
    X* tmp = scratch.second.data();
    simd_widen(xp + r * d, d, b);
    double acc = 0;
    for (int64_t i = 0; i < d; ++i) acc += static_cast<double>(b[i] * b[i]);
    const float inv = norm_math::rms_inv<float>(static_cast<float>(acc), d, eps);
    for (int64_t i = 0; i < d; ++i) b[i] *= inv;
    simd_narrow(b, d, tmp);
    simd_widen(tmp, d, b);
    for (int64_t i = 0; i < d; ++i) b[i] *= w[static_cast<size_t>(i)];
    simd_narrow(b, d, op + r * d);
  });
}

template <class X, class P>
void rms_norm_kernel(const Tensor& out, const Tensor& x, const Tensor& weight, double eps) {
  if constexpr (std::is_same_v<X, Half> && (std::is_same_v<P, X> || std::is_same_v<P, float>)) {
    return rms_norm_f16<X, P>(out, x, weight, eps);
  }
  // Compute type: f32, f64 for f64 input (Hugging Face's hidden_states.to(torch.float32) otherwise).
  using C = std::conditional_t<std::is_same_v<X, double>, double, float>;
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const X* xp = x.data<const X>();
  const P* wp = weight.data<const P>();
  X* op = out.data<X>();
  for_rows(rows, d, [&](int64_t r) {
    const X* xr = xp + r * d;
    X* orow = op + r * d;
    // The sum of squares accumulates in double so it is (nearly) the correctly rounded f32 sum, as torch's
    // cascaded f32 reduction is to within an ulp; a naive f32 loop drifts on long rows.
    double acc = 0;
    for (int64_t i = 0; i < d; ++i) {
      const C h = convert<C>(xr[i]);
      acc += static_cast<double>(h * h);  // torch squares in f32 (pow(2)), then sums
    }
    const C inv = norm_math::rms_inv<C>(static_cast<C>(acc), d, eps);
    for (int64_t i = 0; i < d; ++i) orow[i] = norm_math::rms_apply<X, P, C>(xr[i], inv, wp[i]);
  });
}

}  // namespace

void rms_norm(const Tensor& out, const Tensor& x, const Tensor& weight, double eps) {
  if (x.numel() == 0) return;
  visit_dtypes<kFloatTypes>(x.dtype(), "rms_norm", [&](auto tag) {
    using X = typename decltype(tag)::type;
    // weight is in promote_types(weight, x), which is x's dtype, f32 or f64.
    if (weight.dtype() == x.dtype()) rms_norm_kernel<X, X>(out, x, weight, eps);
    else if (weight.dtype() == DType::F32) rms_norm_kernel<X, float>(out, x, weight, eps);
    else if (weight.dtype() == DType::F64) rms_norm_kernel<X, double>(out, x, weight, eps);
    else throw Error(std::string("rms_norm: internal error: weight dtype ") + dtype_name(weight.dtype()));
  });
}

void silu_and_mul(const Tensor& out, const Tensor& in) {
  if (out.numel() == 0) return;
  visit_dtypes<kFloatTypes>(in.dtype(), "silu_and_mul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = opmath_t<T>;
    const int64_t i_dim = out.size(-1), rows = out.numel() / i_dim;
    const T* ip = in.data<const T>();
    T* op = out.data<T>();
    if constexpr (std::is_same_v<T, Half>) {
      // f16 rows widened and narrowed in bulk with F16C, the same f32 arithmetic as silu_mul.
      const auto make = [i_dim] { return std::vector<float>(static_cast<size_t>(2 * i_dim)); };
      for_rows_with(rows, i_dim, make, [&](int64_t r, std::vector<float>& gu) {
        float* g = gu.data();
        const float* u = g + i_dim;
        simd_widen(ip + r * 2 * i_dim, 2 * i_dim, g);  // the row's gate and up halves, contiguous
        for (int64_t i = 0; i < i_dim; ++i) g[i] = g[i] / (1.f + math::exp(-g[i])) * u[i];
        simd_narrow(g, i_dim, op + r * i_dim);
      });
      return;
    }
    for_rows(rows, i_dim, [&](int64_t r) {
      const T* g = ip + r * 2 * i_dim;
      const T* u = g + i_dim;
      T* o = op + r * i_dim;
      for (int64_t i = 0; i < i_dim; ++i) o[i] = norm_math::silu_mul<T, C>(g[i], u[i]);
    });
  });
}

void rope_cos_sin(const Tensor& cos, const Tensor& sin, const Tensor& positions, const Tensor& inv_freq,
                  double scaling) {
  const int64_t t_len = cos.size(0), half = cos.size(1);
  if (t_len == 0 || half == 0) return;
  const float* f = inv_freq.data<const float>();
  float* cp = cos.data<float>();
  float* sp = sin.data<float>();
  const float sc = static_cast<float>(scaling);  // torch multiplies an f32 tensor by the scalar in f32
  visit_dtypes<dset(DType::I32, DType::I64)>(positions.dtype(), "rope_", [&](auto tag) {
    using I = typename decltype(tag)::type;
    const I* pp = positions.data<const I>();
    const int64_t ps = positions.stride(0);
    for_rows(t_len, half, [&](int64_t t) {
      const float pos = convert<float>(pp[t * ps]);  // positions.float()
      for (int64_t j = 0; j < half; ++j)
        norm_math::rope_cos_sin(pos, f[j], sc, cp[t * half + j], sp[t * half + j]);
    });
  });
}

void rope_apply(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t t_len = x.size(0), heads = x.size(1), half = cos.size(1);
  if (x.numel() == 0 || half == 0) return;
  visit_dtypes<kFloatTypes>(x.dtype(), "rope_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* base = x.data<T>();
    const int64_t st = x.stride(0), sh = x.stride(1), sd = x.stride(2);
    const float* cp = cos.data<const float>();
    const float* sp = sin.data<const float>();
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      if (sd == 1) {
        // 16-bit heads widened to f32 a row at a time (F16C where the CPU has it; element-wise conversions of f16
        // are slow), rotated in f32 with rope_pair's arithmetic and rounded back: the same bits.
        for_rows_with(
            t_len, heads * half * 2, [&] { return std::vector<float>(static_cast<size_t>(2 * half)); },
            [&](int64_t t, std::vector<float>& buf) {
              const float* c = cp + t * half;
              const float* s = sp + t * half;
              float* lo = buf.data();
              float* hi = lo + half;
              for (int64_t h = 0; h < heads; ++h) {
                T* row = base + t * st + h * sh;
                simd_widen(row, 2 * half, lo);
                for (int64_t j = 0; j < half; ++j) norm_math::rope_pair<float>(lo[j], hi[j], c[j], s[j]);
                simd_narrow(lo, 2 * half, row);
              }
            });
        return;
      }
    }
    for_rows(t_len, heads * half * 2, [&](int64_t t) {
      const float* c = cp + t * half;
      const float* s = sp + t * half;
      for (int64_t h = 0; h < heads; ++h) {
        T* row = base + t * st + h * sh;
        for (int64_t j = 0; j < half; ++j) norm_math::rope_pair<T>(row[j * sd], row[(j + half) * sd], c[j], s[j]);
      }
    });
  });
}

}  // namespace kiln::cpu
