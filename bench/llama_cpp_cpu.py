#!/usr/bin/env python3
"""CPU prefill and decode of kiln against llama.cpp on the same GGUF files, side by side in one run.

llama.cpp runs through PyPI's llama-cpp-python, which builds llama.cpp for the machine it installs on
(`build/venv/bin/pip install llama-cpp-python`: a few minutes of compiling). On CPUs with AMX, llama-cpp-python
0.3.36's native build stops with a segmentation fault in the prompt of Q8_0 and Q4_K files (its own quantiser's
too); build it without AMX there: CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
-DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
-DGGML_AVX_VNNI=ON" pip install llama-cpp-python. The model is a random checkpoint
(bf16 N(0, 0.02) weights, tests/data's Qwen2 tokenizer) with Qwen3-0.6B's shapes, or with --model qwen3-moe
Qwen3-30B-A3B's in 4 layers (bench/presets.py; 128 experts, top 8), written once, then `kiln quantize DIR
FILE.gguf --type T` for each type (q4_k_m and q5_k_m: llama.cpp's own quantiser from the F16 file, Q6_K output
and mixed-format layers included; kiln's q8_0 and q4_k files keep MoE experts in Q8_0). Both engines then read that file:
- kiln: `kiln bench -m FILE.gguf --device cpu -p P -n N -r R` with OMP_NUM_THREADS = --threads (--dtype f16 for
  the F16 file, bf16 for the others: the activations' type; Q8_0 / Q4_K layers stay in their blocks);
- llama.cpp: Llama(FILE.gguf, n_threads = --threads, n_batch = P); prefill = eval of P random tokens on an empty
  cache, decode = N evals of one token after it (what llama-bench calls pp and tg); the best of R runs after one
  warm-up.
With --rounds K the two engines take turns K times (kiln's R runs, llama.cpp's R runs, again) and the best of all
K x R runs counts for each: on a shared machine whose load changes by the minute, both then meet the same load.

    python3 bench/llama_cpp_cpu.py --kiln build/bin/kiln [--model qwen3-0.6b|qwen3-moe]
        [--types f16,bf16,q8_0,q4_k,q4_k_m,q5_k_m] [-p 128] [-n 32] [-r 3]
        [--threads 2] [--rounds 1] [--workdir DIR] [--json FILE]
"""
import argparse
import json
import os
import platform
import random
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from presets import PRESETS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_description():
    """The CPU's model name and the vector extensions both engines choose kernels by (Linux /proc/cpuinfo)."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return None
    name = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "")
    flags = next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), [])
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16"]
    return {"model": name, "flags": [f for f in wanted if f in flags]}


# The models side by side: a preset, and for the MoE one fewer layers (Qwen3-30B-A3B's layer shapes, 128
# experts, top 8; what a decoded token reads per layer is that of the full model).
MODELS = {"qwen3-0.6b": ("qwen3-0.6b", {}),
          "qwen3-moe": ("qwen3-30b-a3b", {"num_hidden_layers": 4})}


def write_checkpoint(d, model, seed=0):
    """A random bf16 checkpoint of `model` (MODELS) with the Qwen2 tokenizer, as safetensors."""
    preset, overrides = MODELS[model]
    cfg = dict(PRESETS[preset], torch_dtype="bfloat16", bos_token_id=151643, eos_token_id=151645, **overrides)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(ROOT, "tests", "data", "tokenizers", "qwen2.json"), "rb") as src:
        with open(os.path.join(d, "tokenizer.json"), "wb") as dst:
            dst.write(src.read())
    H, I, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    D, Hq, Hk = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (V, H)
    for i in range(L):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                       p + "self_attn.q_proj.weight": (Hq * D, H), p + "self_attn.k_proj.weight": (Hk * D, H),
                       p + "self_attn.v_proj.weight": (Hk * D, H), p + "self_attn.o_proj.weight": (H, Hq * D),
                       p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
        if cfg.get("num_experts"):
            E, Ie = cfg["num_experts"], cfg["moe_intermediate_size"]
            shapes[p + "mlp.gate.weight"] = (E, H)
            for e in range(E):
                q = f"{p}mlp.experts.{e}."
                shapes.update({q + "gate_proj.weight": (Ie, H), q + "up_proj.weight": (Ie, H),
                               q + "down_proj.weight": (H, Ie)})
        else:
            shapes.update({p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                           p + "mlp.down_proj.weight": (H, I)})
    rng = np.random.default_rng(seed)
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, shape in shapes.items():
            norm = name.endswith("norm.weight")
            x = (1.0 + 0.05 * rng.standard_normal(shape, dtype=np.float32) if norm
                 else 0.02 * rng.standard_normal(shape, dtype=np.float32))
            f.write((x.view(np.uint32) >> 16).astype(np.uint16).tobytes())


def llama_quantize(src, dst, ftype, threads):
    """llama.cpp's quantiser (llama_model_quantize) from `src` to `dst`."""
    import ctypes
    import llama_cpp
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = {"q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M}[ftype]
    p.nthread = threads
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)) != 0:
        raise SystemExit(f"llama_model_quantize failed for {dst}")


