// Reductions: sum, mean, prod, amax/amin, max/min (all elements, or along a dim with indices),
// argmax/argmin, all/any, var/std, norm, logsumexp. Argument checks, result dtypes (as PyTorch) and output
// allocation; the kernels are in src/cpu/reduce*.cpp and src/cuda/reduce*.cu (chosen by the input's device).
#include <cmath>
#include <string>

#include "cpu/reduce.h"
#include "kiln/ops.h"
#if KILN_HAVE_CUDA
#include "cuda/reduce.h"
#endif

namespace kiln {

namespace {

void check_input(const Tensor& x, const char* op) {
  KILN_CHECK(x.defined(), op, ": input tensor is undefined");
#if !KILN_HAVE_CUDA
  KILN_CHECK(!x.is_cuda(), op, ": no CUDA implementation yet (input ", x.meta(), ")");
#endif
}

// The kernel of x's device. Each backend's function has the same contract (src/cpu/reduce.h,
// src/cuda/reduce.h); in a build without CUDA no CUDA tensor reaches here (check_input).
using Mask = std::vector<bool>;
#if KILN_HAVE_CUDA
#define KILN_REDUCE_BACKEND(x, fn, ...) ((x).is_cuda() ? cuda::fn(__VA_ARGS__) : cpu::fn(__VA_ARGS__))
#else
#define KILN_REDUCE_BACKEND(x, fn, ...) cpu::fn(__VA_ARGS__)
#endif

std::string dims_str(const std::vector<int64_t>& dims) { return shape_str(dims); }

// Which dims of x a dim list reduces: empty = all; negative dims count from the end; a 0-d tensor
// accepts dim 0 and -1 (and reduces nothing but itself).
std::vector<bool> reduce_mask(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  const int64_t nd = x.dim();
  std::vector<bool> mask(static_cast<size_t>(nd), dims.empty());
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(nd, 1)), false);
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, nd, op);
    KILN_CHECK(!seen[static_cast<size_t>(w)], op, ": dim ", w, " appears multiple times in the list of dims ",
               dims_str(dims), " (input ", x.meta(), ")");
    seen[static_cast<size_t>(w)] = true;
    if (nd > 0) mask[static_cast<size_t>(w)] = true;
  }
  return mask;
}

Shape kept_shape(const Tensor& x, const std::vector<bool>& mask) {
  Shape s;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!mask[static_cast<size_t>(d)]) s.push_back(x.sizes()[static_cast<size_t>(d)]);
  return s;
}

// The output of a reduction is computed contiguous without the reduced dims; keepdim views it with them.
Tensor finish(const Tensor& out, const Tensor& x, const std::vector<bool>& mask, bool keepdim) {
  if (!keepdim) return out;
  Shape s = x.sizes();
  for (int64_t d = 0; d < x.dim(); ++d)
    if (mask[static_cast<size_t>(d)]) s[static_cast<size_t>(d)] = 1;
  return out.view(s);
}

// Ops without an identity (max, min, inf norms) cannot reduce an empty dim.
void check_nonempty(const Tensor& x, const std::vector<bool>& mask, bool dims_given, const char* op) {
  if (!dims_given) {
    KILN_CHECK(x.numel() != 0, op, "(): Expected reduction dim to be specified for input.numel() == 0. ",
               "Specify the reduction dim with the 'dim' argument (input ", x.meta(), ")");
    return;
  }
  for (int64_t d = 0; d < x.dim(); ++d)
    KILN_CHECK(!mask[static_cast<size_t>(d)] || x.sizes()[static_cast<size_t>(d)] != 0, op,
               "(): Expected reduction dim ", d, " to have non-zero size (input ", x.meta(),
               "): the operation has no identity");
}

// sum/prod of bool and integers accumulate in i64 (u64 stays u64); floats keep their dtype.
DType sum_kernel_dtype(DType t) {
  if (t == DType::U64) return DType::U64;
  if (is_integral(t, true)) return DType::I64;
  return t;
}

template <class Kernel>
Tensor sum_like(const Tensor& x_in, const std::vector<int64_t>& dims, bool keepdim, std::optional<DType> dtype,
                const char* op, Kernel kernel) {
  check_input(x_in, op);
  const std::vector<bool> mask = reduce_mask(x_in, dims, op);
  const Tensor x = dtype ? x_in.to(*dtype) : x_in;
  const DType kdt = sum_kernel_dtype(x.dtype());
  Tensor out = empty(kept_shape(x, mask), kdt, x.device());
  kernel(out, x, mask);
  // A narrower integer dtype= (sum(i32, dtype=i32)) wraps the i64 result, as PyTorch does.
  if (dtype && *dtype != kdt) out = out.to(*dtype);
  return finish(out, x, mask, keepdim);
}

