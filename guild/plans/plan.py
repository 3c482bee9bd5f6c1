"""The `.gexec` execution plan (README "Plans"): what `guild optimize` measured on this machine for one model,
sealed so that `run`/`bench` can trust it.

File layout (YAML, written by `write_plan`)::

    # comment line
    header:    {format, version, guild_version, created, mode, context, prefill_batch, spec, cache_type_k,
                cache_type_v}
    hardware:  {cpu_model, isa, physical_cores, logical_cpus, numa_nodes, gpu}
    model:     {sha256, architecture, layers, expert_count, expert_used_count, file}
    placement: {sha256: <digest of the section>, ...}
    cpu:       {sha256: ..., ...}
    drafting:  {sha256: ..., ..., draft_ms: {<drafter>: ms, ...}, catchup_ms: {<drafter>: ms, ...}, device, device_note}
    seal: <SHA-256 of every byte above this line>

Loading checks the seal first, over the exact bytes (any changed byte, whitespace and comments included, is a
`PlanSealError`), then the format and its version (a plan of another version is one line saying to re-run
`guild optimize`), then each section's digest (over its canonical JSON form: an edit that also re-seals the file
still fails), then identity against this machine and the model: `CpuIsaMismatch` (CPU model or
ISA flags), `NumaTopologyMismatch` (NUMA nodes, cores), `GpuArchitectureMismatch` (GPU present or not, name,
compute capability, VRAM), `ModelMismatch` (GGUF header+metadata+tensor-index digest, architecture, expert
geometry), `KVTypeMismatch` (the KV cache types the costs were measured with).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from ..errors import (
    KVTypeMismatch,
    ModelMismatch,
    PlanError,
    PlanSealError,
)
from ..formats import safe_yaml
from ..formats.files import read_capped, write_bytes
from ..formats.gguf import GGUFFile
from ..kvtypes import KV_TYPES, KVTypes
from ..speculative.costs import DraftCosts
from ..window import MAX_WINDOW
from . import schema
from .machine import GpuInfo, HardwareIdentity, _mismatch, hardware_identity

FORMAT = "guild.gexec"
FORMAT_VERSION = 4  # 2: the `drafting` section, with per-drafter costs keyed by strategy; 3: the device that
#   measured the drafting costs, and why the CPU did where `--device auto` did not take the GPU; 4: the KV cache
#   types they were measured with
MAX_T = MAX_WINDOW  # drafting tables cover verification windows of T = 1..MAX_WINDOW rows
MODES = ("auto", "quick")  # `optimize --mode`: full calibration, or fewer repeats (tests, CI)
__all__ = ["GpuInfo", "HardwareIdentity", "ModelIdentity", "Plan", "load_plan", "read_plan", "write_plan"]
SECTIONS = ("placement", "cpu", "drafting")  # the sealed sections that carry their own digest
MAX_PLAN_BYTES = 1 << 20  # plans are a few KB
_SEAL_RE = re.compile(rb"seal: ([0-9a-f]{64})\n\Z")


def _fail(where: str, msg: str) -> PlanError:
    return PlanError(f"plan {where}: {msg}")




def _check(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise _fail(where, msg)


def _floats(xs, where: str, n: int | None = MAX_T, positive: bool = False) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in xs)
    except (TypeError, ValueError):
        raise _fail(where, f"expected a list of numbers, got {xs!r}") from None
    _check(n is None or len(out) == n, where, f"expected {n} values, got {len(out)}")
    _check(all(x > 0 if positive else x >= 0 for x in out), where, f"values must be {'> 0' if positive else '>= 0'}")
    return out


# ---------------------------------------------------------------------------------------------------------
# identity
@dataclass(frozen=True)
class Header:
    guild_version: str
    created: str  # ISO-8601 UTC
    mode: str = "auto"
    context: int = 4096
    prefill_batch: int = 512
    spec: int = 0  # MTP draft depth calibrated (0 = none)
    cache_type_k: str = "f32"  # the KV cache's stored types the costs were measured with
    cache_type_v: str = "f32"
    format: str = FORMAT
    version: int = FORMAT_VERSION

    def __post_init__(self):
        _check(self.format == FORMAT, "header.format", f"expected '{FORMAT}', got {self.format!r}")
        _check(self.version == FORMAT_VERSION, "header.version",
               f"format version {self.version} is not {FORMAT_VERSION} (re-run guild optimize)")
        _check(self.mode in MODES, "header.mode", f"expected one of {', '.join(MODES)}, got {self.mode!r}")
        _check(self.context >= 16 and self.prefill_batch >= 1 and self.spec >= 0, "header",
               "context >= 16, prefill_batch >= 1 and spec >= 0 expected")
        for name in ("cache_type_k", "cache_type_v"):
            _check(getattr(self, name) in KV_TYPES, f"header.{name}",
                   f"expected one of {', '.join(KV_TYPES)}, got {getattr(self, name)!r}")

    @property
    def kv(self) -> KVTypes:
        return KVTypes(self.cache_type_k, self.cache_type_v)


@dataclass(frozen=True)
class ModelIdentity:
    sha256: str  # of the GGUF header, metadata and tensor index (GGUFFile.identity_digest)
    architecture: str
    layers: int
    expert_count: int
    expert_used_count: int
    file: str = ""  # file name when calibrated (informational, not compared)

    def __post_init__(self):
        _check(bool(re.fullmatch(r"[0-9a-f]{64}", self.sha256)), "model.sha256", "expected 64 hex digits")

    @classmethod
    def of(cls, g) -> ModelIdentity:
        """The identity of an opened GGUFFile."""
        a = g.architecture
        n_exp = int(g.get(f"{a}.expert_count", int, 0))
        return cls(g.identity_digest(), a, int(g.get(f"{a}.block_count", int, 0)), n_exp,
                   int(g.get(f"{a}.expert_used_count", int, 0)) if n_exp else 0, Path(g.path).name)

    def check(self, here: ModelIdentity, where: str) -> None:
        mine = (self.architecture, self.layers, self.expert_count, self.expert_used_count)
        theirs = (here.architecture, here.layers, here.expert_count, here.expert_used_count)
        if mine != theirs:
            def geometry(m):
                return f"{m.architecture}, {m.layers} layers, {m.expert_count} experts (top-{m.expert_used_count})"

            raise _mismatch(ModelMismatch, where, f"calibrated for {geometry(self)}; the model is {geometry(here)}")
        if self.sha256 != here.sha256:
            raise _mismatch(ModelMismatch, where, f"calibrated for {self.file} (sha256 {self.sha256[:16]}…), the "
                            f"model {here.file} has sha256 {here.sha256[:16]}…")


# ---------------------------------------------------------------------------------------------------------
# sections
SIDES = ("cpu", "gpu", "split")  # where a placement group lives


_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.(.+)$")


def group_of(name: str) -> tuple[str, int]:
    """(group, layer) of a GGUF tensor name (llama.cpp naming); layer -1 for global tensors."""
    m = _BLOCK_TENSOR.match(name)
    if not m:
        if name.startswith("token_embd"):
            return "embeddings", -1
        if name.startswith(("output", "result_norm")):
            return "output", -1
        return "other", -1
    layer, rest = int(m.group(1)), m.group(2)
    if "_exps" in rest:
        return "routed_experts", layer
    if "ffn_gate_inp" in rest or "exp_probs" in rest:
        return "router", layer
    if "_shexp" in rest:
        return "shared_experts", layer
    if rest.startswith("nextn.") or rest.startswith(("eh_proj", "enorm", "hnorm")):
        return "mtp", layer
    if rest.startswith("ssm_"):
        return "recurrent", layer
    if rest.startswith("attn_") and "norm" not in rest:
        return "attention", layer
    if "norm" in rest:
        return "norms", layer
    if rest.startswith("ffn_"):
        return "dense_ffn", layer
    return "other", layer


@dataclass(frozen=True)
class PlacementGroup:
    name: str  # attention, recurrent, kv_cache, norms, router, dense_ffn, shared_experts, routed_experts, ...
    device: str  # cpu | gpu | split (some layers on each)
    tensors: int  # tensors in the group (0 for the KV cache)
    bytes: int
    gpu_bytes: int

    def __post_init__(self):
        _check(self.device in SIDES, f"placement.{self.name}.device", f"expected one of {SIDES}")
        _check(0 <= self.gpu_bytes <= self.bytes, f"placement.{self.name}", "gpu_bytes must be in 0..bytes")
        _check(self.name != "routed_experts" or self.gpu_bytes == 0, "placement.routed_experts",
               "routed experts always run on the CPU")


@dataclass(frozen=True)
class Placement:
    gpu: str | None  # the GPU's name, None on a CPU-only machine
    vram_budget_bytes: int
    context: int
    groups: tuple[PlacementGroup, ...]
    note: str = ""

    def __post_init__(self):
        _check(self.gpu is not None or self.gpu_bytes == 0, "placement", "a CPU-only plan places nothing on a GPU")
        _check(self.gpu_bytes <= self.vram_budget_bytes or self.gpu is None, "placement",
               f"{self.gpu_bytes} bytes on the GPU exceed the budget {self.vram_budget_bytes}")

    @property
    def gpu_bytes(self) -> int:
        return sum(g.gpu_bytes for g in self.groups)

    @property
    def cpu_bytes(self) -> int:
        return sum(g.bytes - g.gpu_bytes for g in self.groups)

    @classmethod
    def from_dict(cls, d: dict) -> Placement:
        return cls(d["gpu"], int(d["vram_budget_bytes"]), int(d["context"]),
                   tuple(PlacementGroup(**g) for g in d["groups"]), str(d.get("note", "")))


@dataclass(frozen=True)
class KernelTuning:
    """Pass 3 for one quant type: the GEMV kernel timed on the model's own matrices at each thread count."""

    qtype: str
    kernel: str  # the variant chosen
    variants: tuple[str, ...]  # the variants that exist for this type and were timed
    role: str  # "experts" when routed-expert matrices were timed, else "dense"
    matrices: int  # matrices of this type in the model
    timed: int  # of them, how many were timed per pass
    threads_tried: tuple[int, ...]
    ms: tuple[float, ...]  # one pass over the timed matrices (T = 1 and T = 2 rows), per thread count
    best_threads: int
    gweights_s: float  # weights read per second at best_threads, T = 1

    def __post_init__(self):
        _check(len(self.ms) == len(self.threads_tried) > 0, f"cpu.{self.qtype}", "one time per thread count")
        _check(self.best_threads in self.threads_tried and self.kernel in self.variants, f"cpu.{self.qtype}",
               "best_threads and kernel must be among those tried")


