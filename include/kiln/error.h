// kiln::Error and the checks every op uses. Messages name the op, the shapes, dtypes and devices involved,
// and what would have been valid.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A device allocation failed after the allocator freed its cache and retried.
class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(const std::string& msg) : Error(msg) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class T, class... R>
void append(std::ostringstream& os, const T& v, const R&... rest);
}  // namespace detail

// Joins the arguments into one message (shapes print as [2, 3], dtypes and devices by name).
template <class... A>
std::string str(const A&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

std::string shape_str(const std::vector<int64_t>& shape);

namespace detail {
template <class T>
void append_one(std::ostringstream& os, const T& v) {
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) os << shape_str(v);
  else os << v;
}
template <class T, class... R>
void append(std::ostringstream& os, const T& v, const R&... rest) {
  append_one(os, v);
  append(os, rest...);
}
}  // namespace detail

}  // namespace kiln

// KILN_CHECK(cond, parts...): throws kiln::Error(str(parts...)) when cond is false. The message parts are
// only evaluated on failure.
#define KILN_CHECK(cond, ...)                           \
  do {                                                  \
    if (!(cond)) throw ::kiln::Error(::kiln::str(__VA_ARGS__)); \
  } while (0)
