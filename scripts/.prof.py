#!/usr/bin/env python3
# Sum ncu --csv (details page) gpu__time_duration per kernel name; print a table sorted by total.
import csv, sys, collections, re
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr = None
tot = collections.defaultdict(float); cnt = collections.Counter(); seen = set()
order = []
for r in rows:
    if hdr is None:
        if "Kernel Name" in r and "Metric Value" in r:
            hdr = {k: i for i, k in enumerate(r)}
        continue
    if len(r) < len(hdr): continue
    if r[hdr["Metric Name"]] != "gpu__time_duration.sum": continue
    name = r[hdr["Kernel Name"]]
    name = re.sub(r"\(.*", "", name)[:90]
    v = float(r[hdr["Metric Value"]].replace(",", ""))
    unit = r[hdr["Metric Unit"]] if "Metric Unit" in hdr else "ns"
    if unit == "usecond": v *= 1e3
    if unit == "msecond": v *= 1e6
    tot[name] += v; cnt[name] += 1; order.append((r[hdr["ID"]], name, v))
all_ns = sum(tot.values())
print(f"kernels {sum(cnt.values())}, total {all_ns/1e3:.1f} us")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1]):
    print(f"{v/1e3:10.1f} us {cnt[k]:5d} x {v/1e3/cnt[k]:8.2f} us  {k}")
