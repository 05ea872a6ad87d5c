// Matrix products: mm, bmm, matmul (numpy semantics), addmm. Shapes and dtypes are checked here and every
// product is brought to one batched form [B, n, k] x [B, k, m] for the CPU kernel (src/cpu/matmul.cpp).
#include <atomic>

#include "core/dispatch.h"
#include "cpu/matmul.h"
#include "kiln/cuda_options.h"
#include "kiln/ops.h"
#if KILN_HAVE_CUDA
#include "cuda/matmul.h"
#endif

namespace kiln {

namespace {
std::atomic<bool> g_allow_tf32{false};
}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

namespace {

constexpr DTypeSet kMatmulTypes = kFloatTypes | kComplexTypes | kIntTypes;

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.defined() && b.defined(), op, ": undefined operand");
  KILN_CHECK(a.device() == b.device(), op, ": operands must be on one device, got ", a.meta(), " and ", b.meta());
  KILN_CHECK(a.dtype() == b.dtype(), op, ": expected m1 and m2 to have the same dtype, but got ", a.meta(),
             " and ", b.meta());
  KILN_CHECK((kMatmulTypes & dset(a.dtype())) != 0, op, ": dtype ", dtype_name(a.dtype()),
             " is not supported (supported: ", dtype_set_str(kMatmulTypes), ")");
#if KILN_HAVE_CUDA
  // cuBLAS has no integer GEMM (and PyTorch's CUDA backend refuses integer matmul too).
  KILN_CHECK(a.is_cpu() || !is_integral(a.dtype(), true), op, ": integer matmul is CPU-only (got ", a.meta(),
             " and ", b.meta(), "); on CUDA use a floating dtype (f16, bf16, f32, f64) or c64");
#else
  KILN_CHECK(a.is_cpu(), op, ": no CUDA implementation yet (got ", a.meta(), ")");
#endif
}

// A [B, r, c] operand in f32 for sgemm. The transpose of a contiguous tensor (linear's weight.t()) is widened
// in its own memory order and transposed back (BLAS reads either layout): Tensor::to would write it out in the
// logical order, a transposing copy that cost 70 ms for a 4096 x 4096 bf16 weight on a 2-core machine.
Tensor widen_to_f32(const Tensor& x) {
  const Tensor xt = x.transpose(1, 2);
  if (!x.is_contiguous() && xt.is_contiguous()) return xt.to(DType::F32).transpose(1, 2);
  return x.to(DType::F32);
}

// beta * input + alpha * a @ b over batches: a [B, n, k], b [B, k, m], input broadcastable to [B, n, m]
// (or undefined). Half types compute in f32 and round once at the end.
Tensor batched(const Tensor& a, const Tensor& b, const Tensor& input, const Scalar& beta, const Scalar& alpha) {
#if KILN_HAVE_CUDA
  if (a.is_cuda()) return cuda::gemm(a, b, input, beta, alpha);  // half types natively, f32 accumulation
#endif
  const DType t = a.dtype();
  if (t == DType::F16 || t == DType::BF16) {
    const bool use_input = input.defined() && beta.to_double() != 0.0;
    if (cpu::gemm_half_takes(a, b)) {
      // A linear layer's layout: b read in its own dtype (a few rows) or widened a slice at a time.
      // With beta 0 gemm_half writes c without reading it (as BLAS): no zero fill first.
      Tensor c = empty({a.size(0), a.size(1), b.size(2)}, DType::F32);
      if (use_input) c.copy_(input);
      const float beta32 = use_input ? static_cast<float>(beta.to_double()) : 0.f;
      cpu::gemm_half(c, a, b, static_cast<float>(alpha.to_double()), beta32);
      return c.to(t);
    }
    Tensor in32 = input.defined() ? input.to(DType::F32) : input;
    return batched(widen_to_f32(a), widen_to_f32(b), in32, beta, alpha).to(t);
  }
  const Shape shape{a.size(0), a.size(1), b.size(2)};
  Tensor c = empty(shape, t);
  const bool use_input = input.defined() && !(beta.to_double() == 0.0 && beta.to_complex().im == 0.f);
  if (c.numel() == 0) return c;
  if (use_input) c.copy_(input);
  else c.zero_();
  cpu::gemm(c, a, b, alpha, use_input ? beta : Scalar(0));
  return c;
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  check_operands("mm", a, b);
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-d operands, got ", a.meta(), " and ", b.meta());
  KILN_CHECK(a.size(1) == b.size(0), "mm: shapes ", a.sizes(), " and ", b.sizes(), " cannot be multiplied (",
             a.size(1), " != ", b.size(0), ")");
  return batched(a.unsqueeze(0), b.unsqueeze(0), Tensor(), 0, 1).squeeze(0);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_operands("bmm", a, b);
  KILN_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-d operands, got ", a.meta(), " and ", b.meta());
  KILN_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "bmm: shapes ", a.sizes(), " and ", b.sizes(),
             " cannot be multiplied (expected [B, n, k] and [B, k, m])");
  return batched(a, b, Tensor(), 0, 1);
}

