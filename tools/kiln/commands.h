#pragma once

#include <string>

namespace kiln::cli {
int run_info(bool memory);
int run_demo(const std::string& device, int repeats);
}  // namespace kiln::cli
