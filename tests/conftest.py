import fcntl
import importlib
import importlib.metadata
import itertools
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

import numba
import pytest

# The kernels' OpenMP threads sleep as soon as they wait, in this process and the `guild` processes it starts
# (libgomp reads this when Numba starts its threads, after this import). By default each spins for milliseconds
# after every parallel region: on 2 cores shared with a server subprocess or another run, the spinning threads
# take the cores the working ones need (48 tokens at load 3-4: 2-60 s spinning, 1.5-1.7 s sleeping).
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "0")

# Models load mapped from the repack cache (--mmap) unless a test says otherwise: reading a model into memory (the
# default, guild/formats/resident.py) costs a copy of the weights at every load, and the suite loads the embedded
# models hundreds of times (3 minutes more on 2 cores); tests/formats/test_resident.py holds the read path to the
# mapped one's logits bitwise.
os.environ.setdefault("GUILD_MMAP", "1")

# No compile helper process at a cold load (guild/warmup.py): the suite's workers already keep the cores busy;
# tests/test_load.py runs the helper on an empty kernel cache.
os.environ.setdefault("GUILD_COMPILE_HELPER", "0")


def _installed_kernels_first() -> None:
    """HF transformers (the oracle tier) imports the `kernels` distribution it depends on; with the repository
    root on sys.path (`python -m pytest`) that name would be guild's kernels/ folder, which guild itself only
    imports as guild.kernels. Where the distribution is installed, load it first with the root left out."""
    try:
        importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        return
    root, saved = Path(__file__).resolve().parent.parent, sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != root]
    try:
        importlib.import_module("kernels")
    except ImportError:  # a broken install: the oracle tests report it
        pass
    finally:
        sys.path[:] = saved


_installed_kernels_first()


@pytest.fixture(scope="session", autouse=True)
def _cache_dir():
    """guild's cache (the upcycled MoE, repack files) in a directory of this run, removed at its end: nothing lands
    in the user's cache or stays behind (building the MoE takes seconds). A GUILD_CACHE_DIR set by the caller is
    used and kept."""
    own = "GUILD_CACHE_DIR" not in os.environ
    if own:
        os.environ["GUILD_CACHE_DIR"] = tempfile.mkdtemp(prefix="guild-test-cache-")
    yield os.environ["GUILD_CACHE_DIR"]
    if own:
        shutil.rmtree(os.environ.pop("GUILD_CACHE_DIR"), ignore_errors=True)


@pytest.fixture
def fixed_clock(monkeypatch):
    """Fixed times: the session's clock advances 1 ms a read (every window costs the same whatever its T), and the
    returned clock, for the adaptive drafter, stands still (asking drafters is free): the scheduler's choices then
    rest on acceptance alone, so adaptive cells are the same on every machine and load."""
    import guild.engine.session as session

    tick = itertools.count()

    def clock():
        return next(tick) * 1e-3

    monkeypatch.setattr(session, "time", types.SimpleNamespace(perf_counter=clock))
    return lambda: 0.0


@pytest.fixture
def threads():
    """Set Numba's thread count inside a test and restore it afterwards."""
    before = numba.get_num_threads()
    yield numba.set_num_threads
    numba.set_num_threads(before)


@pytest.fixture(scope="session")
def dense_path():
    from guild.upcycle import embedded_dense_path

    return str(embedded_dense_path())


@pytest.fixture(scope="session")
def moe_path(_cache_dir):
    from guild.upcycle import ensure_embedded_moe

    # concurrent test runs (two checkouts, or parallel workers) share the cache directory: one builds the MoE
    Path(_cache_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(_cache_dir) / ".moe.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return str(ensure_embedded_moe(progress=False))


@pytest.fixture(scope="session")
def dense_model(dense_path):
    from guild.models import load_model

    return load_model(dense_path)


@pytest.fixture(scope="session")
def moe_model(moe_path):
    from guild.models import load_model

    return load_model(moe_path)


# -- the `gpu` marker is honest ------------------------------------------------------------------------------
# A test that runs guild's GPU path (the fake device: HostBackend.fake_device, directly, through GUILD_FAKE_GPU or
# through a fixture that made one; or the CUDA emulator) must carry the `gpu` marker, so that `-m "not gpu"`
# leaves out the whole GPU path. Counted at run time: helpers and fixtures are seen through, as a grep would not.
_gpu_uses = [0]
_gpu_fixtures: set[int] = set()  # id() of the fixture definitions whose setup made a fake device


def _count_gpu_uses() -> None:
    from guild.engine.backends.host import HostBackend
    from tests import cuda_emu

    made = HostBackend.fake_device.__func__

    def fake_device(cls, *a, **kw):
        _gpu_uses[0] += 1
        return made(cls, *a, **kw)

    HostBackend.fake_device = classmethod(fake_device)
    emu_init = cuda_emu.Emulator.__init__

    def emulator(self, *a, **kw):
        _gpu_uses[0] += 1
        emu_init(self, *a, **kw)

    cuda_emu.Emulator.__init__ = emulator


def pytest_configure(config):
    _count_gpu_uses()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    before = _gpu_uses[0]
    try:
        return (yield)
    finally:
        if _gpu_uses[0] > before:
            _gpu_fixtures.add(id(fixturedef))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._gpu_uses_before = _gpu_uses[0]
    item._fake_gpu_env = os.environ.get("GUILD_FAKE_GPU", "")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    defs = getattr(item, "_fixtureinfo", None)
    via_fixture = defs is not None and any(id(fd) in _gpu_fixtures for fds in defs.name2fixturedefs.values()
                                           for fd in fds)
    env = os.environ.get("GUILD_FAKE_GPU", "")
    used = _gpu_uses[0] > item._gpu_uses_before or via_fixture or (env != item._fake_gpu_env and env not in ("", "0"))
    if used and item.get_closest_marker("gpu") is None:
        pytest.fail(f"{item.nodeid} runs the GPU path (fake device or CUDA emulator) without the `gpu` marker",
                    pytrace=False)
    return result
