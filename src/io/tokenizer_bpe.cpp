// The BPE model as tokenizers runs it: a word's characters are looked up in the vocabulary, then merged
// pair by pair, always the pair of lowest rank (ties: the leftmost), with a priority queue over a linked
// list of symbols: O(n log n) per word. Whole words are cached.
#include <queue>

#include "io/tokenizer_internal.h"
#include "kiln/error.h"

namespace kiln::tok {

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
inline uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }
}  // namespace

void BpeModel::merge_word(std::string_view word, std::vector<uint32_t>& out) const {
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
      throw Error(str("tokenizer: model.unk_token '", *unk_token, "' is needed for '", std::string(word),
                      "' but is not in the vocabulary"));
    return it->second;
  };
  bool have_unk = false;
  uint32_t pending_unk = 0;
  size_t pending_unk_len = 0;
  size_t i = 0;
  while (i < word.size()) {
    char32_t cp;
    const size_t len = static_cast<size_t>(utf8_next(word, i, &cp));
    const std::string_view ch = word.substr(i, len);
    i += len;
    if (auto it = vocab.find(ch); it != vocab.end()) {
      if (have_unk) {
        add(pending_unk, pending_unk_len);
        have_unk = false;
      }
      add(it->second, len);
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
    auto it = merges.find(pair_key(symbols[k].id, symbols[k + 1].id));
    if (it != merges.end()) queue.push({static_cast<uint32_t>(k), it->second.first, it->second.second});
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const auto next_pos = static_cast<size_t>(cur.next);
    const Symbol right = symbols[next_pos];
    // A stale entry: the pair at this position changed since it was queued.
    auto it = merges.find(pair_key(cur.id, right.id));
    if (it == merges.end() || it->second.second != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0 && static_cast<size_t>(right.next) < symbols.size())
      symbols[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
    if (cur.prev >= 0) {
      auto p = merges.find(pair_key(symbols[static_cast<size_t>(cur.prev)].id, cur.id));
      if (p != merges.end()) queue.push({static_cast<uint32_t>(cur.prev), p->second.first, p->second.second});
    }
    if (cur.next >= 0) {
      auto n = merges.find(pair_key(cur.id, symbols[static_cast<size_t>(cur.next)].id));
      if (n != merges.end()) queue.push({top.pos, n->second.first, n->second.second});
    }
  }
  for (const Symbol& s : symbols)
    if (s.len != 0) out.push_back(s.id);
}

void BpeModel::tokenize(std::string_view word, std::vector<uint32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (auto it = vocab.find(word); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t mark = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();  // bounded: start over rather than grow
    cache_.emplace(std::string(word), std::vector<uint32_t>(out.begin() + static_cast<std::ptrdiff_t>(mark), out.end()));
  }
}

}  // namespace kiln::tok
