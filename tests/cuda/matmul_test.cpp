// CUDA mm, bmm, matmul and addmm (cuBLAS) against the CPU backend from the same inputs, on every supported
// dtype and the operand layouts cuBLAS reads in place (row-major, transposed, padded rows) or through a copy
// (sliced columns, non-collapsible batch dims), broadcast batches, 1-d operands, zero sizes, TF32 off by
// default, graph capture and invalid calls.
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "cuda/conformance.h"
#include "kiln/cuda_options.h"
#include "kiln/runtime.h"

namespace kiln::test {
namespace {

const std::vector<DType> kDtypes = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::C64};

// CUDA-vs-CPU tolerance of a k-term product with inputs in [-2, 2] (|a b| <= 4). Both backends round every
// partial sum but in different orders (cuBLAS splits k across threads and tiles), so their results may
// differ by up to about 2 * k * eps * 4 on entries that nearly cancel, where a relative tolerance does not
// help: atol grows with k. f16/bf16 accumulate in f32 on both sides, then round once: one output ulp
// (2^-11 / 2^-8 relative at most) stays inside their torch.testing rtol, the f32 ordering term is added
// as atol. complex: each part is a sum of 2k products.
Tolerance tol_for(DType t, int64_t k) {
  const double kk = static_cast<double>(std::max<int64_t>(k, 1));
  switch (t) {
    case DType::F32: return {1.3e-6, 1e-5 + kk * 2.0 * 1.2e-7 * 4.0};
    case DType::C64: return {1.3e-6, 1e-5 + 2.0 * kk * 2.0 * 1.2e-7 * 4.0};
    case DType::F16: return {1e-3, 1e-5 + kk * 2.0 * 1.2e-7 * 4.0};
    case DType::BF16: return {1.6e-2, 1e-5 + kk * 2.0 * 1.2e-7 * 4.0};
    default: return {1e-7, 1e-7 + kk * 2.0 * 2.3e-16 * 4.0};
  }
}

// Random values in [-2, 2); complex values get a random imaginary part too.
Tensor rand_cpu(const Shape& s, DType t) {
  if (t != DType::C64) return random_tensor(s, t);
  auto re = random_tensor(s, DType::F32).to_vector<float>(), im = random_tensor(s, DType::F32).to_vector<float>();
  std::vector<Complex64> v;
  for (size_t i = 0; i < re.size(); ++i) v.emplace_back(re[i], im[i]);
  return from_vector<Complex64>(v, s);
}

// Operand layouts of a [..., r, c] matrix:
//   Contig      row-major
//   Transposed  the transpose of a contiguous [..., c, r] buffer (cuBLAS op T, no copy)
//   Padded      the first c columns of a [..., r, c + 3] buffer (leading dimension > c, no copy)
//   Sliced      every other column from offset 1 (no unit stride: copied before cuBLAS)
enum class Op { Contig, Transposed, Padded, Sliced };
const char* op_name(Op o) {
  switch (o) {
    case Op::Contig: return "contig";
    case Op::Transposed: return "transposed";
    case Op::Padded: return "padded";
    default: return "sliced";
  }
}
const std::vector<Op> kOps = {Op::Contig, Op::Transposed, Op::Padded, Op::Sliced};

// The same values and strides on the CPU and on the GPU.
Pair operand(const Shape& shape, DType t, Op layout) {
  Shape base = shape;
  const size_t d = shape.size();
  if (layout == Op::Transposed) std::swap(base[d - 1], base[d - 2]);
  if (layout == Op::Padded) base[d - 1] += 3;
  if (layout == Op::Sliced) base[d - 1] = 2 * shape[d - 1] + 1;
  const Tensor cpu = rand_cpu(base, t);
  const Tensor dev = cpu.to(cuda_device(0));
  auto view = [&](const Tensor& x) {
    switch (layout) {
      case Op::Transposed: return x.transpose(-1, -2);
      case Op::Padded: return x.narrow(-1, 0, shape[d - 1]);
      case Op::Sliced: return x.slice(-1, 1, std::nullopt, 2);
      default: return x;
    }
  };
  Pair p{view(cpu), view(dev)};
  EXPECT_EQ(p.cpu.sizes(), shape);
  return p;
}

// A pair from CPU values, with `view` applied on both sides.
Pair pair_from(const Tensor& cpu, const std::function<Tensor(const Tensor&)>& view = [](const Tensor& x) { return x; }) {
  return Pair{view(cpu), view(cpu.to(cuda_device(0)))};
}

std::string label(const char* op, DType t, Op la, Op lb) {
  return str(op, " ", dtype_name(t), " a:", op_name(la), " b:", op_name(lb));
}

TEST(CudaMm, MatchesCpuForEveryDtypeAndLayout) {
  KILN_REQUIRE_CUDA();
  const int64_t n = 37, k = 53, m = 29;  // odd sizes: no tile divides them
  for (DType t : kDtypes)
    for (Op la : kOps)
      for (Op lb : kOps)
        expect_conformant(label("mm", t, la, lb), [](const std::vector<Tensor>& in) { return one(mm(in[0], in[1])); },
                          {operand({n, k}, t, la), operand({k, m}, t, lb)}, tol_for(t, k));
}

TEST(CudaMm, LongInnerDimensionWithinKScaledTolerance) {
  KILN_REQUIRE_CUDA();
  for (DType t : kDtypes)
    expect_conformant(str("mm k=2000 ", dtype_name(t)), [](const std::vector<Tensor>& in) { return one(mm(in[0], in[1])); },
                      {operand({64, 2000}, t, Op::Contig), operand({2000, 48}, t, Op::Transposed)}, tol_for(t, 2000));
}

TEST(CudaMm, VectorShapedMatrices) {
  KILN_REQUIRE_CUDA();
  // n = 1, m = 1 and k = 1: the leading dimensions of unit extents are where cuBLAS is strictest.
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 17, 9}, {9, 17, 1}, {1, 17, 1}, {9, 1, 11}, {1, 1, 1}};
  for (DType t : kDtypes)
    for (auto [n, k, m] : shapes)
      for (Op la : {Op::Contig, Op::Transposed, Op::Sliced})
        for (Op lb : {Op::Contig, Op::Transposed, Op::Padded})
          expect_conformant(label("mm", t, la, lb) + str(" ", n, "x", k, "x", m),
                            [](const std::vector<Tensor>& in) { return one(mm(in[0], in[1])); },
                            {operand({n, k}, t, la), operand({k, m}, t, lb)}, tol_for(t, k));
}

