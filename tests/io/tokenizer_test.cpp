// tokenizer.json against the Hugging Face `tokenizers` library: the reference ids and decoded texts in
// tests/data/tokenizers/<name>.ref.json were written by scripts/make_reference.py (section tokenizers).
#include "kiln/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include <utf8proc.h>

#include "io/tokenizer_internal.h"
#include "kiln/error.h"
#include "test_util.h"

namespace kiln {
namespace {

using json = nlohmann::json;

std::string data_path(const std::string& name) { return std::string(KILN_TEST_DATA_DIR) + "/tokenizers/" + name; }

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

std::string show(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 60)) {
    if (c < 0x20) out += "\\x" + std::to_string(c);
    else out += static_cast<char>(c);
  }
  return s.size() > 60 ? out + "...(" + std::to_string(s.size()) + " bytes)" : out;
}

class TokenizerReference : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerReference, EncodeAndDecodeMatchTokenizers) {
  const Tokenizer tok = Tokenizer::from_file(data_path(GetParam() + ".json"));
  const json ref = json::parse(read_file(data_path(GetParam() + ".ref.json")));
  ASSERT_GT(ref["encode"].size(), 40u);
  // Twice: the second pass is served from the word cache and must agree.
  for (int pass = 0; pass < 2; ++pass) {
    for (const json& c : ref["encode"]) {
      const std::string text = c["text"].get<std::string>();
      SCOPED_TRACE("text '" + show(text) + "' pass " + std::to_string(pass));
      const std::vector<int32_t> ids = tok.encode(text, true);
      EXPECT_EQ(ids, ids_of(c["ids"]));
      EXPECT_EQ(tok.encode(text, false), ids_of(c["ids_plain"]));
      EXPECT_EQ(tok.decode(ids_of(c["ids"]), false), c["decoded"].get<std::string>());
      EXPECT_EQ(tok.decode(ids_of(c["ids"]), true), c["decoded_skip"].get<std::string>());
    }
  }
  ASSERT_GT(ref["decode"].size(), 20u);
  for (const json& c : ref["decode"]) {
    const std::vector<int32_t> ids = ids_of(c["ids"]);
    SCOPED_TRACE("decode " + c["ids"].dump());
    EXPECT_EQ(tok.decode(ids, false), c["text"].get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c["text_skip"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, TokenizerReference,
                         ::testing::Values("qwen2", "llama3", "gpt2", "pairs_ignore_merges"));

// Random text of ASCII, Latin, Greek, CJK, emoji, combining marks and whitespace runs.
std::string random_text(std::mt19937_64& g, size_t n_chars) {
  static const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0x17F}, {0x300, 0x36F}, {0x391, 0x3C9}, {0x4E00, 0x4E80},
      {0x3040, 0x30FF}, {0x1F600, 0x1F64F}, {0x200B, 0x200D}, {0x2000, 0x200A}, {0x30, 0x39}};
  std::string s;
  for (size_t i = 0; i < n_chars; ++i) {
    const auto& [lo, hi] = ranges[g() % ranges.size()];
    const char32_t c = lo + static_cast<char32_t>(g() % (hi - lo + 1));
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else if (c < 0x800) {
      s += static_cast<char>(0xC0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      s += static_cast<char>(0xE0 | (c >> 12));
      s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (c >> 18));
      s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return s;
}

TEST(Tokenizer, ByteLevelRoundTripsRandomText) {
  // llama3 has no normalizer: decoding the ids gives back exactly the input bytes.
  const Tokenizer tok = Tokenizer::from_file(data_path("llama3.json"));
  for (int i = 0; i < 200; ++i) {
    const std::string s = random_text(test::rng(), 1 + test::rng()() % 300);
    SCOPED_TRACE(show(s));
    const auto ids = tok.encode(s, false);
    EXPECT_EQ(tok.decode(ids), s);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
  }
}

TEST(Tokenizer, ConcurrentEncodingAgrees) {
  const Tokenizer tok = Tokenizer::from_file(data_path("qwen2.json"));
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back(random_text(test::rng(), 200));
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(tok.encode(t));
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int r = 0; r < 5; ++r)
        for (size_t i = 0; i < texts.size(); ++i) bad[k] += tok.encode(texts[(i + k) % texts.size()]) != expected[(i + k) % texts.size()];
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(bad[k], 0) << "thread " << k;
}

TEST(Tokenizer, VocabularyQueries) {
  const Tokenizer tok = Tokenizer::from_file(data_path("qwen2.json"));
  EXPECT_EQ(tok.vocab_size(), 1003);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 1002);
  EXPECT_EQ(tok.id_to_token(1001), "<|im_start|>");
  EXPECT_TRUE(tok.is_special(1000));
  EXPECT_FALSE(tok.is_special(5));
  EXPECT_EQ(tok.id_to_token(5000), std::nullopt);
  EXPECT_EQ(tok.id_to_token(-1), std::nullopt);
  EXPECT_EQ(tok.token_to_id("no such token"), std::nullopt);
  // A model directory holds tokenizer.json.
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_tok_" + std::to_string(test::rng()()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(data_path("llama3.json"), dir / "tokenizer.json");
  const auto llama = Tokenizer::from_model_dir(dir.string());
  std::filesystem::remove_all(dir);
  EXPECT_EQ(llama.encode("hi", true).front(), llama.token_to_id("<|begin_of_text|>"));
  EXPECT_NE(llama.encode("hi", false).front(), llama.token_to_id("<|begin_of_text|>"));
}

// Without a decoder tokenizers joins all tokens, added ones included, with spaces (values from 0.23.3).
TEST(Tokenizer, NoDecoderJoinsTokensWithSpaces) {
  json j = json::parse(read_file(data_path("gpt2.json")));
  j["decoder"] = nullptr;
  const Tokenizer t = Tokenizer::from_json(j.dump());
  auto id = [&](const char* s) { return *t.token_to_id(s); };
  const std::vector<int32_t> ids = {id("a"), id("b"), 600, id("c"), 603, id("d"), 604, id("e"), 605};
  EXPECT_EQ(t.decode(ids), "a b <|endoftext|> c hello world d fix e \u00b8\u00ad");
  EXPECT_EQ(t.decode(ids, true), "a b c hello world d fix e \u00b8\u00ad");
  EXPECT_EQ(t.decode(std::vector<int32_t>{603, 603}), "hello world hello world");
  EXPECT_EQ(t.decode(std::vector<int32_t>{}), "");
}

TEST(Tokenizer, NormalizedAddedTokenKeepsItsWrittenNameForLookup) {
  // tokenizers 0.23.3: token_to_id("\ufb01x") = 604, token_to_id("fix") = None, id_to_token(604) = "fix".
  const Tokenizer t = Tokenizer::from_file(data_path("gpt2.json"));
  EXPECT_EQ(t.token_to_id("\xef\xac\x81x"), 604);
  EXPECT_EQ(t.token_to_id("fix"), std::nullopt);
  EXPECT_EQ(t.id_to_token(604), "fix");
  EXPECT_EQ(t.token_to_id("hello world"), 603);
}

TEST(Tokenizer, InvalidUtf8InputIsAnError) {
  const Tokenizer tok = Tokenizer::from_file(data_path("qwen2.json"));
  for (std::string bad : {std::string("ab\xff"), std::string("\xe4\xb8"), std::string("x\xc0\x80y"),
                          std::string("\xed\xa0\x80")}) {
    EXPECT_TRUE(test::throws_error([&] { tok.encode(bad); }, {"not valid UTF-8", "byte"})) << show(bad);
  }
}

// The NFC fast path skips utf8proc for strings of "inert" characters: each must be its own NFC, have
// combining class 0, and never be the second character of a canonical composition (the last character of
// some character's canonical decomposition), so that no string of them changes under NFC.
TEST(TokenizerText, NfcInertCharactersAreStableUnderNfc) {
  std::vector<bool> second(0x110000, false);
  for (utf8proc_int32_t p = 0; p < 0x110000; ++p) {
    utf8proc_int32_t buf[32];
    int last_boundclass = 0;
    const auto n = utf8proc_decompose_char(p, buf, 32, UTF8PROC_DECOMPOSE, &last_boundclass);
    if (n >= 2) second[static_cast<size_t>(buf[n - 1])] = true;
  }
  ASSERT_TRUE(second[0x301] && second[0x3099] && second[0x11A8]);  // acute, kana voicing, Hangul final jamo
  int64_t checked = 0;
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (!tok::nfc_inert(c) || (c >= 0xD800 && c <= 0xDFFF)) continue;
    std::string s;
    tok::append_utf8(s, c);
    utf8proc_uint8_t* out = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                                &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    ASSERT_GE(n, 0);
    const std::string nfc(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    ASSERT_EQ(nfc, s) << "U+" << std::hex << static_cast<uint32_t>(c);
    ASSERT_EQ(utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class, 0) << std::hex << uint32_t(c);
    ASSERT_FALSE(second[c]) << "U+" << std::hex << static_cast<uint32_t>(c) << " ends a decomposition";
    ++checked;
  }
  EXPECT_GT(checked, 35000);
}

// ---- malformed tokenizer.json -------------------------------------------------------------------------------

json qwen2_json() { return json::parse(read_file(data_path("qwen2.json"))); }

void expect_text_error(const std::string& text, const std::string& needle) {
  EXPECT_TRUE(test::throws_error([&] { Tokenizer::from_json(text, "bad.json"); }, {needle}))
      << "expected an error containing '" << needle << "'";
}
void expect_load_error(const json& j, const std::string& needle) { expect_text_error(j.dump(), needle); }

TEST(TokenizerLoad, MalformedFilesAreErrorsNamingTheField) {
  expect_text_error("", "not valid JSON");
  expect_text_error("{\"model\": ", "not valid JSON");
  expect_text_error("[1, 2]", "expected an object");
  expect_text_error(std::string(100000, '[') + std::string(100000, ']'), "nested deeper");
  expect_text_error("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], \"x\": \"\xff\"}}", "not valid JSON");
  expect_load_error(json::object(), "missing field 'model'");

  json j = qwen2_json();
  j["model"].erase("vocab");
  expect_load_error(j, "model: missing field 'vocab'");
  j = qwen2_json();
  j["model"]["vocab"] = json::array();
  expect_load_error(j, "model.vocab");
  j = qwen2_json();
  j["model"]["vocab"]["a"] = 4000000000u;
  expect_load_error(j, "out of range");
  j = qwen2_json();
  j["model"]["vocab"]["a"] = -1;
  expect_load_error(j, "out of range");
  j = qwen2_json();
  j["model"]["vocab"]["a"] = 1.5;
  expect_load_error(j, "expected a token id");
  j = qwen2_json();
  j["model"]["vocab"]["zzzz-new"] = 7;
  expect_load_error(j, "both have id 7");
  j = qwen2_json();
  j["model"]["merges"].push_back(json::array({"Ġ", "not-a-token"}));
  expect_load_error(j, "'not-a-token' is not in model.vocab");
  j = qwen2_json();
  j["model"]["merges"].push_back(json::array({"a", "b"}));  // "ab" is no token of this vocabulary
  if (!j["model"]["vocab"].contains("ab")) expect_load_error(j, "the result 'ab' is not in model.vocab");
  j = qwen2_json();
  j["model"]["merges"].push_back("a b c");
  expect_load_error(j, "model.merges[");
  j = qwen2_json();
  j["model"]["merges"].push_back(42);
  expect_load_error(j, "model.merges[");
  j = qwen2_json();
  j["model"]["type"] = "WordPiece";
  expect_load_error(j, "model 'WordPiece' is not supported");
  j = qwen2_json();
  j["model"]["dropout"] = 0.1;
  expect_load_error(j, "model.dropout");
  j = qwen2_json();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_load_error(j, "normalizer 'Lowercase' is not supported");
  j = qwen2_json();
  j["normalizer"] = {{"type", "Sequence"}};
  expect_load_error(j, "normalizer: missing field 'normalizers'");
  j = qwen2_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_load_error(j, "invalid regex");
  j = qwen2_json();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  expect_load_error(j, "unknown behavior 'Sideways'");
  j = qwen2_json();
  j["pre_tokenizer"]["pretokenizers"][1]["type"] = "Metaspace";
  expect_load_error(j, "pre_tokenizer.pretokenizers[1].type");
  j = qwen2_json();
  j["added_tokens"][1]["id"] = 50;
  expect_load_error(j, "added_tokens[1].id");
  j = qwen2_json();
  j["added_tokens"][0].erase("content");
  expect_load_error(j, "added_tokens[0]: missing field 'content'");
  j = qwen2_json();
  j["added_tokens"][2]["special"] = "yes";
  expect_load_error(j, "added_tokens[2].special");
  j = qwen2_json();
  j["truncation"] = {{"max_length", 8}};
  expect_load_error(j, "truncation");
  j = qwen2_json();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_load_error(j, "decoder 'WordPiece' is not supported");
  j = qwen2_json();
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", json::object()}};
  expect_load_error(j, "special token '<s>' is not in post_processor.special_tokens");
  // vocab and merges are read by a streaming parser: the same checks hold for what it collects.
  j = qwen2_json();
  j["model"]["vocab"]["x"] = {{"nested", 1}};
  expect_load_error(j, "model.vocab['x']: expected a token id (a non-negative integer), found an object");
  j = qwen2_json();
  j["model"]["vocab"]["x"] = json::array({1, 2});
  expect_load_error(j, "found an array");
  j = qwen2_json();
  j["model"]["merges"].push_back(json::array({"a", "b", "c"}));
  expect_load_error(j, "expected \"a b\" or [a, b], found an array");
  j = qwen2_json();
  j["model"]["merges"].push_back({{"a", "b"}});
  expect_load_error(j, "found an object");
  j = qwen2_json();
  j["model"]["merges"].push_back(json::array({"a", json::array({"b"})}));
  expect_load_error(j, "model.merges[");
  {
    std::string text = read_file(data_path("qwen2.json"));
    const size_t at = text.find("\"vocab\":{") + 9;
    expect_text_error(text.substr(0, at) + "\"a\":5000," + text.substr(at), "token 'a' appears twice");
  }
  json seq = {{"type", "NFC"}};
  for (int i = 0; i < 20; ++i) seq = {{"type", "Sequence"}, {"normalizers", json::array({seq})}};
  j = qwen2_json();
  j["normalizer"] = seq;
  expect_load_error(j, "nested too deeply");
  EXPECT_TRUE(test::throws_error([] { Tokenizer::from_file(data_path("no_such_file.json")); }, {"cannot open"}));
}

// A second "model" key replaces the first, as in a JSON document; "vocab" / "merges" elsewhere are
// ordinary values.
TEST(TokenizerLoad, StreamedVocabularyFollowsTheDocument) {
  const std::string good = read_file(data_path("qwen2.json"));
  const Tokenizer reference = Tokenizer::from_json(good);
  json other = json::parse(good);
  other["normalizer"] = nullptr;
  other["decoder"]["merges"] = json::array({"x y"});  // ignored field of the decoder
  other["decoder"]["vocab"] = {{"q", 1}};
  const std::string tail = good.substr(good.size() - 1);
  ASSERT_EQ(tail, "}");
  std::string twice = good.substr(0, good.size() - 1) + ",\"model\":" + json::parse(good)["model"].dump() + "}";
  for (const std::string& text : {other.dump(), twice}) {
    const Tokenizer t = Tokenizer::from_json(text);
    EXPECT_EQ(t.vocab_size(), reference.vocab_size());
    EXPECT_EQ(t.encode("hello world, don't 1234 <|im_end|>"), reference.encode("hello world, don't 1234 <|im_end|>"));
  }
  json no_model_vocab = json::parse(good);
  no_model_vocab["model"]["vocab"] = json::array();
  no_model_vocab["pre_tokenizer"]["vocab"] = {{"a", 0}};
  expect_load_error(no_model_vocab, "model.vocab: expected an object");
}

TEST(TokenizerLoad, UnknownCharacterWithoutUnkTokenIsDropped) {
  // tokenizers drops a character missing from the vocabulary when there is no unk_token; with one, it is
  // unk (fused when fuse_unk).
  json j = qwen2_json();
  j["pre_tokenizer"] = nullptr;
  j["normalizer"] = nullptr;
  const auto id_a = j["model"]["vocab"]["a"].get<int32_t>();
  const auto id_b = j["model"]["vocab"]["b"].get<int32_t>();
  const Tokenizer plain = Tokenizer::from_json(j.dump());
  EXPECT_EQ(plain.encode("a\xe2\x82\xac" "b", false), plain.encode("ab", false));
  EXPECT_EQ(plain.encode("\xe2\x82\xac", false), std::vector<int32_t>{});
  j["model"]["unk_token"] = "<|endoftext|>";
  j["model"]["vocab"]["<|endoftext|>"] = 1000;  // as GPT-2's vocab has it
  const auto unk = 1000;
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("a\xe2\x82\xac\xe2\x82\xac" "b", false),
            (std::vector<int32_t>{id_a, unk, unk, id_b}));
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("a\xe2\x82\xac\xe2\x82\xac" "b", false),
            (std::vector<int32_t>{id_a, unk, id_b}));
}

