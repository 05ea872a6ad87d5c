"""`kiln quantize`: a checkpoint rewritten with its layers' linear weights in Q8_0 / Q4_0 loads without a float
copy of them, and decodes exactly as the float checkpoint quantised at load time (`--quant`) does: the same
quantiser, so the same greedy tokens and the same perplexity."""
import json
import os
import struct
import subprocess

import pytest

KILN = os.environ.get("KILN_CLI", "")
pytestmark = pytest.mark.skipif(not KILN or not os.path.exists(KILN), reason="KILN_CLI (the kiln binary) is not set")


def run(*args, check=True):
    return subprocess.run([KILN, *args], capture_output=True, text=True, check=check)


def header(path):
    """The safetensors header of a file: tensor name -> {dtype, shape, data_offsets}."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    data = os.environ.get("KILN_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
    d = str(tmp_path_factory.mktemp("quant") / "tiny")
    run("init-model", d, "--layers", "2", "--hidden", "128", "--seed", "9", "--tokenizer",
        os.path.join(data, "tokenizers", "qwen2.json"))
    return d


@pytest.mark.parametrize("fmt,dtype,per_byte", [("q8_0", "I8", 1), ("q4_0", "U8", 2)])
def test_quantized_checkpoint_decodes_as_quantising_at_load(model, tmp_path, fmt, dtype, per_byte):
    out = str(tmp_path / fmt)
    run("quantize", model, out, "--type", fmt)
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["quantization_config"] == {"quant_method": "kiln", "format": fmt}
    h = header(os.path.join(out, "model.safetensors"))
    src = header(os.path.join(model, "model.safetensors"))
    q = "model.layers.0.self_attn.q_proj.weight"
    n, k = src[q]["shape"]
    assert h[q]["dtype"] == dtype and h[q]["shape"] == [n, k // per_byte]
    assert h[q + "_scales"]["dtype"] == "F16" and h[q + "_scales"]["shape"] == [n, k // 32]
    assert h["model.embed_tokens.weight"] == {**src["model.embed_tokens.weight"], "data_offsets": h["model.embed_tokens.weight"]["data_offsets"]}
    assert os.path.exists(os.path.join(out, "tokenizer.json"))
    gen = ["-p", "The quick brown fox", "-n", "16", "--temp", "0", "--ids", "--ignore-eos", "--device", "cpu"]
    assert run("generate", "-m", out, *gen).stdout == run("generate", "-m", model, "--quant", fmt, *gen).stdout
    text = tmp_path / "text.txt"
    text.write_text(open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md"), encoding="utf-8").read()[:3000])

    def perplexity(*model_args):
        out_json = tmp_path / "p.json"
        run("perplexity", *model_args, "--device", "cpu", "--file", str(text), "--ctx", "64", "--json", str(out_json))
        return json.loads(out_json.read_text())["perplexity"]

    assert perplexity("-m", out) == perplexity("-m", model, "--quant", fmt)

def test_q4_k_checkpoint_decodes_as_quantising_at_load(tmp_path):
    # Q4_K's super-blocks need every K a multiple of 256: a model of hidden size 256 (intermediate 768).
    data = os.environ.get("KILN_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
    model = str(tmp_path / "wide")
    run("init-model", model, "--layers", "2", "--hidden", "256", "--seed", "5", "--tokenizer",
        os.path.join(data, "tokenizers", "qwen2.json"))
    out = str(tmp_path / "q4_k")
    run("quantize", model, out, "--type", "q4_k")
    assert json.load(open(os.path.join(out, "config.json")))["quantization_config"] == {"quant_method": "kiln",
                                                                                          "format": "q4_k"}
    h, src = header(os.path.join(out, "model.safetensors")), header(os.path.join(model, "model.safetensors"))
    q = "model.layers.1.mlp.down_proj.weight"
    n, k = src[q]["shape"]
    assert h[q]["dtype"] == "U8" and h[q]["shape"] == [n, k // 256 * 144] and q + "_scales" not in h
    gen = ["-p", "The quick brown fox", "-n", "16", "--temp", "0", "--ids", "--ignore-eos", "--device", "cpu"]
    assert run("generate", "-m", out, *gen).stdout == run("generate", "-m", model, "--quant", "q4_k", *gen).stdout


def test_quantize_refuses_what_it_cannot_do(model, tmp_path):
    out = str(tmp_path / "q")
    run("quantize", model, out, "--type", "q4_0")
    r = run("quantize", out, str(tmp_path / "again"), check=False)
    assert r.returncode != 0 and "already quantized" in r.stderr
    r = run("quantize", model, model, check=False)
    assert r.returncode != 0 and "OUT must not be IN" in r.stderr
    r = run("quantize", model, str(tmp_path / "x"), "--type", "q4_k", check=False)
    assert r.returncode != 0 and "a multiple of 256" in r.stderr
    r = run("quantize", model, str(tmp_path / "x"), "--type", "q5_k", check=False)
    assert r.returncode != 0
    r = run("quantize", str(tmp_path / "missing"), str(tmp_path / "y"), check=False)
    assert r.returncode != 0 and "not a checkpoint directory" in r.stderr


def test_gguf_files_read_in_llama_cpps_gguf_package(tmp_path):
    """`kiln quantize IN OUT.gguf`: llama.cpp's own GGUF reader (gguf-py) reads the file kiln writes; its
    dequantisation of each layer stays within the format's error of the float weights, the tokenizer arrays
    cover the vocabulary, and kiln runs the file: an f32 file greedily decodes the same ids as the checkpoint."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize
    import numpy as np

    data = os.environ.get("KILN_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
    model = str(tmp_path / "wide")
    run("init-model", model, "--layers", "2", "--hidden", "256", "--seed", "5", "--tokenizer",
        os.path.join(data, "tokenizers", "qwen2.json"))
    src = header(os.path.join(model, "model.safetensors"))
    with open(os.path.join(model, "model.safetensors"), "rb") as f:
        f.seek(8 + struct.unpack("<Q", f.read(8))[0])
        raw = f.read()

    def weight(name):
        e = src[name]
        assert e["dtype"] in ("F32", "BF16")
        b = raw[e["data_offsets"][0]:e["data_offsets"][1]]
        if e["dtype"] == "F32":
            return np.frombuffer(b, dtype=np.float32).reshape(e["shape"])
        return (np.frombuffer(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(e["shape"])

    out = str(tmp_path / "m.gguf")
    r = run("quantize", model, out, "--type", "q4_k")
    assert "Q4_K" in r.stdout
    g = gguf.GGUFReader(out)
    field = lambda k: g.fields[k].contents()
    assert field("general.architecture") == "qwen3"
    vocab = src["model.embed_tokens.weight"]["shape"][0]
    assert len(field("tokenizer.ggml.tokens")) == vocab and field("tokenizer.ggml.pre") == "qwen2"
    tensors = {t.name: t for t in g.tensors}
    assert tensors["blk.1.ffn_down.weight"].tensor_type == gguf.GGMLQuantizationType.Q4_K
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    for gname, hf, tol in [("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight", 0.12),
                           ("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight", 0.12),
                           ("token_embd.weight", "model.embed_tokens.weight", 0.01)]:
        t = tensors[gname]
        got = dequantize(t.data, t.tensor_type).reshape(weight(hf).shape)
        want = weight(hf)
        rel = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
        assert 0 < rel < tol, (gname, rel)
    gen = ["-p", "The quick brown fox", "-n", "12", "--temp", "0", "--ids", "--ignore-eos", "--device", "cpu"]
    assert run("generate", "-m", out, *gen).returncode == 0
    f32 = str(tmp_path / "f32.gguf")
    run("quantize", model, f32, "--type", "f32")
    assert run("generate", "-m", f32, *gen).stdout == run("generate", "-m", model, *gen).stdout