TEST(CudaBmm, MatchesCpuForEveryDtypeAndLayout) {
  KILN_REQUIRE_CUDA();
  const int64_t B = 3, n = 19, k = 23, m = 13;
  for (DType t : kDtypes)
    for (Op la : kOps)
      for (Op lb : kOps)
        expect_conformant(label("bmm", t, la, lb), [](const std::vector<Tensor>& in) { return one(bmm(in[0], in[1])); },
                          {operand({B, n, k}, t, la), operand({B, k, m}, t, lb)}, tol_for(t, k));
}

TEST(CudaBmm, BroadcastAndPermutedBatches) {
  KILN_REQUIRE_CUDA();
  const int64_t B = 4, n = 9, k = 21, m = 7;
  for (DType t : kDtypes) {
    // Batch stride 0 (one matrix expanded over the batch) is read in place by the strided-batched call.
    expect_conformant(str("bmm expanded a ", dtype_name(t)), [](const std::vector<Tensor>& in) { return one(bmm(in[0], in[1])); },
                      {pair_from(rand_cpu({1, n, k}, t), [&](const Tensor& x) { return x.expand({B, n, k}); }),
                       operand({B, k, m}, t, Op::Contig)},
                      tol_for(t, k));
    expect_conformant(str("bmm expanded b ", dtype_name(t)), [](const std::vector<Tensor>& in) { return one(bmm(in[0], in[1])); },
                      {operand({B, n, k}, t, Op::Transposed),
                       pair_from(rand_cpu({1, k, m}, t), [&](const Tensor& x) { return x.expand({B, k, m}); })},
                      tol_for(t, k));
    // Batch dim not outermost in memory: still one stride (k*n*... permuted), read in place.
    expect_conformant(str("bmm batch-inner a ", dtype_name(t)), [](const std::vector<Tensor>& in) { return one(bmm(in[0], in[1])); },
                      {pair_from(rand_cpu({n, B, k}, t), [](const Tensor& x) { return x.permute({1, 0, 2}); }),
                       operand({B, k, m}, t, Op::Padded)},
                      tol_for(t, k));
  }
}

