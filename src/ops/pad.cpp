// pad (kiln/nn.h): one pass over the output on either device (cpu/pad.cpp, cuda/pad.cu) for up to 3 padded
// dims, from the index map of ops/pad_index.h: no temporaries, whatever the mode. Constant padding of more dims
// writes the input into a filled output (negative pads crop).
#include <algorithm>
#include <optional>

#include "cpu/pad.h"
#include "kiln/nn.h"
#include "ops/pad_index.h"
#if KILN_HAVE_CUDA
#include "cuda/pad.h"
#endif

namespace kiln {

namespace {

PadMode mode_of(std::string_view mode) {
  if (mode == "reflect") return PadMode::Reflect;
  if (mode == "replicate") return PadMode::Replicate;
  if (mode == "circular") return PadMode::Circular;
  return PadMode::Constant;
}

// The element stride that steps through dims [0, end) of t as one flattened dim, if there is one.
std::optional<int64_t> flat_stride(const Tensor& t, int64_t end) {
  int64_t stride = 0, inner = 1;
  bool first = true;
  for (int64_t d = end - 1; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (first) {
      stride = t.stride(d);
      first = false;
    } else if (t.stride(d) != stride * inner) {
      return std::nullopt;
    }
    inner *= t.size(d);
  }
  return stride;
}

// The one-pass kernel: x [outer..., padded (k <= 3)...] into a new tensor of shape `out`.
Tensor pad_native(const Tensor& input, const Shape& out, const std::vector<int64_t>& p, PadMode mode, double value) {
  const int64_t k = static_cast<int64_t>(p.size() / 2), outer_dims = input.dim() - k;
  Tensor x = input;
  std::optional<int64_t> os = flat_stride(x, outer_dims);
  if (!os) {
    x = x.contiguous();
    os = flat_stride(x, outer_dims);
  }
  PadGeometry g;
  g.mode = mode;
  g.outer_stride = *os;
  for (int64_t d = 0; d < outer_dims; ++d) g.outer *= x.size(d);
  for (int64_t d = 0; d < k; ++d) {  // pad pair d is dim (dim - 1 - d), geometry slot 2 - d
    const int64_t dim = x.dim() - 1 - d;
    g.out[2 - d] = out[dim];
    g.in[2 - d] = x.size(dim);
    g.left[2 - d] = p[2 * d];
    g.in_stride[2 - d] = x.stride(dim);
  }
  Tensor y = empty(out, x.dtype(), x.device());
  const Tensor v = full({}, Scalar(value), x.dtype(), kCPU);
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    cuda::pad(x, y, g, v.data_ptr());
    return y;
  }
#endif
  cpu::pad(x, y, g, v.data_ptr());
  return y;
}

}  // namespace

Tensor pad(const Tensor& x, const std::vector<int64_t>& p, std::string_view mode, double value) {
  KILN_CHECK(p.size() % 2 == 0, "pad: the padding must come in (left, right) pairs, got ", p.size(), " values");
  const int64_t k = static_cast<int64_t>(p.size() / 2);
  KILN_CHECK(k <= x.dim(), "pad: ", k, " padded dims for a tensor of ", x.dim(), " dims (", x.meta(), ")");
  KILN_CHECK(mode == "constant" || mode == "reflect" || mode == "replicate" || mode == "circular",
             "pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got '", mode, "'");
  Shape out = x.sizes();
  for (int64_t d = 0; d < k; ++d) {
    const int64_t dim = x.dim() - 1 - d, left = p[2 * d], right = p[2 * d + 1];
    out[dim] = x.size(dim) + left + right;
    KILN_CHECK(out[dim] >= 0, "pad: padding (", left, ", ", right, ") of dim ", dim, " (size ", x.size(dim),
               ") leaves a negative size");
  }
  if (mode == "constant" && k <= 3) return pad_native(x, out, p, PadMode::Constant, value);
  if (mode == "constant") {
    Tensor y = full(out, Scalar(value), x.dtype(), x.device());
    // The region input and output share: each dim from max(0, -left) in x and max(0, left) in y.
    Tensor src = x, dst = y;
    for (int64_t d = 0; d < k; ++d) {
      const int64_t dim = x.dim() - 1 - d, left = p[2 * d];
      const int64_t xs = std::max<int64_t>(0, -left), ys = std::max<int64_t>(0, left);
      const int64_t len = std::max<int64_t>(0, std::min(x.size(dim) - xs, out[dim] - ys));
      src = src.narrow(dim, xs, len);
      dst = dst.narrow(dim, ys, len);
    }
    if (src.numel()) dst.copy_(src);
    return y;
  }
  KILN_CHECK(k <= 3, "pad: mode '", mode, "' pads at most the last 3 dims, got ", k);
  for (int64_t d = 0; d < k; ++d) {
    const int64_t dim = x.dim() - 1 - d, left = p[2 * d], right = p[2 * d + 1], size = x.size(dim);
    if (left == 0 && right == 0) continue;
    KILN_CHECK(size > 0, "pad: mode '", mode, "' cannot pad dim ", dim, " of size 0");
    if (mode == "reflect")
      KILN_CHECK(left < size && right < size, "pad: reflect padding (", left, ", ", right, ") must be smaller than dim ",
                 dim, " (size ", size, ")");
    if (mode == "circular")
      KILN_CHECK(left <= size && right <= size, "pad: circular padding (", left, ", ", right, ") must not exceed dim ", dim,
                 " (size ", size, ")");
  }
  return pad_native(x, out, p, mode_of(mode), 0.0);
}

}  // namespace kiln
