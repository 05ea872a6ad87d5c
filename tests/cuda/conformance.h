// The CUDA conformance harness: every op runs on CUDA and on the CPU from the same fresh random inputs,
// laid out the same way (contiguous, transposed, broadcast, sliced, zero-size, 0-d, large), and the results
// are compared with the dtype's tolerance. Outputs the op allocates are checked in full; ops with out=
// forms are run on poisoned outputs by their tests.
//
// Perf mode: KILN_CONFORMANCE_PERF=1 also times every CUDA case (CUDA events, median of 50 after warm-up)
// and prints one line per case.
#pragma once

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kiln/runtime.h"
#include "test_util.h"

namespace kiln::test {

enum class Layout { Contiguous, Transposed, Broadcast, Sliced, ZeroSize, Scalar0d, Large };

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous: return "contiguous";
    case Layout::Transposed: return "transposed";
    case Layout::Broadcast: return "broadcast";
    case Layout::Sliced: return "sliced";
    case Layout::ZeroSize: return "zero-size";
    case Layout::Scalar0d: return "0-d";
    default: return "large";
  }
}
inline const std::vector<Layout>& all_layouts() {
  static const std::vector<Layout> v = {Layout::Contiguous, Layout::Transposed, Layout::Broadcast,
                                        Layout::Sliced,     Layout::ZeroSize,   Layout::Scalar0d,
                                        Layout::Large};
  return v;
}

// The logical shape a layout class uses for an elementwise-style test.
inline Shape layout_shape(Layout l) {
  switch (l) {
    case Layout::ZeroSize: return {0, 7};
    case Layout::Scalar0d: return {};
    case Layout::Large: return {1031, 1537};  // odd sizes: tails of vectorised paths
    default: return {37, 53};
  }
}

struct Pair {
  Tensor cpu, cuda;
};

// A CPU tensor and its CUDA twin holding the same values with the same sizes and strides.
//   Transposed: the last two dims are a transposed view of a contiguous buffer.
//   Broadcast:  dim 0 is expanded from size 1 (stride 0).
//   Sliced:     every other element of a twice-as-wide buffer along the last dim, from offset 1.
inline Pair make_pair(const Shape& shape, DType dtype, Layout layout, double lo = -2.0, double hi = 2.0) {
  Tensor base_cpu;
  auto view_of = [&](const Tensor& base) -> Tensor {
    switch (layout) {
      case Layout::Transposed:
        return shape.size() >= 2 ? base.transpose(-1, -2) : base;
      case Layout::Broadcast: {
        if (shape.empty()) return base;
        Shape s = shape;
        return base.expand(s);
      }
      case Layout::Sliced:
        return shape.empty() ? base : base.slice(-1, 1, std::nullopt, 2);
      default: return base;
    }
  };
  Shape base_shape = shape;
  if (layout == Layout::Transposed && shape.size() >= 2) std::swap(base_shape[shape.size() - 1], base_shape[shape.size() - 2]);
  if (layout == Layout::Broadcast && !shape.empty()) base_shape[0] = 1;
  if (layout == Layout::Sliced && !shape.empty()) base_shape.back() = shape.back() * 2 + 1;
  if (is_integral(dtype, true))
    base_cpu = random_int_tensor(base_shape, dtype, static_cast<int64_t>(lo), static_cast<int64_t>(hi));
  else
    base_cpu = random_tensor(base_shape, dtype, lo, hi);
  Tensor base_cuda = base_cpu.to(cuda_device(0));
  Pair p{view_of(base_cpu), view_of(base_cuda)};
  EXPECT_EQ(p.cpu.sizes(), shape);
  EXPECT_EQ(p.cpu.strides(), p.cuda.strides());
  return p;
}

inline bool perf_mode() {
  const char* v = std::getenv("KILN_CONFORMANCE_PERF");
  return v && v[0] == '1';
}

// Median microseconds of fn on the current CUDA stream (events; 5 warm-ups, 50 timed runs).
inline double time_cuda_us(const std::function<void()>& fn) {
  const Device d = cuda_device(0);
  for (int i = 0; i < 5; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < 50; ++i) {
    Event a(true), b(true);
    a.record(current_stream(d));
    fn();
    b.record(current_stream(d));
    b.synchronize();
    t.push_back(1000.0 * b.elapsed_ms(a));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Runs `op` on the CPU inputs and on the CUDA inputs and compares the outputs (all of them, for ops that
// return several). `name` labels failures and perf lines.
inline void expect_conformant(const std::string& name, const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& op,
                              const std::vector<Pair>& inputs, std::optional<Tolerance> tol = std::nullopt) {
  SCOPED_TRACE(name);
  std::vector<Tensor> cpu_in, cuda_in;
  for (const auto& p : inputs) {
    cpu_in.push_back(p.cpu);
    cuda_in.push_back(p.cuda);
  }
  const std::vector<Tensor> want = op(cpu_in);
  const std::vector<Tensor> got = op(cuda_in);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].is_cuda()) << "output " << i << " is not on the GPU";
    EXPECT_EQ(got[i].dtype(), want[i].dtype()) << "output " << i;
    EXPECT_TRUE(all_close(got[i].to(kCPU), want[i], tol)) << "output " << i;
  }
  if (perf_mode()) {
    const double us = time_cuda_us([&] { (void)op(cuda_in); });
    std::printf("[perf] %-60s %10.2f us\n", name.c_str(), us);
  }
}

inline std::vector<Tensor> one(Tensor t) { return {std::move(t)}; }

}  // namespace kiln::test
