// Writing safetensors files in the byte layout of Hugging Face's writer (the safetensors crate's
// serialize): tensors sorted by decreasing dtype alignment, then by name (byte order); data packed in that
// order from offset 0; compact JSON with "__metadata__" first, fields in the order dtype, shape,
// data_offsets, strings escaped as serde_json does; spaces pad the header to a multiple of 8 bytes, so every
// tensor is aligned to its item size in the file.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "io/utf8.h"
#include "kiln/io.h"

namespace kiln {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

// The reference's alignment order of dtypes (its Dtype enum order); the writer sorts by it, decreasing.
int alignment_rank(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::U8: return 1;
    case DType::I8: return 2;
    case DType::F8E5M2: return 3;
    case DType::F8E4M3: return 4;
    case DType::I16: return 5;
    case DType::U16: return 6;
    case DType::F16: return 7;
    case DType::BF16: return 8;
    case DType::I32: return 9;
    case DType::U32: return 10;
    case DType::F32: return 11;
    case DType::C64: return 12;
    case DType::F64: return 13;
    case DType::I64: return 14;
    case DType::U64: return 15;
  }
  return 0;
}

// serde_json's string escaping: quote, backslash and control characters; everything else (UTF-8
// included) verbatim.
void append_json_string(std::string& out, const std::string& s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void check_text(const std::string& s, const char* what) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  KILN_CHECK(io::utf8_invalid_at(p, s.size()) == s.size(), "save_safetensors: ", what, " '", s,
             "' is not valid UTF-8");
}

struct Prepared {
  std::string header;  // padded JSON
  std::vector<const std::pair<std::string, Tensor>*> order;
  uint64_t data_bytes = 0;
};

Prepared prepare(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  Prepared p;
  std::set<std::string_view> seen;
  for (const auto& nt : tensors) {
    KILN_CHECK(nt.first != "__metadata__", "save_safetensors: \"__metadata__\" is reserved, not a tensor name");
    KILN_CHECK(seen.insert(nt.first).second, "save_safetensors: tensor name '", nt.first, "' given twice");
    KILN_CHECK(nt.second.defined(), "save_safetensors: tensor '", nt.first, "' is undefined");
    check_text(nt.first, "tensor name");
    p.order.push_back(&nt);
  }
  std::stable_sort(p.order.begin(), p.order.end(), [](const auto* a, const auto* b) {
    const int ra = alignment_rank(a->second.dtype()), rb = alignment_rank(b->second.dtype());
    return ra != rb ? ra > rb : a->first < b->first;
  });
  std::string& h = p.header;
  h += '{';
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      check_text(k, "metadata key");
      check_text(v, "metadata value");
      if (!first) h += ',';
      first = false;
      append_json_string(h, k);
      h += ':';
      append_json_string(h, v);
    }
    h += '}';
    first = false;
  }
  for (const auto* nt : p.order) {
    const Tensor& t = nt->second;
    if (!first) h += ',';
    first = false;
    append_json_string(h, nt->first);
    h += ":{\"dtype\":\"";
    h += safetensors_dtype_name(t.dtype());
    h += "\",\"shape\":[";
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (d) h += ',';
      h += std::to_string(t.size(d));
    }
    const uint64_t begin = p.data_bytes;
    p.data_bytes += t.nbytes();
    h += str("],\"data_offsets\":[", begin, ",", p.data_bytes, "]}");
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');
  KILN_CHECK(h.size() <= kSafetensorsMaxHeaderBytes, "save_safetensors: the header would be ", h.size(),
             " bytes, above the limit of ", kSafetensorsMaxHeaderBytes, " that readers accept");
  return p;
}

void put_u64_le(uint8_t* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

// The tensor's bytes on the host, contiguous (a view when it already is, a copy otherwise).
Tensor host_contiguous(const Tensor& t) { return t.cpu().contiguous(); }

}  // namespace

std::vector<uint8_t> serialize_safetensors(const NamedTensors& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  const Prepared p = prepare(tensors, metadata);
  std::vector<uint8_t> out(8 + p.header.size() + p.data_bytes);
  put_u64_le(out.data(), p.header.size());
  std::memcpy(out.data() + 8, p.header.data(), p.header.size());
  size_t pos = 8 + p.header.size();
  for (const auto* nt : p.order) {
    const Tensor h = host_contiguous(nt->second);
    if (h.nbytes()) std::memcpy(out.data() + pos, h.data_ptr(), h.nbytes());
    pos += h.nbytes();
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const Prepared p = prepare(tensors, metadata);
  const std::string tmp = str(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KILN_CHECK(fd >= 0, "save_safetensors: cannot create '", tmp, "': ", std::strerror(errno));
  auto write_all = [&](const void* data, size_t n) {
    const auto* c = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int e = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        throw Error(str("save_safetensors: writing '", tmp, "' failed: ", std::strerror(e)));
      }
      c += w;
      n -= static_cast<size_t>(w);
    }
  };
  uint8_t len[8];
  put_u64_le(len, p.header.size());
  write_all(len, 8);
  write_all(p.header.data(), p.header.size());
  for (const auto* nt : p.order) {
    const Tensor h = host_contiguous(nt->second);  // one tensor at a time on the host
    write_all(h.data_ptr(), h.nbytes());
  }
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(str("save_safetensors: closing '", tmp, "' failed: ", std::strerror(e)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(str("save_safetensors: renaming '", tmp, "' to '", path, "' failed: ", std::strerror(e)));
  }
}

}  // namespace kiln