TEST(CudaMatmul, BroadcastBatchDims) {
  KILN_REQUIRE_CUDA();
  auto mat = [](const std::vector<Tensor>& in) { return one(matmul(in[0], in[1])); };
  for (DType t : kDtypes) {
    // [2, 1, 3, 4] x [5, 4, 2] -> [2, 5, 3, 2]: batch dims with strides (12, 0) do not collapse: copied.
    expect_conformant(str("matmul [2,1,3,4]x[5,4,2] ", dtype_name(t)), mat,
                      {operand({2, 1, 3, 4}, t, Op::Contig), operand({5, 4, 2}, t, Op::Contig)}, tol_for(t, 4));
    expect_conformant(str("matmul [2,1,3,4]T x [5,4,2]T ", dtype_name(t)), mat,
                      {operand({2, 1, 3, 4}, t, Op::Transposed), operand({5, 4, 2}, t, Op::Transposed)}, tol_for(t, 4));
    // [..., n, k] x [k, m]: a's rows fold into one product when they form one stride.
    expect_conformant(str("matmul fold [2,3,6,5]x[5,7] ", dtype_name(t)), mat,
                      {operand({2, 3, 6, 5}, t, Op::Contig), operand({5, 7}, t, Op::Transposed)}, tol_for(t, 5));
    expect_conformant(str("matmul no-fold transposed [3,6,5]x[5,7] ", dtype_name(t)), mat,
                      {operand({3, 6, 5}, t, Op::Transposed), operand({5, 7}, t, Op::Contig)}, tol_for(t, 5));
    expect_conformant(str("matmul no-fold sliced [3,6,5]x[5,7] ", dtype_name(t)), mat,
                      {operand({3, 6, 5}, t, Op::Sliced), operand({5, 7}, t, Op::Padded)}, tol_for(t, 5));
    // [k, m] broadcast on the left of a batched b.
    expect_conformant(str("matmul [6,5]x[3,5,7] ", dtype_name(t)), mat,
                      {operand({6, 5}, t, Op::Padded), operand({3, 5, 7}, t, Op::Contig)}, tol_for(t, 5));
    // Batch dims in an order that does not collapse (permuted), read through a copy.
    expect_conformant(str("matmul permuted batch ", dtype_name(t)), mat,
                      {pair_from(rand_cpu({3, 2, 6, 5}, t), [](const Tensor& x) { return x.permute({1, 0, 2, 3}); }),
                       operand({2, 3, 5, 4}, t, Op::Contig)},
                      tol_for(t, 5));
  }
}

TEST(CudaMatmul, OneDimensionalOperands) {
  KILN_REQUIRE_CUDA();
  auto mat = [](const std::vector<Tensor>& in) { return one(matmul(in[0], in[1])); };
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{11}, {11}}, {{11}, {11, 4}}, {{6, 11}, {11}}, {{2, 3, 11}, {11}}, {{11}, {2, 11, 4}}, {{11}, {3, 1, 11, 4}}};
  for (DType t : kDtypes)
    for (const auto& [sa, sb] : cases)
      for (Op l : {Op::Contig, Op::Sliced}) {
        // Sliced 1-d operands have stride 2 (a 1-d transposed layout is the same as contiguous).
        expect_conformant(str("matmul ", sa, "x", sb, " ", dtype_name(t), " ", op_name(l)), mat,
                          {sa.size() == 1 ? operand(sa, t, l) : operand(sa, t, Op::Contig),
                           sb.size() == 1 ? operand(sb, t, l) : operand(sb, t, Op::Transposed)},
                          tol_for(t, 11));
      }
}

TEST(CudaAddmm, BroadcastInputAndScalars) {
  KILN_REQUIRE_CUDA();
  const int64_t n = 13, k = 17, m = 11;
  const std::vector<Shape> inputs = {{n, m}, {m}, {1, m}, {n, 1}, {}};
  for (DType t : kDtypes)
    for (const Shape& si : inputs)
      for (auto [beta, alpha] : {std::pair<double, double>{1, 1}, {0.5, -2}, {-1.5, 0.25}}) {
        const Scalar sb = t == DType::C64 ? Scalar(Complex64(float(beta), 0.5f)) : Scalar(beta);
        const Scalar sa = t == DType::C64 ? Scalar(Complex64(float(alpha), -1.0f)) : Scalar(alpha);
        expect_conformant(str("addmm input ", si, " ", dtype_name(t), " beta ", sb.str(), " alpha ", sa.str()),
                          [&](const std::vector<Tensor>& in) { return one(addmm(in[0], in[1], in[2], sb, sa)); },
                          {si.empty() ? pair_from(rand_cpu({}, t)) : operand(si, t, Op::Contig),
                           operand({n, k}, t, Op::Transposed), operand({k, m}, t, Op::Padded)},
                          tol_for(t, k + 1));
      }
  // A non-contiguous full-size input.
  for (DType t : kDtypes)
    expect_conformant(str("addmm transposed input ", dtype_name(t)),
                      [](const std::vector<Tensor>& in) { return one(addmm(in[0], in[1], in[2], 2, 3)); },
                      {operand({n, m}, t, Op::Transposed), operand({n, k}, t, Op::Sliced), operand({k, m}, t, Op::Contig)},
                      tol_for(t, k + 1));
}

