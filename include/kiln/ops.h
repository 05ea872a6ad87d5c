// Tensor operators: creation, random numbers, elementwise math, reductions, indexing, matmul.
// Every op runs on the device of its inputs (all tensor inputs must share one device) and, on a GPU,
// enqueues on the current stream without blocking the host. Semantics follow PyTorch unless noted.
#pragma once

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// ---------------------------------------------------------------------------------------------------------
// Creation
Tensor empty(const Shape& sizes, DType dtype = kDefaultFloat, Device device = kCPU);
Tensor zeros(const Shape& sizes, DType dtype = kDefaultFloat, Device device = kCPU);
Tensor ones(const Shape& sizes, DType dtype = kDefaultFloat, Device device = kCPU);
// dtype defaults to the value's natural dtype (bool, i64, f32 for a float value, c64).
Tensor full(const Shape& sizes, const Scalar& value, std::optional<DType> dtype = std::nullopt,
            Device device = kCPU);
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, const Scalar& value);
// A 0-d tensor holding a value.
Tensor scalar_tensor(const Scalar& value, std::optional<DType> dtype = std::nullopt, Device device = kCPU);
// A tensor holding a copy of host values (shape defaults to {values.size()}).
template <class T>
Tensor from_vector(const std::vector<T>& values, std::optional<Shape> sizes = std::nullopt,
                   Device device = kCPU);
// [start, end) by step. dtype defaults to i64 when all three are integers, else f32.
Tensor arange(const Scalar& end, std::optional<DType> dtype = std::nullopt, Device device = kCPU);
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step = 1,
              std::optional<DType> dtype = std::nullopt, Device device = kCPU);
Tensor linspace(double start, double end, int64_t steps, DType dtype = kDefaultFloat, Device device = kCPU);
Tensor logspace(double start, double end, int64_t steps, double base = 10.0, DType dtype = kDefaultFloat,
                Device device = kCPU);
Tensor eye(int64_t n, std::optional<int64_t> m = std::nullopt, DType dtype = kDefaultFloat,
           Device device = kCPU);

// ---------------------------------------------------------------------------------------------------------
// Random numbers. A counter-based Philox4x32-10 generator: element i of a call's output is a function of
// (seed, offset, i) only, so CPU and CUDA give the same numbers for the same seed (docs/architecture.md
// defines the stream). Each call advances the generator's offset by one.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0x4B494C4EULL) : seed_(seed) {}
  void manual_seed(uint64_t seed) { seed_ = seed; offset_ = 0; }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }
  // Returns the offset for this call and advances.
  uint64_t next_offset() { return offset_++; }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};
Generator& default_generator();
void manual_seed(uint64_t seed);  // seeds the default generator

Tensor rand(const Shape& sizes, DType dtype = kDefaultFloat, Device device = kCPU, Generator* gen = nullptr);
Tensor randn(const Shape& sizes, DType dtype = kDefaultFloat, Device device = kCPU, Generator* gen = nullptr);
// Integers uniform in [low, high).
Tensor randint(int64_t low, int64_t high, const Shape& sizes, DType dtype = DType::I64, Device device = kCPU,
               Generator* gen = nullptr);
// In-place fills.
Tensor& uniform_(Tensor& t, double from = 0.0, double to = 1.0, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);

// ---------------------------------------------------------------------------------------------------------
// Type promotion
// The dtype PyTorch's result_type gives for these operands: tensors with dims outrank 0-d tensors, which
// outrank Scalars; a lower-ranked operand only raises the result's category (integer -> floating -> complex).
DType result_type(const std::vector<Tensor>& tensors, const std::vector<Scalar>& scalars = {});

