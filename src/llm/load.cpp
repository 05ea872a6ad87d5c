// load_model: a Hugging Face model directory (config.json, generation_config.json, safetensors) or a GGUF file
// onto a device, through the weight loader's checks.
#include "kiln/io.h"
#include "kiln/llm/gguf_model.h"
#include "kiln/llm/model.h"
#include "kiln/runtime.h"

namespace kiln::llm {

namespace {

// The tensors of a safetensors checkpoint (single file or shards), as CPU views of the mapped files.
class CheckpointSource : public WeightSource {
 public:
  explicit CheckpointSource(Checkpoint c) : c_(std::move(c)) {}
  std::vector<std::string> names() const override { return c_.names(); }
  bool contains(const std::string& name) const override { return c_.contains(name); }
  Tensor get(const std::string& name) const override { return c_.get(name); }
  std::string describe() const override { return c_.path(); }

 private:
  Checkpoint c_;
};

}  // namespace

Model load_model(const std::string& dir, const ModelOptions& options,
                 const std::function<void(int64_t, int64_t)>& progress) {
  if (is_gguf_file(dir)) {
    GgufFile f = GgufFile::open(dir);
    ModelConfig config = gguf_model_config(f);
    LoadOptions lo;
    lo.device = options.device;
    lo.dtype = options.dtype.value_or(options.device.is_cuda() ? DType::BF16 : DType::F32);
    lo.progress = progress;
    if (options.device.is_cuda()) {
      const int64_t need = gguf_weight_bytes(f, *lo.dtype, options.device);
      const MemoryStats m = memory_stats(options.device);
      const int64_t free_bytes = m.device_total - m.driver_used + (m.reserved - m.allocated);
      KILN_CHECK(need <= free_bytes, dir, ": the weights need ", need / (1 << 20), " MiB on ", options.device.str(),
                 " but only ", free_bytes / (1 << 20), " MiB are free");
    }
    // The linear layers stored in Q8_0, Q4_0, Q4_K, Q5_K or Q6_K (ggml types 8, 2, 12, 13, 14) are read into
    // those formats from the file's blocks as they are (LoadOptions::keep_blocks; q/k/v and gate/up of different
    // formats part by part; the output layer too). The other linear weights of a block-quantised file are
    // dequantised and quantised to Q8_0 when the model is made.
    constexpr uint32_t kQ4_0 = 2, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14;
    ModelOptions mo = options;
    lo.keep_blocks = true;
    if (mo.quant.empty() && f.contains("blk.0.attn_q.weight")) {
      const uint32_t type = f.info("blk.0.attn_q.weight").type;
      if (type == kQ8_0 || type == kQ4_0 || type == kQ4_K || type == kQ5_K || type == kQ6_K) mo.quant = "q8_0";
    }
    const std::unique_ptr<WeightSource> source = gguf_weight_source(std::move(f), config);
    ModelWeights w = load_weights(config, *source, lo);
    return Model(std::move(config), std::move(w), mo);
  }
  ModelConfig config = load_config(dir);
  const CheckpointSource source(Checkpoint::open(dir));
  LoadOptions lo;
  lo.device = options.device;
  lo.dtype = options.dtype.value_or(options.device.is_cuda() ? DType::BF16 : DType::F32);
  lo.keep_fp8 = true;
  lo.progress = progress;
  if (options.device.is_cuda()) {
    // Say before loading when the weights cannot fit, rather than failing halfway.
    int64_t need = 0;
    for (const std::string& n : source.names()) {
      const Tensor t = source.get(n);
      const bool fp8 = t.itemsize() == 1 && config.fp8.has_value();
      // Packed weights (Q8_0 / Q4_0 values and f16 scales, Q4_K blocks) stay as stored.
      const bool packed = (t.dtype() == DType::U8 || t.dtype() == DType::I8 || n.ends_with("_scales")) &&
                          !config.block_quant.empty();
      need += packed ? static_cast<int64_t>(t.nbytes()) : t.numel() * static_cast<int64_t>(fp8 ? 1 : itemsize(*lo.dtype));
    }
    const MemoryStats m = memory_stats(options.device);
    // Free = what the driver does not use, plus what kiln's allocator holds cached but unused.
    const int64_t free_bytes = m.device_total - m.driver_used + (m.reserved - m.allocated);
    KILN_CHECK(need <= free_bytes, dir, ": the weights need ", need / (1 << 20), " MiB on ", options.device.str(), " but only ",
               free_bytes / (1 << 20), " MiB are free (", m.driver_used / (1 << 20), " MiB in use)");
  }
  ModelWeights w = load_weights(config, source, lo);
  // A `kiln quantize` checkpoint: the model treats the rest as that format does (lm_head in Q8_0).
  ModelOptions mo = options;
  if (mo.quant.empty() && !config.block_quant.empty()) mo.quant = config.block_quant;
  return Model(std::move(config), std::move(w), mo);
}

}  // namespace kiln::llm
