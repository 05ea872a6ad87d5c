// Hugging Face tensor names -> kiln's model layout (stacked qkv, gate_up and experts), with every tensor's
// presence, shape and dtype checked before anything is placed on the device.
#include "kiln/llm/weights.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/dispatch.h"

namespace kiln::llm {

Tensor Linear::operator()(const Tensor& x) const {
  if (!parts.empty()) {
    Shape shape = x.sizes();
    shape.back() = out_features();
    Tensor out = empty(shape, x.dtype(), x.device());
    int64_t n0 = 0;
    for (const Linear& p : parts) {
      const int64_t n = p.out_features();
      out.narrow(out.dim() - 1, n0, n).copy_(p(x));
      n0 += n;
    }
    return out;
  }
  if (fp8) return linear(x, *fp8, bias);
  if (q8) return linear(x, *q8, bias);
  if (q4) return linear(x, *q4, bias);
  if (q4k) return linear(x, *q4k, bias);
  if (q5k) return linear(x, *q5k, bias);
  if (q6k) return linear(x, *q6k, bias);
  return linear(x, weight, bias);
}

BlockWeight Linear::block() const {
  KILN_CHECK(parts.empty() && !weight.defined() && !fp8, "Linear::block: the weight is not in one block format");
  if (q8) return *q8;
  if (q4) return *q4;
  if (q4k) return *q4k;
  if (q5k) return *q5k;
  KILN_CHECK(q6k.has_value(), "Linear::block: the weight is not in one block format");
  return *q6k;
}

Linear Linear::of(const BlockWeight& w) {
  Linear l;
  std::visit([&](const auto& v) {
    using W = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<W, Q8Weight>) l.q8 = v;
    else if constexpr (std::is_same_v<W, Q4Weight>) l.q4 = v;
    else if constexpr (std::is_same_v<W, Q4KWeight>) l.q4k = v;
    else if constexpr (std::is_same_v<W, Q5KWeight>) l.q5k = v;
    else l.q6k = v;
  }, w);
  return l;
}

int64_t Linear::nbytes() const {
  if (!parts.empty()) {
    int64_t b = 0;
    for (const Linear& p : parts) b += p.nbytes();
    return b;
  }
  int64_t b = static_cast<int64_t>(values().nbytes());
  if (fp8) b += static_cast<int64_t>(fp8->scales.nbytes());
  if (q8) b += static_cast<int64_t>(q8->scales.nbytes());
  if (q4) b += static_cast<int64_t>(q4->scales.nbytes());
  if (bias) b += static_cast<int64_t>(bias->nbytes());
  return b;
}

std::vector<std::string> MapWeightSource::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

