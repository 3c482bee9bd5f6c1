"""The repack cache as a store the user manages: what it holds, its size limit, and eviction.

Each entry is one `.rpk` file of guild.formats.repack_cache, whose header names the GGUF it was made from (path,
size, modification time). An entry is an *orphan* when that GGUF is gone or has changed since (its cache can
never be used again). Its last use is the file's modification time, set at every load that maps it.

The limit is `--cache-max` (run, serve, chat), else `GUILD_CACHE_MAX` (`guild cache prune --max`): a size such
as `40G`, `512M` or `none`; by default half of what the cache directory's disk could hold for it (its free space
plus what the cache already takes).
Before a new entry is written, orphans go first, then the least recently used entries, until the new one fits
under the limit; one larger than the limit alone is not cached (the model is repacked into memory).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadFlagError, GuildError
from .cache_header import StaleCache, cache_root, read_header

log = logging.getLogger(__name__)

ENV_MAX = "GUILD_CACHE_MAX"
FLAG_MAX = "--cache-max"
_FLAG_VALUE: list[str | None] = [None]  # this process's --cache-max, over the environment's GUILD_CACHE_MAX
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class CacheSpaceError(GuildError):
    """Not enough disk for a model's repack cache, even after eviction."""


@dataclass(frozen=True)
class Entry:
    path: Path  # the .rpk file
    size: int  # bytes on disk
    last_used: float  # seconds since the epoch
    source: str | None  # the GGUF it was made from (None: an entry of an older guild, or unreadable)
    orphan: bool  # that GGUF is gone or changed: the entry can never be used again

    def as_dict(self) -> dict:
        return {"path": str(self.path), "bytes": self.size, "last_used": self.last_used, "source": self.source,
                "orphan": self.orphan}


def parse_size(text: str, what: str = ENV_MAX) -> int | None:
    """'40G', '512M', '1.5T', '123456' (bytes) → bytes; 'none' / 'unlimited' → None (no limit)."""
    t = str(text).strip().upper()
    if t in ("NONE", "UNLIMITED"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?", t)
    if m is None:
        raise BadFlagError(f"{what}: '{text}' is not a size (e.g. 40G, 512M, none)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def set_limit(text: str | None) -> None:
    """The limit of this process's loads (the --cache-max flag; checked here), over GUILD_CACHE_MAX; None: the
    environment's again."""
    if text is not None:
        parse_size(text, FLAG_MAX)
    _FLAG_VALUE[0] = text


def _setting() -> tuple[str | None, str]:
    """(the limit as given, where it was given): --cache-max, else GUILD_CACHE_MAX, else (None, "")."""
    if _FLAG_VALUE[0] is not None:
        return _FLAG_VALUE[0], FLAG_MAX
    env = os.environ.get(ENV_MAX)
    return (env, ENV_MAX) if env else (None, "")


def directory() -> Path:
    return cache_root() / "repack"


def entries() -> list[Entry]:
    """The store's entries, least recently used first."""
    out = []
    try:
        files = [e for e in os.scandir(directory()) if e.name.endswith(".rpk") and e.is_file()]
    except OSError:
        return out
    for e in files:
        try:
            st = e.stat()
        except OSError:
            continue
        out.append(Entry(Path(e.path), st.st_size, st.st_mtime, *_source(Path(e.path), st.st_size)))
    return sorted(out, key=lambda x: x.last_used)


def _source(path: Path, size: int) -> tuple[str | None, bool]:
    """(the GGUF an entry was made from, whether it is an orphan)."""
    try:
        with open(path, "rb") as f:
            hdr, _ = read_header(f, size)
    except (OSError, StaleCache):
        return None, True  # unreadable or damaged: no load will ever use it
    src = hdr.get("source") if isinstance(hdr.get("source"), dict) else {}
    p = src.get("path")
    if not isinstance(p, str):
        return None, False  # an older guild's entry: its GGUF is unknown, it goes by last use
    try:
        st = os.stat(p)
    except OSError:
        return p, True
    return p, (st.st_size, st.st_mtime_ns) != (src.get("size"), src.get("mtime_ns"))


def used_bytes(es: list[Entry] | None = None) -> int:
    return sum(e.size for e in (entries() if es is None else es))


def limit(es: list[Entry] | None = None) -> int | None:
    """The store's size limit in bytes (None: none): --cache-max, else GUILD_CACHE_MAX, else half of free space +
    what it holds."""
    text, what = _setting()
    if text:
        return parse_size(text, what)
    d = directory()
    while not d.exists() and d != d.parent:
        d = d.parent
    try:
        free = shutil.disk_usage(d).free
    except OSError:
        return None
    return (free + used_bytes(es)) // 2


def touch(path: Path) -> None:
    """Record a use of an entry (its modification time: now)."""
    try:
        os.utime(path)
    except OSError:
        pass


def remove(e: Entry, why: str) -> bool:
    try:
        e.path.unlink()
    except FileNotFoundError:
        return False
    except OSError as err:
        log.warning("repack cache %s not removed (%s)", e.path, err.strerror or err)
        return False
    log.info("repack cache: removed %s (%s, %.2f GB)", e.path.name, why, e.size / 1e9)
    return True


def prune(need: int = 0, keep: Path | None = None, max_bytes: int | None | str = "env") -> list[Entry]:
    """Remove orphans, then the least recently used entries until `need` more bytes fit under the limit
    (`max_bytes`, default `limit()`). `keep`: an entry never removed (the one being loaded). Returns what went."""
    es = [e for e in entries() if keep is None or e.path != keep]
    cap = limit(es) if max_bytes == "env" else max_bytes
    gone = [e for e in es if e.orphan and remove(e, "orphan: its GGUF is gone or changed")]
    left = [e for e in es if not e.orphan]
    total = used_bytes(left)
    for e in left:
        if cap is None or total + need <= cap:
            break
        if remove(e, "least recently used"):
            gone.append(e)
            total -= e.size
    return gone


def fits(need: int) -> bool:
    """Whether an entry of `need` bytes may be cached at all (not larger than the limit alone)."""
    cap = limit()
    return cap is None or need <= cap


def describe_limit() -> str:
    cap = limit()
    how = _setting()[1] or "half of the disk's room for it; set --cache-max or GUILD_CACHE_MAX"
    return "none" if cap is None else f"{cap / 1e9:.1f} GB, {how}"


def since(t: float) -> str:
    """'3 min ago', '2 h ago', '5 d ago'."""
    s = max(0.0, time.time() - t)
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= n:
            return f"{s / n:.0f} {unit} ago"
    return "just now"
