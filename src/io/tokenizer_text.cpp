// Text primitives of the tokenizer: UTF-8, normalisation, regex, the byte-level alphabet, token matching.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "io/tokenizer_internal.h"
#include "kiln/error.h"

namespace kiln::tok {

// ---- UTF-8 ----------------------------------------------------------------------------------------------

namespace {
// Length of the valid prefix of an ill-formed or complete sequence starting at s[i] (Unicode 3.9, table
// 3-7): returns (bytes consumed, valid). A sequence cut short or broken after k good bytes consumes k
// bytes as one maximal subpart; a lone bad lead byte consumes one.
std::pair<size_t, bool> utf8_step(const unsigned char* p, size_t n) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {1, true};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false};
  }
  size_t k = 1;
  for (; k <= need; ++k) {
    if (k >= n) return {k, false};
    const unsigned char b = p[k];
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {k, false};
  }
  return {need + 1, true};
}
}  // namespace

size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    auto [len, ok] = utf8_step(p + i, s.size() - i);
    if (!ok) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string from_utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    auto [len, ok] = utf8_step(p + i, s.size() - i);
    if (ok) out.append(s.data() + i, len);
    else out += "\xEF\xBF\xBD";
    i += len;
  }
  return out;
}

int utf8_next(std::string_view s, size_t i, char32_t* cp) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) {
    *cp = p[0];
    return 1;
  }
  if (p[0] < 0xE0) {
    *cp = (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    return 2;
  }
  if (p[0] < 0xF0) {
    *cp = (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    return 3;
  }
  *cp = (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
        (p[3] & 0x3F);
  return 4;
}

char32_t utf8_prev(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  char32_t cp;
  utf8_next(s, i, &cp);
  return cp;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool newer_letter_or_digit(char32_t c);

bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  if (newer_letter_or_digit(c)) return true;
  // Other_Alphabetic symbols (circled and squared Latin letters) are \w although their category is So.
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
      (c >= 0x1F170 && c <= 0x1F189))
    return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// ---- normalisation --------------------------------------------------------------------------------------

bool nfc_inert(char32_t c) {
  // Characters with no canonical decomposition that differs in NFC, combining class 0, and that no
  // canonical composition takes as its second character: a string of them is its own NFC. Checked for
  // every one of them against utf8proc by the tests.
  return c < 0x300 || (c >= 0x400 && c <= 0x482) || (c >= 0x48A && c <= 0x52F) || (c >= 0x3041 && c <= 0x3096) ||
         (c >= 0x30A1 && c <= 0x30FA) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7A3) ||
         (c >= 0x1F300 && c <= 0x1FAFF) || (c >= 0x200B && c <= 0x200D) || c == 0xFE0F;
}

void normalize(std::string& s, NormForm form) {
  if (is_ascii(s)) return;  // every normal form of ASCII is itself
  if (form == NormForm::NFC) {
    bool inert = true;
    for (size_t i = 0; i < s.size() && inert;) {
      char32_t c;
      i += static_cast<size_t>(utf8_next(s, i, &c));
      inert = nfc_inert(c);
    }
    if (inert) return;
  }
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormForm::NFC: options |= UTF8PROC_COMPOSE; break;
    case NormForm::NFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormForm::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormForm::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) throw Error(str("tokenizer: Unicode normalisation failed: ", utf8proc_errmsg(n)));
  s.assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
}

// ---- regex ----------------------------------------------------------------------------------------------

namespace {
std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}
// Bound the work and memory one match may take, so that a hostile pattern (catastrophic backtracking) ends
// in an error instead of a hang or an exhausted heap: the match limit counts backtracking steps (JIT and
// interpreter), the depth limit nests backtracking frames, and the heap limit (KiB) caps the interpreter's
// frame vector (PCRE2's default would let one match take 20 GB).
constexpr uint32_t kMatchLimit = 50'000'000;
constexpr uint32_t kDepthLimit = 1'000'000;
constexpr uint32_t kHeapLimitKib = 256 * 1024;
}  // namespace

// Letters and numbers that onig in tokenizers 0.23 knows (Unicode 15.0 to 16.0) and PCRE2 10.42 (Unicode
// 14.0) does not: the difference of the two engines' \p{L}, \p{N} and \d over all code points. With a newer
// PCRE2 they are already members and the union changes nothing. Rust's \w (single_word) knows them too.
constexpr std::pair<char32_t, char32_t> kExtraLetterRanges[] = {
    {0x1C89, 0x1C8A}, {0xA7CB, 0xA7CD}, {0xA7DA, 0xA7DC}, {0x105C0, 0x105F3}, {0x10D4A, 0x10D65},
    {0x10D6F, 0x10D85}, {0x10EC2, 0x10EC4}, {0x1123F, 0x11240}, {0x11380, 0x11389}, {0x1138B, 0x1138B},
    {0x1138E, 0x1138E}, {0x11390, 0x113B5}, {0x113B7, 0x113B7}, {0x113D1, 0x113D1}, {0x113D3, 0x113D3},
    {0x11BC0, 0x11BE0}, {0x11F02, 0x11F02}, {0x11F04, 0x11F10}, {0x11F12, 0x11F33}, {0x1342F, 0x1342F},
    {0x13441, 0x13446}, {0x13460, 0x143FA}, {0x16100, 0x1611D}, {0x16D40, 0x16D6C}, {0x18CFF, 0x18CFF},
    {0x1B132, 0x1B132}, {0x1B155, 0x1B155}, {0x1DF25, 0x1DF2A}, {0x1E030, 0x1E06D}, {0x1E4D0, 0x1E4EB},
    {0x1E5D0, 0x1E5ED}, {0x1E5F0, 0x1E5F0}, {0x2B739, 0x2B739}, {0x2EBF0, 0x2EE5D}, {0x31350, 0x323AF}};
