"""Writes the GGUF test files of tests/data/gguf/ with llama.cpp's gguf-py, as its convert_hf_to_gguf.py would:
tensor names from gguf-py's own name map, Llama's q/k rows permuted per head, experts stacked [E, rows, cols],
1-d tensors kept in F32, metadata under llama.cpp's keys.

- models/<name>-f32.gguf and models/<name>-q8_0.gguf from tests/data/models/<name> (qwen3-tiny, llama-tiny,
  qwen3-moe-tiny), and models/qwen3-tiny-q4_0.gguf: kiln's GGUF loader must give the safetensors model's
  logits (exactly from f32); models/qwen3-wide-q4_k.gguf (random weights, Q4_K layers, write_q4_k_model);
- tokenizers/qwen2.gguf and tokenizers/llama3.gguf from tests/data/tokenizers/*.json: the tokenizer metadata
  (tokens, token types, merges, pre-tokenizer name, bos/eos, add_bos), which kiln must turn back into the same
  tokenizer.

    pip install gguf safetensors numpy && python3 scripts/make_gguf_models.py"""
import json
import math
import os

import gguf
import numpy as np
from gguf.quants import quantize
from safetensors.numpy import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data")
OUT = os.path.join(DATA, "gguf")
ARCH = {"Qwen3ForCausalLM": ("qwen3", gguf.MODEL_ARCH.QWEN3), "LlamaForCausalLM": ("llama", gguf.MODEL_ARCH.LLAMA),
        "Qwen3MoeForCausalLM": ("qwen3moe", gguf.MODEL_ARCH.QWEN3MOE)}


