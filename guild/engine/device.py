"""`--device auto|cpu|cuda`: which processor runs attention and the dense layers.

`cuda` needs CuPy (`pip install 'guild[gpu]'`), a CUDA driver, a visible device and NVRTC (the compiler CuPy
uses at run time; the `nvidia-cuda-nvrtc-cu12` wheel). `auto` takes the GPU when all of that is there and
otherwise the CPU, and says why; `cuda` without it is a one-line error naming what is missing.

For testing without a GPU, `GUILD_FAKE_GPU=1` (or `=VRAM_MIB`, default 8192: a GTX 1070) makes `cuda` and
`auto` find a fake sm_61 device whose backend is the counting host backend (HostBackend.fake_device): the
CPU kernels behind the GPU path's placement, layout and transfers, bitwise the CPU engine's tokens.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass

from ..errors import BadFlagError, DeviceUnavailableError, GuildError
from ..kvtypes import F32_KV, KVTypes
from ..plans.machine import FAKE_GPU_NAME, fake_gpu_mib
from .gpu import build
from .options import DEVICES
from .placement import placement_from_plan


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" | "cuda"
    name: str = ""  # GPU name
    cc: int = 0  # compute capability as an integer, e.g. 61, 120
    total_bytes: int = 0
    free_bytes: int = 0
    index: int = 0
    note: str = ""  # for auto: why the CPU was chosen

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def label(self) -> str:
        """The device without its passing state (free memory, why auto chose it): what a plan records."""
        return f"cuda:{self.index} {self.name} (sm_{self.cc})" if self.is_cuda else "cpu"

    def describe(self) -> str:
        if self.is_cuda:
            return (f"cuda:{self.index} {self.name} (sm_{self.cc}, {self.free_bytes / 2**30:.1f} of "
                    f"{self.total_bytes / 2**30:.1f} GiB free)")
        return "cpu" + (f" ({self.note})" if self.note else "")


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def fake_gpu_requested() -> bool:
    return fake_gpu_mib() > 0


def probe_cuda(index: int = 0) -> tuple[Device | None, str]:
    """(the CUDA device, "") when CuPy can use GPU `index`, else (None, the reason)."""
    if mib := fake_gpu_mib():
        return Device("cuda", FAKE_GPU_NAME, 61, mib * 2**20, mib * 2**20), ""
    try:
        import cupy  # optional: guild[gpu]
    except ImportError:
        return None, "CuPy is not installed (pip install 'guild[gpu]')"
    except Exception as e:  # a broken install raises other errors at import
        return None, f"CuPy failed to import ({_first_line(e)})"
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None, "no CUDA driver (libcuda.so.1 not found)"
    rt = cupy.cuda.runtime
    try:
        n = rt.getDeviceCount()
    except Exception as e:  # CUDARuntimeError: no driver / driver too old for this CuPy
        msg = _first_line(e)
        if "InsufficientDriver" in msg or "NoDevice" not in msg:
            return None, f"no usable CUDA driver ({msg})"
        return None, "no CUDA device"
    if n <= index:
        return None, "no CUDA device" if n == 0 else f"no CUDA device {index} ({n} visible)"
    try:
        props = rt.getDeviceProperties(index)
        with cupy.cuda.Device(index):
            free, total = rt.memGetInfo()
    except Exception as e:
        return None, f"CUDA device {index} unusable ({_first_line(e)})"
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    cc = int(props["major"]) * 10 + int(props["minor"])
    try:
        from ..kernels.cuda import arch_option  # loads NVRTC, which may be missing

        arch_option(cc)
    except GuildError as e:
        return None, str(e)
    except Exception as e:  # NVRTC library missing
        return None, f"NVRTC unavailable ({_first_line(e)}; pip install nvidia-cuda-nvrtc-cu12)"
    return Device("cuda", name, cc, int(total), int(free), index), ""


def resolve_device(spec: str | None) -> Device:
    """The device for `--device spec` (None = auto)."""
    s = (spec or "auto").strip().lower()
    if s not in DEVICES:
        raise BadFlagError(f"--device must be one of {', '.join(DEVICES)}, got '{spec}'")
    if s == "cpu":
        return Device("cpu")
    dev, why = probe_cuda()
    if dev is not None:
        return dev
    if s == "cuda":
        raise DeviceUnavailableError(f"no usable CUDA GPU: {why}")
    return Device("cpu", note=f"auto: {why}")


def place_model(model, spec: str | None, context: int, placement=None,
                kv: KVTypes = F32_KV) -> tuple[object, Device, str]:
    """`--device spec`: the model with its attention/dense share on the GPU (`placement`: a plan's placement
    section, else the default for the VRAM free now; routed experts stay on the CPU), the device, and why the
    CPU runs it when `auto` did not take the GPU. `cuda` raises where `auto` falls back."""
    dev = resolve_device(spec)
    if not dev.is_cuda:
        return model, dev, dev.note
    try:
        split = placement_from_plan(placement, model, context, kv) if placement is not None and placement.gpu else None
        return build(model, dev, context, split, kv), dev, ""
    except GuildError as e:
        if (spec or "auto").strip().lower() == "cuda":
            raise
        return model, Device("cpu", note=f"auto: {e}"), f"auto: {e}"
