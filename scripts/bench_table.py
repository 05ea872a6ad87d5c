#!/usr/bin/env python3
"""Merges the JSON of `kiln bench ops` and bench/torch_ops.py (same run, same GPU) into one markdown table and
a plot of the speedup per case.

    scripts/bench_table.py KILN_JSON TORCH_JSON [--md OUT.md] [--png OUT.png]

ratio = PyTorch time / kiln time (> 1: kiln is faster), for the graph-replayed and the eager times; kiln GB/s
and % copy are kiln's graph-replayed bandwidth and its share of the device-to-device copy bandwidth kiln
measured in the same run. The summary gives geometric means of the ratios (linear: over the M = 1 decode
shapes and over all linear cases; every other op family on its own). The plot needs matplotlib; without it
the table is still written and the plot is skipped with a message.
"""
import argparse
import json
import math
import sys


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data, {c["name"]: c for c in data.get("cases", [])}


def ratio(torch_us, kiln_us):
    if torch_us is None or kiln_us is None or kiln_us <= 0 or torch_us <= 0:
        return None
    return torch_us / kiln_us


def geomean(values):
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def f(v, spec=".2f", none="–"):
    return none if v is None else format(v, spec)


def section(name):
    return name.split("/")[0]


def merge(kiln, torch):
    """Rows in kiln's order, then any case only PyTorch ran."""
    names = list(kiln) + [n for n in torch if n not in kiln]
    rows = []
    for n in names:
        k, t = kiln.get(n, {}), torch.get(n, {})
        rows.append({
            "name": n,
            "kiln_graph": k.get("graph_us"), "torch_graph": t.get("graph_us"),
            "kiln_eager": k.get("eager_us"), "torch_eager": t.get("eager_us"),
            "ratio_graph": ratio(t.get("graph_us"), k.get("graph_us")),
            "ratio_eager": ratio(t.get("eager_us"), k.get("eager_us")),
            "gbps": k.get("gbps"), "pct_copy": k.get("pct_copy"), "bytes": k.get("bytes"),
            "kiln_error": k.get("error") if k else "not run", "torch_error": t.get("error") if t else "not run",
            "bytes_mismatch": bool(k and t and k.get("bytes") != t.get("bytes")),
            "torch_impl": t.get("impl_graph", ""),
        })
    return rows


def summary(rows):
    lines = []
    lin = [r for r in rows if section(r["name"]) == "linear"]
    lin_m1 = [r for r in lin if "/M1/" in r["name"]]
    groups = [("linear, M = 1 (27 shapes, with and without bias)", lin_m1), ("linear, all", lin)]
    seen = []
    for r in rows:
        s = section(r["name"])
        if s != "linear" and s not in seen:
            seen.append(s)
    groups += [(s, [r for r in rows if section(r["name"]) == s]) for s in seen]
    lines.append("| group | cases | geomean ratio, graph | geomean ratio, eager | slowest ratio, graph (case) |")
    lines.append("| --- | ---: | ---: | ---: | --- |")
    for label, rs in groups:
        if not rs:
            continue
        g = geomean([r["ratio_graph"] for r in rs])
        e = geomean([r["ratio_eager"] for r in rs])
        worst = min((r for r in rs if r["ratio_graph"] is not None), key=lambda r: r["ratio_graph"], default=None)
        worst_s = f"{worst['ratio_graph']:.2f} ({worst['name']})" if worst else "–"
        lines.append(f"| {label} | {len(rs)} | {f(g)} | {f(e)} | {worst_s} |")
    return lines


BOUND_SECTIONS = ("softmax", "log_softmax", "rms_norm", "add_rms_norm", "rope", "silu_and_mul", "sample")


def bound_lines(kiln_data, rows):
    """Small decode ops against the bound 'bytes once at copy speed + one kernel launch' (graph-replayed):
    the launch term is kiln's measured launch/bf16/fill1 case."""
    launch = next((r["kiln_graph"] for r in rows if r["name"].startswith("launch/")), None)
    copy = kiln_data.get("copy_gbps")
    if not launch or not copy:
        return []
    out = [f"Small ops against the bound (bytes / {copy:.0f} GB/s + {launch:.2f} µs launch), graph-replayed:", "",
           "| case | kiln µs | bound µs | x bound |", "| --- | ---: | ---: | ---: |"]
    for r in rows:
        if section(r["name"]) not in BOUND_SECTIONS or r["kiln_graph"] is None or not r["bytes"]:
            continue
        b = r["bytes"] / (copy * 1e3) + launch
        out.append(f"| {r['name']} | {r['kiln_graph']:.2f} | {b:.2f} | {r['kiln_graph'] / b:.2f} |")
    return out + [""]


