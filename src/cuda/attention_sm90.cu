// Launcher of the Hopper flash prefill kernel (kernels/flash_attention_sm90.cuh). The kernel exists only in
// sm_90a code: KILN_HAVE_SM90A is defined when CMAKE_CUDA_ARCHITECTURES lists 90a (src/CMakeLists.txt), and
// the device must have compute capability 9.0.
#include "cuda/attention_sm90.h"

#include <cmath>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

#include "cuda/attention.h"
#include "cuda/kernels/flash_attention_sm90.cuh"
#include "cuda/launch.h"

namespace kiln::cuda {
namespace {

namespace am = attention_math;

bool mult8(int64_t s) { return s % 8 == 0; }

void set_smem(const void* kernel, size_t bytes, int device) {
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.insert({kernel, device}).second) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        "scaled_dot_product_attention: cudaFuncSetAttribute");
}

}  // namespace

bool wgmma_prefill_available(int device) {
#if defined(KILN_HAVE_SM90A)
  static std::mutex mu;
  static std::set<std::pair<int, bool>> known;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [d, ok] : known)
    if (d == device) return ok;
  int major = 0, minor = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
  const bool ok = major == 9 && minor == 0;
  known.insert({device, ok});
  return ok;
#else
  (void)device;
  return false;
#endif
}

bool launch_prefill_sm90(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const am::Layout& L,
                         double scale, cudaStream_t stream) {
  const int dev = out.device().index;
  if (prefill_kernel() == PrefillKernel::Mma || !wgmma_prefill_available(dev)) return false;
  if (L.mask != am::MaskKind::None || L.has_lengths) return false;
  // The kernel takes the row max of the unscaled scores (kernels/flash_attention_sm90.cuh): scale > 0.
  if (!(scale > 0.0) || !std::isfinite(scale)) return false;
  // q rows go to shared memory with cp.async: contiguous channels, 8-element strides, an aligned base.
  if (L.q_col != 1 || !mult8(L.q_row) || reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 != 0) return false;
  if (L.heads > 1 && !mult8(L.hq)) return false;
  for (int i = 0; i < L.nbatch; ++i)
    if (!mult8(L.bq[i])) return false;
  (void)k;
  (void)v;
  attn::FlashParams p;
  p.out = static_cast<uint16_t*>(out.data_ptr());
  p.q = static_cast<const uint16_t*>(q.data_ptr());
  p.k = static_cast<const uint16_t*>(k.data_ptr());
  p.v = static_cast<const uint16_t*>(v.data_ptr());
  p.mask = nullptr;
  p.L = L;
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.q_tiles = (L.lq + attn::sm90::kBM - 1) / attn::sm90::kBM;
  const int64_t blocks = p.q_tiles * L.heads * L.outer;
  KILN_CHECK(blocks < (int64_t{1} << 31), "scaled_dot_product_attention: too many query tiles (", blocks, ")");
  auto go = [&](auto tag, auto d_const, auto causal_const) {
    using Tag = decltype(tag);
    constexpr int D = decltype(d_const)::value;
    constexpr bool C = decltype(causal_const)::value;
    const size_t smem = attn::sm90::smem_bytes(D);
    auto kernel = attn::sm90::flash_prefill_sm90_kernel<Tag, D, C>;
    set_smem(reinterpret_cast<const void*>(kernel), smem, dev);
    kernel<<<static_cast<unsigned>(blocks), attn::sm90::kThreads, smem, stream>>>(p);
  };
  auto with_d = [&](auto tag) {
    auto with_causal = [&](auto d_const) {
      if (L.causal) go(tag, d_const, std::true_type{});
      else go(tag, d_const, std::false_type{});
    };
    if (L.d == 64) with_causal(std::integral_constant<int, 64>{});
    else with_causal(std::integral_constant<int, 128>{});
  };
  if (q.dtype() == DType::BF16) with_d(attn::Bf16Tag{});
  else with_d(attn::F16Tag{});
  check_launch("scaled_dot_product_attention (flash prefill, sm_90a)");
  return true;
}

}  // namespace kiln::cuda