def run_kiln(kiln, gguf, dtype, a):
    out = gguf + ".kiln.json"
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    subprocess.run([kiln, "bench", "-m", gguf, "--device", "cpu", "--dtype", dtype, "-p", str(a.p), "-n", str(a.n),
                    "-r", str(a.r), "--json", out], check=True, env=env, stdout=subprocess.DEVNULL)
    j = json.load(open(out))
    best = lambda v: max(v) if isinstance(v, list) else v
    return {"pp_tps": best(j["pp_tps"]), "tg_tps": best(j["tg_tps"]), "pp_all": j["pp_tps"], "tg_all": j["tg_tps"]}


def run_llama_cpp(gguf, a):
    from llama_cpp import Llama
    llm = Llama(model_path=gguf, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=a.p + a.n + 16,
                n_batch=a.p, n_ubatch=a.p, verbose=False)
    rnd = random.Random(0)
    vocab = llm.n_vocab()
    pp, tg = [], []
    for rep in range(a.r + 1):  # the first is a warm-up
        prompt = [rnd.randrange(1000, vocab - 1000) for _ in range(a.p)]
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        t_pp = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(a.n):
            llm.eval([rnd.randrange(1000, vocab - 1000)])
        t_tg = time.perf_counter() - t
        if rep > 0:
            pp.append(a.p / t_pp)
            tg.append(a.n / t_tg)
    return {"pp_tps": max(pp), "tg_tps": max(tg), "pp_all": pp, "tg_all": tg}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", required=True, help="the kiln command (build/bin/kiln)")
    ap.add_argument("--model", default="qwen3-0.6b", choices=sorted(MODELS))
    ap.add_argument("--types", default="f16,bf16,q8_0,q4_k")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="rounds of both engines, alternating (each -r runs)")
    ap.add_argument("--workdir", default=None, help="where the checkpoint and GGUF files go (kept; default: a "
                                                      "temporary directory, removed)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    tmp = None
    work = a.workdir
    if work is None:
        tmp = tempfile.TemporaryDirectory()
        work = tmp.name
    ckpt = os.path.join(work, f"{a.model}-random")
    if not os.path.exists(os.path.join(ckpt, "model.safetensors")):
        write_checkpoint(ckpt, a.model)
    rows = []
    for t in a.types.split(","):
        gguf = os.path.join(work, f"{a.model}-{t}.gguf")
        if not os.path.exists(gguf) and t in ("q4_k_m", "q5_k_m"):
            # llama.cpp's own Q4_K_M / Q5_K_M from the F16 file: Q4_K (Q5_K) layers, a Q6_K embedding and output,
            # and Q6_K attn_v and ffn_down in some layers (q/k/v of mixed formats), as the files people download are.
            f16 = os.path.join(work, f"{a.model}-f16.gguf")
            if not os.path.exists(f16):
                subprocess.run([a.kiln, "quantize", ckpt, f16, "--type", "f16"], check=True, stdout=subprocess.DEVNULL)
            llama_quantize(f16, gguf, t, a.threads)
        elif not os.path.exists(gguf):
            subprocess.run([a.kiln, "quantize", ckpt, gguf, "--type", t], check=True, stdout=subprocess.DEVNULL)
        size = os.path.getsize(gguf)
        # Rounds alternate the engines, so that both meet the same load on a shared machine; the best of all
        # their runs counts.
        runs = {"kiln": [], "llama_cpp": []}
        for rnd in range(a.rounds):
            k = run_kiln(a.kiln, gguf, "f16" if t == "f16" else "bf16", a)
            print(f"{t}: kiln pp{a.p} {k['pp_tps']:.1f} tg{a.n} {k['tg_tps']:.2f}", flush=True)
            ll = run_llama_cpp(gguf, a)
            print(f"{t}: llama.cpp pp{a.p} {ll['pp_tps']:.1f} tg{a.n} {ll['tg_tps']:.2f}", flush=True)
            runs["kiln"].append(k)
            runs["llama_cpp"].append(ll)
        row = {"type": t, "bytes": size}
        for eng, rs in runs.items():
            pp_all = [v for r in rs for v in r["pp_all"]]
            tg_all = [v for r in rs for v in r["tg_all"]]
            row[eng] = {"pp_tps": max(pp_all), "tg_tps": max(tg_all), "pp_all": pp_all, "tg_all": tg_all}
        rows.append(row)
    print(f"\n| weights | file | engine | pp{a.p} t/s | tg{a.n} t/s |\n| --- | ---: | --- | ---: | ---: |")
    for r in rows:
        for eng in ("kiln", "llama_cpp"):
            print(f"| {r['type']} | {r['bytes'] / 2**30:.2f} GiB | {eng.replace('_', '.')} | "
                  f"{r[eng]['pp_tps']:.1f} | {r[eng]['tg_tps']:.2f} |")
        print(f"| {r['type']} | | kiln / llama.cpp | {r['kiln']['pp_tps'] / r['llama_cpp']['pp_tps']:.2f}x | "
              f"{r['kiln']['tg_tps'] / r['llama_cpp']['tg_tps']:.2f}x |")
    if a.json:
        import llama_cpp
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "machine": platform.processor() or platform.machine(), "cpu": cpu_description(),
                       "threads": a.threads, "p": a.p, "n": a.n, "r": a.r, "rounds": a.rounds,
                       "llama_cpp_python": llama_cpp.__version__,
                       "rows": rows}, f, indent=1)
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