def markdown(kiln_data, torch_data, rows):
    out = []
    gpu = kiln_data.get("gpu") or torch_data.get("gpu")
    out.append(f"GPU: {gpu}; kiln's device-to-device copy: {f(kiln_data.get('copy_gbps'), '.0f')} GB/s "
               f"(PyTorch's run: {f(torch_data.get('copy_gbps'), '.0f')} GB/s); PyTorch "
               f"{torch_data.get('torch_version', '?')}; repeats: kiln {kiln_data.get('repeats', '?')}, "
               f"PyTorch {torch_data.get('repeats', '?')}. Times are µs per call (median); ratio = PyTorch / kiln.")
    out.append("")
    out.extend(summary(rows))
    out.append("")
    out.extend(bound_lines(kiln_data, rows))
    out.append("| case | kiln graph µs | PyTorch graph µs | ratio graph | kiln eager µs | PyTorch eager µs | "
               "ratio eager | kiln GB/s | % copy |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        def cell(v, err, spec=".2f"):
            if v is None and err:
                return "not run" if err == "not run" else "error"
            return f(v, spec)
        out.append(f"| {r['name']} | {cell(r['kiln_graph'], r['kiln_error'])} | "
                   f"{cell(r['torch_graph'], r['torch_error'])} | {f(r['ratio_graph'])} | "
                   f"{cell(r['kiln_eager'], r['kiln_error'])} | {cell(r['torch_eager'], r['torch_error'])} | "
                   f"{f(r['ratio_eager'])} | {f(r['gbps'], '.0f')} | {f(r['pct_copy'], '.1f')} |")
    notes = []
    for r in rows:
        if r["kiln_error"]:
            notes.append(f"- kiln, {r['name']}: {r['kiln_error'][:300]}")
        if r["torch_error"]:
            notes.append(f"- PyTorch, {r['name']}: {r['torch_error'][:300]}")
        if r["bytes_mismatch"]:
            notes.append(f"- {r['name']}: kiln and PyTorch count different bytes (the case tables differ)")
    if notes:
        out.append("")
        out.append("Errors and mismatches:")
        out.append("")
        out.extend(notes)
    return "\n".join(out) + "\n"


def plot(rows, path, gpu):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"bench_table.py: matplotlib is not installed; skipping the plot {path}")
        return False
    rs = [r for r in rows if r["ratio_graph"] is not None or r["ratio_eager"] is not None]
    if not rs:
        print("bench_table.py: no case has a ratio; skipping the plot")
        return False
    sections = []
    for r in rs:
        if section(r["name"]) not in sections:
            sections.append(section(r["name"]))
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.17 * len(rs)))
    y = list(range(len(rs)))[::-1]
    # Bars grow from 1 (parity) to the ratio: right of the line kiln is faster, left of it slower.
    ax.barh(y, [(r["ratio_graph"] or 1.0) - 1.0 for r in rs], left=1.0, height=0.7,
            color=[colors(sections.index(section(r["name"])) % 10) for r in rs], label="graph-replayed")
    ax.scatter([r["ratio_eager"] for r in rs if r["ratio_eager"]], [yy for yy, r in zip(y, rs) if r["ratio_eager"]],
               marker="|", color="black", s=60, label="eager", zorder=3)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(y)
    ax.set_yticklabels([r["name"] for r in rs], fontsize=6)
    ax.set_ylim(-0.7, len(rs) - 0.3)
    ax.set_xlabel("speedup over PyTorch (PyTorch time / kiln time), log scale")
    ax.set_title(f"kiln bench ops vs PyTorch, {gpu}", fontsize=9)
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kiln_json")
    ap.add_argument("torch_json")
    ap.add_argument("--md", help="write the markdown table here")
    ap.add_argument("--png", help="write the speedup plot here (needs matplotlib)")
    args = ap.parse_args(argv)
    kiln_data, kiln = load(args.kiln_json)
    torch_data, torch = load(args.torch_json)
    rows = merge(kiln, torch)
    md = markdown(kiln_data, torch_data, rows)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(md)
    sys.stdout.write(md)
    if args.png and plot(rows, args.png, kiln_data.get("gpu", "")):
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
