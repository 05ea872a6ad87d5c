// CUDA backend basics. Every test skips with a visible reason where no GPU can be used.
#include "test_util.h"

#if KILN_HAVE_CUDA
#include "cuda/backend.h"
#endif

namespace kiln {
namespace {

TEST(CudaBackend, ReportsWhyItIsUnavailable) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present; this test covers machines without one";
#if KILN_HAVE_CUDA
  EXPECT_FALSE(cuda::unavailable_reason().empty());
  EXPECT_TRUE(test::throws_error([] { zeros({2}, DType::F32, cuda_device(0)); }, {"CUDA is not available"}));
#else
  EXPECT_TRUE(test::throws_error([] { zeros({2}, DType::F32, cuda_device(0)); }, {"no CUDA backend"}));
#endif
}

TEST(CudaBackend, RoundTripKeepsValues) {
  KILN_REQUIRE_CUDA();
  Tensor host = test::random_tensor({3, 5}, DType::F32);
  Tensor dev = host.to(cuda_device(0));
  EXPECT_TRUE(dev.is_cuda());
  EXPECT_TRUE(test::equal(dev.to(kCPU), host));
  EXPECT_TRUE(test::equal(dev.to(DType::F16).to(kCPU), host.to(DType::F16)));
}

TEST(CudaBackend, FillWritesEveryElement) {
  KILN_REQUIRE_CUDA();
  for (DType t : {DType::U8, DType::BF16, DType::F32, DType::F64}) {
    Tensor d = full({1001}, 3, t, cuda_device(0));
    EXPECT_TRUE(test::equal(d.to(kCPU), full({1001}, 3, t)));
  }
}

TEST(CudaBackend, MissingDeviceIndexIsAnError) {
  KILN_REQUIRE_CUDA();
  EXPECT_TRUE(test::throws_error([] { zeros({2}, DType::F32, cuda_device(1000)); }, {"cuda:1000", "does not exist"}));
}

}  // namespace
}  // namespace kiln
