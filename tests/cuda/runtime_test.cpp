// Streams, events, graphs and the caching allocator on a real GPU (skipped without one).
#include <thread>

#include "kiln/runtime.h"
#include "spin.h"
#include "test_util.h"

namespace kiln {
namespace {

const Device kGpu = cuda_device(0);

TEST(CudaRuntime, InfoNamesTheDevice) {
  KILN_REQUIRE_CUDA();
  const DeviceProperties p = device_properties(kGpu);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GE(p.major, 7);
  EXPECT_GT(p.multiprocessors, 0);
  EXPECT_GT(p.total_memory, int64_t{1} << 30);
  EXPECT_TRUE(p.kernels_compiled);
  EXPECT_GT(cuda_driver_version(), 0);
  EXPECT_GT(cuda_runtime_version(), 0);
}

TEST(CudaRuntime, StreamGuardSetsAndRestoresTheCurrentStream) {
  KILN_REQUIRE_CUDA();
  EXPECT_TRUE(current_stream(kGpu).is_default());
  Stream s = Stream::create(kGpu);
  {
    StreamGuard g(s);
    EXPECT_EQ(current_stream(kGpu), s);
    Stream inner = Stream::create(kGpu, -1);
    {
      StreamGuard g2(inner);
      EXPECT_EQ(current_stream(kGpu), inner);
    }
    EXPECT_EQ(current_stream(kGpu), s);
  }
  EXPECT_TRUE(current_stream(kGpu).is_default());
}

TEST(CudaRuntime, CurrentStreamIsPerThread) {
  KILN_REQUIRE_CUDA();
  Stream s = Stream::create(kGpu);
  StreamGuard g(s);
  bool other_default = false;
  std::thread t([&] { other_default = current_stream(kGpu).is_default(); });
  t.join();
  EXPECT_TRUE(other_default);
}

TEST(CudaRuntime, PriorityIsClampedToTheDeviceRange) {
  KILN_REQUIRE_CUDA();
  Stream hi = Stream::create(kGpu, -1000);
  Stream lo = Stream::create(kGpu, 1000);
  EXPECT_LE(hi.priority(), lo.priority());
}

TEST(CudaRuntime, EventsOrderAndTimeWork) {
  KILN_REQUIRE_CUDA();
  Stream s = Stream::create(kGpu);
  Event start(true), stop(true);
  start.record(s);
  test::spin_then_write(s, 20.0);
  stop.record(s);
  EXPECT_FALSE(stop.query());  // the spin is still running
  stop.synchronize();
  EXPECT_TRUE(stop.query());
  const float ms = stop.elapsed_ms(start);
  EXPECT_GT(ms, 10.f);
  EXPECT_LT(ms, 2000.f);
  EXPECT_LT(start.elapsed_ms(stop), 0.f);  // reversed order gives a negative interval
  Event untimed;
  untimed.record(s);
  EXPECT_TRUE(test::throws_error([&] { untimed.elapsed_ms(start); }, {"enable_timing"}));
}

TEST(CudaRuntime, EventWaitOrdersStreams) {
  KILN_REQUIRE_CUDA();
  Stream a = Stream::create(kGpu), b = Stream::create(kGpu);
  Tensor flag;
  {
    StreamGuard g(a);
    flag = zeros({1}, DType::I32, kGpu);
  }
  a.synchronize();
  test::spin_then_write(a, 20.0, flag.data_ptr(), 7);
  Event e;
  e.record(a);
  e.wait(b);
  Tensor host = empty({1}, DType::I32);
  {
    StreamGuard g(b);  // the copy runs on b, which waits for a's write
    host.copy_(flag);
  }
  EXPECT_EQ(host.item<int32_t>(), 7);
}

TEST(CudaAllocator, FreedBlocksAreReusedOnTheSameStream) {
  KILN_REQUIRE_CUDA();
  void* first = nullptr;
  {
    Tensor t = empty({1 << 20}, DType::U8, kGpu);
    first = t.data_ptr();
  }
  Tensor u = empty({1 << 20}, DType::U8, kGpu);
  EXPECT_EQ(u.data_ptr(), first);
}

TEST(CudaAllocator, RepeatedMidSizeAllocationsReuseTheCache) {
  KILN_REQUIRE_CUDA();
  // 6 MiB requests share 20 MiB segments: a loop that frees each one must not grow the reservation.
  { Tensor warm = empty({6 << 20}, DType::U8, kGpu); }
  const int64_t reserved = memory_stats(kGpu).reserved;
  for (int i = 0; i < 50; ++i) {
    Tensor t = empty({(6 << 20) + 4096 * i}, DType::U8, kGpu);
    t.fill_(1);
  }
  EXPECT_EQ(memory_stats(kGpu).reserved, reserved);
}

TEST(CudaAllocator, RecordStreamProtectsABlockInUseOnAnotherStream) {
  KILN_REQUIRE_CUDA();
  Stream side = Stream::create(kGpu);
  void* first = nullptr;
  {
    Tensor t = empty({1 << 20}, DType::U8, kGpu);
    first = t.data_ptr();
    test::spin_then_write(side, 100.0, t.data_ptr(), 1);  // side stream still writes t after the free
    t.record_stream(side);
  }
  Tensor u = empty({1 << 20}, DType::U8, kGpu);
  EXPECT_NE(u.data_ptr(), first) << "memory still in use on the side stream was handed out again";
  side.synchronize();
  u = Tensor();
  Tensor w = empty({1 << 20}, DType::U8, kGpu);  // the deferred free is collected now
  Tensor x = empty({1 << 20}, DType::U8, kGpu);
  EXPECT_TRUE(w.data_ptr() == first || x.data_ptr() == first);
}

TEST(CudaAllocator, StatsAddUp) {
  KILN_REQUIRE_CUDA();
  empty_cache(kGpu);
  reset_peak_memory_stats(kGpu);
  const MemoryStats before = memory_stats(kGpu);
  const int64_t bytes = int64_t{256} << 20;
  {
    Tensor t = empty({bytes}, DType::U8, kGpu);
    const MemoryStats during = memory_stats(kGpu);
    EXPECT_GE(during.allocated - before.allocated, bytes);
    EXPECT_LE(during.allocated, during.reserved);
    EXPECT_LE(during.reserved, during.driver_used);
    EXPECT_GE(during.allocated_peak, during.allocated);
    EXPECT_GE(during.driver_used_peak, during.driver_used);
  }
  const MemoryStats after = memory_stats(kGpu);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_GE(after.reserved, before.reserved + bytes);  // cached, not returned
  EXPECT_GE(after.allocated_peak, before.allocated + bytes);
  empty_cache(kGpu);
  EXPECT_EQ(memory_stats(kGpu).reserved, before.reserved);
  reset_peak_memory_stats(kGpu);
  EXPECT_EQ(memory_stats(kGpu).allocated_peak, memory_stats(kGpu).allocated);
}

TEST(CudaAllocator, OutOfMemoryIsAnErrorAndTheDeviceStaysUsable) {
  KILN_REQUIRE_CUDA();
  const int64_t total = device_properties(kGpu).total_memory;
  const int64_t ooms = memory_stats(kGpu).num_ooms;
  try {
    (void)empty({total * 2}, DType::U8, kGpu);
    ADD_FAILURE() << "allocating twice the device's memory succeeded";
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(total * 2)), std::string::npos) << msg;
    EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
  }
  EXPECT_EQ(memory_stats(kGpu).num_ooms, ooms + 1);
  Tensor ok = full({1000}, 5, DType::I32, kGpu);
  EXPECT_EQ(ok.to(kCPU).to_vector<int32_t>()[999], 5);
}

