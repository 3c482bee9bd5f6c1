"""The serving engine without HTTP: prefix reuse at any chunk size where prefill is row-invariant, and exact when
prefill chunks take the BLAS path; the session pool stays within its memory cap, and an impossible cap is
refused up front."""

import threading

import pytest

from guild.engine.sampling import SamplingParams
from guild.errors import GuildError
from guild.load import load
from guild.serve.batcher import BatchEngine, Job, SessionPool
from guild.speculative.build import make_drafter
from guild.tools.tiny_hybrid import write_tiny_hybrid
from tests.helpers.tiny_hybrids import TINY, TOKENS


@pytest.fixture(scope="module")
def lm(moe_path):
    return load(moe_path)


def _engine(lm, **kw):
    args = dict(context=320, prefill_batch=512, parallel=2, max_queue=8, cache_bytes=2**30) | kw
    e = BatchEngine(lm, **args)
    e.start()
    return e


def _run(engine, prompt, n=8, strategy="lookup"):
    done, out = threading.Event(), {}

    def emit(kind, payload):
        if kind != "text":
            out[kind] = payload
            done.set()

    engine.submit(Job(list(prompt), n, SamplingParams(), strategy, 4, (), emit))
    assert done.wait(600)
    assert "error" not in out, out
    return out["done"]


def _ids(lm, text):
    return lm.tokenizer.encode(text, add_special=True)


DOC = ("The Python Software Foundation was formed in 2001 to own Python-related intellectual property. It is a "
       "non-profit organization devoted to the Python programming language. ") * 2


def test_reuse_at_any_chunk_size_with_row_invariant_prefill(lm):
    """The int8 kernels make prefill row-invariant at any chunk size: with 512-row chunks a prompt sent again
    reuses all but its last token, a follow-up reuses the reply's decoded rows too, and the tokens are those
    of a fresh engine."""
    assert lm.model.prefill_row_invariant()
    e = _engine(lm)
    try:
        a = _ids(lm, DOC + "Question: who owns it?")
        first = _run(e, a)
        again = _run(e, a)
        assert again.reused_tokens == len(a) - 1 and again.tokens == first.tokens
        b = a + first.tokens + _ids(lm, " And when was it formed? Answer briefly, please.")[1:]
        second = _run(e, b)
        assert second.reused_tokens >= len(a) + len(first.tokens) - 1
    finally:
        e.close()
    fresh = _engine(lm)
    try:
        assert _run(fresh, b).tokens == second.tokens
    finally:
        fresh.close()


@pytest.fixture(scope="module")
def lm_blas(moe_path):
    return load(moe_path, numerics="f32")  # fp32 kernels: chunks over 64 rows multiply through BLAS


def test_reuse_with_blas_prefill_is_cut_to_whole_chunks(lm_blas):
    lm = lm_blas
    assert not lm.model.prefill_row_invariant()
    batch = 72  # > the kernels' row-invariant size: prefill chunks take the BLAS path
    e = _engine(lm, prefill_batch=batch)
    try:
        a = _ids(lm, DOC + "Question: who owns it?")
        assert len(a) > batch  # at least one whole chunk to reuse
        first = _run(e, a)
        b = a + first.tokens + _ids(lm, " And when was it formed? Answer briefly, please.")[1:]
        second = _run(e, b)
        assert second.reused_tokens > 0 and second.reused_tokens % batch == 0
        assert second.reused_tokens <= len(a)  # decode rows (row-invariant kernels) differ from BLAS rows: not reused
    finally:
        e.close()
    fresh = _engine(lm, prefill_batch=batch)
    try:
        assert _run(fresh, b).tokens == second.tokens and _run(fresh, a).tokens == first.tokens
    finally:
        fresh.close()


def test_pool_stays_within_its_cap(lm):
    probe = lm.session(320)
    cap = 3 * probe.state.nbytes
    e = _engine(lm, parallel=1, cache_bytes=cap)
    try:
        for i in range(6):
            r = _run(e, _ids(lm, f"Prompt number {i}: say something about the number {i}."), n=2,
                     strategy=("normal", "lookup")[i % 2])
            assert r.tokens
            assert len(e.pool.entries) <= 3 and e.pool.nbytes <= cap
    finally:
        e.close()
    with pytest.raises(GuildError, match="--cache-mem"):
        BatchEngine(lm, context=320, prefill_batch=512, parallel=4, max_queue=8, cache_bytes=cap)