Tensor MapWeightSource::get(const std::string& name) const {
  const auto it = tensors_.find(name);
  KILN_CHECK(it != tensors_.end(), describe(), ": no tensor named \"", name, "\"");
  return it->second;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string layer_prefix(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

// A linear weight is stored in FP8 when the config says the checkpoint is FP8 and the module is not in
// modules_to_not_convert (the MoE router and lm_head never are).
bool is_fp8_module(const ModelConfig& c, const std::string& weight_name) {
  if (!c.fp8) return false;
  if (weight_name.find(".mlp.gate.") != std::string::npos) return false;
  if (weight_name.rfind("model.layers.", 0) != 0) return false;
  const std::string suffix = "_proj.weight";
  if (weight_name.size() < suffix.size() ||
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  for (const std::string& m : c.fp8->modules_to_not_convert)
    if (!m.empty() && weight_name.find(m) != std::string::npos) return false;
  return true;
}

// A layer's linear weight stored in `kiln quantize`'s block format (the config's block_quant): every *_proj of
// the layers but the MoE experts (and the router, which is mlp.gate).
bool is_block_module(const ModelConfig& c, const std::string& weight_name) {
  return !c.block_quant.empty() && is_block_quantized_weight(weight_name);
}

void add_linear(std::vector<std::pair<std::string, Shape>>& out, const ModelConfig& c, const std::string& name,
                int64_t n, int64_t k, bool bias) {
  const std::string w = name + ".weight";
  if (is_block_module(c, w) && c.block_quant == "q4_k") {  // super-blocks of 256 in 144 bytes, no scales
    out.push_back({w, {n, k / 256 * 144}});
    if (bias) out.push_back({name + ".bias", {n}});
    return;
  }
  if (is_block_module(c, w)) {  // values [n, k] int8 or [n, k / 2] uint8, f16 scales per block of 32
    out.push_back({w, {n, c.block_quant == "q4_0" ? k / 2 : k}});
    out.push_back({name + ".weight_scales", {n, k / 32}});
    if (bias) out.push_back({name + ".bias", {n}});
    return;
  }
  out.push_back({w, {n, k}});
  if (is_fp8_module(c, w)) out.push_back({name + ".weight_scale_inv", {ceil_div(n, c.fp8->block_n), ceil_div(k, c.fp8->block_k)}});
  if (bias) out.push_back({name + ".bias", {n}});
}

}  // namespace

bool is_block_quantized_weight(const std::string& weight_name) {
  if (weight_name.rfind("model.layers.", 0) != 0) return false;
  if (weight_name.find(".mlp.experts.") != std::string::npos || weight_name.find(".mlp.gate.") != std::string::npos)
    return false;
  const std::string suffix = "_proj.weight";
  return weight_name.size() >= suffix.size() &&
         weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::pair<std::string, Shape>> expected_tensors(const ModelConfig& c) {
  std::vector<std::pair<std::string, Shape>> out;
  const int64_t H = c.hidden_size, D = c.head_dim;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, H}});
  out.push_back({"model.norm.weight", {H}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, H}});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = layer_prefix(i);
    out.push_back({p + "input_layernorm.weight", {H}});
    out.push_back({p + "post_attention_layernorm.weight", {H}});
    add_linear(out, c, p + "self_attn.q_proj", c.q_size(), H, c.attention_bias);
    add_linear(out, c, p + "self_attn.k_proj", c.kv_size(), H, c.attention_bias);
    add_linear(out, c, p + "self_attn.v_proj", c.kv_size(), H, c.attention_bias);
    add_linear(out, c, p + "self_attn.o_proj", H, c.q_size(), c.attention_bias);
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {D}});
      out.push_back({p + "self_attn.k_norm.weight", {D}});
    }
    if (c.is_moe_layer(i)) {
      const int64_t I = c.moe_intermediate_size;
      out.push_back({p + "mlp.gate.weight", {c.num_experts, H}});
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
        add_linear(out, c, ep + "gate_proj", I, H, false);
        add_linear(out, c, ep + "up_proj", I, H, false);
        add_linear(out, c, ep + "down_proj", H, I, false);
      }
    } else {
      const int64_t I = c.intermediate_size;
      const bool bias = c.arch == Arch::Llama && c.mlp_bias;
      add_linear(out, c, p + "mlp.gate_proj", I, H, bias);
      add_linear(out, c, p + "mlp.up_proj", I, H, bias);
      add_linear(out, c, p + "mlp.down_proj", H, I, bias);
    }
  }
  return out;
}

namespace {

constexpr DTypeSet kWeightTypes = dset(DType::F32, DType::F16, DType::BF16);

class Loader {
 public:
  Loader(const ModelConfig& c, const WeightSource& src, const LoadOptions& o) : c_(c), src_(src), o_(o) {}

