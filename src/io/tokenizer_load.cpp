// Loading tokenizer.json. The file is untrusted: every field is type-checked, every error names the file and
// the field ("model.merges[12]"), nesting is bounded before parsing, and ids are range-checked.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "io/tokenizer_impl.h"

namespace kiln {

namespace {

using json = nlohmann::json;
using tok::AddedToken;

constexpr int kMaxJsonDepth = 64;      // tokenizer.json nests ~6 deep; this bounds hostile input
constexpr int kMaxSequenceDepth = 8;   // Sequence inside Sequence inside ...
constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max() - 1;

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

const char* type_name(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "an unsupported value";
  }
}

std::string quote_token(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, std::min<size_t>(s.size(), 80))) {
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  if (s.size() > 80) out += "...";
  return out + "'";
}

// Rejects nesting deeper than kMaxJsonDepth before the parser sees it (a file of 10^8 '[' would otherwise
// build 10^8 nested arrays).
void check_depth(std::string_view text, const std::string& origin) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw Error(str(origin, ": JSON nested deeper than ", kMaxJsonDepth, " levels (at byte ", i,
                        "); a tokenizer.json nests a few levels"));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}


// A SAX handler that builds the document like nlohmann's DOM parser, except for model.vocab and model.merges
// (over 90% of a large tokenizer.json): their entries go straight into flat lists, skipping a std::map of
// 150k keys and 150k two-element arrays. In the document they become an empty object / array.
class TokenizerSax {
 public:
  json root;
  std::vector<std::pair<std::string, json>> vocab;  // (token, id value as written)
  std::vector<json> merges;                          // each entry as written ("a b", [a, b] or anything else)
  std::string error;

  bool null() { return value(json(nullptr)); }
  bool boolean(bool v) { return value(json(v)); }
  bool number_integer(json::number_integer_t v) { return value(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return value(json(v)); }
  bool number_float(json::number_float_t v, const std::string&) { return value(json(v)); }
  bool string(std::string& v) { return value(json(std::move(v))); }
  bool binary(json::binary_t& v) { return value(json(json::binary_t(v))); }
  bool key(std::string& k) {
    if (skip_ == 0 && mode_ == Mode::Vocab && depth_in_mode_ == 1) {
      vocab_key_ = std::move(k);
      return true;
    }
    if (skip_ > 0 || mode_ != Mode::Dom) return true;
    key_ = k;
    obj_elem_ = &(*stack_.back())[k];
    return true;
  }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    error = e.what();
    return false;
  }

 private:
  enum class Mode { Dom, Vocab, Merges };

  bool value(json&& v) {
    if (skip_ > 0) return true;
    if (mode_ == Mode::Vocab) {
      vocab.emplace_back(std::move(vocab_key_), std::move(v));
      return true;
    }
    if (mode_ == Mode::Merges) {
      if (depth_in_mode_ == 1) merges.push_back(std::move(v));
      else merges.back().push_back(std::move(v));  // inside [a, b]
      return true;
    }
    place(std::move(v));
    return true;
  }
  json* place(json&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    if (stack_.back()->is_array()) {
      stack_.back()->push_back(std::move(v));
      return &stack_.back()->back();
    }
    *obj_elem_ = std::move(v);
    return obj_elem_;
  }
  bool open(bool object) {
    if (skip_ > 0) {
      ++skip_;
      return true;
    }
    if (mode_ == Mode::Vocab) {
      // A nested value where an id belongs: keep its type for the error message, skip its content.
      vocab.emplace_back(std::move(vocab_key_), object ? json::object() : json::array());
      skip_ = 1;
      return true;
    }
    if (mode_ == Mode::Merges) {
      if (depth_in_mode_ == 1 && !object) {
        merges.push_back(json::array());
        ++depth_in_mode_;
      } else {
        if (depth_in_mode_ == 1) merges.push_back(json::object());
        else merges.back().push_back(object ? json::object() : json::array());
        skip_ = 1;
      }
      return true;
    }
    // model.vocab / model.merges: a member of the object that is the value of the root's "model" key
    const bool in_model = stack_.size() == 2 && stack_[0] == &root && stack_[1]->is_object() && model_open_;
    if (in_model && object && key_ == "vocab") {
      place(json::object());
      vocab.clear();  // a repeated key: the last one wins, as in the document
      mode_ = Mode::Vocab;
      depth_in_mode_ = 1;
      return true;
    }
    if (in_model && !object && key_ == "merges") {
      place(json::array());
      merges.clear();
      mode_ = Mode::Merges;
      depth_in_mode_ = 1;
      return true;
    }
    const bool opening_model = stack_.size() == 1 && object && key_ == "model";
    json* c = place(object ? json::object() : json::array());
    stack_.push_back(c);
    if (stack_.size() == 2) model_open_ = opening_model;
    return true;
  }
  bool close() {
    if (skip_ > 0) {
      --skip_;
      return true;
    }
    if (mode_ != Mode::Dom) {
      if (--depth_in_mode_ == 0) mode_ = Mode::Dom;
      return true;
    }
    stack_.pop_back();
    return true;
  }