// Expected ids from tokenizers 0.23.3 for this file. Note its order: bytes of a later character come before
// a pending (fused) unknown.
TEST(TokenizerLoad, ByteFallbackAndFusedUnknownsAsTokenizers) {
  const json j = {
      {"added_tokens", json::array()},
      {"model",
       {{"type", "BPE"}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true},
        {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"<0xE2>", 3}, {"<0x82>", 4}, {"<0xAC>", 5}, {"ab", 6}, {"<0xC3>", 7}}},
        {"merges", json::array({json::array({"a", "b"})})}}}};
  const Tokenizer tok = Tokenizer::from_json(j.dump());
  using V = std::vector<int32_t>;
  EXPECT_EQ(tok.encode("a\u20ac" "b"), (V{1, 3, 4, 5, 2}));
  EXPECT_EQ(tok.encode("ab\u20ac" "ab"), (V{6, 3, 4, 5, 6}));
  EXPECT_EQ(tok.encode("\u00e9"), (V{0}));
  EXPECT_EQ(tok.encode("a\u00e9"), (V{1, 0}));
  EXPECT_EQ(tok.encode("\u00e7\u20ac"), (V{3, 4, 5, 0}));
  EXPECT_EQ(tok.encode("xy\u20ac"), (V{3, 4, 5, 0}));
  EXPECT_EQ(tok.encode("x\u00e9"), (V{0}));
}

