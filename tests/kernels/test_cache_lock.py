"""Numba's on-disk cache saved under a lock (kernels/cpu/cache_lock.py): processes saving different signatures of
one function at once keep every entry, each naming its own data."""

import fcntl
import os
import subprocess
import sys
import textwrap

from numba.core import caching

from guild.kernels.cpu import cache_lock

# a child process: `n` saves of its own keys into one function's cache, each a few ms apart
_WRITER = textwrap.dedent("""
    import sys, time
    from numba.core import caching
    if sys.argv[3] == "locked":
        from guild.kernels.cpu import cache_lock  # noqa: F401
    f = caching.IndexDataCacheFile(sys.argv[1], "fn", "stamp")
    tag = sys.argv[2]
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    for i in range(40):
        f.save((tag, i), f"{tag}-{i}")
""")


def _race(tmp_path, mode):
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), tag, mode], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for tag in ("a", "b", "c")]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        assert p.wait(timeout=120) == 0
    f = caching.IndexDataCacheFile(str(tmp_path), "fn", "stamp")
    index = f._load_index()
    return {key: f.load(key) for key in index}, index


def test_concurrent_saves_keep_every_entry_with_its_own_data(tmp_path):
    entries, index = _race(tmp_path, "locked")
    assert len(entries) == 120  # no save lost its index entry to another process's
    assert all(data == f"{tag}-{i}" for (tag, i), data in entries.items())
    assert len(set(index.values())) == 120


def test_the_data_is_on_disk_before_the_index_names_it_and_the_save_holds_the_lock(tmp_path, monkeypatch):
    f = caching.IndexDataCacheFile(str(tmp_path), "fn", "stamp")
    seen = []
    save_data = caching.IndexDataCacheFile._save_data

    def spy(self, name, data):
        save_data(self, name, data)
        seen.append(name in self._load_index().values())  # the index does not name the file yet
        with open(os.path.join(self._cache_path, cache_lock.LOCK_NAME), "a+b") as other:  # another open: another owner
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append("unlocked")
            except BlockingIOError:
                seen.append("locked")

    monkeypatch.setattr(caching.IndexDataCacheFile, "_save_data", spy)
    f.save("k", "v")
    assert seen == [False, "locked"]
    assert f.load("k") == "v"
