"""`guild optimize`: calibrate this machine for a model into a sealed .gexec plan (guild.calib.optimize)."""

from __future__ import annotations

from pathlib import Path

import typer

from ...errors import GuildError, PlanError
from ...kvtypes import KVTypes
from ..options import DEVICE_HELP, MODEL, flag, set_process_flags
from ..output import err, fail, writable


def command(
    model: str | None = MODEL,
    out: Path = typer.Option(..., "-o", "--out", help="The plan to write (.gexec, YAML, sealed)."),
    mode: str = typer.Option("auto", "--mode", help="auto (full calibration) or quick (fewer repeats)."),
    # --context and --prefill-batch without run's short aliases
    context: int = typer.Option(4096, "--context", help="Context length the costs are measured at."),
    cache_type_k: str = flag("cache_type_k"),
    cache_type_v: str = flag("cache_type_v"),
    prefill_batch: int = typer.Option(512, "--prefill-batch", help="Prompt rows per prefill forward."),
    spec: int = typer.Option(0, "--spec", help="MTP draft depth to calibrate (0: none; needs an MTP head). The head's "
                      "step and catch-up costs are measured whenever the model has one."),
    device: str = flag("device", help=DEVICE_HELP + " Costs are measured on it."),
    numerics: str = flag("numerics"),
):
    """Calibrate this machine for a model (probe, placement, CPU kernels, speculative costs) → a .gexec plan."""
    from ...calib.optimize import optimize as run_optimize  # deferred: numba
    from ...load import load

    try:
        writable(out, "-o/--out", PlanError)
        set_process_flags(numerics)
        kv = KVTypes(cache_type_k, cache_type_v)
        with err.status("loading the model …", spinner="dots"):
            lm = load(model, kv=kv)
        plan = run_optimize(lm, out, mode=mode, context=context, prefill_batch=prefill_batch, spec=spec,
                            device=device)
    except GuildError as e:
        fail(e)
    print(plan.path)
