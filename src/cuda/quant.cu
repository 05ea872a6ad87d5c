// CUDA launchers of the llama.cpp-format weights (kernels in src/cuda/kernels/qgemv.cuh): the activations'
// int8 quantisation and the matrix-vector kernel for few rows, the dequantisation kernel, and the sliced
// dequantise-then-multiply path for many rows.
#include "cuda/quant.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <optional>

#include "core/dispatch.h"
#include "cuda/kernels/qgemv.cuh"
#include "cuda/launch.h"
#include "cuda/linear.h"
#include "kiln/nn.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {

constexpr DTypeSet kActTypes = dset(DType::F32, DType::F16, DType::BF16);

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The initial value from KILN_QUANT_SLICE (values per slice), for A/B runs.
std::atomic<int64_t>& slice_elements() {
  static std::atomic<int64_t> n{[] {
    const char* v = std::getenv("KILN_QUANT_SLICE");
    const int64_t x = v && *v ? std::atoll(v) : 0;
    return x > 0 ? x : int64_t{1} << 25;
  }()};
  return n;
}

// The weight's bytes as the kernels read them: rows with unit inner stride, 16-byte aligned base and row
// stride (Q6_K, whose 210-byte blocks the kernels read 2 bytes at a time: 2-byte), a fresh copy otherwise; and
// scales with unit inner stride.
bool kernel_layout(const Tensor& values, QuantFormat f) {
  const int64_t a = f == QuantFormat::Q6_K ? 2 : 16;
  return values.stride(1) == 1 && reinterpret_cast<uintptr_t>(values.data_ptr()) % a == 0 &&
         (values.size(0) <= 1 || values.stride(0) % a == 0);
}
Tensor kernel_values(const Tensor& values, QuantFormat f) {
  if (kernel_layout(values, f)) return values;
  const Tensor c = values.contiguous();  // a fresh buffer unless already contiguous (then misaligned: copied)
  return kernel_layout(c, f) ? c : c.clone();
}
Tensor kernel_scales(const Tensor& scales) {
  return !scales.defined() || scales.stride(1) == 1 ? scales : scales.contiguous();
}

int out_type(DType t) {
  return t == DType::F32 ? kernels::kQOutF32 : t == DType::F16 ? kernels::kQOutF16 : kernels::kQOutBF16;
}

// Calls fn(integral_constant<int, F>) for the format.
template <class Fn>
void with_format(QuantFormat f, Fn&& fn) {
  switch (f) {
    case QuantFormat::Q8_0: fn(std::integral_constant<int, kernels::kQ8_0>{}); break;
    case QuantFormat::Q4_0: fn(std::integral_constant<int, kernels::kQ4_0>{}); break;
    case QuantFormat::Q4_K: fn(std::integral_constant<int, kernels::kQ4_K>{}); break;
    case QuantFormat::Q5_K: fn(std::integral_constant<int, kernels::kQ5_K>{}); break;
    case QuantFormat::Q6_K: fn(std::integral_constant<int, kernels::kQ6_K>{}); break;
  }
}

// Warps per weight row: doubled while the grid stays under 32 warps per multiprocessor and every thread keeps
// at least one full step of U chunks.
int split_for(int64_t n, int chunks, int unroll, int device) {
  const int64_t sms = multiprocessor_count(device);
  int split = 1;
  while (split < kernels::kGemvWarps && n * split * 2 <= sms * 32 && chunks >= 32 * split * 2 * unroll) split *= 2;
  return split;
}

// The initial value from KILN_QGEMV_BLOCKS_PER_SM, for A/B runs (quant.h).
std::atomic<int64_t>& blocks_per_sm() {
  static std::atomic<int64_t> v{[] {
    const char* e = std::getenv("KILN_QGEMV_BLOCKS_PER_SM");
    const long long x = e && *e ? std::atoll(e) : 0;
    return static_cast<int64_t>(std::max(0LL, x));
  }()};
  return v;
}

