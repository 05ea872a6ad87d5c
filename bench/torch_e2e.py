#!/usr/bin/env python3
"""Decode and prefill rates of Hugging Face transformers on the presets of `kiln bench --preset`, with the
same configs and random bf16 weights, on the same GPU: the side-by-side for kiln's engine.

    python3 bench/torch_e2e.py --preset qwen3-8b [-p 512] [-n 128] [-r 2] [--batch B] [--experts grouped_mm] [--json F]

Prefill = time of generate(max_new_tokens=1) on p random prompt tokens; decode = (time of generate with n + 1
new tokens - prefill) / n, greedy, eos ignored. Median over the repeats after one warm-up. --batch B runs B
prompts together (batched generate, the side-by-side for `kiln bench serve` at B streams): the rates are then
aggregate tokens/s over the batch.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from presets import PRESETS  # the same configs as src/llm/presets.cpp


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--experts", default=None, help="MoE experts implementation (e.g. grouped_mm), if supported")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    spec = dict(PRESETS[a.preset])
    cfg = AutoConfig.for_model(**spec)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    impl = "dense"
    if spec.get("num_experts"):
        # transformers 5 picks the MoE experts kernel per model: "eager" (a loop over the hit experts) or
        # "grouped_mm" (torch._grouped_mm); its generate() may swap grouped_mm for batched_mm while decoding.
        if a.experts:
            model.set_experts_implementation(a.experts)
        impl = str(model.get_experts_implementation())
    g = torch.Generator(device="cuda").manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (a.batch, a.p), device="cuda", generator=g)

    def run(new_tokens):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        torch.cuda.synchronize()
        assert out.shape[1] == a.p + new_tokens
        return time.perf_counter() - t

    run(4)  # warm-up
    pre, dec = [], []
    for _ in range(a.r):
        tp = run(1)
        tt = run(a.n + 1)
        pre.append(a.batch * a.p / tp)
        dec.append(a.batch * a.n / max(tt - tp, 1e-9))
    res = {"preset": a.preset, "batch": a.batch, "impl": impl, "transformers": transformers.__version__, "torch": torch.__version__,
           "pp": a.p, "tg": a.n, "pp_tps": pre, "tg_tps": dec, "pp_median": statistics.median(pre),
           "tg_median": statistics.median(dec), "peak_allocated": torch.cuda.max_memory_allocated(),
           "peak_reserved": torch.cuda.max_memory_reserved()}
    print(f"transformers {transformers.__version__} ({impl}) {a.preset} batch {a.batch}: pp{a.p} {res['pp_median']:.1f} t/s, "
          f"tg{a.n} {res['tg_median']:.2f} t/s, peak allocated {res['peak_allocated'] / 2**30:.2f} GiB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