// ---------------------------------------------------------------------------------------------------------
// Elementwise, unary. Float ops on integer inputs compute in the default float dtype (as PyTorch does).
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor exp2(const Tensor& x);
Tensor expm1(const Tensor& x);
Tensor log(const Tensor& x);
Tensor log2(const Tensor& x);
Tensor log10(const Tensor& x);
Tensor log1p(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor square(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tan(const Tensor& x);
Tensor asin(const Tensor& x);
Tensor acos(const Tensor& x);
Tensor atan(const Tensor& x);
Tensor sinh(const Tensor& x);
Tensor cosh(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, std::string_view approximate = "none");  // "none" (erf) or "tanh"
Tensor erf(const Tensor& x);
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor round(const Tensor& x, int64_t decimals = 0);  // half to even
Tensor trunc(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor signbit(const Tensor& x);
Tensor isnan(const Tensor& x);
Tensor isinf(const Tensor& x);
Tensor isfinite(const Tensor& x);
Tensor logical_not(const Tensor& x);
Tensor bitwise_not(const Tensor& x);
// x = mantissa * 2^exponent with |mantissa| in [0.5, 1); exponent is i32. Subnormals are exact.
std::pair<Tensor, Tensor> frexp(const Tensor& x);

// In place (the result must be representable in x's dtype, as in PyTorch).
Tensor& neg_(Tensor& x);
Tensor& abs_(Tensor& x);
Tensor& exp_(Tensor& x);
Tensor& log_(Tensor& x);
Tensor& sqrt_(Tensor& x);
Tensor& rsqrt_(Tensor& x);
Tensor& sigmoid_(Tensor& x);
Tensor& silu_(Tensor& x);
Tensor& relu_(Tensor& x);
Tensor& tanh_(Tensor& x);
Tensor& floor_(Tensor& x);
Tensor& ceil_(Tensor& x);
Tensor& round_(Tensor& x);

// ---------------------------------------------------------------------------------------------------------
// Elementwise, binary (broadcasting, type promotion as result_type).
Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor add(const Tensor& a, const Scalar& b, const Scalar& alpha = 1);
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor sub(const Tensor& a, const Scalar& b, const Scalar& alpha = 1);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Scalar& b);
// rounding_mode: none (true division, integers promote to float), "trunc" or "floor".
Tensor div(const Tensor& a, const Tensor& b, std::optional<std::string_view> rounding_mode = std::nullopt);
Tensor div(const Tensor& a, const Scalar& b, std::optional<std::string_view> rounding_mode = std::nullopt);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Scalar& b);
Tensor pow(const Scalar& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);  // NaN propagates
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor fmod(const Tensor& a, const Tensor& b);       // sign of a
Tensor fmod(const Tensor& a, const Scalar& b);
Tensor remainder(const Tensor& a, const Tensor& b);  // sign of b (Python %)
Tensor remainder(const Tensor& a, const Scalar& b);
Tensor atan2(const Tensor& a, const Tensor& b);
Tensor heaviside(const Tensor& x, const Tensor& values);
Tensor bitwise_and(const Tensor& a, const Tensor& b);
Tensor bitwise_or(const Tensor& a, const Tensor& b);
Tensor bitwise_xor(const Tensor& a, const Tensor& b);
Tensor bitwise_left_shift(const Tensor& a, const Tensor& b);
Tensor bitwise_right_shift(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
// Comparisons give bool and compare exact values, also across signed and unsigned integers
// (u32 4e9 > i32 -1 is true).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Scalar& b);
Tensor ne(const Tensor& a, const Scalar& b);
Tensor lt(const Tensor& a, const Scalar& b);
Tensor le(const Tensor& a, const Scalar& b);
Tensor gt(const Tensor& a, const Scalar& b);
Tensor ge(const Tensor& a, const Scalar& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Scalar& b);
Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max);
Tensor clamp(const Tensor& x, const std::optional<Tensor>& min, const std::optional<Tensor>& max);

// In place and out= forms: the result is cast to self's/out's dtype when PyTorch allows it (no float
// result into an integer tensor); out is resized when its shape differs and it is not a view.
Tensor& add_(Tensor& self, const Tensor& other, const Scalar& alpha = 1);
Tensor& add_(Tensor& self, const Scalar& other, const Scalar& alpha = 1);
Tensor& sub_(Tensor& self, const Tensor& other, const Scalar& alpha = 1);
Tensor& mul_(Tensor& self, const Tensor& other);
Tensor& mul_(Tensor& self, const Scalar& other);
Tensor& div_(Tensor& self, const Tensor& other);
Tensor& div_(Tensor& self, const Scalar& other);
Tensor& clamp_(Tensor& self, std::optional<Scalar> min, std::optional<Scalar> max);
Tensor& masked_fill_(Tensor& self, const Tensor& mask, const Scalar& value);
Tensor& add_out(Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor& mul_out(Tensor& out, const Tensor& a, const Tensor& b);
Tensor& sub_out(Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor& div_out(Tensor& out, const Tensor& a, const Tensor& b);
Tensor& exp_out(Tensor& out, const Tensor& x);

Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, const Scalar& b);
Tensor operator-(const Tensor& a, const Scalar& b);
Tensor operator*(const Tensor& a, const Scalar& b);
Tensor operator/(const Tensor& a, const Scalar& b);

// ---------------------------------------------------------------------------------------------------------
// Reductions. `dims` empty means all dims. Half-precision inputs accumulate in f32, f32 in f32 with
// pairwise (cascade) summation, integers in i64 (sum/prod of bool and integers give i64 as in PyTorch).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false,
           std::optional<DType> dtype = std::nullopt);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false,
            std::optional<DType> dtype = std::nullopt);