// n: the weight rows of one product (values' rows, or a group's: the stack's rows / grp.num when grouped).
template <int F, int MT>
void launch_gemv(const int8_t* xq, const float* xd, const int* xs, int rows, int k, const Tensor& values,
                 const Tensor& scales, const void* bias, int otype, void* y, int64_t ldy, bool dependent, int device,
                 cudaStream_t stream, int64_t n, const kernels::QGroups& grp = {}, int num_groups = 1) {
  const int split = split_for(n * num_groups, kernels::q_chunks_per_row<F>(k), kernels::qgemv_unroll<MT>(), device);
  const int64_t per_block = kernels::kGemvWarps / split;
  int64_t blocks = (n + per_block - 1) / per_block;
  if (const int64_t per_sm = blocks_per_sm().load(std::memory_order_relaxed); per_sm > 0)
    blocks = std::min(blocks, per_sm * multiprocessor_count(device));
  KILN_CHECK(blocks <= INT_MAX, "linear(quantized): N = ", n, " needs too many blocks");
  constexpr bool sb = kernels::q_super_blocks(F);
  const uint16_t* ws = sb ? nullptr : static_cast<const uint16_t*>(scales.data_ptr());
  const int64_t ldws = sb ? 0 : (values.size(0) > 1 ? scales.stride(0) : 0);
  const int64_t ldw = values.size(0) > 1 ? values.stride(0) : 0;
  const bool pipe = blocks < (n + per_block - 1) / per_block;
  launch_dependent_if(dependent, pipe ? kernels::qgemv_kernel<F, MT, true> : kernels::qgemv_kernel<F, MT, false>,
                      dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(num_groups)),
                      dim3(kernels::kGemvThreads), 0, stream, device, "linear(quantized)", xq, xd, xs, rows, k,
                      static_cast<const uint8_t*>(values.data_ptr()), ldw, ws, ldws, n, bias, otype, y, ldy, split,
                      grp);
}

// x2's rows quantised for the int8 kernels: codes [m, k], scales and code sums [m, k / 32].
struct QuantizedRows {
  Tensor q, d, s;
};
QuantizedRows quantize_rows(const Tensor& x, const char* op) {
  const int64_t m = x.size(0), k = x.size(1), nb = k / kernels::kQBlock;
  const Device dev = x.device();
  QuantizedRows r{empty({m, k}, DType::I8, dev), empty({m, nb}, DType::F32, dev), empty({m, nb}, DType::I32, dev)};
  visit_dtypes<kActTypes>(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t blocks = (m * nb + 7) / 8;
    launch_dependent(kernels::quantize_x_q8_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0,
                     stream_of(dev), dev.index, op, static_cast<const T*>(x.data_ptr()), m > 1 ? x.stride(0) : k,
                     static_cast<int>(m), static_cast<int>(k), r.q.data<int8_t>(), r.d.data<float>(),
                     r.s.data<int32_t>());
  });
  return r;
}

// The weight dequantised to x's dtype in slices of rows (slice_elements() values at most at a time), each
// multiplied by the dense product.
void linear_sliced(const Tensor& y, const Tensor& x2, QuantFormat f, const Tensor& values, const Tensor& scales,
                   const Tensor* bias) {
  const int64_t n = values.size(0), k = x2.size(1);
  const int64_t slice = std::clamp<int64_t>(slice_elements().load(std::memory_order_relaxed) / std::max<int64_t>(k, 1), 1,
                                            std::max<int64_t>(n, 1));
  for (int64_t n0 = 0; n0 < n; n0 += slice) {
    const int64_t r = std::min(slice, n - n0);
    Tensor wd = empty({r, k}, x2.dtype(), x2.device());
    dequantize_quantized(f, values.narrow(0, n0, r), super_blocks(f) ? scales : scales.narrow(0, n0, r), wd);
    if (r == n) {
      if (linear_cublaslt(y, x2, wd, bias)) return;
      Tensor(y).copy_(kiln::linear(x2, wd, bias ? std::optional<Tensor>(*bias) : std::nullopt));
      return;
    }
    const std::optional<Tensor> br = bias ? std::optional<Tensor>(bias->narrow(0, n0, r)) : std::nullopt;
    y.narrow(1, n0, r).copy_(kiln::linear(x2, wd, br));
  }
}

}  // namespace

