// Models and tokenizers from GGUF files (tests/data/gguf, written by scripts/make_gguf_models.py with
// llama.cpp's gguf-py as its converter writes them): the logits equal the safetensors model's (f32 files
// exactly, Llama's permuted q/k rows and RoPE factors included; Q8_0 within its quantisation error), and
// the tokenizer rebuilt from the metadata encodes and decodes as the tokenizer.json it came from.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>

#include <unistd.h>

#include "kiln/gguf.h"
#include "kiln/io.h"
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

// A Q4_K file (random weights, scripts/make_gguf_models.py): its Q4_K layers, and on the CPU the Q6_K ones (the
// output layer, the last layer's ffn_down, as llama.cpp's Q4_K_M files have), hold the file's blocks as they
// are; q/k/v of mixed formats (v in Q8_0) keep each part in its own format (Linear::parts); the logits are
// those of the same model with every kept weight dequantised, within the activations' 8-bit quantisation.
TEST(GgufModel, Q4KFilesKeepTheirBlocks) {
  const std::string path = data("gguf/models/qwen3-wide-q4_k.gguf");
  ModelOptions o;
  o.max_context = 16;
  Model m = load_model(path, o);
  const GgufFile f = GgufFile::open(path);
  const LayerWeights& L = m.weights().layers[0];
  ASSERT_TRUE(L.attn.o.q4k.has_value());
  ASSERT_TRUE(L.mlp && L.mlp->gate_up.q4k.has_value() && L.mlp->down.q4k.has_value());
  // q, k in Q4_K and v in Q8_0: three parts, each the file's blocks.
  ASSERT_EQ(L.attn.qkv.parts.size(), 3u);
  EXPECT_TRUE(L.attn.qkv.parts[0].q4k && L.attn.qkv.parts[1].q4k && L.attn.qkv.parts[2].q8);
  EXPECT_TRUE(test::equal(L.attn.qkv.parts[1].q4k->blocks, f.raw("blk.0.attn_k.weight")));
  EXPECT_TRUE(test::equal(dequantize_q8_0(*L.attn.qkv.parts[2].q8), f.get("blk.0.attn_v.weight")));
  EXPECT_EQ(L.attn.qkv.out_features(), m.config().q_size() + 2 * m.config().kv_size());
  EXPECT_TRUE(test::equal(L.attn.o.q4k->blocks, f.raw("blk.0.attn_output.weight")));
  EXPECT_TRUE(test::equal(dequantize_q4_k(*L.mlp->down.q4k), f.get("blk.0.ffn_down.weight")));
  const LayerWeights& L1 = m.weights().layers[1];
  ASSERT_TRUE(L1.mlp && L1.mlp->down.q6k.has_value());
  EXPECT_TRUE(test::equal(L1.mlp->down.q6k->blocks, f.raw("blk.1.ffn_down.weight")));
  EXPECT_TRUE(test::equal(dequantize_q6_k(*L1.mlp->down.q6k), f.get("blk.1.ffn_down.weight")));
  ASSERT_TRUE(m.weights().lm_head.q6k.has_value());
  EXPECT_TRUE(test::equal(m.weights().lm_head.q6k->blocks, f.raw("output.weight")));
  // The float model of the same values: every kept weight dequantised.
  ModelWeights w = m.weights();
  std::function<Tensor(const Linear&)> dequantised = [&](const Linear& lin) {
    if (!lin.parts.empty()) {
      std::vector<Tensor> rows;
      for (const Linear& p : lin.parts) rows.push_back(dequantised(p));
      return cat(rows, 0);
    }
    return lin.q4k ? dequantize_q4_k(*lin.q4k) : lin.q6k ? dequantize_q6_k(*lin.q6k) : dequantize_q8_0(*lin.q8);
  };
  auto to_float = [&](Linear& lin) {
    Linear plain;
    plain.weight = dequantised(lin);
    lin = plain;
  };
  for (LayerWeights& l : w.layers)
    for (Linear* lin : {&l.attn.qkv, &l.attn.o, &l.mlp->gate_up, &l.mlp->down}) to_float(*lin);
  to_float(w.lm_head);
  ModelOptions fo = o;
  fo.quant.clear();
  Model fm(m.config(), std::move(w), fo);
  const Tensor a = m.prefill({1, 2, 3, 4, 5}, true), b = fm.prefill({1, 2, 3, 4, 5}, true);
  const float scale = amax(abs(b)).item<float>(), diff = amax(abs(sub(a, b))).item<float>();
  EXPECT_LT(diff, 0.05f * scale);
  EXPECT_GT(diff, 0.f);
}

