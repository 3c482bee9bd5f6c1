"""The repacked weights of a model, cached on disk and memory-mapped, so that a model loads in bounded memory and
its second load costs little more than opening the file.

The first load of a GGUF repacks each matrix (kernels.cpu.quant.pack) and streams the packed arrays into a cache
file, releasing the GGUF's pages as it goes (GGUFFile.release): the process never holds the repacked copy and
the file's pages at once. The file is written atomically (guild.formats.files); every load then reads it into
memory (guild.formats.resident: when it fits the memory budget, for decode speed; the first load keeps the
packed arrays it wrote instead: repack_writer.py) or maps it (--mmap, a model too large, experts streamed by the
expert cache), and builds the model on views of it. Mapped, resident memory is about one copy of the weights,
in pages of the cache file that the kernels touched, which the kernel can drop and read back like any file page.

Where: `$GUILD_CACHE_DIR/repack/` (else the platform user cache dir), one file per model, named by the model's
identity digest (SHA-256 of the GGUF's header, metadata and tensor index: GGUFFile.identity_digest).

Format (little-endian): b"GUILDRPK", then the packed arrays (each at a 64-byte aligned offset), then a JSON
header, then a trailer: u64 header offset, u64 header length, the header's SHA-256 (32 bytes), b"GUILDRPK".
The header records the cache format, a digest of the code that fixes the packed layout and the order in
which a model packs its matrices (`layout_digest`), the source's identity digest, size and modification time,
and per matrix its quant type, shape and array offsets.

A cache is used only when all of that matches the file being loaded and this code, the trailer and header are
intact, the file is exactly as long as recorded, and every array lies inside the data section with the dtype
and shape the codec table gives (`quant.layout`); the kernels' activation order is derived, never read. A
cache that fails any check (stale: the GGUF changed; truncated; foreign: another model's, another version's,
or not a cache at all) is rebuilt, never used. What the check does not read are the packed bytes themselves:
like a GGUF's quantised blocks, any bytes there are valid input for the kernels (a non-finite value shows as
a NumericsError at run time).

`GUILD_REPACK_CACHE=0` turns the cache off (the model is repacked into memory, the file's pages still
released). A cache directory that cannot be written (read-only, full) also falls back to that.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import math
import mmap
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from ..engine.memory import available_memory
from ..errors import GuildError
from ..kernels.cpu import quant
from ..kernels.cpu.quant import KINDS, PackedMatrix, current_numerics, layout, pack_checked
from ..kernels.cpu.quant import pack as repack
from . import cache_store, resident
from .cache_header import _TRAILER, MAGIC, StaleCache, cache_root, read_header
from .files import atomic_path
from .finite import ScaleLedger
from .gguf import GGUFFile
from .repack_writer import ALIGN, _pwrite_all, packed_views, place
from .repack_writer import Progress as _Progress
from .repack_writer import Recorder as _Recorder

log = logging.getLogger(__name__)

FORMAT = 1
ENV_SWITCH = "GUILD_REPACK_CACHE"

# Source files that decide the packed bytes or the order in which a model packs its matrices: a change to any
# of them retires every cache made before it (a change to this module's file format bumps FORMAT).
# (the int8 path: its geometry and packers, not its kernels, whose tuning leaves the bytes as they are)
_LAYOUT_SOURCES = ("kernels/cpu/codecs.py", "kernels/cpu/quant.py", "kernels/cpu/qdot/types.py",
                   "kernels/cpu/qdot/pack.py", "kernels/cpu/qdot/packers.py", "kernels/blocks.py",
                   "kernels/quant_types.py",
                   "kernels/cpu/drivers.py",
                   "guild/models/*.py")


class CacheWriteError(GuildError):
    """The cache could not be written (disk full, permissions): the model is repacked into memory instead."""


def cache_path(digest: str, numerics: str = "i8") -> Path:
    """One cache per model file and numeric mode (the modes pack some types differently)."""
    return cache_root() / "repack" / f"{digest}{'' if numerics == 'i8' else '.' + numerics}.rpk"


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "no", "off", "false")


@lru_cache(maxsize=1)
def layout_digest() -> str:
    """SHA-256 over FORMAT and the sources that fix the cache's contents (see _LAYOUT_SOURCES)."""
    pkg = Path(__file__).resolve().parent.parent  # guild/
    roots = {"guild": pkg, "kernels": Path(quant.__file__).resolve().parent.parent}
    h = hashlib.sha256(f"guild-repack/{FORMAT}".encode())
    for pattern in _LAYOUT_SOURCES:
        top, rest = pattern.split("/", 1)
        for p in sorted(roots[top].glob(rest)):
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _source_key(g: GGUFFile) -> dict:
    st = os.stat(g.path)
    return {"digest": g.identity_digest(), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


# While a loader runs, the models' `pack` (this one) hands each matrix to the loader's hook instead: the hook may
# return a matrix read from a cache, or repack and keep a copy. A context variable, so concurrent loads do not mix;
# the kernels' own pack (kernels.cpu.quant.pack) knows nothing of it.
_HOOK: ContextVar = ContextVar("guild_pack_hook", default=None)


@contextmanager
def pack_hook(hook) -> Iterator[None]:
    """Route every `pack` call of this context through hook(qtype, raw, n_rows, n_cols) while the block runs."""
    token = _HOOK.set(hook)
    try:
        yield
    finally:
        _HOOK.reset(token)


def pack(qtype: int, raw, n_rows: int, n_cols: int) -> PackedMatrix:
    """The models' packer: kernels.cpu.quant.pack, or this context's loader hook. `raw`: an array, or a sequence
    of arrays stacked along the rows (concatenated only if the matrix is repacked, not when a hook finds it in a
    cache)."""
    hook = _HOOK.get()
    if hook is not None:
        return hook(qtype, raw, n_rows, n_cols)
    return repack(qtype, raw, n_rows, n_cols)


pack.accepts_parts = True  # models.llama.fuse hands over its tensors' parts unconcatenated


# -- writing -------------------------------------------------------------------------------------------
def build(g: GGUFFile, path: Path, load_model, progress=None, threads: int | None = None, keep: bool = False):
    """Run `load_model(g)` once with every matrix repacked on `threads` threads (repack_writer.Recorder) and
    written into a new cache file at `path` (atomically: a temporary, renamed once whole). Returns None, or with
    `keep` the model of that pass, on the packed arrays in memory: those the file's data section holds, in one
    buffer as a read of the file would give it (resident.read_shared gives it to later loads of the file)."""
    progress = progress or (lambda n: None)
    key = _source_key(g)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CacheWriteError(f"{path.parent}: cannot create ({e.strerror or e})") from None
    if g.size <= available_memory() // 2:  # the kernel reads ahead at disk speed while the loader checks the file
        prefetch(g.path)
    buf = None
    if keep:  # the data section's length, from a pass that packs nothing
        end = len(MAGIC)
        numerics = current_numerics()

        def measure(qtype, raw, n_rows, n_cols):
            nonlocal end
            end = place(end, qtype, n_rows, n_cols, numerics)[2]

        _dry_run(g, load_model, measure)
        buf = resident.anonymous(end)
        buf[: len(MAGIC)] = np.frombuffer(MAGIC, np.uint8)
    with atomic_path(path, "the repack cache", CacheWriteError) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if buf is None:
                os.write(fd, MAGIC)
            rec = _Recorder(fd, g, progress, threads, buf, tmp)
            try:
                with pack_hook(rec), _scales_checked_by_pack(g) as ledger:
                    model = load_model(g)
                    rec.finish()
                    ledger.finish()
            finally:
                rec.close()
            header = json.dumps({"format": FORMAT, "layout": layout_digest(), "numerics": current_numerics(),
                                 "source": {**key, "path": str(Path(g.path).resolve())},
                                 "finite_checked": bool(g.finite_checked), "data_end": rec.pos,
                                 "matrices": rec.matrices}, separators=(",", ":")).encode()
            _pwrite_all(fd, memoryview(header + _TRAILER.pack(rec.pos, len(header), hashlib.sha256(header).digest(),
                                                              MAGIC)), rec.pos)
        finally:
            os.close(fd)
    if buf is None:
        return None
    resident.remember(path, buf)
    return model


@contextmanager
def _scales_checked_by_pack(g: GGUFFile) -> Iterator[ScaleLedger]:
    """While the block: the finite scan leaves g's quantised tensors to the packers (guild/formats/finite.py)."""
    ledger = ScaleLedger(g)
    g.scale_ledger = None if g.finite_checked else ledger
    try:
        yield ledger
    finally:
        g.scale_ledger = None


# -- reading -------------------------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def _sized_layout(q: int, n: int, k: int, numerics: str) -> tuple:
    return tuple((dt, shape, dt.itemsize * math.prod(shape)) for dt, shape in layout(q, n, k, numerics))


def _int(v, what: str, lo: int = 0, hi: int = 1 << 62) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise StaleCache(f"{what} is not an integer in {lo}..{hi}")
    return v


class CacheFile:
    """An opened, checked cache file (see the module docstring): `matrices` in pack order, mapped lazily."""

    def __init__(self, path: Path, key: dict, load: bool = False):
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise StaleCache("no cache yet") from None
        except OSError as e:
            raise StaleCache(f"cannot open ({e.strerror or e})") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            hdr, h_off = read_header(f, size)
            if hdr.get("format") != FORMAT:
                raise StaleCache(f"cache format {hdr.get('format')!r}, this guild writes {FORMAT}")
            if hdr.get("layout") != layout_digest():
                raise StaleCache("made by another version of guild's packing code")
            self.numerics = current_numerics()
            if hdr.get("numerics") != self.numerics:
                raise StaleCache(f"packed for numerics {hdr.get('numerics')!r}, this load uses {self.numerics!r}")
            src = hdr.get("source")
            if not isinstance(src, dict) or src.get("digest") != key["digest"]:
                raise StaleCache("foreign: made for another model file")
            if src.get("size") != key["size"] or src.get("mtime_ns") != key["mtime_ns"]:
                raise StaleCache("stale: the model file changed since the cache was made")
            data_end = _int(hdr.get("data_end"), "data_end")
            if data_end != h_off:
                raise StaleCache("data section does not end where the header starts")
            self.finite_checked = hdr.get("finite_checked") is True
            self.matrices = self._check_matrices(hdr.get("matrices"), data_end, self.numerics)
            self.loaded = load
            if load:  # read into the process's memory, on huge pages where it can (resident.py: faster decode)
                try:
                    self.buf = resident.read_shared(f.fileno(), data_end)
                except OSError as e:
                    raise StaleCache(f"cannot read ({e})") from None
            else:
                # copy-on-write: views are writeable (the kernels' compiled signatures take writeable arrays)
                # but nothing written would reach the file; pages are the file's until then
                self.buf = np.frombuffer(mmap.mmap(f.fileno(), data_end, access=mmap.ACCESS_COPY), np.uint8)
        self.path, self.size = path, size

    @staticmethod
    def _check_matrices(ms, data_end: int, numerics: str) -> list:
        if not isinstance(ms, list):
            raise StaleCache("matrix table missing")
        out = []
        for i, m in enumerate(ms):
            if not isinstance(m, list) or len(m) != 4 or not isinstance(m[3], list):
                raise StaleCache(f"matrix #{i}: malformed entry")
            q = _int(m[0], f"matrix #{i} type")
            if q not in KINDS:
                raise StaleCache(f"matrix #{i}: quant type {q} has no kernel")
            n, k = _int(m[1], f"matrix #{i} rows", 1, 1 << 31), _int(m[2], f"matrix #{i} columns", 1, 1 << 31)
            lay = _sized_layout(q, n, k, numerics)
            if len(m[3]) != len(lay):
                raise StaleCache(f"matrix #{i}: {len(m[3])} arrays, its type packs {len(lay)}")
            arrays = []
            for off, (dt, shape, nbytes) in zip(m[3], lay, strict=True):
                off = _int(off, f"matrix #{i} offset")
                if off % ALIGN or off < len(MAGIC) or off + nbytes > data_end:
                    raise StaleCache(f"matrix #{i}: array at {off} ({nbytes} bytes) outside the data section")
                arrays.append((off, dt, shape, nbytes))
            out.append((q, n, k, arrays))
        return out

    def views(self, i: int) -> PackedMatrix:
        q, n, k, arrays = self.matrices[i]
        return packed_views(self.buf, q, n, k, [a[0] for a in arrays], self.numerics)


class _Replayer:
    """The pack hook of a cached load: the i-th pack call gets the cache's i-th matrix, if its type and shape
    are the ones asked for (else the cache is stale)."""

    def __init__(self, cache: CacheFile):
        self.cache, self.i = cache, 0

    def __call__(self, qtype, raw, n_rows, n_cols):
        ms = self.cache.matrices
        if self.i >= len(ms):
            raise StaleCache(f"the model packs more matrices than the cache holds ({len(ms)})")
        q, n, k, _ = ms[self.i]
        if (q, n, k) != (int(qtype), int(n_rows), int(n_cols)):
            raise StaleCache(f"matrix #{self.i} is {q}:{n}x{k} in the cache, the model asks for "
                             f"{int(qtype)}:{n_rows}x{n_cols}")
        self.i += 1
        return self.cache.views(self.i - 1)


# -- loading -------------------------------------------------------------------------------------------
def _free_bytes(d: Path) -> int:
    try:
        return shutil.disk_usage(d).free
    except OSError:
        return 0


def load_cached(g: GGUFFile, load_model, progress: bool = False, read_ahead: bool = True):
    """`load_model(g)` (models.load_model), the matrices mapped from g's repack cache, built first if needed.
    Returns (model, how): how is "cache" (mapped from an existing cache), "built" (cache written now, then
    mapped; or, read into memory anyway, kept as packed) or "memory" (repacked into memory: cache off or not
    writable). read_ahead: `prefetch` the file (not for a model whose experts an expert cache will read: the
    file may not fit in memory); a model that reads ahead and fits the memory budget is read into memory rather
    than mapped (resident.py)."""
    weights = sum(t.data.nbytes for t in g.tensors.values())
    load = read_ahead and resident.wanted(weights)
    if not enabled():
        return _in_memory(g, load_model, progress, weights), "memory"
    key = _source_key(g)
    path = cache_path(key["digest"], current_numerics())
    built = False
    while True:
        try:
            model = _replay(g, CacheFile(path, key, load), load_model, read_ahead and not load)
            cache_store.touch(path)  # its last use, for eviction
            return model, ("built" if built else "cache")
        except StaleCache as e:
            if built:
                raise GuildError(f"{path}: the repack cache just written does not read back ({e})") from None
            log.info("repack cache %s: %s; rebuilding", path, e)
        if not cache_store.fits(weights):
            log.warning("%s: its repacked copy (%.1f GB) is larger than the repack cache's limit (%s); repacking "
                        "into memory", Path(g.path).name, weights / 1e9, cache_store.describe_limit())
            return _in_memory(g, load_model, progress, weights), "memory"
        if not _writable(path):
            return _in_memory(g, load_model, progress, weights), "memory"
        cache_store.prune(weights, keep=path)  # orphans, then the least recently used, until it fits the limit
        need, free = int(weights * 1.1) + (256 << 20), _free_bytes(path.parent)
        if free < need:
            raise cache_store.CacheSpaceError(
                f"{Path(g.path).name}: its repack cache needs {need / 1e9:.1f} GB at {path.parent}, "
                f"{free / 1e9:.1f} GB free; free space there (guild cache prune), point "
                "GUILD_CACHE_DIR elsewhere, or set GUILD_REPACK_CACHE=0 to repack into memory")
        bar = _Progress(progress, weights, f"repacking {Path(g.path).name}")
        try:  # a model read into memory anyway is kept as packed, not read back from the file just written
            model = build(g, path, load_model, bar, keep=load)
        except CacheWriteError as err:  # the model's own errors (validation) propagate as they are
            log.warning("repack cache %s not written (%s); repacking into memory", path, err)
            return _in_memory(g, load_model, progress, weights), "memory"
        finally:
            bar.close()
        _fadvise(g.path, "POSIX_FADV_DONTNEED")  # the GGUF's pages, read once, would crowd out the cache's
        if model is not None:  # no touch: the file's time is its writing's, and resident.remember's key
            if path.stat().st_size <= available_memory() // 2:  # written past the page cache (O_DIRECT): the
                # disk reads it back in while this process runs, so that the next load reads memory, as before
                threading.Thread(target=_fadvise, args=(path, "POSIX_FADV_WILLNEED", False, _WILLNEED_STEP),
                                 daemon=True, name="guild-prefetch").start()
            return model, "built"
        built = True


def _replay(g: GGUFFile, cache: CacheFile, load_model, read_ahead: bool = True):
    if cache.finite_checked:
        g.finite_checked = True
    rep = _Replayer(cache)
    with pack_hook(rep):
        model = load_model(g)
    if rep.i != len(cache.matrices):
        raise StaleCache(f"the model packs {rep.i} matrices, the cache holds {len(cache.matrices)}")
    if read_ahead:
        prefetch(cache.path)
    return model


_WILLNEED_STEP = 128 << 10  # Linux reads at most the device's read-ahead (128 KiB by default) per WILLNEED call


def _fadvise(path, advice: str, wait_read: bool = False, step: int = 0) -> None:
    """posix_fadvise over a whole file (where the platform has it), in calls of `step` bytes if given; with
    wait_read, read it through instead."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        if wait_read:
            buf = bytearray(16 << 20)
            with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
        elif step and hasattr(os, advice):  # each call queues its reads and returns
            for off in range(0, os.fstat(fd).st_size, step):
                os.posix_fadvise(fd, off, step, getattr(os, advice))
        elif hasattr(os, advice):
            os.posix_fadvise(fd, 0, 0, getattr(os, advice))
    except OSError:
        pass
    finally:
        os.close(fd)


def prefetch(path, wait: bool = False) -> None:
    """Bring a cache file into the page cache, so that the first windows do not fault expert pages in from
    disk one by one (a first pass of a 6.4 GB model's experts at random: tokens per second collapse until the
    pages are in). By default the kernel is asked to read ahead (POSIX_FADV_WILLNEED) from a background thread
    and the load returns at once; with `wait` the file is read through here (benchmarks, before timing).
    Neither maps pages into this process: resident memory grows only as the kernels touch the weights."""
    if wait:
        _fadvise(path, "", wait_read=True)
    else:
        threading.Thread(target=_fadvise, args=(path, "POSIX_FADV_WILLNEED"), daemon=True,
                         name="guild-prefetch").start()


def _writable(path: Path) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path.parent, os.W_OK)


def _in_memory(g: GGUFFile, load_model, progress: bool, weights: int):
    """The model repacked into memory, the GGUF's pages released after each matrix."""
    bar = _Progress(progress, weights, f"repacking {Path(g.path).name}")

    def hook(qtype, raw, n_rows, n_cols):
        pm, bad = pack_checked(qtype, raw, n_rows, n_cols)
        parts = raw if isinstance(raw, (list, tuple)) else (raw,)
        if g.scale_ledger is not None:
            g.scale_ledger.packed(parts, bad)
        g.release(*parts)
        bar(sum(np.asarray(p).nbytes for p in parts))
        return pm

    try:
        with pack_hook(hook), _scales_checked_by_pack(g) as ledger:
            model = load_model(g)
            ledger.finish()
            return model
    finally:
        bar.close()


def _dry_run(g: GGUFFile, load_model, hook) -> None:
    """`load_model(g)` with `hook` as its packer (it packs nothing) and the finite scan skipped (a load does it):
    the quantised weights are not read."""
    was, g.finite_checked = g.finite_checked, True
    try:
        with pack_hook(hook):
            load_model(g)
    finally:
        g.finite_checked = was


def survey(g: GGUFFile, load_model) -> dict:
    """What a load of g repacks under this process's numerics, found by running the loader with a hook that packs
    nothing: the matrices, their bytes in the cache per layout (why: the int8 path's tiles where the type has int8
    kernels, else the fp32 dequant-dot tiles), and the tensors used from the GGUF's bytes as they are. The finite
    scan is skipped (a load does it), so the quantised weights are not read."""
    spans = sorted((t.data.__array_interface__["data"][0], t.data.nbytes, n) for n, t in g.tensors.items())
    starts = [s for s, _, _ in spans]
    packed: set[str] = set()
    layouts: dict[str, dict] = {}

    def hook(qtype, raw, n_rows, n_cols):
        for p in raw if isinstance(raw, (list, tuple)) else (raw,):
            at = np.asarray(p).__array_interface__["data"][0]  # a view into the mapped file: which tensor's
            i = bisect.bisect_right(starts, at) - 1
            if i >= 0 and at < starts[i] + spans[i][1]:
                packed.add(spans[i][2])
        mode = quant.numerics_for(qtype)
        nbytes = sum(nb for _, _, nb in _sized_layout(int(qtype), int(n_rows), int(n_cols), mode))
        kind = layouts.setdefault("int8 tiles" if mode == "i8" else "fp32 dequant-dot tiles",
                                  {"matrices": 0, "bytes": 0, "types": {}})
        kind["matrices"] += 1
        kind["bytes"] += nbytes
        name = GGMLQuantizationType(int(qtype)).name
        kind["types"][name] = kind["types"].get(name, 0) + 1

    _dry_run(g, load_model, hook)
    raw = sorted(n for n in g.tensors if n not in packed)
    return {"numerics": current_numerics(), "matrices": sum(k["matrices"] for k in layouts.values()),
            "bytes": sum(k["bytes"] for k in layouts.values()), "layouts": layouts,
            "tensors_repacked": len(packed),
            "from_gguf": {"tensors": len(raw), "bytes": sum(g.tensors[n].data.nbytes for n in raw), "names": raw}}
