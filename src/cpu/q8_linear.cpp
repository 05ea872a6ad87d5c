// linear(x, Q8Weight / Q4Weight) and their dequantisation on the CPU (src/cpu/q8_dot.h).
#include <algorithm>
#include <vector>

#include "core/dispatch.h"
#include "cpu/loops.h"
#include "cpu/q8_dot.h"

namespace kiln::cpu {

namespace {

void dequantize_rows(const int8_t* q, const uint16_t* d, int64_t rows, int64_t K, float* out) {
  const int64_t nb = K / kQ8Block;
#pragma omp parallel for schedule(static) if (rows * K >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      const float s = f16_bits_to_f32(d[r * nb + b]);
      for (int64_t i = 0; i < kQ8Block; ++i) out[r * K + b * kQ8Block + i] = s * q[r * K + b * kQ8Block + i];
    }
}

enum class Fmt { Q8, Q4, Q4K, Q5K, Q6K };

// Rows of super-blocks of 256 values (`bytes` each) to f32, unpack(row, K, out) a row at a time.
void dequantize_superblocks(const Tensor& out, const Tensor& blocks, int64_t bytes,
                            void (*unpack)(const uint8_t*, int64_t, float*)) {
  const int64_t rows = blocks.size(0), K = out.size(1), row_bytes = K / 256 * bytes;
  const uint8_t* q = blocks.data<const uint8_t>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static) if (rows * K >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) unpack(q + r * row_bytes, K, o + r * K);
}

// Q4: the weight rows are packed 4-bit codes (K / 2 bytes each); Q4K, Q6K: super-blocks of 256 in 144 or 210
// bytes (no separate scales).
template <class X, Fmt F>
void linear_q8_kernel(const Tensor& out, const Tensor& x, const Tensor& values, const Tensor& scales,
                      const Tensor* bias) {
  constexpr bool Q4 = F == Fmt::Q4;
  const int64_t M = x.size(0), K = x.size(1), N = values.size(0), nb = K / kQ8Block;
  const X* xp = x.data<const X>();
  const auto* wq = static_cast<const uint8_t*>(values.data_ptr());
  constexpr bool KQ = F == Fmt::Q4K || F == Fmt::Q5K;  // Q4_K's layout (scales and mins; Q5_K adds fifth bits)
  const int64_t row_bytes = F == Fmt::Q4K   ? K / kQ4KBlock * kQ4KBytes
                            : F == Fmt::Q5K ? K / kQ4KBlock * kQ5KBytes
                            : F == Fmt::Q6K ? K / kQ6KBlock * kQ6KBytes
                            : Q4            ? K / 2
                                            : K;
  const auto* wd = KQ || F == Fmt::Q6K ? nullptr : static_cast<const uint16_t*>(scales.data_ptr());
  X* op = out.data<X>();
  std::vector<float> bias_f;
  if (bias) {
    const Tensor b = bias->to(DType::F32).contiguous();
    bias_f.assign(b.data<const float>(), b.data<const float>() + N);
  }
  // x quantised row by row: codes, block scales, and the Q4_0 corrections, the Q4_K block sums or the Q6_K sums
  // per 16 values.
  std::vector<int8_t> xq(static_cast<size_t>(M * K));
  std::vector<float> xd(static_cast<size_t>(M * nb));
  std::vector<int32_t> xn(Q4 ? static_cast<size_t>(M * K / 4) : 0);
  std::vector<float> xs(KQ ? static_cast<size_t>(M * nb) : 0);
  std::vector<int16_t> xg(F == Fmt::Q6K ? static_cast<size_t>(M * K / 16) : 0);
#pragma omp parallel if (M * K >= kParallelGrain)
  {
    std::vector<float> xf(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t i = 0; i < K; ++i) xf[static_cast<size_t>(i)] = convert<float>(xp[m * K + i]);
      q8_quantize_row(xf.data(), K, xq.data() + m * K, xd.data() + m * nb);
      if constexpr (Q4) q4_row_corrections(xq.data() + m * K, K, xn.data() + m * (K / 4));
      if constexpr (KQ) q4k_row_sums(xq.data() + m * K, xd.data() + m * nb, K, xs.data() + m * nb);
      if constexpr (F == Fmt::Q6K) q6k_group_sums(xq.data() + m * K, K, xg.data() + m * (K / 16));
    }
  }
  // Tiles of up to 64 activation rows (their codes stay in the L2 cache) times chunks of 64 weight rows, the
  // chunks spread over the threads; within a chunk the kernel takes the activation rows 4 at a time.
  constexpr int64_t kChunk = 64, kRowTile = 64;
  for (int64_t t0 = 0; t0 < M; t0 += kRowTile) {
    const int64_t tm = std::min(kRowTile, M - t0);
#pragma omp parallel for schedule(static) if (tm * N * K >= kParallelGrain)
    for (int64_t n0 = 0; n0 < N; n0 += kChunk) {
      const int64_t nw = std::min(kChunk, N - n0);
      float acc[4 * kChunk];
      for (int64_t m0 = t0; m0 < t0 + tm; m0 += 4) {
        const int rows = static_cast<int>(std::min<int64_t>(4, t0 + tm - m0));
        if constexpr (F == Fmt::Q6K)
          q6k_dot_rows(xq.data() + m0 * K, K, xd.data() + m0 * nb, xg.data() + m0 * (K / 16), nb, rows,
                       wq + n0 * row_bytes, K / kQ6KBlock, nw, acc, kChunk);
        else if constexpr (F == Fmt::Q5K)
          q5k_dot_rows(xq.data() + m0 * K, K, xd.data() + m0 * nb, xs.data() + m0 * nb, nb, rows, wq + n0 * row_bytes,
                       K / kQ4KBlock, nw, acc, kChunk);
        else if constexpr (F == Fmt::Q4K)
          q4k_dot_rows(xq.data() + m0 * K, K, xd.data() + m0 * nb, xs.data() + m0 * nb, nb, rows, wq + n0 * row_bytes,
                       K / kQ4KBlock, nw, acc, kChunk);
        else if constexpr (Q4)
          q4_dot_rows(xq.data() + m0 * K, K, xd.data() + m0 * nb, xn.data() + m0 * (K / 4), nb, rows,
                      wq + n0 * row_bytes, wd + n0 * nb, nb, nw, acc, kChunk);
        else
          q8_dot_rows(xq.data() + m0 * K, K, xd.data() + m0 * nb, nb, rows,
                      reinterpret_cast<const int8_t*>(wq) + n0 * row_bytes, wd + n0 * nb, nb, nw, acc, kChunk);
        for (int r = 0; r < rows; ++r) {
          X* o = op + (m0 + r) * N + n0;
          const float* a = acc + r * kChunk;
          if (bias)
            for (int64_t n = 0; n < nw; ++n) o[n] = convert<X>(a[n] + bias_f[static_cast<size_t>(n0 + n)]);
          else
            for (int64_t n = 0; n < nw; ++n) o[n] = convert<X>(a[n]);
        }
      }
    }
  }
}

}  // namespace