void set_quant_slice_elements(int64_t n) {
  KILN_CHECK(n >= 1, "quant slice elements must be >= 1, got ", n);
  slice_elements().store(n, std::memory_order_relaxed);
}
int64_t quant_slice_elements() { return slice_elements().load(std::memory_order_relaxed); }

void set_qgemv_blocks_per_sm(int64_t n) {
  KILN_CHECK(n >= 0, "matrix-vector blocks per multiprocessor must be >= 0, got ", n);
  blocks_per_sm().store(n, std::memory_order_relaxed);
}
int64_t qgemv_blocks_per_sm() { return blocks_per_sm().load(std::memory_order_relaxed); }

void dequantize_quantized(QuantFormat f, const Tensor& values_in, const Tensor& scales_in, const Tensor& out) {
  const int64_t n = values_in.size(0), k = out.size(1);
  if (n == 0 || k == 0) return;
  KILN_CHECK(out.is_contiguous() && aligned16(out.data_ptr()), "dequantize(quantized): out must be contiguous and "
             "16-byte aligned, got ", out.meta());
  const Tensor values = kernel_values(values_in, f), scales = kernel_scales(scales_in);
  const Device dev = out.device();
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  const int64_t ldw = values.stride(0);
  const uint16_t* ws = super_blocks(f) ? nullptr : static_cast<const uint16_t*>(scales.data_ptr());
  const int64_t ldws = super_blocks(f) ? 0 : scales.stride(0);
  with_format(f, [&](auto fc) {
    constexpr int F = decltype(fc)::value;
    const int64_t total = n * kernels::q_chunks_per_row<F>(static_cast<int>(k));
    visit_dtypes<kActTypes>(out.dtype(), "dequantize(quantized)", [&](auto tag) {
      using T = typename decltype(tag)::type;
      kernels::dequantize_q_kernel<F, T><<<grid_for(total, 256, dev.index), 256, 0, stream>>>(
          static_cast<const uint8_t*>(values.data_ptr()), ldw, ws, ldws, n, static_cast<int>(k), out.data<T>());
      check_launch("dequantize(quantized)");
    });
  });
}

void linear_quantized(const Tensor& y, const Tensor& x2, QuantFormat f, const Tensor& values_in,
                      const Tensor& scales_in, const Tensor* bias) {
  const int64_t m = x2.size(0), k = x2.size(1), n = values_in.size(0);
  if (m == 0 || n == 0) return;
  KILN_CHECK(k <= INT_MAX / 2, "linear(quantized): K = ", k, " is too large");
  if (m > kQuantGemvRows || k == 0) {
    linear_sliced(y, x2, f, values_in, scales_in, bias);
    return;
  }
  const Tensor values = kernel_values(values_in, f), scales = kernel_scales(scales_in);
  const Device dev = y.device();
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  const Tensor x = x2.stride(1) == 1 ? x2 : x2.contiguous();
  const int64_t nb = k / kernels::kQBlock;
  // The activations' codes, scales and code sums (a few KB; fresh buffers, so 16-byte aligned).
  const QuantizedRows xr = quantize_rows(x, "linear(quantized)");
  const Tensor &xq = xr.q, &xd = xr.d, &xs = xr.s;
  Tensor bias_c;
  if (bias) bias_c = bias->contiguous();
  const bool dependent = constant_input(values) && constant_input(scales) && constant_input(bias_c);
  const int otype = out_type(y.dtype());
  with_format(f, [&](auto fc) {
    constexpr int F = decltype(fc)::value;
    for (int64_t m0 = 0; m0 < m; m0 += 8) {
      const int rows = static_cast<int>(std::min<int64_t>(8, m - m0));
      const int8_t* q = xq.data<int8_t>() + m0 * k;
      const float* d = xd.data<float>() + m0 * nb;
      const int* s = xs.data<int32_t>() + m0 * nb;
      char* yp = static_cast<char*>(y.data_ptr()) + m0 * n * static_cast<int64_t>(itemsize(y.dtype()));
      const void* bp = bias ? bias_c.data_ptr() : nullptr;
      const int ik = static_cast<int>(k);
      // A launch after the first reads x's codes written two kernels back: its wait covers them.
      switch (rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : 8) {
        case 1: launch_gemv<F, 1>(q, d, s, rows, ik, values, scales, bp, otype, yp, n, dependent, dev.index, stream, n); break;
        case 2: launch_gemv<F, 2>(q, d, s, rows, ik, values, scales, bp, otype, yp, n, dependent, dev.index, stream, n); break;
        case 4: launch_gemv<F, 4>(q, d, s, rows, ik, values, scales, bp, otype, yp, n, dependent, dev.index, stream, n); break;
        default: launch_gemv<F, 8>(q, d, s, rows, ik, values, scales, bp, otype, yp, n, dependent, dev.index, stream, n); break;
      }
    }
  });
}

