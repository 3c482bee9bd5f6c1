"""Where a figure was measured: the machine (CPU model, ISA level, cores, threads, memory), the source (git commit,
dirty or not), library versions, the command and the date. Every benchmark record carries these."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

from .. import __version__

ROOT = Path(__file__).resolve().parents[2]
# ISA levels from the most capable down: the first whose flags the CPU has all of names the host
ISA_LEVELS = (
    ("amx-int8", ("amx_int8", "amx_tile", "avx512_vnni")),
    ("avx512-vnni", ("avx512f", "avx512bw", "avx512_vnni")),
    ("avx512", ("avx512f", "avx512bw")),
    ("avx-vnni", ("avx2", "avx_vnni")),
    ("avx2", ("avx2", "fma")),
    ("sse4", ("sse4_2",)),
)
LIBRARIES = ("numpy", "numba", "llvmlite", "llama_cpp_python", "cupy-cuda12x", "torch")


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                model = val.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(val.split())
    except OSError:
        pass
    return model, flags


def isa_level(flags: set[str]) -> str:
    return next((name for name, need in ISA_LEVELS if set(need) <= flags), "baseline")


@cache
def commit() -> str:
    """The source tree's commit, `+dirty` when tracked files differ from it; `unknown` outside a checkout."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode:
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    out = {"guild": __version__, "python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def host(threads: int) -> dict:
    """The machine a record was measured on, with the threads the benchmark used."""
    model, flags = _cpuinfo()
    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        mem_gb = None
    return {"cpu": model, "isa": isa_level(flags), "cores": os.cpu_count(), "threads": threads,
            "memory_gb": mem_gb, "os": platform.system().lower()}


def _program(argv0: str) -> str:
    """How the command was started: `python -m PACKAGE` (guild or guild.bench) or the script's name."""
    parts = Path(argv0).parent.parts
    if argv0.endswith("__main__.py") and "guild" in parts:
        return "python -m " + ".".join(parts[len(parts) - 1 - parts[::-1].index("guild"):])
    return "python -m guild.bench" if argv0 in ("-c", "-m") else Path(argv0).name


def provenance(threads: int, command: str | None = None) -> dict:
    """What every record carries besides its figures; `command` reproduces it (default: this process's)."""
    command = command or " ".join([_program(sys.argv[0]), *map(shlex.quote, sys.argv[1:])])
    return {"commit": commit(), "host": host(threads), "versions": versions(), "command": command,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load": [round(x, 2) for x in os.getloadavg()]}
