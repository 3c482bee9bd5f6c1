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
    """A clock that advances 1 ms a read, for the session's timings and (passed to it) the adaptive drafter's: the
    scheduler's choices then rest on acceptance alone, so adaptive cells are the same on every machine and load."""
    import guild.engine.session as session

    tick = itertools.count()

    def clock():
        return next(tick) * 1e-3

    monkeypatch.setattr(session, "time", types.SimpleNamespace(perf_counter=clock))
    return clock


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