Tensor moe_block_experts_one(const Tensor& x, const Tensor& weights, const Tensor& experts, const QuantStack& gate_up,
                             const QuantStack& down, int64_t num_experts) {
  const char* op = "moe_forward(block experts)";
  const int64_t H = x.size(1), k = experts.size(1), E = num_experts;
  const int64_t I2 = gate_up.values.size(0) / E, I = I2 / 2;
  KILN_CHECK(x.size(0) == 1 && E <= INT_MAX && k <= 65535 && H <= INT_MAX / 2 && I <= INT_MAX / 2, op,
             ": one token and int-sized shapes expected, got x ", x.meta(), " with ", E, " experts");
  const Device dev = x.device();
  DeviceGuard guard(dev);
  const cudaStream_t stream = stream_of(dev);
  const Tensor ids = experts.contiguous();
  // y [k, n] (otype) = the expert ids[g]'s rows of `w` times row g x gx of the quantised activations.
  auto grouped = [&](const QuantizedRows& xr, int64_t gx, const QuantStack& w, int64_t n, int64_t kk, DType out) {
    const Tensor values = kernel_values(w.values, w.format), scales = kernel_scales(w.scales);
    Tensor y = empty({k, n}, out, dev);
    kernels::QGroups grp;
    grp.ids = ids.data<const int32_t>();
    grp.num = static_cast<int>(E);
    grp.gw = n * values.stride(0);
    grp.gws = super_blocks(w.format) ? 0 : n * scales.stride(0);
    grp.gx = gx;
    grp.gy = n;
    with_format(w.format, [&](auto fc) {
      constexpr int F = decltype(fc)::value;
      launch_gemv<F, 1>(xr.q.data<int8_t>(), xr.d.data<float>(), xr.s.data<int32_t>(), 1, static_cast<int>(kk), values,
                        scales, nullptr, out_type(out), y.data_ptr(), n, true, dev.index, stream, n, grp,
                        static_cast<int>(k));
    });
    return y;
  };
  const Tensor x1 = x.stride(1) == 1 ? x : x.contiguous();
  const Tensor gu = grouped(quantize_rows(x1, op), 0, gate_up, I2, H, x.dtype());  // [k, 2I]
  const Tensor h = kiln::silu_and_mul(gu);                                         // [k, I]
  const Tensor y = grouped(quantize_rows(h, op), 1, down, H, I, DType::F32);       // [k, H] f32
  return kiln::matmul(weights.to(DType::F32).view({1, k}), y).to(x.dtype());
}

}  // namespace kiln::cuda
