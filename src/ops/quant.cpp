// Q8_0 weights (kiln/nn.h: Q8Weight): quantisation, dequantisation and linear. The CPU kernels are in
// src/cpu/q8_dot.cpp and q8_linear.cpp. CUDA tensors are quantised through a host copy (a load-time step) and
// dequantised on the device (kiln's elementwise ops, no host round trip), then multiplied as the dense weight.
#include <algorithm>
#include <vector>

#include "core/dispatch.h"
#include "cpu/q8_dot.h"
#include "kiln/nn.h"
#include "kiln/ops.h"

namespace kiln {

namespace {

constexpr DTypeSet kWeightTypes = dset(DType::F32, DType::F16, DType::BF16);

// values int8 [N, K], scales f16 [N, K / 32], on one device.
void check_weight(const Q8Weight& w, const char* op) {
  KILN_CHECK(w.values.dim() == 2 && w.values.dtype() == DType::I8, op, ": values must be int8 [N, K], got ",
             w.values.meta());
  const int64_t N = w.values.size(0), K = w.values.size(1);
  KILN_CHECK(K % cpu::kQ8Block == 0, op, ": K = ", K, " is not a multiple of the block size ", cpu::kQ8Block);
  KILN_CHECK(w.scales.dtype() == DType::F16 && w.scales.sizes() == Shape({N, K / cpu::kQ8Block}), op,
             ": scales must be f16 [", N, ", ", K / cpu::kQ8Block, "] for values ", w.values.meta(), ", got ",
             w.scales.meta());
  KILN_CHECK(w.scales.device() == w.values.device(), op, ": scales ", w.scales.meta(), " and values ",
             w.values.meta(), " are on different devices");
}

}  // namespace

Q8Weight quantize_q8_0(const Tensor& w) {
  KILN_CHECK(w.dim() == 2 && (dset(w.dtype()) & kWeightTypes), "quantize_q8_0: expected an f32/f16/bf16 weight [N, K], got ",
             w.meta());
  const int64_t N = w.size(0), K = w.size(1);
  KILN_CHECK(K % cpu::kQ8Block == 0, "quantize_q8_0: K = ", K, " is not a multiple of the block size ", cpu::kQ8Block);
  const Tensor wf = w.to(kCPU).to(DType::F32).contiguous();
  KILN_CHECK(all(isfinite(wf)).item<bool>(), "quantize_q8_0: the weight ", w.meta(), " holds NaN or infinite values");
  Tensor values = empty({N, K}, DType::I8), scales = empty({N, K / cpu::kQ8Block}, DType::F16);
  const float* src = wf.data<const float>();
  int8_t* q = values.data<int8_t>();
  auto* d = static_cast<uint16_t*>(scales.data_ptr());
#pragma omp parallel for schedule(static) if (N * K >= (int64_t{1} << 16))
  for (int64_t n = 0; n < N; ++n) cpu::q8_quantize_weight_row(src + n * K, K, q + n * K, d + n * (K / cpu::kQ8Block));
  return {values.to(w.device()), scales.to(w.device())};
}

Tensor dequantize_q8_0(const Q8Weight& w, DType dtype) {
  check_weight(w, "dequantize_q8_0");
  KILN_CHECK(dset(dtype) & kWeightTypes, "dequantize_q8_0: dtype must be f32, f16 or bf16, got ", dtype_name(dtype));
  if (w.values.is_cuda()) {
    // int8 x f16 is exact in f32; one rounding to dtype.
    const int64_t N = w.values.size(0), K = w.values.size(1), nb = K / cpu::kQ8Block;
    return mul(w.values.to(DType::F32).reshape({N, nb, cpu::kQ8Block}), w.scales.to(DType::F32).reshape({N, nb, 1}))
        .reshape({N, K})
        .to(dtype);
  }
  const Tensor values = w.values.to(kCPU).contiguous(), scales = w.scales.to(kCPU).contiguous();
  Tensor out = empty(values.sizes(), DType::F32);
  cpu::dequantize_q8(out, values, scales);
  return out.to(w.values.device()).to(dtype);
}

Tensor linear(const Tensor& x, const Q8Weight& w, const std::optional<Tensor>& bias) {
  check_weight(w, "linear(q8_0)");
  KILN_CHECK(x.dim() >= 1 && (dset(x.dtype()) & kWeightTypes), "linear(q8_0): x must be f32/f16/bf16 [..., K], got ",
             x.meta());
  const int64_t N = w.values.size(0), K = w.values.size(1);
  KILN_CHECK(x.size(-1) == K, "linear(q8_0): x ", x.meta(), " has K = ", x.size(-1), " but the weight ", w.values.meta(),
             " expects ", K);
  KILN_CHECK(w.values.device() == x.device(), "linear(q8_0): the weight ", w.values.meta(), " is not on x's device ",
             x.device().str());
  if (bias)
    KILN_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->dtype() == x.dtype() && bias->device() == x.device(),
               "linear(q8_0): bias must be [", N, "] in x's dtype on x's device, got ", bias->meta());
  if (x.is_cuda()) return linear(x, dequantize_q8_0(w, x.dtype()), bias);
  Shape out_shape = x.sizes();
  out_shape.back() = N;
  const Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  Tensor out = empty({M, N}, x.dtype(), x.device());
  if (M <= cpu::kQ8DotRows) {
    const Tensor bias_c = bias ? bias->contiguous() : Tensor();
    cpu::linear_q8(out, x2, w.values.contiguous(), w.scales.contiguous(), bias ? &bias_c : nullptr);
    return out.view(out_shape);
  }
  // More rows: slices of the weight dequantised to x's dtype (8M elements at a time) through the dense product
  // (oneDNN's bf16 matmul or sgemm), never the whole matrix at once.
  const int64_t slice = std::clamp<int64_t>((int64_t{1} << 23) / std::max<int64_t>(K, 1), 1, std::max<int64_t>(N, 1));
  for (int64_t n0 = 0; n0 < N; n0 += slice) {
    const int64_t R = std::min(slice, N - n0);
    const Tensor wr = dequantize_q8_0({w.values.narrow(0, n0, R), w.scales.narrow(0, n0, R)}, x.dtype());
    const std::optional<Tensor> br = bias ? std::optional<Tensor>(bias->narrow(0, n0, R)) : std::nullopt;
    out.narrow(1, n0, R).copy_(linear(x2, wr, br));
  }
  return out.view(out_shape);
}

}  // namespace kiln
