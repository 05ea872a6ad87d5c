// Models and tokenizers from GGUF files (tests/data/gguf, written by scripts/make_gguf_models.py with
// llama.cpp's gguf-py as its converter writes them): the logits equal the safetensors model's (f32 files
// exactly, Llama's permuted q/k rows and RoPE factors included; Q8_0 within its quantisation error), and
// the tokenizer rebuilt from the metadata encodes and decodes as the tokenizer.json it came from.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/gguf.h"
#include "kiln/llm/config.h"
#include "kiln/llm/gguf_model.h"
#include "kiln/llm/model.h"
#include "kiln/tokenizer.h"
#include "test_util.h"

namespace kiln::llm {
namespace {

std::string data(const std::string& rel) { return std::string(KILN_TEST_DATA_DIR) + "/" + rel; }

// max |a - b| and max |a| over two logits tensors.
std::pair<double, double> compare(const Tensor& a, const Tensor& b) {
  const Tensor x = a.cpu().to(DType::F64).contiguous(), y = b.cpu().to(DType::F64).contiguous();
  EXPECT_EQ(x.sizes(), y.sizes());
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    diff = std::max(diff, std::abs(x.data<double>()[i] - y.data<double>()[i]));
    scale = std::max(scale, std::abs(x.data<double>()[i]));
  }
  return {diff, scale};
}

Tensor logits_of(const std::string& path, const std::vector<int64_t>& ids) {
  ModelOptions o;
  o.max_context = 64;
  Model m = load_model(path, o);
  return m.prefill(ids, true);
}

const std::vector<int64_t> kPrompt = {1, 5, 9, 33, 7, 120, 64, 3};

TEST(GgufModel, F32FilesGiveTheSafetensorsLogits) {
  for (const char* name : {"qwen3-tiny", "llama-tiny"}) {
    SCOPED_TRACE(name);
    const auto [diff, scale] =
        compare(logits_of(data(str("models/", name)), kPrompt), logits_of(data(str("gguf/models/", name, "-f32.gguf")), kPrompt));
    EXPECT_GT(scale, 0.5);
    EXPECT_LE(diff, 1e-5 * scale);
  }
}

TEST(GgufModel, Q8FilesStayWithinTheirQuantisationError) {
  for (const char* name : {"qwen3-tiny", "llama-tiny", "qwen3-moe-tiny"}) {
    SCOPED_TRACE(name);
    const auto [diff, scale] =
        compare(logits_of(data(str("models/", name)), kPrompt), logits_of(data(str("gguf/models/", name, "-q8_0.gguf")), kPrompt));
    // Q8_0 keeps about 8 bits per weight (a scale per 32): the logits of these 2-layer models move by a few
    // percent of their range, not more.
    EXPECT_GT(diff, 0.0);
    EXPECT_LE(diff, 0.05 * scale);
  }
}

// A Q8_0 file loads with its linear layers in Q8_0, holding the file's own values (what ggml's blocks
// dequantise to, exactly).
TEST(GgufModel, Q8FilesKeepTheirLinearLayersInQ8) {
  const std::string path = data("gguf/models/qwen3-tiny-q8_0.gguf");
  ModelOptions o;
  o.max_context = 16;
  const Model m = load_model(path, o);
  const GgufFile f = GgufFile::open(path);
  const LayerWeights& L = m.weights().layers[0];
  ASSERT_TRUE(L.attn.o.q8.has_value());
  ASSERT_TRUE(L.mlp && L.mlp->down.q8.has_value());
  EXPECT_TRUE(test::equal(dequantize_q8_0(*L.attn.o.q8), f.get("blk.0.attn_output.weight")));
  EXPECT_TRUE(test::equal(dequantize_q8_0(*L.mlp->down.q8), f.get("blk.0.ffn_down.weight")));
  // An f32 file stays in floats.
  const Model g = load_model(data("gguf/models/qwen3-tiny-f32.gguf"), o);
  EXPECT_FALSE(g.weights().layers[0].attn.o.q8.has_value());
}

// A Q4_0 file (gguf-py's quantiser, llama.cpp's reference rounding) keeps its layers in Q4_0 with the file's
// exact values; the output layer runs in Q8_0. Its logits stay near the float model's.
TEST(GgufModel, Q4FilesKeepTheirLinearLayersInQ4) {
  const std::string path = data("gguf/models/qwen3-tiny-q4_0.gguf");
  ModelOptions o;
  o.max_context = 16;
  Model m = load_model(path, o);
  const GgufFile f = GgufFile::open(path);
  const LayerWeights& L = m.weights().layers[0];
  ASSERT_TRUE(L.attn.o.q4.has_value());
  ASSERT_TRUE(L.mlp && L.mlp->down.q4.has_value() && L.mlp->gate_up.q4.has_value());
  EXPECT_TRUE(test::equal(dequantize_q4_0(*L.attn.o.q4), f.get("blk.0.attn_output.weight")));
  EXPECT_TRUE(test::equal(dequantize_q4_0(*L.mlp->down.q4), f.get("blk.0.ffn_down.weight")));
  EXPECT_TRUE(m.weights().lm_head.q8.has_value() || m.config().tie_word_embeddings);
  Model g = load_model(data("gguf/models/qwen3-tiny-f32.gguf"), o);
  const Tensor a = m.prefill({1, 2, 3, 4}, true), b = g.prefill({1, 2, 3, 4}, true);
  const float scale = amax(abs(b)).item<float>();
  // This random tiny model's logits move by about a fifth of their range at 4 bits (measured 0.22).
  EXPECT_LT(amax(abs(sub(a, b))).item<float>(), 0.3f * scale);
  EXPECT_GT(amax(abs(sub(a, b))).item<float>(), 0.f);
}

// A Q4_K file (random weights, scripts/make_gguf_models.py): its Q4_K layers hold the file's blocks as they are,
// q/k/v of mixed formats (v in Q8_0) are dequantised and
// run in Q8_0, and the logits are those of the same model with every kept weight dequantised, within the
// activations' 8-bit quantisation.
TEST(GgufModel, Q4KFilesKeepTheirBlocks) {
  const std::string path = data("gguf/models/qwen3-wide-q4_k.gguf");
  ModelOptions o;
  o.max_context = 16;
  Model m = load_model(path, o);
  const GgufFile f = GgufFile::open(path);
  const LayerWeights& L = m.weights().layers[0];
  ASSERT_TRUE(L.attn.o.q4k.has_value());
  ASSERT_TRUE(L.mlp && L.mlp->gate_up.q4k.has_value() && L.mlp->down.q4k.has_value());
  EXPECT_TRUE(L.attn.qkv.q8.has_value());  // q, k in Q4_K and v in Q8_0: requantised to one format
  EXPECT_TRUE(test::equal(L.attn.o.q4k->blocks, f.raw("blk.0.attn_output.weight")));
  EXPECT_TRUE(test::equal(dequantize_q4_k(*L.mlp->down.q4k), f.get("blk.0.ffn_down.weight")));
  EXPECT_TRUE(m.weights().lm_head.q8.has_value());
  // The float model of the same values: every Q4_K weight dequantised.
  ModelWeights w = m.weights();
  for (LayerWeights& l : w.layers)
    for (Linear* lin : {&l.attn.o, &l.mlp->gate_up, &l.mlp->down}) {
      lin->weight = dequantize_q4_k(*lin->q4k);
      lin->q4k.reset();
    }
  ModelOptions fo = o;
  fo.quant.clear();
  Model fm(m.config(), std::move(w), fo);
  const Tensor a = m.prefill({1, 2, 3, 4, 5}, true), b = fm.prefill({1, 2, 3, 4, 5}, true);
  const float scale = amax(abs(b)).item<float>(), diff = amax(abs(sub(a, b))).item<float>();
  EXPECT_LT(diff, 0.05f * scale);
  EXPECT_GT(diff, 0.f);
}

TEST(GgufModel, ConfigComesFromTheMetadata) {
  for (const char* name : {"qwen3-tiny", "llama-tiny", "qwen3-moe-tiny"}) {
    SCOPED_TRACE(name);
    const ModelConfig want = load_config(data(str("models/", name)));
    const ModelConfig c = gguf_model_config(GgufFile::open(data(str("gguf/models/", name, "-q8_0.gguf"))));
    EXPECT_EQ(c.arch, want.arch);
    EXPECT_EQ(c.num_layers, want.num_layers);
    EXPECT_EQ(c.hidden_size, want.hidden_size);
    EXPECT_EQ(c.intermediate_size, want.intermediate_size);
    EXPECT_EQ(c.num_heads, want.num_heads);
    EXPECT_EQ(c.num_kv_heads, want.num_kv_heads);
    EXPECT_EQ(c.head_dim, want.head_dim);
    EXPECT_EQ(c.vocab_size, want.vocab_size);
    EXPECT_EQ(c.tie_word_embeddings, want.tie_word_embeddings);
    EXPECT_FLOAT_EQ(static_cast<float>(c.rms_norm_eps), static_cast<float>(want.rms_norm_eps));  // GGUF holds f32
    EXPECT_DOUBLE_EQ(c.rope.theta, want.rope.theta);
    EXPECT_EQ(c.num_experts, want.num_experts);
    EXPECT_EQ(c.num_experts_per_tok, want.num_experts_per_tok);
    EXPECT_EQ(c.moe_intermediate_size, want.moe_intermediate_size);
    for (int64_t i = 0; i < c.num_layers; ++i) EXPECT_EQ(c.is_moe_layer(i), want.is_moe_layer(i)) << "layer " << i;
  }
  // Llama 3's RoPE scaling arrives as per-frequency factors (rope_freqs).
  const ModelConfig l = gguf_model_config(GgufFile::open(data("gguf/models/llama-tiny-f32.gguf")));
  EXPECT_EQ(l.rope.freq_factors.size(), static_cast<size_t>(l.rotary_dim() / 2));
}

TEST(GgufModel, FilesThatAreNotModelsAreRefusedByName) {
  // types.gguf has tensors of every type but no model metadata.
  try {
    logits_of(data("gguf/types.gguf"), kPrompt);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("types.gguf"), std::string::npos) << e.what();
  }
  // A tokenizer-only file has no tokens' weights.
  EXPECT_THROW(logits_of(data("gguf/tokenizers/qwen2.gguf"), kPrompt), Error);
  // A model file without a tokenizer says so.
  try {
    Tokenizer::from_model_dir(data("gguf/models/qwen3-tiny-f32.gguf"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model"), std::string::npos) << e.what();
  }
}

TEST(GgufTokenizer, EncodesAndDecodesAsTheTokenizerJsonItCameFrom) {
  const std::vector<std::string> texts = {
      "Hello world! The kiln is hot.",
      "  leading spaces, numbers 12345 and 3.14159\nnew lines\n\n\ttabs",
      "Unicode: café, naïve, 日本語, emoji 🔥, and mixed-CASE words' contractions don't we'll",
      "<|endoftext|> special tokens <|im_start|>user\nhi<|im_end|>",
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>",
  };
  for (const char* name : {"qwen2", "llama3"}) {
    SCOPED_TRACE(name);
    const Tokenizer want = Tokenizer::from_file(data(str("tokenizers/", name, ".json")));
    const Tokenizer got = Tokenizer::from_model_dir(data(str("gguf/tokenizers/", name, ".gguf")));
    for (const std::string& t : texts) {
      SCOPED_TRACE(t);
      for (bool special : {true, false}) {
        const std::vector<int32_t> ids = want.encode(t, special);
        ASSERT_EQ(got.encode(t, special), ids);
        EXPECT_EQ(got.decode(ids, false), want.decode(ids, false));
        EXPECT_EQ(got.decode(ids, true), want.decode(ids, true));
      }
    }
  }
}

}  // namespace
}  // namespace kiln::llm
