#!/usr/bin/env python3
"""The PyTorch side of `kiln bench ops`: the same cases (same names, same byte counts) through PyTorch on the
same GPU, timed the same way, written in the same JSON schema.

    python3 bench/torch_ops.py [--json FILE] [--filter REGEX] [--repeats N] [--device cuda:0] [--list]

What runs for each op is what a PyTorch / Hugging Face decode step runs:
  linear          F.linear(x, w, b)
  softmax         torch.softmax / torch.log_softmax over the last dim, output in the input dtype
  rms_norm        the faster (per column) of Hugging Face's Qwen3RMSNorm.forward and F.rms_norm
  add_rms_norm    h = residual + x (as the HF decoder layer does), then the faster of the two norms above
  rope            HF's apply_rotary_pos_emb on q [1, Hq, T, D] and k [1, Hk, T, D] (transposed views of
                  [1, T, H, D], as HF's attention makes them) with cos/sin [1, T, D] precomputed (HF computes
                  them once per forward for all layers, so their cost is left out)
  silu_and_mul    F.silu(gate) * up on the two halves of gate_up
  linear_fp8      no PyTorch op takes bf16 activations with a block-scaled e4m3 weight: the weight dequantised
                  to bf16 (fp8 * the 128 x 128 block scales) then F.linear, what a model runs without FP8 kernels
  linear_q4_k, linear_q8_0
                  no PyTorch op takes llama.cpp's block formats: the weight dequantised to bf16, then F.linear
  scaled_mm       torch._scaled_mm(a, w.t(), scale_a, scale_b, out_dtype=bf16) (b column-major, as PyTorch
                  wants); for M < 16 the rows are padded to 16 (torch._scaled_mm needs multiples of 16)
  sample          temperature 0: torch.argmax; otherwise HF's TemperatureLogitsWarper, TopKLogitsWarper,
                  TopPLogitsWarper (that order), softmax and torch.multinomial
  decode_attention  F.scaled_dot_product_attention(q [1, Hq, 1, D], k, v [1, Hkv, L, D], enable_gqa=True)
  sdpa_prefill    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) (PyTorch picks its
                  fastest backend: flash or cuDNN)
  grouped_mm      torch._grouped_mm(a, w.transpose(-2, -1), offs=offs) (int32 cumulative ends)
  moe             torch_moe below: transformers' grouped_mm experts path (router linear, softmax f32, topk,
                  renormalise, sort tokens by expert, _grouped_mm gate_up, silu * up, _grouped_mm down,
                  weighted index_add)
  linalg          torch.linalg.inv / inv_ex / det / solve (one right-hand vector) / lu_factor / cholesky on
                  well-conditioned input (normal + n I; Cholesky: M M^T + n I). The plain forms synchronise with
                  the host on every call (they check info) and cannot be captured: eager time only, as kiln's are
  bincount, pad, dropout, conv2d/conv3d, layer_norm, group_norm, batch_norm, cross_entropy
                  torch.bincount(minlength=) (eager only: it reads the maximum) and torch.nn.functional's op
                  of that name (dropout in training, eager only), cuDNN's convolutions without TF32
Method (identical to tools/kiln/bench_ops.cpp; docs/benchmarks.md): C = clamp(ceil(4 * L2 / copy_bytes), 2,
max_copies) copies of fresh random inputs; one warm-up call per copy; eager = median over `repeats` batches of
min(C, 64) calls cycling the copies (events around each batch); graph = one torch.cuda.CUDAGraph holding one
call per copy, median over `repeats` replays / C. Everything runs on one side stream under
torch.inference_mode(). A case that raises is reported with an "error" field, not a crash.
"""
import argparse
import json
import math
import re
import sys
import time

torch = None  # imported in main() unless --list: the case table needs no GPU
F = None

EAGER_BATCH = 64
EPS = 1e-6


class Case:
    """name, bytes (inputs read once + outputs written once), copy_bytes (one copy of the inputs),
    max_copies, and make(device) -> {impl name: call} built on one fresh copy of the inputs."""

    def __init__(self, name, nbytes, copy_bytes, max_copies, make, graph=True):
        self.name, self.bytes, self.copy_bytes, self.max_copies, self.make = name, nbytes, copy_bytes, max_copies, make
        self.graph = graph  # False: the op synchronises with the host every call (eager time only)


ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "f64": 8, "c64": 8}


def dt(tag):
    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64,
            "c64": torch.complex64}[tag]


def rnd(shape, tag, dev, std=1.0):
    return torch.empty(shape, dtype=dt(tag), device=dev).normal_(0.0, std)


