// Checkpoint files: safetensors (single files and sharded checkpoints), read by memory mapping and written
// in the layout Hugging Face writes. Every file is untrusted input: the header is validated completely before
// any tensor is made, and every error names the file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// The largest header accepted (the reference implementation's limit, 100 MB).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
// The largest rank accepted (the format sets none; real tensors have a handful of dims).
inline constexpr size_t kSafetensorsMaxRank = 64;

// One tensor of a safetensors header. Offsets count bytes from the start of the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N, the length of the JSON text
  uint64_t data_offset = 0;   // 8 + N: where the data section starts in the file
  uint64_t data_bytes = 0;    // length of the data section
  std::vector<SafetensorsEntry> tensors;        // in offset order
  std::map<std::string, std::string> metadata;  // "__metadata__" (empty when absent)
};

// Parses and validates the header of a safetensors file held whole in memory: the 8-byte length, the JSON
// text, and every entry against the data section that follows it. `source` names the file in errors.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, const std::string& source);

// The safetensors name of a dtype ("F32", "BF16", "F8_E4M3", ...).
const char* safetensors_dtype_name(DType t);

// A safetensors file, memory-mapped (or over bytes already in memory) with its header validated. Tensors
// from get() are CPU views of the file's bytes: no copy is made, and the mapping lives while the file
// object or any tensor viewing it does. Moving a view to a GPU reads the page cache directly into kiln's
// pinned staging buffers (no second host copy of the checkpoint).
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  // Maps `path` privately (writes to a view stay in the process and never reach the file).
  static SafetensorsFile open(const std::string& path);
  // Over `size` bytes at `bytes`, kept valid by `keep_alive`; `source` names them in errors.
  static SafetensorsFile from_memory(const uint8_t* bytes, size_t size, std::shared_ptr<const void> keep_alive,
                                     std::string source);

  const std::string& path() const;
  size_t file_size() const;
  const SafetensorsHeader& header() const;
  const std::vector<SafetensorsEntry>& entries() const { return header().tensors; }
  const std::map<std::string, std::string>& metadata() const { return header().metadata; }
  std::vector<std::string> names() const;  // in offset order
  bool contains(std::string_view name) const;
  const SafetensorsEntry& entry(std::string_view name) const;  // throws, naming the file, when absent

  // A CPU view of the tensor's bytes. A tensor whose offset is not a multiple of its item size (never the
  // case in files written by kiln or Hugging Face) is copied into aligned memory instead.
  Tensor get(std::string_view name) const;
  // The tensor on `device`, converted to `dtype` (on the device, after the transfer) when it differs.
  Tensor get(std::string_view name, Device device) const;
  Tensor get(std::string_view name, Device device, DType dtype) const;

 private:
  struct State;
  const State& state() const;
  std::shared_ptr<const State> s_;
};

// A checkpoint of one or more safetensors files. open() takes a .safetensors file, a
// model.safetensors.index.json (shards listed by its weight_map, relative to the index's directory), or a
// directory holding model.safetensors.index.json or model.safetensors. For a sharded checkpoint every
// tensor of every shard must be listed in the weight_map under that shard, and every listed tensor must be
// in its shard.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return where_.size(); }
  bool contains(std::string_view name) const;
  const SafetensorsEntry& entry(std::string_view name) const;
  const SafetensorsFile& file_of(std::string_view name) const;
  Tensor get(std::string_view name) const { return file_of(name).get(name); }
  Tensor get(std::string_view name, Device device) const { return file_of(name).get(name, device); }
  Tensor get(std::string_view name, Device device, DType dtype) const {
    return file_of(name).get(name, device, dtype);
  }
  // Every tensor, by name, on `device`.
  std::map<std::string, Tensor> load_all(Device device = kCPU) const;

 private:
  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t, std::less<>> where_;  // tensor name -> index into files_
};

// The weight_map of a model.safetensors.index.json text: tensor name -> shard file name. Shard names must
// be plain file names (no directories, no "." or ".."). `source` names the file in errors.
std::map<std::string, std::string> parse_safetensors_index(std::string_view json, const std::string& source);

// Named tensors to write. Names must be unique, valid UTF-8 and not "__metadata__".
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The bytes of a safetensors file holding `tensors` (any device, layout and dtype; copied to the host as
// contiguous little-endian data), laid out as Hugging Face's writer does: tensors sorted by decreasing
// dtype alignment then by name, data packed in that order, the JSON header padded with spaces to a multiple
// of 8 bytes, "__metadata__" first when `metadata` is not empty.
std::vector<uint8_t> serialize_safetensors(const NamedTensors& tensors,
                                           const std::map<std::string, std::string>& metadata = {});
// Writes the same bytes to `path` (through a temporary file renamed into place).
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace kiln
