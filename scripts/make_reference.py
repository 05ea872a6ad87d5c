#!/usr/bin/env python3
"""Writes the reference data kiln's tests compare against, one section at a time.

    python3 scripts/make_reference.py tokenizers      # tests/data/tokenizers/ (needs `tokenizers`)
    python3 scripts/make_reference.py configs         # tests/data/configs/ (torch + transformers)
    python3 scripts/make_reference.py models          # tests/data/models/: tiny checkpoints saved by
                                                      # transformers, f32 logits and greedy tokens

Each section lives in scripts/reference/<section>_ref.py and exposes main(out_root).
"""
import argparse
import importlib
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SECTIONS = ["tokenizers", "configs", "models"]

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sections", nargs="*", default=SECTIONS, help=f"sections to build (default: all of {SECTIONS})")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "scripts"))
    for s in args.sections:
        if s not in SECTIONS:
            ap.error(f"unknown section {s!r}; known: {SECTIONS}")
        importlib.import_module(f"reference.{s}_ref").main(ROOT / "tests" / "data")
