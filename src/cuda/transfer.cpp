// Host <-> device transfers. Small copies go straight through cudaMemcpyAsync (the driver stages pageable
// memory itself); large ones stream through two pinned staging buffers per device so the host-side copy
// of one chunk overlaps the DMA of the other.
#include <cuda_runtime.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "core/copy.h"
#include "cuda/backend.h"
#include "cuda/copy.h"
#include "cuda/device_error.h"
#include "kiln/ops.h"

namespace kiln::cuda {

namespace {
constexpr size_t kDirectMax = size_t{1} << 20;   // below this, staging costs more than it saves
constexpr size_t kStageBytes = size_t{16} << 20;  // per buffer; two per device

struct Stage {
  void* buf[2] = {nullptr, nullptr};
  cudaEvent_t done[2] = {nullptr, nullptr};  // the last DMA using each buffer
  std::mutex mu;
};

Stage& stage(int device) {
  static std::mutex mu;
  static std::vector<Stage*> stages;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(stages.size())) stages.resize(device + 1, nullptr);
  if (!stages[device]) {
    auto* s = new Stage;  // kept for the process: pinned memory is slow to allocate
    for (int i = 0; i < 2; ++i) {
      check(cudaHostAlloc(&s->buf[i], kStageBytes, cudaHostAllocDefault), "cudaHostAlloc (staging)");
      check(cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming), "cudaEventCreate");
    }
    stages[device] = s;
  }
  return *stages[device];
}

// memcpy split over OpenMP threads: one thread does not saturate host memory bandwidth.
void parallel_memcpy(void* dst, const void* src, size_t n) {
  const size_t chunk = size_t{1} << 20;
  const int64_t parts = static_cast<int64_t>((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static) if (parts > 1)
  for (int64_t i = 0; i < parts; ++i) {
    const size_t off = static_cast<size_t>(i) * chunk;
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, std::min(chunk, n - off));
  }
}
}  // namespace

void copy_host_to_device(const Tensor& dst, const Tensor& src) {
  // Host side: contiguous, already in the destination dtype (the conversion runs on the CPU).
  const Tensor h = (src.dtype() == dst.dtype() && src.is_contiguous()) ? src : src.to(dst.dtype()).contiguous();
  const Tensor d = dst.is_contiguous() ? dst : empty(dst.sizes(), dst.dtype(), dst.device());
  const size_t n = d.nbytes();
  check(cudaSetDevice(dst.device().index), "cudaSetDevice");
  const cudaStream_t s = stream_of(dst.device());
  if (n <= kDirectMax) {
    check(cudaMemcpyAsync(d.data_ptr(), h.data_ptr(), n, cudaMemcpyHostToDevice, s), "copy to device");
  } else {
    Stage& st = stage(dst.device().index);
    std::lock_guard<std::mutex> lock(st.mu);
    for (size_t off = 0, i = 0; off < n; off += kStageBytes, ++i) {
      const int b = static_cast<int>(i % 2);
      const size_t len = std::min(kStageBytes, n - off);
      check(cudaEventSynchronize(st.done[b]), "staging buffer wait");  // its previous DMA has finished
      parallel_memcpy(st.buf[b], static_cast<const char*>(h.data_ptr()) + off, len);
      check(cudaMemcpyAsync(static_cast<char*>(d.data_ptr()) + off, st.buf[b], len, cudaMemcpyHostToDevice, s),
            "copy to device");
      check(cudaEventRecord(st.done[b], s), "cudaEventRecord");
    }
  }
  if (!dst.is_contiguous()) copy_on_device(dst, d);
}

void copy_device_to_host(const Tensor& dst, const Tensor& src) {
  const Tensor s_dev = src.is_contiguous() ? src : src.contiguous();
  const Tensor h = (dst.dtype() == src.dtype() && dst.is_contiguous()) ? dst : empty(src.sizes(), src.dtype(), kCPU);
  const size_t n = h.nbytes();
  check(cudaSetDevice(src.device().index), "cudaSetDevice");
  const cudaStream_t s = stream_of(src.device());
  if (n <= kDirectMax) {
    check(cudaMemcpyAsync(h.data_ptr(), s_dev.data_ptr(), n, cudaMemcpyDeviceToHost, s), "copy to host");
    check(cudaStreamSynchronize(s), "copy to host");
  } else {
    Stage& st = stage(src.device().index);
    std::lock_guard<std::mutex> lock(st.mu);
    // DMA chunk i into buffer i%2 while the host copies chunk i-1 out of the other buffer.
    size_t prev_off = 0, prev_len = 0;
    int prev_b = -1;
    for (size_t off = 0, i = 0; off < n || prev_b >= 0; ++i) {
      int b = -1;
      size_t len = 0;
      if (off < n) {
        b = static_cast<int>(i % 2);
        len = std::min(kStageBytes, n - off);
        check(cudaMemcpyAsync(st.buf[b], static_cast<const char*>(s_dev.data_ptr()) + off, len,
                              cudaMemcpyDeviceToHost, s),
              "copy to host");
        check(cudaEventRecord(st.done[b], s), "cudaEventRecord");
      }
      if (prev_b >= 0) {
        check(cudaEventSynchronize(st.done[prev_b]), "copy to host");
        parallel_memcpy(static_cast<char*>(h.data_ptr()) + prev_off, st.buf[prev_b], prev_len);
      }
      prev_b = b;
      prev_off = off;
      prev_len = len;
      off += len;
    }
  }
  check_device_errors(src.device().index);
  if (h.data_ptr() != dst.data_ptr()) cpu::copy_cast(dst, h);
}

}  // namespace kiln::cuda
