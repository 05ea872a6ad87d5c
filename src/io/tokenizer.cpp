// tokenizer.json: encoding and decoding. Loading (the JSON schema and its checks) is tokenizer_load.cpp.
#include "kiln/gguf.h"
#include "io/tokenizer_impl.h"

#include <deque>
#include <fstream>

namespace kiln {

using tok::AddedToken;

namespace {

// tokenizers' AddedVocabulary::find_matches: leftmost-longest matches of the added tokens, with
// single_word, lstrip and rstrip applied; calls on_text for the text between matches and on_token for each.
template <class OnText, class OnToken>
void split_on_added(std::string_view s, const tok::TokenMatcher& matcher, const std::vector<AddedToken>& added,
                    OnText&& on_text, OnToken&& on_token) {
  if (s.empty()) return;
  if (matcher.empty()) {
    on_text(s);
    return;
  }
  size_t start_offset = 0, pos = 0, start = 0, stop = 0, index = 0;
  while (pos < s.size() && matcher.find(s, pos, &start, &stop, &index)) {
    pos = stop;
    const AddedToken& t = added[index];
    if (t.single_word) {
      const bool start_space = start == 0 || !tok::is_word_char(tok::utf8_prev(s, start));
      char32_t next = 0;
      if (stop < s.size()) tok::utf8_next(s, stop, &next);
      const bool stop_space = stop == s.size() || !tok::is_word_char(next);
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t p = start;
      while (p > 0) {
        size_t q = p - 1;
        while (q > 0 && (static_cast<unsigned char>(s[q]) & 0xC0) == 0x80) --q;
        char32_t c;
        tok::utf8_next(s, q, &c);
        if (!tok::is_white_space(c)) break;
        p = q;
      }
      start = std::max(p, start_offset);
    }
    if (t.rstrip) {
      while (stop < s.size()) {
        char32_t c;
        const int len = tok::utf8_next(s, stop, &c);
        if (!tok::is_white_space(c)) break;
        stop += static_cast<size_t>(len);
      }
    }
    if (start_offset < start) on_text(s.substr(start_offset, start - start_offset));
    on_token(t.id);
    start_offset = stop;
  }
  if (start_offset < s.size()) on_text(s.substr(start_offset));
}

// tokenizers' NormalizedString::split for one regex and behaviour; appends the non-empty pieces.
void split_pieces(std::string_view s, const tok::Regex& re, SplitBehavior behavior, bool invert,
                  std::vector<std::string_view>& out) {
  thread_local std::vector<std::pair<size_t, size_t>> found;
  found.clear();
  re.find_all(s, found);
  // (start, end, is_match) covering all of s
  struct Part {
    size_t start, end;
    bool match;
  };
  std::vector<Part> parts;
  parts.reserve(found.size() * 2 + 1);
  size_t prev = 0;
  for (auto [a, b] : found) {
    if (prev != a) parts.push_back({prev, a, invert});
    parts.push_back({a, b, !invert});
    prev = b;
  }
  if (prev != s.size()) parts.push_back({prev, s.size(), invert});

  auto emit = [&](size_t a, size_t b) {
    if (b > a) out.push_back(s.substr(a, b - a));
  };
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (const Part& p : parts) emit(p.start, p.end);
      break;
    case SplitBehavior::Removed:
      for (const Part& p : parts)
        if (!p.match) emit(p.start, p.end);
      break;
    case SplitBehavior::Contiguous:
    case SplitBehavior::MergedWithPrevious: {
      std::vector<std::pair<size_t, size_t>> acc;
      bool previous_match = false;
      for (const Part& p : parts) {
        const bool join = behavior == SplitBehavior::Contiguous ? p.match == previous_match
                                                                  : (p.match && !previous_match);
        if (join && !acc.empty()) acc.back().second = p.end;
        else acc.emplace_back(p.start, p.end);
        previous_match = p.match;
      }
      for (auto [a, b] : acc) emit(a, b);
      break;
    }
    case SplitBehavior::MergedWithNext: {
      std::vector<std::pair<size_t, size_t>> acc;
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !previous_match && !acc.empty()) acc.back().first = it->start;
        else acc.emplace_back(it->start, it->end);
        previous_match = it->match;
      }
      for (auto it = acc.rbegin(); it != acc.rend(); ++it) emit(it->first, it->second);
      break;
    }
  }
}

}  // namespace

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<uint32_t>& ids) const {
  // Pieces are views: into `piece`, or into `store` for the text a step rewrote.
  thread_local std::vector<std::string_view> cur, next;
  thread_local std::deque<std::string> store;
  store.clear();
  cur.assign(1, piece);
  // When ByteLevel is the last step, the model maps the bytes itself (after its cache lookup).
  const bool model_maps_bytes = !pre.empty() && pre.back().kind == PreStep::ByteLevel;
  for (size_t k = 0; k < pre.size(); ++k) {
    const PreStep& step = pre[k];
    next.clear();
    for (std::string_view p : cur) {
      if (step.kind == PreStep::Split) {
        split_pieces(p, *step.regex, step.behavior, step.invert, next);
        continue;
      }
      // ByteLevel: optional prefix space, optional GPT-2 split, then bytes to the byte-level alphabet.
      std::string_view q = p;
      if (step.add_prefix_space && (q.empty() || q[0] != ' ')) {
        store.push_back(" ");
        store.back().append(p);
        q = store.back();
      }
      const size_t first = next.size();
      if (step.use_regex) split_pieces(q, *gpt2_regex, SplitBehavior::Isolated, false, next);
      else if (!q.empty()) next.push_back(q);
      if (k + 1 == pre.size()) continue;
      for (size_t j = first; j < next.size(); ++j) {
        store.emplace_back();
        tok::byte_level_alphabet().map(next[j], store.back());
        next[j] = store.back();
      }
    }
    cur.swap(next);
  }
  for (std::string_view w : cur) model.tokenize(w, model_maps_bytes, ids);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  if (const size_t bad = tok::first_invalid_utf8(text); bad != std::string_view::npos)
    throw Error(str("tokenizer: encode: the text is not valid UTF-8 (ill-formed sequence at byte ", bad, " of ",
                    text.size(), ")"));
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  auto on_token = [&](uint32_t id) { ids.push_back(id); };
  split_on_added(
      text, m.raw_matcher, m.added,
      [&](std::string_view piece) {
        std::string normalized(piece);
        for (tok::NormForm f : m.normalizers) tok::normalize(normalized, f);
        split_on_added(
            normalized, m.normalized_matcher, m.added,
            [&](std::string_view p) { m.encode_piece(p, ids); }, on_token);
      },
      on_token);
  std::vector<int32_t> out;
  if (add_special_tokens) {
    out.reserve(m.prefix_ids.size() + ids.size() + m.suffix_ids.size());
    out.insert(out.end(), m.prefix_ids.begin(), m.prefix_ids.end());
  }
  for (uint32_t id : ids) out.push_back(static_cast<int32_t>(id));
  if (add_special_tokens) out.insert(out.end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  // Every token, added ones included, goes through the decoder: ByteLevel maps a token's characters back to
  // bytes (a token with a character outside the byte alphabet, e.g. a space, stands for its own UTF-8
  // bytes) and decodes all bytes at once; without a decoder tokens are joined by spaces.
  std::string bytes;
  bool first = true;
  for (int32_t sid : ids) {
    if (sid < 0) continue;
    const auto id = static_cast<uint32_t>(sid);
    const std::string* token = nullptr;
    if (auto a = m.added_by_id.find(id); a != m.added_by_id.end()) token = &m.added[a->second].content;
    else if (auto t = m.model_id_to_token.find(id); t != m.model_id_to_token.end()) token = t->second;
    if (!token) continue;  // ids in no vocabulary are skipped, as tokenizers does
    if (skip_special_tokens && m.special_contents.count(*token)) continue;
    if (m.decoder == Impl::Decoder::ByteLevel) {
      if (!tok::byte_level_alphabet().unmap(*token, bytes)) bytes += *token;
    } else {
      if (!first) bytes += ' ';
      bytes += *token;
    }
    first = false;
  }
  return m.decoder == Impl::Decoder::ByteLevel ? tok::from_utf8_lossy(bytes) : bytes;
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const Impl& m = *impl_;
  if (auto a = m.added_by_content.find(token); a != m.added_by_content.end())
    return static_cast<int32_t>(m.added[a->second].id);
  if (auto it = m.model.vocab.find(token); it != m.model.vocab.end()) return static_cast<int32_t>(it->second);
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0) return std::nullopt;
  if (auto a = m.added_by_id.find(static_cast<uint32_t>(id)); a != m.added_by_id.end())
    return m.added[a->second].content;
  if (auto t = m.model_id_to_token.find(static_cast<uint32_t>(id)); t != m.model_id_to_token.end())
    return *t->second;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  auto t = id_to_token(id);
  return t && impl_->special_contents.count(*t);
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(str("tokenizer: cannot open '", path, "'"));
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  if (size < 0) throw Error(str("tokenizer: cannot read '", path, "'"));
  constexpr std::streamoff kMaxBytes = std::streamoff(1) << 30;
  if (size > kMaxBytes)
    throw Error(str("tokenizer: '", path, "' is ", size, " bytes; a tokenizer.json over 1 GiB is not accepted"));
  std::string text(static_cast<size_t>(size), '\0');
  f.seekg(0);
  f.read(text.data(), size);
  if (!f) throw Error(str("tokenizer: cannot read '", path, "'"));
  return from_json(text, path);
}

Tokenizer Tokenizer::from_model_dir(const std::string& dir) {
  if (is_gguf_file(dir)) return from_json(gguf_tokenizer_json(GgufFile::open(dir)), dir);
  std::string path = dir;
  if (!path.empty() && path.back() != '/') path += '/';
  return from_file(path + "tokenizer.json");
}

Tokenizer Tokenizer::from_json(std::string_view json, const std::string& origin) {
  return Tokenizer(load_tokenizer_impl(json, origin));
}

}  // namespace kiln
