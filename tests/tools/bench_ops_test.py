#!/usr/bin/env python3
"""Tests of `kiln bench ops` that need no GPU: the case table (names, counts, byte counts), that
bench/torch_ops.py holds the same table, the command line's errors, the graceful refusal without a GPU (or,
on a GPU, a tiny run's JSON schema), and scripts/bench_table.py on synthetic results.

    bench_ops_test.py KILN_EXECUTABLE SOURCE_DIR
"""
import json
import os
import re
import subprocess
import sys
import tempfile

KILN, SRC = sys.argv[1], sys.argv[2]
TORCH_OPS = os.path.join(SRC, "bench", "torch_ops.py")
TABLE = os.path.join(SRC, "scripts", "bench_table.py")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what)


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def listing(cmd):
    r = run(cmd)
    check(r.returncode == 0, f"{cmd} exits 0 (got {r.returncode}: {r.stderr.strip()})")
    return [line.split() for line in r.stdout.splitlines() if line.strip()]


# ---- the case table -------------------------------------------------------------------------------------
kiln_cases = listing([KILN, "bench", "ops", "--list"])
names = [c[0] for c in kiln_cases]
check(len(names) == len(set(names)), "case names are unique")
for n in names:
    check(re.fullmatch(r"([a-z_0-9]+|linalg/[a-z_]+|pad/[a-z]+)/(bf16|f32|f64|c64|e4m3|i64)(/[A-Za-z0-9_.]+)+", n) is not None,
          f"name {n!r} is regex-friendly")
count = {}
for n in names:
    count[n.split("/")[0]] = count.get(n.split("/")[0], 0) + 1
expected = {"launch": 1, "linear": 73, "linear_q4_k": 10, "linear_q8_0": 10, "linear_q5_k": 10, "linear_q6_k": 10,
            "linear_fp8": 27, "scaled_mm": 24, "softmax": 8, "log_softmax": 8, "rms_norm": 6, "add_rms_norm": 4,
            "rope": 4, "silu_and_mul": 5, "sample": 6, "decode_attention": 16,
            "sdpa_prefill": 9, "grouped_mm": 18, "moe": 9, "linalg": 13, "bincount": 1, "pad": 2, "dropout": 1,
            "conv2d": 3, "conv3d": 1, "layer_norm": 1, "group_norm": 2, "batch_norm": 2, "cross_entropy": 1}
check(count == expected, f"cases per op {count} == {expected}")
check(sum("/M1/" in n and n.startswith("linear/") for n in names) == 54, "54 linear M = 1 cases (27 shapes x bias)")
check(sum(n.endswith("/bias") for n in names) == 27, "27 linear cases with bias")
by_name = {c[0]: (int(c[1]), int(c[2]), int(c[3])) for c in kiln_cases}
k, n = 4096, 14336
check(by_name.get("linear/bf16/M1/K4096/N14336/bias") == (2 * (k + n * k + n + n), 2 * (k + n * k + n), 2048),
      "linear bytes: x + weight + bias read, output written (bf16)")
check(by_name.get("softmax/f32/1x128256", (0,))[0] == 2 * 4 * 128256, "softmax f32 bytes: read + write")
check(by_name.get("add_rms_norm/bf16/1x4096", (0,))[0] == 2 * (4 * 4096 + 4096), "add_rms_norm bytes")
check(by_name.get("rope/bf16/T1/Hq32/Hk8/D128", (0,))[0] == 2 * 2 * 40 * 128 + 8 + 4 * 64, "rope bytes")
check(by_name.get("silu_and_mul/bf16/M1/I6144", (0,))[0] == 2 * 3 * 6144, "silu_and_mul bytes")
check(by_name.get("cross_entropy/bf16/4096x151936", (0,))[0] == 2 * 4096 * 151936 + 8 * 4096 + 2,
      "cross_entropy bytes: logits and targets read, the loss written")
check(by_name.get("pad/reflect/bf16/1x128x16x256x256/p1", (0,))[0] == 2 * 128 * (16 * 256 * 256 + 18 * 258 * 258),
      "pad bytes: input read, padded output written")
check(by_name.get("sample/f32/1x151936/t0.7_k20_p0.8", (0,))[0] == 4 * 151936 + 8, "sample bytes")
check(by_name.get("grouped_mm/bf16/T1/E128_H2048_I768/gate_up", (0,))[0] ==
      2 * (8 * 1536 * 2048 + 8 * 2048 + 8 * 1536) + 4 * 128, "grouped_mm decode bytes: 8 experts' weights, a, out, offs")
check(by_name.get("moe/bf16/T512/E64_H2048_I1408/top8", (0,))[0] == 2 * (64 * 2048 + 64 * 3 * 1408 * 2048 + 2 * 512 * 2048),
      "moe prefill bytes: router, every expert, x, out")
check("sample/f32/1x128256/t1_p0.9" in by_name and "sample/f32/1x151936/greedy" in by_name, "sampling variants")
check(by_name.get("linalg/inv_ex/f32/65536x4x4") == (2 * 4 * 65536 * 16 + 4 * 65536, 4 * 65536 * 16, 256),
      "inv_ex bytes: A read, the inverse and info written")
check(by_name.get("linalg/solve/f32/65536x4x4/rhs1", (0,))[0] == 4 * 65536 * (16 + 4 + 4), "solve bytes: A, b, x")

