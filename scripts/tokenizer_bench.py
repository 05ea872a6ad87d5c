#!/usr/bin/env python3
"""Benchmark inputs for the tokenizer and the Hugging Face side of the comparison.

    python3 scripts/tokenizer_bench.py make OUT_DIR      # OUT_DIR/bench_text.txt (~4 MB) and
                                                          # OUT_DIR/bench_qwen2_32k.json (trained on it)
    python3 scripts/tokenizer_bench.py time TOKENIZER.json TEXT_FILE [IDS_OUT]
        # tokenizers' encode speed, as bench/tokenizer_bench.cpp measures kiln's; IDS_OUT gets the ids of
        # each document, one line each (diff it with kiln_tokenizer_bench's)

The text: Python standard library sources (English comments and docstrings, code, whitespace runs) and
generated multilingual lines (accents, Greek, Cyrillic, Arabic, CJK, emoji), split into documents at blank
lines.
"""
import json
import pathlib
import random
import sys
import sysconfig
import time


def make_text(target_bytes=4_000_000):
    parts = []
    total = 0
    lib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(lib.glob("*.py")):
        t = p.read_text(encoding="utf-8", errors="replace")
        parts.append(t)
        total += len(t.encode())
        if total > target_bytes * 3 // 4:
            break
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from reference.tokenizers_ref import corpus
    lines = corpus(n_lines=20000, seed=7)
    while total < target_bytes and lines:
        chunk = "\n".join(lines[:50]) + "\n\n"
        lines = lines[50:]
        parts.append(chunk)
        total += len(chunk.encode())
    random.Random(0).shuffle(parts)
    return "\n\n".join(parts)


def make(out_dir):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from reference.tokenizers_ref import QWEN2_PATTERN
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = make_text()
    (out / "bench_text.txt").write_text(text, encoding="utf-8")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text.split("\n\n"), trainers.BpeTrainer(
        vocab_size=32000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    (out / "bench_qwen2_32k.json").write_text(tok.to_str(), encoding="utf-8")
    print(f"{out}/bench_text.txt: {len(text.encode()) / 1e6:.2f} MB; {out}/bench_qwen2_32k.json: vocab {tok.get_vocab_size()}")


def time_hf(tok_path, text_path, ids_out=None, repeats=5):
    from tokenizers import Tokenizer
    with open(text_path, encoding="utf-8", newline="") as f:  # no newline translation: \r stays \r
        text = f.read()
    docs = []
    i = 0
    while i < len(text):  # the same documents as bench/tokenizer_bench.cpp: split after each blank line
        j = text.find("\n\n", i)
        j = len(text) if j < 0 else j + 2
        docs.append(text[i:j])
        i = j
    mb = len(text.encode()) / 1e6
    tok = Tokenizer.from_file(tok_path)
    a = time.perf_counter()
    n = sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs)
    cold = time.perf_counter() - a
    warm = []
    for _ in range(repeats):
        a = time.perf_counter()
        for d in docs:
            tok.encode(d, add_special_tokens=False)
        warm.append(time.perf_counter() - a)
    warm.sort()
    # encode_batch in one call: no Python overhead per document (set RAYON_NUM_THREADS=1 for one thread).
    batch = []
    for _ in range(repeats):
        a = time.perf_counter()
        tok.encode_batch(docs, add_special_tokens=False)
        batch.append(time.perf_counter() - a)
    batch.sort()
    if ids_out:
        with open(ids_out, "w") as f:
            for d in docs:
                f.write(",".join(map(str, tok.encode(d, add_special_tokens=False).ids)) + "\n")
    print(f"tokenizers {__import__('tokenizers').__version__}: {n} tokens; encode (one call per document, "
          f"single-threaded): first pass {mb / cold:.1f} MB/s, warm {mb / warm[len(warm) // 2]:.1f} MB/s; "
          f"encode_batch of all documents: {mb / batch[len(batch) // 2]:.1f} MB/s")


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "time":
        time_hf(*sys.argv[2:])
    else:
        sys.exit(__doc__)
