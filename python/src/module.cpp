// The native module kiln._kiln; the package kiln (python/kiln) re-exports it under torch's layout.
#include "kiln/version.h"
#include "kiln_py.h"

NB_MODULE(_kiln, m) {
  using namespace kiln::py;
  m.doc() = "kiln: a tensor runtime for fast local inference on NVIDIA GPUs and the CPU";
  m.attr("__version__") = kiln::kVersion;
  m.attr("build_info") = nb::make_tuple(kiln::kBuildType, kiln::kCompiler, kiln::kCudaArchitectures);
  // kiln::Error is kiln.KilnError (a RuntimeError) with kiln's message; a failed device allocation is
  // kiln.OutOfMemoryError, a subclass of both KilnError and MemoryError. Translators registered later are
  // tried first: the subclass comes second.
  static nb::exception<kiln::Error> error(m, "KilnError", PyExc_RuntimeError);
  nb::object oom_bases = nb::make_tuple(error, nb::handle(PyExc_MemoryError));
  PyObject* oom = PyErr_NewExceptionWithDoc("kiln.OutOfMemoryError",
                                            "A device allocation failed after kiln's allocator freed its cache.",
                                            oom_bases.ptr(), nullptr);
  if (!oom) throw nb::python_error();
  m.attr("OutOfMemoryError") = nb::steal(oom);
  nb::register_exception_translator([](const std::exception_ptr& p, void* type) {
    try {
      std::rethrow_exception(p);
    } catch (const kiln::OutOfMemory& e) {
      PyErr_SetString(static_cast<PyObject*>(type), e.what());
    }
  }, oom);

  // A failed conversion inside a binding (nb::cast of an argument) is the caller's type error.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const nb::cast_error&) {
      PyErr_SetString(PyExc_TypeError, "an argument has the wrong type (see the function's signature)");
    }
  });

  nb::module_ cuda = m.def_submodule("cuda", "CUDA devices, streams, events and memory figures.");
  nb::module_ nn = m.def_submodule("nn", "Neural-network ops.");
  nb::module_ functional = nn.def_submodule("functional", "torch.nn.functional's names.");
  nb::module_ linalg = m.def_submodule("linalg", "Linear algebra under torch.linalg's names.");
  bind_dtypes(m);
  bind_tensor(m);
  bind_ops(m);
  bind_nn(m, functional);
  bind_runtime(m, cuda);
  bind_llm(m);
  bind_linalg(m, linalg);
  bind_functional(m, functional);
}
