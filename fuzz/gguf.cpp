// Fuzz target: the GGUF header parser, the block dequantisers, and the tokenizer rebuilt from the metadata.
// Beyond "no crash, no out-of-bounds access": every tensor the parser accepts lies inside the file, and every
// readable one dequantises to as many floats as its shape holds.
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz.h"
#include "kiln/gguf.h"
#include "kiln/tokenizer.h"

int kiln_fuzz_gguf(const uint8_t* data, size_t size) {
  // An exact-size heap copy, so AddressSanitizer flags any read past the end.
  std::shared_ptr<uint8_t[]> buf(new uint8_t[size ? size : 1]);
  if (size) std::memcpy(buf.get(), data, size);
  try {
    const kiln::GgufFile f = kiln::GgufFile::from_memory(buf.get(), size, buf, "fuzz");
    for (const auto& t : f.header().tensors) {
      KILN_FUZZ_CHECK(t.offset >= f.header().data_offset && t.offset <= size && t.nbytes <= size - t.offset);
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      if (t.nbytes == 0 || n > (int64_t{1} << 20)) continue;  // unknown types; keep each run fast
      try {
        const kiln::Tensor x = f.get(t.name);
        KILN_FUZZ_CHECK(x.numel() == n);
      } catch (const kiln::Error&) {  // a type kiln lists but cannot read
      }
    }
    // The metadata's tokenizer, rebuilt as tokenizer.json text and parsed.
    try {
      (void)kiln::Tokenizer::from_json(kiln::gguf_tokenizer_json(f), "fuzz");
    } catch (const kiln::Error&) {
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}

#ifdef KILN_FUZZ_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return kiln_fuzz_gguf(data, size); }
#endif