// A Qwen3-MoE file whose experts are Q8_0 or Q4_0 keeps them in that format on the CPU, one Linear per expert
// holding its slice of the stacked ffn_*_exps tensors as stored, and computes what the same model with those
// experts dequantised into the stacked layout (moe_forward) computes, up to the activations' 8-bit
// quantisation. Compared after the first layer (an MoE layer): there both route the same hidden states; in later
// layers of a random tiny model that rounding may flip a near-tied expert choice.
void expect_block_experts_match_stacked(const std::string& path, const std::string& format) {
  SCOPED_TRACE(path);
  ModelOptions o;
  o.max_context = 16;
  Model m = load_model(path, o);
  const GgufFile f = GgufFile::open(path);
  const ModelConfig& c = m.config();
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  ASSERT_TRUE(c.is_moe_layer(0));
  const auto held = [&](const Linear& l) { return format == "q8_0" ? l.q8.has_value() : l.q4.has_value(); };
  const auto dequantised = [&](const Linear& l) { return format == "q8_0" ? dequantize_q8_0(*l.q8) : dequantize_q4_0(*l.q4); };
  ModelWeights w = m.weights();
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LayerWeights& L = w.layers[static_cast<size_t>(i)];
    if (!L.moe) continue;
    ++moe_layers;
    ASSERT_TRUE(L.moe->block_experts());
    EXPECT_EQ(L.moe->blocks->num_experts, E);
    const std::string b = str("blk.", i, ".");
    const Tensor gate = f.get(b + "ffn_gate_exps.weight"), up = f.get(b + "ffn_up_exps.weight");
    const Tensor down = f.get(b + "ffn_down_exps.weight");
    ASSERT_EQ(gate.sizes(), (Shape{E, I, H}));
    Tensor gu = empty({E, 2 * I, H}, DType::F32), dn = empty({E, H, I}, DType::F32);
    for (int64_t e = 0; e < E; ++e) {
      SCOPED_TRACE(str("layer ", i, " expert ", e));
      const Linear lg = Linear::of(narrow_rows(L.moe->blocks->gate_up, e * 2 * I, 2 * I));
      const Linear ld = Linear::of(narrow_rows(L.moe->blocks->down, e * H, H));
      ASSERT_TRUE(held(lg) && held(ld));
      EXPECT_TRUE(test::equal(dequantised(lg), cat({gate.select(0, e), up.select(0, e)}, 0)));
      EXPECT_TRUE(test::equal(dequantised(ld), down.select(0, e)));
      gu.select(0, e).copy_(cat({gate.select(0, e), up.select(0, e)}, 0));
      dn.select(0, e).copy_(down.select(0, e));
    }
    L.moe->blocks.reset();
    L.moe->gate_up = gu;
    L.moe->down = dn;
  }
  ASSERT_GT(moe_layers, 0);
  Model fm(c, std::move(w), o);
  EXPECT_LT(m.bytes_per_token(), fm.bytes_per_token());
  const std::vector<int64_t> ids = {1, 5, 9, 33, 7, 120, 64, 3, 200, 17, 301};
  Trace ta, tb;
  m.prefill(ids, true, &ta);
  fm.prefill(ids, true, &tb);
  const auto [diff, scale] = compare(ta.hidden[0], tb.hidden[0]);
  EXPECT_GT(scale, 0.1);
  EXPECT_LE(diff, 0.02 * scale);
  EXPECT_GT(diff, 0.0);
}

