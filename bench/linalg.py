"""kiln.linalg against torch.linalg (where installed) and, on the CPU, NumPy, in one process.

    python3 bench/linalg.py [--device cpu|cuda] [--repeats N] [--json FILE] [--large]

Median wall time of each case over the repeats, fresh random inputs (well-conditioned: A + n I), each call
followed by a device synchronisation on CUDA (kiln's and torch's). On the CPU NumPy's wheels carry their own
OpenBLAS build; kiln uses the system's (Debian's OpenBLAS, OpenMP). --large adds the sizes of the linear-algebra
targets (solve 4096 with 1 and 64 right-hand sides, qr 1024 and 65536 x 64, svd and eigh 1024), the default on
CUDA."""
import argparse
import json
import statistics
import time

import numpy as np

import kiln

try:
    import torch
except ImportError:
    torch = None

CASES = [
    ("inv", "float32", (65536, 4, 4)), ("inv", "float32", (16384, 16, 16)), ("inv", "float64", (512, 512)),
    ("solve", "float64", (1024, 1024)), ("lu_factor", "complex64", (64, 64)), ("lu_factor", "complex64", (1024, 64, 64)),
    ("det", "float64", (4096, 8, 8)), ("qr", "float32", (512, 512)), ("qr", "float32", (8192, 64)),
    ("svd", "float32", (256, 256)), ("svd", "float32", (4096, 8, 8)), ("eigh", "float32", (512, 512)),
    ("cholesky", "float64", (1024, 1024)),
]
# (op, dtype, shape); "solve" takes 1 right-hand side, "solve64" 64.
LARGE_CASES = [
    ("solve", "float32", (4096, 4096)), ("solve64", "float32", (4096, 4096)), ("qr", "float32", (1024, 1024)),
    ("qr", "float32", (65536, 64)), ("svd", "float32", (1024, 1024)), ("eigh", "float32", (1024, 1024)),
]


def make(shape, dtype, rng):
    a = rng.standard_normal(shape)
    if dtype == "complex64":
        a = a + 1j * rng.standard_normal(shape)
    n = shape[-1]
    if shape[-2] == n:
        a = a + n * np.eye(n)
    return a.astype(dtype)


def time_it(fn, repeats, sync=lambda: None):
    fn()
    sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json")
    ap.add_argument("--large", action="store_true", help="also the large cases (always on CUDA)")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    cuda = a.device == "cuda"
    ksync = kiln.cuda.synchronize if cuda else (lambda: None)
    tsync = torch.cuda.synchronize if (cuda and torch is not None) else (lambda: None)
    rows = []
    for op, dt, shape in CASES + (LARGE_CASES if (a.large or cuda) else []):
        x = make(shape, dt, rng)
        if op == "cholesky":
            x = (x @ np.swapaxes(x, -1, -2)).astype(dt)
        if op == "eigh":
            x = (x + np.swapaxes(x, -1, -2)).astype(dt)
        k = kiln.tensor(x, device=a.device)
        kf = {"inv": lambda: kiln.linalg.inv(k), "solve": lambda: kiln.linalg.solve(k, k[..., :1]),
              "solve64": lambda: kiln.linalg.solve(k, k[..., :64]),
              "lu_factor": lambda: kiln.linalg.lu_factor(k), "det": lambda: kiln.linalg.det(k),
              "qr": lambda: kiln.linalg.qr(k), "svd": lambda: kiln.linalg.svd(k, full_matrices=False),
              "eigh": lambda: kiln.linalg.eigh(k), "cholesky": lambda: kiln.linalg.cholesky(k)}[op]
        nf = {"inv": lambda: np.linalg.inv(x), "solve": lambda: np.linalg.solve(x, x[..., :1]),
              "solve64": lambda: np.linalg.solve(x, x[..., :64]),
              "lu_factor": None, "det": lambda: np.linalg.det(x), "qr": lambda: np.linalg.qr(x),
              "svd": lambda: np.linalg.svd(x, full_matrices=False), "eigh": lambda: np.linalg.eigh(x),
              "cholesky": lambda: np.linalg.cholesky(x)}[op]
        row = {"op": op, "dtype": dt, "shape": list(shape), "kiln_ms": time_it(kf, a.repeats, ksync),
               "numpy_ms": time_it(nf, a.repeats) if (nf and not cuda) else None}
        if torch is not None:
            t = torch.from_numpy(x).to(a.device)
            tf = {"inv": lambda: torch.linalg.inv(t), "solve": lambda: torch.linalg.solve(t, t[..., :1]),
                  "solve64": lambda: torch.linalg.solve(t, t[..., :64]),
                  "lu_factor": lambda: torch.linalg.lu_factor(t), "det": lambda: torch.linalg.det(t),
                  "qr": lambda: torch.linalg.qr(t), "svd": lambda: torch.linalg.svd(t, full_matrices=False),
                  "eigh": lambda: torch.linalg.eigh(t), "cholesky": lambda: torch.linalg.cholesky(t)}[op]
            row["torch_ms"] = time_it(tf, a.repeats, tsync)
        rows.append(row)
        fmt = lambda v: f"{v:9.3f}" if v is not None else f"{'-':>9}"
        print(f"{op:10} {dt:9} {str(shape):18} kiln {fmt(row['kiln_ms'])} ms  numpy {fmt(row['numpy_ms'])} ms"
              + (f"  torch {fmt(row['torch_ms'])} ms" if "torch_ms" in row else ""), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "cases": rows, "numpy": np.__version__,
                       "torch": getattr(torch, "__version__", None)}, f, indent=1)


if __name__ == "__main__":
    main()