@dataclass(frozen=True)
class CpuTuning:
    threads: int  # what `run --gexec` uses when -t is not given
    memory_bandwidth_gbs: float  # pass 1: numpy copy, one thread (read + write)
    kernels: tuple[KernelTuning, ...]

    def __post_init__(self):
        _check(self.threads >= 1 and self.memory_bandwidth_gbs >= 0, "cpu", "threads >= 1 expected")

    @classmethod
    def from_dict(cls, d: dict) -> CpuTuning:
        ks = tuple(KernelTuning(**{**k, "variants": tuple(k["variants"]), "threads_tried": tuple(k["threads_tried"]),
                                   "ms": tuple(float(x) for x in k["ms"])}) for k in d["kernels"])
        return cls(int(d["threads"]), float(d["memory_bandwidth_gbs"]), ks)


@dataclass(frozen=True)
class DraftCalibration:
    """Pass 4: the costs the adaptive scheduler trades, measured with the real model."""

    context: int  # KV rows the windows attended over
    filled_tokens: int  # of them, real calibration text prefilled (the rest: copies of those rows)
    repeats: int  # windows timed per T
    verify_window_ms: tuple[float, ...]  # V(T), T = 1..8: forward + commit, median
    verify_cpu_expert_ms: tuple[float, ...] | None  # the CPU-expert share of V(T) (None: dense model)
    distinct_experts: tuple[float, ...] | None  # U(T): union of routed experts per layer over T rows, mean
    distinct_expert_ratio: tuple[float, ...] | None  # U(T) / U(1)
    # propose latency per drafter (registry name): the head-free ones median over a replay at `context` tokens
    # of history (calibration text as a corpus), a head drafter's one draft step; none without a head
    draft_ms: dict[str, float]
    kv_commit_ms: float  # KVCache.commit of a rejected 8-row window, median
    noise_cv: float  # timing noise: coefficient of variation of the window times (median over T)
    prefill_tok_s: float  # while filling the context, at header.prefill_batch rows per forward
    catchup_ms: dict[str, float] = field(default_factory=dict)  # a row-following drafter's catch-up row (mtp)
    mtp_note: str = ""
    calibrated: bool = True
    device: str = "cpu"  # what ran the windows: "cpu" or "cuda:<index> <name> (sm_<cc>)"
    device_note: str = ""  # why the CPU ran them under `--device auto` ("" when asked for or on the GPU)

    def __post_init__(self):
        object.__setattr__(self, "verify_window_ms", _floats(self.verify_window_ms, "drafting.verify_window_ms",
                                                             positive=True))
        for name in ("verify_cpu_expert_ms", "distinct_experts", "distinct_expert_ratio"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, _floats(v, f"drafting.{name}"))
        for name in ("kv_commit_ms", "noise_cv", "prefill_tok_s"):
            _check(float(getattr(self, name)) >= 0, f"drafting.{name}", "must be >= 0")
        for name in ("draft_ms", "catchup_ms"):
            for k, v in getattr(self, name).items():
                _check(float(v) >= 0, f"drafting.{name}.{k}", "must be >= 0")
        _check(0 < self.filled_tokens <= self.context and self.repeats >= 1, "drafting",
               "0 < filled_tokens <= context and repeats >= 1 expected")

    @classmethod
    def from_dict(cls, d: dict) -> DraftCalibration:
        return cls(**d)


