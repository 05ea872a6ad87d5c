#!/usr/bin/env python3
"""The tables and plots of docs/benchmarks.md (and the README's headline), made from the result sets in
bench/results. No figure on those pages is written by hand: this script writes them.

    python3 scripts/plots.py                      # the plots (docs/plots/*.png) and the tables in the pages
    python3 scripts/plots.py --tables             # print every table as markdown; write nothing
    python3 scripts/plots.py --check              # exit 1 if a page's tables differ from the results
    python3 scripts/plots.py --sets DIR [DIR ...] # other result sets, oldest first

A result set is one folder per machine kind and date, bench/results/<kind>-<YYYY-MM-DD>/, holding what the
device scripts write: `kiln bench ops` and bench/torch_ops.py pairs (<prefix>kiln_ops.json and
<prefix>torch_ops.json), `kiln bench --json` results (e2e_kiln_<preset>[-p<prompt>].json), bench/torch_e2e.py
results (e2e_torch_<preset>.json), `kiln bench` printouts (e2e_kiln*.txt) and kiln_cpu_ops_bench printouts
(cpu_ops*.txt). An optional set.json names the machine and, per run, its files, commit and command, in the
order the runs were made.

Which figures a table shows: per machine kind, the newest measurement. An operator family comes from the
newest run that measured all of its cases (sets in the order given, runs in set.json's order or by file
name); the engine's figures from the newest set that measured that preset and prompt; the side-by-side table
from the newest set that also ran a peer (transformers). Pages mark each generated table with
<!-- plots.py: NAME --> ... <!-- /plots.py -->; --tables prints every NAME.
"""
import argparse
import fnmatch
import glob
import json
import math
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---- defaults: the sets the pages cite, oldest first, where the plots go and which pages hold tables ----
DEFAULT_SETS = [
    "bench/results/h200-2026-12-02",
    "bench/results/h200-2026-12-03",
    "bench/results/h200-2026-12-04",
    "bench/results/cpu-2026-12-04",
    "bench/results/h100-2026-12-06",
]
PLOT_DIR = "docs/plots"
PAGES = ["docs/benchmarks.md", "README.md"]

# Operator families in the order the tables list them: (key, label). Keys come from family() below; a family
# not listed here is appended under its key.
FAMILIES = [
    ("linear/M1", "linear bf16, 1 row"),
    ("linear/M2-16", "linear bf16, 2-16 rows"),
    ("linear/M>16", "linear bf16, 4096-8192 rows"),
    ("linear_fp8/M1", "linear, FP8 weights, 1 row"),
    ("scaled_mm/M1", "scaled_mm e4m3, 1 row"),
    ("scaled_mm/M2-16", "scaled_mm e4m3, 16 rows"),
    ("scaled_mm/M>16", "scaled_mm e4m3, 4096-8192 rows"),
    ("softmax", "softmax"),
    ("log_softmax", "log_softmax"),
    ("rms_norm", "rms_norm"),
    ("add_rms_norm", "add_rms_norm"),
    ("rope", "rope_"),
    ("silu_and_mul", "silu_and_mul"),
    ("sample", "sample"),
    ("decode_attention", "decode_attention"),
    ("sdpa_prefill", "causal prefill attention"),
    ("grouped_mm/bf16/T1", "grouped_mm bf16, 1 token"),
    ("grouped_mm/bf16/T>16", "grouped_mm bf16, 512-4096 tokens"),
    ("moe/bf16/T1", "MoE block bf16, 1 token"),
    ("moe/bf16/T>16", "MoE block bf16, 512 tokens"),
    ("moe/e4m3/T1", "MoE block, FP8 experts, 1 token"),
]
SKIP_FAMILIES = {"launch"}  # a one-element fill: the launch cost both sides pay, not an operator to compare
PEERS = {"torch": "transformers"}


def rel(path):
    return os.path.relpath(path, ROOT)


def load_json(path):
    with open(path) as f:
        return json.load(f)


# ---- loading -------------------------------------------------------------------------------------------------

