"""Files written whole or not at all: a temporary name beside the target, fsynced, renamed into place on
success (rename(2) is atomic within a filesystem), the directory fsynced after. The one writer for guild/.

Temporaries are `.NAME.PID.RANDOM.part`; one left by a killed writer (kill -9 runs no cleanup) is removed at
the next write of the same target, once its PID is gone. SIGTERM during a write raises SystemExit so the
temporary is removed on the way out, as it is on SIGINT and on any exception."""

from __future__ import annotations

import errno
import os
import re
import secrets
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import GuildError


def temp_beside(path: Path) -> Path:
    """A unique hidden `.NAME.PID.RANDOM.part` in path's directory (same filesystem: the rename is atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.part")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, another user's
    return True


def remove_stale(path: Path) -> list[Path]:
    """Temporaries of `path` whose writer is gone: `.NAME.PID.*.part` of dead PIDs, and `.NAME.*.tmp` (the
    temporaries of older guild versions' plan writer). Returns what was removed."""
    path = Path(path)
    pat = re.compile(re.escape(f".{path.name}.") + r"(?:(\d+)\.[0-9a-f]+\.part|[^/]*\.tmp)\Z")
    gone = []
    try:
        entries = list(os.scandir(path.parent if str(path.parent) else "."))
    except OSError:
        return gone
    for e in entries:
        m = pat.match(e.name)
        if m is None or (m.group(1) is not None and _alive(int(m.group(1)))):
            continue
        try:
            os.unlink(e.path)
            gone.append(Path(e.path))
        except OSError:
            pass
    return gone


def _unlink_quietly(p: Path) -> None:
    try:
        p.unlink(missing_ok=True)
    except OSError:  # e.g. EROFS: the error being raised already says what went wrong
        pass


@contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM raises SystemExit while the block runs (main thread only), so `finally` clauses run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _fsync_path(p: Path, directory: bool = False) -> None:
    fd = os.open(p, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):  # some filesystems cannot fsync a directory
            raise
    finally:
        os.close(fd)


def check_writable(path: str | os.PathLike, what: str, error: type[GuildError] = GuildError) -> Path:
    """Before a long job: the directory of `path` exists (or can be made) and accepts a new file; `path` is
    not a directory. Raises `error` naming the flag or file."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{what} {path}: is a directory, expected a file")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = temp_beside(path)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise error(f"{what} {path}: cannot write there ({e.strerror or e})") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise error(f"{what} {path}: not writable")
    return path


@contextmanager
def atomic_path(path: str | os.PathLike, what: str, error: type[GuildError] = GuildError) -> Iterator[Path]:
    """Yields a temporary path to write; on success it is fsynced and replaces `path`, on any error (or SIGINT/
    SIGTERM) it is removed, and an OSError becomes a one-line `error` naming `what` was being written."""
    path = Path(path)
    remove_stale(path)
    tmp = temp_beside(path)
    try:
        with _sigterm_exits():
            yield tmp
            _fsync_path(tmp)
            os.replace(tmp, path)
        try:
            _fsync_path(path.parent if str(path.parent) else Path("."), directory=True)
        except OSError:
            pass  # the rename happened; only its durability on power loss is less certain
    except OSError as e:
        raise error(f"{path}: cannot write {what} ({e.strerror or e})") from None
    finally:
        _unlink_quietly(tmp)


def read_capped(path: str | os.PathLike, limit: int, what: str, error: type[GuildError] = GuildError) -> bytes:
    """A whole file of at most `limit` bytes, reading no further (a FIFO or /dev/zero stops here too)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"{what}: cannot read ({e.strerror or e})") from None
    if len(data) > limit:
        raise error(f"{what}: over {limit >> 20} MiB")
    return data


def write_bytes(path: str | os.PathLike, data: bytes, what: str, error: type[GuildError] = GuildError,
                mode: int = 0o666) -> Path:
    """`data` to `path` atomically (permissions `mode` less the umask, as open() would make them)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"{path}: cannot write {what} ({e.strerror or e})") from None
    with atomic_path(path, what, error) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return path
