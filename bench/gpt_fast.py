#!/usr/bin/env python3
"""Batch-1 decode and prefill of a gpt-fast-style compiled PyTorch model on the presets of `kiln bench --preset`:
the strongest PyTorch peer for batch 1, side by side with kiln on the same GPU.

    python3 bench/gpt_fast.py --preset qwen3-8b [-p 512] [-n 128] [-r 3] [--no-compile] [--json F]
    python3 bench/gpt_fast.py --check [--device cpu]     # the model against transformers' logits (tiny configs)

The model is written in plain PyTorch here (as gpt-fast writes its models): q/k/v stacked into one weight and
gate/up into another, RoPE from precomputed cos/sin, a static KV cache [1, kv heads, max length, head dim] written
at the step's positions, SDPA with grouped-query heads, and for Qwen3-MoE the router's top-k then the chosen
experts' weights gathered and multiplied (gpt-fast's Mixtral path: only the top-k experts are read). The decode
step (one token: the layers, the logits and the greedy argmax) is compiled with torch.compile(mode=
"reduce-overhead", fullgraph=True): inductor's fused kernels replayed as a CUDA graph. Prefill runs eagerly
(MoE prefill loops over the experts hit) unless --compile-prefill.

Weights are random bf16 (N(0, 0.02); norms near 1) at the preset's shapes, as the other side-by-side scripts use.
Prefill = one forward over p random tokens on an empty cache (the last position's logits); decode = n greedy
steps after it; medians over r repeats after warm-ups that include the compilation.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from presets import PRESETS  # the same configs as src/llm/presets.cpp


class Config:
    def __init__(self, d):
        self.H = d["hidden_size"]
        self.I = d.get("intermediate_size", 0)
        self.L = d["num_hidden_layers"]
        self.Hq = d["num_attention_heads"]
        self.Hk = d.get("num_key_value_heads", self.Hq)
        self.D = d.get("head_dim") or self.H // self.Hq
        self.V = d["vocab_size"]
        self.eps = d.get("rms_norm_eps", 1e-6)
        rp = d.get("rope_parameters") or {}
        self.theta = rp.get("rope_theta", d.get("rope_theta", 10000.0))
        self.qk_norm = d["model_type"] in ("qwen3", "qwen3_moe")
        self.tie = d.get("tie_word_embeddings", False)
        self.E = d.get("num_experts", 0) or 0
        self.k = d.get("num_experts_per_tok", 0)
        self.Im = d.get("moe_intermediate_size", 0)
        self.norm_topk = d.get("norm_topk_prob", False)
        step = d.get("decoder_sparse_step", 1) or 1
        dense = set(d.get("mlp_only_layers", []) or [])
        self.moe_layers = {i for i in range(self.L) if self.E > 0 and i not in dense and (i + 1) % step == 0}


def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rotate(x, cos, sin):  # x [B, h, T, D]; cos/sin [T, D] (Hugging Face's rotate_half layout)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, c, max_len, dtype, device):
        super().__init__()
        self.c = c
        self.wqkv = nn.Parameter(torch.empty((c.Hq + 2 * c.Hk) * c.D, c.H, dtype=dtype, device=device))
        self.wo = nn.Parameter(torch.empty(c.H, c.Hq * c.D, dtype=dtype, device=device))
        if c.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(c.D, dtype=dtype, device=device))
            self.k_norm = nn.Parameter(torch.ones(c.D, dtype=dtype, device=device))
        self.register_buffer("k_cache", torch.zeros(1, c.Hk, max_len, c.D, dtype=dtype, device=device))
        self.register_buffer("v_cache", torch.zeros(1, c.Hk, max_len, c.D, dtype=dtype, device=device))

    def forward(self, x, cos, sin, mask, pos):
        c = self.c
        B, T, _ = x.shape
        q, k, v = F.linear(x, self.wqkv).split([c.Hq * c.D, c.Hk * c.D, c.Hk * c.D], dim=-1)
        q = q.view(B, T, c.Hq, c.D)
        k = k.view(B, T, c.Hk, c.D)
        v = v.view(B, T, c.Hk, c.D)
        if c.qk_norm:
            q = rms_norm(q, self.q_norm, c.eps)
            k = rms_norm(k, self.k_norm, c.eps)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        self.k_cache[:, :, pos] = k
        self.v_cache[:, :, pos] = v
        y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True)
        return F.linear(y.transpose(1, 2).reshape(B, T, c.Hq * c.D), self.wo)


class Mlp(nn.Module):
    def __init__(self, c, dtype, device):
        super().__init__()
        self.w13 = nn.Parameter(torch.empty(2 * c.I, c.H, dtype=dtype, device=device))
        self.w2 = nn.Parameter(torch.empty(c.H, c.I, dtype=dtype, device=device))

    def forward(self, x):
        g, u = F.linear(x, self.w13).chunk(2, dim=-1)
        return F.linear(F.silu(g) * u, self.w2)


class Moe(nn.Module):
    def __init__(self, c, dtype, device):
        super().__init__()
        self.c = c
        self.gate = nn.Parameter(torch.empty(c.E, c.H, dtype=dtype, device=device))
        self.w1 = nn.Parameter(torch.empty(c.E, c.Im, c.H, dtype=dtype, device=device))  # gate_proj
        self.w3 = nn.Parameter(torch.empty(c.E, c.Im, c.H, dtype=dtype, device=device))  # up_proj
        self.w2 = nn.Parameter(torch.empty(c.E, c.H, c.Im, dtype=dtype, device=device))  # down_proj

    def route(self, x):  # x [T, H] -> weights [T, k] (x's dtype), experts [T, k]
        p = F.softmax(F.linear(x, self.gate).float(), dim=-1)
        w, idx = torch.topk(p, self.c.k, dim=-1)
        if self.c.norm_topk:
            w = w / w.sum(dim=-1, keepdim=True)
        return w.to(x.dtype), idx

    def forward(self, x):
        B, T, H = x.shape
        x = x.view(-1, H)
        w, idx = self.route(x)
        if x.shape[0] <= 8:
            # gpt-fast's decode path: the chosen experts' weights gathered, [T, k, Im, H], and multiplied.
            x1 = F.silu(torch.einsum("th,tkih->tki", x, self.w1[idx]))
            x3 = torch.einsum("th,tkih->tki", x, self.w3[idx])
            y = torch.einsum("tki,tkhi->tkh", x1 * x3, self.w2[idx])
            out = torch.einsum("tkh,tk->th", y, w)
        else:
            # Prefill: each expert hit, on the rows routed to it.
            out = torch.zeros_like(x, dtype=torch.float32)
            for e in torch.unique(idx).tolist():
                rows, slot = torch.nonzero(idx == e, as_tuple=True)
                xe = x[rows]
                h = F.silu(F.linear(xe, self.w1[e])) * F.linear(xe, self.w3[e])
                out.index_add_(0, rows, (F.linear(h, self.w2[e]) * w[rows, slot, None]).float())
            out = out.to(x.dtype)
        return out.view(B, T, H)


class Block(nn.Module):
    def __init__(self, c, i, max_len, dtype, device):
        super().__init__()
        self.c = c
        self.attn = Attention(c, max_len, dtype, device)
        self.ffn = Moe(c, dtype, device) if i in c.moe_layers else Mlp(c, dtype, device)
        self.n1 = nn.Parameter(torch.ones(c.H, dtype=dtype, device=device))
        self.n2 = nn.Parameter(torch.ones(c.H, dtype=dtype, device=device))

    def forward(self, x, cos, sin, mask, pos):
        h = x + self.attn(rms_norm(x, self.n1, self.c.eps), cos, sin, mask, pos)
        return h + self.ffn(rms_norm(h, self.n2, self.c.eps))


class Transformer(nn.Module):
    def __init__(self, c, max_len, dtype, device):
        super().__init__()
        self.c = c
        self.embed = nn.Parameter(torch.empty(c.V, c.H, dtype=dtype, device=device))
        self.layers = nn.ModuleList(Block(c, i, max_len, dtype, device) for i in range(c.L))
        self.norm = nn.Parameter(torch.ones(c.H, dtype=dtype, device=device))
        self.lm_head = self.embed if c.tie else nn.Parameter(torch.empty(c.V, c.H, dtype=dtype, device=device))
        inv = 1.0 / (c.theta ** (torch.arange(0, c.D, 2, dtype=torch.float64, device=device) / c.D))
        f = torch.outer(torch.arange(max_len, dtype=torch.float64, device=device), inv)
        f = torch.cat((f, f), dim=-1)
        self.register_buffer("cos", f.cos().to(dtype))
        self.register_buffer("sin", f.sin().to(dtype))
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool, device=device)))

    def forward(self, ids, pos, last_only=False):  # ids [1, T], pos [T] -> logits [1, T or 1, V]
        x = F.embedding(ids, self.embed)
        cos, sin, mask = self.cos[pos], self.sin[pos], self.causal[None, None, pos]
        for layer in self.layers:
            x = layer(x, cos, sin, mask, pos)
        x = rms_norm(x, self.norm, self.c.eps)
        if last_only:
            x = x[:, -1:]
        return F.linear(x, self.lm_head).float()

    def init_random(self, seed=0):
        g = torch.Generator(device=self.embed.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if p.dim() == 1:  # norms near 1
                p.data.copy_(1.0 + 0.05 * torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32))
            else:
                p.data.normal_(0.0, 0.02, generator=g)

    def load_hf(self, sd):
        """Copies a transformers state_dict (Qwen3 / Qwen3-MoE / Llama names) into this model's layout."""
        c = self.c
        with torch.no_grad():
            self.embed.copy_(sd["model.embed_tokens.weight"])
            self.norm.copy_(sd["model.norm.weight"])
            if not c.tie:
                self.lm_head.copy_(sd["lm_head.weight"])
            for i, b in enumerate(self.layers):
                p = f"model.layers.{i}."
                b.n1.copy_(sd[p + "input_layernorm.weight"])
                b.n2.copy_(sd[p + "post_attention_layernorm.weight"])
                a = p + "self_attn."
                b.attn.wqkv.copy_(torch.cat([sd[a + "q_proj.weight"], sd[a + "k_proj.weight"], sd[a + "v_proj.weight"]]))
                b.attn.wo.copy_(sd[a + "o_proj.weight"])
                if c.qk_norm:
                    b.attn.q_norm.copy_(sd[a + "q_norm.weight"])
                    b.attn.k_norm.copy_(sd[a + "k_norm.weight"])
                m = p + "mlp."
                if isinstance(b.ffn, Moe):
                    b.ffn.gate.copy_(sd[m + "gate.weight"])
                    if m + "experts.gate_up_proj" in sd:  # fused experts [E, 2Im, H], [E, H, Im]
                        gu = sd[m + "experts.gate_up_proj"]
                        if gu.shape[1] != 2 * c.Im:  # stored [E, H, 2Im]
                            gu = gu.transpose(1, 2)
                        dn = sd[m + "experts.down_proj"]
                        if dn.shape[1] != c.H:
                            dn = dn.transpose(1, 2)
                        b.ffn.w1.copy_(gu[:, :c.Im])
                        b.ffn.w3.copy_(gu[:, c.Im:])
                        b.ffn.w2.copy_(dn)
                    else:
                        for e in range(c.E):
                            q = f"{m}experts.{e}."
                            b.ffn.w1[e].copy_(sd[q + "gate_proj.weight"])
                            b.ffn.w3[e].copy_(sd[q + "up_proj.weight"])
                            b.ffn.w2[e].copy_(sd[q + "down_proj.weight"])
                else:
                    b.ffn.w13.copy_(torch.cat([sd[m + "gate_proj.weight"], sd[m + "up_proj.weight"]]))
                    b.ffn.w2.copy_(sd[m + "down_proj.weight"])


