// The transformer forward pass (Qwen3 / Qwen3-MoE / Llama as transformers computes them), the KV cache and
// the CUDA-graph decode step.
#include "kiln/llm/model.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <tuple>

#include "kiln/error.h"
#include "llm/kv_cache.h"

namespace kiln::llm {

struct Model::State {
  std::vector<Tensor> k_cache, v_cache;  // per layer [1, Hkv, max_context, D]
  Tensor inv_freq;                        // f32 [rotary_dim / 2] on the device
  float attention_scaling = 1.0f;
  // Decode-step inputs the step advances itself (device): the token, its position, the cache length after it.
  Tensor tok, pos, len;
  Tensor rng_offset;  // i64 [1]: the Philox offset of the step's draw (advanced by the draw itself)
  Tensor logits;      // [V] f32: the step's logits
  // The captured step (layers, logits, the draw into `tok`) and the sampling it was captured with.
  Graph graph;
  bool graph_ready = false;
  SamplingParams graph_params;
  uint64_t graph_seed = 0;
  std::vector<AsyncReadback> readback;  // two pinned slots for the sampled ids of consecutive steps
  Stream stream;
  uint64_t id = 0;  // unique in the process: the paged caches this model made carry it
  // The batched decode step (step(seqs, tokens)) captured per padded batch size, against one paged cache.
  struct BatchGraph {
    Graph graph;
    Tensor ids, io;  // inputs: i64 [rows]; i32 positions, slots, lengths [rows] and the block table [rows, W]
    Tensor logits;   // f32 [rows, V]
    bool failed = false;  // the capture failed: this size runs eagerly
  };
  std::map<int64_t, BatchGraph> batch_graphs;
  // The verify step (verify(tokens)) captured per number of tokens.
  struct VerifyGraph {
    Graph graph;
    Tensor ids, io;  // inputs: i64 [T]; i32 positions [T], the first position, the cache length after
    Tensor logits;   // f32 [T, V]
    bool failed = false;
  };
  std::map<int64_t, VerifyGraph> verify_graphs;
  uint64_t graph_pool = 0;  // the id of the cache they were captured against
};

namespace {

Tensor i32_scalar_buffer(int64_t v, Device d) { return full({1}, v, DType::I32, d); }

// Every tensor of the weights (undefined ones included; tied tensors twice).
template <class F>
void for_each_linear_tensor(const Linear& l, F& f) {
  f(l.weight);
  if (l.fp8) f(l.fp8->values), f(l.fp8->scales);
  if (l.q8) f(l.q8->values), f(l.q8->scales);
  if (l.q4) f(l.q4->values), f(l.q4->scales);
  if (l.q4k) f(l.q4k->blocks);
  if (l.q5k) f(l.q5k->blocks);
  if (l.q6k) f(l.q6k->blocks);
  if (l.bias) f(*l.bias);
  for (const Linear& p : l.parts) for_each_linear_tensor(p, f);
}

template <class F>
void for_each_weight(const ModelWeights& w, F&& f) {
  auto linear = [&](const Linear& l) { for_each_linear_tensor(l, f); };
  f(w.embed), f(w.final_norm), linear(w.lm_head);
  for (const LayerWeights& L : w.layers) {
    f(L.input_norm), f(L.post_norm), linear(L.attn.qkv), linear(L.attn.o), f(L.attn.q_norm), f(L.attn.k_norm);
    if (L.mlp) linear(L.mlp->gate_up), linear(L.mlp->down);
    if (L.moe) {
      f(L.moe->router), f(L.moe->gate_up), f(L.moe->down);
      if (L.moe->blocks)
        for (const BlockWeight* b : {&L.moe->blocks->gate_up, &L.moe->blocks->down}) linear(Linear::of(*b));
      if (L.moe->gate_up_scales) f(*L.moe->gate_up_scales);
      if (L.moe->down_scales) f(*L.moe->down_scales);
    }
  }
}

}  // namespace

Model::Model(ModelConfig config, ModelWeights weights, const ModelOptions& options)
    : config_(std::move(config)), weights_(std::move(weights)), options_(options), s_(std::make_unique<State>()) {
  static std::atomic<uint64_t> next_model{0};
  s_->id = ++next_model;
  dtype_ = options.dtype.value_or(options.device.is_cuda() ? DType::BF16 : DType::F32);
  KILN_CHECK(options.max_context >= 1 && options.max_context <= (int64_t{1} << 22), "model: max_context must be in ",
             "[1, 4194304], got ", options.max_context);
  const ModelConfig& c = config_;
  const Device dev = options.device;
  const RopeFrequencies rf = rope_frequencies(c);
  s_->inv_freq = from_vector<float>(rf.inv_freq).to(dev);
  s_->attention_scaling = rf.attention_scaling;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    s_->k_cache.push_back(empty({1, c.num_kv_heads, options.max_context, c.head_dim}, dtype_, dev));
    s_->v_cache.push_back(empty({1, c.num_kv_heads, options.max_context, c.head_dim}, dtype_, dev));
  }
  // FP8 experts stay FP8 on CUDA (moe_forward's FP8 path: decode reads one byte per weight; prefill
  // dequantises per call). On the CPU they are dequantised once here: the CPU path would do it every call.
  if (!dev.is_cuda()) {
    for (LayerWeights& L : weights_.layers) {
      if (!L.moe || !L.moe->gate_up_scales) continue;
      const Fp8Experts e{L.moe->gate_up, *L.moe->gate_up_scales, L.moe->down, *L.moe->down_scales, c.fp8->block_n,
                         c.fp8->block_k};
      std::tie(L.moe->gate_up, L.moe->down) = dequantize_fp8_experts(e, dtype_);
      L.moe->gate_up_scales.reset();
      L.moe->down_scales.reset();
    }
  }
  if (!options.quant.empty()) quantize_linears(options.quant);
  // The model's work runs on a stream of its own: graph capture needs a created stream, and one stream for
  // prefill, decode and sampling keeps them ordered among themselves (events order it with other streams).
  if (dev.is_cuda()) {
    s_->stream = Stream::create(dev);
    // The weights were uploaded on this thread's current stream: the model's stream waits for them once here,
    // so calls from another thread (whose current stream is another) see them too.
    Event loaded;
    loaded.record(current_stream(dev));
    loaded.wait(s_->stream);
  }
  // Constant from here on (mark_constant, once every kernel that wrote them has finished): the one-row products
  // may stream them while the kernel before them ends.
  for_each_weight(weights_, [](const Tensor& t) {
    if (t.defined()) mark_constant(t);
  });
  reset();
}