class Set:
    def __init__(self, path):
        self.path = os.path.normpath(os.path.join(ROOT, path))
        name = os.path.basename(self.path)
        m = re.match(r"^(.*)-(\d{4}-\d{2}-\d{2})$", name)
        if not m:
            sys.exit(f"plots.py: {path}: a set folder is named <kind>-<YYYY-MM-DD>")
        self.kind, self.date = m.group(1), m.group(2)
        meta_path = os.path.join(self.path, "set.json")
        self.meta = load_json(meta_path) if os.path.exists(meta_path) else {}
        self.runs = self.meta.get("runs", [])
        self.files = sorted(os.listdir(self.path))

    def run_of(self, filename):
        """(index, run) of the set.json run that lists the file, else (None, {})."""
        for i, r in enumerate(self.runs):
            if any(fnmatch.fnmatch(filename, pat) for pat in r.get("files", [])):
                return i, r
        return None, {}

    def order(self, filename):
        i, _ = self.run_of(filename)
        return (0 if i is None else 1, -1 if i is None else i, filename)

    def machine(self):
        return self.meta.get("machine", self.gpu())

    def gpu(self):
        """The device's name: set.json's gpu, else what `kiln bench ops` recorded, else the kind."""
        if self.meta.get("gpu"):
            return self.meta["gpu"]
        for fn in self.files:
            if fn.endswith("kiln_ops.json"):
                g = load_json(os.path.join(self.path, fn)).get("gpu")
                if g:
                    return g
        return self.kind.upper()


def family(name):
    parts = name.split("/")
    op = parts[0]
    if op in SKIP_FAMILIES:
        return None
    key = op
    if op in ("moe", "grouped_mm"):
        key += "/" + parts[1]
    for p in parts[1:]:
        m = re.fullmatch(r"([MT])(\d+)", p)
        if m and op in ("linear", "linear_fp8", "scaled_mm", "moe", "grouped_mm"):
            n = int(m.group(2))
            cls = "1" if n == 1 else ("2-16" if n <= 16 else ">16")
            return f"{key}/{m.group(1)}{cls}"
    return key


class OpsRun:
    def __init__(self, s, kiln_file):
        self.set, self.kiln_file = s, kiln_file
        self.prefix = kiln_file[: -len("kiln_ops.json")]
        self.torch_file = self.prefix + "torch_ops.json"
        self.kiln = load_json(os.path.join(s.path, kiln_file))
        tp = os.path.join(s.path, self.torch_file)
        self.torch = load_json(tp) if os.path.exists(tp) else {"cases": []}
        self.label = self.prefix.rstrip("-_") or "ops"
        _, self.meta = s.run_of(kiln_file)
        tk = {c["name"]: c for c in self.torch.get("cases", [])}
        self.cases = {}  # name -> (kiln case, torch case)
        for c in self.kiln.get("cases", []):
            if c.get("error") or not c.get("graph_us"):
                continue
            t = tk.get(c["name"])
            if t and not t.get("error") and t.get("graph_us"):
                self.cases[c["name"]] = (c, t)

    def families(self):
        out = {}
        for name in self.cases:
            f = family(name)
            if f:
                out.setdefault(f, []).append(name)
        return out


