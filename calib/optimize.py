"""`guild optimize`: the four calibration passes (probe, placement, CPU kernels, speculative costs) → a sealed
`.gexec` plan, and the plan handling of `run`/`bench --gexec` (validate, or regenerate a local plan next to a
mismatched one)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numba
from rich.console import Console
from rich.markup import escape

from .. import __version__
from ..engine.device import Device, place_model
from ..engine.placement import placement_for
from ..errors import BadFlagError, PlanMismatchError
from ..models.mtp import find_mtp_head
from ..plans.plan import MODES, Header, ModelIdentity, Plan, load_plan, read_plan, write_plan
from ..speculative.registry import DRAFTERS
from .cpu import tune_cpu
from .draft_costs import calibrate_draft_costs
from .probe import hardware_identity, memory_bandwidth_gbs

err = Console(stderr=True, highlight=False)


@dataclass(frozen=True)
class Knobs:
    """How hard each pass measures; `--mode auto` is the default, `quick` is for tests and CI."""

    repeats: int = 9  # windows timed per T (pass 4)
    fill_cap: int = 1024  # real tokens prefilled before the KV rows are extended by copies (pass 4)
    draft_steps: int = 400  # propose calls timed per drafter (pass 4)
    cpu_repeats: int = 5  # passes over the timed matrices per thread count (pass 3)
    per_type: int = 6  # matrices timed per quant type (pass 3)
    bandwidth_mib: int = 128  # array size of the bandwidth probe (pass 1)

    @classmethod
    def for_mode(cls, mode: str, **overrides) -> Knobs:
        if mode not in MODES:
            raise BadFlagError(f"--mode must be one of {', '.join(MODES)}, got '{mode}'")
        base = cls() if mode == "auto" else cls(repeats=3, fill_cap=128, draft_steps=40, cpu_repeats=2, per_type=2,
                                                bandwidth_mib=16)
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})

    def __post_init__(self):
        for k in ("repeats", "fill_cap", "draft_steps", "cpu_repeats", "per_type", "bandwidth_mib"):
            if getattr(self, k) < 1:
                raise BadFlagError(f"optimize: {k} must be >= 1, got {getattr(self, k)}")


def size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _mtp_note(head) -> str:
    if head is None:
        return "model has no MTP head"
    i = head.info
    acc = f", held-out first-draft acceptance {i.heldout_acceptance:.1%}" if i.heldout_acceptance is not None else ""
    return f"MTP head: {i.kind} {Path(i.source).name} ({i.ffn} block{acc})"


def _probe_summary(r) -> str:
    hw, bw = r
    isa = " ".join(x for x in hw.isa if x in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile"))
    return (f"{hw.cpu_model} · {isa} · {hw.physical_cores} cores / {hw.logical_cpus} threads · "
            f"{hw.numa_nodes} NUMA node(s) · {bw:.1f} GB/s · GPU {hw.gpu.describe() if hw.gpu else 'none'}")


class _Passes:
    """One progress line per pass: a spinner while it runs, then its summary and duration (kept on screen)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.seconds: dict[str, float] = {}

    def run(self, i: int, name: str, fn, summary):
        label = f"pass {i}/4 {name}" if i else name
        t0 = time.perf_counter()
        if self.enabled:
            with err.status(f"{label} …", spinner="dots"):
                out = fn()
        else:
            out = fn()
        self.seconds[name] = dt = time.perf_counter() - t0
        if self.enabled:
            err.print(f"[green]✓[/] {label} [dim]({dt:.1f} s)[/]: {escape(summary(out))}", soft_wrap=True)
        return out


