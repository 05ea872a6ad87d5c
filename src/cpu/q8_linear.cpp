// linear(x, Q8Weight) and dequantize_q8_0 on the CPU (src/cpu/q8_dot.h).
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "core/dispatch.h"
#include "cpu/loops.h"
#include "cpu/q8_dot.h"

namespace kiln::cpu {

namespace {

// The f32 slice of the weight for the sgemm path: 16 MB.
constexpr int64_t kSliceElems = int64_t{1} << 22;

void dequantize_rows(const int8_t* q, const uint16_t* d, int64_t rows, int64_t K, float* out) {
  const int64_t nb = K / kQ8Block;
#pragma omp parallel for schedule(static) if (rows * K >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const float s = f16_bits_to_f32(d[r * nb + b]);
      for (int64_t i = 0; i < kQ8Block; ++i) out[r * K + b * kQ8Block + i] = s * q[r * K + b * kQ8Block + i];
    }
}

template <class X>
void linear_q8_kernel(const Tensor& out, const Tensor& x, const Tensor& values, const Tensor& scales,
                      const Tensor* bias) {
  const int64_t M = x.size(0), K = x.size(1), N = values.size(0), nb = K / kQ8Block;
  const X* xp = x.data<const X>();
  const int8_t* wq = values.data<const int8_t>();
  const auto* wd = static_cast<const uint16_t*>(scales.data_ptr());
  X* op = out.data<X>();
  std::vector<float> xf(static_cast<size_t>(M * K)), bias_f(static_cast<size_t>(N), 0.0f);
  for (int64_t i = 0; i < M * K; ++i) xf[static_cast<size_t>(i)] = convert<float>(xp[i]);
  if (bias) {
    const Tensor b = bias->to(DType::F32).contiguous();
    std::copy(b.data<const float>(), b.data<const float>() + N, bias_f.begin());
  }
  if (M <= kQ8DotRows) {
    std::vector<int8_t> xq(static_cast<size_t>(M * K));
    std::vector<float> xd(static_cast<size_t>(M * nb));
    for (int64_t m = 0; m < M; ++m) q8_quantize_row(xf.data() + m * K, K, xq.data() + m * K, xd.data() + m * nb);
#pragma omp parallel for schedule(static) if (N * K >= kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      float acc[4];
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const int rows = static_cast<int>(std::min<int64_t>(4, M - m0));
        q8_dot_rows(xq.data() + m0 * K, K, xd.data() + m0 * nb, nb, rows, wq + n * K, wd + n * nb, nb, acc);
        for (int r = 0; r < rows; ++r) op[(m0 + r) * N + n] = convert<X>(acc[r] + bias_f[static_cast<size_t>(n)]);
      }
    }
    return;
  }
  const int64_t slice = std::clamp<int64_t>(kSliceElems / std::max<int64_t>(K, 1), 1, N);
  std::vector<float> wf(static_cast<size_t>(slice * K)), yf(static_cast<size_t>(M * slice));
  for (int64_t n0 = 0; n0 < N; n0 += slice) {
    const int64_t R = std::min(slice, N - n0);
    dequantize_rows(wq + n0 * K, wd + n0 * nb, R, K, wf.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(R), static_cast<int>(K),
                1.0f, xf.data(), static_cast<int>(K), wf.data(), static_cast<int>(K), 0.0f, yf.data(),
                static_cast<int>(R));
#pragma omp parallel for schedule(static) if (M * R >= kParallelGrain)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t r = 0; r < R; ++r)
        op[m * N + n0 + r] = convert<X>(yf[static_cast<size_t>(m * R + r)] + bias_f[static_cast<size_t>(n0 + r)]);
  }
}

}  // namespace

void linear_q8(const Tensor& out, const Tensor& x, const Tensor& values, const Tensor& scales, const Tensor* bias) {
  if (out.numel() == 0) return;
  visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(x.dtype(), "linear(q8_0)", [&](auto tag) {
    linear_q8_kernel<typename decltype(tag)::type>(out, x, values, scales, bias);
  });
}

void dequantize_q8(const Tensor& out, const Tensor& values, const Tensor& scales) {
  dequantize_rows(values.data<const int8_t>(), static_cast<const uint16_t*>(scales.data_ptr()), values.size(0),
                  values.size(1), out.data<float>());
}

}  // namespace kiln::cpu
