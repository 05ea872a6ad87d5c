// CUDA launchers of topk and sample (the kernels and the building blocks: src/cuda/kernels/sampling.cuh).
//
// Paths (rows [B, V], every launch on the current stream, no host synchronisation, graph-capturable):
//   argmax partials  chunk_argmax_kernel: (nb chunks) x B blocks; each chunk's argmax. Greedy finishes from it
//                    (argmax_finalize_kernel, or directly when nb == 1); the paths below other than top_k take
//                    the row maximum and the undefined-distribution check from it.
//   topk             chunk_select_kernel (each chunk's first k) + topk_merge_kernel (one block per row).
//   sample, 1 <= top_k <= 64 (the usual decode configuration): chunk_select_kernel (topk's, on the logits) +
//                    sample_topk_final_kernel, which turns the row's first top_k logits into e and applies top_p,
//                    min_p and the draw exactly as the CPU does. Two launches, one pass over the logits.
//   sample without top_k / top_p (temperature only, or min_p): sample_chunk_sums_kernel (each chunk's kept
//                    sum) + sample_chunk_draw_kernel (finds the chunk where the running sum crosses u W, then
//                    the token within it, repeating the chunk's additions).
//   sample, top_p without top_k, <= 64 rows of >= 2 chunks: a memset, 4 x topp_round_kernel (a radix search
//                    for the top_p threshold whose histograms all chunks add to with integer atomics) and
//                    topp_ties_kernel, then the two chunk kernels above keeping {key > tau} + the first r ties.
//   sample, otherwise (top_k > 64, or top_p on many or short rows): sample_weights_kernel writes e [B, V] (f32
//                    scratch, stays in L2) and sample_general_kernel (one block per row) finds the top_k /
//                    top_p thresholds by radix searches and draws with a block scan: the slow path for long
//                    rows.
// The generic reduction (reduce_split_rows_kernel + a combine pass) would also give greedy's argmax in two
// launches, but through the generic reduction machinery; the chunk kernel here shares its partials with the
// sampling paths.
#include "cuda/sampling.h"

#include <algorithm>

#include "core/dispatch.h"
#include "cuda/device_error.h"
#include "cuda/kernels/sampling.cuh"
#include "cuda/launch.h"

namespace kiln::cuda {

namespace {
using namespace sampling;

constexpr DTypeSet kHalfAndFloat = dset(DType::F16, DType::BF16, DType::F32);
// top_p without top_k runs on the chunks for up to this many rows (and rows of >= 2 chunks).
constexpr int64_t kChunkedTopPMaxRows = 64;

struct Geometry {
  int chunk = 0, nb = 0;
  unsigned grid_rows = 0;  // gridDim.y of the chunk kernels (rows are grid-strided beyond it)
};

// About two blocks per SM in all, chunks of 1024..4096 elements (a chunk's keys fit in shared memory).
Geometry geometry(int64_t rows, int64_t v, int device) {
  const int64_t sms = multiprocessor_count(device);
  const int64_t target = std::max<int64_t>(1, 2 * sms / std::max<int64_t>(rows, 1));
  int64_t chunk = std::clamp<int64_t>((v + target - 1) / target, 1024, kChunkMax);
  chunk = std::min<int64_t>((chunk + 31) / 32 * 32, kChunkMax);
  Geometry g;
  g.chunk = static_cast<int>(chunk);
  g.nb = static_cast<int>((v + chunk - 1) / chunk);
  g.grid_rows = static_cast<unsigned>(std::min<int64_t>(rows, 65535));
  return g;
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 1 << 30)); }

Tensor scratch(int64_t bytes, Device device) { return empty({std::max<int64_t>(bytes, 1)}, DType::U8, device); }

template <class P>
P* ptr(const Tensor& t) {
  return static_cast<P*>(t.data_ptr());
}
}  // namespace

