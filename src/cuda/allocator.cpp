#include "cuda/allocator.h"

#include <algorithm>
#include <atomic>

#include "cuda/backend.h"
#include "kiln/error.h"

namespace kiln::cuda {

namespace {
thread_local uint64_t t_private_pool = 0;
std::atomic<uint64_t> g_next_pool{1};

// cudaMalloc and cudaMemGetInfo are "unsafe" during stream capture (they are not stream operations); a
// segment allocated while a graph is captured is exactly what the graph's private pool needs, so the
// allocator allows them for its own calls (as other caching allocators do) and nothing else.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

size_t round_size(size_t size) {
  return std::max(kBlockGranule, (size + kBlockGranule - 1) / kBlockGranule * kBlockGranule);
}
size_t segment_size(size_t size, bool small) {
  if (small) return kSmallSegment;
  if (size < kLargeAlone) return kLargeSegment;
  return (size + kSmallSegment - 1) / kSmallSegment * kSmallSegment;
}
}  // namespace

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  if (a->pool != b->pool) return a->pool < b->pool;
  if (a->small != b->small) return a->small < b->small;
  if (a->stream != b->stream) return reinterpret_cast<uintptr_t>(a->stream) < reinterpret_cast<uintptr_t>(b->stream);
  if (a->size != b->size) return a->size < b->size;
  return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
}

CachingAllocator& CachingAllocator::get(int device) {
  static std::mutex mu;
  static std::vector<CachingAllocator*> all;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(all.size())) all.resize(device + 1, nullptr);
  if (!all[device]) all[device] = new CachingAllocator(device);  // never deleted, on purpose
  return *all[device];
}

void CachingAllocator::begin_private_pool(uint64_t pool) { t_private_pool = pool; }
void CachingAllocator::end_private_pool() { t_private_pool = 0; }
uint64_t CachingAllocator::new_pool_id() { return g_next_pool++; }

void CachingAllocator::sample_driver() {
  RelaxedCaptureMode relaxed;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    st_.device_total = static_cast<int64_t>(total_b);
    st_.driver_used = static_cast<int64_t>(total_b - free_b);
    st_.driver_used_peak = std::max(st_.driver_used_peak, st_.driver_used);
  } else {
    cudaGetLastError();
  }
}

CachingAllocator::Block* CachingAllocator::find_free(uint64_t pool, bool small, cudaStream_t stream, size_t size) {
  Block key;
  key.pool = pool;
  key.small = small;
  key.stream = stream;
  key.size = size;
  key.ptr = nullptr;
  auto it = free_.lower_bound(&key);
  if (it == free_.end()) return nullptr;
  Block* b = *it;
  if (b->pool != pool || b->small != small || b->stream != stream) return nullptr;
  free_.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment(uint64_t pool, bool small, cudaStream_t stream,
                                                       size_t size) {
  const size_t seg = segment_size(size, small);
  void* p = nullptr;
  cudaError_t e;
  {
    RelaxedCaptureMode relaxed;
    e = cudaMalloc(&p, seg);
  }
  if (e != cudaSuccess && t_private_pool != 0) {
    cudaGetLastError();
    ++st_.num_ooms;
    throw OutOfMemory(str("CUDA out of memory on cuda:", device_, " while capturing a graph: tried to allocate ",
                          size, " bytes (the cache cannot be flushed during capture)"));
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    // Out of memory: wait for deferred frees, give every cached segment back, and try once more.
    cudaDeviceSynchronize();
    cudaGetLastError();
    process_events();
    release_free_segments(false);
    ++st_.num_cache_flushes;
    e = cudaMalloc(&p, seg);
    if (e != cudaSuccess) {
      cudaGetLastError();
      ++st_.num_ooms;
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      cudaGetLastError();
      throw OutOfMemory(str("CUDA out of memory on cuda:", device_, ": tried to allocate ", size, " bytes (segment ",
                            seg, " bytes); allocated ", st_.allocated, " bytes in tensors, ", st_.reserved,
                            " bytes reserved by kiln's allocator, ", free_b, " of ", total_b,
                            " bytes free on the device. Free tensors you no longer need, or call empty_cache()"));
    }
  }
  auto* b = new Block;
  b->size = seg;
  b->ptr = p;
  b->stream = stream;
  b->pool = pool;
  b->small = small;
  st_.reserved += static_cast<int64_t>(seg);
  st_.reserved_peak = std::max(st_.reserved_peak, st_.reserved);
  ++st_.num_segments;
  sample_driver();
  return b;
}

void* CachingAllocator::malloc(size_t request, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  check(cudaSetDevice(device_), "cudaSetDevice");
  // Deferred frees are collected outside graph capture only (event queries are not capture operations).
  if (t_private_pool == 0) process_events();
  const size_t size = round_size(request);
  const bool small = size <= kSmallRequest;
  const uint64_t pool = t_private_pool;
  Block* b = find_free(pool, small, stream, size);
  if (!b) b = new_segment(pool, small, stream, size);
  // Split off the tail when it is worth keeping as a block of its own.
  const size_t rest = b->size - size;
  if ((small && rest >= kBlockGranule) || (!small && rest > kSmallRequest)) {
    auto* tail = new Block(*b);
    tail->uses.clear();
    tail->ptr = static_cast<char*>(b->ptr) + size;
    tail->size = rest;
    tail->prev = b;
    tail->next = b->next;
    if (b->next) b->next->prev = tail;
    b->next = tail;
    b->size = size;
    tail->allocated = false;
    free_.insert(tail);
  }
  b->allocated = true;
  b->uses.clear();
  live_[b->ptr] = b;
  st_.allocated += static_cast<int64_t>(b->size);
  st_.allocated_peak = std::max(st_.allocated_peak, st_.allocated);
  ++st_.num_allocs;
  return b->ptr;
}

void CachingAllocator::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours (cannot happen for kiln storage)
  Block* b = it->second;
  live_.erase(it);
  b->allocated = false;
  st_.allocated -= static_cast<int64_t>(b->size);
  ++st_.num_frees;
  if (!b->uses.empty()) {
    // Other streams may still read or write it: reuse waits for their work enqueued up to now.
    cudaSetDevice(device_);
    for (cudaStream_t s : b->uses) {
      cudaEvent_t ev;
      check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaEventRecord(ev, s), "cudaEventRecord");
      ++b->pending_events;
      events_.emplace_back(ev, b);
    }
    b->uses.clear();
    return;
  }
  free_block(b);
}

