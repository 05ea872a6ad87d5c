#include <chrono>
#include <iostream>

#include "commands.h"
#include "kiln/ops.h"

namespace kiln::cli {

int run_demo(const std::string& device_name, int repeats) {
  const Device device = device_name == "auto" ? (cuda_available() ? cuda_device(0) : kCPU)
                                              : Device::parse(device_name);
  std::cout << "demo on " << device << "\n";
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, Shape{2, 3}, device);
  std::cout << "a = " << a << "\n";
  (void)repeats;
  return 0;
}

}  // namespace kiln::cli
