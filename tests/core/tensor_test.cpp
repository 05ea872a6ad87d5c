#include <fstream>
#include <functional>
#include <vector>

#include "kiln/nn.h"
#include "kiln/runtime.h"
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

// Every kiln op that writes into an existing tensor drops the constant mark of its storage (the promise no
// longer holds, so later one-row products must wait for the writer); ops that only read a tensor keep it. Each
// write goes through a view, which shares the storage and so its mark.
void expect_writes_drop_the_mark(Device dev) {
  const auto marked = [&](const Shape& s, DType t = DType::F32) {
    Tensor x = test::random_tensor(s, t, -2.0, 2.0, dev);
    mark_constant(x);
    return x;
  };
  const auto rnd = [&](const Shape& s, DType t = DType::F32) { return test::random_tensor(s, t, -2.0, 2.0, dev); };
  const auto pos = [&](std::vector<int32_t> v) { return from_vector<int32_t>(v).to(dev); };
  struct Write {
    const char* op;
    std::function<void(Tensor&)> run;  // writes into (a view of) the [4, 8] f32 tensor it is given
  };
  const std::vector<Write> writes = {
      {"copy_", [&](Tensor& w) { w.narrow(0, 1, 2).copy_(rnd({2, 8})); }},
      {"fill_", [&](Tensor& w) { w.narrow(1, 2, 3).fill_(1.5); }},
      {"zero_", [&](Tensor& w) { w.narrow(0, 3, 1).zero_(); }},
      {"add_", [&](Tensor& w) { Tensor v = w.narrow(0, 0, 2); add_(v, rnd({2, 8})); }},
      {"mul_ (scalar)", [&](Tensor& w) { Tensor v = w.t(); mul_(v, 2.0); }},
      {"div_", [&](Tensor& w) { Tensor v = w.narrow(1, 0, 4); div_(v, rnd({4, 4}, DType::F32)); }},
      {"clamp_", [&](Tensor& w) { Tensor v = w.narrow(0, 2, 2); clamp_(v, -1.0, 1.0); }},
      {"masked_fill_", [&](Tensor& w) { Tensor v = w.narrow(0, 0, 1); masked_fill_(v, gt(rnd({1, 8}), 0.0), 3.0); }},
      {"neg_", [&](Tensor& w) { Tensor v = w.narrow(0, 1, 1); neg_(v); }},
      {"add_out", [&](Tensor& w) { Tensor v = w.narrow(0, 0, 2); add_out(v, rnd({2, 8}), rnd({2, 8})); }},
      {"exp_out", [&](Tensor& w) { Tensor v = w.narrow(0, 0, 2); exp_out(v, rnd({2, 8})); }},
      {"uniform_", [&](Tensor& w) { Tensor v = w.narrow(0, 1, 2); uniform_(v); }},
      {"normal_", [&](Tensor& w) { Tensor v = w.narrow(0, 1, 2); normal_(v); }},
      {"scatter_", [&](Tensor& w) {
         Tensor v = w.narrow(0, 0, 2);
         scatter_(v, 1, from_vector<int64_t>({0, 3, 5, 7}, Shape{2, 2}).to(dev), rnd({2, 2}));
       }},
      {"scatter_add_", [&](Tensor& w) {
         Tensor v = w.narrow(0, 2, 2);
         scatter_add_(v, 1, from_vector<int64_t>({1, 2, 4, 6}, Shape{2, 2}).to(dev), rnd({2, 2}));
       }},
      {"add_rms_norm (residual)", [&](Tensor& w) { add_rms_norm(rnd({4, 8}), w, rnd({8}), 1e-6); }},
  };
  for (const Write& c : writes) {
    SCOPED_TRACE(c.op);
    Tensor w = marked({4, 8});
    ASSERT_TRUE(w.storage()->constant());
    c.run(w);
    EXPECT_FALSE(w.storage()->constant());
  }
  {  // rope_ writes q and k, each a view of its own marked buffer
    Tensor qb = marked({2, 3, 8}), kb = marked({2, 2, 8});
    Tensor q = qb.narrow(1, 0, 2), k = kb.narrow(1, 1, 1);
    rope_(q, k, pos({3, 7}), 10000.0);
    EXPECT_FALSE(qb.storage()->constant());
    EXPECT_FALSE(kb.storage()->constant());
  }
  {  // the cache appends write both caches (and qk_norm_rope_append_ its q)
    Tensor kc = marked({1, 2, 6, 8}), vc = marked({1, 2, 6, 8});
    kv_cache_append_(kc, vc, rnd({1, 2, 1, 8}), rnd({1, 2, 1, 8}), pos({2}));
    EXPECT_FALSE(kc.storage()->constant());
    EXPECT_FALSE(vc.storage()->constant());
    Tensor q = marked({1, 4, 8}), kc2 = marked({1, 2, 6, 8}), vc2 = marked({1, 2, 6, 8});
    const Tensor qn = marked({8}), kn = marked({8}), inv = rope_inv_freq(8, 10000.0, dev);
    qk_norm_rope_append_(q, rnd({1, 2, 8}), rnd({1, 2, 8}), qn, kn, 1e-6, pos({4}), inv, 1.0, kc2, vc2, pos({4}));
    EXPECT_FALSE(q.storage()->constant());
    EXPECT_FALSE(kc2.storage()->constant());
    EXPECT_FALSE(vc2.storage()->constant());
    EXPECT_TRUE(qn.storage()->constant() && kn.storage()->constant());  // read only
  }
  {  // sample's offset counter is advanced in place
    Tensor offset = from_vector<int64_t>({5}).to(dev);
    mark_constant(offset);
    SamplingParams sp;
    sample(rnd({1, 16}), sp, 1234, offset);
    EXPECT_FALSE(offset.storage()->constant());
  }
  // Ops that only read a marked tensor keep the mark.
  Tensor w = marked({4, 8}), g = marked({8});
  Tensor x = rnd({1, 8});
  (void)linear(x, w);
  (void)rms_norm(w, g, 1e-6);
  (void)add(w, w);
  (void)w.clone();
  (void)w.to(DType::BF16);
  Tensor dst = rnd({4, 8});
  dst.copy_(w);  // w is the source
  EXPECT_TRUE(w.storage()->constant());
  EXPECT_TRUE(g.storage()->constant());
}