void CachingAllocator::record_stream(void* ptr, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  KILN_CHECK(it != live_.end(), "record_stream: pointer is not a live block of cuda:", device_, "'s allocator");
  Block* b = it->second;
  if (stream == b->stream) return;
  if (std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) b->uses.push_back(stream);
}

void CachingAllocator::free_block(Block* b) {
  // Coalesce with free neighbours of the same segment (they share pool and stream).
  auto merge = [&](Block* dst, Block* src) {
    // src follows dst directly.
    dst->size += src->size;
    dst->next = src->next;
    if (src->next) src->next->prev = dst;
    delete src;
  };
  if (b->prev && !b->prev->allocated && b->prev->pending_events == 0) {
    Block* p = b->prev;
    free_.erase(p);
    merge(p, b);
    b = p;
  }
  if (b->next && !b->next->allocated && b->next->pending_events == 0) {
    Block* n = b->next;
    free_.erase(n);
    merge(b, n);
  }
  if (b->pool != 0 && released_pools_.count(b->pool) && !b->prev && !b->next) {
    check(cudaFree(b->ptr), "cudaFree");
    st_.reserved -= static_cast<int64_t>(b->size);
    --st_.num_segments;
    delete b;
    sample_driver();
    return;
  }
  free_.insert(b);
}

void CachingAllocator::process_events() {
  while (!events_.empty()) {
    auto [ev, b] = events_.front();
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess) cudaGetLastError();
    cudaEventDestroy(ev);
    events_.pop_front();
    if (--b->pending_events == 0 && !b->allocated) free_block(b);
  }
}

void CachingAllocator::release_free_segments(bool all_pools) {
  for (auto it = free_.begin(); it != free_.end();) {
    Block* b = *it;
    const bool pool_ok = b->pool == 0 || released_pools_.count(b->pool) || all_pools;
    if (pool_ok && !b->prev && !b->next) {
      cudaFree(b->ptr);
      cudaGetLastError();
      st_.reserved -= static_cast<int64_t>(b->size);
      --st_.num_segments;
      delete b;
      it = free_.erase(it);
    } else {
      ++it;
    }
  }
  sample_driver();
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  cudaSetDevice(device_);
  process_events();
  release_free_segments(false);
}

void CachingAllocator::release_private_pool(uint64_t pool) {
  std::lock_guard<std::mutex> lock(mu_);
  released_pools_.insert(pool);
  cudaSetDevice(device_);
  release_free_segments(false);
}

MemoryStats CachingAllocator::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  cudaSetDevice(device_);
  sample_driver();
  return st_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  st_.allocated_peak = st_.allocated;
  st_.reserved_peak = st_.reserved;
  sample_driver();
  st_.driver_used_peak = st_.driver_used;
}

}  // namespace kiln::cuda