constexpr std::pair<char32_t, char32_t> kExtraDigitRanges[] = {
    {0x10D40, 0x10D49}, {0x116D0, 0x116E3}, {0x11BF0, 0x11BF9}, {0x11F50, 0x11F59}, {0x16130, 0x16139},
    {0x16D70, 0x16D79}, {0x1CCF0, 0x1CCF9}, {0x1E4F0, 0x1E4F9}, {0x1E5F1, 0x1E5FA}};
constexpr std::pair<char32_t, char32_t> kExtraNumberRanges[] = {
    {0x1D2C0, 0x1D2D3}};

template <size_t K>
bool in_ranges(const std::pair<char32_t, char32_t> (&rs)[K], char32_t c) {
  for (const auto& [lo, hi] : rs)
    if (c >= lo && c <= hi) return true;
  return false;
}

bool newer_letter_or_digit(char32_t c) {
  return c >= 0x1C89 && (in_ranges(kExtraLetterRanges, c) || in_ranges(kExtraDigitRanges, c));
}

template <size_t K>
std::string class_items(const std::pair<char32_t, char32_t> (&rs)[K]) {
  std::string out;
  char buf[40];
  for (const auto& [lo, hi] : rs) {
    std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", static_cast<unsigned>(lo), static_cast<unsigned>(hi));
    out += buf;
  }
  return out;
}

// onig's \s is White_Space; PCRE2's (UCP) also has U+180E.
constexpr const char* kSpace = R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
// onig's \h is a hexadecimal digit (PCRE2's is horizontal space).
constexpr const char* kHex = "0-9A-Fa-f";

std::string onig_to_pcre2(std::string_view p) {
  static const std::string kExtraLetters = class_items(kExtraLetterRanges);
  static const std::string kExtraDigits = class_items(kExtraDigitRanges);
  static const std::string kExtraNumbers = class_items(kExtraNumberRanges);
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  // A class-like escape: positive members `set`; outside a class it becomes [set] or [^set]; inside a class
  // a positive one is spliced in, a negated one (rare; no splice exists) is left to PCRE2.
  auto put = [&](std::string_view original, const std::string& set, bool negated) {
    if (in_class) out += negated ? std::string(original) : set;
    else out += (negated ? "[^" : "[") + set + "]";
  };
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 'p' || e == 'P') {
        size_t len = 3;
        std::string name;
        if (i + 2 < p.size() && p[i + 2] == '{') {
          const size_t close = p.find('}', i + 3);
          if (close == std::string_view::npos) {
            out.append(p.substr(i));
            break;
          }
          name = std::string(p.substr(i + 3, close - i - 3));
          len = close - i + 1;
        } else if (i + 2 < p.size()) {
          name = std::string(1, p[i + 2]);
        } else {
          out.append(p.substr(i));
          break;
        }
        const std::string_view original = p.substr(i, len);
        if (name == "L") put(original, std::string(R"(\p{L})") + kExtraLetters, e == 'P');
        else if (name == "N") put(original, std::string(R"(\p{N})") + kExtraDigits + kExtraNumbers, e == 'P');
        else out.append(original);
        i += len - 1;
        continue;
      }
      const std::string_view original = p.substr(i, 2);
      switch (e) {
        case 's': case 'S': put(original, kSpace, e == 'S'); break;
        case 'd': case 'D': put(original, std::string(R"(\p{Nd})") + kExtraDigits, e == 'D'); break;
        case 'h': case 'H': put(original, kHex, e == 'H'); break;
        case 'w': case 'W':
          // onig's \w: Alphabetic, marks, decimal digits, connector punctuation, Join_Control.
          put(original, std::string(R"(\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}\x{200C}\x{200D}\x{24B6}-\x{24E9})"
                                    R"(\x{1F130}-\x{1F149}\x{1F150}-\x{1F169}\x{1F170}-\x{1F189})") +
                            kExtraLetters + kExtraDigits,
              e == 'W');
          break;
        default: out.append(original);
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is a member
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern, const std::string& what) : what_(what) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  // onig (which tokenizers uses) has Ruby syntax: ^ and $ match at line boundaries, hence MULTILINE.
  const std::string translated = onig_to_pcre2(pattern);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &err_off, nullptr);
  if (!code)
    throw Error(str(what, ": invalid regex at offset ", err_off, ": ", pcre2_message(err), " (pattern ", pattern,
                    ")"));
  // Without JIT support pcre2_match interprets: slower, same matches.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
  auto* mc = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(mc, kMatchLimit);
  pcre2_set_depth_limit(mc, kDepthLimit);
  pcre2_set_heap_limit(mc, kHeapLimitKib);
  mcontext_ = mc;
}