void Model::quantize_linears(const std::string& format) {
  KILN_CHECK(format == "q8_0" || format == "q4_0" || format == "q4_k", "model: quantisation '", format,
             "' is not available (q8_0, q4_0, q4_k)");
  // q4_0 and q4_k keep the output layer in Q8_0 (as llama.cpp's 4-bit files keep theirs at 6 bits or more):
  // the logits are the most sensitive product. A q4_k layer whose K is not a multiple of 256 takes Q8_0 (as
  // llama.cpp falls back to a format of 32-value blocks there).
  auto q = [](Linear& l, const std::string& f) {
    if (!l.weight.defined() || l.in_features() % 32 != 0) return;
    if (f == "q4_k" && l.in_features() % 256 == 0) l.q4k = quantize_q4_k(l.weight);
    else if (f == "q4_0") l.q4 = quantize_q4_0(l.weight);
    else l.q8 = quantize_q8_0(l.weight);
    l.weight = Tensor();  // a tied lm_head leaves the embedding as it is
  };
  q(weights_.lm_head, "q8_0");
  for (LayerWeights& L : weights_.layers) {
    q(L.attn.qkv, format), q(L.attn.o, format);
    if (L.mlp) q(L.mlp->gate_up, format), q(L.mlp->down, format);
    // MoE experts: stacked in the format (moe_forward's BlockExperts).
    MoeWeights* m = L.moe ? &*L.moe : nullptr;
    if (!m || !m->gate_up.defined() || m->gate_up_scales ||
        m->gate_up.size(2) % 32 != 0 || m->down.size(2) % 32 != 0)
      continue;
    const int64_t E = m->gate_up.size(0);
    Linear gu, dn;
    gu.weight = m->gate_up.reshape({E * m->gate_up.size(1), m->gate_up.size(2)});
    dn.weight = m->down.reshape({E * m->down.size(1), m->down.size(2)});
    q(gu, format), q(dn, format);
    m->blocks = BlockExperts{gu.block(), dn.block(), E};
    m->gate_up = Tensor();
    m->down = Tensor();
  }
}

Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

void Model::reset() {
  position_ = 0;  // a captured step stays valid: every decode call writes its device inputs
}

namespace {

struct StepInputs {
  Tensor ids;        // [T] i64
  Tensor positions;  // [T] i32: rope positions
  Tensor at;         // [1] i32: where the new k/v go in the cache
  Tensor lengths;    // [1] i32: cache length after this step
  int64_t start = -1;  // host copy of the start position when known (prefill), else -1 (graph step)
};

}  // namespace

// The attention of T new tokens of one sequence in layer L: q/k norms, RoPE and the append to its cache
// (kc, vc [1, Hkv, max_context, D]) in one op, then attention over the cache; returns [T, q_size].
static Tensor attend(const ModelConfig& c, const LayerWeights& L, const Model::State& s, Tensor q, const Tensor& k,
                     const Tensor& v, Tensor& kc, Tensor& vc, const StepInputs& in) {
  const int64_t T = q.size(0), Hq = c.num_heads, D = c.head_dim;
  // q/k norms, RoPE and the cache append in one op (one launch on CUDA): q is rotated in place, the rotated
  // keys and the values land in the cache only.
  qk_norm_rope_append_(q, k, v, c.qk_norm ? L.attn.q_norm : Tensor(), c.qk_norm ? L.attn.k_norm : Tensor(),
                       c.rms_norm_eps, in.positions, s.inv_freq, s.attention_scaling, kc, vc, in.at);
  const Tensor q4 = q.view({1, T, Hq, D}).transpose(1, 2);  // [1, Hq, T, D]
  Tensor attn;
  if (in.start == 0 && T > 8) {
    // A prompt from position 0: causal attention over the new keys only (flash path on CUDA), read back
    // from the cache slots they were just written to.
    attn = scaled_dot_product_attention(q4, kc.narrow(2, 0, T), vc.narrow(2, 0, T), std::nullopt, true,
                                        std::nullopt, true);
  } else {
    // Decode (and prompts continuing a cache): new queries against the cache, bottom-right causal.
    attn = decode_attention(q4, kc, vc, in.lengths);
  }
  return attn.transpose(1, 2).reshape({T, c.q_size()});
}

