"""Files written whole or not at all: a temporary name beside the target, renamed into place on success."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import GuildError


def temp_beside(path: Path) -> Path:
    """A unique hidden `.NAME.PID.RANDOM.part` in path's directory (same filesystem: the rename is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.part")


@contextmanager
def atomic_path(path: str | os.PathLike, what: str) -> Iterator[Path]:
    """Yields a temporary path to write; on success it replaces `path`, on any error it is removed and an
    OSError becomes a one-line GuildError naming `what` was being written."""
    path = Path(path)
    tmp = temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        raise GuildError(f"{path}: cannot write {what} ({e.strerror or e})") from None
    finally:
        tmp.unlink(missing_ok=True)
