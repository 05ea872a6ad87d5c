#include <algorithm>

#include "test_util.h"

namespace kiln::test {
namespace {

std::vector<int64_t> ivec(const Tensor& t) { return t.to_vector<int64_t>(); }
std::vector<double> dvec(const Tensor& t) { return t.to_vector<double>(); }

// Row-major flat offset of a multi-index into `shape`.
int64_t flat(const Shape& shape, const std::vector<int64_t>& idx) {
  int64_t o = 0;
  for (size_t d = 0; d < shape.size(); ++d) o = o * shape[d] + idx[d];
  return o;
}

// Calls f(multi-index) for every position of shape, row-major.
template <class F>
void for_each_index(const Shape& shape, F f) {
  const int64_t n = checked_numel(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    f(idx);
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// ---- cat / stack ------------------------------------------------------------------------------------

TEST(Cat, MixedDtypesPromoteAndEmptyVectorsAreSkipped) {
  Tensor a = random_int_tensor({2, 3}, DType::I32, -50, 50);
  Tensor b = random_tensor({1, 3}, DType::F16);
  Tensor skip = empty({0}, DType::F64);
  Tensor c = cat({a, skip, b}, 0);
  EXPECT_EQ(c.dtype(), DType::F64);  // the skipped tensor still takes part in promotion, as in PyTorch
  ASSERT_EQ(c.sizes(), (Shape{3, 3}));
  auto va = dvec(a), vb = dvec(b), vc = dvec(c);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(vc[i], va[i]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(vc[6 + i], vb[i]);
  EXPECT_EQ(cat({a, b}).dtype(), DType::F16);
}

TEST(Cat, NonContiguousInputsAlongLastDim) {
  Tensor a = random_tensor({4, 3}, DType::F32).t();           // [3, 4] transposed
  Tensor b = random_tensor({3, 10}, DType::F32).slice(1, 1, 9, 4);  // [3, 2] strided
  Tensor c = cat({a, b}, -1);
  ASSERT_EQ(c.sizes(), (Shape{3, 6}));
  auto va = dvec(a), vb = dvec(b), vc = dvec(c);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j) EXPECT_EQ(vc[i * 6 + j], va[i * 4 + j]);
    for (int j = 0; j < 2; ++j) EXPECT_EQ(vc[i * 6 + 4 + j], vb[i * 2 + j]);
  }
}

TEST(Cat, ZeroSizeAlongDimAndAllSkipped) {
  Tensor a = random_tensor({2, 0}, DType::F32), b = random_tensor({2, 3}, DType::F32);
  EXPECT_TRUE(equal(cat({a, b}, 1), b));
  Tensor e = cat({empty({0}), empty({0}, DType::I64)});
  EXPECT_EQ(e.sizes(), (Shape{0}));
  EXPECT_EQ(e.dtype(), DType::F32);
}

TEST(Cat, InvalidCallsNameTensorAndShapes) {
  EXPECT_TRUE(throws_error([] { cat({zeros({2, 3}), zeros({3, 4})}); }, {"cat", "tensor 1", "[3, 4]", "[2, 3]"}));
  EXPECT_TRUE(throws_error([] { cat({zeros({2, 3}), zeros({2, 3, 1})}); }, {"cat", "tensor 1"}));
  EXPECT_TRUE(throws_error([] { cat({}); }, {"cat", "non-empty"}));
  EXPECT_TRUE(throws_error([] { cat({scalar_tensor(1.0)}); }, {"cat", "zero-dimensional"}));
  EXPECT_TRUE(throws_error([] { cat({zeros({2, 3})}, 2); }, {"cat", "dim 2"}));
}

TEST(Stack, InsertsDimAndPromotes) {
  Tensor a = random_int_tensor({2, 3}, DType::I32, -9, 9);
  Tensor b = random_tensor({3, 2}, DType::F32).t();  // non-contiguous [2, 3]
  Tensor s = stack({a, b}, -1);
  ASSERT_EQ(s.sizes(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.dtype(), DType::F32);
  auto va = dvec(a), vb = dvec(b), vs = dvec(s);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(vs[2 * i], va[i]);
    EXPECT_EQ(vs[2 * i + 1], vb[i]);
  }
  EXPECT_EQ(stack({scalar_tensor(1.0), scalar_tensor(2.0)}).sizes(), (Shape{2}));
  EXPECT_TRUE(throws_error([] { stack({zeros({2, 3}), zeros({2, 4})}); }, {"stack", "[2, 4]", "entry 1"}));
}

// ---- split / chunk ------------------------------------------------------------------------------------

TEST(Split, ViewsAliasTheSource) {
  Tensor x = random_tensor({5, 3}, DType::F32);
  auto parts = split(x, 2);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].sizes(), (Shape{2, 3}));
  EXPECT_EQ(parts[2].sizes(), (Shape{1, 3}));
  for (auto& p : parts) EXPECT_TRUE(p.is_alias_of(x));
  parts[2].fill_(7.0);
  EXPECT_EQ(x.to_vector<float>()[12], 7.f);
  auto cols = split_with_sizes(x, {1, 0, 2}, 1);
  ASSERT_EQ(cols.size(), 3u);
  EXPECT_EQ(cols[1].sizes(), (Shape{5, 0}));
  EXPECT_EQ(dvec(cols[2])[1], dvec(x)[2]);
  EXPECT_EQ(split(empty({0}), 3).size(), 1u);
}

TEST(Chunk, UsesPyTorchSizing) {
  auto sizes = [](const std::vector<Tensor>& v) {
    std::vector<int64_t> s;
    for (auto& t : v) s.push_back(t.size(0));
    return s;
  };
  EXPECT_EQ(sizes(chunk(zeros({6}), 4)), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(sizes(chunk(zeros({5}), 4)), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(sizes(chunk(zeros({0}), 3)), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(sizes(chunk(zeros({7, 2}), 7)), (std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1}));
}

TEST(Split, InvalidCalls) {
  EXPECT_TRUE(throws_error([] { split_with_sizes(zeros({5}), {2, 2}); }, {"split_with_sizes", "[2, 2]", "5"}));
  EXPECT_TRUE(throws_error([] { split_with_sizes(zeros({5}), {6, -1}); }, {"non-negative"}));
  EXPECT_TRUE(throws_error([] { split(zeros({3}), 0); }, {"split", "0"}));
  EXPECT_TRUE(throws_error([] { chunk(zeros({3}), 0); }, {"chunk", "greater than 0"}));
  EXPECT_TRUE(throws_error([] { split(scalar_tensor(1.0), 1); }, {"split", "0-d"}));
}

// ---- index_select / gather / take ----------------------------------------------------------------------

TEST(IndexSelect, MatchesLoopForEveryDimWithI32AndStridedIndex) {
  for (DType it : {DType::I64, DType::I32}) {
    Tensor x = random_tensor({6, 5, 4}, DType::F64).permute({1, 0, 2});  // [5, 6, 4], non-contiguous
    for (int64_t dim = 0; dim < 3; ++dim) {
      Tensor idx = random_int_tensor({8}, it, 0, x.size(dim) - 1).slice(0, 0, 8, 2);  // stride 2
      Tensor out = index_select(x, dim, idx);
      Shape s = x.sizes();
      s[dim] = 4;
      ASSERT_EQ(out.sizes(), s);
      auto vx = dvec(x), vo = dvec(out);
      auto vi = ivec(idx);
      for_each_index(s, [&](const std::vector<int64_t>& p) {
        auto q = p;
        q[dim] = vi[p[dim]];
        EXPECT_EQ(vo[flat(s, p)], vx[flat(x.sizes(), q)]);
      });
    }
  }
}

TEST(IndexSelect, AllDtypesAndZeroDim) {
  for (DType t : {DType::Bool, DType::U8, DType::I16, DType::F16, DType::BF16, DType::I32, DType::F32,
                  DType::C64, DType::I64, DType::F64, DType::F8E4M3}) {
    Tensor x = random_tensor({4, 3}, DType::F64, -3, 3).to(t);
    Tensor out = index_select(x, 0, from_vector<int64_t>({3, 0, 3}));
    EXPECT_TRUE(equal(out.select(0, 0), x.select(0, 3))) << dtype_name(t);
    EXPECT_TRUE(equal(out.select(0, 1), x.select(0, 0))) << dtype_name(t);
  }
  Tensor s = scalar_tensor(2.5);
  EXPECT_EQ(index_select(s, 0, from_vector<int64_t>({0})).dim(), 0);
  EXPECT_EQ(index_select(zeros({3}), 0, scalar_tensor(1, DType::I64)).sizes(), (Shape{1}));
  EXPECT_EQ(index_select(zeros({3, 2}), 1, empty({0}, DType::I64)).sizes(), (Shape{3, 0}));
}

TEST(IndexSelect, OutOfRangeAndNegativeIndicesAreErrors) {
  Tensor x = zeros({3, 4});
  EXPECT_TRUE(throws_error([&] { index_select(x, 1, from_vector<int64_t>({0, 4})); }, {"index_select", "index 4", "size 4"}));
  EXPECT_TRUE(throws_error([&] { index_select(x, 1, from_vector<int32_t>({-1})); }, {"index -1", "size 4"}));
  EXPECT_TRUE(throws_error([&] { index_select(x, 0, from_vector<float>({0.f})); }, {"index_select", "int64", "float32"}));
  EXPECT_TRUE(throws_error([&] { index_select(x, 0, zeros({1, 1}, DType::I64)); }, {"index_select", "vector"}));
}

TEST(Gather, MatchesLoopWithNonContiguousInputAndIndex) {
  for (DType it : {DType::I64, DType::I32}) {
    Tensor x = random_tensor({5, 4}, DType::F32).t();  // [4, 5]
    for (int64_t dim : {0, 1, -1}) {
      const int64_t d = dim < 0 ? dim + 2 : dim;
      // index [3, 7] (dim 1) or [6, 3] (dim 0) transposed: smaller than x off dim, any size along dim.
      Shape is = d == 0 ? Shape{3, 6} : Shape{7, 3};
      Tensor idx = random_int_tensor(is, it, 0, x.size(d) - 1).t();
      Tensor out = gather(x, dim, idx);
      ASSERT_EQ(out.sizes(), idx.sizes());
      auto vx = dvec(x), vo = dvec(out);
      auto vi = ivec(idx);
      for_each_index(idx.sizes(), [&](const std::vector<int64_t>& p) {
        auto q = p;
        q[d] = vi[flat(idx.sizes(), p)];
        EXPECT_EQ(vo[flat(idx.sizes(), p)], vx[flat(x.sizes(), q)]);
      });
    }
  }
}

TEST(Gather, InvalidCallsNameIndexAndBound) {
  Tensor x = zeros({3, 4});
  EXPECT_TRUE(throws_error([&] { gather(x, 1, from_vector<int64_t>({0, 5}, Shape{1, 2})); }, {"gather", "index 5", "size 4"}));
  EXPECT_TRUE(throws_error([&] { gather(x, 1, from_vector<int64_t>({-1}, Shape{1, 1})); }, {"index -1"}));
  EXPECT_TRUE(throws_error([&] { gather(x, 1, zeros({4, 1}, DType::I64)); }, {"gather", "[4, 1]", "[3, 4]"}));
  EXPECT_TRUE(throws_error([&] { gather(x, 1, zeros({3}, DType::I64)); }, {"gather", "dims"}));
  EXPECT_EQ(gather(x, 1, zeros({0, 5}, DType::I64)).sizes(), (Shape{0, 5}));
  EXPECT_EQ(gather(scalar_tensor(3.0), 0, scalar_tensor(0, DType::I64)).item<double>(), 3.0);
}

TEST(Take, FlatIndicesWrapNegativeAndKeepIndexShape) {
  Tensor x = random_tensor({4, 3}, DType::BF16).t();  // [3, 4] non-contiguous: "as if contiguous" order
  Tensor idx = from_vector<int64_t>({0, -1, 5, -12, 11, 7}, Shape{2, 3});
  Tensor out = take(x, idx);
  ASSERT_EQ(out.sizes(), (Shape{2, 3}));
  auto vx = dvec(x), vo = dvec(out);
  const int64_t want[] = {0, 11, 5, 0, 11, 7};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(vo[i], vx[want[i]]);
  EXPECT_TRUE(equal(take(x, from_vector<int32_t>({-2})), from_vector<double>({vx[10]}).to(DType::BF16)));
  EXPECT_TRUE(throws_error([&] { take(x, from_vector<int64_t>({12})); }, {"take", "index 12", "12 elements"}));
  EXPECT_TRUE(throws_error([&] { take(x, from_vector<int64_t>({-13})); }, {"take", "index -13"}));
  EXPECT_TRUE(throws_error([&] { take(empty({0}), from_vector<int64_t>({0})); }, {"take", "empty"}));
  EXPECT_EQ(take(empty({0}), empty({0}, DType::I64)).numel(), 0);
}

// ---- scatter ------------------------------------------------------------------------------------------

TEST(Scatter, MatchesLoopWithNonContiguousSrcAndIndex) {
  for (int64_t dim : {0, 1}) {
    Tensor x = random_tensor({4, 5}, DType::F64);
    // Distinct indices per line so the result does not depend on write order.
    const int64_t len = dim == 0 ? 3 : 4, other = dim == 0 ? 5 : 4;
    std::vector<int64_t> iv;
    std::vector<int64_t> perm(x.size(dim));
    for (int64_t l = 0; l < other; ++l) {
      for (int64_t i = 0; i < x.size(dim); ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng());
      for (int64_t j = 0; j < len; ++j) iv.push_back(perm[j]);
    }
    // iv is laid out [other, len]; transpose when dim == 0 to get [len, other].
    Tensor idx = from_vector<int64_t>(iv, Shape{other, len});
    if (dim == 0) idx = idx.t();
    Tensor src = random_tensor({idx.size(1) + 2, idx.size(0) + 1}, DType::F64).t();  // larger, transposed
    Tensor out = scatter(x, dim, idx, src);
    auto expect = dvec(x);
    auto vi = ivec(idx);
    auto vs = dvec(src);
    for_each_index(idx.sizes(), [&](const std::vector<int64_t>& p) {
      auto q = p;
      q[dim] = vi[flat(idx.sizes(), p)];
      expect[flat(x.sizes(), q)] = vs[flat(src.sizes(), p)];
    });
    EXPECT_EQ(dvec(out), expect);
    Tensor y = x.clone();
    scatter_(y, dim, idx, src);
    EXPECT_TRUE(equal(y, out));
  }
}

TEST(Scatter, ScalarValueIsConvertedToSelfDtype) {
  Tensor x = zeros({3}, DType::I32);
  Tensor out = scatter(x, 0, from_vector<int64_t>({2, 0}), 2.7);
  EXPECT_EQ(ivec(out), (std::vector<int64_t>{2, 0, 2}));
  EXPECT_TRUE(throws_error([&] { scatter(x, 0, from_vector<int64_t>({0}), 1e20); }, {"scatter", "overflow"}));
  EXPECT_EQ(ivec(x), (std::vector<int64_t>{0, 0, 0}));
}

TEST(Scatter, OutOfRangeIndexLeavesSelfUnchanged) {
  Tensor self = random_tensor({3, 4}, DType::F32);
  const Tensor before = self.clone();
  // Good indices first, the bad one last: every index is validated before any write.
  Tensor idx = from_vector<int64_t>({0, 1, 2, 3, 0, 1, 2, 9}, Shape{2, 4});
  Tensor src = ones({2, 4});
  EXPECT_TRUE(throws_error([&] { scatter_(self, 1, idx, src); }, {"scatter_", "index 9", "size 4"}));
  EXPECT_TRUE(equal(self, before));
  EXPECT_TRUE(throws_error([&] { scatter_add_(self, 1, idx, src); }, {"scatter_add_", "index 9"}));
  EXPECT_TRUE(equal(self, before));
  EXPECT_TRUE(throws_error([&] { scatter_(self, 0, from_vector<int32_t>({-1}, Shape{1, 1}), src); }, {"index -1"}));
  EXPECT_TRUE(equal(self, before));
}

TEST(Scatter, InvalidShapesAndDtypes) {
  Tensor x = zeros({3, 4});
  EXPECT_TRUE(throws_error([&] { scatter(x, 1, zeros({2, 2}, DType::I64), ones({1, 3})); }, {"scatter", "[2, 2]", "[1, 3]"}));
  EXPECT_TRUE(throws_error([&] { scatter(x, 1, zeros({4, 2}, DType::I64), ones({4, 2})); }, {"scatter", "[4, 2]", "[3, 4]"}));
  EXPECT_TRUE(throws_error([&] { scatter(x, 1, zeros({1, 1}, DType::I64), ones({1, 1}, DType::F64)); }, {"same dtype", "float64"}));
  Tensor ex = zeros({1, 4}).expand({3, 4});
  EXPECT_TRUE(throws_error([&] { scatter_(ex, 1, zeros({1, 1}, DType::I64), ones({1, 1})); }, {"scatter_", "share memory"}));
}

TEST(ScatterAdd, DuplicateIndicesAccumulate) {
  for (DType t : {DType::F32, DType::F64, DType::I64, DType::I8, DType::C64}) {
    Tensor x = random_int_tensor({3, 5}, t == DType::C64 ? DType::F32 : t, -5, 5).to(t);
    Tensor idx = random_int_tensor({8, 5}, DType::I64, 0, 2);  // many duplicates
    Tensor src = random_int_tensor({5, 9}, t == DType::C64 ? DType::F32 : t, -5, 5).to(t).t();  // [9, 5] strided
    Tensor out = scatter_add(x, 0, idx, src);
    auto expect = dvec(x);
    auto vi = ivec(idx);
    auto vs = dvec(src);
    for_each_index(idx.sizes(), [&](const std::vector<int64_t>& p) {
      expect[vi[flat(idx.sizes(), p)] * 5 + p[1]] += vs[p[0] * 5 + p[1]];
    });
    EXPECT_EQ(dvec(out), expect) << dtype_name(t);
  }
}

TEST(ScatterAdd, IntegerOverflowWrapsAndBoolIsOr) {
  Tensor x = full({1}, 127, DType::I8);
  EXPECT_EQ(ivec(scatter_add(x, 0, zeros({2}, DType::I64), ones({2}, DType::I8))), (std::vector<int64_t>{-127}));
  Tensor b = zeros({3}, DType::Bool);
  Tensor r = scatter_add(b, 0, from_vector<int64_t>({0, 0}), ones({2}, DType::Bool));
  EXPECT_EQ(ivec(r), (std::vector<int64_t>{1, 0, 0}));
}

TEST(ScatterAdd, HalfTypesAccumulateInFloatAndRoundOnce) {
  // PyTorch 2.11 (CPU) gives 3000 for f16 and 3008 for bf16 here; rounding after every addition would
  // stop at 2048 (f16) / 256 (bf16).
  Tensor idx = zeros({3000}, DType::I64);
  EXPECT_EQ(scatter_add(zeros({3}, DType::F16), 0, idx, ones({3000}, DType::F16)).to_vector<double>()[0], 3000.0);
  EXPECT_EQ(scatter_add(zeros({3}, DType::BF16), 0, idx, ones({3000}, DType::BF16)).to_vector<double>()[0], 3008.0);
  Tensor h = zeros({2}, DType::F16);
  scatter_add_(h, 0, from_vector<int64_t>({1, 1}), full({2}, 0.5, DType::F16));
  EXPECT_EQ(dvec(h), (std::vector<double>{0.0, 1.0}));
}

// ---- masked_fill --------------------------------------------------------------------------------------

TEST(MaskedFill, BroadcastMaskAndValueConversion) {
  Tensor x = random_tensor({4, 3}, DType::F32).t();  // [3, 4] non-contiguous
  Tensor mask = from_vector<bool>({true, false, false, true});  // broadcasts over rows
  Tensor out = masked_fill(x, mask, -0.0);
  auto vx = dvec(x), vo = dvec(out);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) {
      const bool m = j == 0 || j == 3;
      EXPECT_EQ(vo[i * 4 + j], m ? 0.0 : vx[i * 4 + j]);
      if (m) EXPECT_TRUE(std::signbit(vo[i * 4 + j]));
    }
  EXPECT_EQ(dvec(x), vx);  // out of place
  EXPECT_EQ(ivec(masked_fill(zeros({2}, DType::I64), ones({2}, DType::Bool), 1.5)), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(ivec(masked_fill(zeros({2}, DType::U8), ones({2}, DType::Bool), -1)), (std::vector<int64_t>{255, 255}));
  EXPECT_TRUE(std::isnan(dvec(masked_fill(zeros({1}, DType::F16), ones({1}, DType::Bool), NAN))[0]));
  EXPECT_EQ(masked_fill(zeros({3}), zeros({2, 1}, DType::Bool), 1).sizes(), (Shape{2, 3}));
}

TEST(MaskedFill, InvalidCalls) {
  EXPECT_TRUE(throws_error([] { masked_fill(zeros({3}), zeros({3}, DType::I64), 1); }, {"masked_fill", "boolean", "int64"}));
  EXPECT_TRUE(throws_error([] { masked_fill(zeros({3}, DType::I8), ones({3}, DType::Bool), 300); }, {"masked_fill", "300", "int8"}));
  EXPECT_TRUE(throws_error([] { masked_fill(zeros({3}, DType::F16), ones({3}, DType::Bool), 70000.0); }, {"overflow"}));
  EXPECT_TRUE(throws_error([] { masked_fill(zeros({3}), ones({4}, DType::Bool), 1); }, {"broadcast"}));
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// Large enough for the threaded paths (lines handed to threads, gather rows in parallel).
TEST(ScatterAdd, LargeThreadedMatchesLoop) {
  Tensor x = zeros({64, 40}, DType::I64);
  Tensor idx = random_int_tensor({2000, 40}, DType::I64, 0, 63);
  Tensor src = random_int_tensor({2000, 40}, DType::I64, -1000, 1000);
  auto vi = ivec(idx), vs = ivec(src);
  std::vector<int64_t> expect(64 * 40, 0);
  for (int64_t i = 0; i < 2000; ++i)
    for (int64_t j = 0; j < 40; ++j) expect[vi[i * 40 + j] * 40 + j] += vs[i * 40 + j];
  EXPECT_EQ(ivec(scatter_add(x, 0, idx, src)), expect);
  Tensor g = gather(src, 0, random_int_tensor({3000, 40}, DType::I64, 0, 1999));
  EXPECT_EQ(g.sizes(), (Shape{3000, 40}));
}

}  // namespace
}  // namespace kiln::test