void topk(const Tensor& x, int64_t n, int64_t k, const Tensor& values, const Tensor& indices) {
  KILN_CHECK(n < (int64_t{1} << 31), "topk: rows of ", n, " elements are too long for the CUDA kernels (input ",
             x.meta(), "); at most 2^31 - 1");
  const int64_t rows = x.numel() / n;
  if (rows == 0) return;
  const Device device = x.device();
  DeviceGuard guard(device);
  const cudaStream_t stream = stream_of(device);
  const Geometry g = geometry(rows, n, device.index);
  const dim3 grid(static_cast<unsigned>(g.nb), g.grid_rows);
  const int V = static_cast<int>(n), K = static_cast<int>(k);
  visit_dtypes<kHalfAndFloat>(x.dtype(), "topk", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = ptr<const T>(x);
    if (g.nb == 1) {
      chunk_select_kernel<T><<<grid, kChunkThreads, 0, stream>>>(src, rows, V, g.chunk, 1, K, nullptr, nullptr,
                                                                 ptr<T>(values), ptr<int64_t>(indices), nullptr,
                                                                 nullptr);
      check_launch("topk");
      return;
    }
    const int64_t cand = rows * g.nb * K;
    Tensor ckey = scratch(cand * 4, device), cidx = scratch(cand * 4, device);
    chunk_select_kernel<T><<<grid, kChunkThreads, 0, stream>>>(src, rows, V, g.chunk, g.nb, K, ptr<uint32_t>(ckey),
                                                               ptr<int32_t>(cidx), nullptr, nullptr, nullptr, nullptr);
    check_launch("topk");
    topk_merge_kernel<T><<<row_blocks(rows), kRowThreads, 0, stream>>>(
        src, rows, V, g.nb, K, ptr<const uint32_t>(ckey), ptr<const int32_t>(cidx), ptr<T>(values),
        ptr<int64_t>(indices));
    check_launch("topk");
  });
}

