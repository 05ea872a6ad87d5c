// kiln.cuda: devices, streams, events, synchronisation and the three memory figures (kiln/runtime.h).
// In a build without CUDA, or on a machine without a GPU, each call that needs one raises kiln.KilnError
// saying why; is_available() is then False.
#include <nanobind/stl/function.h>

#include "kiln/runtime.h"
#include "kiln_py.h"

namespace kiln::py {

namespace {

Device cuda_or_current(std::optional<Device> d) {
  if (!d) return cuda_device(0);
  KILN_CHECK(d->is_cuda(), "kiln.cuda: ", d->str(), " is not a CUDA device");
  return *d;
}

// What a stream argument may be: a kiln.cuda.Stream, or None for the current stream.
Stream stream_or_current(std::optional<Stream> s, Device d) { return s ? *s : current_stream(d); }

}  // namespace

void bind_runtime(nb::module_& m, nb::module_& cuda) {
  cuda.def("is_available", &cuda_available, "True when this build has the CUDA backend and a usable device.");
  cuda.def("device_count", &cuda_device_count);

  nb::class_<Stream>(cuda, "Stream", "A CUDA stream: kiln ops enqueue on the current stream of their device.")
      .def("__init__", [](Stream* s, std::optional<Device> device, int priority) {
        new (s) Stream(Stream::create(cuda_or_current(device), priority));
      }, nb::arg("device") = nb::none(), nb::arg("priority") = 0,
         "A new non-blocking stream; a negative priority is higher, as in CUDA.")
      .def_static("from_handle", [](uintptr_t handle, std::optional<Device> device) {
        return Stream::from_handle(cuda_or_current(device), reinterpret_cast<void*>(handle));
      }, nb::arg("handle"), nb::arg("device") = nb::none(),
         "A stream created elsewhere (a cudaStream_t as an integer, e.g. torch.cuda.Stream().cuda_stream), not owned.")
      .def_prop_ro("device", &Stream::device)
      .def_prop_ro("cuda_stream", [](const Stream& s) { return reinterpret_cast<uintptr_t>(s.handle()); },
                   "The cudaStream_t as an integer (0: the default stream).")
      .def_prop_ro("priority", &Stream::priority)
      .def("query", &Stream::query, "True when all work enqueued so far has completed.")
      .def("synchronize", &Stream::synchronize, release_gil())
      .def("wait_event", [](const Stream& s, const Event& e) { e.wait(s); }, nb::arg("event"))
      .def("wait_stream", [](const Stream& s, const Stream& other) {
        Event e;
        e.record(other);
        e.wait(s);
      }, nb::arg("stream"), "This stream waits, on the device, for the work enqueued so far on `stream`.")
      .def("record_event", [](const Stream& s, std::optional<Event*> e) {
        Event ev = e && *e ? **e : Event();
        ev.record(s);
        return ev;
      }, nb::arg("event") = nb::none())
      .def("__eq__", [](const Stream& a, const Stream& b) { return a == b; })
      .def("__hash__", [](const Stream& s) { return reinterpret_cast<intptr_t>(s.handle()); })
      .def("__repr__", [](const Stream& s) {
        return str("<kiln.cuda.Stream device=", s.device().str(), " cuda_stream=",
                   reinterpret_cast<uintptr_t>(s.handle()), ">");
      });

  nb::class_<Event>(cuda, "Event", "A CUDA event: marks a point in a stream, for waiting and timing.")
      .def(nb::init<bool>(), nb::arg("enable_timing") = false)
      .def("record", [](Event& e, std::optional<Stream> s) {
        if (s) e.record(*s);
        else e.record();
      }, nb::arg("stream") = nb::none())
      .def("wait", [](const Event& e, std::optional<Stream> s) { e.wait(stream_or_current(s, cuda_device(0))); },
           nb::arg("stream") = nb::none(), "`stream` (default: the current one) waits on the device for this event.")
      .def("query", &Event::query)
      .def("synchronize", &Event::synchronize, release_gil())
      .def("elapsed_time", [](const Event& start, const Event& end) { return end.elapsed_ms(start); },
           nb::arg("end_event"), "Milliseconds from this event to end_event (both recorded with timing).");

  cuda.def("current_stream", [](std::optional<Device> d) { return current_stream(cuda_or_current(d)); },
           nb::arg("device") = nb::none());
  cuda.def("default_stream", [](std::optional<Device> d) { return Stream::default_stream(cuda_or_current(d)); },
           nb::arg("device") = nb::none());
  cuda.def("set_stream", &set_current_stream, nb::arg("stream"),
           "Makes `stream` the current stream of its device for this thread.");
  cuda.def("synchronize", [](std::optional<Device> d) { synchronize(cuda_or_current(d)); },
           nb::arg("device") = nb::none(), release_gil(), "Blocks until all work on the device has completed.");
  cuda.def("memory_stats", [](std::optional<Device> d) {
    const MemoryStats s = memory_stats(cuda_or_current(d));
    nb::dict out;
    out["allocated_bytes"] = s.allocated;
    out["allocated_bytes_peak"] = s.allocated_peak;
    out["reserved_bytes"] = s.reserved;
    out["reserved_bytes_peak"] = s.reserved_peak;
    out["driver_used_bytes"] = s.driver_used;
    out["driver_used_bytes_peak"] = s.driver_used_peak;
    out["device_total_bytes"] = s.device_total;
    out["num_allocs"] = s.num_allocs;
    out["num_frees"] = s.num_frees;
    out["num_segments"] = s.num_segments;
    out["num_ooms"] = s.num_ooms;
    out["num_cache_flushes"] = s.num_cache_flushes;
    return out;
  }, nb::arg("device") = nb::none(),
     "The three memory figures, current and peak: bytes in live tensors (allocated), bytes kiln's caching "
     "allocator holds (reserved), and device memory in use as the driver reports it (driver_used).");
  cuda.def("memory_allocated", [](std::optional<Device> d) { return memory_stats(cuda_or_current(d)).allocated; },
           nb::arg("device") = nb::none());
  cuda.def("memory_reserved", [](std::optional<Device> d) { return memory_stats(cuda_or_current(d)).reserved; },
           nb::arg("device") = nb::none());
  cuda.def("reset_peak_memory_stats", [](std::optional<Device> d) { reset_peak_memory_stats(cuda_or_current(d)); },
           nb::arg("device") = nb::none());
  cuda.def("empty_cache", [](std::optional<Device> d) { empty_cache(cuda_or_current(d)); },
           nb::arg("device") = nb::none(), "Returns every cached block no tensor uses to the driver.");
  cuda.def("get_device_properties", [](std::optional<Device> d) {
    const DeviceProperties p = device_properties(cuda_or_current(d));
    nb::dict out;
    out["name"] = p.name;
    out["major"] = p.major;
    out["minor"] = p.minor;
    out["multi_processor_count"] = p.multiprocessors;
    out["total_memory"] = p.total_memory;
    out["l2_cache_size"] = p.l2_bytes;
    return out;
  }, nb::arg("device") = nb::none());
  m.def("mark_constant", &mark_constant, nb::arg("tensor"), release_gil(),
        "Promises that no kernel writes this tensor any more (a model's weights once loaded), after waiting for the "
        "kernels that did; one-row products may then stream it while the kernel before them ends.");
}

}  // namespace kiln::py
