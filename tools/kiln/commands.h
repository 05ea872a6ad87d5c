#pragma once

#include <string>

namespace kiln::cli {
int run_info(bool memory);
int run_demo(const std::string& device, int repeats);
int run_inspect(const std::string& path, bool read, const std::string& device);
}  // namespace kiln::cli