TEST(Tensor, KilnWritesDropTheConstantMarkCpu) { expect_writes_drop_the_mark(kCPU); }

TEST(Tensor, KilnWritesDropTheConstantMarkCuda) {
  KILN_REQUIRE_CUDA();
  expect_writes_drop_the_mark(Device(DeviceType::CUDA, 0));
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

// Freed host blocks of 256 KiB to 64 MiB serve the next allocation of their size class (src/core/storage.cpp),
// whatever it holds (empty() promises nothing about the contents); other sizes, and every block under ASan or
// with KILN_HOST_CACHE=0, go back to the C library.
TEST(HostMemory, FreedMidSizeBlocksServeTheNextAllocationOfTheirClass) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the host block cache is left out of ASan builds";
#else
  const char* v = std::getenv("KILN_HOST_CACHE");
  if (v != nullptr && std::string(v) == "0") GTEST_SKIP() << "KILN_HOST_CACHE=0";
  void* first = nullptr;
  {
    Tensor a = empty({1 << 18}, DType::F32);  // 1 MiB
    a.fill_(3.0);
    first = a.data_ptr();
  }
  Tensor b = empty({(1 << 18) - 5}, DType::F32);  // the same class (1 MiB rounded up)
  EXPECT_EQ(b.data_ptr(), first);
  b.fill_(1.0);
  EXPECT_EQ(sum(b).item<double>(), static_cast<double>((1 << 18) - 5));
  Tensor c = empty({1 << 18}, DType::F32);  // b holds the block: a fresh one
  EXPECT_NE(c.data_ptr(), first);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data_ptr()) % 64, 0u);
#endif
}

// A full block cache makes room for the block freed now: blocks of a size no longer in use (here 60 MiB ones,
// filling the 256 MiB cap) give way, and the next allocation of the new size takes the freed block as it was
// (its contents intact: not fresh pages).
TEST(HostMemory, AFullCacheMakesRoomForTheSizeInUse) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the host block cache is left out of ASan builds";
#else
  const char* v = std::getenv("KILN_HOST_CACHE");
  if (v != nullptr && std::string(v) == "0") GTEST_SKIP() << "KILN_HOST_CACHE=0";
  {
    std::vector<Tensor> big;
    for (int i = 0; i < 5; ++i) big.push_back(empty({int64_t{60} << 20}, DType::U8));
  }
  const int64_t n = (int64_t{20} << 20) + 4096;
  void* first = nullptr;
  {
    Tensor a = empty({n}, DType::U8);
    a.fill_(7);
    first = a.data_ptr();
  }
  const Tensor b = empty({n}, DType::U8);
  EXPECT_EQ(b.data_ptr(), first);
  EXPECT_EQ(sum(b).item<int64_t>(), 7 * n);
#endif
}

// Blocks of 2 MiB and more are anonymous mappings of their own starting on a 2 MiB boundary (transparent huge
// pages; src/core/storage.cpp), whole pages long whatever their size, and freeing one unmaps all of it: the
// process's mappings do not grow over many allocations.
TEST(HostMemory, LargeBlocksStartOnAHugePageBoundaryAndGoBackWhole) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan builds take every block from the C library";
#else
  const char* v = std::getenv("KILN_HUGE_PAGES");
  if (v != nullptr && std::string(v) == "0") GTEST_SKIP() << "KILN_HUGE_PAGES=0";
  const auto mappings = [] {
    std::ifstream maps("/proc/self/maps");
    int64_t n = 0;
    for (std::string line; std::getline(maps, line);) ++n;
    return n;
  };
  // 2 MiB exactly, past it by an odd count, above the cache's 64 MiB.
  for (int64_t bytes : {int64_t{2} << 20, (int64_t{2} << 20) + 12345, (int64_t{70} << 20) + 3}) {
    Tensor t = empty({bytes}, DType::U8);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % (uintptr_t{2} << 20), 0u) << bytes;
    t.fill_(1);
    EXPECT_EQ(sum(t).item<int64_t>(), bytes);
  }
  const int64_t before = mappings();
  for (int i = 0; i < 40; ++i) {
    Tensor t = empty({(int64_t{70} << 20) + 3 * i}, DType::U8);  // never cached: mapped and unmapped each time
    t.data<uint8_t>()[t.numel() - 1] = static_cast<uint8_t>(i);
  }
  EXPECT_LE(mappings(), before + 2);
#endif
}

}  // namespace
}  // namespace kiln
