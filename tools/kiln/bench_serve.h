// `kiln bench serve`: a load generator for an OpenAI-compatible server (tools/kiln/bench_serve.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cli {

struct BenchServeOptions {
  std::string url = "http://127.0.0.1:8080";
  std::vector<int64_t> concurrency = {1, 8, 32, 128};  // concurrent streams, one level after the other
  int64_t prompt = 512;                                // prompt tokens (random ids below `vocab`)
  int64_t output = 256;                                // tokens each request generates
  int64_t requests_per_stream = 2;
  int64_t vocab = 1000;
  uint64_t seed = 1;
  std::string api_key;
  std::string json;
};

// 0 when every request succeeded.
int run_bench_serve(const BenchServeOptions& options);

}  // namespace kiln::cli
