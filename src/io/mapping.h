// A whole file memory-mapped privately (reads from the page cache; writes to views stay in the process), for
// the checkpoint readers (safetensors, GGUF). `kind` names the file in errors ("gguf file").
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace kiln::io {

struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping();
};

std::shared_ptr<const Mapping> map_file(const std::string& path, const char* kind);

}  // namespace kiln::io