TEST(CudaGraph, CapturedFillsReplayWithTheirPrivateMemory) {
  KILN_REQUIRE_CUDA();
  Stream s = Stream::create(kGpu);
  Graph g;
  Tensor out;
  g.capture(s, [&] {
    out = empty({4096}, DType::F32, kGpu);
    out.fill_(3.5);
    Tensor tmp = empty({123}, DType::F32, kGpu);  // freed inside the capture: reused from the private pool
    tmp.fill_(1.0);
  });
  ASSERT_TRUE(g.captured());
  g.replay();
  s.synchronize();
  EXPECT_TRUE(test::equal(out.to(kCPU), full({4096}, 3.5, DType::F32)));
}

TEST(CudaGraph, CaptureOnTheDefaultStreamIsRefused) {
  KILN_REQUIRE_CUDA();
  Graph g;
  EXPECT_TRUE(test::throws_error([&] { g.capture(Stream::default_stream(kGpu), [] {}); }, {"created stream"}));
}

TEST(CudaGraph, ASyncInsideCaptureFailsTheCapture) {
  KILN_REQUIRE_CUDA();
  Stream s = Stream::create(kGpu);
  Graph g;
  EXPECT_THROW(g.capture(s, [&] { synchronize(kGpu); }), Error);
  // The device and stream stay usable.
  StreamGuard guard(s);
  Tensor t = full({8}, 2, DType::I64, kGpu);
  EXPECT_EQ(t.to(kCPU).to_vector<int64_t>()[7], 2);
}

}  // namespace
}  // namespace kiln
