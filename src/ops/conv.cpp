// Convolution, pooling and resampling (kiln/nn.h). On CUDA a convolution goes to cuDNN (src/cuda/conv.h) where
// it is present and takes the case; otherwise, and on the CPU, all of these are composed from kiln's ops so that
// every backend runs them: a convolution is a strided view of the padded input's windows (no copy), gathered once into rows
// (im2col) and multiplied by the weight with one (batched, per group) matrix product; transposed
// convolutions are convolutions of the zero-interleaved input with the flipped, transposed weight; pools
// reduce the same window view; interpolation gathers along one spatial dim at a time.
#include <cmath>
#include <cstdlib>
#include <limits>

#include "kiln/nn.h"
#if KILN_HAVE_CUDNN
#include "cuda/conv.h"
#endif
#if KILN_HAVE_DNNL
#include "cpu/conv.h"
#include "cpu/dnnl_context.h"
#endif

namespace kiln {

namespace {

int64_t prod(const Shape& s) {
  int64_t p = 1;
  for (int64_t v : s) p *= v;
  return p;
}

// One value per spatial dim: a single value repeats, otherwise the count must match.
Shape expand_arg(const Shape& v, int64_t nsp, const char* what, const char* op) {
  if (v.size() == 1) return Shape(static_cast<size_t>(nsp), v[0]);
  KILN_CHECK(static_cast<int64_t>(v.size()) == nsp, op, ": ", what, " needs 1 or ", nsp, " values, got ", v.size());
  return v;
}

// The windows of x [N, C, *S] (any strides) for kernel k, stride s, dilation d: a view [N, C, *O, *K].
Tensor windows(const Tensor& x, const Shape& k, const Shape& s, const Shape& d, const char* op) {
  const int64_t nsp = static_cast<int64_t>(k.size());
  Shape sizes = {x.size(0), x.size(1)}, strides = {x.stride(0), x.stride(1)};
  for (int64_t i = 0; i < nsp; ++i) {
    const int64_t in = x.size(2 + i), span = d[i] * (k[i] - 1) + 1;
    KILN_CHECK(in >= span, op, ": the kernel (", k[i], ", dilation ", d[i], ") spans ", span,
               " but the padded input has ", in, " in spatial dim ", i);
    sizes.push_back((in - span) / s[i] + 1);
    strides.push_back(x.stride(2 + i) * s[i]);
  }
  for (int64_t i = 0; i < nsp; ++i) {
    sizes.push_back(k[i]);
    strides.push_back(x.stride(2 + i) * d[i]);
  }
  return x.as_strided(sizes, strides, x.storage_offset());
}

// torch's pad list (last dim first) for symmetric (left, right) pads per spatial dim.
std::vector<int64_t> pad_list(const Shape& left, const Shape& right) {
  std::vector<int64_t> p;
  for (int64_t i = static_cast<int64_t>(left.size()) - 1; i >= 0; --i) {
    p.push_back(left[i]);
    p.push_back(right[i]);
  }
  return p;
}

bool any_nonzero(const std::vector<int64_t>& v) {
  for (int64_t x : v)
    if (x) return true;
  return false;
}

// Unbatched input [C, *S] gains a batch dim of 1 (and loses it again on the way out).
bool batched(const Tensor& x, int64_t nsp, const char* op) {
  KILN_CHECK(x.dim() == nsp + 2 || x.dim() == nsp + 1, op, ": expected [N, C, ", nsp, " spatial dims] or [C, ", nsp,
             " spatial dims], got ", x.meta());
  return x.dim() == nsp + 2;
}

void check_conv_dtype(const Tensor& x, const Tensor& w, const char* op) {
  const DType t = x.dtype();
  KILN_CHECK(t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64, op,
             ": expected float32, float16, bfloat16 or float64 input, got ", x.meta());
  KILN_CHECK(w.dtype() == t, op, ": the weight ", w.meta(), " must have the input's dtype ", dtype_name(t));
  KILN_CHECK(w.device() == x.device(), op, ": the weight ", w.meta(), " and the input ", x.meta(), " must be on one device");
}

// The reversed order of a dim: index_select with N-1 ... 0.
Tensor flip(const Tensor& x, int64_t dim) {
  const int64_t n = x.size(dim);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[i] = n - 1 - i;
  return index_select(x, dim, from_vector(idx, std::nullopt, x.device()));
}

}  // namespace

Tensor conv(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias, const Shape& stride_arg,
            const ConvPadding& padding_arg, const Shape& dilation_arg, int64_t groups) {
  const int64_t nsp = weight.dim() - 2;
  const std::string opname = str("conv", nsp, "d");
  const char* op = opname.c_str();
  KILN_CHECK(nsp >= 1 && nsp <= 3, "conv: the weight must be [C_out, C_in / groups, k...] with 1 to 3 kernel dims, got ",
             weight.meta());
  const bool has_batch = batched(input, nsp, op);
  const Tensor x = has_batch ? input : input.unsqueeze(0);
  check_conv_dtype(x, weight, op);
  const int64_t n = x.size(0), c = x.size(1), cout = weight.size(0);
  KILN_CHECK(groups >= 1 && c % groups == 0 && cout % groups == 0, op, ": groups (", groups,
             ") must divide the input channels (", c, ") and the output channels (", cout, ")");
  KILN_CHECK(weight.size(1) * groups == c, op, ": the weight ", weight.meta(), " expects ", weight.size(1) * groups,
             " input channels (with groups = ", groups, "), the input ", x.meta(), " has ", c);
  if (bias) KILN_CHECK(bias->dim() == 1 && bias->size(0) == cout, op, ": bias must be [", cout, "], got ", bias->meta());
  const Shape k(weight.sizes().begin() + 2, weight.sizes().end());
  const Shape s = expand_arg(stride_arg, nsp, "stride", op), d = expand_arg(dilation_arg, nsp, "dilation", op);
  for (int64_t i = 0; i < nsp; ++i) KILN_CHECK(s[i] > 0 && d[i] > 0, op, ": stride and dilation must be positive");
  Shape left, right;
  if (const auto* mode = std::get_if<std::string>(&padding_arg)) {
    KILN_CHECK(*mode == "same" || *mode == "valid", op, ": padding must be ints, 'same' or 'valid', got '", *mode, "'");
    for (int64_t i = 0; i < nsp; ++i) {
      if (*mode == "valid") {
        left.push_back(0);
        right.push_back(0);
      } else {
        KILN_CHECK(s[i] == 1, op, ": padding='same' needs stride 1 (as in torch)");
        const int64_t total = d[i] * (k[i] - 1);
        left.push_back(total / 2);
        right.push_back(total - total / 2);
      }
    }
  } else {
    left = right = expand_arg(std::get<Shape>(padding_arg), nsp, "padding", op);
    for (int64_t v : left) KILN_CHECK(v >= 0, op, ": padding must be >= 0");
  }
  const auto with_bias = [&](Tensor y) {
    if (bias) {
      Shape b(static_cast<size_t>(nsp + 2), 1);
      b[1] = cout;
      y = add(y, bias->reshape(b));
    }
    return has_batch ? y : y.squeeze(0);
  };
#if KILN_HAVE_CUDNN
  if (x.is_cuda()) {
    Shape out = {n, cout};
    for (int64_t i = 0; i < nsp; ++i) out.push_back((x.size(2 + i) + left[i] + right[i] - d[i] * (k[i] - 1) - 1) / s[i] + 1);
    bool fits = true;
    for (int64_t i = 0; i < nsp; ++i) fits = fits && x.size(2 + i) + left[i] + right[i] >= d[i] * (k[i] - 1) + 1;
    if (fits) {
      Tensor y = empty(out, x.dtype(), x.device());
      if (cuda::cudnn_conv_forward(x.contiguous(), weight.contiguous(), y, {s, d, left, right})) return with_bias(y);
    }
  }
#endif
#if KILN_HAVE_DNNL
  if (cpu::dnnl_enabled() && x.device().is_cpu()) {
    Shape out = {n, cout};
    bool fits = true;
    for (int64_t i = 0; i < nsp; ++i) {
      fits = fits && x.size(2 + i) + left[i] + right[i] >= d[i] * (k[i] - 1) + 1;
      out.push_back((x.size(2 + i) + left[i] + right[i] - d[i] * (k[i] - 1) - 1) / s[i] + 1);
    }
    if (fits) {
      Tensor y = empty(out, x.dtype(), x.device());
      const Tensor xc = x.contiguous(), wc = weight.contiguous();
      const std::optional<Tensor> bc = bias ? std::optional<Tensor>(bias->contiguous()) : std::nullopt;
      if (cpu::dnnl_conv(xc, wc, bc ? &*bc : nullptr, y, {s, d, left, right, groups})) return has_batch ? y : y.squeeze(0);
    }
  }
#endif
  const std::vector<int64_t> pads = pad_list(left, right);
  const Tensor xp = any_nonzero(pads) ? pad(x, pads) : x;
  const Tensor win = windows(xp, k, s, d, op);  // [N, C, *O, *K]
  const Shape out_sp(win.sizes().begin() + 2, win.sizes().begin() + 2 + nsp);
  const int64_t rows = n * prod(out_sp), cg = c / groups, kk = cg * prod(k), og = cout / groups;
  // im2col with the output positions innermost: [N, g, cg, *O, *K] -> [g, cg, *K, N, *O] -> [g, kk, rows]. The
  // copy then moves runs along the output's last dim (contiguous in the input for stride 1), not runs of the
  // kernel's width, and the product [g, og, kk] x [g, kk, rows] lands as [g, og, N, *O]: for one image
  // already the output's layout.
  Shape split = {n, groups, cg};
  split.insert(split.end(), win.sizes().begin() + 2, win.sizes().end());
  Shape order = {1, 2};
  for (int64_t i = 0; i < nsp; ++i) order.push_back(3 + nsp + i);
  order.push_back(0);
  for (int64_t i = 0; i < nsp; ++i) order.push_back(3 + i);
  const Tensor cols = win.reshape(split).permute(order).reshape({groups, kk, rows});
  const Tensor wmat = weight.reshape({groups, og, kk});  // [g, og, kk]
  Tensor y = bmm(wmat, cols);                            // [g, og, rows]
  // [g, og, N, *O] -> [N, g, og, *O] -> [N, C_out, *O]
  Shape ysplit = {groups, og, n};
  ysplit.insert(ysplit.end(), out_sp.begin(), out_sp.end());
  Shape yorder = {2, 0, 1};
  for (int64_t i = 0; i < nsp; ++i) yorder.push_back(3 + i);
  Shape out = {n, cout};
  out.insert(out.end(), out_sp.begin(), out_sp.end());
  y = y.reshape(ysplit).permute(yorder).reshape(out);
  return with_bias(bias ? y : y.contiguous());
}

Tensor conv_transpose(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias, const Shape& stride_arg,
                      const Shape& padding_arg, const Shape& output_padding_arg, int64_t groups, const Shape& dilation_arg) {
  const int64_t nsp = weight.dim() - 2;
  const std::string opname = str("conv_transpose", nsp, "d");
  const char* op = opname.c_str();
  KILN_CHECK(nsp >= 1 && nsp <= 3, "conv_transpose: the weight must be [C_in, C_out / groups, k...] with 1 to 3 kernel "
             "dims, got ", weight.meta());
  const bool has_batch = batched(input, nsp, op);
  const Tensor x = has_batch ? input : input.unsqueeze(0);
  check_conv_dtype(x, weight, op);
  const int64_t c = x.size(1);
  KILN_CHECK(groups >= 1 && c % groups == 0, op, ": groups (", groups, ") must divide the input channels (", c, ")");
  KILN_CHECK(weight.size(0) == c, op, ": the weight ", weight.meta(), " expects ", weight.size(0),
             " input channels, the input ", x.meta(), " has ", c);
  const Shape k(weight.sizes().begin() + 2, weight.sizes().end());
  const Shape s = expand_arg(stride_arg, nsp, "stride", op), p = expand_arg(padding_arg, nsp, "padding", op);
  const Shape op_pad = expand_arg(output_padding_arg, nsp, "output_padding", op);
  const Shape d = expand_arg(dilation_arg, nsp, "dilation", op);
  for (int64_t i = 0; i < nsp; ++i) {
    KILN_CHECK(s[i] > 0 && d[i] > 0 && p[i] >= 0, op, ": stride and dilation must be positive, padding >= 0");
    KILN_CHECK(op_pad[i] >= 0 && (op_pad[i] < s[i] || op_pad[i] < d[i]), op, ": output_padding (", op_pad[i],
               ") must be smaller than the stride or the dilation");
  }
  if (bias)
    KILN_CHECK(bias->dim() == 1 && bias->size(0) == groups * weight.size(1), op, ": bias must be [",
               groups * weight.size(1), "], got ", bias->meta());
#if KILN_HAVE_DNNL
  if (x.device().is_cpu() && cpu::dnnl_enabled()) {
    Shape out = {x.size(0), groups * weight.size(1)};
    bool fits = true;
    Shape after;
    for (int64_t i = 0; i < nsp; ++i) {
      out.push_back((x.size(2 + i) - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + op_pad[i] + 1);
      fits = fits && out.back() >= 1;
      after.push_back(p[i] - op_pad[i]);
    }
    if (fits) {
      Tensor y = empty(out, x.dtype(), x.device());
      const Tensor xc = x.contiguous(), wc = weight.contiguous();
      const std::optional<Tensor> bc = bias ? std::optional<Tensor>(bias->contiguous()) : std::nullopt;
      if (cpu::dnnl_conv_transpose(xc, wc, bc ? &*bc : nullptr, y, {s, d, p, after, groups})) return has_batch ? y : y.squeeze(0);
    }
  }
#endif
#if KILN_HAVE_CUDNN
  // cuDNN: the gradient of a forward convolution with respect to its input, whose shape carries output_padding.
  if (x.is_cuda()) {
    Shape out = {x.size(0), groups * weight.size(1)};
    bool fits = true;
    for (int64_t i = 0; i < nsp; ++i) {
      out.push_back((x.size(2 + i) - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + op_pad[i] + 1);
      fits = fits && out.back() >= 1;
    }
    if (fits) {
      Tensor y = empty(out, x.dtype(), x.device());
      if (cuda::cudnn_conv_transpose(x.contiguous(), weight.contiguous(), y, {s, d, p, p})) {
        if (bias) {
          Shape b(static_cast<size_t>(nsp + 2), 1);
          b[1] = out[1];
          y = add(y, bias->reshape(b));
        }
        return has_batch ? y : y.squeeze(0);
      }
    }
  }
#endif
  // The input with stride - 1 zeros between its elements.
  Tensor z = x;
  if (any_nonzero(Shape(s.begin(), s.end())) && prod(s) > 1) {
    Shape zs = {x.size(0), c};
    for (int64_t i = 0; i < nsp; ++i) zs.push_back((x.size(2 + i) - 1) * s[i] + 1);
    z = zeros(zs, x.dtype(), x.device());
    Tensor view = z;
    for (int64_t i = 0; i < nsp; ++i) view = view.slice(2 + i, 0, std::nullopt, s[i]);
    view.copy_(x);
  }
  // Pad by d (k - 1) - p on each side (output_padding more on the right); negative values crop.
  Shape left, right;
  for (int64_t i = 0; i < nsp; ++i) {
    left.push_back(d[i] * (k[i] - 1) - p[i]);
    right.push_back(d[i] * (k[i] - 1) - p[i] + op_pad[i]);
  }
  const std::vector<int64_t> pads = pad_list(left, right);
  const Tensor zp = any_nonzero(pads) ? pad(z, pads) : z;
  // The weight of the equivalent convolution: per group [C_in/g, C_out/g, *K] -> [C_out/g, C_in/g, *K], flipped.
  const int64_t cg = c / groups, og = weight.size(1);
  Shape wsplit = {groups, cg, og};
  wsplit.insert(wsplit.end(), k.begin(), k.end());
  Tensor w = weight.reshape(wsplit).transpose(1, 2);
  for (int64_t i = 0; i < nsp; ++i) w = flip(w, 3 + i);
  Shape wout = {groups * og, cg};
  wout.insert(wout.end(), k.begin(), k.end());
  w = w.contiguous().reshape(wout);
  Tensor y = conv(zp, w, bias, Shape{1}, Shape{0}, d, groups);
  return has_batch ? y : y.squeeze(0);
}

// ---- Pooling ---------------------------------------------------------------------------------------------------

namespace {
struct PoolArgs {
  Shape k, s, p, d;
};
PoolArgs pool_args(const Tensor& x, int64_t nsp, const Shape& kernel, const std::optional<Shape>& stride,
                   const Shape& padding, const Shape& dilation, const char* op) {
  PoolArgs a;
  a.k = expand_arg(kernel, nsp, "kernel_size", op);
  a.s = stride && !stride->empty() ? expand_arg(*stride, nsp, "stride", op) : a.k;
  a.p = expand_arg(padding, nsp, "padding", op);
  a.d = expand_arg(dilation, nsp, "dilation", op);
  for (int64_t i = 0; i < nsp; ++i) {
    KILN_CHECK(a.k[i] > 0 && a.s[i] > 0 && a.d[i] > 0, op, ": kernel_size, stride and dilation must be positive");
    KILN_CHECK(a.p[i] >= 0 && 2 * a.p[i] <= a.k[i], op, ": padding (", a.p[i], ") must be at most half the kernel (",
               a.k[i], ")");
  }
  KILN_CHECK(is_floating(x.dtype()) && !is_float8(x.dtype()), op, ": expected a floating-point input, got ", x.meta());
  return a;
}

std::vector<int64_t> last_dims(int64_t total, int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = total - n; i < total; ++i) d.push_back(i);
  return d;
}
}  // namespace

Tensor max_pool(const Tensor& input, int64_t nsp, const Shape& kernel, const std::optional<Shape>& stride,
                const Shape& padding, const Shape& dilation, bool ceil_mode) {
  const std::string opname = str("max_pool", nsp, "d");
  const char* op = opname.c_str();
  const bool has_batch = batched(input, nsp, op);
  const Tensor x = has_batch ? input : input.unsqueeze(0);
  const PoolArgs a = pool_args(x, nsp, kernel, stride, padding, dilation, op);
  Shape right = a.p;
  if (ceil_mode) {
    // Output size rounded up, the last window starting inside the input or its left padding (torch's rule).
    for (int64_t i = 0; i < nsp; ++i) {
      const int64_t in = x.size(2 + i), span = a.d[i] * (a.k[i] - 1) + 1;
      int64_t o = (in + 2 * a.p[i] - span + a.s[i] - 1) / a.s[i] + 1;
      if ((o - 1) * a.s[i] >= in + a.p[i]) --o;
      right[i] = std::max<int64_t>(a.p[i], (o - 1) * a.s[i] + span - in - a.p[i]);
    }
  }
  const double ninf = -std::numeric_limits<double>::infinity();
  const std::vector<int64_t> pads = pad_list(a.p, right);
  const Tensor xp = any_nonzero(pads) ? pad(x, pads, "constant", ninf) : x;
  const Tensor y = amax(windows(xp, a.k, a.s, a.d, op), last_dims(2 + 2 * nsp, nsp));
  return has_batch ? y : y.squeeze(0);
}

Tensor avg_pool(const Tensor& input, int64_t nsp, const Shape& kernel, const std::optional<Shape>& stride,
                const Shape& padding, bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor_override) {
  const std::string opname = str("avg_pool", nsp, "d");
  const char* op = opname.c_str();
  KILN_CHECK(!ceil_mode, op, ": ceil_mode=True is not supported (the divisor of the windows past the input differs)");
  const bool has_batch = batched(input, nsp, op);
  const Tensor x = has_batch ? input : input.unsqueeze(0);
  const PoolArgs a = pool_args(x, nsp, kernel, stride, padding, Shape{1}, op);
  if (divisor_override) KILN_CHECK(*divisor_override != 0, op, ": divisor_override must not be 0");
  const std::vector<int64_t> pads = pad_list(a.p, a.p);
  const bool half = x.dtype() == DType::F16 || x.dtype() == DType::BF16;
  const Tensor xf = half ? x.to(DType::F32) : x;
  const Tensor xp = any_nonzero(pads) ? pad(xf, pads) : xf;
  const auto kd = last_dims(2 + 2 * nsp, nsp);
  Tensor total = sum(windows(xp, a.k, a.s, a.d, op), kd);
  Tensor y;
  if (divisor_override) {
    y = div(total, Scalar(double(*divisor_override)));
  } else if (count_include_pad || !any_nonzero(pads)) {
    y = div(total, Scalar(double(prod(a.k))));
  } else {
    // The number of input (not padding) elements under each window.
    Shape one = {1, 1};
    one.insert(one.end(), x.sizes().begin() + 2, x.sizes().end());
    const Tensor ones_p = pad(ones(one, xf.dtype(), x.device()), pads);
    y = div(total, sum(windows(ones_p, a.k, a.s, a.d, op), kd));
  }
  y = y.to(x.dtype());
  return has_batch ? y : y.squeeze(0);
}

Tensor adaptive_avg_pool(const Tensor& input, const Shape& output_size) {
  const int64_t nsp = static_cast<int64_t>(output_size.size());
  const std::string opname = str("adaptive_avg_pool", nsp, "d");
  const char* op = opname.c_str();
  const bool has_batch = batched(input, nsp, op);
  Tensor y = has_batch ? input : input.unsqueeze(0);
  KILN_CHECK(is_floating(y.dtype()) && !is_float8(y.dtype()), op, ": expected a floating-point input, got ", y.meta());
  const DType out_t = y.dtype();
  if (out_t == DType::F16 || out_t == DType::BF16) y = y.to(DType::F32);
  // Separable: along each spatial dim, output i averages input [floor(i in / out), ceil((i + 1) in / out)).
  for (int64_t i = 0; i < nsp; ++i) {
    const int64_t dim = 2 + i, in = y.size(dim), out = output_size[i];
    KILN_CHECK(out > 0, op, ": output_size must be positive, got ", out);
    std::vector<double> m(static_cast<size_t>(out * in), 0.0);
    for (int64_t o = 0; o < out; ++o) {
      const int64_t start = (o * in) / out, end = ((o + 1) * in + out - 1) / out;
      for (int64_t j = start; j < end; ++j) m[o * in + j] = 1.0 / double(end - start);
    }
    const Tensor A = from_vector(m, Shape{out, in}, y.device()).to(y.dtype());
    y = matmul(y.transpose(dim, -1), A.t()).transpose(dim, -1);
  }
  y = y.contiguous().to(out_t);
  return has_batch ? y : y.squeeze(0);
}

// ---- Interpolation -----------------------------------------------------------------------------------------------

Tensor interpolate(const Tensor& input, const std::optional<Shape>& size, const std::optional<std::vector<double>>& scale,
                   std::string_view mode, std::optional<bool> align_corners) {
  const int64_t nsp = input.dim() - 2;
  KILN_CHECK(nsp >= 1 && nsp <= 3, "interpolate: expected [N, C, 1 to 3 spatial dims], got ", input.meta());
  const bool linear = mode == "linear" || mode == "bilinear" || mode == "trilinear";
  KILN_CHECK(mode == "nearest" || linear, "interpolate: mode must be 'nearest', 'linear', 'bilinear' or 'trilinear', got '",
             mode, "'");
  KILN_CHECK(!linear || (mode == "linear" ? nsp == 1 : mode == "bilinear" ? nsp == 2 : nsp == 3), "interpolate: mode '",
             mode, "' needs ", mode == "linear" ? 1 : mode == "bilinear" ? 2 : 3, " spatial dims, got ", input.meta());
  KILN_CHECK(!align_corners || linear, "interpolate: align_corners applies to the linear modes only");
  KILN_CHECK(size.has_value() != scale.has_value(), "interpolate: give exactly one of size and scale_factor");
  KILN_CHECK(is_floating(input.dtype()) && !is_float8(input.dtype()), "interpolate: expected a floating-point input, got ",
             input.meta());
  const bool corners = align_corners.value_or(false);
  Tensor y = input;
  const DType out_t = y.dtype();
  if (linear && (out_t == DType::F16 || out_t == DType::BF16)) y = y.to(DType::F32);
  for (int64_t i = 0; i < nsp; ++i) {
    const int64_t dim = 2 + i, in = input.size(dim);
    int64_t out;
    double ratio;  // input coordinate per output coordinate (torch: 1 / scale_factor when it is given)
    if (size) {
      const Shape sz = expand_arg(*size, nsp, "size", "interpolate");
      out = sz[i];
      ratio = out > 0 ? double(in) / double(out) : 0;
    } else {
      std::vector<double> sc = *scale;
      if (sc.size() == 1) sc.assign(static_cast<size_t>(nsp), sc[0]);
      KILN_CHECK(static_cast<int64_t>(sc.size()) == nsp && sc[i] > 0, "interpolate: scale_factor needs 1 or ", nsp,
                 " positive values");
      out = static_cast<int64_t>(std::floor(double(in) * sc[i]));
      ratio = 1.0 / sc[i];
    }
    KILN_CHECK(out > 0 && in > 0, "interpolate: sizes must be positive (input ", in, ", output ", out, ")");
    if (!linear) {
      std::vector<int64_t> idx(static_cast<size_t>(out));
      for (int64_t o = 0; o < out; ++o)
        idx[o] = std::min<int64_t>(static_cast<int64_t>(std::floor(float(o) * float(ratio))), in - 1);
      y = index_select(y, dim, from_vector(idx, std::nullopt, y.device()));
      continue;
    }
    std::vector<int64_t> lo(static_cast<size_t>(out)), hi(static_cast<size_t>(out));
    std::vector<double> frac(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o) {
      double src = corners ? (out > 1 ? double(o) * double(in - 1) / double(out - 1) : 0.0)
                           : std::max(0.0, (double(o) + 0.5) * ratio - 0.5);
      const int64_t l = std::min<int64_t>(static_cast<int64_t>(std::floor(src)), in - 1);
      lo[o] = l;
      hi[o] = std::min<int64_t>(l + 1, in - 1);
      frac[o] = src - double(l);
    }
    Shape fshape(static_cast<size_t>(y.dim()), 1);
    fshape[static_cast<size_t>(dim)] = out;
    const Tensor f = from_vector(frac, fshape, y.device()).to(y.dtype());
    const Tensor a = index_select(y, dim, from_vector(lo, std::nullopt, y.device()));
    const Tensor b = index_select(y, dim, from_vector(hi, std::nullopt, y.device()));
    y = add(a, mul(sub(b, a), f));
  }
  return y.contiguous().to(out_t);
}

}  // namespace kiln