// The attention of one layer: (layer index, its weights, q [T, Hq, D] (rotated in place), k, v) -> [T, q_size].
using AttendFn = std::function<Tensor(int64_t, const LayerWeights&, Tensor&, const Tensor&, const Tensor&)>;

// Attention against one sequence's caches (per layer), with the step's positions.
static AttendFn cache_attention(const ModelConfig& c, const Model::State& s, const StepInputs& in,
                                std::vector<Tensor>& kcs, std::vector<Tensor>& vcs) {
  return [&c, &s, &in, &kcs, &vcs](int64_t i, const LayerWeights& L, Tensor& q, const Tensor& k, const Tensor& v) {
    return attend(c, L, s, q, k, v, kcs[static_cast<size_t>(i)], vcs[static_cast<size_t>(i)], in);
  };
}

namespace {
// The inputs of new tokens of sequences in a paged cache (device, i32): each token's position (RoPE) and
// slot, each sequence's cache length after them and its row of the block table.
struct PagedInputs {
  Tensor positions, slots;  // [T]
  Tensor lengths;           // [B]
  Tensor table;             // [B, W]
  int64_t b = 1;            // sequences; each has T / b new tokens
  int64_t start = -1;       // prefill: the start position of the one sequence; else -1
};
}  // namespace

// The attention of T new tokens of sequences in a paged cache, layer L: q/k norms and RoPE, the append at the
// tokens' slots, then attention over each sequence's blocks (a prompt from position 0: causal attention over
// its own keys); returns [T, q_size]. The same roundings as attend's one-op prologue (qk_norm_rope_append_ is
// defined as this composition).
static Tensor attend_paged(const ModelConfig& c, const LayerWeights& L, const Model::State& s, Tensor q, const Tensor& k,
                           const Tensor& v, Tensor& kp, Tensor& vp, const PagedInputs& in) {
  const int64_t T = q.size(0), Hq = c.num_heads, Hk = c.num_kv_heads, D = c.head_dim, lq = T / in.b;
  Tensor kr = k;
  if (c.qk_norm) {
    q = rms_norm(q, L.attn.q_norm, c.rms_norm_eps);
    kr = rms_norm(k, L.attn.k_norm, c.rms_norm_eps);
  } else {
    q = q.contiguous();  // rotated in place: not the qkv buffer the caller still reads v from
    kr = k.contiguous();
  }
  rope_(q, kr, in.positions, s.inv_freq, s.attention_scaling);
  paged_kv_append_(kp, vp, kr, v, in.slots);
  Tensor attn;
  if (in.start == 0 && T > 8) {
    attn = scaled_dot_product_attention(q.view({1, T, Hq, D}).transpose(1, 2), kr.view({1, T, Hk, D}).transpose(1, 2),
                                        v.view({1, T, Hk, D}).transpose(1, 2), std::nullopt, true, std::nullopt, true);
  } else {
    attn = paged_decode_attention(q.view({in.b, lq, Hq, D}).transpose(1, 2), kp, vp, in.table, in.lengths);
  }
  return attn.transpose(1, 2).reshape({T, c.q_size()});
}

// Attention against a paged cache's pools (per layer), with the inputs `in`.
static AttendFn paged_attention(const ModelConfig& c, const Model::State& s, KVPool& pool, const PagedInputs& in) {
  return [&c, &s, &pool, &in](int64_t i, const LayerWeights& L, Tensor& q, const Tensor& k, const Tensor& v) {
    return attend_paged(c, L, s, q, k, v, pool.k[static_cast<size_t>(i)], pool.v[static_cast<size_t>(i)], in);
  };
}

// One pass over all layers for the new tokens `ids`; returns the hidden state after the final norm [T, H].
static Tensor run_layers(const ModelConfig& c, const ModelWeights& w, const Tensor& ids, DType dtype, Trace* trace,
                         const AttendFn& attend_layer) {
  const int64_t T = ids.numel(), Hq = c.num_heads, Hk = c.num_kv_heads, D = c.head_dim;
  const int64_t qs = c.q_size(), kvs = c.kv_size();
  Tensor residual = index_select(w.embed, 0, ids);
  if (residual.dtype() != dtype) residual = residual.to(dtype);
  Tensor h = rms_norm(residual, w.layers[0].input_norm, c.rms_norm_eps);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const LayerWeights& L = w.layers[static_cast<size_t>(i)];
    // ---- attention
    const Tensor qkv = L.attn.qkv(h);  // [T, q + 2 kv]
    Tensor q = qkv.narrow(1, 0, qs).view({T, Hq, D});
    const Tensor k = qkv.narrow(1, qs, kvs).view({T, Hk, D});
    const Tensor v = qkv.narrow(1, qs + kvs, kvs).view({T, Hk, D});
    const Tensor o = L.attn.o(attend_layer(i, L, q, k, v));
    h = add_rms_norm(o, residual, L.post_norm, c.rms_norm_eps);
    // ---- MLP
    Tensor m;
    if (L.moe && L.moe->gate_up_scales) {
      const Fp8Experts e{L.moe->gate_up, *L.moe->gate_up_scales, L.moe->down, *L.moe->down_scales, c.fp8->block_n,
                         c.fp8->block_k};
      m = moe_forward(h, L.moe->router, e, c.num_experts_per_tok, c.norm_topk_prob);
    } else if (L.moe && L.moe->blocks) {
      m = moe_forward(h, L.moe->router, *L.moe->blocks, c.num_experts_per_tok, c.norm_topk_prob);
    } else if (L.moe) {
      m = moe_forward(h, L.moe->router, L.moe->gate_up, L.moe->down, c.num_experts_per_tok, c.norm_topk_prob);
    } else if (L.mlp->gate_up.weight.defined() && !L.mlp->gate_up.bias) {
      m = L.mlp->down(linear_silu_and_mul(h, L.mlp->gate_up.weight));  // one kernel for a decode row on CUDA
    } else {
      m = L.mlp->down(silu_and_mul(L.mlp->gate_up(h)));
    }
    const Tensor& next_norm = i + 1 < c.num_layers ? w.layers[static_cast<size_t>(i + 1)].input_norm : w.final_norm;
    h = add_rms_norm(m, residual, next_norm, c.rms_norm_eps);
    if (trace) trace->hidden.push_back(residual.to(kCPU, DType::F32).clone());
  }
  return h;
}

