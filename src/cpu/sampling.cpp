// CPU reference of topk and sample (definitions: ops/sampling_math.h).
#include "cpu/sampling.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/dispatch.h"
#include "ops/sampling_math.h"

namespace kiln::cpu {

namespace {
constexpr DTypeSet kTopkTypes = kFloatTypes | kFloat8Types | kIntTypes;
constexpr DTypeSet kSampleTypes = dset(DType::F16, DType::BF16, DType::F32);

// One row of topk: a sorted buffer of the best k seen so far. Scanning in index order and inserting only
// what comes strictly before the k-th keeps ties in index order; most elements are rejected by one compare.
template <class T>
void topk_row(const T* x, int64_t n, int64_t k, T* vals, int64_t* idx) {
  using K = decltype(topk_key(T{}));
  K keys[64];
  int64_t pos[64];
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const K v = topk_key(x[i]);
    if (count == k && !topk_before(v, i, keys[k - 1], pos[k - 1])) continue;
    int64_t j = count < k ? count++ : k - 1;
    while (j > 0 && topk_before(v, i, keys[j - 1], pos[j - 1])) {
      keys[j] = keys[j - 1];
      pos[j] = pos[j - 1];
      --j;
    }
    keys[j] = v;
    pos[j] = i;
  }
  for (int64_t j = 0; j < k; ++j) {
    vals[j] = x[pos[j]];  // the element itself: keeps -0.0 and NaN payloads
    idx[j] = pos[j];
  }
}

int64_t greedy_row(const float* l, int64_t v) {
  int64_t best = 0;
  for (int64_t i = 1; i < v; ++i)
    if (topk_before(l[i], i, l[best], best)) best = i;
  return best;
}

// The weights e and the kept set of a row (sampling_math.h's definition); false when the row's distribution is
// undefined (NaN, +inf or only -inf logits).
bool kept_weights(const float* l, int64_t v, const SamplingParams& p, std::vector<float>& e,
                  std::vector<int64_t>& order, std::vector<char>& keep) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < v; ++i) {
    if (std::isnan(l[i])) return false;
    m = std::max(m, l[i]);
  }
  if (!std::isfinite(m)) return false;
  const float temperature = static_cast<float>(p.temperature);
  e.resize(v);
  keep.assign(v, 1);
  for (int64_t i = 0; i < v; ++i) e[i] = sample_weight(l[i], m, temperature);

  const bool use_top_k = p.top_k > 0 && p.top_k < v;
  const bool use_top_p = p.top_p < 1.0;
  if (use_top_k || use_top_p) {
    const int64_t kk = use_top_k ? p.top_k : v;
    order.resize(v);
    std::iota(order.begin(), order.end(), int64_t{0});
    auto before = [&](int64_t a, int64_t b) { return topk_before(e[a], a, e[b], b); };
    std::partial_sort(order.begin(), order.begin() + kk, order.end(), before);
    int64_t n = kk;
    if (use_top_p) {
      uint64_t s = 0;
      for (int64_t j = 0; j < kk; ++j) s += topp_fixed(e[order[j]]);
      const uint64_t target = topp_target(s, static_cast<float>(p.top_p));
      uint64_t c = 0;
      for (n = 0; n < kk;) {
        c += topp_fixed(e[order[n++]]);
        if (c >= target) break;
      }
    }
    std::fill(keep.begin(), keep.end(), 0);
    for (int64_t j = 0; j < n; ++j) keep[order[j]] = 1;
  }
  if (p.min_p > 0.0) {
    const float threshold = static_cast<float>(p.min_p);  // min_p * e_max, e_max == 1
    for (int64_t i = 0; i < v; ++i)
      if (e[i] < threshold) keep[i] = 0;
  }
  return true;
}

// Returns the token, or -1 when the row's distribution is undefined.
int64_t sample_row(const float* l, int64_t v, const SamplingParams& p, float u, std::vector<float>& e,
                   std::vector<int64_t>& order, std::vector<char>& keep) {
  if (!kept_weights(l, v, p, e, order, keep)) return -1;
  float w = 0.0f;
  int64_t last_positive = -1;
  for (int64_t i = 0; i < v; ++i)
    if (keep[i]) {
      w += e[i];
      if (e[i] > 0.0f) last_positive = i;
    }
  const float t = u * w;
  float c = 0.0f;
  for (int64_t i = 0; i < v; ++i)
    if (keep[i]) {
      c += e[i];
      if (c > t) return i;
    }
  return last_positive;
}

