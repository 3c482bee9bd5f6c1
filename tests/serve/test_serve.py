"""`guild serve` through the official `openai` client against a server started on a free loopback port: chat and
completions, streaming, stop strings, seeds, token parity with the library's solo run, prefix reuse, a 16-client
load test, and the 400 / 429 / disconnect / SIGTERM cases."""

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from guild.bench.server import free_port, wait_ready  # noqa: E402
from guild.engine.sampling import SamplingParams  # noqa: E402
from guild.load import load  # noqa: E402
from guild.speculative.options import DraftOptions  # noqa: E402
from guild.text.chat import Conversation  # noqa: E402

MODEL = "smollm2-135m-moe"
CONTEXT = 512
PREFILL = 32  # <= the kernels' row-invariant size: every cached row is reusable (see guild/serve/batcher.py)
SAMPLED = dict(temperature=0.8, top_p=0.9, seed=1234)
SAMPLED_PARAMS = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, seed=1234)


def _start(*flags, timeout=600):
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "guild", "serve", MODEL, "--port", str(port), "--device", "cpu",
                          "--context", str(CONTEXT), "--prefill-batch", str(PREFILL), *flags],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_ready(port, p, "/health", timeout)
    return p, port


def _stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.fixture(scope="module")
def server():
    p, port = _start("--parallel", "4", "--max-queue", "32")
    yield port
    _stop(p)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def lm(moe_path):
    return load(moe_path)


def _solo(lm, messages, n, sampling=SamplingParams(), strategy="adaptive", stop=(), chat=True):
    """The library's solo run (what `guild run` calls) with the server's settings."""
    conv = Conversation(lm.session(CONTEXT, PREFILL), lm.tokenizer)
    d = lm.drafter(DraftOptions(strategy=strategy), CONTEXT)
    if not chat:
        return conv.complete(messages, n, stop=stop, sampling=sampling, drafter=d, max_draft=4)
    conv.messages = list(messages[:-1])
    return conv.say(messages[-1]["content"], n, stop=stop, sampling=sampling, drafter=d, max_draft=4)


def _chat(client, messages, **kw):
    extra = {"return_tokens": True, **kw.pop("extra", {})}
    return client.chat.completions.create(model=MODEL, messages=messages, extra_body=extra, **kw)


def _tokens(resp):
    return resp.model_extra["guild"]["tokens"]


def _post(port, path, body: bytes):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, json.loads(e.read())


USER = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_chat_equals_solo_run(client, lm, sampling):
    kw = SAMPLED if sampling == "seeded" else dict(temperature=0.0)
    r = _chat(client, USER, max_tokens=24, **kw)
    want = _solo(lm, USER, 24, SAMPLED_PARAMS if sampling == "seeded" else SamplingParams())
    assert _tokens(r) == want.tokens and r.choices[0].message.content == want.text
    assert r.usage.completion_tokens == len(want.tokens) and r.choices[0].finish_reason in ("stop", "length")
    again = _chat(client, USER, max_tokens=24, **kw)  # seed reproducibility
    assert _tokens(again) == _tokens(r)


