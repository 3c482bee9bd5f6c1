"""What a process loads on first use — Numba overloads, Jinja template compilations, modules — for tests that
send a first request in a fresh process and assert that the warm-up left it nothing to load."""

import gc
import sys

import jinja2

_compiled = [0]
_compile = jinja2.Environment.compile


def _counted(self, *args, **kwargs):
    _compiled[0] += 1
    return _compile(self, *args, **kwargs)


def watch() -> None:
    """Count Jinja compilations from here on (before anything renders a template)."""
    jinja2.Environment.compile = _counted


def snapshot() -> dict:
    from numba.core.registry import CPUDispatcher

    return {"kernels": {f"{d.py_func.__module__}.{d.py_func.__name__}": len(d.overloads)
                        for d in gc.get_objects() if isinstance(d, CPUDispatcher)},
            "compiled": _compiled[0], "modules": set(sys.modules)}


def since(before: dict) -> dict:
    """What was loaded after the snapshot `before`, as JSON."""
    now = snapshot()
    return {"kernels": sorted(k for k, n in now["kernels"].items() if n != before["kernels"].get(k)),
            "compiled": now["compiled"] - before["compiled"],
            "modules": sorted(now["modules"] - before["modules"])}


def read_from_cache() -> dict:
    """The kernels this process read from Numba's on-disk cache (`hit`) and those it compiled (`missed`)."""
    from numba.core.registry import CPUDispatcher

    ds = [d for d in gc.get_objects() if isinstance(d, CPUDispatcher)]
    name = lambda d: f"{d.py_func.__module__}.{d.py_func.__name__}"  # noqa: E731
    return {"hit": sorted(name(d) for d in ds if sum(d.stats.cache_hits.values())),
            "missed": sorted(name(d) for d in ds if sum(d.stats.cache_misses.values()))}
