// GGUF (kiln/gguf.h): the header parser, ggml's block formats dequantised to f32, and GgufFile.
#include "kiln/gguf.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <limits>
#include <unordered_map>

#include "io/mapping.h"
#include "kiln/ops.h"
#include "kiln/scalar_types.h"

namespace kiln {

namespace {

// ---- tensor types --------------------------------------------------------------------------------------------

struct TypeInfo {
  const char* name;
  uint32_t block;       // elements per block
  uint32_t block_bytes;
  bool readable;        // gguf_dequantize handles it
};

const TypeInfo* type_info(uint32_t t) {
  static const std::unordered_map<uint32_t, TypeInfo> table = {
      {0, {"F32", 1, 4, true}},       {1, {"F16", 1, 2, true}},       {2, {"Q4_0", 32, 18, true}},
      {3, {"Q4_1", 32, 20, true}},    {6, {"Q5_0", 32, 22, true}},    {7, {"Q5_1", 32, 24, true}},
      {8, {"Q8_0", 32, 34, true}},    {9, {"Q8_1", 32, 36, false}},   {10, {"Q2_K", 256, 84, false}},
      {11, {"Q3_K", 256, 110, false}}, {12, {"Q4_K", 256, 144, true}}, {13, {"Q5_K", 256, 176, true}},
      {14, {"Q6_K", 256, 210, true}}, {15, {"Q8_K", 256, 292, false}}, {24, {"I8", 1, 1, true}},
      {25, {"I16", 1, 2, true}},      {26, {"I32", 1, 4, true}},      {27, {"I64", 1, 8, true}},
      {28, {"F64", 1, 8, true}},      {30, {"BF16", 1, 2, true}},
  };
  const auto it = table.find(t);
  return it == table.end() ? nullptr : &it->second;
}

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_bits_to_f32(h);
}

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j from the 12 packed bytes.
void scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// One block of `type` at `b` into y (block elements).
void dequantize_block(uint32_t type, const uint8_t* b, float* y) {
  switch (type) {
    case 2: {  // Q4_0: d, 16 bytes of nibbles (low: elements 0..15, high: 16..31), value (q - 8) d
      const float d = half_at(b);
      const uint8_t* qs = b + 2;
      for (int j = 0; j < 16; ++j) {
        y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
        y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
      }
      return;
    }
    case 3: {  // Q4_1: d, m, nibbles; value q d + m
      const float d = half_at(b), m = half_at(b + 2);
      const uint8_t* qs = b + 4;
      for (int j = 0; j < 16; ++j) {
        y[j] = static_cast<float>(qs[j] & 0xF) * d + m;
        y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
      }
      return;
    }
    case 6:
    case 7: {  // Q5_0 (d; (q - 16) d) and Q5_1 (d, m; q d + m): the fifth bits in a 32-bit word
      const bool q51 = type == 7;
      const float d = half_at(b), m = q51 ? half_at(b + 2) : 0.0f;
      const uint32_t qh = load<uint32_t>(b + (q51 ? 4 : 2));
      const uint8_t* qs = b + (q51 ? 8 : 6);
      for (int j = 0; j < 16; ++j) {
        const int x0 = (qs[j] & 0xF) | static_cast<int>(((qh >> j) << 4) & 0x10);
        const int x1 = (qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
        y[j] = q51 ? static_cast<float>(x0) * d + m : static_cast<float>(x0 - 16) * d;
        y[j + 16] = q51 ? static_cast<float>(x1) * d + m : static_cast<float>(x1 - 16) * d;
      }
      return;
    }
    case 8: {  // Q8_0: d, 32 int8
      const float d = half_at(b);
      for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
      return;
    }
    case 12:
    case 13: {  // Q4_K / Q5_K: d, dmin, 12 bytes of 6-bit scales and mins, (Q5_K: 32 bytes of fifth bits), nibbles
      const bool q5 = type == 13;
      const float d = half_at(b), dmin = half_at(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* q = b + (q5 ? 48 : 16);
      uint8_t u1 = 1, u2 = 2;
      for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
        uint8_t sc, m;
        scale_min_k4(is, scales, sc, m);
        const float d1 = d * sc, m1 = dmin * m;
        scale_min_k4(is + 1, scales, sc, m);
        const float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; ++l) {
          const int h1 = q5 && (qh[l] & u1) ? 16 : 0, h2 = q5 && (qh[l] & u2) ? 16 : 0;
          y[j + l] = d1 * static_cast<float>((q[l] & 0xF) + h1) - m1;
          y[j + 32 + l] = d2 * static_cast<float>((q[l] >> 4) + h2) - m2;
        }
        q += 32;
        u1 = static_cast<uint8_t>(u1 << 2);
        u2 = static_cast<uint8_t>(u2 << 2);
      }
      return;
    }
    case 14: {  // Q6_K: 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales, d
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = half_at(b + 208);
      for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          y[n + l] = d * sc[is] * static_cast<float>(q1);
          y[n + l + 32] = d * sc[is + 2] * static_cast<float>(q2);
          y[n + l + 64] = d * sc[is + 4] * static_cast<float>(q3);
          y[n + l + 96] = d * sc[is + 6] * static_cast<float>(q4);
        }
        ql += 64;
        qh += 32;
        sc += 8;
      }
      return;
    }
    default: break;
  }
  throw Error(str("gguf: internal error: no block dequantisation for ", gguf_type_name(type)));
}