def parse_kiln_bench_text(path):
    """Runs in a `kiln bench` printout: one per pp/tg pair of table rows, with the lines that follow it."""
    runs, cur, dtype = [], None, None
    for line in open(path):
        line = line.strip()
        m = re.match(r"kiln: preset \S+: .*?, (\w+)$", line)
        if m:
            dtype = m.group(1)
            continue
        cells = [c.strip() for c in line.strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 6 and re.fullmatch(r"(pp|tg)\d+", cells[4]):
            val = float(cells[5].split("±")[0])
            if cells[4].startswith("pp"):
                cur = {"model": cells[0], "size": cells[1], "device": cells[3], "pp": int(cells[4][2:]),
                       "pp_mean": val, "dtype": dtype}
                runs.append(cur)
            elif cur is not None:
                cur.update(tg=int(cells[4][2:]), tg_mean=val)
            continue
        if cur is None:
            continue
        m = re.match(r"decode reads ([\d.]+) GB of weights per token", line)
        if m:
            cur["bytes_per_token"] = float(m.group(1)) * 1e9
        m = re.match(r"peak memory: tensors ([\d.]+) GiB, allocator reserved ([\d.]+) GiB, driver ([\d.]+) GiB", line)
        if m:
            cur.update(peak_allocated=float(m.group(1)) * 2**30, peak_reserved=float(m.group(2)) * 2**30,
                       peak_driver=float(m.group(3)) * 2**30)
    return [r for r in runs if "tg_mean" in r]


class Engine:
    """One (set, preset, prompt) measurement of kiln or of a peer; several runs when a printout holds several."""

    def __init__(self, s, source, impl, preset, runs):
        self.set, self.source, self.impl, self.preset, self.runs = s, source, impl, preset, runs
        r0 = runs[0]
        self.pp, self.tg = r0["pp"], r0["tg"]
        self.device = r0.get("device", "cuda")
        self.dtype = r0.get("dtype")

    def values(self, key):
        return [r[key] for r in self.runs if r.get(key) is not None]

    def first(self, key):
        v = self.values(key)
        return v[0] if v else None


def load_engine(s):
    out = []
    for fn in s.files:
        p = os.path.join(s.path, fn)
        if fnmatch.fnmatch(fn, "e2e_kiln*.json"):
            d = load_json(p)
            r = {"pp": d["pp"], "tg": d["tg"], "pp_mean": d["pp_mean"], "tg_mean": d["tg_mean"],
                 "tg_tps": d.get("tg_tps"), "bytes_per_token": d.get("bytes_per_token"), "device": d.get("device"),
                 "peak_allocated": d.get("peak_allocated"), "peak_reserved": d.get("peak_reserved"),
                 "peak_driver": d.get("peak_driver")}
            out.append(Engine(s, fn, "kiln", d["model"], [r]))
        elif fnmatch.fnmatch(fn, "e2e_kiln*.txt"):
            groups = {}
            for r in parse_kiln_bench_text(p):
                groups.setdefault((r["model"], r["pp"], r["tg"]), []).append(r)
            for (model, _, _), runs in groups.items():
                out.append(Engine(s, fn, "kiln", model, runs))
        elif fnmatch.fnmatch(fn, "e2e_*.json"):
            peer = fn[len("e2e_"):].split("_")[0]
            d = load_json(p)
            label = PEERS.get(peer, peer)
            version = d.get(label) or d.get(peer)
            r = {"pp": d["pp"], "tg": d["tg"], "pp_mean": d.get("pp_median"), "tg_mean": d.get("tg_median"),
                 "tg_tps": d.get("tg_tps"), "pp_tps": d.get("pp_tps"), "peak_allocated": d.get("peak_allocated"),
                 "peak_reserved": d.get("peak_reserved"), "version": version,
                 "experts": re.sub(r"[{}'\" ]|^:", "", str(d.get("impl", ""))).split(":")[-1]}
            out.append(Engine(s, fn, label, d["preset"], [r]))
    return out


class Data:
    def __init__(self, set_paths):
        self.sets = [Set(p) for p in set_paths]
        self.kinds = []
        for s in self.sets:
            if s.kind not in self.kinds:
                self.kinds.append(s.kind)
        self.ops = []     # OpsRun, oldest first
        self.engine = []  # Engine
        self.cpu_ops = []  # (set, file)
        for s in self.sets:
            for fn in sorted((f for f in s.files if f.endswith("kiln_ops.json")), key=s.order):
                self.ops.append(OpsRun(s, fn))
            self.engine += load_engine(s)
            self.cpu_ops += [(s, fn) for fn in sorted(s.files, key=s.order) if fnmatch.fnmatch(fn, "cpu_ops*.txt")]

    def sets_of(self, kind):
        return [s for s in self.sets if s.kind == kind]

    def copy_gbps(self, s):
        """The device-to-device copy bandwidth `kiln bench ops` measured in this set, else in the kind's sets."""
        own = [r.kiln["copy_gbps"] for r in self.ops if r.set is s and r.kiln.get("copy_gbps")]
        if own:
            return statistics.median(own), s
        for other in reversed(self.sets_of(s.kind)):
            v = [r.kiln["copy_gbps"] for r in self.ops if r.set is other and r.kiln.get("copy_gbps")]
            if v:
                return statistics.median(v), other
        return None, None

    def bytes_per_token(self, e):
        v = e.first("bytes_per_token")
        if v:
            return v
        same = [x.first("bytes_per_token") for x in self.engine if x.preset == e.preset and x.impl == "kiln"]
        same = [v for v in same if v]
        return same[-1] if same else None


# ---- formatting ----------------------------------------------------------------------------------------------

def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def fmt(v, spec):
    return "–" if v is None else format(v, spec)


def rate(vals, spec=".1f"):
    """One run: its value; several: their range."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return "–"
    if len(vals) == 1 or min(vals) == max(vals):
        return format(vals[0], spec)
    return f"{format(min(vals), spec)}–{format(max(vals), spec)}"


def gib(e, keys=("peak_allocated", "peak_reserved", "peak_driver")):
    vals = [e.first(k) for k in keys]
    if all(v is None for v in vals):
        return "–"
    return " / ".join(fmt(v / 2**30 if v is not None else None, ".2f") for v in vals)


def table(header, rows, align):
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def drop_empty_columns(header, rows, align):
    keep = [i for i in range(len(header)) if any(r[i] != "–" for r in rows)]
    return [header[i] for i in keep], [[r[i] for i in keep] for r in rows], [align[i] for i in keep]


def source_line(s, files):
    """Where a table's figures come from: the set folder, the files, each run's commit and command."""
    runs, seen = [], set()
    for fn in files:
        i, r = s.run_of(fn)
        if i is not None and i not in seen:
            seen.add(i)
            runs.append(r)
    lines = [f"`{rel(s.path)}/` ({s.date}, {s.machine()}):"]
    if not runs:
        lines.append("files " + ", ".join(f"`{f}`" for f in sorted(set(files))))
    for r in runs:
        lines.append(f"- {r.get('what', '')}: `{' '.join(r.get('files', []))}`, commit {r.get('commit', '?')}:")
        lines.append(f"  `{r.get('command', '?')}`")
    return lines


def preset_order(p):
    """qwen3-8b before qwen3-30b-a3b, each preset before its -fp8 variant."""
    base = p.replace("-fp8", "")
    return ([int(t) if t.isdigit() else t for t in re.split(r"(\d+)", base)], p.endswith("-fp8"))


# ---- tables --------------------------------------------------------------------------------------------------

def peers_set(data, kind):
    for s in reversed(data.sets_of(kind)):
        if any(e.set is s and e.impl != "kiln" for e in data.engine):
            return s
    return None


def engine_peers_table(data, kind):
    s = peers_set(data, kind)
    if s is None:
        return None
    kiln = sorted((e for e in data.engine if e.set is s and e.impl == "kiln"),
                  key=lambda e: (preset_order(e.preset), e.pp))
    peers = [e for e in data.engine if e.set is s and e.impl != "kiln"]
    copy, copy_set = data.copy_gbps(s)
    names = sorted({p.impl for p in peers})
    header = ["preset", "prompt", "prefill t/s", "decode t/s", "GB/s", "% of copy", "peak GiB (tensors / reserved / driver)"]
    align = ["l", "r", "r", "r", "r", "r", "r"]
    for n in names:
        header += [f"{n} prefill t/s", f"{n} decode t/s", f"{n} peak GiB (tensors / reserved)", f"kiln / {n}"]
        align += ["r", "r", "r", "r"]
    rows = []
    for e in kiln:
        bpt = data.bytes_per_token(e)
        tg = e.first("tg_mean")
        gbps = tg * bpt / 1e9 if bpt and tg else None
        row = [e.preset, str(e.pp), fmt(e.first("pp_mean"), ".0f"), fmt(tg, ".1f"), fmt(gbps, ".0f"),
               fmt(100 * gbps / copy if gbps and copy else None, ".0f"), gib(e)]
        for n in names:
            p = next((p for p in peers if p.impl == n and p.preset == e.preset and p.pp == e.pp and p.tg == e.tg), None)
            if p is None:
                row += ["–"] * 4
                continue
            reps = p.first("tg_tps") or []
            dec = fmt(p.first("tg_mean"), ".1f")
            if len(reps) > 1:
                dec += " (" + ", ".join(format(v, ".1f") for v in reps) + ")"
            row += [fmt(p.first("pp_mean"), ".0f"), dec, gib(p, ("peak_allocated", "peak_reserved")),
                    fmt(tg / p.first("tg_mean") if tg and p.first("tg_mean") else None, ".1f") + "x"]
        rows.append(row)
    header, rows, align = drop_empty_columns(header, rows, align)
    out = table(header, rows, align)
    out.append("")
    out += source_line(s, [e.source for e in kiln + peers])
    vers = sorted({f"{p.impl} {p.first('version')}" for p in peers if p.first("version")})
    experts = sorted({f"{p.preset}: experts through `{p.first('experts')}`" for p in peers
                      if p.first("experts") and p.first("experts") != "dense"})
    notes = []
    if vers:
        notes.append("Peer: " + ", ".join(vers) + (" (" + "; ".join(experts) + ")" if experts else "") +
                     "; its decode rate is the median of its repeats, listed in brackets.")
    if copy:
        where = "this set" if copy_set is s else f"`{rel(copy_set.path)}/`"
        notes.append(f"% of copy: against {copy:.0f} GB/s, the device-to-device copy rate `kiln bench ops` "
                     f"measured in {where}.")
    if notes:
        out += [""] + notes
    return "\n".join(out)


def latest_engine(data, kind):
    """(preset, pp, tg) -> the newest kiln measurement of this kind."""
    best = {}
    for s in data.sets_of(kind):
        for e in data.engine:
            if e.set is s and e.impl == "kiln":
                best[(e.preset, e.pp, e.tg)] = e
    return best


def engine_latest_table(data, kind):
    ps = peers_set(data, kind)
    best = latest_engine(data, kind)
    rows_e = sorted((e for e in best.values() if e.set is not ps), key=lambda e: (preset_order(e.preset), e.pp))
    if not rows_e:
        return None
    header = ["preset", "prompt", "decoded", "prefill t/s", "decode t/s", "GB/s", "% of copy",
              "peak GiB (tensors / reserved / driver)", "measured"]
    align = ["l", "r", "r", "r", "r", "r", "r", "r", "l"]
    rows, sets = [], []
    for e in rows_e:
        bpt = data.bytes_per_token(e)
        copy, _ = data.copy_gbps(e.set)
        tgs = e.values("tg_mean")
        gbps = [t * bpt / 1e9 for t in tgs] if bpt else []
        pct = [100 * g / copy for g in gbps] if copy and e.device != "cpu" else []
        rows.append([e.preset, str(e.pp), str(e.tg), rate(e.values("pp_mean"), ".0f"), rate(tgs),
                     rate(gbps, ".0f"), rate(pct, ".0f"), gib(e), e.set.date])
        sets.append(e.set)
    header, rows, align = drop_empty_columns(header, rows, align)
    out = table(header, rows, align)
    for s in sorted(dict.fromkeys(sets), key=lambda s: s.date, reverse=True):
        out.append("")
        out += source_line(s, [e.source for e in rows_e if e.set is s])
    if any(len(e.runs) > 1 for e in rows_e):
        out += ["", "A range is the lowest and highest of the runs in the file."]
    return "\n".join(out)


def ops_families(data, kind):
    """family -> (OpsRun, [case names]) from the newest run that measured all of the family's cases."""
    runs = [r for r in data.ops if r.set.kind == kind]
    full = {}
    for r in runs:
        for f, names in r.families().items():
            if len(names) >= len(full.get(f, ())):
                full[f] = set(names)
    chosen = {}
    for r in runs:
        for f, names in r.families().items():
            if set(names) >= full[f]:
                chosen[f] = (r, names)
    return chosen


def family_order(keys):
    known = [k for k, _ in FAMILIES if k in keys]
    return known + sorted(k for k in keys if k not in dict(FAMILIES))


def ops_table(data, kind):
    chosen = ops_families(data, kind)
    if not chosen:
        return None
    header = ["family", "cases", "PyTorch / kiln, graph-replayed", "eager", "slowest case: ratio (kiln / PyTorch µs)",
              "PyTorch runs", "run"]
    align = ["l", "r", "r", "r", "l", "l", "l"]
    rows, used = [], []
    for f in family_order(chosen):
        r, names = chosen[f]
        ratios = {n: r.cases[n][1]["graph_us"] / r.cases[n][0]["graph_us"] for n in names}
        eager = [r.cases[n][1].get("eager_us", 0) / r.cases[n][0]["eager_us"] for n in names
                 if r.cases[n][0].get("eager_us") and r.cases[n][1].get("eager_us")]
        worst = min(ratios, key=ratios.get)
        k, t = r.cases[worst]
        rows.append([dict(FAMILIES).get(f, f), str(len(names)), f"**{geomean(ratios.values()):.2f}**",
                     fmt(geomean(eager), ".2f"),
                     f"`{worst}`: {ratios[worst]:.2f} ({k['graph_us']:.2f} / {t['graph_us']:.2f})",
                     ", ".join(sorted({f"`{r.cases[n][1].get('impl_graph')}`" for n in names
                                       if r.cases[n][1].get("impl_graph")})) or "–",
                     f"{r.set.date} {r.label}"])
        used.append(r)
    out = table(header, rows, align)
    for s in dict.fromkeys(r.set for r in used):
        out.append("")
        files = [x for r in sorted(set(used), key=lambda r: r.set.order(r.kiln_file)) if r.set is s
                 for x in (r.kiln_file, r.torch_file)]
        out += source_line(s, files)
    tv = sorted({r.torch.get("torch_version") for r in used if r.torch.get("torch_version")})
    if tv:
        out += ["", f"PyTorch {', '.join(tv)}."]
    return "\n".join(out)


def cpu_ops_table(data, kind):
    files = [(s, fn) for s, fn in data.cpu_ops if s.kind == kind]
    if not files:
        return None
    s, fn = files[-1]
    text = open(os.path.join(s.path, fn)).read().splitlines()
    prods, dtypes = {}, []
    for line in text:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) != 3 or not re.match(r"[\d.]+$", cells[1]):
            continue
        tok = cells[0].split()
        op, dt, rows, shape = tok[0], tok[1], tok[-1], " ".join(tok[2:-1])
        if dt not in dtypes:
            dtypes.append(dt)
        prods.setdefault((op, shape, rows), {})[dt] = (float(cells[1]), float(cells[2]))
    header = ["product", "shape", "rows"] + [f"{d} ms (weight GB/s)" for d in dtypes]
    align = ["l", "l", "r"] + ["r"] * len(dtypes)
    rows = []
    for (op, shape, r), per in prods.items():
        rows.append([op, shape, r] + [f"{per[d][0]:.2f} ({per[d][1]:.1f})" if d in per else "–" for d in dtypes])
    out = table(header, rows, align)
    head = next((l for l in text if l.strip() and not l.startswith("|")), "")
    m = re.search(r"(\d+) repeats", head)
    if m:
        out += ["", f"Median of {m.group(1)} repeats; weight GB/s = the weight's bytes / time."]
    out += [""] + source_line(s, [fn])
    return "\n".join(out)


