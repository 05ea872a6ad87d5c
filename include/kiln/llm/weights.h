// A model's weights in kiln's layout, and the loader that builds it from Hugging Face tensor names.
//
// The layout is chosen for decode: q/k/v projections are stacked into one [q + 2 kv, H] matrix and gate/up
// into one [2I, H] matrix (one matrix-vector product each instead of three or two), and the experts of a
// MoE layer are stacked into gate_up [E, 2I, H] and down [E, H, I] for the grouped kernels.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/llm/config.h"
#include "kiln/nn.h"

namespace kiln::llm {

// y = x W^T (+ b), with W a plain tensor [N, K], an FP8 weight with its scales, or a Q8_0, Q4_0, Q4_K or Q6_K
// weight (or Q5_K).
struct Linear {
  Tensor weight;                  // [N, K]; undefined when the weight is FP8 or in a block format
  std::optional<Fp8Weight> fp8;   // the FP8 weight, when kept in FP8
  std::optional<Q8Weight> q8;     // the Q8_0 weight (ModelOptions::quant)
  std::optional<Q4Weight> q4;     // the Q4_0 weight (ModelOptions::quant)
  std::optional<Q4KWeight> q4k;   // the Q4_K weight (ModelOptions::quant)
  std::optional<Q5KWeight> q5k;   // the Q5_K weight (a GGUF file's, on the CPU)
  std::optional<Q6KWeight> q6k;   // the Q6_K weight (a GGUF file's, on the CPU)
  std::optional<Tensor> bias;     // [N]
  // When not empty, the weight is these stacked along N, each with its own format and bias (a stacked q/k/v or
  // gate/up whose parts a GGUF file keeps in different block formats, as Q4_K_M's v in Q6_K); the members
  // above are then unset.
  std::vector<Linear> parts;
  // The weight of a single-format block Linear (q8 / q4 / q4k / q5k / q6k set), and the Linear of one.
  BlockWeight block() const;
  static Linear of(const BlockWeight& w);
  // The stored values ([N, K]; Q4_0's [N, K / 2] bytes; Q4_K's [N, K / 256 x 144] super-blocks, Q6_K's x 210);
  // the first part's for a Linear of parts.
  const Tensor& values() const {
    if (!parts.empty()) return parts[0].values();
    return fp8 ? fp8->values
           : q8 ? q8->values
           : q4 ? q4->values
           : q4k ? q4k->blocks
           : q5k ? q5k->blocks
           : q6k ? q6k->blocks
                 : weight;
  }
  int64_t out_features() const {
    int64_t n = 0;
    for (const Linear& p : parts) n += p.out_features();
    return parts.empty() ? values().size(0) : n;
  }
  int64_t in_features() const {
    return !parts.empty() ? parts[0].in_features()
           : q4           ? q4->values.size(1) * 2
           : q4k          ? q4k->blocks.size(1) / 144 * 256
           : q5k          ? q5k->blocks.size(1) / 176 * 256
           : q6k          ? q6k->blocks.size(1) / 210 * 256
                          : values().size(1);
  }
  // Bytes of the weight (values and scales) and the bias.
  int64_t nbytes() const;
  Tensor operator()(const Tensor& x) const;
};

struct AttentionWeights {
  Linear qkv;     // [q_size + 2 kv_size, H]: q rows, then k, then v
  Linear o;       // [H, q_size]
  Tensor q_norm;  // [head_dim] (Qwen3; undefined otherwise)
  Tensor k_norm;
};

struct MlpWeights {
  Linear gate_up;  // [2I, H]: gate rows, then up rows
  Linear down;     // [H, I]
};

struct MoeWeights {
  Tensor router;   // [E, H]
  Tensor gate_up;  // [E, 2I, H]; undefined when the experts are in a block format
  Tensor down;     // [E, H, I]; undefined when the experts are in a block format
  // FP8 experts: the scales of gate_up [E, 2I / bn, H / bk] and down [E, H / bn, I / bk] (f32).
  std::optional<Tensor> gate_up_scales, down_scales;
  // Experts in block formats, stacked (moe_forward's BlockExperts: a GGUF file's Q8_0 / Q4_0 / Q4_K experts as
  // stored, and on the CPU Q5_K / Q6_K ones, or ModelOptions::quant's); gate_up and down are undefined then.
  std::optional<BlockExperts> blocks;
  bool block_experts() const { return blocks.has_value(); }
};

struct LayerWeights {
  Tensor input_norm;  // [H]
  Tensor post_norm;   // [H]
  AttentionWeights attn;
  std::optional<MlpWeights> mlp;  // dense layers
  std::optional<MoeWeights> moe;  // sparse layers
};

struct ModelWeights {
  Tensor embed;       // [V, H]
  Tensor final_norm;  // [H]
  Linear lm_head;     // [V, H]; shares embed's storage when the embeddings are tied
  std::vector<LayerWeights> layers;
  int64_t bytes = 0;  // bytes held (tied tensors once)
};

// A weight stored in one of llama.cpp's block formats that kiln multiplies in place: "q8_0", "q4_0", "q4_k",
// "q5_k" or "q6_k", its bytes as ggml lays them out, uint8 [rows, bytes per row] (a CPU view of the file).
struct BlockTensor {
  std::string format;
  Tensor data;
};

// Where named tensors come from: a checkpoint on disk, or tensors in memory (presets, tests). get() returns
// the tensor as stored (a CPU view for a checkpoint); blocks() the stored blocks of a block-quantised 2-d
// weight of a kept format (GGUF), or nothing.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual std::vector<std::string> names() const = 0;
  virtual bool contains(const std::string& name) const = 0;
  virtual Tensor get(const std::string& name) const = 0;
  virtual std::string describe() const = 0;  // for errors: the checkpoint's path, or "in-memory weights"
  virtual std::optional<BlockTensor> blocks(const std::string&) const { return std::nullopt; }
  // The shape and dtype get() returns and the bytes stored, without reading the data (the default asks get()).
  struct Meta {
    Shape shape;
    DType dtype;
    int64_t stored_bytes;
  };
  virtual Meta meta(const std::string& name) const {
    const Tensor t = get(name);
    return {t.sizes(), t.dtype(), static_cast<int64_t>(t.nbytes())};
  }
};