Tensor Model::forward(const Tensor& ids, int64_t start, bool all_logits, Trace* trace) {
  const Device dev = options_.device;
  const int64_t T = ids.numel();
  StepInputs in;
  in.ids = ids;
  in.start = start;
  in.positions = arange(start, start + T, 1, DType::I32, dev);
  in.at = i32_scalar_buffer(start, dev);
  in.lengths = i32_scalar_buffer(start + T, dev);
  const Tensor h = run_layers(config_, weights_, ids, dtype_, trace, cache_attention(config_, *s_, in, s_->k_cache, s_->v_cache));
  const Tensor rows = all_logits ? h : h.narrow(0, T - 1, 1);
  Tensor logits = weights_.lm_head(rows).to(DType::F32);
  if (trace) trace->logits = logits.to(kCPU).clone();
  return all_logits ? logits : logits.view({config_.vocab_size});
}

namespace {
// Makes the model's stream current on CUDA (nothing on the CPU). It first waits on the device for the work
// already enqueued on the caller's stream: the weights' uploads (load_model copies on the caller's stream,
// and the model's stream is non-blocking, so nothing else orders them) and any input the caller wrote. When
// it ends, the caller's stream waits for the model's work, so tensors the model returns (logits) are ready
// for the caller's own ops and copies.
struct OnModelStream {
  OnModelStream(const Device& d, const Stream& s) {
    if (!d.is_cuda()) return;
    model = s;
    caller = current_stream(d);
    if (!(caller == model)) {
      Event ready;
      ready.record(caller);
      ready.wait(model);
    }
    guard.emplace(s);
  }
  ~OnModelStream() {
    if (!guard) return;
    guard.reset();
    try {
      Event done;
      done.record(model);
      done.wait(caller);
    } catch (...) {  // a failing device reports again at the caller's next call
    }
  }
  OnModelStream(const OnModelStream&) = delete;
  OnModelStream& operator=(const OnModelStream&) = delete;
  Stream model, caller;
  std::optional<StreamGuard> guard;
};

// Runs `body` once eagerly (the first call of an op may allocate workspaces or choose algorithms; it writes
// what a replay writes again) and captures it into `graph` on `stream`. False, with `graph` empty, when the
// capture failed (an op that synchronises): the caller runs the work eagerly instead.
template <class F>
bool warm_up_and_capture(Graph& graph, const Stream& stream, Device dev, F&& body) {
  synchronize(dev);
  body();
  synchronize(dev);
  try {
    graph.capture(stream, body);
    return true;
  } catch (const Error&) {
    graph = Graph();
    return false;
  }
}
}  // namespace

Tensor Model::prefill(const std::vector<int64_t>& ids, bool all_logits, Trace* trace) {
  OnModelStream on(options_.device, s_->stream);
  KILN_CHECK(!ids.empty(), "prefill: the prompt is empty");
  KILN_CHECK(position_ + static_cast<int64_t>(ids.size()) <= options_.max_context, "prefill: ", ids.size(),
             " tokens after ", position_, " in the cache exceed the context of ", options_.max_context,
             " (raise --ctx)");
  for (int64_t id : ids)
    KILN_CHECK(id >= 0 && id < config_.vocab_size, "prefill: token id ", id, " is outside the vocabulary [0, ",
               config_.vocab_size, ")");
  const Tensor t = from_vector<int64_t>(ids).to(options_.device);
  Tensor logits = forward(t, position_, all_logits, trace);
  position_ += static_cast<int64_t>(ids.size());
  return logits;
}

int64_t Model::sample_first(const Tensor& logits, const SamplingParams& params, Generator* gen) {
  OnModelStream on(options_.device, s_->stream);
  return sample(logits.to(options_.device), params, gen).item().to_int64();
}

void Model::build_decode_buffers() {
  const Device dev = options_.device;
  if (!s_->tok.defined()) {
    s_->tok = zeros({1}, DType::I64, dev);
    s_->pos = zeros({1}, DType::I32, dev);
    s_->len = zeros({1}, DType::I32, dev);
    s_->rng_offset = zeros({1}, DType::I64, dev);
  }
}