// Random damage to a valid file: every outcome is a loaded tokenizer or a kiln::Error, never a crash.
TEST(TokenizerLoad, DamagedFilesNeverCrash) {
  const std::string good = read_file(data_path("gpt2.json"));
  auto& g = test::rng();
  int loaded = 0, rejected = 0;
  for (int i = 0; i < 300; ++i) {
    std::string s = good;
    switch (i % 3) {
      case 0: s.resize(g() % s.size()); break;
      case 1:
        for (int k = 0; k < 4; ++k) s[g() % s.size()] = static_cast<char>(g() % 256);
        break;
      default: {
        const size_t a = g() % s.size(), n = g() % 64;
        s.erase(a, std::min(n, s.size() - a));
      }
    }
    try {
      Tokenizer t = Tokenizer::from_json(s, "damaged.json");
      (void)t.encode("hello <mask> world 123 don't 中文");
      (void)t.decode(t.encode("x y z"));
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);
  EXPECT_EQ(loaded + rejected, 300);
}

// A byte whose byte-level character is missing from the vocabulary is dropped, as tokenizers drops an
// unknown character without unk_token (found by the tokenizer fuzz target: the byte became id 2^32 - 1).
TEST(TokenizerLoad, ByteMissingFromTheVocabularyIsDropped) {
  json j = json::parse(read_file(data_path("gpt2.json")));
  const std::string tab = "\xc4\x89";  // U+0109, the byte-level character of '\t'
  ASSERT_TRUE(j["model"]["vocab"].contains(tab));
  const int64_t tab_id = j["model"]["vocab"][tab].get<int64_t>();
  j["model"]["vocab"].erase(tab);
  j["model"]["vocab"]["renamed-tab"] = tab_id;
  const Tokenizer t = Tokenizer::from_json(j.dump(), "missing-byte.json");
  const Tokenizer full = Tokenizer::from_file(data_path("gpt2.json"));
  auto without_tab = full.encode("and\ttabs", false);
  without_tab.erase(std::find(without_tab.begin(), without_tab.end(), tab_id));
  EXPECT_EQ(t.encode("and\ttabs", false), without_tab);
  for (int32_t id : t.encode("\t\t a\tb", true)) EXPECT_TRUE(id >= 0 && id < t.vocab_size()) << id;
}

// A post-processor that adds an id no token has is refused (found by the tokenizer fuzz target).
TEST(TokenizerLoad, PostProcessorIdsMustBeTokens) {
  json j = json::parse(read_file(data_path("gpt2.json")));
  ASSERT_EQ(j["post_processor"]["type"], "TemplateProcessing");
  j.erase("added_tokens");  // <|endoftext|> (id 600) is an added token only
  EXPECT_TRUE(test::throws_error([&] { Tokenizer::from_json(j.dump(), "x.json"); },
                                 {"post_processor", "special token id 600"}));
}

// A pre-tokenizer regex with catastrophic backtracking ends in an error, in bounded time and memory,
// instead of hanging the process: PCRE2's match, depth and heap limits (tokenizer_text.cpp) stop it.
TEST(TokenizerLoad, CatastrophicRegexIsAnErrorNotAHang) {
  const json tok = {{"version", "1.0"},
                    {"added_tokens", json::array()},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(a+)+$"}}}, {"behavior", "Isolated"},
                                       {"invert", false}}},
                    {"post_processor", nullptr},
                    {"decoder", nullptr},
                    {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"aa", 2}}}, {"merges", {"a a"}}}}};
  const Tokenizer t = Tokenizer::from_json(tok.dump(), "catastrophic.json");
  EXPECT_EQ(t.encode("aaaa", false), (std::vector<int32_t>{2, 2}));  // the pattern works on benign text
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(test::throws_error([&] { t.encode(std::string(64, 'a') + "b", false); }, {"regex match failed", "limit"}));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
}

// Long runs of one character class go through the real pre-tokenizer patterns within the limits.
TEST(TokenizerLoad, LongRunsStayWithinTheRegexLimits) {
  for (const char* name : {"qwen2", "llama3"}) {
    const Tokenizer t = Tokenizer::from_file(data_path(std::string(name) + ".json"));
    for (const std::string& s : {std::string(1 << 20, ' '), std::string(1 << 20, 'x'), std::string(1 << 19, '7'),
                                 std::string(1 << 19, '\n') + "a", std::string(1 << 18, '!')}) {
      const auto ids = t.encode(s, false);
      EXPECT_FALSE(ids.empty()) << name;
      if (std::string(name) == "llama3") EXPECT_EQ(t.decode(ids), s);
    }
  }
}

}  // namespace
}  // namespace kiln
