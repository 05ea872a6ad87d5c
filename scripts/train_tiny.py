"""Train models/kiln-tiny: a small Qwen3 model and its byte-level BPE tokenizer, on the English prose of the
Python documentation (Debian's python3.11-doc ships its reStructuredText sources).

    apt-get download python3.11-doc && dpkg -x python3.11-doc_*.deb /tmp/pydoc
    python3 scripts/train_tiny.py --docs /tmp/pydoc/usr/share/doc/python3.11/html/_sources --out models/kiln-tiny

Steps: the reST sources become plain paragraphs (markup, directives, code and tables dropped); a few documents,
picked by a hash of their path, are held out (heldout.txt, for perplexity); the tokenizer is trained with HF
`tokenizers` in Qwen2's pre-tokenizer form (the split regex, then bytes) so that kiln's tokenizer reads it; the
model trains with AdamW in bf16 autocast for --epochs on the GPU (a cosine schedule over those steps), and the
checkpoint with the lowest loss on a validation set (other documents, also held out of training) is saved in bf16 with transformers' save_pretrained, with a ChatML chat template. Last, transformers'
perplexity of heldout.txt (bench/torch_perplexity.py, f32, windows of 512) goes to perplexity.json, which
`make demo` prints next to kiln's."""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
import zlib

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")

ROLE = re.compile(r":[\w:.-]+:`([^`]*)`")
LITERAL = re.compile(r"``([^`]*)``")
LINK = re.compile(r"`([^`<]*?)\s*<[^>]*>`__?")
REF = re.compile(r"`([^`]+)`_{1,2}")
INTERP = re.compile(r"`([^`]+)`")
EMPH = re.compile(r"\*\*?([^*\s][^*]*?)\*\*?")
DIRECTIVE = re.compile(r"^\.\.\s+([\w:-]+)::")
# Directives whose bodies are code, tables or lists of names: dropped. Others (function, class, note, seealso,
# ...) hold prose in their bodies, which stays.
CODE_DIRECTIVES = {"code-block", "code", "sourcecode", "testcode", "testsetup", "testcleanup", "testoutput", "doctest",
                   "literalinclude", "productionlist", "toctree", "csv-table", "list-table", "table", "image",
                   "figure", "highlight", "index", "include", "raw", "tabularcolumns", "grammar-snippet",
                   "moduleauthor", "sectionauthor", "autosummary", "miscnews", "availability", "audit-event",
                   "opcode", "pdbcommand"}
ADORN = re.compile(r"^\s*([=\-~^*#+`'\".:_])\1{2,}\s*$|^\s*[=\s]{5,}$")


def inline(text):
    def role(m):
        t = m.group(1)
        t = re.sub(r"\s*<[^>]*>$", "", t) if "<" in t else t
        return t.lstrip("~!")
    text = ROLE.sub(role, text)
    text = LITERAL.sub(r"\1", text)
    text = LINK.sub(r"\1", text)
    text = REF.sub(r"\1", text)
    text = INTERP.sub(r"\1", text)
    text = EMPH.sub(r"\1", text)
    text = re.sub(r"\s*\[(\d+|#\w*|\*)\]_", "", text)  # footnote references
    text = text.replace("|version|", "3.11").replace("|release|", "3.11").replace("\\ ", "")
    return re.sub(r"\s+", " ", text).strip()


