// pad (kiln/nn.h): constant padding writes the input into a filled output (negative pads crop); reflect,
// replicate and circular gather each padded dim through an index map (one index_select per padded dim).
#include <algorithm>

#include "kiln/nn.h"

namespace kiln {

namespace {

// Source index of output position i along a dim of `size` padded by `left`: reflect, replicate or circular.
int64_t source(int64_t i, int64_t left, int64_t size, std::string_view mode) {
  int64_t j = i - left;
  if (mode == "replicate") return std::clamp<int64_t>(j, 0, size - 1);
  if (mode == "circular") return ((j % size) + size) % size;
  // reflect: mirror about the edges, the edge itself not repeated
  if (size == 1) return 0;
  const int64_t period = 2 * (size - 1);
  j = ((j % period) + period) % period;
  return j < size ? j : period - j;
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
  Tensor y = x;
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
    std::vector<int64_t> idx(static_cast<size_t>(out[dim]));
    for (int64_t i = 0; i < out[dim]; ++i) idx[i] = source(i, left, size, mode);
    y = index_select(y, dim, from_vector(idx, std::nullopt, x.device()));
  }
  return y.contiguous();
}

}  // namespace kiln