void check_floating(const Tensor& x, const char* op, const char* what) {
  KILN_CHECK(is_floating(x.dtype()) && !is_float8(x.dtype()), op, ": ", what, " (got ", x.meta(),
             "); supported: float16, bfloat16, float32, float64");
}

Tensor extreme_all(const Tensor& x, const char* op, bool is_max) {
  check_input(x, op);
  const std::vector<bool> mask(static_cast<size_t>(x.dim()), true);
  check_nonempty(x, mask, false, op);
  Tensor out = empty({}, x.dtype(), x.device());
  if (is_max) KILN_REDUCE_BACKEND(x, amax_kernel, out, x, mask);
  else KILN_REDUCE_BACKEND(x, amin_kernel, out, x, mask);
  return out;
}

Tensor extreme_dims(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op,
                    bool is_max) {
  check_input(x, op);
  const std::vector<bool> mask = reduce_mask(x, dims, op);
  check_nonempty(x, mask, !dims.empty(), op);
  Tensor out = empty(kept_shape(x, mask), x.dtype(), x.device());
  if (is_max) KILN_REDUCE_BACKEND(x, amax_kernel, out, x, mask);
  else KILN_REDUCE_BACKEND(x, amin_kernel, out, x, mask);
  return finish(out, x, mask, keepdim);
}

std::pair<Tensor, Tensor> extreme_dim(const Tensor& x, int64_t dim, bool keepdim, const char* op, bool is_max,
                                      bool want_values) {
  check_input(x, op);
  const int64_t d = wrap_dim(dim, x.dim(), op);
  std::vector<bool> mask(static_cast<size_t>(x.dim()), false);
  if (x.dim() > 0) mask[static_cast<size_t>(d)] = true;
  check_nonempty(x, mask, true, op);
  const Shape s = kept_shape(x, mask);
  Tensor values = want_values ? empty(s, x.dtype(), x.device()) : Tensor();
  Tensor indices = empty(s, DType::I64, x.device());
  KILN_REDUCE_BACKEND(x, max_with_index_kernel, values, indices, x, d, is_max);
  return {want_values ? finish(values, x, mask, keepdim) : values, finish(indices, x, mask, keepdim)};
}

Tensor arg_extreme(const Tensor& x, std::optional<int64_t> dim, bool keepdim, const char* op, bool is_max) {
  check_input(x, op);
  KILN_CHECK(x.dtype() != DType::Bool, op, "(): does not support bool input (got ", x.meta(), ")");
  if (dim) return extreme_dim(x, *dim, keepdim, op, is_max, false).second;
  // Over all elements: the index is into the row-major flattening of x.
  KILN_CHECK(x.numel() != 0, op, "(): Expected reduction dim to be specified for input.numel() == 0 (input ",
             x.meta(), ")");
  const Tensor flat = x.contiguous().reshape({x.numel()});
  Tensor idx = extreme_dim(flat, 0, false, op, is_max, false).second;
  if (keepdim) idx = idx.view(Shape(static_cast<size_t>(x.dim()), 1));
  return idx;
}

Tensor logical(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op, bool is_all) {
  check_input(x, op);
  const std::vector<bool> mask = reduce_mask(x, dims, op);
  // PyTorch keeps uint8 for uint8 inputs (a legacy rule); every other dtype gives bool.
  Tensor out = empty(kept_shape(x, mask), x.dtype() == DType::U8 ? DType::U8 : DType::Bool, x.device());
  if (is_all) KILN_REDUCE_BACKEND(x, all_kernel, out, x, mask);
  else KILN_REDUCE_BACKEND(x, any_kernel, out, x, mask);
  return finish(out, x, mask, keepdim);
}

Tensor var_std(const Tensor& x, const std::vector<int64_t>& dims, double correction, bool keepdim, const char* op,
               bool take_sqrt) {
  check_input(x, op);
  check_floating(x, op, "std and var only support floating point dtypes");
  const std::vector<bool> mask = reduce_mask(x, dims, op);
  Tensor out = empty(kept_shape(x, mask), x.dtype(), x.device());
  KILN_REDUCE_BACKEND(x, var_kernel, out, x, mask, correction, take_sqrt);
  return finish(out, x, mask, keepdim);
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, std::optional<DType> dtype) {
  return sum_like(x, dims, keepdim, dtype, "sum", [](const Tensor& out, const Tensor& in, const Mask& mask) {
    KILN_REDUCE_BACKEND(in, sum_kernel, out, in, mask);
  });
}

