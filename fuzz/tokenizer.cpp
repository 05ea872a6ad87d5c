// Fuzz target: tokenizer.json loading (normalizers, pre-tokenizer regexes, BPE vocabulary and merges,
// added tokens, post-processors, decoders). A tokenizer that loads must encode and decode text: every id it
// gives is below vocab_size(), and decoding any id list, ids outside the vocabulary included, works.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz.h"
#include "kiln/error.h"
#include "kiln/tokenizer.h"

int kiln_fuzz_tokenizer(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const kiln::Tokenizer tok = kiln::Tokenizer::from_json(text, "fuzz-tokenizer.json");
    const int64_t vocab = tok.vocab_size();
    static const char* const samples[] = {"Hello world, it's 2026!", "  spaces\n\nand\ttabs ", "中文 Ελληνικά 😀",
                                          "<|endoftext|><mask>", "don't 123456 ..."};
    for (const char* s : samples) {
      for (bool special : {false, true}) {
        const std::vector<int32_t> ids = tok.encode(s, special);
        for (int32_t id : ids) KILN_FUZZ_CHECK(id >= 0 && id < vocab);
        (void)tok.decode(ids, false);
        (void)tok.decode(ids, true);
      }
    }
    const std::vector<int32_t> odd = {0, -1, 2147483647, static_cast<int32_t>(vocab - 1), static_cast<int32_t>(vocab)};
    (void)tok.decode(odd, false);
    // No round trip is checked here: as in tokenizers, a normalized added token's id_to_token is its normalized
    // form, while token_to_id knows only its written one.
    for (int32_t id : odd) {
      if (auto t = tok.id_to_token(id)) (void)tok.token_to_id(*t);
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}

#ifdef KILN_FUZZ_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return kiln_fuzz_tokenizer(data, size); }
#endif
