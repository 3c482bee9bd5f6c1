"""Loading: guild's own GGUF header reader against gguf-py's, the repack cache (hit, miss, stale, truncated,
foreign, tampered, unwritable) and bounded resident memory while loading (measured in a subprocess)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

import guild.formats.repack_cache as rc
import guild.formats.repack_writer as rc_writer
from guild.errors import GgufFormatError, NumericsError
from guild.formats import resident
from guild.formats.gguf import GGUFFile
from guild.models import load_model, validate
from guild.text.tokenizer import Tokenizer
from guild.tools.tiny import write_tiny_model


def _reader_value(field):
    """A gguf-py reader field as guild's GGUFFile.metadata had it when it was built on that reader."""
    t = field.types[0]
    if t == GGUFValueType.ARRAY:
        if field.types[-1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if t == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    return field.parts[field.data[0]].tolist()[0]


def _same_as_reader(path) -> tuple[GGUFFile, GGUFReader]:
    g = GGUFFile(path)
    r = GGUFReader(path, "r")
    old = {k: _reader_value(f) for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(g.metadata) == list(old)
    for k, v in old.items():
        assert g.metadata[k] == v, k
        vs, ws = (v, g.metadata[k]) if isinstance(v, list) else ([v], [g.metadata[k]])
        assert [type(x) for x in vs] == [type(x) for x in ws], k  # int stays int, float float, bool bool
    assert g.data_offset == r.data_offset
    assert [t.name for t in r.tensors] == list(g.tensors)
    for t in r.tensors:
        d = g.tensors[t.name].data
        assert d.dtype == t.data.dtype and d.shape == t.data.shape and np.array_equal(d, t.data), t.name
    return g, r


def test_header_reader_matches_gguf_py_tiny(tmp_path):
    for arch, kw in (("llama", {"n_experts": 4, "qtype": "Q4_K", "dim": 256, "ffn": 256}),
                     ("qwen3moe", {"n_experts": 4, "qtype": "Q8_0"}), ("llama", {"qtype": "F16", "tied": True})):
        _same_as_reader(write_tiny_model(tmp_path / f"{arch}-{kw['qtype']}.gguf", arch, **kw))


def test_embedded_tokenizer_identical_through_fast_path(dense_path):
    """The embedded model's 49,152-token vocabulary and merges read as arrays give the same metadata, hence the
    same tokenizer, as gguf-py's field-by-field reader."""
    g, r = _same_as_reader(dense_path)
    slow = Tokenizer.from_metadata({k: _reader_value(f) for k, f in r.fields.items() if not k.startswith("GGUF.")})
    fast = Tokenizer.from_metadata(g.metadata)
    text = "def f(x):\n    return x**2  # ünïcödé 🚀 12345 <|im_start|>user\nHi<|im_end|>"
    assert fast.encode(text) == slow.encode(text)
    assert fast.tokens == slow.tokens and fast.token_types == slow.token_types and fast.eos_ids == slow.eos_ids


def test_identity_digest_unchanged(tmp_path):
    p = write_tiny_model(tmp_path / "m.gguf", "llama", qtype="Q4_0")
    n = GGUFReader(p, "r").data_offset
    assert GGUFFile(p).identity_digest() == hashlib.sha256(open(p, "rb").read(n)).hexdigest()


def test_corrupt_header_one_line(tmp_path):
    p = write_tiny_model(tmp_path / "m.gguf", "llama", qtype="Q4_0")
    raw = bytearray(p.read_bytes())
    q = tmp_path / "short.gguf"
    q.write_bytes(bytes(raw[:5000]))
    with pytest.raises(GgufFormatError, match="runs past the end of the file"):
        GGUFFile(q)


# -- the repack cache ---------------------------------------------------------------------------------
@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(rc.ENV_SWITCH, raising=False)
    return tmp_path / "cache" / "repack"


@pytest.fixture(params=["mapped", "kept"])
def first_load(request, monkeypatch):
    """How a first load ends: the cache mapped (--mmap), or (read into memory) the packed arrays kept."""
    monkeypatch.setattr(resident, "_FLAG", [request.param == "mapped"])
    return request.param


def _logits(model, tokens=(1, 5, 9, 300, 7)) -> np.ndarray:
    return model.forward(list(tokens), model.new_state(64))


def _load(path):
    g = GGUFFile(path)
    model, how = rc.load_cached(g, load_model)
    return model, how


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("rc")
    a = write_tiny_model(d / "a.gguf", "llama", n_experts=4, qtype="Q4_K", dim=256, ffn=256, seed=3)
    b = write_tiny_model(d / "b.gguf", "qwen3moe", n_experts=4, qtype="Q5_1", seed=4)
    return a, b


def test_miss_then_hit_bitwise(models, cache_env):
    a, _ = models
    ref = _logits(load_model(a))
    m1, how1 = _load(a)
    assert how1 == "built" and len(list(cache_env.glob("*.rpk"))) == 1
    m2, how2 = _load(a)
    assert how2 == "cache"
    assert np.array_equal(_logits(m1), ref) and np.array_equal(_logits(m2), ref)
    # the matrices are views of the cache file, not copies
    buf = m2.layers[0].experts_gu[0].arrays[0]
    assert not buf.flags.owndata and isinstance(buf.base, np.ndarray)


def _cache_file(cache_env):
    (p,) = cache_env.glob("*.rpk")
    return p


def test_stale_when_model_file_changes(models, cache_env, tmp_path):
    a = shutil.copy(models[0], tmp_path / "a.gguf")
    _load(a)
    st = os.stat(a)
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, touched: stale (not re-hashed)
    _, how = _load(a)
    assert how == "built"
    assert _load(a)[1] == "cache"


@pytest.mark.parametrize("damage", ["truncate", "extend", "flip_header", "garbage", "empty"])
def test_damaged_cache_is_rebuilt(models, cache_env, damage):
    a, _ = models
    ref = _logits(load_model(a))
    _load(a)
    p = _cache_file(cache_env)
    raw = p.read_bytes()
    if damage == "truncate":
        p.write_bytes(raw[: len(raw) // 2])
    elif damage == "extend":
        p.write_bytes(raw + b"\0" * 64)
    elif damage == "flip_header":
        (h_off, h_len, _, _) = rc._TRAILER.unpack(raw[-rc._TRAILER.size:])
        b = bytearray(raw)
        b[h_off + h_len // 2] ^= 0x20
        p.write_bytes(bytes(b))
    elif damage == "garbage":
        p.write_bytes(os.urandom(len(raw)))
    else:
        p.write_bytes(b"")
    with pytest.raises(rc.StaleCache):
        rc.CacheFile(p, rc._source_key(GGUFFile(a)))
    m, how = _load(a)
    assert how == "built" and np.array_equal(_logits(m), ref)


def test_foreign_cache_is_rebuilt(models, cache_env):
    a, b = models
    _load(b)
    pb = _cache_file(cache_env)
    key_a = rc._source_key(GGUFFile(a))
    pa = rc.cache_path(key_a["digest"])
    shutil.copy(pb, pa)  # b's cache under a's name
    with pytest.raises(rc.StaleCache, match="foreign"):
        rc.CacheFile(pa, key_a)
    m, how = _load(a)
    assert how == "built" and np.array_equal(_logits(m), _logits(load_model(a)))


def _rewrite_header(p, edit) -> None:
    raw = p.read_bytes()
    h_off, h_len, _, _ = rc._TRAILER.unpack(raw[-rc._TRAILER.size:])
    hdr = json.loads(raw[h_off : h_off + h_len])
    edit(hdr)
    new = json.dumps(hdr).encode()
    p.write_bytes(raw[:h_off] + new + rc._TRAILER.pack(h_off, len(new), hashlib.sha256(new).digest(), rc.MAGIC))


@pytest.mark.parametrize("edit, why", [
    (lambda h: h["matrices"][0][3].__setitem__(0, 1 << 40), "outside the data section"),
    (lambda h: h["matrices"][-1].__setitem__(1, h["matrices"][-1][1] * 2), "outside the data section"),
    (lambda h: h["matrices"][0].__setitem__(0, 99), "no kernel"),
    (lambda h: h["matrices"][0][3].pop(), "arrays"),
    (lambda h: h.__setitem__("layout", "0" * 64), "another version"),
    (lambda h: h.__setitem__("format", 0), "format"),
    (lambda h: h["source"].__setitem__("size", 1), "stale"),
    (lambda h: h.__setitem__("matrices", {"a": 1}), "matrix table"),
])
def test_tampered_header_with_valid_checksum_is_refused(models, cache_env, edit, why):
    """A header rewritten with a matching checksum is still checked field by field before any view is made."""
    a, _ = models
    _load(a)
    p = _cache_file(cache_env)
    _rewrite_header(p, edit)
    with pytest.raises(rc.StaleCache, match=why):
        rc.CacheFile(p, rc._source_key(GGUFFile(a)))
    assert _load(a)[1] == "built"


def test_pack_order_mismatch_is_rebuilt(models, cache_env):
    """A cache whose matrix sequence does not fit what the model packs (here: a matrix dropped) is refused
    during the load and rebuilt."""
    a, _ = models
    _load(a)
    p = _cache_file(cache_env)
    _rewrite_header(p, lambda h: h["matrices"].pop())
    m, how = _load(a)
    assert how == "built" and np.array_equal(_logits(m), _logits(load_model(a)))


def test_switched_off_and_unwritable(models, cache_env, monkeypatch, tmp_path):
    a, _ = models
    ref = _logits(load_model(a))
    monkeypatch.setenv(rc.ENV_SWITCH, "0")
    m, how = _load(a)
    assert how == "memory" and np.array_equal(_logits(m), ref) and not cache_env.exists()
    monkeypatch.delenv(rc.ENV_SWITCH)
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "repack").write_text("a file where the cache directory should be")
    monkeypatch.setenv("GUILD_CACHE_DIR", str(ro))
    m, how = _load(a)
    assert how == "memory" and np.array_equal(_logits(m), ref)


def test_invalid_model_error_is_the_models(tmp_path, cache_env):
    """Validation errors of the model surface as they are (not as a cache problem), and leave no cache."""
    p = write_tiny_model(tmp_path / "m.gguf", "llama", qtype="F32")
    g = GGUFFile(p)
    raw = bytearray(p.read_bytes())
    t = g.tensors["blk.0.attn_norm.weight"]
    off = g.data_offset + g.index.tensors[list(g.tensors).index(t.name)].offset
    raw[off : off + 4] = np.float32(np.nan).tobytes()
    q = tmp_path / "nan.gguf"
    q.write_bytes(bytes(raw))
    with pytest.raises(Exception, match="non-finite"):
        _load(q)
    assert not list(cache_env.glob("*.rpk"))



def _with_bad_scales(src, dst, name, blocks):
    """A copy of src with the f16 d of these Q4_K blocks of tensor `name` inf (even) or NaN (odd)."""
    g = GGUFFile(src)
    raw = bytearray(Path(src).read_bytes())
    off = g.data_offset + g.index.tensors[list(g.tensors).index(name)].offset
    for i in blocks:
        raw[off + 144 * i : off + 144 * i + 2] = np.float16(np.nan if i % 2 else np.inf).tobytes()
    Path(dst).write_bytes(bytes(raw))
    return dst


@pytest.mark.parametrize("cache", ["on", "off"])
@pytest.mark.parametrize("counted", [True, False], ids=["by-packers", "after"])
def test_bad_scales_found_as_the_repack_reads_them(models, cache_env, monkeypatch, tmp_path, cache, counted,
                                                   first_load):
    """A first load reads each quantised tensor once: the packers check its block scales (no scan of its own
    before); a tensor whose packer did not count them is scanned after. A bad scale is still the scan's one line
    naming the tensor, with its count over the whole tensor, and leaves no cache."""
    from guild.formats import finite

    a, _ = models
    if cache == "off":
        monkeypatch.setenv(rc.ENV_SWITCH, "0")
    if not counted:  # as a type packed in NumPy: no count
        for mod in (rc, rc_writer):
            monkeypatch.setattr(mod, "pack_checked", lambda *args: (rc.repack(*args), None))
        monkeypatch.setattr(rc_writer, "pack_into", lambda *args: None)
    scanned = []
    count = finite.nonfinite_count
    monkeypatch.setattr(finite, "nonfinite_count", lambda t: scanned.append(t.name) or count(t))
    monkeypatch.setattr(validate, "nonfinite_count", finite.nonfinite_count)
    g = GGUFFile(a)
    _load(a)
    q4k = {n for n, t in g.tensors.items() if t.qtype == GGMLQuantizationType.Q4_K}
    assert {n for n in scanned if n in q4k} == (set() if counted else q4k)
    name = "blk.1.ffn_down_exps.weight"
    bad = _with_bad_scales(a, tmp_path / "bad.gguf", name, (3, 4, 17))
    before = sorted(cache_env.glob("*")) if cache_env.exists() else []
    with pytest.raises(NumericsError) as e:
        _load(bad)
    assert str(e.value) == f"{bad}: tensor '{name}' has 3 non-finite (NaN/inf) block scales"
    assert (sorted(cache_env.glob("*")) if cache_env.exists() else []) == before  # nothing new, no temporary


# -- bounded memory ------------------------------------------------------------------------------------
_RSS_PROBE = textwrap.dedent("""
    import json, os, sys
    from guild.formats.gguf import GGUFFile
    from guild.models import load_model
    import guild.models.validate, guild.formats.repack_cache as rc   # imports (Numba) before the baseline

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    before = hwm()
    g = GGUFFile(sys.argv[1])
    model, how = rc.load_cached(g, load_model)
    print(json.dumps({"growth": hwm() - before, "how": how, "size": os.path.getsize(sys.argv[1])}))
""")


def _load_growth(path, env) -> dict:
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(path)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_loading_stays_in_bounded_memory(moe_path, tmp_path):
    """Peak resident memory while loading the embedded 8-expert MoE (447 MB) with the cache mapped (--mmap).
    Repacking into memory grows it by ~1.3x the file (holding the repacked copy and the file's pages at once
    would be ~2x). The first load streams into the cache (measured growth 0.33x: one matrix at a time plus the
    allocator's slack), the second maps it (0.03x): bounds 0.6x and 0.15x."""
    env = dict(os.environ, GUILD_CACHE_DIR=str(tmp_path / "cache"), NUMBA_NUM_THREADS="1", GUILD_MMAP="1")
    env.pop(rc.ENV_SWITCH, None)
    first = _load_growth(moe_path, env)
    second = _load_growth(moe_path, env)
    assert (first["how"], second["how"]) == ("built", "cache")
    assert first["growth"] <= 0.6 * first["size"], first
    assert second["growth"] <= 0.15 * second["size"], second


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_a_load_that_fits_reads_the_cache_into_memory_once(moe_path, tmp_path):
    """By default a model that fits the memory budget is read into the process's memory (resident.py): the
    second load grows by one copy of the weights (measured 0.98x the file), never the file's pages and a copy."""
    env = dict(os.environ, GUILD_CACHE_DIR=str(tmp_path / "cache"), NUMBA_NUM_THREADS="1")
    env.pop(rc.ENV_SWITCH, None)
    env.pop(resident.ENV, None)
    _load_growth(moe_path, env)
    second = _load_growth(moe_path, env)
    assert second["how"] == "cache"
    assert 0.8 * second["size"] <= second["growth"] <= 1.15 * second["size"], second


def test_prefetch_and_progress_are_quiet(tmp_path, capsys):
    p = tmp_path / "f.rpk"
    p.write_bytes(b"x" * 100_000)
    rc.prefetch(p, wait=True)
    rc.prefetch(p)  # a background read-ahead: returns at once
    rc.prefetch(tmp_path / "missing.rpk", wait=True)  # nothing to read: nothing happens
    bar = rc._Progress(True, 10, "repacking")
    bar(10)
    bar.close()
    assert not bar.enabled and capsys.readouterr().err == ""  # no terminal: no bar


# -- a full disk, a failing repack, two writers ----------------------------------------------------------
def _full_disk(monkeypatch, room: int = 64 << 10) -> None:
    """Writes past `room` bytes of the file fail with ENOSPC, as pwrite(2) does on a full disk."""
    pwrite = os.pwrite

    def full(fd, data, offset):
        if offset + len(data) > room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return pwrite(fd, data, offset)

    monkeypatch.setattr(rc_writer.os, "pwrite", full)


def test_full_disk_while_writing_leaves_no_entry(models, cache_env, monkeypatch, caplog, first_load):
    """The disk fills while the cache is written (the free-space check passed: another writer took the room): one
    warning naming the cause, the model repacked into memory (the same logits), and neither the cache file nor its
    temporary left behind."""
    a, _ = models
    ref = _logits(load_model(a))
    with monkeypatch.context() as mp:
        _full_disk(mp)
        with caplog.at_level("WARNING", logger=rc.__name__):
            m, how = _load(a)
    assert how == "memory" and np.array_equal(_logits(m), ref)
    (w,) = [r for r in caplog.records if r.levelname == "WARNING"]
    msg = w.getMessage()
    assert "\n" not in msg and "No space left on device" in msg and "repacking into memory" in msg, msg
    assert list(cache_env.iterdir()) == []  # no .rpk, no .part
    m, how = _load(a)  # room again: the next load writes it whole
    assert how == "built" and np.array_equal(_logits(m), ref)


def _serial_reference(g) -> tuple[bytes, list]:
    """The data section and matrix table a one-matrix-at-a-time writer makes: each matrix repacked in pack order,
    its arrays appended at 64-byte aligned offsets (the gaps zero)."""
    out, matrices = bytearray(rc.MAGIC), []

    def hook(qtype, raw, n_rows, n_cols):
        offsets = []
        for arr in rc.repack(qtype, raw, n_rows, n_cols).arrays:
            out.extend(b"\0" * (-len(out) % rc.ALIGN))
            offsets.append(len(out))
            out.extend(np.ascontiguousarray(arr).tobytes())
        matrices.append([int(qtype), int(n_rows), int(n_cols), offsets])

    with rc.pack_hook(hook):
        load_model(g)
    return bytes(out), matrices


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("keep", [False, True])
def test_parallel_writer_matches_a_serial_one(models, cache_env, threads, keep):
    """The threaded writer's file holds, byte for byte, what a serial writer appends (both models: two quant types,
    a fused matrix), and its header's table is the serial one's; so does a writer that keeps the packed arrays
    (packed into one buffer, written from it)."""
    for path in models:
        g = GGUFFile(path)
        ref, matrices = _serial_reference(g)
        out = cache_env / f"{path.stem}.{threads}.rpk"
        model = rc.build(GGUFFile(path), out, load_model, threads=threads, keep=keep)
        assert (model is not None) == keep
        got = out.read_bytes()
        with open(out, "rb") as f:
            hdr, h_off = rc.read_header(f, len(got))
        assert h_off == len(ref) and got[:h_off] == ref
        assert hdr["matrices"] == matrices and hdr["data_end"] == len(ref)


def test_a_failing_repack_leaves_nothing(models, cache_env, monkeypatch, first_load):
    """A repack that fails on a worker thread mid-file stops the build with that error (not a warning: it is no
    disk trouble), and leaves neither a cache that a later load would take nor a temporary."""
    a, _ = models
    calls = []

    def bad(qtype, raw, n_rows, n_cols):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("bad block in matrix 3")
        return rc.pack_checked(qtype, raw, n_rows, n_cols)

    with monkeypatch.context() as mp, pytest.raises(ValueError, match="bad block in matrix 3"):
        mp.setattr(rc_writer, "pack_checked", bad)
        mp.setattr(rc_writer, "pack_into", lambda *args: None)  # kept: every matrix through pack_checked
        _load(a)
    assert list(cache_env.iterdir()) == []
    assert _load(a)[1] == "built"


_TWO_WRITERS = textwrap.dedent("""
    import hashlib, json, os, sys, time
    import numpy as np
    import guild.formats.repack_cache as rc
    from guild.formats.gguf import GGUFFile
    from guild.models import load_model

    me, other = sys.argv[2], sys.argv[3]
    record = rc._Recorder.__call__

    def meet(self, *a):  # both writers are mid-file before either goes on: the builds overlap
        if not os.path.exists(me):
            open(me, "w").close()
            for _ in range(6000):
                if os.path.exists(other):
                    break
                time.sleep(0.01)
            else:
                sys.exit("the other writer never started")
        return record(self, *a)

    rc._Recorder.__call__ = meet
    model, how = rc.load_cached(GGUFFile(sys.argv[1]), load_model)
    out = model.forward([1, 5, 9, 300, 7], model.new_state(64))
    print(json.dumps({"how": how, "logits": hashlib.sha256(np.ascontiguousarray(out).tobytes()).hexdigest()}))
""")


def test_two_processes_building_one_cache(models, cache_env, tmp_path):
    """Two loads of one model at once with one cache directory: each writes its own temporary and renames it into
    place (the last rename wins), so both build, both run on a whole cache, and the file left is byte for byte the
    one a single writer makes; no temporary stays."""
    a, _ = models
    env = dict(os.environ, GUILD_CACHE_DIR=str(cache_env.parent), NUMBA_NUM_THREADS="1")
    env.pop(rc.ENV_SWITCH, None)
    marks = [str(tmp_path / "a.started"), str(tmp_path / "b.started")]
    ps = [subprocess.Popen([sys.executable, "-c", _TWO_WRITERS, str(a), marks[i], marks[1 - i]], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    outs = [p.communicate(timeout=600) for p in ps]
    for p, (_, err) in zip(ps, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    got = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    ref = hashlib.sha256(np.ascontiguousarray(_logits(load_model(a))).tobytes()).hexdigest()
    assert [g["how"] for g in got] == ["built", "built"] and [g["logits"] for g in got] == [ref, ref]
    (left,) = cache_env.iterdir()  # the cache alone: no .part
    assert left.suffix == ".rpk"
    together = left.read_bytes()
    left.unlink()
    _, how = _load(a)  # one writer alone
    assert how == "built" and left.read_bytes() == together
