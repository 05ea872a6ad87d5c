#!/usr/bin/env python3
"""Writes tests/data/configs/*.json (config.json files as Hugging Face publishes them, plus variants) and
tests/data/configs/rope_reference.json: the RoPE inv_freq and attention scaling that transformers computes
for each, which tests/io/config_test.cpp compares against kiln's parser.

    python3 scripts/make_reference.py configs     (needs torch and transformers; run where they are installed)
"""
import importlib, json, os, sys
import torch
import transformers
from transformers import AutoConfig

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "configs")

QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
             "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
             "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
             "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
             "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
             "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
             "use_sliding_window": False, "vocab_size": 151936}
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                 "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
                 "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
                 "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
                 "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
                 "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
                 "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
                 "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
                 "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                 "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
LLAMA31_8B = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
              "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
              "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
              "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
              "rms_norm_eps": 1e-05,
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
              "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
              "vocab_size": 128256}
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
              "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
              "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
              "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
              "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32768}

configs = {
    "qwen3-0.6b": QWEN3_06B,
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "llama-3.1-8b": LLAMA31_8B,
    "mistral-7b-v0.3": MISTRAL_7B,
    "qwen3-8b-fp8": {**QWEN3_06B, "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
                     "num_hidden_layers": 36, "tie_word_embeddings": False,
                     "quantization_config": {"activation_scheme": "dynamic", "modules_to_not_convert": ["lm_head"],
                                             "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}},
    "qwen3-yarn": {**QWEN3_06B, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 32768}},
    "qwen3-yarn-mscale": {**QWEN3_06B, "rope_scaling": {"type": "yarn", "factor": 40.0, "mscale": 1.0,
                                                        "mscale_all_dim": 0.707, "beta_fast": 16, "beta_slow": 2,
                                                        "original_max_position_embeddings": 4096}},
    "llama-linear": {**LLAMA31_8B, "rope_scaling": {"type": "linear", "factor": 2.5}},
    "qwen3-rope-parameters": {**{k: v for k, v in QWEN3_06B.items() if k not in ("rope_scaling", "rope_theta")},
                              "rope_parameters": {"rope_theta": 5000000.0, "rope_type": "default"}},
    "qwen3-moe-sparse-step": {**QWEN3_30B_A3B, "num_hidden_layers": 6, "decoder_sparse_step": 2,
                              "mlp_only_layers": [3], "norm_topk_prob": False},
    "llama-head-dim": {**LLAMA31_8B, "head_dim": 96, "rope_scaling": None, "rope_theta": 10000.0},
}

def main(out_root=None):
    out = os.path.join(str(out_root), "configs") if out_root is not None else OUT
    os.makedirs(out, exist_ok=True)
    reference = {"transformers": transformers.__version__, "torch": torch.__version__, "configs": {}}
    for name, cfg in configs.items():
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump(cfg, f, indent=2)
        c = AutoConfig.for_model(**{**cfg, "model_type": cfg["model_type"]})
        # The model's own rotary module, as the model would build it.
        mt = cfg["model_type"]
        module = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
        rotary_cls = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
        rotary = rotary_cls(c)
        reference["configs"][name] = {"rope_type": c.rope_parameters["rope_type"],
                                      "inv_freq": rotary.inv_freq.float().tolist(),
                                      "attention_scaling": float(rotary.attention_scaling)}
    with open(os.path.join(out, "rope_reference.json"), "w") as f:
        json.dump(reference, f)
    print(f"wrote {len(configs)} configs and rope_reference.json to {out}")


if __name__ == "__main__":
    main()
