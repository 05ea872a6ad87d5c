// The paged KV cache: block allocation, the prefix cache, and the KVCache / Sequence handles.
#include "llm/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "kiln/error.h"

namespace kiln::llm {

uint64_t KVPool::key_of(int32_t parent, uint32_t parent_gen, const int64_t* tokens) const {
  // FNV-1a over the parent, its generation and the tokens; equal keys are compared in full (find).
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t x) {
    for (int i = 0; i < 8; ++i) {
      h ^= (x >> (8 * i)) & 0xFF;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<uint64_t>(static_cast<int64_t>(parent)));
  mix(parent_gen);
  for (int64_t i = 0; i < block_size; ++i) mix(static_cast<uint64_t>(tokens[i]));
  return h;
}

int32_t KVPool::take() {
  int32_t b;
  if (!free.empty()) {
    b = free.back();
    free.pop_back();
  } else if (!lru.empty()) {
    b = lru.front();
    lru.pop_front();
    uncache(b);
  } else {
    throw Error(str("KV cache: all ", num_blocks, " blocks of ", block_size,
                    " positions are held by sequences (make the cache larger or run fewer sequences at once)"));
  }
  Block& x = blocks[static_cast<size_t>(b)];
  x.refs = 1;
  ++x.gen;
  return b;
}

void KVPool::retain(int32_t b) {
  Block& x = blocks[static_cast<size_t>(b)];
  if (x.refs++ == 0) lru.erase(x.lru);  // only cached blocks are found while held by none
}

void KVPool::release(int32_t b) {
  Block& x = blocks[static_cast<size_t>(b)];
  if (--x.refs > 0) return;
  if (x.cached) x.lru = lru.insert(lru.end(), b);
  else free.push_back(b);
}

void KVPool::uncache(int32_t b) {
  Block& x = blocks[static_cast<size_t>(b)];
  if (!x.cached) return;
  auto [lo, hi] = index.equal_range(x.key);
  for (auto it = lo; it != hi; ++it)
    if (it->second == b) {
      index.erase(it);
      break;
    }
  x.cached = false;
}

int32_t KVPool::find(int32_t parent, const int64_t* tokens) const {
  const uint32_t pg = parent >= 0 ? blocks[static_cast<size_t>(parent)].gen : 0;
  auto [lo, hi] = index.equal_range(key_of(parent, pg, tokens));
  for (auto it = lo; it != hi; ++it) {
    const Block& x = blocks[static_cast<size_t>(it->second)];
    if (x.parent == parent && x.parent_gen == pg &&
        std::equal(tokens, tokens + block_size, contents.begin() + it->second * block_size))
      return it->second;
  }
  return -1;
}

void KVPool::ensure(Sequence& seq, int64_t positions) {
  const size_t need = static_cast<size_t>((positions + block_size - 1) / block_size);
  while (seq.blocks.size() < need) seq.blocks.push_back(take());
}

void KVPool::register_full(const Sequence& seq, int64_t before) {
  for (int64_t i = before / block_size; (i + 1) * block_size <= seq.position; ++i) {
    const int32_t b = seq.blocks[static_cast<size_t>(i)];
    Block& x = blocks[static_cast<size_t>(b)];
    if (x.cached) continue;  // a reused block
    const int32_t parent = i > 0 ? seq.blocks[static_cast<size_t>(i - 1)] : -1;
    const int64_t* tokens = seq.tokens.data() + i * block_size;
    if (find(parent, tokens) >= 0) continue;  // an equal block is cached already
    x.parent = parent;
    x.parent_gen = parent >= 0 ? blocks[static_cast<size_t>(parent)].gen : 0;
    x.key = key_of(parent, x.parent_gen, tokens);
    std::copy(tokens, tokens + block_size, contents.begin() + b * block_size);
    index.emplace(x.key, b);
    x.cached = true;
  }
}

// ---- Sequence -------------------------------------------------------------------------------------------

Sequence::Sequence() = default;

Sequence::~Sequence() {
  // Last block first: in the least-recently-released order a chain's later blocks then go before its first
  // ones (a block is found only through the blocks before it).
  if (pool)
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) pool->release(*it);
}