def headline_table(data, kind):
    s = peers_set(data, kind)
    if s is None:
        return None
    rows = []
    for e in sorted((e for e in data.engine if e.set is s and e.impl == "kiln"), key=lambda e: preset_order(e.preset)):
        for p in data.engine:
            if p.set is s and p.impl != "kiln" and p.preset == e.preset and p.pp == e.pp and p.tg == e.tg:
                k, t = e.first("tg_mean"), p.first("tg_mean")
                rows.append([e.preset, f"{e.pp} / {e.tg}", f"{k:.1f}", f"{t:.1f}", f"{k / t:.1f}x", p.impl])
    if not rows:
        return None
    peer = rows[0][5]
    out = table(["preset (bf16, batch 1)", "prompt / decoded", "kiln decode t/s", f"{peer} decode t/s", "kiln / " + peer],
                [r[:5] for r in rows], ["l", "r", "r", "r", "r"])
    out += ["", f"One {s.gpu()}, {s.date}, both in one run (`{rel(s.path)}/`)."]
    best = latest_engine(data, kind)
    newer = [best[(e.preset, e.pp, e.tg)] for e in data.engine
             if e.set is s and e.impl == "kiln" and any(r[0] == e.preset and r[1] == f"{e.pp} / {e.tg}" for r in rows)]
    newer = sorted((e for e in newer if e.set is not s), key=lambda e: preset_order(e.preset))
    if newer:
        out[-1] += " kiln measured again without the peer: " + ", ".join(
            f"{e.preset} {rate(e.values('tg_mean'))} t/s ({e.set.date})" for e in newer) + "."
    return "\n".join(out)


