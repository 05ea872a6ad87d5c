// The safetensors header: parsing and validation. The rules of the reference implementation (Hugging Face's
// safetensors crate) and more: it accepts duplicate keys (the last wins), unknown entry fields, and any
// JSON nesting depth; kiln rejects all three, caps the rank, and names the file and tensor in every error.
//
// The JSON is read by a SAX handler that knows the header's fixed shape ({name: {dtype, shape,
// data_offsets}} plus "__metadata__": {string: string}), so no document tree is built, nesting never goes
// deeper than three levels (deeper input fails at the first extra bracket), and memory stays proportional
// to the entries, not to the text.
#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "io/utf8.h"
#include "kiln/io.h"

namespace kiln {

namespace {

struct DTypeName {
  const char* name;
  DType dtype;
};
// Every dtype the format defines that kiln holds. The order is the reference's alignment order, which the
// writer sorts by (decreasing), so it is also the rank used there.
constexpr DTypeName kDTypes[] = {
    {"BOOL", DType::Bool}, {"U8", DType::U8},         {"I8", DType::I8},       {"F8_E5M2", DType::F8E5M2},
    {"F8_E4M3", DType::F8E4M3}, {"I16", DType::I16},  {"U16", DType::U16},     {"F16", DType::F16},
    {"BF16", DType::BF16}, {"I32", DType::I32},       {"U32", DType::U32},     {"F32", DType::F32},
    {"C64", DType::C64},   {"F64", DType::F64},       {"I64", DType::I64},     {"U64", DType::U64},
};
// Dtypes of newer versions of the format that kiln has no type for.
constexpr const char* kUnsupported[] = {"F4", "F6_E2M3", "F6_E3M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"};

std::string supported_list() {
  std::string s;
  for (const auto& d : kDTypes) {
    if (!s.empty()) s += ' ';
    s += d.name;
  }
  return s;
}

// A short, printable rendering of untrusted text for an error message.
std::string shown(std::string_view s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 80; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) out += str("\\x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
    else out += static_cast<char>(c);
  }
  if (s.size() > 80) out += "...";
  return out + "'";
}

class HeaderSax {
 public:
  using json = nlohmann::json;


  std::string error;
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;

