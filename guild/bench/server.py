"""An HTTP server under test, from the outside: a free loopback port, the process started with its log in a file and
polled until ready, streaming chat requests from concurrent clients timed to the first token and to the last."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen, path: str, timeout: float = 900,
               log: Path | None = None) -> None:
    """Poll http://127.0.0.1:PORT/PATH until it answers; RuntimeError if the server exits or the time runs out.
    Its stderr is read from `log` (the file it writes to) when given, else from its pipe."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            err = log.read_text(errors="replace") if log is not None else proc.stderr.read()
            raise RuntimeError(f"server exited ({proc.returncode}): {err[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not start")


class Server:
    """A server process: its log to a file (a pipe nobody reads fills up and blocks it), ready once `ready`
    answers on `port`."""

    def __init__(self, cmd: list[str], ready: str, port: int, log: Path):
        self.cmd, self.ready, self.port, self.log = cmd, ready, port, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT, text=True)
        try:
            wait_ready(self.port, self.proc, self.ready, log=self.log)
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(120)


def run_server(name: str, cmd: list[str], ready: str, out: Path, port: int, body: Callable[[], None]) -> None:
    """Start a server (its log at OUT/serve.NAME.log), wait for `ready`, run body, stop it."""
    s = Server(cmd, ready, port, out / f"serve.{name}.log").start()
    try:
        body()
    finally:
        s.stop()


def stream_chat(port: int, prompt: str, max_tokens: int, extra: dict) -> dict:
    """One streaming chat request; returns ttft_s, total_s and completion tokens (from the usage chunk)."""
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **extra}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.perf_counter()
    first, pieces, tokens = None, 0, None
    with urllib.request.urlopen(req, timeout=1800) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
            for c in obj.get("choices", []):
                if (c.get("delta") or {}).get("content"):
                    first = first or time.perf_counter() - t0
                    pieces += 1
    total = time.perf_counter() - t0
    return {"ttft_s": first or total, "total_s": total, "tokens": tokens if tokens is not None else pieces}


def concurrent_chats(port: int, prompts: list[str], clients: int, max_tokens: int, extra: dict) -> dict:
    """`clients` streaming requests at once (prompts taken in turn): all their tokens over the wall time, the
    median request's decode tok/s (after its first token), time to first token at the median and the slowest."""
    res: list = [None] * clients

    def one(i):
        try:
            res[i] = stream_chat(port, prompts[i % len(prompts)], max_tokens, extra)
        except OSError as e:  # refused, reset, timed out: reported after the others finish
            res[i] = e

    t0 = time.perf_counter()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    failed = next((r for r in res if isinstance(r, Exception)), None)
    if failed is not None:
        raise RuntimeError(f"a request to port {port} failed: {failed}")
    per = [(r["tokens"] - 1) / (r["total_s"] - r["ttft_s"]) for r in res
           if r["tokens"] > 1 and r["total_s"] > r["ttft_s"]]
    return {"aggregate_tok_s": sum(r["tokens"] for r in res) / wall,
            "per_request_tok_s": statistics.median(per) if per else None,
            "ttft_ms_p50": statistics.median(r["ttft_s"] for r in res) * 1e3,
            "ttft_ms_max": max(r["ttft_s"] for r in res) * 1e3, "tokens": sum(r["tokens"] for r in res)}
