// `kiln bench ops`: the operator benchmark's case table (bench_ops_cases.cpp) and runner (bench_ops.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/device.h"

namespace kiln::cli {

// One call of the op under test on one copy of its inputs.
using BenchCall = std::function<void()>;

// A benchmark case. bench/torch_ops.py holds the same cases under the same names with the same byte counts;
// `kiln bench ops --list` and `python3 bench/torch_ops.py --list` print both tables for comparison.
struct OpCase {
  // Stable and regex-friendly: "<op>/<dtype>/<shape parts>[/<variant>]", the op first so that
  // `--filter '^linear/'` selects a family; the section headers of the output are the op names.
  std::string name;
  int64_t bytes = 0;       // bytes one call must move: every input read once, every output written once
  int64_t copy_bytes = 0;  // bytes of one copy of the inputs (what rotates through HBM between calls)
  int max_copies = 256;    // upper bound on copies (see copies_for in bench_ops.cpp)
  // False for an op that synchronises with the host on every call (torch.linalg's raising forms read info):
  // it cannot be captured in a graph, and only its eager time is measured, on both sides.
  bool graph = true;
  // Allocates one copy of fresh random inputs on the device (on the current stream) and returns a call on
  // them. Called once per copy; the call may run many times (in place ops keep their values bounded).
  std::function<BenchCall(Device)> make;
};

// Every case, in the order they run.
std::vector<OpCase> op_cases();

}  // namespace kiln::cli
