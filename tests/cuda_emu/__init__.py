"""Run kernels/cuda/*.cu on the CPU: the sources compiled as C++ (g++, C++20) with a small CUDA execution model (fibers)
(guild_emu.h), launched through the real kernels/cuda/ops.py wrappers and, for the engine, the real
CudaBackend, with NumPy arrays standing in for CuPy's. It checks the kernels' logic (indexing, block layouts,
reductions, launch geometry and argument types) where no GPU is lent; it says nothing about GPU timing,
memory coherence or NVRTC code generation, which the GPU run (scripts/gpu_check.sh) covers.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
CUDA_DIR = HERE.parent.parent / "kernels" / "cuda"
SOURCES = [HERE / "emu.cpp", HERE / "guild_emu.h", *sorted(CUDA_DIR.glob("*.cu")), *sorted(CUDA_DIR.glob("*.cuh"))]


def build(cache_dir: Path) -> Path | None:
    """The emulator library (built once per source hash); None when no C++20 compiler is available."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return None
    key = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES)).hexdigest()[:16]
    lib = Path(cache_dir) / f"guild_emu-{key}.so"
    if not lib.is_file():
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(".tmp.so")
        # -U_FORTIFY_SOURCE: the fibers switch stacks with _longjmp, which the fortified longjmp refuses
        cmd = [cxx, "-std=c++20", "-O2", "-ffp-contract=off", "-U_FORTIFY_SOURCE", "-fPIC", "-shared", "-pthread",
               "-DGUILD_EMU", "-w", "-I", str(HERE), "-I", str(CUDA_DIR), "-x", "c++", str(HERE / "emu.cpp"),
               "-o", str(tmp)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"building the CUDA emulator failed:\n{r.stderr[-3000:]}")
        tmp.replace(lib)
    return lib


class Emulator:
    def __init__(self, lib_path: Path):
        self.lib = ctypes.CDLL(str(lib_path))
        f = self.lib.guild_emu_launch
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_long,
                      ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p]
        self.launches = 0

    def kernel(self, source: str, name: str):
        return _Kernel(self, name)

    def fake_cupy(self) -> types.ModuleType:
        """The part of CuPy that kernels/cuda/ops.py and guild.engine.backends.CudaBackend use, on NumPy."""
        m = types.ModuleType("cupy")
        for n in ("empty", "zeros", "empty_like", "take", "ascontiguousarray", "concatenate", "float32", "int64",
                  "uint8"):
            setattr(m, n, getattr(np, n))
        m.asarray = lambda a, dtype=None: np.array(a, dtype=dtype, copy=True)
        m.asnumpy = np.asarray

        class _Ctx:
            def __init__(self, *a, **k):
                self.id, self.ptr, self.compute_capability = 0, 0, "61"

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def synchronize(self):
                pass

        def memcpy(dst, src, n, kind, stream):
            ctypes.memmove(dst, src, n)

        rt = types.SimpleNamespace(memcpyAsync=memcpy, memcpyHostToDevice=1, memcpyDeviceToHost=2)
        m.cuda = types.SimpleNamespace(Device=_Ctx, Stream=_Ctx, runtime=rt,
                                       alloc_pinned_memory=lambda n: bytearray(n))
        return m


_CODES = {np.int32: "i", np.int64: "l", np.float32: "f", np.float64: "d"}


class _Kernel:
    def __init__(self, emu: Emulator, name: str):
        self.emu, self.name = emu, name

    def __call__(self, grid, block, args, shared_mem: int = 0):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        codes, bits = [], []
        for a in args:
            if isinstance(a, np.ndarray):
                codes.append("p")
                bits.append(a.ctypes.data)  # first element of a view, as CuPy passes a device array
            elif type(a) in _CODES:
                codes.append(_CODES[type(a)])
                bits.append(int(np.asarray(a).reshape(1).view(np.uint32 if a.itemsize == 4 else np.uint64)[0]))
            else:
                raise TypeError(f"{self.name}: argument type {type(a).__name__} (need arrays or numpy scalars)")
        arr = (ctypes.c_uint64 * max(1, len(bits)))(*bits)
        rc = self.emu.lib.guild_emu_launch(self.name.encode(), *grid, int(block[0]), int(shared_mem), arr,
                                           "".join(codes).encode())
        if rc == 1:
            raise RuntimeError(f"no kernel named {self.name}")
        if rc == 2:
            raise RuntimeError(f"{self.name}: arguments ({''.join(codes)}) do not match the kernel's parameters")
        if rc == 3:
            raise RuntimeError(f"{self.name}: block of {block} threads (whole warps, <= 1024 expected)")
        if rc == 4:
            raise RuntimeError(f"{self.name}: deadlock (a barrier that some live threads never reach)")
        self.emu.launches += 1


def emu_backend_class():
    """CudaBackend with host pointers for the copies (NumPy arrays have no .data.ptr)."""
    from guild.engine.backends import CudaBackend

    class EmuBackend(CudaBackend):
        @staticmethod
        def _addr(a) -> int:
            return a.ctypes.data

    return EmuBackend


def patch(monkeypatch, emu: Emulator) -> None:
    """Route kernels/cuda/ops.py's launches and `import cupy` to the emulator for the test's duration."""
    from guild.kernels.cuda import ops

    monkeypatch.setitem(sys.modules, "cupy", emu.fake_cupy())
    monkeypatch.setattr(ops, "kernel", emu.kernel)
