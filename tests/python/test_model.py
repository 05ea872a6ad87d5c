"""The engine from Python: kiln.Model and kiln.Tokenizer on the tiny checkpoints of tests/data, against the
`kiln generate` command and the transformers references stored beside them."""
import json
import os
import subprocess

import pytest

import kiln
from conftest import DATA

QWEN = os.path.join(DATA, "models", "qwen3-tiny")
KILN_CLI = os.environ.get("KILN_CLI")


@pytest.fixture(scope="module")
def model():
    return kiln.Model.from_pretrained(QWEN, device="cpu", max_context=256)


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """A small random checkpoint with a tokenizer and a chat template, written by `kiln init-model`."""
    if KILN_CLI is None:
        pytest.skip("KILN_CLI (the kiln command) is not set; ctest sets it")
    d = str(tmp_path_factory.mktemp("tiny") / "model")
    subprocess.run([KILN_CLI, "init-model", d, "--tokenizer", os.path.join(DATA, "tokenizers", "qwen2.json")],
                   check=True, capture_output=True)
    return kiln.Model.from_pretrained(d, device="cpu", max_context=256)


def test_gguf_files_load_as_the_safetensors_model(model):
    # llama.cpp's format: the f32 file gives the same greedy tokens as the directory it was converted from.
    ref = json.load(open(os.path.join(QWEN, "reference.json")))
    g = kiln.Model.from_pretrained(os.path.join(DATA, "gguf", "models", "qwen3-tiny-f32.gguf"), device="cpu",
                                   max_context=256)
    assert g.config["num_hidden_layers"] == model.config["num_hidden_layers"]
    assert g.generate(ref["prompt_ids"], max_new_tokens=len(ref["greedy_ids"]), temperature=0.0,
                      ignore_eos=True) == ref["greedy_ids"]
    with pytest.raises(kiln.KilnError, match="tokenizer.ggml"):
        kiln.Tokenizer.from_pretrained(os.path.join(DATA, "gguf", "models", "qwen3-tiny-f32.gguf"))
    tok = kiln.Tokenizer.from_pretrained(os.path.join(DATA, "gguf", "tokenizers", "qwen2.gguf"))
    want = kiln.Tokenizer.from_file(os.path.join(DATA, "tokenizers", "qwen2.json"))
    for text in ("Hello world", "<|im_start|>user\nnaïve café 1234<|im_end|>"):
        assert tok.encode(text) == want.encode(text)


def test_greedy_generation_matches_transformers(model):
    ref = json.load(open(os.path.join(QWEN, "reference.json")))
    prompt, greedy = ref["prompt_ids"], ref["greedy_ids"]
    logits = model.logits(prompt)
    assert logits.shape == (len(prompt), model.config["vocab_size"]) and logits.dtype == kiln.float32
    assert int(logits[-1].argmax().item()) == greedy[0]
    assert model.generate(prompt, max_new_tokens=len(greedy), temperature=0.0, ignore_eos=True) == greedy