def tests_summary(data, kind):
    """The newest scripts/device-test.sh log of this kind, summed up."""
    found = [(s, fn) for s in data.sets_of(kind) for fn in sorted(s.files, key=s.order) if fn.endswith("ctest.log")]
    if not found:
        return None
    s, fn = found[-1]
    exes = passed = skipped = 0
    failed, notes = [], []
    for line in open(os.path.join(s.path, fn)):
        m = re.match(r"== (\S+): (.*)", line)
        if m and m.group(1).endswith("_tests"):
            exes += 1
            body = m.group(2)
            passed += sum(int(x) for x in re.findall(r"\[  PASSED  \] (\d+) test", body))
            sk = re.findall(r"\[  SKIPPED \] (\d+) test", body)
            skipped += sum(int(x) for x in sk)
            if not re.search(r"exit 0 after", body) or "[  FAILED  ]" in body:
                failed.append(m.group(1))
            continue
        m = re.match(r"(\d+)% tests passed(?:, (\d+) tests failed)? out of (\d+)", line)
        if m:
            bad = int(m.group(2) or 0)
            notes.append(f"{int(m.group(3)) - bad} of {m.group(3)} command-line tests passed")
            continue
        m = re.match(r"== concurrent golden tests \(([^)]*)\): (\d+) of (\d+) model runs failed", line)
        if m:
            notes.append(f"{m.group(2)} of {m.group(3)} concurrent golden-model runs failed ({m.group(1)})")
    verdict = "Every test executable passed" if not failed else "Failed: " + ", ".join(failed)
    out = [f"{verdict}: {exes} GoogleTest executables, {passed} tests passed, {skipped} skipped"
           + ("; " + "; ".join(notes) if notes else "") + "."]
    out += [""] + source_line(s, [fn])
    return "\n".join(out)


