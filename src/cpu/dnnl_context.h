// What kiln's oneDNN paths share (src/cpu/conv_dnnl.cpp, matmul_dnnl.cpp): a CPU engine and stream per thread, and
// the KILN_DNNL switch. Only in KILN_HAVE_DNNL builds.
#pragma once

#include <cstdlib>
#include <dnnl.hpp>
#include <string>

namespace kiln::cpu {

struct DnnlContext {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

inline DnnlContext& dnnl_context() {
  thread_local DnnlContext c;
  return c;
}

// KILN_DNNL=0 in the environment: kiln's own CPU paths instead of oneDNN's (for A/B measurements).
inline bool dnnl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_DNNL");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

}  // namespace kiln::cpu