Sequence::Sequence(Sequence&& o) noexcept
    : position(o.position), max_context(o.max_context), pool(std::move(o.pool)), blocks(std::move(o.blocks)),
      tokens(std::move(o.tokens)) {
  o.pool.reset();
  o.blocks.clear();
  o.tokens.clear();
  o.position = 0;
}

Sequence& Sequence::operator=(Sequence&& o) noexcept {
  if (this != &o) {
    Sequence dead(std::move(*this));  // releases what this one held
    position = o.position;
    max_context = o.max_context;
    pool = std::move(o.pool);
    blocks = std::move(o.blocks);
    tokens = std::move(o.tokens);
    o.pool.reset();
    o.blocks.clear();
    o.tokens.clear();
    o.position = 0;
  }
  return *this;
}

// ---- KVCache --------------------------------------------------------------------------------------------

namespace {
const KVPool& pool_of(const std::shared_ptr<KVPool>& p) {
  KILN_CHECK(p != nullptr, "KV cache: an empty handle (make one with Model::new_kv_cache)");
  return *p;
}
}  // namespace

int64_t KVCache::block_size() const { return pool_of(pool).block_size; }
int64_t KVCache::num_blocks() const { return pool_of(pool).num_blocks; }
int64_t KVCache::free_blocks() const {
  const KVPool& p = pool_of(pool);
  return static_cast<int64_t>(p.free.size() + p.lru.size());
}
int64_t KVCache::cached_blocks() const { return static_cast<int64_t>(pool_of(pool).lru.size()); }
int64_t KVCache::bytes() const {
  int64_t n = 0;
  for (const Tensor& t : pool_of(pool).k) n += static_cast<int64_t>(t.nbytes());
  for (const Tensor& t : pool_of(pool).v) n += static_cast<int64_t>(t.nbytes());
  return n;
}

Sequence KVCache::new_sequence(int64_t max_context) const {
  pool_of(pool);
  KILN_CHECK(max_context >= 1 && max_context <= (int64_t{1} << 22), "new_sequence: max_context must be in [1, 4194304], "
             "got ", max_context);
  Sequence s;
  s.pool = pool;
  s.max_context = max_context;
  return s;
}

int64_t KVCache::reuse_prefix(Sequence& seq, const std::vector<int64_t>& prompt) const {
  pool_of(pool);
  KILN_CHECK(seq.pool == pool, "reuse_prefix: the sequence belongs to another cache");
  KILN_CHECK(seq.position == 0 && seq.blocks.empty(), "reuse_prefix: the sequence is not empty (", seq.position,
             " tokens)");
  KVPool& p = *pool;
  const int64_t s = p.block_size;
  const int64_t limit = std::min<int64_t>(static_cast<int64_t>(prompt.size()) - 1, seq.max_context);
  int32_t parent = -1;
  while ((static_cast<int64_t>(seq.blocks.size()) + 1) * s <= limit) {
    const int32_t b = p.find(parent, prompt.data() + static_cast<int64_t>(seq.blocks.size()) * s);
    if (b < 0) break;
    p.retain(b);
    seq.blocks.push_back(b);
    parent = b;
  }
  seq.position = static_cast<int64_t>(seq.blocks.size()) * s;
  seq.tokens.assign(prompt.begin(), prompt.begin() + seq.position);
  return seq.position;
}

void KVCache::clear_prefixes() const {
  pool_of(pool);
  KVPool& p = *pool;
  for (int32_t b : p.lru) p.free.push_back(b);
  p.lru.clear();
  for (int32_t b = 0; b < static_cast<int32_t>(p.num_blocks); ++b) p.uncache(b);
}

}  // namespace kiln::llm
