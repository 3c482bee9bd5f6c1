"""`guild serve`: an OpenAI-compatible HTTP server over one loaded model, with continuous batching (engine.py),
exact per-request speculation and prefix reuse. `serve()` is the whole command."""

from __future__ import annotations

import copy
import http.client
import json
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..engine.options import MAX_SESSIONS, DecodeOptions
from ..errors import BadFlagError, GuildError
from ..speculative.options import DraftOptions
from .batcher import BatchEngine
from .metrics import Metrics
from .schema import Defaults

__all__ = ["ServeOptions", "serve", "build", "warm_up"]

# The warm-up request's chat message: over PARALLEL_ROWS + 2 tokens under any tokenizer (a chat prompt's
# row-parallel host ops) and without repeats, so that `adaptive` drafts from its head, not only by prompt lookup.
WARM_UP_MESSAGE = "Tell me, in two short sentences, about a lighthouse keeper who paints seashells on winter evenings."
WARM_UP_TOKENS = 6  # a generation of a few windows: the drafters' and the verifier's first use


@dataclass(frozen=True)
class ServeOptions:
    """`guild serve`'s own flags (decoding flags are DecodeOptions, as on `run`)."""

    host: str = "127.0.0.1"
    port: int = 8080
    parallel: int = 4  # requests decoding at once (their windows share each forward)
    max_queue: int = 64  # requests waiting beyond that; more get 429
    cache_mem_mib: int = 4096  # KV caches of active and pooled sessions together
    drain_s: float = 300.0  # on SIGTERM: how long in-flight requests may take to finish
    chat_template: str | None = None  # a Jinja file replacing the model's chat template

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise BadFlagError(f"--port must be in 0..65535, got {self.port}")
        if not 1 <= self.parallel <= MAX_SESSIONS:
            raise BadFlagError(f"--parallel must be in 1..{MAX_SESSIONS}, got {self.parallel}")
        if self.max_queue < 0:
            raise BadFlagError(f"--max-queue must be >= 0, got {self.max_queue}")
        if self.cache_mem_mib < 1:
            raise BadFlagError(f"--cache-mem must be >= 1 (MiB), got {self.cache_mem_mib}")
        if not self.drain_s > 0:
            raise BadFlagError(f"--drain-timeout must be > 0, got {self.drain_s}")


def build(lm, opts: DecodeOptions, sopts: ServeOptions, name: str):
    """The app and its engine (not started) for a loaded model."""
    from .app import Server  # starlette: only when serving

    draft = DraftOptions(strategy=opts.strategy, max_draft=opts.max_draft, min_match=opts.min_match,
                         lookup_window=opts.lookup_window, corpus=opts.corpus, mtp=opts.mtp)
    engine = BatchEngine(lm, context=opts.context, prefill_batch=opts.prefill_batch, parallel=sopts.parallel,
                         max_queue=sopts.max_queue, cache_bytes=sopts.cache_mem_mib * 2**20, draft=draft,
                         metrics=Metrics())
    return Server(engine, name, Defaults(opts.sampling, opts.strategy, opts.max_draft)), engine


def serve(model: str | None, opts: DecodeOptions, sopts: ServeOptions, threads: int | None = None,
          log=lambda s: print(s, file=sys.stderr, flush=True)) -> None:
    try:
        import uvicorn
    except ImportError:
        raise GuildError("guild serve needs uvicorn and starlette: pip install 'guild'") from None
    from ..load import load_for
    from ..warmup import kernels_cold

    sock = _bind(sopts.host, sopts.port)
    log(f"guild serve: loading {model or 'the default model'}")
    lm = load_for(model, opts, threads)
    if kernels_cold():  # compiled here, with the helper process (guild.warmup); the warm-up request then reads them
        log("guild serve: compiling kernels for this CPU (first run; cached afterwards)")
        lm.warm_up(opts.strategy, opts.mtp)
    if sopts.chat_template is not None:
        from ..text.chat import use_chat_template

        lm.tokenizer = copy.copy(lm.tokenizer)
        use_chat_template(lm.tokenizer, sopts.chat_template)
    name = model or Path(lm.path).stem
    server, engine = build(lm, opts, sopts, name)
    host, port = sock.getsockname()[:2]
    log("guild serve: warming up (one chat request to itself)")
    config = uvicorn.Config(server.app(), log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=sopts.drain_s)
    http = uvicorn.Server(config)
    # The engine runs on this (the main) thread, where the model was loaded and the kernels warmed up: Numba's
    # OpenMP layer runs parallel regions from another thread with a second thread team, 2.5x slower here.
    # HTTP runs on its own thread; SIGTERM/SIGINT ask it to stop accepting and drain (twice: stop now).
    def stop(signum, frame):
        if http.should_exit:
            http.force_exit = True
        http.should_exit = True

    def serve_http():
        try:
            http.run(sockets=[sock])
        finally:
            engine.close(wait=False)  # the engine finishes what is in flight, then returns

    def ready():
        failed = warm_up(server, (host, port))
        if failed:
            log(f"guild serve: the warm-up request failed ({failed}); a first request may wait for kernels")
        server.ready = True
        log(f"guild serve: {name} on http://{host}:{port}/v1 ({lm.threads} threads, device {lm.device}, "
            f"--parallel {sopts.parallel}, --context {opts.context}); Ctrl-C or SIGTERM drains and stops")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    t = threading.Thread(target=serve_http, name="guild-http", daemon=True)
    t.start()
    threading.Thread(target=ready, name="guild-warm-up", daemon=True).start()
    engine.run()
    t.join(sopts.drain_s)
    log("guild serve: stopped")


def warm_up(server, address: tuple[str, int]) -> str | None:
    """One streamed chat request to this server over its socket, before /health says ready (as llama.cpp warms
    up at load): what a first request would load on first use loads here — the kernels at a chat prompt's row
    count, the chat template's compilation, the tokenizer, the HTTP stack's lazily imported modules. Its session
    stays pooled, so the chat template's opening (a default system prompt) is cached for the first client. A
    template that refuses the message gets a plain completion instead. Its counts leave /metrics. Returns None,
    or why it failed."""
    host, port = address
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # a wildcard address is reached on loopback
    failed = None
    for path, field, value in (("/v1/chat/completions", "messages", [{"role": "user", "content": WARM_UP_MESSAGE}]),
                               ("/v1/completions", "prompt", WARM_UP_MESSAGE)):
        status, failed = _post_stream(host, port, path, {field: value, "max_tokens": WARM_UP_TOKENS, "stream": True})
        m = server.engine.metrics
        for _ in range(1000):  # the request is counted just after its last byte is sent
            if m.get("guild_requests_total", endpoint=path, status=str(status)):
                break
            time.sleep(0.001)
        m.clear()
        if failed is None:
            return None
    return failed


def _post_stream(host: str, port: int, path: str, body: dict) -> tuple[int, str | None]:
    """POST a streamed request; (HTTP status, None or why it failed)."""
    conn = http.client.HTTPConnection(host, port, timeout=3600)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        text = r.read().decode(errors="replace").strip()
    except OSError as e:
        return 0, str(e)
    finally:
        conn.close()
    if r.status != 200 or not text.endswith("data: [DONE]") or 'data: {"error"' in text:
        return r.status, f"{path}: HTTP {r.status}: {text.splitlines()[-1][:200] if text else 'no body'}"
    return r.status, None


def _bind(host: str, port: int) -> socket.socket:
    """Bind only `host` (never all interfaces unless asked), before loading, so a taken port fails fast."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise BadFlagError(f"--host {host}: {e.strerror or e}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise BadFlagError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
