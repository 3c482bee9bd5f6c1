"""Every CUDA source compiles for the users' GPUs (sm_61 Pascal, sm_120 Blackwell) with NVRTC, the compiler
CuPy uses at run time. Needs no GPU and no driver: only the nvidia-cuda-nvrtc-cu12 wheel (test extra)."""

import re
from pathlib import Path

import pytest

from guild.errors import GuildError
from guild.kvtypes import KV_TYPES

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="cupy-cuda12x not installed (pip install .[test])")

import guild.kernels.cuda as kc  # noqa: E402
from guild.kernels.cuda import ops  # noqa: E402

pytestmark = pytest.mark.gpu

try:
    kc.nvrtc_version()
except GuildError as e:  # pragma: no cover - the wheel is in the test extra
    pytest.skip(f"NVRTC library missing: {e}", allow_module_level=True)

CUDA_DIR = Path(kc.__file__).parent


def expected_kernels() -> dict[str, set[str]]:
    """Kernel names the Python wrappers launch, per source (read from ops.py, so a renamed kernel fails here)."""
    text = Path(ops.__file__).read_text()
    want: dict[str, set[str]] = {}
    for src, fn in re.findall(r'kernel\("(\w+)", "(\w+)"\)', text):
        want.setdefault(src, set()).add(fn)
    for src, prefix in re.findall(r'kernel\("(\w+)", "(\w+_)" \+ w\.suffix\)', text):
        want.setdefault(src, set()).update(prefix + s for s in ops._SUFFIX.values())
    for src, prefix in re.findall(r'kernel\("(\w+)", f"(\w+_)\{kv_type\(kt\)\}_\{kv_type\(vc\)\}"\)', text):
        want.setdefault(src, set()).update(f"{prefix}{k}_{v}" for k in KV_TYPES for v in KV_TYPES)
    return want


def test_sources_listed():
    assert {p.stem for p in CUDA_DIR.glob("*.cu")} == set(kc.SOURCES)
    assert set(expected_kernels()) == set(kc.SOURCES)
    assert len(expected_kernels()["quant"]) == 2 * len(ops._SUFFIX)
    assert len(expected_kernels()["attention"]) == 2 * len(KV_TYPES) ** 2  # attention and kv_write per K/V pair


@pytest.mark.parametrize("cc", kc.TARGET_ARCHS, ids=lambda c: f"sm_{c}")
@pytest.mark.parametrize("name", kc.SOURCES)
def test_compiles(name, cc):
    blob, kind = kc.compile_source(name, cc)
    assert kind == "cubin" and blob[:4] == b"\x7fELF"
    for fn in expected_kernels()[name]:  # extern "C": the symbol is the name itself
        assert fn.encode() + b"\0" in blob, f"{name}.cu sm_{cc}: kernel {fn} missing"


def test_launch_geometry_matches_sources():
    quant = (CUDA_DIR / "quant.cu").read_text()
    att = (CUDA_DIR / "attention.cu").read_text()
    assert re.search(rf"#define ROWS {ops.ROWS}\b", quant) and re.search(rf"#define WARPS {ops.WARPS}\b", quant)
    assert re.search(rf"#define ATT_THREADS {ops.ATT_THREADS}\b", att)


def test_arch_selection():
    assert kc.arch_option(61) == ("-arch=sm_61", "cubin")
    assert kc.arch_option(120) == ("-arch=sm_120", "cubin")
    newest = max(kc.supported_archs())
    assert kc.arch_option(newest + 100) == (f"-arch=compute_{newest}", "ptx")  # a GPU newer than this NVRTC
    with pytest.raises(GuildError, match="not supported by NVRTC"):
        kc.arch_option(30)


def test_ptx_for_a_newer_gpu():
    blob, kind = kc.compile_source("attention", max(kc.supported_archs()) + 100)
    assert kind == "ptx" and b".entry attention_f16_q8_0" in blob


def test_compile_error_is_one_line(monkeypatch):
    monkeypatch.setattr(kc, "source_text", lambda name: '#include "common.cuh"\nextern "C" __global__ void f() { x; }')
    with pytest.raises(kc.CudaCompileError, match=r"kernels/cuda/ops\.cu \(-arch=sm_61\): .*error"):
        kc.compile_source("ops", 61)


def test_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GUILD_CACHE_DIR", str(tmp_path))
    p = kc.cached_binary("attention", 61)
    assert p.parent == tmp_path / "cuda" and p.suffix == ".cubin" and p.read_bytes()[:4] == b"\x7fELF"
    mtime = p.stat().st_mtime_ns
    assert kc.cached_binary("attention", 61) == p and p.stat().st_mtime_ns == mtime  # reused, not rebuilt


def test_grid_header_is_current():
    """kernels/cuda/grids.cuh is generated from kernels/grids.py (python -m guild.kernels.cuda.gen_grids)."""
    from guild.kernels.cuda import gen_grids

    assert (CUDA_DIR / "grids.cuh").read_text() == gen_grids.source()
