// bf16 products with many rows on the CPU through oneDNN's matmul (src/cpu/matmul.h, gemm_half): bf16 operands
// read in place, f32 accumulation and output, on the CPU's BF16 dot-product instructions (AVX-512 BF16, AMX)
// where it has them. Only in KILN_HAVE_DNNL builds.
#include <dnnl.hpp>
#include <string>

#include "cpu/dnnl_context.h"
#include "cpu/matmul.h"

namespace kiln::cpu {

namespace {

bool has_isa(dnnl::cpu_isa want) {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  return (isa & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
}

// Whether the CPU multiplies bf16 natively (avx512_core_bf16's bits are a subset of AMX's).
bool bf16_isa() {
  static const bool yes = has_isa(dnnl::cpu_isa::avx512_core_bf16);
  return yes;
}

// Whether oneDNN multiplies on AMX tiles here.
bool amx_isa() {
  static const bool yes = has_isa(dnnl::cpu_isa::avx512_core_amx);
  return yes;
}

}  // namespace

int64_t dnnl_gemm_half(const Tensor& c, const Tensor& a, const Tensor& b, float alpha, float beta) {
  if (!dnnl_enabled() || a.dtype() != DType::BF16 || !bf16_isa() || alpha != 1.f || (beta != 0.f && beta != 1.f))
    return 0;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const int64_t batch = c.size(0), n = c.size(1), k = a.size(2);
  // On AMX whole blocks of 64 columns only (src/cpu/matmul.h).
  const int64_t m = amx_isa() ? c.size(2) / 64 * 64 : c.size(2), ldc = c.size(2);
  if (k == 0 || m == 0) return 0;
  try {
    DnnlContext& ctx = dnnl_context();
    // a [B, n, k] with unit stride along k; b [B, k, m] with unit stride along k (a linear layer's transposed
    // weight), its batch stride 0 when one matrix serves every batch; c [B, n, m] contiguous.
    const int64_t bb = b.stride(0) == 0 ? 1 : batch;
    const dnnl::memory::desc ad(dims{batch, n, k}, dt::bf16, dims{a.stride(0), a.stride(1), 1});
    const dnnl::memory::desc bd(dims{bb, k, m}, dt::bf16, dims{bb == 1 ? m * b.stride(2) : b.stride(0), 1, b.stride(2)});
    const dnnl::memory::desc cd(dims{batch, n, m}, dt::f32, dims{n * ldc, ldc, 1});
    dnnl::primitive_attr attr;
    if (beta == 1.f) {
      dnnl::post_ops ops;
      ops.append_sum(1.f);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), attr, ctx.engine);
    // oneDNN's reference implementation is far slower than widening to f32 for sgemm.
    if (std::string(pd.impl_info_str()).find("ref") != std::string::npos) return 0;
    dnnl::memory am(ad, ctx.engine, const_cast<void*>(a.data_ptr()));
    dnnl::memory bm(bd, ctx.engine, const_cast<void*>(b.data_ptr()));
    dnnl::memory cm(cd, ctx.engine, c.data_ptr());
    dnnl::matmul(pd).execute(ctx.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    ctx.stream.wait();
    return m;
  } catch (const dnnl::error&) {
    return 0;  // no implementation for these shapes or strides: the caller's own path
  }
}

std::string dnnl_gemm_half_description() {
  if (!dnnl_enabled()) return "weights widened to f32 for BLAS above 16 rows (KILN_DNNL=0)";
  if (!bf16_isa()) return "weights widened to f32 for BLAS above 16 rows (this CPU has no BF16 dot products)";
  if (amx_isa()) return "oneDNN matmul above 16 rows (AMX; weight rows past a multiple of 64: kiln's tiles)";
  return "oneDNN matmul above 16 rows (BF16 dot products)";
}

}  // namespace kiln::cpu