def demo_output(data, kind):
    """The operator table and memory line `kiln demo` printed in the newest device test of this kind."""
    found = [(s, fn) for s in data.sets_of(kind) for fn in sorted(s.files, key=s.order) if fn.endswith("info.txt")]
    for s, fn in reversed(found):
        lines = open(os.path.join(s.path, fn)).read().splitlines()
        start = next((i for i, l in enumerate(lines) if l.startswith("operator (")), None)
        if start is None:
            continue
        end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
        mem = [l for l in lines[end:] if l.startswith("memory on ")]
        dev = next((m.group(1).split(",")[0] for m in (re.match(r"\s*cuda:\d+:\s*(.*)", l) for l in lines) if m),
                   s.gpu())
        out = ["```"] + lines[start:end] + ([""] + mem[:1] if mem else []) + ["```", ""]
        out.append(f"`kiln demo` on one {dev}, {s.date} (`{rel(s.path)}/{fn}`).")
        return "\n".join(out)
    return None


def all_tables(data):
    blocks = {}
    for kind in data.kinds:
        for name, fn in (("headline", headline_table), ("engine-peers", engine_peers_table),
                         ("engine", engine_latest_table), ("ops", ops_table), ("cpu-ops", cpu_ops_table),
                         ("tests", tests_summary), ("demo", demo_output)):
            t = fn(data, kind)
            if t:
                blocks[f"{name} {kind}"] = t
    return blocks


