// `kiln bench ops`: times each case of the table in bench_ops_cases.cpp on one GPU, eager and graph-replayed,
// and reports achieved bandwidth against the card's measured copy bandwidth. bench/torch_ops.py times the
// same cases through PyTorch the same way; scripts/device-bench.sh runs both and prints the ratio table.
//
// Method (docs/benchmarks.md says why):
//   copies   C = clamp(ceil(4 * L2 / copy_bytes), 2, max_copies) copies of fresh random inputs, so that
//            consecutive calls read inputs that are no longer in L2 (for the small tensors whose copies all
//            fit in L2 anyway the op is latency bound, and a model has those in L2 too)
//   warm-up  one call per copy, then a sync
//   eager    `repeats` batches of min(C, 64) calls cycling through the copies, each batch between two
//            events; per-call time = batch time / calls; the median over batches
//   graph    one kiln::Graph holding one call per copy, replayed twice to warm up, then `repeats` replays
//            each between two events; per-call time = replay time / C; the median over replays (not for the
//            cases that synchronise with the host, OpCase::graph)
//   bytes    every input read once and every output written once; GB/s = bytes / graph time
//   copy     device-to-device copy of a 1 GiB buffer, (read + write bytes) / median time
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "bench_ops.h"
#include "commands.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "kiln/runtime.h"
#if KILN_HAVE_CUDA
#include "cuda/backend.h"
#endif

