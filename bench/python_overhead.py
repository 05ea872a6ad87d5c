"""Python-side call overhead of tiny ops: kiln against PyTorch eager in the same process.

    python3 bench/python_overhead.py [--device cpu|cuda] [--repeats N] [--json FILE]

Each case runs a 1-element `a + b` and a one-row `linear` (1 x 64 by 64 x 64) many times in a loop and
reports the median over repeats of the per-call time. On the CPU this is the whole call; on CUDA the loop
only enqueues (the GPU runs behind) and a synchronisation closes each repeat, so the figure is the host's cost
per launched op. Without torch, kiln's figures alone."""
import argparse
import json
import statistics
import time

import kiln

try:
    import torch
except ImportError:
    torch = None


def per_call_us(fn, sync, calls=2000, repeats=15):
    for _ in range(200):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if kiln.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = a.device
    ksync = (lambda: kiln.cuda.synchronize()) if dev.startswith("cuda") else (lambda: None)
    ka, kb = kiln.ones(1, device=dev), kiln.ones(1, device=dev)
    kx, kw = kiln.randn(1, 64, device=dev), kiln.randn(64, 64, device=dev)
    rows = [("a + b [1]", per_call_us(lambda: ka + kb, ksync, repeats=a.repeats)),
            ("linear [1, 64] x [64, 64]", per_call_us(lambda: kiln.linear(kx, kw), ksync, repeats=a.repeats))]
    out = {"device": dev, "kiln": {n: v for n, v in rows}}
    if torch is not None and (dev == "cpu" or torch.cuda.is_available()):
        tsync = (lambda: torch.cuda.synchronize()) if dev.startswith("cuda") else (lambda: None)
        ta, tb = torch.ones(1, device=dev), torch.ones(1, device=dev)
        tx, tw = torch.randn(1, 64, device=dev), torch.randn(64, 64, device=dev)
        F = torch.nn.functional
        with torch.inference_mode():
            out["torch"] = {"a + b [1]": per_call_us(lambda: ta + tb, tsync, repeats=a.repeats),
                            "linear [1, 64] x [64, 64]": per_call_us(lambda: F.linear(tx, tw), tsync, repeats=a.repeats)}
        out["torch_version"] = torch.__version__
    print(f"device {dev}: median µs per call")
    print(f"{'case':28} {'kiln':>8} {'torch':>8}")
    for name, v in rows:
        t = out.get("torch", {}).get(name)
        print(f"{name:28} {v:8.2f} {t:8.2f}" if t is not None else f"{name:28} {v:8.2f} {'-':>8}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
