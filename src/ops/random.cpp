// Random ops: rand, randn, randint, uniform_, normal_, and the default generator.
#include <cmath>
#include <limits>
#include <mutex>

#include "core/copy.h"
#include "core/dispatch.h"
#include "cpu/random.h"
#include "kiln/ops.h"
#include "ops/generator_offset.h"

#if KILN_HAVE_CUDA
#include "cuda/random.h"
#endif

namespace kiln {

namespace {
std::mutex& default_generator_mutex() {
  static std::mutex m;
  return m;
}

// (seed, offset) for one call; the default generator is shared by all threads, so its offset is taken
// under a lock (a caller's own Generator is the caller's to synchronise).
std::pair<uint64_t, uint64_t> take_offset(Generator* gen) {
  if (gen != nullptr) return {gen->seed(), gen->next_offset()};
  std::lock_guard<std::mutex> lock(default_generator_mutex());
  Generator& g = default_generator();
  return {g.seed(), g.next_offset()};
}

// Only a build without the CUDA backend refuses CUDA tensors.
void check_backend(Device device, const char* op) {
#if !KILN_HAVE_CUDA
  KILN_CHECK(!device.is_cuda(), op, ": no CUDA implementation yet (device ", device, ")");
#else
  // Say which op wanted the GPU (the allocator's error would not).
  if (device.is_cuda()) KILN_CHECK(cuda_available(), op, ": CUDA is not available (device ", device, ")");
#endif
}

void check_float_dtype(DType dtype, const char* op) {
  KILN_CHECK(is_floating(dtype) && !is_float8(dtype), op, ": dtype ", dtype_name(dtype),
             " is not supported; supported: float16, bfloat16, float32, float64");
}

// Runs fill on a contiguous tensor and copies into t when t is a strided view: element i of the stream
// is element i of t in row-major order either way.
template <class Fill>
void fill_logical(Tensor& t, Fill&& fill) {
  if (t.is_contiguous()) {
    fill(t);
  } else {
    Tensor tmp = empty(t.sizes(), t.dtype(), t.device());
    fill(tmp);
    t.copy_(tmp);
  }
}
}  // namespace

std::pair<uint64_t, uint64_t> take_generator_offset(Generator* gen) { return take_offset(gen); }

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(default_generator_mutex());
  default_generator().manual_seed(seed);
}

Tensor& uniform_(Tensor& t, double from, double to, Generator* gen) {
  check_float_dtype(t.dtype(), "uniform_");
  KILN_CHECK(std::isfinite(from) && std::isfinite(to), "uniform_: from and to must be finite, got from=", from,
             " to=", to);
  KILN_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from, " > to=", to);
  check_backend(t.device(), "uniform_");
  note_write(t);
  const auto [seed, offset] = take_offset(gen);
#if KILN_HAVE_CUDA
  if (t.is_cuda()) {
    cuda::uniform_fill(t, from, to, seed, offset);  // writes through t's strides
    return t;
  }
#endif
  fill_logical(t, [&](Tensor& c) { cpu::uniform_fill(c, from, to, seed, offset); });
  return t;
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  check_float_dtype(t.dtype(), "normal_");
  KILN_CHECK(std >= 0.0, "normal_ expects std >= 0.0, but found std ", std);
  check_backend(t.device(), "normal_");
  note_write(t);
  const auto [seed, offset] = take_offset(gen);
#if KILN_HAVE_CUDA
  if (t.is_cuda()) {
    cuda::normal_fill(t, mean, std, seed, offset);  // writes through t's strides
    return t;
  }
#endif
  fill_logical(t, [&](Tensor& c) { cpu::normal_fill(c, mean, std, seed, offset); });
  return t;
}

Tensor rand(const Shape& sizes, DType dtype, Device device, Generator* gen) {
  check_float_dtype(dtype, "rand");
  check_backend(device, "rand");
  Tensor t = empty(sizes, dtype, device);
  return uniform_(t, 0.0, 1.0, gen);
}

Tensor randn(const Shape& sizes, DType dtype, Device device, Generator* gen) {
  check_float_dtype(dtype, "randn");
  check_backend(device, "randn");
  Tensor t = empty(sizes, dtype, device);
  return normal_(t, 0.0, 1.0, gen);
}

Tensor randint(int64_t low, int64_t high, const Shape& sizes, DType dtype, Device device, Generator* gen) {
  KILN_CHECK(low < high, "randint expects 'low' to be less than 'high', but got low=", low, " >= high=", high);
  KILN_CHECK(!is_complex(dtype) && !is_float8(dtype), "randint: dtype ", dtype_name(dtype),
             " is not supported; supported: bool, integer and float16/bfloat16/float32/float64 dtypes");
  if (is_integral(dtype, /*include_bool=*/true)) {
    // Both ends of [low, high - 1] must be values of the dtype (PyTorch checks the same).
    const bool ok = visit_dtypes<kIntTypes | kBoolType>(dtype, "randint", [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto fits = [](int64_t v) {
        if constexpr (std::is_same_v<T, bool>) return v == 0 || v == 1;
        else if constexpr (std::is_same_v<T, uint64_t>) return v >= 0;
        else return v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                    v <= static_cast<int64_t>(std::numeric_limits<T>::max());
      };
      return fits(low) && fits(high - 1);
    });
    KILN_CHECK(ok, "randint: range [", low, ", ", high, ") is out of bounds for dtype ", dtype_name(dtype));
  }
  check_backend(device, "randint");
  Tensor t = empty(sizes, dtype, device);
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  const auto [seed, offset] = take_offset(gen);
#if KILN_HAVE_CUDA
  if (t.is_cuda()) {
    cuda::randint_fill(t, low, range, seed, offset);
    return t;
  }
#endif
  cpu::randint_fill(t, low, range, seed, offset);
  return t;
}

}  // namespace kiln