Tensor Model::forward_decode_step() {
  StepInputs in;
  in.ids = s_->tok;
  in.positions = s_->pos;
  in.at = s_->pos;
  in.lengths = s_->len;
  in.start = -1;
  const Tensor h = run_layers(config_, weights_, s_->tok, dtype_, nullptr, cache_attention(config_, *s_, in, s_->k_cache, s_->v_cache));
  Tensor logits = weights_.lm_head(h).to(DType::F32).view({config_.vocab_size});
  // The step advances its own position, so a replay is the next token.
  add_(s_->pos, 1);
  add_(s_->len, 1);
  return logits;
}

bool Model::graphs_enabled() const { return options_.device.is_cuda() && options_.use_graph; }

// Writes the step's device inputs: the token to feed at position(), and the draw's offset.
void Model::write_step_inputs(int64_t token, uint64_t rng_offset) {
  build_decode_buffers();
  s_->tok.fill_(token);
  s_->pos.fill_(position_);
  s_->len.fill_(position_ + 1);
  s_->rng_offset.fill_(static_cast<int64_t>(rng_offset));
}

// The captured step: layers, logits and the draw, which writes the next token into `tok` (the next
// replay's input). Captured again only when the sampling parameters or the seed change. The inputs must be
// written before (the warm-up runs the step eagerly, writing the cache at pos); returns true when it
// captured, as the warm-up has then moved them.
bool Model::ensure_graph(const SamplingParams& params, uint64_t seed) {
  const SamplingParams& g = s_->graph_params;
  if (s_->graph_ready && g.temperature == params.temperature && g.top_k == params.top_k && g.top_p == params.top_p &&
      g.min_p == params.min_p && s_->graph_seed == seed)
    return false;
  const Device dev = options_.device;
  s_->graph_ready = false;
  s_->graph = Graph();
  auto body = [&] {
    s_->logits = forward_decode_step();
    s_->tok.copy_(sample(s_->logits, params, seed, s_->rng_offset).view({1}));
  };
  // Warm-up outside the capture (the first call of each op may allocate workspaces or pick algorithms); it
  // moves the device inputs, so they are rewritten before the first replay.
  synchronize(dev);
  body();
  synchronize(dev);
  s_->graph.capture(s_->stream, body);
  s_->graph_ready = true;
  s_->graph_params = params;
  s_->graph_seed = seed;
  return true;
}

Tensor Model::step(int64_t token) {
  OnModelStream on(options_.device, s_->stream);
  check_decode(token, 1);
  Tensor logits;
  if (graphs_enabled()) {
    // The captured step also draws a token (with whatever sampling it was captured with); only the logits
    // are returned, and the next step's inputs are written again.
    write_step_inputs(token, 0);
    if (!s_->graph_ready && ensure_graph(SamplingParams{0.0, 0, 1.0, 0.0}, 0)) write_step_inputs(token, 0);
    s_->graph.replay(s_->stream);
    logits = s_->logits;
  } else {
    const Tensor ids = full({1}, token, DType::I64, options_.device);
    logits = forward(ids, position_, false, nullptr);
  }
  ++position_;
  return logits;
}

namespace {
// The largest verify step captured as a graph (each size keeps its own buffers, logits included).
constexpr int64_t kMaxVerifyRows = 16;
}  // namespace

Tensor Model::verify(const std::vector<int64_t>& tokens) {
  OnModelStream on(options_.device, s_->stream);
  const int64_t T = static_cast<int64_t>(tokens.size());
  KILN_CHECK(T >= 1, "verify: no tokens");
  KILN_CHECK(position_ + T <= options_.max_context, "verify: ", T, " tokens after ", position_,
             " in the cache exceed the context of ", options_.max_context, " tokens (raise --ctx)");
  for (int64_t t : tokens)
    KILN_CHECK(t >= 0 && t < config_.vocab_size, "verify: token id ", t, " is outside the vocabulary [0, ",
               config_.vocab_size, ")");
  const Device dev = options_.device;
  if (graphs_enabled() && T <= kMaxVerifyRows) {
    State::VerifyGraph& g = s_->verify_graphs[T];
    if (!g.failed) {
      if (!g.ids.defined()) {
        g.ids = zeros({T}, DType::I64, dev);
        g.io = zeros({T + 2}, DType::I32, dev);
      }
      std::vector<int32_t> io(static_cast<size_t>(T + 2));
      for (int64_t t = 0; t < T; ++t) io[static_cast<size_t>(t)] = static_cast<int32_t>(position_ + t);
      io[static_cast<size_t>(T)] = static_cast<int32_t>(position_);
      io[static_cast<size_t>(T + 1)] = static_cast<int32_t>(position_ + T);
      g.ids.copy_(from_vector<int64_t>(tokens));
      g.io.copy_(from_vector<int32_t>(io));
      if (!g.graph.captured()) {
        StepInputs in;
        in.ids = g.ids;
        in.positions = g.io.narrow(0, 0, T);
        in.at = g.io.narrow(0, T, 1);
        in.lengths = g.io.narrow(0, T + 1, 1);
        auto body = [&] {
          const Tensor h = run_layers(config_, weights_, g.ids, dtype_, nullptr,
                                      cache_attention(config_, *s_, in, s_->k_cache, s_->v_cache));
          g.logits = weights_.lm_head(h).to(DType::F32);
        };
        g.failed = !warm_up_and_capture(g.graph, s_->stream, dev, body);
      }
      if (g.graph.captured()) {
        g.graph.replay(s_->stream);
        position_ += T;
        return g.logits;
      }
    }
  }
  Tensor logits = forward(from_vector<int64_t>(tokens).to(dev), position_, true, nullptr);
  position_ += T;
  return logits;
}

