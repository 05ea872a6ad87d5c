// topk and sample: argument checks, output allocation, device choice. Definitions: ops/sampling_math.h.
#include <cmath>

#include "core/copy.h"
#include "cpu/sampling.h"
#include "kiln/nn.h"
#include "ops/generator_offset.h"

#if KILN_HAVE_CUDA
#include "cuda/launch.h"
#include "cuda/sampling.h"
#endif

namespace kiln {

std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k) {
  const bool supported = (is_floating(x.dtype()) || is_integral(x.dtype(), /*include_bool=*/false));
  KILN_CHECK(supported, "topk: dtype ", dtype_name(x.dtype()), " of input ", x.meta(),
             " is not supported; supported: floating and integer dtypes");
#if KILN_HAVE_CUDA
  KILN_CHECK(!x.is_cuda() || x.dtype() == DType::F32 || x.dtype() == DType::F16 || x.dtype() == DType::BF16,
             "topk: dtype ", dtype_name(x.dtype()), " of input ", x.meta(),
             " is not supported on CUDA; supported there: float32, float16, bfloat16");
#else
  KILN_CHECK(!x.is_cuda(), "topk: no CUDA implementation yet (input ", x.meta(), ")");
#endif
  // A 0-d tensor is one row of one element, as in PyTorch.
  const int64_t n = x.dim() == 0 ? 1 : x.size(-1);
  KILN_CHECK(k >= 1 && k <= 64 && k <= n, "topk: k must satisfy 1 <= k <= 64 and k <= the last dim's size (",
             n, "), got k=", k, " for input ", x.meta());
  Shape out_shape = x.sizes();
  if (!out_shape.empty()) out_shape.back() = k;
  Tensor values = empty(out_shape, x.dtype(), x.device());
  Tensor indices = empty(out_shape, DType::I64, x.device());
  if (values.numel() == 0) return {values, indices};
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    cuda::topk(x.contiguous(), n, k, values, indices);
    return {values, indices};
  }
#endif
  cpu::topk(x.contiguous(), n, k, values, indices);
  return {values, indices};
}

namespace {
void check_sample_args(const Tensor& logits, const SamplingParams& params) {
  const DType dt = logits.dtype();
  KILN_CHECK(dt == DType::F32 || dt == DType::F16 || dt == DType::BF16, "sample: logits ", logits.meta(),
             " must be float32, float16 or bfloat16");
  KILN_CHECK(logits.dim() == 1 || logits.dim() == 2, "sample: logits ", logits.meta(),
             " must be [V] or [B, V]");
  const int64_t vocab = logits.size(-1);
  KILN_CHECK(vocab >= 1, "sample: logits ", logits.meta(), " must have a vocabulary of at least one token");
  // Written as negations so that NaN parameters fail too.
  KILN_CHECK(std::isfinite(params.temperature) && params.temperature >= 0.0,
             "sample: temperature must be finite and >= 0 (0 = greedy), got ", params.temperature);
  KILN_CHECK(params.top_k >= 0, "sample: top_k must be >= 0 (0 = off), got ", params.top_k);
  KILN_CHECK(params.top_p > 0.0 && params.top_p <= 1.0, "sample: top_p must be in (0, 1] (1 = off), got ",
             params.top_p);
  KILN_CHECK(params.min_p >= 0.0 && params.min_p <= 1.0, "sample: min_p must be in [0, 1] (0 = off), got ",
             params.min_p);
#if !KILN_HAVE_CUDA
  KILN_CHECK(!logits.is_cuda(), "sample: no CUDA implementation yet (input ", logits.meta(), ")");
#endif
}

// offset_counter: a device i64 the kernels read and increment (CUDA only), else null.
Tensor run_sample(const Tensor& logits, const SamplingParams& params, uint64_t seed, uint64_t offset,
                  int64_t* offset_counter) {
  const int64_t vocab = logits.size(-1);
  const Shape out_shape = logits.dim() == 2 ? Shape{logits.size(0)} : Shape{};
  Tensor out = empty(out_shape, DType::I64, logits.device());
#if KILN_HAVE_CUDA
  if (logits.is_cuda()) {
    // No numel() == 0 shortcut here: the device counter advances once per call, as the host offset does.
    cuda::sample(logits.contiguous(), vocab, params, seed, offset, offset_counter, out);
    return out;
  }
#endif
  if (out.numel() > 0) cpu::sample(logits.contiguous(), vocab, params, seed, offset, out);
  return out;
}
}  // namespace

Tensor sample(const Tensor& logits, const SamplingParams& params, Generator* gen) {
  check_sample_args(logits, params);
  // One offset per call, greedy included, so that the stream does not depend on the parameters.
  const auto [seed, offset] = take_generator_offset(gen);
  return run_sample(logits, params, seed, offset, nullptr);
}

Tensor sample(const Tensor& logits, const SamplingParams& params, uint64_t seed, const Tensor& offset) {
  check_sample_args(logits, params);
  KILN_CHECK(offset.dtype() == DType::I64 && offset.numel() == 1 && offset.device() == logits.device(),
             "sample: the offset counter ", offset.meta(), " must be one int64 on the logits' device (logits ",
             logits.meta(), ")");
  note_write(offset);
#if KILN_HAVE_CUDA
  if (logits.is_cuda()) return run_sample(logits, params, seed, 0, static_cast<int64_t*>(offset.data_ptr()));
#endif
  int64_t* counter = static_cast<int64_t*>(offset.data_ptr());
  const uint64_t o = static_cast<uint64_t>(*counter);
  *counter += 1;
  return run_sample(logits, params, seed, o, nullptr);
}

Tensor sampling_probs(const Tensor& logits, const SamplingParams& params) {
  check_sample_args(logits, params);
  const Tensor host = logits.to(kCPU).contiguous();
  Tensor out = empty(logits.sizes(), DType::F32, kCPU);
  cpu::sampling_probs(host, logits.size(-1), params, out);
  return logits.is_cuda() ? out.to(logits.device()) : out;
}

}  // namespace kiln