def permute(w, heads):
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows [2, half] -> [half, 2]."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_model(name, qtype):
    src = os.path.join(DATA, "models", name)
    cfg = json.load(open(os.path.join(src, "config.json")))
    arch, model_arch = ARCH[cfg["architectures"][0]]
    tensors = load_file(os.path.join(src, "model.safetensors"))
    suffix = {gguf.GGMLQuantizationType.F32: "f32", gguf.GGMLQuantizationType.Q8_0: "q8_0",
              gguf.GGMLQuantizationType.Q4_0: "q4_0"}[qtype]
    os.makedirs(os.path.join(OUT, "models"), exist_ok=True)
    w = gguf.GGUFWriter(os.path.join(OUT, "models", f"{name}-{suffix}.gguf"), arch=arch)
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    if "head_dim" in cfg:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    w.add_rope_freq_base(theta)
    if arch == "qwen3moe":
        w.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_file_type(0 if suffix == "f32" else 7)
    if cfg.get("bos_token_id") is not None:
        w.add_bos_token_id(cfg["bos_token_id"])
    eos = cfg.get("eos_token_id")
    if eos is not None:
        w.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type") == "llama3":  # as convert_hf_to_gguf.py: the scaling as per-frequency divisors
        dim = cfg.get("head_dim", cfg["hidden_size"] // heads)
        freqs = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
        old, lo, hi, factor = (rope["original_max_position_embeddings"], rope["low_freq_factor"],
                               rope["high_freq_factor"], rope["factor"])
        factors = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen < old / hi:
                factors.append(1)
            elif wavelen > old / lo:
                factors.append(factor)
            else:
                smooth = (old / wavelen - lo) / (hi - lo)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    names = gguf.get_tensor_name_map(model_arch, cfg["num_hidden_layers"])
    dense_names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg["num_hidden_layers"])
    experts = {}
    out = {}
    for hf, t in tensors.items():
        t = t.astype(np.float32)
        if arch == "llama" and hf.endswith("q_proj.weight"):
            t = permute(t, heads)
        if arch == "llama" and hf.endswith("k_proj.weight"):
            t = permute(t, kv)
        if ".mlp.experts." in hf:  # model.layers.L.mlp.experts.E.gate_proj.weight -> stacked per (L, proj)
            parts = hf.split(".")
            layer, e, proj = parts[2], int(parts[5]), parts[6]
            experts.setdefault((layer, proj), {})[e] = t
            continue
        gname = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if gname is None:  # a dense layer of an MoE model (mlp_only_layers): llama.cpp's qwen3moe has no name for it
            gname = dense_names.get_name(hf, try_suffixes=(".weight", ".bias"))
        out[gname] = t
    for (layer, proj), per in experts.items():
        stacked = np.stack([per[e] for e in sorted(per)])
        out[names.get_name(f"model.layers.{layer}.mlp.experts.{proj}.weight", try_suffixes=(".weight",))] = stacked
    for gname, t in sorted(out.items()):
        if qtype == gguf.GGMLQuantizationType.F32 or t.ndim == 1 or t.shape[-1] % 32:
            w.add_tensor(gname, t)
        else:
            w.add_tensor(gname, quantize(t, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tokenizer(name, pre, add_bos):
    tj = json.load(open(os.path.join(DATA, "tokenizers", f"{name}.json")))
    vocab = dict(tj["model"]["vocab"])
    special = set()
    for a in tj["added_tokens"]:
        vocab[a["content"]] = a["id"]
        if a["special"]:
            special.add(a["id"])
    n = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for t, i in vocab.items():
        tokens[i] = t
        types[i] = gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    os.makedirs(os.path.join(OUT, "tokenizers"), exist_ok=True)
    w = gguf.GGUFWriter(os.path.join(OUT, "tokenizers", f"{name}.gguf"), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    specials = sorted(special)
    w.add_bos_token_id(specials[0])
    w.add_eos_token_id(specials[1] if len(specials) > 1 else specials[0])
    w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_q4_k_model():
    """models/qwen3-wide-q4_k.gguf: a random Qwen3 of hidden size 256 (Q4_K's super-block) whose linear layers are
    Q4_K, quantised by kiln (gguf-py has no Q4_K quantiser; its dequantisation is checked against kiln's here),
    except attn_v in Q8_0 (a stacked q/k/v of mixed formats, as llama.cpp's Q4_K_M files have), and, as those
    files do, the output layer and the last layer's ffn_down in Q6_K (q6_k below; gguf-py has no Q6_K quantiser
    either). Needs the kiln Python module (PYTHONPATH=build/python)."""
    import kiln
    from gguf.quants import dequantize
    rng = np.random.default_rng(11)
    H, I, L, heads, kv, D, V = 256, 512, 2, 4, 2, 64, 384
    w = gguf.GGUFWriter(os.path.join(OUT, "models", "qwen3-wide-q4_k.gguf"), arch="qwen3")
    w.add_block_count(L)
    w.add_context_length(512)
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    w.add_file_type(15)  # MOSTLY_Q4_K_M
    w.add_eos_token_id(2)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def mat(rows, cols):
        return (0.05 * rng.standard_normal((rows, cols))).astype(np.float32)

    def q4_k(t):
        blocks = np.asarray(kiln.quantize_q4_k(kiln.tensor(t)).blocks.numpy())
        assert np.array_equal(dequantize(blocks, gguf.GGMLQuantizationType.Q4_K),
                              kiln.dequantize_q4_k(kiln.Q4KWeight(kiln.tensor(blocks))).numpy())
        return blocks

    def q6_k(t):
        """A plain Q6_K quantiser: per 16 values a scale of max|x| / 31 (codes 32 +- 31), the 16 scales of a
        super-block as int8 steps of d = their largest / 127; packed in ggml's block_q6_K layout."""
        rows, cols = t.shape
        x = t.reshape(rows, cols // 256, 256).astype(np.float32)
        g = x.reshape(rows, cols // 256, 16, 16)
        gs = np.abs(g).max(-1) / 31
        d = (gs.max(-1) / 127).astype(np.float16)
        df = d.astype(np.float32)[..., None]
        sc = np.clip(np.round(np.divide(gs, df, out=np.zeros_like(gs), where=df > 0)), -128, 127).astype(np.int8)
        step = (df * sc.astype(np.float32))[..., None]
        q = np.clip(np.round(np.divide(g, step, out=np.zeros_like(g), where=step > 0)) + 32, 0, 63).astype(np.uint8)
        q = q.reshape(rows, cols // 256, 2, 4, 32)  # half, quarter, l
        ql = np.concatenate([(q[:, :, :, 0] & 15) | ((q[:, :, :, 2] & 15) << 4),
                             (q[:, :, :, 1] & 15) | ((q[:, :, :, 3] & 15) << 4)], axis=-1)  # [.., 2, 64]
        qh = (q[:, :, :, 0] >> 4) | ((q[:, :, :, 1] >> 4) << 2) | ((q[:, :, :, 2] >> 4) << 4) | ((q[:, :, :, 3] >> 4) << 6)
        blocks = np.concatenate([ql.reshape(rows, cols // 256, 128), qh.reshape(rows, cols // 256, 64),
                                 sc.view(np.uint8), d.reshape(rows, cols // 256, 1).view(np.uint8)], axis=-1)
        blocks = blocks.reshape(rows, cols // 256 * 210).astype(np.uint8)
        deq = dequantize(blocks, gguf.GGMLQuantizationType.Q6_K)
        assert np.array_equal(deq, kiln.dequantize_q6_k(kiln.Q6KWeight(kiln.tensor(blocks))).numpy())
        assert np.abs(deq - t).max() <= 0.05 * np.abs(t).max()
        return blocks

    w.add_tensor("token_embd.weight", mat(V, H))
    w.add_tensor("output_norm.weight", norm(H))
    w.add_tensor("output.weight", q6_k(mat(V, H)), raw_dtype=gguf.GGMLQuantizationType.Q6_K)
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(H))
        w.add_tensor(p + "ffn_norm.weight", norm(H))
        w.add_tensor(p + "attn_q_norm.weight", norm(D))
        w.add_tensor(p + "attn_k_norm.weight", norm(D))
        w.add_tensor(p + "attn_q.weight", q4_k(mat(heads * D, H)), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        w.add_tensor(p + "attn_k.weight", q4_k(mat(kv * D, H)), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        w.add_tensor(p + "attn_v.weight", quantize(mat(kv * D, H), gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(p + "attn_output.weight", q4_k(mat(H, heads * D)), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        w.add_tensor(p + "ffn_gate.weight", q4_k(mat(I, H)), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        w.add_tensor(p + "ffn_up.weight", q4_k(mat(I, H)), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        if i == L - 1:
            w.add_tensor(p + "ffn_down.weight", q6_k(mat(H, I)), raw_dtype=gguf.GGMLQuantizationType.Q6_K)
        else:
            w.add_tensor(p + "ffn_down.weight", q4_k(mat(H, I)), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    for name in ("qwen3-tiny", "llama-tiny", "qwen3-moe-tiny"):
        write_model(name, gguf.GGMLQuantizationType.Q8_0)
    write_model("qwen3-tiny", gguf.GGMLQuantizationType.F32)
    write_model("qwen3-tiny", gguf.GGMLQuantizationType.Q4_0)
    write_model("llama-tiny", gguf.GGMLQuantizationType.F32)
    write_q4_k_model()
    write_tokenizer("qwen2", "qwen2", False)
    write_tokenizer("llama3", "llama-bpe", True)


if __name__ == "__main__":
    main()