def test_a_failing_forward_fails_its_requests_not_the_server(lm):
    e = _engine(lm, parallel=1)
    try:
        class Broken:  # the engine's rounds fail (prefill runs on the session's own model reference)
            def __getattr__(self, name):
                return getattr(lm.model, name)

            def forward_batch(self, items, **kw):
                raise RuntimeError("boom")

        e.model = Broken()
        done, out = threading.Event(), {}
        e.submit(Job(_ids(lm, "Hello there"), 8, SamplingParams(), "normal", 4, (),
                     lambda k, p: (out.__setitem__(k, p), done.set()) if k != "text" else None))
        assert done.wait(300) and "boom" in out["error"]
        e.model = lm.model
        assert _run(e, _ids(lm, "Hello there"), n=4).tokens  # the server goes on
        assert not e.pool.entries or all(not x.busy for x in e.pool.entries)
    finally:
        e.close()


@pytest.mark.gpu  # the fake device
def test_engine_on_the_fake_gpu_equals_the_cpu(lm, moe_path, monkeypatch):
    """The serving engine on the GPU engine (GUILD_FAKE_GPU: the counting host backend) gives the CPU's tokens."""
    monkeypatch.setenv("GUILD_FAKE_GPU", "1")
    gpu = load(moe_path, device="cuda")
    assert gpu.device != "cpu"
    prompt = _ids(lm, "List the first five prime numbers.")
    want = _run(cpu := _engine(lm), prompt, strategy="adaptive")
    cpu.close()
    e = _engine(gpu)
    try:
        assert _run(e, prompt, strategy="adaptive").tokens == want.tokens
        assert _run(e, prompt, strategy="mtp").tokens == want.tokens
    finally:
        e.close()


@pytest.mark.parametrize("batch", [32, 72], ids=["row-invariant", "blas"])
def test_hybrid_reuse_reports_the_rows_really_kept(batch, tmp_path):
    """A recurrent state is cut back only to its position or its last prefill checkpoint: the pool reports the
    rows a hybrid's session really keeps (what `cached_tokens` says), and the reply equals a fresh prefill's."""
    path = tmp_path / "hybrid.gguf"
    write_tiny_hybrid(path, **TINY["qwen35moe"])
    hy = load(str(path))
    pool = SessionPool(lambda: hy.session(256, batch), lambda s: make_drafter(s), batch, 2**30)

    def serve(prompt):
        e, n = pool.acquire(prompt, "lookup", 0)
        assert n == e.session.state.pos, "the pool counted rows the state does not hold"
        start = e.session.state.pos
        out, _ = e.session.generate(prompt[n:], 8, drafter=e.drafter, max_draft=4)
        pool.prefilled(e, start)
        pool.release(e)
        fresh, _ = hy.session(256, batch).generate(prompt, 8, drafter=make_drafter("lookup"), max_draft=4)
        assert out == fresh
        return n, out

    first = [int(t) for t in TOKENS] * 7  # 84 tokens: the BLAS pool prefills them as chunks of 72 and 12
    assert serve(first)[0] == 0
    held = pool.entries[0].session.tokens
    n, _ = serve(held[: len(first) + 5] + [9, 8, 7])  # diverges inside the reply: back to the prompt's end
    assert n == (len(first) if batch == 32 else 0)  # the BLAS pool reuses whole chunks only, none ends at 84
    held = pool.entries[0].session.tokens
    n, _ = serve(held + [6, 5])  # continues the whole conversation: every row the state holds
    assert n == (len(held) - 1 if batch == 32 else 0)


def test_long_prompt_prefills_between_the_others_rounds(lm):
    """A long prompt is fed one chunk per round: a request already decoding gets tokens while it prefills, and
    both replies are the tokens each request gets alone."""
    long_prompt = _ids(lm, DOC * 3 + "Question: what is it devoted to?")
    short = _ids(lm, "Hello, how are")
    e = _engine(lm, prefill_batch=16)
    try:
        solo_long, solo_short = _run(e, long_prompt, 4, "normal"), _run(e, short, 24, "normal")
    finally:
        e.close()
    e = _engine(lm, prefill_batch=16)
    seen, done, out = [], threading.Event(), {}
    jobs = {}

    def emitter(name):
        def emit(kind, payload):
            if kind == "text":
                other = jobs["long"].gen
                seen.append(name == "short" and other is not None and other.prefilling)
            elif kind in ("done", "error"):
                out[name] = (kind, payload)
                if len(out) == 2:
                    done.set()
        return emit

    try:
        jobs["short"] = Job(short, 24, SamplingParams(), "normal", 4, (), emitter("short"))
        jobs["long"] = Job(long_prompt, 4, SamplingParams(), "normal", 4, (), emitter("long"))
        e.submit(jobs["short"])
        e.submit(jobs["long"])
        assert done.wait(600)
    finally:
        e.close()
    assert out["short"][0] == out["long"][0] == "done", out
    assert len(long_prompt) > 6 * 16
    assert sum(seen) >= 3  # the short request's text arrived during at least three of the long one's chunks
    assert out["long"][1].tokens == solo_long.tokens and out["short"][1].tokens == solo_short.tokens
