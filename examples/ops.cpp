// A few kiln ops on the CPU (and the GPU when there is one), each checked against the CPU.
#include <kiln/nn.h>
#include <kiln/ops.h>
#include <kiln/runtime.h>

#include <cmath>
#include <iostream>

int main() {
  using namespace kiln;
  manual_seed(1);
  const Tensor x = randn({4, 64});
  const Tensor w = randn({32, 64});
  const Tensor y = softmax(linear(x, w), -1);
  std::cout << "softmax(linear(x, w)) row sums: " << sum(y, {-1}) << "\n";
  const double err = std::abs(sum(y).item<double>() - 4.0);
  if (err > 1e-4) {
    std::cerr << "row sums do not add to 4 (off by " << err << ")\n";
    return 1;
  }
  if (cuda_available()) {
    const Tensor g = softmax(linear(x.to(cuda_device(0)), w.to(cuda_device(0))), -1).cpu();
    const double diff = amax(abs(g - y)).item<double>();
    std::cout << "cuda vs cpu: max |difference| " << diff << "\n";
    if (diff > 1e-5) return 1;
  }
  std::cout << "ok\n";
  return 0;
}
