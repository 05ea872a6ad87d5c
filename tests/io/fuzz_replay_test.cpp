// Every input of the committed fuzz corpora (fuzz/corpus/<target>) through its fuzz target's function, in
// the ordinary test build: inputs that once crashed a parser, kept in the corpus, stay fixed; under
// `make test-asan` this replays them with AddressSanitizer and UBSan too. A failed property aborts the
// test executable, naming it (fuzz/fuzz.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz.h"

namespace {

namespace fs = std::filesystem;

// The corpus files of `target`, in name order.
std::vector<fs::path> corpus(const std::string& target) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(KILN_FUZZ_CORPUS_DIR) / target))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

void replay(const std::string& target, int (*fn)(const uint8_t*, size_t), size_t at_least) {
  const auto files = corpus(target);
  ASSERT_GE(files.size(), at_least) << "fuzz/corpus/" << target << " lost its inputs";
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SCOPED_TRACE(f.string());
    EXPECT_EQ(fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0);
  }
}

TEST(FuzzCorpus, SafetensorsInputsReplay) { replay("safetensors", kiln_fuzz_safetensors, 100); }
TEST(FuzzCorpus, ConfigInputsReplay) { replay("config", kiln_fuzz_config, 10); }
TEST(FuzzCorpus, TokenizerInputsReplay) { replay("tokenizer", kiln_fuzz_tokenizer, 4); }
TEST(FuzzCorpus, TokenizerEncodeInputsReplay) { replay("tokenizer_encode", kiln_fuzz_tokenizer_encode, 20); }
TEST(FuzzCorpus, ChatInputsReplay) { replay("chat", kiln_fuzz_chat, 5); }
TEST(FuzzCorpus, GgufInputsReplay) { replay("gguf", kiln_fuzz_gguf, 1); }
TEST(FuzzCorpus, ServeRequestInputsReplay) { replay("request", kiln_fuzz_request, 10); }

}  // namespace
