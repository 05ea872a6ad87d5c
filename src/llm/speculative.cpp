// Speculative decoding: drafts from prompt lookup or a draft model, one verify step of the model over them, and
// the acceptance rule that keeps the model's output (greedy) or its distribution (sampling).
#include "llm/speculative.h"

#include <algorithm>
#include <optional>

#include "core/philox.h"
#include "kiln/error.h"

namespace kiln::llm {

std::vector<int64_t> lookup_drafts(const std::vector<int64_t>& context, int64_t max_ngram, int64_t k) {
  const int64_t L = static_cast<int64_t>(context.size());
  for (int64_t n = std::min(max_ngram, L - 1); n >= 1; --n) {
    const int64_t* tail = context.data() + (L - n);
    // The latest earlier occurrence with k tokens after it, else the one with the most.
    int64_t best = -1, best_len = 0;
    for (int64_t s = L - n - 1; s >= 0; --s) {
      if (!std::equal(tail, tail + n, context.data() + s)) continue;
      const int64_t len = std::min(k, L - (s + n));
      if (len > best_len) best = s, best_len = len;
      if (len == k) break;
    }
    if (best >= 0) return std::vector<int64_t>(context.begin() + (best + n), context.begin() + (best + n + best_len));
  }
  return {};
}

namespace {

double uniform(uint64_t seed, uint64_t offset, uint64_t i) { return philox_uniform_double(philox_element(seed, offset, i)); }

// The index drawn from the weights w[0, V) (not necessarily normalised, >= 0) with the uniform u in [0, 1):
// the first i whose running sum exceeds u x the total; the last positive one where rounding leaves none.
int64_t draw(const float* w, int64_t V, double u) {
  double total = 0;
  for (int64_t i = 0; i < V; ++i) total += w[i];
  const double t = u * total;
  double c = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < V; ++i) {
    if (w[i] <= 0) continue;
    c += w[i];
    last = i;
    if (c > t) return i;
  }
  return last;
}

// Rows of the distributions sample() draws from, on the CPU (f32 [rows, V], contiguous).
Tensor probs_of(const Tensor& logits, const SamplingParams& params) {
  return sampling_probs(logits.to(kCPU), params).contiguous();
}

// A draft model kept in step with the context: `valid` tokens of the context are in its cache.
class ModelDrafter {
 public:
  explicit ModelDrafter(Model& m) : m_(m) {}

  // Up to k drafts after `context`; for sampling, q receives the distribution each was drawn from [k, V].
  std::vector<int64_t> propose(const std::vector<int64_t>& context, int64_t k, const SamplingParams& params,
                               Generator& gen, Tensor* q) {
    const int64_t L = static_cast<int64_t>(context.size());
    k = std::min(k, m_.max_context() - L);  // the draft's cache holds the context and k - 1 drafts
    if (k < 1) return {};
    m_.rewind(std::min(valid_, m_.position()));
    const std::vector<int64_t> feed(context.begin() + m_.position(), context.end());
    Tensor logits;
    if (feed.size() <= 2) {
      for (int64_t t : feed) logits = m_.step(t);  // one or two tokens: the decode step (a graph on CUDA)
    } else {
      logits = m_.prefill(feed);
    }
    const bool greedy = params.temperature == 0.0;
    const uint64_t seed = gen.seed(), offset = greedy ? 0 : gen.next_offset();
    std::vector<int64_t> drafts;
    std::vector<Tensor> rows;
    for (int64_t i = 0; i < k; ++i) {
      int64_t x;
      if (greedy) {
        x = argmax(logits).item<int64_t>();
      } else {
        const Tensor p = probs_of(logits, params);
        x = draw(p.data<float>(), p.numel(), uniform(seed, offset, static_cast<uint64_t>(i)));
        rows.push_back(p);
      }
      drafts.push_back(x);
      if (i + 1 < k) logits = m_.step(x);
    }
    if (q && !greedy) *q = stack(rows, 0);
    base_ = L;
    proposed_ = k;
    return drafts;
  }

  // After a verify that kept `a` drafts: the draft's cache holds the context and the first k - 1 drafts.
  void accepted(int64_t a) { valid_ = base_ + std::min(a, proposed_ - 1); }

 private:
  Model& m_;
  int64_t valid_ = 0, base_ = 0, proposed_ = 0;
};

}  // namespace

