"""The first run's kernel compile, shared with a helper process.

Numba compiles each kernel on its first call, one at a time (a cold start is ~60 s of compiling on 2 cores), and
caches it on disk. The kernels of a decode step (one row) and those of a prompt window (many rows: other
attention passes, the row-parallel ops) are largely different, so while the loading process warms the first,
a helper process (`guild warmup MODEL --part window`, the same model mapped from the repack cache) compiles the
second into the shared cache; the loader then runs its usual warm-up, which reads the helper's kernels instead of
compiling them. Saves are locked across processes (guild.kernels.cpu.cache_lock)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HELPER_ENV = "GUILD_COMPILE_HELPER"  # 0: no helper process (the loader compiles everything itself)
HELPER_TIMEOUT_S = 900.0  # a helper still compiling then is stopped; the loader compiles what it did not
COMPILE_ESTIMATE_S = 40 * 2 / max(1, min(os.cpu_count() or 1, 8))  # ~40 s measured on 2 busy cores; fewer with more


def kernels_cold() -> bool:
    """Whether the Numba kernels will compile on first use here (no cache index for them, or one older than their
    source): a heuristic for the start-up message and the helper, never for what is computed."""
    import numba

    src = Path(__file__).resolve().parents[1] / "kernels" / "cpu"
    if not src.is_dir():
        import guild.kernels

        src = Path(guild.kernels.__file__).parent / "cpu"
    for source in (src / "ops" / "gqa.py", src / "quant_gen.py"):  # the attention and the quantised matmuls
        try:
            source_time = source.stat().st_mtime
        except OSError:
            return False
        # NUMBA_CACHE_DIR replaces the __pycache__ folder beside the source
        root, pattern = (Path(numba.config.CACHE_DIR), f"**/{source.stem}.*.nbi") if numba.config.CACHE_DIR else \
            (source.parent / "__pycache__", f"{source.stem}.*.nbi")
        if not any(p.stat().st_mtime >= source_time for p in root.glob(pattern)):
            return True
    return False


def helper_wanted(device: str, weights: str) -> bool:
    """A helper pays when the kernels are cold, a second core is free to compile on, the CPU runs the model
    (`device`) and the helper can map the weights from the repack cache (`weights`: load_cached's "cache" or
    "built"; "memory" would make it repack its own copy, "streamed" read a model larger than memory again)."""
    return (os.environ.get(HELPER_ENV, "1") != "0" and (os.cpu_count() or 1) >= 2 and device == "cpu"
            and weights in ("cache", "built") and kernels_cold())


class CompileHelper:
    """`guild warmup PATH --part window` in a child process, with the loader's numerics, KV types and threads.
    Its output goes nowhere: a helper that fails only leaves more for the loader to compile."""

    def __init__(self, path: str, numerics: str, kv_k: str, kv_v: str, threads: int):
        cmd = [sys.executable, "-m", "guild", "warmup", path, "--part", "window", "--numerics", numerics,
               "--cache-type-k", kv_k, "--cache-type-v", kv_v, "--threads", str(threads)]
        # the same environment (Numba's settings and guild's switches decide what is compiled); mapped weights
        env = {**os.environ, "GUILD_MMAP": "1", HELPER_ENV: "0"}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=env)

    @classmethod
    def start(cls, *args) -> CompileHelper | None:
        """A running helper, or None where no process could be started (the loader then compiles alone)."""
        try:
            return cls(*args)
        except OSError:
            return None

    def wait(self) -> int | None:
        """The helper's exit status once it is done (None: stopped after HELPER_TIMEOUT_S)."""
        try:
            return self.proc.wait(timeout=HELPER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.close()
            return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