// A row as f32: the row itself, or converted into `buf`.
template <class T>
const float* row_f32(const T* src, int64_t vocab, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    buf.resize(vocab);
    for (int64_t i = 0; i < vocab; ++i) buf[i] = convert<float>(src[i]);
    return buf.data();
  }
}
}  // namespace

void topk(const Tensor& x, int64_t n, int64_t k, Tensor& values, Tensor& indices) {
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  int64_t* idx = indices.data<int64_t>();
  visit_dtypes<kTopkTypes>(x.dtype(), "topk", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = x.data<const T>();
    T* vals = values.data<T>();
#pragma omp parallel for schedule(static) if (rows * n >= 32768 && rows > 1)
    for (int64_t r = 0; r < rows; ++r) topk_row(src + r * n, n, k, vals + r * k, idx + r * k);
  });
}

namespace {
// Calls row(r, l, e, order, keep) for each of the `rows` rows of logits [rows, vocab] as f32 (half types converted
// one row at a time, so a big batch costs no f32 copy of the whole tensor), rows in parallel, each thread with its
// own buffers; a row for which it returns false has an undefined distribution: the first such is reported.
template <class F>
void for_each_row(const Tensor& logits, int64_t vocab, int64_t rows, const char* op, const SamplingParams& params,
                  F row) {
  std::atomic<int64_t> bad_row{-1};
  visit_dtypes<kSampleTypes>(logits.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = logits.data<const T>();
#pragma omp parallel if (rows > 1 && rows * vocab >= 32768)
    {
      std::vector<float> buf, e;
      std::vector<int64_t> order;
      std::vector<char> keep;
#pragma omp for schedule(dynamic, 1)
      for (int64_t r = 0; r < rows; ++r) {
        if (row(r, row_f32(src + r * vocab, vocab, buf), e, order, keep)) continue;
        int64_t expected = -1;
        bad_row.compare_exchange_strong(expected, r);
      }
    }
  });
  const int64_t r = bad_row.load();
  KILN_CHECK(r < 0, op, ": row ", r, " of logits ", logits.meta(),
             " has NaN, +inf or only -inf logits, so its distribution is undefined (temperature ",
             params.temperature, ")");
}
}  // namespace

void sample(const Tensor& logits, int64_t vocab, const SamplingParams& params, uint64_t seed, uint64_t offset,
            Tensor& out) {
  int64_t* tokens = out.data<int64_t>();
  for_each_row(logits, vocab, out.numel(), "sample", params,
               [&](int64_t r, const float* l, std::vector<float>& e, std::vector<int64_t>& order, std::vector<char>& keep) {
                 if (params.temperature == 0.0) {
                   tokens[r] = greedy_row(l, vocab);
                   return true;
                 }
                 const float u = sample_uniform(seed, offset, static_cast<uint64_t>(r));
                 const int64_t tok = sample_row(l, vocab, params, u, e, order, keep);
                 tokens[r] = tok < 0 ? 0 : tok;
                 return tok >= 0;
               });
}

void sampling_probs(const Tensor& logits, int64_t vocab, const SamplingParams& params, Tensor& out) {
  float* probs = out.data<float>();
  for_each_row(logits, vocab, vocab == 0 ? 0 : logits.numel() / vocab, "sampling_probs", params,
               [&](int64_t r, const float* l, std::vector<float>& e, std::vector<int64_t>& order, std::vector<char>& keep) {
                 float* p = probs + r * vocab;
                 std::fill(p, p + vocab, 0.0f);
                 if (params.temperature == 0.0) {
                   p[greedy_row(l, vocab)] = 1.0f;
                   return true;
                 }
                 if (!kept_weights(l, vocab, params, e, order, keep)) return false;
                 double w = 0.0;
                 for (int64_t i = 0; i < vocab; ++i)
                   if (keep[i]) w += e[i];
                 for (int64_t i = 0; i < vocab; ++i)
                   if (keep[i]) p[i] = static_cast<float>(e[i] / w);
                 return true;
               });
}

}  // namespace kiln::cpu