  std::vector<json*> stack_;
  json* obj_elem_ = nullptr;
  std::string key_, vocab_key_;
  bool model_open_ = false;
  Mode mode_ = Mode::Dom;
  int depth_in_mode_ = 0;
  int skip_ = 0;
};

class Loader {
 public:
  Loader(const std::string& origin, Tokenizer::Impl& t, TokenizerSax& sax) : origin_(origin), t_(t), sax_(sax) {}

  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
    throw Error(str(origin_, ": ", path, ": ", msg));
  }

  const json* optional(const json& obj, const std::string& path, const char* key) const {
    if (!obj.is_object()) fail(path, str("expected an object, found ", type_name(obj)));
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
  }
  const json& required(const json& obj, const std::string& path, const char* key) const {
    const json* v = optional(obj, path, key);
    if (!v) fail(path, str("missing field '", key, "'"));
    return *v;
  }
  bool boolean(const json& obj, const std::string& path, const char* key, bool dflt) const {
    const json* v = optional(obj, path, key);
    if (!v) return dflt;
    if (!v->is_boolean()) fail(path + "." + key, str("expected true or false, found ", type_name(*v)));
    return v->get<bool>();
  }
  const std::string& string(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, str("expected a string, found ", type_name(v)));
    return v.get_ref<const std::string&>();
  }
  uint32_t id(const json& v, const std::string& path) const {
    if (!v.is_number_integer()) fail(path, str("expected a token id (a non-negative integer), found ", type_name(v)));
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(kMaxId)) fail(path, str("token id ", u, " is out of range (max ", kMaxId, ")"));
      return static_cast<uint32_t>(u);
    }
    const auto s = v.get<int64_t>();
    if (s < 0 || s > kMaxId) fail(path, str("token id ", s, " is out of range (0 to ", kMaxId, ")"));
    return static_cast<uint32_t>(s);
  }
  std::string type_of(const json& v, const std::string& path) const {
    return string(required(v, path, "type"), path + ".type");
  }

  void load(const json& root) {
    if (!root.is_object()) fail("top level", str("expected an object, found ", type_name(root)));
    for (const char* key : {"truncation", "padding"}) {
      if (optional(root, "top level", key))
        fail(key, "is set; kiln encodes without truncation or padding (set it to null)");
    }
    if (const json* n = optional(root, "top level", "normalizer")) normalizer(*n, "normalizer", 0);
    if (const json* p = optional(root, "top level", "pre_tokenizer")) pre_tokenizer(*p, "pre_tokenizer", 0);
    model(required(root, "top level", "model"));
    if (const json* a = optional(root, "top level", "added_tokens")) added_tokens(*a);
    if (const json* p = optional(root, "top level", "post_processor")) {
      std::vector<int32_t> pre, post;
      post_processor(*p, "post_processor", 0, pre, post);
      t_.prefix_ids = std::move(pre);
      t_.suffix_ids = std::move(post);
    }
    if (const json* d = optional(root, "top level", "decoder")) decoder(*d, "decoder", 0);
    int64_t max_id = -1;
    for (const auto& [i, s] : t_.model_id_to_token) max_id = std::max<int64_t>(max_id, i);
    for (const AddedToken& a : t_.added) max_id = std::max<int64_t>(max_id, a.id);
    t_.vocab_size = max_id + 1;
    // The ids the post-processor adds must be tokens: an id past the vocabulary would reach a model's
    // embedding lookup (tokenizers does not check; a file that needs this is malformed).
    for (const std::vector<int32_t>* ids : {&t_.prefix_ids, &t_.suffix_ids}) {
      for (int32_t i : *ids) {
        if (t_.model_id_to_token.count(static_cast<uint32_t>(i)) == 0 &&
            std::none_of(t_.added.begin(), t_.added.end(), [&](const AddedToken& a) { return a.id == static_cast<uint32_t>(i); }))
          fail("post_processor", str("special token id ", i, " is in neither model.vocab nor added_tokens"));
      }
    }
  }

 private:
  void normalizer(const json& n, const std::string& path, int depth) {
    if (depth > kMaxSequenceDepth) fail(path, "Sequence nested too deeply");
    const std::string type = type_of(n, path);
    if (type == "NFC") t_.normalizers.push_back(tok::NormForm::NFC);
    else if (type == "NFD") t_.normalizers.push_back(tok::NormForm::NFD);
    else if (type == "NFKC") t_.normalizers.push_back(tok::NormForm::NFKC);
    else if (type == "NFKD") t_.normalizers.push_back(tok::NormForm::NFKD);
    else if (type == "Sequence") {
      const json& list = required(n, path, "normalizers");
      if (!list.is_array()) fail(path + ".normalizers", str("expected an array, found ", type_name(list)));
      for (size_t i = 0; i < list.size(); ++i) normalizer(list[i], str(path, ".normalizers[", i, "]"), depth + 1);
    } else {
      fail(path + ".type", str("normalizer ", quote_token(type), " is not supported (supported: NFC, NFD, NFKC, NFKD, "
                                "Sequence)"));
    }
  }

  void pre_tokenizer(const json& p, const std::string& path, int depth) {
    if (depth > kMaxSequenceDepth) fail(path, "Sequence nested too deeply");
    const std::string type = type_of(p, path);
    Tokenizer::Impl::PreStep step;
    if (type == "Sequence") {
      const json& list = required(p, path, "pretokenizers");
      if (!list.is_array()) fail(path + ".pretokenizers", str("expected an array, found ", type_name(list)));
      for (size_t i = 0; i < list.size(); ++i)
        pre_tokenizer(list[i], str(path, ".pretokenizers[", i, "]"), depth + 1);
      return;
    }
    if (type == "Split") {
      step.kind = Tokenizer::Impl::PreStep::Split;
      const json& pat = required(p, path, "pattern");
      const std::string ppath = path + ".pattern";
      if (!pat.is_object() || pat.size() != 1)
        fail(ppath, "expected {\"Regex\": ...} or {\"String\": ...}");
      std::string regex;
      if (pat.contains("Regex")) regex = string(pat["Regex"], ppath + ".Regex");
      else if (pat.contains("String")) regex = tok::escape_regex(string(pat["String"], ppath + ".String"));
      else fail(ppath, str("expected {\"Regex\": ...} or {\"String\": ...}, found key ", quote_token(pat.begin().key())));
      step.regex = std::make_unique<tok::Regex>(regex, str(origin_, ": ", ppath));
      const std::string& b = string(required(p, path, "behavior"), path + ".behavior");
      if (b == "Removed") step.behavior = SplitBehavior::Removed;
      else if (b == "Isolated") step.behavior = SplitBehavior::Isolated;
      else if (b == "MergedWithPrevious") step.behavior = SplitBehavior::MergedWithPrevious;
      else if (b == "MergedWithNext") step.behavior = SplitBehavior::MergedWithNext;
      else if (b == "Contiguous") step.behavior = SplitBehavior::Contiguous;
      else fail(path + ".behavior", str("unknown behavior ", quote_token(b), " (Removed, Isolated, MergedWithPrevious, "
                                        "MergedWithNext, Contiguous)"));
      step.invert = boolean(p, path, "invert", false);
    } else if (type == "ByteLevel") {
      step.kind = Tokenizer::Impl::PreStep::ByteLevel;
      step.add_prefix_space = boolean(p, path, "add_prefix_space", true);
      step.use_regex = boolean(p, path, "use_regex", true);
      if (step.use_regex && !t_.gpt2_regex)
        t_.gpt2_regex = std::make_unique<tok::Regex>(kGpt2Pattern, "ByteLevel pre-tokenizer");
    } else {
      fail(path + ".type", str("pre-tokenizer ", quote_token(type), " is not supported (supported: Split, ByteLevel, "
                               "Sequence)"));
    }
    t_.pre.push_back(std::move(step));
  }

  void model(const json& m) {
    const std::string path = "model";
    if (!m.is_object()) fail(path, str("expected an object, found ", type_name(m)));
    if (const json* type = optional(m, path, "type")) {
      if (string(*type, "model.type") != "BPE")
        fail("model.type", str("model ", quote_token(type->get<std::string>()), " is not supported (supported: BPE)"));
    }
    tok::BpeModel& bpe = t_.model;
    if (const json* d = optional(m, path, "dropout")) {
      if (!d->is_number()) fail("model.dropout", str("expected null or a number, found ", type_name(*d)));
      if (d->get<double>() != 0.0)
        fail("model.dropout", "BPE dropout makes encoding random; kiln supports only null or 0");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (const json* v = optional(m, path, key)) {
        if (!string(*v, str("model.", key)).empty())
          fail(str("model.", key), "is set; byte-level BPE has none and kiln does not support it");
      }
    }
    if (const json* u = optional(m, path, "unk_token")) bpe.unk_token = string(*u, "model.unk_token");
    bpe.fuse_unk = boolean(m, path, "fuse_unk", false);
    bpe.byte_fallback = boolean(m, path, "byte_fallback", false);
    bpe.ignore_merges = boolean(m, path, "ignore_merges", false);

    const json& vocab_doc = required(m, path, "vocab");
    if (!vocab_doc.is_object())
      fail("model.vocab", str("expected an object of token: id, found ", type_name(vocab_doc)));
    const auto& vocab = sax_.vocab;  // the entries, in file order (the document holds an empty object)
    bpe.vocab.reserve(vocab.size());
    t_.model_id_to_token.reserve(vocab.size());
    for (const auto& [token, value] : vocab) {
      const uint32_t id = this->id(value, str("model.vocab[", quote_token(token), "]"));
      auto [pos, inserted] = bpe.vocab.emplace(token, id);
      if (!inserted) fail("model.vocab", str("token ", quote_token(token), " appears twice"));
      auto [other, fresh] = t_.model_id_to_token.emplace(id, &pos->first);
      if (!fresh)
        fail("model.vocab", str("tokens ", quote_token(*other->second), " and ", quote_token(token), " both have id ", id));
    }
    for (int b = 0; b < 256; ++b) {
      auto f = bpe.vocab.find(tok::byte_level_alphabet().byte_to_utf8[b]);
      // -1 marks a byte whose character is not in the vocabulary (dropped, as tokenizers drops it). Both arms
      // are int64_t: `cond ? -1 : uint32_t` would convert -1 to 4294967295, a valid-looking id.
      bpe.byte_ids[b] = f == bpe.vocab.end() ? int64_t{-1} : int64_t{f->second};
    }
    bpe.byte_fallback_ids.fill(-1);
    if (bpe.byte_fallback) {
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        if (auto f = bpe.vocab.find(std::string_view(name)); f != bpe.vocab.end()) bpe.byte_fallback_ids[b] = f->second;
      }
    }

    const json& merges_doc = required(m, path, "merges");
    if (!merges_doc.is_array()) fail("model.merges", str("expected an array, found ", type_name(merges_doc)));
    const std::vector<json>& merges = sax_.merges;  // the entries (the document holds an empty array)
    bpe.merges.reserve(merges.size());
    uint32_t rank = 0;
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& e = merges[i];
      const std::string mpath = str("model.merges[", i, "]");
      std::string_view a, b;
      if (e.is_string()) {
        const std::string& line = e.get_ref<const std::string&>();
        if (line.rfind("#version", 0) == 0) continue;  // tokenizers skips a merges.txt header line
        const size_t sp = line.find(' ');
        if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
          fail(mpath, str("expected \"a b\" (two tokens and one space), found ", quote_token(line)));
        a = std::string_view(line).substr(0, sp);
        b = std::string_view(line).substr(sp + 1);
      } else if (e.is_array() && e.size() == 2) {
        a = string(e[0], mpath + "[0]");
        b = string(e[1], mpath + "[1]");
      } else {
        fail(mpath, str("expected \"a b\" or [a, b], found ", type_name(e)));
      }
      auto ia = bpe.vocab.find(a), ib = bpe.vocab.find(b);
      if (ia == bpe.vocab.end()) fail(mpath, str("merge of ", quote_token(a), " and ", quote_token(b), ": ", quote_token(a), " is not in model.vocab"));
      if (ib == bpe.vocab.end()) fail(mpath, str("merge of ", quote_token(a), " and ", quote_token(b), ": ", quote_token(b), " is not in model.vocab"));
      std::string merged(a);
      merged += b;
      auto im = bpe.vocab.find(merged);
      if (im == bpe.vocab.end())
        fail(mpath, str("merge of ", quote_token(a), " and ", quote_token(b), ": the result ", quote_token(merged),
                        " is not in model.vocab"));
      // A repeated pair takes its later rank, as tokenizers' HashMap collect does.
      bpe.merges.set(ia->second, ib->second, {rank, im->second});
      ++rank;
    }
  }

  void added_tokens(const json& list) {
    if (!list.is_array()) fail("added_tokens", str("expected an array, found ", type_name(list)));
    const auto model_size = static_cast<uint32_t>(t_.model.vocab.size());
    std::unordered_map<std::string, size_t> by_content;
    int64_t max_added = -1;
    for (size_t i = 0; i < list.size(); ++i) {
      const json& e = list[i];
      const std::string path = str("added_tokens[", i, "]");
      AddedToken a;
      a.content = string(required(e, path, "content"), path + ".content");
      a.id = id(required(e, path, "id"), path + ".id");
      a.special = boolean(e, path, "special", false);
      a.single_word = boolean(e, path, "single_word", false);
      a.lstrip = boolean(e, path, "lstrip", false);
      a.rstrip = boolean(e, path, "rstrip", false);
      a.normalized = boolean(e, path, "normalized", !a.special);
      if (a.content.empty()) continue;  // tokenizers ignores these
      // tokenizers matches and decodes a normalized token in its normalized form; token_to_id takes the
      // content as written.
      const std::string written = a.content;
      if (a.normalized)
        for (tok::NormForm f : t_.normalizers) tok::normalize(a.content, f);
      // The id tokenizers assigns (it ignores the id in the file and warns when they differ): the one the
      // content already has, else the next free one. A file whose ids disagree is rejected.
      uint32_t expected;
      if (auto d = by_content.find(a.content); d != by_content.end()) {
        const AddedToken& prev = t_.added[d->second];
        if (prev.id != a.id || prev.special != a.special || prev.single_word != a.single_word ||
            prev.lstrip != a.lstrip || prev.rstrip != a.rstrip || prev.normalized != a.normalized)
          fail(path, str("token ", quote_token(a.content), " is listed twice with different id or settings"));
        continue;
      } else if (auto v = t_.model.vocab.find(a.content); v != t_.model.vocab.end()) {
        expected = v->second;
      } else if (max_added < 0) {
        expected = model_size;
      } else {
        expected = (max_added >= model_size || model_size == 0) ? static_cast<uint32_t>(max_added + 1) : model_size;
      }
      if (a.id != expected)
        fail(path + ".id", str("token ", quote_token(a.content), " has id ", a.id, " but tokenizers gives it id ", expected,
                               " (the id of the same content in model.vocab, else the next id after the ",
                               model_size, " model tokens and earlier added tokens)"));
      if (auto clash = t_.added_by_id.find(a.id); clash != t_.added_by_id.end())
        fail(path + ".id", str("id ", a.id, " is already used by added token ", quote_token(t_.added[clash->second].content)));
      max_added = std::max<int64_t>(max_added, a.id);
      by_content.emplace(a.content, t_.added.size());
      t_.added_by_id.emplace(a.id, t_.added.size());
      t_.added_by_content.emplace(written, t_.added.size());
      if (a.special) t_.special_contents.insert(a.content);
      t_.added.push_back(std::move(a));
    }
    // tokenizers matches special tokens first, then the others, each in file order; an equal pattern keeps
    // the first.
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < t_.added.size(); ++i) {
        const AddedToken& a = t_.added[i];
        if (a.special != (pass == 0)) continue;
        if (!a.normalized) {
          t_.raw_matcher.add(a.content, i);
        } else {
          t_.normalized_matcher.add(a.content, i);
        }
      }
    }
  }

  std::pair<std::string, int32_t> token_and_id(const json& v, const std::string& path) const {
    if (!v.is_array() || v.size() != 2) fail(path, "expected [token, id]");
    return {string(v[0], path + "[0]"), static_cast<int32_t>(id(v[1], path + "[1]"))};
  }

  // Appends to pre / post the ids this processor puts before / after the sequence.
  void post_processor(const json& p, const std::string& path, int depth, std::vector<int32_t>& pre,
                      std::vector<int32_t>& post) {
    if (depth > kMaxSequenceDepth) fail(path, "Sequence nested too deeply");
    const std::string type = type_of(p, path);
    if (type == "ByteLevel") return;  // only offsets change
    if (type == "Sequence") {
      const json& list = required(p, path, "processors");
      if (!list.is_array()) fail(path + ".processors", str("expected an array, found ", type_name(list)));
      for (size_t i = 0; i < list.size(); ++i) {
        std::vector<int32_t> a, b;
        post_processor(list[i], str(path, ".processors[", i, "]"), depth + 1, a, b);
        pre.insert(pre.begin(), a.begin(), a.end());
        post.insert(post.end(), b.begin(), b.end());
      }
      return;
    }
    if (type == "BertProcessing" || type == "RobertaProcessing") {
      pre.push_back(token_and_id(required(p, path, "cls"), path + ".cls").second);
      post.push_back(token_and_id(required(p, path, "sep"), path + ".sep").second);
      return;
    }
    if (type != "TemplateProcessing")
      fail(path + ".type", str("post-processor ", quote_token(type), " is not supported (supported: ByteLevel, "
                               "TemplateProcessing, BertProcessing, RobertaProcessing, Sequence)"));
    const json& single = required(p, path, "single");
    const json& specials = required(p, path, "special_tokens");
    if (!single.is_array()) fail(path + ".single", str("expected an array, found ", type_name(single)));
    if (!specials.is_object()) fail(path + ".special_tokens", str("expected an object, found ", type_name(specials)));
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& piece = single[i];
      const std::string ipath = str(path, ".single[", i, "]");
      if (!piece.is_object() || piece.size() != 1)
        fail(ipath, "expected {\"SpecialToken\": {...}} or {\"Sequence\": {...}}");
      if (const json* s = optional(piece, ipath, "Sequence")) {
        const std::string& which = string(required(*s, ipath + ".Sequence", "id"), ipath + ".Sequence.id");
        if (which != "A") fail(ipath + ".Sequence.id", str("the single template can only hold sequence A, found ", quote_token(which)));
        if (seen_sequence) fail(ipath, "sequence A appears twice in the single template");
        seen_sequence = true;
      } else if (const json* s = optional(piece, ipath, "SpecialToken")) {
        const std::string& name = string(required(*s, ipath + ".SpecialToken", "id"), ipath + ".SpecialToken.id");
        auto it = specials.find(name);
        if (it == specials.end())
          fail(ipath, str("special token ", quote_token(name), " is not in ", path, ".special_tokens"));
        const std::string spath = str(path, ".special_tokens[", quote_token(name), "]");
        const json& ids = required(*it, spath, "ids");
        if (!ids.is_array()) fail(spath + ".ids", str("expected an array, found ", type_name(ids)));
        auto& dst = seen_sequence ? post : pre;
        for (size_t k = 0; k < ids.size(); ++k) dst.push_back(static_cast<int32_t>(id(ids[k], str(spath, ".ids[", k, "]"))));
      } else {
        fail(ipath, str("expected {\"SpecialToken\": {...}} or {\"Sequence\": {...}}, found key ",
                        quote_token(piece.begin().key())));
      }
    }
    if (!seen_sequence) fail(path + ".single", "the template has no {\"Sequence\": {\"id\": \"A\"}}");
  }

  void decoder(const json& d, const std::string& path, int depth) {
    if (depth > kMaxSequenceDepth) fail(path, "Sequence nested too deeply");
    const std::string type = type_of(d, path);
    if (type == "ByteLevel") {
      if (t_.decoder == Tokenizer::Impl::Decoder::ByteLevel) fail(path, "a second ByteLevel decoder is not supported");
      t_.decoder = Tokenizer::Impl::Decoder::ByteLevel;
    } else if (type == "Sequence") {
      const json& list = required(d, path, "decoders");
      if (!list.is_array()) fail(path + ".decoders", str("expected an array, found ", type_name(list)));
      for (size_t i = 0; i < list.size(); ++i) decoder(list[i], str(path, ".decoders[", i, "]"), depth + 1);
    } else {
      fail(path + ".type", str("decoder ", quote_token(type), " is not supported (supported: ByteLevel, Sequence of it)"));
    }
  }

  const std::string& origin_;
  Tokenizer::Impl& t_;
  TokenizerSax& sax_;
};

}  // namespace

std::unique_ptr<Tokenizer::Impl> load_tokenizer_impl(std::string_view text, const std::string& origin) {
  check_depth(text, origin);
  TokenizerSax sax;
  try {
    if (!json::sax_parse(text.begin(), text.end(), &sax) || !sax.error.empty())
      throw Error(str(origin, ": not valid JSON: ", sax.error));
  } catch (const json::exception& e) {
    throw Error(str(origin, ": not valid JSON: ", e.what()));
  }
  auto t = std::make_unique<Tokenizer::Impl>();
  t->origin = origin;
  try {
    Loader(origin, *t, sax).load(sax.root);
  } catch (const json::exception& e) {  // a type slip the checks above missed is still an Error, not a crash
    throw Error(str(origin, ": unexpected JSON content: ", e.what()));
  }
  return t;
}

}  // namespace kiln