void Model::rewind(int64_t position) {
  KILN_CHECK(position >= 0 && position <= position_, "rewind: position ", position, " is not in [0, ", position_,
             "] (the tokens in the cache)");
  position_ = position;
}

void Model::check_decode(int64_t token, int64_t n) const {
  KILN_CHECK(token >= 0 && token < config_.vocab_size, "decode: token id ", token, " is outside the vocabulary");
  KILN_CHECK(n >= 0 && position_ + n <= options_.max_context, "decode: ", n, " tokens after ", position_,
             " in the cache exceed the context of ", options_.max_context, " tokens (raise --ctx)");
}

int64_t Model::decode(int64_t token, const SamplingParams& params, Generator* gen) {
  int64_t out = -1;
  decode_n(token, 1, params, gen, [&](int64_t t) {
    out = t;
    return true;
  });
  return out;
}

int64_t Model::decode_n(int64_t token, int64_t n, const SamplingParams& params, Generator* gen,
                        const std::function<bool(int64_t)>& on_token) {
  OnModelStream on(options_.device, s_->stream);
  check_decode(token, n);
  if (n == 0) return 0;
  Generator local;
  Generator& g = gen ? *gen : local;
  if (!graphs_enabled()) {
    int64_t t = token, done = 0;
    while (done < n) {
      t = sample(step(t), params, &g).item().to_int64();
      ++done;
      if (!on_token(t)) break;
    }
    return done;
  }
  // Graph replays, pipelined: step i + 1 is enqueued before step i's token is read back (each step reads
  // its token from the device buffer the previous one wrote), so the GPU does not wait for the host. When
  // the caller stops early, the one step enqueued past it has written the cache entry of a position that
  // the next step overwrites, and the inputs are rewritten then.
  const uint64_t offset0 = g.offset();
  write_step_inputs(token, offset0);
  if (ensure_graph(params, g.seed())) write_step_inputs(token, offset0);
  if (s_->readback.empty()) {
    for (int i = 0; i < 2; ++i) s_->readback.emplace_back(options_.device, sizeof(int64_t));
  }
  s_->graph.replay(s_->stream);
  s_->readback[0].copy(s_->tok, s_->stream);
  int64_t done = 0;
  bool ahead = false;
  while (done < n) {
    ahead = done + 1 < n;
    if (ahead) {
      s_->graph.replay(s_->stream);
      s_->readback[static_cast<size_t>((done + 1) % 2)].copy(s_->tok, s_->stream);
    }
    const int64_t t = s_->readback[static_cast<size_t>(done % 2)].value<int64_t>();
    ++done;
    ++position_;
    if (!on_token(t)) break;
  }
  if (ahead) s_->stream.synchronize();  // the step past the last one read: let it finish before anything else
  g.set_offset(offset0 + static_cast<uint64_t>(done));
  return done;
}

KVCache Model::new_kv_cache(int64_t num_blocks, int64_t block_size) const {
  KILN_CHECK(block_size >= 16 && block_size <= 1024 && (block_size & (block_size - 1)) == 0,
             "new_kv_cache: block_size must be a power of two in [16, 1024], got ", block_size);
  KILN_CHECK(num_blocks >= 1 && (num_blocks + 1) * block_size < (int64_t{1} << 31), "new_kv_cache: ", num_blocks,
             " blocks of ", block_size, " positions is too many (slots are 32-bit: at most 2^31 positions)");
  const ModelConfig& c = config_;
  auto p = std::make_shared<KVPool>();
  static std::atomic<uint64_t> next_id{0};
  p->id = ++next_id;
  p->owner = s_->id;
  p->block_size = block_size;
  p->num_blocks = num_blocks;
  p->scratch = num_blocks;  // one more block, never handed out: padding rows of a captured step write there
  for (int64_t i = 0; i < c.num_layers; ++i) {
    p->k.push_back(empty({num_blocks + 1, block_size, c.num_kv_heads, c.head_dim}, dtype_, options_.device));
    p->v.push_back(empty({num_blocks + 1, block_size, c.num_kv_heads, c.head_dim}, dtype_, options_.device));
  }
  p->blocks.resize(static_cast<size_t>(num_blocks));
  p->contents.resize(static_cast<size_t>(num_blocks * block_size));
  for (int64_t b = num_blocks - 1; b >= 0; --b) p->free.push_back(static_cast<int32_t>(b));  // block 0 first
  KVCache cache;
  cache.pool = std::move(p);
  return cache;
}

Sequence Model::new_sequence(int64_t max_context) const {
  KILN_CHECK(max_context >= 1 && max_context <= (int64_t{1} << 22), "new_sequence: max_context must be in [1, 4194304], "
             "got ", max_context);
  KVCache own = new_kv_cache((max_context + 15) / 16);
  own.pool->shared = false;
  return own.new_sequence(max_context);
}

