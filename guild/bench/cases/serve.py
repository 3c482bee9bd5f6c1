"""`guild serve` under concurrent streaming clients, normal and adaptive, beside llama.cpp's llama-server.

Per workload (W2, input-grounded summarisation; W7, free prose: each one's first turn) and client count, every client
streams one greedy reply of --tokens at once: aggregate tok/s (all clients' tokens over the wall time), the median
request's decode tok/s after its first token, time to first token at the median and the slowest client. Runners:
one `guild serve` (--parallel the most clients) asked for each strategy in turn, and with --llama-server PATH
(`make llama-server` builds it) llama.cpp's server on the same GGUF, threads and requests (continuous batching,
one slot per client, each with guild's 4096-token context); without it, guild alone. Servers listen on
127.0.0.1 and stop when the bench ends; their logs go to --out, else a temporary folder.

    python -m guild.bench serve [--model TAG] [--clients 1,2,4,8] [-n 64] [-t THREADS] [--llama-server PATH]
"""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
from pathlib import Path

from ...errors import BadFlagError, GuildError
from ...upcycle import resolve_model
from ...workloads import WorkloadError, load_workloads
from .. import server as S
from ..harness import Run, Runner

ROUNDS = 1
BASELINE = "llama-server"
STRATEGIES = ("normal", "adaptive")
CONTEXT = 4096  # guild serve's default context: llama-server gets as much per slot


def add_args(ap) -> None:
    ap.add_argument("--model", default="smollm2-135m-moe", help="a GGUF path or tag (default: %(default)s)")
    ap.add_argument("--clients", default="1,2,4,8", help="concurrent clients per point (default: %(default)s)")
    ap.add_argument("--workloads", default="W2,W7", help="workloads whose first turn each client sends")
    ap.add_argument("-n", "--tokens", type=int, default=64, help="greedy tokens per reply (default: %(default)s)")
    ap.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary (`make llama-server`)")


def check(a) -> None:
    if a.llama_server is not None and not os.access(a.llama_server, os.X_OK):
        raise BadFlagError(f"--llama-server {a.llama_server}: not an executable file (make llama-server builds it)")
    try:
        a.client_list = [int(c) for c in a.clients.split(",")]
    except ValueError:
        raise BadFlagError(f"--clients must be comma-separated counts, got '{a.clients}'") from None
    if min(a.client_list) < 1 or a.tokens < 2:
        raise BadFlagError("--clients must be >= 1 each and --tokens >= 2")
    try:
        a.prompts = {w.id: w.render_turns()[:1] for w in load_workloads(a.workloads.split(","))}
    except WorkloadError as e:
        raise BadFlagError(f"--workloads: {e}") from None
    a.path = str(resolve_model(a.model, progress=False))
    a.servers, a.logs = {}, a.out or tempfile.TemporaryDirectory(prefix="guild-bench-serve-")  # removed at exit


def points(a) -> list[dict]:
    return [{"workload": w, "clients": c} for w in a.prompts for c in a.client_list]


def _command(a, name: str, port: int) -> list[str]:
    if name == "guild":
        return [sys.executable, "-m", "guild", "serve", a.path, "--port", str(port), "-t", str(a.threads),
                "--parallel", str(max(a.client_list)), "--device", "cpu"]
    return [str(a.llama_server), "-m", a.path, "--host", "127.0.0.1", "--port", str(port), "-t", str(a.threads),
            "-np", str(max(a.client_list)), "-c", str(CONTEXT * max(a.client_list)), "--no-webui"]


def _port(a, name: str) -> int:
    """The port of server `name`, started on first use and stopped when this process ends."""
    if name not in a.servers:
        logs = Path(a.logs if a.out else a.logs.name)
        logs.mkdir(parents=True, exist_ok=True)
        port = S.free_port()
        s = S.Server(_command(a, name, port), "/health", port, logs / f"serve.{name}.log")
        try:
            a.servers[name] = s.start()
        except RuntimeError as e:  # the reason is the log's last line
            raise GuildError(f"{name} server: {str(e).strip().splitlines()[-1]}") from None
        atexit.register(s.stop)
    return a.servers[name].port


def _runner(a, name: str, server: str, extra: dict) -> Runner:
    def measure(pt):
        try:
            r = S.concurrent_chats(_port(a, server), a.prompts[pt["workload"]], pt["clients"], a.tokens, extra)
        except RuntimeError as e:
            raise GuildError(f"{name}: {e}") from None
        figs = {"aggregate_tok_s": r["aggregate_tok_s"], "ttft_ms": r["ttft_ms_p50"], "ttft_max_ms": r["ttft_ms_max"]}
        if r["per_request_tok_s"] is not None:
            figs["decode_tok_s"] = r["per_request_tok_s"]
        return Run(figs, extra={"tokens": r["tokens"]})

    return Runner(name, measure)


def runners(a) -> list[Runner]:
    out = [_runner(a, f"guild {s}", "guild", {"decode_strategy": s}) for s in STRATEGIES]
    return out + ([_runner(a, "llama-server", "llama", {})] if a.llama_server else [])


def notes(records, a) -> list[str]:
    return [] if a.llama_server else ["\nllama-server: not run (no --llama-server; `make llama-server` builds it)"]