  ModelWeights load() {
    check_names();
    ModelWeights m;
    m.embed = plain("model.embed_tokens.weight");
    m.final_norm = plain("model.norm.weight");
    // The output layer keeps a kept format's blocks too (a tied one those of the embedding, whose rows are
    // looked up from the dequantised table).
    const std::string head = c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    if (std::optional<Linear> kept = o_.keep_blocks ? blocks_of({head}) : std::nullopt) m.lm_head = std::move(*kept);
    else if (c_.tie_word_embeddings) m.lm_head.weight = m.embed;
    else m.lm_head.weight = plain("lm_head.weight");
    for (int64_t i = 0; i < c_.num_layers; ++i) m.layers.push_back(layer(i));
    m.bytes = bytes_placed_;
    return m;
  }

 private:
  // Every expected tensor present with its shape; per-expert or stacked expert layouts; nothing unexpected.
  void check_names() {
    std::vector<std::string> missing, bad;
    std::set<std::string> expected;
    for (const auto& [name, shape] : expected_tensors(c_)) {
      std::string n = name;
      Shape s = shape;
      expected.insert(n);
      if (!src_.contains(n)) {
        // Stacked experts (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]) stand in for
        // the per-expert tensors.
        const auto pos = n.find(".mlp.experts.");
        if (pos != std::string::npos && src_.contains(n.substr(0, pos) + ".mlp.experts.gate_up_proj")) continue;
        missing.push_back(n);
        continue;
      }
      const WeightSource::Meta t = src_.meta(n);
      const bool scale = n.size() > 10 && n.compare(n.size() - 10, 10, "_scale_inv") == 0;
      const bool fp8 = is_fp8_module(c_, n) && !scale;
      const bool block_scale = n.size() > 14 && n.compare(n.size() - 14, 14, ".weight_scales") == 0;
      const bool block = is_block_module(c_, n);
      const DType packed = c_.block_quant == "q8_0" ? DType::I8 : DType::U8;
      const bool dtype_ok = scale         ? t.dtype == DType::F32
                            : block_scale ? t.dtype == DType::F16
                            : block       ? t.dtype == packed
                            : fp8         ? (dset(t.dtype) & kFloat8Types) != 0
                                          : (dset(t.dtype) & kWeightTypes) != 0;
      if (t.shape != s || !dtype_ok)
        bad.push_back(str(n, ": ", dtype_name(t.dtype), shape_str(t.shape), ", expected ", shape_str(s), " ",
                          scale         ? "float32"
                          : block_scale ? "float16"
                          : block       ? dtype_name(packed)
                          : fp8         ? "float8"
                                        : "float32/float16/bfloat16"));
    }
    for (int64_t i = 0; i < c_.num_layers; ++i) {
      if (!c_.is_moe_layer(i)) continue;
      const std::string p = layer_prefix(i) + "mlp.experts.";
      if (!src_.contains(p + "gate_up_proj")) continue;
      const int64_t E = c_.num_experts, I = c_.moe_intermediate_size, H = c_.hidden_size;
      for (const auto& [n, s] : std::vector<std::pair<std::string, Shape>>{{p + "gate_up_proj", {E, 2 * I, H}},
                                                                           {p + "down_proj", {E, H, I}}}) {
        expected.insert(n);
        if (!src_.contains(n)) missing.push_back(n);
        else if (const WeightSource::Meta t = src_.meta(n); t.shape != s || !(dset(t.dtype) & kWeightTypes))
          bad.push_back(str(n, ": ", dtype_name(t.dtype), shape_str(t.shape), ", expected ", shape_str(s)));
      }
    }
    std::vector<std::string> unexpected;
    for (const std::string& n : src_.names()) {
      if (expected.count(n)) continue;
      // Buffers some older checkpoints carry; transformers recomputes them.
      if (n.find("rotary_emb.inv_freq") != std::string::npos) continue;
      // A tied checkpoint may still store lm_head.weight; the embedding is used.
      if (c_.tie_word_embeddings && n == "lm_head.weight") continue;
      unexpected.push_back(n);
    }
    if (missing.empty() && bad.empty() && unexpected.empty()) return;
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (size_t i = 0; i < v.size() && i < 12; ++i) s += "\n  " + v[i];
      if (v.size() > 12) s += str("\n  ... and ", v.size() - 12, " more");
      return s;
    };
    std::string msg = str(src_.describe(), ": the tensors do not match a ", c_.architecture, " checkpoint of this config");
    if (!missing.empty()) msg += str("\nmissing (", missing.size(), "):", list(missing));
    if (!bad.empty()) msg += str("\nwrong shape or dtype (", bad.size(), "):", list(bad));
    if (!unexpected.empty()) msg += str("\nunexpected (", unexpected.size(), "):", list(unexpected));
    throw Error(msg);
  }