def hf_rms_norm(x, weight, eps):
    # transformers' Qwen3RMSNorm.forward
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    # transformers' apply_rotary_pos_emb (Llama / Qwen)
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def hf_sample(logits, temperature, top_k, top_p):
    if temperature == 0:
        return torch.argmax(logits, dim=-1)
    scores = logits / temperature  # TemperatureLogitsWarper
    if top_k > 0:  # TopKLogitsWarper
        k = min(top_k, scores.size(-1))
        indices_to_remove = scores < torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(indices_to_remove, -float("inf"))
    if top_p < 1.0:  # TopPLogitsWarper (min_tokens_to_keep 1)
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        sorted_indices_to_remove = cumulative_probs <= (1 - top_p)
        sorted_indices_to_remove[..., -1:] = 0
        indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
        scores = scores.masked_fill(indices_to_remove, -float("inf"))
    probs = F.softmax(scores, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


def torch_moe(x, router_w, gate_up, down, top_k, norm):
    """The sparse MoE block as transformers' grouped_mm experts path computes it (no host sync)."""
    num_experts = router_w.shape[0]
    logits = F.linear(x, router_w)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if norm:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights.to(x.dtype)
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // top_k
    counts = torch.histc(flat.float(), bins=num_experts, min=0, max=num_experts - 1)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    gu = torch._grouped_mm(x[token], gate_up.transpose(-2, -1), offs=offs)
    gate, up = gu.chunk(2, dim=-1)
    h = F.silu(gate) * up
    y = torch._grouped_mm(h, down.transpose(-2, -1), offs=offs)
    y = y * weights.reshape(-1)[order].unsqueeze(-1)
    return torch.zeros_like(x).index_add_(0, token, y)


def torch_moe_fp8_one(x, router_w, gu, gus, dn, dns, top_k, norm, block=128):
    """One token through FP8 block-quantised experts as plain PyTorch does it without custom kernels (no host
    sync): route, gather the selected experts, dequantise them (value x block scale, f32, to bf16), bmm."""
    logits = F.linear(x, router_w)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if norm:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    sel = experts[0]

    def deq(v, s):
        w = v[sel].to(torch.float32)
        sc = s[sel].repeat_interleave(block, 1)[:, : w.shape[1]].repeat_interleave(block, 2)[:, :, : w.shape[2]]
        return (w * sc).to(x.dtype)

    hgu = torch.bmm(deq(gu, gus), x[0].expand(top_k, -1).unsqueeze(-1)).squeeze(-1)
    gate, up = hgu.chunk(2, dim=-1)
    h = F.silu(gate) * up
    y = torch.bmm(deq(dn, dns), h.unsqueeze(-1)).squeeze(-1)
    return (y * weights[0].to(y.dtype).unsqueeze(-1)).sum(0, keepdim=True)


# ---- the case table: keep in step with tools/kiln/bench_ops_cases.cpp -----------------------------------

def linear_case(m, k, n, bias):
    copy_bytes = 2 * (m * k + n * k + (n if bias else 0))

    def make(dev):
        x, w = rnd((m, k), "bf16", dev), rnd((n, k), "bf16", dev, 0.02)
        b = rnd((n,), "bf16", dev, 0.02) if bias else None
        return {"F.linear": lambda: F.linear(x, w, b)}

    return Case(f"linear/bf16/M{m}/K{k}/N{n}" + ("/bias" if bias else ""), copy_bytes + 2 * m * n, copy_bytes, 2048,
                make)


def softmax_case(log, tag, rows, cols):
    copy_bytes = ITEMSIZE[tag] * rows * cols

    def make(dev):
        x = rnd((rows, cols), tag, dev, 4.0)
        if log:
            return {"torch.log_softmax": lambda: torch.log_softmax(x, -1)}
        return {"torch.softmax": lambda: torch.softmax(x, -1)}

    return Case(f"{'log_softmax' if log else 'softmax'}/{tag}/{rows}x{cols}", 2 * copy_bytes, copy_bytes, 256, make)


def rms_norm_case(rows, d):
    copy_bytes = 2 * (rows * d + d)

    def make(dev):
        x, w = rnd((rows, d), "bf16", dev), rnd((d,), "bf16", dev)
        return {"hf": lambda: hf_rms_norm(x, w, EPS), "F.rms_norm": lambda: F.rms_norm(x, (d,), w, EPS)}

    return Case(f"rms_norm/bf16/{rows}x{d}", copy_bytes + 2 * rows * d, copy_bytes, 256, make)


def add_rms_norm_case(rows, d):
    copy_bytes = 2 * (2 * rows * d + d)

    def make(dev):
        x, res, w = rnd((rows, d), "bf16", dev), rnd((rows, d), "bf16", dev), rnd((d,), "bf16", dev)
        return {"hf": lambda: hf_rms_norm(res + x, w, EPS), "F.rms_norm": lambda: F.rms_norm(res + x, (d,), w, EPS)}

    return Case(f"add_rms_norm/bf16/{rows}x{d}", copy_bytes + 2 * 2 * rows * d, copy_bytes, 256, make)


def rope_case(t, hq, hk, d):
    copy_bytes = 2 * t * (hq + hk) * d + 8 * t + 4 * (d // 2)

    def make(dev):
        q = rnd((1, t, hq, d), "bf16", dev).transpose(1, 2)
        k = rnd((1, t, hk, d), "bf16", dev).transpose(1, 2)
        pos = torch.randint(0, 32768, (1, t), device=dev)
        inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.int64, device=dev).float() / d))
        freqs = (inv_freq[None, :, None] @ pos[:, None, :].float()).transpose(1, 2)  # HF's rotary embedding
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
        return {"hf": lambda: apply_rotary_pos_emb(q, k, cos, sin)}

    return Case(f"rope/bf16/T{t}/Hq{hq}/Hk{hk}/D{d}", copy_bytes + 2 * t * (hq + hk) * d, copy_bytes, 256, make)


