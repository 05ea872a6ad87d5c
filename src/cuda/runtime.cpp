// Streams, events, graphs, memory statistics and device properties (kiln/runtime.h) on CUDA.
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "cuda/allocator.h"
#include "cuda/backend.h"
#include "cuda/device_error.h"
#include "kiln/runtime.h"
#include "kiln/tensor.h"

namespace kiln {

namespace {
cudaStream_t raw(const Stream& s) { return static_cast<cudaStream_t>(s.handle()); }

thread_local std::vector<Stream> t_current;  // per device; default stream until set

// Streams created by kiln are destroyed when their last handle goes; the deleter sets the device first.
std::shared_ptr<void> own_stream(cudaStream_t s, int device) {
  return std::shared_ptr<void>(static_cast<void*>(s), [device](void* p) {
    cudaSetDevice(device);
    cudaStreamDestroy(static_cast<cudaStream_t>(p));
  });
}
}  // namespace

Stream Stream::create(Device device, int priority) {
  cuda::check_device(device);
  cuda::check(cudaSetDevice(device.index), "cudaSetDevice");
  int lo = 0, hi = 0;  // CUDA: `hi` is the greatest priority (most negative)
  cuda::check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
  const int p = std::clamp(priority, hi, lo);
  cudaStream_t s = nullptr;
  cuda::check(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, p), "cudaStreamCreateWithPriority");
  return Stream(device, own_stream(s, device.index));
}

Stream Stream::default_stream(Device device) {
  KILN_CHECK(device.is_cuda(), "Stream: ", device.str(), " is not a CUDA device");
  return Stream(device, nullptr);
}

Stream Stream::from_handle(Device device, void* handle) {
  KILN_CHECK(device.is_cuda(), "Stream: ", device.str(), " is not a CUDA device");
  if (!handle) return Stream(device, nullptr);
  return Stream(device, std::shared_ptr<void>(handle, [](void*) {}));
}

int Stream::priority() const {
  int p = 0;
  cuda::check(cudaStreamGetPriority(raw(*this), &p), "cudaStreamGetPriority");
  return p;
}

bool Stream::query() const {
  const cudaError_t e = cudaStreamQuery(raw(*this));
  if (e == cudaErrorNotReady) return false;
  cuda::check(e, "cudaStreamQuery");
  return true;
}

void Stream::synchronize() const {
  cuda::check(cudaStreamSynchronize(raw(*this)), "cudaStreamSynchronize");
  cuda::check_device_errors(device_.index);
}

Stream current_stream(Device device) {
  KILN_CHECK(device.is_cuda(), "current_stream: ", device.str(), " is not a CUDA device");
  if (device.index < static_cast<int>(t_current.size()) && t_current[device.index].device() == device)
    return t_current[device.index];
  return Stream::default_stream(device);
}

void set_current_stream(const Stream& stream) {
  const int i = stream.device().index;
  if (i >= static_cast<int>(t_current.size())) {
    for (int d = static_cast<int>(t_current.size()); d <= i; ++d)
      t_current.push_back(Stream::default_stream(cuda_device(d)));
  }
  t_current[i] = stream;
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())) {
  set_current_stream(stream);
}
StreamGuard::~StreamGuard() { set_current_stream(previous_); }

// ---- events ------------------------------------------------------------------------------------------

Event::Event(bool enable_timing) : timing_(enable_timing) {}

void Event::record(const Stream& stream) {
  if (!handle_ || stream.device() != device_) {
    cuda::check_device(stream.device());
    cuda::check(cudaSetDevice(stream.device().index), "cudaSetDevice");
    cudaEvent_t e = nullptr;
    cuda::check(cudaEventCreateWithFlags(&e, timing_ ? cudaEventDefault : cudaEventDisableTiming),
                "cudaEventCreate");
    const int dev = stream.device().index;
    handle_ = std::shared_ptr<void>(static_cast<void*>(e), [dev](void* p) {
      cudaSetDevice(dev);
      cudaEventDestroy(static_cast<cudaEvent_t>(p));
    });
    device_ = stream.device();
  }
  cuda::check(cudaEventRecord(static_cast<cudaEvent_t>(handle_.get()), raw(stream)), "cudaEventRecord");
  recorded_ = true;
}

void Event::wait(const Stream& stream) const {
  if (!recorded_) return;  // nothing to wait for, as with CUDA's own semantics
  cuda::check(cudaStreamWaitEvent(raw(stream), static_cast<cudaEvent_t>(handle_.get()), 0), "cudaStreamWaitEvent");
}

bool Event::query() const {
  if (!recorded_) return true;
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(handle_.get()));
  if (e == cudaErrorNotReady) return false;
  cuda::check(e, "cudaEventQuery");
  return true;
}

void Event::synchronize() const {
  if (!recorded_) return;
  cuda::check(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_.get())), "cudaEventSynchronize");
  cuda::check_device_errors(device_.index);
}

float Event::elapsed_ms(const Event& start) const {
  KILN_CHECK(timing_ && start.timing_, "Event::elapsed_ms: both events need enable_timing=true");
  KILN_CHECK(recorded_ && start.recorded_, "Event::elapsed_ms: both events must be recorded first");
  float ms = 0;
  cuda::check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_.get()),
                                   static_cast<cudaEvent_t>(handle_.get())),
              "cudaEventElapsedTime");
  return ms;
}

void synchronize(Device device) {
  cuda::check_device(device);
  cuda::check(cudaSetDevice(device.index), "cudaSetDevice");
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cuda::check_device_errors(device.index);
}

// ---- async readback ----------------------------------------------------------------------------------

struct AsyncReadback::Impl {
  Device device;
  size_t capacity = 0;
  void* host = nullptr;
  Event done;
  ~Impl() {
    if (host) cudaFreeHost(host);
  }
};