Tensor prod(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, std::optional<DType> dtype) {
  return sum_like(x, dims, keepdim, dtype, "prod", [](const Tensor& out, const Tensor& in, const Mask& mask) {
    KILN_REDUCE_BACKEND(in, prod_kernel, out, in, mask);
  });
}

Tensor mean(const Tensor& x_in, const std::vector<int64_t>& dims, bool keepdim, std::optional<DType> dtype) {
  check_input(x_in, "mean");
  const DType t = dtype.value_or(x_in.dtype());
  KILN_CHECK(is_floating(t) || is_complex(t), "mean(): could not infer output dtype. ",
             dtype ? "Optional dtype" : "Input dtype", " must be either a floating point or complex dtype. Got: ",
             dtype_name(t), " (input ", x_in.meta(), "); pass dtype=float32 to average integers");
  const std::vector<bool> mask = reduce_mask(x_in, dims, "mean");
  const Tensor x = x_in.to(t);
  Tensor out = empty(kept_shape(x, mask), t, x.device());
  KILN_REDUCE_BACKEND(x, mean_kernel, out, x, mask);
  return finish(out, x, mask, keepdim);
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme_dims(x, dims, keepdim, "amax", true);
}
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme_dims(x, dims, keepdim, "amin", false);
}
Tensor max(const Tensor& x) { return extreme_all(x, "max", true); }
Tensor min(const Tensor& x) { return extreme_all(x, "min", false); }
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_dim(x, dim, keepdim, "max", true, true);
}
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_dim(x, dim, keepdim, "min", false, true);
}
Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_extreme(x, dim, keepdim, "argmax", true);
}
Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  return arg_extreme(x, dim, keepdim, "argmin", false);
}

Tensor all(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return logical(x, dims, keepdim, "all", true);
}
Tensor any(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return logical(x, dims, keepdim, "any", false);
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, double correction, bool keepdim) {
  return var_std(x, dims, correction, keepdim, "var", false);
}
Tensor std(const Tensor& x, const std::vector<int64_t>& dims, double correction, bool keepdim) {
  return var_std(x, dims, correction, keepdim, "std", true);
}

Tensor norm(const Tensor& x, double p, const std::vector<int64_t>& dims, bool keepdim) {
  check_input(x, "norm");
  check_floating(x, "norm", "expected a floating point tensor");
  const std::vector<bool> mask = reduce_mask(x, dims, "norm");
  // inf, -inf and negative p reduce with max/min-like ops that have no identity.
  if (p < 0 || std::isinf(p)) {
    for (int64_t d = 0; d < x.dim(); ++d)
      KILN_CHECK(!mask[static_cast<size_t>(d)] || x.sizes()[static_cast<size_t>(d)] != 0, "norm: cannot compute the ",
                 p, " norm over dim ", d, " of ", x.meta(), ": it is empty and the operation has no identity");
  }
  Tensor out = empty(kept_shape(x, mask), x.dtype(), x.device());
  KILN_REDUCE_BACKEND(x, norm_kernel, out, x, mask, p);
  return finish(out, x, mask, keepdim);
}

Tensor logsumexp(const Tensor& x_in, const std::vector<int64_t>& dims, bool keepdim) {
  check_input(x_in, "logsumexp");
  const std::vector<bool> mask = reduce_mask(x_in, dims, "logsumexp");
  // Integer and bool inputs compute in the default float dtype, as PyTorch does.
  KILN_CHECK(!is_complex(x_in.dtype()) && !is_float8(x_in.dtype()), "logsumexp: unsupported input ", x_in.meta(),
             "; supported: bool, integers, float16, bfloat16, float32, float64");
  const Tensor x = is_floating(x_in.dtype()) ? x_in : x_in.to(kDefaultFloat);
  Tensor out = empty(kept_shape(x, mask), x.dtype(), x.device());
  KILN_REDUCE_BACKEND(x, logsumexp_kernel, out, x, mask);
  return finish(out, x, mask, keepdim);
}

#undef KILN_REDUCE_BACKEND

}  // namespace kiln