Tensor prod(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false,
            std::optional<DType> dtype = std::nullopt);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);  // NaN propagates
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x);  // of all elements
Tensor min(const Tensor& x);
// Values and indices (i64) along one dim; ties give the first index; NaN wins.
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor all(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor any(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// correction = 1 is Bessel's correction (unbiased), as torch.var's default.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, double correction = 1, bool keepdim = false);
Tensor std(const Tensor& x, const std::vector<int64_t>& dims = {}, double correction = 1, bool keepdim = false);
// Vector p-norm (p = 2 default; inf and -inf give max/min |x|; 0 counts nonzeros).
Tensor norm(const Tensor& x, double p = 2.0, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);

// ---------------------------------------------------------------------------------------------------------
// Indexing and data movement. Index tensors are i64 (i32 accepted); negative indices count from the end
// where PyTorch allows them; an index out of range is an error naming the index and the bound.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);  // views
std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor scatter(const Tensor& x, int64_t dim, const Tensor& index, const Scalar& value);
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor& scatter_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
Tensor& scatter_add_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src);
// Elements of x (as if flattened) at the flat indices; the result has index's shape.
Tensor take(const Tensor& x, const Tensor& index);
// The upper (triu: j - i >= diagonal) or lower (tril: j - i <= diagonal) triangle of the last two dims, the
// rest zero.
Tensor triu(const Tensor& x, int64_t diagonal = 0);
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor masked_fill(const Tensor& x, const Tensor& mask, const Scalar& value);

// ---------------------------------------------------------------------------------------------------------
// Complex numbers. view_as_real: a complex64 [...] as float32 [..., 2] (real, imaginary), a view; real and
// imag are views of its two halves (real of a real tensor is the tensor). conj: the complex conjugate (a new
// tensor; a real tensor itself).
Tensor view_as_real(const Tensor& x);
Tensor real(const Tensor& x);
Tensor imag(const Tensor& x);
Tensor conj(const Tensor& x);

// ---------------------------------------------------------------------------------------------------------
// Matrix products. f32/f64/c64 through BLAS on the CPU; f16/bf16 accumulate in f32.
Tensor mm(const Tensor& a, const Tensor& b);    // [n, k] x [k, m]
Tensor bmm(const Tensor& a, const Tensor& b);   // [B, n, k] x [B, k, m]
Tensor matmul(const Tensor& a, const Tensor& b);  // numpy semantics, batch dims broadcast
// beta * input + alpha * (a @ b); input broadcasts to [n, m].
Tensor addmm(const Tensor& input, const Tensor& a, const Tensor& b, const Scalar& beta = 1,
             const Scalar& alpha = 1);

}  // namespace kiln