  DType target(DType stored) const { return o_.dtype.value_or(stored); }

  Tensor place(const Tensor& t, DType dtype) {
    Tensor out = t.to(o_.device);
    out = out.to(dtype);
    account(out);
    return out;
  }

  void account(const Tensor& t) {
    bytes_placed_ += static_cast<int64_t>(t.nbytes());
    if (o_.progress) o_.progress(bytes_placed_, total_bytes());
  }

  int64_t total_bytes() const {
    if (total_ < 0) {
      int64_t n = 0;
      for (const std::string& name : src_.names()) n += src_.meta(name).stored_bytes;
      total_ = n;
    }
    return total_;
  }

  Tensor plain(const std::string& name) {
    const Tensor t = src_.get(name);
    return place(t, target(t.dtype()));
  }

  // Several checkpoint tensors [n_i, ...] stacked along dim 0 into one destination, converted on the way.
  Tensor stack_rows(const std::vector<std::string>& names, DType dtype) {
    Shape shape = src_.meta(names[0]).shape;
    shape[0] = 0;
    for (const auto& s : names) shape[0] += src_.meta(s).shape[0];
    Tensor out = empty(shape, dtype, o_.device);
    int64_t row = 0;
    for (const auto& s : names) {
      const Tensor t = src_.get(s);
      out.narrow(0, row, t.size(0)).copy_(t);
      row += t.size(0);
    }
    account(out);
    return out;
  }

  std::optional<Tensor> stack_bias(const std::vector<std::string>& names, DType dtype) {
    if (!src_.contains(names[0] + ".bias")) return std::nullopt;
    std::vector<std::string> b;
    for (const auto& s : names) b.push_back(s + ".bias");
    return stack_rows(b, dtype);
  }

  // The stored blocks of `weights` stacked along N as one kept-format Linear, when each has blocks of one format
  // (LoadOptions::keep_blocks); nothing otherwise. Q8_0 (34 bytes a block: f16 d, 32 int8) and Q4_0 (18: f16 d,
  // 16 bytes of codes) are split into values and scales; Q4_K, Q5_K and Q6_K stay as stored.
  std::optional<Linear> blocks_of(const std::vector<std::string>& weights) {
    std::vector<BlockTensor> parts;
    bool mixed = false;
    for (const auto& w : weights) {
      std::optional<BlockTensor> b = src_.blocks(w);
      if (!b) return std::nullopt;
      mixed |= !parts.empty() && (b->format != parts[0].format || b->data.size(1) != parts[0].data.size(1));
      parts.push_back(std::move(*b));
    }
    if (mixed) {  // each part in its own format (Linear::parts)
      Linear l;
      for (const auto& w : weights) l.parts.push_back(*blocks_of({w}));
      return l;
    }
    std::vector<Tensor> rows;
    for (const BlockTensor& b : parts) rows.push_back(b.data);
    const Tensor all = rows.size() == 1 ? rows[0].contiguous() : cat(rows, 0);
    return Linear::of(block_weight(BlockTensor{parts[0].format, all}, weights[0]));
  }