# ---------------------------------------------------------------------------------------------------------
# the plan
@dataclass(frozen=True)
class Plan:
    header: Header
    hardware: HardwareIdentity
    model: ModelIdentity
    placement: Placement
    cpu: CpuTuning
    drafting: DraftCalibration
    path: str = field(default="", compare=False)  # where it was read from or written to

    def draft_costs(self) -> DraftCosts:
        """The calibrated costs in the form the adaptive scheduler consumes."""
        s = self.drafting
        return DraftCosts(verify_ms=tuple(s.verify_window_ms), context=s.context, draft_ms=dict(s.draft_ms),
                          catchup_ms=dict(s.catchup_ms), commit_ms=s.kv_commit_ms)

    def check(self, hardware: HardwareIdentity, model: ModelIdentity | None = None,
              kv: KVTypes | None = None) -> None:
        """Identity: this machine, then the model and the KV cache types (each skipped when None)."""
        where = self.path or "plan"
        self.hardware.check(hardware, where)
        if model is not None:
            self.model.check(model, where)
        if kv is not None and kv != self.header.kv:
            raise _mismatch(KVTypeMismatch, where, f"measured with the KV cache {self.header.kv.describe()}; this "
                            f"run stores {kv.describe()}")

    def to_dict(self) -> dict:
        """Every field, sections without their digests (the JSON of `inspect --json`)."""
        d = {f.name: asdict(getattr(self, f.name)) for f in fields(self) if f.name != "path"}
        d["placement"]["gpu_bytes"] = self.placement.gpu_bytes
        d["placement"]["cpu_bytes"] = self.placement.cpu_bytes
        return d


