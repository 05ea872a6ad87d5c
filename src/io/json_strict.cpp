#include "io/json_strict.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "io/utf8.h"
#include "kiln/error.h"

namespace kiln::io {

namespace {

using json = nlohmann::json;

// Forwards to nlohmann's tree builder after checking depth and key uniqueness.
class StrictSax {
 public:
  StrictSax(json& root, int max_depth) : dom_(root, false), max_depth_(max_depth) {}
  std::string error;

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) { return dom_.number_float(v, s); }
  bool string(json::string_t& v) { return dom_.string(v); }
  bool binary(json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    if (!enter()) return false;
    levels_.emplace_back();
    return dom_.start_object(n);
  }
  bool key(json::string_t& k) {
    if (!levels_.back().keys.insert(k).second) {
      error = str("duplicate key \"", k.substr(0, 80), "\" in ", path());
      return false;
    }
    levels_.back().current = k;
    return dom_.key(k);
  }
  bool end_object() {
    levels_.pop_back();
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (!enter()) return false;
    levels_.emplace_back();
    levels_.back().array = true;
    return dom_.start_array(n);
  }
  bool end_array() {
    levels_.pop_back();
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t pos, const std::string& tok, const nlohmann::detail::exception& ex) {
    if (error.empty()) error = str("invalid JSON at byte ", pos, ": ", ex.what());
    return false;
  }

 private:
  bool enter() {
    if (++depth_ > max_depth_) {
      error = str("JSON nested deeper than ", max_depth_, " levels");
      return false;
    }
    return true;
  }
  // The enclosing object as a path: "the top-level object" or e.g. "weight_map" or "a.b[]".
  std::string path() const {
    std::string p;
    for (size_t i = 0; i + 1 < levels_.size(); ++i) {
      if (levels_[i].array) {
        p += "[]";
      } else {
        if (!p.empty()) p += '.';
        p.append(levels_[i].current, 0, 80);
      }
    }
    return p.empty() ? std::string("the top-level object") : "\"" + p + "\"";
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  int max_depth_;
  int depth_ = 0;
  struct Level {
    std::set<std::string> keys;
    std::string current;  // the key whose value is being read
    bool array = false;
  };
  std::vector<Level> levels_;
};

}  // namespace

json parse_json_strict(std::string_view text, const std::string& source, int max_depth) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t bad = utf8_invalid_at(p, text.size());
  KILN_CHECK(bad == text.size(), "'", source, "': not valid UTF-8 (byte ", bad, ")");
  // nlohmann's lexer takes a NUL as the end of the input and would ignore what follows; JSON allows none.
  const size_t nul = text.find('\0');
  KILN_CHECK(nul == std::string_view::npos, "'", source, "': invalid JSON: a NUL byte at byte ", nul);
  json root;
  StrictSax sax(root, max_depth);
  const bool ok = json::sax_parse(text.data(), text.data() + text.size(), &sax, json::input_format_t::json, true);
  if (!ok) {
    // A partial tree may be as deep as the limit allows: that is bounded, so freeing it is safe.
    throw Error(str("'", source, "': ", sax.error.empty() ? std::string("invalid JSON") : sax.error));
  }
  return root;
}

std::string read_text_file(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILN_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(str("'", path, "' is not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw Error(str("'", path, "' is ", st.st_size, " bytes, above the limit of ", max_bytes));
  }
  std::string s(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < s.size()) {
    const ssize_t r = ::read(fd, s.data() + got, s.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int e = errno;
      ::close(fd);
      throw Error(str("reading '", path, "' failed after ", got, " bytes: ", r == 0 ? "unexpected end" : std::strerror(e)));
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  return s;
}

}  // namespace kiln::io
