// Writing GGUF files (version 3): the metadata, the tensor table and the tensors' bytes, each at an aligned
// offset. The layout is the one parse_gguf_header reads (kiln/gguf.h).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "kiln/gguf.h"

namespace kiln {

namespace {

class Out {
 public:
  Out(std::ofstream& os, const std::string& path) : os_(os), path_(path) {}
  void bytes(const void* p, size_t n) {
    os_.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    KILN_CHECK(os_.good(), path_, ": write failed after ", pos_, " bytes");
    pos_ += n;
  }
  template <class T>
  void pod(T v) {
    bytes(&v, sizeof(T));
  }
  void string(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const char zeros[256] = {};
    while (pos_ % alignment != 0) bytes(zeros, std::min<uint64_t>(alignment - pos_ % alignment, sizeof(zeros)));
  }
  uint64_t pos() const { return pos_; }

 private:
  std::ofstream& os_;
  const std::string& path_;
  uint64_t pos_ = 0;
};

void value(Out& o, const GgufValue& v, const std::string& key, const std::string& path, bool in_array = false) {
  using T = GgufValue::Type;
  switch (v.type) {
    case T::U8: o.pod<uint8_t>(static_cast<uint8_t>(v.as_int())); break;
    case T::I8: o.pod<int8_t>(static_cast<int8_t>(v.as_int())); break;
    case T::U16: o.pod<uint16_t>(static_cast<uint16_t>(v.as_int())); break;
    case T::I16: o.pod<int16_t>(static_cast<int16_t>(v.as_int())); break;
    case T::U32: o.pod<uint32_t>(static_cast<uint32_t>(v.as_int())); break;
    case T::I32: o.pod<int32_t>(static_cast<int32_t>(v.as_int())); break;
    case T::U64: {
      const auto* u = std::get_if<uint64_t>(&v.value);
      o.pod<uint64_t>(u ? *u : static_cast<uint64_t>(v.as_int()));
      break;
    }
    case T::I64: o.pod<int64_t>(v.as_int()); break;
    case T::F32: o.pod<float>(static_cast<float>(v.as_double())); break;
    case T::F64: o.pod<double>(v.as_double()); break;
    case T::Bool: o.pod<uint8_t>(std::get<bool>(v.value) ? 1 : 0); break;
    case T::String: o.string(v.as_string()); break;
    case T::Array: {
      KILN_CHECK(!in_array, path, ": metadata ", key, ": arrays of arrays are not written");
      const std::vector<GgufValue>& a = v.as_array();
      const T elem = a.empty() ? T::U8 : a[0].type;
      for (const GgufValue& e : a)
        KILN_CHECK(e.type == elem, path, ": metadata ", key, ": the elements of an array must share one type");
      o.pod<uint32_t>(static_cast<uint32_t>(elem));
      o.pod<uint64_t>(a.size());
      for (const GgufValue& e : a) value(o, e, key, path, true);
      break;
    }
  }
}

}  // namespace

void write_gguf(const std::string& path, const std::vector<std::pair<std::string, GgufValue>>& metadata,
                const std::vector<GgufTensorToWrite>& tensors, uint64_t alignment) {
  KILN_CHECK(alignment >= 1 && alignment <= 4096 && (alignment & (alignment - 1)) == 0, path,
             ": alignment must be a power of two up to 4096, got ", alignment);
  // Sizes and offsets first: every tensor's type and shape are checked before anything is written.
  std::vector<uint64_t> sizes, offsets;
  uint64_t at = 0;
  std::set<std::string> names;
  for (const GgufTensorToWrite& t : tensors) {
    // ggml's limits: names shorter than GGML_MAX_NAME (64), each once.
    KILN_CHECK(!t.name.empty() && t.name.size() < 64, path, ": tensor name '", t.name, "' must be 1 to 63 bytes");
    KILN_CHECK(names.insert(t.name).second, path, ": the tensor ", t.name, " is given twice");
    KILN_CHECK(!t.shape.empty() && t.shape.size() <= kGgufMaxRank, path, ": ", t.name, ": rank ", t.shape.size(),
               " is not 1..", kGgufMaxRank);
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      KILN_CHECK(d >= 0 && (d == 0 || n <= (uint64_t{1} << 62) / static_cast<uint64_t>(d)), path, ": ", t.name,
                 ": the dims ", shape_str(t.shape), " are negative or their product overflows");
      n *= static_cast<uint64_t>(d);
    }
    const uint64_t bytes = gguf_type_bytes(t.type, n);
    KILN_CHECK(bytes > 0 || n == 0, path, ": ", t.name, ": ", n, " elements cannot be stored as ", gguf_type_name(t.type),
               " (an unknown type, or a count that is not a whole number of its blocks)");
    KILN_CHECK(gguf_type_bytes(t.type, static_cast<uint64_t>(t.shape.back())) > 0 || t.shape.back() == 0, path, ": ",
               t.name, ": rows of ", t.shape.back(), " elements are not whole ", gguf_type_name(t.type), " blocks");
    at = (at + alignment - 1) / alignment * alignment;
    offsets.push_back(at);
    sizes.push_back(bytes);
    at += bytes;
  }
  std::vector<std::pair<std::string, GgufValue>> kv = metadata;
  if (alignment != 32) kv.emplace_back("general.alignment", GgufValue{GgufValue::Type::U32, uint64_t{alignment}});
  std::set<std::string> keys;
  for (const auto& [key, v] : kv) KILN_CHECK(keys.insert(key).second, path, ": the metadata key ", key, " is given twice");

  const std::string tmp = path + ".tmp";
  try {
    std::ofstream os(tmp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(os.good(), tmp, ": cannot open for writing");
    Out o(os, tmp);
    o.bytes("GGUF", 4);
    o.pod<uint32_t>(3);
    o.pod<uint64_t>(tensors.size());
    o.pod<uint64_t>(kv.size());
    for (const auto& [key, v] : kv) {
      o.string(key);
      o.pod<uint32_t>(static_cast<uint32_t>(v.type));
      value(o, v, key, tmp);
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const GgufTensorToWrite& t = tensors[i];
      o.string(t.name);
      o.pod<uint32_t>(static_cast<uint32_t>(t.shape.size()));
      for (size_t d = t.shape.size(); d-- > 0;) o.pod<uint64_t>(static_cast<uint64_t>(t.shape[d]));  // ggml's ne order
      o.pod<uint32_t>(t.type);
      o.pod<uint64_t>(offsets[i]);
    }
    o.pad_to(alignment);
    const uint64_t data = o.pos();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::vector<uint8_t> b = tensors[i].bytes();
      KILN_CHECK(b.size() == sizes[i], tmp, ": ", tensors[i].name, ": ", b.size(), " bytes given, ",
                 gguf_type_name(tensors[i].type), " ", shape_str(tensors[i].shape), " takes ", sizes[i]);
      o.pad_to(alignment);
      KILN_CHECK(o.pos() - data == offsets[i], tmp, ": internal offset mismatch at ", tensors[i].name);
      o.bytes(b.data(), b.size());
    }
    o.pad_to(alignment);  // the last tensor padded too, as ggml's reader expects the data section to be
    os.close();
    KILN_CHECK(!os.fail(), tmp, ": closing failed");
    std::filesystem::rename(tmp, path);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

}  // namespace kiln