  // Stored blocks uint8 [N, bytes per row] of a kept format as the weight kiln multiplies, on the target device:
  // Q4_K, Q5_K and Q6_K as they are; Q8_0 (34 bytes a block: f16 d, 32 int8) and Q4_0 (18: f16 d, 16 bytes of
  // codes) split into values and scales.
  BlockWeight block_weight(const BlockTensor& b, const std::string& what) {
    const std::string& f = b.format;
    const Tensor& all = b.data;
    const int64_t N = all.size(0), row_bytes = all.size(1);
    if (f == "q4_k" || f == "q5_k" || f == "q6_k") {
      const Tensor placed = all.to(o_.device);
      account(placed);
      if (f == "q4_k") return Q4KWeight{placed};
      if (f == "q5_k") return Q5KWeight{placed};
      return Q6KWeight{placed};
    }
    const int64_t block = f == "q8_0" ? 34 : 18, nb = row_bytes / block, qbytes = block - 2;
    KILN_CHECK(row_bytes % block == 0, src_.describe(), ": ", what, " rows of ", row_bytes, " bytes are not ",
               block, "-byte ", f, " blocks");
    Tensor values = empty({N, nb * qbytes}, f == "q8_0" ? DType::I8 : DType::U8), scales = empty({N, nb}, DType::F16);
    const uint8_t* src = all.contiguous().data<const uint8_t>();
    auto* v = static_cast<uint8_t*>(values.data_ptr());
    auto* d = static_cast<uint8_t*>(scales.data_ptr());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < nb; ++k) {
        const uint8_t* blk = src + n * row_bytes + k * block;
        std::memcpy(d + (n * nb + k) * 2, blk, 2);
        std::memcpy(v + (n * nb + k) * qbytes, blk + 2, static_cast<size_t>(qbytes));
      }
    values = values.to(o_.device);
    scales = scales.to(o_.device);
    account(values);
    account(scales);
    if (f == "q8_0") return Q8Weight{values, scales};
    return Q4Weight{values, scales};
  }

  // The stored blocks of every expert's `weights` of layer prefix p (one format, one row width), stacked expert
  // by expert (each expert's weights in the order given); nothing when any is not in a kept block format.
  std::optional<BlockTensor> stacked_expert_blocks(const std::string& p, const std::vector<std::string>& weights) {
    std::vector<Tensor> rows;
    std::string format;
    for (int64_t e = 0; e < c_.num_experts; ++e)
      for (const std::string& w : weights) {
        std::optional<BlockTensor> b = src_.blocks(p + "mlp.experts." + std::to_string(e) + "." + w);
        if (!b || (!format.empty() && (b->format != format || b->data.size(1) != rows[0].size(1))))
          return std::nullopt;
        format = b->format;
        rows.push_back(b->data);
      }
    return BlockTensor{format, cat(rows, 0)};
  }

  // Modules `names` (without ".weight") stacked along N into one Linear: FP8 (values and block scales stacked;
  // every part must fill whole blocks), the stored blocks of a kept format, or plain.
  Linear linear_of(const std::vector<std::string>& names) {
    if (o_.keep_blocks) {
      std::vector<std::string> w;
      for (const auto& s : names) w.push_back(s + ".weight");
      if (std::optional<Linear> l = blocks_of(w)) {
        l->bias = stack_bias(names, o_.dtype.value_or(DType::F32));
        if (l->bias && !l->parts.empty()) {  // each part adds its own rows of the bias
          int64_t n0 = 0;
          for (Linear& p : l->parts) {
            p.bias = l->bias->narrow(0, n0, p.out_features());
            n0 += p.out_features();
          }
          l->bias.reset();
        }
        return *l;
      }
    }
    Linear l;
    std::vector<std::string> w;
    for (const auto& s : names) w.push_back(s + ".weight");
    const DType stored = src_.meta(w[0]).dtype;
    const bool fp8 = is_fp8_module(c_, w[0]);
    const DType act = o_.dtype.value_or(DType::BF16);
    if (is_block_module(c_, w[0])) {
      // Packed values and f16 scales stacked along N as they are, multiplied in place on either device.
      if (c_.block_quant == "q4_k") {
        l.q4k = Q4KWeight{stack_rows(w, stored)};
      } else {
        std::vector<std::string> sc;
        for (const auto& s : names) sc.push_back(s + ".weight_scales");
        const Tensor values = stack_rows(w, stored), scales = stack_rows(sc, DType::F16);
        if (c_.block_quant == "q4_0") l.q4 = Q4Weight{values, scales};
        else l.q8 = Q8Weight{values, scales};
      }
      l.bias = stack_bias(names, o_.dtype.value_or(DType::F32));
      return l;
    }
    if (fp8) {
      std::vector<std::string> sc;
      for (const auto& s : names) sc.push_back(s + ".weight_scale_inv");
      for (const auto& s : w)
        KILN_CHECK(src_.get(s).size(0) % c_.fp8->block_n == 0 || w.size() == 1, src_.describe(), ": ", s, " has ",
                   src_.get(s).size(0), " rows, not a multiple of the FP8 block ", c_.fp8->block_n,
                   ": it cannot be stacked with ", w.size() - 1, " other projections");
      const Tensor values = stack_rows(w, stored);
      const Tensor scales = stack_rows(sc, DType::F32);
      if (o_.keep_fp8) {
        l.fp8 = Fp8Weight{values, scales, ScaleRecipe::BlockWise, c_.fp8->block_n, c_.fp8->block_k};
      } else {
        // Dequantise on the CPU reference path: exact in f32, then rounded once to the target dtype.
        const Tensor v = values.to(kCPU);
        const Fp8Tensor q{v, scales.to(kCPU)};
        Tensor deq = dequantize_fp8(q, ScaleRecipe::BlockWise, DType::F32, false, c_.fp8->block_n);
        KILN_CHECK(c_.fp8->block_n == c_.fp8->block_k, src_.describe(), ": dequantising non-square FP8 blocks (",
                   c_.fp8->block_n, "x", c_.fp8->block_k, ") is not implemented; load with keep_fp8");
        l.weight = place(deq, act);
      }
    } else {
      l.weight = stack_rows(w, target(stored));
    }
    l.bias = stack_bias(names, fp8 ? act : target(stored));
    return l;
  }

  LayerWeights layer(int64_t i) {
    const std::string p = layer_prefix(i);
    LayerWeights L;
    L.input_norm = plain(p + "input_layernorm.weight");
    L.post_norm = plain(p + "post_attention_layernorm.weight");
    L.attn.qkv = linear_of({p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"});
    L.attn.o = linear_of({p + "self_attn.o_proj"});
    if (c_.qk_norm) {
      L.attn.q_norm = plain(p + "self_attn.q_norm.weight");
      L.attn.k_norm = plain(p + "self_attn.k_norm.weight");
    }
    if (c_.is_moe_layer(i)) L.moe = moe(p);
    else L.mlp = MlpWeights{linear_of({p + "mlp.gate_proj", p + "mlp.up_proj"}), linear_of({p + "mlp.down_proj"})};
    return L;
  }

  MoeWeights moe(const std::string& p) {
    MoeWeights m;
    m.router = plain(p + "mlp.gate.weight");
    const int64_t E = c_.num_experts, I = c_.moe_intermediate_size, H = c_.hidden_size;
    if (src_.contains(p + "mlp.experts.gate_up_proj")) {
      m.gate_up = plain(p + "mlp.experts.gate_up_proj");
      m.down = plain(p + "mlp.experts.down_proj");
      return m;
    }
    // Experts whose gate/up and down come in kept block formats (gate and up in one; on CUDA Q8_0, Q4_0 or Q4_K)
    // stay in them, stacked as moe_forward's BlockExperts: gate_up [E x 2I, bytes] (each expert's gate rows, then
    // its up rows), down [E x H, bytes].
    if (o_.keep_blocks) {
      std::optional<BlockTensor> gu = stacked_expert_blocks(p, {"gate_proj.weight", "up_proj.weight"});
      std::optional<BlockTensor> dn = gu ? stacked_expert_blocks(p, {"down_proj.weight"}) : std::nullopt;
      if (gu && dn) {
        m.blocks = BlockExperts{block_weight(*gu, p + "mlp.experts.*.gate_up"), block_weight(*dn, p + "mlp.experts.*.down"), E};
        return m;
      }
    }
    const std::string e0 = p + "mlp.experts.0.";
    const bool fp8 = is_fp8_module(c_, e0 + "gate_proj.weight");
    const DType stored = src_.meta(e0 + "gate_proj.weight").dtype;
    const DType dt = fp8 && o_.keep_fp8 ? stored : fp8 ? o_.dtype.value_or(DType::BF16) : target(stored);
    m.gate_up = empty({E, 2 * I, H}, dt, o_.device);
    m.down = empty({E, H, I}, dt, o_.device);
    KILN_CHECK(!fp8 || o_.keep_fp8 || c_.fp8->block_n == c_.fp8->block_k, src_.describe(),
               ": dequantising non-square FP8 blocks is not implemented; load with keep_fp8");
    if (fp8 && o_.keep_fp8) {
      const int64_t bn = c_.fp8->block_n, bk = c_.fp8->block_k;
      KILN_CHECK(I % bn == 0, src_.describe(), ": moe_intermediate_size ", I, " is not a multiple of the FP8 block ", bn);
      m.gate_up_scales = empty({E, 2 * ceil_div(I, bn), ceil_div(H, bk)}, DType::F32, o_.device);
      m.down_scales = empty({E, ceil_div(H, bn), ceil_div(I, bk)}, DType::F32, o_.device);
    }
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
      auto put = [&](const std::string& name, Tensor dst, std::optional<Tensor> scale_dst) {
        Tensor t = src_.get(name + ".weight");
        if (fp8 && !o_.keep_fp8) {
          t = dequantize_fp8({t, src_.get(name + ".weight_scale_inv")}, ScaleRecipe::BlockWise, DType::F32, false,
                             c_.fp8->block_n);
        }
        dst.copy_(t);
        if (scale_dst) scale_dst->copy_(src_.get(name + ".weight_scale_inv"));
      };
      const Tensor gu = m.gate_up.select(0, e), dn = m.down.select(0, e);
      if (m.gate_up_scales) {
        const Tensor s = m.gate_up_scales->select(0, e);
        const int64_t half = s.size(0) / 2;
        put(ep + "gate_proj", gu.narrow(0, 0, I), s.narrow(0, 0, half));
        put(ep + "up_proj", gu.narrow(0, I, I), s.narrow(0, half, half));
        put(ep + "down_proj", dn, m.down_scales->select(0, e));
      } else {
        put(ep + "gate_proj", gu.narrow(0, 0, I), std::nullopt);
        put(ep + "up_proj", gu.narrow(0, I, I), std::nullopt);
        put(ep + "down_proj", dn, std::nullopt);
      }
    }
    account(m.gate_up);
    account(m.down);
    if (m.gate_up_scales) {
      account(*m.gate_up_scales);
      account(*m.down_scales);
    }
    return m;
  }

  const ModelConfig& c_;
  const WeightSource& src_;
  const LoadOptions& o_;
  int64_t bytes_placed_ = 0;
  mutable int64_t total_ = -1;
};

}  // namespace

ModelWeights load_weights(const ModelConfig& config, const WeightSource& source, const LoadOptions& options) {
  if (options.dtype)
    KILN_CHECK(dset(*options.dtype) & kWeightTypes, "load_weights: dtype must be f32, f16 or bf16, got ",
               dtype_name(*options.dtype));
  return Loader(config, source, options).load();
}

}  // namespace kiln::llm
