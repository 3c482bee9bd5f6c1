"""Numba's on-disk kernel cache, safe for several processes compiling at once (parallel test workers, the
compile helper of a cold start, the fuzz workers).

Numba saves a compiled overload by reading the function's index, picking the first free data file name, writing
the index, then the data. Two processes saving different signatures of one function in the same moment both pick
`<name>.1.nbc`: the index then names one signature and the file may hold the other's code, which a later run
loads as the wrong function. Here a save holds an exclusive lock on the cache directory (flock, one lock file per
directory) from reading the index to writing it, and writes the data before the index entry that names it, so a
reader never finds an entry whose file is missing or another's."""

from __future__ import annotations

import itertools
import os

from numba.core import caching

try:
    import fcntl
except ImportError:  # not POSIX: Numba's own save, unlocked
    fcntl = None

LOCK_NAME = "guild-numba-cache.lock"


def _locked_save(self, key, data) -> None:
    with open(os.path.join(self._cache_path, LOCK_NAME), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        overloads = self._load_index()
        name = overloads.get(key)
        if name is None:
            taken = set(overloads.values())
            name = next(n for n in map(self._data_name, itertools.count(1)) if n not in taken)
        self._save_data(name, data)
        if overloads.get(key) != name:
            overloads[key] = name
            self._save_index(overloads)


def install() -> None:
    """Replace IndexDataCacheFile.save in this process (idempotent)."""
    if fcntl is not None and caching.IndexDataCacheFile.save is not _locked_save:
        caching.IndexDataCacheFile.save = _locked_save


install()
