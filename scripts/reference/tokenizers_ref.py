"""Section `tokenizers`: small byte-level BPE tokenizers of each kind kiln reads, trained with the Hugging
Face `tokenizers` package, and the ids / decoded text that package gives for a corpus of hard strings.

Writes tests/data/tokenizers/<name>.json (the tokenizer) and <name>.ref.json (the reference):
  {"tokenizers_version": ..., "encode": [{"text", "ids", "ids_plain", "decoded", "decoded_skip"}],
   "decode": [{"ids", "text", "text_skip"}]}
ids: encode(text, add_special_tokens=True); ids_plain: add_special_tokens=False; decoded(_skip): decode(ids)
with skip_special_tokens False (True).
"""
import json
import random
import unicodedata

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = """the of and to in is was for on that with as by at from his her it an were are which this be or
has had not but have they one their all who its also first new been more two after can time other when
would there into only out over most some these about such many than may then them so could during
model token tokenizer merge byte level regex pattern unicode normal form cache vocabulary special added
don't I'll we've they're it's she'd you're I'm can't won't shouldn't DON'T I'LL WE'VE
café naïve résumé Ångström façade coöperate Straße Ελληνικά русский язык العربية हिन्दी
中文 汉字 测试 日本語 テキスト ひらがな 한국어 텍스트 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇩🇪
0 1 2 3 12 123 1234 2024 3.14 1,000 42nd
def return if else for while import class self x = y + 1 ( ) [ ] { } : ; , . ! ? - _ / \\ " ' # @ % & *
""".split()


def corpus(n_lines=3000, seed=0):
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        k = rng.randint(3, 18)
        words = [rng.choice(WORDS) for _ in range(k)]
        sep = rng.choice([" ", " ", " ", "  ", "\t", "\n", " \n", "\n\n"])
        lines.append(sep.join(words) + rng.choice(["", ".", "\n", "!\n"]))
    return lines


def hard_strings(specials):
    s = [
        "", " ", "  ", "   ", "\n", "\n\n\n", "\t", "\t\ttabs\t", "a\r\nb\r\n", " \n \n", "hello world",
        "Hello World", "  leading and trailing  ", "trailing spaces   ", "x  \n  y", "1234567", "3.14159",
        "1,000,000 and 42nd", "don't I'LL we've THEY'RE it's", "'s 'S 'll", "ſ'ſ", "café", unicodedata.normalize("NFD", "café"),
        "Ångström", unicodedata.normalize("NFD", "Ångström naïve résumé"), "ﬁ ligature ①", "中文字符测试",
        "日本語のテキストです。", "한국어 텍스트", "emoji 😀👍🏽", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag 🇩🇪", "❤️",
        "mixed Ελληνικά русский العربية हिन्दी 中文 end", "def f(x):\n    return x**2\n", "\u00a0nbsp\u2003em\u3000ideo",
        "zero\u200bwidth\u200djoiner", "mongolian\u180eseparator", "nel\u0085line", "a" * 40, "ab" * 2500,
        "".join(random.Random(1).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5000)),
        "the the the the the the the the", "@@@ ### $$$ %%% ^^^", "!!!???...", "\\n is not a newline",
        "<|fake|> <not special>", "Straße STRASSE",
        # onig's \s is White_Space (no U+180E); letters and digits of Unicode 15-16 that PCRE2 10.42 lacks
        "x\u180e's y\u180e 1", "\U00031350\U00031351 ext-H \U0002EBF0", "\u1C89\u1C8A \U00010D40\U00010D41 \U0001D2C0",
        "hex 0x1F \\h \\s", "\u00a0\u00a0x\u2007\u2007", "'\u0085's",
    ]
    s += random_docs(150, seed=11)
    for t in specials:
        s += [t, f"a{t}b", f" {t} ", f"x {t}\n{t}y", f"{t}{t}", f"hello {t}world  {t}  end"]
    if len(specials) >= 2:
        s.append(f"{specials[1]}user\nhi there{specials[-1]}\n{specials[1]}assistant\n")
    return s