void linear_q8(const Tensor& out, const Tensor& x, const Tensor& values, const Tensor& scales, const Tensor* bias) {
  if (out.numel() == 0) return;
  const bool q4 = values.dtype() == DType::U8;
  visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(x.dtype(), "linear(q8_0)", [&](auto tag) {
    using X = typename decltype(tag)::type;
    if (q4) linear_q8_kernel<X, Fmt::Q4>(out, x, values, scales, bias);
    else linear_q8_kernel<X, Fmt::Q8>(out, x, values, scales, bias);
  });
}

namespace {
template <Fmt F>
void linear_superblocks(const Tensor& out, const Tensor& x, const Tensor& blocks, const Tensor* bias, const char* op) {
  if (out.numel() == 0) return;
  visit_dtypes<dset(DType::F32, DType::F16, DType::BF16)>(x.dtype(), op, [&](auto tag) {
    linear_q8_kernel<typename decltype(tag)::type, F>(out, x, blocks, Tensor(), bias);
  });
}
}  // namespace

void linear_q4k(const Tensor& out, const Tensor& x, const Tensor& blocks, const Tensor* bias) {
  linear_superblocks<Fmt::Q4K>(out, x, blocks, bias, "linear(q4_k)");
}
void linear_q5k(const Tensor& out, const Tensor& x, const Tensor& blocks, const Tensor* bias) {
  linear_superblocks<Fmt::Q5K>(out, x, blocks, bias, "linear(q5_k)");
}
void linear_q6k(const Tensor& out, const Tensor& x, const Tensor& blocks, const Tensor* bias) {
  linear_superblocks<Fmt::Q6K>(out, x, blocks, bias, "linear(q6_k)");
}

void dequantize_q4k(const Tensor& out, const Tensor& blocks) {
  dequantize_superblocks(out, blocks, kQ4KBytes, q4k_unpack_row);
}

void dequantize_q5k(const Tensor& out, const Tensor& blocks) {
  dequantize_superblocks(out, blocks, kQ5KBytes, q5k_unpack_row);
}

void dequantize_q6k(const Tensor& out, const Tensor& blocks) {
  dequantize_superblocks(out, blocks, kQ6KBytes, q6k_unpack_row);
}

void dequantize_q8(const Tensor& out, const Tensor& values, const Tensor& scales) {
  const auto* d = static_cast<const uint16_t*>(scales.data_ptr());
  const int64_t rows = values.size(0), K = out.size(1), nb = K / kQ8Block;
  if (values.dtype() == DType::U8) {
    const uint8_t* q = values.data<const uint8_t>();
    float* o = out.data<float>();
#pragma omp parallel for schedule(static) if (rows * K >= kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) q4_unpack_row(q + r * (K / 2), d + r * nb, K, o + r * K);
    return;
  }
  dequantize_rows(values.data<const int8_t>(), d, rows, K, out.data<float>());
}

}  // namespace kiln::cpu
