// Q8_0, Q4_0, Q4_K, Q5_K and Q6_K weights (kiln/nn.h: Q8Weight, Q4Weight, Q4KWeight, Q5KWeight, Q6KWeight): quantisation,
// dequantisation and linear. The CPU
// kernels are in src/cpu/q8_dot.cpp and q8_linear.cpp, the CUDA ones in src/cuda/quant.cu. CUDA tensors are quantised through a
// host copy (a load-time step); their dequantisation and products run on the device.
#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "cpu/q8_dot.h"
#include "kiln/nn.h"
#include "kiln/ops.h"
#if KILN_HAVE_CUDA
#include "cuda/quant.h"
#endif

namespace kiln {

namespace {

constexpr DTypeSet kWeightTypes = dset(DType::F32, DType::F16, DType::BF16);

// The two formats: values int8 [N, K] (Q8_0) or uint8 [N, K / 2] (Q4_0: two 4-bit codes a byte), scales f16
// [N, K / 32].
template <class W>
struct Format;
template <>
struct Format<Q8Weight> {
  static constexpr const char* name = "q8_0";
  static constexpr DType values = DType::I8;
  static constexpr int64_t per_byte = 1;
};
template <>
struct Format<Q4Weight> {
  static constexpr const char* name = "q4_0";
  static constexpr DType values = DType::U8;
  static constexpr int64_t per_byte = 2;
};

template <class W>
int64_t in_features(const W& w) {
  return w.values.size(1) * Format<W>::per_byte;
}

template <class W>
void check_weight(const W& w, const char* op) {
  using F = Format<W>;
  KILN_CHECK(w.values.dim() == 2 && w.values.dtype() == F::values, op, ": values must be ", dtype_name(F::values),
             " [N, ", F::per_byte == 1 ? "K" : "K / 2", "], got ", w.values.meta());
  const int64_t N = w.values.size(0), K = in_features(w);
  KILN_CHECK(K % cpu::kQ8Block == 0, op, ": K = ", K, " is not a multiple of the block size ", cpu::kQ8Block);
  KILN_CHECK(w.scales.dtype() == DType::F16 && w.scales.sizes() == Shape({N, K / cpu::kQ8Block}), op,
             ": scales must be f16 [", N, ", ", K / cpu::kQ8Block, "] for values ", w.values.meta(), ", got ",
             w.scales.meta());
  KILN_CHECK(w.scales.device() == w.values.device(), op, ": scales ", w.scales.meta(), " and values ",
             w.values.meta(), " are on different devices");
}

// Quantises w [N, K] row by row on the CPU (row(x, K, values, scales)), then moves the result to w's device.
template <class W, class Row>
W quantize(const Tensor& w, const char* op, Row row) {
  using F = Format<W>;
  KILN_CHECK(w.dim() == 2 && (dset(w.dtype()) & kWeightTypes), op, ": expected an f32/f16/bf16 weight [N, K], got ",
             w.meta());
  const int64_t N = w.size(0), K = w.size(1);
  KILN_CHECK(K % cpu::kQ8Block == 0, op, ": K = ", K, " is not a multiple of the block size ", cpu::kQ8Block);
  const Tensor wf = w.to(kCPU).to(DType::F32).contiguous();
  KILN_CHECK(all(isfinite(wf)).item<bool>(), op, ": the weight ", w.meta(), " holds NaN or infinite values");
  const int64_t row_bytes = K / F::per_byte, nb = K / cpu::kQ8Block;
  Tensor values = empty({N, row_bytes}, F::values), scales = empty({N, nb}, DType::F16);
  const float* src = wf.data<const float>();
  auto* q = static_cast<uint8_t*>(values.data_ptr());
  auto* d = static_cast<uint16_t*>(scales.data_ptr());
#pragma omp parallel for schedule(static) if (N * K >= (int64_t{1} << 16))
  for (int64_t n = 0; n < N; ++n) row(src + n * K, K, q + n * row_bytes, d + n * nb);
  return {values.to(w.device()), scales.to(w.device())};
}

template <class W>
Tensor dequantize(const W& w, DType dtype, const char* op) {
  check_weight(w, op);
  KILN_CHECK(dset(dtype) & kWeightTypes, op, ": dtype must be f32, f16 or bf16, got ", dtype_name(dtype));
  const int64_t N = w.values.size(0), K = in_features(w);
#if KILN_HAVE_CUDA
  if (w.values.is_cuda()) {
    Tensor out = empty({N, K}, dtype, w.values.device());
    cuda::dequantize_quantized(Format<W>::per_byte == 2 ? cuda::QuantFormat::Q4_0 : cuda::QuantFormat::Q8_0,
                               w.values.contiguous(), w.scales.contiguous(), out);
    return out;
  }
#endif
  const Tensor values = w.values.to(kCPU).contiguous(), scales = w.scales.to(kCPU).contiguous();
  Tensor out = empty({N, K}, DType::F32);
  cpu::dequantize_q8(out, values, scales);
  return out.to(w.values.device()).to(dtype);
}

// Q4_K, Q5_K and Q6_K: raw GGUF super-blocks of 256 values (144, 176 and 210 bytes), no separate scales; Q5_K
// and Q6_K are read from files only (no quantiser).
template <class W>
struct SuperBlocks;
template <>
struct SuperBlocks<Q4KWeight> {
  static constexpr const char* name = "q4_k";
  static constexpr int64_t bytes = cpu::kQ4KBytes;
#if KILN_HAVE_CUDA
  static constexpr cuda::QuantFormat format = cuda::QuantFormat::Q4_K;
#endif
  static void dequantize(const Tensor& out, const Tensor& blocks) { cpu::dequantize_q4k(out, blocks); }
  static void linear(const Tensor& out, const Tensor& x, const Tensor& b, const Tensor* bias) {
    cpu::linear_q4k(out, x, b, bias);
  }
};
template <>
struct SuperBlocks<Q5KWeight> {
  static constexpr const char* name = "q5_k";
  static constexpr int64_t bytes = cpu::kQ5KBytes;
#if KILN_HAVE_CUDA
  static constexpr cuda::QuantFormat format = cuda::QuantFormat::Q5_K;
#endif
  static void dequantize(const Tensor& out, const Tensor& blocks) { cpu::dequantize_q5k(out, blocks); }
  static void linear(const Tensor& out, const Tensor& x, const Tensor& b, const Tensor* bias) {
    cpu::linear_q5k(out, x, b, bias);
  }
};
template <>
struct SuperBlocks<Q6KWeight> {
  static constexpr const char* name = "q6_k";
  static constexpr int64_t bytes = cpu::kQ6KBytes;
#if KILN_HAVE_CUDA
  static constexpr cuda::QuantFormat format = cuda::QuantFormat::Q6_K;
#endif
  static void dequantize(const Tensor& out, const Tensor& blocks) { cpu::dequantize_q6k(out, blocks); }
  static void linear(const Tensor& out, const Tensor& x, const Tensor& b, const Tensor* bias) {
    cpu::linear_q6k(out, x, b, bias);
  }
};
template <class W>
constexpr bool kBlocks =
    std::is_same_v<W, Q4KWeight> || std::is_same_v<W, Q5KWeight> || std::is_same_v<W, Q6KWeight>;

template <class W>
  requires kBlocks<W>
int64_t in_features(const W& w) {
  return w.blocks.size(1) / SuperBlocks<W>::bytes * 256;
}

template <class W>
  requires kBlocks<W>
void check_weight(const W& w, const char* op) {
  KILN_CHECK(w.blocks.dim() == 2 && w.blocks.dtype() == DType::U8 && w.blocks.size(1) % SuperBlocks<W>::bytes == 0,
             op, ": blocks must be uint8 [N, K / 256 x ", SuperBlocks<W>::bytes, "] (", SuperBlocks<W>::bytes,
             " bytes per 256 values), got ", w.blocks.meta());
}

template <class W>
  requires kBlocks<W>
Tensor dequantize(const W& w, DType dtype, const char* op) {
  check_weight(w, op);
  KILN_CHECK(dset(dtype) & kWeightTypes, op, ": dtype must be f32, f16 or bf16, got ", dtype_name(dtype));
#if KILN_HAVE_CUDA
  if (w.blocks.is_cuda()) {
    Tensor out = empty({w.blocks.size(0), in_features(w)}, dtype, w.blocks.device());
    cuda::dequantize_quantized(SuperBlocks<W>::format, w.blocks.contiguous(), Tensor(), out);
    return out;
  }
#endif
  const Tensor blocks = w.blocks.to(kCPU).contiguous();
  Tensor out = empty({blocks.size(0), in_features(w)}, DType::F32);
  SuperBlocks<W>::dequantize(out, blocks);
  return out.to(w.blocks.device()).to(dtype);
}

template <class W>
W rows_of(const W& w, int64_t n0, int64_t R) {
  if constexpr (kBlocks<W>) return W{w.blocks.narrow(0, n0, R)};
  else return W{w.values.narrow(0, n0, R), w.scales.narrow(0, n0, R)};
}

template <class W>
const Tensor& values_of(const W& w) {
  if constexpr (kBlocks<W>) return w.blocks;
  else return w.values;
}

template <class W>
const char* name_of() {
  if constexpr (kBlocks<W>) return SuperBlocks<W>::name;
  else return Format<W>::name;
}

template <class W>
Tensor linear_quantized(const Tensor& x, const W& w, const std::optional<Tensor>& bias) {
  const std::string op = str("linear(", name_of<W>(), ")");
  check_weight(w, op.c_str());
  KILN_CHECK(x.dim() >= 1 && (dset(x.dtype()) & kWeightTypes), op, ": x must be f32/f16/bf16 [..., K], got ",
             x.meta());
  const Tensor& wv = values_of(w);
  const int64_t N = wv.size(0), K = in_features(w);
  KILN_CHECK(x.size(-1) == K, op, ": x ", x.meta(), " has K = ", x.size(-1), " but the weight ", wv.meta(),
             " expects ", K);
  KILN_CHECK(wv.device() == x.device(), op, ": the weight ", wv.meta(), " is not on x's device ", x.device().str());
  if (bias)
    KILN_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->dtype() == x.dtype() && bias->device() == x.device(),
               op, ": bias must be [", N, "] in x's dtype on x's device, got ", bias->meta());
  Shape out_shape = x.sizes();
  out_shape.back() = N;
  const Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    Tensor out = empty({M, N}, x.dtype(), x.device());
    const Tensor bias_c = bias ? bias->contiguous() : Tensor();
    if constexpr (kBlocks<W>)
      cuda::linear_quantized(out, x2, SuperBlocks<W>::format, w.blocks, Tensor(), bias ? &bias_c : nullptr);
    else
      cuda::linear_quantized(out, x2, std::is_same_v<W, Q4Weight> ? cuda::QuantFormat::Q4_0 : cuda::QuantFormat::Q8_0,
                             w.values, w.scales, bias ? &bias_c : nullptr);
    return out.view(out_shape);
  }
#endif
  Tensor out = empty({M, N}, x.dtype(), x.device());
  if (cpu::q8_dot_takes(M)) {
    const Tensor bias_c = bias ? bias->contiguous() : Tensor();
    if constexpr (kBlocks<W>)
      SuperBlocks<W>::linear(out, x2, w.blocks.contiguous(), bias ? &bias_c : nullptr);
    else
      cpu::linear_q8(out, x2, w.values.contiguous(), w.scales.contiguous(), bias ? &bias_c : nullptr);
    return out.view(out_shape);
  }
  // More rows on the scalar path: slices of the weight dequantised to x's dtype (8M elements at a time) through the dense product
  // (oneDNN's bf16 matmul or sgemm), never the whole matrix at once.
  const int64_t slice = std::clamp<int64_t>((int64_t{1} << 23) / std::max<int64_t>(K, 1), 1, std::max<int64_t>(N, 1));
  for (int64_t n0 = 0; n0 < N; n0 += slice) {
    const int64_t R = std::min(slice, N - n0);
    const Tensor wr = dequantize(rows_of(w, n0, R), x.dtype(), op.c_str());
    const std::optional<Tensor> br = bias ? std::optional<Tensor>(bias->narrow(0, n0, R)) : std::nullopt;
    out.narrow(1, n0, R).copy_(linear(x2, wr, br));
  }
  return out.view(out_shape);
}

}  // namespace

