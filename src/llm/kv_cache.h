// The paged KV cache's pools and block allocator (kiln::llm::KVCache's internals): blocks held by sequences
// (reference counted: a cached prefix block can be held by several), free blocks, and blocks held by no
// sequence that keep a cached prefix, found by their tokens and the block before them.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "kiln/llm/model.h"

namespace kiln::llm {

struct KVPool {
  uint64_t id = 0;     // unique in the process (captured steps name the cache they address)
  uint64_t owner = 0;  // the id of the model that made it
  bool shared = true;  // made by new_kv_cache (false: a sequence's own, from Model::new_sequence: no graphs)
  int64_t block_size = 0, num_blocks = 0;
  int64_t scratch = 0;       // the block past the num_blocks handed out, for padding rows (= num_blocks)
  std::vector<Tensor> k, v;  // per layer [NB + 1, S, Hkv, D]

  struct Block {
    int32_t refs = 0;     // sequences holding it
    uint32_t gen = 0;     // bumped each time it is taken for new contents
    bool cached = false;  // in `index`: full, and its contents described by (parent, parent_gen, tokens)
    int32_t parent = -1;  // the block before it in the sequence that filled it (-1: the first)
    uint32_t parent_gen = 0;
    uint64_t key = 0;
    std::list<int32_t>::iterator lru;  // where it sits in `lru` while cached and held by none
  };
  std::vector<Block> blocks;
  std::vector<int64_t> contents;  // [NB * S]: the tokens of each cached block
  std::vector<int32_t> free;      // held by none, caching nothing
  std::list<int32_t> lru;         // held by none, cached: least recently released first
  std::unordered_multimap<uint64_t, int32_t> index;

  // A block for new contents (a free one, else the least recently released cached one); throws kiln::Error
  // when every block is held.
  int32_t take();
  void retain(int32_t b);
  void release(int32_t b);
  // Drops block b's prefix entry (it stays held or goes to the free list).
  void uncache(int32_t b);
  // The cached block holding `tokens` (S of them) after block `parent` (-1: at the start), or -1.
  int32_t find(int32_t parent, const int64_t* tokens) const;
  // Blocks so that seq can hold `positions` tokens (throws, keeping those taken, when the pool runs out).
  void ensure(Sequence& seq, int64_t positions);
  // The blocks seq completed since it held `before` tokens enter the prefix cache (unless an equal one is there).
  void register_full(const Sequence& seq, int64_t before);
  // The row of the pools where position p of seq lives.
  int32_t slot(const Sequence& seq, int64_t p) const {
    return seq.blocks[static_cast<size_t>(p / block_size)] * static_cast<int32_t>(block_size) +
           static_cast<int32_t>(p % block_size);
  }

 private:
  uint64_t key_of(int32_t parent, uint32_t parent_gen, const int64_t* tokens) const;
};

}  // namespace kiln::llm
