// `kiln bench serve`: a load generator for an OpenAI-compatible server (kiln serve, or any other) over HTTP.
// For each concurrency level it runs that many client threads, each sending streamed completion requests
// (a prompt of random token ids, greedy, end-of-sequence ignored, usage included) back to back, and reports
// the aggregate output tokens/s and the percentiles of time to first token (TTFT) and of the time between
// streamed pieces (inter-token latency, ITL).
#include "bench_serve.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <thread>

#include "kiln/error.h"

namespace kiln::cli {

namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0, clock_type::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(at), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

struct Sample {
  double ttft_ms = 0;
  std::vector<double> itl_ms;
  int64_t tokens = 0;
  std::string error;
};

// One streamed request; the SSE events are parsed as they arrive.
Sample one_request(const std::string& host, int port, const std::string& key, const json& body) {
  Sample s;
  httplib::Client cli(host, port);
  cli.set_read_timeout(600, 0);
  cli.set_connection_timeout(10, 0);
  httplib::Headers headers;
  if (!key.empty()) headers.emplace("Authorization", "Bearer " + key);
  std::string buffer;
  const auto t0 = clock_type::now();
  auto last = t0;
  bool first = true;
  auto receiver = [&](const char* data, size_t n) {
    buffer.append(data, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
      const json j = json::parse(event.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        s.error = j["error"].value("message", "error");
        continue;
      }
      if (j.contains("usage") && j["usage"].is_object()) s.tokens = j["usage"].value("completion_tokens", int64_t{0});
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const json& c = j["choices"][0];
      // A piece: a chunk of text, or (a model without a tokenizer) a token's empty chunk; not the last chunk,
      // which carries the finish reason, nor a chat stream's opening role chunk.
      const bool open = c.contains("delta") && c["delta"].contains("role");
      const bool piece = !open && c.contains("finish_reason") && c["finish_reason"].is_null() &&
                         ((c.contains("text") && c["text"].is_string()) ||
                          (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string()));
      if (!piece) continue;
      const auto now = clock_type::now();
      if (first) s.ttft_ms = ms_since(t0, now);
      else s.itl_ms.push_back(ms_since(last, now));
      first = false;
      last = now;
    }
    return true;
  };
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = headers;
  req.headers.emplace("Content-Type", "application/json");
  req.body = body.dump();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) { return receiver(data, n); };
  const auto res = cli.send(req);
  if (!res) s.error = "connection failed: " + httplib::to_string(res.error());
  else if (res->status != 200 && s.error.empty()) s.error = "HTTP " + std::to_string(res->status) + ": " + res->body;
  return s;
}

}  // namespace

int run_bench_serve(const BenchServeOptions& o) {
  const std::regex url_re(R"(^http://([^:/]+)(?::(\d+))?/?$)");
  std::smatch m;
  KILN_CHECK(std::regex_match(o.url, m, url_re), "bench serve: --url must look like http://HOST:PORT, got \"", o.url, "\"");
  const std::string host = m[1];
  const int port = m[2].matched ? std::stoi(m[2]) : 80;
  {
    httplib::Client probe(host, port);
    const auto r = probe.Get("/health");
    KILN_CHECK(r && r->status == 200, "bench serve: no server answers ", o.url, "/health");
  }
  std::printf("bench serve: %s, prompt %lld tokens, output %lld tokens, %lld requests per stream\n", o.url.c_str(),
              (long long)o.prompt, (long long)o.output, (long long)o.requests_per_stream);
  std::printf("| streams | output t/s | per stream t/s | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | errors |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
  json results = json::array();
  std::mt19937_64 rng(o.seed);
  for (const int64_t c : o.concurrency) {
    std::vector<Sample> samples;
    std::mutex mu;
    std::vector<std::thread> threads;
    const auto t0 = clock_type::now();
    for (int64_t i = 0; i < c; ++i) {
      // Each stream's prompts: fresh random ids (no two requests share a prefix).
      std::vector<json> bodies;
      for (int64_t r = 0; r < o.requests_per_stream; ++r) {
        std::vector<int64_t> ids(static_cast<size_t>(o.prompt));
        for (auto& id : ids) id = static_cast<int64_t>(rng() % static_cast<uint64_t>(o.vocab));
        bodies.push_back({{"prompt", ids}, {"max_tokens", o.output}, {"temperature", 0}, {"ignore_eos", true},
                          {"stream", true}, {"stream_options", {{"include_usage", true}}}});
      }
      threads.emplace_back([&, bodies] {
        for (const json& b : bodies) {
          Sample s = one_request(host, port, o.api_key, b);
          std::lock_guard<std::mutex> lock(mu);
          samples.push_back(std::move(s));
        }
      });
    }
    for (auto& t : threads) t.join();
    const double seconds = ms_since(t0, clock_type::now()) / 1000.0;
    std::vector<double> ttft, itl;
    int64_t tokens = 0, errors = 0;
    for (const Sample& s : samples) {
      if (!s.error.empty()) {
        ++errors;
        if (errors == 1) std::fprintf(stderr, "bench serve: %s\n", s.error.c_str());
        continue;
      }
      ttft.push_back(s.ttft_ms);
      itl.insert(itl.end(), s.itl_ms.begin(), s.itl_ms.end());
      tokens += s.tokens;
    }
    const double tps = tokens / seconds;
    std::printf("| %lld | %.1f | %.1f | %.1f / %.1f / %.1f | %.2f / %.2f / %.2f | %lld |\n", (long long)c, tps,
                tps / static_cast<double>(c), percentile(ttft, 50), percentile(ttft, 90), percentile(ttft, 99),
                percentile(itl, 50), percentile(itl, 90), percentile(itl, 99), (long long)errors);
    std::fflush(stdout);
    results.push_back({{"streams", c}, {"seconds", seconds}, {"output_tokens", tokens}, {"output_tps", tps},
                       {"ttft_ms", {{"p50", percentile(ttft, 50)}, {"p90", percentile(ttft, 90)}, {"p99", percentile(ttft, 99)}}},
                       {"itl_ms", {{"p50", percentile(itl, 50)}, {"p90", percentile(itl, 90)}, {"p99", percentile(itl, 99)}}},
                       {"requests", static_cast<int64_t>(samples.size())}, {"errors", errors}});
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << json{{"url", o.url}, {"prompt", o.prompt}, {"output", o.output}, {"levels", results}}.dump(1) << "\n";
  }
  for (const auto& r : results)
    if (r["errors"].get<int64_t>() > 0) return 1;
  return 0;
}

}  // namespace kiln::cli
