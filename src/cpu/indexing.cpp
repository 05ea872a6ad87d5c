#include "cpu/indexing.h"

#include <cstring>

#include "core/dispatch.h"
#include "cpu/loops.h"

namespace kiln::cpu {

namespace {

inline int64_t read_index(const char* p, bool i32) {
  return i32 ? static_cast<int64_t>(*reinterpret_cast<const int32_t*>(p)) : *reinterpret_cast<const int64_t*>(p);
}

// Calls f with a TypeTag of the unsigned integer type as wide as one element: data movement needs no more.
template <class F>
void visit_itemsize(size_t size, F&& f) {
  switch (size) {
    case 1: f(TypeTag<uint8_t>{}); return;
    case 2: f(TypeTag<uint16_t>{}); return;
    case 4: f(TypeTag<uint32_t>{}); return;
    case 8: f(TypeTag<uint64_t>{}); return;
  }
  throw Error(str("indexing: unsupported element size ", size));
}

}  // namespace

std::optional<int64_t> find_bad_index(const Tensor& index, int64_t lo, int64_t hi) {
  const bool i32 = index.dtype() == DType::I32;
  std::optional<int64_t> bad;
  // Serial on purpose: the first bad value in order is what the error reports, and this pass is cheap
  // next to the data movement it protects.
  StridedLoop<1> loop(index.sizes(), {&index});
  loop.for_each_row(
      [&](char* const* p, int64_t n, const int64_t* s) {
        if (bad) return;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t v = read_index(p[0] + i * s[0], i32);
          if (v < lo || v >= hi) {
            bad = v;
            return;
          }
        }
      },
      /*parallel=*/false);
  return bad;
}

void gather_elements(const Tensor& out, const Tensor& src_r, const Tensor& idx_r, int64_t dim_stride,
                     int64_t wrap) {
  const bool i32 = idx_r.dtype() == DType::I32;
  visit_itemsize(out.itemsize(), [&](auto tag) {
    using U = typename decltype(tag)::type;
    const int64_t step = dim_stride * static_cast<int64_t>(sizeof(U));
    StridedLoop<3> loop(out.sizes(), {&out, &src_r, &idx_r});
    loop.for_each_row([&](char* const* p, int64_t n, const int64_t* s) {
      for (int64_t i = 0; i < n; ++i) {
        int64_t k = read_index(p[2] + i * s[2], i32);
        if (k < 0) k += wrap;
        std::memcpy(p[0] + i * s[0], p[1] + i * s[1] + k * step, sizeof(U));
      }
    });
  });
}

namespace {

// Calls line(index_off, src_off, self_off) (byte offsets) for every line of `index` along dim, in parallel
// over lines: a line writes only self positions sharing its coordinates off dim, so lines never collide.
template <class Line>
void for_each_line(const Tensor& self, int64_t dim, const Tensor& index, const Tensor* src, Line&& line) {
  const int64_t nd = index.dim();
  const int64_t len = index.size(dim);
  if (index.numel() == 0) return;
  const int64_t lines = index.numel() / len;
  const int64_t isz = static_cast<int64_t>(index.itemsize()), ssz = static_cast<int64_t>(self.itemsize());
  auto body = [&](int64_t l) {
    int64_t io = 0, so = 0, xo = 0;
    for (int64_t d = nd - 1; d >= 0 && l > 0; --d) {
      if (d == dim) continue;
      const int64_t c = l % index.size(d);
      l /= index.size(d);
      io += c * index.stride(d) * isz;
      if (src) so += c * src->stride(d) * ssz;
      xo += c * self.stride(d) * ssz;
    }
    line(io, so, xo);
  };
  if (index.numel() >= kParallelGrain && lines > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t l = 0; l < lines; ++l) body(l);
  } else {
    for (int64_t l = 0; l < lines; ++l) body(l);
  }
}

}  // namespace

void scatter_elements(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src, const void* value,
                      bool add) {
  const bool i32 = index.dtype() == DType::I32;
  const Tensor* srcp = src.defined() ? &src : nullptr;
  char* const xb = static_cast<char*>(self.data_ptr());
  const char* const ib = static_cast<const char*>(index.data_ptr());
  const char* const sb = srcp ? static_cast<const char*>(src.data_ptr()) : nullptr;
  const int64_t len = index.size(dim);
  const int64_t istep = index.stride(dim) * static_cast<int64_t>(index.itemsize());
  auto run = [&](auto tag, auto op) {
    using T = typename decltype(tag)::type;
    const int64_t xstep = self.stride(dim) * static_cast<int64_t>(sizeof(T));
    const int64_t sstep = srcp ? src.stride(dim) * static_cast<int64_t>(sizeof(T)) : 0;
    T v{};
    if (!srcp) std::memcpy(&v, value, sizeof(T));
    for_each_line(self, dim, index, srcp, [&](int64_t io, int64_t so, int64_t xo) {
      for (int64_t j = 0; j < len; ++j) {
        const int64_t k = read_index(ib + io + j * istep, i32);
        T* dst = reinterpret_cast<T*>(xb + xo + k * xstep);
        const T s = srcp ? *reinterpret_cast<const T*>(sb + so + j * sstep) : v;
        *dst = op(*dst, s);
      }
    });
  };
  if (!add) {
    visit_itemsize(self.itemsize(), [&](auto tag) {
      using U = typename decltype(tag)::type;
      run(tag, [](U, U s) { return s; });
    });
    return;
  }
  visit_dtypes<dset(DType::F32, DType::F64) | kIntTypes | kBoolType | kComplexTypes>(self.dtype(), "scatter_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    run(tag, [](T a, T b) -> T {
      if constexpr (std::is_same_v<T, bool>) {
        return a || b;
      } else if constexpr (std::is_same_v<T, Complex64>) {
        return Complex64(a.re + b.re, a.im + b.im);
      } else if constexpr (std::is_integral_v<T>) {
        // Wrapping sum without signed-overflow UB.
        using UT = std::make_unsigned_t<T>;
        return static_cast<T>(static_cast<UT>(static_cast<UT>(a) + static_cast<UT>(b)));
      } else {
        return a + b;
      }
    });
  });
}

void masked_fill(const Tensor& out, const Tensor& mask, const void* value) {
  visit_itemsize(out.itemsize(), [&](auto tag) {
    using U = typename decltype(tag)::type;
    U v;
    std::memcpy(&v, value, sizeof(U));
    StridedLoop<2> loop(out.sizes(), {&out, &mask});
    loop.for_each_row([&](char* const* p, int64_t n, const int64_t* s) {
      for (int64_t i = 0; i < n; ++i)
        if (*reinterpret_cast<const bool*>(p[1] + i * s[1])) std::memcpy(p[0] + i * s[0], &v, sizeof(U));
    });
  });
}

}  // namespace kiln::cpu
