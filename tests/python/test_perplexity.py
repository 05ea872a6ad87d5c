"""`kiln perplexity` against transformers on the same checkpoint and file (where transformers is installed:
the GPU machine's image, or any environment with torch and transformers): equal to 3 significant digits."""
import json
import math
import os
import subprocess

import pytest

KILN = os.environ.get("KILN_CLI", "")


def test_perplexity_matches_transformers(tmp_path):
    if not KILN or not os.path.exists(KILN):
        pytest.skip("KILN_CLI (the kiln binary) is not set")
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    data = os.environ.get("KILN_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
    model = str(tmp_path / "tiny")
    subprocess.run([KILN, "init-model", model, "--layers", "2", "--hidden", "128", "--seed", "5", "--tokenizer",
                    os.path.join(data, "tokenizers", "qwen2.json")], check=True, capture_output=True)
    text = tmp_path / "text.txt"
    text.write_text(open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md"), encoding="utf-8").read()[:4000])
    out = tmp_path / "kiln.json"
    subprocess.run([KILN, "perplexity", "-m", model, "--device", "cpu", "--file", str(text), "--ctx", "96", "--json",
                    str(out)], check=True, capture_output=True)
    k = json.loads(out.read_text())
    tok = transformers.AutoTokenizer.from_pretrained(model)
    m = transformers.AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    ids = tok(text.read_text(encoding="utf-8"))["input_ids"]
    nll, n = 0.0, 0
    with torch.inference_mode():
        for b in range(0, len(ids) - 1, 96):
            w = ids[b:b + 96]
            if len(w) < 2:
                break
            lp = torch.log_softmax(m(torch.tensor([w])).logits[0].double()[:-1], -1)
            nll -= lp.gather(1, torch.tensor(w[1:]).unsqueeze(1)).sum().item()
            n += len(w) - 1
    assert k["predicted"] == n and k["tokens"] == len(ids)
    ref = math.exp(nll / n)
    assert f"{k['perplexity']:.3g}" == f"{ref:.3g}", (k["perplexity"], ref)
    assert abs(k["perplexity"] - ref) / ref < 1e-4
