// A mixed sequence of ops from every family captured as one CUDA graph: the capture fails if any op
// synchronises the host or calls an API that cannot be captured, and the replay must equal eager execution.
#include "kiln/runtime.h"
#include "test_util.h"

namespace kiln {
namespace {

const Device kGpu = cuda_device(0);

Tensor step(const Tensor& x, const Tensor& w, const Tensor& idx) {
  Tensor h = matmul(x, w);                                  // cuBLAS
  h = add(h, full({}, 0.5, DType::F32, x.device()));              // broadcast elementwise
  h = silu(h);                                              // unary
  Tensor g = index_select(h, 0, idx);                       // indexing
  Tensor s = sum(g, {1}, true);                             // reduction
  Tensor m = amax(g, {1}, true);
  Tensor e = exp(sub(g, m));                                // softmax by hand
  Tensor p = div(e, sum(e, {1}, true));
  Tensor r = where(gt(p, full({}, 0.1, DType::F32, x.device())), p, mul(s, 0.0));
  return cat({r, p.to(DType::BF16).to(DType::F32)}, 1);
}

TEST(CudaGraph, ASequenceOfOpsFromEveryFamilyCapturesAndReplays) {
  KILN_REQUIRE_CUDA();
  const Tensor x_host = test::random_tensor({64, 96}, DType::F32);
  const Tensor w_host = test::random_tensor({96, 48}, DType::F32, -0.2, 0.2);
  const Tensor idx_host = from_vector<int64_t>({3, 0, 63, 17, 17, 42});
  Tensor x = x_host.to(kGpu), w = w_host.to(kGpu), idx = idx_host.to(kGpu);
  const Tensor eager = step(x, w, idx).to(kCPU);
  // Against the CPU: the f32 half closely; the half rounded to bf16 within one bf16 step (at most 2^-7 relative), since
  // a value within 1e-4 of the CPU's can round to the neighbouring bf16.
  const Tensor ref = step(x_host, w_host, idx_host);
  EXPECT_TRUE(test::all_close(eager.narrow(1, 0, 48), ref.narrow(1, 0, 48), test::Tolerance{1e-4, 1e-5}));
  EXPECT_TRUE(test::all_close(eager.narrow(1, 48, 48), ref.narrow(1, 48, 48), test::Tolerance{1.0 / 128, 1e-5}));

  Stream s = Stream::create(kGpu);
  Graph g;
  Tensor out;
  g.capture(s, [&] {
    out = step(x, w, idx);
    (void)rand({16}, DType::F32, kGpu);  // RNG too
  });
  synchronize(kGpu);  // the inputs were written on the default stream; the graph runs on s
  g.replay();
  s.synchronize();
  EXPECT_TRUE(test::equal(out.to(kCPU), eager));
  // New inputs in place, replay again: the graph reads the same buffers.
  x.copy_(test::random_tensor({64, 96}, DType::F32).to(kGpu));
  const Tensor eager2 = step(x, w, idx).to(kCPU);
  synchronize(kGpu);
  g.replay();
  s.synchronize();
  EXPECT_TRUE(test::equal(out.to(kCPU), eager2));
}

}  // namespace
}  // namespace kiln
