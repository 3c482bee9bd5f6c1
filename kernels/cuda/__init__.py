"""CUDA kernels: `.cu` sources beside this file, compiled by NVRTC for the device's architecture and loaded
with `cupy.RawModule`; `ops.py` wraps them with the CPU kernels' signatures.

Compilation goes through NVRTC directly (`cupy_backends.cuda.libs.nvrtc`, the `nvidia-cuda-nvrtc-cu12` wheel)
so that the same function serves the run-time build and the CI check, which has no GPU and no driver
(tests/gpu/test_cuda_compile.py builds every source for sm_61 and sm_120). At run time the architecture comes
from the device: `-arch=sm_XX` (a cubin: SASS, no driver JIT) when this NVRTC knows the device, else PTX for
the newest architecture it knows (the driver JIT-compiles it). Cubins are cached on disk (keyed by source,
options, NVRTC version and architecture) and modules once per process and device.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

import platformdirs

from ...errors import GuildError
from ...formats.files import write_bytes

SOURCES = ("quant", "ops", "attention", "deltanet")
HEADERS = ("common.cuh", "grids.cuh")
# --fmad=false: no implicit a*b+c contraction; kernels spell out fmaf() where a fused step is meant, so the
# arithmetic is what the source says on every architecture (see common.cuh)
OPTIONS = ("--std=c++17", "--fmad=false", "--device-as-default-execution-space")
TARGET_ARCHS = (61, 120)  # the users' GPUs (GTX 1070 Pascal, RTX 5070 Blackwell); CI compiles for both
_DIR = Path(__file__).parent


class CudaCompileError(GuildError):
    pass


def source_text(name: str) -> str:
    return (_DIR / f"{name}.cu").read_text()


def _headers() -> tuple[list[str], list[str]]:
    return [(_DIR / h).read_text() for h in HEADERS], list(HEADERS)


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc  # optional: guild[gpu]
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise CudaCompileError(f"NVRTC unavailable: install guild[gpu] (cupy-cuda12x) ({e})") from None
    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    try:
        return tuple(_nvrtc().getVersion())
    except Exception as e:
        raise CudaCompileError(
            f"NVRTC library not found ({str(e).splitlines()[0]}): pip install nvidia-cuda-nvrtc-cu12"
        ) from None


def supported_archs() -> tuple[int, ...]:
    return tuple(int(a) for a in _nvrtc().getSupportedArchs())


def arch_option(cc: int) -> tuple[str, str]:
    """NVRTC -arch for a device of compute capability cc (e.g. 61, 120): ('-arch=sm_61', 'cubin') when this
    NVRTC targets it, ('-arch=compute_N', 'ptx') for the newest N it knows when the device is newer."""
    archs = supported_archs()
    if cc in archs:
        return f"-arch=sm_{cc}", "cubin"
    if cc > max(archs):
        return f"-arch=compute_{max(archs)}", "ptx"
    raise CudaCompileError(
        f"GPU compute capability {cc // 10}.{cc % 10} is not supported by NVRTC {'.'.join(map(str, nvrtc_version()))} "
        f"(it targets sm_{min(archs)}..sm_{max(archs)})"
    )


def compile_source(name: str, cc: int) -> tuple[bytes, str]:
    """Compile kernels/cuda/<name>.cu for compute capability cc; returns (binary, 'cubin' | 'ptx')."""
    nvrtc = _nvrtc()
    arch, kind = arch_option(cc)
    src = source_text(name)
    hdr, names = _headers()
    prog = nvrtc.createProgram(src, f"{name}.cu", [h.encode() for h in hdr], [n.encode() for n in names])
    try:
        try:
            nvrtc.compileProgram(prog, [*OPTIONS, arch])
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog).strip()
            first = next((ln for ln in log.splitlines() if "error" in ln), log.splitlines()[0] if log else str(e))
            raise CudaCompileError(f"kernels/cuda/{name}.cu ({arch}): {first}") from None
        if kind == "cubin":
            return nvrtc.getCUBIN(prog), kind
        ptx = nvrtc.getPTX(prog)
        return (ptx if isinstance(ptx, bytes) else ptx.encode()).rstrip(b"\0"), kind
    finally:
        nvrtc.destroyProgram(prog)


def _cache_root() -> Path:
    root = os.environ.get("GUILD_CACHE_DIR")
    if not root:
        root = platformdirs.user_cache_dir("guild")
    return Path(root).expanduser() / "cuda"


def cached_binary(name: str, cc: int) -> Path:
    """The compiled binary for (source, cc) on disk, built once (written atomically)."""
    hdr, _ = _headers()
    arch, kind = arch_option(cc)
    key = hashlib.sha256("\0".join([source_text(name), *hdr, *OPTIONS, arch, repr(nvrtc_version())]).encode())
    path = _cache_root() / f"{name}-{arch.split('=')[1]}-{key.hexdigest()[:16]}.{kind}"
    if not path.is_file():
        blob, _ = compile_source(name, cc)
        write_bytes(path, blob, "CUDA binary")
    return path


@cache
def _module(name: str, device_id: int, cc: int):
    import cupy  # optional: guild[gpu]

    return cupy.RawModule(path=str(cached_binary(name, cc)))


def module(name: str):
    """The cupy.RawModule of kernels/cuda/<name>.cu for the current device (compiled and loaded once)."""
    import cupy  # optional: guild[gpu]

    dev = cupy.cuda.Device()
    return _module(name, dev.id, int(dev.compute_capability))


@cache
def _kernel(name: str, fn: str, device_id: int):
    return module(name).get_function(fn)


def kernel(name: str, fn: str):
    """A kernel function of kernels/cuda/<name>.cu (a cupy.RawKernel), cached per device."""
    import cupy  # optional: guild[gpu]

    return _kernel(name, fn, cupy.cuda.Device().id)
