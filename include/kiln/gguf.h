// GGUF files (llama.cpp's checkpoint format): the header (metadata and tensor table) validated completely
// before any tensor is read, and tensors dequantised to float. Every file is untrusted input: sizes, counts,
// offsets and types are checked against the file, and every error names the file and what is wrong.
//
// Tensor types read: F32, F16, BF16, F64, I8/I16/I32/I64 (converted), Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
// Q5_K, Q6_K (block formats as ggml defines them). Other types are listed in the header and refused by get().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// The limits on what a header may declare (the format sets none): far above real files, far below what
// would exhaust memory while parsing.
inline constexpr uint64_t kGgufMaxTensors = 1'000'000;
inline constexpr uint64_t kGgufMaxMetadata = 1'000'000;
inline constexpr uint64_t kGgufMaxArray = 100'000'000;     // elements of one metadata array
inline constexpr uint64_t kGgufMaxString = 1'000'000'000;  // bytes of one string
inline constexpr uint32_t kGgufMaxRank = 4;                // ggml tensors have at most 4 dims

// A metadata value: an integer (signed or not), a float, a bool, a string or an array of values.
struct GgufValue {
  enum class Type : uint32_t { U8 = 0, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64 };
  Type type = Type::U8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> value;

  bool is_integer() const;
  int64_t as_int() const;     // integers (and bools); throws for others or values beyond int64
  double as_double() const;   // numbers
  const std::string& as_string() const;
  const std::vector<GgufValue>& as_array() const;
};

struct GgufTensorInfo {
  std::string name;
  Shape shape;          // PyTorch's order (ggml's ne reversed: the last dim is contiguous)
  uint32_t type = 0;    // ggml_type
  uint64_t offset = 0;  // from the start of the file
  uint64_t nbytes = 0;
};

struct GgufHeader {
  uint32_t version = 0;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;  // where the tensor data section starts
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensorInfo> tensors;  // in file order
};

// Parses and validates a GGUF header over `size` bytes (the whole file): magic, version 2 or 3, metadata,
// tensor table, alignment, every tensor's byte range inside the file and not overlapping another.
GgufHeader parse_gguf_header(const uint8_t* bytes, size_t size, const std::string& source);

// ggml's name of a tensor type ("Q4_K", "F16", ...), or "type N" when unknown.
std::string gguf_type_name(uint32_t type);
// Bytes of `n` elements of a type (n a multiple of the type's block), or 0 when the type is unknown.
uint64_t gguf_type_bytes(uint32_t type, uint64_t n);

// Dequantises `n` elements of `type` from `src` into f32 `dst` (n a multiple of the type's block).
void gguf_dequantize(uint32_t type, const uint8_t* src, uint64_t n, float* dst);

class GgufFile {
 public:
  GgufFile() = default;
  static GgufFile open(const std::string& path);  // memory-mapped
  static GgufFile from_memory(const uint8_t* bytes, size_t size, std::shared_ptr<const void> keep_alive,
                              std::string source);

  const std::string& path() const;
  const GgufHeader& header() const;
  const std::map<std::string, GgufValue>& metadata() const { return header().metadata; }
  const GgufTensorInfo& info(std::string_view name) const;  // throws, naming the file, when absent
  bool contains(std::string_view name) const;
  // The tensor dequantised to f32 (or converted to `dtype`) on the CPU, in PyTorch's shape.
  Tensor get(std::string_view name, DType dtype = DType::F32) const;
  // The tensor's stored bytes as uint8 [rows, bytes per row] (rows: the product of every dim but the last), a
  // CPU view of the mapping (no copy) that keeps the file mapped. Any type, readable or not.
  Tensor raw(std::string_view name) const;

 private:
  struct State;
  std::shared_ptr<const State> s_;
};

// ---- writing ---------------------------------------------------------------------------------------------

// A tensor to write: its name, PyTorch-order shape, ggml type and a function that gives its stored bytes
// (gguf_type_bytes(type, elements) of them, asked for once, while the file is written, so that a converter
// holds one tensor at a time).
struct GgufTensorToWrite {
  std::string name;
  Shape shape;
  uint32_t type = 0;
  std::function<std::vector<uint8_t>()> bytes;
};

// Writes a GGUF (version 3) file: the metadata in the order given, the tensor table, then each tensor's bytes
// at an offset aligned to `alignment` (written as general.alignment when it is not 32). Checks every size
// against the type and throws, naming the file and the tensor, before the file is complete; the file is
// written to path + ".tmp" and renamed at the end, so a failure leaves no partial file under `path`.
void write_gguf(const std::string& path, const std::vector<std::pair<std::string, GgufValue>>& metadata,
                const std::vector<GgufTensorToWrite>& tensors, uint64_t alignment = 32);

// The name llama.cpp gives a byte-level BPE pre-tokenizer's split regex (tokenizer.ggml.pre: "qwen2",
// "llama-bpe", "gpt-2"), the inverse of what gguf_tokenizer_json reads; nothing for a regex it does not know.
std::optional<std::string> gguf_pre_tokenizer_name(const std::string& regex);

// Whether `path` names a GGUF file (a regular file whose name ends in .gguf): model-directory arguments accept one.
bool is_gguf_file(const std::string& path);

// The file's tokenizer as tokenizer.json text for Tokenizer::from_json (byte-level BPE, "gpt2" in GGUF's terms,
// with the pre-tokenizer its `tokenizer.ggml.pre` names); throws, naming the file, when it has none kiln reads.
std::string gguf_tokenizer_json(const GgufFile& f);
// The tokenizer.chat_template text, when the file has one.
std::optional<std::string> gguf_chat_template(const GgufFile& f);

}  // namespace kiln