TEST(CudaAddmm, BetaZeroIgnoresNaNInInput) {
  KILN_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::C64}) {
    const Tensor input = full({5, 4}, std::numeric_limits<double>::quiet_NaN(), t, cuda_device(0));
    const Pair a = operand({5, 6}, t, Op::Contig), b = operand({6, 4}, t, Op::Contig);
    const Tensor got = addmm(input, a.cuda, b.cuda, 0, 1).to(kCPU);
    const Tensor want = mm(a.cpu, b.cpu);
    EXPECT_TRUE(all_close(got, want, tol_for(t, 6))) << dtype_name(t);
    // k = 0 with beta = 0: zeros, not NaN.
    const Tensor z = addmm(input, zeros({5, 0}, t, cuda_device(0)), zeros({0, 4}, t, cuda_device(0)), 0, 1);
    EXPECT_TRUE(all_close(z.to(kCPU), zeros({5, 4}, t), Tolerance{0, 0})) << dtype_name(t);
  }
}

TEST(CudaMatmul, ZeroSizes) {
  KILN_REQUIRE_CUDA();
  const Device dev = cuda_device(0);
  for (DType t : kDtypes) {
    SCOPED_TRACE(dtype_name(t));
    // k = 0: a sum of nothing is zero.
    Tensor z = mm(empty({3, 0}, t, dev), empty({0, 4}, t, dev));
    EXPECT_TRUE(z.is_cuda());
    EXPECT_TRUE(all_close(z.to(kCPU), zeros({3, 4}, t), Tolerance{0, 0}));
    EXPECT_TRUE(all_close(matmul(empty({2, 3, 0}, t, dev), empty({0, 4}, t, dev)).to(kCPU), zeros({2, 3, 4}, t),
                          Tolerance{0, 0}));
    EXPECT_TRUE(all_close(matmul(empty({0}, t, dev), empty({0}, t, dev)).to(kCPU), zeros({}, t), Tolerance{0, 0}));
    // k = 0 in addmm: beta * input, broadcast.
    expect_conformant(str("addmm k=0 ", dtype_name(t)),
                      [](const std::vector<Tensor>& in) { return one(addmm(in[0], in[1], in[2], 2.5, 3)); },
                      {operand({4}, t, Op::Sliced), pair_from(zeros({3, 0}, t)), pair_from(zeros({0, 4}, t))},
                      Tolerance{0, 0});
    // n, m or the batch = 0: empty results of the right shape.
    EXPECT_EQ(mm(empty({0, 5}, t, dev), empty({5, 4}, t, dev)).sizes(), (Shape{0, 4}));
    EXPECT_EQ(mm(empty({3, 5}, t, dev), empty({5, 0}, t, dev)).sizes(), (Shape{3, 0}));
    EXPECT_EQ(bmm(empty({0, 3, 5}, t, dev), empty({0, 5, 4}, t, dev)).sizes(), (Shape{0, 3, 4}));
    EXPECT_EQ(matmul(empty({2, 0, 3, 5}, t, dev), empty({5, 4}, t, dev)).sizes(), (Shape{2, 0, 3, 4}));
    EXPECT_EQ(addmm(empty({0, 4}, t, dev), empty({0, 5}, t, dev), empty({5, 4}, t, dev)).sizes(), (Shape{0, 4}));
  }
}

// Restores the TF32 switch when a test ends, pass or fail.
struct Tf32Guard {
  bool saved = allow_tf32();
  ~Tf32Guard() { set_allow_tf32(saved); }
};

TEST(CudaMatmul, Float32UsesFullPrecisionByDefault) {
  KILN_REQUIRE_CUDA();
  Tf32Guard guard;
  EXPECT_FALSE(allow_tf32());
  // 1 + 2^-12 is exact in f32 but rounds to 1 in TF32 (10-bit mantissa): with TF32 the sum of 256 such
  // products would be 256, not 256.0625. The shape is large enough for cuBLAS to pick tensor-core kernels.
  const float v = 1.0f + std::ldexp(1.0f, -12);
  const Tensor a = full({128, 256}, v, DType::F32, cuda_device(0));
  const Tensor b = ones({256, 96}, DType::F32, cuda_device(0));
  EXPECT_TRUE(all_close(mm(a, b).to(kCPU), full({128, 96}, 256.0625, DType::F32), Tolerance{0, 1e-4}));
  // Allowed: still a sane product, within TF32's rounding of the inputs.
  set_allow_tf32(true);
  EXPECT_TRUE(allow_tf32());
  EXPECT_TRUE(all_close(mm(a, b).to(kCPU), full({128, 96}, 256.0625, DType::F32), Tolerance{1e-3, 1e-3}));
  set_allow_tf32(false);
  EXPECT_TRUE(all_close(mm(a, b).to(kCPU), full({128, 96}, 256.0625, DType::F32), Tolerance{0, 1e-4}));
}

