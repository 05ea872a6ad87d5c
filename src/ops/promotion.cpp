// result_type: PyTorch's type promotion over tensors and Scalars (c10's ResultTypeState), and the shared
// elementwise helpers of ops/elementwise.h.
#include <optional>

#include "ops/elementwise.h"

namespace kiln {

namespace {

using Opt = std::optional<DType>;

Opt promote_opt(Opt a, DType b) { return a ? promote_types(*a, b) : b; }

// c10's combine_categories: the higher-priority result wins unless the lower one is of a higher category
// (bool < integer < floating < complex), in which case the lower one raises it.
Opt combine_categories(Opt higher, Opt lower) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (is_complex(*higher)) return higher;
  if (is_complex(*lower)) {
    // A floating higher keeps its width in the complex result (only c64 exists in kiln).
    if (is_floating(*higher)) return promote_types(*higher, *lower);
    return lower;
  }
  if (is_floating(*higher)) return higher;
  if (*higher == DType::Bool || is_floating(*lower)) return promote_types(*higher, *lower);
  return higher;
}

// The dtype a wrapped number takes part in promotion with: floats count as the default float dtype.
DType wrapped_dtype(const Scalar& s) {
  switch (s.kind()) {
    case Scalar::Kind::Bool: return DType::Bool;
    case Scalar::Kind::Int: return DType::I64;
    case Scalar::Kind::UInt: return DType::U64;
    case Scalar::Kind::Float: return kDefaultFloat;
    default: return DType::C64;
  }
}

}  // namespace

DType result_type(const std::vector<Tensor>& tensors, const std::vector<Scalar>& scalars) {
  KILN_CHECK(!tensors.empty() || !scalars.empty(), "result_type: needs at least one operand");
  Opt dim_result, zero_result, wrapped_result;
  for (const Tensor& t : tensors) {
    KILN_CHECK(t.defined(), "result_type: undefined tensor operand");
    if (t.dim() > 0) dim_result = promote_opt(dim_result, t.dtype());
    else zero_result = promote_opt(zero_result, t.dtype());
  }
  for (const Scalar& s : scalars) wrapped_result = promote_opt(wrapped_result, wrapped_dtype(s));
  return *combine_categories(dim_result, combine_categories(zero_result, wrapped_result));
}

bool can_cast(DType from, DType to) {
  if (is_complex(from) && !is_complex(to)) return false;
  if (is_floating(from) && is_integral(to, /*include_bool=*/true)) return false;
  if (from != DType::Bool && to == DType::Bool) return false;
  return true;
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    KILN_CHECK(t->defined(), op, ": undefined tensor operand");
    if (!first) {
      first = t;
      continue;
    }
    if (t->device() != first->device()) {
      std::string all;
      for (const Tensor* u : ts) all += (all.empty() ? "" : ", ") + u->meta();
      throw Error(str(op, ": expected all tensors on the same device, got ", all));
    }
  }
}

Shape broadcast_for(const char* op, const Shape& a, const Shape& b) {
  try {
    return broadcast_shapes(a, b);
  } catch (const Error& e) {
    throw Error(str(op, ": ", e.what()));
  }
}

void check_cpu_only(const char* op, const Tensor& t) {
  KILN_CHECK(t.is_cpu(), op, ": no CUDA implementation yet (got ", t.meta(), ")");
}

Tensor scalar_operand(const Scalar& s, DType dtype, Device device) { return full({}, s, dtype, device); }

}  // namespace kiln