# ---- plots ---------------------------------------------------------------------------------------------------

def plots(data, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plots.py: the plots need matplotlib (pip install matplotlib); --tables works without it")
    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    os.makedirs(out_dir, exist_ok=True)
    written = []

    def save(fig, name):
        path = os.path.join(out_dir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        written.append(path)

    for kind in data.kinds:
        gpu = [e for e in data.engine if e.set.kind == kind and e.device != "cpu"]
        if gpu:
            # Decode rate per preset against the rate at which the card copies the weights one token reads.
            best = latest_engine(data, kind)
            ps = peers_set(data, kind)
            presets = sorted({e.preset for e in gpu if e.impl == "kiln"}, key=preset_order)
            pp0 = min(e.pp for e in gpu if e.impl == "kiln")
            fig, ax = plt.subplots(figsize=(7.5, 3.8))
            width = 0.27
            labels_done = set()
            for i, p in enumerate(presets):
                cands = [e for (pr, pp, tg), e in best.items() if pr == p and pp == pp0]
                bars = []
                if cands:
                    e = cands[0]
                    bars.append(("kiln, newest measurement (date on the bar)", e.first("tg_mean"), "#c0392b", e.set.date))
                if ps is not None:
                    e2 = next((e for e in data.engine if e.set is ps and e.impl == "kiln" and e.preset == p and e.pp == pp0), None)
                    if e2 is not None and (not cands or cands[0] is not e2):
                        bars.append((f"kiln, {ps.date} (run with the peer)", e2.first("tg_mean"), "#e6a19a", ps.date))
                    for peer in (e for e in data.engine if e.set is ps and e.impl != "kiln" and e.preset == p and e.pp == pp0):
                        bars.append((f"{peer.impl}, {ps.date}", peer.first("tg_mean"), "#7f8c8d", ps.date))
                for j, (lab, v, col, date) in enumerate(bars):
                    x = i + (j - (len(bars) - 1) / 2) * width
                    ax.bar(x, v, width * 0.95, color=col, label=None if lab in labels_done else lab)
                    labels_done.add(lab)
                    ax.text(x, v, f"{v:.0f}\n{date[5:]}" if j == 0 else f"{v:.0f}", ha="center", va="bottom", fontsize=6.5)
                ref = cands[0] if cands else None
                bpt = data.bytes_per_token(ref) if ref else None
                copy, _ = data.copy_gbps(ref.set) if ref else (None, None)
                if bpt and copy:
                    lim = copy * 1e9 / bpt
                    lab = "limit: copy rate / weight bytes per token"
                    ax.hlines(lim, i - 0.45, i + 0.45, colors="black", linestyles="--",
                              label=None if lab in labels_done else lab)
                    labels_done.add(lab)
                    ax.text(i + 0.45, lim, f" {lim:.0f}", va="center", fontsize=7)
            ax.set_xticks(range(len(presets)), presets)
            ax.set_ylabel("decode tokens/s (batch 1)")
            ax.set_xlim(-0.6, len(presets) - 0.1)
            ax.set_title(f"{kind.upper()}: decode after a {pp0}-token prompt, against the bandwidth limit", fontsize=9)
            ax.legend(fontsize=7, frameon=False, loc="upper left")
            save(fig, f"{kind}-decode-bandwidth.png")

            # Decode rate against the prompt length: colour per preset, line style and marker per set.
            fig, ax = plt.subplots(figsize=(8, 3.8))
            colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
            styles, markers = [":", "--", "-."], ["s", "^", "D"]
            sets = data.sets_of(kind)
            prompts = set()
            for pi, p in enumerate(presets):
                for si, s in enumerate(sets):
                    pts = sorted((e.pp, e.first("tg_mean")) for e in gpu if e.set is s and e.impl == "kiln" and e.preset == p)
                    if not pts:
                        continue
                    prompts.update(x for x, _ in pts)
                    newest = si == len(sets) - 1
                    ax.plot([x for x, _ in pts], [y for _, y in pts], "-" if newest else styles[si % len(styles)],
                            marker="o" if newest else markers[si % len(markers)], ms=4, color=colors[pi % len(colors)],
                            label=f"{p} ({s.date})")
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(prompts), [str(x) for x in sorted(prompts)])
            ax.minorticks_off()
            ax.set_xlabel("prompt length (tokens in the cache before the decoded ones)")
            ax.set_ylabel("decode tokens/s (batch 1)")
            ax.set_title(f"{kind.upper()}: kiln's decode rate against context length", fontsize=9)
            ax.legend(fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5))
            save(fig, f"{kind}-decode-context.png")

        chosen = ops_families(data, kind)
        if chosen:
            fams = family_order(chosen)
            fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(fams) + 1.2))
            for i, f in enumerate(fams):
                r, names = chosen[f]
                ratios = [r.cases[n][1]["graph_us"] / r.cases[n][0]["graph_us"] for n in names]
                g = geomean(ratios)
                y = len(fams) - 1 - i
                ax.barh(y, abs(g - 1), 0.6, left=min(g, 1), color="#c0392b" if g >= 1 else "#7f8c8d", alpha=0.35)
                ax.plot([g, g], [y - 0.3, y + 0.3], color="#c0392b" if g >= 1 else "#555555", lw=1.5)
                ax.scatter(ratios, [y] * len(ratios), s=9, color="black", zorder=3)
                ax.text(max(max(ratios), g) * 1.08, y, f"{g:.2f}x ({len(names)})", va="center", fontsize=7)
            ax.axvline(1, color="black", lw=0.8)
            ax.set_xscale("log")
            ax.set_yticks(range(len(fams)), [dict(FAMILIES).get(f, f) for f in reversed(fams)])
            ax.set_xlabel("PyTorch time / kiln time, graph-replayed (> 1: kiln faster)")
            dates = sorted({chosen[f][0].set.date for f in fams})
            ax.set_title(f"{kind.upper()}: operators against PyTorch ({', '.join(dates)}); bar: geomean, dots: cases",
                         fontsize=9)
            lo = min(min(r.cases[n][1]["graph_us"] / r.cases[n][0]["graph_us"] for n in names) for r, names in chosen.values())
            hi = max(max(r.cases[n][1]["graph_us"] / r.cases[n][0]["graph_us"] for n in names) for r, names in chosen.values())
            ax.set_xlim(min(lo, 1) / 1.3, hi * 2.2)
            ticks = [t for t in (0.5, 1, 2, 5, 10, 20, 50, 100) if min(lo, 1) / 1.3 <= t <= hi * 2.2]
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.minorticks_off()
            save(fig, f"{kind}-ops-ratio.png")
    return written