namespace {
// The paged inputs of per_seq new tokens of each sequence, for `rows` >= seqs.size() sequences (rows past them
// are padding: token position 0 in the pool's scratch block, length 1), with block-table rows W wide (padded
// with block 0), as one i32 buffer: positions [T], slots [T], lengths [rows], table [rows, W] (T = rows x
// per_seq).
std::vector<int32_t> paged_host(const KVPool& pool, const std::vector<Sequence*>& seqs, int64_t per_seq, int64_t rows,
                                int64_t W) {
  const int64_t T = rows * per_seq;
  std::vector<int32_t> host(static_cast<size_t>(2 * T + rows + rows * W), 0);
  for (int64_t b = 0; b < rows; ++b) {
    int32_t* table = host.data() + 2 * T + rows + b * W;
    if (b >= static_cast<int64_t>(seqs.size())) {
      host[static_cast<size_t>(T + b)] = static_cast<int32_t>(pool.scratch * pool.block_size);
      host[static_cast<size_t>(2 * T + b)] = 1;
      table[0] = static_cast<int32_t>(pool.scratch);
      continue;
    }
    const Sequence& q = *seqs[static_cast<size_t>(b)];
    for (int64_t t = 0; t < per_seq; ++t) {
      host[static_cast<size_t>(b * per_seq + t)] = static_cast<int32_t>(q.position + t);
      host[static_cast<size_t>(T + b * per_seq + t)] = pool.slot(q, q.position + t);
    }
    host[static_cast<size_t>(2 * T + b)] = static_cast<int32_t>(q.position + per_seq);
    std::copy(q.blocks.begin(), q.blocks.end(), table);
  }
  return host;
}

// Views of that buffer (on the device).
PagedInputs paged_views(const Tensor& io, int64_t rows, int64_t per_seq, int64_t W) {
  const int64_t T = rows * per_seq;
  PagedInputs in;
  in.positions = io.narrow(0, 0, T);
  in.slots = io.narrow(0, T, T);
  in.lengths = io.narrow(0, 2 * T, rows);
  in.table = io.narrow(0, 2 * T + rows, rows * W).view({rows, W});
  in.b = rows;
  return in;
}

int64_t widest(const std::vector<Sequence*>& seqs) {
  int64_t W = 1;
  for (const Sequence* q : seqs) W = std::max<int64_t>(W, static_cast<int64_t>(q->blocks.size()));
  return W;
}

// The largest batch the decode step is captured for (each size's graph keeps its own buffers, logits included).
constexpr int64_t kMaxGraphRows = 64;

// The batch sizes the decode step is captured for: powers of two up to 16, then multiples of 16.
int64_t graph_rows(int64_t b) {
  if (b <= 16) {
    int64_t r = 1;
    while (r < b) r *= 2;
    return r;
  }
  return (b + 15) / 16 * 16;
}
}  // namespace

// The batched decode step as a CUDA graph, one per padded batch size (graph_rows), captured the first time a
// size is seen and replayed after: its inputs (ids, positions, slots, lengths, block table of the model's
// whole context) live in device buffers written before each replay. Returns the logits [B, V] (the graph's
// buffer: valid until the next step), or nothing where the step runs eagerly instead: a sequence longer than
// the model's context, a batch over kMaxGraphRows, a cache of one sequence's own (Model::new_sequence: its
// graphs would be captured again for every other such cache), or a size whose capture failed (an op that
// synchronises).
std::optional<Tensor> Model::step_graph(KVPool& pool, const std::vector<Sequence*>& seqs,
                                        const std::vector<int64_t>& tokens) {
  const int64_t B = static_cast<int64_t>(seqs.size()), rows = graph_rows(B);
  const int64_t W = (options_.max_context + pool.block_size - 1) / pool.block_size;
  if (!pool.shared || rows > kMaxGraphRows || widest(seqs) > W) return std::nullopt;
  if (s_->graph_pool != pool.id) {  // graphs address one cache's pools
    s_->batch_graphs.clear();
    s_->graph_pool = pool.id;
  }
  State::BatchGraph& g = s_->batch_graphs[rows];
  if (g.failed) return std::nullopt;
  const Device dev = options_.device;
  if (!g.ids.defined()) {
    g.ids = zeros({rows}, DType::I64, dev);
    g.io = zeros({3 * rows + rows * W}, DType::I32, dev);
  }
  std::vector<int64_t> ids(tokens);
  ids.resize(static_cast<size_t>(rows), 0);
  g.ids.copy_(from_vector<int64_t>(ids));
  g.io.copy_(from_vector<int32_t>(paged_host(pool, seqs, 1, rows, W)));
  if (!g.graph.captured()) {
    const PagedInputs in = paged_views(g.io, rows, 1, W);
    auto body = [&] {
      g.logits = weights_.lm_head(run_layers(config_, weights_, g.ids, dtype_, nullptr, paged_attention(config_, *s_, pool, in)))
                     .to(DType::F32);
    };
    // The warm-up runs this very step; the replay below runs it again on the same inputs.
    if (!warm_up_and_capture(g.graph, s_->stream, dev, body)) {
      g.failed = true;
      return std::nullopt;
    }
  }
  g.graph.replay(s_->stream);
  return g.logits.narrow(0, 0, B);
}

std::vector<int64_t> Model::step_graph_sizes() const {
  std::vector<int64_t> sizes;
  for (const auto& [rows, g] : s_->batch_graphs)
    if (g.graph.captured()) sizes.push_back(rows);
  return sizes;
}

