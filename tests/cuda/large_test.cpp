// Tensors past 2^31 elements on the GPU: every path that indexes memory must use 64-bit offsets there.
// Needs about 13 GB of device memory; skipped without a GPU or when the device has less than 24 GB.
#include "kiln/runtime.h"
#include "test_util.h"

namespace kiln {
namespace {

const Device kGpu = cuda_device(0);
constexpr int64_t kBig = (int64_t{1} << 31) + 4099;  // not a multiple of any vector width

bool enough_memory() { return device_properties(kGpu).total_memory >= (int64_t{24} << 30); }

TEST(CudaLarge, ElementwiseReductionAndCopyPastTwoToThe31) {
  KILN_REQUIRE_CUDA();
  if (!enough_memory()) GTEST_SKIP() << "needs 24 GB of device memory";
  Tensor x = empty({kBig}, DType::U8, kGpu);
  x.fill_(1);
  // The last elements are where 32-bit offsets would wrap.
  x.narrow(0, kBig - 3, 3).fill_(5);
  EXPECT_EQ(sum(x).item<int64_t>(), kBig - 3 + 15);
  EXPECT_EQ(amax(x).item<int64_t>(), 5);
  EXPECT_EQ(argmax(x).item<int64_t>(), kBig - 3);

  // Contiguous elementwise (vectorised) and a dtype conversion over the whole range.
  Tensor y = add(x, x);
  EXPECT_EQ(y.narrow(0, kBig - 1, 1).item<int64_t>(), 10);
  EXPECT_EQ(y.narrow(0, 0, 1).item<int64_t>(), 2);
  Tensor h = x.to(DType::F16);
  EXPECT_EQ(h.narrow(0, kBig - 2, 1).item<float>(), 5.f);

  // Strided views whose offsets pass 2^31: a step-2 slice and a broadcast.
  Tensor odd = x.slice(0, 1, std::nullopt, 2);
  Tensor z = mul(odd, full({}, 3, DType::U8, kGpu));
  EXPECT_EQ(z.numel(), kBig / 2);
  EXPECT_EQ(z.narrow(0, z.numel() - 1, 1).item<int64_t>(), (kBig - 2) % 2 == 1 ? 15 : 3);
  EXPECT_EQ(sum(z.to(DType::I64)).item<int64_t>(), 3 * sum(odd).item<int64_t>());
}

TEST(CudaLarge, IndexSelectReadsPastTwoToThe31) {
  KILN_REQUIRE_CUDA();
  if (!enough_memory()) GTEST_SKIP() << "needs 24 GB of device memory";
  Tensor x = full({kBig}, 7, DType::I32, kGpu);
  x.narrow(0, kBig - 1, 1).fill_(42);
  x.narrow(0, int64_t{1} << 31, 1).fill_(43);
  x.narrow(0, (int64_t{1} << 31) - 1, 1).fill_(44);
  Tensor idx = from_vector<int64_t>({0, kBig - 1, int64_t{1} << 31, (int64_t{1} << 31) - 1, 5}, std::nullopt, kGpu);
  EXPECT_EQ(index_select(x, 0, idx).to(kCPU).to_vector<int32_t>(), (std::vector<int32_t>{7, 42, 43, 44, 7}));
}

}  // namespace
}  // namespace kiln
