#include "kiln/device.h"

#include <charconv>

#include "kiln/error.h"
#if KILN_HAVE_CUDA
#include "cuda/backend.h"
#endif

namespace kiln {

Device Device::parse(std::string_view s) {
  if (s == "cpu") return kCPU;
  if (s == "cuda" || s == "gpu") return cuda_device(0);
  if (s.substr(0, 5) == "cuda:") {
    int idx = -1;
    const auto r = std::from_chars(s.data() + 5, s.data() + s.size(), idx);
    if (r.ec == std::errc() && r.ptr == s.data() + s.size() && idx >= 0) return cuda_device(idx);
  }
  throw Error(::kiln::str("invalid device '", std::string(s), "'; expected cpu, cuda or cuda:N"));
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

bool cuda_available() { return cuda_device_count() > 0; }

int cuda_device_count() {
#if KILN_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace kiln
