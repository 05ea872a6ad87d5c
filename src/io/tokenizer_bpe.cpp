// The BPE model as tokenizers runs it: a word's characters are looked up in the vocabulary, then merged
// pair by pair, always the pair of lowest rank (ties: the leftmost), with a priority queue over a linked
// list of symbols: O(n log n) per word. Whole words are cached.
#include <algorithm>
#include <queue>

#include "io/tokenizer_internal.h"
#include "kiln/error.h"

namespace kiln::tok {

// ---- MergeMap ----------------------------------------------------------------------------------------------

void MergeMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  size_ = 0;
  for (const Slot& s : old)
    if (s.used) set(static_cast<uint32_t>(s.key >> 32), static_cast<uint32_t>(s.key), s.value);
}

void MergeMap::grow() { reserve(std::max<size_t>(8, size_ * 2)); }

void MergeMap::set(uint32_t a, uint32_t b, Value v) {
  if (2 * (size_ + 1) > slots_.size()) grow();
  const uint64_t key = (uint64_t(a) << 32) | b;
  for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (!s.used) {
      s = Slot{key, v, true};
      ++size_;
      return;
    }
    if (s.key == key) {
      s.value = v;
      return;
    }
  }
}

// ---- WordCache ---------------------------------------------------------------------------------------------

bool WordCache::get(std::string_view word, std::vector<uint32_t>& out) const {
  if (slots_.empty()) return false;
  const uint64_t h = hash_bytes(word);
  for (size_t i = h & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
    const Slot& s = slots_[i];
    if (!s.used) return false;
    if (s.hash == h && s.key_len == word.size() && std::string_view(keys_).substr(s.key_off, s.key_len) == word) {
      out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.ids_len);
      return true;
    }
  }
}

void WordCache::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{});
  keys_.clear();
  ids_.clear();
  size_ = 0;
}

void WordCache::put(std::string_view word, const uint32_t* ids, size_t n) {
  if (slots_.empty()) slots_.assign(kSlots, Slot{});
  if (2 * (size_ + 1) > kSlots || keys_.size() + word.size() > kMaxKeyBytes || ids_.size() + n > kMaxKeyBytes) clear();
  const uint64_t h = hash_bytes(word);
  size_t i = h & (kSlots - 1);
  while (slots_[i].used) i = (i + 1) & (kSlots - 1);
  slots_[i] = Slot{h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(word.size()),
                   static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(n), true};
  keys_.append(word);
  ids_.insert(ids_.end(), ids, ids + n);
  ++size_;
}

// ---- BPE ---------------------------------------------------------------------------------------------------

namespace {
struct Symbol {
  uint32_t id;
  int32_t prev, next;
  uint32_t len;  // bytes of the word covered; 0 marks a symbol merged into its left neighbour
};
struct Merge {
  uint32_t pos, rank, new_id;
  // std::priority_queue pops the largest: "larger" is lower rank, then lower position.
  bool operator<(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};
}  // namespace

void BpeModel::merge_word(std::string_view word, bool byte_level, std::vector<uint32_t>& out) const {
  const ByteLevelAlphabet& alphabet = byte_level_alphabet();
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](uint32_t id, size_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, static_cast<uint32_t>(len)});
  };
  auto unk_id = [&]() -> uint32_t {
    auto it = vocab.find(*unk_token);
    if (it == vocab.end())
      throw Error(str("tokenizer: model.unk_token '", *unk_token, "' is needed but is not in the vocabulary"));
    return it->second;
  };
  bool have_unk = false;
  uint32_t pending_unk = 0;
  size_t pending_unk_len = 0;
  size_t i = 0;
  while (i < word.size()) {
    // The next character the model sees: a byte's byte-level character, or a UTF-8 character of the word.
    std::string_view ch;
    int64_t id = -1;
    if (byte_level) {
      const auto b = static_cast<unsigned char>(word[i]);
      ch = alphabet.byte_to_utf8[b];
      id = byte_ids[b];
      i += 1;
    } else {
      char32_t cp;
      const size_t len = static_cast<size_t>(utf8_next(word, i, &cp));
      ch = word.substr(i, len);
      i += len;
      if (auto it = vocab.find(ch); it != vocab.end()) id = it->second;
    }
    const size_t len = ch.size();
    if (id >= 0) {
      if (have_unk) {
        add(pending_unk, pending_unk_len);
        have_unk = false;
      }
      add(static_cast<uint32_t>(id), len);
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_fallback_ids[b] >= 0;
      if (all) {
        // tokenizers adds these without first flushing a pending unknown: keep that order.
        for (unsigned char b : ch) add(static_cast<uint32_t>(byte_fallback_ids[b]), 1);
        continue;
      }
    }
    if (unk_token) {
      if (have_unk && fuse_unk) {
        pending_unk_len += len;
      } else {
        if (have_unk) add(pending_unk, pending_unk_len);
        pending_unk = unk_id();
        pending_unk_len = len;
        have_unk = true;
      }
    }
    // No unk_token: tokenizers drops the character.
  }
  if (have_unk) add(pending_unk, pending_unk_len);

  std::priority_queue<Merge> queue;
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const MergeMap::Value* m = merges.find(symbols[k].id, symbols[k + 1].id))
      queue.push({static_cast<uint32_t>(k), m->rank, m->id});
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const auto next_pos = static_cast<size_t>(cur.next);
    const Symbol right = symbols[next_pos];
    // A stale entry: the pair at this position changed since it was queued (tokenizers compares the id only).
    const MergeMap::Value* now = merges.find(cur.id, right.id);
    if (!now || now->id != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0 && static_cast<size_t>(right.next) < symbols.size())
      symbols[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
    if (cur.prev >= 0) {
      if (const MergeMap::Value* p = merges.find(symbols[static_cast<size_t>(cur.prev)].id, cur.id))
        queue.push({static_cast<uint32_t>(cur.prev), p->rank, p->id});
    }
    if (cur.next >= 0) {
      if (const MergeMap::Value* n = merges.find(cur.id, symbols[static_cast<size_t>(cur.next)].id))
        queue.push({top.pos, n->rank, n->id});
    }
  }
  for (const Symbol& s : symbols)
    if (s.len != 0) out.push_back(s.id);
}

void BpeModel::tokenize(std::string_view word, bool byte_level, std::vector<uint32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.get(word, out)) return;
  }
  const size_t mark = out.size();
  bool whole = false;
  if (ignore_merges) {
    // tokenizers: a pre-token that is itself in the vocabulary is one token, merges or not.
    thread_local std::string mapped;
    std::string_view w = word;
    if (byte_level) {
      byte_level_alphabet().map(word, mapped);
      w = mapped;
    }
    if (auto it = vocab.find(w); it != vocab.end()) {
      out.push_back(it->second);
      whole = true;
    }
  }
  if (!whole) merge_word(word, byte_level, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    cache_.put(word, out.data() + mark, out.size() - mark);
  }
}

}  // namespace kiln::tok