void check_speculative(const Model& model, const SpeculativeOptions& spec) {
  KILN_CHECK(spec.num_draft >= 1 && spec.num_draft <= 15, "speculative decoding: num_draft must be in [1, 15], got ",
             spec.num_draft);
  KILN_CHECK(spec.lookup >= 0, "speculative decoding: lookup must be >= 0, got ", spec.lookup);
  KILN_CHECK(!(spec.lookup > 0 && spec.draft), "speculative decoding: give prompt lookup or a draft model, not both");
  if (spec.draft) {
    KILN_CHECK(spec.draft != &model, "speculative decoding: the draft model must be another model than the one it drafts for");
    KILN_CHECK(spec.draft->config().vocab_size == model.config().vocab_size, "speculative decoding: the draft model's ",
               "vocabulary (", spec.draft->config().vocab_size, " tokens) differs from the model's (",
               model.config().vocab_size, "): it must share the tokenizer");
  }
}

int64_t decode_speculative(Model& model, std::vector<int64_t> context, int64_t token, int64_t n,
                           const SamplingParams& params, Generator& gen, const SpeculativeOptions& spec,
                           const std::function<bool(int64_t)>& emit, GenerateStats& stats) {
  check_speculative(model, spec);
  std::optional<ModelDrafter> drafter;
  if (spec.draft) {
    spec.draft->reset();
    drafter.emplace(*spec.draft);
  }
  const bool greedy = params.temperature == 0.0;
  const int64_t V = model.config().vocab_size;
  int64_t done = 0;
  while (done < n) {
    // The verify step makes at most k + 1 tokens and writes k + 1 cache positions.
    const int64_t k = std::min({spec.num_draft, n - done - 1, model.max_context() - model.position() - 1});
    Tensor q;  // the drafts' distributions (a draft model's, when sampling)
    std::vector<int64_t> drafts;
    if (k > 0) drafts = drafter ? drafter->propose(context, k, params, gen, greedy ? nullptr : &q)
                                : lookup_drafts(context, spec.lookup, k);
    std::vector<int64_t> made;  // the drafts kept and the model's own token after them
    if (drafts.empty()) {
      made.push_back(sample(model.step(token), params, &gen).item<int64_t>());
    } else {
      const int64_t j = static_cast<int64_t>(drafts.size()), start = model.position();
      std::vector<int64_t> tokens{token};
      tokens.insert(tokens.end(), drafts.begin(), drafts.end());
      const Tensor logits = model.verify(tokens);  // [j + 1, V]
      int64_t a = 0;
      if (greedy) {
        const std::vector<int64_t> best = argmax(logits, 1).to(kCPU).to_vector<int64_t>();
        while (a < j && drafts[static_cast<size_t>(a)] == best[static_cast<size_t>(a)]) ++a;
        made.assign(drafts.begin(), drafts.begin() + a);
        made.push_back(best[static_cast<size_t>(a)]);
      } else {
        Tensor p = probs_of(logits, params);
        float* P = p.data<float>();
        const float* Q = q.defined() ? q.data<float>() : nullptr;
        const uint64_t seed = gen.seed(), offset = gen.next_offset();
        int64_t next = -1;
        for (; a < j; ++a) {
          const int64_t x = drafts[static_cast<size_t>(a)];
          float* pa = P + a * V;
          const double px = pa[x], qx = Q ? Q[a * V + x] : 1.0;
          if (uniform(seed, offset, static_cast<uint64_t>(2 * a)) * qx < px) continue;  // kept: u < p(x) / q(x)
          // Rejected: a draw from max(0, p - q), renormalised (q is the point mass on x for prompt lookup).
          std::vector<float> r(pa, pa + V);
          if (Q) {
            for (int64_t i = 0; i < V; ++i) r[static_cast<size_t>(i)] = std::max(0.0f, pa[i] - Q[a * V + i]);
          } else {
            r[static_cast<size_t>(x)] = 0.0f;
          }
          next = draw(r.data(), V, uniform(seed, offset, static_cast<uint64_t>(2 * a + 1)));
          if (next < 0) next = draw(pa, V, uniform(seed, offset, static_cast<uint64_t>(2 * a + 1)));
          break;
        }
        if (next < 0) next = draw(P + j * V, V, uniform(seed, offset, static_cast<uint64_t>(2 * j + 1)));  // all kept
        made.assign(drafts.begin(), drafts.begin() + a);
        made.push_back(next);
      }
      model.rewind(start + 1 + a);  // the last token and the kept drafts stay in the cache
      if (drafter) drafter->accepted(a);
      ++stats.verify_steps;
      stats.drafted += j;
      stats.accepted += a;
    }
    for (int64_t t : made) {
      ++done;
      context.push_back(t);
      token = t;
      if (!emit(t)) return done;
    }
  }
  return done;
}

}  // namespace kiln::llm
