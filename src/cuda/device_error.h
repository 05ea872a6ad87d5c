// Errors found by kernels (an index out of range, invalid group offsets) without a host synchronisation.
//
// A kernel that finds invalid input does not touch memory out of bounds: it skips the element and records
// the first error in a small per-device record in mapped pinned host memory. The host reads the record
// at the next point where it synchronises anyway (a copy to the host, item(), synchronize(), a stream or
// event synchronize) and throws kiln::Error there, naming the op, the index and the bound. This is the
// GPU counterpart of the CPU's immediate error: ops stay asynchronous and graph-capturable.
#pragma once

#include <cstdint>

#include "kiln/scalar_types.h"

namespace kiln::cuda {

enum class DeviceErrorCode : int32_t {
  None = 0,
  IndexOutOfRange = 1,   // value = index, bound = size of the indexed dim
  InvalidOffsets = 2,    // value = offending offset, bound = rows
  DivisionByZero = 3,    // integer division or remainder by zero (the element's result is 0); no value
  InvalidDistribution = 4,  // sample: value = the row whose logits hold NaN, +inf or only -inf; bound = V
};

struct DeviceErrorRecord {
  int32_t code;    // DeviceErrorCode; 0 while no error
  int32_t op;      // an OpId, for the message
  int64_t value;
  int64_t bound;
};

// Ops that can report errors from a kernel (their names live in device_error.cpp).
enum class OpId : int32_t {
  IndexSelect = 1, Gather, Scatter, ScatterAdd, Take, Embedding, GroupedMm, Other,
  Div, Fmod, Remainder, Sample,
  DecodeAttention,  // value = a length outside [0, Lmax], bound = Lmax + 1
  KvCacheAppend,    // value = a position p with p + T > Lmax or p < 0, bound = Lmax - T + 1
  QkNormRopeAppend,  // value = the cache slot `at` with at + T > Lmax or at < 0, bound = Lmax - T + 1
  CrossEntropy,      // value = a target outside [0, C) that is not ignore_index, bound = C
};

#if defined(__CUDACC__)
// Records the first error only; later ones are dropped.
__device__ inline void report_device_error(DeviceErrorRecord* rec, DeviceErrorCode code, OpId op, int64_t value,
                                           int64_t bound) {
  if (atomicCAS(&rec->code, 0, static_cast<int32_t>(code)) == 0) {
    rec->op = static_cast<int32_t>(op);
    rec->value = value;
    rec->bound = bound;
    __threadfence_system();
  }
}
#endif

// The device-visible record of a device (host code).
DeviceErrorRecord* device_error_record(int device);
// Throws kiln::Error if a kernel on `device` recorded an error since the last check, and clears it.
// Call only after a synchronisation that covers the kernels in question.
void check_device_errors(int device);

}  // namespace kiln::cuda