def random_docs(n, seed):
    """Mixtures of special tokens, tricky words and characters from many scripts and whitespace kinds."""
    rng = random.Random(seed)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<mask>", "[WORD]",
                "hello world", "ﬁx", "fix", "\u00b8\u00ad", "<|eot_id|>"]
    ranges = [(0x20, 0x7E)] * 6 + [
        (0x09, 0x0D), (0xA0, 0x17F), (0x300, 0x36F), (0x391, 0x3C9), (0x400, 0x45F), (0x600, 0x6FF),
        (0x900, 0x97F), (0x4E00, 0x4E80), (0x3040, 0x30FF), (0xAC00, 0xAC80), (0x1100, 0x11FF),
        (0x1F300, 0x1F64F), (0x1F3FB, 0x1F3FF), (0x200B, 0x200F), (0x2000, 0x200A), (0x30, 0x39),
        (0xFE00, 0xFE0F), (0x2028, 0x2029), (0x85, 0x85), (0x180E, 0x180E), (0x3000, 0x3000), (0xFB00, 0xFB06),
        (0x2460, 0x24FF), (0x17F, 0x17F), (0x31350, 0x31360), (0x10D40, 0x10D49)]
    words = ["don't", "I'LL", "we've", "'s", "'S", "the", " the", "  ", "\n\n", "\r\n", "\t", "1234567", "café",
             "cafe\u0301", "中文", "😀", "👨‍👩‍👧‍👦", "tokenizer", "supercalifragilistic", "kiln", "zzz", " a", "a "]
    docs = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 30)):
            r = rng.random()
            if r < 0.15:
                parts.append(rng.choice(specials))
            elif r < 0.5:
                parts.append(rng.choice(words))
            else:
                lo, hi = rng.choice(ranges)
                parts.append(chr(rng.randint(lo, hi)) * rng.choice([1, 1, 1, 2, 3]))
        docs.append("".join(parts))
    return docs


def byte_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train(pre_tokenizer, normalizer, vocab_size, specials, seed=0):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    tok.train_from_iterator(corpus(seed=seed), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def split_then_bytelevel(pattern):
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])


def merges_as_strings(j):
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    return j


def build_all():
    out = {}
    # Qwen2 / Qwen3: NFC, Split(regex, isolated) + ByteLevel, ByteLevel post-processor (adds nothing).
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = train(split_then_bytelevel(QWEN2_PATTERN), normalizers.NFC(), 1000, specials)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    out["qwen2"] = (json.loads(tok.to_str()), specials)

    # Llama 3: no normalizer, its pattern, ignore_merges, BOS added by TemplateProcessing; merges as strings.
    # Whole words put in the vocab with no merge path show ignore_merges at work.
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|eot_id|>"]
    tok = train(split_then_bytelevel(LLAMA3_PATTERN), None, 800, specials)
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    b2u = byte_to_unicode()
    extra = ["Ġsupercalifragilistic", "Ġkiln", "zzz", "Ġ" + "".join(b2u[b] for b in "中文".encode())]
    n_model = len(vocab)
    for w in extra:
        if w not in vocab:
            vocab[w] = n_model
            n_model += 1
    for k, t in enumerate(j["added_tokens"]):
        t["id"] = n_model + k
    j["model"]["ignore_merges"] = True
    bos = specials[0]
    j["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [n_model], "tokens": [bos]}}},
        ],
    }
    out["llama3"] = (merges_as_strings(j), specials)

    # GPT-2 style: ByteLevel(use_regex=True, add_prefix_space=True), NFKC inside a Sequence, merges as
    # strings, added tokens with lstrip / rstrip / single_word / normalized, TemplateProcessing with two tokens.
    pre = pre_tokenizers.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    specials = ["<|endoftext|>", "<mask>"]
    tok = train(pre, normalizers.Sequence([normalizers.NFKC()]), 600, [])
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False),
                            AddedToken("<mask>", special=True, lstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("[WORD]", single_word=True, normalized=False),
                    AddedToken("hello world", rstrip=True, normalized=False),
                    AddedToken("ﬁx", normalized=True),
                    AddedToken("\u00b8\u00ad", normalized=False),
                    AddedToken("\u00ca\u00ac", normalized=False),  # bytes CA AC in the byte alphabet: decodes to U+02AC
                    AddedToken("\u00b8\u00af", normalized=True)])
    eot = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A <|endoftext|>",
                                                       special_tokens=[("<|endoftext|>", eot)])
    out["gpt2"] = (merges_as_strings(json.loads(tok.to_str())),
                   specials + ["[WORD]", "hello world", "ﬁx", "fix", "\u00b8\u00ad", "\u00ca\u00ac"])

    # Qwen2 pattern with merges kept as [a, b] pairs, no normalizer, and ignore_merges on a vocab with
    # words the merges cannot build.
    specials = ["<|endoftext|>"]
    tok = train(split_then_bytelevel(QWEN2_PATTERN), None, 1500, specials, seed=3)
    j = json.loads(tok.to_str())
    assert isinstance(j["model"]["merges"][0], list), "this tokenizers version writes merges as strings"
    vocab = j["model"]["vocab"]
    n_model = len(vocab)
    for w in ["Ġtokenizer", "Ġcaf", "abcdefghij"]:
        if w not in vocab:
            vocab[w] = n_model
            n_model += 1
    for k, t in enumerate(j["added_tokens"]):
        t["id"] = n_model + k
    j["model"]["ignore_merges"] = True
    out["pairs_ignore_merges"] = (j, specials)
    return out