def optimize(lm, out: str | Path | None, *, mode: str = "auto", context: int = 4096, prefill_batch: int = 512,
             spec: int = 0, device: str | None = None, progress: bool = True, **knobs) -> Plan:
    """Calibrate the loaded model `lm` (guild.load.LoadedModel, on the CPU; its KV cache types `lm.kv`) on this
    machine and write the sealed plan to `out` (atomically; None = do not write). With `device`, pass 4 measures the
    model placed there as
    pass 2 places it (what `run --gexec` will use); the plan records the device that measured it, and why the CPU
    did where `auto` fell back (said on stderr too when this machine has a GPU). `knobs` override the mode's
    Knobs."""
    k = Knobs.for_mode(mode, **knobs)
    if context < 16:
        raise BadFlagError(f"--context must be >= 16, got {context}")
    if prefill_batch < 1:
        raise BadFlagError(f"--prefill-batch must be >= 1, got {prefill_batch}")
    if not 0 <= spec <= 7:
        raise BadFlagError(f"--spec must be in 0..7, got {spec}")
    threads_before = numba.get_num_threads()
    p = _Passes(progress)
    g = lm.gguf
    head = find_mtp_head(lm.model)
    if spec and head is None:
        raise BadFlagError(f"--spec {spec}: MTP calibration needs an MTP head; this model has none "
                           "(guild train-mtp makes one)")

    def probe():
        return hardware_identity(), memory_bandwidth_gbs(k.bandwidth_mib)

    hw, bw = p.run(1, "probe", probe, _probe_summary)
    placement = p.run(2, "placement", lambda: placement_for(lm.model, hw.gpu, context, lm.kv), lambda pl: (
        f"{size(pl.gpu_bytes)} on the GPU, {size(pl.cpu_bytes)} on the CPU · {pl.note}"))
    cpu = p.run(3, "CPU kernels", lambda: tune_cpu(lm.model, repeats=k.cpu_repeats, per_type=k.per_type,
                                                   bandwidth_gbs=bw), lambda c: (
        f"{c.threads} threads · " + ", ".join(f"{kt.qtype} {kt.gweights_s:.2f} Gw/s ({kt.role})"
                                              for kt in c.kernels)))
    model, dev, why = (place_model(lm.model, device, context, placement, lm.kv) if device
                       else (lm.model, Device("cpu"), ""))
    if why and placement.gpu:  # pass 1 found a GPU, pass 2 placed for it, and `auto` could not use it
        err.print(f"pass 4 measures on the CPU: {why}", style="yellow", markup=False, soft_wrap=True)
    if head is not None and model is not lm.model:
        head = find_mtp_head(model)  # the head placed with the model (on its output's device)
    try:
        numba.set_num_threads(cpu.threads)  # pass 4 runs as `run --gexec` will
        sc = p.run(4, "speculative costs", lambda: calibrate_draft_costs(
            model, lm.tokenizer, context=context, prefill_batch=prefill_batch, repeats=k.repeats, kv=lm.kv,
            fill_cap=k.fill_cap, draft_steps=k.draft_steps, mtp_note=_mtp_note(head), mtp_head=head), lambda s: (
            f"V(1) {s.verify_window_ms[0]:.1f} ms, V(8) {s.verify_window_ms[-1]:.1f} ms at {s.context} tokens"
            + (f" · U(8)/U(1) {s.distinct_expert_ratio[-1]:.2f}" if s.distinct_expert_ratio else "")
            + " · " + ", ".join(f"{n} {ms * 1e3:.0f} µs" for n, ms in s.draft_ms.items() if not DRAFTERS[n].needs_head)
            + "".join(f" · {n.upper()} step {ms:.2f} ms" for n, ms in s.draft_ms.items() if DRAFTERS[n].needs_head)
            + f" · CV {s.noise_cv:.2f} · KV {lm.kv.k}/{lm.kv.v} · on {dev.label}"))
    finally:
        numba.set_num_threads(threads_before)
    sc = replace(sc, device=dev.label, device_note=why)
    header = Header(__version__, datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), mode, context,
                    prefill_batch, spec, lm.kv.k, lm.kv.v)
    plan = Plan(header, hw, ModelIdentity.of(g), placement, cpu, sc)
    if out is not None:
        path = write_plan(plan, out)
        plan = replace(plan, path=str(path))
    return plan


def local_plan_path(path: str | Path) -> Path:
    """Where `run` regenerates a plan that does not match this machine or model: next to it."""
    p = Path(path)
    return p.with_name(f"{p.stem}.local{p.suffix or '.gexec'}")


def plan_for(path: str | Path, lm, *, strict: bool = False, progress: bool = True) -> Plan:
    """The plan `run`/`bench --gexec` use for the loaded model `lm`. Seal errors always raise (a changed file is
    not a plan for another machine: re-run optimize or delete it). On an identity mismatch: raise with
    `strict`; else say why, reuse a valid local plan next to it or regenerate one, and go on."""
    mine = ModelIdentity.of(lm.gguf)
    try:
        return load_plan(path, model=mine, kv=lm.kv)
    except PlanMismatchError as e:
        if strict:
            raise
        err.print(str(e), style="yellow", markup=False, soft_wrap=True)
    local = local_plan_path(path)
    if local.is_file():
        try:
            plan = load_plan(local, model=mine, kv=lm.kv)
            err.print(f"using the local plan {local}", style="dim", markup=False)
            return plan
        except PlanMismatchError as e:
            err.print(str(e), style="yellow", markup=False, soft_wrap=True)
    h = read_plan(path).header
    err.print(f"regenerating a plan for this machine and model: {local}", style="dim", markup=False)
    return optimize(lm, local, mode=h.mode, context=h.context, prefill_batch=h.prefill_batch, spec=h.spec,
                    progress=progress)
