"""`make bench-serve`: `guild serve` under 1, 2, 4 and 8 concurrent streaming clients, `normal` and `adaptive`, on
W2- and W7-style prompts (input-grounded summarisation, free prose): aggregate and per-request decode tok/s and
time to first token, beside llama.cpp's server (`python -m llama_cpp.server`) on the same GGUF and thread count
when llama-cpp-python[server] is importable, in one run (that server decodes one request at a time, so its rows
above one client are no batching server's). Writes results/bench_serve.{md,json} and each server's log beside
them.

    python -m guild.tools.bench_serve [--model TAG] [--clients 1,2,4,8] [-n 64] [-t THREADS]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from ..upcycle import resolve_model
from ..workloads import load_workloads


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


def measure(port: int, prompts: list[str], clients: int, max_tokens: int, extra: dict) -> dict:
    res: list[dict] = [{}] * clients

    def one(i):
        res[i] = stream_chat(port, prompts[i % len(prompts)], max_tokens, extra)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    per = [(r["tokens"] - 1) / (r["total_s"] - r["ttft_s"]) for r in res
           if r["tokens"] > 1 and r["total_s"] > r["ttft_s"]]
    return {"clients": clients, "aggregate_tok_s": round(sum(r["tokens"] for r in res) / wall, 2),
            "per_request_tok_s": round(statistics.median(per), 2) if per else None,
            "ttft_ms_p50": round(statistics.median(r["ttft_s"] for r in res) * 1e3, 1),
            "ttft_ms_max": round(max(r["ttft_s"] for r in res) * 1e3, 1), "tokens": sum(r["tokens"] for r in res)}


def prompts_of(wid: str) -> list[str]:
    w = load_workloads([wid])[0]
    return w.render_turns()[:1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-moe")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default="results")
    a = ap.parse_args(argv)
    clients = [int(c) for c in a.clients.split(",")]
    path = resolve_model(a.model)
    work = {"W2": prompts_of("W2"), "W7": prompts_of("W7")}
    rows = []

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # a server's log goes to a file: a pipe nobody reads fills up and blocks the server
    log = out / "bench_serve.guild.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "guild", "serve", str(path), "--port", str(port), "-t",
                                 str(a.threads), "--parallel", str(max(clients)), "--device", "cpu"],
                                stdout=f, stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(port, proc, "/health", log=log)
        for wid, ps in work.items():
            for c in clients:
                for strategy in ("normal", "adaptive"):  # interleaved, one process
                    r = measure(port, ps, c, a.max_tokens, {"decode_strategy": strategy})
                    rows.append({"server": "guild", "workload": wid, "strategy": strategy, **r})
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        proc.terminate()
        proc.wait(120)
    try:
        import llama_cpp.server  # noqa: F401
        have_llama = True
    except ImportError:
        have_llama = False
        print("llama-cpp-python[server] is not installed: no llama.cpp rows", file=sys.stderr)
    if have_llama:
        port = free_port()
        log = out / "bench_serve.llama.log"
        with open(log, "w") as f:
            proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--n_threads",
                                     str(a.threads), "--n_ctx", "4096", "--port", str(port)],
                                    stdout=f, stderr=subprocess.STDOUT, text=True)
        try:
            wait_ready(port, proc, "/v1/models", log=log)
            for wid, ps in work.items():
                for c in clients:
                    r = measure(port, ps, c, a.max_tokens, {})
                    rows.append({"server": "llama.cpp", "workload": wid, "strategy": "-", **r})
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            proc.terminate()
            proc.wait(120)
    (out / "bench_serve.json").write_text(json.dumps({"model": str(path), "threads": a.threads, "rows": rows},
                                                     indent=1))
    md = ["| server | workload | strategy | clients | aggregate tok/s | per-request tok/s | TTFT p50 ms | "
          "TTFT max ms |", "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['server']} | {r['workload']} | {r['strategy']} | {r['clients']} | {r['aggregate_tok_s']} | "
           f"{r['per_request_tok_s']} | {r['ttft_ms_p50']} | {r['ttft_ms_max']} |" for r in rows]
    (out / "bench_serve.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except RuntimeError as e:  # a server that did not start: one line, no traceback
        raise SystemExit(f"error: {e}") from None
