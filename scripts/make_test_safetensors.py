#!/usr/bin/env python3
"""Writes a large safetensors file for loading measurements (no third-party packages needed).

usage: make_test_safetensors.py OUT [--tensors 16] [--rows 8192] [--cols 8192]
Each tensor is BF16 [rows, cols] of pseudo-random bytes; the layout is the one Hugging Face writes
(header padded with spaces to a multiple of 8).
"""
import argparse
import json
import os
import struct

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--tensors", type=int, default=16)
ap.add_argument("--rows", type=int, default=8192)
ap.add_argument("--cols", type=int, default=8192)
a = ap.parse_args()

nbytes = a.rows * a.cols * 2
header, off = {}, 0
for i in range(a.tensors):
    header[f"model.layers.{i}.weight"] = {"dtype": "BF16", "shape": [a.rows, a.cols], "data_offsets": [off, off + nbytes]}
    off += nbytes
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
block = os.urandom(1 << 24)
with open(a.out, "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    left = off
    while left:
        n = min(left, len(block))
        f.write(block[:n])
        left -= n
print(f"{a.out}: {a.tensors} tensors, {off / 1e9:.2f} GB of data")