@pytest.mark.slow  # over 20 s here; the quick pass keeps test_chat_equals_solo_run[seeded]
def test_seeded_chat_equals_the_guild_run_command(client):
    """The CLI itself, with its default sampling flags, as the server's defaults are (top-k 40, min-p 0.05)."""
    r = _chat(client, USER, max_tokens=16, **SAMPLED)
    out = subprocess.run([sys.executable, "-m", "guild", "run", MODEL, "--chat", "-p", USER[0]["content"], "-n", "16",
                          "--device", "cpu", "--context", str(CONTEXT), "--prefill-batch", str(PREFILL),
                          "--temperature", "0.8", "--top-p", "0.9", "--seed", "1234", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    run = json.loads(out.stdout)
    assert _tokens(r) == run["tokens"] and r.choices[0].message.content == run["text"]


def test_streaming_chat_and_completions(client, lm):
    chunks = list(_chat(client, USER, max_tokens=16, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    want = _solo(lm, USER, 16)
    assert text == want.text and chunks[-1].usage.completion_tokens == len(want.tokens)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    prompt = "The three primary colours are"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                  extra_body={"return_tokens": True})
    want = _solo(lm, prompt, 12, chat=False)
    assert r.model_extra["guild"]["tokens"] == want.tokens and r.choices[0].text == want.text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True))
    assert streamed == want.text


def test_stop_strings(client, lm):
    full = _solo(lm, USER, 24).text
    stop = full[8:11]
    r = _chat(client, USER, max_tokens=24, stop=[stop, "zzzz"])
    want = _solo(lm, USER, 24, stop=[stop])
    assert r.choices[0].message.content == want.text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop" and _tokens(r) == want.tokens


def test_prefix_reuse_is_exact(client, lm):
    first = _chat(client, USER, max_tokens=16)
    turn2 = [*USER, {"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "And two more?"}]
    r = _chat(client, turn2, max_tokens=16)
    assert r.usage.prompt_tokens_details.cached_tokens > 20  # the first turn's rows were reused
    assert _tokens(r) == _solo(lm, turn2, 16).tokens  # ... and change nothing


def test_models_health_metrics(client, server):
    assert [m.id for m in client.models.list()] == [MODEL]
    health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{server}/health").read())
    assert health["status"] == "ok"
    m = urllib.request.urlopen(f"http://127.0.0.1:{server}/metrics").read().decode()
    for name in ("guild_requests_total", "guild_completion_tokens_total", "guild_windows_total",
                 "guild_queue_depth", "guild_batch_size", "guild_decode_tokens_per_second"):
        assert f"# TYPE {name}" in m
    assert 'guild_requests_total{endpoint="/v1/chat/completions",status="200"}' in m


def test_bad_requests(server, client):
    port = server
    for body, param in [(b"{not json", None), (b"[]", None),
                        (json.dumps({"messages": []}).encode(), "messages"),
                        (json.dumps({"messages": USER, "temperature": "hot"}).encode(), "temperature"),
                        (json.dumps({"messages": USER, "n": 2}).encode(), "n"),
                        (json.dumps({"messages": USER, "decode_strategy": "fast"}).encode(), "decode_strategy"),
                        (json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), "messages[0].role"),
                        (json.dumps({"messages": USER, "stop": [""]}).encode(), "stop")]:
        status, _, err = _post(port, "/v1/chat/completions", body)
        assert status == 400, body
        assert err["error"]["type"] == "invalid_request_error" and err["error"]["param"] == param, err
    long = " ".join(["word"] * 2 * CONTEXT)
    status, _, err = _post(port, "/v1/completions", json.dumps({"prompt": long}).encode())
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    assert f"context is {CONTEXT} tokens" in err["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=USER, temperature=9)



def _raw(port, method, path, body=b"", headers=None, chunks=None):
    """One request on a fresh connection, the body as given (or sent chunked): (status, headers, JSON body)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        c.putrequest(method, path)
        for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
            c.putheader(k, v)
        if chunks is not None:
            c.putheader("Transfer-Encoding", "chunked")
        elif body or method == "POST":
            c.putheader("Content-Length", (headers or {}).get("Content-Length", str(len(body))))
        c.endheaders()
        try:
            for ch in chunks or ():
                c.send(b"%x\r\n%s\r\n" % (len(ch), ch))
            c.send(b"0\r\n\r\n" if chunks is not None else body)
        except OSError:  # the server answered and closed before reading it all (413)
            pass
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(r.read())
    finally:
        c.close()


def _openai_error(err, status_kind="invalid_request_error"):
    """OpenAI's error object: one line of message, type, param, code."""
    e = err["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["type"] == status_kind, err
    assert e["message"] and "\n" not in e["message"] and "Traceback" not in e["message"], err
    return e


def test_http_edges_answer_openai_errors(server):
    """Bodies too large (declared, or streamed chunked past the limit), unknown routes, a wrong method, bodies that
    are not UTF-8, a lone surrogate in a prompt and max_tokens < 1: each an OpenAI error object with its status,
    and the server serves on."""
    port, limit = server, 8 * 2**20
    not_found = 'guild_requests_total{endpoint="other",status="404"}'

    def count(line):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(line + " "))

    before = count(not_found)
    status, _, err = _raw(port, "POST", "/v1/chat/completions", headers={"Content-Length": str(limit + 1)})
    assert status == 413 and str(limit) in _openai_error(err)["message"]
    status, _, err = _raw(port, "POST", "/v1/completions", chunks=[b" " * 2**20] * 9)  # no Content-Length
    assert status == 413 and "over the limit" in _openai_error(err)["message"]

    status, _, err = _raw(port, "GET", "/v1/engines")
    assert status == 404 and "/v1/engines" in _openai_error(err, "not_found_error")["message"]
    status, _, err = _raw(port, "POST", "/v2/chat/completions", json.dumps({"messages": USER}).encode())
    assert status == 404
    status, hdrs, err = _raw(port, "GET", "/v1/chat/completions")
    assert status == 405 and hdrs.get("allow") == "POST" and "GET" in _openai_error(err)["message"]
    status, hdrs, err = _raw(port, "POST", "/v1/models", b"{}")
    assert status == 405 and "GET" in hdrs.get("allow", "")

    body = json.dumps({"messages": USER}).encode()
    for raw, where in [(body.replace(b"rainbow", b"rainb\xffw"), body.index(b"rainbow") + 5),
                       (b"\xff\xfe" + body.decode().encode("utf-16-le"), 0),  # UTF-16 with its BOM: not JSON's
                       (body.decode().encode("utf-32"), 0)]:
        status, _, err = _raw(port, "POST", "/v1/chat/completions", raw)
        assert status == 400 and f"not UTF-8 (byte 0x{raw[where]:02x} at offset {where})" in \
            _openai_error(err)["message"], raw[:20]
    status, _, err = _raw(port, "POST", "/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 2}')
    assert status == 400 and _openai_error(err)["param"] == "prompt" and "surrogate" in err["error"]["message"]

    for field in ("max_tokens", "max_completion_tokens"):
        for n in (0, -1):
            for path, extra in (("/v1/chat/completions", {"messages": USER}), ("/v1/completions", {"prompt": "Hi"})):
                status, _, err = _raw(port, "POST", path, json.dumps({**extra, field: n}).encode())
                assert status == 400 and _openai_error(err)["param"] == field, (path, field, n)
                assert f"'{field}' must be an integer >= 1, got {n}" == err["error"]["message"]

    status, _, ok = _raw(port, "POST", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 1}).encode())
    assert status == 200 and ok["usage"]["completion_tokens"] == 1
    assert count(not_found) - before == 2


PROMPTS = ["Write a haiku about the sea.", "List the first five prime numbers.", "What is the capital of Italy?",
           "Spell the word 'banana' backwards.", "Summarise: the cat sat on the mat because the mat was warm.",
           "Translate 'good morning' into French.", "Name a programming language created in 1991.",
           "Repeat after me: one two three four five six."]
STRATEGIES = ["normal", "lookup", "retrieval", "mtp", "adaptive"]


@pytest.mark.slow  # over 20 s here; the quick pass keeps test_concurrent_requests_share_rounds
def test_sixteen_concurrent_streams_equal_their_solo_runs(client, lm):
    # clients i and i + 8 differ only in strategy: one solo run (normal; strategies are exact) serves both
    cases = [(PROMPTS[i % 8], STRATEGIES[i % 5], i % 8 % 3 == 0, 12 + i % 8 % 5) for i in range(16)]
    got: dict[int, tuple] = {}
    ttft: list[float] = []

    def one(i):
        prompt, strategy, sampled, n = cases[i]
        kw = SAMPLED if sampled else dict(temperature=0.0)
        t0 = time.perf_counter()
        text, first = "", None
        for c in _chat(client, [{"role": "user", "content": prompt}], max_tokens=n, stream=True,
                       extra={"decode_strategy": strategy}, **kw):
            if c.choices and c.choices[0].delta.content:
                first = first or time.perf_counter() - t0
                text += c.choices[0].delta.content
        got[i] = (text, strategy)
        ttft.append(first or 0.0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert len(got) == 16  # none lost
    solo = {}
    for i, (prompt, strategy, sampled, n) in enumerate(cases):
        if i % 8 not in solo:
            solo[i % 8] = _solo(lm, [{"role": "user", "content": prompt}], n,
                                SAMPLED_PARAMS if sampled else SamplingParams(), "normal").text
        assert got[i][0] == solo[i % 8], (i, strategy)
    ttft.sort()
    print(f"16 clients: ttft p50 {ttft[8]:.2f} s, p95 {ttft[15]:.2f} s")


def _metric(port, name) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.split("{")[0].split(" ")[0] == name)


def test_concurrent_requests_share_rounds(server):
    """Four requests at once (normal decoding: one token per request per round) are decoded together: the mean
    batch size is over 1 and the rounds are fewer than the tokens. A server taking one request at a time would
    need a round per token."""
    names = ("guild_rounds_total", "guild_round_requests_total", "guild_completion_tokens_total")
    before = {n: _metric(server, n) for n in names}
    body = {"max_tokens": 24, "temperature": 0, "decode_strategy": "normal"}
    results = []

    def one(i):
        results.append(_post(server, "/v1/chat/completions", json.dumps(
            {**body, "messages": [{"role": "user", "content": PROMPTS[i]}]}).encode()))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert [r[0] for r in results] == [200] * 4, results
    d = {n: _metric(server, n) - before[n] for n in names}
    tokens = sum(r[2]["usage"]["completion_tokens"] for r in results)
    assert d["guild_completion_tokens_total"] == tokens
    assert d["guild_round_requests_total"] / d["guild_rounds_total"] > 1, d  # the mean batch size
    assert d["guild_rounds_total"] < tokens, d


def test_overload_disconnect_and_sigterm():
    p, port = _start("--parallel", "1", "--max-queue", "1")
    try:
        # a long stream holds the one slot; of three more requests one waits and two get 429
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        s = c.chat.completions.create(model=MODEL, messages=USER, max_tokens=400, stream=True)
        next(iter(s))
        body = json.dumps({"messages": USER, "max_tokens": 8, "temperature": 0}).encode()
        results, answered = [], threading.Semaphore(0)

        def post():
            results.append(_post(port, "/v1/chat/completions", body))
            answered.release()

        ts = [threading.Thread(target=post) for _ in range(3)]
        for t in ts:
            t.start()
        # two answers come without a clock: the 429s at once, or (a bug) 200s once the stream ends
        answered.acquire()
        answered.acquire()
        assert sorted(r[0] for r in results) == [429, 429], results
        r429 = results[0]
        assert r429[1].get("retry-after") == "1" and r429[2]["error"]["type"] == "rate_limit_error"

        # the stream's client goes away: it is cancelled, its slot frees, the waiting request is served
        s.close()
        for t in ts:
            t.join(300)
        assert sorted(r[0] for r in results) == [200, 429, 429]
        m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        assert "guild_cancelled_total 1" in m

        # SIGTERM while a request streams: it finishes, then the server exits 0
        s = c.chat.completions.create(model=MODEL, messages=USER, max_tokens=24, stream=True, temperature=0)
        it = iter(s)
        next(it)
        p.send_signal(signal.SIGTERM)
        rest = list(it)
        assert rest and rest[-1].choices[0].finish_reason in ("stop", "length")
        assert p.wait(120) == 0
    finally:
        _stop(p)
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)


@pytest.mark.slow  # over 20 s here; the quick pass keeps the server's OpenAI surface: the tests above
def test_two_replicas_behind_litellm(server, lm):
    """Scaling out (README "Serving"): two `guild serve` replicas as deployments of one model in LiteLLM's Router;
    both take requests, and every answer equals the solo run."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network: the bundled cost map
    litellm = pytest.importorskip("litellm")
    import random

    p2, port2 = _start("--parallel", "2")
    try:
        router = litellm.Router(model_list=[
            {"model_name": "guild", "litellm_params": {"model": f"openai/{MODEL}", "api_base": f"http://127.0.0.1:{port}/v1",
                                                       "api_key": "none"}} for port in (server, port2)],
            routing_strategy="simple-shuffle", num_retries=0)
        def served():
            out = []
            for port in (server, port2):
                m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
                key = 'guild_requests_total{endpoint="/v1/chat/completions",status="200"}'
                out.append(float(next((x for x in m.splitlines() if x.startswith(key)), "x 0").split()[-1]))
            return out

        before = served()
        random.seed(0)
        want = _solo(lm, USER, 8).text
        for _ in range(8):
            r = router.completion(model="guild", messages=USER, max_tokens=8, temperature=0)
            assert r.choices[0].message.content == want
        after = served()
        delta = [a - b for a, b in zip(after, before, strict=True)]
        assert sum(delta) == 8 and all(n > 0 for n in delta), delta
    finally:
        _stop(p2)