def clean_rst(src):
    """The prose paragraphs of one reST document: directive lines, the bodies of code directives, comments,
    literal blocks, doctests, tables, field lists and section adornments are dropped; a paragraph's lines are
    joined."""
    lines = src.splitlines()
    out, para = [], []
    skip_indent = None  # skipping a block indented deeper than this

    def flush():
        if para:
            text = inline(" ".join(para))
            # Prose only: a sentence's worth of letters, not a stray label or signature.
            if len(text) >= 40 and sum(c.isalpha() for c in text) > 0.6 * len(text):
                out.append(text)
            para.clear()

    for line in lines:
        indent = len(line) - len(line.lstrip())
        stripped = line.strip()
        if skip_indent is not None:
            if not stripped or indent > skip_indent:
                continue
            skip_indent = None
        if not stripped:
            flush()
            continue
        if stripped.startswith(".. ") or stripped == "..":
            flush()
            d = DIRECTIVE.match(stripped)
            if not d or d.group(1) in CODE_DIRECTIVES:  # a comment, a link target or a code directive
                skip_indent = indent
            continue
        if ADORN.match(line) or stripped.startswith((">>>", "...", "+-", "+=", "|")) or re.match(r"^:[^:`]+:(\s|$)", stripped):
            flush()
            continue
        if stripped.endswith("::"):
            text = stripped[:-2].rstrip()
            if text:
                para.append(text + ":")
            flush()
            skip_indent = indent
            continue
        if re.match(r"^([-*+]|\d+\.|#\.)\s", stripped):  # a list item starts a paragraph of its own
            flush()
            stripped = re.sub(r"^([-*+]|\d+\.|#\.)\s+", "", stripped)
        para.append(stripped)
    flush()
    return out


def load_corpus(docs, heldout_every):
    """(train, validation, heldout) lists of documents: one document in about heldout_every goes to each held-out
    set, picked by a hash of its path."""
    train, validation, heldout = [], [], []
    paths = []
    for root, _, files in os.walk(docs):
        for f in files:
            if f.endswith(".rst.txt"):
                paths.append(os.path.relpath(os.path.join(root, f), docs))
    for rel in sorted(paths):
        if rel.startswith("whatsnew/changelog"):  # issue numbers and credits, not prose
            continue
        with open(os.path.join(docs, rel), encoding="utf-8") as f:
            paras = clean_rst(f.read())
        if not paras:
            continue
        doc = "\n\n".join(paras)
        h = zlib.crc32(rel.encode()) % heldout_every
        (heldout if h == 0 else validation if h == 1 else train).append(doc)
    return train, validation, heldout


