// kiln/nn.h: linear, softmax, norms, RoPE, activations, top-k and sampling, attention and the KV cache,
// grouped products and mixture-of-experts, FP8. Functions torch also has keep torch's names and arguments
// (kiln.nn.functional adds torch.nn.functional's spellings in Python); kiln's own ops keep kiln's.
#include "kiln_py.h"

namespace kiln::py {

namespace {

ScaleRecipe parse_recipe(std::string_view s) {
  if (s == "tensorwise" || s == "tensor") return ScaleRecipe::TensorWise;
  if (s == "rowwise" || s == "row") return ScaleRecipe::RowWise;
  if (s == "blockwise" || s == "block") return ScaleRecipe::BlockWise;
  throw nb::value_error(str("unknown scale recipe '", s, "' (tensorwise, rowwise or blockwise)").c_str());
}

// torch._scaled_mm infers the recipe from the scales' shapes: one element each is tensor-wise, [M, 1] and
// [1, N] row-wise, anything else block-wise (kiln's 1 x 128 and 128 x 128 blocks).
ScaleRecipe infer_recipe(const Tensor& a, const Tensor& b, const Tensor& sa, const Tensor& sb) {
  if (sa.numel() == 1 && sb.numel() == 1) return ScaleRecipe::TensorWise;
  if (sa.dim() == 2 && sb.dim() == 2 && sa.size(1) == 1 && sb.size(0) == 1 && sa.size(0) == a.size(0) &&
      sb.size(1) == b.size(1))
    return ScaleRecipe::RowWise;
  return ScaleRecipe::BlockWise;
}

SamplingParams sampling(double temperature, int64_t top_k, double top_p, double min_p) {
  return SamplingParams{temperature, top_k, top_p, min_p};
}

}  // namespace

void bind_nn(nb::module_& m, nb::module_& F) {
  auto cls = nb::borrow<nb::class_<Tensor>>(tensor_type());

  // ---- Linear layers ------------------------------------------------------------------------------------
  nb::class_<Fp8Weight>(m, "Fp8Weight",
                        "A linear layer's FP8 weight [N, K] with its scales: tensorwise (one), rowwise ([N]) or "
                        "blockwise ([ceil(N/block_n), ceil(K/block_k)], checkpoints' weight_scale_inv).")
      .def("__init__", [](Fp8Weight* w, const Tensor& values, const Tensor& scales, std::string_view recipe,
                          int64_t block_n, int64_t block_k) {
        new (w) Fp8Weight{values, scales, parse_recipe(recipe), block_n, block_k};
      }, nb::arg("values"), nb::arg("scales"), nb::arg("recipe") = "blockwise", nb::arg("block_n") = 128,
         nb::arg("block_k") = 128)
      .def_ro("values", &Fp8Weight::values)
      .def_ro("scales", &Fp8Weight::scales)
      .def_prop_ro("recipe", [](const Fp8Weight& w) { return scale_recipe_name(w.recipe); })
      .def_ro("block_n", &Fp8Weight::block_n)
      .def_ro("block_k", &Fp8Weight::block_k);
  nb::class_<Q8Weight>(m, "Q8Weight",
                       "A linear layer's weight [N, K] in Q8_0 (llama.cpp's format): values int8 [N, K] and one f16 "
                       "scale per block of 32 along K, scales [N, K / 32]. Made by quantize_q8_0.")
      .def("__init__", [](Q8Weight* w, const Tensor& values, const Tensor& scales) {
        // The dot products take |q| <= 127 (the format's range; -128 would not negate).
        if (values.dtype() == DType::I8 && values.numel() > 0)
          KILN_CHECK(amin(values).to(DType::I32).item<int32_t>() >= -127, "Q8Weight: values must lie in [-127, 127]");
        new (w) Q8Weight{values, scales};
      }, nb::arg("values"), nb::arg("scales"))
      .def_ro("values", &Q8Weight::values)
      .def_ro("scales", &Q8Weight::scales);
  m.def("quantize_q8_0", &quantize_q8_0, nb::arg("weight"), release_gil(),
        "Q8_0 of a float weight [N, K] (K a multiple of 32): per block of 32, scale = max|w| / 127 (f16), "
        "values = round(w / scale).");
  m.def("dequantize_q8_0", &dequantize_q8_0, nb::arg("weight"), nb::arg("dtype") = DType::F32, release_gil(),
        "values x scales [N, K] in dtype.");
  nb::class_<Q4Weight>(m, "Q4Weight",
                       "A linear layer's weight [N, K] in Q4_0 (llama.cpp's format): values uint8 [N, K / 2] (two "
                       "4-bit codes a byte, codes j and j + 16 of a block in byte j's low and high nibble), one f16 "
                       "scale per block of 32, value = (code - 8) x scale. Made by quantize_q4_0.")
      .def("__init__", [](Q4Weight* w, const Tensor& values, const Tensor& scales) { new (w) Q4Weight{values, scales}; },
           nb::arg("values"), nb::arg("scales"))
      .def_ro("values", &Q4Weight::values)
      .def_ro("scales", &Q4Weight::scales);
  m.def("quantize_q4_0", &quantize_q4_0, nb::arg("weight"), release_gil(),
        "Q4_0 of a float weight [N, K] (K a multiple of 32): per block of 32, the value m of largest magnitude, "
        "scale = m / -8 (f16), code = min(15, trunc(w / scale + 8.5)).");
  m.def("dequantize_q4_0", &dequantize_q4_0, nb::arg("weight"), nb::arg("dtype") = DType::F32, release_gil(),
        "(codes - 8) x scales [N, K] in dtype.");
  nb::class_<Q4KWeight>(m, "Q4KWeight",
                        "A linear layer's weight [N, K] in Q4_K (llama.cpp's format, GGUF's bytes): blocks uint8 "
                        "[N, K / 256 x 144], each 144 bytes f16 d and dmin, eight 6-bit (scale, min) pairs and 256 "
                        "4-bit codes; value = d scale q - dmin min. Made by quantize_q4_k.")
      .def("__init__", [](Q4KWeight* w, const Tensor& blocks) { new (w) Q4KWeight{blocks}; }, nb::arg("blocks"))
      .def_ro("blocks", &Q4KWeight::blocks);
  m.def("quantize_q4_k", &quantize_q4_k, nb::arg("weight"), release_gil(),
        "Q4_K of a float weight [N, K] (K a multiple of 256) with llama.cpp's reference quantiser.");
  m.def("dequantize_q4_k", &dequantize_q4_k, nb::arg("weight"), nb::arg("dtype") = DType::F32, release_gil(),
        "d scale q - dmin min [N, K] in dtype.");
  nb::class_<Q5KWeight>(m, "Q5KWeight",
                        "A linear layer's weight [N, K] in Q5_K (llama.cpp's format, GGUF's bytes): blocks uint8 "
                        "[N, K / 256 x 176], Q4_K's super-block with 32 bytes of fifth bits before the codes; value = "
                        "d scale q - dmin min, q 0..31. Read from GGUF files.")
      .def("__init__", [](Q5KWeight* w, const Tensor& blocks) { new (w) Q5KWeight{blocks}; }, nb::arg("blocks"))
      .def_ro("blocks", &Q5KWeight::blocks);
  m.def("dequantize_q5_k", &dequantize_q5_k, nb::arg("weight"), nb::arg("dtype") = DType::F32, release_gil(),
        "d scale q - dmin min [N, K] in dtype.");
  nb::class_<Q6KWeight>(m, "Q6KWeight",
                        "A linear layer's weight [N, K] in Q6_K (llama.cpp's format, GGUF's bytes): blocks uint8 "
                        "[N, K / 256 x 210], each 128 bytes of low 4 bits, 64 of high 2-bit pairs, 16 int8 scales "
                        "(one per 16 values) and f16 d; value = d scale (code - 32). Read from GGUF files.")
      .def("__init__", [](Q6KWeight* w, const Tensor& blocks) { new (w) Q6KWeight{blocks}; }, nb::arg("blocks"))
      .def_ro("blocks", &Q6KWeight::blocks);
  m.def("dequantize_q6_k", &dequantize_q6_k, nb::arg("weight"), nb::arg("dtype") = DType::F32, release_gil(),
        "d scale (code - 32) [N, K] in dtype.");
  for (nb::module_* mod : {&m, &F}) {
    mod->def("linear", [](const Tensor& x, const Q5KWeight& w, std::optional<Tensor> b) { return linear(x, w, b); },
             nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none(), release_gil(),
             "input @ dequant(weight).T + bias for a Q5_K weight (as for Q6_K).");
    mod->def("linear", [](const Tensor& x, const Q6KWeight& w, std::optional<Tensor> b) { return linear(x, w, b); },
             nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none(), release_gil(),
             "input @ dequant(weight).T + bias for a Q6_K weight (CPU: int8 dot products on the input quantised "
             "per block of 32; CUDA: the weight dequantised for each call).");
    mod->def("linear", [](const Tensor& x, const Q4KWeight& w, std::optional<Tensor> b) { return linear(x, w, b); },
             nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none(), release_gil(),
             "input @ dequant(weight).T + bias for a Q4_K weight (as for Q8_0).");
    mod->def("linear", [](const Tensor& x, const Q8Weight& w, std::optional<Tensor> b) { return linear(x, w, b); },
             nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none(), release_gil(),
             "input @ dequant(weight).T + bias for a Q8_0 weight (CPU: int8 dot products on the input quantised "
             "per block of 32; CUDA: the same up to 32 rows, dequantised slices above).");
    mod->def("linear", [](const Tensor& x, const Q4Weight& w, std::optional<Tensor> b) { return linear(x, w, b); },
             nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none(), release_gil(),
             "input @ dequant(weight).T + bias for a Q4_0 weight (as for Q8_0).");
    mod->def("linear", [](const Tensor& x, const Tensor& w, std::optional<Tensor> b) { return linear(x, w, b); },
             nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none(), release_gil(),
             "input @ weight.T + bias: weight [N, K], f32/f16/bf16 with f32 accumulation.");
    mod->def("linear", [](const Tensor& x, const Fp8Weight& w, std::optional<Tensor> b) { return linear(x, w, b); },
             nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none(), release_gil(),
             "input @ dequant(weight).T + bias for an FP8 weight (dequantised exactly, on the fly).");
  }
  m.def("linear_silu_and_mul", &linear_silu_and_mul, nb::arg("input"), nb::arg("weight"), release_gil(),
        "silu_and_mul(linear(input, weight)) with weight [2I, K] (gate rows, then up rows).");
  m.def("silu_and_mul", &silu_and_mul, nb::arg("input"), release_gil(),
        "silu(x[..., :I]) * x[..., I:] for x [..., 2I], computed in f32.");

  // ---- Softmax, norms, RoPE -----------------------------------------------------------------------------
  for (const bool log : {false, true}) {
    auto f = [log](const Tensor& x, int64_t dim, std::optional<DType> dtype) {
      return log ? log_softmax(x, dim, dtype) : softmax(x, dim, dtype);
    };
    const char* name = log ? "log_softmax" : "softmax";
    m.def(name, f, nb::arg("input"), nb::arg("dim"), nb::arg("dtype") = nb::none(), release_gil(),
          "Along `dim`, computed in f32 (f64 for f64 input); output in `dtype` or the input's.");
    cls.def(name, f, nb::arg("dim"), nb::arg("dtype") = nb::none(), release_gil());
  }
  m.def("rms_norm", &rms_norm, nb::arg("input"), nb::arg("weight"), nb::arg("eps"), release_gil(),
        "input * rsqrt(mean(input**2, -1) + eps) * weight over the last dim, computed in f32.");
  m.def("add_rms_norm", [](const Tensor& x, Tensor& residual, const Tensor& w, double eps) {
    return add_rms_norm(x, residual, w, eps);
  }, nb::arg("input"), nb::arg("residual"), nb::arg("weight"), nb::arg("eps"), release_gil(),
     "residual += input (in place), then rms_norm(residual, weight, eps): a pre-norm block's step.");
  m.def("rope_", [](Tensor& q, Tensor& k, const Tensor& pos, const Tensor& inv_freq, double scaling) {
    rope_(q, k, pos, inv_freq, scaling);
  }, nb::arg("q"), nb::arg("k"), nb::arg("positions"), nb::arg("inv_freq"), nb::arg("attention_scaling") = 1.0,
     release_gil(), "Rotary embedding in place (Hugging Face's rotate_half layout): q [T, Hq, D], k [T, Hk, D].");
  m.def("rope_", [](Tensor& q, Tensor& k, const Tensor& pos, double theta) { rope_(q, k, pos, theta); }, nb::arg("q"),
        nb::arg("k"), nb::arg("positions"), nb::arg("theta"), release_gil());
  m.def("rope_inv_freq", [](int64_t rotary_dim, double theta, std::optional<Device> d) {
    return rope_inv_freq(rotary_dim, theta, d.value_or(kCPU));
  }, nb::arg("rotary_dim"), nb::arg("theta"), nb::kw_only(), nb::arg("device") = nb::none(), release_gil());

  // ---- Top-k and sampling -------------------------------------------------------------------------------
  auto topk_f = [](const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
    if ((dim != -1 && dim != x.dim() - 1) || !largest || !sorted)
      throw Error("topk: kiln takes the k largest along the last dim, sorted (dim=-1, largest=True, sorted=True)");
    return topk(x, k);
  };
  m.def("topk", topk_f, nb::arg("input"), nb::arg("k"), nb::arg("dim") = -1, nb::arg("largest") = true,
        nb::arg("sorted") = true, release_gil(), "(values, indices) of the k largest along the last dim (k <= 64).");
  cls.def("topk", topk_f, nb::arg("k"), nb::arg("dim") = -1, nb::arg("largest") = true, nb::arg("sorted") = true,
          release_gil());
  m.def("sample", [](const Tensor& logits, double temperature, int64_t top_k, double top_p, double min_p,
                     std::optional<Generator*> gen) {
    return sample(logits, sampling(temperature, top_k, top_p, min_p), gen ? *gen : nullptr);
  }, nb::arg("logits"), nb::kw_only(), nb::arg("temperature") = 1.0, nb::arg("top_k") = 0, nb::arg("top_p") = 1.0,
     nb::arg("min_p") = 0.0, nb::arg("generator") = nb::none(), release_gil(),
     "One token id per row of logits [B, V] or [V]: temperature (0: greedy), then top_k, top_p and min_p filters, "
     "drawn from the generator's Philox stream on the logits' device.");
  m.def("sample", [](const Tensor& logits, double temperature, int64_t top_k, double top_p, double min_p, uint64_t seed,
                     const Tensor& offset) {
    return sample(logits, sampling(temperature, top_k, top_p, min_p), seed, offset);
  }, nb::arg("logits"), nb::kw_only(), nb::arg("temperature") = 1.0, nb::arg("top_k") = 0, nb::arg("top_p") = 1.0,
     nb::arg("min_p") = 0.0, nb::arg("seed"), nb::arg("offset"), release_gil(),
     "The same draw with its Philox offset held in a one-element int64 tensor on the device, incremented there "
     "(a step captured in a CUDA graph draws anew on each replay).");

  m.def("sampling_probs", [](const Tensor& logits, double temperature, int64_t top_k, double top_p, double min_p) {
    return sampling_probs(logits, sampling(temperature, top_k, top_p, min_p));
  }, nb::arg("logits"), nb::kw_only(), nb::arg("temperature") = 1.0, nb::arg("top_k") = 0, nb::arg("top_p") = 1.0,
     nb::arg("min_p") = 0.0, release_gil(),
     "The distribution sample() draws each row from, as float32 probabilities of logits' shape (0 outside the "
     "kept tokens; temperature 0: 1 on the argmax). Computed on the CPU, returned on logits' device.");

  // ---- Attention ----------------------------------------------------------------------------------------
  for (nb::module_* mod : {&m, &F}) {
    mod->def("scaled_dot_product_attention", [](const Tensor& q, const Tensor& k, const Tensor& v,
                                                std::optional<Tensor> mask, double dropout_p, bool is_causal,
                                                std::optional<double> scale, bool enable_gqa) {
      KILN_CHECK(dropout_p == 0.0, "scaled_dot_product_attention: dropout_p must be 0 (kiln is for inference), got ",
                 dropout_p);
      return scaled_dot_product_attention(q, k, v, mask, is_causal, scale, enable_gqa);
    }, nb::arg("query"), nb::arg("key"), nb::arg("value"), nb::arg("attn_mask") = nb::none(),
       nb::arg("dropout_p") = 0.0, nb::arg("is_causal") = false, nb::kw_only(), nb::arg("scale") = nb::none(),
       nb::arg("enable_gqa") = false, release_gil(),
       "torch.nn.functional.scaled_dot_product_attention without dropout: q [..., Hq, Lq, D], k [..., Hk, Lkv, D], "
       "v [..., Hv, Lkv, Dv]; batch dims broadcast; a bool mask attends where true, a float mask is added.");
  }
  m.def("decode_attention", &decode_attention, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("lengths"),
        nb::arg("scale") = nb::none(), release_gil(),
        "Attention of q [B, Hq, Lq, D] over KV caches [B, Hkv, Lmax, D] holding lengths[b] (int32) valid positions, "
        "the new tokens included (bottom-right aligned causal).");
  m.def("kv_cache_append_", &kv_cache_append_, nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("k_new"),
        nb::arg("v_new"), nb::arg("positions"), release_gil(),
        "Writes k_new/v_new [B, Hkv, T, D] into the caches at positions[b] (int32, read on the device).");
  m.def("paged_kv_append_", &paged_kv_append_, nb::arg("k_pool"), nb::arg("v_pool"), nb::arg("k_new"),
        nb::arg("v_new"), nb::arg("slots"), release_gil(),
        "Writes k_new/v_new [T, Hkv, D] into paged pools [NB, S, Hkv, D] at slots[t] = block * S + row (int32).");
  m.def("paged_decode_attention", &paged_decode_attention, nb::arg("q"), nb::arg("k_pool"), nb::arg("v_pool"),
        nb::arg("block_table"), nb::arg("lengths"), nb::arg("scale") = nb::none(), release_gil(),
        "decode_attention over paged pools [NB, S, Hkv, D]: sequence b's cache is the blocks block_table[b] "
        "(int32 [B, W]) in order, lengths[b] <= W * S positions of it valid.");
  m.def("qk_norm_rope_append_", [](Tensor& q, const Tensor& k, const Tensor& v, std::optional<Tensor> q_norm,
                                   std::optional<Tensor> k_norm, double eps, const Tensor& positions,
                                   const Tensor& inv_freq, double attention_scaling, Tensor& k_cache, Tensor& v_cache,
                                   const Tensor& at) {
    qk_norm_rope_append_(q, k, v, q_norm.value_or(Tensor()), k_norm.value_or(Tensor()), eps, positions, inv_freq,
                         attention_scaling, k_cache, v_cache, at);
  }, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("q_norm"), nb::arg("k_norm"), nb::arg("eps"),
     nb::arg("positions"), nb::arg("inv_freq"), nb::arg("attention_scaling"), nb::arg("k_cache"), nb::arg("v_cache"),
     nb::arg("at"), release_gil(),
     "One layer's attention prologue: RMSNorm of q and k (None skips it), RoPE, and the append of k and v to the "
     "caches at slot `at` (int32 [1]); q is overwritten.");

  // ---- Mixture of experts -------------------------------------------------------------------------------
  for (const char* name : {"grouped_mm", "_grouped_mm"}) {
    for (nb::module_* mod : {&m, &F}) {
      if (mod == &F && name[0] == '_') continue;
      mod->def(name, [](const Tensor& a, const Tensor& b, std::optional<Tensor> offs, std::optional<DType> out_dtype) {
        return grouped_mm(a, b, offs, out_dtype);
      }, nb::arg("mat_a"), nb::arg("mat_b"), nb::arg("offs") = nb::none(), nb::kw_only(),
         nb::arg("out_dtype") = nb::none(), release_gil(),
         "torch._grouped_mm: groups of rows (2d x 3d), of columns (3d x 2d) or of K (2d x 2d) by the cumulative "
         "int32 ends in offs, or a batch (3d x 3d).");
    }
  }
  m.def("moe_route", [](const Tensor& x, const Tensor& w, int64_t top_k, bool norm) {
    MoeRouting r = moe_route(x, w, top_k, norm);
    return std::make_pair(r.weights, r.experts);
  }, nb::arg("input"), nb::arg("router_weight"), nb::arg("top_k"), nb::arg("norm_topk_prob"), release_gil(),
     "Qwen3-MoE's router: (weights [T, top_k] in x's dtype, experts [T, top_k] int32).");
  nb::class_<Fp8Experts>(m, "Fp8Experts", "Block-quantised FP8 experts: gate_up [E, 2I, H], down [E, H, I] with f32 "
                                          "scales per block_n x block_k block.")
      .def("__init__", [](Fp8Experts* e, const Tensor& gate_up, const Tensor& gate_up_scales, const Tensor& down,
                          const Tensor& down_scales, int64_t block_n, int64_t block_k) {
        new (e) Fp8Experts{gate_up, gate_up_scales, down, down_scales, block_n, block_k};
      }, nb::arg("gate_up"), nb::arg("gate_up_scales"), nb::arg("down"), nb::arg("down_scales"),
         nb::arg("block_n") = 128, nb::arg("block_k") = 128)
      .def_ro("gate_up", &Fp8Experts::gate_up)
      .def_ro("gate_up_scales", &Fp8Experts::gate_up_scales)
      .def_ro("down", &Fp8Experts::down)
      .def_ro("down_scales", &Fp8Experts::down_scales);
  m.def("moe_forward", [](const Tensor& x, const Tensor& rw, const Tensor& gate_up, const Tensor& down, int64_t top_k,
                          bool norm) { return moe_forward(x, rw, gate_up, down, top_k, norm); },
        nb::arg("input"), nb::arg("router_weight"), nb::arg("experts_gate_up"), nb::arg("experts_down"),
        nb::arg("top_k"), nb::arg("norm_topk_prob"), release_gil(),
        "Qwen3-MoE's sparse block: the weighted sum over each token's top_k experts of down(silu(gate x) * up x).");
  m.def("moe_forward", [](const Tensor& x, const Tensor& rw, const Fp8Experts& e, int64_t top_k, bool norm) {
    return moe_forward(x, rw, e, top_k, norm);
  }, nb::arg("input"), nb::arg("router_weight"), nb::arg("experts"), nb::arg("top_k"), nb::arg("norm_topk_prob"),
     release_gil());
  m.def("dequantize_fp8_experts", &dequantize_fp8_experts, nb::arg("experts"), nb::arg("dtype"), release_gil());
  nb::class_<BlockExperts>(m, "BlockExperts",
                           "Experts in block formats, stacked as GGUF's expert tensors: gate_up [E x 2I, H] (expert e's "
                           "gate rows, then its up rows, from row e x 2I), down [E x H, I]; each a Q8Weight, Q4Weight, "
                           "Q4KWeight, Q5KWeight or Q6KWeight.")
      .def("__init__", [](BlockExperts* e, const BlockWeight& gate_up, const BlockWeight& down, int64_t num_experts) {
        new (e) BlockExperts{gate_up, down, num_experts};
      }, nb::arg("gate_up"), nb::arg("down"), nb::arg("num_experts"))
      .def_ro("gate_up", &BlockExperts::gate_up)
      .def_ro("down", &BlockExperts::down)
      .def_ro("num_experts", &BlockExperts::num_experts);
  m.def("moe_forward", [](const Tensor& x, const Tensor& rw, const BlockExperts& e, int64_t top_k, bool norm) {
    return moe_forward(x, rw, e, top_k, norm);
  }, nb::arg("input"), nb::arg("router_weight"), nb::arg("experts"), nb::arg("top_k"), nb::arg("norm_topk_prob"),
     release_gil());

  // ---- FP8 ----------------------------------------------------------------------------------------------
  m.def("quantize_fp8", [](const Tensor& x, std::string_view recipe, DType fp8_dtype, bool activation, int64_t block) {
    Fp8Tensor q = quantize_fp8(x, parse_recipe(recipe), fp8_dtype, activation, block);
    return std::make_pair(q.values, q.scales);
  }, nb::arg("input"), nb::arg("recipe") = "tensorwise", nb::kw_only(), nb::arg("dtype") = DType::F8E4M3,
     nb::arg("activation") = true, nb::arg("block") = 128, release_gil(),
     "(values, scales) with scale = amax / fp8_max per group: tensorwise, rowwise, or blockwise (1 x block for "
     "activations, block x block for weights).");
  m.def("dequantize_fp8", [](const Tensor& values, const Tensor& scales, std::string_view recipe, DType dtype,
                             bool activation, int64_t block) {
    return dequantize_fp8(Fp8Tensor{values, scales}, parse_recipe(recipe), dtype, activation, block);
  }, nb::arg("values"), nb::arg("scales"), nb::arg("recipe") = "tensorwise", nb::kw_only(),
     nb::arg("dtype") = DType::F32, nb::arg("activation") = true, nb::arg("block") = 128, release_gil());
  m.def("scaled_mm", [](const Tensor& a, const Tensor& b, const Tensor& sa, const Tensor& sb, std::optional<Tensor> bias,
                        std::optional<DType> out_dtype, std::optional<std::string_view> recipe) {
    const ScaleRecipe r = recipe ? parse_recipe(*recipe) : infer_recipe(a, b, sa, sb);
    return scaled_mm(a, b, sa, sb, r, bias, out_dtype.value_or(DType::BF16));
  }, nb::arg("mat_a"), nb::arg("mat_b"), nb::arg("scale_a"), nb::arg("scale_b"), nb::arg("bias") = nb::none(),
     nb::kw_only(), nb::arg("out_dtype") = nb::none(), nb::arg("recipe") = nb::none(), release_gil(),
     "(a * scale_a) @ (b * scale_b) + bias for float8 a [M, K] and b [K, N], as torch._scaled_mm; the recipe "
     "follows the scales' shapes unless given.");
  m.def("_scaled_mm", [](const Tensor& a, const Tensor& b, const Tensor& sa, const Tensor& sb, std::optional<Tensor> bias,
                         std::optional<Tensor> scale_result, std::optional<DType> out_dtype, bool use_fast_accum) {
    KILN_CHECK(!scale_result, "_scaled_mm: scale_result is not supported");
    (void)use_fast_accum;  // kiln always accumulates in f32
    return scaled_mm(a, b, sa, sb, infer_recipe(a, b, sa, sb), bias, out_dtype.value_or(DType::BF16));
  }, nb::arg("mat_a"), nb::arg("mat_b"), nb::arg("scale_a"), nb::arg("scale_b"), nb::arg("bias") = nb::none(),
     nb::arg("scale_result") = nb::none(), nb::arg("out_dtype") = nb::none(), nb::arg("use_fast_accum") = false,
     release_gil(), "torch._scaled_mm's signature (out_dtype defaults to bfloat16).");

  // ---- torch.nn.functional's activations ----------------------------------------------------------------
  for (const char* name : {"relu", "silu", "sigmoid", "tanh"}) {
    Tensor (*f)(const Tensor&) = name[0] == 'r' ? &relu : name[1] == 'i' && name[2] == 'l' ? &silu
                                : name[1] == 'i' ? &sigmoid : &tanh;
    Tensor& (*fi)(Tensor&) = name[0] == 'r' ? &relu_ : name[1] == 'i' && name[2] == 'l' ? &silu_
                            : name[1] == 'i' ? &sigmoid_ : &tanh_;
    F.def(name, [f, fi](Tensor& x, bool inplace) { return inplace ? fi(x) : f(x); }, nb::arg("input"),
          nb::arg("inplace") = false, release_gil());
  }
  F.def("gelu", [](const Tensor& x, std::string_view approximate) { return gelu(x, approximate); }, nb::arg("input"),
        nb::kw_only(), nb::arg("approximate") = "none", release_gil());
}

}  // namespace kiln::py
