// Fuzz target: config.json and generation_config.json (kiln/llm/config.h), and the RoPE frequencies a
// parsed config implies. An accepted config describes a model kiln can build: positive sizes that divide
// as attention needs, finite RoPE settings and frequencies.
#include <cmath>
#include <string>

#include "fuzz.h"
#include "kiln/error.h"
#include "kiln/llm/config.h"

int kiln_fuzz_config(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    kiln::llm::ModelConfig c = kiln::llm::parse_config(text, "fuzz-config");
    KILN_FUZZ_CHECK(c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0 && c.num_kv_heads > 0 && c.head_dim > 0);
    KILN_FUZZ_CHECK(c.num_heads % c.num_kv_heads == 0);
    const kiln::llm::RopeFrequencies f = kiln::llm::rope_frequencies(c);
    KILN_FUZZ_CHECK(std::isfinite(f.attention_scaling));
    for (float v : f.inv_freq) KILN_FUZZ_CHECK(std::isfinite(v));
    try {
      kiln::llm::apply_generation_config(c, text, "fuzz-generation-config");
    } catch (const kiln::Error&) {
    }
  } catch (const kiln::Error&) {
  }
  try {
    kiln::llm::ModelConfig c;
    kiln::llm::apply_generation_config(c, text, "fuzz-generation-config");
  } catch (const kiln::Error&) {
  }
  return 0;
}

#ifdef KILN_FUZZ_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return kiln_fuzz_config(data, size); }
#endif