void Model::check_sequence(const Sequence& seq, const char* op, int64_t i, int64_t n) const {
  KILN_CHECK(seq.pool != nullptr && seq.pool->owner == s_->id, op, ": sequence ", i,
             " was not made by this model's cache");
  KILN_CHECK(seq.position + n <= seq.max_context, op, ": ", n, " tokens after ", seq.position, " in sequence ", i,
             " exceed its context of ", seq.max_context, seq.position == seq.max_context ? " (it is full)" : "");
}

Tensor Model::prefill(Sequence& seq, const std::vector<int64_t>& ids) {
  OnModelStream on(options_.device, s_->stream);
  KILN_CHECK(!ids.empty(), "prefill: the prompt is empty");
  check_sequence(seq, "prefill", 0, static_cast<int64_t>(ids.size()));
  for (int64_t id : ids)
    KILN_CHECK(id >= 0 && id < config_.vocab_size, "prefill: token id ", id, " is outside the vocabulary [0, ",
               config_.vocab_size, ")");
  KVPool& pool = *seq.pool;
  const int64_t T = static_cast<int64_t>(ids.size()), start = seq.position;
  pool.ensure(seq, start + T);
  const int64_t W = widest({&seq});
  PagedInputs in = paged_views(from_vector<int32_t>(paged_host(pool, {&seq}, T, 1, W)).to(options_.device), 1, T, W);
  in.start = start;
  const Tensor id_t = from_vector<int64_t>(ids).to(options_.device);
  const Tensor h = run_layers(config_, weights_, id_t, dtype_, nullptr, paged_attention(config_, *s_, pool, in));
  Tensor logits = weights_.lm_head(h.narrow(0, T - 1, 1)).to(DType::F32).view({config_.vocab_size});
  seq.tokens.insert(seq.tokens.end(), ids.begin(), ids.end());
  seq.position += T;
  pool.register_full(seq, start);
  return logits;
}

Tensor Model::step(const std::vector<Sequence*>& seqs, const std::vector<int64_t>& tokens) {
  OnModelStream on(options_.device, s_->stream);
  const int64_t B = static_cast<int64_t>(seqs.size());
  KILN_CHECK(B >= 1 && tokens.size() == seqs.size(), "step: one token per sequence, got ", tokens.size(), " for ", B);
  for (int64_t b = 0; b < B; ++b) {
    const Sequence& seq = *seqs[static_cast<size_t>(b)];
    check_sequence(seq, "step", b, 1);
    KILN_CHECK(seq.pool == seqs[0]->pool, "step: sequence ", b, " is in another cache than sequence 0");
    for (int64_t c = 0; c < b; ++c)
      KILN_CHECK(seqs[static_cast<size_t>(c)] != &seq, "step: sequence ", b, " is also sequence ", c);
    const int64_t t = tokens[static_cast<size_t>(b)];
    KILN_CHECK(t >= 0 && t < config_.vocab_size, "step: token id ", t, " is outside the vocabulary");
  }
  KVPool& pool = *seqs[0]->pool;
  for (Sequence* seq : seqs) pool.ensure(*seq, seq->position + 1);
  std::optional<Tensor> captured = graphs_enabled() ? step_graph(pool, seqs, tokens) : std::nullopt;
  Tensor logits;
  if (captured) {
    logits = *captured;
  } else {
    const int64_t W = widest(seqs);
    const PagedInputs in = paged_views(from_vector<int32_t>(paged_host(pool, seqs, 1, B, W)).to(options_.device), B, 1, W);
    const Tensor ids = from_vector<int64_t>(tokens).to(options_.device);
    logits = weights_.lm_head(run_layers(config_, weights_, ids, dtype_, nullptr, paged_attention(config_, *s_, pool, in))).to(DType::F32);
  }
  for (int64_t b = 0; b < B; ++b) {
    Sequence& seq = *seqs[static_cast<size_t>(b)];
    seq.tokens.push_back(tokens[static_cast<size_t>(b)]);
    ++seq.position;
    pool.register_full(seq, seq.position - 1);
  }
  return logits;
}

int64_t Model::bytes_per_token() const {
  auto lin = [](const Linear& l) { return l.nbytes(); };
  int64_t b = lin(weights_.lm_head) + static_cast<int64_t>(weights_.final_norm.nbytes());
  for (const LayerWeights& L : weights_.layers) {
    b += lin(L.attn.qkv) + lin(L.attn.o) + static_cast<int64_t>(L.input_norm.nbytes() + L.post_norm.nbytes());
    if (L.mlp) b += lin(L.mlp->gate_up) + lin(L.mlp->down);
    if (L.moe && L.moe->blocks) {
      const BlockExperts& x = *L.moe->blocks;
      const int64_t all = Linear::of(x.gate_up).nbytes() + Linear::of(x.down).nbytes();
      b += static_cast<int64_t>(L.moe->router.nbytes()) + all / x.num_experts * config_.num_experts_per_tok;
    } else if (L.moe) {
      const int64_t E = L.moe->gate_up.size(0), k = config_.num_experts_per_tok;
      b += static_cast<int64_t>(L.moe->router.nbytes()) +
           static_cast<int64_t>(L.moe->gate_up.nbytes() + L.moe->down.nbytes()) / E * k;
    }
  }
  return b;
}

}  // namespace kiln::llm
