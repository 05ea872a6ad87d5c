#include "cuda/device_error.h"

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "cuda/backend.h"
#include "kiln/error.h"

namespace kiln::cuda {

namespace {
struct Slot {
  DeviceErrorRecord* host = nullptr;
  DeviceErrorRecord* dev = nullptr;
};
std::mutex g_mu;
std::vector<Slot> g_slots;

const char* op_name(int32_t op) {
  switch (static_cast<OpId>(op)) {
    case OpId::IndexSelect: return "index_select";
    case OpId::Gather: return "gather";
    case OpId::Scatter: return "scatter";
    case OpId::ScatterAdd: return "scatter_add";
    case OpId::Take: return "take";
    case OpId::Embedding: return "embedding";
    case OpId::GroupedMm: return "grouped_mm";
    case OpId::Div: return "div";
    case OpId::Fmod: return "fmod";
    case OpId::Remainder: return "remainder";
    case OpId::Sample: return "sample";
    case OpId::DecodeAttention: return "decode_attention (lengths)";
    case OpId::KvCacheAppend: return "kv_cache_append_ (positions)";
    case OpId::QkNormRopeAppend: return "qk_norm_rope_append_ (at)";
    case OpId::CrossEntropy: return "cross_entropy (target)";
    default: return "a CUDA op";
  }
}

Slot& slot(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (device >= static_cast<int>(g_slots.size())) g_slots.resize(device + 1);
  Slot& s = g_slots[device];
  if (!s.host) {
    int prev = 0;
    cudaGetDevice(&prev);
    check(cudaSetDevice(device), "cudaSetDevice");
    void* p = nullptr;
    check(cudaHostAlloc(&p, sizeof(DeviceErrorRecord), cudaHostAllocMapped), "cudaHostAlloc (error record)");
    s.host = static_cast<DeviceErrorRecord*>(p);
    *s.host = DeviceErrorRecord{0, 0, 0, 0};
    void* d = nullptr;
    check(cudaHostGetDevicePointer(&d, p, 0), "cudaHostGetDevicePointer");
    s.dev = static_cast<DeviceErrorRecord*>(d);
    cudaSetDevice(prev);
  }
  return s;
}
}  // namespace

DeviceErrorRecord* device_error_record(int device) { return slot(device).dev; }

void check_device_errors(int device) {
  if (device >= static_cast<int>(g_slots.size()) || !g_slots[device].host) return;
  volatile DeviceErrorRecord* r = g_slots[device].host;
  if (r->code == 0) return;
  const DeviceErrorRecord e{r->code, r->op, r->value, r->bound};
  r->code = 0;
  switch (static_cast<DeviceErrorCode>(e.code)) {
    case DeviceErrorCode::IndexOutOfRange:
      throw Error(str(op_name(e.op), ": index ", e.value, " is out of range for a dimension of size ", e.bound,
                      " (found on cuda:", device, " by an earlier asynchronous kernel; the out-of-range "
                      "elements were not read or written)"));
    case DeviceErrorCode::InvalidOffsets:
      throw Error(str(op_name(e.op), ": invalid group offset ", e.value, " (offsets must be non-decreasing and ",
                      "at most ", e.bound, "; found on cuda:", device, " by an earlier asynchronous kernel)"));
    case DeviceErrorCode::DivisionByZero:
      throw Error(str(op_name(e.op), ": ZeroDivisionError (integer division by zero, found on cuda:", device,
                      " by an earlier asynchronous kernel; the affected elements were set to 0)"));
    case DeviceErrorCode::InvalidDistribution:
      throw Error(str(op_name(e.op), ": row ", e.value, " of logits [.., ", e.bound, "] has NaN, +inf or only -inf ",
                      "logits, so its distribution is undefined (found on cuda:", device, " by an earlier ",
                      "asynchronous kernel; the row's token was set to 0)"));
    default: throw Error(str("cuda:", device, ": a kernel reported error code ", e.code));
  }
}

}  // namespace kiln::cuda