TEST(CudaMatmul, GraphReplayMatchesEager) {
  KILN_REQUIRE_CUDA();
  const Device dev = cuda_device(0);
  for (DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor a = rand_cpu({2, 1, 24, 40}, t).to(dev);  // broadcast batch: exercises the gather kernel too
    Tensor b = rand_cpu({3, 40, 16}, t).to(dev);
    Tensor in = rand_cpu({16}, t).to(dev);
    Tensor a2 = rand_cpu({24, 40}, t).to(dev);
    Stream s = Stream::create(dev);
    Tensor out, out2;
    Graph g;
    {
      StreamGuard sg(s);
      // Warm-up on this thread and stream: creates the cuBLAS handle and workspace outside the capture.
      (void)matmul(a, b);
      (void)addmm(in, a2, b[0], 0.5, 2);
      s.synchronize();
      g.capture(s, [&] {
        out = matmul(a, b);
        out2 = addmm(in, a2, b[0], 0.5, 2);
      });
    }
    g.replay();
    s.synchronize();
    EXPECT_TRUE(all_close(out.to(kCPU), matmul(a.cpu(), b.cpu()), tol_for(t, 40)));
    EXPECT_TRUE(all_close(out2.to(kCPU), addmm(in.cpu(), a2.cpu(), b.cpu()[0], 0.5, 2), tol_for(t, 41)));
    // New values in the same input buffers: the replay reads them.
    const Tensor na = rand_cpu({2, 1, 24, 40}, t), nb = rand_cpu({3, 40, 16}, t);
    a.copy_(na);
    b.copy_(nb);
    synchronize(dev);
    g.replay();
    s.synchronize();
    EXPECT_TRUE(all_close(out.to(kCPU), matmul(na, nb), tol_for(t, 40)));
    EXPECT_TRUE(all_close(out2.to(kCPU), addmm(in.cpu(), a2.cpu(), nb[0], 0.5, 2), tol_for(t, 41)));
    EXPECT_TRUE(all_close(out.to(kCPU), matmul(a, b).to(kCPU), tol_for(t, 40)));
  }
}

TEST(CudaMatmul, InvalidCallsNameDtypesAndDevices) {
  KILN_REQUIRE_CUDA();
  const Device dev = cuda_device(0);
  const Tensor f = zeros({2, 3}, DType::F32, dev), h = zeros({3, 2}, DType::F16, dev);
  EXPECT_TRUE(throws_error([&] { mm(f, h); }, {"mm", "same dtype", "float32", "float16"}));
  EXPECT_TRUE(throws_error([&] { matmul(f, zeros({3, 2}, DType::F32)); }, {"matmul", "one device", "cuda:0", "cpu"}));
  EXPECT_TRUE(throws_error([&] { bmm(zeros({1, 2, 3}), zeros({1, 3, 2}, DType::F32, dev)); }, {"bmm", "one device"}));
  EXPECT_TRUE(throws_error([&] { addmm(zeros({2, 2}), f, zeros({3, 2}, DType::F32, dev)); },
                           {"addmm", "input", "device", "cpu", "cuda:0"}));
  EXPECT_TRUE(throws_error([&] { addmm(zeros({2, 2}, DType::F64, dev), f, zeros({3, 2}, DType::F32, dev)); },
                           {"addmm", "same dtype", "float64"}));
  EXPECT_TRUE(throws_error([&] { mm(zeros({2, 3}, DType::I64, dev), zeros({3, 2}, DType::I64, dev)); },
                           {"mm", "integer matmul is CPU-only", "int64"}));
  EXPECT_TRUE(throws_error([&] { matmul(zeros({2, 3}, DType::I32, dev), zeros({3}, DType::I32, dev)); },
                           {"matmul", "integer matmul is CPU-only", "int32"}));
  EXPECT_TRUE(throws_error([&] { mm(f, f); }, {"mm", "[2, 3]", "3 != 2"}));
  EXPECT_TRUE(throws_error([&] { matmul(zeros({2, 3, 4}, DType::F32, dev), zeros({3, 4, 2}, DType::F32, dev)); },
                           {"matmul", "broadcast"}));
}

}  // namespace
}  // namespace kiln::test
