"""Files guild builds into the user cache (the upcycled MoE) verified before reuse: size and SHA-256 recorded
beside the file when it was built (`.NAME.sha256`, one JSON line), checked on reuse. A file whose size or
modification time differs from the record is hashed again; a wrong one is rebuilt, not trusted."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..errors import GuildError
from .files import write_bytes
from .gguf_check import check_index


def record_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.sha256")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def record(path: Path) -> Path:
    """After a build: remember size, mtime and digest (written atomically; a failure leaves no record)."""

    st = path.stat()
    rec = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _digest(path)}
    write_bytes(record_path(path), (json.dumps(rec) + "\n").encode(), "the cache record")
    return path


def verified(path: Path) -> bool:
    """Whether a cached build can be reused. No record (a cache from before records): the GGUF index must fit
    the file (a truncated file fails), and a record is made now."""
    try:
        st = path.stat()
        rec = json.loads(record_path(path).read_text())
    except FileNotFoundError:
        try:
            check_index(os.fspath(path))
        except (GuildError, OSError):
            return False
        try:
            record(path)
        except (GuildError, OSError):
            pass  # a read-only cache: still usable, verified by its index
        return True
    except (OSError, ValueError):
        return False
    if not isinstance(rec, dict) or rec.get("size") != st.st_size:
        return False
    if rec.get("mtime_ns") == st.st_mtime_ns:
        return True
    return rec.get("sha256") == _digest(path)