def train_tokenizer(docs, vocab):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", required=True, help="the _sources folder of the Python documentation")
    ap.add_argument("--out", default="models/kiln-tiny")
    ap.add_argument("--epochs", type=float, default=10.0, help="passes over the training tokens")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--heldout-every", type=int, default=40, help="hold out one document in about this many")
    ap.add_argument("--heldout-chars", type=int, default=40_000, help="heldout.txt's size at most")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(a.seed)
    t0 = time.time()
    train_docs, val_docs, heldout_docs = load_corpus(a.docs, a.heldout_every)
    heldout_text = ""
    for d in heldout_docs:
        if len(heldout_text) + len(d) > a.heldout_chars:
            continue
        heldout_text += d + "\n\n"
    print(f"corpus: {len(train_docs)} documents, {sum(map(len, train_docs)) / 1e6:.1f} M characters for training; "
          f"{len(val_docs)} for validation; {len(heldout_docs)} held out ({len(heldout_text) / 1e3:.0f} k characters "
          f"in heldout.txt)", flush=True)

    tok = train_tokenizer(train_docs, a.vocab)
    eos = tok.token_to_id("<|endoftext|>")
    ids = []
    for enc in tok.encode_batch(train_docs):
        ids.extend(enc.ids)
        ids.append(eos)
    data = torch.tensor(ids, dtype=torch.int64)
    val_ids = []
    for enc in tok.encode_batch(val_docs):
        val_ids.extend(enc.ids)
        val_ids.append(eos)
    val = torch.tensor(val_ids, dtype=torch.int64)
    print(f"tokenizer: {tok.get_vocab_size()} entries; {len(data) / 1e6:.2f} M training tokens, "
          f"{len(val) / 1e3:.0f} k validation tokens ({time.time() - t0:.0f} s)", flush=True)

    config = Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=a.hidden, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                         head_dim=a.hidden // a.heads, max_position_embeddings=2048, rope_theta=10000.0,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos,
                         pad_token_id=eos)
    dev = torch.device(a.device)
    model = Qwen3ForCausalLM(config).to(dev)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.1f} M parameters ({params * 2 / 1e6:.0f} MB in bf16)", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), fused=dev.type == "cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    g = torch.Generator().manual_seed(a.seed)

    def batch(src, n):
        start = torch.randint(0, len(src) - a.seq - 1, (n,), generator=g)
        x = torch.stack([src[s:s + a.seq + 1] for s in start.tolist()]).to(dev, non_blocking=True)
        return x[:, :-1], x[:, 1:]

    vg = torch.Generator().manual_seed(12345)
    vstart = torch.randint(0, len(val) - a.seq - 1, (32,), generator=vg).tolist()
    vx = torch.stack([val[s:s + a.seq + 1] for s in vstart]).to(dev)

    def val_loss():
        model.eval()
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(vx[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), vx[:, 1:].reshape(-1))
        model.train()
        return loss.item()

    steps = max(1, int(a.epochs * len(data) / (a.batch * a.seq)))
    warmup = min(100, steps // 10 + 1)
    every = max(1, min(100, steps // 40))
    best, best_step, best_state, start = float("inf"), 0, None, time.time()
    model.train()
    for step in range(1, steps + 1):
        # Warm-up, then a cosine to a tenth of the peak.
        lr = a.lr * min(1.0, step / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = batch(data, a.batch)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % every == 0 or step == steps:
            v = val_loss()
            if v < best:
                best, best_step, best_state = v, step, {k: t.detach().clone() for k, t in model.state_dict().items()}
            if step % (every * 4) == 0 or step == steps:
                tokens = step * a.batch * a.seq
                print(f"step {step}/{steps}: train loss {loss.item():.3f}, validation loss {v:.3f} "
                      f"(perplexity {math.exp(v):.1f}), lr {lr:.2e}, {tokens / 1e6:.0f} M tokens, "
                      f"{tokens / (time.time() - start) / 1e3:.0f} k tokens/s", flush=True)
    model.load_state_dict(best_state)
    print(f"trained {steps} steps in {time.time() - start:.0f} s; kept step {best_step}: validation loss {best:.3f} "
          f"(perplexity {math.exp(best):.1f} on {a.seq}-token windows)", flush=True)

    os.makedirs(a.out, exist_ok=True)
    # Generation stops at the end of a document or of a chat turn.
    model.generation_config.eos_token_id = [eos, tok.token_to_id("<|im_end|>")]
    model.generation_config.pad_token_id = eos
    model.to(torch.bfloat16).save_pretrained(a.out, safe_serialization=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   model_max_length=2048)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(a.out)
    with open(os.path.join(a.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(heldout_text)

    # A sample, and transformers' perplexity of heldout.txt in f32 as `kiln perplexity` computes it.
    prompt = "The Python interpreter"
    enc = torch.tensor([tok.encode(prompt).ids], device=dev)
    with torch.no_grad():
        out = model.generate(enc, max_new_tokens=60, do_sample=False)
    print("sample (greedy):", prompt + tok.decode(out[0, enc.size(1):].tolist()), flush=True)
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, os.path.join(here, "..", "bench", "torch_perplexity.py"), "-m", a.out, "--file",
                    os.path.join(a.out, "heldout.txt"), "--ctx", "512", "--json",
                    os.path.join(a.out, "perplexity.json")], check=True)
    with open(os.path.join(a.out, "perplexity.json")) as f:
        p = json.load(f)
    import transformers
    p["computed_by"] = (f"transformers {transformers.__version__} with bench/torch_perplexity.py "
                        "(f32 weights from the bf16 checkpoint)")
    with open(os.path.join(a.out, "perplexity.json"), "w") as f:
        json.dump(p, f, indent=1)
    print(f"done in {time.time() - t0:.0f} s: {a.out}")


if __name__ == "__main__":
    main()