AsyncReadback::AsyncReadback(Device device, size_t capacity_bytes) : impl_(std::make_unique<Impl>()) {
  cuda::check_device(device);
  impl_->device = device;
  impl_->capacity = capacity_bytes;
  cuda::check(cudaSetDevice(device.index), "cudaSetDevice");
  cuda::check(cudaHostAlloc(&impl_->host, std::max<size_t>(capacity_bytes, 1), cudaHostAllocDefault),
              "cudaHostAlloc (readback)");
}
AsyncReadback::~AsyncReadback() = default;
AsyncReadback::AsyncReadback(AsyncReadback&&) noexcept = default;
AsyncReadback& AsyncReadback::operator=(AsyncReadback&&) noexcept = default;

void AsyncReadback::copy(const Tensor& src, const Stream& stream) {
  KILN_CHECK(src.device() == impl_->device && src.is_contiguous(), "AsyncReadback::copy: needs a contiguous tensor on ",
             impl_->device.str(), ", got ", src.meta());
  KILN_CHECK(src.nbytes() <= impl_->capacity, "AsyncReadback::copy: ", src.nbytes(), " bytes exceed the buffer's ",
             impl_->capacity);
  KILN_CHECK(stream.device() == impl_->device, "AsyncReadback::copy: stream of ", stream.device().str());
  cuda::check(cudaMemcpyAsync(impl_->host, src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToHost, raw(stream)),
              "cudaMemcpyAsync (readback)");
  impl_->done.record(stream);
}

const void* AsyncReadback::wait() const {
  impl_->done.synchronize();
  return impl_->host;
}

// ---- graphs ------------------------------------------------------------------------------------------

struct Graph::Impl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Stream stream;
  uint64_t pool = 0;
  int device = 0;
  ~Impl() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (pool) cuda::CachingAllocator::get(device).release_private_pool(pool);
  }
};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;

void Graph::capture(const Stream& stream, const std::function<void()>& body) {
  KILN_CHECK(!stream.is_default(), "Graph::capture: capture needs a created stream (Stream::create), not the ",
             "default stream");
  impl_ = std::make_unique<Impl>();
  impl_->stream = stream;
  impl_->device = stream.device().index;
  impl_->pool = cuda::CachingAllocator::new_pool_id();
  cuda::check(cudaSetDevice(impl_->device), "cudaSetDevice");
  StreamGuard guard(stream);
  cuda::CachingAllocator::begin_private_pool(impl_->pool);
  // Thread-local mode: an op that synchronises or calls an unsafe API on this thread during capture makes
  // the capture fail, which is how tests prove ops never sync.
  cudaError_t e = cudaStreamBeginCapture(raw(stream), cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    cuda::CachingAllocator::end_private_pool();
    cuda::check(e, "cudaStreamBeginCapture");
  }
  try {
    body();
  } catch (...) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(raw(stream), &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    cuda::CachingAllocator::end_private_pool();
    throw;
  }
  cuda::CachingAllocator::end_private_pool();
  e = cudaStreamEndCapture(raw(stream), &impl_->graph);
  cuda::check(e, "Graph::capture (an op in the captured region synchronised or used an API that is not "
                 "allowed during capture)");
  cuda::check(cudaGraphInstantiate(&impl_->exec, impl_->graph, 0), "cudaGraphInstantiate");
}

void Graph::replay(const Stream& stream) const {
  KILN_CHECK(captured(), "Graph::replay: nothing has been captured");
  cuda::check(cudaGraphLaunch(impl_->exec, raw(stream)), "cudaGraphLaunch");
}
void Graph::replay() const { replay(impl_->stream); }
bool Graph::captured() const { return impl_ && impl_->exec != nullptr; }

// ---- memory and properties ---------------------------------------------------------------------------

MemoryStats memory_stats(Device device) {
  cuda::check_device(device);
  return cuda::CachingAllocator::get(device.index).stats();
}
void reset_peak_memory_stats(Device device) {
  cuda::check_device(device);
  cuda::CachingAllocator::get(device.index).reset_peak();
}
void empty_cache(Device device) {
  cuda::check_device(device);
  cuda::CachingAllocator::get(device.index).empty_cache();
}

int cuda_driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) cudaGetLastError();
  return v;
}
int cuda_runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) cudaGetLastError();
  return v;
}

DeviceProperties device_properties(Device device) {
  cuda::check_device(device);
  cudaDeviceProp p{};
  cuda::check(cudaGetDeviceProperties(&p, device.index), "cudaGetDeviceProperties");
  DeviceProperties r;
  r.name = p.name;
  r.major = p.major;
  r.minor = p.minor;
  r.multiprocessors = p.multiProcessorCount;
  r.total_memory = static_cast<int64_t>(p.totalGlobalMem);
  r.l2_bytes = p.l2CacheSize;
  r.shared_per_block_optin = static_cast<int64_t>(p.sharedMemPerBlockOptin);
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrClockRate, device.index) == cudaSuccess) r.clock_mhz = v / 1000;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, device.index) == cudaSuccess)
    r.memory_clock_mhz = v / 1000;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, device.index) == cudaSuccess)
    r.bus_width_bits = v;
  cudaGetLastError();
  r.kernels_compiled = cuda::kernels_runnable(device.index);
  return r;
}

void Tensor::record_stream(const Stream& stream) const {
  KILN_CHECK(is_cuda(), "record_stream: ", meta(), " is not a CUDA tensor");
  KILN_CHECK(stream.device() == device(), "record_stream: stream of ", stream.device().str(), " for a tensor on ",
             device().str());
  cuda::CachingAllocator::get(device().index).record_stream(storage()->data(), raw(stream));
}

}  // namespace kiln