def reference(tok, specials):
    enc = []
    for text in hard_strings(specials) + ["x supercalifragilistic kiln zzz 中文 tokenizer caf abcdefghij"]:
        ids = tok.encode(text, add_special_tokens=True).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        enc.append({"text": text, "ids": ids, "ids_plain": plain,
                    "decoded": tok.decode(ids, skip_special_tokens=False),
                    "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    vocab = tok.get_vocab()
    b2u = byte_to_unicode()
    bid = lambda b: vocab[b2u[b]]
    added = [tok.token_to_id(t) for t in specials if tok.token_to_id(t) is not None]
    seqs = [[bid(b) for b in bs] for bs in [
        b"\xe4", b"\xe4\xb8", b"\xe4\xb8\xad", b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
        b"\xf0\x9f\x98", b"\xf0\x9f\x98\x80", b"a\x80b", b"\xe0\x80\xaf", b"\xf8\x88\x80\x80\x80", b"\xc2",
        b"\xe4\xb8a\xe4", b"\xef\xbf\xbd", b"\xf0\x90\x80"]]
    for a in added:
        seqs += [[bid(0xE4), a, bid(0xB8), bid(0xAD)], [a], [a, a], [bid(0x41), a, bid(0x42)]]
    seqs += [[], [10 ** 6], [bid(0x41), 10 ** 6, bid(0x42)], list(range(0, 300, 7)),
             list(range(tok.get_vocab_size() - 20, tok.get_vocab_size()))]
    dec = [{"ids": s, "text": tok.decode(s, skip_special_tokens=False),
            "text_skip": tok.decode(s, skip_special_tokens=True)} for s in seqs]
    return {"tokenizers_version": tokenizers.__version__, "encode": enc, "decode": dec}


def dump_reference(ref):
    """One case per line, so that a change in the reference reads as a small diff."""
    d = lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    lines = ['{"tokenizers_version":' + d(ref["tokenizers_version"]) + ',']
    for key in ("encode", "decode"):
        lines.append(f'"{key}":[')
        lines += [d(c) + ("," if i + 1 < len(ref[key]) else "") for i, c in enumerate(ref[key])]
        lines.append("]," if key == "encode" else "]")
    return "\n".join(lines) + "\n}\n"


def main(data_root):
    out_dir = data_root / "tokenizers"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (j, specials) in build_all().items():
        text = json.dumps(j, ensure_ascii=False, indent=None, separators=(",", ":"))
        tok = Tokenizer.from_str(text)  # the reference is what tokenizers does with the file as written
        (out_dir / f"{name}.json").write_text(text, encoding="utf-8")
        ref = reference(tok, specials)
        (out_dir / f"{name}.ref.json").write_text(dump_reference(ref), encoding="utf-8")
        print(f"{name}: vocab {tok.get_vocab_size()}, {len(ref['encode'])} encode and {len(ref['decode'])} decode cases")
