#include "cuda/attention.h"

namespace kiln::cuda {
void attention(const Tensor& out, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
               const attention_math::Layout&, double) {
  throw Error(str("scaled_dot_product_attention: no CUDA implementation yet (output ", out.meta(), ")"));
}
void kv_cache_append(const Tensor& cache, const Tensor&, const Tensor&, int64_t) {
  throw Error(str("kv_cache_append_: no CUDA implementation yet (cache ", cache.meta(), ")"));
}
}  // namespace kiln::cuda