def launch_case():
    def make(dev):
        x = rnd((1,), "bf16", dev)
        return {"fill_": lambda: x.fill_(1.0)}

    return Case("launch/bf16/fill1", 2, 2, 256, make)


def silu_and_mul_case(inter):
    copy_bytes = 2 * 2 * inter

    def make(dev):
        x = rnd((1, 2 * inter), "bf16", dev)
        return {"F.silu*": lambda: F.silu(x[..., :inter]) * x[..., inter:]}

    return Case(f"silu_and_mul/bf16/M1/I{inter}", copy_bytes + 2 * inter, copy_bytes, 256, make)


def rnd_scales(shape, dev):
    return torch.empty(shape, dtype=torch.float32, device=dev).uniform_(0.005, 0.02)


def linear_fp8_case(m, k, n):
    sk, sn = (k + 127) // 128, (n + 127) // 128
    copy_bytes = 2 * m * k + n * k + 4 * sn * sk

    def make(dev):
        x = rnd((m, k), "bf16", dev)
        w = rnd((n, k), "bf16", dev, 50.0).to(torch.float8_e4m3fn)
        s = rnd_scales((sn, sk), dev)

        def dequant_linear():
            full = s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
            return F.linear(x, (w.to(torch.float32) * full).to(torch.bfloat16))

        return {"dequant+F.linear": dequant_linear}

    return Case(f"linear_fp8/e4m3/M{m}/K{k}/N{n}", copy_bytes + 2 * m * n, copy_bytes, 2048, make)


