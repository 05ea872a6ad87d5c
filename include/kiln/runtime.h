// Device runtime: streams, events, graphs and memory statistics (CUDA). In a build without the CUDA
// backend, or on a machine without a usable GPU, every call that needs one throws kiln::Error saying why.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kiln/device.h"

namespace kiln {

class Tensor;

// A CUDA stream of one device. The default-constructed Stream is device 0's default stream.
class Stream {
 public:
  Stream() = default;
  // A new non-blocking stream. priority 0 is normal; negative is higher (CUDA's convention), clamped to
  // the device's range.
  static Stream create(Device device, int priority = 0);
  static Stream default_stream(Device device);
  // A stream created outside kiln (a cudaStream_t of another library, e.g. one named by a DLPack consumer),
  // not owned: the creator keeps it alive while kiln uses it. A null handle is the default stream.
  static Stream from_handle(Device device, void* handle);

  Device device() const { return device_; }
  void* handle() const { return handle_ ? handle_.get() : nullptr; }  // cudaStream_t (null: default)
  bool is_default() const { return handle_ == nullptr; }
  int priority() const;
  bool query() const;        // true when all work enqueued so far has completed
  void synchronize() const;  // blocks the host until it has
  friend bool operator==(const Stream& a, const Stream& b) {
    return a.device_ == b.device_ && a.handle() == b.handle();
  }

 private:
  Stream(Device d, std::shared_ptr<void> h) : device_(d), handle_(std::move(h)) {}
  Device device_ = Device(DeviceType::CUDA, 0);
  std::shared_ptr<void> handle_;
};

// The stream that ops on `device` enqueue on, per calling thread (the default stream until set).
Stream current_stream(Device device = Device(DeviceType::CUDA, 0));
void set_current_stream(const Stream& stream);

// Makes `stream` current on its device for a scope, then restores the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

class Event {
 public:
  explicit Event(bool enable_timing = false);
  void record(const Stream& stream);
  void record() { record(current_stream(device_)); }
  void wait(const Stream& stream) const;  // `stream` waits on the device for the recorded work
  bool query() const;                     // true when the recorded work has completed (or none recorded)
  void synchronize() const;
  // Milliseconds from `start` to this event (both recorded, both with timing). Negative if this event
  // was recorded before `start` completed in stream order.
  float elapsed_ms(const Event& start) const;
  void* handle() const { return handle_.get(); }

 private:
  std::shared_ptr<void> handle_;
  bool timing_ = false;
  bool recorded_ = false;
  Device device_ = Device(DeviceType::CUDA, 0);
};

// A small pinned host buffer that a stream fills from a device tensor without the host waiting: copy()
// enqueues the copy on the stream and records an event; wait() blocks until that copy has landed and returns
// the host bytes. For reading a result (a sampled token id) while the stream already runs the next step.
class AsyncReadback {
 public:
  AsyncReadback(Device device, size_t capacity_bytes);
  ~AsyncReadback();
  AsyncReadback(AsyncReadback&&) noexcept;
  AsyncReadback& operator=(AsyncReadback&&) noexcept;
  // src: a contiguous tensor on this device of at most capacity_bytes.
  void copy(const Tensor& src, const Stream& stream);
  const void* wait() const;
  template <class T>
  T value() const {
    return *static_cast<const T*>(wait());
  }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Blocks until all work on every stream of the device has completed.
void synchronize(Device device = Device(DeviceType::CUDA, 0));

// Marks t's storage constant (Storage::set_constant) once every kernel that wrote it has finished (a CUDA
// tensor's device is synchronized first): for a model's weights once loaded, which the one-row products may then
// stream while the kernel before them ends.
void mark_constant(const Tensor& t);

// A CUDA graph captured from a callable on a (non-default) stream and replayed on demand. Tensors
// allocated during capture come from a private memory pool kept alive with the graph, so replays write to
// the same addresses. Re-capturing when shapes change is the caller's choice.
class Graph {
 public:
  Graph();
  ~Graph();
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;
  void capture(const Stream& stream, const std::function<void()>& body);
  void replay(const Stream& stream) const;
  void replay() const;  // on the stream it was captured on
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Memory of one device: three figures, each with its current value and peak since the last reset.
//   allocated    bytes in live tensors (requested sizes rounded to the allocator's 512-byte granule)
//   reserved     bytes the caching allocator holds from the driver (cudaMalloc'd segments)
//   driver_used  device memory in use as the driver reports it (cudaMemGetInfo: total - free), sampled at
//                every allocator event and on memory_stats(); it covers the CUDA context, library
//                workspaces and, on a shared GPU, other processes too.
struct MemoryStats {
  int64_t allocated = 0, allocated_peak = 0;
  int64_t reserved = 0, reserved_peak = 0;
  int64_t driver_used = 0, driver_used_peak = 0;
  int64_t device_total = 0;
  int64_t num_allocs = 0, num_frees = 0, num_segments = 0, num_ooms = 0, num_cache_flushes = 0;
};
MemoryStats memory_stats(Device device = Device(DeviceType::CUDA, 0));
void reset_peak_memory_stats(Device device = Device(DeviceType::CUDA, 0));
// Returns every cached block that no tensor uses to the driver.
void empty_cache(Device device = Device(DeviceType::CUDA, 0));

// A description of the device for `kiln info`: name, compute capability, memory, versions.
struct DeviceProperties {
  std::string name;
  int major = 0, minor = 0;
  int multiprocessors = 0;
  int64_t total_memory = 0;
  int64_t l2_bytes = 0;
  int64_t shared_per_block_optin = 0;
  int clock_mhz = 0, memory_clock_mhz = 0, bus_width_bits = 0;
  bool kernels_compiled = false;  // this build holds code the device can run
};
DeviceProperties device_properties(Device device);
int cuda_driver_version();   // e.g. 13000; 0 when unknown
int cuda_runtime_version();  // of the runtime kiln was built with

}  // namespace kiln
