// Launchers of the one-launch inverse, determinant and solve for small row-major matrices (src/cuda/solver.h;
// device code in src/cuda/kernels/linalg_small.cuh).
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/linalg_small.cuh"
#include "cuda/launch.h"
#include "cuda/solver.h"

namespace kiln::cuda {

namespace {

using kernels::cfloat;
using kernels::TinyOp;

// The one place where the dtype and n become template arguments: f(T{}, N) with N 1..4 as an integral_constant.
template <class F>
void visit_tiny(DType t, int64_t n, const char* op, F&& f) {
  auto with_n = [&](auto tag) {
    switch (n) {
      case 1: return f(tag, std::integral_constant<int, 1>{});
      case 2: return f(tag, std::integral_constant<int, 2>{});
      case 3: return f(tag, std::integral_constant<int, 3>{});
      case 4: return f(tag, std::integral_constant<int, 4>{});
      default: throw Error(str(op, ": internal error: no one-thread kernel for n = ", n));
    }
  };
  switch (t) {
    case DType::F32: return with_n(float{});
    case DType::F64: return with_n(double{});
    case DType::C64: return with_n(cfloat{});
    default: throw Error(str(op, ": internal error: unexpected dtype ", dtype_name(t)));
  }
}

// One launch of tiny_lu_kernel over a's batch; b and info may be undefined where `op` does not use them.
void launch_tiny(const Tensor& a, const Tensor* b, Tensor& out, Tensor* info, TinyOp op, const char* name) {
  const int64_t batch = a.size(0), n = a.size(1);
  if (batch == 0) return;
  DeviceGuard guard(a.device());
  constexpr int64_t per_block = 32 * kernels::kTinyWarps;
  const int64_t blocks = (batch + per_block - 1) / per_block;
  KILN_CHECK(blocks <= INT32_MAX, name, ": a batch of ", batch, " matrices is more than one launch takes");
  visit_tiny(a.dtype(), n, name, [&](auto tag, auto N) {
    using T = decltype(tag);
    kernels::tiny_lu_kernel<T, decltype(N)::value><<<static_cast<unsigned>(blocks), 32 * kernels::kTinyWarps, 0,
                                          stream_of(a.device())>>>(
        static_cast<const T*>(a.data_ptr()), b ? static_cast<const T*>(b->data_ptr()) : nullptr,
        static_cast<T*>(out.data_ptr()), info ? info->data<int32_t>() : nullptr, batch, op);
  });
  check_launch(name);
}

// ceil(2^32 / d) for kernels::small_div.
uint32_t div_magic(int64_t d) { return static_cast<uint32_t>(((uint64_t{1} << 32) + static_cast<uint64_t>(d) - 1) / d); }

template <class T, int G>
void launch_gauss_jordan(const Tensor& a, Tensor& out, Tensor& info) {
  const int64_t batch = a.size(0), n = a.size(1);
  constexpr int rows = kernels::kGjRows<T>, per_warp = 32 / (G / rows);
  constexpr int64_t per_block = int64_t{per_warp} * kernels::kGjWarps;
  const int64_t blocks = (batch + per_block - 1) / per_block;
  KILN_CHECK(blocks <= INT32_MAX, "linalg.inv: a batch of ", batch, " matrices is more than one launch takes");
  auto kernel = &kernels::gauss_jordan_kernel<T, G>;
  auto smem = [](int64_t m) { return sizeof(T) * kernels::kGjWarps * 32 * (rows * m + 1); };
  // The attribute is set once per kernel: to what its largest n (G) needs.
  set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), smem(G), a.device().index, "linalg.inv");
  kernel<<<static_cast<unsigned>(blocks), 32 * kernels::kGjWarps, smem(n), stream_of(a.device())>>>(
      static_cast<const T*>(a.data_ptr()), static_cast<T*>(out.data_ptr()), info.data<int32_t>(), static_cast<int>(n),
      div_magic(n), div_magic(n * n), batch);
}

}  // namespace

bool fused_inverse_fits(DType t, int64_t n) {
  if (n < 1) return false;
  if (t == DType::C64) return n <= kTinyN;
  return (t == DType::F32 || t == DType::F64) && n <= kFusedInvN;
}

void inverse_fused(const Tensor& a, Tensor& out, Tensor& info) {
  const int64_t batch = a.size(0), n = a.size(1);
  KILN_CHECK(a.is_contiguous() && out.is_contiguous() && fused_inverse_fits(a.dtype(), n),
             "linalg.inv: internal error: the fused kernels take contiguous [B, n, n] with n <= ", kFusedInvN,
             ", got ", a.meta());
  if (batch == 0) return;
  if (n <= kTinyN) return launch_tiny(a, nullptr, out, &info, TinyOp::kInverse, "linalg.inv");
  DeviceGuard guard(a.device());
  if (a.dtype() == DType::F32) {
    if (n <= 8) launch_gauss_jordan<float, 8>(a, out, info);
    else launch_gauss_jordan<float, 16>(a, out, info);
  } else {
    if (n <= 8) launch_gauss_jordan<double, 8>(a, out, info);
    else launch_gauss_jordan<double, 16>(a, out, info);
  }
  check_launch("linalg.inv");
}

void det_tiny(const Tensor& a, Tensor& det) {
  KILN_CHECK(a.is_contiguous() && a.size(1) >= 1 && a.size(1) <= kTinyN, "linalg.det: internal error: got ", a.meta());
  launch_tiny(a, nullptr, det, nullptr, TinyOp::kDet, "linalg.det");
}

void solve_tiny(const Tensor& a, const Tensor& b, Tensor& x, Tensor& info) {
  KILN_CHECK(a.is_contiguous() && b.is_contiguous() && a.size(1) >= 1 && a.size(1) <= kTinyN,
             "linalg.solve: internal error: got ", a.meta(), " and ", b.meta());
  launch_tiny(a, &b, x, &info, TinyOp::kSolve, "linalg.solve");
}

}  // namespace kiln::cuda
