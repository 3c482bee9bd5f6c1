"""`make bench-serve`: `guild serve` under 1, 2, 4 and 8 concurrent streaming clients, `normal` and `adaptive`, on
W2- and W7-style prompts (input-grounded summarisation, free prose), beside llama.cpp's own `llama-server`
(continuous batching, one slot per client; built by `make llama-server`) driven with the same requests on the
same GGUF and thread count: aggregate and per-request decode tok/s and time to first token, side by side. Writes
results/bench_serve.{md,json} and each server's log beside them; `--json` prints the report instead of the
table.

    python -m guild.tools.bench_serve [--model TAG] [--clients 1,2,4,8] [-n 64] [-t THREADS]
                                      [--llama-server PATH] [--json]
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
from collections.abc import Callable
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


COLUMNS = (("guild", "normal"), ("guild", "adaptive"), ("llama-server", "-"))  # the side-by-side columns


def run_server(name: str, cmd: list[str], ready: str, out: Path, port: int, body: Callable[[], None]) -> None:
    """Start a server (its log to a file: a pipe nobody reads fills up and blocks it), wait for `ready`, run
    body, stop it."""
    log = out / f"bench_serve.{name}.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(port, proc, ready, log=log)
        body()
    finally:
        proc.terminate()
        proc.wait(120)


def side_by_side(rows: list[dict]) -> str:
    """One line per workload and client count: aggregate tok/s, then TTFT p50, of each server and strategy."""
    cell = {(r["server"], r["strategy"], r["workload"], r["clients"]): r for r in rows}
    cols = [c for c in COLUMNS if any((c[0], c[1]) == (r["server"], r["strategy"]) for r in rows)]
    names = [s if t == "-" else f"{s} {t}" for s, t in cols]
    md = ["| workload | clients | " + " | ".join(f"tok/s {n}" for n in names) + " | "
          + " | ".join(f"TTFT p50 ms {n}" for n in names) + " |", "|---" * (2 + 2 * len(cols)) + "|"]
    for wid, c in dict.fromkeys((r["workload"], r["clients"]) for r in rows):
        got = [cell.get((s, t, wid, c)) for s, t in cols]
        md.append(f"| {wid} | {c} | " + " | ".join("-" if g is None else str(g["aggregate_tok_s"]) for g in got)
                  + " | " + " | ".join("-" if g is None else str(g["ttft_ms_p50"]) for g in got) + " |")
    return "\n".join(md) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-moe")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary (`make llama-server`)")
    ap.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    ap.add_argument("--out", default="results")
    a = ap.parse_args(argv)
    clients = [int(c) for c in a.clients.split(",")]
    if a.llama_server is not None and not os.access(a.llama_server, os.X_OK):
        raise RuntimeError(f"--llama-server {a.llama_server}: not an executable file (make llama-server builds it)")
    path = resolve_model(a.model)
    work = {"W2": prompts_of("W2"), "W7": prompts_of("W7")}
    rows: list[dict] = []
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def drive(server: str, port: int, strategies: tuple[str, ...]) -> Callable[[], None]:
        def body():
            for wid, ps in work.items():
                for c in clients:
                    for strategy in strategies:  # interleaved, one process
                        extra = {} if strategy == "-" else {"decode_strategy": strategy}
                        r = measure(port, ps, c, a.max_tokens, extra)
                        rows.append({"server": server, "workload": wid, "strategy": strategy, **r})
                        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        return body

    port = free_port()
    run_server("guild", [sys.executable, "-m", "guild", "serve", str(path), "--port", str(port), "-t",
                         str(a.threads), "--parallel", str(max(clients)), "--device", "cpu"],
               "/health", out, port, drive("guild", port, ("normal", "adaptive")))
    if a.llama_server is None:
        print("no --llama-server: guild's rows only (make bench-serve builds llama.cpp's server and passes it)",
              file=sys.stderr)
    else:
        port = free_port()
        # one slot per client, each with guild's 4096-token context
        run_server("llama", [str(a.llama_server), "-m", str(path), "--host", "127.0.0.1", "--port", str(port),
                             "-t", str(a.threads), "-np", str(max(clients)), "-c", str(4096 * max(clients)),
                             "--no-webui"],
                   "/health", out, port, drive("llama-server", port, ("-",)))
    report = {"model": str(path), "threads": a.threads, "max_tokens": a.max_tokens,
              "llama_server": None if a.llama_server is None else str(a.llama_server), "rows": rows}
    (out / "bench_serve.json").write_text(json.dumps(report, indent=1))
    md = side_by_side(rows)
    (out / "bench_serve.md").write_text(md)
    print(json.dumps(report, indent=1) if a.json else md)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except RuntimeError as e:  # a server that did not start, a missing binary: one line, no traceback
        raise SystemExit(f"error: {e}") from None