Q8Weight quantize_q8_0(const Tensor& w) {
  return quantize<Q8Weight>(w, "quantize_q8_0", [](const float* x, int64_t K, uint8_t* q, uint16_t* d) {
    cpu::q8_quantize_weight_row(x, K, reinterpret_cast<int8_t*>(q), d);
  });
}
Q4Weight quantize_q4_0(const Tensor& w) { return quantize<Q4Weight>(w, "quantize_q4_0", cpu::q4_quantize_weight_row); }
Tensor dequantize_q8_0(const Q8Weight& w, DType dtype) { return dequantize(w, dtype, "dequantize_q8_0"); }
Tensor dequantize_q4_0(const Q4Weight& w, DType dtype) { return dequantize(w, dtype, "dequantize_q4_0"); }
Tensor linear(const Tensor& x, const Q8Weight& w, const std::optional<Tensor>& bias) { return linear_quantized(x, w, bias); }
Tensor linear(const Tensor& x, const Q4Weight& w, const std::optional<Tensor>& bias) { return linear_quantized(x, w, bias); }

Q4KWeight quantize_q4_k(const Tensor& w) {
  KILN_CHECK(w.dim() == 2 && (dset(w.dtype()) & kWeightTypes), "quantize_q4_k: expected an f32/f16/bf16 weight [N, K], ",
             "got ", w.meta());
  const int64_t N = w.size(0), K = w.size(1);
  KILN_CHECK(K % cpu::kQ4KBlock == 0, "quantize_q4_k: K = ", K, " is not a multiple of the super-block size ",
             cpu::kQ4KBlock);
  const Tensor wf = w.to(kCPU).to(DType::F32).contiguous();
  KILN_CHECK(all(isfinite(wf)).item<bool>(), "quantize_q4_k: the weight ", w.meta(), " holds NaN or infinite values");
  const int64_t row_bytes = K / cpu::kQ4KBlock * cpu::kQ4KBytes;
  Tensor blocks = empty({N, row_bytes}, DType::U8);
  const float* src = wf.data<const float>();
  uint8_t* q = blocks.data<uint8_t>();
#pragma omp parallel for schedule(dynamic, 16) if (N * K >= (int64_t{1} << 16))
  for (int64_t n = 0; n < N; ++n) cpu::q4k_quantize_row(src + n * K, K, q + n * row_bytes);
  return {blocks.to(w.device())};
}
Tensor dequantize_q4_k(const Q4KWeight& w, DType dtype) { return dequantize(w, dtype, "dequantize_q4_k"); }
Tensor dequantize_q5_k(const Q5KWeight& w, DType dtype) { return dequantize(w, dtype, "dequantize_q5_k"); }
Tensor linear(const Tensor& x, const Q5KWeight& w, const std::optional<Tensor>& bias) { return linear_quantized(x, w, bias); }
Tensor dequantize_q6_k(const Q6KWeight& w, DType dtype) { return dequantize(w, dtype, "dequantize_q6_k"); }
Tensor linear(const Tensor& x, const Q6KWeight& w, const std::optional<Tensor>& bias) { return linear_quantized(x, w, bias); }
Tensor linear(const Tensor& x, const Q4KWeight& w, const std::optional<Tensor>& bias) { return linear_quantized(x, w, bias); }

Tensor linear(const Tensor& x, const BlockWeight& w, const std::optional<Tensor>& bias) {
  return std::visit([&](const auto& v) { return linear_quantized(x, v, bias); }, w);
}
BlockWeight narrow_rows(const BlockWeight& w, int64_t start, int64_t length) {
  return std::visit(
      [&](const auto& v) -> BlockWeight {
        const int64_t n = values_of(v).size(0);
        KILN_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow_rows: rows [", start, ", ",
                   start + length, ") of a ", name_of<std::decay_t<decltype(v)>>(), " weight of ", n, " rows");
        return rows_of(v, start, length);
      },
      w);
}
int64_t out_features(const BlockWeight& w) {
  return std::visit([](const auto& v) { return values_of(v).size(0); }, w);
}
int64_t in_features(const BlockWeight& w) {
  return std::visit([](const auto& v) { return in_features(v); }, w);
}
Tensor dequantize(const BlockWeight& w, DType dtype) {
  return std::visit([&](const auto& v) { return dequantize(v, dtype, "dequantize"); }, w);
}
const char* format_name(const BlockWeight& w) {
  return std::visit([](const auto& v) { return name_of<std::decay_t<decltype(v)>>(); }, w);
}

}  // namespace kiln