// ---- the header ------------------------------------------------------------------------------------------------

class Reader {
 public:
  Reader(const uint8_t* b, size_t n, const std::string& source) : b_(b), n_(n), source_(source) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(str("gguf file '", source_, "': ", what, " (at byte ", pos_, " of ", n_, ")"));
  }
  void need(uint64_t k, const char* what) const {
    if (k > n_ - pos_) fail(str("truncated: ", what, " needs ", k, " bytes, ", n_ - pos_, " remain"));
  }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v = load<T>(b_ + pos_);
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const uint64_t len = get<uint64_t>(what);
    if (len > kGgufMaxString) fail(str(what, ": a string of ", len, " bytes"));
    need(len, what);
    std::string s(reinterpret_cast<const char*>(b_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }
  GgufValue value(uint32_t type, const std::string& key, int depth) {
    GgufValue v;
    if (type > static_cast<uint32_t>(GgufValue::Type::F64)) fail(str("metadata '", key, "' has an unknown type ", type));
    v.type = static_cast<GgufValue::Type>(type);
    switch (v.type) {
      case GgufValue::Type::U8: v.value = uint64_t{get<uint8_t>("a u8")}; break;
      case GgufValue::Type::I8: v.value = int64_t{get<int8_t>("an i8")}; break;
      case GgufValue::Type::U16: v.value = uint64_t{get<uint16_t>("a u16")}; break;
      case GgufValue::Type::I16: v.value = int64_t{get<int16_t>("an i16")}; break;
      case GgufValue::Type::U32: v.value = uint64_t{get<uint32_t>("a u32")}; break;
      case GgufValue::Type::I32: v.value = int64_t{get<int32_t>("an i32")}; break;
      case GgufValue::Type::U64: v.value = get<uint64_t>("a u64"); break;
      case GgufValue::Type::I64: v.value = get<int64_t>("an i64"); break;
      case GgufValue::Type::F32: v.value = double{get<float>("an f32")}; break;
      case GgufValue::Type::F64: v.value = get<double>("an f64"); break;
      case GgufValue::Type::Bool: {
        const uint8_t x = get<uint8_t>("a bool");
        if (x > 1) fail(str("metadata '", key, "': a bool of value ", int(x)));
        v.value = x == 1;
        break;
      }
      case GgufValue::Type::String: v.value = string("a string"); break;
      case GgufValue::Type::Array: {
        if (depth >= 2) fail(str("metadata '", key, "': arrays nested more than twice"));
        const uint32_t et = get<uint32_t>("an array's type");
        const uint64_t count = get<uint64_t>("an array's length");
        if (count > kGgufMaxArray) fail(str("metadata '", key, "': an array of ", count, " elements"));
        // Every element takes at least one byte: a count beyond the bytes left is a lie, refused before
        // any allocation.
        if (count > n_ - pos_) fail(str("metadata '", key, "': an array of ", count, " elements in ", n_ - pos_, " bytes"));
        std::vector<GgufValue> items;
        items.reserve(static_cast<size_t>(count));
        for (uint64_t i = 0; i < count; ++i) items.push_back(value(et, key, depth + 1));
        v.value = std::move(items);
        break;
      }
    }
    return v;
  }
  size_t pos() const { return pos_; }

 private:
  const uint8_t* b_;
  size_t n_, pos_ = 0;
  const std::string& source_;
};

