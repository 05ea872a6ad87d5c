// Dispatch helpers of the CUDA indexing launchers: element size (pure data movement) and index dtype.
#pragma once

#include <cstdint>

#include "core/dispatch.h"
#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln::cuda {

// Calls f with a TypeTag of the unsigned integer type as wide as one element.
template <class F>
void visit_itemsize(size_t size, const char* op, F&& f) {
  switch (size) {
    case 1: f(TypeTag<uint8_t>{}); return;
    case 2: f(TypeTag<uint16_t>{}); return;
    case 4: f(TypeTag<uint32_t>{}); return;
    case 8: f(TypeTag<uint64_t>{}); return;
  }
  throw Error(str(op, ": unsupported element size ", size));
}

// Calls f with TypeTag<int32_t> or TypeTag<int64_t> for an index tensor's dtype.
template <class F>
void visit_index(DType t, const char* op, F&& f) {
  if (t == DType::I32) f(TypeTag<int32_t>{});
  else if (t == DType::I64) f(TypeTag<int64_t>{});
  else throw Error(str(op, ": expected an index tensor of dtype int64 or int32, got ", dtype_name(t)));
}

}  // namespace kiln::cuda
