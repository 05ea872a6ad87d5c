// Fuzz target: encoding and decoding arbitrary text with the tokenizers of tests/data/tokenizers (Qwen2,
// Llama 3 and GPT-2 layouts). Invalid UTF-8 is an error; valid text encodes to ids below vocab_size(), and
// with Llama 3's tokenizer (no normalizer) decodes back to exactly the input.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz.h"
#include "kiln/error.h"
#include "kiln/tokenizer.h"

namespace {

struct Tokenizers {
  std::vector<std::pair<std::string, kiln::Tokenizer>> all;
  Tokenizers() {
    for (const char* name : {"llama3", "qwen2", "gpt2", "pairs_ignore_merges"})
      all.emplace_back(name, kiln::Tokenizer::from_file(std::string(KILN_FUZZ_TOKENIZER_DIR) + "/" + name + ".json"));
  }
};

}  // namespace

int kiln_fuzz_tokenizer_encode(const uint8_t* data, size_t size) {
  static const Tokenizers toks;  // loaded once: a missing or broken file throws here and stops the run
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& [name, tok] : toks.all) {
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(text, false);
    } catch (const kiln::Error&) {
      continue;  // invalid UTF-8
    }
    for (int32_t id : ids) KILN_FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
    const std::string back = tok.decode(ids, false);
    if (name == "llama3") KILN_FUZZ_CHECK(back == text);
    const std::vector<int32_t> with_special = tok.encode(text, true);
    KILN_FUZZ_CHECK(with_special.size() >= ids.size());
    (void)tok.decode(with_special, true);
  }
  return 0;
}

#ifdef KILN_FUZZ_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kiln_fuzz_tokenizer_encode(data, size);
}
#endif
