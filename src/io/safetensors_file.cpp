// Opening safetensors files (memory-mapped) and sharded checkpoints.

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "io/json_strict.h"
#include "io/mapping.h"
#include "kiln/io.h"
#include "kiln/ops.h"

namespace kiln {

struct SafetensorsFile::State {
  std::string path;
  const uint8_t* bytes = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
  SafetensorsHeader header;
  std::unordered_map<std::string_view, size_t> index;  // name -> position in header.tensors
};

SafetensorsFile SafetensorsFile::from_memory(const uint8_t* bytes, size_t size, std::shared_ptr<const void> keep_alive,
                                             std::string source) {
  auto s = std::make_shared<State>();
  s->path = std::move(source);
  s->bytes = bytes;
  s->size = size;
  s->owner = std::move(keep_alive);
  s->header = parse_safetensors_header(bytes, size, s->path);
  s->index.reserve(s->header.tensors.size());
  for (size_t i = 0; i < s->header.tensors.size(); ++i) s->index.emplace(s->header.tensors[i].name, i);
  SafetensorsFile f;
  f.s_ = std::move(s);
  return f;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto m = io::map_file(path, "safetensors file");
  const auto* bytes = static_cast<const uint8_t*>(m->addr);
  return from_memory(bytes, m->size, m, path);
}

const SafetensorsFile::State& SafetensorsFile::state() const {
  if (!s_) throw Error("SafetensorsFile: used before open()");
  return *s_;
}
const std::string& SafetensorsFile::path() const { return state().path; }
size_t SafetensorsFile::file_size() const { return state().size; }
const SafetensorsHeader& SafetensorsFile::header() const { return state().header; }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries()) out.push_back(e.name);
  return out;
}

bool SafetensorsFile::contains(std::string_view name) const { return state().index.count(name) != 0; }

const SafetensorsEntry& SafetensorsFile::entry(std::string_view name) const {
  const State& s = state();
  auto it = s.index.find(name);
  KILN_CHECK(it != s.index.end(), "safetensors file '", s.path, "': no tensor named '", name, "' (the file has ",
             s.header.tensors.size(), " tensors)");
  return s.header.tensors[it->second];
}

Tensor SafetensorsFile::get(std::string_view name) const {
  const State& s = state();
  const SafetensorsEntry& e = entry(name);
  // In range: parse_safetensors_header checked end <= data_bytes, and data_offset + data_bytes == size.
  const uint8_t* p = s.bytes + s.header.data_offset + e.begin;
  const size_t n = static_cast<size_t>(e.nbytes());
  const size_t item = itemsize(e.dtype);
  if (reinterpret_cast<uintptr_t>(p) % item == 0) {
    auto storage = wrap_host_memory(const_cast<uint8_t*>(p), n, s_);  // s_ owns the mapping
    return Tensor(std::move(storage), e.shape, contiguous_strides(e.shape), 0, e.dtype);
  }
  // Misaligned for its dtype: kernels read T* directly, so give them an aligned copy.
  Tensor t = empty(e.shape, e.dtype, kCPU);
  if (n) std::memcpy(t.data_ptr(), p, n);
  return t;
}

Tensor SafetensorsFile::get(std::string_view name, Device device) const { return get(name).to(device); }

Tensor SafetensorsFile::get(std::string_view name, Device device, DType dtype) const {
  // Transfer in the file's dtype and convert where the tensor ends up: a host-side conversion before a
  // transfer would make a full second host copy.
  return get(name).to(device).to(dtype);
}

// ---- sharded checkpoints -----------------------------------------------------------------------------------

