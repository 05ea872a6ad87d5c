#!/usr/bin/env python3
"""Writes tests/data/conversions.json: PyTorch's conversions between dtypes, for kiln's conversion tests.

Run with torch installed (2.11 was used). On a machine with CUDA the same conversions are also done on the
GPU and stored under "cuda" (with "cuda_differs" listing the tables where GPU and CPU bits differ).
Bit patterns are stored as unsigned integers.
"""
import json, os, random, struct, sys

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "conversions.json")


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_of(t):
    t = t.cpu().contiguous()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    mask = (1 << (8 * t.element_size())) - 1
    return [v & mask for v in t.view(view).tolist()]


def f32_inputs():
    s = set()
    def add(v):
        if isinstance(v, float):
            v = f32_bits(v)
        s.add(v & 0xFFFFFFFF)
        s.add((v ^ 0x80000000) & 0xFFFFFFFF)
    # Around every f16/bf16/fp8 representable value near the top of the range, the smallest normals and
    # subnormals: the value, the midpoints to its neighbours and one f32 ulp either side of them.
    for dt in (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        nb = torch.finfo(dt).bits
        codes = list(range(0, 1 << (nb - 1)))
        vals = torch.tensor(codes, dtype=torch.int16 if nb == 16 else torch.uint8)
        vals = vals.view(dt).float().tolist()
        vals = sorted(v for v in vals if v == v and abs(v) != float("inf"))
        chosen = vals[:40] + vals[-40:] if nb == 16 else vals
        for i, v in enumerate(chosen):
            add(v)
            b = f32_bits(v)
            add(b + 1)
            add(max(b - 1, 0))
        for a, c in zip(vals, vals[1:]):
            if nb == 16 and not (a in chosen and c in chosen):
                continue
            m = f32_bits((a + c) / 2)
            for d in (-1, 0, 1):
                add(m + d)
    for v in (65504.0, 65520.0, 448.0, 464.0, 480.0, 57344.0, 61440.0, 65519.99, 3.3895314e38,
              6.1035156e-05, 5.9604645e-08, 2.9802322e-08, 1.1754944e-38, 1e-45, 0.0, 1.0, 0.5, 1.5, 2.5,
              float("inf"), 1.0000001, 0.1, 1 / 3):
        add(v)
        add(f32_bits(v) + 1)
        add(f32_bits(v) - 1 if v else 0)
    for b in (0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x7FA00000, 0x7F802000, 0x7FC00001, 0x7FE12345, 0x7F800100):
        add(b)
    rng = random.Random(20240611)
    for _ in range(3000):
        add(rng.getrandbits(32))
    return sorted(s)


def f64_inputs():
    rng = random.Random(7)
    vals = []
    # Double-rounding cases: a double just above/below an f16/bf16 midpoint that rounds to the midpoint in f32.
    for base in (1.0, 1.5, 1000.0, 65504.0, 448.0, 0.1, 3.0e-5, 6.0e-8):
        for e in (-60, -40, -30, -29, -25, -24, -20, -11, -8):
            for sgn in (1, -1):
                h = base * (1 + 2.0 ** -11 * sgn) + base * 2.0 ** e
                vals.extend([h, -h, base * (1 + 2.0 ** -9) + base * 2.0 ** e, base * (1 + 2.0 ** -4) - base * 2.0 ** e])
    vals += [1.0 + 2.0 ** -11 + 2.0 ** -40, 1.0 + 2.0 ** -8 + 2.0 ** -40, 1e300, -1e300, 5e-324, 65520.0 - 2.0 ** -30,
             float("inf"), float("-inf"), float("nan"), 0.0, -0.0]
    vals += [rng.uniform(-70000, 70000) for _ in range(500)] + [rng.uniform(-1, 1) * 2.0 ** -14 for _ in range(200)]
    return vals


def conversions(device):
    out = {}
    e4 = torch.arange(256, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    e5 = torch.arange(256, dtype=torch.uint8, device=device).view(torch.float8_e5m2)
    out["e4m3_to_f32"] = bits_of(e4.float())
    out["e5m2_to_f32"] = bits_of(e5.float())
    xs = f32_inputs()
    x = torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in xs], dtype=torch.int32, device=device).view(torch.float32)
    out["f32_inputs"] = xs
    for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16), ("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        out["f32_to_" + name] = bits_of(x.to(dt))
    ds = f64_inputs()
    d = torch.tensor(ds, dtype=torch.float64, device=device)
    out["f64_inputs"] = bits_of(d)
    for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16), ("e4m3", torch.float8_e4m3fn), ("f32", torch.float32)):
        out["f64_to_" + name] = bits_of(d.to(dt))
    # float -> integer, out of range and special values.
    fv = [3e9, -3e9, -1.0, -1.5, 255.5, 256.0, 300.7, -129.0, 1e20, -1e20, 2.0 ** 63, 2.0 ** 64, -2.0 ** 63,
          float("nan"), float("inf"), float("-inf"), 65535.9, 70000.0, 4294967296.0, -0.7, 0.999]
    out["float_to_int_inputs"] = bits_of(torch.tensor(fv, dtype=torch.float64))  # f64 bits (JSON has no NaN)
    ints = {}
    for src_name, sdt in (("f32", torch.float32), ("f64", torch.float64)):
        t = torch.tensor(fv, dtype=sdt, device=device)
        for name, dt in (("u8", torch.uint8), ("i8", torch.int8), ("i16", torch.int16), ("u16", torch.uint16),
                         ("i32", torch.int32), ("u32", torch.uint32), ("i64", torch.int64), ("u64", torch.uint64),
                         ("bool", torch.bool)):
            try:
                ints[src_name + "_to_" + name] = bits_of(t.to(dt))
            except Exception as e:  # some unsigned casts are unsupported on some devices
                ints[src_name + "_to_" + name] = "error: " + str(e).splitlines()[0]
    out["float_to_int"] = ints
    return out


DTYPES = [("bool", torch.bool), ("uint8", torch.uint8), ("int8", torch.int8), ("int16", torch.int16),
          ("uint16", torch.uint16), ("int32", torch.int32), ("uint32", torch.uint32), ("int64", torch.int64),
          ("uint64", torch.uint64), ("float16", torch.float16), ("bfloat16", torch.bfloat16),
          ("float32", torch.float32), ("float64", torch.float64), ("complex64", torch.complex64),
          ("float8_e4m3fn", torch.float8_e4m3fn), ("float8_e5m2", torch.float8_e5m2)]


def promotion():
    table = {}
    for an, a in DTYPES:
        for bn, b in DTYPES:
            try:
                r = torch.promote_types(a, b)
                table[an + "," + bn] = str(r).replace("torch.", "")
            except Exception:
                table[an + "," + bn] = "error"
    return table


def main():
    doc = {"torch_version": torch.__version__, "cpu": conversions("cpu"), "promote_types": promotion()}
    if torch.cuda.is_available():
        cuda = conversions("cuda")
        doc["cuda"] = cuda
        doc["cuda_differs"] = sorted(k for k in cuda if cuda[k] != doc["cpu"][k])
    with open(OUT, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print("wrote", OUT, os.path.getsize(OUT), "bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