Tensor addmm(const Tensor& input, const Tensor& a, const Tensor& b, const Scalar& beta, const Scalar& alpha) {
  check_operands("addmm", a, b);
  KILN_CHECK(input.defined() && input.device() == a.device(), "addmm: input must be on the operands' device, got ",
             input.meta(), " and ", a.meta());
  KILN_CHECK(input.dtype() == a.dtype(), "addmm: expected input and m1 to have the same dtype, but got ",
             input.meta(), " and ", a.meta());
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "addmm: expected 2-d operands, got ", a.meta(), " and ", b.meta());
  KILN_CHECK(a.size(1) == b.size(0), "addmm: shapes ", a.sizes(), " and ", b.sizes(), " cannot be multiplied (",
             a.size(1), " != ", b.size(0), ")");
  const Shape nm{a.size(0), b.size(1)};
  bool fits = input.dim() <= 2;
  for (int64_t d = 0; fits && d < input.dim(); ++d) {
    const int64_t s = input.size(d);
    fits = s == 1 || s == nm[2 - input.dim() + d];
  }
  KILN_CHECK(fits, "addmm: input ", input.meta(), " cannot broadcast to the product's shape ", nm, " (a ",
             a.sizes(), ", b ", b.sizes(), ")");
  if (is_integral(a.dtype(), true))
    KILN_CHECK(beta.is_integral() && alpha.is_integral(), "addmm: integer operands need integer beta and alpha, got ",
               beta.str(), " and ", alpha.str());
  Tensor in3 = input.expand(nm).unsqueeze(0);
  return batched(a.unsqueeze(0), b.unsqueeze(0), in3, beta, alpha).squeeze(0);
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_operands("matmul", a, b);
  KILN_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dim, got ", a.meta(), " and ",
             b.meta());
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  KILN_CHECK(ka == kb, "matmul: shapes ", a.sizes(), " and ", b.sizes(), " cannot be multiplied (", ka, " != ", kb,
             ")");
  if (a.dim() == 1 && b.dim() == 1) return mm(a.unsqueeze(0), b.unsqueeze(1)).reshape({});
  // 1-d operands become matrices and their added dim is removed from the result.
  const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const int64_t n = a2.size(-2), k = a2.size(-1), m = b2.size(-1);
  Shape batch_a(a2.sizes().begin(), a2.sizes().end() - 2), batch_b(b2.sizes().begin(), b2.sizes().end() - 2);
  Shape batch;
  try {
    batch = broadcast_shapes(batch_a, batch_b);
  } catch (const Error& e) {
    throw Error(str("matmul: the batch dims of ", a.sizes(), " and ", b.sizes(), " do not broadcast: ", e.what()));
  }
  Shape out_shape = batch;
  if (a.dim() > 1) out_shape.push_back(n);
  if (b.dim() > 1) out_shape.push_back(m);
#if KILN_HAVE_CUDA
  if (a.is_cuda()) {
    // The CUDA path takes the broadcast operands as they are (views) and itself folds, reads strided or
    // copies; Tensor::reshape could need a strided device copy the core does not have.
    Shape sa = batch, sb = batch;
    sa.insert(sa.end(), {n, k});
    sb.insert(sb.end(), {k, m});
    return cuda::gemm(a2.expand(sa), b2.expand(sb), Tensor(), 0, 1).reshape(out_shape);
  }
#endif
  Tensor c;
  if (batch_b.empty() && !batch_a.empty()) {
    // [..., n, k] x [k, m]: fold a's batch dims into its rows (a view when a's layout allows), one product.
    c = batched(a2.reshape({checked_numel(batch_a) * n, k}).unsqueeze(0), b2.unsqueeze(0), Tensor(), 0, 1);
  } else {
    const int64_t B = checked_numel(batch);
    Shape sa = batch, sb = batch;
    sa.insert(sa.end(), {n, k});
    sb.insert(sb.end(), {k, m});
    // Broadcast batch dims that cannot be folded into one without a copy are materialised by reshape.
    c = batched(a2.expand(sa).reshape({B, n, k}), b2.expand(sb).reshape({B, k, m}), Tensor(), 0, 1);
  }
  return c.reshape(out_shape);
}

}  // namespace kiln
