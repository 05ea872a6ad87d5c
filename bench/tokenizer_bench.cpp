// Encoding throughput of a tokenizer.json on a text file:
//   kiln_tokenizer_bench TOKENIZER.json TEXT_FILE [repeats [IDS_OUT]]
// Prints MB/s for a first pass (fresh tokenizer: empty word cache) and the median of later passes (warm
// cache), both single-threaded, and the number of tokens. scripts/tokenizer_bench.py times Hugging Face
// tokenizers on the same inputs. IDS_OUT: the ids of each document, one line each, to compare with
// `scripts/tokenizer_bench.py time ... IDS_OUT`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "kiln/error.h"
#include "kiln/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER.json TEXT_FILE [repeats [IDS_OUT]]\n", argv[0]);
    return 2;
  }
  const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  try {
    std::ifstream f(argv[2], std::ios::binary);
    if (!f) throw kiln::Error(kiln::str("cannot open ", argv[2]));
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    // Lines as separate encode calls, as a server sees prompts; and the whole file as one call.
    std::vector<std::string> docs;
    for (size_t i = 0; i < text.size();) {
      size_t j = text.find("\n\n", i);
      j = j == std::string::npos ? text.size() : j + 2;
      docs.push_back(text.substr(i, j - i));
      i = j;
    }
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    const kiln::Tokenizer tok = kiln::Tokenizer::from_file(argv[1]);
    const double load_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    size_t n_tokens = 0;
    auto pass = [&] {
      n_tokens = 0;
      const auto a = clock::now();
      for (const auto& d : docs) n_tokens += tok.encode(d, false).size();
      return std::chrono::duration<double>(clock::now() - a).count();
    };
    const double cold = pass();
    std::vector<double> warm;
    for (int r = 0; r < repeats; ++r) warm.push_back(pass());
    std::sort(warm.begin(), warm.end());
    if (argc > 4) {
      std::ofstream o(argv[4]);
      for (const auto& d : docs) {
        const auto ids = tok.encode(d, false);
        for (size_t i = 0; i < ids.size(); ++i) o << (i ? "," : "") << ids[i];
        o << "\n";
      }
    }
    const double mb = static_cast<double>(text.size()) / 1e6;
    std::printf("tokenizer %s: load %.1f ms\n", argv[1], load_ms);
    std::printf("text %s: %.2f MB in %zu documents, %zu tokens (%.2f bytes/token)\n", argv[2], mb, docs.size(),
                n_tokens, static_cast<double>(text.size()) / static_cast<double>(n_tokens));
    std::printf("encode: first pass %.1f MB/s, warm cache %.1f MB/s (median of %d)\n", mb / cold,
                mb / warm[warm.size() / 2], repeats);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