// a * b, or nullopt past 2^62.
bool mul_ok(uint64_t a, uint64_t b, uint64_t& out) {
  if (a != 0 && b > (uint64_t{1} << 62) / a) return false;
  out = a * b;
  return true;
}

}  // namespace

bool GgufValue::is_integer() const {
  return std::holds_alternative<uint64_t>(value) || std::holds_alternative<int64_t>(value);
}

int64_t GgufValue::as_int() const {
  if (const auto* u = std::get_if<uint64_t>(&value)) {
    KILN_CHECK(*u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "gguf: the value ", *u,
               " does not fit int64");
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  if (const auto* b = std::get_if<bool>(&value)) return *b ? 1 : 0;
  throw Error("gguf: expected an integer metadata value");
}

double GgufValue::as_double() const {
  if (const auto* d = std::get_if<double>(&value)) return *d;
  if (is_integer()) return static_cast<double>(as_int());
  throw Error("gguf: expected a numeric metadata value");
}

const std::string& GgufValue::as_string() const {
  const auto* s = std::get_if<std::string>(&value);
  KILN_CHECK(s != nullptr, "gguf: expected a string metadata value");
  return *s;
}

const std::vector<GgufValue>& GgufValue::as_array() const {
  const auto* a = std::get_if<std::vector<GgufValue>>(&value);
  KILN_CHECK(a != nullptr, "gguf: expected an array metadata value");
  return *a;
}

std::string gguf_type_name(uint32_t type) {
  const TypeInfo* t = type_info(type);
  return t ? std::string(t->name) : str("type ", type);
}

uint64_t gguf_type_bytes(uint32_t type, uint64_t n) {
  const TypeInfo* t = type_info(type);
  if (!t || n % t->block) return 0;
  return n / t->block * t->block_bytes;
}

GgufHeader parse_gguf_header(const uint8_t* bytes, size_t size, const std::string& source) {
  Reader r(bytes, size, source);
  GgufHeader h;
  const uint32_t magic = r.get<uint32_t>("the magic");
  if (magic != 0x46554747u) r.fail("not a GGUF file (the first 4 bytes are not \"GGUF\")");
  h.version = r.get<uint32_t>("the version");
  if (h.version != 2 && h.version != 3) r.fail(str("GGUF version ", h.version, " (kiln reads 2 and 3)"));
  const uint64_t n_tensors = r.get<uint64_t>("the tensor count");
  const uint64_t n_kv = r.get<uint64_t>("the metadata count");
  if (n_tensors > kGgufMaxTensors) r.fail(str(n_tensors, " tensors"));
  if (n_kv > kGgufMaxMetadata) r.fail(str(n_kv, " metadata entries"));
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = r.string("a metadata key");
    const uint32_t type = r.get<uint32_t>("a metadata type");
    GgufValue v = r.value(type, key, 0);
    if (!h.metadata.emplace(key, std::move(v)).second) r.fail(str("the metadata key '", key, "' appears twice"));
  }
  if (const auto it = h.metadata.find("general.alignment"); it != h.metadata.end()) {
    const GgufValue& a = it->second;
    if (!a.is_integer()) r.fail("general.alignment is not an integer");
    const int64_t al = a.as_int();
    if (al < 1 || al > (1 << 20) || (al & (al - 1)) != 0) r.fail(str("general.alignment ", al, " is not a power of two up to 2^20"));
    h.alignment = static_cast<uint64_t>(al);
  }
  std::unordered_map<std::string, size_t> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = r.string("a tensor name");
    const uint32_t rank = r.get<uint32_t>("a tensor's rank");
    if (rank == 0 || rank > kGgufMaxRank) r.fail(str("tensor '", t.name, "' has rank ", rank, " (1 to 4)"));
    std::vector<uint64_t> ne(rank);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < rank; ++d) {
      ne[d] = r.get<uint64_t>("a tensor dim");
      if (!mul_ok(numel, ne[d], numel)) r.fail(str("tensor '", t.name, "' has more than 2^62 elements"));
    }
    for (uint32_t d = rank; d-- > 0;) t.shape.push_back(static_cast<int64_t>(ne[d]));
    t.type = r.get<uint32_t>("a tensor type");
    const uint64_t rel = r.get<uint64_t>("a tensor offset");
    const TypeInfo* ti = type_info(t.type);
    if (ti) {
      if (ne[0] % ti->block) r.fail(str("tensor '", t.name, "': its rows of ", ne[0], " elements are not whole ", ti->name,
                                       " blocks of ", ti->block));
      t.nbytes = gguf_type_bytes(t.type, numel);
    }
    if (rel % h.alignment) r.fail(str("tensor '", t.name, "': offset ", rel, " is not a multiple of the alignment ", h.alignment));
    t.offset = rel;  // made absolute below, once the data section's start is known
    if (!names.emplace(t.name, h.tensors.size()).second) r.fail(str("the tensor '", t.name, "' appears twice"));
    h.tensors.push_back(std::move(t));
  }
  const uint64_t pos = r.pos();
  h.data_offset = (pos + h.alignment - 1) / h.alignment * h.alignment;
  if (h.data_offset > size && !h.tensors.empty()) r.fail("the data section starts past the end of the file");
  std::vector<size_t> order(h.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (GgufTensorInfo& t : h.tensors) {
    if (t.offset > size - h.data_offset || t.nbytes > size - h.data_offset - t.offset)
      throw Error(str("gguf file '", source, "': tensor '", t.name, "' (", gguf_type_name(t.type), ", ", t.nbytes,
                      " bytes at data offset ", t.offset, ") runs past the end of the file (", size, " bytes)"));
    t.offset += h.data_offset;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return h.tensors[a].offset < h.tensors[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const GgufTensorInfo &a = h.tensors[order[i - 1]], &b = h.tensors[order[i]];
    if (a.offset + a.nbytes > b.offset)
      throw Error(str("gguf file '", source, "': tensors '", a.name, "' and '", b.name, "' overlap"));
  }
  return h;
}

void gguf_dequantize(uint32_t type, const uint8_t* src, uint64_t n, float* dst) {
  const TypeInfo* t = type_info(type);
  KILN_CHECK(t && t->readable, "gguf: tensors of type ", gguf_type_name(type), " cannot be read yet");
  KILN_CHECK(n % t->block == 0, "gguf: ", n, " elements are not whole ", t->name, " blocks");
  switch (type) {
    case 0: std::memcpy(dst, src, n * 4); return;
    case 1:
      for (uint64_t i = 0; i < n; ++i) dst[i] = half_at(src + 2 * i);
      return;
    case 30:
      for (uint64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(load<uint16_t>(src + 2 * i));
      return;
    case 28:
      for (uint64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load<double>(src + 8 * i));
      return;
    case 24:
      for (uint64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(static_cast<int8_t>(src[i]));
      return;
    case 25:
      for (uint64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load<int16_t>(src + 2 * i));
      return;
    case 26:
      for (uint64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load<int32_t>(src + 4 * i));
      return;
    case 27:
      for (uint64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load<int64_t>(src + 8 * i));
      return;
    default: break;
  }
  const int64_t blocks = static_cast<int64_t>(n / t->block);
#pragma omp parallel for schedule(static) if (blocks > 4096)
  for (int64_t i = 0; i < blocks; ++i)
    dequantize_block(type, src + static_cast<uint64_t>(i) * t->block_bytes, dst + static_cast<uint64_t>(i) * t->block);
}

// ---- GgufFile ---------------------------------------------------------------------------------------------------

struct GgufFile::State {
  std::string path;
  const uint8_t* bytes = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
  GgufHeader header;
  std::unordered_map<std::string_view, size_t> index;
};

GgufFile GgufFile::from_memory(const uint8_t* bytes, size_t size, std::shared_ptr<const void> keep_alive,
                               std::string source) {
  auto s = std::make_shared<State>();
  s->path = std::move(source);
  s->bytes = bytes;
  s->size = size;
  s->owner = std::move(keep_alive);
  s->header = parse_gguf_header(bytes, size, s->path);
  for (size_t i = 0; i < s->header.tensors.size(); ++i) s->index.emplace(s->header.tensors[i].name, i);
  GgufFile f;
  f.s_ = std::move(s);
  return f;
}

GgufFile GgufFile::open(const std::string& path) {
  auto m = io::map_file(path, "gguf file");
  const auto* b = static_cast<const uint8_t*>(m->addr);
  const size_t n = m->size;
  return from_memory(b, n, m, path);
}

const std::string& GgufFile::path() const { return s_->path; }
const GgufHeader& GgufFile::header() const { return s_->header; }
bool GgufFile::contains(std::string_view name) const { return s_ && s_->index.count(name) > 0; }

const GgufTensorInfo& GgufFile::info(std::string_view name) const {
  KILN_CHECK(s_ != nullptr, "gguf: no file is open");
  const auto it = s_->index.find(name);
  KILN_CHECK(it != s_->index.end(), "gguf file '", s_->path, "' has no tensor '", name, "'");
  return s_->header.tensors[it->second];
}

Tensor GgufFile::get(std::string_view name, DType dtype) const {
  const GgufTensorInfo& t = info(name);
  const TypeInfo* ti = type_info(t.type);
  KILN_CHECK(ti && ti->readable, "gguf file '", s_->path, "': tensor '", t.name, "' is of type ", gguf_type_name(t.type),
             ", which kiln cannot read yet");
  // Stored as the dtype asked for (F32, F16, BF16): the bytes as they are, with no f32 copy between.
  const std::optional<DType> stored = t.type == 0    ? std::optional<DType>(DType::F32)
                                      : t.type == 1  ? std::optional<DType>(DType::F16)
                                      : t.type == 30 ? std::optional<DType>(DType::BF16)
                                                     : std::nullopt;
  if (stored == dtype) {
    Tensor out = empty(t.shape, dtype);
    // In range: parse_gguf_header checked every tensor's byte range against the file and its size against its
    // shape and type.
    std::memcpy(out.data_ptr(), s_->bytes + t.offset, out.nbytes());
    return out;
  }
  Tensor out = empty(t.shape, DType::F32);
  gguf_dequantize(t.type, s_->bytes + t.offset, static_cast<uint64_t>(out.numel()), out.data<float>());
  return dtype == DType::F32 ? out : out.to(dtype);
}

Tensor GgufFile::raw(std::string_view name) const {
  const GgufTensorInfo& t = info(name);
  const int64_t cols = t.shape.empty() ? 1 : t.shape.back();
  const int64_t rows = cols == 0 ? 0 : checked_numel(t.shape) / cols;
  const int64_t row_bytes = rows == 0 ? 0 : static_cast<int64_t>(t.nbytes) / rows;
  KILN_CHECK(rows * row_bytes == static_cast<int64_t>(t.nbytes), "gguf file '", s_->path, "': tensor '", t.name,
             "' of ", t.nbytes, " bytes does not split into ", rows, " rows");
  // In range: parse_gguf_header checked every tensor's byte range against the file.
  auto storage = wrap_host_memory(const_cast<uint8_t*>(s_->bytes + t.offset), static_cast<size_t>(t.nbytes), s_);
  const Shape shape{rows, row_bytes};
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0, DType::U8);
}

}  // namespace kiln
