// Path selection of the CUDA reductions (src/cuda/reduce_plan.h).
#include "cuda/reduce_plan.h"

#include <algorithm>

#include "cuda/launch.h"

namespace kiln::cuda {

namespace {

struct Dim {
  int64_t size, stride;
};

// Drops size-1 dims and merges neighbours (in tensor order, which keeps the row-major order of the
// output and of the reduced index) that are contiguous with each other.
std::vector<Dim> merge_dims(const std::vector<Dim>& dims) {
  std::vector<Dim> out;
  for (const Dim& d : dims) {
    if (d.size == 1) continue;
    if (!out.empty() && out.back().stride == d.size * d.stride) {
      out.back().size *= d.size;
      out.back().stride = d.stride;
    } else {
      out.push_back(d);
    }
  }
  return out;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Path 1 or 2 for rows of `len` elements `row_stride` apart.
void choose_rows(ReducePlan& p, int device) {
  const int64_t sms = multiprocessor_count(device);
  // A warp per row leaves the device mostly idle for a few long rows ([1, 1e7], [4, 201088]); split
  // each row over blocks instead. Chunks of >= 2048 elements keep the partials negligible, ~8 blocks
  // per SM fill the device.
  if (p.len >= 4096 && p.outputs <= 4 * sms) {
    p.path = ReducePath::SplitRows;
    const int64_t want = std::min(ceil_div(p.len, 2048), ceil_div(8 * sms, p.outputs));
    p.chunk = ceil_div(ceil_div(p.len, std::max<int64_t>(want, 1)), 16) * 16;  // 16 elements: vector aligned
    p.splits = ceil_div(p.len, p.chunk);
    return;
  }
  p.path = ReducePath::Rows;
  p.group_log2 = group_log2_for(p.len);
}

}  // namespace

int group_log2_for(int64_t len) {
  int g = 0;
  while (g < 5 && (int64_t{1} << g) < len) ++g;
  return g;
}

ReducePlan plan_reduce(const Tensor& x, const std::vector<bool>& reduced) {
  ReducePlan p;
  p.outputs = 1;
  p.len = 1;
  std::vector<Dim> kept, red;
  std::vector<int64_t> kept_ids, red_ids;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const auto i = static_cast<size_t>(d);
    const Dim dim{x.sizes()[i], x.strides()[i]};
    if (reduced[i]) {
      p.len *= dim.size;
      red.push_back(dim);
      red_ids.push_back(d);
    } else {
      p.outputs *= dim.size;
      kept.push_back(dim);
      kept_ids.push_back(d);
    }
  }
  p.input = x;
  if (p.outputs == 0) return p;  // nothing to launch
  const int device = x.device().index;
  if (p.len == 0) {
    // Every output is the op's identity: rows of no elements (the input is never read).
    p.path = ReducePath::Rows;
    p.row_stride = 0;
    p.group_log2 = 0;
    return p;
  }
  const std::vector<Dim> k = merge_dims(kept), r = merge_dims(red);
  // Path 1/2 as they are: the reduced dims form one contiguous run, the kept dims one strided dim.
  if (k.size() <= 1 && (r.empty() || (r.size() == 1 && r[0].stride == 1))) {
    p.row_stride = k.empty() ? 0 : k[0].stride;
    choose_rows(p, device);
    return p;
  }
  // Path 3: one reduced dim and a contiguous innermost kept dim (sum over dim 0 of a row-major matrix, or
  // over a middle dim: [outer, reduced, inner]).
  if (r.size() == 1 && !k.empty() && k.size() <= 2 && k.back().stride == 1) {
    p.path = ReducePath::Columns;
    p.inner = k.back().size;
    p.outer_stride = k.size() == 2 ? k[0].stride : 0;
    p.red_stride = r[0].stride;
    // Few outputs (a [4096, 4096] column sum has 4096 threads): split the reduced dim so that ~2048
    // threads per SM run, keeping >= 32 elements per chunk; blockIdx.y holds the split (<= 65535).
    const int64_t want_threads = 2048 * static_cast<int64_t>(multiprocessor_count(device));
    int64_t splits = 1;
    if (p.outputs < want_threads && p.len >= 64)
      splits = std::min({ceil_div(want_threads, p.outputs), ceil_div(p.len, 32), int64_t{65535}});
    p.chunk = ceil_div(p.len, splits);
    p.splits = ceil_div(p.len, p.chunk);
    return p;
  }
  // Path 4, any other layout (permuted input, several non-adjacent reduced dims, slices along the reduced
  // dim): move the reduced dims last, keeping both groups in tensor order, and copy to contiguous. The
  // copy costs one extra pass over x; acceptable for now, a strided-input kernel can replace it later.
  Shape order;
  for (int64_t d : kept_ids) order.push_back(d);
  for (int64_t d : red_ids) order.push_back(d);
  p.input = x.permute(order).contiguous();
  p.row_stride = p.len;
  choose_rows(p, device);
  return p;
}

}  // namespace kiln::cuda
