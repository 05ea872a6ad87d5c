#include "kiln/llm/generate.h"

#include <algorithm>
#include <chrono>

#include "llm/speculative.h"

namespace kiln::llm {

std::vector<int64_t> generate(Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& o,
                              GenerateStats* stats) {
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  KILN_CHECK(o.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ", o.max_new_tokens);
  KILN_CHECK(static_cast<int64_t>(prompt.size()) + o.max_new_tokens <= model.max_context(), "generate: the prompt (",
             prompt.size(), " tokens) plus ", o.max_new_tokens, " new tokens exceed the context of ", model.max_context(),
             " (raise --ctx)");
  if (o.speculative.enabled()) check_speculative(model, o.speculative);
  model.reset();
  Generator gen(o.seed);
  std::vector<int64_t> out;
  GenerateStats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  auto is_stop = [&](int64_t t) { return std::find(o.stop_ids.begin(), o.stop_ids.end(), t) != o.stop_ids.end(); };
  const auto t0 = clock::now();
  if (o.max_new_tokens > 0) {
    const Tensor logits = model.prefill(prompt);
    int64_t tok = model.sample_first(logits, o.sampling, &gen);  // reads the token back: the prefill is done
    const auto t1 = clock::now();
    st.prefill_seconds = seconds(t0, t1);
    out.push_back(tok);
    const bool go_on = o.on_token ? o.on_token(tok) : true;
    auto emit = [&](int64_t t) {
      out.push_back(t);
      const bool more = o.on_token ? o.on_token(t) : true;
      return more && !is_stop(t);
    };
    if (go_on && !is_stop(tok)) {
      if (o.speculative.enabled()) {
        std::vector<int64_t> context(prompt);
        context.push_back(tok);
        decode_speculative(model, std::move(context), tok, o.max_new_tokens - 1, o.sampling, gen, o.speculative, emit,
                           st);
      } else {
        model.decode_n(tok, o.max_new_tokens - 1, o.sampling, &gen, emit);
      }
    }
    st.decode_seconds = seconds(t1, clock::now());
  }
  st.generated = static_cast<int64_t>(out.size());
  if (stats) *stats = st;
  return out;
}

Perplexity perplexity(Model& model, const std::vector<int64_t>& ids, int64_t window) {
  KILN_CHECK(window >= 2 && window <= model.max_context(), "perplexity: the window must be in [2, ", model.max_context(),
             "] (the model's context), got ", window);
  Perplexity p;
  for (size_t begin = 0; begin + 1 < ids.size(); begin += static_cast<size_t>(window)) {
    const size_t end = std::min(ids.size(), begin + static_cast<size_t>(window));
    const std::vector<int64_t> w(ids.begin() + static_cast<std::ptrdiff_t>(begin),
                                 ids.begin() + static_cast<std::ptrdiff_t>(end));
    if (w.size() < 2) break;
    model.reset();
    const Tensor logits = model.prefill(w, true);  // [T, V] f32
    const int64_t T = static_cast<int64_t>(w.size());
    const Tensor lp = log_softmax(logits.narrow(0, 0, T - 1).to(DType::F64), -1);
    const Tensor next = from_vector<int64_t>(std::vector<int64_t>(w.begin() + 1, w.end())).to(lp.device()).unsqueeze(1);
    p.nll_sum -= sum(gather(lp, 1, next)).item<double>();
    p.predicted += T - 1;
  }
  return p;
}

}  // namespace kiln::llm