TEST(GgufModel, MoeFilesKeepTheirExpertsInBlocks) {
  expect_block_experts_match_stacked(data("gguf/models/qwen3-moe-tiny-q8_0.gguf"), "q8_0");
  // The int8 codes are the file's bytes: each 34-byte block's last 32.
  const std::string path = data("gguf/models/qwen3-moe-tiny-q8_0.gguf");
  ModelOptions o;
  o.max_context = 16;
  const Model m = load_model(path, o);
  const int64_t Hd = m.config().hidden_size;
  const Linear d = Linear::of(narrow_rows(m.weights().layers[0].moe->blocks->down, 5 * Hd, Hd));
  const int64_t H = m.config().hidden_size, I = m.config().moe_intermediate_size;
  EXPECT_TRUE(test::equal(d.q8->values.view({H, I / 32, 32}).to(DType::U8),
                          GgufFile::open(path).raw("blk.0.ffn_down_exps.weight").narrow(0, 5 * H, H).view({H, I / 32, 34}).narrow(2, 2, 32)));
}

// The memory check's estimate: an f32 file converts every tensor; a Q8_0 one keeps its layers' and experts' blocks
// (about 8.5 bits a weight) and converts the embedding, norms and router.
TEST(GgufModel, WeightBytesCountKeptBlocksAtTheirSize) {
  const GgufFile f32 = GgufFile::open(data("gguf/models/qwen3-tiny-f32.gguf"));
  int64_t elements = 0;
  for (const GgufTensorInfo& t : f32.header().tensors) elements += checked_numel(t.shape);
  EXPECT_EQ(gguf_weight_bytes(f32, DType::BF16, kCPU), 2 * elements);
  const GgufFile q8 = GgufFile::open(data("gguf/models/qwen3-moe-tiny-q8_0.gguf"));
  int64_t kept = 0, rest = 0;
  for (const GgufTensorInfo& t : q8.header().tensors) {
    if (gguf_type_name(t.type) == "Q8_0" && t.name != "token_embd.weight") kept += static_cast<int64_t>(t.nbytes);
    else rest += checked_numel(t.shape);
  }
  EXPECT_GT(kept, 0);
  EXPECT_EQ(gguf_weight_bytes(q8, DType::F32, kCPU), kept + 4 * rest);
}

// The fields of a config that change the computation (rms_norm_eps as f32: GGUF holds f32).
void expect_same_config(const ModelConfig& c, const ModelConfig& want) {
  EXPECT_EQ(c.arch, want.arch);
  EXPECT_EQ(c.num_layers, want.num_layers);
  EXPECT_EQ(c.hidden_size, want.hidden_size);
  EXPECT_EQ(c.intermediate_size, want.intermediate_size);
  EXPECT_EQ(c.num_heads, want.num_heads);
  EXPECT_EQ(c.num_kv_heads, want.num_kv_heads);
  EXPECT_EQ(c.head_dim, want.head_dim);
  EXPECT_EQ(c.vocab_size, want.vocab_size);
  EXPECT_EQ(c.tie_word_embeddings, want.tie_word_embeddings);
  EXPECT_FLOAT_EQ(static_cast<float>(c.rms_norm_eps), static_cast<float>(want.rms_norm_eps));
  EXPECT_DOUBLE_EQ(c.rope.theta, want.rope.theta);
  EXPECT_EQ(c.num_experts, want.num_experts);
  EXPECT_EQ(c.num_experts_per_tok, want.num_experts_per_tok);
  EXPECT_EQ(c.moe_intermediate_size, want.moe_intermediate_size);
  for (int64_t i = 0; i < c.num_layers; ++i) EXPECT_EQ(c.is_moe_layer(i), want.is_moe_layer(i)) << "layer " << i;
}