def decode_one(model, tok, pos):  # tok [1, 1], pos [1] -> next greedy token [1, 1]
    return model(tok, pos).argmax(dim=-1)


def check(device):
    """Eager logits against transformers' for tiny configs of each architecture (prefill, then step by step)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    tiny = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, vocab_size=97, rms_norm_eps=1e-6, max_position_embeddings=128, rope_theta=10000.0)
    cases = {"qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], tie_word_embeddings=True),
             "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=False),
             "qwen3_moe": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=8,
                               num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True,
                               decoder_sparse_step=1, mlp_only_layers=[1], tie_word_embeddings=False)}
    worst = 0.0
    for name, extra in cases.items():
        spec = dict(tiny, **extra)
        torch.manual_seed(1)
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**spec), dtype=torch.float32).to(device).eval()
        with torch.no_grad():
            for p in hf.parameters():  # transformers initialises norms to 1 and some weights to 0: draw all
                p.normal_(0.0, 0.15)
            for n, p in hf.named_parameters():
                if n.endswith("norm.weight"):
                    p.add_(1.0)
        ids = torch.randint(0, spec["vocab_size"], (1, 12), device=device)
        with torch.no_grad():
            want = hf(ids).logits.float()
        ours = Transformer(Config(spec), 64, torch.float32, device)
        ours.load_hf(hf.state_dict())
        with torch.no_grad():
            got = ours(ids[:, :5], torch.arange(5, device=device))
            steps = [ours(ids[:, t:t + 1], torch.tensor([t], device=device)) for t in range(5, 12)]
            whole = ours(ids, torch.arange(12, device=device))  # MoE: the per-expert prefill path (> 8 rows)
        got = torch.cat([got] + steps, dim=1)
        err = max(((got - want).abs().max() / want.abs().max()).item(),
                  ((whole - want).abs().max() / want.abs().max()).item())
        worst = max(worst, err)
        print(f"{name}: max |ours - transformers| / max |transformers| = {err:.2e}")
    ok = worst < 1e-4
    print("check: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="run the decode step eagerly")
    ap.add_argument("--compile-prefill", action="store_true")
    ap.add_argument("--check", action="store_true", help="compare with transformers on tiny configs and exit")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.check:
        return check(a.device)
    if not a.preset:
        ap.error("--preset is required (or --check)")
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    c = Config(dict(PRESETS[a.preset]))
    max_len = (a.p + a.n + 8 + 63) // 64 * 64
    model = Transformer(c, max_len, torch.bfloat16, dev).eval()
    model.init_random()
    for p in model.parameters():
        p.requires_grad_(False)
    step = decode_one if a.no_compile else torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)
    prefill = torch.compile(model, dynamic=True) if a.compile_prefill else model
    g = torch.Generator(device=dev).manual_seed(0)

    def run(n):
        prompt = torch.randint(0, c.V, (1, a.p), device=dev, generator=g)
        with torch.inference_mode():
            sync()
            t0 = time.perf_counter()
            tok = prefill(prompt, torch.arange(a.p, device=dev), last_only=True).argmax(dim=-1)
            sync()
            t1 = time.perf_counter()
            pos = torch.tensor([a.p], device=dev)
            for _ in range(n):
                tok = step(model, tok.clone(), pos)
                pos += 1
            sync()
            t2 = time.perf_counter()
        return a.p / (t1 - t0), n / (t2 - t1)

    for _ in range(2):  # compilation and CUDA graph recording
        run(min(a.n, 16))
    pre, dec = [], []
    for _ in range(a.r):
        pp, tg = run(a.n)
        pre.append(pp)
        dec.append(tg)
    res = {"preset": a.preset, "engine": "gpt-fast-style PyTorch" + ("" if a.no_compile else " (torch.compile, "
           "reduce-overhead)"), "torch": torch.__version__, "pp": a.p, "tg": a.n, "pp_tps": pre, "tg_tps": dec,
           "pp_median": statistics.median(pre), "tg_median": statistics.median(dec)}
    if dev.type == "cuda":
        res["peak_allocated"] = torch.cuda.max_memory_allocated()
        res["peak_reserved"] = torch.cuda.max_memory_reserved()
    print(f"{res['engine']} {torch.__version__} {a.preset}: pp{a.p} {res['pp_median']:.1f} t/s, tg{a.n} "
          f"{res['tg_median']:.2f} t/s" + (f", peak allocated {res['peak_allocated'] / 2**30:.2f} GiB" if dev.type == "cuda" else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
