"""Time to first token from a cold process: fresh `guild run --chat -n 1 --json` processes (the ttft they print)
and a fresh `guild serve` streaming to one client (its first request, then later ones about other subjects of
the same length, whose chat template's first tokens come from the server's prefix reuse), beside llama.cpp's
warm prefill of the same ids in this process.

    python -m guild.bench fresh --models smollm2-135m-moe --rounds 3
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ...errors import GuildError
from .. import runners as R
from ..harness import Run, Runner
from ..server import free_port, run_server, stream_chat
from .models import CHAT_PROMPT, add_model_args, chat_ids, model_paths

BASELINE = "llama.cpp warm"
SUBJECTS = ("sea", "lake", "ice", "snow", "glass", "smoke")  # later requests: "sky" swapped, the same length


def add_args(ap) -> None:
    add_model_args(ap, default="smollm2-135m-moe")
    ap.add_argument("--no-llama", action="store_true", help="no llama-cpp-python runner")


def check(a) -> None:
    a.paths = model_paths(a)


def points(a) -> list[dict]:
    return [{"model": name} for name in a.paths]


def _run(a) -> Runner:
    def measure(pt):
        cmd = [sys.executable, "-m", "guild", "run", a.paths[pt["model"]], "--chat", "-p", CHAT_PROMPT, "-n", "1",
               "--json", "--threads", str(a.threads), "--temp", "0"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if p.returncode:
            raise GuildError(f"guild run failed: {(p.stderr.strip().splitlines() or [f'exit {p.returncode}'])[-1]}")
        return Run({"ttft_ms": json.loads(p.stdout.strip().splitlines()[-1])["ttft_ms"]})

    return Runner("guild run", measure)


def _serve(a) -> Runner:
    def measure(pt):
        port, got = free_port(), []
        asks = [CHAT_PROMPT] + [CHAT_PROMPT.replace("sky", w) for w in SUBJECTS]
        cmd = [sys.executable, "-m", "guild", "serve", a.paths[pt["model"]], "--port", str(port), "-t", str(a.threads)]
        with tempfile.TemporaryDirectory() as logs:
            try:
                run_server("guild", cmd, "/health", Path(logs), port,
                           lambda: got.extend(stream_chat(port, p, 4, {})["ttft_s"] * 1e3 for p in asks))
            except RuntimeError as e:  # the server did not start
                raise GuildError(f"guild serve: {str(e).splitlines()[0]}") from None
        return Run({"ttft_ms": got[0], "ttft_later_ms": statistics.median(got[1:])})

    return Runner("guild serve", measure)


def _llama(a) -> Runner:
    def measure(pt):
        p = a.paths[pt["model"]]
        ids = chat_ids(p, a.threads)
        llm = R.open_llama_cpp(p, n_ctx=len(ids) + 16, n_threads=a.threads, n_threads_batch=a.threads)
        R.llama_ttft(llm, ids)  # warm: its first call pays its own set-up
        return Run({"ttft_ms": statistics.median(R.llama_ttft(llm, ids) for _ in range(3))})

    return Runner(BASELINE, measure)


def runners(a) -> list[Runner]:
    return [_run(a), _serve(a)] + ([_llama(a)] if R.llama_cpp_wanted(a) else [])