TEST(GgufModel, ConfigComesFromTheMetadata) {
  for (const char* name : {"qwen3-tiny", "llama-tiny", "qwen3-moe-tiny"}) {
    SCOPED_TRACE(name);
    expect_same_config(gguf_model_config(GgufFile::open(data(str("gguf/models/", name, "-q8_0.gguf")))),
                       load_config(data(str("models/", name))));
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

// ---- writing: write_gguf_model (`kiln quantize IN OUT.gguf`) ----------------------------------------------------

// A file under the test's own temporary directory, removed with it.
struct TempDir {
  std::filesystem::path dir;
  TempDir() {
    dir = std::filesystem::temp_directory_path() /
          str("kiln-gguf-write-", ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-", ::getpid());
    std::filesystem::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// kiln's files against the ones gguf-py wrote from the same checkpoints (scripts/make_gguf_models.py, llama.cpp's
// converter layout): every tensor under the same name, shape and bytes (Llama's permuted q/k rows, stacked
// experts, Q8_0 blocks as ggml's reference quantiser writes them), except the MoE router, which kiln keeps in
// f32 (gguf-py's file has it in Q8_0); and the same config read back.
TEST(GgufWrite, TensorsMatchGgufPysFiles) {
  const TempDir tmp;
  for (const auto& [name, type] : std::vector<std::pair<std::string, std::string>>{
           {"qwen3-tiny", "f32"}, {"llama-tiny", "f32"}, {"qwen3-tiny", "q8_0"}, {"llama-tiny", "q8_0"},
           {"qwen3-moe-tiny", "q8_0"}}) {
    SCOPED_TRACE(name + " " + type);
    const std::string out = tmp.file(name + "-" + type + ".gguf");
    const std::map<std::string, int64_t> counts = write_gguf_model(data("models/" + name), out, type);
    EXPECT_GT(counts.at(type == "f32" ? "F32" : "Q8_0"), 0);
    const GgufFile ours = GgufFile::open(out), ref = GgufFile::open(data("gguf/models/" + name + "-" + type + ".gguf"));
    EXPECT_EQ(ours.header().tensors.size(), ref.header().tensors.size());
    int64_t compared = 0;
    for (const GgufTensorInfo& r : ref.header().tensors) {
      SCOPED_TRACE(r.name);
      ASSERT_TRUE(ours.contains(r.name));
      const GgufTensorInfo& o = ours.info(r.name);
      EXPECT_EQ(o.shape, r.shape);
      if (r.name.find("ffn_gate_inp") != std::string::npos) {
        EXPECT_EQ(gguf_type_name(o.type), "F32");
        EXPECT_TRUE(test::all_close(ours.get(r.name), ref.get(r.name), test::Tolerance{0.02, 0.02}));
        continue;
      }
      EXPECT_EQ(gguf_type_name(o.type), gguf_type_name(r.type));
      EXPECT_TRUE(same_bytes(ours.raw(r.name), ref.raw(r.name)));
      ++compared;
    }
    EXPECT_GT(compared, 8);
    const ModelConfig a = gguf_model_config(ours), b = gguf_model_config(ref);
    expect_same_config(a, b);
    EXPECT_EQ(a.rope.freq_factors, b.rope.freq_factors);
    EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  }
}

// The shipped model in Q8_0: the layers load as Q8_0 from the file's blocks, the logits stay near the float
// model's, and the tokenizer and chat template come back from the metadata as tokenizer.json and the template
// file give them.
TEST(GgufWrite, ShippedModelWithItsTokenizer) {
  const TempDir tmp;
  const std::string dir = std::string(KILN_TEST_DATA_DIR) + "/../../models/kiln-tiny", out = tmp.file("kiln-tiny-q8_0.gguf");
  write_gguf_model(dir, out, "q8_0");
  ModelOptions o;
  o.max_context = 64;
  Model g = load_model(out, o), f = load_model(dir, o);
  EXPECT_TRUE(g.weights().layers[0].attn.qkv.q8.has_value());
  EXPECT_TRUE(g.weights().layers[0].mlp->down.q8.has_value());
  const std::vector<int64_t> ids = {1, 200, 3000, 17, 99, 4095, 5};
  const auto [diff, scale] = compare(f.prefill(ids, true), g.prefill(ids, true));
  EXPECT_GT(diff, 0.0);
  EXPECT_LE(diff, 0.05 * scale);
  const Tokenizer want = Tokenizer::from_model_dir(dir), got = Tokenizer::from_model_dir(out);
  for (const std::string t : {"The Python interpreter reads 12345 lines.\n\n  def f(x):\treturn x",
                              "<|im_start|>user\nhi, café 日本語<|im_end|>"}) {
    EXPECT_EQ(got.encode(t), want.encode(t)) << t;
    EXPECT_EQ(got.decode(want.encode(t), false), t);
  }
  std::ifstream is(dir + "/chat_template.jinja");
  const std::string tmpl((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
  EXPECT_EQ(gguf_chat_template(GgufFile::open(out)), tmpl);
}

// A Qwen3-MoE checkpoint written as q4_0: the stacked experts in Q4_0 (as llama.cpp's 4-bit files have them),
// kept in their blocks when loaded on the CPU (expect_block_experts_match_stacked above).
TEST(GgufWrite, MoeExpertsTakeTheFormat) {
  const TempDir tmp;
  const std::string out = tmp.file("moe-q4_0.gguf");
  write_gguf_model(data("models/qwen3-moe-tiny"), out, "q4_0");
  const GgufFile f = GgufFile::open(out);
  for (const char* t : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"})
    EXPECT_EQ(gguf_type_name(f.info(str("blk.0.", t, ".weight")).type), "Q4_0") << t;
  expect_block_experts_match_stacked(out, "q4_0");
}

TEST(GgufWrite, RefusesWhatItCannotWrite) {
  const TempDir tmp;
  EXPECT_TRUE(test::throws_error([&] { write_gguf_model(data("models/qwen3-tiny"), tmp.file("a.gguf"), "q5_k"); },
                                 {"q5_k", "q8_0", "q4_k"}));
  EXPECT_TRUE(test::throws_error([&] { write_gguf_model(data("models/qwen3-tiny-fp8"), tmp.file("b.gguf"), "q8_0"); },
                                 {"FP8"}));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("b.gguf")));
  // A tensor whose bytes fail mid-write leaves neither the file nor its temporary; a name twice is refused.
  auto four_floats = [] { return std::vector<uint8_t>(16, 0); };
  const std::vector<std::pair<std::string, GgufValue>> kv = {{"general.architecture", {GgufValue::Type::String, std::string("qwen3")}}};
  EXPECT_TRUE(test::throws_error([&] {
    write_gguf(tmp.file("d.gguf"), kv, {{"a", {4}, 0, four_floats}, {"b", {4}, 0, []() -> std::vector<uint8_t> {
                                                                        throw Error("quantiser failed");
                                                                      }}});
  }, {"quantiser failed"}));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("d.gguf")));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("d.gguf.tmp")));
  EXPECT_TRUE(test::throws_error([&] { write_gguf(tmp.file("e.gguf"), kv, {{"a", {4}, 0, four_floats}, {"a", {4}, 0, four_floats}}); },
                                 {"given twice"}));
  EXPECT_TRUE(test::throws_error([&] { write_gguf(tmp.file("e.gguf"), kv, {{"a", {4}, 8, four_floats}}); },
                                 {"not a whole number"}));
  write_gguf(tmp.file("f.gguf"), kv, {{"a", {4}, 0, four_floats}, {"b", {2, 2}, 0, four_floats}});
  const GgufFile f = GgufFile::open(tmp.file("f.gguf"));
  EXPECT_EQ(f.info("b").shape, Shape({2, 2}));
  EXPECT_EQ(std::filesystem::file_size(tmp.file("f.gguf")) % 32, 0u);  // the last tensor padded too
  // A tensor the layout has no name for.
  std::filesystem::copy(data("models/qwen3-tiny"), tmp.dir / "extra");
  {
    Checkpoint ck = Checkpoint::open(data("models/qwen3-tiny"));
    NamedTensors t;
    for (const std::string& n : ck.names()) t.emplace_back(n, ck.get(n));
    t.emplace_back("model.layers.0.mystery.weight", ones({4}));
    save_safetensors((tmp.dir / "extra" / "model.safetensors").string(), t);
  }
  EXPECT_TRUE(test::throws_error([&] { write_gguf_model(tmp.file("extra"), tmp.file("c.gguf"), "f32"); },
                                 {"model.layers.0.mystery.weight", "no place"}));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("c.gguf")));
}

}  // namespace
}  // namespace kiln::llm