// Named tensors held in memory.
class MapWeightSource : public WeightSource {
 public:
  explicit MapWeightSource(std::map<std::string, Tensor> tensors, std::string what = "in-memory weights")
      : tensors_(std::move(tensors)), what_(std::move(what)) {}
  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override { return tensors_.count(name) != 0; }
  Tensor get(const std::string& name) const override;
  std::string describe() const override { return what_; }

 private:
  std::map<std::string, Tensor> tensors_;
  std::string what_;
};

struct LoadOptions {
  Device device = kCPU;
  // The dtype of every floating weight that is not kept in FP8 (norms included); nullopt: as stored.
  std::optional<DType> dtype;
  // FP8 checkpoints: keep the weights in FP8 with their scales (true) or dequantise them to `dtype` (false).
  bool keep_fp8 = true;
  // Linear weights the source has in a kept block format (WeightSource::blocks: GGUF's Q8_0, Q4_0, Q4_K, and
  // Q5_K / Q6_K on the CPU) become Q8Weight / Q4Weight / Q4KWeight / Q5KWeight / Q6KWeight from their stored bytes; a stacked
  // weight (q/k/v, gate/up) whose parts have different kept formats keeps each (Linear::parts); the others are
  // dequantised as usual. MoE experts too (MoeWeights::blocks).
  bool keep_blocks = false;
  // Called after each tensor is placed: (bytes done, bytes in all).
  std::function<void(int64_t, int64_t)> progress;
};

// Builds the model's weights, checking that every expected tensor is present with the expected shape and a
// usable dtype; missing and unexpected tensors are reported by name in one error.
ModelWeights load_weights(const ModelConfig& config, const WeightSource& source, const LoadOptions& options = {});

// Whether `weight_name` (a Hugging Face tensor name) is a linear weight that `kiln quantize` stores in a block
// format: every *_proj.weight of the layers except the MoE experts' (the router is mlp.gate). Its values are
// stored under the name, its f16 scales under name + "_scales" (docs/quantization.md).
bool is_block_quantized_weight(const std::string& weight_name);

// The Hugging Face names and shapes a checkpoint of `config` holds (per-expert names for MoE layers; the
// weight_scale_inv tensors of FP8 checkpoints included). Used by the loader's checks, by kiln's writer of
// random checkpoints and by tests.
std::vector<std::pair<std::string, Shape>> expected_tensors(const ModelConfig& config);

}  // namespace kiln::llm
