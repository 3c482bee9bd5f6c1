"""`guild warmup`: load a model and compile the kernels its first reply needs, ahead of time (guild.warmup); the
hidden `--part window` is the compile helper a cold load starts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from ...engine.options import DecodeOptions
from ...errors import BadFlagError, GuildError
from ...kvtypes import KVTypes
from ..options import MODEL, flag, model_arg, set_process_flags
from ..output import fail, notes

SETTINGS = dict(help=(
    "Compile the kernels a model's first reply needs (Numba, cached per CPU under __pycache__ or NUMBA_CACHE_DIR), "
    "so that the first `guild run` or `guild serve` starts at once; on a cold cache a helper process compiles on a "
    "second core (GUILD_COMPILE_HELPER=0: one process). Also repacks an unseen GGUF into the repack cache. Take "
    "the flags the later runs will use: --numerics and the KV cache types select kernels. CPU kernels only."))
PARTS = ("all", "window")


def command(
    model: str | None = MODEL,
    model_opt: str | None = flag("model_opt"),
    threads: int | None = flag("threads"),
    numerics: str = flag("numerics"),
    cache_type_k: str = flag("cache_type_k"),
    cache_type_v: str = flag("cache_type_v"),
    strategy: str = flag("strategy", help="The decoding strategy whose drafter is warmed too (default adaptive)."),
    part: str = typer.Option("all", "--part", hidden=True, help="window: only a prompt window's kernels (the "
                             "compile helper of a cold load)."),
    as_json: bool = flag("as_json", help="Print the result as one JSON object."),
):
    """Compile a model's kernels ahead of its first run (see the help above)."""
    from ...load import load, load_for
    from ...warmup import kernels_cold

    try:
        if part not in PARTS:
            raise BadFlagError(f"--part must be one of {', '.join(PARTS)}, got '{part}'")
        model = model_arg(model, model_opt)
        set_process_flags(numerics)
        kv = KVTypes(cache_type_k, cache_type_v)
        if part == "window":
            load(model, threads=threads, device="cpu", context=64, progress=False, kv=kv).warm_window()
            return
        opts = DecodeOptions(strategy=strategy, kv=kv, device="cpu")
        cold = kernels_cold()
        notify = notes(False)  # on a terminal
        if notify is not None and not as_json:
            notify(f"loading {model or 'smollm2-135m-moe'} and {'compiling' if cold else 'loading'} its kernels …")
        t0 = time.perf_counter()
        lm = load_for(model, opts, threads)
        lm.warm_up(opts.strategy, opts.mtp)
        seconds = time.perf_counter() - t0
    except GuildError as e:
        fail(e)
    out = {"model": lm.path, "seconds": round(seconds, 2), "compiled": cold, "helper": lm.compile_helper,
           "threads": lm.threads, "numerics": lm.numerics, "kv": {"k": kv.k, "v": kv.v}}
    if as_json:
        print(json.dumps(out))
        return
    how = "compiled" if cold else "already compiled; loaded"
    helper = " (with a helper process)" if lm.compile_helper else ""
    print(f"{Path(lm.path).name}: kernels {how} in {seconds:.1f} s{helper}")
