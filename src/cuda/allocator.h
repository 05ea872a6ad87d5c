// Stream-ordered caching allocator for one CUDA device (docs/architecture.md, "Device memory").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "kiln/runtime.h"

namespace kiln::cuda {

class CachingAllocator {
 public:
  // The allocator of a device (created on first use, never destroyed: tensors may outlive main()).
  static CachingAllocator& get(int device);

  // A block of at least `size` bytes, usable in stream order on `stream`. Throws kiln::OutOfMemory after
  // freeing the cache and retrying once.
  void* malloc(size_t size, cudaStream_t stream);
  void free(void* ptr);
  // `ptr` (a live block) is also used on `stream`: its memory is not reused until the work enqueued on
  // `stream` up to its free has completed.
  void record_stream(void* ptr, cudaStream_t stream);
  void empty_cache();
  MemoryStats stats();
  void reset_peak();

  // Allocations made by this thread go to private pool `pool` (> 0) until end_private_pool(); used while
  // a graph is captured. release_private_pool returns the pool's memory once its blocks are free.
  static void begin_private_pool(uint64_t pool);
  static void end_private_pool();
  static uint64_t new_pool_id();
  void release_private_pool(uint64_t pool);

 private:
  struct Block {
    size_t size = 0;
    void* ptr = nullptr;
    cudaStream_t stream = nullptr;
    uint64_t pool = 0;
    bool small = false;
    bool allocated = false;
    int pending_events = 0;
    Block* prev = nullptr;  // neighbours inside one segment (one cudaMalloc)
    Block* next = nullptr;
    std::vector<cudaStream_t> uses;  // other streams recorded with record_stream
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };

  explicit CachingAllocator(int device) : device_(device) {}
  Block* find_free(uint64_t pool, bool small, cudaStream_t stream, size_t size);
  Block* new_segment(uint64_t pool, bool small, cudaStream_t stream, size_t size);
  void free_block(Block* b);
  void process_events();
  void release_free_segments(bool all_pools);
  void sample_driver();

  int device_;
  std::mutex mu_;
  std::set<Block*, BlockLess> free_;
  std::unordered_map<void*, Block*> live_;
  std::deque<std::pair<cudaEvent_t, Block*>> events_;
  std::set<uint64_t> released_pools_;
  MemoryStats st_;
};

// Rounding the allocator applies: requests round up to 512 bytes (and the figures count rounded bytes).
inline constexpr size_t kBlockGranule = 512;
inline constexpr size_t kSmallRequest = 1 << 20;  // requests up to 1 MiB share 2 MiB segments
inline constexpr size_t kSmallSegment = 2 << 20;
inline constexpr size_t kLargeSegment = 20 << 20;  // requests under 10 MiB share 20 MiB segments
inline constexpr size_t kLargeAlone = 10 << 20;

}  // namespace kiln::cuda