namespace kiln::cli {

namespace {

constexpr int kEagerBatch = 64;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

int copies_for(const OpCase& c, int64_t l2_bytes) {
  const double want = std::ceil(4.0 * static_cast<double>(l2_bytes) / static_cast<double>(std::max<int64_t>(1, c.copy_bytes)));
  return static_cast<int>(std::clamp(want, 2.0, static_cast<double>(std::max(2, c.max_copies))));
}

std::string section_of(const std::string& name) { return name.substr(0, name.find('/')); }

// Per-call milliseconds of `repeats` timed runs of `body`, each between two events on `s`; one sync at the
// end so that the host runs ahead of the GPU as it would in a model.
template <class Body>
std::vector<double> timed(const Stream& s, int repeats, int calls_per_run, Body&& body) {
  std::vector<Event> start, stop;
  start.reserve(repeats);
  stop.reserve(repeats);
  for (int i = 0; i < repeats; ++i) {
    start.emplace_back(true);
    stop.emplace_back(true);
  }
  for (int i = 0; i < repeats; ++i) {
    start[i].record(s);
    body();
    stop[i].record(s);
  }
  s.synchronize();
  std::vector<double> t;
  t.reserve(repeats);
  for (int i = 0; i < repeats; ++i) t.push_back(stop[i].elapsed_ms(start[i]) / calls_per_run);
  return t;
}

struct Result {
  double eager_us = kNaN, graph_us = kNaN;
  int copies = 0;
  std::string error;
  void fail(const char* phase, const std::exception& e) {
    if (!error.empty()) error += "; ";
    error += std::string(phase) + ": " + e.what();
  }
};

Result run_case(const OpCase& c, Device dev, const Stream& s, int repeats, int64_t l2_bytes) {
  Result r;
  r.copies = copies_for(c, l2_bytes);
  std::vector<BenchCall> calls;
  try {
    calls.reserve(r.copies);
    for (int i = 0; i < r.copies; ++i) calls.push_back(c.make(dev));
    for (auto& call : calls) call();
    s.synchronize();
  } catch (const std::exception& e) {
    r.fail("setup", e);
    return r;
  }
  try {
    const int batch = std::min(r.copies, kEagerBatch);
    size_t next = 0;
    r.eager_us = 1e3 * median(timed(s, repeats, batch, [&] {
                   for (int j = 0; j < batch; ++j) {
                     calls[next]();
                     next = (next + 1) % calls.size();
                   }
                 }));
  } catch (const std::exception& e) {
    r.fail("eager", e);
  }
  if (!c.graph) return r;
  try {
    Graph g;
    g.capture(s, [&] {
      for (auto& call : calls) call();
    });
    g.replay(s);
    g.replay(s);
    s.synchronize();
    r.graph_us = 1e3 * median(timed(s, repeats, r.copies, [&] { g.replay(s); }));
  } catch (const std::exception& e) {
    r.fail("graph", e);
  }
  return r;
}

// Device-to-device copy of a 1 GiB buffer: (read + write bytes) / median time, in GB/s (1e9).
double copy_gbps(Device dev, const Stream& s) {
  const int64_t n = int64_t{1} << 28;  // f32
  Tensor src = empty({n}, DType::F32, dev), dst = empty({n}, DType::F32, dev);
  uniform_(src, -1.0, 1.0);
  dst.copy_(src);
  dst.copy_(src);
  s.synchronize();
  const double ms = median(timed(s, 20, 1, [&] { dst.copy_(src); }));
  return 2.0 * static_cast<double>(src.nbytes()) / (ms * 1e-3) / 1e9;
}

std::string human_bytes(int64_t b) {
  char buf[32];
  if (b >= 1000000) std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else if (b >= 1000) std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  return buf;
}

nlohmann::json num_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

std::string no_cuda_reason() {
#if KILN_HAVE_CUDA
  const std::string why = cuda::unavailable_reason();
  return why.empty() ? "no CUDA device found" : why;
#else
  return "this build has no CUDA backend (configure with -DKILN_CUDA=ON)";
#endif
}

}  // namespace

int run_bench_ops(const BenchOpsOptions& opt) {
  std::regex filter;
  try {
    filter = std::regex(opt.filter.empty() ? std::string(".*") : opt.filter);
  } catch (const std::regex_error& e) {
    std::cerr << "kiln bench ops: --filter '" << opt.filter << "' is not a valid regular expression: " << e.what()
              << "\n";
    return 1;
  }
  std::vector<OpCase> cases;
  for (auto& c : op_cases())
    if (std::regex_search(c.name, filter)) cases.push_back(std::move(c));
  if (cases.empty()) {
    std::cerr << "kiln bench ops: no case matches --filter '" << opt.filter << "' (see --list)\n";
    return 1;
  }
  if (opt.list) {
    // name, bytes, copy_bytes, max_copies: bench/torch_ops.py --list prints the same lines.
    for (const auto& c : cases)
      std::printf("%s %lld %lld %d\n", c.name.c_str(), static_cast<long long>(c.bytes),
                  static_cast<long long>(c.copy_bytes), c.max_copies);
    return 0;
  }

  const Device dev = Device::parse(opt.device);
  if (!dev.is_cuda()) {
    std::cerr << "kiln bench ops: times CUDA kernels; --device must be cuda or cuda:N, got " << opt.device << "\n";
    return 1;
  }
  if (!cuda_available()) {
    std::cerr << "kiln bench ops: no CUDA device available: " << no_cuda_reason()
              << ".\nThe benchmark needs an NVIDIA GPU (scripts/device-bench.sh runs it on one); `kiln bench ops "
                 "--list` prints the cases without one.\n";
    return 2;
  }
  const DeviceProperties props = device_properties(dev);
  const Stream s = Stream::create(dev);
  StreamGuard guard(s);
  manual_seed(0x42454E43);

  const auto t0 = std::chrono::steady_clock::now();
  const double copy = copy_gbps(dev, s);
  std::printf("kiln bench ops on %s (%s, L2 %lld MiB): device-to-device copy %.1f GB/s; %zu cases, %d repeats\n",
              dev.str().c_str(), props.name.c_str(), static_cast<long long>(props.l2_bytes >> 20), copy,
              cases.size(), opt.repeats);
  std::fflush(stdout);

  nlohmann::json out;
  out["tool"] = "kiln";
  out["gpu"] = props.name;
  out["device"] = dev.str();
  out["copy_gbps"] = copy;
  out["l2_bytes"] = props.l2_bytes;
  out["repeats"] = opt.repeats;
  out["cases"] = nlohmann::json::array();

  int errors = 0;
  std::string section;
  auto section_start = std::chrono::steady_clock::now();
  auto end_section = [&] {
    if (section.empty()) return;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - section_start).count();
    std::printf("  (%s: %.1f s)\n", section.c_str(), secs);
  };
  for (const auto& c : cases) {
    if (section_of(c.name) != section) {
      end_section();
      section = section_of(c.name);
      section_start = std::chrono::steady_clock::now();
      const auto n = std::count_if(cases.begin(), cases.end(), [&](const OpCase& o) { return section_of(o.name) == section; });
      std::printf("\n== %s: %lld cases ==\n%-44s %10s %10s %10s %9s %7s %6s\n", section.c_str(),
                  static_cast<long long>(n), "case", "eager us", "graph us", "bytes", "GB/s", "% copy", "copies");
      std::fflush(stdout);
    }
    const Result r = run_case(c, dev, s, opt.repeats, props.l2_bytes);
    empty_cache(dev);  // the copies of a large case (up to 2 GB) go back before the next case
    const double gbps = static_cast<double>(c.bytes) / (r.graph_us * 1e-6) / 1e9;
    std::printf("%-44s %10.2f %10.2f %10s %9.1f %7.1f %6d\n", c.name.c_str(), r.eager_us, r.graph_us,
                human_bytes(c.bytes).c_str(), gbps, 100.0 * gbps / copy, r.copies);
    if (!r.error.empty()) {
      ++errors;
      std::printf("  error: %s\n", r.error.c_str());
    }
    std::fflush(stdout);
    nlohmann::json j = {{"name", c.name},
                        {"eager_us", num_or_null(r.eager_us)},
                        {"graph_us", num_or_null(r.graph_us)},
                        {"bytes", c.bytes},
                        {"gbps", num_or_null(gbps)},
                        {"pct_copy", num_or_null(100.0 * gbps / copy)},
                        {"copies", r.copies}};
    if (!r.error.empty()) j["error"] = r.error;
    out["cases"].push_back(std::move(j));
  }
  end_section();
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%zu cases in %.1f s, %d with errors\n", cases.size(), total, errors);

  if (!opt.json.empty()) {
    std::ofstream f(opt.json);
    KILN_CHECK(static_cast<bool>(f), "kiln bench ops: cannot write ", opt.json);
    f << out.dump(1) << "\n";
    std::printf("wrote %s\n", opt.json.c_str());
  }
  return 0;
}

}  // namespace kiln::cli