@pytest.mark.skipif(KILN_CLI is None, reason="KILN_CLI (the kiln command) is not set; ctest sets it")
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, top_k=20, top_p=0.9, seed=7)])
def test_generate_equals_the_kiln_command(model, sampling):
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    args = [KILN_CLI, "generate", "-m", QWEN, "--device", "cpu", "--prompt-ids", ",".join(map(str, prompt)), "--ids",
            "-n", "12", "--temp", str(sampling["temperature"]), "--top-k", str(sampling.get("top_k", 0)),
            "--top-p", str(sampling.get("top_p", 1.0)), "--seed", str(sampling.get("seed", 0)), "--ignore-eos"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip()
    cli = [int(x) for x in out.split(",") if x]
    py = model.generate(prompt, max_new_tokens=12, temperature=sampling["temperature"],
                        top_k=sampling.get("top_k", 0), top_p=sampling.get("top_p", 1.0),
                        seed=sampling.get("seed", 0), ignore_eos=True)
    assert py == cli and len(py) == 12


def test_streaming_yields_the_same_tokens(model):
    prompt = [5, 6, 7, 8]
    full = model.generate(prompt, max_new_tokens=10, temperature=0.0, ignore_eos=True)
    streamed = list(model.generate(prompt, max_new_tokens=10, temperature=0.0, ignore_eos=True, stream=True))
    assert streamed == full
    # Leaving a stream early frees the model for the next generation.
    it = model.generate(prompt, max_new_tokens=50, temperature=0.0, ignore_eos=True, stream=True)
    next(it)
    it.close()
    assert model.generate(prompt, max_new_tokens=3, temperature=0.0, ignore_eos=True) == full[:3]


SHIPPED = os.path.join(os.path.dirname(__file__), "..", "..", "models", "kiln-tiny")


@pytest.mark.skipif(not os.path.exists(os.path.join(SHIPPED, "model.safetensors")),
                    reason="models/kiln-tiny/model.safetensors is absent (a partial checkout)")
def test_speculative_decoding_keeps_greedy_output_on_the_shipped_model():
    # A text followed by its beginning: the model goes on copying it, which prompt lookup drafts. 256 greedy
    # tokens with lookup (Python and `kiln generate --lookup`) and with a draft model equal plain decoding's.
    m = kiln.Model.from_pretrained(SHIPPED, device="cpu", max_context=1024)
    text = open(os.path.join(SHIPPED, "heldout.txt"), encoding="utf-8").read()[:1200]
    prompt = m.tokenizer.encode(text + "\n\n" + text[:200])
    plain = m.generate(prompt, max_new_tokens=256, temperature=0.0, ignore_eos=True)
    assert m.generate(prompt, max_new_tokens=256, temperature=0.0, ignore_eos=True, lookup=3, num_draft=6) == plain
    streamed = list(m.generate(prompt, max_new_tokens=64, temperature=0.0, ignore_eos=True, lookup=2, stream=True))
    assert streamed == plain[:64]
    draft = kiln.Model.from_pretrained(SHIPPED, device="cpu", dtype=kiln.bfloat16, max_context=1024)
    assert m.generate(prompt, max_new_tokens=64, temperature=0.0, ignore_eos=True, draft=draft) == plain[:64]
    with pytest.raises(kiln.KilnError, match="another model"):
        m.generate(prompt, max_new_tokens=4, draft=m)
    with pytest.raises(kiln.KilnError, match="num_draft must be in"):
        m.generate(prompt, max_new_tokens=4, lookup=2, num_draft=0)
    if KILN_CLI is not None:
        r = subprocess.run([KILN_CLI, "generate", "-m", SHIPPED, "--device", "cpu", "--ids", "--temp", "0", "-n", "256",
                            "--ignore-eos", "--lookup", "3", "--prompt-ids", ",".join(map(str, prompt))],
                           capture_output=True, text=True, check=True)
        assert [int(x) for x in r.stdout.strip().split(",")] == plain
        assert "drafts accepted" in r.stderr


def test_streaming_text_joins_to_the_whole_text(text_model):
    text = text_model.generate("Hello there", max_new_tokens=16, temperature=0.0, ignore_eos=True)
    pieces = list(text_model.generate("Hello there", max_new_tokens=16, temperature=0.0, ignore_eos=True, stream=True))
    assert isinstance(text, str) and "".join(pieces) == text


def test_tokenizer_round_trip(text_model):
    tok = text_model.tokenizer
    ids = tok.encode("The kiln is hot.")
    assert all(isinstance(i, int) for i in ids) and tok.decode(ids) == "The kiln is hot."
    assert tok.vocab_size >= max(ids) + 1
    assert tok.id_to_token(ids[0]) is not None and tok.token_to_id(tok.id_to_token(ids[0])) == ids[0]


def test_chat_messages_use_the_chat_format(text_model, tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert isinstance(text_model.generate(messages, max_new_tokens=4, temperature=0.0), str)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ '<|im_start|>' + m.role }}"}))
    assert kiln.apply_chat_template(messages, str(tmp_path)) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(kiln.KilnError, match="role"):
        kiln.apply_chat_template([{"role": "tool", "content": "x"}], str(tmp_path))


def test_presets_generate_ids_without_a_tokenizer():
    m = kiln.Model.from_preset("qwen3-0.6b", device="cpu", dtype=kiln.bfloat16, max_context=64)
    assert m.tokenizer is None and m.config["num_hidden_layers"] == 28
    out = m.generate([1, 2, 3], max_new_tokens=2, temperature=0.0, ignore_eos=True)
    assert len(out) == 2
    with pytest.raises(kiln.KilnError, match="tokenizer"):
        m.generate("text")


INTERRUPT_SCRIPT = r"""
import signal, sys, threading, time, os
import kiln
m = kiln.Model.from_preset("qwen3-0.6b", device="cpu", dtype=kiln.bfloat16, max_context=4096)
stream = sys.argv[1] == "stream"
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
start = time.time()
try:
    if stream:
        for _ in m.generate([1, 2, 3], max_new_tokens=4000, temperature=0.0, ignore_eos=True, stream=True):
            pass
    else:
        m.generate([1, 2, 3], max_new_tokens=4000, temperature=0.0, ignore_eos=True)
    print("finished")
except KeyboardInterrupt:
    print("interrupted after %.1f s" % (time.time() - start))
    print(m.generate([1, 2, 3], max_new_tokens=2, temperature=0.0, ignore_eos=True))  # the model is free again
"""


@pytest.mark.parametrize("mode", ["stream", "whole"])
def test_ctrl_c_stops_a_generation_between_tokens(mode):
    # 4000 tokens of a 0.6B model take minutes on a CPU; SIGINT after 1 s must end it within seconds.
    import sys

    out = subprocess.run([sys.executable, "-c", INTERRUPT_SCRIPT, mode], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("interrupted after"), out.stdout
    assert float(lines[0].split()[2]) < 15
    assert len(eval(lines[1])) == 2