def _canonical(d: Any) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def section_digest(d: dict) -> str:
    """SHA-256 of a section's canonical JSON form, its own `sha256` key left out."""
    return hashlib.sha256(_canonical({k: v for k, v in d.items() if k != "sha256"})).hexdigest()


def _plain(x: Any) -> Any:
    """Tuples → lists, recursively (YAML safe_dump writes no Python tags)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def render(plan: Plan) -> bytes:
    """The sealed file's bytes."""
    d = _plain({f.name: asdict(getattr(plan, f.name)) for f in fields(plan) if f.name != "path"})
    for name in SECTIONS:
        sec = yaml.safe_load(yaml.safe_dump(d[name]))  # the digest covers exactly what a reader will parse
        d[name] = {"sha256": section_digest(sec), **sec}
    body = ("# guild execution plan (guild optimize): the seal covers every byte above it; do not edit\n"
            + yaml.safe_dump(d, sort_keys=False, allow_unicode=True, width=120)).encode()
    return body + f"seal: {hashlib.sha256(body).hexdigest()}\n".encode()


def write_plan(plan: Plan, path: str | os.PathLike) -> Path:
    """Write atomically (guild.formats.files: a temp file in the same directory, fsync, rename over `path`)."""

    return write_bytes(path, render(plan), "the plan", PlanError)


