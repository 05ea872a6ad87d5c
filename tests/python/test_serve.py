"""`kiln serve` on loopback, against the OpenAI Python client and raw HTTP: a small random Qwen3 checkpoint
(kiln init-model, with its tokenizer and ChatML template) served on the CPU.

Greedy results equal `kiln generate`; streamed pieces concatenate to the non-streamed text; concurrent greedy
requests equal their solo results; stop strings, usage; hostile requests get clean errors and the server keeps
answering; SIGTERM exits cleanly."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

KILN = os.environ.get("KILN_CLI", "")

pytestmark = pytest.mark.skipif(not KILN or not os.path.exists(KILN), reason="KILN_CLI (the kiln binary) is not set")


def has_serve():
    r = subprocess.run([KILN, "serve", "--help"], capture_output=True, text=True)
    return r.returncode == 0


class Server:
    def __init__(self, model, *args, ctx=128):
        self.proc = subprocess.Popen([KILN, "serve", "-m", model, "--device", "cpu", "--port", "0", "--ctx", str(ctx), *args],
                                     stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        assert self.port, "kiln serve did not start"
        # Keep reading stderr so the server never blocks on a full pipe.
        self.log = []
        threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stderr], daemon=True).start()

    def request(self, method, path, body=None, headers=None, raw=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        return r.status, text

    def post(self, path, body, **kw):
        status, text = self.request("POST", path, body, **kw)
        return status, json.loads(text) if text.startswith("{") else text

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if not has_serve():
        pytest.skip("this kiln was built without kiln serve (cpp-httplib not found)")
    d = str(tmp_path_factory.mktemp("serve") / "tiny")
    data = os.environ.get("KILN_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
    subprocess.run([KILN, "init-model", d, "--layers", "2", "--hidden", "128", "--seed", "3", "--tokenizer",
                    os.path.join(data, "tokenizers", "qwen2.json")], check=True, capture_output=True)
    return d


@pytest.fixture(scope="module")
def server(model):
    s = Server(model)
    yield s
    assert s.stop() == 0


def generate_ids(model, prompt, n):
    r = subprocess.run([KILN, "generate", "-m", model, "--device", "cpu", "-p", prompt, "-n", str(n), "--temp", "0",
                        "--ids"], capture_output=True, text=True, check=True)
    return [int(x) for x in r.stdout.strip().split(",") if x]


def test_greedy_completion_equals_kiln_generate(server, model):
    for prompt in ("Hello world", "The sky is"):
        status, r = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0})
        assert status == 200, r
        ids = generate_ids(model, prompt, 12)
        status, d = server.post("/detokenize", {"tokens": ids, "skip_special_tokens": True})
        assert r["choices"][0]["text"] == d["content"]
        assert r["usage"]["completion_tokens"] == len(ids)
        status, t = server.post("/tokenize", {"content": prompt, "add_special": True})
        assert r["usage"]["prompt_tokens"] == len(t["tokens"])
        assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]


def test_logprobs_are_the_models_log_softmax(server, model, tmp_path):
    # Greedy chat with logprobs: each token's log-probability equals log_softmax of the logits `kiln logits`
    # computes for the same ids, and the token is the first of its top_logprobs.
    status, r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hello"}],
                                                     "max_tokens": 6, "temperature": 0, "logprobs": True,
                                                     "top_logprobs": 3, "ignore_eos": True})
    assert status == 200, r
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"] == 6
    status, t = server.post("/tokenize", {"content": "Say hello"})
    chat_ids = None
    for e in content:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 3
        assert e["top_logprobs"][0]["token"] == e["token"] and e["top_logprobs"][0]["logprob"] == pytest.approx(e["logprob"])
        assert [x["logprob"] for x in e["top_logprobs"]] == sorted((x["logprob"] for x in e["top_logprobs"]), reverse=True)
        assert bytes(e["bytes"]).decode() == e["token"]
    # The same through /v1/completions (ids as the prompt, so both sides see the same tokens), against kiln logits.
    prompt = t["tokens"]
    status, c = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 2,
                                                "ignore_eos": True})
    assert status == 200, c
    lp = c["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 5
    assert "".join(lp["tokens"]) == c["choices"][0]["text"]
    assert lp["text_offset"] == [sum(len(x) for x in lp["tokens"][:i]) for i in range(5)]
    gen = [int(x) for x in subprocess.run([KILN, "generate", "-m", model, "--device", "cpu", "--prompt-ids",
                                           ",".join(map(str, prompt)), "-n", "5", "--temp", "0", "--ids", "--ignore-eos"],
                                          capture_output=True, text=True, check=True).stdout.strip().split(",")]
    out = tmp_path / "logits.json"
    subprocess.run([KILN, "logits", "-m", model, "--device", "cpu", "--prompt-ids", ",".join(map(str, prompt + gen[:4])),
                    "--out", str(out)], capture_output=True, check=True)
    import numpy as np
    logits = np.array(json.loads(out.read_text())["logits"], dtype=np.float64)[len(prompt) - 1:]
    ref = logits - logits.max(axis=1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(axis=1, keepdims=True))
    for i, g in enumerate(gen):
        assert lp["token_logprobs"][i] == pytest.approx(ref[i, g], abs=2e-4)
        assert len(lp["top_logprobs"][i]) <= 2 and max(lp["top_logprobs"][i].values()) == pytest.approx(ref[i].max(), abs=2e-4)
    # Streamed: the chunks' entries add up to the tokens; without logprobs there are none.
    status, raw = server.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                                "max_tokens": 5, "logprobs": True, "stream": True,
                                                                "ignore_eos": True})
    chunks = [json.loads(l[6:]) for l in raw.split("\n") if l.startswith("data: {")]
    entries = [e for ch in chunks if ch["choices"] and ch["choices"][0]["logprobs"]
               for e in ch["choices"][0]["logprobs"]["content"]]
    assert len(entries) == 5 and all(e["top_logprobs"] == [] for e in entries)
    status, r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r["choices"][0]["logprobs"] is None
    for body in ({"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21}, {"logprobs": 1}):
        status, r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], **body})
        assert status == 400 and r["error"]["param"] in ("logprobs", "top_logprobs"), r


def test_openai_client_streams_what_it_returns_whole(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none")
    whole = client.completions.create(model="tiny", prompt="Once upon", max_tokens=20, temperature=0)
    pieces = [c.choices[0].text for c in client.completions.create(model="tiny", prompt="Once upon", max_tokens=20,
                                                                   temperature=0, stream=True) if c.choices]
    assert "".join(pieces) == whole.choices[0].text
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi there"}],
                                          max_tokens=10, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi there"}],
                                            max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    text, usage = "", None
    for c in stream:
        if c.choices and c.choices[0].delta.content:
            text += c.choices[0].delta.content
        if c.usage:
            usage = c.usage
    assert text == chat.choices[0].message.content
    assert usage.completion_tokens == chat.usage.completion_tokens and usage.prompt_tokens == chat.usage.prompt_tokens
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_concurrent_greedy_requests_equal_their_solo_results(server):
    prompts = [f"Request number {i} says" for i in range(16)]
    body = lambda p: {"prompt": p, "max_tokens": 60, "temperature": 0, "ignore_eos": True}
    solo = [server.post("/v1/completions", body(p))[1]["choices"][0]["text"] for p in prompts]
    with ThreadPoolExecutor(16) as ex:
        together = list(ex.map(lambda p: server.post("/v1/completions", body(p))[1], prompts))
    assert [r["choices"][0]["text"] for r in together] == solo
    # The engine decoded several at once (continuous batching, --max-batch 8).
    peak = re.search(r"^kiln_batch_running_max (\d+)", server.request("GET", "/metrics")[1], re.M)
    assert int(peak.group(1)) > 1, "the requests were never decoded together"


def test_stop_strings_end_the_text_before_them(server):
    status, full = server.post("/v1/completions", {"prompt": "Hello world", "max_tokens": 24, "temperature": 0,
                                                   "ignore_eos": True})
    text = full["choices"][0]["text"]
    # A stop string from the middle of the greedy text (whole characters).
    cut = len(text) // 2
    stop = text[cut:cut + 2]
    if len(stop) < 2:
        pytest.skip("the greedy text is too short for a stop string")
    status, r = server.post("/v1/completions", {"prompt": "Hello world", "max_tokens": 24, "temperature": 0,
                                                "ignore_eos": True, "stop": [stop]})
    assert status == 200
    assert r["choices"][0]["text"] == text[:text.find(stop)]
    assert r["choices"][0]["finish_reason"] == "stop"
    status, r = server.post("/v1/completions", {"prompt": "Hello world", "max_tokens": 24, "temperature": 0,
                                                "ignore_eos": True, "stop": stop, "stream": True})
    assert status == 200
    streamed = "".join(json.loads(l[6:])["choices"][0]["text"] for l in r.split("\n")
                       if l.startswith("data: {") and json.loads(l[6:])["choices"])
    assert streamed == text[:text.find(stop)]


@pytest.mark.parametrize("body,status,param", [
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10 ** 6}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ({"prompt": "x", "top_p": 2}, 400, "top_p"),
    ({"prompt": "x", "n": 2}, 400, "n"),
    ({"prompt": "x", "logprobs": 6}, 400, "logprobs"),
    ({"prompt": "x", "logprobs": True}, 400, "logprobs"),
    ({"prompt": "x", "stop": [1]}, 400, "stop"),
    ({"prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"prompt": "x " * 400}, 400, "prompt"),
    ({"prompt": [1, 2, -3]}, 400, "prompt"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ({}, 400, "prompt"),
])
def test_bad_requests_name_the_field(server, body, status, param):
    got, r = server.post("/v1/completions", body)
    assert got == status, r
    assert r["error"]["param"] == param and r["error"]["message"]


def test_hostile_input_leaves_the_server_serving(server):
    assert server.request("POST", "/v1/completions", raw="{not json")[0] == 400
    assert server.request("POST", "/v1/completions", raw="[1, 2]")[0] == 400
    assert server.request("POST", "/v1/completions", raw='{"prompt": NaN}')[0] == 400
    # A number beyond a double (the JSON library's overflow error, not its syntax error): a 400, not a 500.
    assert server.request("POST", "/v1/completions", raw='{"prompt": [0], "max_tokens": 1e999}')[0] == 400
    assert server.request("POST", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]})[0] == 400
    assert server.request("POST", "/v1/chat/completions", {"messages": "hello"})[0] == 400
    # A body over the limit (1 MiB): 413 from the headers alone.
    big = socket.create_connection(("127.0.0.1", server.port))
    big.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n{")
    assert big.recv(4096).startswith(b"HTTP/1.1 413")
    big.close()
    assert server.request("GET", "/v1/nothing")[0] == 404
    # A client that sends half a request and stalls does not hold up the others.
    stall = socket.create_connection(("127.0.0.1", server.port))
    stall.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
    assert server.request("GET", "/health") == (200, '{"status":"ok"}')
    stall.close()
    assert server.request("GET", "/health") == (200, '{"status":"ok"}')
    assert re.search(r"^kiln_generation_tokens_total \d+", server.request("GET", "/metrics")[1], re.M)


def test_a_client_that_disconnects_mid_stream_frees_the_engine(model):
    s = Server(model, ctx=4096)
    try:
        c = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps({"prompt": "Hello", "max_tokens": 4000, "stream": True, "ignore_eos": True})
        c.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        got = b""
        while b"data:" not in got:
            chunk = c.recv(4096)
            assert chunk, got
            got += chunk
        c.close()
        # The next request runs as soon as the abandoned one stops (it does not wait out 4000 tokens).
        t0 = time.time()
        status, r = s.post("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "temperature": 0})
        assert status == 200 and r["usage"]["completion_tokens"] == 4
        metrics = s.request("GET", "/metrics")[1]
        assert re.search(r"^kiln_requests_cancelled_total 1", metrics, re.M), metrics
        gen = int(re.search(r"^kiln_generation_tokens_total (\d+)", metrics, re.M).group(1))
        assert gen < 4000, f"the abandoned request ran to its end ({gen} tokens, {time.time() - t0:.1f} s)"
    finally:
        assert s.stop() == 0


def test_api_key_is_required_when_set(model):
    s = Server(model, "--api-key", "sesame")
    try:
        assert s.request("GET", "/v1/models")[0] == 401
        assert s.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert s.request("GET", "/v1/models", headers={"Authorization": "Bearer sesame"})[0] == 200
        assert s.request("GET", "/health")[0] == 200  # health checks need no key
    finally:
        assert s.stop() == 0


def test_bench_serve_loads_the_server(server, tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([KILN, "bench", "serve", "--url", f"http://127.0.0.1:{server.port}", "--concurrency", "1,4",
                        "-p", "16", "-n", "12", "--requests", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    levels = json.loads(out.read_text())["levels"]
    assert [l["streams"] for l in levels] == [1, 4]
    for l in levels:
        assert l["errors"] == 0 and l["output_tokens"] == l["streams"] * 2 * 12, l
        assert l["output_tps"] > 0 and l["ttft_ms"]["p50"] > 0
    bad = subprocess.run([KILN, "bench", "serve", "--url", "http://127.0.0.1:1"], capture_output=True, text=True)
    assert bad.returncode != 0 and "no server answers" in bad.stderr


def test_chunked_prefill_and_prefix_reuse_change_no_token(model):
    # Prompts run 3 tokens at a time between decode steps; a prompt that extends an earlier one starts from
    # the slot that holds it.
    s = Server(model, "--prefill-chunk", "3", "--max-batch", "2", ctx=256)
    try:
        def text(prompt, n=16):
            status, r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                   "ignore_eos": True})
            assert status == 200, r
            return r["choices"][0]["text"]

        def solo(prompt, n=16):
            r = subprocess.run([KILN, "generate", "-m", model, "--device", "cpu", "-p", prompt, "-n", str(n), "--temp",
                                "0", "--ids", "--ignore-eos"], capture_output=True, text=True, check=True)
            ids = [int(x) for x in r.stdout.strip().split(",") if x]
            return s.post("/detokenize", {"tokens": ids, "skip_special_tokens": True})[1]["content"]

        system = "System: you answer briefly and well. User: "
        first = system + "what is a kiln?"
        assert text(first) == solo(first)
        reused = lambda: int(re.search(r"^kiln_prefix_reused_tokens_total (\d+)", s.request("GET", "/metrics")[1],
                                       re.M).group(1))
        before = reused()
        second = system + "and a furnace?"
        assert text(second) == solo(second)
        assert reused() > before, "the shared system prompt was run again"
        # While a long prompt runs chunk by chunk, a running stream keeps getting tokens.
        with ThreadPoolExecutor(2) as ex:
            a = ex.submit(text, "Once upon a time", 60)
            time.sleep(0.05)
            b = ex.submit(text, "word " * 40, 8)
            assert a.result() == solo("Once upon a time", 60) and b.result() == solo("word " * 40, 8)
    finally:
        assert s.stop() == 0


def test_soak_of_mixed_requests_leaks_no_memory(model):
    # 2,000 requests of every kind (completions, chat, streams, bad bodies, disconnects) over 8 connections;
    # the server's resident memory after them stays where it was after the first few hundred.
    s = Server(model, "--max-batch", "4", ctx=128)

    def rss():
        with open(f"/proc/{s.proc.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024

    def one(i):
        kind = i % 5
        if kind == 0:
            return s.post("/v1/completions", {"prompt": f"soak {i}", "max_tokens": 4, "temperature": 0.7, "seed": i})[0]
        if kind == 1:
            return s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": f"hi {i}"}],
                                                   "max_tokens": 3})[0]
        if kind == 2:
            return s.request("POST", "/v1/completions", {"prompt": f"stream {i}", "max_tokens": 4, "stream": True})[0]
        if kind == 3:
            return s.request("POST", "/v1/completions", raw='{"prompt": ' + "[" * (i % 50))[0]
        c = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps({"prompt": "x", "max_tokens": 8, "stream": True})
        c.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
        c.close()
        return 0

    try:
        with ThreadPoolExecutor(8) as ex:
            statuses = list(ex.map(one, range(300)))
            time.sleep(0.5)
            base = rss()
            statuses += list(ex.map(one, range(300, 2000)))
        assert set(statuses) <= {0, 200, 400}, sorted(set(statuses))
        time.sleep(0.5)
        grown = rss() - base
        assert grown < 16 << 20, f"resident memory grew by {grown >> 20} MiB over 1,700 requests"
        assert s.request("GET", "/health") == (200, '{"status":"ok"}')
    finally:
        assert s.stop() == 0


def test_a_small_paged_cache_queues_requests_and_serves_them_all(model):
    # 128 positions: 8 blocks of 16. Each request may fill 3 (prompt + 40 tokens), so at most two run at once
    # and the others wait for blocks; each still equals its solo result. A request that could need more than the
    # whole cache (the context is clamped to it) is a 400.
    s = Server(model, "--kv-tokens", "128", "--max-batch", "4", ctx=256)
    try:
        prompts = [f"Paged request {i} says" for i in range(8)]
        body = lambda p: {"prompt": p, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
        solo = [s.post("/v1/completions", body(p))[1]["choices"][0]["text"] for p in prompts]
        with ThreadPoolExecutor(8) as ex:
            together = list(ex.map(lambda p: s.post("/v1/completions", body(p))[1], prompts))
        assert [r["choices"][0]["text"] for r in together] == solo
        metrics = s.request("GET", "/metrics")[1]
        value = lambda name: int(float(re.search(rf"^{name} (\S+)", metrics, re.M).group(1)))
        assert value("kiln_kv_cache_blocks") == 8
        assert value("kiln_kv_cache_blocks_free") == 8, "a finished request kept its blocks"
        assert value("kiln_batch_running_max") == 2
        status, r = s.post("/v1/completions", {"prompt": "Hello", "max_tokens": 200})
        assert status == 400, r
        assert s.request("GET", "/health")[0] == 200
    finally:
        assert s.stop() == 0


def test_the_queue_limit_counts_beyond_the_free_batch_places(model):
    # --max-batch clients arriving at once all get in with no queue; a request past the taken places and the
    # queue is a 429, and the server serves again once a place is free.
    s = Server(model, "--max-batch", "6", "--max-queue", "0")
    try:
        body = lambda i: {"prompt": f"Client {i} asks", "max_tokens": 8, "temperature": 0}
        with ThreadPoolExecutor(6) as ex:
            statuses = [r[0] for r in ex.map(lambda i: s.post("/v1/completions", body(i)), range(6))]
        assert statuses == [200] * 6
    finally:
        assert s.stop() == 0
    # The held request is long (8000 tokens: seconds of decoding on a loaded CPU) so that it still runs when the
    # next arrives, whatever else the machine does.
    s = Server(model, "--max-batch", "1", "--max-queue", "0", ctx=8192)
    try:
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "A long answer", "max_tokens": 8000,
                                                              "ignore_eos": True, "stream": True}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200
        r.fp.readline()  # the first event: the request holds the batch's one place
        status, err = s.post("/v1/completions", body(0))
        assert status == 429, err
        assert err["error"]["type"] == "rate_limit_error" and "1 of its 1 batch places taken" in err["error"]["message"]
        c.close()  # the client goes away: its place frees
        deadline = time.time() + 30
        while s.post("/v1/completions", body(0))[0] == 429 and time.time() < deadline:
            time.sleep(0.05)
        assert s.post("/v1/completions", body(0))[0] == 200
    finally:
        assert s.stop() == 0
