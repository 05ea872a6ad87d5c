#!/usr/bin/env python3
"""Tiny random checkpoints saved by transformers itself, with reference outputs, for the loader and engine
tests (tests/data/models/<name>/):

    config.json, generation_config.json, model.safetensors (or shards + model.safetensors.index.json)
    reference.safetensors   logits [T, V] f32 of every prompt position (transformers, CPU, f32)
    reference.json          {"prompt_ids": [...], "greedy_ids": [...], "transformers": ver, "torch": ver}

Variants cover each architecture kiln runs and the settings that change the forward pass: tied embeddings,
an explicit head_dim != hidden/heads, attention bias, llama3 RoPE scaling, MoE with mlp_only_layers and
decoder_sparse_step, norm_topk_prob false, sharded saving, bf16 storage, and FP8 block quantisation.

    python3 scripts/make_reference.py models     (CPU torch + transformers; a minute)
"""
import json, os, shutil
import torch
import transformers
from safetensors.torch import save_file, load_file
from transformers import AutoConfig, AutoModelForCausalLM

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "models")
VOCAB = 384
PROMPT = [1, 17, 250, 3, 3, 99, 380, 42, 7, 128, 64, 200]
NEW_TOKENS = 12

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1,
              eos_token_id=2, initializer_range=0.15)

VARIANTS = {
    # Qwen3 dense: explicit head_dim (32 != 64 / 4), tied embeddings.
    "qwen3-tiny": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=32,
                       tie_word_embeddings=True, rope_theta=10000.0),
    # Qwen3 dense stored in bf16, untied, with attention bias, saved in shards.
    "qwen3-tiny-bf16-sharded": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=16,
                                    tie_word_embeddings=False, attention_bias=True, rope_theta=1e6,
                                    _dtype=torch.bfloat16, _shard="60KB"),
    # Qwen3-MoE: 8 experts, top 2, renormalised; layer 1 is dense (mlp_only_layers).
    "qwen3-moe-tiny": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_hidden_layers=3,
                           head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                           norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1,
                           tie_word_embeddings=False),
    # Qwen3-MoE without renormalisation, sparse every second layer, top_k = E.
    "qwen3-moe-tiny-step2": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_hidden_layers=4,
                                 head_dim=16, num_experts=4, num_experts_per_tok=4, moe_intermediate_size=24,
                                 norm_topk_prob=False, decoder_sparse_step=2, tie_word_embeddings=False),
    # Llama with llama3 RoPE scaling (Llama 3.1 style), untied.
    "llama-tiny": dict(model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=False,
                       rope_theta=500000.0,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
}


def randomize(model, seed):
    """Every parameter random (norm weights around 1), so no path is tested on zeros or ones."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / fan_in ** 0.5))


def reference(model, out_dir):
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        logits = model(ids).logits[0].float().contiguous()
        gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    greedy = gen[0, len(PROMPT):].tolist()
    # Smallest gap between the two largest logits along the greedy path: a tiny gap means a near-tie that a
    # lower-precision run may resolve differently.
    with torch.no_grad():
        full = model(gen[:, :-1]).logits[0, len(PROMPT) - 1:].float()
    top2 = full.topk(2, dim=-1).values
    gaps = (top2[:, 0] - top2[:, 1]).tolist()
    min_gap = min(gaps)
    # transformers' own bf16 run against this f32 reference: the error a correct bf16 engine can be expected
    # to show (MoE routing amplifies bf16 rounding: ~2e-2 here, against ~1.4e-2 for dense models).
    try:
        bf16 = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16).eval()
        with torch.no_grad():
            lb = bf16(ids).logits[0].float()
        bf16_err = float((lb - logits).norm() / logits.norm())
    except Exception:  # noqa: BLE001  (the FP8 checkpoint needs transformers' GPU FP8 path)
        bf16_err = None
    save_file({"logits": logits}, os.path.join(out_dir, "reference.safetensors"))
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump({"prompt_ids": PROMPT, "greedy_ids": greedy, "min_top2_gap": min_gap, "top2_gaps": gaps,
                   "transformers_bf16_rel_error": bf16_err,
                   "transformers": transformers.__version__, "torch": torch.__version__}, f, indent=1)
    return greedy, min_gap


def fp8_block_quantize(w, block=32):
    """float8_e4m3fn weights with one f32 scale per [block x block] tile (weight_scale_inv = amax / 448)."""
    n, k = w.shape
    nb, kb = (n + block - 1) // block, (k + block - 1) // block
    scales = torch.empty(nb, kb)
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    for i in range(nb):
        for j in range(kb):
            t = w[i * block:(i + 1) * block, j * block:(j + 1) * block].float()
            s = max(t.abs().max().item() / 448.0, 1e-12)
            scales[i, j] = s
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = (t / s).to(torch.float8_e4m3fn)
    return q, scales


def dequantize(q, scales, block=32):
    s = scales.repeat_interleave(block, 0)[: q.shape[0]].repeat_interleave(block, 1)[:, : q.shape[1]]
    return q.float() * s


def main(out_root=None):
    global OUT
    if out_root is not None:
        OUT = os.path.join(str(out_root), "models")
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    summary = {}
    for seed, (name, spec) in enumerate(VARIANTS.items()):
        spec = dict(spec)
        dtype = spec.pop("_dtype", torch.float32)
        shard = spec.pop("_shard", None)
        cfg = AutoConfig.for_model(**{**COMMON, **spec})
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        randomize(model, 1000 + seed)
        model = model.to(dtype)
        out_dir = os.path.join(OUT, name)
        shutil.rmtree(out_dir, ignore_errors=True)
        model.save_pretrained(out_dir, max_shard_size=shard) if shard else model.save_pretrained(out_dir)
        # The reference runs a fresh f32 load of what was saved (model.float() would keep buffers such as
        # RoPE's inv_freq at the storage dtype's precision).
        fresh = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
        greedy, gap = reference(fresh, out_dir)
        summary[name] = (greedy, gap)

    # FP8 block-quantised Qwen3: every linear weight of the decoder layers stored as e4m3 with
    # weight_scale_inv per 32x32 block; the reference runs transformers on the dequantised weights in f32.
    name = "qwen3-tiny-fp8"
    cfg = AutoConfig.for_model(**{**COMMON, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                                  "head_dim": 32, "hidden_size": 64, "tie_word_embeddings": False})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    randomize(model, 77)
    out_dir = os.path.join(OUT, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    tensors = {}
    with torch.no_grad():
        for pname, p in model.state_dict().items():
            if p.dim() == 2 and ".layers." in pname and pname.endswith("proj.weight"):
                q, s = fp8_block_quantize(p)
                tensors[pname] = q
                tensors[pname.replace(".weight", ".weight_scale_inv")] = s
                p.copy_(dequantize(q, s))
            else:
                tensors[pname] = p.to(torch.bfloat16).contiguous()
                p.copy_(tensors[pname].float())
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg_dict = json.loads(cfg.to_json_string())
    cfg_dict["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                       "weight_block_size": [32, 32], "modules_to_not_convert": ["lm_head"]}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2)
    model.generation_config.save_pretrained(out_dir)
    summary[name] = reference(model, out_dir)

    for name, (greedy, gap) in summary.items():
        files = sorted(os.listdir(os.path.join(OUT, name)))
        size = sum(os.path.getsize(os.path.join(OUT, name, f)) for f in files)
        print(f"{name:26s} {size / 1024:7.1f} KiB  greedy {greedy}  min top-2 gap {gap:.4f}  {files}")


if __name__ == "__main__":
    main()