void sample(const Tensor& logits, int64_t vocab, const SamplingParams& params, uint64_t seed, uint64_t offset,
            int64_t* offset_counter, const Tensor& out) {
  KILN_CHECK(vocab < (int64_t{1} << 23), "sample: a vocabulary of ", vocab, " tokens (logits ", logits.meta(),
             ") is too large for the CUDA kernels; at most 2^23 - 1");
  const int64_t rows = out.numel();
  const Device device = logits.device();
  DeviceGuard guard(device);
  const cudaStream_t stream = stream_of(device);
  if (rows == 0) {
    // No rows, but the call still takes an offset from the counter, as it would from a Generator.
    if (offset_counter) {
      Tensor taken = scratch(8, device);
      chunk_argmax_kernel<float><<<1, kChunkThreads, 0, stream>>>(nullptr, 0, 1, 1, 1, nullptr, nullptr,
                                                                  offset_counter, ptr<uint64_t>(taken));
      check_launch("sample");
    }
    return;
  }
  const Geometry g = geometry(rows, vocab, device.index);
  const dim3 grid(static_cast<unsigned>(g.nb), g.grid_rows);
  const int V = static_cast<int>(vocab);
  const bool greedy = params.temperature == 0.0;

  Tensor partial = scratch(rows * g.nb * static_cast<int64_t>(sizeof(ArgPartial)), device);
  Tensor taken = scratch(offset_counter ? 8 : 0, device);
  int64_t* tokens = ptr<int64_t>(out);

  SampleArgs a{};
  a.rows = rows;
  a.V = V;
  a.nb = g.nb;
  const bool use_top_k = params.top_k > 0 && params.top_k < vocab;
  a.top_k = use_top_k ? static_cast<int>(params.top_k) : 0;
  a.use_top_p = params.top_p < 1.0;
  a.top_p = static_cast<float>(params.top_p);  // the CPU's constants
  a.use_min_p = params.min_p > 0.0;
  a.min_p = static_cast<float>(params.min_p);
  a.seed = seed;
  a.offset = offset;
  a.offset_taken = offset_counter ? ptr<const uint64_t>(taken) : nullptr;
  a.tokens = tokens;
  a.err = device_error_record(device.index);
  const float temperature = static_cast<float>(params.temperature);

  visit_dtypes<kHalfAndFloat>(logits.dtype(), "sample", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = ptr<const T>(logits);
    uint64_t* taken_ptr = offset_counter ? ptr<uint64_t>(taken) : nullptr;
    if (!greedy && use_top_k && params.top_k <= kMaxK) {
      // The top_k path starts from the logits' candidates: no argmax pass first.
      const int K = a.top_k;
      const int64_t cand = rows * g.nb * K;
      Tensor ckey = scratch(cand * 4, device), cidx = scratch(cand * 4, device);
      chunk_select_kernel<T><<<grid, kChunkThreads, 0, stream>>>(src, rows, V, g.chunk, g.nb, K, ptr<uint32_t>(ckey),
                                                                 ptr<int32_t>(cidx), nullptr, nullptr, offset_counter,
                                                                 taken_ptr);
      check_launch("sample");
      sample_topk_final_kernel<T><<<row_blocks(rows), kRowThreads, 0, stream>>>(
          a, src, temperature, ptr<const uint32_t>(ckey), ptr<const int32_t>(cidx));
      check_launch("sample");
      return;
    }
    const bool direct = greedy && g.nb == 1;
    chunk_argmax_kernel<T><<<grid, kChunkThreads, 0, stream>>>(src, rows, V, g.chunk, g.nb, ptr<ArgPartial>(partial),
                                                               direct ? tokens : nullptr, offset_counter, taken_ptr);
    check_launch("sample");
    if (direct) return;
    if (greedy) {
      constexpr int kWarps = 8;
      const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
      argmax_finalize_kernel<<<blocks, kWarps * 32, 0, stream>>>(ptr<const ArgPartial>(partial), g.nb, rows, tokens);
      check_launch("sample");
      return;
    }
    // Without top_k, on the chunks: always without top_p; with top_p for a few long rows (the search's
    // histograms take 12 KB per row and 5 launches; many or short rows do better one block per row below).
    if (!use_top_k && (!a.use_top_p || (rows <= kChunkedTopPMaxRows && g.nb >= 2))) {
      KeepRule rule{a.use_min_p, a.min_p, nullptr, nullptr};
      Tensor hist, thr, ties;
      if (a.use_top_p) {
        const int64_t hist_bytes = rows * static_cast<int64_t>(sizeof(TopPHist));
        hist = scratch(hist_bytes, device);
        thr = scratch(rows * static_cast<int64_t>(sizeof(TopPThreshold)), device);
        ties = scratch(rows * g.nb * 4, device);
        check(cudaMemsetAsync(hist.data_ptr(), 0, static_cast<size_t>(hist_bytes), stream), "sample (cudaMemsetAsync)");
        for (int round = 0; round < 4; ++round) {
          topp_round_kernel<T><<<grid, kChunkThreads, 0, stream>>>(src, rows, V, g.chunk, g.nb,
                                                                   ptr<const ArgPartial>(partial), temperature, a.top_p,
                                                                   round, ptr<TopPHist>(hist));
          check_launch("sample");
        }
        topp_ties_kernel<T><<<grid, kChunkThreads, 0, stream>>>(src, rows, V, g.chunk, g.nb,
                                                                ptr<const ArgPartial>(partial), temperature, a.top_p,
                                                                ptr<const TopPHist>(hist), ptr<TopPThreshold>(thr),
                                                                ptr<int>(ties));
        check_launch("sample");
        rule.thr = ptr<const TopPThreshold>(thr);
        rule.tie_count = ptr<const int>(ties);
      }
      Tensor sums = scratch(rows * g.nb * static_cast<int64_t>(sizeof(ChunkSum)), device);
      sample_chunk_sums_kernel<T><<<grid, kChunkThreads, 0, stream>>>(src, rows, V, g.chunk, g.nb,
                                                                      ptr<const ArgPartial>(partial), temperature, rule,
                                                                      ptr<ChunkSum>(sums));
      check_launch("sample");
      sample_chunk_draw_kernel<T><<<row_blocks(rows), kChunkThreads, 0, stream>>>(
          a, src, g.chunk, ptr<const ArgPartial>(partial), temperature, rule, ptr<const ChunkSum>(sums));
      check_launch("sample");
      return;
    }
    Tensor ew = scratch(rows * vocab * 4, device);
    sample_weights_kernel<T><<<grid, kChunkThreads, 0, stream>>>(src, rows, V, g.chunk, g.nb,
                                                                 ptr<const ArgPartial>(partial), temperature,
                                                                 ptr<float>(ew));
    check_launch("sample");
    sample_general_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(a, ptr<const ArgPartial>(partial),
                                                                        ptr<const float>(ew));
    check_launch("sample");
  });
}

}  // namespace kiln::cuda
