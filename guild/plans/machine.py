"""What machine is this: the hardware identity a plan records and checks (CPU model, ISA flags, cores, NUMA
nodes, GPU), probed cheaply (no measurement).

Linux sources: /proc/cpuinfo (model name, flags, physical/core ids), /sys/devices/system/node (NUMA nodes).
The GPU comes from CuPy when it is importable and sees a device; otherwise the machine has none (never an error).
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadFlagError, CpuIsaMismatch, GpuArchitectureMismatch, NumaTopologyMismatch, PlanError


def _mismatch(cls, where: str, msg: str):
    """A typed identity mismatch whose message names its type (what `run` prints before regenerating)."""
    return cls(f"{where}: {cls.__name__}: {msg}")


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: str  # "major.minor", e.g. "9.0"
    vram_bytes: int

    def describe(self) -> str:
        return f"{self.name} (sm_{self.compute_capability.replace('.', '')}, {self.vram_bytes / 2**30:.1f} GiB)"


@dataclass(frozen=True)
class HardwareIdentity:
    cpu_model: str
    isa: tuple[str, ...]  # sorted subset of ISA_FLAGS
    physical_cores: int
    logical_cpus: int
    numa_nodes: int
    gpu: GpuInfo | None = None

    def __post_init__(self):
        if not (self.physical_cores >= 1 and self.logical_cpus >= self.physical_cores and self.numa_nodes >= 1):
            raise PlanError("plan hardware: cores, logical CPUs and NUMA nodes must be >= 1 (logical >= physical)")
        object.__setattr__(self, "isa", tuple(sorted(self.isa)))

    def check(self, here: HardwareIdentity, where: str) -> None:
        """Raise the typed mismatch if `here` (this machine) is not the machine the plan was calibrated on."""
        if self.cpu_model != here.cpu_model or self.isa != here.isa:
            missing = sorted(set(self.isa) - set(here.isa))
            extra = sorted(set(here.isa) - set(self.isa))
            diff = "; ".join(x for x in (f"missing here: {' '.join(missing)}" if missing else "",
                                         f"new here: {' '.join(extra)}" if extra else "") if x)
            raise _mismatch(CpuIsaMismatch, where, f"calibrated on '{self.cpu_model}', this machine is "
                            f"'{here.cpu_model}' (ISA flags: {diff or 'the same'})")
        if (self.numa_nodes, self.physical_cores, self.logical_cpus) != (
                here.numa_nodes, here.physical_cores, here.logical_cpus):
            raise _mismatch(
                NumaTopologyMismatch, where, f"calibrated on {self.numa_nodes} NUMA node(s), {self.physical_cores} "
                f"cores / {self.logical_cpus} threads; this machine has {here.numa_nodes} NUMA node(s), "
                f"{here.physical_cores} cores / {here.logical_cpus} threads")
        if self.gpu != here.gpu:
            a = self.gpu.describe() if self.gpu else "no GPU"
            b = here.gpu.describe() if here.gpu else "no GPU"
            raise _mismatch(GpuArchitectureMismatch, where, f"calibrated with {a}, this machine has {b}")

    @classmethod
    def from_dict(cls, d: dict) -> HardwareIdentity:
        g = d.get("gpu")
        gpu = None if g is None else GpuInfo(str(g["name"]), str(g["compute_capability"]), int(g["vram_bytes"]))
        return cls(str(d["cpu_model"]), tuple(str(x) for x in d["isa"]), int(d["physical_cores"]),
                   int(d["logical_cpus"]), int(d["numa_nodes"]), gpu)



# ISA flags that decide which kernels a plan's timings came from (as /proc/cpuinfo spells them)
ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def _cpuinfo(text: str) -> tuple[str, tuple[str, ...], int, int]:
    """(model name, ISA flags, physical cores, logical CPUs) from /proc/cpuinfo text."""
    model, flags, cores, logical = "", set(), set(), 0
    phys = core = None
    for line in text.splitlines() + [""]:
        key, _, val = (s.strip() for s in line.partition(":"))
        if key == "processor":
            logical += 1
        elif key == "model name" and not model:
            model = val
        elif key == "flags" and not flags:
            flags = set(val.split())
        elif key == "physical id":
            phys = val
        elif key == "core id":
            core = val
        elif not line.strip():  # end of one processor's block
            if core is not None:
                cores.add((phys, core))
            phys = core = None
    isa = tuple(sorted(f for f in ISA_FLAGS if f in flags))
    return model, isa, len(cores) or logical, logical


def numa_nodes(root: str | Path = "/sys/devices/system/node") -> int:
    try:
        return max(1, sum(1 for p in Path(root).iterdir() if re.fullmatch(r"node\d+", p.name)))
    except OSError:
        return 1


FAKE_GPU_ENV = "GUILD_FAKE_GPU"
FAKE_GPU_NAME = f"fake GPU ({FAKE_GPU_ENV}, host backend)"


def fake_gpu_mib() -> int:
    """VRAM in MiB of the stand-in GPU that GUILD_FAKE_GPU asks for (`1`: 8192, a GTX 1070; or a size in MiB),
    0 when it is unset: tests run --device cuda on the counting host backend (guild.engine.device)."""
    v = os.environ.get(FAKE_GPU_ENV, "").strip().lower()
    if v in ("", "0"):
        return 0
    if v in ("1", "yes", "true"):
        return 8192
    if not v.isdigit():
        raise BadFlagError(f"{FAKE_GPU_ENV} must be 1 or a VRAM size in MiB, got '{v}'")
    return int(v)


def gpu_info() -> GpuInfo | None:
    """The first CUDA device CuPy sees, or None (CuPy missing, no driver, no device); the stand-in under
    GUILD_FAKE_GPU."""
    if mib := fake_gpu_mib():
        return GpuInfo(FAKE_GPU_NAME, "6.1", mib * 2**20)
    try:
        import cupy  # optional: guild[gpu]
    except Exception:  # ImportError, or a broken CUDA install failing at import
        return None
    try:
        rt = cupy.cuda.runtime
        if rt.getDeviceCount() < 1:
            return None
        p = rt.getDeviceProperties(0)
        name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
        return GpuInfo(name, f"{p['major']}.{p['minor']}", int(p["totalGlobalMem"]))
    except Exception:
        return None


def hardware_identity(cpuinfo_path: str = "/proc/cpuinfo") -> HardwareIdentity:
    """This machine's identity as a plan records it (cheap: no measurement)."""
    try:
        text = Path(cpuinfo_path).read_text(errors="replace")
    except OSError:
        text = ""
    model, isa, cores, logical = _cpuinfo(text)
    logical = logical or os.cpu_count() or 1
    return HardwareIdentity(model or platform.processor() or platform.machine(), isa, max(1, min(cores, logical)),
                            logical, numa_nodes(), gpu_info())


