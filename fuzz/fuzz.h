// What the fuzz targets share. Each target is a function kiln_fuzz_<name>(data, size) in fuzz/<name>.cpp;
// the libFuzzer build (KILN_FUZZ_ENTRY) gives it LLVMFuzzerTestOneInput, and the test suite replays the
// committed corpora through the same functions (tests/io/fuzz_replay_test.cpp).
//
// A target throws nothing but kiln::Error at its callees and catches only that: any other exception, a
// sanitizer report or a failed KILN_FUZZ_CHECK is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

// A property of accepted input that must hold; a failure aborts, which libFuzzer and the tests report.
#define KILN_FUZZ_CHECK(cond)                                                                  \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "fuzz property failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

int kiln_fuzz_safetensors(const uint8_t* data, size_t size);
int kiln_fuzz_config(const uint8_t* data, size_t size);
int kiln_fuzz_tokenizer(const uint8_t* data, size_t size);
int kiln_fuzz_tokenizer_encode(const uint8_t* data, size_t size);
int kiln_fuzz_chat(const uint8_t* data, size_t size);
int kiln_fuzz_gguf(const uint8_t* data, size_t size);
int kiln_fuzz_request(const uint8_t* data, size_t size);
