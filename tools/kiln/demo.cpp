// `kiln demo`: a few operators on the best available device, their results checked against the CPU, and
// their median times. A smoke test a person can read, not a benchmark suite (that is `kiln bench`).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <functional>
#include <iostream>
#include <vector>

#include "commands.h"
#include "kiln/ops.h"
#include "kiln/runtime.h"

namespace kiln::cli {

namespace {
// Median milliseconds of fn: CUDA events on a GPU (the work is asynchronous), the steady clock on the CPU.
double median_ms(Device device, int repeats, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    if (device.is_cuda()) {
      Event a(true), b(true);
      a.record(current_stream(device));
      fn();
      b.record(current_stream(device));
      b.synchronize();
      t.push_back(b.elapsed_ms(a));
    } else {
      const auto a = std::chrono::steady_clock::now();
      fn();
      t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
    }
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

const char* verdict(const Tensor& got, const Tensor& want, double rtol, double atol) {
  const Tensor diff = abs(sub(got.to(kCPU).to(DType::F64), want.to(DType::F64)));
  const Tensor bound = add(abs(want.to(DType::F64)) * rtol, full({}, atol, DType::F64));
  return all(le(diff, bound)).item<bool>() ? "matches the CPU" : "DIFFERS FROM THE CPU";
}
}  // namespace

int run_demo(const std::string& device_name, int repeats) {
  const Device device = device_name == "auto" ? (cuda_available() ? cuda_device(0) : kCPU)
                                              : Device::parse(device_name);
  std::cout << "demo on " << device << "\n\n";
  manual_seed(42);
  Tensor a = arange(6, DType::F32, device).view({2, 3});
  Tensor b = ones({3}, DType::BF16, device);
  std::cout << "a = arange(6).view({2, 3})\n" << a << "\n";
  std::cout << "a + bf16 ones(3)      (broadcast, promotes to f32)\n" << (a + b) << "\n";
  std::cout << "sum(a, {1})\n" << sum(a, {1}) << "\n";
  std::cout << "matmul(a, a.t())\n" << matmul(a, a.t()) << "\n";
  std::cout << "exp(a).to(f16)\n" << exp(a).to(DType::F16) << "\n";
  std::cout << "randn({2, 4}) with seed 42 (the same numbers on every device)\n" << randn({2, 4}, DType::F32, device)
            << "\n";
  std::cout << "u32 4e9 > i32 -1: " << std::boolalpha
            << gt(from_vector<uint32_t>({4000000000u}, std::nullopt, device),
                  from_vector<int32_t>({-1}, std::nullopt, device))
                   .item<bool>()
            << "\n\n";

  std::printf("%-36s %10s %14s  %s\n", "operator (f32 unless noted)", "median ms", "rate", "check");
  const int64_t n = 1 << 24;
  Tensor xh = randn({n}), yh = randn({n});
  Tensor x = xh.to(device), y = yh.to(device);
  const double bytes = 4.0 * n;
  double ms = median_ms(device, repeats, [&] { (void)add(x, y); });
  std::printf("%-36s %10.3f %9.1f GB/s  %s\n", "add [16M] + [16M]", ms, 3 * bytes / ms / 1e6,
              verdict(add(x, y), add(xh, yh), 0, 0));
  ms = median_ms(device, repeats, [&] { (void)exp(x); });
  std::printf("%-36s %10.3f %9.1f GB/s  %s\n", "exp [16M]", ms, 2 * bytes / ms / 1e6,
              verdict(exp(x), exp(xh), 4e-6, 1e-6));
  ms = median_ms(device, repeats, [&] { (void)sum(x); });
  std::printf("%-36s %10.3f %9.1f GB/s  %s\n", "sum [16M]", ms, bytes / ms / 1e6, verdict(sum(x), sum(xh), 1e-5, 1e-3));
  Tensor mh = randn({4096, 4096}), m = mh.to(device);
  ms = median_ms(device, repeats, [&] { (void)sum(m, {0}); });
  std::printf("%-36s %10.3f %9.1f GB/s  %s\n", "sum [4096, 4096] over dim 0", ms, 4.0 * m.numel() / ms / 1e6,
              verdict(sum(m, {0}), sum(mh, {0}), 1e-5, 1e-4));
  const int64_t k = device.is_cuda() ? 4096 : 512;
  Tensor ph = randn({k, k}), qh = randn({k, k});
  Tensor p = ph.to(device), q = qh.to(device);
  const double flops = 2.0 * k * k * k;
  char label[64];
  std::snprintf(label, sizeof label, "mm %lldx%lldx%lld", static_cast<long long>(k), static_cast<long long>(k),
                static_cast<long long>(k));
  ms = median_ms(device, repeats, [&] { (void)mm(p, q); });
  std::printf("%-36s %10.3f %9.2f TF/s  %s\n", label, ms, flops / ms / 1e9,
              verdict(mm(p, q), mm(ph, qh), 1e-4, 1e-3 * std::sqrt(static_cast<double>(k))));
  Tensor pb = p.to(DType::BF16), qb = q.to(DType::BF16);
  std::snprintf(label + std::strlen(label), sizeof label - std::strlen(label), " bf16");
  ms = median_ms(device, repeats, [&] { (void)mm(pb, qb); });
  std::printf("%-36s %10.3f %9.2f TF/s  %s\n", label, ms, flops / ms / 1e9,
              verdict(mm(pb, qb), mm(pb.to(kCPU), qb.to(kCPU)), 2e-2, 1e-2 * std::sqrt(static_cast<double>(k))));
  if (device.is_cuda()) {
    Tensor big = randn({1 << 26});
    ms = median_ms(kCPU, std::max(3, repeats / 4), [&] { (void)big.to(device); });
    std::printf("%-36s %10.3f %9.1f GB/s\n", "copy host -> cuda [64M f32]", ms, 4.0 * (1 << 26) / ms / 1e6);
    const MemoryStats st = memory_stats(device);
    std::printf("\nmemory on %s: tensors %.1f MiB (peak %.1f), allocator reserved %.1f MiB (peak %.1f), driver %.1f MiB "
                "(peak %.1f)\n",
                device.str().c_str(), st.allocated / 1048576.0, st.allocated_peak / 1048576.0, st.reserved / 1048576.0,
                st.reserved_peak / 1048576.0, st.driver_used / 1048576.0, st.driver_used_peak / 1048576.0);
  }
  return 0;
}

}  // namespace kiln::cli
