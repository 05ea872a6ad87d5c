// The weight loader: Hugging Face names to kiln's stacked layout, checks of presence/shape/dtype, MoE expert
// stacking (per-expert and stacked checkpoints), FP8 weights kept or dequantised.
#include <gtest/gtest.h>

#include <cstring>

#include "kiln/llm/weights.h"
#include "test_util.h"

namespace kiln::llm {
namespace {

using test::equal;
using test::random_tensor;
using test::throws_error;

ModelConfig tiny(Arch arch, bool fp8 = false) {
  ModelConfig c;
  c.arch = arch;
  c.architecture = arch == Arch::Qwen3 ? "Qwen3ForCausalLM" : arch == Arch::Qwen3Moe ? "Qwen3MoeForCausalLM" : "LlamaForCausalLM";
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 50;
  c.qk_norm = arch != Arch::Llama;
  c.attention_bias = arch == Arch::Llama;
  c.sliding_window.assign(3, 0);
  if (arch == Arch::Qwen3Moe) {
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 32;
    c.mlp_only_layers = {1};
  }
  if (fp8) c.fp8 = Fp8Config{32, 32, {"lm_head"}};
  return c;
}

// Random tensors for every expected name (FP8 weights quantised with their block scales).
std::map<std::string, Tensor> random_checkpoint(const ModelConfig& c) {
  std::map<std::string, Tensor> m;
  for (const auto& [name, shape] : expected_tensors(c)) {
    if (name.find("_scale_inv") != std::string::npos) continue;
    const std::string scale = name.substr(0, name.size() - 7) + ".weight_scale_inv";
    const Tensor t = random_tensor(shape, DType::F32);
    bool has_scale = false;
    for (const auto& [n2, s2] : expected_tensors(c)) has_scale |= n2 == scale;
    if (has_scale) {
      const Fp8Tensor q = quantize_fp8(t, ScaleRecipe::BlockWise, DType::F8E4M3, false, c.fp8->block_n);
      m[name] = q.values;
      m[scale] = q.scales;
    } else {
      m[name] = t.to(DType::BF16);
    }
  }
  return m;
}

TEST(Weights, StacksQkvAndGateUp) {
  const ModelConfig c = tiny(Arch::Qwen3);
  auto ck = random_checkpoint(c);
  const ModelWeights w = load_weights(c, MapWeightSource(ck));
  ASSERT_EQ(w.layers.size(), 3u);
  const LayerWeights& L = w.layers[2];
  EXPECT_EQ(L.attn.qkv.weight.sizes(), (Shape{128 + 2 * 64, 64}));
  const std::string p = "model.layers.2.";
  EXPECT_TRUE(equal(L.attn.qkv.weight.narrow(0, 0, 128), ck[p + "self_attn.q_proj.weight"]));
  EXPECT_TRUE(equal(L.attn.qkv.weight.narrow(0, 128, 64), ck[p + "self_attn.k_proj.weight"]));
  EXPECT_TRUE(equal(L.attn.qkv.weight.narrow(0, 192, 64), ck[p + "self_attn.v_proj.weight"]));
  ASSERT_TRUE(L.mlp.has_value());
  EXPECT_TRUE(equal(L.mlp->gate_up.weight.narrow(0, 0, 96), ck[p + "mlp.gate_proj.weight"]));
  EXPECT_TRUE(equal(L.mlp->gate_up.weight.narrow(0, 96, 96), ck[p + "mlp.up_proj.weight"]));
  EXPECT_TRUE(equal(L.attn.q_norm, ck[p + "self_attn.q_norm.weight"]));
  EXPECT_FALSE(L.attn.qkv.bias.has_value());
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(equal(w.lm_head.weight, ck["lm_head.weight"]));
  // dtype conversion on load.
  const ModelWeights w32 = load_weights(c, MapWeightSource(ck), LoadOptions{kCPU, DType::F32});
  EXPECT_EQ(w32.layers[0].attn.o.weight.dtype(), DType::F32);
  EXPECT_EQ(w32.final_norm.dtype(), DType::F32);
}

TEST(Weights, TiedEmbeddingsShareTheTable) {
  ModelConfig c = tiny(Arch::Qwen3);
  c.tie_word_embeddings = true;
  auto ck = random_checkpoint(c);
  EXPECT_EQ(ck.count("lm_head.weight"), 0u);
  const ModelWeights w = load_weights(c, MapWeightSource(ck));
  EXPECT_EQ(w.lm_head.weight.data_ptr(), w.embed.data_ptr());
}

TEST(Weights, LlamaBiasesStackWithTheirWeights) {
  const ModelConfig c = tiny(Arch::Llama);
  auto ck = random_checkpoint(c);
  const ModelWeights w = load_weights(c, MapWeightSource(ck));
  const Linear& qkv = w.layers[0].attn.qkv;
  ASSERT_TRUE(qkv.bias.has_value());
  EXPECT_TRUE(equal(qkv.bias->narrow(0, 128, 64), ck["model.layers.0.self_attn.k_proj.bias"]));
  EXPECT_FALSE(w.layers[0].attn.q_norm.defined());
  // The stacked layer computes what the three separate ones do.
  const Tensor x = random_tensor({3, 64}, DType::BF16);
  const Tensor y = qkv(x);
  EXPECT_TRUE(test::all_close(y.narrow(1, 192, 64), linear(x, ck["model.layers.0.self_attn.v_proj.weight"],
                                                          ck["model.layers.0.self_attn.v_proj.bias"])));
}

// A source whose named weights also come as GGUF blocks (WeightSource::blocks).
class BlockSource : public MapWeightSource {
 public:
  BlockSource(std::map<std::string, Tensor> t, std::map<std::string, BlockTensor> b)
      : MapWeightSource(std::move(t)), b_(std::move(b)) {}
  std::optional<BlockTensor> blocks(const std::string& name) const override {
    const auto it = b_.find(name);
    if (it == b_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::map<std::string, BlockTensor> b_;
};

// GGUF's bytes of a Q8_0 or Q4_0 weight: per block its f16 scale, then its codes.
Tensor gguf_blocks(const Tensor& values, const Tensor& scales) {
  const int64_t N = values.size(0), nb = scales.size(1), qb = values.size(1) / nb;
  Tensor out = empty({N, nb * (2 + qb)}, DType::U8);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* o = out.data<uint8_t>() + (n * nb + b) * (2 + qb);
      std::memcpy(o, static_cast<const uint8_t*>(scales.data_ptr()) + (n * nb + b) * 2, 2);
      std::memcpy(o + 2, static_cast<const uint8_t*>(values.data_ptr()) + n * values.size(1) + b * qb,
                  static_cast<size_t>(qb));
    }
  return out;
}

// q and k in Q8_0 and v in Q4_0 (as a Q4_K_M file keeps v in Q6_K): the stacked q/k/v keeps each part in its
// own format with its own rows of the bias, and computes what the three separate products do.
TEST(Weights, StackedPartsOfDifferentBlockFormatsKeepTheirOwn) {
  const ModelConfig c = tiny(Arch::Llama);
  auto ck = random_checkpoint(c);
  const std::string p = "model.layers.0.self_attn.";
  const Q8Weight q = quantize_q8_0(ck[p + "q_proj.weight"]), k = quantize_q8_0(ck[p + "k_proj.weight"]);
  const Q4Weight v = quantize_q4_0(ck[p + "v_proj.weight"]);
  std::map<std::string, BlockTensor> blocks{{p + "q_proj.weight", {"q8_0", gguf_blocks(q.values, q.scales)}},
                                            {p + "k_proj.weight", {"q8_0", gguf_blocks(k.values, k.scales)}},
                                            {p + "v_proj.weight", {"q4_0", gguf_blocks(v.values, v.scales)}}};
  LoadOptions o;
  o.keep_blocks = true;
  const ModelWeights w = load_weights(c, BlockSource(ck, std::move(blocks)), o);
  const Linear& qkv = w.layers[0].attn.qkv;
  ASSERT_EQ(qkv.parts.size(), 3u);
  EXPECT_TRUE(qkv.parts[0].q8 && qkv.parts[1].q8 && qkv.parts[2].q4 && !qkv.bias && !qkv.weight.defined());
  EXPECT_EQ(qkv.out_features(), 256);
  EXPECT_EQ(qkv.in_features(), 64);
  EXPECT_TRUE(equal(qkv.parts[2].q4->values, v.values));
  const Tensor bq = ck[p + "q_proj.bias"].to(DType::F32), bv = ck[p + "v_proj.bias"].to(DType::F32);
  ASSERT_TRUE(qkv.parts[2].bias.has_value());
  EXPECT_TRUE(equal(*qkv.parts[2].bias, bv));
  const Tensor x = random_tensor({3, 64}, DType::F32);
  const Tensor y = qkv(x);
  EXPECT_TRUE(equal(y.narrow(1, 0, 128), linear(x, q, bq)));
  EXPECT_TRUE(equal(y.narrow(1, 192, 64), linear(x, v, bv)));
  // The other layers have no blocks: stacked into one plain weight as usual.
  EXPECT_TRUE(w.layers[1].attn.qkv.parts.empty() && w.layers[1].attn.qkv.weight.defined());
}

TEST(Weights, MoeExpertsStackedFromPerExpertTensors) {
  const ModelConfig c = tiny(Arch::Qwen3Moe);
  auto ck = random_checkpoint(c);
  const ModelWeights w = load_weights(c, MapWeightSource(ck));
  EXPECT_TRUE(w.layers[1].mlp.has_value());  // mlp_only_layers
  ASSERT_TRUE(w.layers[2].moe.has_value());
  const MoeWeights& m = *w.layers[2].moe;
  EXPECT_EQ(m.gate_up.sizes(), (Shape{4, 64, 64}));
  EXPECT_EQ(m.down.sizes(), (Shape{4, 64, 32}));
  for (int e = 0; e < 4; ++e) {
    const std::string ep = "model.layers.2.mlp.experts." + std::to_string(e) + ".";
    EXPECT_TRUE(equal(m.gate_up.select(0, e).narrow(0, 0, 32), ck[ep + "gate_proj.weight"]));
    EXPECT_TRUE(equal(m.gate_up.select(0, e).narrow(0, 32, 32), ck[ep + "up_proj.weight"]));
    EXPECT_TRUE(equal(m.down.select(0, e), ck[ep + "down_proj.weight"]));
  }
  // The same experts given stacked (mlp.experts.gate_up_proj / down_proj) load to the same tensors.
  std::map<std::string, Tensor> stacked;
  for (const auto& [k, v] : ck)
    if (k.find("layers.2.mlp.experts.") == std::string::npos) stacked[k] = v;
  stacked["model.layers.2.mlp.experts.gate_up_proj"] = m.gate_up;
  stacked["model.layers.2.mlp.experts.down_proj"] = m.down;
  const ModelWeights w2 = load_weights(c, MapWeightSource(stacked));
  EXPECT_TRUE(equal(w2.layers[2].moe->gate_up, m.gate_up));
}

TEST(Weights, Fp8KeptWithScalesOrDequantised) {
  const ModelConfig c = tiny(Arch::Qwen3, true);
  auto ck = random_checkpoint(c);
  const std::string p = "model.layers.0.self_attn.";
  ASSERT_EQ(ck[p + "q_proj.weight"].dtype(), DType::F8E4M3);
  const ModelWeights w = load_weights(c, MapWeightSource(ck));
  const Linear& qkv = w.layers[0].attn.qkv;
  ASSERT_TRUE(qkv.fp8.has_value());
  EXPECT_EQ(qkv.fp8->scales.sizes(), (Shape{(128 + 128) / 32, 2}));
  EXPECT_TRUE(equal(qkv.fp8->scales.narrow(0, 4, 2), ck[p + "k_proj.weight_scale_inv"]));
  EXPECT_FALSE(w.lm_head.fp8.has_value());  // modules_to_not_convert
  // Dequantised on load: the layer computes the same function.
  const ModelWeights wd = load_weights(c, MapWeightSource(ck), LoadOptions{kCPU, DType::F32, false});
  const Tensor x = random_tensor({2, 64}, DType::F32);
  EXPECT_TRUE(test::all_close(wd.layers[0].attn.qkv(x), qkv(x), test::Tolerance{1e-5, 1e-5}));
}

TEST(Weights, Fp8MoeExpertsKeepBlockScales) {
  ModelConfig c = tiny(Arch::Qwen3Moe, true);
  auto ck = random_checkpoint(c);
  const ModelWeights w = load_weights(c, MapWeightSource(ck));
  const MoeWeights& m = *w.layers[0].moe;
  EXPECT_EQ(m.gate_up.dtype(), DType::F8E4M3);
  ASSERT_TRUE(m.gate_up_scales.has_value());
  EXPECT_EQ(m.gate_up_scales->sizes(), (Shape{4, 2, 2}));
  EXPECT_TRUE(equal(m.gate_up_scales->select(0, 3).narrow(0, 1, 1), ck["model.layers.0.mlp.experts.3.up_proj.weight_scale_inv"]));
  EXPECT_EQ(m.router.dtype(), DType::BF16);  // the router is never FP8
}

TEST(Weights, MismatchesAreReportedByName) {
  const ModelConfig c = tiny(Arch::Qwen3);
  auto ck = random_checkpoint(c);
  auto missing = ck;
  missing.erase("model.layers.1.self_attn.k_norm.weight");
  missing.erase("model.norm.weight");
  EXPECT_TRUE(throws_error([&] { load_weights(c, MapWeightSource(missing, "ckpt")); },
                           {"ckpt", "missing (2)", "model.layers.1.self_attn.k_norm.weight", "model.norm.weight"}));
  auto extra = ck;
  extra["model.layers.9.mlp.gate_proj.weight"] = random_tensor({2, 2}, DType::F32);
  extra["model.layers.0.self_attn.rotary_emb.inv_freq"] = random_tensor({16}, DType::F32);  // tolerated
  EXPECT_TRUE(throws_error([&] { load_weights(c, MapWeightSource(extra)); }, {"unexpected (1)", "layers.9"}));
  auto bad = ck;
  bad["model.layers.0.mlp.up_proj.weight"] = random_tensor({96, 63}, DType::BF16);
  bad["model.embed_tokens.weight"] = random_tensor({50, 64}, DType::F32).to(DType::I32);
  EXPECT_TRUE(throws_error([&] { load_weights(c, MapWeightSource(bad)); },
                           {"wrong shape or dtype (2)", "up_proj.weight: ", "[96, 64]", "embed_tokens"}));
}

}  // namespace
}  // namespace kiln::llm
