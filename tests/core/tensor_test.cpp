#include "test_util.h"

namespace kiln {
namespace {

using test::equal;
using test::throws_error;

TEST(Tensor, ContiguousStridesAndViews) {
  Tensor a = from_vector<float>({0, 1, 2, 3, 4, 5}, Shape{2, 3});
  EXPECT_EQ(a.strides(), (Shape{3, 1}));
  EXPECT_TRUE(a.is_contiguous());
  Tensor t = a.t();
  EXPECT_EQ(t.sizes(), (Shape{3, 2}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.contiguous().to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(t.is_alias_of(a));
  EXPECT_EQ(a.select(1, -1).to_vector<float>(), (std::vector<float>{2, 5}));
  EXPECT_EQ(a.slice(1, 0, std::nullopt, 2).to_vector<float>(), (std::vector<float>{0, 2, 3, 5}));
  EXPECT_EQ(a.narrow(1, 1, 2).to_vector<float>(), (std::vector<float>{1, 2, 4, 5}));
  EXPECT_EQ(a.view({3, -1}).sizes(), (Shape{3, 2}));
  EXPECT_EQ(a.unsqueeze(0).sizes(), (Shape{1, 2, 3}));
  EXPECT_EQ(a.unsqueeze(-1).squeeze().sizes(), (Shape{2, 3}));
  EXPECT_EQ(a.select(0, 0).expand({4, 3}).strides(), (Shape{0, 1}));
}

TEST(Tensor, ViewOfTransposedNeedsReshape) {
  Tensor a = from_vector<float>({0, 1, 2, 3, 4, 5}, Shape{2, 3});
  EXPECT_TRUE(throws_error([&] { a.t().view({6}); }, {"view", "reshape"}));
  EXPECT_EQ(a.t().reshape({6}).to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, AsStridedOutOfStorageIsAnError) {
  Tensor a = zeros({4});
  EXPECT_TRUE(throws_error([&] { a.as_strided({3}, {2}); }, {"outside a storage of 4"}));
}

// The constant mark (a promise that no kernel writes the memory any more) lives on the storage: views share
// it, copies do not.
TEST(Tensor, ConstantMarkBelongsToTheStorage) {
  Tensor a = from_vector<float>({0, 1, 2, 3, 4, 5}, Shape{2, 3});
  EXPECT_FALSE(a.storage()->constant());
  const Tensor v = a.t().narrow(0, 1, 2);
  a.storage()->set_constant(true);
  EXPECT_TRUE(v.storage()->constant());
  EXPECT_FALSE(a.clone().storage()->constant());
  EXPECT_FALSE(a.to(DType::F64).storage()->constant());
  v.storage()->set_constant(false);
  EXPECT_FALSE(a.storage()->constant());
}

TEST(Tensor, CopyBetweenDTypes) {
  Tensor a = from_vector<double>({1.5, -2.25, 3.0});
  EXPECT_TRUE(equal(a.to(DType::I32), from_vector<int32_t>({1, -2, 3})));
  EXPECT_EQ(a.to(DType::F16)[1].item<float>(), -2.25f);
}

TEST(Tensor, ItemNeedsOneElement) {
  EXPECT_TRUE(throws_error([] { zeros({2}).item<float>(); }, {"item", "2 elements"}));
  EXPECT_EQ(full({}, 7).item<int64_t>(), 7);
}

TEST(Tensor, PrintsLikePyTorch) {
  EXPECT_EQ(from_vector<float>({1, 2}).str(), "tensor([1., 2.])");
  EXPECT_EQ(from_vector<int32_t>({1, -2}).str(), "tensor([ 1, -2], dtype=int32)");
}

}  // namespace
}  // namespace kiln