Regex::~Regex() {
  pcre2_match_context_free(static_cast<pcre2_match_context*>(mcontext_));
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* mc = static_cast<pcre2_match_context*>(mcontext_);
  struct MatchData {
    pcre2_match_data* p = pcre2_match_data_create(1, nullptr);
    ~MatchData() { pcre2_match_data_free(p); }
  };
  thread_local MatchData md;
  if (!md.p) throw Error("tokenizer: out of memory for regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  size_t last_match_end = std::string_view::npos;
  while (pos <= s.size()) {
    const uint32_t options = PCRE2_NO_UTF_CHECK;
    // pcre2_jit_match skips pcre2_match's option checks: this call runs once per pre-token.
    int rc = jit_ ? pcre2_jit_match(code, subject, s.size(), pos, 0, md.p, mc)
                  : pcre2_match(code, subject, s.size(), pos, options, md.p, mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The JIT's machine stack is small; the interpreter keeps its backtracking state on the heap.
      rc = pcre2_match(code, subject, s.size(), pos, options | PCRE2_NO_JIT, md.p, mc);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw Error(str(what_, ": regex match failed: ", pcre2_message(rc)));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.p);
    const size_t start = ov[0], end = ov[1];
    if (start == end && last_match_end == end) {
      // onig's find_iter: no empty match right after the previous match; step one character.
      if (pos >= s.size()) break;
      char32_t cp;
      pos += static_cast<size_t>(utf8_next(s, pos, &cp));
      continue;
    }
    out.emplace_back(start, end);
    last_match_end = end;
    pos = end;
  }
}

std::string escape_regex(std::string_view literal) {
  // A backslash before any ASCII non-alphanumeric character (NUL included) makes it literal in PCRE2;
  // bytes >= 0x80 are parts of UTF-8 characters and always literal.
  std::string out;
  for (char c : literal) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

// ---- byte-level alphabet ----------------------------------------------------------------------------------

ByteLevelAlphabet::ByteLevelAlphabet() {
  char_to_byte.fill(-1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t c = printable ? char32_t(b) : char32_t(256 + extra++);
    byte_to_utf8[b].clear();
    append_utf8(byte_to_utf8[b], c);
    char_to_byte[c] = static_cast<int16_t>(b);
  }
}

void ByteLevelAlphabet::map(std::string_view bytes, std::string& out) const {
  out.clear();
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += byte_to_utf8[b];
}

bool ByteLevelAlphabet::unmap(std::string_view token, std::string& out) const {
  const size_t mark = out.size();
  size_t i = 0;
  while (i < token.size()) {
    char32_t c;
    i += static_cast<size_t>(utf8_next(token, i, &c));
    if (c >= char_to_byte.size() || char_to_byte[c] < 0) {
      out.resize(mark);
      return false;
    }
    out += static_cast<char>(char_to_byte[c]);
  }
  return true;
}

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet a;
  return a;
}

// ---- added-token matching ---------------------------------------------------------------------------------

void TokenMatcher::add(std::string_view s, size_t value) {
  if (s.empty()) return;
  uint32_t n = 0;
  for (unsigned char b : s) {
    auto& next = nodes_[n].next;
    auto it = std::lower_bound(next.begin(), next.end(), b,
                               [](const std::pair<uint8_t, uint32_t>& e, uint8_t k) { return e.first < k; });
    if (it != next.end() && it->first == b) {
      n = it->second;
    } else {
      const auto child = static_cast<uint32_t>(nodes_.size());
      next.insert(it, {b, child});
      nodes_.emplace_back();
      n = child;
    }
  }
  nodes_[n].value = static_cast<int64_t>(value);
  first_[static_cast<unsigned char>(s[0])] = true;
}

bool TokenMatcher::find(std::string_view text, size_t from, size_t* start, size_t* end, size_t* value) const {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_[p[i]]) continue;
    uint32_t n = 0;
    int64_t best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto& next = nodes_[n].next;
      auto it = std::lower_bound(next.begin(), next.end(), p[j],
                                 [](const std::pair<uint8_t, uint32_t>& e, uint8_t k) { return e.first < k; });
      if (it == next.end() || it->first != p[j]) break;
      n = it->second;
      if (nodes_[n].value >= 0) {
        best = nodes_[n].value;
        best_end = j + 1;
      }
    }
    if (best >= 0) {
      *start = i;
      *end = best_end;
      *value = static_cast<size_t>(best);
      return true;
    }
  }
  return false;
}

}  // namespace kiln::tok