# bench/torch_ops.py holds the same table (its --list needs no PyTorch and no GPU).
torch_cases = listing([sys.executable, TORCH_OPS, "--list"])
check(torch_cases == kiln_cases, "bench/torch_ops.py --list prints exactly `kiln bench ops --list`")
flt = "^(rope|sample)/.*1x1"
check(listing([KILN, "bench", "ops", "--list", "--filter", flt]) ==
      listing([sys.executable, TORCH_OPS, "--list", "--filter", flt]), "--filter selects the same cases on both sides")
check(len(listing([KILN, "bench", "ops", "--list", "--filter", "^linear/bf16/M16/"])) == 5, "--filter is a regex search")

# ---- the command line's errors ----------------------------------------------------------------------------
for cmd, rc, text in [
    ([KILN, "bench", "ops", "--filter", "(", "--list"], 1, "not a valid regular expression"),
    ([KILN, "bench", "ops", "--filter", "no-such-case"], 1, "no case matches"),
    ([KILN, "bench", "ops", "--repeats", "0"], None, "--repeats"),
    ([KILN, "bench", "ops", "--device", "cpu"], 1, "--device must be cuda"),
    ([KILN, "bench"], None, "--preset NAME"),
    ([sys.executable, TORCH_OPS, "--filter", "(", "--list"], 1, "not a valid regular expression"),
]:
    r = run(cmd)
    check(r.returncode != 0 and (rc is None or r.returncode == rc), f"{cmd[1:]} fails (rc {r.returncode})")
    check(text in r.stdout + r.stderr, f"{cmd[1:]} says {text!r}: {r.stdout + r.stderr!r}")

# ---- a run: refused with a clear message without a GPU; on a GPU, one tiny case and its JSON ---------------
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "kiln.json")
    r = run([KILN, "bench", "ops", "--filter", "^rms_norm/bf16/8x128$", "--repeats", "3", "--json", out])
    if r.returncode == 2:
        check("no CUDA device available" in r.stderr, f"without a GPU the refusal says why: {r.stderr!r}")
        check(not os.path.exists(out), "without a GPU no JSON is written")
    else:
        check(r.returncode == 0, f"a one-case run on the GPU exits 0 (got {r.returncode}: {r.stderr})")
        data = json.load(open(out))
        check({"gpu", "copy_gbps", "cases"} <= set(data) and data["copy_gbps"] > 0, "JSON header")
        case = data["cases"][0] if data["cases"] else {}
        check({"name", "eager_us", "graph_us", "bytes", "gbps", "pct_copy"} <= set(case), f"JSON case keys {case}")
        check(case.get("name") == "rms_norm/bf16/8x128" and case.get("bytes") == by_name["rms_norm/bf16/8x128"][0],
              "JSON case name and bytes")
        check("error" in case or (case["graph_us"] > 0 and case["eager_us"] > 0), "times are positive or an error")

    # ---- scripts/bench_table.py on synthetic results --------------------------------------------------------
    kiln_rows, torch_rows = [], []
    for i, (name, nbytes, _, _) in enumerate(c for c in kiln_cases if not c[0].startswith("launch/")):
        nbytes = int(nbytes)
        k_us = 1.0 + i % 7
        kiln_rows.append({"name": name, "eager_us": 2 * k_us, "graph_us": k_us, "bytes": nbytes,
                          "gbps": nbytes / k_us / 1e3, "pct_copy": 1.0})
        t_us = 2 * k_us if name.startswith("linear/") else k_us
        torch_rows.append({"name": name, "eager_us": 2 * t_us, "graph_us": t_us, "bytes": nbytes,
                           "gbps": None, "pct_copy": None})
    kiln_rows[-1].update(graph_us=None, error="graph: sample: no CUDA implementation yet")
    del torch_rows[-2]
    kj, tj = os.path.join(tmp, "k.json"), os.path.join(tmp, "t.json")
    json.dump({"gpu": "Test GPU", "copy_gbps": 4000.0, "cases": kiln_rows}, open(kj, "w"))
    json.dump({"gpu": "Test GPU", "copy_gbps": 4100.0, "torch_version": "2.11", "cases": torch_rows}, open(tj, "w"))
    md_path, png = os.path.join(tmp, "t.md"), os.path.join(tmp, "t.png")
    r = run([sys.executable, TABLE, kj, tj, "--md", md_path, "--png", png])
    check(r.returncode == 0, f"bench_table.py exits 0: {r.stderr}")
    md = open(md_path).read() if os.path.exists(md_path) else ""
    check("| linear, M = 1 (27 shapes, with and without bias) | 54 | 2.00 | 2.00 |" in md,
          "geometric mean of the linear ratios (torch twice as slow: 2.00)")
    check("| softmax | 8 | 1.00 | 1.00 |" in md, "per-family geometric mean")
    row = [line for line in md.splitlines() if line.startswith("| linear/bf16/M1/K2048/N4096 |")]
    check(row == ["| linear/bf16/M1/K2048/N4096 | 1.00 | 2.00 | 2.00 | 2.00 | 4.00 | 2.00 | 16790 | 1.0 |"],
          f"a linear row: {row}")
    check(f"| {kiln_cases[-1][0]} | error |" in md and "no CUDA implementation yet" in md, "an error row and its note")
    check(f"| {kiln_cases[-2][0]} | " in md and "not run" in md, "a case PyTorch did not run")
    check(os.path.exists(png) or "skipping the plot" in r.stdout, "the plot is written or skipped with a message")

print(f"{len(failures)} failures" if failures else "all checks passed")
sys.exit(1 if failures else 0)