# ---- pages ---------------------------------------------------------------------------------------------------

BLOCK = re.compile(r"(<!-- plots\.py: ([^>]+?) -->\n)(.*?)(<!-- /plots\.py -->)", re.S)


def update_pages(blocks, pages, check):
    stale = []
    for page in pages:
        path = os.path.join(ROOT, page)
        if not os.path.exists(path):
            continue
        text = open(path).read()

        def sub(m):
            name = m.group(2).strip()
            if name not in blocks:
                print(f"plots.py: {page}: no data for the table '{name}'; left as it is", file=sys.stderr)
                return m.group(0)
            return m.group(1) + blocks[name] + "\n" + m.group(4)

        new = BLOCK.sub(sub, text)
        if new != text:
            stale.append(page)
            if not check:
                with open(path, "w") as f:
                    f.write(new)
    return stale


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--sets", nargs="+", default=DEFAULT_SETS, help="result set folders, oldest first")
    ap.add_argument("--out", default=PLOT_DIR, help=f"where the plots go (default {PLOT_DIR})")
    ap.add_argument("--tables", action="store_true", help="print every table as markdown and write nothing")
    ap.add_argument("--check", action="store_true", help="exit 1 if a page's tables differ from the results")
    a = ap.parse_args()
    data = Data(a.sets)
    blocks = all_tables(data)
    if a.tables:
        for name, t in blocks.items():
            print(f"<!-- plots.py: {name} -->\n{t}\n<!-- /plots.py -->\n")
        return 0
    if a.check:
        stale = update_pages(blocks, PAGES, check=True)
        for p in stale:
            print(f"plots.py: {p} is not what the results give; run python3 scripts/plots.py")
        return 1 if stale else 0
    for p in plots(data, os.path.join(ROOT, a.out)):
        print("wrote", rel(p))
    for p in update_pages(blocks, PAGES, check=False):
        print("updated the tables in", p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