def linear_quant_case(fmt, m, k, n):
    """kiln's linear(x, Q8Weight | Q4KWeight | Q5KWeight | Q6KWeight). PyTorch has no op for llama.cpp's block
    formats: what a model runs without their kernels, the weight dequantised to bf16 then F.linear (Q8_0: int8
    values x f16 scales per 32; Q4_K / Q5_K: 4-bit codes two a byte (Q5_K: a fifth bit from a byte per 8) with an
    f16 scale and min per 32; Q6_K: low nibbles, high bit pairs, an int8 scale per 16 and an f16 d per 256: the
    layouts' arithmetic without their packing of the scales)."""
    super_bytes = {"q4_k": 144, "q5_k": 176, "q6_k": 210}.get(fmt)
    copy_bytes = 2 * m * k + (n * k // 256 * super_bytes if super_bytes else n * k + n * k // 32 * 2)

    def make(dev):
        x = rnd((m, k), "bf16", dev)
        if fmt == "q8_0":
            v = torch.randint(-127, 128, (n, k), dtype=torch.int8, device=dev)
            d = rnd_scales((n, k // 32), dev).to(torch.float16)

            def dequant_linear():
                w = (v.view(n, k // 32, 32).to(torch.float32) * d.to(torch.float32).unsqueeze(-1)).view(n, k)
                return F.linear(x, w.to(torch.bfloat16))
        elif fmt == "q6_k":
            ql = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)
            qh = torch.randint(0, 256, (n, k // 4), dtype=torch.uint8, device=dev)
            sc = torch.randint(-128, 128, (n, k // 16), dtype=torch.int8, device=dev)
            d = rnd_scales((n, k // 256), dev).to(torch.float16)

            def dequant_linear():
                lo = torch.stack((ql & 15, ql >> 4), dim=-1).view(n, k)
                hi = torch.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], dim=-1).view(n, k)
                q = (lo | (hi << 4)).to(torch.float32) - 32
                f = d.to(torch.float32).repeat_interleave(16, 1) * sc.to(torch.float32)
                w = q.view(n, k // 16, 16) * f.unsqueeze(-1)
                return F.linear(x, w.view(n, k).to(torch.bfloat16))
        else:
            codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)
            fifth = torch.randint(0, 256, (n, k // 8), dtype=torch.uint8, device=dev) if fmt == "q5_k" else None
            d = rnd_scales((n, k // 32), dev).to(torch.float16)
            mn = rnd_scales((n, k // 32), dev).to(torch.float16)

            def dequant_linear():
                q = torch.stack((codes & 15, codes >> 4), dim=-1).view(n, k)
                if fifth is not None:
                    q = q | (torch.stack([(fifth >> s) & 1 for s in range(8)], dim=-1).view(n, k) << 4)
                q = q.view(n, k // 32, 32).to(torch.float32)
                w = q * d.to(torch.float32).unsqueeze(-1) - mn.to(torch.float32).unsqueeze(-1)
                return F.linear(x, w.view(n, k).to(torch.bfloat16))

        return {"dequant+F.linear": dequant_linear}

    return Case(f"linear_{fmt}/bf16/M{m}/K{k}/N{n}", copy_bytes + 2 * m * n, copy_bytes, 512, make)


def scaled_mm_case(row, m, k, n):
    copy_bytes = m * k + n * k + 4 * (m + n if row else 2)

    def make(dev):
        mp = max(m, 16)
        a = torch.zeros((mp, k), dtype=torch.bfloat16, device=dev)
        a[:m] = rnd((m, k), "bf16", dev, 50.0)
        a = a.to(torch.float8_e4m3fn)
        w = rnd((n, k), "bf16", dev, 50.0).to(torch.float8_e4m3fn)
        sa = rnd_scales((mp, 1) if row else (), dev)
        sb = rnd_scales((1, n) if row else (), dev)
        return {"torch._scaled_mm": lambda: torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16)}

    return Case(f"scaled_mm/e4m3/{'row' if row else 'tensor'}/M{m}/K{k}/N{n}", copy_bytes + 2 * m * n, copy_bytes,
                2048, make)


def sample_case(vocab, temperature, top_k, top_p):
    if temperature == 0:
        variant = "greedy"
    else:
        variant = f"t{temperature:g}" + (f"_k{top_k}" if top_k > 0 else "") + (f"_p{top_p:g}" if top_p < 1 else "")
    copy_bytes = 4 * vocab

    def make(dev):
        logits = rnd((1, vocab), "f32", dev, 4.0)
        return {"hf": lambda: hf_sample(logits, temperature, top_k, top_p)}

    return Case(f"sample/f32/1x{vocab}/{variant}", copy_bytes + 8, copy_bytes, 64, make)


def decode_attention_case(hq, hkv, d, l):
    copy_bytes = 2 * (hq * d + 2 * hkv * l * d) + 4

    def make(dev):
        q, k, v = rnd((1, hq, 1, d), "bf16", dev), rnd((1, hkv, l, d), "bf16", dev), rnd((1, hkv, l, d), "bf16", dev)
        return {"F.sdpa(gqa)": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)}

    return Case(f"decode_attention/bf16/Hq{hq}/Hkv{hkv}/D{d}/L{l}", copy_bytes + 2 * hq * d, copy_bytes, 256, make)


def prefill_attention_case(hq, hkv, d, l):
    copy_bytes = 2 * (hq + 2 * hkv) * l * d

    def make(dev):
        q, k, v = rnd((1, hq, l, d), "bf16", dev), rnd((1, hkv, l, d), "bf16", dev), rnd((1, hkv, l, d), "bf16", dev)
        return {"F.sdpa(causal,gqa)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)}

    return Case(f"sdpa_prefill/bf16/Hq{hq}/Hkv{hkv}/D{d}/L{l}/causal", copy_bytes + 2 * hq * l * d, copy_bytes, 16,
                make)


def linalg_case(op, tag, shape):
    n = shape[-1]
    mats = math.prod(shape) // (n * n)
    a_bytes = ITEMSIZE[tag] * mats * n * n
    copy_bytes = a_bytes + (ITEMSIZE[tag] * mats * n if op == "solve" else 0)
    out = {"inv": a_bytes, "inv_ex": a_bytes + 4 * mats, "det": ITEMSIZE[tag] * mats,
           "solve": ITEMSIZE[tag] * mats * n, "lu_factor": a_bytes + 4 * mats * n, "cholesky": a_bytes}[op]

    def make(dev):
        a = torch.randn(shape, dtype=dt(tag), device=dev)
        if op == "cholesky":
            a = a @ a.transpose(-2, -1)
        a = a + n * torch.eye(n, dtype=dt(tag), device=dev)
        if op == "solve":
            b = torch.randn(shape[:-1], dtype=dt(tag), device=dev)
            return {"torch.linalg.solve": lambda: torch.linalg.solve(a, b)}
        fn = getattr(torch.linalg, op)
        return {f"torch.linalg.{op}": lambda: fn(a)}

    name = f"linalg/{op}/{tag}/" + "x".join(str(v) for v in shape) + ("/rhs1" if op == "solve" else "")
    return Case(name, copy_bytes + out, copy_bytes, 256, make, graph=op in ("inv_ex", "det"))


ATTENTION_HEADS = [(32, 4, 128), (32, 8, 128), (64, 8, 128)]
MOE_TOPK = 8
MOE_SHAPES = [(128, 2048, 768), (64, 2048, 1408), (256, 2048, 512)]


def dims(shape):
    return "x".join(str(v) for v in shape)


def bincount_case(n, bins):
    def make(dev):
        x = torch.randint(0, bins, (n,), dtype=torch.int64, device=dev)
        return {"torch.bincount": lambda: torch.bincount(x, minlength=bins)}

    return Case(f"bincount/i64/{n}/bins{bins}", 8 * n + 8 * bins, 8 * n, 256, make, graph=False)


def pad_case(mode, tag, shape, p):
    n_in = math.prod(shape)
    n_out = math.prod(v + (2 * p if i + 3 >= len(shape) else 0) for i, v in enumerate(shape))
    size = ITEMSIZE[tag]

    def make(dev):
        x = rnd(shape, tag, dev)
        return {"F.pad": lambda: F.pad(x, (p,) * 6, mode=mode)}

    return Case(f"pad/{mode}/{tag}/{dims(shape)}/p{p}", size * (n_in + n_out), size * n_in, 256, make)


def dropout_case(tag, n, p):
    def make(dev):
        x = rnd((n,), tag, dev)
        return {"F.dropout": lambda: F.dropout(x, p, training=True)}

    return Case(f"dropout/{tag}/{n}/p{p:g}", 2 * ITEMSIZE[tag] * n, ITEMSIZE[tag] * n, 256, make, graph=False)


def conv_case(tag, x_shape, w_shape, padding):
    sd = len(w_shape) - 2
    out = x_shape[0] * w_shape[0]
    for i in range(sd):
        out *= x_shape[2 + i] + 2 * padding[i] - w_shape[2 + i] + 1
    size = ITEMSIZE[tag]
    copy_bytes = size * (math.prod(x_shape) + math.prod(w_shape) + w_shape[0])
    conv = {2: lambda: F.conv2d, 3: lambda: F.conv3d}[sd]

    def make(dev):
        x, w, b = rnd(x_shape, tag, dev), rnd(w_shape, tag, dev, 0.02), rnd((w_shape[0],), tag, dev, 0.02)
        fn = conv()
        return {f"F.conv{sd}d": lambda: fn(x, w, b, padding=tuple(padding))}

    name = f"conv{sd}d/{tag}/{dims(x_shape)}/w{dims(w_shape)}/p" + "".join(str(v) for v in padding)
    return Case(name, copy_bytes + size * out, copy_bytes, 16, make)


def norm_case(op, tag, shape, groups=0, training=False):
    n = math.prod(shape)
    ch = shape[-1] if op == "layer_norm" else shape[1]
    size = ITEMSIZE[tag]
    params = 4 * 4 * ch if op == "batch_norm" else 2 * size * ch
    copy_bytes = size * n + params
    extra = 2 * 4 * ch if op == "batch_norm" and training else 0
    name = f"{op}/{tag}/{dims(shape)}"
    if op == "group_norm":
        name += f"/G{groups}"
    if op == "batch_norm":
        name += "/train" if training else "/eval"

    def make(dev):
        x = rnd(shape, tag, dev)
        if op == "layer_norm":
            w, b = rnd((ch,), tag, dev), rnd((ch,), tag, dev)
            return {"F.layer_norm": lambda: F.layer_norm(x, (ch,), w, b)}
        if op == "group_norm":
            w, b = rnd((ch,), tag, dev), rnd((ch,), tag, dev)
            return {"F.group_norm": lambda: F.group_norm(x, groups, w, b)}
        w, b, mean = rnd((ch,), "f32", dev), rnd((ch,), "f32", dev), rnd((ch,), "f32", dev, 0.1)
        var = torch.empty(ch, dtype=torch.float32, device=dev).uniform_(0.5, 2.0)
        return {"F.batch_norm": lambda: F.batch_norm(x, mean, var, w, b, training=training)}

    return Case(name, copy_bytes + size * n + extra, copy_bytes, 256, make)


def cross_entropy_case(tag, n, v):
    copy_bytes = ITEMSIZE[tag] * n * v + 8 * n

    def make(dev):
        x = rnd((n, v), tag, dev, 2.0)
        t = torch.randint(0, v, (n,), dtype=torch.int64, device=dev)
        return {"F.cross_entropy": lambda: F.cross_entropy(x, t)}

    return Case(f"cross_entropy/{tag}/{n}x{v}", copy_bytes + ITEMSIZE[tag], copy_bytes, 4, make)


def moe_tag(e, h, i):
    return f"E{e}_H{h}_I{i}"


def grouped_mm_case(shape, t, gate_up):
    # Same inputs as tools/kiln/bench_ops_cases.cpp: T = 1 takes a disjoint set of 8 experts per copy of one
    # shared weight tensor; T > 1 spreads 8T / E rows over every expert.
    e, h, i = shape
    n, k = (2 * i, h) if gate_up else (h, i)
    rows = t * MOE_TOPK
    used = MOE_TOPK if t == 1 else e
    nbytes = 2 * (used * n * k + rows * k + rows * n) + 4 * e
    copy_bytes = 2 * (used * n * k + rows * k) + 4 * e
    shared = {"next": 0}

    def make(dev):
        if "w" not in shared:
            shared["w"] = rnd((e, n, k), "bf16", dev, 0.02)
        if t == 1:
            stride = e // MOE_TOPK
            sel = shared["next"] % stride
            shared["next"] += 1
            counts = [1 if x % stride == sel else 0 for x in range(e)]
            ends, r = [], 0
            for cnt in counts:
                r += cnt
                ends.append(r)
        else:
            ends = [(x + 1) * rows // e for x in range(e)]
        a = rnd((rows, k), "bf16", dev)
        offs = torch.tensor(ends, dtype=torch.int32, device=dev)
        b = shared["w"].transpose(-2, -1)
        return {"torch._grouped_mm": lambda: torch._grouped_mm(a, b, offs=offs)}

    return Case(f"grouped_mm/bf16/T{t}/{moe_tag(e, h, i)}/{'gate_up' if gate_up else 'down'}", nbytes, copy_bytes,
                e // MOE_TOPK if t == 1 else 256, make)


def moe_case(shape, t):
    e, h, i = shape
    used = MOE_TOPK if t == 1 else e
    copy_bytes = 2 * (e * h + used * 3 * i * h + t * h)
    shared = {}

    def make(dev):
        if not shared:
            shared["router"] = rnd((e, h), "bf16", dev, 0.02)
            shared["gate_up"] = rnd((e, 2 * i, h), "bf16", dev, 0.02)
            shared["down"] = rnd((e, h, i), "bf16", dev, 0.02)
        x = rnd((t, h), "bf16", dev)
        r, gu, dn = shared["router"], shared["gate_up"], shared["down"]
        return {"hf_grouped_mm": lambda: torch_moe(x, r, gu, dn, MOE_TOPK, True)}

    return Case(f"moe/bf16/T{t}/{moe_tag(e, h, i)}/top{MOE_TOPK}", copy_bytes + 2 * t * h, copy_bytes, 64, make)


def moe_fp8_case(shape):
    e, h, i = shape
    scales = ((2 * i + 127) // 128) * ((h + 127) // 128) + ((h + 127) // 128) * ((i + 127) // 128)
    copy_bytes = 2 * (e * h + h) + MOE_TOPK * (3 * i * h + 4 * scales)
    shared = {}

    def make(dev):
        if not shared:
            shared["router"] = rnd((e, h), "bf16", dev, 0.02)
            shared["gu"] = rnd((e, 2 * i, h), "bf16", dev, 50.0).to(torch.float8_e4m3fn)
            shared["gus"] = torch.empty((e, (2 * i + 127) // 128, (h + 127) // 128), device=dev).uniform_(0.005, 0.02)
            shared["dn"] = rnd((e, h, i), "bf16", dev, 50.0).to(torch.float8_e4m3fn)
            shared["dns"] = torch.empty((e, (h + 127) // 128, (i + 127) // 128), device=dev).uniform_(0.005, 0.02)
        x = rnd((1, h), "bf16", dev)
        s = shared
        return {"gather_dequant_bmm": lambda: torch_moe_fp8_one(x, s["router"], s["gu"], s["gus"], s["dn"], s["dns"],
                                                                MOE_TOPK, True)}

    return Case(f"moe/e4m3/T1/{moe_tag(e, h, i)}/top{MOE_TOPK}", copy_bytes + 2 * h, copy_bytes, 64, make)


LINEAR = [(2048, 4096), (2048, 512), (4096, 2048), (2048, 128), (2048, 151936), (4096, 4096), (4096, 1024),
          (4096, 14336), (14336, 4096), (4096, 128256), (5120, 5120), (5120, 1024), (5120, 25600), (25600, 5120),
          (3584, 3584), (3584, 512), (3584, 18944), (18944, 3584), (1024, 1024), (896, 896), (896, 128),
          (896, 4864), (4864, 896), (8192, 8192), (8192, 1024), (8192, 28672), (28672, 8192)]
SCALED_MM = [(4096, 4096), (14336, 4096), (28672, 8192)]  # (K, N): weights [N, K]
LINEAR_BATCHED = [(4096, 4096), (4096, 14336), (2048, 151936), (14336, 4096)]
QUANT = [(4096, 6144), (4096, 4096), (4096, 24576), (12288, 4096), (4096, 151936)]  # Qwen3-8B's decode shapes
SOFTMAX = [(1, 128256), (1, 151936), (4, 128256), (64, 32000)]


def cases():
    out = [launch_case()]
    for k, n in LINEAR:
        out += [linear_case(1, k, n, False), linear_case(1, k, n, True)]
    for m in (2, 4, 16):
        out += [linear_case(m, k, n, False) for k, n in LINEAR_BATCHED]
    out.append(linear_case(16, 28672, 8192, False))
    for m in (4096, 8192):
        out += [linear_case(m, k, n, False) for k, n in SCALED_MM]
    for fmt in ("q4_k", "q8_0", "q5_k", "q6_k"):
        for m in (1, 4):
            out += [linear_quant_case(fmt, m, k, n) for k, n in QUANT]
    out += [linear_fp8_case(1, k, n) for k, n in LINEAR]
    for row in (False, True):
        for m in (1, 16, 4096, 8192):
            out += [scaled_mm_case(row, m, k, n) for k, n in SCALED_MM]
    for log in (False, True):
        for tag in ("f32", "bf16"):
            out += [softmax_case(log, tag, r, c) for r, c in SOFTMAX]
    out += [rms_norm_case(1, d) for d in (2048, 4096, 5120, 8192)]
    out += [rms_norm_case(32, 128), rms_norm_case(8, 128)]
    out += [add_rms_norm_case(1, d) for d in (2048, 4096, 5120, 8192)]
    out += [rope_case(*r) for r in ((1, 32, 8, 128), (1, 16, 8, 128), (1, 64, 8, 128), (512, 32, 8, 128))]
    out += [silu_and_mul_case(i) for i in (6144, 12288, 14336, 18944, 25600)]
    for v in (151936, 128256):
        out += [sample_case(v, 0.0, 0, 1.0), sample_case(v, 0.7, 20, 0.8), sample_case(v, 1.0, 0, 0.9)]
    out += [decode_attention_case(*h, l) for h in ATTENTION_HEADS for l in (512, 2048, 8192, 32768)]
    out += [decode_attention_case(14, 2, 64, l) for l in (512, 2048, 8192, 32768)]  # Qwen2-0.5B's heads
    out += [prefill_attention_case(*h, l) for h in ATTENTION_HEADS for l in (512, 2048, 8192)]
    for t in (1, 512, 4096):
        for shape in MOE_SHAPES:
            out += [grouped_mm_case(shape, t, True), grouped_mm_case(shape, t, False)]
    for t in (1, 512):
        out += [moe_case(shape, t) for shape in MOE_SHAPES]
    out += [moe_fp8_case(shape) for shape in MOE_SHAPES]
    out += [linalg_case("inv", "f32", (65536, 4, 4)), linalg_case("inv_ex", "f32", (65536, 4, 4)),
            linalg_case("inv", "f32", (16384, 16, 16)), linalg_case("inv_ex", "f32", (16384, 16, 16)),
            linalg_case("det", "f32", (65536, 4, 4)), linalg_case("det", "f64", (4096, 8, 8)),
            linalg_case("solve", "f32", (65536, 4, 4)), linalg_case("lu_factor", "c64", (1024, 64, 64)),
            linalg_case("lu_factor", "c64", (64, 64)), linalg_case("lu_factor", "c64", (128, 128)),
            linalg_case("lu_factor", "c64", (64, 128, 128)), linalg_case("lu_factor", "f32", (64, 64)),
            linalg_case("cholesky", "f64", (1024, 1024))]
    out += [bincount_case(4 << 20, 1000), pad_case("reflect", "bf16", (1, 128, 16, 256, 256), 1),
            pad_case("constant", "bf16", (1, 128, 16, 256, 256), 1), dropout_case("bf16", 64 << 20, 0.1),
            conv_case("bf16", (2, 320, 64, 64), (320, 320, 3, 3), (1, 1)),
            conv_case("bf16", (1, 512, 128, 128), (512, 512, 3, 3), (1, 1)),
            conv_case("bf16", (1, 384, 6, 90, 160), (384, 384, 3, 3, 3), (0, 1, 1)),
            conv_case("f32", (2, 320, 64, 64), (320, 320, 3, 3), (1, 1)),
            norm_case("layer_norm", "bf16", (4096, 4096)), norm_case("group_norm", "bf16", (1, 512, 128, 128), 32),
            norm_case("group_norm", "bf16", (1, 384, 4, 90, 160), 32),
            norm_case("batch_norm", "bf16", (32, 256, 56, 56), 0, False),
            norm_case("batch_norm", "bf16", (32, 256, 56, 56), 0, True),
            cross_entropy_case("bf16", 4096, 151936)]
    return out


# ---- timing ----------------------------------------------------------------------------------------------

def copies_for(case, l2_bytes):
    want = math.ceil(4.0 * l2_bytes / max(1, case.copy_bytes))
    return int(min(max(want, 2), max(2, case.max_copies)))


def median(v):
    v = sorted(v)
    if not v:
        return float("nan")
    h = len(v) // 2
    return v[h] if len(v) % 2 else 0.5 * (v[h - 1] + v[h])


def timed(stream, repeats, calls_per_run, body):
    start = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    stop = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for i in range(repeats):
        start[i].record(stream)
        body()
        stop[i].record(stream)
    stream.synchronize()
    return [a.elapsed_time(b) / calls_per_run for a, b in zip(start, stop)]


def time_calls(calls, stream, repeats, capture=True):
    """calls: one callable per copy (already warmed up). Returns (eager_us, graph_us, errors); graph_us stays
    NaN without `capture`."""
    eager = graph = float("nan")
    errors = []
    try:
        batch = min(len(calls), EAGER_BATCH)
        pos = [0]

        def run_batch():
            for _ in range(batch):
                calls[pos[0]]()
                pos[0] = (pos[0] + 1) % len(calls)

        eager = 1e3 * median(timed(stream, repeats, batch, run_batch))
    except Exception as e:  # noqa: BLE001 - a failing case is a row, not a crash
        errors.append(f"eager: {type(e).__name__}: {e}")
    if not capture:
        return eager, graph, errors
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for call in calls:
                call()
        g.replay()
        g.replay()
        stream.synchronize()
        graph = 1e3 * median(timed(stream, repeats, len(calls), g.replay))
        del g
    except Exception as e:  # noqa: BLE001
        errors.append(f"graph: {type(e).__name__}: {e}")
    return eager, graph, errors


def run_case(case, dev, stream, repeats, l2_bytes):
    copies = copies_for(case, l2_bytes)
    row = {"name": case.name, "eager_us": None, "graph_us": None, "bytes": case.bytes, "gbps": None,
           "pct_copy": None, "copies": copies}
    try:
        sets = [case.make(dev) for _ in range(copies)]
        for s in sets:
            for call in s.values():
                call()
        stream.synchronize()
    except Exception as e:  # noqa: BLE001
        row["error"] = f"setup: {type(e).__name__}: {e}"
        return row
    impls, errors = {}, []
    for impl in sets[0]:
        eager, graph, errs = time_calls([s[impl] for s in sets], stream, repeats, case.graph)
        impls[impl] = {"eager_us": None if math.isnan(eager) else eager, "graph_us": None if math.isnan(graph) else graph}
        errors += [f"{impl} {e}" if len(sets[0]) > 1 else e for e in errs]
    # The faster implementation per column (graph, eager), as a PyTorch user would pick.
    for col in ("eager_us", "graph_us"):
        best = min((v[col], k) for k, v in impls.items() if v[col] is not None) if any(
            v[col] is not None for v in impls.values()) else None
        if best:
            row[col] = best[0]
            row["impl_" + col.split("_")[0]] = best[1]
    if len(impls) > 1:
        row["impls"] = impls
    if errors:
        row["error"] = "; ".join(errors)
    return row


def copy_gbps(dev, stream):
    n = 1 << 28  # f32: 1 GiB
    src = torch.empty(n, dtype=torch.float32, device=dev).uniform_(-1, 1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    dst.copy_(src)
    stream.synchronize()
    ms = median(timed(stream, 20, 1, lambda: dst.copy_(src)))
    return 2.0 * src.numel() * 4 / (ms * 1e-3) / 1e9


def human_bytes(b):
    return f"{b / 1e6:.1f} MB" if b >= 1e6 else f"{b / 1e3:.1f} kB" if b >= 1e3 else f"{b} B"


def fmt(v, spec):
    return format(v, spec) if v is not None else format("n/a", spec.split(".")[0].rstrip("f") or "")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the results as JSON to this file")
    ap.add_argument("--filter", default="", help="only the cases whose name matches this regex (re.search)")
    ap.add_argument("--repeats", type=int, default=200, help="timed batches and graph replays per case (median)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--list", action="store_true", help="print the cases (name, bytes, copy bytes, max copies)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    try:
        pat = re.compile(args.filter)
    except re.error as e:
        print(f"torch_ops.py: --filter '{args.filter}' is not a valid regular expression: {e}", file=sys.stderr)
        return 1
    selected = [c for c in cases() if pat.search(c.name)]
    if not selected:
        print(f"torch_ops.py: no case matches --filter '{args.filter}' (see --list)", file=sys.stderr)
        return 1
    if args.list:
        for c in selected:
            print(f"{c.name} {c.bytes} {c.copy_bytes} {c.max_copies}")
        return 0

    global torch, F
    try:
        import torch as _torch
        import torch.nn.functional as _F
    except ImportError as e:
        print(f"torch_ops.py: PyTorch is not installed ({e})", file=sys.stderr)
        return 2
    torch, F = _torch, _F
    # f32 products and convolutions in f32, as kiln's (PyTorch lets cuDNN convolutions use TF32 by default).
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if not torch.cuda.is_available():
        print("torch_ops.py: no CUDA device available to PyTorch", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    props = torch.cuda.get_device_properties(dev)
    l2_bytes = getattr(props, "L2_cache_size", 0) or 50 * 1024 * 1024
    torch.cuda.set_device(dev)
    torch.manual_seed(0x42454E43)
    stream = torch.cuda.Stream(dev)
    out = {"tool": "torch", "torch_version": torch.__version__, "gpu": props.name, "device": str(dev),
           "l2_bytes": l2_bytes, "repeats": args.repeats, "cases": []}
    t0 = time.time()
    with torch.inference_mode(), torch.cuda.stream(stream):
        copy = copy_gbps(dev, stream)
        out["copy_gbps"] = copy
        print(f"torch_ops.py on {dev} ({props.name}, L2 {l2_bytes >> 20} MiB, torch {torch.__version__}): "
              f"device-to-device copy {copy:.1f} GB/s; {len(selected)} cases, {args.repeats} repeats", flush=True)
        section, section_t0, errors = None, time.time(), 0
        for case in selected:
            sec = case.name.split("/")[0]
            if sec != section:
                if section:
                    print(f"  ({section}: {time.time() - section_t0:.1f} s)")
                section, section_t0 = sec, time.time()
                n = sum(1 for c in selected if c.name.split("/")[0] == sec)
                print(f"\n== {sec}: {n} cases ==\n{'case':<44} {'eager us':>10} {'graph us':>10} {'bytes':>10} "
                      f"{'GB/s':>9} {'% copy':>7} {'copies':>6}  impl", flush=True)
            row = run_case(case, dev, stream, args.repeats, l2_bytes)
            if row["graph_us"]:
                row["gbps"] = case.bytes / (row["graph_us"] * 1e-6) / 1e9
                row["pct_copy"] = 100.0 * row["gbps"] / copy
            print(f"{case.name:<44} {fmt(row['eager_us'], '10.2f')} {fmt(row['graph_us'], '10.2f')} "
                  f"{human_bytes(case.bytes):>10} {fmt(row['gbps'], '9.1f')} {fmt(row['pct_copy'], '7.1f')} "
                  f"{row['copies']:>6}  {row.get('impl_graph', '')}", flush=True)
            if "error" in row:
                errors += 1
                print(f"  error: {row['error'][:500]}", flush=True)
            out["cases"].append(row)
            torch.cuda.empty_cache()
        if section:
            print(f"  ({section}: {time.time() - section_t0:.1f} s)")
    print(f"\n{len(selected)} cases in {time.time() - t0:.1f} s, {errors} with errors")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
