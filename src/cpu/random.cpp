// CPU kernels for random numbers: every element is a pure function of (seed, offset, index) (see
// core/philox.h), so the OpenMP split cannot change the result.
#include "cpu/random.h"

#include "core/dispatch.h"
#include "core/philox.h"
#include "ops/dropout_math.h"

namespace kiln::cpu {

namespace {
// Calls f(i) for i in [0, n), in parallel when large enough.
template <class F>
void parallel_index(int64_t n, F&& f) {
  if (n >= 16384) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) f(i);
  } else {
    for (int64_t i = 0; i < n; ++i) f(i);
  }
}

template <class T>
constexpr int uniform_bits() {
  if constexpr (std::is_same_v<T, Half>) return 11;
  else if constexpr (std::is_same_v<T, BFloat16>) return 8;
  else return 24;
}
}  // namespace

void uniform_fill(Tensor& out, double from, double to, uint64_t seed, uint64_t offset) {
  visit_dtypes<kFloatTypes>(out.dtype(), "uniform_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = out.data<T>();
    if constexpr (std::is_same_v<T, double>) {
      const double range = to - from;
      parallel_index(out.numel(), [&](int64_t i) {
        p[i] = philox_uniform_double(philox_element(seed, offset, static_cast<uint64_t>(i))) * range + from;
      });
    } else {
      const float f = static_cast<float>(from), range = static_cast<float>(to) - static_cast<float>(from);
      parallel_index(out.numel(), [&](int64_t i) {
        const float u = philox_uniform_float(philox_element(seed, offset, static_cast<uint64_t>(i)),
                                             uniform_bits<T>());
        p[i] = convert<T>(u * range + f);
      });
    }
  });
}

void normal_fill(Tensor& out, double mean, double std, uint64_t seed, uint64_t offset) {
  visit_dtypes<kFloatTypes>(out.dtype(), "normal_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = out.data<T>();
    parallel_index(out.numel(), [&](int64_t i) {
      const double z = philox_normal(philox_element(seed, offset, static_cast<uint64_t>(i)));
      p[i] = convert<T>(mean + std * z);
    });
  });
}

void randint_fill(Tensor& out, int64_t low, uint64_t range, uint64_t seed, uint64_t offset) {
  visit_dtypes<kIntTypes | kFloatTypes | kBoolType>(out.dtype(), "randint", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = out.data<T>();
    parallel_index(out.numel(), [&](int64_t i) {
      const uint64_t r = philox_u64(philox_element(seed, offset, static_cast<uint64_t>(i))) % range;
      p[i] = convert<T>(static_cast<int64_t>(static_cast<uint64_t>(low) + r));
    });
  });
}

void dropout_apply(Tensor& out, const Tensor& x, double p, double ka, double kb, double drop, uint64_t seed,
                   uint64_t offset) {
  visit_dtypes<kFloatTypes>(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const DropoutRule<C> rule{seed, offset, static_cast<float>(p), static_cast<C>(ka), static_cast<C>(kb),
                              static_cast<C>(drop)};
    const T* in = x.data<T>();
    T* o = out.data<T>();
    const int64_t n = x.numel();
    parallel_index((n + 3) / 4, [&](int64_t g) {
      const PhiloxOut block = rule.block(static_cast<uint64_t>(g));
      for (int j = 0; j < 4 && 4 * g + j < n; ++j) o[4 * g + j] = convert<T>(rule.apply(convert<C>(in[4 * g + j]), block, j));
    });
  });
}

}  // namespace kiln::cpu
