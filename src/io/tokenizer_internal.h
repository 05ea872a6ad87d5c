// Pieces of the tokenizer.json pipeline: UTF-8 helpers, Unicode normalisation (utf8proc), regex splitting
// (PCRE2), the byte-level alphabet, the BPE model and the added-token matcher.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::tok {

// ---- UTF-8 ----------------------------------------------------------------------------------------------
// Byte offset of the first ill-formed sequence, or npos when `s` is valid UTF-8.
size_t first_invalid_utf8(std::string_view s);
// Decodes the code point at s[i] of a valid UTF-8 string; returns its length in bytes.
int utf8_next(std::string_view s, size_t i, char32_t* cp);
// Code point that ends at s[end] (s valid UTF-8, end > 0).
char32_t utf8_prev(std::string_view s, size_t end);
void append_utf8(std::string& out, char32_t cp);
// Rust's String::from_utf8_lossy: each maximal ill-formed subsequence becomes one U+FFFD.
std::string from_utf8_lossy(std::string_view bytes);
bool is_ascii(std::string_view s);
// Unicode White_Space (Rust char::is_whitespace, regex \s).
bool is_white_space(char32_t c);
// Rust regex \w: Alphabetic, M, Nd, Pc, Join_Control.
bool is_word_char(char32_t c);

// ---- normalisation --------------------------------------------------------------------------------------
enum class NormForm { NFC, NFD, NFKC, NFKD };
// True for characters that a string of such characters keeps unchanged under NFC (a fast path).
bool nfc_inert(char32_t c);
void normalize(std::string& s, NormForm form);

// ---- regex ----------------------------------------------------------------------------------------------
// A PCRE2 pattern in UTF + UCP mode (JIT compiled when available), matched like tokenizers' onig find_iter.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Non-overlapping matches [start, end) of `s` (valid UTF-8), left to right; an empty match right where
  // the previous match ended is skipped.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8
  void* mcontext_ = nullptr;
  bool jit_ = false;
  std::string what_;
};
std::string escape_regex(std::string_view literal);
// Rewrites the class escapes whose meaning differs between onig (Ruby syntax, which tokenizers uses) and
// PCRE2: \s \S \d \D \w \W \h \H, and \p{L} \p{N} for letters newer than PCRE2's Unicode tables.
std::string onig_to_pcre2(std::string_view pattern);

// ---- byte-level alphabet (GPT-2's bytes_to_unicode) -----------------------------------------------------
struct ByteLevelAlphabet {
  std::array<std::string, 256> byte_to_utf8;  // byte -> its code point as UTF-8 (1 or 2 bytes)
  std::array<int16_t, 324> char_to_byte;      // code point (< 324) -> byte, or -1
  ByteLevelAlphabet();
  void map(std::string_view bytes, std::string& out) const;
  // Appends the bytes a token stands for; false (nothing appended) when a char is not in the alphabet.
  bool unmap(std::string_view token, std::string& out) const;
};
const ByteLevelAlphabet& byte_level_alphabet();

// ---- hashing of strings with heterogeneous lookup -------------------------------------------------------
inline uint64_t hash_bytes(std::string_view s) { return std::hash<std::string_view>{}(s); }
struct StringHash {
  using is_transparent = void;
  // Not noexcept on purpose: libstdc++ then stores each node's hash, so a bucket walk does not rehash keys.
  size_t operator()(std::string_view s) const { return hash_bytes(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// ---- flat hash tables for the encoding hot path ---------------------------------------------------------
// Pair of token ids -> (rank, merged id): open addressing, linear probing, load <= 1/2.
class MergeMap {
 public:
  struct Value {
    uint32_t rank, id;
  };
  void reserve(size_t n);
  // Inserts or overwrites.
  void set(uint32_t a, uint32_t b, Value v);
  const Value* find(uint32_t a, uint32_t b) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = (uint64_t(a) << 32) | b;
    for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == key) return &s.value;
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key = 0;
    Value value{0, 0};
    bool used = false;
  };
  static size_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  void grow();
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

// Word -> ids, bounded: keys and ids live in two arenas, and the whole cache starts over when full.
class WordCache {
 public:
  // Appends the cached ids of `word` to out and returns true, or returns false.
  bool get(std::string_view word, std::vector<uint32_t>& out) const;
  void put(std::string_view word, const uint32_t* ids, size_t n);

 private:
  static constexpr size_t kSlots = 1 << 17;  // at most kSlots / 2 words
  static constexpr size_t kMaxKeyBytes = 4 << 20;
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_off = 0, key_len = 0, ids_off = 0, ids_len = 0;
    bool used = false;
  };
  void clear();
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<uint32_t> ids_;
  size_t size_ = 0;
};

// ---- BPE --------------------------------------------------------------------------------------------------
struct BpeModel {
  StringMap<uint32_t> vocab;
  MergeMap merges;
  // When the input reaches the model as raw bytes (a ByteLevel pre-tokenizer is the last step): the id of
  // each byte's byte-level character, or -1 when it is not in the vocabulary.
  std::array<int64_t, 256> byte_ids{};
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::array<int64_t, 256> byte_fallback_ids{};  // id of "<0xXX>" or -1

  // Appends the ids of one pre-token. byte_level: `word` is raw bytes that the model sees as their
  // byte-level characters (ByteLevel's mapping, done here so that cache hits skip it).
  void tokenize(std::string_view word, bool byte_level, std::vector<uint32_t>& out) const;

 private:
  void merge_word(std::string_view word, bool byte_level, std::vector<uint32_t>& out) const;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable WordCache cache_;
};

// ---- added tokens -----------------------------------------------------------------------------------------
struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Leftmost-longest matching of a set of strings (aho-corasick MatchKind::LeftmostLongest semantics).
class TokenMatcher {
 public:
  void add(std::string_view s, size_t value);
  bool empty() const { return nodes_.size() <= 1; }
  // First match at or after `from`: (start, end, value). Returns false when there is none.
  bool find(std::string_view text, size_t from, size_t* start, size_t* end, size_t* value) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> next;  // sorted by byte
    int64_t value = -1;
  };
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_{};
};

}  // namespace kiln::tok
