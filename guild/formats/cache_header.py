"""What the repack cache's files share with the store that manages them: where they live, the trailer and
header framing (guild/formats/repack_cache.py's module docstring), and the error of a file that must not be used."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import platformdirs

MAGIC = b"GUILDRPK"
_TRAILER = struct.Struct("<QQ32s8s")
MAX_HEADER = 1 << 28  # bytes of JSON header accepted (a 10k-matrix model needs ~1 MB)


class StaleCache(Exception):
    """A cache file that must not be used (the message says why); it is rebuilt."""


def cache_root() -> Path:
    """guild's user cache directory: $GUILD_CACHE_DIR, else the platform's user cache dir for guild."""
    root = os.environ.get("GUILD_CACHE_DIR")
    return Path(root or platformdirs.user_cache_dir("guild")).expanduser()


def read_header(f, size: int) -> tuple[dict, int]:
    """(the JSON header, its offset) of the cache file open as f (`size` bytes), its trailer and checksum checked;
    StaleCache if they do not hold."""
    if size < len(MAGIC) + _TRAILER.size:
        raise StaleCache(f"truncated ({size} bytes)")
    f.seek(size - _TRAILER.size)
    h_off, h_len, h_sha, magic = _TRAILER.unpack(f.read(_TRAILER.size))
    f.seek(0)
    if f.read(len(MAGIC)) != MAGIC or magic != MAGIC:
        raise StaleCache("not a guild repack cache, or truncated (no trailer)")
    if h_len > MAX_HEADER or h_off < len(MAGIC) or h_off + h_len + _TRAILER.size != size:
        raise StaleCache("truncated or extended (header extent does not match the file size)")
    f.seek(h_off)
    raw = f.read(h_len)
    if hashlib.sha256(raw).digest() != h_sha:
        raise StaleCache("header checksum mismatch")
    try:
        hdr = json.loads(raw)
    except (ValueError, RecursionError):
        raise StaleCache("header is not JSON") from None
    if not isinstance(hdr, dict):
        raise StaleCache("header is not an object")
    return hdr, h_off