def read_plan(path: str | os.PathLike) -> Plan:
    """Seal, section digests, format; no identity check (see load_plan)."""

    p = Path(path)
    data = read_capped(p, MAX_PLAN_BYTES, f"{p}: the plan", PlanError)
    cut = data.rfind(b"\n", 0, max(0, len(data) - 1)) + 1  # start of the last line
    m = _SEAL_RE.match(data, cut)
    if m is None:
        raise PlanSealError(f"{p}: no seal on the last line (truncated or not a .gexec plan)")
    if hashlib.sha256(data[:cut]).hexdigest() != m.group(1).decode():
        raise PlanSealError(f"{p}: seal mismatch: the file was changed after guild optimize wrote it")

    try:
        d = safe_yaml.load(data)  # no aliases, bounded nesting, plain types only
    except (yaml.YAMLError, safe_yaml.UnsafeYaml) as e:  # a sealed file that does not parse: not write_plan's
        raise PlanSealError(f"{p}: sealed but not a plain YAML plan ({str(e).splitlines()[0]})") from None
    h = d.get("header") if isinstance(d, dict) else None
    if isinstance(h, dict) and h.get("format") == FORMAT and h.get("version") != FORMAT_VERSION:  # sections differ
        raise PlanError(f"{p}: plan format version {str(h.get('version'))[:40]} is not {FORMAT_VERSION} "
                        "(re-run guild optimize)")
    if not isinstance(d, dict) or any(k not in d for k in ("header", "hardware", "model", *SECTIONS)):
        raise PlanError(f"{p}: not a guild plan (expected header, hardware, model, {', '.join(SECTIONS)})")
    d.pop("seal", None)
    for name in SECTIONS:
        sec = d[name]
        try:
            ok = isinstance(sec, dict) and sec.get("sha256") == section_digest(sec)
        except ValueError:  # NaN/inf: the canonical JSON refuses them, so no digest write_plan made covers them
            ok = False
        if not ok:
            raise PlanSealError(f"{p}: section '{name}' does not match its sha256 digest")
    problem = schema.check(d)  # types and ranges per field, before the dataclasses see them
    if problem:
        raise PlanError(f"{p}: {problem}")
    try:
        plan = Plan(
            Header(**d["header"]),
            HardwareIdentity.from_dict(d["hardware"]),
            ModelIdentity(**d["model"]),
            Placement.from_dict({k: v for k, v in d["placement"].items() if k != "sha256"}),
            CpuTuning.from_dict(d["cpu"]),
            DraftCalibration.from_dict({k: v for k, v in d["drafting"].items() if k != "sha256"}),
            str(p),
        )
    except PlanError as e:  # the dataclasses' own checks; anything else past schema.check is a bug, not the file's
        raise PlanError(f"{p}: {e}") from None
    return plan


def load_plan(path: str | os.PathLike, model=None, hardware: HardwareIdentity | None = None,
              kv: KVTypes | None = None) -> Plan:
    """Read a plan (seal first) and check it against this machine (`hardware`, probed when None) and, when
    given, the model (a GGUFFile, a path, or a ModelIdentity) and the KV cache types."""
    plan = read_plan(path)
    if hardware is None:
        hardware = hardware_identity()
    if model is not None and not isinstance(model, ModelIdentity):

        model = ModelIdentity.of(model if isinstance(model, GGUFFile) else GGUFFile(model))
    plan.check(hardware, model, kv)
    return plan