  bool null() {
    if (st_ == St::TopValue && key_ == "__metadata__") {  // the reference reads null as "no metadata"
      st_ = St::Top;
      return true;
    }
    return unexpected("null");
  }
  bool boolean(bool) { return unexpected("a boolean"); }
  bool binary(json::binary_t&) { return unexpected("binary data"); }
  bool number_float(json::number_float_t v, const json::string_t& text) {
    return unexpected(str("the number ", text.substr(0, 40), " (not an unsigned integer, or too large)"));
  }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return number_unsigned(static_cast<uint64_t>(v));
    return unexpected(str("the negative number ", v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (st_ == St::Shape) {
      if (entry_.shape.size() >= kSafetensorsMaxRank)
        return fail(str(in_entry(), "shape has more than ", kSafetensorsMaxRank, " dims"));
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return fail(str(in_entry(), "shape dim ", entry_.shape.size(), " is ", v, ", above the largest size ",
                        std::numeric_limits<int64_t>::max()));
      entry_.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (st_ == St::Offsets) {
      if (n_offsets_ >= 2) return fail(str(in_entry(), "data_offsets has more than 2 values"));
      (n_offsets_++ == 0 ? entry_.begin : entry_.end) = v;
      return true;
    }
    return unexpected(str("the number ", v));
  }
  bool string(json::string_t& v) {
    if (st_ == St::MetaValue) {
      metadata.emplace(std::move(mkey_), std::move(v));
      st_ = St::Meta;
      return true;
    }
    if (st_ == St::EntryValue && field_ == Field::DType) {
      for (const auto& d : kDTypes)
        if (v == d.name) {
          entry_.dtype = d.dtype;
          st_ = St::Entry;
          return true;
        }
      for (const char* u : kUnsupported)
        if (v == u)
          return fail(str(in_entry(), "dtype ", v, " is a safetensors dtype kiln does not support (supported: ",
                          supported_list(), ")"));
      return fail(str(in_entry(), "unknown dtype ", shown(v), " (valid: ", supported_list(), ")"));
    }
    return unexpected(str("the string ", shown(v)));
  }
  bool start_object(std::size_t) {
    if (st_ == St::Start) {
      st_ = St::Top;
      return true;
    }
    if (st_ == St::TopValue) {
      if (key_ == "__metadata__") {
        st_ = St::Meta;
      } else {
        entry_ = SafetensorsEntry{};
        entry_.name = key_;
        seen_ = 0;
        st_ = St::Entry;
      }
      return true;
    }
    return unexpected("an object");
  }
  bool key(json::string_t& k) {
    if (st_ == St::Top) {
      if (!top_keys_.insert(k).second) return fail(str("duplicate key ", shown(k), " in the header"));
      key_ = std::move(k);
      st_ = St::TopValue;
      return true;
    }
    if (st_ == St::Meta) {
      if (metadata.count(k)) return fail(str("duplicate key ", shown(k), " in __metadata__"));
      mkey_ = std::move(k);
      st_ = St::MetaValue;
      return true;
    }
    if (st_ == St::Entry) {
      if (k == "dtype") field_ = Field::DType;
      else if (k == "shape") field_ = Field::Shape;
      else if (k == "data_offsets") field_ = Field::Offsets;
      else return fail(str(in_entry(), "unknown field ", shown(k), " (valid: dtype, shape, data_offsets)"));
      const unsigned bit = 1u << static_cast<int>(field_);
      if (seen_ & bit) return fail(str(in_entry(), "duplicate field ", shown(k)));
      seen_ |= bit;
      st_ = St::EntryValue;
      return true;
    }
    return unexpected("a key");  // not reached: the parser only reports keys inside objects
  }
  bool end_object() {
    if (st_ == St::Top) {
      st_ = St::End;
      return true;
    }
    if (st_ == St::Meta) {
      st_ = St::Top;
      return true;
    }
    if (st_ == St::Entry) {
      if (seen_ != 7u) {
        const char* missing = !(seen_ & 1u) ? "dtype" : !(seen_ & 2u) ? "shape" : "data_offsets";
        return fail(str(in_entry(), "missing field ", missing));
      }
      tensors.push_back(std::move(entry_));
      st_ = St::Top;
      return true;
    }
    return unexpected("the end of an object");
  }
  bool start_array(std::size_t) {
    if (st_ == St::EntryValue && field_ == Field::Shape) {
      st_ = St::Shape;
      return true;
    }
    if (st_ == St::EntryValue && field_ == Field::Offsets) {
      n_offsets_ = 0;
      st_ = St::Offsets;
      return true;
    }
    return unexpected("an array");
  }
  bool end_array() {
    if (st_ == St::Shape) {
      st_ = St::Entry;
      return true;
    }
    if (st_ == St::Offsets) {
      if (n_offsets_ != 2) return fail(str(in_entry(), "data_offsets has ", n_offsets_, " values, not 2"));
      st_ = St::Entry;
      return true;
    }
    return unexpected("the end of an array");
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
    if (error.empty()) error = str("invalid JSON in the header (byte ", position, " of it): ", ex.what());
    return false;
  }

 private:
  enum class St { Start, Top, TopValue, Meta, MetaValue, Entry, EntryValue, Shape, Offsets, End };
  enum class Field { DType = 0, Shape = 1, Offsets = 2 };

  std::string in_entry() const { return str("tensor ", shown(entry_.name), ": "); }
  bool fail(std::string msg) {
    error = std::move(msg);
    return false;
  }
  // A JSON value where the header's structure does not allow it.
  bool unexpected(const std::string& what) {
    switch (st_) {
      case St::Start: return fail(str("the header is not a JSON object (found ", what, ")"));
      case St::TopValue:
        if (key_ == "__metadata__") return fail(str("__metadata__ must be an object of strings, found ", what));
        return fail(str("tensor ", shown(key_), ": entry must be an object {dtype, shape, data_offsets}, found ",
                        what));
      case St::MetaValue:
        return fail(str("__metadata__ value of ", shown(mkey_), " must be a string, found ", what));
      case St::EntryValue:
        if (field_ == Field::DType) return fail(str(in_entry(), "dtype must be a string, found ", what));
        return fail(str(in_entry(), field_ == Field::Shape ? "shape" : "data_offsets",
                        " must be an array of unsigned integers, found ", what));
      case St::Shape: return fail(str(in_entry(), "shape must hold unsigned integers, found ", what));
      case St::Offsets: return fail(str(in_entry(), "data_offsets must hold unsigned integers, found ", what));
      default: return fail(str("unexpected ", what, " in the header"));
    }
  }

  St st_ = St::Start;
  std::string key_, mkey_;
  std::set<std::string, std::less<>> top_keys_;
  SafetensorsEntry entry_;
  Field field_ = Field::DType;
  unsigned seen_ = 0;
  int n_offsets_ = 0;
};

}  // namespace

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  throw Error(str("safetensors: dtype ", dtype_name(t), " has no safetensors name"));
}

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, const std::string& source) {
  auto fail = [&](const std::string& msg) { return Error(str("safetensors file '", source, "': ", msg)); };
  if (size < 8) throw fail(str("file is ", size, " bytes, shorter than the 8-byte header length"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian whatever the host
  if (n > kSafetensorsMaxHeaderBytes)
    throw fail(str("header length ", n, " is above the limit of ", kSafetensorsMaxHeaderBytes, " bytes"));
  if (n > size - 8)
    throw fail(str("header length ", n, " runs past the end of the file (", size, " bytes)"));
  const uint8_t* text = bytes + 8;
  if (n == 0 || text[0] != '{') throw fail("the header does not start with '{' (it must be a JSON object)");
  const size_t bad = io::utf8_invalid_at(text, n);
  if (bad != n) throw fail(str("the header is not valid UTF-8 (byte ", bad, " of it)"));
  // JSON allows no raw NUL anywhere, but nlohmann's lexer takes one as the end of the input and would
  // ignore whatever follows it.
  if (const void* z = std::memchr(text, 0, n))
    throw fail(str("invalid JSON in the header: a NUL byte at byte ", static_cast<const uint8_t*>(z) - text, " of it"));

  HeaderSax sax;
  const char* first = reinterpret_cast<const char*>(text);
  // Strict: nothing but whitespace may follow the object (the writer pads with spaces).
  const bool ok = nlohmann::json::sax_parse(first, first + n, &sax, nlohmann::json::input_format_t::json, true);
  if (!ok) throw fail(sax.error.empty() ? std::string("invalid header") : sax.error);

  SafetensorsHeader h;
  h.header_bytes = n;
  h.data_offset = 8 + n;
  h.data_bytes = size - 8 - n;
  h.metadata = std::move(sax.metadata);
  h.tensors = std::move(sax.tensors);
  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end != b.end ? a.end < b.end : a.name < b.name;
  });

  // The data section must be covered exactly: each tensor starts where the previous one ends, the first at
  // 0, the last ends at the end of the file, and each is as long as its shape and dtype say.
  uint64_t pos = 0;
  for (const SafetensorsEntry& e : h.tensors) {
    auto bad_tensor = [&](const std::string& msg) { return fail(str("tensor ", shown(e.name), ": ", msg)); };
    if (e.end < e.begin) throw bad_tensor(str("data_offsets [", e.begin, ", ", e.end, "] end before they begin"));
    if (e.end > h.data_bytes)
      throw bad_tensor(str("data_offsets [", e.begin, ", ", e.end, "] run past the end of the data (",
                           h.data_bytes, " bytes)"));
    if (e.begin > pos)
      throw bad_tensor(str("data_offsets [", e.begin, ", ", e.end, "] leave a gap after byte ", pos,
                           " (tensors must be packed from offset 0 without gaps)"));
    if (e.begin < pos)
      throw bad_tensor(str("data_offsets [", e.begin, ", ", e.end, "] overlap the tensor before, which ends at ",
                           pos));
    uint64_t numel = 1;
    for (int64_t d : e.shape) {
      if (d != 0 && numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))
        throw bad_tensor(str("shape ", shape_str(e.shape), " has more elements than 2^64"));
      numel *= static_cast<uint64_t>(d);
    }
    if (numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw bad_tensor(str("shape ", shape_str(e.shape), " has more than 2^63 elements"));
    const uint64_t item = itemsize(e.dtype);
    if (numel > std::numeric_limits<uint64_t>::max() / item)
      throw bad_tensor(str("shape ", shape_str(e.shape), " of ", safetensors_dtype_name(e.dtype),
                           " has more than 2^64 bytes"));
    if (numel * item != e.nbytes())
      throw bad_tensor(str("shape ", shape_str(e.shape), " of ", safetensors_dtype_name(e.dtype), " needs ",
                           numel * item, " bytes, but data_offsets [", e.begin, ", ", e.end, "] hold ", e.nbytes()));
    pos = e.end;
  }
  if (pos != h.data_bytes)
    throw fail(str("the tensors cover ", pos, " bytes of data, but the file has ", h.data_bytes,
                   " bytes after the header (trailing bytes are not allowed)"));
  return h;
}

}  // namespace kiln
