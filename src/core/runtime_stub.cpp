// kiln/runtime.h in a build without the CUDA backend: every call says so.
#include "kiln/runtime.h"
#include "kiln/tensor.h"

namespace kiln {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(str(what, ": this build of kiln has no CUDA backend (configure with KILN_CUDA=ON and a CUDA toolkit)"));
}
}  // namespace

Stream Stream::create(Device, int) { no_cuda("Stream::create"); }
Stream Stream::default_stream(Device) { no_cuda("Stream::default_stream"); }
Stream Stream::from_handle(Device, void*) { no_cuda("Stream::from_handle"); }
int Stream::priority() const { no_cuda("Stream::priority"); }
bool Stream::query() const { no_cuda("Stream::query"); }
void Stream::synchronize() const { no_cuda("Stream::synchronize"); }
Stream current_stream(Device) { no_cuda("current_stream"); }
void set_current_stream(const Stream&) { no_cuda("set_current_stream"); }
StreamGuard::StreamGuard(const Stream&) { no_cuda("StreamGuard"); }
StreamGuard::~StreamGuard() = default;
Event::Event(bool enable_timing) : timing_(enable_timing) {}
void Event::record(const Stream&) { no_cuda("Event::record"); }
void Event::wait(const Stream&) const { no_cuda("Event::wait"); }
bool Event::query() const { return true; }
void Event::synchronize() const {}
float Event::elapsed_ms(const Event&) const { no_cuda("Event::elapsed_ms"); }
void synchronize(Device) { no_cuda("synchronize"); }
struct Graph::Impl {};
Graph::Graph() = default;
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;
void Graph::capture(const Stream&, const std::function<void()>&) { no_cuda("Graph::capture"); }
void Graph::replay(const Stream&) const { no_cuda("Graph::replay"); }
void Graph::replay() const { no_cuda("Graph::replay"); }
bool Graph::captured() const { return false; }
MemoryStats memory_stats(Device) { no_cuda("memory_stats"); }
void reset_peak_memory_stats(Device) { no_cuda("reset_peak_memory_stats"); }
void empty_cache(Device) { no_cuda("empty_cache"); }
DeviceProperties device_properties(Device) { no_cuda("device_properties"); }
int cuda_driver_version() { return 0; }
int cuda_runtime_version() { return 0; }
struct AsyncReadback::Impl {};
AsyncReadback::AsyncReadback(Device, size_t) { no_cuda("AsyncReadback"); }
AsyncReadback::~AsyncReadback() = default;
AsyncReadback::AsyncReadback(AsyncReadback&&) noexcept = default;
AsyncReadback& AsyncReadback::operator=(AsyncReadback&&) noexcept = default;
void AsyncReadback::copy(const Tensor&, const Stream&) { no_cuda("AsyncReadback::copy"); }
const void* AsyncReadback::wait() const { no_cuda("AsyncReadback::wait"); }
void Tensor::record_stream(const Stream&) const { no_cuda("record_stream"); }

}  // namespace kiln
