"""Perplexity of a text file under a Hugging Face checkpoint with transformers, computed as `kiln perplexity`
computes it: the tokenizer's ids of the whole file (special tokens as the tokenizer adds them), consecutive
windows of --ctx tokens each run on its own, every token but a window's first scored; exp(mean NLL) in f64.

    python3 bench/torch_perplexity.py -m DIR --file TEXT [--ctx 512] [--json FILE]"""
import argparse
import json
import math

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--json")
    a = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32).eval()
    ids = tok(open(a.file, encoding="utf-8").read())["input_ids"]
    nll, n = 0.0, 0
    with torch.inference_mode():
        for begin in range(0, len(ids) - 1, a.ctx):
            w = ids[begin:begin + a.ctx]
            if len(w) < 2:
                break
            logits = model(torch.tensor([w])).logits[0].double()
            lp = torch.log_softmax(logits[:-1], -1)
            nll -= lp.gather(1, torch.tensor(w[1:]).unsqueeze(1)).sum().item()
            n += len(w) - 1
    ppl = math.exp(nll / n)
    print(f"perplexity: {ppl:.4f} ({n} tokens scored in windows of {a.ctx}; {len(ids)} tokens in the file)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"perplexity": ppl, "nll_sum": nll, "predicted": n, "window": a.ctx, "tokens": len(ids)}, f)


if __name__ == "__main__":
    main()
