#!/usr/bin/env python3
"""Side by side: kiln's default run, kiln under other settings (one `kiln bench ops` JSON per variant), and
PyTorch, all from one call on one GPU. Graph-replayed µs per case, and per op family the geometric mean of
PyTorch / kiln for each column.

    scripts/bench_variants.py KILN_JSON TORCH_JSON LABEL=VARIANT_JSON ... [--md OUT.md] [--merged OUT.json]

--merged writes the variants' cases into one file ({"variants": [{"label": ..., "cases": [...]}]}).
"""
import argparse
import json
import math


def cases(path):
    with open(path) as f:
        return {c["name"]: c for c in json.load(f).get("cases", [])}


def us(c):
    return None if c is None or c.get("error") else c.get("graph_us")


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln_json")
    ap.add_argument("torch_json")
    ap.add_argument("variants", nargs="+", help="LABEL=PATH")
    ap.add_argument("--md")
    ap.add_argument("--merged")
    args = ap.parse_args()
    base, torch = cases(args.kiln_json), cases(args.torch_json)
    variants = []
    for v in args.variants:
        label, path = v.rsplit("=", 1)  # the label may hold "=" itself (an environment setting)
        variants.append((label, path, cases(path)))
    cols = [("kiln", base)] + [(label, c) for label, _, c in variants]
    out = ["Graph-replayed µs per call (median); ratio columns = PyTorch / that column.", ""]
    fam = {}
    for name in base:
        fam.setdefault(name.split("/")[0], []).append(name)
    out.append("| family | " + " | ".join(f"{label}: geomean PyTorch / kiln" for label, _ in cols) + " |")
    out.append("| --- |" + " ---: |" * len(cols))
    for f, names in fam.items():
        row = []
        for _, c in cols:
            g = geomean([us(torch.get(n)) / us(c.get(n)) for n in names if us(torch.get(n)) and us(c.get(n))])
            row.append("–" if g is None else f"{g:.2f}")
        out.append(f"| {f} | " + " | ".join(row) + " |")
    out.append("")
    out.append("| case | PyTorch | " + " | ".join(label for label, _ in cols) + " |")
    out.append("| --- | ---: |" + " ---: |" * len(cols))
    for name in base:
        t = us(torch.get(name))
        row = [f"{t:.2f}" if t else "–"]
        for _, c in cols:
            k = us(c.get(name))
            row.append("–" if not k else (f"{k:.2f} ({t / k:.2f}x)" if t else f"{k:.2f}"))
        out.append(f"| {name} | " + " | ".join(row) + " |")
    text = "\n".join(out) + "\n"
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    if args.merged:
        with open(args.merged, "w") as f:
            json.dump({"variants": [{"label": label, "cases": list(c.values())} for label, _, c in variants]}, f, indent=1)


if __name__ == "__main__":
    main()
