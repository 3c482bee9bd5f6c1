"""Field-by-field types and ranges of a `.gexec` plan, checked before the plan's dataclasses see the values:
a resealed plan (seal and digests recomputed by hand) can still only carry finite numbers in sane ranges and
strings where strings belong. Bounds are generous: a thousand times past anything calibration measures."""

from __future__ import annotations

import math

from ..speculative.registry import DRAFTERS

MS = ("num", 0.0, 1e6)  # a duration in milliseconds
COUNT = ("int", 0, 2**32)
BYTES = ("int", 0, 2**53)
THREADS = ("int", 1, 2**16)
CTX = ("int", 1, 2**24)
STR = ("str", 0, 4096)
OPT = "optional"


def _opt(x):
    return (OPT, x)


def _per_drafter(value, which=lambda d: True):
    """A mapping keyed by registered drafter names (those `which` accepts), read from the registry when checked."""
    return ("drafters", which, value)


SCHEMA = {
    "header": {"guild_version": STR, "created": STR, "mode": STR, "context": CTX, "prefill_batch": CTX,
               "spec": ("int", 0, 64), "cache_type_k": STR, "cache_type_v": STR, "format": STR,
               "version": ("int", 0, 2**16)},
    "hardware": {"cpu_model": STR, "isa": [STR], "physical_cores": THREADS, "logical_cpus": THREADS,
                 "numa_nodes": ("int", 1, 4096),
                 "gpu": _opt({"name": STR, "compute_capability": STR, "vram_bytes": BYTES})},
    "model": {"sha256": STR, "architecture": STR, "layers": COUNT, "expert_count": COUNT,
              "expert_used_count": COUNT, "file": STR},
    "placement": {"sha256": STR, "gpu": _opt(STR), "vram_budget_bytes": BYTES, "context": CTX, "note": STR,
                  "groups": [{"name": STR, "device": STR, "tensors": COUNT, "bytes": BYTES, "gpu_bytes": BYTES}]},
    "cpu": {"sha256": STR, "threads": THREADS, "memory_bandwidth_gbs": ("num", 0.0, 1e6),
            "kernels": [{"qtype": STR, "kernel": STR, "variants": [STR], "role": STR, "matrices": COUNT,
                         "timed": COUNT, "threads_tried": [THREADS], "ms": [MS], "best_threads": THREADS,
                         "gweights_s": ("num", 0.0, 1e6)}]},
    "drafting": {"sha256": STR, "context": CTX, "filled_tokens": CTX, "repeats": ("int", 1, 2**20),
                 "verify_window_ms": [MS], "verify_cpu_expert_ms": _opt([MS]),
                 "distinct_experts": _opt([("num", 0.0, 2**20)]),
                 "distinct_expert_ratio": _opt([("num", 0.0, 2**20)]), "draft_ms": _per_drafter(MS),
                 "catchup_ms": _per_drafter(MS, lambda d: d.follows_rows),
                 "kv_commit_ms": MS, "noise_cv": ("num", 0.0, 1e3), "prefill_tok_s": ("num", 0.0, 1e9),
                 "mtp_note": STR, "calibrated": ("bool",), "device": STR, "device_note": STR},
}
MAX_LIST = 4096


def check(d: dict, spec=None, where: str = "", partial: bool = False) -> str | None:
    """The first problem as 'field: what is wrong', or None. Unknown keys are problems, and so are missing ones
    (write_plan writes every field, null where optional) but in a `partial` mapping (per drafter: those
    measured)."""
    spec = SCHEMA if spec is None else spec
    if isinstance(spec, tuple) and spec[0] == OPT:
        return None if d is None else check(d, spec[1], where)
    if isinstance(spec, tuple) and spec[0] == "drafters":
        return check(d, {c.name: spec[2] for c in DRAFTERS.values() if spec[1](c)}, where, partial=True)
    if isinstance(spec, dict):
        if not isinstance(d, dict):
            return f"{where}: expected a mapping, got {type(d).__name__}"
        for k, v in d.items():
            if k not in spec:
                return f"{where + '.' if where else ''}{k}: unknown field"
            err = check(v, spec[k], f"{where + '.' if where else ''}{k}")
            if err:
                return err
        for k in spec:
            if k not in d and not partial:
                return f"{where + '.' if where else ''}{k}: missing"
        return None
    if isinstance(spec, list):
        if not isinstance(d, list):
            return f"{where}: expected a list, got {type(d).__name__}"
        if len(d) > MAX_LIST:
            return f"{where}: {len(d)} items (at most {MAX_LIST})"
        for i, v in enumerate(d):
            err = check(v, spec[0], f"{where}[{i}]")
            if err:
                return err
        return None
    kind = spec[0]
    if kind == "bool":
        return None if isinstance(d, bool) else f"{where}: expected true or false, got {str(d)[:40]!r}"
    if kind == "str":
        if not isinstance(d, str):
            return f"{where}: expected a string, got {type(d).__name__}"
        return None if len(d) <= spec[2] else f"{where}: string of {len(d)} characters (at most {spec[2]})"
    if isinstance(d, bool) or not isinstance(d, (int, float)) or (kind == "int" and not isinstance(d, int)):
        return f"{where}: expected {'an integer' if kind == 'int' else 'a number'}, got {str(d)[:40]!r}"
    if isinstance(d, float) and not math.isfinite(d):
        return f"{where}: must be finite, got {d}"
    lo, hi = spec[1], spec[2]
    return None if lo <= d <= hi else f"{where}: {d} is outside {lo}..{hi:g}"