std::map<std::string, std::string> parse_safetensors_index(std::string_view text, const std::string& source) {
  const nlohmann::json j = io::parse_json_strict(text, source, 16);
  KILN_CHECK(j.is_object(), "safetensors index '", source, "': not a JSON object");
  auto wm = j.find("weight_map");
  KILN_CHECK(wm != j.end(), "safetensors index '", source, "': no \"weight_map\"");
  KILN_CHECK(wm->is_object(), "safetensors index '", source, "': \"weight_map\" is not an object");
  std::map<std::string, std::string> out;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    KILN_CHECK(it.value().is_string(), "safetensors index '", source, "': tensor '", it.key(),
               "': shard name is not a string");
    const std::string& shard = it.value().get_ref<const std::string&>();
    // A shard is a file beside the index: a path with directories could reach outside the checkpoint.
    const bool plain = !shard.empty() && shard != "." && shard != ".." && shard.find('/') == std::string::npos &&
                       shard.find('\\') == std::string::npos && shard.find('\0') == std::string::npos;
    KILN_CHECK(plain, "safetensors index '", source, "': tensor '", it.key(), "': shard name '", shard,
               "' is not a plain file name in the checkpoint's directory");
    out.emplace(it.key(), shard);
  }
  return out;
}

Checkpoint Checkpoint::open(const std::string& path) {
  namespace fs = std::filesystem;
  Checkpoint c;
  c.path_ = path;
  std::error_code ec;
  fs::path p(path);
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "model.safetensors.index.json", ec)) p /= "model.safetensors.index.json";
    else if (fs::exists(p / "model.safetensors", ec)) p /= "model.safetensors";
    else throw Error(str("checkpoint '", path, "': directory has neither model.safetensors.index.json nor ",
                         "model.safetensors"));
  }
  const std::string ps = p.string();
  const bool is_index = ps.size() >= 5 && ps.compare(ps.size() - 5, 5, ".json") == 0;
  if (!is_index) {
    c.files_.push_back(SafetensorsFile::open(ps));
    for (const auto& e : c.files_[0].entries()) c.where_.emplace(e.name, 0);
    return c;
  }

  const auto weight_map = parse_safetensors_index(io::read_text_file(ps, 64u << 20), ps);
  std::map<std::string, size_t> shard_index;
  for (const auto& [name, shard] : weight_map) shard_index.emplace(shard, 0);
  const fs::path dir = p.parent_path();
  for (auto& [shard, idx] : shard_index) {
    idx = c.files_.size();
    c.files_.push_back(SafetensorsFile::open((dir / shard).string()));
  }
  for (const auto& [name, shard] : weight_map) {
    const size_t idx = shard_index.at(shard);
    KILN_CHECK(c.files_[idx].contains(name), "checkpoint '", ps, "': tensor '", name, "' is listed in shard '",
               shard, "' but that file does not hold it");
    c.where_.emplace(name, idx);
  }
  for (const auto& f : c.files_)
    for (const auto& e : f.entries()) {
      auto it = weight_map.find(e.name);
      KILN_CHECK(it != weight_map.end(), "checkpoint '", ps, "': shard '", f.path(), "' holds tensor '", e.name,
                 "', which the weight_map does not list");
      KILN_CHECK(c.files_[c.where_.at(e.name)].path() == f.path(), "checkpoint '", ps, "': tensor '", e.name,
                 "' is in shard '", f.path(), "' but the weight_map puts it in '", it->second, "'");
    }
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, idx] : where_) out.push_back(name);
  return out;
}

bool Checkpoint::contains(std::string_view name) const { return where_.find(name) != where_.end(); }

const SafetensorsFile& Checkpoint::file_of(std::string_view name) const {
  auto it = where_.find(name);
  KILN_CHECK(it != where_.end(), "checkpoint '", path_, "': no tensor named '", name, "' (it has ", where_.size(),
             " tensors)");
  return files_[it->second];
}

const SafetensorsEntry& Checkpoint::entry(std::string_view name) const { return file_of(name).entry(name); }

std::map<std::string, Tensor> Checkpoint::load_all(Device device) const {
  std::map<std::string, Tensor> out;
  for (const auto& [name, idx] : where_) out.emplace(name, files_[idx].get(name, device));
  return out;
}

}  // namespace kiln
